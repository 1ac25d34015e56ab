// te_compute_amax: *amax = max(*amax, max|x|) over fp32/fp16/bf16 input, NaNs
// ignored, checked against a plain double-precision loop.
#include <cfloat>

#include "test_util.h"

namespace {

using namespace tt;

const te_dtype kInDtypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};

// Stores `raw` in dtype d, runs the reduction from `init`, returns the result
// and sets *want to the reference.
float run_amax(te_dtype d, const std::vector<int64_t>& shape, const std::vector<float>& raw, float init,
               double* want) {
  const int64_t n = numel_of(shape);
  Buffer in(n * elem_size(d));
  *want = init;
  for (int64_t i = 0; i < n; ++i) {
    const float v = store_value(in, d, i, raw[i]);
    if (!std::isnan(v)) *want = std::max(*want, std::fabs(double(v)));
  }
  const std::vector<uint8_t> before = in.mem;
  float amax = init;
  te_tensor t = make_tensor(d, shape, in.data());
  EXPECT_EQ(te_compute_amax(&t, &amax, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(in.mem, before) << "input modified";
  return amax;
}

TEST(Amax, RandomInputsAllDtypesAndShapes) {
  const std::vector<std::vector<int64_t>> shapes = {{1}, {1, 1}, {3, 17}, {2, 3, 5}, {}, {1000}, {31, 33}};
  uint32_t seed = 11;
  for (te_dtype d : kInDtypes) {
    for (const auto& s : shapes) {
      SCOPED_TRACE(::testing::Message() << dtype_str(d) << " " << shape_str(s));
      // without infinities, so the max is a finite value that must be found exactly
      std::vector<float> raw(numel_of(s));
      std::mt19937 rng(seed++);
      // magnitudes down into the subnormals of the dtype (fp16's start at 2^-14)
      for (auto& v : raw) v = random_magnitude(rng, d == TE_DTYPE_FLOAT16 ? -20 : -130, 15);
      if (raw.size() > 2) raw[raw.size() / 2] = NAN;
      double want;
      const float got = run_amax(d, s, raw, 0.0f, &want);
      EXPECT_EQ(double(got), want);
      EXPECT_GT(got, 0.0f);
    }
  }
}

// The result is the max of the old value and the input's amax.
TEST(Amax, AccumulatesWithExistingValue) {
  const std::vector<float> raw = {-3.0f, 2.5f, 1.0f, -0.5f};
  for (te_dtype d : kInDtypes) {
    double want;
    EXPECT_EQ(run_amax(d, {4}, raw, 0.0f, &want), 3.0f) << dtype_str(d);
    EXPECT_EQ(run_amax(d, {4}, raw, 2.0f, &want), 3.0f) << dtype_str(d);
    EXPECT_EQ(run_amax(d, {4}, raw, 3.0f, &want), 3.0f) << dtype_str(d);
    EXPECT_EQ(run_amax(d, {2, 2}, raw, 100.0f, &want), 100.0f) << dtype_str(d);
  }
}

TEST(Amax, NaNIgnoredInfCounts) {
  for (te_dtype d : kInDtypes) {
    SCOPED_TRACE(dtype_str(d));
    double want;
    EXPECT_EQ(run_amax(d, {5}, {NAN, 1.0f, -NAN, -4.0f, NAN}, 0.0f, &want), 4.0f);
    EXPECT_EQ(run_amax(d, {3}, {NAN, -NAN, NAN}, 0.25f, &want), 0.25f);  // all NaN: unchanged
    EXPECT_EQ(run_amax(d, {3}, {1.0f, -INFINITY, NAN}, 0.0f, &want), INFINITY);
    EXPECT_EQ(run_amax(d, {2}, {-0.0f, 0.0f}, 0.0f, &want), 0.0f);
  }
  // values that only exist in fp32: a subnormal and FLT_MAX are found exactly
  double want;
  EXPECT_EQ(run_amax(TE_DTYPE_FLOAT32, {2}, {-f32(1), 0.0f}, 0.0f, &want), f32(1));
  EXPECT_EQ(run_amax(TE_DTYPE_FLOAT32, {3}, {1.0f, -FLT_MAX, 2.0f}, 0.0f, &want), FLT_MAX);
}

// An empty tensor (data may be null) leaves amax as it was.
TEST(Amax, ZeroSizeLeavesAmax) {
  for (te_dtype d : kInDtypes) {
    for (const std::vector<int64_t>& s : std::vector<std::vector<int64_t>>{{0}, {4, 0}, {0, 4, 2}}) {
      float amax = 1.5f;
      te_tensor t = make_tensor(d, s, nullptr);
      EXPECT_EQ(te_compute_amax(&t, &amax, nullptr), TE_SUCCESS) << last_error();
      EXPECT_EQ(amax, 1.5f);
    }
  }
}

}  // namespace
