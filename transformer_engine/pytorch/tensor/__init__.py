"""Quantized tensors of the PyTorch front end and the quantizers that make them
(Transformer Engine 2.x names).

``Float8TensorBase``  FP8 data with its per-tensor scale (plain storage, used inside modules);
``Float8Tensor``      the same as a torch.Tensor subclass of the nominal dtype (parameters,
                      tensors handed to user code);
``QuantizedTensor``   the base class of such tensor subclasses;
``Quantizer``         the base class of the builders; ``Float8Quantizer`` (delayed scaling)
                      and ``Float8CurrentScalingQuantizer`` (current scaling) make FP8 tensors.
"""

from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType
from transformer_engine.pytorch.tensor._internal.float8_tensor_base import Float8TensorBase
from transformer_engine.pytorch.tensor.float8_quantizer import Float8CurrentScalingQuantizer, Float8Quantizer
from transformer_engine.pytorch.tensor.float8_tensor import Float8Tensor
from transformer_engine.pytorch.tensor.quantized_tensor import QuantizedTensor
from transformer_engine.pytorch.tensor.quantizer import Quantizer

__all__ = [
    "DType",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "Float8TensorBase",
    "QuantizedTensor",
    "Quantizer",
]
