"""fp8_autocast / fp8_model_init state, and the delayed-scaling updates the manager runs
at the outermost autocast exit, against scales worked out here step by step."""

import numpy as np
import pytest
import torch
from conftest import requires_cuda

from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format, MXFP8BlockScaling
from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.fp8 import (
    DelayedScalingState,
    FP8GlobalStateManager,
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_fp8_max,
    get_fp8_te_dtype,
)

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def test_autocast_sets_and_restores_state():
    r = DelayedScaling(amax_history_len=4)
    assert not FP8GlobalStateManager.is_fp8_enabled()
    with fp8_autocast(enabled=True, fp8_recipe=r):
        assert FP8GlobalStateManager.is_fp8_enabled() and FP8GlobalStateManager.get_fp8_recipe() is r
        with fp8_autocast(enabled=False):
            assert not FP8GlobalStateManager.is_fp8_enabled()
        assert FP8GlobalStateManager.is_fp8_enabled() and FP8GlobalStateManager.FP8_AUTOCAST_DEPTH == 1
    assert not FP8GlobalStateManager.is_fp8_enabled() and FP8GlobalStateManager.FP8_AUTOCAST_DEPTH == 0


def test_autocast_restores_state_after_an_exception():
    with pytest.raises(KeyError):
        with fp8_autocast(enabled=True):
            raise KeyError("inside")
    assert not FP8GlobalStateManager.is_fp8_enabled() and FP8GlobalStateManager.FP8_AUTOCAST_DEPTH == 0


def test_default_recipe_and_autocast_alias():
    with autocast(recipe=None):
        assert isinstance(FP8GlobalStateManager.get_fp8_recipe(), DelayedScaling)
    with autocast(recipe=Float8CurrentScaling(), amax_reduction_group="g"):
        assert FP8GlobalStateManager.get_fp8_recipe().float8_current_scaling()
        assert FP8GlobalStateManager.get_fp8_group() == "g"


def test_first_module_flag_is_given_once_per_outermost_autocast():
    with fp8_autocast():
        assert FP8GlobalStateManager.is_first_fp8_module()
        assert not FP8GlobalStateManager.is_first_fp8_module()
        with fp8_autocast():
            assert not FP8GlobalStateManager.is_first_fp8_module()
    with fp8_autocast():
        assert FP8GlobalStateManager.is_first_fp8_module()


def test_unimplemented_recipes_are_refused_by_name():
    with pytest.raises(NotImplementedError, match="MXFP8BlockScaling"):
        with fp8_autocast(fp8_recipe=MXFP8BlockScaling()):
            pass
    with pytest.raises(TypeError, match="fp8_recipe must be"):
        with fp8_autocast(fp8_recipe={"margin": 0}):
            pass
    assert FP8GlobalStateManager.FP8_AUTOCAST_DEPTH == 0


def test_fp8_model_init_flags():
    assert not FP8GlobalStateManager.with_fp8_parameters()
    with fp8_model_init(enabled=True, preserve_high_precision_init_val=True):
        assert FP8GlobalStateManager.with_fp8_parameters()
        assert FP8GlobalStateManager.with_high_precision_init_val()
        with fp8_model_init(enabled=False):
            assert not FP8GlobalStateManager.with_fp8_parameters()
        assert FP8GlobalStateManager.with_fp8_parameters()
    assert not FP8GlobalStateManager.with_fp8_parameters()
    assert not FP8GlobalStateManager.with_high_precision_init_val()


def test_formats_of_a_recipe():
    hybrid = DelayedScaling()
    assert get_fp8_te_dtype(hybrid, True) == DType.kFloat8E4M3
    assert get_fp8_te_dtype(hybrid, False) == DType.kFloat8E5M2
    assert get_fp8_max(hybrid, False) == 57344.0
    e4m3 = DelayedScaling(fp8_format=Format.E4M3)
    assert get_fp8_te_dtype(e4m3, False) == DType.kFloat8E4M3


