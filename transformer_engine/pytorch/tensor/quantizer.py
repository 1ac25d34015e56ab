"""``Quantizer``: the builder of quantized tensors (Transformer Engine 2.x interface).

A quantizer holds the recipe state of one tensor role (an FP8 scale, an amax
buffer, ...) and turns high-precision tensors into quantized ones. Modules keep
one per GEMM operand and tell it, through ``set_usage``, which layouts the
tensors it makes will be read in.
"""

from __future__ import annotations

import abc
import copy
from typing import Iterable, Optional

import torch

__all__ = ["Quantizer"]

# Quantizer classes by name, for rebuilding pickled quantizers (see _rebuild_quantizer).
_QUANTIZER_CLASSES: dict[str, type] = {}


def _rebuild_quantizer(class_name: str, state: dict) -> "Quantizer":
    """Unpickling helper: a quantizer of the named class with the pickled state."""
    try:
        cls = _QUANTIZER_CLASSES[class_name]
    except KeyError:
        raise TypeError(f"cannot rebuild a quantizer of unknown class {class_name!r}") from None
    quantizer = cls.__new__(cls)
    quantizer._set_state(state)
    return quantizer


class Quantizer(abc.ABC):
    """Builds quantized tensors from high-precision ones.

    ``rowwise_usage``     make the row-wise data (read by GEMMs that use the tensor as is);
    ``columnwise_usage``  make the column-wise (transposed) copy (read by the GEMMs that
                          use the tensor transposed: Hopper's FP8 GEMM only reads "TN");
    ``internal``          make plain storage objects (``Float8TensorBase``) instead of
                          torch.Tensor subclasses, for tensors that never leave the modules
                          (less overhead; no autograd, no torch ops).
    """

    rowwise_usage: bool
    columnwise_usage: bool
    internal: bool

    def __init__(self, *, rowwise: bool, columnwise: bool) -> None:
        self.rowwise_usage = bool(rowwise)
        self.columnwise_usage = bool(columnwise)
        self.internal = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _QUANTIZER_CLASSES[cls.__name__] = cls

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rowwise_usage={self.rowwise_usage}, "
                f"columnwise_usage={self.columnwise_usage}, internal={self.internal})")

    def set_usage(self, rowwise: Optional[bool] = None, columnwise: Optional[bool] = None) -> None:
        """Which layouts the tensors made from now on carry; None keeps the current choice."""
        if rowwise is not None:
            self.rowwise_usage = bool(rowwise)
        if columnwise is not None:
            self.columnwise_usage = bool(columnwise)

    def __call__(self, tensor: torch.Tensor):
        return self.quantize(tensor)

    def quantize(self, tensor: torch.Tensor, *, out=None):
        """A new quantized tensor holding ``tensor``, or ``out`` updated in place.

        With autograd on, the result is connected to ``tensor`` by a straight-through
        gradient (the gradient of a cast is taken as the identity, in high precision)."""
        if out is not None:
            return self.update_quantized(tensor, out)
        if not self.internal and torch.is_grad_enabled() and isinstance(tensor, torch.Tensor) \
                and tensor.requires_grad:
            return _QuantizeFunc.apply(tensor, self)
        return self._quantize(tensor)

    @abc.abstractmethod
    def _quantize(self, tensor: torch.Tensor):
        """The cast itself (no autograd): a new quantized tensor."""

    @abc.abstractmethod
    def update_quantized(self, src: torch.Tensor, dst, *, noop_flag: Optional[torch.Tensor] = None):
        """Quantizes ``src`` into the buffers of ``dst`` (same shape); returns ``dst``."""

    @abc.abstractmethod
    def make_empty(self, shape: Iterable[int], *, dtype: torch.dtype = torch.float32,
                   device: Optional[torch.device] = None, requires_grad: bool = False):
        """A quantized tensor of ``shape`` with uninitialized data; ``dtype`` is the
        high-precision dtype it stands for."""

    @abc.abstractmethod
    def calibrate(self, tensor: torch.Tensor) -> None:
        """Updates the quantizer's state (amax, scale) as quantizing ``tensor`` would,
        without casting."""

    def copy(self) -> "Quantizer":
        """A shallow copy: the usage flags are its own, the state tensors are shared."""
        return copy.copy(self)

    # Pickling (torch.save of a quantized tensor saves its quantizer). Subclasses list
    # their state as plain values and tensors, so the pickle loads with weights_only=True.
    def _get_state(self) -> dict:
        return {"rowwise_usage": self.rowwise_usage, "columnwise_usage": self.columnwise_usage,
                "internal": self.internal}

    def _set_state(self, state: dict) -> None:
        self.rowwise_usage = state["rowwise_usage"]
        self.columnwise_usage = state["columnwise_usage"]
        self.internal = state["internal"]

    def __reduce_ex__(self, protocol):
        return _rebuild_quantizer, (type(self).__name__, self._get_state())

    def __copy__(self) -> "Quantizer":
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    # Attributes a deep copy shares instead of copying (process groups cannot be copied).
    _shared_in_deepcopy: tuple[str, ...] = ()

    def __deepcopy__(self, memo) -> "Quantizer":
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            new.__dict__[key] = value if key in self._shared_in_deepcopy else copy.deepcopy(value, memo)
        return new


class _QuantizeFunc(torch.autograd.Function):
    """High precision -> quantized, with the identity as gradient."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, quantizer: Quantizer):
        ctx.input_dtype = tensor.dtype
        return quantizer._quantize(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.input_dtype), None
