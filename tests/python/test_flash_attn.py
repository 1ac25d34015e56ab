"""DotProductAttention's FlashAttention backend: its selection (backends.py) and its call
of the flash-attn package (flash.py).

CPU: flash-attn is replaced by fake_flash_attn.py (plain torch from flash-attn's documented
semantics; it checks the arguments as flash-attn's API states them and records each call),
installed in sys.modules with the package version patched where backends.py reads it.
The selection tests keep every rule. The call tests lift only the platform rule (CUDA
sm80+, fp16 / bf16: ``_flash_platform_reasons``) so that float32 CPU tensors reach the
fake, and compare outputs and gradients with the unfused backend.
CUDA: the real package (skipped where it is not installed) against the unfused backend.

Tolerances. CPU: float32, head dim 8, at most 12 keys a row; both backends sum the same
terms in float32 in different orders, a few ulps apart, so 1e-5 absolute / relative is a
wide margin that still catches one wrong mask or bias entry (it moves a probability by
>= 1e-2). CUDA bf16 / fp16: FlashAttention's rule (DESIGN.md): the error against a float32
reference at most 3x that of the unfused backend in the same precision, plus 1e-3 for
the entries where that one is exact.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError

import fake_flash_attn
import pytest
import torch
from attention_params import attention_params
from conftest import requires_cuda

import transformer_engine.pytorch as te
from transformer_engine.pytorch.attention.dot_product_attention import backends
from transformer_engine.pytorch.attention.dot_product_attention.backends import AttentionParams, get_attention_backend

FLASH, FUSED, UNFUSED = "FlashAttention", "FusedAttention", "UnfusedDotProductAttention"
TOL = dict(atol=1e-5, rtol=1e-5)
_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN", "NVTE_FUSED_ATTN_BACKEND", "NVTE_DEBUG",
        "NVTE_DEBUG_LEVEL", "NVTE_ALLOW_NONDETERMINISTIC_ALGO")


@pytest.fixture
def clean(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    backends._select.cache_clear()
    yield
    backends._select.cache_clear()


def set_version(monkeypatch, text):
    """flash-attn ``text`` installed as backends.py sees it (None: not installed)."""
    real = backends.version

    def version(name):
        if name != "flash-attn":
            return real(name)
        if text is None:
            raise PackageNotFoundError(name)
        return text

    monkeypatch.setattr(backends, "version", version)
    backends._select.cache_clear()


@pytest.fixture
def fake(monkeypatch, clean):
    module = fake_flash_attn.make_module()
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    set_version(monkeypatch, module.__version__)
    return module


@pytest.fixture
def fake_on_cpu(monkeypatch, fake):
    """The fake, with the platform rule lifted so that float32 CPU tensors reach it."""
    monkeypatch.setattr(backends, "_flash_platform_reasons", lambda p: [])
    return fake


# ==== selection =================================================================================


def params(**overrides) -> AttentionParams:
    """attention_params on an sm_80 GPU (flash-attn 2's first architecture) unless overridden."""
    return attention_params(**{"compute_capability": (8, 0), **overrides})


def flash_reasons(choice) -> str:
    return "; ".join(choice.reasons.get(FLASH, []))


@pytest.mark.parametrize("overrides", [
    {},
    dict(qkv_dtype=torch.float16),
    dict(num_gqa_groups=4),
    dict(num_gqa_groups=1, head_dim_qk=128, head_dim_v=128),
    dict(head_dim_qk=256, head_dim_v=256),
    dict(compute_capability=(8, 6), head_dim_qk=192, head_dim_v=192),
    dict(attn_mask_type="no_mask", window_size=(-1, -1), max_seqlen_q=1, max_seqlen_kv=300),
    dict(attn_mask_type="causal_bottom_right", max_seqlen_q=64),
    dict(attn_mask_type="causal_bottom_right", max_seqlen_q=256),
    dict(attn_mask_type="padding_causal", shared_seqlens=True),
    dict(attn_mask_type="padding_causal_bottom_right", max_seqlen_q=1, max_seqlen_kv=300),
    dict(attn_mask_type="padding", window_size=(-1, -1), max_seqlen_q=64),
    dict(attn_mask_type="no_mask", window_size=(16, 16)),
    dict(attn_mask_type="causal", window_size=(16, 0)),
    dict(core_attention_bias_type="alibi"),
    dict(core_attention_bias_type="alibi", alibi_slopes_shape=(2, 16)),
    dict(attention_dropout=0.1),
    dict(deterministic=True),
    dict(qkv_format="thd", attn_mask_type="padding_causal", shared_seqlens=True),
    dict(inference=True, attn_mask_type="padding_causal_bottom_right", max_seqlen_q=1),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_flash_chosen(fake, overrides):
    choice = get_attention_backend(params(**overrides))
    assert choice.name == FLASH, choice.reasons
    assert set(choice.reasons) == {FUSED, UNFUSED} and choice.fused_attention_backend is None


def test_hopper_prefers_fused_then_flash(fake, monkeypatch):
    monkeypatch.setattr(backends, "_cudnn_unavailable_reason", lambda: None)
    choice = get_attention_backend(params(compute_capability=(9, 0)))
    assert choice.name == FUSED
    assert flash_reasons(choice) == ("can run the call, but FusedAttention comes first (preference: FusedAttention > "
                                     "FlashAttention > UnfusedDotProductAttention)")
    assert get_attention_backend(params(compute_capability=(9, 0), core_attention_bias_type="alibi")).name == FLASH
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    assert get_attention_backend(params(compute_capability=(9, 0))).name == FLASH
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    choice = get_attention_backend(params(compute_capability=(9, 0)))
    assert choice.name == UNFUSED and flash_reasons(choice) == "disabled by NVTE_FLASH_ATTN=0"


@pytest.mark.parametrize("overrides,reason", [
    (dict(device_type="cpu", compute_capability=(0, 0)), "needs CUDA tensors, got cpu"),
    (dict(compute_capability=(7, 5)), "needs compute capability 8.0 or newer, got (7, 5)"),
    (dict(qkv_dtype=torch.float32), "needs float16 or bfloat16, got float32 inputs"),
    (dict(head_dim_v=128), "needs one head dim for q, k and v (flash-attn 2 has no MLA), got 64 and 128"),
    (dict(head_dim_qk=260, head_dim_v=260), "a multiple of 8 and at most 256, got 260"),
    (dict(head_dim_qk=12, head_dim_v=12), "a multiple of 8 and at most 256, got 12"),
    (dict(head_dim_qk=256, head_dim_v=256, compute_capability=(8, 6)), "head dims above 192 need sm80"),
    (dict(batch_size=0), "does not take empty tensors"),
    (dict(attn_mask_type="arbitrary", window_size=(-1, -1)), "does not take arbitrary masks"),
    (dict(max_seqlen_q=64), "takes the top-left attn_mask_type=causal only when sq == skv, got sq=64, skv=128"),
    (dict(attn_mask_type="padding_causal"), "padding_causal only when queries and keys share their sequence"),
    (dict(core_attention_bias_type="post_scale_bias", core_attention_bias_shape=(1, 16, 128, 128)),
     "does not take core_attention_bias_type=post_scale_bias"),
    (dict(core_attention_bias_type="pre_scale_bias"), "does not take core_attention_bias_type=pre_scale_bias"),
    (dict(softmax_type="off-by-one"), "does not take softmax_type=off-by-one"),
    (dict(softmax_type="learnable"), "does not take softmax_type=learnable"),
    (dict(return_max_logit=True), "does not return max_logit"),
    (dict(fp8_dpa=True), "does not compute attention in FP8"),
    (dict(context_parallel=True), "context parallelism"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_flash_refused_with_reason(fake, overrides, reason):
    choice = get_attention_backend(params(**overrides))
    assert choice.name != FLASH and reason in flash_reasons(choice), flash_reasons(choice)


@pytest.mark.parametrize("installed,overrides,reason", [
    (None, {}, "flash-attn is not installed"),
    ("1.0.9", {}, "flash-attn 1.0.9 is not a 2.x release"),
    ("3.0.0b1", {}, "flash-attn 3.0.0b1 is not a 2.x release"),
    ("nightly", {}, "flash-attn nightly is not a 2.x release"),
    ("2.0.9", {}, "flash-attn 2.0.9 is too old: needs 2.1.1 or newer"),
    ("2.2.1", dict(window_size=(16, 0)), "flash-attn 2.2.1 is too old for sliding windows: needs 2.3.0 or newer"),
    ("2.3.6", dict(core_attention_bias_type="alibi"), "too old for ALiBi: needs 2.4.0 or newer"),
    ("2.4.0", dict(deterministic=True), "too old for deterministic backward: needs 2.4.1 or newer"),
])
def test_flash_version_refused(fake, monkeypatch, installed, overrides, reason):
    set_version(monkeypatch, installed)
    choice = get_attention_backend(params(**overrides))
    assert choice.name != FLASH and reason in flash_reasons(choice), flash_reasons(choice)


@pytest.mark.parametrize("installed,overrides", [
    ("2.1.1", {}),
    ("2.3.0", dict(window_size=(16, 0))),
    ("2.4.0", dict(core_attention_bias_type="alibi")),
    ("2.4.0", dict(deterministic=True, is_training=False)),  # no backward to make deterministic
    ("2.8.3.post1", dict(deterministic=True)),
    ("2.7.4+cu12torch2.6cxx11abiTRUE", {}),
])
def test_flash_versions_taken(fake, monkeypatch, installed, overrides):
    set_version(monkeypatch, installed)
    assert get_attention_backend(params(**overrides)).name == FLASH


@pytest.mark.parametrize("module,error", [(None, "ModuleNotFoundError"),  # None in sys.modules: import raises
                                          (sys, "AttributeError")])  # a module without flash_attn_func
def test_flash_import_error(fake, monkeypatch, module, error):
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    choice = get_attention_backend(params())
    assert choice.name != FLASH
    assert f"flash-attn is installed but cannot be imported ({error}: " in flash_reasons(choice)
    # Imported only for a call it would run: a CPU call names the device, not the import.
    assert "cannot be imported" not in flash_reasons(get_attention_backend(params(device_type="cpu")))


def test_flash_debug_log(fake, monkeypatch, caplog):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "1")
    with caplog.at_level(logging.INFO, logger="DotProductAttention"):
        get_attention_backend(params())
    assert "Running with FlashAttention backend" in caplog.text
    caplog.clear()
    set_version(monkeypatch, None)
    with caplog.at_level(logging.INFO, logger="DotProductAttention"):
        get_attention_backend(params())
    assert "Disabling FlashAttention: flash-attn is not installed" in caplog.text


# ==== the call, through the fake, against the unfused backend (CPU) ============================


def rand(shape, gen):
    return torch.randn(shape, generator=gen, dtype=torch.float64).float().requires_grad_()


def layout(fmt, b, s, h, d):
    return (s, b, h, d) if fmt == "sbhd" else (b, s, h, d)


def padding_mask(lengths, s):
    return (torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]).view(len(lengths), 1, 1, s)


def cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def flash_and_unfused(monkeypatch, fake, dpa, inputs, gen, **kwargs):
    """(outputs, input gradients) through the fake flash-attn and through the unfused
    backend; checks that the first ran flash-attn and the second did not."""
    results = []
    for flash in (True, False):
        monkeypatch.setenv("NVTE_FLASH_ATTN", "1" if flash else "0")
        calls = len(fake.calls)
        for x in inputs:
            x.grad = None
        out = dpa(*inputs, **kwargs)
        assert (len(fake.calls) > calls) == flash
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3)))
        results.append((out.detach(), [x.grad.clone() for x in inputs]))
    return results


def assert_same(results):
    (out_f, grads_f), (out_u, grads_u) = results
    torch.testing.assert_close(out_f, out_u, **TOL)
    for a, b in zip(grads_f, grads_u):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, **TOL)


