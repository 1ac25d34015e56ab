// te_layernorm_fwd / te_layernorm_bwd / te_rmsnorm_fwd / te_rmsnorm_bwd against a
// float64 reference written here from the formulas of opente/norm.h.
//
// The core computes in fp32, so it differs from the float64 reference by rounding.
// Each element gets its own bound, derived from how the value is made (u = 2^-24,
// n = hidden, sums of n terms in fp32 err by at most (n-1) u sum|terms|; the bounds
// use 2 (n + 8) u to leave room for the few extra roundings around them):
//   mu      c_n * mean|x|
//   rsigma  relative 0.5 * (e_mu^2 + c_n (var + e_mu^2) + u (var + eps)) / (var + eps) + 3u
//   y       |g| (rsigma e_mu + |xhat| (e_rs + 2u)) + 3u |g xhat| + u |beta|,
//           then the rounding to the output dtype: half an ulp of |y| (plus half the
//           smallest subnormal step)
//   dx      rsigma (6u (|dyg| + |mean dyg| + |xhat mean(dyg xhat)|)
//                   + c_n (mean|dyg| + |xhat| mean|dyg xhat|)), then the rounding
//   dgamma  c_rows sum|dz xhat|, dbeta c_rows sum|dz|, then the rounding
// FP8 outputs: the code must be the cast of some value within the bound of y (times
// the scale, with the fp32 product's rounding), and nearly all codes must equal the
// cast of the reference. (Not "within one FP8 step of it": where x is close to mu,
// fp32's error in x - mu is absolute and can span many of FP8's small steps near
// zero.) On inputs built so that every step is exact, the codes, amax and scale_inv
// must be exact.
#include <algorithm>

#include "test_util.h"

namespace {

using namespace tt;

bool is_fp8_dtype(te_dtype d) { return d == TE_DTYPE_FLOAT8_E4M3 || d == TE_DTYPE_FLOAT8_E5M2; }

double accumulation_factor(int64_t n) { return 2.0 * double(n + 8) * kU; }

// Bound on |rounded - exact| when a value within `err` of `exact` is rounded to d.
double with_rounding(double exact, double err, te_dtype d) {
  return err + unit_roundoff(d) * (std::fabs(exact) + err) + half_min_step(d);
}

// Reads element i of a float buffer as its exact value.
double value_at(const Buffer& b, te_dtype d, size_t i) {
  if (d == TE_DTYPE_FLOAT32) return b.get<float>(i);
  return ref_decode(format_of(d), load_code(b, d, i));
}

// FP8 codes ordered as their values (NaN excluded): -127 ... -0 = +0 ... 127.
int fp8_ordinal(uint32_t code) { return (code & 0x80u) ? -int(code & 0x7fu) : int(code & 0x7fu); }

std::vector<float> stored_values(Buffer& b, te_dtype d, const std::vector<float>& raw) {
  std::vector<float> v(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) v[i] = store_value(b, d, i, raw[i]);
  return v;
}

// Rows of random magnitude and offset: x = offset_r + spread_r * N(0, 1).
std::vector<float> random_rows(std::mt19937& rng, int64_t rows, int64_t hidden) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> offset(-3.0f, 3.0f), log_spread(-3.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(rows * hidden));
  for (int64_t r = 0; r < rows; ++r) {
    const float o = offset(rng), s = std::exp2(log_spread(rng));
    for (int64_t c = 0; c < hidden; ++c) x[r * hidden + c] = o + s * normal(rng);
  }
  return x;
}

std::vector<float> random_normal(std::mt19937& rng, size_t n, float mean, float stddev) {
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> v(n);
  for (float& e : v) e = normal(rng);
  return v;
}

// ---------------------------------------------------------------------------
// The float64 reference.
// ---------------------------------------------------------------------------

struct RowStats {
  double mu, rsigma;
  double e_mu, e_rs;  // bounds: absolute on mu, relative on rsigma
};

RowStats ref_stats(bool layernorm, const float* x, int64_t n, float eps) {
  double sum = 0, sum_abs = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i], sum_abs += std::fabs(x[i]);
  const double mu = layernorm ? sum / double(n) : 0.0;
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) sq += (x[i] - mu) * (x[i] - mu);
  const double var = sq / double(n), v = var + double(eps);
  const double c = accumulation_factor(n);
  const double e_mu = layernorm ? c * sum_abs / double(n) : 0.0;
  const double e_var = e_mu * e_mu + c * (var + e_mu * e_mu) + kU * v;
  return {mu, 1.0 / std::sqrt(v), e_mu, 0.5 * e_var / v + 3 * kU};
}

double g_of(float gamma, bool zero_centered) { return double(gamma) + (zero_centered ? 1.0 : 0.0); }

