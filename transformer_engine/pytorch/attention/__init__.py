"""Attention: ``DotProductAttention`` and the KV cache of inference, ``InferenceParams``."""

from transformer_engine.pytorch.attention.dot_product_attention import DotProductAttention
from transformer_engine.pytorch.attention.inference import InferenceParams

__all__ = ["DotProductAttention", "InferenceParams"]