MASKS = ["no_mask", "causal", "padding", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"]


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("sq,skv", [(9, 9), (6, 11), (11, 6)])
@pytest.mark.parametrize("groups", [4, 2, 1])
def test_dpa_flash_matches_unfused(fake_on_cpu, monkeypatch, gen, fmt, mask, sq, skv, groups):
    if mask in ("causal", "padding_causal") and sq != skv:
        pytest.skip("top-left causal with sq != skv does not go to flash-attn (test_flash_refused_with_reason)")
    b, h, d = 3, 4, 8
    inputs = [rand(layout(fmt, b, s, n, d), gen) for s, n in ((sq, h), (skv, groups), (skv, groups))]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=groups, qkv_format=fmt, attn_mask_type=mask,
                                 attention_type="self" if sq == skv else "cross")
    kwargs = {}
    if "padding" in mask:
        q_lens = [sq, sq - 3, 1]
        kv_lens = q_lens if sq == skv else [skv - 2, skv, 3]
        kwargs["attention_mask"] = (padding_mask(q_lens, sq) if sq == skv
                                    else (padding_mask(q_lens, sq), padding_mask(kv_lens, skv)))
    assert_same(flash_and_unfused(monkeypatch, fake_on_cpu, dpa, inputs, gen, **kwargs))
    call = fake_on_cpu.calls[-1]
    assert call["fn"] == ("flash_attn_varlen_func" if "padding" in mask else "flash_attn_func")
    assert call["kwargs"]["causal"] is ("causal" in mask)


