"""The backward scale update waits for the next forward update and shares its launch
(FP8GlobalStateManager.update_backward_states): one launch a step updates both
directions, and every cast still sees the scales of Transformer Engine's order, where the
backward update runs at the end of the backward pass."""

import numpy as np
import pytest
import torch
from conftest import DEVICES, requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Format
from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.fp8 import DelayedScalingState, FP8GlobalStateManager, fp8_autocast, get_fp8_max

manager = FP8GlobalStateManager


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


@pytest.fixture
def update_calls(monkeypatch):
    """The groups of each te_delayed_scaling_update call the manager makes."""
    calls = []
    real = module_ops.delayed_scaling_update

    def counting(groups, *args, **kwargs):
        calls.append(list(groups))
        return real(groups, *args, **kwargs)

    monkeypatch.setattr(module_ops, "delayed_scaling_update", counting)
    return calls


def expected_scale(amax: float, fp8_max: float, margin: int) -> float:
    return float(np.float32(np.float32(fp8_max) / np.float32(amax)) / np.float32(2.0 ** margin))


@pytest.mark.parametrize("device", DEVICES)
def test_one_launch_updates_both_formats(device, update_calls):
    """A HYBRID recipe: the deferred backward state (E5M2) and the forward state (E4M3)
    are updated by the next autocast exit, in one core call, each by its own format."""
    recipe = DelayedScaling(fp8_format=Format.HYBRID, margin=1, amax_history_len=2)
    fwd = DelayedScalingState(2, recipe, forward=True, device=device)
    bwd = DelayedScalingState(2, recipe, forward=False, device=device)
    bwd.amax_history[0] = torch.tensor([3.0, 0.5])
    manager.add_backward_state(bwd)
    manager.update_backward_states(recipe)
    assert torch.all(bwd.scale == 1.0) and not update_calls, "the backward update waits"
    with fp8_autocast(fp8_recipe=recipe):
        fwd.amax_history[0] = torch.tensor([2.0, 7.0])
        manager.add_forward_state(fwd)
    assert len(update_calls) == 1 and len(update_calls[0]) == 2
    want_fwd = [expected_scale(a, get_fp8_max(recipe, True), 1) for a in (2.0, 7.0)]
    want_bwd = [expected_scale(a, get_fp8_max(recipe, False), 1) for a in (3.0, 0.5)]
    assert fwd.scale.cpu().tolist() == want_fwd and bwd.scale.cpu().tolist() == want_bwd
    assert bwd.amax_history[-1].cpu().tolist() == [3.0, 0.5] and torch.all(bwd.amax_history[0] == 0)


def test_different_rules_update_separately(update_calls):
    """A deferred update under another margin cannot share the launch: it runs first, alone."""
    bwd_recipe, fwd_recipe = DelayedScaling(margin=2), DelayedScaling(margin=0)
    fwd = DelayedScalingState(1, fwd_recipe, forward=True, device="cpu")
    bwd = DelayedScalingState(1, bwd_recipe, forward=False, device="cpu")
    bwd.amax_history[0, 0] = 4.0
    manager.add_backward_state(bwd)
    manager.update_backward_states(bwd_recipe)
    with fp8_autocast(fp8_recipe=fwd_recipe):
        fwd.amax_history[0, 0] = 4.0
        manager.add_forward_state(fwd)
    assert [len(groups) for groups in update_calls] == [1, 1]
    assert bwd.scale.item() == expected_scale(4.0, 57344.0, 2)
    assert fwd.scale.item() == expected_scale(4.0, 448.0, 0)


def test_callable_recipes_update_at_once():
    algo = lambda history: history.amax(dim=0)  # noqa: E731
    recipe = DelayedScaling(amax_compute_algo=algo)
    bwd = DelayedScalingState(1, recipe, forward=False, device="cpu")
    bwd.amax_history[0, 0] = 8.0
    manager.add_backward_state(bwd)
    manager.update_backward_states(recipe)
    assert bwd.scale.item() == expected_scale(8.0, 57344.0, 0)


