#!/usr/bin/env python3
"""Whether kernel files compile to the same machine code (SASS) as before, kernel by kernel,
on a machine without a GPU.

    git worktree add /tmp/base HEAD       # the tree before the change
    python3 tools/sass_same.py /tmp/base/csrc/ops/softmax/softmax.cu \\
        --after csrc/ops/softmax/softmax_fwd.cu csrc/ops/softmax/softmax_bwd.cu
    python3 tools/sass_same.py --trees /tmp/base .    # every csrc/ops/*/*.cu of both trees

Why: a change meant to leave the device code alone (a file's kernels split over several for
the build's sake, launches moved, headers rearranged) is shown to, here, where no GPU runs the
tests: the kernels of the "before" files, all together, must be those of the "after" files,
each with the same instructions (predicates, modifiers, operands; branch targets are
addresses from the kernel's start, so a kernel may move within its file or to another).
Kernels are matched by their demangled names: an anonymous namespace's mangled name holds a
hash of its file's path, which differs between worktrees and between files. The forty-second
session split the norm forward's 156 row kernels and the softmax's 130 kernels over new files
this way (README, build times). Exits 1 where anything differs.

Compile and disassembly as tools/sass_scan.py (nvcc for sm_90a, cuobjdump; each file against
its own tree's headers), the files in parallel.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_scan import compiled, demangle, find_tool, kernel_lines  # noqa: E402

# an instruction as the disassembly writes it, between its address comment and its ';'
INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+([^;]*);")


def kernel_code(sass: str) -> dict[str, list[str]]:
    """Mangled kernel name -> its instructions' text, in order (NOPs, the padding after its
    end, left out)."""
    return {name: [" ".join(m.group(2).split())
                   for m in map(INSTRUCTION.match, lines) if m and m.group(2).strip() != "NOP"]
            for name, lines in kernel_lines(sass).items()}


def readable_kernels(sass_texts: list[str]) -> dict[str, list[list[str]]]:
    """The kernels of several files' SASS by demangled name, each with its copies' code (a
    template instantiated in two files has a copy in each)."""
    merged: dict[str, list[list[str]]] = {}
    for sass in sass_texts:
        code = kernel_code(sass)
        names = list(code)
        for mangled, readable in zip(names, demangle(names)):
            merged.setdefault(readable, []).append(code[mangled])
    return {name: sorted(copies) for name, copies in merged.items()}


def first_difference(a: list[str], b: list[str]) -> str:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    was = a[at] if at < len(a) else "(end)"
    now = b[at] if at < len(b) else "(end)"
    return f"{len(a)} -> {len(b)} instructions; the first difference, instruction {at}: {was} -> {now}"


def differences(before: dict[str, list[list[str]]], after: dict[str, list[list[str]]]) -> list[str]:
    """A line for each kernel only before, only after, in another number of files, or with
    other instructions."""
    lines = []
    for name in sorted(set(before) - set(after)):
        lines.append(f"only before: {name}")
    for name in sorted(set(after) - set(before)):
        lines.append(f"only after: {name}")
    for name in sorted(set(before) & set(after)):
        a, b = before[name], after[name]
        if len(a) != len(b):
            lines.append(f"differs: {name}: in {len(a)} files before, {len(b)} after")
        elif a != b:
            x, y = next((x, y) for x, y in zip(a, b) if x != y)
            lines.append(f"differs: {name}: {first_difference(x, y)}")
    return lines


def disassembled(sources: list[str], jobs: int) -> list[str]:
    tools = find_tool("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda source: compiled(os.path.abspath(source), *tools, dumps=("-sass",))[0], sources))


def tree_sources(tree: str) -> list[str]:
    return sorted(glob.glob(os.path.join(tree, "csrc", "ops", "*", "*.cu")) +
                  glob.glob(os.path.join(tree, "csrc", "common", "*.cu")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", nargs="*", help="the kernel files before the change")
    parser.add_argument("--after", nargs="+", default=[], help="the kernel files after it")
    parser.add_argument("--trees", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="instead: every csrc/ops/*/*.cu and csrc/common/*.cu of two trees")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="files compiled at once")
    args = parser.parse_args()
    if args.trees:
        before_files, after_files = tree_sources(args.trees[0]), tree_sources(args.trees[1])
    elif args.before and args.after:
        before_files, after_files = args.before, args.after
    else:
        parser.error("give the files before and --after the files after, or --trees BEFORE AFTER")
    before = readable_kernels(disassembled(before_files, args.jobs))
    after = readable_kernels(disassembled(after_files, args.jobs))
    found = differences(before, after)
    instructions = [sum(len(code) for copies in side.values() for code in copies) for side in (before, after)]
    summary = (f"{len(before)} kernels ({instructions[0]} instructions) in {len(before_files)} files before, "
               f"{len(after)} ({instructions[1]}) in {len(after_files)} after: "
               + (f"{len(found)} differences" if found else "the same code"))
    print("\n".join(found + [summary]))
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
