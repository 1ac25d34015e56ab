// Fused attention (opente/fused_attn.h) on the CPU: the argument validation, which
// runs before any device work, and the mapping of mask types and windows to cuDNN's
// diagonal band. The kernels themselves are cuDNN's and run on the GPU only
// (tests/python/test_fused_attn.py); a valid call on CPU tensors must say so.
#include <string>
#include <vector>

#include "ops/fused_attn/fused_attn_params.h"
#include "test_util.h"

namespace {

using namespace tt;
using opente::sdpa_band;
using opente::SdpaBand;

const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;

// [b, h, s, d] strides of a contiguous bshd tensor.
void bshd_strides(int64_t* out, int64_t s, int64_t h, int64_t d) {
  out[0] = s * h * d;
  out[1] = d;
  out[2] = h * d;
  out[3] = 1;
}

// A valid call on CPU descriptors: bf16 bshd, b=2, h=4, hg=2, sq=8, skv=16, d=64,
// causal, with statistics; each test breaks one thing.
struct Call {
  static constexpr int64_t b = 2, h = 4, hg = 2, sq = 8, skv = 16, d = 64;
  std::vector<uint16_t> qd, kd, vd, od, dod, dqd, dkd, dvd, biasd, dbiasd;
  std::vector<float> statsd;
  std::vector<int32_t> lens;
  std::vector<int64_t> rng{1, 2};
  te_fused_attn_config config{TE_ATTN_MASK_CAUSAL, TE_ATTN_BIAS_NONE, -1, 0, 0.125f, 0.0f, 0};
  te_tensor q, k, v, o, d_o, dq, dk, dv, stats, bias, dbias, seqlens_q, seqlens_kv, rng_state;
  te_attn_strides strides{}, grad_strides{};
  const te_fused_attn_config* config_ptr = &config;
  const te_tensor *bias_ptr = nullptr, *dbias_ptr = nullptr, *sq_ptr = nullptr, *skv_ptr = nullptr, *rng_ptr = nullptr,
                  *stats_ptr = &stats;
  const te_attn_strides *strides_ptr = &strides, *grad_strides_ptr = &grad_strides;

  Call()
      : qd(b * sq * h * d),
        kd(b * skv * hg * d),
        vd(b * skv * hg * d),
        od(b * sq * h * d),
        dod(b * sq * h * d),
        dqd(b * sq * h * d),
        dkd(b * skv * hg * d),
        dvd(b * skv * hg * d),
        biasd(b * h * sq * skv),
        dbiasd(b * h * sq * skv),
        statsd(b * h * sq),
        lens(b, 5) {
    q = make_tensor(TE_DTYPE_BFLOAT16, {b, h, sq, d}, qd.data());
    k = make_tensor(TE_DTYPE_BFLOAT16, {b, hg, skv, d}, kd.data());
    v = make_tensor(TE_DTYPE_BFLOAT16, {b, hg, skv, d}, vd.data());
    o = make_tensor(TE_DTYPE_BFLOAT16, {b, h, sq, d}, od.data());
    d_o = make_tensor(TE_DTYPE_BFLOAT16, {b, h, sq, d}, dod.data());
    dq = make_tensor(TE_DTYPE_BFLOAT16, {b, h, sq, d}, dqd.data());
    dk = make_tensor(TE_DTYPE_BFLOAT16, {b, hg, skv, d}, dkd.data());
    dv = make_tensor(TE_DTYPE_BFLOAT16, {b, hg, skv, d}, dvd.data());
    stats = make_tensor(TE_DTYPE_FLOAT32, {b, h, sq, 1}, statsd.data());
    bias = make_tensor(TE_DTYPE_BFLOAT16, {1, h, sq, skv}, biasd.data());
    dbias = make_tensor(TE_DTYPE_BFLOAT16, {1, h, sq, skv}, dbiasd.data());
    seqlens_q = make_tensor(TE_DTYPE_INT32, {b}, lens.data());
    seqlens_kv = make_tensor(TE_DTYPE_INT32, {b}, lens.data());
    rng_state = make_tensor(TE_DTYPE_INT64, {2}, rng.data());
    bshd_strides(strides.q, sq, h, d);
    bshd_strides(strides.k, skv, hg, d);
    bshd_strides(strides.v, skv, hg, d);
    bshd_strides(strides.o, sq, h, d);
    grad_strides = strides;
  }
  Call(const Call&) = delete;

