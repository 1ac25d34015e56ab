"""Fused rotary position embedding (forward and backward) against the device's copy
bandwidth and against the unfused PyTorch path, in one run.

    python3 benchmarks/bench_rope.py            # needs a CUDA GPU

Bytes counted (bf16, n elements of t): a forward reads t and writes the result (4n), a
backward reads dy and writes dx (4n); the freqs rows (s * d2 fp32) are counted once.

PyTorch does what a user would without the fused kernel: ``apply_rotary_pos_emb(...,
fused=False)``, Transformer Engine's unfused path (cos and sin of freqs, cast to bf16,
t * cos + rotate_half(t) * sin, concatenated with the copied tail), and the autograd
backward of that graph (timed as the backward of a saved graph). Its THD and
start_positions variants read cu_seqlens / start_positions on the host, as Transformer
Engine's do.
"""

from __future__ import annotations

import argparse

import torch
from timing import add_ops_argument, print_bandwidth_table

from transformer_engine.pytorch.attention import RotaryPositionEmbedding, apply_rotary_pos_emb
from transformer_engine.pytorch.cpp_extensions import fused_rope_backward, fused_rope_forward


def pair(name, shape_text, t, freqs, fmt, **kw):
    """(op, shape, bytes, ours, theirs) rows of the forward and the backward of one case."""
    n = t.numel()
    freq_bytes = freqs.shape[0] * freqs.shape[-1] * 4
    nbytes = 4 * n + freq_bytes  # bf16 in and out
    start = kw.get("start_positions")
    cu = kw.get("cu_seqlens")
    interleaved = kw.get("interleaved", False)
    yield (f"{name} fwd", shape_text, nbytes, lambda: fused_rope_forward(t, freqs, start, fmt, interleaved, cu),
           lambda: apply_rotary_pos_emb(t, freqs, fmt, fused=False, **kw))

    dy = torch.randn(t.shape, device=t.device, dtype=t.dtype)
    tg = t.detach().requires_grad_()
    y_torch = apply_rotary_pos_emb(tg, freqs, fmt, fused=False, **kw)
    yield (f"{name} bwd", shape_text, nbytes, lambda: fused_rope_backward(dy, freqs, start, fmt, interleaved, cu),
           lambda: torch.autograd.grad(y_torch, tg, dy, retain_graph=True))


def cases(s: int, b: int, h: int, d: int):
    dev, bf16 = "cuda", torch.bfloat16
    shape = f"[{s}, {b}, {h}, {d}]"
    t = torch.randn(s, b, h, d, device=dev, dtype=bf16)
    freqs = RotaryPositionEmbedding(d).to(dev)(s)
    yield from pair("sbhd", shape, t, freqs, "sbhd")
    yield from pair("sbhd interleaved", shape, t, RotaryPositionEmbedding(d, interleaved=True).to(dev)(s), "sbhd",
                    interleaved=True)
    yield from pair("sbhd d2 = d/2", shape, t, RotaryPositionEmbedding(d, rotary_percent=0.5).to(dev)(s), "sbhd")
    yield from pair("bshd", f"[{b}, {s}, {h}, {d}]", t.view(b, s, h, d), freqs, "bshd")

    # q read in place out of a fused [s, b, h, 3d] projection.
    qkv = torch.randn(s, b, h, 3 * d, device=dev, dtype=bf16)
    yield from pair("sbhd q of qkv (strided)", shape, qkv[..., :d], freqs, "sbhd")

    # THD: b * 4 sequences of uneven lengths packed into s * b tokens.
    tokens = s * b
    bounds = torch.linspace(0, tokens, b * 4 + 1, device=dev).round().to(torch.int32)
    bounds[1:-1] += torch.randint(-s // 16, s // 16, (b * 4 - 1,), device=dev, dtype=torch.int32)
    yield from pair("thd", f"[{tokens}, {h}, {d}] ({b * 4} seqs)", t.view(tokens, h, d), freqs, "thd",
                    cu_seqlens=bounds)

    # Decoding: one token of 64 sequences at their cache offsets.
    t1 = torch.randn(1, 64, h, d, device=dev, dtype=bf16)
    start = torch.randint(0, s - 1, (64,), device=dev, dtype=torch.int32)
    yield from pair("decode start_positions", f"[1, 64, {h}, {d}]", t1, freqs, "sbhd", start_positions=start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--shapes", default="4096x2x32x128,8192x1x8x128",
                        help="comma-separated s x b x h x d (bf16)")
    add_ops_argument(parser)
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]

    def rows():
        for s, b, h, d in shapes:
            yield from cases(s, b, h, d)
            torch.cuda.empty_cache()

    print_bandwidth_table("bench_rope.py", rows(), args.iters, "shape (bf16)", args.ops)


if __name__ == "__main__":
    main()
