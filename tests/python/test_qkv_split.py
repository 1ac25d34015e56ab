"""Packed QKV gradients: the cuDNN attention's backward writes dq, dk, dv into one buffer
laid out as packed q, k, v (fused_attn.packed_qkv_offsets), and MultiheadAttention's split
(attention/_qkv_split.py) takes them whole instead of concatenating them."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_cuda, requires_cudnn

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention import _qkv_split
from transformer_engine.pytorch.attention.dot_product_attention import fused as fused_backend
from transformer_engine.pytorch.cpp_extensions import fused_attn
from transformer_engine.pytorch.cpp_extensions.fused_attn import packed_qkv_offsets

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def split_views(shape, dim, dtype=torch.bfloat16, device="cpu"):
    """q, k, v as MultiheadAttention makes them: one [.., 3, ..] buffer split along ``dim``,
    the size-1 dim dropped."""
    mixed = torch.empty(shape, dtype=dtype, device=device)
    return mixed, [t.squeeze(dim) for t in torch.split(mixed, [1, 1, 1], dim=dim)]


@pytest.mark.parametrize("shape,dim,offsets", [
    ((2, 5, 4, 3, 16), -2, (0, 16, 32)),  # bsh3d (interleaved heads, MultiheadAttention's default)
    ((5, 2, 4, 3, 16), -2, (0, 16, 32)),  # sbh3d
    ((2, 5, 3, 4, 16), -3, (0, 64, 128)),  # bs3hd
    ((1, 7, 1, 3, 64), -2, (0, 64, 128)),  # batch and heads of one
])
def test_packed_offsets_of_split_views(shape, dim, offsets):
    mixed, (q, k, v) = split_views(shape, dim)
    assert packed_qkv_offsets(q, k, v) == (mixed.numel(), *offsets)
    assert packed_qkv_offsets(k, q, v) == (mixed.numel(), offsets[1], offsets[0], offsets[2])


def test_packed_offsets_refuse_what_is_not_packed():
    _, (q, k, v) = split_views((2, 5, 4, 3, 16), -2)
    assert packed_qkv_offsets(q, k, k) is None  # k and v the same memory
    separate = torch.empty(2, 5, 4, 16, dtype=torch.bfloat16)
    assert packed_qkv_offsets(q, k, separate) is None  # another buffer
    assert packed_qkv_offsets(q, k, v.float()) is None  # another dtype
    flat = torch.empty(2 * 5 * 4 * 3 * 16 + 16, dtype=torch.bfloat16)
    strides = (5 * 4 * 48, 4 * 48, 48, 1)
    views = [flat.as_strided((2, 5, 4, 16), strides, offset) for offset in (0, 8, 32)]
    assert packed_qkv_offsets(*views) is None  # windows 8 apart: q and k overlap
    views = [flat.as_strided((2, 5, 4, 8), strides, offset) for offset in (0, 16, 40)]
    assert packed_qkv_offsets(*views) is not None  # head dim 8: disjoint windows, aligned
    views = [flat.as_strided((2, 5, 4, 8), strides, offset) for offset in (0, 16, 36)]
    assert packed_qkv_offsets(*views) is None  # v 72 bytes in: not 16-byte aligned
    gqa_q = torch.empty(2, 5, 8, 16, dtype=torch.bfloat16)
    assert packed_qkv_offsets(gqa_q, k, v) is None  # other shapes


@pytest.mark.parametrize("device", DEVICES)
def test_split_backward_takes_packed_gradients_whole(device):
    mixed = torch.randn(2, 5, 4, 3, 16, device=device, requires_grad=True)
    q, k, v = _qkv_split.split_along_dim(mixed, [1, 1, 1], -2)
    # the parts' gradients as views of one buffer of mixed's layout, as the attention writes them
    packed = torch.randn(2, 5, 4, 3, 16, device=device)
    grads = torch.split(packed, [1, 1, 1], dim=-2)
    got = torch.autograd.grad((q, k, v), mixed, grads)[0]
    assert got.data_ptr() == packed.data_ptr() and torch.equal(got, packed)  # no copy
    # anything else: concatenated
    q, k, v = _qkv_split.split_along_dim(mixed, [1, 1, 1], -2)
    grads = [g.contiguous() for g in grads]
    got = torch.autograd.grad((q, k, v), mixed, grads)[0]
    assert got.data_ptr() != packed.data_ptr() and torch.equal(got, packed)
    # a part without a gradient: zeros in its place
    first, _ = _qkv_split.split_along_dim(mixed, [2, 1], -2)
    got = torch.autograd.grad(first.sum(), mixed)[0]
    assert torch.equal(got[..., :2, :], torch.ones_like(got[..., :2, :])) and not got[..., 2, :].any()


def _mha_step(attn, x, seed=0):
    torch.manual_seed(seed)
    y = attn(x)
    y.backward(torch.randn_like(y))
    grads = [x.grad.clone()] + [p.grad.clone() for p in attn.parameters()]
    x.grad = None
    attn.zero_grad()
    return y.detach(), grads


# The packed gradients come from the cuDNN backend only (without it MultiheadAttention
# runs the unfused attention, which concatenates).
@requires_cudnn
@pytest.mark.filterwarnings("ignore:Warning. Profiler clears events")  # torch.profiler's note, each profile
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["bsh3d", "bs3hd"])
def test_fused_attention_gradients_packed_without_a_copy(fmt, interleaved, monkeypatch):
    """MultiheadAttention on cuDNN: the same output and gradients, bit for bit, with the
    packed gradients and with them contiguous and concatenated (packed_qkv_offsets off),
    and no concatenation in the packed backward."""
    torch.manual_seed(1)
    attn = te.MultiheadAttention(256, 4, attn_mask_type="causal", qkv_format=fmt, params_dtype=torch.bfloat16,
                                 qkv_weight_interleaved=interleaved, device="cuda")
    shape = (128, 2, 256) if fmt == "sbhd" else (2, 128, 256)
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        packed = _mha_step(attn, x)
    cats = sum(1 for e in prof.events() if e.name == "aten::cat")
    monkeypatch.setattr(fused_attn, "packed_qkv_offsets", lambda q, k, v: None)
    monkeypatch.setattr(fused_backend, "packed_qkv_offsets", lambda q, k, v: None)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        unpacked = _mha_step(attn, x)
    assert cats == 0 and sum(1 for e in prof.events() if e.name == "aten::cat") == 1
    assert torch.equal(packed[0], unpacked[0])
    for a, b in zip(packed[1], unpacked[1]):
        assert torch.equal(a, b)
