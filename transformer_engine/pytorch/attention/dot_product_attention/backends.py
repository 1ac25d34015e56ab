"""Which backend runs an attention call, and why the others do not.

Backends, as in Transformer Engine: FlashAttention (the flash-attn 2.x package, when it
is installed; flash.py), FusedAttention (cuDNN) and UnfusedDotProductAttention. Each has a
filter that lists the reasons it cannot take a call (an empty list: it can);
``get_attention_backend`` runs the filters and picks, in Transformer Engine's order of
preference, FusedAttention over FlashAttention on Hopper and newer (FlashAttention first
before Hopper), then UnfusedDotProductAttention. FusedAttention is cuDNN's fused SDPA
(fused.py), with Transformer Engine's "F16 arbitrary sequence length" sub-backend only.

flash-attn aligns every causal mask, sliding window and ALiBi bias bottom-right (since
2.1). The bottom-right mask types map onto it directly; the top-left ``causal`` only when
sq == skv, and ``padding_causal`` only when queries and keys share one set of sequence
lengths (then both alignments are the same mask). flash-attn 3 (``flash_attn_interface``)
is not called.

Environment: NVTE_FLASH_ATTN, NVTE_FUSED_ATTN, NVTE_UNFUSED_ATTN (0 disables a backend,
default 1), NVTE_FUSED_ATTN_BACKEND (the cuDNN sub-backend: 1, or unset; any other value
disables FusedAttention, as OpenTE has no other). With NVTE_DEBUG=1 and NVTE_DEBUG_LEVEL >= 1 the choice and every reason
are logged on the "DotProductAttention" logger (level 2 also logs the parameters).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from transformer_engine.pytorch.attention.dot_product_attention.flash import load_flash_attn
from transformer_engine.pytorch.attention.dot_product_attention.utils import AttentionLogging

__all__ = ["AttentionParams", "AttentionBackend", "get_attention_backend", "BACKEND_NAMES"]

FLASH, FUSED, UNFUSED = "FlashAttention", "FusedAttention", "UnfusedDotProductAttention"
F16_ARBITRARY_SEQLEN = 1  # Transformer Engine's NVTE_Fused_Attn_Backend value of OpenTE's cuDNN backend
BACKEND_NAMES = (FLASH, FUSED, UNFUSED)
_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}


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
    # OpenTE's: the padding types' queries and keys have the same sequence lengths by
    # construction (one padding mask or one cu_seqlens tensor for both).
    shared_seqlens: bool = False


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


FLASH_ATTN_MIN_VERSION = (2, 1, 1)  # Transformer Engine's minimum: bottom-right causal masks since 2.1
# The flash-attn release that added each feature OpenTE passes on.
_FLASH_FEATURE_VERSIONS = {"sliding windows": (2, 3, 0), "ALiBi": (2, 4, 0), "deterministic backward": (2, 4, 1)}
# flash-attn 2 runs head dims above 192 on these compute capabilities only (as Transformer Engine's filter).
_FLASH_BIG_HEAD_ARCHS = ((8, 0), (9, 0), (10, 0), (12, 0))


def _parse_version(text: str) -> Optional[Tuple[int, int, int]]:
    """(major, minor, patch) of a version string such as "2.6.3+cu123torch2.4", or None."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def _flash_platform_reasons(p: AttentionParams) -> List[str]:
    """What flash-attn 2's kernels run on: CUDA tensors on sm80 or newer, float16 or
    bfloat16. (The tests of the call path replace this rule to run the backend on the CPU
    through a plain-torch stand-in of the package; nothing else does.)"""
    reasons = []
    if p.device_type != "cuda":
        reasons.append(f"needs CUDA tensors, got {p.device_type}")
    elif p.compute_capability < (8, 0):
        reasons.append(f"needs compute capability 8.0 or newer, got {p.compute_capability}")
    if p.qkv_dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"needs float16 or bfloat16, got {_DTYPE_NAMES.get(p.qkv_dtype, p.qkv_dtype)} inputs")
    return reasons


def _flash_version_reasons(p: AttentionParams) -> List[str]:
    """Whether the installed flash-attn is a 2.x release new enough for this call."""
    installed = _flash_attn_version()
    if installed is None:
        return ["flash-attn is not installed"]
    parsed = _parse_version(installed)
    if parsed is None or parsed[0] != 2:
        return [f"flash-attn {installed} is not a 2.x release (OpenTE calls flash-attn 2's API)"]
    if parsed < FLASH_ATTN_MIN_VERSION:
        return [f"flash-attn {installed} is too old: needs 2.1.1 or newer (bottom-right causal masks)"]
    wanted = []
    if p.window_size not in ((-1, -1), (-1, 0)):
        wanted.append("sliding windows")
    if p.core_attention_bias_type == "alibi":
        wanted.append("ALiBi")
    if p.deterministic and p.is_training:
        wanted.append("deterministic backward")
    return [f"flash-attn {installed} is too old for {feature}: needs "
            f"{'.'.join(map(str, _FLASH_FEATURE_VERSIONS[feature]))} or newer"
            for feature in wanted if parsed < _FLASH_FEATURE_VERSIONS[feature]]


