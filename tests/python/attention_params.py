"""Backend-selection parameters for the attention tests (test_fused_attn.py,
test_flash_attn.py): one typical call, changed by keyword."""

from __future__ import annotations

import torch

from transformer_engine.pytorch.attention.dot_product_attention.backends import AttentionParams


def attention_params(**overrides) -> AttentionParams:
    """bf16 bshd causal self-attention, batch 2, 16 heads, 128 tokens, head dim 64, training,
    on an sm_90 GPU; ``overrides`` replace any of these fields."""
    fields = dict(qkv_dtype=torch.bfloat16, device_type="cuda", compute_capability=(9, 0), qkv_format="bshd",
                  batch_size=2, num_heads=16, num_gqa_groups=16, max_seqlen_q=128, max_seqlen_kv=128, head_dim_qk=64,
                  head_dim_v=64, attn_mask_type="causal", window_size=(-1, 0), is_training=True)
    fields.update(overrides)
    return AttentionParams(**fields)
