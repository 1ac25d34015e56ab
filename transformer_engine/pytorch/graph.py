"""te.make_graphed_callables: the forward and backward passes of modules (or functions)
captured as CUDA graphs, FP8 included.

Why: at small sizes a training step costs what the host does (Python, checks, launches:
benchmarks/bench_host_overhead.py), not what the GPU does. A graph replays the kernels of a
whole forward, or a whole backward, with one launch and almost no Python.

How (the scheme of torch.cuda.make_graphed_callables, with Transformer Engine's FP8 and
keyword-argument handling):
1. Warm-up: each callable runs ``num_warmup_iters`` forward and backward passes eagerly on
   a side stream, so that lazy set-up (workspaces, cuBLASLt plans, kernel attributes)
   happens outside the capture.
2. Capture: the forwards in the order given, then the backwards in reverse order, into
   graphs that share one memory pool (the order they replay in, so that no replay
   overwrites memory a later one still reads).
3. Replay: a graphed callable copies its arguments into the captured inputs (unless they
   are the same tensors), replays the forward graph and returns the captured outputs; its
   backward copies the incoming gradients in, replays the backward graph and hands the
   captured gradients to autograd (parameters' included, so ``.grad`` fills as usual).
   The outputs of one call are overwritten by the next, as with any CUDA graph.

FP8: warm-up and capture run inside ``fp8_autocast(enabled=fp8_enabled, ..., _graph=True)``.
The casts and GEMMs are captured with the addresses of the modules' scale and amax buffers;
the delayed-scaling updates are not captured (a _graph autocast leaves its states alone,
and no backward updates while graphs are made). At replay, inside the caller's
``fp8_autocast``, the graphed forward registers its modules' forward states for the update
at that autocast's exit, and the backward of the first graphed callable updates the
backward states, as an eager step does; outside an FP8 autocast the graphs still compute in
FP8 with the scales as they are. The warm-up's and capture's amaxes are discarded: every
module's FP8 metadata is put back as it was before.

Not carried out (NotImplementedError): ``fp8_weight_caching`` (one graph would have to skip
the weights' casts on later microbatches), ``_order`` (pipeline-parallel interleaving) and
modules with ``delay_wgrad_compute`` (their weight gradients run outside the backward).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from transformer_engine.common.recipe import Recipe
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager, fp8_autocast
from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

__all__ = ["make_graphed_callables"]


def _as_tuple(value, name: str) -> Tuple[tuple, bool]:
    """(value as a tuple, whether it was one)."""
    if isinstance(value, tuple):
        return value, True
    if isinstance(value, list):
        raise TypeError(f"make_graphed_callables: {name} must be a tuple (or a single item), got a list")
    return (value,), False


def _te_modules(callables) -> List[TransformerEngineBaseModule]:
    found = []
    for func in callables:
        if isinstance(func, torch.nn.Module):
            found.extend(m for m in func.modules() if isinstance(m, TransformerEngineBaseModule))
    return found


@contextlib.contextmanager
def _capturing(graph: torch.cuda.CUDAGraph, pool):
    """torch.cuda.graph with Python's cyclic garbage collector held off: a collection
    during the capture may destroy an older graph (graphed callables sit in reference
    cycles), and a graph destroyed while another is captured invalidates the capture."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            yield
    finally:
        if collecting:
            gc.enable()


def _check_inputs(where: str, flat: List[Any]) -> None:
    for position, value in enumerate(flat):
        if isinstance(value, torch.Tensor) and not value.is_cuda:
            raise ValueError(f"make_graphed_callables: {where}, tensor {position}, is on {value.device}; "
                             "CUDA graphs need CUDA tensors")


class _CapturedPass:
    """What one callable's graphs were captured with: the static inputs (arguments,
    keyword values, then the module's parameters), the static outputs and gradients, and
    the delayed-scaling states its FP8 modules registered."""

    def __init__(self, func, args: tuple, kwargs: dict):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.kwargs_keys = tuple(kwargs.keys())
        flat_args, _ = tree_flatten(args)
        flat_kwargs, _ = tree_flatten([kwargs[key] for key in self.kwargs_keys])
        self.num_user_inputs = len(flat_args) + len(flat_kwargs)
        params = tuple(func.parameters()) if isinstance(func, torch.nn.Module) else ()
        self.inputs = tuple(flat_args) + tuple(flat_kwargs) + params
        self.fwd_graph = torch.cuda.CUDAGraph()
        self.bwd_graph = torch.cuda.CUDAGraph()
        self.outputs: Tuple[Any, ...] = ()  # flat, tensors and others
        self.output_spec = None
        self.tensor_output_positions: Tuple[int, ...] = ()
        self.grad_outputs: Tuple[Optional[torch.Tensor], ...] = ()  # one per tensor output
        self.grad_inputs: Tuple[Optional[torch.Tensor], ...] = ()  # one per input
        self.has_backward = False
        self.fwd_states: list = []
        self.bwd_states: list = []

    def grad_targets(self) -> Tuple[torch.Tensor, ...]:
        return tuple(i for i in self.inputs if isinstance(i, torch.Tensor) and i.requires_grad)

    def call(self, fp8_args: dict):
        with fp8_autocast(_graph=True, **fp8_args):
            return self.func(*self.args, **self.kwargs)

    def differentiable_outputs(self, outputs) -> Tuple[torch.Tensor, ...]:
        return tuple(o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad)


