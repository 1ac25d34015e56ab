// te_linear_fp8_fwd / te_linear_fp8_bwd on the CPU: every buffer they write equals,
// byte for byte, what the separate calls they stand for write (te_multi_quantize and
// te_gemm; te_dbias_cast_transpose or te_quantize and two te_gemm; the current-scaling
// forms of the casts), and a bad argument fails the call before anything is written. (te.Linear's GPU steps are
// compared with the separate calls in tests/python/test_linear_one_call.py.)
#include "test_util.h"

namespace {

using namespace tt;

// The scalings each test runs: given scales (nullptr), and current scaling without and
// with power-of-two scales.
const te_current_scaling kCurrent{0.0f, 0}, kCurrentPow2{1e-3f, 1};
const te_current_scaling* const kScalings[] = {nullptr, &kCurrent, &kCurrentPow2};

constexpr int64_t kRows = 32, kIn = 48, kOut = 16;

// Random values of dtype d, exactly representable in it.
Buffer random_buffer(te_dtype d, int64_t n, uint32_t seed, float range) {
  Buffer b(size_t(n) * elem_size(d));
  uint32_t state = seed * 2654435761u + 1u;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    store_value(b, d, size_t(i), range * (float(state >> 8) / float(1u << 24) * 2.0f - 1.0f));
  }
  return b;
}

// An FP8 cast's buffers: both layouts, scale (read), scale_inv and amax (written).
struct Fp8 {
  std::vector<int64_t> shape;
  Buffer data, data_t;
  float scale, scale_inv = 1e30f, amax = 0.5f;
  Fp8(std::vector<int64_t> s, float scale_value)
      : shape(std::move(s)), data(numel_of(shape)), data_t(numel_of(shape)), scale(scale_value) {}
  te_tensor desc(te_dtype dtype, bool rowwise = true, bool columnwise = true) {
    te_tensor t = make_tensor(dtype, shape, rowwise ? data.data() : nullptr, cpu(), TE_SCALING_PER_TENSOR);
    t.columnwise_data = columnwise ? data_t.data() : nullptr;
    t.scale = &scale;
    t.scale_inv = &scale_inv;
    t.amax = &amax;
    return t;
  }
  bool untouched() const { return data.all_poison() && data_t.all_poison() && scale_inv == 1e30f && amax == 0.5f; }
};

void expect_same(const Fp8& got, const Fp8& want, const char* name) {
  EXPECT_EQ(got.data.mem, want.data.mem) << name << " row-wise bytes";
  EXPECT_EQ(got.data_t.mem, want.data_t.mem) << name << " column-wise bytes";
  EXPECT_EQ(bits_of(got.scale_inv), bits_of(want.scale_inv)) << name << " scale_inv";
  EXPECT_EQ(bits_of(got.amax), bits_of(want.amax)) << name << " amax";
}

// A forward's tensors: x bf16, W fp32, an fp32 bias converted to bf16, y bf16.
struct Forward {
  Buffer x = random_buffer(TE_DTYPE_BFLOAT16, (kRows * kIn), 1, 3.0f);
  Buffer w = random_buffer(TE_DTYPE_FLOAT32, (kOut * kIn), 2, 0.5f);
  Buffer bias = random_buffer(TE_DTYPE_FLOAT32, kOut, 3, 1.0f);
  Buffer bias_bf16{kOut * 2};
  Buffer y{kRows * kOut * 2};
  Fp8 x_fp8{{kRows, kIn}, 16.0f}, w_fp8{{kOut, kIn}, 128.0f};
  std::vector<int64_t> y_shape{kRows, kOut};
  const te_current_scaling* current = nullptr;

  te_tensor x_desc() { return make_tensor(TE_DTYPE_BFLOAT16, {kRows, kIn}, x.data()); }
  te_tensor w_desc() { return make_tensor(TE_DTYPE_FLOAT32, {kOut, kIn}, w.data()); }
  te_tensor bias_desc() { return make_tensor(TE_DTYPE_FLOAT32, {kOut}, bias.data()); }
  te_tensor bias_bf16_desc() { return make_tensor(TE_DTYPE_BFLOAT16, {kOut}, bias_bf16.data()); }
  te_tensor y_desc() { return make_tensor(TE_DTYPE_BFLOAT16, y_shape, y.data()); }

