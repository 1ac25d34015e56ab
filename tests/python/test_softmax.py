"""The softmax helpers (transformer_engine/pytorch/cpp_extensions/softmax.py) against float64
torch references on the very values the core reads (inputs stored in their dtypes first):
torch.softmax of scale * x with masked_fill for the masks (-10000 for the masked and the
aligned causal softmax, -inf for the upper-triangular one, Transformer Engine's values),
zero rows where Transformer Engine writes them, and torch.autograd for the backward.

Tolerances (the analysis of tests/cpp/test_softmax.cpp), u = 2^-24, per row A = max |scale x|
over the positions with their own logit, n = sk:
  forward   |y - ref| <= 2 (8A + n + 4) u |ref| + 2^-126, then the output dtype's rounding
            (half an ulp of |ref| and half its smallest subnormal step); masked-out
            positions exactly 0. The CUDA kernels exponentiate in base 2 (exp2 of one FMA):
            that rounds the exponent by the same |scale x| u order, inside the same bound.
  backward  on the y and dy the core reads, g = dy y, dot = sum g:
            |dx - ref| <= 2 |scale| u (2|g| + 2|y dot| + (n + 2)|y| sum|g|) + u |ref|, then
            the rounding; against autograd at x, plus what the forward's error in y moves.
CUDA: within twice the bound of the reference, and within three times of the CPU core (each
within its own bound; the two roundings to the output dtype can differ by one step).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import requires_cuda

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import softmax as S
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType, describe, stream_of

U = 2.0**-24
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
HALF_MIN_STEP = {torch.float32: 2.0**-150, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KINDS = ["scaled", "masked", "upper_triang", "aligned_causal"]
CUDA = [pytest.param("cuda", marks=requires_cuda)]

FWD = {
    "scaled": S.scaled_softmax_forward,
    "upper_triang": S.scaled_upper_triang_masked_softmax_forward,
    "aligned_causal": S.scaled_aligned_causal_masked_softmax_forward,
}
BWD = {
    "scaled": S.scaled_softmax_backward,
    "masked": S.scaled_masked_softmax_backward,
    "upper_triang": S.scaled_upper_triang_masked_softmax_backward,
    "aligned_causal": S.scaled_aligned_causal_masked_softmax_backward,
}
CORE_FWD = {
    "scaled": _core.scaled_softmax_fwd,
    "upper_triang": _core.scaled_upper_triang_masked_softmax_fwd,
    "aligned_causal": _core.scaled_aligned_causal_masked_softmax_fwd,
}
CORE_BWD = {
    "scaled": _core.scaled_softmax_bwd,
    "masked": _core.scaled_masked_softmax_bwd,
    "upper_triang": _core.scaled_upper_triang_masked_softmax_bwd,
    "aligned_causal": _core.scaled_aligned_causal_masked_softmax_bwd,
}


def f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


# ---- data --------------------------------------------------------------------------------------


def shape_of(kind: str, lead: tuple[int, int, int], sk: int) -> tuple[int, ...]:
    """[b, h, sq, sk], or for the upper-triangular kind (sq = sk) [b * h, sk, sk], one
    [sk, sk] matrix only from sk = 1000 on (it grows with sk^2)."""
    b, h, sq = lead
    if kind == "upper_triang":
        return (b * h if sk < 1000 else 1, sk, sk)
    return (b, h, sq, sk)


def make_x(shape, dtype, sigma, gen, device="cpu"):
    return (sigma * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype).to(device)


def make_mask(shape, gen, per_batch=True, density=0.4, device="cpu"):
    """A bool mask [b or 1, 1, sq, sk], about `density` True, with query row 1 (if any)
    fully masked."""
    b, _, sq, sk = shape
    mask = torch.rand((b if per_batch else 1, 1, sq, sk), generator=gen) < density
    if sq > 1:
        mask[:, :, 1, :] = True
    return mask.to(device)


def causal_masked(kind: str, shape) -> torch.Tensor:
    """True where a causal kind masks position j of query row i ([sq, sk]); all False otherwise."""
    sq, sk = shape[-2], shape[-1]
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(sk).unsqueeze(0)
    if kind == "upper_triang":
        return j > i
    if kind == "aligned_causal":
        return j > i + (sk - sq)
    return torch.zeros(sq, sk, dtype=torch.bool)


# ---- float64 references -------------------------------------------------------------------------


def reference_logits(kind, x64, mask, scale):
    """The logits the core forms (in float64), and where positions are masked out."""
    z = x64 * f32(scale)
    if kind == "masked":
        masked = mask.cpu().bool().expand(z.shape)
        return z.masked_fill(masked, -10000.0), masked
    masked = causal_masked(kind, z.shape).expand(z.shape)
    fill = -math.inf if kind == "upper_triang" else -10000.0
    return z.masked_fill(masked, fill), masked


def reference_fwd(kind, x64, mask, scale):
    """float64 y (differentiable in x64), where y must be exactly 0, and the per-element bound
    before the output rounding."""
    logits, masked = reference_logits(kind, x64, mask, scale)
    y = torch.softmax(logits, -1)
    zero = torch.zeros_like(masked)
    if kind == "masked":
        zero = (logits.detach().amax(-1, keepdim=True) == -10000.0).expand(y.shape)
    elif kind != "scaled":
        zero = masked
    y = y.masked_fill(zero, 0.0)
    a = (x64.detach() * f32(scale)).abs().masked_fill(masked, 0.0).amax(-1, keepdim=True)
    n = x64.shape[-1]
    bound = 2 * (8 * a + n + 4) * U * y.detach().abs() + 2.0**-126
    return y, zero, bound


def rounded(ref, bound, dtype):
    return bound + UNIT[dtype] * (ref.abs() + bound) + HALF_MIN_STEP[dtype]


def reference_bwd(kind, dy, y, scale):
    """float64 dx of the formula on the dy and y the core reads, where it must be 0, and
    the bound before the output rounding."""
    dy64, y64 = dy.double().cpu(), y.double().cpu()
    skipped = causal_masked(kind, y64.shape).expand(y64.shape)
    g = (dy64 * y64).masked_fill(skipped, 0.0)
    dot = g.sum(-1, keepdim=True)
    abs_dot = g.abs().sum(-1, keepdim=True)
    s = f32(scale)
    dx = (s * (g - y64 * dot)).masked_fill(skipped, 0.0)
    n = y64.shape[-1]
    bound = 2 * abs(s) * U * (2 * g.abs() + 2 * (y64 * dot).abs() + (n + 2) * y64.abs() * abs_dot) + U * dx.abs()
    return dx, skipped, bound.masked_fill(skipped, 0.0)


def assert_within(got, ref, bound, what, zero=None):
    got64 = got.double().cpu()
    if zero is not None:
        bad = zero & (got64 != 0)
        assert not bad.any(), f"{what}: {int(bad.sum())} masked-out elements not 0, e.g. {got64[bad][:4].tolist()}"
    err = (got64 - ref).abs()
    over = ~(err <= bound)  # NaN counts as over
    if over.any():
        idx = over.nonzero()[0].tolist()
        t = tuple(idx)
        raise AssertionError(f"{what}: {int(over.sum())} of {got64.numel()} elements outside the bound, "
                             f"first at {t}: got {got64[t].item()!r}, want {ref[t].item()!r} +- {bound[t].item()!r}")


# ---- running the ops ----------------------------------------------------------------------------


def fwd(kind, x, mask, scale):
    if kind == "masked":
        return S.scaled_masked_softmax_forward(x, mask, scale)
    return FWD[kind](x, scale)


def core_fwd(kind, x, mask, scale, out):
    """The raw binding into a given (poisoned) output."""
    if kind == "masked":
        _core.scaled_masked_softmax_fwd(describe(x, "x"), describe(mask, "mask", dtype=DType.kByte),
                                        describe(out, "out"), scale, stream_of(x))
    else:
        CORE_FWD[kind](describe(x, "x"), describe(out, "out"), scale, stream_of(x))
    return out


def core_bwd(kind, dy, y, scale, dx):
    CORE_BWD[kind](describe(dy, "dy"), describe(y, "y"), describe(dx, "dx"), scale, stream_of(y))
    return dx


# ---- CPU against float64 ------------------------------------------------------------------------

# (lead [b, h, sq], sk, sigma of x, scale)
FWD_CASES = [
    ((2, 3, 5), 7, 2.0, 0.5),
    ((1, 2, 3), 64, 8.0, 0.125),
    ((2, 1, 4), 1, 1.0, 3.0),
    ((1, 2, 2), 257, 1.0, 1.0),
    ((1, 1, 3), 100, 300.0, 1.0),  # large-magnitude logits
    ((1, 1, 3), 5, 1.0, -2.0),
    ((2, 2, 7), 5, 2.0, 1.0),  # aligned causal: sq > sk, leading rows keep nothing
    ((1, 2, 3), 33, 2.0, 0.0),  # every kept logit 0: 1 / (positions kept)
]


def case_id(c):
    return f"lead{'x'.join(map(str, c[0]))}-sk{c[1]}-sigma{c[2]}-scale{c[3]}"


@pytest.mark.parametrize("case", FWD_CASES, ids=case_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fwd(kind, dtype, case, gen):
    lead, sk, sigma, scale = case
    shape = shape_of(kind, lead, sk)
    x = make_x(shape, dtype, sigma, gen)
    mask = make_mask(shape, gen, per_batch=lead[0] > 1) if kind == "masked" else None
    y = fwd(kind, x, mask, scale)
    assert y.shape == x.shape and y.dtype == dtype
    ref, zero, bound = reference_fwd(kind, x.double(), mask, scale)
    assert_within(y, ref, rounded(ref, bound, dtype), f"{kind} fwd", zero)


@pytest.mark.parametrize("per_batch", [False, True], ids=["mask_broadcast", "mask_per_batch"])
def test_masked_fully_masked_rows_are_zero(per_batch, gen):
    x = make_x((2, 3, 4, 9), torch.float32, 1.0, gen)
    mask = make_mask(x.shape, gen, per_batch=per_batch, density=0.2)
    mask[-1, :, 3, :] = True
    y = S.scaled_masked_softmax_forward(x, mask, 1.0)
    full = mask.expand(x.shape).all(-1)
    assert full.any()
    assert (y[full] == 0).all()
    sums = y.double().sum(-1)
    assert torch.allclose(sums[~full], torch.ones_like(sums[~full]), atol=1e-6)


def test_masked_mask_is_not_scaled_and_bool_or_uint8():
    """The masked logit is -10000 itself: with a kept logit near it, masked positions get a
    share. A uint8 mask with any nonzero value works as True."""
    x = torch.tensor([-9999.0, 5.0]).reshape(1, 1, 1, 2)
    e = math.exp(-1.0)
    for mask in (torch.tensor([False, True]), torch.tensor([0, 1], dtype=torch.uint8),
                 torch.tensor([0, 9], dtype=torch.uint8)):
        y = S.scaled_masked_softmax_forward(x, mask.reshape(1, 1, 1, 2), 1.0)
        assert y.flatten().tolist() == pytest.approx([1 / (1 + e), e / (1 + e)], rel=1e-6)


@pytest.mark.parametrize("case", FWD_CASES[:5], ids=case_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_bwd(kind, dtype, case, gen):
    lead, sk, _, scale = case
    shape = shape_of(kind, lead, sk)
    x = make_x(shape, dtype, 2.0, gen)
    mask = make_mask(shape, gen) if kind == "masked" else None
    y = fwd(kind, x, mask, scale)
    dy = make_x(shape, dtype, 1.0, gen)
    dy_before = dy.clone()
    ref, zero, bound = reference_bwd(kind, dy_before, y, scale)
    dx = BWD[kind](dy, y, scale)
    # Transformer Engine's contract: the gradient lands in output_grads, which is returned
    assert dx is dy
    assert_within(dx, ref, rounded(ref, bound, dtype), f"{kind} bwd", zero)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_bwd_matches_autograd(kind, dtype, gen):
    """Forward then backward through the core against torch.autograd of the float64
    reference at x: the formula's bound plus what the forward's error in y moves."""
    shape = shape_of(kind, (2, 2, 6), 11)
    scale = 0.75
    x = make_x(shape, dtype, 2.0, gen)
    mask = make_mask(shape, gen) if kind == "masked" else None
    dy = make_x(shape, dtype, 1.0, gen)
    x64 = x.double().requires_grad_()
    y_ref, _, fwd_bound = reference_fwd(kind, x64, mask, scale)
    (dx_ref,) = torch.autograd.grad(y_ref, x64, dy.double())
    y = fwd(kind, x, mask, scale)
    _, _, bwd_bound = reference_bwd(kind, dy, y, scale)
    dx = BWD[kind](dy.clone(), y, scale)
    dy64, y64 = dy.double(), y.double()
    y_err = rounded(y_ref.detach(), fwd_bound, dtype)  # bound on |y - y_ref|
    dot = (dy64 * y64).sum(-1, keepdim=True)
    moved = abs(scale) * (y_err * (dy64.abs() + dot.abs()) + y64.abs() * (y_err * dy64.abs()).sum(-1, keepdim=True))
    assert_within(dx, dx_ref, rounded(dx_ref, bwd_bound + moved, dtype), f"{kind} bwd vs autograd")


@pytest.mark.parametrize("kind", KINDS)
def test_noncontiguous_inputs(kind, gen):
    """Transposed views are copied to contiguous ones first (the backward then returns the
    copy, as Transformer Engine's .contiguous() does)."""
    shape = shape_of(kind, (2, 2, 5), 5)
    x = make_x(shape, torch.float32, 1.0, gen).transpose(-1, -2)
    mask = make_mask(shape, gen) if kind == "masked" else None
    y = fwd(kind, x, mask, 1.0)
    assert torch.equal(y, fwd(kind, x.contiguous(), mask, 1.0))
    dy = make_x(shape, torch.float32, 1.0, gen).transpose(-1, -2)
    dx = BWD[kind](dy, y, 1.0)
    assert dx is not dy and dx.is_contiguous()
    assert torch.equal(dx, BWD[kind](dy.contiguous(), y, 1.0))


@pytest.mark.parametrize("kind", KINDS)
def test_empty(kind):
    shape = (0, 4, 4) if kind == "upper_triang" else (2, 0, 3, 4)
    x = torch.empty(shape, dtype=torch.bfloat16)
    mask = torch.zeros(1, 1, 3, 4, dtype=torch.bool)
    assert fwd(kind, x, mask, 1.0).shape == shape
    assert BWD[kind](x.clone(), x, 1.0).shape == shape


# ---- bad arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,exc,pattern",
    [
        (lambda: S.scaled_softmax_forward([[1.0]], 1.0), TypeError, r"input must be a torch.Tensor, got list"),
        (lambda: S.scaled_softmax_forward(torch.ones(1, 1, 2, 2, dtype=torch.float64), 1.0), TypeError,
         r"input must be float16, bfloat16 or float32, got torch.float64"),
        (lambda: S.scaled_softmax_forward(torch.ones(2, 2, 2), 1.0), ValueError,
         r"input must be 4D \[b, h, sq, sk\], got shape \(2, 2, 2\)"),
        (lambda: S.scaled_softmax_forward(torch.ones(1, 1, 2, 2), float("nan")), ValueError,
         r"scale_factor must be finite, got nan"),
        (lambda: S.scaled_softmax_forward(torch.ones(1, 1, 2, 2), "two"), TypeError,
         r"scale_factor must be a number, got str"),
        (lambda: S.scaled_upper_triang_masked_softmax_forward(torch.ones(2, 3, 4), 1.0), ValueError,
         r"input must be square in its last two dims \(sq == sk\), got shape \(2, 3, 4\)"),
        (lambda: S.scaled_upper_triang_masked_softmax_forward(torch.ones(1, 2, 3, 3), 1.0), ValueError,
         r"input must be 3D \[attn_batches, sq, sk\]"),
        (lambda: S.scaled_aligned_causal_masked_softmax_forward(torch.ones(3, 3), 1.0), ValueError,
         r"input must be 4D"),
        (lambda: S.scaled_masked_softmax_forward(torch.ones(2, 2, 3, 4), torch.ones(1, 1, 3, 4), 1.0), TypeError,
         r"mask must be bool or uint8, got torch.float32"),
        (lambda: S.scaled_masked_softmax_forward(torch.ones(2, 2, 3, 4), None, 1.0), TypeError,
         r"mask must be a torch.Tensor, got NoneType"),
        (lambda: S.scaled_masked_softmax_forward(torch.ones(2, 2, 3, 4), torch.ones(1, 2, 3, 4, dtype=torch.bool),
                                                 1.0), ValueError,
         r"mask shape \(1, 2, 3, 4\) must be \[2 or 1, 1, 3, 4\] for input shape \(2, 2, 3, 4\)"),
        (lambda: S.scaled_masked_softmax_forward(torch.ones(2, 2, 3, 4), torch.ones(3, 1, 3, 4, dtype=torch.bool),
                                                 1.0), ValueError, r"mask shape \(3, 1, 3, 4\) must be \[2 or 1"),
        (lambda: S.scaled_masked_softmax_forward(torch.ones(2, 2, 3, 4), torch.ones(2, 1, 3, 5, dtype=torch.bool),
                                                 1.0), ValueError, r"mask shape \(2, 1, 3, 5\)"),
        (lambda: S.scaled_softmax_backward(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 3), 1.0), ValueError,
         r"output_grads shape \(1, 1, 2, 2\) must equal softmax_results shape \(1, 1, 2, 3\)"),
        (lambda: S.scaled_softmax_backward(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2, dtype=torch.float16), 1.0),
         TypeError, r"output_grads dtype torch.float32 must equal softmax_results dtype torch.float16"),
        (lambda: S.scaled_softmax_backward(torch.ones(1, 1, 2, 2, dtype=torch.int32), torch.ones(1, 1, 2, 2), 1.0),
         TypeError, r"output_grads must be float16, bfloat16 or float32, got torch.int32"),
        (lambda: S.scaled_masked_softmax_backward(torch.ones(1, 2, 2), torch.ones(1, 2, 2), 1.0), ValueError,
         r"output_grads must be 4D"),
        (lambda: S.scaled_upper_triang_masked_softmax_backward(torch.ones(1, 2, 3), torch.ones(1, 2, 3), 1.0),
         ValueError, r"output_grads must be square in its last two dims"),
        (lambda: S.scaled_aligned_causal_masked_softmax_backward(torch.ones(1, 1, 2, 2), "y", 1.0), TypeError,
         r"softmax_results must be a torch.Tensor, got str"),
        (lambda: S.scaled_softmax_backward(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2), float("inf")),
         ValueError, r"scale_factor must be finite, got inf"),
    ],
)
def test_helper_errors(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


def test_bwd_output_grads_is_softmax_results():
    """In place into the forward's own output is refused by the core (dx would overwrite y)."""
    y = torch.full((1, 1, 2, 4), 0.25)
    with pytest.raises(ValueError, match=r"te_scaled_softmax_bwd: grad_input must not overlap softmax_output"):
        S.scaled_softmax_backward(y, y, 1.0)


def test_core_errors():
    """The raw binding raises the core's messages: op name, argument, expectation."""
    x = torch.ones(2, 3, 4, 4)
    y = torch.empty_like(x)
    with pytest.raises(ValueError, match=r"te_scaled_masked_softmax_fwd: mask dtype must be uint8"):
        _core.scaled_masked_softmax_fwd(describe(x, "x"), describe(x, "m"), describe(y, "y"), 1.0)
    with pytest.raises(ValueError, match=r"te_scaled_upper_triang_masked_softmax_fwd: input must be 3D"):
        _core.scaled_upper_triang_masked_softmax_fwd(describe(x, "x"), describe(y, "y"), 1.0)
    with pytest.raises(ValueError, match=r"te_scaled_softmax_fwd: output must not overlap input"):
        _core.scaled_softmax_fwd(describe(x, "x"), describe(x, "x"), 1.0)
    half = torch.empty_like(x, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"te_scaled_softmax_bwd: grad_input dtype must equal softmax_output "
                                         r"dtype float32, got float16"):
        _core.scaled_softmax_bwd(describe(x, "dy"), describe(y, "y"), describe(half, "dx"), 1.0)
    cuda_out = _core.Tensor(1, 0, int(DType.kFloat32), [2, 3, 4, 4], y.data_ptr())
    err = ValueError if _core.built_with_cuda() else NotImplementedError
    with pytest.raises(err, match=r"te_scaled_softmax_fwd: output"):
        _core.scaled_softmax_fwd(describe(x, "x"), cuda_out, 1.0)


# ---- CUDA against the CPU core and float64 -------------------------------------------------------


def check_cuda_fwd(kind, dtype, lead, sk, sigma, scale, gen, misalign=False, per_batch=None):
    """per_batch: the explicit mask [b, 1, sq, sk] (True) or one for every batch [1, 1, sq,
    sk] (False); by default per batch where there are several."""
    shape = shape_of(kind, lead, sk)
    x_cpu = make_x(shape, dtype, sigma, gen)
    per_batch = lead[0] > 1 if per_batch is None else per_batch
    mask = make_mask(shape, gen, per_batch=per_batch) if kind == "masked" else None
    x = x_cpu.cuda()
    if misalign:  # a view one element into its storage: no 16-byte vectors
        buf = torch.empty(x.numel() + 1, dtype=dtype, device="cuda")
        buf[1:].copy_(x.flatten())
        x = buf[1:].view(shape)
    out = torch.full(shape, float("nan"), dtype=dtype, device="cuda")  # unwritten elements show
    got = core_fwd(kind, x, mask.cuda() if mask is not None else None, scale, out)
    cpu = fwd(kind, x_cpu, mask, scale)
    ref, zero, bound = reference_fwd(kind, x_cpu.double(), mask, scale)
    b = rounded(ref, bound, dtype)
    assert_within(got, ref, 2 * b, f"{kind} fwd cuda", zero)
    assert_within(got, cpu.double(), 3 * b, f"{kind} fwd cuda vs cpu")
    return x_cpu, cpu


def check_cuda_bwd(kind, dtype, lead, sk, scale, gen, misalign=False, per_batch=None):
    shape = shape_of(kind, lead, sk)
    x_cpu, y_cpu = check_cuda_fwd(kind, dtype, lead, sk, 2.0, scale, gen, misalign, per_batch)
    dy_cpu = make_x(shape, dtype, 1.0, gen)
    dx = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    y = y_cpu.cuda()
    dy = dy_cpu.cuda()
    if misalign:
        buf = torch.empty(dx.numel() + 1, dtype=dtype, device="cuda")
        dx = buf[1:].view(shape).fill_(float("nan"))
    got = core_bwd(kind, dy, y, scale, dx)
    ref, zero, bound = reference_bwd(kind, dy_cpu, y_cpu, scale)
    cpu = BWD[kind](dy_cpu.clone(), y_cpu, scale)
    b = rounded(ref, bound, dtype)
    assert_within(got, ref, 2 * b, f"{kind} bwd cuda", zero)
    assert_within(got, cpu.double(), 3 * b, f"{kind} bwd cuda vs cpu")
    # in place (Transformer Engine's way): the same bits as into another buffer of the
    # same alignment (a misaligned one takes the element-wise path, another summation order)
    in_place = core_bwd(kind, dy, y, scale, dy)
    if misalign:
        assert_within(in_place, ref, 2 * b, f"{kind} bwd cuda in place", zero)
    else:
        assert torch.equal(in_place, got)


# sk values for every layout: 16-byte vectors of 2, 4 and 8 a thread in sub-warp, warp
# and multi-warp groups (3000: three warps, a count not a power of two; the whole-row
# forwards' 3 a thread at 700, 1536 and 2047 for 16-bit rows (in one, two and three
# warps) and at 257 and 700 for fp32 (in one warp and in two); the causal
# forwards' and the backward's 6 at 1536 and 2047, and for 16-bit rows at 3000 and
# 4099 too; the backward's in power-of-two groups at 12000), for sk not a
# multiple of the vector too (odd: vectors shifted to each row's start, the explicit
# mask's bytes too; sk 1 and 3 shorter than a vector, so that rows before the last reach
# the buffer's end); rows split over clusters of 2 to 8 blocks (sm_90: 20001, 40001 and
# 70001 shifted, 40000 and 131072 aligned); and the long-row kernels (270000 in vectors,
# 270001 element by element).
SMALL_SK = [1, 3, 8, 17, 64, 128, 257, 700, 1000, 1536, 2047, 2048]
LARGE_SK = [3000, 4096, 4099, 8200, 12000, 16384, 20000, 20001, 40000, 40001, 131072, 70001, 270000, 270001]


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", SMALL_SK, ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fwd_cuda(kind, dtype, sk, device, gen):
    check_cuda_fwd(kind, dtype, (2, 3, 5), sk, 2.0, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", SMALL_SK, ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_bwd_cuda(kind, dtype, sk, device, gen):
    check_cuda_bwd(kind, dtype, (2, 3, 5), sk, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", [64, 2048], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("kind", KINDS)
def test_misaligned_cuda(kind, sk, device, gen):
    """Buffers off 16-byte alignment take the element-by-element path."""
    check_cuda_bwd(kind, torch.bfloat16, (1, 2, 3), sk, 1.0, gen, misalign=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_large_logits_cuda(kind, dtype, device, gen):
    check_cuda_fwd(kind, dtype, (2, 2, 3), 300, 1000.0, 1.0, gen)


@pytest.mark.parametrize("device", CUDA)
# the rows kernel (2047: vectors shifted to each row's start), one split over clusters
# (sm_90), the long-row kernel
@pytest.mark.parametrize("sk", [2048, 2047, 40000, 270000], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fwd_special_logits_cuda(dtype, sk, device, gen):
    """Logits the running max must not mishandle: -inf ones give 0 and leave the row's
    others as torch's softmax has them; a +inf or a NaN makes its row NaN, and so does a
    row of -inf only (torch's exp(-inf - -inf)); rows after them are unaffected."""
    x = make_x((1, 1, 6, sk), dtype, 2.0, gen)
    x[0, 0, 0, [0, 5, sk // 2, sk - 1]] = -math.inf
    x[0, 0, 1, sk // 3] = math.inf
    x[0, 0, 2, 7] = math.nan
    x[0, 0, 3] = -math.inf
    x[0, 0, 4, : sk - 9] = -math.inf  # only its last nine logits finite: -inf maxima until then
    got = core_fwd("scaled", x.cuda(), None, 1.5, torch.empty_like(x, device="cuda")).cpu().double()
    ref = torch.softmax(x.double() * f32(1.5), -1)
    assert torch.equal(got.isnan(), ref.isnan()) and got[0, 0, 1:4].isnan().all()
    finite = ~ref.isnan()
    # the forward's bound (the module docstring) with A over the finite logits, twice for CUDA,
    # plus the output dtype's rounding
    a = (x.double() * f32(1.5)).abs()[x.isfinite()].max().item()
    rtol = 4 * (8 * a + sk + 4) * 2.0**-24 + (0 if dtype == torch.float32 else 2.0**-8)
    assert torch.allclose(got[finite], ref[finite], rtol=rtol, atol=2.0**-125)
    assert (got[0, 0, 0, [0, 5, sk // 2, sk - 1]] == 0).all() and (got[0, 0, 4, : sk - 9] == 0).all()


@pytest.mark.parametrize("device", ["cpu", *CUDA])
# CUDA: the rows kernels that keep their exponentials (aligned and shifted rows), and at
# 20000 fp32 split over clusters (sm_90), bf16 the long-row kernel
@pytest.mark.parametrize("sk", [2048, 2047, 20000], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_masked_fwd_special_logits(dtype, sk, device, gen):
    """The explicit mask with logits the max must not mishandle: unmasked -inf ones give 0;
    a row whose unmasked logits are all -inf has the masked logit for its max and is zeros
    (Transformer Engine's rule), as is a fully masked row; an unmasked NaN or +inf makes its
    row NaN, where a masked one is only masked."""
    shape = (1, 1, 6, sk)
    x = make_x(shape, dtype, 2.0, gen)
    mask = make_mask(shape, gen, density=0.3)  # row 1 fully masked
    some = [0, 5, sk // 2, sk - 1]
    x[0, 0, 0, some] = -math.inf
    mask[0, 0, 0, some] = False
    x[0, 0, 2] = -math.inf  # row 2: every unmasked logit -inf
    mask[0, 0, 2, :3] = True
    x[0, 0, 3, 7] = math.nan
    mask[0, 0, 3, 7] = False
    x[0, 0, 4, 7], x[0, 0, 4, 8] = math.nan, math.inf  # masked: no effect
    mask[0, 0, 4, 7:9] = True
    x[0, 0, 5, sk // 3] = math.inf
    mask[0, 0, 5, sk // 3] = False
    out = torch.full(shape, 0.5, dtype=dtype, device=device)  # unwritten elements show
    got = core_fwd("masked", x.to(device), mask.to(device), 1.5, out).cpu().double()
    logits = (x.double() * f32(1.5)).masked_fill(mask, -10000.0)
    ref = torch.softmax(logits, -1)
    zero = (logits.amax(-1, keepdim=True) == -10000.0).expand(shape)
    ref = ref.masked_fill(zero, 0.0)
    assert torch.equal(got.isnan(), ref.isnan()) and got[0, 0, [3, 5]].isnan().all()
    assert (got[0, 0, 1:3] == 0).all() and (got[0, 0, 0, some] == 0).all()
    finite = ~ref.isnan()
    # the forward's bound (the module docstring) with A over the finite unmasked logits, twice
    # for CUDA, plus the output dtype's rounding
    a = logits.abs()[x.isfinite() & ~mask].max().item()
    rtol = 4 * (8 * a + sk + 4) * 2.0**-24 + (0 if dtype == torch.float32 else 2.0**-8)
    assert torch.allclose(got[finite], ref[finite], rtol=rtol, atol=2.0**-125)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", LARGE_SK, ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fwd_bwd_cuda_large(kind, dtype, sk, device, gen):
    if kind == "upper_triang" and sk > 4099:
        pytest.skip("[1, sk, sk] at this sk is too big for a unit test")
    check_cuda_bwd(kind, dtype, (1, 2, 3), sk, 0.25, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("kind", ["upper_triang", "aligned_causal"])
def test_causal_split_rows_cuda_large(kind, device, gen):
    """Causal rows of every kept prefix, from one element to the whole row, at sk 8195: one
    [8195, 8195] matrix in shifted 16-byte vectors, 160 threads a row (written when these
    rows went element by element and split over two blocks; the split is now
    test_causal_split_rows_misaligned_cuda_large's)."""
    check_cuda_bwd(kind, torch.bfloat16, (1, 1, 8195), 8195, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
def test_many_rows_cuda_large(device, gen):
    """Many rows: thousands of blocks, warp and sub-warp rows (16 rows a block at sk = 96),
    a per-batch mask at sk = 2047 (x's and the mask's rows at every shift in a vector),
    and rows split over clusters (sm_90), more than the GPU holds at once, so that each
    cluster strides over several: the backward at sk = 65536 (two blocks a row; the bf16
    masked forward keeps the long-row kernel), the fp32 masked forward at 20000 (three
    blocks), the causal rows at 40001 (vectors shifted to each row's start)."""
    check_cuda_bwd("aligned_causal", torch.bfloat16, (2, 16, 512), 512, 0.125, gen)
    check_cuda_bwd("masked", torch.float16, (3, 8, 256), 96, 1.0, gen)
    check_cuda_bwd("masked", torch.bfloat16, (3, 5, 64), 2047, 1.0, gen)
    check_cuda_bwd("masked", torch.bfloat16, (2, 4, 16), 65536, 1.0, gen)
    check_cuda_bwd("masked", torch.float32, (2, 2, 64), 20000, 1.0, gen)
    check_cuda_bwd("aligned_causal", torch.bfloat16, (1, 2, 128), 40001, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
def test_rows_past_2_31_cuda_large(device):
    """Rows past 2^31 (2 x 2^30 + 16 of sk = 2): the row kernels divide a row's index by
    multiplies (softmax_rows.cuh, RowIndex), exact below 2^31 only, so these take the
    long-row kernel. The rows around 2^31 and the last ones are checked against float64:
    the masked forward and backward with a mask a batch (the second batch's rows lie past
    2^31), and the aligned causal forward, whose last rows of a matrix keep 2, 1 and 0
    positions. About 28 GiB of GPU memory."""
    free, _ = torch.cuda.mem_get_info()
    if free < 40 * 2**30:
        pytest.skip("needs about 40 GiB of free GPU memory")
    b, sq, sk, scale = 2, 2**30 + 8, 2, 0.75
    rows = b * sq
    assert rows > 2**31
    cuda_gen = torch.Generator(device="cuda")
    cuda_gen.manual_seed(5)
    # drawn in their own dtypes: fp32 copies of these would take 16 GiB each
    x = torch.randn(b, 1, sq, sk, device="cuda", dtype=torch.bfloat16, generator=cuda_gen)
    mask = torch.randint(0, 10, (b, 1, sq, sk), device="cuda", dtype=torch.uint8, generator=cuda_gen) < 3
    # the first rows, and from 64 before 2^31 to the last (rows is 2^31 + 16)
    picked = torch.cat([torch.arange(0, 64), torch.arange(2**31 - 64, rows)])
    picked = picked.cuda()

    def rows_of(t):  # [rows, sk] float64 of the picked rows
        return t.reshape(rows, sk)[picked].double()

    y = S.scaled_masked_softmax_forward(x, mask, scale)
    x_rows, m_rows = rows_of(x), mask.reshape(rows, sk)[picked]
    ref = torch.softmax((x_rows * scale).masked_fill(m_rows, -10000.0), -1)
    ref[m_rows.all(-1)] = 0.0  # Transformer Engine's zero rows
    torch.testing.assert_close(rows_of(y), ref, rtol=2**-8, atol=2**-9)

    dy = torch.randn(b, 1, sq, sk, device="cuda", dtype=torch.bfloat16, generator=cuda_gen)
    dy_rows, y_rows = rows_of(dy), rows_of(y)
    dx = S.scaled_masked_softmax_backward(dy, y, scale)  # in place, into dy
    g = dy_rows * y_rows
    ref_dx = scale * (g - y_rows * g.sum(-1, keepdim=True))
    torch.testing.assert_close(rows_of(dx), ref_dx, rtol=2**-7, atol=2**-8)
    del y, dy, dx, mask

    y = S.scaled_aligned_causal_masked_softmax_forward(x, scale)
    i = picked % sq
    kept = (i + (sk - sq) + 1).clamp(0, sk)
    past = torch.arange(sk, device="cuda")[None, :] >= kept[:, None]
    # the positions past the kept prefix count in the sum at -10000 and are written as 0
    ref = torch.softmax((x_rows * scale).masked_fill(past, -10000.0), -1).masked_fill(past, 0.0)
    assert kept[-3:].tolist() == [0, 1, 2]
    torch.testing.assert_close(rows_of(y), ref, rtol=2**-8, atol=2**-9)


# ---- CUDA: row lengths, scales and masks the lists above leave out -----------------------------


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", [40, 136, 150, 768, 1025, 2304, 12001], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_fwd_bwd_cuda_more_row_lengths(kind, dtype, sk, device, gen):
    """Row lengths between SMALL_SK's and LARGE_SK's, where the row plans
    (softmax_row_plan.h) give other groups and fills: sub-warp groups of 3 and 6 vectors a
    thread (16-bit rows: sk 136 and 150 (shifted) in 8 threads of 3 and 4 of 6, sk 40 in 4
    of 2, the fewest threads for fewer slots; fp32 rows in 4 to 16 threads of 3, 8 of 6),
    whole-warp groups of 96, 192 and 384 threads and power-of-two ones of 32 to 512, rows
    that fill the last vector of each thread (768, 2304) and rows shifted to each row's
    start (1025, 12001)."""
    if kind == "upper_triang" and sk > 4099:
        pytest.skip("[1, sk, sk] at this sk is too big for a unit test")
    check_cuda_bwd(kind, dtype, (1, 2, 3), sk, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("scale", [-1.5, 0.0], ids=lambda s: f"scale{s}")
@pytest.mark.parametrize("sk", [64, 700, 2047], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("kind", KINDS)
def test_fwd_bwd_cuda_scales(kind, sk, scale, device, gen):
    """A negative scale (the logits' order reversed, so the row's max comes from its
    smallest x) and zero (every kept logit 0: each kept position 1 / kept, the gradient 0)."""
    check_cuda_bwd(kind, torch.bfloat16, (1, 2, 3), sk, scale, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", [64, 700, 2047], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_masked_mask_for_every_batch_cuda(dtype, sk, device, gen):
    """One explicit mask [1, 1, sq, sk] for a batch of two (Transformer Engine's broadcast
    padding mask): the second batch's rows read the mask from its start again, never past
    its end (the tests above pass a mask a batch whenever there are several)."""
    check_cuda_bwd("masked", dtype, (2, 3, 64), sk, 1.0, gen, per_batch=False)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_aligned_causal_more_queries_than_keys_cuda(dtype, device, gen):
    """Bottom-right causal rows with sq > sk (1600 queries, 1536 keys): the first 64 rows
    keep nothing (zeros, and a zero gradient), row 64 keeps one position, the last all."""
    check_cuda_bwd("aligned_causal", dtype, (1, 2, 1600), 1536, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("kind", ["upper_triang", "aligned_causal"])
def test_causal_split_rows_misaligned_cuda_large(kind, device, gen):
    """Causal rows split over a cluster: test_causal_split_rows_cuda_large's rows one
    element into their buffers (aligned ones at 8195 take shifted vectors, unsplit). The
    forward takes softmax_fwd_rows_kernel<bf16, 1, 16, ..., kSplit> (2 blocks of 288
    threads): upper-triangular rows keeping <= 288 positions leave block 1 a max of -inf
    (block_scale 0); the aligned causal backward the kV = 1 split kernel, the
    upper-triangular backward (never split) softmax_bwd_long_rows_kernel<bf16, 1>, the only
    long-row backward of that kind in reach."""
    check_cuda_bwd(kind, torch.bfloat16, (1, 1, 8195), 8195, 0.5, gen, misalign=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", [17, 200, 3000, 20000], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_misaligned_cuda_every_count(kind, dtype, sk, device, gen):
    """Element-by-element kernels (kV = 1) of every dtype and per-thread count: 17 two a
    thread (16-thread groups), 200 eight (a warp), 3000 sixteen (192 threads forward, 256
    backward), 20000 split over 3 clusters' blocks (sm_90; the explicit mask's forward: the
    long-row kernel). (test_misaligned_cuda: bf16 at 64 and 2048.)"""
    if kind == "upper_triang" and sk > 4099:
        pytest.skip("[1, sk, sk] at this sk is too big for a unit test")
    check_cuda_bwd(kind, dtype, (1, 2, 3), sk, 0.5, gen, misalign=True)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("dtype,sk", [(torch.float32, 300), (torch.float16, 700)], ids=["float32-sk300", "float16-sk700"])
@pytest.mark.parametrize("kind", KINDS)
def test_fwd_bwd_cuda_four_vectors(kind, dtype, sk, device, gen):
    """Four vectors a thread in one warp (65-128 vectors a row): fp32 sk 300 (75 aligned
    vectors) is the only way to the fp32 unshifted backward of 4 vectors; fp16 sk 700 (89
    shifted vectors) to the fp16 shifted recomputing (causal) forward of 4."""
    check_cuda_bwd(kind, dtype, (1, 2, 3), sk, 0.5, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", [17, 200, 2048, 9000], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_masked_mask_misaligned_cuda(dtype, sk, device, gen):
    """x and y aligned, the mask one byte into its buffer: the dispatch's !is_aligned(mask)
    condition sends the rows element by element (2, 8, 16 a thread; 9000 the long-row
    kernel), a route no test takes (misaligned tests misalign x)."""
    shape = (2, 2, 3, sk)
    x_cpu = make_x(shape, dtype, 2.0, gen)
    mask = make_mask(shape, gen, per_batch=True)
    buf = torch.empty(mask.numel() + 1, dtype=torch.bool, device="cuda")
    buf[1:].copy_(mask.flatten())
    mask_view = buf[1:].view(mask.shape)
    out = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    got = core_fwd("masked", x_cpu.cuda(), mask_view, 1.0, out)
    cpu = fwd("masked", x_cpu, mask, 1.0)
    ref, zero, bound = reference_fwd("masked", x_cpu.double(), mask, 1.0)
    b = rounded(ref, bound, dtype)
    assert_within(got, ref, 2 * b, "masked fwd cuda, misaligned mask", zero)
    assert_within(got, cpu.double(), 3 * b, "masked fwd cuda vs cpu, misaligned mask")


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("sk", [200000, 200001], ids=lambda s: f"sk{s}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_scaled_recomputing_split_cuda_large(dtype, sk, device, gen):
    """16-bit whole rows of 16385-32768 vectors: past the exponential-keeping kernels' 8
    blocks, the recomputing 8-vector kernel split over 7 blocks of 448 threads, which only
    causal rows (and fp32 scaled rows) reach now; the backward split over 7 too."""
    check_cuda_bwd("scaled", dtype, (1, 1, 3), sk, 0.25, gen)


@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("dtype,sk", [(torch.bfloat16, 20000), (torch.bfloat16, 20001), (torch.float32, 20000)],
                         ids=["bfloat16-sk20000", "bfloat16-sk20001", "float32-sk20000"])
def test_masked_mask_for_every_batch_long_cuda(dtype, sk, device, gen):
    """One mask [1, 1, sq, sk] for a batch of two where the masked forward leaves the row
    kernels: the long-row kernel in vectors (bf16 20000) and element by element (20001),
    and the fp32 exponential-keeping kernel split over 3 blocks (20000)."""
    check_cuda_bwd("masked", dtype, (2, 2, 8), sk, 1.0, gen, per_batch=False)
