"""What every Transformer Engine module shares: reading the FP8 state at the start of a
forward, its delayed-scaling metadata (saved in the module's extra state), FP8 casts by
the recipe, the GEMM workspace, the checks of the (not yet implemented) tensor- and
sequence-parallel options, the weights' initial values (for reset_parameters) and the
weight gradients left for later (delay_wgrad_compute: backward_dw)."""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

import torch

from transformer_engine.common.recipe import DelayedScaling, Recipe
from transformer_engine.pytorch import fp8_recompute
from transformer_engine.pytorch.cpp_extensions import compute_amax, module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import CoreDevice
from transformer_engine.pytorch.fp8 import (
    DelayedScalingState,
    FP8GlobalStateManager,
    get_default_fp8_recipe,
    get_fp8_te_dtype,
)
from transformer_engine.pytorch.module.wgrad_store import WeightGradStore, accumulate_grad
from transformer_engine.pytorch.tensor import Float8CurrentScalingQuantizer, Float8TensorBase

__all__ = ["TransformerEngineBaseModule", "FP8Step", "get_workspace", "default_device", "activation_dtype_of",
           "check_module_input"]


def get_workspace(device: torch.device) -> Optional[torch.Tensor]:
    """cuBLASLt's scratch for GEMMs on ``device``, allocated once per device (None on the CPU)."""
    if device.type != "cuda":
        return None
    return module_ops.cuda_workspace(device.index if device.index is not None else torch.cuda.current_device())[0]


def default_device() -> torch.device:
    """Where parameters go when a module is given no device: the GPU when there is one."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def activation_dtype_of(inp: torch.Tensor) -> torch.dtype:
    """The dtype a module computes in: an enclosing torch.autocast's, else the input's."""
    # is_cuda / is_cpu: no torch.device object built
    device_type = "cuda" if inp.is_cuda else "cpu" if inp.is_cpu else inp.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return inp.dtype


def check_module_input(owner: str, inp, size: int, size_name: str, param_device: torch.device) -> None:
    """The checks every module makes of its input: a float32/16/bf16 tensor whose last
    dimension is ``size`` (named ``size_name``), on the parameters' device."""
    if not isinstance(inp, torch.Tensor):
        raise TypeError(f"{owner}: inp must be a torch.Tensor, got {type(inp).__name__}")
    if inp.dim() == 0 or inp.shape[-1] != size:
        raise ValueError(f"{owner}: inp's last dimension must be {size_name}={size}, got shape {tuple(inp.shape)}")
    if inp.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{owner}: inp must be float32, float16 or bfloat16, got {inp.dtype}")
    if inp.device != param_device:
        raise ValueError(f"{owner}: inp is on {inp.device} but the parameters are on {param_device}")


class FP8Step(NamedTuple):
    """How one forward (and its backward) runs: in FP8 or not, and with what."""

    fp8: bool  # casts to FP8 and FP8 GEMMs
    calibrating: bool  # high precision, but amaxes recorded for delayed scaling
    recipe: Optional[Recipe]
    fwd_state: Optional[DelayedScalingState]  # delayed scaling only
    bwd_state: Optional[DelayedScalingState]
    first_module: bool  # this module's backward updates the backward scales
    delayed: bool = False  # the recipe is DelayedScaling (asked once here, not at every cast)


_NO_FP8_STEP = FP8Step(False, False, None, None, None, False)


