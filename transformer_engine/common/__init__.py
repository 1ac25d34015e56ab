"""Framework-independent parts of the API: the FP8 recipes (``transformer_engine.common.recipe``)."""

from transformer_engine.common import recipe

__all__ = ["recipe"]
