"""``Float8Tensor``: per-tensor-scaled FP8 data that torch sees as a tensor of its
nominal dtype (Transformer Engine 2.x).

FP8-aware ops (they keep the FP8 data, no dequantization):
  detach, alias, clone, view / reshape (``_unsafe_view``), ``t`` and ``transpose`` of
  the two dims of a 2-D tensor (the stored column-wise copy becomes the row-wise
  data), ``copy_`` (FP8 source: the bits; anything else: re-quantized with the
  tensor's quantizer), ``empty_like`` (an FP8 tensor with the same quantizer).
Every other op runs on the dequantized values (see quantized_tensor.py): e.g.
``f8 + 1``, ``f8.sum()``, ``torch.zeros_like(f8)`` (so optimizer state is not FP8)
return plain tensors, and in-place ops re-quantize.

Views share the buffers, including the scale_inv tensor, so an in-place update
through a view that covers the whole tensor is seen by every view. Slices
(``f8[0]``) are not views here: they come back dequantized, and writing into
them does not reach the FP8 data. A view that changes the last dimension keeps
only the row-wise data (the column-wise copy has another layout).

The quantizer used for the fallback in-place ops and ``quantize_`` is the one
that made the tensor; a tensor without one gets a delayed-scaling quantizer with
scale = 1/scale_inv.
"""

from __future__ import annotations

from typing import Optional

import torch

from transformer_engine.pytorch.cpp_extensions.cast import columnwise_shape, transpose
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType
from transformer_engine.pytorch.tensor._internal.float8_tensor_base import (
    Float8TensorBase,
    _rowwise_from_columnwise,
    rowwise_shape,
)
from transformer_engine.pytorch.tensor.quantized_tensor import (
    NOMINAL_DTYPES,
    QuantizedTensor,
    contiguous_strides,
)
from transformer_engine.pytorch.tensor.quantizer import Quantizer, _rebuild_quantizer

__all__ = ["Float8Tensor"]  # and, through __getattr__ below, the two quantizers

aten = torch.ops.aten


