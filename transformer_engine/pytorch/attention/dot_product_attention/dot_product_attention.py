"""DotProductAttention: Transformer Engine's attention module (softmax(Q K^T * scale) V
with masks, sliding windows, biases, ALiBi, sink softmax types, GQA, dropout, KV caching
and the sbhd / bshd / thd formats). The work goes to the backend that
``get_attention_backend`` chooses: FlashAttention (the flash-attn package, when it is
installed), FusedAttention (cuDNN) or UnfusedDotProductAttention; a call cuDNN refuses at
run time (checked before anything runs) falls back to the unfused one.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import warnings
from contextlib import nullcontext
from typing import Callable, List, Optional, Tuple, Union

import torch

from transformer_engine.pytorch.attention.dot_product_attention.backends import (
    FLASH,
    FUSED,
    AttentionParams,
    get_attention_backend,
    no_backend_message,
)
from transformer_engine.pytorch.attention.dot_product_attention.flash import FlashAttention
from transformer_engine.pytorch.attention.dot_product_attention.fused import (
    FusedAttention,
    FusedAttentionUnsupported,
)
from transformer_engine.pytorch.attention.dot_product_attention.masks import (
    alibi_bias,
    check_set_window_size,
    get_alibi_slopes,
    normalize_attn_mask_type,
    plan_attention_mask,
)
from transformer_engine.pytorch.attention.dot_product_attention.unfused import UnfusedDotProductAttention
from transformer_engine.pytorch.attention.dot_product_attention.utils import (
    AttentionLogging,
    from_bhsd,
    padded_bshd_to_thd,
    seqlens_from_cu_seqlens,
    thd_to_padded_bshd,
)
from transformer_engine.pytorch.attention.inference import InferenceParams
from transformer_engine.pytorch.distributed import checkpoint, get_distributed_world_size
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
from transformer_engine.pytorch.module.base import TransformerEngineBaseModule, default_device

__all__ = ["DotProductAttention"]

_OWNER = "DotProductAttention"
_QKV_FORMATS = ("sbhd", "bshd", "thd")
_QKV_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BIAS_TYPES = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
_SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
_CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


@functools.lru_cache(maxsize=None)
def _compute_capability(device_index: int) -> Tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


_FALLBACK_WARNED = set()


def _fused_fallback(reason: str) -> None:
    """A call the fused backend was chosen for but cuDNN refused: log it (NVTE_DEBUG) and
    warn once per reason; the unfused backend runs it."""
    if AttentionLogging.debug_level() >= 1:
        AttentionLogging.logger().info("Disabling FusedAttention for this call (%s); running with "
                                       "UnfusedDotProductAttention", reason)
    if reason not in _FALLBACK_WARNED:
        _FALLBACK_WARNED.add(reason)
        warnings.warn(f"{_OWNER}: cuDNN cannot run this call, the unfused backend does: {reason}", stacklevel=3)


def _positive_int(value, name: str) -> int:
    """``value`` as a positive int (anything with __index__: numpy and 0-d torch integers too)."""
    try:
        number = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        number = None
    if number is None or number <= 0:
        raise ValueError(f"{_OWNER}: {name} must be a positive int, got {value!r}")
    return number


def _check_cu_seqlens(cu_seqlens, name: str, batch: Optional[int]) -> Optional[torch.Tensor]:
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{_OWNER}: {name} must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{_OWNER}: {name} must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2 or (batch is not None and cu_seqlens.shape[0] != batch + 1):
        expected = "[batch_size + 1]" if batch is None else f"[{batch + 1}] (batch_size + 1)"
        raise ValueError(f"{_OWNER}: {name} must have shape {expected}, got {tuple(cu_seqlens.shape)}")
    return cu_seqlens


def _same_tensor(a, b) -> bool:
    """``a`` and ``b`` are one tensor, or equal CPU tensors (compared without a device sync)."""
    if a is b:
        return True
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.device.type == b.device.type == "cpu"
            and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))


def _shares_seqlens(attention_mask, cu_seqlens_q, cu_seqlens_kv, qkv_format: str) -> bool:
    """Whether a padding type's queries and keys have one set of sequence lengths by
    construction: one padding mask for both, or one cu_seqlens tensor."""
    if qkv_format != "thd" and attention_mask is not None:
        if isinstance(attention_mask, (tuple, list)):
            return len(attention_mask) == 2 and attention_mask[0] is attention_mask[1]
        return True
    return cu_seqlens_q is not None and _same_tensor(cu_seqlens_q, cu_seqlens_kv)


def _padding_from_lengths(lengths: torch.Tensor, seqlen: int, device) -> torch.Tensor:
    """[b, seqlen] bool, True past each length."""
    return torch.arange(seqlen, device=device)[None, :] >= lengths.to(device)[:, None]


def _padding_from_mask(mask, name: str, batch: int, seqlen: int, device) -> torch.Tensor:
    """[b, seqlen] from a padding attention_mask [b, 1, 1, seqlen] (True = padding)."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise TypeError(f"{_OWNER}: {name} must be a bool tensor (True = padding), got {got}")
    if tuple(mask.shape) != (batch, 1, 1, seqlen):
        raise ValueError(f"{_OWNER}: {name} must have shape [{batch}, 1, 1, {seqlen}] (batch_size, 1, 1, seqlen), "
                         f"got {tuple(mask.shape)}")
    return mask.to(device).view(batch, seqlen)


