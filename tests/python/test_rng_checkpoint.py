"""CudaRNGStatesTracker and te.checkpoint (transformer_engine/pytorch/distributed.py).

The tracker: a forked block draws from the tracked stream (the same seed gives the same
numbers), the stream advances from one fork to the next, the default stream is left as
it was, and get_states / set_states replay a stream. checkpoint: outputs and gradients
equal to the plain run (bit for bit: the recomputation repeats the same operations), with
dropout from the default generator and from a tracker fork, reentrant or not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES

import transformer_engine.pytorch as te
from transformer_engine.pytorch.fp8 import FP8GlobalStateManager


def tracker_with(seed: int, name: str = "model-parallel-rng") -> te.CudaRNGStatesTracker:
    tracker = te.CudaRNGStatesTracker()
    tracker.add(name, seed)
    return tracker


# ---- tracker -----------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_fork_draws_from_the_tracked_stream(device):
    torch.manual_seed(0)
    default_before = torch.get_rng_state()
    a, b = tracker_with(42), tracker_with(42)
    with a.fork():
        first = torch.rand(16, device=device)
    with b.fork():
        same = torch.rand(16, device=device)
    torch.testing.assert_close(first, same, atol=0, rtol=0)
    with a.fork():
        second = torch.rand(16, device=device)
    assert not torch.equal(first, second)  # the stream moved on
    assert torch.equal(torch.get_rng_state(), default_before)  # the default stream did not
    if device == "cuda":
        state = torch.cuda.get_rng_state()
        with a.fork():
            torch.rand(4, device="cuda")
        assert torch.equal(torch.cuda.get_rng_state(), state)


def test_different_seeds_and_names():
    tracker = te.CudaRNGStatesTracker()
    tracker.add("a", 1)
    tracker.add("b", 2)
    with tracker.fork("a"):
        x = torch.rand(8)
    with tracker.fork("b"):
        y = torch.rand(8)
    assert not torch.equal(x, y)
    assert tracker.is_initialized()


def test_get_set_states_replays():
    tracker = tracker_with(5)
    saved = tracker.get_states()
    with tracker.fork():
        first = torch.rand(8)
    tracker.set_states(saved)
    with tracker.fork():
        again = torch.rand(8)
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    # get_states is a copy: forking does not change a saved mapping.
    assert saved["model-parallel-rng"] is not tracker.get_states()["model-parallel-rng"]


def test_state_restored_when_the_block_raises():
    tracker = tracker_with(3)
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="inside"):
        with tracker.fork():
            torch.rand(4)
            raise RuntimeError("inside")
    assert torch.equal(torch.get_rng_state(), before)


def test_tracker_errors_and_reset():
    tracker = tracker_with(1, "x")
    with pytest.raises(ValueError, match="seed 1 already exists"):
        tracker.add("y", 1)
    with pytest.raises(ValueError, match="x already exists"):
        tracker.add("x", 2)
    with pytest.raises(KeyError, match="model-parallel-rng is not added"):
        with tracker.fork():
            pass
    with pytest.raises(TypeError, match="seed must be an int"):
        tracker.add("z", 1.5)
    with pytest.raises(TypeError, match="states must be a dict"):
        tracker.set_states([1])
    tracker.reset()
    assert not tracker.is_initialized()
    tracker.add("x", 1)  # names and seeds are free again


# ---- checkpoint --------------------------------------------------------------------------------


def _block(weight, tracker=None):
    """A function with dropout (from the tracker's fork when given) between two products."""

    def fn(x, scale=1.0):
        h = torch.tanh(x @ weight) * scale
        if tracker is not None:
            with tracker.fork():
                h = F.dropout(h, p=0.5, training=True)
        else:
            h = F.dropout(h, p=0.5, training=True)
        return (h @ weight.t()).sin()

    return fn


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("with_tracker", [False, True])
def test_checkpoint_gradients_equal_plain(device, use_reentrant, with_tracker):
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(6, 16, generator=gen).to(device)
    w0 = torch.randn(16, 16, generator=gen).to(device)

    def run(checkpointed):
        torch.manual_seed(123)
        if device == "cuda":
            torch.cuda.manual_seed(123)
        tracker = tracker_with(77) if with_tracker else None
        x = x0.clone().requires_grad_()
        w = w0.clone().requires_grad_()
        fn = _block(w, tracker)
        if checkpointed:
            out = te.checkpoint(fn, x, scale=0.5, use_reentrant=use_reentrant,
                                get_rng_state_tracker=(lambda: tracker) if with_tracker else None)
        else:
            out = fn(x, scale=0.5)
        # RNG used after the checkpointed region and before backward must not leak into the recomputation.
        torch.rand(3, device=device)
        if tracker is not None:
            with tracker.fork():
                torch.rand(3, device=device)
        out.sum().backward()
        return out.detach(), x.grad, w.grad

    for plain, recomputed in zip(run(False), run(True)):
        torch.testing.assert_close(recomputed, plain, atol=0, rtol=0)


def test_checkpoint_leaves_rng_states_as_after_the_plain_run():
    tracker = tracker_with(9)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    torch.manual_seed(5)
    out = te.checkpoint(_block(w, tracker), x, get_rng_state_tracker=lambda: tracker)
    cpu_after_forward = torch.get_rng_state()
    tracker_after_forward = tracker.get_states()["model-parallel-rng"].cpu
    out.sum().backward()
    assert torch.equal(torch.get_rng_state(), cpu_after_forward)
    assert torch.equal(tracker.get_states()["model-parallel-rng"].cpu, tracker_after_forward)


def test_checkpoint_deprecated_positional_form():
    tracker = tracker_with(4)
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(8, 8)
    with pytest.warns(DeprecationWarning, match="keyword"):
        out = te.checkpoint(_block(w, tracker), False, lambda: tracker, None, x)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_checkpoint_restores_fp8_autocast_state_for_recomputation():
    seen = []

    def fn(x):
        seen.append(FP8GlobalStateManager.is_fp8_calibration())
        return x * 2

    x = torch.randn(4, requires_grad=True)
    with te.fp8_autocast(enabled=False, calibrating=True):
        out = te.checkpoint(fn, x)
    out.sum().backward()  # outside the autocast: the recomputation still sees it
    assert seen == [True, True]
    assert not FP8GlobalStateManager.is_fp8_calibration()


def test_checkpoint_non_tensor_outputs_and_args():
    def fn(x, factor, tag=None):
        return x * factor, None

    x = torch.randn(5, requires_grad=True)
    out, nothing = te.checkpoint(fn, x, 3.0, tag="t")
    assert nothing is None
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_checkpoint_errors():
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="function must be callable"):
        te.checkpoint(5, x)
    with pytest.raises(TypeError, match="get_rng_state_tracker"):
        te.checkpoint(torch.sin, x, get_rng_state_tracker=3)
    with pytest.raises(ValueError, match="context_fn needs use_reentrant=False"):
        te.checkpoint(torch.sin, x, context_fn=lambda: (None, None))
    out = te.checkpoint(torch.sin, x)
    with pytest.raises(RuntimeError, match=r"torch.autograd.grad"):
        torch.autograd.grad(out.sum(), x)
