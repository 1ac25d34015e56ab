"""Activation functions, forward and backward, on torch tensors (Transformer Engine 2.x's
helpers of the same names, over te_activation_fwd / te_activation_bwd).

Plain: gelu (tanh form), qgelu (x * sigmoid(1.702 x)), relu, srelu (relu(x)^2), silu.
Gated: geglu, qgeglu, reglu, sreglu, swiglu take [..., 2H]: the first half ``a`` goes
through the activation, the second half ``b`` is the linear gate; output act(a) * b,
[..., H]. All math is fp32. Forward output: the input's dtype, ``out_dtype``, or FP8
(``fp8_dtype`` with ``scale``) as a Float8TensorBase, the fused activation + quantize.
Backward ``d<name>(grad, fwd_input)`` returns the gradient of the forward's input.
"""

from __future__ import annotations

from typing import Optional

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.normalization import _check_float, _forward_output
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, stream_of

__all__ = [
    "gelu", "qgelu", "relu", "srelu", "silu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu",
    "dgelu", "dqgelu", "drelu", "dsrelu", "dsilu", "dgeglu", "dqgeglu", "dreglu", "dsreglu", "dswiglu",
]

_A = _core.Activation
_GATED = (_A.GEGLU, _A.QGEGLU, _A.REGLU, _A.SREGLU, _A.SWIGLU)


def _out_shape(kind, inp: torch.Tensor, name: str) -> tuple[int, ...]:
    if inp.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    if kind not in _GATED:
        return tuple(inp.shape)
    if inp.shape[-1] % 2:
        raise ValueError(f"{name} last dim must be even for a gated activation, got shape {tuple(inp.shape)}")
    return (*inp.shape[:-1], inp.shape[-1] // 2)


class _Shaped:
    """What _forward_output reads of the input (shape, dtype, device) with the output's shape."""

    def __init__(self, inp: torch.Tensor, shape):
        self.shape, self.dtype, self.device = shape, inp.dtype, inp.device


def _act_fwd(kind, inp, fp8_dtype, scale, amax, columnwise, out_dtype):
    _check_float(inp, "inp")
    shape = _out_shape(kind, inp, "inp")
    inp_desc = describe(inp, "inp")
    out, out_desc = _forward_output(_Shaped(inp, shape), inp_desc, out_dtype, fp8_dtype, scale, amax, columnwise)
    _core.activation_fwd(int(kind), inp_desc, out_desc, stream_of(inp))
    return out


def _act_bwd(kind, grad, fwd_input):
    _check_float(fwd_input, "fwd_input")
    _check_float(grad, "grad")
    _out_shape(kind, fwd_input, "fwd_input")
    dinput = torch.empty(fwd_input.shape, dtype=fwd_input.dtype, device=fwd_input.device)
    _core.activation_bwd(int(kind), describe(grad, "grad"), describe(fwd_input, "fwd_input"),
                         describe(dinput, "dinput"), stream_of(fwd_input))
    return dinput


def _make(kind, name: str, formula: str):
    def fwd(inp: torch.Tensor, fp8_dtype=None, scale: Optional[torch.Tensor] = None,
            amax: Optional[torch.Tensor] = None, columnwise: bool = False,
            out_dtype: Optional[torch.dtype] = None):
        return _act_fwd(kind, inp, fp8_dtype, scale, amax, columnwise, out_dtype)

    def bwd(grad: torch.Tensor, fwd_input: torch.Tensor) -> torch.Tensor:
        return _act_bwd(kind, grad, fwd_input)

    gated = kind in _GATED
    fwd.__name__ = fwd.__qualname__ = name
    fwd.__doc__ = (
        f"``{formula}`` in fp32{' over inp [..., 2H] = [a | b], output [..., H]' if gated else ''}.\n\n"
        "Output: ``out_dtype`` (default inp's dtype), or with ``fp8_dtype`` and ``scale`` (float32 [1])\n"
        "a Float8TensorBase of fp8(y * scale), with the transposed copy too when ``columnwise``;\n"
        "``amax`` (float32 [1]), if given, is raised in place to max(amax, max|y|): of y before\n"
        "scaling, or of a float y as stored (what a current-scaling cast of it needs)."
    )
    bwd.__name__ = bwd.__qualname__ = "d" + name
    bwd.__doc__ = (
        f"Gradient of {name}'s input: ``grad`` [..., H] (fwd_input's dtype), ``fwd_input`` the forward's "
        "input; returns a tensor of fwd_input's shape and dtype."
    )
    return fwd, bwd


gelu, dgelu = _make(_A.GELU, "gelu", "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))")
qgelu, dqgelu = _make(_A.QGELU, "qgelu", "x * sigmoid(1.702 x)")
relu, drelu = _make(_A.RELU, "relu", "max(x, 0)")
srelu, dsrelu = _make(_A.SRELU, "srelu", "max(x, 0)^2")
silu, dsilu = _make(_A.SILU, "silu", "x * sigmoid(x)")
geglu, dgeglu = _make(_A.GEGLU, "geglu", "gelu(a) * b")
qgeglu, dqgeglu = _make(_A.QGEGLU, "qgeglu", "qgelu(a) * b")
reglu, dreglu = _make(_A.REGLU, "reglu", "relu(a) * b")
sreglu, dsreglu = _make(_A.SREGLU, "sreglu", "srelu(a) * b")
swiglu, dswiglu = _make(_A.SWIGLU, "swiglu", "silu(a) * b")