// ---------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------

enum Layout { kRowwise = 1, kColumnwise = 2, kBoth = 3 };

struct FwdCase {
  bool layernorm;
  te_dtype in, w, out;
  std::vector<int64_t> shape;  // [..., hidden]
  float eps;
  bool zero_centered;
  uint32_t seed;
  Layout layout = kRowwise;    // FP8 outputs
  double scale_factor = 0.0;   // FP8: scale = fp8_max / max|y| * scale_factor (0: 0.77)
};

std::string describe_case(const FwdCase& k) {
  return std::string(k.layernorm ? "layernorm" : "rmsnorm") + " " + dtype_str(k.in) + " x, " + dtype_str(k.w) +
         " weights -> " + dtype_str(k.out) + " shape " + shape_str(k.shape) + " eps " + std::to_string(k.eps) +
         (k.zero_centered ? " zero-centered" : "");
}

int64_t rows_of(const std::vector<int64_t>& shape) { return numel_of(shape) / shape.back(); }

// Runs the forward on fresh random data with poisoned outputs; checks every output
// element against the reference bound, the statistics, FP8 amax / scale_inv and the
// guards past the ends. FP8 outputs: counts the row-wise codes, and those that differ
// from the cast of the reference.
struct CodeCount {
  int64_t codes = 0, differing = 0;
  void operator+=(const CodeCount& o) { codes += o.codes, differing += o.differing; }
};

