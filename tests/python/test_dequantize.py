"""Dequantize: fp8_to_float(q) * scale_inv, rounded to the output dtype, against
torch's FP8 decoding on the CPU and against the CPU core on CUDA."""

import pytest
import torch
from conftest import requires_cuda

from fp8_reference import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    TORCH_FP8,
    assert_float_equal,
    dtype_id,
    random_bits,
    ref_dequantize,
    shape_id,
)
from transformer_engine.pytorch.cpp_extensions import DType, dequantize

SHAPES = [(), (1, 1), (7,), (3, 17), (2, 5, 33), (0, 16), (16, 16), (61, 127)]
LARGE_SHAPES = [(4096, 4095), (16384, 4096)]
# scale_inv values: exact, inexact, huge (overflows fp16), tiny (subnormal results).
SCALE_INVS = [1.0, 0.3, 2.0**100, 2.0**-120]


def run_dequantize(bits, fp8_dtype, scale_inv, dtype):
    s = torch.tensor([scale_inv], dtype=torch.float32, device=bits.device)
    return dequantize(bits, s, fp8_dtype, dtype=dtype)


def check(bits, fp8_dtype, scale_inv, dtype):
    got = run_dequantize(bits, fp8_dtype, scale_inv, dtype)
    assert got.dtype == dtype and got.shape == bits.shape and got.device == bits.device
    if bits.is_cuda:
        # The CPU core is the reference of the kernels. NaN payloads are left free:
        # the sign of a NaN after a multiply is the hardware's choice.
        assert_float_equal(got, run_dequantize(bits.cpu(), fp8_dtype, scale_inv, dtype))
    else:
        assert_float_equal(got, ref_dequantize(bits, fp8_dtype, scale_inv, dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("scale_inv", SCALE_INVS)
def test_dequantize_every_code(device, scale_inv, fp8_dtype, dtype):
    # All 256 codes: zeros, subnormals, normals, the max, NaN (and E5M2's inf).
    bits = torch.arange(256, dtype=torch.uint8).reshape(16, 16).to(device)
    check(bits, fp8_dtype, scale_inv, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_dequantize_shapes(device, shape, fp8_dtype, dtype, gen):
    bits = random_bits(shape, torch.uint8, gen).to(device)
    check(bits, fp8_dtype, 0.7, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
def test_dequantize_misaligned(device, fp8_dtype, dtype, gen):
    """Codes one byte into their storage (no 8-byte vectors: the element-by-element
    kernel on the GPU)."""
    bits = random_bits((1 + 61 * 127,), torch.uint8, gen).to(device)[1:].view(61, 127)
    check(bits, fp8_dtype, 0.7, dtype)


@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=shape_id)
def test_dequantize_cuda_large(shape, fp8_dtype, dtype, seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    check(random_bits(shape, torch.uint8, g, device="cuda"), fp8_dtype, 1.3, dtype)


def test_dequantize_known_values(device):
    # Decoded by hand: E4M3 0x38 = 1.0, 0x7e = 448, 0x01 = 2^-9, 0xbc = -1.5;
    # E5M2 0x3c = 1.0, 0x7b = 57344, 0x7c = inf, 0x01 = 2^-16.
    s = torch.tensor([2.0], device=device)
    e4 = dequantize(torch.tensor([0x38, 0x7E, 0x01, 0xBC], dtype=torch.uint8, device=device), s, DType.kFloat8E4M3)
    assert e4.cpu().tolist() == [2.0, 896.0, 2.0**-8, -3.0]
    e5 = dequantize(torch.tensor([0x3C, 0x7B, 0x7C, 0x01], dtype=torch.uint8, device=device), s, DType.kFloat8E5M2)
    assert e5.cpu().tolist() == [2.0, 114688.0, float("inf"), 2.0**-15]


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
def test_dequantize_torch_fp8_input(device, fp8_dtype, gen):
    # A torch float8 tensor carries its own format: no fp8_dtype needed, same result.
    bits = random_bits((9, 13), torch.uint8, gen).to(device)
    s = torch.tensor([0.25], device=device)
    from_bits = dequantize(bits, s, fp8_dtype, dtype=torch.bfloat16)
    from_fp8 = dequantize(bits.view(TORCH_FP8[fp8_dtype]), s, dtype=torch.bfloat16)
    assert_float_equal(from_fp8, from_bits)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
def test_dequantize_default_dtype_is_float32(device, fp8_dtype):
    out = dequantize(torch.zeros(3, dtype=torch.uint8, device=device), torch.ones(1, device=device), fp8_dtype)
    assert out.dtype == torch.float32
