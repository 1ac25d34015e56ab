"""Quantizers of per-tensor-scaled FP8: delayed scaling and current scaling (TE 2.x).

``Float8Quantizer``               delayed scaling: casts with a scale it is given (computed by
                                  the recipe from past amaxes) and records this cast's amax;
``Float8CurrentScalingQuantizer`` current scaling: amax of the tensor, then its scale, then the
                                  cast, all on the tensor's device (no host synchronisation).
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from transformer_engine.pytorch.cpp_extensions.cast import columnwise_shape, compute_amax, quantize_into
from transformer_engine.pytorch.cpp_extensions.recipe import compute_scale_from_amax
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType, fp8_dtype_of
from transformer_engine.pytorch.tensor._internal.float8_tensor_base import Float8TensorBase
from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
from transformer_engine.pytorch.tensor.quantized_tensor import NOMINAL_DTYPES, QuantizedTensor
from transformer_engine.pytorch.tensor.quantizer import Quantizer

__all__ = ["Float8Quantizer", "Float8CurrentScalingQuantizer"]


def _check_state_tensor(t, name: str, owner: str) -> None:
    """The recipe state a quantizer keeps: float32, one element, contiguous."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{owner}: {name} must be float32, got {t.dtype}")
    if t.numel() != 1:
        raise ValueError(f"{owner}: {name} must have exactly one element (shape [1]), got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{owner}: {name} must be contiguous")


def _check_input(tensor, owner: str, device: torch.device) -> torch.Tensor:
    """A float tensor on the quantizer's device, made contiguous."""
    if isinstance(tensor, QuantizedTensor):
        tensor = tensor.dequantize()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{owner}: can only quantize a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in NOMINAL_DTYPES:
        raise TypeError(f"{owner}: can only quantize float32, float16 or bfloat16 tensors, got {tensor.dtype}")
    if tensor.device != device:
        raise ValueError(f"{owner}: the tensor is on {tensor.device} but the quantizer's scale and amax are "
                         f"on {device}")
    return tensor.detach().contiguous()


