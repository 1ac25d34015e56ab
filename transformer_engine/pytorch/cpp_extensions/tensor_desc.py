"""Turning torch tensors into core descriptors (``_core.Tensor``)."""

from __future__ import annotations

import torch

from transformer_engine import _core
from transformer_engine._core import DType

__all__ = ["DType", "describe", "describe_view", "fp8_dtype_of", "stream_of", "te_dtype", "check_fp32_buffer"]

_TORCH_TO_TE = {
    torch.uint8: DType.kByte,
    torch.int32: DType.kInt32,
    torch.int64: DType.kInt64,
    torch.float32: DType.kFloat32,
    torch.float16: DType.kFloat16,
    torch.bfloat16: DType.kBFloat16,
    torch.float8_e4m3fn: DType.kFloat8E4M3,
    torch.float8_e5m2: DType.kFloat8E5M2,
}
_FP8_TE_DTYPES = (DType.kFloat8E4M3, DType.kFloat8E5M2)


def te_dtype(dtype: torch.dtype, name: str) -> DType:
    """The core dtype of a torch dtype, or a TypeError naming the argument."""
    try:
        return _TORCH_TO_TE[dtype]
    except KeyError:
        raise TypeError(f"{name}: dtype {dtype} is not supported by OpenTE") from None


def fp8_dtype_of(fp8_dtype, name: str = "fp8_dtype") -> DType:
    """Accepts DType.kFloat8E4M3 / kFloat8E5M2 or torch.float8_e4m3fn / torch.float8_e5m2."""
    if isinstance(fp8_dtype, torch.dtype):
        fp8_dtype = _TORCH_TO_TE.get(fp8_dtype)
    if fp8_dtype not in _FP8_TE_DTYPES:
        raise TypeError(
            f"{name} must be DType.kFloat8E4M3, DType.kFloat8E5M2, torch.float8_e4m3fn or "
            f"torch.float8_e5m2, got {fp8_dtype!r}"
        )
    return DType(fp8_dtype)


_CPU = int(_core.DeviceType.CPU)
_CUDA = int(_core.DeviceType.CUDA)


def _device_of(t: torch.Tensor, name: str) -> tuple[int, int]:
    # is_cuda / is_cpu / get_device() rather than t.device: each t.device builds a
    # torch.device object, and this runs for every operand of every core call.
    if t.is_cuda:
        return _CUDA, t.get_device()
    if t.is_cpu:
        return _CPU, 0
    raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {t.device}")


def describe(
    t: torch.Tensor,
    name: str,
    *,
    dtype: DType | None = None,
    scale_inv: torch.Tensor | None = None,
    scaling_mode=_core.ScalingMode.NONE,
) -> _core.Tensor:
    """A descriptor of contiguous tensor ``t``; ``dtype`` overrides its dtype (FP8
    data held as uint8), ``scale_inv`` and ``scaling_mode`` describe quantized data."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() first)")
    device_type, device_index = _device_of(t, name)
    return _core.Tensor(
        device_type,
        device_index,
        int(dtype if dtype is not None else te_dtype(t.dtype, name)),
        list(t.shape),
        t.data_ptr(),
        scale_inv=scale_inv.data_ptr() if scale_inv is not None else 0,
        scaling_mode=int(scaling_mode),
    )


def describe_view(t: torch.Tensor, name: str) -> tuple[_core.Tensor, list[int]]:
    """A descriptor of any strided view ``t`` (its shape and the address of its first
    element) and its element strides, for the ops that take strides beside the descriptor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    device_type, device_index = _device_of(t, name)
    desc = _core.Tensor(device_type, device_index, int(te_dtype(t.dtype, name)), list(t.shape), t.data_ptr())
    return desc, list(t.stride())


def check_fp32_buffer(t: torch.Tensor, name: str, like: torch.Tensor, numel: int = 1) -> None:
    """``t`` is a contiguous float32 tensor of ``numel`` elements on ``like``'s device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")
    if t.numel() != numel:
        raise ValueError(f"{name} must have {numel} element(s), got {t.numel()}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but must be on {like.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _current_stream_via_object(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# torch's raw accessor answers in a fraction of a microsecond; torch.cuda.current_stream()
# builds a Stream object (several microseconds, and a module step asks once per core call).
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _current_stream_via_object


def current_stream(device_index: int) -> int:
    """The cudaStream_t (as an integer) of torch's current stream on CUDA device ``device_index``."""
    return _raw_current_stream(device_index)


def stream_of(t: torch.Tensor) -> int:
    """The cudaStream_t (as an integer) that work on ``t`` runs on; 0 on the CPU."""
    if t.is_cuda:
        return _raw_current_stream(t.get_device())
    return 0
