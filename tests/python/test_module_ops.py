"""cpp_extensions.module_ops, the modules' core calls without the public helpers' checks:
each gives the same bits as the public helper it stands in for (cast.py, gemm.py,
bias_grad.py, normalization.py, activation.py; those are tested against independent
references), on the CPU and on CUDA. Sizes are odd where the ops allow it (the FP8 GEMM
needs multiples of 16)."""

import pytest
import torch

from fp8_reference import assert_same_bits
from transformer_engine import _core
from transformer_engine.pytorch import cpp_extensions as ext
from transformer_engine.pytorch.cpp_extensions import DType, module_ops
from transformer_engine.pytorch.cpp_extensions.bias_grad import dact_dbias_quantize
from transformer_engine.pytorch.cpp_extensions.module_ops import Fp8Output, core_device
from transformer_engine.pytorch.tensor import Float8TensorBase

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2


def state(device, scale=3.5, amax=0.25):
    """A [2] recipe state (scale, amax) and the addresses of its two slots."""
    t = torch.tensor([scale, amax], dtype=torch.float32, device=device)
    return t, t.data_ptr(), t.data_ptr() + 4


def _base(data, data_t, scale_inv, fp8_dtype):
    return Float8TensorBase(data=data, data_transpose=data_t, fp8_scale_inv=scale_inv, fp8_dtype=fp8_dtype)


def assert_same_fp8(got, want):
    for g, w in ((got._data, want._data), (got._transpose, want._transpose), (got._scale_inv, want._scale_inv)):
        assert (g is None) == (w is None)
        if g is not None:
            assert_same_bits(g, w)
    assert got._fp8_dtype == want._fp8_dtype


