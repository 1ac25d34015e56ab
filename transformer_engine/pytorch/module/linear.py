"""te.Linear: y = x W^T + b, in FP8 under fp8_autocast.

The common FP8 step (a plain input and weight, the weight cast each step) is one core
call each way (cpp_extensions/linear_step.py: both casts and the GEMM forward; the
gradient's cast with its bias gradient and both GEMMs backward); every other case goes
through the GEMM layer the three linear modules share (_linear_gemm.py), whose
docstring describes the FP8 casts and layouts.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from transformer_engine.pytorch.cpp_extensions.linear_step import SavedFp8, linear_fp8_backward, linear_fp8_forward
from transformer_engine.pytorch.cpp_extensions.module_ops import CoreDevice, core_device
from transformer_engine.pytorch.tensor import Float8TensorBase
from transformer_engine.pytorch.module._function_apply import direct_apply
from transformer_engine.pytorch.module._fp8_io import (
    GRAD_INPUT_INDEX,
    OUTPUT_INDEX,
    fp8_io,
    role_quantizer,
    to_float8_tensor,
)
from transformer_engine.pytorch.module._linear_gemm import (
    finish_backward,
    fp8_gemm_bias_dtype,
    gemm_out_dtype,
    linear_gemm_backward,
    linear_gemm_forward,
    split_accumulator,
    start_backward,
    to_2d,
    to_shape,
)
from transformer_engine.pytorch.module.base import (
    FP8Step,
    TransformerEngineBaseModule,
    activation_dtype_of,
    check_fp8_dims,
    check_module_input,
    current_scaling_params,
    default_device,
)
from transformer_engine.pytorch.module._split_params import join_rows
from transformer_engine.pytorch.module.wgrad_store import WgradTarget

__all__ = ["Linear"]


def default_init_method(weight: torch.Tensor) -> None:
    """Transformer Engine's default weight init: normal, mean 0, std 0.023."""
    torch.nn.init.normal_(weight, mean=0.0, std=0.023)


def _split_sizes(parameters_split, out_features: int) -> Optional[Dict[str, int]]:
    """parameters_split as an ordered {name: rows}: names from a tuple share dim 0
    equally; trailing underscores are stripped (the parameters end in _weight / _bias)."""
    if parameters_split is None:
        return None
    if isinstance(parameters_split, (tuple, list)):
        if not parameters_split or out_features % len(parameters_split) != 0:
            raise ValueError(f"parameters_split: out_features {out_features} must divide into "
                             f"{len(parameters_split)} equal parts")
        size = out_features // len(parameters_split)
        parameters_split = OrderedDict((name, size) for name in parameters_split)
    elif not isinstance(parameters_split, dict):
        raise TypeError(f"parameters_split must be a tuple of names or a dict of name: size, "
                        f"got {type(parameters_split).__name__}")
    sizes = OrderedDict((str(name).rstrip("_"), int(size)) for name, size in parameters_split.items())
    if sum(sizes.values()) != out_features:
        raise ValueError(f"parameters_split sizes {list(sizes.values())} must add up to out_features {out_features}")
    return sizes


def _one_call_forward(module: "Linear", step: FP8Step, inp: torch.Tensor, weight, bias, dtype: torch.dtype,
                      is_first_microbatch: Optional[bool], fp8_io, need_wgrad: bool, need_dgrad: bool,
                      dev: CoreDevice):
    """The FP8 forward as linear_gemm_forward makes it, in one core call
    (cpp_extensions.linear_step), where that call covers the step: a plain
    high-precision input and weight, the weight cast this step (is_first_microbatch
    None), no FP8 output, and under current scaling the same epsilon and power-of-2 rule
    for input and weight. Returns (out 2-D, saved_x, saved_w), or None where it does
    not apply. The saved copies are one SavedFp8 (in both places where both are saved).
    """
    if not (step.fp8 and fp8_io is None and is_first_microbatch is None and type(inp) is torch.Tensor
            and not isinstance(weight, Float8TensorBase)):
        return None
    if step.delayed:
        state = step.fwd_state
        fp8_dtype, scaling = state.fp8_dtype, {"scale": state.scale_address(0), "amax": state.amax_address(0)}
    else:
        fp8_dtype, epsilon, pow_2 = current_scaling_params(step, True)
        if current_scaling_params(step, True, is_weight=True)[1:] != (epsilon, pow_2):
            return None
        scaling = {"current": (epsilon, pow_2)}
    x = to_2d(inp, weight.shape[1], dtype)
    check_fp8_dims(x, "the input")
    check_fp8_dims(weight, "the weight weight")
    if module._fp8_weight_cache:  # a copy cached by an earlier microbatch is stale now
        module._fp8_weight_cache.pop("weight", None)
    out, saved = linear_fp8_forward(x, weight, bias, fp8_gemm_bias_dtype(dtype, dev), fp8_dtype, need_wgrad,
                                    need_dgrad, dtype, dev, split_accumulator(step, "fp8_gemm_fprop", default=False),
                                    **scaling)
    return out, (saved if need_wgrad else None), (saved if need_dgrad else None)


