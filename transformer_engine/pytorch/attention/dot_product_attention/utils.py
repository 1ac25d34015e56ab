"""Layout helpers of DotProductAttention: the head-major view the score GEMMs use, the
output layouts, and the conversion of packed (thd) tensors to padded bshd and back.

Formats: ``sbhd`` [s, b, h, d], ``bshd`` [b, s, h, d], ``thd`` [t, h, d] with the
sequences of a batch packed one after another (``cu_seqlens`` [b + 1] cumulative lengths;
``cu_seqlens_padded`` the offsets when there is room between them).
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

import torch

__all__ = [
    "AttentionLogging",
    "to_bhsd",
    "from_bhsd",
    "seqlens_from_cu_seqlens",
    "thd_to_padded_bshd",
    "padded_bshd_to_thd",
]


class AttentionLogging:
    """The loggers of the attention modules (named as Transformer Engine's). With
    NVTE_DEBUG=1, NVTE_DEBUG_LEVEL=1 logs the backend choice and why the other backends
    were not chosen, NVTE_DEBUG_LEVEL=2 also the whole configuration. The variables are
    read at each backend selection, so they can change within a process."""

    formatter = logging.Formatter("[%(levelname)-8s | %(name)-19s]: %(message)s")
    _handler: Optional[logging.Handler] = None

    @staticmethod
    def debug_level() -> int:
        """NVTE_DEBUG * NVTE_DEBUG_LEVEL (0: off, 1: info, 2: debug)."""
        try:
            return int(os.getenv("NVTE_DEBUG", "0")) * int(os.getenv("NVTE_DEBUG_LEVEL", "0"))
        except ValueError:
            return 0

    @classmethod
    def logger(cls, name: str = "DotProductAttention") -> logging.Logger:
        """The logger ``name``, its level set from the environment when debugging is on
        (left alone otherwise), with a stream handler unless one is reachable already."""
        logger = logging.getLogger(name)
        level = cls.debug_level()
        if level >= 1:
            logger.setLevel(logging.INFO if level == 1 else logging.DEBUG)
            if not logger.hasHandlers():
                if cls._handler is None:
                    cls._handler = logging.StreamHandler()
                    cls._handler.setFormatter(cls.formatter)
                logger.addHandler(cls._handler)
        return logger


def to_bhsd(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """[b, h, s, d] view of a 4-D sbhd or bshd tensor (no copy)."""
    if qkv_format == "sbhd":
        return x.permute(1, 2, 0, 3)
    return x.permute(0, 2, 1, 3)


def from_bhsd(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """[b, h, s, d] -> the module's output layout with the heads flattened:
    sbhd [s, b, h * d], bshd [b, s, h * d]."""
    b, h, s, d = x.shape
    if qkv_format == "sbhd":
        return x.permute(2, 0, 1, 3).reshape(s, b, h * d)
    return x.permute(0, 2, 1, 3).reshape(b, s, h * d)


def seqlens_from_cu_seqlens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Lengths [b] (int64) from cumulative lengths [b + 1]."""
    cu = cu_seqlens.to(torch.int64)
    return cu[1:] - cu[:-1]


def _token_index(cu_seqlens: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor], max_seqlen: int,
                 num_tokens: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """For the padded [b, max_seqlen] grid: the packed token index of each slot [b, s] and
    whether the slot holds a token [b, s]. Indices stay inside [0, num_tokens) (empty
    slots and out-of-range offsets are marked invalid), so no gather can go out of bounds."""
    lengths = seqlens_from_cu_seqlens(cu_seqlens)
    starts = (cu_seqlens_padded if cu_seqlens_padded is not None else cu_seqlens).to(torch.int64)[:-1]
    positions = torch.arange(max_seqlen, device=cu_seqlens.device, dtype=torch.int64)
    index = starts[:, None] + positions[None, :]
    valid = (positions[None, :] < lengths[:, None]) & (index < num_tokens) & (index >= 0)
    return index.clamp(0, max(num_tokens - 1, 0)), valid


def thd_to_padded_bshd(x: torch.Tensor, cu_seqlens: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor],
                       max_seqlen: int) -> torch.Tensor:
    """[t, h, d] packed -> [b, max_seqlen, h, d], zeros past each sequence's end
    (differentiable: the gradient of each slot goes back to its token). Rows that belong
    to no sequence are never read into a valid slot, so whatever they hold (flash-attn
    leaves them unwritten) cannot leak: the empty slots are selected away, not multiplied
    by zero (0 * NaN is NaN)."""
    index, valid = _token_index(cu_seqlens, cu_seqlens_padded, max_seqlen, x.shape[0])
    b = index.shape[0]
    gathered = x.index_select(0, index.reshape(-1)).reshape(b, max_seqlen, *x.shape[1:])
    keep = valid.reshape(b, max_seqlen, *([1] * (x.dim() - 1)))
    return torch.where(keep, gathered, gathered.new_zeros(()))


def padded_bshd_to_thd(x: torch.Tensor, cu_seqlens: torch.Tensor, cu_seqlens_padded: Optional[torch.Tensor],
                       num_tokens: int) -> torch.Tensor:
    """[b, s, ...] padded -> [num_tokens, ...] packed; tokens that belong to no sequence
    (room between padded sequences) are zero."""
    b, s = x.shape[:2]
    index, valid = _token_index(cu_seqlens, cu_seqlens_padded, s, num_tokens)
    # Empty slots go to an extra row that is dropped: the scatter stays free of host syncs.
    target = torch.where(valid, index, torch.full_like(index, num_tokens)).reshape(-1)
    rows = x.reshape(b * s, *x.shape[2:])
    out = x.new_zeros(num_tokens + 1, *x.shape[2:]).index_copy(0, target, rows)
    return out[:num_tokens]
