#!/usr/bin/env python3
"""Each kernel's loops in SASS and the instructions in their bodies, on a machine without a GPU.

    python3 tools/sass_loops.py csrc/ops/norm/norm_bwd_pipelined.cu --kernel "kernel<(te_dtype)6, true"
    python3 tools/sass_loops.py csrc/ops/norm/norm_bwd.cu --kernel norm_bwd_rows_kernel --min 200 --ops
    python3 tools/sass_loops.py /tmp/base/csrc/ops/norm/norm_bwd.cu ...   # a git worktree of another commit
    python3 tools/sass_loops.py csrc/ops/norm/norm_bwd.cu --against /tmp/base   # a line a kernel: there -> here

Why: the norm, activation and bias-gradient kernels are bound by instruction issue on an
H200 (benchmarks/RESULTS.md), so the instructions a row costs decide their speed there,
and a kernel's row loop in SASS counts them without a GPU. A loop is a backward branch
(BRA to a lower address); its body is every instruction from the target to the branch,
NOPs left out. For each kernel the loops are listed outermost first, indented by
nesting, with the body's size, its size less the loops nested in it ("own": what one
trip of this loop alone executes, at most, as forward branches may skip part of it) and
the body's instructions by class. Static counts: a loop that runs k times a row costs k
times its own count, and a predicated-off instruction still issues.

--against TREE compiles the same file in TREE too (say `git worktree add /tmp/base main`
before a change) and gives a line a kernel: its row loop's own count (the largest of its
loops), registers and stack bytes (ptxas's spills), there -> here.

Compile and disassembly as tools/sass_scan.py (nvcc for sm_90a, cuobjdump); the include
paths are taken from the source's own tree, so a file in a worktree of another commit
compiles against that commit's headers.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_scan import compiled, demangle, disassemble, find_tool, kernel_lines, source_tree  # noqa: E402

# "/*0a30*/  @!P1 FADD.FTZ R1, R2, R3 ;": address, opcode, modifiers, operands (a predicate skipped)
INSTRUCTION = re.compile(
    r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")

# opcode -> class, for the one-line summary of a body (anything else is "other")
CLASSES = {
    "fp32": {"FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "FSET", "MUFU", "FCHK", "FRND", "FMNMX3"},
    "cvt": {"F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP", "HADD2", "HFMA2", "HMUL2"},
    "int": {"IMAD", "IADD3", "IADD", "LOP3", "SHF", "LEA", "ISETP", "SEL", "PRMT", "MOV", "IABS", "IMNMX", "VIADDMNMX",
            "VIADD", "IMUL", "S2R", "S2UR", "CS2R", "UMOV", "UIADD3", "UIMAD", "ULOP3", "USHF", "ULEA", "UISETP",
            "USEL", "R2UR", "MOV32I", "PLOP3", "P2R", "R2P", "FLO", "POPC", "BREV", "LDC", "ULDC", "UPRMT", "VOTEU",
            "VOTE"},
    "mem": {"LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "LDGSTS", "ATOM", "ATOMS", "ATOMG", "RED", "LDSM",
            "LDGDEPBAR", "UBLKCP", "UTMALDG", "UTMASTG"},
    "shfl": {"SHFL"},
    "sync": {"BAR", "DEPBAR", "WARPSYNC", "MEMBAR", "ERRBAR", "CCTL", "ARRIVES", "SYNCS"},
    "ctrl": {"BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "JMP", "BMOV", "PREEXIT", "ACQBULK", "WARPGROUP"},
}
CLASS_OF = {op: name for name, ops in CLASSES.items() for op in ops}


def resource_usage(text: str) -> dict[str, tuple[int, int]]:
    """Mangled kernel name -> (registers, stack bytes: ptxas's spills) from cuobjdump -res-usage."""
    usage, name = {}, None
    for line in text.splitlines():
        function = re.match(r"\s*Function (\S+):", line)
        if function:
            name = function.group(1)
            continue
        numbers = re.search(r"REG:(\d+) STACK:(\d+)", line)
        if numbers and name:
            usage[name] = (int(numbers.group(1)), int(numbers.group(2)))
    return usage


def kernel_instructions(sass: str) -> dict[str, list[tuple[int, str, str]]]:
    """Mangled kernel name -> its instructions as (address, opcode, operands), NOPs left out."""
    return {name: [(int(m.group(1), 16), m.group(2), m.group(4))
                   for m in map(INSTRUCTION.match, lines) if m and m.group(2) != "NOP"]
            for name, lines in kernel_lines(sass).items()}


def loops(instructions: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) addresses of each loop: a branch back to a lower address, outermost first
    (not the branch to itself that follows a kernel's last EXIT)."""
    found = set()
    for address, opcode, operands in instructions:
        if opcode == "BRA":
            target = BRANCH_TARGET.search(operands)
            if target and int(target.group(1), 16) < address:
                found.add((int(target.group(1), 16), address))
    return sorted(found, key=lambda span: (span[0], -span[1]))


def nested(spans: list[tuple[int, int]], first: int, last: int) -> list[tuple[int, int]]:
    """The loops inside the loop (first, last)."""
    return [span for span in spans if first <= span[0] and span[1] <= last and span != (first, last)]


def body_counts(instructions, first: int, last: int, skip: list[tuple[int, int]]) -> collections.Counter:
    counts = collections.Counter()
    for address, opcode, _ in instructions:
        if first <= address <= last and not any(a <= address <= b for a, b in skip):
            counts[opcode] += 1
    return counts


def summary(counts: collections.Counter) -> str:
    by_class = collections.Counter()
    for opcode, n in counts.items():
        by_class[CLASS_OF.get(opcode, "other")] += n
    return " ".join(f"{name} {by_class[name]}" for name in [*CLASSES, "other"] if by_class[name])


def report(instructions, min_size: int, show_ops: bool) -> list[str]:
    spans = loops(instructions)
    lines = [f"    kernel: {len(instructions)} instructions"]
    for first, last in spans:
        outer = [(a, b) for a, b in spans if a <= first and last <= b and (a, b) != (first, last)]
        body = body_counts(instructions, first, last, [])
        own = body_counts(instructions, first, last, nested(spans, first, last))
        if sum(body.values()) < min_size:
            continue
        indent = "  " * len(outer)
        lines.append(f"    {indent}loop {first:#06x}-{last:#06x}: body {sum(body.values())}, own {sum(own.values())}"
                     f" ({summary(own)})")
        if show_ops:
            ops = " ".join(f"{op}:{n}" for op, n in sorted(own.items(), key=lambda item: (-item[1], item[0])))
            lines.append(f"    {indent}  {ops}")
    return lines


def row_loop(instructions) -> int:
    """The largest own count of the kernel's loops (a row kernel's row loop), 0 without a loop."""
    spans = loops(instructions)
    return max((sum(body_counts(instructions, first, last, nested(spans, first, last)).values())
                for first, last in spans), default=0)


def kernel_summaries(source: str, tools: tuple[str, str, str]) -> dict[str, tuple[int, int, int]]:
    """Demangled kernel name -> (row loop's own count, registers, stack bytes). Demangled: an
    anonymous namespace's mangled name holds a hash of the file's path, another in a worktree."""
    sass, resources = compiled(source, *tools)
    kernels, usage = kernel_instructions(sass), resource_usage(resources)
    names = list(kernels)
    return {readable: (row_loop(kernels[name]), *usage.get(name, (0, 0)))
            for name, readable in zip(names, demangle(names))}


def compare(source: str, against: str, tools, kernel_filter: str) -> list[str]:
    """Each kernel of `source` against the same file of the tree `against`: its row loop's
    own count, registers and stack bytes, there -> here."""
    relative = os.path.relpath(os.path.abspath(source), source_tree(source))
    here, there = kernel_summaries(source, tools), kernel_summaries(os.path.join(against, relative), tools)
    lines = []
    for name in sorted(set(here) | set(there)):
        if kernel_filter not in name:
            continue
        (a, ra, sa), (b, rb, sb) = there.get(name, (0, 0, 0)), here.get(name, (0, 0, 0))
        change = f"{b / a - 1:+4.0%}" if a else "  new" if b else "    -"
        short = re.sub(r"opente::|\(anonymous namespace\)::|norm_kernels::", "", name)
        lines.append(f"  {change}  loop {a:4d} -> {b:4d}  registers {ra:3d} -> {rb:3d}  stack {sa:3d} -> {sb:3d}"
                     f"  {short[:120]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", help="kernel files")
    parser.add_argument("--kernel", default="", help="only kernels whose demangled name contains this")
    parser.add_argument("--min", type=int, default=0, help="only loops whose body has at least this many instructions")
    parser.add_argument("--ops", action="store_true", help="each loop's own instructions by opcode")
    parser.add_argument("--against", metavar="TREE",
                        help="a tree of another commit (a git worktree): each kernel's row loop, registers and "
                             "stack there -> here, a line a kernel")
    args = parser.parse_args()
    tools = find_tool("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    for source in args.sources:
        if args.against:
            print(f"{source} (row loop's own instructions, registers, stack bytes: {args.against} -> here)")
            print("\n".join(compare(source, args.against, tools, args.kernel)))
            continue
        kernels = kernel_instructions(disassemble(source, *tools))
        names = list(kernels)
        for mangled, readable in zip(names, demangle(names)):
            if args.kernel not in readable:
                continue
            print(f"{source}  {readable[:160]}")
            print("\n".join(report(kernels[mangled], args.min, args.ops)))


if __name__ == "__main__":
    main()