CodeCount check_fwd(const FwdCase& k) {
  SCOPED_TRACE(describe_case(k));
  const int64_t hidden = k.shape.back(), rows = rows_of(k.shape), n = rows * hidden;
  std::mt19937 rng(k.seed);
  Buffer bx(size_t(n) * elem_size(k.in)), bg(size_t(hidden) * elem_size(k.w)), bb(size_t(hidden) * elem_size(k.w));
  const std::vector<float> x = stored_values(bx, k.in, random_rows(rng, rows, hidden));
  const std::vector<float> gamma =
      stored_values(bg, k.w, random_normal(rng, size_t(hidden), k.zero_centered ? 0.0f : 1.0f, 0.5f));
  const std::vector<float> beta = stored_values(bb, k.w, random_normal(rng, size_t(hidden), 0.0f, 1.0f));

  // reference y, its bound, the statistics
  std::vector<double> y(static_cast<size_t>(n)), err(static_cast<size_t>(n));
  std::vector<RowStats> stats(static_cast<size_t>(rows));
  double max_abs_y = 0, max_err = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowStats s = stats[r] = ref_stats(k.layernorm, &x[r * hidden], hidden, k.eps);
    for (int64_t c = 0; c < hidden; ++c) {
      const double g = g_of(gamma[c], k.zero_centered), b = k.layernorm ? beta[c] : 0.0;
      const double xhat = (x[r * hidden + c] - s.mu) * s.rsigma;
      y[r * hidden + c] = xhat * g + b;
      // 1.01: room for the second-order terms the first-order bound leaves out
      err[r * hidden + c] = 1.01 * (std::fabs(g) * (s.rsigma * s.e_mu + std::fabs(xhat) * (s.e_rs + 2 * kU)) +
                                    3 * kU * std::fabs(g * xhat) + kU * std::fabs(b));
      max_abs_y = std::max(max_abs_y, std::fabs(y[r * hidden + c]));
      max_err = std::max(max_err, err[r * hidden + c]);
    }
  }

  const bool fp8 = is_fp8_dtype(k.out);
  Buffer out(size_t(n) * elem_size(k.out)), out_t(fp8 ? size_t(n) : 0), mu(size_t(rows) * 4), rs(size_t(rows) * 4);
  const float fmax = k.out == TE_DTYPE_FLOAT8_E4M3 ? 448.0f : 57344.0f;
  float scale = max_abs_y > 0 ? float(fmax / max_abs_y * (k.scale_factor > 0 ? k.scale_factor : 0.77)) : 1.0f;
  const float amax_init = 1e-3f;
  float scale_inv = f32(0xABABABABu), amax = amax_init;
  te_tensor tx = make_tensor(k.in, k.shape, bx.data());
  te_tensor tg = make_tensor(k.w, {hidden}, bg.data());
  te_tensor tb = make_tensor(k.w, {hidden}, bb.data());
  te_tensor tmu = make_tensor(TE_DTYPE_FLOAT32, {rows}, mu.data());
  te_tensor trs = make_tensor(TE_DTYPE_FLOAT32, {rows}, rs.data());
  te_tensor ty = make_tensor(k.out, k.shape, (!fp8 || (k.layout & kRowwise)) ? out.data() : nullptr, cpu(),
                             fp8 ? TE_SCALING_PER_TENSOR : TE_SCALING_NONE);
  if (fp8) {
    ty.columnwise_data = (k.layout & kColumnwise) ? out_t.data() : nullptr;
    ty.scale = &scale;
    ty.scale_inv = &scale_inv;
    ty.amax = &amax;
  } else {
    ty.amax = &amax;  // a float y's amax: max|y| as stored (for a current-scaling cast of it)
  }
  const te_status st = k.layernorm
                           ? te_layernorm_fwd(&tx, &tg, &tb, k.eps, k.zero_centered, &ty, &tmu, &trs, nullptr, 0,
                                              nullptr)
                           : te_rmsnorm_fwd(&tx, &tg, k.eps, k.zero_centered, &ty, &trs, nullptr, 0, nullptr);
  EXPECT_EQ(st, TE_SUCCESS) << last_error();
  CodeCount count;
  if (st != TE_SUCCESS) return count;

  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const RowStats& s = stats[r];
    if (k.layernorm && !(std::fabs(mu.get<float>(r) - s.mu) <= s.e_mu + 1e-45) && bad++ < 5)
      ADD_FAILURE() << "mu[" << r << "] = " << mu.get<float>(r) << ", want " << s.mu << " +- " << s.e_mu;
    if (!(std::fabs(rs.get<float>(r) - s.rsigma) <= s.e_rs * s.rsigma) && bad++ < 5)
      ADD_FAILURE() << "rsigma[" << r << "] = " << rs.get<float>(r) << ", want " << s.rsigma << " +- "
                    << s.e_rs * s.rsigma;
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < hidden; ++c) {
      const size_t i = size_t(r * hidden + c);
      if (!fp8) {
        const double got = value_at(out, k.out, i), allowed = with_rounding(y[i], err[i], k.out);
        if (!(std::fabs(got - y[i]) <= allowed) && bad++ < 5)
          ADD_FAILURE() << "y[" << r << "," << c << "] = " << got << ", want " << y[i] << " +- " << allowed;
        continue;
      }
      // the cast of y * scale for y anywhere within the bound; the fp32 product
      // rounds by half an ulp
      const Format& f = format_of(k.out);
      const double lo = (y[i] - err[i]) * scale, hi = (y[i] + err[i]) * scale;
      const int o_lo = fp8_ordinal(ref_encode(f, lo - std::fabs(lo) * kU));
      const int o_hi = fp8_ordinal(ref_encode(f, hi + std::fabs(hi) * kU));
      const int o_ref = fp8_ordinal(ref_encode(f, y[i] * scale));
      for (int layout : {kRowwise, kColumnwise}) {
        if (!(k.layout & layout)) continue;
        const uint32_t code = layout == kRowwise ? out.get<uint8_t>(i) : out_t.get<uint8_t>(size_t(c * rows + r));
        const int o = fp8_ordinal(code);
        if (!(o_lo <= o && o <= o_hi) && bad++ < 5)
          ADD_FAILURE() << (layout == kRowwise ? "rowwise" : "columnwise") << " y[" << r << "," << c << "] code 0x"
                        << std::hex << code << std::dec << " (" << ref_decode(f, code) << "), want the cast of "
                        << y[i] * scale << " +- " << err[i] * scale;
        if (layout == kRowwise) count += {1, o != o_ref};
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of bounds";
  EXPECT_TRUE(out.guard_intact() && out_t.guard_intact() && mu.guard_intact() && rs.guard_intact())
      << "written past the end of an output";
  if (!k.layernorm) {
    EXPECT_TRUE(mu.all_poison());
  }
  if (fp8) {
    if (!(k.layout & kRowwise)) EXPECT_TRUE(out.all_poison());
    if (!(k.layout & kColumnwise)) EXPECT_TRUE(out_t.all_poison());
    const double want_amax = std::max(double(amax_init), max_abs_y);
    EXPECT_LE(std::fabs(double(amax) - want_amax), max_err * (1 + kU)) << "amax " << amax << " want " << want_amax;
    EXPECT_EQ(scale_inv, float(1.0 / double(scale)));
  } else {
    EXPECT_EQ(bits_of(scale_inv), 0xABABABABu);  // not an FP8 output: no scale_inv
    double stored_max = amax_init;
    for (int64_t i = 0; i < n; ++i) stored_max = std::fmax(stored_max, std::fabs(value_at(out, k.out, size_t(i))));
    EXPECT_EQ(double(amax), stored_max) << "a float y's amax: the max of |y| as stored";
  }
  return count;
}

const te_dtype kFloats[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};

// Every input x weight dtype pair, output in the input's dtype, over hidden sizes
// from 64 to 4096 (powers of two and not) and 1, 3 and 37 rows.
TEST(Norm, ForwardDtypesAndSizes) {
  uint32_t seed = 1;
  for (bool ln : {true, false})
    for (te_dtype in : kFloats)
      for (te_dtype w : kFloats)
        for (int64_t hidden : {64, 127, 768, 1000, 4096})
          for (int64_t rows : {1, 3, 37}) check_fwd({ln, in, w, in, {rows, hidden}, 1e-5f, false, seed++});
}

TEST(Norm, ForwardLargeHidden) {
  uint32_t seed = 500;
  for (bool ln : {true, false})
    for (te_dtype in : kFloats) {
      check_fwd({ln, in, TE_DTYPE_FLOAT32, in, {2, 16384}, 1e-5f, false, seed++});
      check_fwd({ln, in, in, in, {3, 16383}, 1e-6f, true, seed++});
    }
}

// An output dtype other than the input's; zero-centered gamma; eps from 0 to large
// (eps = 1 dominates the variance of rows with small spread); leading dims.
TEST(Norm, ForwardOutputDtypeEpsZeroCenteredShapes) {
  uint32_t seed = 1000;
  for (bool ln : {true, false}) {
    for (te_dtype in : kFloats)
      for (te_dtype out : kFloats)
        if (out != in) check_fwd({ln, in, TE_DTYPE_BFLOAT16, out, {5, 200}, 1e-5f, false, seed++});
    for (bool zc : {false, true})
      for (float eps : {0.0f, 1e-12f, 1e-5f, 1e-2f, 1.0f})
        check_fwd({ln, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, {7, 96}, eps, zc, seed++});
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{96}, {2, 3, 64}, {1, 2, 1, 65}})
      check_fwd({ln, TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT32, shape, 1e-5f, true, seed++});
  }
}

