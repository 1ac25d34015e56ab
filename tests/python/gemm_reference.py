"""What general_gemm must compute, in plain torch, and the test data for it.

Nothing here calls the GEMM under test. ``reference`` works in float64 on the
exactly dequantized inputs; ``torch_same_precision`` is what PyTorch itself
gets for the same computation in the inputs' precision (fp32 accumulation, the
epilogue in fp32, the outputs rounded to their dtypes): the yardstick of the
CUDA tests (DESIGN.md's rule: our error <= k x PyTorch's error + small atol).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp8_reference import FP8_MAX, TORCH_FP8
from transformer_engine.pytorch.cpp_extensions import DType
from transformer_engine.pytorch.tensor import Float8TensorBase

E4M3, E5M2 = DType.kFloat8E4M3, DType.kFloat8E5M2
LAYOUTS = ["TN", "NN", "NT"]
# Unit roundoff (half an ulp, relative) of each output format.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, E4M3: 2.0**-4,
                 E5M2: 2.0**-3}
FP8_MIN_NORMAL = {E4M3: 2.0**-6, E5M2: 2.0**-14}
_GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x):
    """Transformer Engine's tanh GELU."""
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * (x + 0.044715 * x**3)))


def dgelu(x):
    """d gelu(x) / dx of the tanh form."""
    t = torch.tanh(_GELU_C * (x + 0.044715 * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * x * x)


def as_matrix(t: torch.Tensor) -> torch.Tensor:
    """[d_0 * ... * d_{n-2}, d_{n-1}], as the GEMM flattens its operands."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def values(x, dtype=torch.float64) -> torch.Tensor:
    """The exact values of an operand or result: a float tensor, or FP8 bits times scale_inv."""
    if isinstance(x, Float8TensorBase):
        if x._data is not None:
            bits = x._data
        else:  # undo the column-wise layout [d_{n-1}, rest] -> [rest, d_{n-1}]
            shape = x.size()
            bits = x._transpose.reshape(shape[-1], -1).t().reshape(shape)
        return bits.view(TORCH_FP8[x._fp8_dtype]).to(dtype) * x._scale_inv.to(dtype)
    return x.to(dtype)


def fp8_operand(shape, fp8_dtype, gen, device="cpu") -> Float8TensorBase:
    """Random FP8 data (both copies) with a scale that is not a power of two, so the
    scale_inv factors matter; values spread over about 2^-6 .. 2^3 of FP8's max."""
    x = torch.randn(shape, generator=gen) * torch.exp2(torch.rand(shape, generator=gen) * 4 - 2)
    scale = FP8_MAX[fp8_dtype] / (float(x.abs().max()) * 1.37) if x.numel() else 3.0
    bits = torch.clamp(x * scale, -FP8_MAX[fp8_dtype], FP8_MAX[fp8_dtype]).to(TORCH_FP8[fp8_dtype]).view(torch.uint8)
    rows = math.prod(shape[:-1])
    data_t = bits.reshape(rows, shape[-1]).t().contiguous().reshape(shape[-1], *shape[:-1])
    scale_inv = torch.reciprocal(torch.tensor([scale], dtype=torch.float32))
    return Float8TensorBase(data=bits.to(device), data_transpose=data_t.to(device),
                            fp8_scale_inv=scale_inv.to(device), fp8_dtype=fp8_dtype)


def to_device(x, device):
    if isinstance(x, Float8TensorBase):
        move = lambda t: t.to(device) if t is not None else None  # noqa: E731
        return Float8TensorBase(data=move(x._data), data_transpose=move(x._transpose),
                                fp8_scale_inv=x._scale_inv.to(device), fp8_dtype=x._fp8_dtype)
    return x.to(device) if isinstance(x, torch.Tensor) else x


def operand_shapes(m, k, n, layout):
    """Storage shapes of A and B such that op_A(A) is [k, n] and op_B(B) is [m, k]."""
    a = (n, k) if layout[0] == "T" else (k, n)
    b = (k, m) if layout[1] == "T" else (m, k)
    return a, b


@dataclass
class Call:
    """The epilogue arguments of one general_gemm call (None: not passed)."""

    alpha: float = 1.0
    beta: float | None = None
    accumulate: bool = False
    out0: torch.Tensor | None = None  # out's contents before an accumulating call
    bias: torch.Tensor | None = None
    gelu: bool = False
    gelu_in: torch.Tensor | None = None
    grad: bool = False

    def kwargs(self, device):
        return dict(alpha=self.alpha, beta=self.beta, accumulate=self.accumulate, gelu=self.gelu,
                    grad=self.grad, bias=to_device(self.bias, device), gelu_in=to_device(self.gelu_in, device),
                    out=to_device(self.out0.clone(), device) if self.out0 is not None else None)  # written to


def _epilogue(prod, op_b, call: Call, dtype):
    """Applies general_gemm's epilogue to prod = op_B(B) @ op_A(A) [m, n] in ``dtype``."""
    beta = call.beta if call.beta is not None else (1.0 if call.accumulate else 0.0)
    p = call.alpha * prod
    if call.accumulate:
        p = p + beta * as_matrix(call.out0).to(p.device, dtype)
    bias = call.bias.to(p.device, dtype) if call.bias is not None else None
    res = {"p": p}
    if not call.grad:
        if bias is not None:
            p = p + bias
        if call.gelu:
            res["gelu_input"] = p
            p = gelu(p)
    elif call.gelu:
        p = p * dgelu(as_matrix(call.gelu_in).to(p.device, dtype))
        if bias is not None:
            res["bias_grad"] = p.sum(0)  # [n]: sum over rows of the dGELU output
    elif bias is not None:
        res["bias_grad"] = op_b.to(dtype).sum(1)  # [m]: sum over k of op_B(B)
    res["out"] = p
    return res


def _ops(A, B, layout, dtype):
    a, b = as_matrix(values(A, dtype)), as_matrix(values(B, dtype))
    return (a.t() if layout[0] == "T" else a), (b.t() if layout[1] == "T" else b)


def reference(A, B, layout, call: Call):
    """float64 results ("out", and "gelu_input" / "bias_grad" where produced), "p": the
    product before bias and GELU (alpha op_B(B) @ op_A(A) + beta out0), and "scale" [m, n]: the magnitude that rounding errors of the accumulation scale with,
    |alpha| |op_B(B)| @ |op_A(A)| + |beta * out0| + |bias|; "rowsum_b" [m] = sum_k |op_B(B)|."""
    op_a, op_b = _ops(A, B, layout, torch.float64)
    res = _epilogue(op_b @ op_a, op_b, call, torch.float64)
    scale = abs(call.alpha) * (op_b.abs() @ op_a.abs())
    if call.accumulate:
        beta = call.beta if call.beta is not None else 1.0
        scale = scale + abs(beta) * as_matrix(call.out0).to(scale.device, torch.float64).abs()
    if call.bias is not None and not call.grad:
        scale = scale + call.bias.to(scale.device, torch.float64).abs()
    res["scale"] = scale
    res["rowsum_b"] = op_b.abs().sum(1)
    return res


def torch_same_precision(A, B, layout, call: Call, out_dtype, fp8_out_scale=None, use_split_accumulator=False):
    """PyTorch's result for the same work in the same precision, as float64 (CUDA only):
    torch._scaled_mm for FP8 inputs (the dequantized bf16 product where it is missing),
    torch.mm with fp32 accumulation otherwise; epilogue in fp32; outputs rounded."""
    op_b = None
    if isinstance(A, Float8TensorBase):
        if hasattr(torch, "_scaled_mm"):
            # _scaled_mm takes op_B(B) [m, k] row-major and op_A(A) [k, n] column-major,
            # i.e. both stored k-contiguous: the "TN" form, as cuBLASLt wants it.
            b_rows = B._data if layout[1] == "N" else B._transpose
            a_rows = A._data if layout[0] == "T" else A._transpose
            b8 = as_matrix(b_rows).view(TORCH_FP8[B._fp8_dtype])
            a8 = as_matrix(a_rows).view(TORCH_FP8[A._fp8_dtype])
            prod = torch._scaled_mm(b8, a8.t(), scale_a=B._scale_inv, scale_b=A._scale_inv,
                                    out_dtype=torch.float32, use_fast_accum=not use_split_accumulator)
        else:
            a, b = _ops(A, B, layout, torch.bfloat16)
            prod = torch.mm(b, a, out_dtype=torch.float32)
        op_b = _ops(A, B, layout, torch.float32)[1]
    else:
        op_a, op_b = _ops(A, B, layout, A.dtype)
        prod = torch.mm(op_b, op_a) if A.dtype == torch.float32 else torch.mm(op_b, op_a, out_dtype=torch.float32)
    res = _epilogue(prod, op_b, call, torch.float32)
    if fp8_out_scale is not None:  # quantize like a cast: x * scale, RNE, saturate
        fmax = FP8_MAX[out_dtype]
        q = torch.clamp(res["out"] * fp8_out_scale, -fmax, fmax).to(TORCH_FP8[out_dtype])
        res["out"] = q.double() * torch.reciprocal(fp8_out_scale).double()
        aux_dtype = call.bias.dtype if call.bias is not None else torch.bfloat16
    else:
        res["out"] = res["out"].to(out_dtype).double()
        aux_dtype = out_dtype
    if "gelu_input" in res:
        res["gelu_input"] = res["gelu_input"].to(aux_dtype).double()
    if "bias_grad" in res:
        res["bias_grad"] = res["bias_grad"].to(call.bias.dtype).double()
    return res
