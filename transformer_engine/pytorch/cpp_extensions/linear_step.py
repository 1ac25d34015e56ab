"""te.Linear's FP8 forward and backward, one core call each (te_linear_fp8_fwd /
te_linear_fp8_bwd, opente/linear.h), under delayed or current scaling.

The same casts and GEMMs as module_ops' separate calls (QuantizeGroup, gemm,
dbias_quantize), with the same results bit for bit; what a step saves is the host
work between them: descriptors, intermediate Python objects, three to five crossings
into the core. At a tiny layer that work, not the GPU, is a training step's time.
Buffers are uninitialized (the core writes them); the FP8 copies of a step share an
allocation or two (SavedFp8), since each torch.empty costs a microsecond or more.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.module_ops import (
    _CORE_DTYPES,
    _F32,
    _PER_TENSOR,
    _U8,
    CoreDevice,
    _amax_and_scale_slots,
    _float_desc,
    _gemm_operand,
    _scratch,
    dbias_dtype_for,
    workspace_and_cast_slots,
)
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType

# A module import: the tensor package imports this package's cast helpers.
import transformer_engine.pytorch.tensor._internal.float8_tensor_base as _f8

__all__ = ["SavedFp8", "linear_fp8_forward", "linear_fp8_backward"]

# Current scaling's (epsilon, force_pow_2_scales), or None: the scales at given addresses.
CurrentScaling = Optional[Tuple[float, bool]]


def _fresh_desc(t: torch.Tensor, shape: Tuple[int, ...], dev: CoreDevice) -> _core.Tensor:
    """The descriptor of a float tensor just made here with ``shape`` (contiguous by
    construction: no check, unlike _float_desc)."""
    return _core.Tensor(dev.type, dev.index, _CORE_DTYPES[t.dtype], shape, t.data_ptr())


def _core_scaling(current: CurrentScaling) -> Tuple[bool, float, bool]:
    """The binding's (current_scaling, epsilon, force_pow_2_scales) arguments."""
    if current is None:
        return False, 0.0, False
    return True, float(current[0]), bool(current[1])


# Each buffer carved out of one allocation starts at a multiple of this many bytes, as a
# fresh allocation would: the small-cast kernel reads aligned vectors, and cuBLASLt
# refuses an FP8 GEMM at run time ("not supported") when an operand's scale_inv is at
# a 4-byte offset from another.
_ALIGN = 256


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


class SavedFp8:
    """The FP8 copies a one-call forward keeps for the backward, in one allocation (one
    torch.empty instead of five): the two scale_invs (x's at byte 0, W's at _ALIGN), x's
    column-wise copy (the wgrad GEMM's operand; with need_wgrad) and W in both layouts
    (the dgrad GEMM's; with need_dgrad). The backward's one call reads them by address
    (``operand``); the backward of separate calls gets Float8TensorBase views
    (``storage``). The row-wise x, which only the forward GEMM reads, is not in it: it
    is freed after the forward, as Transformer Engine frees it."""

    __slots__ = ("buffer", "fp8_dtype", "rows", "cols", "out_features", "x_t_offset", "w_offset")

    def __init__(self, buffer: torch.Tensor, fp8_dtype: DType, rows: int, cols: int, out_features: int,
                 x_t_offset: int, w_offset: int):
        self.buffer, self.fp8_dtype = buffer, fp8_dtype
        self.rows, self.cols, self.out_features = rows, cols, out_features
        self.x_t_offset, self.w_offset = x_t_offset, w_offset  # 0: not kept

    def operand(self, weight: bool, dev: CoreDevice) -> _core.Tensor:
        """The GEMM descriptor of W (``weight``, both layouts) or of x (column-wise)."""
        base = self.buffer.data_ptr()
        code = int(self.fp8_dtype)
        if weight:
            w = base + self.w_offset
            return _core.Tensor(dev.type, dev.index, code, (self.out_features, self.cols), w,
                                w + _aligned(self.out_features * self.cols), 0, base + _ALIGN, 0, _PER_TENSOR)
        return _core.Tensor(dev.type, dev.index, code, (self.rows, self.cols), 0, base + self.x_t_offset, 0, base, 0,
                            _PER_TENSOR)

    def storage(self) -> Tuple[Optional[_f8.Float8TensorBase], Optional[_f8.Float8TensorBase]]:
        """(x's, W's) FP8 storage as views of the buffer (None where not kept)."""
        buf, rows, cols, out = self.buffer, self.rows, self.cols, self.out_features
        x = w = None
        if self.x_t_offset:
            x_t = buf[self.x_t_offset:self.x_t_offset + rows * cols].view(cols, rows)
            x = _f8.Float8TensorBase.wrap(None, x_t, buf[0:4].view(_F32), self.fp8_dtype)
        if self.w_offset:
            w_t_offset = self.w_offset + _aligned(out * cols)
            w_data = buf[self.w_offset:self.w_offset + out * cols].view(out, cols)
            w_t = buf[w_t_offset:w_t_offset + out * cols].view(cols, out)
            w = _f8.Float8TensorBase.wrap(w_data, w_t, buf[_ALIGN:_ALIGN + 4].view(_F32), self.fp8_dtype)
        return x, w


