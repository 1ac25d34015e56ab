"""LayerNorm and RMSNorm (forward and backward) against the device's copy
bandwidth and against PyTorch, in one run.

    python3 benchmarks/bench_norm.py            # needs a CUDA GPU
    python3 benchmarks/bench_norm.py --weight-dtype fp32   # gamma and beta in fp32
    python3 benchmarks/bench_norm.py --x-dtype fp16        # x, dz (and the weights) in fp16

Bytes counted (16-bit x, [rows, hidden]): forward reads x and writes y
(2 + 2 bytes an element; 2 + 1 with an FP8 y, 2 + 1 + 1 with its transposed copy
too, what LayerNormLinear and LayerNormMLP ask for in FP8 training under delayed
scaling; a bf16 y "and its amax", the max|y| a current-scaling cast of y needs, taken
as the kernel writes y: the same 2 + 2 bytes); backward reads
dz and x and writes dx (6 bytes an element); the statistics and the [hidden] vectors
are left out. The weights are in x's dtype (bf16 by default) unless ``--weight-dtype
fp32`` gives them Transformer Engine's default params_dtype (torch.get_default_dtype():
fp32), as a bf16 model trained under autocast keeps them (PyTorch's ops take copies of
them in x's dtype: its layer_norm would give an fp32 y for fp32 weights). PyTorch does
the same work with F.layer_norm / F.rms_norm (forward; for an FP8 y then amax and the scaled cast, and for
the transposed copy ``.t().contiguous()``; for the amax ``y.abs().amax()``, a second
pass) and their autograd backward (timed as backward of a saved graph, dx and dweight).

Each call takes the next of three copies of its inputs: the time of one memory-bound
kernel moved by up to 30% between runs with a single set of buffers (H100), with
where they lay. The same-bytes copy takes as many sources in turn (timing.copy_bandwidth
says why).
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
from timing import add_ops_argument, print_bandwidth_table

from transformer_engine.pytorch.cpp_extensions import layernorm_bwd, layernorm_fwd, module_ops, rmsnorm_bwd, rmsnorm_fwd


def rotating(fn, inputs):
    """A call of fn on the next of `inputs` (argument tuples) each time."""
    args = itertools.cycle(inputs)
    return lambda: fn(*next(args))


def torch_fp8(y, scale, amax):
    """PyTorch's way to an FP8 y with delayed scaling: amax, then the scaled cast."""
    torch.maximum(amax, y.abs().amax().float(), out=amax)
    return (y.float() * scale).to(torch.float8_e4m3fn)


def torch_amax(y, amax):
    """PyTorch's max|y| of a norm output, raised into ``amax``: a second read of y."""
    torch.maximum(amax, y.abs().amax().float(), out=amax)
    return y


def with_transpose(y_fp8):
    """The FP8 y with its transposed copy, as the FP8 GEMMs of the backward read it."""
    return y_fp8, y_fp8.t().contiguous()


# Copies of the inputs the calls cycle over, so that no call finds its x and dz in the L2
# from the call before (the same-bytes copy cycles over as many: timing.copy_bandwidth)
INPUT_COPIES = 3


