"""A GPT-style decoder built from Transformer Engine modules: a token and a learned
position embedding, one te.TransformerLayer per block (pre-norm causal self attention
with a fused QKV projection, and a LayerNorm + GELU MLP), a final te.LayerNorm and a
te.Linear head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import transformer_engine.pytorch as te


@dataclass
class GPTConfig:
    vocab_size: int
    hidden: int
    heads: int
    layers: int
    ffn: int
    seq_len: int


def transformer_block(cfg: GPTConfig, layer_number: int, device, params_dtype) -> te.TransformerLayer:
    """One decoder block. layer_type "encoder" is TE's name for a block without cross
    attention; the causal mask makes it a decoder block. The inputs are [batch, seq,
    hidden] (bshd), as the embedding produces them."""
    return te.TransformerLayer(
        cfg.hidden, cfg.ffn, cfg.heads, layer_number=layer_number, layer_type="encoder",
        self_attn_mask_type="causal", hidden_dropout=0.0, attention_dropout=0.0, fuse_qkv_params=True,
        attn_input_format="bshd", activation="gelu", params_dtype=params_dtype, device=device)


class GPT(torch.nn.Module):
    def __init__(self, cfg: GPTConfig, device, params_dtype=torch.float32):
        super().__init__()
        self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden, device=device, dtype=params_dtype)
        self.pos = torch.nn.Parameter(torch.randn(cfg.seq_len, cfg.hidden, device=device, dtype=params_dtype) * 0.02)
        self.blocks = torch.nn.ModuleList(transformer_block(cfg, i + 1, device, params_dtype)
                                          for i in range(cfg.layers))
        self.norm = te.LayerNorm(cfg.hidden, device=device, params_dtype=params_dtype)
        self.head = te.Linear(cfg.hidden, cfg.vocab_size, bias=False, device=device, params_dtype=params_dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
