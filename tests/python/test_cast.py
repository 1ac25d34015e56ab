"""FP8 cast (quantize): row-wise, column-wise and both, against torch's own FP8
conversion on the CPU and bit for bit against the CPU core on CUDA."""

import pytest
import torch
from conftest import requires_cuda

from fp8_reference import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    TORCH_FP8,
    assert_fp8_equal,
    assert_same_bits,
    dtype_id,
    f32,
    ref_amax,
    ref_columnwise,
    ref_quantize,
    random_scale,
    shape_id,
    spread_input,
)
from transformer_engine.pytorch.cpp_extensions import DType, quantize

# () is a scalar (one element), (7,) one row; (3, 17) ... (61, 127) are not
# multiples of 8 (the kernels' general paths); (24, 40), (16, 8), (48, 40),
# (144, 72) are multiples of 8 of at most 16384 elements (on CUDA one block casts
# them: quantize_small.cu); (1160, 264) takes the fast cast+transpose path with a
# partial tile in both directions and more tiles than one row band. All small
# enough for compute-sanitizer.
SHAPES = [(), (1, 1), (7,), (3, 17), (2, 5, 33), (0, 16), (61, 127), (24, 40), (16, 8), (48, 40), (144, 72),
          (1160, 264)]
LARGE_SHAPES = [(4096, 4095), (16384, 4096), (3, 333, 1001)]
LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


def run_quantize(x, fp8_dtype, scale, layout, amax_start=0.0):
    rowwise, columnwise = LAYOUTS[layout]
    scale_t = torch.tensor([scale], dtype=torch.float32, device=x.device)
    amax = torch.tensor([amax_start], dtype=torch.float32, device=x.device)
    data, data_t, scale_inv = quantize(x, fp8_dtype, scale_t, amax=amax, rowwise=rowwise, columnwise=columnwise)
    assert (data is not None) == rowwise and (data_t is not None) == columnwise
    return data, data_t, scale_inv, amax


def check_against_cpu_core(x, fp8_dtype, scale, layout):
    """CUDA result == CPU core result, every byte, for outputs, scale_inv and amax."""
    got = run_quantize(x, fp8_dtype, scale, layout)
    if x.is_cuda:
        torch.cuda.synchronize()
    want = run_quantize(x.cpu(), fp8_dtype, scale, layout)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            assert_same_bits(g, w)


@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_quantize(device, shape, layout, fp8_dtype, in_dtype, gen):
    scale = random_scale(gen)
    x = spread_input(shape, in_dtype, fp8_dtype, scale, gen)
    if device == "cuda":
        check_against_cpu_core(x.cuda(), fp8_dtype, scale, layout)
        return
    data, data_t, scale_inv, amax = run_quantize(x, fp8_dtype, scale, layout)
    expected = ref_quantize(x, fp8_dtype, scale)
    if data is not None:
        assert data.shape == x.shape
        assert_fp8_equal(data, expected, fp8_dtype)
    if data_t is not None:
        assert_fp8_equal(data_t, ref_columnwise(expected), fp8_dtype)
    assert scale_inv.item() == f32(1) / f32(scale)
    assert amax.item() == ref_amax(x)


