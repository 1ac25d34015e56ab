"""Random number states for model-parallel regions and activation recomputation.

``CudaRNGStatesTracker`` keeps named RNG states next to the default one: ``fork(name)``
swaps a tracked state in, runs the block, stores the advanced state back and restores the
default state, so dropout inside the block draws from its own stream (Megatron's
"model-parallel-rng") and leaves the default stream untouched.

Each tracked state holds the CPU generator's state and, where CUDA is available, the
current device's CUDA generator state; ``fork`` swaps both. (Transformer Engine tracks
the CUDA state only; tracking the CPU one as well makes the same code reproducible on a
CPU-only machine and for CPU tensors.)

``checkpoint`` recomputes a function's activations in the backward pass and restores, for
the recomputation, the CPU and CUDA generator states, the tracker's states and the FP8
autocast state of the forward, so dropout and FP8 casts repeat exactly. Under delayed
scaling the modules' scales have been updated by then (at the outermost fp8_autocast's
exit): the forward keeps the scales each module cast with and the recomputation casts
with those, records no amax and updates no scale (fp8_recompute.py).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch
from torch.utils.checkpoint import noop_context_fn

from transformer_engine.pytorch import fp8_recompute
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager

__all__ = ["CudaRNGStatesTracker", "checkpoint", "get_distributed_world_size"]

_DEFAULT_TRACKER_NAME = "model-parallel-rng"


def get_distributed_world_size(group=None) -> int:
    """Ranks in ``group`` (the default group when None); 1 without torch.distributed."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return 1
    return torch.distributed.get_world_size(group=group)


@dataclass(frozen=True)
class TrackedRNGState:
    """One tracked stream: the CPU generator state and the CUDA one (None without CUDA)."""

    cpu: torch.Tensor
    cuda: Optional[torch.Tensor]


def _current_rng_state() -> TrackedRNGState:
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return TrackedRNGState(torch.get_rng_state(), cuda)


def _set_rng_state(state: TrackedRNGState) -> None:
    torch.set_rng_state(state.cpu)
    if state.cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state.cuda)


def _as_tracked_state(name: str, value) -> TrackedRNGState:
    """A value given to set_states: one of ours, or a bare generator state tensor (taken as
    the CUDA state where CUDA is available, as Transformer Engine's tracker holds, else as
    the CPU state)."""
    if isinstance(value, TrackedRNGState):
        return value
    if isinstance(value, torch.Tensor):
        if torch.cuda.is_available():
            return TrackedRNGState(torch.get_rng_state(), value)
        return TrackedRNGState(value, None)
    raise TypeError(f"CudaRNGStatesTracker.set_states: the state of {name!r} must be a state from get_states() "
                    f"or an RNG state tensor, got {type(value).__name__}")


