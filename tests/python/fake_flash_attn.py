"""A stand-in for the flash-attn 2.x package in plain torch, for the CPU tests of
DotProductAttention's FlashAttention backend.

``make_module(version)`` returns a fresh ``flash_attn`` module whose ``flash_attn_func``
and ``flash_attn_varlen_func``:

- check their arguments as flash-attn documents them (layouts, int32 cu_seqlens, int
  max_seqlens, a bool causal flag, a (left, right) window of ints, fp32 ALiBi slopes
  [h] or [b, h], h divisible by the key heads), and take only the keywords the given
  release has (window_size from 2.3, alibi_slopes from 2.4, deterministic from 2.4.1);
- record each call in ``module.calls`` (the arguments as passed, and ``module.probe()``'s
  value at the time, to see e.g. whether the RNG tracker's fork was entered);
- compute attention from the documented definitions: key j is visible to query i when
  i + skv - sq - left <= j <= i + skv - sq + right (the bottom-right alignment; causal
  sets right = 0, -1 is unlimited), ALiBi adds -slope * |i + skv - sq - j|, query head i
  uses key head i // (h / hg), a row with no visible key gives 0;
- like the real varlen kernels, leave the output and the input gradients of rows past
  cu_seqlens[-1] unwritten: NaN here, so that a leak shows.
"""

from __future__ import annotations

import re
import types

import torch
import torch.nn.functional as F

_UNSET = object()


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise TypeError(f"fake flash_attn: {message}")


def _version_tuple(text: str):
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", text).groups())


def _attend(q, k, v, scale, causal, window, slopes, dropout_p):
    """One sequence: q [sq, h, d], k / v [skv, hg, d] -> [sq, h, d]."""
    sq, h, _ = q.shape
    skv, hg, _ = k.shape
    k, v = k.repeat_interleave(h // hg, dim=1), v.repeat_interleave(h // hg, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    i = torch.arange(sq).view(sq, 1)
    j = torch.arange(skv).view(1, skv)
    diagonal = i + skv - sq
    left, right = window
    if causal:
        right = 0
    visible = torch.ones(sq, skv, dtype=torch.bool)
    if left >= 0:
        visible &= j >= diagonal - left
    if right >= 0:
        visible &= j <= diagonal + right
    if slopes is not None:
        scores = scores - slopes.view(h, 1, 1) * (diagonal - j).abs()
    # A finite fill and a multiply by the mask keep rows with no visible key at 0 (and
    # their gradients finite), as flash-attn's kernels do.
    scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1) * visible
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


class _NanGradPastEnd(torch.autograd.Function):
    """Identity whose gradient is NaN in rows past cu_seqlens[-1] (flash-attn's torch.empty)."""

    @staticmethod
    def forward(ctx, x, end: int):
        ctx.end = end
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[ctx.end:] = float("nan")
        return grad, None


