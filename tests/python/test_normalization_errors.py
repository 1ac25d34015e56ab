"""Bad arguments to the norm helpers and to the raw binding: an exception that names the
argument, raised by the Python layer (types, contiguity, option combinations) or carrying
the core's message "<op>: <argument> ..." (shapes, dtypes, eps); nothing written."""

import math

import pytest
import torch
from conftest import requires_cuda

from transformer_engine import _core
from transformer_engine._core import DType, ScalingMode
from transformer_engine.pytorch.cpp_extensions import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

CPU, CUDA = int(_core.DeviceType.CPU), int(_core.DeviceType.CUDA)
E4M3 = DType.kFloat8E4M3


def args(rows=3, hidden=64, dtype=torch.float32, w_dtype=torch.float32, device="cpu"):
    x = torch.randn(rows, hidden).to(dtype).to(device)
    return x, torch.ones(hidden, dtype=w_dtype, device=device), torch.zeros(hidden, dtype=w_dtype, device=device)


def fwd(norm, x, w, b, eps=1e-5, **kw):
    if norm == "layernorm":
        return layernorm_fwd(x, w, b, eps, **kw)
    return rmsnorm_fwd(x, w, eps, **kw)


NORMS = ["layernorm", "rmsnorm"]


# ---- forward: the Python layer -------------------------------------------------------------


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    "make,exc,pattern",
    [
        (lambda: ([[1.0] * 64], *args()[1:]), TypeError, r"inp must be a torch.Tensor, got list"),
        (lambda: (args(dtype=torch.float64)[0], *args()[1:]), TypeError,
         r"inp must be float32, float16 or bfloat16, got torch.float64"),
        (lambda: (args()[0], torch.ones(64, dtype=torch.int32), args()[2]), TypeError,
         r"weight must be float32, float16 or bfloat16, got torch.int32"),
        (lambda: (torch.ones(()), torch.ones(1), torch.ones(1)), ValueError,
         r"inp must have at least one dimension \(normalized over the last\), got a scalar"),
        (lambda: (torch.ones(64, 3).t(), torch.ones(64)[:3], torch.ones(3)), ValueError,
         r"inp must be contiguous"),
        (lambda: (args()[0], torch.ones(128)[::2], args()[2]), ValueError, r"weight must be contiguous"),
    ],
    ids=["inp_list", "inp_float64", "weight_int32", "inp_scalar", "inp_strided", "weight_strided"],
)
def test_fwd_argument_types(norm, make, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fwd(norm, *make())


@pytest.mark.parametrize(
    "bias,exc,pattern",
    [(None, TypeError, r"bias must be a torch.Tensor, got NoneType"),
     (torch.zeros(64, dtype=torch.int64), TypeError, r"bias must be float32, float16 or bfloat16, got torch.int64")],
    ids=["none", "int64"],
)
def test_layernorm_fwd_bias(bias, exc, pattern):
    x, w, _ = args()
    with pytest.raises(exc, match=pattern):
        layernorm_fwd(x, w, bias, 1e-5)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(out_dtype=torch.int32), TypeError, r"out_dtype must be float32, float16 or bfloat16, got torch.int32"),
        (dict(out_dtype=torch.float8_e4m3fn), TypeError, r"out_dtype must be float32, float16 or bfloat16"),
        (dict(fp8_dtype=E4M3, out_dtype=torch.bfloat16, scale=torch.ones(1)), ValueError,
         r"give out_dtype \(torch.bfloat16\) or fp8_dtype \(.*\), not both"),
        (dict(fp8_dtype=E4M3), ValueError, r"scale \(float32, one element\) is required with fp8_dtype"),
        (dict(fp8_dtype=E4M3, scale=torch.ones(1, dtype=torch.float64)), TypeError, r"scale must be float32"),
        (dict(fp8_dtype=E4M3, scale=torch.ones(2)), ValueError, r"scale must have 1 element\(s\), got 2"),
        (dict(fp8_dtype=E4M3, scale=torch.ones(1), amax=torch.zeros(1, dtype=torch.bfloat16)), TypeError,
         r"amax must be float32"),
        (dict(fp8_dtype=torch.float16, scale=torch.ones(1)), TypeError, r"fp8_dtype must be DType.kFloat8E4M3"),
        (dict(fp8_dtype=DType.kBFloat16, scale=torch.ones(1)), TypeError, r"fp8_dtype must be"),
        (dict(scale=torch.ones(1)), ValueError, r"scale and columnwise are for an FP8 output: pass fp8_dtype"),
        (dict(amax=torch.zeros(2)), ValueError, r"amax must have 1 element"),
        (dict(amax=torch.zeros(1, dtype=torch.float16)), TypeError, r"amax must be float32"),
        (dict(columnwise=True), ValueError, r"scale and columnwise are for an FP8 output"),
    ],
    ids=["out_int32", "out_fp8", "both_outputs", "no_scale", "scale_f64", "scale_2", "amax_bf16", "fp8_f16",
         "fp8_bf16_enum", "scale_alone", "float_out_amax_2", "float_out_amax_f16", "columnwise_alone"],
)
def test_fwd_output_options(norm, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fwd(norm, *args(), **kwargs)


# ---- forward: the core's checks, through the helpers -----------------------------------------


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    "make,pattern",
    [
        (lambda: (args()[0], torch.ones(63), torch.zeros(64)),
         r"gamma must have hidden=64 elements \(the last dim of input\), got shape \[63\]"),
        (lambda: (torch.ones(3, 0), torch.ones(1), torch.ones(1)),
         r"input hidden size \(last dim\) must be at least 1, got shape \[3, 0\]"),
    ],
    ids=["weight_length", "hidden_0"],
)
def test_fwd_core_shape_errors(norm, make, pattern):
    with pytest.raises(ValueError, match=rf"^te_{norm}_fwd: {pattern}"):
        fwd(norm, *make())


