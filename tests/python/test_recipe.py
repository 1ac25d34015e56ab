"""Scaling-factor updates: current scaling and delayed scaling, against formulas
written here (Transformer Engine's rules), and on CUDA against the CPU core."""

import math

import numpy as np
import pytest
import torch

from fp8_reference import FLT_MAX, FP8_DTYPES, FP8_MAX, assert_float_equal, dtype_id, f32, round_down_pow2
from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions import DType, compute_scale_from_amax, delayed_scaling_update, module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import core_device

NAN, INF = float("nan"), float("inf")

# ---- current scaling ----------------------------------------------------------


def ref_current_scale(amax, fp8_dtype, epsilon, pow2):
    """scale = fp8_max / max(amax, eps) in fp32; 1 when that max is 0, inf or NaN;
    FLT_MAX on overflow; optionally rounded down to a power of two."""
    m = NAN if math.isnan(amax) else max(f32(amax), f32(epsilon))
    if not (m > 0) or not math.isfinite(m):
        scale = f32(1)
    else:
        with np.errstate(over="ignore"):
            scale = f32(FP8_MAX[fp8_dtype]) / f32(m)
        if math.isinf(scale):
            scale = f32(FLT_MAX)
    if pow2:
        scale = f32(round_down_pow2(float(scale)))
    return float(scale), float(f32(1) / scale)


def run_current(amax, fp8_dtype, epsilon, pow2, device):
    a = torch.tensor([amax], dtype=torch.float32, device=device)
    scale, scale_inv = compute_scale_from_amax(a, fp8_dtype, epsilon=epsilon, force_pow_2_scales=pow2)
    assert scale.shape == (1,) and scale_inv.shape == (1,) and scale.device == a.device
    return scale.item(), scale_inv.item()


AMAXES = [1.0, 3.7, 448.0, 1e-3, 1e30, FLT_MAX, 1e-40, 0.0, INF, NAN]


@pytest.mark.parametrize("pow2", [False, True], ids=["exact", "pow2"])
@pytest.mark.parametrize("epsilon", [0.0, 1e-4, 10.0])
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("amax", AMAXES)
def test_current_scaling(device, amax, fp8_dtype, epsilon, pow2):
    got = run_current(amax, fp8_dtype, epsilon, pow2, device)
    if device == "cuda":
        assert got == run_current(amax, fp8_dtype, epsilon, pow2, "cpu")
    else:
        assert got == ref_current_scale(amax, fp8_dtype, epsilon, pow2)


@pytest.mark.parametrize("amax", [0.0, INF, -INF, NAN])
def test_current_scaling_bad_amax_gives_one(device, amax):
    assert run_current(amax, DType.kFloat8E4M3, 0.0, False, device) == (1.0, 1.0)
    assert run_current(amax, DType.kFloat8E5M2, 0.0, True, device) == (1.0, 1.0)


def test_current_scaling_known_values(device):
    assert run_current(448.0, DType.kFloat8E4M3, 0.0, False, device) == (1.0, 1.0)
    assert run_current(3.0, DType.kFloat8E5M2, 0.0, True, device)[0] == 16384.0  # 19114.67 -> 2^14
    assert run_current(0.0, DType.kFloat8E4M3, 4.0, False, device) == (112.0, f32(1) / f32(112))  # epsilon wins
    assert run_current(1e-40, DType.kFloat8E4M3, 0.0, True, device)[0] == 2.0**127  # FLT_MAX rounded down


# ---- delayed scaling ------------------------------------------------------------


def te_delayed_update(history, scale, algo, fp8_dtype, margin):
    """Transformer Engine's delayed-scaling rule on CPU torch tensors; returns new copies.
    torch.max over the window propagates NaN, so a NaN anywhere in it keeps the old scale."""
    amax = history.max(dim=0).values if algo == "max" else history[0]
    # tensor / tensor: IEEE fp32 division (a python scalar / tensor would go through a reciprocal)
    sf = torch.full_like(amax, FP8_MAX[fp8_dtype]) / amax / torch.full_like(amax, 2.0**margin)
    sf = torch.where((amax > 0) & torch.isfinite(amax), sf, scale)
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, FLT_MAX), sf)
    history = torch.roll(history, -1, 0)
    history[0] = 0
    return history, sf, torch.ones_like(sf) / sf


