"""Scaling-factor updates of the FP8 recipes on torch tensors, run on the device."""

from __future__ import annotations

from typing import Sequence

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import check_fp32_buffer, describe, fp8_dtype_of, stream_of

__all__ = ["compute_scale_from_amax", "delayed_scaling_update"]

_ALGOS = {"max": _core.AmaxComputeAlgo.MAX, "most_recent": _core.AmaxComputeAlgo.MOST_RECENT}


def compute_scale_from_amax(
    amax: torch.Tensor,
    fp8_dtype,
    *,
    epsilon: float = 0.0,
    force_pow_2_scales: bool = False,
    scale: torch.Tensor | None = None,
    scale_inv: torch.Tensor | None = None,
):
    """Current scaling: ``scale = fp8_max / max(amax, epsilon)`` (1 when that is 0 or not
    finite), optionally rounded down to a power of two, and ``scale_inv = 1/scale``;
    computed on amax's device. Returns ``(scale, scale_inv)``."""
    check_fp32_buffer(amax, "amax", amax)
    dtype = fp8_dtype_of(fp8_dtype)
    if scale is None:
        scale = torch.empty(1, dtype=torch.float32, device=amax.device)
    if scale_inv is None:
        scale_inv = torch.empty(1, dtype=torch.float32, device=amax.device)
    check_fp32_buffer(scale, "scale", amax)
    check_fp32_buffer(scale_inv, "scale_inv", amax)
    device_type, device_index = describe(amax, "amax").device
    _core.compute_scale_from_amax(amax.data_ptr(), scale.data_ptr(), scale_inv.data_ptr(), int(dtype),
                                  float(epsilon), bool(force_pow_2_scales), device_type, device_index,
                                  stream_of(amax))
    return scale, scale_inv


def delayed_scaling_update(
    amax_histories: Sequence[torch.Tensor],
    scales: Sequence[torch.Tensor],
    scale_invs: Sequence[torch.Tensor] | None,
    fp8_dtype,
    *,
    margin: float = 0.0,
    amax_compute_algo: str = "max",
) -> None:
    """Delayed scaling for many tensors in one launch.

    ``amax_histories[i]`` is float32 [history_len, n_i] (row 0 the current step),
    ``scales[i]`` and ``scale_invs[i]`` float32 [n_i], all on one device. Updates
    the scales from the history ("max" or "most_recent"), keeping the old scale
    where amax is 0 or not finite, then rolls each history and zeroes its row 0."""
    if amax_compute_algo not in _ALGOS:
        raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
    if len(scales) != len(amax_histories) or (scale_invs is not None and len(scale_invs) != len(scales)):
        raise ValueError("amax_histories, scales and scale_invs must have the same length")
    dtype = fp8_dtype_of(fp8_dtype)
    if not amax_histories:
        return
    first = amax_histories[0]
    groups = []
    for i, (history, scale) in enumerate(zip(amax_histories, scales)):
        if history.dim() != 2:
            raise ValueError(f"amax_histories[{i}] must be 2-D [history_len, n], got shape {tuple(history.shape)}")
        n = history.shape[1]
        check_fp32_buffer(history, f"amax_histories[{i}]", first, history.numel())
        check_fp32_buffer(scale, f"scales[{i}]", first, n)
        scale_inv_ptr = 0
        if scale_invs is not None:
            check_fp32_buffer(scale_invs[i], f"scale_invs[{i}]", first, n)
            scale_inv_ptr = scale_invs[i].data_ptr()
        groups.append((history.data_ptr(), scale.data_ptr(), scale_inv_ptr, history.shape[0], n, int(dtype)))
    device_type, device_index = describe(first, "amax_histories[0]").device
    _core.delayed_scaling_update(groups, int(_ALGOS[amax_compute_algo]), float(margin), device_type, device_index,
                                 stream_of(first))