def make_graphed_callables(modules, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           sample_kwargs=None, fp8_enabled: bool = False, fp8_calibrating: bool = False,
                           fp8_recipe: Optional[Recipe] = None, fp8_group=None, fp8_weight_caching: bool = False,
                           _order: Optional[List[int]] = None, pool=None, retain_graph_in_backward: bool = False):
    """CUDA-graphed versions of ``modules`` (a module or function, or a tuple of them),
    captured with ``sample_args`` (a tuple of arguments, or a tuple of such tuples, one per
    callable) and ``sample_kwargs`` (a dict, or a tuple of dicts). Returns one graphed
    callable, or a tuple of them. A graphed module's own ``forward`` is replaced too; it
    runs eagerly again when the module's ``training`` flag differs from the one it was
    captured with. Later calls must pass tensors of the captured shapes, dtypes and
    devices, and the same non-tensor values. ``fp8_enabled``, ``fp8_calibrating``,
    ``fp8_recipe``, ``fp8_group``: the fp8_autocast the passes are captured in (see the
    module docstring for how FP8 scaling updates happen at replay). ``pool``: a memory pool
    (torch.cuda.graph_pool_handle()) to share with other graphs; ``retain_graph_in_backward``
    keeps the captured backward's autograd graph."""
    if fp8_weight_caching:
        raise NotImplementedError("make_graphed_callables: fp8_weight_caching=True is not implemented in OpenTE "
                                  "yet (the graphs would have to skip the weights' FP8 casts after the first "
                                  "microbatch)")
    if _order is not None:
        raise NotImplementedError("make_graphed_callables: _order (pipeline-parallel interleaving of the "
                                  "captures) is not implemented in OpenTE yet")
    if isinstance(num_warmup_iters, bool) or not isinstance(num_warmup_iters, int) or num_warmup_iters < 0:
        raise ValueError(f"make_graphed_callables: num_warmup_iters must be an int >= 0, got {num_warmup_iters!r}")
    callables, given_tuple = _as_tuple(modules, "modules")
    if not given_tuple:
        sample_args = (sample_args,)
        sample_kwargs = (sample_kwargs,) if sample_kwargs is not None else None
    if not isinstance(sample_args, tuple) or len(sample_args) != len(callables):
        raise TypeError(f"make_graphed_callables: sample_args must be a tuple of {len(callables)} argument "
                        f"tuple(s), one per callable")
    if sample_kwargs is None:
        sample_kwargs = tuple({} for _ in callables)
    if not isinstance(sample_kwargs, tuple) or len(sample_kwargs) != len(callables):
        raise TypeError(f"make_graphed_callables: sample_kwargs must be a tuple of {len(callables)} dict(s)")
    for i, (func, args, kwargs) in enumerate(zip(callables, sample_args, sample_kwargs)):
        if not callable(func):
            raise TypeError(f"make_graphed_callables: modules[{i}] is not callable ({type(func).__name__})")
        if not isinstance(args, tuple):
            raise TypeError(f"make_graphed_callables: sample_args[{i}] must be a tuple of arguments, "
                            f"got {type(args).__name__}")
        if not isinstance(kwargs, dict):
            raise TypeError(f"make_graphed_callables: sample_kwargs[{i}] must be a dict, got {type(kwargs).__name__}")
    te_modules = _te_modules(callables)
    for m in te_modules:
        if m.wgrad_store.delay_wgrad_compute:
            raise NotImplementedError(f"make_graphed_callables: {type(m).__name__} with delay_wgrad_compute=True "
                                      "is not implemented in OpenTE yet (its wgrad GEMMs run outside the backward)")
    if not torch.cuda.is_available():
        raise RuntimeError("make_graphed_callables: CUDA graphs need a CUDA device, and none is available")

    passes = [_CapturedPass(func, args, kwargs) for func, args, kwargs in zip(callables, sample_args, sample_kwargs)]
    for i, captured in enumerate(passes):
        _check_inputs(f"the inputs of callable {i}", list(captured.inputs))
    fp8_args = dict(enabled=fp8_enabled, calibrating=fp8_calibrating, fp8_recipe=fp8_recipe, fp8_group=fp8_group)
    training = torch.is_grad_enabled()
    FP8GlobalStateManager.flush_deferred_backward_update()  # an eager step's, before the states are saved
    saved_fp8 = _snapshot_fp8_states(te_modules)
    mempool = torch.cuda.graph_pool_handle() if pool is None else pool

    manager = FP8GlobalStateManager
    manager.take_registered_states()  # whatever eager steps left waiting is not ours to keep
    gc.collect()  # older graphs in reference cycles go now, not during a capture
    manager.MAKING_GRAPHS = True
    try:
        _warm_up(passes, num_warmup_iters, fp8_args, training, allow_unused_input)
        for captured in passes:  # forwards in order
            with _capturing(captured.fwd_graph, mempool):
                outputs = captured.call(fp8_args)
            flat, captured.output_spec = tree_flatten(outputs)
            captured.outputs = tuple(flat)
            captured.tensor_output_positions = tuple(i for i, o in enumerate(flat) if isinstance(o, torch.Tensor))
            captured.fwd_states = manager.take_registered_states()[0]
        for captured in reversed(passes):  # backwards in reverse order
            tensor_outputs = [captured.outputs[i] for i in captured.tensor_output_positions]
            captured.grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in tensor_outputs)
            targets = captured.grad_targets()
            grads: Tuple[Optional[torch.Tensor], ...] = ()
            if training and targets and captured.differentiable_outputs(tensor_outputs):
                with _capturing(captured.bwd_graph, mempool):
                    grads = torch.autograd.grad(
                        outputs=captured.differentiable_outputs(tensor_outputs),
                        inputs=targets,
                        grad_outputs=tuple(g for g in captured.grad_outputs if g is not None),
                        only_inputs=True, allow_unused=allow_unused_input, retain_graph=retain_graph_in_backward)
            captured.bwd_states = manager.take_registered_states()[1]
            # Detached, the outputs no longer hold the captured autograd graph, whose
            # AccumulateGrad nodes (of the capture's stream) autograd would otherwise reuse
            # for the parameters at replay, with a stream synchronisation each time.
            captured.outputs = tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in captured.outputs)
            grad_iter = iter(grads)
            captured.grad_inputs = tuple(
                (next(grad_iter, None) if grads else None)
                if isinstance(i, torch.Tensor) and i.requires_grad else None for i in captured.inputs)
            captured.has_backward = bool(grads)
    finally:
        manager.MAKING_GRAPHS = False
        torch.cuda.synchronize()
        _restore_fp8_states(te_modules, saved_fp8)
        manager.take_registered_states()
    graphed = tuple(_graphed_callable(captured) for captured in passes)
    return graphed if given_tuple else graphed[0]


