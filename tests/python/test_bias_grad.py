"""te_dbias_cast_transpose and te_dact_dbias_cast_transpose, through the torch helpers
(bgrad_quantize, dbias_d<act>, d<gated>_cast_transpose) and the binding.

CPU, against float64 torch references on the very values the core reads:
  dx: activation_reference.reference_bwd, with its per-element bound on the fp32 error;
      FP8 codes must be the cast of a value within that bound of dx * scale; without an
      activation dx = grad and the codes are exactly ref_quantize's;
  dbias: the column sums of dx. The CPU core sums the fp32 dx in double and rounds once,
      so |dbias - sum| <= sum(err) + (u_dtype + 2U) |sum| + half the dtype's smallest step.
CUDA, against the CPU core on random data (outputs poisoned first, so that unwritten
elements show):
  dx: the kernels compute the CPU's fp32 operations, so fp32 values differ only where the
      device's expf / tanhf round differently: FP8 (and bf16) results equal the CPU's
      wherever the fp32 values (a float32-output run on each device) are equal, and are at
      most one code apart elsewhere; the fp32 values themselves within twice the bound;
  dbias: the GPU adds its own fp32 dx in fp32: at most 25 additions in sequence within a
      128-row block (8 rows per thread, two half-warps, 8 warps; 16 + 8 in the generic
      kernel), then compensated sums of the blocks. Against the exact sum of the GPU's fp32
      dx the error is then at most 32U sum|dx|, plus the rounding to dbias's dtype.
Both devices: a float32 dbias from bf16 gradients is the same sums unrounded (equal to the
bf16 dbias once rounded to bf16).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICES, requires_cuda

from activation_reference import (
    HALF_MIN_STEP,
    KINDS,
    U,
    UNIT,
    assert_within,
    fp8_ordinal,
    make_input,
    reference_bwd,
)
from fp8_reference import FLOAT_DTYPES, TORCH_FP8, assert_fp8_equal, dtype_id, ref_amax, ref_columnwise, ref_quantize
from transformer_engine import _core
from transformer_engine.pytorch import cpp_extensions as ext
from transformer_engine.pytorch.cpp_extensions import DType, module_ops
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of
from transformer_engine.pytorch.tensor import Float8TensorBase

CUDA = [pytest.param("cuda", marks=[requires_cuda])]
E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2
PLAIN = [n for n, (_, gated) in KINDS.items() if not gated]
GATED = [n for n, (_, gated) in KINDS.items() if gated]
ACT = {n: int(getattr(_core.Activation, n.upper())) for n in KINDS}
LAYOUTS = {"rowwise": (True, False), "columnwise": (False, True), "both": (True, True)}


def dbias_bound(total, err_sum, dtype):
    """The CPU core's dbias bound: elements' errors, then rounding to fp32 and to dtype."""
    return err_sum + (UNIT[dtype] + 2 * U) * total.abs() + HALF_MIN_STEP[dtype]


def assert_dbias_within(got, total, bound, what):
    diff = (got.double().cpu() - total).abs()
    bad = ~(diff <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.numel()} off, first at {bad.nonzero()[0].tolist()}: got "
        f"{got.double().cpu()[bad][0].item()}, want {total[bad][0].item()} +- {bound[bad][0].item()}"
    )


def assert_codes_within(codes, ref, err, scale, fp8_dtype, what):
    """Every code is the cast of some value within the bound of ref * scale."""
    e = err * scale + U * (ref * scale).abs()
    lo = fp8_ordinal(ref_quantize((ref * scale - e).float(), fp8_dtype, 1.0))
    hi = fp8_ordinal(ref_quantize((ref * scale + e).float(), fp8_dtype, 1.0))
    got = fp8_ordinal(codes.cpu())
    bad = (got < lo) | (got > hi)
    assert not bad.any(), f"{what}: {int(bad.sum())} FP8 codes outside the bound, first at {bad.nonzero()[0].tolist()}"


# ---- CPU: the torch helpers ----------------------------------------------------------------


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_bgrad_quantize(dtype, fp8_dtype, layout, gen):
    rowwise, columnwise = LAYOUTS[layout]
    grad = make_input((3, 5, 37), dtype, gen)
    scale_v = 3.0 if fp8_dtype == E4M3 else 0.75  # not powers of two: grad * scale rounds in fp32
    amax = torch.tensor([0.5])
    dbias, out = ext.bgrad_quantize(grad, TORCH_FP8[fp8_dtype], torch.tensor([scale_v]), amax=amax,
                                    rowwise=rowwise, columnwise=columnwise)
    assert isinstance(out, Float8TensorBase) and out._fp8_dtype == fp8_dtype and out.size() == (3, 5, 37)
    want = ref_quantize(grad, fp8_dtype, scale_v)
    if rowwise:
        assert_fp8_equal(out._data, want, fp8_dtype)
    else:
        assert out._data is None
    if columnwise:
        assert_fp8_equal(out._transpose, ref_columnwise(want), fp8_dtype)
    else:
        assert out._transpose is None
    assert out._scale_inv.item() == torch.tensor(1.0 / scale_v, dtype=torch.float32).item()
    assert amax.item() == ref_amax(grad, 0.5)
    assert dbias.dtype == dtype and dbias.shape == (37,)
    total = grad.double().sum((0, 1))
    assert_dbias_within(dbias, total, dbias_bound(total, 0.0, dtype), "dbias")


@pytest.mark.parametrize("fp8_dtype", [None, E4M3, E5M2], ids=["float", "E4M3", "E5M2"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", PLAIN)
def test_dbias_dact(name, dtype, fp8_dtype, gen):
    x = make_input((4, 3, 40), dtype, gen)
    grad = make_input((4, 3, 40), dtype, gen)
    ref, err = reference_bwd(name, grad, x)
    fn = getattr(ext, "dbias_d" + name)
    scale_v = 2.0
    if fp8_dtype is None:
        dbias, dx = fn(grad, x)
        assert dx.dtype == dtype and dx.shape == x.shape
        assert_within(dx, ref, err, dtype, "dx")
        torch.testing.assert_close(dx, getattr(ext, "d" + name)(grad, x), rtol=0, atol=0)
    else:
        amax = torch.zeros(1)
        dbias, dx = fn(grad, x, fp8_dtype=fp8_dtype, scale=torch.tensor([scale_v]), amax=amax)
        assert isinstance(dx, Float8TensorBase) and dx.size() == x.shape
        assert_codes_within(dx._data, ref, err, scale_v, fp8_dtype, "dx")
        assert torch.equal(dx._transpose, ref_columnwise(dx._data))
        assert dx._scale_inv.item() == 0.5
        i = int(ref.abs().flatten().argmax())
        assert abs(amax.item() - ref.abs().max().item()) <= err.flatten()[i].item() + U * amax.item()
    assert dbias.dtype == dtype and dbias.shape == (40,)
    total = ref.sum((0, 1))
    assert_dbias_within(dbias, total, dbias_bound(total, err.sum((0, 1)), dtype), "dbias")


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("name", GATED)
def test_dgated_cast_transpose(name, fp8_dtype, columnwise, gen):
    x = make_input((6, 2, 64), torch.bfloat16, gen)
    grad = make_input((6, 2, 32), torch.bfloat16, gen)
    amax = torch.zeros(1)
    out = getattr(ext, f"d{name}_cast_transpose")(grad, x, TORCH_FP8[fp8_dtype], torch.tensor([4.0]), amax=amax,
                                                  columnwise=columnwise)
    assert isinstance(out, Float8TensorBase) and out.size() == x.shape
    ref, err = reference_bwd(name, grad, x)
    assert_codes_within(out._data, ref, err, 4.0, fp8_dtype, "dx")
    if columnwise:
        assert torch.equal(out._transpose, ref_columnwise(out._data))
    else:
        assert out._transpose is None
    i = int(ref.abs().flatten().argmax())
    assert abs(amax.item() - ref.abs().max().item()) <= err.flatten()[i].item() + U * amax.item()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows(device):
    """No rows: dbias is zeros (on the GPU the finalize over no row blocks writes them),
    the FP8 outputs are empty with their scale_inv written."""
    dbias, out = ext.bgrad_quantize(torch.empty(0, 8, device=device), E4M3, torch.tensor([2.0], device=device))
    assert torch.equal(dbias.cpu(), torch.zeros(8)) and out._data.shape == (0, 8) and out._transpose.shape == (8, 0)
    assert out._scale_inv.item() == 0.5
    x = torch.empty(2, 0, 4, dtype=torch.bfloat16, device=device)
    dbias, dx = ext.dbias_dsilu(x, x)
    assert torch.equal(dbias.cpu(), torch.zeros(4, dtype=torch.bfloat16)) and dx.shape == (2, 0, 4)
    for name in ("silu", "swiglu"):
        x = torch.empty(2, 0, 8, dtype=torch.bfloat16, device=device)
        grad = torch.empty(2, 0, 4 if KINDS[name][1] else 8, dtype=torch.bfloat16, device=device)
        for out_dtype in (torch.bfloat16, E4M3):
            r = run_core(name, grad, x, out_dtype)
            assert torch.equal(r["dbias"].cpu(), torch.zeros(8, dtype=torch.bfloat16)), (name, out_dtype)
            if out_dtype == E4M3:
                assert r["scale_inv"].item() == 0.5


# ---- CPU: the core ops directly (dbias for gated kinds, bad input) --------------------------


def run_core(name, grad, x, out_dtype, rowwise=True, columnwise=True, with_dbias=True, scale=2.0, amax=0.0):
    """One te_dbias_cast_transpose (name None) or te_dact_dbias_cast_transpose call on freshly
    poisoned outputs (FP8 bytes 0xAB, floats NaN, workspace NaN). out_dtype: an FP8 DType or a
    torch float dtype. Returns a dict of dx, dx_t, dbias, amax, scale_inv (None where absent)."""
    like = x if name is not None else grad
    dev = like.device
    fp8 = isinstance(out_dtype, DType)
    rows, cols = math.prod(like.shape[:-1]), like.shape[-1]
    r = {"dx": None, "dx_t": None, "dbias": None, "amax": None, "scale_inv": None}
    if fp8:
        if rowwise:
            r["dx"] = torch.full(like.shape, 0xAB, dtype=torch.uint8, device=dev)
        if columnwise:
            r["dx_t"] = torch.full((cols, rows), 0xAB, dtype=torch.uint8, device=dev)
        scale_t = torch.tensor([scale], device=dev)
        r["amax"] = torch.tensor([amax], device=dev)
        r["scale_inv"] = torch.full((1,), math.nan, device=dev)
        out_desc = _core.Tensor(*describe(like, "like").device, int(out_dtype), list(like.shape),
                                r["dx"].data_ptr() if rowwise else 0, r["dx_t"].data_ptr() if columnwise else 0,
                                scale_t.data_ptr(), r["scale_inv"].data_ptr(), r["amax"].data_ptr(),
                                int(_core.ScalingMode.PER_TENSOR))
    else:
        r["dx"] = torch.full(like.shape, math.nan, dtype=out_dtype, device=dev)
        out_desc = describe(r["dx"], "dx")
    dbias_desc, ws = None, None
    ws_size = _core.dbias_workspace_size(rows, cols, *describe(like, "like").device)
    if with_dbias:
        r["dbias"] = torch.full((cols,), math.nan, dtype=like.dtype, device=dev)
        dbias_desc = describe(r["dbias"], "dbias")
        ws = torch.full((max(ws_size, 1),), 0xFF, dtype=torch.uint8, device=dev)  # NaN floats
    ws_ptr = ws.data_ptr() if ws is not None else 0
    if name is None:
        _core.dbias_cast_transpose(describe(grad, "grad"), out_desc, dbias_desc, ws_ptr, ws_size, stream_of(grad))
    else:
        _core.dact_dbias_cast_transpose(ACT[name], describe(grad, "grad"), describe(x, "x"), out_desc, dbias_desc,
                                        ws_ptr, ws_size, stream_of(x))
    return {k: (v.cpu() if v is not None else None) for k, v in r.items()}


@pytest.mark.parametrize("out_dtype", [torch.float32, E5M2], ids=dtype_id)
@pytest.mark.parametrize("name", GATED)
def test_gated_dbias_core(name, out_dtype, gen):
    x = make_input((7, 48), torch.float16, gen)
    grad = make_input((7, 24), torch.float16, gen)
    r = run_core(name, grad, x, out_dtype)
    ref, err = reference_bwd(name, grad, x)
    if out_dtype == torch.float32:
        assert_within(r["dx"], ref, err, torch.float32, "dx")
    else:
        assert_codes_within(r["dx"], ref, err, 2.0, out_dtype, "dx")
        assert torch.equal(r["dx_t"], r["dx"].t())
    total = ref.sum(0)
    assert r["dbias"].shape == (48,)
    assert_dbias_within(r["dbias"], total, dbias_bound(total, err.sum(0), torch.float16), "dbias [da | db]")


def test_without_dbias_same_dx(gen):
    x = make_input((9, 32), torch.bfloat16, gen)
    grad = make_input((9, 16), torch.bfloat16, gen)
    with_db = run_core("swiglu", grad, x, E4M3)
    without = run_core("swiglu", grad, x, E4M3, with_dbias=False)
    assert without["dbias"] is None
    for k in ("dx", "dx_t", "amax", "scale_inv"):
        assert torch.equal(with_db[k], without[k]), k


def test_helper_errors():
    x = torch.ones(4, 8)
    with pytest.raises(TypeError, match="grad must be float32, float16 or bfloat16"):
        ext.bgrad_quantize(torch.ones(4, 8, dtype=torch.int32), E4M3, torch.ones(1))
    with pytest.raises(ValueError, match="scale"):
        ext.bgrad_quantize(x, E4M3, None)
    with pytest.raises(ValueError, match="at least one of rowwise and columnwise"):
        ext.bgrad_quantize(x, E4M3, torch.ones(1), rowwise=False, columnwise=False)
    with pytest.raises(ValueError, match="at least one dimension"):
        ext.bgrad_quantize(torch.tensor(1.0), E4M3, torch.ones(1))
    with pytest.raises(TypeError, match="fp8_dtype"):
        ext.bgrad_quantize(x, torch.float16, torch.ones(1))
    with pytest.raises(ValueError, match="pass fp8_dtype too"):
        ext.dbias_dgelu(x, x, scale=torch.ones(1))
    with pytest.raises(ValueError, match="grad shape must be"):
        ext.dbias_drelu(torch.ones(4, 4), x)
    with pytest.raises(ValueError, match="grad dtype must equal act_input dtype"):
        ext.dbias_dsilu(torch.ones(4, 8, dtype=torch.float16), x)
    with pytest.raises(ValueError, match="last dim must be even"):
        ext.dswiglu_cast_transpose(torch.ones(4, 3), torch.ones(4, 7), E4M3, torch.ones(1))
    with pytest.raises(ValueError, match="contiguous"):
        ext.dbias_dqgelu(torch.ones(8, 4).t(), torch.ones(8, 4).t())


def test_core_errors():
    g = torch.ones(4, 8)
    q = torch.empty(4, 8, dtype=torch.uint8)
    scale = torch.ones(1)
    out = _core.Tensor(0, 0, int(E4M3), [4, 8], q.data_ptr(), 0, scale.data_ptr(), 0, 0,
                       int(_core.ScalingMode.PER_TENSOR))
    gd = describe(g, "g")
    bad_dbias = torch.empty(9)
    with pytest.raises(ValueError, match=r"te_dbias_cast_transpose: dbias shape must be \[8\]"):
        _core.dbias_cast_transpose(gd, out, describe(bad_dbias, "dbias"))
    with pytest.raises(ValueError, match="te_dact_dbias_cast_transpose: kind must be a te_activation"):
        _core.dact_dbias_cast_transpose(10, gd, gd, out, None)
    float_out = _core.Tensor(0, 0, int(DType.kFloat32), [4, 8], g.data_ptr(), q.data_ptr())
    with pytest.raises(ValueError, match="output.columnwise_data must be null"):
        _core.dact_dbias_cast_transpose(ACT["gelu"], gd, gd, float_out, None)
    # every tensor on the GPU: the workspace is checked before anything is read
    cuda = [_core.Tensor(1, 0, t.dtype, t.shape, 16) for t in (gd, describe(torch.empty(8), "d"))]
    cuda_out = _core.Tensor(1, 0, int(E4M3), [4, 8], 16, 0, 16, 0, 0, int(_core.ScalingMode.PER_TENSOR))
    err = ValueError if _core.built_with_cuda() else NotImplementedError
    # [4, 8]: one block of 128 rows, 8 fp32 partials
    with pytest.raises(err, match="workspace must be at least 32 bytes" if _core.built_with_cuda() else "CUDA"):
        _core.dbias_cast_transpose(cuda[0], cuda_out, cuda[1], 16, 31)


def test_workspace_size():
    assert _core.dbias_workspace_size(1000, 64, int(_core.DeviceType.CPU), 0) == 0
    assert _core.dbias_workspace_size(1000, 64, int(_core.DeviceType.CUDA), 0) == 8 * 64 * 4
    assert _core.dbias_workspace_size(0, 64, int(_core.DeviceType.CUDA), 0) == 0


# ---- CUDA vs the CPU core ------------------------------------------------------------------

# Up to 128 rows (one row block) the kernels write dbias themselves: 1x1, 3x17 and 65x130
# (generic kernel), 128x256 (fast kernel); more rows add partials in a second kernel.
SHAPES = {"1x1": (1, 1), "3x17": (3, 17), "65x130": (65, 130), "128x256": (128, 256), "1000x1000": (1000, 1000),
          "4096x4095": (4096, 4095), "unaligned": (24, 40)}
SMALL_SHAPES = ["1x1", "3x17", "65x130", "128x256", "1000x1000", "unaligned"]


def to_device(t, device, unaligned):
    """t on the device; unaligned: starting one element past an aligned allocation."""
    if not unaligned:
        return t.to(device)
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=device)
    flat[1:] = t.flatten().to(device)
    return flat[1:].view(t.shape)


def gpu_dbias_bound(dx32, dtype):
    """The GPU's dbias against the exact column sums of its own fp32 dx (module docstring)."""
    d = dx32.double()
    total = d.sum(0)
    return total, 32 * U * d.abs().sum(0) + UNIT[dtype] * total.abs() + HALF_MIN_STEP[dtype]


