// te_multi_quantize and te_multi_quantize_current_scaling on the CPU: each pair's
// outputs (FP8 bytes, scale_inv, amax, scale) equal those of te_quantize /
// te_quantize_current_scaling called on it alone, and every pair is checked before
// any runs. (The CUDA grouping is tested against these in tests/python.)
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

TEST(MultiQuantize, NoPairs) {
  EXPECT_EQ(te_multi_quantize(0, nullptr, nullptr, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(te_multi_quantize_current_scaling(0, nullptr, nullptr, 0.0f, 0, nullptr), TE_SUCCESS) << last_error();
}

}  // namespace
