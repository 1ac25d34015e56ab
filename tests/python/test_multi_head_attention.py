"""te.MultiheadAttention: against torch.nn.MultiheadAttention (weights copied over) and a
float64 reference (transformer_reference.py) for GQA, cross attention, rotary embedding
and QK normalization; the fused / interleaved QKV layouts against the separate q / k / v
parameters; the thd format against per-sequence runs; return tuples, parameter names and
the errors.

Tolerances: float32 layers of hidden size <= 64 and <= 8 positions: every output and
gradient is a few sums of <= 64 float32 products (GEMMs, softmax), within a few ulps of
the float64 value per term; 2e-5 absolute and relative covers that with margin, while a
wrong head, mask entry or weight block moves values by ~1e-2 or more.
"""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICES
from transformer_reference import AttnConfig, mha, params64

import transformer_engine.pytorch as te

TOL = dict(atol=2e-5, rtol=2e-5)


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Fresh random values for every parameter (biases and norm weights start as 0 / 1,
    which would hide a wrong bias or norm layout)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).mul_(0.3).to(p.dtype))


def make_mha(device, seed=0, **kwargs):
    kwargs.setdefault("attention_dropout", 0.0)
    kwargs.setdefault("params_dtype", torch.float32)
    m = te.MultiheadAttention(kwargs.pop("hidden", 32), kwargs.pop("heads", 4), device=device, **kwargs)
    randomize(m, seed)
    return m


def grads(out, tensors, grad_out):
    return torch.autograd.grad(out, tensors, grad_out, allow_unused=True)


def check_against_reference(m, x, cfg, device, encoder_output=None, freqs=None, **forward_kwargs):
    """Forward and every gradient (input(s) and parameters) of ``m`` against mha()."""
    params = dict(m.named_parameters())
    p64 = params64(m)
    inputs = [x] + ([encoder_output] if encoder_output is not None else [])
    inputs64 = [t.detach().double().cpu().requires_grad_() for t in inputs]
    out = m(x, encoder_output=encoder_output, rotary_pos_emb=freqs, **forward_kwargs)
    ref, ref_bias, _ = mha(p64, inputs64[0], cfg, encoder_output=inputs64[1] if encoder_output is not None else None,
                           freqs=None if freqs is None else (tuple(f.cpu() for f in freqs) if isinstance(freqs, tuple)
                                                             else freqs.cpu()))
    ref = ref + ref_bias
    torch.testing.assert_close(out.double().cpu(), ref, **TOL)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    got = grads(out, inputs + list(params.values()), g.to(device=device, dtype=out.dtype))
    want = grads(ref, inputs64 + list(p64.values()), g)
    names = ["input"] * len(inputs) + list(params)
    for name, a, b in zip(names, got, want):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a.double().cpu(), b, **TOL, msg=lambda m, n=name: f"{n}: {m}")


# ---- against torch.nn.MultiheadAttention ---------------------------------------------------------------


def torch_mha_from(m: te.MultiheadAttention, batch_first: bool) -> torch.nn.MultiheadAttention:
    ref = torch.nn.MultiheadAttention(m.hidden_size, m.num_attention_heads, dropout=0.0, batch_first=batch_first,
                                      device="cpu", dtype=torch.float32)
    lin = m.layernorm_qkv if m.input_layernorm else m.qkv
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([lin.query_weight, lin.key_weight, lin.value_weight]).cpu())
        ref.in_proj_bias.copy_(torch.cat([lin.query_bias, lin.key_bias, lin.value_bias]).cpu())
        ref.out_proj.weight.copy_(m.proj.weight.cpu())
        ref.out_proj.bias.copy_(m.proj.bias.cpu())
    return ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("mask", ["no_mask", "causal"])