def assert_rounded_match(got, cpu, v_got, v_cpu, what):
    """Results rounded from fp32 (FP8 codes, or bf16 / fp16 bits): equal where the fp32
    values are equal, at most one step apart elsewhere."""
    if got.dtype == torch.uint8:
        og, oc = fp8_ordinal(got), fp8_ordinal(cpu)
    else:
        bits_g, bits_c = got.view(torch.int16).to(torch.int32), cpu.view(torch.int16).to(torch.int32)
        og = torch.where(bits_g < 0, -(bits_g & 0x7FFF), bits_g)
        oc = torch.where(bits_c < 0, -(bits_c & 0x7FFF), bits_c)
    same = v_got.view(torch.int32) == v_cpu.view(torch.int32)
    diff = (og - oc).abs()
    bad = (same & (diff != 0)) | (diff > 1)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} results differ, first at {bad.nonzero()[0].tolist()} "
        f"(fp32 values differ at {int((~same).sum())} of {same.numel()})"
    )


def check_dact_cuda(name, grad, x, device, unaligned=False, reference=True, fp8_dtype=E4M3):
    """The checks of the module docstring for one kind and input, FP8 (both layouts) and
    float outputs, all with dbias."""
    gd, xd = to_device(grad, device, unaligned), to_device(x, device, unaligned)
    dtype = x.dtype
    cpu32, gpu32 = run_core(name, grad, x, torch.float32), run_core(name, gd, xd, torch.float32)
    if reference:
        ref, err = reference_bwd(name, grad, x)
        assert_within(gpu32["dx"], ref, 2 * err, torch.float32, "fp32 dx")
    total, bound = gpu_dbias_bound(gpu32["dx"], dtype)
    assert_dbias_within(gpu32["dbias"], total, bound, "dbias")
    cpu8, gpu8 = run_core(name, grad, x, fp8_dtype), run_core(name, gd, xd, fp8_dtype)
    assert_rounded_match(gpu8["dx"], cpu8["dx"], gpu32["dx"], cpu32["dx"], "FP8 dx")
    assert torch.equal(gpu8["dx_t"], gpu8["dx"].reshape(-1, x.shape[-1]).t())
    assert gpu8["amax"].item() == gpu32["dx"].abs().max().item()
    assert gpu8["scale_inv"].item() == 0.5
    # the same fp32 dx summed the same way: dbias does not depend on the output dtype
    assert torch.equal(gpu8["dbias"].view(torch.uint8), gpu32["dbias"].view(torch.uint8))
    if dtype != torch.float32:
        cpu16, gpu16 = run_core(name, grad, x, dtype), run_core(name, gd, xd, dtype)
        assert_rounded_match(gpu16["dx"], cpu16["dx"], gpu32["dx"], cpu32["dx"], f"{dtype} dx")
        assert torch.equal(gpu16["dbias"].view(torch.uint8), gpu32["dbias"].view(torch.uint8))
    # one layout at a time writes the same bytes
    rows_only = run_core(name, gd, xd, fp8_dtype, columnwise=False, with_dbias=False)
    cols_only = run_core(name, gd, xd, fp8_dtype, rowwise=False, with_dbias=False)
    assert rows_only["dx_t"] is None and cols_only["dx"] is None
    assert torch.equal(rows_only["dx"], gpu8["dx"]) and torch.equal(cols_only["dx_t"], gpu8["dx_t"])