def expected_scales(amax_steps, history_len, algo, fp8_max, margin):
    """Scales after each step, by the rules of DelayedScaling written out in numpy."""
    history = np.zeros((history_len, amax_steps.shape[1]), dtype=np.float32)
    scale = np.ones(amax_steps.shape[1], dtype=np.float32)
    out = []
    for amaxes in amax_steps:
        history[0] = amaxes
        amax = history.max(axis=0) if algo == "max" else history[0].copy()
        with np.errstate(divide="ignore"):  # amax 0 gives inf, which the rule discards
            new = np.float32(fp8_max) / amax / np.float32(2.0**margin)
        ok = (amax > 0) & np.isfinite(amax)
        scale = np.where(ok, new, scale).astype(np.float32)
        history = np.roll(history, -1, axis=0)
        history[0] = 0
        out.append(scale.copy())
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algo", ["max", "most_recent", "callable_max"])
@pytest.mark.parametrize("forward", [True, False], ids=["fwd", "bwd"])
def test_delayed_scaling_over_steps(device, algo, forward):
    rng = np.random.default_rng(7)
    history_len, n, margin = 3, 4, 1
    amax_algo = (lambda h: h.amax(dim=0)) if algo == "callable_max" else algo
    recipe = DelayedScaling(margin=margin, amax_history_len=history_len, amax_compute_algo=amax_algo)
    state = DelayedScalingState(n, recipe, forward=forward, device=device)
    steps = rng.uniform(0.1, 50.0, size=(6, n)).astype(np.float32)
    steps[2, 1] = 0.0  # amax 0: keeps the scale (with most_recent)
    want = expected_scales(steps, history_len, "max" if algo == "callable_max" else algo,
                           get_fp8_max(recipe, forward), margin)
    for step, amaxes in enumerate(steps):
        with fp8_autocast(fp8_recipe=recipe):
            state.amax_history[0].copy_(torch.from_numpy(amaxes))  # what the casts would do
            if forward:
                FP8GlobalStateManager.add_forward_state(state)
        if not forward:
            FP8GlobalStateManager.add_backward_state(state)
            FP8GlobalStateManager.reduce_and_update_fp8_tensors(forward=False)
        np.testing.assert_allclose(state.scale.cpu().numpy(), want[step], rtol=2e-7)
        np.testing.assert_allclose(state.scale_inv.cpu().numpy(), 1.0 / want[step], rtol=2e-7)
        assert torch.all(state.amax_history[0] == 0)
        assert torch.equal(state.amax_history[-1].cpu(), torch.from_numpy(amaxes))


def test_states_update_only_at_the_outermost_exit():
    recipe = DelayedScaling(amax_history_len=2)
    state = DelayedScalingState(1, recipe, forward=True, device="cpu")
    with fp8_autocast(fp8_recipe=recipe):
        with fp8_autocast(fp8_recipe=recipe):
            state.amax_history[0, 0] = 2.0
            FP8GlobalStateManager.add_forward_state(state)
        assert state.scale.item() == 1.0
    assert state.scale.item() == np.float32(448.0) / np.float32(2.0)


def test_state_follows_a_history_length_change():
    state = DelayedScalingState(2, DelayedScaling(amax_history_len=4), forward=True, device="cpu")
    state.amax_history.copy_(torch.arange(8, dtype=torch.float32).view(4, 2))
    shorter = DelayedScaling(amax_history_len=2)
    assert not state.matches(shorter)
    state.adapt_to(shorter)
    assert state.matches(shorter)
    assert torch.equal(state.amax_history, torch.tensor([[0.0, 1.0], [2.0, 3.0]]))


def test_core_group_follows_new_buffers_and_formats():
    """The update's group tuple is kept between steps, and made again when a recipe
    change gives the state a new history buffer or another format (a backward state:
    E5M2 under HYBRID, E4M3 under E4M3)."""
    state = DelayedScalingState(3, DelayedScaling(amax_history_len=4), False, "cpu")
    first = state.core_group()
    assert state.core_group() is first
    assert first == (state.amax_history.data_ptr(), state.scale.data_ptr(), state.scale_inv.data_ptr(), 4, 3,
                     int(DType.kFloat8E5M2))
    state.adapt_to(DelayedScaling(amax_history_len=8, fp8_format=Format.E4M3))  # a new history and format
    longer = state.core_group()
    assert longer[0] == state.amax_history.data_ptr() != first[0]
    assert longer[3:] == (8, 3, int(DType.kFloat8E4M3))
    state.adapt_to(DelayedScaling(amax_history_len=8, fp8_format=Format.HYBRID))  # the same history, another format
    assert state.core_group()[:5] == longer[:5] and state.core_group()[5] == int(DType.kFloat8E5M2)
