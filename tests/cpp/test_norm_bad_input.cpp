// Bad input to the norm ops: the status, a message that starts with "<op>: " and
// names the argument and what was expected, and that a failing call writes
// nothing (every output is poisoned beforehand, and the unbroken baselines are
// checked to succeed and write).
#include <functional>

#include "test_util.h"

namespace {

using namespace tt;

constexpr uint32_t kPoisonBits = 0xABABABABu;
const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;

// Valid forward arguments: fp32 input [3, 64], fp32 gamma / beta, a bf16 output, or
// an E4M3 output with both layouts, scale, scale_inv and amax.
struct FwdArgs {
  bool layernorm;
  std::vector<float> x, gamma, beta;
  Buffer y{3 * 64 * 2}, yt{3 * 64}, mu{3 * 4}, rs{3 * 4};
  float scale = 2.0f, scale_inv = f32(kPoisonBits), amax = 1.5f, eps = 1e-5f;
  te_tensor in, g, b, out, tmu, trs;
  const te_tensor *in_ptr = &in, *g_ptr = &g, *b_ptr = &b, *out_ptr = &out, *mu_ptr = &tmu, *rs_ptr = &trs;
  int zero_centered = 0;

  explicit FwdArgs(bool ln, bool fp8 = false) : layernorm(ln), x(3 * 64), gamma(64, 1.0f), beta(64, 0.5f) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 11) - 5.0f;
    in = make_tensor(TE_DTYPE_FLOAT32, {3, 64}, x.data());
    g = make_tensor(TE_DTYPE_FLOAT32, {64}, gamma.data());
    b = make_tensor(TE_DTYPE_FLOAT32, {64}, beta.data());
    out = make_tensor(TE_DTYPE_BFLOAT16, {3, 64}, y.data());
    if (fp8) {
      out.dtype = TE_DTYPE_FLOAT8_E4M3;
      out.scaling_mode = TE_SCALING_PER_TENSOR;
      out.columnwise_data = yt.data();
      out.scale = &scale;
      out.scale_inv = &scale_inv;
      out.amax = &amax;
    }
    tmu = make_tensor(TE_DTYPE_FLOAT32, {3}, mu.data());
    trs = make_tensor(TE_DTYPE_FLOAT32, {3}, rs.data());
  }
  FwdArgs(const FwdArgs&) = delete;
  const char* op() const { return layernorm ? "te_layernorm_fwd" : "te_rmsnorm_fwd"; }
  te_status run(void* workspace = nullptr, size_t workspace_size = 0) {
    return layernorm ? te_layernorm_fwd(in_ptr, g_ptr, b_ptr, eps, zero_centered, out_ptr, mu_ptr, rs_ptr, workspace,
                                        workspace_size, nullptr)
                     : te_rmsnorm_fwd(in_ptr, g_ptr, eps, zero_centered, out_ptr, rs_ptr, workspace, workspace_size,
                                      nullptr);
  }
  bool untouched() const {
    return y.all_poison() && yt.all_poison() && mu.all_poison() && rs.all_poison() &&
           bits_of(scale_inv) == kPoisonBits && amax == 1.5f;
  }
};

// Valid backward arguments: fp32 x / dz / dx [3, 64], bf16 gamma / dgamma / dbeta.
struct BwdArgs {
  bool layernorm;
  std::vector<float> x, dz, mu, rs;
  Buffer gamma{64 * 2}, dx{3 * 64 * 4}, dg{64 * 2}, db{64 * 2};
  te_tensor tdz, tx, tmu, trs, tg, tdx, tdg, tdb;
  const te_tensor *dz_ptr = &tdz, *x_ptr = &tx, *mu_ptr = &tmu, *rs_ptr = &trs, *g_ptr = &tg, *dx_ptr = &tdx,
                  *dg_ptr = &tdg, *db_ptr = &tdb;

