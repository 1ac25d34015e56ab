"""Float8Tensor as a torch.Tensor: nominal metadata, the FP8-aware ops (views,
detach, clone, transpose, copy_), the dequantizing fallback for every other op,
in-place re-quantization, nn.Parameter and optimizers, pickling and state dicts."""

import copy
import io

import pytest
import torch

from fp8_reference import assert_float_equal, assert_fp8_equal, f32, ref_columnwise, ref_quantize
from transformer_engine.pytorch.cpp_extensions import general_gemm, get_cublas_workspace_size_bytes
from transformer_engine.pytorch.tensor import (
    DType,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    Float8TensorBase,
    QuantizedTensor,
)

E4M3 = DType.kFloat8E4M3


def delayed(device, scale=4.0, fp8_dtype=E4M3, **usage):
    return Float8Quantizer(torch.tensor([scale], device=device), torch.zeros(1, device=device), fp8_dtype, **usage)


def make(device, gen, shape=(6, 10), dtype=torch.bfloat16, scale=4.0, **usage):
    """(x, its Float8Tensor) with a delayed-scaling quantizer of ``scale``."""
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(device)
    return x, delayed(device, scale, **usage)(x)


def assert_holds(t, x, scale, fp8_dtype=E4M3):
    """t's FP8 buffers are x cast with scale, the column-wise copy consistent with the row-wise one."""
    expected = ref_quantize(x.detach().cpu(), fp8_dtype, scale)
    if t._data is not None:
        assert_fp8_equal(t._data, expected, fp8_dtype)
    if t._transpose is not None:
        assert_fp8_equal(t._transpose, ref_columnwise(expected), fp8_dtype)


def test_is_a_tensor_of_the_nominal_dtype(device, gen):
    x, t = make(device, gen, (3, 5, 8))
    assert isinstance(t, torch.Tensor) and isinstance(t, QuantizedTensor) and isinstance(t, Float8TensorBase)
    assert t.dtype == torch.bfloat16 and t.shape == (3, 5, 8) and t.size(1) == 5 and t.dim() == 3
    assert t.device.type == device and t.numel() == 120 and t.is_contiguous() and not t.requires_grad
    assert t.to_dtype(torch.float32).dtype == torch.float32
    assert t.to_dtype(torch.float32)._data is t._data
    assert "Float8Tensor(fp8_dtype=kFloat8E4M3, scale_inv=0.25" in repr(t)


def test_from_tensor(device, gen):
    x = torch.randn(3, 8, generator=gen).to(torch.float16).to(device)
    amax = torch.zeros(1, device=device)
    t = Float8Tensor.from_tensor(x, DType.kFloat8E5M2, torch.tensor([2.0], device=device), amax=amax)
    assert type(t) is Float8Tensor and t.dtype == torch.float16 and t._transpose is None
    assert_holds(t, x, 2.0, DType.kFloat8E5M2)
    assert amax.item() == f32(x.abs().max().item())


# ---- the fallback: other ops run on the dequantized values ------------------------------


FALLBACK_OPS = {
    "add_scalar": lambda a, w: a + 1,
    "mul": lambda a, w: a * 2.5,
    "matmul": lambda a, w: torch.matmul(a, w),
    "linear": lambda a, w: torch.nn.functional.linear(w.t(), a),
    "sum": lambda a, w: a.sum(),
    "mean_dim": lambda a, w: a.mean(dim=0),
    "gelu": lambda a, w: torch.nn.functional.gelu(a),
    "slice": lambda a, w: a[1:4, ::2],
    "compare": lambda a, w: a > 0,
    "cat": lambda a, w: torch.cat([a, a]),
    "max": lambda a, w: torch.max(a, dim=1).values,
    "to_float": lambda a, w: a.to(torch.float16),
    "zeros_like": lambda a, w: torch.zeros_like(a),
    "abs_then_view": lambda a, w: a.abs().view(-1),
    "permute": lambda a, w: a.unsqueeze(0).permute(2, 0, 1),
}


