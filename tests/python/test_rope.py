"""Rotary position embedding: ``apply_rotary_pos_emb`` fused (the core's kernel) and
unfused (plain PyTorch), the ``fused_rope_forward`` / ``fused_rope_backward`` helpers and
``RotaryPositionEmbedding``, against an independent float64 reference written here from
Transformer Engine's documented semantics: each sequence on its own, its angles sliced out
of freqs (shifted by start_positions; for context parallelism the two chunks of 2 cp_size
a rank holds), and every pair (a, b) of rotated features multiplied by its rotation matrix
[[cos t_a, -sin t_a], [sin t_b, cos t_b]]; gradients by float64 autograd through it.

Tolerances, per output element with M = |x_a| + |x_b| over its pair (|dy_a| + |dy_b| for
gradients), u = 2^-24, `unit` the dtype's unit roundoff, `tiny` half its smallest step:
  fused    fp32 math: sin / cos err by <= 2 ulp (CUDA's sincosf; 1 for the CPU's libm), a
           product and a sum (or one FMA) by u each: 6u M, asserted as 8u M; then the
           rounding to the dtype, unit (|ref| + 8u M) + tiny.
  unfused  Transformer Engine's path in t's dtype: cos and sin rounded to the dtype, two
           products and a sum rounded: 3 unit M, asserted as (4 unit + 8u) M + tiny.
CUDA runs write into NaN-poisoned outputs (through _core, as the helpers do) and must meet
the same bounds, and agree with the CPU core within both of their bounds plus one step of
the dtype (their fp32 values may round to neighbouring codes).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine import _core
from transformer_engine.pytorch.attention import RotaryPositionEmbedding, apply_rotary_pos_emb
from transformer_engine.pytorch.cpp_extensions import fused_rope_backward, fused_rope_forward
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, describe_view, stream_of

U = 2.0**-24
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
TINY = {torch.float32: 2.0**-150, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CUDA = [pytest.param("cuda", marks=requires_cuda)]
FORMATS = ["sbhd", "bshd", "thd"]
# (d, d2): all rotated; odd d with a copied tail; d2 off the vector boundaries; a single
# pair; a head of 128 (the GPU's vector path, half of it rotated).
DIMS = [(8, 8), (7, 4), (16, 6), (3, 2), (128, 64)]
# THD: sequences of 3, 0, 7 and 7 tokens.
CU_SEQLENS = [0, 3, 3, 10, 17]


def dims_id(dd):
    return f"d{dd[0]}_d2_{dd[1]}"


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


# ---- data --------------------------------------------------------------------------------------


def shape_of(fmt, s=5, b=2, h=3, d=8, cu=CU_SEQLENS):
    return {"sbhd": (s, b, h, d), "bshd": (b, s, h, d), "thd": (cu[-1], h, d)}[fmt]


def make_x(shape, dtype, gen, device="cpu"):
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)


def make_freqs(s2, d2, gen, device="cpu"):
    """Random angles in [-100, 100): the two elements of a pair get different angles, so
    a backward that took the wrong one's sine shows."""
    return ((torch.rand((s2, 1, 1, d2), generator=gen, dtype=torch.float64) * 200 - 100)
            .to(torch.float32).to(device))


# ---- the float64 reference ---------------------------------------------------------------------


def cp_positions(n, cp_size, cp_rank):
    """Global positions of a rank's n local tokens: chunks cp_rank and 2 cp_size - 1 -
    cp_rank of the full sequence cut into 2 cp_size chunks of n / 2."""
    if cp_size == 1:
        return list(range(n))
    chunk = n // 2
    full = list(range(2 * cp_size * chunk))
    chunks = [full[i * chunk:(i + 1) * chunk] for i in range(2 * cp_size)]
    return chunks[cp_rank] + chunks[2 * cp_size - 1 - cp_rank]


