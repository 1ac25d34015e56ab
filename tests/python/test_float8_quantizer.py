"""Float8Quantizer (delayed scaling) and Float8CurrentScalingQuantizer: the FP8 bits
against torch's own FP8 conversion, the amax and scale bookkeeping, usage flags,
empty tensors, in-place updates and bad arguments.

References run on the CPU from the same input; on CUDA the core must match them bit
for bit (casts are exact), so every test runs unchanged on both devices."""

import math

import pytest
import torch
from conftest import requires_cuda

from fp8_reference import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    FP8_MAX,
    TORCH_FP8,
    assert_float_equal,
    assert_fp8_equal,
    dtype_id,
    f32,
    random_scale,
    ref_amax,
    ref_columnwise,
    ref_dequantize,
    ref_quantize,
    round_down_pow2,
    shape_id,
    spread_input,
)
from transformer_engine.pytorch.cpp_extensions import compute_scale_from_amax
from transformer_engine.pytorch.tensor import (
    DType,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    Float8TensorBase,
    Quantizer,
)

SHAPES = [(), (7,), (1, 1), (3, 17), (2, 5, 33), (0, 16), (61, 127)]
LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


def delayed(scale, fp8_dtype, device, amax=0.0, **usage):
    return Float8Quantizer(torch.tensor([scale], dtype=torch.float32, device=device),
                           torch.tensor([amax], dtype=torch.float32, device=device), fp8_dtype, **usage)


def check_bits(t, x, fp8_dtype, scale: float):
    """The FP8 buffers t holds are x cast with scale (row-wise and column-wise)."""
    expected = ref_quantize(x.cpu(), fp8_dtype, scale)
    if t._data is not None:
        assert_fp8_equal(t._data, expected, fp8_dtype)
    if t._transpose is not None:
        assert_fp8_equal(t._transpose, ref_columnwise(expected), fp8_dtype)
    assert t._scale_inv.item() == f32(1) / f32(scale)


# ---- delayed scaling --------------------------------------------------------------


@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_delayed_round_trip(device, shape, layout, fp8_dtype, in_dtype, gen):
    rowwise, columnwise = LAYOUTS[layout]
    scale = random_scale(gen)
    x = spread_input(shape, in_dtype, fp8_dtype, scale, gen).to(device)
    q = delayed(scale, fp8_dtype, device, rowwise=rowwise, columnwise=columnwise)
    t = q(x)
    assert isinstance(t, Float8Tensor) and t._quantizer is q and t._fp8_dtype == fp8_dtype
    assert t.dtype == in_dtype and t.shape == x.shape and t.device == x.device and not t.requires_grad
    assert (t._data is not None) == rowwise and (t._transpose is not None) == columnwise
    check_bits(t, x, fp8_dtype, scale)
    assert q.scale.item() == f32(scale), "delayed scaling uses the scale as given"
    assert q.amax.item() == ref_amax(x.cpu())
    # Dequantizing: one product by scale_inv per element, one rounding to the dtype.
    bits = ref_quantize(x.cpu(), fp8_dtype, scale)
    for dtype in FLOAT_DTYPES:
        assert_float_equal(t.dequantize(dtype=dtype).cpu(), ref_dequantize(bits, fp8_dtype, f32(1) / f32(scale), dtype))
    assert t.dequantize().dtype == in_dtype


@pytest.mark.parametrize("start,expected", [(0.0, 5.0), (2.0, 5.0), (9.0, 9.0)])
def test_delayed_amax_is_running_max(device, start, expected):
    # NaN does not count; the cast, update_quantized and calibrate all raise amax the same way.
    x = torch.tensor([[1.0, -5.0], [float("nan"), 0.5]], device=device)
    for use in ("quantize", "update", "calibrate"):
        q = delayed(1.0, DType.kFloat8E4M3, device, amax=start)
        if use == "quantize":
            q(x)
        elif use == "update":
            q.update_quantized(x, q.make_empty(x.shape, device=device))
        else:
            q.calibrate(x)
        assert q.amax.item() == expected, use
    q = delayed(1.0, DType.kFloat8E4M3, device, amax=start)
    q(torch.tensor([1.0, float("-inf")], device=device))
    assert q.amax.item() == float("inf")


