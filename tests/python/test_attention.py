"""DotProductAttention (unfused backend) against float64 references: torch's
scaled_dot_product_attention where it covers the case, else attention_reference.py (masks
written out from their definitions). Every mask type, sliding windows, GQA / MQA, the
sbhd / bshd / thd formats, biases and ALiBi, sink softmax types, dropout, KV caching,
gradients, and the errors.

Tolerances: float32 inputs, head dim <= 32 and rows of <= 24 keys: the GEMMs and the
softmax (fp32 throughout) are within a few float32 ulps of the float64 result per term,
so 2e-5 absolute / relative leaves a wide margin and still catches any wrong mask entry
(which moves a probability by >= 1/24). float64 inputs take the torch softmax path and
agree with float64 SDPA to 1e-12. bf16 / fp16 on CUDA: the error against float64 at most
3x that of the same computation done by torch in that precision (FlashAttention's rule).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from attention_reference import (
    alibi_reference,
    decode_with_cache,
    from_bhsd,
    reference_attention,
    reference_mask,
    to_bhsd,
)
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention.dot_product_attention import softmax as attn_softmax
from transformer_engine.pytorch.attention.dot_product_attention.backends import (
    AttentionParams,
    get_attention_backend,
)
from transformer_engine.pytorch.attention.dot_product_attention.masks import (
    MaskPlan,
    get_alibi_slopes,
    plan_attention_mask,
)

TOL = dict(atol=2e-5, rtol=2e-5)
MASK_TYPES = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
              "arbitrary"]


def rand(shape, gen, dtype=torch.float32, device="cpu", requires_grad=False):
    t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)
    return t.requires_grad_(requires_grad)


def qkv(fmt, b, sq, skv, h, hg, d, gen, device="cpu", dtype=torch.float32, dv=None, requires_grad=False):
    dv = d if dv is None else dv
    shape = (lambda s, n, e: (s, b, n, e)) if fmt == "sbhd" else (lambda s, n, e: (b, s, n, e))
    return (rand(shape(sq, h, d), gen, dtype, device, requires_grad),
            rand(shape(skv, hg, d), gen, dtype, device, requires_grad),
            rand(shape(skv, hg, dv), gen, dtype, device, requires_grad))


def reference_out(q, k, v, fmt, scale, **kw):
    out = reference_attention(to_bhsd(q, fmt), to_bhsd(k, fmt), to_bhsd(v, fmt), scale, **kw)
    return from_bhsd(out, fmt)


def lengths_to_cu(lengths, device="cpu"):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=device)


def padding_mask(lengths, s, device="cpu"):
    return (torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]).view(len(lengths), 1, 1, s).to(device)


# ---- against torch SDPA ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal"])
def test_matches_sdpa(device, fmt, mask_type, gen):
    b, s, h, d = 2, 13, 3, 16
    q, k, v = qkv(fmt, b, s, s, h, h, d, gen, device)
    dpa = te.DotProductAttention(h, d, qkv_format=fmt, attn_mask_type=mask_type)
    out = dpa(q, k, v)
    assert out.shape == ((s, b, h * d) if fmt == "sbhd" else (b, s, h * d))
    ref = F.scaled_dot_product_attention(*(to_bhsd(x, fmt).double().cpu() for x in (q, k, v)),
                                         is_causal=mask_type == "causal")
    torch.testing.assert_close(out.double().cpu(), from_bhsd(ref, fmt), **TOL)


def test_float64_inputs_match_sdpa(gen):
    b, sq, skv, h, hg, d = 2, 9, 11, 4, 2, 8
    q, k, v = qkv("bshd", b, sq, skv, h, hg, d, gen, dtype=torch.float64)
    keep = torch.rand(b, 1, sq, skv, generator=gen) > 0.3
    keep[..., 0] = True  # no fully masked rows: SDPA gives NaN there
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="bshd", attn_mask_type="arbitrary")
    out = dpa(q, k, v, attention_mask=~keep)
    ref = F.scaled_dot_product_attention(*(to_bhsd(x, "bshd") for x in (q, k, v)), attn_mask=keep, enable_gqa=True)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, from_bhsd(ref, "bshd"), atol=1e-12, rtol=1e-12)


# ---- every mask type ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask_type", MASK_TYPES)
@pytest.mark.parametrize("sq,skv", [(10, 10), (7, 12), (12, 7)])
def test_mask_types(device, mask_type, sq, skv, gen):
    b, h, d = 3, 2, 8
    q, k, v = qkv("bshd", b, sq, skv, h, h, d, gen, device, requires_grad=True)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask_type, attention_type="cross")
    q_lens, kv_lens = [sq, sq - 3, 1], [skv - 2, skv, 3]
    kwargs, ref_mask = {}, None
    if "padding" in mask_type:
        kwargs["attention_mask"] = (padding_mask(q_lens, sq, device), padding_mask(kv_lens, skv, device))
        ref_mask = reference_mask(mask_type, None, sq, skv, q_lens, kv_lens)
    elif mask_type == "arbitrary":
        arbitrary = torch.rand(b, h, sq, skv, generator=gen) > 0.6
        arbitrary[0, 0, 1] = True  # one fully masked row
        kwargs["attention_mask"] = arbitrary.to(device)
        ref_mask = arbitrary
    elif mask_type != "no_mask":
        ref_mask = reference_mask(mask_type, None, sq, skv)
    out = dpa(q, k, v, **kwargs)
    ref = reference_out(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), "bshd", d**-0.5, mask=ref_mask)
    torch.testing.assert_close(out.double().cpu(), ref, **TOL)
    if "padding" in mask_type:  # padded query rows come out zero
        for n, ql in enumerate(q_lens):
            assert torch.all(out[n, ql:] == 0)

    grad = rand(out.shape, gen, device=device)
    out.backward(grad)
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    reference_out(q64, k64, v64, "bshd", d**-0.5, mask=ref_mask).backward(grad.cpu().double())
    for ours, theirs in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double().cpu(), theirs, **TOL)


def test_padding_from_cu_seqlens_and_self_mask(device, gen):
    b, s, h, d = 3, 9, 2, 8
    lengths = [9, 4, 6]
    q, k, v = qkv("sbhd", b, s, s, h, h, d, gen, device)
    dpa = te.DotProductAttention(h, d, qkv_format="sbhd", attn_mask_type="padding_causal")
    from_mask = dpa(q, k, v, attention_mask=padding_mask(lengths, s, device))
    cu = lengths_to_cu(lengths, device)
    from_cu = dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    ref = reference_out(q.cpu(), k.cpu(), v.cpu(), "sbhd", d**-0.5,
                        mask=reference_mask("padding_causal", None, s, s, lengths, lengths))
    torch.testing.assert_close(from_mask.double().cpu(), ref, **TOL)
    torch.testing.assert_close(from_cu, from_mask)


def test_mask_type_aliases_and_forward_override(gen):
    b, s, h, d = 2, 6, 2, 8
    q, k, v = qkv("bshd", b, s, s, h, h, d, gen)
    mask = padding_mask([6, 3], s)
    a = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding,causal")(q, k, v, attention_mask=mask)
    b_ = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal,padding")(q, k, v, attention_mask=mask)
    c = te.DotProductAttention(h, d, qkv_format="bshd")(q, k, v, attention_mask=mask, attn_mask_type="padding_causal")
    torch.testing.assert_close(a, b_)
    torch.testing.assert_close(a, c)


# ---- sliding windows ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask_type,window", [
    ("no_mask", (2, 1)), ("no_mask", (0, 0)), ("no_mask", (3, -1)), ("no_mask", (-1, 2)),
    ("causal", (2, 0)), ("causal", (0, 0)), ("causal_bottom_right", (3, 0)),
    ("padding", (1, 2)), ("padding_causal", (2, 0)), ("padding_causal_bottom_right", (1, 0)),
])
@pytest.mark.parametrize("sq,skv", [(8, 8), (5, 9)])
def test_sliding_window(device, mask_type, window, sq, skv, gen):
    b, h, d = 2, 2, 8
    q, k, v = qkv("bshd", b, sq, skv, h, h, d, gen, device)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask_type, window_size=window)
    kwargs = {}
    q_lens, kv_lens = [sq, sq - 2], [skv - 1, skv]
    if "padding" in mask_type:
        kwargs["attention_mask"] = (padding_mask(q_lens, sq, device), padding_mask(kv_lens, skv, device))
        mask = reference_mask(mask_type, window, sq, skv, q_lens, kv_lens)
    else:
        mask = reference_mask(mask_type, window, sq, skv)
    out = dpa(q, k, v, **kwargs)
    ref = reference_out(q.cpu(), k.cpu(), v.cpu(), "bshd", d**-0.5, mask=mask)
    torch.testing.assert_close(out.double().cpu(), ref, **TOL)
    # The window given to forward overrides the module's.
    plain = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask_type)
    torch.testing.assert_close(plain(q, k, v, window_size=window, **kwargs), out)


def test_window_size_checks():
    with pytest.warns(UserWarning, match="window_size"):
        dpa = te.DotProductAttention(2, 8, attn_mask_type="causal", window_size=(3, 2))
    assert dpa.window_size == (3, 0)
    with pytest.warns(UserWarning, match="window_size"):
        assert te.DotProductAttention(2, 8, attn_mask_type="no_mask", window_size=(-1, 0)).window_size == (-1, -1)
    assert te.DotProductAttention(2, 8, attn_mask_type="causal").window_size == (-1, 0)
    with pytest.raises(ValueError, match="window_size"):
        te.DotProductAttention(2, 8, attn_mask_type="no_mask", window_size=(-2, 1))
    with pytest.raises(TypeError, match="window_size"):
        te.DotProductAttention(2, 8, attn_mask_type="no_mask", window_size=(1.5, 1))


# ---- GQA / MQA and head sizes ------------------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_gqa_mqa(device, groups, fmt, gen):
    b, sq, skv, h, d, dv = 2, 7, 10, 6, 8, 12
    q, k, v = qkv(fmt, b, sq, skv, h, groups, d, gen, device, dv=dv, requires_grad=True)
    dpa = te.DotProductAttention(h, (d, dv), num_gqa_groups=groups, qkv_format=fmt, attn_mask_type="causal")
    out = dpa(q, k, v)
    assert out.shape[-1] == h * dv
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    ref = reference_out(q64, k64, v64, fmt, d**-0.5, mask=reference_mask("causal", None, sq, skv))
    torch.testing.assert_close(out.double().cpu(), ref.detach(), **TOL)
    grad = rand(out.shape, gen)
    out.backward(grad.to(device))
    ref.backward(grad.double())
    for ours, theirs in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(ours.double().cpu(), theirs, **TOL)


def test_softmax_scale(gen):
    q, k, v = qkv("bshd", 1, 5, 5, 2, 2, 8, gen)
    out = te.DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask", softmax_scale=0.3)(q, k, v)
    torch.testing.assert_close(out.double(), reference_out(q, k, v, "bshd", 0.3), **TOL)


# ---- thd ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_type", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("gaps", [False, True])
def test_thd_matches_per_sequence(device, mask_type, gaps, gen):
    h, hg, d = 4, 2, 8
    q_lens, kv_lens = [5, 1, 8], [7, 3, 8]
    q_starts = [0, 7, 10] if gaps else [0, 5, 6]
    kv_starts = [1, 9, 14] if gaps else [0, 7, 10]
    tq, tkv = q_starts[-1] + q_lens[-1] + (2 if gaps else 0), kv_starts[-1] + kv_lens[-1]
    q = rand((tq, h, d), gen, device=device, requires_grad=True)
    k = rand((tkv, hg, d), gen, device=device, requires_grad=True)
    v = rand((tkv, hg, d), gen, device=device, requires_grad=True)
    cu_q, cu_kv = lengths_to_cu(q_lens, device), lengths_to_cu(kv_lens, device)
    kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv)
    if gaps:
        kwargs.update(cu_seqlens_q_padded=torch.tensor(q_starts + [tq], dtype=torch.int32, device=device),
                      cu_seqlens_kv_padded=torch.tensor(kv_starts + [tkv], dtype=torch.int32, device=device))
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="thd", attn_mask_type=mask_type)
    out = dpa(q, k, v, **kwargs)
    assert out.shape == (tq, h * d)
    grad = rand(out.shape, gen, device=device)
    out.backward(grad)

    ref_out = torch.zeros(tq, h * d, dtype=torch.float64)
    ref_grads = [torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v)]
    single_type = {"padding": None, "padding_causal": "causal", "padding_causal_bottom_right": "causal_bottom_right"}
    for qs, ql, ks, kl in zip(q_starts, q_lens, kv_starts, kv_lens):
        qi = q.detach().cpu()[qs:qs + ql].double().requires_grad_()
        ki = k.detach().cpu()[ks:ks + kl].double().requires_grad_()
        vi = v.detach().cpu()[ks:ks + kl].double().requires_grad_()
        kind = single_type[mask_type]
        mask = None if kind is None else reference_mask(kind, None, ql, kl)
        oi = reference_out(qi[None], ki[None], vi[None], "bshd", d**-0.5, mask=mask)[0]
        ref_out[qs:qs + ql] = oi.detach()
        oi.backward(grad.cpu().double()[qs:qs + ql])
        ref_grads[0][qs:qs + ql] = qi.grad
        ref_grads[1][ks:ks + kl] = ki.grad
        ref_grads[2][ks:ks + kl] = vi.grad
    torch.testing.assert_close(out.double().cpu(), ref_out, **TOL)  # tokens between sequences: 0
    for ours, theirs in zip((q.grad, k.grad, v.grad), ref_grads):
        torch.testing.assert_close(ours.double().cpu(), theirs, **TOL)


def test_thd_max_seqlen_given(gen):
    lens = [3, 6]
    q, k, v = (rand((9, 2, 8), gen) for _ in range(3))
    cu = lengths_to_cu(lens)
    dpa = te.DotProductAttention(2, 8, qkv_format="thd", attn_mask_type="padding_causal")
    torch.testing.assert_close(dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=16, max_seqlen_kv=16),
                               dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu))


# ---- biases and ALiBi --------------------------------------------------------------------------


@pytest.mark.parametrize("bias_type", ["pre_scale_bias", "post_scale_bias"])
@pytest.mark.parametrize("bias_shape", ["1hss", "b1ss", "bhss", "11ss", "111s"])
def test_bias(device, bias_type, bias_shape, gen):
    b, sq, skv, h, d = 2, 6, 9, 3, 8
    q, k, v = qkv("sbhd", b, sq, skv, h, h, d, gen, device, requires_grad=True)
    dims = {"b": b, "h": h, "s": None, "1": 1}
    shape = [dims[c] for c in bias_shape]
    shape[2] = sq if bias_shape[2] == "s" else 1
    shape[3] = skv
    bias = rand(shape, gen, device=device, requires_grad=True)
    dpa = te.DotProductAttention(h, d, attn_mask_type="causal_bottom_right")
    out = dpa(q, k, v, core_attention_bias_type=bias_type, core_attention_bias=bias)
    mask = reference_mask("causal_bottom_right", None, sq, skv)
    q64, k64, v64, bias64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v, bias))
    ref = reference_out(q64, k64, v64, "sbhd", d**-0.5, mask=mask,
                        **{("pre_bias" if bias_type == "pre_scale_bias" else "post_bias"): bias64})
    torch.testing.assert_close(out.double().cpu(), ref.detach(), **TOL)
    grad = rand(out.shape, gen)
    out.backward(grad.to(device))
    ref.backward(grad.double())
    for ours, theirs in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad), (bias.grad, bias64.grad)):
        torch.testing.assert_close(ours.double().cpu(), theirs, **TOL)


def test_default_alibi_slopes():
    # ALiBi's slopes: 2^(-8k/n) for n = 8 heads; 12 heads add the odd terms of the 16-head series.
    torch.testing.assert_close(get_alibi_slopes(8), torch.tensor([2.0 ** (-k) for k in range(1, 9)]))
    expected = [2.0 ** (-k) for k in range(1, 9)] + [2.0 ** (-k / 2) for k in (1, 3, 5, 7)]
    torch.testing.assert_close(get_alibi_slopes(12), torch.tensor(expected))


@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right", "padding", "padding_causal"])
@pytest.mark.parametrize("slopes_kind", ["default", "h", "bh"])
def test_alibi(device, mask_type, slopes_kind, gen):
    b, sq, skv, h, d = 2, 5, 8, 4, 8
    q, k, v = qkv("bshd", b, sq, skv, h, h, d, gen, device)
    slopes = {"default": None, "h": torch.rand(h, generator=gen),
              "bh": torch.rand(b, h, generator=gen)}[slopes_kind]
    kwargs = dict(core_attention_bias_type="alibi", alibi_slopes=None if slopes is None else slopes.to(device))
    q_lens, kv_lens = [sq, 3], [skv, 6]
    if "padding" in mask_type:
        kwargs["attention_mask"] = (padding_mask(q_lens, sq, device), padding_mask(kv_lens, skv, device))
        mask = reference_mask(mask_type, None, sq, skv, q_lens, kv_lens)
    else:
        mask = None if mask_type == "no_mask" else reference_mask(mask_type, None, sq, skv)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask_type, attention_type="cross")
    out = dpa(q, k, v, **kwargs)
    # The diagonal: top-left for causal / padding_causal, else bottom-right (per sequence with padding).
    if mask_type == "causal":
        offsets = [0, 0]
    elif "padding" in mask_type and mask_type != "padding_causal":
        offsets = [kl - ql for ql, kl in zip(q_lens, kv_lens)]
    elif mask_type == "padding_causal":
        offsets = [0, 0]
    else:
        offsets = [skv - sq] * b
    ref_slopes = get_alibi_slopes(h) if slopes is None else slopes
    bias = alibi_reference(ref_slopes, sq, skv, offsets)
    ref = reference_out(q.cpu(), k.cpu(), v.cpu(), "bshd", d**-0.5, mask=mask, post_bias=bias)
    torch.testing.assert_close(out.double().cpu(), ref, **TOL)


# ---- softmax types -----------------------------------------------------------------------------


@pytest.mark.parametrize("softmax_type", ["off-by-one", "learnable"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding_causal"])
def test_softmax_types(device, softmax_type, mask_type, gen):
    b, s, h, d = 2, 7, 3, 8
    q, k, v = qkv("bshd", b, s, s, h, h, d, gen, device, requires_grad=True)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask_type, softmax_type=softmax_type).to(
        device)
    kwargs, lens = {}, [7, 4]
    if softmax_type == "learnable":
        assert isinstance(dpa.softmax_offset, torch.nn.Parameter)
        assert "softmax_offset" in dict(dpa.named_parameters())
        with torch.no_grad():
            dpa.softmax_offset.copy_(torch.tensor([0.5, -1.0, 2.0]))
    if "padding" in mask_type:
        kwargs["attention_mask"] = padding_mask(lens, s, device)
    mask = None if mask_type == "no_mask" else reference_mask(mask_type, None, s, s, lens, lens)
    out = dpa(q, k, v, **kwargs)
    sink64 = dpa.softmax_offset.detach().cpu().double().requires_grad_()
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    ref = reference_out(q64, k64, v64, "bshd", d**-0.5, mask=mask, sink=sink64)
    torch.testing.assert_close(out.double().cpu(), ref.detach(), **TOL)
    grad = rand(out.shape, gen)
    out.backward(grad.to(device))
    ref.backward(grad.double())
    pairs = [(q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)]
    if softmax_type == "learnable":
        pairs.append((dpa.softmax_offset.grad, sink64.grad))
    for ours, theirs in pairs:
        torch.testing.assert_close(ours.double().cpu(), theirs, **TOL)


def test_return_max_logit(device, gen):
    b, s, h, d = 2, 6, 3, 8
    q, k, v = qkv("bshd", b, s, s, h, h, d, gen, device)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal", return_max_logit=True)
    out, max_logit = dpa(q, k, v)
    scores = (to_bhsd(q, "bshd").double() @ to_bhsd(k, "bshd").double().transpose(-1, -2)) * d**-0.5
    scores = scores.masked_fill(reference_mask("causal", None, s, s).to(device), float("-inf"))
    assert max_logit.shape == (h,)
    torch.testing.assert_close(max_logit.double(), scores.amax(dim=(0, 2, 3)), **TOL)
    torch.testing.assert_close(out, te.DotProductAttention(h, d, qkv_format="bshd")(q, k, v))


# ---- the softmax paths: kernels against the torch path -----------------------------------------


@pytest.mark.parametrize("kind,sq,skv", [("none", 5, 9), ("causal_top_left", 7, 7), ("causal_top_left", 5, 8),
                                         ("causal_bottom_right", 9, 5), ("explicit", 6, 6)])
def test_kernel_softmax_matches_torch_path(device, kind, sq, skv, gen):
    b, h = 2, 3
    scores = rand((b, h, sq, skv), gen, device=device, requires_grad=True)
    mask = None
    if kind == "explicit":
        mask = (torch.rand(1, h, sq, skv, generator=gen) > 0.5).to(device)
        mask[0, 1, 2] = True  # a fully masked row
    plan = MaskPlan(kind, mask)
    expected_path = {"none": "scaled", "causal_bottom_right": "aligned_causal", "explicit": "masked",
                     "causal_top_left": "upper_triang" if sq == skv else "masked"}[kind]
    assert attn_softmax.softmax_path(plan, torch.float32, sq, skv, False) == expected_path
    assert attn_softmax.softmax_path(plan, torch.float64, sq, skv, False) == "torch"
    probs = attn_softmax.attention_softmax(scores, plan)
    scores64 = scores.detach().double().requires_grad_()
    probs64 = attn_softmax.attention_softmax(scores64, plan)  # float64: the torch path
    torch.testing.assert_close(probs.double(), probs64.detach(), **TOL)
    grad = rand(probs.shape, gen, device=device)
    probs.backward(grad)
    probs64.backward(grad.double())
    torch.testing.assert_close(scores.grad.double(), scores64.grad, **TOL)


def test_plan_fast_paths():
    assert plan_attention_mask("no_mask", (-1, -1), 4, 4, "cpu").kind == "none"
    assert plan_attention_mask("causal", (-1, 0), 4, 6, "cpu").kind == "causal_top_left"
    assert plan_attention_mask("causal_bottom_right", (-1, 0), 4, 6, "cpu").kind == "causal_bottom_right"
    plan = plan_attention_mask("causal", (2, 0), 4, 4, "cpu")
    assert plan.kind == "explicit" and plan.mask.shape == (1, 1, 4, 4)


# ---- dropout and the RNG tracker ---------------------------------------------------------------


def _tracker(seed):
    tracker = te.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", seed)
    return tracker


def test_dropout_under_tracker(device, gen):
    b, s, h, d = 2, 8, 2, 8
    q, k, v = qkv("bshd", b, s, s, h, h, d, gen, device)

    def run(seed):
        tracker = _tracker(seed)
        dpa = te.DotProductAttention(h, d, qkv_format="bshd", attention_dropout=0.5,
                                     get_rng_state_tracker=lambda: tracker)
        return dpa(q, k, v)

    before = torch.get_rng_state()
    first, again, other = run(1234), run(1234), run(99)
    assert torch.equal(torch.get_rng_state(), before)  # the default stream is untouched
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert not torch.equal(first, other)
    no_dropout = te.DotProductAttention(h, d, qkv_format="bshd", attention_dropout=0.5).eval()(q, k, v)
    assert not torch.equal(first, no_dropout)
    torch.testing.assert_close(no_dropout, te.DotProductAttention(h, d, qkv_format="bshd")(q, k, v))


@pytest.mark.parametrize("with_tracker", [False, True])
def test_checkpoint_core_attention_same_grads(device, with_tracker, gen):
    b, s, h, d = 2, 8, 4, 8
    q, k, v = qkv("sbhd", b, s, s, h, h, d, gen, device, requires_grad=True)
    bias = rand((1, h, s, s), gen, device=device, requires_grad=True)
    grad = rand((s, b, h * d), gen, device=device)

    def run(checkpointed):
        tracker = _tracker(7)
        torch.manual_seed(11)
        dpa = te.DotProductAttention(h, d, attention_dropout=0.3, softmax_type="learnable",
                                     get_rng_state_tracker=(lambda: tracker) if with_tracker else None).to(device)
        with torch.no_grad():
            dpa.softmax_offset.fill_(0.25)
        for t in (q, k, v, bias):
            t.grad = None
        out = dpa(q, k, v, checkpoint_core_attention=checkpointed, core_attention_bias_type="post_scale_bias",
                  core_attention_bias=bias)
        out.backward(grad)
        return [out.detach()] + [t.grad.clone() for t in (q, k, v, bias, dpa.softmax_offset)]

    for plain, recomputed in zip(run(False), run(True)):
        torch.testing.assert_close(recomputed, plain, atol=0, rtol=0)


# ---- KV cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("groups", [1, 4])
def test_kv_cache_decode_equals_full(device, fmt, groups, gen):
    b, length, prefill, h, d = 2, 7, 3, 4, 8
    q, k, v = qkv(fmt, b, length, length, h, groups, d, gen, device)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=groups, qkv_format=fmt, attn_mask_type="causal",
                                 layer_number=3)
    full = dpa(q, k, v)
    cache = te.InferenceParams(b, length + 2, num_heads_kv=groups, head_dim_k=d, dtype=torch.float32)
    torch.testing.assert_close(decode_with_cache(dpa, q, k, v, cache, fmt, prefill), full, **TOL)
    assert 3 in cache.cache and cache.sequences == OrderedDict((i, length) for i in range(b))


def test_kv_cache_ragged_sequences_and_slot_reuse(device, gen):
    h, d, hg = 2, 8, 1
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="bshd", attn_mask_type="padding_causal")
    full_len = {"a": 6, "b": 4, "c": 3}
    seqs = {name: qkv("bshd", 1, n, n, h, hg, d, gen, device) for name, n in full_len.items()}
    causal = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="bshd", attn_mask_type="causal")
    expected = {name: causal(*t)[0] for name, t in seqs.items()}
    cache = te.InferenceParams(2, 8)  # heads, head size and dtype come from the first keys

    def batch(steps):  # steps: {name: (start, n)}, padded to the longest step
        width = max(n for _, n in steps.values())
        tensors = []
        for i in range(3):
            rows = []
            for name, (start, n) in steps.items():
                x = seqs[name][i][:, start:start + n]
                rows.append(torch.cat([x, torch.zeros(1, width - n, *x.shape[2:], device=device)], dim=1))
            tensors.append(torch.cat(rows))
        return tensors

    def check(out, steps):
        for row, (name, (start, n)) in enumerate(steps.items()):
            torch.testing.assert_close(out[row, :n], expected[name][start:start + n], **TOL)
            assert torch.all(out[row, n:] == 0)

    steps = OrderedDict(a=(0, 4), b=(0, 2))  # prefill of different lengths
    cache.pre_step(OrderedDict((name, n) for name, (_, n) in steps.items()))
    check(dpa(*batch(steps), inference_params=cache), steps)
    steps = OrderedDict(a=(4, 1), b=(2, 2))
    cache.pre_step(OrderedDict((name, n) for name, (_, n) in steps.items()))
    check(dpa(*batch(steps), inference_params=cache), steps)
    steps = OrderedDict(c=(0, 3), a=(5, 1))  # b finished; c takes its place, listed first
    cache.pre_step(OrderedDict((name, n) for name, (_, n) in steps.items()))
    check(dpa(*batch(steps), inference_params=cache), steps)


def test_kv_cache_offsets_te1_style(device, gen):
    b, length, h, d = 2, 5, 2, 8
    q, k, v = qkv("sbhd", b, length, length, h, h, d, gen, device)
    dpa = te.DotProductAttention(h, d, attn_mask_type="causal")
    full = dpa(q, k, v)
    cache = te.InferenceParams(max_batch_size=b, max_sequence_length=length)
    outs = []
    for start, end in ((0, 2), (2, 3), (3, 5)):
        outs.append(dpa(q[start:end], k[start:end], v[start:end], inference_params=cache))
        cache.sequence_len_offset += end - start
    torch.testing.assert_close(torch.cat(outs), full, **TOL)


def test_inference_params_errors(gen):
    with pytest.raises(NotImplementedError, match="paged"):
        te.InferenceParams(2, 8, num_heads_kv=2, head_dim_k=8, dtype=torch.float32, is_paged=True, page_size=4,
                           total_num_pages=4)
    with pytest.raises(NotImplementedError, match="thd"):
        te.InferenceParams(2, 8, qkv_format="thd")
    with pytest.raises(ValueError, match="max_batch_size"):
        te.InferenceParams(0, 8)
    cache = te.InferenceParams(1, 4)
    with pytest.raises(ValueError, match="max_sequence_length"):
        cache.pre_step(OrderedDict(a=5))
    with pytest.raises(ValueError, match="max_batch_size"):
        cache.pre_step(OrderedDict(a=1, b=1))
    dpa = te.DotProductAttention(2, 8, qkv_format="bshd")
    q, k, v = qkv("bshd", 1, 2, 2, 2, 2, 8, gen)
    cache.pre_step(OrderedDict(a=2))
    with pytest.raises(ValueError, match="attention_mask"):
        dpa(q, k, v, inference_params=cache, attention_mask=torch.zeros(1, 1, 1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="allocate_memory"):
        te.InferenceParams(1, 4).allocate_memory(1)


# ---- bf16 / fp16 on CUDA -----------------------------------------------------------------------


def _torch_same_precision(q, k, v, scale, mask):
    """The unfused computation done by torch in the inputs' precision (bhsd)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "causal_bottom_right", "padding_causal"])
