"""Fused rotary position embedding (Transformer Engine's ``tex.fused_rope_forward`` /
``tex.fused_rope_backward``) over the core's ``rope_fwd`` / ``rope_bwd`` (opente/rope.h).

``t`` is ``[s, b, h, d]`` (``"sbhd"``), ``[b, s, h, d]`` (``"bshd"``) or ``[t, h, d]``
(``"thd"``, sequences packed by ``cu_seqlens``, int32 ``[b + 1]``); float32, float16 or
bfloat16, on the CPU or a GPU, any strides (views of a fused QKV projection are read in
place). ``freqs`` is ``[s2, 1, 1, d2]`` as ``RotaryPositionEmbedding`` returns it (made
float32 if it is not), d2 even and <= d: features ``[0, d2)`` are rotated, the rest copied.
The result is a new contiguous tensor of ``t``'s shape and dtype. ``start_positions``
(int ``[b]``) offsets every sequence's positions (KV-cache decoding); ``cp_size`` /
``cp_rank`` select the positions of one context-parallel rank. Positions past the end of
``freqs`` that only device data decides (``start_positions``, ``cu_seqlens``) give NaN.
"""

from __future__ import annotations

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, describe_view, stream_of

__all__ = ["fused_rope_forward", "fused_rope_backward"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FORMATS = {"sbhd": _core.RopeFormat.SBHD, "bshd": _core.RopeFormat.BSHD, "thd": _core.RopeFormat.THD}


def rope_format(qkv_format) -> _core.RopeFormat:
    """``"sbhd"``, ``"bshd"`` or ``"thd"`` (any case), or an enum member of that name
    (Transformer Engine passes its QKVFormat)."""
    name = getattr(qkv_format, "name", qkv_format)
    if isinstance(name, str) and name.lower() in _FORMATS:
        return _FORMATS[name.lower()]
    raise ValueError(f"qkv_format must be 'sbhd', 'bshd' or 'thd', got {qkv_format!r}")


def _checked_x(t, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
    return t


def _on_device_of(t, name: str, like: torch.Tensor, like_name: str) -> None:
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but {like_name} is on {like.device}")


def _checked_freqs(freqs, like: torch.Tensor, like_name: str) -> torch.Tensor:
    if not isinstance(freqs, torch.Tensor):
        raise TypeError(f"freqs must be a torch.Tensor, got {type(freqs).__name__}")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"freqs must be 4D [s2, 1, 1, d2], got shape {tuple(freqs.shape)}")
    if not freqs.is_floating_point():
        raise TypeError(f"freqs must be a float tensor (angles in radians), got {freqs.dtype}")
    _on_device_of(freqs, "freqs", like, like_name)
    return freqs.to(torch.float32).contiguous()


def _checked_int_vector(v, name: str, like: torch.Tensor, like_name: str) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(v).__name__}")
    if v.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 (or int64), got {v.dtype}")
    if v.dim() != 1:
        raise ValueError(f"{name} must be 1D, got shape {tuple(v.shape)}")
    _on_device_of(v, name, like, like_name)
    return v.to(torch.int32).contiguous()


def _rope(op, x, x_name: str, freqs, start_positions, qkv_format, interleaved, cu_seqlens, cp_size,
          cp_rank) -> torch.Tensor:
    x = _checked_x(x, x_name)
    fmt = rope_format(qkv_format)
    layout = {_core.RopeFormat.SBHD: "[s, b, h, d]", _core.RopeFormat.BSHD: "[b, s, h, d]",
              _core.RopeFormat.THD: "[t, h, d]"}[fmt]
    if x.dim() != layout.count(",") + 1:
        raise ValueError(f"{x_name} must be {layout.count(',') + 1}D {layout} for qkv_format "
                         f"{fmt.name.lower()!r}, got shape {tuple(x.shape)}")
    freqs = _checked_freqs(freqs, x, x_name)
    if fmt == _core.RopeFormat.THD:
        if cu_seqlens is None:
            raise ValueError("cu_seqlens must be given for qkv_format 'thd'")
        cu_seqlens = _checked_int_vector(cu_seqlens, "cu_seqlens", x, x_name)
    elif cu_seqlens is not None:
        raise ValueError(f"cu_seqlens is only for qkv_format 'thd', got it with {qkv_format!r}")
    if start_positions is not None:
        start_positions = _checked_int_vector(start_positions, "start_positions", x, x_name)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    x_desc, x_strides = describe_view(x, x_name)
    op(x_desc, x_strides, describe(freqs, "freqs"),
       describe(cu_seqlens, "cu_seqlens") if cu_seqlens is not None else None,
       describe(start_positions, "start_positions") if start_positions is not None else None,
       describe(y, "output"), int(fmt), bool(interleaved), int(cp_size), int(cp_rank), stream_of(x))
    return y


def fused_rope_forward(input: torch.Tensor, freqs: torch.Tensor,  # noqa: A002 (TE's name)
                       start_positions: torch.Tensor | None = None, qkv_format="sbhd", interleaved: bool = False,
                       cu_seqlens: torch.Tensor | None = None, cp_size: int = 1, cp_rank: int = 0) -> torch.Tensor:
    """``input * cos(freqs) + rotate_half(input) * sin(freqs)`` on the first d2 features of
    every head (fp32 math), the rest copied; a new contiguous tensor."""
    return _rope(_core.rope_fwd, input, "input", freqs, start_positions, qkv_format, interleaved, cu_seqlens,
                 cp_size, cp_rank)


def fused_rope_backward(output_grads: torch.Tensor, freqs: torch.Tensor,
                        start_positions: torch.Tensor | None = None, qkv_format="sbhd", interleaved: bool = False,
                        cu_seqlens: torch.Tensor | None = None, cp_size: int = 1,
                        cp_rank: int = 0) -> torch.Tensor:
    """The gradient of ``fused_rope_forward`` with respect to its input (the transposed
    rotation of ``output_grads``), with the forward's arguments."""
    return _rope(_core.rope_bwd, output_grads, "output_grads", freqs, start_positions, qkv_format, interleaved,
                 cu_seqlens, cp_size, cp_rank)