def act_inputs(name, rows, h, dtype, gen):
    x = make_input((rows, 2 * h if KINDS[name][1] else h), dtype, gen)
    return make_input((rows, h), dtype, gen), x


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape_id", SMALL_SHAPES)
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_dact_dbias_cuda(name, fp8_dtype, shape_id, device, gen):
    grad, x = act_inputs(name, *SHAPES[shape_id], torch.bfloat16, gen)
    check_dact_cuda(name, grad, x, device, unaligned=shape_id == "unaligned", fp8_dtype=fp8_dtype)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape_id", ["65x130", "128x256", "1000x1000"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_dact_dbias_cuda_dtypes(name, dtype, shape_id, device, gen):
    """fp32 and fp16 inputs, every activation (each its own tile kernel; fp32's gated ones
    stage 192 KiB): element by element (65 x 130), the fast kernel writing dbias itself
    (128 x 256, one row block) and through partials and the finalize (1000 x 1000)."""
    grad, x = act_inputs(name, *SHAPES[shape_id], dtype, gen)
    check_dact_cuda(name, grad, x, device, fp8_dtype=E5M2)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_dact_dbias_cuda_4096x4095(name, device, gen):
    grad, x = act_inputs(name, *SHAPES["4096x4095"], torch.bfloat16, gen)
    check_dact_cuda(name, grad, x, device, reference=False)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("name", ["gelu", "swiglu"])
