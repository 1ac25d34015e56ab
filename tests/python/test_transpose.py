"""Transpose of any dtype into TE's column-wise layout [d_{n-1}, d_0, ..., d_{n-2}]:
bytes move unchanged (NaN bit patterns too), so comparisons are on raw bits."""

import pytest
import torch
from conftest import requires_cuda

from fp8_reference import assert_same_bits, dtype_id, random_bits, ref_columnwise, shape_id
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import transpose
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of

DTYPES = [
    torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.float16, torch.bfloat16,
    torch.float32, torch.int32, torch.int64,
]
SHAPES = [(1, 1), (7,), (3, 17), (17, 3), (2, 5, 33), (2, 3, 4, 5), (0, 16), (16, 0), (61, 127), (1, 300)]
LARGE_SHAPES = [(4096, 4095), (16384, 4096), (5, 999, 1025)]


def check(x):
    got = transpose(x)
    assert got.dtype == x.dtype and got.device == x.device
    assert got.shape == ((x.shape[-1], *x.shape[:-1]))
    expected = transpose(x.cpu()) if x.is_cuda else ref_columnwise(x)
    assert_same_bits(got, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_transpose(device, shape, dtype, gen):
    check(random_bits(shape, dtype, gen).to(device))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16, torch.float32, torch.int64], ids=dtype_id)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=shape_id)
def test_transpose_cuda_large(shape, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    check(random_bits(shape, dtype, g, device="cuda"))


# Bytes with both dims multiples of 8 take the tiled kernel (8x8 blocks in 128 x 128 tiles);
# these end in partial tiles in either dim, or are a single block.
BYTE_TILE_SHAPES = [(8, 8), (136, 200), (128, 128), (264, 1032), (24, 264, 16), (8, 4104)]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2], ids=dtype_id)
@pytest.mark.parametrize("shape", BYTE_TILE_SHAPES, ids=shape_id)
def test_transpose_byte_tiles(device, shape, dtype, gen):
    check(random_bits(shape, dtype, gen).to(device))


@pytest.mark.parametrize("offset", [1, 4, 8], ids=lambda o: f"offset{o}")
def test_transpose_bytes_off_alignment(device, offset, gen):
    """A byte view 1 or 4 bytes past an 8-byte boundary takes the one-byte-a-thread kernel,
    8 bytes past it the tiled one; the bytes around the output stay untouched."""
    rows, cols = 72, 136
    x = torch.empty(rows * cols + offset, dtype=torch.uint8, device=device)[offset:].view(rows, cols)
    x.copy_(random_bits((rows, cols), torch.uint8, gen).to(device))
    assert x.data_ptr() % 8 == offset % 8
    check(x)
    guard = torch.full((rows * cols + 2 * offset,), 0xA5, dtype=torch.uint8, device=device)
    out = guard[offset:offset + rows * cols].view(cols, rows)
    _core.transpose(describe(x, "x"), describe(out, "out"), stream_of(x))
    assert torch.equal(out.cpu(), x.cpu().t())
    assert bool((guard[:offset] == 0xA5).all()) and bool((guard[offset + rows * cols:] == 0xA5).all())


def test_transpose_known_values(device):
    x = torch.arange(6, dtype=torch.int32, device=device).reshape(2, 3)
    assert transpose(x).cpu().tolist() == [[0, 3], [1, 4], [2, 5]]
    # 3-D: [2, 2, 3] -> [3, 2, 2]; out[c, i, j] = x[i, j, c]
    y = torch.arange(12, dtype=torch.int64, device=device).reshape(2, 2, 3)
    out = transpose(y).cpu()
    assert out[2, 1, 0].item() == y[1, 0, 2].item() == 8


def test_transpose_twice_is_identity_for_matrices(device, gen):
    x = random_bits((37, 53), torch.float16, gen).to(device)
    assert_same_bits(transpose(transpose(x)), x)
