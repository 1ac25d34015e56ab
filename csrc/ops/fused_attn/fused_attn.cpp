// C API of the fused attention family: validate the descriptors into SdpaParams
// (on any build, so the checks run and are tested on the CPU), then hand CUDA
// calls to the cuDNN graphs of a build with cuDNN.
#include "opente/fused_attn.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/fused_attn/fused_attn_params.h"
#if OPENTE_WITH_CUDNN
#include "ops/fused_attn/cudnn/cudnn_library.h"
#include "ops/fused_attn/cudnn/sdpa_graphs.h"
#endif

namespace opente {

bool mask_has_padding(int32_t mask_type) {
  return mask_type == TE_ATTN_MASK_PADDING || mask_type == TE_ATTN_MASK_PADDING_CAUSAL ||
         mask_type == TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

SdpaBand sdpa_band(int32_t mask_type, int64_t window_left, int64_t window_right, int64_t sq, int64_t skv) {
  const bool top_left_causal = mask_type == TE_ATTN_MASK_CAUSAL || mask_type == TE_ATTN_MASK_PADDING_CAUSAL;
  const bool bottom_right_causal =
      mask_type == TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT || mask_type == TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  const int64_t right = top_left_causal || bottom_right_causal ? 0 : window_right;
  SdpaBand band;
  band.has_left = window_left >= 0;
  band.left_bound = band.has_left ? window_left + 1 : 0;
  band.has_right = right >= 0;
  band.right_bound = band.has_right ? right : 0;
  // Every type but CAUSAL / PADDING_CAUSAL aligns its band bottom-right (masks.py).
  const bool any_side = band.has_left || band.has_right;
  const bool equal_alignments = !mask_has_padding(mask_type) && sq == skv;
  band.bottom_right = any_side && !top_left_causal && !equal_alignments;
  return band;
}

}  // namespace opente

using namespace opente;

namespace {

constexpr const char* kHalfDtypes = "float16 or bfloat16";
constexpr const char* kDims[4] = {"b", "h", "s", "d"};
constexpr int64_t kVectorBytes = 16;  // cuDNN's SDPA kernels load Q, K, V, O in 16-byte vectors

std::string dims_string(const int64_t* dims) {
  return concat("[", dims[0], ", ", dims[1], ", ", dims[2], ", ", dims[3], "]");
}

void check_config(const te_fused_attn_config* config) {
  OPENTE_CHECK_ARG(config != nullptr, "config must not be null");
  const te_fused_attn_config& c = *config;
  OPENTE_CHECK_ARG(c.mask_type >= TE_ATTN_MASK_NO_MASK && c.mask_type <= TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT,
                   "config.mask_type must be a te_attn_mask_type (0 .. 5), got ", c.mask_type);
  OPENTE_CHECK_ARG(c.bias_type >= TE_ATTN_BIAS_NONE && c.bias_type <= TE_ATTN_BIAS_ALIBI,
                   "config.bias_type must be a te_attn_bias_type (0 .. 3), got ", c.bias_type);
  if (c.bias_type == TE_ATTN_BIAS_PRE_SCALE || c.bias_type == TE_ATTN_BIAS_ALIBI) {
    fail(TE_ERROR_NOT_IMPLEMENTED,
         concat("config.bias_type ", c.bias_type == TE_ATTN_BIAS_PRE_SCALE ? "PRE_SCALE" : "ALIBI",
                " is not implemented by the cuDNN fused attention (NONE or POST_SCALE only)"));
  }
  OPENTE_CHECK_ARG(c.window_left >= -1 && c.window_right >= -1,
                   "config window sides must be -1 (unlimited) or >= 0, got (", c.window_left, ", ", c.window_right,
                   ")");
  const bool causal = c.mask_type != TE_ATTN_MASK_NO_MASK && c.mask_type != TE_ATTN_MASK_PADDING;
  OPENTE_CHECK_ARG(!causal || c.window_right <= 0, "config.window_right must be -1 or 0 for a causal mask type, got ",
                   c.window_right);
  OPENTE_CHECK_ARG(std::isfinite(c.softmax_scale), "config.softmax_scale must be finite, got ",
                   double(c.softmax_scale));
  OPENTE_CHECK_ARG(std::isfinite(c.dropout) && c.dropout >= 0.0f && c.dropout < 1.0f,
                   "config.dropout must be in [0, 1), got ", double(c.dropout));
}

// A stride of a dim of extent 1 is never used to address anything; it becomes the
// largest extent of the others, so equal layouts get one graph cache key and the
// value is as aligned as the other strides.
void normalize_unit_strides(AttnOperand& op) {
  int64_t span = 1;
  for (int i = 0; i < 4; ++i)
    if (op.dims[i] > 1) span = std::max(span, op.dims[i] * op.strides[i]);
  for (int i = 0; i < 4; ++i)
    if (op.dims[i] == 1) op.strides[i] = span;
}

// An output view must not write one element twice: sorted by stride, each dim of
// extent > 1 must step past everything the smaller strides span.
bool strides_overlap(const AttnOperand& op) {
  int order[4] = {0, 1, 2, 3};
  std::sort(order, order + 4, [&](int a, int b) { return op.strides[a] < op.strides[b]; });
  int64_t span = 1;  // elements covered by the dims seen so far
  for (int i : order) {
    if (op.dims[i] == 1) continue;
    if (op.strides[i] < span) return true;
    span = op.strides[i] * op.dims[i];
  }
  return false;
}

// One [b, h, s, d] operand: 4-D with the expected shape (an entry < 0 takes any
// extent), q's dtype and device, and strides cuDNN can read.
AttnOperand checked_operand(const te_tensor* desc, const char* arg, const int64_t* strides, const char* strides_arg,
                            const te_tensor* like, const int64_t* expected, const char* expected_what, bool output,
                            bool need_data) {
  const te_tensor& t = checked_tensor(desc, arg);
  OPENTE_CHECK_ARG(t.ndim == 4, arg, " must be 4-D in the logical order [b, h, s, d] (strides give the layout), got ",
                   shape_string(t));
  if (like) {
    OPENTE_CHECK_ARG(t.dtype == like->dtype, arg, " dtype must equal q dtype ", dtype_name(like->dtype), ", got ",
                     dtype_name(t.dtype));
    check_same_device(like->device, "q", t.device, arg);
  } else {
    check_dtype(t, arg, t.dtype == TE_DTYPE_FLOAT16 || t.dtype == TE_DTYPE_BFLOAT16, kHalfDtypes);
  }
  bool shape_ok = true;
  for (int i = 0; i < 4; ++i) shape_ok = shape_ok && (expected[i] < 0 || t.shape[i] == expected[i]);
  OPENTE_CHECK_ARG(shape_ok, arg, " shape must be ", expected_what, " = ", dims_string(expected), ", got ",
                   shape_string(t));

  AttnOperand op;
  op.data = t.data;
  for (int i = 0; i < 4; ++i) {
    op.dims[i] = t.shape[i];
    op.strides[i] = strides[i];
  }
  OPENTE_CHECK_ARG(op.strides[3] == 1 || op.dims[3] == 1, strides_arg, " of the head dim d must be 1, got ",
                   dims_string(op.strides));
  for (int i = 0; i < 3; ++i) {
    OPENTE_CHECK_ARG(op.strides[i] >= 1 || op.dims[i] <= 1, strides_arg, " must be positive, got ",
                     dims_string(op.strides), " (", kDims[i], " stride)");
  }
  op.strides[3] = 1;
  normalize_unit_strides(op);
  if (output) {
    OPENTE_CHECK_ARG(!strides_overlap(op), strides_arg, " ", dims_string(op.strides), " for shape ",
                     dims_string(op.dims), " overlap: ", arg, " is written and must not alias itself");
  }
  const int64_t elem = int64_t(dtype_size(te_dtype(t.dtype)));
  for (int i = 0; i < 3; ++i) {
    if (op.dims[i] > 1 && (op.strides[i] * elem) % kVectorBytes != 0) {
      fail(TE_ERROR_NOT_IMPLEMENTED,
           concat(strides_arg, " ", dims_string(op.strides), ": the ", kDims[i], " stride is ", op.strides[i] * elem,
                  " bytes; cuDNN reads ", arg, " in ", kVectorBytes, "-byte vectors, so every stride but d's must be ",
                  "a multiple of ", kVectorBytes, " bytes"));
    }
  }
  if (op.data && reinterpret_cast<uintptr_t>(op.data) % kVectorBytes != 0) {
    fail(TE_ERROR_NOT_IMPLEMENTED,
         concat(arg, ".data must be ", kVectorBytes, "-byte aligned for cuDNN (a view at an odd offset?)"));
  }
  if (need_data) check_pointer(op.data, arg, "data");
  return op;
}

// A small int tensor on q's device with exactly `count` elements in one dim.
const void* checked_vector(const te_tensor* desc, const char* arg, te_dtype dtype, int64_t count, const te_tensor& q,
                           bool need_data) {
  const te_tensor& t = checked_tensor(desc, arg);
  check_dtype(t, arg, t.dtype == dtype, dtype_name(dtype));
  check_same_device(q.device, "q", t.device, arg);
  OPENTE_CHECK_ARG(t.ndim == 1 && t.shape[0] == count, arg, " must have shape [", count, "], got ", shape_string(t));
  if (need_data) check_pointer(t.data, arg, "data");
  return t.data;
}

void check_absent(const te_tensor* desc, const char* arg, const char* why) {
  OPENTE_CHECK_ARG(desc == nullptr, arg, " must be NULL ", why);
}

// The checks the forward and backward share: config, q / k / v / o, bias,
// sequence lengths, rng state and stats. Fills everything of p but the gradients.
void fill_common(SdpaParams& p, const te_fused_attn_config* config, const te_tensor* q_desc, const te_tensor* k_desc,
                 const te_tensor* v_desc, const te_tensor* o_desc, const te_tensor* bias_desc,
                 const te_tensor* seqlens_q_desc, const te_tensor* seqlens_kv_desc, const te_tensor* rng_desc,
                 const te_tensor* stats_desc, const te_attn_strides* strides, bool need_data) {
  check_config(config);
  OPENTE_CHECK_ARG(strides != nullptr, "strides must not be null");
  const int64_t any4[4] = {-1, -1, -1, -1};
  const te_tensor& q = checked_tensor(q_desc, "q");
  p.q = checked_operand(q_desc, "q", strides->q, "strides.q", nullptr, any4, "[b, h, sq, dqk]", false, need_data);
  p.b = p.q.dims[0];
  p.h = p.q.dims[1];
  p.sq = p.q.dims[2];
  p.head_dim_qk = p.q.dims[3];
  const int64_t k_shape[4] = {p.b, -1, -1, p.head_dim_qk};
  p.k = checked_operand(k_desc, "k", strides->k, "strides.k", &q, k_shape, "[b, hg, skv, dqk]", false, need_data);
  p.hg = p.k.dims[1];
  p.skv = p.k.dims[2];
  const int64_t v_shape[4] = {p.b, p.hg, p.skv, -1};
  p.v = checked_operand(v_desc, "v", strides->v, "strides.v", &q, v_shape, "[b, hg, skv, dv]", false, need_data);
  p.head_dim_v = p.v.dims[3];
  const int64_t o_shape[4] = {p.b, p.h, p.sq, p.head_dim_v};
  p.o = checked_operand(o_desc, "o", strides->o, "strides.o", &q, o_shape, "[b, h, sq, dv]", !p.backward, need_data);
  p.dtype = te_dtype(q.dtype);
  p.device = q.device.index;

  OPENTE_CHECK_ARG(p.hg >= 1 && p.h % p.hg == 0, "q heads h=", p.h, " must be a multiple of k / v heads hg=", p.hg);
  if (p.b == 0 || p.h == 0 || p.sq == 0 || p.skv == 0 || p.head_dim_qk == 0 || p.head_dim_v == 0) {
    fail(TE_ERROR_NOT_IMPLEMENTED,
         concat("cuDNN attention takes no empty dims: q ", dims_string(p.q.dims), ", v ", dims_string(p.v.dims)));
  }
  if (p.head_dim_qk % 8 != 0 || p.head_dim_v % 8 != 0 || p.head_dim_qk > 256 || p.head_dim_v > 256) {
    fail(TE_ERROR_NOT_IMPLEMENTED, concat("cuDNN attention needs head dims that are multiples of 8 and at most 256, ",
                                          "got dqk=", p.head_dim_qk, ", dv=", p.head_dim_v));
  }

  p.softmax_scale = config->softmax_scale;
  p.dropout = config->dropout;
  p.padding = mask_has_padding(config->mask_type);
  p.band = sdpa_band(config->mask_type, config->window_left, config->window_right, p.sq, p.skv);
  p.deterministic = config->deterministic != 0;

  p.has_bias = config->bias_type == TE_ATTN_BIAS_POST_SCALE;
  if (p.has_bias) {
    const te_tensor& bias = checked_tensor(bias_desc, "bias");
    OPENTE_CHECK_ARG(bias.dtype == q.dtype, "bias dtype must equal q dtype ", dtype_name(q.dtype), ", got ",
                     dtype_name(bias.dtype));
    check_same_device(q.device, "q", bias.device, "bias");
    OPENTE_CHECK_ARG(bias.ndim == 4 && (bias.shape[0] == 1 || bias.shape[0] == p.b) &&
                         (bias.shape[1] == 1 || bias.shape[1] == p.h) && bias.shape[2] == p.sq &&
                         bias.shape[3] == p.skv,
                     "bias must have shape [1 or b, 1 or h, sq, skv] = [1 or ", p.b, ", 1 or ", p.h, ", ", p.sq, ", ",
                     p.skv, "], got ", shape_string(bias));
    if (need_data) check_pointer(bias.data, "bias", "data");
    p.bias_b = bias.shape[0];
    p.bias_h = bias.shape[1];
    p.bias = bias.data;
  } else {
    check_absent(bias_desc, "bias", "without config.bias_type POST_SCALE");
  }

  if (p.padding) {
    p.seqlens_q = checked_vector(seqlens_q_desc, "seqlens_q", TE_DTYPE_INT32, p.b, q, need_data);
    p.seqlens_kv = checked_vector(seqlens_kv_desc, "seqlens_kv", TE_DTYPE_INT32, p.b, q, need_data);
  } else {
    check_absent(seqlens_q_desc, "seqlens_q", "for a mask type without padding");
    check_absent(seqlens_kv_desc, "seqlens_kv", "for a mask type without padding");
  }
  if (p.dropout > 0.0f) {
    p.rng_state = static_cast<const int64_t*>(checked_vector(rng_desc, "rng_state", TE_DTYPE_INT64, 2, q, need_data));
  } else {
    check_absent(rng_desc, "rng_state", "without dropout");
  }

  if (stats_desc != nullptr) {
    const te_tensor& stats = checked_tensor(stats_desc, "stats");
    check_dtype(stats, "stats", stats.dtype == TE_DTYPE_FLOAT32, "float32");
    check_same_device(q.device, "q", stats.device, "stats");
    OPENTE_CHECK_ARG(stats.ndim == 4 && stats.shape[0] == p.b && stats.shape[1] == p.h && stats.shape[2] == p.sq &&
                         stats.shape[3] == 1,
                     "stats must have shape [b, h, sq, 1] = [", p.b, ", ", p.h, ", ", p.sq, ", 1], got ",
                     shape_string(stats));
    if (need_data) check_pointer(stats.data, "stats", "data");
    p.stats = stats.data;
    p.has_stats = true;
  } else {
    OPENTE_CHECK_ARG(!p.backward, "stats must not be null in the backward (the forward's softmax statistics)");
  }
}

SdpaParams fwd_params(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k, const te_tensor* v,
                      const te_tensor* bias, const te_tensor* seqlens_q, const te_tensor* seqlens_kv,
                      const te_tensor* rng_state, const te_tensor* o, const te_tensor* stats,
                      const te_attn_strides* strides, bool need_data) {
  SdpaParams p;
  p.backward = false;
  fill_common(p, config, q, k, v, o, bias, seqlens_q, seqlens_kv, rng_state, stats, strides, need_data);
  return p;
}

SdpaParams bwd_params(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k, const te_tensor* v,
                      const te_tensor* o, const te_tensor* d_o, const te_tensor* stats, const te_tensor* bias,
                      const te_tensor* seqlens_q, const te_tensor* seqlens_kv, const te_tensor* rng_state,
                      const te_tensor* dq, const te_tensor* dk, const te_tensor* dv, const te_tensor* dbias,
                      const te_attn_strides* strides, const te_attn_strides* grad_strides, bool need_data) {
  SdpaParams p;
  p.backward = true;
  fill_common(p, config, q, k, v, o, bias, seqlens_q, seqlens_kv, rng_state, stats, strides, need_data);
  OPENTE_CHECK_ARG(grad_strides != nullptr, "grad_strides must not be null");
  const te_tensor& q_t = *q;
  p.d_o = checked_operand(d_o, "d_o", grad_strides->o, "grad_strides.o", &q_t, p.o.dims, "o's [b, h, sq, dv]", false,
                          need_data);
  p.dq = checked_operand(dq, "dq", grad_strides->q, "grad_strides.q", &q_t, p.q.dims, "q's [b, h, sq, dqk]", true,
                         need_data);
  p.dk = checked_operand(dk, "dk", grad_strides->k, "grad_strides.k", &q_t, p.k.dims, "k's [b, hg, skv, dqk]", true,
                         need_data);
  p.dv = checked_operand(dv, "dv", grad_strides->v, "grad_strides.v", &q_t, p.v.dims, "v's [b, hg, skv, dv]", true,
                         need_data);
  if (dbias != nullptr) {
    OPENTE_CHECK_ARG(p.has_bias, "dbias must be NULL without a bias (config.bias_type POST_SCALE)");
    const te_tensor& t = checked_tensor(dbias, "dbias");
    OPENTE_CHECK_ARG(t.dtype == q_t.dtype, "dbias dtype must equal q dtype ", dtype_name(q_t.dtype), ", got ",
                     dtype_name(t.dtype));
    check_same_device(q_t.device, "q", t.device, "dbias");
    OPENTE_CHECK_ARG(
        t.ndim == 4 && t.shape[0] == p.bias_b && t.shape[1] == p.bias_h && t.shape[2] == p.sq && t.shape[3] == p.skv,
        "dbias shape must equal bias shape [", p.bias_b, ", ", p.bias_h, ", ", p.sq, ", ", p.skv, "], got ",
        shape_string(t));
    if (p.bias_b != 1 || p.bias_h != p.h) {
      fail(TE_ERROR_NOT_IMPLEMENTED, concat("cuDNN computes dbias for a bias of shape [1, h, sq, skv] only, got [",
                                            p.bias_b, ", ", p.bias_h, ", ", p.sq, ", ", p.skv, "]"));
    }
    if (need_data) check_pointer(t.data, "dbias", "data");
    p.dbias = t.data;
    p.has_dbias = true;
  }
  return p;
}

// Where a validated call goes: CUDA tensors to cuDNN, anything else is refused.
void require_cudnn_device(const te_tensor* q) {
  if (q->device.type != TE_DEVICE_CUDA) {
    fail(TE_ERROR_NOT_IMPLEMENTED,
         "runs on CUDA tensors only (cuDNN); q is on the cpu, where the unfused attention serves");
  }
#if !OPENTE_WITH_CUDNN
  fail(TE_ERROR_NOT_IMPLEMENTED,
       "this build of OpenTE has no cuDNN fused attention (it was configured without CUDA, with OPENTE_CUDNN=OFF, or "
       "without the cudnn-frontend headers: see tools/fetch_cudnn_frontend.sh)");
#endif
}

size_t workspace_of(const SdpaParams& p) {
#if OPENTE_WITH_CUDNN
  return sdpa_workspace_size(p);
#else
  (void)p;
  return 0;
#endif
}

void run(const SdpaParams& p, void* workspace, size_t workspace_size, void* stream) {
#if OPENTE_WITH_CUDNN
  sdpa_run(p, workspace, workspace_size, stream);
#else
  (void)p, (void)workspace, (void)workspace_size, (void)stream;
#endif
}

}  // namespace

extern "C" int64_t te_cudnn_frontend_version(void) {
#if OPENTE_WITH_CUDNN
  return cudnn_frontend_compiled_version();
#else
  return 0;
#endif
}

extern "C" te_status te_cudnn_version(int64_t* version) {
  return run_op("te_cudnn_version", [&] {
    OPENTE_CHECK_ARG(version != nullptr, "version must not be null");
#if OPENTE_WITH_CUDNN
    *version = cudnn_runtime_version();
#else
    fail(TE_ERROR_NOT_IMPLEMENTED,
         "this build of OpenTE has no cuDNN fused attention (configured without CUDA, with OPENTE_CUDNN=OFF, or "
         "without the cudnn-frontend headers)");
#endif
  });
}

extern "C" te_status te_fused_attn_fwd_workspace_size(const te_fused_attn_config* config, const te_tensor* q,
                                                      const te_tensor* k, const te_tensor* v, const te_tensor* bias,
                                                      const te_tensor* seqlens_q, const te_tensor* seqlens_kv,
                                                      const te_tensor* rng_state, const te_tensor* o,
                                                      const te_tensor* stats, const te_attn_strides* strides,
                                                      size_t* workspace_size) {
  return run_op("te_fused_attn_fwd_workspace_size", [&] {
    OPENTE_CHECK_ARG(workspace_size != nullptr, "workspace_size must not be null");
    const SdpaParams p = fwd_params(config, q, k, v, bias, seqlens_q, seqlens_kv, rng_state, o, stats, strides, false);
    require_cudnn_device(q);
    *workspace_size = workspace_of(p);
  });
}

extern "C" te_status te_fused_attn_fwd(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k,
                                       const te_tensor* v, const te_tensor* bias, const te_tensor* seqlens_q,
                                       const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor* o,
                                       const te_tensor* stats, const te_attn_strides* strides, void* workspace,
                                       size_t workspace_size, void* stream) {
  return run_op("te_fused_attn_fwd", [&] {
    const SdpaParams p = fwd_params(config, q, k, v, bias, seqlens_q, seqlens_kv, rng_state, o, stats, strides, true);
    require_cudnn_device(q);
    run(p, workspace, workspace_size, stream);
  });
}

extern "C" te_status te_fused_attn_bwd_workspace_size(const te_fused_attn_config* config, const te_tensor* q,
                                                      const te_tensor* k, const te_tensor* v, const te_tensor* o,
                                                      const te_tensor* d_o, const te_tensor* stats,
                                                      const te_tensor* bias, const te_tensor* seqlens_q,
                                                      const te_tensor* seqlens_kv, const te_tensor* rng_state,
                                                      const te_tensor* dq, const te_tensor* dk, const te_tensor* dv,
                                                      const te_tensor* dbias, const te_attn_strides* strides,
                                                      const te_attn_strides* grad_strides, size_t* workspace_size) {
  return run_op("te_fused_attn_bwd_workspace_size", [&] {
    OPENTE_CHECK_ARG(workspace_size != nullptr, "workspace_size must not be null");
    const SdpaParams p = bwd_params(config, q, k, v, o, d_o, stats, bias, seqlens_q, seqlens_kv, rng_state, dq, dk, dv,
                                    dbias, strides, grad_strides, false);
    require_cudnn_device(q);
    *workspace_size = workspace_of(p);
  });
}

extern "C" te_status te_fused_attn_bwd(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k,
                                       const te_tensor* v, const te_tensor* o, const te_tensor* d_o,
                                       const te_tensor* stats, const te_tensor* bias, const te_tensor* seqlens_q,
                                       const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor* dq,
                                       const te_tensor* dk, const te_tensor* dv, const te_tensor* dbias,
                                       const te_attn_strides* strides, const te_attn_strides* grad_strides,
                                       void* workspace, size_t workspace_size, void* stream) {
  return run_op("te_fused_attn_bwd", [&] {
    const SdpaParams p = bwd_params(config, q, k, v, o, d_o, stats, bias, seqlens_q, seqlens_kv, rng_state, dq, dk, dv,
                                    dbias, strides, grad_strides, true);
    require_cudnn_device(q);
    run(p, workspace, workspace_size, stream);
  });
}
