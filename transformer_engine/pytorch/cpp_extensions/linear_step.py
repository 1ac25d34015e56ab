"""te.Linear's FP8 forward and backward under delayed scaling, one core call each
(te_linear_fp8_fwd / te_linear_fp8_bwd, opente/linear.h).

The same casts and GEMMs as module_ops' separate calls (QuantizeGroup, gemm,
dbias_quantize), with the same results bit for bit; what a step saves is the host
work between them: descriptors, intermediate Python objects, three to five crossings
into the core. At a tiny layer that work, not the GPU, is a training step's time.
Buffers are made here as in module_ops (uninitialized; the core writes them).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.module_ops import (
    _F32,
    _PER_TENSOR,
    _U8,
    CoreDevice,
    _address,
    _float_desc,
    _gemm_operand,
    _scratch,
    dbias_dtype_for,
)
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType

# A module import: the tensor package imports this package's cast helpers.
import transformer_engine.pytorch.tensor._internal.float8_tensor_base as _f8

__all__ = ["linear_fp8_forward", "linear_fp8_backward"]


def linear_fp8_forward(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       bias_dtype: Optional[torch.dtype], fp8_dtype: DType, scale: int, amax: int, need_wgrad: bool,
                       need_dgrad: bool, out_dtype: torch.dtype, dev: CoreDevice, split_accumulator: bool
                       ) -> Tuple[torch.Tensor, Optional[_f8.Float8TensorBase], Optional[_f8.Float8TensorBase]]:
    """``x @ weight^T (+ bias)`` in ``out_dtype`` from FP8 casts of the 2-D ``x`` and
    ``weight`` (any float dtypes), made with the fp32 scales at addresses ``scale`` (x)
    and ``scale + 4`` (weight), raising the amaxes at ``amax`` and ``amax + 4``: forward
    tensors 0 and 1 of a module's delayed-scaling state. The bias is added in
    ``bias_dtype``, converted in the casts' launch when it is in another. Returns
    (out, x's FP8 copy for the wgrad GEMM: its column-wise layout alone, with
    ``need_wgrad``; weight's for the dgrad GEMM, both layouts, with ``need_dgrad``)."""
    rows, cols = x.shape
    out_features = weight.shape[0]
    device = x.device
    x_data = torch.empty(rows, cols, dtype=_U8, device=device)
    x_t = torch.empty(cols, rows, dtype=_U8, device=device) if need_wgrad else None
    x_scale_inv = torch.empty(1, dtype=_F32, device=device)
    w_data = torch.empty(out_features, cols, dtype=_U8, device=device)
    w_t = torch.empty(cols, out_features, dtype=_U8, device=device) if need_dgrad else None
    w_scale_inv = torch.empty(1, dtype=_F32, device=device)
    out = torch.empty(rows, out_features, dtype=out_dtype, device=device)
    bias_desc = converted_desc = converted = None
    if bias is not None:
        bias_desc = _float_desc(bias, dev, "bias")
        if bias.dtype != bias_dtype:
            converted = torch.empty(out_features, dtype=bias_dtype, device=device)  # held until queued
            converted_desc = _float_desc(converted, dev, "bias")
    code = int(fp8_dtype)
    _core.linear_fp8_fwd(
        _float_desc(x, dev, "inp"), _float_desc(weight, dev, "weight"), bias_desc, converted_desc,
        _core.Tensor(dev.type, dev.index, code, (rows, cols), x_data.data_ptr(), _address(x_t), scale,
                     x_scale_inv.data_ptr(), amax, _PER_TENSOR),
        _core.Tensor(dev.type, dev.index, code, (out_features, cols), w_data.data_ptr(), _address(w_t), scale + 4,
                     w_scale_inv.data_ptr(), amax + 4, _PER_TENSOR),
        _float_desc(out, dev, "out"), bool(split_accumulator), dev.workspace, dev.workspace_size, dev.stream)
    saved_x = _f8.Float8TensorBase.wrap(None, x_t, x_scale_inv, fp8_dtype) if need_wgrad else None
    saved_w = _f8.Float8TensorBase.wrap(w_data, w_t, w_scale_inv, fp8_dtype) if need_dgrad else None
    return out, saved_x, saved_w


def linear_fp8_backward(dy: torch.Tensor, saved_x: Optional[_f8.Float8TensorBase],
                        saved_w: Optional[_f8.Float8TensorBase], in_features: int, fp8_dtype: DType, scale: int,
                        amax: int, want_dbias: bool, dbias_dtype: Optional[torch.dtype], dx_dtype: torch.dtype,
                        dw_dtype: torch.dtype, dev: CoreDevice, split_dgrad: bool, split_wgrad: bool
                        ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dx, dw, dbias) from the 2-D output gradient ``dy``: dy cast to FP8 with the
    scale at address ``scale``, raising the amax at ``amax`` (backward tensor 0 of a
    module's state), with its column sums when ``want_dbias`` (in
    dbias_dtype_for(dy, dbias_dtype)); then dx = dy @ W from ``saved_w`` (None: no dx)
    in ``dx_dtype`` and dw = dy^T @ x from ``saved_x`` (None: no dw) in ``dw_dtype``,
    the forward's FP8 copies (linear_fp8_forward's, or any FP8 storage with the
    column-wise layout)."""
    rows, out_features = dy.shape
    device = dy.device
    need_dgrad, need_wgrad = saved_w is not None, saved_x is not None
    dy_data = torch.empty(rows, out_features, dtype=_U8, device=device) if need_dgrad else None
    dy_t = torch.empty(out_features, rows, dtype=_U8, device=device) if need_wgrad else None
    dy_scale_inv = torch.empty(1, dtype=_F32, device=device)
    dbias = dbias_desc = None
    ws_ptr = ws_size = 0
    if want_dbias:
        dbias = torch.empty(out_features, dtype=dbias_dtype_for(dy, dbias_dtype), device=device)
        dbias_desc = _float_desc(dbias, dev, "dbias")
        ws_size = _core.dbias_workspace_size(rows, out_features, dev.type, dev.index)
        ws, ws_ptr = _scratch(ws_size, dev, device)  # ws held until queued
    dx = dw = dx_desc = dw_desc = w_desc = x_desc = None
    if need_dgrad:
        dx = torch.empty(rows, in_features, dtype=dx_dtype, device=device)
        dx_desc = _float_desc(dx, dev, "dx")
        w_desc = _gemm_operand(saved_w, dev, "weight")[0]
    if need_wgrad:
        dw = torch.empty(out_features, in_features, dtype=dw_dtype, device=device)
        dw_desc = _float_desc(dw, dev, "dw")
        x_desc = _gemm_operand(saved_x, dev, "input")[0]
    _core.linear_fp8_bwd(
        _float_desc(dy, dev, "grad"),
        _core.Tensor(dev.type, dev.index, int(fp8_dtype), (rows, out_features), _address(dy_data), _address(dy_t),
                     scale, dy_scale_inv.data_ptr(), amax, _PER_TENSOR),
        dbias_desc, w_desc, x_desc, dx_desc, dw_desc, bool(split_dgrad), bool(split_wgrad), ws_ptr, ws_size,
        dev.workspace, dev.workspace_size, dev.stream)
    return dx, dw, dbias
