"""te_dbias_cast_transpose_current_scaling (module_ops.dbias_quantize_current_scaling): the
bias gradient and the FP8 cast of a gradient under current scaling in one core call.

Reference, on the CPU, from the separate ops: the scale of te_compute_scale_from_amax from
max|grad|, then te_dbias_cast_transpose with that scale. The amax is exact on every device
and the scale the same formula, so the FP8 codes and scale_inv are equal bit for bit. dbias:
equal on the CPU (the same reference sum); on the GPU within the bound of test_bias_grad.py
(fp32 additions, then compensated sums: 32U sum|grad|, plus the rounding to dbias's dtype),
for the one-block kernel of small gradients and for the separate kernels of larger ones.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES

from activation_reference import HALF_MIN_STEP, U, UNIT, make_input
from fp8_reference import FLOAT_DTYPES, assert_fp8_equal, dtype_id
from transformer_engine import _core
from transformer_engine.pytorch import cpp_extensions as ext
from transformer_engine.pytorch.cpp_extensions import DType, module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import core_device

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2
# [rows, cols]: one block (16384 elements at most, both dims multiples of 8) on both sides
# of the limit, a tall and a wide one, dims the one-block kernel does not take, no rows.
SHAPES = [(16, 64), (128, 128), (136, 128), (2048, 8), (8, 2048), (40, 24), (37, 24), (200, 520), (0, 16)]


def reference(grad: torch.Tensor, fp8_dtype, epsilon: float, pow2: bool):
    """(dbias, FP8 storage, scale) from the separate CPU ops."""
    amax = grad.float().abs().max().reshape(1) if grad.numel() else torch.zeros(1)
    scale, _ = ext.compute_scale_from_amax(amax, fp8_dtype, epsilon=epsilon, force_pow_2_scales=pow2)
    dbias, out = ext.bgrad_quantize(grad, fp8_dtype, scale)
    return dbias, out, scale


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("fp8_dtype", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_matches_the_separate_ops(device, dtype, fp8_dtype, shape, gen):
    grad = make_input(shape, dtype, gen)
    epsilon, pow2 = (0.0, False) if shape[0] % 16 else (1e-3, True)
    want_dbias, want, scale = reference(grad, fp8_dtype, epsilon, pow2)
    dbias, got = module_ops.dbias_quantize_current_scaling(grad.to(device), fp8_dtype, epsilon, pow2, True, True,
                                                           core_device(grad.to(device)))
    assert_fp8_equal(got._data.cpu(), want._data, fp8_dtype)
    assert_fp8_equal(got._transpose.cpu(), want._transpose, fp8_dtype)
    assert got._scale_inv.item() == (1.0 / scale).item()
    assert dbias.dtype == dtype and dbias.shape == (shape[1],)
    if device == "cpu":
        assert torch.equal(dbias, want_dbias)
    else:
        total = grad.double().sum(0)
        bound = 32 * U * grad.double().abs().sum(0) + UNIT[dtype] * total.abs() + HALF_MIN_STEP[dtype]
        diff = (dbias.double().cpu() - total).abs()
        assert bool((diff <= bound).all()), f"dbias off by up to {(diff - bound).max().item()} past the bound"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [(True, False), (False, True)], ids=["rowwise", "columnwise"])
def test_one_layout(device, layout):
    grad = torch.randn(32, 48, generator=torch.Generator().manual_seed(3)).to(device)
    rowwise, columnwise = layout
    _, got = module_ops.dbias_quantize_current_scaling(grad, E4M3, 0.0, False, rowwise, columnwise,
                                                       core_device(grad))
    assert (got._data is not None) == rowwise and (got._transpose is not None) == columnwise
    _, want, _ = reference(grad.cpu(), E4M3, 0.0, False)
    assert_fp8_equal((got._data if rowwise else got._transpose).cpu(), want._data if rowwise else want._transpose,
                     E4M3)


def describe(t):
    dtype = {torch.float32: DType.kFloat32, torch.bfloat16: DType.kBFloat16}[t.dtype]
    return _core.Tensor(0, 0, int(dtype), list(t.shape), t.data_ptr())


def test_bad_arguments_are_named():
    grad = torch.randn(16, 32)
    data, dbias, scratch = torch.empty(16, 32, dtype=torch.uint8), torch.empty(32), torch.zeros(3)
    p = scratch.data_ptr()

    def output(amax=p, scale=p + 4, dtype=E4M3):
        return _core.Tensor(0, 0, int(dtype), [16, 32], data.data_ptr(), 0, scale, p + 8, amax,
                            int(_core.ScalingMode.PER_TENSOR))

    op = _core.dbias_cast_transpose_current_scaling
    with pytest.raises(ValueError, match=r"^te_dbias_cast_transpose_current_scaling: output\.amax must not be null"):
        op(describe(grad), output(amax=0), describe(dbias), 0.0, False)
    with pytest.raises(ValueError, match=r"^te_dbias_cast_transpose_current_scaling: output\.scale must not be null"):
        op(describe(grad), output(scale=0), describe(dbias), 0.0, False)
    with pytest.raises(ValueError, match=r"epsilon must be finite and >= 0, got -1"):
        op(describe(grad), output(), describe(dbias), -1.0, False)
    with pytest.raises(ValueError, match=r"epsilon must be finite"):
        op(describe(grad), output(), describe(dbias), float("nan"), False)
    with pytest.raises(ValueError, match=r"output dtype must be float8_e4m3 or float8_e5m2, got bfloat16"):
        op(describe(grad), output(dtype=DType.kBFloat16), describe(dbias), 0.0, False)
    with pytest.raises(ValueError, match=r"dbias shape must be \[32\]"):
        op(describe(grad), output(), describe(torch.empty(31)), 0.0, False)
    assert torch.equal(scratch, torch.zeros(3)), "nothing written before the checks passed"
    op(describe(grad), output(), describe(dbias), 0.0, False)
    assert scratch[0].item() == grad.abs().max().item()