  te_status one_call() {
    te_tensor x_d = x_desc(), w_d = w_desc(), b = bias_desc(), b16 = bias_bf16_desc(), y_d = y_desc();
    te_tensor xq = x_fp8.desc(TE_DTYPE_FLOAT8_E4M3), wq = w_fp8.desc(TE_DTYPE_FLOAT8_E4M3);
    return te_linear_fp8_fwd(&x_d, &w_d, &b, &b16, &xq, &wq, &y_d, current, 0, nullptr, 0, nullptr);
  }
  void separate_calls() {
    const te_tensor inputs[3] = {x_desc(), w_desc(), bias_desc()};
    const te_tensor outputs[3] = {x_fp8.desc(TE_DTYPE_FLOAT8_E4M3), w_fp8.desc(TE_DTYPE_FLOAT8_E4M3), bias_bf16_desc()};
    ASSERT_EQ(current ? te_multi_quantize_current_scaling(3, inputs, outputs, current->epsilon,
                                                          current->force_pow_2_scales, nullptr)
                      : te_multi_quantize(3, inputs, outputs, nullptr),
              TE_SUCCESS)
        << last_error();
    te_tensor a = outputs[1], b = outputs[0], y_d = y_desc(), b16 = bias_bf16_desc();
    const te_gemm_config config{1, 0, TE_GEMM_EPILOGUE_BIAS, 1.0f, 0.0f, 0};
    ASSERT_EQ(te_gemm(&a, &b, &y_d, &b16, nullptr, nullptr, &config, nullptr, 0, nullptr), TE_SUCCESS) << last_error();
  }
};

TEST(LinearStep, ForwardEqualsSeparateCalls) {
  for (const te_current_scaling* current : kScalings) {
    SCOPED_TRACE(current ? "current scaling" : "given scales");
    Forward one, separate;
    one.current = separate.current = current;
    ASSERT_EQ(one.one_call(), TE_SUCCESS) << last_error();
    separate.separate_calls();
    expect_same(one.x_fp8, separate.x_fp8, "input_fp8");
    expect_same(one.w_fp8, separate.w_fp8, "weight_fp8");
    EXPECT_EQ(bits_of(one.x_fp8.scale), bits_of(separate.x_fp8.scale)) << "input_fp8 scale";
    EXPECT_EQ(one.bias_bf16.mem, separate.bias_bf16.mem) << "bias_converted";
    EXPECT_EQ(one.y.mem, separate.y.mem) << "output";
    EXPECT_FALSE(one.x_fp8.data.all_poison());
    EXPECT_NE(one.x_fp8.amax, 0.5f) << "the input's amax was raised or written";
    EXPECT_EQ(one.x_fp8.scale != 16.0f, current != nullptr) << "current scaling writes the scale";
  }
}

TEST(LinearStep, ForwardBadOutputShapeWritesNothing) {
  Forward f;
  f.y_shape = {kRows, kOut + 1};
  EXPECT_EQ(f.one_call(), TE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("te_linear_fp8_fwd: output must be [32, 16]"), std::string::npos) << last_error();
  EXPECT_TRUE(f.x_fp8.untouched() && f.w_fp8.untouched() && f.bias_bf16.all_poison() && f.y.all_poison());
}

TEST(LinearStep, ForwardRowsNotDivisibleBy16WriteNothing) {
  Forward f;  // 24 of the buffers' 32 rows: the FP8 GEMM cannot take them
  te_tensor x = f.x_desc(), w = f.w_desc(), b = f.bias_desc(), b16 = f.bias_bf16_desc(), y = f.y_desc();
  te_tensor xq = f.x_fp8.desc(TE_DTYPE_FLOAT8_E4M3), wq = f.w_fp8.desc(TE_DTYPE_FLOAT8_E4M3);
  x.shape[0] = xq.shape[0] = y.shape[0] = 24;
  EXPECT_EQ(te_linear_fp8_fwd(&x, &w, &b, &b16, &xq, &wq, &y, nullptr, 0, nullptr, 0, nullptr),
            TE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("divisible by 16, got rows=24"), std::string::npos) << last_error();
  EXPECT_TRUE(f.x_fp8.untouched() && f.w_fp8.untouched() && f.bias_bf16.all_poison() && f.y.all_poison());
}

// A backward's tensors, from a forward's FP8 copies: dy bf16, dbias fp32, dx bf16, dW fp32.
struct Backward {
  Forward forward;
  Buffer dy = random_buffer(TE_DTYPE_BFLOAT16, (kRows * kOut), 4, 2.0f);
  Fp8 dy_fp8{{kRows, kOut}, 4096.0f};
  Buffer dbias{kOut * 4}, dx{kRows * kIn * 2}, dw{kOut * kIn * 4};
  bool with_dgrad = true, with_wgrad = true, with_dbias = true, dy_columnwise = true;
  const te_current_scaling* current = nullptr;

  Backward() { EXPECT_EQ(forward.one_call(), TE_SUCCESS) << last_error(); }
  te_tensor dy_desc() { return make_tensor(TE_DTYPE_BFLOAT16, {kRows, kOut}, dy.data()); }
  te_tensor dy_fp8_desc() { return dy_fp8.desc(TE_DTYPE_FLOAT8_E5M2, with_dgrad, dy_columnwise); }
  te_tensor operand(Fp8& f) {
    te_tensor t = f.desc(TE_DTYPE_FLOAT8_E4M3);
    t.scale = t.amax = nullptr;
    return t;
  }
  te_tensor dbias_desc() { return make_tensor(TE_DTYPE_FLOAT32, {kOut}, dbias.data()); }
  te_tensor dx_desc() { return make_tensor(TE_DTYPE_BFLOAT16, {kRows, kIn}, dx.data()); }
  te_tensor dw_desc() { return make_tensor(TE_DTYPE_FLOAT32, {kOut, kIn}, dw.data()); }

