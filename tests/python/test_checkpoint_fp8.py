"""te.checkpoint under fp8_autocast: the recomputation in the backward must repeat the
forward's FP8 casts exactly.

With DelayedScaling the scales a forward casts with are updated when the outermost
fp8_autocast exits, before the backward runs: the recomputation must cast with the scales
the forward used (saved while it ran), record no amax a second time and trigger no scale
update of its own. So a model wrapped in te.checkpoint must give, step after step while
the amaxes and scales move (the input's magnitude changes every step), the same outputs,
gradients, amax histories and scales as the same model without checkpoint, bit for bit.
Current scaling takes its scales from the data: the same must hold with nothing saved.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling
from transformer_engine.pytorch import fp8_recompute
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

HIDDEN, FFN, HEADS = 64, 128, 4
SEQ, BATCH = 16, 2
RECIPES = {"delayed": lambda: DelayedScaling(amax_history_len=4), "current": Float8CurrentScaling}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


class Stack(torch.nn.Module):
    """te.Linear -> te.LayerNormLinear -> te.LayerNormMLP -> te.TransformerLayer. ``how``
    says where te.checkpoint goes: "none"; "whole" (one checkpoint around everything, the
    first FP8 module of the autocast inside); "each" (one per module); "after_first" (the
    first module outside, the rest in one checkpoint)."""

    def __init__(self, device, how="none", dropout=0.0, tracker=None, **ckpt_kwargs):
        super().__init__()
        kw = dict(params_dtype=torch.bfloat16, device=device)
        self.lin = te.Linear(HIDDEN, HIDDEN, **kw)
        self.lnl = te.LayerNormLinear(HIDDEN, HIDDEN, **kw)
        self.mlp = te.LayerNormMLP(HIDDEN, FFN, **kw)
        self.layer = te.TransformerLayer(HIDDEN, FFN, HEADS, hidden_dropout=dropout, attention_dropout=dropout,
                                         get_rng_state_tracker=(lambda: tracker) if tracker is not None else None,
                                         **kw)
        self.how = how
        self.tracker = tracker
        self.ckpt_kwargs = ckpt_kwargs

    def _ckpt(self, fn, x):
        if self.tracker is not None:
            return te.checkpoint(fn, x, get_rng_state_tracker=lambda: self.tracker, **self.ckpt_kwargs)
        return te.checkpoint(fn, x, **self.ckpt_kwargs)

    def _rest(self, x):
        return self.layer(self.mlp(self.lnl(x)))

    def _all(self, x):
        return self._rest(self.lin(x))

    def forward(self, x):
        if self.how == "none":
            return self._all(x)
        if self.how == "whole":
            return self._ckpt(self._all, x)
        if self.how == "after_first":
            return self._ckpt(self._rest, self.lin(x))
        for m in (self.lin, self.lnl, self.mlp, self.layer):
            x = self._ckpt(m, x)
        return x


def te_modules(model):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, TransformerEngineBaseModule)]


def fp8_meta(model):
    """Every TE module's amax histories and scales, cloned."""
    meta = {}
    for name, m in te_modules(model):
        for direction, state in (("fwd", m._fwd_state), ("bwd", m._bwd_state)):
            if state is not None:
                for key, t in state.state_tensors().items():
                    meta[f"{name}.{direction}.{key}"] = t.clone()
    return meta


def assert_same_meta(got, want, when):
    assert got.keys() == want.keys(), when
    for key in want:
        assert torch.equal(got[key], want[key]), f"{when}: {key} differs"


def make_pair(device, how, dropout=0.0, seed=7, **ckpt_kwargs):
    """The same model twice (same weights): plain, and checkpointed as ``how`` says."""
    trackers = []
    models = []
    for variant in ("none", how):
        tracker = None
        if dropout:
            tracker = te.CudaRNGStatesTracker()
            tracker.add("model-parallel-rng", 1234)
        trackers.append(tracker)
        torch.manual_seed(seed)
        models.append(Stack(device, variant, dropout, tracker, **ckpt_kwargs))
    models[1].load_state_dict(models[0].state_dict())
    return models


def train_step(model, x, g, recipe, device):
    """One step: forward in fp8_autocast, backward after it exits (the delayed scales have
    moved on by then). Returns (output, input gradient, parameter gradients)."""
    torch.manual_seed(99)  # the dropout masks: the same draws for both models
    if device == "cuda":
        torch.cuda.manual_seed(99)
    xx = x.clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        out = model(xx)
    out.backward(g)
    return out.detach(), xx.grad, {n: p.grad for n, p in model.named_parameters()}


