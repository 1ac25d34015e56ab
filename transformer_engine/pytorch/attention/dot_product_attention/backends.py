"""Which backend runs an attention call, and why the others do not.

Backends, as in Transformer Engine: FlashAttention (the flash-attn package),
FusedAttention (cuDNN) and UnfusedDotProductAttention. Each has a filter that lists the
reasons it cannot take a call (an empty list: it can); ``get_attention_backend`` runs the
filters and picks, in Transformer Engine's order of preference, FusedAttention over
FlashAttention on Hopper and newer (FlashAttention first before Hopper), then
UnfusedDotProductAttention. OpenTE has no FlashAttention or FusedAttention backend yet:
their filters say so last, after the reasons a real backend would give, so that adding
one is a matter of replacing that line (and ``DotProductAttention`` dispatching on the
name).

Environment: NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, NVTE_UNFUSED_ATTN (0 disables a backend,
default 1), NVTE_FUSED_ATTN_BACKEND (the cuDNN sub-backend a fused backend should use;
recorded for it). With NVTE_DEBUG=1 and NVTE_DEBUG_LEVEL >= 1 the choice and every reason
are logged on the "DotProductAttention" logger (level 2 also logs the parameters).
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from transformer_engine.pytorch.attention.dot_product_attention.utils import AttentionLogging

__all__ = ["AttentionParams", "AttentionBackend", "get_attention_backend", "BACKEND_NAMES"]

FLASH, FUSED, UNFUSED = "FlashAttention", "FusedAttention", "UnfusedDotProductAttention"
BACKEND_NAMES = (FLASH, FUSED, UNFUSED)


@dataclass(frozen=True)
class AttentionParams:
    """What the backend choice depends on (hashable: the choice is cached per value)."""

    qkv_dtype: torch.dtype = torch.bfloat16
    device_type: str = "cuda"
    compute_capability: Tuple[int, int] = (0, 0)
    qkv_format: str = "sbhd"
    batch_size: int = 1
    num_heads: int = 16
    num_gqa_groups: int = 16
    max_seqlen_q: int = 128
    max_seqlen_kv: int = 128
    head_dim_qk: int = 64
    head_dim_v: int = 64
    attn_mask_type: str = "no_mask"
    window_size: Tuple[int, int] = (-1, -1)
    core_attention_bias_type: str = "no_bias"
    core_attention_bias_shape: Optional[Tuple[int, ...]] = None
    core_attention_bias_requires_grad: bool = False
    alibi_slopes_shape: Optional[Tuple[int, ...]] = None
    attention_dropout: float = 0.0
    context_parallel: bool = False
    deterministic: bool = False
    is_training: bool = True
    fp8_dpa: bool = False
    inference: bool = False
    softmax_type: str = "vanilla"
    return_max_logit: bool = False


class AttentionBackend(NamedTuple):
    """The choice: ``name`` (one of BACKEND_NAMES, or None when no backend can run the
    call), ``reasons`` (backend name -> why it was not chosen; empty for the chosen one)
    and ``fused_attention_backend`` (NVTE_FUSED_ATTN_BACKEND, for a fused backend)."""

    name: Optional[str]
    reasons: Dict[str, List[str]]
    fused_attention_backend: Optional[int] = None


def _flash_attn_version() -> Optional[str]:
    try:
        return version("flash-attn")
    except PackageNotFoundError:
        return None


def _env_flag(name: str) -> bool:
    return os.getenv(name, "1") != "0"


def _flash_reasons(p: AttentionParams) -> List[str]:
    reasons = []
    if not _env_flag("NVTE_FLASH_ATTN"):
        reasons.append("disabled by NVTE_FLASH_ATTN=0")
    if p.device_type != "cuda":
        reasons.append(f"needs CUDA tensors, got {p.device_type}")
    if p.qkv_dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"needs float16 or bfloat16, got {p.qkv_dtype}")
    if p.attn_mask_type == "arbitrary":
        reasons.append("does not take arbitrary masks")
    if p.core_attention_bias_type in ("pre_scale_bias", "post_scale_bias"):
        reasons.append(f"does not take core_attention_bias_type={p.core_attention_bias_type}")
    if p.softmax_type != "vanilla":
        reasons.append(f"does not take softmax_type={p.softmax_type}")
    if p.return_max_logit:
        reasons.append("does not return max_logit")
    if p.head_dim_qk != p.head_dim_v or p.head_dim_qk > 256 or p.head_dim_qk % 8 != 0:
        reasons.append(f"needs equal head dims, a multiple of 8 and at most 256, got {p.head_dim_qk}/{p.head_dim_v}")
    if p.attn_mask_type in ("causal", "padding_causal") and p.max_seqlen_q != p.max_seqlen_kv:
        reasons.append("aligns causal masks bottom-right only (sq != skv with a top-left causal mask)")
    installed = _flash_attn_version()
    if installed is None:
        reasons.append("flash-attn is not installed")
    else:
        reasons.append(f"OpenTE does not call flash-attn yet (flash-attn {installed} is installed)")
    return reasons


def _fused_reasons(p: AttentionParams) -> List[str]:
    reasons = []
    if not _env_flag("NVTE_FUSED_ATTN"):
        reasons.append("disabled by NVTE_FUSED_ATTN=0")
    if p.device_type != "cuda":
        reasons.append(f"needs CUDA tensors, got {p.device_type}")
    elif p.compute_capability < (8, 0):
        reasons.append(f"needs compute capability 8.0 or newer, got {p.compute_capability}")
    if p.qkv_dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"needs float16 or bfloat16, got {p.qkv_dtype}")
    if p.attn_mask_type == "arbitrary":
        reasons.append("does not take arbitrary masks")
    reasons.append("the cuDNN fused attention backend is not implemented in OpenTE yet")
    return reasons


def _unfused_reasons(p: AttentionParams) -> List[str]:
    reasons = []
    if not _env_flag("NVTE_UNFUSED_ATTN"):
        reasons.append("disabled by NVTE_UNFUSED_ATTN=0")
    if p.context_parallel:
        reasons.append("does not support context parallelism")
    if p.fp8_dpa:
        reasons.append("does not compute attention in FP8 (the recipe has fp8_dpa=True)")
    return reasons


def _fused_sub_backend() -> Optional[int]:
    """NVTE_FUSED_ATTN_BACKEND as an int (None when unset or not a number)."""
    value = os.getenv("NVTE_FUSED_ATTN_BACKEND", "")
    return int(value) if value.strip().lstrip("-").isdigit() else None


def _env_key() -> Tuple:
    keys = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_FUSED_ATTN_BACKEND", "NVTE_DEBUG",
            "NVTE_DEBUG_LEVEL")
    return tuple(os.getenv(k) for k in keys)


def get_attention_backend(params: AttentionParams) -> AttentionBackend:
    """The backend for ``params`` (see the module docstring)."""
    return _select(params, _env_key())


@functools.lru_cache(maxsize=256)
def _select(params: AttentionParams, env: Tuple) -> AttentionBackend:
    del env  # part of the cache key only: a changed environment selects again
    reasons = {FLASH: _flash_reasons(params), FUSED: _fused_reasons(params), UNFUSED: _unfused_reasons(params)}
    order = [FUSED, FLASH, UNFUSED] if params.compute_capability >= (9, 0) else [FLASH, FUSED, UNFUSED]
    chosen = next((name for name in order if not reasons[name]), None)
    choice = AttentionBackend(chosen, {k: v for k, v in reasons.items() if k != chosen},
                              _fused_sub_backend() if chosen == FUSED else None)
    _log(params, choice)
    return choice


def _log(params: AttentionParams, choice: AttentionBackend) -> None:
    level = AttentionLogging.debug_level()
    if level < 1:
        return
    logger = AttentionLogging.logger()
    logger.debug("Running with config=%s", asdict(params))
    for name, why in choice.reasons.items():
        logger.info("Disabling %s: %s", name, "; ".join(why))
    if choice.name is None:
        logger.info("No backend is available for the provided inputs")
    else:
        logger.info("Running with %s backend", choice.name)


def no_backend_message(choice: AttentionBackend) -> str:
    """The error for a call no backend can run, with every backend's reasons."""
    lines = [f"  {name}: {'; '.join(why)}" for name, why in choice.reasons.items()]
    return ("DotProductAttention: no dot product attention backend is available for the provided inputs:\n"
            + "\n".join(lines))