  te_status one_call() {
    te_tensor g = dy_desc(), gq = dy_fp8_desc(), db = dbias_desc(), w = operand(forward.w_fp8),
              x = operand(forward.x_fp8), dx_d = dx_desc(), dw_d = dw_desc();
    return te_linear_fp8_bwd(&g, &gq, with_dbias ? &db : nullptr, with_dgrad ? &w : nullptr, with_wgrad ? &x : nullptr,
                             with_dgrad ? &dx_d : nullptr, with_wgrad ? &dw_d : nullptr, current, 1, 1, nullptr, 0,
                             nullptr, 0, nullptr);
  }
  void separate_calls() {
    te_tensor g = dy_desc(), gq = dy_fp8_desc(), db = dbias_desc();
    const float eps = current ? current->epsilon : 0.0f;
    const int pow2 = current ? current->force_pow_2_scales : 0;
    if (with_dbias) {
      ASSERT_EQ(current ? te_dbias_cast_transpose_current_scaling(&g, &gq, &db, eps, pow2, nullptr, 0, nullptr)
                        : te_dbias_cast_transpose(&g, &gq, &db, nullptr, 0, nullptr),
                TE_SUCCESS)
          << last_error();
    } else {
      ASSERT_EQ(current ? te_quantize_current_scaling(&g, &gq, eps, pow2, nullptr) : te_quantize(&g, &gq, nullptr),
                TE_SUCCESS)
          << last_error();
    }
    gq.scale = gq.amax = nullptr;
    if (with_dgrad) {
      te_tensor w = operand(forward.w_fp8), dx_d = dx_desc();
      const te_gemm_config nn{0, 0, TE_GEMM_EPILOGUE_NONE, 1.0f, 0.0f, 1};
      ASSERT_EQ(te_gemm(&w, &gq, &dx_d, nullptr, nullptr, nullptr, &nn, nullptr, 0, nullptr), TE_SUCCESS);
    }
    if (with_wgrad) {
      te_tensor x = operand(forward.x_fp8), dw_d = dw_desc();
      const te_gemm_config nt{0, 1, TE_GEMM_EPILOGUE_NONE, 1.0f, 0.0f, 1};
      ASSERT_EQ(te_gemm(&x, &gq, &dw_d, nullptr, nullptr, nullptr, &nt, nullptr, 0, nullptr), TE_SUCCESS);
    }
  }
};

void expect_same(const Backward& got, const Backward& want) {
  expect_same(got.dy_fp8, want.dy_fp8, "grad_output_fp8");
  EXPECT_EQ(bits_of(got.dy_fp8.scale), bits_of(want.dy_fp8.scale)) << "grad_output_fp8 scale";
  EXPECT_EQ(got.dbias.mem, want.dbias.mem) << "dbias";
  EXPECT_EQ(got.dx.mem, want.dx.mem) << "grad_input";
  EXPECT_EQ(got.dw.mem, want.dw.mem) << "grad_weight";
}

TEST(LinearStep, BackwardEqualsSeparateCalls) {
  for (int variant = 0; variant < 4 * 3; ++variant) {
    SCOPED_TRACE(variant);
    Backward one, separate;
    for (Backward* b : {&one, &separate}) {
      b->current = kScalings[variant / 4];
      b->with_dbias = variant % 4 != 1;  // 1: no bias gradient (te_quantize)
      b->with_dgrad = variant % 4 != 2;  // 2: weight gradient alone
      b->with_wgrad = variant % 4 != 3;  // 3: input gradient alone
    }
    ASSERT_EQ(one.one_call(), TE_SUCCESS) << last_error();
    separate.separate_calls();
    expect_same(one, separate);
    EXPECT_EQ(one.dx.all_poison(), variant % 4 == 2);
    EXPECT_EQ(one.dw.all_poison(), variant % 4 == 3);
    EXPECT_EQ(one.dbias.all_poison(), variant % 4 == 1);
  }
}

TEST(LinearStep, BackwardBadArgumentsWriteNothing) {
  {
    Backward b;
    b.with_dgrad = b.with_wgrad = false;
    EXPECT_EQ(b.one_call(), TE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("grad_input and grad_weight must not both be null"), std::string::npos) << last_error();
    EXPECT_TRUE(b.dy_fp8.untouched() && b.dbias.all_poison());
  }
  {
    Backward b;  // the wgrad GEMM reads dy's column-wise copy: the cast must make it
    b.dy_columnwise = false;
    EXPECT_EQ(b.one_call(), TE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("grad_output_fp8"), std::string::npos) << last_error();
    EXPECT_NE(last_error().find("columnwise_data"), std::string::npos) << last_error();
    EXPECT_TRUE(b.dy_fp8.untouched() && b.dbias.all_poison() && b.dx.all_poison() && b.dw.all_poison());
  }
}

}  // namespace
