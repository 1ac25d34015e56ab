"""Current-scaling cast in one core call (_core.quantize_current_scaling, the cast the
modules make under Float8CurrentScaling): amax, scale and FP8 bits against torch
references on the CPU, and bit for bit against the CPU core on CUDA."""

import math

import numpy as np
import pytest
import torch
from conftest import requires_cuda

from fp8_reference import (
    FLOAT_DTYPES,
    FLT_MAX,
    FP8_DTYPES,
    FP8_MAX,
    assert_fp8_equal,
    assert_same_bits,
    dtype_id,
    f32,
    ref_amax,
    ref_columnwise,
    ref_quantize,
    round_down_pow2,
    shape_id,
)
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of

# Odd sizes (the kernels' general paths), multiples of 8 up to 16384 elements (on
# CUDA one block does amax, scale and cast: quantize_small.cu), past that the fast
# cast+transpose with partial 128-tiles, and empty ones (amax 0: scale 1, or
# fp8_max / epsilon).
SHAPES = [(1, 1), (3, 17), (24, 40), (61, 127), (144, 72), (1160, 264), (0, 16), (16, 0)]
LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


def wide_input(shape, dtype, gen):
    """Finite values over many magnitudes, so the amax is what decides the scale."""
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.randint(-12, 12, shape, generator=gen).float())
    return x.to(dtype)


def ref_scale(amax: float, fp8_dtype, eps: float, pow2: bool) -> float:
    """fp8_max / max(amax, eps) in fp32; 1 when that max is 0 or not finite; FLT_MAX on overflow."""
    m = max(f32(amax), f32(eps))
    if m == 0 or not math.isfinite(m):
        return 1.0
    with np.errstate(over="ignore"):
        s = f32(FP8_MAX[fp8_dtype]) / m
    s = FLT_MAX if math.isinf(s) else float(s)
    return round_down_pow2(s) if pow2 else s


def run(x, fp8_dtype, eps=0.0, pow2=False, layout="both"):
    """(data, data_t, amax, scale, scale_inv) through the binding, state buffers poisoned first."""
    rowwise, columnwise = LAYOUTS[layout]
    dev = x.device
    rows, cols = x.shape
    data = torch.full((rows, cols), 0xAB, dtype=torch.uint8, device=dev) if rowwise else None
    data_t = torch.full((cols, rows), 0xAB, dtype=torch.uint8, device=dev) if columnwise else None
    amax, scale, scale_inv = (torch.full((1,), 1e30, device=dev) for _ in range(3))
    out = _core.Tensor(*describe(x, "x").device, int(fp8_dtype), [rows, cols],
                       data.data_ptr() if data is not None else 0, data_t.data_ptr() if data_t is not None else 0,
                       scale.data_ptr(), scale_inv.data_ptr(), amax.data_ptr(), int(_core.ScalingMode.PER_TENSOR))
    _core.quantize_current_scaling(describe(x, "x"), out, eps, pow2, stream_of(x))
    return data, data_t, amax, scale, scale_inv


@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_quantize_current_scaling(device, shape, layout, fp8_dtype, in_dtype, gen):
    x = wide_input(shape, in_dtype, gen)
    if device == "cuda":
        got = run(x.cuda(), fp8_dtype, layout=layout)
        torch.cuda.synchronize()
        for g, w in zip(got, run(x, fp8_dtype, layout=layout)):
            assert (g is None) == (w is None)
            if g is not None:
                assert_same_bits(g, w)
        return
    data, data_t, amax, scale, scale_inv = run(x, fp8_dtype, layout=layout)
    want_amax = ref_amax(x)
    want_scale = ref_scale(want_amax, fp8_dtype, 0.0, False)
    assert amax.item() == want_amax
    assert scale.item() == want_scale
    assert scale_inv.item() == f32(1) / f32(want_scale)
    expected = ref_quantize(x, fp8_dtype, want_scale)
    if data is not None:
        assert_fp8_equal(data, expected, fp8_dtype)
    if data_t is not None:
        assert_fp8_equal(data_t, ref_columnwise(expected), fp8_dtype)


