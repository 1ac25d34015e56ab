"""te.LayerNorm and te.RMSNorm: the core's norm kernels (fp32 statistics; weights may be
in another dtype than the input) as nn.Modules."""

from __future__ import annotations

from typing import Optional, Union

import torch

from transformer_engine.pytorch.module._norm import make_norm_parameters, norm_backward, norm_forward
from transformer_engine.pytorch.cpp_extensions.module_ops import core_device
from transformer_engine.pytorch.module.base import activation_dtype_of, check_module_input, default_device
from transformer_engine.pytorch.module.linear import to_2d, to_shape

__all__ = ["LayerNorm", "RMSNorm"]


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, weight, bias, normalization: str, eps: float, zero_centered_gamma: bool,
                dtype: torch.dtype):
        x = to_2d(inp, inp.shape[-1], dtype)
        out, mu, rsigma = norm_forward(normalization, x, weight, bias, eps, zero_centered_gamma, core_device(x))
        ctx.save_for_backward(x, mu, rsigma, weight)
        ctx.normalization, ctx.zero_centered_gamma = normalization, zero_centered_gamma
        ctx.inp_shape, ctx.inp_dtype = inp.shape, inp.dtype
        return to_shape(out, inp.shape)

    @staticmethod
    def backward(ctx, grad_out):
        x, mu, rsigma, weight = ctx.saved_tensors
        dz = to_2d(grad_out, x.shape[1], x.dtype)
        dx, dweight, dbias = norm_backward(ctx.normalization, dz, x, mu, rsigma, weight, ctx.zero_centered_gamma,
                                           core_device(dz))
        dx = to_shape(dx, ctx.inp_shape)
        dx = dx.to(ctx.inp_dtype) if dx.dtype != ctx.inp_dtype else dx
        return dx, dweight, dbias, None, None, None, None


class _Norm(torch.nn.Module):
    normalization = ""

    def __init__(self, hidden_size: int, eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False,
                 device: Union[torch.device, str, None] = None, normalized_shape=None):
        super().__init__()
        name = type(self).__name__
        if normalized_shape is not None:  # Transformer Engine's newer keyword for hidden_size
            hidden_size = normalized_shape
        if isinstance(hidden_size, (tuple, list, torch.Size)):
            if len(hidden_size) != 1:
                raise NotImplementedError(f"{name}: normalizing over several dims ({tuple(hidden_size)}) is not "
                                          "implemented; pass the last dim's size")
            hidden_size = hidden_size[0]
        if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"{name}: hidden_size must be a positive int, got {hidden_size!r}")
        if not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"{name}: eps must be a number >= 0, got {eps!r}")
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        if params_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name}: params_dtype must be float32, float16 or bfloat16, got {params_dtype}")
        self.hidden_size, self.eps = hidden_size, float(eps)
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = bool(sequence_parallel)
        device = default_device() if device is None else torch.device(device)
        make_norm_parameters(self, hidden_size, self.normalization, self.zero_centered_gamma, params_dtype, device,
                             prefix="")

    def reset_parameters(self, defer_init: bool = False) -> None:
        """weight ones (zeros with zero_centered_gamma), bias zeros; ``defer_init=True``
        does nothing (parameters on the meta device: call this after ``to_empty``)."""
        if defer_init:
            return
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        check_module_input(type(self).__name__, inp, self.hidden_size, "hidden_size", self.weight.device)
        return _NormFunction.apply(inp, self.weight, self.bias, self.normalization, self.eps,
                                   self.zero_centered_gamma, activation_dtype_of(inp))

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Norm):
    """``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` over the last dim (``(1 + gamma)``
    with ``zero_centered_gamma``); parameters ``weight`` and ``bias``."""

    normalization = "LayerNorm"


class RMSNorm(_Norm):
    """``y = x / sqrt(mean(x^2) + eps) * gamma`` over the last dim (``(1 + gamma)`` with
    ``zero_centered_gamma``); parameter ``weight``."""

    normalization = "RMSNorm"
