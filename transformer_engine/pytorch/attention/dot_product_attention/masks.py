"""Attention masks, sliding windows and ALiBi, with Transformer Engine's semantics.

Mask types: ``no_mask``, ``padding``, ``causal``, ``padding_causal``,
``causal_bottom_right``, ``padding_causal_bottom_right``, ``arbitrary`` ("padding,causal",
"causal,padding" and "causal_padding" are names of ``padding_causal``). A boolean mask
element True masks its (query, key) position out.

Sliding window ``(left, right)``: query i attends to keys j with
``i + off - left <= j <= i + off + right``, -1 meaning unlimited on that side. The diagonal
offset ``off`` is 0 for the top-left aligned ``causal`` and ``padding_causal``; every other
type aligns bottom-right: ``off = skv - sq``, and for the padding types per sequence
``off = kv_len - q_len`` (the actual lengths). Causal types imply ``right = 0``.

Padding: padded query rows and padded key columns are masked, so padded query positions
have all-zero attention probabilities (and a zero output). The padding is given as
boolean [b, s] masks (True = padding) for the queries and for the keys.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

__all__ = [
    "ATTN_MASK_TYPES",
    "normalize_attn_mask_type",
    "check_set_window_size",
    "MaskPlan",
    "plan_attention_mask",
    "get_alibi_slopes",
    "alibi_bias",
]

ATTN_MASK_TYPES = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
                   "padding_causal_bottom_right", "arbitrary")


def normalize_attn_mask_type(attn_mask_type, owner: str = "DotProductAttention") -> str:
    """The canonical name of a mask type ("padding,causal" -> "padding_causal")."""
    if not isinstance(attn_mask_type, str):
        raise TypeError(f"{owner}: attn_mask_type must be a str, got {type(attn_mask_type).__name__}")
    name = attn_mask_type.replace(",", "_")
    if name == "causal_padding":
        name = "padding_causal"
    if name not in ATTN_MASK_TYPES:
        raise ValueError(f"{owner}: attn_mask_type must be one of {', '.join(ATTN_MASK_TYPES)} (or 'padding,causal'), "
                         f"got {attn_mask_type!r}")
    return name


def check_set_window_size(attn_mask_type: str, window_size: Optional[Tuple[int, int]] = None,
                          owner: str = "DotProductAttention") -> Tuple[int, int]:
    """The window for ``attn_mask_type``: (-1, 0) or (>=0, 0) for the causal types, (-1, -1)
    or (>=0, >=0) for the others. None gives the type's default; a right side that
    contradicts a causal type (or (-1, 0) for a non-causal one) is corrected with a
    warning, as Transformer Engine does; anything else invalid raises."""
    causal = "causal" in attn_mask_type
    if window_size is None:
        return (-1, 0) if causal else (-1, -1)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)):
        raise TypeError(f"{owner}: window_size must be a tuple of two ints (left, right), got {window_size!r}")
    left, right = int(window_size[0]), int(window_size[1])
    if left < -1 or right < -1:
        raise ValueError(f"{owner}: window_size sides must be -1 (unlimited) or >= 0, got {tuple(window_size)}")
    if causal:
        if right != 0:
            warnings.warn(f"{owner}: window_size should be (-1, 0) or (>=0, 0) for attn_mask_type={attn_mask_type}; "
                          f"using ({left}, 0)", stacklevel=3)
        return (left, 0)
    if (left, right) == (-1, 0):
        warnings.warn(f"{owner}: window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type={attn_mask_type}; "
                      "using (-1, -1)", stacklevel=3)
        return (-1, -1)
    return (left, right)


def _diagonal_offset(attn_mask_type: str, sq: int, skv: int, q_lengths: Optional[torch.Tensor],
                     kv_lengths: Optional[torch.Tensor]):
    """``off`` of the module docstring: an int, or [b, 1, 1, 1] for the padding types."""
    if attn_mask_type in ("causal", "padding_causal"):
        return 0
    if "padding" in attn_mask_type:
        return (kv_lengths - q_lengths).view(-1, 1, 1, 1)
    return skv - sq


@dataclass
class MaskPlan:
    """How the softmax masks its input.

    ``kind``: "none" (nothing masked), "causal_top_left" (j > i masked, no tensor),
    "causal_bottom_right" (j > i + skv - sq masked, no tensor) or "explicit" (``mask``).
    ``mask``: bool [1 or b, 1 or h, sq, skv] for "explicit", else None.
    """

    kind: str
    mask: Optional[torch.Tensor] = None

    def full_mask(self, sq: int, skv: int, device) -> Optional[torch.Tensor]:
        """The mask as a tensor ([1, 1, sq, skv] for the causal kinds; None for "none")."""
        if self.kind == "explicit":
            return self.mask
        if self.kind == "none":
            return None
        offset = 0 if self.kind == "causal_top_left" else skv - sq
        return _band_mask(sq, skv, offset, -1, 0, device)


def _band_mask(sq: int, skv: int, offset, left: int, right: int, device) -> torch.Tensor:
    """True outside the window: j < i + off - left or j > i + off + right ([.., sq, skv])."""
    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    distance = j - i - offset  # [1 or b, 1, sq, skv]
    outside = torch.zeros_like(distance, dtype=torch.bool)
    if left >= 0:
        outside |= distance < -left
    if right >= 0:
        outside |= distance > right
    return outside


def plan_attention_mask(attn_mask_type: str, window_size: Tuple[int, int], sq: int, skv: int, device,
                        q_padding: Optional[torch.Tensor] = None, kv_padding: Optional[torch.Tensor] = None,
                        arbitrary_mask: Optional[torch.Tensor] = None) -> MaskPlan:
    """The mask of one attention call. ``q_padding`` [b, sq] / ``kv_padding`` [b, skv]: True
    at padding (required for the padding types); ``arbitrary_mask``: bool, broadcastable
    to [b, h, sq, skv] (the "arbitrary" type)."""
    left, right = window_size
    padded = "padding" in attn_mask_type
    if not padded and arbitrary_mask is None:
        if (left, right) == (-1, -1):
            return MaskPlan("none")
        if (left, right) == (-1, 0) and attn_mask_type == "causal":
            return MaskPlan("causal_top_left")
        if (left, right) == (-1, 0) and attn_mask_type == "causal_bottom_right":
            return MaskPlan("causal_bottom_right")
    q_lengths = kv_lengths = None
    if padded:
        q_lengths = (~q_padding).sum(dim=1)
        kv_lengths = (~kv_padding).sum(dim=1)
    mask = None
    if (left, right) != (-1, -1):
        offset = _diagonal_offset(attn_mask_type, sq, skv, q_lengths, kv_lengths)
        mask = _band_mask(sq, skv, offset, left, right, device)
    if padded:
        pad = q_padding[:, None, :, None] | kv_padding[:, None, None, :]  # [b, 1, sq, skv]
        mask = pad if mask is None else mask | pad
    if arbitrary_mask is not None:
        mask = arbitrary_mask if mask is None else mask | arbitrary_mask
    # The kernels want the last two dims in full.
    batch, heads = mask.shape[0], mask.shape[1]
    return MaskPlan("explicit", mask.expand(batch, heads, sq, skv))


def get_alibi_slopes(num_heads: int, device=None) -> torch.Tensor:
    """ALiBi's default slopes [num_heads] (fp32): the geometric series 2^(-8k/n) for the
    largest power of two n <= num_heads, then the odd terms of the series for 2n."""
    n = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (num_heads - n), 2)]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def alibi_bias(slopes: torch.Tensor, attn_mask_type: str, sq: int, skv: int,
               q_padding: Optional[torch.Tensor] = None, kv_padding: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ALiBi bias -slope * |i + off - j| (fp32) with the diagonal offset of the mask type:
    [1, h, sq, skv] for slopes [h], [b, h, sq, skv] for slopes [b, h] or padding types."""
    q_lengths = kv_lengths = None
    if "padding" in attn_mask_type:
        q_lengths = (~q_padding).sum(dim=1)
        kv_lengths = (~kv_padding).sum(dim=1)
    offset = _diagonal_offset(attn_mask_type, sq, skv, q_lengths, kv_lengths)
    i = torch.arange(sq, device=slopes.device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=slopes.device).view(1, 1, 1, skv)
    distance = (i + offset - j).abs().to(torch.float32)  # [1 or b, 1, sq, skv]
    slopes = slopes.view(1, -1, 1, 1) if slopes.dim() == 1 else slopes.view(*slopes.shape, 1, 1)
    return -distance * slopes
