"""Attention building blocks of ``transformer_engine.pytorch``: rotary position embedding
(``RotaryPositionEmbedding``, ``apply_rotary_pos_emb``)."""

from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding, apply_rotary_pos_emb

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb"]
