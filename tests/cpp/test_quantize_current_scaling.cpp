// te_quantize_current_scaling against a reference built in the test: amax = max|x|
// (NaNs ignored, the old amax overwritten), scale from the current-scaling formula
// evaluated in double, then every element encoded with the independent encoder of
// test_util.h; scale_inv = 1/scale; the column-wise output the transpose.
#include <cfloat>

#include "test_util.h"

namespace {

using namespace tt;

const te_dtype kInDtypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};
const te_dtype kOutDtypes[] = {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2};

// scale = fp8_max / max(amax, eps), 1 when that max is 0 or not finite, FLT_MAX when
// the quotient overflows, optionally 2^floor(log2(scale)); fp8_max from the format.
float ref_scale(double amax, te_dtype out, float eps, bool pow2) {
  const double m = std::max(amax, double(eps));
  if (m == 0.0 || !std::isfinite(m)) return 1.0f;
  float s = float(ref_max_finite(format_of(out)) / m);  // double quotient, one rounding
  if (std::isinf(s)) s = FLT_MAX;
  if (pow2) {
    int e;
    std::frexp(s, &e);
    s = std::ldexp(1.0f, e - 1);
  }
  return s;
}

struct Case {
  te_dtype in;
  te_dtype out;
  std::vector<int64_t> shape;
  bool rowwise;
  bool columnwise;
  float eps;
  bool pow2;
  uint32_t seed;
  bool specials = false;  // NaN and +-inf among the inputs
};

void check(const Case& k) {
  SCOPED_TRACE(::testing::Message() << dtype_str(k.in) << " -> " << dtype_str(k.out) << " shape "
                                    << shape_str(k.shape) << " rowwise " << k.rowwise << " columnwise "
                                    << k.columnwise << " eps " << k.eps << " pow2 " << k.pow2);
  const int64_t n = numel_of(k.shape);
  const int64_t cols = k.shape.empty() ? 1 : k.shape.back();
  const int64_t rows = cols ? n / cols : 0;
  // Magnitudes spread widely (scale 1 for the generator: the op picks its own).
  const std::vector<float> raw = quantize_inputs(size_t(n), 1.0f, k.seed, k.specials);
  Buffer in(n * elem_size(k.in));
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = store_value(in, k.in, i, raw[i]);

  Buffer out(n), out_t(n);
  // Poisoned state: the op must overwrite amax and scale, not read them.
  float amax = 1e30f, scale = f32(0xABABABABu), scale_inv = f32(0xABABABABu);
  te_tensor ti = make_tensor(k.in, k.shape, in.data());
  te_tensor to = make_tensor(k.out, k.shape, k.rowwise ? out.data() : nullptr, cpu(), TE_SCALING_PER_TENSOR);
  to.columnwise_data = k.columnwise ? out_t.data() : nullptr;
  to.amax = &amax;
  to.scale = &scale;
  to.scale_inv = &scale_inv;
  ASSERT_EQ(te_quantize_current_scaling(&ti, &to, k.eps, k.pow2, nullptr), TE_SUCCESS) << last_error();

  double want_amax = 0.0;
  for (float v : x)
    if (!std::isnan(v)) want_amax = std::max(want_amax, std::fabs(double(v)));
  EXPECT_EQ(double(amax), want_amax);
  const float want_scale = ref_scale(want_amax, k.out, k.eps, k.pow2);
  EXPECT_EQ(bits_of(scale), bits_of(want_scale));
  EXPECT_EQ(bits_of(scale_inv), bits_of(float(1.0 / double(want_scale))));

  const Format& f = format_of(k.out);
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float xv = x[r * cols + c];
      const uint32_t want = ref_encode(f, float(double(xv) * double(want_scale)));  // fp32 product, rounded once
      if (k.rowwise && !same_code(f, out.get<uint8_t>(r * cols + c), want) && bad++ < 5) {
        ADD_FAILURE() << "rowwise [" << r << "," << c << "] x=" << xv << ": got 0x" << std::hex
                      << int(out.get<uint8_t>(r * cols + c)) << ", want 0x" << want;
      }
      if (k.columnwise && !same_code(f, out_t.get<uint8_t>(c * rows + r), want) && bad++ < 5) {
        ADD_FAILURE() << "columnwise [" << c << "," << r << "] x=" << xv << ": got 0x" << std::hex
                      << int(out_t.get<uint8_t>(c * rows + r)) << ", want 0x" << want;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "mismatching elements";
  EXPECT_TRUE(out.guard_intact()) << "row-wise output written past its end";
  EXPECT_TRUE(out_t.guard_intact()) << "column-wise output written past its end";
  if (!k.rowwise) EXPECT_TRUE(out.all_poison()) << "row-wise output written although not asked for";
  if (!k.columnwise) EXPECT_TRUE(out_t.all_poison()) << "column-wise output written although not asked for";
}

// Every input dtype x FP8 dtype x layout over tiny, odd, 1-D, 3-D, scalar and empty shapes.
TEST(QuantizeCurrentScaling, AllDtypesLayoutsAndShapes) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 1}, {3, 17}, {17, 3}, {33}, {2, 3, 5},
                                                    {},     {0, 5},  {5, 0},  {19, 70}};
  uint32_t seed = 1;
  for (te_dtype in : kInDtypes)
    for (te_dtype out : kOutDtypes)
      for (int layout = 1; layout <= 3; ++layout)
        for (const auto& s : shapes) check({in, out, s, (layout & 1) != 0, (layout & 2) != 0, 0.0f, false, seed++});
}

