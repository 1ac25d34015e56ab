"""Bad arguments to general_gemm: an exception that names the argument, from the
Python layer or (shapes, FP8 rules) the core's message, and nothing written."""

from dataclasses import dataclass

import pytest
import torch
from conftest import requires_cuda

from gemm_reference import E4M3, E5M2, fp8_operand
from transformer_engine.pytorch.cpp_extensions import DType, general_gemm, get_cublas_workspace_size_bytes


@dataclass
class Params:
    scale: torch.Tensor
    amax: torch.Tensor
    dtype: DType


def mats(device="cpu", dtype=torch.float32, m=6, k=4, n=5):
    """A [n, k] and B [m, k] for the default "TN" layout."""
    return torch.ones(n, k, dtype=dtype, device=device), torch.ones(m, k, dtype=dtype, device=device)


def workspace(device):
    return torch.empty(get_cublas_workspace_size_bytes(), dtype=torch.uint8, device=device) if device == "cuda" \
        else None


def test_workspace_size_query():
    assert get_cublas_workspace_size_bytes() == 32 << 20


@pytest.mark.parametrize("layout", ["TT", "tn", "T", "NNN", None, ""])
def test_layout(device, layout):
    A, B = mats(device)
    with pytest.raises(ValueError, match=r"layout must be one of TN, NN, NT"):
        general_gemm(A, B, workspace(device), layout=layout)


def test_inner_dims_mismatch(device):
    A, B = torch.ones(5, 4, device=device), torch.ones(6, 3, device=device)
    with pytest.raises(ValueError, match=r"inner dimensions differ"):
        general_gemm(A, B, workspace(device))


@pytest.mark.parametrize("mkn", [(16, 16, 8), (16, 24, 16), (4, 16, 16)])
def test_fp8_dims_multiple_of_16(device, mkn, gen):
    m, k, n = mkn
    A, B = fp8_operand((n, k), E4M3, gen, device), fp8_operand((m, k), E4M3, gen, device)
    with pytest.raises(ValueError, match=r"divisible by 16"):
        general_gemm(A, B, workspace(device))


def test_fp8_e5m2_pair(device, gen):
    A, B = fp8_operand((16, 16), E5M2, gen, device), fp8_operand((16, 16), E5M2, gen, device)
    with pytest.raises(ValueError, match=r"must not both be float8_e5m2"):
        general_gemm(A, B, workspace(device))


def test_accumulate_needs_out(device):
    with pytest.raises(ValueError, match=r"accumulate=True adds into out, so out must be given"):
        general_gemm(*mats(device), workspace(device), accumulate=True)


def test_beta_needs_accumulate(device):
    with pytest.raises(ValueError, match=r"beta must be 0 or None unless accumulate=True"):
        general_gemm(*mats(device), workspace(device), beta=0.5)


@pytest.mark.parametrize("kwargs", [dict(ub=object()), dict(ub_type=1), dict(extra_output=torch.ones(1)),
                                    dict(bulk_overlap=True)], ids=["ub", "ub_type", "extra_output", "bulk_overlap"])
def test_userbuffers_not_implemented(kwargs):
    with pytest.raises(NotImplementedError, match=r"ub, ub_type, extra_output, bulk_overlap"):
        general_gemm(*mats(), None, **kwargs)


@pytest.mark.parametrize(
    "make,exc,pattern",
    [
        (lambda d: (torch.ones(5, 4, dtype=torch.float64, device=d), mats(d)[1]), TypeError,
         r"A must be float32, float16 or bfloat16 \(FP8 comes as a Float8TensorBase\), got torch.float64"),
        (lambda d: (mats(d)[0], torch.ones(6, 4, dtype=torch.int32, device=d)), TypeError,
         r"B must be float32, float16 or bfloat16"),
        (lambda d: (mats(d)[0].to(torch.float8_e4m3fn), mats(d)[1]), TypeError, r"A must be .*Float8TensorBase"),
        (lambda d: (mats(d)[0], mats(d, torch.bfloat16)[1]), TypeError, r"B dtype must equal A dtype torch.float32"),
        (lambda d: ([[1.0]], mats(d)[1]), TypeError, r"A must be a torch.Tensor or a Float8TensorBase, got list"),
        (lambda d: (mats(d)[0].t(), mats(d)[1]), ValueError, r"A must be contiguous"),
        (lambda d: (mats(d)[0], torch.ones(4, 6, device=d).t()), ValueError, r"B must be contiguous"),
        (lambda d: (torch.ones((), device=d), mats(d)[1]), ValueError, r"at least one dimension"),
    ],
    ids=["A_float64", "B_int32", "A_torch_fp8", "mixed_dtypes", "A_list", "A_strided", "B_strided", "A_scalar"],
)
def test_operand_types(device, make, exc, pattern):
    A, B = make(device)
    with pytest.raises(exc, match=pattern):
        general_gemm(A, B, workspace(device))