def test_low_precision_cuda(dtype, mask_type, gen):
    b, sq, skv, h, d = 2, 100, 131, 4, 64
    q, k, v = qkv("bshd", b, sq, skv, h, h, d, gen, "cuda", dtype, requires_grad=True)
    lens_q, lens_kv = [sq, 70], [skv, 90]
    kwargs, mask = {}, None
    if "padding" in mask_type:
        kwargs["attention_mask"] = (padding_mask(lens_q, sq, "cuda"), padding_mask(lens_kv, skv, "cuda"))
        mask = reference_mask(mask_type, None, sq, skv, lens_q, lens_kv)
    elif mask_type != "no_mask":
        mask = reference_mask(mask_type, None, sq, skv)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask_type, attention_type="cross")
    out = dpa(q, k, v, **kwargs)
    assert out.dtype == dtype
    ref = reference_out(q.detach().cpu(), k.detach().cpu(), v.detach().cpu(), "bshd", d**-0.5, mask=mask)
    bq, bk, bv = (to_bhsd(x.detach(), "bshd") for x in (q, k, v))
    same = from_bhsd(_torch_same_precision(bq, bk, bv, d**-0.5, None if mask is None else mask.cuda()), "bshd")
    same = torch.nan_to_num(same)  # torch gives NaN on the fully masked (padded) rows; ours 0
    ours_err = (out.double().cpu() - ref).abs().max()
    torch_err = (same.double().cpu() - ref).abs().max()
    assert ours_err <= 3 * torch_err + 1e-6, (ours_err, torch_err)
    out.backward(torch.ones_like(out))
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@requires_cuda
def test_cuda_matches_cpu_cuda_large(gen):
    b, s, h, hg, d = 2, 300, 8, 2, 64
    q, k, v = qkv("sbhd", b, s, s, h, hg, d, gen)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, window_size=(64, 0))
    cpu = dpa(q, k, v)
    cuda = dpa(q.cuda(), k.cuda(), v.cuda())
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-4, rtol=1e-4)


