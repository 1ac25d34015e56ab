"""te.Linear's one-call FP8 steps (cpp_extensions/linear_step.py, te_linear_fp8_fwd /
te_linear_fp8_bwd) against the step made of separate core calls, which a module takes
when is_first_microbatch is given (forward) and with delay_wgrad_compute (backward):
outputs, gradients and the delayed-scaling state must be the same bits over several
steps."""

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling
from transformer_engine.pytorch.cpp_extensions import linear_step
from transformer_engine.pytorch.module import linear as linear_module

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]
RECIPES = {"delayed": lambda: DelayedScaling(amax_history_len=3), "current": Float8CurrentScaling}


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


@pytest.fixture
def one_call_counts(monkeypatch):
    """How many forwards and backwards went through the one-call path."""
    counts = {"forward": 0, "backward": 0}

    def counted(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(linear_module, "linear_fp8_forward", counted("forward", linear_step.linear_fp8_forward))
    monkeypatch.setattr(linear_module, "linear_fp8_backward", counted("backward", linear_step.linear_fp8_backward))
    return counts


def train(module, inputs, grads, autocast, is_first_microbatch, recipe):
    """(outputs, input grads, weight grads, bias grads, final state) of one step per
    input; a module with delay_wgrad_compute gets its weight gradient at once."""
    results = {"out": [], "dx": [], "dw": [], "db": []}
    device = inputs[0].device.type
    for x, grad in zip(inputs, grads):
        x = x.detach().requires_grad_(x.requires_grad)
        module.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            with te.fp8_autocast(fp8_recipe=recipe):
                y = module(x, is_first_microbatch=is_first_microbatch)
        y.backward(grad.to(y.dtype))
        module.backward_dw()
        results["out"].append(y.detach())
        results["dx"].append(x.grad)
        results["dw"].append(module.weight.grad)
        results["db"].append(module.bias.grad if module.use_bias else None)
    extra = module.get_extra_state()
    return results, extra


def assert_same_bits(a, b):
    for key in a[0]:
        for got, want in zip(a[0][key], b[0][key]):
            if want is None:
                assert got is None, key
            else:
                assert got.dtype == want.dtype and torch.equal(got, want), key
    assert a[1].keys() == b[1].keys()
    for direction in b[1]:
        for name, tensor in b[1][direction].items():
            assert torch.equal(a[1][direction][name], tensor), (direction, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("case", ["fp32", "bf16", "fp32_under_bf16_autocast", "no_bias", "3d_input",
                                  "input_without_grad", "frozen_weight", "no_rows"])
def test_one_call_step_equals_separate_calls(device, recipe, case, one_call_counts):
    torch.manual_seed(1)
    dtype = torch.bfloat16 if case == "bf16" else torch.float32
    autocast = case == "fp32_under_bf16_autocast"
    shape = (2, 16, 48) if case == "3d_input" else (0, 48) if case == "no_rows" else (32, 48)
    modules = [te.Linear(48, 64, bias=case != "no_bias", params_dtype=dtype, device=device,
                         delay_wgrad_compute=deferred) for deferred in (False, True, True)]
    for m in modules[1:]:
        m.load_state_dict(modules[0].state_dict())
    if case == "frozen_weight":
        for m in modules:
            m.weight.requires_grad_(False)
    inputs = [torch.randn(*shape, device=device, dtype=dtype) * (i + 1) for i in range(4)]
    for x in inputs:
        x.requires_grad_(case != "input_without_grad")
    grads = [torch.randn(*shape[:-1], 64, device=device) for _ in range(4)]

    one_call = train(modules[0], inputs, grads, autocast, None, RECIPES[recipe]())
    assert one_call_counts == {"forward": 4, "backward": 4}
    separate = train(modules[1], inputs, grads, autocast, True, RECIPES[recipe]())
    assert one_call_counts == {"forward": 4, "backward": 4}
    assert_same_bits(one_call, separate)
    # The one-call forward's saved copies read by the backward of separate calls (as views).
    mixed = train(modules[2], inputs, grads, autocast, None, RECIPES[recipe]())
    assert one_call_counts == {"forward": 8, "backward": 4}
    assert_same_bits(mixed, separate)


@pytest.mark.parametrize("device", DEVICES)
def test_one_call_is_not_taken_where_it_does_not_apply(device, one_call_counts):
    """Weight-gradient accumulation into main_grad, a deferred wgrad and an FP8 input
    gradient keep the backward of separate calls (the first two the one-call forward;
    fp8_grad, like fp8_output, the forward's separate calls too)."""
    torch.manual_seed(2)
    x = torch.randn(32, 48, device=device, requires_grad=True)
    accumulating = te.Linear(48, 64, fuse_wgrad_accumulation=True, device=device)
    accumulating.weight.main_grad = torch.zeros(64, 48, device=device)
    deferring = te.Linear(48, 64, delay_wgrad_compute=True, device=device)
    fp8_grad = te.Linear(48, 64, device=device)
    for module, kwargs in ((accumulating, {}), (deferring, {}), (fp8_grad, {"fp8_grad": True})):
        with te.fp8_autocast(fp8_recipe=DelayedScaling()):
            y = module(x, **kwargs)
        y.sum().backward()
    deferring.backward_dw()
    assert one_call_counts == {"forward": 2, "backward": 0}
    # Current scaling with another epsilon for the weight than for the input: two
    # casts, the forward of separate calls (the backward's one cast takes the one call).
    recipe = Float8CurrentScaling()
    recipe.fp8_quant_fwd_weight = type(recipe.fp8_quant_fwd_weight)(power_2_scale=False, amax_epsilon=1e-3)
    with te.fp8_autocast(fp8_recipe=recipe):
        y = fp8_grad(x)
    y.sum().backward()
    assert one_call_counts == {"forward": 2, "backward": 1}
    assert accumulating.weight.main_grad.abs().sum() > 0 and deferring.weight.grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_one_call_refuses_fp8_dims_as_the_separate_calls_do(device):
    module = te.Linear(48, 64, device=device)
    with pytest.raises(ValueError, match="divisible by 16"):
        with te.fp8_autocast():
            module(torch.randn(24, 48, device=device))
