"""delay_wgrad_compute=True (Linear, LayerNormLinear, LayerNormMLP): the backward leaves the
weight-gradient GEMMs to backward_dw(), which must then produce exactly the gradients the
ordinary backward produces.

Exactness: the delayed module runs the same ops on the same tensors as the eager one (the
same GEMM calls on the same saved inputs and output gradients, FP8 or not), only later,
and accumulates in the same order; so every comparison here is torch.equal, on the GPU
too (same shapes and operands give cuBLASLt the same algorithm)."""

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
# name: (params dtype, FP8 recipe or None)
PRECISIONS = {
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "fp8_delayed": (torch.float32, DelayedScaling(amax_history_len=4)),
    "fp8_current": (torch.bfloat16, Float8CurrentScaling()),
}
HIDDEN, OUT, FFN = 64, 48, 96
WEIGHTS = {"Linear": ["weight"], "LayerNormLinear": ["weight"], "LayerNormMLP": ["fc1_weight", "fc2_weight"]}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def build(kind, device, dtype, seed=11, **kw):
    torch.manual_seed(seed)
    if kind == "Linear":
        m = te.Linear(HIDDEN, OUT, params_dtype=dtype, device=device, **kw)
    elif kind == "LayerNormLinear":
        m = te.LayerNormLinear(HIDDEN, OUT, params_dtype=dtype, device=device, **kw)
    else:
        m = te.LayerNormMLP(HIDDEN, FFN, params_dtype=dtype, device=device, **kw)
    with torch.no_grad():  # nonzero biases and norm parameters: their gradients then matter
        for name, p in m.named_parameters():
            if "weight" not in name or name.startswith("layer_norm"):
                p.add_(torch.randn_like(p) * 0.1)
    return m


def pair(kind, device, dtype, **kw):
    """(eager module, delayed module) with the same parameters."""
    eager = build(kind, device, dtype, **kw)
    delayed = build(kind, device, dtype, delay_wgrad_compute=True, **kw)
    for (name, p), (_, q) in zip(eager.named_parameters(), delayed.named_parameters()):
        assert torch.equal(p, q), name
    return eager, delayed


def fwd_bwd(m, x, g, recipe):
    x = x.detach().clone().requires_grad_()
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = m(x)
    y.backward(g)
    return y, x.grad


def out_features(kind):
    return HIDDEN if kind == "LayerNormMLP" else OUT


def weight_names(m, kind):
    if kind == "Linear" and m._split is not None:
        return m._weight_names
    return WEIGHTS[kind]


def is_wgrad_bias(name):
    """The biases whose gradient comes with the wgrad GEMM (fc1's comes from the activation)."""
    return name in ("bias", "fc2_bias")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", list(WEIGHTS))
