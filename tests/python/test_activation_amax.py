"""The amax an activation forward or backward raises as it writes a float output
(te_activation_fwd's output.amax, te_activation_bwd's dinput.amax): what te_compute_amax
of that output adds, bit for bit, for the current-scaling cast that follows it
(module_ops.FusedAmax)."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cuda

from activation_reference import KINDS, make_input
from fp8_reference import FLOAT_DTYPES, dtype_id
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import compute_amax, module_ops

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
# rows x output columns: vectors and a tail on the GPU, the one-by-one path (odd width)
SHAPES = {"37x1024": (37, 1024), "64x40": (64, 40), "3x17": (3, 17)}


def kind_of(name):
    return int(getattr(_core.Activation, name.upper())), KINDS[name][1]


def bits(t):
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def with_specials(x):
    """x with a NaN and a large value in it: the amax skips NaN, and a large value
    overflows fp16 (the stored inf is what te_compute_amax sees too)."""
    x = x.clone()
    x.view(-1)[3] = float("nan")
    x.view(-1)[-2] = 7e4 if x.dtype != torch.bfloat16 else 3e38
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("shape_id", list(SHAPES))
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", list(KINDS))
def test_amax_is_that_of_the_output(name, dtype, shape_id, direction, device, gen):
    """The forward's y, or the backward's dx: the amax raised as it is written equals
    te_compute_amax of it, and the tensor is what the call without an amax writes."""
    rows, h = SHAPES[shape_id]
    kind, gated = kind_of(name)
    x = with_specials(make_input((rows, 2 * h if gated else h), dtype, gen)).to(device)
    grad = (torch.randn(rows, h, generator=gen) * 3).to(dtype).to(device)
    dev = module_ops.core_device(x)

    def run(amax_address=0):
        if direction == "fwd":
            return module_ops.activation_forward(kind, gated, x, dev, amax=amax_address)
        return module_ops.activation_backward(kind, grad, x, dev, amax=amax_address)

    for prior in (0.0, 1e30):  # the amax is raised, never lowered
        amax = torch.full((1,), prior, device=device)
        out = run(amax.data_ptr())
        assert out.dtype == dtype and out.shape == ((rows, h) if direction == "fwd" else x.shape)
        assert torch.equal(bits(out), bits(run()))
        want = compute_amax(out, torch.full((1,), prior, device=device))
        assert amax.item() == want.item(), (amax.item(), want.item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_public_helper_takes_a_float_outputs_amax(device, dtype):
    """gelu() & co. take ``amax`` with a float output too (as layernorm_fwd does): raised to
    te_compute_amax of the output, the output the same bits as without it."""
    from transformer_engine.pytorch.cpp_extensions import gelu

    torch.manual_seed(5)
    x = with_specials(torch.randn(37, 1024, dtype=dtype, device=device) * 3)
    plain = gelu(x)
    amax = torch.zeros(1, device=device)
    y = gelu(x, amax=amax)
    assert torch.equal(bits(y), bits(plain))
    assert bits(amax).item() == bits(compute_amax(plain)).item()


@requires_cuda
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("name,dtype,rows,h", [("gelu", torch.bfloat16, 8192, 5120),
                                               ("swiglu", torch.float32, 4096, 2560)], ids=["gelu", "swiglu"])
def test_amax_grid_strides(name, dtype, rows, h, direction):
    """Outputs large enough that the capped grid of a kernel that raises an amax (four
    waves: 4224 blocks of 256 threads on 132 SMs at most) goes over them more than once
    (5120 or more blocks' worth): the output the same bits as the uncapped run without an
    amax, the amax te_compute_amax's of it."""
    kind, gated = kind_of(name)
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(rows, 2 * h if gated else h, generator=g) * 3).to(dtype).to("cuda")
    grad = (torch.randn(rows, h, generator=g) * 3).to(dtype).to("cuda")
    dev = module_ops.core_device(x)

    def run(amax_address=0):
        if direction == "fwd":
            return module_ops.activation_forward(kind, gated, x, dev, amax=amax_address)
        return module_ops.activation_backward(kind, grad, x, dev, amax=amax_address)

    plain = run()
    amax = torch.zeros(1, device="cuda")
    out = run(amax.data_ptr())
    assert torch.equal(bits(out), bits(plain))
    assert amax.item() == compute_amax(plain).item()
