"""The norm kernels chosen by a rule of the device: the pipelined forward (an FP8 y,
row-wise, hidden 12288-16384) and RMSNorm's widest backward form (dx by the slope, hidden
12289-16384) run where the device's peak DRAM bandwidth an SM is 32 GB/s or more (an
H200: 37), the row kernel and the plain backward form elsewhere (an H100 SXM: 25.4); both
lost on an H100 (benchmarks/RESULTS.md, the forty-eighth and forty-ninth sessions). The
figure is common/cuda_utils' `dram_gb_per_s_per_sm`, which OPENTE_DRAM_GB_PER_S_PER_SM
replaces where set, so that any GPU can run either side's kernels: the forced tests run
the rule's test and the new forms' bit-for-bit tests (test_normalization.py) in a child
pytest under each side's figure."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from test_normalization import CUDA, E4M3, NORMS, make_inputs, run_bwd, run_fwd

H200_FORMS_MIN_GB_PER_S_PER_SM = 32  # kNormMemoryOutrunsSmsGBPerSm (csrc/ops/norm/norm_launch.h)
ENV = "OPENTE_DRAM_GB_PER_S_PER_SM"
HERE = os.path.dirname(os.path.abspath(__file__))


def dram_gb_per_s_per_sm(device):
    """The figure the rule reads: the environment's, else two transfers a memory clock
    over the bus, an SM (None where torch does not report the memory clock)."""
    if os.environ.get(ENV):
        return float(os.environ[ENV])
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 / props.multi_processor_count


def cuda_kernel_names(fn):
    """The names of the CUDA kernels fn launches (torch.profiler through CUPTI)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:
        pytest.skip("torch.profiler recorded no CUDA kernel (CUPTI unavailable)")
    return names


@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")
@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("norm", NORMS)
def test_forms_by_device_cuda(norm, device, gen):
    """200 x 16384 bf16 (an H200's figure 32 or more, an H100 SXM's less): the forward with an
    FP8 y takes the pipelined kernel exactly where the figure is 32 or more, never with both
    FP8 copies (their row-wise pass keeps the row kernel); RMSNorm's backward takes its
    widest form (PipelinedForm 3) there too, LayerNorm's its plain one (0) everywhere."""
    figure = dram_gb_per_s_per_sm(device)
    if figure is None:
        pytest.skip("torch reports no memory clock for this device")
    h200_side = figure >= H200_FORMS_MIN_GB_PER_S_PER_SM
    # the devices the rule was timed on fall on their own sides of it
    name = torch.cuda.get_device_name(device)
    if not os.environ.get(ENV) and ("H200" in name or "H100 80GB HBM3" in name):
        assert h200_side == ("H200" in name), f"{name}: {figure:.1f} GB/s an SM"
    x, w, b = (t.to(device) for t in make_inputs((200,), 16384, torch.bfloat16, torch.float32, False, gen))
    scale = torch.tensor([2.0], device=device)

    def forward(columnwise):
        return cuda_kernel_names(
            lambda: run_fwd(norm, x, w, b, 1e-5, False, fp8_dtype=E4M3, scale=scale, columnwise=columnwise))

    assert any("norm_fwd_pipelined_kernel" in n for n in forward(False)) == h200_side
    assert not any("norm_fwd_pipelined_kernel" in n for n in forward(True))

    _, mu, rsigma = run_fwd(norm, x, w, b, 1e-5, False)
    dz = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
    backward = cuda_kernel_names(lambda: run_bwd(norm, dz, x, mu, rsigma, w, False))
    pattern = re.compile(r"norm_bwd_pipelined_kernel<.*PipelinedForm\)(\d)>")
    forms = [int(m.group(1)) for m in map(pattern.search, backward) if m]
    assert forms == [3 if h200_side and norm == "rmsnorm" else 0]


# The tests the forced figure runs: the rule's (above), the pipelined forward's against the
# row kernel (fewer rows than blocks, and 1000: blocks that stride over rows, each staged
# while the one before it is worked on) and with no rows in allocations (its grid of one
# block), RMSNorm's widest backward form against the references (long and hard rows).
# Under compute-sanitizer: OPENTE_DRAM_GB_PER_S_PER_SM=1000 with FORCED_SELECTION as -k.
FORCED_SELECTION = ("forms_by_device or pipelined_rows or (zero_rows_in_allocations and h16384 and cuda) or "
                    "(bwd and long_rows and h12296) or (bwd and hard_rows and h16384 and cuda)")


@pytest.mark.child_process
@pytest.mark.parametrize("device", CUDA)
@pytest.mark.parametrize("figure", ["0", "1000"], ids=["h100_side", "h200_side"])
def test_forms_forced_cuda(figure, device):
    """Under OPENTE_DRAM_GB_PER_S_PER_SM, in a child pytest: the rule's test (above) finds
    the figure's side's kernels, and at 1000 the tests that hold the H200's forms to the
    row kernel's and the references' results pass (on an H100 too). Marked
    child_process: compute-sanitizer would follow the child."""
    select = FORCED_SELECTION if figure == "1000" else "forms_by_device"  # (0: an H100's kernels, as tested)
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_norm_device_forms.py",
         "test_normalization.py", "-k", select],
        cwd=HERE, env=dict(os.environ, **{ENV: figure}), capture_output=True, text=True, timeout=900)
    summary = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert " passed" in summary, summary
    if "skipped" in summary:  # the rule's test, where CUPTI records no kernel
        pytest.skip(f"the child pytest skipped some: {summary}")


@pytest.mark.child_process
@pytest.mark.parametrize("device", CUDA)
def test_figure_not_a_number_cuda(device):
    """OPENTE_DRAM_GB_PER_S_PER_SM=fast: the first call that reads the figure (RMSNorm's
    backward at hidden 16384) raises a ValueError that names the variable."""
    code = (
        "import torch\n"
        "from transformer_engine.pytorch.cpp_extensions import rmsnorm_bwd, rmsnorm_fwd\n"
        "x = torch.randn(4, 16384, device='cuda', dtype=torch.bfloat16)\n"
        "w = torch.ones(16384, device='cuda')\n"
        "_, _, rs = rmsnorm_fwd(x, w, 1e-5, False)\n"
        "try:\n"
        "    rmsnorm_bwd(torch.ones_like(x), x, rs, w, False)\n"
        "except ValueError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    print('no error')\n")
    assert device == "cuda"  # the child's tensors are on the current CUDA device
    child = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=dict(os.environ, **{ENV: "fast"}),
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "OPENTE_DRAM_GB_PER_S_PER_SM=fast" in child.stdout, child.stdout