class TransformerEngineBaseModule(torch.nn.Module):
    """Base of Linear, LayerNormLinear, LayerNormMLP, LayerNorm-free FP8 modules.

    A subclass says how many tensors it casts in each direction (``num_fp8_fwd`` inputs,
    weights and outputs, ``num_fp8_bwd`` gradients) and calls ``prepare_forward`` first
    thing in its forward.
    """

    num_fp8_fwd = 0
    num_fp8_bwd = 0

    def __init__(self, *, tp_group=None, tp_size: int = 1, sequence_parallel: bool = False,
                 parallel_mode: Optional[str] = None, delay_wgrad_compute: bool = False):
        super().__init__()
        if parallel_mode not in (None, "column", "row", "Column", "Row"):
            raise ValueError(f"parallel_mode must be None, 'column' or 'row', got {parallel_mode!r}")
        self.parallel_mode = parallel_mode.lower() if parallel_mode else None
        self.sequence_parallel = bool(sequence_parallel)
        self.tp_size = int(tp_size)
        self.tp_group = None
        self.set_tensor_parallel_group(tp_group)
        self._fwd_state: Optional[DelayedScalingState] = None
        self._bwd_state: Optional[DelayedScalingState] = None
        self._pending_extra_state: Optional[dict] = None
        self._fp8_weight_cache: Dict[str, Float8TensorBase] = {}
        self.fp8 = False
        self.fp8_calibration = False
        self.wgrad_store = WeightGradStore(delay_wgrad_compute)
        self.wgrad_accumulation_and_reduce_hooks = []

    # ---- parallelism (accepted; communication arrives with its own issue) ----
    def set_tensor_parallel_group(self, tp_group) -> None:
        """Sets the tensor-parallel group. A group of more than one rank is refused until
        OpenTE implements tensor / sequence parallel communication."""
        size = self.tp_size
        if tp_group is not None:
            size = torch.distributed.get_world_size(tp_group)
        if size > 1:
            raise NotImplementedError(
                f"{type(self).__name__}: tensor parallelism (tp_size / tp_group of {size} ranks) is not "
                "implemented in OpenTE yet; use tp_size=1")
        self.tp_group = tp_group

    # ---- delay_wgrad_compute: the weight gradients of a backward, computed later ----
    def need_backward_dw(self) -> bool:
        """Whether this module's backward leaves its weight gradients to ``backward_dw``
        (``delay_wgrad_compute=True``)."""
        return self.wgrad_store.delay_wgrad_compute

    def backward_dw(self) -> None:
        """Runs the weight-gradient GEMMs that the oldest backward still waiting for them
        left (``delay_wgrad_compute=True``) and adds their results to the weights' (and
        the biases') ``.grad``, or into ``main_grad`` with ``fuse_wgrad_accumulation``, as
        that backward would have; then calls the hooks registered with
        ``register_wgrad_accumulation_and_reduce_hooks``. Does nothing when no backward
        is waiting."""
        entry = self.wgrad_store.pop()
        if entry is None:
            return
        with torch.no_grad():
            for deferred in entry:
                dw, dbias = deferred.compute()
                accumulate_grad(deferred.weights, dw)
                accumulate_grad(deferred.biases, dbias)
        for hook in self.wgrad_accumulation_and_reduce_hooks:
            hook()

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """``hook()`` runs at the end of each ``backward_dw`` that had a backward's work to
        do (a data-parallel gradient reduction, say: the weights' autograd hooks do not
        fire for the gradients that backward_dw adds)."""
        self.wgrad_accumulation_and_reduce_hooks.append(hook)

    # ---- FP8 state of a forward ----
    def prepare_forward(self, device: torch.device) -> FP8Step:
        """Reads the autocast state and readies the delayed-scaling metadata. In
        te.checkpoint's recomputation the forward state of the step is a frozen copy of the
        one the original forward cast with (fp8_recompute.py)."""
        manager = FP8GlobalStateManager
        fp8, calibrating = manager.is_fp8_enabled(), manager.is_fp8_calibration()
        # nn.Module.__setattr__ takes microseconds (it looks for parameters and submodules
        # of the name): the attributes below are assigned only when they change.
        if self.fp8 != fp8 or self.fp8_calibration != calibrating:
            self.fp8, self.fp8_calibration = fp8, calibrating
        if not (fp8 or calibrating):
            return _NO_FP8_STEP
        recipe = manager.get_fp8_recipe()
        fwd_state = bwd_state = None
        delayed = isinstance(recipe, DelayedScaling)
        if delayed:
            fwd_state = self._state(True, recipe, device)
            bwd_state = self._state(False, recipe, device)
            replayed = False
            if fp8_recompute.FRAMES:  # inside te.checkpoint: keep, or cast with, the forward's scales
                fwd_state, replayed = fp8_recompute.forward_state_for(self, fwd_state)
            if not replayed:
                manager.add_forward_state(fwd_state)
        first = manager.is_first_fp8_module() if fp8 else False
        return FP8Step(fp8, calibrating and not fp8, recipe, fwd_state, bwd_state, first, delayed)

    def _state(self, forward: bool, recipe: DelayedScaling, device: torch.device) -> DelayedScalingState:
        state = self._fwd_state if forward else self._bwd_state
        if state is not None and state.scale.device == device:
            if not state.matches(recipe):
                state.adapt_to(recipe)
            state.recipe = recipe
            return state
        state = DelayedScalingState(self.num_fp8_fwd if forward else self.num_fp8_bwd, recipe, forward, device)
        if self._pending_extra_state is not None:
            saved = self._pending_extra_state.get("fwd" if forward else "bwd")
            if saved is not None:
                state.load_state_tensors(saved)
        if forward:
            self._fwd_state = state
        else:
            self._bwd_state = state
        return state

    def fp8_weight(self, name: str, weight: torch.Tensor, step: FP8Step, index: int,
                   is_first_microbatch: Optional[bool], columnwise: bool, dev: CoreDevice,
                   group: Optional[module_ops.QuantizeGroup] = None) -> Float8TensorBase:
        """The FP8 copy of weight ``name`` (forward tensor ``index``) for this step: cast now
        when is_first_microbatch is None or True, or the copy cast on the first microbatch
        when it is False (the weights have not changed since, so the cast is skipped). A
        cast joins ``group`` when given (queued by the caller's ``group.run()``).
        Called inside an autograd.Function's forward (no graph is recorded there)."""
        if isinstance(weight, Float8TensorBase):  # an FP8 parameter (fp8_model_init): already cast
            if columnwise:
                weight.update_usage(columnwise_usage=True)
            return weight
        cache = self._fp8_weight_cache
        if is_first_microbatch is False:
            cached = cache.get(name)
            if cached is not None:
                return cached
        # Cast from the parameter's own dtype (fp32 parameters under torch.autocast
        # included), as Transformer Engine does: no converted copy first (a launch, and
        # a second rounding). A group takes casts of any input dtype in one launch.
        check_fp8_dims(weight, f"the weight {name}")
        w_fp8 = cast_to_fp8(weight, step, index, dev, is_weight=True, rowwise=True,
                            columnwise=columnwise or is_first_microbatch is not None, group=group)
        if is_first_microbatch is None:
            if cache:
                cache.pop(name, None)
        else:
            cache[name] = w_fp8
        return w_fp8

    def init_weights(self, names, shape, init_method: Callable[[torch.Tensor], None]) -> None:
        """Runs ``init_method`` on a weight of ``shape`` whose rows are the parameters
        ``names`` stacked (one parameter, or the parts of a split one), and writes the
        values into them; an FP8 parameter (fp8_model_init) is quantized from them."""
        params = [self._parameters[name] for name in names]
        if len(params) == 1 and not isinstance(params[0], Float8TensorBase):
            init_method(params[0].data)  # in place: no second copy of a large weight
            return
        value = torch.empty(shape, dtype=self.params_dtype, device=params[0].device)
        init_method(value)
        offset = 0
        with torch.no_grad():
            for param in params:
                part = value[offset:offset + param.shape[0]]
                if isinstance(param, Float8TensorBase):
                    param.quantize_(part)
                    if getattr(param, "_high_precision_init_val", None) is not None:
                        _keep_high_precision_init_val(param, part)
                else:
                    param.copy_(part)
                offset += param.shape[0]

    def mark_delayed_wgrad_weights(self, names) -> None:
        """Under delay_wgrad_compute, flags the weights ``names`` with
        ``skip_backward_post_hook`` (Transformer Engine's attribute, read by Megatron-style
        gradient hooks): backward_dw, not autograd, produces their gradients."""
        if self.wgrad_store.delay_wgrad_compute:
            for name in names:
                self._parameters[name].skip_backward_post_hook = True

    def make_fp8_parameters(self, names) -> None:
        """Under fp8_model_init, replaces the parameters ``names`` by Float8Tensor parameters
        holding only FP8 data (cast with current scaling from each weight's own amax, in
        the forward format of the model-init recipe). The optimizer's updates re-quantize
        them in place."""
        manager = FP8GlobalStateManager
        if not manager.with_fp8_parameters():
            return
        if any(self._parameters[name].is_meta for name in names):
            raise NotImplementedError(f"{type(self).__name__}: device='meta' (deferred init) together with "
                                      "fp8_model_init is not implemented in OpenTE yet")
        recipe = manager.FP8_MODEL_INIT_RECIPE or get_default_fp8_recipe()
        fp8_dtype = get_fp8_te_dtype(recipe, True)
        for name in names:
            param = getattr(self, name)
            value = param.detach()
            # Row-wise only: the transposed copy is made by the first forward that needs it.
            quantizer = Float8CurrentScalingQuantizer(fp8_dtype, value.device, rowwise=True, columnwise=False)
            fp8_param = torch.nn.Parameter(quantizer(value), requires_grad=param.requires_grad)
            if manager.with_high_precision_init_val():
                _keep_high_precision_init_val(fp8_param, value)
            setattr(self, name, fp8_param)

    # ---- extra state: the FP8 metadata travels with state_dict ----
    def get_extra_state(self) -> dict:
        FP8GlobalStateManager.flush_deferred_backward_update()  # the scales as Transformer Engine's order has them
        extra = {}
        for key, state in (("fwd", self._fwd_state), ("bwd", self._bwd_state)):
            if state is not None:
                extra[key] = {k: v.detach().clone() for k, v in state.state_tensors().items()}
        return extra

    def set_extra_state(self, state) -> None:
        if state is None or (isinstance(state, torch.Tensor) and state.numel() == 0):
            return
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}: extra state must be the dict get_extra_state returns, "
                            f"got {type(state).__name__}")
        FP8GlobalStateManager.flush_deferred_backward_update()  # not to be applied over the loaded values
        for key in ("fwd", "bwd"):
            current = self._fwd_state if key == "fwd" else self._bwd_state
            if key in state and current is not None:
                current.load_state_tensors(state[key])
        # States not made yet (no FP8 forward so far) take theirs when they are.
        self._pending_extra_state = state


