"""Backward casts fused with the bias gradient, on torch tensors (Transformer Engine 2.x's
``bgrad_quantize`` and ``dbias_d<act>`` helpers, over te_dbias_cast_transpose /
te_dact_dbias_cast_transpose).

In the backward of a Linear, the output's gradient feeds two FP8 GEMMs (row-wise for
dgrad, the transposed copy for wgrad) and its column sums are the bias gradient. These
helpers read the gradient once and return both:

- ``bgrad_quantize(grad, ...)``: dbias = grad summed over all dims but the last, and grad
  cast to FP8 (a layer without activation);
- ``dbias_d<act>(grad, fwd_input, ...)``: dx = the gradient of ``<act>`` at ``fwd_input``
  times ``grad`` (as ``d<act>`` of activation.py), dbias = dx summed likewise, dx in FP8
  or in fwd_input's dtype;
- ``d<gated>_cast_transpose(grad, fwd_input, ...)``: the gated kinds' backward straight to
  FP8, without dbias.

dx is computed in fp32; dbias sums the fp32 dx in fp32 and is rounded once to the
input's dtype. FP8 results follow quantize(): ``scale`` (float32 [1]) is read, ``amax``
(if given) is raised in place to max(amax, max|dx|), and 1/scale lands in the result's
``_scale_inv``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.cast import columnwise_shape
from transformer_engine.pytorch.cpp_extensions.normalization import _check_float
from transformer_engine.pytorch.cpp_extensions.tensor_desc import check_fp32_buffer, describe, fp8_dtype_of, stream_of

# A module import, not a name: the tensor package imports the cast helpers of this
# package, so either package may be the one imported first.
import transformer_engine.pytorch.tensor._internal.float8_tensor_base as _f8

__all__ = [
    "bgrad_quantize",
    "dact_dbias_quantize",
    "dbias_dgelu", "dbias_dqgelu", "dbias_drelu", "dbias_dsrelu", "dbias_dsilu",
    "dgeglu_cast_transpose", "dqgeglu_cast_transpose", "dreglu_cast_transpose", "dsreglu_cast_transpose",
    "dswiglu_cast_transpose",
]

_A = _core.Activation


def _workspace(rows: int, cols: int, desc: _core.Tensor, device: torch.device):
    """(tensor, pointer, size) of the te_dbias_workspace_size scratch. The caller keeps the
    tensor (None on the CPU) referenced until the op is queued; the caching allocator then
    orders any reuse of the memory after it on the stream."""
    size = _core.dbias_workspace_size(rows, cols, *desc.device)
    if not size:
        return None, 0, 0
    ws = torch.empty(size, dtype=torch.uint8, device=device)
    return ws, ws.data_ptr(), size


def _fp8_output(like: torch.Tensor, like_desc: _core.Tensor, fp8_dtype, scale, amax, rowwise: bool, columnwise: bool):
    """(Float8TensorBase, descriptor) for an FP8 result of like's shape."""
    dtype = fp8_dtype_of(fp8_dtype)
    if scale is None:
        raise ValueError("scale (float32, one element) is required with fp8_dtype")
    check_fp32_buffer(scale, "scale", like)
    if amax is not None:
        check_fp32_buffer(amax, "amax", like)
    if not (rowwise or columnwise):
        raise ValueError("at least one of rowwise and columnwise must be True")
    data = torch.empty(like.shape, dtype=torch.uint8, device=like.device) if rowwise else None
    data_t = torch.empty(columnwise_shape(like.shape), dtype=torch.uint8, device=like.device) if columnwise else None
    scale_inv = torch.empty(1, dtype=torch.float32, device=like.device)
    out = _f8.Float8TensorBase(data=data, data_transpose=data_t, fp8_scale_inv=scale_inv, fp8_dtype=dtype)
    desc = _core.Tensor(*like_desc.device, int(dtype), list(like.shape), data.data_ptr() if data is not None else 0,
                        data_t.data_ptr() if data_t is not None else 0, scale.data_ptr(), scale_inv.data_ptr(),
                        amax.data_ptr() if amax is not None else 0, int(_core.ScalingMode.PER_TENSOR))
    return out, desc


def _check_has_dims(t: torch.Tensor, name: str) -> None:
    if t.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")


def bgrad_quantize(grad: torch.Tensor, fp8_dtype, scale: torch.Tensor, amax: Optional[torch.Tensor] = None,
                   rowwise: bool = True, columnwise: bool = True):
    """``(dbias, grad_fp8)``: dbias [grad.shape[-1]] = grad summed over its other dims (grad's
    dtype), and grad cast to FP8 as a Float8TensorBase with the row-wise data (``rowwise``)
    and / or the transposed copy [d_{n-1}, d_0, ..., d_{n-2}] (``columnwise``), in one pass."""
    _check_float(grad, "grad")
    _check_has_dims(grad, "grad")
    grad_desc = describe(grad, "grad")
    out, out_desc = _fp8_output(grad, grad_desc, fp8_dtype, scale, amax, rowwise, columnwise)
    cols = grad.shape[-1]
    dbias = torch.empty(cols, dtype=grad.dtype, device=grad.device)
    ws, ws_ptr, ws_size = _workspace(math.prod(grad.shape[:-1]), cols, grad_desc, grad.device)
    _core.dbias_cast_transpose(grad_desc, out_desc, describe(dbias, "dbias"), ws_ptr, ws_size, stream_of(grad))
    return dbias, out


