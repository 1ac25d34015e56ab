"""te.make_graphed_callables: graphed modules against eager twins (outputs, every gradient
and the delayed-scaling metadata over several steps, bit for bit), FP8 updates at replay,
the eval fallback, keyword arguments, and the argument errors (those run without a GPU)."""

import copy
import gc

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format
from transformer_engine.pytorch.cpp_extensions import module_ops

RECIPES = {"no_fp8": None, "delayed": DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=4),
           "current": Float8CurrentScaling()}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def needs_fp8(recipe):
    if recipe is not None and not te.is_fp8_available():
        pytest.skip("FP8 needs compute capability 8.9 or newer")


def train_step(module, x, dy, recipe):
    """One step inside fp8_autocast; returns (y, dx) as copies (a graph's outputs are
    overwritten by its next replay)."""
    x = x.detach().clone().requires_grad_()
    with te.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
        y = module(x)
    y.backward(dy)
    return y.detach().clone(), x.grad.clone()


def assert_same_training(eager, graphed, graphed_module, steps, shape_in, shape_out, dtype, recipe):
    gen = torch.Generator().manual_seed(7)
    for _ in range(steps):
        x = torch.randn(shape_in, generator=gen).to("cuda", dtype)
        dy = torch.randn(shape_out, generator=gen).to("cuda", dtype)
        y_ref, dx_ref = train_step(eager, x, dy, recipe)
        y, dx = train_step(graphed, x, dy, recipe)
        torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
        torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)
    for (name, p_ref), p in zip(eager.named_parameters(), graphed_module.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=0, atol=0, msg=lambda m: f"{name}.grad: {m}")
    for m_ref, m in zip(eager.modules(), graphed_module.modules()):
        for attr in ("_fwd_state", "_bwd_state"):
            ref_state, state = getattr(m_ref, attr, None), getattr(m, attr, None)
            if ref_state is None:
                continue
            for key, value in ref_state.state_tensors().items():
                torch.testing.assert_close(state.state_tensors()[key], value, rtol=0, atol=0,
                                           msg=lambda msg: f"{attr} {key}: {msg}")