@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantize_current_scaling_misaligned(device, layout, fp8_dtype, in_dtype, gen):
    """A view one element into its storage: the amax and the cast take their element-by-
    element kernels on the GPU, with the same bits as the CPU's."""
    base = wide_input((1 + 64 * 40,), in_dtype, gen)
    got = run(base.to(device)[1:].view(64, 40), fp8_dtype, layout=layout)
    want = run(base[1:].view(64, 40).clone(), fp8_dtype, layout=layout)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            assert_same_bits(g, w)
    data, _, amax, _, _ = want
    assert amax.item() == ref_amax(base[1:])
    if data is not None:
        assert_fp8_equal(data, ref_quantize(base[1:].view(64, 40), fp8_dtype, want[3].item()), fp8_dtype)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("eps,pow2", [(0.0, True), (1e-3, False), (1e6, False), (1e6, True)])
@pytest.mark.parametrize("shape", [(48, 32), (0, 32)], ids=shape_id)
def test_epsilon_and_power_of_two(device, shape, eps, pow2, fp8_dtype, gen):
    x = wide_input(shape, torch.bfloat16, gen)
    got = run(x.to(device), fp8_dtype, eps, pow2)
    if device == "cuda":
        torch.cuda.synchronize()
        for g, w in zip(got, run(x, fp8_dtype, eps, pow2)):
            assert_same_bits(g, w)
        return
    data, _, amax, scale, _ = got
    want_scale = ref_scale(ref_amax(x), fp8_dtype, eps, pow2)
    assert scale.item() == want_scale
    assert amax.item() == ref_amax(x)
    assert_fp8_equal(data, ref_quantize(x, fp8_dtype, want_scale), fp8_dtype)


def test_nan_skipped_and_inf_gives_scale_one(device):
    x = torch.tensor([[float("nan"), 2.0, -3.0, 1.0] * 4] * 2, device=device)
    _, _, amax, scale, _ = run(x, FP8_DTYPES[0])
    assert amax.item() == 3.0 and scale.item() == f32(448.0) / f32(3.0)
    x[0, 1] = float("inf")
    _, _, amax, scale, scale_inv = run(x, FP8_DTYPES[0])
    assert amax.item() == float("inf") and scale.item() == 1.0 and scale_inv.item() == 1.0


def test_module_ops_matches_separate_ops(device, gen):
    """module_ops.quantize_current_scaling (the modules' cast) == compute_amax, compute_scale_from_amax, quantize."""
    from transformer_engine.pytorch.cpp_extensions import compute_amax, compute_scale_from_amax, quantize

    x = wide_input((40, 48), torch.bfloat16, gen).to(device)
    fp8 = FP8_DTYPES[1]
    got = module_ops.quantize_current_scaling(x, fp8, 0.0, False, True, True, module_ops.core_device(x))
    scale, _ = compute_scale_from_amax(compute_amax(x), fp8)
    data, data_t, scale_inv = quantize(x, fp8, scale, columnwise=True)
    assert_same_bits(got._data, data)
    assert_same_bits(got._transpose, data_t)
    assert_same_bits(got._scale_inv, scale_inv)
    assert got._fp8_dtype == fp8


def test_bad_epsilon_raises(device):
    x = torch.ones(16, 16, device=device)
    with pytest.raises(ValueError, match="te_quantize_current_scaling: epsilon must be finite and >= 0"):
        run(x, FP8_DTYPES[0], eps=-1.0)


@requires_cuda
def test_quantize_current_scaling_uses_current_stream():
    """Queued on torch's current stream: on a side stream that fills x late, the result is x's."""
    src = torch.linspace(-3, 3, 4096 * 64, device="cuda").reshape(4096, 64)
    x = torch.zeros_like(src)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        x.copy_(src)
        got = run(x, FP8_DTYPES[0])
    s.synchronize()
    for g, w in zip(got, run(src.cpu(), FP8_DTYPES[0])):
        assert_same_bits(g, w)