@pytest.mark.parametrize("rowwise,columnwise", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_quantize(device, dtype, rowwise, columnwise, gen):
    x = torch.randn(37, 19, generator=gen).to(dtype).to(device)
    buf, scale, amax = state(device)
    got = module_ops.quantize(x, E4M3, scale, amax, rowwise, columnwise, core_device(x))
    ref_buf, _, _ = state(device)
    data, data_t, scale_inv = ext.quantize(x, E4M3, ref_buf[0:1], amax=ref_buf[1:2], rowwise=rowwise,
                                           columnwise=columnwise)
    assert_same_fp8(got, _base(data, data_t, scale_inv, E4M3))
    assert_same_bits(buf, ref_buf)  # the amax slot raised alike


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_float(device, layout, bias, gen):
    if bias and layout != "TN":
        pytest.skip("the modules fuse a bias into the forward GEMM only")
    m, k, n = 7, 33, 10
    a = torch.randn(*((n, k) if layout[0] == "T" else (k, n)), generator=gen).to(device)
    b = torch.randn(*((k, m) if layout[1] == "T" else (m, k)), generator=gen).to(device)
    bias_t = torch.randn(n, generator=gen).to(device) if bias else None
    dev = core_device(a)
    got = module_ops.gemm(a, b, dev, torch.float32, layout[0] == "T", layout[1] == "T", bias=bias_t)
    ws = module_ops.cuda_workspace(dev.index)[0] if a.is_cuda else None
    want = ext.general_gemm(a, b, ws, out_dtype=torch.float32, layout=layout, bias=bias_t)[0]
    assert_same_bits(got, want)


@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
def test_gemm_fp8(device, layout, gen):
    m, k, n = 32, 48, 16
    a_shape = (n, k) if layout[0] == "T" else (k, n)
    b_shape = (k, m) if layout[1] == "T" else (m, k)
    dev_a = torch.randn(*a_shape, generator=gen).to(device)
    buf, scale, amax = state(device)
    # Both layouts of each operand, as the modules keep them; the core reads the one it needs.
    A = module_ops.quantize(dev_a, E4M3, scale, amax, True, True, core_device(dev_a))
    B = module_ops.quantize(torch.randn(*b_shape, generator=gen).to(device), E5M2, scale, amax, True, True,
                            core_device(dev_a))
    dev = core_device(dev_a)
    got = module_ops.gemm(A, B, dev, torch.bfloat16, layout[0] == "T", layout[1] == "T", split_accumulator=True)
    ws = module_ops.cuda_workspace(dev.index)[0] if dev_a.is_cuda else None
    want = ext.general_gemm(A, B, ws, out_dtype=torch.bfloat16, layout=layout, use_split_accumulator=True)[0]
    assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gemm_bias_grad(device, dtype, gen):
    """The wgrad GEMM ("NT") with the bias gradient from its epilogue: general_gemm's grad + bias."""
    x = torch.randn(24, 17, generator=gen).to(dtype).to(device)
    dy = torch.randn(24, 9, generator=gen).to(dtype).to(device)
    dev = core_device(x)
    dw, db = module_ops.gemm_bias_grad(x, dy, dev, dtype, False, True)
    ws = module_ops.cuda_workspace(dev.index)[0] if x.is_cuda else None
    want_dw, want_db, *_ = ext.general_gemm(x, dy, ws, out_dtype=dtype, layout="NT", grad=True,
                                            bias=torch.zeros(9, dtype=dtype, device=device))
    assert_same_bits(dw, want_dw)
    assert_same_bits(db, want_db)


@pytest.mark.parametrize("rowwise,columnwise", [(True, False), (False, True), (True, True)])
def test_dbias_quantize(device, rowwise, columnwise, gen):
    dy = torch.randn(29, 21, generator=gen).to(torch.bfloat16).to(device)
    buf, scale, amax = state(device)
    dbias, got = module_ops.dbias_quantize(dy, E5M2, scale, amax, rowwise, columnwise, core_device(dy))
    ref_buf, _, _ = state(device)
    want_dbias, want = ext.bgrad_quantize(dy, E5M2, ref_buf[0:1], ref_buf[1:2], rowwise=rowwise,
                                          columnwise=columnwise)
    assert_same_bits(dbias, want_dbias)
    assert_same_fp8(got, want)
    assert_same_bits(buf, ref_buf)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("fp8", [False, True])
def test_norm_forward_backward(device, normalization, fp8, gen):
    layernorm = normalization == "LayerNorm"
    x = torch.randn(13, 40, generator=gen).to(torch.bfloat16).to(device)
    w = (torch.rand(40, generator=gen) + 0.5).to(device)
    b = torch.randn(40, generator=gen).to(device) if layernorm else None
    dev = core_device(x)
    buf, scale, amax = state(device)
    ref_buf, _, _ = state(device)
    out_fp8 = Fp8Output(E4M3, scale, amax, True) if fp8 else None
    got = module_ops.norm_forward(layernorm, x, w, b, 1e-5, False, dev, out_fp8)
    kwargs = dict(fp8_dtype=E4M3, scale=ref_buf[0:1], amax=ref_buf[1:2], columnwise=True) if fp8 else {}
    want = ext.layernorm_fwd(x, w, b, 1e-5, False, **kwargs) if layernorm else ext.rmsnorm_fwd(x, w, 1e-5, False,
                                                                                                  **kwargs)
    if fp8:
        assert_same_fp8(got[0], want[0])
        assert_same_bits(buf, ref_buf)
    else:
        assert_same_bits(got[0], want[0])
    for g, w_ in zip(got[1:], want[1:]):
        assert (g is None) == (w_ is None)
        if g is not None:
            assert_same_bits(g, w_)
    dz = torch.randn(13, 40, generator=gen).to(torch.bfloat16).to(device)
    mu, rsigma = got[1], got[2]
    got_b = module_ops.norm_backward(layernorm, dz, x, mu, rsigma, w, False, dev)
    want_b = ext.layernorm_bwd(dz, x, mu, rsigma, w) if layernorm else (*ext.rmsnorm_bwd(dz, x, rsigma, w), None)
    for g, w_ in zip(got_b, want_b):
        assert (g is None) == (w_ is None)
        if g is not None:
            assert_same_bits(g, w_)


@pytest.mark.parametrize("name,gated", [("gelu", False), ("silu", False), ("swiglu", True)])
@pytest.mark.parametrize("fp8", [False, True])
def test_activation_forward_backward(device, name, gated, fp8, gen):
    kind = int(getattr(_core.Activation, name.upper()))
    x = torch.randn(11, 34, generator=gen).to(torch.bfloat16).to(device)
    dev = core_device(x)
    buf, scale, amax = state(device)
    ref_buf, _, _ = state(device)
    got = module_ops.activation_forward(kind, gated, x, dev, Fp8Output(E4M3, scale, amax, True) if fp8 else None)
    fwd = getattr(ext, name)
    if fp8:
        assert_same_fp8(got, fwd(x, fp8_dtype=E4M3, scale=ref_buf[0:1], amax=ref_buf[1:2], columnwise=True))
        assert_same_bits(buf, ref_buf)
    else:
        assert_same_bits(got, fwd(x))
    grad = torch.randn(11, 17 if gated else 34, generator=gen).to(torch.bfloat16).to(device)
    assert_same_bits(module_ops.activation_backward(kind, grad, x, dev), getattr(ext, "d" + name)(grad, x))


@pytest.mark.parametrize("name,with_dbias", [("gelu", True), ("relu", False), ("swiglu", False)])
def test_dact_dbias_quantize(device, name, with_dbias, gen):
    kind = int(getattr(_core.Activation, name.upper()))
    gated = name == "swiglu"
    x = torch.randn(19, 34, generator=gen).to(torch.bfloat16).to(device)
    grad = torch.randn(19, 17 if gated else 34, generator=gen).to(torch.bfloat16).to(device)
    buf, scale, amax = state(device)
    ref_buf, _, _ = state(device)
    dbias, got = module_ops.dact_dbias_quantize(kind, grad, x, Fp8Output(E5M2, scale, amax, True), with_dbias,
                                                core_device(x))
    want_dbias, want = dact_dbias_quantize(name, grad, x, E5M2, ref_buf[0:1], ref_buf[1:2], with_dbias=with_dbias)
    assert (dbias is None) == (want_dbias is None)
    if dbias is not None:
        assert_same_bits(dbias, want_dbias)
    assert_same_fp8(got, want)
    assert_same_bits(buf, ref_buf)


def test_quantize_current_scaling(device, gen):
    x = torch.randn(40, 24, generator=gen).to(device) * 7
    got = module_ops.quantize_current_scaling(x, E4M3, 0.0, True, True, True, core_device(x))
    scale, _ = ext.compute_scale_from_amax(ext.compute_amax(x), E4M3, force_pow_2_scales=True)
    data, data_t, scale_inv = ext.quantize(x, E4M3, scale, columnwise=True)
    assert_same_fp8(got, _base(data, data_t, scale_inv, E4M3))


def test_delayed_scaling_update(device):
    """One launch over groups given as addresses equals the public helper on tensors."""
    hist = torch.tensor([[0.5, 3.0], [2.0, 0.0], [1.0, 8.0]], device=device)
    scale = torch.tensor([1.0, 2.0], device=device)
    scale_inv = torch.empty(2, device=device)
    ref = [t.clone() for t in (hist, scale, scale_inv)]
    group = (hist.data_ptr(), scale.data_ptr(), scale_inv.data_ptr(), 3, 2, int(E4M3))
    module_ops.delayed_scaling_update([group], 1.0, int(_core.AmaxComputeAlgo.MAX), core_device(hist))
    ext.delayed_scaling_update([ref[0]], [ref[1]], [ref[2]], E4M3, margin=1.0, amax_compute_algo="max")
    for g, w in zip((hist, scale, scale_inv), ref):
        assert_same_bits(g, w)


def test_non_contiguous_operand_is_a_clear_error(device):
    x = torch.randn(16, 32, device=device).t()
    with pytest.raises(ValueError, match="x must be contiguous"):
        module_ops.quantize(x, E4M3, *state(device)[1:], True, False, core_device(x))
