"""delay_wgrad_compute: the weight-gradient GEMMs of a backward, kept for later.

Pipeline schedules that split the backward in two (zero-bubble, DualPipe) run the
data-gradient half of a layer's backward at once, since the previous stage waits for
it, and the weight-gradient half later, in a bubble. A module built with
``delay_wgrad_compute=True`` does the first half in its autograd backward and puts the
second half here: one entry per backward, holding the tensors its wgrad GEMMs read (the
saved input and the output gradient, in FP8 when the step ran in FP8). ``backward_dw()``
takes the oldest entry, runs its GEMMs and adds the results to the parameters' gradients
as autograd would have.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Deque, List, NamedTuple, Optional, Sequence, Tuple

import torch

__all__ = ["DeferredWgrad", "WeightGradStore", "WgradTarget", "accumulate_grad"]


class DeferredWgrad(NamedTuple):
    """One weight-gradient GEMM to run later. ``compute()`` returns (dw, dbias): dw is None
    when it went into ``main_grad`` (fuse_wgrad_accumulation), dbias None when the bias
    gradient did not come with the GEMM. dw has the rows of ``weights`` stacked (several
    parameters when the layer's weight is split, ``parameters_split``); dbias likewise
    for ``biases``."""

    compute: Callable[[], Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]
    weights: Sequence[torch.nn.Parameter]
    biases: Sequence[torch.nn.Parameter]


class WgradTarget(NamedTuple):
    """Where a backward puts the weight-gradient GEMMs it defers: its entry of the store,
    and the parameters those GEMMs write."""

    entry: List[DeferredWgrad]
    weights: Sequence[torch.nn.Parameter]
    biases: Sequence[torch.nn.Parameter]

    def defer(self, compute: Callable[[], Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]) -> None:
        self.entry.append(DeferredWgrad(compute, self.weights, self.biases))


class WeightGradStore:
    """A module's FIFO of deferred weight gradients (one entry per backward)."""

    def __init__(self, delay_wgrad_compute: bool):
        self.delay_wgrad_compute = bool(delay_wgrad_compute)
        self._entries: Deque[List[DeferredWgrad]] = deque()

    def put(self, entry: List[DeferredWgrad]) -> None:
        self._entries.append(entry)

    def pop(self) -> Optional[List[DeferredWgrad]]:
        """The oldest entry, or None when there is none."""
        return self._entries.popleft() if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)


def accumulate_grad(params: Sequence[torch.nn.Parameter], grad: Optional[torch.Tensor]) -> None:
    """Adds ``grad`` (the rows of ``params`` stacked) to the parameters' ``.grad`` as
    autograd's accumulation does: the first gradient is stored, later ones are added in
    place."""
    if grad is None or not params:
        return
    parts = [grad] if len(params) == 1 else grad.split([p.shape[0] for p in params])
    with torch.no_grad():
        for param, part in zip(params, parts):
            if part.dtype != param.dtype:
                part = part.to(param.dtype)
            if param.grad is None:
                param.grad = part
            else:
                param.grad += part
