/* The FP8 steps of a linear layer, y = x W^T + b, one call each: the casts and
 * GEMMs that Transformer Engine's Linear queues in its forward and its backward
 * under per-tensor scaling, with given scales (delayed scaling) or with scales
 * computed from each tensor's own amax (current scaling).
 *
 * Each is a composition of the ops in quantize.h, bias_grad.h and gemm.h, with their
 * conventions, and gives their results bit for bit. What it saves is host time:
 * a small layer's step spends more time building descriptors and crossing into the
 * core for each of three to five calls than its kernels take on the GPU; these take
 * the step's tensors at once. Every tensor's shape, dtype, device and the pointers
 * its use needs, and the FP8 GEMMs' rule that rows, in and out be multiples of 16, are
 * checked before anything runs; what only a GEMM finds (cuBLASLt refusing a
 * combination) fails the call after the casts were written and their amaxes raised.
 *
 * Names: x = input [rows, in], W = weight [out, in], y = output [rows, out].
 *
 * current_scaling: NULL for given scales: each FP8 output's `scale` is read, its
 * `amax` (if set) raised, as te_quantize does. Otherwise every cast of the call is
 * te_quantize_current_scaling's with this epsilon and force_pow_2_scales: each FP8
 * output's `amax` and `scale` are required and written (max|x| and the scale used). */
#ifndef OPENTE_LINEAR_H_
#define OPENTE_LINEAR_H_

#include <stddef.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct te_current_scaling {
  float epsilon;              /* finite, >= 0: the smallest amax a scale is computed from */
  int32_t force_pow_2_scales; /* nonzero: scales rounded down to powers of two */
} te_current_scaling;

/* Forward: input_fp8 = cast(input) and weight_fp8 = cast(weight) (te_quantize's
 * conventions: each output's scale is read, its scale_inv written, its amax raised),
 * with bias rounded into bias_converted when that is given, all in one
 * te_multi_quantize; then output = input_fp8 @ weight_fp8^T (+ bias, or +
 * bias_converted when given) by te_gemm ("TN", the bias epilogue).
 *
 * input: [rows, in], weight: [out, in], float32 / float16 / bfloat16 (either).
 * input_fp8, weight_fp8: their FP8 casts, shaped as they are: float8_e4m3 or
 *   float8_e5m2, TE_SCALING_PER_TENSOR, `scale` (and `amax` with current_scaling)
 *   and row-wise `data` required;
 *   `columnwise_data` optional (the transposed copies the backward GEMMs read).
 * bias: NULL, or [out] float. bias_converted: NULL, or [out] in another float dtype
 *   (cuBLASLt's FP8 GEMM adds a bf16 or fp16 bias only).
 * output: [rows, out], float32 / float16 / bfloat16.
 * use_split_accumulator, workspace: as te_gemm's. */
te_status te_linear_fp8_fwd(const te_tensor* input, const te_tensor* weight, const te_tensor* bias,
                            const te_tensor* bias_converted, const te_tensor* input_fp8, const te_tensor* weight_fp8,
                            const te_tensor* output, const te_current_scaling* current_scaling,
                            int use_split_accumulator, void* workspace, size_t workspace_size, void* stream);

/* Backward: grad_output_fp8 = cast(grad_output), with dbias = the column sums of
 * grad_output in the same pass when dbias is given (te_dbias_cast_transpose, else
 * te_quantize; their current-scaling forms with current_scaling); then
 *   grad_input  = grad_output_fp8 @ weight_fp8        (te_gemm "NN"), when given;
 *   grad_weight = grad_output_fp8^T @ input_fp8       (te_gemm "NT"), when given.
 *
 * grad_output: [rows, out] float32 / float16 / bfloat16.
 * grad_output_fp8: its FP8 cast (`scale` required, and `amax` with current_scaling); row-wise
 *   `data` required when grad_input is given, `columnwise_data` when grad_weight is.
 * dbias: NULL, or [out] in grad_output's dtype or float32; dbias_workspace as
 *   te_dbias_cast_transpose's (te_dbias_workspace_size(rows, out) bytes on CUDA).
 * weight_fp8: [out, in] FP8 with `columnwise_data` and `scale_inv` (the forward's
 *   cast), when grad_input is given; input_fp8 likewise [rows, in], when grad_weight is.
 * grad_input: NULL, or [rows, in]; grad_weight: NULL, or [out, in]; float32 /
 *   float16 / bfloat16; at least one of them given.
 * split_accumulator_dgrad / _wgrad, gemm_workspace: as te_gemm's. */
te_status te_linear_fp8_bwd(const te_tensor* grad_output, const te_tensor* grad_output_fp8, const te_tensor* dbias,
                            const te_tensor* weight_fp8, const te_tensor* input_fp8, const te_tensor* grad_input,
                            const te_tensor* grad_weight, const te_current_scaling* current_scaling,
                            int split_accumulator_dgrad, int split_accumulator_wgrad, void* dbias_workspace, size_t dbias_workspace_size, void* gemm_workspace,
                            size_t gemm_workspace_size, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_LINEAR_H_ */
