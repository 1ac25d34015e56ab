"""te.LayerNormLinear: a LayerNorm (or RMSNorm) followed by a Linear, with the norm writing
FP8 straight from its kernel under delayed scaling (one pass over the activations instead
of a norm, then a separate cast)."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple, Union

import torch

from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import CoreDevice, Fp8Output, core_device
from transformer_engine.pytorch.module._function_apply import direct_apply
from transformer_engine.pytorch.module._norm import (
    check_normalization,
    make_norm_parameters,
    norm_backward,
    norm_forward,
    reset_norm_parameters,
)
from transformer_engine.pytorch.module._fp8_io import (
    GRAD_INPUT_INDEX,
    OUTPUT_INDEX,
    fp8_io,
    role_quantizer,
    to_float8_tensor,
)
from transformer_engine.pytorch.module.base import (
    FP8Step,
    activation_dtype_of,
    cast_to_fp8,
    check_fp8_dims,
    current_scaling_params,
)
from transformer_engine.pytorch.module._linear_gemm import (
    finish_backward,
    linear_gemm_backward,
    linear_gemm_forward,
    start_backward,
    to_2d,
    to_shape,
)
from transformer_engine.pytorch.module.linear import Linear

__all__ = ["LayerNormLinear"]


def norm_then_maybe_fp8(step: FP8Step, normalization: str, x: torch.Tensor, ln_weight, ln_bias, eps: float,
                        zero_centered_gamma: bool, need_hp_out: bool, need_wgrad: bool, dev: CoreDevice):
    """The norm of ``x`` for a following GEMM: (high-precision output or None, FP8 output or
    None, mu, rsigma). Under delayed scaling the norm kernel casts to FP8 itself (forward
    tensor 0); a high-precision copy is made only when asked for or when the recipe needs
    the amax before the cast. Current scaling: past one block's cast the norm kernel takes
    the amax of the y it writes and the cast follows from it (module_ops.FusedAmax, as
    Transformer Engine's norm + quantize_with_amax: one read of y fewer than a cast of its
    own); a smaller y is cast with the weight in the GEMM step (one launch)."""
    if step.fp8 and step.delayed and not need_hp_out:
        check_fp8_dims(x, "the input")
        state = step.fwd_state
        fp8 = Fp8Output(state.fp8_dtype, state.scale_address(0), state.amax_address(0), need_wgrad)
        ln_fp8, mu, rsigma = norm_forward(normalization, x, ln_weight, ln_bias, eps, zero_centered_gamma, dev, fp8)
        return None, ln_fp8, mu, rsigma
    if step.fp8 and not step.delayed and x.numel() > module_ops.FUSED_AMAX_MIN_ELEMENTS:
        check_fp8_dims(x, "the input")
        fused = module_ops.FusedAmax(x.device)
        ln_out, mu, rsigma = norm_forward(normalization, x, ln_weight, ln_bias, eps, zero_centered_gamma, dev,
                                          amax=fused.address)
        fp8_dtype, epsilon, power_2_scale = current_scaling_params(step, forward=True)
        ln_fp8 = fused.quantize(ln_out, fp8_dtype, epsilon, power_2_scale, True, need_wgrad, dev)
        return (ln_out if need_hp_out else None), ln_fp8, mu, rsigma
    ln_out, mu, rsigma = norm_forward(normalization, x, ln_weight, ln_bias, eps, zero_centered_gamma, dev)
    return ln_out, None, mu, rsigma


class _LayerNormLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, ln_weight, ln_bias, inp, bias, module: "LayerNormLinear", step: FP8Step,
                dtype: torch.dtype, is_first_microbatch: Optional[bool], fp8_io: Optional[Tuple[bool, bool]]):
        # fp8_io: (fp8_output, fp8_grad) of an FP8 step, None otherwise.
        fp8_output, fp8_grad = fp8_io or (False, False)
        dev = core_device(inp)
        x = to_2d(inp, module.in_features, dtype)
        need_wgrad, need_dgrad = weight.requires_grad, True  # the norm's backward needs the dgrad
        ln_out, ln_fp8, mu, rsigma = norm_then_maybe_fp8(
            step, module.normalization, x, ln_weight, ln_bias, module.eps, module.zero_centered_gamma,
            module.return_layernorm_output, need_wgrad, dev)
        out, saved_x, saved_w = linear_gemm_forward(module, step, ln_out, weight, bias, dtype, is_first_microbatch,
                                                    need_wgrad, need_dgrad, dev, x_fp8=ln_fp8,
                                                    fp8_output=fp8_output)
        ctx.saved = (saved_x, saved_w, x, mu, rsigma)
        ctx.weight, ctx.ln_weight, ctx.step, ctx.dtype, ctx.module = weight, ln_weight, step, dtype, module
        ctx.inp_shape, ctx.inp_dtype = inp.shape, inp.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.fp8_grad = fp8_grad
        out_shape = (*inp.shape[:-1], weight.shape[0])
        if fp8_output:
            out = to_float8_tensor(out, out_shape, dtype, role_quantizer(step, OUTPUT_INDEX, True, inp.device))
        else:
            out = to_shape(out, out_shape)
        if module.return_layernorm_output:
            return out, to_shape(ln_out, inp.shape)
        return out

    @staticmethod
    def backward(ctx, grad_out, grad_ln_out=None):
        (saved_x, saved_w, x, mu, rsigma), ctx.saved = ctx.saved, None
        module, weight = ctx.module, ctx.weight
        start_backward(ctx.step)
        dev = core_device(grad_out)
        dy = to_2d(grad_out, weight.shape[0], ctx.dtype, keep_fp8=ctx.step.fp8)
        want_dbias = ctx.bias_dtype is not None and ctx.needs_input_grad[4]
        defer_to = module.wgrad_target(want_dbias) if module.wgrad_store.delay_wgrad_compute else None
        d_ln_out, dw, dbias = linear_gemm_backward(ctx.step, dy, saved_x, saved_w, weight, ctx.dtype,
                                                   weight.requires_grad, True, module.fuse_wgrad_accumulation,
                                                   dev, want_dbias=want_dbias, defer_to=defer_to,
                                                   weight_parts=module.weight_parts() if module._split else None,
                                                   dbias_dtype=ctx.bias_dtype)
        if defer_to is not None:
            module.wgrad_store.put(defer_to.entry)
        dbias = dbias.to(ctx.bias_dtype) if dbias is not None else None
        if grad_ln_out is not None:
            d_ln_out = d_ln_out + to_2d(grad_ln_out, module.in_features, ctx.dtype)
        dx, d_ln_weight, d_ln_bias = norm_backward(module.normalization, d_ln_out.contiguous(), x, mu, rsigma,
                                                   ctx.ln_weight, module.zero_centered_gamma, dev)
        if ctx.fp8_grad:  # the norm's backward writes high precision: cast after it (before the update)
            dx = cast_to_fp8(dx, ctx.step, GRAD_INPUT_INDEX, dev, forward=False, rowwise=True, columnwise=False)
        finish_backward(ctx.step)
        if ctx.fp8_grad:
            dx = to_float8_tensor(dx, ctx.inp_shape, ctx.inp_dtype,
                                  role_quantizer(ctx.step, GRAD_INPUT_INDEX, False, weight.device))
        else:
            dx = to_shape(dx, ctx.inp_shape)
            dx = dx.to(ctx.inp_dtype) if dx.dtype != ctx.inp_dtype else dx
        return dw, d_ln_weight, d_ln_bias, dx, dbias, None, None, None, None, None


_apply_layernorm_linear = direct_apply(_LayerNormLinearFunction)  # .apply without its Python layer


class LayerNormLinear(Linear):
    """``y = norm(x) W^T + b``: LayerNorm or RMSNorm (``normalization``) then a Linear, with
    parameters ``layer_norm_weight`` (``layer_norm_bias``), ``weight``, ``bias``. Options as
    Linear, plus ``eps``, ``zero_centered_gamma``, ``return_layernorm_output``."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group=None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable] = None, init_method: Optional[Callable] = None,
                 bias: bool = True, normalization: str = "LayerNorm", return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 return_layernorm_output: bool = False, return_layernorm_output_gathered: bool = False,
                 parameters_split: Optional[Union[Tuple[str, ...], Dict[str, int]]] = None,
                 zero_centered_gamma: bool = False, device: Union[torch.device, str, None] = None,
                 ub_overlap_ag: bool = False, ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, ub_bulk_dgrad: bool = False, ub_name: Optional[str] = None,
                 delay_wgrad_compute: bool = False, symmetric_ar_type: Optional[str] = None,
                 name: Optional[str] = None):
        check_normalization(normalization, "LayerNormLinear")
        super().__init__(in_features, out_features, sequence_parallel=sequence_parallel,
                         fuse_wgrad_accumulation=fuse_wgrad_accumulation, tp_group=tp_group, tp_size=tp_size,
                         get_rng_state_tracker=get_rng_state_tracker, init_method=init_method, bias=bias,
                         return_bias=return_bias, params_dtype=params_dtype, parallel_mode=parallel_mode,
                         parameters_split=parameters_split, device=device, ub_overlap_ag=ub_overlap_ag,
                         ub_overlap_rs=ub_overlap_rs, ub_overlap_rs_dgrad=ub_overlap_rs_dgrad,
                         ub_bulk_dgrad=ub_bulk_dgrad, ub_bulk_wgrad=ub_bulk_wgrad, ub_name=ub_name,
                         delay_wgrad_compute=delay_wgrad_compute, symmetric_ar_type=symmetric_ar_type, name=name)
        if not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"LayerNormLinear: eps must be a number >= 0, got {eps!r}")
        self.eps, self.normalization = float(eps), normalization
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.return_layernorm_output_gathered = bool(return_layernorm_output_gathered)
        make_norm_parameters(self, in_features, normalization, self.zero_centered_gamma, self.params_dtype,
                             self.weight_device, prefix="layer_norm_")
        # Transformer Engine's parameter order: the norm's first.
        order = ["layer_norm_weight", "layer_norm_bias"]
        self._parameters = dict(
            [(k, self._parameters[k]) for k in order] + [(k, v) for k, v in self._parameters.items() if k not in order])

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Linear's initial values (see Linear.reset_parameters), and the norm's: weight
        ones (zeros with zero_centered_gamma), bias zeros."""
        if defer_init:
            return
        super().reset_parameters()
        reset_norm_parameters(self, self.zero_centered_gamma, prefix="layer_norm_")

    @property
    def weight_device(self) -> torch.device:
        return getattr(self, self._weight_names[0]).device

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                fp8_output: bool = False, fp8_grad: bool = False):
        """``fp8_output`` / ``fp8_grad``: the output / the input's gradient as a Float8Tensor,
        under fp8_autocast only (see Linear.forward)."""
        weight, bias = self.check_input_and_parameters(inp, "LayerNormLinear")
        step = self.prepare_forward(inp.device)
        dtype = activation_dtype_of(inp)
        fused_bias = bias if not self.return_bias else None
        result = _apply_layernorm_linear(weight, self.layer_norm_weight, self.layer_norm_bias, inp, fused_bias,
                                         self, step, dtype, is_first_microbatch,
                                         fp8_io(step, fp8_output, fp8_grad) if fp8_output or fp8_grad else None)
        out, ln_out = result if self.return_layernorm_output else (result, None)
        outputs = [out]
        if self.return_bias:
            outputs.append(bias.to(dtype) if bias is not None else None)
        if self.return_layernorm_output:
            outputs.append(ln_out)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalization={self.normalization}, eps={self.eps}"
