"""FusedAttention: DotProductAttention's cuDNN backend (cuDNN's fused SDPA kernels through
the core's fused_attn ops; see cpp_extensions/fused_attn.py).

Takes the masks as sequence lengths (padding types: right-padded sequences; the padding
masks are turned into lengths by counting, as Transformer Engine does), sliding windows,
a post-scale bias, GQA / MQA, dropout (cuDNN's Philox generator, seeded from torch's CUDA
generator inside the RNG tracker's fork when there is one) and the sbhd / bshd formats
(thd arrives padded to bshd). The backward recomputes the probabilities from the saved
softmax statistics. A call cuDNN cannot run raises ``FusedAttentionUnsupported`` before
anything runs; DotProductAttention then falls back to the unfused backend.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Optional

import torch

from transformer_engine.pytorch.cpp_extensions.fused_attn import (
    FusedAttnConfig,
    check_sdpa_support,
    packed_qkv_offsets,
    philox_rng_state,
    sdpa_bwd,
    sdpa_fwd,
)

__all__ = ["FusedAttention", "FusedAttentionUnsupported"]


class FusedAttentionUnsupported(NotImplementedError):
    """cuDNN cannot run this call (its message says why)."""


class _FusedAttnFunc(torch.autograd.Function):
    """o = sdpa(q, k, v, bias); backward from the saved statistics."""

    @staticmethod
    def forward(ctx, q, k, v, bias, seqlens_q, seqlens_kv, rng_state, config: FusedAttnConfig, q_format: str,
                kv_format: str, with_stats: bool):
        o, stats = sdpa_fwd(q, k, v, config, q_format=q_format, kv_format=kv_format, bias=bias, seqlens_q=seqlens_q,
                            seqlens_kv=seqlens_kv, rng_state=rng_state, with_stats=with_stats)
        ctx.save_for_backward(q, k, v, o, stats, bias, seqlens_q, seqlens_kv, rng_state)
        ctx.config, ctx.q_format, ctx.kv_format = config, q_format, kv_format
        ctx.bias_grad = bias is not None and bias.requires_grad
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, o, stats, bias, seqlens_q, seqlens_kv, rng_state = ctx.saved_tensors
        if stats is None:
            raise RuntimeError("FusedAttention: the forward ran without saving softmax statistics (no input needed a "
                               "gradient then); run it with gradients enabled to differentiate it")
        dq, dk, dv, dbias = sdpa_bwd(d_o.reshape(o.shape), q, k, v, o, stats, ctx.config, q_format=ctx.q_format,
                                     kv_format=ctx.kv_format, bias=bias, bias_grad=ctx.bias_grad,
                                     seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, rng_state=rng_state)
        return dq, dk, dv, dbias, None, None, None, None, None, None, None


# Configurations cuDNN was found to run (forward, and backward where asked): see forward.
_SUPPORTED = set()
_MAX_SUPPORTED = 4096


def _layout_key(x: torch.Tensor) -> tuple:
    """What cuDNN's graph depends on of an input: shape, strides, dtype, device, and whether
    it is 16-byte aligned (else it is copied, which changes its strides)."""
    return tuple(x.shape), x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0


def _lengths(padding: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """int32 [b] true lengths of a [b, s] padding mask (True = padding)."""
    if padding is None:
        return None
    return (~padding).sum(dim=1, dtype=torch.int32)


class FusedAttention(torch.nn.Module):
    """The cuDNN backend of DotProductAttention. ``forward`` takes tensors positionally so
    that te.checkpoint can recompute it."""

    def __init__(self, softmax_scale: float, attention_dropout: float = 0.0,
                 attention_dropout_ctx: Callable = nullcontext, deterministic: bool = False,
                 layer_number: Optional[int] = None):
        super().__init__()
        self.softmax_scale = softmax_scale
        self.attention_dropout = attention_dropout
        self.attention_dropout_ctx = attention_dropout_ctx
        self.deterministic = deterministic
        self.layer_number = layer_number

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: Optional[torch.Tensor],
                q_padding: Optional[torch.Tensor], kv_padding: Optional[torch.Tensor], *, attn_mask_type: str,
                window_size=(-1, -1), q_format: str = "bshd", kv_format: str = "bshd") -> torch.Tensor:
        """query [.., h, dqk] in q_format, key / value [.., hg, dqk / dv] in kv_format (sbhd or
        bshd, float16 / bfloat16 on a GPU); bias: post-scale, [1|b, 1|h, sq, skv] or None;
        q_padding [b, sq] / kv_padding [b, skv] (True = padding) for the padding mask types.
        Returns the output in q_format with the heads flattened: [.., h * dv]."""
        dropout = self.attention_dropout if self.training else 0.0
        config = FusedAttnConfig(mask_type=attn_mask_type, window=tuple(window_size),
                                 bias_type="no_bias" if bias is None else "post_scale_bias",
                                 softmax_scale=self.softmax_scale, dropout=dropout, deterministic=self.deterministic)
        if bias is not None:
            bias = bias.to(query.dtype).contiguous()
        seqlens_q, seqlens_kv = (_lengths(q_padding), _lengths(kv_padding)) if config.padding else (None, None)
        rng_state = None
        if dropout > 0.0:
            with self.attention_dropout_ctx():
                rng_state = philox_rng_state(query.device)
        needs_grad = any(t is not None and t.requires_grad for t in (query, key, value, bias))
        bias_grad = bias is not None and bias.requires_grad
        # The forward's and (for training) the backward's graphs are checked before anything
        # runs, so that a step never fails half way; a configuration that passed once is
        # remembered (the check builds descriptors: tens of microseconds of host time). Packed
        # q, k, v get gradients strided as they are (sdpa_bwd): another backward graph.
        checked = (config, q_format, kv_format, needs_grad, bias_grad, None if bias is None else tuple(bias.shape),
                   *(_layout_key(x) for x in (query, key, value)), packed_qkv_offsets(query, key, value))
        if checked not in _SUPPORTED:
            try:
                check_sdpa_support(query, key, value, config, q_format=q_format, kv_format=kv_format, bias=bias,
                                   seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, rng_state=rng_state,
                                   backward=needs_grad, bias_grad=bias_grad)
            except NotImplementedError as error:
                raise FusedAttentionUnsupported(str(error)) from None
            if len(_SUPPORTED) >= _MAX_SUPPORTED:
                _SUPPORTED.clear()
            _SUPPORTED.add(checked)
        with_stats = needs_grad and torch.is_grad_enabled()
        o = _FusedAttnFunc.apply(query, key, value, bias, seqlens_q, seqlens_kv, rng_state, config, q_format,
                                 kv_format, with_stats)
        return o.view(*o.shape[:2], -1)
