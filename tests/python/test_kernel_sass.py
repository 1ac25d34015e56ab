"""The tiled activation / bias-gradient kernels' machine code (SASS), checked without a GPU.

act_tile_kernel stages each thread's eight rows of 16-byte input vectors in shared memory.
Converted to floats straight from there, the compiler read them 2 bytes at a time (64
LDS.U16 per input where 8 LDS.128 do), which no result shows, only the bandwidth: 5% of
dgelu + dbias + cast + transpose on an H200 (benchmarks/RESULTS.md, activation section).
Needs nvcc and cuobjdump / nvdisasm (tools/run_tests.sh installs the latter two from PyPI);
skips without them.
"""

from __future__ import annotations

import importlib.util
import os

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
