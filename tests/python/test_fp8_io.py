"""fp8_output / fp8_grad of te.Linear and te.LayerNormLinear (Transformer Engine 2.x): the
output and the input's gradient as Float8Tensors, cast with the module's output and
input-gradient slots; FP8 tensors handed between modules used without a second cast;
both flags ignored outside fp8_autocast.

FP8 error bounds used below: rounding to nearest costs at most half a unit in the last
place, i.e. a relative 2^-4 for E4M3 (3 mantissa bits) and 2^-3 for E5M2 (2 bits), plus
half the subnormal step (2^-10 resp. 2^-17) divided by the scale for the smallest values.
The references are high-precision outputs of the same FP8 GEMMs, themselves rounded once
to bf16 (another 2^-9 relative) or fp32."""

import io

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
from transformer_engine.pytorch.tensor import DType, Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
RECIPES = {
    "delayed": lambda: DelayedScaling(amax_history_len=4),  # HYBRID: E4M3 forward, E5M2 backward
    "current": lambda: Float8CurrentScaling(),
    "delayed_e4m3": lambda: DelayedScaling(fp8_format=Format.E4M3, amax_history_len=4),
}
FORMATS = {"delayed": (DType.kFloat8E4M3, DType.kFloat8E5M2), "current": (DType.kFloat8E4M3, DType.kFloat8E5M2),
           "delayed_e4m3": (DType.kFloat8E4M3, DType.kFloat8E4M3)}
REL = {DType.kFloat8E4M3: 2.0**-4, DType.kFloat8E5M2: 2.0**-3}
HALF_SUBNORMAL = {DType.kFloat8E4M3: 2.0**-10, DType.kFloat8E5M2: 2.0**-17}
# 2^-9: the bf16 rounding of the reference (and of fp32 bias adds in the unfused path).
REF_REL = 2.0**-8


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def make(cls, device, dtype, bias=True, **kwargs):
    torch.manual_seed(11)
    if cls is te.Linear:
        m = te.Linear(64, 48, bias=bias, params_dtype=dtype, device=device, **kwargs)
    else:
        m = te.LayerNormLinear(64, 48, bias=bias, params_dtype=dtype, device=device, **kwargs)
        with torch.no_grad():
            m.layer_norm_weight.normal_(1.0, 0.1)
    if bias:
        with torch.no_grad():
            m.bias.normal_()
    return m


def twin(m):
    other = make(type(m), m.weight.device, m.weight.dtype, bias=m.use_bias)
    other.load_state_dict(m.state_dict())
    return other


def assert_within_fp8(got: Float8Tensor, want: torch.Tensor, fp8_dtype):
    """got (FP8) is want rounded once to fp8_dtype, within the bounds in the module docstring."""
    values = got.dequantize(dtype=torch.float32)
    want = want.float()
    bound = want.abs() * (REL[fp8_dtype] + REF_REL) + HALF_SUBNORMAL[fp8_dtype] * got._scale_inv.item() * 2
    excess = (values - want).abs() - bound
    assert excess.max().item() <= 0, f"worst excess over the FP8 bound: {excess.max().item()}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("cls", [te.Linear, te.LayerNormLinear], ids=["Linear", "LayerNormLinear"])
