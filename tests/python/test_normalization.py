"""layernorm_fwd / layernorm_bwd / rmsnorm_fwd / rmsnorm_bwd against float64 references:
torch.nn.functional.layer_norm / rms_norm and torch.autograd, in float64 on the very
values the core reads (inputs stored in their dtypes first).

CPU: the core computes in fp32, so each element gets a bound derived from how it is
computed (the analysis of tests/cpp/test_norm.cpp; see ``fwd_bound`` / ``bwd_bounds``).
FP8 outputs: every code must be the cast of a value within the bound, and nearly all
must equal the cast of the reference; scale_inv must be exact; on inputs built so that
every step is exact, the codes and amax too.

CUDA: DESIGN.md's rule against the float64 reference,
    max|ours - ref| <= K * max|torch - ref| + atol
where torch does the same computation in fp32 on the GPU (rounded to the output dtype),
and agreement with the CPU core within the same budget plus the CPU's own error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import requires_cuda

from fp8_reference import FP8_MAX, FP8_MIN_SUBNORMAL, FLOAT_DTYPES, TORCH_FP8, dtype_id, ref_quantize
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import (
    DType,
    layernorm_bwd,
    layernorm_fwd,
    rmsnorm_bwd,
    rmsnorm_fwd,
)
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of
from transformer_engine.pytorch.tensor import Float8TensorBase

# The CUDA tests run on this device parameter. The kernels arrive with issue 4's CUDA
# step, which deletes the line that appends the skip.
CUDA_MARKS = [requires_cuda]
CUDA = [pytest.param("cuda", marks=CUDA_MARKS)]

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2
NORMS = ["layernorm", "rmsnorm"]
U = 2.0**-24  # fp32's unit roundoff
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
HALF_MIN_STEP = {torch.float32: 2.0**-150, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134}
HIDDEN = [64, 127, 768, 1000, 4096]
ROWS = [1, 3, 37]
# weights in another dtype than the input (fp32 master weights with half activations,
# and the other way round)
OTHER = {torch.float32: torch.bfloat16, torch.bfloat16: torch.float32, torch.float16: torch.float32}


def f32(v: float) -> float:
    return float(np.float32(v))


# ---- data and the float64 reference ------------------------------------------------------


def make_inputs(lead, hidden, x_dtype, w_dtype, zero_centered, gen):
    """x [*lead, hidden]: rows of random offset and spread (offset_r + spread_r * N(0, 1));
    weight near 1 (near 0 when zero-centered), bias N(0, 1); stored in their dtypes."""
    rows = math.prod(lead)
    offset = torch.rand(rows, 1, generator=gen) * 6 - 3
    spread = torch.exp2(torch.rand(rows, 1, generator=gen) * 6 - 3)
    x = (offset + spread * torch.randn(rows, hidden, generator=gen)).reshape(*lead, hidden).to(x_dtype)
    w = ((0.0 if zero_centered else 1.0) + 0.5 * torch.randn(hidden, generator=gen)).to(w_dtype)
    b = torch.randn(hidden, generator=gen).to(w_dtype)
    return x, w, b


def reference_fwd(norm, x, w, b, eps, zero_centered):
    """float64 y [rows, hidden] from torch.nn.functional, the statistics [rows], and the
    bound on |core's fp32 y - y| (before the output's rounding)."""
    hidden = x.shape[-1]
    eps = f32(eps)  # what the core adds
    x64 = x.double().reshape(-1, hidden)
    g = w.double() + (1.0 if zero_centered else 0.0)
    c_n = 2 * (hidden + 8) * U  # fp32 sums of n terms: (n - 1) u sum|terms|, doubled for the roundings around
    if norm == "layernorm":
        y = F.layer_norm(x64, (hidden,), g, b.double(), eps)
        mu = x64.mean(-1)
        var = ((x64 - mu[:, None]) ** 2).mean(-1)
        e_mu = c_n * x64.abs().mean(-1)
        bias = b.double()
    else:
        y = F.rms_norm(x64, (hidden,), g, eps)
        mu = torch.zeros(x64.shape[0], dtype=torch.float64)
        var = (x64**2).mean(-1)
        e_mu = torch.zeros_like(mu)
        bias = torch.zeros(hidden, dtype=torch.float64)
    v = var + eps
    rs = v.rsqrt()
    e_rs = 0.5 * (e_mu**2 + c_n * (var + e_mu**2) + U * v) / v + 3 * U  # relative
    xhat = (x64 - mu[:, None]) * rs[:, None]
    err = 1.01 * (g.abs() * (rs[:, None] * e_mu[:, None] + xhat.abs() * (e_rs[:, None] + 2 * U))
                  + 3 * U * (g * xhat).abs() + U * bias.abs())
    return y, mu, rs, dict(err=err, e_mu=e_mu, e_rs=e_rs)


def with_rounding(ref, err, dtype):
    """Bound on |result - ref| once a value within ``err`` of ``ref`` is rounded to ``dtype``."""
    return err + UNIT[dtype] * (ref.abs() + err) + HALF_MIN_STEP[dtype]


def assert_within(got, ref, allowed, name):
    got = got.double().reshape(ref.shape)
    bad = ~((got - ref).abs() <= allowed)  # NaN counts as bad
    if bad.any():
        i = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements off; first at {i}: got "
                             f"{got[i].item()!r}, expected {ref[i].item()!r} +- {allowed[i].item():.3g}")


def fp8_ordinal(bits):
    """FP8 codes ordered as their values: -127 ... -0 = +0 ... 127 (NaN excluded)."""
    b = bits.to(torch.int32)
    return torch.where(b >= 0x80, -(b & 0x7F), b & 0x7F)


def fp8_cast_ordinal(v, fp8_dtype):
    fmax = FP8_MAX[fp8_dtype]
    return fp8_ordinal(torch.clamp(v, -fmax, fmax).float().to(TORCH_FP8[fp8_dtype]).view(torch.uint8))


def check_fp8_codes(bits, y, err, scale: float, fp8_dtype, name):
    """Each code is the cast of (some value within ``err`` of y) * scale, the fp32 product
    rounded (and the float64 -> fp32 step of torch's cast: 2u of widening). Returns how many
    differ from the cast of y * scale.

    Not "at most one FP8 step from the cast of y * scale": where x is close to mu, fp32's
    error in x - mu is absolute and can span many of FP8's small steps near zero."""
    lo, hi = (y - err) * scale, (y + err) * scale
    o_lo = fp8_cast_ordinal(lo - lo.abs() * 2 * U, fp8_dtype)
    o_hi = fp8_cast_ordinal(hi + hi.abs() * 2 * U, fp8_dtype)
    o_ref = fp8_cast_ordinal(y * scale, fp8_dtype)
    o = fp8_ordinal(bits.reshape(y.shape))
    bad = (o < o_lo) | (o > o_hi)
    if bad.any():
        i = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} FP8 codes off; first at {i}: code ordinal {int(o[i])}, "
                             f"allowed [{int(o_lo[i])}, {int(o_hi[i])}], cast of the reference {int(o_ref[i])} "
                             f"(y * scale = {float(y[i]) * scale!r})")
    return int((o != o_ref).sum())


def run_fwd(norm, x, w, b, eps, zero_centered, **kw):
    if norm == "layernorm":
        return layernorm_fwd(x, w, b, eps, zero_centered, **kw)
    out, mu, rsigma = rmsnorm_fwd(x, w, eps, zero_centered, **kw)
    assert mu is None  # Transformer Engine's (out, None, rsigma)
    return out, mu, rsigma


def core_fwd(norm, x_desc, w, b, out_desc, mu_desc, rsigma_desc, rows, hidden, device, stream):
    """The core's forward on descriptors the caller built (eps 1e-5, gamma as given), with
    te_norm_workspace_size's scratch; mu_desc is not read for RMSNorm."""
    size = _core.norm_workspace_size(rows, hidden, *x_desc.device)
    ws = torch.empty(size, dtype=torch.uint8, device=device) if size else None
    ws_ptr, ws_size = (ws.data_ptr(), ws.numel()) if ws is not None else (0, 0)
    if norm == "layernorm":
        _core.layernorm_fwd(x_desc, describe(w, "weight"), describe(b, "bias"), 1e-5, False, out_desc, mu_desc,
                            rsigma_desc, ws_ptr, ws_size, stream)
    else:
        _core.rmsnorm_fwd(x_desc, describe(w, "weight"), 1e-5, False, out_desc, rsigma_desc, ws_ptr, ws_size, stream)


def run_bwd(norm, dz, x, mu, rsigma, w, zero_centered):
    if norm == "layernorm":
        return layernorm_bwd(dz, x, mu, rsigma, w, zero_centered)
    dx, dgamma = rmsnorm_bwd(dz, x, rsigma, w, zero_centered)
    return dx, dgamma, None


def check_fwd_cpu(norm, x, w, b, eps, zero_centered, out_dtype=None):
    """Runs the forward on the CPU and checks y, mu and rsigma against the bounds."""
    out, mu, rsigma = run_fwd(norm, x, w, b, eps, zero_centered, out_dtype=out_dtype)
    y, mu_ref, rs_ref, bnd = reference_fwd(norm, x, w, b, eps, zero_centered)
    out_dtype = out_dtype or x.dtype
    rows = y.shape[0]
    assert out.dtype == out_dtype and out.shape == x.shape
    assert rsigma.dtype == torch.float32 and rsigma.shape == (rows,)
    assert_within(out, y, with_rounding(y, bnd["err"], out_dtype), "y")
    assert_within(rsigma, rs_ref, bnd["e_rs"] * rs_ref, "rsigma")
    if norm == "layernorm":
        assert mu.dtype == torch.float32 and mu.shape == (rows,)
        assert_within(mu, mu_ref, bnd["e_mu"], "mu")
    return out, mu, rsigma


