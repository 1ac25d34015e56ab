#!/usr/bin/env python3
"""The kernels' memory instructions as the GPU runs them (SASS), on a machine without a GPU.

    python3 tools/sass_scan.py                                    # every csrc/ops/*/*.cu
    python3 tools/sass_scan.py csrc/ops/bias_grad/bias_grad.cu --kernel act_tile_kernel
    python3 tools/sass_scan.py --narrow 16                        # kernels with >= 16 narrow loads

Each kernel file is compiled for sm_90a as the build does (nvcc -cubin -O3), disassembled
with cuobjdump, and every kernel gets a line: its loads and stores by space and width
(LDG global, LDS shared, LD / ST generic, LDL / STL local: spills or arrays the compiler
could not keep in registers), and the 16-byte vectors it stores as four 32-bit stores
(split_vector_stores). What it is for: a vectorized kernel whose 16-byte accesses the
compiler split into 2-byte ones reads correctly and passes every test, and only its
bandwidth shows it. The thirty-ninth session found act_tile_kernel reading its staged rows
with 64 LDS.U16 where 8 LDS.128 do (RESULTS.md, activation section). Narrow loads are
expected in the element-by-element kernels and in the vector kernels' row edges; the
report lists, it does not judge.

cuobjdump and the nvdisasm it runs: from PATH, the CUDA toolkit, or the PyPI wheels
(`pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`: the toolkit on this project's
CPU machines has nvcc but neither).
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC_FLAGS = ["-std=c++17", "-arch=sm_90a", "-cubin", "-O3", "-Icsrc", "-Icsrc/include", "-DOPENTE_WITH_CUDA=1",
              "-DOPENTE_WITH_CUDNN=0"]
# opcode, then its modifiers (.E, .128, .U16, .CONSTANT ...)
MEMORY_OP = re.compile(r"\s(LDG|LDS|LDL|LD|STG|STS|STL|ST)((?:\.[A-Z0-9_]+)*)\s")
WIDTH = re.compile(r"\.(U8|S8|U16|S16|64|128)\b")
NARROW = {"U8", "S8", "U16", "S16"}


def find_tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/local/cuda/bin")
    if found:
        return found
    for base in sys.path:  # the PyPI wheels put it at nvidia/cu*/bin/
        for candidate in glob.glob(os.path.join(base, "nvidia", "cu*", "bin", name)):
            if os.access(candidate, os.X_OK):
                return candidate
    raise SystemExit(f"{name} not found: `pip install nvidia-cuda-{name}` provides it")


def source_tree(source: str) -> str:
    """The directory holding the csrc/ the source lies in (the include paths' root), so a
    file in a worktree of another commit compiles against that commit's headers."""
    tree = os.path.abspath(source)
    while os.path.basename(tree) != "csrc":
        parent = os.path.dirname(tree)
        if parent == tree:
            raise SystemExit(f"{source}: not under a csrc/ directory")
        tree = parent
    return os.path.dirname(tree)


def compiled(source: str, nvcc: str, cuobjdump: str, nvdisasm: str,
             dumps: tuple[str, ...] = ("-sass", "-res-usage")) -> tuple[str, ...]:
    """cuobjdump's listings of the compiled source, one a flag of `dumps` (by default its
    SASS and its resource usage)."""
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernels.cubin")
        subprocess.run([nvcc, *NVCC_FLAGS, os.path.abspath(source), "-o", cubin], cwd=source_tree(source),
                       check=True)
        return tuple(subprocess.run([cuobjdump, flag, cubin], check=True, capture_output=True, text=True,
                                    env=env).stdout for flag in dumps)


def disassemble(source: str, nvcc: str, cuobjdump: str, nvdisasm: str) -> str:
    return compiled(source, nvcc, cuobjdump, nvdisasm, dumps=("-sass",))[0]


def kernel_lines(sass: str) -> dict[str, list[str]]:
    """Mangled kernel name -> the disassembly's lines under its "Function :" header."""
    kernels: dict[str, list[str]] = {}
    lines = None
    for line in sass.splitlines():
        name = re.search(r"Function : (\S+)", line)
        if name:
            lines = kernels.setdefault(name.group(1), [])
        elif lines is not None:
            lines.append(line)
    return kernels


def kernel_counts(sass: str) -> dict[str, collections.Counter]:
    """Mangled kernel name -> counts of "LDS.128", "LDG.U16", "STL" ... (width "32" if none)."""
    kernels: dict[str, collections.Counter] = {}
    for name, lines in kernel_lines(sass).items():
        counts = kernels[name] = collections.Counter()
        for op in filter(None, map(MEMORY_OP.search, lines)):
            width = WIDTH.search(op.group(2))
            counts[f"{op.group(1)}.{width.group(1) if width else '32'}"] += 1
    return kernels


# STG.E (32 bits) of a register base and an offset: the pieces of a split vector store.
WORD_STORE = re.compile(r"\sSTG\.E\s+desc\[\w+\]\[(R\d+)\.64(?:\+0x([0-9a-f]+))?\]")


def split_vector_stores(lines: list[str]) -> int:
    """16-byte vectors stored as four 32-bit stores: runs of STG.E to one base register at
    offsets o, o + 4, o + 8, o + 12 in any order, o a multiple of 16, no other global store
    between them. The fifty-second session found the softmax's shifted rows stored so (a
    struct or uint4 copy beside a branch of element stores; the aligned kernels' same copy
    was one STG.E.128), with each of the four a write request of its own for the L2."""
    found, run = 0, []
    for line in lines:
        store = WORD_STORE.search(line)
        if not store:
            if re.search(r"\sSTG[.\s]", line):
                run = []  # a store of another width breaks a run
            continue
        run = (run + [(store.group(1), int(store.group(2) or "0", 16))])[-4:]
        offsets = sorted(offset for _, offset in run)  # in any order: the compiler interleaves them
        if (len(run) == 4 and len({base for base, _ in run}) == 1 and offsets[0] % 16 == 0
                and offsets == [offsets[0] + 4 * i for i in range(4)]):
            found, run = found + 1, []
    return found


def demangle(names: list[str]) -> list[str]:
    filt = shutil.which("c++filt")
    if not filt or not names:
        return names
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def narrow_loads(counts: collections.Counter) -> int:
    return sum(n for key, n in counts.items() if key.startswith("LD") and key.split(".")[1] in NARROW)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="*", help="kernel files (default: csrc/ops/*/*.cu)")
    parser.add_argument("--kernel", default="", help="only kernels whose demangled name contains this")
    parser.add_argument("--narrow", type=int, default=0, help="only kernels with at least this many 8/16-bit loads")
    args = parser.parse_args()
    nvcc, cuobjdump, nvdisasm = find_tool("nvcc"), find_tool("cuobjdump"), find_tool("nvdisasm")
    sources = args.sources or sorted(glob.glob(os.path.join(ROOT, "csrc", "ops", "*", "*.cu")))
    for source in sources:
        sass = disassemble(os.path.abspath(source), nvcc, cuobjdump, nvdisasm)
        kernels, lines = kernel_counts(sass), kernel_lines(sass)
        names = list(kernels)
        for mangled, readable in zip(names, demangle(names)):
            counts = kernels[mangled]
            if args.kernel not in readable or narrow_loads(counts) < args.narrow:
                continue
            ops = " ".join(f"{key}:{n}" for key, n in sorted(counts.items()))
            split = split_vector_stores(lines[mangled])
            print(f"{os.path.relpath(source, ROOT)}  {readable[:160]}\n    narrow loads {narrow_loads(counts)}"
                  f"{f'  split 16-byte stores {split}' if split else ''}  {ops}")


if __name__ == "__main__":
    main()