def _one_call_backward(step: FP8Step, grad_out: torch.Tensor, saved_x, saved_w, weight, dtype: torch.dtype,
                       want_dbias: bool, inp_dtype: torch.dtype, bias_dtype: Optional[torch.dtype],
                       dev: CoreDevice):
    """(dx 2-D, dw, dbias) as linear_gemm_backward gives them, from one core call
    (cpp_extensions.linear_step), for any FP8 forward's backward (it reads the saved FP8
    copies as they are). The caller checks that no other option applies
    (weight-gradient accumulation or deferral, an FP8 input gradient)."""
    dy = to_2d(grad_out, weight.shape[0], dtype)
    if step.delayed:
        state = step.bwd_state
        fp8_dtype, scaling = state.fp8_dtype, {"scale": state.scale_address(0), "amax": state.amax_address(0)}
    else:
        fp8_dtype, epsilon, pow_2 = current_scaling_params(step, False)
        scaling = {"current": (epsilon, pow_2)}
    dx, dw, dbias = linear_fp8_backward(dy, saved_x, saved_w, weight.shape[1], fp8_dtype, want_dbias, bias_dtype,
                                        gemm_out_dtype(inp_dtype, dtype, dev), gemm_out_dtype(weight.dtype, dtype, dev),
                                        dev, split_accumulator(step, "fp8_gemm_dgrad"),
                                        split_accumulator(step, "fp8_gemm_wgrad"), **scaling)
    if dw is not None and dw.dtype != weight.dtype:
        dw = dw.to(weight.dtype)
    return dx, dw, dbias


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight, inp, bias, module: "Linear", step: FP8Step, dtype: torch.dtype,
                is_first_microbatch: Optional[bool], fp8_io: Optional[Tuple[bool, bool]]):
        # fp8_io: (fp8_output, fp8_grad) of an FP8 step, None otherwise.
        fp8_output, fp8_grad = fp8_io or (False, False)
        dev = core_device(inp)
        need_wgrad, need_dgrad = weight.requires_grad, inp.requires_grad
        result = _one_call_forward(module, step, inp, weight, bias, dtype, is_first_microbatch, fp8_io, need_wgrad,
                                   need_dgrad, dev)
        if result is None:
            x = to_2d(inp, weight.shape[1], dtype, keep_fp8=step.fp8)
            result = linear_gemm_forward(module, step, x, weight, bias, dtype, is_first_microbatch, need_wgrad,
                                         need_dgrad, dev, fp8_output=fp8_output)
        out, saved_x, saved_w = result
        # One ctx attribute: each costs a dict store here and a load in the backward.
        ctx.state = (saved_x, saved_w, weight, step, dtype, inp.shape, inp.dtype,
                     bias.dtype if bias is not None else None, module.fuse_wgrad_accumulation, need_wgrad, need_dgrad,
                     module if module.wgrad_store.delay_wgrad_compute else None, fp8_grad)
        if module.fuse_wgrad_accumulation and module._split is not None:
            ctx.weight_parts = module.weight_parts()
        if fp8_output:
            return to_float8_tensor(out, (*inp.shape[:-1], weight.shape[0]), dtype,
                                    role_quantizer(step, OUTPUT_INDEX, True, inp.device))
        if inp.dim() == 2:
            return out
        return out.view(*inp.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out):
        (saved_x, saved_w, weight, step, dtype, inp_shape, inp_dtype, bias_dtype, fuse_wgrad_accumulation,
         need_wgrad, need_dgrad, delaying_module, fp8_grad), ctx.state = ctx.state, None  # saved tensors go with it
        start_backward(step)
        dev = core_device(grad_out)  # the stream of the backward, which may differ from the forward's
        want_dbias = bias_dtype is not None and ctx.needs_input_grad[2]
        if (step.fp8 and type(grad_out) is torch.Tensor and (need_dgrad or need_wgrad)
                and delaying_module is None and not fp8_grad and not (fuse_wgrad_accumulation and need_wgrad)):
            dx, dw, dbias = _one_call_backward(step, grad_out, saved_x, saved_w, weight, dtype, want_dbias,
                                               inp_dtype, bias_dtype, dev)
        else:
            pack = saved_x if type(saved_x) is SavedFp8 else saved_w
            if type(pack) is SavedFp8:  # the one-call forward's copies, as FP8 storage
                saved_x, saved_w = pack.storage()
            dy = to_2d(grad_out, weight.shape[0], dtype, keep_fp8=step.fp8)
            defer_to = delaying_module.wgrad_target(want_dbias) if delaying_module is not None else None
            dx, dw, dbias = linear_gemm_backward(step, dy, saved_x, saved_w, weight, dtype, need_wgrad, need_dgrad,
                                                 fuse_wgrad_accumulation, dev, want_dbias=want_dbias,
                                                 defer_to=defer_to, dgrad_fp8=fp8_grad,
                                                 weight_parts=getattr(ctx, "weight_parts", None),
                                                 dx_dtype=inp_dtype, dbias_dtype=bias_dtype)
            if defer_to is not None:
                delaying_module.wgrad_store.put(defer_to.entry)
        if dbias is not None and dbias.dtype != bias_dtype:
            dbias = dbias.to(bias_dtype)
        finish_backward(step)
        if fp8_grad and dx is not None:
            dx = to_float8_tensor(dx, inp_shape, inp_dtype,
                                  role_quantizer(step, GRAD_INPUT_INDEX, False, weight.device))
        elif dx is not None:
            dx = to_shape(dx, inp_shape)
            dx = dx.to(inp_dtype) if dx.dtype != inp_dtype else dx
        return dw, dx, dbias, None, None, None, None, None