def check_steps(device, recipe_name, plain, ckpt, steps=3):
    for i in range(steps):
        # Growing magnitudes: every step's amaxes exceed the last ones, so the scales that
        # the autocast exit writes differ from those the forward cast with.
        x = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, device=device) * (1 + 3 * i)
        g = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, device=device) * (1 + 2 * i)
        want = train_step(plain, x, g, RECIPES[recipe_name](), device)
        got = train_step(ckpt, x, g, RECIPES[recipe_name](), device)
        assert torch.equal(got[0], want[0]), f"step {i}: outputs differ"
        assert torch.equal(got[1], want[1]), f"step {i}: input gradients differ"
        assert got[2].keys() == want[2].keys()
        for name in want[2]:
            a, b = got[2][name], want[2][name]
            assert (a is None) == (b is None), name
            assert a is None or torch.equal(a, b), f"step {i}: the gradient of {name} differs"
        assert_same_meta(fp8_meta(ckpt), fp8_meta(plain), f"after step {i}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("how", ["whole", "each", "after_first"])
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_stack_equals_plain(device, recipe_name, how, use_reentrant):
    plain, ckpt = make_pair(device, how, use_reentrant=use_reentrant)
    check_steps(device, recipe_name, plain, ckpt)
    if recipe_name == "delayed":  # the scales did move: the test can tell them apart
        scale = plain.lin._fwd_state.scale
        assert not torch.equal(scale, torch.ones_like(scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe_name", RECIPES)
def test_distribute_saved_activations(device, recipe_name):
    # A tensor-parallel group of one rank: nothing to distribute, the same results.
    plain, ckpt = make_pair(device, "whole", distribute_saved_activations=True)
    check_steps(device, recipe_name, plain, ckpt, steps=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_dropout_with_rng_tracker(device, use_reentrant):
    plain, ckpt = make_pair(device, "whole", dropout=0.25, use_reentrant=use_reentrant)
    check_steps(device, "delayed", plain, ckpt, steps=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_recompute_casts_with_the_forward_scales(device, use_reentrant):
    """One te.Linear: its scales change at the autocast exit (the forward's amax is far from
    the initial scale of 1); the recomputation must use the forward's scale anyway. With
    the updated scale the FP8 copy of the input differs, and so does the weight gradient."""
    torch.manual_seed(3)
    plain = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device=device)
    ckpt = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device=device)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(32, HIDDEN, dtype=torch.bfloat16, device=device) * 37.0
    g = torch.randn(32, HIDDEN, dtype=torch.bfloat16, device=device)
    grads = []
    for model, checkpointed in ((plain, False), (ckpt, True)):
        xx = x.clone().requires_grad_()
        with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=2)):
            out = te.checkpoint(model, xx, use_reentrant=use_reentrant) if checkpointed else model(xx)
        after_exit = model._fwd_state.scale.clone()
        assert not torch.equal(after_exit, torch.ones_like(after_exit))  # the exit did update them
        history = model._fwd_state.amax_history.clone()
        out.backward(g)
        # The recomputation recorded no amax (row 0 is the next step's, still zero) and
        # updated no scale.
        assert torch.equal(model._fwd_state.amax_history, history)
        assert torch.equal(model._fwd_state.scale, after_exit)
        grads.append((xx.grad, model.weight.grad))
    assert torch.equal(grads[0][0], grads[1][0])
    assert torch.equal(grads[0][1], grads[1][1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_autocast_inside_the_checkpointed_function(device, use_reentrant):
    """The function opens the autocast itself (checkpoint called outside it): the forward's
    autocast exit updates the scales inside the checkpointed forward; the recomputation's
    autocast must cast with the forward's scales and update nothing."""
    torch.manual_seed(5)
    models = [te.LayerNormLinear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device=device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())

    def in_autocast(model):
        def fn(x):
            with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=3)):
                return model(x)
        return fn

    for i in range(3):
        x = torch.randn(32, HIDDEN, dtype=torch.bfloat16, device=device) * (2 + 5 * i)
        g = torch.randn(32, HIDDEN, dtype=torch.bfloat16, device=device)
        results = []
        for model, checkpointed in ((models[0], False), (models[1], True)):
            model.zero_grad(set_to_none=True)
            xx = x.clone().requires_grad_()
            fn = in_autocast(model)
            out = te.checkpoint(fn, xx, use_reentrant=use_reentrant) if checkpointed else fn(xx)
            out.backward(g)
            results.append((out.detach(), xx.grad, model.weight.grad, model.layer_norm_weight.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b)
        for a, b in zip(models[0]._fwd_state.state_tensors().values(), models[1]._fwd_state.state_tensors().values()):
            assert torch.equal(a, b)
        for a, b in zip(models[0]._bwd_state.state_tensors().values(), models[1]._bwd_state.state_tensors().values()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_nested_checkpoints(device):
    """A checkpoint inside a checkpointed function: the outer recomputation runs the inner
    checkpoint's forward again, which must see (and save for its own recomputation) the
    scales of the original forward."""
    plain, ckpt = make_pair(device, "none")

    def inner(x):
        return ckpt.mlp(ckpt.lnl(x))

    def outer(x):
        return ckpt.layer(te.checkpoint(inner, ckpt.lin(x)))

    ckpt.forward = lambda x: te.checkpoint(outer, x)
    check_steps(device, "delayed", plain, ckpt)


@pytest.mark.parametrize("device", DEVICES)
def test_module_called_twice_in_one_checkpoint(device):
    """A module run twice in the checkpointed function (weights shared): each call is
    recomputed with the scales it had (the same within one step) and records nothing."""
    torch.manual_seed(11)
    models = [te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device=device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for i in range(3):
        x = torch.randn(16, HIDDEN, dtype=torch.bfloat16, device=device) * (1 + 4 * i)
        results = []
        for model, checkpointed in ((models[0], False), (models[1], True)):
            model.zero_grad(set_to_none=True)
            xx = x.clone().requires_grad_()

            def twice(t, model=model):
                return model(torch.tanh(model(t)))

            with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=3)):
                out = te.checkpoint(twice, xx) if checkpointed else twice(xx)
            out.sum().backward()
            results.append((xx.grad, model.weight.grad, model.bias.grad))
        for a, b in zip(*results):
            assert torch.equal(a, b)
        for a, b in zip(models[0]._fwd_state.state_tensors().values(), models[1]._fwd_state.state_tensors().values()):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_layernorm_mlp_own_checkpoint_inside_te_checkpoint(device):
    """LayerNormMLP(checkpoint=True) recomputes once more in its own backward, from the
    scales of the (re)computed forward: the same results as the plain module."""
    torch.manual_seed(13)
    plain = te.LayerNormMLP(HIDDEN, FFN, params_dtype=torch.bfloat16, device=device)
    ckpt = te.LayerNormMLP(HIDDEN, FFN, params_dtype=torch.bfloat16, device=device, checkpoint=True)
    ckpt.load_state_dict(plain.state_dict())
    for i in range(3):
        x = torch.randn(32, HIDDEN, dtype=torch.bfloat16, device=device) * (1 + 3 * i)
        g = torch.randn(32, HIDDEN, dtype=torch.bfloat16, device=device)
        results = []
        for model, checkpointed in ((plain, False), (ckpt, True)):
            model.zero_grad(set_to_none=True)
            xx = x.clone().requires_grad_()
            with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=3)):
                out = te.checkpoint(model, xx) if checkpointed else model(xx)
            out.backward(g)
            results.append([out.detach(), xx.grad] + [p.grad for p in model.parameters()])
        for a, b in zip(*results):
            assert torch.equal(a, b)
        for state in ("_fwd_state", "_bwd_state"):
            for a, b in zip(getattr(plain, state).state_tensors().values(),
                            getattr(ckpt, state).state_tensors().values()):
                assert torch.equal(a, b)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_frames_are_open_only_while_the_function_runs(use_reentrant):
    """Recording while the checkpointed forward runs, replaying while it is recomputed,
    nothing before, between and after (modules outside te.checkpoint use their state)."""
    torch.manual_seed(17)
    model = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device="cpu")
    seen = []

    def fn(t):
        seen.append([frame.replaying for frame in fp8_recompute.FRAMES])
        return torch.tanh(model(t))

    x = torch.randn(16, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        out = te.checkpoint(fn, x, use_reentrant=use_reentrant)
        assert fp8_recompute.FRAMES == []
    out.sum().backward()
    assert fp8_recompute.FRAMES == []
    assert seen == [[False], [True]]


@pytest.mark.parametrize("device", DEVICES)
def test_second_backward_recomputes_the_same(device):
    """retain_graph: a second backward recomputes again with the same kept scales (replaying
    consumes nothing). With the backward state put back as the first backward found it
    (that backward updated its scales), the gradients double exactly. (Reentrant only: the
    non-reentrant form backpropagates through the original modules' nodes, which free what
    they saved at their first backward, with or without checkpoint.)"""
    torch.manual_seed(19)
    model = te.LayerNormLinear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device=device)
    x = torch.randn(32, HIDDEN, dtype=torch.float32, device=device, requires_grad=True)

    def fn(t):
        return torch.nn.functional.gelu(model(t))

    with te.fp8_autocast(fp8_recipe=DelayedScaling(amax_history_len=2)):
        out = te.checkpoint(fn, x)
    bwd_before = {k: v.clone() for k, v in model._bwd_state.state_tensors().items()}
    fwd_before = {k: v.clone() for k, v in model._fwd_state.state_tensors().items()}
    out.sum().backward(retain_graph=True)
    first = (x.grad.clone(), model.weight.grad.clone())
    for key, t in model._bwd_state.state_tensors().items():
        t.copy_(bwd_before[key])
    out.sum().backward()
    for key, t in model._fwd_state.state_tensors().items():
        assert torch.equal(t, fwd_before[key]), key
    assert torch.equal(x.grad, 2 * first[0])
    assert torch.equal(model.weight.grad, 2 * first[1])