# ---- forward, CPU ----------------------------------------------------------------------------


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd(norm, x_dtype, hidden, rows, gen):
    x, w, b = make_inputs((rows,), hidden, x_dtype, OTHER[x_dtype], False, gen)
    check_fwd_cpu(norm, x, w, b, 1e-5, False)


@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_hidden_16384(norm, x_dtype, gen):
    x, w, b = make_inputs((2,), 16384, x_dtype, torch.float32, False, gen)
    check_fwd_cpu(norm, x, w, b, 1e-5, False)


@pytest.mark.parametrize("w_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_dtype_pairs(norm, x_dtype, w_dtype, gen):
    x, w, b = make_inputs((5,), 200, x_dtype, w_dtype, False, gen)
    check_fwd_cpu(norm, x, w, b, 1e-5, False)


@pytest.mark.parametrize("out_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_out_dtype(norm, out_dtype, gen):
    x, w, b = make_inputs((4,), 96, torch.bfloat16, torch.float32, False, gen)
    check_fwd_cpu(norm, x, w, b, 1e-5, False, out_dtype=out_dtype)


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-6, 1e-3, 1.0])
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered_gamma"])
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_eps_zero_centered(norm, zero_centered, eps, gen):
    x, w, b = make_inputs((7,), 127, torch.bfloat16, torch.float32, zero_centered, gen)
    check_fwd_cpu(norm, x, w, b, eps, zero_centered)


@pytest.mark.parametrize("norm", NORMS)
def test_fwd_leading_dims(norm, gen):
    """[batch, seq, hidden]: normalized over the last dim, statistics [batch * seq]."""
    x, w, b = make_inputs((2, 3, 5), 64, torch.float16, torch.float16, True, gen)
    out, mu, rsigma = check_fwd_cpu(norm, x, w, b, 1e-5, True)
    assert out.shape == (2, 3, 5, 64) and rsigma.shape == (30,)


@pytest.mark.parametrize("norm", NORMS)
def test_fwd_zero_rows(norm):
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    out, mu, rsigma = run_fwd(norm, x, torch.ones(64), torch.zeros(64), 1e-5, False)
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16 and rsigma.shape == (0,)
    scale, amax = torch.tensor([4.0]), torch.tensor([2.5])
    out, _, _ = run_fwd(norm, x, torch.ones(64), torch.zeros(64), 1e-5, False, fp8_dtype=E4M3, scale=scale,
                        amax=amax, columnwise=True)
    assert out._data.shape == (0, 64) and out._transpose.shape == (64, 0)
    assert amax.item() == 2.5 and out._scale_inv.item() == 0.25


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("hidden", [64, 4096, 16384, 16392], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_zero_rows_cuda(norm, hidden, columnwise, device):
    """No rows on the GPU through the wrappers (x's and y's pointers are then null): a float
    y and the statistics come back empty; an FP8 y, with or without its transposed copy,
    gets only its scale_inv written, amax left as it was."""
    x = torch.empty(0, hidden, dtype=torch.bfloat16, device=device)
    w, b = torch.ones(hidden, device=device), torch.zeros(hidden, device=device)
    out, _, rsigma = run_fwd(norm, x, w, b, 1e-5, False)
    assert out.shape == (0, hidden) and rsigma.shape == (0,)
    scale, amax = torch.tensor([4.0], device=device), torch.tensor([2.5], device=device)
    out, _, _ = run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=scale, amax=amax, columnwise=columnwise)
    assert out._data.shape == (0, hidden)
    assert amax.item() == 2.5 and out._scale_inv.item() == 0.25


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("hidden", [64, 4096, 16384, 16392], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_zero_rows_in_allocations(norm, hidden, columnwise, device):
    """No rows, but every pointer into an allocation, as a C API caller may pass zero-row
    views (the Python wrappers' empty tensors have null pointers, so a kernel given
    something to write through at no rows is reached only this way): nothing is written
    but the FP8 y's scale_inv; x's, y's and the statistics' buffers keep their bytes and
    amax its value."""
    x = torch.full((1, hidden), 3.0, dtype=torch.bfloat16, device=device)
    w, b = torch.ones(hidden, device=device), torch.zeros(hidden, device=device)
    data = torch.full((hidden,), 0xA5, dtype=torch.uint8, device=device)
    data_t = torch.full((hidden,), 0xA5, dtype=torch.uint8, device=device)
    mu, rsigma = torch.full((1,), 7.0, device=device), torch.full((1,), 7.0, device=device)
    scale, scale_inv = torch.tensor([4.0], device=device), torch.zeros(1, device=device)
    amax = torch.tensor([2.5], device=device)
    x_desc = _core.Tensor(*describe(x, "inp").device, int(DType.kBFloat16), [0, hidden], x.data_ptr())
    out_desc = _core.Tensor(*x_desc.device, int(E4M3), [0, hidden], data.data_ptr(),
                            data_t.data_ptr() if columnwise else 0, scale.data_ptr(), scale_inv.data_ptr(),
                            amax.data_ptr(), int(_core.ScalingMode.PER_TENSOR))
    mu_desc = _core.Tensor(*x_desc.device, int(DType.kFloat32), [0], mu.data_ptr())
    rsigma_desc = _core.Tensor(*x_desc.device, int(DType.kFloat32), [0], rsigma.data_ptr())
    core_fwd(norm, x_desc, w, b, out_desc, mu_desc, rsigma_desc, 0, hidden, device, stream_of(x))
    assert scale_inv.item() == 0.25 and amax.item() == 2.5
    assert bool((data == 0xA5).all()) and bool((data_t == 0xA5).all())
    assert mu.item() == 7.0 and rsigma.item() == 7.0 and bool((x == 3.0).all())


# ---- fused norm + FP8 cast, CPU ----------------------------------------------------------------


@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8(norm, x_dtype, fp8_dtype, columnwise, gen):
    x, w, b = make_inputs((37,), 1000, x_dtype, torch.float32, norm == "layernorm", gen)
    zc = norm == "layernorm"
    y, _, _, bnd = reference_fwd(norm, x, w, b, 1e-5, zc)
    # the largest value lands at 0.77 of FP8's max; the scale is not a power of two
    scale = f32(FP8_MAX[fp8_dtype] / float(y.abs().max()) * 0.77)
    amax = torch.tensor([1e-3])
    out, mu, rsigma = run_fwd(norm, x, w, b, 1e-5, zc, fp8_dtype=fp8_dtype, scale=torch.tensor([scale]), amax=amax,
                              columnwise=columnwise)
    assert isinstance(out, Float8TensorBase) and out._fp8_dtype == fp8_dtype and out.size() == x.shape
    assert out._data.dtype == torch.uint8
    differing = check_fp8_codes(out._data, y, bnd["err"], scale, fp8_dtype, "rowwise")
    # fp32's error (about 1e-6 of |y|) moves only codes that close to a rounding midpoint
    assert differing <= y.numel() // 1000, f"{differing} of {y.numel()} codes differ from the cast of the reference"
    if columnwise:
        assert out._transpose.shape == (1000, 37)
        assert torch.equal(out._transpose, out._data.t())
    else:
        assert out._transpose is None
    assert out._scale_inv.item() == f32(1.0 / scale)
    assert abs(amax.item() - float(y.abs().max())) <= float(bnd["err"].max())


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_saturates_and_underflows(norm, fp8_dtype, gen):
    """Scales that push most of the output past FP8's max (saturated, never NaN) or
    below half its smallest subnormal (zeros)."""
    x, w, b = make_inputs((3,), 127, torch.bfloat16, torch.bfloat16, False, gen)
    y, _, _, bnd = reference_fwd(norm, x, w, b, 1e-5, False)
    median = float(y.abs().median())
    saturating = f32(2 * FP8_MAX[fp8_dtype] / median)  # everything above half the median |y| saturates
    underflowing = f32(FP8_MIN_SUBNORMAL[fp8_dtype] / (4 * median))  # half of y below a quarter step
    for scale in (saturating, underflowing):
        out, _, _ = run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=fp8_dtype, scale=torch.tensor([scale]))
        check_fp8_codes(out._data, y, bnd["err"], scale, fp8_dtype, f"scale {scale}")
        values = out._data.view(TORCH_FP8[fp8_dtype]).float()
        assert not values.isnan().any()
        if scale == saturating:
            assert (values.abs() == FP8_MAX[fp8_dtype]).sum() > y.numel() // 2
        else:
            assert (values == 0).sum() >= y.numel() // 2


