// te_dbias_cast_transpose / te_dact_dbias_cast_transpose against float64
// computations written here (activation_reference.h for dx), and their
// bad-input handling.
//
// Bounds: dx per element as in test_activation.cpp (the fp32 error bound of the
// formula, then the output's rounding; FP8 codes must be the cast of some value
// within the bound of dx * scale). dbias = sum over rows of the fp32 dx, summed
// by the core in double and rounded once, so its error is at most the sum of the
// elements' bounds plus the final rounding to fp32 and to dbias's dtype:
//   |dbias - sum dx| <= sum err + (u_dtype + 2u) |sum dx| + half the dtype's smallest step.
// Without an activation dx = grad exactly, so the FP8 codes are the cast of
// grad * scale (scale a power of two: the product is exact) and dbias is bounded
// by its final roundings alone.
#include <algorithm>
#include <functional>

#include "activation_reference.h"
#include "test_util.h"

namespace {

using namespace tt;

const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;
constexpr uint32_t kPoisonBits = 0xABABABABu;
constexpr te_dtype kFp8Types[] = {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2};

double dbias_bound(double sum, double err_sum, te_dtype d) {
  return err_sum + (unit_roundoff(d) + 2 * kU) * std::fabs(sum) + half_min_step(d);
}

// Layouts of an FP8 output: row-wise only, column-wise only, both.
enum Layout { kRowwise = 0, kColumnwise = 1, kBoth = 2 };
bool has_rows(int layout) { return layout != kColumnwise; }
bool has_cols(int layout) { return layout != kRowwise; }

// An FP8 output [rows, cols] (with leading dims `shape`) and its buffers.
struct Fp8Out {
  Buffer data, data_t;
  float scale, scale_inv = f32(kPoisonBits), amax;
  te_tensor t;
  Fp8Out(te_dtype dtype, const std::vector<int64_t>& shape, int64_t n, int layout, float scale_v, float prior_amax)
      : data(n), data_t(n), scale(scale_v), amax(prior_amax) {
    t = make_tensor(dtype, shape, has_rows(layout) ? data.data() : nullptr, cpu(), TE_SCALING_PER_TENSOR);
    t.columnwise_data = has_cols(layout) ? data_t.data() : nullptr;
    t.scale = &scale;
    t.scale_inv = &scale_inv;
    t.amax = &amax;
  }
  Fp8Out(const Fp8Out&) = delete;
};

TEST(DbiasCastTranspose, EveryDtypeAndLayout) {
  const int64_t d0 = 3, d1 = 5, rows = d0 * d1, cols = 37, n = rows * cols;
  for (te_dtype in_t : kFloatTypes) {
    for (te_dtype out_t : kFp8Types) {
      for (int layout : {kRowwise, kColumnwise, kBoth}) {
        SCOPED_TRACE(::testing::Message() << dtype_str(in_t) << " -> " << dtype_str(out_t) << " layout " << layout);
        const Format& f = format_of(out_t);
        Buffer gb(n * elem_size(in_t)), db(cols * elem_size(in_t));
        const std::vector<float> g = random_inputs(gb, in_t, n, 31 + in_t * 3 + out_t + layout);
        const float scale = out_t == TE_DTYPE_FLOAT8_E4M3 ? 16.0f : 0.5f;
        Fp8Out out(out_t, {d0, d1, cols}, n, layout, scale, 0.5f);
        te_tensor grad = make_tensor(in_t, {d0, d1, cols}, gb.data());
        te_tensor dbias = make_tensor(in_t, {cols}, db.data());
        ASSERT_EQ(te_dbias_cast_transpose(&grad, &out.t, &dbias, nullptr, 0, nullptr), TE_SUCCESS) << last_error();
        EXPECT_TRUE(gb.guard_intact() && db.guard_intact() && out.data.guard_intact() && out.data_t.guard_intact());
        EXPECT_EQ(out.data.all_poison(), !has_rows(layout));
        EXPECT_EQ(out.data_t.all_poison(), !has_cols(layout));
        EXPECT_EQ(out.scale_inv, 1.0f / scale);
        double max_abs = 0.5;
        int bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const double x = g[r * cols + c];
            max_abs = std::max(max_abs, std::fabs(x));
            const uint32_t want = ref_encode(f, x * scale);
            if (has_rows(layout) && !same_code(f, out.data.get<uint8_t>(r * cols + c), want) && bad++ < 5) {
              ADD_FAILURE() << "rowwise (" << r << ", " << c << "): " << int(out.data.get<uint8_t>(r * cols + c))
                            << ", want " << want << " for " << x * scale;
            }
            if (has_cols(layout) && !same_code(f, out.data_t.get<uint8_t>(c * rows + r), want) && bad++ < 5) {
              ADD_FAILURE() << "columnwise (" << c << ", " << r << "): " << int(out.data_t.get<uint8_t>(c * rows + r))
                            << ", want " << want;
            }
          }
        }
        EXPECT_EQ(bad, 0);
        EXPECT_EQ(out.amax, float(max_abs));
        for (int64_t c = 0; c < cols; ++c) {
          double sum = 0;
          for (int64_t r = 0; r < rows; ++r) sum += g[r * cols + c];
          const double got = value_at(db, in_t, c);
          EXPECT_LE(std::fabs(got - sum), dbias_bound(sum, 0.0, in_t)) << "dbias[" << c << "] = " << got << ", want "
                                                                         << sum;
        }
      }
    }
  }
}