def test_dact_dbias_cuda_large(name, device, gen):
    grad, x = act_inputs(name, 16384, 1024, torch.bfloat16, gen)  # 128 row blocks to add up
    check_dact_cuda(name, grad, x, device, reference=False, fp8_dtype=E5M2)


def check_bgrad_cuda(grad, device, fp8_dtype, unaligned=False):
    gd = to_device(grad, device, unaligned)
    cpu, gpu = run_core(None, grad, None, fp8_dtype, scale=3.0), run_core(None, gd, None, fp8_dtype, scale=3.0)
    for k in ("dx", "dx_t", "amax", "scale_inv"):
        assert torch.equal(gpu[k], cpu[k]), k  # a cast: bit for bit
    g2 = grad.reshape(-1, grad.shape[-1])
    total, bound = gpu_dbias_bound(g2.float(), grad.dtype)
    assert_dbias_within(gpu["dbias"], total, bound, "dbias")
    rows_only = run_core(None, gd, None, fp8_dtype, columnwise=False, scale=3.0)
    cols_only = run_core(None, gd, None, fp8_dtype, rowwise=False, scale=3.0)
    assert torch.equal(rows_only["dx"], cpu["dx"]) and torch.equal(cols_only["dx_t"], cpu["dx_t"])
    assert torch.equal(rows_only["dbias"], gpu["dbias"]) and torch.equal(cols_only["dbias"], gpu["dbias"])


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_bgrad_quantize_cuda(dtype, fp8_dtype, shape_id, device, gen):
    grad = make_input(SHAPES[shape_id], dtype, gen)
    check_bgrad_cuda(grad, device, fp8_dtype, unaligned=shape_id == "unaligned")