// Fused norm + FP8 cast: both formats, every layout, scales that saturate part of
// the output and ones that push part of it into the subnormals.
TEST(Norm, ForwardFp8Output) {
  uint32_t seed = 2000;
  CodeCount count;
  for (bool ln : {true, false})
    for (te_dtype out : {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2})
      for (te_dtype in : kFloats) {
        for (Layout l : {kRowwise, kColumnwise, kBoth})
          count += check_fwd({ln, in, TE_DTYPE_FLOAT32, out, {37, 1000}, 1e-5f, ln, seed++, l});
        for (double f : {4.0, 1e-3})
          count += check_fwd({ln, in, in, out, {3, 127}, 1e-5f, false, seed++, kBoth, f});
      }
  // Nearly all codes equal the cast of the exact value: fp32's error (about 1e-6 of
  // |y|) only moves values within that distance of a rounding midpoint, a few in
  // 1e5 of them; a biased rounding or scaling would move a large share.
  EXPECT_EQ(count.codes, 12 * (2 * 37 * 1000 + 2 * 3 * 127));  // the row-wise codes of all cases
  EXPECT_LT(count.differing, count.codes / 1000) << "of " << count.codes << " codes";
}

// Zero rows: nothing to normalize; an FP8 output still gets scale_inv and keeps amax.
TEST(Norm, ForwardZeroRows) {
  for (bool ln : {true, false})
    for (te_dtype out : {TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3}) {
      SCOPED_TRACE(::testing::Message() << (ln ? "layernorm " : "rmsnorm ") << dtype_str(out));
      std::vector<float> gamma(64, 1.0f), beta(64, 0.0f);
      Buffer stats(0);
      float scale = 4.0f, scale_inv = 0.0f, amax = 2.5f;
      te_tensor tx = make_tensor(TE_DTYPE_BFLOAT16, {0, 64}, nullptr);
      te_tensor tg = make_tensor(TE_DTYPE_FLOAT32, {64}, gamma.data());
      te_tensor tb = make_tensor(TE_DTYPE_FLOAT32, {64}, beta.data());
      te_tensor ty = make_tensor(out, {0, 64}, nullptr, cpu(),
                                 is_fp8_dtype(out) ? TE_SCALING_PER_TENSOR : TE_SCALING_NONE);
      ty.scale = &scale, ty.scale_inv = &scale_inv, ty.amax = &amax;
      te_tensor tmu = make_tensor(TE_DTYPE_FLOAT32, {0}, nullptr);
      te_tensor trs = make_tensor(TE_DTYPE_FLOAT32, {0}, nullptr);
      const te_status st = ln ? te_layernorm_fwd(&tx, &tg, &tb, 1e-5f, 0, &ty, &tmu, &trs, nullptr, 0, nullptr)
                              : te_rmsnorm_fwd(&tx, &tg, 1e-5f, 0, &ty, &trs, nullptr, 0, nullptr);
      ASSERT_EQ(st, TE_SUCCESS) << last_error();
      EXPECT_EQ(amax, 2.5f);
      EXPECT_EQ(scale_inv, is_fp8_dtype(out) ? 0.25f : 0.0f);
    }
}