TEST(DbiasCastTranspose, OneDimensionalGradIsOneRow) {
  float g[5] = {1.0f, -2.0f, 0.5f, 0.0f, 3.0f}, dbias[5] = {};
  uint8_t q[5], qt[5];
  float scale = 1.0f, scale_inv = 0.0f;
  te_tensor grad = make_tensor(TE_DTYPE_FLOAT32, {5}, g);
  te_tensor out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {5}, q, cpu(), TE_SCALING_PER_TENSOR);
  out.columnwise_data = qt;
  out.scale = &scale;
  out.scale_inv = &scale_inv;
  te_tensor db = make_tensor(TE_DTYPE_FLOAT32, {5}, dbias);
  ASSERT_EQ(te_dbias_cast_transpose(&grad, &out, &db, nullptr, 0, nullptr), TE_SUCCESS) << last_error();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(dbias[i], g[i]);
    EXPECT_EQ(q[i], ref_encode(kE4M3, g[i]));
    EXPECT_EQ(qt[i], q[i]);
  }
}

// Current scaling: amax = max|grad| written (the prior value not kept), scale =
// fp8_max / amax rounded down to a power of two (so grad * scale is exact), the codes
// and dbias as te_dbias_cast_transpose's with that scale.
TEST(DbiasCastTransposeCurrentScaling, ScaleFromTheGradThenCast) {
  const int64_t rows = 24, cols = 40, n = rows * cols;
  for (te_dtype in_t : kFloatTypes) {
    for (te_dtype out_t : kFp8Types) {
      SCOPED_TRACE(::testing::Message() << dtype_str(in_t) << " -> " << dtype_str(out_t));
      const Format& f = format_of(out_t);
      Buffer gb(n * elem_size(in_t)), db(cols * elem_size(in_t));
      const std::vector<float> g = random_inputs(gb, in_t, n, 77 + in_t + out_t);
      Fp8Out out(out_t, {rows, cols}, n, kBoth, f32(kPoisonBits), 1e30f);
      te_tensor grad = make_tensor(in_t, {rows, cols}, gb.data());
      te_tensor dbias = make_tensor(in_t, {cols}, db.data());
      ASSERT_EQ(te_dbias_cast_transpose_current_scaling(&grad, &out.t, &dbias, 0.0f, 1, nullptr, 0, nullptr),
                TE_SUCCESS)
          << last_error();
      double max_abs = 0;
      for (float x : g) max_abs = std::max(max_abs, std::fabs(double(x)));
      EXPECT_EQ(out.amax, float(max_abs));
      const float fp8_max = out_t == TE_DTYPE_FLOAT8_E4M3 ? 448.0f : 57344.0f;
      const float want_scale = std::exp2(std::floor(std::log2(fp8_max / float(max_abs))));
      EXPECT_EQ(out.scale, want_scale);
      EXPECT_EQ(out.scale_inv, 1.0f / want_scale);
      int bad = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const uint32_t want = ref_encode(f, double(g[r * cols + c]) * want_scale);
          if ((!same_code(f, out.data.get<uint8_t>(r * cols + c), want) ||
               !same_code(f, out.data_t.get<uint8_t>(c * rows + r), want)) &&
              bad++ < 5) {
            ADD_FAILURE() << "(" << r << ", " << c << "): " << int(out.data.get<uint8_t>(r * cols + c)) << ", want "
                          << want;
          }
        }
      }
      EXPECT_EQ(bad, 0);
      for (int64_t c = 0; c < cols; ++c) {
        double sum = 0;
        for (int64_t r = 0; r < rows; ++r) sum += g[r * cols + c];
        EXPECT_LE(std::fabs(value_at(db, in_t, c) - sum), dbias_bound(sum, 0.0, in_t)) << "dbias[" << c << "]";
      }
    }
  }
}

