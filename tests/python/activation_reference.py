"""Float64 references of the activation formulas and bounds on the core's fp32 error,
shared by test_activation.py and test_bias_grad.py. Nothing here calls OpenTE.

References run on the very values the core reads (inputs stored in their dtypes first):
F.gelu(approximate="tanh"), x * sigmoid(1.702 x), F.relu, F.relu(x)**2, F.silu, the gated
kinds through chunk(2, -1) (a = first half, b = second), and torch.autograd for backward.

Tolerances (the analysis of tests/cpp/activation_reference.h), per element, U = 2^-24:
  act error (fp32):   gelu 8U(|y|+|x|); qgelu, silu 8U|y|(1+|z|), z = a x; relu 0; srelu 2U|y|
  act' error (fp32):  gelu 16U(1+|d|+|x|(1+3*0.044715 x^2)); qgelu, silu 16U(1+|z|)(1+|d|);
                      relu, srelu 0
  a product f * r:    |f| err(r) + 2U |f r|
  then the output dtype's rounding: + u_out (|v| + err) + half its smallest subnormal step,
  u_out = 2^-24 (fp32), 2^-11 (fp16), 2^-8 (bf16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

U = 2.0**-24
C = 0.044715
UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
HALF_MIN_STEP = {torch.float32: 2.0**-150, torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134}

# name: (base activation name, gated)
KINDS = {
    "gelu": ("gelu", False), "qgelu": ("qgelu", False), "relu": ("relu", False), "srelu": ("srelu", False),
    "silu": ("silu", False), "geglu": ("gelu", True), "qgeglu": ("qgelu", True), "reglu": ("relu", True),
    "sreglu": ("srelu", True), "swiglu": ("silu", True),
}
TORCH_ACT = {
    "gelu": lambda x: F.gelu(x, approximate="tanh"),
    "qgelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "srelu": lambda x: F.relu(x) ** 2,
    "silu": F.silu,
}


def act_err(base, x, y):
    if base == "gelu":
        return 8 * U * (y.abs() + x.abs())
    if base in ("qgelu", "silu"):
        a = 1.702 if base == "qgelu" else 1.0
        return 8 * U * y.abs() * (1 + (a * x).abs())
    if base == "relu":
        return torch.zeros_like(x)
    return 2 * U * y.abs()


def der_err(base, x, d):
    if base == "gelu":
        return 16 * U * (1 + d.abs() + x.abs() * (1 + 3 * C * x * x))
    if base in ("qgelu", "silu"):
        a = 1.702 if base == "qgelu" else 1.0
        return 16 * U * (1 + (a * x).abs()) * (1 + d.abs())
    return torch.zeros_like(x)


def times(f, v, err):
    return f * v, f.abs() * err + 2 * U * (f * v).abs()


def rounded(v, err, dtype):
    return err + UNIT[dtype] * (v.abs() + err) + HALF_MIN_STEP[dtype]


def make_input(shape, dtype, gen):
    """randn * 3 with exact zeros and tiny magnitudes, stored in dtype."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    flat = x.view(-1)
    flat[::17] = 0.0
    flat[5::13] *= 1e-4
    return x.to(dtype)


def reference_fwd(name, x):
    """(y, fp32 error bound), float64, from the stored input x."""
    base, gated = KINDS[name]
    x64 = x.double()
    if not gated:
        y = TORCH_ACT[base](x64)
        return y, act_err(base, x64, y)
    a, b = x64.chunk(2, -1)
    fa = TORCH_ACT[base](a)
    return times(b, fa, act_err(base, a, fa))


def reference_bwd(name, grad, x):
    """(dinput, fp32 error bound), float64, the gradient by torch.autograd."""
    base, gated = KINDS[name]
    x64 = x.double().requires_grad_(True)
    g64 = grad.double()
    if not gated:
        (d,) = torch.autograd.grad(TORCH_ACT[base](x64), x64, torch.ones_like(g64))
        v, err = times(g64, d, der_err(base, x64.detach(), d))
        (dx,) = torch.autograd.grad(TORCH_ACT[base](x64), x64, g64)
        # the two float64 computations cancel differently where act'(x) ~ 0 (x << 0): an
        # absolute difference of a few float64 ulps of 1, times |g|
        assert ((dx - v).abs() <= 1e-12 * v.abs() + 1e-13 * (1 + g64.abs())).all()
        return v, err
    a, b = x64.chunk(2, -1)
    (dx,) = torch.autograd.grad(TORCH_ACT[base](a) * b, x64, g64)
    a, b = a.detach(), b.detach()
    a_req = a.clone().requires_grad_(True)
    (d,) = torch.autograd.grad(TORCH_ACT[base](a_req), a_req, torch.ones_like(a))
    fa = TORCH_ACT[base](a)
    da, da_err = times(g64 * b, d, der_err(base, a, d))
    da_err = da_err + 2 * U * da.abs()  # g * b rounded in fp32
    db, db_err = times(g64, fa, act_err(base, a, fa))
    full = torch.cat([da, db], -1)
    scale = torch.cat([g64.abs() * (1 + b.abs()), g64.abs()], -1)
    assert ((dx - full).abs() <= 1e-12 * full.abs() + 1e-13 * (1 + scale)).all()
    return full, torch.cat([da_err, db_err], -1)


def assert_within(got, ref, err, dtype, what):
    bound = rounded(ref, err, dtype)
    diff = (got.double() - ref).abs()
    bad = ~(diff <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} elements off, first at {bad.nonzero()[0].tolist()}: got "
        f"{got.double()[bad][0].item()}, want {ref[bad][0].item()} +- {bound[bad][0].item()}"
    )


def fp8_ordinal(codes):
    """FP8 codes (uint8) as signed ordinals: neighbouring values differ by 1, +0 and -0 are 0."""
    c = codes.to(torch.int32)
    return torch.where(c >= 128, -(c - 128), c)
