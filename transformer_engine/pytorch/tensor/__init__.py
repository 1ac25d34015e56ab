"""Quantized tensor storage of the PyTorch front end (Transformer Engine 2.x layout).

``Float8TensorBase`` holds FP8 data with its per-tensor scale; the torch.Tensor
subclass ``Float8Tensor`` built on it arrives with the FP8 module work.
"""

from transformer_engine.pytorch.tensor._internal.float8_tensor_base import Float8TensorBase

__all__ = ["Float8TensorBase"]
