"""The FP8 state of a training step: fp8_autocast, fp8_model_init, and the delayed-scaling
bookkeeping (Transformer Engine 2.x's ``FP8GlobalStateManager``).

How delayed scaling runs, as in Transformer Engine:

* Every FP8 module owns a ``DelayedScalingState`` per direction (forward: its inputs and
  weights; backward: its output gradients): an amax history [history_len, n] whose row 0
  the casts of the current step raise, and the scales [n] those casts use.
* A module's forward registers its forward state with the manager. When the outermost
  ``fp8_autocast`` exits, the manager updates every registered forward state at once:
  the current amaxes are all-reduced (max) over ``fp8_group`` when the recipe says
  ``reduce_amax``, the scales are recomputed from the histories, and the histories roll.
* The backward states register during the backward pass; the backward of the first FP8
  module of the autocast (the last backward to run) updates them the same way. That
  update waits for the next outermost autocast exit and runs in the forward update's
  launch (one launch a step, not two), or earlier when anything is about to read the
  backward scales: the next FP8 module's backward, state_dict, load_state_dict,
  make_graphed_callables (FP8GlobalStateManager.update_backward_states says why).
* te.checkpoint's recomputation casts with the scales its forward used, records no amax
  and updates nothing (fp8_recompute.py).

Every update runs on the device (one fused core launch per device, both FP8 formats in
it, plus one all-reduce when reducing): nothing here makes the host wait for the GPU.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format, Recipe
from transformer_engine import _core
from transformer_engine.pytorch import fp8_recompute
from transformer_engine.pytorch.cpp_extensions import DType, module_ops

__all__ = [
    "FP8GlobalStateManager",
    "DelayedScalingState",
    "check_fp8_support",
    "is_fp8_available",
    "get_default_fp8_recipe",
    "get_fp8_te_dtype",
    "get_fp8_max",
    "fp8_autocast",
    "autocast",
    "fp8_model_init",
]


def check_fp8_support() -> Tuple[bool, str]:
    """Whether FP8 can run here, and why not. A CUDA GPU needs compute capability 8.9 or
    newer (Ada, Hopper) for FP8 GEMMs; without a GPU, OpenTE emulates FP8 on the CPU.
    Asked at every fp8_autocast entry, so answered once per device."""
    if not _cuda_available():
        return True, ""
    return _fp8_support_of_device(torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_available() -> bool:
    # torch.cuda.is_available() reads the environment and asks the driver on every call.
    return torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def _fp8_support_of_device(device: int) -> Tuple[bool, str]:
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= (8, 9):
        return True, ""
    return False, f"FP8 needs compute capability 8.9 or newer; this GPU has {major}.{minor}"


def is_fp8_available(return_reason: bool = False):
    """``check_fp8_support()``'s answer (with its reason when ``return_reason``)."""
    available, reason = check_fp8_support()
    return (available, reason) if return_reason else available


def get_default_fp8_recipe() -> Recipe:
    """The recipe fp8_autocast uses when given none (Transformer Engine's on Hopper)."""
    return DelayedScaling()


def get_fp8_te_dtype(recipe: Recipe, fprop_tensor: bool = True) -> DType:
    """The FP8 format of forward (``fprop_tensor``) or backward tensors under ``recipe``."""
    if recipe.fp8_format == Format.E4M3 or (recipe.fp8_format == Format.HYBRID and fprop_tensor):
        return DType.kFloat8E4M3
    return DType.kFloat8E5M2


def get_fp8_max(recipe: Recipe, fprop_tensor: bool = True) -> float:
    """The largest finite value of that format."""
    helper = recipe.fp8_format.value
    return helper.max_fwd if fprop_tensor else helper.max_bwd


