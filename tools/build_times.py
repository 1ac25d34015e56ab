#!/usr/bin/env python3
"""Where a clean build's time goes: each compile step's seconds from Ninja's log, and
what they would take on more cores.

    cmake -S . -B /tmp/bt -G Ninja -DOPENTE_CUDA=ON -DOPENTE_BUILD_PYTHON=ON -DOPENTE_BUILD_TESTS=ON
    ninja -C /tmp/bt -j2
    python3 tools/build_times.py /tmp/bt/.ninja_log --cores 2 16

Why: a clean build's wall time on many cores is bounded below by its longest file, however
many cores there are; on few it is the sum over them all. The norm forward's kernels in one
file took 64 s of compiler time (2-core machine, 2026-12-05) and bounded a 16-core build,
while every other file took 24 s or less (README, build times). This machine has 2 cores,
so the figure for 16 is computed, not measured: each step's time on one core here, given
longest first to whichever of the cores is free soonest (steps wait for nothing; the links,
which wait for every object, are left out). It is a lower bound on cores as fast as these.

Ninja appends a line each time it runs a step (start and end in ms, the output); the last
line of each output is the one that counts, so run it on a build folder built once from
empty, or after a clean (`ninja -t clean`). The times are each step's wall time: with more
jobs than cores (Ninja's default is the cores + 2, as in `pip install .`) steps share cores
and each looks longer, so build with `-j` at most the cores for these figures.
"""

from __future__ import annotations

import argparse
import heapq
import os


def step_seconds(log_text: str) -> dict[str, float]:
    """Output -> seconds its step took, the last run of each (ninja log v5 and later)."""
    seconds: dict[str, float] = {}
    for line in log_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        start_ms, end_ms, _mtime, output = line.split("\t")[:4]
        seconds[output] = (int(end_ms) - int(start_ms)) / 1000.0
    return seconds


def compile_steps(seconds: dict[str, float]) -> dict[str, float]:
    """The object files' steps: the compiles, which can all run at once."""
    return {output: s for output, s in seconds.items() if output.endswith((".o", ".obj"))}


def wall_time(step_times: list[float], cores: int) -> float:
    """Wall time of the steps on `cores` cores, each step given, longest first, to the
    core that is free soonest."""
    free_at = [0.0] * cores
    for t in sorted(step_times, reverse=True):
        heapq.heapreplace(free_at, free_at[0] + t)
    return max(free_at)


def report(seconds: dict[str, float], cores: list[int], longest: int) -> list[str]:
    steps = compile_steps(seconds)
    times = list(steps.values())
    lines = [f"{len(steps)} compile steps, {sum(times):.1f} s of compiler time; the longest:"]
    for output, s in sorted(steps.items(), key=lambda kv: -kv[1])[:longest]:
        lines.append(f"  {s:6.1f} s  {os.path.basename(output)}")
    for n in cores:
        lines.append(f"on {n} cores: {wall_time(times, n):.1f} s (the longest step alone {max(times, default=0):.1f} s)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="a build folder's .ninja_log")
    parser.add_argument("--cores", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--longest", type=int, default=10, help="steps to list")
    args = parser.parse_args()
    with open(args.log) as f:
        print("\n".join(report(step_seconds(f.read()), args.cores, args.longest)))


if __name__ == "__main__":
    main()
