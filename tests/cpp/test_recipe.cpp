// The FP8 recipe updates: current scaling (te_compute_scale_from_amax) and
// delayed scaling (te_delayed_scaling_update), against formulas evaluated in
// the test (double arithmetic rounded to float after each fp32 operation, which
// gives the correctly rounded fp32 result of a division).
#include <cfloat>

#include "test_util.h"

namespace {

using namespace tt;

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;

// fp32 division a / b, correctly rounded; an overflow gives inf.
float fdiv(float a, float b) { return float(double(a) / double(b)); }

// 2^floor(log2(s)) for a positive normal s.
float pow2_floor(float s) {
  int e;
  std::frexp(s, &e);  // s in [2^(e-1), 2^e)
  return std::ldexp(1.0f, e - 1);
}

// ---- current scaling -------------------------------------------------------

// scale = fp8_max / max(amax, eps); 1 when that max is 0, inf or NaN; FLT_MAX
// when the quotient overflows; optionally rounded down to a power of two.
float ref_current_scale(float amax, float fp8_max, float eps, bool pow2) {
  if (std::isnan(amax)) return 1.0f;
  const float m = std::max(amax, eps);
  if (m == 0.0f || std::isinf(m)) return 1.0f;
  float s = fdiv(fp8_max, m);
  if (std::isinf(s)) s = FLT_MAX;
  return pow2 ? pow2_floor(s) : s;
}

struct ScaleResult {
  te_status status;
  float scale;
  float scale_inv;
};

ScaleResult current(float amax, int32_t fp8, float eps, int pow2) {
  float a = amax, s = f32(0xABABABABu), si = f32(0xABABABABu);
  const te_status st = te_compute_scale_from_amax(&a, &s, &si, fp8, eps, pow2, cpu(), nullptr);
  EXPECT_EQ(bits_of(a), bits_of(amax)) << "amax must not change";
  return {st, s, si};
}

// Values worked out by hand from the formula.
TEST(CurrentScaling, HandDerivedValues) {
  struct Case {
    float amax;
    int32_t fp8;
    float eps;
    int pow2;
    float want;
  } cases[] = {
      {2.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, 224.0f},          // 448 / 2
      {448.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, 1.0f},
      {0.5f, TE_DTYPE_FLOAT8_E5M2, 0.0f, 0, 114688.0f},       // 57344 / 0.5
      {1.0f, TE_DTYPE_FLOAT8_E4M3, 4.0f, 0, 112.0f},          // epsilon wins: 448 / 4
      {0.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, 1.0f},            // amax 0, no epsilon
      {0.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, 1.0f},
      {0.0f, TE_DTYPE_FLOAT8_E4M3, 0.5f, 0, 896.0f},          // amax 0 clamped to epsilon
      {INFINITY, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, 1.0f},
      {INFINITY, TE_DTYPE_FLOAT8_E5M2, 1.0f, 1, 1.0f},
      {NAN, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, 1.0f},
      {NAN, TE_DTYPE_FLOAT8_E4M3, 1e-3f, 1, 1.0f},
      {-NAN, TE_DTYPE_FLOAT8_E5M2, 0.0f, 0, 1.0f},
      {f32(1), TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, FLT_MAX},       // 448 / 2^-149 overflows
      {1e-39f, TE_DTYPE_FLOAT8_E5M2, 0.0f, 0, FLT_MAX},
      {f32(1), TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, std::ldexp(1.0f, 127)},  // FLT_MAX rounded down
      {3.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, 128.0f},          // 149.33 -> 128
      {2.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, 128.0f},          // 224 -> 128
      {1.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, 256.0f},          // 448 -> 256
      {448.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, 1.0f},          // already a power of two
      {500.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 1, 0.5f},          // 0.896 -> 0.5
      {3.0f, TE_DTYPE_FLOAT8_E5M2, 0.0f, 1, 16384.0f},        // 19114.67 -> 2^14
      {-1.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, 1.0f},           // max(-1, 0) = 0
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "amax " << c.amax << " " << dtype_str(te_dtype(c.fp8)) << " eps " << c.eps
                                      << " pow2 " << c.pow2);
    const ScaleResult r = current(c.amax, c.fp8, c.eps, c.pow2);
    ASSERT_EQ(r.status, TE_SUCCESS) << last_error();
    EXPECT_EQ(r.scale, c.want);
    EXPECT_EQ(r.scale_inv, float(1.0 / double(c.want)));
  }
  // 448 / 3 is inexact: the correctly rounded fp32 quotient
  const ScaleResult r = current(3.0f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0);
  EXPECT_EQ(r.scale, 448.0f / 3.0f);
  EXPECT_NEAR(r.scale, 149.3333, 1e-3);
}

