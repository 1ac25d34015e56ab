"""``QuantizedTensor``: the torch.Tensor face of quantized data (Transformer Engine 2.x).

A quantized tensor is a wrapper subclass: torch sees a tensor of the nominal
(high-precision) dtype, shape and device, with no storage of its own; the
quantized buffers live in Python attributes. Every torch op reaches
``__torch_dispatch__``; subclasses keep the ops they can do on quantized data
(views, detach, copies) and this class runs all others on the dequantized values:
  - an op that only reads returns plain high-precision tensors;
  - an op that writes into a quantized argument (``add_``, ``mul_``, ``out=``...)
    runs on a dequantized copy that is then quantized back into the argument, so
    an optimizer step on an FP8 parameter re-quantizes it.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch.utils._pytree import tree_map

from transformer_engine.pytorch.tensor.quantizer import Quantizer

__all__ = ["QuantizedTensor", "Quantizer"]

aten = torch.ops.aten

# The nominal dtypes: what the quantized data can be dequantized to.
NOMINAL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


class _DequantizeFunc(torch.autograd.Function):
    """Quantized -> high precision, with the identity as gradient."""

    @staticmethod
    def forward(ctx, tensor: "QuantizedTensor", dtype: torch.dtype) -> torch.Tensor:
        ctx.nominal_dtype = tensor.dtype
        return tensor._dequantize(dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.nominal_dtype), None


def _unwrap(arg):
    """A quantized tensor as its dequantized values (nominal dtype); anything else as is."""
    if isinstance(arg, QuantizedTensor):
        return arg._dequantize(arg.dtype)
    return arg


def _write_back(arg, new_arg, schema_arg) -> None:
    """After a mutating op ran on dequantized copies: quantize what it wrote back into
    the quantized argument it stands for (lists of tensors element by element)."""
    alias = schema_arg.alias_info
    if alias is None or not alias.is_write:
        return
    if isinstance(arg, QuantizedTensor) and isinstance(new_arg, torch.Tensor):
        arg.quantize_(new_arg)
    elif isinstance(arg, (list, tuple)) and isinstance(new_arg, (list, tuple)):
        for a, n in zip(arg, new_arg):
            if isinstance(a, QuantizedTensor) and isinstance(n, torch.Tensor):
                a.quantize_(n)


def _run_dequantized(func, args, kwargs):
    """The fallback: ``func`` on the dequantized values (see the module docstring)."""
    new_args = tree_map(_unwrap, args)
    new_kwargs = tree_map(_unwrap, kwargs)
    out = func(*new_args, **new_kwargs)
    if not func._schema.is_mutable:
        return out
    schema_args = func._schema.arguments
    originals = {}
    for arg, new_arg, schema_arg in zip(args, new_args, schema_args):
        _write_back(arg, new_arg, schema_arg)
        originals[id(new_arg)] = arg
    by_name = {a.name: a for a in schema_args}
    for name, value in kwargs.items():
        _write_back(value, new_kwargs[name], by_name[name])
        originals[id(new_kwargs[name])] = value
    # An in-place / out= op returns the tensor it wrote: hand back the quantized one
    # the caller passed, not the dequantized stand-in.
    return tree_map(lambda o: originals.get(id(o), o) if isinstance(o, torch.Tensor) else o, out)


def _to_copy(tensor: "QuantizedTensor", dtype=None, **kwargs) -> torch.Tensor:
    """``.to(dtype)`` / ``.float()`` / ``.cpu()``: dequantize straight to the target dtype
    (not through the nominal one, which would round twice)."""
    target = tensor.dtype if dtype is None else dtype
    values = tensor._dequantize(target if target in NOMINAL_DTYPES else torch.float32)
    return aten._to_copy.default(values, dtype=target, **kwargs)


class QuantizedTensor(torch.Tensor):
    """Base class of tensors whose data is quantized (see the module docstring).

    Subclasses implement ``_dequantize(dtype)`` (no autograd), ``quantize_``,
    ``get_metadata`` and ``update_usage``; ``dequantize`` adds the autograd link.
    """

    def __new__(cls, shape: Iterable[int], dtype: torch.dtype, *, requires_grad: bool = False,
                device: Optional[torch.device] = None):
        if dtype not in NOMINAL_DTYPES:
            raise TypeError(f"{cls.__name__}: the nominal dtype must be float32, float16 or bfloat16, got {dtype}")
        shape = torch.Size(int(d) for d in shape)
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=contiguous_strides(shape), storage_offset=0, dtype=dtype,
            layout=torch.strided, requires_grad=requires_grad, device=device)

    def dequantize(self, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values as a plain tensor of ``dtype`` (default: the nominal dtype);
        gradients flow back to this tensor."""
        dtype = self.dtype if dtype is None else dtype
        if dtype not in NOMINAL_DTYPES:
            raise TypeError(f"dequantize: dtype must be float32, float16 or bfloat16, got {dtype}")
        if torch.is_grad_enabled() and self.requires_grad:
            return _DequantizeFunc.apply(self, dtype)
        return self._dequantize(dtype)

    def _dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not implement _dequantize")

    def quantize_(self, tensor: torch.Tensor, *, noop_flag: Optional[torch.Tensor] = None) -> "QuantizedTensor":
        """Re-quantizes ``tensor`` into this tensor's buffers."""
        raise NotImplementedError(f"{type(self).__name__} does not implement quantize_")

    def get_metadata(self) -> dict:
        """The constructor keywords that make a tensor sharing this one's quantized data."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_metadata")

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None):
        """Creates or drops the row-wise / column-wise layouts."""
        raise NotImplementedError(f"{type(self).__name__} does not implement update_usage")

    @classmethod
    def make_like(cls, tensor: "QuantizedTensor", *, shape=None, dtype: Optional[torch.dtype] = None,
                  requires_grad: bool = False, **overrides) -> "QuantizedTensor":
        """A new tensor sharing ``tensor``'s quantized data (keywords replace parts of it)."""
        kwargs = tensor.get_metadata()
        kwargs.update(overrides)
        if shape is None:
            shape = tensor.shape
        return cls(shape=shape, dtype=tensor.dtype if dtype is None else dtype,
                   requires_grad=requires_grad, **kwargs)

    def to_dtype(self, dtype: torch.dtype) -> "QuantizedTensor":
        """The same quantized data standing for another nominal dtype."""
        return type(self).make_like(self, dtype=dtype)

    # As in Transformer Engine, these always give plain values (torch would hand back
    # the tensor itself when dtype or device already match).
    def float(self, memory_format=torch.preserve_format) -> torch.Tensor:
        return self.dequantize(dtype=torch.float32)

    def half(self, memory_format=torch.preserve_format) -> torch.Tensor:
        return self.dequantize(dtype=torch.float16)

    def bfloat16(self, memory_format=torch.preserve_format) -> torch.Tensor:
        return self.dequantize(dtype=torch.bfloat16)

    def cpu(self, memory_format=torch.preserve_format) -> torch.Tensor:
        return self.dequantize().cpu()

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"{type(self).__name__}(data={self._dequantize(self.dtype)})"

    # torch functions run as they would on a plain tensor: their results are not
    # forced into this class (torch's default for subclasses); the ops below them
    # reach __torch_dispatch__.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if isinstance(dst, QuantizedTensor):
                return dst.quantize_(src)
            return dst.copy_(src._dequantize(dst.dtype if dst.dtype in NOMINAL_DTYPES else torch.float32))
        if func is aten._to_copy.default and isinstance(args[0], QuantizedTensor):
            return _to_copy(args[0], **kwargs)
        return _run_dequantized(func, args, kwargs)
