"""Throughput of OpenTE's GEMM (cuBLASLt) side by side with PyTorch's, in one run.

    python3 benchmarks/bench_gemm.py            # needs a CUDA GPU

Shapes are (M, K, N): out[M, N] = X[M, K] @ W[N, K]^T, the forward GEMM of a Linear
layer (layout "TN"), 2*M*N*K FLOPs. Rows:
  bf16              _core.gemm vs torch.matmul(x, w.t())
  fp8 e4m3          E4M3 x E4M3 with per-tensor scales, bf16 out, fast accumulation
                    (use_split_accumulator=False) vs torch._scaled_mm(use_fast_accum=True)
  bf16 +bias+gelu   the fused GELU_AUX_BIAS epilogue (writes the pre-activation too, as
                    Transformer Engine's forward does) vs matmul, + bias, F.gelu(tanh): three kernels
The binding is called with descriptors built once, so Python helper overhead is not timed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import time_pair_us

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe

E4M3 = _core.DType.kFloat8E4M3
PER_TENSOR = _core.ScalingMode.PER_TENSOR
EPI = _core.GemmEpilogue
SHAPES = "8192x8192x8192,16384x4096x16384,16384x16384x4096,4096x4096x4096,2048x2048x8192,16384x4096x12288"


def fp8_desc(q: torch.Tensor, scale_inv: torch.Tensor) -> _core.Tensor:
    """An E4M3 operand with its row-wise data only: "TN" reads no transposed copy."""
    dev = describe(q.view(torch.uint8), "q").device
    return _core.Tensor(*dev, int(E4M3), list(q.shape), q.data_ptr(), 0, 0, scale_inv.data_ptr(), 0,
                        int(PER_TENSOR))


def bench_shape(m: int, k: int, n: int, iters: int):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)  # [tokens, in]
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5  # [out, in]
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    aux = torch.empty_like(y)
    ws = torch.empty(_core.gemm_workspace_size(), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream

    # FP8 copies with per-tensor scales (values ~N(0, 1) scaled to use E4M3's range).
    x_scale, w_scale = torch.tensor([448.0 / 5]), torch.tensor([448.0 / 5 * k**0.5])
    x8 = (x.float() * x_scale.cuda()).clamp(-448, 448).to(torch.float8_e4m3fn)  # the cast saturates, as ours
    w8 = (w.float() * w_scale.cuda()).clamp(-448, 448).to(torch.float8_e4m3fn)
    x_si, w_si = (1 / x_scale).cuda(), (1 / w_scale).cuda()

    x_d, w_d, y_d = describe(x, "x"), describe(w, "w"), describe(y, "y")
    bias_d, aux_d = describe(bias, "bias"), describe(aux, "aux")
    x8_d, w8_d = fp8_desc(x8, x_si), fp8_desc(w8, w_si)
    ws_args = (ws.data_ptr(), ws.numel(), stream)

    def ours(a, b, epilogue=EPI.NONE, bias_arg=None, aux_arg=None):
        return lambda: _core.gemm(a, b, y_d, bias_arg, aux_arg, None, True, False, int(epilogue), 1.0, 0.0, False,
                                  *ws_args)

    cases = [
        ("bf16", ours(w_d, x_d), lambda: torch.matmul(x, w.t())),
        ("fp8 e4m3", ours(w8_d, x8_d),
         lambda: torch._scaled_mm(x8, w8.t(), scale_a=x_si, scale_b=w_si, out_dtype=torch.bfloat16,
                                  use_fast_accum=True)),
        ("bf16 +bias+gelu", ours(w_d, x_d, EPI.GELU_AUX_BIAS, bias_d, aux_d),
         lambda: F.gelu(torch.matmul(x, w.t()) + bias, approximate="tanh")),
    ]
    flops = 2 * m * n * k
    for name, our_fn, torch_fn in cases:
        ours_us, torch_us = time_pair_us(our_fn, torch_fn, iters)
        yield name, ours_us, flops / ours_us * 1e-6, torch_us, flops / torch_us * 1e-6


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated MxKxN")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not _core.built_with_cuda():
        raise SystemExit("bench_gemm.py needs a CUDA GPU and a CUDA build of OpenTE")

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, median of {args.iters} calls "
          "(5 alternating rounds of each)")
    header = ("GEMM", "M x K x N", "OpenTE us", "OpenTE TFLOP/s", "PyTorch us", "PyTorch TFLOP/s",
              "speed-up (PyTorch us / OpenTE us)")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for m, k, n in (map(int, s.split("x")) for s in args.shapes.split(",")):
        for name, us, tflops, torch_us, torch_tflops in bench_shape(m, k, n, args.iters):
            print(f"| {name} | {m} x {k} x {n} | {us:.1f} | {tflops:.0f} | {torch_us:.1f} | {torch_tflops:.0f} "
                  f"| {torch_us / us:.2f}x |")


if __name__ == "__main__":
    main()