@pytest.mark.parametrize("op", FALLBACK_OPS)
def test_fallback_equals_the_op_on_dequantized_values(device, op, gen):
    _, t = make(device, gen)
    w = torch.randn(10, 4, generator=gen).to(torch.bfloat16).to(device)
    got = FALLBACK_OPS[op](t, w)
    expected = FALLBACK_OPS[op](t.dequantize(), w)
    assert type(got) is torch.Tensor, "results of other ops are plain tensors"
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_fallback_with_two_fp8_tensors(device, gen):
    _, a = make(device, gen, (4, 8))
    _, b = make(device, gen, (5, 8), scale=2.0)
    assert torch.equal(a @ b.t(), a.dequantize() @ b.dequantize().t())
    assert torch.equal(torch.stack([a, a]).sum(0), (a.dequantize() * 2))


def test_float_dequantizes_once(device, gen):
    """.float() / .to(float32) dequantize straight to fp32: no rounding through the nominal bf16."""
    _, t = make(device, gen, scale=3.3)
    assert_float_equal(t.float(), t.dequantize(dtype=torch.float32))
    assert_float_equal(t.to(torch.float32), t.dequantize(dtype=torch.float32))
    assert not torch.equal(t.float(), t.dequantize().float()), "bf16 rounding would show with this scale"
    assert torch.equal(t.cpu(), t.dequantize().cpu()) and type(t.cpu()) is torch.Tensor
    # As in TE, these give plain values even when dtype / device already match.
    _, t32 = make(device, gen, dtype=torch.float32)
    for plain in (t32.float(), t32.cpu(), t.bfloat16(), t.half()):
        assert type(plain) is torch.Tensor
    assert torch.equal(t.half(), t.dequantize(dtype=torch.float16))


def test_general_gemm_reads_float8_tensors(device, gen):
    _, a = make(device, gen, (16, 32), dtype=torch.float32)
    _, b = make(device, gen, (48, 32), dtype=torch.float32, scale=2.0)
    base_a = Float8TensorBase(data=a._data, fp8_scale_inv=a._scale_inv, fp8_dtype=E4M3)
    base_b = Float8TensorBase(data=b._data, fp8_scale_inv=b._scale_inv, fp8_dtype=E4M3)
    workspace = torch.empty(get_cublas_workspace_size_bytes(), dtype=torch.uint8, device=device) \
        if device == "cuda" else None
    got = general_gemm(a, b, workspace, out_dtype=torch.float32)[0]
    assert torch.equal(got, general_gemm(base_a, base_b, workspace, out_dtype=torch.float32)[0])


# ---- FP8-aware ops keep the FP8 data ------------------------------------------------------


def test_detach_alias_and_views_share_the_buffers(device, gen):
    x, t = make(device, gen, (4, 6, 8))
    for name, v in {"detach": t.detach(), "alias": torch.ops.aten.alias(t), "view": t.view(24, 8),
                    "reshape": t.reshape(2, 2, 6, -1), "flatten": t.flatten(0, 1), "view_as": t.view_as(t)}.items():
        assert type(v) is Float8Tensor, name
        assert v._data.data_ptr() == t._data.data_ptr() and v._scale_inv is t._scale_inv, name
        assert v._quantizer is t._quantizer and v.dtype == t.dtype, name
        assert torch.equal(v.dequantize(), t.dequantize().reshape(v.shape)), name
        # Same last dimension: the column-wise copy is shared too, viewed to the new shape.
        assert v._transpose.data_ptr() == t._transpose.data_ptr(), name
        assert_holds(v, x.reshape(v.shape), 4.0)


