"""Random calls, valid and not, to the core ops' torch helpers: norms, activations, bias
gradients, softmax, the casts, the rotary embedding and the GEMM.

Each call draws shapes (0, 1, odd and even sizes, one to four dims), dtypes (the three
float dtypes mostly; int, uint8, float64 and an FP8 dtype sometimes), layouts
(transposed, strided and one-element-offset views), weights and statistics of the right or
a wrong size, scales and amaxes of the right or a wrong shape and dtype, FP8 dtypes that
are and are not ones. Every call must either run or raise a TypeError, ValueError or
NotImplementedError whose message names one of the call's arguments: nothing else
escapes, nothing crashes. The draws are seeded, so a run is the same calls every time.
tools/cpu_sanitizers.sh runs this under AddressSanitizer too, where a read or a write
out of bounds on any of these inputs stops the run.
"""
from __future__ import annotations

import collections
import random
import re

import pytest
import torch
from conftest import DEVICES

from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.cpp_extensions import activation as act
from transformer_engine.pytorch.cpp_extensions import bias_grad as bg
from transformer_engine.pytorch.cpp_extensions import cast, gemm, rope
from transformer_engine.pytorch.cpp_extensions import normalization as nm
from transformer_engine.pytorch.cpp_extensions import softmax as sm

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
OTHERS = [torch.int32, torch.uint8, torch.float64, torch.float8_e4m3fn]
SIZES = [0, 1, 2, 3, 7, 8, 9, 16, 17, 24, 64, 100, 130]
KINDS = ["gelu", "qgelu", "relu", "srelu", "silu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu"]
GATED = set(KINDS[5:])
CALLS = 2500

# What a message may name: the helpers' arguments, and the C API's names for them (a
# check in the core names its own parameter: x for inp, act_input for fwd_input).
ARGUMENTS = ("inp", "input", "x", "weight", "bias", "gamma", "dz", "mu", "rsigma", "scale", "amax", "fp8_dtype",
             "out_dtype", "columnwise", "rowwise", "grad", "fwd_input", "act_input", "mask", "scale_factor",
             "output_grads", "softmax_results", "data", "data_t", "scale_inv", "dtype", "freqs",
             "start_positions", "cu_seqlens", "qkv_format", "cp_size", "cp_rank", "A", "B", "out", "layout",
             "gelu_in", "accumulate", "beta", "workspace")
NAMES_AN_ARGUMENT = re.compile(r"\b(" + "|".join(ARGUMENTS) + r")\b")


class Draws:
    """The random inputs of one run."""

    def __init__(self, seed: int, device: str):
        self.r = random.Random(seed)
        self.device = device
        self.g = torch.Generator().manual_seed(seed)  # the values; torch's global generator left alone

    def pick(self, options):
        return self.r.choice(options)

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def shape(self, dims=None) -> tuple[int, ...]:
        dims = dims if dims is not None else self.pick([1, 2, 2, 2, 3, 4])
        return tuple(self.pick(SIZES) for _ in range(dims))

    def tensor(self, shape, dtype=None) -> torch.Tensor:
        dtype = dtype or (self.pick(FLOATS) if self.chance(0.9) else self.pick(OTHERS))
        if dtype in (torch.int32, torch.uint8):
            t = torch.randint(0, 3, shape, dtype=dtype, generator=self.g)
        else:
            t = (torch.randn(shape, generator=self.g) * self.pick([1.0, 1.0, 100.0, 1e-3])).to(dtype)
        t = t.to(self.device)
        layout = self.r.random()
        if layout < 0.08 and t.dim() >= 2 and t.shape[-1] > 1:
            t = t.transpose(-1, -2)
        elif layout < 0.14 and t.dim() >= 1 and t.shape[-1] > 2:
            t = t[..., ::2]
        elif layout < 0.17 and t.numel() > 1:
            t = t.flatten()[1:]  # one element off the allocation's start: no 16-byte vectors
        return t

    def scale(self):
        if self.chance(0.8):
            return torch.tensor([self.pick([1.0, 2.0, 0.5, 448.0])], device=self.device)
        return self.pick([None, torch.ones(2), torch.ones(1, dtype=torch.float16), torch.ones(()), torch.ones(1, 1)])

    def amax(self):
        good = torch.zeros(1, device=self.device)
        return self.pick([None, None, good, good, torch.zeros(3), torch.zeros(1, dtype=torch.bfloat16)])

    def fp8_dtype(self):
        return self.pick([DType.kFloat8E4M3, DType.kFloat8E5M2] * 2 + [None, 3, "e4m3"])

    def grad_for(self, kind: str, x: torch.Tensor, shape) -> torch.Tensor:
        """A gradient of the activation's output: [..., H] for a gated x [..., 2H]."""
        out = list(shape)
        if kind in GATED and out:
            out[-1] //= 2
        return self.tensor(tuple(out) if self.chance(0.9) else self.shape(), x.dtype if self.chance(0.9) else None)


