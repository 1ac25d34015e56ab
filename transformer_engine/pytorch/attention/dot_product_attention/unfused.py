"""UnfusedDotProductAttention: attention as two batched GEMMs around a softmax.

scores = softmax_scale * Q K^T (+ bias) by torch.baddbmm / torch.bmm, in the inputs'
dtype as Transformer Engine's unfused path; probabilities by attention_softmax (OpenTE's
kernels where they fit); dropout inside the RNG tracker's fork when one is given; the
context P V by torch.bmm. Runs on the CPU and on CUDA.

GQA / MQA without copying K and V per query head: query head g*r + j (r = h / hg) uses
key/value head g, so Q viewed as [b * hg, r * sq, d] against K [b * hg, skv, d] gives the
scores [b, h, sq, skv] in place.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from transformer_engine.pytorch.attention.dot_product_attention.masks import MaskPlan
from transformer_engine.pytorch.attention.dot_product_attention.softmax import attention_softmax
from transformer_engine.pytorch.attention.dot_product_attention.utils import to_bhsd

__all__ = ["UnfusedDotProductAttention"]

# Transformer Engine's fill for masked logits when it reports the largest logit.
_MASKED_LOGIT = -10000.0


class UnfusedDotProductAttention(torch.nn.Module):
    """The unfused backend (see the module docstring). ``forward`` takes tensors
    positionally so that te.checkpoint can recompute it."""

    def __init__(self, softmax_scale: float, attention_type: str = "self", attention_dropout: float = 0.0,
                 attention_dropout_ctx: Callable = nullcontext, layer_number: Optional[int] = None,
                 softmax_type: str = "vanilla", return_max_logit: bool = False):
        super().__init__()
        self.softmax_scale = softmax_scale
        self.attention_type = attention_type
        self.attention_dropout = attention_dropout
        self.attention_dropout_ctx = attention_dropout_ctx
        self.layer_number = layer_number
        self.softmax_type = softmax_type
        self.return_max_logit = return_max_logit

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], sink: Optional[torch.Tensor], *, mask_kind: str,
                bias_type: str = "no_bias", q_format: str = "bshd",
                kv_format: str = "bshd") -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """query [.., h, d] and key / value [.., hg, d] in q_format / kv_format (sbhd or
        bshd); mask: the MaskPlan's tensor (kind ``mask_kind``); bias: added to the scores
        after the scale ("post_scale_bias", also ALiBi) or before it ("pre_scale_bias"),
        broadcastable to [b, h, sq, skv]; sink: [1, h, 1, 1] fp32 or None.
        Returns the context [b, h, sq, dv] and, with return_max_logit, the largest masked
        logit of each head [h] (fp32, no gradient)."""
        qh, kh, vh = to_bhsd(query, q_format), to_bhsd(key, kv_format), to_bhsd(value, kv_format)
        b, h, sq, d = qh.shape
        hg, skv, dv = kh.shape[1], kh.shape[2], vh.shape[3]
        group = h // hg
        q3 = qh.reshape(b * hg, group * sq, d)  # [b * hg, r * sq, d]
        k3 = kh.reshape(b * hg, skv, d)  # [b * hg, skv, d]
        v3 = vh.reshape(b * hg, skv, dv)  # [b * hg, skv, dv]

        if bias_type == "pre_scale_bias":
            raw = torch.bmm(q3, k3.transpose(1, 2)).view(b, h, sq, skv)
            scores = ((raw + bias) * self.softmax_scale).to(query.dtype)
        else:
            scores = torch.baddbmm(q3.new_empty(b * hg, group * sq, skv), q3, k3.transpose(1, 2), beta=0.0,
                                   alpha=self.softmax_scale).view(b, h, sq, skv)
            if bias is not None:
                scores = (scores + bias).to(query.dtype)

        plan = MaskPlan(mask_kind, mask)
        max_logit = None
        if self.return_max_logit:
            with torch.no_grad():
                full = plan.full_mask(sq, skv, scores.device)
                masked = scores if full is None else scores.masked_fill(full, _MASKED_LOGIT)
                max_logit = masked.amax(dim=(0, 2, 3)).float()

        probs = attention_softmax(scores, plan, sink)  # [b, h, sq, skv]
        if self.training and self.attention_dropout > 0.0:
            with self.attention_dropout_ctx():
                probs = F.dropout(probs, p=self.attention_dropout, training=True)

        context = torch.bmm(probs.reshape(b * hg, group * sq, skv), v3)  # [b * hg, r * sq, dv]
        return context.view(b, h, sq, dv), max_logit