def test_view_changing_the_last_dim_keeps_rowwise_only(device, gen):
    x, t = make(device, gen, (4, 6))
    v = t.view(2, 12)
    assert type(v) is Float8Tensor and v._data.data_ptr() == t._data.data_ptr() and v._transpose is None
    assert torch.equal(v.dequantize(), t.dequantize().view(2, 12))
    with pytest.raises(RuntimeError, match="invalid for input of size 24"):
        t.view(5, 5)
    col_only = delayed(device, columnwise=True, rowwise=False)(x)
    assert type(col_only.view(2, 2, 6)) is Float8Tensor  # the last dim stays: the copy is viewed
    assert type(col_only.view(2, 12)) is torch.Tensor  # no layout can be viewed: dequantized


@pytest.mark.parametrize("stored", ["both", "rowwise", "columnwise"])
@pytest.mark.parametrize("how", ["t", "transpose", "mT"])
def test_2d_transpose_uses_the_columnwise_copy(device, gen, stored, how):
    x, t = make(device, gen, (5, 7), rowwise=stored != "columnwise", columnwise=stored != "rowwise")
    tt = {"t": lambda: t.t(), "transpose": lambda: t.transpose(1, 0), "mT": lambda: t.mT}[how]()
    assert type(tt) is Float8Tensor and tt.shape == (7, 5)
    assert torch.equal(tt.dequantize(), t.dequantize().t())
    if stored != "rowwise":
        assert tt._data.data_ptr() == t._transpose.data_ptr(), "no new FP8 data: the stored copy"
    else:
        assert tt._transpose.data_ptr() == t._data.data_ptr()
    assert_holds(tt, x.t(), 4.0)
    assert type(torch.ones(3)) is torch.Tensor
    assert type(t.unsqueeze(0).transpose(0, 2)) is torch.Tensor  # other ranks: dequantized


def test_clone_copies_the_buffers(device, gen):
    x, t = make(device, gen)
    c = t.clone()
    assert type(c) is Float8Tensor and c._quantizer is t._quantizer
    for a, b in ((c._data, t._data), (c._transpose, t._transpose), (c._scale_inv, t._scale_inv)):
        assert a.data_ptr() != b.data_ptr() and torch.equal(a, b)
    c.mul_(2)
    assert_holds(t, x, 4.0)  # the original is untouched


def test_empty_like_is_fp8_zeros_like_is_not(device, gen):
    _, t = make(device, gen)
    e = torch.empty_like(t)
    assert type(e) is Float8Tensor and e.shape == t.shape and e.dtype == t.dtype and e._quantizer is t._quantizer
    assert e._data.data_ptr() != t._data.data_ptr() and e._transpose is not None
    z = torch.zeros_like(t)
    assert type(z) is torch.Tensor and z.dtype == torch.bfloat16 and not z.any()  # optimizer state stays high precision
    assert type(torch.empty_like(t, dtype=torch.float32)) is torch.Tensor


# ---- writes re-quantize ---------------------------------------------------------------------


def test_copy_from_high_precision_requantizes_in_place(device, gen):
    _, t = make(device, gen)
    ptrs = (t._data.data_ptr(), t._transpose.data_ptr(), t._scale_inv.data_ptr())
    y = torch.randn(6, 10, generator=gen).to(device) * 5
    assert t.copy_(y) is t
    assert (t._data.data_ptr(), t._transpose.data_ptr(), t._scale_inv.data_ptr()) == ptrs
    assert_holds(t, y, 4.0)
    assert t._quantizer.amax.item() == f32(y.abs().max().item())
    t.copy_(torch.tensor(1.5))  # broadcast, as copy_ does
    assert torch.all(t.dequantize() == 1.5)
    t.copy_(torch.full((6, 10), 2, dtype=torch.int32))  # other dtypes are converted first
    assert torch.all(t.dequantize() == 2)