def norm_fwd(d: Draws):
    shape = d.shape()
    x = d.tensor(shape)
    hidden = shape[-1] if d.chance(0.9) else d.pick(SIZES)
    w = d.tensor((hidden,), d.pick(FLOATS))
    kwargs = {"zero_centered_gamma": d.chance(0.3)}
    if d.chance(0.6):
        kwargs.update(fp8_dtype=d.fp8_dtype(), scale=d.scale(), amax=d.amax(), columnwise=d.chance(0.5))
    elif d.chance(0.3):
        kwargs.update(out_dtype=d.pick(FLOATS + [torch.int8]), amax=d.amax())
    if d.chance(0.5):
        return nm.layernorm_fwd(x, w, d.tensor((hidden,), w.dtype), d.pick([1e-5, 0.0, 1.0]), **kwargs)
    return nm.rmsnorm_fwd(x, w, d.pick([1e-5, 0.0]), **kwargs)


def norm_bwd(d: Draws):
    shape = d.shape()
    rows = 1
    for size in shape[:-1]:
        rows *= size
    dtype = d.pick(FLOATS)
    x = d.tensor(shape, dtype if d.chance(0.9) else None)
    dz = d.tensor(shape if d.chance(0.9) else d.shape(), dtype if d.chance(0.9) else None)
    mu = d.tensor((rows if d.chance(0.9) else rows + 1,), torch.float32 if d.chance(0.9) else None)
    rsigma = d.tensor((rows if d.chance(0.9) else rows + 1,), torch.float32 if d.chance(0.9) else None)
    if rsigma.dtype == torch.float32:
        rsigma = rsigma.abs() + 0.5
    gamma = d.tensor((shape[-1] if d.chance(0.9) else shape[-1] + 1,), d.pick(FLOATS))
    if d.chance(0.5):
        return nm.layernorm_bwd(dz, x, mu, rsigma, gamma, d.chance(0.3))
    return nm.rmsnorm_bwd(dz, x, rsigma, gamma, d.chance(0.3))


def act_fwd(d: Draws):
    x = d.tensor(d.shape())
    kwargs = {}
    if d.chance(0.5):
        kwargs.update(fp8_dtype=d.fp8_dtype(), scale=d.scale(), amax=d.amax(), columnwise=d.chance(0.5))
    elif d.chance(0.3):
        kwargs.update(out_dtype=d.pick(FLOATS), amax=d.amax())
    return getattr(act, d.pick(KINDS))(x, **kwargs)


def act_bwd(d: Draws):
    kind, shape = d.pick(KINDS), d.shape()
    x = d.tensor(shape)
    return getattr(act, "d" + kind)(d.grad_for(kind, x, shape), x)


def bias_grad(d: Draws):
    shape = d.shape()
    if d.chance(0.3):
        return bg.bgrad_quantize(d.tensor(shape), d.fp8_dtype(), d.scale(), d.amax(), rowwise=d.chance(0.8),
                                 columnwise=d.chance(0.7))
    kind = d.pick(KINDS)
    x = d.tensor(shape)
    return bg.dact_dbias_quantize(kind, d.grad_for(kind, x, shape), x, d.fp8_dtype(), d.scale(), d.amax(),
                                  with_dbias=d.chance(0.7), columnwise=d.chance(0.6))


def softmax(d: Draws):
    scale = d.pick([1.0, 0.125, 0.0, -1.0, float("inf"), 2])
    which = d.r.random()
    if which < 0.25:
        y = sm.scaled_softmax_forward(d.tensor(d.shape(d.pick([4, 4, 4, 3]))), scale)
        backward = sm.scaled_softmax_backward
    elif which < 0.5:
        shape = d.shape(4)
        mask_shape = (d.pick([shape[0], 1, 2]), 1, shape[2], shape[3]) if d.chance(0.9) else d.shape(4)
        mask_dtype = d.pick([torch.bool, torch.uint8, torch.uint8, torch.int32])
        mask = torch.randint(0, 2, mask_shape, dtype=mask_dtype, generator=d.g)
        y = sm.scaled_masked_softmax_forward(d.tensor(shape), mask.to(d.device), scale)
        backward = sm.scaled_masked_softmax_backward
    elif which < 0.75:
        n = d.pick(SIZES)
        y = sm.scaled_upper_triang_masked_softmax_forward(d.tensor((d.pick(SIZES), n, n if d.chance(0.9) else n + 1)),
                                                          scale)
        backward = sm.scaled_upper_triang_masked_softmax_backward
    else:
        y = sm.scaled_aligned_causal_masked_softmax_forward(d.tensor(d.shape(4)), scale)
        backward = sm.scaled_aligned_causal_masked_softmax_backward
    if d.chance(0.5):
        grads = torch.randn(y.shape, generator=d.g).to(y) if d.chance(0.7) else d.tensor(tuple(y.shape))
        backward(grads, y, scale)
    return y


