"""A GPT-style decoder built from Transformer Engine modules: per block, LayerNormLinear
(the fused QKV projection), causal attention (PyTorch's scaled_dot_product_attention
until OpenTE's attention lands), Linear (the output projection), LayerNormMLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import transformer_engine.pytorch as te


@dataclass
class GPTConfig:
    vocab_size: int
    hidden: int
    heads: int
    layers: int
    ffn: int
    seq_len: int


class Block(torch.nn.Module):
    def __init__(self, cfg: GPTConfig, device, params_dtype):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = te.LayerNormLinear(cfg.hidden, 3 * cfg.hidden, device=device, params_dtype=params_dtype)
        self.proj = te.Linear(cfg.hidden, cfg.hidden, device=device, params_dtype=params_dtype)
        self.mlp = te.LayerNormMLP(cfg.hidden, cfg.ffn, activation="gelu", device=device, params_dtype=params_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(x)


class GPT(torch.nn.Module):
    def __init__(self, cfg: GPTConfig, device, params_dtype=torch.float32):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden, device=device, dtype=params_dtype)
        self.pos = torch.nn.Parameter(torch.randn(cfg.seq_len, cfg.hidden, device=device, dtype=params_dtype) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(cfg, device, params_dtype) for _ in range(cfg.layers))
        self.norm = te.LayerNorm(cfg.hidden, device=device, params_dtype=params_dtype)
        self.head = te.Linear(cfg.hidden, cfg.vocab_size, bias=False, device=device, params_dtype=params_dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
