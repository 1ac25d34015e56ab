"""Attention: ``DotProductAttention``, ``MultiheadAttention`` (projections around it), the KV
cache of inference (``InferenceParams``) and rotary position embedding
(``RotaryPositionEmbedding``, ``apply_rotary_pos_emb``)."""

from transformer_engine.pytorch.attention.dot_product_attention import DotProductAttention
from transformer_engine.pytorch.attention.inference import InferenceParams
from transformer_engine.pytorch.attention.multi_head_attention import MultiheadAttention
from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = [
    "DotProductAttention",
    "InferenceParams",
    "MultiheadAttention",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
]
