"""gelu ... swiglu and their backward helpers against float64 torch references on the
very values the core reads (activation_reference.py: the references and the per-element
bounds on the core's fp32 error).

FP8 outputs: every code must be the cast of a value within the bound of y * scale; amax
within the bound of max|y|; scale_inv exactly 1/scale; the column-wise copy the transpose.
CUDA: against the CPU core (see the section's comment).
"""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cuda

from activation_reference import (
    KINDS,
    U,
    assert_within,
    fp8_ordinal,
    make_input,
    reference_bwd,
    reference_fwd,
    rounded,
)
from fp8_reference import FP8_MAX, FLOAT_DTYPES, TORCH_FP8, dtype_id, ref_quantize
from transformer_engine import _core
from transformer_engine.pytorch import cpp_extensions as ext
from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.tensor import Float8TensorBase

# The CUDA tests run on this device parameter (skipped without a GPU and a CUDA build).
CUDA = [pytest.param("cuda", marks=[requires_cuda])]

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2


def shape_of(name, h=48):
    return (3, 5, 2 * h if KINDS[name][1] else h)


# ---- CPU -----------------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16], ids=["same", "fp32", "bf16"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_fwd(name, dtype, out_dtype, gen):
    x = make_input(shape_of(name), dtype, gen)
    out = getattr(ext, name)(x, out_dtype=out_dtype)
    want_dtype = dtype if out_dtype is None else out_dtype
    assert out.dtype == want_dtype and out.shape == (3, 5, 48)
    y, err = reference_fwd(name, x)
    assert_within(out, y, err, want_dtype, name)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_bwd(name, dtype, gen):
    x = make_input(shape_of(name, 40), dtype, gen)
    grad = make_input((3, 5, 40), dtype, gen)
    dx = getattr(ext, "d" + name)(grad, x)
    assert dx.dtype == dtype and dx.shape == x.shape
    ref, err = reference_bwd(name, grad, x)
    assert_within(dx, ref, err, dtype, "d" + name)


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_fwd_fp8(name, fp8_dtype, columnwise, gen):
    x = make_input(shape_of(name, 32), torch.bfloat16, gen)
    scale_v = 8.0 if fp8_dtype == E4M3 else 0.25
    scale = torch.tensor([scale_v])
    amax = torch.tensor([0.125])
    torch_fp8 = TORCH_FP8[fp8_dtype]
    out = getattr(ext, name)(x, fp8_dtype=torch_fp8, scale=scale, amax=amax, columnwise=columnwise)
    assert isinstance(out, Float8TensorBase) and out._fp8_dtype == fp8_dtype and out.size() == (3, 5, 32)
    assert out._scale_inv.item() == 1.0 / scale_v
    y, err = reference_fwd(name, x)
    e = err * scale_v + U * (y * scale_v).abs()
    lo = fp8_ordinal(ref_quantize((y * scale_v - e).float(), fp8_dtype, 1.0))
    hi = fp8_ordinal(ref_quantize((y * scale_v + e).float(), fp8_dtype, 1.0))
    got = fp8_ordinal(out._data)
    bad = (got < lo) | (got > hi)
    assert not bad.any(), f"{int(bad.sum())} FP8 codes outside the bound"
    i = int(y.abs().flatten().argmax())
    want_amax = max(0.125, y.abs().max().item())
    assert abs(amax.item() - want_amax) <= err.flatten()[i].item() + U * want_amax
    if columnwise:
        assert out._transpose.shape == (32, 3, 5)
        assert torch.equal(out._transpose, out._data.reshape(15, 32).t().reshape(32, 3, 5))
    else:
        assert out._transpose is None
    # dequantized, the result is y (saturated at the FP8 max) within the FP8 step
    deq = out._data.view(torch_fp8).double() / scale_v
    fmax = FP8_MAX[fp8_dtype] / scale_v
    assert torch.allclose(deq, y.clamp(-fmax, fmax), rtol=2.0**-2, atol=(2.0**-9 if fp8_dtype == E4M3 else 2.0**-16) / scale_v)