def test_copy_between_fp8_tensors(device, gen):
    _, dst = make(device, gen, scale=4.0)
    _, src = make(device, gen, scale=0.5)
    dst.copy_(src)  # same format: the bits and the scale, no re-quantization
    assert torch.equal(dst._data, src._data) and torch.equal(dst._transpose, src._transpose)
    assert dst._scale_inv.item() == 2.0 and torch.equal(dst.dequantize(), src.dequantize())
    row_only = delayed(device, scale=1.0, columnwise=False)(src.dequantize())
    dst.copy_(row_only)  # the column-wise copy is made from the row-wise bits
    assert torch.equal(dst._transpose, ref_columnwise(row_only._data.cpu()).to(device))
    other = delayed(device, scale=8.0, fp8_dtype=DType.kFloat8E5M2)(src.dequantize())
    dst.copy_(other)  # other format: dequantized and re-quantized with dst's quantizer
    assert dst._fp8_dtype == E4M3 and dst._scale_inv.item() == 0.25
    assert_holds(dst, other.dequantize(), 4.0)
    plain = torch.empty(6, 10, device=device)
    plain.copy_(src)
    assert_float_equal(plain, src.dequantize(dtype=torch.float32))


@pytest.mark.parametrize("kind", ["delayed", "current"])
def test_inplace_ops_requantize(device, gen, kind):
    x = torch.randn(6, 10, generator=gen).to(device)
    q = delayed(device) if kind == "delayed" else Float8CurrentScalingQuantizer(E4M3, device)
    t = q(x)
    before = t.dequantize()
    assert t.add_(1.0) is t
    expected = before + 1.0
    assert type(t) is Float8Tensor
    scale = q.scale.item()  # current scaling: the scale of this re-quantization
    assert_holds(t, expected, scale)
    if kind == "current":
        assert scale == f32(448) / f32(expected.abs().max().item())
    y = torch.ones(6, 10, device=device)
    assert torch.add(y, y, out=t) is t
    assert torch.all(t.dequantize() == 2)


def test_inplace_through_a_view_reaches_the_base(device, gen):
    x, t = make(device, gen, (4, 6))
    v = t.view(2, 2, 6)
    v.mul_(2)
    assert_holds(t, x.float() * 2, 4.0)  # both layouts of the base, through the shared buffers
    tt = t.t()
    tt.zero_()
    assert not t._data.any() and not t._transpose.any()


# ---- nn.Parameter, autograd and optimizers -----------------------------------------------------


def test_parameter_keeps_the_subclass(device, gen):
    x, t = make(device, gen, dtype=torch.float32)
    p = torch.nn.Parameter(t)
    assert isinstance(p, Float8Tensor) and isinstance(p, torch.nn.Parameter) and p.requires_grad and p.is_leaf
    d = p.data
    assert type(d) is Float8Tensor and not d.requires_grad and d._data.data_ptr() == p._data.data_ptr()
    y = torch.randn(6, 10, generator=gen).to(device)
    p.data.copy_(y)  # how an optimizer (or fp8_model_init code) writes an FP8 weight
    assert_holds(p, y, 4.0)
    with torch.no_grad():
        p.copy_(y * 2)
    assert_holds(p, y * 2, 4.0)
    m = torch.nn.Module()
    m.weight = p
    assert dict(m.named_parameters())["weight"] is p


def test_data_assignment(device, gen):
    _, p = make(device, gen, dtype=torch.float32)
    p = torch.nn.Parameter(p)
    y = torch.randn(6, 10, generator=gen).to(device)
    p.data = y  # a plain tensor is quantized with the parameter's quantizer
    assert type(p) is Float8Tensor and p.requires_grad
    assert_holds(p, y, 4.0)
    _, other = make(device, gen, (3, 4), dtype=torch.bfloat16, scale=2.0)
    p.data = other  # an FP8 tensor lends its buffers; torch's metadata follows
    assert p.shape == (3, 4) and p.dtype == torch.bfloat16 and p._data is other._data and p.requires_grad


