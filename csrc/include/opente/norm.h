/* LayerNorm and RMSNorm over the last dimension, forward and backward.
 *
 * A tensor [d0, ..., dn-1] (n >= 1) is normalized as the matrix [rows, hidden]
 * with rows = d0*...*dn-2 and hidden = dn-1 >= 1. Statistics are fp32 and so
 * is all arithmetic; inputs and outputs are read and written in their dtypes.
 *
 *   g      = gamma + 1 if zero_centered_gamma, else gamma        (fp32)
 *   LayerNorm:  mu     = mean(x)            (per row)
 *               rsigma = 1 / sqrt(mean((x - mu)^2) + eps)       (biased variance)
 *               xhat   = (x - mu) * rsigma
 *               y      = xhat * g + beta
 *   RMSNorm:    rsigma = 1 / sqrt(mean(x^2) + eps)
 *               xhat   = x * rsigma
 *               y      = xhat * g
 *
 * Backward, from the saved statistics (xhat recomputed from x, mu, rsigma):
 *   dyg    = dz * g
 *   LayerNorm:  dx = rsigma * (dyg - mean(dyg) - xhat * mean(dyg * xhat))
 *               dgamma = sum over rows of dz * xhat,  dbeta = sum over rows of dz
 *   RMSNorm:    dx = rsigma * (dyg - xhat * mean(dyg * xhat))
 *               dgamma = sum over rows of dz * xhat
 * (with zero_centered_gamma, dgamma is still the gradient of gamma: d(gamma+1) = d gamma).
 *
 * The CPU reference accumulates in fp32 in a fixed order; the CUDA kernels agree
 * with it within the tolerance of fp32 reductions, not bit for bit. */
#ifndef OPENTE_NORM_H_
#define OPENTE_NORM_H_

#include <stddef.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of `workspace` every norm op (forward and backward, LayerNorm and
 * RMSNorm) asks of CUDA callers for `rows` x `hidden` inputs; 0 for the CPU and
 * for rows <= 0 or hidden <= 0. On CUDA it is
 *
 *   min(rows, 512) * 2 * hidden * sizeof(float)
 *
 * room for the fp32 partial sums of dgamma and dbeta ([blocks, 2, hidden]) that
 * the backward's blocks write, a row each, before a last pass sums each column.
 * The backward runs one wave of blocks (one to three an SM: 132 to 396 on H100 /
 * H200), at most 512, so the size depends on the shape alone. The summation order
 * follows the grid: results repeat bit for bit on one GPU model, and may differ in
 * the last bits on a model with another SM count. The forward needs no scratch of its own today and
 * accepts the same buffer, so a caller sizes one workspace for both directions. */
size_t te_norm_workspace_size(int64_t rows, int64_t hidden, te_device device);

/* LayerNorm forward.
 * input:  [..., hidden], float32, float16 or bfloat16.
 * gamma, beta: hidden elements each, float32, float16 or bfloat16 (both the same
 *   dtype, which may differ from input's).
 * eps: finite and >= 0. zero_centered_gamma: nonzero adds 1 to gamma.
 * output: the input's shape, either
 *   - float32, float16 or bfloat16 (TE_SCALING_NONE; `data` written; the scale
 *     fields are not used and columnwise_data must be null; `amax`, if set, is
 *     raised to max(amax, max|y|) over y as stored, NaNs ignored: what
 *     te_compute_amax of the output would add, in the same pass), or
 *   - float8_e4m3 / float8_e5m2 with TE_SCALING_PER_TENSOR, exactly as
 *     te_quantize's output: `scale` required; `data` (row-wise) and / or
 *     `columnwise_data` ([hidden, rows], written in the same pass); `scale_inv`,
 *     if set, receives 1/scale; `amax`, if set, is updated to max(amax, max|y|)
 *     over the fp32 y before scaling (NaNs ignored).
 * mu, rsigma: rows elements each, float32: the statistics backward needs.
 * workspace: te_norm_workspace_size() bytes on CUDA; ignored on the CPU.
 * stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
te_status te_layernorm_fwd(const te_tensor* input, const te_tensor* gamma, const te_tensor* beta, float eps,
                           int zero_centered_gamma, const te_tensor* output, const te_tensor* mu,
                           const te_tensor* rsigma, void* workspace, size_t workspace_size, void* stream);

/* LayerNorm backward.
 * dz: the gradient of the output, x's shape and dtype. x, mu, rsigma, gamma: as
 * given to / written by the forward (eps is already inside rsigma).
 * dx: x's shape and dtype. dgamma, dbeta: hidden elements each, gamma's dtype,
 * overwritten (zeros for rows == 0). */
te_status te_layernorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* mu, const te_tensor* rsigma,
                           const te_tensor* gamma, int zero_centered_gamma, const te_tensor* dx,
                           const te_tensor* dgamma, const te_tensor* dbeta, void* workspace, size_t workspace_size,
                           void* stream);

/* RMSNorm forward: as te_layernorm_fwd without beta and mu. */
te_status te_rmsnorm_fwd(const te_tensor* input, const te_tensor* gamma, float eps, int zero_centered_gamma,
                         const te_tensor* output, const te_tensor* rsigma, void* workspace, size_t workspace_size,
                         void* stream);

/* RMSNorm backward: as te_layernorm_bwd without mu and dbeta. */
te_status te_rmsnorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* rsigma, const te_tensor* gamma,
                         int zero_centered_gamma, const te_tensor* dx, const te_tensor* dgamma, void* workspace,
                         size_t workspace_size, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_NORM_H_ */
