"""A small GPT trained with transformer_engine.pytorch (the README's main job)."""
