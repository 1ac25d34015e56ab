"""The delayed-scaling update (te_delayed_scaling_update: every scale of a step from its
amax history, then the histories rolled) on the GPU, against the same update in PyTorch
ops, in one run.

    python3 benchmarks/bench_recipe.py            # needs a CUDA GPU

Cases: one te.Linear's forward group ([1024, 3]: Transformer Engine's default history
length), and the groups of a 24-layer model (four FP8 modules a layer, each a forward
[1024, 3] and a backward [1024, 2] group: 192 groups). Both are what the update does at
every autocast exit; it moves a few MiB at most, so its time is latency, not bandwidth.

PyTorch does the update as a user without the fused kernel would, group by group:
amax = history.max(0), the scale rule with torch.where, torch.roll, row 0 zeroed
(about ten launches a group, the host's time included where it exceeds the GPU's).
"""

from __future__ import annotations

import argparse

import torch
from timing import time_pair_us

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType

E4M3_MAX = 448.0


def torch_update(histories, scales, scale_invs, margin: float = 0.0) -> None:
    """The update in PyTorch ops ("max" over the window), in place."""
    for history, scale, scale_inv in zip(histories, scales, scale_invs):
        amax = history.max(dim=0).values
        new_scale = E4M3_MAX / amax / 2.0**margin
        new_scale = torch.where((amax > 0) & torch.isfinite(amax), new_scale, scale)
        scale.copy_(new_scale)
        scale_inv.copy_(1.0 / scale)
        history.copy_(torch.roll(history, -1, 0))
        history[0].zero_()


def groups(shapes):
    """Histories of random positive amaxes, scales and scale_invs, on the GPU."""
    hists = [torch.rand(length, n, device="cuda") * 100 for length, n in shapes]
    scales = [torch.ones(n, device="cuda") for _, n in shapes]
    return hists, scales, [torch.ones_like(s) for s in scales]


def core_groups(hists, scales, invs):
    """The te_delayed_scaling_update groups of those buffers, as the modules keep them
    between steps (DelayedScalingState.core_group): the launch alone is timed, not the
    checks of cpp_extensions.delayed_scaling_update, which take longer than the kernel
    at 192 groups."""
    return [(h.data_ptr(), s.data_ptr(), i.data_ptr(), h.shape[0], h.shape[1], int(DType.kFloat8E4M3))
            for h, s, i in zip(hists, scales, invs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_recipe.py needs a CUDA GPU")
    cases = {
        "te.Linear forward, [1024, 3]": [(1024, 3)],
        "24 layers x 4 modules, [1024, 3] + [1024, 2]": [(1024, 3), (1024, 2)] * 96,
    }
    max_algo = int(_core.AmaxComputeAlgo.MAX)
    dev = module_ops.core_device(torch.empty(0, device="cuda"))
    print(f"device: {torch.cuda.get_device_name()}")
    print("| case | groups | OpenTE us | PyTorch us | speed-up |")
    print("|---|---|---|---|---|")
    for name, shapes in cases.items():
        hists, scales, invs = groups(shapes)
        update_groups = core_groups(hists, scales, invs)
        ours_us, torch_us = time_pair_us(
            lambda: module_ops.delayed_scaling_update(update_groups, 0.0, max_algo, dev),
            lambda: torch_update(hists, scales, invs), args.iters)
        print(f"| {name} | {len(shapes)} | {ours_us:.1f} | {torch_us:.1f} | {torch_us / ours_us:.1f}x |")


if __name__ == "__main__":
    main()