def test_layernorm_fwd_bias_mismatch():
    x, w, _ = args()
    with pytest.raises(ValueError, match=r"^te_layernorm_fwd: beta must have hidden=64 elements.*\[65\]"):
        layernorm_fwd(x, w, torch.zeros(65), 1e-5)
    with pytest.raises(ValueError, match=r"^te_layernorm_fwd: beta dtype must equal gamma dtype float32, got bfloat16"):
        layernorm_fwd(x, w, torch.zeros(64, dtype=torch.bfloat16), 1e-5)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("eps,shown", [(-1e-5, "-1e-05"), (math.nan, "nan"), (math.inf, "inf"), (1e39, "inf")],
                         ids=["negative", "nan", "inf", "beyond_fp32"])
def test_fwd_eps(norm, eps, shown):
    with pytest.raises(ValueError, match=rf"^te_{norm}_fwd: eps must be finite and >= 0, got {shown}"):
        fwd(norm, *args(), eps=eps)


@pytest.mark.parametrize("norm", NORMS)
def test_fwd_failure_leaves_amax(norm):
    """A refused call writes nothing: the FP8 output's amax keeps its value."""
    x, _, b = args()
    amax = torch.tensor([1.5])
    with pytest.raises(ValueError, match=r"gamma must have hidden=64"):
        fwd(norm, x, torch.ones(32), b, fp8_dtype=E4M3, scale=torch.ones(1), amax=amax)
    assert amax.item() == 1.5


# ---- backward ------------------------------------------------------------------------------


def bwd_args(rows=3, hidden=64, dtype=torch.float32, w_dtype=torch.bfloat16):
    x, w, _ = args(rows, hidden, dtype, w_dtype)
    return dict(dz=torch.randn(rows, hidden).to(dtype), x=x, mu=torch.zeros(rows), rsigma=torch.ones(rows), gamma=w)