// epsilon that wins over a small amax, power-of-two scales, and an empty input
// (amax 0: scale 1, or fp8_max / epsilon).
TEST(QuantizeCurrentScaling, EpsilonAndPowerOfTwo) {
  uint32_t seed = 200;
  for (te_dtype out : kOutDtypes) {
    for (bool pow2 : {false, true}) {
      for (float eps : {0.0f, 1e-3f, 1e6f}) {
        check({TE_DTYPE_BFLOAT16, out, {16, 48}, true, true, eps, pow2, seed++});
        check({TE_DTYPE_FLOAT32, out, {0, 16}, true, true, eps, pow2, seed++});
      }
    }
  }
}

// NaN is skipped by amax; an infinite amax makes the scale 1.
TEST(QuantizeCurrentScaling, NonFiniteInputs) {
  uint32_t seed = 300;
  for (te_dtype out : kOutDtypes) check({TE_DTYPE_FLOAT32, out, {24, 40}, true, true, 0.0f, false, seed++, true});
  std::vector<float> xs = {NAN, 2.0f, -3.0f, NAN};
  float amax = -1.0f, scale = 0.0f, scale_inv = 0.0f;
  Buffer q(xs.size());
  te_tensor ti = make_tensor(TE_DTYPE_FLOAT32, {4}, xs.data());
  te_tensor to = make_tensor(TE_DTYPE_FLOAT8_E4M3, {4}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
  to.amax = &amax;
  to.scale = &scale;
  to.scale_inv = &scale_inv;
  ASSERT_EQ(te_quantize_current_scaling(&ti, &to, 0.0f, 0, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(amax, 3.0f);
  EXPECT_EQ(bits_of(scale), bits_of(float(448.0 / 3.0)));
  xs[1] = INFINITY;
  ASSERT_EQ(te_quantize_current_scaling(&ti, &to, 0.0f, 0, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(amax, INFINITY);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(scale_inv, 1.0f);
}

// Bad input: each error names the argument; nothing is written.
TEST(QuantizeCurrentScaling, BadInput) {
  std::vector<float> xs(32, 1.0f);
  Buffer q(32);
  float amax = 7.0f, scale = 5.0f, scale_inv = 3.0f;
  te_tensor ti = make_tensor(TE_DTYPE_FLOAT32, {4, 8}, xs.data());
  auto out = [&] {
    te_tensor to = make_tensor(TE_DTYPE_FLOAT8_E4M3, {4, 8}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    to.amax = &amax;
    to.scale = &scale;
    to.scale_inv = &scale_inv;
    return to;
  };
  auto expect_error = [&](const te_tensor* i, const te_tensor* o, float eps, te_status want, const char* needle) {
    EXPECT_EQ(te_quantize_current_scaling(i, o, eps, 0, nullptr), want);
    EXPECT_NE(last_error().find(needle), std::string::npos) << last_error();
    EXPECT_NE(last_error().find("te_quantize_current_scaling"), std::string::npos) << last_error();
  };
  te_tensor to = out();
  to.amax = nullptr;
  expect_error(&ti, &to, 0.0f, TE_ERROR_INVALID_ARGUMENT, "amax");
  to = out();
  to.scale = nullptr;
  expect_error(&ti, &to, 0.0f, TE_ERROR_INVALID_ARGUMENT, "scale");
  to = out();
  to.dtype = TE_DTYPE_BFLOAT16;
  expect_error(&ti, &to, 0.0f, TE_ERROR_INVALID_ARGUMENT, "output");
  to = out();
  to.shape[1] = 9;
  expect_error(&ti, &to, 0.0f, TE_ERROR_INVALID_ARGUMENT, "shape");
  to = out();
  expect_error(&ti, &to, -1.0f, TE_ERROR_INVALID_ARGUMENT, "epsilon");
  expect_error(&ti, &to, NAN, TE_ERROR_INVALID_ARGUMENT, "epsilon");
  expect_error(nullptr, &to, 0.0f, TE_ERROR_INVALID_ARGUMENT, "input");
  expect_error(&ti, nullptr, 0.0f, TE_ERROR_INVALID_ARGUMENT, "output");
  te_tensor fp8_in = make_tensor(TE_DTYPE_FLOAT8_E4M3, {4, 8}, q.data());
  expect_error(&fp8_in, &to, 0.0f, TE_ERROR_INVALID_ARGUMENT, "input");
  to.device = cuda(0);
  expect_error(&ti, &to, 0.0f, te_built_with_cuda() ? TE_ERROR_INVALID_ARGUMENT : TE_ERROR_NOT_IMPLEMENTED,
               "output");
  EXPECT_TRUE(q.all_poison());
  EXPECT_EQ(amax, 7.0f);
  EXPECT_EQ(scale, 5.0f);
  EXPECT_EQ(scale_inv, 3.0f);
}

}  // namespace