class DelayedScalingState:
    """The delayed-scaling metadata of n FP8 tensors of one module in one direction.

    ``amax_history`` float32 [history_len, n], row 0 the current step (the casts raise it);
    ``scale`` / ``scale_inv`` float32 [n], the scales the next casts use (start at 1).
    """

    def __init__(self, num_tensors: int, recipe: DelayedScaling, forward: bool, device):
        self.forward = forward
        self.recipe = recipe
        self.fp8_format = recipe.fp8_format  # what fp8_dtype was derived from
        self.fp8_dtype = get_fp8_te_dtype(recipe, forward)
        self.amax_history = torch.zeros(recipe.amax_history_len, num_tensors, dtype=torch.float32, device=device)
        self.scale = torch.ones(num_tensors, dtype=torch.float32, device=device)
        self.scale_inv = torch.ones(num_tensors, dtype=torch.float32, device=device)

    @property
    def num_tensors(self) -> int:
        return self.scale.numel()

    def current_amax(self, index: int) -> torch.Tensor:
        """The [1] view of tensor ``index``'s amax for this step (what its cast raises)."""
        return self.amax_history[0, index:index + 1]

    # Addresses for the core calls of the modules' casts: a [1] view costs a microsecond,
    # an address a data_ptr() (the buffers are contiguous float32).
    def scale_address(self, index: int) -> int:
        """The address of tensor ``index``'s scale."""
        return self.scale.data_ptr() + 4 * index

    def amax_address(self, index: int) -> int:
        """The address of tensor ``index``'s amax for this step (row 0 of the history)."""
        return self.amax_history.data_ptr() + 4 * index

    def frozen_copy(self) -> "DelayedScalingState":
        """A state that casts with this one's scales as they are now (copies, queued on the
        current stream before any later update) and raises its amaxes in a scratch row of
        its own: what a recomputation casts with to repeat this step's casts without
        recording their amaxes again (te.checkpoint, LayerNormMLP(checkpoint=True))."""
        copy = DelayedScalingState.__new__(DelayedScalingState)
        copy.forward, copy.recipe = self.forward, self.recipe
        copy.fp8_format, copy.fp8_dtype = self.fp8_format, self.fp8_dtype
        copy.scale = self.scale.clone()
        copy.scale_inv = self.scale_inv.clone()
        copy.amax_history = torch.zeros(1, self.num_tensors, dtype=torch.float32, device=self.scale.device)
        return copy

    def matches(self, recipe: DelayedScaling) -> bool:
        """Whether this state can serve ``recipe`` as is (same history length and format)."""
        if self.amax_history.shape[0] != recipe.amax_history_len:
            return False
        # The format this state was made or adapted for: no format lookup.
        return recipe.fp8_format is self.fp8_format or self.fp8_dtype == get_fp8_te_dtype(recipe, self.forward)

    def adapt_to(self, recipe: DelayedScaling) -> None:
        """Follows a recipe change between steps: the history is cut or zero-padded at its
        old end, the scales are kept."""
        new_len = recipe.amax_history_len
        old = self.amax_history
        if old.shape[0] != new_len:
            history = torch.zeros(new_len, old.shape[1], dtype=old.dtype, device=old.device)
            keep = min(new_len, old.shape[0])
            history[:keep] = old[:keep]
            self.amax_history = history
        self.recipe = recipe
        self.fp8_format = recipe.fp8_format
        self.fp8_dtype = get_fp8_te_dtype(recipe, self.forward)

    def snapshot(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of (amax_history, scale, scale_inv), for restore()."""
        return self.amax_history.clone(), self.scale.clone(), self.scale_inv.clone()

    def restore(self, snapshot: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        """Back to a snapshot(), or to a fresh state's values (no history, scales 1) when
        None; in place, as a CUDA graph holds the buffers' addresses."""
        if snapshot is None:
            self.amax_history.zero_()
            self.scale.fill_(1.0)
            self.scale_inv.fill_(1.0)
            return
        for buffer, saved in zip((self.amax_history, self.scale, self.scale_inv), snapshot):
            buffer.copy_(saved)

    def core_group(self) -> tuple:
        """This state as a group of te_delayed_scaling_update: (history, scale, scale_inv
        addresses, history_len, num_scales, FP8 format); the buffers are contiguous float32.
        Kept between steps while the buffers and the format are the same objects (an
        update at every autocast exit asks for it)."""
        history, scale, scale_inv, fp8_dtype = self.amax_history, self.scale, self.scale_inv, self.fp8_dtype
        cached = self.__dict__.get("_core_group")
        if (cached is not None and cached[0] is history and cached[1] is scale and cached[2] is scale_inv
                and cached[3] is fp8_dtype):
            return cached[4]
        rows, cols = history.shape
        group = history.data_ptr(), scale.data_ptr(), scale_inv.data_ptr(), rows, cols, int(fp8_dtype)
        self._core_group = (history, scale, scale_inv, fp8_dtype, group)
        return group

    def state_tensors(self) -> Dict[str, torch.Tensor]:
        """The buffers, with a deferred backward update applied first (the values as
        Transformer Engine's order of updates has them)."""
        if not self.forward:
            FP8GlobalStateManager.flush_deferred_backward_update()
        return {"amax_history": self.amax_history, "scale": self.scale, "scale_inv": self.scale_inv}

    def load_state_tensors(self, tensors: Dict[str, torch.Tensor]) -> None:
        history = tensors["amax_history"].to(self.scale.device, torch.float32)
        saved = history.shape[1]
        if saved < self.num_tensors:
            # Saved when the module had fewer slots (te.Linear before its output and input-
            # gradient slots): those tensors first, the others start fresh.
            padded = torch.zeros(history.shape[0], self.num_tensors, dtype=torch.float32, device=history.device)
            padded[:, :saved] = history
            history = padded
        if history.shape == self.amax_history.shape:
            # In place: a CUDA graph (make_graphed_callables) holds the buffers' addresses.
            self.amax_history.copy_(history)
        else:
            self.amax_history = history.clone(memory_format=torch.contiguous_format)
        self.scale[:saved].copy_(tensors["scale"])
        self.scale_inv[:saved].copy_(tensors["scale_inv"])


# Whether this PyTorch has torch.distributed at all (fixed for the process; asked at
# every scale update otherwise).
_DISTRIBUTED = torch.distributed.is_available()


def _reduce_current_amaxes(states: List[DelayedScalingState], group) -> None:
    """All-reduces (max) row 0 of every history over ``group`` with one collective."""
    if not (_DISTRIBUTED and torch.distributed.is_initialized()):
        return
    if torch.distributed.get_world_size(group) <= 1:
        return
    flat = torch.cat([s.amax_history[0] for s in states])
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.MAX, group=group)
    offset = 0
    for s in states:
        n = s.num_tensors
        s.amax_history[0].copy_(flat[offset:offset + n])
        offset += n