@pytest.mark.parametrize("mask,window,sq,skv", [
    ("no_mask", (2, 1), 9, 9), ("no_mask", (3, 0), 6, 11), ("no_mask", (1, 4), 11, 6), ("no_mask", (-1, 2), 9, 9),
    ("causal", (3, 0), 9, 9), ("causal_bottom_right", (2, 0), 6, 11), ("padding", (2, 2), 9, 9),
    ("padding_causal_bottom_right", (3, 0), 6, 11),
])
def test_dpa_flash_window(fake_on_cpu, monkeypatch, gen, mask, window, sq, skv):
    b, h, d = 3, 4, 8
    inputs = [rand((b, s, h, d), gen) for s in (sq, skv, skv)]
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask, window_size=window,
                                 attention_type="self" if sq == skv else "cross")
    kwargs = {}
    if "padding" in mask:
        kwargs["attention_mask"] = (padding_mask([sq, sq - 2, 2], sq), padding_mask([skv - 1, skv, 4], skv))
    assert_same(flash_and_unfused(monkeypatch, fake_on_cpu, dpa, inputs, gen, **kwargs))
    assert fake_on_cpu.calls[-1]["kwargs"]["window_size"] == window


@pytest.mark.parametrize("mask,sq,skv", [("causal", 9, 9), ("no_mask", 6, 11), ("padding_causal_bottom_right", 11, 6)])
@pytest.mark.parametrize("per_batch", [False, True])
def test_dpa_flash_alibi(fake_on_cpu, monkeypatch, gen, mask, sq, skv, per_batch):
    b, h, d = 3, 4, 8
    inputs = [rand((b, s, h, d), gen) for s in (sq, skv, skv)]
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type=mask, attention_type="cross")
    kwargs = dict(core_attention_bias_type="alibi")
    if per_batch:
        kwargs["alibi_slopes"] = torch.rand(b, h, generator=gen, dtype=torch.float64) * 0.5  # fp64: cast to fp32
    if "padding" in mask:
        kwargs["attention_mask"] = (padding_mask([sq, 5, 2], sq), padding_mask([skv, 3, 6], skv))
    assert_same(flash_and_unfused(monkeypatch, fake_on_cpu, dpa, inputs, gen, **kwargs))
    slopes = fake_on_cpu.calls[-1]["kwargs"]["alibi_slopes"]
    assert slopes.dtype == torch.float32 and slopes.shape == ((b, h) if per_batch else (h,))


