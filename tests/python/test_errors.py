"""Bad arguments to the torch helpers: a clear exception that names the argument,
raised before anything runs."""

import pytest
import torch
from conftest import requires_cuda

from transformer_engine.pytorch.cpp_extensions import (
    DType,
    compute_amax,
    compute_scale_from_amax,
    delayed_scaling_update,
    dequantize,
    quantize,
    transpose,
)

E4M3 = DType.kFloat8E4M3


def one(device="cpu", dtype=torch.float32):
    return torch.ones(1, dtype=dtype, device=device)


# ---- quantize -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.uint8, torch.float8_e4m3fn])
def test_quantize_rejects_input_dtype(device, dtype):
    x = torch.zeros(4, 4, device=device).to(dtype)
    with pytest.raises(TypeError, match=r"x must be float32, float16 or bfloat16"):
        quantize(x, E4M3, one(device))


def test_quantize_rejects_non_tensor():
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        quantize([[1.0]], E4M3, one())


def test_quantize_rejects_non_contiguous_input(device):
    x = torch.ones(4, 6, device=device).t()
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        quantize(x, E4M3, one(device))


@pytest.mark.parametrize("fp8_dtype", [DType.kFloat32, DType.kByte, torch.float16, torch.uint8, "e4m3", 4, None])
def test_quantize_rejects_fp8_dtype(device, fp8_dtype):
    with pytest.raises(TypeError, match=r"fp8_dtype must be"):
        quantize(torch.ones(2, 2, device=device), fp8_dtype, one(device))


@pytest.mark.parametrize(
    "make_scale,exc,pattern",
    [
        (lambda d: torch.ones(2, device=d), ValueError, r"scale must have 1 element"),
        (lambda d: torch.ones(0, device=d), ValueError, r"scale must have 1 element"),
        (lambda d: torch.ones(1, dtype=torch.float64, device=d), TypeError, r"scale must be float32"),
        (lambda d: torch.ones(1, dtype=torch.bfloat16, device=d), TypeError, r"scale must be float32"),
        (lambda d: 1.0, TypeError, r"scale must be a torch.Tensor"),
    ],
)
def test_quantize_rejects_scale(device, make_scale, exc, pattern):
    with pytest.raises(exc, match=pattern):
        quantize(torch.ones(2, 2, device=device), E4M3, make_scale(device))


@pytest.mark.parametrize("name", ["amax", "scale_inv"])
def test_quantize_rejects_optional_buffers(device, name):
    x = torch.ones(2, 2, device=device)
    with pytest.raises(ValueError, match=rf"{name} must have 1 element"):
        quantize(x, E4M3, one(device), **{name: torch.zeros(3, device=device)})
    with pytest.raises(TypeError, match=rf"{name} must be float32"):
        quantize(x, E4M3, one(device), **{name: torch.zeros(1, dtype=torch.float16, device=device)})


def test_quantize_needs_some_output(device):
    with pytest.raises(ValueError, match=r"rowwise and columnwise"):
        quantize(torch.ones(2, 2, device=device), E4M3, one(device), rowwise=False, columnwise=False)


@requires_cuda
@pytest.mark.parametrize("name", ["scale", "amax", "scale_inv"])
def test_quantize_rejects_buffer_on_other_device(name):
    x = torch.ones(2, 2, device="cuda")
    kwargs = {"scale": one("cuda"), name: one("cpu")}
    with pytest.raises(ValueError, match=rf"{name} is on cpu but must be on cuda"):
        quantize(x, E4M3, **kwargs)
    with pytest.raises(ValueError, match=r"scale is on cuda:0 but must be on cpu"):
        quantize(torch.ones(2, 2), E4M3, one("cuda"))


# ---- dequantize -----------------------------------------------------------------


def test_dequantize_uint8_needs_fp8_dtype(device):
    with pytest.raises(TypeError, match=r"fp8_dtype is required"):
        dequantize(torch.zeros(4, dtype=torch.uint8, device=device), one(device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.int32])
