"""te.LayerNorm and te.RMSNorm: the core's norm kernels (fp32 statistics; weights may be
in another dtype than the input) as nn.Modules, over the last dim or, given a
normalized_shape of several dims, over those trailing dims together (as torch.nn.LayerNorm)."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from transformer_engine.pytorch.module._function_apply import direct_apply
from transformer_engine.pytorch.module._norm import make_norm_parameters, norm_backward, norm_forward
from transformer_engine.pytorch.cpp_extensions.module_ops import core_device
from transformer_engine.pytorch.module.base import activation_dtype_of, check_module_input, default_device
from transformer_engine.pytorch.module._linear_gemm import to_2d, to_shape

__all__ = ["LayerNorm", "RMSNorm"]

NormalizedShape = Union[int, Sequence[int]]  # the size of the last dim, or the sizes of the trailing dims


class _NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, weight, bias, normalization: str, eps: float, zero_centered_gamma: bool,
                dtype: torch.dtype):
        hidden = weight.numel()  # the trailing dims normalized over, flattened
        x = to_2d(inp, hidden, dtype)
        param_shape = weight.shape
        if weight.dim() != 1:  # several normalized dims: the kernels take flat [hidden] parameters
            weight = weight.reshape(hidden)
            bias = bias.reshape(hidden) if bias is not None else None
        out, mu, rsigma = norm_forward(normalization, x, weight, bias, eps, zero_centered_gamma, core_device(x))
        ctx.save_for_backward(x, mu, rsigma, weight)
        ctx.normalization, ctx.zero_centered_gamma = normalization, zero_centered_gamma
        ctx.inp_shape, ctx.inp_dtype, ctx.param_shape = inp.shape, inp.dtype, param_shape
        return to_shape(out, inp.shape)

    @staticmethod
    def backward(ctx, grad_out):
        x, mu, rsigma, weight = ctx.saved_tensors
        dz = to_2d(grad_out, x.shape[1], x.dtype)
        dx, dweight, dbias = norm_backward(ctx.normalization, dz, x, mu, rsigma, weight, ctx.zero_centered_gamma,
                                           core_device(dz))
        if len(ctx.param_shape) != 1:
            dweight = dweight.view(ctx.param_shape)
            dbias = dbias.view(ctx.param_shape) if dbias is not None else None
        dx = to_shape(dx, ctx.inp_shape)
        dx = dx.to(ctx.inp_dtype) if dx.dtype != ctx.inp_dtype else dx
        return dx, dweight, dbias, None, None, None, None


_apply_norm = direct_apply(_NormFunction)  # .apply without its Python layer


class _Norm(torch.nn.Module):
    normalization = ""

    def __init__(self, hidden_size: NormalizedShape, eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False,
                 device: Union[torch.device, str, None] = None, normalized_shape=None):
        super().__init__()
        name = type(self).__name__
        if normalized_shape is not None:  # Transformer Engine's newer keyword for hidden_size
            hidden_size = normalized_shape
        # A sequence normalizes over that many trailing dims, as torch.nn.LayerNorm's
        # normalized_shape; the parameters then have that shape.
        shape = tuple(hidden_size) if isinstance(hidden_size, (tuple, list, torch.Size)) else (hidden_size,)
        if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d <= 0 for d in shape):
            raise ValueError(f"{name}: hidden_size must be a positive int, or a non-empty sequence of them "
                             f"(normalized_shape), got {hidden_size!r}")
        if not isinstance(eps, (int, float)) or eps < 0:
            raise ValueError(f"{name}: eps must be a number >= 0, got {eps!r}")
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        if params_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name}: params_dtype must be float32, float16 or bfloat16, got {params_dtype}")
        self.normalized_shape = shape
        self.hidden_size, self.eps = math.prod(shape), float(eps)  # hidden_size: the elements normalized over
        self.zero_centered_gamma = bool(zero_centered_gamma)
        self.sequence_parallel = bool(sequence_parallel)
        device = default_device() if device is None else torch.device(device)
        make_norm_parameters(self, shape, self.normalization, self.zero_centered_gamma, params_dtype, device,
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
        shape = self.normalized_shape
        if len(shape) == 1:
            check_module_input(type(self).__name__, inp, self.hidden_size, "hidden_size", self.weight.device)
        else:
            check_module_input(type(self).__name__, inp, shape[-1], "normalized_shape[-1]", self.weight.device)
            if tuple(inp.shape[-len(shape):]) != shape:
                raise ValueError(f"{type(self).__name__}: inp's trailing dimensions must be normalized_shape="
                                 f"{shape}, got shape {tuple(inp.shape)}")
        return _apply_norm(inp, self.weight, self.bias, self.normalization, self.eps,
                           self.zero_centered_gamma, activation_dtype_of(inp))

    def extra_repr(self) -> str:
        size = self.hidden_size if len(self.normalized_shape) == 1 else self.normalized_shape
        return f"{size}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"


class LayerNorm(_Norm):
    """``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` over the last dim (``(1 + gamma)``
    with ``zero_centered_gamma``); parameters ``weight`` and ``bias``."""

    normalization = "LayerNorm"


class RMSNorm(_Norm):
    """``y = x / sqrt(mean(x^2) + eps) * gamma`` over the last dim (``(1 + gamma)`` with
    ``zero_centered_gamma``); parameter ``weight``."""

    normalization = "RMSNorm"
