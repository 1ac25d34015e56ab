"""KV caching for inference (Transformer Engine's ``InferenceParams``, non-paged).

The cache of a layer is a pair of pre-allocated tensors
``k_cache [max_batch_size, max_sequence_length, num_heads_kv, head_dim_k]`` and
``v_cache [.., head_dim_v]`` (bshd). Each forward of a DotProductAttention with
``inference_params`` writes the step's keys and values into it and attends over
everything cached so far, so decoding token by token gives what attention over the full
sequence gives.

Two ways to drive it:

* Transformer Engine 2.x: before each step call ``pre_step(OrderedDict({seq_id: step_len}))``
  with the sequences of the batch in batch order. Sequences new to the cache start at 0,
  known ones continue, ones left out are finished and free their place. Query / key /
  value of the step are [b, s, h, d] (bshd, or sbhd) with sequence i's ``step_len`` tokens
  first along s (the rest is padding, ignored, with a zero output).
* Transformer Engine 1.x: without ``pre_step``, every sequence of the batch has the same
  length; the step's tokens go to positions ``sequence_len_offset ..`` of batch rows
  ``batch_size_offset ..``, and the caller advances ``sequence_len_offset`` after the
  forward.

The cache keeps no autograd history. Paged caches (``is_paged=True``), custom cache
managers and the thd format raise NotImplementedError.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

import torch

__all__ = ["InferenceParams"]


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"InferenceParams: {name} must be a positive int, got {value!r}")
    return value


class InferenceParams:
    """KV cache state shared by the attention layers of a model (see the module docstring).

    Parameters: ``max_batch_size``, ``max_sequence_length``; ``num_heads_kv``,
    ``head_dim_k``, ``dtype`` (``head_dim_v``, default head_dim_k) describe the cache and
    are required by ``allocate_memory``; when left out, a layer's cache takes them from its
    first keys and values. ``qkv_format``: the format of the step's tensors ("bshd" or
    "sbhd"). ``is_paged``, ``total_num_pages``, ``page_size``, ``max_ctx_len`` and
    ``custom_cache_manager`` are Transformer Engine's paged-cache options.
    """

    def __init__(self, max_batch_size: int, max_sequence_length: int, num_heads_kv: Optional[int] = None,
                 head_dim_k: Optional[int] = None, dtype: Optional[torch.dtype] = None,
                 head_dim_v: Optional[int] = None, is_paged: bool = False, total_num_pages: Optional[int] = None,
                 page_size: Optional[int] = None, max_ctx_len: Optional[int] = None, qkv_format: str = "bshd",
                 custom_cache_manager=None):
        self.max_batch_size = _positive_int(max_batch_size, "max_batch_size")
        self.max_sequence_length = _positive_int(max_sequence_length, "max_sequence_length")
        if is_paged:
            raise NotImplementedError("InferenceParams: a paged KV cache (is_paged=True) is not implemented in "
                                      "OpenTE yet")
        if custom_cache_manager is not None:
            raise NotImplementedError("InferenceParams: custom_cache_manager is not implemented in OpenTE yet")
        if qkv_format == "thd":
            raise NotImplementedError("InferenceParams: KV caching with qkv_format='thd' is not implemented in "
                                      "OpenTE yet; use 'bshd' or 'sbhd'")
        if qkv_format not in ("bshd", "sbhd"):
            raise ValueError(f"InferenceParams: qkv_format must be 'bshd' or 'sbhd', got {qkv_format!r}")
        self.num_heads_kv = None if num_heads_kv is None else _positive_int(num_heads_kv, "num_heads_kv")
        self.head_dim_k = None if head_dim_k is None else _positive_int(head_dim_k, "head_dim_k")
        self.head_dim_v = self.head_dim_k if head_dim_v is None else _positive_int(head_dim_v, "head_dim_v")
        self.dtype = dtype
        self.is_paged = False
        self.total_num_pages, self.page_size, self.max_ctx_len = total_num_pages, page_size, max_ctx_len
        self.input_qkv_format = qkv_format
        self.cache: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        # Transformer Engine 1.x position, advanced by the caller.
        self.sequence_len_offset = 0
        self.batch_size_offset = 0
        # Transformer Engine 2.x sequences, set by pre_step.
        self.sequences: "OrderedDict[object, int]" = OrderedDict()
        self.sequences_pre_step: "OrderedDict[object, int]" = OrderedDict()
        self.step_lengths: "OrderedDict[object, int]" = OrderedDict()
        self.batch_size = 0
        self._slots: Dict[object, int] = {}
        self._uses_pre_step = False
        self._copy_index: Optional[Dict[str, torch.Tensor]] = None

    def __repr__(self) -> str:
        return (f"InferenceParams(max_batch_size={self.max_batch_size}, max_sequence_length="
                f"{self.max_sequence_length}, num_heads_kv={self.num_heads_kv}, head_dim_k={self.head_dim_k}, "
                f"head_dim_v={self.head_dim_v}, dtype={self.dtype})")

    def reset(self) -> None:
        """Forget every sequence (the cache memory is kept)."""
        self.sequences, self.sequences_pre_step, self.step_lengths = OrderedDict(), OrderedDict(), OrderedDict()
        self.batch_size = 0
        self._slots = {}
        self._uses_pre_step = False
        self._copy_index = None
        self.sequence_len_offset = 0
        self.batch_size_offset = 0

    # ---- memory ----
    def allocate_memory(self, layer_number: int, device=None) -> None:
        """Allocate layer ``layer_number``'s cache (zeros) on ``device`` (the current GPU,
        or the CPU without one)."""
        if self.num_heads_kv is None or self.head_dim_k is None or self.dtype is None:
            raise ValueError("InferenceParams.allocate_memory: needs num_heads_kv, head_dim_k and dtype (give them "
                             "to the constructor)")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        shape = (self.max_batch_size, self.max_sequence_length, self.num_heads_kv)
        self.cache[layer_number] = (torch.zeros(*shape, self.head_dim_k, dtype=self.dtype, device=device),
                                    torch.zeros(*shape, self.head_dim_v, dtype=self.dtype, device=device))

    def _layer_cache(self, layer_number: int, new_k: torch.Tensor,
                     new_v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if layer_number not in self.cache:
            self.num_heads_kv = self.num_heads_kv or new_k.shape[2]
            self.head_dim_k = self.head_dim_k or new_k.shape[3]
            self.head_dim_v = self.head_dim_v or new_v.shape[3]
            self.dtype = self.dtype or new_k.dtype
            self.allocate_memory(layer_number, new_k.device)
        k_cache, v_cache = self.cache[layer_number]
        if k_cache.device != new_k.device:
            raise ValueError(f"InferenceParams: the cache of layer {layer_number} is on {k_cache.device} but the "
                             f"keys are on {new_k.device}")
        if new_k.shape[2:] != k_cache.shape[2:] or new_v.shape[2:] != v_cache.shape[2:]:
            raise ValueError(f"InferenceParams: key/value heads and head dims {tuple(new_k.shape[2:])} / "
                             f"{tuple(new_v.shape[2:])} do not match the cache's {tuple(k_cache.shape[2:])} / "
                             f"{tuple(v_cache.shape[2:])}")
        return k_cache, v_cache

    # ---- Transformer Engine 2.x stepping ----
    def pre_step(self, step_dict: "OrderedDict[object, int]") -> "OrderedDict[object, int]":
        """Start a step: ``step_dict`` maps each sequence of the batch (in batch order) to
        its number of new tokens. Returns the sequence lengths after the step."""
        if not isinstance(step_dict, dict) or not step_dict:
            raise ValueError("InferenceParams.pre_step: step_dict must be a non-empty dict {seq_id: step_len}")
        if len(step_dict) > self.max_batch_size:
            raise ValueError(f"InferenceParams.pre_step: {len(step_dict)} sequences exceed max_batch_size="
                             f"{self.max_batch_size}")
        for seq, step_len in step_dict.items():
            if isinstance(step_len, bool) or not isinstance(step_len, int) or step_len <= 0:
                raise ValueError(f"InferenceParams.pre_step: step length of sequence {seq!r} must be a positive "
                                 f"int, got {step_len!r}")
            total = self.sequences.get(seq, 0) + step_len
            if total > self.max_sequence_length:
                raise ValueError(f"InferenceParams.pre_step: sequence {seq!r} would hold {total} tokens, more than "
                                 f"max_sequence_length={self.max_sequence_length}")
        for seq in list(self._slots):
            if seq not in step_dict:  # finished: its place is free again
                del self._slots[seq]
        free = sorted(set(range(self.max_batch_size)) - set(self._slots.values()))
        for seq in step_dict:
            if seq not in self._slots:
                self._slots[seq] = free.pop(0)
        self.sequences_pre_step = OrderedDict((seq, self.sequences.get(seq, 0)) for seq in step_dict)
        self.step_lengths = OrderedDict(step_dict)
        self.sequences = OrderedDict((seq, self.sequences_pre_step[seq] + n) for seq, n in step_dict.items())
        self.batch_size = len(step_dict)
        self._uses_pre_step = True
        self._copy_index = None
        return self.sequences

    def get_seqlens_pre_step(self) -> torch.Tensor:
        """Cached lengths before the step [batch_size] (int32)."""
        return torch.tensor(list(self.sequences_pre_step.values()), dtype=torch.int32)

    def _index(self, device) -> Dict[str, torch.Tensor]:
        """Where the step's tokens come from (batch, position) and go to (slot, position),
        and the slots of the batch, built once per step."""
        if self._copy_index is None or self._copy_index["slots"].device != torch.device(device):
            src_b: List[int] = []
            src_s: List[int] = []
            dst_slot: List[int] = []
            dst_s: List[int] = []
            for i, (seq, n) in enumerate(self.step_lengths.items()):
                start = self.sequences_pre_step[seq]
                src_b += [i] * n
                src_s += list(range(n))
                dst_slot += [self._slots[seq]] * n
                dst_s += list(range(start, start + n))
            as_index = lambda values: torch.tensor(values, dtype=torch.int64, device=device)  # noqa: E731
            self._copy_index = {"src_b": as_index(src_b), "src_s": as_index(src_s), "dst_slot": as_index(dst_slot),
                                "dst_s": as_index(dst_s),
                                "slots": as_index([self._slots[seq] for seq in self.step_lengths])}
        return self._copy_index

    def step(self, layer_number: int, new_k: torch.Tensor, new_v: torch.Tensor, qkv_format: str):
        """Write the step's keys and values (``qkv_format`` bshd or sbhd) into layer
        ``layer_number``'s cache and return ``(k, v, cu_seqlens_q, cu_seqlens_kv,
        max_seqlen_kv, "bshd" or "sbhd_2bshd")``: k / v [b, max_seqlen_kv, hg, d] (bshd)
        hold each sequence's cached tokens (then padding), cu_seqlens_* (int32, [b + 1], on
        the keys' device) the step's and the cached lengths."""
        if qkv_format not in ("bshd", "sbhd"):
            raise NotImplementedError(f"InferenceParams.step: qkv_format={qkv_format!r} is not implemented in OpenTE "
                                      "yet; use 'bshd' or 'sbhd'")
        if new_k.dim() != 4 or new_v.dim() != 4:
            raise ValueError(f"InferenceParams.step: keys and values must be 4-D {qkv_format}, got shapes "
                             f"{tuple(new_k.shape)} and {tuple(new_v.shape)}")
        if qkv_format == "sbhd":
            new_k, new_v = new_k.transpose(0, 1), new_v.transpose(0, 1)
        k_cache, v_cache = self._layer_cache(layer_number, new_k, new_v)
        b, s = new_k.shape[0], new_k.shape[1]
        device = new_k.device
        with torch.no_grad():
            if self._uses_pre_step:
                k, v, q_lengths, kv_lengths = self._step_sequences(k_cache, v_cache, new_k, new_v)
            else:
                k, v, q_lengths, kv_lengths = self._step_offset(k_cache, v_cache, new_k, new_v, b, s)
        zero = torch.zeros(1, dtype=torch.int32)
        cu_q = torch.cat([zero, torch.tensor(q_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)])
        cu_kv = torch.cat([zero, torch.tensor(kv_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)])
        out_format = "bshd" if qkv_format == "bshd" else "sbhd_2bshd"
        return k, v, cu_q.to(device), cu_kv.to(device), k.shape[1], out_format

    def _step_sequences(self, k_cache, v_cache, new_k, new_v):
        b, s = new_k.shape[0], new_k.shape[1]
        if b != self.batch_size:
            raise ValueError(f"InferenceParams.step: the keys hold a batch of {b} but pre_step announced "
                             f"{self.batch_size} sequences")
        longest_step = max(self.step_lengths.values())
        if s < longest_step:
            raise ValueError(f"InferenceParams.step: the keys hold {s} tokens per sequence but pre_step announced "
                             f"up to {longest_step}")
        index = self._index(new_k.device)
        k_cache[index["dst_slot"], index["dst_s"]] = new_k[index["src_b"], index["src_s"]].to(k_cache.dtype)
        v_cache[index["dst_slot"], index["dst_s"]] = new_v[index["src_b"], index["src_s"]].to(v_cache.dtype)
        kv_len = max(self.sequences.values())
        k = k_cache.index_select(0, index["slots"])[:, :kv_len]
        v = v_cache.index_select(0, index["slots"])[:, :kv_len]
        return k, v, list(self.step_lengths.values()), list(self.sequences.values())

    def _step_offset(self, k_cache, v_cache, new_k, new_v, b, s):
        start, end = self.sequence_len_offset, self.sequence_len_offset + s
        rows = slice(self.batch_size_offset, self.batch_size_offset + b)
        if end > self.max_sequence_length or self.batch_size_offset + b > self.max_batch_size:
            raise ValueError(f"InferenceParams.step: tokens {start}..{end - 1} of batch rows "
                             f"{rows.start}..{rows.stop - 1} do not fit the cache of max_batch_size="
                             f"{self.max_batch_size}, max_sequence_length={self.max_sequence_length}")
        k_cache[rows, start:end] = new_k.to(k_cache.dtype)
        v_cache[rows, start:end] = new_v.to(v_cache.dtype)
        return k_cache[rows, :end], v_cache[rows, :end], [s] * b, [end] * b