def test_dequantize_rejects_data_dtype(device, dtype):
    with pytest.raises(TypeError, match=r"data must be uint8 or a torch float8 dtype"):
        dequantize(torch.zeros(4, dtype=dtype, device=device), one(device), E4M3)


def test_dequantize_rejects_fp8_dtype(device):
    data = torch.zeros(4, dtype=torch.uint8, device=device)
    with pytest.raises(TypeError, match=r"fp8_dtype must be"):
        dequantize(data, one(device), DType.kBFloat16)
    with pytest.raises(TypeError, match=r"fp8_dtype .* contradicts data dtype"):
        dequantize(data.view(torch.float8_e4m3fn), one(device), DType.kFloat8E5M2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.uint8])
def test_dequantize_rejects_output_dtype(device, dtype):
    with pytest.raises(TypeError, match=r"dtype must be float32, float16 or bfloat16"):
        dequantize(torch.zeros(4, dtype=torch.uint8, device=device), one(device), E4M3, dtype=dtype)


def test_dequantize_rejects_scale_inv(device):
    data = torch.zeros(4, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match=r"scale_inv must have 1 element"):
        dequantize(data, torch.ones(4, device=device), E4M3)
    with pytest.raises(TypeError, match=r"scale_inv must be float32"):
        dequantize(data, one(device, torch.float64), E4M3)


def test_dequantize_rejects_non_contiguous_data(device):
    data = torch.zeros(4, 6, dtype=torch.uint8, device=device).t()
    with pytest.raises(ValueError, match=r"data must be contiguous"):
        dequantize(data, one(device), E4M3)


@requires_cuda
def test_dequantize_rejects_scale_inv_on_other_device():
    with pytest.raises(ValueError, match=r"scale_inv is on cpu but must be on cuda"):
        dequantize(torch.zeros(4, dtype=torch.uint8, device="cuda"), one("cpu"), E4M3)


# ---- transpose, amax ----------------------------------------------------------------