  explicit BwdArgs(bool ln) : layernorm(ln), x(3 * 64), dz(3 * 64), mu(3, 0.5f), rs(3, 2.0f) {
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 3.0f, dz[i] = float(i % 5) - 2.0f;
    for (size_t i = 0; i < 64; ++i) store_value(gamma, TE_DTYPE_BFLOAT16, i, 1.0f + 0.25f * float(i % 3));
    tdz = make_tensor(TE_DTYPE_FLOAT32, {3, 64}, dz.data());
    tx = make_tensor(TE_DTYPE_FLOAT32, {3, 64}, x.data());
    tmu = make_tensor(TE_DTYPE_FLOAT32, {3}, mu.data());
    trs = make_tensor(TE_DTYPE_FLOAT32, {3}, rs.data());
    tg = make_tensor(TE_DTYPE_BFLOAT16, {64}, gamma.data());
    tdx = make_tensor(TE_DTYPE_FLOAT32, {3, 64}, dx.data());
    tdg = make_tensor(TE_DTYPE_BFLOAT16, {64}, dg.data());
    tdb = make_tensor(TE_DTYPE_BFLOAT16, {64}, db.data());
  }
  BwdArgs(const BwdArgs&) = delete;
  const char* op() const { return layernorm ? "te_layernorm_bwd" : "te_rmsnorm_bwd"; }
  te_status run(void* workspace = nullptr, size_t workspace_size = 0) {
    return layernorm ? te_layernorm_bwd(dz_ptr, x_ptr, mu_ptr, rs_ptr, g_ptr, 0, dx_ptr, dg_ptr, db_ptr, workspace,
                                        workspace_size, nullptr)
                     : te_rmsnorm_bwd(dz_ptr, x_ptr, rs_ptr, g_ptr, 0, dx_ptr, dg_ptr, workspace, workspace_size,
                                      nullptr);
  }
  bool untouched() const { return dx.all_poison() && dg.all_poison() && db.all_poison(); }
};

TEST(NormBadInput, BaselinesSucceed) {
  for (bool ln : {true, false}) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (ln ? "layernorm" : "rmsnorm") << (fp8 ? " fp8" : ""));
      FwdArgs a(ln, fp8);
      ASSERT_EQ(a.run(), TE_SUCCESS) << last_error();
      EXPECT_FALSE(a.y.all_poison());
      EXPECT_FALSE(a.rs.all_poison());
      EXPECT_EQ(a.mu.all_poison(), !ln);
      EXPECT_EQ(a.yt.all_poison(), !fp8);
    }
    BwdArgs b(ln);
    ASSERT_EQ(b.run(), TE_SUCCESS) << last_error();
    EXPECT_FALSE(b.dx.all_poison());
    EXPECT_FALSE(b.dg.all_poison());
    EXPECT_EQ(b.db.all_poison(), !ln);
  }
}

struct FwdBad {
  const char* what;
  bool fp8;
  std::function<void(FwdArgs&)> mutate;
  te_status want;
  std::vector<std::string> parts;
  bool layernorm_only = false;
};

