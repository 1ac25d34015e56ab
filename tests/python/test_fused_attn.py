"""The cuDNN fused attention backend: the core op through sdpa_fwd / sdpa_bwd and
Transformer Engine's fused_attn_fwd / fused_attn_bwd, DotProductAttention running it
(against its unfused backend), the backend choice and its reasons, and the errors.

CPU (any build): the backend selection logic (environment variables, every reason, the
NVTE_DEBUG log) with cuDNN's availability stubbed, and the errors of the binding and the
torch helpers on CPU tensors. GPU (a CUDA build with cuDNN support and a loadable
libcudnn; skipped otherwise, with the reason): every mask type, sliding windows, GQA /
MQA, sbhd / bshd, biases, dropout, the softmax statistics and the gradients. Head dims
other than 64 / 128 and sliding windows depend on the cuDNN version: where cuDNN refuses
one, its test is skipped with cuDNN's reason (DotProductAttention runs those unfused).

Tolerances (FlashAttention's rule, DESIGN.md): the error of a bf16 / fp16 result against
a float64 reference computed from the same rounded inputs is at most 3x the error of the
same computation done by torch in the inputs' precision, plus 1e-3 (far below what one
wrong mask entry changes: a probability of ~1/skv times |v| ~ 1, i.e. >= 5e-3 here). The
softmax statistics are fp32 logsumexps of products of the same inputs: 2e-3 absolute.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from attention_params import attention_params as params
from attention_reference import decode_with_cache, reference_mask
from conftest import requires_cudnn

import transformer_engine.pytorch as te
from transformer_engine import _core
from transformer_engine.pytorch.attention.dot_product_attention import backends
from transformer_engine.pytorch.attention.dot_product_attention import dot_product_attention as dpa_module
from transformer_engine.pytorch.attention.dot_product_attention.backends import get_attention_backend
from transformer_engine.pytorch.attention.dot_product_attention.fused import FusedAttention
from transformer_engine.pytorch.cpp_extensions import fused_attn as ext

FUSED, FLASH, UNFUSED = "FusedAttention", "FlashAttention", "UnfusedDotProductAttention"
MASKS = ["no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"]


@pytest.fixture(autouse=True)
def no_flash_attn(monkeypatch):
    """These tests are about cuDNN and its fallback to the unfused backend: flash-attn, where
    installed, stays out of the choice (test_flash_attn.py tests that backend)."""
    monkeypatch.setattr(backends, "_flash_attn_version", lambda: None)
    backends._select.cache_clear()
    yield
    backends._select.cache_clear()


# ==== backend choice (CPU) ======================================================================


@pytest.fixture
def cudnn_available(monkeypatch):
    """cuDNN reported loadable, whatever this machine has; a fresh selection cache."""
    monkeypatch.setattr(backends, "_cudnn_unavailable_reason", lambda: None)
    for name in ("NVTE_FUSED_ATTN", "NVTE_FUSED_ATTN_BACKEND", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
        monkeypatch.delenv(name, raising=False)
    backends._select.cache_clear()
    yield
    backends._select.cache_clear()


def fused_reasons(choice) -> str:
    return "; ".join(choice.reasons.get(FUSED, []))


@pytest.mark.parametrize("overrides", [
    {},
    dict(qkv_dtype=torch.float16),
    dict(num_gqa_groups=4),
    dict(num_gqa_groups=1, head_dim_qk=128, head_dim_v=128),
    dict(head_dim_qk=256, head_dim_v=256),
    dict(attn_mask_type="no_mask", window_size=(-1, -1), max_seqlen_q=1, max_seqlen_kv=4096),
    dict(attn_mask_type="causal", max_seqlen_q=256),  # top-left causal takes sq > skv
    dict(attn_mask_type="causal_bottom_right", attention_dropout=0.1),  # sq == skv: aligned top-left
    dict(attn_mask_type="causal_bottom_right", max_seqlen_q=64, attention_dropout=0.1, is_training=False),
    dict(attn_mask_type="padding_causal", attention_dropout=0.1),
    dict(attn_mask_type="padding_causal_bottom_right", max_seqlen_q=1, max_seqlen_kv=300),
    dict(attn_mask_type="no_mask", window_size=(16, 16)),
    dict(core_attention_bias_type="post_scale_bias", core_attention_bias_shape=(1, 16, 128, 128),
         core_attention_bias_requires_grad=True),
    dict(core_attention_bias_type="post_scale_bias", core_attention_bias_shape=(2, 1, 128, 128)),
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_fused_chosen(cudnn_available, overrides):
    choice = get_attention_backend(params(**overrides))
    assert choice.name == FUSED, choice.reasons
    assert set(choice.reasons) == {FLASH, UNFUSED}
    assert choice.fused_attention_backend == 1  # F16_arbitrary_seqlen, with NVTE_FUSED_ATTN_BACKEND unset


@pytest.mark.parametrize("overrides,reason", [
    (dict(qkv_dtype=torch.float32), "float32 inputs"),
    (dict(qkv_dtype=torch.float64), "float64 inputs"),
    (dict(head_dim_qk=260, head_dim_v=260), "head dim 260 > 256"),
    (dict(head_dim_v=264), "head dim of v 264 > 256"),
    (dict(head_dim_qk=12, head_dim_v=12), "head dim 12 is not a multiple of 8"),
    (dict(device_type="cpu", compute_capability=(0, 0)), "needs CUDA tensors, got cpu"),
    (dict(compute_capability=(7, 5)), "compute capability 8.0"),
    (dict(batch_size=0), "empty"),
    (dict(attn_mask_type="arbitrary", window_size=(-1, -1)), "arbitrary masks"),
    (dict(core_attention_bias_type="pre_scale_bias", core_attention_bias_shape=(1, 16, 128, 128)),
     "pre_scale_bias"),
    (dict(core_attention_bias_type="alibi"), "alibi"),
    (dict(core_attention_bias_type="post_scale_bias", core_attention_bias_shape=(1, 16, 1, 128)),
     "bias of shape [1 or b, 1 or h, sq, skv]"),
    (dict(core_attention_bias_type="post_scale_bias", core_attention_bias_shape=(2, 16, 128, 128),
          core_attention_bias_requires_grad=True), "bias gradient for a bias of shape [1, h, sq, skv]"),
    (dict(attn_mask_type="causal_bottom_right", max_seqlen_q=64, attention_dropout=0.1), "bottom-right"),
    (dict(attn_mask_type="padding_causal_bottom_right", core_attention_bias_type="post_scale_bias",
          core_attention_bias_shape=(1, 16, 128, 128)), "without a bias or dropout"),
    (dict(attn_mask_type="no_mask", window_size=(8, 8), max_seqlen_q=64, attention_dropout=0.1), "bottom-right"),
    (dict(attn_mask_type="causal_bottom_right", max_seqlen_q=256), "need sq <= skv"),
    (dict(attn_mask_type="causal", window_size=(16, 0), max_seqlen_q=256), "need sq <= skv"),
    (dict(softmax_type="off-by-one"), "softmax_type=off-by-one"),
    (dict(return_max_logit=True), "max_logit"),
    (dict(fp8_dpa=True), "FP8 attention"),
    (dict(context_parallel=True), "context parallelism"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_fused_refused_with_reason(cudnn_available, overrides, reason):
    choice = get_attention_backend(params(**overrides))
    assert choice.fused_attention_backend is None
    assert choice.name != FUSED  # unfused, or none for what it cannot do either (FP8, context parallelism)
    assert reason in fused_reasons(choice), fused_reasons(choice)


def test_environment(cudnn_available, monkeypatch):
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    choice = get_attention_backend(params())
    assert choice.name == UNFUSED and "disabled by NVTE_FUSED_ATTN=0" in fused_reasons(choice)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "1")
    monkeypatch.setenv("NVTE_FUSED_ATTN_BACKEND", "1")
    choice = get_attention_backend(params())
    assert choice.name == FUSED and choice.fused_attention_backend == 1
    for other in ("0", "2"):
        monkeypatch.setenv("NVTE_FUSED_ATTN_BACKEND", other)
        choice = get_attention_backend(params())
        assert choice.name == UNFUSED
        assert f"NVTE_FUSED_ATTN_BACKEND={other} asks for a sub-backend" in fused_reasons(choice)
    monkeypatch.delenv("NVTE_FUSED_ATTN_BACKEND")
    monkeypatch.setenv("NVTE_UNFUSED_ATTN", "0")
    assert get_attention_backend(params()).name == FUSED
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    assert get_attention_backend(params()).name is None


def test_ampere_prefers_flash_but_takes_fused(cudnn_available):
    choice = get_attention_backend(params(compute_capability=(8, 0)))
    assert choice.name == FUSED  # flash-attn first before Hopper, but not installed (no_flash_attn)
    assert "flash-attn is not installed" in choice.reasons[FLASH]


def test_cudnn_not_found_reason(cudnn_available, monkeypatch):
    monkeypatch.setattr(backends, "_cudnn_unavailable_reason",
                        lambda: "cuDNN not found (libcudnn.so.9: cannot open shared object file)")
    choice = get_attention_backend(params())
    assert choice.name == UNFUSED and "cuDNN not found" in fused_reasons(choice)
    # not asked for CPU calls: those have their own reason
    assert "cuDNN" not in fused_reasons(get_attention_backend(params(device_type="cpu")))


def test_this_machine_cudnn_reason():
    """Without stubs: the reason this machine gives (none where cuDNN fused attention runs)."""
    backends._select.cache_clear()
    reason = ext.cudnn_unavailable_reason()
    choice = get_attention_backend(params())
    if reason is None:
        assert choice.name == FUSED, choice.reasons
    else:
        assert choice.name == UNFUSED and reason in fused_reasons(choice)
        if _core.cudnn_frontend_version() == 0:
            assert "without" in reason  # built without CUDA or without cuDNN support
    backends._select.cache_clear()


def test_debug_log_names_the_reasons(cudnn_available, monkeypatch, caplog):
    monkeypatch.setenv("NVTE_DEBUG", "1")
    monkeypatch.setenv("NVTE_DEBUG_LEVEL", "1")
    with caplog.at_level(logging.INFO, logger="DotProductAttention"):
        get_attention_backend(params(head_dim_qk=260, head_dim_v=260))
        get_attention_backend(params(qkv_dtype=torch.float32))
    assert "Disabling FusedAttention: head dim 260 > 256" in caplog.text
    assert "float32 inputs" in caplog.text
    assert "Running with UnfusedDotProductAttention backend" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="DotProductAttention"):
        get_attention_backend(params())
    assert "Running with FusedAttention backend" in caplog.text


# ==== errors (CPU) ==============================================================================


def _cpu_desc(shape, dtype=_core.DType.kBFloat16, data=0):
    return _core.Tensor(int(_core.DeviceType.CPU), 0, int(dtype), list(shape), data)


def _bshd_strides(s, h, d):
    return [s * h * d, d, h * d, 1]


def _core_fwd_args(q_dtype=_core.DType.kBFloat16, d=64, strides=None, mask=2):
    """A workspace query's arguments: bshd, b=2, h=4, hg=2, sq=8, skv=16 (data pointers 0)."""
    q, o = _cpu_desc([2, 4, 8, d], q_dtype), _cpu_desc([2, 4, 8, d])
    k, v = _cpu_desc([2, 2, 16, d]), _cpu_desc([2, 2, 16, d])
    if strides is None:
        strides = _bshd_strides(8, 4, d) + _bshd_strides(16, 2, d) * 2 + _bshd_strides(8, 4, d)
    return (mask, 0, -1, 0, 0.125, 0.0, False, q, k, v, None, None, None, None, o, None, strides)


