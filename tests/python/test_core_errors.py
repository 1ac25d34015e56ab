"""Bad descriptors through the raw binding: the core's status becomes ValueError
(invalid argument) or NotImplementedError, carrying the core's message
"<op>: <argument> ...". Pointers here are never dereferenced: validation comes first."""

import pytest
import torch

from transformer_engine import _core
from transformer_engine._core import DType, ScalingMode

CPU, CUDA = int(_core.DeviceType.CPU), int(_core.DeviceType.CUDA)
PER_TENSOR = int(ScalingMode.PER_TENSOR)

# Real CPU buffers, big enough for every descriptor below.
X = torch.ones(64, dtype=torch.float32)
Q = torch.zeros(64, dtype=torch.uint8)
S = torch.ones(1, dtype=torch.float32)


def tensor(dtype=DType.kFloat32, shape=(4, 3), data=None, device=(CPU, 0), mode=0, **ptrs):
    return _core.Tensor(*device, int(dtype), list(shape), (data if data is not None else X).data_ptr(),
                        ptrs.get("columnwise", 0), ptrs.get("scale", 0), ptrs.get("scale_inv", 0),
                        ptrs.get("amax", 0), int(mode))


def fp8_out(dtype=DType.kFloat8E4M3, shape=(4, 3), mode=PER_TENSOR, scale=True, **kw):
    return tensor(dtype, shape, Q, mode=mode, scale=S.data_ptr() if scale else 0, **kw)


# (input kwargs, output kwargs, expected message). Descriptors are built inside the
# test: ones kept in module globals outlive the binding at exit (nanobind reports leaks).
QUANTIZE_CASES = {
    "out_dtype": ({}, dict(dtype=DType.kBFloat16),
                  r"^te_quantize: output dtype must be float8_e4m3 or float8_e5m2, got bfloat16"),
    "in_fp8": (dict(dtype=DType.kFloat8E4M3), {}, r"^te_quantize: input dtype must be float32, float16 or bfloat16"),
    "in_int": (dict(dtype=DType.kInt32), {}, r"^te_quantize: input dtype must be"),
    "no_scale": ({}, dict(scale=False), r"^te_quantize: output\.scale must not be null"),
    "shape": ({}, dict(shape=(3, 4)), r"^te_quantize: output shape \[3, 4\] must equal input shape \[4, 3\]"),
    "mode_none": ({}, dict(mode=0), r"^te_quantize: output scaling_mode must be per-tensor"),
    "mode_bad": ({}, dict(mode=7), r"^te_quantize: output scaling_mode is not a te_scaling_mode"),
    "neg_shape": (dict(shape=(4, -3)), {}, r"^te_quantize: input shape must not be negative"),
    "dtype_enum": (dict(dtype=99), {}, r"^te_quantize: input dtype is not a te_dtype"),
    "device_type": (dict(device=(5, 0)), {}, r"^te_quantize: input device type must be cpu \(0\) or cuda \(1\)"),
    "device_index": (dict(device=(CPU, -1)), {}, r"^te_quantize: input device index must be 0 for the CPU, got -1"),
}


@pytest.mark.parametrize("case", QUANTIZE_CASES)
def test_quantize_bad_descriptor(case):
    inp, out, pattern = QUANTIZE_CASES[case]
    with pytest.raises(ValueError, match=pattern):
        _core.quantize(tensor(**inp), fp8_out(**out))


def test_quantize_null_input_data():
    with pytest.raises(ValueError, match=r"^te_quantize: input\.data must not be null"):
        _core.quantize(_core.Tensor(CPU, 0, int(DType.kFloat32), [4, 3]), fp8_out())


def test_quantize_needs_an_output_pointer():
    out = _core.Tensor(CPU, 0, int(DType.kFloat8E4M3), [4, 3], 0, 0, S.data_ptr(), 0, 0, PER_TENSOR)
    with pytest.raises(ValueError, match=r"^te_quantize: output\.data and output\.columnwise_data"):
        _core.quantize(tensor(), out)


@pytest.mark.parametrize("mode,name", [(ScalingMode.BLOCK_1D, "1x128"), (ScalingMode.BLOCK_2D, "128x128")])
def test_block_scaling_is_not_implemented(mode, name):
    with pytest.raises(NotImplementedError, match=rf"^te_quantize: output scaling_mode {name} block scaling"):
        _core.quantize(tensor(), fp8_out(mode=mode))
    src = tensor(DType.kFloat8E5M2, data=Q, mode=mode, scale_inv=S.data_ptr())
    with pytest.raises(NotImplementedError, match=rf"^te_dequantize: input scaling_mode {name} block scaling"):
        _core.dequantize(src, tensor())


def test_dequantize_bad_descriptor():
    fp8 = dict(data=Q, mode=PER_TENSOR, scale_inv=S.data_ptr())
    with pytest.raises(ValueError, match=r"^te_dequantize: input\.scale_inv must not be null"):
        _core.dequantize(tensor(DType.kFloat8E4M3, data=Q, mode=PER_TENSOR), tensor())
    with pytest.raises(ValueError, match=r"^te_dequantize: input dtype must be float8_e4m3 or float8_e5m2"):
        _core.dequantize(tensor(DType.kByte, **fp8), tensor())
    with pytest.raises(ValueError, match=r"^te_dequantize: output dtype must be float32, float16 or bfloat16"):
        _core.dequantize(tensor(DType.kFloat8E4M3, **fp8), tensor(DType.kFloat8E4M3))
    with pytest.raises(ValueError, match=r"^te_dequantize: output shape \[12\] must equal input shape \[4, 3\]"):
        _core.dequantize(tensor(DType.kFloat8E4M3, **fp8), tensor(shape=(12,)))


