"""tools/sass_same.py: whether kernel files compile to the same machine code as before."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "sass_same.py")
spec = importlib.util.spec_from_file_location("sass_same", TOOL)
sass_same = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_same)

# cuobjdump -sass's shape: a header line a kernel, then address comments, instructions and their
# encodings
SASS = """
        Function : _Z10add_kernelPff
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 FADD.FTZ   R0, R0,  c[0x0][0x218] ;         /* 0x000000ff0000a7b82 */
        /*0020*/                   NOP ;                                       /* 0x0000000000007918 */
        /*0030*/                   EXIT ;                                      /* 0x000000000000794d */
        Function : _Z12scale_kernelPff
        /*0000*/                   FMUL R0, R0, 2 ;                            /* 0x4000000000007820 */
        /*0010*/                   EXIT ;                                      /* 0x000000000000794d */
"""


def test_kernel_code_keeps_predicates_modifiers_and_operands_and_drops_nops():
    code = sass_same.kernel_code(SASS)
    assert code == {
        "_Z10add_kernelPff": ["LDC R1, c[0x0][0x28]", "@!P0 FADD.FTZ R0, R0, c[0x0][0x218]", "EXIT"],
        "_Z12scale_kernelPff": ["FMUL R0, R0, 2", "EXIT"],
    }


def test_differences_name_each_kernel_and_the_first_changed_instruction():
    before = {"a(float*)": [["FADD R0, R0, 1", "EXIT"]], "b(float*)": [["EXIT"]], "gone()": [["EXIT"]]}
    after = {"a(float*)": [["FADD R0, R0, 2", "EXIT"]], "b(float*)": [["EXIT"]], "new()": [["EXIT"]]}
    assert sass_same.differences(before, after) == [
        "only before: gone()",
        "only after: new()",
        "differs: a(float*): 2 -> 2 instructions; the first difference, instruction 0: FADD R0, R0, 1 -> FADD R0, R0, 2",
    ]
    longer = {"b(float*)": [["EXIT", "BRA 0x10"]]}
    assert sass_same.differences({"b(float*)": [["EXIT"]]}, longer) == [
        "differs: b(float*): 1 -> 2 instructions; the first difference, instruction 1: (end) -> BRA 0x10"]
    assert sass_same.differences(before, dict(before)) == []


def test_a_template_compiled_in_two_files_keeps_both_copies():
    both = sass_same.readable_kernels([SASS, SASS])
    name = next(n for n in both if "add_kernel" in n)  # demangled where c++filt is found
    assert both[name] == [sass_same.kernel_code(SASS)["_Z10add_kernelPff"]] * 2
    one = sass_same.readable_kernels([SASS])
    assert sass_same.differences(both, both) == []
    scale = next(n for n in both if "scale_kernel" in n)
    assert sass_same.differences(one, both) == [f"differs: {name}: in 1 files before, 2 after",
                                                f"differs: {scale}: in 1 files before, 2 after"]


# ---- the command on real files: needs nvcc, cuobjdump and nvdisasm (tools/run_tests.sh) ----

SCALE = """namespace {
__global__ void scale_kernel(float* x, float s) { x[threadIdx.x] *= s; }
}  // namespace
void scale(float* x) { scale_kernel<<<1, 32>>>(x, 2.0f); }
"""
ADD = """__global__ void add_kernel(float* x, float a) { x[threadIdx.x] += a; }
void add(float* x) { add_kernel<<<1, 32>>>(x, 1.0f); }
"""


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def test_command_one_file_split_in_two_then_a_kernel_changed(tmp_path):
    try:
        for tool in ("nvcc", "cuobjdump", "nvdisasm"):
            sass_same.find_tool(tool)
    except SystemExit as missing:
        pytest.skip(str(missing))
    one = write(tmp_path / "before" / "csrc" / "ops" / "k" / "k.cu", SCALE + ADD)
    # the anonymous namespace's kernel now in a file of another name (another hash in its mangled name)
    halves = [write(tmp_path / "after" / "csrc" / "ops" / "k" / "k_scale.cu", SCALE),
              write(tmp_path / "after" / "csrc" / "ops" / "k" / "k_add.cu", ADD)]
    same = subprocess.run([sys.executable, TOOL, one, "--after", *halves], capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    summary = same.stdout.splitlines()[-1]
    assert summary.startswith("2 kernels (") and summary.endswith(" in 2 after: the same code"), summary
    write(halves[1], ADD.replace("+= a", "+= 2.0f * a"))
    changed = subprocess.run([sys.executable, TOOL, one, "--after", *halves], capture_output=True, text=True)
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert changed.stdout.splitlines()[0].startswith("differs: add_kernel(float*, float): ")
    assert changed.stdout.splitlines()[-1].endswith("after: 1 differences")