def bwd(norm, a):
    if norm == "layernorm":
        return layernorm_bwd(a["dz"], a["x"], a["mu"], a["rsigma"], a["gamma"])
    return rmsnorm_bwd(a["dz"], a["x"], a["rsigma"], a["gamma"])


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    "change,exc,pattern",
    [
        (dict(dz=None), TypeError, r"dz must be a torch.Tensor, got NoneType"),
        (dict(x=torch.ones(3, 64, dtype=torch.float64)), TypeError, r"x must be float32, float16 or bfloat16"),
        (dict(gamma=torch.ones(64, dtype=torch.int32)), TypeError, r"gamma must be float32, float16 or bfloat16"),
        (dict(rsigma=[1.0, 1.0, 1.0]), TypeError, r"rsigma must be a torch.Tensor, got list"),
        (dict(x=torch.ones(()), dz=torch.ones(())), ValueError, r"x must have at least one dimension"),
        (dict(dz=torch.ones(64, 3).t()), ValueError, r"dz must be contiguous"),
        (dict(dz=torch.ones(3, 64, dtype=torch.bfloat16)), ValueError,
         r"^te_(layer|rms)norm_bwd: dz dtype must equal x dtype float32, got bfloat16"),
        (dict(dz=torch.ones(4, 64)), ValueError, r"^te_(layer|rms)norm_bwd: dz shape \[4, 64\] must equal x shape \[3, 64\]"),
        (dict(rsigma=torch.ones(4)), ValueError,
         r"^te_(layer|rms)norm_bwd: rsigma must have rows=3 elements \(one per row of x \[3, 64\]\), got shape \[4\]"),
        (dict(rsigma=torch.ones(3, dtype=torch.float16)), ValueError,
         r"^te_(layer|rms)norm_bwd: rsigma dtype must be float32 \(statistics are fp32\), got float16"),
        (dict(gamma=torch.ones(65)), ValueError,
         r"^te_(layer|rms)norm_bwd: gamma must have hidden=64 elements \(the last dim of x\), got shape \[65\]"),
    ],
    ids=["dz_none", "x_float64", "gamma_int32", "rsigma_list", "x_scalar", "dz_strided", "dz_dtype", "dz_shape",
         "rsigma_length", "rsigma_fp16", "gamma_length"],
)
def test_bwd_arguments(norm, change, exc, pattern):
    a = bwd_args()
    a.update(change)
    with pytest.raises(exc, match=pattern):
        bwd(norm, a)


@pytest.mark.parametrize(
    "mu,exc,pattern",
    [(None, TypeError, r"mu must be a torch.Tensor, got NoneType"),
     (torch.zeros(2), ValueError, r"^te_layernorm_bwd: mu must have rows=3 elements"),
     (torch.zeros(3, dtype=torch.bfloat16), ValueError, r"^te_layernorm_bwd: mu dtype must be float32")],
    ids=["none", "length", "bf16"],
)
def test_layernorm_bwd_mu(mu, exc, pattern):
    a = bwd_args()
    with pytest.raises(exc, match=pattern):
        layernorm_bwd(a["dz"], a["x"], mu, a["rsigma"], a["gamma"])


# ---- devices ---------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("norm", NORMS)
def test_mismatched_devices_cuda(norm):
    """Validation runs before any kernel: a CPU weight with a CUDA input is named."""
    x, w, b = args(device="cuda")
    with pytest.raises(ValueError, match=rf"^te_{norm}_fwd: gamma is on cpu but input is on cuda:0"):
        fwd(norm, x, w.cpu(), b)
    a = bwd_args()
    a = {k: v.cuda() for k, v in a.items()}
    a["rsigma"] = a["rsigma"].cpu()
    with pytest.raises(ValueError, match=rf"^te_{norm}_bwd: rsigma is on cpu but x is on cuda:0"):
        bwd(norm, a)


# ---- the raw binding -------------------------------------------------------------------------

X = torch.ones(256, dtype=torch.float32)  # real buffers, never written: validation fails first
S = torch.ones(16, dtype=torch.float32)


