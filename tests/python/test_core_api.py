"""The raw binding `transformer_engine._core` over hand-made descriptors.

Outputs here live in buffers the test allocates, so they can be poisoned first:
each op runs twice, over two different poison bytes, and must give the same
bytes both times (so every element was written) and leave a guard zone past the
end untouched (so nothing was written outside the buffer)."""

import pytest
import torch

from fp8_reference import (
    FP8_DTYPES,
    assert_float_equal,
    assert_fp8_equal,
    assert_same_bits,
    dtype_id,
    f32,
    random_bits,
    random_scale,
    ref_amax,
    ref_columnwise,
    ref_dequantize,
    ref_quantize,
    shape_id,
    spread_input,
)
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import DType, dequantize, quantize, transpose

CPU, CUDA = int(_core.DeviceType.CPU), int(_core.DeviceType.CUDA)
NONE, PER_TENSOR = int(_core.ScalingMode.NONE), int(_core.ScalingMode.PER_TENSOR)
TE_DTYPE = {torch.float32: DType.kFloat32, torch.float16: DType.kFloat16, torch.bfloat16: DType.kBFloat16}
POISONS = (0xA5, 0x5A)
GUARD = 64  # bytes after every output that must stay poisoned
SHAPES = [(1, 1), (3, 17), (2, 5, 33), (61, 127)]


def where(t):
    return (CUDA, t.device.index) if t.is_cuda else (CPU, 0)


def stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def describe(t, dtype=None, *, scale_inv=None, mode=NONE):
    """A descriptor of tensor t (dtype overrides its own, e.g. FP8 bits held as uint8)."""
    return _core.Tensor(*where(t), int(dtype if dtype is not None else TE_DTYPE[t.dtype]), list(t.shape),
                        t.data_ptr(), 0, 0, scale_inv.data_ptr() if scale_inv is not None else 0, 0, mode)


class Poisoned:
    """A byte buffer filled with `poison`, plus a guard zone; `.view` is the usable part."""

    def __init__(self, shape, dtype, device, poison):
        self.size = torch.empty(shape, dtype=dtype).numel() * torch.empty((), dtype=dtype).element_size()
        self.raw = torch.full((self.size + GUARD,), poison, dtype=torch.uint8, device=device)
        self.poison = poison
        self.view = self.raw[: self.size].view(dtype).reshape(shape)

    def check_guard(self):
        guard = self.raw[self.size:].cpu()
        assert torch.all(guard == self.poison), f"wrote {int((guard != self.poison).sum())} bytes past the end"


def run_twice(op):
    """Runs op(poison) for both poisons; the results must be byte-identical."""
    results = [op(p) for p in POISONS]
    for a, b in zip(*results):
        assert_same_bits(a, b)  # a byte still equal to its poison would differ here
    return results[0]


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_quantize_writes_every_element(device, shape, in_dtype, fp8_dtype, gen):
    scale = random_scale(gen)
    x = spread_input(shape, in_dtype, fp8_dtype, scale, gen).to(device)
    cols = (shape[-1], *shape[:-1])

    def op(poison):
        data = Poisoned(shape, torch.uint8, device, poison)
        data_t = Poisoned(cols, torch.uint8, device, poison)
        scale_inv = Poisoned((1,), torch.float32, device, poison)
        scale_t = torch.tensor([scale], device=device)
        amax = torch.zeros(1, device=device)  # must start at 0 (a fresh reduction), so not poisoned
        out = _core.Tensor(*where(x), int(fp8_dtype), list(shape), data.view.data_ptr(), data_t.view.data_ptr(),
                           scale_t.data_ptr(), scale_inv.view.data_ptr(), amax.data_ptr(), PER_TENSOR)
        _core.quantize(describe(x), out, stream(x))
        for b in (data, data_t, scale_inv):
            b.check_guard()
        return data.view.cpu(), data_t.view.cpu(), scale_inv.view.cpu(), amax.cpu()

    data, data_t, scale_inv, amax = run_twice(op)
    if device == "cuda":
        want, want_t, want_inv = quantize(x.cpu(), fp8_dtype, torch.tensor([scale]), columnwise=True)
        assert_same_bits(data, want)
        assert_same_bits(data_t, want_t)
        assert_same_bits(scale_inv, want_inv)
    else:
        expected = ref_quantize(x, fp8_dtype, scale)
        assert_fp8_equal(data, expected, fp8_dtype)
        assert_fp8_equal(data_t, ref_columnwise(expected), fp8_dtype)
        assert scale_inv.item() == f32(1) / f32(scale)
    assert amax.item() == ref_amax(x.cpu())


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_dequantize_writes_every_element(device, shape, out_dtype, gen):
    bits = random_bits(shape, torch.uint8, gen).to(device)
    scale_inv = torch.tensor([0.37], device=device)

    def op(poison):
        out = Poisoned(shape, out_dtype, device, poison)
        src = describe(bits, DType.kFloat8E5M2, scale_inv=scale_inv, mode=PER_TENSOR)
        _core.dequantize(src, describe(out.view), stream(bits))
        out.check_guard()
        return (out.view.cpu(),)

    (got,) = run_twice(op)
    if device == "cuda":
        assert_float_equal(got, dequantize(bits.cpu(), scale_inv.cpu(), DType.kFloat8E5M2, out_dtype))
    else:
        assert_float_equal(got, ref_dequantize(bits, DType.kFloat8E5M2, 0.37, out_dtype))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_transpose_writes_every_element(device, shape, dtype, gen):
    x = random_bits(shape, dtype, gen).to(device)
    te_dt = {**TE_DTYPE, torch.uint8: DType.kByte}[dtype]
    cols = (shape[-1], *shape[:-1])

    def op(poison):
        out = Poisoned(cols, dtype, device, poison)
        _core.transpose(describe(x, te_dt), describe(out.view, te_dt), stream(x))
        out.check_guard()
        return (out.view.cpu(),)

    (got,) = run_twice(op)
    assert_same_bits(got, transpose(x.cpu()) if device == "cuda" else ref_columnwise(x))


def test_compute_scale_writes_scale_and_scale_inv(device):
    amax = torch.tensor([3.5], device=device)

    def op(poison):
        scale = Poisoned((1,), torch.float32, device, poison)
        scale_inv = Poisoned((1,), torch.float32, device, poison)
        _core.compute_scale_from_amax(amax.data_ptr(), scale.view.data_ptr(), scale_inv.view.data_ptr(),
                                      int(DType.kFloat8E4M3), 0.0, False, *where(amax), stream(amax))
        scale.check_guard()
        scale_inv.check_guard()
        return scale.view.cpu(), scale_inv.view.cpu()

    scale, scale_inv = run_twice(op)
    assert scale.item() == 128.0 and scale_inv.item() == 1 / 128.0  # 448 / 3.5


def test_enums_follow_transformer_engine_numbering():
    # Clients and checkpoints carry these numbers (TE's DType enum).
    assert [int(DType.kByte), int(DType.kInt32), int(DType.kFloat32), int(DType.kFloat16),
            int(DType.kBFloat16), int(DType.kFloat8E4M3), int(DType.kFloat8E5M2)] == [0, 2, 4, 5, 6, 7, 8]
