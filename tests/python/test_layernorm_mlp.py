"""te.LayerNormMLP against the same MLP in plain PyTorch (every activation; fp32, bf16),
and in FP8 against BF16."""

import pytest
import torch
import torch.nn.functional as F
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
TORCH_ACT = {
    "gelu": lambda h: F.gelu(h, approximate="tanh"),
    "qgelu": lambda h: h * torch.sigmoid(1.702 * h),
    "relu": F.relu,
    "srelu": lambda h: F.relu(h) ** 2,
    "silu": F.silu,
}
GATED = {"geglu": "gelu", "qgeglu": "qgelu", "reglu": "relu", "sreglu": "srelu", "swiglu": "silu"}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def torch_activation(name, h):
    if name in GATED:
        a, b = h.chunk(2, dim=-1)
        return TORCH_ACT[GATED[name]](a) * b
    return TORCH_ACT[name](h)


def reference(m, x, params=None):
    p = dict(m.named_parameters()) if params is None else params
    g = p["layer_norm_weight"] + 1 if m.zero_centered_gamma else p["layer_norm_weight"]
    if m.normalization == "LayerNorm":
        ln = F.layer_norm(x, (m.hidden_size,), g, p["layer_norm_bias"], m.eps)
    else:
        ln = F.rms_norm(x, (m.hidden_size,), g, m.eps)
    h = F.linear(ln, p["fc1_weight"], p.get("fc1_bias"))
    return F.linear(torch_activation(m.activation, h), p["fc2_weight"], p.get("fc2_bias")), ln


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", list(TORCH_ACT) + list(GATED))
def test_fp32_matches_torch(device, activation):
    torch.manual_seed(1)
    m = te.LayerNormMLP(64, 96, activation=activation, params_dtype=torch.float32, device=device)
    with torch.no_grad():
        m.fc1_bias.normal_()
        m.fc2_bias.normal_()
    fc1_rows = 192 if activation in GATED else 96
    assert m.fc1_weight.shape == (fc1_rows, 64) and m.fc2_weight.shape == (64, 96)
    x = torch.randn(4, 6, 64, device=device, requires_grad=True)
    g = torch.randn(4, 6, 64, device=device)
    params = [x] + [p for _, p in m.named_parameters()]
    y = m(x)
    y_ref, _ = reference(m, x)
    torch.testing.assert_close(y, y_ref, rtol=1.3e-6, atol=1e-5)
    for a, b in zip(torch.autograd.grad(y, params, g), torch.autograd.grad(y_ref, params, g)):
        # Sums over 24 rows and 96/192 products in another order than PyTorch's: x4.
        torch.testing.assert_close(a, b, rtol=4 * 1.3e-6, atol=4e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_bf16_matches_fp32_reference(device, normalization):
    torch.manual_seed(2)
    m = te.LayerNormMLP(64, 128, normalization=normalization, activation="swiglu", params_dtype=torch.bfloat16,
                        device=device, zero_centered_gamma=True)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    y = m(x)
    params32 = {k: v.detach().float() for k, v in m.named_parameters()}
    y_ref, _ = reference(m, x.float(), params32)
    # Three bf16 roundings in a row (norm output, fc1 output, activation): 2^-8 each, a
    # few of them relative to the output's scale.
    torch.testing.assert_close(y.float(), y_ref, rtol=1.6e-2, atol=4 * 2**-8 * y_ref.abs().max().item())


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
                         ids=["delayed", "current"])
@pytest.mark.parametrize("activation", ["gelu", "swiglu", "relu"])
def test_fp8_close_to_bf16(device, recipe, activation):
    # Two FP8 GEMMs in a row, each with E4M3 operands (2^-4 relative rounding): a few
    # percent of the output's norm each, so 12% forward (measured: 5.5%). Gradients go
    # through E5M2 (2^-3) twice: measured 9% with gelu; relu's derivative jumps at 0, and
    # pre-activations that FP8 moves across 0 change whole entries: measured 19%. Bounds
    # 20% / 25%; a wrong scale gives errors of order 100%.
    torch.manual_seed(3)
    m = te.LayerNormMLP(128, 256, activation=activation, params_dtype=torch.bfloat16, device=device)
    for _ in range(3):
        x = torch.randn(64, 128, dtype=torch.bfloat16, device=device, requires_grad=True)
        g = torch.randn(64, 128, dtype=torch.bfloat16, device=device)
        params = [x] + [p for _, p in m.named_parameters()]
        with te.fp8_autocast(fp8_recipe=recipe):
            y = m(x)
        got = torch.autograd.grad(y, params, g)
        y_ref, _ = reference(m, x)
        want = torch.autograd.grad(y_ref, params, g)
        assert rel_err(y, y_ref) < 0.12
        for a, b in zip(got, want):
            assert rel_err(a, b) < (0.25 if activation == "relu" else 0.20)


