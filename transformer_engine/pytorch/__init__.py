"""transformer_engine.pytorch: the PyTorch front end.

Modules: ``Linear``, ``LayerNorm``, ``RMSNorm``, ``LayerNormLinear``, ``LayerNormMLP``,
``DotProductAttention`` (with the KV cache ``InferenceParams``), ``MultiheadAttention``,
``TransformerLayer``, rotary embeddings
(``RotaryPositionEmbedding``, ``apply_rotary_pos_emb``). FP8 state: ``fp8_autocast``
(and its newer name ``autocast``), ``fp8_model_init``. Activation recomputation:
``checkpoint``, with ``CudaRNGStatesTracker`` for the RNG states of model-parallel regions.
CUDA graphs of modules' passes, FP8 included: ``make_graphed_callables``.
The core ops are reachable through ``transformer_engine.pytorch.cpp_extensions``.
"""

from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.fp8 import (
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    is_fp8_available,
)
from transformer_engine.pytorch.module import LayerNorm, LayerNormLinear, LayerNormMLP, Linear, RMSNorm
from transformer_engine.pytorch.attention import (
    DotProductAttention,
    InferenceParams,
    MultiheadAttention,
    RotaryPositionEmbedding,
    apply_rotary_pos_emb,
)
from transformer_engine.pytorch.transformer import TransformerLayer
from transformer_engine.pytorch.distributed import CudaRNGStatesTracker, checkpoint
from transformer_engine.pytorch.graph import make_graphed_callables
from transformer_engine.pytorch.tensor import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    QuantizedTensor,
)

__all__ = [
    "CudaRNGStatesTracker",
    "DType",
    "DotProductAttention",
    "FP8GlobalStateManager",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "InferenceParams",
    "LayerNorm",
    "LayerNormLinear",
    "LayerNormMLP",
    "Linear",
    "MultiheadAttention",
    "QuantizedTensor",
    "RMSNorm",
    "RotaryPositionEmbedding",
    "TransformerLayer",
    "apply_rotary_pos_emb",
    "autocast",
    "checkpoint",
    "fp8_autocast",
    "fp8_model_init",
    "is_fp8_available",
    "make_graphed_callables",
]
