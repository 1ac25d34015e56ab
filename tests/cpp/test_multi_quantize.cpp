// te_multi_quantize and te_multi_quantize_current_scaling on the CPU: each pair's
// outputs (FP8 bytes, scale_inv, amax, scale) equal those of te_quantize /
// te_quantize_current_scaling called on it alone, a float output is a conversion,
// and every pair is checked before any runs. (The CUDA grouping is tested against these in tests/python.)
#include "test_util.h"

namespace {

using namespace tt;

// One cast's input and output buffers, the state poisoned where the op must write it.
struct Pair {
  std::vector<int64_t> shape;
  te_dtype in_dtype, out_dtype;
  Buffer in, out, out_t;
  float scale, scale_inv = 1e30f, amax;

  Pair(std::vector<int64_t> s, te_dtype in_d, te_dtype out_d, float scale_value, uint32_t seed)
      : shape(std::move(s)), in_dtype(in_d), out_dtype(out_d), in(numel_of(shape) * elem_size(in_d)),
        out(numel_of(shape)), out_t(numel_of(shape)), scale(scale_value), amax(0.25f) {
    const std::vector<float> raw = quantize_inputs(size_t(numel_of(shape)), scale, seed);
    for (size_t i = 0; i < raw.size(); ++i) store_value(in, in_dtype, i, raw[i]);
  }
  te_tensor input() { return make_tensor(in_dtype, shape, in.data()); }
  te_tensor output() {
    te_tensor t = make_tensor(out_dtype, shape, out.data(), cpu(), TE_SCALING_PER_TENSOR);
    t.columnwise_data = out_t.data();
    t.scale = &scale;
    t.scale_inv = &scale_inv;
    t.amax = &amax;
    return t;
  }
};

std::vector<Pair> make_pairs(uint32_t seed) {
  std::vector<Pair> pairs;
  pairs.emplace_back(std::vector<int64_t>{16, 64}, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E4M3, 2.0f, seed);
  pairs.emplace_back(std::vector<int64_t>{3, 17}, TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT8_E5M2, 0.5f, seed + 1);
  pairs.emplace_back(std::vector<int64_t>{2, 5, 8}, TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8_E4M3, 8.0f, seed + 2);
  return pairs;
}

void expect_same(const Pair& got, const Pair& want) {
  EXPECT_EQ(got.out.mem, want.out.mem) << "row-wise bytes of " << shape_str(got.shape);
  EXPECT_EQ(got.out_t.mem, want.out_t.mem) << "column-wise bytes of " << shape_str(got.shape);
  EXPECT_EQ(bits_of(got.scale_inv), bits_of(want.scale_inv));
  EXPECT_EQ(bits_of(got.amax), bits_of(want.amax));
  EXPECT_EQ(bits_of(got.scale), bits_of(want.scale));
}

TEST(MultiQuantize, GivenScalesEqualSingleCalls) {
  std::vector<Pair> multi = make_pairs(10), single = make_pairs(10);
  std::vector<te_tensor> inputs, outputs;
  for (Pair& p : multi) {
    inputs.push_back(p.input());
    outputs.push_back(p.output());
  }
  ASSERT_EQ(te_multi_quantize(multi.size(), inputs.data(), outputs.data(), nullptr), TE_SUCCESS) << last_error();
  for (Pair& p : single) {
    te_tensor in = p.input(), out = p.output();
    ASSERT_EQ(te_quantize(&in, &out, nullptr), TE_SUCCESS) << last_error();
  }
  for (size_t i = 0; i < multi.size(); ++i) expect_same(multi[i], single[i]);
}

TEST(MultiQuantize, CurrentScalingEqualsSingleCalls) {
  for (bool pow2 : {false, true}) {
    std::vector<Pair> multi = make_pairs(20), single = make_pairs(20);
    std::vector<te_tensor> inputs, outputs;
    for (Pair& p : multi) {
      inputs.push_back(p.input());
      outputs.push_back(p.output());
    }
    ASSERT_EQ(te_multi_quantize_current_scaling(multi.size(), inputs.data(), outputs.data(), 1e-3f, pow2, nullptr),
              TE_SUCCESS)
        << last_error();
    for (Pair& p : single) {
      te_tensor in = p.input(), out = p.output();
      ASSERT_EQ(te_quantize_current_scaling(&in, &out, 1e-3f, pow2, nullptr), TE_SUCCESS) << last_error();
    }
    for (size_t i = 0; i < multi.size(); ++i) expect_same(multi[i], single[i]);
  }
}

TEST(MultiQuantize, BadPairIsNamedAndNothingRuns) {
  std::vector<Pair> pairs = make_pairs(30);
  std::vector<te_tensor> inputs = {pairs[0].input(), pairs[1].input()};
  std::vector<te_tensor> outputs = {pairs[0].output(), pairs[1].output()};
  outputs[1].scale = nullptr;
  EXPECT_TRUE(is_error(te_multi_quantize(2, inputs.data(), outputs.data(), nullptr), TE_ERROR_INVALID_ARGUMENT,
                       "te_multi_quantize", {"outputs[1]", "scale"}));
  EXPECT_TRUE(pairs[0].out.all_poison()) << "the first pair ran although the second was bad";
  outputs[1] = pairs[1].output();
  outputs[1].shape[0] = 4;
  EXPECT_TRUE(is_error(te_multi_quantize_current_scaling(2, inputs.data(), outputs.data(), 0.0f, 0, nullptr),
                       TE_ERROR_INVALID_ARGUMENT, "te_multi_quantize_current_scaling", {"outputs[1]", "inputs[1]"}));
  EXPECT_TRUE(pairs[0].out.all_poison());
  EXPECT_TRUE(is_error(te_multi_quantize(1, nullptr, outputs.data(), nullptr), TE_ERROR_INVALID_ARGUMENT,
                       "te_multi_quantize", {"inputs", "null"}));
}

// A conversion pair: an input of one float dtype, a plain output of another.
struct Conversion {
  std::vector<int64_t> shape;
  te_dtype in_dtype, out_dtype;
  Buffer in, out;
  std::vector<float> values;  // the input's values, as stored

