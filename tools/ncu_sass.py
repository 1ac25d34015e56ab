"""Where a kernel's executed instructions go, from an Nsight Compute report's source page:
each SASS line's executed count (warp instructions) over a unit of work, the totals, the
busiest lines, and the sums of address ranges (a prologue, a vector's loads, a reduction).

    ncu --kernel-name regex:softmax_fwd_rows_kernel --launch-skip 3 --launch-count 1 \\
        --section SourceCounters --section InstructionStats -o rep python3 script.py
    ncu -i rep.ncu-rep --page source --csv --print-source sass > k.sass.csv
    python3 tools/ncu_sass.py k.sass.csv --per 49152             # 49152 warps: a row each
    python3 tools/ncu_sass.py k.sass.csv --per 49152 --ranges 0x0-0x1680,0x1680-0x1fd0
    python3 tools/ncu_sass.py k.sass.csv --per 49152 --by stalls # where the warps waited
    python3 tools/ncu_sass.py k.sass.csv --per 49152 --list      # every executed line
    python3 tools/ncu_sass.py a.sass.csv b.sass.csv --per 49152  # side by side totals

Why: a kernel bound by instruction issue runs in proportion to the instructions it
executes, and a static count (tools/sass_loops.py) cannot tell the path taken from the
ones beside it; this reads what ran (the fiftieth session found the softmax's masked
forward at odd sk spending 285 of its 1038 instructions a warp before its first load).
Addresses are offsets from the kernel's first instruction, as cuobjdump prints them.
"""

from __future__ import annotations

import argparse
import csv
import sys


def read_lines(path: str) -> list[tuple[int, str, int, int]]:
    """(offset, SASS text, warp instructions executed, stall samples) a SASS line."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, row in enumerate(rows) if "Address" in row and "Source" in row)
    header = rows[header_at]
    address, source = header.index("Address"), header.index("Source")
    executed = header.index("Instructions Executed")
    stalls = next((i for i, name in enumerate(header) if name.startswith("Warp Stall Sampling (All")), None)
    lines = []
    for row in rows[header_at + 1:]:
        if len(row) <= executed or not row[address].startswith("0x"):
            continue
        count = int(row[executed] or 0)
        sampled = int(row[stalls] or 0) if stalls is not None else 0
        lines.append((int(row[address], 16), row[source].strip(), count, sampled))
    if not lines:
        sys.exit(f"{path}: no SASS lines with executed counts (export with --page source --print-source sass)")
    first = lines[0][0]
    return [(a - first, text, count, sampled) for a, text, count, sampled in lines]


def parse_ranges(text: str) -> list[tuple[int, int]]:
    ranges = []
    for piece in filter(None, text.split(",")):
        lo, hi = piece.split("-")
        ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--per", type=float, default=1.0, help="divide the counts by this (warps, rows, ...)")
    parser.add_argument("--ranges", default="", help="comma-separated hex offset ranges lo-hi (hi excluded)")
    parser.add_argument("--top", type=int, default=15, help="the busiest lines shown (0: none)")
    parser.add_argument("--by", choices=["count", "stalls"], default="count",
                        help="busiest by executed count or by warp stall samples (where warps waited)")
    parser.add_argument("--list", action="store_true", help="every executed line with its count")
    args = parser.parse_args()
    ranges = parse_ranges(args.ranges)
    for path in args.reports:
        lines = read_lines(path)
        total = sum(count for _, _, count, _ in lines)
        print(f"{path}: {total / args.per:.1f} instructions a unit ({total} warp instructions, "
              f"{len(lines)} SASS lines)")
        for lo, hi in ranges:
            inside = sum(count for a, _, count, _ in lines if lo <= a < hi)
            print(f"  0x{lo:x}-0x{hi:x}: {inside / args.per:.1f} ({inside / max(total, 1):.1%})")
        if args.list:
            for a, text, count, sampled in lines:
                if count:
                    print(f"  {a:05x} {count / args.per:8.2f} {sampled:6d}  {text}")
        elif args.top:
            print(f"  busiest lines by {args.by} (offset, a unit's count, stall samples):")
            key = 2 if args.by == "count" else 3
            busiest = sorted(lines, key=lambda line: -line[key])[:args.top]
            for a, text, count, sampled in sorted(busiest):
                print(f"  {a:05x} {count / args.per:8.2f} {sampled:6d}  {text}")


if __name__ == "__main__":
    main()
