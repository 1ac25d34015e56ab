/* Backward casts fused with the bias gradient (Transformer Engine's
 * nvte_cast_transpose_dbias and nvte_cast_transpose_dbias_d<act> family).
 *
 * In the backward of a Linear, the gradient of its output goes to two GEMMs in
 * FP8 (row-wise for dgrad, column-wise for wgrad), and its column sums are the
 * bias gradient. These ops read the gradient once and write all of it:
 *   te_dbias_cast_transpose        dx = grad             (a layer without activation)
 *   te_dbias_cast_transpose_current_scaling   the same, under current scaling
 *   te_dact_dbias_cast_transpose   dx = the activation backward of te_activation_bwd
 *                                  (opente/activation.h) from the forward's input
 * then dx (computed in fp32) is written row-wise and / or column-wise in FP8 with
 * te_quantize's conventions, and dbias[c] = sum over rows of dx[r, c], summed in
 * fp32 from the fp32 dx and rounded once to the dbias dtype: the input's, or float32
 * (an fp32 bias's gradient with bf16 activations, as under torch.autocast: the same sums,
 * not rounded to the activations' dtype first; rounded to it they equal that dbias bit
 * for bit).
 *
 * A tensor [d0, ..., dn-1] (n >= 1) is the matrix [rows, cols], rows = d0*...*dn-2.
 * Zero rows are allowed: dbias is then all zeros.
 *
 * CUDA: each block of the kernel handles a tile, writes its outputs and the tile's
 * column sums into `workspace`; a second small kernel adds those partials, always
 * in the same order for a shape, into dbias. The workspace must hold
 * te_dbias_workspace_size(rows, cols) bytes, cols being dbias's length; it is
 * ignored on the CPU and when dbias is null. */
#ifndef OPENTE_BIAS_GRAD_H_
#define OPENTE_BIAS_GRAD_H_

#include <stddef.h>
#include <stdint.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of workspace for a [rows, cols] dx on `device`: 4 * ceil(rows / 128) * cols
 * on CUDA, 0 on the CPU. */
size_t te_dbias_workspace_size(int64_t rows, int64_t cols, te_device device);

/* grad: [..., cols] float32, float16 or bfloat16.
 * output: grad's shape, float8_e4m3 or float8_e5m2 with TE_SCALING_PER_TENSOR, as
 *   te_quantize's output: `scale` required; `data` (row-wise) and / or
 *   `columnwise_data` ([cols, rows]); `scale_inv`, if set, receives 1/scale;
 *   `amax`, if set, is raised to max(amax, max|grad|) (NaNs ignored).
 * dbias: [cols], grad's dtype or float32, overwritten with the column sums of grad.
 * All on one device. */
te_status te_dbias_cast_transpose(const te_tensor* grad, const te_tensor* output, const te_tensor* dbias,
                                  void* workspace, size_t workspace_size, void* stream);

/* Current scaling: as te_dbias_cast_transpose, with the output's scale computed first
 * from grad, on the device, as te_quantize_current_scaling does (opente/quantize.h):
 * output.amax receives max|grad| (NaNs ignored), output.scale the scale
 * fp8_max / max(amax, epsilon) (1 when that is 0 or not finite; optionally a power of
 * two), output.scale_inv (if set) 1/scale; the cast and dbias then use that scale.
 * Both amax and scale are required and written, not read. epsilon: finite and >= 0.
 * On the GPU a small gradient (at most 16384 elements, both dimensions multiples of 8,
 * aligned as a fresh allocation is) takes one launch for all of it. */
te_status te_dbias_cast_transpose_current_scaling(const te_tensor* grad, const te_tensor* output,
                                                  const te_tensor* dbias, float epsilon, int force_pow_2_scales,
                                                  void* workspace, size_t workspace_size, void* stream);

/* kind: a te_activation (opente/activation.h).
 * act_input: the forward's input, [..., cols] float32, float16 or bfloat16; for a
 *   gated kind cols = 2H (even), else H = cols.
 * grad: the forward output's gradient, [..., H] (act_input's leading dims), act_input's dtype.
 * output: dx, act_input's shape, either
 *   - FP8 with TE_SCALING_PER_TENSOR as in te_dbias_cast_transpose (row-wise and / or
 *     column-wise [cols, rows], amax of the fp32 dx before scaling, scale_inv), or
 *   - float32, float16 or bfloat16 (`data` written; columnwise_data must be null).
 * dbias: null (no bias gradient, no workspace needed), or [cols] in act_input's
 *   dtype or float32, overwritten with the column sums of dx (for a gated kind: of
 *   [da | db]). */
te_status te_dact_dbias_cast_transpose(int32_t kind, const te_tensor* grad, const te_tensor* act_input,
                                       const te_tensor* output, const te_tensor* dbias, void* workspace,
                                       size_t workspace_size, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_BIAS_GRAD_H_ */