def pairs(d2, interleaved):
    """Index lists (a, b) of the rotated pairs."""
    if interleaved:
        return list(range(0, d2, 2)), list(range(1, d2, 2))
    return list(range(d2 // 2)), list(range(d2 // 2, d2))


def token_positions(shape, fmt, s2, start=None, cu=None, cp_size=1, cp_rank=0):
    """Per token (the leading dims of t): its position, or -1 for THD padding."""
    if fmt == "thd":
        pos = [-1] * shape[0]
        bounds = [int(c) // cp_size for c in cu]
        for i in range(len(bounds) - 1):
            local = cp_positions(bounds[i + 1] - bounds[i], cp_size, cp_rank)
            for j, p in enumerate(local):
                pos[bounds[i] + j] = p + (int(start[i]) if start is not None else 0)
        return torch.tensor(pos, dtype=torch.int64)
    s, b = (shape[0], shape[1]) if fmt == "sbhd" else (shape[1], shape[0])
    base = cp_positions(s, cp_size, cp_rank)
    pos = torch.tensor([[base[j] + (int(start[bi]) if start is not None else 0) for bi in range(b)]
                        for j in range(s)], dtype=torch.int64)  # [s, b]
    return pos if fmt == "sbhd" else pos.T


def reference(x, freqs, fmt, interleaved=False, start=None, cu=None, cp_size=1, cp_rank=0, backward=False):
    """float64 result (differentiable in x) and M = |x_a| + |x_b| per rotated element (0
    elsewhere). Positions outside freqs give NaN."""
    # A float64 CPU x is used as is (the caller differentiates through it).
    x64 = x if x.dtype == torch.float64 and x.device.type == "cpu" else x.detach().cpu().to(torch.float64)
    f = freqs.detach().cpu().to(torch.float64).reshape(freqs.shape[0], freqs.shape[-1])  # [s2, d2]
    s2, d2 = f.shape
    pos = token_positions(x.shape, fmt, s2, start, cu, cp_size, cp_rank)
    inside = pos >= 0 if fmt == "thd" else torch.ones_like(pos, dtype=torch.bool)
    valid = (pos >= 0) & (pos < s2)
    angles = f[pos.clamp(0, max(s2 - 1, 0))] if s2 > 0 else torch.zeros(*pos.shape, d2, dtype=torch.float64)
    angles = torch.where(valid.unsqueeze(-1), angles, torch.full_like(angles, math.nan)).unsqueeze(-2)
    ia, ib = (torch.tensor(v, dtype=torch.int64) for v in pairs(d2, interleaved))
    rot = x64[..., :d2]
    xa, xb = rot[..., ia], rot[..., ib]
    ta, tb = angles[..., ia], angles[..., ib]
    m = [[torch.cos(ta), -torch.sin(ta)], [torch.sin(tb), torch.cos(tb)]]
    if backward:  # the transpose
        m = [[m[0][0], m[1][0]], [m[0][1], m[1][1]]]
    ya = m[0][0] * xa + m[0][1] * xb
    yb = m[1][0] * xa + m[1][1] * xb
    y_rot = torch.zeros_like(rot).index_add(-1, ia, ya).index_add(-1, ib, yb)
    rotated = torch.cat((y_rot, x64[..., d2:]), dim=-1)
    keep = inside.reshape(*inside.shape, 1, 1)
    y = torch.where(keep, rotated, x64)
    mag = torch.zeros_like(x64.detach())
    absx = x64.detach().abs()
    mag[..., ia] = absx[..., ia] + absx[..., ib]
    mag[..., ib] = absx[..., ia] + absx[..., ib]
    mag = mag * keep
    return y, mag


def fused_bound(ref, mag, dtype):
    err = 8 * U * mag
    return err + UNIT[dtype] * (ref.abs() + err) + TINY[dtype]


def unfused_bound(mag, dtype):
    return (4 * UNIT[dtype] + 8 * U) * mag + TINY[dtype]


def assert_within(got, ref, bound, what):
    got64 = got.detach().cpu().to(torch.float64)
    ref = ref.detach()
    err = (got64 - ref).abs()
    bad = ~(err <= bound)  # NaN fails
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} elements off, first at {i}: got {got64[i].item()}, "
                             f"want {ref[i].item()} (bound {bound[i].item():.3g})")


# ---- the fused and unfused paths against the reference ----------------------------------------


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("dims", DIMS, ids=dims_id)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_forward_and_gradient(dtype, fmt, interleaved, dims, device, gen):
    d, d2 = dims
    x = make_x(shape_of(fmt, d=d), dtype, gen, device).requires_grad_()
    freqs = make_freqs(20, d2, gen, device)
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=device) if fmt == "thd" else None
    dy = make_x(x.shape, dtype, gen, device)
    x64 = x.detach().cpu().to(torch.float64).requires_grad_()
    ref, mag = reference(x64, freqs, fmt, interleaved, cu=CU_SEQLENS)
    ref_grad, = torch.autograd.grad(ref, x64, dy.cpu().to(torch.float64))
    _, gmag = reference(dy, freqs, fmt, interleaved, cu=CU_SEQLENS)

    for fused in (True, False):
        y = apply_rotary_pos_emb(x, freqs, fmt, interleaved=interleaved, fused=fused, cu_seqlens=cu)
        assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
        grad, = torch.autograd.grad(y, x, dy)
        what = f"{'fused' if fused else 'unfused'} {fmt} {dtype_id(dtype)}"
        if fused:
            assert_within(y, ref, fused_bound(ref, mag, dtype), what + " forward")
            assert_within(grad, ref_grad, fused_bound(ref_grad, gmag, dtype), what + " gradient")
        else:
            assert_within(y, ref, unfused_bound(mag, dtype), what + " forward")
            assert_within(grad, ref_grad, unfused_bound(gmag, dtype), what + " gradient")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_fused_is_at_least_as_accurate_as_unfused(dtype, gen):
    """The fused path computes in fp32 and rounds once: its largest error against float64
    is at most the unfused path's (which rounds cos, sin, products and sum to the dtype)."""
    x = make_x((64, 2, 8, 64), dtype, gen)
    freqs = RotaryPositionEmbedding(64, rotary_base=10000.0).to("cpu")(64)
    ref, _ = reference(x, freqs, "sbhd")
    err_fused = (apply_rotary_pos_emb(x, freqs, fused=True).double() - ref).abs().max()
    err_unfused = (apply_rotary_pos_emb(x, freqs, fused=False).double() - ref).abs().max()
    assert err_fused <= err_unfused, (err_fused, err_unfused)


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("fmt", FORMATS)
def test_start_positions(fmt, device, gen):
    dtype = torch.bfloat16
    x = make_x(shape_of(fmt, d=16), dtype, gen, device).requires_grad_()
    freqs = make_freqs(40, 16, gen, device)
    start = [4, 0, 11, 2] if fmt == "thd" else [3, 17]
    start_t = torch.tensor(start, dtype=torch.int32, device=device)
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=device) if fmt == "thd" else None
    dy = make_x(x.shape, dtype, gen, device)
    x64 = x.detach().cpu().to(torch.float64).requires_grad_()
    ref, mag = reference(x64, freqs, fmt, start=start, cu=CU_SEQLENS)
    ref_grad, = torch.autograd.grad(ref, x64, dy.cpu().to(torch.float64))
    _, gmag = reference(dy, freqs, fmt, start=start, cu=CU_SEQLENS)
    for fused in (True, False):
        y = apply_rotary_pos_emb(x, freqs, fmt, start_positions=start_t, fused=fused, cu_seqlens=cu)
        grad, = torch.autograd.grad(y, x, dy)
        bound = fused_bound(ref, mag, dtype) if fused else unfused_bound(mag, dtype)
        gbound = fused_bound(ref_grad, gmag, dtype) if fused else unfused_bound(gmag, dtype)
        assert_within(y, ref, bound, f"fused={fused} forward")
        assert_within(grad, ref_grad, gbound, f"fused={fused} gradient")


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("fmt", FORMATS)
def test_positions_past_freqs_are_nan_when_fused(fmt, device, gen):
    """Offsets that reach past freqs (known only on the device for CUDA) give NaN in the
    rotated features; the copied tail stays exact."""
    x = make_x(shape_of(fmt, d=8), torch.float32, gen, device)
    freqs = make_freqs(12, 6, gen, device)
    start = [0, 0, 8, 0] if fmt == "thd" else [0, 9]
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=device) if fmt == "thd" else None
    y = apply_rotary_pos_emb(x, freqs, fmt, fused=True, cu_seqlens=cu,
                             start_positions=torch.tensor(start, dtype=torch.int32, device=device))
    ref, _ = reference(x, freqs, fmt, start=start, cu=CU_SEQLENS)
    nan = torch.isnan(ref)
    assert nan.any(), "the case must reach past freqs"
    assert torch.equal(torch.isnan(y.cpu()), nan)
    assert torch.equal(y[..., 6:].cpu(), x[..., 6:].cpu())


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cp_rank", [0, 1, 2])
def test_context_parallel(cp_rank, fmt, interleaved, device, gen):
    cp_size, dtype = 3, torch.float32
    cu_full = [0, 12, 12, 36, 48]  # full lengths 12, 0, 24, 12: local 4, 0, 8, 4
    shape = (16, 3, 8) if fmt == "thd" else shape_of(fmt, s=4, d=8)
    x = make_x(shape, dtype, gen, device).requires_grad_()
    freqs = make_freqs(24 if fmt == "thd" else 12, 8, gen, device)
    cu = torch.tensor(cu_full, dtype=torch.int32, device=device) if fmt == "thd" else None
    dy = make_x(shape, dtype, gen, device)
    kw = dict(cu=cu_full, cp_size=cp_size, cp_rank=cp_rank)
    x64 = x.detach().cpu().to(torch.float64).requires_grad_()
    ref, mag = reference(x64, freqs, fmt, interleaved, **kw)
    ref_grad, = torch.autograd.grad(ref, x64, dy.cpu().to(torch.float64))
    _, gmag = reference(dy, freqs, fmt, interleaved, **kw)
    for fused in (True, False):
        y = apply_rotary_pos_emb(x, freqs, fmt, interleaved=interleaved, fused=fused, cu_seqlens=cu,
                                 cp_size=cp_size, cp_rank=cp_rank)
        grad, = torch.autograd.grad(y, x, dy)
        assert_within(y, ref, unfused_bound(mag, dtype), f"fused={fused} forward")
        assert_within(grad, ref_grad, unfused_bound(gmag, dtype), f"fused={fused} gradient")


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
def test_thd_padding_tokens_are_copied(device, gen):
    """Tokens before cu_seqlens[0] and from cu_seqlens[-1] on belong to no sequence."""
    x = make_x((13, 2, 8), torch.bfloat16, gen, device)
    freqs = make_freqs(16, 8, gen, device)
    cu = [2, 5, 5, 9]
    y = apply_rotary_pos_emb(x, freqs, "thd", fused=True, cu_seqlens=torch.tensor(cu, device=device))
    ref, mag = reference(x, freqs, "thd", cu=cu)
    assert_within(y, ref, fused_bound(ref, mag, torch.bfloat16), "thd padding")
    assert torch.equal(y[:2], x[:2]) and torch.equal(y[9:], x[9:])
    unfused = apply_rotary_pos_emb(x, freqs, "thd", fused=False, cu_seqlens=torch.tensor(cu, device=device))
    assert torch.equal(unfused[:2], x[:2]) and torch.equal(unfused[9:], x[9:])


