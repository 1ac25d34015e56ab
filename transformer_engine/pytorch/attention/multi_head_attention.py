"""MultiheadAttention: the QKV projection (with the input norm when asked), optional QK
normalization and rotary embedding, DotProductAttention, and the output projection, as
Transformer Engine 2.x's ``MultiheadAttention``.

Layout of the fused QKV projection's output features (Transformer Engine's): with
``np`` query heads in ``ng`` groups (GQA; ``ng == np`` is plain MHA) of ``hn`` channels,
and ``r = np / ng`` query heads per group,

* ``qkv_weight_interleaved=True`` (only with ``fuse_qkv_params=True``): group by group,
  ``[ng, r + 2, hn]``: the r query heads of group g, then its key head, then its value head;
* otherwise: all queries, then all keys, then all values, ``[r + 2, ng, hn]`` viewed as
  ``[np * hn | ng * hn | ng * hn]``; without ``fuse_qkv_params`` these three blocks are
  the separate parameters ``query_weight``, ``key_weight``, ``value_weight``.

Cross attention projects the queries from ``hidden_states`` and keys and values from
``encoder_output`` (``[ng, 2, hn]`` interleaved, else ``[2, ng, hn]``).
Query head ``g * r + j`` attends with key/value head ``g`` (DotProductAttention's GQA rule).
"""

from __future__ import annotations

import collections
from typing import Callable, List, Optional, Tuple, Union

import torch

from transformer_engine.pytorch.attention._qkv_split import split_along_dim
from transformer_engine.pytorch.attention.dot_product_attention import DotProductAttention
from transformer_engine.pytorch.attention.inference import InferenceParams
from transformer_engine.pytorch.attention.qk_norm import make_qk_norms
from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb
from transformer_engine.pytorch.module.layernorm_linear import LayerNormLinear
from transformer_engine.pytorch.module.linear import Linear

__all__ = ["MultiheadAttention"]

_OWNER = "MultiheadAttention"
_QKV_FORMATS = ("sbhd", "bshd", "thd")
_UB_FLAGS = ("ub_overlap_ag", "ub_overlap_rs", "ub_overlap_rs_dgrad", "ub_bulk_dgrad", "ub_bulk_wgrad")


def _positive_int(value, name: str, owner: str = _OWNER) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}: {name} must be a positive int, got {value!r}")
    return value


def _dropout_probability(value, name: str, owner: str = _OWNER) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{owner}: {name} must be a float in [0, 1), got {value!r}")
    return float(value)