TEST(NormBadInput, Forward) {
  const std::vector<FwdBad> cases = {
      {"null input", false, [](FwdArgs& a) { a.in_ptr = nullptr; }, INV, {"input must not be null"}},
      {"null gamma", false, [](FwdArgs& a) { a.g_ptr = nullptr; }, INV, {"gamma must not be null"}},
      {"null beta", false, [](FwdArgs& a) { a.b_ptr = nullptr; }, INV, {"beta must not be null"}, true},
      {"null output", false, [](FwdArgs& a) { a.out_ptr = nullptr; }, INV, {"output must not be null"}},
      {"null mu", false, [](FwdArgs& a) { a.mu_ptr = nullptr; }, INV, {"mu must not be null"}, true},
      {"null rsigma", false, [](FwdArgs& a) { a.rs_ptr = nullptr; }, INV, {"rsigma must not be null"}},
      {"null input data", false, [](FwdArgs& a) { a.in.data = nullptr; }, INV, {"input.data must not be null"}},
      {"null gamma data", false, [](FwdArgs& a) { a.g.data = nullptr; }, INV, {"gamma.data must not be null"}},
      {"null beta data", false, [](FwdArgs& a) { a.b.data = nullptr; }, INV, {"beta.data must not be null"}, true},
      {"null output data", false, [](FwdArgs& a) { a.out.data = nullptr; }, INV, {"output.data must not be null"}},
      {"null mu data", false, [](FwdArgs& a) { a.tmu.data = nullptr; }, INV, {"mu.data must not be null"}, true},
      {"null rsigma data", false, [](FwdArgs& a) { a.trs.data = nullptr; }, INV, {"rsigma.data must not be null"}},
      {"int32 input", false, [](FwdArgs& a) { a.in.dtype = TE_DTYPE_INT32; }, INV,
       {"input dtype must be float32, float16 or bfloat16, got int32"}},
      {"fp8 input", false, [](FwdArgs& a) { a.in.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"input dtype must be float32, float16 or bfloat16, got float8_e4m3"}},
      {"scalar input", false, [](FwdArgs& a) { a.in.ndim = 0; }, INV,
       {"input must have at least one dimension", "scalar"}},
      {"hidden 0", false, [](FwdArgs& a) { a.in.shape[1] = a.out.shape[1] = 0; }, INV,
       {"input hidden size (last dim) must be at least 1, got shape [3, 0]"}},
      {"gamma length", false, [](FwdArgs& a) { a.g.shape[0] = 63; }, INV,
       {"gamma must have hidden=64 elements (the last dim of input), got shape [63]"}},
      {"gamma 2-D of the wrong size", false, [](FwdArgs& a) { a.g.ndim = 2, a.g.shape[0] = 2, a.g.shape[1] = 64; },
       INV, {"gamma must have hidden=64 elements", "[2, 64]"}},
      {"gamma int64", false, [](FwdArgs& a) { a.g.dtype = TE_DTYPE_INT64; }, INV,
       {"gamma dtype must be float32, float16 or bfloat16, got int64"}},
      {"gamma fp8", false, [](FwdArgs& a) { a.g.dtype = TE_DTYPE_FLOAT8_E5M2; }, INV,
       {"gamma dtype", "got float8_e5m2"}},
      {"beta length", false, [](FwdArgs& a) { a.b.shape[0] = 65; }, INV,
       {"beta must have hidden=64 elements", "[65]"}, true},
      {"beta dtype differs from gamma", false, [](FwdArgs& a) { a.b.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"beta dtype must equal gamma dtype float32, got bfloat16"}, true},
      {"eps NaN", false, [](FwdArgs& a) { a.eps = NAN; }, INV, {"eps must be finite and >= 0, got nan"}},
      {"eps inf", false, [](FwdArgs& a) { a.eps = INFINITY; }, INV, {"eps must be finite and >= 0, got inf"}},
      {"eps negative", false, [](FwdArgs& a) { a.eps = -1e-5f; }, INV, {"eps must be finite and >= 0, got -1e-05"}},
      {"output shape", false, [](FwdArgs& a) { a.out.shape[1] = 63; }, INV,
       {"output shape [3, 63] must equal input shape [3, 64]"}},
      {"output rank", false, [](FwdArgs& a) { a.out.ndim = 1, a.out.shape[0] = 192; }, INV,
       {"output shape [192] must equal input shape [3, 64]"}},
      {"output int32", false, [](FwdArgs& a) { a.out.dtype = TE_DTYPE_INT32; }, INV,
       {"output dtype must be float32, float16, bfloat16, float8_e4m3 or float8_e5m2, got int32"}},
      {"output uint8", false, [](FwdArgs& a) { a.out.dtype = TE_DTYPE_UINT8; }, INV, {"output dtype", "got uint8"}},
      {"float output with a column-wise copy", false, [](FwdArgs& a) { a.out.columnwise_data = a.yt.data(); }, INV,
       {"output.columnwise_data must be null for a bfloat16 output"}},
      {"fp8 output without scale", true, [](FwdArgs& a) { a.out.scale = nullptr; }, INV,
       {"output.scale must not be null"}},
      {"fp8 output, no data at all", true, [](FwdArgs& a) { a.out.data = a.out.columnwise_data = nullptr; }, INV,
       {"output.data and output.columnwise_data must not both be null"}},
      {"fp8 output unscaled", true, [](FwdArgs& a) { a.out.scaling_mode = TE_SCALING_NONE; }, INV,
       {"output scaling_mode must be per-tensor (1), got 0"}},
      {"fp8 output 1x128 blocks", true, [](FwdArgs& a) { a.out.scaling_mode = TE_SCALING_BLOCK_1D; }, NIMP,
       {"output scaling_mode 1x128 block scaling is not implemented yet"}},
      {"fp8 output 128x128 blocks", true, [](FwdArgs& a) { a.out.scaling_mode = TE_SCALING_BLOCK_2D; }, NIMP,
       {"output scaling_mode 128x128 block scaling is not implemented yet"}},
      {"mu bf16", false, [](FwdArgs& a) { a.tmu.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"mu dtype must be float32 (statistics are fp32), got bfloat16"}, true},
      {"rsigma fp16", false, [](FwdArgs& a) { a.trs.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"rsigma dtype must be float32 (statistics are fp32), got float16"}},
      {"mu length", false, [](FwdArgs& a) { a.tmu.shape[0] = 4; }, INV,
       {"mu must have rows=3 elements (one per row of input [3, 64]), got shape [4]"}, true},
      {"rsigma length", false, [](FwdArgs& a) { a.trs.shape[0] = 64; }, INV,
       {"rsigma must have rows=3 elements", "got shape [64]"}},
      {"input ndim 9", false, [](FwdArgs& a) { a.in.ndim = 9; }, INV, {"input ndim must be in [0, 8], got 9"}},
      {"gamma negative dim", false, [](FwdArgs& a) { a.g.shape[0] = -64; }, INV, {"gamma shape must not be negative"}},
      {"output dtype enum", false, [](FwdArgs& a) { a.out.dtype = 77; }, INV, {"output dtype is not a te_dtype: 77"}},
      {"rsigma device type", false, [](FwdArgs& a) { a.trs.device.type = 3; }, INV,
       {"rsigma device type must be cpu (0) or cuda (1), got 3"}},
  };
  for (bool ln : {true, false})
    for (const FwdBad& c : cases) {
      if (c.layernorm_only && !ln) continue;
      SCOPED_TRACE(::testing::Message() << (ln ? "layernorm: " : "rmsnorm: ") << c.what);
      FwdArgs a(ln, c.fp8);
      c.mutate(a);
      EXPECT_TRUE(is_error(a.run(), c.want, a.op(), c.parts));
      EXPECT_TRUE(a.untouched());
    }
}