# ---- backend choice ----------------------------------------------------------------------------


def test_backend_choice_and_reasons(monkeypatch):
    params = AttentionParams(qkv_dtype=torch.float32, device_type="cpu")
    choice = get_attention_backend(params)
    assert choice.name == "UnfusedDotProductAttention"
    assert set(choice.reasons) == {"FlashAttention", "FusedAttention"}
    assert any("needs CUDA tensors" in r for r in choice.reasons["FusedAttention"])
    assert any("float16 or bfloat16" in r for r in choice.reasons["FlashAttention"])
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    choice = get_attention_backend(params)
    assert choice.name is None and "NVTE_UNFUSED_ATTN=0" in " ".join(choice.reasons["UnfusedDotProductAttention"])


def test_no_backend_error(monkeypatch, gen):
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    q, k, v = qkv("sbhd", 1, 3, 3, 2, 2, 8, gen)
    with pytest.raises(ValueError, match="(?s)no dot product attention backend.*NVTE_UNFUSED_ATTN=0"):
        te.DotProductAttention(2, 8)(q, k, v)


def test_debug_logging(monkeypatch, caplog, gen):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "1")
    q, k, v = qkv("sbhd", 1, 5, 5, 2, 2, 8, gen)
    with caplog.at_level(logging.INFO, logger="DotProductAttention"):
        te.DotProductAttention(2, 8, attn_mask_type="arbitrary")(q, k, v, attention_mask=torch.zeros(1, 1, 5, 5,
                                                                                                     dtype=torch.bool))
    text = caplog.text
    assert "Running with UnfusedDotProductAttention backend" in text
    assert "Disabling FlashAttention" in text and "arbitrary" in text
    assert "Disabling FusedAttention" in text


