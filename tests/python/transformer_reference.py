"""Float64 references of MultiheadAttention and TransformerLayer, written from the
definitions in plain PyTorch and reading the weights by Transformer Engine's parameter
names (the unfused-QKV ones: ``query_weight``, ``key_weight``, ``value_weight``).

Everything is computed on [b, s, hidden] internally; ``fmt`` says whether the tensors
given and returned are sbhd ([s, b, ..]) or bshd. GQA: query head g * r + j uses key /
value head g (r = heads / groups). ``gelu`` is the tanh approximation, as Transformer
Engine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Optional

import torch
import torch.nn.functional as F

GATED = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu"}
ACT = {"gelu": lambda h: F.gelu(h, approximate="tanh"), "silu": F.silu, "relu": F.relu}


@dataclass(frozen=True)
class AttnConfig:
    heads: int
    groups: int
    head_dim: int
    fmt: str = "sbhd"
    attention_type: str = "self"
    input_layernorm: bool = True
    normalization: str = "LayerNorm"
    eps: float = 1e-5
    mask: str = "causal"  # "causal" (top left) or "no_mask"
    qk_norm_type: Optional[str] = None
    qk_norm_eps: float = 1e-6
    qk_norm_before_rope: bool = False
    rotary_interleaved: bool = False


@dataclass(frozen=True)
class LayerConfig:
    attn: AttnConfig
    activation: str = "gelu"
    layer_type: str = "encoder"
    cross_mask: str = "no_mask"
    output_layernorm: bool = False
    post_ln_residual: bool = False  # apply_residual_connection_post_layernorm
    parallel_attention_mlp: bool = False


def params64(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The module's parameters by name, as float64 leaves that record their gradients."""
    return {name: p.detach().double().cpu().requires_grad_() for name, p in module.named_parameters()}


def sub(params: Dict[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def norm(x, weight, bias, kind: str, eps: float):
    if kind == "LayerNorm":
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * weight + bias
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(t, freqs, positions, interleaved: bool):
    """t [b, s, h, d] rotated by the angles of ``positions`` [b, s] (freqs [S, 1, 1, d2])."""
    angles = freqs.double()[positions.long(), 0]  # [b, s, 1, d2]
    d2 = angles.shape[-1]
    x, rest = t[..., :d2], t[..., d2:]
    if interleaved:
        partner = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        x1, x2 = x.chunk(2, dim=-1)
        partner = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x * torch.cos(angles) + partner * torch.sin(angles), rest), dim=-1)


def qk_norm(t, params, which: str, cfg: AttnConfig):
    if cfg.qk_norm_type == "L2Normalization":
        return t / torch.sqrt(t.pow(2).sum(-1, keepdim=True) + cfg.qk_norm_eps)
    return norm(t, params[f"{which}_norm.weight"], params.get(f"{which}_norm.bias"), cfg.qk_norm_type,
                cfg.qk_norm_eps)