class Float8Tensor(Float8TensorBase, QuantizedTensor):
    """FP8 data (``Float8TensorBase``) presented as a torch.Tensor of ``dtype``.

    Keywords (Transformer Engine's): ``shape``, ``dtype`` (the nominal, high-precision
    dtype: float32 / float16 / bfloat16), ``data`` (uint8 FP8 bits of ``shape``) and/or
    ``data_transpose`` (the column-wise copy), ``fp8_scale_inv`` (float32 [1]),
    ``fp8_dtype``, ``quantizer``, ``requires_grad``.
    """

    # The wrapper's own metadata, not Float8TensorBase's look at the stored buffers.
    size = torch.Tensor.size
    shape = torch.Tensor.shape
    device = torch.Tensor.device

    def __new__(cls, *, shape, dtype: torch.dtype, fp8_scale_inv: torch.Tensor, fp8_dtype,
                data: Optional[torch.Tensor] = None, data_transpose: Optional[torch.Tensor] = None,
                quantizer: Optional[Quantizer] = None, requires_grad: bool = False):
        stored = data if data is not None else data_transpose
        if not isinstance(stored, torch.Tensor):
            raise ValueError("Float8Tensor needs data, data_transpose or both as torch.uint8 tensors")
        shape = torch.Size(int(d) for d in shape)
        expected = stored.shape if data is not None else rowwise_shape(stored.shape)
        if shape != expected:
            what = "data" if data is not None else "data_transpose"
            raise ValueError(f"Float8Tensor: shape {tuple(shape)} does not match {what} of shape {tuple(stored.shape)}")
        return super().__new__(cls, shape, dtype, requires_grad=requires_grad, device=stored.device,
                               data=data, data_transpose=data_transpose, fp8_scale_inv=fp8_scale_inv,
                               fp8_dtype=fp8_dtype, quantizer=quantizer)

    @classmethod
    def from_tensor(cls, x: torch.Tensor, fp8_dtype, scale: torch.Tensor, amax: Optional[torch.Tensor] = None,
                    rowwise: bool = True, columnwise: bool = False) -> "Float8Tensor":
        """``x`` cast with ``scale`` (nominal dtype: x's), as Float8TensorBase.from_tensor."""
        from transformer_engine.pytorch.tensor.float8_quantizer import Float8Quantizer

        if amax is None:
            amax = torch.zeros(1, dtype=torch.float32, device=scale.device)
        return Float8Quantizer(scale, amax, fp8_dtype, rowwise=rowwise, columnwise=columnwise)._quantize(x)

    def __repr__(self, *, tensor_contents=None) -> str:
        return (f"Float8Tensor(fp8_dtype={self._fp8_dtype.name}, scale_inv={self._scale_inv.item()}, "
                f"data={self._dequantize(self.dtype)})")

    def _dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return Float8TensorBase.dequantize(self, dtype=dtype)

    def dequantize(self, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        return QuantizedTensor.dequantize(self, dtype=dtype)

    def _get_quantizer(self) -> Quantizer:
        if self._quantizer is not None:
            return self._quantizer
        from transformer_engine.pytorch.tensor.float8_quantizer import Float8Quantizer

        return Float8Quantizer(scale=torch.reciprocal(self._scale_inv), amax=torch.zeros_like(self._scale_inv),
                               fp8_dtype=self._fp8_dtype, rowwise=self._data is not None,
                               columnwise=self._transpose is not None)

    @torch.no_grad()
    def quantize_(self, tensor: torch.Tensor, *, noop_flag: Optional[torch.Tensor] = None) -> "Float8Tensor":
        """Re-quantizes ``tensor`` (broadcast to this shape, like copy_) into this tensor's
        buffers with its quantizer; an FP8 source is dequantized first."""
        if isinstance(tensor, QuantizedTensor):
            tensor = tensor._dequantize(tensor.dtype)
        if not isinstance(tensor, torch.Tensor):
            tensor = torch.as_tensor(tensor, dtype=self.dtype, device=self.device)
        if tensor.dtype not in NOMINAL_DTYPES:
            tensor = tensor.to(self.dtype)
        if tensor.shape != self.shape:
            tensor = tensor.expand(self.shape)
        self._get_quantizer().update_quantized(tensor.to(self.device), self, noop_flag=noop_flag)
        return self

    def get_metadata(self) -> dict:
        return Float8TensorBase.get_metadata(self)

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None) -> None:
        Float8TensorBase.update_usage(self, rowwise_usage, columnwise_usage)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _FP8_OPS.get(func)
        if handler is not None:
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return super().__torch_dispatch__(func, types, args, kwargs)

    # ``.data`` reads as a detached Float8Tensor sharing the buffers. Assigning a
    # Float8Tensor (or FP8 storage) takes its buffers; assigning a plain tensor
    # quantizes it with this tensor's quantizer.
    @property
    def data(self) -> "Float8Tensor":
        return torch._C.TensorBase.data.__get__(self, type(self))

    @data.setter
    def data(self, tensor: torch.Tensor) -> None:
        with torch.no_grad():
            if not isinstance(tensor, Float8TensorBase):
                if not isinstance(tensor, torch.Tensor):
                    raise TypeError(f"Float8Tensor.data must be set to a tensor, got {type(tensor).__name__}")
                quantized = self._get_quantizer()._quantize(tensor)
                nominal = tensor.dtype if tensor.dtype in NOMINAL_DTYPES else self.dtype
            else:
                quantized = tensor
                nominal = tensor.dtype if isinstance(tensor, Float8Tensor) else self.dtype
            shape, device = quantized.size(), quantized.device
            if (self.shape, self.dtype, self.device) != (shape, nominal, device):
                # Let torch's own metadata follow (TE does the same): set_data from a
                # wrapper of the new shape / dtype / device.
                like = torch.Tensor._make_wrapper_subclass(
                    Float8Tensor, shape, strides=contiguous_strides(shape), storage_offset=0, dtype=nominal,
                    layout=torch.strided, device=device, requires_grad=False)
                torch._C.TensorBase.data.__set__(self, like)
            self._data = quantized._data
            self._transpose = quantized._transpose
            self._scale_inv = quantized._scale_inv
            self._fp8_dtype = quantized._fp8_dtype
            self._quantizer = quantized._quantizer

    def __reduce_ex__(self, protocol):
        """Pickles as plain tensors and values (torch.save / torch.load, weights_only
        included): the row-wise bits (the column-wise copy is rebuilt on load), the
        scale_inv, the quantizer, and whether this is a Parameter."""
        state = {
            "shape": self.shape,
            "dtype": self.dtype,
            "fp8_dtype": int(self._fp8_dtype),
            "scale_inv": self._scale_inv,
            "data": self._data,
            "data_transpose": self._transpose if self._data is None else None,
            "columnwise": self._transpose is not None,
            "quantizer": self._quantizer,
            "requires_grad": self.requires_grad,
            "is_param": bool(getattr(self, "_is_param", False)),
        }
        return _rebuild_float8_tensor, (state,)


