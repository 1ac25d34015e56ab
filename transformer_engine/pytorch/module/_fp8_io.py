"""FP8 tensors crossing a module's boundary (``fp8_output`` / ``fp8_grad`` of te.Linear and
te.LayerNormLinear, Transformer Engine 2.x).

Outgoing: the Float8Tensor a module returns as its output (forward tensor 2, the GEMM's
output slot) or as its input's gradient (backward tensor 1), carrying a quantizer of that
slot so that in-place ops on it re-quantize as the module would.

Incoming: an FP8 input (the previous layer's ``fp8_output``) or output gradient (the next
layer's ``fp8_grad``) is used by the GEMMs as it is, scale_inv and all, when it is in the
format the recipe gives that role; otherwise it is dequantized and cast again like any
high-precision tensor. The other layouts a GEMM needs are made into new buffers: the
caller's tensor is never changed.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from transformer_engine.pytorch.cpp_extensions.cast import transpose
from transformer_engine.pytorch.fp8 import get_fp8_te_dtype
from transformer_engine.pytorch.module.base import FP8Step
from transformer_engine.pytorch.tensor import (
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    Float8TensorBase,
    Quantizer,
)

__all__ = ["OUTPUT_INDEX", "GRAD_INPUT_INDEX", "fp8_io", "fp8_matrix", "dequantized", "gemm_operand",
           "role_fp8_dtype", "role_quantizer", "to_float8_tensor"]

# Transformer Engine's slots of a one-GEMM module: forward input 0, weight 1, output 2
# (GEMM1_OUTPUT); backward output gradient 0, input gradient 1 (GRAD_INPUT1).
OUTPUT_INDEX = 2
GRAD_INPUT_INDEX = 1


def fp8_io(step: FP8Step, fp8_output: bool, fp8_grad: bool) -> Optional[Tuple[bool, bool]]:
    """What a module's forward hands its autograd function: (fp8_output, fp8_grad) in an
    FP8 step, None otherwise (outside fp8_autocast, and while calibrating, both are
    ignored, as in Transformer Engine)."""
    if not step.fp8 or not (fp8_output or fp8_grad):
        return None
    return bool(fp8_output), bool(fp8_grad)


def fp8_matrix(t: Float8TensorBase, cols: int) -> Float8TensorBase:
    """FP8 ``t`` of shape [..., cols] as 2-D storage over the same buffers: the row-wise data
    viewed [rows, cols], the column-wise copy ([cols, ...]) viewed [cols, rows]."""
    data = t._data.reshape(-1, cols) if t._data is not None else None
    data_t = t._transpose.reshape(cols, -1) if t._transpose is not None else None
    return Float8TensorBase.wrap(data, data_t, t._scale_inv, t._fp8_dtype)


def dequantized(t: Float8TensorBase, dtype: torch.dtype) -> torch.Tensor:
    """The values of FP8 ``t`` as a plain ``dtype`` tensor (no autograd: the modules call
    this inside their autograd functions)."""
    return Float8TensorBase.dequantize(t, dtype=dtype)


def gemm_operand(t: Float8TensorBase, fp8_dtype, rowwise: bool, columnwise: bool) -> Optional[Float8TensorBase]:
    """2-D FP8 storage ``t`` with the layouts a GEMM reads (row-wise and / or column-wise;
    a missing one is made by an exact transpose of the other), or None when ``t`` is not
    in ``fp8_dtype``, the format its role has in the recipe."""
    if t._fp8_dtype != fp8_dtype:
        return None
    data, data_t = t._data, t._transpose
    if rowwise and data is None:
        data = transpose(data_t)
    if columnwise and data_t is None:
        data_t = transpose(data)
    return Float8TensorBase.wrap(data, data_t, t._scale_inv, t._fp8_dtype)


def role_fp8_dtype(step: FP8Step, forward: bool):
    """The FP8 format of the step's tensors in one direction."""
    state = step.fwd_state if forward else step.bwd_state
    return state.fp8_dtype if state is not None else get_fp8_te_dtype(step.recipe, forward)


def role_quantizer(step: FP8Step, index: int, forward: bool, device: torch.device) -> Quantizer:
    """The quantizer of slot ``index`` (forward or backward) of this step: under delayed
    scaling one over the state's scale and current amax (views: later casts through it
    use the scale of their step and raise that step's amax); under current scaling one
    with the recipe's settings for activations (forward) or gradients (backward)."""
    if step.delayed:
        state = step.fwd_state if forward else step.bwd_state
        return Float8Quantizer(state.scale[index:index + 1], state.current_amax(index), state.fp8_dtype,
                               rowwise=True, columnwise=False)
    recipe = step.recipe
    qparams = recipe.fp8_quant_fwd_inp if forward else recipe.fp8_quant_bwd_grad
    return Float8CurrentScalingQuantizer(get_fp8_te_dtype(recipe, forward), device, rowwise=True, columnwise=False,
                                         force_pow_2_scales=qparams.power_2_scale,
                                         amax_epsilon=qparams.amax_epsilon)


def to_float8_tensor(storage: Float8TensorBase, shape, dtype: torch.dtype, quantizer: Quantizer) -> Float8Tensor:
    """Row-wise 2-D FP8 storage as the Float8Tensor of ``shape`` (same element count) that a
    module returns, standing for a ``dtype`` tensor."""
    return Float8Tensor(shape=shape, dtype=dtype, data=storage._data.view(shape), fp8_scale_inv=storage._scale_inv,
                        fp8_dtype=storage._fp8_dtype, quantizer=quantizer)