class MultiheadAttention(torch.nn.Module):
    """Multi-head attention with its projections (see the module docstring for the QKV
    layouts). Parameters as Transformer Engine 2.x's ``MultiheadAttention``:

    ``hidden_size``, ``num_attention_heads``, ``kv_channels`` (head size, default
    hidden_size // num_attention_heads), ``attention_dropout`` (0.1), ``layernorm_epsilon``,
    ``init_method`` / ``output_layer_init_method`` (QKV / output projection weights,
    default normal(0, 0.023)), ``layer_number`` (the KV-cache key, default 1),
    ``attn_mask_type`` ("causal"), ``window_size``, ``num_gqa_groups``,
    ``return_bias`` (the output projection's bias is returned, not added),
    ``return_layernorm_output`` (with ``input_layernorm``), ``input_layernorm`` (norm the
    input inside the QKV projection: submodule ``layernorm_qkv`` / ``layernorm_query``
    instead of ``qkv`` / ``query_layer``), ``attention_type`` ("self" or "cross"),
    ``fuse_qkv_params`` (one QKV weight instead of query / key / value ones),
    ``qkv_weight_interleaved``, ``rotary_pos_interleaved``, ``zero_centered_gamma``,
    ``bias``, ``normalization`` ("LayerNorm", "RMSNorm"), ``device``, ``qkv_format``
    ("sbhd", "bshd", "thd"), ``name``, ``qk_norm_type`` (None, "L2Normalization",
    "RMSNorm", "LayerNorm"), ``qk_norm_eps``, ``qk_norm_before_rope``, ``softmax_type``
    ("vanilla", "off-by-one", "learnable"), and the parallelism / optimization options
    ``tp_group``, ``tp_size``, ``sequence_parallel``, ``set_parallel_mode``,
    ``get_rng_state_tracker``, ``fuse_wgrad_accumulation``, ``params_dtype``,
    ``seq_length``, ``micro_batch_size``.

    Tensor parallelism over more than one rank, context parallelism and userbuffers
    (``ub_*``) raise NotImplementedError.
    """

    def __init__(self, hidden_size: int, num_attention_heads: int, kv_channels: Optional[int] = None,
                 attention_dropout: float = 0.1, layernorm_epsilon: float = 1e-5,
                 init_method: Optional[Callable] = None, output_layer_init_method: Optional[Callable] = None,
                 layer_number: Optional[int] = None, attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, tp_group=None, tp_size: int = 1,
                 num_gqa_groups: Optional[int] = None, fuse_wgrad_accumulation: bool = False,
                 get_rng_state_tracker: Optional[Callable] = None, sequence_parallel: bool = False,
                 params_dtype: Optional[torch.dtype] = None, return_bias: bool = False,
                 return_layernorm_output: bool = False, input_layernorm: bool = False, attention_type: str = "self",
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False, zero_centered_gamma: bool = False,
                 qkv_weight_interleaved: bool = True, rotary_pos_interleaved: bool = False,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False, bias: bool = True,
                 normalization: str = "LayerNorm", device: Union[torch.device, str, None] = None,
                 qkv_format: str = "sbhd", name: Optional[str] = None, qk_norm_type: Optional[str] = None,
                 qk_norm_eps: float = 1e-6, qk_norm_before_rope: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, softmax_type: str = "vanilla"):
        super().__init__()
        ub_values = dict(zip(_UB_FLAGS, (ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad,
                                         ub_bulk_wgrad)))
        for flag, value in ub_values.items():
            if value:
                raise NotImplementedError(f"{_OWNER}: {flag}=True (userbuffers communication overlap) is not "
                                          "implemented in OpenTE yet")
        hidden_size = _positive_int(hidden_size, "hidden_size")
        num_attention_heads = _positive_int(num_attention_heads, "num_attention_heads")
        if kv_channels is None:
            if hidden_size < num_attention_heads:
                raise ValueError(f"{_OWNER}: hidden_size={hidden_size} is smaller than num_attention_heads="
                                 f"{num_attention_heads}; give kv_channels")
            kv_channels = hidden_size // num_attention_heads
        kv_channels = _positive_int(kv_channels, "kv_channels")
        num_gqa_groups = num_attention_heads if num_gqa_groups is None else _positive_int(num_gqa_groups,
                                                                                           "num_gqa_groups")
        if num_attention_heads % num_gqa_groups != 0:
            raise ValueError(f"{_OWNER}: num_attention_heads={num_attention_heads} must be divisible by "
                             f"num_gqa_groups={num_gqa_groups}")
        if attention_type not in ("self", "cross"):
            raise ValueError(f"{_OWNER}: attention_type must be 'self' or 'cross', got {attention_type!r}")
        if layer_number is not None:
            _positive_int(layer_number, "layer_number")
        if qkv_format not in _QKV_FORMATS:
            raise ValueError(f"{_OWNER}: qkv_format must be one of {_QKV_FORMATS}, got {qkv_format!r}")
        if isinstance(layernorm_epsilon, bool) or not isinstance(layernorm_epsilon, (int, float)) \
                or layernorm_epsilon < 0:
            raise ValueError(f"{_OWNER}: layernorm_epsilon must be a number >= 0, got {layernorm_epsilon!r}")
        attention_dropout = _dropout_probability(attention_dropout, "attention_dropout")

        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups
        self.hidden_size_per_attention_head = kv_channels
        self.hidden_size_q = kv_channels * num_attention_heads
        self.hidden_size_kv = kv_channels * num_gqa_groups
        self.tp_size = tp_size
        # Tensor parallelism is refused by the submodules for more than one rank, so a
        # partition holds all heads.
        self.num_attention_heads_per_partition = num_attention_heads
        self.num_gqa_groups_per_partition = num_gqa_groups
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.layer_number = 1 if layer_number is None else layer_number
        self.input_layernorm = bool(input_layernorm)
        self.attention_type = attention_type
        self.get_rng_state_tracker = get_rng_state_tracker
        self.tp_group = tp_group
        self.return_layernorm_output = bool(return_layernorm_output)
        self.return_bias = bool(return_bias)
        self.params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.fuse_qkv_params = bool(fuse_qkv_params)
        # Separate q / k / v parameters are concatenated, never interleaved.
        self.qkv_weight_interleaved = bool(qkv_weight_interleaved) and self.fuse_qkv_params
        self.rotary_pos_interleaved = bool(rotary_pos_interleaved)
        self.qk_norm_type = qk_norm_type
        self.qk_norm_before_rope = bool(qk_norm_before_rope)
        self.softmax_type = softmax_type
        self.sequence_parallel = bool(sequence_parallel)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        self.name = name
        self.cp_size, self.cp_rank = 1, 0

        linear_kwargs = dict(fuse_wgrad_accumulation=fuse_wgrad_accumulation, tp_group=tp_group, tp_size=tp_size,
                             get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel,
                             params_dtype=self.params_dtype, device=device, init_method=init_method, bias=bias,
                             return_bias=False, parallel_mode="column" if set_parallel_mode else None)
        norm_kwargs = dict(eps=layernorm_epsilon, return_layernorm_output=self.return_layernorm_output,
                           zero_centered_gamma=zero_centered_gamma, normalization=normalization)

        def child_name(suffix: str) -> Optional[str]:
            return None if name is None else f"{name}.{suffix}"

        self.q_norm, self.k_norm = make_qk_norms(qk_norm_type, kv_channels, qk_norm_eps, self.params_dtype, device,
                                                 seq_length, micro_batch_size)

        if attention_type == "self":
            split = None
            if not self.fuse_qkv_params:
                split = collections.OrderedDict(
                    [("query", self.hidden_size_q), ("key", self.hidden_size_kv), ("value", self.hidden_size_kv)])
            qkv_features = self.hidden_size_q + 2 * self.hidden_size_kv
            if self.input_layernorm:
                self.layernorm_qkv = LayerNormLinear(hidden_size, qkv_features, parameters_split=split,
                                                     name=child_name("layernorm_linear_qkv"), **norm_kwargs,
                                                     **linear_kwargs)
            else:
                self.qkv = Linear(hidden_size, qkv_features, parameters_split=split,
                                  name=child_name("linear_qkv"), **linear_kwargs)
        else:
            if self.input_layernorm:
                self.layernorm_query = LayerNormLinear(
                    hidden_size, self.hidden_size_q, parameters_split=None if self.fuse_qkv_params else ("query",),
                    name=child_name("layernorm_linear_q"), **norm_kwargs, **linear_kwargs)
            else:
                self.query_layer = Linear(hidden_size, self.hidden_size_q, name=child_name("linear_q"),
                                          **linear_kwargs)
            self.key_value = Linear(hidden_size, 2 * self.hidden_size_kv,
                                    parameters_split=None if self.fuse_qkv_params else ("key", "value"),
                                    name=child_name("linear_kv"), **linear_kwargs)

        self.core_attention = DotProductAttention(
            num_attention_heads, kv_channels, num_gqa_groups=num_gqa_groups, attention_dropout=attention_dropout,
            qkv_format=qkv_format, attn_mask_type=attn_mask_type, window_size=window_size, tp_size=tp_size,
            get_rng_state_tracker=get_rng_state_tracker, sequence_parallel=sequence_parallel, tp_group=tp_group,
            layer_number=self.layer_number, attention_type=attention_type, softmax_type=softmax_type,
            name=child_name("core_attention"))
        if device is not None and softmax_type == "learnable":
            # DotProductAttention has no device argument and makes its sink on the default device.
            self.core_attention.to(device)

        proj_kwargs = dict(linear_kwargs, init_method=output_layer_init_method, return_bias=self.return_bias,
                           parallel_mode="row" if set_parallel_mode else None)
        self.proj = Linear(self.hidden_size_q, hidden_size, name=child_name("proj"), **proj_kwargs)

    # ---- parallel groups: passed on to the submodules ----
    def set_tensor_parallel_group(self, tp_group) -> None:
        """Sets the tensor-parallel group of every submodule (more than one rank raises
        NotImplementedError until OpenTE implements tensor parallelism)."""
        for module in self.modules():
            if module is not self and hasattr(module, "set_tensor_parallel_group"):
                module.set_tensor_parallel_group(tp_group)
        self.tp_group = tp_group

    def set_context_parallel_group(self, cp_group, cp_global_ranks: List[int], cp_stream,
                                   cp_comm_type: str = "p2p") -> None:
        """Sets the context-parallel attributes of the attention (more than one rank raises
        NotImplementedError until OpenTE implements context parallelism)."""
        for module in self.modules():
            if module is not self and hasattr(module, "set_context_parallel_group"):
                module.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    # ---- forward ----
    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """[..., heads * hn] (or [..., heads, hn] or a strided view of it) as [..., heads, hn]."""
        return x.reshape(*x.shape[:-1], heads, self.hidden_size_per_attention_head)

    def _self_qkv(self, hidden_states: torch.Tensor, is_first_microbatch: Optional[bool]):
        layernorm_output = None
        if self.input_layernorm:
            result = self.layernorm_qkv(hidden_states, is_first_microbatch=is_first_microbatch)
            mixed, layernorm_output = result if self.return_layernorm_output else (result, None)
        else:
            mixed = self.qkv(hidden_states, is_first_microbatch=is_first_microbatch)
        groups, hn = self.num_gqa_groups_per_partition, self.hidden_size_per_attention_head
        per_group = self.num_attention_heads_per_partition // groups
        lead = mixed.shape[:-1]
        if self.qkv_weight_interleaved:
            mixed = mixed.view(*lead, groups, per_group + 2, hn)
            split_dim = -2
        else:
            mixed = mixed.view(*lead, per_group + 2, groups, hn)
            split_dim = -3
        # One split node, whose backward takes the three gradients whole where the cuDNN
        # attention wrote them into one buffer of mixed's layout (_qkv_split.py), else
        # concatenates them (no zero-filled copies either way).
        query, key, value = split_along_dim(mixed, [per_group, 1, 1], split_dim)
        query = query.reshape(*lead, self.num_attention_heads_per_partition, hn)
        key, value = (t.reshape(*lead, groups, hn) for t in (key, value))
        return query, key, value, layernorm_output

    def _cross_qkv(self, hidden_states: torch.Tensor, encoder_output: Optional[torch.Tensor],
                   is_first_microbatch: Optional[bool]):
        if encoder_output is None:
            raise ValueError(f"{_OWNER}: attention_type='cross' needs encoder_output (the keys' and values' input)")
        mixed_kv = self.key_value(encoder_output, is_first_microbatch=is_first_microbatch)
        groups, hn = self.num_gqa_groups_per_partition, self.hidden_size_per_attention_head
        lead = mixed_kv.shape[:-1]
        if self.qkv_weight_interleaved:
            key, value = torch.split(mixed_kv.view(*lead, groups, 2 * hn), hn, dim=-1)
        else:
            key, value = torch.split(mixed_kv.view(*lead, 2 * groups, hn), groups, dim=-2)
        layernorm_output = None
        if self.input_layernorm:
            result = self.layernorm_query(hidden_states, is_first_microbatch=is_first_microbatch)
            query, layernorm_output = result if self.return_layernorm_output else (result, None)
        else:
            query = self.query_layer(hidden_states, is_first_microbatch=is_first_microbatch)
        return self._split_heads(query, self.num_attention_heads_per_partition), key, value, layernorm_output

    def _rope_start_positions(self, inference_params: Optional[InferenceParams], query: torch.Tensor):
        """Where each sequence's step starts in the KV cache: the cached lengths announced by
        pre_step (Transformer Engine 2.x), else sequence_len_offset for every row (1.x)."""
        if inference_params is None:
            return None
        if inference_params.sequences_pre_step:
            return inference_params.get_seqlens_pre_step().to(query.device)
        batch = query.shape[1 if self.qkv_format == "sbhd" else 0]
        return torch.full((batch,), int(inference_params.sequence_len_offset), dtype=torch.int32,
                          device=query.device)

    def _apply_rope(self, query, key, rotary_pos_emb, inference_params, cu_seqlens_q, cu_seqlens_kv,
                    cu_seqlens_q_padded, cu_seqlens_kv_padded, pad_between_seqs):
        if not isinstance(rotary_pos_emb, (tuple, list)):
            rotary_pos_emb = (rotary_pos_emb, rotary_pos_emb)
        if len(rotary_pos_emb) != 2 or not all(isinstance(t, torch.Tensor) for t in rotary_pos_emb):
            raise TypeError(f"{_OWNER}: rotary_pos_emb must be a tensor or a (q_freqs, k_freqs) pair of tensors")
        q_freqs, k_freqs = (t.to(query.device) for t in rotary_pos_emb)
        start_positions = self._rope_start_positions(inference_params, query)
        if pad_between_seqs:
            cu_seqlens_q, cu_seqlens_kv = cu_seqlens_q_padded, cu_seqlens_kv_padded
        thd = self.qkv_format == "thd"
        if thd and (cu_seqlens_q is None or cu_seqlens_kv is None):
            raise ValueError(f"{_OWNER}: rotary_pos_emb with qkv_format='thd' needs cu_seqlens_q and cu_seqlens_kv")
        common = dict(tensor_format=self.qkv_format, fused=True, start_positions=start_positions,
                      interleaved=self.rotary_pos_interleaved, cp_size=self.cp_size, cp_rank=self.cp_rank)
        query = apply_rotary_pos_emb(query, q_freqs, cu_seqlens=cu_seqlens_q.to(query.device) if thd else None,
                                     **common)
        key = apply_rotary_pos_emb(key, k_freqs, cu_seqlens=cu_seqlens_kv.to(key.device) if thd else None, **common)
        return query, key

    def forward(self, hidden_states: torch.Tensor,
                attention_mask: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
                encoder_output: Optional[torch.Tensor] = None, attn_mask_type: Optional[str] = None,
                window_size: Optional[Tuple[int, int]] = None, is_first_microbatch: Optional[bool] = None,
                checkpoint_core_attention: bool = False, inference_params: Optional[InferenceParams] = None,
                rotary_pos_emb: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Optional[torch.Tensor] = None,
                alibi_slopes: Optional[torch.Tensor] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
                cu_seqlens_kv: Optional[torch.Tensor] = None, cu_seqlens_q_padded: Optional[torch.Tensor] = None,
                cu_seqlens_kv_padded: Optional[torch.Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None, fast_zero_fill: bool = True,
                pad_between_seqs: Optional[bool] = None):
        """Attention of ``hidden_states`` ([s, b, hidden] for sbhd, [b, s, hidden] for bshd,
        [t, hidden] for thd) over itself, or over ``encoder_output`` for cross attention.

        Returns the output [.., hidden_size], followed by the output projection's bias when
        ``return_bias`` and by the norm's output when ``input_layernorm`` and
        ``return_layernorm_output`` (a tuple when there is more than the output).
        ``rotary_pos_emb``: angles [s, 1, 1, d2] (as RotaryPositionEmbedding returns) for
        queries and keys, or a (q_freqs, k_freqs) pair; with ``inference_params`` they cover
        the whole sequence and each step's tokens take their cached positions. The other
        arguments go to DotProductAttention.
        """
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError(f"{_OWNER}: hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
        want_dims = 2 if self.qkv_format == "thd" else 3
        if hidden_states.dim() != want_dims:
            layout = {"sbhd": "[s, b, hidden]", "bshd": "[b, s, hidden]", "thd": "[t, hidden]"}[self.qkv_format]
            raise ValueError(f"{_OWNER}: hidden_states must be {want_dims}-D {layout} for qkv_format="
                             f"{self.qkv_format!r}, got shape {tuple(hidden_states.shape)}")
        attn_mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        window_size = self.window_size if window_size is None else window_size

        if self.attention_type == "self":
            query, key, value, layernorm_output = self._self_qkv(hidden_states, is_first_microbatch)
        else:
            query, key, value, layernorm_output = self._cross_qkv(hidden_states, encoder_output,
                                                                  is_first_microbatch)

        if self.q_norm is not None and self.qk_norm_before_rope:
            query, key = self.q_norm(query), self.k_norm(key)
        if rotary_pos_emb is not None:
            query, key = self._apply_rope(query, key, rotary_pos_emb, inference_params, cu_seqlens_q, cu_seqlens_kv,
                                          cu_seqlens_q_padded, cu_seqlens_kv_padded, pad_between_seqs)
        if self.q_norm is not None and not self.qk_norm_before_rope:
            query, key = self.q_norm(query), self.k_norm(key)

        context = self.core_attention(
            query, key, value, attention_mask=attention_mask, qkv_format=self.qkv_format, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
            attn_mask_type=attn_mask_type, window_size=window_size,
            checkpoint_core_attention=checkpoint_core_attention, core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes, fast_zero_fill=fast_zero_fill,
            inference_params=inference_params, pad_between_seqs=pad_between_seqs)

        projection = self.proj(context, is_first_microbatch=is_first_microbatch)
        outputs = list(projection) if self.return_bias else [projection]
        if self.input_layernorm and self.return_layernorm_output:
            outputs.append(layernorm_output)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}, "
                f"num_gqa_groups={self.num_gqa_groups}, kv_channels={self.hidden_size_per_attention_head}, "
                f"attention_type={self.attention_type!r}, qkv_format={self.qkv_format!r}")