@pytest.mark.parametrize("device", ["cpu"] + CUDA)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_views_are_read_in_place(dtype, interleaved, device, gen):
    """q and k sliced out of a fused [s, b, h, 3d] projection, a BSHD view of SBHD memory,
    every other feature, and a view shifted by one element (off the GPU's vectors): the
    same result as on a contiguous copy, and the input is left alone."""
    s, b, h, d = 6, 2, 4, 64
    qkv = make_x((s, b, h, 3 * d), dtype, gen, device)
    freqs = make_freqs(8, 32, gen, device)  # THD's second sequence has 7 tokens
    flat = make_x((s * b * h * d + 1,), dtype, gen, device)
    views = {
        "q": ("sbhd", qkv[..., :d]),
        "k": ("sbhd", qkv[..., d:2 * d]),
        "bshd of sbhd": ("bshd", qkv[..., 2 * d:].transpose(0, 1)),
        "every other": ("sbhd", qkv[..., ::3]),
        "shifted": ("sbhd", flat[1:].view(s, b, h, d)),
        "thd": ("thd", qkv.view(s * b, h, 3 * d)[..., d:2 * d]),
    }
    for name, (fmt, view) in views.items():
        before = view.clone()
        cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device) if fmt == "thd" else None
        got = apply_rotary_pos_emb(view, freqs, fmt, interleaved=interleaved, fused=True, cu_seqlens=cu)
        assert got.is_contiguous()
        want = apply_rotary_pos_emb(view.contiguous(), freqs, fmt, interleaved=interleaved, fused=True, cu_seqlens=cu)
        if device == "cpu":
            assert torch.equal(got, want), name
        else:  # the vector and element paths may contract multiply-adds differently
            ref, mag = reference(view, freqs, fmt, interleaved, cu=[0, 5, 12])
            assert_within(got, ref, fused_bound(ref, mag, dtype), name)
        assert torch.equal(view, before), name
        # The backward reads a non-contiguous gradient (same values) in place too.
        gout = make_x(got.shape, dtype, gen, device)
        gout_view = gout.transpose(0, 1).contiguous().transpose(0, 1)
        grad_view = fused_rope_backward(gout_view, freqs, None, fmt, interleaved, cu)
        if device == "cpu":
            assert torch.equal(grad_view, fused_rope_backward(gout, freqs, None, fmt, interleaved, cu)), name
        ref_b, mag_b = reference(gout, freqs, fmt, interleaved, cu=[0, 5, 12], backward=True)
        assert_within(grad_view, ref_b, fused_bound(ref_b, mag_b, dtype), name + " backward")


