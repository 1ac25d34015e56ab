"""The GEMM layer that Linear, LayerNormLinear and LayerNormMLP share: the forward and
backward of y = x W^T + b, in the compute dtype or in FP8, as separate core calls
(module_ops), with the reshaping and dtype helpers around them.

Under FP8 the forward casts x (row-wise for this GEMM, plus the column-wise copy the
weight-gradient GEMM will read) and W (plus its column-wise copy for the data-gradient
GEMM), and runs the FP8 GEMM with the bias fused into its epilogue. The backward casts
the output gradient once, in both layouts, and runs the dgrad ("NN") and wgrad ("NT")
GEMMs on the saved FP8 copies: Hopper's FP8 GEMM reads only the "TN" form, which is why
the transposed copies are made in the same pass as the casts. te.Linear's common FP8
step takes one core call each way instead (linear.py, cpp_extensions/linear_step.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from transformer_engine.pytorch.cpp_extensions import general_gemm, module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import CUDA, CoreDevice, core_device_at
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager, get_fp8_te_dtype
from transformer_engine.pytorch.tensor import Float8TensorBase
from transformer_engine.pytorch.module._fp8_io import dequantized, fp8_matrix, gemm_operand, role_fp8_dtype
from transformer_engine.pytorch.module.base import (
    FP8Step,
    TransformerEngineBaseModule,
    cast_to_fp8,
    check_fp8_dims,
    get_workspace,
    record_amax,
)
from transformer_engine.pytorch.module._split_params import MainGradTarget, main_grad_target
from transformer_engine.pytorch.module.wgrad_store import WgradTarget

__all__ = ["linear_gemm_forward", "linear_gemm_backward", "linear_wgrad", "start_backward", "finish_backward",
           "gemm_bias", "gemm_out_dtype", "fp8_gemm_bias_dtype", "split_accumulator", "to_2d", "to_shape"]


def hp_linear_forward(weight: torch.Tensor, x: torch.Tensor, bias: Optional[torch.Tensor],
                      dev: CoreDevice) -> torch.Tensor:
    """x W^T + b in x's dtype: the core GEMM (cuBLASLt, bias fused) on the GPU, torch's
    BLAS on the CPU (the CPU core GEMM is a reference, not a fast path)."""
    if dev.type == CUDA:
        return module_ops.gemm(weight, x, dev, x.dtype, True, False, bias=bias)
    return torch.nn.functional.linear(x, weight, bias)


def hp_dgrad(weight: torch.Tensor, dy: torch.Tensor, dev: CoreDevice,
             out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """dy W; on the GPU written in ``out_dtype`` (default dy's) by the GEMM itself."""
    if dev.type == CUDA:
        return module_ops.gemm(weight, dy, dev, out_dtype or dy.dtype, False, False)
    return dy @ weight


def hp_wgrad(x: torch.Tensor, dy: torch.Tensor, dev: CoreDevice, out: Optional[torch.Tensor] = None,
             out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """dy^T x, added into ``out`` when given (fuse_wgrad_accumulation); on the GPU written
    in ``out_dtype`` (default dy's) by the GEMM itself."""
    if dev.type == CUDA:
        if out is not None:  # a buffer of the user's: through the checked helper
            return general_gemm(x, dy, get_workspace(dy.device), out_dtype=out.dtype, layout="NT", out=out,
                                accumulate=True)[0]
        return module_ops.gemm(x, dy, dev, out_dtype or dy.dtype, False, True)
    grad = dy.t() @ x
    if out is not None:
        out.add_(grad.to(out.dtype))
        return out
    return grad


def columnwise_only(t: Float8TensorBase) -> Float8TensorBase:
    """What the wgrad GEMM reads of an FP8 input saved for the backward: its column-wise
    copy alone, in a storage of its own (the caller's keeps both), so that the row-wise
    data, the forward GEMM's operand, is freed once nothing else holds it; Transformer
    Engine saves its inputs the same way. Storage without both layouts comes as it is."""
    if t._data is None or t._transpose is None:
        return t
    return Float8TensorBase.wrap(None, t._transpose, t._scale_inv, t._fp8_dtype)


_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gemm_out_dtype(wanted: Optional[torch.dtype], dtype: torch.dtype, dev: CoreDevice) -> torch.dtype:
    """The dtype a backward GEMM writes a gradient in: the one it is returned in
    (``wanted``: the weight's, or the input's) where that is a float dtype, on the GPU,
    whose GEMM converts for free in its epilogue; else the compute ``dtype`` (the caller
    converts). The CPU keeps ``dtype``, so both devices round the same way."""
    if wanted is None or dev.type != CUDA or wanted not in _FLOAT_DTYPES:
        return dtype
    return wanted


def fp8_gemm_bias_dtype(dtype: torch.dtype, dev: CoreDevice) -> torch.dtype:
    """The bias dtype of an FP8 GEMM with a ``dtype`` output: cuBLASLt's FP8 GEMM takes a
    bf16 or fp16 bias, not an fp32 one, so on the GPU an fp32 output gets its bias in bf16,
    as in Transformer Engine. The CPU core's GEMM adds an fp32 bias as it is (converting
    it there cost the CPU step a tenth of its host time, for a rounding that only the GPU
    needs)."""
    return torch.bfloat16 if dtype == torch.float32 and dev.type == CUDA else dtype


def gemm_bias(bias: Optional[torch.Tensor], dtype: torch.dtype, fp8: bool, dev: CoreDevice,
              group: Optional[module_ops.QuantizeGroup] = None) -> Optional[torch.Tensor]:
    """``bias`` in the dtype the forward GEMM adds it in (``dtype``, or
    fp8_gemm_bias_dtype under FP8): as it is, or converted, by ``group`` when given (then
    in the launch of the step's casts, written by its ``run()``)."""
    if bias is None:
        return None
    want = fp8_gemm_bias_dtype(dtype, dev) if fp8 else dtype
    if bias.dtype == want:
        return bias
    return group.add_conversion(bias, want) if group is not None else bias.to(want)


def linear_gemm_forward(module: TransformerEngineBaseModule, step: FP8Step, x: torch.Tensor, weight, bias,
                        dtype: torch.dtype, is_first_microbatch: Optional[bool], need_wgrad: bool, need_dgrad: bool,
                        dev: CoreDevice, x_fp8: Optional[Float8TensorBase] = None, weight_name: str = "weight",
                        index: int = 0, w_fp8: Optional[Float8TensorBase] = None, fp8_output: bool = False):
    """The forward GEMM of a linear layer on the 2-D input ``x`` (already in ``dtype``, or FP8
    storage from the previous layer's fp8_output) or its FP8 cast ``x_fp8`` (made by a fused
    norm); the input is forward tensor ``index`` and the weight ``index + 1``, whose FP8 copy
    ``w_fp8`` is made here unless given. ``bias`` in any float dtype (see gemm_bias). With
    ``fp8_output`` (FP8 steps only) the output is row-wise FP8 storage (forward tensor
    ``index + 2``). Returns (out, what the wgrad GEMM needs, what the dgrad GEMM needs)."""
    if step.fp8:
        if x_fp8 is None and isinstance(x, Float8TensorBase):
            x_fp8 = gemm_operand(x, role_fp8_dtype(step, True), True, need_wgrad)
            if x_fp8 is None:  # another format than this recipe's inputs: cast again
                x = dequantized(x, dtype)
            else:
                check_fp8_dims(x_fp8._data, "the input")
        # The input's and the weight's casts and the bias's conversion, one core call (one
        # launch when all are small). Nothing to cast (LayerNormMLP casts its weights and
        # converts its biases together beforehand): no group.
        group = module_ops.QuantizeGroup(dev) if x_fp8 is None or w_fp8 is None else None
        if x_fp8 is None:
            check_fp8_dims(x, "the input")
            x_fp8 = cast_to_fp8(x, step, index, dev, rowwise=True, columnwise=need_wgrad, group=group)
        if w_fp8 is None:
            w_fp8 = module.fp8_weight(weight_name, weight, step, index + 1, is_first_microbatch,
                                      need_dgrad, dev, group=group)
        bias = gemm_bias(bias, dtype, True, dev, group)
        if group is not None:
            group.run()
        saved_x = columnwise_only(x_fp8) if need_wgrad else None
        if fp8_output:
            out = _fprop_to_fp8(step, w_fp8, x_fp8, bias, dtype, index + 2, dev)
            return out, saved_x, (w_fp8 if need_dgrad else None)
        out = module_ops.gemm(w_fp8, x_fp8, dev, dtype, True, False, bias=bias,
                              split_accumulator=split_accumulator(step, "fp8_gemm_fprop", default=False))
        return out, saved_x, (w_fp8 if need_dgrad else None)
    bias = gemm_bias(bias, dtype, False, dev)
    if isinstance(weight, Float8TensorBase):
        w = weight.dequantize(dtype=dtype)
    else:
        w = weight.to(dtype) if weight.dtype != dtype else weight
    if step.calibrating:
        record_amax(x, step, True, index)
        record_amax(w, step, True, index + 1)
    out = hp_linear_forward(w, x, bias, dev)
    return out, (x if need_wgrad else None), (w if need_dgrad else None)


def _fprop_to_fp8(step: FP8Step, w_fp8: Float8TensorBase, x_fp8: Float8TensorBase, bias: Optional[torch.Tensor],
                  dtype: torch.dtype, index: int, dev: CoreDevice) -> Float8TensorBase:
    """The FP8 forward GEMM with its output in FP8 (forward tensor ``index``, row-wise);
    ``bias`` as gemm_bias gives it. Delayed scaling: the GEMM casts its own output with the
    slot's scale (cuBLASLt's FP8 output takes a bfloat16 bias only). Current scaling needs
    the output's amax before the cast, so it casts afterwards, as an fp16 bias does."""
    split = split_accumulator(step, "fp8_gemm_fprop", default=False)
    if step.delayed and (bias is None or bias.dtype == torch.bfloat16):
        state = step.fwd_state
        return module_ops.gemm_fp8_output(w_fp8, x_fp8, dev, True, False, state.fp8_dtype,
                                          state.scale[index:index + 1], state.current_amax(index), bias=bias,
                                          split_accumulator=split)
    out = module_ops.gemm(w_fp8, x_fp8, dev, dtype, True, False, bias=bias, split_accumulator=split)
    return cast_to_fp8(out, step, index, dev, rowwise=True, columnwise=False)


def _cast_grad(step: FP8Step, dy: torch.Tensor, index: int, want_dbias: bool, need_dgrad: bool, need_wgrad: bool,
               dev: CoreDevice, dbias_dtype: Optional[torch.dtype] = None):
    """(dbias or None, dy in FP8 or None) for the backward GEMMs: the layouts they read
    (row-wise for dgrad, column-wise for wgrad), nothing when neither runs. dbias comes
    from the same core call as the cast (one pass over dy, or one launch for a small dy),
    in float32 when ``dbias_dtype`` is (module_ops.dbias_dtype_for)."""
    if not (need_dgrad or need_wgrad):
        return (dy.sum(0) if want_dbias else None), None
    if want_dbias and step.delayed:
        state = step.bwd_state
        return module_ops.dbias_quantize(dy, state.fp8_dtype, state.scale_address(index), state.amax_address(index),
                                         need_dgrad, need_wgrad, dev, dbias_dtype)
    if want_dbias:  # current scaling
        recipe = step.recipe
        qparams = recipe.fp8_quant_bwd_grad
        return module_ops.dbias_quantize_current_scaling(dy, get_fp8_te_dtype(recipe, False), qparams.amax_epsilon,
                                                         qparams.power_2_scale, need_dgrad, need_wgrad, dev,
                                                         dbias_dtype)
    dy_fp8 = cast_to_fp8(dy, step, index, dev, forward=False, rowwise=need_dgrad, columnwise=need_wgrad)
    return (dy.sum(0) if want_dbias else None), dy_fp8


def linear_gemm_backward(step: FP8Step, dy: Optional[torch.Tensor], saved_x, saved_w, weight, dtype: torch.dtype,
                         need_wgrad: bool, need_dgrad: bool, fuse_wgrad_accumulation: bool, dev: CoreDevice,
                         index: int = 0, want_dbias: bool = False, dy_fp8: Optional[Float8TensorBase] = None,
                         defer_to: Optional[WgradTarget] = None, dgrad_fp8: bool = False,
                         weight_parts: Optional[Sequence[torch.nn.Parameter]] = None,
                         dx_dtype: Optional[torch.dtype] = None, dbias_dtype: Optional[torch.dtype] = None):
    """dgrad and wgrad of a linear layer from its output gradient ``dy`` (2-D, ``dtype``, or
    FP8 storage from the next layer's fp8_grad), cast to FP8 (backward tensor ``index``)
    under FP8 unless ``dy_fp8`` is already that cast. With ``want_dbias`` also the bias
    gradient (dy summed over rows, ``dtype``, or float32 from the cast when ``dbias_dtype``
    is: an fp32 bias): under FP8 from the same pass as the cast. With ``dgrad_fp8`` (FP8
    steps only) dx is row-wise FP8 storage (backward tensor ``index + 1``). A
    high-precision dx comes in ``dx_dtype`` (default ``dtype``): on the GPU the dgrad GEMM
    writes it so, rather than a conversion after it (an fp32 input under torch.autocast),
    and dw comes in the weight's dtype the same way. Returns (dx, dw, dbias); dw is None
    when it went into ``weight.main_grad`` (fuse_wgrad_accumulation; for a split weight,
    ``weight`` joins ``weight_parts``, and each part's main_grad takes its rows).

    With ``defer_to`` (delay_wgrad_compute) the wgrad GEMM is handed to it instead of run,
    with the tensors it reads; dw is then None, and so is dbias when it comes with the
    wgrad GEMM (high precision: its epilogue on the GPU)."""
    main_grad = main_grad_target(weight, weight_parts) if fuse_wgrad_accumulation and need_wgrad else None
    if isinstance(dy, Float8TensorBase):
        dy_fp8 = gemm_operand(dy, role_fp8_dtype(step, False), need_dgrad, need_wgrad) if step.fp8 else None
        # The high-precision values only where still needed: the bias gradient, or no FP8 use.
        dy = dequantized(dy, dtype) if dy_fp8 is None or want_dbias else None
    dx = dbias = None
    if step.fp8:
        if dy_fp8 is None:
            dbias, dy_fp8 = _cast_grad(step, dy, index, want_dbias, need_dgrad, need_wgrad, dev, dbias_dtype)
        elif want_dbias:
            dbias = dy.sum(0)
        if need_dgrad:
            if dgrad_fp8:
                dx = _dgrad_to_fp8(step, saved_w, dy_fp8, dtype, index + 1, dev)
            else:
                dx = module_ops.gemm(saved_w, dy_fp8, dev, gemm_out_dtype(dx_dtype, dtype, dev), False, False,
                                     split_accumulator=split_accumulator(step, "fp8_gemm_dgrad"))
        dy_for_wgrad, wgrad_dbias = dy_fp8, False
    else:
        if step.calibrating:
            record_amax(dy, step, False, index)
        if need_dgrad:
            dx = hp_dgrad(saved_w, dy, dev, gemm_out_dtype(dx_dtype, dtype, dev))
        dy_for_wgrad, wgrad_dbias = dy, want_dbias and need_wgrad
        if want_dbias and not need_wgrad:
            dbias = dy.sum(0)
    if not need_wgrad:
        return dx, None, dbias
    if defer_to is not None:
        defer_to.defer(lambda: linear_wgrad(step, saved_x, dy_for_wgrad, weight, dtype, main_grad, wgrad_dbias,
                                            core_device_at(weight.device)))
        return dx, None, dbias
    dw, wgrad_bias = linear_wgrad(step, saved_x, dy_for_wgrad, weight, dtype, main_grad, wgrad_dbias, dev)
    return dx, dw, (wgrad_bias if wgrad_dbias else dbias)


def linear_wgrad(step: FP8Step, saved_x, dy, weight, dtype: torch.dtype, main_grad: Optional[MainGradTarget],
                 want_dbias: bool, dev: CoreDevice):
    """The weight-gradient GEMM dy^T x (``dy`` in FP8 under FP8), added into ``main_grad``
    when given; with ``want_dbias`` (high precision only) also dy's column sums. Returns
    (dw in the weight's dtype or None when it went into main_grad, dbias or None). On the
    GPU the GEMM writes dw in the weight's dtype (an fp32 weight under torch.autocast:
    fp32 straight from the accumulator, no bf16 copy and conversion)."""
    dw = dbias = None
    dw_dtype = gemm_out_dtype(weight.dtype, dtype, dev)
    if step.fp8:
        if main_grad is not None:  # a buffer of the user's: through the checked helper
            out = main_grad.buffer
            general_gemm(saved_x, dy, get_workspace(out.device), out_dtype=out.dtype, layout="NT", out=out,
                         accumulate=True, use_split_accumulator=split_accumulator(step, "fp8_gemm_wgrad"))
        else:
            dw = module_ops.gemm(saved_x, dy, dev, dw_dtype, False, True,
                                 split_accumulator=split_accumulator(step, "fp8_gemm_wgrad"))
    else:
        if main_grad is not None:
            hp_wgrad(saved_x, dy, dev, out=main_grad.buffer)
        elif want_dbias and dev.type == CUDA:  # dbias from the wgrad GEMM's epilogue: one launch fewer
            dw, dbias = module_ops.gemm_bias_grad(saved_x, dy, dev, dy.dtype, False, True)
        else:
            dw = hp_wgrad(saved_x, dy, dev, out_dtype=dw_dtype)
        if want_dbias and dbias is None:
            dbias = dy.sum(0)
    if main_grad is not None:
        main_grad.finish()
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    return dw, dbias


def _dgrad_to_fp8(step: FP8Step, saved_w: Float8TensorBase, dy_fp8: Float8TensorBase, dtype: torch.dtype, index: int,
                  dev: CoreDevice) -> Float8TensorBase:
    """The FP8 dgrad GEMM with dx in FP8 (backward tensor ``index``, row-wise): cast by the
    GEMM itself under delayed scaling, afterwards under current scaling (which needs dx's
    amax first)."""
    split = split_accumulator(step, "fp8_gemm_dgrad")
    if step.delayed:
        state = step.bwd_state
        return module_ops.gemm_fp8_output(saved_w, dy_fp8, dev, False, False, state.fp8_dtype,
                                          state.scale[index:index + 1], state.current_amax(index),
                                          split_accumulator=split)
    dx = module_ops.gemm(saved_w, dy_fp8, dev, dtype, False, False, split_accumulator=split)
    return cast_to_fp8(dx, step, index, dev, forward=False, rowwise=True, columnwise=False)


def start_backward(step: FP8Step) -> None:
    """Start of a module's backward: a backward update an earlier backward pass left
    deferred (FP8GlobalStateManager.update_backward_states) is applied before this
    backward's casts read the scales."""
    if step.bwd_state is not None:
        FP8GlobalStateManager.flush_deferred_backward_update()


def finish_backward(step: FP8Step) -> None:
    """End of a module's backward: its backward state waits for the update, which the
    first FP8 module of the autocast (whose backward runs last) triggers; not while
    make_graphed_callables captures (the graphed backward updates when replayed)."""
    if step.bwd_state is None:
        return
    FP8GlobalStateManager.add_backward_state(step.bwd_state)
    if step.first_module and not FP8GlobalStateManager.MAKING_GRAPHS:
        FP8GlobalStateManager.update_backward_states(step.recipe)


def to_2d(t: torch.Tensor, cols: int, dtype: torch.dtype, keep_fp8: bool = False) -> torch.Tensor:
    """``t`` as a contiguous [rows, cols] matrix in ``dtype``. An FP8 tensor (a neighbouring
    layer's fp8_output / fp8_grad) comes dequantized, or with ``keep_fp8`` as 2-D FP8 storage
    over its own buffers."""
    if isinstance(t, Float8TensorBase):
        if keep_fp8:
            return fp8_matrix(t, cols)
        t = dequantized(t, dtype)
    if t.dim() != 2:  # a reshape costs a microsecond even when it changes nothing
        t = t.reshape(-1, cols)
    return (t.to(dtype) if t.dtype != dtype else t).contiguous()


def to_shape(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The [rows, cols] result ``t`` viewed as ``shape`` (as is when that is 2-D already)."""
    return t if len(shape) == 2 else t.view(shape)


def split_accumulator(step: FP8Step, gemm: str, default: bool = True) -> bool:
    """The recipe's split-accumulator choice for one GEMM (Float8CurrentScaling sets it per
    GEMM; DelayedScaling uses Transformer Engine's defaults: off in fprop, on in backward)."""
    params = getattr(step.recipe, gemm, None)
    return default if params is None else bool(params.use_split_accumulator)
