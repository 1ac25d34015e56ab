"""DotProductAttention with each OpenTE backend (FusedAttention: cuDNN's fused SDPA;
UnfusedDotProductAttention: GEMMs around a softmax) against torch SDPA with its cuDNN
backend, forward and forward + backward, in one run. The target of the fused backend is
0.95x of torch's cuDNN SDPA or better (the same cuDNN kernels, behind less or more host code).

    python3 benchmarks/bench_attention.py                   # B=4, H=16, S=4096, D=128, bf16
    python3 benchmarks/bench_attention.py --seq 1024,4096 --batch 2 --backends fused

FLOPs counted as FlashAttention's benchmarks do: forward 4 * B * H * S^2 * D (Q K^T and
P V), half that with a causal mask; backward 2.5x the forward, so forward + backward is
3.5x. TFLOP/s = counted FLOPs / time (the unfused path computes the masked half anyway).

Memory: the unfused path keeps [B, H, S, S] scores and probabilities (2 GiB each in bf16
at B=4, H=16, S=4096) and the backward briefly twice that again: about 10 GiB at the
default shape.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings

import torch
from timing import time_pair_us

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention.dot_product_attention.backends import AttentionParams, get_attention_backend


def sdpa_context():
    """torch SDPA restricted to cuDNN attention where this torch has it; (context, name)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return (lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)), "SDPA cuDNN"
    except (ImportError, AttributeError):
        return contextlib.nullcontext, "SDPA (default backend)"


# NVTE_FUSED_ATTN for each backend row: the selection prefers FusedAttention where it can run.
BACKEND_ENV = {"fused": "1", "unfused": "0"}


@contextlib.contextmanager
def fused_attn_env(value: str):
    old = os.environ.get("NVTE_FUSED_ATTN")
    os.environ["NVTE_FUSED_ATTN"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("NVTE_FUSED_ATTN")
        else:
            os.environ["NVTE_FUSED_ATTN"] = old


def backend_name(dtype, b, h, s, d, causal) -> str:
    params = AttentionParams(qkv_dtype=dtype, device_type="cuda",
                             compute_capability=torch.cuda.get_device_capability(), qkv_format="bshd", batch_size=b,
                             num_heads=h, num_gqa_groups=h, max_seqlen_q=s, max_seqlen_kv=s, head_dim_qk=d,
                             head_dim_v=d, attn_mask_type="causal" if causal else "no_mask", window_size=(-1, 0)
                             if causal else (-1, -1))
    return str(get_attention_backend(params).name)


def run_case(b, h, s, d, causal, dtype, iters, sdpa_ctx, sdpa_name):
    shape = (b, s, h, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, s, h * d, device="cuda", dtype=dtype)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal" if causal else "no_mask")

    def ours_fwd():
        with torch.no_grad():
            return dpa(q, k, v)

    def sdpa(qq, kk, vv):
        with sdpa_ctx():
            out = torch.nn.functional.scaled_dot_product_attention(qq.transpose(1, 2), kk.transpose(1, 2),
                                                                   vv.transpose(1, 2), is_causal=causal)
        return out.transpose(1, 2).reshape(b, s, h * d)

    def theirs_fwd():
        with torch.no_grad():
            return sdpa(q, k, v)

    def ours_fwd_bwd():
        dpa(q, k, v).backward(grad)

    def theirs_fwd_bwd():
        sdpa(q, k, v).backward(grad)

    try:  # cuDNN attention may refuse a configuration: then torch picks its backend
        theirs_fwd()
    except RuntimeError as error:
        print(f"  ({sdpa_name} refused B={b} H={h} S={s} D={d}: {str(error).splitlines()[0]}; using torch's "
              "default SDPA backend for this case)")
        sdpa_ctx = contextlib.nullcontext
    # A call cuDNN refuses falls back to the unfused backend: count the fused calls that ran.
    fused_calls = []
    fused_forward = dpa.fused_attention.forward

    def counted_forward(*args, **kwargs):
        out = fused_forward(*args, **kwargs)
        fused_calls.append(1)
        return out

    dpa.fused_attention.forward = counted_forward
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours_fwd_bwd()
    ran_fused = bool(fused_calls)
    fwd_flops = 4 * b * h * s * s * d / (2 if causal else 1)
    rows = []
    for label, ours, theirs, flops in (("fwd", ours_fwd, theirs_fwd, fwd_flops),
                                       ("fwd+bwd", ours_fwd_bwd, theirs_fwd_bwd, 3.5 * fwd_flops)):
        ours_us, theirs_us = time_pair_us(ours, theirs, iters, rounds=min(5, iters), warmup=2)
        rows.append((label, ours_us, flops / (ours_us * 1e-6) / 1e12, theirs_us, flops / (theirs_us * 1e-6) / 1e12))
        torch.cuda.empty_cache()
    return rows, ran_fused


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", default="4096", help="comma-separated sequence lengths")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--masks", default="no_mask,causal", help="comma-separated: no_mask, causal")
    parser.add_argument("--backends", default="fused,unfused", help="comma-separated: fused, unfused")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    from transformer_engine import _core

    if not torch.cuda.is_available() or not _core.built_with_cuda():
        raise SystemExit("bench_attention.py needs a CUDA GPU and a CUDA build of OpenTE")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    sdpa_ctx, sdpa_name = sdpa_context()
    print(f"device: {torch.cuda.get_device_name()}  dtype: {args.dtype}  reference: {sdpa_name}")
    header = ("case", "pass", "OpenTE backend", "OpenTE ms", "OpenTE TFLOP/s", f"{sdpa_name} ms",
              f"{sdpa_name} TFLOP/s", "OpenTE / SDPA speed")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    b, h, d = args.batch, args.heads, args.head_dim
    for s in (int(x) for x in args.seq.split(",")):
        for mask in args.masks.split(","):
            causal = mask == "causal"
            case = f"B={b} H={h} S={s} D={d} {mask}"
            for backend in args.backends.split(","):
                with fused_attn_env(BACKEND_ENV[backend]):
                    name = backend_name(dtype, b, h, s, d, causal)
                    rows, ran_fused = run_case(b, h, s, d, causal, dtype, args.iters, sdpa_ctx, sdpa_name)
                if name == "FusedAttention" and not ran_fused:
                    name += " (cuDNN refused: ran unfused)"
                for label, ours_us, ours_tf, theirs_us, theirs_tf in rows:
                    print(f"| {case} | {label} | {name} | {ours_us / 1e3:.2f} | {ours_tf:.1f} | "
                          f"{theirs_us / 1e3:.2f} | {theirs_tf:.1f} | {theirs_us / ours_us:.2f}x |")


if __name__ == "__main__":
    main()