@pytest.mark.parametrize("mask", ["padding", "padding_causal", "padding_causal_bottom_right"])
@pytest.mark.parametrize("cross", [False, True])
def test_dpa_flash_thd(fake_on_cpu, monkeypatch, gen, mask, cross):
    if cross and mask == "padding_causal":
        pytest.skip("top-left padding_causal with different lengths does not go to flash-attn")
    h, hg, d = 4, 2, 8
    q_lens = [5, 3, 1, 4]
    kv_lens = [6, 1, 4, 2] if cross else q_lens
    cu_q = cu(q_lens)
    cu_kv = cu(kv_lens) if cross else cu_q  # one tensor for self attention
    inputs = [rand((sum(q_lens), h, d), gen), rand((sum(kv_lens), hg, d), gen), rand((sum(kv_lens), hg, d), gen)]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="thd", attn_mask_type=mask)
    assert_same(flash_and_unfused(monkeypatch, fake_on_cpu, dpa, inputs, gen, cu_seqlens_q=cu_q,
                                  cu_seqlens_kv=cu_kv, max_seqlen_q=6, max_seqlen_kv=7))
    call = fake_on_cpu.calls[-1]
    q, k, v, call_cu_q, call_cu_kv, max_q, max_kv = call["args"]
    assert call["fn"] == "flash_attn_varlen_func"
    assert q.shape == (sum(q_lens), h, d) and k.shape == v.shape == (sum(kv_lens), hg, d)  # packed as given
    assert torch.equal(call_cu_q, cu_q) and torch.equal(call_cu_kv, cu_kv) and (max_q, max_kv) == (6, 7)