// RMSNorm has no beta and no mu: broken ones are not looked at.
TEST(NormBadInput, RmsnormIgnoresBetaAndMu) {
  FwdArgs a(false);
  a.b_ptr = nullptr;
  a.mu_ptr = nullptr;
  ASSERT_EQ(a.run(), TE_SUCCESS) << last_error();
  BwdArgs b(false);
  b.mu_ptr = nullptr;
  b.db_ptr = nullptr;
  ASSERT_EQ(b.run(), TE_SUCCESS) << last_error();
}

struct BwdBad {
  const char* what;
  std::function<void(BwdArgs&)> mutate;
  te_status want;
  std::vector<std::string> parts;
  bool layernorm_only = false;
};

TEST(NormBadInput, Backward) {
  const std::vector<BwdBad> cases = {
      {"null dz", [](BwdArgs& a) { a.dz_ptr = nullptr; }, INV, {"dz must not be null"}},
      {"null x", [](BwdArgs& a) { a.x_ptr = nullptr; }, INV, {"x must not be null"}},
      {"null mu", [](BwdArgs& a) { a.mu_ptr = nullptr; }, INV, {"mu must not be null"}, true},
      {"null rsigma", [](BwdArgs& a) { a.rs_ptr = nullptr; }, INV, {"rsigma must not be null"}},
      {"null gamma", [](BwdArgs& a) { a.g_ptr = nullptr; }, INV, {"gamma must not be null"}},
      {"null dx", [](BwdArgs& a) { a.dx_ptr = nullptr; }, INV, {"dx must not be null"}},
      {"null dgamma", [](BwdArgs& a) { a.dg_ptr = nullptr; }, INV, {"dgamma must not be null"}},
      {"null dbeta", [](BwdArgs& a) { a.db_ptr = nullptr; }, INV, {"dbeta must not be null"}, true},
      {"null dz data", [](BwdArgs& a) { a.tdz.data = nullptr; }, INV, {"dz.data must not be null"}},
      {"null x data", [](BwdArgs& a) { a.tx.data = nullptr; }, INV, {"x.data must not be null"}},
      {"null dx data", [](BwdArgs& a) { a.tdx.data = nullptr; }, INV, {"dx.data must not be null"}},
      {"null mu data", [](BwdArgs& a) { a.tmu.data = nullptr; }, INV, {"mu.data must not be null"}, true},
      {"null rsigma data", [](BwdArgs& a) { a.trs.data = nullptr; }, INV, {"rsigma.data must not be null"}},
      {"null gamma data", [](BwdArgs& a) { a.tg.data = nullptr; }, INV, {"gamma.data must not be null"}},
      {"null dgamma data", [](BwdArgs& a) { a.tdg.data = nullptr; }, INV, {"dgamma.data must not be null"}},
      {"null dbeta data", [](BwdArgs& a) { a.tdb.data = nullptr; }, INV, {"dbeta.data must not be null"}, true},
      {"x int32", [](BwdArgs& a) { a.tx.dtype = TE_DTYPE_INT32; }, INV,
       {"x dtype must be float32, float16 or bfloat16, got int32"}},
      {"x hidden 0", [](BwdArgs& a) { a.tx.shape[1] = a.tdz.shape[1] = a.tdx.shape[1] = 0; }, INV,
       {"x hidden size (last dim) must be at least 1, got shape [3, 0]"}},
      {"x scalar", [](BwdArgs& a) { a.tx.ndim = 0; }, INV, {"x must have at least one dimension"}},
      {"dz dtype", [](BwdArgs& a) { a.tdz.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"dz dtype must equal x dtype float32, got bfloat16"}},
      {"dz shape", [](BwdArgs& a) { a.tdz.shape[0] = 4; }, INV, {"dz shape [4, 64] must equal x shape [3, 64]"}},
      {"dx dtype", [](BwdArgs& a) { a.tdx.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"dx dtype must equal x dtype float32, got float16"}},
      {"dx shape", [](BwdArgs& a) { a.tdx.ndim = 3, a.tdx.shape[2] = 1; }, INV,
       {"dx shape [3, 64, 1] must equal x shape [3, 64]"}},
      {"mu fp16", [](BwdArgs& a) { a.tmu.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"mu dtype must be float32 (statistics are fp32), got float16"}, true},
      {"rsigma bf16", [](BwdArgs& a) { a.trs.dtype = TE_DTYPE_BFLOAT16; }, INV,
       {"rsigma dtype must be float32", "got bfloat16"}},
      {"mu length", [](BwdArgs& a) { a.tmu.shape[0] = 2; }, INV,
       {"mu must have rows=3 elements (one per row of x [3, 64]), got shape [2]"}, true},
      {"rsigma length", [](BwdArgs& a) { a.trs.shape[0] = 192; }, INV, {"rsigma must have rows=3 elements"}},
      {"gamma length", [](BwdArgs& a) { a.tg.shape[0] = 32; }, INV,
       {"gamma must have hidden=64 elements (the last dim of x), got shape [32]"}},
      {"gamma fp8", [](BwdArgs& a) { a.tg.dtype = TE_DTYPE_FLOAT8_E4M3; }, INV,
       {"gamma dtype must be float32, float16 or bfloat16, got float8_e4m3"}},
      {"dgamma dtype", [](BwdArgs& a) { a.tdg.dtype = TE_DTYPE_FLOAT16; }, INV,
       {"dgamma dtype must equal gamma dtype bfloat16, got float16"}},
      {"dgamma length", [](BwdArgs& a) { a.tdg.shape[0] = 65; }, INV, {"dgamma must have hidden=64 elements", "[65]"}},
      {"dbeta dtype", [](BwdArgs& a) { a.tdb.dtype = TE_DTYPE_FLOAT32; }, INV,
       {"dbeta dtype must equal gamma dtype bfloat16, got float32"}, true},
      {"dbeta length", [](BwdArgs& a) { a.tdb.shape[0] = 1; }, INV, {"dbeta must have hidden=64 elements", "[1]"},
       true},
      {"dbeta int", [](BwdArgs& a) { a.tdb.dtype = TE_DTYPE_INT32; }, INV,
       {"dbeta dtype must be float32, float16 or bfloat16, got int32"}, true},
  };
  for (bool ln : {true, false})
    for (const BwdBad& c : cases) {
      if (c.layernorm_only && !ln) continue;
      SCOPED_TRACE(::testing::Message() << (ln ? "layernorm: " : "rmsnorm: ") << c.what);
      BwdArgs a(ln);
      c.mutate(a);
      EXPECT_TRUE(is_error(a.run(), c.want, a.op(), c.parts));
      EXPECT_TRUE(a.untouched());
    }
}