def test_fp8_output_is_the_output_in_fp8(device, recipe, dtype, bias, cls):
    # bf16 with bias and no bias: the GEMM casts its own output under delayed scaling;
    # fp32 with bias: high-precision GEMM, then the cast; current scaling: always the latter.
    m = make(cls, device, dtype, bias=bias)
    fwd_format = FORMATS[recipe][0]
    # Later steps cast with scales from earlier amaxes; a shrinking weight keeps delayed
    # scaling from saturating (values beyond the history's amax clip, by design).
    for step in range(3):
        x = torch.randn(2, 16, 64, dtype=dtype, device=device)
        if step:
            with torch.no_grad():
                m.weight.mul_(0.5)
        with te.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            y = m(x, fp8_output=True)
            y_ref = m(x)  # the same GEMM (same scales within one autocast), high-precision out
            if recipe.startswith("delayed"):
                # The output slot's amax: this step's max|y| (the output was not cast without the flag).
                torch.testing.assert_close(m._fwd_state.amax_history[0, 2].item(), y_ref.float().abs().max().item(),
                                           rtol=REF_REL, atol=0)
                scale = m._fwd_state.scale[2].item()
        assert isinstance(y, Float8Tensor) and y.dtype == dtype and y.shape == (2, 16, 48)
        assert y.device == x.device and y._fp8_dtype == fwd_format and y._transpose is None
        assert_within_fp8(y, y_ref, fwd_format)
        if recipe.startswith("delayed"):
            assert y._scale_inv.item() == pytest.approx(1.0 / scale, rel=1e-7)
        else:  # current scaling: the scale from the output's own amax
            amax = y_ref.float().abs().max().item()
            assert y._scale_inv.item() * 448.0 == pytest.approx(amax, rel=REF_REL)
    if recipe.startswith("delayed"):  # the recipe then turns the output slot's history into its scale
        window = m._fwd_state.amax_history[:, 2].max().item()
        assert m._fwd_state.scale[2].item() == pytest.approx(448.0 / window, rel=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("cls", [te.Linear, te.LayerNormLinear], ids=["Linear", "LayerNormLinear"])
def test_fp8_grad_is_the_input_gradient_in_fp8(device, recipe, cls):
    m = make(cls, device, torch.bfloat16)
    ref = twin(m)
    bwd_format = FORMATS[recipe][1]
    for step in range(3):
        x = torch.randn(2, 16, 64, dtype=torch.bfloat16, device=device)
        g = torch.randn(2, 16, 48, dtype=torch.bfloat16, device=device) * 0.5**step  # no saturation
        xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
        dxs = []
        for module, xx, flag in ((m, xs[0], True), (ref, xs[1], False)):
            module.zero_grad()
            with te.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
                y = module(xx, fp8_grad=flag)
            assert not isinstance(y, Float8Tensor)
            # The input gradient as the module returned it: a leaf's .grad may be a plain
            # copy (autograd copies the first gradient when something else still holds it).
            params = list(module.parameters())
            grads = torch.autograd.grad(y, [xx] + params, g)
            dxs.append(grads[0])
            for p, grad in zip(params, grads[1:]):
                p.grad = grad
        dx, dx_ref = dxs
        assert isinstance(dx, Float8Tensor) and not isinstance(dx_ref, Float8Tensor)
        assert dx.dtype == torch.bfloat16 and dx.shape == x.shape and dx._fp8_dtype == bwd_format
        assert_within_fp8(dx, dx_ref, bwd_format)
        # Only the input gradient changes: the parameter gradients come from the same GEMMs.
        for p, q in zip(m.parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad)
        if recipe.startswith("delayed"):
            # The backward ended with the scale update (applied here rather than at the next
            # autocast exit), which rolled this step's amaxes to the last row: the
            # input-gradient slot holds max|dx| (0 without fp8_grad).
            FP8GlobalStateManager.flush_deferred_backward_update()
            torch.testing.assert_close(m._bwd_state.amax_history[-1, 1].item(), dx_ref.float().abs().max().item(),
                                       rtol=REF_REL, atol=0)
            assert ref._bwd_state.amax_history[:, 1].max().item() == 0.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_fp8_output_feeds_the_next_linear_without_a_second_cast(device, recipe):
    first = make(te.Linear, device, torch.bfloat16)
    torch.manual_seed(12)
    second = te.Linear(48, 32, params_dtype=torch.bfloat16, device=device)
    first_ref, second_ref = twin(first), te.Linear(48, 32, params_dtype=torch.bfloat16, device=device)
    second_ref.load_state_dict(second.state_dict())
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    g = torch.randn(32, 32, dtype=torch.bfloat16, device=device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with te.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        h = first(xa, fp8_output=True)
        z = second(h, fp8_grad=True)
        if recipe == "delayed":  # second's input slot saw no cast: it read h's FP8 data as it is
            assert second._fwd_state.amax_history[0, 0].item() == 0.0
        z_hp = second(h.dequantize())  # the same values through a fresh cast (same scales: same step)
        z_ref = second_ref(first_ref(xb))
    assert isinstance(h, Float8Tensor) and not isinstance(z, Float8Tensor)
    # h's values are FP8 already and the recast keeps them exactly when the scales agree
    # (current scaling: the amax is the same); delayed scaling's input scale is still 1 in
    # this first step, while h was cast with its own slot's, so allow an E4M3 rounding.
    torch.testing.assert_close(z.float(), z_hp.float(), rtol=2**-4 if recipe == "delayed" else 2**-7, atol=1e-2)
    z.backward(g)
    (z_ref.float() * g.float()).sum().backward()
    # first received its output gradient in FP8 (second's fp8_grad) and used it as it is.
    if recipe == "delayed":
        assert first._bwd_state.amax_history[:, 0].max().item() == 0.0  # never cast by first
        assert first_ref._bwd_state.amax_history[:, 0].max().item() > 0.0
    # Against the chain without the flags: FP8 errors of a few percent of the norm (see
    # test_linear.py's test_fp8_close_to_bf16), failing for wrong scales or layouts.
    for got, want in ((xa.grad, xb.grad), (first.weight.grad, first_ref.weight.grad),
                      (first.bias.grad, first_ref.bias.grad), (second.weight.grad, second_ref.weight.grad)):
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err < 0.1, err


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_output_in_another_format_is_cast_again(device):
    # An E5M2 tensor as the input of an HYBRID step (whose inputs are E4M3): dequantized and
    # cast like any input (the input slot's amax rises), with the same result as its values.
    m = make(te.Linear, device, torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    x8 = Float8CurrentScalingQuantizer(DType.kFloat8E5M2, device, columnwise=False)(x)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        y = m(x8)
        y_ref = m(x8.dequantize())
        assert m._fwd_state.amax_history[0, 0].item() == x8.dequantize().float().abs().max().item()
    assert torch.equal(y, y_ref)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("consumer", ["LayerNorm", "LayerNormLinear", "LayerNormMLP", "torch"])
def test_fp8_output_works_downstream(device, consumer):
    # Modules that normalize first, and plain torch ops, take the Float8Tensor's values;
    # gradients reach the producing Linear either way.
    m = make(te.Linear, device, torch.bfloat16)
    torch.manual_seed(13)
    nxt = {"LayerNorm": lambda: te.LayerNorm(48, params_dtype=torch.bfloat16, device=device),
           "LayerNormLinear": lambda: te.LayerNormLinear(48, 32, params_dtype=torch.bfloat16, device=device),
           "LayerNormMLP": lambda: te.LayerNormMLP(48, 64, params_dtype=torch.bfloat16, device=device),
           "torch": lambda: torch.nn.GELU()}[consumer]()
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        h = m(x, fp8_output=True)
        z = nxt(h)
        z_ref = nxt(h.dequantize())
    assert torch.equal(z, z_ref)
    (z.float() * torch.randn(z.shape, device=device)).sum().backward()  # a norm's output sums to a constant
    assert x.grad is not None and m.weight.grad is not None
    assert torch.isfinite(x.grad.float()).all() and x.grad.float().abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls", [te.Linear, te.LayerNormLinear], ids=["Linear", "LayerNormLinear"])
@pytest.mark.parametrize("where", ["no_autocast", "disabled", "calibrating"])
def test_flags_are_ignored_outside_fp8_autocast(device, cls, where):
    m = make(cls, device, torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    g = torch.randn(32, 48, dtype=torch.bfloat16, device=device)
    results = []
    for flags in (dict(fp8_output=True, fp8_grad=True), {}):
        xx = x.clone().requires_grad_()
        m.zero_grad()
        if where == "no_autocast":
            y = m(xx, **flags)
        else:
            with te.fp8_autocast(enabled=False, calibrating=where == "calibrating"):
                y = m(xx, **flags)
        y.backward(g)
        results.append((y, xx.grad, m.weight.grad.clone()))
    (y, dx, dw), (y_ref, dx_ref, dw_ref) = results
    assert type(y) is torch.Tensor and type(dx) is torch.Tensor
    assert torch.equal(y, y_ref) and torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_output_with_return_bias_and_layernorm_output(device):
    lin = make(te.Linear, device, torch.bfloat16, return_bias=True)
    lnl = make(te.LayerNormLinear, device, torch.bfloat16, return_layernorm_output=True)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        y, b = lin(x, fp8_output=True)
        y_ref, _ = lin(x)
        z, ln = lnl(x, fp8_output=True)
        z_ref, ln_ref = lnl(x)
    assert isinstance(y, Float8Tensor) and not isinstance(b, Float8Tensor)
    assert isinstance(z, Float8Tensor) and not isinstance(ln, Float8Tensor)
    assert_within_fp8(y, y_ref, DType.kFloat8E4M3)
    assert_within_fp8(z, z_ref, DType.kFloat8E4M3)
    assert torch.equal(ln, ln_ref)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_output_quantizer_is_the_output_slot(device):
    m = make(te.Linear, device, torch.bfloat16)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        y = m(x, fp8_output=True)
    q = y._quantizer
    assert isinstance(q, Float8Quantizer) and q.dtype == DType.kFloat8E4M3
    assert q.scale.data_ptr() == m._fwd_state.scale[2:3].data_ptr()
    # In-place ops re-quantize with it (the tensor stays FP8).
    y.mul_(2.0)
    assert isinstance(y, Float8Tensor)


@pytest.mark.parametrize("device", DEVICES)
def test_extra_state_saved_before_the_output_slots_loads(device):
    # A te.Linear state_dict from before the output / input-gradient slots existed (2
    # forward, 1 backward tensor): those slots load, the new ones start fresh.
    m = make(te.Linear, device, torch.float32)
    x = torch.randn(16, 64, device=device)
    with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=4)):
        m(x).sum().backward()
    state = m.state_dict()
    extra = state["_extra_state"]
    for key, n in (("fwd", 2), ("bwd", 1)):
        extra[key] = {"amax_history": extra[key]["amax_history"][:, :n], "scale": extra[key]["scale"][:n],
                      "scale_inv": extra[key]["scale_inv"][:n]}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    loaded = make(te.Linear, device, torch.float32)
    loaded.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=False))
    with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=4)):
        loaded(x)
    assert loaded._fwd_state.scale.shape == (3,) and loaded._bwd_state.scale.shape == (2,)
    assert torch.equal(loaded._fwd_state.scale[:2], m._fwd_state.scale[:2])
    assert loaded._fwd_state.scale[2].item() == 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("producer", ["Linear", "LayerNormLinear", "LayerNormMLP", "LayerNorm"])
