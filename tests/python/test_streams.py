"""The helpers must run on torch's *current* CUDA stream. On a side stream, the input
is written only after a long sleep kernel; an op launched on any other stream would
read the stale input (PyTorch's streams do not wait for the legacy default stream)."""

import copy

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from fp8_reference import assert_same_bits
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling
from transformer_engine.pytorch.cpp_extensions import DType, compute_amax, dequantize, quantize, transpose

pytestmark = requires_cuda

SLEEP_CYCLES = 200_000_000  # ~0.1 s on an H100: far longer than any launch


def on_side_stream(make_input, op):
    """Fills the input late on a side stream, runs op there, returns op's result on the CPU."""
    x = torch.zeros_like(make_input())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(make_input())
        out = op(x)
    s.synchronize()
    return out


def test_quantize_uses_current_stream():
    src = torch.linspace(-3, 3, 4096 * 64, device="cuda").reshape(4096, 64)
    scale = torch.ones(1, device="cuda")
    data, data_t, _ = on_side_stream(lambda: src, lambda x: quantize(x, DType.kFloat8E4M3, scale, columnwise=True))
    want, want_t, _ = quantize(src.cpu(), DType.kFloat8E4M3, scale.cpu(), columnwise=True)
    assert_same_bits(data, want)
    assert_same_bits(data_t, want_t)


def test_dequantize_uses_current_stream():
    src = torch.arange(256 * 64, device="cuda").remainder(256).to(torch.uint8).reshape(256, 64)
    s_inv = torch.full((1,), 0.5, device="cuda")
    got = on_side_stream(lambda: src, lambda x: dequantize(x, s_inv, DType.kFloat8E5M2))
    torch.testing.assert_close(got.cpu(), dequantize(src.cpu(), s_inv.cpu(), DType.kFloat8E5M2), rtol=0, atol=0,
                               equal_nan=True)


def test_transpose_uses_current_stream():
    src = torch.arange(1000 * 77, dtype=torch.int32, device="cuda").reshape(1000, 77)
    assert torch.equal(on_side_stream(lambda: src, transpose).cpu(), src.cpu().t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compute_amax_uses_current_stream(dtype):
    src = torch.full((512, 512), -7.0, dtype=dtype, device="cuda")
    assert on_side_stream(lambda: src, compute_amax).item() == 7.0


def _training_step(module, x, grad, recipe):
    """(y, dx, grads of the parameters) of one forward + backward, on the CPU."""
    x = x.detach().clone().requires_grad_()
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = module(x)
    y.backward(grad)
    return [y.detach().cpu(), x.grad.cpu()] + [p.grad.cpu() for p in module.parameters()]


@pytest.mark.parametrize("recipe", [None, DelayedScaling(amax_history_len=4), Float8CurrentScaling()],
                         ids=["bf16", "delayed", "current"])
@pytest.mark.parametrize("make", [lambda: te.Linear(64, 32, params_dtype=torch.bfloat16, device="cuda"),
                                  lambda: te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16, device="cuda")],
                         ids=["Linear", "LayerNormMLP"])
def test_module_step_uses_current_stream(make, recipe):
    """A module's forward and backward read torch's current stream once each (not per core
    call): on a side stream whose input is written late, every output and gradient equals
    the same step run on the default stream by an identical module (no kernel here sums
    with atomics, so equal inputs give equal bits)."""
    torch.manual_seed(5)
    module = make()
    twin = copy.deepcopy(module)
    src = torch.randn(32, 64, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        out_features = module(src).shape[-1]
    grad = torch.randn(32, out_features, dtype=torch.bfloat16, device="cuda")
    want = _training_step(twin, src, grad, recipe)
    x = torch.zeros_like(src)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(src)
        got = _training_step(module, x, grad, recipe)
    s.synchronize()
    for g, w in zip(got, want):
        assert_same_bits(g, w)
