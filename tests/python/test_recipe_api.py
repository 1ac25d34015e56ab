"""transformer_engine.common.recipe: Transformer Engine 2.x's names, defaults and checks."""

import dataclasses
import pickle

import pytest

from transformer_engine.common import recipe
from transformer_engine.common.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    Format,
    MMParams,
    MXFP8BlockScaling,
    QParams,
)


def test_format_maxima():
    assert (Format.E4M3.value.max_fwd, Format.E4M3.value.max_bwd) == (448.0, 448.0)
    assert (Format.E5M2.value.max_fwd, Format.E5M2.value.max_bwd) == (57344.0, 57344.0)
    assert (Format.HYBRID.value.max_fwd, Format.HYBRID.value.max_bwd) == (448.0, 57344.0)


def test_delayed_scaling_defaults():
    r = DelayedScaling()
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (0, Format.HYBRID, 1024, "max")
    assert r.scaling_factor_compute_algo is None
    assert (r.reduce_amax, r.fp8_dpa, r.fp8_mha) == (True, False, False)
    assert r.delayed() and r.float8_per_tensor_scaling()
    assert not (r.float8_current_scaling() or r.mxfp8() or r.float8_block_scaling() or r.nvfp4())


def test_delayed_scaling_positional_order_is_te_2x():
    r = DelayedScaling(2, Format.E4M3, 16, "most_recent")
    assert (r.margin, r.fp8_format, r.amax_history_len, r.amax_compute_algo) == (2, Format.E4M3, 16, "most_recent")


def test_delayed_scaling_from_dict_as_lightning_builds_it():
    r = DelayedScaling(**{"fp8_format": Format.E4M3, "amax_history_len": 4, "amax_compute_algo": "max"})
    assert r.amax_history_len == 4 and r.fp8_format is Format.E4M3


def test_delayed_scaling_callable_algorithms():
    def pick(history):
        return history[0]

    def scale(amax, old_scale, fp8_max, rcp):
        return old_scale

    r = DelayedScaling(amax_compute_algo=pick, scaling_factor_compute_algo=scale)
    assert r.amax_compute_algo is pick and r.scaling_factor_compute_algo is scale


@pytest.mark.parametrize("name,value", [("interval", 4), ("override_linear_precision", (False, False, True))])
def test_delayed_scaling_removed_keywords_warn_and_are_ignored(name, value):
    with pytest.warns(UserWarning, match=f"{name} was removed"):
        r = DelayedScaling(**{name: value})
    assert r == DelayedScaling()
    assert getattr(r, name, None) is None  # not stored


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"fp8_format": Format.E5M2}, ValueError, "pure E5M2"),
        ({"fp8_format": "HYBRID"}, TypeError, "fp8_format must be a transformer_engine.common.recipe.Format"),
        ({"margin": -1}, ValueError, "margin must be >= 0"),
        ({"margin": "1"}, TypeError, "margin must be a number"),
        ({"amax_history_len": 0}, ValueError, "amax_history_len must be >= 1"),
        ({"amax_history_len": 2.0}, TypeError, "amax_history_len must be an int"),
        ({"amax_history_len": True}, TypeError, "amax_history_len must be an int"),
        ({"amax_compute_algo": "mean"}, ValueError, "amax_compute_algo must be 'max', 'most_recent' or a callable"),
        ({"scaling_factor_compute_algo": 3}, TypeError, "scaling_factor_compute_algo must be None or a callable"),
        ({"reduce_amax": 1}, TypeError, "reduce_amax must be a bool"),
        ({"fp8_dpa": "yes"}, TypeError, "fp8_dpa must be a bool"),
    ],
)
def test_delayed_scaling_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        DelayedScaling(**kwargs)


def test_delayed_scaling_rejects_unknown_keyword():
    with pytest.raises(TypeError, match="amax_history"):
        DelayedScaling(amax_history=3)


def test_current_scaling_defaults():
    r = Float8CurrentScaling()
    assert r.fp8_format is Format.HYBRID
    assert r.fp8_quant_fwd_inp == QParams(power_2_scale=False, amax_epsilon=0.0)
    assert r.fp8_gemm_fprop == MMParams(use_split_accumulator=False)
    assert r.fp8_gemm_dgrad.use_split_accumulator and r.fp8_gemm_wgrad.use_split_accumulator
    assert r.float8_current_scaling() and r.float8_per_tensor_scaling() and not r.delayed()


def test_current_scaling_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pure E5M2"):
        Float8CurrentScaling(fp8_format=Format.E5M2)
    with pytest.raises(TypeError, match="fp8_quant_fwd_inp must be a recipe.QParams"):
        Float8CurrentScaling(fp8_quant_fwd_inp=(True, 0.0))


def test_block_recipes_construct_and_identify():
    assert MXFP8BlockScaling().mxfp8() and MXFP8BlockScaling().fp8_format is Format.E4M3
    assert Float8BlockScaling().float8_block_scaling()
    assert recipe.NVFP4BlockScaling().nvfp4() and recipe.NVFP4BlockScaling().fp4_format is Format.E2M1


def test_recipes_are_dataclasses_that_copy_and_pickle():
    r = DelayedScaling(margin=1, amax_history_len=8)
    assert dataclasses.replace(r, margin=2).margin == 2
    assert pickle.loads(pickle.dumps(r)) == r
    assert pickle.loads(pickle.dumps(Float8CurrentScaling())) == Float8CurrentScaling()
