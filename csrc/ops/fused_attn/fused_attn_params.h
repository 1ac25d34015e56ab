// The validated description of one fused attention call (opente/fused_attn.h),
// shared by the C API (fused_attn.cpp, which fills it) and the cuDNN graphs
// (cudnn/sdpa_graphs.cpp, which keys its cache on it and runs it).
#pragma once

#include <stdint.h>

#include "opente/tensor.h"

namespace opente {

// A [b, h, s, d] operand: where it is and how it is laid out.
struct AttnOperand {
  void* data = nullptr;
  int64_t dims[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
};

// The mask of a call in cuDNN's terms: a diagonal band, each side optional.
// cuDNN keeps key c of query r when
//   c + left_bound > r + shift   (left side)   and   c <= r + shift + right_bound   (right side),
// shift 0 (top-left alignment) or skv - sq, per sequence kv_len - q_len with padding
// (bottom-right alignment). left_bound = window_left + 1 turns the first into
// c >= r + shift - window_left, the OpenTE (Transformer Engine) window.
struct SdpaBand {
  bool has_left = false;
  int64_t left_bound = 0;
  bool has_right = false;
  int64_t right_bound = 0;
  bool bottom_right = false;
};

// The band of a mask type and window (validated: mask_type a te_attn_mask_type,
// sides >= -1, causal types with window_right -1 or 0). Bottom-right alignment is
// dropped where it equals top-left (no padding and sq == skv): cuDNN takes more
// options (bias, dropout) with top-left alignment.
SdpaBand sdpa_band(int32_t mask_type, int64_t window_left, int64_t window_right, int64_t sq, int64_t skv);

bool mask_has_padding(int32_t mask_type);

struct SdpaParams {
  bool backward = false;
  int device = 0;
  te_dtype dtype = TE_DTYPE_BFLOAT16;  // q, k, v, o (and gradients, bias)
  int64_t b = 0, h = 0, hg = 0, sq = 0, skv = 0, head_dim_qk = 0, head_dim_v = 0;
  AttnOperand q, k, v, o;
  AttnOperand d_o, dq, dk, dv;  // backward only

  SdpaBand band;
  bool padding = false;
  const void* seqlens_q = nullptr;  // int32 [b]
  const void* seqlens_kv = nullptr;

  bool has_bias = false;
  int64_t bias_b = 0, bias_h = 0;  // bias [bias_b, bias_h, sq, skv], contiguous
  const void* bias = nullptr;
  void* dbias = nullptr;  // backward, optional: [1, h, sq, skv]
  bool has_dbias = false;

  float softmax_scale = 1.0f;
  float dropout = 0.0f;
  const int64_t* rng_state = nullptr;  // {seed, offset} on the device, when dropout > 0

  void* stats = nullptr;  // float32 [b, h, sq, 1]: written by the forward (optional), read by the backward
  bool has_stats = false;
  bool deterministic = false;
};

}  // namespace opente