def test_binding_refuses_cpu_tensors_after_validation():
    with pytest.raises(NotImplementedError, match="te_fused_attn_fwd_workspace_size: runs on CUDA tensors only"):
        _core.fused_attn_fwd_workspace_size(*_core_fwd_args())


def test_binding_errors():
    with pytest.raises(ValueError, match="q dtype must be float16 or bfloat16, got float32"):
        _core.fused_attn_fwd_workspace_size(*_core_fwd_args(q_dtype=_core.DType.kFloat32))
    with pytest.raises(ValueError, match="strides must hold 16 ints"):
        _core.fused_attn_fwd_workspace_size(*_core_fwd_args(strides=[1] * 15))
    bad = _bshd_strides(8, 4, 64) + _bshd_strides(16, 2, 64) * 2 + _bshd_strides(8, 4, 64)
    bad[3] = 2
    with pytest.raises(ValueError, match="strides.q of the head dim d must be 1"):
        _core.fused_attn_fwd_workspace_size(*_core_fwd_args(strides=bad))
    with pytest.raises(ValueError, match="mask_type must be a te_attn_mask_type"):
        _core.fused_attn_fwd_workspace_size(*_core_fwd_args(mask=9))
    with pytest.raises(ValueError, match="seqlens_q must not be null"):
        _core.fused_attn_fwd_workspace_size(*_core_fwd_args(mask=int(_core.AttnMaskType.PADDING)))
    args = list(_core_fwd_args())
    args[1] = int(_core.AttnBiasType.ALIBI)
    with pytest.raises(NotImplementedError, match="ALIBI is not implemented"):
        _core.fused_attn_fwd_workspace_size(*args)


