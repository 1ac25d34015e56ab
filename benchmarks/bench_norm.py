"""LayerNorm and RMSNorm (forward and backward) against the device's copy
bandwidth and against PyTorch, in one run.

    python3 benchmarks/bench_norm.py            # needs a CUDA GPU

Bytes counted (bf16 x and weights, [rows, hidden]): forward reads x and writes y
(2 + 2 bytes an element); backward reads dz and x and writes dx (6 bytes an
element); the statistics and the [hidden] vectors are left out. PyTorch does the
same work with F.layer_norm / F.rms_norm (forward) and their autograd backward
(timed as backward of a saved graph, dx and dweight).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import print_bandwidth_table

from transformer_engine.pytorch.cpp_extensions import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd


def cases(rows: int, hidden: int):
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
    dz = torch.randn_like(x)
    w = torch.rand(hidden, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    eps = 1e-5
    _, mu, rs = layernorm_fwd(x, w, b, eps)
    _, _, rs_rms = rmsnorm_fwd(x, w, eps)

    xg = x.detach().requires_grad_()
    wg, bg = w.detach().requires_grad_(), b.detach().requires_grad_()
    y_ln = F.layer_norm(xg, (hidden,), wg, bg, eps)
    y_rms = F.rms_norm(xg, (hidden,), wg, eps)
    n = x.numel()
    yield ("layernorm fwd", 4 * n, lambda: layernorm_fwd(x, w, b, eps),
           lambda: F.layer_norm(x, (hidden,), w, b, eps))
    yield ("layernorm bwd", 6 * n, lambda: layernorm_bwd(dz, x, mu, rs, w),
           lambda: torch.autograd.grad(y_ln, (xg, wg, bg), dz, retain_graph=True))
    yield ("rmsnorm fwd", 4 * n, lambda: rmsnorm_fwd(x, w, eps), lambda: F.rms_norm(x, (hidden,), w, eps))
    yield ("rmsnorm bwd", 6 * n, lambda: rmsnorm_bwd(dz, x, rs_rms, w),
           lambda: torch.autograd.grad(y_rms, (xg, wg), dz, retain_graph=True))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--shapes", default="16384x4096,8192x8192,32768x1024")
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    rows = ((name, f"{r} x {h}", nbytes, ours, theirs) for r, h in shapes
            for name, nbytes, ours, theirs in cases(r, h))
    print_bandwidth_table("bench_norm.py", rows, args.iters, "rows x hidden (bf16)")

if __name__ == "__main__":
    main()
