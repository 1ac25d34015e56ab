"""Split weights (``parameters_split``): a layer's weight kept as several parameters, the
rows of query, key and value say, and where their gradients go.

As in Transformer Engine, the parts are made as consecutive rows of one buffer, so the
layer reads the whole weight as a view, without the copy (and, backward, the split of its
gradient into copies) that concatenating them each step would cost: for a 4096 x 12288
bf16 QKV weight, 100 MB each way. ``join_rows`` falls back to a concatenation when the
parts are no longer adjacent (``module.to(...)`` and ``to_empty`` allocate each anew).

``main_grad_target`` is the buffer ``fuse_wgrad_accumulation`` adds a weight gradient
into: the weight's ``main_grad``, or the parts' ``main_grad`` buffers joined the same way
(a copy, written back afterwards, when they are not adjacent rows of one buffer).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from transformer_engine.pytorch.tensor import Float8TensorBase

__all__ = ["join_rows", "main_grad_target", "MainGradTarget"]


def rows_adjacent(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` are contiguous, of one dtype, and lie one after the other in
    one storage, so that they form the rows of one tensor."""
    first = tensors[0]
    storage = first.untyped_storage().data_ptr()
    expected = first.data_ptr()
    for t in tensors:
        if (t.dtype != first.dtype or t.shape[1:] != first.shape[1:] or not t.is_contiguous()
                or t.data_ptr() != expected or t.untyped_storage().data_ptr() != storage):
            return False
        expected += t.numel() * t.element_size()
    return True


def _rows_view(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The rows of adjacent ``tensors`` (rows_adjacent) as one tensor over their memory."""
    first = tensors[0]
    return first.as_strided((sum(t.shape[0] for t in tensors), *first.shape[1:]), first.stride())


class _JoinRows(torch.autograd.Function):
    """The rows of adjacent parameters as one tensor, without a copy; the gradient goes
    back to each as a view of the incoming one, and no gradient as none (the layer's
    weight gradient went into main_grad: the parts' .grad stay None)."""

    @staticmethod
    def forward(ctx, *parts):
        ctx.rows = [p.shape[0] for p in parts]
        ctx.set_materialize_grads(False)
        return _rows_view(parts)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return (None,) * len(ctx.rows)
        return tuple(grad.split(ctx.rows, dim=0))


def join_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.cat(parts)`` (along rows), a view when the parts are adjacent."""
    if len(parts) == 1:
        return parts[0]
    if any(isinstance(p, Float8TensorBase) for p in parts) or not rows_adjacent(parts):
        return torch.cat(list(parts), dim=0)
    return _JoinRows.apply(*parts)


class MainGradTarget(NamedTuple):
    """Where fuse_wgrad_accumulation adds a weight gradient (``buffer``), and what
    ``finish()`` does after the addition: write a joined copy back to the parts'
    ``main_grad`` (``copied_from``, None when ``buffer`` is their memory), and flag the
    parameters with ``grad_added_to_main_grad``, which Megatron-style optimizers read."""

    buffer: torch.Tensor
    params: Sequence[torch.nn.Parameter]
    copied_from: Optional[Sequence[torch.Tensor]]

    def finish(self) -> None:
        if self.copied_from is not None:
            offset = 0
            for grad in self.copied_from:
                grad.copy_(self.buffer[offset:offset + grad.shape[0]])
                offset += grad.shape[0]
        for param in self.params:
            param.grad_added_to_main_grad = True


def main_grad_target(weight: torch.Tensor, parts: Optional[Sequence[torch.nn.Parameter]]) -> MainGradTarget:
    """The MainGradTarget of ``weight``, or of its ``parts`` (a split weight: ``weight`` is
    their join). Raises when a parameter has no main_grad."""
    params = tuple(parts) if parts else (weight,)
    grads = []
    for i, param in enumerate(params):
        grad = getattr(param, "main_grad", None)
        if grad is None:
            which = f"weight part {i} (parameters_split)" if parts else "weight"
            raise RuntimeError(f"fuse_wgrad_accumulation=True needs {which}.main_grad, a pre-allocated buffer "
                               f"of its shape {tuple(param.shape)} to accumulate into")
        grads.append(grad)
    if len(grads) == 1:
        return MainGradTarget(grads[0], params, None)
    if rows_adjacent(grads):
        return MainGradTarget(_rows_view(grads), params, None)
    return MainGradTarget(torch.cat(grads, dim=0), params, grads)