@pytest.mark.parametrize("device", DEVICES)
def test_return_bias_and_layernorm_output(device):
    torch.manual_seed(4)
    m = te.LayerNormMLP(32, 64, return_bias=True, return_layernorm_output=True, params_dtype=torch.float32,
                        device=device)
    with torch.no_grad():
        m.fc2_bias.normal_()
    x = torch.randn(8, 32, device=device, requires_grad=True)
    y, b, ln = m(x)
    y_ref, ln_ref = reference(m, x)
    torch.testing.assert_close(y + b, y_ref, rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(ln, ln_ref, rtol=1.3e-6, atol=1e-5)
    (y.sum() + ln.sum()).backward()
    assert x.grad is not None and m.layer_norm_weight.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_fuse_wgrad_accumulation(device):
    torch.manual_seed(5)
    m = te.LayerNormMLP(32, 64, fuse_wgrad_accumulation=True, device=device)
    plain = te.LayerNormMLP(32, 64, device=device)
    plain.load_state_dict(m.state_dict())
    for name in ("fc1_weight", "fc2_weight"):
        getattr(m, name).main_grad = torch.zeros_like(getattr(m, name))
    for _ in range(2):
        x = torch.randn(16, 32, device=device)
        m(x).sum().backward()
        plain(x).sum().backward()
    for name in ("fc1_weight", "fc2_weight"):
        assert getattr(m, name).grad is None
        torch.testing.assert_close(getattr(m, name).main_grad, getattr(plain, name).grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_model_init_weights(device):
    with te.fp8_model_init():
        m = te.LayerNormMLP(64, 128, device=device)
    assert isinstance(m.fc1_weight, te.Float8Tensor) and isinstance(m.fc2_weight, te.Float8Tensor)
    x = torch.randn(16, 64, device=device)
    with te.fp8_autocast():
        y = m(x)
    y.sum().backward()
    assert m.fc1_weight.grad is not None and m.fc1_weight.grad.shape == (128, 64)


def test_errors():
    with pytest.raises(ValueError, match="activation must be one of"):
        te.LayerNormMLP(32, 64, activation="tanh", device="cpu")
    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        te.LayerNormMLP(32, 64, tp_size=4, device="cpu")
    m = te.LayerNormMLP(32, 64, device="cpu")
    with pytest.raises(ValueError, match="hidden_size=32"):
        m(torch.randn(8, 64))
    # Transformer Engine reads activation_params only for clamped_swiglu, which OpenTE lacks.
    with pytest.raises(NotImplementedError, match="activation='clamped_swiglu'.*OpenTE has no clamped_swiglu"):
        te.LayerNormMLP(32, 64, activation="swiglu", activation_params={"limit": 7.0}, device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_current_scaling_fused_amax_same_as_own_pass(device, activation, bias, monkeypatch):
    """Current scaling casts the norm output, the activation output and fc1's output
    gradient from the amax their kernels took as they wrote them (module_ops.FusedAmax,
    past one block's cast); with that switched off each cast takes its own amax pass.
    Outputs and every gradient are the same bit for bit."""
    from transformer_engine.pytorch.cpp_extensions import module_ops

    def run(min_elements):
        monkeypatch.setattr(module_ops, "FUSED_AMAX_MIN_ELEMENTS", min_elements)
        torch.manual_seed(7)
        m = te.LayerNormMLP(64, 256, activation=activation, bias=bias, params_dtype=torch.bfloat16, device=device)
        results = []
        for _ in range(2):
            x = torch.randn(256, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
            with te.fp8_autocast(fp8_recipe=Float8CurrentScaling()):
                y = m(x)
            y.backward(torch.randn_like(y))
            results += [y.detach(), x.grad] + [p.grad.clone() for p in m.parameters()]
            m.zero_grad()
        return results

    fused, own_pass = run(0), run(1 << 62)
    for a, b in zip(fused, own_pass):
        assert torch.equal(a, b)