# ---- errors ------------------------------------------------------------------------------------


def test_constructor_errors():
    with pytest.raises(ValueError, match="num_gqa_groups"):
        te.DotProductAttention(6, 8, num_gqa_groups=4)
    with pytest.raises(ValueError, match="qkv_format"):
        te.DotProductAttention(2, 8, qkv_format="bhsd")
    with pytest.raises(ValueError, match="attn_mask_type"):
        te.DotProductAttention(2, 8, attn_mask_type="upper")
    with pytest.raises(ValueError, match="softmax_type"):
        te.DotProductAttention(2, 8, softmax_type="sigmoid")
    with pytest.raises(ValueError, match="attention_type"):
        te.DotProductAttention(2, 8, attention_type="both")
    with pytest.raises(ValueError, match="attention_dropout"):
        te.DotProductAttention(2, 8, attention_dropout=1.5)
    with pytest.raises(ValueError, match="kv_channels"):
        te.DotProductAttention(2, (8, 8, 8))
    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        te.DotProductAttention(2, 8, tp_size=2)
    with pytest.raises(ValueError, match="cp_comm_type"):
        te.DotProductAttention(2, 8, cp_comm_type="ring")


def test_forward_errors(gen):
    dpa = te.DotProductAttention(4, 8, num_gqa_groups=2, qkv_format="bshd", attn_mask_type="no_mask")
    q, k, v = qkv("bshd", 2, 5, 5, 4, 2, 8, gen)
    with pytest.raises(ValueError, match="query_layer .* 4 heads"):
        dpa(q[:, :, :3], k, v)
    with pytest.raises(ValueError, match="key_layer .* 2 heads"):
        dpa(q, q, v)
    with pytest.raises(ValueError, match="value_layer .* size 8"):
        dpa(q, k, v[..., :4])
    with pytest.raises(ValueError, match="4-D"):
        dpa(q[0], k, v)
    with pytest.raises(TypeError, match="one dtype"):
        dpa(q, k.half(), v)
    with pytest.raises(TypeError, match="query_layer must be float16"):
        dpa(q.int(), k, v)
    with pytest.raises(ValueError, match="batch size"):
        dpa(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="qkv_format"):
        dpa(q, k, v, qkv_format="bsd")
    with pytest.raises(ValueError, match="attn_mask_type"):
        dpa(q, k, v, attn_mask_type="diagonal")
    with pytest.raises(ValueError, match="attention_mask or cu_seqlens"):
        dpa(q, k, v, attn_mask_type="padding")
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[2, 1, 1, 5\]"):
        dpa(q, k, v, attn_mask_type="padding", attention_mask=torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attention_mask must be a bool"):
        dpa(q, k, v, attn_mask_type="padding", attention_mask=torch.zeros(2, 1, 1, 5))
    with pytest.raises(TypeError, match="attention_mask must be bool"):
        dpa(q, k, v, attn_mask_type="arbitrary", attention_mask=torch.zeros(2, 1, 5, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        dpa(q, k, v, attn_mask_type="arbitrary", attention_mask=torch.zeros(3, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="core_attention_bias_type"):
        dpa(q, k, v, core_attention_bias_type="relative")
    with pytest.raises(ValueError, match="needs core_attention_bias"):
        dpa(q, k, v, core_attention_bias_type="post_scale_bias")
    with pytest.raises(ValueError, match="core_attention_bias must have shape"):
        dpa(q, k, v, core_attention_bias_type="post_scale_bias", core_attention_bias=torch.zeros(1, 4, 5, 4))
    with pytest.raises(ValueError, match="core_attention_bias must be None"):
        dpa(q, k, v, core_attention_bias=torch.zeros(1, 4, 5, 5))
    with pytest.raises(ValueError, match="alibi_slopes needs"):
        dpa(q, k, v, alibi_slopes=torch.ones(4))
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        dpa(q, k, v, core_attention_bias_type="alibi", alibi_slopes=torch.ones(3))
    with pytest.warns(UserWarning, match="attention_mask is ignored"):
        dpa(q, k, v, attention_mask=torch.zeros(2, 1, 1, 5, dtype=torch.bool))


def test_thd_errors(gen):
    dpa = te.DotProductAttention(2, 8, qkv_format="thd", attn_mask_type="padding")
    q, k, v = (rand((6, 2, 8), gen) for _ in range(3))
    cu = lengths_to_cu([2, 4])
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_kv"):
        dpa(q, k, v)
    with pytest.raises(TypeError, match="cu_seqlens_q must be int32"):
        dpa(q, k, v, cu_seqlens_q=cu.long(), cu_seqlens_kv=cu)
    with pytest.raises(ValueError, match=r"cu_seqlens_kv must have shape \[3\]"):
        dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu[:2])
    with pytest.raises(ValueError, match="padding attn_mask_type"):
        dpa(q, k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu, attn_mask_type="causal")
    with pytest.raises(ValueError, match="3-D"):
        dpa(q[None], k, v, cu_seqlens_q=cu, cu_seqlens_kv=cu)
