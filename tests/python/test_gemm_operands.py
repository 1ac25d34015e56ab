"""Float8TensorBase, the FP8 operand storage the GEMM reads: making one from a
high-precision tensor, dequantizing either copy, shape queries and bad arguments."""

import pytest
import torch

from fp8_reference import FP8_DTYPES, assert_fp8_equal, dtype_id, f32, ref_columnwise, ref_dequantize, ref_quantize
from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.tensor import Float8TensorBase

SHAPES = [(7,), (16, 48), (2, 3, 16)]


def make(shape, fp8_dtype, gen, device, rowwise=True, columnwise=True):
    x = (torch.randn(shape, generator=gen) * 3).to(device)
    scale = torch.tensor([20.3], device=device)
    amax = torch.zeros(1, device=device)
    return x, Float8TensorBase.from_tensor(x, fp8_dtype, scale, amax=amax, rowwise=rowwise, columnwise=columnwise), amax


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_from_tensor(device, shape, fp8_dtype, gen):
    x, t, amax = make(shape, fp8_dtype, gen, device)
    bits = ref_quantize(x.cpu(), fp8_dtype, 20.3)
    assert_fp8_equal(t._data, bits, fp8_dtype)
    assert_fp8_equal(t._transpose, ref_columnwise(bits), fp8_dtype)
    assert t._scale_inv.item() == f32(1) / f32(20.3)
    assert amax.item() == f32(x.abs().max().item())
    assert t._fp8_dtype == fp8_dtype and t.size() == x.shape and t.shape == x.shape
    assert t.device == x.device and t.size(-1) == shape[-1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dequantize_either_copy(device, shape, dtype, gen):
    """The row-wise data and the column-wise copy alone dequantize to the same values
    (exactly: one product by scale_inv per element, then one rounding)."""
    x, both, _ = make(shape, DType.kFloat8E4M3, gen, device)
    expected = ref_dequantize(both._data.cpu(), DType.kFloat8E4M3, both._scale_inv.item(), dtype)
    col_only = Float8TensorBase(data_transpose=both._transpose, fp8_scale_inv=both._scale_inv,
                                fp8_dtype=DType.kFloat8E4M3)
    assert col_only._data is None and col_only.size() == x.shape and col_only.size(0) == shape[0]
    for t in (both, col_only):
        got = t.dequantize(dtype=dtype)
        assert got.dtype == dtype and got.shape == x.shape and got.device == x.device
        assert torch.equal(got.cpu(), expected)


def test_columnwise_only_from_tensor(gen):
    x, t, _ = make((16, 32), DType.kFloat8E5M2, gen, "cpu", rowwise=False)
    assert t._data is None and t._transpose.shape == (32, 16) and t.shape == (16, 32)
    assert "columnwise" in repr(t) and "rowwise" not in repr(t)


def test_accepts_torch_fp8_dtype_names():
    t = Float8TensorBase(data=torch.zeros(2, 2, dtype=torch.uint8), fp8_scale_inv=torch.ones(1),
                         fp8_dtype=torch.float8_e5m2)
    assert t._fp8_dtype == DType.kFloat8E5M2


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(data=None), ValueError, r"needs data, data_transpose or both"),
        (dict(data=torch.zeros(4, 2)), TypeError, r"data must be a torch.uint8 tensor"),
        (dict(data_transpose=torch.zeros(4, 2, dtype=torch.uint8)), ValueError,
         r"data_transpose shape \(4, 2\) must be \(2, 4\)"),
        (dict(fp8_scale_inv=torch.ones(2)), ValueError, r"fp8_scale_inv must have 1 element"),
        (dict(fp8_scale_inv=torch.ones(1, dtype=torch.float64)), TypeError, r"fp8_scale_inv must be float32"),
        (dict(fp8_dtype=DType.kBFloat16), TypeError, r"fp8_dtype must be"),
    ],
)
def test_bad_arguments(kwargs, exc, pattern):
    args = dict(data=torch.zeros(4, 2, dtype=torch.uint8), fp8_scale_inv=torch.ones(1), fp8_dtype=DType.kFloat8E4M3)
    args.update(kwargs)
    with pytest.raises(exc, match=pattern):
        Float8TensorBase(**args)
