"""Independent references (plain torch / numpy), test-data makers and comparisons.

Nothing here calls OpenTE: these define what the core must compute.
"""

import math

import numpy as np
import torch

from transformer_engine.pytorch.cpp_extensions import DType

FP8_DTYPES = [DType.kFloat8E4M3, DType.kFloat8E5M2]
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TORCH_FP8 = {DType.kFloat8E4M3: torch.float8_e4m3fn, DType.kFloat8E5M2: torch.float8_e5m2}
FP8_MAX = {DType.kFloat8E4M3: 448.0, DType.kFloat8E5M2: 57344.0}
FP8_MIN_SUBNORMAL = {DType.kFloat8E4M3: 2.0**-9, DType.kFloat8E5M2: 2.0**-16}
FLT_MAX = float(np.finfo(np.float32).max)

# Integer views of the same width, to compare floats bit for bit.
_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def f32(v) -> np.float32:
    return np.float32(v)


# ---- test data --------------------------------------------------------------


def spread_input(shape, dtype, fp8_dtype, scale, gen, device="cpu"):
    """Random x whose x*scale covers FP8's whole range: log-uniform magnitudes from
    below the smallest subnormal to beyond the max, both signs, plus special values
    (NaN, +-inf, +-0, exactly +-max, rounding ties) at random positions."""
    n = math.prod(shape)
    fmax, fmin = FP8_MAX[fp8_dtype], FP8_MIN_SUBNORMAL[fp8_dtype]
    lo, hi = math.log2(fmin / 4), math.log2(fmax * 2)
    exps = torch.rand(n, generator=gen, device=device) * (hi - lo) + lo
    signs = torch.where(torch.rand(n, generator=gen, device=device) < 0.5, -1.0, 1.0)
    v = signs * torch.exp2(exps) / scale
    specials = [
        math.nan, math.inf, -math.inf, 0.0, -0.0,
        fmax / scale, -fmax / scale,            # exactly the max
        fmax * 1.04 / scale, -fmax * 1.3 / scale,  # beyond: must saturate
        fmin / 2 / scale, fmin * 1.5 / scale,   # subnormal ties (round to even)
        -fmin * 2.5 / scale, fmin * 0.26 / scale,
    ]
    k = min(n, len(specials))
    if k:
        pos = torch.randperm(n, generator=gen, device=device)[:k]
        v[pos] = torch.tensor(specials[:k], dtype=v.dtype, device=device)
    return v.reshape(shape).to(dtype)


def random_scale(gen) -> float:
    """A positive fp32 scale that is not a power of two (so x*scale rounds)."""
    s = float(f32(2.0 ** (torch.rand(1, generator=gen).item() * 6 - 3)))
    return s * 1.0001 if math.log2(s).is_integer() else s


def random_bits(shape, dtype, gen, device="cpu"):
    """A tensor of `dtype` whose bytes are uniformly random (NaN bit patterns included)."""
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    size = torch.empty((), dtype=dtype).element_size()
    raw_shape = (*shape[:-1], shape[-1] * size) if shape else (size,)
    raw = torch.randint(0, 256, raw_shape, dtype=torch.uint8, generator=gen, device=device)
    return raw.view(dtype).reshape(shape)


# ---- references -------------------------------------------------------------


def ref_quantize(x, fp8_dtype, scale: float):
    """uint8 FP8 bits of clamp(x*scale): torch rounds to nearest even and keeps NaN."""
    fmax = FP8_MAX[fp8_dtype]
    scaled = x.float() * torch.tensor(scale, dtype=torch.float32)
    return torch.clamp(scaled, -fmax, fmax).to(TORCH_FP8[fp8_dtype]).view(torch.uint8)


def ref_columnwise(t):
    """TE's column-wise layout: [d_{n-1}, d_0, ..., d_{n-2}] holding the 2-D transpose."""
    if t.dim() == 0:
        return t.clone()
    out_shape = (t.shape[-1], *t.shape[:-1])
    rows = math.prod(t.shape[:-1])  # not -1: ambiguous when the last dim is 0
    return t.reshape(rows, t.shape[-1]).t().contiguous().reshape(out_shape)


def ref_amax(x, start: float = 0.0) -> float:
    """max(start, max|x|) with NaNs ignored, as fp32."""
    a = x.float().abs().flatten()
    a = a[~torch.isnan(a)]
    return float(max(f32(start), f32(a.max().item()) if a.numel() else f32(0)))


def ref_dequantize(bits, fp8_dtype, scale_inv: float, dtype):
    return (bits.view(TORCH_FP8[fp8_dtype]).float() * torch.tensor(scale_inv, dtype=torch.float32)).to(dtype)


def round_down_pow2(v: float) -> float:
    m, e = math.frexp(v)  # v = m * 2**e, m in [0.5, 1)
    return math.ldexp(1.0, e - 1)


# ---- comparisons ------------------------------------------------------------


def as_bits(t):
    return t.contiguous().view(_BITS_VIEW[t.element_size()])


def fp8_isnan(bits, fp8_dtype):
    return torch.isnan(bits.view(TORCH_FP8[fp8_dtype]).float())


def assert_fp8_equal(got, expected, fp8_dtype):
    """Same bits wherever the reference is a number; NaN exactly where it is NaN,
    encoded as the canonical 0x7f as the core promises."""
    assert got.dtype == torch.uint8 and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    got, expected = got.cpu(), expected.cpu()
    nan_exp = fp8_isnan(expected, fp8_dtype)
    nan_got = fp8_isnan(got, fp8_dtype)
    assert torch.equal(nan_got, nan_exp), f"NaN positions differ at {torch.nonzero(nan_got != nan_exp)[:8].tolist()}"
    assert torch.all(got[nan_got] == 0x7F), "NaN must be encoded as the canonical 0x7f"
    bad = (got != expected) & ~nan_exp
    if bad.any():
        idx = torch.nonzero(bad)[:8]
        rows = [(i.tolist(), int(got[tuple(i)]), int(expected[tuple(i)])) for i in idx]
        raise AssertionError(f"{int(bad.sum())} FP8 codes differ; (index, got, expected): {rows}")


def assert_float_equal(got, expected):
    """Bit-exact where the reference is a number (-0 differs from +0); NaN where it is NaN.
    NaN payloads may differ (torch and the core pick different canonical NaNs)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    got, expected = got.cpu(), expected.cpu()
    nan_exp, nan_got = torch.isnan(expected), torch.isnan(got)
    assert torch.equal(nan_got, nan_exp), f"NaN positions differ at {torch.nonzero(nan_got != nan_exp)[:8].tolist()}"
    bad = (as_bits(got) != as_bits(expected)) & ~nan_exp
    if bad.any():
        idx = torch.nonzero(bad)[:8]
        rows = [(i.tolist(), got[tuple(i)].item(), expected[tuple(i)].item()) for i in idx]
        raise AssertionError(f"{int(bad.sum())} values differ; (index, got, expected): {rows}")


def assert_same_bits(got, expected):
    """Strict: every byte equal (CUDA against the CPU core, NaN payloads included)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    bad = as_bits(got.cpu()) != as_bits(expected.cpu())
    if bad.any():
        idx = torch.nonzero(bad)[:8].tolist()
        raise AssertionError(f"{int(bad.sum())} of {bad.numel()} elements differ, first at {idx}")


# ---- readable test ids ---------------------------------------------------------


def shape_id(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


def dtype_id(dtype):
    return str(dtype).replace("torch.", "").replace("DType.k", "")