// An all-zero gradient: amax 0, so the scale comes from epsilon (448 / 2 = 224, no power
// of two asked); dbias 0.
TEST(DbiasCastTransposeCurrentScaling, EpsilonBoundsTheScale) {
  float g[16] = {}, dbias[8];
  std::fill(dbias, dbias + 8, 5.0f);
  uint8_t q[16];
  float scale = 0.0f, scale_inv = 0.0f, amax = 9.0f;
  te_tensor grad = make_tensor(TE_DTYPE_FLOAT32, {2, 8}, g);
  te_tensor out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {2, 8}, q, cpu(), TE_SCALING_PER_TENSOR);
  out.scale = &scale;
  out.scale_inv = &scale_inv;
  out.amax = &amax;
  te_tensor db = make_tensor(TE_DTYPE_FLOAT32, {8}, dbias);
  ASSERT_EQ(te_dbias_cast_transpose_current_scaling(&grad, &out, &db, 2.0f, 0, nullptr, 0, nullptr), TE_SUCCESS)
      << last_error();
  EXPECT_EQ(amax, 0.0f);
  EXPECT_EQ(scale, 224.0f);
  EXPECT_EQ(scale_inv, 1.0f / 224.0f);
  for (float d : dbias) EXPECT_EQ(d, 0.0f);
}

TEST(DbiasCastTransposeCurrentScaling, BadInputIsNamedAndWritesNothing) {
  float g[16] = {1.0f}, dbias[8] = {}, scale = 3.0f, scale_inv = 3.0f, amax = 3.0f;
  uint8_t q[16] = {};
  te_tensor grad = make_tensor(TE_DTYPE_FLOAT32, {2, 8}, g);
  te_tensor db = make_tensor(TE_DTYPE_FLOAT32, {8}, dbias);
  auto output = [&] {
    te_tensor out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {2, 8}, q, cpu(), TE_SCALING_PER_TENSOR);
    out.scale = &scale;
    out.scale_inv = &scale_inv;
    out.amax = &amax;
    return out;
  };
  const char* op = "te_dbias_cast_transpose_current_scaling";
  te_tensor no_amax = output();
  no_amax.amax = nullptr;
  EXPECT_TRUE(is_error(te_dbias_cast_transpose_current_scaling(&grad, &no_amax, &db, 0.0f, 0, nullptr, 0, nullptr),
                       INV, op, {"output.amax"}));
  te_tensor no_scale = output();
  no_scale.scale = nullptr;
  EXPECT_TRUE(is_error(te_dbias_cast_transpose_current_scaling(&grad, &no_scale, &db, 0.0f, 0, nullptr, 0, nullptr),
                       INV, op, {"output.scale"}));
  te_tensor out = output();
  for (float eps : {-1.0f, NAN, INFINITY}) {
    EXPECT_TRUE(is_error(te_dbias_cast_transpose_current_scaling(&grad, &out, &db, eps, 0, nullptr, 0, nullptr), INV,
                         op, {"epsilon"}));
  }
  te_tensor short_dbias = make_tensor(TE_DTYPE_FLOAT32, {7}, dbias);
  EXPECT_TRUE(is_error(
      te_dbias_cast_transpose_current_scaling(&grad, &out, &short_dbias, 0.0f, 0, nullptr, 0, nullptr), INV, op,
      {"dbias shape"}));
  EXPECT_EQ(scale, 3.0f);
  EXPECT_EQ(scale_inv, 3.0f);
  EXPECT_EQ(amax, 3.0f);
  for (uint8_t b : q) EXPECT_EQ(b, 0);
  if (!te_built_with_cuda()) {
    te_tensor cuda_grad = grad, cuda_out = out, cuda_db = db;
    cuda_grad.device = cuda_out.device = cuda_db.device = cuda(0);
    EXPECT_TRUE(is_error(
        te_dbias_cast_transpose_current_scaling(&cuda_grad, &cuda_out, &cuda_db, 0.0f, 0, nullptr, 0, nullptr), NIMP,
        op, {"CUDA"}));
  }
}