// A sweep over every binade of amax (subnormal to FLT_MAX), several epsilons,
// both formats, with and without power-of-two rounding.
TEST(CurrentScaling, SweepMatchesFormula) {
  std::mt19937 rng(77);
  const float eps_values[] = {0.0f, 1e-30f, 1e-12f, 1e-3f, 1.0f, 100.0f};
  int bad = 0;
  for (int i = 0; i < 4000 && bad < 5; ++i) {
    const float amax = std::fabs(random_magnitude(rng, -149, 127));
    const float eps = eps_values[i % 6];
    const int32_t fp8 = (i / 6) % 2 ? TE_DTYPE_FLOAT8_E5M2 : TE_DTYPE_FLOAT8_E4M3;
    const float fmax = fp8 == TE_DTYPE_FLOAT8_E4M3 ? kE4M3Max : kE5M2Max;
    for (int pow2 = 0; pow2 < 2; ++pow2) {
      const ScaleResult r = current(amax, fp8, eps, pow2);
      const float want = ref_current_scale(amax, fmax, eps, pow2);
      if (r.status != TE_SUCCESS || r.scale != want || r.scale_inv != float(1.0 / double(want))) {
        ++bad;
        ADD_FAILURE() << "amax " << amax << " eps " << eps << " pow2 " << pow2 << ": scale " << r.scale
                      << " (want " << want << "), scale_inv " << r.scale_inv;
      }
      if (pow2) {  // a power of two, not above the plain scale, and more than half of it
        const float plain = ref_current_scale(amax, fmax, eps, false);
        int e;
        EXPECT_EQ(std::frexp(r.scale, &e), 0.5f);
        EXPECT_LE(r.scale, plain);
        EXPECT_GT(r.scale, plain / 2);
      }
    }
  }
}

TEST(CurrentScaling, ScaleInvOptional) {
  float amax = 7.0f, scale = 0.0f;
  ASSERT_EQ(te_compute_scale_from_amax(&amax, &scale, nullptr, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, cpu(), nullptr),
            TE_SUCCESS)
      << last_error();
  EXPECT_EQ(scale, 64.0f);
}

// ---- delayed scaling -------------------------------------------------------

// One group's buffers with the expected state after the update.
struct Group {
  int64_t len, n;
  std::vector<float> hist, scale, scale_inv;
  bool with_scale_inv;
  std::vector<float> want_hist, want_scale, want_scale_inv;

  int32_t fp8_dtype;
  te_amax_history_group desc() {
    return te_amax_history_group{hist.data(), scale.data(), with_scale_inv ? scale_inv.data() : nullptr, len, n,
                                 fp8_dtype};
  }
};

// Builds a group with random history (some columns all zero, some with inf in
// row 0 or deeper) and computes the expected update:
//   amax = max over rows (or row 0); scale = fp8_max / amax / 2^margin if amax
//   is positive and finite, else unchanged; FLT_MAX on overflow; roll + zero.
Group make_group(int64_t len, int64_t n, bool with_scale_inv, std::mt19937& rng, bool use_max, int32_t fp8_dtype,
                 float margin) {
  const float fp8_max = fp8_dtype == TE_DTYPE_FLOAT8_E4M3 ? kE4M3Max : kE5M2Max;
  Group g{len, n, std::vector<float>(len * n), std::vector<float>(n), std::vector<float>(n, f32(0xABABABABu)),
          with_scale_inv, {}, {}, {}, fp8_dtype};
  for (auto& v : g.hist) v = std::fabs(random_magnitude(rng, -20, 20));
  for (auto& s : g.scale) s = std::fabs(random_magnitude(rng, -5, 5));
  for (int64_t j = 0; j < n; ++j) {
    switch (j % 6) {
      case 1:  // the whole column zero: amax 0 keeps the old scale
        for (int64_t i = 0; i < len; ++i) g.hist[i * n + j] = 0.0f;
        break;
      case 2:  // inf in the current row
        g.hist[j] = INFINITY;
        break;
      case 3:  // inf in the oldest row (only MAX sees it)
        g.hist[(len - 1) * n + j] = INFINITY;
        break;
      case 4:  // a tiny amax: the scale overflows to FLT_MAX
        for (int64_t i = 0; i < len; ++i) g.hist[i * n + j] = f32(1 + uint32_t(i));
        break;
      default: break;
    }
  }
  const float mf = float(std::exp2(double(margin)));
  g.want_hist.resize(len * n);
  g.want_scale.resize(n);
  g.want_scale_inv = g.scale_inv;
  for (int64_t j = 0; j < n; ++j) {
    float amax = g.hist[j];
    if (use_max)
      for (int64_t i = 1; i < len; ++i) amax = std::max(amax, g.hist[i * n + j]);
    float s = g.scale[j];
    if (amax > 0.0f && std::isfinite(amax)) {
      s = fdiv(fdiv(fp8_max, amax), mf);
      if (std::isinf(s)) s = FLT_MAX;
    }
    g.want_scale[j] = s;
    if (with_scale_inv) g.want_scale_inv[j] = float(1.0 / double(s));
    // roll: row i <- row i+1, last row <- old row 0, then row 0 <- 0
    for (int64_t i = 0; i + 1 < len; ++i) g.want_hist[i * n + j] = g.hist[(i + 1) * n + j];
    g.want_hist[(len - 1) * n + j] = g.hist[j];
    g.want_hist[j] = 0.0f;
  }
  return g;
}

