// Plain parameter structs of the quantize family (cast, cast+transpose,
// dequantize, amax), shared by the dispatcher, the CPU reference and the
// CUDA kernels. Shapes are already validated when these are built.
#pragma once

#include <stdint.h>

#include "opente/tensor.h"
#include "ops/recipe/recipe_params.h"

namespace opente {

struct QuantizeParams {
  const void* input;     // [rows, cols], in_dtype
  void* output;          // [rows, cols], out_dtype; may be null
  void* output_t;        // [cols, rows], out_dtype; may be null
  const float* scale;    // [1]
  float* scale_inv;      // [1]; may be null
  float* amax;           // [1], updated as max(amax, max|input|); may be null
  int64_t rows;
  int64_t cols;
  te_dtype in_dtype;     // float32, float16, bfloat16
  te_dtype out_dtype;    // float8_e4m3, float8_e5m2
};

struct DequantizeParams {
  const void* input;       // [numel], in_dtype (FP8)
  void* output;            // [numel], out_dtype
  const float* scale_inv;  // [1]
  int64_t numel;
  te_dtype in_dtype;
  te_dtype out_dtype;
};

struct AmaxParams {
  const void* input;  // [numel], dtype
  float* amax;        // [1]
  int64_t numel;
  te_dtype dtype;
};

// te_quantize_current_scaling: amax (a fresh reduction into amax.amax), then the
// scale from it, then the cast with that scale, in this order on one stream.
struct CurrentScalingQuantizeParams {
  AmaxParams amax;
  CurrentScalingParams scaling;  // reads amax.amax, writes the scale the cast reads
  QuantizeParams cast;
};

void quantize_cpu(const QuantizeParams& p);
void dequantize_cpu(const DequantizeParams& p);
void amax_cpu(const AmaxParams& p);
void quantize_current_scaling_cpu(const CurrentScalingQuantizeParams& p);

#if OPENTE_WITH_CUDA
void quantize_cuda(const QuantizeParams& p, int device, void* stream);
void dequantize_cuda(const DequantizeParams& p, int device, void* stream);
void amax_cuda(const AmaxParams& p, int device, void* stream);
void quantize_current_scaling_cuda(const CurrentScalingQuantizeParams& p, int device, void* stream);
#endif

}  // namespace opente