def _dact(kind, grad, fwd_input, fp8_dtype, scale, amax, columnwise, with_dbias):
    _check_float(fwd_input, "fwd_input")
    _check_float(grad, "grad")
    _check_has_dims(fwd_input, "fwd_input")
    in_desc = describe(fwd_input, "fwd_input")
    if fp8_dtype is None:
        if scale is not None or amax is not None:
            raise ValueError("scale and amax are for an FP8 dx: pass fp8_dtype too")
        out = torch.empty(fwd_input.shape, dtype=fwd_input.dtype, device=fwd_input.device)
        out_desc = describe(out, "dx")
    else:
        out, out_desc = _fp8_output(fwd_input, in_desc, fp8_dtype, scale, amax, True, columnwise)
    dbias, dbias_desc, ws, ws_ptr, ws_size = None, None, None, 0, 0
    if with_dbias:
        cols = fwd_input.shape[-1]
        dbias = torch.empty(cols, dtype=fwd_input.dtype, device=fwd_input.device)
        dbias_desc = describe(dbias, "dbias")
        ws, ws_ptr, ws_size = _workspace(math.prod(fwd_input.shape[:-1]), cols, in_desc, fwd_input.device)
    _core.dact_dbias_cast_transpose(int(kind), describe(grad, "grad"), in_desc, out_desc, dbias_desc, ws_ptr, ws_size,
                                    stream_of(fwd_input))
    return dbias, out


def _make_dbias(kind, act: str):
    def fn(grad: torch.Tensor, fwd_input: torch.Tensor, fp8_dtype=None, scale: Optional[torch.Tensor] = None,
           amax: Optional[torch.Tensor] = None, columnwise: bool = True):
        return _dact(kind, grad, fwd_input, fp8_dtype, scale, amax, columnwise, True)

    fn.__name__ = fn.__qualname__ = f"dbias_d{act}"
    fn.__doc__ = (
        f"``(dbias, dx)``: dx = grad * {act}'(fwd_input) (``grad`` and ``fwd_input`` of one shape and\n"
        "dtype), dbias [fwd_input.shape[-1]] = dx summed over the other dims, in fwd_input's dtype.\n\n"
        "dx: a tensor of fwd_input's dtype, or with ``fp8_dtype`` and ``scale`` a Float8TensorBase with\n"
        "the row-wise data and, when ``columnwise`` (the default), the transposed copy; ``amax``, if\n"
        "given, is raised in place to max(amax, max|dx|). ``columnwise`` is ignored without fp8_dtype."
    )
    return fn


def _make_gated(kind, act: str):
    def fn(grad: torch.Tensor, fwd_input: torch.Tensor, fp8_dtype, scale: torch.Tensor,
           amax: Optional[torch.Tensor] = None, columnwise: bool = True):
        return _dact(kind, grad, fwd_input, fp8_dtype, scale, amax, columnwise, False)[1]

    fn.__name__ = fn.__qualname__ = f"d{act}_cast_transpose"
    fn.__doc__ = (
        f"The gradient of {act}'s input [..., 2H] = [a | b] from ``grad`` [..., H], cast to FP8 in one\n"
        "pass: a Float8TensorBase with the row-wise data and, when ``columnwise``, the transposed copy;\n"
        "``amax``, if given, is raised in place to max(amax, max|dx|)."
    )
    return fn


dbias_dgelu = _make_dbias(_A.GELU, "gelu")
dbias_dqgelu = _make_dbias(_A.QGELU, "qgelu")
dbias_drelu = _make_dbias(_A.RELU, "relu")
dbias_dsrelu = _make_dbias(_A.SRELU, "srelu")
dbias_dsilu = _make_dbias(_A.SILU, "silu")
dgeglu_cast_transpose = _make_gated(_A.GEGLU, "geglu")
dqgeglu_cast_transpose = _make_gated(_A.QGEGLU, "qgeglu")
dreglu_cast_transpose = _make_gated(_A.REGLU, "reglu")
dsreglu_cast_transpose = _make_gated(_A.SREGLU, "sreglu")
dswiglu_cast_transpose = _make_gated(_A.SWIGLU, "swiglu")


_KINDS = {"gelu": _A.GELU, "qgelu": _A.QGELU, "relu": _A.RELU, "srelu": _A.SRELU, "silu": _A.SILU,
          "geglu": _A.GEGLU, "qgeglu": _A.QGEGLU, "reglu": _A.REGLU, "sreglu": _A.SREGLU, "swiglu": _A.SWIGLU}


def dact_dbias_quantize(activation: str, grad: torch.Tensor, fwd_input: torch.Tensor, fp8_dtype,
                        scale: torch.Tensor, amax: Optional[torch.Tensor] = None, *, with_dbias: bool = True,
                        columnwise: bool = True):
    """Any activation by name (gelu ... swiglu): ``(dbias or None, dx as a Float8TensorBase)``
    in one pass, as dbias_dgelu & co. and d*_cast_transpose (gated kinds included)."""
    if activation not in _KINDS:
        raise ValueError(f"activation must be one of {', '.join(_KINDS)}, got {activation!r}")
    return _dact(_KINDS[activation], grad, fwd_input, fp8_dtype, scale, amax, columnwise, with_dbias)
