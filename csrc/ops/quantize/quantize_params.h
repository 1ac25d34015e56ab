// Plain parameter structs of the quantize family (cast, cast+transpose,
// dequantize, amax), shared by the dispatcher, the CPU reference and the
// CUDA kernels. Shapes are already validated when these are built.
#pragma once

#include <stdint.h>

#include "common/dtype.h"
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

// One cast of te_quantize (scale_out null: cast.scale is read, cast.amax raised)
// or of te_quantize_current_scaling (scale_out set: max|input| goes to amax_out and
// the scale computed from it to scale_out, which cast.scale then points at; cast.amax
// is null), as te_multi_quantize* take them. A job whose cast.out_dtype is a float
// dtype is a plain conversion (is_conversion): cast.output = the input rounded to
// that dtype, and no scale, amax or transposed copy.
struct QuantizeJob {
  QuantizeParams cast;
  float* amax_out;   // current scaling only
  float* scale_out;  // current scaling only; null for a given scale
  float fp8_max;     // current scaling: of cast.out_dtype
  float epsilon;
  bool force_pow_2_scales;
  // [cols] in dbias_dtype (cast.in_dtype or float32): the input's column sums (a bias
  // gradient), or null. Only the one-block kernel takes it
  // (te_dbias_cast_transpose_current_scaling's small case).
  void* dbias = nullptr;
  te_dtype dbias_dtype = TE_DTYPE_FLOAT32;
};

inline bool is_conversion(const QuantizeJob& job) { return !is_fp8(job.cast.out_dtype); }

// The three steps of a current-scaling job, as the separate ops run them.
inline CurrentScalingQuantizeParams current_scaling_steps(const QuantizeJob& job) {
  const QuantizeParams& c = job.cast;
  const AmaxParams amax{c.input, job.amax_out, c.rows * c.cols, c.in_dtype};
  // The scale step writes scale_inv (also for an empty input, which the cast skips);
  // the cast neither re-reduces amax nor rewrites scale_inv.
  const CurrentScalingParams scaling{job.amax_out, job.scale_out, c.scale_inv, job.fp8_max, job.epsilon,
                                     job.force_pow_2_scales};
  QuantizeParams cast = c;
  cast.amax = nullptr;
  cast.scale_inv = nullptr;
  return CurrentScalingQuantizeParams{amax, scaling, cast};
}

void quantize_cpu(const QuantizeParams& p);
// A conversion job's work: p.output = p.input rounded to p.out_dtype (a float dtype).
void convert_cpu(const QuantizeParams& p);
void dequantize_cpu(const DequantizeParams& p);
void amax_cpu(const AmaxParams& p);
void quantize_current_scaling_cpu(const CurrentScalingQuantizeParams& p);
// Current scaling's first two steps: amax (a fresh reduction), then the scale from it.
// Shared by every op that casts with a scale of its input (te_quantize_current_scaling,
// te_dbias_cast_transpose_current_scaling).
void current_scale_from_input_cpu(const AmaxParams& amax, const CurrentScalingParams& scaling);

#if OPENTE_WITH_CUDA
void quantize_cuda(const QuantizeParams& p, int device, void* stream);
void convert_cuda(const QuantizeParams& p, int device, void* stream);
void dequantize_cuda(const DequantizeParams& p, int device, void* stream);
void amax_cuda(const AmaxParams& p, int device, void* stream);
void quantize_current_scaling_cuda(const QuantizeJob& job, int device, void* stream);
void current_scale_from_input_cuda(const AmaxParams& amax, const CurrentScalingParams& scaling, int device,
                                   void* stream);
// Jobs one after another; the small ones (small_job_fits) share a launch, whatever
// their dtypes (quantize_small.cu).
void multi_quantize_cuda(const QuantizeJob* jobs, int64_t count, int device, void* stream);
// Whether one block casts this tensor (quantize_small.cu): at most
// kSmallQuantizeElements elements, both dimensions multiples of 8, 16-byte aligned
// input and 8-byte aligned outputs.
bool small_quantize_fits(const QuantizeParams& p);
// small_quantize_fits for a cast; a conversion: at most kSmallQuantizeElements
// elements, a multiple of 8, input and output 16-byte aligned.
bool small_job_fits(const QuantizeJob& job);
// Jobs that all fit, a block each, one launch (several past kJobsPerLaunch).
void quantize_small_cuda(const QuantizeJob* jobs, int count, int device, void* stream);
#endif

}  // namespace opente