class DotProductAttention(TransformerEngineBaseModule):
    """Scaled dot product attention, Transformer Engine's ``DotProductAttention``.

    Parameters as in Transformer Engine 2.x: ``num_attention_heads``, ``kv_channels`` (an
    int, or (k, v) head sizes), ``num_gqa_groups`` (default: num_attention_heads),
    ``attention_dropout``, ``qkv_format`` ("sbhd", "bshd", "thd"), ``attn_mask_type``
    (default "causal"), ``window_size``, ``sequence_parallel``, ``tp_size``,
    ``get_rng_state_tracker`` (dropout runs in its fork), ``tp_group``, ``layer_number``
    (the KV cache key), ``attention_type`` ("self", "cross"), ``cp_group``,
    ``cp_global_ranks``, ``cp_stream``, ``cp_comm_type``, ``softmax_scale`` (default
    1/sqrt(kv_channels)), ``softmax_type`` ("vanilla", "off-by-one", "learnable": a
    per-head learnable sink logit, the parameter ``softmax_offset``), ``return_max_logit``
    (forward returns (output, max_logit [h])), ``name``.

    Tensor parallelism over more than one rank and context parallelism raise
    NotImplementedError (a later OpenTE issue).
    """

    def __init__(self, num_attention_heads: int, kv_channels: Union[int, Tuple[int, int]],
                 num_gqa_groups: Optional[int] = None, attention_dropout: float = 0.0, qkv_format: str = "sbhd",
                 attn_mask_type: str = "causal", window_size: Optional[Tuple[int, int]] = None,
                 sequence_parallel: bool = False, tp_size: int = 1, get_rng_state_tracker: Optional[Callable] = None,
                 tp_group=None, layer_number: Optional[int] = None, attention_type: str = "self", cp_group=None,
                 cp_global_ranks: Optional[List[int]] = None, cp_stream=None, cp_comm_type: str = "p2p",
                 softmax_scale: Optional[float] = None, softmax_type: str = "vanilla",
                 return_max_logit: bool = False, name: Optional[str] = None):
        super().__init__(tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel)
        self.name = name
        self.num_attention_heads = _positive_int(num_attention_heads, "num_attention_heads")
        if isinstance(kv_channels, (tuple, list)):
            if len(kv_channels) != 2:
                raise ValueError(f"{_OWNER}: kv_channels must be an int or a (k, v) pair, got {kv_channels!r}")
            head_dim_k, head_dim_v = kv_channels
        else:
            head_dim_k = head_dim_v = kv_channels
        self.hidden_size_per_attention_head_k = _positive_int(head_dim_k, "kv_channels")
        self.hidden_size_per_attention_head_v = _positive_int(head_dim_v, "kv_channels")
        self.num_gqa_groups = (self.num_attention_heads if num_gqa_groups is None
                               else _positive_int(num_gqa_groups, "num_gqa_groups"))
        if self.num_attention_heads % self.num_gqa_groups != 0:
            raise ValueError(f"{_OWNER}: num_attention_heads={self.num_attention_heads} must be divisible by "
                             f"num_gqa_groups={self.num_gqa_groups}")
        self.num_attention_heads_per_partition = self.num_attention_heads // self.tp_size
        self.num_gqa_groups_per_partition = self.num_gqa_groups // self.tp_size
        if isinstance(attention_dropout, bool) or not isinstance(attention_dropout, (int, float)) \
                or not 0.0 <= attention_dropout < 1.0:
            raise ValueError(f"{_OWNER}: attention_dropout must be a float in [0, 1), got {attention_dropout!r}")
        self.attention_dropout = float(attention_dropout)
        if qkv_format not in _QKV_FORMATS:
            raise ValueError(f"{_OWNER}: qkv_format must be one of {_QKV_FORMATS}, got {qkv_format!r}")
        self.qkv_format = qkv_format
        self.attn_mask_type = normalize_attn_mask_type(attn_mask_type)
        self.window_size = check_set_window_size(self.attn_mask_type, window_size)
        self._window_size_arg = window_size  # re-checked against a forward's mask type
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_OWNER}: attention_type must be 'self' or 'cross', got {attention_type!r}")
        self.attention_type = attention_type
        self.layer_number = 1 if layer_number is None else layer_number
        if softmax_type not in _SOFTMAX_TYPES:
            raise ValueError(f"{_OWNER}: softmax_type must be one of {_SOFTMAX_TYPES}, got {softmax_type!r}")
        self.softmax_type = softmax_type
        self.return_max_logit = bool(return_max_logit)
        self.cp_group = None
        self.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head_k)
        self.softmax_scale = float(softmax_scale)
        self.deterministic = (os.getenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1") == "0"
                              or torch.are_deterministic_algorithms_enabled())

        self.get_rng_state_tracker = get_rng_state_tracker
        self.rng_states_tracker = None
        attention_dropout_ctx = nullcontext
        if get_rng_state_tracker is not None and not sequence_parallel:
            self.rng_states_tracker = get_rng_state_tracker()
            attention_dropout_ctx = self.rng_states_tracker.fork

        # The sink logit of each head: 0 for off-by-one, learnable (initialised to 0) for learnable.
        heads = self.num_attention_heads_per_partition
        if softmax_type == "learnable":
            self.softmax_offset = torch.nn.Parameter(torch.zeros(heads, device=default_device()))
        elif softmax_type == "off-by-one":
            self.softmax_offset = torch.zeros(heads, device=default_device())
        else:
            self.softmax_offset = None

        self.flash_attention = FlashAttention(self.softmax_scale, attention_dropout=self.attention_dropout,
                                              attention_dropout_ctx=attention_dropout_ctx,
                                              deterministic=self.deterministic)
        self.fused_attention = FusedAttention(self.softmax_scale, attention_dropout=self.attention_dropout,
                                              attention_dropout_ctx=attention_dropout_ctx,
                                              deterministic=self.deterministic, layer_number=layer_number)
        self.unfused_attention = UnfusedDotProductAttention(
            self.softmax_scale, attention_type=attention_type, attention_dropout=self.attention_dropout,
            attention_dropout_ctx=attention_dropout_ctx, layer_number=layer_number, softmax_type=softmax_type,
            return_max_logit=self.return_max_logit)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """The learnable sink logits (softmax_type="learnable") back to 0, their initial value;
        ``defer_init=True`` does nothing (parameters on the meta device: call this after
        ``to_empty``)."""
        if not defer_init and isinstance(self.softmax_offset, torch.nn.Parameter):
            with torch.no_grad():
                self.softmax_offset.zero_()

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream, cp_comm_type: str = "p2p") -> None:
        """Sets the context-parallel attributes. A group of more than one rank is refused
        until OpenTE implements context parallelism."""
        if cp_comm_type not in _CP_COMM_TYPES:
            raise ValueError(f"{_OWNER}: cp_comm_type must be one of {_CP_COMM_TYPES}, got {cp_comm_type!r}")
        size = 1
        if cp_group is not None:
            for group in (cp_group if isinstance(cp_group, (list, tuple)) else [cp_group]):
                size *= get_distributed_world_size(group)
        if size > 1:
            raise NotImplementedError(f"{_OWNER}: context parallelism (cp_group of {size} ranks, cp_comm_type="
                                      f"{cp_comm_type!r}) is not implemented in OpenTE yet")
        self.cp_group, self.cp_global_ranks, self.cp_stream = cp_group, cp_global_ranks, cp_stream
        self.cp_comm_type = cp_comm_type

    # ---- checks of a forward's inputs ----
    def _check_qkv(self, query_layer, key_layer, value_layer, qkv_format: str) -> None:
        for name, t in (("query_layer", query_layer), ("key_layer", key_layer), ("value_layer", value_layer)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{_OWNER}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in _QKV_DTYPES:
                raise TypeError(f"{_OWNER}: {name} must be float16, bfloat16, float32 or float64, got {t.dtype}")
            dims = 3 if qkv_format == "thd" else 4
            if t.dim() != dims:
                raise ValueError(f"{_OWNER}: {name} must be {dims}-D for qkv_format={qkv_format!r}, got shape "
                                 f"{tuple(t.shape)}")
        if not query_layer.dtype == key_layer.dtype == value_layer.dtype:
            raise TypeError(f"{_OWNER}: query_layer, key_layer and value_layer must have one dtype, got "
                            f"{query_layer.dtype}, {key_layer.dtype}, {value_layer.dtype}")
        if not query_layer.device == key_layer.device == value_layer.device:
            raise ValueError(f"{_OWNER}: query_layer, key_layer and value_layer must be on one device, got "
                             f"{query_layer.device}, {key_layer.device}, {value_layer.device}")
        heads, groups = self.num_attention_heads_per_partition, self.num_gqa_groups_per_partition
        dk, dv = self.hidden_size_per_attention_head_k, self.hidden_size_per_attention_head_v
        layout = {"sbhd": "[s, b, h, d]", "bshd": "[b, s, h, d]", "thd": "[t, h, d]"}[qkv_format]
        for name, t, h, d, what in (("query_layer", query_layer, heads, dk, "num_attention_heads"),
                                    ("key_layer", key_layer, groups, dk, "num_gqa_groups"),
                                    ("value_layer", value_layer, groups, dv, "num_gqa_groups")):
            if t.shape[-2] != h or t.shape[-1] != d:
                raise ValueError(f"{_OWNER}: {name} {layout} must have {h} heads ({what}) of size {d} "
                                 f"(kv_channels), got shape {tuple(t.shape)}")
        if key_layer.shape[:-1] != value_layer.shape[:-1]:
            raise ValueError(f"{_OWNER}: key_layer and value_layer must agree in all but the head size, got "
                             f"{tuple(key_layer.shape)} and {tuple(value_layer.shape)}")
        if qkv_format != "thd":
            batch_dim = 1 if qkv_format == "sbhd" else 0
            if query_layer.shape[batch_dim] != key_layer.shape[batch_dim]:
                raise ValueError(f"{_OWNER}: query_layer and key_layer must have one batch size (dim {batch_dim} of "
                                 f"{qkv_format}), got shapes {tuple(query_layer.shape)} and {tuple(key_layer.shape)}")

    def _fp8_dpa(self) -> bool:
        if not FP8GlobalStateManager.is_fp8_enabled():
            return False
        recipe = FP8GlobalStateManager.get_fp8_recipe()
        return bool(getattr(recipe, "fp8_dpa", False) or getattr(recipe, "fp8_mha", False))

    def forward(self, query_layer: torch.Tensor, key_layer: torch.Tensor, value_layer: torch.Tensor,
                attention_mask: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
                qkv_format: Optional[str] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
                cu_seqlens_kv: Optional[torch.Tensor] = None, cu_seqlens_q_padded: Optional[torch.Tensor] = None,
                cu_seqlens_kv_padded: Optional[torch.Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None, attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None, checkpoint_core_attention: bool = False,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Optional[torch.Tensor] = None,
                alibi_slopes: Optional[torch.Tensor] = None, fast_zero_fill: bool = True,
                inference_params: Optional[InferenceParams] = None, pad_between_seqs: Optional[bool] = None,
                fp8_output: Optional[bool] = False, num_splits: Optional[int] = 1):
        """Attention of ``query_layer`` over ``key_layer`` / ``value_layer``.

        Returns sbhd [sq, b, h * dv], bshd [b, sq, h * dv] or thd [tq, h * dv] (with
        ``return_max_logit``: (output, max_logit [h])). Padded query positions come out 0.
        ``attention_mask`` (True = masked out): for padding types [b, 1, 1, s] (self
        attention) or a (q [b, 1, 1, sq], kv [b, 1, 1, skv]) pair, or use ``cu_seqlens_q``
        / ``cu_seqlens_kv``; for "arbitrary" a bool tensor broadcastable to [b, h, sq, skv].
        ``fast_zero_fill``, ``pad_between_seqs``, ``fp8_output`` and ``num_splits`` tune
        other backends and are accepted for compatibility.
        """
        del fast_zero_fill, pad_between_seqs, fp8_output, num_splits
        qkv_format = self.qkv_format if qkv_format is None else qkv_format
        if qkv_format not in _QKV_FORMATS:
            raise ValueError(f"{_OWNER}: qkv_format must be one of {_QKV_FORMATS}, got {qkv_format!r}")
        attn_mask_type = self.attn_mask_type if attn_mask_type is None else normalize_attn_mask_type(attn_mask_type)
        window_size = check_set_window_size(attn_mask_type,
                                            self._window_size_arg if window_size is None else window_size)
        self._check_qkv(query_layer, key_layer, value_layer, qkv_format)
        device = query_layer.device
        q_format = kv_format = qkv_format
        q_padding = kv_padding = None
        thd_tokens_q = packed = None
        # Facts of the raw arguments for the flash-attn backend (before they are moved).
        shared_seqlens = _shares_seqlens(attention_mask, cu_seqlens_q, cu_seqlens_kv, qkv_format)
        thd_without_gaps = all(padded is None or _same_tensor(padded, plain) for padded, plain in
                               ((cu_seqlens_q_padded, cu_seqlens_q), (cu_seqlens_kv_padded, cu_seqlens_kv)))

        if inference_params is not None:
            if qkv_format == "thd":
                raise NotImplementedError(f"{_OWNER}: KV caching (inference_params) with qkv_format='thd' is not "
                                          "implemented in OpenTE yet; use 'bshd' or 'sbhd'")
            if attention_mask is not None:
                raise ValueError(f"{_OWNER}: attention_mask must be None with inference_params (the padding comes "
                                 "from the KV cache's sequence lengths)")
            if attn_mask_type == "arbitrary":
                raise ValueError(f"{_OWNER}: attn_mask_type='arbitrary' cannot be used with inference_params")
            # The cache holds earlier tokens: causal masks align bottom-right, every
            # sequence has its own lengths.
            attn_mask_type = "padding_causal_bottom_right" if "causal" in attn_mask_type else "padding"
            (key_layer, value_layer, cu_seqlens_q, cu_seqlens_kv, _,
             _) = inference_params.step(self.layer_number, key_layer, value_layer, qkv_format)
            kv_format = "bshd"
            sq = query_layer.shape[0 if q_format == "sbhd" else 1]
            q_padding = _padding_from_lengths(seqlens_from_cu_seqlens(cu_seqlens_q), sq, device)
            kv_padding = _padding_from_lengths(seqlens_from_cu_seqlens(cu_seqlens_kv), key_layer.shape[1], device)
        elif qkv_format == "thd":
            if "padding" not in attn_mask_type:
                raise ValueError(f"{_OWNER}: qkv_format='thd' needs a padding attn_mask_type (padding, "
                                 f"padding_causal, padding_causal_bottom_right), got {attn_mask_type!r}")
            if cu_seqlens_q is None or cu_seqlens_kv is None:
                raise ValueError(f"{_OWNER}: qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv")
            cu_seqlens_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", None).to(device)
            batch = cu_seqlens_q.shape[0] - 1
            cu_seqlens_kv = _check_cu_seqlens(cu_seqlens_kv, "cu_seqlens_kv", batch).to(device)
            cu_seqlens_q_padded = _check_cu_seqlens(cu_seqlens_q_padded, "cu_seqlens_q_padded", batch)
            cu_seqlens_kv_padded = _check_cu_seqlens(cu_seqlens_kv_padded, "cu_seqlens_kv_padded", batch)
            cu_seqlens_q_padded = None if cu_seqlens_q_padded is None else cu_seqlens_q_padded.to(device)
            cu_seqlens_kv_padded = None if cu_seqlens_kv_padded is None else cu_seqlens_kv_padded.to(device)
            q_lengths, kv_lengths = seqlens_from_cu_seqlens(cu_seqlens_q), seqlens_from_cu_seqlens(cu_seqlens_kv)
            if max_seqlen_q is None:
                max_seqlen_q = max(int(q_lengths.max()), 1)
            if max_seqlen_kv is None:
                max_seqlen_kv = max(int(kv_lengths.max()), 1)
            max_seqlen_q = _positive_int(max_seqlen_q, "max_seqlen_q")
            max_seqlen_kv = _positive_int(max_seqlen_kv, "max_seqlen_kv")
            # Unpacked to padded bshd once the backend is known, unless flash-attn takes them packed.
            thd_tokens_q = query_layer.shape[0]
            packed = (query_layer, key_layer, value_layer)
            q_padding = _padding_from_lengths(q_lengths, max_seqlen_q, device)
            kv_padding = _padding_from_lengths(kv_lengths, max_seqlen_kv, device)

        if packed is not None:
            batch, sq, skv = cu_seqlens_q.shape[0] - 1, max_seqlen_q, max_seqlen_kv
        else:
            batch = query_layer.shape[1 if q_format == "sbhd" else 0]
            sq = query_layer.shape[0 if q_format == "sbhd" else 1]
            skv = key_layer.shape[0 if kv_format == "sbhd" else 1]
        heads = self.num_attention_heads_per_partition

        if "padding" in attn_mask_type and q_padding is None:
            q_padding, kv_padding = self._padding(attention_mask, cu_seqlens_q, cu_seqlens_kv, batch, sq, skv, device)
        arbitrary_mask = None
        if attn_mask_type == "arbitrary":
            arbitrary_mask = self._arbitrary_mask(attention_mask, batch, heads, sq, skv, device)
        elif attention_mask is not None and "padding" not in attn_mask_type:
            warnings.warn(f"{_OWNER}: attention_mask is ignored for attn_mask_type={attn_mask_type!r}", stacklevel=2)

        bias = self._bias(core_attention_bias_type, core_attention_bias, alibi_slopes, batch, heads, sq, skv, device)
        slopes = None
        if core_attention_bias_type == "alibi":
            slopes = self._alibi_slopes(alibi_slopes, batch, heads, device)

        params = AttentionParams(
            qkv_dtype=query_layer.dtype, device_type=device.type,
            compute_capability=_compute_capability(device.index if device.index is not None
                                                   else torch.cuda.current_device()) if device.type == "cuda"
            else (0, 0),
            qkv_format=qkv_format, batch_size=batch, num_heads=heads, num_gqa_groups=self.num_gqa_groups_per_partition,
            max_seqlen_q=sq, max_seqlen_kv=skv, head_dim_qk=self.hidden_size_per_attention_head_k,
            head_dim_v=self.hidden_size_per_attention_head_v, attn_mask_type=attn_mask_type, window_size=window_size,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias_shape=None if core_attention_bias is None else tuple(core_attention_bias.shape),
            core_attention_bias_requires_grad=bool(core_attention_bias is not None
                                                   and core_attention_bias.requires_grad),
            alibi_slopes_shape=None if alibi_slopes is None else tuple(alibi_slopes.shape),
            attention_dropout=self.attention_dropout, context_parallel=False, deterministic=self.deterministic,
            is_training=self.training, fp8_dpa=self._fp8_dpa(), inference=inference_params is not None,
            softmax_type=self.softmax_type, return_max_logit=self.return_max_logit,
            shared_seqlens=attn_mask_type == "padding_causal" and shared_seqlens)
        backend = get_attention_backend(params)
        if backend.name is None:
            raise ValueError(no_backend_message(backend))

        flash_takes_thd = backend.name == FLASH and packed is not None and thd_without_gaps
        if packed is not None and not flash_takes_thd:
            query_layer = thd_to_padded_bshd(packed[0], cu_seqlens_q, cu_seqlens_q_padded, max_seqlen_q)
            key_layer = thd_to_padded_bshd(packed[1], cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv)
            value_layer = thd_to_padded_bshd(packed[2], cu_seqlens_kv, cu_seqlens_kv_padded, max_seqlen_kv)
            q_format = kv_format = "bshd"

        output = max_logit = None
        if backend.name == FLASH:
            padded = "padding" in attn_mask_type and not flash_takes_thd
            args = (query_layer, key_layer, value_layer, slopes, q_padding if padded else None,
                    kv_padding if padded else None, cu_seqlens_q if flash_takes_thd else None,
                    cu_seqlens_kv if flash_takes_thd else None)
            output = self._run(self.flash_attention, args, dict(
                attn_mask_type=attn_mask_type, window_size=window_size, q_format=q_format, kv_format=kv_format,
                max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv), checkpoint_core_attention)
        elif backend.name == FUSED:
            output = self._fused(query_layer, key_layer, value_layer, bias, q_padding, kv_padding, attn_mask_type,
                                 window_size, q_format, kv_format, checkpoint_core_attention)
        if output is None:
            if slopes is not None:
                bias = alibi_bias(slopes, attn_mask_type, sq, skv, q_padding, kv_padding)
            output, max_logit = self._unfused(query_layer, key_layer, value_layer, bias, q_padding, kv_padding,
                                              arbitrary_mask, attn_mask_type, window_size, core_attention_bias_type,
                                              q_format, kv_format, checkpoint_core_attention)
        if packed is not None and not flash_takes_thd:
            output = padded_bshd_to_thd(output, cu_seqlens_q, cu_seqlens_q_padded, thd_tokens_q)
        if self.return_max_logit:
            return output, max_logit
        return output

    def _run(self, backend: torch.nn.Module, args: tuple, kwargs: dict, checkpoint_core_attention: bool):
        """backend(*args, **kwargs), recomputed in the backward pass with checkpoint_core_attention."""
        if checkpoint_core_attention:
            return checkpoint(backend, *args, distribute_saved_activations=False,
                              get_rng_state_tracker=self.get_rng_state_tracker, tp_group=self.tp_group, **kwargs)
        return backend(*args, **kwargs)

    def _fused(self, query_layer, key_layer, value_layer, bias, q_padding, kv_padding, attn_mask_type: str,
               window_size, q_format: str, kv_format: str, checkpoint_core_attention: bool) -> Optional[torch.Tensor]:
        """The cuDNN backend's output in q_format ([.., h * dv]), or None when cuDNN refuses
        the call (then the unfused backend runs it; the reason is logged, and warned once)."""
        args = (query_layer, key_layer, value_layer, bias, q_padding, kv_padding)
        kwargs = dict(attn_mask_type=attn_mask_type, window_size=window_size, q_format=q_format, kv_format=kv_format)
        try:
            return self._run(self.fused_attention, args, kwargs, checkpoint_core_attention)
        except FusedAttentionUnsupported as error:
            _fused_fallback(str(error))
            return None

    def _unfused(self, query_layer, key_layer, value_layer, bias, q_padding, kv_padding, arbitrary_mask,
                 attn_mask_type: str, window_size, core_attention_bias_type: str, q_format: str, kv_format: str,
                 checkpoint_core_attention: bool):
        """The unfused backend's (output in q_format [.., h * dv], max_logit or None)."""
        sq = query_layer.shape[0 if q_format == "sbhd" else 1]
        skv = key_layer.shape[0 if kv_format == "sbhd" else 1]
        device, heads = query_layer.device, self.num_attention_heads_per_partition
        plan = plan_attention_mask(attn_mask_type, window_size, sq, skv, device, q_padding, kv_padding,
                                   arbitrary_mask)
        sink = None
        if self.softmax_offset is not None:
            sink = self.softmax_offset.to(device=device, dtype=torch.float32).view(1, heads, 1, 1)
        bias_type = "pre_scale_bias" if core_attention_bias_type == "pre_scale_bias" else "post_scale_bias"
        args = (query_layer, key_layer, value_layer, plan.mask, bias, sink)
        kwargs = dict(mask_kind=plan.kind, bias_type=bias_type, q_format=q_format, kv_format=kv_format)
        context, max_logit = self._run(self.unfused_attention, args, kwargs, checkpoint_core_attention)
        return from_bhsd(context, q_format), max_logit

    def _padding(self, attention_mask, cu_seqlens_q, cu_seqlens_kv, batch: int, sq: int, skv: int, device):
        """The padding of a bshd / sbhd call, from attention_mask or cu_seqlens."""
        if attention_mask is not None:
            if isinstance(attention_mask, (tuple, list)):
                if len(attention_mask) != 2:
                    raise ValueError(f"{_OWNER}: a padding attention_mask pair must hold 2 tensors (q, kv), got "
                                     f"{len(attention_mask)}")
                q_mask, kv_mask = attention_mask
                return (_padding_from_mask(q_mask, "attention_mask[0]", batch, sq, device),
                        _padding_from_mask(kv_mask, "attention_mask[1]", batch, skv, device))
            if sq != skv:
                raise ValueError(f"{_OWNER}: a single padding attention_mask [b, 1, 1, s] needs sq == skv (self "
                                 f"attention), got sq={sq}, skv={skv}; pass a (q_mask, kv_mask) pair")
            padding = _padding_from_mask(attention_mask, "attention_mask", batch, sq, device)
            return padding, padding
        if cu_seqlens_q is None or cu_seqlens_kv is None:
            raise ValueError(f"{_OWNER}: padding mask types need attention_mask or cu_seqlens_q and cu_seqlens_kv")
        cu_seqlens_q = _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", batch)
        cu_seqlens_kv = _check_cu_seqlens(cu_seqlens_kv, "cu_seqlens_kv", batch)
        return (_padding_from_lengths(seqlens_from_cu_seqlens(cu_seqlens_q), sq, device),
                _padding_from_lengths(seqlens_from_cu_seqlens(cu_seqlens_kv), skv, device))

    @staticmethod
    def _arbitrary_mask(attention_mask, batch: int, heads: int, sq: int, skv: int, device) -> torch.Tensor:
        """attention_mask as [1|b, 1|h, 1|sq, 1|skv] bool."""
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"{_OWNER}: attn_mask_type='arbitrary' needs attention_mask as a bool tensor, got "
                            f"{type(attention_mask).__name__}")
        if attention_mask.dtype != torch.bool:
            raise TypeError(f"{_OWNER}: attention_mask must be bool (True = masked out), got {attention_mask.dtype}")
        full = (batch, heads, sq, skv)
        if attention_mask.dim() > 4 or any(m not in (1, f) for m, f in zip(attention_mask.shape[::-1], full[::-1])):
            raise ValueError(f"{_OWNER}: attention_mask of shape {tuple(attention_mask.shape)} does not broadcast to "
                             f"[b, h, sq, skv] = {list(full)}")
        mask = attention_mask.to(device)
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        return mask

    def _bias(self, bias_type: str, core_attention_bias, alibi_slopes, batch: int, heads: int, sq: int, skv: int,
              device) -> Optional[torch.Tensor]:
        """The additive bias of the scores given as a tensor (None for no_bias and alibi)."""
        if bias_type not in _BIAS_TYPES:
            raise ValueError(f"{_OWNER}: core_attention_bias_type must be one of {_BIAS_TYPES}, got {bias_type!r}")
        if alibi_slopes is not None and bias_type != "alibi":
            raise ValueError(f"{_OWNER}: alibi_slopes needs core_attention_bias_type='alibi', got {bias_type!r}")
        if bias_type in ("no_bias", "alibi") and core_attention_bias is not None:
            raise ValueError(f"{_OWNER}: core_attention_bias must be None for core_attention_bias_type={bias_type!r}")
        if bias_type in ("no_bias", "alibi"):
            return None
        if core_attention_bias is None:
            raise ValueError(f"{_OWNER}: core_attention_bias_type={bias_type!r} needs core_attention_bias")
        if not isinstance(core_attention_bias, torch.Tensor) or not core_attention_bias.is_floating_point():
            raise TypeError(f"{_OWNER}: core_attention_bias must be a float tensor")
        shape = tuple(core_attention_bias.shape)
        if (len(shape) != 4 or shape[0] not in (1, batch) or shape[1] not in (1, heads) or shape[2] not in (1, sq)
                or shape[3] != skv):
            raise ValueError(f"{_OWNER}: core_attention_bias must have shape [1 or {batch}, 1 or {heads}, 1 or {sq}, "
                             f"{skv}] (b, h, sq, skv), got {shape}")
        if core_attention_bias.device != device:
            raise ValueError(f"{_OWNER}: core_attention_bias is on {core_attention_bias.device} but query_layer is on "
                             f"{device}")
        return core_attention_bias

    @staticmethod
    def _alibi_slopes(alibi_slopes, batch: int, heads: int, device) -> torch.Tensor:
        """ALiBi's slopes, fp32 [h] or [b, h]: the given ones or the default series."""
        if alibi_slopes is None:
            return get_alibi_slopes(heads, device)
        if not isinstance(alibi_slopes, torch.Tensor) or not alibi_slopes.is_floating_point():
            raise TypeError(f"{_OWNER}: alibi_slopes must be a float tensor [h] or [b, h]")
        if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
            raise ValueError(f"{_OWNER}: alibi_slopes must have shape [{heads}] or [{batch}, {heads}], got "
                             f"{tuple(alibi_slopes.shape)}")
        return alibi_slopes.to(device=device, dtype=torch.float32)