class _Float8QuantizerBase(Quantizer):
    """What both per-tensor FP8 quantizers share: the FP8 dtype, the cast into buffers,
    building the result and empty tensors."""

    dtype: DType
    scale: torch.Tensor
    amax: torch.Tensor

    @property
    def _device(self) -> torch.device:
        return self.scale.device

    def _cast(self, x: torch.Tensor, data, data_t, scale_inv, amax) -> None:
        """Writes ``x`` cast with ``self.scale`` into the given buffers (one pass)."""
        quantize_into(x, self.dtype, self.scale, data=data, data_t=data_t, amax=amax, scale_inv=scale_inv)

    def _prepare_scale(self, x: torch.Tensor, scale_inv: torch.Tensor) -> Optional[torch.Tensor]:
        """Brings ``self.scale`` (and ``scale_inv``, the result's) up to date for casting
        ``x``; returns the amax buffer the cast itself must raise (None: the cast leaves
        amax alone)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement _prepare_scale")

    def _new_buffers(self, shape, device):
        data = torch.empty(shape, dtype=torch.uint8, device=device) if self.rowwise_usage else None
        data_t = torch.empty(columnwise_shape(shape), dtype=torch.uint8, device=device) \
            if self.columnwise_usage else None
        if data is None and data_t is None:
            raise ValueError(f"{type(self).__name__}: rowwise and columnwise usage are both off, "
                             "so the quantized tensor would hold no data")
        return data, data_t

    def _make(self, shape, nominal_dtype, data, data_t, scale_inv, requires_grad=False):
        if self.internal:
            return Float8TensorBase(data=data, data_transpose=data_t, fp8_scale_inv=scale_inv,
                                    fp8_dtype=self.dtype, quantizer=self)
        return Float8Tensor(shape=shape, dtype=nominal_dtype, data=data, data_transpose=data_t,
                            fp8_scale_inv=scale_inv, fp8_dtype=self.dtype, quantizer=self,
                            requires_grad=requires_grad)

    def _quantize(self, tensor: torch.Tensor):
        x = _check_input(tensor, type(self).__name__, self._device)
        data, data_t = self._new_buffers(x.shape, x.device)
        scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
        amax = self._prepare_scale(x, scale_inv)
        self._cast(x, data, data_t, scale_inv, amax)
        return self._make(x.shape, x.dtype, data, data_t, scale_inv)

    def update_quantized(self, src: torch.Tensor, dst, *, noop_flag: Optional[torch.Tensor] = None):
        """Quantizes ``src`` into ``dst``'s buffers (every layout dst holds). ``noop_flag``: a
        float32 tensor of one element on dst's device; where it holds 1 the update is skipped
        (dst and this quantizer's scale and amax keep their values), decided on the device
        without a host synchronisation."""
        owner = type(self).__name__
        if not isinstance(dst, Float8TensorBase):
            raise TypeError(f"{owner} can only update a Float8Tensor or Float8TensorBase, got {type(dst).__name__}")
        if isinstance(src, torch.Tensor) and not isinstance(src, QuantizedTensor) and src.device != dst.device:
            src = src.to(dst.device)
        x = _check_input(src, owner, self._device)
        if x.shape != dst.size():
            raise ValueError(f"{owner}.update_quantized: src has shape {tuple(x.shape)} but dst has shape "
                             f"{tuple(dst.size())}")
        if noop_flag is not None:
            self._update_unless_noop(x, dst, noop_flag, owner)
            return dst
        amax = self._prepare_scale(x, dst._scale_inv)
        self._cast(x, dst._data, dst._transpose, dst._scale_inv, amax)
        dst._fp8_dtype = self.dtype
        return dst

    def _update_unless_noop(self, x: torch.Tensor, dst: Float8TensorBase, noop_flag, owner: str) -> None:
        """update_quantized with a device-side ``noop_flag``: the cast goes into new buffers,
        then torch.where keeps the old contents of dst and of the quantizer's state where the
        flag is 1 (one extra pass over dst's bytes, instead of a host read of the flag)."""
        if not isinstance(noop_flag, torch.Tensor):
            raise TypeError(f"{owner}.update_quantized: noop_flag must be a torch.Tensor, got "
                            f"{type(noop_flag).__name__}")
        if noop_flag.dtype != torch.float32 or noop_flag.numel() != 1:
            raise ValueError(f"{owner}.update_quantized: noop_flag must be a float32 tensor of one element, got "
                             f"{noop_flag.dtype} of shape {tuple(noop_flag.shape)}")
        if noop_flag.device != dst.device:
            raise ValueError(f"{owner}.update_quantized: noop_flag is on {noop_flag.device} but dst is on "
                             f"{dst.device}")
        if dst._fp8_dtype != self.dtype:
            raise ValueError(f"{owner}.update_quantized: with noop_flag, dst must already be in the quantizer's "
                             f"format {self.dtype.name}, got {dst._fp8_dtype.name}")
        skip = noop_flag.reshape(()) == 1.0
        state = (self.scale, self.amax)
        state_before = [t.clone() for t in state]
        news = [torch.empty_like(t) if t is not None else None for t in (dst._data, dst._transpose, dst._scale_inv)]
        amax = self._prepare_scale(x, news[2])
        self._cast(x, news[0], news[1], news[2], amax)
        for old, new in zip((dst._data, dst._transpose, dst._scale_inv), news):
            if old is not None:
                old.copy_(torch.where(skip, old, new))
        for now, before in zip(state, state_before):
            now.copy_(torch.where(skip, before, now))

    def make_empty(self, shape: Iterable[int], *, dtype: torch.dtype = torch.float32,
                   device: Optional[torch.device] = None, requires_grad: bool = False):
        shape = torch.Size(int(d) for d in shape)
        device = self._device if device is None else torch.device(device)
        data, data_t = self._new_buffers(shape, device)
        # 1 rather than garbage, so an unfilled tensor dequantizes to its raw FP8 values.
        scale_inv = torch.ones(1, dtype=torch.float32, device=device)
        return self._make(shape, dtype, data, data_t, scale_inv, requires_grad=requires_grad)

    def _get_state(self) -> dict:
        return {**super()._get_state(), "fp8_dtype": int(self.dtype), "scale": self.scale, "amax": self.amax}

    def _set_state(self, state: dict) -> None:
        super()._set_state(state)
        self.dtype = DType(state["fp8_dtype"])
        self.scale = state["scale"]
        self.amax = state["amax"]


class Float8Quantizer(_Float8QuantizerBase):
    """Delayed scaling: casts with ``scale`` as given and raises ``amax`` to
    max(amax, max|x|) during the same pass (the recipe then turns the amax history
    into the next scale).

    ``scale``, ``amax``: float32 tensors of one element ([1]) on one device, kept by
    reference (usually views into the recipe's state); ``fp8_dtype``: DType.kFloat8E4M3 /
    kFloat8E5M2 (torch.float8_e4m3fn / torch.float8_e5m2 also accepted).
    """

    def __init__(self, scale: torch.Tensor, amax: torch.Tensor, fp8_dtype, *, rowwise: bool = True,
                 columnwise: bool = True) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        _check_state_tensor(scale, "scale", "Float8Quantizer")
        _check_state_tensor(amax, "amax", "Float8Quantizer")
        if amax.device != scale.device:
            raise ValueError(f"Float8Quantizer: amax is on {amax.device} but scale is on {scale.device}")
        self.scale = scale
        self.amax = amax
        self.dtype = fp8_dtype_of(fp8_dtype)

    def _prepare_scale(self, x: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
        return self.amax

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Raises amax to max(amax, max|tensor|), as a cast of ``tensor`` would."""
        x = _check_input(tensor, "Float8Quantizer", self._device)
        compute_amax(x, self.amax)

    def create_tensor_from_data(self, data: torch.Tensor, fake_dtype: torch.dtype = torch.float32,
                                requires_grad: bool = False, internal: bool = False):
        """A tensor over FP8 bits cast elsewhere with this quantizer's scale (uint8, or a
        torch float8 tensor of this quantizer's format, viewed as uint8)."""
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"data must be a torch.Tensor, got {type(data).__name__}")
        if data.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            if fp8_dtype_of(data.dtype, "data") != self.dtype:
                raise TypeError(f"data is {data.dtype} but the quantizer casts to {self.dtype.name}")
            data = data.view(torch.uint8)
        elif data.dtype != torch.uint8:
            raise TypeError(f"data must be uint8 or a torch float8 dtype, got {data.dtype}")
        if data.device != self._device:
            raise ValueError(f"data is on {data.device} but the quantizer's scale is on {self._device}")
        scale_inv = torch.reciprocal(self.scale.reshape(1))
        if internal:
            return Float8TensorBase(data=data, fp8_scale_inv=scale_inv, fp8_dtype=self.dtype, quantizer=self)
        return Float8Tensor(shape=data.shape, dtype=fake_dtype, data=data, fp8_scale_inv=scale_inv,
                            fp8_dtype=self.dtype, quantizer=self, requires_grad=requires_grad)


class Float8CurrentScalingQuantizer(_Float8QuantizerBase):
    """Current scaling: each cast first computes amax = max|x| (all-reduced over
    ``amax_reduction_group`` with ``with_amax_reduction``), then
    scale = fp8_max / max(amax, amax_epsilon) (rounded down to a power of two with
    ``force_pow_2_scales``; 1 where amax is 0 or not finite), then casts, all on
    the device. ``scale`` and ``amax`` (float32 [1] on ``device``) hold the last
    cast's values. ``use_existing_amax``: skip the amax pass and use the value
    already in ``amax`` (computed by a fused op before the cast).
    """

    _shared_in_deepcopy = ("amax_reduction_group",)

    def __init__(self, fp8_dtype, device, *, rowwise: bool = True, columnwise: bool = True,
                 use_existing_amax: bool = False, with_amax_reduction: bool = False,
                 amax_reduction_group=None, force_pow_2_scales: bool = False, amax_epsilon: float = 0.0) -> None:
        super().__init__(rowwise=rowwise, columnwise=columnwise)
        self.dtype = fp8_dtype_of(fp8_dtype)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        amax_epsilon = float(amax_epsilon)
        if not amax_epsilon >= 0.0:
            raise ValueError(f"Float8CurrentScalingQuantizer: amax_epsilon must be >= 0, got {amax_epsilon}")
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.amax = torch.zeros(1, dtype=torch.float32, device=device)
        self.use_existing_amax = bool(use_existing_amax)
        self.with_amax_reduction = bool(with_amax_reduction)
        self.amax_reduction_group = amax_reduction_group
        self.force_pow_2_scales = bool(force_pow_2_scales)
        self.amax_epsilon = amax_epsilon

    def _prepare_scale(self, x: torch.Tensor, scale_inv: torch.Tensor) -> None:
        if not self.use_existing_amax:
            self.amax.zero_()
            compute_amax(x, self.amax)
        if self.with_amax_reduction:
            torch.distributed.all_reduce(self.amax, op=torch.distributed.ReduceOp.MAX,
                                         group=self.amax_reduction_group)
        compute_scale_from_amax(self.amax, self.dtype, epsilon=self.amax_epsilon,
                                force_pow_2_scales=self.force_pow_2_scales, scale=self.scale, scale_inv=scale_inv)
        return None

    def calibrate(self, tensor: torch.Tensor) -> None:
        """Computes amax and scale of ``tensor`` without casting it."""
        x = _check_input(tensor, "Float8CurrentScalingQuantizer", self._device)
        self._prepare_scale(x, torch.empty(1, dtype=torch.float32, device=x.device))

    # The process group is not saved (it cannot be pickled); a loaded quantizer with
    # with_amax_reduction reduces over the default group.
    def _get_state(self) -> dict:
        return {**super()._get_state(), "use_existing_amax": self.use_existing_amax,
                "with_amax_reduction": self.with_amax_reduction, "force_pow_2_scales": self.force_pow_2_scales,
                "amax_epsilon": self.amax_epsilon}

    def _set_state(self, state: dict) -> None:
        super()._set_state(state)
        self.use_existing_amax = state["use_existing_amax"]
        self.with_amax_reduction = state["with_amax_reduction"]
        self.amax_reduction_group = None
        self.force_pow_2_scales = state["force_pow_2_scales"]
        self.amax_epsilon = state["amax_epsilon"]