def _warm_up(passes: List[_CapturedPass], iters: int, fp8_args: dict, training: bool, allow_unused: bool) -> None:
    """``iters`` eager forward and backward passes of each callable on a side stream."""
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for captured in passes:
            for _ in range(iters):
                flat, _ = tree_flatten(captured.call(fp8_args))
                outputs = captured.differentiable_outputs(flat)
                targets = captured.grad_targets()
                if training and outputs and targets:
                    torch.autograd.grad(outputs=outputs, inputs=targets,
                                        grad_outputs=tuple(torch.zeros_like(o) for o in outputs),
                                        only_inputs=True, allow_unused=allow_unused)
                del flat, outputs
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    FP8GlobalStateManager.take_registered_states()


def _snapshot_fp8_states(te_modules):
    """Each module's delayed-scaling states as they are (None: not made yet)."""
    return [(m._fwd_state.snapshot() if m._fwd_state is not None else None,
             m._bwd_state.snapshot() if m._bwd_state is not None else None) for m in te_modules]


def _restore_fp8_states(te_modules, saved) -> None:
    for m, (fwd, bwd) in zip(te_modules, saved):
        if m._fwd_state is not None:
            m._fwd_state.restore(fwd)
        if m._bwd_state is not None:
            m._bwd_state.restore(bwd)


