"""te.TransformerLayer: a hand-written GPT block (pre-LN, causal, gelu MLP) with the weights
read by Transformer Engine's parameter names, forward and every gradient; the float64
reference of transformer_reference.py for the other architectures (GQA, decoder with cross
attention, output_layernorm, apply_residual_connection_post_layernorm,
parallel_attention_mlp, RMSNorm / swiglu, rotary, qk_norm); fused QKV parameters; KV-cache
decoding against full recomputation; dropout and stochastic depth under an RNG tracker;
FP8 against BF16; parameter names; the errors.

Tolerances: as test_multi_head_attention.py (float32, hidden 32, <= 8 positions: 2e-5);
a layer chains two blocks, each within a few ulps per term of float64, so the same bound
holds with margin.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICES
from transformer_reference import AttnConfig, LayerConfig, params64, transformer_layer

import transformer_engine.pytorch as te
from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling
from transformer_engine.pytorch.transformer import DropPath

TOL = dict(atol=2e-5, rtol=2e-5)
HIDDEN, FFN, HEADS = 32, 64, 4


# FP8GlobalStateManager reset before and after each test (conftest.py)
pytestmark = pytest.mark.usefixtures("fresh_fp8_state")


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Random values for every parameter, biases and norm weights included (their initial
    zeros / ones would hide a wrong bias or norm)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).mul_(0.3).to(p.dtype))


def make_layer(device, seed=0, **kwargs):
    kwargs.setdefault("hidden_dropout", 0.0)
    kwargs.setdefault("attention_dropout", 0.0)
    kwargs.setdefault("params_dtype", torch.float32)
    layer = te.TransformerLayer(HIDDEN, kwargs.pop("ffn", FFN), HEADS, device=device, **kwargs)
    randomize(layer, seed)
    return layer


def hidden(shape, seed, device, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device=device, dtype=dtype)


def compare_with(reference, layer, inputs, device, forward=None):
    """Forward and every gradient (inputs and parameters) of ``forward(*inputs)`` (default:
    ``layer(*inputs)``) against ``reference(params64, *inputs64)``."""
    params = dict(layer.named_parameters())
    p64 = params64(layer)
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    inputs64 = [t.detach().double().cpu().requires_grad_() for t in inputs]
    out = (forward or layer)(*inputs)
    ref = reference(p64, *inputs64)
    torch.testing.assert_close(out.double().cpu(), ref, **TOL)
    g = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(99))
    got = torch.autograd.grad(out, inputs + list(params.values()), g.to(device=device, dtype=out.dtype))
    want = torch.autograd.grad(ref, inputs64 + list(p64.values()), g)
    for name, a, b in zip([f"input{i}" for i in range(len(inputs))] + list(params), got, want):
        torch.testing.assert_close(a.double().cpu(), b, **TOL, msg=lambda m, n=name: f"{n}: {m}")


# ---- a GPT block written out by hand ------------------------------------------------------------------


def gpt_block(p, x):
    """Pre-LN GPT block on x [s, b, hidden] (float64), weights by TE's names."""
    s, b, _ = x.shape
    hn = HIDDEN // HEADS
    qkv = "self_attention.layernorm_qkv."
    ln1 = F.layer_norm(x, (HIDDEN,), p[qkv + "layer_norm_weight"], p[qkv + "layer_norm_bias"], 1e-5)

    def heads(part):  # [s, b, hidden] -> [b, heads, s, hn]
        y = F.linear(ln1, p[f"{qkv}{part}_weight"], p[f"{qkv}{part}_bias"])
        return y.view(s, b, HEADS, hn).permute(1, 2, 0, 3)

    q, k, v = heads("query"), heads("key"), heads("value")
    scores = q @ k.transpose(-1, -2) / math.sqrt(hn)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    context = (scores.softmax(-1) @ v).permute(2, 0, 1, 3).reshape(s, b, HIDDEN)
    x = x + F.linear(context, p["self_attention.proj.weight"], p["self_attention.proj.bias"])
    mlp = "layernorm_mlp."
    ln2 = F.layer_norm(x, (HIDDEN,), p[mlp + "layer_norm_weight"], p[mlp + "layer_norm_bias"], 1e-5)
    h = F.gelu(F.linear(ln2, p[mlp + "fc1_weight"], p[mlp + "fc1_bias"]), approximate="tanh")
    return x + F.linear(h, p[mlp + "fc2_weight"], p[mlp + "fc2_bias"])


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_block(device):
    layer = make_layer(device, seed=1)
    compare_with(gpt_block, layer, [hidden((7, 3, HIDDEN), 2, device)], device)