def cases(rows: int, hidden: int, weight_dtype: torch.dtype, x_dtype: torch.dtype = torch.bfloat16):
    copies = []
    for _ in range(INPUT_COPIES):
        x = torch.randn(rows, hidden, device="cuda", dtype=x_dtype)
        copies.append((x, torch.randn_like(x)))
    w = torch.rand(hidden, device="cuda", dtype=weight_dtype) + 0.5
    b = torch.randn(hidden, device="cuda", dtype=weight_dtype)
    tw, tb = w.to(x_dtype), b.to(x_dtype)  # PyTorch's: a y in x's dtype, as ours
    scale, amax = torch.ones(1, device="cuda"), torch.zeros(1, device="cuda")
    eps, shape = 1e-5, (hidden,)
    fwd, bwd = [], []
    for x, dz in copies:
        _, mu, rs = layernorm_fwd(x, w, b, eps)
        _, _, rs_rms = rmsnorm_fwd(x, w, eps)
        xg = x.detach().requires_grad_()
        wg, bg = tw.detach().requires_grad_(), tb.detach().requires_grad_()
        fwd.append((x,))
        bwd.append((dz, x, mu, rs, rs_rms, xg, wg, bg, F.layer_norm(xg, shape, wg, bg, eps),
                    F.rms_norm(xg, shape, wg, eps)))
    n = copies[0][0].numel()
    fp8 = dict(fp8_dtype=torch.float8_e4m3fn, scale=scale, amax=amax)
    dev = module_ops.core_device(copies[0][0])

    def with_amax(layernorm: bool):  # the modules' call under current scaling (module_ops.FusedAmax)
        return lambda x: module_ops.norm_forward(layernorm, x, w, b if layernorm else None, eps, False, dev,
                                                 amax=amax.data_ptr())
    yield ("layernorm fwd", 4 * n, rotating(lambda x: layernorm_fwd(x, w, b, eps), fwd),
           rotating(lambda x: F.layer_norm(x, shape, tw, tb, eps), fwd))
    yield ("layernorm fwd, and its amax", 4 * n, rotating(with_amax(True), fwd),
           rotating(lambda x: torch_amax(F.layer_norm(x, shape, tw, tb, eps), amax), fwd))
    yield ("layernorm fwd, FP8 y", 3 * n, rotating(lambda x: layernorm_fwd(x, w, b, eps, **fp8), fwd),
           rotating(lambda x: torch_fp8(F.layer_norm(x, shape, tw, tb, eps), scale, amax), fwd))
    yield ("layernorm fwd, FP8 y and y^T", 4 * n,
           rotating(lambda x: layernorm_fwd(x, w, b, eps, columnwise=True, **fp8), fwd),
           rotating(lambda x: with_transpose(torch_fp8(F.layer_norm(x, shape, tw, tb, eps), scale, amax)), fwd))
    yield ("layernorm bwd", 6 * n, rotating(lambda dz, x, mu, rs, *_: layernorm_bwd(dz, x, mu, rs, w), bwd),
           rotating(lambda dz, x, mu, rs, rs_rms, xg, wg, bg, y_ln, y_rms:
                    torch.autograd.grad(y_ln, (xg, wg, bg), dz, retain_graph=True), bwd))
    yield ("rmsnorm fwd", 4 * n, rotating(lambda x: rmsnorm_fwd(x, w, eps), fwd),
           rotating(lambda x: F.rms_norm(x, shape, tw, eps), fwd))
    yield ("rmsnorm fwd, and its amax", 4 * n, rotating(with_amax(False), fwd),
           rotating(lambda x: torch_amax(F.rms_norm(x, shape, tw, eps), amax), fwd))
    yield ("rmsnorm fwd, FP8 y", 3 * n, rotating(lambda x: rmsnorm_fwd(x, w, eps, **fp8), fwd),
           rotating(lambda x: torch_fp8(F.rms_norm(x, shape, tw, eps), scale, amax), fwd))
    yield ("rmsnorm fwd, FP8 y and y^T", 4 * n,
           rotating(lambda x: rmsnorm_fwd(x, w, eps, columnwise=True, **fp8), fwd),
           rotating(lambda x: with_transpose(torch_fp8(F.rms_norm(x, shape, tw, eps), scale, amax)), fwd))
    yield ("rmsnorm bwd", 6 * n, rotating(lambda dz, x, mu, rs, rs_rms, *_: rmsnorm_bwd(dz, x, rs_rms, w), bwd),
           rotating(lambda dz, x, mu, rs, rs_rms, xg, wg, bg, y_ln, y_rms:
                    torch.autograd.grad(y_rms, (xg, wg), dz, retain_graph=True), bwd))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--weight-dtype", choices=("x", "bf16", "fp32"), default="x",
                        help="gamma and beta's dtype (x: x's)")
    parser.add_argument("--x-dtype", choices=("bf16", "fp16"), default="bf16", help="x's (and dz's) dtype")
    # the first four since the first session; then the widths where the README names gaps
    parser.add_argument("--shapes", default="16384x4096,8192x8192,32768x1024,4096x16384,"
                                            "16384x768,16384x2048,8192x5120,4096x12288")
    add_ops_argument(parser)
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    x_dtype = torch.float16 if args.x_dtype == "fp16" else torch.bfloat16
    weight_dtype = {"x": x_dtype, "bf16": torch.bfloat16, "fp32": torch.float32}[args.weight_dtype]
    rows = ((name, f"{r} x {h}", nbytes, ours, theirs) for r, h in shapes
            for name, nbytes, ours, theirs in cases(r, h, weight_dtype, x_dtype))
    weights = "" if weight_dtype == x_dtype else f", {args.weight_dtype} weights"
    header = f"rows x hidden ({args.x_dtype}{weights})"
    print_bandwidth_table("bench_norm.py", rows, args.iters, header, args.ops, input_copies=INPUT_COPIES)

if __name__ == "__main__":
    main()
