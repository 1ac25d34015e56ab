"""LayerNorm / RMSNorm as the modules use them: one forward and one backward entry
point for both kinds (``normalization`` "LayerNorm" or "RMSNorm"), and the parameters."""

from __future__ import annotations

from typing import Optional

import torch

from transformer_engine.pytorch.cpp_extensions import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(normalization: str, owner: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{owner}: normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")


def make_norm_parameters(module: torch.nn.Module, hidden_size: int, normalization: str, zero_centered_gamma: bool,
                         dtype: torch.dtype, device: torch.device, prefix: str) -> None:
    """Registers ``{prefix}weight`` (ones, or zeros when zero-centered) and, for LayerNorm,
    ``{prefix}bias`` (zeros)."""
    init = torch.zeros if zero_centered_gamma else torch.ones
    module.register_parameter(f"{prefix}weight", torch.nn.Parameter(init(hidden_size, dtype=dtype, device=device)))
    bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device))
    module.register_parameter(f"{prefix}bias", bias if normalization == "LayerNorm" else None)


def norm_forward(normalization: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 eps: float, zero_centered_gamma: bool, **out_kwargs):
    """(out, mu, rsigma); mu is None for RMSNorm. ``out_kwargs``: out_dtype, or fp8_dtype /
    scale / amax / columnwise for the fused norm + FP8 cast."""
    if normalization == "LayerNorm":
        return layernorm_fwd(x, weight, bias, eps, zero_centered_gamma, **out_kwargs)
    return rmsnorm_fwd(x, weight, eps, zero_centered_gamma, **out_kwargs)


def norm_backward(normalization: str, dz: torch.Tensor, x: torch.Tensor, mu, rsigma, weight: torch.Tensor,
                  zero_centered_gamma: bool):
    """(dx, dweight, dbias); dbias is None for RMSNorm."""
    if normalization == "LayerNorm":
        return layernorm_bwd(dz, x, mu, rsigma, weight, zero_centered_gamma)
    dx, dweight = rmsnorm_bwd(dz, x, rsigma, weight, zero_centered_gamma)
    return dx, dweight, None