def cast_to_fp8(x: torch.Tensor, step: FP8Step, index: int, dev: CoreDevice, *, forward: bool = True,
                is_weight: bool = False, rowwise: bool = True, columnwise: bool = False,
                group: Optional[module_ops.QuantizeGroup] = None) -> Float8TensorBase:
    """``x`` (2-D, contiguous) in FP8 by the step's recipe, as tensor ``index`` of its
    direction's metadata. Delayed scaling uses the state's scale and raises its current
    amax in the same pass; current scaling computes amax and scale first (both on the
    device, queued by the same core call). With ``group`` the cast joins it and is
    queued by its ``run()`` (the caller's, before the result is read)."""
    if step.delayed:
        state = step.fwd_state if forward else step.bwd_state
        if group is not None:
            return group.add(x, state.fp8_dtype, state.scale_address(index), state.amax_address(index), rowwise,
                             columnwise)
        return module_ops.quantize(x, state.fp8_dtype, state.scale_address(index), state.amax_address(index),
                                   rowwise, columnwise, dev)
    fp8_dtype, epsilon, power_2_scale = current_scaling_params(step, forward, is_weight)
    if group is not None:
        return group.add_current_scaling(x, fp8_dtype, epsilon, power_2_scale, rowwise, columnwise)
    return module_ops.quantize_current_scaling(x, fp8_dtype, epsilon, power_2_scale, rowwise, columnwise, dev)