# ---- the tex-like helpers ----------------------------------------------------------------------


def test_helpers_take_transformer_engines_positional_order(gen):
    """fused_rope_forward(input, freqs, start_positions, qkv_format, interleaved, cu_seqlens,
    cp_size, cp_rank), and the backward likewise; an enum-like format by its name."""
    x = make_x((9, 2, 8), torch.float32, gen)
    freqs = make_freqs(12, 8, gen)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    start = torch.tensor([1, 2], dtype=torch.int32)
    y = fused_rope_forward(x, freqs, start, "thd", True, cu, 1, 0)
    ref, mag = reference(x, freqs, "thd", True, start=[1, 2], cu=[0, 4, 9])
    assert_within(y, ref, fused_bound(ref, mag, torch.float32), "forward")

    class QKVFormat:
        name = "THD"

    g = fused_rope_backward(x, freqs, start, QKVFormat(), True, cu, 1, 0)
    ref_b, mag_b = reference(x, freqs, "thd", True, start=[1, 2], cu=[0, 4, 9], backward=True)
    assert_within(g, ref_b, fused_bound(ref_b, mag_b, torch.float32), "backward")


def test_freqs_of_another_dtype_are_made_float32(gen):
    x = make_x((5, 2, 3, 8), torch.float32, gen)
    freqs = make_freqs(5, 8, gen)
    assert torch.equal(fused_rope_forward(x, freqs.double()), fused_rope_forward(x, freqs))