def desc(dtype=DType.kFloat32, shape=(3, 64), device=(CPU, 0), data=X, mode=0, **ptrs):
    return _core.Tensor(*device, int(dtype), list(shape), data.data_ptr() if data is not None else 0,
                        ptrs.get("columnwise", 0), ptrs.get("scale", 0), ptrs.get("scale_inv", 0), ptrs.get("amax", 0),
                        int(mode))


def core_fwd(norm, inp=None, gamma=None, beta=None, out=None, mu=None, rsigma=None, eps=1e-5, **kw):
    inp = inp or desc()
    gamma = gamma or desc(shape=(64,))
    out = out or desc()
    rsigma = rsigma or desc(shape=(3,), data=S)
    if norm == "layernorm":
        _core.layernorm_fwd(inp, gamma, beta or desc(shape=(64,)), eps, False, out, mu or desc(shape=(3,), data=S),
                            rsigma, **kw)
    else:
        _core.rmsnorm_fwd(inp, gamma, eps, False, out, rsigma, **kw)


def test_workspace_size_query():
    assert _core.norm_workspace_size(37, 4096, CPU, 0) == 0
    assert _core.norm_workspace_size(1, 64, CUDA, 0) == 1 * 2 * 64 * 4
    assert _core.norm_workspace_size(100, 1000, CUDA, 0) == 100 * 2 * 1000 * 4
    assert _core.norm_workspace_size(400, 1000, CUDA, 0) == 400 * 2 * 1000 * 4
    assert _core.norm_workspace_size(8192, 16384, CUDA, 0) == 512 * 2 * 16384 * 4  # at most 512 row blocks
    assert _core.norm_workspace_size(0, 64, CUDA, 0) == 0


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(out=desc(E4M3, mode=ScalingMode.PER_TENSOR)), ValueError, r"output\.scale must not be null"),
        (dict(out=desc(E4M3, mode=ScalingMode.BLOCK_1D, scale=S.data_ptr())), NotImplementedError,
         r"output scaling_mode 1x128 block scaling is not implemented yet"),
        (dict(out=desc(E4M3, mode=ScalingMode.BLOCK_2D, scale=S.data_ptr())), NotImplementedError,
         r"output scaling_mode 128x128 block scaling is not implemented yet"),
        (dict(out=desc(E4M3, scale=S.data_ptr())), ValueError, r"output scaling_mode must be per-tensor \(1\), got 0"),
        (dict(out=desc(E4M3, data=None, mode=ScalingMode.PER_TENSOR, scale=S.data_ptr())), ValueError,
         r"output\.data and output\.columnwise_data must not both be null"),
        (dict(out=desc(DType.kBFloat16, columnwise=X.data_ptr())), ValueError,
         r"output\.columnwise_data must be null for a bfloat16 output"),
        (dict(out=desc(DType.kInt32)), ValueError,
         r"output dtype must be float32, float16, bfloat16, float8_e4m3 or float8_e5m2, got int32"),
        (dict(inp=desc(data=None)), ValueError, r"input\.data must not be null"),
        (dict(gamma=desc(shape=(64,), data=None)), ValueError, r"gamma\.data must not be null"),
        (dict(rsigma=desc(shape=(3,), data=None)), ValueError, r"rsigma\.data must not be null"),
        (dict(rsigma=desc(DType.kBFloat16, shape=(3,), data=S)), ValueError,
         r"rsigma dtype must be float32 \(statistics are fp32\), got bfloat16"),
        (dict(out=desc(shape=(64, 3))), ValueError, r"output shape \[64, 3\] must equal input shape \[3, 64\]"),
        (dict(inp=desc(DType.kFloat8E5M2, data=None)), ValueError,
         r"input dtype must be float32, float16 or bfloat16, got float8_e5m2"),
    ],
    ids=["fp8_no_scale", "block_1d", "block_2d", "fp8_unscaled", "fp8_no_data", "bf16_columnwise", "out_int32",
         "inp_null", "gamma_null", "rsigma_null", "rsigma_bf16", "out_shape", "inp_fp8"],
)
def test_core_fwd_descriptors(norm, kwargs, exc, pattern):
    with pytest.raises(exc, match=rf"^te_{norm}_fwd: {pattern}"):
        core_fwd(norm, **kwargs)


