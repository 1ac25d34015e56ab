"""The attention softmax of the unfused backend: OpenTE's softmax kernels where the case
fits them, a plain torch computation otherwise.

Input: scores [b, h, sq, skv] already scaled (and biased); a MaskPlan; optionally a sink
logit per head (softmax_type "off-by-one": 0, "learnable": the ``softmax_offset``
parameter), which joins the normalisation as an extra column:
``p_j = exp(s_j) / (exp(sink) + sum_k exp(s_k))``.

Kernels (csrc/include/opente/softmax.h), float32 / float16 / bfloat16, CPU and CUDA:
  no mask                                    scaled_softmax
  causal top-left, sq == skv                 scaled_upper_triang_masked_softmax
  causal bottom-right                        scaled_aligned_causal_masked_softmax
  explicit mask (padding, windows, arbitrary) scaled_masked_softmax (a mask with a head
                                             dim runs as b*h batches of one head)
The torch path serves the sink types and other dtypes (float64). Both give all-zero rows
where every position is masked; masked positions count with logit -10000 in the kernels
(Transformer Engine's value) and -inf in torch, which differ only when the kept logits of
a row are below about -9900.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from transformer_engine import _core
from transformer_engine.pytorch.attention.dot_product_attention.masks import MaskPlan
from transformer_engine.pytorch.cpp_extensions import softmax as kernels
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of

__all__ = ["KERNEL_DTYPES", "softmax_path", "attention_softmax"]

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BACKWARD_OPS = {
    "scaled": _core.scaled_softmax_bwd,
    "upper_triang": _core.scaled_upper_triang_masked_softmax_bwd,
    "aligned_causal": _core.scaled_aligned_causal_masked_softmax_bwd,
    "masked": _core.scaled_masked_softmax_bwd,
}


def softmax_path(plan: MaskPlan, dtype: torch.dtype, sq: int, skv: int, has_sink: bool) -> str:
    """Which softmax runs: "scaled", "upper_triang", "aligned_causal", "masked" (kernels)
    or "torch"."""
    if has_sink or dtype not in KERNEL_DTYPES:
        return "torch"
    if plan.kind == "none":
        return "scaled"
    if plan.kind == "causal_top_left":
        return "upper_triang" if sq == skv else "masked"
    if plan.kind == "causal_bottom_right":
        return "aligned_causal"
    return "masked"


def _masked_operands(scores: torch.Tensor, mask: torch.Tensor):
    """scores [b, h, sq, skv] and mask [1|b, 1|h, sq, skv] as the masked kernel takes them:
    input [B, H, sq, skv] and mask [B or 1, 1, sq, skv] (bool, contiguous)."""
    b, h, sq, skv = scores.shape
    if mask.shape[1] == 1:
        return scores, mask.contiguous()
    mask = mask.expand(b, h, sq, skv).reshape(b * h, 1, sq, skv)
    return scores.reshape(b * h, 1, sq, skv), mask


class _KernelSoftmax(torch.autograd.Function):
    """softmax over the last dim of scores [b, h, sq, skv] by one of OpenTE's kernels."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, mask: Optional[torch.Tensor], path: str) -> torch.Tensor:
        shape = scores.shape
        b, h, sq, skv = shape
        scores = scores.contiguous()
        if path == "scaled":
            probs = kernels.scaled_softmax_forward(scores, 1.0)
        elif path == "upper_triang":
            probs = kernels.scaled_upper_triang_masked_softmax_forward(scores.view(b * h, sq, skv), 1.0).view(shape)
        elif path == "aligned_causal":
            probs = kernels.scaled_aligned_causal_masked_softmax_forward(scores, 1.0)
        else:
            inp, kernel_mask = _masked_operands(scores, mask)
            probs = kernels.scaled_masked_softmax_forward(inp, kernel_mask, 1.0).view(shape)
        ctx.path = path
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_probs: torch.Tensor):
        (probs,) = ctx.saved_tensors
        b, h, sq, skv = probs.shape
        # Into a fresh tensor rather than over grad_probs (Transformer Engine's in-place
        # way): the incoming gradient may be a tensor its owner still uses. Same traffic.
        grad = grad_probs.contiguous()
        grad_scores = torch.empty_like(probs)
        views = (grad, probs, grad_scores)
        if ctx.path == "upper_triang":  # the kernel's [attn_batches, sq, sk] layout
            views = tuple(t.view(b * h, sq, skv) for t in views)
        _BACKWARD_OPS[ctx.path](describe(views[0], "grad_output"), describe(views[1], "softmax_output"),
                                describe(views[2], "grad_input"), 1.0, stream_of(probs))
        return grad_scores, None, None


def _torch_softmax(scores: torch.Tensor, mask: Optional[torch.Tensor], sink: Optional[torch.Tensor]) -> torch.Tensor:
    """The same softmax in torch (fp32 for 16-bit inputs), differentiable in scores and sink
    ([1, h, 1, 1], fp32)."""
    x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if mask is not None:
        x = x.masked_fill(mask, float("-inf"))
    row_max = x.amax(dim=-1, keepdim=True)
    if sink is not None:
        row_max = torch.maximum(row_max, sink.to(x.dtype))
    # Any shift gives the same softmax; a finite one keeps fully masked rows free of NaN.
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    weights = torch.exp(x - row_max)
    denominator = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        denominator = denominator + torch.exp(sink.to(x.dtype) - row_max)
    denominator = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return (weights / denominator).to(scores.dtype)


def attention_softmax(scores: torch.Tensor, plan: MaskPlan, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Attention probabilities [b, h, sq, skv] from scaled scores (see the module docstring)."""
    _, _, sq, skv = scores.shape
    path = softmax_path(plan, scores.dtype, sq, skv, sink is not None)
    if path == "torch":
        return _torch_softmax(scores, plan.full_mask(sq, skv, scores.device), sink)
    mask = plan.full_mask(sq, skv, scores.device) if path == "masked" else None
    return _KernelSoftmax.apply(scores, mask, path)
