"""Kernels' machine code (SASS), checked without a GPU: faults no result shows, only the
bandwidth.

act_tile_kernel stages each thread's eight rows of 16-byte input vectors in shared memory.
Converted to floats straight from there, the compiler read them 2 bytes at a time (64
LDS.U16 per input where 8 LDS.128 do): 5% of dgelu + dbias + cast + transpose on an H200
(benchmarks/RESULTS.md, activation section). The softmax's rows of odd sk stored their
whole vectors as four 32-bit stores and their first and last vectors byte by byte: 7-11%
of the short rows' time on an H100 (RESULTS.md, softmax section, fifty-second session), and
RoPE stored every 16-byte run so (its d2 = d/2 rows 4-15% slower on an H100, RESULTS.md, RoPE
section, fifty-third session).
Needs nvcc and cuobjdump / nvdisasm (tools/run_tests.sh installs the latter two from PyPI);
skips without them.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_sass_scan():
    spec = importlib.util.spec_from_file_location("sass_scan", os.path.join(ROOT, "tools", "sass_scan.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sass_scan = load_sass_scan()


def tools():
    try:
        return sass_scan.find_tool("nvcc"), sass_scan.find_tool("cuobjdump"), sass_scan.find_tool("nvdisasm")
    except SystemExit as missing:
        pytest.skip(str(missing))


# bias_grad.cu instantiates the backward modes (kIdentity, kBwd, kBwdGated), activation.cu the
# forward ones (kFwd, kFwdGated).
@pytest.mark.parametrize("source", ["csrc/ops/bias_grad/bias_grad.cu", "csrc/ops/activation/activation.cu"])
def test_tile_kernels_read_staged_rows_as_16_byte_vectors(source):
    nvcc, cuobjdump, nvdisasm = tools()
    kernels = sass_scan.kernel_counts(sass_scan.disassemble(os.path.join(ROOT, source), nvcc, cuobjdump, nvdisasm))
    # the fast tiled kernels (mangled names; act_tile_generic_kernel goes element by element by design)
    tiled = {name: counts for name, counts in kernels.items() if "act_tile_kernel" in name}
    assert tiled, f"no act_tile_kernel in {source}"
    for name, counts in tiled.items():
        narrow_shared = counts["LDS.U16"] + counts["LDS.S16"] + counts["LDS.U8"] + counts["LDS.S8"]
        assert narrow_shared == 0, f"{name}: {narrow_shared} narrow shared-memory loads ({dict(counts)})"
        assert counts["LDS.128"] >= 8, f"{name}: {counts['LDS.128']} 16-byte shared-memory loads ({dict(counts)})"


@pytest.mark.parametrize("source", ["csrc/ops/softmax/softmax_fwd.cu", "csrc/ops/softmax/softmax_bwd.cu"])
def test_softmax_stores_whole_vectors_and_no_bytes(source):
    nvcc, cuobjdump, nvdisasm = tools()
    sass = sass_scan.disassemble(os.path.join(ROOT, source), nvcc, cuobjdump, nvdisasm)
    kernels, lines = sass_scan.kernel_counts(sass), sass_scan.kernel_lines(sass)
    rows = [name for name in kernels if "softmax" in name and "rows_kernel" in name]
    assert len(rows) >= 40, f"{len(rows)} softmax row kernels in {source}"
    for name in rows:
        counts = kernels[name]
        # the outputs are 16- and 32-bit elements: a byte store is an element split in two
        assert counts["STG.U8"] == 0, f"{name}: {counts['STG.U8']} byte stores ({dict(counts)})"
        split = sass_scan.split_vector_stores(lines[name])
        assert split == 0, f"{name}: {split} 16-byte vectors stored as four 32-bit stores"
        # the kernels of 16-byte vectors (kV of 8 16-bit or 4 fp32 elements, the template's
        # second argument; kV = 1 goes element by element) store some whole
        vector = re.search(r"rows_kernelI(?:13__nv_bfloat16|6__half|f)Li(\d+)E", name)
        assert vector, f"{name}: no element type and kV in the name"
        if int(vector.group(1)) > 1:
            assert counts["STG.128"] >= 1, f"{name}: no 16-byte store ({dict(counts)})"


def test_rope_stores_whole_vectors():
    nvcc, cuobjdump, nvdisasm = tools()
    sass = sass_scan.disassemble(os.path.join(ROOT, "csrc/ops/rope/rope.cu"), nvcc, cuobjdump, nvdisasm)
    kernels, lines = sass_scan.kernel_counts(sass), sass_scan.kernel_lines(sass)
    ropes = [name for name in kernels if "rope_kernel" in name]
    assert len(ropes) >= 6, f"{len(ropes)} rope kernels"
    for name in ropes:
        split = sass_scan.split_vector_stores(lines[name])
        assert split == 0, f"{name}: {split} 16-byte runs stored as four 32-bit stores"
        # the kernels of 16-byte runs (the template's first flag; without it, element by
        # element) store some whole
        vectorized = re.search(r"rope_kernelI(?:13__nv_bfloat16|6__half|f)Lb(\d)E", name)
        assert vectorized, f"{name}: no element type and flag in the name"
        if vectorized.group(1) == "1":
            assert kernels[name]["STG.128"] >= 1, f"{name}: no 16-byte store ({dict(kernels[name])})"