def casts(d: Draws):
    shape = d.shape()
    which = d.r.random()
    if which < 0.4:
        rowwise, columnwise = d.chance(0.8), d.chance(0.5)
        return cast.quantize(d.tensor(shape), d.fp8_dtype(), d.scale(), amax=d.amax(), rowwise=rowwise,
                             columnwise=columnwise)
    if which < 0.6:
        bits = d.tensor(shape, d.pick([torch.uint8, torch.uint8, torch.float8_e4m3fn, torch.int32]))
        scale_inv = d.scale()
        return cast.dequantize(bits, scale_inv, d.fp8_dtype() if d.chance(0.8) else None,
                               d.pick(FLOATS + [torch.int8]))
    if which < 0.8:
        return cast.transpose(d.tensor(shape, d.pick(FLOATS + [torch.uint8, torch.int32, torch.float64])))
    return cast.compute_amax(d.tensor(shape), d.amax())


def rotary(d: Draws):
    fmt = d.pick(["sbhd", "bshd", "thd", "sbhd", "hsbd"])
    x = d.tensor(d.shape(d.pick([3, 4, 4, 4])))
    # (x may be a flattened view: its sizes capped where they size freqs)
    seq = min(x.shape[0] if fmt != "bshd" or x.dim() < 2 else x.shape[1], 256)
    rotary_dim = min(d.pick([x.shape[-1], x.shape[-1] // 2 * 2, 2, x.shape[-1] + 2]), 256)
    freqs = d.tensor((seq if d.chance(0.9) else seq + 3, 1, 1, rotary_dim), torch.float32 if d.chance(0.9) else None)
    kwargs = {"qkv_format": fmt, "interleaved": d.chance(0.3)}
    if fmt == "thd" or d.chance(0.1):
        batches = d.pick([1, 2, 3])
        ends = sorted(d.r.randint(0, max(x.shape[0], 0) + 2) for _ in range(batches))
        kwargs["cu_seqlens"] = torch.tensor([0] + ends, dtype=d.pick([torch.int32, torch.int32, torch.int64]),
                                            device=d.device)
    if d.chance(0.2):
        kwargs["start_positions"] = torch.randint(0, 4, (d.pick([1, 2, 3]),), dtype=torch.int32,
                                                  generator=d.g).to(d.device)
    if d.chance(0.1):
        kwargs.update(cp_size=d.pick([0, 2, 3]), cp_rank=d.pick([0, 1, 5, -1]))
    op = rope.fused_rope_forward if d.chance(0.5) else rope.fused_rope_backward
    return op(x, freqs, **kwargs)


def matmul(d: Draws):
    layout = d.pick(["TN", "TN", "NN", "NT", "TT", "XN"])
    m, n, k = (d.pick(SIZES) for _ in range(3))
    dtype = d.pick(FLOATS)
    a_shape = (n, k) if layout[0] == "T" else (k, n)
    b_shape = (k, m) if layout[1] == "T" else (m, k)
    A = d.tensor(a_shape if d.chance(0.9) else d.shape(), dtype if d.chance(0.9) else None)
    B = d.tensor(b_shape if d.chance(0.9) else d.shape(), dtype if d.chance(0.9) else None)
    kwargs = {"layout": layout, "grad": d.chance(0.3), "gelu": d.chance(0.3)}
    if d.chance(0.3):
        kwargs["bias"] = d.tensor((n if d.chance(0.8) else m,), d.pick(FLOATS))
    if d.chance(0.2):
        kwargs["accumulate"] = True
        kwargs["out"] = d.tensor((m, n) if d.chance(0.9) else d.shape(), dtype if d.chance(0.9) else None)
    if kwargs["grad"] and kwargs["gelu"]:
        kwargs["gelu_in"] = d.tensor((m, n), dtype) if d.chance(0.9) else None
    if d.chance(0.2):
        kwargs["out_dtype"] = d.pick(FLOATS + [torch.int8])
    # cuBLASLt's scratch on the GPU (the CPU needs none); sometimes missing or too small
    workspace = None
    if d.device != "cpu" and d.chance(0.95):
        size = gemm.get_cublas_workspace_size_bytes() if d.chance(0.95) else 16
        workspace = torch.empty(size, dtype=torch.uint8, device=d.device)
    return gemm.general_gemm(A, B, workspace, **kwargs)


OPS = [norm_fwd, norm_bwd, act_fwd, act_bwd, bias_grad, softmax, casts, rotary, matmul]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_calls_run_or_raise_a_clear_error(seed, device):
    d = Draws(seed, device)
    outcomes = collections.Counter()
    for _ in range(CALLS):
        op = d.pick(OPS)
        try:
            op(d)
            outcomes[op.__name__, "ran"] += 1
        except (TypeError, ValueError, NotImplementedError) as e:
            outcomes[op.__name__, "raised"] += 1
            assert NAMES_AN_ARGUMENT.search(str(e)), f"{op.__name__}: {type(e).__name__} names no argument: {e}"
    # the draws reach both ends of every helper: calls that run and calls that are refused
    for op in OPS:
        assert outcomes[op.__name__, "ran"] >= 20, (op.__name__, dict(outcomes))
        assert outcomes[op.__name__, "raised"] >= 20, (op.__name__, dict(outcomes))