def test_cudnn_version_without_cudnn_support():
    if _core.cudnn_frontend_version() != 0:
        pytest.skip("this build has cuDNN fused attention")
    with pytest.raises(NotImplementedError, match="no cuDNN fused attention"):
        _core.cudnn_version()
    assert "without" in ext.cudnn_unavailable_reason()


def test_helpers_refuse_cpu_and_bad_input():
    q = torch.zeros(2, 8, 4, 64, dtype=torch.bfloat16)
    k = v = torch.zeros(2, 16, 2, 64, dtype=torch.bfloat16)
    config = ext.FusedAttnConfig(mask_type="causal", window=(-1, 0), softmax_scale=0.125)
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        ext.sdpa_fwd(q, k, v, config)
    with pytest.raises(TypeError, match="k must be float16 or bfloat16"):
        ext.sdpa_fwd(q, k.float(), v, config)
    with pytest.raises(ValueError, match="q_format must be 'sbhd' or 'bshd'"):
        ext.sdpa_fwd(q, k, v, config, q_format="thd")
    with pytest.raises(ValueError, match="v must be 4-D"):
        ext.sdpa_fwd(q, k, v[0], config)
    with pytest.raises(ValueError, match="unknown mask or bias type"):
        ext.FusedAttnConfig(mask_type="arbitrary").core_args()
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        ext.fused_attn_fwd(True, 8, 16, None, None, q, k, v, qkv_layout="bshd_bshd_bshd", attn_mask_type="causal")
    with pytest.raises(NotImplementedError, match="page_table_k"):
        ext.fused_attn_fwd(True, 8, 16, None, None, q, k, v, page_table_k=torch.zeros(1))
    with pytest.raises(NotImplementedError, match="softmax_type"):
        ext.fused_attn_fwd(True, 8, 16, None, None, q, k, v, softmax_type="learnable")
    with pytest.raises(ValueError, match="aux_ctx_tensors"):
        ext.fused_attn_bwd(8, 16, None, None, q, k, v, q, q, aux_ctx_tensors=[])


@pytest.mark.parametrize("case", ["bshd", "sbhd_kv_bshd", "gqa_padding", "dropout_bias_grad", "strided_views"])
def test_helpers_build_arguments_the_core_accepts(monkeypatch, case):
    """The torch helpers' descriptors, strides and optional inputs pass every check of the
    core (forward, backward, and the backward's support query with placeholders): on CPU
    tensors the core's only objection is then the device."""
    monkeypatch.setattr(ext, "_check_inputs", lambda *args: None)  # let CPU tensors through to the core
    b, h, hg, sq, skv, d = 2, 4, 4, 8, 16, 64
    fmt_q = "sbhd" if case == "sbhd_kv_bshd" else "bshd"
    if case == "gqa_padding":
        hg = 2
    q = torch.zeros(shape_of(fmt_q, b, sq, h, d), dtype=torch.bfloat16)
    k, v = (torch.zeros(shape_of("bshd", b, skv, hg, d), dtype=torch.bfloat16) for _ in range(2))
    if case == "strided_views":
        qkv = torch.zeros(b, sq, h, 3, d, dtype=torch.bfloat16)
        q = qkv[:, :, :, 0]
        k, v = qkv[:, :, :, 1], qkv[:, :, :, 2]
        skv = sq
    kwargs = dict(q_format=fmt_q, kv_format="bshd")
    mask, bias, bias_grad = "causal", None, False
    if case == "gqa_padding":
        mask = "padding_causal"
        kwargs.update(seqlens_q=torch.tensor([8, 3], dtype=torch.int32), seqlens_kv=torch.tensor([16, 5],
                                                                                              dtype=torch.int32))
    if case == "dropout_bias_grad":
        kwargs["rng_state"] = torch.zeros(2, dtype=torch.int64)
        bias, bias_grad = torch.zeros(1, h, sq, skv, dtype=torch.bfloat16), True
    config = ext.FusedAttnConfig(mask_type=mask, window=(-1, 0), bias_type="post_scale_bias" if bias is not None
                                 else "no_bias", softmax_scale=0.125, dropout=0.1 if "rng_state" in kwargs else 0.0)
    cpu_only = "runs on CUDA tensors only"
    with pytest.raises(NotImplementedError, match=f"te_fused_attn_fwd_workspace_size: {cpu_only}"):
        ext.check_sdpa_support(q, k, v, config, bias=bias, backward=False, **kwargs)
    with pytest.raises(NotImplementedError, match=f"te_fused_attn_fwd_workspace_size: {cpu_only}"):
        ext.sdpa_fwd(q, k, v, config, bias=bias, with_stats=True, **kwargs)
    q_, k_, v_ = (ext._addressable(x) for x in (q, k, v))
    b_, h_, sq_, _ = ext._bhsd(q_, fmt_q).shape
    o_desc = ext._placeholder((b_, h_, sq_, d), torch.bfloat16, q.device, "o")
    args, descs, strides = ext._fwd_args(config, q_, k_, v_, fmt_q, "bshd", bias, kwargs.get("seqlens_q"),
                                         kwargs.get("seqlens_kv"), kwargs.get("rng_state"), o_desc,
                                         ext._contiguous_bhsd_strides(fmt_q, b_, sq_, h_, d), None)
    with pytest.raises(NotImplementedError, match=f"te_fused_attn_bwd_workspace_size: {cpu_only}"):
        ext._check_backward(config, q_, k_, v_, fmt_q, "bshd", descs, strides, bias, bias_grad,
                            kwargs.get("seqlens_q"), kwargs.get("seqlens_kv"), kwargs.get("rng_state"))
    o = torch.zeros(shape_of(fmt_q, b_, sq_, h_, d), dtype=torch.bfloat16)
    stats = torch.zeros(b_, h_, sq_, 1)
    with pytest.raises(NotImplementedError, match=f"te_fused_attn_bwd_workspace_size: {cpu_only}"):
        ext.sdpa_bwd(torch.zeros_like(o), q, k, v, o, stats, config, bias=bias, bias_grad=bias_grad, **kwargs)


