// te_gemm on the CPU against a float64 reference written here from the
// dequantized inputs (the exact values the stored codes hold, times scale_inv):
//
//   t = alpha * sum_k op_B(B)[m, k] op_A(A)[k, n] + beta * D_old, then the epilogue
//   (bias, gelu with aux, dgelu, bias gradients), then the output cast.
//
// Tolerances. The library accumulates in fp32, so an element can be off by
// about k * 2^-24 * sum_k |b a| (the standard bound for a recursive fp32 sum);
// that bound times 1.2 (the largest |gelu'| is 1.13) plus the magnitudes of the
// other terms is each element's "error scale" M. An element passes when
//   |got - ref| <= rel * M + one unit in the last place of the output format at |ref|
// with rel = max(1e-5, k * 2^-24): tight for fp32 outputs (1e-5 of M), and for
// bf16/fp16 outputs within one output ulp, i.e. the half-ulp output rounding plus
// the fp32 error that may push a value across a rounding midpoint. FP8 outputs:
// the code must lie within one FP8 grid step of ref * scale (clamped to the
// largest finite value, with saturation checked exactly).
#include <algorithm>
#include <functional>
#include <tuple>

#include "ops/gemm/gelu.h"
#include "test_util.h"

namespace {

using namespace tt;

constexpr double kU32 = 1.0 / 16777216.0;  // 2^-24, the unit roundoff of fp32

const te_gemm_epilogue kEpilogues[] = {TE_GEMM_EPILOGUE_NONE,          TE_GEMM_EPILOGUE_BIAS,
                                       TE_GEMM_EPILOGUE_GELU_AUX,      TE_GEMM_EPILOGUE_GELU_AUX_BIAS,
                                       TE_GEMM_EPILOGUE_DGELU,         TE_GEMM_EPILOGUE_DGELU_BGRAD,
                                       TE_GEMM_EPILOGUE_BGRAD};

const char* epilogue_str(te_gemm_epilogue e) {
  switch (e) {
    case TE_GEMM_EPILOGUE_NONE: return "NONE";
    case TE_GEMM_EPILOGUE_BIAS: return "BIAS";
    case TE_GEMM_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case TE_GEMM_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case TE_GEMM_EPILOGUE_DGELU: return "DGELU";
    case TE_GEMM_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case TE_GEMM_EPILOGUE_BGRAD: return "BGRAD";
  }
  return "?";
}

bool uses_bias(te_gemm_epilogue e) { return e == TE_GEMM_EPILOGUE_BIAS || e == TE_GEMM_EPILOGUE_GELU_AUX_BIAS; }
bool writes_aux(te_gemm_epilogue e) { return e == TE_GEMM_EPILOGUE_GELU_AUX || e == TE_GEMM_EPILOGUE_GELU_AUX_BIAS; }
bool reads_aux(te_gemm_epilogue e) { return e == TE_GEMM_EPILOGUE_DGELU || e == TE_GEMM_EPILOGUE_DGELU_BGRAD; }
bool uses_bias_grad(te_gemm_epilogue e) {
  return e == TE_GEMM_EPILOGUE_DGELU_BGRAD || e == TE_GEMM_EPILOGUE_BGRAD;
}
bool is_fp8_dtype(te_dtype d) { return d == TE_DTYPE_FLOAT8_E4M3 || d == TE_DTYPE_FLOAT8_E5M2; }

// GELU (tanh form) and its derivative in float64, from the formula.
double ref_gelu(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double ref_gelu_grad(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  const double th = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

// Spacing of the format's grid at |x| (the subnormal step below the normals).
double grid_step(const Format& f, double x) {
  int e;
  std::frexp(std::fabs(x), &e);
  return std::ldexp(1.0, std::max(e - 1, 1 - f.bias) - f.mant_bits);
}

// One unit in the last place of dtype d at |x|; 0 for fp32 (the library's fp32
// result is stored as is, its error is in the rel * M term).
double output_ulp(te_dtype d, double x) { return d == TE_DTYPE_FLOAT32 ? 0.0 : grid_step(format_of(d), x); }

// The exact value of element i of a buffer of dtype d.
double read_value(const Buffer& b, te_dtype d, size_t i) {
  if (d == TE_DTYPE_FLOAT32) return b.get<float>(i);
  return ref_decode(format_of(d), load_code(b, d, i));
}

// A row-wise [rows, cols] operand (or only its column-wise copy [cols, rows]),
// random values, and the dequantized value of each logical element.
struct Operand {
  te_dtype dtype;
  int64_t rows, cols;
  float scale_inv;
  Buffer buf;
  std::vector<double> val;  // [rows, cols], dequantized
  te_tensor t;

  Operand(te_dtype d, int64_t r, int64_t c, bool columnwise_only, float scale_inv_, std::mt19937& rng)
      : dtype(d), rows(r), cols(c), scale_inv(is_fp8_dtype(d) ? scale_inv_ : 1.0f), buf(r * c * elem_size(d)),
        val(size_t(r * c)) {
    std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        float x;
        if (d == TE_DTYPE_FLOAT8_E4M3) {
          x = random_magnitude(rng, -6, 7);  // up to 128, E4M3 max is 448
        } else if (d == TE_DTYPE_FLOAT8_E5M2) {
          x = random_magnitude(rng, -10, 10);
        } else {
          x = uni(rng);
        }
        const size_t at = size_t(columnwise_only ? j * r + i : i * c + j);
        val[size_t(i * c + j)] = double(store_value(buf, d, at, x)) * double(scale_inv);
      }
    }
    t = make_tensor(d, {r, c}, columnwise_only ? nullptr : buf.data(), cpu(),
                    is_fp8_dtype(d) ? TE_SCALING_PER_TENSOR : TE_SCALING_NONE);
    if (columnwise_only) t.columnwise_data = buf.data();
    if (is_fp8_dtype(d)) t.scale_inv = &scale_inv;
  }
  Operand(const Operand&) = delete;
};

struct GemmCase {
  te_dtype a_dtype = TE_DTYPE_FLOAT32;
  te_dtype b_dtype = TE_DTYPE_FLOAT32;
  te_dtype d_dtype = TE_DTYPE_FLOAT32;
  bool transa = false, transb = false;
  te_gemm_epilogue epi = TE_GEMM_EPILOGUE_NONE;
  int64_t m = 7, n = 13, k = 5;
  float alpha = 1.0f, beta = 0.0f;
  te_dtype bias_dtype = TE_DTYPE_FLOAT32, aux_dtype = TE_DTYPE_FLOAT32, bias_grad_dtype = TE_DTYPE_FLOAT32;
  bool a_columnwise_only = false, b_columnwise_only = false;
  bool three_dim = false;  // B (untransposed), D and aux as [2, m/2, .] instead of [m, .]
  uint32_t seed = 1;
  float d_scale_headroom = 1.25f;  // FP8 D: scale = headroom * fp8_max / amax, so some values saturate
};

std::string describe(const GemmCase& c) {
  return std::string(dtype_str(c.a_dtype)) + " x " + dtype_str(c.b_dtype) + " -> " +
         dtype_str(c.d_dtype) + (c.transa ? " T" : " N") + (c.transb ? "T" : "N") + " " + epilogue_str(c.epi) +
         " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) + " bias " +
         dtype_str(c.bias_dtype) + " aux " + dtype_str(c.aux_dtype) + " bias_grad " + dtype_str(c.bias_grad_dtype) +
         (c.a_columnwise_only ? " A-colwise" : "") + (c.b_columnwise_only ? " B-colwise" : "") +
         (c.three_dim ? " 3-D" : "");
}

// Counts and reports the first few mismatches of one output.
struct Checker {
  const char* what;
  int bad = 0;
  void expect_close(size_t i, double got, double want, double tol) {
    const bool ok = std::isnan(want) ? std::isnan(got) : std::fabs(got - want) <= tol;
    if (!ok && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got << ", want " << want << " (|diff| "
                    << std::fabs(got - want) << " > tol " << tol << ")";
    }
  }
  ~Checker() { EXPECT_EQ(bad, 0) << what << ": mismatching elements"; }
};

struct GemmResult {
  int saturated = 0;  // FP8 D elements that had to saturate
};

// Runs one GEMM on fresh random inputs with poisoned outputs and checks every
// output against the float64 reference, and that nothing is written past the
// ends or where the epilogue must not write.
GemmResult run_case(const GemmCase& c) {
  SCOPED_TRACE(describe(c));
  GemmResult res;
  const int64_t m = c.m, n = c.n, k = c.k;
  std::mt19937 rng(c.seed);
  // op_A(A) [k, n]: A stored [n, k] when transa; op_B(B) [m, k]: B stored [k, m] when transb
  Operand A(c.a_dtype, c.transa ? n : k, c.transa ? k : n, c.a_columnwise_only, 0.3f, rng);
  Operand B(c.b_dtype, c.transb ? k : m, c.transb ? m : k, c.b_columnwise_only, 1.7f, rng);
  auto op_a = [&](int64_t kk, int64_t j) { return c.transa ? A.val[size_t(j * k + kk)] : A.val[size_t(kk * n + j)]; };
  auto op_b = [&](int64_t i, int64_t kk) { return c.transb ? B.val[size_t(kk * m + i)] : B.val[size_t(i * k + kk)]; };

  const bool fp8_out = is_fp8_dtype(c.d_dtype);
  const size_t mn = size_t(m * n);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);

