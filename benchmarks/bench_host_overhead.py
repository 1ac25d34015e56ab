"""Host (CPU-side) time of a training step of tiny Transformer Engine modules against the
plain PyTorch layers they replace, without FP8 and in FP8 (delayed and current scaling),
side by side in one run.

    python3 benchmarks/bench_host_overhead.py                  # the GPU when there is one
    python3 benchmarks/bench_host_overhead.py --device cpu     # no GPU needed
    python3 benchmarks/bench_host_overhead.py --split          # + where te.Linear's backward time goes
    python3 benchmarks/bench_host_overhead.py --dtype bfloat16 --eager-only   # bf16 parameters and input
    python3 benchmarks/bench_host_overhead.py --count          # + GPU operations and allocations per step

On a GPU a second table times the same steps with the modules CUDA-graphed
(te.make_graphed_callables, and torch.cuda.make_graphed_callables for the PyTorch layers),
against the eager PyTorch step.

A step is ``with te.fp8_autocast(...): y = module(x)`` then ``y.backward(grad)`` on a tiny
input ([16, 64] by default), so the kernels take a few microseconds and the host's work
(Python, checks, descriptors, allocations, launches) is what is measured. Every module
runs inside te.fp8_autocast (enabled=False for the PyTorch layers), as bench_modules.py
does. Times: the fastest of alternating rounds (drift hits every case alike, and on a
shared machine the least disturbed round is the best estimate of the work itself; the
median moved by up to 50% between runs on a busy 2-core machine, the minimum by a few
percent).

On a GPU the wall time per step is the host time: kernels run asynchronously, the queue
is drained at the end of each round. On the CPU the core's reference kernels would run
inline, and at these sizes they take longer than the Python around them (the reference
GEMM is a plain loop), so by default (``--core stub``) every kernel-running function of
``transformer_engine._core`` is replaced by a no-op while timing: what remains is the host
work of the modules, the same code on both devices (the outputs are then garbage, which
the timed steps never read; a GPU adds each core call's launch to it). ``--core run``
times the real CPU kernels instead. The PyTorch layers' CPU kernels always run (a few
microseconds at this size), so on the CPU the ratios lean slightly in PyTorch's favour.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from timing import best_host_round_us

import transformer_engine.pytorch as te
from transformer_engine import _core
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

RECIPES = {"no FP8": None, "delayed FP8": DelayedScaling(), "current FP8": Float8CurrentScaling()}
# _core functions that answer questions (sizes, build flags) rather than run kernels: kept.
_CORE_QUERIES = {"built_with_cuda", "gemm_workspace_size", "norm_workspace_size", "dbias_workspace_size"}


class TorchLayerNormLinear(torch.nn.Module):
    def __init__(self, hidden: int, out: int, device, dtype):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.linear = torch.nn.Linear(hidden, out, device=device, dtype=dtype)

    def forward(self, x):
        return self.linear(self.norm(x))


class TorchMLP(torch.nn.Module):
    def __init__(self, hidden: int, ffn: int, device, dtype):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden, device=device, dtype=dtype)
        self.fc1 = torch.nn.Linear(hidden, ffn, device=device, dtype=dtype)
        self.fc2 = torch.nn.Linear(ffn, hidden, device=device, dtype=dtype)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


def training_step(module, x, grad, recipe, autocast: bool = False):
    """One step's closure; ``autocast``: inside torch.autocast(bfloat16), as Lightning's
    TransformerEnginePrecision and the main job run fp32 parameters."""
    fp8 = recipe is not None
    if not autocast:  # no torch.autocast(enabled=False) either: it costs microseconds a step
        def step():
            with te.fp8_autocast(enabled=fp8, fp8_recipe=recipe):
                y = module(x)
            y.backward(grad)
        return step

    device_type, grad_bf16 = x.device.type, grad.to(torch.bfloat16)  # the output's dtype there

    def autocast_step():
        with torch.autocast(device_type, dtype=torch.bfloat16), te.fp8_autocast(enabled=fp8, fp8_recipe=recipe):
            y = module(x)
        y.backward(grad_bf16)
    return autocast_step


def gpu_work_per_step(step, steps: int = 20) -> tuple[float, float]:
    """(GPU operations: kernels, memsets and copies, per step; CUDA caching-allocator
    allocations per step), counted over ``steps`` steps after a warm-up: what the host
    pays a launch or an allocation for, independent of how fast the host is."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    allocations = (torch.cuda.memory_stats()["allocation.all.allocated"] - before) / steps
    operations = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / steps
    return operations, allocations