  void use_bias() {
    config.bias_type = TE_ATTN_BIAS_POST_SCALE;
    bias_ptr = &bias;
  }
  void use_padding() {
    config.mask_type = TE_ATTN_MASK_PADDING_CAUSAL;
    sq_ptr = &seqlens_q;
    skv_ptr = &seqlens_kv;
  }
  void use_dropout() {
    config.dropout = 0.1f;
    rng_ptr = &rng_state;
  }
  te_status fwd() {
    return te_fused_attn_fwd(config_ptr, &q, &k, &v, bias_ptr, sq_ptr, skv_ptr, rng_ptr, &o, stats_ptr, strides_ptr,
                             nullptr, 0, nullptr);
  }
  te_status fwd_size(size_t* size) {
    return te_fused_attn_fwd_workspace_size(config_ptr, &q, &k, &v, bias_ptr, sq_ptr, skv_ptr, rng_ptr, &o, stats_ptr,
                                            strides_ptr, size);
  }
  te_status bwd() {
    return te_fused_attn_bwd(config_ptr, &q, &k, &v, &o, &d_o, stats_ptr, bias_ptr, sq_ptr, skv_ptr, rng_ptr, &dq, &dk,
                             &dv, dbias_ptr, strides_ptr, grad_strides_ptr, nullptr, 0, nullptr);
  }
};

// ---- a valid call on the CPU is refused after validation ----

TEST(FusedAttnArgs, ValidCallsOnCpuAreNotImplemented) {
  Call c;
  EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"CUDA tensors only", "unfused"}));
  size_t size = 7;
  EXPECT_TRUE(is_error(c.fwd_size(&size), NIMP, "te_fused_attn_fwd_workspace_size", {"CUDA tensors only"}));
  EXPECT_EQ(size, 7u);  // not written
  EXPECT_TRUE(is_error(c.bwd(), NIMP, "te_fused_attn_bwd", {"CUDA tensors only"}));
  // Every optional input in use is still valid.
  Call full;
  full.use_bias();
  full.use_padding();
  full.use_dropout();
  full.dbias_ptr = &full.dbias;
  EXPECT_TRUE(is_error(full.fwd(), NIMP, "te_fused_attn_fwd", {"CUDA tensors only"}));
  EXPECT_TRUE(is_error(full.bwd(), NIMP, "te_fused_attn_bwd", {"CUDA tensors only"}));
  // The forward's stats are optional (inference).
  Call inference;
  inference.stats_ptr = nullptr;
  EXPECT_TRUE(is_error(inference.fwd(), NIMP, "te_fused_attn_fwd", {"CUDA tensors only"}));
}

TEST(FusedAttnArgs, VersionsWithoutCudnn) {
  EXPECT_TRUE(is_error(te_cudnn_version(nullptr), INV, "te_cudnn_version", {"version must not be null"}));
  if (te_cudnn_frontend_version() == 0) {
    int64_t version = -1;
    EXPECT_TRUE(is_error(te_cudnn_version(&version), NIMP, "te_cudnn_version", {"no cuDNN fused attention"}));
    EXPECT_EQ(version, -1);
  } else {
    EXPECT_GE(te_cudnn_frontend_version(), 10000);  // 1.x.y
  }
}

// ---- config ----

TEST(FusedAttnArgs, Config) {
  {
    Call c;
    c.config_ptr = nullptr;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"config must not be null"}));
  }
  {
    Call c;
    c.config.mask_type = 6;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"mask_type", "got 6"}));
  }
  {
    Call c;
    c.config.bias_type = 7;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"bias_type", "got 7"}));
  }
  for (int32_t bias_type : {int32_t(TE_ATTN_BIAS_PRE_SCALE), int32_t(TE_ATTN_BIAS_ALIBI)}) {
    Call c;
    c.config.bias_type = bias_type;
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"not implemented", "POST_SCALE only"}));
  }
  {
    Call c;
    c.config.window_left = -2;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"window", "(-2, 0)"}));
  }
  {
    Call c;  // causal keeps window_right at 0 (or -1)
    c.config.window_right = 3;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"window_right must be -1 or 0", "got 3"}));
  }
  {
    Call c;
    c.config.softmax_scale = NAN;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"softmax_scale must be finite"}));
  }
  for (float p : {1.0f, -0.1f, float(NAN)}) {
    Call c;
    c.config.dropout = p;
    c.rng_ptr = &c.rng_state;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"dropout must be in [0, 1)"}));
  }
}