  // D: old values when beta != 0, else NaN everywhere (the op must not read it)
  Buffer D(mn * elem_size(c.d_dtype));
  std::vector<double> d_old(mn, 0.0);
  for (size_t i = 0; i < mn; ++i) {
    if (c.beta != 0.0f) {
      d_old[i] = store_value(D, c.d_dtype, i, 3.0f * uni(rng));
    } else {
      store_value(D, c.d_dtype, i, NAN);
    }
  }
  Buffer bias(size_t(n) * elem_size(c.bias_dtype));
  std::vector<double> bias_val(size_t(n), 0.0);
  if (uses_bias(c.epi))
    for (int64_t j = 0; j < n; ++j) bias_val[size_t(j)] = store_value(bias, c.bias_dtype, size_t(j), uni(rng));
  Buffer aux(mn * elem_size(c.aux_dtype));
  std::vector<double> aux_in(mn, 0.0);
  if (reads_aux(c.epi))
    for (size_t i = 0; i < mn; ++i) aux_in[i] = store_value(aux, c.aux_dtype, i, 4.0f * uni(rng));
  const std::vector<uint8_t> aux_before = aux.mem;
  const int64_t bias_grad_len = c.epi == TE_GEMM_EPILOGUE_BGRAD ? m : n;
  Buffer bias_grad(size_t(bias_grad_len) * elem_size(c.bias_grad_dtype));