def test_module_dtype_conversion_keeps_fp8(device, gen):
    m = torch.nn.Linear(10, 6, bias=False, device=device)
    _, w = make(device, gen, dtype=torch.float32)
    m.weight = torch.nn.Parameter(w)
    m.to(torch.bfloat16)
    assert type(m.weight) is Float8Tensor and m.weight.dtype == torch.bfloat16


def test_backward_and_sgd_step(device, gen):
    _, w = make(device, gen, dtype=torch.float32)
    p = torch.nn.Parameter(w)
    inp = torch.randn(3, 10, generator=gen).to(device)
    out = torch.nn.functional.linear(inp, p)
    out.sum().backward()
    assert type(p.grad) is torch.Tensor and p.grad.dtype == torch.float32
    assert torch.allclose(p.grad, torch.ones(3, 6, device=device).t() @ inp)
    before = p.dequantize().detach()
    torch.optim.SGD([p], lr=0.1).step()
    assert type(p) is Float8Tensor
    assert_holds(p, torch.add(before, p.grad, alpha=-0.1), 4.0)  # SGD's own update, then the cast


def test_adam_keeps_fp8_param_and_high_precision_state(device, gen):
    _, w = make(device, gen, dtype=torch.float32)
    p = torch.nn.Parameter(w)
    p.grad = torch.randn(6, 10, generator=gen).to(device)
    opt = torch.optim.AdamW([p], lr=0.01)
    opt.step()
    assert type(p) is Float8Tensor and type(opt.state[p]["exp_avg"]) is torch.Tensor
    assert opt.state[p]["exp_avg"].dtype == torch.float32


def test_dequantize_passes_gradients(device, gen):
    _, w = make(device, gen, dtype=torch.bfloat16)
    p = torch.nn.Parameter(w)
    (p.dequantize(dtype=torch.float32) * 3).sum().backward()
    assert p.grad.dtype == torch.bfloat16 and torch.all(p.grad == 3)


# ---- pickling, state dicts, deepcopy ---------------------------------------------------------------


def save_load(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def assert_same_fp8(a, b):
    assert type(a) is type(b) and a.shape == b.shape and a.dtype == b.dtype and a._fp8_dtype == b._fp8_dtype
    for x, y in ((a._data, b._data), (a._transpose, b._transpose), (a._scale_inv, b._scale_inv)):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y))


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("layout", ["both", "rowwise", "columnwise"])
def test_save_load(device, gen, layout, weights_only):
    _, t = make(device, gen, (3, 4, 5), rowwise=layout != "columnwise", columnwise=layout != "rowwise")
    loaded = save_load(t, weights_only=weights_only)
    assert_same_fp8(loaded, t)
    q = loaded._quantizer
    assert type(q) is Float8Quantizer and q.scale.item() == 4.0 and q.dtype == E4M3
    assert (q.rowwise_usage, q.columnwise_usage) == (t._quantizer.rowwise_usage, t._quantizer.columnwise_usage)


def test_save_load_parameter_and_current_scaling(device, gen):
    q = Float8CurrentScalingQuantizer(DType.kFloat8E5M2, device, force_pow_2_scales=True, amax_epsilon=0.5)
    p = torch.nn.Parameter(q(torch.randn(4, 4, generator=gen).to(device)))
    loaded = save_load(p)
    assert isinstance(loaded, torch.nn.Parameter) and isinstance(loaded, Float8Tensor) and loaded.requires_grad
    assert_same_fp8(loaded, p)
    lq = loaded._quantizer
    assert type(lq) is Float8CurrentScalingQuantizer and lq.force_pow_2_scales and lq.amax_epsilon == 0.5
    assert lq.dtype == DType.kFloat8E5M2 and torch.equal(lq.scale, q.scale)


