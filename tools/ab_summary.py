#!/usr/bin/env python3
"""The bandwidth tables of a tools/device_ab.sh run, side by side: one line an op and shape,
each variant's time (the median over its rounds) and its ratio to the base build's.

    bash tools/device_ab.sh a.patch -- python3 benchmarks/bench_norm.py --ops bwd > ab.txt
    python3 tools/ab_summary.py ab.txt          # or: ... | python3 tools/ab_summary.py

Reads the lines device_ab.sh prefixes with a variant's name, "[name] | op | shape | us |
... | same-bytes % | ...", as benchmarks/timing.py's print_bandwidth_table prints them
(bench_norm, bench_activation, bench_softmax, bench_rope); other lines are skipped. A
ratio below 1 is faster than the base. Prints a markdown table for RESULTS.md, then a line
a variant saying at how many lines all its rounds were faster (or slower) than all of the
base's, and the largest spread between rounds of one line (`apart`): a median's ratio
within the rounds' spread is noise; one whose rounds do not overlap the base's, at most
lines, is less likely so (with device_ab.sh's default two rounds, still no proof). Rows are
kept apart by the header of the table they came from too ("rows x hidden (bf16, fp32
weights)"): a command that runs a benchmark twice, e.g. with bf16 and with fp32 weights at
the same shapes, gets a line for each, its shape followed by the header's words.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import sys

# [variant] | op | shape | OpenTE us | GB/s | of copy BW | of a same-bytes copy | ...
ROW = re.compile(r"^\[([^\]]+)\] \| ([^|]+?) \| ([^|]+?) \| ([0-9.]+) \| [^|]+ \| [^|]+ \| ([0-9.]+)% \|")
# [variant] | op | rows x hidden (bf16, fp32 weights) | ...: a table's header
HEADER = re.compile(r"^\[([^\]]+)\] \| op \| ([^|]+?) \|")


def collect(lines) -> tuple[list[str], dict]:
    """Variants in order of appearance, and (op, shape, header) -> variant -> [(us, same-bytes %)],
    where header is the second column's title of the table the row came from."""
    variants: list[str] = []
    times: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    header_of: dict[str, str] = {}  # each variant's table being read
    for line in lines:
        h = HEADER.match(line)
        if h:
            header_of[h.group(1)] = h.group(2)
            continue
        m = ROW.match(line)
        if not m:
            continue
        variant, op, shape, us, fraction = m.group(1), m.group(2), m.group(3), float(m.group(4)), float(m.group(5))
        if variant not in variants:
            variants.append(variant)
        times[(op, shape, header_of.get(variant, ""))][variant].append((us, fraction))
    return variants, times


def shape_label(shape: str, header: str, shared: bool) -> str:
    """The shape, followed by its table's words where the same op and shape came in tables
    of different headers (`shared`: a benchmark run twice with other options)."""
    if not shared:
        return shape
    words = re.search(r"\((.*)\)", header)
    return f"{shape} ({words.group(1) if words else header})"


def median(runs):
    """(median time, median same-bytes %) of a variant's rounds, None without any."""
    if not runs:
        return None
    return statistics.median(us for us, _ in runs), statistics.median(f for _, f in runs)


def table(variants: list[str], times: dict, base: str = "base") -> list[str]:
    if base not in variants:
        raise SystemExit(f"no [{base}] lines: is this tools/device_ab.sh output?")
    others = [v for v in variants if v != base]
    lines = ["| op | shape | " + " | ".join([f"{base} us (of a same-bytes copy)", *others]) + " |",
             "|" + "---|" * (3 + len(others))]
    tables_of = collections.Counter((op, shape) for op, shape, _ in times)  # headers an op and shape came under
    for (op, shape, header), by_variant in times.items():
        base_us = median(by_variant.get(base))
        cells = [f"{base_us[0]:.1f} ({base_us[1]:.1f}%)" if base_us else "-"]
        for variant in others:
            m = median(by_variant.get(variant))
            if m is None:
                cells.append("-")
            elif base_us:
                cells.append(f"{m[0]:.1f} ({m[1]:.1f}%), {m[0] / base_us[0]:.3f}x")
            else:
                cells.append(f"{m[0]:.1f} ({m[1]:.1f}%)")
        lines.append(f"| {op} | {shape_label(shape, header, tables_of[(op, shape)] > 1)} | " + " | ".join(cells) + " |")
    return lines


def rounds_apart(base_runs, runs) -> int:
    """-1 where every one of `runs` is faster than every base round, 1 where every one is
    slower, 0 where they overlap (or either has none)."""
    if not base_runs or not runs:
        return 0
    base_us, us = [u for u, _ in base_runs], [u for u, _ in runs]
    if max(us) < min(base_us):
        return -1
    if min(us) > max(base_us):
        return 1
    return 0


def apart(variants: list[str], times: dict, base: str = "base") -> list[str]:
    """A line a variant other than the base: at how many of the table's lines its rounds
    all beat (or all trail) the base's, and the largest spread (max - min, us) between the
    rounds of one line, its own and the base's."""
    def spread(runs):
        return max(u for u, _ in runs) - min(u for u, _ in runs) if runs else 0.0

    base_spread = max((spread(v.get(base)) for v in times.values()), default=0.0)
    lines = []
    for variant in (v for v in variants if v != base):
        counts = collections.Counter(rounds_apart(v.get(base), v.get(variant)) for v in times.values())
        own = max((spread(v.get(variant)) for v in times.values()), default=0.0)
        lines.append(f"{variant}: every round faster than every base round at {counts[-1]} of {len(times)} "
                     f"lines, slower at {counts[1]}; the largest spread between one line's rounds "
                     f"{own:.1f} us (base {base_spread:.1f} us)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", help="device_ab.sh output (default: standard input)")
    parser.add_argument("--base", default="base", help="the variant the others are divided by")
    args = parser.parse_args()
    with (open(args.file) if args.file else sys.stdin) as f:
        variants, times = collect(f)
    print("\n".join(table(variants, times, args.base)))
    print()
    print("\n".join(apart(variants, times, args.base)))


if __name__ == "__main__":
    main()
