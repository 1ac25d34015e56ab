// Plain parameters of the rope family, shared by the dispatcher, the CPU
// reference and the CUDA kernels, and the position rule both follow (see
// opente/rope.h). Shapes are validated when these are built.
#pragma once

#include <stdint.h>

#include "opente/rope.h"
#include "opente/tensor.h"

#ifndef OPENTE_HOST_DEVICE
#ifdef __CUDACC__
#define OPENTE_HOST_DEVICE __host__ __device__
#else
#define OPENTE_HOST_DEVICE
#endif
#endif

namespace opente {

struct RopeParams {
  const void* input;               // strided: element (row dims, head k, feature f) at
                                   // row offset + k * stride_h + f * stride_d
  void* output;                    // contiguous [rows, h, d], the input's layout
  const float* freqs;              // [s2, d2]
  const int32_t* cu_seqlens;       // THD: [b + 1]; else null
  const int32_t* start_positions;  // [b] or null
  te_dtype dtype;                  // float32, float16, bfloat16
  te_rope_format format;
  bool interleaved;
  bool backward;  // the transposed rotation
  int64_t s;      // SBHD / BSHD: sequence length; THD: t, the tokens
  int64_t b;      // batch; THD: the number of sequences
  int64_t h, d, d2, s2;
  int64_t stride_s, stride_b;  // THD: stride_s is the token stride, stride_b unused
  int64_t stride_h, stride_d;
  int32_t cp_size, cp_rank;
};

// Output rows: one per (s, b) pair, or per THD token, in the output's order.
OPENTE_HOST_DEVICE inline int64_t rope_rows(const RopeParams& p) { return p.format == TE_ROPE_THD ? p.s : p.s * p.b; }

// The (sequence index j, batch / sequence number) of SBHD / BSHD output row `row`.
OPENTE_HOST_DEVICE inline void rope_sb_of_row(const RopeParams& p, int64_t row, int64_t* j, int64_t* batch) {
  if (p.format == TE_ROPE_SBHD) {
    *j = row / p.b;
    *batch = row % p.b;
  } else {
    *j = row % p.s;
    *batch = row / p.s;
  }
}

// Position of token j of a sequence of (local) length n: j + start without
// context parallelism, else the two-chunk split of opente/rope.h.
OPENTE_HOST_DEVICE inline int64_t rope_position(int64_t j, int64_t n, int64_t start, int32_t cp_size, int32_t cp_rank) {
  if (cp_size <= 1) return j + start;
  const int64_t half = n / 2;
  if (j < half) return j + int64_t(cp_rank) * half;
  return int64_t(cp_size) * n - (int64_t(cp_rank) + 1) * half + (j - half);
}

void rope_cpu(const RopeParams& p);

#if OPENTE_WITH_CUDA
void rope_cuda(const RopeParams& p, int device, void* stream);
#endif

}  // namespace opente
