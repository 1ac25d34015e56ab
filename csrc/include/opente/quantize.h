/* FP8 quantization: cast (optionally with transpose), dequantize, amax.
 *
 * The FP8 cast computes q = fp8(x * scale): round to nearest even, saturate to
 * the largest finite value (448 for E4M3, 57344 for E5M2, infinities included),
 * NaN stays NaN (the canonical code 0x7f, whatever the input NaN's sign),
 * subnormals exact. The CPU and CUDA implementations agree bit
 * for bit. A tensor of shape [d0, ..., dn-1] is handled as the matrix
 * [d0*...*dn-2, dn-1]; a 1-D tensor is one row. */
#ifndef OPENTE_QUANTIZE_H_
#define OPENTE_QUANTIZE_H_

#include <stddef.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Quantize `input` (float32, float16 or bfloat16, not quantized) into `output`.
 *
 * output: dtype float8_e4m3 or float8_e5m2, scaling_mode TE_SCALING_PER_TENSOR,
 *   the shape of the input, `scale` required. At least one of `data` (row-wise
 *   result) and `columnwise_data` (its transpose, written in the same pass) must
 *   be set. `scale_inv`, if set, receives 1/scale. `amax`, if set, is updated to
 *   max(amax, max|input|) (NaNs ignored): it must hold a non-negative number,
 *   zero for a fresh reduction (the delayed-scaling update zeroes the current
 *   history row for exactly this).
 * stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
te_status te_quantize(const te_tensor* input, const te_tensor* output, void* stream);

/* Current scaling in one call, the cast a current-scaling recipe makes of every
 * tensor: amax = max|input| (a fresh reduction, NaNs ignored), then
 * scale = fp8_max / max(amax, epsilon) with the rules of te_compute_scale_from_amax
 * (fp8_max of output's dtype; 1 when that max is 0 or not finite; optionally rounded
 * down to a power of two), then the cast of te_quantize with that scale.
 *
 * output: as for te_quantize, with `amax` and `scale` both required; they are
 *   written, not read (amax receives max|input|, scale the scale used), and
 *   `scale_inv`, if set, receives 1/scale. epsilon: finite and >= 0.
 * stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
te_status te_quantize_current_scaling(const te_tensor* input, const te_tensor* output, float epsilon,
                                      int force_pow_2_scales, void* stream);

/* Several casts in one call: te_quantize of each pair (inputs[i], outputs[i]),
 * or te_quantize_current_scaling of each with one epsilon and force_pow_2_scales.
 * A pair whose output is float32, float16 or bfloat16 is a plain conversion instead:
 * output.data = the input rounded to nearest even (same shape; the output's
 * columnwise_data, scale, scale_inv and amax must be null), such as the bf16 bias an
 * FP8 GEMM with an fp32 output takes. Every pair is checked before any runs; all
 * tensors on one device; the outputs' buffers (data, scales, amaxes) distinct between
 * pairs, except that delayed-scaling casts may raise one amax. Inputs may differ in
 * dtype. On the GPU the small ones (up to 16384 elements; a cast's dimensions
 * multiples of 8, a conversion's count; aligned as a fresh allocation is) run in a
 * single launch, a block each: the casts of a layer's input and weight, and its bias's
 * conversion, at the sizes where launches, not bandwidth, cost the time. The results
 * equal the single calls', bit for bit. count may be 0.
 * stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
te_status te_multi_quantize(size_t count, const te_tensor* inputs, const te_tensor* outputs, void* stream);
te_status te_multi_quantize_current_scaling(size_t count, const te_tensor* inputs, const te_tensor* outputs,
                                            float epsilon, int force_pow_2_scales, void* stream);

/* Dequantize `input` (float8_e4m3 or float8_e5m2 per-tensor, row-wise `data` and
 * `scale_inv` set) into `output` (float32, float16 or bfloat16, same shape):
 * output = fp8_to_float(q) * scale_inv, rounded to nearest even. A NaN code
 * gives a NaN whose sign and payload are unspecified. */
te_status te_dequantize(const te_tensor* input, const te_tensor* output, void* stream);

/* amax reduction alone: *amax = max(*amax, max|input|), NaNs ignored.
 * input: float32, float16 or bfloat16. amax: one fp32 on the input's device,
 * holding a non-negative number (zero for a fresh reduction). */
te_status te_compute_amax(const te_tensor* input, float* amax, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_QUANTIZE_H_ */