def test_dpa_flash_thd_rows_past_the_end(fake_on_cpu, monkeypatch, gen):
    """Tokens past cu_seqlens[-1] (a buffer larger than the batch): flash-attn leaves their
    output and gradients unwritten (NaN in the fake); DotProductAttention gives zeros."""
    h, d, lens, extra = 2, 8, [4, 3], 3
    total = sum(lens) + extra
    inputs = [rand((total, h, d), gen) for _ in range(3)]
    dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    results = flash_and_unfused(monkeypatch, fake_on_cpu, dpa, inputs, gen, cu_seqlens_q=cu(lens),
                                cu_seqlens_kv=cu(lens))
    assert_same(results)
    out, grads = results[0]
    assert torch.all(out[sum(lens):] == 0) and all(torch.all(g[sum(lens):] == 0) for g in grads)


def test_dpa_flash_thd_with_gaps(fake_on_cpu, monkeypatch, gen):
    """Room between sequences (cu_seqlens_*_padded): flash-attn's varlen cannot express it;
    the sequences go through the padded layout, packed densely for flash-attn."""
    h, d, lens, padded = 2, 8, [4, 3], [0, 6, 10]
    inputs = [rand((10, h, d), gen) for _ in range(3)]
    dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal_bottom_right")
    cu_padded = torch.tensor(padded, dtype=torch.int32)
    results = flash_and_unfused(monkeypatch, fake_on_cpu, dpa, inputs, gen, cu_seqlens_q=cu(lens),
                                cu_seqlens_kv=cu(lens), cu_seqlens_q_padded=cu_padded, cu_seqlens_kv_padded=cu_padded)
    assert_same(results)
    q, _, _, call_cu_q, _, max_q, _ = fake_on_cpu.calls[-1]["args"]
    assert q.shape == (2 * 4, h, d) and call_cu_q.tolist() == [0, 4, 7] and max_q == 4


def test_dpa_flash_padding_causal_needs_shared_lengths(fake_on_cpu, monkeypatch, gen):
    """padding_causal aligns top-left: flash-attn (bottom-right) takes it only when queries
    and keys share one padding; a pair of masks runs unfused (and gives the top-left mask)."""
    b, s, h, d = 2, 6, 2, 8
    inputs = [rand((b, s, h, d), gen) for _ in range(3)]
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding_causal")
    q_mask, kv_mask = padding_mask([3, 6], s), padding_mask([6, 4], s)
    dpa(*inputs, attention_mask=(q_mask, kv_mask))
    assert fake_on_cpu.calls == []
    dpa(*inputs, attention_mask=(q_mask, q_mask))
    dpa(*inputs, cu_seqlens_q=cu([3, 6]), cu_seqlens_kv=cu([3, 6]))  # equal CPU tensors: compared
    assert len(fake_on_cpu.calls) == 2