@requires_cuda
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=shape_id)
def test_quantize_cuda_large(shape, layout, fp8_dtype, in_dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    scale = 1.7
    x = spread_input(shape, in_dtype, fp8_dtype, scale, g, device="cuda")
    check_against_cpu_core(x, fp8_dtype, scale, layout)


# Codes worked out by hand from the formats (E4M3: bias 7, 3 mantissa bits, 0x7f NaN;
# E5M2: bias 15, 2 mantissa bits), scale 1: ties round to even, overflow saturates.
E4M3_CASES = [
    (1.0, 0x38), (1.0625, 0x38), (1.1875, 0x3A), (-1.5, 0xBC), (448.0, 0x7E), (463.9, 0x7E),
    (464.0, 0x7E), (1e30, 0x7E), (float("inf"), 0x7E), (float("-inf"), 0xFE), (-0.0, 0x80),
    (2.0**-6, 0x08), (7 * 2.0**-9, 0x07), (2.0**-9, 0x01), (2.0**-10, 0x00), (3 * 2.0**-10, 0x02),
    (-(2.0**-10), 0x80), (1e-30, 0x00),
]
E5M2_CASES = [
    (1.0, 0x3C), (1.125, 0x3C), (1.375, 0x3E), (57344.0, 0x7B), (61440.0, 0x7B), (1e9, 0x7B),
    (float("inf"), 0x7B), (float("-inf"), 0xFB), (2.0**-14, 0x04), (2.0**-16, 0x01), (2.0**-17, 0x00),
    (3 * 2.0**-17, 0x02), (-0.0, 0x80),
]


@pytest.mark.parametrize(
    "fp8_dtype,cases", [(DType.kFloat8E4M3, E4M3_CASES), (DType.kFloat8E5M2, E5M2_CASES)], ids=["E4M3", "E5M2"]
)
def test_quantize_known_codes(device, fp8_dtype, cases):
    x = torch.tensor([v for v, _ in cases] + [float("nan"), -float("nan")], dtype=torch.float32, device=device)
    data, data_t, _, _ = run_quantize(x, fp8_dtype, 1.0, "both")
    expected = [c for _, c in cases]
    assert data.cpu()[: len(cases)].tolist() == expected
    assert data_t.cpu()[: len(cases)].tolist() == expected  # 1-D: the transpose has the same order
    assert data.cpu()[-2:].tolist() == [0x7F, 0x7F], "NaN of either sign becomes the canonical 0x7f"


def test_quantize_scales_before_rounding(device):
    # 1.0 * 300 = 300 lies between E4M3 288 (0x79) and 320 (0x7a), nearer 288; ~1000 saturates.
    x = torch.tensor([1.0, -1.0, 1000 / 300], device=device)
    data, _, scale_inv, _ = run_quantize(x, DType.kFloat8E4M3, 300.0, "rowwise")
    assert data.cpu().tolist() == [0x79, 0xF9, 0x7E]
    assert scale_inv.item() == f32(1) / f32(300)


@pytest.mark.parametrize("amax_start,expected", [(0.0, 5.0), (2.0, 5.0), (9.0, 9.0)])
def test_quantize_amax_is_running_max(device, amax_start, expected):
    # NaN is ignored, inf is not: the reduction is max(amax, max|x|) over numbers.
    x = torch.tensor([[1.0, -5.0], [float("nan"), 0.5]], device=device)
    *_, amax = run_quantize(x, DType.kFloat8E4M3, 1.0, "rowwise", amax_start=amax_start)
    assert amax.item() == expected
    x_inf = torch.tensor([1.0, float("-inf")], device=device)
    *_, amax = run_quantize(x_inf, DType.kFloat8E4M3, 1.0, "columnwise", amax_start=amax_start)
    assert amax.item() == float("inf")


def test_quantize_without_amax_and_with_given_scale_inv(device):
    x = torch.tensor([[2.0, 3.0]], device=device)
    scale = torch.tensor([0.5], device=device)
    scale_inv = torch.full((1,), -7.0, device=device)
    data, _, out = quantize(x, DType.kFloat8E5M2, scale, scale_inv=scale_inv)
    assert out is scale_inv and scale_inv.item() == 2.0  # written in place
    assert data.cpu().tolist() == [[0x3C, 0x3E]]  # 1.0 and 1.5 in E5M2


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
def test_quantize_accepts_torch_fp8_dtypes(device, fp8_dtype, gen):
    x = spread_input((5, 9), torch.float32, fp8_dtype, 1.0, gen).to(device)
    scale = torch.ones(1, device=device)
    a, *_ = quantize(x, fp8_dtype, scale)
    b, *_ = quantize(x, TORCH_FP8[fp8_dtype], scale)
    assert torch.equal(a, b)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantize_misaligned_input(device, layout, in_dtype, fp8_dtype, gen):
    """A contiguous view that starts one element into its storage is not 16-byte
    aligned: the kernels must take their general paths (an instantiation an FP8 dtype)
    and still agree."""
    scale = random_scale(gen)
    base = spread_input((1 + 64 * 40,), in_dtype, fp8_dtype, scale, gen)
    x = base[1:].view(64, 40)
    if device == "cuda":
        check_against_cpu_core(base.cuda()[1:].view(64, 40), fp8_dtype, scale, layout)
        return
    data, data_t, _, _ = run_quantize(x, fp8_dtype, scale, layout)
    expected = ref_quantize(x, fp8_dtype, scale)
    if data is not None:
        assert_fp8_equal(data, expected, fp8_dtype)
    if data_t is not None:
        assert_fp8_equal(data_t, ref_columnwise(expected), fp8_dtype)
