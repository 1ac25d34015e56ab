"""The softmax ops of the unfused attention path on torch tensors: Transformer Engine's
``tex`` functions of the same names and signatures, over te_scaled_*softmax_* (see
csrc/include/opente/softmax.h for the exact semantics).

Forward ``y = softmax(scale_factor * x)`` over the last dim, computed in fp32:

* scaled_softmax_forward(input [b, h, sq, sk], scale_factor)
* scaled_masked_softmax_forward(input [b, h, sq, sk], mask [b or 1, 1, sq, sk], scale_factor):
  True / nonzero mask elements are masked out (logit -10000, as Transformer Engine); a
  row whose every position is masked comes out as zeros.
* scaled_upper_triang_masked_softmax_forward(input [attn_batches, sq, sq], scale_factor):
  causal, position j > i masked out (exactly 0).
* scaled_aligned_causal_masked_softmax_forward(input [b, h, sq, sk], scale_factor): causal
  aligned bottom-right, position j > i + (sk - sq) masked out (exactly 0).

Backward ``dx = scale * y * (dy - sum(dy * y))`` from the forward's output y:
``*_backward(output_grads, softmax_results, scale_factor)``. As in Transformer Engine the
gradient is written into ``output_grads`` (made contiguous first if it is not) and that
tensor is returned.

Tensors are float16, bfloat16 (Transformer Engine's dtypes) or float32, on the CPU or a
GPU; unlike Transformer Engine any sk >= 1 is accepted. Non-contiguous inputs are copied
to contiguous ones first.
"""

from __future__ import annotations

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType, describe, stream_of

__all__ = [
    "scaled_softmax_forward",
    "scaled_softmax_backward",
    "scaled_masked_softmax_forward",
    "scaled_masked_softmax_backward",
    "scaled_upper_triang_masked_softmax_forward",
    "scaled_upper_triang_masked_softmax_backward",
    "scaled_aligned_causal_masked_softmax_forward",
    "scaled_aligned_causal_masked_softmax_backward",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _checked(t, name: str, dims: int, layout: str, square: bool = False) -> torch.Tensor:
    """``t`` as a contiguous float tensor of ``dims`` dims on the CPU or a GPU; with
    ``square`` its last two dims must be equal."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}D {layout}, got shape {tuple(t.shape)}")
    if square and t.shape[-1] != t.shape[-2]:
        raise ValueError(f"{name} must be square in its last two dims (sq == sk), got shape {tuple(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
    return t.contiguous()


def _scale(scale_factor) -> float:
    try:
        scale = float(scale_factor)
    except (TypeError, ValueError):
        raise TypeError(f"scale_factor must be a number, got {type(scale_factor).__name__}") from None
    if scale != scale or scale in (float("inf"), float("-inf")):
        raise ValueError(f"scale_factor must be finite, got {scale}")
    return scale


def _forward(op, inp, scale_factor, dims: int, layout: str, square: bool = False) -> torch.Tensor:
    inp = _checked(inp, "input", dims, layout, square)
    scale = _scale(scale_factor)
    out = torch.empty_like(inp)
    op(describe(inp, "input"), describe(out, "output"), scale, stream_of(inp))
    return out


def _backward(op, output_grads, softmax_results, scale_factor, dims: int, layout: str,
              square: bool = False) -> torch.Tensor:
    output_grads = _checked(output_grads, "output_grads", dims, layout, square)
    softmax_results = _checked(softmax_results, "softmax_results", dims, layout, square)
    if output_grads.shape != softmax_results.shape:
        raise ValueError(f"output_grads shape {tuple(output_grads.shape)} must equal softmax_results shape "
                         f"{tuple(softmax_results.shape)}")
    if output_grads.dtype != softmax_results.dtype:
        raise TypeError(f"output_grads dtype {output_grads.dtype} must equal softmax_results dtype "
                        f"{softmax_results.dtype}")
    if output_grads.device != softmax_results.device:
        raise ValueError(f"output_grads is on {output_grads.device} but softmax_results is on "
                         f"{softmax_results.device}")
    scale = _scale(scale_factor)
    grads = describe(output_grads, "output_grads")
    # In place, as Transformer Engine: the core reads each element of dy before it
    # writes dx there.
    op(grads, describe(softmax_results, "softmax_results"), grads, scale, stream_of(output_grads))
    return output_grads


_BHSS = "[b, h, sq, sk]"
_ASS = "[attn_batches, sq, sk]"


def scaled_softmax_forward(input: torch.Tensor, scale_factor: float) -> torch.Tensor:  # noqa: A002 (TE's name)
    """softmax(scale_factor * input) over the last dim; input [b, h, sq, sk]."""
    return _forward(_core.scaled_softmax_fwd, input, scale_factor, 4, _BHSS)


def scaled_softmax_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor,
                            scale_factor: float) -> torch.Tensor:
    """Gradient of scaled_softmax_forward, written into output_grads (returned)."""
    return _backward(_core.scaled_softmax_bwd, output_grads, softmax_results, scale_factor, 4, _BHSS)


def scaled_masked_softmax_forward(input: torch.Tensor, mask: torch.Tensor,  # noqa: A002
                                  scale_factor: float) -> torch.Tensor:
    """softmax over the last dim of scale_factor * input with masked positions (mask True /
    nonzero) at -10000; fully masked rows are zeros. input [b, h, sq, sk], mask bool or
    uint8 [b or 1, 1, sq, sk] on input's device."""
    inp = _checked(input, "input", 4, _BHSS)
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype not in (torch.bool, torch.uint8):
        raise TypeError(f"mask must be bool or uint8, got {mask.dtype}")
    b, _, sq, sk = inp.shape
    if mask.dim() != 4 or mask.shape[0] not in (1, b) or tuple(mask.shape[1:]) != (1, sq, sk):
        raise ValueError(f"mask shape {tuple(mask.shape)} must be [{b} or 1, 1, {sq}, {sk}] for input shape "
                         f"{tuple(inp.shape)}")
    if mask.device != inp.device:
        raise ValueError(f"mask is on {mask.device} but input is on {inp.device}")
    mask = mask.contiguous()
    scale = _scale(scale_factor)
    out = torch.empty_like(inp)
    # A bool tensor's bytes are 0 / 1: described as uint8.
    _core.scaled_masked_softmax_fwd(describe(inp, "input"), describe(mask, "mask", dtype=DType.kByte),
                                    describe(out, "output"), scale, stream_of(inp))
    return out


def scaled_masked_softmax_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor,
                                   scale_factor: float) -> torch.Tensor:
    """Gradient of scaled_masked_softmax_forward (masked positions have y = 0, so dx = 0),
    written into output_grads (returned)."""
    return _backward(_core.scaled_masked_softmax_bwd, output_grads, softmax_results, scale_factor, 4, _BHSS)