def test_delayed_scale_is_read_at_each_cast(device):
    """The quantizer keeps the recipe's scale tensor by reference: an update of that
    tensor (the recipe's step) changes the next cast."""
    x = torch.tensor([1.0, 3.0], device=device)
    q = delayed(2.0, DType.kFloat8E4M3, device)
    first = q(x)
    q.scale.fill_(16.0)
    second = q(x)
    check_bits(first, x, DType.kFloat8E4M3, 2.0)
    check_bits(second, x, DType.kFloat8E4M3, 16.0)


# ---- current scaling ----------------------------------------------------------------


def expected_current_scale(amax: float, fp8_dtype, epsilon: float, pow2: bool) -> float:
    """fp8_max / max(amax, eps) in fp32, rounded down to a power of two on request
    (the inputs here keep it finite and nonzero)."""
    scale = f32(FP8_MAX[fp8_dtype]) / max(f32(amax), f32(epsilon))
    return float(f32(round_down_pow2(float(scale)))) if pow2 else float(scale)


@pytest.mark.parametrize("in_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("pow2", [False, True], ids=["exact", "pow2"])
@pytest.mark.parametrize("epsilon", [0.0, 1e-3, 100.0])
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
def test_current_scaling(device, fp8_dtype, epsilon, pow2, in_dtype, gen):
    x = ((torch.randn(13, 37, generator=gen) * 7.3).to(in_dtype)).to(device)
    q = Float8CurrentScalingQuantizer(fp8_dtype, device, amax_epsilon=epsilon, force_pow_2_scales=pow2)
    t = q(x)
    amax = ref_amax(x.cpu())
    scale = expected_current_scale(amax, fp8_dtype, epsilon, pow2)
    assert q.amax.item() == amax and q.scale.item() == scale
    # The same scale compute_scale_from_amax gives (the one function both use).
    core_scale, core_scale_inv = compute_scale_from_amax(torch.tensor([amax]), fp8_dtype, epsilon=epsilon,
                                                         force_pow_2_scales=pow2)
    assert q.scale.item() == core_scale.item() and t._scale_inv.item() == core_scale_inv.item()
    check_bits(t, x, fp8_dtype, scale)
    # The largest magnitude lands on (at most) the format's max.
    assert t.dequantize(dtype=torch.float32).abs().max().item() <= amax * (1 + 2.0**-3)


def test_current_scaling_each_cast_has_its_own_scale(device):
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    small, large = q(torch.tensor([1.0, -2.0], device=device)), q(torch.tensor([100.0, 3.0], device=device))
    assert small._scale_inv.item() == f32(1) / (f32(448) / f32(2))
    assert large._scale_inv.item() == f32(1) / (f32(448) / f32(100))
    assert q.scale.item() == f32(448) / f32(100) and q.amax.item() == 100.0
    assert small.dequantize().tolist() == [1.0, -2.0] and large.dequantize()[0].item() == 100.0


def test_current_scaling_zero_tensor_gives_scale_one(device):
    q = Float8CurrentScalingQuantizer(DType.kFloat8E5M2, device)
    t = q(torch.zeros(4, 4, device=device))
    assert q.scale.item() == 1.0 and t._scale_inv.item() == 1.0 and not t._data.any()


def test_current_scaling_use_existing_amax(device):
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device, use_existing_amax=True)
    q.amax.fill_(224.0)  # as a fused op before the cast would have written it
    t = q(torch.tensor([1.0, 100.0], device=device))
    assert q.scale.item() == 2.0 and q.amax.item() == 224.0
    check_bits(t, torch.tensor([1.0, 100.0]), DType.kFloat8E4M3, 2.0)


def test_current_scaling_calibrate(device):
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    q.calibrate(torch.tensor([-7.0, 3.0], device=device))
    assert q.amax.item() == 7.0 and q.scale.item() == f32(448) / f32(7)