def test_dpa_flash_kv_cache(fake_on_cpu, monkeypatch, gen):
    from attention_reference import decode_with_cache

    b, length, prefill, h, hg, d = 2, 7, 3, 4, 2, 8
    q, k, v = (rand((length, b, n, d), gen).detach() for n in (h, hg, hg))
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format="sbhd", attn_mask_type="causal", layer_number=1)
    monkeypatch.setenv("NVTE_FLASH_ATTN", "0")
    full = dpa(q, k, v)
    monkeypatch.setenv("NVTE_FLASH_ATTN", "1")
    cache = te.InferenceParams(b, length, num_heads_kv=hg, head_dim_k=d, dtype=torch.float32)
    torch.testing.assert_close(decode_with_cache(dpa, q, k, v, cache, "sbhd", prefill), full, **TOL)
    assert len(fake_on_cpu.calls) == 1 + length - prefill
    assert all(c["fn"] == "flash_attn_varlen_func" and c["kwargs"]["causal"] is True for c in fake_on_cpu.calls)


def test_dpa_flash_checkpoint(fake_on_cpu, gen):
    b, s, h, d = 2, 7, 2, 8
    inputs = [rand((s, b, h, d), gen) for _ in range(3)]
    dpa = te.DotProductAttention(h, d, attn_mask_type="causal")
    grads = []
    for checkpointed in (False, True):
        for x in inputs:
            x.grad = None
        dpa(*inputs, checkpoint_core_attention=checkpointed).sum().backward()
        grads.append([x.grad for x in inputs])
    for a, b_ in zip(*grads):
        torch.testing.assert_close(a, b_, atol=0, rtol=0)
    assert len(fake_on_cpu.calls) == 3  # plain, checkpointed forward, and its recomputation


# ==== the arguments flash-attn receives ========================================================


@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_flash_attn_func_arguments(fake_on_cpu, gen, fmt):
    b, sq, skv, h, hg, d = 2, 5, 7, 4, 2, 8
    q, k, v = (rand(layout(fmt, b, s, n, d), gen) for s, n in ((sq, h), (skv, hg), (skv, hg)))
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type="causal_bottom_right",
                                 softmax_scale=0.3, attention_type="cross")
    dpa(q, k, v)
    call = fake_on_cpu.calls[-1]
    fq, fk, fv = call["args"]
    assert call["fn"] == "flash_attn_func"
    assert fq.shape == (b, sq, h, d) and fk.shape == fv.shape == (b, skv, hg, d)  # [b, s, h, d]
    assert torch.equal(fq, q.transpose(0, 1) if fmt == "sbhd" else q)
    kwargs = {key: value for key, value in call["kwargs"].items() if value is not fake_flash_attn._UNSET}
    assert kwargs == dict(dropout_p=0.0, softmax_scale=0.3, causal=True)  # no window: none passed


def test_flash_attn_varlen_arguments(fake_on_cpu, gen):
    b, sq, skv, h, d = 3, 5, 7, 2, 8
    q, k, v = (rand((b, s, h, d), gen) for s in (sq, skv, skv))
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="padding", window_size=(2, 3),
                                 attention_type="cross")
    dpa(q, k, v, attention_mask=(padding_mask([5, 2, 0], sq), padding_mask([7, 1, 3], skv)))
    q_, k_, v_, cu_q, cu_kv, max_q, max_kv = fake_on_cpu.calls[-1]["args"]
    kwargs = fake_on_cpu.calls[-1]["kwargs"]
    assert q_.shape == (b * sq, h, d) and k_.shape == v_.shape == (b * skv, h, d)
    assert cu_q.dtype == cu_kv.dtype == torch.int32
    assert cu_q.tolist() == [0, 5, 7, 7] and cu_kv.tolist() == [0, 7, 8, 11]
    assert (max_q, max_kv) == (sq, skv) and type(max_q) is int and type(max_kv) is int
    assert torch.equal(q_[5:7], q[1, :2]) and torch.equal(k_[8:11], k[2, :3])  # right-padded sequences, packed
    assert kwargs["window_size"] == (2, 3) and type(kwargs["window_size"]) is tuple
    assert kwargs["causal"] is False and kwargs["softmax_scale"] == dpa.softmax_scale


