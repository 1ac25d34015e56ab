"""A fused QKV projection's output split into query, key and value, whose backward takes
the three gradients whole where they already lie in one buffer laid out as the
projection's output: the cuDNN attention writes them so for packed q, k, v
(cpp_extensions.fused_attn.packed_qkv_offsets). torch.split's backward concatenates them
instead, a copy of every gradient element (on an H100 at the main job's shape, 4% of a
TransformerLayer's step). Transformer Engine's MultiheadAttention does the same with its
SplitAlongDim."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

__all__ = ["split_along_dim"]


class _SplitAlongDim(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mixed: torch.Tensor, sizes: Tuple[int, ...], dim: int):
        parts = torch.split(mixed, list(sizes), dim)
        ctx.shape, ctx.stride, ctx.dim = mixed.shape, mixed.stride(), dim
        ctx.part_shapes = [p.shape for p in parts]
        # where each part starts in mixed, in elements
        ctx.offsets = [p.storage_offset() - mixed.storage_offset() for p in parts]
        return parts

    @staticmethod
    def backward(ctx, *grads):
        joined = _joined(grads, ctx)
        if joined is None:
            parts = [g if g is not None else torch.zeros(shape, dtype=_dtype(grads), device=_device(grads))
                     for g, shape in zip(grads, ctx.part_shapes)]
            joined = torch.cat(parts, dim=ctx.dim)
        return joined, None, None


def _dtype(grads) -> torch.dtype:
    return next(g for g in grads if g is not None).dtype


def _device(grads) -> torch.device:
    return next(g for g in grads if g is not None).device


def _joined(grads: Sequence[Optional[torch.Tensor]], ctx) -> Optional[torch.Tensor]:
    """The gradient of the split tensor as a view of the parts' gradients where they are
    the parts of one tensor of its layout (same storage, strides and relative offsets);
    else None."""
    first = grads[0]
    if any(g is None for g in grads):
        return None
    storage = first.untyped_storage().data_ptr()
    start = first.storage_offset() - ctx.offsets[0]
    for g, offset, shape in zip(grads, ctx.offsets, ctx.part_shapes):
        if (g.dtype != first.dtype or g.device != first.device or g.untyped_storage().data_ptr() != storage
                or g.storage_offset() != start + offset or g.shape != shape):
            return None
        # size-1 dims' strides do not address anything (a reshape may set them otherwise)
        if any(st != want for st, want, n in zip(g.stride(), ctx.stride, shape) if n > 1):
            return None
    return first.as_strided(ctx.shape, ctx.stride, start)


def split_along_dim(mixed: torch.Tensor, sizes: Sequence[int], dim: int) -> Tuple[torch.Tensor, ...]:
    """torch.split(mixed, sizes, dim) (views), with the backward above."""
    return _SplitAlongDim.apply(mixed, tuple(sizes), dim)