def test_int64_offsets_are_accepted(gen):
    x = make_x((9, 2, 8), torch.float32, gen)
    freqs = make_freqs(12, 8, gen)
    a = fused_rope_forward(x, freqs, torch.tensor([1, 0]), "thd", False, torch.tensor([0, 4, 9]))
    b = fused_rope_forward(x, freqs, torch.tensor([1, 0], dtype=torch.int32), "thd", False,
                           torch.tensor([0, 4, 9], dtype=torch.int32))
    assert torch.equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_inputs(fmt):
    shape = {"sbhd": (0, 2, 3, 8), "bshd": (2, 0, 3, 8), "thd": (0, 3, 8)}[fmt]
    x = torch.empty(shape, requires_grad=True)
    cu = torch.tensor([0, 0], dtype=torch.int32) if fmt == "thd" else None
    y = apply_rotary_pos_emb(x, torch.zeros(4, 1, 1, 8), fmt, fused=True, cu_seqlens=cu)
    assert y.shape == shape
    y.sum().backward()
    assert x.grad.shape == shape


# ---- errors ------------------------------------------------------------------------------------


def _thd_args():
    return torch.zeros(9, 3, 8), torch.zeros(12, 1, 1, 8), torch.tensor([0, 4, 9], dtype=torch.int32)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_api_errors_name_the_argument(fused):
    x, freqs, cu = _thd_args()
    with pytest.raises(ValueError, match="tensor_format must be 'sbhd', 'bshd' or 'thd', got 'hsbd'"):
        apply_rotary_pos_emb(x, freqs, "hsbd", fused=fused)
    with pytest.raises(ValueError, match="cu_seqlens must be given for tensor_format 'thd'"):
        apply_rotary_pos_emb(x, freqs, "thd", fused=fused)
    with pytest.raises(ValueError, match="start_positions is not supported with context parallelism"):
        apply_rotary_pos_emb(x, freqs, "thd", fused=fused, cu_seqlens=cu, start_positions=cu[:2], cp_size=2)
    with pytest.raises(ValueError, match="cp_rank < cp_size"):
        apply_rotary_pos_emb(x, freqs, "thd", fused=fused, cu_seqlens=cu, cp_size=2, cp_rank=2)
    with pytest.raises(ValueError, match="freqs must be 4D \\[s2, 1, 1, d2\\]"):
        apply_rotary_pos_emb(x, freqs.view(12, 8), "thd", fused=fused, cu_seqlens=cu)
    with pytest.raises(ValueError, match="d2 = 10"):
        apply_rotary_pos_emb(x, torch.zeros(12, 1, 1, 10), "thd", fused=fused, cu_seqlens=cu)
    with pytest.raises(ValueError, match="freqs has 3 positions"):
        apply_rotary_pos_emb(torch.zeros(4, 2, 3, 8), freqs[:3], "sbhd", fused=fused)
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        apply_rotary_pos_emb(x, freqs, "thd", fused=fused, cu_seqlens=torch.tensor([0, 5, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="sequence length s must be even|sequence length must be even"):
        apply_rotary_pos_emb(torch.zeros(3, 2, 3, 8), freqs, "sbhd", fused=fused, cp_size=2)


def test_helper_errors_name_the_argument():
    x, freqs, cu = _thd_args()
    with pytest.raises(TypeError, match="input must be float16, bfloat16 or float32, got torch.int32"):
        fused_rope_forward(x.int(), freqs, None, "thd", False, cu)
    with pytest.raises(TypeError, match="output_grads must be float16, bfloat16 or float32"):
        fused_rope_backward(x.long(), freqs, None, "thd", False, cu)
    with pytest.raises(ValueError, match="input must be 3D \\[t, h, d\\] for qkv_format 'thd', got shape \\(9, 24\\)"):
        fused_rope_forward(x.view(9, 24), freqs, None, "thd", False, cu)
    with pytest.raises(ValueError, match="output_grads must be 4D \\[s, b, h, d\\]"):
        fused_rope_backward(x, freqs)
    with pytest.raises(ValueError, match="qkv_format must be 'sbhd', 'bshd' or 'thd', got 'sbh'"):
        fused_rope_forward(x, freqs, qkv_format="sbh")
    with pytest.raises(ValueError, match="cu_seqlens is only for qkv_format 'thd'"):
        fused_rope_forward(torch.zeros(4, 2, 3, 8), freqs, None, "sbhd", False, cu)
    with pytest.raises(TypeError, match="cu_seqlens must be int32 \\(or int64\\), got torch.float32"):
        fused_rope_forward(x, freqs, None, "thd", False, cu.float())
    with pytest.raises(ValueError, match="start_positions shape must be \\[2\\]"):
        fused_rope_forward(x, freqs, torch.tensor([0, 1, 2], dtype=torch.int32), "thd", False, cu)
    with pytest.raises(ValueError, match="freqs last dim d2 must be even"):
        fused_rope_forward(x, torch.zeros(12, 1, 1, 7), None, "thd", False, cu)
    with pytest.raises(TypeError, match="freqs must be a float tensor"):
        fused_rope_forward(x, freqs.int(), None, "thd", False, cu)


@requires_cuda
def test_mismatched_devices_cuda():
    x, freqs, cu = _thd_args()
    with pytest.raises(ValueError, match="freqs is on cpu but input is on cuda:0"):
        fused_rope_forward(x.cuda(), freqs, None, "thd", False, cu.cuda())
    with pytest.raises(ValueError, match="cu_seqlens is on cpu but input is on cuda:0"):
        fused_rope_forward(x.cuda(), freqs.cuda(), None, "thd", False, cu)


# ---- RotaryPositionEmbedding -------------------------------------------------------------------


def reference_freqs(dim, s, offset=0, rotary_percent=1.0, base=10000.0, interleaved=False, scale=1.0):
    rot = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
    half = (rot + 1) // 2
    inv = [base ** (-(2.0 * i) / rot) for i in range(half)]
    rows = []
    for p in range(s):
        angles = [(p + offset) * scale * v for v in inv]
        rows.append([a for a in angles for _ in (0, 1)] if interleaved else angles + angles)
    return torch.tensor(rows, dtype=torch.float64).reshape(s, 1, 1, -1)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dim,rotary_percent", [(64, 1.0), (128, 0.5), (80, 0.25), (10, 1.0)])
def test_rotary_position_embedding(dim, rotary_percent, interleaved):
    rpe = RotaryPositionEmbedding(dim, rotary_percent=rotary_percent, interleaved=interleaved, rotary_base=500.0)
    freqs = rpe(37, offset=5)
    want = reference_freqs(dim, 37, 5, rotary_percent, 500.0, interleaved)
    assert freqs.dtype == torch.float32 and freqs.shape == want.shape
    # inv_freq is a float32 power (a few ulps) times an exact integer position: 1e-6 relative.
    torch.testing.assert_close(freqs.cpu().double(), want, rtol=1e-6, atol=0)
    assert "inv_freq" in rpe.state_dict()


@pytest.mark.parametrize("max_seq_len,scale", [(100, 1 / 4), (1000, 128 / 1000)], ids=["fixed", "dynamic"])
def test_position_interpolation(max_seq_len, scale):
    """Positions divided by the factor, or, past pretrained * factor, scaled to fit."""
    rpe = RotaryPositionEmbedding(32, seq_len_interpolation_factor=4, pretrained_max_position_embeddings=128)
    want = reference_freqs(32, max_seq_len, scale=scale)
    torch.testing.assert_close(rpe(max_seq_len).cpu().double(), want, rtol=1e-6, atol=0)


def test_exports():
    assert te.RotaryPositionEmbedding is RotaryPositionEmbedding
    assert te.apply_rotary_pos_emb is apply_rotary_pos_emb
    assert te.attention.apply_rotary_pos_emb is apply_rotary_pos_emb
    assert "transformer_engine.pytorch" in type(RotaryPositionEmbedding(8)).__module__


def test_end_to_end_with_the_module(gen):
    """As a model uses it: angles from the module, q rotated fused and unfused, in bf16."""
    rpe = RotaryPositionEmbedding(64, rotary_percent=0.5).to("cpu")
    q = make_x((16, 2, 4, 64), torch.bfloat16, gen)
    freqs = rpe(16)
    ref, mag = reference(q, freqs, "sbhd")
    assert_within(apply_rotary_pos_emb(q, freqs, fused=True), ref, fused_bound(ref, mag, torch.bfloat16), "fused")
    assert_within(apply_rotary_pos_emb(q, freqs), ref, unfused_bound(mag, torch.bfloat16), "unfused")


# ---- CUDA against the CPU core -------------------------------------------------------------------


def core_rope(x, freqs, fmt, interleaved=False, start=None, cu=None, backward=False):
    """The core op on x's device into a NaN-poisoned output (unwritten elements show)."""
    y = torch.full(x.shape, math.nan, dtype=x.dtype, device=x.device)
    desc, strides = describe_view(x, "x")
    op = _core.rope_bwd if backward else _core.rope_fwd
    fmt_enum = {"sbhd": _core.RopeFormat.SBHD, "bshd": _core.RopeFormat.BSHD, "thd": _core.RopeFormat.THD}[fmt]
    op(desc, strides, describe(freqs, "freqs"), describe(cu, "cu") if cu is not None else None,
       describe(start, "start") if start is not None else None, describe(y, "y"), int(fmt_enum), interleaved, 1, 0,
       stream_of(x))
    return y


def check_cuda_against_cpu(x, freqs, fmt, interleaved=False, start=None, cu=None):
    """x on the GPU: forward and backward on the GPU (poisoned outputs) against the float64
    reference and the CPU core."""
    dtype = x.dtype
    to_cpu = (lambda t: t.cpu() if t is not None else None)
    for backward in (False, True):
        got = core_rope(x, freqs, fmt, interleaved, start, cu, backward)
        torch.cuda.synchronize()
        cpu = core_rope(x.cpu(), freqs.cpu(), fmt, interleaved, to_cpu(start), to_cpu(cu), backward)
        ref, mag = reference(x, freqs, fmt, interleaved, start=to_cpu(start), cu=to_cpu(cu), backward=backward)
        bound = fused_bound(ref, mag, dtype)
        what = f"{'bwd' if backward else 'fwd'} {fmt} {dtype_id(dtype)} {tuple(x.shape)}"
        assert_within(got, ref, bound, what + " vs float64")
        step = UNIT[dtype] * 2 * ref.abs() + TINY[dtype]
        assert_within(got, cpu.double(), 2 * bound + step, what + " vs CPU core")


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape,d2", [((1, 1, 1, 2), 2), ((3, 17, 5, 9), 8), ((4, 3, 2, 257), 256),
                                      ((2, 2, 33, 128), 128), ((5, 1, 3, 256), 96)],
                         ids=["1x1", "3x17_odd_d", "d257", "h33_d128", "d256_d2_96"])