// Inputs for which every step is exact: rows m +- 2 (mean m, variance 4, rsigma 1/2
// with eps = 0), so y = +-g + beta. Then mu, rsigma, every output value, FP8 code,
// amax and scale_inv are exact.
TEST(Norm, ForwardExactCase) {
  const int64_t rows = 4, hidden = 66;
  for (bool ln : {true, false})
    for (bool zc : {false, true})
      for (te_dtype out : {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2}) {
        SCOPED_TRACE(::testing::Message() << (ln ? "layernorm " : "rmsnorm ") << (zc ? "zero-centered " : "")
                                          << dtype_str(out));
        std::vector<float> x(static_cast<size_t>(rows * hidden)), gamma(static_cast<size_t>(hidden)), beta(static_cast<size_t>(hidden));
        const float means[rows] = {0.0f, 3.0f, -1.5f, 100.0f};
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < hidden; ++c)
            x[r * hidden + c] = (ln ? means[r] : 0.0f) + ((c + r) % 2 ? 2.0f : -2.0f);
        for (int64_t c = 0; c < hidden; ++c) {
          gamma[c] = 0.25f * float(c % 9) - 1.0f;
          beta[c] = 0.125f * float(c % 5) - 0.25f;
        }
        const bool fp8 = is_fp8_dtype(out);
        Buffer y(size_t(rows * hidden) * elem_size(out)), yt(size_t(rows * hidden));
        std::vector<float> mu(rows), rs(rows);
        float scale = 37.0f, scale_inv = 0.0f, amax = 0.0f;  // not a power of two: x * scale rounds
        te_tensor tx = make_tensor(TE_DTYPE_FLOAT32, {rows, hidden}, x.data());
        te_tensor tg = make_tensor(TE_DTYPE_FLOAT32, {hidden}, gamma.data());
        te_tensor tb = make_tensor(TE_DTYPE_FLOAT32, {hidden}, beta.data());
        te_tensor ty = make_tensor(out, {rows, hidden}, y.data(), cpu(), fp8 ? TE_SCALING_PER_TENSOR : TE_SCALING_NONE);
        if (fp8) ty.columnwise_data = yt.data(), ty.scale = &scale, ty.scale_inv = &scale_inv, ty.amax = &amax;
        te_tensor tmu = make_tensor(TE_DTYPE_FLOAT32, {rows}, mu.data());
        te_tensor trs = make_tensor(TE_DTYPE_FLOAT32, {rows}, rs.data());
        const te_status st = ln ? te_layernorm_fwd(&tx, &tg, &tb, 0.0f, zc, &ty, &tmu, &trs, nullptr, 0, nullptr)
                                : te_rmsnorm_fwd(&tx, &tg, 0.0f, zc, &ty, &trs, nullptr, 0, nullptr);
        ASSERT_EQ(st, TE_SUCCESS) << last_error();
        double want_amax = 0;
        for (int64_t r = 0; r < rows; ++r) {
          if (ln) EXPECT_EQ(mu[r], means[r]);
          EXPECT_EQ(rs[r], 0.5f);
          for (int64_t c = 0; c < hidden; ++c) {
            double want = ((c + r) % 2 ? 1.0 : -1.0) * g_of(gamma[c], zc);  // -0 where g = 0
            if (ln) want += beta[c];
            want_amax = std::max(want_amax, std::fabs(want));
            const size_t i = size_t(r * hidden + c);
            if (!fp8) {
              EXPECT_EQ(value_at(y, out, i), ref_decode(format_of(out), ref_encode(format_of(out), want)))
                  << "[" << r << "," << c << "]";
              if (out == TE_DTYPE_FLOAT32) EXPECT_EQ(y.get<float>(i), float(want));
              continue;
            }
            const uint32_t code = ref_encode(format_of(out), double(float(want * scale)));
            EXPECT_EQ(y.get<uint8_t>(i), code) << "[" << r << "," << c << "]";
            EXPECT_EQ(yt.get<uint8_t>(size_t(c * rows + r)), code) << "columnwise [" << c << "," << r << "]";
          }
        }
        if (fp8) {
          EXPECT_EQ(double(amax), want_amax);
          EXPECT_EQ(scale_inv, float(1.0 / 37.0));
        }
      }
}

