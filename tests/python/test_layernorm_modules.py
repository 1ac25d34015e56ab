"""te.LayerNorm, te.RMSNorm and te.LayerNormLinear against plain PyTorch (fp32, bf16), and
LayerNormLinear in FP8 (the norm writing FP8 itself under delayed scaling) against BF16."""

import pytest
import torch
import torch.nn.functional as F
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
TOLS = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5)}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def ref_norm(normalization, x, weight, bias, eps, zero_centered_gamma):
    g = weight + 1 if zero_centered_gamma else weight
    if normalization == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), g, bias, eps)
    return F.rms_norm(x, (x.shape[-1],), g, eps)


def grads(out, params, g):
    return torch.autograd.grad(out, params, g, allow_unused=True)


def assert_grad_close(got, want, dtype):
    """fp32: TE's tolerances (x4 for sums over rows, whose order differs from PyTorch's).
    bf16: against the fp32 reference; dx is a difference of terms as large as the biggest
    element, so its error is bf16's rounding (2^-8) of that scale, not of each element."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=TOLS[dtype]["rtol"] * 4, atol=TOLS[dtype]["atol"] * 4)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=2**-7 * want.abs().max().item())


def fp32_copy(tensors):
    return [t.detach().float().requires_grad_() for t in tensors]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cls", [te.LayerNorm, te.RMSNorm], ids=["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("zero_centered_gamma", [False, True], ids=["gamma", "zc_gamma"])
def test_norm_modules_match_torch(device, dtype, cls, zero_centered_gamma):
    torch.manual_seed(1)
    m = cls(96, eps=1e-5, params_dtype=dtype, zero_centered_gamma=zero_centered_gamma, device=device)
    with torch.no_grad():
        m.weight.normal_(0.0 if zero_centered_gamma else 1.0, 0.1)
        if m.bias is not None:
            m.bias.normal_()
    x = torch.randn(4, 7, 96, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn_like(x)
    params = [x, m.weight] + ([m.bias] if m.bias is not None else [])
    y = m(x)
    ref_params = fp32_copy(params)
    bias = ref_params[2] if m.bias is not None else None
    y_ref = ref_norm(cls.normalization, ref_params[0], ref_params[1], bias, 1e-5, zero_centered_gamma)
    torch.testing.assert_close(y, y_ref.to(dtype), **TOLS[dtype])
    for got, want in zip(grads(y, params, g), grads(y_ref, ref_params, g.float())):
        assert_grad_close(got, want, dtype)


def test_norm_module_parameters_and_errors():
    ln, rms = te.LayerNorm(32, device="cpu"), te.RMSNorm(32, device="cpu")
    assert [n for n, _ in ln.named_parameters()] == ["weight", "bias"]
    assert [n for n, _ in rms.named_parameters()] == ["weight"]
    assert torch.all(te.LayerNorm(8, zero_centered_gamma=True, device="cpu").weight == 0)
    with pytest.raises(ValueError, match="hidden_size=32"):
        ln(torch.randn(2, 31))
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        te.RMSNorm(0, device="cpu")


def lnl_reference(m, x):
    ln = ref_norm(m.normalization, x, m.layer_norm_weight, m.layer_norm_bias, m.eps, m.zero_centered_gamma)
    return F.linear(ln, m.weight, m.bias), ln


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_matches_torch(device, dtype, normalization):
    torch.manual_seed(2)
    m = te.LayerNormLinear(64, 48, normalization=normalization, params_dtype=dtype, device=device,
                           return_layernorm_output=True)
    with torch.no_grad():
        m.layer_norm_weight.normal_(1.0, 0.1)
        m.bias.normal_()
    names = [n for n, _ in m.named_parameters()]
    assert names[:2] == (["layer_norm_weight", "layer_norm_bias"] if normalization == "LayerNorm"
                         else ["layer_norm_weight", "weight"])
    x = torch.randn(3, 8, 64, dtype=dtype, device=device, requires_grad=True)
    g, g_ln = torch.randn(3, 8, 48, dtype=dtype, device=device), torch.randn_like(x)
    params = [x] + [p for _, p in m.named_parameters()]
    y, ln = m(x)
    y_ref, ln_ref = lnl_reference(m, x)
    tol = TOLS[dtype]
    torch.testing.assert_close(ln, ln_ref, **tol)
    torch.testing.assert_close(y, y_ref, **tol)
    got = torch.autograd.grad([y, ln], params, [g, g_ln])
    want = torch.autograd.grad([y_ref, ln_ref], params, [g, g_ln])
    for a, b in zip(got, want):
        assert_grad_close(a, b, dtype)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
                         ids=["delayed_fused_norm", "current"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_layernorm_linear_fp8_close_to_bf16(device, recipe, normalization):
    # Bounds as test_linear.py's test_fp8_close_to_bf16: E4M3 forward, E5M2 gradients.
    torch.manual_seed(3)
    m = te.LayerNormLinear(128, 64, normalization=normalization, params_dtype=torch.bfloat16, device=device)
    for _ in range(3):
        x = torch.randn(32, 128, dtype=torch.bfloat16, device=device, requires_grad=True)
        g = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
        params = [x] + [p for _, p in m.named_parameters()]
        with te.fp8_autocast(fp8_recipe=recipe):
            y = m(x)
        got = torch.autograd.grad(y, params, g)
        y_ref, _ = lnl_reference(m, x)
        want = torch.autograd.grad(y_ref, params, g)
        assert rel_err(y, y_ref) < 0.06
        for a, b in zip(got, want):
            assert rel_err(a, b) < 0.10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("return_layernorm_output", [False, True], ids=["out", "with_ln_out"])
def test_layernorm_linear_current_scaling_norm_amax_same_as_own_pass(device, normalization, dtype,
                                                                     return_layernorm_output, monkeypatch):
    """Current scaling casts the norm output from the amax the norm kernel took as it wrote
    it (module_ops.FusedAmax, past one block's cast); with that switched off the cast takes
    its own amax pass. Outputs (and the norm output when returned) and every gradient are
    the same bit for bit, over two steps."""
    from transformer_engine.pytorch.cpp_extensions import module_ops

    def run(min_elements):
        monkeypatch.setattr(module_ops, "FUSED_AMAX_MIN_ELEMENTS", min_elements)
        torch.manual_seed(9)
        m = te.LayerNormLinear(64, 48, normalization=normalization, params_dtype=dtype, device=device,
                               return_layernorm_output=return_layernorm_output)
        results = []
        for _ in range(2):
            # rows of different offsets and spreads, so that the amax is set by one row
            x = (torch.randn(256, 1) * 3 + torch.rand(256, 1) * 4 * torch.randn(256, 64)).to(dtype).to(device)
            x.requires_grad_()
            with te.fp8_autocast(fp8_recipe=Float8CurrentScaling()):
                out = m(x)
            y, ln_out = out if return_layernorm_output else (out, None)
            y.backward(torch.randn_like(y))
            results += [y.detach(), x.grad] + [p.grad.clone() for p in m.parameters()]
            if ln_out is not None:
                results.append(ln_out.detach())
            m.zero_grad()
        return results

    fused, own_pass = run(0), run(1 << 62)
    assert len(fused) == len(own_pass)
    for a, b in zip(fused, own_pass):
        assert torch.equal(a, b)


def test_layernorm_linear_delayed_scaling_norm_raises_the_input_amax():
    # The fused norm + cast records max|ln_out| as the forward amax of tensor 0.
    torch.manual_seed(4)
    m = te.LayerNormLinear(64, 32, device="cpu")
    x = torch.randn(16, 64)
    with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=2)):
        m(x)
    ln_amax = F.layer_norm(x, (64,), m.layer_norm_weight, m.layer_norm_bias, 1e-5).abs().max()
    torch.testing.assert_close(m._fwd_state.scale[0], 448.0 / ln_amax, rtol=1e-5, atol=0)


def test_layernorm_linear_errors():
    with pytest.raises(ValueError, match="normalization must be 'LayerNorm' or 'RMSNorm'"):
        te.LayerNormLinear(32, 32, normalization="BatchNorm", device="cpu")
    m = te.LayerNormLinear(32, 32, device="cpu")
    with pytest.raises(ValueError, match="in_features=32"):
        m(torch.randn(4, 16))
