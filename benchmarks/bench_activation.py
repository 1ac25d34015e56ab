"""Activations (forward, backward) and the fused bias-gradient casts against the
device's copy bandwidth and against plain PyTorch doing the same work, in one run.

    python3 benchmarks/bench_activation.py            # needs a CUDA GPU

Shapes: x [rows, hidden] bf16 (default 16384 x 4096); the gated kinds read [rows, 2 hidden].
Bytes counted, n = rows * hidden (the [hidden] dbias and the scalars left out):
  gelu fwd -> bf16           2n read + 2n written; "and its amax": the same bytes, the
                             kernel also taking max|y| for a current-scaling cast after it
                             (PyTorch: y.abs().amax(), a second pass)
  gelu fwd -> FP8            2n + n;  with the transposed copy 2n + 2n
  swiglu fwd -> bf16 / FP8   4n + 2n / 4n + n
  dgelu (bwd)                grad 2n + x 2n read, dx 2n written (and its amax, as above)
  dswiglu (bwd)              grad 2n + x 4n read, dx 4n written
  dgelu+dbias+cast+transpose grad 2n + x 2n read, dx FP8 n + its transpose n written
  dbias+cast+transpose       grad 2n read, FP8 n + transpose n written
  the same, current scaling  likewise 4n (the amax is a second read of grad, not counted:
                             the table shows what that pass costs); "separate" rows are
                             the cast of te_quantize_current_scaling, then grad.sum(0)
Ours run through _core with descriptors prepared once (as bench_quantize.py), so the
times are the kernels'. PyTorch does the same work the plain way: F.gelu(x,
approximate="tanh") or F.silu(a) * b, then (y.float() * s).to(torch.float8_e4m3fn) for
FP8 (plus .t().contiguous() for the transposed copy); the backward through autograd of a
saved graph; the fused casts as autograd's dx, dx.sum(0), the cast to E5M2 and
.t().contiguous() (PyTorch computes no amax in any of these; ours does).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import add_ops_argument, print_bandwidth_table

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe

E4M3, E5M2 = _core.DType.kFloat8E4M3, _core.DType.kFloat8E5M2
PER_TENSOR = _core.ScalingMode.PER_TENSOR
A = _core.Activation


def fp8_desc(dev, dtype, shape, data, data_t, scale, scale_inv, amax):
    return _core.Tensor(*dev, int(dtype), list(shape), data.data_ptr() if data is not None else 0,
                        data_t.data_ptr() if data_t is not None else 0, scale.data_ptr(), scale_inv.data_ptr(),
                        amax.data_ptr(), int(PER_TENSOR))


def cases(rows: int, hidden: int):
    bf16, cuda = torch.bfloat16, "cuda"
    n = rows * hidden
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.randn(rows, hidden, device=cuda, dtype=bf16) * 2
    xg = torch.randn(rows, 2 * hidden, device=cuda, dtype=bf16) * 2  # gated input [a | b]
    grad = torch.randn(rows, hidden, device=cuda, dtype=bf16)
    s = torch.full((1,), 16.0, device=cuda)
    scale_inv, amax = torch.empty(1, device=cuda), torch.zeros(1, device=cuda)
    q = torch.empty(rows, hidden, dtype=torch.uint8, device=cuda)
    q_t = torch.empty(hidden, rows, dtype=torch.uint8, device=cuda)
    y = torch.empty(rows, hidden, dtype=bf16, device=cuda)
    dx = torch.empty(rows, hidden, dtype=bf16, device=cuda)
    dxg = torch.empty(rows, 2 * hidden, dtype=bf16, device=cuda)
    dbias = torch.empty(hidden, dtype=bf16, device=cuda)
    ws_size = _core.dbias_workspace_size(rows, hidden, int(_core.DeviceType.CUDA), x.device.index or 0)
    ws = torch.empty(ws_size, dtype=torch.uint8, device=cuda)

    x_d, xg_d, grad_d = describe(x, "x"), describe(xg, "xg"), describe(grad, "grad")
    dev = x_d.device
    y_d, dx_d, dxg_d, dbias_d = describe(y, "y"), describe(dx, "dx"), describe(dxg, "dxg"), describe(dbias, "dbias")
    rowwise = fp8_desc(dev, E4M3, (rows, hidden), q, None, s, scale_inv, amax)
    both = fp8_desc(dev, E4M3, (rows, hidden), q, q_t, s, scale_inv, amax)
    both_e5m2 = fp8_desc(dev, E5M2, (rows, hidden), q, q_t, s, scale_inv, amax)

    def gelu(t):
        return F.gelu(t, approximate="tanh")

    def swiglu(t):
        a, b = t.chunk(2, -1)
        return F.silu(a) * b

    def to_fp8(t, dtype=torch.float8_e4m3fn):
        return (t.float() * s).to(dtype)

    x_req, xg_req = x.detach().requires_grad_(), xg.detach().requires_grad_()
    y_gelu, y_swiglu = gelu(x_req), swiglu(xg_req)

    def torch_dgelu():
        return torch.autograd.grad(y_gelu, x_req, grad, retain_graph=True)[0]

    def torch_dgelu_dbias_cast_transpose():
        d = torch_dgelu()
        q8 = to_fp8(d, torch.float8_e5m2)
        return d.sum(0), q8, q8.t().contiguous()

    def torch_dbias_cast_transpose():
        q8 = to_fp8(grad, torch.float8_e5m2)
        return grad.sum(0), q8, q8.t().contiguous()

    # Current scaling: the scale from grad's amax, computed on the device.
    cs_scale, cs_amax = torch.empty(1, device=cuda), torch.empty(1, device=cuda)
    both_e5m2_current = fp8_desc(dev, E5M2, (rows, hidden), q, q_t, cs_scale, scale_inv, cs_amax)

    def torch_dbias_cast_transpose_current():
        scale = 57344.0 / grad.abs().amax().float()
        q8 = (grad.float() * scale).to(torch.float8_e5m2)
        return grad.sum(0), q8, q8.t().contiguous()

    def separate_cast_then_sum():
        _core.quantize_current_scaling(grad_d, both_e5m2_current, 0.0, False, stream)
        return grad.sum(0)

    # The amax a current-scaling cast of the output needs, taken as the kernel writes it
    # (module_ops.FusedAmax); PyTorch: a second pass, .abs().amax().
    fused_amax = torch.zeros(1, device=cuda)
    y_amax_d = _core.Tensor(*dev, int(y_d.dtype), [rows, hidden], y.data_ptr(), amax=fused_amax.data_ptr())
    dx_amax_d = _core.Tensor(*dev, int(dx_d.dtype), [rows, hidden], dx.data_ptr(), amax=fused_amax.data_ptr())

    gelu_k, swiglu_k = int(A.GELU), int(A.SWIGLU)
    yield ("gelu fwd -> bf16", 4 * n, lambda: _core.activation_fwd(gelu_k, x_d, y_d, stream), lambda: gelu(x))
    yield ("gelu fwd -> bf16 and its amax", 4 * n, lambda: _core.activation_fwd(gelu_k, x_d, y_amax_d, stream),
           lambda: gelu(x).abs().amax())
    yield ("gelu fwd -> FP8", 3 * n, lambda: _core.activation_fwd(gelu_k, x_d, rowwise, stream),
           lambda: to_fp8(gelu(x)))
    yield ("gelu fwd -> FP8 + transpose", 4 * n, lambda: _core.activation_fwd(gelu_k, x_d, both, stream),
           lambda: to_fp8(gelu(x)).t().contiguous())
    yield ("swiglu fwd -> bf16", 6 * n, lambda: _core.activation_fwd(swiglu_k, xg_d, y_d, stream), lambda: swiglu(xg))
    yield ("swiglu fwd -> FP8", 5 * n, lambda: _core.activation_fwd(swiglu_k, xg_d, rowwise, stream),
           lambda: to_fp8(swiglu(xg)))
    yield ("dgelu (bwd)", 6 * n, lambda: _core.activation_bwd(gelu_k, grad_d, x_d, dx_d, stream), torch_dgelu)
    yield ("dgelu (bwd) and its amax", 6 * n, lambda: _core.activation_bwd(gelu_k, grad_d, x_d, dx_amax_d, stream),
           lambda: torch_dgelu().abs().amax())
    yield ("dswiglu (bwd)", 10 * n, lambda: _core.activation_bwd(swiglu_k, grad_d, xg_d, dxg_d, stream),
           lambda: torch.autograd.grad(y_swiglu, xg_req, grad, retain_graph=True))
    yield ("dgelu+dbias+cast+transpose (E5M2)", 6 * n,
           lambda: _core.dact_dbias_cast_transpose(gelu_k, grad_d, x_d, both_e5m2, dbias_d, ws.data_ptr(), ws_size,
                                                   stream),
           torch_dgelu_dbias_cast_transpose)
    yield ("dbias+cast+transpose (E5M2)", 4 * n,
           lambda: _core.dbias_cast_transpose(grad_d, both_e5m2, dbias_d, ws.data_ptr(), ws_size, stream),
           torch_dbias_cast_transpose)
    yield ("dbias+cast+transpose, current scaling (E5M2)", 4 * n,
           lambda: _core.dbias_cast_transpose_current_scaling(grad_d, both_e5m2_current, dbias_d, 0.0, False,
                                                              ws.data_ptr(), ws_size, stream),
           torch_dbias_cast_transpose_current)
    yield ("the same, separate cast and grad.sum(0)", 4 * n, separate_cast_then_sum,
           torch_dbias_cast_transpose_current)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default="16384x4096", help="comma-separated ROWSxHIDDEN")
    add_ops_argument(parser)
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    rows = ((name, f"{r} x {h}", nbytes, ours, theirs) for r, h in shapes
            for name, nbytes, ours, theirs in cases(r, h))
    print_bandwidth_table("bench_activation.py", rows, args.iters, "rows x hidden (bf16)", args.ops)

if __name__ == "__main__":
    main()