// A constant row has variance 0: xhat = 0, so y = beta exactly and rsigma = 1/sqrt(eps).
// A NaN makes its own row NaN and nothing else; FP8 amax ignores it.
TEST(Norm, ForwardConstantAndNaNRows) {
  const int64_t hidden = 64;
  std::vector<float> x(static_cast<size_t>(3 * hidden), 0.75f), gamma(hidden, 1.5f), beta(hidden);
  for (int64_t c = 0; c < hidden; ++c) {
    beta[c] = 0.5f * float(c % 7) - 1.0f;
    x[2 * hidden + c] = float(c % 3);
  }
  x[hidden + 5] = NAN;
  Buffer y(size_t(3 * hidden));
  std::vector<float> mu(3), rs(3);
  float scale = 1.0f, amax = 0.0f;
  te_tensor tx = make_tensor(TE_DTYPE_FLOAT32, {3, hidden}, x.data());
  te_tensor tg = make_tensor(TE_DTYPE_FLOAT32, {hidden}, gamma.data());
  te_tensor tb = make_tensor(TE_DTYPE_FLOAT32, {hidden}, beta.data());
  te_tensor ty = make_tensor(TE_DTYPE_FLOAT8_E4M3, {3, hidden}, y.data(), cpu(), TE_SCALING_PER_TENSOR);
  ty.scale = &scale, ty.amax = &amax;
  te_tensor tmu = make_tensor(TE_DTYPE_FLOAT32, {3}, mu.data());
  te_tensor trs = make_tensor(TE_DTYPE_FLOAT32, {3}, rs.data());
  ASSERT_EQ(te_layernorm_fwd(&tx, &tg, &tb, 0.25f, 0, &ty, &tmu, &trs, nullptr, 0, nullptr), TE_SUCCESS)
      << last_error();
  EXPECT_EQ(mu[0], 0.75f);
  EXPECT_EQ(rs[0], 2.0f);  // 1/sqrt(0.25)
  // row 2: c % 3 over c = 0..63 is 22 zeros, 21 ones and 21 twos
  const double mean2 = 63.0 / 64.0;
  const double var2 = (22 * mean2 * mean2 + 21 * (1 - mean2) * (1 - mean2) + 21 * (2 - mean2) * (2 - mean2)) / 64;
  const double rs2 = 1 / std::sqrt(var2 + 0.25);
  double row2_amax = 0;
  for (int64_t c = 0; c < hidden; ++c) {
    EXPECT_EQ(y.get<uint8_t>(size_t(c)), ref_encode(kE4M3, beta[c])) << c;
    EXPECT_TRUE(std::isnan(ref_decode(kE4M3, y.get<uint8_t>(size_t(hidden + c))))) << c;
    row2_amax = std::max(row2_amax, std::fabs((float(c % 3) - mean2) * rs2 * 1.5 + beta[c]));
  }
  EXPECT_TRUE(std::isnan(mu[1]) && std::isnan(rs[1]));
  EXPECT_NEAR(mu[2], mean2, 1e-6);
  EXPECT_NEAR(rs[2], rs2, 1e-6 * rs2);
  // amax of rows 0 and 2 (|beta| <= 2 in row 0), NaN ignored
  EXPECT_NEAR(amax, std::max(2.0, row2_amax), 1e-5);
}

// ---------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------

struct BwdCase {
  bool layernorm;
  te_dtype in, w;
  std::vector<int64_t> shape;
  bool zero_centered;
  uint32_t seed;
};