def test_fp8_with_float_operand(device, gen):
    A, B = fp8_operand((16, 16), E4M3, gen, device), torch.ones(16, 16, device=device)
    with pytest.raises(TypeError, match=r"A and B must both be Float8TensorBase \(FP8\) or both float tensors"):
        general_gemm(A, B, workspace(device))


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(out=torch.ones(5, 6)), ValueError, r"out shape \(5, 6\) must flatten to \[6, 5\]"),
        (dict(out=torch.ones(6, 5, dtype=torch.float64)), TypeError, r"out must be float32, float16 or bfloat16"),
        (dict(out=torch.ones(6, 5), out_dtype=torch.bfloat16), TypeError, r"out dtype .* differs from out_dtype"),
        (dict(out_dtype=torch.int32), TypeError, r"out_dtype must be float32, float16 or bfloat16"),
        (dict(bias=torch.ones(4)), ValueError, r"bias must have n=5 elements"),
        (dict(bias=torch.ones(5, dtype=torch.int64)), TypeError, r"bias must be float32, float16 or bfloat16"),
        (dict(bias=torch.ones(5, device="meta")), ValueError, r"bias is on meta but A is on cpu"),
        (dict(grad=True, gelu=True), ValueError, r"gelu_in \(the saved pre-activation\) is required"),
        (dict(gelu_in=torch.ones(6, 5)), ValueError, r"gelu_in is only read with grad=True and gelu=True"),
        (dict(grad=True, gelu=True, gelu_in=torch.ones(5, 6)), ValueError, r"gelu_in shape \(5, 6\) must flatten"),
        (dict(quantization_params=object()), TypeError, r"quantization_params must have .scale, .amax and .dtype"),
        (dict(quantization_params=Params(torch.ones(1), None, DType.kBFloat16)), TypeError,
         r"quantization_params.dtype must be"),
        (dict(quantization_params=Params(torch.ones(2), None, E4M3)), ValueError,
         r"quantization_params.scale must have 1 element"),
        (dict(quantization_params=Params(torch.ones(1), None, E4M3), out=torch.ones(6, 5)), NotImplementedError,
         r"FP8 output .* into a given out"),
    ],
    ids=["out_shape", "out_float64", "out_vs_out_dtype", "out_dtype_int", "bias_length", "bias_int",
         "bias_device", "dgelu_without_gelu_in", "gelu_in_forward", "gelu_in_shape", "params_fields",
         "params_dtype", "params_scale", "fp8_into_out"],
)
def test_output_and_epilogue_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        general_gemm(*mats(), None, **kwargs)


def test_fp8_output_cannot_accumulate():
    with pytest.raises(ValueError, match=r"accumulate=True cannot add into an FP8 output"):
        general_gemm(*mats(), None, quantization_params=Params(torch.ones(1), None, E4M3), accumulate=True,
                     out=torch.ones(6, 5))


@requires_cuda
def test_devices_differ():
    A, B = mats("cuda")
    with pytest.raises(ValueError, match=r"B is on cpu but A is on cuda:0"):
        general_gemm(A, B.cpu(), workspace("cuda"))
    with pytest.raises(ValueError, match=r"out is on cpu but A is on cuda:0"):
        general_gemm(A, B, workspace("cuda"), out=torch.ones(6, 5))


@requires_cuda
def test_workspace_on_cuda():
    A, B = mats("cuda")
    with pytest.raises(ValueError, match=r"workspace must be at least 33554432 bytes"):
        general_gemm(A, B, torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    with pytest.raises(TypeError, match=r"workspace must be a torch.Tensor"):
        general_gemm(A, B, None)
    with pytest.raises(ValueError, match=r"workspace is on cpu but A is on cuda:0"):
        general_gemm(A, B, torch.empty(32 << 20, dtype=torch.uint8))


@requires_cuda
def test_fp8_needs_columnwise_copy_on_cuda(gen):
    """Hopper's FP8 GEMM reads only "TN"; other layouts need the transposed copy."""
    A, B = fp8_operand((16, 32), E4M3, gen, "cuda"), fp8_operand((16, 48), E4M3, gen, "cuda")
    A._transpose = None
    with pytest.raises(ValueError, match=r"A is FP8 and used untransposed.*column-wise"):
        general_gemm(A, B, workspace("cuda"), layout="NT")