def _update_with_callables(state: DelayedScalingState, recipe: DelayedScaling) -> None:
    """The recipe's own amax / scale functions, in torch ops (still on the device)."""
    history = state.amax_history
    algo = recipe.amax_compute_algo
    if callable(algo):
        amax = algo(history)
    elif algo == "max":
        amax = history.amax(dim=0)
    else:
        amax = history[0].clone()
    fp8_max = get_fp8_max(recipe, state.forward)
    if recipe.scaling_factor_compute_algo is not None:
        new_scale = recipe.scaling_factor_compute_algo(amax, state.scale, fp8_max, recipe)
    else:
        new_scale = (fp8_max / amax) / (2.0 ** recipe.margin)
        new_scale = torch.where(new_scale.isinf(), torch.full_like(new_scale, torch.finfo(torch.float32).max),
                                new_scale)
        keep = ~(amax > 0) | ~torch.isfinite(amax)
        new_scale = torch.where(keep, state.scale, new_scale)
    state.scale.copy_(new_scale)
    state.scale_inv.copy_(1.0 / state.scale)
    state.amax_history.copy_(torch.roll(history, -1, dims=0))
    state.amax_history[0].zero_()


_AMAX_COMPUTE_ALGOS = {"max": int(_core.AmaxComputeAlgo.MAX), "most_recent": int(_core.AmaxComputeAlgo.MOST_RECENT)}


