"""LayerNorm / RMSNorm as the modules use them: one forward and one backward entry
point for both kinds (``normalization`` "LayerNorm" or "RMSNorm"), and the parameters."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from transformer_engine.pytorch.cpp_extensions import module_ops
from transformer_engine.pytorch.cpp_extensions.module_ops import CoreDevice, Fp8Output

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def check_normalization(normalization: str, owner: str) -> None:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"{owner}: normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")


def make_norm_parameters(module: torch.nn.Module, hidden_size: Union[int, Tuple[int, ...]], normalization: str,
                         zero_centered_gamma: bool, dtype: torch.dtype, device: torch.device, prefix: str) -> None:
    """Registers ``{prefix}weight`` (ones, or zeros when zero-centered) and, for LayerNorm,
    ``{prefix}bias`` (zeros), of shape ``hidden_size`` (an int or the normalized shape)."""
    init = torch.zeros if zero_centered_gamma else torch.ones
    module.register_parameter(f"{prefix}weight", torch.nn.Parameter(init(hidden_size, dtype=dtype, device=device)))
    bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=dtype, device=device))
    module.register_parameter(f"{prefix}bias", bias if normalization == "LayerNorm" else None)


def reset_norm_parameters(module: torch.nn.Module, zero_centered_gamma: bool, prefix: str) -> None:
    """Gives ``{prefix}weight`` and ``{prefix}bias`` (when there is one) the values
    make_norm_parameters made them with."""
    with torch.no_grad():
        module._parameters[f"{prefix}weight"].fill_(0.0 if zero_centered_gamma else 1.0)
        bias = module._parameters.get(f"{prefix}bias")
        if bias is not None:
            bias.zero_()


def norm_forward(normalization: str, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                 eps: float, zero_centered_gamma: bool, dev: CoreDevice, fp8: Optional[Fp8Output] = None,
                 amax: int = 0):
    """(out, mu, rsigma) of the 2-D ``x``; mu is None for RMSNorm. out in x's dtype, or FP8
    as ``fp8`` says (the fused norm + cast); ``amax``: see module_ops.norm_forward."""
    return module_ops.norm_forward(normalization == "LayerNorm", x, weight, bias, eps, zero_centered_gamma, dev, fp8,
                                   amax)


def norm_backward(normalization: str, dz: torch.Tensor, x: torch.Tensor, mu, rsigma, weight: torch.Tensor,
                  zero_centered_gamma: bool, dev: CoreDevice):
    """(dx, dweight, dbias) of the 2-D ``x``; dbias is None for RMSNorm."""
    return module_ops.norm_backward(normalization == "LayerNorm", dz, x, mu, rsigma, weight, zero_centered_gamma, dev)