@pytest.mark.parametrize("device", CUDA)
def test_bgrad_quantize_cuda_large(device, gen):
    check_bgrad_cuda(make_input((8192, 8192), torch.bfloat16, gen), device, E5M2)


@pytest.mark.parametrize("device", CUDA)
def test_dbias_cuda_back_to_back(device, gen):
    """Bias-gradient casts queued one after another with no wait between them: each
    call's finalize (a dependent launch, started before its tile kernel ends) must add
    the partials of its own call, in a workspace the next call reuses. Every dbias equals
    that of the same call run alone, bit for bit."""
    scale = torch.tensor([2.0], device=device)
    calls = [tuple(make_input((1000, 256), torch.bfloat16, gen).to(device) for _ in range(2)) for _ in range(4)]

    def run(grad, x):
        return ext.bgrad_quantize(grad, E5M2, scale)[0], ext.dbias_dgelu(grad, x, fp8_dtype=E4M3, scale=scale)[0]

    alone = []
    for grad, x in calls:
        alone.append(run(grad, x))
        torch.cuda.synchronize()
    queued = [run(grad, x) for grad, x in calls]
    torch.cuda.synchronize()
    for one, other in zip(alone, queued):
        assert all(torch.equal(a, b) for a, b in zip(one, other))


@pytest.mark.parametrize("device", CUDA)
def test_helpers_cuda(device, gen):
    """The torch helpers on CUDA tensors: the same results as on the CPU."""
    x = make_input((96, 64), torch.bfloat16, gen)
    grad = make_input((96, 64), torch.bfloat16, gen)
    scale = torch.tensor([2.0])
    dbias_c, dx_c = ext.dbias_dgelu(grad, x, fp8_dtype=E4M3, scale=scale)
    dbias_g, dx_g = ext.dbias_dgelu(grad.to(device), x.to(device), fp8_dtype=E4M3, scale=scale.to(device))
    _, y_c = ext.dbias_dgelu(grad, x, fp8_dtype=None)
    y_c32 = run_core("gelu", grad, x, torch.float32)["dx"]
    y_g32 = run_core("gelu", grad.to(device), x.to(device), torch.float32)["dx"]
    assert_rounded_match(dx_g._data.cpu(), dx_c._data, y_g32, y_c32, "dbias_dgelu dx")
    assert torch.equal(dx_g._transpose.cpu(), dx_g._data.cpu().t())
    assert dbias_g.device.type == torch.device(device).type and dbias_g.dtype == torch.bfloat16
    torch.testing.assert_close(dbias_g.cpu(), dbias_c, rtol=2**-7, atol=1e-3)
    db_g, q_g = ext.bgrad_quantize(grad.to(device), E5M2, scale.to(device))
    db_c, q_c = ext.bgrad_quantize(grad, E5M2, scale)
    assert torch.equal(q_g._data.cpu(), q_c._data) and torch.equal(q_g._transpose.cpu(), q_c._transpose)
    torch.testing.assert_close(db_g.cpu(), db_c, rtol=2**-7, atol=1e-3)
    out = ext.dswiglu_cast_transpose(grad[:, :32].contiguous().to(device), x.to(device), E4M3, scale.to(device))
    assert out._data.shape == (96, 64) and out._transpose.shape == (64, 96)