@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered_gamma"])
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_exact(norm, zero_centered, fp8_dtype):
    """Rows m +- 2 (mean m, variance 4, rsigma 1/2 with eps = 0): y = +-g + beta exactly,
    so every code, amax and scale_inv must be exact."""
    rows, hidden = 4, 66
    means = torch.tensor([0.0, 3.0, -1.5, 100.0]) if norm == "layernorm" else torch.zeros(4)
    signs = torch.where((torch.arange(hidden)[None, :] + torch.arange(rows)[:, None]) % 2 == 1, 2.0, -2.0)
    x = means[:, None] + signs
    c = torch.arange(hidden, dtype=torch.float32)
    w = 0.25 * (c % 9) - 1.0
    b = 0.125 * (c % 5) - 0.25
    g = w + (1.0 if zero_centered else 0.0)
    y = signs / 2 * g  # exact in fp32; -0 where g = 0, as the core's x * rsigma * g
    if norm == "layernorm":
        y = y + b
    scale = 37.0  # not a power of two: y * scale rounds
    amax = torch.zeros(1)
    out, mu, rsigma = run_fwd(norm, x, w, b, 0.0, zero_centered, fp8_dtype=fp8_dtype, scale=torch.tensor([scale]),
                              amax=amax, columnwise=True)
    assert torch.equal(out._data, ref_quantize(y, fp8_dtype, scale))
    assert torch.equal(out._transpose, out._data.t())
    assert amax.item() == float(y.abs().max())
    assert out._scale_inv.item() == f32(1.0 / 37.0)
    assert torch.equal(rsigma, torch.full((rows,), 0.5))
    if norm == "layernorm":
        assert torch.equal(mu, means)


@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_amax_accumulates(norm, gen):
    """amax = max(amax, max|y|): a larger amax stays, a smaller one is raised."""
    x, w, b = make_inputs((3,), 64, torch.float32, torch.float32, False, gen)
    y, *_ = reference_fwd(norm, x, w, b, 1e-5, False)
    big = torch.tensor([1e6])
    run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=torch.ones(1), amax=big)
    assert big.item() == 1e6
    small = torch.tensor([1e-6])
    run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=torch.ones(1), amax=small)
    assert small.item() == pytest.approx(float(y.abs().max()), rel=1e-4)


# ---- backward, CPU ----------------------------------------------------------------------------


def reference_bwd(norm, dz, x, w, b, eps, zero_centered):
    """float64 autograd gradients (dx [rows, hidden], dgamma, dbeta), the statistics as a
    forward saves them (fp32), and the bounds on the core's error."""
    hidden = x.shape[-1]
    x64 = x.double().reshape(-1, hidden).requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = b.double().requires_grad_()
    dz64 = dz.double().reshape(-1, hidden)
    g = w64 + (1.0 if zero_centered else 0.0)
    if norm == "layernorm":
        y = F.layer_norm(x64, (hidden,), g, b64, f32(eps))
    else:
        y = F.rms_norm(x64, (hidden,), g, f32(eps))
    y.backward(dz64)
    _, mu, rs, _ = reference_fwd(norm, x, w, b, eps, zero_centered)
    mu32, rs32 = mu.float(), rs.float()

    # Bounds: fp32 arithmetic as in the forward (6u per elementwise chain, c_n per sum of
    # n terms), plus the statistics rounded to fp32 (|d mu| <= u|mu|, d rsigma <= u rsigma).
    rows = x64.shape[0]
    c_n, c_rows = 2 * (hidden + 8) * U, 2 * (rows + 8) * U
    gd = g.detach()
    xhat = (x64.detach() - mu[:, None]) * rs[:, None]
    dyg = dz64 * gd
    mean_dyg = dyg.mean(-1, keepdim=True)
    mdyg = mean_dyg if norm == "layernorm" else torch.zeros_like(mean_dyg)
    m2 = (dyg * xhat).mean(-1, keepdim=True)
    r, m = rs[:, None], mu[:, None].abs()
    dx_err = 1.01 * r * (8 * U * (dyg.abs() + mdyg.abs()) + 10 * U * (xhat * m2).abs()
                         + c_n * ((dyg.abs().mean(-1, keepdim=True) if norm == "layernorm" else 0.0)
                                  + xhat.abs() * (dyg * xhat).abs().mean(-1, keepdim=True))
                         + r * U * m * (m2.abs() + xhat.abs() * mean_dyg.abs()))
    dg_err = 1.01 * ((c_rows + 5 * U) * (dz64 * xhat).abs().sum(0) + U * (dz64.abs() * r * m).sum(0))
    db_err = c_rows * dz64.abs().sum(0)
    grads = (x64.grad, w64.grad, b64.grad if norm == "layernorm" else None)
    return grads, (mu32 if norm == "layernorm" else None, rs32), (dx_err, dg_err, db_err)


def check_bwd_cpu(norm, lead, hidden, x_dtype, w_dtype, zero_centered, gen):
    x, w, b = make_inputs(lead, hidden, x_dtype, w_dtype, zero_centered, gen)
    dz = (2 * torch.randn(x.shape, generator=gen)).to(x_dtype)
    (dx_ref, dg_ref, db_ref), (mu, rs), (dx_err, dg_err, db_err) = reference_bwd(norm, dz, x, w, b, 1e-5,
                                                                                 zero_centered)
    dx, dgamma, dbeta = run_bwd(norm, dz, x, mu, rs, w, zero_centered)
    assert dx.dtype == x_dtype and dx.shape == x.shape
    assert dgamma.dtype == w_dtype and dgamma.shape == w.shape
    assert_within(dx, dx_ref, with_rounding(dx_ref, dx_err, x_dtype), "dx")
    assert_within(dgamma, dg_ref, with_rounding(dg_ref, dg_err, w_dtype), "dgamma")
    if norm == "layernorm":
        assert dbeta.dtype == w_dtype and dbeta.shape == w.shape
        assert_within(dbeta, db_ref, with_rounding(db_ref, db_err, w_dtype), "dbeta")
    else:
        assert dbeta is None


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd(norm, x_dtype, hidden, rows, gen):
    check_bwd_cpu(norm, (rows,), hidden, x_dtype, OTHER[x_dtype], False, gen)


@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_hidden_16384(norm, x_dtype, gen):
    check_bwd_cpu(norm, (2,), 16384, x_dtype, torch.float32, True, gen)