@requires_cuda
@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_quantize_does_not_synchronize_cuda(kind):
    """A training step must not wait for the GPU: no cast may read a device value on the host."""
    q = delayed(3.0, DType.kFloat8E4M3, "cuda") if kind == "delayed" else \
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cuda")
    x = torch.randn(64, 48, device="cuda")
    q(x)  # first use may initialize things
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t = q(x)
        t.quantize_(x * 2)
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---- usage, empty tensors, in-place updates ---------------------------------------------


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_usage_flags(device, kind, gen):
    x = torch.randn(6, 10, generator=gen).to(device)
    q = delayed(4.0, DType.kFloat8E4M3, device) if kind == "delayed" else \
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    assert q.rowwise_usage and q.columnwise_usage and not q.internal  # TE's defaults
    for rowwise, columnwise in LAYOUTS.values():
        q.set_usage(rowwise=rowwise, columnwise=columnwise)
        t = q(x)
        assert (t._data is not None) == rowwise and (t._transpose is not None) == columnwise
        if columnwise:
            assert t._transpose.shape == (10, 6)
        assert t.dequantize().shape == x.shape
    q.set_usage(rowwise=True)  # None leaves the other flag alone
    assert q.rowwise_usage and q.columnwise_usage
    q.set_usage(False, False)
    with pytest.raises(ValueError, match="rowwise and columnwise usage are both off"):
        q(x)


def test_internal_gives_storage_not_tensor(device, gen):
    x = torch.randn(5, 8, generator=gen).to(device)
    q = delayed(8.0, DType.kFloat8E5M2, device)
    q.internal = True
    t = q(x)
    assert type(t) is Float8TensorBase and not isinstance(t, torch.Tensor)
    check_bits(t, x, DType.kFloat8E5M2, 8.0)
    x.requires_grad_(True)
    assert type(q(x)) is Float8TensorBase  # no autograd node for internal tensors


def test_update_usage(device, gen):
    x = torch.randn(3, 4, 5, generator=gen).to(device)
    t = delayed(2.0, DType.kFloat8E4M3, device, rowwise=True, columnwise=False)(x)
    t.update_usage(columnwise_usage=True)
    check_bits(t, x, DType.kFloat8E4M3, 2.0)
    assert t._transpose.shape == (5, 3, 4)
    t.update_usage(rowwise_usage=False)
    assert t._data is None and t.shape == x.shape
    t.update_usage(rowwise_usage=True, columnwise_usage=False)  # made back from the column-wise copy
    assert t._transpose is None
    check_bits(t, x, DType.kFloat8E4M3, 2.0)
    with pytest.raises(ValueError, match="at least one"):
        t.update_usage(rowwise_usage=False)