void check_bwd(const BwdCase& k) {
  SCOPED_TRACE(::testing::Message() << (k.layernorm ? "layernorm" : "rmsnorm") << " bwd " << dtype_str(k.in)
                                    << " x, " << dtype_str(k.w) << " weights, shape " << shape_str(k.shape)
                                    << (k.zero_centered ? " zero-centered" : ""));
  const int64_t hidden = k.shape.back(), rows = rows_of(k.shape), n = rows * hidden;
  std::mt19937 rng(k.seed);
  Buffer bx(size_t(n) * elem_size(k.in)), bdz(size_t(n) * elem_size(k.in)), bg(size_t(hidden) * elem_size(k.w));
  const std::vector<float> x = stored_values(bx, k.in, random_rows(rng, rows, hidden));
  const std::vector<float> dz = stored_values(bdz, k.in, random_normal(rng, size_t(n), 0.0f, 2.0f));
  const std::vector<float> gamma =
      stored_values(bg, k.w, random_normal(rng, size_t(hidden), k.zero_centered ? 0.0f : 1.0f, 0.5f));
  // the saved statistics, as a forward would have stored them (fp32)
  std::vector<float> mu(static_cast<size_t>(rows)), rs(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const RowStats s = ref_stats(k.layernorm, &x[r * hidden], hidden, 1e-5f);
    mu[r] = float(s.mu), rs[r] = float(s.rsigma);
  }

  // reference gradients from the saved statistics, and their bounds
  std::vector<double> dx(static_cast<size_t>(n)), dx_err(static_cast<size_t>(n)), dg(static_cast<size_t>(hidden), 0), db(static_cast<size_t>(hidden), 0),
      dg_abs(static_cast<size_t>(hidden), 0), db_abs(static_cast<size_t>(hidden), 0);
  const double c_n = accumulation_factor(hidden), c_rows = accumulation_factor(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const double m = k.layernorm ? mu[r] : 0.0, s = rs[r];
    double sum_dyg = 0, sum_dyg_xhat = 0, abs_dyg = 0, abs_dyg_xhat = 0;
    for (int64_t c = 0; c < hidden; ++c) {
      const double xhat = (x[r * hidden + c] - m) * s, dy = dz[r * hidden + c];
      const double dyg = dy * g_of(gamma[c], k.zero_centered);
      sum_dyg += dyg, sum_dyg_xhat += dyg * xhat;
      abs_dyg += std::fabs(dyg), abs_dyg_xhat += std::fabs(dyg * xhat);
      dg[c] += dy * xhat, db[c] += dy;
      dg_abs[c] += std::fabs(dy * xhat), db_abs[c] += std::fabs(dy);
    }
    const double mean_dyg = k.layernorm ? sum_dyg / double(hidden) : 0.0, mean2 = sum_dyg_xhat / double(hidden);
    for (int64_t c = 0; c < hidden; ++c) {
      const double xhat = (x[r * hidden + c] - m) * s;
      const double dyg = dz[r * hidden + c] * g_of(gamma[c], k.zero_centered);
      dx[r * hidden + c] = s * (dyg - mean_dyg - xhat * mean2);
      dx_err[r * hidden + c] =
          s * (6 * kU * (std::fabs(dyg) + std::fabs(mean_dyg) + std::fabs(xhat * mean2)) +
               c_n * ((k.layernorm ? abs_dyg : 0.0) + std::fabs(xhat) * abs_dyg_xhat) / double(hidden));
    }
  }

  Buffer out_dx(size_t(n) * elem_size(k.in)), out_dg(size_t(hidden) * elem_size(k.w)),
      out_db(size_t(hidden) * elem_size(k.w));
  te_tensor tdz = make_tensor(k.in, k.shape, bdz.data()), tx = make_tensor(k.in, k.shape, bx.data());
  te_tensor tmu = make_tensor(TE_DTYPE_FLOAT32, {rows}, mu.data()), trs = make_tensor(TE_DTYPE_FLOAT32, {rows}, rs.data());
  te_tensor tg = make_tensor(k.w, {hidden}, bg.data());
  te_tensor tdx = make_tensor(k.in, k.shape, out_dx.data());
  te_tensor tdg = make_tensor(k.w, {hidden}, out_dg.data()), tdb = make_tensor(k.w, {hidden}, out_db.data());
  const te_status st =
      k.layernorm ? te_layernorm_bwd(&tdz, &tx, &tmu, &trs, &tg, k.zero_centered, &tdx, &tdg, &tdb, nullptr, 0, nullptr)
                  : te_rmsnorm_bwd(&tdz, &tx, &trs, &tg, k.zero_centered, &tdx, &tdg, nullptr, 0, nullptr);
  ASSERT_EQ(st, TE_SUCCESS) << last_error();

  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double got = value_at(out_dx, k.in, size_t(i)), allowed = with_rounding(dx[i], dx_err[i], k.in);
    if (!(std::fabs(got - dx[i]) <= allowed) && bad++ < 5)
      ADD_FAILURE() << "dx[" << i / hidden << "," << i % hidden << "] = " << got << ", want " << dx[i] << " +- "
                    << allowed;
  }
  for (int64_t c = 0; c < hidden; ++c) {
    const double got_g = value_at(out_dg, k.w, size_t(c));
    const double allowed_g = with_rounding(dg[c], (c_rows + 4 * kU) * dg_abs[c], k.w);
    if (!(std::fabs(got_g - dg[c]) <= allowed_g) && bad++ < 5)
      ADD_FAILURE() << "dgamma[" << c << "] = " << got_g << ", want " << dg[c] << " +- " << allowed_g;
    if (!k.layernorm) continue;
    const double got_b = value_at(out_db, k.w, size_t(c));
    const double allowed_b = with_rounding(db[c], c_rows * db_abs[c], k.w);
    if (!(std::fabs(got_b - db[c]) <= allowed_b) && bad++ < 5)
      ADD_FAILURE() << "dbeta[" << c << "] = " << got_b << ", want " << db[c] << " +- " << allowed_b;
  }
  EXPECT_EQ(bad, 0) << "elements out of bounds";
  EXPECT_TRUE(out_dx.guard_intact() && out_dg.guard_intact() && out_db.guard_intact())
      << "written past the end of an output";
  if (!k.layernorm) EXPECT_TRUE(out_db.all_poison());
}