TEST(DactDbiasCastTranspose, EveryKindDtypeAndOutput) {
  const int64_t d0 = 4, d1 = 3, rows = d0 * d1, h = 21;
  const te_dtype outputs[] = {TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2};
  for (const Kind& k : kKinds) {
    const int64_t cols = k.gated ? 2 * h : h, n = rows * cols;
    for (te_dtype in_t : kFloatTypes) {
      for (te_dtype out_t : outputs) {
        SCOPED_TRACE(::testing::Message() << k.name << " " << dtype_str(in_t) << " -> " << dtype_str(out_t));
        const size_t es = elem_size(in_t);
        const bool fp8 = elem_size(out_t) == 1;
        Buffer xb(n * es), gb(rows * h * es), db(cols * es), yb(n * elem_size(out_t));
        const std::vector<float> x = random_inputs(xb, in_t, n, 301 + k.kind * 7 + in_t);
        const std::vector<float> g = random_inputs(gb, in_t, rows * h, 401 + k.kind * 7 + in_t);
        te_tensor in = make_tensor(in_t, {d0, d1, cols}, xb.data());
        te_tensor grad = make_tensor(in_t, {d0, d1, h}, gb.data());
        te_tensor dbias = make_tensor(in_t, {cols}, db.data());
        const float scale = 2.0f;
        Fp8Out q(fp8 ? out_t : TE_DTYPE_FLOAT8_E4M3, {d0, d1, cols}, n, kBoth, scale, 0.0f);
        te_tensor out = fp8 ? q.t : make_tensor(out_t, {d0, d1, cols}, yb.data());
        ASSERT_EQ(te_dact_dbias_cast_transpose(k.kind, &grad, &in, &out, &dbias, nullptr, 0, nullptr), TE_SUCCESS)
            << last_error();
        EXPECT_TRUE(db.guard_intact() && yb.guard_intact() && q.data.guard_intact() && q.data_t.guard_intact());
        int bad = 0;
        double max_abs = 0, max_err = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const Ref ref = ref_backward(k, g, x, r, c, h);
            if (std::fabs(ref.v) >= max_abs) max_abs = std::fabs(ref.v), max_err = ref.err;
            if (!fp8) {
              const double got = value_at(yb, out_t, r * cols + c);
              if (!(std::fabs(got - ref.v) <= with_rounding(ref, out_t)) && bad++ < 5) {
                ADD_FAILURE() << "(" << r << ", " << c << "): got " << got << ", want " << ref.v << " +- "
                              << with_rounding(ref, out_t);
              }
              continue;
            }
            const Format& f = format_of(out_t);
            const double e = ref.err * scale + kU * std::fabs(ref.v * scale);
            const int lo = fp8_ordinal(ref_encode(f, ref.v * scale - e));
            const int hi = fp8_ordinal(ref_encode(f, ref.v * scale + e));
            const uint32_t code = q.data.get<uint8_t>(r * cols + c);
            const int o = fp8_ordinal(code);
            if (!(o >= lo && o <= hi) && bad++ < 5) {
              ADD_FAILURE() << "(" << r << ", " << c << "): code " << code << ", want ordinal in [" << lo << ", "
                            << hi << "] for dx*scale " << ref.v * scale;
            }
            if (q.data_t.get<uint8_t>(c * rows + r) != code && bad++ < 5) {
              ADD_FAILURE() << "columnwise (" << c << ", " << r << ") differs from the row-wise code";
            }
          }
        }
        EXPECT_EQ(bad, 0);
        if (fp8) {
          EXPECT_NEAR(q.amax, max_abs, max_err + 1e-30);
          EXPECT_EQ(q.scale_inv, 1.0f / scale);
        }
        for (int64_t c = 0; c < cols; ++c) {
          double sum = 0, err = 0;
          for (int64_t r = 0; r < rows; ++r) {
            const Ref ref = ref_backward(k, g, x, r, c, h);
            sum += ref.v;
            err += ref.err;
          }
          const double got = value_at(db, in_t, c);
          EXPECT_LE(std::fabs(got - sum), dbias_bound(sum, err, in_t)) << "dbias[" << c << "] = " << got << ", want "
                                                                        << sum;
        }
      }
    }
  }
}

