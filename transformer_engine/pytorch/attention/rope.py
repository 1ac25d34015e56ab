"""Rotary position embedding (RoPE, https://arxiv.org/abs/2104.09864), as Transformer
Engine 2.x offers it: ``RotaryPositionEmbedding`` makes the angles, and
``apply_rotary_pos_emb`` rotates queries or keys by them, fused (the core's kernel, on
the CPU and GPUs) or unfused (plain PyTorch, Transformer Engine's reference path).
"""

from __future__ import annotations

import torch

from transformer_engine.pytorch.cpp_extensions.rope import fused_rope_backward, fused_rope_forward

__all__ = ["RotaryPositionEmbedding", "apply_rotary_pos_emb"]

_FORMATS = ("sbhd", "bshd", "thd")


def _default_device() -> torch.device:
    # Transformer Engine makes the buffer on the current GPU; without one, on the CPU.
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class RotaryPositionEmbedding(torch.nn.Module):
    """The angles of rotary position embedding: ``forward(max_seq_len, offset)`` returns
    float32 ``[max_seq_len, 1, 1, d2]`` with row p holding ``(p + offset) * inv_freq``,
    ``inv_freq[i] = rotary_base ** (-2i / dim)``, each angle twice: as two halves
    ``[f0 .. f(d2/2-1), f0 .. f(d2/2-1)]``, or with ``interleaved`` side by side
    ``[f0, f0, f1, f1, ..]``.

    Parameters
    ----------
    dim: int
        Rotary embedding dimension (the head dim, usually).
    rotary_percent: float, default = 1.0
        Fraction of ``dim`` that is rotated: ``int(dim * rotary_percent)`` features.
    seq_len_interpolation_factor: int, default = None
        Position interpolation (https://arxiv.org/abs/2306.15595): positions are divided
        by it, or, past ``pretrained_max_position_embeddings * factor`` positions,
        scaled by ``pretrained_max_position_embeddings / max_seq_len``. Used only with
        ``pretrained_max_position_embeddings``.
    pretrained_max_position_embeddings: int, default = None
        Positions the model was trained with.
    rotary_base: float, default = 10000.0
    interleaved: bool, default = False
        Lay the angles out for interleaved rotation (pairs of neighbouring features).
    """

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: int | None = None,
        pretrained_max_position_embeddings: int | None = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
    ):
        super().__init__()
        if rotary_percent < 1.0:
            dim = int(dim * rotary_percent)
        if dim < 1:
            raise ValueError(f"RotaryPositionEmbedding: the rotary dim must be >= 1, got {dim} "
                             f"(dim * rotary_percent)")
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.rotary_base = rotary_base
        self.interleaved = interleaved
        exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=_default_device()) / dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponents))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """float32 angles ``[max_seq_len, 1, 1, d2]`` for positions ``offset .. offset +
        max_seq_len - 1``, on ``inv_freq``'s device."""
        positions = torch.arange(max_seq_len, dtype=self.inv_freq.dtype, device=self.inv_freq.device) + offset
        pretrained = self.pretrained_max_position_embeddings
        factor = self.seq_len_interpolation_factor
        if pretrained is not None and factor is not None:
            if max_seq_len > pretrained * factor:
                positions *= 1 / (max_seq_len / pretrained)  # longer than learned: stretch to fit
            else:
                positions *= 1 / factor
        angles = torch.outer(positions, self.inv_freq)  # [s, d2 / 2]
        if self.interleaved:
            angles = angles.repeat_interleave(2, dim=-1)
        else:
            angles = torch.cat((angles, angles), dim=-1)
        return angles.reshape(angles.shape[0], 1, 1, angles.shape[1])