def _rebuild_float8_tensor(state: dict):
    """Unpickling helper of Float8Tensor.__reduce_ex__."""
    data, data_t = state["data"], state["data_transpose"]
    if data is not None and state["columnwise"]:
        data_t = transpose(data.contiguous()) if data.dim() else data.clone()
    tensor = Float8Tensor(shape=state["shape"], dtype=state["dtype"], data=data, data_transpose=data_t,
                          fp8_scale_inv=state["scale_inv"], fp8_dtype=DType(state["fp8_dtype"]),
                          quantizer=state["quantizer"], requires_grad=state["requires_grad"])
    if state["is_param"]:
        return torch.nn.Parameter(tensor, requires_grad=state["requires_grad"])
    return tensor


# ---- the FP8-aware ops ----------------------------------------------------------


_SAME = object()  # "the buffer of the tensor shared from"


def _share(tensor: Float8Tensor, *, shape=None, data=_SAME, data_transpose=_SAME) -> Float8Tensor:
    """A Float8Tensor over ``tensor``'s scale_inv and the given FP8 buffers (by default its own)."""
    return Float8Tensor(
        shape=tensor.shape if shape is None else shape, dtype=tensor.dtype,
        data=tensor._data if data is _SAME else data,
        data_transpose=tensor._transpose if data_transpose is _SAME else data_transpose,
        fp8_scale_inv=tensor._scale_inv, fp8_dtype=tensor._fp8_dtype, quantizer=tensor._quantizer)


def _detach(tensor, *args, **kwargs):
    return _share(tensor)


def _clone(tensor, *, memory_format=None):
    return Float8Tensor(shape=tensor.shape, dtype=tensor.dtype,
                        data=tensor._data.clone() if tensor._data is not None else None,
                        data_transpose=tensor._transpose.clone() if tensor._transpose is not None else None,
                        fp8_scale_inv=tensor._scale_inv.clone(), fp8_dtype=tensor._fp8_dtype,
                        quantizer=tensor._quantizer)


def _last_dim(shape) -> int:
    return shape[-1] if len(shape) else 1


def _view(tensor, size):
    # torch resolves -1 and rejects bad sizes with its usual message.
    shape = torch.empty(tensor.shape, device="meta").view(size).shape
    # The column-wise copy is the 2-D transpose of [rows, last dim]: it stays valid
    # (viewed) as long as the last dimension does.
    same_last = _last_dim(shape) == _last_dim(tensor.shape)
    data_t = tensor._transpose.view(columnwise_shape(shape)) \
        if tensor._transpose is not None and same_last else None
    if tensor._data is None:
        if data_t is None:
            return NotImplemented
        return _share(tensor, shape=shape, data=None, data_transpose=data_t)
    return _share(tensor, shape=shape, data=tensor._data.view(shape), data_transpose=data_t)