@pytest.mark.parametrize("w_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_dtype_pairs_zero_centered(norm, x_dtype, w_dtype, gen):
    check_bwd_cpu(norm, (2, 5), 200, x_dtype, w_dtype, True, gen)


@pytest.mark.parametrize("norm", NORMS)
def test_bwd_zero_rows(norm):
    """No rows: dgamma and dbeta are sums of nothing, zeros."""
    x = torch.empty(0, 48, dtype=torch.bfloat16)
    stats = torch.empty(0)
    dx, dgamma, dbeta = run_bwd(norm, x, x, stats, stats, torch.ones(48), False)
    assert dx.shape == (0, 48) and torch.equal(dgamma, torch.zeros(48))
    if norm == "layernorm":
        assert torch.equal(dbeta, torch.zeros(48))


@pytest.mark.parametrize("zero_centered", [False, True], ids=["gamma", "zero_centered_gamma"])
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_then_bwd_matches_autograd(norm, zero_centered, gen):
    """A training step's use: the forward's own statistics feed the backward; fp32
    throughout, compared with torch's fp32 autograd of the same module."""
    x, w, b = make_inputs((6, 7), 256, torch.float32, torch.float32, zero_centered, gen)
    dz = torch.randn(x.shape, generator=gen)
    out, mu, rsigma = run_fwd(norm, x, w, b, 1e-5, zero_centered)
    dx, dgamma, dbeta = run_bwd(norm, dz, x, mu, rsigma, w, zero_centered)
    xt, wt, bt = (t.clone().requires_grad_() for t in (x, w, b))
    g = wt + (1.0 if zero_centered else 0.0)
    yt = F.layer_norm(xt, (256,), g, bt, 1e-5) if norm == "layernorm" else F.rms_norm(xt, (256,), g, 1e-5)
    yt.backward(dz)
    torch.testing.assert_close(out, yt.detach(), rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(dx, xt.grad, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(dgamma, wt.grad, rtol=2e-5, atol=1e-4)
    if norm == "layernorm":
        torch.testing.assert_close(dbeta, bt.grad, rtol=2e-5, atol=1e-4)


# ---- CUDA: the kernels against the CPU core and the float64 reference ------------------------

# K of the rule: torch and our kernels sum the rows in different orders, so their fp32
# errors differ by small factors; 4 leaves room for that, not for a wrong formula.
K = 4
CUDA_SHAPES = [(1, 64), (37, 127), (3, 768), (333, 1000), (4096, 1024), (8, 4097), (2, 16384), (1024, 8192)]


def maxabs(t) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def check_rule(got, cpu, ref, torch_res, name, unit, err_torch=None):
    """DESIGN.md's rule against the float64 reference, and agreement with the CPU core.
    atol: one ulp of the output at its largest value (values computed in another order
    may round the other way). ``err_torch`` replaces max|torch_res - ref| where torch's
    error is measured on something else (amax: on all of y)."""
    g, c = (v.double().cpu().reshape(ref.shape) for v in (got, cpu))
    assert not torch.isnan(g).any(), f"{name}: NaN in the CUDA result (an element left unwritten?)"
    if err_torch is None:
        err_torch = maxabs(torch_res.double().cpu().reshape(ref.shape) - ref)
    err, err_cpu = maxabs(g - ref), maxabs(c - ref)
    atol = 2 * unit * maxabs(ref) + 1e-30
    assert err <= K * err_torch + atol, f"{name}: error {err:.3g} > {K} x torch's {err_torch:.3g} + {atol:.3g}"
    diff = maxabs(g - c)
    assert diff <= K * err_torch + err_cpu + atol, (
        f"{name}: CUDA and CPU core differ by {diff:.3g} (> {K} x {err_torch:.3g} + {err_cpu:.3g} + {atol:.3g})")


def poison_cache(nbytes: int, device) -> None:
    """Leaves NaN bytes (0xff: NaN in fp32, fp16, bf16 and both FP8 formats) in the caching
    allocator's free blocks, so an output element the kernel leaves unwritten shows."""
    torch.full((nbytes,), 0xFF, dtype=torch.uint8, device=device)


def torch_fwd_fp32(norm, x, w, b, eps, zero_centered):
    """PyTorch's forward in fp32 on the GPU (y fp32, mu, rsigma)."""
    hidden = x.shape[-1]
    x32 = x.float().reshape(-1, hidden)
    g = w.float() + (1.0 if zero_centered else 0.0)
    if norm == "layernorm":
        y, mu, rs = torch.native_layer_norm(x32, (hidden,), g, b.float(), f32(eps))
        return y, mu.reshape(-1), rs.reshape(-1)
    rs = torch.rsqrt((x32 * x32).mean(-1) + f32(eps))
    return x32 * rs[:, None] * g, None, rs


def on_device(t, device, misaligned=False):
    """``t`` copied to ``device``; ``misaligned``: as a view that starts one element past
    an allocation (2 or 4 bytes off 16), which sends the kernels down their element-wise path."""
    if not misaligned:
        return t.to(device)
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=device)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


def with_hard_rows(x):
    """x with rows whose statistics defeat shortcuts: every other row has an outlier in
    column 0 (50 of its spreads off, as an outlier feature of a transformer), the others a
    large offset (1000 plus N(0, 1))."""
    x = x.float().clone()
    spread = x.std(-1, keepdim=True)
    x[0::2, 0] = x[0::2].mean(-1) + 50 * spread[0::2, 0]
    x[1::2] = 1000 + (x[1::2] - x[1::2].mean(-1, keepdim=True)) / spread[1::2]
    return x


def check_fwd_cuda(norm, rows, hidden, x_dtype, w_dtype, zc, device, gen, misaligned=False, out_dtype=None,
                   hard_rows=False, misaligned_weights=False):
    """The forward on ``device`` against the float64 reference, torch's fp32 and the CPU
    core: y (in ``out_dtype``, default x's), mu and rsigma (``misaligned_weights``: gamma and
    beta as on_device's misaligned views)."""
    x, w, b = make_inputs((rows,), hidden, x_dtype, w_dtype, zc, gen)
    if hard_rows:
        x = with_hard_rows(x).to(x_dtype)
    xd = on_device(x, device, misaligned)
    wd, bd = on_device(w, device, misaligned_weights), on_device(b, device, misaligned_weights)
    poison_cache(x.numel() * 4, device)  # after the inputs: the outputs reuse the poisoned block
    got = run_fwd(norm, xd, wd, bd, 1e-5, zc, out_dtype=out_dtype)
    cpu = run_fwd(norm, x, w, b, 1e-5, zc, out_dtype=out_dtype)
    y, mu, rs, _ = reference_fwd(norm, x, w, b, 1e-5, zc)
    base_y, base_mu, base_rs = torch_fwd_fp32(norm, x.to(device), w.to(device), b.to(device), 1e-5, zc)
    out_dtype = out_dtype or x_dtype
    assert got[0].dtype == out_dtype and got[0].shape == x.shape
    check_rule(got[0], cpu[0], y, base_y.to(out_dtype), "y", UNIT[out_dtype])
    check_rule(got[2], cpu[2], rs, base_rs, "rsigma", U)
    if norm == "layernorm":
        check_rule(got[1], cpu[1], mu, base_mu, "mu", U)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda(norm, x_dtype, shape, device, gen):
    rows, hidden = shape
    check_fwd_cuda(norm, rows, hidden, x_dtype, OTHER[x_dtype], rows % 2 == 1, device, gen)


# Hidden sizes around every limit of the kernels' launch shapes (ops/norm/norm_launch.h):
# rows of up to 16 elements a thread on 1, 2, ... 32 lanes (to 512), then on whole warps
# with 32 elements a thread (forward, to 16384) or 16 (backward, to 8192; then 32 with
# its dgamma / dbeta sums in shared memory, to 16384), then the fallback kernels; sizes
# that are not multiples of 8 take the element-wise path; 1536, 3000, 12288 need warp
# counts that are not powers of two. The forward's 16-bit rows take its compact blocks
# (norm_fwd_row_form) at 2049-3072 and 4097-7168, and LayerNorm's also at 8193-9216 and
# 10241-12288: 2056, 4104, 7168, 8193, 9216, 10248 and 12288 there, 7176, 9224 and 10240
# just past. Rows of up to 512 take the small bucket's 256-thread blocks; of those, 16-bit
# vectorized rows that three chunks a thread fill better than two (norm_fwd_row_shape) take
# 24 elements a thread: 24, 40, 96, 192 and 384 (16 lanes) here, 200 and 392 keep two; those of
# 257-320 take 8 lanes of 40 elements: 264, 320; those of 520-640 take half a warp a row, 40
# elements a thread: 520, 576, 640 (648 keeps a warp of 32); those of 1025-1536 a warp a row,
# 40 or 48 elements a thread: 1032, 1152, 1288, 1408, 1536.
BUCKET_HIDDEN = [1, 3, 8, 15, 16, 17, 24, 40, 96, 100, 128, 136, 192, 200, 255, 256, 264, 320, 384, 392, 511, 512,
                 513, 520, 576, 640, 648, 1000, 1023, 1024, 1025, 1032, 1152, 1288, 1408, 1536, 2048, 2056, 3000,
                 4095, 4096, 4104, 7168, 7176, 8184, 8191, 8192, 8193, 8200, 9216, 9224, 10240, 10248, 12288, 16376,
                 16383, 16384, 16385, 16392]


def bucket_rows(hidden):
    """Rows that are no multiple of the rows a block holds, fewer than a block holds for
    short rows, and at most ~600k elements."""
    return 37 if hidden <= 4104 else 5


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", BUCKET_HIDDEN, ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_buckets(norm, hidden, device, gen):
    check_fwd_cuda(norm, bucket_rows(hidden), hidden, torch.bfloat16, torch.float32, hidden % 2 == 0, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [8, 136, 384, 1024, 1152, 1536, 3000, 16384, 16392, 50000], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_buckets_other_dtypes(norm, x_dtype, hidden, device, gen):
    """fp32 rows load as two 16-byte vectors a chunk; fp16 with fp32 weights (at 384 three
    chunks a thread, at 1152 five on a warp and at 1536 six, fp32 the buckets' two and
    four); past 16384 the fallback kernel, past 49152 with rows too long to keep in
    shared memory between its passes."""
    check_fwd_cuda(norm, 7, hidden, x_dtype, OTHER[x_dtype], True, device, gen)


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("hidden", [64, 127, 384, 1000, 1001, 1024, 1152, 1536, 2560, 4096, 16384, 20000],
                         ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_hard_rows(norm, x_dtype, hidden, device, gen):
    """Rows with an outlier in column 0 or a large offset: y, mu and rsigma stay within a
    few times torch's fp32 error there (a mean summed in fp32 alone was 1000x off it at
    an offset of 1000). The offset rows take the register kernel's second reduction
    (their mu^2 outweighs their variance), the outlier rows next to them do not, in the
    same warp for short rows. On the CPU the core is checked against torch's CPU kernel;
    127 and 1001 take the element-wise kernels, 1152 and 1536 five and six chunks a
    thread, 2560 the compact form, 20000 the fallback kernel."""
    check_fwd_cuda(norm, 30, hidden, x_dtype, torch.float32, False, device, gen, hard_rows=True)


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("hidden", [64, 1000, 4096, 20000], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_nan_row_stays_nan(norm, x_dtype, hidden, device, gen):
    """A NaN in a row makes that row's statistics and y NaN (the variance's clamp at 0
    must not turn it into a number), and leaves the other rows as they were."""
    x, w, b = make_inputs((6,), hidden, x_dtype, torch.float32, False, gen)
    x[3, hidden // 2] = float("nan")
    got = run_fwd(norm, x.to(device), w.to(device), b.to(device), 1e-5, False)
    clean = run_fwd(norm, x[[0, 1, 2, 4, 5]].to(device), w.to(device), b.to(device), 1e-5, False)
    assert torch.isnan(got[2][3]) and torch.isnan(got[0][3].float()).all()
    if norm == "layernorm":
        assert torch.isnan(got[1][3])
    others = [0, 1, 2, 4, 5]
    assert torch.equal(got[0][others], clean[0]) and torch.equal(got[2][others], clean[2])


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("rows", [1, 2, 3], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hidden", [16, 64, 1024, 4096], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_fewer_rows_than_a_block(norm, hidden, rows, device, gen):
    """A block holds 256 / (threads a row) rows: most of its row groups have no row."""
    check_fwd_cuda(norm, rows, hidden, torch.bfloat16, torch.bfloat16, False, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("out_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("hidden", [64, 384, 1000, 2560, 4096, 4097], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_views_and_out_dtypes(norm, x_dtype, hidden, misaligned, out_dtype, device, gen):
    """An input view off 16-byte alignment (and hidden 4097) takes the element-wise path,
    which writes the output dtype read at run time; aligned ones the vectorized path with
    each output dtype compiled in (at 384 bf16 rows with a bf16 y take three chunks a
    thread, with another y two)."""
    check_fwd_cuda(norm, 37, hidden, x_dtype, torch.float32, False, device, gen, misaligned=misaligned,
                   out_dtype=out_dtype)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [200, 2560], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("w_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_dtype_pairs(norm, x_dtype, w_dtype, hidden, device, gen):
    """Every input and weight dtype on the GPU (fp16 weights included, which no other CUDA
    test passes): two chunks a thread at 200 (zero-centered gamma), the compact form at 2560."""
    check_fwd_cuda(norm, 5, hidden, x_dtype, w_dtype, hidden == 200, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [1024, 5120, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_weights_off_16_bytes(norm, w_dtype, hidden, device, gen):
    """gamma and beta as views 2 or 4 bytes off 16-byte alignment (a layer's weights inside
    a flat parameter buffer, as FSDP keeps them) with an aligned bf16 x: the element-wise
    path, which reads them a float at a time."""
    check_fwd_cuda(norm, 40, hidden, torch.bfloat16, w_dtype, True, device, gen, misaligned_weights=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", [(300000, 8), (20000, 1024), (2000, 8192)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_cuda_large(norm, shape, device, gen):
    """More rows than a wave of blocks holds: every row group strides over several rows."""
    rows, hidden = shape
    check_fwd_cuda(norm, rows, hidden, torch.bfloat16, torch.float32, True, device, gen)


def check_fwd_fp8_cuda(norm, rows, hidden, x_dtype, fp8_dtype, columnwise, device, gen, misaligned=False):
    """FP8 codes within the CPU bound of the float64 reference (the kernels' fp32 error is
    of the CPU core's size), scale_inv equal to the CPU core's, amax by the rule."""
    x, w, b = make_inputs((rows,), hidden, x_dtype, torch.float32, True, gen)
    y, _, _, bnd = reference_fwd(norm, x, w, b, 1e-5, True)
    scale = f32(FP8_MAX[fp8_dtype] / maxabs(y) * 0.77)
    xd, wd, bd = on_device(x, device, misaligned), w.to(device), b.to(device)
    scale_d, amax_gpu, amax_cpu = torch.tensor([scale], device=device), torch.zeros(1, device=device), torch.zeros(1)
    poison_cache(x.numel(), device)
    got, _, _ = run_fwd(norm, xd, wd, bd, 1e-5, True, fp8_dtype=fp8_dtype, scale=scale_d, amax=amax_gpu,
                        columnwise=columnwise)
    cpu, _, _ = run_fwd(norm, x, w, b, 1e-5, True, fp8_dtype=fp8_dtype, scale=torch.tensor([scale]), amax=amax_cpu,
                        columnwise=columnwise)
    differing = check_fp8_codes(got._data.cpu(), y, bnd["err"], scale, fp8_dtype, "rowwise")
    assert differing <= y.numel() // 1000
    if columnwise:
        assert torch.equal(got._transpose.cpu(), got._data.cpu().t())
    assert got._scale_inv.item() == cpu._scale_inv.item()
    # amax is max|y| of the fp32 y: its error is that of one element of y
    base_y, _, _ = torch_fwd_fp32(norm, x.to(device), w.to(device), b.to(device), 1e-5, True)
    ref_amax = torch.tensor([maxabs(y)], dtype=torch.float64)
    check_rule(amax_gpu, amax_cpu, ref_amax, None, "amax", U, err_torch=maxabs(base_y.double().cpu() - y))


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("shape", [(37, 1000), (4096, 1024), (600, 4096), (200, 2048), (5, 16384)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_cuda(norm, x_dtype, shape, fp8_dtype, columnwise, device, gen):
    """600 x 4096 and 200 x 2048: vectorized rows of four and two warps, two and four row
    groups a block (the row reductions' named barriers, one a group, and the amax folded
    group by group), rows a multiple of 8 (the tiled transpose)."""
    rows, hidden = shape
    check_fwd_fp8_cuda(norm, rows, hidden, x_dtype, fp8_dtype, columnwise, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("fp8_dtype,misaligned", [(E4M3, False), (E4M3, True), (E5M2, False)],
                         ids=["e4m3", "e4m3-misaligned", "e5m2"])
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("hidden", [3, 16, 96, 136, 320, 384, 513, 640, 1152, 1536, 4095, 4104, 8192, 10248, 16385],
                         ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_cuda_buckets(norm, hidden, columnwise, fp8_dtype, misaligned, device, gen):
    """The fused FP8 cast in each bucket (96 and 384: three chunks a thread; 320: five on 8
    lanes; 640: five on half a warp; 1152 and 1536: five and six on a warp), on the vectorized
    (FP8 type compiled in) and the element-wise path (read at run time), and in the fallback
    (16385)."""
    check_fwd_fp8_cuda(norm, 37 if hidden <= 8192 else 5, hidden, torch.bfloat16, fp8_dtype, columnwise, device, gen,
                       misaligned=misaligned)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("columnwise", [False, True], ids=["rowwise", "both"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("shape", [(40, 64), (72, 256), (72, 384), (40, 320), (72, 1152), (72, 1536), (40, 1024),
                                   (40, 2560), (40, 6144)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_cuda_fp16_rows(norm, shape, fp8_dtype, columnwise, device, gen):
    """fp16 rows with an FP8 y, kernels of their own: row-wise, the row forms of two,
    three, five and six chunks a thread, the compact and the wide one (64, 384, 320,
    1152, 1536, 2560, 1024); with both copies, the shared tiles (256, 384, 1024, 6144)
    and the tile read back from the row-wise copy (320, 1152, 1536, 2560)."""
    rows, hidden = shape
    check_fwd_fp8_cuda(norm, rows, hidden, torch.float16, fp8_dtype, columnwise, device, gen)


_BF16, _FP16, _FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize(
    "rows,hidden,x_dtype,out_dtype,misaligned",
    [
        (37, 64, _BF16, None, False),  # vectorized, 16 elements a thread, rows sharing warps
        (37, 384, _BF16, None, False),  # vectorized, 24 elements a thread on 16 lanes
        (37, 1152, _BF16, None, False),  # vectorized, 40 elements a thread, a warp a row
        (600, 4096, _BF16, None, False),  # vectorized, four-warp rows, two groups a block
        (300, 5120, _BF16, None, False),  # a row a block, and a block a row (hidden > 4096)
        (37, 12288, _BF16, None, False),  # twelve-warp rows, a block a row
        (200, 2048, _FP16, None, False),  # two-warp rows, four groups a block
        (64, 1024, _FP32, None, False),  # fp32, a warp a row
        (37, 1000, _BF16, None, False),  # vectorized, the last lanes' chunks past the row
        (37, 1001, _BF16, None, False),  # element-wise (hidden % 8 != 0)
        (37, 1536, _BF16, None, False),  # six chunks a thread
        (37, 2560, _BF16, None, False),  # the compact form
        (37, 64, _FP16, None, False),  # fp16: two chunks, three, five, six, compact
        (37, 384, _FP16, None, False),
        (37, 1152, _FP16, None, False),
        (37, 1536, _FP16, None, False),
        (37, 2560, _FP16, None, False),
        (37, 64, _FP32, None, False),  # fp32, two chunks
        (37, 4096, _BF16, None, True),  # element-wise (misaligned)
        (37, 768, _BF16, _FP32, False),  # y in another dtype than x: element-wise
        (5, 16392, _BF16, None, False),  # rows too long for registers: the fallback kernel
    ],
    ids=["h64", "h384", "h1152", "h4096", "h5120", "h12288", "h2048_fp16", "h1024_fp32", "h1000", "h1001", "h1536",
         "h2560", "h64_fp16", "h384_fp16", "h1152_fp16", "h1536_fp16", "h2560_fp16", "h64_fp32", "h4096_misaligned",
         "bf16_to_fp32", "h16392"],
)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_float_amax(norm, rows, hidden, x_dtype, out_dtype, misaligned, device, gen):
    """A float y with its amax (what a current-scaling cast of y needs; module_ops.FusedAmax):
    max(prior, max|y| over y as stored), a NaN row ignored, exactly; y itself the same bits
    as without the amax. Every kernel path, both devices."""
    x, w, b = make_inputs((rows,), hidden, x_dtype, _FP32, False, gen)
    x[rows // 2, hidden // 3] = float("nan")  # its row comes out NaN
    xd, wd, bd = on_device(x, device, misaligned), w.to(device), b.to(device)
    plain, _, _ = run_fwd(norm, xd, wd, bd, 1e-5, False, out_dtype=out_dtype)
    stored = plain.float().abs()
    largest = float(stored[~stored.isnan()].max())
    for prior in (0.0, 2.0 * largest):
        amax = torch.full((1,), prior, device=device)
        y, _, _ = run_fwd(norm, xd, wd, bd, 1e-5, False, out_dtype=out_dtype, amax=amax)
        assert torch.equal(y.view(torch.uint8), plain.view(torch.uint8))
        assert amax.item() == max(prior, largest)


def torch_bwd_fp32(norm, dz, x, w, b, eps, zero_centered):
    """PyTorch's autograd of the same norm in fp32 on the GPU, rounded to the result dtypes."""
    hidden = x.shape[-1]
    x32 = x.float().reshape(-1, hidden).requires_grad_()
    w32 = w.float().requires_grad_()
    b32 = b.float().requires_grad_()
    g = w32 + (1.0 if zero_centered else 0.0)
    if norm == "layernorm":
        y = F.layer_norm(x32, (hidden,), g, b32, f32(eps))
    else:
        y = F.rms_norm(x32, (hidden,), g, f32(eps))
    y.backward(dz.float().reshape(-1, hidden))
    return x32.grad.to(x.dtype), w32.grad.to(w.dtype), b32.grad.to(w.dtype) if norm == "layernorm" else None


def check_bwd_cuda(norm, rows, hidden, x_dtype, w_dtype, zc, device, gen, misaligned=False, repeat=False,
                   hard_rows=False, misaligned_weights=False):
    """The backward on ``device`` against the float64 reference, torch's fp32 autograd and
    the CPU core: dx, dgamma, dbeta (with ``repeat``, a second call gives the same bits;
    ``hard_rows``: with_hard_rows' x; ``misaligned_weights``: gamma as on_device's
    misaligned view). Returns the CUDA results."""
    x, w, b = make_inputs((rows,), hidden, x_dtype, w_dtype, zc, gen)
    if hard_rows:
        x = with_hard_rows(x).to(x_dtype)
    dz = (2 * torch.randn(x.shape, generator=gen)).to(x_dtype)
    (dx_ref, dg_ref, db_ref), (mu, rs), _ = reference_bwd(norm, dz, x, w, b, 1e-5, zc)
    dev = lambda t: t.to(device) if t is not None else None  # noqa: E731
    inputs = (on_device(dz, device, misaligned), on_device(x, device, misaligned), dev(mu), rs.to(device),
              on_device(w, device, misaligned_weights))
    poison_cache(x.numel() * 4, device)  # after the inputs: the outputs reuse the poisoned block
    got = run_bwd(norm, *inputs, zc)
    cpu = run_bwd(norm, dz, x, mu, rs, w, zc)
    base = torch_bwd_fp32(norm, dz.to(device), x.to(device), w.to(device), b.to(device), 1e-5, zc)
    check_rule(got[0], cpu[0], dx_ref, base[0], "dx", UNIT[x_dtype])
    check_rule(got[1], cpu[1], dg_ref, base[1], "dgamma", UNIT[w_dtype])
    if norm == "layernorm":
        check_rule(got[2], cpu[2], db_ref, base[2], "dbeta", UNIT[w_dtype])
    if repeat:
        for first, again in zip(got, run_bwd(norm, *inputs, zc)):
            if first is not None:
                assert torch.equal(first, again)
    return got


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda(norm, x_dtype, shape, device, gen):
    rows, hidden = shape
    check_bwd_cuda(norm, rows, hidden, x_dtype, OTHER[x_dtype], rows % 2 == 0, device, gen)


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("hidden", [64, 1000, 4096, 5120, 12288, 16384, 20000], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_hard_rows(norm, x_dtype, hidden, device, gen):
    """The backward of test_fwd_hard_rows' rows (an outlier in column 0, or an offset of
    1000, where mu * rsigma is about 1000 and x hat is its small difference from x *
    rsigma): dx, dgamma and dbeta within a few times torch's fp32 error. Hidden 64-4096
    take the rows kernel, 5120 and 12288 (bf16) the pipelined kernel (in its holding form:
    fewer rows than SMs), 16384 (bf16) its widest blocks (1024 threads, past the holding
    form's), 20000 the fallback kernels; on the CPU the core against torch's CPU kernel."""
    check_bwd_cuda(norm, 30, hidden, x_dtype, torch.float32, False, device, gen, hard_rows=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", BUCKET_HIDDEN, ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_buckets(norm, hidden, device, gen):
    check_bwd_cuda(norm, bucket_rows(hidden), hidden, torch.bfloat16, torch.float32, hidden % 2 == 1, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [8, 136, 384, 1024, 3000, 8192, 12288, 16392, 50000], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_buckets_other_dtypes(norm, x_dtype, hidden, device, gen):
    """fp16 rows with fp32 weights, fp32 rows with bf16; past 16384 the fallback kernels."""
    check_bwd_cuda(norm, 7, hidden, x_dtype, OTHER[x_dtype], False, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [200, 2560, 5120], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("w_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_dtype_pairs(norm, x_dtype, w_dtype, hidden, device, gen):
    """Every input and weight dtype on the GPU, zero-centered gamma: dgamma / dbeta stored
    in each weight dtype by the one-block write (200), the in-grid finalize (2560) and the
    finalize kernel after the pipelined or rows kernel (5120)."""
    check_bwd_cuda(norm, 10, hidden, x_dtype, w_dtype, True, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [1024, 5120, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_weights_off_16_bytes(norm, w_dtype, hidden, device, gen):
    """gamma as a view 2 or 4 bytes off 16-byte alignment (a flat parameter buffer's) with
    aligned bf16 rows: the rows kernel (1024) and the pipelined kernel (5120, 16384) stage
    it into shared memory element by element, where aligned weights go as 16-byte words."""
    check_bwd_cuda(norm, 40, hidden, torch.bfloat16, w_dtype, True, device, gen, misaligned_weights=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("rows", [1, 2, 3], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hidden", [16, 64, 1024, 4096], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_fewer_rows_than_a_block(norm, hidden, rows, device, gen):
    """A block holds 512 / (threads a row) rows: most of its row groups add nothing to
    the block's dgamma / dbeta partial sums."""
    check_bwd_cuda(norm, rows, hidden, torch.bfloat16, torch.bfloat16, True, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("rows", [1, 2, 3], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hidden", [5120, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_long_rows_fewer_than_a_wave(norm, x_dtype, hidden, rows, device, gen):
    """Long 16-bit rows go to the pipelined kernel (a row a block): one row's block
    writes dgamma / dbeta itself, two and three rows' blocks through the finalize."""
    w_dtype = torch.bfloat16 if x_dtype == torch.float16 else torch.float16
    check_bwd_cuda(norm, rows, hidden, x_dtype, w_dtype, rows == 2, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("rows", [4, 5, 8, 131, 300], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hidden", [4104, 5120, 12288, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_bwd_cuda_long_rows_block_pairs(x_dtype, hidden, rows, device, gen):
    """LayerNorm's pipelined backward on sm_90 runs its blocks in pairs (clusters) that add
    their dgamma / dbeta sums in distributed shared memory before writing one partial row a
    pair: 4 rows (two pairs, the fewest), 5 (single blocks: pairs would idle a fifth of
    the grid), 8, 131 (65 pairs, the last row strided onto the first pair) and 300 (several
    rows a block at hidden 12288 and 16384, a block an SM). Each against the references;
    hidden 4104 leaves lanes past the row."""
    check_bwd_cuda("layernorm", rows, hidden, x_dtype, torch.float32, rows % 2 == 1, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [12288, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_long_rows_even_steps(norm, hidden, device, gen):
    """Rows filling half of the pipelined backward's last step of a wave (15.5 rows a block
    at a block an SM, as on an H100 at these widths) run on the fewest blocks that take
    them in 16 steps (norm_even_steps_grid: 128 of 132 on an H100, layernorm's in pairs;
    126 of them take 16 rows, 2 take 15). Against the references, and a second call gives
    the same bits."""
    sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    check_bwd_cuda(norm, 15 * sms + sms // 2, hidden, torch.bfloat16, torch.float32, False, device, gen,
                   repeat=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("rows", [3, 200, 1000], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hidden", [5128, 6144, 8200, 8704, 9216, 9224, 11264, 12288, 12296], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_long_rows_forms(norm, x_dtype, hidden, rows, device, gen):
    """The pipelined kernel's register forms: hidden 8193 to 9216 its 56-register form, two
    blocks an SM; 9217 to 12288 its 80-register form, x hat and dz * gamma held across the
    row's reduction (and every hidden up to there with 3 rows, and 5121 to 6144 where it
    runs two blocks an SM as the plain form: 5128, 6144, not bf16 rmsnorm); 12296 the plain
    one (RMSNorm's widest form, its dx by the slope, at blocks of more than 768 on a device
    of 32 GB/s DRAM bandwidth an SM or more, an H200, or under test_norm_device_forms.py's
    figure; an H100 runs the plain form). Layernorm's blocks run in pairs from 200 rows,
    several rows a block from 1000. Against the references, and a second call gives the same
    bits."""
    check_bwd_cuda(norm, rows, hidden, x_dtype, torch.float32, rows % 2 == 1, device, gen, repeat=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [4104, 4608], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_grid_at_the_row_block_cap(norm, hidden, device, gen):
    """bf16 rows of hidden 4097-4608 fit four of the pipelined backward's blocks an SM
    (rmsnorm's; three for layernorm), more than the grid's cap (kNormMaxRowBlocks, the
    workspace's partial rows) on 132 SMs: 1000 rows run the capped grid (norm_bwd_grid:
    396 blocks there, three on every SM), each block through two or three rows. Against
    the references, and a second call gives the same bits."""
    check_bwd_cuda(norm, 1000, hidden, torch.bfloat16, torch.float32, False, device, gen, repeat=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [1000, 5120, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_workspace_off_16_bytes(norm, hidden, device, gen, monkeypatch):
    """A workspace 4 bytes off 16-byte alignment (the C API takes any float-aligned
    pointer): the partial rows are stored element by element instead of 16 bytes at a
    time, with the same bits."""
    from transformer_engine.pytorch.cpp_extensions import normalization

    x, w, _ = make_inputs((37,), hidden, torch.bfloat16, torch.float32, False, gen)
    dz = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
    x, w = x.to(device), w.to(device)
    _, mu, rs = run_fwd(norm, x, w, torch.zeros_like(w), 1e-5, False)
    aligned = run_bwd(norm, dz, x, mu, rs, w, False)
    workspace = normalization._workspace

    given = []

    def off_by_4(rows, hidden, desc, device):
        ws = workspace(rows, hidden, desc, device)
        padded = torch.empty(ws.numel() + 16, dtype=torch.uint8, device=device)
        given.append(padded[4:4 + ws.numel()])
        return given[-1]

    monkeypatch.setattr(normalization, "_workspace", off_by_4)
    shifted = run_bwd(norm, dz, x, mu, rs, w, False)
    assert len(given) == 1 and given[0].data_ptr() % 16 == 4
    for a, b in zip(aligned, shifted):
        if a is not None:
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [256, 3072, 5120], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_graph_replay(norm, hidden, device, gen):
    """The backward captured in a CUDA graph (up to hidden 3072 the rows kernel's
    cooperative launch, above it the finalize's dependent launch) and replayed on new
    inputs gives the bits of an eager call on them."""

    def inputs():
        x, w, _ = make_inputs((600,), hidden, torch.bfloat16, torch.float32, False, gen)
        dz = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
        x, w = x.to(device), w.to(device)
        _, mu, rs = run_fwd(norm, x, w, torch.zeros_like(w), 1e-5, False)
        return dz, x, mu, rs, w

    static = inputs()
    run_bwd(norm, *static, False)  # the host-side queries happen outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run_bwd(norm, *static, False)
    fresh = inputs()
    for into, value in zip(static, fresh):
        if into is not None:
            into.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    eager = run_bwd(norm, *fresh, False)
    for replayed, expected in zip(captured, eager):
        if replayed is not None:
            assert torch.equal(replayed, expected)


def alone_and_queued(run, calls):
    """(results of run(*args) for each of ``calls`` with the GPU drained after each, the
    same calls queued one after another with no wait between them): a kernel launched
    before the one it depends on has ended must still read that one's results."""
    alone = []
    for args in calls:
        alone.append(run(*args))
        torch.cuda.synchronize()
    queued = [run(*args) for args in calls]
    torch.cuda.synchronize()
    return alone, queued


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [1024, 5120, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_back_to_back(norm, hidden, device, gen):
    """Backward calls queued one after another with no wait between them: each call's
    finalize (a dependent launch, started before its rows kernel ends; at hidden 1024 the
    rows kernel's own blocks past a grid barrier) must read the partial sums of its own
    call, in a workspace the next call reuses. Every result equals that of the same call
    run alone, bit for bit."""
    calls = []
    for _ in range(4):
        x, w, _ = make_inputs((600,), hidden, torch.bfloat16, torch.float32, False, gen)
        dz = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
        x, w = x.to(device), w.to(device)
        _, mu, rs = run_fwd(norm, x, w, torch.zeros_like(w), 1e-5, False)
        calls.append((dz, x, mu, rs, w))
    alone, queued = alone_and_queued(lambda *args: run_bwd(norm, *args, False), calls)
    for one, other in zip(alone, queued):
        for a, b in zip(one, other):
            if a is not None:
                assert torch.equal(a, b)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [768, 4096, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_both_copies_cuda_back_to_back(norm, hidden, device, gen):
    """Forward calls with both FP8 copies queued with no wait between them: each call's
    transpose (a dependent launch, started before the norm kernel ends) must read the
    row-wise bytes that kernel wrote. Every result equals that of the same call run alone,
    and each transposed copy is its row-wise copy transposed."""
    calls = []
    for _ in range(4):
        x, w, b = make_inputs((600,), hidden, torch.bfloat16, torch.float32, False, gen)
        calls.append((x.to(device), w.to(device), b.to(device)))
    scale = torch.tensor([2.0], device=device)

    def forward(x, w, b):
        out, _, _ = run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=scale, columnwise=True)
        return out

    alone, queued = alone_and_queued(forward, calls)
    for one, other in zip(alone, queued):
        assert torch.equal(other._transpose, other._data.t())
        assert torch.equal(one._data, other._data) and torch.equal(one._transpose, other._transpose)


# Both FP8 copies in one pass (norm_fwd_tiled.cu) take rows % 8 == 0. 16-bit rows of the
# hidden <= 512 bucket from 128, multiples of 128, keep a 64-row tile in shared memory with
# the row kernel's row groups: 8 x 128 (a quarter warp a row, one partial tile), 264 x 256,
# 40 x 384 and 4104 x 384 (three chunks a thread on 16 lanes), 72 x 512 and 4104 x 512
# (65 tiles), 70000 x 256 (blocks stride over tiles; fp32 rows: the two passes); 40 x 200
# and 40 x 64 leave them to the two passes. Hidden 768 and 1024
# keep the tile in shared memory (tiles of 64 rows): 8 rows, one partial tile; 72, a tile
# and 8 rows of the next; 4104 x 1024, 65 tiles; 70000 x 768, more tiles than the grid's
# four waves, so that blocks stride over tiles. Rows of 1032 to 5120 (multiples of 8; fp32
# rows up to 2560, and to 4096 from 16384 rows) read the 32-row tile back from the
# row-wise copy: 1032 (a warp a row, its fifth chunk nearly idle), 1152, 1288 and 1536 (a
# warp a row, 5, 6 and 6 chunks a thread, 16 rows a block), 2048, 2560 (three-warp
# rows), 4136 x 2056 (130 tiles, the last a partial one), 34000 x 1152 (blocks stride over
# tiles), 16392 x 4096 (1024-thread blocks; fp32 from 16384 rows), 40 x 4104 and 40 x 5120
# (five-warp rows, four a block), 40 x 3072 (fp32: the two passes). 16-bit rows of
# multiples of 128 keep their 32-row tile in shared memory, RMSNorm's from 3072 to 7168:
# 40 x 3072, 40 x 3200, 16904 x 4096, 40 x 5120, where LayerNorm reads back from the
# row-wise copy; both norms' at 40 x 5248 (LayerNorm's first), 40 x 6144 and 40 x 7168
# (seven-warp rows, 224 KiB of tile). 16-bit rows take the trailing tiles (tiles transposed
# by later tickets, norm_trailing.h; not on a device whose memory outruns its SMs, an H200)
# RMSNorm's past 7168 but for 10241-12288, LayerNorm's from 12289: 40 x 7296 (RMSNorm) and
# 72 x 12296, where every share is transposed after the last row (rows fewer than the lag),
# and 4104 x 8192 and 2056 x 9216 (RMSNorm; two rows a block and a partial last tile, one
# row of nine warps) and 2056 x 16384, where the shares trail the rows by the lag (two
# waves). 36 x 1024, 64 x 1000, 40 x 896, 36 x 2048, fp32 rows past 2560 below 16384 rows
# and LayerNorm's 16-bit 7296 to 9216 are left to the two passes (the C++ test TiledForward
# checks the rule at every hidden size).
TILED_SHAPES = [(8, 128), (264, 256), (40, 384), (4104, 384), (72, 512), (4104, 512), (70000, 256), (40, 200),
                (40, 64), (8, 768), (72, 768), (200, 1024), (4104, 1024), (70000, 768), (36, 1024), (64, 1000),
                (40, 896), (40, 1032), (8, 1152), (72, 1288), (264, 1536), (264, 2048), (40, 2560), (4136, 2056),
                (34000, 1152), (36, 2048), (40, 3072), (40, 3200), (16904, 4096), (40, 4104), (40, 5120), (40, 5248),
                (40, 6144), (40, 7168), (40, 7296), (72, 12296), (4104, 8192), (2056, 9216), (2056, 16384)]


def run_fwd_fp8_both_ways(norm, x, w, b, fp8_dtype, device):
    """The FP8 forward with the row-wise copy alone (the row kernel, which
    test_fwd_fp8_cuda checks against the CPU reference), then with both copies: a list
    of (out, mu, rsigma, amax), each on cache poisoned with NaN bytes."""
    scale = torch.tensor([3.0], device=device)
    results = []
    for columnwise in (False, True):
        amax = torch.zeros(1, device=device)
        poison_cache(2 * x.numel(), device)
        out, mu, rs = run_fwd(norm, x, w, b, 1e-5, True, fp8_dtype=fp8_dtype, scale=scale, amax=amax,
                              columnwise=columnwise)
        results.append((out, mu, rs, amax))
    return results


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("shape", TILED_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_both_copies_tiled_cuda(norm, x_dtype, shape, fp8_dtype, device, gen):
    """With both copies, the row-wise copy, the statistics, amax and scale_inv equal those
    of the row-wise call bit for bit, and the transposed copy is the row-wise copy
    transposed (every byte written: the cache held NaN bytes)."""
    rows, hidden = shape
    x, w, b = make_inputs((rows,), hidden, x_dtype, torch.float32, True, gen)
    (row, mu0, rs0, amax0), (both, mu1, rs1, amax1) = run_fwd_fp8_both_ways(
        norm, x.to(device), w.to(device), b.to(device), fp8_dtype, device)
    assert torch.equal(both._data, row._data)
    assert torch.equal(both._transpose, row._data.t())
    assert torch.equal(rs1, rs0) and (mu0 is None or torch.equal(mu1, mu0))
    assert torch.equal(amax1, amax0) and torch.equal(both._scale_inv, row._scale_inv)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", [(72, 384), (72, 512), (72, 768), (72, 1152), (40, 2048), (40, 4096), (40, 6144),
                                   (1160, 12296)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_both_copies_tiled_hard_rows_cuda(norm, shape, device, gen):
    """Rows of the tiled kernels (both tiles in shared memory, the tile from the row-wise
    copy, the trailing tiles) that alternate an outlier in column 0 (LayerNorm's row groups that sum the
    squares again) with rows of a large offset (those that do not) in one block: the
    same bytes and statistics as the row-wise call."""
    rows, hidden = shape
    x, w, b = make_inputs((rows,), hidden, torch.bfloat16, torch.float32, True, gen)
    x = with_hard_rows(x).to(torch.bfloat16)
    (row, mu0, rs0, amax0), (both, mu1, rs1, amax1) = run_fwd_fp8_both_ways(
        norm, x.to(device), w.to(device), b.to(device), E4M3, device)
    assert torch.equal(both._data, row._data) and torch.equal(both._transpose, row._data.t())
    assert torch.equal(rs1, rs0) and (mu0 is None or torch.equal(mu1, mu0)) and torch.equal(amax1, amax0)


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", [(2056, 16384), (4104, 8192), (40, 7296), (72, 12288)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_both_copies_trailing_one_kernel_cuda(norm, shape, device, gen):
    """Both FP8 copies of 16-bit rows the trailing tiles take (RMSNorm's past 7168 but for
    10241-12288, LayerNorm's from 12289) in one kernel, theirs (NormTile 3, norm_trailing.h),
    after the zeroing of its counters, with no transpose kernel after it; the others (and
    all on a device whose memory outruns its SMs, an H200: not timed there) the row kernel,
    then the transpose. (The bytes: test_fwd_fp8_both_copies_tiled_cuda.)"""
    # (test_norm_device_forms imports this module: imported here, once both are loaded)
    from test_norm_device_forms import H200_FORMS_MIN_GB_PER_S_PER_SM, cuda_kernel_names, dram_gb_per_s_per_sm

    rows, hidden = shape
    figure = dram_gb_per_s_per_sm(device)  # OPENTE_DRAM_GB_PER_S_PER_SM's where set
    if figure is None:
        pytest.skip("torch reports no memory clock for this device")
    trailing_hidden = hidden > 12288 if norm == "layernorm" else hidden > 7168 and (hidden <= 10240 or hidden > 12288)
    expected = trailing_hidden and figure < H200_FORMS_MIN_GB_PER_S_PER_SM
    x, w, b = (t.to(device) for t in make_inputs((rows,), hidden, torch.bfloat16, torch.float32, False, gen))
    scale = torch.tensor([2.0], device=device)
    names = cuda_kernel_names(lambda: run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=scale,
                                              columnwise=True))
    norm_kernels = [n for n in names if "norm_fwd" in n]
    assert len(norm_kernels) == 1 and "norm_fwd_rows_kernel" in norm_kernels[0], names
    assert ("NormTile)3" in norm_kernels[0]) == expected, names
    assert any("transpose" in n for n in names) == (not expected), names


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hard", [False, True], ids=["random", "hard"])
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("rows", [3, 200, 1000], ids=lambda r: f"rows{r}")
@pytest.mark.parametrize("hidden", [12288, 14344, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_pipelined_rows_cuda(norm, x_dtype, hidden, rows, fp8_dtype, hard, device, gen):
    """16-bit rows of 12288 to 16384 with a row-wise FP8 y take the pipelined forward on a
    device of 32 GB/s DRAM bandwidth an SM (an H200; an H100 runs the row kernel both times,
    but the pipelined one under test_norm_device_forms.py's figure): its y, statistics, amax
    and scale_inv equal, bit for bit, those of the row kernel, which writes the row-wise
    copy of a call of both copies with 3 rows (then transposed), and the trailing tiles'
    kernel, the row kernel's row groups, that of 200 and 1000. 3 rows: fewer than the blocks;
    1000: blocks take several rows, each staged while the one before it is worked on; hard
    rows alternate an outlier in column 0 with rows of a large offset."""
    x, w, b = make_inputs((rows,), hidden, x_dtype, torch.float32, True, gen)
    if hard:
        x = with_hard_rows(x).to(x_dtype)
    (row, mu0, rs0, amax0), (both, mu1, rs1, amax1) = run_fwd_fp8_both_ways(
        norm, x.to(device), w.to(device), b.to(device), fp8_dtype, device)
    assert torch.equal(row._data, both._data) and torch.equal(both._transpose, row._data.t())
    assert torch.equal(rs0, rs1) and (mu0 is None or torch.equal(mu0, mu1))
    assert torch.equal(amax0, amax1) and torch.equal(row._scale_inv, both._scale_inv)


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("shape", [(72, 256), (16, 320), (72, 384), (24, 640), (72, 768), (64, 1000), (37, 1001),
                                   (37, 1024), (40, 1408), (40, 2048), (40, 4096), (40, 6144), (8, 16392)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", NORMS)
def test_fwd_fp8_columnwise_copy_alone(norm, shape, device, gen):
    """An FP8 output with only its column-wise copy (the C API allows a null row-wise
    buffer; the Python wrappers always ask for both): the copy equals the transposed
    row-wise copy of the usual call, bytes past it untouched. 72 x 384, 72 x 768 and 40 x
    6144 take the tiled kernel's shared tile on CUDA, and so does RMSNorm's 40 x 4096; the
    others the row kernel's byte stores (40 x 2048: no row-wise copy for the tile to be
    read back from; 16 x 320 and 24 x 640 its rows of 5 chunks a thread, on 8 and 16 lanes,
    40 x 1408 of 6 on a warp)."""
    rows, hidden = shape
    x, w, b = make_inputs((rows,), hidden, torch.bfloat16, torch.float32, False, gen)
    x, w, b = x.to(device), w.to(device), b.to(device)
    scale = torch.tensor([3.0], device=device)
    ref, mu_ref, rs_ref = run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=scale)
    guard = 64
    data_t = torch.full((hidden * rows + guard,), 0xA5, dtype=torch.uint8, device=device)
    scale_inv = torch.zeros(1, device=device)
    x_desc = describe(x, "inp")
    out_desc = _core.Tensor(*x_desc.device, int(E4M3), [rows, hidden], 0, data_t.data_ptr(), scale.data_ptr(),
                            scale_inv.data_ptr(), 0, int(_core.ScalingMode.PER_TENSOR))
    rsigma, mu = torch.empty(rows, device=device), torch.empty(rows, device=device)
    core_fwd(norm, x_desc, w, b, out_desc, describe(mu, "mu"), describe(rsigma, "rsigma"), rows, hidden, device,
             stream_of(x))
    if norm == "layernorm":
        assert torch.equal(mu, mu_ref)
    assert torch.equal(data_t[:-guard].view(hidden, rows), ref._data.t())
    assert bool((data_t[-guard:] == 0xA5).all())
    assert torch.equal(rsigma, rs_ref) and torch.equal(scale_inv, ref._scale_inv)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [64, 384, 1000, 4096, 4097, 8192, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("x_dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_misaligned(norm, x_dtype, hidden, device, gen):
    """dz and x as views off 16-byte alignment: the element-wise path."""
    check_bwd_cuda(norm, 37, hidden, x_dtype, torch.float32, False, device, gen, misaligned=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", [(300000, 8), (20000, 1024), (2000, 8192), (1000, 16384)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_large(norm, shape, device, gen):
    """More rows than a wave of blocks holds: each thread adds dgamma / dbeta over many rows."""
    rows, hidden = shape
    check_bwd_cuda(norm, rows, hidden, torch.bfloat16, torch.float32, False, device, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("hidden", [100, 4096, 16384], ids=lambda h: f"h{h}")
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_repeats_bit_for_bit(norm, hidden, device, gen):
    """The column sums run in a fixed order (no atomics): a second run gives the same bits."""
    x, w, b = make_inputs((333,), hidden, torch.bfloat16, torch.float32, False, gen)
    dz = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
    x, w, b = x.to(device), w.to(device), b.to(device)
    _, mu, rs = run_fwd(norm, x, w, b, 1e-5, False)
    first = run_bwd(norm, dz, x, mu, rs, w, False)
    second = run_bwd(norm, dz, x, mu, rs, w, False)
    for a, c in zip(first, second):
        if a is not None:
            assert torch.equal(a, c)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("shape", [(4, 3072), (6, 3000), (20000, 64), (9, 520), (1000, 3072), (1000, 3080),
                                   (5000, 384)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
@pytest.mark.parametrize("norm", NORMS)
def test_bwd_cuda_finalize_in_grid(norm, x_dtype, shape, device, gen):
    """Up to hidden 3072 the rows kernel sums dgamma / dbeta itself: after a grid-wide
    barrier each block takes a share of the partial rows' columns. Shares wider than a
    block (4 x 3072: two blocks of 384 threads, 3072 columns each, in eight passes),
    blocks left without a share (20000 x 64: 128 columns over a wave of blocks), the last
    hidden that takes it and one past (3080: the finalize kernel), rows that leave a quarter
    of their lanes idle (5000 x 384), against the references; a second run gives the same
    bits."""
    rows, hidden = shape
    check_bwd_cuda(norm, rows, hidden, x_dtype, torch.float32, rows % 2 == 1, device, gen, repeat=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("norm", NORMS)
def test_zero_rows_cuda(norm, device):
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    w, b = torch.ones(64, device=device), torch.zeros(64, device=device)
    out, _, rsigma = run_fwd(norm, x, w, b, 1e-5, False)
    assert out.shape == (0, 64) and rsigma.shape == (0,)
    stats = torch.empty(0, device=device)
    dx, dgamma, dbeta = run_bwd(norm, x, x, stats if norm == "layernorm" else None, stats, w, False)
    assert torch.equal(dgamma.cpu(), torch.zeros(64))
    if norm == "layernorm":
        assert torch.equal(dbeta.cpu(), torch.zeros(64))