class FusedRoPEFunc(torch.autograd.Function):
    """The fused kernel with its transposed rotation as the backward. ``t`` may be any
    strided view; the output is contiguous."""

    @staticmethod
    def forward(ctx, t, freqs, start_positions=None, tensor_format="sbhd", interleaved=False, cu_seqlens=None,
                cp_size=1, cp_rank=0):
        out = fused_rope_forward(t, freqs, start_positions, tensor_format, interleaved, cu_seqlens, cp_size,
                                 cp_rank)
        ctx.save_for_backward(freqs, start_positions, cu_seqlens)
        ctx.args = (tensor_format, interleaved, cp_size, cp_rank)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        freqs, start_positions, cu_seqlens = ctx.saved_tensors
        tensor_format, interleaved, cp_size, cp_rank = ctx.args
        grad_input = fused_rope_backward(grad_output, freqs, start_positions, tensor_format, interleaved,
                                         cu_seqlens, cp_size, cp_rank)
        return grad_input, None, None, None, None, None, None, None


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The partner of every feature with the rotation's sign: halves ``[-x2, x1]``, or
    pairs ``(-x_odd, x_even)`` in place."""
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    pairs = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1)
    return pairs.flatten(-2)


def _cp_positions(n: int, cp_size: int, cp_rank: int, device) -> torch.Tensor:
    """Positions of the n local tokens of a sequence on context-parallel rank cp_rank:
    the rank holds chunks cp_rank and 2 cp_size - 1 - cp_rank of the full sequence."""
    j = torch.arange(n, device=device)
    half = n // 2
    if cp_size == 1:
        return j
    return torch.where(j < half, j + cp_rank * half, cp_size * n - (cp_rank + 1) * half + (j - half))


def _rotate(t: torch.Tensor, angles: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``t`` rotated by ``angles`` (broadcastable to ``t[..., :d2]``) in ``t``'s dtype, as
    Transformer Engine's unfused path: cos and sin in fp32, then cast to ``t.dtype``."""
    d2 = angles.shape[-1]
    rot, rest = t[..., :d2], t[..., d2:]
    cos = torch.cos(angles).to(t.dtype)
    sin = torch.sin(angles).to(t.dtype)
    return torch.cat((rot * cos + _rotate_half(rot, interleaved) * sin, rest), dim=-1)


def _check_positions(needed: int, s2: int, what: str) -> None:
    if needed > s2:
        raise ValueError(f"apply_rotary_pos_emb: freqs has {s2} positions, but {what} needs {needed}")


def _unfused_sbhd_bshd(t, freqs, tensor_format, start_positions, interleaved, cp_size, cp_rank):
    seq_dim = 0 if tensor_format == "sbhd" else 1
    s, s2 = t.shape[seq_dim], freqs.shape[0]
    if cp_size > 1 and s % 2:
        raise ValueError(f"apply_rotary_pos_emb: the sequence length must be even with context parallelism "
                         f"(cp_size {cp_size}), got {s}")
    positions = _cp_positions(s, cp_size, cp_rank, freqs.device)  # [s]
    if start_positions is not None:
        start = start_positions.to(device=freqs.device, dtype=torch.int64)
        if s > 0 and start.numel() > 0:
            if int(start.min()) < 0:
                raise ValueError(f"apply_rotary_pos_emb: start_positions must be >= 0, got {int(start.min())}")
            _check_positions(int(start.max()) + s, s2, f"start_positions + sequence length {s}")
        positions = positions.unsqueeze(0) + start.unsqueeze(1)  # [b, s]
        if tensor_format == "sbhd":
            positions = positions.transpose(0, 1)  # [s, b]
        angles = freqs[positions, 0]  # [s, b, 1, d2] or [b, s, 1, d2]
    else:
        if s > 0:
            _check_positions(int(positions.max()) + 1, s2, f"sequence length {s}")
        angles = freqs[positions]  # [s, 1, 1, d2]
        if tensor_format == "bshd":
            angles = angles.transpose(0, 1)  # [1, s, 1, d2]
    return _rotate(t, angles.to(t.device), interleaved)


