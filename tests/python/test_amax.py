"""amax = max(amax, max|x|) with NaNs ignored; exact, so compared with ==."""

import math

import pytest
import torch
from conftest import requires_cuda

from fp8_reference import FLOAT_DTYPES, dtype_id, ref_amax, shape_id, spread_input
from transformer_engine.pytorch.cpp_extensions import DType, compute_amax

SHAPES = [(), (1, 1), (7,), (3, 17), (2, 5, 33), (0, 16), (61, 127), (1, 10007)]
LARGE_SHAPES = [(4096, 4095), (16384, 4096)]


def spread(shape, dtype, gen, device="cpu"):
    # Finite values from ~2^-11 to ~900 (inf would mask every other element).
    x = spread_input(shape, torch.float32, DType.kFloat8E4M3, 1.0, gen, device)
    return torch.nan_to_num(x, nan=float("nan"), posinf=3.0, neginf=-2.0).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_amax(device, shape, dtype, gen):
    x = spread(shape, dtype, gen)
    got = compute_amax(x.to(device))
    assert got.dtype == torch.float32 and got.shape == (1,) and got.device.type == device
    if device == "cuda":
        assert got.item() == compute_amax(x).item()
    else:
        assert got.item() == ref_amax(x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_amax_misaligned(device, dtype, gen):
    """A view one element into its storage (no 16-byte vectors: the element-by-element
    kernel on the GPU), the maximum planted at its last element."""
    base = spread((1 + 61 * 127,), dtype, gen)
    base[-1] = -49152.0  # 1.5 * 2^15, exact in every input dtype
    got = compute_amax(base.to(device)[1:].view(61, 127)).item()
    assert got == ref_amax(base[1:].view(61, 127)) == 49152.0


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=shape_id)
def test_amax_cuda_large(shape, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    x = spread(shape, dtype, g, device="cuda")
    # Plant the maximum at the very last element so a reduction that drops a tail fails.
    x.view(-1)[-1] = -49152.0  # 1.5 * 2^15, exact in every input dtype
    got = compute_amax(x).item()
    assert got == compute_amax(x.cpu()).item() == 49152.0


@pytest.mark.parametrize("start,expected", [(0.0, 4.0), (1.0, 4.0), (10.0, 10.0)])
def test_amax_accumulates_into_given_buffer(device, start, expected):
    x = torch.tensor([[1.0, -4.0, float("nan")]], device=device)
    amax = torch.tensor([start], device=device)
    assert compute_amax(x, amax) is amax
    assert amax.item() == expected


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_amax_special_values(device, dtype):
    nan, inf = float("nan"), float("inf")
    assert compute_amax(torch.full((5, 3), nan, dtype=dtype, device=device)).item() == 0.0  # all NaN
    assert compute_amax(torch.tensor([nan, -inf, 1.0], dtype=dtype, device=device)).item() == inf
    assert compute_amax(torch.tensor([-0.0, 0.0], dtype=dtype, device=device)).item() == 0.0
    assert math.copysign(1, compute_amax(torch.tensor([-0.0], dtype=dtype, device=device)).item()) == 1
    empty = torch.empty(0, 16, dtype=dtype, device=device)
    assert compute_amax(empty, torch.tensor([2.5], device=device)).item() == 2.5  # unchanged


def test_amax_of_low_precision_is_exact(device):
    # fp16 max and bf16's largest finite value survive the widening to fp32 exactly.
    assert compute_amax(torch.tensor([-65504.0], dtype=torch.float16, device=device)).item() == 65504.0
    big = torch.finfo(torch.bfloat16).max
    assert compute_amax(torch.tensor([1.0, -big], dtype=torch.bfloat16, device=device)).item() == big
