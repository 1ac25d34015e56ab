"""transformer_engine.pytorch: the PyTorch front end.

FP8 state: ``fp8_autocast`` (and its newer name ``autocast``), ``fp8_model_init``; the
core ops are reachable through ``transformer_engine.pytorch.cpp_extensions``. The
modules (Linear, LayerNorm, ...) arrive with the rest of the PyTorch front-end work.
"""

from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.fp8 import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    is_fp8_available,
)

__all__ = [
    "DType",
    "FP8GlobalStateManager",
    "autocast",
    "fp8_autocast",
    "fp8_model_init",
    "is_fp8_available",
]
