// The softmax ops (opente/softmax.h) on the CPU against a float64 reference
// written here from the header's formulas, and their bad input.
//
// Error bounds (u = 2^-24; the core computes in fp32). Forward, per row with
// A = max |scale * x| over the positions that take part with their own logit
// and n = sk: the logit, its difference to the max and the exponential err by
// u (4A + 2) relative, the fp32 sum of n positive terms by that plus (n - 1) u,
// the division by u, so |y - ref| <= (8A + n + 4) u |ref|, doubled for slack;
// then the output dtype's rounding (half an ulp of |ref|, half the smallest
// subnormal step) and 2^-126 for exponentials that leave fp32's normal range.
// Positions that are masked out (causal, or a fully masked row) must be exactly 0.
// Backward, on the very y and dy the core reads, with g = dy y and dot = sum g:
//   |dx - ref| <= 2 |scale| u (2 |g| + 2 |y dot| + (n + 2) |y| sum|g|) + u |ref|,
// then the output rounding.
#include <functional>

#include "test_util.h"

namespace {

using namespace tt;

const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;

enum class Kind { kPlain, kMasked, kUpperTriang, kAlignedCausal };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kPlain: return "scaled";
    case Kind::kMasked: return "masked";
    case Kind::kUpperTriang: return "upper_triang";
    default: return "aligned_causal";
  }
}

double value_at(const Buffer& b, te_dtype d, size_t i) {
  if (d == TE_DTYPE_FLOAT32) return b.get<float>(i);
  return ref_decode(format_of(d), load_code(b, d, i));
}

// A float buffer of `n` random values N(0, sigma) stored in dtype d; `values`
// receives what was stored (what the core reads).
Buffer random_buffer(te_dtype d, size_t n, double sigma, uint32_t seed, std::vector<double>* values) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, sigma);
  Buffer b(n * elem_size(d));
  values->resize(n);
  for (size_t i = 0; i < n; ++i) (*values)[i] = store_value(b, d, i, float(normal(rng)));
  return b;
}

// ---- the float64 reference ------------------------------------------------------------------

struct Problem {
  Kind kind;
  std::vector<int64_t> shape;  // plain: any; upper_triang: [a, s, s]; masked, aligned: [b, h, sq, sk]
  std::vector<int64_t> mask_shape;  // masked: [b or 1, 1, sq, sk]
  float scale;
  int64_t sq() const { return kind == Kind::kPlain ? 1 : shape[shape.size() - 2]; }
  int64_t sk() const { return shape.back(); }
  int64_t rows() const { return numel_of(shape) / sk(); }
};

// Whether position j of row r is masked out and what logit it takes instead
// (-inf: takes no part; -10000: Transformer Engine's masked logit).
struct Position {
  bool masked;
  double logit_if_masked;
};

Position position(const Problem& pb, const std::vector<uint8_t>& mask, int64_t r, int64_t j) {
  const int64_t sq = pb.sq(), sk = pb.sk(), i = r % sq;
  switch (pb.kind) {
    case Kind::kPlain: return {false, 0.0};
    case Kind::kUpperTriang: return {j > i, -INFINITY};
    case Kind::kAlignedCausal: return {j > i + (sk - sq), -10000.0};
    case Kind::kMasked: {
      const int64_t heads = pb.shape[1], batch = r / (heads * sq);
      const int64_t mask_batch = pb.mask_shape[0] == 1 ? 0 : batch;
      return {mask[size_t((mask_batch * sq + i) * sk + j)] != 0, -10000.0};
    }
  }
  return {false, 0.0};
}

struct FwdReference {
  std::vector<double> y;      // exact softmax of the logits the core forms
  std::vector<double> bound;  // per element, before the output rounding
  std::vector<bool> zero;     // must be exactly 0
};

FwdReference reference_fwd(const Problem& pb, const std::vector<double>& x, const std::vector<uint8_t>& mask) {
  const int64_t sk = pb.sk();
  FwdReference ref;
  ref.y.resize(x.size());
  ref.bound.resize(x.size());
  ref.zero.resize(x.size());
  for (int64_t r = 0; r < pb.rows(); ++r) {
    std::vector<double> z(static_cast<size_t>(sk));
    double m = -INFINITY, a = 0.0;
    for (int64_t j = 0; j < sk; ++j) {
      const Position pos = position(pb, mask, r, j);
      if (pos.masked) {
        z[j] = pos.logit_if_masked;
      } else {
        z[j] = double(float(x[size_t(r * sk + j)] * double(pb.scale)));  // the core's fp32 product
        a = std::max(a, std::fabs(z[j]));
      }
      m = std::max(m, z[j]);
    }
    // Transformer Engine: a masked-softmax row whose max is the masked logit is zeros.
    const bool zero_row = pb.kind == Kind::kMasked && m == -10000.0;
    double sum = 0.0;
    for (int64_t j = 0; j < sk; ++j) sum += std::exp(z[j] - m);
    for (int64_t j = 0; j < sk; ++j) {
      const size_t e = size_t(r * sk + j);
      const bool out = zero_row || (pb.kind != Kind::kMasked && position(pb, mask, r, j).masked);
      ref.zero[e] = out;
      ref.y[e] = out ? 0.0 : std::exp(z[j] - m) / sum;
      ref.bound[e] = 2.0 * (8.0 * a + double(sk) + 4.0) * kU * ref.y[e] + std::ldexp(1.0, -126);
    }
  }
  return ref;
}