// dbias may be null: dx alone, the same values as with dbias.
TEST(DactDbiasCastTranspose, WithoutDbias) {
  const int64_t rows = 6, h = 16;
  for (te_activation kind : {TE_ACTIVATION_GELU, TE_ACTIVATION_SWIGLU}) {
    const int64_t cols = kind == TE_ACTIVATION_SWIGLU ? 2 * h : h;
    Buffer xb(rows * cols * 4), gb(rows * h * 4), db(cols * 4);
    random_inputs(xb, TE_DTYPE_FLOAT32, rows * cols, 5);
    random_inputs(gb, TE_DTYPE_FLOAT32, rows * h, 6);
    te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {rows, cols}, xb.data());
    te_tensor grad = make_tensor(TE_DTYPE_FLOAT32, {rows, h}, gb.data());
    te_tensor dbias = make_tensor(TE_DTYPE_FLOAT32, {cols}, db.data());
    Fp8Out with(TE_DTYPE_FLOAT8_E5M2, {rows, cols}, rows * cols, kBoth, 1.0f, 0.0f);
    Fp8Out without(TE_DTYPE_FLOAT8_E5M2, {rows, cols}, rows * cols, kBoth, 1.0f, 0.0f);
    ASSERT_EQ(te_dact_dbias_cast_transpose(kind, &grad, &in, &with.t, &dbias, nullptr, 0, nullptr), TE_SUCCESS)
        << last_error();
    ASSERT_EQ(te_dact_dbias_cast_transpose(kind, &grad, &in, &without.t, nullptr, nullptr, 0, nullptr), TE_SUCCESS)
        << last_error();
    EXPECT_EQ(with.data.mem, without.data.mem);
    EXPECT_EQ(with.data_t.mem, without.data_t.mem);
    EXPECT_EQ(with.amax, without.amax);
    EXPECT_FALSE(db.all_poison());
  }
}

// Zero rows: dbias is all zeros, an FP8 output gets scale_inv, amax keeps its value.
TEST(BiasGrad, ZeroRows) {
  Buffer db(8 * 4), db2(16 * 2);
  float dummy = 1.0f;
  uint16_t dummy16 = 0;
  te_tensor grad = make_tensor(TE_DTYPE_FLOAT32, {0, 8}, &dummy);
  te_tensor dbias = make_tensor(TE_DTYPE_FLOAT32, {8}, db.data());
  Fp8Out out(TE_DTYPE_FLOAT8_E4M3, {0, 8}, 0, kBoth, 4.0f, 3.0f);
  ASSERT_EQ(te_dbias_cast_transpose(&grad, &out.t, &dbias, nullptr, 0, nullptr), TE_SUCCESS) << last_error();
  for (int c = 0; c < 8; ++c) EXPECT_EQ(db.get<float>(c), 0.0f);
  EXPECT_EQ(out.scale_inv, 0.25f);
  EXPECT_EQ(out.amax, 3.0f);
  EXPECT_TRUE(out.data.all_poison() && out.data_t.all_poison());

  te_tensor in = make_tensor(TE_DTYPE_BFLOAT16, {2, 0, 16}, &dummy16);
  te_tensor g2 = make_tensor(TE_DTYPE_BFLOAT16, {2, 0, 8}, &dummy16);
  te_tensor dx = make_tensor(TE_DTYPE_BFLOAT16, {2, 0, 16}, &dummy16);
  te_tensor dbias2 = make_tensor(TE_DTYPE_BFLOAT16, {16}, db2.data());
  ASSERT_EQ(te_dact_dbias_cast_transpose(TE_ACTIVATION_GEGLU, &g2, &in, &dx, &dbias2, nullptr, 0, nullptr),
            TE_SUCCESS)
      << last_error();
  for (int c = 0; c < 16; ++c) EXPECT_EQ(db2.get<uint16_t>(c), 0u);
}