def current_scaling_params(step: FP8Step, forward: bool, is_weight: bool = False):
    """(FP8 format, amax epsilon, power-of-2 scales) of a current-scaling cast in the
    step's recipe: the weight's, an input's or (backward) a gradient's."""
    recipe = step.recipe
    qparams = (recipe.fp8_quant_bwd_grad if not forward
               else recipe.fp8_quant_fwd_weight if is_weight else recipe.fp8_quant_fwd_inp)
    return get_fp8_te_dtype(recipe, forward), qparams.amax_epsilon, qparams.power_2_scale


def check_fp8_dims(x: torch.Tensor, name: str) -> None:
    """Transformer Engine's documented rule for FP8 GEMM operands: both dimensions
    divisible by 16. (Its code checks rows by 8 only, but the weight-gradient GEMM reads
    the transposed input, whose leading dimension is the row count, and cuBLASLt's FP8
    GEMM needs those 16-byte aligned: 8 or 24 rows passed that check and failed in the
    GEMM.) The same rule on the CPU, so a model that runs there runs on the GPU."""
    rows, cols = x.shape
    if rows % 16 or cols % 16:
        raise ValueError(f"FP8 execution needs {name} as a 2-D matrix with both dimensions divisible by 16 "
                         f"(rows: the product of the leading dimensions), got [{rows}, {cols}] (pad the input, "
                         "e.g. the sequence length, or run this layer outside fp8_autocast)")


def record_amax(x: torch.Tensor, step: FP8Step, forward: bool, index: int) -> None:
    """Calibration: raise the delayed-scaling amax of tensor ``index`` without casting."""
    state = step.fwd_state if forward else step.bwd_state
    if state is not None:
        compute_amax(x, state.current_amax(index))


def _keep_high_precision_init_val(param: torch.nn.Parameter, value: torch.Tensor) -> None:
    """fp8_model_init(preserve_high_precision_init_val=True): the initial value stays on the
    CPU, reachable as ``param.get_high_precision_init_val()`` until
    ``param.clear_high_precision_init_val()`` frees it."""
    param._high_precision_init_val = value.to("cpu", copy=True)

    def get_high_precision_init_val():
        return param._high_precision_init_val

    def clear_high_precision_init_val():
        param._high_precision_init_val = None

    param.get_high_precision_init_val = get_high_precision_init_val
    param.clear_high_precision_init_val = clear_high_precision_init_val
