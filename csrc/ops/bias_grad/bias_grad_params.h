// Plain parameter struct of the bias-gradient casts, shared by the dispatcher,
// the CPU reference and the CUDA kernels. Shapes are already validated.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "opente/activation.h"
#include "opente/tensor.h"

namespace opente {

// The CUDA kernels sum each block of this many rows into one row of fp32
// partials in the workspace: [ceil(rows / 128), cols].
constexpr int64_t kDbiasRowBlock = 128;

inline size_t dbias_workspace_bytes(int64_t rows, int64_t cols) {
  return size_t((rows + kDbiasRowBlock - 1) / kDbiasRowBlock) * size_t(cols) * sizeof(float);
}

struct DbiasCastParams {
  bool has_activation;    // false: dx = grad (te_dbias_cast_transpose)
  te_activation kind;     // the activation, when has_activation
  const void* grad;       // [rows, H], in_dtype
  const void* act_input;  // [rows, H] or, gated, [rows, 2H], in_dtype; null without activation
  void* output;           // dx [rows, cols], out_dtype (cols = 2H gated, else H); may be null (FP8)
  void* output_t;         // [cols, rows], FP8 only; may be null
  const float* scale;     // [1], FP8 output only; else null
  float* scale_inv;       // [1], FP8 output only; may be null
  float* amax;            // [1], FP8 output only, raised to max|dx|; may be null
  void* dbias;            // [cols], dbias_dtype; may be null
  int64_t rows;
  int64_t hidden;         // H: grad's columns
  te_dtype in_dtype;      // float32, float16, bfloat16 (grad, act_input)
  te_dtype out_dtype;     // FP8, or (with an activation) float32, float16, bfloat16
  te_dtype dbias_dtype;   // in_dtype or float32
};

// te_dbias_cast_transpose_current_scaling: grad's amax (a fresh reduction into
// amax_out), the scale from it (into scale_out, which cast.scale points at, and its
// inverse into scale_inv), then the cast and dbias of te_dbias_cast_transpose with that
// scale. cast has no activation and null amax and scale_inv (the steps before write them).
struct DbiasCurrentScalingParams {
  DbiasCastParams cast;
  float* amax_out;
  float* scale_out;
  float* scale_inv;  // may be null
  float fp8_max;     // of cast.out_dtype
  float epsilon;
  bool force_pow_2_scales;
};

void dbias_cast_cpu(const DbiasCastParams& p);
void dbias_cast_current_scaling_cpu(const DbiasCurrentScalingParams& p);

#if OPENTE_WITH_CUDA
// `workspace`: dbias_workspace_bytes(rows, cols) bytes when dbias is set.
void dbias_cast_cuda(const DbiasCastParams& p, int device, void* workspace, void* stream);
// A small gradient (the one-block casts of quantize_small.cu) in one launch; others in
// the separate steps' kernels.
void dbias_cast_current_scaling_cuda(const DbiasCurrentScalingParams& p, int device, void* workspace, void* stream);
#endif

}  // namespace opente
