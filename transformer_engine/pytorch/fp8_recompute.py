"""The delayed-scaling forward scales of a checkpointed function, kept for its
recomputation (``te.checkpoint``).

A module casts with the scales of its forward ``DelayedScalingState``; the outermost
fp8_autocast's exit updates them (and rolls the amax history) once the forward is done.
te.checkpoint recomputes the function in the backward, after that update: to repeat the
forward's casts bit for bit, the recomputation must cast with the scales of then, raise
no amax of the history (the forward recorded these tensors already, and row 0 belongs to
the next step by now) and update no scale. As in Transformer Engine:

* while a checkpointed forward runs (a *recording* frame), every module that casts with
  delayed scaling keeps a frozen copy of its forward state (``frozen_copy``: its scales
  as they are, a scratch amax row of its own), in call order per module;
* while the recomputation runs (a *replaying* frame), each module forward takes, in the
  same order, the copy its original call kept and casts with it in place of its state;
  the state is not registered for an update, and an fp8_autocast opened inside the
  recomputed function updates nothing when it exits (its update was done in the forward).

Replaying leaves what it was given unchanged, so a second backward (retain_graph)
recomputes the same way. Frames nest: a checkpoint inside a checkpointed function
records while the outer one records or replays. A module forward takes its copy from the
innermost replaying frame (the scales of the original forward), and keeps what it casts
with in every recording frame opened after it (their recomputations will need the same).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, List, Tuple

__all__ = ["ForwardScales", "recording", "replaying", "is_replaying", "forward_state_for", "reset"]


class ForwardScales:
    """The frozen forward states of one checkpointed call: per module, one per forward of
    that module inside the call, in call order."""

    __slots__ = ("by_module",)

    def __init__(self):
        self.by_module: Dict[object, list] = {}


class _Frame:
    __slots__ = ("scales", "replaying", "taken")

    def __init__(self, scales: ForwardScales, replaying: bool):
        self.scales = scales
        self.replaying = replaying
        self.taken: Dict[object, int] = {}  # replaying: how many copies each module has used


# The open frames, outermost first. Empty outside te.checkpoint: the modules' forwards
# only test its truth.
FRAMES: List[_Frame] = []


@contextmanager
def _open(frame: _Frame):
    FRAMES.append(frame)
    try:
        yield
    finally:
        FRAMES.remove(frame)  # the last one, unless frames were closed out of order


def recording(scales: ForwardScales):
    """Inside: module forwards keep their forward scales in ``scales``."""
    return _open(_Frame(scales, False))


def replaying(scales: ForwardScales):
    """Inside: module forwards cast with the scales ``scales`` kept, in the same order."""
    return _open(_Frame(scales, True))


def is_replaying() -> bool:
    """Whether a recomputation is running (an fp8_autocast exit then updates nothing)."""
    return any(frame.replaying for frame in FRAMES)


def forward_state_for(module, live_state) -> Tuple[object, bool]:
    """(the forward state ``module``'s forward casts with, whether it is a replayed copy).
    Called by module forwards that cast with delayed scaling while a frame is open."""
    source = None
    recorders = []
    for frame in reversed(FRAMES):
        if frame.replaying:
            source = frame
            break
        recorders.append(frame)
    if source is None:
        # The original forward: it casts with (and records its amaxes in) the live state;
        # the recording frames keep a copy of the scales it casts with.
        state = live_state
        kept_copy = live_state.frozen_copy() if recorders else None
    else:
        kept = source.scales.by_module.get(module, ())
        used = source.taken.get(module, 0)
        if used >= len(kept):
            raise RuntimeError(
                f"checkpoint: the recomputation runs {type(module).__name__} more often ({used + 1} times) than "
                f"the checkpointed forward did ({len(kept)}); the recomputed function must run the same FP8 "
                "modules in the same order as its forward")
        source.taken[module] = used + 1
        state = kept_copy = kept[used]
    for frame in recorders:
        frame.scales.by_module.setdefault(module, []).append(kept_copy)
    return state, source is not None


def reset() -> None:
    """Closes every frame (FP8GlobalStateManager.reset, for tests)."""
    FRAMES.clear()