@pytest.mark.parametrize("case", ["causal_sbhd", "padding_gqa", "thd", "bias_grad", "window"])
def test_dpa_reaches_the_core_and_falls_back(monkeypatch, case):
    """DotProductAttention's fused path end to end on the CPU: chosen (filters stubbed), its
    arguments accepted by the core but for the device, refused, warned once, run unfused."""
    monkeypatch.setattr(backends, "_fused_reasons", lambda p: [])
    monkeypatch.setattr(ext, "_check_inputs", lambda *args: None)
    monkeypatch.setattr(dpa_module, "_FALLBACK_WARNED", set())
    backends._select.cache_clear()
    g = torch.Generator().manual_seed(5)
    h, hg, d, s, b = 4, 4, 64, 8, 2
    fmt, mask, kwargs = "sbhd", "causal", {}
    if case == "padding_gqa":
        hg, fmt, mask = 2, "bshd", "padding_causal"
        kwargs["attention_mask"] = torch.tensor([[False] * 8, [False] * 5 + [True] * 3]).view(b, 1, 1, s)
    shapes = [shape_of(fmt, b, s, n, d) for n in (h, hg, hg)]
    if case == "thd":
        fmt, mask = "thd", "padding_causal"
        shapes = [(11, h, d)] * 3
        cu = torch.tensor([0, 8, 11], dtype=torch.int32)
        kwargs.update(cu_seqlens_q=cu, cu_seqlens_kv=cu)
    if case == "bias_grad":
        kwargs.update(core_attention_bias_type="post_scale_bias",
                      core_attention_bias=torch.randn(1, h, s, s, generator=g).requires_grad_())
    if case == "window":
        mask, kwargs["window_size"] = "no_mask", (2, 2)
    q, k, v = (torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_() for shape in shapes)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask)
    with pytest.warns(UserWarning, match="cuDNN cannot run this call.*runs on CUDA tensors only"):
        out = dpa(q, k, v, **kwargs)
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all() and q.grad is not None
    backends._select.cache_clear()


@pytest.mark.parametrize("layout,formats", [("sbhd_sbhd_sbhd", ("sbhd", "sbhd")), ("bshd_bshd_bshd", ("bshd", "bshd")),
                                            ("sbh3d", ("sbhd", "sbhd")), ("bs3hd", ("bshd", "bshd")),
                                            ("sbhd_sb2hd", ("sbhd", "sbhd")), ("bshd_bsh2d", ("bshd", "bshd"))])
def test_layout_formats(layout, formats):
    assert ext._layout_formats(layout) == formats


def test_layout_formats_errors():
    with pytest.raises(NotImplementedError, match="thd layouts"):
        ext._layout_formats("thd_thd_thd")
    with pytest.raises(ValueError, match="unknown qkv_layout"):
        ext._layout_formats("hbsd")


# ==== the op on the GPU =========================================================================


def rand(shape, gen, dtype=torch.bfloat16, scale=1.0, requires_grad=False):
    t = (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).cuda()
    return t.requires_grad_(requires_grad)


def shape_of(fmt, b, s, h, d):
    return (s, b, h, d) if fmt == "sbhd" else (b, s, h, d)


def bhsd(x, fmt):
    return x.permute(1, 2, 0, 3) if fmt == "sbhd" else x.permute(0, 2, 1, 3)


