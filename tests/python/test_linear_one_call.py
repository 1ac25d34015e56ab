"""te.Linear's one-call FP8 steps (cpp_extensions/linear_step.py, te_linear_fp8_fwd /
te_linear_fp8_bwd) against the step made of separate core calls, which a module takes
when is_first_microbatch is given (forward) and with delay_wgrad_compute (backward):
outputs, gradients and the delayed-scaling state must be the same bits over several
steps."""

import pytest
import torch
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, MMParams, QParams
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

# ==== Configurations no CUDA test ran before the forty-seventh session's audit =================
# fp16 parameters (the FP8 GEMMs with an fp16 D, the fp16 casts and bias-gradient cast), and
# current scaling with power-of-2 scales, an epsilon and the split-accumulator choices flipped.

def _current_pow2_flipped():
    q = QParams(power_2_scale=True, amax_epsilon=1e-3)
    return Float8CurrentScaling(fp8_quant_fwd_inp=q, fp8_quant_fwd_weight=q, fp8_quant_bwd_grad=q,
                                fp8_gemm_fprop=MMParams(True), fp8_gemm_dgrad=MMParams(False),
                                fp8_gemm_wgrad=MMParams(False))


RECIPES = {"delayed": lambda: DelayedScaling(amax_history_len=3), "current": Float8CurrentScaling,
           "current_pow2_flipped_split": _current_pow2_flipped}


def _steps(device, dtype, bias, recipe, one_call_counts):
    torch.manual_seed(11)
    modules = [te.Linear(48, 64, bias=bias, params_dtype=dtype, device=device, delay_wgrad_compute=deferred)
               for deferred in (False, True)]
    modules[1].load_state_dict(modules[0].state_dict())
    # One magnitude for all steps: delayed scaling's scales come from earlier steps' amaxes
    # (growing inputs would saturate, by design, and blur the accuracy check below).
    inputs = [torch.randn(32, 48, device=device).to(dtype).requires_grad_() for _ in range(3)]
    grads = [torch.randn(32, 64, device=device).to(dtype) for _ in range(3)]
    one_call = train(modules[0], inputs, grads, False, None, RECIPES[recipe]())
    assert one_call_counts == {"forward": 3, "backward": 3}
    separate = train(modules[1], inputs, grads, False, True, RECIPES[recipe]())
    assert one_call_counts == {"forward": 3, "backward": 3}
    return modules[0], inputs, grads, one_call, separate


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["delayed", "current"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_one_call_fp16_parameters(device, recipe, bias, one_call_counts):
    """fp16 parameters and activations: the one-call step gives the separate calls' bits,
    and is close to an fp32 nn.Linear (the FP8 bounds of test_linear.test_fp8_close_to_bf16)."""
    module, inputs, grads, one_call, separate = _steps(device, torch.float16, bias, recipe, one_call_counts)
    assert_same_bits(one_call, separate)
    ref = torch.nn.Linear(48, 64, bias=bias, device=device)
    with torch.no_grad():
        ref.weight.copy_(module.weight.float())
        if bias:
            ref.bias.copy_(module.bias.float())
    for i, (x, g) in enumerate(zip(inputs, grads)):
        xr = x.detach().float().requires_grad_()
        ref.zero_grad()
        y_ref = ref(xr)
        y_ref.backward(g.float())
        out, dx, dw = one_call[0]["out"][i], one_call[0]["dx"][i], one_call[0]["dw"][i]
        assert out.dtype == dx.dtype == dw.dtype == torch.float16
        rel = lambda a, b: ((a.float() - b).norm() / b.norm()).item()  # noqa: E731
        assert rel(out, y_ref.detach()) < 0.06
        assert rel(dx, xr.grad) < 0.10 and rel(dw, ref.weight.grad) < 0.10
        if bias:
            torch.testing.assert_close(one_call[0]["db"][i].float(), g.float().sum(0), rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_one_call_current_scaling_pow2_epsilon_and_flipped_split(device, dtype, one_call_counts):
    """Current scaling with power-of-2 scales, an amax epsilon and the split-accumulator
    choices flipped (the step's arguments every other test leaves at their defaults): the
    same bits as the separate calls."""
    _, _, _, one_call, separate = _steps(device, dtype, True, "current_pow2_flipped_split",
                                                   one_call_counts)
    assert_same_bits(one_call, separate)
