"""Float64 references for the attention tests: masks written out from their definitions
(one (query, key) position at a time), softmax with an explicit sink column, and GQA by
repeating the key/value heads.

Masks (True = masked out): padding masks padded query rows and key columns; a window
(left, right) keeps keys j with i + off - left <= j <= i + off + right (-1: unlimited);
causal types have right = 0; off = 0 for "causal" / "padding_causal", skv - sq for the
other unpadded types, and kv_len - q_len of each sequence for the padded ones.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import torch


def reference_mask(mask_type: str, window, sq: int, skv: int, q_lens: Optional[Sequence[int]] = None,
                   kv_lens: Optional[Sequence[int]] = None, batch: int = 1) -> torch.Tensor:
    """bool [b, 1, sq, skv]."""
    causal = "causal" in mask_type
    padded = "padding" in mask_type
    left, right = window if window is not None else ((-1, 0) if causal else (-1, -1))
    if causal:
        right = 0
    if padded:
        batch = len(q_lens)
    mask = torch.zeros(batch, 1, sq, skv, dtype=torch.bool)
    for b in range(batch):
        ql = q_lens[b] if padded else sq
        kl = kv_lens[b] if padded else skv
        if mask_type in ("causal", "padding_causal"):
            off = 0
        else:
            off = kl - ql
        for i in range(sq):
            for j in range(skv):
                out = padded and (i >= ql or j >= kl)
                if left >= 0 and j < i + off - left:
                    out = True
                if right >= 0 and j > i + off + right:
                    out = True
                mask[b, 0, i, j] = out
    return mask


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                        mask: Optional[torch.Tensor] = None, post_bias: Optional[torch.Tensor] = None,
                        pre_bias: Optional[torch.Tensor] = None, sink: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [b, h, sq, d], k / v [b, hg, skv, d] (any float dtype, computed in float64);
    returns [b, h, sq, dv] float64. Fully masked rows give 0 (Transformer Engine's rule);
    ``sink`` [h]: an extra logit column per head, dropped after the softmax."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2)
    if pre_bias is not None:
        scores = (scores + pre_bias.double()) * scale
    else:
        scores = scores * scale
    if post_bias is not None:
        scores = scores + post_bias.double()
    b, h, sq, skv = scores.shape
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    if sink is not None:
        column = sink.double().view(1, h, 1, 1).expand(b, h, sq, 1)
        scores = torch.cat([scores, column], dim=-1)
    fully_masked = torch.isinf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1).masked_fill(fully_masked, 0.0)
    if sink is not None:
        probs = probs[..., :skv]
    return probs @ v


def alibi_reference(slopes: torch.Tensor, sq: int, skv: int, offsets: Sequence[int]) -> torch.Tensor:
    """-slope * |i + off - j| for each batch entry's offset: [len(offsets), h, sq, skv]
    (slopes [h] or [b, h])."""
    b = len(offsets)
    h = slopes.shape[-1]
    bias = torch.zeros(b, h, sq, skv, dtype=torch.float64)
    for n in range(b):
        s = slopes[n] if slopes.dim() == 2 else slopes
        for i in range(sq):
            for j in range(skv):
                bias[n, :, i, j] = -s.double() * abs(i + offsets[n] - j)
    return bias


def to_bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)


def from_bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    b, h, s, d = x.shape
    if fmt == "sbhd":
        return x.permute(2, 0, 1, 3).reshape(s, b, h * d)
    return x.permute(0, 2, 1, 3).reshape(b, s, h * d)


def decode_with_cache(dpa, q, k, v, cache, fmt: str, prefill: int) -> torch.Tensor:
    """The output of ``dpa`` over the whole sequence, computed with the KV cache ``cache``
    (an InferenceParams): the first ``prefill`` positions of every sequence in one step,
    then one position a step; the steps' outputs concatenated along the sequence dim."""
    seq_dim = 0 if fmt == "sbhd" else 1
    b, length = q.shape[1 - seq_dim], q.shape[seq_dim]

    def part(x, start, end):
        return x.narrow(seq_dim, start, end - start)

    cache.pre_step(OrderedDict((i, prefill) for i in range(b)))
    outs = [dpa(part(q, 0, prefill), part(k, 0, prefill), part(v, 0, prefill), inference_params=cache)]
    for t in range(prefill, length):
        cache.pre_step(OrderedDict((i, 1) for i in range(b)))
        outs.append(dpa(part(q, t, t + 1), part(k, t, t + 1), part(v, t, t + 1), inference_params=cache))
    return torch.cat(outs, dim=seq_dim)
