"""Query / key normalization of MultiheadAttention (``qk_norm_type``): each head's query and
key vectors normalized over the head dim before the scores are taken, as in OLMo-2,
Qwen-3 and Llama-4. "RMSNorm" and "LayerNorm" have a learnable weight per head channel
(one module for queries, one for keys); "L2Normalization" has none, so one module serves
both."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from transformer_engine.pytorch.module.layernorm import LayerNorm, RMSNorm

__all__ = ["L2Normalization", "QK_NORM_TYPES", "make_qk_norms"]

QK_NORM_TYPES = ("L2Normalization", "RMSNorm", "LayerNorm")


class L2Normalization(torch.nn.Module):
    """``y = x / sqrt(sum(x^2) + eps)`` over the last dim; parameter-free. The sum is taken
    in fp32 whatever the input dtype (low-precision sums of squares lose the small
    entries), the result is in the input's dtype."""

    def __init__(self, eps: float = 1e-6, seq_length: Optional[int] = None, micro_batch_size: Optional[int] = None):
        super().__init__()
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or eps < 0:
            raise ValueError(f"L2Normalization: eps must be a number >= 0, got {eps!r}")
        self.eps = float(eps)
        # Transformer Engine warms its JIT kernels up with these; nothing to warm up here.
        self.seq_length, self.micro_batch_size = seq_length, micro_batch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"L2Normalization: input must be a float tensor, got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.square().sum(dim=-1, keepdim=True) + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


def make_qk_norms(qk_norm_type: Optional[str], head_dim: int, eps: float, params_dtype: torch.dtype,
                  device: Union[torch.device, str, None], seq_length: Optional[int] = None,
                  micro_batch_size: Optional[int] = None) -> Tuple[Optional[torch.nn.Module],
                                                                   Optional[torch.nn.Module]]:
    """(q_norm, k_norm) for ``qk_norm_type`` over heads of ``head_dim`` channels, or
    (None, None) when it is None."""
    if qk_norm_type is None:
        return None, None
    if qk_norm_type == "L2Normalization":
        shared = L2Normalization(eps=eps, seq_length=seq_length, micro_batch_size=micro_batch_size)
        return shared, shared
    if qk_norm_type in ("RMSNorm", "LayerNorm"):
        cls = RMSNorm if qk_norm_type == "RMSNorm" else LayerNorm
        return tuple(cls(head_dim, eps=eps, params_dtype=params_dtype, device=device) for _ in range(2))
    raise ValueError(f"MultiheadAttention: qk_norm_type must be None or one of {', '.join(QK_NORM_TYPES)}, got "
                     f"{qk_norm_type!r}")
