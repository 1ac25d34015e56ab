#!/usr/bin/env python3
"""Where a norm op's time goes, kernel by kernel: each kernel's own time on the GPU
(torch.profiler's CUDA activity, CUPTI), beside the kernel of a device-to-device copy of
the op's bytes in the same process. bench_norm.py times whole calls with events; this
splits a call into its kernels (the backward's rows kernel and its finalize, the
forward's row kernel and a transpose pass), so a session can tell which one holds a gap.

    python3 tools/norm_kernel_times.py --shapes 2048x16384,16384x768 --ops "layernorm bwd"

Inputs as bench_norm.py's (bf16 x and dz, weights in x's dtype, three copies cycled so that
no call finds its inputs in the L2 from the call before); each op runs `--calls` times
under the profiler after a warm-up. Prints a line an op: a call's kernel time (each
kernel's median times its launches a call, added up) against the copy kernel's (a ratio
of kernel times, without the launch gaps the events see); then a line a kernel: its
median time and how many times it ran a call.
Needs a GPU and an installed OpenTE.
"""

from __future__ import annotations

import argparse
import collections
import statistics


def kernel_medians(events, calls: int) -> dict[str, tuple[float, float]]:
    """(kernel name, us) pairs of `calls` calls -> name -> (median us, launches a call),
    names in order of first appearance."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for name, us in events:
        times[name].append(us)
    return {name: (statistics.median(ts), len(ts) / calls) for name, ts in times.items()}


def op_kernel_us(medians: dict[str, tuple[float, float]]) -> float:
    """A call's kernel time: each kernel's median times its launches a call, added up."""
    return sum(us * per_call for us, per_call in medians.values())


def short_name(name: str, width: int = 70) -> str:
    """A kernel's name without its template arguments' tail: wide enough to tell the forms apart."""
    return name if len(name) <= width else name[: width - 3] + "..."


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from transformer_engine.pytorch.cpp_extensions import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="16384x768,2048x16384,4096x12288")
    parser.add_argument("--ops", default="layernorm bwd,rmsnorm bwd",
                        help="comma-separated, of: layernorm fwd, rmsnorm fwd, layernorm bwd, rmsnorm bwd")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    copies = 3

    def profiled(call, inputs) -> dict[str, tuple[float, float]]:
        for k in range(2 * copies):
            call(inputs[k % copies])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for k in range(args.calls):
                call(inputs[k % copies])
            torch.cuda.synchronize()
        # a kernel's own event (one a launch): its start to its end on the GPU
        events = [(e.name, e.time_range.elapsed_us()) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA]
        return kernel_medians(events, args.calls)

    for shape in args.shapes.split(","):
        rows, hidden = map(int, shape.split("x"))
        inputs = []
        for _ in range(copies):
            x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
            dz = torch.randn_like(x)
            w = torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5
            b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
            _, mu, rs = layernorm_fwd(x, w, b, 1e-5)
            _, _, rs_rms = rmsnorm_fwd(x, w, 1e-5)
            inputs.append((x, dz, w, b, mu, rs, rs_rms))
        ops = {
            "layernorm fwd": (4, lambda i: layernorm_fwd(i[0], i[2], i[3], 1e-5)),
            "rmsnorm fwd": (4, lambda i: rmsnorm_fwd(i[0], i[2], 1e-5)),
            "layernorm bwd": (6, lambda i: layernorm_bwd(i[1], i[0], i[4], i[5], i[2])),
            "rmsnorm bwd": (6, lambda i: rmsnorm_bwd(i[1], i[0], i[6], i[2])),
        }
        for op in (o.strip() for o in args.ops.split(",")):
            if op not in ops:
                raise SystemExit(f"--ops: unknown op {op!r} (known: {', '.join(ops)})")
            bytes_per_element, call = ops[op]
            # a copy of the same bytes: half of them read, half written
            sources = [torch.empty(rows * hidden * bytes_per_element // 2, dtype=torch.uint8, device="cuda")
                       for _ in range(copies)]
            target = torch.empty_like(sources[0])
            copy_us = op_kernel_us(profiled(lambda s: target.copy_(s), sources))
            medians = profiled(call, inputs)
            total = op_kernel_us(medians)
            print(f"{rows} x {hidden} {op}: kernels {total:.1f} us a call, copy kernel {copy_us:.1f} us "
                  f"({copy_us / total:.1%} of the copy's rate)")
            for name, (us, per_call) in medians.items():
                print(f"    {us:8.1f} us x{per_call:g}  {short_name(name)}")


if __name__ == "__main__":
    main()