def test_transpose_rejects_bad_input(device):
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        transpose(torch.ones(3, 5, device=device).t())
    with pytest.raises(TypeError, match=r"x: dtype torch.float64 is not supported"):
        transpose(torch.ones(3, 5, dtype=torch.float64, device=device))
    with pytest.raises(TypeError, match=r"x: dtype torch.bool is not supported"):
        transpose(torch.ones(3, 5, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match=r"x must have at least one dimension"):
        transpose(torch.tensor(1.0, device=device))
    with pytest.raises(TypeError, match=r"x must be a torch.Tensor"):
        transpose([[1, 2]])


def test_compute_amax_rejects_bad_arguments(device):
    with pytest.raises(TypeError, match=r"x must be float32, float16 or bfloat16"):
        compute_amax(torch.ones(3, dtype=torch.float64, device=device))
    with pytest.raises(TypeError, match=r"x must be float32, float16 or bfloat16"):
        compute_amax(torch.ones(3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match=r"x must be contiguous"):
        compute_amax(torch.ones(3, 5, device=device).t())
    with pytest.raises(ValueError, match=r"amax must have 1 element"):
        compute_amax(torch.ones(3, device=device), torch.zeros(2, device=device))
    with pytest.raises(TypeError, match=r"amax must be float32"):
        compute_amax(torch.ones(3, device=device), torch.zeros(1, dtype=torch.float16, device=device))


@requires_cuda
def test_compute_amax_rejects_amax_on_other_device():
    with pytest.raises(ValueError, match=r"amax is on cpu but must be on cuda"):
        compute_amax(torch.ones(3, device="cuda"), one("cpu"))


# ---- recipes ----------------------------------------------------------------------


def test_compute_scale_from_amax_rejects_bad_arguments(device):
    with pytest.raises(TypeError, match=r"amax must be float32"):
        compute_scale_from_amax(one(device, torch.float64), E4M3)
    with pytest.raises(ValueError, match=r"amax must have 1 element"):
        compute_scale_from_amax(torch.ones(2, device=device), E4M3)
    with pytest.raises(TypeError, match=r"fp8_dtype must be"):
        compute_scale_from_amax(one(device), torch.float32)
    with pytest.raises(ValueError, match=r"scale must have 1 element"):
        compute_scale_from_amax(one(device), E4M3, scale=torch.ones(2, device=device))
    # The core checks epsilon: the message names the op and the argument.
    with pytest.raises(ValueError, match=r"te_compute_scale_from_amax: epsilon must be finite and >= 0"):
        compute_scale_from_amax(one(device), E4M3, epsilon=-1.0)
    with pytest.raises(ValueError, match=r"te_compute_scale_from_amax: epsilon"):
        compute_scale_from_amax(one(device), E4M3, epsilon=float("nan"))


@requires_cuda
def test_compute_scale_from_amax_rejects_mixed_devices():
    with pytest.raises(ValueError, match=r"scale_inv is on cpu but must be on cuda"):
        compute_scale_from_amax(one("cuda"), E4M3, scale_inv=one("cpu"))


def test_delayed_scaling_update_rejects_bad_arguments(device):
    h = [torch.zeros(4, 3, device=device)]
    s = [torch.ones(3, device=device)]
    with pytest.raises(ValueError, match=r"amax_compute_algo must be 'max' or 'most_recent'"):
        delayed_scaling_update(h, s, None, E4M3, amax_compute_algo="mean")
    with pytest.raises(ValueError, match=r"same length"):
        delayed_scaling_update(h, s + s, None, E4M3)
    with pytest.raises(ValueError, match=r"amax_histories\[0\] must be 2-D"):
        delayed_scaling_update([torch.zeros(3, device=device)], s, None, E4M3)
    with pytest.raises(ValueError, match=r"scales\[0\] must have 3 element"):
        delayed_scaling_update(h, [torch.ones(2, device=device)], None, E4M3)
    with pytest.raises(ValueError, match=r"scale_invs\[0\] must have 3 element"):
        delayed_scaling_update(h, s, [torch.ones(4, device=device)], E4M3)
    with pytest.raises(TypeError, match=r"amax_histories\[0\] must be float32"):
        delayed_scaling_update([torch.zeros(4, 3, dtype=torch.float64, device=device)], s, None, E4M3)
    with pytest.raises(ValueError, match=r"amax_histories\[0\] must be contiguous"):
        delayed_scaling_update([torch.zeros(3, 4, device=device).t()], s, None, E4M3)
    with pytest.raises(TypeError, match=r"fp8_dtype must be"):
        delayed_scaling_update(h, s, None, DType.kFloat16)
    with pytest.raises(ValueError, match=r"te_delayed_scaling_update: margin must be finite"):
        delayed_scaling_update(h, s, None, E4M3, margin=float("inf"))
    with pytest.raises(ValueError, match=r"te_delayed_scaling_update: margin"):
        delayed_scaling_update(h, s, None, E4M3, margin=1000.0)  # 2^1000 overflows fp32


def test_delayed_scaling_update_rejects_empty_history(device):
    with pytest.raises(ValueError, match=r"history_len must be >= 1"):
        delayed_scaling_update([torch.zeros(0, 3, device=device)], [torch.ones(3, device=device)], None, E4M3)


@requires_cuda
def test_delayed_scaling_update_rejects_mixed_devices():
    h = [torch.zeros(2, 1, device="cuda"), torch.zeros(2, 1)]
    s = [one("cuda"), one("cuda")]
    with pytest.raises(ValueError, match=r"amax_histories\[1\] is on cpu but must be on cuda"):
        delayed_scaling_update(h, s, None, E4M3)
    with pytest.raises(ValueError, match=r"scales\[0\] is on cpu but must be on cuda"):
        delayed_scaling_update(h[:1], [one("cpu")], None, E4M3)
