"""general_gemm: Transformer Engine 2.x's GEMM entry point, over te_gemm.

With layout = "XY" (X for A, Y for B; "T" transposes):

    out = alpha * op_B(B) @ op_A(A) + beta * out,  then the epilogue

so a Linear layer (weight W [out, in], input X [tokens, in]) runs
    fprop  general_gemm(W, X,  ws, layout="TN")   Y  = X @ W^T
    dgrad  general_gemm(W, dY, ws, layout="NN")   dX = dY @ W
    wgrad  general_gemm(X, dY, ws, layout="NT")   dW = dY^T @ X
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import check_fp32_buffer, describe, fp8_dtype_of, stream_of

# A module import, not a name: the tensor package imports the cast helpers of
# this package, so either package may be the one imported first.
import transformer_engine.pytorch.tensor._internal.float8_tensor_base as _f8

__all__ = ["general_gemm", "get_cublas_workspace_size_bytes"]

_LAYOUTS = ("TN", "NN", "NT")
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_EPI = _core.GemmEpilogue


def get_cublas_workspace_size_bytes() -> int:
    """Bytes of the ``workspace`` that CUDA GEMMs need (32 MiB, as Transformer Engine on Hopper)."""
    return _core.gemm_workspace_size()


def _matrix(shape) -> tuple[int, int]:
    """The [rows, cols] a tensor is flattened to: all leading dims times the last."""
    return (math.prod(shape[:-1]), shape[-1]) if len(shape) else (1, 1)


def _check_float(t, name: str, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but A is on {device}")


def _operand(x, name: str):
    """(descriptor, logical shape, a stored torch tensor) of A or B: a float tensor or FP8 storage
    whose row-wise and column-wise copies are both passed; the core reads the one
    its layout needs."""
    if isinstance(x, _f8.Float8TensorBase):
        stored = x._data if x._data is not None else x._transpose
        device = describe(stored, name).device
        if x._data is not None and x._transpose is not None:
            describe(x._transpose, f"{name}._transpose")  # contiguity
        shape = x.size()
        desc = _core.Tensor(*device, int(x._fp8_dtype), list(shape),
                            x._data.data_ptr() if x._data is not None else 0,
                            x._transpose.data_ptr() if x._transpose is not None else 0,
                            0, x._scale_inv.data_ptr(), 0, int(_core.ScalingMode.PER_TENSOR))
        return desc, shape, stored
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or a Float8TensorBase, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, float16 or bfloat16 (FP8 comes as a Float8TensorBase), "
                        f"got {x.dtype}")
    return describe(x, name), x.shape, x


def general_gemm(
    A,
    B,
    workspace: Optional[torch.Tensor],
    out_dtype: Optional[torch.dtype] = None,
    quantization_params=None,
    gelu: bool = False,
    gelu_in: Optional[torch.Tensor] = None,
    accumulate: bool = False,
    layout: str = "TN",
    out: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    use_split_accumulator: bool = False,
    grad: bool = False,
    ub=None,
    ub_type=None,
    extra_output: Optional[torch.Tensor] = None,
    bulk_overlap: bool = False,
    alpha: float = 1.0,
    beta: Optional[float] = None,
):
    """``out = alpha * op_B(B) @ op_A(A) (+ beta * out)`` with a fused epilogue.

    A, B: float32 / float16 / bfloat16 tensors of one dtype, or both Float8TensorBase.
    Forward (``grad=False``): ``bias`` [n] is added; ``gelu`` applies tanh-GELU and
    returns the pre-activation as ``gelu_input``. Backward (``grad=True``): ``gelu``
    multiplies by gelu'(``gelu_in``); ``bias`` only asks for ``bias_grad`` (in bias's
    dtype): [n], the sum of the dGELU output over rows, with ``gelu``; else [m],
    the row sums of op_B(B) (the bias gradient in the wgrad GEMM).
    ``accumulate``: add into ``out`` (``beta``, default 1). ``quantization_params``
    (``.scale``, ``.amax``, ``.dtype``): FP8 output, returned as a row-wise
    Float8TensorBase; ``.amax``, if set, is overwritten with max|out| before scaling.
    Returns ``(out, bias_grad, gelu_input, extra_output)``.
    """
    if ub is not None or ub_type is not None or extra_output is not None or bulk_overlap:
        raise NotImplementedError("general_gemm: userbuffers communication overlap (ub, ub_type, extra_output, "
                                  "bulk_overlap) is not implemented yet")
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(_LAYOUTS)}, got {layout!r}")
    transa, transb = layout[0] == "T", layout[1] == "T"

    a_desc, a_shape, a_stored = _operand(A, "A")
    b_desc, b_shape, b_stored = _operand(B, "B")
    device = a_stored.device
    if b_stored.device != device:
        raise ValueError(f"B is on {b_stored.device} but A is on {device}")
    fp8_inputs = isinstance(A, _f8.Float8TensorBase)
    if fp8_inputs != isinstance(B, _f8.Float8TensorBase):
        raise TypeError("A and B must both be Float8TensorBase (FP8) or both float tensors, got "
                        f"{type(A).__name__} and {type(B).__name__}")
    if not fp8_inputs and B.dtype != A.dtype:
        raise TypeError(f"B dtype must equal A dtype {A.dtype}, got {B.dtype}")
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ValueError("A and B must have at least one dimension")

    # op_A(A) is [k, n], op_B(B) is [m, k]; out keeps B's leading dims unless B is transposed.
    a_rows, a_cols = _matrix(a_shape)
    b_rows, b_cols = _matrix(b_shape)
    n = a_rows if transa else a_cols
    m = b_cols if transb else b_rows
    out_shape = ((b_cols,) if transb else tuple(b_shape[:-1])) + (n,)

    if beta is None:
        beta = 1.0 if accumulate else 0.0
    elif not accumulate and beta != 0.0:
        raise ValueError(f"beta must be 0 or None unless accumulate=True, got {beta}")
    if accumulate and out is None:
        raise ValueError("accumulate=True adds into out, so out must be given")
    if out_dtype is not None and out_dtype not in _FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")

    # ---- the output D --------------------------------------------------------
    if quantization_params is not None:
        if accumulate:
            raise ValueError("accumulate=True cannot add into an FP8 output (quantization_params)")
        if out is not None:
            raise NotImplementedError("general_gemm: writing an FP8 output (quantization_params) into a given out "
                                      "is not implemented; pass out=None")
        for attr in ("scale", "amax", "dtype"):
            if not hasattr(quantization_params, attr):
                raise TypeError(f"quantization_params must have .scale, .amax and .dtype (missing .{attr})")
        q_dtype = fp8_dtype_of(quantization_params.dtype, "quantization_params.dtype")
        scale, amax = quantization_params.scale, quantization_params.amax
        check_fp32_buffer(scale, "quantization_params.scale", a_stored)
        if amax is not None:
            check_fp32_buffer(amax, "quantization_params.amax", a_stored)
        data = torch.empty(out_shape, dtype=torch.uint8, device=device)
        result = _f8.Float8TensorBase(data=data, fp8_scale_inv=torch.reciprocal(scale), fp8_dtype=q_dtype,
                                      quantizer=quantization_params)
        d_desc = _core.Tensor(*a_desc.device, int(q_dtype), list(out_shape), data.data_ptr(), 0, scale.data_ptr(),
                              0, amax.data_ptr() if amax is not None else 0, int(_core.ScalingMode.PER_TENSOR))
        d_dtype = None
    else:
        if out is not None:
            _check_float(out, "out", device)
            if out_dtype is not None and out.dtype != out_dtype:
                raise TypeError(f"out dtype {out.dtype} differs from out_dtype {out_dtype}")
            if _matrix(out.shape) != (m, n):
                raise ValueError(f"out shape {tuple(out.shape)} must flatten to [{m}, {n}] (op_B(B) @ op_A(A))")
            result = out
        else:
            dtype = out_dtype or (torch.bfloat16 if fp8_inputs else A.dtype)
            result = torch.empty(out_shape, dtype=dtype, device=device)
        d_desc = describe(result, "out")
        d_dtype = result.dtype

    # ---- epilogue ------------------------------------------------------------
    if bias is not None:
        _check_float(bias, "bias", device)
    bias_arg = bias_grad = aux = None
    if gelu_in is not None and not (grad and gelu):
        raise ValueError("gelu_in is only read with grad=True and gelu=True")
    if not grad:
        bias_arg = bias
        if gelu:
            # The pre-activation in out's dtype; for FP8 out, in bias's dtype (bf16 without bias), as TE does.
            aux_dtype = d_dtype or (bias.dtype if bias is not None else torch.bfloat16)
            aux = torch.empty(out_shape, dtype=aux_dtype, device=device)
            epilogue = _EPI.GELU_AUX_BIAS if bias is not None else _EPI.GELU_AUX
        else:
            epilogue = _EPI.BIAS if bias is not None else _EPI.NONE
    elif gelu:
        if gelu_in is None:
            raise ValueError("gelu_in (the saved pre-activation) is required with grad=True and gelu=True")
        _check_float(gelu_in, "gelu_in", device)
        if _matrix(gelu_in.shape) != (m, n):
            raise ValueError(f"gelu_in shape {tuple(gelu_in.shape)} must flatten to [{m}, {n}] like the output")
        aux = gelu_in
        if bias is not None:
            bias_grad = torch.empty(n, dtype=bias.dtype, device=device)
        epilogue = _EPI.DGELU_BGRAD if bias is not None else _EPI.DGELU
    else:
        if bias is not None:
            bias_grad = torch.empty(m, dtype=bias.dtype, device=device)
        epilogue = _EPI.BGRAD if bias is not None else _EPI.NONE

    # ---- workspace: cuBLASLt's scratch; the CPU needs none ----------------------
    ws_ptr = ws_size = 0
    if device.type == "cuda":
        if not isinstance(workspace, torch.Tensor):
            raise TypeError(f"workspace must be a torch.Tensor of at least {get_cublas_workspace_size_bytes()} "
                            f"bytes on {device}, got {type(workspace).__name__}")
        if workspace.device != device:
            raise ValueError(f"workspace is on {workspace.device} but A is on {device}")
        if not workspace.is_contiguous():
            raise ValueError("workspace must be contiguous")
        ws_ptr, ws_size = workspace.data_ptr(), workspace.numel() * workspace.element_size()

    _core.gemm(
        a_desc, b_desc, d_desc,
        describe(bias_arg, "bias") if bias_arg is not None else None,
        describe(aux, "gelu_in" if grad else "gelu_input") if aux is not None else None,
        describe(bias_grad, "bias_grad") if bias_grad is not None else None,
        transa, transb, int(epilogue), float(alpha), float(beta), bool(use_split_accumulator),
        ws_ptr, ws_size, stream_of(a_stored),
    )
    return result, bias_grad, aux, None