def test_cuda_matches_cpu(shape, d2, dtype, interleaved, device, gen):
    for fmt in ("sbhd", "bshd"):
        x = make_x(shape, dtype, gen, device)
        check_cuda_against_cpu(x, make_freqs(shape[0] + shape[1] + 1, d2, gen, device), fmt, interleaved)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_cuda_decode_with_offsets(dtype, device, gen):
    """One new token per sequence at its cache offset: few rows, the heads split in groups."""
    x = make_x((1, 8, 32, 128), dtype, gen, device)
    freqs = make_freqs(4096, 128, gen, device)
    start = torch.tensor([0, 17, 4000, 3, 4095, 1, 2, 100], dtype=torch.int32, device=device)
    check_cuda_against_cpu(x, freqs, "sbhd", start=start)
    check_cuda_against_cpu(x.transpose(0, 1).contiguous(), freqs, "bshd", True, start=start)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_cuda_thd_many_sequences(interleaved, device, gen):
    """The binary search over cu_seqlens: 50 sequences of 0 .. 40 tokens, padding at both ends."""
    lengths = torch.randint(0, 41, (50,), generator=gen)
    cu = torch.cat((torch.tensor([3]), 3 + lengths.cumsum(0))).to(torch.int32)
    t = int(cu[-1]) + 5
    x = make_x((t, 4, 64), torch.bfloat16, gen, device)
    start = torch.randint(0, 20, (50,), generator=gen, dtype=torch.int32)
    check_cuda_against_cpu(x, make_freqs(64, 64, gen, device), "thd", interleaved, start=start.to(device),
                           cu=cu.to(device))


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_cuda_large(dtype, device, gen):
    """A training shape: s 2048, b 2, 16 heads of 128, fully and half rotated."""
    x = make_x((2048, 2, 16, 128), dtype, gen, device)
    for d2 in (128, 64):
        check_cuda_against_cpu(x, make_freqs(2048, d2, gen, device), "sbhd")