def _graphed_callable(captured: _CapturedPass) -> Callable:
    """The replaying callable of one captured pass (and, for a module, its new forward)."""
    static_inputs = captured.inputs
    num_user_inputs = captured.num_user_inputs
    static_outputs = tuple(captured.outputs[i] for i in captured.tensor_output_positions)
    grad_outputs, grad_inputs = captured.grad_outputs, captured.grad_inputs
    fwd_graph, bwd_graph = captured.fwd_graph, captured.bwd_graph
    fwd_states, bwd_states = captured.fwd_states, captured.bwd_states
    has_backward = captured.has_backward
    manager = FP8GlobalStateManager

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            # The update of the backward scales is the first graphed callable's to do
            # (its backward runs last), as the first FP8 module's is in an eager step.
            ctx.update_bwd_recipe = None
            if fwd_states and manager.is_fp8_enabled():
                for state in fwd_states:
                    manager.add_forward_state(state)
                if manager.is_first_fp8_module():
                    ctx.update_bwd_recipe = manager.get_fp8_recipe()
            for i in range(num_user_inputs):
                static, new = static_inputs[i], inputs[i]
                if isinstance(static, torch.Tensor) and static.data_ptr() != new.data_ptr():
                    static.copy_(new)
            fwd_graph.replay()
            return tuple(o.detach() for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            if not has_backward:
                raise RuntimeError("make_graphed_callables: this callable was captured without a backward pass "
                                   "(under torch.no_grad, or with no input or parameter requiring grad)")
            for static, grad in zip(grad_outputs, grads):
                if static is not None and static.data_ptr() != grad.data_ptr():
                    static.copy_(grad)
            if bwd_states:
                manager.flush_deferred_backward_update()  # the captured casts read the backward scales
            bwd_graph.replay()
            if bwd_states:
                for state in bwd_states:
                    manager.add_backward_state(state)
                if ctx.update_bwd_recipe is not None:
                    manager.update_backward_states(ctx.update_bwd_recipe)
            # The captured buffers themselves, not detached views: autograd would take a
            # view over as a leaf's .grad (nothing else holds the view), and the next replay
            # would overwrite that .grad; it copies a tensor something else still holds.
            return grad_inputs

    kwargs_keys = captured.kwargs_keys
    module_params = static_inputs[num_user_inputs:]
    flat_outputs = list(captured.outputs)
    tensor_positions = captured.tensor_output_positions
    output_spec = captured.output_spec

    def graphed(*args, **kwargs):
        flat_args, _ = tree_flatten(args)
        if kwargs_keys or kwargs:
            if set(kwargs) != set(kwargs_keys):
                raise TypeError(f"graphed callable: captured with keyword arguments {sorted(kwargs_keys)}, "
                                f"called with {sorted(kwargs)}")
            flat_args = flat_args + tree_flatten([kwargs[key] for key in kwargs_keys])[0]
        _check_replay_inputs(flat_args, static_inputs, num_user_inputs)
        outputs = Graphed.apply(*flat_args, *module_params)
        if len(outputs) == len(flat_outputs):
            return tree_unflatten(list(outputs), output_spec)
        flat = list(flat_outputs)  # non-tensor outputs come back as captured
        for position, value in zip(tensor_positions, outputs):
            flat[position] = value
        return tree_unflatten(flat, output_spec)

    func = captured.func
    if isinstance(func, torch.nn.Module):
        eager_forward, captured_training = func.forward, func.training

        def forward(*args, **kwargs):
            if func.training != captured_training:
                return eager_forward(*args, **kwargs)
            return graphed(*args, **kwargs)

        func.forward = forward
    return graphed


def _check_replay_inputs(flat_args: List[Any], static_inputs: tuple, num_user_inputs: int) -> None:
    """The call's flattened arguments against the captured ones: as many, tensors of the
    same shape, dtype and device, other values equal (the graph baked them in)."""
    if len(flat_args) != num_user_inputs:
        raise TypeError(f"graphed callable: captured with {num_user_inputs} argument values, called with "
                        f"{len(flat_args)}")
    for position, (new, static) in enumerate(zip(flat_args, static_inputs)):
        if isinstance(static, torch.Tensor):
            if not isinstance(new, torch.Tensor):
                raise TypeError(f"graphed callable: argument {position} must be a tensor, got {type(new).__name__}")
            if new.shape != static.shape or new.dtype != static.dtype or new.device != static.device:
                raise ValueError(f"graphed callable: argument {position} must match the captured tensor "
                                 f"({tuple(static.shape)}, {static.dtype}, {static.device}), got "
                                 f"({tuple(new.shape)}, {new.dtype}, {new.device})")
        elif new != static:
            raise ValueError(f"graphed callable: argument {position} was {static!r} when captured, got {new!r}")