// ---- running the ops --------------------------------------------------------------------------

te_status run_fwd(Kind kind, const te_tensor* in, const te_tensor* mask, const te_tensor* out, float scale) {
  switch (kind) {
    case Kind::kPlain: return te_scaled_softmax_fwd(in, out, scale, nullptr);
    case Kind::kMasked: return te_scaled_masked_softmax_fwd(in, mask, out, scale, nullptr);
    case Kind::kUpperTriang: return te_scaled_upper_triang_masked_softmax_fwd(in, out, scale, nullptr);
    default: return te_scaled_aligned_causal_masked_softmax_fwd(in, out, scale, nullptr);
  }
}

te_status run_bwd(Kind kind, const te_tensor* dy, const te_tensor* y, const te_tensor* dx, float scale) {
  switch (kind) {
    case Kind::kPlain: return te_scaled_softmax_bwd(dy, y, dx, scale, nullptr);
    case Kind::kMasked: return te_scaled_masked_softmax_bwd(dy, y, dx, scale, nullptr);
    case Kind::kUpperTriang: return te_scaled_upper_triang_masked_softmax_bwd(dy, y, dx, scale, nullptr);
    default: return te_scaled_aligned_causal_masked_softmax_bwd(dy, y, dx, scale, nullptr);
  }
}

const char* fwd_op(Kind kind) {
  switch (kind) {
    case Kind::kPlain: return "te_scaled_softmax_fwd";
    case Kind::kMasked: return "te_scaled_masked_softmax_fwd";
    case Kind::kUpperTriang: return "te_scaled_upper_triang_masked_softmax_fwd";
    default: return "te_scaled_aligned_causal_masked_softmax_fwd";
  }
}

const char* bwd_op(Kind kind) {
  switch (kind) {
    case Kind::kPlain: return "te_scaled_softmax_bwd";
    case Kind::kMasked: return "te_scaled_masked_softmax_bwd";
    case Kind::kUpperTriang: return "te_scaled_upper_triang_masked_softmax_bwd";
    default: return "te_scaled_aligned_causal_masked_softmax_bwd";
  }
}

// A random 0/1 mask of mask_shape with about `density` of its elements set, and
// (when it has room) row 1 of every mask batch fully set.
std::vector<uint8_t> random_mask(const std::vector<int64_t>& mask_shape, double density, uint32_t seed) {
  std::vector<uint8_t> mask(size_t(numel_of(mask_shape)));
  std::mt19937 rng(seed);
  std::bernoulli_distribution set(density);
  for (auto& v : mask) v = set(rng) ? 1 : 0;
  const int64_t sq = mask_shape[2], sk = mask_shape[3];
  if (sq > 1) {
    for (int64_t b = 0; b < mask_shape[0]; ++b) {
      for (int64_t j = 0; j < sk; ++j) mask[size_t((b * sq + 1) * sk + j)] = 1;
    }
  }
  return mask;
}

struct FwdCase {
  Problem pb;
  double sigma;  // spread of x
};

std::string describe(const FwdCase& c, te_dtype d) {
  return std::string(kind_name(c.pb.kind)) + " " + dtype_str(d) + " " + shape_str(c.pb.shape) +
         " scale=" + std::to_string(c.pb.scale) + " sigma=" + std::to_string(c.sigma);
}