def make_groups(shapes, gen):
    """Histories [len, n] of positive amaxes over many magnitudes (some zero), scales > 0."""
    hists, scales = [], []
    for length, n in shapes:
        h = torch.exp2(torch.rand(length, n, generator=gen) * 40 - 20)
        h[torch.rand(length, n, generator=gen) < 0.15] = 0.0
        hists.append(h)
        scales.append(torch.exp2(torch.rand(n, generator=gen) * 10 - 5))
    return hists, scales


def record_amaxes(hists, gen, allow_inf=True):
    """What a step's casts do: write fresh amaxes into row 0 (sometimes 0 or inf)."""
    for h in hists:
        row = torch.exp2(torch.rand(h.shape[1], generator=gen) * 40 - 20)
        u = torch.rand(h.shape[1], generator=gen)
        row[u < 0.1] = 0.0
        if allow_inf:
            row[u > 0.93] = INF
        h[0] = row


# The GPU kernel spreads a group over rows and columns: (1024, 3) rolls in more than one
# chunk, (600, 1) reduces over 256 lanes, (3, 300) takes its columns in two passes.
GROUP_SHAPES = [(1, 1), (2, 4), (4, 3), (16, 5), (1024, 2), (1024, 3), (600, 1), (3, 0), (7, 33), (3, 300)]


@pytest.mark.parametrize("with_scale_inv", [True, False], ids=["scale_inv", "no_scale_inv"])
@pytest.mark.parametrize("margin", [0.0, 1.0, 3.0])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=dtype_id)
def test_delayed_scaling_steps(device, fp8_dtype, algo, margin, with_scale_inv, gen):
    hists, scales = make_groups(GROUP_SHAPES, gen)
    invs = [torch.full_like(s, -1.0) for s in scales]
    dev = [[t.to(device, copy=True) for t in ts] for ts in (hists, scales, invs)]  # never aliases
    for _ in range(5):
        record_amaxes(hists, gen)
        for h, dh in zip(hists, dev[0]):
            dh[0].copy_(h[0])  # only the new row: the rest must have evolved on the device
        delayed_scaling_update(dev[0], dev[1], dev[2] if with_scale_inv else None, fp8_dtype,
                               margin=margin, amax_compute_algo=algo)
        if device == "cuda":  # the CPU core, fed the same state, is the reference
            delayed_scaling_update(hists, scales, invs if with_scale_inv else None, fp8_dtype,
                                   margin=margin, amax_compute_algo=algo)
        else:
            for i in range(len(hists)):
                hists[i], new_scale, new_inv = te_delayed_update(hists[i], scales[i], algo, fp8_dtype, margin)
                scales[i].copy_(new_scale)
                if with_scale_inv:
                    invs[i].copy_(new_inv)
        for ref, got in zip(hists + scales + invs, dev[0] + dev[1] + dev[2]):
            assert_float_equal(got, ref)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_mixed_formats_in_one_call(device, algo, gen):
    """Groups of both formats in one core call (a HYBRID recipe's forward and backward
    update together) equal each group updated alone in its format on the CPU."""
    hists, scales = make_groups(GROUP_SHAPES, gen)
    invs = [torch.full_like(s, -1.0) for s in scales]
    formats = [FP8_DTYPES[i % 2] for i in range(len(hists))]
    dev = [[t.to(device, copy=True) for t in ts] for ts in (hists, scales, invs)]
    record_amaxes(hists, gen)
    for h, dh in zip(hists, dev[0]):
        dh[0].copy_(h[0])
    groups = [(h.data_ptr(), s.data_ptr(), inv.data_ptr(), h.shape[0], h.shape[1], int(fmt))
              for h, s, inv, fmt in zip(*dev, formats)]
    module_ops.delayed_scaling_update(groups, 1.0, int(_core.AmaxComputeAlgo.MAX if algo == "max" else
                                                       _core.AmaxComputeAlgo.MOST_RECENT), core_device(dev[0][0]))
    for i, fmt in enumerate(formats):
        delayed_scaling_update([hists[i]], [scales[i]], [invs[i]], fmt, margin=1.0, amax_compute_algo=algo)
    for ref, got in zip(hists + scales + invs, dev[0] + dev[1] + dev[2]):
        assert_float_equal(got, ref)
    assert FP8_DTYPES[0] != FP8_DTYPES[1]