// A float32 dbias next to bf16 gradients (an fp32 bias under torch.autocast): the same
// sums unrounded, so rounded to bf16 they equal the bf16 dbias bit for bit, for the three
// ops; the FP8 outputs are the same bytes.
TEST(BiasGrad, Float32DbiasWithBf16Gradients) {
  constexpr int64_t kRows = 24, kCols = 16;
  Buffer g(kRows * kCols * 2), x(kRows * kCols * 2);
  for (int64_t i = 0; i < kRows * kCols; ++i) {
    store_value(g, TE_DTYPE_BFLOAT16, size_t(i), float(std::sin(0.37 * double(i))) * 3.0f + 1.0f / 3.0f);
    store_value(x, TE_DTYPE_BFLOAT16, size_t(i), float(std::cos(0.21 * double(i))));
  }
  for (int op = 0; op < 3; ++op) {  // dbias cast, the same under current scaling, dact (gelu)
    Buffer db32(kCols * 4), db16(kCols * 2);
    Fp8Out out32(TE_DTYPE_FLOAT8_E5M2, {kRows, kCols}, kRows * kCols, kBoth, 2.0f, 0.0f);
    Fp8Out out16(TE_DTYPE_FLOAT8_E5M2, {kRows, kCols}, kRows * kCols, kBoth, 2.0f, 0.0f);
    te_tensor grad = make_tensor(TE_DTYPE_BFLOAT16, {kRows, kCols}, g.data());
    te_tensor in = make_tensor(TE_DTYPE_BFLOAT16, {kRows, kCols}, x.data());
    for (bool f32 : {true, false}) {
      te_tensor dbias = f32 ? make_tensor(TE_DTYPE_FLOAT32, {kCols}, db32.data())
                            : make_tensor(TE_DTYPE_BFLOAT16, {kCols}, db16.data());
      Fp8Out& out = f32 ? out32 : out16;
      te_status status = op == 0   ? te_dbias_cast_transpose(&grad, &out.t, &dbias, nullptr, 0, nullptr)
                         : op == 1 ? te_dbias_cast_transpose_current_scaling(&grad, &out.t, &dbias, 0.0f, 0, nullptr,
                                                                             0, nullptr)
                                   : te_dact_dbias_cast_transpose(TE_ACTIVATION_GELU, &grad, &in, &out.t, &dbias,
                                                                  nullptr, 0, nullptr);
      ASSERT_EQ(status, TE_SUCCESS) << "op " << op << ": " << last_error();
    }
    bool some_unrounded = false;
    for (int64_t c = 0; c < kCols; ++c) {
      const float sum = db32.get<float>(size_t(c));
      Buffer rounded(2);
      store_value(rounded, TE_DTYPE_BFLOAT16, 0, sum);
      EXPECT_EQ(rounded.get<uint16_t>(0), db16.get<uint16_t>(size_t(c))) << "op " << op << " column " << c;
      some_unrounded |= float(ref_decode(format_of(TE_DTYPE_BFLOAT16), rounded.get<uint16_t>(0))) != sum;
    }
    EXPECT_TRUE(some_unrounded) << "op " << op << ": the float32 dbias holds bf16 values only";
    EXPECT_EQ(out32.data.mem, out16.data.mem);
    EXPECT_EQ(out32.data_t.mem, out16.data_t.mem);
    EXPECT_TRUE(db32.guard_intact() && db16.guard_intact());
  }
}

TEST(BiasGrad, WorkspaceSize) {
  EXPECT_EQ(te_dbias_workspace_size(1000, 64, cpu()), 0u);
  EXPECT_EQ(te_dbias_workspace_size(1000, 64, cuda(0)), 8u * 64 * 4);  // ceil(1000 / 128) = 8 row blocks
  EXPECT_EQ(te_dbias_workspace_size(128, 3, cuda(0)), 1u * 3 * 4);
  EXPECT_EQ(te_dbias_workspace_size(129, 3, cuda(0)), 2u * 3 * 4);
  EXPECT_EQ(te_dbias_workspace_size(0, 64, cuda(0)), 0u);
  EXPECT_EQ(te_dbias_workspace_size(64, 0, cuda(0)), 0u);
}

// ---------------------------------------------------------------------------
// Bad input: status, "<op>: " prefix, named argument, and nothing written.
// ---------------------------------------------------------------------------

