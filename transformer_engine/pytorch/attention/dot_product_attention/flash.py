"""FlashAttention: DotProductAttention's backend on the flash-attn 2.x package.

flash-attn takes [b, s, h, d] tensors (``flash_attn_func``) or packed [t, h, d] ones with
int32 cumulative sequence lengths (``flash_attn_varlen_func``). The layouts get there so:

- sbhd / bshd without padding: ``flash_attn_func`` on [b, s, h, d] views (sbhd is a
  transpose, no copy: flash-attn takes any strides but the last);
- padding types (sbhd / bshd, the KV cache, thd with room between sequences): the
  right-padded sequences are packed into [b * s, h, d] (the tail past the last token
  stays zero and receives no gradient), run through ``flash_attn_varlen_func`` with
  cu_seqlens from the padding masks, and unpacked, zeros at padded positions;
- thd: ``flash_attn_varlen_func`` on the packed tensors as given. flash-attn leaves the
  output and the gradients of rows past cu_seqlens[-1] unwritten; they are zeroed here.

Masks: ``causal=True`` for the causal types (flash-attn aligns it bottom-right, per
sequence in varlen: the backend selection sends top-left types only where that is the same
mask); ``window_size=(left, right)`` when there is a sliding window; ALiBi slopes [h] or
[b, h] (fp32). GQA / MQA natively: query head i uses key/value head i // (h / hg).
Dropout runs flash-attn's generator (torch's CUDA generator) inside the RNG tracker's fork
when there is one; the backward replays it from the state flash-attn saved.
"""

from __future__ import annotations

import importlib
from contextlib import nullcontext
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

from transformer_engine.pytorch.attention.dot_product_attention.utils import (
    padded_bshd_to_thd,
    thd_to_padded_bshd,
)

__all__ = ["FlashAttention", "load_flash_attn"]


def load_flash_attn() -> Tuple[Callable, Callable]:
    """flash-attn's (flash_attn_func, flash_attn_varlen_func); raises what the import raises."""
    module = importlib.import_module("flash_attn")
    return module.flash_attn_func, module.flash_attn_varlen_func


def _as_bshd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """A [b, s, h, d] view of a sbhd or bshd tensor."""
    return x.transpose(0, 1) if fmt == "sbhd" else x


def _from_bshd(out: torch.Tensor, fmt: str) -> torch.Tensor:
    """[b, s, h, d] -> fmt with the heads flattened: sbhd [s, b, h * d], bshd [b, s, h * d]."""
    b, s, h, d = out.shape
    if fmt == "sbhd":
        return out.transpose(0, 1).reshape(s, b, h * d)
    return out.reshape(b, s, h * d)


def _cu_seqlens(padding: torch.Tensor) -> torch.Tensor:
    """int32 [b + 1] cumulative lengths of right-padded sequences ([b, s] mask, True = padding)."""
    lengths = (~padding).sum(dim=1, dtype=torch.int32)
    return F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def _rows_past_end(num_rows: int, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[num_rows, 1, 1] bool: the rows at or past cu_seqlens[-1], outside every sequence."""
    rows = torch.arange(num_rows, device=cu_seqlens.device)
    return (rows >= cu_seqlens[-1]).view(-1, 1, 1)


class _ZeroGradPastEnd(torch.autograd.Function):
    """Identity whose gradient is zero in the rows outside every sequence (flash-attn's
    varlen backward allocates dq / dk / dv with torch.empty and writes sequences only)."""

    @staticmethod
    def forward(ctx, x, cu_seqlens):
        ctx.save_for_backward(cu_seqlens)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (cu_seqlens,) = ctx.saved_tensors
        return grad.masked_fill(_rows_past_end(grad.shape[0], cu_seqlens), 0), None


class FlashAttention(torch.nn.Module):
    """The flash-attn backend of DotProductAttention. ``forward`` takes tensors positionally
    so that te.checkpoint can recompute it."""

    def __init__(self, softmax_scale: float, attention_dropout: float = 0.0,
                 attention_dropout_ctx: Callable = nullcontext, deterministic: bool = False):
        super().__init__()
        self.softmax_scale = softmax_scale
        self.attention_dropout = attention_dropout
        self.attention_dropout_ctx = attention_dropout_ctx
        self.deterministic = deterministic

    def _options(self, attn_mask_type: str, window_size, alibi_slopes: Optional[torch.Tensor]) -> dict:
        """flash-attn's keyword arguments; the optional ones only when used, so that releases
        before the feature (window 2.3, ALiBi 2.4, deterministic 2.4.1) take the call."""
        causal = "causal" in attn_mask_type
        options = dict(dropout_p=self.attention_dropout if self.training else 0.0,
                       softmax_scale=self.softmax_scale, causal=causal)
        left, right = int(window_size[0]), int(window_size[1])
        if (left, right) != ((-1, 0) if causal else (-1, -1)):
            options["window_size"] = (left, right)
        if alibi_slopes is not None:
            options["alibi_slopes"] = alibi_slopes.to(torch.float32).contiguous()
        if self.deterministic:
            options["deterministic"] = True
        return options

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                alibi_slopes: Optional[torch.Tensor], q_padding: Optional[torch.Tensor],
                kv_padding: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor] = None,
                cu_seqlens_kv: Optional[torch.Tensor] = None, *, attn_mask_type: str, window_size=(-1, -1),
                q_format: str = "bshd", kv_format: str = "bshd", max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None) -> torch.Tensor:
        """query [.., h, d] in q_format, key / value [.., hg, d] in kv_format: sbhd or bshd
        (q_padding [b, sq] / kv_padding [b, skv], True = padding, for the padding types), or
        thd for both with cu_seqlens_q / cu_seqlens_kv (int32 [b + 1]) and max_seqlen_q /
        max_seqlen_kv; alibi_slopes [h] or [b, h] or None.
        Returns the output in q_format with the heads flattened ([.., h * d])."""
        flash_attn_func, flash_attn_varlen_func = load_flash_attn()
        options = self._options(attn_mask_type, window_size, alibi_slopes)
        dropout_ctx = self.attention_dropout_ctx if options["dropout_p"] > 0.0 else nullcontext

        if q_format == "thd":
            q = _ZeroGradPastEnd.apply(query, cu_seqlens_q)
            k = _ZeroGradPastEnd.apply(key, cu_seqlens_kv)
            v = _ZeroGradPastEnd.apply(value, cu_seqlens_kv)
            with dropout_ctx():
                out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_kv, int(max_seqlen_q),
                                             int(max_seqlen_kv), **options)
            out = out.masked_fill(_rows_past_end(out.shape[0], cu_seqlens_q), 0)
            return out.reshape(out.shape[0], -1)

        q, k, v = _as_bshd(query, q_format), _as_bshd(key, kv_format), _as_bshd(value, kv_format)
        if q_padding is None:
            with dropout_ctx():
                out = flash_attn_func(q, k, v, **options)
            return _from_bshd(out, q_format)

        (b, sq), skv = q.shape[:2], k.shape[1]
        cu_q, cu_kv = _cu_seqlens(q_padding), _cu_seqlens(kv_padding)
        packed_q = padded_bshd_to_thd(q, cu_q, None, b * sq)
        packed_k = padded_bshd_to_thd(k, cu_kv, None, b * skv)
        packed_v = padded_bshd_to_thd(v, cu_kv, None, b * skv)
        with dropout_ctx():
            out = flash_attn_varlen_func(packed_q, packed_k, packed_v, cu_q, cu_kv, sq, skv, **options)
        return _from_bshd(thd_to_padded_bshd(out, cu_q, None, sq), q_format)