  // the float64 reference, with each element's error scale
  std::vector<double> ref_d(mn), ref_aux(mn), scale_d(mn);
  std::vector<double> ref_bg(size_t(bias_grad_len), 0.0), tol_bg(size_t(bias_grad_len), 0.0);
  const double rel = std::max(1e-5, double(k) * kU32);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const size_t e = size_t(i * n + j);
      double sum = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        sum += op_b(i, kk) * op_a(kk, j);
        mag += std::fabs(op_b(i, kk) * op_a(kk, j));
      }
      double t = double(c.alpha) * sum + double(c.beta) * d_old[e];
      double M = std::fabs(double(c.alpha)) * mag + std::fabs(double(c.beta) * d_old[e]);
      if (uses_bias(c.epi)) {
        t += bias_val[size_t(j)];
        M += std::fabs(bias_val[size_t(j)]);
      }
      M = 1.2 * M + std::fabs(t);
      double d = t;
      if (writes_aux(c.epi)) {
        ref_aux[e] = t;
        d = ref_gelu(t);
      } else if (reads_aux(c.epi)) {
        d = t * ref_gelu_grad(aux_in[e]);
      }
      ref_d[e] = d;
      scale_d[e] = M;
      if (c.epi == TE_GEMM_EPILOGUE_DGELU_BGRAD) {
        ref_bg[size_t(j)] += d;
        // the elements' own errors plus those of an fp32 sum over m of them
        tol_bg[size_t(j)] += rel * M + double(m + 2) * kU32 * std::fabs(d);
      }
    }
  }
  if (c.epi == TE_GEMM_EPILOGUE_BGRAD) {
    for (int64_t i = 0; i < m; ++i) {
      double mag = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        ref_bg[size_t(i)] += op_b(i, kk);
        mag += std::fabs(op_b(i, kk));
      }
      tol_bg[size_t(i)] = rel * 1.2 * mag;
    }
  }

  // FP8 D: a scale that makes the largest values saturate
  double ref_amax = 0.0, max_scale = 0.0;
  for (size_t e = 0; e < mn; ++e) {
    ref_amax = std::max(ref_amax, std::fabs(ref_d[e]));
    max_scale = std::max(max_scale, scale_d[e]);
  }
  float d_scale = 1.0f, d_scale_inv = f32(0xABABABABu), d_amax = 12345.0f;
  if (fp8_out && ref_amax > 0) {
    d_scale = float(c.d_scale_headroom * ref_max_finite(format_of(c.d_dtype)) / ref_amax);
  }

  te_tensor td = make_tensor(c.d_dtype, {m, n}, D.data(), cpu(), fp8_out ? TE_SCALING_PER_TENSOR : TE_SCALING_NONE);
  if (fp8_out) {
    td.scale = &d_scale;
    td.scale_inv = &d_scale_inv;
    td.amax = &d_amax;
  }
  te_tensor tbias = make_tensor(c.bias_dtype, {n}, bias.data());
  te_tensor taux = make_tensor(c.aux_dtype, {m, n}, aux.data());
  te_tensor tbg = make_tensor(c.bias_grad_dtype, {bias_grad_len}, bias_grad.data());
  if (c.three_dim) {
    EXPECT_TRUE(m % 2 == 0 && !c.transb) << "bad test case";
    B.t.ndim = td.ndim = taux.ndim = 3;
    B.t.shape[0] = td.shape[0] = taux.shape[0] = 2;
    B.t.shape[1] = td.shape[1] = taux.shape[1] = m / 2;
    B.t.shape[2] = k;
    td.shape[2] = taux.shape[2] = n;
  }
  const te_gemm_config cfg{c.transa, c.transb, int32_t(c.epi), c.alpha, c.beta, 0};
  const te_status st = te_gemm(&A.t, &B.t, &td, uses_bias(c.epi) ? &tbias : nullptr,
                               writes_aux(c.epi) || reads_aux(c.epi) ? &taux : nullptr,
                               uses_bias_grad(c.epi) ? &tbg : nullptr, &cfg, nullptr, 0, nullptr);
  EXPECT_EQ(st, TE_SUCCESS) << last_error();
  if (st != TE_SUCCESS) return res;

  if (!fp8_out) {
    Checker chk{"D"};
    for (size_t e = 0; e < mn; ++e) {
      const double got = read_value(D, c.d_dtype, e);
      chk.expect_close(e, got, ref_d[e],
                       rel * scale_d[e] + output_ulp(c.d_dtype, std::max(std::fabs(ref_d[e]), std::fabs(got))));
    }
  } else {
    const Format& f = format_of(c.d_dtype);
    const double fmax = ref_max_finite(f);
    Checker chk{"D (fp8, scaled)"};
    for (size_t e = 0; e < mn; ++e) {
      const double got = ref_decode(f, load_code(D, c.d_dtype, e));
      const double want = ref_d[e] * d_scale;
      const double tol_fp32 = rel * scale_d[e] * d_scale;
      if (std::fabs(want) > fmax + tol_fp32) {  // must saturate to the largest finite value, no further
        ++res.saturated;
        chk.expect_close(e, got, std::copysign(fmax, want), 0.0);
      } else {
        const double clamped = std::max(-fmax, std::min(fmax, want));
        chk.expect_close(e, got, clamped, grid_step(f, std::max(std::fabs(clamped), std::fabs(got))) + tol_fp32);
      }
    }
    EXPECT_NEAR(d_amax, ref_amax, rel * max_scale) << "D.amax";
    EXPECT_EQ(bits_of(d_scale_inv), 0xABABABABu) << "D.scale_inv must not be written";
  }
  EXPECT_TRUE(D.guard_intact()) << "D written past its end";

  if (writes_aux(c.epi)) {
    Checker chk{"aux"};
    for (size_t e = 0; e < mn; ++e) {
      const double got = read_value(aux, c.aux_dtype, e);
      chk.expect_close(e, got, ref_aux[e],
                       rel * scale_d[e] + output_ulp(c.aux_dtype, std::max(std::fabs(ref_aux[e]), std::fabs(got))));
    }
    EXPECT_TRUE(aux.guard_intact()) << "aux written past its end";
  } else {
    EXPECT_TRUE(aux.mem == aux_before) << "aux must not be written with epilogue " << epilogue_str(c.epi);
  }

  if (uses_bias_grad(c.epi)) {
    Checker chk{"bias_grad"};
    for (int64_t i = 0; i < bias_grad_len; ++i) {
      const double got = read_value(bias_grad, c.bias_grad_dtype, size_t(i));
      chk.expect_close(size_t(i), got, ref_bg[size_t(i)],
                       tol_bg[size_t(i)] +
                           output_ulp(c.bias_grad_dtype, std::max(std::fabs(ref_bg[size_t(i)]), std::fabs(got))));
    }
    EXPECT_TRUE(bias_grad.guard_intact()) << "bias_grad written past its end";
  } else {
    EXPECT_TRUE(bias_grad.all_poison()) << "bias_grad must not be written with epilogue " << epilogue_str(c.epi);
  }
  return res;
}