def test_fp8_amax_keeps_larger_prior():
    x = torch.tensor([1.0, -3.0, 2.0])
    amax = torch.tensor([100.0])
    ext.srelu(x, fp8_dtype=E4M3, scale=torch.ones(1), amax=amax)
    assert amax.item() == 100.0
    amax.zero_()
    out = ext.srelu(x, fp8_dtype=E4M3, scale=torch.ones(1), amax=amax)
    assert amax.item() == 4.0
    assert out._data.tolist() == ref_quantize(torch.tensor([1.0, 0.0, 4.0]), E4M3, 1.0).tolist()


@pytest.mark.parametrize("name", list(KINDS))
def test_empty(name):
    x = torch.empty((0, 8))
    out = getattr(ext, name)(x)
    assert out.shape == (0, 4 if KINDS[name][1] else 8)
    assert getattr(ext, "d" + name)(torch.empty(out.shape), x).shape == (0, 8)


# ---- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["geglu", "swiglu"])
def test_gated_odd_last_dim(name):
    with pytest.raises(ValueError, match="even"):
        getattr(ext, name)(torch.ones(3, 7))
    with pytest.raises(ValueError, match="even"):
        getattr(ext, "d" + name)(torch.ones(3, 3), torch.ones(3, 7))


def test_errors():
    x = torch.ones(4, 8)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        ext.gelu(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="at least one dimension"):
        ext.relu(torch.tensor(1.0))
    with pytest.raises(ValueError, match="grad shape must be"):
        ext.dswiglu(torch.ones(4, 8), x)
    with pytest.raises(ValueError, match="grad shape must be"):
        ext.dgelu(torch.ones(4, 4), x)
    with pytest.raises(ValueError, match="grad dtype must equal input dtype"):
        ext.dsilu(torch.ones(4, 8, dtype=torch.bfloat16), x)
    with pytest.raises(ValueError, match="fp8_dtype"):
        ext.silu(x, scale=torch.ones(1))
    with pytest.raises(ValueError, match="scale"):
        ext.silu(x, fp8_dtype=E4M3)
    with pytest.raises(ValueError, match="not both"):
        ext.silu(x, fp8_dtype=E4M3, scale=torch.ones(1), out_dtype=torch.float32)
    with pytest.raises(TypeError, match="out_dtype"):
        ext.silu(x, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="contiguous"):
        ext.qgelu(torch.ones(8, 4).t())


def test_core_errors():
    x = torch.ones(4, 8)
    y = torch.empty(4, 8)
    xd = _core.Tensor(0, 0, int(DType.kFloat32), [4, 8], x.data_ptr())
    yd = _core.Tensor(0, 0, int(DType.kFloat32), [4, 8], y.data_ptr())
    with pytest.raises(ValueError, match="te_activation_fwd: kind must be a te_activation"):
        _core.activation_fwd(10, xd, yd)
    with pytest.raises(ValueError, match="te_activation_fwd: output shape must be"):
        _core.activation_fwd(int(_core.Activation.SWIGLU), xd, yd)
    fp8 = _core.Tensor(0, 0, int(E4M3), [4, 8], y.data_ptr(), scale=torch.ones(1).data_ptr(),
                       scaling_mode=int(_core.ScalingMode.BLOCK_1D))
    with pytest.raises(NotImplementedError, match="block scaling"):
        _core.activation_fwd(int(_core.Activation.GELU), xd, fp8)
    with pytest.raises(ValueError, match="dinput dtype must equal input dtype"):
        _core.activation_bwd(int(_core.Activation.GELU), xd, xd,
                             _core.Tensor(0, 0, int(DType.kBFloat16), [4, 8], y.data_ptr()))
    cuda_out = _core.Tensor(1, 0, int(DType.kFloat32), [4, 8], y.data_ptr())
    err = ValueError if _core.built_with_cuda() else NotImplementedError
    with pytest.raises(err, match="output"):
        _core.activation_fwd(int(_core.Activation.GELU), xd, cuda_out)


def test_enum_values():
    want = ["GELU", "QGELU", "RELU", "SRELU", "SILU", "GEGLU", "QGEGLU", "REGLU", "SREGLU", "SWIGLU"]
    assert [int(getattr(_core.Activation, n)) for n in want] == list(range(10))


