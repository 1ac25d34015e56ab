"""te.LayerNormMLP(checkpoint=True): the backward recomputes norm -> fc1 -> activation from
the saved input instead of keeping those activations. The recompute repeats the forward's
operations on the same operands (the FP8 weights as cast, the forward's scales), so every
result must equal checkpoint=False's bit for bit, over several FP8 steps whose scales
change between the forward and the backward; and it must save less."""

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
from transformer_engine.pytorch.tensor import Float8TensorBase

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
RECIPES = {"bf16": None, "delayed": lambda: DelayedScaling(amax_history_len=4),
           "current": lambda: Float8CurrentScaling()}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def pair(device, **kwargs):
    torch.manual_seed(21)
    plain = te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16, device=device, **kwargs)
    with torch.no_grad():
        plain.fc1_bias.normal_()
        plain.fc2_bias.normal_()
        plain.layer_norm_weight.normal_(1.0, 0.1)
    ckpt = te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16, device=device, checkpoint=True, **kwargs)
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def step(m, x, g, recipe, **call):
    xx = x.clone().requires_grad_()
    m.zero_grad()
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe() if recipe else None):
        out = m(xx, **call)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [g] * len(outs))
    return outs, xx.grad, [p.grad for p in m.parameters()]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("return_layernorm_output", [False, True], ids=["out", "out_and_ln"])
def test_checkpoint_gives_the_same_results(device, recipe, activation, normalization, return_layernorm_output):
    plain, ckpt = pair(device, activation=activation, normalization=normalization,
                       return_layernorm_output=return_layernorm_output)
    for i in range(3):  # the delayed scales of step i+1 come from step i: the recompute must not see them
        x = torch.randn(2, 16, 64, dtype=torch.bfloat16, device=device) * (1 + i)
        g = torch.randn(2, 16, 64, dtype=torch.bfloat16, device=device)
        want = step(plain, x, g, RECIPES[recipe])
        got = step(ckpt, x, g, RECIPES[recipe])
        for a, b in zip(got[0], want[0]):
            assert torch.equal(a, b)
        assert torch.equal(got[1], want[1])
        for a, b in zip(got[2], want[2]):
            assert torch.equal(a, b)
        if recipe == "delayed":  # the recompute recorded no amax: the histories agree
            FP8GlobalStateManager.flush_deferred_backward_update()  # it would wait for the next autocast exit
            for a, b in ((ckpt._fwd_state, plain._fwd_state), (ckpt._bwd_state, plain._bwd_state)):
                assert torch.equal(a.amax_history, b.amax_history) and torch.equal(a.scale, b.scale)


def saved_activation_bytes(out, module, inp):
    """Bytes the autograd node of ``out`` keeps for the backward, not counting the module's
    parameters and the input (alive anyway): the activations it holds on to."""
    alive = {p.data_ptr() for p in module.parameters()} | {inp.data_ptr()}
    seen, total = set(), 0

    def visit(obj):
        nonlocal total
        if isinstance(obj, Float8TensorBase):
            for t in (obj._data, obj._transpose, obj._scale_inv):
                visit(t)
        elif isinstance(obj, torch.Tensor):
            ptr = obj.untyped_storage().data_ptr()
            if ptr not in alive and ptr not in seen:
                seen.add(ptr)
                total += obj.untyped_storage().nbytes()
        elif isinstance(obj, (tuple, list)):
            for item in obj:
                visit(item)

    node = out.grad_fn  # the autograd function's ctx: the module keeps its saved tensors there
    visit(node.saved)
    visit(node.recompute)
    return total


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
def test_checkpoint_saves_no_activations(device, recipe):
    # ctx attributes, not save_for_backward, hold the module's tensors (saved_tensors_hooks
    # would not see them), so the node's saved state is measured directly.
    plain, ckpt = pair(device)
    tokens, ffn = 256, 128
    x = torch.randn(tokens, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    sizes = {}
    for name, m in (("plain", plain), ("ckpt", ckpt)):
        with te.fp8_autocast(enabled=RECIPES[recipe] is not None,
                             fp8_recipe=RECIPES[recipe]() if RECIPES[recipe] else None):
            y = m(x)
        sizes[name] = saved_activation_bytes(y, m, x)
    # Without checkpointing at least fc1's output ([tokens, ffn], bf16) and the activation
    # (FP8 or bf16) are kept; with it, only the FP8 weight copies (weight-sized, not
    # token-sized) and a few scales.
    weights_fp8 = 2 * (128 * 64) * 2 + 64  # two weights, both layouts, one byte each; scales
    assert sizes["plain"] >= tokens * ffn * 2 + tokens * ffn
    assert sizes["ckpt"] <= weights_fp8, sizes


@requires_cuda
@pytest.mark.parametrize("recipe", ["bf16", "delayed"])
def test_checkpoint_lowers_cuda_memory_between_forward_and_backward(recipe):
    plain, ckpt = (m.cuda() for m in pair("cuda"))
    tokens = 4096
    x = torch.randn(tokens, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    held = {}
    for measured in (False, True):  # a first round allocates the workspaces kept for the process
        for name, m in (("plain", plain), ("ckpt", ckpt)):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            with te.fp8_autocast(enabled=recipe == "delayed", fp8_recipe=DelayedScaling()):
                y = m(x)
            torch.cuda.synchronize()
            if measured:
                held[name] = torch.cuda.memory_allocated() - before  # the output and what the backward keeps
            y.float().sum().backward()
            del y
    # Without recompute fc1's output alone is [tokens, 128] bf16; the activation and the
    # norm's output add as much again (less in FP8).
    fc1_out_bytes = tokens * 128 * 2
    assert held["plain"] - held["ckpt"] >= fc1_out_bytes, held
    assert held["ckpt"] < fc1_out_bytes, held  # the output [tokens, 64] bf16 and the FP8 weights


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_without_grad(device):
    plain, ckpt = pair(device)
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
    with torch.no_grad(), te.fp8_autocast(fp8_recipe=DelayedScaling()):
        assert torch.equal(ckpt(x), plain(x))


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_while_calibrating_records_each_amax_once(device):
    plain, ckpt = pair(device)
    for i in range(2):
        x = torch.randn(32, 64, dtype=torch.bfloat16, device=device) * (1 + i)
        g = torch.randn(32, 64, dtype=torch.bfloat16, device=device)
        results = []
        for m in (plain, ckpt):
            xx = x.clone().requires_grad_()
            with te.fp8_autocast(enabled=False, calibrating=True, fp8_recipe=DelayedScaling(amax_history_len=4)):
                y = m(xx)
            y.backward(g)
            results.append((y, xx.grad))
        assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
        FP8GlobalStateManager.flush_deferred_backward_update()
        for a, b in ((ckpt._fwd_state, plain._fwd_state), (ckpt._bwd_state, plain._bwd_state)):
            assert torch.equal(a.amax_history, b.amax_history)
        assert plain._fwd_state.amax_history.abs().sum() > 0