def test_matches_torch_multihead_attention(device, fmt, mask):
    m = make_mha(device, seed=1, attn_mask_type=mask, qkv_format=fmt)
    ref = torch_mha_from(m, batch_first=fmt == "bshd")
    s, b = 7, 3
    shape = (s, b, 32) if fmt == "sbhd" else (b, s, 32)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    x_te = x.to(device, copy=True).requires_grad_()
    x_ref = x.clone().requires_grad_()
    out = m(x_te)
    causal = torch.ones(s, s, dtype=torch.bool).triu(1) if mask == "causal" else None
    out_ref, _ = ref(x_ref, x_ref, x_ref, attn_mask=causal, need_weights=False)
    torch.testing.assert_close(out.cpu(), out_ref, **TOL)

    g = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    out.backward(g.to(device))
    out_ref.backward(g)
    lin = m.qkv
    torch.testing.assert_close(x_te.grad.cpu(), x_ref.grad, **TOL)
    torch.testing.assert_close(torch.cat([lin.query_weight.grad, lin.key_weight.grad, lin.value_weight.grad]).cpu(),
                               ref.in_proj_weight.grad, **TOL)
    torch.testing.assert_close(torch.cat([lin.query_bias.grad, lin.key_bias.grad, lin.value_bias.grad]).cpu(),
                               ref.in_proj_bias.grad, **TOL)
    torch.testing.assert_close(m.proj.weight.grad.cpu(), ref.out_proj.weight.grad, **TOL)
    torch.testing.assert_close(m.proj.bias.grad.cpu(), ref.out_proj.bias.grad, **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_attention_matches_torch(device):
    m = make_mha(device, seed=4, attention_type="cross", attn_mask_type="no_mask")
    assert not hasattr(m, "qkv") and m.key_value.key_weight.shape == (32, 32)
    ref = torch.nn.MultiheadAttention(32, 4, dropout=0.0)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.query_layer.weight, m.key_value.key_weight,
                                            m.key_value.value_weight]).cpu())
        ref.in_proj_bias.copy_(torch.cat([m.query_layer.bias, m.key_value.key_bias, m.key_value.value_bias]).cpu())
        ref.out_proj.weight.copy_(m.proj.weight.cpu())
        ref.out_proj.bias.copy_(m.proj.bias.cpu())
    gen = torch.Generator().manual_seed(5)
    x, memory = torch.randn(4, 2, 32, generator=gen), torch.randn(9, 2, 32, generator=gen)
    x_te, mem_te = x.to(device, copy=True).requires_grad_(), memory.to(device, copy=True).requires_grad_()
    x_ref, mem_ref = x.clone().requires_grad_(), memory.clone().requires_grad_()
    out = m(x_te, encoder_output=mem_te)
    out_ref, _ = ref(x_ref, mem_ref, mem_ref, need_weights=False)
    torch.testing.assert_close(out.cpu(), out_ref, **TOL)
    out.sum().backward()
    out_ref.sum().backward()
    torch.testing.assert_close(x_te.grad.cpu(), x_ref.grad, **TOL)
    torch.testing.assert_close(mem_te.grad.cpu(), mem_ref.grad, **TOL)
    torch.testing.assert_close(m.query_layer.weight.grad.cpu(), ref.in_proj_weight.grad[:32], **TOL)


# ---- against the float64 reference ---------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("input_layernorm,normalization", [(True, "LayerNorm"), (True, "RMSNorm"), (False, None)])
def test_gqa_against_reference(device, groups, input_layernorm, normalization):
    kwargs = dict(num_gqa_groups=groups, input_layernorm=input_layernorm, kv_channels=8)
    if normalization:
        kwargs["normalization"] = normalization
    m = make_mha(device, seed=6, **kwargs)
    assert m.qkv_weight_interleaved is False  # separate q / k / v parameters are never interleaved
    x = torch.randn(6, 2, 32, generator=torch.Generator().manual_seed(7)).to(device).requires_grad_()
    cfg = AttnConfig(4, groups, 8, input_layernorm=input_layernorm, normalization=normalization or "LayerNorm")
    check_against_reference(m, x, cfg, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups", [1, 4])
def test_cross_attention_against_reference(device, groups):
    m = make_mha(device, seed=8, attention_type="cross", attn_mask_type="no_mask", input_layernorm=True,
                 num_gqa_groups=groups, qkv_format="bshd")
    assert set(dict(m.named_parameters())) >= {"layernorm_query.query_weight", "layernorm_query.layer_norm_weight",
                                               "key_value.key_weight", "key_value.value_bias"}
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 5, 32, generator=gen).to(device).requires_grad_()
    memory = torch.randn(2, 8, 32, generator=gen).to(device).requires_grad_()
    cfg = AttnConfig(4, groups, 8, fmt="bshd", attention_type="cross", mask="no_mask")
    check_against_reference(m, x, cfg, device, encoder_output=memory)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("pair", [False, True])
