#!/usr/bin/env python3
"""Each kernel's loops in SASS and the instructions in their bodies, on a machine without a GPU.

    python3 tools/sass_loops.py csrc/ops/norm/norm_bwd_pipelined.cu --kernel "kernel<(te_dtype)6, true"
    python3 tools/sass_loops.py csrc/ops/norm/norm_bwd.cu --kernel norm_bwd_rows_kernel --min 200 --ops
    python3 tools/sass_loops.py /tmp/base/csrc/ops/norm/norm_bwd.cu ...   # a git worktree of another commit

Why: the norm, activation and bias-gradient kernels are bound by instruction issue on an
H200 (benchmarks/RESULTS.md), so the instructions a row costs decide their speed there,
and a kernel's row loop in SASS counts them without a GPU. A loop is a backward branch
(BRA to a lower address); its body is every instruction from the target to the branch,
NOPs left out. For each kernel the loops are listed outermost first, indented by
nesting, with the body's size, its size less the loops nested in it ("own": what one
trip of this loop alone executes, at most, as forward branches may skip part of it) and
the body's instructions by class. Static counts: a loop that runs k times a row costs k
times its own count, and a predicated-off instruction still issues.

Compile and disassembly as tools/sass_scan.py (nvcc for sm_90a, cuobjdump); the include
paths are taken from the source's own tree, so a file in a worktree of another commit
compiles against that commit's headers.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_scan import NVCC_FLAGS, demangle, find_tool  # noqa: E402

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)\s*([^;]*);")
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


def disassemble(source: str, nvcc: str, cuobjdump: str, nvdisasm: str) -> str:
    source = os.path.abspath(source)
    tree = source
    while os.path.basename(tree) != "csrc":  # the tree the include paths are relative to
        parent = os.path.dirname(tree)
        if parent == tree:
            raise SystemExit(f"{source}: not under a csrc/ directory")
        tree = parent
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernels.cubin")
        subprocess.run([nvcc, *NVCC_FLAGS, source, "-o", cubin], cwd=os.path.dirname(tree), check=True)
        env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm))
        return subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True,
                              env=env).stdout


def kernel_instructions(sass: str) -> dict[str, list[tuple[int, str, str]]]:
    """Mangled kernel name -> its instructions as (address, opcode, operands), NOPs left out."""
    kernels: dict[str, list[tuple[int, str, str]]] = {}
    current = None
    for line in sass.splitlines():
        name = re.search(r"Function : (\S+)", line)
        if name:
            current = kernels.setdefault(name.group(1), [])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None and m.group(2) != "NOP":
            current.append((int(m.group(1), 16), m.group(2), m.group(4)))
    return kernels


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
        inner = [(a, b) for a, b in spans if first <= a and b <= last and (a, b) != (first, last)]
        outer = [(a, b) for a, b in spans if a <= first and last <= b and (a, b) != (first, last)]
        body = body_counts(instructions, first, last, [])
        own = body_counts(instructions, first, last, inner)
        if sum(body.values()) < min_size:
            continue
        indent = "  " * len(outer)
        lines.append(f"    {indent}loop {first:#06x}-{last:#06x}: body {sum(body.values())}, own {sum(own.values())}"
                     f" ({summary(own)})")
        if show_ops:
            ops = " ".join(f"{op}:{n}" for op, n in sorted(own.items(), key=lambda item: (-item[1], item[0])))
            lines.append(f"    {indent}  {ops}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", help="kernel files")
    parser.add_argument("--kernel", default="", help="only kernels whose demangled name contains this")
    parser.add_argument("--min", type=int, default=0, help="only loops whose body has at least this many instructions")
    parser.add_argument("--ops", action="store_true", help="each loop's own instructions by opcode")
    args = parser.parse_args()
    nvcc, cuobjdump, nvdisasm = find_tool("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    for source in args.sources:
        kernels = kernel_instructions(disassemble(source, nvcc, cuobjdump, nvdisasm))
        names = list(kernels)
        for mangled, readable in zip(names, demangle(names)):
            if args.kernel not in readable:
                continue
            print(f"{source}  {readable[:160]}")
            print("\n".join(report(kernels[mangled], args.min, args.ops)))


if __name__ == "__main__":
    main()
