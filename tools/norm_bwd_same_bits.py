#!/usr/bin/env python3
"""The norm backward's dgamma / dbeta bit for bit across two builds, on the GPU machine.

    PYTHONPATH=/tmp/opente_ab/base python3 tools/norm_bwd_same_bits.py save /tmp/bits.pt
    python3 tools/norm_bwd_same_bits.py compare /tmp/bits.pt    # under the other build

Why: a change to how the backward sums its partial rows (the order of the additions kept,
the place they happen in moved: shared memory or registers, which thread) must leave
dgamma and dbeta as they were, not merely within the tests' tolerances. `save` runs
layernorm and rmsnorm backward on the same seeded inputs (bf16, fp16 and fp32 rows;
hidden sizes from 64 to 4096, which the register backward takes, with and without 16-byte
vectors; 3 rows for a grid of one block, 4097 and 16384 rows for full grids) and keeps
their one-dimensional outputs; `compare` runs them again and names the cases whose bits
differ. tools/device_ab.sh's CHECK runs the two with the base's install and the patch's.
"""

from __future__ import annotations

import sys

HIDDEN = (64, 96, 256, 320, 520, 768, 1001, 1024, 2048, 3072, 4096)
ROWS = (3, 4097, 16384)


def differing(now: dict, before: dict) -> list[str]:
    """Cases (name -> list of tensors) of `now` whose tensors are not those of `before`, bit
    for bit (a NaN equal to the same NaN), or that `before` lacks."""
    import torch

    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

    return [name for name, tensors in now.items()
            if name not in before or len(tensors) != len(before[name])
            or not all(same(a, b) for a, b in zip(tensors, before[name]))]


def backward_outputs() -> dict:
    import torch

    from transformer_engine.pytorch.cpp_extensions import layernorm_bwd, layernorm_fwd, rmsnorm_bwd, rmsnorm_fwd

    def sums(outputs):  # dgamma (and dbeta): the backward's one-dimensional outputs
        return [t.cpu() for t in outputs if torch.is_tensor(t) and t.dim() == 1]

    cases = {}
    gen = torch.Generator(device="cuda").manual_seed(1234)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for hidden in HIDDEN:
            for rows in ROWS:
                x = torch.randn(rows, hidden, device="cuda", generator=gen).to(dtype)
                dz = torch.randn(rows, hidden, device="cuda", generator=gen).to(dtype)
                w = (torch.rand(hidden, device="cuda", generator=gen) + 0.5).to(dtype)
                b = torch.randn(hidden, device="cuda", generator=gen).to(dtype)
                _, mu, rsigma = layernorm_fwd(x, w, b, 1e-5)
                cases[f"layernorm {dtype} {rows}x{hidden}"] = sums(layernorm_bwd(dz, x, mu, rsigma, w))
                _, _, rsigma = rmsnorm_fwd(x, w, 1e-5)
                cases[f"rmsnorm {dtype} {rows}x{hidden}"] = sums(rmsnorm_bwd(dz, x, rsigma, w))
    return cases


def main() -> None:
    import torch

    if len(sys.argv) != 3 or sys.argv[1] not in ("save", "compare"):
        raise SystemExit("usage: norm_bwd_same_bits.py save|compare FILE")
    mode, path = sys.argv[1], sys.argv[2]
    now = backward_outputs()
    if mode == "save":
        torch.save(now, path)
        print(f"saved {len(now)} cases")
        return
    bad = differing(now, torch.load(path))
    print(f"same bits (dgamma, dbeta): {len(now) - len(bad)} of {len(now)} cases"
          + (f"; differ: {', '.join(bad[:10])}" if bad else ""))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