def run_delayed(history, scale, algo="max", fp8_dtype=DType.kFloat8E4M3, margin=0.0, device="cpu"):
    h = torch.tensor(history, dtype=torch.float32, device=device)
    s = torch.tensor(scale, dtype=torch.float32, device=device)
    inv = torch.zeros_like(s)
    delayed_scaling_update([h], [s], [inv], fp8_dtype, margin=margin, amax_compute_algo=algo)
    return h.cpu(), s.cpu(), inv.cpu()


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_bad_amax_keeps_old_scale(device, algo):
    _, s, inv = run_delayed([[0.0, INF, NAN, 2.0, -3.0]], [5.0, 6.0, 7.0, 8.0, 9.0], algo, device=device)
    assert s.tolist() == [5.0, 6.0, 7.0, 224.0, 9.0]  # only 448 / 2 is a new scale
    assert inv.tolist() == [f32(1) / f32(v) for v in s.tolist()]


@pytest.mark.parametrize("bad", [NAN, INF], ids=["nan", "inf"])
@pytest.mark.parametrize("row", [0, 1, 2, 3])
def test_delayed_max_with_bad_value_anywhere_in_window(device, bad, row):
    # TE: amax = max over the window (NaN and inf propagate through torch.max), so a bad
    # value in *any* row keeps the old scale - not only when it sits in row 0.
    history = [[2.0], [4.0], [1.0], [3.0]]
    history[row] = [bad]
    _, s, _ = run_delayed(history, [5.0], "max", device=device)
    assert s.tolist() == [5.0]


def test_delayed_algos_and_margin(device):
    hist = [[1.0, 448.0], [1000.0, 0.0]]
    _, s, _ = run_delayed(hist, [1.0, 1.0], "max", device=device)
    assert s.tolist() == [f32(448) / f32(1000), 1.0]
    _, s, _ = run_delayed(hist, [1.0, 1.0], "most_recent", device=device)
    assert s.tolist() == [448.0, 1.0]
    _, s, _ = run_delayed(hist, [1.0, 1.0], "most_recent", margin=2.0, device=device)
    assert s.tolist() == [112.0, 0.25]
    _, s, _ = run_delayed([[7.0]], [1.0], fp8_dtype=DType.kFloat8E5M2, margin=-1.0, device=device)
    assert s.tolist() == [16384.0]  # 57344 / 7 * 2


def test_delayed_roll(device):
    # Row i takes row i+1, the last row takes the old row 0, then row 0 is zeroed.
    h, _, _ = run_delayed([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]], [1.0, 1.0], device=device)
    assert h.tolist() == [[0.0, 0.0], [3.0, 30.0], [1.0, 10.0]]
    h, _, _ = run_delayed([[9.0]], [1.0], device=device)  # length 1: just zeroed
    assert h.tolist() == [[0.0]]


def test_delayed_overflow_gives_flt_max(device):
    _, s, inv = run_delayed([[1e-45]], [1.0], device=device)
    assert s.item() == FLT_MAX and inv.item() == f32(1) / f32(FLT_MAX)


def test_delayed_many_groups(device, gen):
    # More groups than one launch would naively map, of mixed sizes.
    shapes = [(1 + i % 17, 1 + (i * 7) % 5) for i in range(300)]
    hists, scales = make_groups(shapes, gen)
    dev_h = [h.to(device, copy=True) for h in hists]
    dev_s = [s.to(device, copy=True) for s in scales]
    delayed_scaling_update(dev_h, dev_s, None, DType.kFloat8E5M2, amax_compute_algo="max")
    for h, s, dh, ds in zip(hists, scales, dev_h, dev_s):
        ref_h, ref_s, _ = te_delayed_update(h, s, "max", DType.kFloat8E5M2, 0.0)
        assert_float_equal(dh, ref_h)
        assert_float_equal(ds, ref_s)


def test_delayed_empty_list_is_a_no_op(device):
    delayed_scaling_update([], [], [], DType.kFloat8E4M3)