// ---------------------------------------------------------------------------

TEST(GeluHeader, MatchesFloat64Formula) {
  for (int i = -4000; i <= 4000; ++i) {
    const float x = float(i) * 0.0025f;  // [-10, 10]
    const double xd = x;
    // fp32 evaluation error: a few ulps of the terms; |x| * du/dx bounds the
    // derivative's sech^2 term
    const double tol_g = 8 * kU32 * (std::fabs(xd) + 1e-30);
    const double tol_dg = 8 * kU32 * (1.0 + std::fabs(xd) * (1.0 + 0.134 * xd * xd));
    EXPECT_NEAR(opente::gelu_tanh(x), ref_gelu(xd), tol_g) << "x=" << x;
    EXPECT_NEAR(opente::gelu_tanh_grad(x), ref_gelu_grad(xd), tol_dg) << "x=" << x;
  }
  // the float64 derivative is the derivative of the float64 gelu (central differences)
  for (double x = -6.0; x <= 6.0; x += 0.37) {
    const double h = 1e-5;
    EXPECT_NEAR(ref_gelu_grad(x), (ref_gelu(x + h) - ref_gelu(x - h)) / (2 * h), 1e-8) << "x=" << x;
  }
  // known values: gelu(0) = 0, gelu'(0) = 1/2, gelu(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715))
  EXPECT_EQ(opente::gelu_tanh(0.0f), 0.0f);
  EXPECT_EQ(opente::gelu_tanh_grad(0.0f), 0.5f);
  EXPECT_NEAR(opente::gelu_tanh(1.0f), 0.8411919906082768, 1e-6);
  // the far tails stay finite: gelu -> x or 0, gelu' -> 1 or 0
  for (float x : {30.0f, 1e10f, 1e20f, 3e38f}) {
    EXPECT_EQ(opente::gelu_tanh(x), x);
    EXPECT_EQ(opente::gelu_tanh_grad(x), 1.0f);
    EXPECT_EQ(opente::gelu_tanh(-x), 0.0f);
    EXPECT_EQ(opente::gelu_tanh_grad(-x), 0.0f);
  }
}