def test_transpose_bad_descriptor():
    with pytest.raises(ValueError, match=r"^te_transpose: output shape \[4, 3\] must be \[3, 4\]"):
        _core.transpose(tensor(), tensor())
    with pytest.raises(ValueError, match=r"^te_transpose: output dtype must equal input dtype"):
        _core.transpose(tensor(), tensor(DType.kFloat16, shape=(3, 4)))
    with pytest.raises(ValueError, match=r"^te_transpose: output\.data must not be null"):
        _core.transpose(tensor(), _core.Tensor(CPU, 0, int(DType.kFloat32), [3, 4]))


def test_compute_amax_bad_arguments():
    with pytest.raises(ValueError, match=r"^te_compute_amax: amax must not be null"):
        _core.compute_amax(tensor(), 0)
    with pytest.raises(ValueError, match=r"^te_compute_amax: input dtype must be float32, float16 or bfloat16"):
        _core.compute_amax(tensor(DType.kFloat8E4M3, data=Q), S.data_ptr())


def test_recipe_bad_arguments():
    p = S.data_ptr()
    E4M3 = int(DType.kFloat8E4M3)
    with pytest.raises(ValueError, match=r"^te_compute_scale_from_amax: fp8_dtype must be float8_e4m3"):
        _core.compute_scale_from_amax(p, p, p, int(DType.kFloat32), 0.0, False, CPU, 0)
    with pytest.raises(ValueError, match=r"^te_compute_scale_from_amax: scale must not be null"):
        _core.compute_scale_from_amax(p, 0, p, int(DType.kFloat8E4M3), 0.0, False, CPU, 0)
    with pytest.raises(ValueError, match=r"^te_delayed_scaling_update: amax_compute_algo must be max \(0\)"):
        _core.delayed_scaling_update([], 5, 0.0, CPU, 0)
    with pytest.raises(ValueError, match=r"^te_delayed_scaling_update: groups\[1\]\.amax_history must not be null"):
        _core.delayed_scaling_update([(p, p, 0, 1, 1, E4M3), (0, p, 0, 1, 1, E4M3)], 0, 0.0, CPU, 0)
    with pytest.raises(ValueError, match=r"^te_delayed_scaling_update: groups\[1\]\.fp8_dtype must be float8_e4m3 or "
                       r"float8_e5m2, got bfloat16"):
        _core.delayed_scaling_update([(p, p, 0, 1, 1, E4M3), (p, p, 0, 1, 1, int(DType.kBFloat16))], 0, 0.0, CPU, 0)
    with pytest.raises(ValueError, match=r"^te_delayed_scaling_update: groups\[0\]\.num_scales must be >= 0"):
        _core.delayed_scaling_update([(p, p, 0, 1, -1, E4M3)], 0, 0.0, CPU, 0)
    with pytest.raises(ValueError, match=r"^te_delayed_scaling_update: device device type"):
        _core.delayed_scaling_update([], 0, 0.0, 9, 0)


def test_too_many_dims_is_rejected_by_the_binding():
    with pytest.raises(ValueError, match=r"shape has 9 dims; OpenTE takes at most 8"):
        _core.Tensor(CPU, 0, int(DType.kFloat32), [1] * 9)


def test_failed_call_does_not_stick():
    # The error lives in thread-local state; the next good call must succeed.
    with pytest.raises(ValueError):
        _core.quantize(tensor(), fp8_out(DType.kBFloat16))
    _core.quantize(tensor(), fp8_out())
    assert Q[:12].tolist() == [0x38] * 12  # 1.0 in E4M3


@pytest.mark.skipif(_core.built_with_cuda(), reason="only a CPU-only build refuses CUDA descriptors")
def test_cpu_build_refuses_cuda_tensors():
    # Fake device pointers: the check must fire before anything is touched.
    with pytest.raises(NotImplementedError, match=r"^te_quantize: input is a CUDA tensor, but this build"):
        _core.quantize(tensor(device=(CUDA, 0)), fp8_out())
    with pytest.raises(NotImplementedError, match=r"^te_compute_scale_from_amax: device is a CUDA tensor"):
        _core.compute_scale_from_amax(16, 32, 48, int(DType.kFloat8E4M3), 0.0, False, CUDA, 0)


@pytest.mark.skipif(not _core.built_with_cuda(), reason="needs a CUDA build")
def test_mixed_device_descriptors_are_rejected():
    with pytest.raises(ValueError, match=r"^te_quantize: output is on cuda:0 but input is on cpu"):
        _core.quantize(tensor(), tensor(DType.kFloat8E4M3, data=Q, device=(CUDA, 0), mode=PER_TENSOR,
                                         scale=S.data_ptr()))