def make_module(version: str = "2.6.3") -> types.ModuleType:
    """A fresh fake ``flash_attn`` module of flash-attn ``version``."""
    module = types.ModuleType("flash_attn")
    module.__version__ = version
    module.calls = []
    module.probe = lambda: None
    release = _version_tuple(version)

    def options(q, k, v, batch, dropout_p, softmax_scale, causal, window_size, alibi_slopes, deterministic):
        for name, given, since in (("window_size", window_size, (2, 3, 0)), ("alibi_slopes", alibi_slopes, (2, 4, 0)),
                                   ("deterministic", deterministic, (2, 4, 1))):
            _check(given is _UNSET or release >= since, f"flash-attn {version} has no {name} argument")
        window = (-1, -1) if window_size is _UNSET else window_size
        slopes = None if alibi_slopes is _UNSET else alibi_slopes
        _check(q.dtype == k.dtype == v.dtype, "q, k and v must have one dtype")
        _check(q.device == k.device == v.device, "q, k and v must be on one device")
        _check(all(x.stride(-1) == 1 for x in (q, k, v)), "q, k and v need a contiguous last dim")
        _check(k.shape == v.shape, f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
        _check(q.shape[-1] == k.shape[-1], "q, k and v must have one head dim")
        _check(q.shape[-2] % k.shape[-2] == 0, "the heads of q must be a multiple of the heads of k")
        _check(isinstance(dropout_p, float) and 0.0 <= dropout_p < 1.0, f"dropout_p must be a float, got {dropout_p!r}")
        _check(isinstance(softmax_scale, float), f"softmax_scale must be a float, got {softmax_scale!r}")
        _check(type(causal) is bool, f"causal must be a bool, got {causal!r}")
        _check(isinstance(window, tuple) and len(window) == 2 and all(type(w) is int and w >= -1 for w in window),
               f"window_size must be a tuple of two ints >= -1, got {window!r}")
        if slopes is not None:
            h = q.shape[-2]
            _check(slopes.dtype == torch.float32 and slopes.is_contiguous() and slopes.device == q.device,
                   "alibi_slopes must be contiguous fp32 on q's device")
            _check(tuple(slopes.shape) in ((h,), (batch, h)), f"alibi_slopes must be [{h}] or [{batch}, {h}]")
        _check(deterministic is _UNSET or type(deterministic) is bool, "deterministic must be a bool")
        return window, slopes

    def record(name, args, kwargs):
        module.calls.append(dict(fn=name, args=args, kwargs=kwargs, probe=module.probe()))

    def sequence_slopes(slopes, index):
        return None if slopes is None else (slopes if slopes.dim() == 1 else slopes[index])

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=_UNSET,
                        alibi_slopes=_UNSET, deterministic=_UNSET):
        record("flash_attn_func", (q, k, v), dict(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                                  window_size=window_size, alibi_slopes=alibi_slopes,
                                                  deterministic=deterministic))
        _check(q.dim() == k.dim() == 4 and q.shape[0] == k.shape[0], "q, k, v must be [b, s, h, d] of one batch")
        window, slopes = options(q, k, v, q.shape[0], dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                                 deterministic)
        return torch.stack([_attend(q[i], k[i], v[i], softmax_scale, causal, window, sequence_slopes(slopes, i),
                                    dropout_p) for i in range(q.shape[0])])

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=_UNSET, alibi_slopes=_UNSET,
                               deterministic=_UNSET):
        record("flash_attn_varlen_func", (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
               dict(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                    alibi_slopes=alibi_slopes, deterministic=deterministic))
        _check(q.dim() == k.dim() == 3, "q, k, v must be packed [total, h, d]")
        for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
            _check(isinstance(cu, torch.Tensor) and cu.dtype == torch.int32 and cu.dim() == 1 and cu.is_contiguous()
                   and cu.device == q.device, f"{name} must be a contiguous int32 [b + 1] tensor on q's device")
        _check(cu_seqlens_q.shape == cu_seqlens_k.shape, "cu_seqlens_q and cu_seqlens_k must have one batch")
        for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            _check(type(m) is int and m > 0, f"{name} must be a positive int, got {m!r}")
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        batch = len(cu_q) - 1
        window, slopes = options(q, k, v, batch, dropout_p, softmax_scale, causal, window_size, alibi_slopes,
                                 deterministic)
        _check(cu_q[0] == cu_k[0] == 0 and cu_q[-1] <= q.shape[0] and cu_k[-1] <= k.shape[0],
               "cu_seqlens must start at 0 and end inside the tensors")
        _check(max(b - a for a, b in zip(cu_q, cu_q[1:])) <= max_seqlen_q
               and max(b - a for a, b in zip(cu_k, cu_k[1:])) <= max_seqlen_k, "a sequence is longer than max_seqlen")
        q, k, v = _NanGradPastEnd.apply(q, cu_q[-1]), _NanGradPastEnd.apply(k, cu_k[-1]), \
            _NanGradPastEnd.apply(v, cu_k[-1])
        outs = [_attend(q[cu_q[i]:cu_q[i + 1]], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]], softmax_scale, causal,
                        window, sequence_slopes(slopes, i), dropout_p) for i in range(batch)]
        outs.append(q.new_full((q.shape[0] - cu_q[-1], *q.shape[1:]), float("nan")))  # unwritten rows
        return torch.cat(outs)

    module.flash_attn_func = flash_attn_func
    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module