// Valid arguments of both ops: grad fp32 [3, 8]; act_input fp32 [3, 16] for swiglu
// (or [3, 8] for a plain kind); output E4M3 with both layouts; dbias fp32.
struct Args {
  bool dact;
  int32_t kind = TE_ACTIVATION_SWIGLU;
  std::vector<float> x = std::vector<float>(48, 0.5f), g = std::vector<float>(24, 1.0f);
  Buffer y{48}, yt{48}, yf{48 * 4}, db{16 * 4};
  float scale = 2.0f, scale_inv = f32(kPoisonBits), amax = 1.5f;
  te_tensor in, grad, out, dbias;
  const te_tensor *in_ptr = &in, *grad_ptr = &grad, *out_ptr = &out, *dbias_ptr = &dbias;
  void* workspace = nullptr;
  size_t workspace_size = 0;
  explicit Args(bool dact_op) : dact(dact_op) {
    const int64_t cols = dact ? 16 : 8;
    in = make_tensor(TE_DTYPE_FLOAT32, {3, 16}, x.data());
    grad = make_tensor(TE_DTYPE_FLOAT32, {3, 8}, g.data());
    out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {3, cols}, y.data(), cpu(), TE_SCALING_PER_TENSOR);
    out.columnwise_data = yt.data();
    out.scale = &scale;
    out.scale_inv = &scale_inv;
    out.amax = &amax;
    dbias = make_tensor(TE_DTYPE_FLOAT32, {cols}, db.data());
  }
  Args(const Args&) = delete;
  const char* op() const { return dact ? "te_dact_dbias_cast_transpose" : "te_dbias_cast_transpose"; }
  te_status run() {
    if (dact) {
      return te_dact_dbias_cast_transpose(kind, grad_ptr, in_ptr, out_ptr, dbias_ptr, workspace, workspace_size,
                                          nullptr);
    }
    return te_dbias_cast_transpose(grad_ptr, out_ptr, dbias_ptr, workspace, workspace_size, nullptr);
  }
  bool untouched() const {
    return y.all_poison() && yt.all_poison() && yf.all_poison() && db.all_poison() &&
           bits_of(scale_inv) == kPoisonBits && amax == 1.5f;
  }
};

TEST(BiasGradBadInput, BaselinesSucceed) {
  for (bool dact : {false, true}) {
    Args a(dact);
    ASSERT_EQ(a.run(), TE_SUCCESS) << last_error();
    EXPECT_FALSE(a.y.all_poison() || a.yt.all_poison() || a.db.all_poison());
  }
}

struct Bad {
  const char* what;
  bool dact;
  std::function<void(Args&)> mutate;
  te_status want;
  std::vector<std::string> parts;
};