def test_state_dict_round_trip(device, gen):
    def module(weight):
        m = torch.nn.Linear(10, 6, bias=False, device=device)
        if weight is not None:
            m.weight = torch.nn.Parameter(weight)
        return m

    _, w = make(device, gen, dtype=torch.float32)
    src = module(w)
    state = save_load(src.state_dict())
    assert type(state["weight"]) is Float8Tensor
    # Into an FP8 module: the bits and the scale are copied into its own buffers.
    dst = module(delayed(device, scale=1.0)(torch.zeros(6, 10, device=device)))
    ptr = dst.weight._data.data_ptr()
    dst.load_state_dict(state)
    assert_same_fp8(dst.weight, src.weight) and dst.weight._data.data_ptr() == ptr
    inp = torch.randn(2, 10, generator=gen).to(device)
    assert torch.equal(dst(inp), src(inp))
    # Into a plain module: the dequantized values.
    plain = module(None)
    plain.load_state_dict(state)
    assert type(plain.weight) is torch.nn.Parameter and torch.equal(plain.weight, w.dequantize())
    # A plain checkpoint into an FP8 module: quantized with the module's quantizer.
    dst.load_state_dict({"weight": torch.ones(6, 10)})
    assert type(dst.weight) is Float8Tensor and torch.all(dst.weight.dequantize() == 1)


def test_deepcopy(device, gen):
    _, t = make(device, gen)
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(t)
    m2 = copy.deepcopy(m)
    w2 = m2.weight
    assert isinstance(w2, Float8Tensor) and isinstance(w2, torch.nn.Parameter)
    assert_same_fp8(w2, t) and w2._data.data_ptr() != t._data.data_ptr()
    assert w2._quantizer is not t._quantizer and torch.equal(w2._quantizer.scale, t._quantizer.scale)


# ---- construction errors -------------------------------------------------------------------------


def test_constructor_errors():
    data, scale_inv = torch.zeros(2, 3, dtype=torch.uint8), torch.ones(1)
    with pytest.raises(ValueError, match=r"shape \(3, 2\) does not match data of shape \(2, 3\)"):
        Float8Tensor(shape=(3, 2), dtype=torch.float32, data=data, fp8_scale_inv=scale_inv, fp8_dtype=E4M3)
    with pytest.raises(TypeError, match="the nominal dtype must be float32, float16 or bfloat16, got torch.int32"):
        Float8Tensor(shape=(2, 3), dtype=torch.int32, data=data, fp8_scale_inv=scale_inv, fp8_dtype=E4M3)
    with pytest.raises(TypeError, match="fp8_dtype must be DType.kFloat8E4M3"):
        Float8Tensor(shape=(2, 3), dtype=torch.float32, data=data, fp8_scale_inv=scale_inv, fp8_dtype=torch.int8)
    with pytest.raises(ValueError, match="needs data, data_transpose or both"):
        Float8Tensor(shape=(2, 3), dtype=torch.float32, fp8_scale_inv=scale_inv, fp8_dtype=E4M3)
    with pytest.raises(TypeError, match="data must be a torch.uint8 tensor"):
        Float8Tensor(shape=(2, 3), dtype=torch.float32, data=data.float(), fp8_scale_inv=scale_inv, fp8_dtype=E4M3)
    with pytest.raises(TypeError, match="dequantize: dtype must be float32, float16 or bfloat16, got torch.float64"):
        Float8Tensor(shape=(2, 3), dtype=torch.float32, data=data, fp8_scale_inv=scale_inv,
                     fp8_dtype=E4M3).dequantize(dtype=torch.float64)


def test_quantizer_module_names():
    """Transformer Engine's import paths."""
    from transformer_engine.pytorch.tensor import float8_tensor, quantized_tensor

    assert float8_tensor.Float8Quantizer is Float8Quantizer
    assert float8_tensor.Float8CurrentScalingQuantizer is Float8CurrentScalingQuantizer
    assert quantized_tensor.QuantizedTensor is QuantizedTensor
    with pytest.raises(AttributeError):
        float8_tensor.NoSuchName  # noqa: B018
