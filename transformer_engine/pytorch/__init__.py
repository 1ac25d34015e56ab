"""transformer_engine.pytorch: the PyTorch front end.

Modules: ``Linear``, ``LayerNorm``, ``RMSNorm``, ``LayerNormLinear``, ``LayerNormMLP``. FP8 state: ``fp8_autocast`` (and its newer name
``autocast``), ``fp8_model_init``. The core ops are reachable through
``transformer_engine.pytorch.cpp_extensions``.
"""

from transformer_engine.pytorch.attention import RotaryPositionEmbedding, apply_rotary_pos_emb
from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.fp8 import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    is_fp8_available,
)
from transformer_engine.pytorch.module import LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm
from transformer_engine.pytorch.tensor import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    QuantizedTensor,
)

__all__ = [
    "DType",
    "FP8GlobalStateManager",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "QuantizedTensor",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "apply_rotary_pos_emb",
    "autocast",
    "fp8_autocast",
    "fp8_model_init",
    "is_fp8_available",
]