def test_rotary(device, fmt, interleaved, pair):
    m = make_mha(device, seed=10, input_layernorm=True, num_gqa_groups=2, qkv_format=fmt,
                 rotary_pos_interleaved=interleaved)
    rope = te.RotaryPositionEmbedding(8, rotary_percent=0.5 if pair else 1.0, interleaved=interleaved)
    freqs = rope(10).to(device)
    if pair:  # different angles for keys: the pair's order matters
        freqs = (freqs, rope(10, offset=3).to(device))
    shape = (6, 2, 32) if fmt == "sbhd" else (2, 6, 32)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(11)).to(device).requires_grad_()
    cfg = AttnConfig(4, 2, 8, fmt=fmt, rotary_interleaved=interleaved)
    check_against_reference(m, x, cfg, device, freqs=freqs)
    plain = m(x)
    assert not torch.allclose(plain, m(x, rotary_pos_emb=freqs), atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qk_norm_type", ["L2Normalization", "RMSNorm", "LayerNorm"])
@pytest.mark.parametrize("before_rope", [False, True])
def test_qk_norm(device, qk_norm_type, before_rope):
    m = make_mha(device, seed=12, input_layernorm=True, num_gqa_groups=2, qk_norm_type=qk_norm_type,
                 qk_norm_eps=1e-3, qk_norm_before_rope=before_rope)
    names = {n for n, _ in m.named_parameters()}
    if qk_norm_type == "L2Normalization":
        assert m.q_norm is m.k_norm and not any("norm." in n for n in names if n.startswith(("q_", "k_")))
    else:
        assert {"q_norm.weight", "k_norm.weight"} <= names
        assert ("q_norm.bias" in names) == (qk_norm_type == "LayerNorm")
    freqs = te.RotaryPositionEmbedding(8)(8).to(device)
    x = torch.randn(5, 2, 32, generator=torch.Generator().manual_seed(13)).to(device).requires_grad_()
    cfg = AttnConfig(4, 2, 8, qk_norm_type=qk_norm_type, qk_norm_eps=1e-3, qk_norm_before_rope=before_rope)
    check_against_reference(m, x, cfg, device, freqs=freqs)


# ---- QKV layouts -----------------------------------------------------------------------------------------


def interleave_qkv(q, k, v, groups: int):
    """Separate [np*hn, ..], [ng*hn, ..], [ng*hn, ..] blocks as the interleaved fused layout
    [ng, np/ng + 2, hn, ..]."""
    per_group_q = q.reshape(groups, -1, *q.shape[1:])  # [ng, r*hn, ..]
    parts = [per_group_q, k.reshape(groups, -1, *k.shape[1:]), v.reshape(groups, -1, *v.shape[1:])]
    return torch.cat(parts, dim=1).reshape(-1, *q.shape[1:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("input_layernorm", [False, True])
def test_fused_qkv_layouts_round_trip(device, groups, input_layernorm):
    split = make_mha(device, seed=14, num_gqa_groups=groups, input_layernorm=input_layernorm)
    fused = make_mha(device, num_gqa_groups=groups, input_layernorm=input_layernorm, fuse_qkv_params=True,
                     qkv_weight_interleaved=False)
    inter = make_mha(device, num_gqa_groups=groups, input_layernorm=input_layernorm, fuse_qkv_params=True)
    assert inter.qkv_weight_interleaved and not fused.qkv_weight_interleaved
    name = "layernorm_qkv" if input_layernorm else "qkv"
    src = getattr(split, name)
    blocks = {kind: [getattr(src, f"{part}_{kind}") for part in ("query", "key", "value")]
              for kind in ("weight", "bias")}
    with torch.no_grad():
        for target, layout in ((fused, lambda q, k, v: torch.cat([q, k, v])),
                               (inter, lambda q, k, v: interleave_qkv(q, k, v, groups))):
            lin = getattr(target, name)
            lin.weight.copy_(layout(*blocks["weight"]))
            lin.bias.copy_(layout(*blocks["bias"]))
            target.proj.load_state_dict(split.proj.state_dict())
            if input_layernorm:
                lin.layer_norm_weight.copy_(src.layer_norm_weight)
                lin.layer_norm_bias.copy_(src.layer_norm_bias)
    x = torch.randn(6, 2, 32, generator=torch.Generator().manual_seed(15)).to(device).requires_grad_()
    want = split(x)
    want_dx, = torch.autograd.grad(want.sum(), x)
    for target in (fused, inter):
        out = target(x)
        torch.testing.assert_close(out, want, **TOL)
        dx, dw = torch.autograd.grad(out.sum(), [x, getattr(target, name).weight])
        torch.testing.assert_close(dx, want_dx, **TOL)
        if target is fused:  # the fused gradient is the separate ones, concatenated
            want_dw = torch.autograd.grad(split(x).sum(), blocks["weight"])
            torch.testing.assert_close(dw, torch.cat(want_dw), **TOL)
    # With more than one group the two fused layouts really differ (with one they coincide).
    if groups > 1:
        assert not torch.equal(getattr(fused, name).weight, getattr(inter, name).weight)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_cross_attention_layouts(device):
    groups, hn = 2, 8
    split = make_mha(device, seed=16, attention_type="cross", num_gqa_groups=groups, attn_mask_type="no_mask")
    inter = make_mha(device, attention_type="cross", num_gqa_groups=groups, attn_mask_type="no_mask",
                     fuse_qkv_params=True)
    with torch.no_grad():
        kv = split.key_value
        # interleaved: [ng, 2, hn] (each group's key head, then its value head)
        for kind in ("weight", "bias"):
            k, v = getattr(kv, f"key_{kind}"), getattr(kv, f"value_{kind}")
            both = torch.stack([k.reshape(groups, hn, -1), v.reshape(groups, hn, -1)], dim=1)
            getattr(inter.key_value, kind).copy_(both.reshape(k.shape[0] * 2, *k.shape[1:]))
        inter.query_layer.weight.copy_(split.query_layer.weight)
        inter.query_layer.bias.copy_(split.query_layer.bias)
        inter.proj.load_state_dict(split.proj.state_dict())
    gen = torch.Generator().manual_seed(17)
    x, memory = torch.randn(3, 2, 32, generator=gen).to(device), torch.randn(5, 2, 32, generator=gen).to(device)
    torch.testing.assert_close(inter(x, encoder_output=memory), split(x, encoder_output=memory), **TOL)


# ---- return values, formats ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_return_bias_and_layernorm_output(device):
    plain = make_mha(device, seed=18, input_layernorm=True)
    both = make_mha(device, input_layernorm=True, return_bias=True, return_layernorm_output=True)
    both.load_state_dict(plain.state_dict())
    x = torch.randn(4, 2, 32, generator=torch.Generator().manual_seed(19)).to(device)
    out, bias, ln_out = both(x)
    torch.testing.assert_close(out + bias, plain(x), **TOL)
    assert bias is both.proj.bias  # the parameter itself: its gradient flows through the caller's add
    lin = plain.layernorm_qkv
    torch.testing.assert_close(ln_out, torch.nn.functional.layer_norm(x, (32,), lin.layer_norm_weight,
                                                                     lin.layer_norm_bias, 1e-5), **TOL)
    only_bias = make_mha(device, return_bias=True, return_layernorm_output=True)  # no input norm: no ln output
    result = only_bias(x)
    assert isinstance(result, tuple) and len(result) == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_rope", [False, True])
def test_thd_matches_per_sequence(device, with_rope):
    lengths = [3, 5, 2]
    thd = make_mha(device, seed=20, input_layernorm=True, num_gqa_groups=2, qkv_format="thd",
                   attn_mask_type="padding_causal")
    sbhd = make_mha(device, input_layernorm=True, num_gqa_groups=2)
    sbhd.load_state_dict(thd.state_dict())
    x = torch.randn(sum(lengths), 32, generator=torch.Generator().manual_seed(21)).to(device)
    cu = torch.tensor([0, 3, 8, 10], dtype=torch.int32, device=device)
    freqs = te.RotaryPositionEmbedding(8)(8).to(device) if with_rope else None
    out = thd(x, cu_seqlens_q=cu, cu_seqlens_kv=cu, rotary_pos_emb=freqs)
    assert out.shape == (10, 32)
    for i, n in enumerate(lengths):
        seq = x[int(cu[i]):int(cu[i + 1])].unsqueeze(1)  # [s, 1, hidden]
        torch.testing.assert_close(out[int(cu[i]):int(cu[i + 1])], sbhd(seq, rotary_pos_emb=freqs)[:, 0], **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_bias_passes_through(device):
    m = make_mha(device, seed=23, attn_mask_type="no_mask", num_gqa_groups=2)
    x = torch.randn(5, 2, 32, generator=torch.Generator().manual_seed(24)).to(device)
    future = torch.ones(5, 5, dtype=torch.bool, device=device).triu(1)
    bias = torch.zeros(1, 4, 5, 5, device=device).masked_fill(future, -1e9)
    biased = m(x, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    torch.testing.assert_close(biased, m(x, attn_mask_type="causal"), **TOL)
    assert not torch.allclose(biased, m(x), atol=1e-3)
    window = m(x, attn_mask_type="causal", window_size=(1, 0))
    near = bias.masked_fill(torch.ones(5, 5, dtype=torch.bool, device=device).tril(-2), -1e9)
    torch.testing.assert_close(window, m(x, core_attention_bias_type="post_scale_bias", core_attention_bias=near),
                               **TOL)


# ---- parameters ----------------------------------------------------------------------------------------


def test_parameter_names_as_transformer_engine():
    def names(**kwargs):
        return [n for n, _ in te.MultiheadAttention(32, 4, device="cpu", **kwargs).named_parameters()]

    assert names(input_layernorm=True, fuse_qkv_params=True) == [
        "layernorm_qkv.layer_norm_weight", "layernorm_qkv.layer_norm_bias", "layernorm_qkv.weight",
        "layernorm_qkv.bias", "proj.weight", "proj.bias"]
    assert names() == ["qkv.query_weight", "qkv.query_bias", "qkv.key_weight", "qkv.key_bias", "qkv.value_weight",
                       "qkv.value_bias", "proj.weight", "proj.bias"]
    assert names(bias=False, input_layernorm=True, normalization="RMSNorm", qk_norm_type="RMSNorm") == [
        "q_norm.weight", "k_norm.weight", "layernorm_qkv.layer_norm_weight", "layernorm_qkv.query_weight",
        "layernorm_qkv.key_weight", "layernorm_qkv.value_weight", "proj.weight"]
    assert names(attention_type="cross", input_layernorm=True, fuse_qkv_params=True, bias=False) == [
        "layernorm_query.layer_norm_weight", "layernorm_query.layer_norm_bias", "layernorm_query.weight",
        "key_value.weight", "proj.weight"]
    assert names(attention_type="cross", bias=False) == ["query_layer.weight", "key_value.key_weight",
                                                         "key_value.value_weight", "proj.weight"]
    assert "core_attention.softmax_offset" in names(softmax_type="learnable")
    m = te.MultiheadAttention(32, 4, num_gqa_groups=2, kv_channels=16, device="cpu", fuse_qkv_params=True,
                              params_dtype=torch.bfloat16)
    assert m.qkv.weight.shape == (4 * 16 + 2 * 2 * 16, 32) and m.proj.weight.shape == (32, 64)
    assert m.qkv.weight.dtype == torch.bfloat16
    assert "transformer_engine.pytorch" in type(m).__module__


def test_init_methods_and_layer_number():
    m = te.MultiheadAttention(32, 4, device="cpu", init_method=torch.nn.init.zeros_,
                              output_layer_init_method=torch.nn.init.ones_, layer_number=3)
    assert torch.all(m.qkv.query_weight == 0) and torch.all(m.proj.weight == 1)
    assert m.core_attention.layer_number == 3 and te.MultiheadAttention(32, 4, device="cpu").layer_number == 1


@pytest.mark.parametrize("device", DEVICES)
def test_learnable_softmax_and_fp8_dims(device):
    m = make_mha(device, seed=22, softmax_type="learnable")
    assert m.core_attention.softmax_offset.device.type == torch.device(device).type
    x = torch.randn(4, 2, 32, device=device)
    out = m(x)
    out.sum().backward()
    assert m.core_attention.softmax_offset.grad is not None


# ---- errors ---------------------------------------------------------------------------------------------


def test_constructor_errors():
    with pytest.raises(ValueError, match="attention_type"):
        te.MultiheadAttention(32, 4, attention_type="encoder", device="cpu")
    with pytest.raises(ValueError, match="num_gqa_groups"):
        te.MultiheadAttention(32, 4, num_gqa_groups=3, device="cpu")
    with pytest.raises(ValueError, match="qk_norm_type"):
        te.MultiheadAttention(32, 4, qk_norm_type="BatchNorm", device="cpu")
    with pytest.raises(ValueError, match="qkv_format"):
        te.MultiheadAttention(32, 4, qkv_format="hsbd", device="cpu")
    with pytest.raises(ValueError, match="attention_dropout"):
        te.MultiheadAttention(32, 4, attention_dropout=1.5, device="cpu")
    with pytest.raises(ValueError, match="layer_number"):
        te.MultiheadAttention(32, 4, layer_number=0, device="cpu")
    with pytest.raises(ValueError, match="normalization"):
        te.MultiheadAttention(32, 4, input_layernorm=True, normalization="BatchNorm", device="cpu")
    with pytest.raises(ValueError, match="softmax_type"):
        te.MultiheadAttention(32, 4, softmax_type="sparsemax", device="cpu")
    with pytest.raises(NotImplementedError, match="ub_overlap_ag"):
        te.MultiheadAttention(32, 4, ub_overlap_ag=True, device="cpu")
    with pytest.raises(NotImplementedError, match="tensor parallel"):
        te.MultiheadAttention(32, 4, tp_size=2, device="cpu")


def test_forward_errors():
    self_attn = te.MultiheadAttention(32, 4, device="cpu", attention_dropout=0.0)
    with pytest.raises(ValueError, match="3-D"):
        self_attn(torch.randn(4, 32))
    with pytest.raises(TypeError, match="hidden_states"):
        self_attn([1.0])
    with pytest.raises(ValueError, match="in_features"):
        self_attn(torch.randn(4, 2, 16))
    with pytest.raises(TypeError, match="rotary_pos_emb"):
        self_attn(torch.randn(4, 2, 32), rotary_pos_emb=(torch.zeros(4, 1, 1, 8),))
    with pytest.raises(ValueError, match="attn_mask_type"):
        self_attn(torch.randn(4, 2, 32), attn_mask_type="diagonal")
    cross = te.MultiheadAttention(32, 4, attention_type="cross", device="cpu")
    with pytest.raises(ValueError, match="encoder_output"):
        cross(torch.randn(4, 2, 32))
    thd = te.MultiheadAttention(32, 4, qkv_format="thd", attn_mask_type="padding", device="cpu")
    with pytest.raises(ValueError, match="cu_seqlens"):
        thd(torch.randn(6, 32), rotary_pos_emb=torch.zeros(6, 1, 1, 8))