std::vector<FwdCase> fwd_cases() {
  return {
      {{Kind::kPlain, {2, 3, 5, 7}, {}, 0.5f}, 2.0},
      {{Kind::kPlain, {1, 2, 3, 64}, {}, 0.125f}, 8.0},
      {{Kind::kPlain, {4, 1}, {}, 3.0f}, 1.0},       // sk = 1: y = 1
      {{Kind::kPlain, {257}, {}, 1.0f}, 1.0},        // one row
      {{Kind::kPlain, {2, 1, 2, 100}, {}, 1.0f}, 300.0},  // large-magnitude logits
      {{Kind::kPlain, {1, 1, 3, 5}, {}, -2.0f}, 1.0},     // negative scale
      {{Kind::kMasked, {2, 3, 4, 9}, {1, 1, 4, 9}, 0.5f}, 2.0},   // mask broadcast over b
      {{Kind::kMasked, {2, 2, 3, 17}, {2, 1, 3, 17}, 1.0f}, 3.0}, // a mask per batch
      {{Kind::kMasked, {1, 1, 2, 1}, {1, 1, 2, 1}, 1.0f}, 1.0},
      {{Kind::kUpperTriang, {3, 9, 9}, {}, 0.7f}, 2.0},
      {{Kind::kUpperTriang, {2, 1, 1}, {}, 1.0f}, 1.0},
      {{Kind::kUpperTriang, {1, 33, 33}, {}, 1.0f}, 100.0},
      {{Kind::kAlignedCausal, {2, 2, 7, 5}, {}, 1.0f}, 2.0},   // sq > sk: leading rows keep nothing
      {{Kind::kAlignedCausal, {2, 1, 4, 9}, {}, 0.3f}, 2.0},   // sq < sk
      {{Kind::kAlignedCausal, {1, 2, 6, 6}, {}, 1.0f}, 2.0},   // sq == sk: upper-triangular
  };
}

constexpr te_dtype kDtypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};

TEST(Softmax, ForwardMatchesFloat64Reference) {
  uint32_t seed = 1;
  for (const FwdCase& c : fwd_cases()) {
    for (te_dtype d : kDtypes) {
      SCOPED_TRACE(describe(c, d));
      const size_t n = size_t(numel_of(c.pb.shape));
      std::vector<double> x;
      Buffer xb = random_buffer(d, n, c.sigma, seed++, &x);
      Buffer yb(n * elem_size(d));
      std::vector<uint8_t> mask;
      if (c.pb.kind == Kind::kMasked) mask = random_mask(c.pb.mask_shape, 0.4, seed++);
      te_tensor in = make_tensor(d, c.pb.shape, xb.data());
      te_tensor out = make_tensor(d, c.pb.shape, yb.data());
      te_tensor tm = make_tensor(TE_DTYPE_UINT8, c.pb.mask_shape, mask.data());
      ASSERT_EQ(run_fwd(c.pb.kind, &in, &tm, &out, c.pb.scale), TE_SUCCESS) << last_error();
      const FwdReference ref = reference_fwd(c.pb, x, mask);
      int worst = 0;
      for (size_t e = 0; e < n && worst < 5; ++e) {
        const double got = value_at(yb, d, e);
        if (ref.zero[e]) {
          if (got != 0.0) {
            ADD_FAILURE() << "element " << e << " is masked out: want 0, got " << got;
            ++worst;
          }
          continue;
        }
        const double bound = ref.bound[e] + unit_roundoff(d) * ref.y[e] + half_min_step(d);
        if (!(std::fabs(got - ref.y[e]) <= bound)) {
          ADD_FAILURE() << "element " << e << ": got " << got << ", want " << ref.y[e] << " +- " << bound;
          ++worst;
        }
      }
      EXPECT_TRUE(yb.guard_intact());
    }
  }
}