# ---- CUDA vs the CPU core ------------------------------------------------------------------
#
# The kernels compute the CPU reference's fp32 operations (no fused multiply-adds) but for
# the exponential and the quotient (ex2.approx, rcp.approx) and gelu's exp(-2u), whose
# argument they take with its constants folded (one fused multiply-add), so results differ
# from the CPU core only there: float outputs within twice the reference bound, and FP8
# codes equal wherever the fp32 values (run with a float32 output on both devices) are
# equal, at most one code apart elsewhere. Shapes: flat vector path with tails (37 x 1024,
# 1000 x 1000), element-by-element paths (3 x 17: odd hidden; "unaligned": the input
# starts one element past a 16-byte boundary) and, with the column-wise copy, the tiled
# kernel's fast path (rows and H multiples of 8: 256 x 1024, 1000 x 1000 with partial
# tiles) and its generic path (37 x 1024, 3 x 17).

CUDA_SHAPES = {"37x1024": (37, 1024), "1000x1000": (1000, 1000), "256x1024": (256, 1024), "3x17": (3, 17),
               "unaligned": (5, 40), "7x1": (7, 1)}


def cuda_input(name, shape_id, dtype, gen):
    """The forward input of output shape CUDA_SHAPES[shape_id] (gated: twice as wide)."""
    rows, h = CUDA_SHAPES[shape_id]
    return make_input((rows, 2 * h if KINDS[name][1] else h), dtype, gen)


def to_device(x, device, shape_id):
    """x on the device; for "unaligned", starting one element past an aligned allocation."""
    if shape_id != "unaligned":
        return x.to(device)
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=device)
    flat[1:] = x.flatten().to(device)
    return flat[1:].view(x.shape)