  Conversion(std::vector<int64_t> s, te_dtype in_d, te_dtype out_d, uint32_t seed)
      : shape(std::move(s)), in_dtype(in_d), out_dtype(out_d), in(numel_of(shape) * elem_size(in_d)),
        out(numel_of(shape) * elem_size(out_d)) {
    for (float v : quantize_inputs(size_t(numel_of(shape)), 1.0f, seed)) {
      values.push_back(store_value(in, in_dtype, values.size(), v));
    }
  }
  te_tensor input() { return make_tensor(in_dtype, shape, in.data()); }
  te_tensor output() { return make_tensor(out_dtype, shape, out.data()); }
  // Each output element is the input value rounded to out_dtype (the reference encoder).
  void expect_converted() const {
    Buffer want(out.bytes);
    for (size_t i = 0; i < values.size(); ++i) {
      store_value(want, out_dtype, i, values[i]);
      const uint32_t got = load_code(out, out_dtype, i), expected = load_code(want, out_dtype, i);
      const bool same = out_dtype == TE_DTYPE_FLOAT32 ? (std::isnan(values[i]) ? std::isnan(f32(got)) : got == expected)
                                                      : same_code(format_of(out_dtype), got, expected);  // NaN: any NaN
      EXPECT_TRUE(same) << dtype_str(in_dtype) << " -> " << dtype_str(out_dtype) << " element " << i << " ("
                        << values[i] << "): got code " << got << ", want " << expected;
    }
    EXPECT_TRUE(out.guard_intact()) << "written past the output";
  }
};

// Float outputs among the pairs are conversions, in both calls, next to casts of
// other input dtypes, and do not disturb the casts.
TEST(MultiQuantize, FloatOutputsAreConversions) {
  for (bool current : {false, true}) {
    std::vector<Pair> casts = make_pairs(40), single = make_pairs(40);
    std::vector<Conversion> conversions;
    conversions.emplace_back(std::vector<int64_t>{64}, TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, 41);
    conversions.emplace_back(std::vector<int64_t>{3, 7}, TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, 42);
    conversions.emplace_back(std::vector<int64_t>{5, 8}, TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT32, 43);
    conversions.emplace_back(std::vector<int64_t>{16}, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16, 44);
    std::vector<te_tensor> inputs, outputs;
    for (size_t i = 0; i < conversions.size(); ++i) {  // interleaved with the casts
      inputs.push_back(conversions[i].input());
      outputs.push_back(conversions[i].output());
      if (i < casts.size()) {
        inputs.push_back(casts[i].input());
        outputs.push_back(casts[i].output());
      }
    }
    const te_status status = current ? te_multi_quantize_current_scaling(inputs.size(), inputs.data(),
                                                                         outputs.data(), 1e-3f, 0, nullptr)
                                     : te_multi_quantize(inputs.size(), inputs.data(), outputs.data(), nullptr);
    ASSERT_EQ(status, TE_SUCCESS) << last_error();
    for (const Conversion& c : conversions) c.expect_converted();
    for (Pair& p : single) {
      te_tensor in = p.input(), out = p.output();
      ASSERT_EQ(current ? te_quantize_current_scaling(&in, &out, 1e-3f, 0, nullptr) : te_quantize(&in, &out, nullptr),
                TE_SUCCESS)
          << last_error();
    }
    for (size_t i = 0; i < casts.size(); ++i) expect_same(casts[i], single[i]);
  }
}

TEST(MultiQuantize, BadConversionIsNamed) {
  Conversion c(std::vector<int64_t>{4, 8}, TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, 50);
  float scale = 1.0f;
  te_tensor in = c.input(), out = c.output();
  out.scale = &scale;  // a conversion has no scale
  EXPECT_TRUE(is_error(te_multi_quantize(1, &in, &out, nullptr), TE_ERROR_INVALID_ARGUMENT, "te_multi_quantize",
                       {"outputs[0]", "conversion", "scale"}));
  out = c.output();
  out.shape[1] = 4;
  EXPECT_TRUE(is_error(te_multi_quantize(1, &in, &out, nullptr), TE_ERROR_INVALID_ARGUMENT, "te_multi_quantize",
                       {"outputs[0]", "inputs[0]"}));
  out = c.output();
  out.data = nullptr;
  EXPECT_TRUE(is_error(te_multi_quantize_current_scaling(1, &in, &out, 0.0f, 0, nullptr), TE_ERROR_INVALID_ARGUMENT,
                       "te_multi_quantize_current_scaling", {"outputs[0]", "data"}));
  EXPECT_TRUE(c.out.all_poison());
}

TEST(MultiQuantize, NoPairs) {
  EXPECT_EQ(te_multi_quantize(0, nullptr, nullptr, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(te_multi_quantize_current_scaling(0, nullptr, nullptr, 0.0f, 0, nullptr), TE_SUCCESS) << last_error();
}

}  // namespace