def linear_fp8_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       bias_dtype: Optional[torch.dtype], fp8_dtype: DType, need_wgrad: bool, need_dgrad: bool,
                       out_dtype: torch.dtype, dev: CoreDevice, split_accumulator: bool, *, scale: int = 0,
                       amax: int = 0, current: CurrentScaling = None) -> Tuple[torch.Tensor, SavedFp8]:
    """``x @ weight^T (+ bias)`` in ``out_dtype`` from FP8 casts of the 2-D ``x`` and
    ``weight`` (any float dtypes). Delayed scaling (``current`` None): the casts use the
    fp32 scales at addresses ``scale`` (x) and ``scale + 4`` (weight) and raise the amaxes
    at ``amax`` and ``amax + 4``, forward tensors 0 and 1 of a module's state. Current
    scaling: each cast computes its scale from its own amax first. The bias is added in
    ``bias_dtype``, converted in the casts' launch when it is in another. Returns (out,
    the FP8 copies the backward reads: SavedFp8)."""
    rows, cols = x.shape
    out_features = weight.shape[0]
    device = x.device
    keep = None
    if current is not None:  # amax then scale of each cast, written and read by the call alone
        keep, amax = _amax_and_scale_slots(2, dev, device)
        x_scale, x_amax, w_scale, w_amax = amax + 4, amax, amax + 12, amax + 8
    else:
        x_scale, x_amax, w_scale, w_amax = scale, amax, scale + 4, amax + 4
    x_bytes, w_bytes = _aligned(rows * cols), _aligned(out_features * cols)
    convert_bias = bias is not None and bias.dtype != bias_dtype  # to the dtype the GEMM adds
    # Kept: [x scale_inv | W scale_inv | x^T | W | W^T]; the forward's alone: [x | W when no
    # dgrad needs it | the converted bias].
    x_t_offset = 2 * _ALIGN if need_wgrad else 0
    w_offset = 2 * _ALIGN + (x_bytes if need_wgrad else 0) if need_dgrad else 0
    kept = torch.empty(2 * _ALIGN + (x_bytes if need_wgrad else 0) + (2 * w_bytes if need_dgrad else 0), dtype=_U8,
                       device=device)
    bias_offset = x_bytes + (0 if need_dgrad else w_bytes)
    forward_only = torch.empty(bias_offset + (out_features * bias_dtype.itemsize if convert_bias else 0),
                               dtype=_U8, device=device)
    kept_at, forward_only_at = kept.data_ptr(), forward_only.data_ptr()
    w_at = kept_at + w_offset if need_dgrad else forward_only_at + x_bytes
    out = torch.empty(rows, out_features, dtype=out_dtype, device=device)
    bias_desc = converted_desc = None
    if bias is not None:
        bias_desc = _float_desc(bias, dev, "bias")
        if convert_bias:
            converted_desc = _core.Tensor(dev.type, dev.index, _CORE_DTYPES[bias_dtype], (out_features,),
                                          forward_only_at + bias_offset)
    code = int(fp8_dtype)
    _core.linear_fp8_fwd(
        _float_desc(x, dev, "inp"), _float_desc(weight, dev, "weight"), bias_desc, converted_desc,
        _core.Tensor(dev.type, dev.index, code, (rows, cols), forward_only_at,
                     kept_at + x_t_offset if need_wgrad else 0, x_scale, kept_at, x_amax, _PER_TENSOR),
        _core.Tensor(dev.type, dev.index, code, (out_features, cols), w_at, w_at + w_bytes if need_dgrad else 0,
                     w_scale, kept_at + _ALIGN, w_amax, _PER_TENSOR),
        _fresh_desc(out, (rows, out_features), dev), *_core_scaling(current), bool(split_accumulator), dev.workspace,
        dev.workspace_size, dev.stream)
    return out, SavedFp8(kept, fp8_dtype, rows, cols, out_features, x_t_offset, w_offset)


