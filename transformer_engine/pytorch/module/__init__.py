"""The nn.Module layers of transformer_engine.pytorch."""

from transformer_engine.pytorch.module.layernorm import LayerNorm, RMSNorm
from transformer_engine.pytorch.module.layernorm_linear import LayerNormLinear
from transformer_engine.pytorch.module.layernorm_mlp import LayerNormMLP
from transformer_engine.pytorch.module.linear import Linear

__all__ = ["LayerNorm", "LayerNormLinear", "LayerNormMLP", "Linear", "RMSNorm"]