@requires_cuda
@pytest.mark.parametrize("recipe", list(RECIPES.values()), ids=list(RECIPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graphed_linear_trains_as_eager(recipe, dtype):
    needs_fp8(recipe)
    torch.manual_seed(0)
    module = te.Linear(64, 32, params_dtype=dtype)
    with torch.no_grad():
        module.bias.normal_()
    eager = copy.deepcopy(module)
    sample = torch.randn(16, 64, device="cuda", dtype=dtype, requires_grad=True)
    graphed = te.make_graphed_callables(module, (sample,), fp8_enabled=recipe is not None, fp8_recipe=recipe)
    assert all(p.grad is None for p in module.parameters()), "warm-up must not leave gradients"
    assert_same_training(eager, graphed, module, 4, (16, 64), (16, 32), dtype, recipe)


@requires_cuda
@pytest.mark.parametrize("recipe", [RECIPES["delayed"], RECIPES["current"]], ids=["delayed", "current"])
def test_graphed_chain_of_modules(recipe):
    """Two callables, captured and replayed as a chain: LayerNormMLP then LayerNormLinear
    (forwards in order, backwards in reverse, one memory pool)."""
    needs_fp8(recipe)
    torch.manual_seed(1)
    mlp = te.LayerNormMLP(64, 128, params_dtype=torch.bfloat16)
    proj = te.LayerNormLinear(64, 48, params_dtype=torch.bfloat16)
    eager = torch.nn.Sequential(copy.deepcopy(mlp), copy.deepcopy(proj))
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    h = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed_mlp, graphed_proj = te.make_graphed_callables((mlp, proj), ((x,), (h,)), fp8_enabled=True,
                                                          fp8_recipe=recipe)
    chain = torch.nn.Sequential(mlp, proj)  # their forwards now replay the graphs
    assert_same_training(eager, chain, chain, 3, (32, 64), (32, 48), torch.bfloat16, recipe)
    assert graphed_mlp is not None and graphed_proj is not None


@requires_cuda
def test_replay_runs_no_module_python(monkeypatch):
    """The graphed step does not go through the modules' core calls again."""
    module = te.Linear(32, 32)
    sample = torch.randn(16, 32, device="cuda", requires_grad=True)
    graphed = te.make_graphed_callables(module, (sample,))

    def refuse(*args, **kwargs):
        raise AssertionError("the module's GEMM ran eagerly")

    monkeypatch.setattr(module_ops, "gemm", refuse)
    y = graphed(torch.randn(16, 32, device="cuda", requires_grad=True))
    y.sum().backward()
    assert module.weight.grad is not None


@requires_cuda
def test_capture_survives_garbage_collection():
    """Graphs of an earlier module left in reference cycles, and the cyclic collector
    set to run at nearly every allocation: a collection during the next capture would
    destroy them there and invalidate it (as it did in the full test suite)."""
    sample = torch.randn(16, 32, device="cuda", requires_grad=True)
    te.make_graphed_callables(te.Linear(32, 32), (sample,))  # garbage once this returns
    thresholds = gc.get_threshold()
    gc.set_threshold(1)
    try:
        module = te.LayerNormLinear(32, 32)
        graphed = te.make_graphed_callables(module, (sample,))
    finally:
        gc.set_threshold(*thresholds)
    graphed(sample).sum().backward()
    assert module.weight.grad is not None


@requires_cuda
def test_eval_mode_runs_eagerly():
    """A module graphed in training mode runs its own forward in eval mode (any shape)."""
    module = te.Linear(32, 16)
    sample = torch.randn(8, 32, device="cuda", requires_grad=True)
    te.make_graphed_callables(module, (sample,))
    module.eval()
    x = torch.randn(5, 3, 32, device="cuda")  # not the captured shape
    with torch.no_grad():
        y = module(x)
        expected = x @ module.weight.t() + module.bias
    torch.testing.assert_close(y, expected, rtol=1.3e-6, atol=1e-5)


@requires_cuda
def test_replay_checks_its_arguments():
    module = te.Linear(32, 16)
    graphed = te.make_graphed_callables(module, (torch.randn(8, 32, device="cuda", requires_grad=True),))
    with pytest.raises(ValueError, match="argument 0 must match the captured tensor"):
        graphed(torch.randn(4, 32, device="cuda"))
    with pytest.raises(ValueError, match="argument 0 must match"):
        graphed(torch.randn(8, 32, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="captured with 1 argument"):
        graphed(torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda"))


@requires_cuda
def test_function_with_keyword_arguments():
    """A plain function, tensors passed by keyword; gradients reach both inputs."""
    def scaled_product(a, *, b):
        return a * b + 1.0

    a0 = torch.randn(4, 8, device="cuda", requires_grad=True)
    b0 = torch.randn(4, 8, device="cuda", requires_grad=True)
    graphed = te.make_graphed_callables(scaled_product, (a0,), sample_kwargs={"b": b0})
    a = torch.randn(4, 8, device="cuda", requires_grad=True)
    b = torch.randn(4, 8, device="cuda", requires_grad=True)
    out = graphed(a, b=b)
    torch.testing.assert_close(out, a * b + 1.0)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(a.grad, b.detach())
    torch.testing.assert_close(b.grad, a.detach())
    with pytest.raises(TypeError, match="keyword arguments"):
        graphed(a)


@requires_cuda
def test_fp8_state_kept_through_capture_and_updated_only_under_autocast():
    """Capturing leaves the FP8 metadata as it was; a replay outside fp8_autocast computes
    in FP8 but updates no scale, one inside updates them at its exit."""
    recipe = RECIPES["delayed"]
    needs_fp8(recipe)
    module = te.Linear(64, 64)
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    train_step(module, x, torch.randn(16, 64, device="cuda"), recipe)  # makes the states
    before = {k: v.clone() for k, v in module._fwd_state.state_tensors().items()}
    graphed = te.make_graphed_callables(module, (x,), fp8_enabled=True, fp8_recipe=recipe)
    for key, value in module._fwd_state.state_tensors().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)
    graphed(x).sum().backward()  # no autocast: no update
    torch.testing.assert_close(module._fwd_state.scale, before["scale"], rtol=0, atol=0)
    assert module._fwd_state.amax_history[0].abs().sum() > 0, "the captured casts raise the current amaxes"
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        y = graphed(x * 100.0)
    y.sum().backward()
    assert not torch.equal(module._fwd_state.scale, before["scale"]), "the autocast exit updates the scales"


# ---- argument errors: checked before anything touches a GPU ----

def test_unimplemented_options_are_named():
    module = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16)
    with pytest.raises(NotImplementedError, match="fp8_weight_caching"):
        te.make_graphed_callables(module, (x,), fp8_weight_caching=True)
    with pytest.raises(NotImplementedError, match="_order"):
        te.make_graphed_callables(module, (x,), _order=[1, -1])
    delayed = te.Linear(16, 16, device="cpu", delay_wgrad_compute=True)
    with pytest.raises(NotImplementedError, match="delay_wgrad_compute"):
        te.make_graphed_callables(delayed, (x,))


def test_bad_arguments():
    module = te.Linear(16, 16, device="cpu")
    x = torch.randn(16, 16)
    with pytest.raises(TypeError, match="sample_args\\[0\\] must be a tuple"):
        te.make_graphed_callables(module, x)
    with pytest.raises(TypeError, match="sample_args must be a tuple of 2"):
        te.make_graphed_callables((module, module), ((x,),))
    with pytest.raises(TypeError, match="must be a tuple \\(or a single item\\), got a list"):
        te.make_graphed_callables([module], ((x,),))
    with pytest.raises(ValueError, match="num_warmup_iters"):
        te.make_graphed_callables(module, (x,), num_warmup_iters=-1)
    with pytest.raises(TypeError, match="sample_kwargs\\[0\\] must be a dict"):
        te.make_graphed_callables(module, (x,), sample_kwargs=[1])
    with pytest.raises(TypeError, match="modules\\[0\\] is not callable"):
        te.make_graphed_callables(3, (x,))


def test_cpu_tensors_are_refused():
    """CUDA graphs need a GPU and CUDA tensors: a clear error either way."""
    module = te.Linear(16, 16, device="cpu")
    message = "is on cpu; CUDA graphs need CUDA tensors" if torch.cuda.is_available() else "need a CUDA device"
    with pytest.raises((RuntimeError, ValueError), match=message):
        te.make_graphed_callables(module, (torch.randn(16, 16),))
