"""te.Linear and te.LayerNormMLP training steps (forward + backward) in FP8 against plain
PyTorch BF16 layers of the same shape, and the host (CPU) time of a te.Linear forward +
backward at a tiny shape against nn.Linear, in one run.

    python3 benchmarks/bench_modules.py                    # needs a CUDA GPU
    python3 benchmarks/bench_modules.py --recipe current   # Float8CurrentScaling instead

GPU time: CUDA events around each step (alternating rounds, medians). Host time: wall
time per call of a tiny layer whose kernels take a few microseconds, so the host's work
(Python, checks, launches) is what is measured: the fastest of 20 alternating rounds of
100 steps, the GPU queue drained at the end of each (as bench_host_overhead.py times).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import best_host_round_us, time_pair_us

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

RECIPES = {"delayed": DelayedScaling(amax_history_len=16), "current": Float8CurrentScaling()}


def training_step(module, x, grad, recipe):
    """One forward + backward, in FP8 with ``recipe`` (None: without FP8)."""
    def step():
        with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
            y = module(x)
        y.backward(grad)
    return step


class TorchMLP(torch.nn.Module):
    """The same MLP in plain PyTorch: LayerNorm, Linear, GELU (tanh), Linear."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        kw = dict(device="cuda", dtype=torch.bfloat16)
        self.norm = torch.nn.LayerNorm(hidden, **kw)
        self.fc1, self.fc2 = torch.nn.Linear(hidden, ffn, **kw), torch.nn.Linear(ffn, hidden, **kw)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=16384)
    parser.add_argument("--recipe", default="delayed", choices=tuple(RECIPES))
    args = parser.parse_args()
    recipe = RECIPES[args.recipe]
    t, h, f = args.tokens, args.hidden, args.ffn
    print(f"device: {torch.cuda.get_device_name()}  tokens {t}, hidden {h}, ffn {f}, bf16 params, "
          f"{type(recipe).__name__}")
    print("| layer | OpenTE FP8 step ms | PyTorch BF16 step ms | speed-up | TFLOP/s (FP8) |")
    print("|---|---|---|---|---|")
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    lin = te.Linear(h, f, params_dtype=torch.bfloat16, device="cuda")
    ref_lin = torch.nn.Linear(h, f, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(t, f, device="cuda", dtype=torch.bfloat16)
    ours, theirs = time_pair_us(training_step(lin, x, grad, recipe), training_step(ref_lin, x, grad, None),
                                args.iters)
    flops = 3 * 2 * t * h * f
    print(f"| Linear {h}->{f} | {ours / 1e3:.2f} | {theirs / 1e3:.2f} | {theirs / ours:.2f}x | "
          f"{flops / ours / 1e6:.0f} |")
    del lin, ref_lin, grad

    mlp = te.LayerNormMLP(h, f, params_dtype=torch.bfloat16, device="cuda")
    ref_mlp = TorchMLP(h, f)
    grad = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    ours, theirs = time_pair_us(training_step(mlp, x, grad, recipe), training_step(ref_mlp, x, grad, None),
                                args.iters)
    flops = 2 * 3 * 2 * t * h * f
    print(f"| LayerNormMLP {h}/{f} | {ours / 1e3:.2f} | {theirs / 1e3:.2f} | {theirs / ours:.2f}x | "
          f"{flops / ours / 1e6:.0f} |")
    del mlp, ref_mlp, grad, x

    print("\n| host time per forward+backward, [16, 64] -> 64 | us |")
    print("|---|---|")
    xs = torch.randn(16, 64, device="cuda", requires_grad=True)
    gs = torch.randn(16, 64, device="cuda")
    small, ref_small = te.Linear(64, 64, device="cuda"), torch.nn.Linear(64, 64, device="cuda")
    steps = {
        "nn.Linear": training_step(ref_small, xs, gs, None),
        "te.Linear (no FP8)": training_step(small, xs, gs, None),
        "te.Linear (FP8)": training_step(small, xs, gs, recipe),
    }
    results = best_host_round_us(steps, iters=100, rounds=20, device="cuda")
    for name, us in results.items():
        print(f"| {name} | {us:.1f} ({us / results['nn.Linear']:.2f}x nn.Linear) |")


if __name__ == "__main__":
    main()
