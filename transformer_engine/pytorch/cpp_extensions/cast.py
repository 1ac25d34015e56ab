"""FP8 cast (with optional transpose), dequantize, transpose and amax on torch tensors."""

from __future__ import annotations

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import (
    DType,
    check_fp32_buffer,
    describe,
    fp8_dtype_of,
    stream_of,
)

__all__ = ["quantize", "quantize_into", "dequantize", "transpose", "compute_amax"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TE_TO_TORCH_FP8 = {DType.kFloat8E4M3: torch.float8_e4m3fn, DType.kFloat8E5M2: torch.float8_e5m2}


def _check_float_input(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def columnwise_shape(shape) -> tuple[int, ...]:
    """Transformer Engine's layout of a transposed copy: [d_{n-1}, d_0, ..., d_{n-2}]."""
    shape = tuple(shape)
    return (shape[-1], *shape[:-1]) if shape else ()


def quantize(
    x: torch.Tensor,
    fp8_dtype,
    scale: torch.Tensor,
    *,
    amax: torch.Tensor | None = None,
    scale_inv: torch.Tensor | None = None,
    rowwise: bool = True,
    columnwise: bool = False,
):
    """Casts ``x`` to FP8 with ``scale`` (float32, one element, on x's device).

    Returns ``(data, data_t, scale_inv)``: ``data`` the row-wise uint8 FP8 bits of
    x's shape (None unless ``rowwise``), ``data_t`` the transposed copy of shape
    [x.shape[-1], *x.shape[:-1]] (None unless ``columnwise``), both written in one
    pass, and ``scale_inv`` = 1/scale. ``amax``, if given, is updated in place to
    max(amax, max|x|).
    """
    _check_float_input(x, "x")
    if not (rowwise or columnwise):
        raise ValueError("quantize: at least one of rowwise and columnwise must be True")
    data = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if rowwise else None
    data_t = torch.empty(columnwise_shape(x.shape), dtype=torch.uint8, device=x.device) if columnwise else None
    return quantize_into(x, fp8_dtype, scale, data=data, data_t=data_t, amax=amax, scale_inv=scale_inv)


def _check_fp8_output(t: torch.Tensor, name: str, shape, x: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
        raise TypeError(f"{name} must be a torch.uint8 tensor for the FP8 bits, got {getattr(t, 'dtype', type(t))}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but must be on {x.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def quantize_into(
    x: torch.Tensor,
    fp8_dtype,
    scale: torch.Tensor,
    *,
    data: torch.Tensor | None,
    data_t: torch.Tensor | None,
    amax: torch.Tensor | None = None,
    scale_inv: torch.Tensor | None = None,
):
    """``quantize`` into given buffers: ``data`` (uint8, x's shape) and/or ``data_t``
    (uint8, [x.shape[-1], *x.shape[:-1]]), contiguous on x's device; the ones that
    are given are written in one pass. Returns ``(data, data_t, scale_inv)``."""
    _check_float_input(x, "x")
    dtype = fp8_dtype_of(fp8_dtype)
    check_fp32_buffer(scale, "scale", x)
    if amax is not None:
        check_fp32_buffer(amax, "amax", x)
    if scale_inv is None:
        scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
    check_fp32_buffer(scale_inv, "scale_inv", x)
    if data is None and data_t is None:
        raise ValueError("quantize: at least one of the row-wise and column-wise outputs is needed")
    if data is not None:
        _check_fp8_output(data, "data", x.shape, x)
    if data_t is not None:
        _check_fp8_output(data_t, "data_t", columnwise_shape(x.shape), x)
    x_desc = describe(x, "x")
    out = _core.Tensor(
        *x_desc.device,
        int(dtype),
        list(x.shape),
        data.data_ptr() if data is not None else 0,
        data_t.data_ptr() if data_t is not None else 0,
        scale.data_ptr(),
        scale_inv.data_ptr(),
        amax.data_ptr() if amax is not None else 0,
        int(_core.ScalingMode.PER_TENSOR),
    )
    _core.quantize(x_desc, out, stream_of(x))
    return data, data_t, scale_inv


def dequantize(data: torch.Tensor, scale_inv: torch.Tensor, fp8_dtype=None, dtype: torch.dtype = torch.float32):
    """FP8 bits (uint8 with ``fp8_dtype``, or a torch float8 tensor) times ``scale_inv``, as ``dtype``."""
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"data must be a torch.Tensor, got {type(data).__name__}")
    if data.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        inferred = fp8_dtype_of(data.dtype, "data")
        if fp8_dtype is not None and fp8_dtype_of(fp8_dtype) != inferred:
            raise TypeError(f"fp8_dtype {fp8_dtype!r} contradicts data dtype {data.dtype}")
        fp8_dtype = inferred
    elif data.dtype == torch.uint8:
        if fp8_dtype is None:
            raise TypeError("fp8_dtype is required when data is a uint8 tensor")
        fp8_dtype = fp8_dtype_of(fp8_dtype)
    else:
        raise TypeError(f"data must be uint8 or a torch float8 dtype, got {data.dtype}")
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    check_fp32_buffer(scale_inv, "scale_inv", data)
    out = torch.empty(data.shape, dtype=dtype, device=data.device)
    src = describe(data, "data", dtype=fp8_dtype, scale_inv=scale_inv, scaling_mode=_core.ScalingMode.PER_TENSOR)
    _core.dequantize(src, describe(out, "out"), stream_of(data))
    return out


def transpose(x: torch.Tensor) -> torch.Tensor:
    """``x`` [d_0, ..., d_{n-1}] transposed to [d_{n-1}, d_0, ..., d_{n-2}] (any dtype, FP8 bits too)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension")
    x_desc = describe(x, "x")
    out = torch.empty(columnwise_shape(x.shape), dtype=x.dtype, device=x.device)
    _core.transpose(x_desc, describe(out, "out"), stream_of(x))
    return out


def compute_amax(x: torch.Tensor, amax: torch.Tensor | None = None) -> torch.Tensor:
    """max|x| (NaNs ignored) as a float32 tensor of one element on x's device.

    With ``amax`` given, it is updated in place to max(amax, max|x|) and returned."""
    _check_float_input(x, "x")
    if amax is None:
        amax = torch.zeros(1, dtype=torch.float32, device=x.device)
    check_fp32_buffer(amax, "amax", x)
    _core.compute_amax(describe(x, "x"), amax.data_ptr(), stream_of(x))
    return amax