def _unfused_thd(t, freqs, cu_seqlens, start_positions, interleaved, cp_size, cp_rank):
    """Every token of sequence i, [cu_seqlens[i], cu_seqlens[i + 1]) / cp_size, at its
    position in the sequence; tokens of no sequence are copied."""
    bounds = [int(v) // cp_size for v in cu_seqlens.tolist()]
    starts = start_positions.tolist() if start_positions is not None else [0] * (len(bounds) - 1)
    tokens = t.shape[0]
    positions = torch.full((tokens,), -1, dtype=torch.int64, device=freqs.device)
    for i, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end < begin or begin < 0 or end > tokens:
            raise ValueError(f"apply_rotary_pos_emb: cu_seqlens must be non-decreasing within the {tokens} "
                             f"tokens, got {cu_seqlens.tolist()}")
        n = end - begin
        if cp_size > 1 and n % 2:
            raise ValueError(f"apply_rotary_pos_emb: with cp_size {cp_size} every local sequence length must be "
                             f"even, sequence {i} has {n}")
        if n > 0:
            local = _cp_positions(n, cp_size, cp_rank, freqs.device) + int(starts[i])
            if int(local.min()) < 0:
                raise ValueError(f"apply_rotary_pos_emb: start_positions must be >= 0, got {int(starts[i])}")
            _check_positions(int(local.max()) + 1, freqs.shape[0], f"sequence {i}")
            positions[begin:end] = local
    inside = positions >= 0
    if freqs.shape[0] > 0:
        angles = freqs[positions.clamp(min=0)].reshape(tokens, 1, freqs.shape[-1])  # [t, 1, d2]
    else:  # no token is inside a sequence (checked above): nothing rotates
        angles = freqs.new_zeros(tokens, 1, freqs.shape[-1])
    rotated = _rotate(t, angles.to(t.device), interleaved)
    return torch.where(inside.to(t.device).view(tokens, 1, 1), rotated, t)


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: torch.Tensor | None = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """Rotate ``t`` by ``freqs``: ``t * cos(freqs) + rotate_half(t) * sin(freqs)`` on the
    first d2 features of every head, the other ``d - d2`` features unchanged.

    Parameters
    ----------
    t: torch.Tensor
        ``[s, b, h, d]`` (``"sbhd"``), ``[b, s, h, d]`` (``"bshd"``) or ``[t, h, d]`` (``"thd"``).
    freqs: torch.Tensor
        ``[s2, 1, 1, d2]`` angles, float32, as ``RotaryPositionEmbedding`` returns; d2 <= d
        and s2 covers every position used.
    tensor_format: {'sbhd', 'bshd', 'thd'}, default = 'sbhd'
    start_positions: torch.Tensor, default = None
        int ``[b]``: sequence i starts at position ``start_positions[i]`` (KV-cache
        decoding). Not with context parallelism.
    interleaved: bool, default = False
        Rotate pairs of neighbouring features ``(2i, 2i + 1)`` instead of ``(i, i + d2/2)``.
    fused: bool, default = False
        Use the fused kernel (fp32 math, one pass; CPU and GPU). The unfused path is plain
        PyTorch in ``t``'s dtype, as Transformer Engine's.
    cu_seqlens: torch.Tensor, default = None
        ``"thd"`` only: int ``[b + 1]`` sequence bounds (``cu_seqlens_padded`` with context
        parallelism, counting the tokens of all ranks).
    cp_size, cp_rank: int, default = 1, 0
        Context parallelism: this rank holds chunks ``cp_rank`` and ``2 cp_size - 1 - cp_rank``
        of every sequence cut into ``2 cp_size`` chunks.
    """
    if tensor_format not in _FORMATS:
        raise ValueError(f"apply_rotary_pos_emb: tensor_format must be 'sbhd', 'bshd' or 'thd', got "
                         f"{tensor_format!r}")
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"apply_rotary_pos_emb: need cp_size >= 1 and 0 <= cp_rank < cp_size, got cp_size "
                         f"{cp_size}, cp_rank {cp_rank}")
    if cp_size > 1 and start_positions is not None:
        raise ValueError("apply_rotary_pos_emb: start_positions is not supported with context parallelism "
                         f"(cp_size {cp_size})")
    if tensor_format == "thd" and cu_seqlens is None:
        raise ValueError("apply_rotary_pos_emb: cu_seqlens must be given for tensor_format 'thd'")
    if fused:
        return FusedRoPEFunc.apply(t, freqs, start_positions, tensor_format, interleaved,
                                   cu_seqlens if tensor_format == "thd" else None, cp_size, cp_rank)

    want_dims = 3 if tensor_format == "thd" else 4
    if t.dim() != want_dims:
        raise ValueError(f"apply_rotary_pos_emb: t must be {want_dims}D for tensor_format {tensor_format!r}, got "
                         f"shape {tuple(t.shape)}")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"apply_rotary_pos_emb: freqs must be 4D [s2, 1, 1, d2], got shape {tuple(freqs.shape)}")
    if freqs.shape[-1] > t.shape[-1] or freqs.shape[-1] % 2:
        raise ValueError(f"apply_rotary_pos_emb: freqs last dim d2 = {freqs.shape[-1]} must be even and at most "
                         f"t's head dim {t.shape[-1]}")
    if tensor_format == "thd":
        return _unfused_thd(t, freqs, cu_seqlens, start_positions, interleaved, cp_size, cp_rank)
    return _unfused_sbhd_bshd(t, freqs, tensor_format, start_positions, interleaved, cp_size, cp_rank)