def _amax_reduction_needed(group) -> bool:
    """Whether _reduce_current_amaxes would all-reduce over ``group`` (None: the world)."""
    return _DISTRIBUTED and torch.distributed.is_initialized() and torch.distributed.get_world_size(group) > 1


def _uses_callables(recipe: DelayedScaling) -> bool:
    return callable(recipe.amax_compute_algo) or recipe.scaling_factor_compute_algo is not None


def update_delayed_scaling(states: List[DelayedScalingState], recipe: DelayedScaling, group=None,
                           reduced_states: Sequence[DelayedScalingState] = ()) -> None:
    """One delayed-scaling step for ``states``: reduce (if the recipe says so), recompute
    the scales from the histories, roll the histories. ``reduced_states`` are updated in
    the same launch without a reduction (a deferred backward update whose amaxes need
    none); the caller makes sure the recipe's rules (margin, algorithm) are theirs too."""
    if not states and not reduced_states:
        return
    if recipe.reduce_amax and states:
        _reduce_current_amaxes(states, group)
    states = list(states) + list(reduced_states)
    if _uses_callables(recipe):
        for s in states:
            _update_with_callables(s, recipe)
        return
    algo = _AMAX_COMPUTE_ALGOS.get(recipe.amax_compute_algo)
    if algo is None:
        raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {recipe.amax_compute_algo!r}")
    # One fused launch per device: each group names its own format (E4M3 / E5M2).
    batches: Dict[int, List[DelayedScalingState]] = {}
    for s in states:
        batches.setdefault(s.scale.get_device(), []).append(s)
    for batch in batches.values():
        module_ops.delayed_scaling_update([s.core_group() for s in batch], float(recipe.margin), algo,
                                          module_ops.core_device(batch[0].scale))


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (torch.cuda.graph)."""
    return _cuda_available() and torch.cuda.is_current_stream_capturing()


def _same_update_rules(a: DelayedScaling, b: DelayedScaling) -> bool:
    """Whether one update launch can serve states of recipes ``a`` and ``b``."""
    return a is b or (a.margin == b.margin and a.amax_compute_algo == b.amax_compute_algo
                      and not _uses_callables(a) and not _uses_callables(b))


class FP8GlobalStateManager:
    """Process-wide FP8 state: whether FP8 is on, with which recipe and group, and the
    delayed-scaling states waiting for their update. Class-level, as in Transformer Engine."""

    FP8_ENABLED = False
    FP8_CALIBRATION = False
    FP8_RECIPE: Optional[Recipe] = None
    FP8_DISTRIBUTED_GROUP = None
    FP8_PARAMETERS = False
    FP8_MODEL_INIT_RECIPE: Optional[Recipe] = None
    HIGH_PRECISION_INIT_VAL = False
    IS_FIRST_FP8_MODULE = False
    FP8_GRAPH_CAPTURING = False
    MAKING_GRAPHS = False  # make_graphed_callables is warming up or capturing: no scale updates
    FP8_AUTOCAST_DEPTH = 0
    AUTOCAST_ID = 0  # counts outermost autocast entries, so modules can tell steps apart
    _forward_states: Dict[int, DelayedScalingState] = {}
    _backward_states: Dict[int, DelayedScalingState] = {}
    _forward_recipe: Optional[DelayedScaling] = None
    _forward_group = None
    # A backward update waiting to share the next forward update's launch (see
    # update_backward_states): its states and their recipe.
    _deferred_backward: List[DelayedScalingState] = []
    _deferred_backward_recipe: Optional[DelayedScaling] = None

    @classmethod
    def reset(cls) -> None:
        """Back to the state of a fresh process (tests use this)."""
        cls.FP8_ENABLED = False
        cls.FP8_CALIBRATION = False
        cls.FP8_RECIPE = None
        cls.FP8_DISTRIBUTED_GROUP = None
        cls.FP8_PARAMETERS = False
        cls.FP8_MODEL_INIT_RECIPE = None
        cls.HIGH_PRECISION_INIT_VAL = False
        cls.IS_FIRST_FP8_MODULE = False
        cls.FP8_GRAPH_CAPTURING = False
        cls.MAKING_GRAPHS = False
        cls.FP8_AUTOCAST_DEPTH = 0
        cls._forward_states = {}
        cls._backward_states = {}
        cls._forward_recipe = None
        cls._forward_group = None
        cls._deferred_backward = []
        cls._deferred_backward_recipe = None
        fp8_recompute.reset()

    # ---- queries ----
    @classmethod
    def is_fp8_available(cls) -> Tuple[bool, str]:
        return check_fp8_support()

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return cls.FP8_ENABLED

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return cls.FP8_CALIBRATION

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return cls.FP8_PARAMETERS

    @classmethod
    def with_high_precision_init_val(cls) -> bool:
        return cls.HIGH_PRECISION_INIT_VAL

    @classmethod
    def get_fp8_recipe(cls) -> Recipe:
        """The recipe of the current autocast (the default recipe outside one)."""
        return cls.FP8_RECIPE if cls.FP8_RECIPE is not None else get_default_fp8_recipe()

    @classmethod
    def get_fp8_group(cls):
        return cls.FP8_DISTRIBUTED_GROUP

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        return cls.FP8_GRAPH_CAPTURING

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        """True for the first FP8 module to run forward in the outermost autocast (and only
        for it: asking clears the flag). Its backward runs last and updates the backward
        scales."""
        first = cls.IS_FIRST_FP8_MODULE
        cls.IS_FIRST_FP8_MODULE = False
        return first

    @classmethod
    def get_fp8_autocast_state(cls) -> tuple:
        return (cls.FP8_ENABLED, cls.FP8_CALIBRATION, cls.FP8_RECIPE, cls.FP8_DISTRIBUTED_GROUP,
                cls.IS_FIRST_FP8_MODULE, cls.FP8_GRAPH_CAPTURING)

    @classmethod
    def set_fp8_autocast_state(cls, state: tuple) -> None:
        (cls.FP8_ENABLED, cls.FP8_CALIBRATION, cls.FP8_RECIPE, cls.FP8_DISTRIBUTED_GROUP,
         cls.IS_FIRST_FP8_MODULE, cls.FP8_GRAPH_CAPTURING) = state

    # ---- autocast ----
    @classmethod
    def fp8_autocast_enter(cls, enabled: bool = False, calibrating: bool = False,
                           fp8_recipe: Optional[Recipe] = None, fp8_group=None, _graph: bool = False) -> None:
        recipe = fp8_recipe
        if enabled or calibrating:
            # Without FP8 the default recipe is not built here (a dataclass with checks, at
            # every entry): get_fp8_recipe() makes one if anything asks.
            if recipe is None:
                recipe = get_default_fp8_recipe()
            check_recipe_supported(recipe)
        if enabled:
            available, reason = check_fp8_support()
            if not available:
                raise RuntimeError(f"fp8_autocast(enabled=True): {reason}")
        if cls.FP8_AUTOCAST_DEPTH == 0:
            cls.IS_FIRST_FP8_MODULE = enabled
            cls.AUTOCAST_ID += 1
        cls.FP8_ENABLED = enabled
        cls.FP8_CALIBRATION = calibrating
        cls.FP8_RECIPE = recipe
        cls.FP8_DISTRIBUTED_GROUP = fp8_group
        cls.FP8_GRAPH_CAPTURING = _graph
        cls.FP8_AUTOCAST_DEPTH += 1

    @classmethod
    def fp8_autocast_exit(cls, enabled: bool, _graph: bool = False) -> None:
        cls.FP8_AUTOCAST_DEPTH -= 1
        # An autocast opened inside te.checkpoint's recomputation repeats one whose update
        # was done at the end of the forward (and its modules registered nothing). One for
        # a graph's capture (_graph) leaves its states to make_graphed_callables.
        if _graph or cls.FP8_AUTOCAST_DEPTH != 0:
            return
        if not (fp8_recompute.FRAMES and fp8_recompute.is_replaying()):
            cls.reduce_and_update_fp8_tensors(forward=True)

    # ---- delayed scaling ----
    @classmethod
    def add_forward_state(cls, state: DelayedScalingState) -> None:
        """Registers a forward state for the update at the outermost autocast exit."""
        cls._forward_states[id(state)] = state
        cls._forward_recipe = cls.FP8_RECIPE
        cls._forward_group = cls.FP8_DISTRIBUTED_GROUP

    @classmethod
    def add_backward_state(cls, state: DelayedScalingState) -> None:
        """Registers a backward state for the update at the end of the backward pass."""
        cls._backward_states[id(state)] = state

    @classmethod
    def take_registered_states(cls) -> Tuple[List[DelayedScalingState], List[DelayedScalingState]]:
        """Removes and returns the (forward, backward) states waiting for their update:
        make_graphed_callables collects those a callable's modules register."""
        states = list(cls._forward_states.values()), list(cls._backward_states.values())
        cls._forward_states, cls._backward_states = {}, {}
        return states

    @classmethod
    def reduce_and_update_fp8_tensors(cls, forward: bool = True, recipe: Optional[DelayedScaling] = None,
                                      group=None) -> None:
        """Updates the registered states of one direction now (see the module docstring),
        and a deferred backward update with them, in the same launch where it can."""
        if forward:
            states, cls._forward_states = list(cls._forward_states.values()), {}
            recipe = recipe or cls._forward_recipe
            group = group if group is not None else cls._forward_group
        else:
            states, cls._backward_states = list(cls._backward_states.values()), {}
        deferred, deferred_recipe = cls._take_deferred_backward(applying=True)
        if not states:
            if deferred:
                update_delayed_scaling([], deferred_recipe, reduced_states=deferred)
            return
        recipe = recipe or states[0].recipe
        if deferred and not _same_update_rules(recipe, deferred_recipe):
            update_delayed_scaling([], deferred_recipe, reduced_states=deferred)
            deferred = []
        update_delayed_scaling(states, recipe, group, reduced_states=deferred)

    @classmethod
    def update_backward_states(cls, recipe: Optional[DelayedScaling] = None) -> None:
        """The end of a backward pass (the backward of the first FP8 module of the
        autocast): the registered backward states get their update.

        It is deferred, so that it shares the next forward update's launch (at the next
        outermost autocast exit): a launch made from autograd's device thread costs an
        eager step more host time than any other op. The scales it writes are read
        only by backward casts, and every backward (flush_deferred_backward_update at
        the start of each FP8 module's backward), state_dict, load_state_dict and
        make_graphed_callables applies a deferred update first, so every cast sees the
        scales Transformer Engine's order gives. Not deferred when the recipe computes
        scales with its own callables, when its amaxes are all-reduced over more than one
        rank (an all-reduce at a later point could pair with another rank's collective),
        or while a CUDA graph is being captured (the captured backward keeps its update,
        so that each replay makes it)."""
        states, cls._backward_states = list(cls._backward_states.values()), {}
        if not states:
            return
        recipe = recipe or states[0].recipe
        cls.flush_deferred_backward_update()
        if (_uses_callables(recipe) or (recipe.reduce_amax and _amax_reduction_needed(None))
                or _capturing()):
            update_delayed_scaling(states, recipe)
            return
        cls._deferred_backward, cls._deferred_backward_recipe = states, recipe

    @classmethod
    def flush_deferred_backward_update(cls) -> None:
        """Applies a deferred backward update now, if there is one (see
        update_backward_states)."""
        if cls._deferred_backward:
            deferred, recipe = cls._take_deferred_backward(applying=True)
            if deferred:
                update_delayed_scaling([], recipe, reduced_states=deferred)

    @classmethod
    def _take_deferred_backward(cls, applying: bool = False
                                ) -> Tuple[List[DelayedScalingState], Optional[DelayedScaling]]:
        """Removes and returns the deferred update. One left by an eager step is not
        applied inside a CUDA graph capture (torch.cuda.graph; make_graphed_callables
        applies it before it captures): every replay would repeat it, on top of the
        update the captured backward makes. It is dropped there, so the capture's first
        update folds that eager step's amaxes into its own (row 0 of each history keeps
        them): the scales lag Transformer Engine's by that one update."""
        taken = cls._deferred_backward, cls._deferred_backward_recipe
        cls._deferred_backward, cls._deferred_backward_recipe = [], None
        if applying and taken[0] and _capturing():
            return [], None
        return taken


