"""TransformerLayer: self attention (+ cross attention in a decoder) and an MLP, each added
to the residual stream through bias + dropout + add, as Transformer Engine 2.x's
``TransformerLayer``.

Submodules (Transformer Engine's names, so state dicts carry over): ``self_attention``
(MultiheadAttention; its input norm is fused into ``layernorm_qkv`` unless
``output_layernorm``), ``inter_attention`` (decoder: cross attention over the encoder's
output), ``layernorm_mlp`` (LayerNormMLP) and ``layernorm`` (with ``output_layernorm``).

Per block, with ``x`` the block's input:

* default (pre-norm): ``x + dropout(block(norm(x)) + bias)``;
* ``apply_residual_connection_post_layernorm``: ``norm(x) + dropout(block(norm(x)) + bias)``;
* ``parallel_attention_mlp`` (Falcon): ``x + dropout(attention(norm1(x)) + mlp(norm2(x)))``;
* ``output_layernorm`` (post-norm, BERT): no norm before the attention's QKV projection, and
  the layer's output normalized at the end;

``drop_path_rate`` > 0 (stochastic depth) zeroes the attention and MLP branches of whole
samples with that probability during training and scales the kept ones by 1 / (1 - rate).

The blocks' output projections add their biases in the GEMM's epilogue (the bias gradient
then comes with the output gradient's cast), rather than returning them for a separate
broadcast add whose backward is a sum over the tokens: the two passes cost 4% of an FP8
layer step at hidden 2048 on an H100. (Transformer Engine returns them to add after the
tensor-parallel reduction of a row-parallel projection; OpenTE runs one rank until it has
tensor parallelism, and a bias added there must move after the reduction then.)
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from transformer_engine.pytorch.attention.inference import InferenceParams
from transformer_engine.pytorch.attention.multi_head_attention import (
    MultiheadAttention,
    _dropout_probability,
    _positive_int,
)
from transformer_engine.pytorch.module.layernorm import LayerNorm, RMSNorm
from transformer_engine.pytorch.module.layernorm_mlp import LayerNormMLP

__all__ = ["TransformerLayer", "DropPath"]

_OWNER = "TransformerLayer"
_LAYER_TYPES = ("encoder", "decoder")
_INPUT_FORMATS = ("sbhd", "bshd", "thd")


class DropPath(torch.nn.Module):
    """Stochastic depth: during training each sample's branch output is zeroed with
    probability ``drop_prob`` and the kept ones are scaled by ``1 / (1 - drop_prob)``.
    ``batch_dim`` is the samples' dim of the branch output (1 for sbhd, 0 for bshd; for
    thd, where samples are packed, each token is a sample)."""

    def __init__(self, drop_prob: float = 0.0, batch_dim: int = 0):
        super().__init__()
        self.drop_prob = float(drop_prob)
        self.batch_dim = batch_dim

    def forward(self, hidden_state: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return hidden_state
        keep_prob = 1.0 - self.drop_prob
        shape = [1] * hidden_state.dim()
        shape[self.batch_dim] = hidden_state.shape[self.batch_dim]
        keep = torch.rand(shape, dtype=torch.float32, device=hidden_state.device) < keep_prob
        return hidden_state * (keep.to(hidden_state.dtype) / keep_prob)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}, batch_dim={self.batch_dim}"


class TransformerLayer(torch.nn.Module):
    """A transformer block: attention and MLP (see the module docstring for the
    architectures). Parameters as Transformer Engine 2.x's ``TransformerLayer``:

    ``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``, ``num_gqa_groups``,
    ``layernorm_epsilon``, ``hidden_dropout`` (0.1, after each block), ``attention_dropout``
    (0.1), ``init_method`` / ``output_layer_init_method``, ``layer_number`` (the KV-cache
    key), ``kv_channels``, ``self_attn_mask_type`` ("causal"), ``window_size``,
    ``enc_dec_attn_mask_type`` ("no_mask"), ``enc_dec_window_size``, ``params_dtype``,
    ``get_rng_state_tracker`` (attention dropout runs in its fork), ``seq_length``,
    ``micro_batch_size``, ``apply_residual_connection_post_layernorm``,
    ``output_layernorm``, ``parallel_attention_mlp``, ``layer_type`` ("encoder",
    "decoder"), ``drop_path_rate``, ``fuse_qkv_params``, ``zero_centered_gamma``,
    ``qkv_weight_interleaved``, ``rotary_pos_interleaved``, ``bias``, ``activation``
    ("gelu" and the other LayerNormMLP activations), ``activation_params``,
    ``normalization`` ("LayerNorm", "RMSNorm"), ``device``, ``attn_input_format`` ("sbhd",
    "bshd", "thd"), ``name``, ``qk_norm_type``, ``qk_norm_eps``, ``qk_norm_before_rope``,
    ``softmax_type``, and ``tp_group``, ``tp_size``, ``sequence_parallel``,
    ``set_parallel_mode``, ``fuse_wgrad_accumulation`` (each weight, split ones too, needs ``main_grad``).

    The userbuffers options take effect only with ``ub_tp_comm_overlap=True`` (as in
    Transformer Engine), which raises NotImplementedError; so do tensor parallelism over
    more than one rank and the options LayerNormMLP does not implement yet.
    """

    def __init__(self, hidden_size: int, ffn_hidden_size: int, num_attention_heads: int,
                 num_gqa_groups: Optional[int] = None, layernorm_epsilon: float = 1e-5, hidden_dropout: float = 0.1,
                 attention_dropout: float = 0.1, init_method: Optional[Callable] = None,
                 output_layer_init_method: Optional[Callable] = None, layer_number: Optional[int] = None,
                 kv_channels: Optional[int] = None, self_attn_mask_type: str = "causal",
                 window_size: Optional[Tuple[int, int]] = None, enc_dec_attn_mask_type: str = "no_mask",
                 enc_dec_window_size: Optional[Tuple[int, int]] = None, tp_group=None, tp_size: int = 1,
                 params_dtype: Optional[torch.dtype] = None, get_rng_state_tracker: Optional[Callable] = None,
                 fuse_wgrad_accumulation: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, sequence_parallel: bool = False,
                 apply_residual_connection_post_layernorm: bool = False, output_layernorm: bool = False,
                 parallel_attention_mlp: bool = False, layer_type: str = "encoder", drop_path_rate: float = 0.0,
                 set_parallel_mode: bool = False, fuse_qkv_params: bool = False, zero_centered_gamma: bool = False,
                 qkv_weight_interleaved: bool = True, ub_tp_comm_overlap: bool = False, ub_overlap_ag: bool = True,
                 ub_overlap_rs: bool = True, ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = True,
                 ub_bulk_wgrad: bool = True, bias: bool = True, activation: str = "gelu",
                 activation_params: Optional[dict] = None, normalization: str = "LayerNorm",
                 device: Union[torch.device, str, None] = None, attn_input_format: str = "sbhd",
                 name: Optional[str] = None, qk_norm_type: Optional[str] = None, qk_norm_eps: float = 1e-6,
                 qk_norm_before_rope: bool = False, rotary_pos_interleaved: bool = False,
                 softmax_type: str = "vanilla"):
        super().__init__()
        if ub_tp_comm_overlap:
            raise NotImplementedError(f"{_OWNER}: ub_tp_comm_overlap=True (userbuffers communication overlap) is "
                                      "not implemented in OpenTE yet")
        # As in Transformer Engine, the individual ub_* switches only count with ub_tp_comm_overlap.
        del ub_overlap_ag, ub_overlap_rs, ub_overlap_rs_dgrad, ub_bulk_dgrad, ub_bulk_wgrad
        hidden_size = _positive_int(hidden_size, "hidden_size", _OWNER)
        _positive_int(ffn_hidden_size, "ffn_hidden_size", _OWNER)
        num_attention_heads = _positive_int(num_attention_heads, "num_attention_heads", _OWNER)
        if layer_type not in _LAYER_TYPES:
            raise ValueError(f"{_OWNER}: layer_type must be 'encoder' or 'decoder', got {layer_type!r}")
        if attn_input_format not in _INPUT_FORMATS:
            raise ValueError(f"{_OWNER}: attn_input_format must be one of {_INPUT_FORMATS}, got "
                             f"{attn_input_format!r}")
        if parallel_attention_mlp:
            if layer_type != "encoder":
                raise ValueError(f"{_OWNER}: parallel_attention_mlp=True needs layer_type='encoder'")
            if apply_residual_connection_post_layernorm:
                raise ValueError(f"{_OWNER}: parallel_attention_mlp and apply_residual_connection_post_layernorm "
                                 "cannot be combined")
            if output_layernorm:
                raise ValueError(f"{_OWNER}: parallel_attention_mlp and output_layernorm cannot be combined")
        self.hidden_dropout = _dropout_probability(hidden_dropout, "hidden_dropout", _OWNER)
        drop_path_rate = _dropout_probability(drop_path_rate, "drop_path_rate", _OWNER)

        self.hidden_size = hidden_size
        self.self_attn_mask_type = self_attn_mask_type
        self.window_size = window_size
        self.enc_dec_attn_mask_type = enc_dec_attn_mask_type
        self.enc_dec_window_size = enc_dec_window_size
        self.layer_number = layer_number
        self.layer_type = layer_type
        self.output_layernorm = bool(output_layernorm)
        self.apply_residual_connection_post_layernorm = bool(apply_residual_connection_post_layernorm)
        self.parallel_attention_mlp = bool(parallel_attention_mlp)
        self.kv_channels = kv_channels if kv_channels else hidden_size // num_attention_heads
        self.attn_input_format = attn_input_format
        self.get_rng_state_tracker = get_rng_state_tracker
        self.tp_size = tp_size
        self.sequence_parallel = bool(sequence_parallel)
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        self.name = name
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype

        def child_name(suffix: str) -> Optional[str]:
            return None if name is None else f"{name}.{suffix}"

        attention_kwargs = dict(
            kv_channels=self.kv_channels, attention_dropout=attention_dropout, layernorm_epsilon=layernorm_epsilon,
            init_method=init_method, output_layer_init_method=output_layer_init_method, layer_number=layer_number,
            tp_group=tp_group, tp_size=tp_size, num_gqa_groups=num_gqa_groups,
            fuse_wgrad_accumulation=fuse_wgrad_accumulation, get_rng_state_tracker=get_rng_state_tracker,
            sequence_parallel=sequence_parallel, params_dtype=params_dtype,
            return_layernorm_output=self.apply_residual_connection_post_layernorm,
            set_parallel_mode=set_parallel_mode, fuse_qkv_params=fuse_qkv_params,
            zero_centered_gamma=zero_centered_gamma, qkv_weight_interleaved=qkv_weight_interleaved,
            rotary_pos_interleaved=rotary_pos_interleaved, bias=bias, normalization=normalization, device=device,
            qkv_format=attn_input_format, qk_norm_type=qk_norm_type, qk_norm_eps=qk_norm_eps,
            qk_norm_before_rope=qk_norm_before_rope, seq_length=seq_length, micro_batch_size=micro_batch_size,
            softmax_type=softmax_type)

        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, attn_mask_type=self_attn_mask_type, window_size=window_size,
            input_layernorm=not self.output_layernorm, attention_type="self",
            return_bias=False, name=child_name("self_attention"), **attention_kwargs)
        if layer_type == "decoder":
            self.inter_attention = MultiheadAttention(
                hidden_size, num_attention_heads, attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size, input_layernorm=True, attention_type="cross", return_bias=False,
                name=child_name("inter_attention"), **attention_kwargs)

        self.layernorm_mlp = LayerNormMLP(
            hidden_size, ffn_hidden_size, eps=layernorm_epsilon, fuse_wgrad_accumulation=fuse_wgrad_accumulation,
            tp_group=tp_group, tp_size=tp_size, get_rng_state_tracker=get_rng_state_tracker, init_method=init_method,
            output_layer_init_method=output_layer_init_method, bias=bias,
            return_bias=False, sequence_parallel=sequence_parallel,
            params_dtype=params_dtype, return_layernorm_output=self.apply_residual_connection_post_layernorm,
            seq_length=seq_length, micro_batch_size=micro_batch_size, set_parallel_mode=set_parallel_mode,
            zero_centered_gamma=zero_centered_gamma, activation=activation, activation_params=activation_params,
            normalization=normalization, device=device, name=child_name("layernorm_mlp"))

        batch_dim = 1 if attn_input_format == "sbhd" else 0
        self.drop_path = DropPath(drop_path_rate, batch_dim) if drop_path_rate > 0.0 else None

        if self.output_layernorm:
            norm_cls = LayerNorm if normalization == "LayerNorm" else RMSNorm
            self.layernorm = norm_cls(hidden_size, eps=layernorm_epsilon, sequence_parallel=sequence_parallel,
                                      params_dtype=params_dtype, zero_centered_gamma=zero_centered_gamma,
                                      device=device)

    # ---- parallel groups: passed on to the submodules ----
    def set_tensor_parallel_group(self, tp_group) -> None:
        """Sets the tensor-parallel group of every submodule (more than one rank raises
        NotImplementedError until OpenTE implements tensor parallelism)."""
        for module in self.modules():
            if module is not self and hasattr(module, "set_tensor_parallel_group"):
                module.set_tensor_parallel_group(tp_group)

    def set_context_parallel_group(self, cp_group, cp_global_ranks: List[int], cp_stream,
                                   cp_comm_type: str = "p2p") -> None:
        """Sets the context-parallel attributes of the attention submodules (more than one
        rank raises NotImplementedError until OpenTE implements context parallelism)."""
        for module in self.modules():
            if isinstance(module, MultiheadAttention):
                module.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream, cp_comm_type)

    # ---- forward ----
    def _bias_dropout_add(self, hidden_state: torch.Tensor, bias: Optional[torch.Tensor], residual: torch.Tensor,
                          drop_path: Optional[DropPath] = None) -> torch.Tensor:
        """residual + drop_path(dropout(hidden_state + bias))."""
        if bias is not None and bias.numel() != 0:
            hidden_state = hidden_state + bias
        out = F.dropout(hidden_state, p=self.hidden_dropout, training=self.training)
        if drop_path is not None:
            out = drop_path(out)
        return residual + out

    def forward(self, hidden_states: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                self_attn_mask_type: Optional[str] = None, window_size: Optional[Tuple[int, int]] = None,
                encoder_output: Optional[torch.Tensor] = None,
                enc_dec_attn_mask: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
                enc_dec_attn_mask_type: Optional[str] = None, enc_dec_window_size: Optional[Tuple[int, int]] = None,
                is_first_microbatch: Optional[bool] = None, checkpoint_core_attention: bool = False,
                inference_params: Optional[InferenceParams] = None,
                rotary_pos_emb: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
                core_attention_bias_type: str = "no_bias", core_attention_bias: Optional[torch.Tensor] = None,
                alibi_slopes: Optional[torch.Tensor] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
                cu_seqlens_kv: Optional[torch.Tensor] = None, cu_seqlens_q_padded: Optional[torch.Tensor] = None,
                cu_seqlens_kv_padded: Optional[torch.Tensor] = None, max_seqlen_q: Optional[int] = None,
                max_seqlen_kv: Optional[int] = None, fast_zero_fill: bool = True,
                pad_between_seqs: Optional[bool] = None) -> torch.Tensor:
        """The layer on ``hidden_states`` ([s, b, hidden] for sbhd, [b, s, hidden] for bshd,
        [t, hidden] for thd); returns a tensor of the same shape. ``attention_mask``,
        ``self_attn_mask_type``, ``window_size``, ``rotary_pos_emb``, ``inference_params``
        and the cu_seqlens / max_seqlen arguments go to the self attention;
        ``encoder_output``, ``enc_dec_attn_mask``, ``enc_dec_attn_mask_type`` and
        ``enc_dec_window_size`` to the decoder's cross attention; the attention bias
        arguments and ``checkpoint_core_attention`` to both."""
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError(f"{_OWNER}: hidden_states must be a torch.Tensor, got {type(hidden_states).__name__}")
        self_attn_mask_type = self.self_attn_mask_type if self_attn_mask_type is None else self_attn_mask_type
        window_size = self.window_size if window_size is None else window_size
        if enc_dec_attn_mask_type is None:
            enc_dec_attn_mask_type = self.enc_dec_attn_mask_type
        if enc_dec_window_size is None:
            enc_dec_window_size = self.enc_dec_window_size
        if self.layer_type == "decoder" and encoder_output is None:
            raise ValueError(f"{_OWNER}: layer_type='decoder' needs encoder_output")

        hidden_states = hidden_states.contiguous()
        device_type = hidden_states.device.type
        if torch.is_autocast_enabled(device_type):
            # The residual stream in the autocast dtype, as the blocks' outputs.
            hidden_states = hidden_states.to(torch.get_autocast_dtype(device_type))

        self_attention_outputs = self.self_attention(
            hidden_states, attention_mask=attention_mask, attn_mask_type=self_attn_mask_type, window_size=window_size,
            inference_params=inference_params, is_first_microbatch=is_first_microbatch,
            checkpoint_core_attention=checkpoint_core_attention, rotary_pos_emb=rotary_pos_emb,
            core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
            alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv, fast_zero_fill=fast_zero_fill,
            pad_between_seqs=pad_between_seqs)

        # The blocks add their own biases (see the module's docstring): bias None below.
        if self.apply_residual_connection_post_layernorm and not self.output_layernorm:
            attention_output, residual = self_attention_outputs
            hidden_states = self._bias_dropout_add(attention_output, None, residual, self.drop_path)
        elif not self.parallel_attention_mlp:
            hidden_states = self._bias_dropout_add(self_attention_outputs, None, hidden_states, self.drop_path)

        if self.layer_type == "decoder":
            inter_attention_outputs = self.inter_attention(
                hidden_states, attention_mask=enc_dec_attn_mask, attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size, encoder_output=encoder_output,
                is_first_microbatch=is_first_microbatch, checkpoint_core_attention=checkpoint_core_attention,
                core_attention_bias_type=core_attention_bias_type, core_attention_bias=core_attention_bias,
                alibi_slopes=alibi_slopes, fast_zero_fill=fast_zero_fill)
            if self.apply_residual_connection_post_layernorm:
                attention_output, residual = inter_attention_outputs
            else:
                attention_output, residual = inter_attention_outputs, hidden_states
            hidden_states = self._bias_dropout_add(attention_output, None, residual)

        mlp_outputs = self.layernorm_mlp(hidden_states, is_first_microbatch=is_first_microbatch)
        if self.apply_residual_connection_post_layernorm:
            mlp_output, residual = mlp_outputs
            output = self._bias_dropout_add(mlp_output, None, residual, self.drop_path)
        elif self.parallel_attention_mlp:
            # Both blocks read the layer's input; their outputs (biases included) add up.
            output = self._bias_dropout_add(self_attention_outputs, mlp_outputs, hidden_states, self.drop_path)
        else:
            output = self._bias_dropout_add(mlp_outputs, None, hidden_states, self.drop_path)

        if self.output_layernorm:
            output = self.layernorm(output)
        return output

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, layer_type={self.layer_type!r}, "
                f"attn_input_format={self.attn_input_format!r}")