@pytest.mark.parametrize("kind", ["delayed", "current"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_make_empty_then_fill(device, kind, layout, gen):
    rowwise, columnwise = LAYOUTS[layout]
    q = delayed(4.0, DType.kFloat8E4M3, device) if kind == "delayed" else \
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
    q.set_usage(rowwise=rowwise, columnwise=columnwise)
    t = q.make_empty((4, 3, 8), dtype=torch.bfloat16, requires_grad=True)
    assert isinstance(t, Float8Tensor) and t.shape == (4, 3, 8) and t.dtype == torch.bfloat16
    assert t.requires_grad and t.device.type == device and t._quantizer is q
    assert (t._data is not None) == rowwise and (t._transpose is not None) == columnwise
    ptrs = [b.data_ptr() for b in (t._data, t._transpose, t._scale_inv) if b is not None]
    x = torch.randn(4, 3, 8, generator=gen).to(device)
    assert q.quantize(x, out=t) is t
    assert [b.data_ptr() for b in (t._data, t._transpose, t._scale_inv) if b is not None] == ptrs, "in place"
    check_bits(t, x, DType.kFloat8E4M3, q.scale.item())


@pytest.mark.parametrize("kind", ["delayed", "current"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_update_quantized_noop_flag(device, kind, layout, gen):
    """noop_flag 1: dst (every layout, scale_inv) and the quantizer's scale and amax keep
    their values; any other value: the same update as without a flag. Decided on the
    device: the flag is never read on the host (checked on CUDA below)."""
    rowwise, columnwise = LAYOUTS[layout]

    def make():
        q = delayed(4.0, DType.kFloat8E4M3, device, amax=0.5) if kind == "delayed" else \
            Float8CurrentScalingQuantizer(DType.kFloat8E4M3, device)
        q.set_usage(rowwise=rowwise, columnwise=columnwise)
        return q, q(torch.randn(5, 33, generator=gen).to(device))

    x = torch.randn(5, 33, generator=gen).to(device) * 3
    q, dst = make()
    before = [b.clone() for b in (dst._data, dst._transpose, dst._scale_inv, q.scale, q.amax) if b is not None]
    assert q.update_quantized(x, dst, noop_flag=torch.ones(1, device=device)) is dst
    after = [b for b in (dst._data, dst._transpose, dst._scale_inv, q.scale, q.amax) if b is not None]
    for old, new in zip(before, after):
        assert torch.equal(old, new)

    for flag in (0.0, 0.5):  # anything but 1 updates, exactly as without a flag
        q, dst = make()
        q_ref, dst_ref = q.copy(), dst.clone()
        q_ref.scale, q_ref.amax = q.scale.clone(), q.amax.clone()
        q.update_quantized(x, dst, noop_flag=torch.full((1,), flag, device=device))
        q_ref.update_quantized(x, dst_ref)
        for got, want in ((dst._data, dst_ref._data), (dst._transpose, dst_ref._transpose),
                          (dst._scale_inv, dst_ref._scale_inv), (q.scale, q_ref.scale), (q.amax, q_ref.amax)):
            if want is not None:
                assert torch.equal(got, want)
        check_bits(dst, x, DType.kFloat8E4M3, q.scale.item())
    # Through Float8Tensor.quantize_ (what optimizers with a skip flag call).
    q, dst = make()
    old = dst.dequantize()
    dst.quantize_(x, noop_flag=torch.ones(1, device=device))
    assert torch.equal(dst.dequantize(), old)
    dst.quantize_(x, noop_flag=torch.zeros(1, device=device))
    assert not torch.equal(dst.dequantize(), old)


@requires_cuda
def test_update_quantized_noop_flag_does_not_synchronize_cuda():
    q = delayed(3.0, DType.kFloat8E4M3, "cuda")
    dst = q(torch.randn(64, 48, device="cuda"))
    flag = torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        q.update_quantized(torch.randn(64, 48, device="cuda"), dst, noop_flag=flag)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_quantizer_copy_shares_state_not_usage(device):
    q = delayed(2.0, DType.kFloat8E4M3, device)
    c = q.copy()
    assert type(c) is Float8Quantizer and c.scale is q.scale and c.amax is q.amax and c.dtype == q.dtype
    c.set_usage(columnwise=False)
    assert q.columnwise_usage and not c.columnwise_usage
    assert isinstance(c, Quantizer)


def test_fp8_dtype_accepts_torch_dtypes(device):
    for te_dtype, torch_dtype in TORCH_FP8.items():
        assert delayed(1.0, torch_dtype, device).dtype == te_dtype
        assert Float8CurrentScalingQuantizer(torch_dtype, device).dtype == te_dtype


def test_quantize_is_straight_through_for_autograd(device, gen):
    x = torch.randn(4, 6, generator=gen).to(device).requires_grad_(True)
    w = torch.randn(4, 6, generator=gen).to(device)
    t = delayed(16.0, DType.kFloat8E4M3, device)(x)
    assert isinstance(t, Float8Tensor) and t.requires_grad
    (t * w).sum().backward()
    assert torch.equal(x.grad, w)


def test_create_tensor_from_data(device):
    q = delayed(4.0, DType.kFloat8E4M3, device)
    bits = (torch.tensor([[1.0, -2.0]]) * 4).to(torch.float8_e4m3fn).to(device)
    t = q.create_tensor_from_data(bits.view(torch.uint8), fake_dtype=torch.bfloat16)
    assert isinstance(t, Float8Tensor) and t.dtype == torch.bfloat16 and t.dequantize().tolist() == [[1.0, -2.0]]
    base = q.create_tensor_from_data(bits, internal=True)
    assert type(base) is Float8TensorBase and base.dequantize().tolist() == [[1.0, -2.0]]
    with pytest.raises(TypeError, match="data is torch.float8_e5m2"):
        q.create_tensor_from_data(bits.to(torch.float8_e5m2))


# ---- bad arguments ------------------------------------------------------------------------


def test_bad_scale_and_amax():
    good = torch.ones(1)
    cases = [
        (lambda: Float8Quantizer(torch.ones(1, dtype=torch.float64), good, DType.kFloat8E4M3), TypeError,
         "Float8Quantizer: scale must be float32, got torch.float64"),
        (lambda: Float8Quantizer(good, torch.ones(1, dtype=torch.bfloat16), DType.kFloat8E4M3), TypeError,
         "Float8Quantizer: amax must be float32, got torch.bfloat16"),
        (lambda: Float8Quantizer(torch.ones(2), good, DType.kFloat8E4M3), ValueError,
         r"scale must have exactly one element \(shape \[1\]\), got shape \(2,\)"),
        (lambda: Float8Quantizer(good, torch.ones(1, 3), DType.kFloat8E4M3), ValueError,
         r"amax must have exactly one element"),
        (lambda: Float8Quantizer(1.0, good, DType.kFloat8E4M3), TypeError, "scale must be a torch.Tensor, got float"),
        (lambda: Float8Quantizer(good, torch.ones(1, device="meta"), DType.kFloat8E4M3), ValueError,
         "amax is on meta but scale is on cpu"),
    ]
    for make, exc, message in cases:
        with pytest.raises(exc, match=message):
            make()


@pytest.mark.parametrize("bad", [torch.float16, torch.int8, DType.kBFloat16, "e4m3", None])
def test_unknown_fp8_dtype(bad):
    with pytest.raises(TypeError, match="fp8_dtype must be DType.kFloat8E4M3, DType.kFloat8E5M2"):
        Float8Quantizer(torch.ones(1), torch.zeros(1), bad)
    with pytest.raises(TypeError, match="fp8_dtype must be DType.kFloat8E4M3, DType.kFloat8E5M2"):
        Float8CurrentScalingQuantizer(bad, "cpu")


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_bad_input(kind):
    q = delayed(1.0, DType.kFloat8E4M3, "cpu") if kind == "delayed" else \
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu")
    name = type(q).__name__
    for bad, dtype in ((torch.arange(6), "torch.int64"), (torch.ones(3, dtype=torch.float64), "torch.float64"),
                       (torch.ones(2, dtype=torch.bool), "torch.bool")):
        with pytest.raises(TypeError, match=f"{name}: can only quantize float32, float16 or bfloat16 tensors, "
                                            f"got {dtype}"):
            q(bad)
    with pytest.raises(TypeError, match="can only quantize a torch.Tensor, got list"):
        q([1.0, 2.0])
    with pytest.raises(ValueError, match="the tensor is on meta but the quantizer's scale and amax are on cpu"):
        q(torch.ones(3, device="meta"))
    dst = q.make_empty((2, 3))
    with pytest.raises(ValueError, match=r"src has shape \(3, 2\) but dst has shape \(2, 3\)"):
        q.update_quantized(torch.ones(3, 2), dst)
    with pytest.raises(TypeError, match="can only update a Float8Tensor or Float8TensorBase, got Tensor"):
        q.update_quantized(torch.ones(2, 3), torch.ones(2, 3))
    for flag, err, msg in ((0.0, TypeError, "noop_flag must be a torch.Tensor, got float"),
                           (torch.zeros(1, dtype=torch.float64), ValueError, "noop_flag must be a float32 tensor"),
                           (torch.zeros(2), ValueError, r"of one element, got torch.float32 of shape \(2,\)"),
                           (torch.zeros(1, device="meta"), ValueError, "noop_flag is on meta but dst is on cpu")):
        with pytest.raises(err, match=msg):
            q.update_quantized(torch.ones(2, 3), dst, noop_flag=flag)
    other_format = (delayed(1.0, DType.kFloat8E5M2, "cpu") if kind == "delayed" else
                    Float8CurrentScalingQuantizer(DType.kFloat8E5M2, "cpu")).make_empty((2, 3))
    with pytest.raises(ValueError, match="dst must already be in the quantizer's format kFloat8E4M3"):
        q.update_quantized(torch.ones(2, 3), other_format, noop_flag=torch.zeros(1))


def test_bad_current_scaling_arguments():
    with pytest.raises(ValueError, match="amax_epsilon must be >= 0, got -1.0"):
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu", amax_epsilon=-1.0)
    with pytest.raises(ValueError, match="amax_epsilon must be >= 0, got nan"):
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3, "cpu", amax_epsilon=math.nan)