# ---- float32 dbias from bf16 gradients (an fp32 bias under torch.autocast) ----------------
#
# The core sums in fp32 and rounds once to dbias's dtype: a float32 dbias holds those sums
# unrounded, and rounded to bf16 equals the bf16 dbias bit for bit, on both devices and on
# every path (one block of rows writing dbias itself, the finalize over row blocks, the
# one-block current-scaling cast, the element-wise kernel of odd widths).

DBIAS_SHAPES = {"one_block": (64, 64), "row_blocks": (300, 256), "small_current": (32, 128), "odd": (130, 24)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["delayed", "current", "dgelu"])
@pytest.mark.parametrize("shape", list(DBIAS_SHAPES))
def test_float32_dbias_is_the_unrounded_sum(device, op, shape, gen):
    rows, cols = DBIAS_SHAPES[shape]
    dy = (torch.randn(rows, cols, generator=gen) * 3 + 1.0 / 3).to(torch.bfloat16).to(device)
    x = torch.randn(rows, cols, generator=gen).to(torch.bfloat16).to(device)
    dev = module_ops.core_device(dy)
    results = []
    for wanted in (torch.float32, None):
        state = torch.tensor([2.0, 0.0], device=device)  # scale, amax
        if op == "delayed":
            dbias, q = module_ops.dbias_quantize(dy, E5M2, state.data_ptr(), state.data_ptr() + 4, True, True, dev,
                                                 wanted)
        elif op == "current":
            dbias, q = module_ops.dbias_quantize_current_scaling(dy, E5M2, 0.0, False, True, True, dev, wanted)
        else:
            fp8 = module_ops.Fp8Output(E5M2, state.data_ptr(), state.data_ptr() + 4, True)
            dbias, q = module_ops.dact_dbias_quantize(int(_core.Activation.GELU), dy, x, fp8, True, dev, wanted)
        results.append((dbias, q))
    (d32, q32), (d16, q16) = results
    assert d32.dtype == torch.float32 and d16.dtype == torch.bfloat16
    assert torch.equal(d32.bfloat16(), d16)
    assert not torch.equal(d32, d16.float()), "the float32 dbias holds bf16 values only"
    assert torch.equal(q32._data, q16._data) and torch.equal(q32._transpose, q16._transpose)
