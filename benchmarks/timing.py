"""Timing shared by the benchmarks: CUDA events around each call, with every
call queued behind a GPU sleep before the host waits, so the GPU never idles
between calls and the events time the kernels rather than the host's launch
latency."""

from __future__ import annotations

import itertools
import statistics
import time

import torch


# GPU clock cycles of sleep queued per timed call: 200 us at 2 GHz, more than the
# host takes to queue a call of the slowest wrapper.
_SLEEP_CYCLES_PER_CALL = 400_000


def event_times_us(fn, iters: int) -> list[float]:
    """Times of `iters` calls of `fn`, in microseconds.

    The calls are queued behind a GPU sleep long enough for the host to queue all of
    them: without it, a kernel shorter than its call's host work (a Python wrapper
    allocating its outputs takes tens of microseconds) left the GPU idle between
    calls, and the events timed the host (the same norm kernel read 47 or 67 us on
    an H200 from one run to the next)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda._sleep(_SLEEP_CYCLES_PER_CALL * iters)
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in events]


def time_us(fn, iters: int, warmup: int = 5) -> float:
    """Median time of one call in microseconds."""
    for _ in range(warmup):
        fn()
    return statistics.median(event_times_us(fn, iters))


def time_pair_us(ours, theirs, iters: int, rounds: int = 5, warmup: int = 5) -> tuple[float, float]:
    """Median times of two functions, measured in alternating rounds so that clock
    and temperature drift during the run affect both alike (timing all of one and
    then all of the other moved single GEMM shapes by up to 5% either way, H200)."""
    ours_us, theirs_us = time_rounds_us([ours, theirs], iters, rounds, warmup)
    return ours_us, theirs_us


def time_rounds_us(fns, iters: int, rounds: int = 5, warmup: int = 5) -> list[float]:
    """Median times of several functions, measured in interleaved rounds (as
    time_pair_us, for any number of functions)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, fn_times in zip(fns, times):
            fn_times += event_times_us(fn, max(1, iters // rounds))
    return [statistics.median(fn_times) for fn_times in times]


def copy_bandwidth(nbytes: int, iters: int, sources: int = 1) -> float:
    """Device-to-device copy of `nbytes`: bytes read + written per second. The calls take
    `sources` source buffers in turn into one destination, as a benchmark's op calls
    take that many copies of their inputs in turn (so that no call finds its inputs in
    the L2) while each call's output lands in the block the caching allocator freed at
    the call before. With one source, a copy whose source and destination fit in the L2
    read the source from there from the second call on (H100: 12-18 MiB copies at
    99-108% of the 1 GiB copy's rate, 80-89% with three sources; benchmarks/RESULTS.md,
    norm section, sixty-eighth session)."""
    buffers = [torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_() for _ in range(sources)]
    dst = torch.empty_like(buffers[0])
    turn = itertools.cycle(buffers)
    return 2 * nbytes / (time_us(lambda: dst.copy_(next(turn)), iters) * 1e-6)


def add_ops_argument(parser) -> None:
    """--ops: run only the ops whose names contain one of these comma-separated pieces
    (a targeted run on the lent GPU machine spends its minutes on what it measures)."""
    parser.add_argument("--ops", default="", help="comma-separated pieces of op names to run (default: all)")


def print_bandwidth_table(script: str, rows, iters: int, shape_header: str, ops: str = "",
                          input_copies: int = 1) -> None:
    """The table of the memory-bound benchmarks: ``rows`` yields (op, shape text, bytes
    moved, ours, theirs), those whose op name contains a piece of ``ops`` (comma-separated;
    empty: all); each line gives our time, GB/s, the fraction of the 1 GiB copy
    bandwidth measured first in this run, the fraction of the bandwidth of a copy moving
    the same bytes as the op (read + written: a copy of half of them), PyTorch's time and
    the speed-up. The 1 GiB copy is the device's sustained rate; a copy of the op's own
    size pays the same launch and ramp-up as the op, which weigh more the shorter it runs
    (a 128 MiB copy ran at 96% of the 1 GiB copy's rate on an H100, bench_quantize.py).
    input_copies: how many copies of its inputs the benchmark's ops cycle over; the
    same-bytes copy cycles over as many sources (copy_bandwidth), the 1 GiB copy needs none."""
    from transformer_engine import _core

    if not torch.cuda.is_available() or not _core.built_with_cuda():
        raise SystemExit(f"{script} needs a CUDA GPU and a CUDA build of OpenTE")
    copy_bw = copy_bandwidth(1 << 30, iters)
    same_bytes_bw = {}  # bytes moved -> that copy's bandwidth
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth (read+write, 1 GiB): {copy_bw / 1e9:.0f} GB/s")
    header = ("op", shape_header, "OpenTE us", "GB/s", "of copy BW", "of a same-bytes copy", "PyTorch us", "speed-up")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    pieces = [piece for piece in ops.split(",") if piece]
    for name, shape, nbytes, ours, theirs in rows:
        if pieces and not any(piece in name for piece in pieces):
            continue
        us, torch_us = time_pair_us(ours, theirs, iters)
        if nbytes not in same_bytes_bw:
            same_bytes_bw[nbytes] = copy_bandwidth(max(nbytes // 2, 1), iters, input_copies)
        bw = nbytes / (us * 1e-6)
        print(f"| {name} | {shape} | {us:.1f} | {bw / 1e9:.0f} | {bw / copy_bw:.1%} | {bw / same_bytes_bw[nbytes]:.1%} "
              f"| {torch_us:.1f} | {torch_us / us:.2f}x |")


def host_round_us(step, iters: int, device: str) -> float:
    """Wall time per call of one round of ``iters`` calls of ``step``: the host's work
    when the GPU queue drains faster than the host fills it (the queue is drained at
    the end of the round; ``device`` "cuda" or "cpu")."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    elapsed = time.perf_counter() - start
    if device == "cuda":
        torch.cuda.synchronize()
    return elapsed / iters * 1e6


def best_host_round_us(steps: dict, iters: int, rounds: int, device: str, warmup: int = 20) -> dict:
    """name -> the fastest round's host time per call (host_round_us), over rounds of
    every step in turn: drift hits every step alike, and on a shared machine the least
    disturbed round is the best estimate of the work itself (the median moved by up to
    50% between runs on a busy machine, the minimum by a few percent)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    best = {name: float("inf") for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            best[name] = min(best[name], host_round_us(step, iters, device))
    return best
