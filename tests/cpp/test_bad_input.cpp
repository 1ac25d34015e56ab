// Bad input for every op: the status, a message that names the op and the
// argument (and, for dtypes, what was expected and what was given), and that a
// failing call writes nothing (outputs are poisoned beforehand).
#include <functional>
#include <thread>

#include "test_util.h"

#if OPENTE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace tt;

// The status is `want`, the message starts with "<op>: " and contains every part.
::testing::AssertionResult is_error(te_status got, te_status want, const char* op,
                                    std::vector<const char*> parts) {
  const std::string msg = last_error();
  if (got != want)
    return ::testing::AssertionFailure() << "status " << got << ", want " << want << " (message: " << msg << ")";
  if (msg.rfind(std::string(op) + ": ", 0) != 0)
    return ::testing::AssertionFailure() << "message does not start with '" << op << ": ': " << msg;
  for (const char* p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
  return ::testing::AssertionSuccess() << msg;
}

// A device-mismatch case: in a CPU-only build the CUDA side is refused as
// unsupported; in a CUDA build the mismatch itself is the error.
::testing::AssertionResult is_device_mismatch_error(te_status got, const char* op, const char* cuda_arg) {
  if (te_built_with_cuda()) return is_error(got, TE_ERROR_INVALID_ARGUMENT, op, {"cuda:0", "cpu"});
  return is_error(got, TE_ERROR_NOT_IMPLEMENTED, op, {cuda_arg, "CUDA"});
}

constexpr uint32_t kPoisonBits = 0xABABABABu;

// ---- te_quantize ------------------------------------------------------------

// Valid arguments for a [3, 4] fp32 -> E4M3 cast with both layouts; a test
// breaks one thing and checks that nothing was written.
struct QuantizeArgs {
  std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12};
  Buffer q{12}, qt{12};
  float scale = 2.0f, scale_inv = f32(kPoisonBits), amax = 1.5f;
  te_tensor in, out;
  const te_tensor* in_ptr = &in;
  const te_tensor* out_ptr = &out;

  QuantizeArgs() {
    in = make_tensor(TE_DTYPE_FLOAT32, {3, 4}, x.data());
    out = make_tensor(TE_DTYPE_FLOAT8_E4M3, {3, 4}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    out.columnwise_data = qt.data();
    out.scale = &scale;
    out.scale_inv = &scale_inv;
    out.amax = &amax;
  }
  QuantizeArgs(const QuantizeArgs&) = delete;
  te_status run() { return te_quantize(in_ptr, out_ptr, nullptr); }
  bool untouched() const {
    return q.all_poison() && qt.all_poison() && bits_of(scale_inv) == kPoisonBits && amax == 1.5f && scale == 2.0f;
  }
};

struct BadCase {
  const char* what;
  std::function<void(QuantizeArgs&)> mutate;
  te_status want;
  std::vector<const char*> parts;
};

TEST(BadInput, QuantizeBaselineSucceeds) {
  QuantizeArgs a;
  ASSERT_EQ(a.run(), TE_SUCCESS) << last_error();
  EXPECT_FALSE(a.q.all_poison());
  EXPECT_EQ(a.amax, 12.0f);
}

TEST(BadInput, Quantize) {
  const te_status INV = TE_ERROR_INVALID_ARGUMENT, NIMP = TE_ERROR_NOT_IMPLEMENTED;
  const std::vector<BadCase> cases = {
      {"null input", [](QuantizeArgs& a) { a.in_ptr = nullptr; }, INV, {"input", "null"}},
      {"null output", [](QuantizeArgs& a) { a.out_ptr = nullptr; }, INV, {"output", "null"}},
      {"null input data", [](QuantizeArgs& a) { a.in.data = nullptr; }, INV, {"input.data", "null"}},
      {"no output data",
       [](QuantizeArgs& a) { a.out.data = a.out.columnwise_data = nullptr; },
       INV,
       {"output.data", "columnwise_data"}},
      {"null scale", [](QuantizeArgs& a) { a.out.scale = nullptr; }, INV, {"output.scale", "null"}},
      {"fp8 input", [](QuantizeArgs& a) { a.in.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"input dtype", "float32, float16 or bfloat16", "got float8_e4m3"}},
      {"int input", [](QuantizeArgs& a) { a.in.dtype = TE_DTYPE_INT32; }, INV, {"input dtype", "got int32"}},
      {"fp32 output", [](QuantizeArgs& a) { a.out.dtype = TE_DTYPE_FLOAT32; }, INV,
       {"output dtype", "float8_e4m3 or float8_e5m2", "got float32"}},
      {"shape mismatch", [](QuantizeArgs& a) { a.out.shape[0] = 4, a.out.shape[1] = 3; }, INV, {"output", "shape"}},
      {"rank mismatch", [](QuantizeArgs& a) { a.out.ndim = 1, a.out.shape[0] = 12; }, INV, {"output", "shape"}},
      {"ndim -1", [](QuantizeArgs& a) { a.in.ndim = -1; }, INV, {"input", "ndim", "-1"}},
      {"ndim 9", [](QuantizeArgs& a) { a.out.ndim = 9; }, INV, {"output", "ndim", "9"}},
      {"negative dim", [](QuantizeArgs& a) { a.in.shape[1] = a.out.shape[1] = -4; }, INV, {"input", "shape", "-4"}},
      {"dtype enum 42", [](QuantizeArgs& a) { a.in.dtype = 42; }, INV, {"input", "dtype", "42"}},
      {"dtype enum 1", [](QuantizeArgs& a) { a.out.dtype = 1; }, INV, {"output", "dtype"}},
      {"device type 7", [](QuantizeArgs& a) { a.in.device.type = 7; }, INV, {"input", "device", "7"}},
      {"device index -1", [](QuantizeArgs& a) { a.out.device.index = -1; }, INV, {"output", "device", "-1"}},
      {"cpu index 1", [](QuantizeArgs& a) { a.out.device.index = 1; }, INV, {"output", "device index", "0 for the CPU"}},
      {"block 1D", [](QuantizeArgs& a) { a.out.scaling_mode = TE_SCALING_BLOCK_1D; }, NIMP, {"output", "block"}},
      {"block 2D", [](QuantizeArgs& a) { a.out.scaling_mode = TE_SCALING_BLOCK_2D; }, NIMP, {"output", "block"}},
      {"unscaled output", [](QuantizeArgs& a) { a.out.scaling_mode = TE_SCALING_NONE; }, INV,
       {"output", "scaling_mode"}},
      {"scaling enum 9", [](QuantizeArgs& a) { a.out.scaling_mode = 9; }, INV, {"output", "scaling_mode"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    QuantizeArgs a;
    c.mutate(a);
    EXPECT_TRUE(is_error(a.run(), c.want, "te_quantize", c.parts));
    EXPECT_TRUE(a.untouched());
  }
}

// The example message of opente/status.h, verbatim.
TEST(BadInput, QuantizeDocumentedMessage) {
  QuantizeArgs a;
  a.out.dtype = TE_DTYPE_BFLOAT16;
  EXPECT_EQ(a.run(), TE_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(te_last_error_message(), "te_quantize: output dtype must be float8_e4m3 or float8_e5m2, got bfloat16");
  EXPECT_TRUE(a.untouched());
}

TEST(BadInput, QuantizeDeviceMismatch) {
  {
    QuantizeArgs a;
    a.out.device = cuda(0);
    EXPECT_TRUE(is_device_mismatch_error(a.run(), "te_quantize", "output"));
    EXPECT_TRUE(a.untouched());
  }
  {
    QuantizeArgs a;
    a.in.device = cuda(0);
    EXPECT_TRUE(is_device_mismatch_error(a.run(), "te_quantize", "input"));
    EXPECT_TRUE(a.untouched());
  }
  {  // two different GPUs
    QuantizeArgs a;
    a.in.device = cuda(0);
    a.out.device = cuda(1);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), TE_ERROR_INVALID_ARGUMENT, "te_quantize", {"cuda:1", "cuda:0"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), TE_ERROR_NOT_IMPLEMENTED, "te_quantize", {"CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

// ---- te_dequantize ----------------------------------------------------------

struct DequantizeArgs {
  Buffer q{6}, o{24};
  float scale_inv = 0.5f;
  te_tensor in, out;
  const te_tensor* in_ptr = &in;
  const te_tensor* out_ptr = &out;
  DequantizeArgs() {
    for (int i = 0; i < 6; ++i) q.set<uint8_t>(i, uint8_t(0x30 + i));
    in = make_tensor(TE_DTYPE_FLOAT8_E5M2, {2, 3}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    in.scale_inv = &scale_inv;
    out = make_tensor(TE_DTYPE_FLOAT32, {2, 3}, o.data());
  }
  DequantizeArgs(const DequantizeArgs&) = delete;
  te_status run() { return te_dequantize(in_ptr, out_ptr, nullptr); }
  bool untouched() const { return o.all_poison(); }
};

TEST(BadInput, Dequantize) {
  DequantizeArgs ok;
  ASSERT_EQ(ok.run(), TE_SUCCESS) << last_error();
  EXPECT_FALSE(ok.untouched());

  const te_status INV = TE_ERROR_INVALID_ARGUMENT, NIMP = TE_ERROR_NOT_IMPLEMENTED;
  const struct {
    const char* what;
    std::function<void(DequantizeArgs&)> mutate;
    te_status want;
    std::vector<const char*> parts;
  } cases[] = {
      {"null input", [](DequantizeArgs& a) { a.in_ptr = nullptr; }, INV, {"input", "null"}},
      {"null output", [](DequantizeArgs& a) { a.out_ptr = nullptr; }, INV, {"output", "null"}},
      {"null input data", [](DequantizeArgs& a) { a.in.data = nullptr; }, INV, {"input.data", "null"}},
      {"null output data", [](DequantizeArgs& a) { a.out.data = nullptr; }, INV, {"output.data", "null"}},
      {"null scale_inv", [](DequantizeArgs& a) { a.in.scale_inv = nullptr; }, INV, {"input.scale_inv", "null"}},
      {"fp32 input", [](DequantizeArgs& a) { a.in.dtype = TE_DTYPE_FLOAT32; }, INV,
       {"input dtype", "float8_e4m3 or float8_e5m2", "got float32"}},
      {"uint8 input", [](DequantizeArgs& a) { a.in.dtype = TE_DTYPE_UINT8; }, INV, {"input dtype", "got uint8"}},
      {"fp8 output", [](DequantizeArgs& a) { a.out.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"output dtype", "float32, float16 or bfloat16", "got float8_e4m3"}},
      {"int64 output", [](DequantizeArgs& a) { a.out.dtype = TE_DTYPE_INT64; }, INV, {"output dtype", "got int64"}},
      {"shape mismatch", [](DequantizeArgs& a) { a.out.shape[1] = 4; }, INV, {"output", "shape"}},
      {"rank mismatch", [](DequantizeArgs& a) { a.out.ndim = 3, a.out.shape[2] = 1; }, INV, {"output", "shape"}},
      {"ndim 100", [](DequantizeArgs& a) { a.in.ndim = 100; }, INV, {"input", "ndim", "100"}},
      {"negative dim", [](DequantizeArgs& a) { a.out.shape[0] = -2; }, INV, {"output", "shape", "-2"}},
      {"dtype enum 99", [](DequantizeArgs& a) { a.out.dtype = 99; }, INV, {"output", "dtype", "99"}},
      {"device type -1", [](DequantizeArgs& a) { a.out.device.type = -1; }, INV, {"output", "device"}},
      {"block 1D", [](DequantizeArgs& a) { a.in.scaling_mode = TE_SCALING_BLOCK_1D; }, NIMP, {"input", "block"}},
      {"block 2D", [](DequantizeArgs& a) { a.in.scaling_mode = TE_SCALING_BLOCK_2D; }, NIMP, {"input", "block"}},
      {"unscaled input", [](DequantizeArgs& a) { a.in.scaling_mode = TE_SCALING_NONE; }, INV,
       {"input", "scaling_mode"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    DequantizeArgs a;
    c.mutate(a);
    EXPECT_TRUE(is_error(a.run(), c.want, "te_dequantize", c.parts));
    EXPECT_TRUE(a.untouched());
  }
  {
    DequantizeArgs a;
    a.out.device = cuda(0);
    EXPECT_TRUE(is_device_mismatch_error(a.run(), "te_dequantize", "output"));
    EXPECT_TRUE(a.untouched());
  }
}

// ---- te_compute_amax ----------------------------------------------------------

TEST(BadInput, ComputeAmax) {
  std::vector<uint16_t> x = {0x3c00, 0xc000, 0x4200};  // fp16 1, -2, 3
  const te_status INV = TE_ERROR_INVALID_ARGUMENT;
  auto fresh = [&] { return make_tensor(TE_DTYPE_FLOAT16, {3}, x.data()); };
  float amax = 0.0f;
  te_tensor ok = fresh();
  ASSERT_EQ(te_compute_amax(&ok, &amax, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(amax, 3.0f);

  const struct {
    const char* what;
    std::function<void(te_tensor&)> mutate;
    std::vector<const char*> parts;
  } cases[] = {
      {"null data", [](te_tensor& t) { t.data = nullptr; }, {"input.data", "null"}},
      {"fp8 input", [](te_tensor& t) { t.dtype = TE_DTYPE_FLOAT8_E4M3; },
       {"input dtype", "float32, float16 or bfloat16", "got float8_e4m3"}},
      {"int64 input", [](te_tensor& t) { t.dtype = TE_DTYPE_INT64; }, {"input dtype", "got int64"}},
      {"ndim 9", [](te_tensor& t) { t.ndim = 9; }, {"input", "ndim"}},
      {"negative dim", [](te_tensor& t) { t.shape[0] = -3; }, {"input", "shape"}},
      {"dtype enum", [](te_tensor& t) { t.dtype = 9; }, {"input", "dtype"}},
      {"device type", [](te_tensor& t) { t.device.type = 3; }, {"input", "device"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    te_tensor t = fresh();
    c.mutate(t);
    amax = 0.25f;
    EXPECT_TRUE(is_error(te_compute_amax(&t, &amax, nullptr), INV, "te_compute_amax", c.parts));
    EXPECT_EQ(amax, 0.25f);
  }
  te_tensor t = fresh();
  EXPECT_TRUE(is_error(te_compute_amax(nullptr, &amax, nullptr), INV, "te_compute_amax", {"input", "null"}));
  EXPECT_TRUE(is_error(te_compute_amax(&t, nullptr, nullptr), INV, "te_compute_amax", {"amax", "null"}));
}

// ---- te_transpose ---------------------------------------------------------------

TEST(BadInput, Transpose) {
  std::vector<float> x(12, 1.0f);
  Buffer o(48);
  const te_status INV = TE_ERROR_INVALID_ARGUMENT;
  const struct {
    const char* what;
    std::function<void(te_tensor&, te_tensor&)> mutate;
    std::vector<const char*> parts;
  } cases[] = {
      {"dtype mismatch", [](te_tensor&, te_tensor& out) { out.dtype = TE_DTYPE_FLOAT16; },
       {"output dtype", "float32", "got float16"}},
      {"not transposed", [](te_tensor&, te_tensor& out) { out.shape[0] = 3, out.shape[1] = 4; },
       {"output shape", "4, 3"}},
      {"wrong numel", [](te_tensor&, te_tensor& out) { out.shape[1] = 4; }, {"output shape"}},
      {"scalar output", [](te_tensor&, te_tensor& out) { out.ndim = 0; }, {"output shape"}},
      {"null input data", [](te_tensor& in, te_tensor&) { in.data = nullptr; }, {"input.data", "null"}},
      {"null output data", [](te_tensor&, te_tensor& out) { out.data = nullptr; }, {"output.data", "null"}},
      {"ndim -3", [](te_tensor& in, te_tensor&) { in.ndim = -3; }, {"input", "ndim"}},
      {"negative dim", [](te_tensor&, te_tensor& out) { out.shape[1] = -3; }, {"output", "shape"}},
      {"dtype enum", [](te_tensor& in, te_tensor& out) { in.dtype = out.dtype = 1; }, {"input", "dtype"}},
      {"device type", [](te_tensor&, te_tensor& out) { out.device.type = 2; }, {"output", "device"}},
      {"scaling enum", [](te_tensor& in, te_tensor&) { in.scaling_mode = -1; }, {"input", "scaling_mode"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {3, 4}, x.data());
    te_tensor out = make_tensor(TE_DTYPE_FLOAT32, {4, 3}, o.data());
    c.mutate(in, out);
    EXPECT_TRUE(is_error(te_transpose(&in, &out, nullptr), INV, "te_transpose", c.parts));
    EXPECT_TRUE(o.all_poison());
  }
  te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {3, 4}, x.data());
  te_tensor out = make_tensor(TE_DTYPE_FLOAT32, {4, 3}, o.data());
  EXPECT_TRUE(is_error(te_transpose(nullptr, &out, nullptr), INV, "te_transpose", {"input", "null"}));
  EXPECT_TRUE(is_error(te_transpose(&in, nullptr, nullptr), INV, "te_transpose", {"output", "null"}));
  out.device = cuda(0);
  EXPECT_TRUE(is_device_mismatch_error(te_transpose(&in, &out, nullptr), "te_transpose", "output"));
  EXPECT_TRUE(o.all_poison());
  out.device = cpu();
  ASSERT_EQ(te_transpose(&in, &out, nullptr), TE_SUCCESS) << last_error();  // the baseline was valid
  EXPECT_FALSE(o.all_poison());
}

// ---- te_compute_scale_from_amax ------------------------------------------------

TEST(BadInput, ComputeScaleFromAmax) {
  const te_status INV = TE_ERROR_INVALID_ARGUMENT;
  const char* op = "te_compute_scale_from_amax";
  float amax = 2.0f, scale = f32(kPoisonBits), scale_inv = f32(kPoisonBits);
  auto call = [&](const float* a, float* s, int32_t fp8, float eps, te_device dev) {
    return te_compute_scale_from_amax(a, s, &scale_inv, fp8, eps, 0, dev, nullptr);
  };
  auto untouched = [&] { return bits_of(scale) == kPoisonBits && bits_of(scale_inv) == kPoisonBits; };
  const int32_t E4M3 = TE_DTYPE_FLOAT8_E4M3;
  EXPECT_TRUE(is_error(call(nullptr, &scale, E4M3, 0.0f, cpu()), INV, op, {"amax", "null"}));
  EXPECT_TRUE(is_error(call(&amax, nullptr, E4M3, 0.0f, cpu()), INV, op, {"scale", "null"}));
  EXPECT_TRUE(is_error(call(&amax, &scale, TE_DTYPE_FLOAT16, 0.0f, cpu()), INV, op,
                       {"fp8_dtype", "float8_e4m3 or float8_e5m2", "got float16"}));
  EXPECT_TRUE(is_error(call(&amax, &scale, 42, 0.0f, cpu()), INV, op, {"fp8_dtype", "42"}));
  EXPECT_TRUE(is_error(call(&amax, &scale, E4M3, -1.0f, cpu()), INV, op, {"epsilon"}));
  EXPECT_TRUE(is_error(call(&amax, &scale, E4M3, NAN, cpu()), INV, op, {"epsilon"}));
  EXPECT_TRUE(is_error(call(&amax, &scale, E4M3, INFINITY, cpu()), INV, op, {"epsilon"}));
  EXPECT_TRUE(is_error(call(&amax, &scale, E4M3, 0.0f, te_device{9, 0}), INV, op, {"device", "9"}));
  EXPECT_TRUE(untouched());
  const te_status cuda_status = call(&amax, &scale, E4M3, 0.0f, cuda(0));
  if (!te_built_with_cuda()) {
    EXPECT_TRUE(is_error(cuda_status, TE_ERROR_NOT_IMPLEMENTED, op, {"CUDA"}));
    EXPECT_TRUE(untouched());
  }
  ASSERT_EQ(call(&amax, &scale, E4M3, 0.0f, cpu()), TE_SUCCESS) << last_error();  // the baseline was valid
  EXPECT_EQ(scale, 224.0f);
}

// ---- te_delayed_scaling_update --------------------------------------------------

// Two groups; group 1 is broken in each case. Validation must come before any
// update: group 0 stays as it was.
TEST(BadInput, DelayedScalingUpdate) {
  const te_status INV = TE_ERROR_INVALID_ARGUMENT;
  const char* op = "te_delayed_scaling_update";
  const int32_t MAX = TE_AMAX_COMPUTE_MAX;
  struct Setup {
    std::vector<float> h0 = {1, 2, 3, 4}, s0 = {5, 6}, h1 = {7, 8, 9}, s1 = {10, 11, 12};
    te_amax_history_group g[2];
    Setup() {
      g[0] = {h0.data(), s0.data(), nullptr, 2, 2, TE_DTYPE_FLOAT8_E4M3};
      g[1] = {h1.data(), s1.data(), nullptr, 1, 3, TE_DTYPE_FLOAT8_E5M2};
    }
    bool untouched() const {
      return h0 == std::vector<float>{1, 2, 3, 4} && s0 == std::vector<float>{5, 6} &&
             h1 == std::vector<float>{7, 8, 9} && s1 == std::vector<float>{10, 11, 12};
    }
  };
  const struct {
    const char* what;
    std::function<te_status(Setup&)> call;
    std::vector<const char*> parts;
  } cases[] = {
      {"algo 2", [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, 2, 0, cpu(), nullptr); },
       {"amax_compute_algo", "2"}},
      {"algo -1", [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, -1, 0, cpu(), nullptr); },
       {"amax_compute_algo"}},
      {"fp8 bf16",
       [&](Setup& s) {
         s.g[1].fp8_dtype = TE_DTYPE_BFLOAT16;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].fp8_dtype", "float8_e4m3 or float8_e5m2", "got bfloat16"}},
      {"fp8 unset",
       [&](Setup& s) {
         s.g[1].fp8_dtype = 0;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].fp8_dtype", "float8_e4m3 or float8_e5m2"}},
      {"margin nan", [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, MAX, NAN, cpu(), nullptr); },
       {"margin"}},
      {"margin inf", [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, MAX, INFINITY, cpu(), nullptr); },
       {"margin"}},
      {"margin 200", [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, MAX, 200, cpu(), nullptr); },
       {"margin"}},
      {"margin -200", [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, MAX, -200, cpu(), nullptr); },
       {"margin"}},
      {"num_groups -1", [&](Setup& s) { return te_delayed_scaling_update(s.g, -1, MAX, 0, cpu(), nullptr); },
       {"num_groups", "-1"}},
      {"groups null", [&](Setup&) { return te_delayed_scaling_update(nullptr, 2, MAX, 0, cpu(), nullptr); },
       {"groups", "null"}},
      {"history_len 0",
       [&](Setup& s) {
         s.g[1].history_len = 0;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].history_len", "0"}},
      {"history_len -5",
       [&](Setup& s) {
         s.g[1].history_len = -5;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].history_len", "-5"}},
      {"num_scales -1",
       [&](Setup& s) {
         s.g[1].num_scales = -1;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].num_scales"}},
      {"null history",
       [&](Setup& s) {
         s.g[1].amax_history = nullptr;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].amax_history", "null"}},
      {"null scale",
       [&](Setup& s) {
         s.g[1].scale = nullptr;
         return te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr);
       },
       {"groups[1].scale", "null"}},
      {"device type",
       [&](Setup& s) { return te_delayed_scaling_update(s.g, 2, MAX, 0, te_device{4, 0}, nullptr); },
       {"device"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Setup s;
    EXPECT_TRUE(is_error(c.call(s), INV, op, c.parts));
    EXPECT_TRUE(s.untouched());
  }
  if (!te_built_with_cuda()) {
    Setup s;
    EXPECT_TRUE(is_error(te_delayed_scaling_update(s.g, 2, MAX, 0, cuda(0), nullptr), TE_ERROR_NOT_IMPLEMENTED,
                         op, {"CUDA"}));
    EXPECT_TRUE(s.untouched());
  }
  Setup s;  // the baseline was valid
  ASSERT_EQ(te_delayed_scaling_update(s.g, 2, MAX, 0, cpu(), nullptr), TE_SUCCESS) << last_error();
  EXPECT_FALSE(s.untouched());
}

// ---- descriptors that are malformed in less obvious ways ---------------------

// Only the first ndim entries of shape[] matter: garbage past them is ignored.
TEST(BadInput, ShapeEntriesPastNdimIgnored) {
  QuantizeArgs a;
  for (int i = 2; i < TE_MAX_DIMS; ++i) a.in.shape[i] = -1, a.out.shape[i] = 12345 + i;
  EXPECT_EQ(a.run(), TE_SUCCESS) << last_error();
  EXPECT_FALSE(a.q.all_poison());
  std::vector<float> x = {5.0f};
  te_tensor scalar = make_tensor(TE_DTYPE_FLOAT32, {}, x.data());
  for (int i = 0; i < TE_MAX_DIMS; ++i) scalar.shape[i] = -7;
  float amax = 0.0f;
  EXPECT_EQ(te_compute_amax(&scalar, &amax, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(amax, 5.0f);
}

// A shape whose element count does not fit in int64 (2^32 x 2^32 = 2^64) cannot
// describe real memory and must be rejected. If the count is computed with
// wrap-around it becomes 0, the null-data check is skipped, and the op either
// "succeeds" on nothing or walks the 2^32 x 2^32 loop from a null pointer. The
// calls that could crash run in a child process (death-test machinery), so a
// crash fails only this test.
const std::vector<int64_t> kHugeShape = {int64_t(1) << 32, int64_t(1) << 32};

TEST(BadInput, ElementCountOverflowQuantize) {
  EXPECT_EXIT(
      {
        float scale = 1.0f;
        te_tensor in = make_tensor(TE_DTYPE_FLOAT32, kHugeShape, nullptr);
        uint8_t q[4];
        te_tensor out = make_tensor(TE_DTYPE_FLOAT8_E4M3, kHugeShape, q, cpu(), TE_SCALING_PER_TENSOR);
        out.scale = &scale;
        std::_Exit(te_quantize(&in, &out, nullptr) == TE_ERROR_INVALID_ARGUMENT ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(BadInput, ElementCountOverflowTranspose) {
  EXPECT_EXIT(
      {
        te_tensor in = make_tensor(TE_DTYPE_FLOAT32, kHugeShape, nullptr);
        te_tensor out = make_tensor(TE_DTYPE_FLOAT32, kHugeShape, nullptr);
        std::_Exit(te_transpose(&in, &out, nullptr) == TE_ERROR_INVALID_ARGUMENT ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(BadInput, ElementCountOverflowDequantize) {
  float scale_inv = 1.0f;
  te_tensor in = make_tensor(TE_DTYPE_FLOAT8_E4M3, kHugeShape, nullptr, cpu(), TE_SCALING_PER_TENSOR);
  in.scale_inv = &scale_inv;
  te_tensor out = make_tensor(TE_DTYPE_FLOAT32, kHugeShape, nullptr);
  EXPECT_EQ(te_dequantize(&in, &out, nullptr), TE_ERROR_INVALID_ARGUMENT);
}

TEST(BadInput, ElementCountOverflowAmax) {
  float amax = 0.0f;
  te_tensor in = make_tensor(TE_DTYPE_FLOAT32, kHugeShape, nullptr);
  EXPECT_EQ(te_compute_amax(&in, &amax, nullptr), TE_ERROR_INVALID_ARGUMENT);
}

// ---- CUDA tensors where there is no CUDA ------------------------------------

// Every op on CUDA descriptors fails cleanly (never crashes) when it cannot run
// them: NOT_IMPLEMENTED in a CPU-only build; some error with a message in a
// CUDA build on a machine without a GPU. The pointers are never dereferenced
// on the host, so fake device addresses are fine.
TEST(BadInput, CudaTensorsWithoutCuda) {
#if OPENTE_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) GTEST_SKIP() << "a GPU is present";
  cudaGetLastError();
  ASSERT_EQ(te_built_with_cuda(), 1);
#else
  ASSERT_EQ(te_built_with_cuda(), 0);
#endif
  auto check = [](te_status st, const char* op) {
    if (te_built_with_cuda()) {
      EXPECT_NE(st, TE_SUCCESS) << op;
      EXPECT_EQ(last_error().rfind(std::string(op) + ": ", 0), 0u) << last_error();
    } else {
      EXPECT_TRUE(is_error(st, TE_ERROR_NOT_IMPLEMENTED, op, {"CUDA"}));
    }
  };
  void* dev_ptr = reinterpret_cast<void*>(uintptr_t(0x10000));
  float* dev_f = static_cast<float*>(dev_ptr);
  te_tensor in = make_tensor(TE_DTYPE_FLOAT32, {3, 4}, dev_ptr, cuda(0));
  te_tensor q = make_tensor(TE_DTYPE_FLOAT8_E4M3, {3, 4}, dev_ptr, cuda(0), TE_SCALING_PER_TENSOR);
  q.scale = q.scale_inv = q.amax = dev_f;
  te_tensor t = make_tensor(TE_DTYPE_FLOAT32, {4, 3}, dev_ptr, cuda(0));
  check(te_quantize(&in, &q, nullptr), "te_quantize");
  check(te_dequantize(&q, &in, nullptr), "te_dequantize");
  check(te_compute_amax(&in, dev_f, nullptr), "te_compute_amax");
  check(te_transpose(&in, &t, nullptr), "te_transpose");
  check(te_compute_scale_from_amax(dev_f, dev_f, dev_f, TE_DTYPE_FLOAT8_E4M3, 0.0f, 0, cuda(0), nullptr),
        "te_compute_scale_from_amax");
  te_amax_history_group g{dev_f, dev_f, dev_f, 4, 2, TE_DTYPE_FLOAT8_E4M3};
  check(te_delayed_scaling_update(&g, 1, TE_AMAX_COMPUTE_MAX, 0.0f, cuda(0), nullptr),
        "te_delayed_scaling_update");
}

// ---- the error message itself --------------------------------------------------

// The message stays until the next failing call: a successful call does not
// clear it, a new failure replaces it.
TEST(BadInput, MessageLifetime) {
  std::vector<float> x = {1, 2};
  float amax = 0.0f;
  te_tensor bad = make_tensor(TE_DTYPE_INT32, {2}, x.data());
  ASSERT_NE(te_compute_amax(&bad, &amax, nullptr), TE_SUCCESS);
  const std::string first = last_error();
  EXPECT_FALSE(first.empty());
  te_tensor good = make_tensor(TE_DTYPE_FLOAT32, {2}, x.data());
  ASSERT_EQ(te_compute_amax(&good, &amax, nullptr), TE_SUCCESS);
  EXPECT_EQ(last_error(), first);
  ASSERT_NE(te_transpose(nullptr, nullptr, nullptr), TE_SUCCESS);
  EXPECT_NE(last_error(), first);
  EXPECT_EQ(last_error().rfind("te_transpose: ", 0), 0u);
}

// The message is per thread: another thread's failure does not change ours.
TEST(BadInput, MessageIsThreadLocal) {
  float amax = 0.0f;
  ASSERT_NE(te_compute_amax(nullptr, &amax, nullptr), TE_SUCCESS);
  const std::string mine = last_error();
  std::string theirs;
  std::thread other([&] {
    te_transpose(nullptr, nullptr, nullptr);
    theirs = last_error();
  });
  other.join();
  EXPECT_EQ(theirs.rfind("te_transpose: ", 0), 0u) << theirs;
  EXPECT_EQ(last_error(), mine);
}

}  // namespace
