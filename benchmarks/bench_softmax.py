"""The softmax ops of the unfused attention path (forward and backward) against the
device's copy bandwidth and against PyTorch, in one run.

    python3 benchmarks/bench_softmax.py            # needs a CUDA GPU
    python3 benchmarks/bench_softmax.py --dtype fp16 --shapes 2x16x512x2047

Bytes counted (bf16 or fp16, --dtype; n elements): a forward reads x and writes y (4n), the
masked one also reads its [b, 1, sq, sk] bool mask; a backward reads dy and y and writes dx
(6n). The causal kinds read only the kept positions (j <= i + sk - sq) and write all of
them, so they count 2 bytes a kept element per tensor read. The backward runs in place, as
Transformer Engine's.

PyTorch does the same work as a user would without the fused op: softmax(x * scale) in x's
dtype (fp32 math inside), with masked_fill(mask, -10000) or masked_fill(causal, -inf) first,
and the autograd backward of that graph (timed as the backward of a saved graph).
"""

from __future__ import annotations

import argparse
import sys

import torch
from timing import add_ops_argument, print_bandwidth_table

from transformer_engine.pytorch.cpp_extensions import softmax as S

SCALE = 0.125
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def kept_elements(sq: int, sk: int, batches: int) -> int:
    """Kept positions of an aligned causal mask (j <= i + sk - sq) over `batches` matrices."""
    i = torch.arange(sq, dtype=torch.int64)
    return int((i + (sk - sq) + 1).clamp(0, sk).sum()) * batches


def cases(b: int, h: int, sq: int, sk: int, dtype: torch.dtype):
    """(op, shape text, bytes, ours, theirs) for every op at [b, h, sq, sk] in `dtype` (16-bit:
    the byte counts take 2 bytes an element)."""
    dev = "cuda"
    x = torch.randn(b, h, sq, sk, device=dev, dtype=dtype)
    n = x.numel()
    shape = f"[{b}, {h}, {sq}, {sk}]"

    def with_backward(name, fwd_ours, fwd_torch, x_in, nbytes_fwd, nbytes_bwd, bwd_ours, shape_text):
        y = fwd_ours()
        dy = torch.randn_like(y)
        dy_ours = dy.clone()  # the backward overwrites it (in place)
        xg = x_in.detach().requires_grad_()
        y_torch = fwd_torch(xg)
        yield (f"{name} fwd", shape_text, nbytes_fwd, fwd_ours, lambda: fwd_torch(x_in))
        yield (f"{name} bwd", shape_text, nbytes_bwd, lambda: bwd_ours(dy_ours, y, SCALE),
               lambda: torch.autograd.grad(y_torch, xg, dy, retain_graph=True))

    yield from with_backward("scaled", lambda: S.scaled_softmax_forward(x, SCALE),
                             lambda t: torch.softmax(t * SCALE, -1), x, 4 * n, 6 * n, S.scaled_softmax_backward,
                             shape)

    mask = torch.rand(b, 1, sq, sk, device=dev) < 0.1
    yield from with_backward("masked", lambda: S.scaled_masked_softmax_forward(x, mask, SCALE),
                             lambda t: torch.softmax((t * SCALE).masked_fill(mask, -10000.0), -1), x,
                             4 * n + mask.numel(), 6 * n, S.scaled_masked_softmax_backward, shape)

    causal = torch.ones(sq, sk, device=dev, dtype=torch.bool).triu(sk - sq + 1)
    kept = kept_elements(sq, sk, b * h)
    yield from with_backward("aligned causal", lambda: S.scaled_aligned_causal_masked_softmax_forward(x, SCALE),
                             lambda t: torch.softmax((t * SCALE).masked_fill(causal, float("-inf")), -1), x,
                             2 * kept + 2 * n, 4 * kept + 2 * n, S.scaled_aligned_causal_masked_softmax_backward,
                             shape)

    # The upper-triangular op takes [attn_batches, s, s]: square, b * h matrices up to s =
    # 2048, a single one beyond (16384^2 bf16 is 512 MiB a tensor).
    s = sk
    batches = b * h if s <= 2048 else 1
    # x, y, dy and its copy, PyTorch's logits and y (bf16), the causal mask (bool): about 15
    # bytes an element. Skipped, with a note, where the GPU has not that much free (at s =
    # 131072 a single bf16 tensor is 32 GiB).
    need = 15 * batches * s * s
    free = torch.cuda.mem_get_info()[0]
    if need > free:
        print(f"bench_softmax.py: upper triang [{batches}, {s}, {s}] skipped: it needs about {need / 2**30:.0f} GiB, "
              f"{free / 2**30:.0f} GiB free", file=sys.stderr)
        return
    xu = torch.randn(batches, s, s, device=dev, dtype=dtype)
    triu = torch.ones(s, s, device=dev, dtype=torch.bool).triu(1)
    kept_u = kept_elements(s, s, batches)
    nu = xu.numel()
    yield from with_backward("upper triang", lambda: S.scaled_upper_triang_masked_softmax_forward(xu, SCALE),
                             lambda t: torch.softmax((t * SCALE).masked_fill(triu, float("-inf")), -1), xu,
                             2 * kept_u + 2 * nu, 4 * kept_u + 2 * nu,
                             S.scaled_upper_triang_masked_softmax_backward, f"[{batches}, {s}, {s}]")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--shapes", default="4x16x2048x2048,1x16x512x16384",
                        help="comma-separated b x h x sq x sk")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="x's dtype (16-bit)")
    add_ops_argument(parser)
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]

    def rows():
        for b, h, sq, sk in shapes:
            yield from cases(b, h, sq, sk, DTYPES[args.dtype])
            torch.cuda.empty_cache()  # the next shape's tensors may be as large

    print_bandwidth_table("bench_softmax.py", rows(), args.iters, f"shape ({args.dtype})", args.ops)


if __name__ == "__main__":
    main()