def test_non_reentrant_recomputes_at_every_backward():
    """torch enters the recompute context at each recomputation: a second backward
    (retain_graph) must find it usable again."""
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    out = te.checkpoint(lambda t: torch.tanh(t @ w), x, use_reentrant=False)
    out.sum().backward(retain_graph=True)
    first = w.grad.clone()
    out.sum().backward()
    assert torch.equal(w.grad, 2 * first)


def test_recompute_running_more_modules_than_the_forward_raises():
    torch.manual_seed(23)
    model = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device="cpu")
    calls = []

    def fn(t):
        calls.append(1)
        return model(t) if len(calls) == 1 else model(model(t))  # the recomputation runs it twice

    x = torch.randn(16, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        out = te.checkpoint(fn, x)
    with pytest.raises(RuntimeError, match=r"runs Linear more often \(2 times\) than the checkpointed forward did"):
        out.sum().backward()
    # The failed recomputation closed its frame: the next step runs as usual.
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        model(x).sum().backward()
    assert model._fwd_state.amax_history[-1].abs().sum() > 0


def test_autocast_in_the_recomputation_updates_no_waiting_state():
    """Forward states registered for the update of an autocast still open elsewhere (here
    registered by hand) are not updated by the exit of an autocast that a recomputation
    opens: that autocast repeats one whose update was done."""
    torch.manual_seed(29)
    model = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device="cpu")
    waiting = te.Linear(HIDDEN, HIDDEN, params_dtype=torch.bfloat16, device="cpu")
    x = torch.randn(16, HIDDEN, dtype=torch.bfloat16, requires_grad=True)

    def fn(t):
        with te.fp8_autocast(fp8_recipe=DelayedScaling()):
            return model(t)

    out = te.checkpoint(fn, x)
    with te.fp8_autocast(fp8_recipe=DelayedScaling()):
        waiting(x * 50)
        FP8GlobalStateManager.FP8_AUTOCAST_DEPTH -= 1  # the backward below runs "outside" it
        try:
            history = waiting._fwd_state.amax_history.clone()
            out.sum().backward()
            assert torch.equal(waiting._fwd_state.amax_history, history)  # not rolled
            assert torch.equal(waiting._fwd_state.scale, torch.ones_like(waiting._fwd_state.scale))
        finally:
            FP8GlobalStateManager.FP8_AUTOCAST_DEPTH += 1
    # Its own exit updates it.
    assert not torch.equal(waiting._fwd_state.scale, torch.ones_like(waiting._fwd_state.scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_calibration_records_each_amax_once(device, use_reentrant):
    """Calibrating (high precision, amaxes recorded): the recomputation records nothing, so
    the histories equal the plain model's."""
    plain, ckpt = make_pair(device, "whole", use_reentrant=use_reentrant)
    for i in range(2):
        x = torch.randn(SEQ, BATCH, HIDDEN, dtype=torch.bfloat16, device=device) * (1 + 3 * i)
        for model in (plain, ckpt):
            xx = x.clone().requires_grad_()
            with te.fp8_autocast(enabled=False, calibrating=True, fp8_recipe=DelayedScaling(amax_history_len=4)):
                out = model(xx)
            out.float().sum().backward()
        assert_same_meta(fp8_meta(ckpt), fp8_meta(plain), f"after step {i}")
    assert plain.lin._fwd_state.amax_history.abs().sum() > 0