def _transpose_2d(tensor):
    """[m, n] -> [n, m]: the row-wise and column-wise copies swap roles."""
    m, n = tensor.shape
    if tensor._transpose is not None:
        return _share(tensor, shape=(n, m), data=tensor._transpose, data_transpose=tensor._data)
    # No stored copy: transpose the FP8 bits (exact); the original data is the new copy.
    return _share(tensor, shape=(n, m), data=transpose(tensor._data), data_transpose=tensor._data)


def _t(tensor):
    if tensor.dim() < 2:
        return _share(tensor)
    return _transpose_2d(tensor)


def _transpose(tensor, dim0, dim1):
    ndim = max(tensor.dim(), 1)
    dim0, dim1 = dim0 % ndim, dim1 % ndim
    if dim0 == dim1:
        return _share(tensor)
    if tensor.dim() == 2:
        return _transpose_2d(tensor)
    return NotImplemented


def _copy(dst, src, non_blocking=False):
    if not isinstance(dst, Float8Tensor):
        return NotImplemented
    if not (isinstance(src, Float8TensorBase) and src._fp8_dtype == dst._fp8_dtype and src.size() == dst.shape):
        return dst.quantize_(src)
    # FP8 to FP8 of one format: copy the bits and the scale.
    src_data = src._data if src._data is not None else _rowwise_from_columnwise(src._transpose, src.size())
    if dst._data is not None:
        dst._data.copy_(src_data, non_blocking=non_blocking)
    if dst._transpose is not None:
        if src._transpose is not None:
            dst._transpose.copy_(src._transpose, non_blocking=non_blocking)
        else:
            src_data = src_data.to(dst.device)
            dst._transpose.copy_(transpose(src_data) if src_data.dim() else src_data)
    dst._scale_inv.copy_(src._scale_inv.reshape(dst._scale_inv.shape), non_blocking=non_blocking)
    return dst


def _same_device(device, tensor) -> bool:
    if device is None:
        return True
    device = torch.device(device)
    return device.type == tensor.device.type and device.index in (None, tensor.device.index)


def _empty_like(tensor, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    same = (dtype is None or dtype == tensor.dtype) and (layout in (None, torch.strided)) \
        and _same_device(device, tensor) and not pin_memory
    if not same:
        return NotImplemented
    return Float8Tensor(shape=tensor.shape, dtype=tensor.dtype,
                        data=torch.empty_like(tensor._data) if tensor._data is not None else None,
                        data_transpose=torch.empty_like(tensor._transpose) if tensor._transpose is not None else None,
                        fp8_scale_inv=torch.ones_like(tensor._scale_inv), fp8_dtype=tensor._fp8_dtype,
                        quantizer=tensor._quantizer)


_FP8_OPS = {
    aten.detach.default: _detach,
    aten.alias.default: _detach,
    aten.clone.default: _clone,
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.t.default: _t,
    aten.transpose.int: _transpose,
    aten.copy_.default: _copy,
    aten.empty_like.default: _empty_like,
}

if hasattr(torch.serialization, "add_safe_globals"):
    # torch.load(weights_only=True), the default since torch 2.6, may call these.
    torch.serialization.add_safe_globals([_rebuild_float8_tensor, _rebuild_quantizer])


def __getattr__(name):
    # Transformer Engine keeps the quantizers in this module; they live in
    # float8_quantizer.py, which imports this one.
    if name in ("Float8Quantizer", "Float8CurrentScalingQuantizer"):
        from transformer_engine.pytorch.tensor import float8_quantizer

        return getattr(float8_quantizer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