// ---- q, k, v, o ----

TEST(FusedAttnArgs, DtypesAndShapes) {
  {
    Call c;
    c.q.dtype = TE_DTYPE_FLOAT32;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"q dtype must be float16 or bfloat16", "float32"}));
  }
  {
    Call c;
    c.k.dtype = TE_DTYPE_FLOAT16;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"k dtype must equal q dtype bfloat16", "float16"}));
  }
  {
    Call c;
    c.q.ndim = 3;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"q must be 4-D", "[b, h, s, d]"}));
  }
  {
    Call c;
    c.k.shape[0] = 3;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"k shape must be [b, hg, skv, dqk]", "[3, 2, 16, 64]"}));
  }
  {
    Call c;  // 4 query heads over 3 key / value heads
    c.k.shape[1] = c.v.shape[1] = 3;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"h=4 must be a multiple of", "hg=3"}));
  }
  {
    Call c;
    c.v.shape[2] = 15;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"v shape must be", "[2, 2, 16, -1]"}));
  }
  {
    Call c;
    c.o.shape[3] = 32;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"o shape must be [b, h, sq, dv]", "[2, 4, 8, 64]"}));
  }
  {
    Call c;
    c.q.data = nullptr;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"q", "data"}));
    size_t size = 0;  // the workspace query takes descriptors without data
    EXPECT_TRUE(is_error(c.fwd_size(&size), NIMP, "te_fused_attn_fwd_workspace_size", {"CUDA tensors only"}));
  }
  {
    Call c;
    size_t* no_size = nullptr;
    EXPECT_TRUE(is_error(c.fwd_size(no_size), INV, "te_fused_attn_fwd_workspace_size", {"workspace_size"}));
  }
}

TEST(FusedAttnArgs, HeadDimsAndEmptyDims) {
  {
    // dqk = 260 with an aligned sequence stride (264): only the head dim is wrong.
    Call c;
    c.q.shape[3] = c.k.shape[3] = 260;
    std::vector<uint16_t> big(2 * 8 * 4 * 264 + 2 * 16 * 2 * 264);
    c.q.data = big.data();
    c.k.data = big.data();
    const int64_t qs[4] = {8 * 4 * 264, 264, 4 * 264, 1}, ks[4] = {16 * 2 * 264, 264, 2 * 264, 1};
    for (int i = 0; i < 4; ++i) c.strides.q[i] = qs[i], c.strides.k[i] = ks[i];
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"multiples of 8 and at most 256", "dqk=260"}));
  }
  {
    Call c;  // an empty batch
    c.q.shape[0] = c.k.shape[0] = c.v.shape[0] = c.o.shape[0] = 0;
    c.stats.shape[0] = 0;
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"no empty dims"}));
  }
}

TEST(FusedAttnArgs, Strides) {
  {
    Call c;
    c.strides_ptr = nullptr;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"strides must not be null"}));
  }
  {
    Call c;
    c.strides.v[3] = 2;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"strides.v of the head dim d must be 1"}));
  }
  {
    Call c;  // a broadcast (stride 0) dim
    c.strides.k[1] = 0;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"strides.k must be positive", "h stride"}));
  }
  {
    Call c;  // o's heads written over each other
    c.strides.o[1] = 8;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"strides.o", "overlap", "o is written"}));
  }
  {
    Call c;  // an input may overlap itself: a view cuDNN can read
    c.strides.k[1] = 8 * 64 / 8;
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"CUDA tensors only"}));
  }
  {
    Call c;  // a sequence stride of 68 elements = 136 bytes
    c.strides.q[2] = 68;
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"strides.q", "136 bytes", "16-byte vectors"}));
  }
  {
    Call c;  // a view at an odd element offset
    c.q.data = c.qd.data() + 1;
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"q.data must be 16-byte aligned"}));
  }
  {
    Call c;  // dims of extent 1 take any stride
    c.q.shape[0] = c.k.shape[0] = c.v.shape[0] = c.o.shape[0] = c.stats.shape[0] = 1;
    c.strides.q[0] = 3;
    c.strides.o[0] = 0;
    EXPECT_TRUE(is_error(c.fwd(), NIMP, "te_fused_attn_fwd", {"CUDA tensors only"}));
  }
}