// fp32 in and out, every layout and every epilogue, odd non-square shapes.
TEST(Gemm, Fp32AllLayoutsAllEpilogues) {
  uint32_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (te_gemm_epilogue epi : kEpilogues) {
        GemmCase c;
        c.transa = ta, c.transb = tb, c.epi = epi, c.seed = seed++;
        c.alpha = 0.75f;
        run_case(c);
        c.m = 13, c.n = 7, c.k = 19, c.alpha = -1.5f, c.seed = seed++;
        run_case(c);
      }
}

// bf16 / fp16 inputs with same-dtype and fp32 outputs; bias, aux and bias_grad
// in the input dtype (as Transformer Engine passes them).
TEST(Gemm, HalfPrecisionInputsAllLayoutsAllEpilogues) {
  uint32_t seed = 100;
  for (te_dtype in : {TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT16})
    for (te_dtype out : {in, TE_DTYPE_FLOAT32})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (te_gemm_epilogue epi : kEpilogues) {
            GemmCase c;
            c.a_dtype = c.b_dtype = in, c.d_dtype = out;
            c.bias_dtype = c.aux_dtype = c.bias_grad_dtype = in;
            c.transa = ta, c.transb = tb, c.epi = epi, c.seed = seed++;
            c.m = 7, c.n = 13, c.k = 37;
            run_case(c);
          }
}

// Epilogue tensors in dtypes other than D's (fp32 bias into a bf16 D, fp32 aux
// and bias_grad with fp16 inputs ...).
TEST(Gemm, MixedEpilogueDtypes) {
  uint32_t seed = 200;
  for (te_gemm_epilogue epi : kEpilogues) {
    GemmCase c;
    c.a_dtype = c.b_dtype = TE_DTYPE_BFLOAT16, c.d_dtype = TE_DTYPE_BFLOAT16;
    c.bias_dtype = c.aux_dtype = c.bias_grad_dtype = TE_DTYPE_FLOAT32;
    c.epi = epi, c.transa = true, c.seed = seed++;
    run_case(c);
    c.a_dtype = c.b_dtype = TE_DTYPE_FLOAT16, c.d_dtype = TE_DTYPE_FLOAT32;
    c.bias_dtype = c.aux_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
    c.seed = seed++;
    run_case(c);
  }
}