def check_recipe_supported(recipe) -> None:
    """The recipes OpenTE carries out: DelayedScaling and Float8CurrentScaling."""
    if isinstance(recipe, (DelayedScaling, Float8CurrentScaling)):
        return
    if isinstance(recipe, Recipe):
        raise NotImplementedError(
            f"fp8_recipe {type(recipe).__name__} is not implemented in OpenTE (DelayedScaling and "
            "Float8CurrentScaling are); block-scaled recipes need Blackwell-style scaling modes")
    raise TypeError(f"fp8_recipe must be a transformer_engine.common.recipe.Recipe, got {type(recipe).__name__}")


@contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe: Optional[Recipe] = None,
                 fp8_group=None, _graph: bool = False):
    """Runs the Transformer Engine modules inside in FP8 (``enabled``) with ``fp8_recipe``
    (DelayedScaling() when None). ``calibrating`` records amaxes and updates scales while
    computing in high precision. ``fp8_group``: the process group over which amaxes are
    all-reduced (DelayedScaling with reduce_amax). Nests; the delayed-scaling forward
    update happens when the outermost one exits."""
    state = FP8GlobalStateManager.get_fp8_autocast_state()
    FP8GlobalStateManager.fp8_autocast_enter(enabled=enabled, calibrating=calibrating, fp8_recipe=fp8_recipe,
                                             fp8_group=fp8_group, _graph=_graph)
    try:
        yield
    finally:
        FP8GlobalStateManager.set_fp8_autocast_state(state)
        FP8GlobalStateManager.fp8_autocast_exit(enabled, _graph=_graph)