void expect_group(const Group& g, int index) {
  SCOPED_TRACE(::testing::Message() << "group " << index << " len " << g.len << " n " << g.n);
  EXPECT_EQ(g.hist, g.want_hist);
  EXPECT_EQ(g.scale, g.want_scale);
  if (g.with_scale_inv) {
    EXPECT_EQ(g.scale_inv, g.want_scale_inv);
  } else {
    for (float v : g.scale_inv) EXPECT_EQ(bits_of(v), 0xABABABABu) << "scale_inv was not passed";
  }
}

// Several groups of different history lengths and sizes in one call, both
// algorithms, both formats (one format for all groups, and the two mixed in one
// call, as a HYBRID recipe's forward and backward update together), integer,
// negative and fractional margins.
TEST(DelayedScaling, ManyGroupsMatchFormula) {
  std::mt19937 rng(2024);
  const struct {
    int64_t len, n;
    bool inv;
  } shapes[] = {{1, 3, true}, {4, 2, true}, {7, 12, false}, {3, 0, true}, {1024, 6, true}, {2, 1, true}};
  enum Formats { kAllE4M3, kAllE5M2, kMixed };
  for (int32_t algo : {TE_AMAX_COMPUTE_MAX, TE_AMAX_COMPUTE_MOST_RECENT}) {
    for (Formats formats : {kAllE4M3, kAllE5M2, kMixed}) {
      for (float margin : {0.0f, 1.0f, 3.0f, -2.0f, 0.5f}) {
        SCOPED_TRACE(::testing::Message() << "algo " << algo << " formats " << formats << " margin " << margin);
        std::vector<Group> groups;
        for (size_t i = 0; i < std::size(shapes); ++i) {
          const bool e4m3 = formats == kAllE4M3 || (formats == kMixed && i % 2 == 0);
          const auto& s = shapes[i];
          groups.push_back(make_group(s.len, s.n, s.inv, rng, algo == TE_AMAX_COMPUTE_MAX,
                                      e4m3 ? TE_DTYPE_FLOAT8_E4M3 : TE_DTYPE_FLOAT8_E5M2, margin));
        }
        std::vector<te_amax_history_group> descs;
        for (auto& g : groups) descs.push_back(g.desc());
        ASSERT_EQ(te_delayed_scaling_update(descs.data(), int64_t(descs.size()), algo, margin, cpu(), nullptr),
                  TE_SUCCESS)
            << last_error();
        for (size_t i = 0; i < groups.size(); ++i) expect_group(groups[i], int(i));
      }
    }
  }
}