// One argument on a GPU, the others on the CPU. A CPU-only build refuses the CUDA
// tensor itself (naming it); a CUDA build reports the mismatch.
TEST(NormBadInput, MismatchedDevices) {
  const struct {
    const char* arg;
    std::function<te_tensor&(FwdArgs&)> pick;
  } fwd[] = {
      {"gamma", [](FwdArgs& a) -> te_tensor& { return a.g; }},
      {"beta", [](FwdArgs& a) -> te_tensor& { return a.b; }},
      {"output", [](FwdArgs& a) -> te_tensor& { return a.out; }},
      {"mu", [](FwdArgs& a) -> te_tensor& { return a.tmu; }},
      {"rsigma", [](FwdArgs& a) -> te_tensor& { return a.trs; }},
  };
  for (const auto& c : fwd) {
    SCOPED_TRACE(c.arg);
    FwdArgs a(true);
    c.pick(a).device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, a.op(), {std::string(c.arg) + " is on cuda:0 but input is on cpu"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, a.op(), {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
  const struct {
    const char* arg;
    std::function<te_tensor&(BwdArgs&)> pick;
  } bwd[] = {
      {"dz", [](BwdArgs& a) -> te_tensor& { return a.tdz; }},
      {"dx", [](BwdArgs& a) -> te_tensor& { return a.tdx; }},
      {"mu", [](BwdArgs& a) -> te_tensor& { return a.tmu; }},
      {"rsigma", [](BwdArgs& a) -> te_tensor& { return a.trs; }},
      {"gamma", [](BwdArgs& a) -> te_tensor& { return a.tg; }},
      {"dgamma", [](BwdArgs& a) -> te_tensor& { return a.tdg; }},
      {"dbeta", [](BwdArgs& a) -> te_tensor& { return a.tdb; }},
  };
  for (const auto& c : bwd) {
    SCOPED_TRACE(c.arg);
    BwdArgs a(true);
    c.pick(a).device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, a.op(), {std::string(c.arg) + " is on cuda:0 but x is on cpu"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, a.op(), {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

// Every tensor on the GPU (nothing is dereferenced: validation fails first): the
// workspace must hold te_norm_workspace_size bytes. A CPU-only build refuses the
// first CUDA tensor.
TEST(NormBadInput, CudaWorkspaceTooSmall) {
  const size_t need = te_norm_workspace_size(3, 64, cuda(0));
  ASSERT_EQ(need, 3u * 2 * 64 * 4);
  {
    FwdArgs a(true);
    for (te_tensor* t : {&a.in, &a.g, &a.b, &a.out, &a.tmu, &a.trs}) t->device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(a.y.data(), need - 1), INV, a.op(),
                           {"workspace must be at least 1536 bytes (te_norm_workspace_size(3, 64)), got 1535"}));
      EXPECT_TRUE(is_error(a.run(nullptr, need), INV, a.op(), {"workspace.pointer must not be null"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, a.op(), {"input is a CUDA tensor"}));
    }
    EXPECT_TRUE(a.untouched());
  }
  {
    BwdArgs a(false);
    for (te_tensor* t : {&a.tdz, &a.tx, &a.trs, &a.tg, &a.tdx, &a.tdg}) t->device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(nullptr, 0), INV, a.op(), {"workspace must be at least 1536 bytes"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, a.op(), {"x is a CUDA tensor"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

}  // namespace
