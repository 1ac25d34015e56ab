"""FP8 data with a per-tensor scale, stored as Transformer Engine 2.x stores it."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from transformer_engine.pytorch.cpp_extensions.cast import columnwise_shape, dequantize, quantize, transpose
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType, check_fp32_buffer, fp8_dtype_of

__all__ = ["Float8TensorBase"]


def rowwise_shape(columnwise: torch.Size) -> torch.Size:
    """The logical shape whose column-wise copy has shape ``columnwise`` (the inverse of
    ``columnwise_shape``)."""
    return torch.Size((*columnwise[1:], columnwise[0])) if len(columnwise) else torch.Size(())


def _rowwise_from_columnwise(data_t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Row-wise FP8 bits of ``shape`` from the column-wise copy (a 2-D transpose back)."""
    if not shape:
        return data_t.reshape(shape).clone()
    rows = math.prod(shape[:-1])
    return transpose(data_t.reshape(shape[-1], rows)).reshape(shape)


class Float8TensorBase:
    """FP8 values ``fp8(bits) * _scale_inv`` with one scale for the whole tensor.

    ``_data``       torch.uint8 row-wise FP8 bits of the logical shape, or None;
    ``_transpose``  torch.uint8 column-wise copy [d_{n-1}, d_0, ..., d_{n-2}], or None
                    (Hopper's FP8 GEMM only reads the "TN" form, so the backward
                    GEMMs of a Linear need the transposed copy);
    ``_scale_inv``  float32 [1] on the data's device, 1/scale of the cast;
    ``_fp8_dtype``  DType.kFloat8E4M3 or DType.kFloat8E5M2;
    ``_quantizer``  whatever made it (kept for the caller; not read here).

    Built in ``__new__`` with Transformer Engine's keyword names so that a
    torch.Tensor subclass (Float8Tensor) can inherit from it later.
    """

    _data: Optional[torch.Tensor]
    _transpose: Optional[torch.Tensor]
    _scale_inv: torch.Tensor
    _fp8_dtype: DType
    _quantizer: Any

    def __new__(cls, *args, fp8_scale_inv, fp8_dtype, data=None, data_transpose=None, quantizer=None, **kwargs):
        instance = object.__new__(cls) if cls is Float8TensorBase else super().__new__(cls, *args, **kwargs)
        if data is None and data_transpose is None:
            raise ValueError("Float8TensorBase needs data, data_transpose or both")
        for t, name in ((data, "data"), (data_transpose, "data_transpose")):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
                raise TypeError(f"{name} must be a torch.uint8 tensor of FP8 bits, got {getattr(t, 'dtype', type(t))}")
        if data is not None and data_transpose is not None:
            if data_transpose.shape != columnwise_shape(data.shape):
                raise ValueError(f"data_transpose shape {tuple(data_transpose.shape)} must be "
                                 f"{columnwise_shape(data.shape)} (the column-wise copy of data {tuple(data.shape)})")
            if data_transpose.device != data.device:
                raise ValueError(f"data_transpose is on {data_transpose.device} but data is on {data.device}")
        like = data if data is not None else data_transpose
        check_fp32_buffer(fp8_scale_inv, "fp8_scale_inv", like)
        instance._data = data
        instance._transpose = data_transpose
        instance._scale_inv = fp8_scale_inv
        instance._fp8_dtype = fp8_dtype_of(fp8_dtype)
        instance._quantizer = quantizer
        return instance

    def __getnewargs_ex__(self):
        """The constructor's keywords, for copy.deepcopy and pickle of the plain storage (a
        module holding a cached FP8 weight is deep-copied with it). Float8Tensor has its
        own __reduce_ex__."""
        return (), dict(fp8_scale_inv=self._scale_inv, fp8_dtype=self._fp8_dtype, data=self._data,
                        data_transpose=self._transpose)

    @staticmethod
    def wrap(data: Optional[torch.Tensor], data_transpose: Optional[torch.Tensor], scale_inv: torch.Tensor,
             fp8_dtype: DType) -> "Float8TensorBase":
        """Storage over buffers its caller just allocated and filled by a cast (uint8 data of
        the logical shape and / or its column-wise copy, float32 [1] scale_inv on their
        device, a DType), without the checks of the constructor: the modules' hot path."""
        instance = object.__new__(Float8TensorBase)
        instance._data = data
        instance._transpose = data_transpose
        instance._scale_inv = scale_inv
        instance._fp8_dtype = fp8_dtype
        instance._quantizer = None
        return instance

    @classmethod
    def from_tensor(cls, x: torch.Tensor, fp8_dtype, scale: torch.Tensor, amax: torch.Tensor | None = None,
                    rowwise: bool = True, columnwise: bool = False) -> "Float8TensorBase":
        """Casts ``x`` with ``scale`` (float32 [1], x's device) in one pass; ``amax``, if
        given, is raised to max(amax, max|x|) as the cast does."""
        data, data_t, scale_inv = quantize(x, fp8_dtype, scale, amax=amax, rowwise=rowwise, columnwise=columnwise)
        return cls(data=data, fp8_scale_inv=scale_inv, fp8_dtype=fp8_dtype, data_transpose=data_t)

    def size(self, *args):
        """The logical shape (of the row-wise data), as torch.Tensor.size()."""
        if self._data is not None:
            return self._data.size(*args)
        full = rowwise_shape(self._transpose.shape)
        return full[args[0]] if args else full

    @property
    def shape(self) -> torch.Size:
        return self.size()

    @property
    def device(self) -> torch.device:
        return (self._data if self._data is not None else self._transpose).device

    def dequantize(self, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values as ``dtype``, of the logical shape."""
        if self._data is not None:
            return dequantize(self._data, self._scale_inv, self._fp8_dtype, dtype)
        values_t = dequantize(self._transpose, self._scale_inv, self._fp8_dtype, dtype)
        shape = self.size()
        if not shape:
            return values_t.reshape(shape)
        # The copy is the 2-D transpose of [d_0 * ... * d_{n-2}, d_{n-1}]: undo it in 2-D.
        rows = math.prod(shape[:-1])
        return transpose(values_t.reshape(shape[-1], rows)).reshape(shape)

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None) -> None:
        """Makes the row-wise / column-wise layout exist (True) or frees it (False); None
        leaves it. A missing layout is made from the other one by an exact transpose."""
        want_rowwise = (self._data is not None) if rowwise_usage is None else bool(rowwise_usage)
        want_columnwise = (self._transpose is not None) if columnwise_usage is None else bool(columnwise_usage)
        if not (want_rowwise or want_columnwise):
            raise ValueError("update_usage: a tensor needs at least one of the row-wise and column-wise layouts")
        if want_rowwise and self._data is None:
            self._data = _rowwise_from_columnwise(self._transpose, self.size())
        if want_columnwise and self._transpose is None:
            self._transpose = transpose(self._data) if self._data.dim() else self._data.clone()
        if not want_rowwise:
            self._data = None
        if not want_columnwise:
            self._transpose = None
        # module_ops' cached GEMM descriptor holds the layouts it was built from: let a
        # dropped one go now.
        self.__dict__.pop("_gemm_desc", None)

    def get_metadata(self) -> dict[str, Any]:
        """The constructor keywords of a tensor sharing this one's buffers."""
        return {"data": self._data, "fp8_scale_inv": self._scale_inv, "fp8_dtype": self._fp8_dtype,
                "data_transpose": self._transpose, "quantizer": self._quantizer}

    def __repr__(self) -> str:
        layouts = [name for name, t in (("rowwise", self._data), ("columnwise", self._transpose)) if t is not None]
        return (f"Float8TensorBase(shape={tuple(self.size())}, fp8_dtype={self._fp8_dtype.name}, "
                f"{'+'.join(layouts)}, device={self.device})")