def print_gpu_work(pairs: dict, names, x, grad) -> None:
    """gpu_work_per_step of every module and recipe, with the parameters in the input's
    dtype and, for fp32, also under torch.autocast(bfloat16)."""
    modes = [("", False)] + ([(" autocast bf16", True)] if x.dtype == torch.float32 else [])
    print("\nGPU operations (kernels, memsets, copies) / allocations per forward + backward:")
    labels = ["PyTorch"] + [f"OpenTE {label}" for label in RECIPES]
    print("| module | " + " | ".join(labels) + " |")
    print("|" + "---|" * (len(labels) + 1))
    for module_name in names:
        make_ref, make_te = pairs[module_name]
        for suffix, autocast in modes:
            ref, ours = make_ref(), make_te()
            cells = [gpu_work_per_step(training_step(ref, x, grad, None, autocast))]
            cells += [gpu_work_per_step(training_step(ours, x, grad, recipe, autocast)) for recipe in RECIPES.values()]
            print(f"| {module_name}{suffix} | " + " | ".join(f"{ops:g} / {allocs:g}" for ops, allocs in cells) + " |")


@contextlib.contextmanager
def core_kernels_stubbed():
    """Every kernel-running _core function a no-op inside (see the module docstring)."""
    saved = {}
    for name in dir(_core):
        fn = getattr(_core, name)
        if name.startswith("_") or name in _CORE_QUERIES or isinstance(fn, type) or not callable(fn):
            continue
        saved[name] = fn
        setattr(_core, name, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(_core, name, fn)


def graphed_steps(make_ref, make_te, x, grad) -> dict:
    """name -> step of the modules made CUDA graphs: PyTorch's layers by
    torch.cuda.make_graphed_callables, ours by te.make_graphed_callables (per recipe)."""
    steps = {"PyTorch graphed": training_step(torch.cuda.make_graphed_callables(make_ref(), (x,)), x, grad, None)}
    for label, recipe in RECIPES.items():
        graphed = te.make_graphed_callables(make_te(), (x,), fp8_enabled=recipe is not None, fp8_recipe=recipe)
        steps[f"OpenTE {label} graphed"] = training_step(graphed, x, grad, recipe)
    return steps


def print_graphed(pairs: dict, names, x, grad, iters: int, rounds: int) -> None:
    print("\nCUDA-graphed (make_graphed_callables), host us per forward + backward (ratio to the eager PyTorch step):")
    labels = ["PyTorch graphed"] + [f"OpenTE {label} graphed" for label in RECIPES]
    print("| module | PyTorch eager us | " + " | ".join(f"{label} us" for label in labels) + " |")
    print("|" + "---|" * (len(labels) + 2))
    for module_name in names:
        make_ref, make_te = pairs[module_name]
        steps = {"eager": training_step(make_ref(), x, grad, None)}
        steps.update(graphed_steps(make_ref, make_te, x, grad))
        times = best_host_round_us(steps, iters, rounds, "cuda")
        row = [module_name, f"{times['eager']:.1f}"]
        row += [f"{times[label]:.1f} ({times[label] / times['eager']:.2f}x)" for label in labels]
        print("| " + " | ".join(row) + " |")


def split_backward(module, x, grad, recipe, steps: int) -> dict:
    """Where the wall time of ``y.backward(grad)`` goes for a te.Linear step: until the
    module's Python backward starts ("to enter": autograd's start, and on the GPU its hand-
    off to the device thread), the backward's body, and after it returns (the leaves'
    gradients, and the hand-back). Medians over ``steps`` steps, in us."""
    from transformer_engine.pytorch.module import linear

    function = linear._LinearFunction
    original = function.__dict__["backward"]
    stamps = {}

    def timed(ctx, grad_out):
        stamps["enter"] = time.perf_counter()
        result = original.__func__(ctx, grad_out)
        stamps["exit"] = time.perf_counter()
        return result

    function.backward = staticmethod(timed)
    rows = []
    try:
        for _ in range(steps):
            with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
                y = module(x)
            start = time.perf_counter()
            y.backward(grad)
            end = time.perf_counter()
            rows.append((stamps["enter"] - start, stamps["exit"] - stamps["enter"], end - stamps["exit"], end - start))
    finally:
        function.backward = original
    rows = rows[steps // 10:]  # past the warm-up
    return {name: statistics.median(r[i] for r in rows) * 1e6
            for i, name in enumerate(("to enter", "body", "after", "backward"))}


def print_split(device: str, t: int, h: int, steps: int, dtype: torch.dtype) -> None:
    """te.Linear's backward split (split_backward) with autograd's device threads (the
    default) and with the backward on the calling thread, each recipe."""
    x = torch.randn(t, h, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(t, h, device=device, dtype=dtype)
    module = te.Linear(h, h, device=device, params_dtype=dtype)
    print(f"\nte.Linear backward, split (median us of {steps} steps, the first tenth left out):")
    print("| recipe | autograd runs the backward on | to enter | body | after | backward |")
    print("|---|---|---|---|---|---|")
    default = torch.autograd.is_multithreading_enabled()
    try:
        for threaded in (True, False):
            torch.autograd.set_multithreading_enabled(threaded)
            for label, recipe in RECIPES.items():
                split = split_backward(module, x, grad, recipe, steps)
                where = "device thread" if threaded else "calling thread"
                print(f"| {label} | {where} | " + " | ".join(f"{v:.1f}" for v in split.values()) + " |")
    finally:
        torch.autograd.set_multithreading_enabled(default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    parser.add_argument("--core", default="stub", choices=("stub", "run"),
                        help="on the CPU: replace the core's kernels by no-ops (stub) or run them")
    parser.add_argument("--iters", type=int, default=100, help="steps per round")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--modules", default="Linear,LayerNormLinear,LayerNormMLP")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="parameters and input (FP8 training usually keeps bf16 ones)")
    parser.add_argument("--eager-only", action="store_true", help="no CUDA-graphed table")
    parser.add_argument("--count", action="store_true",
                        help="also count GPU operations and allocations per step (CUDA; torch.profiler)")
    parser.add_argument("--split", action="store_true",
                        help="also split te.Linear's backward (to enter / body / after; real kernels)")
    args = parser.parse_args()
    device, t, h = args.device, args.tokens, args.hidden
    dtype = getattr(torch, args.dtype)
    stub = device == "cpu" and args.core == "stub"
    if device == "cpu":
        torch.set_num_threads(1)  # tiny ops: threads only add noise
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU" + (", core kernels stubbed" if stub else "")
    print(f"device: {name}  input [{t}, {h}], hidden {h}, {args.dtype} params; fastest of {args.rounds} rounds of "
          f"{args.iters} steps; host us per forward + backward (ratio to PyTorch)")
    header = ["module", "PyTorch us"] + [f"OpenTE {label} us" for label in RECIPES]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))

    x = torch.randn(t, h, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(t, h, device=device, dtype=dtype)
    pairs = {
        "Linear": (lambda: torch.nn.Linear(h, h, device=device, dtype=dtype),
                   lambda: te.Linear(h, h, device=device, params_dtype=dtype)),
        "LayerNormLinear": (lambda: TorchLayerNormLinear(h, h, device, dtype),
                            lambda: te.LayerNormLinear(h, h, device=device, params_dtype=dtype)),
        "LayerNormMLP": (lambda: TorchMLP(h, 4 * h, device, dtype),
                         lambda: te.LayerNormMLP(h, 4 * h, device=device, params_dtype=dtype)),
    }
    for module_name in args.modules.split(","):
        make_ref, make_te = pairs[module_name]
        ref, ours = make_ref(), make_te()
        steps = {"ref": training_step(ref, x, grad, None)}
        steps.update({label: training_step(ours, x, grad, recipe) for label, recipe in RECIPES.items()})
        with core_kernels_stubbed() if stub else contextlib.nullcontext():
            times = best_host_round_us(steps, args.iters, args.rounds, device)
        row = [module_name, f"{times['ref']:.1f}"]
        row += [f"{times[label]:.1f} ({times[label] / times['ref']:.2f}x)" for label in RECIPES]
        print("| " + " | ".join(row) + " |")
    if device == "cuda" and not args.eager_only:
        print_graphed(pairs, args.modules.split(","), x, grad, args.iters, args.rounds)
    if device == "cuda" and args.count:
        print_gpu_work(pairs, args.modules.split(","), x, grad)
    if args.split:
        print_split(device, t, h, steps=args.iters * 20, dtype=dtype)


if __name__ == "__main__":
    main()
