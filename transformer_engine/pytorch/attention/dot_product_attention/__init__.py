"""DotProductAttention and its backends: the choice (backends.py), the unfused backend
(unfused.py, softmax.py), masks / windows / ALiBi (masks.py) and layouts (utils.py)."""

from transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention import DotProductAttention

__all__ = ["DotProductAttention"]