# ==== Branches no CUDA test took before the forty-seventh session's audit ======================
# positions past freqs in the vectorized kernels (the NaN test above is element-wise), nothing
# rotated (d2 = 0), thd with no sequence, the vector path's stride rule, one head group.

CPU_AND_CUDA = ["cpu"] + CUDA


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype,d", [(torch.float32, 8), (torch.bfloat16, 16)], ids=["fp32_d8", "bf16_d16"])
def test_positions_past_freqs_vectorized(dtype, d, fmt, interleaved, device, gen):
    """d2 = d on vector boundaries (the 16-byte kernels), some offsets past freqs: NaN in
    exactly the reference's places, forward and backward; the rest within the bound."""
    x = make_x(shape_of(fmt, d=d), dtype, gen, device)
    freqs = make_freqs(12, d, gen, device)
    start = [0, 0, 8, 0] if fmt == "thd" else [0, 9]
    cu_list = [0, 3, 3, 10, 17]
    cu = torch.tensor(cu_list, dtype=torch.int32, device=device) if fmt == "thd" else None
    start_t = torch.tensor(start, dtype=torch.int32, device=device)
    for backward in (False, True):
        op = fused_rope_backward if backward else fused_rope_forward
        y = op(x, freqs, start_t, fmt, interleaved, cu)
        ref, mag = reference(x, freqs, fmt, interleaved, start=start, cu=cu_list, backward=backward)
        nan = torch.isnan(ref)
        assert nan.any()
        assert torch.equal(torch.isnan(y.cpu()), nan)
        keep = ~nan
        assert_within(y.cpu()[keep], ref[keep], fused_bound(ref, mag, dtype)[keep], f"backward={backward}")


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("fmt", ["sbhd", "thd"])
@pytest.mark.parametrize("dtype,d", [(torch.float32, 8), (torch.bfloat16, 16), (torch.float16, 7)],
                         ids=["fp32_vec", "bf16_vec", "fp16_elementwise"])