@contextmanager
def autocast(enabled: bool = True, calibrating: bool = False, recipe: Optional[Recipe] = None,
             amax_reduction_group=None, _graph: bool = False):
    """Transformer Engine's newer name for fp8_autocast (``recipe``, ``amax_reduction_group``)."""
    with fp8_autocast(enabled=enabled, calibrating=calibrating, fp8_recipe=recipe,
                      fp8_group=amax_reduction_group, _graph=_graph):
        yield


@contextmanager
def fp8_model_init(enabled: bool = True, recipe: Optional[Recipe] = None,
                   preserve_high_precision_init_val: bool = False):
    """Modules created inside keep their weights only in FP8 (as Float8Tensor parameters),
    which saves the high-precision copy's memory. ``preserve_high_precision_init_val``
    keeps the initial high-precision values on the CPU (``param.get_high_precision_init_val()``,
    ``param.clear_high_precision_init_val()``), e.g. to seed an optimizer's master weights."""
    if enabled:
        check_recipe_supported(get_default_fp8_recipe() if recipe is None else recipe)
    saved = (FP8GlobalStateManager.FP8_PARAMETERS, FP8GlobalStateManager.FP8_MODEL_INIT_RECIPE,
             FP8GlobalStateManager.HIGH_PRECISION_INIT_VAL)
    FP8GlobalStateManager.FP8_PARAMETERS = enabled
    FP8GlobalStateManager.FP8_MODEL_INIT_RECIPE = recipe
    FP8GlobalStateManager.HIGH_PRECISION_INIT_VAL = preserve_high_precision_init_val
    try:
        yield
    finally:
        (FP8GlobalStateManager.FP8_PARAMETERS, FP8GlobalStateManager.FP8_MODEL_INIT_RECIPE,
         FP8GlobalStateManager.HIGH_PRECISION_INIT_VAL) = saved
