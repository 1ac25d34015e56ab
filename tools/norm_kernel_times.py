#!/usr/bin/env python3
"""Where a norm op's time goes, kernel by kernel: each kernel's own time on the GPU
(torch.profiler's CUDA activity, CUPTI), beside the kernel of a device-to-device copy of
the op's bytes in the same process. bench_norm.py times whole calls with events; this
splits a call into its kernels (the backward's rows kernel and its finalize, the
forward's row kernel and a transpose pass), so a session can tell which one holds a gap.

    python3 tools/norm_kernel_times.py --shapes 2048x16384,16384x768 --ops "layernorm bwd"

Inputs as bench_norm.py's (bf16 x and dz, weights in x's dtype, three copies cycled so that
no call finds its inputs in the L2 from the call before); each op runs `--calls` times
under the profiler after a warm-up. A kernel launched as a programmatic dependent (the
backward's finalize) starts while the kernel before still runs and waits inside, so its
own start-to-end time holds the other's: a call's time is therefore its span, from its
first kernel's start to its last kernel's end, and each kernel is charged the time by
which it moves the call's end (its end past every earlier kernel's). Prints a line an op:
the median span against the copy's (a ratio of GPU times, without the launch gaps
bench_norm.py's events see); then a line a kernel: the median of its start-to-end time
and of the time it adds to the span.
Needs a GPU and an installed OpenTE.
"""

from __future__ import annotations

import argparse
import statistics


def call_timelines(events, calls: int) -> list[list[tuple[str, float, float]]]:
    """(kernel name, start us, end us) of `calls` calls, each launching the same kernels ->
    the calls' kernels in launch order, a list a call."""
    if not events or len(events) % calls:
        raise ValueError(f"{len(events)} kernel events do not split into {calls} calls of as many kernels")
    ordered = sorted(events, key=lambda e: e[1])
    per_call = len(ordered) // calls
    timelines = [ordered[k * per_call:(k + 1) * per_call] for k in range(calls)]
    names = [name for name, _, _ in timelines[0]]
    for timeline in timelines[1:]:
        if [name for name, _, _ in timeline] != names:
            raise ValueError("the calls did not launch the same kernels in the same order")
    return timelines


def call_span_and_shares(timeline) -> tuple[float, list[tuple[str, float, float]]]:
    """One call's kernels -> (its span: first start to last end, [(name, the kernel's own
    start-to-end time, the time by which it moves the call's end past every earlier kernel's)]).
    The shares add up to the span."""
    call_start = timeline[0][1]
    latest_end = call_start
    shares = []
    for name, start, end in timeline:
        shares.append((name, end - start, max(0.0, end - latest_end)))
        latest_end = max(latest_end, end)
    return latest_end - call_start, shares


def median_call(events, calls: int) -> tuple[float, list[tuple[str, float, float]]]:
    """The calls' median span, and each kernel's median own time and median share of the span."""
    per_call = [call_span_and_shares(t) for t in call_timelines(events, calls)]
    span = statistics.median(s for s, _ in per_call)
    kernels = []
    for k, (name, _, _) in enumerate(per_call[0][1]):
        kernels.append((name, statistics.median(shares[k][1] for _, shares in per_call),
                        statistics.median(shares[k][2] for _, shares in per_call)))
    return span, kernels


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

    def profiled(call, inputs) -> tuple[float, list[tuple[str, float, float]]]:
        for k in range(2 * copies):
            call(inputs[k % copies])
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for k in range(args.calls):
                call(inputs[k % copies])
            torch.cuda.synchronize()
        # a kernel's (or a copy's) own event, one a launch: its start and end on the GPU
        events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA]
        return median_call(events, args.calls)

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
            copy_us, _ = profiled(lambda s: target.copy_(s), sources)
            span, kernels = profiled(call, inputs)
            print(f"{rows} x {hidden} {op}: {span:.1f} us a call on the GPU (first kernel's start to last's "
                  f"end), copy {copy_us:.1f} us ({copy_us / span:.1%} of the copy's rate)")
            for name, own, share in kernels:
                print(f"    runs {own:7.1f} us, adds {share:6.1f} us  {short_name(name)}")


if __name__ == "__main__":
    main()