def test_flash_dropout_and_determinism(fake_on_cpu, monkeypatch, gen):
    """dropout_p in training only, run inside the RNG tracker's fork; deterministic=True
    when determinism is asked for."""
    depth = [0]

    class Tracker:
        @contextmanager
        def fork(self, name="model-parallel-rng"):
            depth[0] += 1
            yield
            depth[0] -= 1

    fake_on_cpu.probe = lambda: depth[0]
    b, s, h, d = 2, 5, 2, 8
    q, k, v = (rand((s, b, h, d), gen) for _ in range(3))
    dpa = te.DotProductAttention(h, d, attention_dropout=0.25, get_rng_state_tracker=Tracker)
    dpa(q, k, v)
    assert fake_on_cpu.calls[-1]["kwargs"]["dropout_p"] == 0.25 and fake_on_cpu.calls[-1]["probe"] == 1
    dpa.eval()
    dpa(q, k, v)
    assert fake_on_cpu.calls[-1]["kwargs"]["dropout_p"] == 0.0 and fake_on_cpu.calls[-1]["probe"] == 0
    assert fake_on_cpu.calls[-1]["kwargs"]["deterministic"] is fake_flash_attn._UNSET
    monkeypatch.setenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
    te.DotProductAttention(h, d)(q, k, v)
    assert fake_on_cpu.calls[-1]["kwargs"]["deterministic"] is True


def test_flash_old_release_gets_no_new_arguments(fake_on_cpu, monkeypatch, gen):
    """flash-attn 2.1.1 has no window_size / alibi_slopes / deterministic keywords (the fake
    of that release refuses them): a plain causal call must not pass them."""
    old = fake_flash_attn.make_module("2.1.1")
    monkeypatch.setitem(sys.modules, "flash_attn", old)
    set_version(monkeypatch, "2.1.1")
    b, s, h, d = 2, 5, 2, 8
    q, k, v = (rand((s, b, h, d), gen) for _ in range(3))
    te.DotProductAttention(h, d, attn_mask_type="causal")(q, k, v)
    te.DotProductAttention(h, d, attn_mask_type="padding_causal")(q, k, v, attention_mask=padding_mask([5, 3], s))
    assert [c["fn"] for c in old.calls] == ["flash_attn_func", "flash_attn_varlen_func"]


# ==== the real flash-attn on a GPU =============================================================


def _real_flash_attn():
    pytest.importorskip("flash_attn")
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash-attn 2 needs compute capability 8.0 or newer")