class CudaRNGStatesTracker:
    """Named RNG states for model-parallel regions (see the module docstring).

    ``add(name, seed)`` makes a state from a seed; ``fork(name)`` runs a block on it;
    ``get_states`` / ``set_states`` save and restore all of them; ``reset`` forgets them.
    """

    def __init__(self):
        self.states_: Dict[str, TrackedRNGState] = {}
        self.seeds_: set = set()

    def is_initialized(self) -> bool:
        """Whether any state has been added."""
        return bool(self.states_)

    def reset(self) -> None:
        """Forget every tracked state and seed."""
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> Dict[str, TrackedRNGState]:
        """A copy of the name -> state mapping (the states themselves are immutable)."""
        return dict(self.states_)

    def set_states(self, states: Dict[str, Any]) -> None:
        """Replace the tracked states by ``states`` (as returned by get_states)."""
        if not isinstance(states, dict):
            raise TypeError(f"CudaRNGStatesTracker.set_states: states must be a dict, got {type(states).__name__}")
        self.states_ = {name: _as_tracked_state(name, value) for name, value in states.items()}

    def add(self, name: str, seed: int) -> None:
        """Track a new state ``name`` seeded with ``seed``; names and seeds must be new."""
        if not isinstance(name, str):
            raise TypeError(f"CudaRNGStatesTracker.add: name must be a str, got {type(name).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"CudaRNGStatesTracker.add: seed must be an int, got {type(seed).__name__}")
        if seed in self.seeds_:
            raise ValueError(f"CudaRNGStatesTracker.add: seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"CudaRNGStatesTracker.add: cuda rng state {name} already exists")
        self.seeds_.add(seed)
        cpu_generator = torch.Generator()
        cpu_generator.manual_seed(seed)
        cuda_state = None
        if torch.cuda.is_available():
            # Seeding the default generator and taking its state keeps the state's format
            # exactly that of torch.cuda.get_rng_state(); the default state is put back.
            original = torch.cuda.get_rng_state()
            torch.cuda.manual_seed(seed)
            cuda_state = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(original)
        self.states_[name] = TrackedRNGState(cpu_generator.get_state(), cuda_state)

    @contextlib.contextmanager
    def fork(self, name: str = _DEFAULT_TRACKER_NAME):
        """Run the block on state ``name``; its advanced state is kept for the next fork and
        the default state is restored afterwards."""
        if name not in self.states_:
            raise KeyError(f"CudaRNGStatesTracker.fork: cuda rng state {name} is not added")
        original = _current_rng_state()
        _set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = _current_rng_state()
            _set_rng_state(original)


# ---- activation recomputation ----


class _ForwardState:
    """What the recomputation must see again: generator states, tracker states, the FP8
    autocast state, and the delayed-scaling scales the modules cast with (``scales``,
    filled while the forward runs inside ``recording()``)."""

    def __init__(self, get_rng_state_tracker: Optional[Callable]):
        self.rng = _current_rng_state()
        self.tracker = get_rng_state_tracker() if get_rng_state_tracker is not None else None
        self.tracker_states = self.tracker.get_states() if self.tracker is not None else None
        self.fp8_state = FP8GlobalStateManager.get_fp8_autocast_state()
        self.scales = fp8_recompute.ForwardScales()

    def recording(self):
        """Around the forward: the modules inside keep the scales they cast with."""
        return fp8_recompute.recording(self.scales)

    @contextlib.contextmanager
    def restored(self, first_module: bool):
        """Inside: the forward's states, the modules casting with the forward's scales.
        ``first_module``: whether the forward's "first FP8 module" flag comes back too. The
        reentrant recomputation backpropagates through the recomputed modules, so when the
        first FP8 module of the autocast ran inside the function (its no-grad forward took
        the flag), the recomputed one takes it and its backward, the last, updates the
        backward scales. The non-reentrant one only refills the original graph's saved
        tensors: the flag stays with the original forward. Afterwards: the states from
        before, so the recomputation leaves no trace."""
        rng_now = _current_rng_state()
        tracker_now = self.tracker.get_states() if self.tracker is not None else None
        fp8_now = FP8GlobalStateManager.get_fp8_autocast_state()
        _set_rng_state(self.rng)
        if self.tracker is not None:
            self.tracker.set_states(self.tracker_states)
        enabled, calibrating, recipe, group, first, graph = self.fp8_state
        FP8GlobalStateManager.set_fp8_autocast_state(
            (enabled, calibrating, recipe, group, first and first_module, graph))
        try:
            with fp8_recompute.replaying(self.scales):
                yield
        finally:
            _set_rng_state(rng_now)
            if self.tracker is not None:
                self.tracker.set_states(tracker_now)
            FP8GlobalStateManager.set_fp8_autocast_state(fp8_now)


class _CheckpointFunction(torch.autograd.Function):
    """Reentrant recomputation: the forward runs without saving activations; the backward
    runs it again with the forward's states and backpropagates through that."""

    @staticmethod
    def forward(ctx, run_function, get_rng_state_tracker, kwargs, *args):
        ctx.run_function = run_function
        ctx.kwargs = kwargs
        ctx.forward_state = _ForwardState(get_rng_state_tracker)
        with torch.no_grad(), ctx.forward_state.recording():
            outputs = run_function(*args, **kwargs)
        tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        ctx.tensor_positions = tensor_positions
        ctx.plain_args = [None if isinstance(a, torch.Tensor) else a for a in args]
        ctx.save_for_backward(*[args[i] for i in tensor_positions])
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError("checkpoint: reentrant recomputation is not compatible with torch.autograd.grad(); "
                               "use .backward(), or checkpoint(..., use_reentrant=False)")
        args = list(ctx.plain_args)
        for position, saved in zip(ctx.tensor_positions, ctx.saved_tensors):
            args[position] = saved.detach().requires_grad_(saved.requires_grad)
        with ctx.forward_state.restored(first_module=True), torch.enable_grad():
            outputs = ctx.run_function(*args, **ctx.kwargs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs)
                 if isinstance(o, torch.Tensor) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = tuple(a.grad if isinstance(a, torch.Tensor) else None for a in args)
        return (None, None, None) + grads


class _EnteredAfresh:
    """A context manager that may be entered more than once (not at the same time): each
    entry runs a new one made by ``factory``."""

    def __init__(self, factory: Callable):
        self.factory = factory
        self.entered = []

    def __enter__(self):
        context = self.factory()
        result = context.__enter__()
        self.entered.append(context)
        return result

    def __exit__(self, *exc_info):
        return self.entered.pop().__exit__(*exc_info)


def _check_distribute_saved_activations(distribute_saved_activations: bool, tp_group) -> None:
    if distribute_saved_activations and get_distributed_world_size(tp_group) > 1:
        raise NotImplementedError("checkpoint: distribute_saved_activations over a tensor-parallel group of more "
                                  "than one rank is not implemented in OpenTE yet")


def checkpoint(function: Callable, *args, **kwargs):
    """Checkpoint ``function(*args, **kwargs)``: keep only its inputs and recompute its
    activations during the backward pass (Transformer Engine's ``checkpoint``).

    Keyword arguments taken by checkpoint itself (the rest go to ``function``):
    ``distribute_saved_activations`` (bool, default False: a tensor-parallel group of one
    rank makes it a no-op), ``get_rng_state_tracker`` (callable returning the
    CudaRNGStatesTracker whose states are restored for the recomputation), ``tp_group``,
    ``use_reentrant`` (default True), and for ``use_reentrant=False`` the
    torch.utils.checkpoint options ``context_fn``, ``determinism_check``, ``debug``.

    With ``use_reentrant=True`` gradients reach the tensors given positionally and the
    parameters used inside ``function``; tensors in ``kwargs`` are treated as constants.
    """
    use_reentrant = kwargs.pop("use_reentrant", True)
    distribute_saved_activations = kwargs.pop("distribute_saved_activations", False)
    tp_group = kwargs.pop("tp_group", None)
    get_rng_state_tracker = kwargs.pop("get_rng_state_tracker", None)
    context_fn = kwargs.pop("context_fn", noop_context_fn)
    determinism_check = kwargs.pop("determinism_check", "default")
    debug = kwargs.pop("debug", False)

    # The older positional form checkpoint(function, distribute_saved_activations,
    # get_rng_state_tracker, tp_group, *args), still accepted by Transformer Engine.
    if (len(args) >= 3 and isinstance(args[0], bool) and (args[1] is None or callable(args[1]))
            and not isinstance(args[2], torch.Tensor)):
        warnings.warn("checkpoint: passing distribute_saved_activations, get_rng_state_tracker and tp_group "
                      "positionally is deprecated; pass them as keyword arguments", DeprecationWarning,
                      stacklevel=2)
        distribute_saved_activations, get_rng_state_tracker, tp_group = args[:3]
        args = args[3:]

    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    if get_rng_state_tracker is not None and not callable(get_rng_state_tracker):
        raise TypeError("checkpoint: get_rng_state_tracker must be a callable returning a CudaRNGStatesTracker, "
                        f"got {type(get_rng_state_tracker).__name__}")
    _check_distribute_saved_activations(bool(distribute_saved_activations), tp_group)

    if use_reentrant:
        if context_fn is not noop_context_fn:
            raise ValueError("checkpoint: context_fn needs use_reentrant=False")
        return _CheckpointFunction.apply(function, get_rng_state_tracker, kwargs, *args)

    # Non-reentrant: torch.utils.checkpoint restores the generator states of the devices
    # of the tensor arguments; the contexts add the tracker and FP8 states and scales.
    def combined_context_fn():
        forward_context, recompute_context = context_fn()
        forward_state = _ForwardState(get_rng_state_tracker)

        @contextlib.contextmanager
        def forward():
            with forward_context, forward_state.recording():
                yield

        @contextlib.contextmanager
        def recompute():
            with forward_state.restored(first_module=False), recompute_context:
                yield

        # torch enters the recompute context at every recomputation (a second backward
        # with retain_graph recomputes again): a fresh generator each time.
        return forward(), _EnteredAfresh(recompute)

    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=combined_context_fn,
                                             determinism_check=determinism_check, debug=debug, **kwargs)