def test_reset_drops_a_deferred_update():
    recipe = DelayedScaling()
    bwd = DelayedScalingState(1, recipe, forward=False, device="cpu")
    bwd.amax_history[0, 0] = 8.0
    manager.add_backward_state(bwd)
    manager.update_backward_states(recipe)
    manager.reset()
    manager.flush_deferred_backward_update()
    assert bwd.scale.item() == 1.0


class Stack(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.lin = te.Linear(64, 64, params_dtype=torch.float32, device=device)
        self.mlp = te.LayerNormMLP(64, 128, params_dtype=torch.float32, device=device)

    def forward(self, x):
        return self.mlp(self.lin(x))


def make_stack(device):
    torch.manual_seed(11)
    return Stack(device)


def snapshot(model, x, out):
    """What a step leaves behind: output, input and parameter gradients, FP8 metadata."""
    record = [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()]
    for m in (model.lin, model.mlp):
        for state in (m._fwd_state, m._bwd_state):
            record += [t.clone() for t in state.state_tensors().values()]
    return record


def run_pattern(pattern: str, device, transformer_engine_order: bool):
    """Three rounds of ``pattern`` on a fresh model; with ``transformer_engine_order`` the
    backward update is applied right after each backward, where Transformer Engine runs it."""
    model = make_stack(device)
    recipe = DelayedScaling(amax_history_len=3)
    gen = torch.Generator().manual_seed(5)

    def data(scale):
        x = (torch.randn(32, 64, generator=gen) * scale).to(device).requires_grad_()
        return x, (torch.randn(32, 64, generator=gen) * scale).to(device)

    def backward(out, grad):
        out.backward(grad)
        if transformer_engine_order:
            manager.flush_deferred_backward_update()

    records = []
    for round_ in range(3):
        scale = (1.0, 8.0, 0.25)[round_]
        if pattern == "steps":
            x, g = data(scale)
            with fp8_autocast(fp8_recipe=recipe):
                out = model(x)
            backward(out, g)
            records.append(snapshot(model, x, out))
        elif pattern == "two_forwards_then_two_backwards":  # pipeline-style micro-batches
            (x1, g1), (x2, g2) = data(scale), data(2 * scale)
            with fp8_autocast(fp8_recipe=recipe):
                out1 = model(x1)
            with fp8_autocast(fp8_recipe=recipe):
                out2 = model(x2)
            backward(out1, g1)
            backward(out2, g2)
            records.append(snapshot(model, x2, out2) + [x1.grad.clone()])
        elif pattern == "backward_inside_autocast":
            x, g = data(scale)
            with fp8_autocast(fp8_recipe=recipe):
                out = model(x)
                backward(out, g)
            records.append(snapshot(model, x, out))
        model.zero_grad(set_to_none=True)
    manager.flush_deferred_backward_update()
    return records


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pattern", ["steps", "two_forwards_then_two_backwards", "backward_inside_autocast"])
def test_deferred_update_gives_transformer_engines_results(device, pattern):
    want = run_pattern(pattern, device, transformer_engine_order=True)
    manager.reset()
    got = run_pattern(pattern, device, transformer_engine_order=False)
    assert len(got) == len(want)
    for step, (g_rec, w_rec) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g_rec, w_rec)):
            assert torch.equal(a, b), f"round {step}, item {i}"


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_mid_training_carries_the_deferred_update(device):
    """state_dict right after a backward holds the updated backward scales, so a model
    loaded from it continues exactly as the original does."""
    recipe = DelayedScaling(amax_history_len=2)
    model, copy = make_stack(device), make_stack(device)
    x = torch.randn(32, 64, device=device)
    with fp8_autocast(fp8_recipe=recipe):
        out = model(x)
    out.backward(torch.randn_like(out) * 4)
    assert manager._deferred_backward, "the backward update waits"
    saved = model.state_dict()
    assert not manager._deferred_backward
    bwd_scale = model.lin._bwd_state.scale
    assert bwd_scale[0].item() != 1.0 and torch.equal(saved["lin._extra_state"]["bwd"]["scale"], bwd_scale)
    copy.load_state_dict(saved)
    outs = []
    for m in (model, copy):
        xx = x.clone().requires_grad_()
        with fp8_autocast(fp8_recipe=recipe):
            y = m(xx)
        y.backward(torch.ones_like(y))
        outs.append((y.detach(), xx.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("device", DEVICES)
def test_one_update_launch_a_training_step(device, update_calls):
    model = make_stack(device)
    recipe = DelayedScaling()
    for step in range(3):
        update_calls.clear()
        x = torch.randn(32, 64, device=device, requires_grad=True)
        with fp8_autocast(fp8_recipe=recipe):
            out = model(x)
        out.sum().backward()
        # Step 0 has no deferred backward update yet; later steps' exits carry the last one's.
        assert len(update_calls) == 1
        assert len(update_calls[0]) == (2 if step == 0 else 4)


def test_no_deferral_while_a_graph_is_captured(monkeypatch, update_calls):
    """Inside a capture the backward update runs at once (captured, so each replay makes
    it), and an eager step's waiting update is not put into the graph (each replay would
    repeat it on top of the captured one)."""
    from transformer_engine.pytorch import fp8

    recipe = DelayedScaling()
    eager_left = DelayedScalingState(1, recipe, forward=False, device="cpu")
    manager.add_backward_state(eager_left)
    manager.update_backward_states(recipe)
    assert manager._deferred_backward == [eager_left]
    monkeypatch.setattr(fp8, "_capturing", lambda: True)
    captured = DelayedScalingState(1, recipe, forward=False, device="cpu")
    manager.add_backward_state(captured)
    manager.update_backward_states(recipe)
    assert [len(groups) for groups in update_calls] == [1], "the captured backward's update, at once"
    assert update_calls[0][0][0] == captured.amax_history.data_ptr()
    with fp8_autocast(fp8_recipe=recipe):
        pass
    assert len(update_calls) == 1 and not manager._deferred_backward


@requires_cuda
def test_a_captured_step_keeps_its_backward_update():
    """torch.cuda.graph of a whole FP8 step: each replay makes the forward and the backward
    update, and matches the eager steps of a twin bit for bit."""
    recipe = DelayedScaling(amax_history_len=3)
    graphed, eager = make_stack("cuda"), make_stack("cuda")
    gen = torch.Generator().manual_seed(9)
    xs = [(torch.randn(32, 64, generator=gen) * s).cuda() for s in (1.0, 4.0, 0.5, 2.0)]
    gs = [(torch.randn(32, 64, generator=gen) * s).cuda() for s in (0.5, 8.0, 1.0, 3.0)]
    static_x, static_g = xs[0].clone().requires_grad_(), gs[0].clone()

    def step(model, x, g):
        with fp8_autocast(fp8_recipe=recipe):
            y = model(x)
        y.backward(g)
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph asks
        step(graphed, static_x, static_g)
    torch.cuda.current_stream().wait_stream(side)
    step(eager, xs[0].clone().requires_grad_(), gs[0])
    # Both updates now: one still waiting would be left out of the capture (dropped).
    manager.flush_deferred_backward_update()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = step(graphed, static_x, static_g)
    for x, g in zip(xs[1:], gs[1:]):
        with torch.no_grad():
            static_x.copy_(x)
            static_g.copy_(g)
        graph.replay()
        y = step(eager, x.clone().requires_grad_(), g)
        assert torch.equal(static_y, y)
        for m_graphed, m_eager in ((graphed.lin, eager.lin), (graphed.mlp, eager.mlp)):
            for a, b in ((m_graphed._fwd_state, m_eager._fwd_state), (m_graphed._bwd_state, m_eager._bwd_state)):
                for t_graphed, t_eager in zip(a.state_tensors().values(), b.state_tensors().values()):
                    assert torch.equal(t_graphed, t_eager)
