"""Which backend runs an attention call, and why the others do not.

Backends, as in Transformer Engine: FlashAttention (the flash-attn package),
FusedAttention (cuDNN) and UnfusedDotProductAttention. Each has a filter that lists the
reasons it cannot take a call (an empty list: it can); ``get_attention_backend`` runs the
filters and picks, in Transformer Engine's order of preference, FusedAttention over
FlashAttention on Hopper and newer (FlashAttention first before Hopper), then
UnfusedDotProductAttention. OpenTE has no FlashAttention backend yet (its filter says so
last); FusedAttention is cuDNN's fused SDPA (fused.py), with Transformer Engine's
"F16 arbitrary sequence length" sub-backend only.

Environment: NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, NVTE_UNFUSED_ATTN (0 disables a backend,
default 1), NVTE_FUSED_ATTN_BACKEND (the cuDNN sub-backend: 1, or unset; any other value
disables FusedAttention, as OpenTE has no other). With NVTE_DEBUG=1 and NVTE_DEBUG_LEVEL >= 1 the choice and every reason
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
F16_ARBITRARY_SEQLEN = 1  # Transformer Engine's NVTE_Fused_Attn_Backend value of OpenTE's cuDNN backend
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
    and ``fused_attention_backend`` (the cuDNN sub-backend when FusedAttention is chosen:
    1, Transformer Engine's F16_arbitrary_seqlen, the only one OpenTE has; else None)."""

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


def _cudnn_unavailable_reason() -> Optional[str]:
    """Why cuDNN fused attention cannot run in this process, or None (checked once)."""
    from transformer_engine.pytorch.cpp_extensions.fused_attn import cudnn_unavailable_reason

    return cudnn_unavailable_reason()


_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


def _bottom_right_band(p: AttentionParams) -> bool:
    """Whether cuDNN must align the mask's diagonal band bottom-right: every type but causal
    / padding_causal aligns its band (causal or window) bottom-right, which equals top-left
    without padding when sq == skv (as sdpa_band in csrc/ops/fused_attn/fused_attn.cpp)."""
    left, right = p.window_size
    band = left >= 0 or right >= 0 or "causal" in p.attn_mask_type
    top_left = p.attn_mask_type in ("causal", "padding_causal")
    padded = "padding" in p.attn_mask_type
    return band and not top_left and (padded or p.max_seqlen_q != p.max_seqlen_kv)


def _fused_reasons(p: AttentionParams) -> List[str]:
    """Why OpenTE's cuDNN backend (sub-backend 1 of NVTE_FUSED_ATTN_BACKEND: F16 arbitrary
    sequence length) cannot take a call; cuDNN may still refuse a call that passes these
    (checked before the call runs, falling back to the unfused backend)."""
    reasons = []
    if not _env_flag("NVTE_FUSED_ATTN"):
        reasons.append("disabled by NVTE_FUSED_ATTN=0")
    sub_backend = _fused_sub_backend()
    if sub_backend is not None and sub_backend != 1:
        reasons.append(f"NVTE_FUSED_ATTN_BACKEND={sub_backend} asks for a sub-backend OpenTE does not have (only 1, "
                       "the F16 arbitrary sequence length one)")
    if p.device_type != "cuda":
        reasons.append(f"needs CUDA tensors, got {p.device_type}")
    elif p.compute_capability < (8, 0):
        reasons.append(f"needs compute capability 8.0 or newer, got {p.compute_capability}")
    if p.qkv_dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"needs float16 or bfloat16, got {_DTYPE_NAMES.get(p.qkv_dtype, p.qkv_dtype)} inputs")
    for name, d in (("head dim", p.head_dim_qk), ("head dim of v", p.head_dim_v)):
        if d > 256:
            reasons.append(f"{name} {d} > 256")
        elif d % 8 != 0:
            reasons.append(f"{name} {d} is not a multiple of 8")
    if min(p.batch_size, p.max_seqlen_q, p.max_seqlen_kv, p.num_heads, p.num_gqa_groups) < 1:
        reasons.append("does not take empty tensors")
    if p.attn_mask_type == "arbitrary":
        reasons.append("does not take arbitrary masks")
    if p.core_attention_bias_type in ("pre_scale_bias", "alibi"):
        reasons.append(f"does not take core_attention_bias_type={p.core_attention_bias_type} in OpenTE")
    elif p.core_attention_bias_type == "post_scale_bias" and p.core_attention_bias_shape is not None:
        shape = tuple(p.core_attention_bias_shape)
        if len(shape) != 4 or shape[2] != p.max_seqlen_q:
            reasons.append(f"takes a bias of shape [1 or b, 1 or h, sq, skv] only, got {list(shape)}")
        elif p.core_attention_bias_requires_grad and (shape[0] != 1 or shape[1] != p.num_heads):
            reasons.append(f"computes the bias gradient for a bias of shape [1, h, sq, skv] only, got {list(shape)}")
    bottom_right = _bottom_right_band(p)
    padded = "padding" in p.attn_mask_type
    dropout = p.is_training and p.attention_dropout > 0.0
    if bottom_right and (p.core_attention_bias_type != "no_bias" or dropout):
        reasons.append("cuDNN aligns masks bottom-right (here: mask type "
                       f"{p.attn_mask_type}, sq={p.max_seqlen_q}, skv={p.max_seqlen_kv}) without a bias or dropout only")
    if not padded and p.max_seqlen_q > p.max_seqlen_kv and (bottom_right or p.window_size[0] >= 0):
        reasons.append(f"cuDNN's bottom-right masks and sliding windows need sq <= skv, got sq={p.max_seqlen_q}, "
                       f"skv={p.max_seqlen_kv}")
    if p.softmax_type != "vanilla":
        reasons.append(f"does not take softmax_type={p.softmax_type}")
    if p.return_max_logit:
        reasons.append("does not return max_logit")
    if p.fp8_dpa:
        reasons.append("FP8 attention (the recipe has fp8_dpa=True) is not implemented in OpenTE")
    if p.context_parallel:
        reasons.append("context parallelism is not implemented in OpenTE")
    if p.device_type == "cuda":
        unavailable = _cudnn_unavailable_reason()
        if unavailable is not None:
            reasons.append(unavailable)
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
                              F16_ARBITRARY_SEQLEN if chosen == FUSED else None)
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
