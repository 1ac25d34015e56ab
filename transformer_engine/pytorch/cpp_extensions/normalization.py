"""LayerNorm and RMSNorm, forward and backward, on torch tensors (Transformer Engine 2.x's
helpers of the same names, over te_layernorm_* / te_rmsnorm_*).

A tensor [..., hidden] is normalized over its last dim; the statistics ``mu`` and
``rsigma`` are float32 [rows] with rows = the product of the other dims. The weights
may have another float dtype than the input (fp32 weights with bf16 activations).
Forward output: the input's dtype, ``out_dtype``, or FP8 (``fp8_dtype`` with ``scale``),
the fused norm + quantize that LayerNormLinear and LayerNormMLP run under delayed scaling;
under current scaling they take a float output with its ``amax`` (the cast needs it first).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.cast import columnwise_shape
from transformer_engine.pytorch.cpp_extensions.tensor_desc import (
    check_fp32_buffer,
    describe,
    fp8_dtype_of,
    stream_of,
    te_dtype,
)

# A module import, not a name: the tensor package imports the cast helpers of
# this package, so either package may be the one imported first.
import transformer_engine.pytorch.tensor._internal.float8_tensor_base as _f8

__all__ = ["layernorm_fwd", "layernorm_bwd", "rmsnorm_fwd", "rmsnorm_bwd"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_float(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")


def _rows_hidden(x: torch.Tensor, name: str) -> tuple[int, int]:
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (normalized over the last), got a scalar")
    return math.prod(x.shape[:-1]), x.shape[-1]


def _workspace(rows: int, hidden: int, desc: _core.Tensor, device: torch.device):
    """The norm ops' scratch (te_norm_workspace_size bytes) on CUDA, None on the CPU. The
    caller keeps the tensor referenced until the op is queued; the caching allocator
    then orders any reuse of the memory after it on the stream."""
    size = _core.norm_workspace_size(rows, hidden, *desc.device)
    return torch.empty(size, dtype=torch.uint8, device=device) if size else None


def _ptr_size(ws: Optional[torch.Tensor]) -> tuple[int, int]:
    return (ws.data_ptr(), ws.numel()) if ws is not None else (0, 0)


def _forward_output(inp, inp_desc, out_dtype, fp8_dtype, scale, amax, columnwise):
    """(result, descriptor) of the forward's output: a float tensor (whose max|y| as stored
    raises ``amax`` when given: what a current-scaling cast of it needs), or a
    Float8TensorBase."""
    if fp8_dtype is None:
        if scale is not None or columnwise:
            raise ValueError("scale and columnwise are for an FP8 output: pass fp8_dtype too")
        dtype = inp.dtype if out_dtype is None else out_dtype
        if dtype not in _FLOAT_DTYPES:
            raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {dtype}")
        out = torch.empty(inp.shape, dtype=dtype, device=inp.device)
        if amax is None:
            return out, describe(out, "out")
        check_fp32_buffer(amax, "amax", inp)
        return out, _core.Tensor(*inp_desc.device, int(te_dtype(dtype, "out_dtype")), list(inp.shape), out.data_ptr(),
                                 amax=amax.data_ptr())
    if out_dtype is not None:
        raise ValueError(f"give out_dtype ({out_dtype}) or fp8_dtype ({fp8_dtype!r}), not both")
    dtype = fp8_dtype_of(fp8_dtype)
    if scale is None:
        raise ValueError("scale (float32, one element) is required with fp8_dtype")
    check_fp32_buffer(scale, "scale", inp)
    if amax is not None:
        check_fp32_buffer(amax, "amax", inp)
    data = torch.empty(inp.shape, dtype=torch.uint8, device=inp.device)
    data_t = None
    if columnwise:
        data_t = torch.empty(columnwise_shape(inp.shape), dtype=torch.uint8, device=inp.device)
    scale_inv = torch.empty(1, dtype=torch.float32, device=inp.device)
    out = _f8.Float8TensorBase(data=data, data_transpose=data_t, fp8_scale_inv=scale_inv, fp8_dtype=dtype)
    desc = _core.Tensor(*inp_desc.device, int(dtype), list(inp.shape), data.data_ptr(),
                        data_t.data_ptr() if data_t is not None else 0, scale.data_ptr(), scale_inv.data_ptr(),
                        amax.data_ptr() if amax is not None else 0, int(_core.ScalingMode.PER_TENSOR))
    return out, desc


def _norm_fwd(layernorm, inp, weight, bias, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax,
              columnwise):
    _check_float(inp, "inp")
    _check_float(weight, "weight")
    if layernorm:
        _check_float(bias, "bias")
    rows, hidden = _rows_hidden(inp, "inp")
    inp_desc = describe(inp, "inp")
    out, out_desc = _forward_output(inp, inp_desc, out_dtype, fp8_dtype, scale, amax, columnwise)
    mu = torch.empty(rows, dtype=torch.float32, device=inp.device) if layernorm else None
    rsigma = torch.empty(rows, dtype=torch.float32, device=inp.device)
    ws = _workspace(rows, hidden, inp_desc, inp.device)
    ws_ptr, ws_size = _ptr_size(ws)
    if layernorm:
        _core.layernorm_fwd(inp_desc, describe(weight, "weight"), describe(bias, "bias"), float(eps),
                            bool(zero_centered_gamma), out_desc, describe(mu, "mu"), describe(rsigma, "rsigma"),
                            ws_ptr, ws_size, stream_of(inp))
    else:
        _core.rmsnorm_fwd(inp_desc, describe(weight, "weight"), float(eps), bool(zero_centered_gamma), out_desc,
                          describe(rsigma, "rsigma"), ws_ptr, ws_size, stream_of(inp))
    return out, mu, rsigma


def layernorm_fwd(
    inp: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    zero_centered_gamma: bool = False,
    out_dtype: Optional[torch.dtype] = None,
    fp8_dtype=None,
    scale: Optional[torch.Tensor] = None,
    amax: Optional[torch.Tensor] = None,
    columnwise: bool = False,
):
    """``y = (x - mu) * rsigma * g + bias`` over the last dim, g = weight (+1 when
    ``zero_centered_gamma``), rsigma = 1/sqrt(biased variance + eps), in fp32.

    ``inp`` [..., hidden]; ``weight``, ``bias`` [hidden] (one float dtype, may differ from
    inp's). Output: ``out_dtype`` (default inp's dtype), or with ``fp8_dtype`` and
    ``scale`` (float32 [1]) a Float8TensorBase of fp8(y * scale), with the transposed
    copy too when ``columnwise``; ``amax`` (float32 [1]), if given, is raised in place to
    max(amax, max|y|) (of y before scaling; of a float y as stored, what a
    current-scaling cast of it needs, in the same pass). Returns ``(out, mu, rsigma)``,
    the statistics float32 [rows]."""
    return _norm_fwd(True, inp, weight, bias, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax,
                     columnwise)


def rmsnorm_fwd(
    inp: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    zero_centered_gamma: bool = False,
    out_dtype: Optional[torch.dtype] = None,
    fp8_dtype=None,
    scale: Optional[torch.Tensor] = None,
    amax: Optional[torch.Tensor] = None,
    columnwise: bool = False,
):
    """``y = x * rsigma * g``, rsigma = 1/sqrt(mean(x^2) + eps); arguments as layernorm_fwd
    without bias. Returns ``(out, None, rsigma)`` (Transformer Engine's triple: no mu)."""
    return _norm_fwd(False, inp, weight, None, eps, zero_centered_gamma, out_dtype, fp8_dtype, scale, amax,
                     columnwise)


def _norm_bwd(layernorm, dz, x, mu, rsigma, gamma, zero_centered_gamma):
    _check_float(x, "x")
    _check_float(dz, "dz")
    _check_float(gamma, "gamma")
    rows, hidden = _rows_hidden(x, "x")
    x_desc = describe(x, "x")
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dgamma = torch.empty(gamma.shape, dtype=gamma.dtype, device=gamma.device)
    dbeta = torch.empty(gamma.shape, dtype=gamma.dtype, device=gamma.device) if layernorm else None
    ws = _workspace(rows, hidden, x_desc, x.device)
    ws_ptr, ws_size = _ptr_size(ws)
    if layernorm:
        _core.layernorm_bwd(describe(dz, "dz"), x_desc, describe(mu, "mu"), describe(rsigma, "rsigma"),
                            describe(gamma, "gamma"), bool(zero_centered_gamma), describe(dx, "dx"),
                            describe(dgamma, "dgamma"), describe(dbeta, "dbeta"), ws_ptr, ws_size, stream_of(x))
    else:
        _core.rmsnorm_bwd(describe(dz, "dz"), x_desc, describe(rsigma, "rsigma"), describe(gamma, "gamma"),
                          bool(zero_centered_gamma), describe(dx, "dx"), describe(dgamma, "dgamma"), ws_ptr,
                          ws_size, stream_of(x))
    return dx, dgamma, dbeta


def layernorm_bwd(dz: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                  zero_centered_gamma: bool = False):
    """Gradients of layernorm_fwd from the saved ``mu`` and ``rsigma``: ``dz`` is the
    output's gradient (x's shape and dtype). Returns ``(dx, dgamma, dbeta)``, dx in x's
    dtype, dgamma and dbeta in gamma's."""
    return _norm_bwd(True, dz, x, mu, rsigma, gamma, zero_centered_gamma)


def rmsnorm_bwd(dz: torch.Tensor, x: torch.Tensor, rsigma: torch.Tensor, gamma: torch.Tensor,
                zero_centered_gamma: bool = False):
    """Gradients of rmsnorm_fwd from the saved ``rsigma``. Returns ``(dx, dgamma)``."""
    dx, dgamma, _ = _norm_bwd(False, dz, x, None, rsigma, gamma, zero_centered_gamma)
    return dx, dgamma