// ---- bias, sequence lengths, rng state, stats ----

TEST(FusedAttnArgs, OptionalInputs) {
  {
    Call c;
    c.config.bias_type = TE_ATTN_BIAS_POST_SCALE;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"bias must not be null"}));
  }
  {
    Call c;
    c.bias_ptr = &c.bias;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"bias must be NULL", "POST_SCALE"}));
  }
  {
    Call c;
    c.use_bias();
    c.bias.shape[2] = 1;  // broadcast over the queries: not a cuDNN bias
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"bias must have shape [1 or b, 1 or h, sq, skv]"}));
  }
  {
    Call c;
    c.use_bias();
    c.bias.dtype = TE_DTYPE_FLOAT32;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"bias dtype must equal q dtype"}));
  }
  {
    Call c;
    c.config.mask_type = TE_ATTN_MASK_PADDING;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"seqlens_q must not be null"}));
  }
  {
    Call c;
    c.use_padding();
    c.seqlens_kv.dtype = TE_DTYPE_INT64;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"seqlens_kv dtype must be int32"}));
  }
  {
    Call c;
    c.use_padding();
    c.seqlens_q.shape[0] = 3;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"seqlens_q must have shape [2]", "[3]"}));
  }
  {
    Call c;
    c.sq_ptr = &c.seqlens_q;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"seqlens_q must be NULL", "without padding"}));
  }
  {
    Call c;
    c.config.dropout = 0.1f;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"rng_state must not be null"}));
  }
  {
    Call c;
    c.use_dropout();
    c.rng_state.shape[0] = 3;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"rng_state must have shape [2]"}));
  }
  {
    Call c;
    c.rng_ptr = &c.rng_state;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"rng_state must be NULL without dropout"}));
  }
  {
    Call c;
    c.stats.dtype = TE_DTYPE_BFLOAT16;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"stats dtype must be float32"}));
  }
  {
    Call c;
    c.stats.shape[3] = 2;
    EXPECT_TRUE(is_error(c.fwd(), INV, "te_fused_attn_fwd", {"stats must have shape [b, h, sq, 1]", "[2, 4, 8, 1]"}));
  }
}

// ---- the backward's own arguments ----

TEST(FusedAttnArgs, Backward) {
  {
    Call c;
    c.stats_ptr = nullptr;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"stats must not be null in the backward"}));
  }
  {
    Call c;
    c.grad_strides_ptr = nullptr;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"grad_strides must not be null"}));
  }
  {
    Call c;
    c.dk.shape[2] = 8;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"dk shape must be k's [b, hg, skv, dqk]"}));
  }
  {
    Call c;
    c.d_o.dtype = TE_DTYPE_FLOAT16;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"d_o dtype must equal q dtype"}));
  }
  {
    Call c;  // dq's heads written over each other
    c.grad_strides.q[1] = 0;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"grad_strides.q must be positive"}));
  }
  {
    Call c;
    c.grad_strides.v[2] = 8;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"grad_strides.v", "overlap", "dv is written"}));
  }
  {
    Call c;
    c.dbias_ptr = &c.dbias;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"dbias must be NULL without a bias"}));
  }
  {
    Call c;  // a bias per batch entry: cuDNN reduces dbias to [1, h, sq, skv] only
    c.use_bias();
    c.bias.shape[0] = c.dbias.shape[0] = 2;
    c.dbias_ptr = &c.dbias;
    EXPECT_TRUE(is_error(c.bwd(), NIMP, "te_fused_attn_bwd", {"dbias for a bias of shape [1, h, sq, skv] only"}));
    c.dbias_ptr = nullptr;  // without its gradient the bias is fine
    EXPECT_TRUE(is_error(c.bwd(), NIMP, "te_fused_attn_bwd", {"CUDA tensors only"}));
  }
  {
    Call c;
    c.use_bias();
    c.dbias.shape[1] = 1;
    c.dbias_ptr = &c.dbias;
    EXPECT_TRUE(is_error(c.bwd(), INV, "te_fused_attn_bwd", {"dbias shape must equal bias shape"}));
  }
}