def test_fp8_grad_reaches_every_module(device, producer):
    # The module before a Linear(fp8_grad=True) gets its output gradient in FP8: the GEMM
    # modules read it as it is (their output-gradient slot casts nothing), the norm takes
    # its values; the gradients agree with the chain without fp8_grad within FP8 error.
    def build():
        torch.manual_seed(14)
        first = {"Linear": lambda: te.Linear(64, 64, params_dtype=torch.bfloat16, device=device),
                 "LayerNormLinear": lambda: te.LayerNormLinear(64, 64, params_dtype=torch.bfloat16, device=device),
                 "LayerNormMLP": lambda: te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16, device=device),
                 "LayerNorm": lambda: te.LayerNorm(64, params_dtype=torch.bfloat16, device=device)}[producer]()
        return first, te.Linear(64, 32, params_dtype=torch.bfloat16, device=device)

    (first, second), (first_ref, second_ref) = build(), build()
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    g = torch.randn(32, 32, dtype=torch.bfloat16, device=device)
    grads = []
    for a, b, flag in ((first, second, True), (first_ref, second_ref, False)):
        xx = x.clone().requires_grad_()
        with te.fp8_autocast(fp8_recipe=DelayedScaling()):
            z = b(a(xx), fp8_grad=flag)
        z.backward(g)
        grads.append([xx.grad] + [p.grad for p in a.parameters()])
    if producer != "LayerNorm":
        assert first._bwd_state.amax_history[:, 0].max().item() == 0.0
        assert first_ref._bwd_state.amax_history[:, 0].max().item() > 0.0
    for got, want in zip(*grads):
        err = ((got.float() - want.float()).norm() / want.float().norm()).item()
        assert err < 0.1, err