def test_core_layernorm_mu():
    with pytest.raises(ValueError, match=r"^te_layernorm_fwd: mu\.data must not be null"):
        core_fwd("layernorm", mu=desc(shape=(3,), data=None))
    with pytest.raises(ValueError, match=r"^te_layernorm_fwd: mu must have rows=3 elements"):
        core_fwd("layernorm", mu=desc(shape=(5,), data=S))


@pytest.mark.parametrize("norm", NORMS)
def test_core_cuda_descriptors(norm):
    """Descriptors on cuda:0 (pointers never dereferenced). A CUDA build checks the
    workspace against te_norm_workspace_size; a CPU-only build refuses the CUDA input."""
    on_gpu = dict(device=(CUDA, 0))
    tensors = dict(inp=desc(**on_gpu), gamma=desc(shape=(64,), **on_gpu), beta=desc(shape=(64,), **on_gpu),
                   out=desc(**on_gpu), mu=desc(shape=(3,), data=S, **on_gpu), rsigma=desc(shape=(3,), data=S, **on_gpu))
    need = _core.norm_workspace_size(3, 64, CUDA, 0)
    if _core.built_with_cuda():
        with pytest.raises(ValueError, match=rf"^te_{norm}_fwd: workspace must be at least {need} bytes "
                                             rf"\(te_norm_workspace_size\(3, 64\)\), got {need - 1}"):
            core_fwd(norm, **tensors, workspace=X.data_ptr(), workspace_size=need - 1)
        with pytest.raises(ValueError, match=rf"^te_{norm}_fwd: workspace\.pointer must not be null"):
            core_fwd(norm, **tensors, workspace=0, workspace_size=need)
    else:
        with pytest.raises(NotImplementedError, match=rf"^te_{norm}_fwd: input is a CUDA tensor, but this build"):
            core_fwd(norm, **tensors)


@pytest.mark.parametrize("norm", NORMS)
def test_core_mismatched_devices(norm):
    gamma = desc(shape=(64,), device=(CUDA, 0))
    if _core.built_with_cuda():
        with pytest.raises(ValueError, match=rf"^te_{norm}_fwd: gamma is on cuda:0 but input is on cpu"):
            core_fwd(norm, gamma=gamma)
    else:
        with pytest.raises(NotImplementedError, match=rf"^te_{norm}_fwd: gamma is a CUDA tensor"):
            core_fwd(norm, gamma=gamma)


def test_core_bwd_descriptors():
    x, stats, w = desc(), desc(shape=(3,), data=S), desc(shape=(64,))
    with pytest.raises(ValueError, match=r"^te_layernorm_bwd: dgamma dtype must equal gamma dtype float32, got bfloat16"):
        _core.layernorm_bwd(x, x, stats, stats, w, False, x, desc(DType.kBFloat16, shape=(64,)), w)
    with pytest.raises(ValueError, match=r"^te_layernorm_bwd: dbeta must have hidden=64 elements"):
        _core.layernorm_bwd(x, x, stats, stats, w, False, x, w, desc(shape=(32,)))
    with pytest.raises(ValueError, match=r"^te_rmsnorm_bwd: dx dtype must equal x dtype float32, got float16"):
        _core.rmsnorm_bwd(x, x, stats, w, False, desc(DType.kFloat16), w)
    with pytest.raises(ValueError, match=r"^te_rmsnorm_bwd: dx\.data must not be null"):
        _core.rmsnorm_bwd(x, x, stats, w, False, desc(data=None), w)