# ---- architectures against the float64 reference ------------------------------------------------------


ARCHITECTURES = {
    "gqa": (dict(num_gqa_groups=2), dict()),
    "mqa_bshd": (dict(num_gqa_groups=1, attn_input_format="bshd"), dict(fmt="bshd")),
    "rmsnorm_swiglu": (dict(normalization="RMSNorm", activation="swiglu"), dict(normalization="RMSNorm")),
    "output_layernorm": (dict(output_layernorm=True), dict()),
    "post_ln_residual": (dict(apply_residual_connection_post_layernorm=True), dict()),
    "post_ln_residual_output_layernorm": (dict(apply_residual_connection_post_layernorm=True,
                                               output_layernorm=True), dict()),
    "parallel_attention_mlp": (dict(parallel_attention_mlp=True, num_gqa_groups=2), dict()),
    "no_mask_kv_channels": (dict(self_attn_mask_type="no_mask", kv_channels=16), dict(mask="no_mask", head_dim=16)),
}


def layer_config(te_kwargs, attn_kwargs, **layer_kwargs):
    attn = dict(heads=HEADS, groups=te_kwargs.get("num_gqa_groups", HEADS), head_dim=HIDDEN // HEADS)
    attn.update(attn_kwargs)
    keys = {"activation": "activation", "output_layernorm": "output_layernorm",
            "apply_residual_connection_post_layernorm": "post_ln_residual",
            "parallel_attention_mlp": "parallel_attention_mlp", "layer_type": "layer_type"}
    cfg = {ours: te_kwargs[theirs] for theirs, ours in keys.items() if theirs in te_kwargs}
    cfg.update(layer_kwargs)
    return LayerConfig(AttnConfig(**attn), **cfg)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_architectures(device, arch):
    te_kwargs, attn_kwargs = ARCHITECTURES[arch]
    layer = make_layer(device, seed=3, **te_kwargs)
    cfg = layer_config(te_kwargs, attn_kwargs)
    shape = (2, 6, HIDDEN) if cfg.attn.fmt == "bshd" else (6, 2, HIDDEN)
    compare_with(lambda p, x: transformer_layer(p, x, cfg), layer, [hidden(shape, 4, device)], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("post_ln_residual", [False, True])
def test_decoder_with_cross_attention(device, post_ln_residual):
    te_kwargs = dict(layer_type="decoder", num_gqa_groups=2,
                     apply_residual_connection_post_layernorm=post_ln_residual)
    layer = make_layer(device, seed=5, **te_kwargs)
    assert isinstance(layer.inter_attention, te.MultiheadAttention)
    assert layer.inter_attention.attention_type == "cross"
    cfg = layer_config(te_kwargs, {})
    x, memory = hidden((5, 2, HIDDEN), 6, device), hidden((8, 2, HIDDEN), 7, device)
    compare_with(lambda p, h, enc: transformer_layer(p, h, cfg, encoder_output=enc), layer, [x, memory], device,
                 forward=lambda h, enc: layer(h, encoder_output=enc))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qk_norm_type", [None, "RMSNorm"])
def test_rotary_and_qk_norm(device, qk_norm_type):
    te_kwargs = dict(num_gqa_groups=2, qk_norm_type=qk_norm_type)
    layer = make_layer(device, seed=9, **te_kwargs)
    cfg = layer_config(te_kwargs, dict(qk_norm_type=qk_norm_type))
    # on the GPU when there is one (as Transformer Engine's): the float64 reference runs on the CPU
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(12).cpu()
    x = hidden((6, 2, HIDDEN), 10, device)
    compare_with(lambda p, h: transformer_layer(p, h, cfg, freqs=freqs), layer, [x], device,
                 forward=lambda h: layer(h, rotary_pos_emb=freqs.to(device)))


# ---- fused QKV parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_fused_qkv_params_match_split(device):
    split = make_layer(device, seed=11, num_gqa_groups=2)
    fused = make_layer(device, num_gqa_groups=2, fuse_qkv_params=True)
    assert fused.self_attention.qkv_weight_interleaved
    state = split.state_dict()
    prefix = "self_attention.layernorm_qkv."
    groups, hn = 2, HIDDEN // HEADS
    for kind in ("weight", "bias"):
        q, k, v = (state.pop(f"{prefix}{part}_{kind}") for part in ("query", "key", "value"))
        # Interleaved per group: [ng, r + 2, hn]: the group's r query heads, its key, its value.
        per_group = [t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)]
        state[prefix + kind] = torch.cat(per_group, dim=1).reshape(-1, *q.shape[1:])
        assert state[prefix + kind].shape[0] == (HEADS + 2 * groups) * hn
    fused.load_state_dict(state)
    x = hidden((5, 2, HIDDEN), 12, device)
    torch.testing.assert_close(fused(x), split(x), **TOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fuse_qkv_params", [True, False], ids=["qkv_fused", "qkv_split"])
def test_fuse_wgrad_accumulation(device, fuse_qkv_params):
    layer = make_layer(device, seed=13, fuse_qkv_params=fuse_qkv_params, fuse_wgrad_accumulation=True)
    plain = make_layer(device, fuse_qkv_params=fuse_qkv_params)
    plain.load_state_dict(layer.state_dict())
    weights = {n: p for n, p in layer.named_parameters()
               if n.endswith("weight") and not n.endswith("layer_norm_weight")}
    qkv = (["self_attention.layernorm_qkv.weight"] if fuse_qkv_params else
           [f"self_attention.layernorm_qkv.{part}_weight" for part in ("query", "key", "value")])
    assert set(weights) == {*qkv, "self_attention.proj.weight", "layernorm_mlp.fc1_weight", "layernorm_mlp.fc2_weight"}
    for p in weights.values():
        p.main_grad = torch.ones(p.shape, dtype=torch.float32, device=device)
    x = hidden((4, 2, HIDDEN), 14, device)
    layer(x).sum().backward()
    plain(x).sum().backward()
    plain_params = dict(plain.named_parameters())
    for name, p in weights.items():
        assert p.grad is None
        torch.testing.assert_close(p.main_grad, plain_params[name].grad + 1, **TOL)


# ---- KV-cache decoding ------------------------------------------------------------------------------------


def stack(device, seed, fmt="sbhd"):
    layers = [make_layer(device, seed=seed + i, num_gqa_groups=2, layer_number=i + 1, attn_input_format=fmt)
              for i in range(2)]
    return [layer.eval() for layer in layers]


def run_stack(layers, x, **kwargs):
    for layer in layers:
        x = layer(x, **kwargs)
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_kv_cache_decoding_equals_full(device, fmt):
    b, length, prefill = 2, 7, 3
    layers = stack(device, 15, fmt)
    seq_dim = 0 if fmt == "sbhd" else 1
    x = hidden((length, b, HIDDEN) if fmt == "sbhd" else (b, length, HIDDEN), 16, device)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(length).to(device)
    with torch.no_grad():
        full = run_stack(layers, x, rotary_pos_emb=freqs)
        cache = te.InferenceParams(b, length, qkv_format=fmt)
        cache.pre_step(OrderedDict((i, prefill) for i in range(b)))
        outs = [run_stack(layers, x.narrow(seq_dim, 0, prefill), inference_params=cache, rotary_pos_emb=freqs)]
        for t in range(prefill, length):
            cache.pre_step(OrderedDict((i, 1) for i in range(b)))
            outs.append(run_stack(layers, x.narrow(seq_dim, t, 1), inference_params=cache, rotary_pos_emb=freqs))
    torch.testing.assert_close(torch.cat(outs, dim=seq_dim), full, **TOL)
    assert set(cache.cache) == {1, 2}  # one cache per layer_number


@pytest.mark.parametrize("device", DEVICES)
def test_kv_cache_offsets_te1_style(device):
    b, length = 2, 6
    layers = stack(device, 17)
    x = hidden((length, b, HIDDEN), 18, device)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(length).to(device)
    with torch.no_grad():
        full = run_stack(layers, x, rotary_pos_emb=freqs)
        cache = te.InferenceParams(max_batch_size=b, max_sequence_length=length)
        outs = []
        for start, end in ((0, 2), (2, 3), (3, 6)):
            outs.append(run_stack(layers, x[start:end], inference_params=cache, rotary_pos_emb=freqs))
            cache.sequence_len_offset += end - start
    torch.testing.assert_close(torch.cat(outs), full, **TOL)


# ---- dropout, stochastic depth --------------------------------------------------------------------------


def tracker_with(seed):
    tracker = te.CudaRNGStatesTracker()
    tracker.add("model-parallel-rng", seed)
    return tracker


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("checkpoint_core_attention", [False, True])
def test_dropout_reproducible_under_tracker(device, checkpoint_core_attention):
    x = hidden((6, 2, HIDDEN), 19, device)

    def run(tracker_seed, default_seed=0, **kwargs):
        tracker = tracker_with(tracker_seed)
        layer = make_layer(device, seed=20, hidden_dropout=0.3, attention_dropout=0.5,
                           get_rng_state_tracker=lambda: tracker, **kwargs)
        torch.manual_seed(default_seed)
        x_in = x.clone().requires_grad_()
        out = layer(x_in, checkpoint_core_attention=checkpoint_core_attention)
        out.sum().backward()
        return [out.detach(), x_in.grad] + [p.grad for p in layer.parameters()]

    first, again = run(1234), run(1234)
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert not torch.equal(first[0], run(77)[0])  # the attention dropout follows the tracker's seed
    assert not torch.equal(first[0], run(1234, default_seed=1)[0])  # the hidden dropout the default stream's

    layer = make_layer(device, seed=20, hidden_dropout=0.3, attention_dropout=0.5).eval()
    no_dropout = make_layer(device, seed=20)
    torch.testing.assert_close(layer(x), no_dropout(x), atol=0, rtol=0)


def test_drop_path_per_sample():
    torch.manual_seed(0)
    x = torch.randn(5, 64, 3)  # sbhd-like: samples along dim 1
    out = DropPath(0.5, batch_dim=1).train()(x)
    for i in range(64):
        column = out[:, i]
        assert torch.equal(column, torch.zeros_like(column)) or torch.allclose(column, 2 * x[:, i])
    kept = sum(bool(out[:, i].abs().sum() > 0) for i in range(64))
    assert 16 < kept < 48  # about half (P(outside) < 1e-4)
    assert torch.equal(DropPath(0.5, batch_dim=1).eval()(x), x)


@pytest.mark.parametrize("device", DEVICES)
def test_drop_path_in_layer(device):
    layer = make_layer(device, seed=21, drop_path_rate=0.7)
    assert layer.drop_path.batch_dim == 1
    reference = make_layer(device, seed=21)
    x = hidden((4, 16, HIDDEN), 22, device)
    torch.testing.assert_close(layer.eval()(x), reference(x), atol=0, rtol=0)
    torch.manual_seed(3)
    trained = layer.train()(x)
    # Samples whose two branches were both dropped (p = 0.49 each) come out unchanged; none or
    # all of the 16 has probability < 1e-4.
    unchanged = [i for i in range(16) if torch.equal(trained[:, i], x[:, i])]
    assert 0 < len(unchanged) < 16
    assert not torch.allclose(trained, reference(x))


# ---- precision --------------------------------------------------------------------------------------------


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", [DelayedScaling(), Float8CurrentScaling()], ids=["delayed", "current"])
def test_fp8_close_to_bf16(device, recipe):
    # Four FP8 GEMM layers in a row (QKV, proj, fc1, fc2), E4M3 operands (2^-4 relative
    # rounding): a few percent of each branch, but the residual stream dominates the output
    # (measured 0.3%; bound 5%). Weight gradients go through the E5M2 (2^-3) casts of every
    # GEMM: measured up to 11%, bound 25%, where a wrong scale gives errors of order 100%.
    torch.manual_seed(4)
    layer = te.TransformerLayer(64, 128, 4, hidden_dropout=0.0, attention_dropout=0.0,
                                params_dtype=torch.bfloat16, device=device)
    for _ in range(2):  # the second step runs with the scales the first one recorded
        x = torch.randn(8, 2, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
        g = torch.randn(8, 2, 64, dtype=torch.bfloat16, device=device)
        # The key bias adds the same q.b_k to all of a query's scores, which the softmax
        # cancels: its exact gradient is 0, and both runs give rounding noise.
        params = [x] + [p for n, p in layer.named_parameters() if not n.endswith("key_bias")]
        with te.fp8_autocast(fp8_recipe=recipe):
            y = layer(x)
        got = torch.autograd.grad(y, params, g)
        y_ref = layer(x)
        want = torch.autograd.grad(y_ref, params, g)
        assert rel_err(y, y_ref) < 0.05
        for a, b in zip(got, want):
            assert rel_err(a, b) < 0.25


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_and_autocast(device):
    layer = make_layer(device, seed=23)
    x = hidden((6, 2, HIDDEN), 24, device)
    want = layer(x)
    with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
        got = layer(x)
    assert got.dtype == torch.bfloat16
    # bf16 activations (2^-8 relative) through ~6 roundings in a row: 5% of the norm is far
    # above that and far below a wrong result.
    assert rel_err(got, want) < 0.05
    bf16 = make_layer(device, seed=23, params_dtype=torch.bfloat16)
    out = bf16(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and rel_err(out, want) < 0.05


# ---- thd ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_thd_matches_per_sequence(device):
    lengths = [3, 5, 2]
    packed = make_layer(device, seed=25, num_gqa_groups=2, attn_input_format="thd",
                        self_attn_mask_type="padding_causal")
    single = make_layer(device, num_gqa_groups=2)
    single.load_state_dict(packed.state_dict())
    x = hidden((sum(lengths), HIDDEN), 26, device)
    cu = torch.tensor([0, 3, 8, 10], dtype=torch.int32, device=device)
    freqs = te.RotaryPositionEmbedding(HIDDEN // HEADS)(8).to(device)
    out = packed(x, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=5, max_seqlen_kv=5, rotary_pos_emb=freqs)
    for i in range(len(lengths)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        torch.testing.assert_close(out[rows], single(x[rows].unsqueeze(1), rotary_pos_emb=freqs)[:, 0], **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_padding_mask_matches_unpadded(device):
    layer = make_layer(device, seed=27, self_attn_mask_type="padding_causal")
    lengths, s = [4, 2], 5
    x = hidden((s, 2, HIDDEN), 28, device)
    mask = (torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]).view(2, 1, 1, s).to(device)
    out = layer(x, attention_mask=mask)
    for i, n in enumerate(lengths):
        alone = layer(x[:n, i:i + 1], self_attn_mask_type="causal")
        torch.testing.assert_close(out[:n, i:i + 1], alone, **TOL)


# ---- parameters -------------------------------------------------------------------------------------------


def test_state_dict_names_as_transformer_engine():
    def names(**kwargs):
        layer = te.TransformerLayer(HIDDEN, FFN, HEADS, device="cpu", **kwargs)
        return [k for k in layer.state_dict() if not k.endswith("_extra_state")]

    assert names(fuse_qkv_params=True) == [
        "self_attention.layernorm_qkv.layer_norm_weight", "self_attention.layernorm_qkv.layer_norm_bias",
        "self_attention.layernorm_qkv.weight", "self_attention.layernorm_qkv.bias", "self_attention.proj.weight",
        "self_attention.proj.bias", "layernorm_mlp.layer_norm_weight", "layernorm_mlp.layer_norm_bias",
        "layernorm_mlp.fc1_weight", "layernorm_mlp.fc1_bias", "layernorm_mlp.fc2_weight", "layernorm_mlp.fc2_bias"]
    assert names(bias=False)[:4] == ["self_attention.layernorm_qkv.layer_norm_weight",
                                     "self_attention.layernorm_qkv.layer_norm_bias",
                                     "self_attention.layernorm_qkv.query_weight",
                                     "self_attention.layernorm_qkv.key_weight"]
    post = names(output_layernorm=True, normalization="RMSNorm", bias=False)
    assert post[0] == "self_attention.qkv.query_weight" and post[-1] == "layernorm.weight"
    decoder = names(layer_type="decoder", fuse_qkv_params=True, bias=False)
    assert {"inter_attention.layernorm_query.layer_norm_weight", "inter_attention.layernorm_query.weight",
            "inter_attention.key_value.weight", "inter_attention.proj.weight"} <= set(decoder)
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, device="cpu", activation="swiglu")
    assert layer.layernorm_mlp.fc1_weight.shape == (2 * FFN, HIDDEN)
    assert "transformer_engine.pytorch" in type(layer).__module__


def test_init_methods():
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, device="cpu", init_method=torch.nn.init.zeros_,
                                output_layer_init_method=torch.nn.init.ones_)
    assert torch.all(layer.self_attention.layernorm_qkv.query_weight == 0)
    assert torch.all(layer.layernorm_mlp.fc1_weight == 0)
    assert torch.all(layer.self_attention.proj.weight == 1) and torch.all(layer.layernorm_mlp.fc2_weight == 1)


# ---- errors ---------------------------------------------------------------------------------------------


def test_constructor_errors():
    def build(**kwargs):
        return te.TransformerLayer(HIDDEN, FFN, HEADS, device="cpu", **kwargs)

    with pytest.raises(ValueError, match="layer_type"):
        build(layer_type="encoder-decoder")
    with pytest.raises(ValueError, match="parallel_attention_mlp"):
        build(parallel_attention_mlp=True, layer_type="decoder")
    with pytest.raises(ValueError, match="parallel_attention_mlp"):
        build(parallel_attention_mlp=True, output_layernorm=True)
    with pytest.raises(ValueError, match="parallel_attention_mlp"):
        build(parallel_attention_mlp=True, apply_residual_connection_post_layernorm=True)
    with pytest.raises(ValueError, match="hidden_dropout"):
        build(hidden_dropout=-0.1)
    with pytest.raises(ValueError, match="attn_input_format"):
        build(attn_input_format="bhsd")
    with pytest.raises(ValueError, match="activation"):
        build(activation="tanh")
    with pytest.raises(NotImplementedError, match="ub_tp_comm_overlap"):
        build(ub_tp_comm_overlap=True)
    with pytest.raises(NotImplementedError, match="activation_params"):
        build(activation_params={"alpha": 1.0})
    with pytest.raises(NotImplementedError, match="tensor parallel"):
        build(tp_size=2)
    build(ub_overlap_ag=True, ub_bulk_dgrad=True)  # ignored without ub_tp_comm_overlap, as in TE


def test_forward_errors():
    decoder = te.TransformerLayer(HIDDEN, FFN, HEADS, layer_type="decoder", device="cpu")
    with pytest.raises(ValueError, match="encoder_output"):
        decoder(torch.randn(4, 2, HIDDEN))
    layer = te.TransformerLayer(HIDDEN, FFN, HEADS, device="cpu")
    with pytest.raises(TypeError, match="hidden_states"):
        layer("x")
    with pytest.raises(ValueError, match="attn_mask_type"):
        layer(torch.randn(4, 2, HIDDEN), self_attn_mask_type="upper")
    with pytest.raises(ValueError, match="attention_mask"):
        layer(torch.randn(4, 2, HIDDEN), self_attn_mask_type="padding", attention_mask=torch.zeros(2, 1, 1, 3,
                                                                                                     dtype=torch.bool))