@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("fuse", [False, True], ids=["grad", "main_grad"])
def test_backward_dw_gives_the_eager_gradients(device, kind, precision, bias, fuse):
    dtype, recipe = PRECISIONS[precision]
    eager, delayed = pair(kind, device, dtype, bias=bias, fuse_wgrad_accumulation=fuse)
    names = weight_names(eager, kind)
    if fuse:
        for m in (eager, delayed):
            for name in names:
                getattr(m, name).main_grad = torch.zeros_like(getattr(m, name), dtype=torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(3)
    microbatches = [(torch.randn(2, 8, HIDDEN, generator=gen).to(device, dtype),
                     torch.randn(2, 8, out_features(kind), generator=gen).to(device, dtype)) for _ in range(3)]
    for x, g in microbatches:
        y_eager, dx_eager = fwd_bwd(eager, x, g, recipe)
        y_delayed, dx_delayed = fwd_bwd(delayed, x, g, recipe)
        assert torch.equal(y_delayed, y_eager) and torch.equal(dx_delayed, dx_eager)
        for name in names:  # no weight gradient yet, anywhere
            w = getattr(delayed, name)
            assert w.grad is None
            if fuse:
                assert torch.count_nonzero(w.main_grad) == 0
        for name, p in delayed.named_parameters():  # the other gradients flow as usual
            if name in names:
                continue
            deferred = recipe is None and is_wgrad_bias(name)
            if deferred:
                assert p.grad is None, name
            else:
                assert torch.equal(p.grad, dict(eager.named_parameters())[name].grad), name
    assert len(delayed.wgrad_store) == 3
    for _ in microbatches:
        delayed.backward_dw()
    assert len(delayed.wgrad_store) == 0
    delayed.backward_dw()  # nothing left: a no-op
    for (name, p), (_, q) in zip(eager.named_parameters(), delayed.named_parameters()):
        if fuse and name in names:
            assert q.grad is None and q.grad_added_to_main_grad
            assert torch.equal(q.main_grad, p.main_grad), name
        else:
            assert q.grad.dtype == p.grad.dtype
            assert torch.equal(q.grad, p.grad), name


@pytest.mark.parametrize("device", DEVICES)
def test_backward_dw_pops_the_oldest_backward_first(device):
    eager, delayed = pair("Linear", device, torch.float32)
    xs = [torch.randn(16, HIDDEN, device=device) for _ in range(3)]
    gs = [torch.randn(16, OUT, device=device) for _ in range(3)]
    expected = []
    for x, g in zip(xs, gs):
        eager.zero_grad()
        fwd_bwd(eager, x, g, None)
        expected.append((eager.weight.grad.clone(), eager.bias.grad.clone()))
    fwd_bwd(delayed, xs[0], gs[0], None)
    fwd_bwd(delayed, xs[1], gs[1], None)
    delayed.backward_dw()  # microbatch 0's
    assert torch.equal(delayed.weight.grad, expected[0][0]) and torch.equal(delayed.bias.grad, expected[0][1])
    fwd_bwd(delayed, xs[2], gs[2], None)
    for i in (1, 2):
        delayed.zero_grad()
        delayed.backward_dw()
        assert torch.equal(delayed.weight.grad, expected[i][0]) and torch.equal(delayed.bias.grad, expected[i][1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [None, DelayedScaling()], ids=["hp", "fp8"])
def test_split_parameters(device, recipe):
    eager, delayed = pair("Linear", device, torch.float32, parameters_split=("query_", "key_", "value_"))
    x = torch.randn(16, HIDDEN, device=device)
    g = torch.randn(16, OUT, device=device)
    fwd_bwd(eager, x, g, recipe)
    fwd_bwd(delayed, x, g, recipe)
    assert all(getattr(delayed, n).grad is None for n in delayed._weight_names)
    delayed.backward_dw()
    for (name, p), (_, q) in zip(eager.named_parameters(), delayed.named_parameters()):
        assert torch.equal(q.grad, p.grad), name


@pytest.mark.parametrize("device", DEVICES)
def test_return_bias_and_frozen_weight(device):
    # return_bias: the bias is added outside the module, its gradient flows through autograd.
    eager, delayed = pair("Linear", device, torch.float32, return_bias=True)
    x = torch.randn(16, HIDDEN, device=device)
    for m in (eager, delayed):
        y, b = m(x)
        (y + b).square().sum().backward()
    assert delayed.weight.grad is None and torch.equal(delayed.bias.grad, eager.bias.grad)
    delayed.backward_dw()
    assert torch.equal(delayed.weight.grad, eager.weight.grad)
    # A frozen weight: no GEMM to delay, the bias gradient comes at once; the backward's
    # (empty) entry is still there, so backward_dw stays paired with the backwards.
    eager, delayed = pair("Linear", device, torch.float32)
    g = torch.randn(16, OUT, device=device)
    for m in (eager, delayed):
        m.weight.requires_grad_(False)
        fwd_bwd(m, x, g, None)
    assert torch.equal(delayed.bias.grad, eager.bias.grad)
    assert len(delayed.wgrad_store) == 1
    delayed.backward_dw()
    assert delayed.weight.grad is None and torch.equal(delayed.bias.grad, eager.bias.grad)


def test_need_backward_dw_hooks_and_flags():
    eager, delayed = pair("LayerNormMLP", "cpu", torch.float32)
    assert delayed.need_backward_dw() and not eager.need_backward_dw()
    # Transformer Engine's marker for gradient hooks: these weights get their gradients
    # from backward_dw, not from autograd.
    assert delayed.fc1_weight.skip_backward_post_hook and delayed.fc2_weight.skip_backward_post_hook
    assert not hasattr(delayed.fc1_bias, "skip_backward_post_hook")
    assert not hasattr(eager.fc1_weight, "skip_backward_post_hook")
    calls = []
    delayed.register_wgrad_accumulation_and_reduce_hooks(lambda: calls.append(delayed.fc2_weight.grad is not None))
    delayed.backward_dw()  # nothing stashed: no work, no hook
    assert calls == []
    fwd_bwd(delayed, torch.randn(8, HIDDEN), torch.randn(8, HIDDEN), None)
    delayed.backward_dw()
    assert calls == [True]
    # backward_dw of a module that does not delay: nothing happens.
    fwd_bwd(eager, torch.randn(8, HIDDEN), torch.randn(8, HIDDEN), None)
    before = eager.fc1_weight.grad.clone()
    eager.backward_dw()
    assert torch.equal(eager.fc1_weight.grad, before)


def test_backward_dw_builds_no_graph():
    # The input is already a contiguous 2-D fp32 tensor that requires grad, so the module
    # keeps it as is for the wgrad GEMM; backward_dw must not record a graph through it.
    m = build("Linear", "cpu", torch.float32, delay_wgrad_compute=True)
    x = torch.randn(16, HIDDEN, requires_grad=True)
    m(x).sum().backward()
    m.backward_dw()
    assert m.weight.grad.grad_fn is None and not m.weight.grad.requires_grad