// Rows the masks empty: a fully masked row of the masked softmax, and the rows of
// the aligned causal softmax with sq > sk that keep nothing, are exactly zero; a
// row of one kept position is exactly 1 there.
TEST(Softmax, EmptyAndSingleRowsAreExact) {
  std::vector<float> x(2 * 3 * 4, 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 3.0f;
  std::vector<float> y(x.size(), -1.0f);
  std::vector<uint8_t> mask(3 * 4, 1);  // every position masked
  te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {2, 1, 3, 4}, x.data());
  te_tensor out = make_tensor(TE_DTYPE_FLOAT32, {2, 1, 3, 4}, y.data());
  te_tensor tm = make_tensor(TE_DTYPE_UINT8, {1, 1, 3, 4}, mask.data());
  ASSERT_EQ(te_scaled_masked_softmax_fwd(&in, &tm, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
  for (float v : y) EXPECT_EQ(bits_of(v), bits_of(0.0f));

  // aligned causal [1, 1, 4, 2]: rows 0 and 1 keep nothing, row 2 keeps j = 0 only
  std::vector<float> ya(8, -1.0f);
  te_tensor in_a = make_tensor(TE_DTYPE_FLOAT32, {1, 1, 4, 2}, x.data());
  te_tensor out_a = make_tensor(TE_DTYPE_FLOAT32, {1, 1, 4, 2}, ya.data());
  ASSERT_EQ(te_scaled_aligned_causal_masked_softmax_fwd(&in_a, &out_a, 1.0f, nullptr), TE_SUCCESS) << last_error();
  const float want[8] = {0, 0, 0, 0, 1, 0};
  for (int e = 0; e < 6; ++e) EXPECT_EQ(ya[e], want[e]) << "element " << e;
  EXPECT_GT(ya[6], 0.0f);
  EXPECT_NEAR(ya[6] + ya[7], 1.0f, 1e-6f);
}

// The masked logit is -10000 itself, not scaled, and masked positions join the
// sum: with kept logits near it, masked positions get their share.
TEST(Softmax, MaskedLogitIsMinusTenThousand) {
  std::vector<float> x = {-9999.0f, 5.0f};  // x[1] is masked
  std::vector<float> y(2);
  std::vector<uint8_t> mask = {0, 1};
  te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {1, 1, 1, 2}, x.data());
  te_tensor out = make_tensor(TE_DTYPE_FLOAT32, {1, 1, 1, 2}, y.data());
  te_tensor tm = make_tensor(TE_DTYPE_UINT8, {1, 1, 1, 2}, mask.data());
  ASSERT_EQ(te_scaled_masked_softmax_fwd(&in, &tm, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
  const double e = std::exp(-1.0);  // exp(-10000 - (-9999))
  EXPECT_NEAR(y[0], 1.0 / (1.0 + e), 1e-6);
  EXPECT_NEAR(y[1], e / (1.0 + e), 1e-6);
  // any nonzero mask value masks
  mask[1] = 7;
  ASSERT_EQ(te_scaled_masked_softmax_fwd(&in, &tm, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
  EXPECT_NEAR(y[1], e / (1.0 + e), 1e-6);
}

// ---- backward -----------------------------------------------------------------------------------

struct BwdCase {
  Kind kind;
  std::vector<int64_t> shape;
  float scale;
};

TEST(Softmax, BackwardMatchesFloat64Reference) {
  const BwdCase cases[] = {
      {Kind::kPlain, {2, 3, 5, 7}, 0.5f},   {Kind::kPlain, {3, 1}, 2.0f},
      {Kind::kPlain, {1, 1, 2, 300}, 1.0f}, {Kind::kMasked, {2, 2, 3, 17}, -1.5f},
      {Kind::kUpperTriang, {3, 9, 9}, 0.7f}, {Kind::kAlignedCausal, {2, 2, 7, 5}, 1.0f},
      {Kind::kAlignedCausal, {1, 2, 4, 9}, 0.25f},
  };
  uint32_t seed = 100;
  for (const BwdCase& c : cases) {
    for (te_dtype d : kDtypes) {
      SCOPED_TRACE(std::string(kind_name(c.kind)) + " " + dtype_str(d) + " " + shape_str(c.shape));
      const size_t n = size_t(numel_of(c.shape));
      const int64_t sk = c.shape.back();
      const int64_t sq = c.kind == Kind::kPlain ? 1 : c.shape[c.shape.size() - 2];
      std::vector<double> dy, y;
      Buffer dyb = random_buffer(d, n, 1.0, seed++, &dy);
      // y: positive values; at positions a causal kind masks, a large value the op
      // must not read (the forward writes 0 there; the backward skips them).
      Buffer yb(n * elem_size(d));
      y.resize(n);
      std::mt19937 rng(seed++);
      std::uniform_real_distribution<double> u01(0.0, 1.0);
      const Problem pb{c.kind, c.shape, {1, 1, sq, sk}, c.scale};
      for (size_t e = 0; e < n; ++e) {
        const int64_t r = int64_t(e) / sk, j = int64_t(e) % sk;
        const bool skipped = (c.kind == Kind::kUpperTriang || c.kind == Kind::kAlignedCausal) &&
                             position(pb, {}, r, j).masked;
        y[e] = store_value(yb, d, e, skipped ? 1000.0f : float(u01(rng)));
      }
      Buffer dxb(n * elem_size(d));
      te_tensor tdy = make_tensor(d, c.shape, dyb.data());
      te_tensor ty = make_tensor(d, c.shape, yb.data());
      te_tensor tdx = make_tensor(d, c.shape, dxb.data());
      ASSERT_EQ(run_bwd(c.kind, &tdy, &ty, &tdx, c.scale), TE_SUCCESS) << last_error();
      int failures = 0;
      for (int64_t r = 0; r < int64_t(n) / sk; ++r) {
        double dot = 0.0, abs_dot = 0.0;
        const bool causal = c.kind == Kind::kUpperTriang || c.kind == Kind::kAlignedCausal;
        auto kept = [&](int64_t j) { return !causal || !position(pb, {}, r, j).masked; };
        for (int64_t j = 0; j < sk; ++j) {
          if (!kept(j)) continue;
          const size_t e = size_t(r * sk + j);
          dot += dy[e] * y[e];
          abs_dot += std::fabs(dy[e] * y[e]);
        }
        for (int64_t j = 0; j < sk && failures < 5; ++j) {
          const size_t e = size_t(r * sk + j);
          const double got = value_at(dxb, d, e);
          if (!kept(j)) {
            if (got != 0.0) {
              ADD_FAILURE() << "element " << e << " is masked out: want 0, got " << got;
              ++failures;
            }
            continue;
          }
          const double g = dy[e] * y[e];
          const double want = double(c.scale) * (g - y[e] * dot);
          const double bound =
              2.0 * std::fabs(double(c.scale)) * kU *
                  (2.0 * std::fabs(g) + 2.0 * std::fabs(y[e] * dot) + double(sk + 2) * y[e] * abs_dot) +
              kU * std::fabs(want);
          const double total = bound + unit_roundoff(d) * (std::fabs(want) + bound) + half_min_step(d);
          if (!(std::fabs(got - want) <= total)) {
            ADD_FAILURE() << "element " << e << ": got " << got << ", want " << want << " +- " << total;
            ++failures;
          }
        }
      }
      EXPECT_TRUE(dxb.guard_intact());
    }
  }
}

// grad_input == grad_output: the same bits as into a separate buffer.
TEST(Softmax, BackwardInPlace) {
  for (Kind kind : {Kind::kPlain, Kind::kMasked, Kind::kUpperTriang, Kind::kAlignedCausal}) {
    for (te_dtype d : kDtypes) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " " + dtype_str(d));
      const std::vector<int64_t> shape =
          kind == Kind::kUpperTriang ? std::vector<int64_t>{4, 13, 13} : std::vector<int64_t>{2, 2, 13, 21};
      const size_t n = size_t(numel_of(shape));
      std::vector<double> unused;
      Buffer dy = random_buffer(d, n, 1.0, 7, &unused);
      Buffer y = random_buffer(d, n, 0.2, 8, &unused);
      Buffer dx(n * elem_size(d));
      te_tensor tdy = make_tensor(d, shape, dy.data());
      te_tensor ty = make_tensor(d, shape, y.data());
      te_tensor tdx = make_tensor(d, shape, dx.data());
      ASSERT_EQ(run_bwd(kind, &tdy, &ty, &tdx, 0.75f), TE_SUCCESS) << last_error();
      ASSERT_EQ(run_bwd(kind, &tdy, &ty, &tdy, 0.75f), TE_SUCCESS) << last_error();
      EXPECT_EQ(memcmp(dy.data(), dx.data(), n * elem_size(d)), 0);
    }
  }
}

// Tensors with no elements: success, nothing read or written, null data allowed.
TEST(Softmax, EmptyTensorsAreNoOps) {
  Buffer poison(64);
  const std::vector<std::vector<int64_t>> shapes4 = {{0, 2, 3, 4}, {2, 0, 3, 4}, {2, 2, 0, 4}, {2, 2, 3, 0}};
  for (const auto& shape : shapes4) {
    SCOPED_TRACE(shape_str(shape));
    te_tensor in = make_tensor(TE_DTYPE_BFLOAT16, shape, nullptr);
    te_tensor out = make_tensor(TE_DTYPE_BFLOAT16, shape, poison.data());
    std::vector<int64_t> ms = {1, 1, shape[2], shape[3]};
    te_tensor tm = make_tensor(TE_DTYPE_UINT8, ms, nullptr);
    EXPECT_EQ(te_scaled_softmax_fwd(&in, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(te_scaled_masked_softmax_fwd(&in, &tm, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(te_scaled_aligned_causal_masked_softmax_fwd(&in, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(te_scaled_softmax_bwd(&in, &in, &out, 1.0f, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(te_scaled_aligned_causal_masked_softmax_bwd(&in, &in, &out, 1.0f, nullptr), TE_SUCCESS)
        << last_error();
  }
  te_tensor in3 = make_tensor(TE_DTYPE_FLOAT16, {3, 0, 0}, nullptr);
  te_tensor out3 = make_tensor(TE_DTYPE_FLOAT16, {3, 0, 0}, poison.data());
  EXPECT_EQ(te_scaled_upper_triang_masked_softmax_fwd(&in3, &out3, 1.0f, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(te_scaled_upper_triang_masked_softmax_bwd(&in3, &in3, &out3, 1.0f, nullptr), TE_SUCCESS)
      << last_error();
  EXPECT_TRUE(poison.all_poison());
}

// ---- bad input ----------------------------------------------------------------------------------

// Valid forward arguments of `kind`: fp32 [2, 3, 4, 8] ([6, 8, 8] upper-triangular),
// a uint8 mask [1, 1, 4, 8], an fp32 output of the same shape.
struct FwdArgs {
  Kind kind;
  std::vector<int64_t> shape;
  std::vector<float> x;
  std::vector<uint8_t> mask;
  Buffer y;
  te_tensor in, tm, out;
  const te_tensor *in_ptr = &in, *mask_ptr = &tm, *out_ptr = &out;
  float scale = 0.5f;

  explicit FwdArgs(Kind k)
      : kind(k),
        shape(k == Kind::kUpperTriang ? std::vector<int64_t>{6, 8, 8} : std::vector<int64_t>{2, 3, 4, 8}),
        x(size_t(numel_of(shape)), 0.25f),
        mask(4 * 8, 0),
        y(size_t(numel_of(shape)) * 4) {
    in = make_tensor(TE_DTYPE_FLOAT32, shape, x.data());
    tm = make_tensor(TE_DTYPE_UINT8, {1, 1, 4, 8}, mask.data());
    out = make_tensor(TE_DTYPE_FLOAT32, shape, y.data());
  }
  FwdArgs(const FwdArgs&) = delete;
  te_status run() { return run_fwd(kind, in_ptr, mask_ptr, out_ptr, scale); }
  bool untouched() const { return y.all_poison(); }
};

struct FwdBadCase {
  const char* name;
  std::vector<Kind> kinds;
  std::function<void(FwdArgs&)> spoil;
  te_status status;
  std::vector<std::string> parts;
};

const std::vector<Kind> kAllKinds = {Kind::kPlain, Kind::kMasked, Kind::kUpperTriang, Kind::kAlignedCausal};

TEST(SoftmaxBadInput, BaselinesSucceed) {
  for (Kind k : kAllKinds) {
    FwdArgs a(k);
    EXPECT_EQ(a.run(), TE_SUCCESS) << kind_name(k) << ": " << last_error();
    EXPECT_FALSE(a.untouched());
  }
}

TEST(SoftmaxBadInput, Forward) {
  const Kind P = Kind::kPlain, M = Kind::kMasked, U = Kind::kUpperTriang, A = Kind::kAlignedCausal;
  const FwdBadCase cases[] = {
      {"null input", kAllKinds, [](FwdArgs& a) { a.in_ptr = nullptr; }, INV, {"input must not be null"}},
      {"null output", kAllKinds, [](FwdArgs& a) { a.out_ptr = nullptr; }, INV, {"output must not be null"}},
      {"null mask", {M}, [](FwdArgs& a) { a.mask_ptr = nullptr; }, INV, {"mask must not be null"}},
      {"fp8 input", kAllKinds, [](FwdArgs& a) { a.in.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"input dtype must be float32, float16 or bfloat16, got float8_e4m3"}},
      {"int32 input", kAllKinds, [](FwdArgs& a) { a.in.dtype = TE_DTYPE_INT32; }, INV,
       {"input dtype must be float32, float16 or bfloat16, got int32"}},
      {"output dtype", kAllKinds, [](FwdArgs& a) { a.out.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"output dtype must equal input dtype float32, got bfloat16"}},
      {"output shape", kAllKinds, [](FwdArgs& a) { a.out.shape[0] = 1; }, INV, {"output shape", "must equal input shape"}},
      {"scalar input", {P}, [](FwdArgs& a) { a.in.ndim = 0; a.out.ndim = 0; }, INV,
       {"input must have at least one dimension"}},
      {"3D input", {M, A}, [](FwdArgs& a) { a.in.ndim = 3; a.out.ndim = 3; }, INV,
       {"input must be 4D [b, h, sq, sk], got shape [2, 3, 4]"}},
      {"4D input", {U}, [](FwdArgs& a) { a.in.ndim = 4; a.out.ndim = 4; a.in.shape[3] = 1; a.out.shape[3] = 1; },
       INV, {"input must be 3D [attn_batches, sq, sk], got shape [6, 8, 8, 1]"}},
      {"not square", {U}, [](FwdArgs& a) { a.in.shape[2] = 4; a.out.shape[2] = 4; }, INV,
       {"input must be square in its last two dims (sq == sk)", "[6, 8, 4]"}},
      {"mask dtype", {M}, [](FwdArgs& a) { a.tm.dtype = TE_DTYPE_FLOAT32; }, INV,
       {"mask dtype must be uint8", "got float32"}},
      {"mask heads", {M}, [](FwdArgs& a) { a.tm.shape[1] = 3; }, INV,
       {"mask shape [1, 3, 4, 8] must be [2 or 1, 1, 4, 8] for input shape [2, 3, 4, 8]"}},
      {"mask batch", {M}, [](FwdArgs& a) { a.tm.shape[0] = 3; }, INV, {"mask shape [3, 1, 4, 8] must be [2 or 1"}},
      {"mask sk", {M}, [](FwdArgs& a) { a.tm.shape[3] = 7; }, INV, {"mask shape [1, 1, 4, 7]"}},
      {"mask 3D", {M}, [](FwdArgs& a) { a.tm.ndim = 3; }, INV, {"mask shape [1, 1, 4] must be"}},
      {"null input data", kAllKinds, [](FwdArgs& a) { a.in.data = nullptr; }, INV, {"input.data must not be null"}},
      {"null output data", kAllKinds, [](FwdArgs& a) { a.out.data = nullptr; }, INV,
       {"output.data must not be null"}},
      {"null mask data", {M}, [](FwdArgs& a) { a.tm.data = nullptr; }, INV, {"mask.data must not be null"}},
      {"negative dim", kAllKinds, [](FwdArgs& a) { a.in.shape[0] = -1; }, INV, {"input shape must not be negative"}},
      {"nan scale", kAllKinds, [](FwdArgs& a) { a.scale = NAN; }, INV, {"scale must be finite, got nan"}},
      {"inf scale", kAllKinds, [](FwdArgs& a) { a.scale = INFINITY; }, INV, {"scale must be finite, got inf"}},
      {"output overlaps input", kAllKinds, [](FwdArgs& a) { a.out.data = a.x.data() + 3; }, INV,
       {"output must not overlap input in memory"}},
      {"output is input", kAllKinds, [](FwdArgs& a) { a.out.data = a.x.data(); }, INV,
       {"output must not overlap input in memory"}},
  };
  for (const FwdBadCase& c : cases) {
    for (Kind k : c.kinds) {
      SCOPED_TRACE(std::string(c.name) + " / " + kind_name(k));
      FwdArgs a(k);
      c.spoil(a);
      EXPECT_TRUE(is_error(a.run(), c.status, fwd_op(k), c.parts));
      EXPECT_TRUE(a.untouched());
    }
  }
}

// Valid backward arguments: fp32 dy, y, dx of `kind`'s shape (as FwdArgs); y has
// room past its end, so that a shifted view of it stays inside it.
struct BwdArgs {
  Kind kind;
  std::vector<int64_t> shape;
  std::vector<float> dy, y;
  Buffer dx;
  te_tensor tdy, ty, tdx;
  const te_tensor *dy_ptr = &tdy, *y_ptr = &ty, *dx_ptr = &tdx;
  float scale = 0.5f;

  explicit BwdArgs(Kind k)
      : kind(k),
        shape(k == Kind::kUpperTriang ? std::vector<int64_t>{6, 8, 8} : std::vector<int64_t>{2, 3, 4, 8}),
        dy(size_t(numel_of(shape)), 0.5f),
        y(2 * size_t(numel_of(shape)), 0.125f),
        dx(size_t(numel_of(shape)) * 4) {
    tdy = make_tensor(TE_DTYPE_FLOAT32, shape, dy.data());
    ty = make_tensor(TE_DTYPE_FLOAT32, shape, y.data());
    tdx = make_tensor(TE_DTYPE_FLOAT32, shape, dx.data());
  }
  BwdArgs(const BwdArgs&) = delete;
  te_status run() { return run_bwd(kind, dy_ptr, y_ptr, dx_ptr, scale); }
  bool untouched() const { return dx.all_poison(); }
};

struct BwdBadCase {
  const char* name;
  std::vector<Kind> kinds;
  std::function<void(BwdArgs&)> spoil;
  std::vector<std::string> parts;
};

TEST(SoftmaxBadInput, Backward) {
  const Kind P = Kind::kPlain, M = Kind::kMasked, U = Kind::kUpperTriang, A = Kind::kAlignedCausal;
  for (Kind k : kAllKinds) {
    BwdArgs a(k);
    EXPECT_EQ(a.run(), TE_SUCCESS) << kind_name(k) << ": " << last_error();
  }
  const BwdBadCase cases[] = {
      {"null grad_output", kAllKinds, [](BwdArgs& a) { a.dy_ptr = nullptr; }, {"grad_output must not be null"}},
      {"null softmax_output", kAllKinds, [](BwdArgs& a) { a.y_ptr = nullptr; }, {"softmax_output must not be null"}},
      {"null grad_input", kAllKinds, [](BwdArgs& a) { a.dx_ptr = nullptr; }, {"grad_input must not be null"}},
      {"y dtype", kAllKinds, [](BwdArgs& a) { a.ty.dtype = TE_DTYPE_UINT8; }, {"softmax_output dtype must be"}},
      {"dy dtype", kAllKinds, [](BwdArgs& a) { a.tdy.dtype = TE_DTYPE_FLOAT16; },
       {"grad_output dtype must equal softmax_output dtype float32, got float16"}},
      {"dx dtype", kAllKinds, [](BwdArgs& a) { a.tdx.dtype = TE_DTYPE_BFLOAT16; },
       {"grad_input dtype must equal softmax_output dtype float32, got bfloat16"}},
      {"dy shape", kAllKinds, [](BwdArgs& a) { a.tdy.shape[1] = 1; }, {"grad_output shape", "must equal"}},
      {"dx shape", kAllKinds, [](BwdArgs& a) { a.tdx.shape[0] = 1; }, {"grad_input shape", "must equal"}},
      {"3D", {M, A}, [](BwdArgs& a) { a.ty.ndim = a.tdy.ndim = a.tdx.ndim = 3; },
       {"softmax_output must be 4D [b, h, sq, sk]"}},
      {"not square", {U}, [](BwdArgs& a) { a.ty.shape[1] = a.tdy.shape[1] = a.tdx.shape[1] = 4; },
       {"softmax_output must be square"}},
      {"scalar", {P}, [](BwdArgs& a) { a.ty.ndim = a.tdy.ndim = a.tdx.ndim = 0; },
       {"softmax_output must have at least one dimension"}},
      {"null dy data", kAllKinds, [](BwdArgs& a) { a.tdy.data = nullptr; }, {"grad_output.data must not be null"}},
      {"null y data", kAllKinds, [](BwdArgs& a) { a.ty.data = nullptr; }, {"softmax_output.data must not be null"}},
      {"null dx data", kAllKinds, [](BwdArgs& a) { a.tdx.data = nullptr; }, {"grad_input.data must not be null"}},
      {"nan scale", kAllKinds, [](BwdArgs& a) { a.scale = NAN; }, {"scale must be finite"}},
      {"dx shifted into dy", kAllKinds, [](BwdArgs& a) { a.tdx.data = a.dy.data() + 1; },
       {"grad_input must not overlap grad_output (unless it is the same buffer)"}},
      {"dx overlaps y", kAllKinds, [](BwdArgs& a) { a.tdx.data = a.y.data() + 8; },
       {"grad_input must not overlap softmax_output"}},
      {"dx is y", kAllKinds, [](BwdArgs& a) { a.tdx.data = a.y.data(); },
       {"grad_input must not overlap softmax_output"}},
  };
  for (const BwdBadCase& c : cases) {
    for (Kind k : c.kinds) {
      SCOPED_TRACE(std::string(c.name) + " / " + kind_name(k));
      BwdArgs a(k);
      const std::vector<float> dy0 = a.dy, y0 = a.y;
      c.spoil(a);
      EXPECT_TRUE(is_error(a.run(), INV, bwd_op(k), c.parts));
      EXPECT_TRUE(a.untouched());
      EXPECT_EQ(a.dy, dy0);
      EXPECT_EQ(a.y, y0);
    }
  }
}

// One tensor on a GPU, the others on the CPU. A CPU-only build refuses the CUDA
// tensor itself (naming it); a CUDA build reports the mismatch.
TEST(SoftmaxBadInput, MismatchedDevices) {
  const struct {
    const char* arg;
    std::function<te_tensor&(FwdArgs&)> pick;
  } fwd[] = {
      {"output", [](FwdArgs& a) -> te_tensor& { return a.out; }},
      {"mask", [](FwdArgs& a) -> te_tensor& { return a.tm; }},
  };
  for (const auto& c : fwd) {
    SCOPED_TRACE(c.arg);
    FwdArgs a(Kind::kMasked);
    c.pick(a).device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, fwd_op(Kind::kMasked), {std::string(c.arg) + " is on cuda:0 but input is on cpu"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, fwd_op(Kind::kMasked), {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
  const struct {
    const char* arg;
    std::function<te_tensor&(BwdArgs&)> pick;
  } bwd[] = {
      {"grad_output", [](BwdArgs& a) -> te_tensor& { return a.tdy; }},
      {"grad_input", [](BwdArgs& a) -> te_tensor& { return a.tdx; }},
  };
  for (const auto& c : bwd) {
    SCOPED_TRACE(c.arg);
    BwdArgs a(Kind::kPlain);
    c.pick(a).device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, bwd_op(Kind::kPlain),
                           {std::string(c.arg) + " is on cuda:0 but softmax_output is on cpu"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, bwd_op(Kind::kPlain), {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

}  // namespace