def linear_fp8_backward(dy: torch.Tensor, saved_x, saved_w, in_features: int, fp8_dtype: DType,
                        want_dbias: bool, dbias_dtype: Optional[torch.dtype], dx_dtype: torch.dtype,
                        dw_dtype: torch.dtype, dev: CoreDevice, split_dgrad: bool, split_wgrad: bool, *,
                        scale: int = 0, amax: int = 0, current: CurrentScaling = None
                        ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dx, dw, dbias) from the 2-D output gradient ``dy``: dy cast to FP8 (delayed
    scaling: with the scale at address ``scale``, raising the amax at ``amax``, backward
    tensor 0 of a module's state; current scaling: from its own amax), with its column
    sums when ``want_dbias`` (in dbias_dtype_for(dy, dbias_dtype)); then dx = dy @ W
    from ``saved_w`` (None: no dx) in ``dx_dtype`` and dw = dy^T @ x from ``saved_x``
    (None: no dw) in ``dw_dtype``, the forward's FP8 copies: linear_fp8_forward's
    SavedFp8, or FP8 storage with the column-wise layout."""
    rows, out_features = dy.shape
    device = dy.device
    need_dgrad, need_wgrad = saved_w is not None, saved_x is not None
    # dy's FP8 copies, which only this call reads, in one allocation: [scale_inv | dy | dy^T].
    dy_bytes = _aligned(rows * out_features)
    dy_fp8 = torch.empty(_ALIGN + (dy_bytes if need_dgrad else 0) + (dy_bytes if need_wgrad else 0), dtype=_U8,
                         device=device)
    dy_fp8_at = dy_fp8.data_ptr()
    dy_data_at = dy_fp8_at + _ALIGN if need_dgrad else 0
    dy_t_at = dy_fp8_at + _ALIGN + (dy_bytes if need_dgrad else 0) if need_wgrad else 0
    dbias = dbias_desc = None
    ws_size = 0
    if want_dbias:
        dbias = torch.empty(out_features, dtype=dbias_dtype_for(dy, dbias_dtype), device=device)
        dbias_desc = _fresh_desc(dbias, (out_features,), dev)
        ws_size = _core.dbias_workspace_size(rows, out_features, dev.type, dev.index)
    # The bias gradient's workspace, and under current scaling the cast's amax and scale
    # (kept referenced until queued).
    if current is not None:
        keep, ws_ptr, amax = workspace_and_cast_slots(ws_size, dev, device)
        scale = amax + 4
    else:
        keep, ws_ptr = _scratch(ws_size, dev, device)
    dx = dw = dx_desc = dw_desc = w_desc = x_desc = None
    if need_dgrad:
        dx = torch.empty(rows, in_features, dtype=dx_dtype, device=device)
        dx_desc = _fresh_desc(dx, (rows, in_features), dev)
        w_desc = saved_w.operand(True, dev) if type(saved_w) is SavedFp8 else _gemm_operand(saved_w, dev, "W")[0]
    if need_wgrad:
        dw = torch.empty(out_features, in_features, dtype=dw_dtype, device=device)
        dw_desc = _fresh_desc(dw, (out_features, in_features), dev)
        x_desc = saved_x.operand(False, dev) if type(saved_x) is SavedFp8 else _gemm_operand(saved_x, dev, "x")[0]
    _core.linear_fp8_bwd(
        _float_desc(dy, dev, "grad"),
        _core.Tensor(dev.type, dev.index, int(fp8_dtype), (rows, out_features), dy_data_at, dy_t_at, scale, dy_fp8_at,
                     amax, _PER_TENSOR),
        dbias_desc, w_desc, x_desc, dx_desc, dw_desc, *_core_scaling(current), bool(split_dgrad), bool(split_wgrad),
        ws_ptr, ws_size, dev.workspace, dev.workspace_size, dev.stream)
    return dx, dw, dbias
