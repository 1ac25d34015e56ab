"""FP8 modules with float32 parameters under torch.autocast(bfloat16), as Lightning and
the main job run them: the weights are cast to FP8 straight from fp32 and the biases
converted to bf16 for the step, in the launch of the step's casts (QuantizeGroup). With
parameters whose values bf16 holds exactly, the result must equal that of the same module
whose parameters are those bf16 values (no autocast), bit for bit: the grouped launch must
read the converted biases, not memory freed and reused before it ran."""

import copy

import pytest
import torch
from conftest import DEVICES

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

MODULES = {
    "Linear": lambda device: te.Linear(64, 64, device=device),
    "LayerNormLinear": lambda device: te.LayerNormLinear(64, 64, device=device),
    "LayerNormMLP": lambda device: te.LayerNormMLP(64, 64, device=device),  # fc1 and fc2 weights of one size
}
RECIPES = {"delayed": DelayedScaling, "current": Float8CurrentScaling}


def twin_modules(module: str, device):
    """(the module with fp32 parameters holding bf16 values, and biases that are not 0;
    its copy with bf16 parameters)."""
    fp32 = MODULES[module](device)
    with torch.no_grad():
        for p in fp32.parameters():
            p.copy_((p + 0.01).bfloat16().float())
    return fp32, copy.deepcopy(fp32).to(torch.bfloat16)


def step(m, x, autocast: bool, device, recipe: str, dy=None):
    """Forward (under torch.autocast(bfloat16) when ``autocast``, else on x in bf16) and
    backward of ``dy`` (default: the sum of the output); returns the input leaf."""
    xx = (x if autocast else x.bfloat16()).clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast), \
            te.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
        y = m(xx)
    if dy is None:
        y.float().sum().backward()
    else:
        y.backward(dy)
    return xx


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_autocast_equals_bf16_parameters(device, module, recipe):
    torch.manual_seed(4)
    fp32, bf16 = twin_modules(module, device)
    x = torch.randn(32, 64, device=device)
    outs = []
    for m, autocast in ((fp32, True), (bf16, False)):
        xx = (x if autocast else x.bfloat16()).clone().requires_grad_()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast), \
                te.fp8_autocast(fp8_recipe=RECIPES[recipe]()):
            y = m(xx)
            junk = [torch.full((64, 64), float("nan"), device=device) for _ in range(4)]  # reuse freed memory
        y.float().sum().backward()
        del junk
        outs.append((y, xx.grad))
    (y_ac, dx_ac), (y_ref, dx_ref) = outs
    assert y_ac.dtype == torch.bfloat16 and torch.isfinite(y_ac).all()
    assert torch.equal(y_ac, y_ref)
    if device == "cpu" or module != "Linear":
        assert torch.equal(dx_ac.bfloat16(), dx_ref)
    else:
        # te.Linear's dgrad GEMM writes an fp32 input's gradient in fp32 on the GPU, where
        # cuBLASLt may pick another kernel (another order of the sums) than for bf16
        assert dx_ac.dtype == torch.float32
        torch.testing.assert_close(dx_ac, dx_ref.float(), rtol=2.0 ** -7, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_fp32_gradients_come_from_the_gemm_in_fp32_cuda(module, recipe):
    """On the GPU the backward GEMMs write an fp32 weight's gradient (and te.Linear an fp32
    input's) in fp32 themselves: the values carry more than bf16's 8 bits, and match the
    bf16 model's gradients to bf16 precision."""
    torch.manual_seed(5)
    fp32, bf16 = twin_modules(module, "cuda")
    x = torch.randn(32, 64, device="cuda")
    grads = []
    for m, autocast in ((fp32, True), (bf16, False)):
        step(m, x, autocast, "cuda", recipe)
        grads.append({name: p.grad for name, p in m.named_parameters() if p.dim() == 2})
    for name, g in grads[0].items():
        assert g.dtype == torch.float32
        assert not torch.equal(g, g.bfloat16().float()), f"{name}: the gradient went through bf16"
        torch.testing.assert_close(g, grads[1][name].float(), rtol=2.0 ** -7, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("module", list(MODULES))
def test_fp32_bias_gradients_are_the_unrounded_sums(device, module, recipe):
    """The bias-gradient casts write an fp32 bias's gradient in fp32 (the core's fp32 column
    sums, not rounded to bf16 and converted back): rounded to bf16 it equals the bf16
    model's bias gradient bit for bit."""
    torch.manual_seed(6)
    fp32, bf16 = twin_modules(module, device)
    x = torch.randn(32, 64, device=device)
    dy = torch.randn(32, 64, device=device).bfloat16()  # sums that bf16 does not hold
    grads = []
    for m, autocast in ((fp32, True), (bf16, False)):
        step(m, x, autocast, device, recipe, dy)
        grads.append({n: p.grad for n, p in m.named_parameters() if n.endswith("bias") and "layer_norm" not in n})
    assert grads[0]
    for name, g in grads[0].items():
        assert g.dtype == torch.float32
        assert torch.equal(g.bfloat16(), grads[1][name]), name
        assert not torch.equal(g, g.bfloat16().float()), f"{name}: the gradient went through bf16"
