"""tools/sass_loops.py: the loops it finds in SASS and the instructions it counts in them.

The parsing runs on fixed listings everywhere; one test compiles a small kernel in two
trees and reads their real disassembly (needs nvcc and cuobjdump / nvdisasm, as
test_kernel_sass.py; skips without them).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool():
    sys.path.insert(0, os.path.join(ROOT, "tools"))  # sass_loops imports sass_scan
    spec = importlib.util.spec_from_file_location("sass_loops", os.path.join(ROOT, "tools", "sass_loops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sass_loops = load_tool()

# cuobjdump's layout: an outer loop 0x20-0x70 around an inner one 0x30-0x40, a forward
# branch after them, NOPs that must not count, and the branch to itself after the EXIT
# that ends every kernel (no loop of the kernel's).
LISTING = """
	code for sm_90a
		Function : _Z6kernelPf
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                              /* 0x0000000000007919 */
        /*0020*/                   FADD R2, R2, R3 ;                               /* 0x0000000302027221 */
        /*0030*/                   FFMA R4, R4, R5, R6 ;                           /* 0x0000000504047223 */
        /*0040*/               @P0 BRA 0x30 ;                                      /* 0xfffffffc00000947 */
        /*0050*/                   NOP ;                                           /* 0x0000000000007918 */
        /*0060*/                   SHFL.BFLY PT, R7, R2, 0x10, 0x1f ;              /* 0x0e201f0002077f89 */
        /*0070*/              @!P1 BRA 0x20 ;                                      /* 0xfffffffc00009947 */
        /*0080*/                   BRA 0x90 ;                                      /* 0x0000000000007947 */
        /*0090*/                   EXIT ;                                          /* 0x000000000000794d */
        /*00a0*/                   BRA 0xa0;                                       /* 0xfffffffc00fc7947 */
"""


def test_loops_and_their_bodies_from_a_listing():
    kernels = sass_loops.kernel_instructions(LISTING)
    assert list(kernels) == ["_Z6kernelPf"]
    instructions = kernels["_Z6kernelPf"]
    assert len(instructions) == 10  # the NOP left out
    assert sass_loops.loops(instructions) == [(0x20, 0x70), (0x30, 0x40)]  # nor the forward BRA, nor the last
    outer = sass_loops.body_counts(instructions, 0x20, 0x70, [])
    own = sass_loops.body_counts(instructions, 0x20, 0x70, [(0x30, 0x40)])
    assert sum(outer.values()) == 5 and outer["BRA"] == 2
    assert dict(own) == {"FADD": 1, "SHFL": 1, "BRA": 1}
    lines = sass_loops.report(instructions, 0, False)
    assert lines[0] == "    kernel: 10 instructions"
    assert lines[1] == "    loop 0x0020-0x0070: body 5, own 3 (fp32 1 shfl 1 ctrl 1)"
    assert lines[2] == "      loop 0x0030-0x0040: body 2, own 2 (fp32 1 ctrl 1)"  # nested: indented
    assert sass_loops.report(instructions, 3, False)[1:] == [lines[1]]  # --min 3 drops the inner loop


RESOURCES = """
Resource usage:
 Common:
  GLOBAL:0
 Function _Z6kernelPf:
  REG:32 STACK:8 SHARED:0 LOCAL:0 CONSTANT[0]:904 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_resource_usage_and_row_loop():
    assert sass_loops.resource_usage(RESOURCES) == {"_Z6kernelPf": (32, 8)}
    # the row loop: the loop with the largest own count (the outer one's 3, not the inner's 2)
    assert sass_loops.row_loop(sass_loops.kernel_instructions(LISTING)["_Z6kernelPf"]) == 3
    assert sass_loops.row_loop([]) == 0


KERNEL = """
__global__ void scale_rows(float* x, const float* s, int rows, int cols) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += x[r * cols + c];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) x[r * cols + c] = sum * s[c];
  }
}
"""


def test_loops_of_a_compiled_kernel(tmp_path):
    try:
        tools = [sass_loops.find_tool(name) for name in ("nvcc", "cuobjdump", "nvdisasm")]
    except SystemExit as missing:
        pytest.skip(str(missing))
    source = tmp_path / "csrc" / "scale_rows.cu"  # the tool compiles from the csrc/ tree's parent
    source.parent.mkdir()
    source.write_text(KERNEL)
    kernels = sass_loops.kernel_instructions(sass_loops.disassemble(str(source), *tools))
    (name, instructions), = kernels.items()
    assert "scale_rows" in name
    spans = sass_loops.loops(instructions)
    # the row loop, with the two column loops (the compiler may unroll them, not remove them) inside
    outer = [span for span in spans if all(a >= span[0] and b <= span[1] for a, b in spans)]
    assert len(outer) == 1
    inner = [span for span in spans if span != outer[0]]
    assert len(inner) >= 2
    body = sass_loops.body_counts(instructions, *outer[0], [])
    assert body["LDG"] >= 2 and body["STG"] >= 1 and body["FADD"] >= 1 and body["FMUL"] >= 1

    # --against: the same file in another tree, here without the scaling's multiply
    base = tmp_path / "base" / "csrc" / "scale_rows.cu"
    base.parent.mkdir(parents=True)
    base.write_text(KERNEL.replace("sum * s[c]", "sum"))
    (line,) = sass_loops.compare(str(source), str(tmp_path / "base"), tools, "scale_rows")
    there, here = map(int, line.split("loop")[1].split("registers")[0].split("->"))
    assert here > there > 0, line  # the multiply and the load of s[c] are in the row loop here