_apply_linear = direct_apply(_LinearFunction)  # .apply without its Python layer


class Linear(TransformerEngineBaseModule):
    """Applies ``y = x W^T + b``; a drop-in replacement for torch.nn.Linear that runs in
    FP8 under ``fp8_autocast`` (see Transformer Engine's documentation for the options).

    ``delay_wgrad_compute=True``: the backward computes the input gradient only and leaves
    the weight-gradient GEMM for ``backward_dw()`` (one call per backward, oldest first),
    which also adds the bias gradient where it comes from that GEMM (high precision; in
    FP8 it comes from the output gradient's cast, in the backward). ``device="meta"``:
    parameters without memory or values until ``to_empty(device=...)`` and
    ``reset_parameters()``."""

    num_fp8_fwd = 3  # input, weight, output (fp8_output)
    num_fp8_bwd = 2  # output gradient, input gradient (fp8_grad)

    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group=None, tp_size: int = 1,
                 get_rng_state_tracker: Optional[Callable] = None, rng_tracker_name: Optional[str] = None,
                 init_method: Optional[Callable] = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: Optional[torch.dtype] = None, parallel_mode: Optional[str] = None,
                 parameters_split: Optional[Union[Tuple[str, ...], Dict[str, int]]] = None,
                 device: Union[torch.device, str, None] = None, ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, ub_name: Optional[str] = None, delay_wgrad_compute: bool = False,
                 symmetric_ar_type: Optional[str] = None, name: Optional[str] = None):
        super().__init__(tp_group=tp_group, tp_size=tp_size, sequence_parallel=sequence_parallel,
                         parallel_mode=parallel_mode, delay_wgrad_compute=delay_wgrad_compute)
        who = type(self).__name__  # LayerNormLinear's errors name LayerNormLinear
        for flag, value in (("ub_overlap_ag", ub_overlap_ag), ("ub_overlap_rs", ub_overlap_rs),
                            ("ub_overlap_rs_dgrad", ub_overlap_rs_dgrad), ("ub_bulk_dgrad", ub_bulk_dgrad),
                            ("ub_bulk_wgrad", ub_bulk_wgrad)):
            if value:
                raise NotImplementedError(f"{who}: {flag}=True is not implemented in OpenTE yet")
        if symmetric_ar_type is not None:
            raise NotImplementedError(f"{who}: symmetric_ar_type is not implemented in OpenTE yet")
        for arg, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{who}: {arg} must be a positive int, got {value!r}")
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bool(bias), bool(return_bias)
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        self.get_rng_state_tracker, self.rng_tracker_name, self.name = get_rng_state_tracker, rng_tracker_name, name
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        if params_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{who}: params_dtype must be float32, float16 or bfloat16, got {params_dtype}")
        device = default_device() if device is None else torch.device(device)
        self.params_dtype = params_dtype
        self.init_method = default_init_method if init_method is None else init_method

        # Made empty, then given their values by reset_parameters (later on the meta device:
        # deferred init, nothing allocated until to_empty). The parts of a split weight
        # (and bias) are consecutive rows of one buffer, which the forward reads whole
        # (_split_params.join_rows).
        self._split = _split_sizes(parameters_split, out_features)
        parts = {"": out_features} if self._split is None else {f"{part}_": rows for part, rows in self._split.items()}
        weight_rows = torch.empty(out_features, in_features, dtype=params_dtype, device=device)
        bias_rows = torch.empty(out_features, dtype=params_dtype, device=device) if self.use_bias else None
        self._weight_names, self._bias_names = [], []
        first = 0
        for part, rows in parts.items():
            self.register_parameter(f"{part}weight", torch.nn.Parameter(weight_rows[first:first + rows]))
            self._weight_names.append(f"{part}weight")
            if self.use_bias:
                self.register_parameter(f"{part}bias", torch.nn.Parameter(bias_rows[first:first + rows]))
                self._bias_names.append(f"{part}bias")
            first += rows
        if self._split is None and not self.use_bias:
            self.bias = None
        # Linear's, not self's: LayerNormLinear's also resets its norm, not made yet here.
        Linear.reset_parameters(self, defer_init=device.type == "meta")
        self.make_fp8_parameters(self._weight_names)
        self.mark_delayed_wgrad_weights(self._weight_names)

    def reset_parameters(self, defer_init: bool = False) -> None:
        """Gives the parameters their initial values: the weight from ``init_method`` (on
        the whole [out_features, in_features] matrix, also when it is split), the bias
        zeros. ``defer_init=True`` does nothing (parameters on the meta device: call this
        after ``to_empty``)."""
        if defer_init:
            return
        self.init_weights(self._weight_names, (self.out_features, self.in_features), self.init_method)
        with torch.no_grad():
            for name in self._bias_names:
                self._parameters[name].zero_()
        self.mark_delayed_wgrad_weights(self._weight_names)  # to_empty may have made new parameters

    # ---- parameters as the GEMM sees them ----
    def _joined(self, names):
        # From _parameters, where nn.Module keeps them (getattr would go through
        # nn.Module.__getattr__, a slower search, on every forward).
        if len(names) == 1:
            return self._parameters[names[0]]
        return join_rows([self._parameters[n] for n in names])

    def weight_parts(self) -> Tuple[torch.nn.Parameter, ...]:
        """The parameters the weight is made of (one unless parameters_split)."""
        return tuple(self._parameters[n] for n in self._weight_names)

    def full_weight(self) -> torch.Tensor:
        return self._joined(self._weight_names)

    def full_bias(self) -> Optional[torch.Tensor]:
        return self._joined(self._bias_names) if self.use_bias else None

    def wgrad_target(self, with_bias: bool) -> WgradTarget:
        """A new entry of the weight-gradient store for one backward (delay_wgrad_compute):
        the weight's parameters, and the bias's when its gradient is wanted."""
        params = self._parameters
        return WgradTarget([], [params[n] for n in self._weight_names],
                           [params[n] for n in self._bias_names] if with_bias else [])

    def check_input_and_parameters(self, inp, owner: str):
        """Checks the input against the layer; returns the (joined) weight and bias."""
        weight, bias = self.full_weight(), self.full_bias()
        check_module_input(owner, inp, self.in_features, "in_features", weight.device)
        return weight, bias

    def forward(self, inp: torch.Tensor, is_first_microbatch: Optional[bool] = None,
                fp8_output: bool = False, fp8_grad: bool = False):
        """``fp8_output``: return the output as a Float8Tensor (cast with the output slot of
        this module's recipe state); ``fp8_grad``: the input's gradient comes back as one
        (the input-gradient slot). Both only under fp8_autocast, ignored outside it."""
        weight, bias = self.check_input_and_parameters(inp, "Linear")
        step = self.prepare_forward(inp.device)
        dtype = activation_dtype_of(inp)
        fused_bias = bias if not self.return_bias else None
        out = _apply_linear(weight, inp, fused_bias, self, step, dtype, is_first_microbatch,
                            fp8_io(step, fp8_output, fp8_grad) if fp8_output or fp8_grad else None)
        if self.return_bias:
            return out, (bias.to(dtype) if bias is not None else None)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}"