// Hand-derived: E4M3, history [[2, 0, 5], [8, 0, inf]] (row 0 current).
TEST(DelayedScaling, HandDerivedValues) {
  for (int32_t algo : {TE_AMAX_COMPUTE_MAX, TE_AMAX_COMPUTE_MOST_RECENT}) {
    SCOPED_TRACE(algo == TE_AMAX_COMPUTE_MAX ? "max" : "most_recent");
    std::vector<float> hist = {2.0f, 0.0f, 5.0f, 8.0f, 0.0f, INFINITY};
    std::vector<float> scale = {3.0f, 3.0f, 3.0f}, scale_inv(3, 0.0f);
    te_amax_history_group g{hist.data(), scale.data(), scale_inv.data(), 2, 3, TE_DTYPE_FLOAT8_E4M3};
    ASSERT_EQ(te_delayed_scaling_update(&g, 1, algo, 1.0f, cpu(), nullptr), TE_SUCCESS)
        << last_error();
    if (algo == TE_AMAX_COMPUTE_MAX) {
      // amax = 8, 0, inf: 448 / 8 / 2 = 28; 0 and inf keep the old scale 3
      EXPECT_EQ(scale, (std::vector<float>{28.0f, 3.0f, 3.0f}));
      EXPECT_EQ(scale_inv, (std::vector<float>{1.0f / 28.0f, 1.0f / 3.0f, 1.0f / 3.0f}));
    } else {
      // amax = 2, 0, 5: 448 / 2 / 2 = 112; 448 / 5 / 2 = 44.8
      EXPECT_EQ(scale, (std::vector<float>{112.0f, 3.0f, 44.8f}));
      EXPECT_EQ(scale_inv[0], 1.0f / 112.0f);
    }
    // len 2: row 0 <- 0, row 1 <- old row 0
    EXPECT_EQ(hist, (std::vector<float>{0.0f, 0.0f, 0.0f, 2.0f, 0.0f, 5.0f}));
  }
}

// The roll on a longer history with distinct values, two updates in a row.
TEST(DelayedScaling, RollTwice) {
  const int64_t len = 5, n = 2;
  std::vector<float> hist(len * n);
  for (int64_t i = 0; i < len; ++i)
    for (int64_t j = 0; j < n; ++j) hist[i * n + j] = float(10 * (i + 1) + j);  // row i: 10(i+1)+j
  std::vector<float> scale = {1.0f, 1.0f};
  te_amax_history_group g{hist.data(), scale.data(), nullptr, len, n, TE_DTYPE_FLOAT8_E4M3};
  ASSERT_EQ(te_delayed_scaling_update(&g, 1, TE_AMAX_COMPUTE_MAX, 0.0f, cpu(), nullptr),
            TE_SUCCESS);
  // rows were 10,20,30,40,50 (+j): now 0, 30, 40, 50, 10
  EXPECT_EQ(hist, (std::vector<float>{0, 0, 30, 31, 40, 41, 50, 51, 10, 11}));
  EXPECT_EQ(scale, (std::vector<float>{448.0f / 50.0f, 448.0f / 51.0f}));
  ASSERT_EQ(te_delayed_scaling_update(&g, 1, TE_AMAX_COMPUTE_MOST_RECENT, 0.0f, cpu(), nullptr),
            TE_SUCCESS);
  // the most recent amax is row 0 = 0: scales unchanged
  EXPECT_EQ(scale, (std::vector<float>{448.0f / 50.0f, 448.0f / 51.0f}));
  EXPECT_EQ(hist, (std::vector<float>{0, 0, 40, 41, 50, 51, 10, 11, 0, 0}));
}

// A NaN anywhere in the window makes the "max" amax NaN, whichever row holds it,
// so the old scale stays (the GPU kernel must agree: same rule, same order).
TEST(DelayedScaling, NanInHistoryKeepsOldScale) {
  // columns: NaN in row 0, NaN in row 1, no NaN (control)
  std::vector<float> hist = {NAN, 5.0f, 4.0f, 5.0f, NAN, 8.0f};
  std::vector<float> scale = {3.0f, 3.0f, 3.0f};
  te_amax_history_group g{hist.data(), scale.data(), nullptr, 2, 3, TE_DTYPE_FLOAT8_E4M3};
  ASSERT_EQ(te_delayed_scaling_update(&g, 1, TE_AMAX_COMPUTE_MAX, 0.0f, cpu(), nullptr),
            TE_SUCCESS)
      << last_error();
  EXPECT_EQ(scale, (std::vector<float>{3.0f, 3.0f, 448.0f / 8.0f}));
}

// No groups at all (groups may then be null), and groups with no scales (null
// buffers allowed).
TEST(DelayedScaling, EmptyInputs) {
  EXPECT_EQ(te_delayed_scaling_update(nullptr, 0, TE_AMAX_COMPUTE_MAX, 0.0f, cpu(), nullptr),
            TE_SUCCESS)
      << last_error();
  te_amax_history_group g{nullptr, nullptr, nullptr, 16, 0, TE_DTYPE_FLOAT8_E5M2};
  EXPECT_EQ(te_delayed_scaling_update(&g, 1, TE_AMAX_COMPUTE_MAX, 0.0f, cpu(), nullptr),
            TE_SUCCESS)
      << last_error();
}

}  // namespace