def test_nothing_rotated_d2_zero(dtype, d, fmt, device, gen):
    """freqs [s2, 1, 1, 0]: every feature is copied, forward and backward, bit for bit."""
    x = make_x(shape_of(fmt, d=d), dtype, gen, device)
    freqs = torch.zeros(20, 1, 1, 0, device=device)
    cu = torch.tensor([0, 3, 3, 10, 17], dtype=torch.int32, device=device) if fmt == "thd" else None
    for op in (fused_rope_forward, fused_rope_backward):
        y = op(x, freqs, None, fmt, False, cu)
        assert torch.equal(y, x)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_thd_without_sequences_is_a_copy(device, gen):
    """cu_seqlens = [4]: b = 0, no token belongs to a sequence."""
    x = make_x((9, 2, 16), torch.bfloat16, gen, device)
    freqs = make_freqs(4, 16, gen, device)
    cu = torch.tensor([4], dtype=torch.int32, device=device)
    for op in (fused_rope_forward, fused_rope_backward):
        assert torch.equal(op(x, freqs, None, "thd", False, cu), x)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_stride_rule_of_the_vector_path(interleaved, device, gen):
    """fp32, d = d2 = 8 (vectors of 4): (a) the heads of a [5, 2, 3, 10] buffer cut to 8
    features: stride_h = 10 breaks the 16-byte rows (element path; a vector load there
    would be misaligned); (b) b = 1 with stride_b = 7: unused, so the vectors stay."""
    freqs = make_freqs(8, 8, gen, device)
    padded = make_x((5, 2, 3, 10), torch.float32, gen, device)[..., :8]
    base = make_x((5 * 24,), torch.float32, gen, device)
    odd_b = torch.as_strided(base, (5, 1, 3, 8), (24, 7, 8, 1))
    for name, view in (("padded heads", padded), ("b = 1, odd stride", odd_b)):
        for backward in (False, True):
            op = fused_rope_backward if backward else fused_rope_forward
            got = op(view, freqs, None, "sbhd", interleaved)
            ref, mag = reference(view, freqs, "sbhd", interleaved, backward=backward)
            assert_within(got, ref, fused_bound(ref, mag, torch.float32), f"{name} backward={backward}")


@requires_cuda
@pytest.mark.parametrize("dtype,d,d2,interleaved", [
    (torch.float32, 256, 256, False),   # vectorized, 32 units: lanes 32
    (torch.float32, 256, 256, True),    # vectorized interleaved, 64 units over 32 lanes
    (torch.bfloat16, 65, 64, False),    # element-wise, 32 units, a copied tail
], ids=["fp32_vec", "fp32_vec_interleaved_lane_loop", "bf16_elementwise"])
def test_cuda_one_head_group(dtype, d, d2, interleaved, gen):
    """Enough rows that rows x 32 lanes >= 1024 x SMs: one head group (grid.y = 1); h = 5
    makes heads_per_group 8, so the second unrolled group of a thread is partial."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = math.ceil(1024 * sms / 32)
    s, b, h = (rows + 1) // 2, 2, 5
    x = make_x((s, b, h, d), dtype, gen, "cuda")
    check_cuda_against_cpu(x, make_freqs(s, d2, gen, "cuda"), "sbhd", interleaved)