// beta = 1 into an existing fp32 D (fuse_wgrad_accumulation: the wgrad "NT"
// GEMM of bf16 operands), every layout and epilogue; and beta = 0.5 into bf16 D.
TEST(Gemm, BetaAccumulatesIntoExistingD) {
  uint32_t seed = 300;
  for (te_dtype in : {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (te_gemm_epilogue epi : kEpilogues) {
          GemmCase c;
          c.a_dtype = c.b_dtype = in, c.d_dtype = TE_DTYPE_FLOAT32;
          c.transa = ta, c.transb = tb, c.epi = epi, c.beta = 1.0f, c.seed = seed++;
          c.m = 9, c.n = 11, c.k = 23;
          run_case(c);
        }
  for (te_gemm_epilogue epi : kEpilogues) {
    GemmCase c;
    c.a_dtype = c.b_dtype = c.d_dtype = TE_DTYPE_BFLOAT16;
    c.bias_dtype = c.aux_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
    c.epi = epi, c.alpha = 2.0f, c.beta = 0.5f, c.transb = true, c.seed = seed++;
    run_case(c);
  }
}

// beta = 1 adds the product to D exactly as D + P: hand-made values.
TEST(Gemm, BetaOneHandComputed) {
  // op_B(B) = [[1, 2], [3, 4]] (m=2, k=2), op_A(A) = [[1, 0, 2], [0, 1, -1]] (k=2, n=3)
  std::vector<float> b = {1, 2, 3, 4}, a = {1, 0, 2, 0, 1, -1};
  std::vector<float> d = {10, 20, 30, 40, 50, 60};
  te_tensor ta = make_tensor(TE_DTYPE_FLOAT32, {2, 3}, a.data());
  te_tensor tb = make_tensor(TE_DTYPE_FLOAT32, {2, 2}, b.data());
  te_tensor td = make_tensor(TE_DTYPE_FLOAT32, {2, 3}, d.data());
  const te_gemm_config cfg{0, 0, TE_GEMM_EPILOGUE_NONE, 1.0f, 1.0f, 0};
  ASSERT_EQ(te_gemm(&ta, &tb, &td, nullptr, nullptr, nullptr, &cfg, nullptr, 0, nullptr), TE_SUCCESS)
      << last_error();
  // P = [[1, 2, 0], [3, 4, 2]]
  EXPECT_EQ(d, (std::vector<float>{11, 22, 30, 43, 54, 62}));
}

// The CPU reference sums each output element in order of k from 0, one fp32 product
// and one fp32 add at a time: its result equals that loop's bit for bit, whatever the
// layouts (the loop order inside the reference may change; this order may not).
// The second shape is large enough to be split over threads by columns (where the
// machine has more than one core): the split must not change a bit either.
TEST(Gemm, Fp32SumsInOrderOfK) {
  std::mt19937 rng(4242);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{5, 37, 300}, {67, 259, 243}})
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<float> a(size_t(k * n)), b(size_t(m * k)), d(size_t(m * n), -1.0f);
      for (float& v : a) v = dist(rng);
      for (float& v : b) v = dist(rng);
      // op_A(A)[kk, j] and op_B(B)[i, kk] from their storage
      auto op_a = [&](int64_t kk, int64_t j) { return ta ? a[size_t(j * k + kk)] : a[size_t(kk * n + j)]; };
      auto op_b = [&](int64_t i, int64_t kk) { return tb ? b[size_t(kk * m + i)] : b[size_t(i * k + kk)]; };
      te_tensor tA = ta ? make_tensor(TE_DTYPE_FLOAT32, {n, k}, a.data()) : make_tensor(TE_DTYPE_FLOAT32, {k, n}, a.data());
      te_tensor tB = tb ? make_tensor(TE_DTYPE_FLOAT32, {k, m}, b.data()) : make_tensor(TE_DTYPE_FLOAT32, {m, k}, b.data());
      te_tensor tD = make_tensor(TE_DTYPE_FLOAT32, {m, n}, d.data());
      const te_gemm_config cfg{ta ? 1 : 0, tb ? 1 : 0, TE_GEMM_EPILOGUE_NONE, 1.0f, 0.0f, 0};
      ASSERT_EQ(te_gemm(&tA, &tB, &tD, nullptr, nullptr, nullptr, &cfg, nullptr, 0, nullptr), TE_SUCCESS)
          << last_error();
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          volatile float acc = 0.0f;  // volatile: one rounding per product and per add, no contraction
          for (int64_t kk = 0; kk < k; ++kk) {
            volatile float product = op_b(i, kk) * op_a(kk, j);
            acc = acc + product;
          }
          ASSERT_EQ(d[size_t(i * n + j)], float(acc)) << "ta " << ta << " tb " << tb << " at " << i << ", " << j;
        }
    }
}

// FP8 inputs (every allowed pair) with bf16 and fp32 outputs, every layout and
// epilogue; shapes are multiples of 16 as the FP8 GEMM requires.
TEST(Gemm, Fp8InputsHighPrecisionOutput) {
  const std::pair<te_dtype, te_dtype> pairs[] = {{TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E4M3},
                                                 {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2},
                                                 {TE_DTYPE_FLOAT8_E5M2, TE_DTYPE_FLOAT8_E4M3}};
  uint32_t seed = 400;
  for (const auto& ab : pairs)
    for (te_dtype out : {TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT32})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (te_gemm_epilogue epi : kEpilogues) {
            GemmCase c;
            c.a_dtype = ab.first, c.b_dtype = ab.second, c.d_dtype = out;
            c.bias_dtype = c.aux_dtype = c.bias_grad_dtype = out;
            c.transa = ta, c.transb = tb, c.epi = epi, c.seed = seed++;
            c.m = 32, c.n = 48, c.k = 64, c.alpha = 0.5f;
            run_case(c);
          }
}