def attend(q, k, v, mask: str, cfg: AttnConfig):
    """q [b, sq, h, d], k / v [b, skv, hg, d] -> [b, sq, h * d]."""
    r = cfg.heads // cfg.groups
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d]
    k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim)
    if mask == "causal":
        sq, skv = scores.shape[-2:]
        future = torch.ones(sq, skv, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v  # [b, h, sq, d]
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def mha(params, x, cfg: AttnConfig, encoder_output=None, freqs=None, start_positions=None):
    """MultiheadAttention: (output without the projection's bias, that bias, the input
    norm's output or None), in ``cfg.fmt``. ``freqs``: one angle tensor or a (q, k) pair;
    ``start_positions`` [b]: the cache position of each row's first token."""
    to_bs = (lambda t: t.transpose(0, 1)) if cfg.fmt == "sbhd" else (lambda t: t)
    x = to_bs(x)
    hn = cfg.head_dim
    ln_out = None
    if cfg.attention_type == "self":
        lin = "layernorm_qkv." if cfg.input_layernorm else "qkv."
        src = x
        if cfg.input_layernorm:
            ln_out = src = norm(x, params[lin + "layer_norm_weight"], params.get(lin + "layer_norm_bias"),
                                cfg.normalization, cfg.eps)
        kv_src = src
    else:
        lin = "layernorm_query." if cfg.input_layernorm else "query_layer."
        src = x
        if cfg.input_layernorm:
            ln_out = src = norm(x, params[lin + "layer_norm_weight"], params.get(lin + "layer_norm_bias"),
                                cfg.normalization, cfg.eps)
        kv_src = to_bs(encoder_output)
    q_name = lin + ("query_weight" if lin + "query_weight" in params else "weight")
    q_bias = q_name.replace("weight", "bias")
    kv = lin if cfg.attention_type == "self" else "key_value."
    q = F.linear(src, params[q_name], params.get(q_bias))
    k = F.linear(kv_src, params[kv + "key_weight"], params.get(kv + "key_bias"))
    v = F.linear(kv_src, params[kv + "value_weight"], params.get(kv + "value_bias"))
    b, sq, skv = x.shape[0], x.shape[1], kv_src.shape[1]
    q = q.view(b, sq, cfg.heads, hn)
    k, v = k.view(b, skv, cfg.groups, hn), v.view(b, skv, cfg.groups, hn)
    if cfg.qk_norm_type is not None and cfg.qk_norm_before_rope:
        q, k = qk_norm(q, params, "q", cfg), qk_norm(k, params, "k", cfg)
    if freqs is not None:
        q_freqs, k_freqs = freqs if isinstance(freqs, tuple) else (freqs, freqs)
        start = torch.zeros(b, dtype=torch.long) if start_positions is None else start_positions.long().cpu()
        q = rotate(q, q_freqs, start[:, None] + torch.arange(sq)[None, :], cfg.rotary_interleaved)
        k = rotate(k, k_freqs, start[:, None] + torch.arange(skv)[None, :], cfg.rotary_interleaved)
    if cfg.qk_norm_type is not None and not cfg.qk_norm_before_rope:
        q, k = qk_norm(q, params, "q", cfg), qk_norm(k, params, "k", cfg)
    context = attend(q, k, v, cfg.mask, cfg)
    out = F.linear(context, params["proj.weight"])
    return to_bs(out), params.get("proj.bias"), None if ln_out is None else to_bs(ln_out)


def mlp(params, x, cfg: AttnConfig, activation: str):
    """LayerNormMLP: (output without fc2's bias, that bias, the norm's output)."""
    ln = norm(x, params["layer_norm_weight"], params.get("layer_norm_bias"), cfg.normalization, cfg.eps)
    h = F.linear(ln, params["fc1_weight"], params.get("fc1_bias"))
    if activation in GATED:
        a, g = h.chunk(2, dim=-1)
        h = ACT[GATED[activation]](a) * g
    else:
        h = ACT[activation](h)
    return F.linear(h, params["fc2_weight"]), params.get("fc2_bias"), ln


def _plus(t, bias):
    return t if bias is None else t + bias


def transformer_layer(params, x, cfg: LayerConfig, encoder_output=None, freqs=None):
    """TransformerLayer without dropout (eval, or rates 0), in ``cfg.attn.fmt``."""
    self_cfg = replace(cfg.attn, attention_type="self", input_layernorm=not cfg.output_layernorm)
    attn_out, attn_bias, ln = mha(sub(params, "self_attention."), x, self_cfg, freqs=freqs)
    if cfg.parallel_attention_mlp:
        mlp_out, mlp_bias, _ = mlp(sub(params, "layernorm_mlp."), x, cfg.attn, cfg.activation)
        return x + _plus(attn_out, attn_bias) + _plus(mlp_out, mlp_bias)
    residual = ln if (cfg.post_ln_residual and not cfg.output_layernorm) else x
    h = residual + _plus(attn_out, attn_bias)
    if cfg.layer_type == "decoder":
        cross_cfg = replace(cfg.attn, attention_type="cross", input_layernorm=True, mask=cfg.cross_mask)
        out, bias, ln = mha(sub(params, "inter_attention."), h, cross_cfg, encoder_output=encoder_output)
        h = (ln if cfg.post_ln_residual else h) + _plus(out, bias)
    mlp_out, mlp_bias, ln = mlp(sub(params, "layernorm_mlp."), h, cfg.attn, cfg.activation)
    out = (ln if cfg.post_ln_residual else h) + _plus(mlp_out, mlp_bias)
    if cfg.output_layernorm:
        out = norm(out, params["layernorm.weight"], params.get("layernorm.bias"), cfg.attn.normalization,
                   cfg.attn.eps)
    return out
