"""Bandwidth of OpenTE's FP8 cast kernels, side by side with the device's copy
bandwidth and with the same work done in plain PyTorch, in one run.

    python3 benchmarks/bench_quantize.py            # needs a CUDA GPU

Bytes counted per element (bf16 input): quantize 2 read + 1 written, cast+transpose
2 + 1 + 1, dequantize 1 + 2, amax 2, the transpose of FP8 bytes 1 + 1. The PyTorch
baselines do the same work: amax then cast for quantize (plus .t().contiguous() for
cast+transpose), (q.float() * scale_inv).bfloat16() for dequantize, x.abs().amax()
for amax, q.t().contiguous() for the transpose.
"""

from __future__ import annotations

import argparse

import torch
from timing import copy_bandwidth, time_us

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe

E4M3 = _core.DType.kFloat8E4M3
PER_TENSOR = _core.ScalingMode.PER_TENSOR


def bench_shape(rows: int, cols: int, copy_bw: float, same_size_bw: float, iters: int):
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 3
    n = x.numel()
    stream = torch.cuda.current_stream().cuda_stream
    scale = torch.full((1,), 448.0 / 16, device="cuda")
    scale_inv = torch.empty(1, device="cuda")
    amax = torch.zeros(1, device="cuda")
    q = torch.empty(rows, cols, dtype=torch.uint8, device="cuda")
    q_t = torch.empty(cols, rows, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)

    x_desc = describe(x, "x")
    dev = x_desc.device
    rowwise = _core.Tensor(*dev, int(E4M3), [rows, cols], q.data_ptr(), 0, scale.data_ptr(), scale_inv.data_ptr(),
                           amax.data_ptr(), int(PER_TENSOR))
    both = _core.Tensor(*dev, int(E4M3), [rows, cols], q.data_ptr(), q_t.data_ptr(), scale.data_ptr(),
                        scale_inv.data_ptr(), amax.data_ptr(), int(PER_TENSOR))
    fp8_in = _core.Tensor(*dev, int(E4M3), [rows, cols], q.data_ptr(), 0, 0, scale_inv.data_ptr(), 0,
                          int(PER_TENSOR))
    y_desc = describe(y, "y")
    q_desc, q_t_desc = describe(q, "q"), describe(q_t, "q_t")

    def torch_quantize():
        torch.amax(x.abs())
        return (x.float() * scale).to(torch.float8_e4m3fn)

    cases = [
        ("quantize", 3 * n, lambda: _core.quantize(x_desc, rowwise, stream), torch_quantize),
        ("cast+transpose", 4 * n, lambda: _core.quantize(x_desc, both, stream),
         lambda: torch_quantize().t().contiguous()),
        ("dequantize", 3 * n, lambda: _core.dequantize(fp8_in, y_desc, stream),
         lambda: (q.view(torch.float8_e4m3fn).float() * scale_inv).to(torch.bfloat16)),
        ("amax", 2 * n, lambda: _core.compute_amax(x_desc, amax.data_ptr(), stream), lambda: torch.amax(x.abs())),
        ("transpose (FP8 bytes)", 2 * n, lambda: _core.transpose(q_desc, q_t_desc, stream),
         lambda: q.t().contiguous()),
    ]
    rows_out = []
    for name, nbytes, ours, baseline in cases:
        ours_us = time_us(ours, iters)
        torch_us = time_us(baseline, iters)
        bw = nbytes / (ours_us * 1e-6)
        rows_out.append((name, f"{rows}x{cols}", ours_us, bw / 1e9, bw / copy_bw, bw / same_size_bw, torch_us,
                         torch_us / ours_us))
    return rows_out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default="8192x8192,16384x4096", help="comma-separated ROWSxCOLS")
    args = parser.parse_args()
    if not torch.cuda.is_available() or not _core.built_with_cuda():
        raise SystemExit("bench_quantize.py needs a CUDA GPU and a CUDA build of OpenTE")

    # The ceiling: a 1 GiB copy. A copy of the input's size shows how much of any
    # gap is the fixed cost of a ~50 us kernel (launch, ramp-up, tail).
    copy_bw = copy_bandwidth(1 << 30, args.iters)
    same_size_bw = copy_bandwidth(8192 * 8192 * 2, args.iters)
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth (read+write): {copy_bw / 1e9:.0f} GB/s "
          f"(1 GiB), {same_size_bw / 1e9:.0f} GB/s (128 MiB, the size of one bf16 input)")
    header = ("op", "shape (bf16)", "OpenTE us", "GB/s", "of copy BW (1 GiB)", "of copy BW (128 MiB)",
              "PyTorch us", "speed-up")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for rows, cols in (map(int, shape.split("x")) for shape in args.shapes.split(",")):
        for name, shape, us, gbs, frac, frac_same, torch_us, speedup in bench_shape(rows, cols, copy_bw,
                                                                                     same_size_bw, args.iters):
            print(f"| {name} | {shape} | {us:.1f} | {gbs:.0f} | {frac:.1%} | {frac_same:.1%} | {torch_us:.1f} "
                  f"| {speedup:.2f}x |")


if __name__ == "__main__":
    main()
