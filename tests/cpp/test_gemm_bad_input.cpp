// Bad input to te_gemm: the status, a message that starts with "te_gemm: " and
// names the argument and what was expected, and that a failing call writes
// nothing (every output is poisoned beforehand, and each case's unbroken
// baseline is checked to succeed and write).
#include <functional>

#include "test_util.h"

namespace {

using namespace tt;

constexpr uint32_t kPoisonBits = 0xABABABABu;
const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;

::testing::AssertionResult is_error(te_status got, te_status want, std::vector<std::string> parts) {
  const std::string msg = last_error();
  if (got != want)
    return ::testing::AssertionFailure() << "status " << got << ", want " << want << " (message: " << msg << ")";
  if (msg.rfind("te_gemm: ", 0) != 0)
    return ::testing::AssertionFailure() << "message does not start with 'te_gemm: ': " << msg;
  for (const std::string& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
  return ::testing::AssertionSuccess() << msg;
}

// Valid arguments with every output argument allocated; `epilogue` picks which
// of bias / aux / bias_grad are passed. fp32: A [k=4, n=5], B [m=3, k=4], D
// [3, 5] ("NN"). fp8: E4M3 x E4M3 "TN" 16 x 32 x 48 into bf16 D.
struct GemmArgs {
  int64_t m, n, k;
  Buffer a, b, d, bias, aux, bias_grad;
  float sa = 0.5f, sb = 2.0f, d_scale = 1.0f, d_scale_inv = f32(kPoisonBits), d_amax = f32(kPoisonBits);
  te_tensor A, B, D, Bias, Aux, BiasGrad;
  te_gemm_config cfg;
  const te_tensor *a_ptr = &A, *b_ptr = &B, *d_ptr = &D, *bias_ptr = nullptr, *aux_ptr = nullptr,
                  *bias_grad_ptr = nullptr;
  const te_gemm_config* cfg_ptr = &cfg;

  explicit GemmArgs(bool fp8 = false, te_gemm_epilogue epi = TE_GEMM_EPILOGUE_NONE)
      : m(fp8 ? 16 : 3), n(fp8 ? 32 : 5), k(fp8 ? 48 : 4), a(size_t(k * n) * (fp8 ? 1 : 4)),
        b(size_t(m * k) * (fp8 ? 1 : 4)), d(size_t(m * n) * (fp8 ? 2 : 4)), bias(size_t(n) * 4),
        aux(size_t(m * n) * 4), bias_grad(size_t(std::max(m, n)) * 4) {
    const te_dtype in = fp8 ? TE_DTYPE_FLOAT8_E4M3 : TE_DTYPE_FLOAT32;
    const int32_t scaling = fp8 ? TE_SCALING_PER_TENSOR : TE_SCALING_NONE;
    // inputs: small finite values (the poison byte patterns are not valid inputs to rely on)
    for (size_t i = 0; i < size_t(k * n); ++i) store_value(a, in, i, float(i % 7) - 3.0f);
    for (size_t i = 0; i < size_t(m * k); ++i) store_value(b, in, i, float(i % 5) - 2.0f);
    for (size_t i = 0; i < size_t(n); ++i) bias.set<float>(i, 0.25f * float(i));
    if (epi == TE_GEMM_EPILOGUE_DGELU || epi == TE_GEMM_EPILOGUE_DGELU_BGRAD)
      for (size_t i = 0; i < size_t(m * n); ++i) aux.set<float>(i, 0.5f);
    A = make_tensor(in, fp8 ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, a.data(), cpu(), scaling);
    B = make_tensor(in, {m, k}, b.data(), cpu(), scaling);
    D = make_tensor(fp8 ? TE_DTYPE_BFLOAT16 : TE_DTYPE_FLOAT32, {m, n}, d.data());
    if (fp8) A.scale_inv = &sa, B.scale_inv = &sb;
    Bias = make_tensor(TE_DTYPE_FLOAT32, {n}, bias.data());
    Aux = make_tensor(TE_DTYPE_FLOAT32, {m, n}, aux.data());
    BiasGrad = make_tensor(TE_DTYPE_FLOAT32, {epi == TE_GEMM_EPILOGUE_BGRAD ? m : n}, bias_grad.data());
    cfg = te_gemm_config{fp8 ? 1 : 0, 0, int32_t(epi), 1.0f, 0.0f, 0};
    if (epi == TE_GEMM_EPILOGUE_BIAS || epi == TE_GEMM_EPILOGUE_GELU_AUX_BIAS) bias_ptr = &Bias;
    if (epi >= TE_GEMM_EPILOGUE_GELU_AUX && epi <= TE_GEMM_EPILOGUE_DGELU_BGRAD) aux_ptr = &Aux;
    if (epi == TE_GEMM_EPILOGUE_DGELU_BGRAD || epi == TE_GEMM_EPILOGUE_BGRAD) bias_grad_ptr = &BiasGrad;
    aux_snapshot = aux.mem;
  }
  GemmArgs(const GemmArgs&) = delete;

  // D as FP8 (E4M3) with a scale and an amax.
  void make_d_fp8() {
    D.dtype = TE_DTYPE_FLOAT8_E4M3;
    D.scaling_mode = TE_SCALING_PER_TENSOR;
    D.scale = &d_scale;
    D.scale_inv = &d_scale_inv;
    D.amax = &d_amax;
  }

  te_status run() {
    return te_gemm(a_ptr, b_ptr, d_ptr, bias_ptr, aux_ptr, bias_grad_ptr, cfg_ptr, nullptr, 0, nullptr);
  }
  bool untouched() const {
    return d.all_poison() && bias_grad.all_poison() && aux.mem == aux_snapshot &&
           bits_of(d_amax) == kPoisonBits && bits_of(d_scale_inv) == kPoisonBits;
  }
  std::vector<uint8_t> aux_snapshot;
};

struct BadCase {
  const char* what;
  bool fp8;
  te_gemm_epilogue epi;
  std::function<void(GemmArgs&)> mutate;
  te_status want;
  std::vector<std::string> parts;
};

TEST(GemmBadInput, BaselinesSucceed) {
  for (bool fp8 : {false, true})
    for (int e = TE_GEMM_EPILOGUE_NONE; e <= TE_GEMM_EPILOGUE_BGRAD; ++e) {
      SCOPED_TRACE(::testing::Message() << "fp8 " << fp8 << " epilogue " << e);
      GemmArgs a(fp8, te_gemm_epilogue(e));
      ASSERT_EQ(a.run(), TE_SUCCESS) << last_error();
      EXPECT_FALSE(a.d.all_poison());
      EXPECT_EQ(a.bias_grad.all_poison(), e != TE_GEMM_EPILOGUE_DGELU_BGRAD && e != TE_GEMM_EPILOGUE_BGRAD);
    }
  GemmArgs a(true);
  a.make_d_fp8();
  ASSERT_EQ(a.run(), TE_SUCCESS) << last_error();
  EXPECT_FALSE(a.d.all_poison());
  EXPECT_NE(bits_of(a.d_amax), kPoisonBits);
}

TEST(GemmBadInput, Cases) {
  const te_gemm_epilogue NONE = TE_GEMM_EPILOGUE_NONE, BIAS = TE_GEMM_EPILOGUE_BIAS,
                         GELU_AUX = TE_GEMM_EPILOGUE_GELU_AUX, DGELU = TE_GEMM_EPILOGUE_DGELU,
                         DGELU_BGRAD = TE_GEMM_EPILOGUE_DGELU_BGRAD, BGRAD = TE_GEMM_EPILOGUE_BGRAD;
  const std::vector<BadCase> cases = {
      {"null A", false, NONE, [](GemmArgs& a) { a.a_ptr = nullptr; }, INV, {"A must not be null"}},
      {"null B", false, NONE, [](GemmArgs& a) { a.b_ptr = nullptr; }, INV, {"B must not be null"}},
      {"null D", false, NONE, [](GemmArgs& a) { a.d_ptr = nullptr; }, INV, {"D must not be null"}},
      {"null config", false, NONE, [](GemmArgs& a) { a.cfg_ptr = nullptr; }, INV, {"config", "null"}},
      {"epilogue 7", false, NONE, [](GemmArgs& a) { a.cfg.epilogue = 7; }, INV, {"config.epilogue", "7"}},
      {"epilogue -1", false, NONE, [](GemmArgs& a) { a.cfg.epilogue = -1; }, INV, {"config.epilogue", "-1"}},
      {"null A data", false, NONE, [](GemmArgs& a) { a.A.data = nullptr; }, INV, {"A.data", "null"}},
      {"null B data", false, NONE, [](GemmArgs& a) { a.B.data = nullptr; }, INV, {"B.data", "null"}},
      {"null D data", false, NONE, [](GemmArgs& a) { a.D.data = nullptr; }, INV, {"D.data", "null"}},
      // A [4, 5] gives k=4, B [3, 6] gives k=6
      {"inner dims", false, NONE, [](GemmArgs& a) { a.B.shape[1] = 6; }, INV,
       {"inner dimensions", "[4, 5]", "[3, 6]"}},
      {"inner dims, transposed", false, NONE,
       [](GemmArgs& a) {
         a.cfg.transa = 1;  // op_A(A) = A^T is [5, 4]: k=5, n=4
         a.D.shape[1] = 4;
       },
       INV, {"inner dimensions", "[4, 5]", "transposed", "[3, 4]"}},
      {"D wrong shape", false, NONE, [](GemmArgs& a) { a.D.shape[0] = 5, a.D.shape[1] = 3; }, INV,
       {"D shape [5, 3]", "[3, 5]"}},
      {"D wrong rank", false, NONE, [](GemmArgs& a) { a.D.ndim = 1, a.D.shape[0] = 15; }, INV,
       {"D shape [15]", "[3, 5]"}},
      {"A/B dtype mismatch", false, NONE, [](GemmArgs& a) { a.B.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"B dtype", "float32", "got bfloat16"}},
      {"A fp32, B fp8", false, NONE, [](GemmArgs& a) { a.B.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"B dtype", "got float8_e4m3"}},
      {"A fp8, B bf16", true, NONE, [](GemmArgs& a) { a.B.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"B dtype", "float8_e4m3 or float8_e5m2", "got bfloat16"}},
      {"int32 A", false, NONE, [](GemmArgs& a) { a.A.dtype = a.B.dtype = TE_DTYPE_INT32; }, INV,
       {"A dtype", "float32, float16 or bfloat16", "got int32"}},
      {"int64 D", false, NONE, [](GemmArgs& a) { a.D.dtype = TE_DTYPE_INT64; }, INV, {"D dtype", "got int64"}},
      {"both e5m2", true, NONE,
       [](GemmArgs& a) { a.A.dtype = a.B.dtype = TE_DTYPE_FLOAT8_E5M2; }, INV, {"float8_e5m2", "both"}},
      {"fp8 m=8", true, NONE, [](GemmArgs& a) { a.B.shape[0] = 8, a.D.shape[0] = 8; }, INV, {"16", "m=8"}},
      {"fp8 n=40", true, NONE, [](GemmArgs& a) { a.A.shape[0] = 40, a.D.shape[1] = 40; }, INV, {"16", "n=40"}},
      {"fp8 k=40", true, NONE, [](GemmArgs& a) { a.A.shape[1] = 40, a.B.shape[1] = 40; }, INV, {"16", "k=40"}},
      {"fp8 D with beta", true, NONE,
       [](GemmArgs& a) {
         a.make_d_fp8();
         a.cfg.beta = 1.0f;
       },
       INV, {"beta", "FP8"}},
      {"fp8 D without scale", true, NONE,
       [](GemmArgs& a) {
         a.make_d_fp8();
         a.D.scale = nullptr;
       },
       INV, {"D.scale", "null"}},
      {"fp8 A without scale_inv", true, NONE, [](GemmArgs& a) { a.A.scale_inv = nullptr; }, INV,
       {"A.scale_inv", "null"}},
      {"fp8 B without scale_inv", true, NONE, [](GemmArgs& a) { a.B.scale_inv = nullptr; }, INV,
       {"B.scale_inv", "null"}},
      {"bias missing", false, BIAS, [](GemmArgs& a) { a.bias_ptr = nullptr; }, INV,
       {"bias is required by epilogue bias"}},
      {"bias present with none", false, NONE, [](GemmArgs& a) { a.bias_ptr = &a.Bias; }, INV,
       {"bias must be null with epilogue none"}},
      {"bias present with gelu_aux", false, GELU_AUX, [](GemmArgs& a) { a.bias_ptr = &a.Bias; }, INV,
       {"bias must be null", "gelu_aux"}},
      {"aux missing for gelu_aux", false, GELU_AUX, [](GemmArgs& a) { a.aux_ptr = nullptr; }, INV,
       {"aux is required by epilogue gelu_aux"}},
      {"aux missing for dgelu", false, DGELU, [](GemmArgs& a) { a.aux_ptr = nullptr; }, INV,
       {"aux is required by epilogue dgelu"}},
      {"aux present with bias", false, BIAS, [](GemmArgs& a) { a.aux_ptr = &a.Aux; }, INV,
       {"aux must be null with epilogue bias"}},
      {"bias_grad missing for bgrad", false, BGRAD, [](GemmArgs& a) { a.bias_grad_ptr = nullptr; }, INV,
       {"bias_grad is required by epilogue bgrad"}},
      {"bias_grad missing for dgelu_bgrad", false, DGELU_BGRAD, [](GemmArgs& a) { a.bias_grad_ptr = nullptr; },
       INV, {"bias_grad is required by epilogue dgelu_bgrad"}},
      {"bias_grad present with dgelu", false, DGELU, [](GemmArgs& a) { a.bias_grad_ptr = &a.BiasGrad; }, INV,
       {"bias_grad must be null with epilogue dgelu"}},
      {"bias wrong length", false, BIAS, [](GemmArgs& a) { a.Bias.shape[0] = 4; }, INV,
       {"bias must have n=5 elements", "[4]"}},
      {"bias fp8", false, BIAS, [](GemmArgs& a) { a.Bias.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"bias dtype", "got float8_e4m3"}},
      {"bias null data", false, BIAS, [](GemmArgs& a) { a.Bias.data = nullptr; }, INV, {"bias.data", "null"}},
      {"aux wrong shape", false, DGELU, [](GemmArgs& a) { a.Aux.shape[0] = 5, a.Aux.shape[1] = 3; }, INV,
       {"aux shape [5, 3]", "[3, 5]"}},
      {"aux null data", false, GELU_AUX, [](GemmArgs& a) { a.Aux.data = nullptr; }, INV, {"aux.data", "null"}},
      {"bgrad bias_grad of length n", false, BGRAD, [](GemmArgs& a) { a.BiasGrad.shape[0] = 5; }, INV,
       {"bias_grad must have 3 elements (m)", "[5]"}},
      {"dgelu_bgrad bias_grad of length m", false, DGELU_BGRAD, [](GemmArgs& a) { a.BiasGrad.shape[0] = 3; }, INV,
       {"bias_grad must have 5 elements (n)", "[3]"}},
      {"bias_grad null data", false, BGRAD, [](GemmArgs& a) { a.BiasGrad.data = nullptr; }, INV,
       {"bias_grad.data", "null"}},
      {"bias_grad int32", false, DGELU_BGRAD, [](GemmArgs& a) { a.BiasGrad.dtype = TE_DTYPE_INT32; }, INV,
       {"bias_grad dtype", "got int32"}},
      {"A ndim 9", false, NONE, [](GemmArgs& a) { a.A.ndim = 9; }, INV, {"A", "ndim"}},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    GemmArgs a(c.fp8, c.epi);
    c.mutate(a);
    EXPECT_TRUE(is_error(a.run(), c.want, c.parts));
    EXPECT_TRUE(a.untouched());
  }
}

// Operands on different devices. A CPU-only build refuses the CUDA tensor
// itself (naming it); a CUDA build reports the mismatch.
TEST(GemmBadInput, MismatchedDevices) {
  const struct {
    const char* arg;
    te_gemm_epilogue epi;
    std::function<te_tensor&(GemmArgs&)> pick;
  } cases[] = {
      {"B", TE_GEMM_EPILOGUE_NONE, [](GemmArgs& a) -> te_tensor& { return a.B; }},
      {"D", TE_GEMM_EPILOGUE_NONE, [](GemmArgs& a) -> te_tensor& { return a.D; }},
      {"bias", TE_GEMM_EPILOGUE_BIAS, [](GemmArgs& a) -> te_tensor& { return a.Bias; }},
      {"aux", TE_GEMM_EPILOGUE_GELU_AUX, [](GemmArgs& a) -> te_tensor& { return a.Aux; }},
      {"bias_grad", TE_GEMM_EPILOGUE_BGRAD, [](GemmArgs& a) -> te_tensor& { return a.BiasGrad; }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arg);
    GemmArgs a(false, c.epi);
    c.pick(a).device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, {c.arg, "cuda:0", "cpu"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

// An FP8 operand with neither its row-wise data nor its column-wise copy: the
// message names the missing data.
TEST(GemmBadInput, NoStorageAtAll) {
  GemmArgs a(true);
  a.A.data = nullptr;
  EXPECT_TRUE(is_error(a.run(), INV, {"A.data", "null"}));
  EXPECT_TRUE(a.untouched());
}

}  // namespace