TEST(BiasGradBadInput, Rejected) {
  const Bad cases[] = {
      // dtypes
      {"grad int32", false, [](Args& a) { a.grad.dtype = TE_DTYPE_INT32; }, INV,
       {"grad", "float32, float16 or bfloat16", "int32"}},
      {"grad fp8", false, [](Args& a) { a.grad.dtype = TE_DTYPE_FLOAT8_E5M2; }, INV, {"grad", "float32"}},
      {"output float", false, [](Args& a) { a.out.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"output", "float8_e4m3 or float8_e5m2", "bfloat16"}},
      {"dbias dtype", false, [](Args& a) { a.dbias.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"dbias dtype must be grad's (float32) or float32", "bfloat16"}},
      {"act_input int32", true, [](Args& a) { a.in.dtype = TE_DTYPE_INT32; }, INV,
       {"act_input", "float32, float16 or bfloat16"}},
      {"dact grad dtype", true, [](Args& a) { a.grad.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"grad dtype must equal act_input dtype float32", "float16"}},
      {"dact output uint8", true, [](Args& a) { a.out.dtype = TE_DTYPE_UINT8; }, INV,
       {"output", "float8_e4m3 or float8_e5m2", "uint8"}},
      {"dact dbias dtype", true, [](Args& a) { a.dbias.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"dbias dtype must be act_input's (float32) or float32", "float16"}},
      {"kind 10", true, [](Args& a) { a.kind = 10; }, INV, {"kind must be a te_activation", "got 10"}},
      // shapes
      {"output shape", false, [](Args& a) { a.out.shape[1] = 7; }, INV, {"output", "[3, 7]"}},
      {"dbias length", false, [](Args& a) { a.dbias.shape[0] = 9; }, INV,
       {"dbias shape must be [8]", "got [9]"}},
      {"dbias 2-D", false, [](Args& a) { a.dbias.ndim = 2; a.dbias.shape[0] = 1; a.dbias.shape[1] = 8; }, INV,
       {"dbias shape must be [8]", "got [1, 8]"}},
      {"scalar grad", false, [](Args& a) { a.grad.ndim = 0; a.out.ndim = 0; }, INV,
       {"grad must have at least one dimension"}},
      {"odd gated input", true, [](Args& a) { a.in.shape[1] = 15; }, INV,
       {"act_input last dim must be even", "swiglu"}},
      {"gated grad full width", true, [](Args& a) { a.grad.shape[1] = 16; }, INV,
       {"grad shape must be", "last dim 8", "got [3, 16]"}},
      {"plain kind grad half width", true, [](Args& a) { a.kind = TE_ACTIVATION_GELU; }, INV,
       {"grad shape must be", "last dim 16"}},
      {"dact output half width", true, [](Args& a) { a.out.shape[1] = 8; }, INV, {"output", "[3, 8]"}},
      {"dact dbias of H", true, [](Args& a) { a.dbias.shape[0] = 8; }, INV, {"dbias shape must be [16]"}},
      // scaling and layouts
      {"block scaling", false, [](Args& a) { a.out.scaling_mode = TE_SCALING_BLOCK_2D; }, NIMP, {"output"}},
      {"fp8 without scaling mode", true, [](Args& a) { a.out.scaling_mode = TE_SCALING_NONE; }, INV, {"output"}},
      {"null scale", false, [](Args& a) { a.out.scale = nullptr; }, INV, {"output", "scale"}},
      {"no output data", false, [](Args& a) { a.out.data = nullptr; a.out.columnwise_data = nullptr; }, INV,
       {"output.data and output.columnwise_data must not both be null"}},
      {"columnwise on float dx", true,
       [](Args& a) { a.out.dtype = TE_DTYPE_FLOAT32; a.out.scaling_mode = TE_SCALING_NONE; a.out.data = a.yf.data(); },
       INV, {"output.columnwise_data must be null"}},
      // null pointers
      {"null grad", false, [](Args& a) { a.grad_ptr = nullptr; }, INV, {"grad must not be null"}},
      {"null output", false, [](Args& a) { a.out_ptr = nullptr; }, INV, {"output must not be null"}},
      {"null dbias", false, [](Args& a) { a.dbias_ptr = nullptr; }, INV, {"dbias must not be null"}},
      {"null act_input", true, [](Args& a) { a.in_ptr = nullptr; }, INV, {"act_input must not be null"}},
      {"null dact grad", true, [](Args& a) { a.grad_ptr = nullptr; }, INV, {"grad must not be null"}},
      {"null grad data", false, [](Args& a) { a.grad.data = nullptr; }, INV, {"grad", "data"}},
      {"null act_input data", true, [](Args& a) { a.in.data = nullptr; }, INV, {"act_input", "data"}},
      {"null dbias data", false, [](Args& a) { a.dbias.data = nullptr; }, INV, {"dbias", "data"}},
      {"null float dx data", true,
       [](Args& a) {
         a.out.dtype = TE_DTYPE_FLOAT32;
         a.out.columnwise_data = nullptr;
         a.out.data = nullptr;
       },
       INV, {"output", "data"}},
      // devices
      {"dbias on cuda", false, [](Args& a) { a.dbias.device = cuda(0); }, te_built_with_cuda() ? INV : NIMP,
       {"dbias"}},
      {"output bad device", true, [](Args& a) { a.out.device.type = 3; }, INV,
       {"output device type must be cpu (0) or cuda (1), got 3"}},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    Args a(c.dact);
    c.mutate(a);
    EXPECT_TRUE(is_error(a.run(), c.want, a.op(), c.parts));
    EXPECT_TRUE(a.untouched());
  }
}

// Every tensor on the GPU (nothing is dereferenced: validation fails first): the
// workspace must hold te_dbias_workspace_size bytes. A CPU-only build refuses the
// first CUDA tensor.
TEST(BiasGradBadInput, CudaWorkspaceTooSmall) {
  for (bool dact : {false, true}) {
    SCOPED_TRACE(dact ? "dact" : "dbias");
    Args a(dact);
    for (te_tensor* t : {&a.in, &a.grad, &a.out, &a.dbias}) t->device = cuda(0);
    const size_t need = te_dbias_workspace_size(3, dact ? 16 : 8, cuda(0));
    ASSERT_EQ(need, (dact ? 16u : 8u) * 4);
    a.workspace = a.yf.data();
    a.workspace_size = need - 1;
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, a.op(),
                           {"workspace must be at least " + std::to_string(need) + " bytes (te_dbias_workspace_size(3, " +
                            (dact ? "16" : "8") + "))", "got " + std::to_string(need - 1)}));
      a.workspace = nullptr;
      a.workspace_size = need;
      EXPECT_TRUE(is_error(a.run(), INV, a.op(), {"workspace.pointer must not be null"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, a.op(), {"is a CUDA tensor"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

}  // namespace