// ---- mask types and windows as cuDNN's band ----

struct BandCase {
  int32_t mask;
  int64_t left, right, sq, skv;
  SdpaBand want;
};

TEST(FusedAttnBand, MaskTypesAndWindows) {
  const BandCase cases[] = {
      // no band at all
      {TE_ATTN_MASK_NO_MASK, -1, -1, 8, 8, {false, 0, false, 0, false}},
      {TE_ATTN_MASK_PADDING, -1, -1, 4, 9, {false, 0, false, 0, false}},
      // top-left causal (also with padding, and sq != skv), right side 0 whatever is given
      {TE_ATTN_MASK_CAUSAL, -1, 0, 8, 8, {false, 0, true, 0, false}},
      {TE_ATTN_MASK_CAUSAL, -1, -1, 5, 9, {false, 0, true, 0, false}},
      {TE_ATTN_MASK_PADDING_CAUSAL, 3, 0, 8, 8, {true, 4, true, 0, false}},
      // bottom-right causal: top-left where equal (no padding, sq == skv)
      {TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, -1, 0, 8, 8, {false, 0, true, 0, false}},
      {TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 2, 0, 4, 8, {true, 3, true, 0, true}},
      {TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT, -1, 0, 8, 8, {false, 0, true, 0, true}},
      // sliding windows of the non-causal types align bottom-right too
      {TE_ATTN_MASK_NO_MASK, 2, 1, 8, 8, {true, 3, true, 1, false}},
      {TE_ATTN_MASK_NO_MASK, 0, -1, 4, 8, {true, 1, false, 0, true}},
      {TE_ATTN_MASK_PADDING, -1, 2, 8, 8, {false, 0, true, 2, true}},
  };
  for (const BandCase& c : cases) {
    const SdpaBand got = sdpa_band(c.mask, c.left, c.right, c.sq, c.skv);
    const std::string what = "mask " + std::to_string(c.mask) + " window (" + std::to_string(c.left) + ", " +
                             std::to_string(c.right) + ") sq " + std::to_string(c.sq) + " skv " + std::to_string(c.skv);
    EXPECT_EQ(got.has_left, c.want.has_left) << what;
    EXPECT_EQ(got.left_bound, c.want.left_bound) << what;
    EXPECT_EQ(got.has_right, c.want.has_right) << what;
    EXPECT_EQ(got.right_bound, c.want.right_bound) << what;
    EXPECT_EQ(got.bottom_right, c.want.bottom_right) << what;
  }
}

// The band's meaning, checked by brute force against the window definition of
// opente/fused_attn.h: cuDNN keeps (r, c) when c + left_bound > r + shift and
// c <= r + shift + right_bound (shift = skv - sq bottom-right, else 0).
TEST(FusedAttnBand, KeepsExactlyTheWindow) {
  const int32_t masks[] = {TE_ATTN_MASK_NO_MASK, TE_ATTN_MASK_CAUSAL, TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT};
  const int64_t sides[] = {-1, 0, 1, 3};
  const int64_t shapes[][2] = {{6, 6}, {4, 9}, {7, 7}};
  for (int32_t mask : masks)
    for (int64_t left : sides)
      for (int64_t right : sides)
        for (const auto& shape : shapes) {
          const bool causal = mask != TE_ATTN_MASK_NO_MASK;
          if (causal && right > 0) continue;
          const int64_t sq = shape[0], skv = shape[1];
          const SdpaBand band = sdpa_band(mask, left, right, sq, skv);
          const int64_t off = mask == TE_ATTN_MASK_CAUSAL ? 0 : skv - sq;
          const int64_t shift = band.bottom_right ? skv - sq : 0;
          const int64_t want_right = causal ? 0 : right;
          for (int64_t r = 0; r < sq; ++r)
            for (int64_t c = 0; c < skv; ++c) {
              const bool want = (left < 0 || c >= r + off - left) && (want_right < 0 || c <= r + off + want_right);
              const bool got = (!band.has_left || c + band.left_bound > r + shift) &&
                               (!band.has_right || c <= r + shift + band.right_bound);
              ASSERT_EQ(got, want) << "mask " << mask << " window (" << left << ", " << right << ") sq " << sq
                                   << " skv " << skv << " at (" << r << ", " << c << ")";
            }
        }
}

}  // namespace
