"""general_gemm: every layout and epilogue, float and FP8 inputs, against a float64
reference on the dequantized inputs.

CPU: the core's fp32-accumulating loops must be within an error bound derived per
element (see ``cpu_allowed``). CUDA: cuBLASLt's result must agree with the CPU
core's and satisfy DESIGN.md's rule against the float64 reference:
    max|ours - ref| <= K * max|torch - ref| + atol
where torch does the same computation in the same precision (gemm_reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from conftest import requires_cuda

from fp8_reference import FP8_MAX, dtype_id
from gemm_reference import (
    E4M3,
    E5M2,
    FP8_MIN_NORMAL,
    LAYOUTS,
    UNIT_ROUNDOFF,
    Call,
    fp8_operand,
    operand_shapes,
    reference,
    to_device,
    torch_same_precision,
    values,
)
from transformer_engine.pytorch.cpp_extensions import DType, general_gemm, get_cublas_workspace_size_bytes
from transformer_engine.pytorch.tensor import Float8TensorBase

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP8_PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]  # (A, B); E5M2 x E5M2 is not an FP8 GEMM
# 7x13x5 and 33x64x17: no dimension a multiple of 8 (cuBLASLt's general paths); k=0 (the
# result is only the epilogue of zero) and m=0 (empty output, bias_grad of n zeros).
SHAPES = [(7, 13, 5), (1, 1, 1), (33, 64, 17), (4, 0, 6), (0, 5, 3)]
# FP8 GEMMs need m, n, k divisible by 16; k=0 is the wgrad GEMM of a batch without tokens
# (cuBLASLt refuses it for FP8: gemm.cu writes the zeros itself).
FP8_SHAPES = [(16, 32, 48), (48, 16, 32), (16, 0, 32)]
# K of the CUDA rule: cuBLASLt and torch.mm pick different kernels (split-k, reduction
# order), so their errors differ by small factors; 3 leaves room for that, not for a bug.
K = 3

# Epilogue cases: the general_gemm flags they set. "accumulate" adds into an fp32 out
# for half-precision inputs, as fuse_wgrad_accumulation does with main_grad.
CASES = {
    "plain": {},
    "bias": dict(bias=True),
    "gelu": dict(gelu=True),
    "gelu+bias": dict(gelu=True, bias=True),
    "grad+gelu": dict(grad=True, gelu=True),
    "grad+gelu+bias": dict(grad=True, gelu=True, bias=True),
    "grad+bias": dict(grad=True, bias=True),
    "accumulate": dict(accumulate=True, fp32_out=True),
    "accumulate+bias": dict(accumulate=True, bias=True),
    "alpha": dict(alpha=-0.75),
    "alpha+beta": dict(alpha=1.5, accumulate=True, beta=0.5),
}


@dataclass
class Fp8OutputParams:
    """Stand-in for a Float8Quantizer: the fields general_gemm reads for an FP8 output."""

    scale: torch.Tensor
    amax: torch.Tensor | None
    dtype: DType


def workspace_for(device):
    return torch.empty(get_cublas_workspace_size_bytes(), dtype=torch.uint8, device=device) if device == "cuda" \
        else None


def make_call(case, m, n, out_dtype, bias_dtype, gen) -> Call:
    """Random epilogue arguments of a case, on the CPU."""
    spec = CASES[case]
    call = Call(alpha=spec.get("alpha", 1.0), beta=spec.get("beta"), accumulate=spec.get("accumulate", False),
                gelu=spec.get("gelu", False), grad=spec.get("grad", False))
    if spec.get("bias"):
        call.bias = torch.randn(n, generator=gen).to(bias_dtype)
    if call.grad and call.gelu:
        call.gelu_in = (torch.randn(m, n, generator=gen) * 2).to(out_dtype)
    if call.accumulate:
        call.out0 = torch.randn(m, n, generator=gen).to(out_dtype)
    return call


def float_operands(m, k, n, layout, dtype, gen):
    a_shape, b_shape = operand_shapes(m, k, n, layout)
    return torch.randn(a_shape, generator=gen).to(dtype), torch.randn(b_shape, generator=gen).to(dtype)


def run(A, B, layout, call: Call, device, **kw):
    """general_gemm on ``device`` (inputs copied there); the results as a dict."""
    kwargs = {**call.kwargs(device), **kw}  # a poisoned out in kw replaces call's None
    out, bias_grad, gelu_input, extra = general_gemm(to_device(A, device), to_device(B, device),
                                                     workspace_for(device), layout=layout, **kwargs)
    assert extra is None
    res = {"out": out}
    if call.grad and call.gelu:
        assert gelu_input is kwargs["gelu_in"]  # TE hands the saved pre-activation back
    elif gelu_input is not None:
        res["gelu_input"] = gelu_input
    if bias_grad is not None:
        res["bias_grad"] = bias_grad
    return res


def maxabs(t) -> float:
    return float(t.abs().max()) if t.numel() else 0.0


def cpu_allowed(key, ref, call: Call, k, out_fmt, aux_dtype, bias_dtype, fp8_scale=None):
    """Elementwise bound on |CPU core - float64 reference|, from how the result is made:
      accumulation: fp32 sums of k terms, each error <= (k + 1) * 2^-24 * sum|terms|; doubled,
        plus 32 ulps for the fp32 epilogue (tanh, the dGELU factor): acc * scale;
      GELU: |gelu'| <= 1.13 carries that error (x1.2), and a core may evaluate GELU on the
        pre-activation rounded to the aux dtype: + 1.2 * u_aux * |pre|;
      output rounding: u_out * |ref| (half an ulp), for FP8 also half the subnormal
        step over the scale;
      bias_grad of dGELU: sums m outputs that may each be rounded already."""
    acc = (2 * k + 32) * 2.0**-24
    g = 1.2 if call.gelu else 1.0
    u_out = UNIT_ROUNDOFF[out_fmt]
    out_err = u_out * ref["out"].abs() + acc * g * ref["scale"]
    if fp8_scale is not None:
        out_err = out_err + FP8_MIN_NORMAL[out_fmt] * u_out / fp8_scale
    if call.gelu and not call.grad:
        out_err = out_err + 1.2 * UNIT_ROUNDOFF[aux_dtype] * ref["gelu_input"].abs()
    if key == "out":
        return out_err
    if key == "gelu_input":
        return UNIT_ROUNDOFF[aux_dtype] * ref["gelu_input"].abs() + acc * ref["scale"]
    u_bias = UNIT_ROUNDOFF[bias_dtype] * ref["bias_grad"].abs()
    if call.gelu:  # DGELU_BGRAD: sum over the m rows of out
        m = ref["out"].shape[0]
        return u_bias + out_err.sum(0) + 2 * (m + 1) * 2.0**-24 * ref["out"].abs().sum(0)
    return u_bias + acc * ref["rowsum_b"]  # BGRAD: sum over k of op_B(B)


def assert_within(got, expected, allowed, name):
    got = values(got).cpu().reshape(expected.shape)
    err = (got - expected.cpu()).abs()
    bad = ~(err <= allowed.cpu())  # NaN counts as bad
    if bad.any():
        i = tuple(torch.nonzero(bad)[0].tolist())
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements off; first at {i}: got "
                             f"{got[i].item()}, expected {expected[i].item()}, allowed error {allowed[i].item():.3g}")


def check_cuda_rule(got, cpu, ref, base, name, u_out, gelu_atol=0.0):
    """DESIGN.md's rule against the float64 reference, and agreement with the CPU core
    within the same budget plus the CPU's own error. atol: one ulp of the output at its
    largest value (anything computed differently before the rounding may round the other
    way), plus ``gelu_atol`` where the epilogue evaluates GELU."""
    r = ref.cpu()
    g, c, b = (values(x).cpu().reshape(r.shape) for x in (got, cpu, base))
    assert not torch.isnan(g).any(), f"{name}: NaN in the CUDA result"
    err, err_torch, err_cpu = maxabs(g - r), maxabs(b - r), maxabs(c - r)
    atol = 2 * u_out * maxabs(r) + gelu_atol + 1e-30
    assert err <= K * err_torch + atol, f"{name}: error {err:.3g} > {K} x torch's {err_torch:.3g} + {atol:.3g}"
    diff = maxabs(g - c)
    assert diff <= K * err_torch + err_cpu + atol, (
        f"{name}: CUDA and CPU core differ by {diff:.3g} (> {K} x {err_torch:.3g} + {err_cpu:.3g} + {atol:.3g})")


def check(A, B, layout, call, device, out_fmt, aux_dtype, bias_dtype, k, use_split_accumulator=False,
          must_run=False, **kw):
    """Runs the GEMM on ``device`` and checks it (CPU: elementwise bounds; CUDA: the rule).
    On CUDA a NotImplementedError skips the test, unless ``must_run``."""
    fp8_params = kw.get("quantization_params")
    ref = reference(A, B, layout, call)
    fp8_scale = float(fp8_params.scale) if fp8_params is not None else None
    if device == "cpu":
        got = run(A, B, layout, call, "cpu", use_split_accumulator=use_split_accumulator, **kw)
        assert set(got) == set(ref) - {"p", "scale", "rowsum_b"}, sorted(got)
        for key in got:
            assert_within(got[key], ref[key], cpu_allowed(key, ref, call, k, out_fmt, aux_dtype, bias_dtype,
                                                          fp8_scale), key)
        return got
    cpu_kw = dict(kw)
    if fp8_params is not None:
        cpu_kw["quantization_params"] = Fp8OutputParams(fp8_params.scale.cpu(), None, fp8_params.dtype)
        kw["quantization_params"] = Fp8OutputParams(fp8_params.scale.cuda(), torch.zeros(1, device="cuda"),
                                                    fp8_params.dtype)
    elif not call.accumulate:
        # Poisoned out: a beta=0 GEMM must not read it, and every element must be written.
        kw["out"] = torch.full(ref["out"].shape, float("nan"), dtype=out_fmt, device="cuda")
    cpu = run(A, B, layout, call, "cpu", use_split_accumulator=use_split_accumulator, **cpu_kw)
    try:
        got = run(A, B, layout, call, "cuda", use_split_accumulator=use_split_accumulator, **kw)
    except NotImplementedError as e:
        if must_run:
            raise
        # opente/gemm.h lets the CUDA path refuse what cuBLASLt cannot run, naming it;
        # test_gemm_transformer_engine_paths_cuda holds the combinations that must run.
        pytest.skip(f"not run on CUDA: {e}")
    torch.cuda.synchronize()
    base = torch_same_precision(to_device(A, "cuda"), to_device(B, "cuda"), layout,
                                Call(**{**call.__dict__, **{f: to_device(getattr(call, f), "cuda")
                                                            for f in ("out0", "bias", "gelu_in")}}),
                                fp8_params.dtype if fp8_params is not None else out_fmt,
                                fp8_params.scale.cuda() if fp8_params is not None else None,
                                use_split_accumulator)
    assert set(got) == set(cpu)
    units = {"out": UNIT_ROUNDOFF[out_fmt], "gelu_input": UNIT_ROUNDOFF[aux_dtype],
             "bias_grad": UNIT_ROUNDOFF[bias_dtype]}
    # cuBLASLt evaluates GELU and gelu' with fast approximate math; measured on an H200
    # (fp32 outputs, 7x13x5 and 33x64x17): up to 2^-20 x max|pre-activation| for GELU and
    # 2^-16.5 x max|P| for dGELU. Allowed with a margin: 2^-16 and 2^-14. Mistaking the erf
    # form for the tanh form would still fail (they differ by up to 4.7e-4 in GELU, 8.7e-4 in
    # gelu'). The bias gradient of dGELU sums m such outputs.
    gelu_atol = {}
    if call.gelu and call.grad:
        gelu_atol["out"] = 2.0**-14 * maxabs(ref["p"])
        gelu_atol["bias_grad"] = ref["p"].shape[0] * gelu_atol["out"]
    elif call.gelu:
        gelu_atol["out"] = 2.0**-16 * maxabs(ref["gelu_input"])
    for key in got:
        check_cuda_rule(got[key], cpu[key], ref[key], base[key], key, units[key], gelu_atol.get(key, 0.0))
    return got


# ---- float inputs ------------------------------------------------------------------


@pytest.mark.exhaustive
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mkn", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_float(device, mkn, dtype, layout, case, gen):
    m, k, n = mkn
    A, B = float_operands(m, k, n, layout, dtype, gen)
    out_dtype = torch.float32 if CASES[case].get("fp32_out") else dtype
    call = make_call(case, m, n, out_dtype, dtype, gen)
    check(A, B, layout, call, device, out_dtype, out_dtype, dtype, k)


def test_gemm_keeps_leading_dims(device, gen):
    """fprop of a Linear on [batch, seq, in]: out is [batch, seq, out] (TE's unflattening)."""
    x, w = torch.randn(2, 3, 13, generator=gen), torch.randn(5, 13, generator=gen)
    out, *_ = general_gemm(w.to(device), x.to(device), workspace_for(device), layout="TN")
    assert out.shape == (2, 3, 5) and out.dtype == torch.float32
    expected = (x.double() @ w.double().t())
    assert torch.allclose(out.cpu().double(), expected, rtol=0, atol=1e-5 * float(expected.abs().max()))


def test_gemm_linear_layer(device, gen):
    """fprop, dgrad and wgrad of a Linear with bias equal torch autograd's (fp32; the
    bound allows for fp32 accumulation over k <= 24 terms of size ~1)."""
    x = torch.randn(24, 16, generator=gen, requires_grad=True)
    w = torch.randn(8, 16, generator=gen, requires_grad=True)
    b = torch.randn(8, generator=gen, requires_grad=True)
    y = torch.nn.functional.linear(x, w, b)
    dy = torch.randn(24, 8, generator=gen)
    y.backward(dy)
    ws = workspace_for(device)
    d = lambda t: t.detach().to(device)  # noqa: E731
    y_ours, *_ = general_gemm(d(w), d(x), ws, layout="TN", bias=d(b))
    dx, *_ = general_gemm(d(w), d(dy), ws, layout="NN")
    dw, db, *_ = general_gemm(d(x), d(dy), ws, layout="NT", grad=True, bias=d(b))
    for got, want in ((y_ours, y), (dx, x.grad), (dw, w.grad), (db, b.grad)):
        assert got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_beta0_does_not_read_out(layout, gen):
    """With beta = 0 the old contents of out are not read: NaN there must not leak."""
    A, B = float_operands(6, 9, 4, layout, torch.float32, gen)
    out = torch.full((6, 4), float("nan"))
    got, *_ = general_gemm(A, B, None, layout=layout, out=out)
    assert got is out
    assert_within(got, reference(A, B, layout, Call())["out"], torch.full((6, 4), 1e-5), "out")


# ---- FP8 inputs --------------------------------------------------------------------

FP8_OUT = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": E4M3}


def fp8_params(out_kind, ref_out_max, device):
    """quantization_params for an FP8 output, scaled so the largest value lands near
    FP8's max without saturating (and not a power of two, so the scale matters)."""
    fmt = FP8_OUT[out_kind]
    scale = FP8_MAX[fmt] / (ref_out_max * 1.23) if ref_out_max > 0 else 1.0
    return Fp8OutputParams(torch.tensor([scale], dtype=torch.float32, device=device),
                           torch.zeros(1, dtype=torch.float32, device=device), fmt)


def fp8_cases():
    for case in CASES:
        for out_kind in FP8_OUT:
            if out_kind == "fp8" and CASES[case].get("accumulate"):
                continue  # FP8 output cannot accumulate: test_gemm_errors covers that
            yield case, out_kind


@pytest.mark.exhaustive
@pytest.mark.parametrize("case,out_kind", list(fp8_cases()), ids=lambda v: v)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pair", FP8_PAIRS, ids=lambda p: f"{dtype_id(p[0])}x{dtype_id(p[1])}")
@pytest.mark.parametrize("mkn", FP8_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_fp8(device, mkn, pair, layout, case, out_kind, gen):
    m, k, n = mkn
    a_shape, b_shape = operand_shapes(m, k, n, layout)
    A, B = fp8_operand(a_shape, pair[0], gen), fp8_operand(b_shape, pair[1], gen)
    fp8_out = out_kind == "fp8"
    hp_out = torch.bfloat16 if fp8_out else FP8_OUT[out_kind]  # the dtype of aux, gelu_in and out0
    call = make_call(case, m, n, hp_out, torch.bfloat16, gen)
    kw = {}
    if fp8_out:
        params = fp8_params(out_kind, maxabs(reference(A, B, layout, call)["out"]), "cpu")
        kw["quantization_params"] = params
    elif out_kind == "fp32":
        kw["out_dtype"] = torch.float32
    got = check(A, B, layout, call, device, FP8_OUT[out_kind], hp_out, torch.bfloat16, k, **kw)
    if fp8_out:
        out = got["out"]
        assert isinstance(out, Float8TensorBase) and out._fp8_dtype == E4M3 and out._transpose is None
        assert out.size() == (m, n) and out._data.dtype == torch.uint8
        # 1/scale, as torch.reciprocal computes it (on the GPU too: correctly rounded)
        assert out._scale_inv.item() == torch.reciprocal(params.scale).item()
        if device == "cpu":
            # amax: max|out| before scaling, so within the accumulation bound of the reference's
            ref = reference(A, B, layout, call)
            want = maxabs(ref["out"])
            assert abs(params.amax.item() - want) <= (2 * k + 32) * 2.0**-24 * 1.2 * maxabs(ref["scale"])
    elif out_kind == "bf16":
        assert got["out"].dtype == torch.bfloat16  # the default for FP8 inputs


@pytest.mark.parametrize("storage", ["rowwise", "columnwise"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gemm_fp8_single_copy_cpu(layout, storage, gen):
    """The CPU reads whichever copy exists (only one here) in every layout."""
    a_shape, b_shape = operand_shapes(32, 16, 48, layout)
    A, B = fp8_operand(a_shape, E4M3, gen), fp8_operand(b_shape, E5M2, gen)
    for x in (A, B):
        if storage == "rowwise":
            x._transpose = None
        else:
            x._data = None
    check(A, B, layout, Call(), "cpu", torch.bfloat16, torch.bfloat16, torch.bfloat16, 16)


@pytest.mark.parametrize("out_fmt", [E4M3, E5M2], ids=dtype_id)
@pytest.mark.parametrize("case", ["plain", "bias", "gelu+bias"])
def test_gemm_float_inputs_fp8_output(device, case, out_fmt, gen):
    """bf16 inputs, FP8 output (quantized in the epilogue)."""
    A, B = float_operands(32, 48, 16, "TN", torch.bfloat16, gen)
    call = make_call(case, 32, 16, torch.bfloat16, torch.bfloat16, gen)
    ref_max = maxabs(reference(A, B, "TN", call)["out"])
    params = Fp8OutputParams(torch.tensor([FP8_MAX[out_fmt] / (ref_max * 1.23)]), torch.zeros(1), out_fmt)
    got = check(A, B, "TN", call, device, out_fmt, torch.bfloat16, torch.bfloat16, 48, quantization_params=params)
    assert got["out"]._fp8_dtype == out_fmt


@pytest.mark.parametrize("split", [False, True])
def test_gemm_fp8_split_accumulator(device, split, gen):
    A, B = fp8_operand((64, 1024), E4M3, gen), fp8_operand((32, 1024), E4M3, gen)
    check(A, B, "TN", Call(), device, torch.bfloat16, torch.bfloat16, torch.bfloat16, 1024,
          use_split_accumulator=split)


# The GEMMs Transformer Engine's modules run (Linear, LayerNormMLP; FP8 dgrad and wgrad take
# E5M2 gradients): these must run on CUDA, not be refused. (name, layout, inputs, case, output)
TE_PATHS = [
    ("fprop", "TN", torch.bfloat16, "plain", None),
    ("fprop+bias", "TN", torch.bfloat16, "bias", None),
    ("fc1 fprop+bias+gelu", "TN", torch.bfloat16, "gelu+bias", None),
    ("dgrad", "NN", torch.bfloat16, "plain", None),
    ("fc2 dgrad+dgelu", "NN", torch.bfloat16, "grad+gelu", None),
    ("wgrad+bgrad", "NT", torch.bfloat16, "grad+bias", None),
    ("wgrad into fp32 main_grad", "NT", torch.bfloat16, "accumulate", None),
    ("fp8 fprop", "TN", (E4M3, E4M3), "plain", None),
    ("fp8 fprop+bias", "TN", (E4M3, E4M3), "bias", None),
    ("fp8 dgrad", "NN", (E4M3, E5M2), "plain", None),
    ("fp8 wgrad", "NT", (E4M3, E5M2), "plain", None),
    ("fp8 wgrad into fp32", "NT", (E4M3, E5M2), "accumulate", torch.float32),
    ("fp8 fprop, fp8 output", "TN", (E4M3, E4M3), "plain", E4M3),
]


@requires_cuda
@pytest.mark.parametrize("name,layout,inputs,case,output", TE_PATHS, ids=[p[0] for p in TE_PATHS])
def test_gemm_transformer_engine_paths_cuda(name, layout, inputs, case, output, gen):
    check_te_path(layout, inputs, case, output, 128, gen)


WGRAD_PATHS = [p for p in TE_PATHS if "wgrad" in p[0]]


@requires_cuda
@pytest.mark.parametrize("name,layout,inputs,case,output", WGRAD_PATHS, ids=[p[0] for p in WGRAD_PATHS])
def test_gemm_wgrad_over_no_tokens_cuda(name, layout, inputs, case, output, gen):
    """A batch without tokens: the wgrad GEMM has k = 0 (zeros, or main_grad left as it is)."""
    check_te_path(layout, inputs, case, output, 0, gen)


def check_te_path(layout, inputs, case, output, k, gen):
    m, n = 64, 96
    a_shape, b_shape = operand_shapes(m, k, n, layout)
    if isinstance(inputs, tuple):
        A, B = fp8_operand(a_shape, inputs[0], gen), fp8_operand(b_shape, inputs[1], gen)
        hp = output if output in FLOAT_DTYPES else torch.bfloat16
    else:
        A, B = float_operands(m, k, n, layout, inputs, gen)
        hp = torch.float32 if CASES[case].get("fp32_out") else inputs
    call = make_call(case, m, n, hp, torch.bfloat16, gen)
    kw = {"out_dtype": hp} if call.out0 is None else {}
    if output in (E4M3, E5M2):
        kw = {"quantization_params": fp8_params("fp8", maxabs(reference(A, B, layout, call)["out"]), "cpu")}
    check(A, B, layout, call, "cuda", output or hp, hp, torch.bfloat16, k, must_run=True, **kw)


# ---- large shapes, CUDA only ----------------------------------------------------------------

# (m, k, n): square, one row, long k with small m and n (accumulation error), tall and wide,
# and for float inputs sizes that are not multiples of the tiles.
LARGE_FLOAT = [(4096, 4096, 4096), (1, 16, 16), (8192, 1024, 3000), (16, 8192, 16), (2047, 4097, 1001)]
LARGE_FP8 = [(4096, 4096, 4096), (16, 16, 16), (8192, 1024, 4096), (16, 8192, 32)]


@requires_cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mkn", LARGE_FLOAT, ids=lambda s: "x".join(map(str, s)))
def test_gemm_bf16_cuda_large(mkn, layout, gen):
    m, k, n = mkn
    A, B = (x.cuda() for x in float_operands(m, k, n, layout, torch.bfloat16, gen))
    check_large(A, B, layout, torch.bfloat16)


@requires_cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mkn", LARGE_FP8, ids=lambda s: "x".join(map(str, s)))
def test_gemm_fp8_cuda_large(mkn, layout, gen):
    m, k, n = mkn
    a_shape, b_shape = operand_shapes(m, k, n, layout)
    check_large(fp8_operand(a_shape, E4M3, gen, "cuda"), fp8_operand(b_shape, E4M3, gen, "cuda"), layout,
                torch.bfloat16)


def b_rows(B, layout, rows):
    """B restricted to the first ``rows`` rows of op_B(B), on the CPU (for the CPU core)."""
    if isinstance(B, Float8TensorBase):
        data = B._data.cpu()
        data = data[:rows] if layout[1] == "N" else data[:, :rows].contiguous()
        return Float8TensorBase(data=data, fp8_scale_inv=B._scale_inv.cpu(), fp8_dtype=B._fp8_dtype)
    b = B.cpu()
    return b[:rows] if layout[1] == "N" else b[:, :rows].contiguous()


def check_large(A, B, layout, out_dtype):
    """The rule over the whole product; the CPU core (too slow for all of it) on its first 32 rows."""
    got, *_ = general_gemm(A, B, workspace_for("cuda"), layout=layout)
    ref = reference(A, B, layout, Call())
    base = torch_same_precision(A, B, layout, Call(), out_dtype)
    u = UNIT_ROUNDOFF[out_dtype]
    r = ref["out"]
    err, err_torch = maxabs(values(got).reshape(r.shape) - r), maxabs(base["out"] - r)
    assert err <= K * err_torch + u * maxabs(r), f"error {err:.3g} > {K} x torch's {err_torch:.3g}"
    rows = min(32, r.shape[0])
    cpu, *_ = general_gemm(to_device(A, "cpu"), b_rows(B, layout, rows), None, layout=layout)
    diff = maxabs(values(got)[:rows].cpu() - values(cpu))
    assert diff <= 2 * K * err_torch + 2 * u * maxabs(r), f"CUDA and CPU core differ by {diff:.3g}"

# ==== Configurations no CUDA test ran before the forty-seventh session's audit ================
# (the float shapes above have n of 1-17, and cuBLASLt wants a GELU epilogue's aux leading
# dimension, n, a multiple of 8: their CUDA GELU cases end in check()'s skip, so the
# ones below give n = 16; FP8 with an fp16 output; the FP8 output's amax on the device;
# operands off 16 bytes; the bias-gradient epilogue over an accumulated or empty D)

GELU_CASES = ["gelu", "gelu+bias", "grad+gelu", "grad+gelu+bias"]


# ---- float-input GELU epilogues with an aux leading dimension cuBLASLt accepts -------------


@pytest.mark.parametrize("case", GELU_CASES)
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
def test_gemm_float_gelu_aux_ld_multiple_of_8(device, dtype, layout, case, gen):
    """m and k odd (cuBLASLt's general kernels), n = 16: the aux ld is a multiple of 8, so
    GELU_AUX, GELU_AUX_BIAS, DGELU and DGELU_BGRAD reach cuBLASLt for every float dtype
    and layout. Where Transformer Engine fuses them (16-bit operands: GELU in the forward's
    TN, dGELU in the backward's NN) they must run; elsewhere cuBLASLt may refuse (a skip
    that names it, which pytest -rs lists)."""
    m, k, n = 7, 13, 16
    A, B = float_operands(m, k, n, layout, dtype, gen)
    call = make_call(case, m, n, dtype, dtype, gen)
    fused_by_te = layout == ("NN" if case.startswith("grad") else "TN")
    check(A, B, layout, call, device, dtype, dtype, dtype, k, must_run=dtype != torch.float32 and fused_by_te)


# ---- FP8 inputs, fp16 output: C/D CUDA_R_16F, fp16 bias, fp16 aux --------------------------

FP16_PATHS = [  # (layout, (A, B), case, must_run)
    ("TN", (E4M3, E4M3), "plain", True),          # fprop of an fp16 model
    ("TN", (E4M3, E4M3), "bias", True),           # fprop + fp16 bias
    ("TN", (E4M3, E4M3), "gelu+bias", False),     # fp16 aux
    ("NN", (E4M3, E5M2), "plain", True),          # dgrad
    ("NT", (E4M3, E5M2), "plain", True),          # wgrad
    ("NT", (E4M3, E5M2), "accumulate+bias", False),
    ("TN", (E5M2, E4M3), "alpha+beta", False),    # beta into an fp16 C
]


@pytest.mark.parametrize("layout,pair,case,must_run", FP16_PATHS,
                         ids=[f"{p[0]}-{dtype_id(p[1][0])}x{dtype_id(p[1][1])}-{p[2]}" for p in FP16_PATHS])
def test_gemm_fp8_fp16_output(device, layout, pair, case, must_run, gen):
    m, k, n = 16, 32, 48
    a_shape, b_shape = operand_shapes(m, k, n, layout)
    A, B = fp8_operand(a_shape, pair[0], gen), fp8_operand(b_shape, pair[1], gen)
    call = make_call(case, m, n, torch.float16, torch.float16, gen)
    kw = {"out_dtype": torch.float16} if call.out0 is None else {}
    got = check(A, B, layout, call, device, torch.float16, torch.float16, torch.float16, k, must_run=must_run, **kw)
    assert got["out"].dtype == torch.float16


def test_gemm_fp8_output_with_fp16_bias(device, gen):
    """FP8 D with an fp16 bias: make_plan gives an FP8 D a bf16 C layout whatever the bias;
    cuBLASLt pairs an fp16 bias with an fp16 C. Runs (checked) or is refused by name."""
    m, k, n = 16, 32, 48
    A, B = fp8_operand((n, k), E4M3, gen), fp8_operand((m, k), E4M3, gen)
    call = make_call("bias", m, n, torch.float16, torch.float16, gen)
    ref_max = maxabs(reference(A, B, "TN", call)["out"])
    params = Fp8OutputParams(torch.tensor([FP8_MAX[E4M3] / (ref_max * 1.23)]), torch.zeros(1), E4M3)
    check(A, B, "TN", call, device, E4M3, torch.float16, torch.float16, k, quantization_params=params)


# ---- the amax an FP8 output's GEMM writes, on the device it runs on -------------------------

AMAX_CASES = [  # (m, k, n, case, out fmt)
    (16, 32, 48, "plain", E4M3),  # (an E5M2 output of E4M3 operands cuBLASLt refuses on Hopper)
    (16, 32, 48, "bias", E4M3),
    (16, 32, 48, "gelu+bias", E4M3),  # the amax of gelu(.), not of the pre-activation
    (16, 0, 32, "plain", E4M3),       # k = 0: gemm_over_empty_k zeroes D and the amax
    (0, 32, 16, "plain", E4M3),       # m = 0: gemm_cuda's early return sets the amax to 0
]


@pytest.mark.parametrize("mkn_case", AMAX_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{dtype_id(c[4])}")
def test_gemm_fp8_output_amax_on_device(device, mkn_case, gen):
    """The amax given is overwritten (poisoned first) with max|D| before scaling, on the
    device that ran the GEMM; without an amax (the has_d_amax = 0 plan) D is the same bits."""
    m, k, n, case, fmt = mkn_case
    A, B = fp8_operand((n, k), E4M3, gen), fp8_operand((m, k), E4M3, gen)
    call = make_call(case, m, n, torch.bfloat16, torch.bfloat16, gen)
    ref = reference(A, B, "TN", call)
    want = maxabs(ref["out"])
    scale = torch.tensor([FP8_MAX[fmt] / (want * 1.23) if want > 0 else 1.0], device=device)
    amax = torch.full((1,), 123.0, device=device)
    kw = call.kwargs(device)
    out, *_ = general_gemm(to_device(A, device), to_device(B, device), workspace_for(device), layout="TN",
                           quantization_params=Fp8OutputParams(scale, amax, fmt), **kw)
    no_amax, *_ = general_gemm(to_device(A, device), to_device(B, device), workspace_for(device), layout="TN",
                               quantization_params=Fp8OutputParams(scale, None, fmt), **kw)
    got = amax.item()
    # the FP8 tensor cores' own accumulation (no split accumulator; H100: 2^-12 of sum |a b|
    # at k = 32, where an fp32 sum would be within 2^-18), and (CUDA) cuBLASLt's approximate
    # GELU: 2^-16 of the pre-activation
    bound = 2.0**-9 * maxabs(ref["scale"])
    if call.gelu:
        bound += 2.0**-16 * maxabs(ref["gelu_input"])
    assert abs(got - want) <= bound, (got, want, bound)
    assert torch.equal(out._data.cpu(), no_amax._data.cpu())


# ---- operands and output off cuBLASLt's 16-byte boundary ------------------------------------


def _offset_copy(t: torch.Tensor, offset: int, device) -> torch.Tensor:
    """``t`` on ``device`` as a contiguous view starting ``offset`` elements into its buffer."""
    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=device)
    view = flat[offset:].view(t.shape)
    view.copy_(t.to(device))
    return view


@requires_cuda
@pytest.mark.parametrize("layout", ["TN", "NN", "NT"])
@pytest.mark.parametrize("dtype,offsets", [(torch.bfloat16, (1, 3, 5)), (torch.float32, (1, 2, 3)),
                                           (torch.float16, (4, 0, 2))], ids=["bf16", "fp32", "fp16"])
def test_gemm_misaligned_operands_cuda(dtype, offsets, layout, gen):
    """A, B and out starting 2..10 bytes past an allocation (views into a fused buffer):
    alignment_of() gives 2 / 4 / 8, a separate plan and heuristic query. Must run, and
    agree with the rule and the CPU core like every CUDA GEMM."""
    m, k, n = 24, 40, 32
    A, B = float_operands(m, k, n, layout, dtype, gen)
    bias = torch.randn(n, generator=gen).to(dtype)
    a_dev, b_dev = _offset_copy(A, offsets[0], "cuda"), _offset_copy(B, offsets[1], "cuda")
    out = _offset_copy(torch.full((m, n), float("nan")).to(dtype), offsets[2], "cuda")
    assert a_dev.data_ptr() % 16 or b_dev.data_ptr() % 16 or out.data_ptr() % 16
    got, *_ = general_gemm(a_dev, b_dev, workspace_for("cuda"), layout=layout, out=out, bias=bias.cuda())
    assert got is out
    call = Call(bias=bias)
    ref = reference(A, B, layout, call)["out"]
    cpu, *_ = general_gemm(A, B, None, layout=layout, bias=bias)
    base = torch_same_precision(a_dev, b_dev, layout, Call(bias=bias.cuda()), dtype)["out"]
    check_cuda_rule(got, cpu, ref, base, "out", UNIT_ROUNDOFF[dtype])


@requires_cuda
def test_gemm_fp8_misaligned_operand_runs_or_is_refused_cuda(gen):
    """FP8 data 1 byte off: cuBLASLt's FP8 kernels need 16-byte operands. Either the GEMM
    runs correctly or te_gemm refuses with NotImplementedError; never a CUDA error."""
    m, k, n = 16, 32, 48
    A, B = fp8_operand((n, k), E4M3, gen), fp8_operand((m, k), E4M3, gen)
    a_dev = to_device(A, "cuda")
    a_dev._data = _offset_copy(A._data, 1, "cuda")
    b_dev = to_device(B, "cuda")
    try:
        got, *_ = general_gemm(a_dev, b_dev, workspace_for("cuda"), layout="TN")
    except NotImplementedError as e:
        assert "cuBLASLt" in str(e)
        return
    ref = reference(A, B, "TN", Call())["out"]
    base = torch_same_precision(to_device(A, "cuda"), b_dev, "TN", Call(), torch.bfloat16)["out"]
    cpu, *_ = general_gemm(A, B, None, layout="TN")
    check_cuda_rule(got, cpu, ref, base, "out", UNIT_ROUNDOFF[torch.bfloat16])


# ---- the bias-gradient epilogue over an accumulated D, and over an empty D -------------------


@pytest.mark.parametrize("k", [0, 24])
def test_gemm_wgrad_bgrad_accumulate(device, k, gen):
    """BGRAD with beta = 1 (dW += dY^T X with dbias): k = 0 is gemm_over_empty_k's keeps_d
    branch (D kept, bias_grad zeroed), k > 0 cuBLASLt's BGRADB reading C."""
    m, n = 32, 16
    A, B = float_operands(m, k, n, "NT", torch.bfloat16, gen)
    call = Call(accumulate=True, grad=True, bias=torch.randn(n, generator=gen).to(torch.bfloat16),
                out0=torch.randn(m, n, generator=gen).to(torch.bfloat16))
    check(A, B, "NT", call, device, torch.bfloat16, torch.bfloat16, torch.bfloat16, k)


def test_gemm_bgrad_over_empty_output(device, gen):
    """BGRAD with n = 0 and m > 0: the CPU sums B's rows; CUDA refuses by name (gemm_cuda)."""
    m, k, n = 8, 5, 0
    A, B = float_operands(m, k, n, "NT", torch.float32, gen)
    kw = dict(layout="NT", grad=True, bias=torch.zeros(0, device=device))
    if device == "cuda":
        with pytest.raises(NotImplementedError, match="bgrad with an empty D"):
            general_gemm(A.cuda(), B.cuda(), workspace_for("cuda"), **kw)
        return
    out, bias_grad, *_ = general_gemm(A, B, None, **kw)
    assert out.shape == (m, 0)
    torch.testing.assert_close(bias_grad, B.sum(0), rtol=1e-6, atol=1e-6)  # op_B(B) = B^T: its row sums