def _flash_import_error() -> Optional[str]:
    """Why the installed flash-attn cannot be imported (a build for another torch or CUDA),
    or None."""
    try:
        load_flash_attn()
    except Exception as error:  # noqa: BLE001 (a broken CUDA extension raises anything: OSError, RuntimeError...)
        return f"flash-attn is installed but cannot be imported ({type(error).__name__}: {error})"
    return None


def _kernel_backend_reasons(p: AttentionParams, fp8_reason: str) -> List[str]:
    """What neither kernel backend (flash-attn, cuDNN) takes: other softmax types, max_logit,
    FP8 attention (``fp8_reason`` says why) and context parallelism."""
    reasons = []
    if p.softmax_type != "vanilla":
        reasons.append(f"does not take softmax_type={p.softmax_type}")
    if p.return_max_logit:
        reasons.append("does not return max_logit")
    if p.fp8_dpa:
        reasons.append(fp8_reason)
    if p.context_parallel:
        reasons.append("context parallelism is not implemented in OpenTE")
    return reasons


def _flash_reasons(p: AttentionParams) -> List[str]:
    """Why flash-attn 2 cannot take a call (see the module docstring for the masks)."""
    reasons = []
    if not _env_flag("NVTE_FLASH_ATTN"):
        reasons.append("disabled by NVTE_FLASH_ATTN=0")
    reasons += _flash_platform_reasons(p)
    if p.head_dim_qk != p.head_dim_v:
        reasons.append(f"needs one head dim for q, k and v (flash-attn 2 has no MLA), got {p.head_dim_qk} and "
                       f"{p.head_dim_v}")
    elif p.head_dim_qk > 256 or p.head_dim_qk % 8 != 0:
        reasons.append(f"needs a head dim that is a multiple of 8 and at most 256, got {p.head_dim_qk}")
    elif p.head_dim_qk > 192 and p.device_type == "cuda" and p.compute_capability not in _FLASH_BIG_HEAD_ARCHS:
        reasons.append(f"head dims above 192 need sm80, sm90, sm100 or sm120, got {p.compute_capability}")
    if min(p.batch_size, p.max_seqlen_q, p.max_seqlen_kv, p.num_heads, p.num_gqa_groups) < 1:
        reasons.append("does not take empty tensors")
    if p.attn_mask_type == "arbitrary":
        reasons.append("does not take arbitrary masks")
    if p.attn_mask_type == "causal" and p.max_seqlen_q != p.max_seqlen_kv:
        reasons.append(f"aligns causal masks bottom-right: takes the top-left attn_mask_type=causal only when "
                       f"sq == skv, got sq={p.max_seqlen_q}, skv={p.max_seqlen_kv}")
    if p.attn_mask_type == "padding_causal" and not p.shared_seqlens:
        reasons.append("aligns causal masks bottom-right: takes the top-left attn_mask_type=padding_causal only "
                       "when queries and keys share their sequence lengths (one padding mask or one cu_seqlens "
                       "tensor)")
    if p.core_attention_bias_type in ("pre_scale_bias", "post_scale_bias"):
        reasons.append(f"does not take core_attention_bias_type={p.core_attention_bias_type}")
    reasons += _kernel_backend_reasons(p, "flash-attn 2 does not compute attention in FP8 (the recipe has "
                                          "fp8_dpa=True)")
    reasons += _flash_version_reasons(p)
    if not reasons:  # import only for a call it would run (the first import loads CUDA kernels)
        import_error = _flash_import_error()
        if import_error is not None:
            reasons.append(import_error)
    return reasons


def _cudnn_unavailable_reason() -> Optional[str]:
    """Why cuDNN fused attention cannot run in this process, or None (checked once)."""
    from transformer_engine.pytorch.cpp_extensions.fused_attn import cudnn_unavailable_reason

    return cudnn_unavailable_reason()


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
    reasons += _kernel_backend_reasons(p, "FP8 attention (the recipe has fp8_dpa=True) is not implemented in OpenTE")
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
    for name in order:
        if name != chosen and not reasons[name]:
            reasons[name] = [f"can run the call, but {chosen} comes first (preference: {' > '.join(order)})"]
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
