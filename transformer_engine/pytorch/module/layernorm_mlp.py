"""te.LayerNormMLP: norm -> fc1 -> activation -> fc2, the transformer block's MLP.

Under FP8 every producer writes the FP8 its consumer reads: the norm kernel casts its
output (delayed scaling), the activation kernel writes fc2's FP8 input with its amax,
and the backward casts each gradient once, in both layouts, for the two GEMMs that read it.

FP8 metadata: forward tensors 0 norm output, 1 fc1 weight, 2 activation output, 3 fc2
weight; backward tensors 0 fc2's output gradient, 1 fc1's output gradient.

checkpoint=True (selective activation recompute): the forward keeps only its input and
the FP8 weights; the backward runs norm -> fc1 -> activation again with the forward's
scales, so it sees the same tensors as without recompute.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import CoreDevice, Fp8Output, core_device
from transformer_engine.pytorch.module._function_apply import direct_apply
from transformer_engine.pytorch.module._norm import (
    check_normalization,
    make_norm_parameters,
    norm_backward,
    reset_norm_parameters,
)
from transformer_engine.pytorch.module.base import (
    FP8Step,
    TransformerEngineBaseModule,
    activation_dtype_of,
    cast_to_fp8,
    check_module_input,
    current_scaling_params,
    default_device,
)
from transformer_engine.pytorch.module.layernorm_linear import norm_then_maybe_fp8
from transformer_engine.pytorch.module._linear_gemm import (
    finish_backward,
    gemm_bias,
    linear_gemm_backward,
    linear_gemm_forward,
    start_backward,
    to_2d,
    to_shape,
)
from transformer_engine.pytorch.module.linear import default_init_method
from transformer_engine.pytorch.module.wgrad_store import WgradTarget
from transformer_engine.pytorch.tensor import Float8TensorBase

__all__ = ["LayerNormMLP"]

_A = _core.Activation
# name: (the core's activation kind, gated)
ACTIVATIONS = {
    "gelu": (int(_A.GELU), False),
    "qgelu": (int(_A.QGELU), False),
    "relu": (int(_A.RELU), False),
    "srelu": (int(_A.SRELU), False),
    "silu": (int(_A.SILU), False),
    "geglu": (int(_A.GEGLU), True),
    "qgeglu": (int(_A.QGEGLU), True),
    "reglu": (int(_A.REGLU), True),
    "sreglu": (int(_A.SREGLU), True),
    "swiglu": (int(_A.SWIGLU), True),
}


def activation_forward(step: FP8Step, activation: str, fc1_out: torch.Tensor, need_wgrad: bool, dev: CoreDevice):
    """(high-precision output or None, FP8 output or None) of the activation as fc2's input
    (forward tensor 2). Delayed scaling: the kernel writes FP8 with the state's scale and
    raises its amax; current scaling needs the amax first, so it casts afterwards, from the
    amax the kernel took of what it wrote where the output is larger than one block's cast
    (module_ops.FusedAmax: one read of it fewer)."""
    kind, gated = ACTIVATIONS[activation]
    if step.fp8 and step.delayed:
        state = step.fwd_state
        fp8 = Fp8Output(state.fp8_dtype, state.scale_address(2), state.amax_address(2), need_wgrad)
        return None, module_ops.activation_forward(kind, gated, fc1_out, dev, fp8)
    if step.fp8 and fc1_out.numel() // (2 if gated else 1) > module_ops.FUSED_AMAX_MIN_ELEMENTS:
        fused = module_ops.FusedAmax(fc1_out.device)
        act_out = module_ops.activation_forward(kind, gated, fc1_out, dev, amax=fused.address)
        fp8_dtype, epsilon, power_2_scale = current_scaling_params(step, forward=True)
        return None, fused.quantize(act_out, fp8_dtype, epsilon, power_2_scale, True, need_wgrad, dev)
    act_out = module_ops.activation_forward(kind, gated, fc1_out, dev)
    if step.fp8:
        return None, cast_to_fp8(act_out, step, 2, dev, rowwise=True, columnwise=need_wgrad)
    return act_out, None


def activation_backward(step: FP8Step, activation: str, d_act: torch.Tensor, fc1_out: torch.Tensor,
                        want_dbias: bool, dev: CoreDevice, dbias_dtype: Optional[torch.dtype] = None):
    """(high-precision dx or None, FP8 dx or None, fc1's bias gradient or None) from the
    activation output's gradient. Delayed scaling: one kernel computes the activation
    gradient, its column sums (fc1's bias gradient) and the FP8 cast in both layouts
    (backward tensor 1), reading d_act and fc1_out once. Current scaling (whose cast needs
    dx's amax first): past one block's cast, the kernel takes the amax of the dx it writes
    and the cast (with the bias gradient) follows from it (module_ops.FusedAmax); a small dx
    is returned alone, and fc1's backward sums it with its cast (bias_with_the_cast).
    ``dbias_dtype``: fc1's bias dtype (float32: the kernel's fp32 sums)."""
    kind = ACTIVATIONS[activation][0]
    if step.fp8 and step.delayed:
        state = step.bwd_state
        fp8 = Fp8Output(state.fp8_dtype, state.scale_address(1), state.amax_address(1), True)
        dbias, dx_fp8 = module_ops.dact_dbias_quantize(kind, d_act, fc1_out, fp8, want_dbias, dev, dbias_dtype)
        return None, dx_fp8, dbias
    if step.fp8 and fc1_out.numel() > module_ops.FUSED_AMAX_MIN_ELEMENTS:
        fused = module_ops.FusedAmax(fc1_out.device)
        dx = module_ops.activation_backward(kind, d_act, fc1_out, dev, amax=fused.address)
        fp8_dtype, epsilon, power_2_scale = current_scaling_params(step, forward=False)
        if want_dbias:
            dbias, dx_fp8 = fused.dbias_quantize(dx, fp8_dtype, epsilon, power_2_scale, True, True, dev, dbias_dtype)
            return None, dx_fp8, dbias
        return None, fused.quantize(dx, fp8_dtype, epsilon, power_2_scale, True, True, dev), None
    dx = module_ops.activation_backward(kind, d_act, fc1_out, dev)
    if bias_with_the_cast(step):
        return dx, None, None
    return dx, None, (dx.sum(0) if want_dbias else None)


def bias_with_the_cast(step: FP8Step) -> bool:
    """Whether fc1's bias gradient comes from the cast of fc1's output gradient (current
    scaling: te_dbias_cast_transpose_current_scaling) rather than from the activation."""
    return step.fp8 and not step.delayed


def norm_fc1_activation(module: "LayerNormMLP", step: FP8Step, x: torch.Tensor, ln_weight, ln_bias, fc1_weight, b1,
                        dtype: torch.dtype, is_first_microbatch: Optional[bool], w1_grad: bool, w2_grad: bool,
                        dev: CoreDevice, w1_fp8: Optional[Float8TensorBase] = None):
    """The first half of the forward on the 2-D input ``x``: (norm output in high precision
    or None, mu, rsigma, fc1's saved input, fc1's saved weight, fc1_out, activation output
    in high precision or None, in FP8 or None). ``w1_fp8``: fc1's FP8 weight as already cast."""
    ln_out, ln_fp8, mu, rsigma = norm_then_maybe_fp8(
        step, module.normalization, x, ln_weight, ln_bias, module.eps, module.zero_centered_gamma,
        module.return_layernorm_output, w1_grad, dev)
    fc1_out, saved_ln, saved_w1 = linear_gemm_forward(module, step, ln_out, fc1_weight, b1, dtype,
                                                      is_first_microbatch, w1_grad, True, dev, x_fp8=ln_fp8,
                                                      weight_name="fc1_weight", index=0, w_fp8=w1_fp8)
    act_out, act_fp8 = activation_forward(step, module.activation, fc1_out, w2_grad, dev)
    return ln_out, mu, rsigma, saved_ln, saved_w1, fc1_out, act_out, act_fp8


def _recompute(ctx, x: torch.Tensor, saved_w1, dev: CoreDevice):
    """checkpoint=True: norm -> fc1 -> activation again from the saved input, with the
    forward's FP8 weights and scales, so the backward reads the same tensors as without
    checkpointing. Returns (mu, rsigma, fc1's saved input, fc1_out, fc2's saved input)."""
    ln_bias, b1, scales = ctx.recompute
    module, step = ctx.module, ctx.step
    ln_weight, fc1_weight, fc2_weight = ctx.weights
    rstep = step._replace(calibrating=False)  # no amax recording either: the forward did it
    if scales is not None:
        rstep = rstep._replace(fwd_state=scales)
    w1_grad, w2_grad = fc1_weight.requires_grad, fc2_weight.requires_grad
    _, mu, rsigma, saved_ln, _, fc1_out, act_out, act_fp8 = norm_fc1_activation(
        module, rstep, x, ln_weight, ln_bias, fc1_weight, b1, ctx.dtype, None, w1_grad, w2_grad, dev,
        w1_fp8=saved_w1 if step.fp8 else None)
    saved_act = (act_fp8 if step.fp8 else act_out) if w2_grad else None
    return mu, rsigma, saved_ln, fc1_out, saved_act


class _LayerNormMLPFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, inp,
                module: "LayerNormMLP", step: FP8Step, dtype: torch.dtype, is_first_microbatch: Optional[bool]):
        dev = core_device(inp)
        x = to_2d(inp, module.hidden_size, dtype)
        w1_grad, w2_grad = fc1_weight.requires_grad, fc2_weight.requires_grad
        w1_fp8 = w2_fp8 = None
        group = None
        if step.fp8:  # both weights' casts and the biases' conversions in one core call (one launch when small)
            group = module_ops.QuantizeGroup(dev)
            w1_fp8 = module.fp8_weight("fc1_weight", fc1_weight, step, 1, is_first_microbatch, True, dev,
                                       group=group)
            w2_fp8 = module.fp8_weight("fc2_weight", fc2_weight, step, 3, is_first_microbatch, True, dev,
                                       group=group)
        b1, b2 = gemm_bias(fc1_bias, dtype, step.fp8, dev, group), gemm_bias(fc2_bias, dtype, step.fp8, dev, group)
        if group is not None:
            group.run()
        ln_out, mu, rsigma, saved_ln, saved_w1, fc1_out, act_out, act_fp8 = norm_fc1_activation(
            module, step, x, ln_weight, ln_bias, fc1_weight, b1, dtype, is_first_microbatch, w1_grad, w2_grad, dev,
            w1_fp8=w1_fp8)
        out, saved_act, saved_w2 = linear_gemm_forward(module, step, act_out, fc2_weight, b2, dtype,
                                                       is_first_microbatch, w2_grad, True, dev, x_fp8=act_fp8,
                                                       weight_name="fc2_weight", index=2, w_fp8=w2_fp8)
        if module.checkpoint:
            # Only what the backward needs to run norm -> fc1 -> activation again: the input,
            # the FP8 weights as cast (the same operands; fc2's is its dgrad operand anyway)
            # and the scales of this step. The activations go when this forward returns.
            ctx.saved = (x, None, None, None, saved_w1, None, None, saved_w2)
            # The scales as a frozen copy (te.checkpoint keeps them so too): the autocast's
            # exit may update the state's first, and the recompute records no amax again.
            ctx.recompute = (ln_bias, b1, step.fwd_state.frozen_copy() if step.fp8 and step.delayed else None)
        else:
            ctx.saved = (x, mu, rsigma, saved_ln, saved_w1, fc1_out, saved_act, saved_w2)
            ctx.recompute = None
        ctx.weights = (ln_weight, fc1_weight, fc2_weight)
        ctx.bias_dtypes = (fc1_bias.dtype if fc1_bias is not None else None,
                           fc2_bias.dtype if fc2_bias is not None else None)
        ctx.module, ctx.step, ctx.dtype = module, step, dtype
        ctx.inp_shape, ctx.inp_dtype = inp.shape, inp.dtype
        out = to_shape(out, inp.shape)
        if module.return_layernorm_output:
            return out, to_shape(ln_out, inp.shape)
        return out

    @staticmethod
    def backward(ctx, grad_out, grad_ln_out=None):
        (x, mu, rsigma, saved_ln, saved_w1, fc1_out, saved_act, saved_w2), ctx.saved = ctx.saved, None
        module, step, dtype = ctx.module, ctx.step, ctx.dtype
        ln_weight, fc1_weight, fc2_weight = ctx.weights
        b1_dtype, b2_dtype = ctx.bias_dtypes
        fuse = module.fuse_wgrad_accumulation
        start_backward(step)
        dev = core_device(grad_out)
        if ctx.recompute is not None:
            mu, rsigma, saved_ln, fc1_out, saved_act = _recompute(ctx, x, saved_w1, dev)
        ctx.recompute = None
        dy = to_2d(grad_out, module.hidden_size, dtype, keep_fp8=step.fp8)
        want_b2 = b2_dtype is not None and ctx.needs_input_grad[5]
        want_b1 = b1_dtype is not None and ctx.needs_input_grad[3]
        fc2_target = fc1_target = None
        if module.wgrad_store.delay_wgrad_compute:
            # One entry for both GEMMs; fc1's bias gradient comes from the activation's backward.
            entry = []
            fc2_target = WgradTarget(entry, [fc2_weight], [module.fc2_bias] if want_b2 else [])
            fc1_target = WgradTarget(entry, [fc1_weight], [])
        d_act, d_w2, d_b2 = linear_gemm_backward(step, dy, saved_act, saved_w2, fc2_weight, dtype,
                                                 fc2_weight.requires_grad, True, fuse, dev, index=0,
                                                 want_dbias=want_b2, defer_to=fc2_target, dbias_dtype=b2_dtype)
        d_fc1_out, d_fc1_fp8, d_b1 = activation_backward(step, module.activation, d_act, fc1_out, want_b1, dev,
                                                         b1_dtype)
        b1_with_cast = want_b1 and d_fc1_fp8 is None and bias_with_the_cast(step)
        d_ln_out, d_w1, d_b1_cast = linear_gemm_backward(step, d_fc1_out, saved_ln, saved_w1, fc1_weight, dtype,
                                                         fc1_weight.requires_grad, True, fuse, dev, index=1,
                                                         dy_fp8=d_fc1_fp8, defer_to=fc1_target,
                                                         want_dbias=b1_with_cast, dbias_dtype=b1_dtype)
        if b1_with_cast:
            d_b1 = d_b1_cast
        if fc2_target is not None:
            module.wgrad_store.put(fc2_target.entry)
        d_b1 = d_b1.to(b1_dtype) if d_b1 is not None else None
        d_b2 = d_b2.to(b2_dtype) if d_b2 is not None else None
        if grad_ln_out is not None:
            d_ln_out = d_ln_out + to_2d(grad_ln_out, module.hidden_size, dtype)
        dx, d_ln_w, d_ln_b = norm_backward(module.normalization, d_ln_out.contiguous(), x, mu, rsigma, ln_weight,
                                           module.zero_centered_gamma, dev)
        finish_backward(step)
        dx = to_shape(dx, ctx.inp_shape)
        dx = dx.to(ctx.inp_dtype) if dx.dtype != ctx.inp_dtype else dx
        return d_ln_w, d_ln_b, d_w1, d_b1, d_w2, d_b2, dx, None, None, None, None


_apply_layernorm_mlp = direct_apply(_LayerNormMLPFunction)  # .apply without its Python layer


class LayerNormMLP(TransformerEngineBaseModule):
    """``fc2(act(fc1(norm(x))))``. Parameters ``layer_norm_weight`` (``layer_norm_bias``),
    ``fc1_weight`` [ffn_hidden_size (x2 for gated activations), hidden_size], ``fc1_bias``,
    ``fc2_weight`` [hidden_size, ffn_hidden_size], ``fc2_bias``. ``activation``: gelu, qgelu,
    relu, srelu, silu, geglu, qgeglu, reglu, sreglu, swiglu. ``delay_wgrad_compute`` and
    ``device="meta"`` as in Linear (fc1's bias gradient, from the activation's backward,
    is never delayed)."""

    num_fp8_fwd = 4
    num_fp8_bwd = 2

    def __init__(self, hidden_size: int, ffn_hidden_size: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 return_bias: bool = False, get_rng_state_tracker: Optional[Callable] = None, tp_group=None,
                 tp_size: int = 1, init_method: Optional[Callable] = None, bias: bool = True,
                 normalization: str = "LayerNorm", activation: str = "gelu",
                 output_layer_init_method: Optional[Callable] = None, fuse_wgrad_accumulation: bool = False,
                 params_dtype: Optional[torch.dtype] = None, return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False, seq_length: Optional[int] = None,
                 micro_batch_size: Optional[int] = None, set_parallel_mode: bool = False,
                 zero_centered_gamma: bool = False, device: Union[torch.device, str, None] = None,
                 ub_overlap_ag: bool = False, name: Optional[str] = None, ub_overlap_rs: bool = False,
                 ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 delay_wgrad_compute: bool = False, symmetric_ar_type: Optional[str] = None,
                 activation_params: Optional[dict] = None, checkpoint: bool = False):
        super().__init__(tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel,
                         parallel_mode="column" if set_parallel_mode else None,
                         delay_wgrad_compute=delay_wgrad_compute)
        for flag, value in (("ub_overlap_ag", ub_overlap_ag), ("ub_overlap_rs", ub_overlap_rs),
                            ("ub_overlap_rs_dgrad", ub_overlap_rs_dgrad), ("ub_bulk_dgrad", ub_bulk_dgrad),
                            ("ub_bulk_wgrad", ub_bulk_wgrad)):
            if value:
                raise NotImplementedError(f"LayerNormMLP: {flag}=True is not implemented in OpenTE yet")
        if symmetric_ar_type is not None:
            raise NotImplementedError("LayerNormMLP: symmetric_ar_type is not implemented in OpenTE yet")
        if activation_params:
            # Transformer Engine reads them only for activation="clamped_swiglu" (its limit and alpha).
            raise NotImplementedError("LayerNormMLP: activation_params (the limit and alpha of "
                                      "activation='clamped_swiglu') is not implemented: OpenTE has no "
                                      f"clamped_swiglu activation (got activation_params={activation_params!r})")
        check_normalization(normalization, "LayerNormMLP")
        if activation not in ACTIVATIONS:
            raise ValueError(f"LayerNormMLP: activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        for arg, value in (("hidden_size", hidden_size), ("ffn_hidden_size", ffn_hidden_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"LayerNormMLP: {arg} must be a positive int, got {value!r}")
        if not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"LayerNormMLP: eps must be a number >= 0, got {eps!r}")
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        if params_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"LayerNormMLP: params_dtype must be float32, float16 or bfloat16, got {params_dtype}")
        device = default_device() if device is None else torch.device(device)
        self.hidden_size, self.ffn_hidden_size, self.eps = hidden_size, ffn_hidden_size, float(eps)
        self.normalization, self.activation = normalization, activation
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        self.return_layernorm_output = bool(return_layernorm_output)
        self.return_layernorm_output_gathered = bool(return_layernorm_output_gathered)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.checkpoint = bool(checkpoint)  # recompute norm -> fc1 -> activation in the backward
        self.get_rng_state_tracker, self.name = get_rng_state_tracker, name
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size
        self.params_dtype = params_dtype

        make_norm_parameters(self, hidden_size, normalization, self.zero_centered_gamma, params_dtype, device,
                             prefix="layer_norm_")
        fc1_rows = ffn_hidden_size * (2 if ACTIVATIONS[activation][1] else 1)
        self.init_method = default_init_method if init_method is None else init_method
        self.output_layer_init_method = (self.init_method if output_layer_init_method is None
                                         else output_layer_init_method)
        # Made empty, then given their values by reset_parameters (later on the meta device).
        for prefix, shape in (("fc1", (fc1_rows, hidden_size)), ("fc2", (hidden_size, ffn_hidden_size))):
            self.register_parameter(f"{prefix}_weight",
                                    torch.nn.Parameter(torch.empty(shape, dtype=params_dtype, device=device)))
            bias_value = torch.empty(shape[0], dtype=params_dtype, device=device) if self.use_bias else None
            self.register_parameter(f"{prefix}_bias", torch.nn.Parameter(bias_value) if self.use_bias else None)
        self.reset_parameters(defer_init=device.type == "meta")
        self.make_fp8_parameters(["fc1_weight", "fc2_weight"])
        self.mark_delayed_wgrad_weights(["fc1_weight", "fc2_weight"])

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Gives the parameters their initial values: the norm's weight ones (zeros with
        zero_centered_gamma) and bias zeros, fc1_weight from ``init_method``, fc2_weight
        from ``output_layer_init_method``, the biases zeros. ``defer_init=True`` does
        nothing (parameters on the meta device: call this after ``to_empty``)."""
        if defer_init:
            return
        reset_norm_parameters(self, self.zero_centered_gamma, prefix="layer_norm_")
        for prefix, init in (("fc1", self.init_method), ("fc2", self.output_layer_init_method)):
            weight = self._parameters[f"{prefix}_weight"]
            self.init_weights([f"{prefix}_weight"], weight.shape, init)
            if self.use_bias:
                with torch.no_grad():
                    self._parameters[f"{prefix}_bias"].zero_()
        self.mark_delayed_wgrad_weights(["fc1_weight", "fc2_weight"])  # to_empty may have made new parameters

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None):
        check_module_input("LayerNormMLP", inp, self.hidden_size, "hidden_size", self.fc1_weight.device)
        step = self.prepare_forward(inp.device)
        dtype = activation_dtype_of(inp)
        fc2_bias = self.fc2_bias if not self.return_bias else None
        result = _apply_layernorm_mlp(self.layer_norm_weight, self.layer_norm_bias, self.fc1_weight,
                                      self.fc1_bias, self.fc2_weight, fc2_bias, inp, self, step, dtype,
                                      is_first_microbatch)
        out, ln_out = result if self.return_layernorm_output else (result, None)
        outputs = [out]
        if self.return_bias:
            outputs.append(self.fc2_bias.to(dtype) if self.fc2_bias is not None else None)
        if self.return_layernorm_output:
            outputs.append(ln_out)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ffn_hidden_size={self.ffn_hidden_size}, "
                f"activation={self.activation}, normalization={self.normalization}")