@pytest.mark.parametrize("device", CUDA)
# 7 x 1: one output column (the flat kernels' divide by hidden at 1)
@pytest.mark.parametrize("shape_id", ["37x1024", "3x17", "unaligned", "7x1"])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16], ids=["same", "fp32", "bf16"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_fwd_cuda(name, dtype, out_dtype, shape_id, device, gen):
    x = cuda_input(name, shape_id, dtype, gen)
    got = getattr(ext, name)(to_device(x, device, shape_id), out_dtype=out_dtype).cpu()
    cpu = getattr(ext, name)(x, out_dtype=out_dtype)
    want_dtype = dtype if out_dtype is None else out_dtype
    y, err = reference_fwd(name, x)
    assert_within(got, y, 2 * err, want_dtype, name + " cuda")
    assert_within(got, cpu.double(), 2 * rounded(y, err, want_dtype), want_dtype, name + " cuda vs cpu")


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape_id", ["37x1024", "3x17", "unaligned", "7x1"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_bwd_cuda(name, dtype, shape_id, device, gen):
    x = cuda_input(name, shape_id, dtype, gen)
    grad = make_input((x.shape[0], CUDA_SHAPES[shape_id][1]), dtype, gen)
    got = getattr(ext, "d" + name)(to_device(grad, device, shape_id), to_device(x, device, shape_id)).cpu()
    cpu = getattr(ext, "d" + name)(grad, x)
    ref, err = reference_bwd(name, grad, x)
    assert_within(got, ref, 2 * err, dtype, "d" + name + " cuda")
    assert_within(got, cpu.double(), 2 * rounded(ref, err, dtype), dtype, "d" + name + " cuda vs cpu")


def assert_codes_match(got, cpu, y_got, y_cpu, what):
    """FP8 codes equal where the fp32 values are, at most one code apart elsewhere."""
    same_value = y_got.view(torch.int32) == y_cpu.view(torch.int32)
    diff = (fp8_ordinal(got) - fp8_ordinal(cpu)).abs()
    bad = (same_value & (diff != 0)) | (diff > 1)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} codes differ, first at {bad.nonzero()[0].tolist()} "
        f"(fp32 values differ at {int((~same_value).sum())} elements)"
    )


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape_id", ["37x1024", "256x1024", "1000x1000", "3x17", "unaligned"])
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_fwd_fp8_cuda(name, fp8_dtype, columnwise, shape_id, device, gen):
    x = cuda_input(name, shape_id, torch.bfloat16, gen)
    xd = to_device(x, device, shape_id)
    scale = torch.tensor([4.0])
    amax_gpu, amax_cpu = torch.zeros(1, device=device), torch.zeros(1)
    fn = getattr(ext, name)
    got = fn(xd, fp8_dtype=fp8_dtype, scale=scale.to(device), amax=amax_gpu, columnwise=columnwise)
    cpu = fn(x, fp8_dtype=fp8_dtype, scale=scale, amax=amax_cpu, columnwise=columnwise)
    y_got = fn(xd, out_dtype=torch.float32).cpu()  # the fp32 values the FP8 kernel cast
    y_cpu = fn(x, out_dtype=torch.float32)
    codes = got._data.cpu()
    assert_codes_match(codes, cpu._data, y_got, y_cpu, name)
    # every code within the bound of the exact y * scale, as on the CPU
    y, err = reference_fwd(name, x)
    e = 2 * err * 4.0 + U * (y * 4.0).abs()
    lo = fp8_ordinal(ref_quantize((y * 4.0 - e).float(), fp8_dtype, 1.0))
    hi = fp8_ordinal(ref_quantize((y * 4.0 + e).float(), fp8_dtype, 1.0))
    assert not ((fp8_ordinal(codes) < lo) | (fp8_ordinal(codes) > hi)).any()
    if columnwise:
        assert torch.equal(got._transpose.cpu(), codes.t())
        # the tiled kernel computes exactly what the flat one does
        flat = fn(xd, fp8_dtype=fp8_dtype, scale=scale.to(device))
        assert torch.equal(flat._data.cpu(), codes)
    else:
        assert got._transpose is None
    assert got._scale_inv.item() == cpu._scale_inv.item() == 0.25
    # amax: max|y| of the very fp32 values the GPU computed
    assert amax_gpu.item() == y_got.abs().max().item()
    assert abs(amax_gpu.item() - amax_cpu.item()) <= 2 * err.max().item() + U * amax_cpu.item()


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape_id", ["256x1024", "3x17"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_fwd_fp8_cuda_dtypes(name, dtype, fp8_dtype, shape_id, device, gen):
    """The other input dtypes (fp32 inputs stage twice the bytes) for every activation: each
    is its own instantiation of the tiled kernel (both copies; 256 x 1024 its fast path, 3 x
    17 the element-by-element one) and of the row-wise kernel's FP8 branch (with an amax),
    and both must write the same codes."""
    x = cuda_input(name, shape_id, dtype, gen)
    xd = x.to(device)
    fn = getattr(ext, name)
    scale = torch.tensor([4.0])
    got = fn(xd, fp8_dtype=fp8_dtype, scale=scale.to(device), columnwise=True)
    cpu = fn(x, fp8_dtype=fp8_dtype, scale=scale, columnwise=True)
    y_got, y_cpu = fn(xd, out_dtype=torch.float32).cpu(), fn(x, out_dtype=torch.float32)
    assert_codes_match(got._data.cpu(), cpu._data, y_got, y_cpu, name)
    assert torch.equal(got._transpose.cpu(), got._data.cpu().t())
    amax = torch.zeros(1, device=device)
    rowwise = fn(xd, fp8_dtype=fp8_dtype, scale=scale.to(device), amax=amax)
    assert torch.equal(rowwise._data.cpu(), got._data.cpu())
    assert amax.item() == y_got.abs().max().item()


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_empty_fp8_cuda(name, columnwise, device):
    """No rows, FP8 out on the GPU (the row-wise kernel and the tiled one): only scale_inv
    is written, the amax keeps its value."""
    amax = torch.tensor([0.5], device=device)
    out = getattr(ext, name)(torch.empty(0, 16, device=device), fp8_dtype=E4M3,
                             scale=torch.tensor([4.0], device=device), amax=amax, columnwise=columnwise)
    assert out._scale_inv.item() == 0.25 and amax.item() == 0.5
    assert out._data.shape == (0, 8 if KINDS[name][1] else 16)