TEST(Norm, BackwardDtypesAndSizes) {
  uint32_t seed = 3000;
  for (bool ln : {true, false})
    for (te_dtype in : kFloats)
      for (te_dtype w : kFloats)
        for (int64_t hidden : {64, 127, 768, 1000, 4096})
          for (int64_t rows : {1, 3, 37}) check_bwd({ln, in, w, {rows, hidden}, (hidden + rows) % 2 == 0, seed++});
}

TEST(Norm, BackwardLargeHiddenAndShapes) {
  uint32_t seed = 4000;
  for (bool ln : {true, false}) {
    for (te_dtype in : kFloats) check_bwd({ln, in, TE_DTYPE_FLOAT32, {2, 16384}, false, seed++});
    check_bwd({ln, TE_DTYPE_BFLOAT16, TE_DTYPE_BFLOAT16, {3, 16383}, true, seed++});
    check_bwd({ln, TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT32, {2, 3, 65}, true, seed++});
    check_bwd({ln, TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT32, {96}, false, seed++});
  }
}

// Zero rows: dx is empty; dgamma and dbeta are sums of nothing, written as zeros.
TEST(Norm, BackwardZeroRows) {
  for (bool ln : {true, false}) {
    SCOPED_TRACE(ln ? "layernorm" : "rmsnorm");
    std::vector<float> gamma(100, 1.0f);
    Buffer dg(400), db(400);
    te_tensor empty = make_tensor(TE_DTYPE_BFLOAT16, {0, 100}, nullptr);
    te_tensor stats = make_tensor(TE_DTYPE_FLOAT32, {0}, nullptr);
    te_tensor tg = make_tensor(TE_DTYPE_FLOAT32, {100}, gamma.data());
    te_tensor tdg = make_tensor(TE_DTYPE_FLOAT32, {100}, dg.data()), tdb = make_tensor(TE_DTYPE_FLOAT32, {100}, db.data());
    const te_status st = ln ? te_layernorm_bwd(&empty, &empty, &stats, &stats, &tg, 0, &empty, &tdg, &tdb, nullptr, 0,
                                               nullptr)
                            : te_rmsnorm_bwd(&empty, &empty, &stats, &tg, 0, &empty, &tdg, nullptr, 0, nullptr);
    ASSERT_EQ(st, TE_SUCCESS) << last_error();
    for (size_t c = 0; c < 100; ++c) {
      EXPECT_EQ(bits_of(dg.get<float>(c)), 0u) << c;
      if (ln) EXPECT_EQ(bits_of(db.get<float>(c)), 0u) << c;
    }
    EXPECT_TRUE(dg.guard_intact() && db.guard_intact());
    if (!ln) EXPECT_TRUE(db.all_poison());
  }
}

// ---------------------------------------------------------------------------
// Workspace query
// ---------------------------------------------------------------------------

TEST(Norm, WorkspaceSize) {
  // CPU: none, whatever the sizes
  EXPECT_EQ(te_norm_workspace_size(37, 4096, cpu()), 0u);
  EXPECT_EQ(te_norm_workspace_size(1 << 20, 16384, cpu()), 0u);
  // CUDA: min(rows, 512) blocks x 2 partial sums x hidden floats
  EXPECT_EQ(te_norm_workspace_size(1, 64, cuda()), 512u);                 // 1 * 2 * 64 * 4
  EXPECT_EQ(te_norm_workspace_size(37, 1000, cuda()), 296000u);           // 37 * 2 * 1000 * 4
  EXPECT_EQ(te_norm_workspace_size(256, 768, cuda()), 1572864u);          // 256 * 2 * 768 * 4
  EXPECT_EQ(te_norm_workspace_size(400, 768, cuda()), 2457600u);          // 400 * 2 * 768 * 4
  EXPECT_EQ(te_norm_workspace_size(8192, 16384, cuda(1)), 67108864u);     // 512 * 2 * 16384 * 4 = 64 MiB
  EXPECT_EQ(te_norm_workspace_size(0, 4096, cuda()), 0u);
  EXPECT_EQ(te_norm_workspace_size(5, 0, cuda()), 0u);
  EXPECT_EQ(te_norm_workspace_size(-1, 64, cuda()), 0u);
  EXPECT_EQ(te_norm_workspace_size(5, -64, cuda()), 0u);
  EXPECT_EQ(te_norm_workspace_size(300, INT64_MAX, cuda()), SIZE_MAX);  // saturates, never wraps
}

}  // namespace