// FP8 output: amax of the result before scaling, codes within one FP8 step,
// the largest values saturated; aux in bf16. FP8 and bf16 inputs.
TEST(Gemm, Fp8Output) {
  const std::pair<te_dtype, te_dtype> pairs[] = {{TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E4M3},
                                                 {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2},
                                                 {TE_DTYPE_FLOAT8_E5M2, TE_DTYPE_FLOAT8_E4M3},
                                                 {TE_DTYPE_BFLOAT16, TE_DTYPE_BFLOAT16}};
  uint32_t seed = 500;
  int saturated = 0;
  for (const auto& ab : pairs)
    for (te_dtype out : {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (te_gemm_epilogue epi : kEpilogues) {
            GemmCase c;
            c.a_dtype = ab.first, c.b_dtype = ab.second, c.d_dtype = out;
            c.bias_dtype = c.aux_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
            c.transa = ta, c.transb = tb, c.epi = epi, c.seed = seed++;
            c.m = 16, c.n = 32, c.k = 48;
            saturated += run_case(c).saturated;
          }
  EXPECT_GT(saturated, 0) << "no case exercised saturation";
}

// Column-wise-only operands (data null, the transposed copy set): the op reads
// the copy. FP8 and bf16, every layout, each operand alone and both.
TEST(Gemm, ColumnwiseOnlyOperands) {
  uint32_t seed = 600;
  for (te_dtype in : {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_BFLOAT16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int which : {1, 2, 3}) {
          GemmCase c;
          c.a_dtype = c.b_dtype = in;
          c.d_dtype = TE_DTYPE_FLOAT32;
          c.transa = ta, c.transb = tb, c.seed = seed++;
          c.a_columnwise_only = which & 1, c.b_columnwise_only = which & 2;
          c.epi = which == 3 ? TE_GEMM_EPILOGUE_BGRAD : TE_GEMM_EPILOGUE_BIAS;
          if (in == TE_DTYPE_FLOAT8_E4M3) c.m = 16, c.n = 32, c.k = 48;
          run_case(c);
        }
}

// Tensors of more than two dims are flattened to [d0*...*dn-2, dn-1].
TEST(Gemm, ThreeDimensionalOperandsFlatten) {
  uint32_t seed = 700;
  for (te_gemm_epilogue epi : kEpilogues) {
    GemmCase c;
    c.a_dtype = c.b_dtype = TE_DTYPE_BFLOAT16, c.d_dtype = TE_DTYPE_BFLOAT16;
    c.aux_dtype = c.bias_grad_dtype = c.bias_dtype = TE_DTYPE_BFLOAT16;
    c.transa = true, c.m = 10, c.n = 6, c.k = 9, c.three_dim = true, c.epi = epi, c.seed = seed++;
    run_case(c);
  }
}

// k = 0: the product is 0 and the epilogue still applies (D = bias, gelu(bias),
// beta * D, ...; BGRAD's bias_grad = 0).
TEST(Gemm, EmptyInnerDimension) {
  uint32_t seed = 800;
  for (te_gemm_epilogue epi : kEpilogues) {
    for (float beta : {0.0f, 1.0f}) {
      GemmCase c;
      c.m = 5, c.n = 6, c.k = 0, c.epi = epi, c.beta = beta, c.seed = seed++;
      run_case(c);
    }
    GemmCase c;  // FP8 inputs, k = 0 (a multiple of 16), FP8 output
    c.a_dtype = c.b_dtype = TE_DTYPE_FLOAT8_E4M3, c.d_dtype = TE_DTYPE_FLOAT8_E4M3;
    c.aux_dtype = c.bias_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
    c.m = 16, c.n = 16, c.k = 0, c.epi = epi, c.seed = seed++;
    run_case(c);
  }
}

// m = 0 or n = 0: no D elements. DGELU_BGRAD's bias_grad [n] with m = 0 is a sum
// over no rows: zeros; FP8 D's amax over no elements: 0.
TEST(Gemm, EmptyOutput) {
  uint32_t seed = 900;
  for (te_gemm_epilogue epi : kEpilogues) {
    if (epi == TE_GEMM_EPILOGUE_BGRAD) continue;  // see EmptyOutputBgradStillSumsB
    for (auto mnk : {std::vector<int64_t>{0, 6, 4}, {5, 0, 4}, {0, 0, 3}, {0, 6, 0}}) {
      GemmCase c;
      c.m = mnk[0], c.n = mnk[1], c.k = mnk[2], c.epi = epi, c.seed = seed++;
      run_case(c);
    }
    GemmCase c;
    c.a_dtype = c.b_dtype = TE_DTYPE_FLOAT8_E4M3, c.d_dtype = TE_DTYPE_FLOAT8_E5M2;
    c.aux_dtype = c.bias_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
    c.m = 0, c.n = 32, c.k = 16, c.epi = epi, c.seed = seed++;
    run_case(c);
  }
  GemmCase c;  // BGRAD with m = 0: bias_grad has no elements
  c.m = 0, c.n = 4, c.k = 3, c.epi = TE_GEMM_EPILOGUE_BGRAD;
  run_case(c);
}

// BGRAD with n = 0 still has bias_grad[m] = sum over k of op_B(B)[m, k] (the
// header defines it from B alone), for every layout and column-wise-only B.
TEST(Gemm, EmptyOutputBgradStillSumsB) {
  uint32_t seed = 1000;
  for (bool tb : {false, true})
    for (bool colwise : {false, true}) {
      GemmCase c;
      c.m = 5, c.n = 0, c.k = 4, c.epi = TE_GEMM_EPILOGUE_BGRAD, c.transb = tb, c.b_columnwise_only = colwise;
      c.seed = seed++;
      run_case(c);
      c.a_dtype = c.b_dtype = TE_DTYPE_FLOAT8_E4M3, c.d_dtype = TE_DTYPE_BFLOAT16;
      c.m = 16, c.k = 32, c.seed = seed++;
      run_case(c);
    }
}

// Every epilogue at a size the CPU reference splits over threads by columns (more
// than 2^22 multiply-adds, n >= 128): the column slices' bias gradients and FP8 amax
// come out as the reference's.
TEST(Gemm, LargeEnoughForThreadsAllEpilogues) {
  uint32_t seed = 1200;
  for (te_gemm_epilogue epi : kEpilogues) {
    GemmCase c;
    c.a_dtype = c.b_dtype = TE_DTYPE_BFLOAT16, c.d_dtype = TE_DTYPE_BFLOAT16;
    c.aux_dtype = c.bias_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
    c.m = 64, c.n = 272, c.k = 256, c.epi = epi, c.seed = seed++;
    run_case(c);
  }
  GemmCase c;
  c.a_dtype = c.b_dtype = TE_DTYPE_FLOAT8_E4M3, c.d_dtype = TE_DTYPE_FLOAT8_E4M3;
  c.bias_dtype = TE_DTYPE_BFLOAT16, c.epi = TE_GEMM_EPILOGUE_BIAS, c.transa = true;
  c.m = 64, c.n = 272, c.k = 256, c.seed = seed++;
  run_case(c);
}

// A larger bf16 GEMM (long k): the fp32 accumulation stays within the bound.
TEST(Gemm, LargerBf16) {
  GemmCase c;
  c.a_dtype = c.b_dtype = TE_DTYPE_BFLOAT16, c.d_dtype = TE_DTYPE_BFLOAT16;
  c.aux_dtype = c.bias_dtype = c.bias_grad_dtype = TE_DTYPE_BFLOAT16;
  c.transa = true, c.m = 67, c.n = 45, c.k = 301, c.epi = TE_GEMM_EPILOGUE_GELU_AUX_BIAS, c.seed = 1100;
  run_case(c);
  c.d_dtype = TE_DTYPE_FLOAT32, c.epi = TE_GEMM_EPILOGUE_DGELU_BGRAD, c.transb = true, c.seed = 1101;
  run_case(c);
}

// NaN in an FP8 operand makes its column of D NaN; amax skips NaN.
TEST(Gemm, Fp8NanPropagatesAndAmaxSkipsIt) {
  const int64_t m = 16, n = 16, k = 16;
  const uint8_t kOne = uint8_t(ref_encode(kE4M3, 1.0)), kHalf = uint8_t(ref_encode(kE4M3, 0.5));
  std::vector<uint8_t> b(size_t(m * k), kOne);   // op_B(B) [m, k] = 1
  std::vector<uint8_t> a(size_t(n * k), kHalf);  // A stored [n, k] (transa), op_A(A) = 0.5
  a[size_t(3 * k + 5)] = 0x7f;                   // E4M3 NaN at op_A(A)[5, 3]
  float sa = 1.0f, sb = 1.0f, d_scale = 2.0f, amax = -1.0f;
  Buffer d(size_t(m * n));
  te_tensor ta = make_tensor(TE_DTYPE_FLOAT8_E4M3, {n, k}, a.data(), cpu(), TE_SCALING_PER_TENSOR);
  te_tensor tb = make_tensor(TE_DTYPE_FLOAT8_E4M3, {m, k}, b.data(), cpu(), TE_SCALING_PER_TENSOR);
  te_tensor td = make_tensor(TE_DTYPE_FLOAT8_E4M3, {m, n}, d.data(), cpu(), TE_SCALING_PER_TENSOR);
  ta.scale_inv = &sa, tb.scale_inv = &sb, td.scale = &d_scale, td.amax = &amax;
  const te_gemm_config cfg{1, 0, TE_GEMM_EPILOGUE_NONE, 1.0f, 0.0f, 0};
  ASSERT_EQ(te_gemm(&ta, &tb, &td, nullptr, nullptr, nullptr, &cfg, nullptr, 0, nullptr), TE_SUCCESS)
      << last_error();
  EXPECT_EQ(amax, 8.0f);  // 16 * 1 * 0.5
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t got = d.get<uint8_t>(size_t(i * n + j));
      if (j == 3) {
        EXPECT_TRUE(std::isnan(ref_decode(kE4M3, got))) << i << "," << j;
      } else {
        EXPECT_EQ(got, ref_encode(kE4M3, 16.0)) << i << "," << j;  // 8 * scale 2
      }
    }
  EXPECT_TRUE(d.guard_intact());
}

}  // namespace