def scaled_upper_triang_masked_softmax_forward(input: torch.Tensor,  # noqa: A002
                                               scale_factor: float) -> torch.Tensor:
    """Causal softmax of scale_factor * input, input [attn_batches, sq, sq]: row i keeps
    positions j <= i, the others are exactly 0."""
    return _forward(_core.scaled_upper_triang_masked_softmax_fwd, input, scale_factor, 3, _ASS, square=True)


def scaled_upper_triang_masked_softmax_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor,
                                                scale_factor: float) -> torch.Tensor:
    """Gradient of scaled_upper_triang_masked_softmax_forward (0 at masked positions),
    written into output_grads (returned)."""
    return _backward(_core.scaled_upper_triang_masked_softmax_bwd, output_grads, softmax_results, scale_factor, 3,
                     _ASS, square=True)


def scaled_aligned_causal_masked_softmax_forward(input: torch.Tensor,  # noqa: A002
                                                 scale_factor: float) -> torch.Tensor:
    """Causal softmax aligned bottom-right, input [b, h, sq, sk]: row i keeps positions
    j <= i + (sk - sq), the others are exactly 0 (a row that keeps none is all zeros)."""
    return _forward(_core.scaled_aligned_causal_masked_softmax_fwd, input, scale_factor, 4, _BHSS)


def scaled_aligned_causal_masked_softmax_backward(output_grads: torch.Tensor, softmax_results: torch.Tensor,
                                                  scale_factor: float) -> torch.Tensor:
    """Gradient of scaled_aligned_causal_masked_softmax_forward (0 at masked positions),
    written into output_grads (returned)."""
    return _backward(_core.scaled_aligned_causal_masked_softmax_bwd, output_grads, softmax_results, scale_factor,
                     4, _BHSS)
