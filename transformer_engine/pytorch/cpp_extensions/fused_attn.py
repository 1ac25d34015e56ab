"""Fused attention on cuDNN over the core's ``fused_attn_*`` ops (opente/fused_attn.h):
``sdpa_fwd`` / ``sdpa_bwd`` (what DotProductAttention's fused backend calls) and
Transformer Engine's ``fused_attn_fwd`` / ``fused_attn_bwd`` (``tex``-style) on top.

Tensors are 4-D in the "sbhd" ([s, b, h, d]) or "bshd" ([b, s, h, d]) format, float16 or
bfloat16, on a GPU. Any strides with a contiguous head dim are read in place (Q, K, V
sliced out of one fused projection); anything cuDNN cannot address (a broadcast stride,
a misaligned view) is copied first. Outputs are new tensors, contiguous in the format of
the input they belong to. ``seqlens_q`` / ``seqlens_kv`` (int32 [b], on the device) are the
true lengths of right-padded sequences for the padding mask types; rows past them come
out 0 in the output and the gradients. Dropout needs ``rng_state``: int64 [2] (seed,
offset) on the device, the same for the forward and the backward (``philox_rng_state``).

What cuDNN cannot run raises NotImplementedError with cuDNN's reason, from the workspace
queries, before anything runs; ``check_sdpa_support`` asks without running, for the
forward and the backward, so that a training step does not fail half way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from transformer_engine import _core
from transformer_engine.pytorch.cpp_extensions.tensor_desc import describe, describe_view, stream_of, te_dtype

__all__ = [
    "FusedAttnConfig",
    "check_sdpa_support",
    "cudnn_unavailable_reason",
    "philox_rng_state",
    "sdpa_fwd",
    "sdpa_bwd",
    "fused_attn_fwd",
    "fused_attn_bwd",
]

_MASK_TYPES = {"no_mask": 0, "padding": 1, "causal": 2, "padding_causal": 3, "causal_bottom_right": 4,
               "padding_causal_bottom_right": 5}
_BIAS_TYPES = {"no_bias": 0, "pre_scale_bias": 1, "post_scale_bias": 2, "alibi": 3}
_FORMATS = ("sbhd", "bshd")
_VECTOR_ELEMENTS = 8  # cuDNN reads 16 bytes (8 fp16 / bf16 elements) at a time


@functools.lru_cache(maxsize=None)
def cudnn_unavailable_reason() -> Optional[str]:
    """None when cuDNN fused attention can run in this process; else why not (this build
    has no CUDA or no cuDNN support, or libcudnn cannot be loaded). Checked once."""
    if not _core.built_with_cuda():
        return "OpenTE was built without CUDA"
    if _core.cudnn_frontend_version() == 0:
        return ("OpenTE was built without cuDNN fused attention (no cudnn-frontend headers at build time; "
                "see tools/fetch_cudnn_frontend.sh)")
    try:
        _core.cudnn_version()
    except (RuntimeError, NotImplementedError) as error:
        return f"cuDNN not found ({error})"
    return None


@dataclass(frozen=True)
class FusedAttnConfig:
    """What the cuDNN graph of a call depends on besides the tensors: ``mask_type`` (a
    DotProductAttention mask type but "arbitrary"), ``window`` (left, right; -1
    unlimited), ``bias_type`` ("no_bias" or "post_scale_bias"), ``softmax_scale``,
    ``dropout`` (probability; 0 when not training) and ``deterministic`` (backward)."""

    mask_type: str = "no_mask"
    window: Tuple[int, int] = (-1, -1)
    bias_type: str = "no_bias"
    softmax_scale: float = 1.0
    dropout: float = 0.0
    deterministic: bool = False

    def core_args(self) -> tuple:
        try:
            mask, bias = _MASK_TYPES[self.mask_type], _BIAS_TYPES[self.bias_type]
        except KeyError as error:
            raise ValueError(f"fused attention: unknown mask or bias type {error}") from None
        left, right = self.window
        return (mask, bias, int(left), int(right), float(self.softmax_scale), float(self.dropout),
                bool(self.deterministic))

    @property
    def padding(self) -> bool:
        return "padding" in self.mask_type


def philox_rng_state(device: torch.device, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """int64 [2] (seed, offset) for cuDNN's dropout, drawn on the device from ``generator``
    (default: the device's default CUDA generator), so torch.manual_seed, RNG state
    trackers and activation checkpointing reproduce it like any torch dropout."""
    return torch.randint(0, 2**62, (2,), dtype=torch.int64, device=device, generator=generator)


def _bhsd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """The [b, h, s, d] view of a 4-D tensor in ``fmt``."""
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)


def _addressable(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when cuDNN can read it in place, else a contiguous copy."""
    element = x.element_size()
    strides_ok = x.stride(-1) == 1 and all(st > 0 and st % _VECTOR_ELEMENTS == 0
                                           for st, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)
    if strides_ok and x.data_ptr() % (_VECTOR_ELEMENTS * element) == 0:
        return x
    return x.contiguous()


def packed_qkv_offsets(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[Tuple[int, int, int, int]]:
    """(span, and the offsets of q, k and v in it, in elements) where q, k and v are
    disjoint, equally strided views of one buffer: a fused QKV projection's output split
    three ways, as MultiheadAttention splits it (Transformer Engine's packed layouts, such
    as bsh3d and bs3hd); else None. The backward then writes dq, dk and dv into one buffer
    laid out the same way, which the split's backward takes whole (attention/_qkv_split.py)
    instead of concatenating three gradients: a copy of them all (at the main job's shape,
    4% of a layer's step on an H100).

    Sufficient conditions, on strides alone: the same shape, strides and dtype, the head
    dim innermost (stride 1), no dim of q overlapping the ones inside it; and some level
    at which the dims inside it span a block that each of q, k, v fills at its own offset,
    the three blocks apart and inside the step of the dims outside it, whose strides are
    multiples of that step (bsh3d: the head dim, in steps of 3 heads' worth; bs3hd: heads
    and head dim, in steps of 3 times all heads); the offsets 16-byte aligned (cuDNN)."""
    if not (q.shape == k.shape == v.shape and q.stride() == k.stride() == v.stride() and q.dtype == k.dtype == v.dtype):
        return None
    storage = q.untyped_storage().data_ptr()
    if k.untyped_storage().data_ptr() != storage or v.untyped_storage().data_ptr() != storage or q.stride(-1) != 1:
        return None
    outer = sorted((st, n) for st, n in zip(q.stride()[:-1], q.shape[:-1]) if n > 1)
    extent, levels = q.shape[-1], []
    for stride, n in outer:
        if stride < extent:  # q overlaps itself
            return None
        levels.append((extent, stride))  # the dims inside this one span `extent`; it steps by `stride`
        extent += stride * (n - 1)
    offsets = [t.storage_offset() for t in (q, k, v)]
    rel = [o - min(offsets) for o in offsets]
    if any(r * q.element_size() % 16 for r in rel):
        return None
    a, b, c = sorted(rel)
    for i, (block, step) in enumerate(levels):
        if b - a >= block and c - b >= block and c + block <= step and all(st % step == 0 for st, _ in outer[i:]):
            return (c + extent, *rel)
    return None


def _gradient_buffers(q, k, v, shapes) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv for sdpa_bwd: views of one buffer laid out as q, k, v are where those are
    packed (packed_qkv_offsets), else contiguous tensors of ``shapes`` (the formats')."""
    packed = packed_qkv_offsets(q, k, v)
    if packed is None:
        return tuple(torch.empty(shape, dtype=q.dtype, device=q.device) for shape in shapes[:3])
    span, *rel = packed
    flat = torch.empty(span, dtype=q.dtype, device=q.device)
    return tuple(flat.as_strided(t.shape, t.stride(), offset) for t, offset in zip((q, k, v), rel))


def _operand(x: torch.Tensor, fmt: str, name: str) -> Tuple[_core.Tensor, List[int]]:
    desc, strides = describe_view(_bhsd(x, fmt), name)
    return desc, strides


def _placeholder(shape, dtype: torch.dtype, device: torch.device, name: str) -> _core.Tensor:
    """A descriptor without data, for the workspace queries of buffers not allocated yet."""
    if device.type == "cuda":
        device_type, index = _core.DeviceType.CUDA, device.index
    else:
        device_type, index = _core.DeviceType.CPU, 0
    return _core.Tensor(int(device_type), index, int(te_dtype(dtype, name)), list(shape), 0)


def _format_shape(fmt: str, b: int, s: int, h: int, d: int) -> Tuple[int, int, int, int]:
    return (s, b, h, d) if fmt == "sbhd" else (b, s, h, d)


def _contiguous_bhsd_strides(fmt: str, b: int, s: int, h: int, d: int) -> List[int]:
    """[b, h, s, d] strides of a contiguous tensor in ``fmt``."""
    if fmt == "sbhd":
        return [h * d, d, b * h * d, 1]
    return [s * h * d, d, h * d, 1]


def _check_inputs(q, k, v, q_format: str, kv_format: str) -> None:
    for fmt, what in ((q_format, "q_format"), (kv_format, "kv_format")):
        if fmt not in _FORMATS:
            raise ValueError(f"fused attention: {what} must be 'sbhd' or 'bshd', got {fmt!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fused attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"fused attention: {name} must be 4-D ({q_format if name == 'q' else kv_format}), got "
                             f"shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"fused attention: {name} must be float16 or bfloat16, got {t.dtype}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"fused attention: {name} must be a CUDA tensor (cuDNN), got device {t.device}; the "
                             "unfused attention runs on the CPU")


def _optional(t: Optional[torch.Tensor], name: str) -> Optional[_core.Tensor]:
    return None if t is None else describe(t, name)


def _workspace(size: int, device: torch.device) -> Tuple[int, torch.Tensor]:
    buffer = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
    return buffer.data_ptr(), buffer


def _zero_padded_rows(x: torch.Tensor, fmt: str, lengths: torch.Tensor) -> None:
    """Zeroes the rows of ``x`` (4-D in ``fmt``) past each sequence's length, in place."""
    b, s = (x.shape[1], x.shape[0]) if fmt == "sbhd" else (x.shape[0], x.shape[1])
    padded = torch.arange(s, device=x.device)[None, :] >= lengths.to(torch.int64)[:, None]  # [b, s]
    if fmt == "sbhd":
        padded = padded.t()
    x.masked_fill_(padded[:, :, None, None], 0)


def _check_seqlens(config: FusedAttnConfig, seqlens_q, seqlens_kv, b: int, device) -> None:
    if not config.padding:
        if seqlens_q is not None or seqlens_kv is not None:
            raise ValueError(f"fused attention: seqlens_q / seqlens_kv are for padding mask types, got "
                             f"{config.mask_type!r}")
        return
    for name, t in (("seqlens_q", seqlens_q), ("seqlens_kv", seqlens_kv)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != (b,):
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"fused attention: {name} must be an int32 tensor [{b}] for mask type "
                             f"{config.mask_type!r}, got {got}")
        if t.device != device or not t.is_contiguous():
            raise ValueError(f"fused attention: {name} must be contiguous on {device}, got {t.device}")


def _prepare(q, k, v, config: FusedAttnConfig, q_format: str, kv_format: str, seqlens_q, seqlens_kv, rng_state):
    """Checked and cuDNN-addressable q, k, v (copies only where needed)."""
    _check_inputs(q, k, v, q_format, kv_format)
    q, k, v = _addressable(q), _addressable(k), _addressable(v)
    _check_seqlens(config, seqlens_q, seqlens_kv, _bhsd(q, q_format).shape[0], q.device)
    if config.dropout > 0.0 and rng_state is None:
        raise ValueError("fused attention: dropout > 0 needs rng_state (philox_rng_state)")
    return q, k, v


def _fwd_args(config: FusedAttnConfig, q, k, v, q_format: str, kv_format: str, bias, seqlens_q, seqlens_kv,
              rng_state, o_desc, o_strides: List[int], stats_desc) -> Tuple[tuple, tuple, List[int]]:
    """The arguments of the core's forward (and its workspace query), the descriptors of
    q, k, v, o and the 16 strides."""
    (q_desc, q_st), (k_desc, k_st), (v_desc, v_st) = (_operand(q, q_format, "q"), _operand(k, kv_format, "k"),
                                                      _operand(v, kv_format, "v"))
    strides = q_st + k_st + v_st + list(o_strides)
    args = (*config.core_args(), q_desc, k_desc, v_desc, _optional(bias, "bias"), _optional(seqlens_q, "seqlens_q"),
            _optional(seqlens_kv, "seqlens_kv"), _optional(rng_state, "rng_state"), o_desc, stats_desc, strides)
    return args, (q_desc, k_desc, v_desc, o_desc), strides


def check_sdpa_support(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FusedAttnConfig, *,
                       q_format: str = "bshd", kv_format: str = "bshd", bias: Optional[torch.Tensor] = None,
                       seqlens_q: Optional[torch.Tensor] = None, seqlens_kv: Optional[torch.Tensor] = None,
                       rng_state: Optional[torch.Tensor] = None, backward: bool = False,
                       bias_grad: bool = False) -> None:
    """Raises NotImplementedError (cuDNN's reason) when cuDNN cannot run ``sdpa_fwd`` with
    these arguments or, with ``backward``, its ``sdpa_bwd`` (``bias_grad``: whether the bias
    gets a gradient). Runs and allocates nothing on the GPU; builds and caches the graphs,
    so the calls that follow find them."""
    q, k, v = _prepare(q, k, v, config, q_format, kv_format, seqlens_q, seqlens_kv, rng_state)
    b, h, sq, _ = _bhsd(q, q_format).shape
    dv = v.shape[-1]
    o_desc = _placeholder((b, h, sq, dv), q.dtype, q.device, "o")
    stats_desc = _placeholder((b, h, sq, 1), torch.float32, q.device, "stats") if backward else None
    args, descs, strides = _fwd_args(config, q, k, v, q_format, kv_format, bias, seqlens_q, seqlens_kv, rng_state,
                                     o_desc, _contiguous_bhsd_strides(q_format, b, sq, h, dv), stats_desc)
    _core.fused_attn_fwd_workspace_size(*args)
    if backward:
        _check_backward(config, q, k, v, q_format, kv_format, descs, strides, bias, bias_grad, seqlens_q, seqlens_kv,
                        rng_state)


def sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FusedAttnConfig, *, q_format: str = "bshd",
             kv_format: str = "bshd", bias: Optional[torch.Tensor] = None,
             seqlens_q: Optional[torch.Tensor] = None, seqlens_kv: Optional[torch.Tensor] = None,
             rng_state: Optional[torch.Tensor] = None,
             with_stats: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """softmax(scale * Q K^T + bias, masked) (dropout) V on cuDNN.

    q [.., h, dqk] in ``q_format``, k / v [.., hg, dqk / dv] in ``kv_format``; ``bias``
    [1|b, 1|h, sq, skv] of q's dtype (contiguous) for "post_scale_bias". Returns the output
    (q_format, [.., h, dv], contiguous) and, with ``with_stats``, the softmax statistics
    (float32 [b, h, sq, 1], logsumexp of each row) the backward needs."""
    q, k, v = _prepare(q, k, v, config, q_format, kv_format, seqlens_q, seqlens_kv, rng_state)
    b, h, sq = _bhsd(q, q_format).shape[:3]
    dv = v.shape[-1]
    device = q.device
    o = torch.empty(_format_shape(q_format, b, sq, h, dv), dtype=q.dtype, device=device)
    stats = torch.empty((b, h, sq, 1), dtype=torch.float32, device=device) if with_stats else None
    o_desc, o_strides = _operand(o, q_format, "o")
    args, _, _ = _fwd_args(config, q, k, v, q_format, kv_format, bias, seqlens_q, seqlens_kv, rng_state, o_desc,
                           o_strides, _optional(stats, "stats"))
    size = _core.fused_attn_fwd_workspace_size(*args)
    workspace, _keep = _workspace(size, device)
    _core.fused_attn_fwd(*args, workspace, size, stream_of(q))
    if config.padding:
        _zero_padded_rows(o, q_format, seqlens_q)
    return o, stats


def _grad_layouts(q, k, v, q_format: str, kv_format: str) -> Tuple[list, list, List[int]]:
    """dq, dk, dv, d_o as sdpa_bwd allocates them (contiguous in the formats of q, k, v, o):
    their shapes in format, their [b, h, s, d] shapes, and their 16 [b, h, s, d] strides."""
    b, h, sq, dqk = _bhsd(q, q_format).shape
    _, hg, skv, _ = _bhsd(k, kv_format).shape
    dv = v.shape[-1]
    specs = [(q_format, b, sq, h, dqk), (kv_format, b, skv, hg, dqk), (kv_format, b, skv, hg, dv),
             (q_format, b, sq, h, dv)]
    shapes = [_format_shape(*spec) for spec in specs]
    bhsd_shapes = [(bb, hh, ss, dd) for (_, bb, ss, hh, dd) in specs]
    strides = [st for spec in specs for st in _contiguous_bhsd_strides(*spec)]
    return shapes, bhsd_shapes, strides


def _check_backward(config: FusedAttnConfig, q, k, v, q_format: str, kv_format: str, descs: tuple, strides: List[int],
                    bias, bias_grad: bool, seqlens_q, seqlens_kv, rng_state) -> None:
    """The backward's workspace query with descriptors of the gradients it will allocate:
    raises NotImplementedError now if cuDNN cannot run that backward."""
    _, bhsd_shapes, grad_strides = _grad_layouts(q, k, v, q_format, kv_format)
    if packed_qkv_offsets(q, k, v) is not None:  # dq, dk, dv strided as q, k, v (_gradient_buffers)
        grad_strides = strides[:12] + grad_strides[12:]
    device = q.device
    dq, dk, dv, d_o = (_placeholder(shape, q.dtype, device, name)
                       for shape, name in zip(bhsd_shapes, ("dq", "dk", "dv", "d_o")))
    b, h, sq, _ = bhsd_shapes[0]
    stats = _placeholder((b, h, sq, 1), torch.float32, device, "stats")
    dbias = _placeholder(tuple(bias.shape), q.dtype, device, "dbias") if bias is not None and bias_grad else None
    q_desc, k_desc, v_desc, o_desc = descs
    _core.fused_attn_bwd_workspace_size(*config.core_args(), q_desc, k_desc, v_desc, o_desc, d_o, stats,
                                        _optional(bias, "bias"), _optional(seqlens_q, "seqlens_q"),
                                        _optional(seqlens_kv, "seqlens_kv"), _optional(rng_state, "rng_state"), dq,
                                        dk, dv, dbias, strides, grad_strides)


def sdpa_bwd(d_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             stats: torch.Tensor, config: FusedAttnConfig, *, q_format: str = "bshd", kv_format: str = "bshd",
             bias: Optional[torch.Tensor] = None, bias_grad: bool = False, seqlens_q: Optional[torch.Tensor] = None,
             seqlens_kv: Optional[torch.Tensor] = None, rng_state: Optional[torch.Tensor] = None
             ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The gradients (dq, dk, dv, dbias) of ``sdpa_fwd`` for the output's gradient ``d_o``
    (o's shape), with the forward's inputs, output, statistics and arguments. dq, dk, dv
    are contiguous in the formats of q, k, v, or, where q, k, v are packed views of one
    buffer (packed_qkv_offsets), views of one buffer laid out the same way; dbias (with
    ``bias_grad``) has the bias's shape, [1, h, sq, skv] only."""
    q, k, v = _prepare(q, k, v, config, q_format, kv_format, seqlens_q, seqlens_kv, rng_state)
    o = _addressable(o)
    if d_o.shape != o.shape:
        raise ValueError(f"fused attention: d_o must have o's shape {tuple(o.shape)}, got {tuple(d_o.shape)}")
    d_o = d_o.to(o.dtype).contiguous()  # o's layout: the graph checked in the forward assumed it
    device = q.device
    shapes, _, _ = _grad_layouts(q, k, v, q_format, kv_format)
    dq, dk, dv = _gradient_buffers(q, k, v, shapes)
    dbias = torch.empty(bias.shape, dtype=q.dtype, device=device) if bias is not None and bias_grad else None
    (q_desc, q_st), (k_desc, k_st), (v_desc, v_st), (o_desc, o_st) = (
        _operand(q, q_format, "q"), _operand(k, kv_format, "k"), _operand(v, kv_format, "v"),
        _operand(o, q_format, "o"))
    strides = q_st + k_st + v_st + o_st
    (dq_desc, dq_st), (dk_desc, dk_st), (dv_desc, dv_st), (do_desc, do_st) = (
        _operand(dq, q_format, "dq"), _operand(dk, kv_format, "dk"), _operand(dv, kv_format, "dv"),
        _operand(d_o, q_format, "d_o"))
    grad_strides = dq_st + dk_st + dv_st + do_st
    args = (*config.core_args(), q_desc, k_desc, v_desc, o_desc, do_desc, describe(stats, "stats"),
            _optional(bias, "bias"), _optional(seqlens_q, "seqlens_q"), _optional(seqlens_kv, "seqlens_kv"),
            _optional(rng_state, "rng_state"), dq_desc, dk_desc, dv_desc, _optional(dbias, "dbias"), strides,
            grad_strides)
    size = _core.fused_attn_bwd_workspace_size(*args)
    workspace, _keep = _workspace(size, device)
    _core.fused_attn_bwd(*args, workspace, size, stream_of(q))
    if config.padding:
        _zero_padded_rows(dq, q_format, seqlens_q)
        _zero_padded_rows(dk, kv_format, seqlens_kv)
        _zero_padded_rows(dv, kv_format, seqlens_kv)
    return dq, dk, dv, dbias


# ---- Transformer Engine's tex-style entry points ------------------------------------------------


def _layout_formats(qkv_layout: str) -> Tuple[str, str]:
    """q and kv formats of a Transformer Engine qkv_layout ("bshd_bshd_bshd", "sbh3d",
    "bs3hd", "sbhd_sb2hd", ...): each is "sbhd" or "bshd" by its first two letters."""
    parts = qkv_layout.lower().split("_")
    kinds = []
    for part in (parts[0], parts[-1]):
        if part.startswith("sb"):
            kinds.append("sbhd")
        elif part.startswith("bs"):
            kinds.append("bshd")
        elif part.startswith("t"):
            raise NotImplementedError(f"fused attention: the thd layouts ({qkv_layout!r}) are not implemented in "
                                      "OpenTE's cuDNN backend; DotProductAttention pads thd to bshd")
        else:
            raise ValueError(f"fused attention: unknown qkv_layout {qkv_layout!r}")
    return kinds[0], kinds[1]


def _seqlens_from_cu(cu_seqlens: Optional[torch.Tensor], name: str) -> torch.Tensor:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"fused attention: {name} must be an int32 tensor [b + 1] for padding masks")
    cu = cu_seqlens.to(torch.int32)
    return (cu[1:] - cu[:-1]).contiguous()


def _unsupported(name: str, value) -> None:
    if value is not None and value is not False:
        raise NotImplementedError(f"fused attention: {name} is not implemented in OpenTE's cuDNN backend")


def fused_attn_fwd(is_training: bool, max_seqlen_q: int, max_seqlen_kv: int, cu_seqlens_q: Optional[torch.Tensor],
                   cu_seqlens_kv: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   fake_dtype: Optional[torch.dtype] = None, fused_attention_backend=None,
                   attn_bias: Optional[torch.Tensor] = None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
                   page_table_k=None, page_table_v=None, s_quantizer=None, o_quantizer=None,
                   attn_scale: Optional[float] = None, dropout: float = 0.0, fast_zero_fill: bool = True,
                   qkv_layout: str = "sbhd_sbhd_sbhd", attn_bias_type: str = "no_bias",
                   attn_mask_type: str = "padding", softmax_type: str = "vanilla",
                   window_size: Tuple[int, int] = (-1, -1), rng_gen: Optional[torch.Generator] = None,
                   softmax_offset=None, return_max_logit: bool = False) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    """Transformer Engine's ``fused_attn_fwd``: returns (output, aux_ctx_tensors) with
    aux_ctx_tensors = [softmax_stats, rng_state] for training (and [] otherwise), to be
    given back to ``fused_attn_bwd``. ``cu_seqlens_q`` / ``cu_seqlens_kv`` (int32 [b + 1])
    give the true lengths of padded sequences for the padding mask types (ignored
    otherwise); ``attn_scale`` defaults to 1/sqrt(head dim). The thd layouts, paged KV,
    FP8 quantizers, sink softmax types and max_logit are not implemented here."""
    del max_seqlen_q, max_seqlen_kv, fake_dtype, fused_attention_backend, fast_zero_fill
    for name, value in (("cu_seqlens_q_padded", cu_seqlens_q_padded), ("cu_seqlens_kv_padded", cu_seqlens_kv_padded),
                        ("page_table_k", page_table_k), ("page_table_v", page_table_v),
                        ("s_quantizer", s_quantizer), ("o_quantizer", o_quantizer),
                        ("softmax_offset", softmax_offset), ("return_max_logit", return_max_logit)):
        _unsupported(name, value)
    if softmax_type != "vanilla":
        raise NotImplementedError(f"fused attention: softmax_type={softmax_type!r} is not implemented")
    q_format, kv_format = _layout_formats(qkv_layout)
    mask_type = attn_mask_type.replace(",", "_")
    config = FusedAttnConfig(mask_type=mask_type, window=tuple(window_size), bias_type=attn_bias_type,
                             softmax_scale=q.shape[-1] ** -0.5 if attn_scale is None else attn_scale,
                             dropout=dropout if is_training else 0.0)
    seqlens_q = seqlens_kv = None
    if config.padding:
        seqlens_q = _seqlens_from_cu(cu_seqlens_q, "cu_seqlens_q")
        seqlens_kv = _seqlens_from_cu(cu_seqlens_kv, "cu_seqlens_kv")
    rng_state = philox_rng_state(q.device, rng_gen) if config.dropout > 0.0 else None
    bias = attn_bias.to(q.dtype).contiguous() if attn_bias is not None else None
    out, stats = sdpa_fwd(q, k, v, config, q_format=q_format, kv_format=kv_format, bias=bias, seqlens_q=seqlens_q,
                          seqlens_kv=seqlens_kv, rng_state=rng_state, with_stats=is_training)
    if not is_training:
        return out, []
    if rng_state is None:
        rng_state = torch.zeros(2, dtype=torch.int64, device=q.device)
    return out, [stats, rng_state]


def fused_attn_bwd(max_seqlen_q: int, max_seqlen_kv: int, cu_seqlens_q: Optional[torch.Tensor],
                   cu_seqlens_kv: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   o: torch.Tensor, d_o: torch.Tensor, fake_dtype: Optional[torch.dtype] = None,
                   dqkv_dtype: Optional[torch.dtype] = None, aux_ctx_tensors: Optional[List[torch.Tensor]] = None,
                   fused_attention_backend=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
                   s_quantizer=None, dp_quantizer=None, dqkv_quantizer=None, attn_scale: Optional[float] = None,
                   dropout: float = 0.0, fast_zero_fill: bool = True, qkv_layout: str = "sbhd_sbhd_sbhd",
                   attn_bias_type: str = "no_bias", attn_mask_type: str = "padding", softmax_type: str = "vanilla",
                   window_size: Tuple[int, int] = (-1, -1), deterministic: bool = False,
                   attn_bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
    """Transformer Engine's ``fused_attn_bwd``: (dq, dk, dv, dbias, d_softmax_offset) from
    the forward's arguments and its aux_ctx_tensors. dbias (for "post_scale_bias") needs
    the forward's bias as ``attn_bias`` and has shape [1, h, sq, skv]; d_softmax_offset is
    None (sink softmax types are not implemented)."""
    del max_seqlen_q, max_seqlen_kv, fake_dtype, fused_attention_backend, fast_zero_fill
    for name, value in (("cu_seqlens_q_padded", cu_seqlens_q_padded), ("cu_seqlens_kv_padded", cu_seqlens_kv_padded),
                        ("s_quantizer", s_quantizer), ("dp_quantizer", dp_quantizer),
                        ("dqkv_quantizer", dqkv_quantizer)):
        _unsupported(name, value)
    if softmax_type != "vanilla":
        raise NotImplementedError(f"fused attention: softmax_type={softmax_type!r} is not implemented")
    if not aux_ctx_tensors or len(aux_ctx_tensors) < 2:
        raise ValueError("fused attention: aux_ctx_tensors must be the [softmax_stats, rng_state] the training "
                         "forward returned")
    stats, rng_state = aux_ctx_tensors[0], aux_ctx_tensors[1]
    q_format, kv_format = _layout_formats(qkv_layout)
    config = FusedAttnConfig(mask_type=attn_mask_type.replace(",", "_"), window=tuple(window_size),
                             bias_type=attn_bias_type,
                             softmax_scale=q.shape[-1] ** -0.5 if attn_scale is None else attn_scale, dropout=dropout,
                             deterministic=deterministic)
    if config.bias_type == "post_scale_bias" and attn_bias is None:
        raise ValueError("fused attention: attn_bias_type='post_scale_bias' needs the forward's attn_bias")
    seqlens_q = seqlens_kv = None
    if config.padding:
        seqlens_q = _seqlens_from_cu(cu_seqlens_q, "cu_seqlens_q")
        seqlens_kv = _seqlens_from_cu(cu_seqlens_kv, "cu_seqlens_kv")
    bias = attn_bias.to(q.dtype).contiguous() if attn_bias is not None else None
    dq, dk, dv, dbias = sdpa_bwd(d_o, q, k, v, o, stats, config, q_format=q_format, kv_format=kv_format, bias=bias,
                                 bias_grad=bias is not None, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv,
                                 rng_state=rng_state if config.dropout > 0.0 else None)
    if dqkv_dtype is not None:
        dq, dk, dv = dq.to(dqkv_dtype), dk.to(dqkv_dtype), dv.to(dqkv_dtype)
    return dq, dk, dv, dbias, None