def attention(q, k, v, scale, mask=None, bias=None, keep=None, p=0.0):
    """Plain attention on [b, h, s, d] tensors in their dtype (float64 for the reference, the
    inputs' precision for torch's own error); mask True = masked; fully masked rows give 0;
    keep: the dropout mask (scaled by 1/(1-p))."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    full = torch.isinf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(full, 0.0), dim=-1).masked_fill(full, 0.0)
    if keep is not None:
        probs = probs * keep.to(probs.dtype) / (1.0 - p)
    return probs @ v


def within_rule(ours, ref64, same, what):
    ours_err = (ours.double() - ref64).abs().max().item()
    same_err = (same.double() - ref64).abs().max().item()
    assert ours_err <= 3 * same_err + 1e-3, f"{what}: error {ours_err:.3g} vs torch's {same_err:.3g}"


def check_against_references(q, k, v, out, grads, d_o, fmt_q, fmt_kv, scale, mask=None, bias=None, keep=None,
                             p=0.0, bias_grad=False):
    """out and grads (dq, dk, dv[, dbias]) of our op against float64 and same-precision torch."""
    leaves = [bhsd(x.detach(), f) for x, f in ((q, fmt_q), (k, fmt_kv), (v, fmt_kv))]
    ref_leaves = [x.double().requires_grad_() for x in leaves]
    same_leaves = [x.clone().requires_grad_() for x in leaves]
    ref_bias = same_bias = None
    if bias is not None:
        ref_bias = bias.detach().double().requires_grad_(bias_grad)
        same_bias = bias.detach().clone().requires_grad_(bias_grad)
    ref = attention(*ref_leaves, scale, mask, ref_bias, keep, p)
    same = attention(*same_leaves, scale, mask, same_bias, keep, p)
    within_rule(bhsd(out, fmt_q), ref.detach(), same.detach(), "output")
    if grads is None:
        return
    g = bhsd(d_o, fmt_q)
    ref.backward(g.double())
    same.backward(g)
    names = ["dq", "dk", "dv"] + (["dbias"] if bias_grad else [])
    refs = ref_leaves + ([ref_bias] if bias_grad else [])
    sames = same_leaves + ([same_bias] if bias_grad else [])
    fmts = [fmt_q, fmt_kv, fmt_kv, None]
    for name, ours, r, s, f in zip(names, grads, refs, sames, fmts):
        ours_bhsd = ours if f is None else bhsd(ours, f)
        within_rule(ours_bhsd, r.grad, s.grad, name)


def padded_lengths(sq, skv):
    """True lengths of 2 right-padded sequences, kv at least q (no fully masked rows)."""
    return [sq - 7, sq // 3], [skv, skv // 2 + 5]


def to_gpu_lengths(lengths):
    return torch.tensor(lengths, dtype=torch.int32, device="cuda")


def skip_if_cudnn_refuses(q, k, v, config, fmt="bshd", lengths=None):
    """For the configurations whose support depends on the cuDNN version (large or unequal
    head dims, windows): skip with cuDNN's reason where it refuses them - DotProductAttention
    falls back to the unfused backend for those."""
    seqlens = [to_gpu_lengths(x) for x in lengths] if lengths else [None, None]
    try:
        ext.check_sdpa_support(q, k, v, config, q_format=fmt, kv_format=fmt, seqlens_q=seqlens[0],
                               seqlens_kv=seqlens[1], backward=True)
    except NotImplementedError as error:
        pytest.skip(f"this cuDNN refuses the configuration: {error}")


def run_op(q, k, v, config, fmt_q, fmt_kv, gen, bias=None, bias_grad=False, lengths=None, rng_state=None):
    """Our forward (with stats) and backward for a random output gradient."""
    seqlens = [to_gpu_lengths(x) for x in lengths] if lengths else [None, None]
    out, stats = ext.sdpa_fwd(q, k, v, config, q_format=fmt_q, kv_format=fmt_kv, bias=bias, seqlens_q=seqlens[0],
                              seqlens_kv=seqlens[1], rng_state=rng_state, with_stats=True)
    d_o = rand(out.shape, gen, out.dtype)
    dq, dk, dv, dbias = ext.sdpa_bwd(d_o, q, k, v, out, stats, config, q_format=fmt_q, kv_format=fmt_kv, bias=bias,
                                     bias_grad=bias_grad, seqlens_q=seqlens[0], seqlens_kv=seqlens[1],
                                     rng_state=rng_state)
    grads = [dq, dk, dv] + ([dbias] if bias_grad else [])
    return out, stats, d_o, grads


@requires_cudnn
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type", MASKS)
@pytest.mark.parametrize("sq,skv", [(128, 128), (96, 160), (67, 131)])
def test_op_mask_types(mask_type, fmt, dtype, sq, skv, gen):
    b, h, d = 2, 4, 64
    q, k, v = (rand(shape_of(fmt, b, s, h, d), gen, dtype) for s in (sq, skv, skv))
    config = ext.FusedAttnConfig(mask_type=mask_type, window=(-1, 0) if "causal" in mask_type else (-1, -1),
                                 softmax_scale=d**-0.5)
    lengths = padded_lengths(sq, skv) if "padding" in mask_type else None
    out, stats, d_o, grads = run_op(q, k, v, config, fmt, fmt, gen, lengths=lengths)
    mask = (reference_mask(mask_type, None, sq, skv, *lengths) if lengths
            else reference_mask(mask_type, None, sq, skv) if mask_type != "no_mask" else None)
    mask = None if mask is None else mask.cuda()
    check_against_references(q, k, v, out, grads, d_o, fmt, fmt, d**-0.5, mask)
    if lengths:  # padded rows: zeros in the output and the gradients
        for n, (lq, lkv) in enumerate(zip(*lengths)):
            assert torch.all(bhsd(out, fmt)[n, :, lq:] == 0)
            assert torch.all(bhsd(grads[0], fmt)[n, :, lq:] == 0)
            assert torch.all(bhsd(grads[1], fmt)[n, :, lkv:] == 0) and torch.all(bhsd(grads[2], fmt)[n, :, lkv:] == 0)
    # the statistics: logsumexp of each row's masked, scaled logits (natural log), where a row has keys
    scores = (bhsd(q, fmt).double() @ bhsd(k, fmt).double().transpose(-1, -2)) * d**-0.5
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    rows = torch.isfinite(lse)
    if lengths:
        for n, lq in enumerate(lengths[0]):
            rows[n, :, lq:] = False
    torch.testing.assert_close(stats.double()[rows], lse[rows], atol=2e-3, rtol=0)


@requires_cudnn
@pytest.mark.parametrize("hg", [1, 2, 8])
@pytest.mark.parametrize("fmt_q,fmt_kv", [("bshd", "bshd"), ("sbhd", "sbhd"), ("sbhd", "bshd")])
def test_op_gqa_and_mixed_formats(hg, fmt_q, fmt_kv, gen):
    b, h, sq, skv, d = 2, 8, 100, 140, 128
    q = rand(shape_of(fmt_q, b, sq, h, d), gen)
    k, v = (rand(shape_of(fmt_kv, b, skv, hg, d), gen) for _ in range(2))
    config = ext.FusedAttnConfig(mask_type="causal", window=(-1, 0), softmax_scale=0.1)
    out, _, d_o, grads = run_op(q, k, v, config, fmt_q, fmt_kv, gen)
    assert grads[1].shape == k.shape and grads[2].shape == v.shape
    check_against_references(q, k, v, out, grads, d_o, fmt_q, fmt_kv, 0.1, reference_mask("causal", None, sq, skv).cuda())


@requires_cudnn
@pytest.mark.parametrize("dqk,dv", [(32, 32), (72, 72), (192, 128), (256, 256)])
def test_op_head_dims(dqk, dv, gen):
    b, h, s = 2, 2, 80
    q, k = rand((b, s, h, dqk), gen), rand((b, s, h, dqk), gen)
    v = rand((b, s, h, dv), gen)
    config = ext.FusedAttnConfig(mask_type="no_mask", softmax_scale=dqk**-0.5)
    skip_if_cudnn_refuses(q, k, v, config)
    out, _, d_o, grads = run_op(q, k, v, config, "bshd", "bshd", gen)
    assert out.shape == (b, s, h, dv)
    check_against_references(q, k, v, out, grads, d_o, "bshd", "bshd", dqk**-0.5)


@requires_cudnn
@pytest.mark.parametrize("mask_type,window", [("no_mask", (16, 16)), ("no_mask", (0, 0)), ("no_mask", (-1, 8)),
                                              ("no_mask", (12, -1)), ("causal", (16, 0)), ("padding", (8, 8)),
                                              ("padding_causal", (16, 0)), ("causal_bottom_right", (16, 0)),
                                              ("padding_causal_bottom_right", (10, 0))])
@pytest.mark.parametrize("sq,skv", [(128, 128), (96, 160)])
def test_op_sliding_windows(mask_type, window, sq, skv, gen):
    b, h, d = 2, 4, 64
    q, k, v = rand((b, sq, h, d), gen), rand((b, skv, h, d), gen), rand((b, skv, h, d), gen)
    config = ext.FusedAttnConfig(mask_type=mask_type, window=window, softmax_scale=d**-0.5)
    lengths = padded_lengths(sq, skv) if "padding" in mask_type else None
    skip_if_cudnn_refuses(q, k, v, config, lengths=lengths)
    out, _, d_o, grads = run_op(q, k, v, config, "bshd", "bshd", gen, lengths=lengths)
    mask = reference_mask(mask_type, window, sq, skv, *(lengths or (None, None)), batch=b).cuda()
    check_against_references(q, k, v, out, grads, d_o, "bshd", "bshd", d**-0.5, mask)


@requires_cudnn
@pytest.mark.parametrize("bias_shape", ["1hss", "b1ss", "bhss", "11ss"])
@pytest.mark.parametrize("mask_type", ["no_mask", "causal", "padding"])
def test_op_post_scale_bias(bias_shape, mask_type, gen):
    b, h, sq, skv, d = 2, 4, 96, 128, 64
    q, k, v = rand((b, sq, h, d), gen), rand((b, skv, h, d), gen), rand((b, skv, h, d), gen)
    shape = [b if bias_shape[0] == "b" else 1, h if bias_shape[1] == "h" else 1, sq, skv]
    bias = rand(shape, gen, scale=2.0)
    config = ext.FusedAttnConfig(mask_type=mask_type, window=(-1, 0) if mask_type == "causal" else (-1, -1),
                                 bias_type="post_scale_bias", softmax_scale=d**-0.5)
    lengths = padded_lengths(sq, skv) if mask_type == "padding" else None
    bias_grad = bias_shape == "1hss"  # the only shape cuDNN reduces dbias to
    out, _, d_o, grads = run_op(q, k, v, config, "bshd", "bshd", gen, bias=bias, bias_grad=bias_grad,
                                lengths=lengths)
    mask = None
    if mask_type != "no_mask":
        mask = reference_mask(mask_type, None, sq, skv, *(lengths or (None, None)), batch=b).cuda()
    check_against_references(q, k, v, out, grads, d_o, "bshd", "bshd", d**-0.5, mask, bias=bias,
                             bias_grad=bias_grad)


def _identity_values(b, skv, h, d):
    """v[n, c, head, :] = e_c (skv == d): each output row is then its row of dropped-out
    probabilities, P[r, c] * keep[r, c] / (1 - p), which shows the dropout mask."""
    eye = torch.eye(skv, d, dtype=torch.bfloat16, device="cuda")
    return eye.view(1, skv, 1, d).expand(b, skv, h, d).contiguous()


@requires_cudnn
def test_op_dropout_statistics_and_gradients(gen):
    b, h, sq, skv, d, p = 2, 4, 128, 64, 64, 0.2
    q, k = rand((b, sq, h, d), gen, scale=0.5), rand((b, skv, h, d), gen, scale=0.5)
    v = _identity_values(b, skv, h, d)
    config = ext.FusedAttnConfig(mask_type="no_mask", softmax_scale=d**-0.5, dropout=p)
    torch.manual_seed(1234)
    rng_state = ext.philox_rng_state(q.device)
    out, _, d_o, grads = run_op(q, k, v, config, "bshd", "bshd", gen, rng_state=rng_state)
    probs = bhsd(out, "bshd").float()  # [b, h, sq, skv]
    keep = probs != 0
    # 65536 Bernoulli(0.8) draws: the dropped fraction is within 0.01 of p (> 6 standard deviations)
    dropped = 1.0 - keep.float().mean().item()
    assert abs(dropped - p) < 0.01, dropped
    # kept entries are the probabilities scaled by 1/(1-p) (two bf16 roundings: < 1%; 2% allowed)
    ref_probs = torch.softmax((bhsd(q, "bshd").double() @ bhsd(k, "bshd").double().transpose(-1, -2)) * d**-0.5, -1)
    torch.testing.assert_close(probs[keep].double(), (ref_probs / (1 - p))[keep], rtol=2e-2, atol=0)
    # the backward drops the same entries
    check_against_references(q, k, v, out, grads, d_o, "bshd", "bshd", d**-0.5, keep=keep, p=p)


@requires_cudnn
def test_op_dropout_reproducible(gen):
    b, h, s, d = 2, 4, 128, 64
    q, k, v = (rand((b, s, h, d), gen) for _ in range(3))
    config = ext.FusedAttnConfig(mask_type="causal", window=(-1, 0), softmax_scale=d**-0.5, dropout=0.3)

    def forward(seed):
        torch.manual_seed(seed)
        rng_state = ext.philox_rng_state(q.device)
        return ext.sdpa_fwd(q, k, v, config, rng_state=rng_state)[0]

    first, again, other = forward(5), forward(5), forward(6)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    no_dropout = ext.sdpa_fwd(q, k, v, ext.FusedAttnConfig(mask_type="causal", window=(-1, 0),
                                                           softmax_scale=d**-0.5))[0]
    assert not torch.equal(first, no_dropout)


@requires_cudnn
def test_op_reads_strided_views_in_place(gen):
    b, s, h, d = 2, 96, 4, 64
    qkv = rand((b, s, h, 3, d), gen)  # a fused QKV projection's output
    q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
    assert ext._addressable(q) is q  # read in place
    config = ext.FusedAttnConfig(mask_type="causal", window=(-1, 0), softmax_scale=d**-0.5)
    out_view, stats_view = ext.sdpa_fwd(q, k, v, config, with_stats=True)
    out_copy, stats_copy = ext.sdpa_fwd(q.contiguous(), k.contiguous(), v.contiguous(), config, with_stats=True)
    # the same math from other strides (cuDNN may tile differently: bf16 rounding of the output)
    torch.testing.assert_close(out_view, out_copy, atol=1e-2, rtol=0)
    torch.testing.assert_close(stats_view, stats_copy, atol=1e-4, rtol=0)
    # a view at an odd element offset is copied first (cuDNN needs 16-byte alignment)
    wide = rand((b, s, h, d + 1), gen)
    odd = wide[..., 1:]
    assert ext._addressable(odd) is not odd
    out_odd, _ = ext.sdpa_fwd(odd, k, v, config)
    ref, _ = ext.sdpa_fwd(odd.contiguous(), k, v, config)
    torch.testing.assert_close(out_odd, ref, atol=1e-2, rtol=0)


@requires_cudnn
def test_op_refusal_is_not_implemented_before_running(gen):
    b, h, d = 2, 4, 64
    q, k, v = rand((b, 64, h, d), gen), rand((b, 128, h, d), gen), rand((b, 128, h, d), gen)
    bias = rand((1, h, 64, 128), gen)
    config = ext.FusedAttnConfig(mask_type="causal_bottom_right", window=(-1, 0), bias_type="post_scale_bias",
                                 softmax_scale=d**-0.5)
    with pytest.raises(NotImplementedError, match="cuDNN .* cannot run this attention"):
        ext.check_sdpa_support(q, k, v, config, bias=bias)
    with pytest.raises(NotImplementedError, match="cannot run this attention"):  # cached refusal, same message
        ext.sdpa_fwd(q, k, v, config, bias=bias)


@requires_cudnn
def test_te_style_entry_points(gen):
    b, s, h, d = 2, 64, 4, 64
    q, k, v = (rand((b, s, h, d), gen) for _ in range(3))
    lengths = [60, 23]
    cu = torch.tensor([0, 60, 83], dtype=torch.int32, device="cuda")
    out, aux = ext.fused_attn_fwd(True, s, s, cu, cu, q, k, v, torch.bfloat16, None, attn_scale=0.125,
                                  qkv_layout="bshd_bshd_bshd", attn_mask_type="padding,causal")
    assert len(aux) == 2 and aux[0].shape == (b, h, s, 1) and aux[1].dtype == torch.int64
    config = ext.FusedAttnConfig(mask_type="padding_causal", window=(-1, 0), softmax_scale=0.125)
    ours, _, _, _ = run_op(q, k, v, config, "bshd", "bshd", gen, lengths=(lengths, lengths))
    torch.testing.assert_close(out, ours, atol=0, rtol=0)
    d_o = rand(out.shape, gen)
    dq, dk, dv, dbias, dsink = ext.fused_attn_bwd(s, s, cu, cu, q, k, v, out, d_o, torch.bfloat16, torch.bfloat16,
                                                  aux, None, attn_scale=0.125, qkv_layout="bshd_bshd_bshd",
                                                  attn_mask_type="padding_causal")
    assert dbias is None and dsink is None
    mask = reference_mask("padding_causal", None, s, s, lengths, lengths).cuda()
    check_against_references(q, k, v, out, [dq, dk, dv], d_o, "bshd", "bshd", 0.125, mask)
    inference, aux = ext.fused_attn_fwd(False, s, s, None, None, q, k, v, qkv_layout="sbhd_sbhd_sbhd",
                                        attn_mask_type="no_mask")
    assert aux == [] and inference.shape == q.shape


# ==== DotProductAttention on the GPU ============================================================


@pytest.fixture
def spy_fused(monkeypatch):
    """Counts the calls the fused backend ran (a refusal raises before counting)."""
    calls = []
    original = FusedAttention.forward

    def counted(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        calls.append(kwargs.get("attn_mask_type"))
        return out

    monkeypatch.setattr(FusedAttention, "forward", counted)
    return calls


def run_dpa(dpa, inputs, d_o, **kwargs):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out = dpa(*leaves, **kwargs)
    out.backward(d_o)
    return out.detach(), [x.grad for x in leaves]


def fused_vs_unfused(monkeypatch, dpa, inputs, d_o, **kwargs):
    """(fused output and grads, unfused output and grads) of one module on the same inputs."""
    fused = run_dpa(dpa, inputs, d_o, **kwargs)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    unfused = run_dpa(dpa, inputs, d_o, **kwargs)
    monkeypatch.delenv("NVTE_FUSED_ATTN")
    return fused, unfused


def assert_as_accurate(fused, unfused, reference):
    """Each of fused's tensors within 3x unfused's error (+1e-3) of the float64 reference."""
    (f_out, f_grads), (u_out, u_grads), (r_out, r_grads) = fused, unfused, reference
    for name, f, u, r in zip(["output", "dq", "dk", "dv"], [f_out] + f_grads, [u_out] + u_grads, [r_out] + r_grads):
        within_rule(f, r, u, name)


def dpa_reference(inputs, d_o, fmt, scale, mask=None):
    leaves = [x.detach().double().requires_grad_() for x in inputs]
    out = attention(*(bhsd(x, fmt) for x in leaves), scale, mask)
    b, h, s, d = out.shape
    out = out.permute(2, 0, 1, 3).reshape(s, b, h * d) if fmt == "sbhd" else out.permute(0, 2, 1, 3).reshape(b, s, -1)
    out.backward(d_o.double())
    return out.detach(), [x.grad for x in leaves]


@requires_cudnn
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
@pytest.mark.parametrize("mask_type", MASKS)
def test_dpa_fused_matches_unfused(monkeypatch, spy_fused, fmt, mask_type, gen):
    b, h, hg, sq, skv, d = 2, 8, 2, 96, 160, 64
    inputs = [rand(shape_of(fmt, b, s, n, d), gen) for s, n in ((sq, h), (skv, hg), (skv, hg))]
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type=mask_type,
                                 attention_type="cross")
    kwargs, mask = {}, None
    if "padding" in mask_type:
        lq, lkv = padded_lengths(sq, skv)
        pad_q = torch.arange(sq)[None, :] >= torch.tensor(lq)[:, None]
        pad_kv = torch.arange(skv)[None, :] >= torch.tensor(lkv)[:, None]
        kwargs["attention_mask"] = (pad_q.view(b, 1, 1, sq).cuda(), pad_kv.view(b, 1, 1, skv).cuda())
        mask = reference_mask(mask_type, None, sq, skv, lq, lkv).cuda()
    elif mask_type != "no_mask":
        mask = reference_mask(mask_type, None, sq, skv).cuda()
    d_o = rand((sq, b, h * d) if fmt == "sbhd" else (b, sq, h * d), gen)
    fused, unfused = fused_vs_unfused(monkeypatch, dpa, inputs, d_o, **kwargs)
    assert spy_fused == [mask_type]  # the fused backend ran once, the unfused one the second time
    assert_as_accurate(fused, unfused, dpa_reference(inputs, d_o, fmt, d**-0.5, mask))


@requires_cudnn
def test_dpa_thd_through_fused(monkeypatch, spy_fused, gen):
    h, d = 4, 64
    lengths = [50, 7, 33]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    t = sum(lengths)
    inputs = [rand((t, h, d), gen) for _ in range(3)]
    dpa = te.DotProductAttention(h, d, qkv_format="thd", attn_mask_type="padding_causal")
    d_o = rand((t, h * d), gen)
    fused, unfused = fused_vs_unfused(monkeypatch, dpa, inputs, d_o, cu_seqlens_q=cu, cu_seqlens_kv=cu)
    assert spy_fused == ["padding_causal"]
    # per sequence, causal attention of that sequence alone
    ref_out, ref_grads = torch.zeros(t, h * d, dtype=torch.float64, device="cuda"), []
    leaves = [x.detach().double().requires_grad_() for x in inputs]
    outs = []
    for start, n in zip(cu[:-1].tolist(), lengths):
        seq = [x[start:start + n].unsqueeze(0) for x in leaves]  # [1, n, h, d] bshd
        o = attention(*(bhsd(x, "bshd") for x in seq), d**-0.5, reference_mask("causal", None, n, n).cuda())
        outs.append(o.permute(0, 2, 1, 3).reshape(n, h * d))
    ref_out = torch.cat(outs)
    ref_out.backward(d_o.double())
    ref_grads = [x.grad for x in leaves]
    assert_as_accurate(fused, unfused, (ref_out.detach(), ref_grads))


@requires_cudnn
def test_dpa_bias_and_dropout(monkeypatch, spy_fused, gen):
    b, h, s, d = 2, 4, 128, 64
    inputs = [rand((s, b, h, d), gen) for _ in range(3)]
    bias = rand((1, h, s, s), gen, requires_grad=True)
    dpa = te.DotProductAttention(h, d, attention_dropout=0.25, attn_mask_type="causal")
    kwargs = dict(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    torch.manual_seed(3)
    out = dpa(*inputs, **kwargs)
    out.backward(torch.ones_like(out))
    assert spy_fused == ["causal"] and bias.grad is not None and torch.isfinite(bias.grad).all()
    torch.manual_seed(3)
    assert torch.equal(out, dpa(*inputs, **kwargs))  # the same torch seed: the same dropout mask
    torch.manual_seed(4)
    assert not torch.equal(out, dpa(*inputs, **kwargs))
    # without dropout: as accurate as the unfused backend, the bias gradient included
    dpa.eval()
    d_o = rand((s, b, h * d), gen)
    results = []
    for env in ("1", "0"):
        monkeypatch.setenv("NVTE_FUSED_ATTN", env)
        leaves = [x.detach().clone().requires_grad_() for x in inputs + [bias]]
        o = dpa(*leaves[:3], core_attention_bias_type="post_scale_bias", core_attention_bias=leaves[3])
        o.backward(d_o)
        results.append((o.detach(), [x.grad for x in leaves]))
    leaves = [x.detach().double().requires_grad_() for x in inputs + [bias]]
    mask = reference_mask("causal", None, s, s).cuda()
    ref = attention(*(bhsd(x, "sbhd") for x in leaves[:3]), d**-0.5, mask, leaves[3])
    ref = ref.permute(2, 0, 1, 3).reshape(s, b, h * d)
    ref.backward(d_o.double())
    (f_out, f_grads), (u_out, u_grads) = results
    for name, f, u, r in zip(["output", "dq", "dk", "dv", "dbias"], [f_out] + f_grads, [u_out] + u_grads,
                             [ref.detach()] + [x.grad for x in leaves]):
        within_rule(f, r, u, name)


@requires_cudnn
def test_dpa_checkpoint_with_dropout_same_grads(spy_fused, gen):
    b, h, s, d = 2, 4, 64, 64
    inputs = [rand((s, b, h, d), gen, requires_grad=True) for _ in range(3)]
    grad = rand((s, b, h * d), gen)

    def run(checkpointed):
        torch.manual_seed(11)
        dpa = te.DotProductAttention(h, d, attention_dropout=0.3)
        for x in inputs:
            x.grad = None
        out = dpa(*inputs, checkpoint_core_attention=checkpointed)
        out.backward(grad)
        return [out.detach()] + [x.grad.clone() for x in inputs]

    plain, recomputed = run(False), run(True)
    torch.testing.assert_close(recomputed[0], plain[0], atol=0, rtol=0)  # the forward replays the same mask
    for a, b_ in zip(recomputed[1:], plain[1:]):  # cuDNN's dq accumulation order may vary
        torch.testing.assert_close(a, b_, atol=1e-2, rtol=1e-2)
    assert len(spy_fused) == 3  # plain, checkpointed forward, and its recomputation


@requires_cudnn
def test_dpa_falls_back_when_cudnn_refuses(monkeypatch, spy_fused, gen):
    """A call the filters let through but cuDNN refuses: warned once, run unfused."""
    monkeypatch.setattr(backends, "_fused_reasons", lambda p: [])
    monkeypatch.setattr(dpa_module, "_FALLBACK_WARNED", set())
    backends._select.cache_clear()
    b, h, d = 2, 4, 64
    q, k, v = rand((b, 64, h, d), gen), rand((b, 128, h, d), gen), rand((b, 128, h, d), gen)
    bias = rand((1, h, 64, 128), gen)
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal_bottom_right",
                                 attention_type="cross")
    kwargs = dict(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    with pytest.warns(UserWarning, match="cuDNN cannot run this call"):
        out = dpa(q, k, v, **kwargs)
    assert spy_fused == []
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    torch.testing.assert_close(out, dpa(q, k, v, **kwargs), atol=0, rtol=0)
    backends._select.cache_clear()


@requires_cudnn
@pytest.mark.parametrize("fmt", ["bshd", "sbhd"])
def test_dpa_kv_cache_decode_fused(monkeypatch, spy_fused, fmt, gen):
    b, length, prefill, h, hg, d = 2, 70, 40, 4, 2, 64
    q, k, v = (rand(shape_of(fmt, b, length, n, d), gen) for n in (h, hg, hg))
    dpa = te.DotProductAttention(h, d, num_gqa_groups=hg, qkv_format=fmt, attn_mask_type="causal", layer_number=1)
    monkeypatch.setenv("NVTE_FUSED_ATTN", "0")
    full = dpa(q, k, v)  # the unfused reference of the whole sequence
    monkeypatch.delenv("NVTE_FUSED_ATTN")
    cache = te.InferenceParams(b, length + 8, num_heads_kv=hg, head_dim_k=d, dtype=torch.bfloat16)
    decoded = decode_with_cache(dpa, q, k, v, cache, fmt, prefill)
    assert len(spy_fused) == 1 + length - prefill
    # bf16 outputs (|values| < ~3) of two backends: a wrong position would move them by ~1/length
    torch.testing.assert_close(decoded, full, atol=2e-2, rtol=0)


@requires_cudnn
def test_dpa_fused_matches_reference_cuda_large(monkeypatch, spy_fused, gen):
    b, h, s, d = 2, 16, 2048, 128
    inputs = [rand((b, s, h, d), gen) for _ in range(3)]
    dpa = te.DotProductAttention(h, d, qkv_format="bshd", attn_mask_type="causal")
    d_o = rand((b, s, h * d), gen)
    fused, unfused = fused_vs_unfused(monkeypatch, dpa, inputs, d_o)
    assert spy_fused == ["causal"]
    mask = reference_mask("causal", None, s, s).cuda()
    assert_as_accurate(fused, unfused, dpa_reference(inputs, d_o, "bshd", d**-0.5, mask))


def test_fused_backend_uses_the_module_softmax_scale():
    assert math.isclose(te.DotProductAttention(4, 64).fused_attention.softmax_scale, 64**-0.5)
