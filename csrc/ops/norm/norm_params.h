// Plain parameter structs of the norm family (LayerNorm and RMSNorm, forward
// and backward), shared by the dispatcher, the CPU reference and the CUDA
// kernels. Shapes are already validated when these are built.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <algorithm>

#include "opente/tensor.h"

namespace opente {

enum class NormType { kLayerNorm, kRMSNorm };

// The CUDA backward runs at most this many blocks, each writing a row of fp32
// partial sums of dgamma and dbeta (te_norm_workspace_size documents the bound): one
// wave of three blocks an SM on GPUs of up to 170 SMs. The pipelined kernel
// (norm_bwd_pipelined.cu) fits four an SM for bf16 rmsnorm at hidden 4097-4608 (54
// registers, blocks of 288 threads), where the cap binds on 132 SMs (528 would fit);
// norm_bwd_grid then runs 396, three on every SM, which is faster than four.
constexpr int64_t kNormMaxRowBlocks = 512;

inline int64_t norm_row_blocks(int64_t rows) { return std::min(rows, kNormMaxRowBlocks); }

// te_norm_workspace_size for CUDA: [row_blocks, 2, hidden] floats. Saturates
// instead of wrapping for a hidden size no buffer could hold.
inline size_t norm_workspace_bytes(int64_t rows, int64_t hidden) {
  if (rows <= 0 || hidden <= 0) return 0;
  const size_t per_column = size_t(norm_row_blocks(rows)) * 2 * sizeof(float);
  if (uint64_t(hidden) > SIZE_MAX / per_column) return SIZE_MAX;
  return per_column * size_t(hidden);
}

struct NormFwdParams {
  NormType type;
  const void* input;     // [rows, hidden], in_dtype
  const void* gamma;     // [hidden], w_dtype
  const void* beta;      // [hidden], w_dtype; null for RMSNorm
  void* output;          // [rows, hidden], out_dtype; may be null when out_dtype is FP8
  void* output_t;        // [hidden, rows], out_dtype (FP8 only); may be null
  const float* scale;    // [1], FP8 output only; else null
  float* scale_inv;      // [1], FP8 output only, receives 1/scale; may be null
  float* amax;           // [1], FP8 output only, updated as max(amax, max|y|); may be null
  float* mu;             // [rows]; null for RMSNorm
  float* rsigma;         // [rows]
  int64_t rows;
  int64_t hidden;        // >= 1
  float eps;
  bool zero_centered_gamma;
  te_dtype in_dtype;     // float32, float16, bfloat16
  te_dtype w_dtype;      // float32, float16, bfloat16 (gamma and beta)
  te_dtype out_dtype;    // float32, float16, bfloat16, float8_e4m3, float8_e5m2
};

struct NormBwdParams {
  NormType type;
  const void* dz;        // [rows, hidden], in_dtype
  const void* x;         // [rows, hidden], in_dtype
  const float* mu;       // [rows]; null for RMSNorm
  const float* rsigma;   // [rows]
  const void* gamma;     // [hidden], w_dtype
  void* dx;              // [rows, hidden], in_dtype
  void* dgamma;          // [hidden], w_dtype
  void* dbeta;           // [hidden], w_dtype; null for RMSNorm
  int64_t rows;
  int64_t hidden;        // >= 1
  bool zero_centered_gamma;
  te_dtype in_dtype;     // float32, float16, bfloat16 (dz, x, dx)
  te_dtype w_dtype;      // float32, float16, bfloat16 (gamma, dgamma, dbeta)
};

void norm_fwd_cpu(const NormFwdParams& p);
void norm_bwd_cpu(const NormBwdParams& p);

#if OPENTE_WITH_CUDA
void norm_fwd_cuda(const NormFwdParams& p, int device, void* workspace, size_t workspace_size, void* stream);
void norm_bwd_cuda(const NormBwdParams& p, int device, void* workspace, size_t workspace_size, void* stream);
#endif

}  // namespace opente