def _cuda_inputs(shapes, dtype, gen):
    return [torch.randn(s, generator=gen).to(device="cuda", dtype=dtype).requires_grad_() for s in shapes]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt,mask,sq,skv,hg,window,alibi", [
    ("bshd", "causal", 128, 128, 8, (-1, 0), False),
    ("sbhd", "no_mask", 100, 300, 2, (-1, -1), False),
    ("bshd", "causal_bottom_right", 77, 200, 1, (-1, 0), True),
    ("sbhd", "padding_causal", 129, 129, 4, (-1, 0), False),
    ("bshd", "padding_causal_bottom_right", 65, 190, 8, (32, 0), False),
    ("bshd", "no_mask", 256, 256, 8, (64, 16), True),
    ("thd", "padding_causal", 0, 0, 4, (-1, 0), True),
    ("thd", "padding", 0, 0, 2, (20, 20), False),
])
def test_real_flash_attn_matches_unfused(monkeypatch, clean, gen, dtype, fmt, mask, sq, skv, hg, window, alibi):
    _real_flash_attn()
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    b, h, d = 3, 8, 64
    kwargs = dict(window_size=window)
    if alibi:
        kwargs["core_attention_bias_type"] = "alibi"
    if fmt == "thd":
        lens = [100, 37, 1]
        cu_seqlens = cu(lens).cuda()
        shapes = [(sum(lens), n, d) for n in (h, hg, hg)]
        kwargs.update(cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, max_seqlen_q=128, max_seqlen_kv=128)
    else:
        shapes = [layout(fmt, b, s, n, d) for s, n in ((sq, h), (skv, hg), (skv, hg))]
        if "padding" in mask:
            q_lens, kv_lens = [sq, sq // 2, 1], [skv, skv - 7, 30]
            if mask == "padding_causal":
                kwargs["attention_mask"] = padding_mask(q_lens, sq).cuda()
            else:
                kwargs["attention_mask"] = (padding_mask(q_lens, sq).cuda(), padding_mask(kv_lens, skv).cuda())
    inputs = _cuda_inputs(shapes, dtype, gen)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask,
                                 attention_type="self" if sq == skv else "cross")
    ran = []
    forward = dpa.flash_attention.forward
    dpa.flash_attention.forward = lambda *a, **k: ran.append(1) or forward(*a, **k)
    grad = torch.randn(dpa(*inputs, **kwargs).shape, generator=gen).to(device="cuda", dtype=dtype)
    assert ran, "flash-attn was not chosen"

    def run(tensors, flash):
        monkeypatch.setenv("NVTE_FLASH_ATTN", "1" if flash else "0")
        out = dpa(*tensors, **kwargs)
        return [out] + list(torch.autograd.grad(out, tensors, grad.to(out.dtype)))

    reference = run([x.detach().float().requires_grad_() for x in inputs], False)
    flash, unfused = run(inputs, True), run(inputs, False)
    for f, u, r in zip(flash, unfused, reference):
        assert torch.isfinite(f).all()
        flash_err, unfused_err = (f.float() - r).abs().max(), (u.float() - r).abs().max()
        assert flash_err <= 3 * unfused_err + 1e-3, (flash_err, unfused_err)


@requires_cuda
def test_real_flash_attn_dropout_under_tracker(monkeypatch, clean, gen):
    _real_flash_attn()
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    b, s, h, d = 2, 128, 4, 64
    inputs = _cuda_inputs([(b, s, h, d)] * 3, torch.bfloat16, gen)

    def run(seed, checkpointed=False):
        tracker = te.CudaRNGStatesTracker()
        tracker.add("model-parallel-rng", seed)
        dpa = te.DotProductAttention(h, d, qkv_format="bshd", attention_dropout=0.3,
                                     get_rng_state_tracker=lambda: tracker)
        out = dpa(*inputs, checkpoint_core_attention=checkpointed)
        return [out] + list(torch.autograd.grad(out.float().sum(), inputs))

    before = torch.cuda.get_rng_state()
    first, again, other, recomputed = run(5), run(5), run(6), run(5, checkpointed=True)
    assert torch.equal(torch.cuda.get_rng_state(), before)  # flash-attn drew from the tracker's state
    for a, b_ in zip(first, again):
        torch.testing.assert_close(a, b_, atol=0, rtol=0)
    assert not torch.equal(first[0], other[0])
    torch.testing.assert_close(recomputed[0], first[0], atol=0, rtol=0)
    for a, b_ in zip(recomputed[1:], first[1:]):  # flash-attn's dq accumulation order may vary
        torch.testing.assert_close(a, b_, atol=1e-2, rtol=1e-2)


@requires_cuda
def test_real_flash_attn_thd_rows_past_the_end(monkeypatch, clean, gen):
    _real_flash_attn()
    h, d, lens, extra = 4, 64, [50, 13], 30
    total = sum(lens)
    inputs = _cuda_inputs([(total + extra, h, d)] * 3, torch.bfloat16, gen)
    dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    cu_seqlens = cu(lens).cuda()
    out = dpa(*inputs, cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens)
    grads = torch.autograd.grad(out.float().sum(), inputs)
    assert torch.all(out[total:] == 0) and all(torch.all(g[total:] == 0) for g in grads)
