/* Activation functions, forward and backward (Transformer Engine's gelu, qgelu,
 * relu, srelu, silu and their gated forms geglu, qgeglu, reglu, sreglu, swiglu).
 *
 * A tensor [d0, ..., dn-1] (n >= 1) is seen as the matrix [rows, cols] with
 * rows = d0*...*dn-2 and cols = dn-1. All arithmetic is fp32; inputs and outputs
 * are read and written in their dtypes.
 *
 *   gelu(x)  = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (the tanh form)
 *   qgelu(x) = x * sigmoid(1.702 x)
 *   relu(x)  = x for x > 0, else 0 (NaN stays NaN)
 *   srelu(x) = relu(x)^2
 *   silu(x)  = x * sigmoid(x)
 *
 * Gated kinds take an input of 2H columns: the first H, a, go through the
 * activation; the last H, b, are the linear gate:
 *   geglu = gelu(a) * b, qgeglu = qgelu(a) * b, reglu = relu(a) * b,
 *   sreglu = srelu(a) * b, swiglu = silu(a) * b           (output [rows, H])
 *
 * Backward, from the forward's input:
 *   plain:  dx = grad * act'(x)
 *   gated:  da = grad * b * act'(a),  db = grad * act(a)   (dinput = [da | db] per row)
 * with gelu'(x)  = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2),
 *      qgelu'(x) = s + 1.702 x s (1 - s), s = sigmoid(1.702 x),
 *      silu'(x)  = s + x s (1 - s), s = sigmoid(x),
 *      relu'(x)  = 1 for x > 0, else 0;  srelu'(x) = 2x for x > 0, else 0.
 *
 * Both compute the tanh of gelu as 0.5 (1 + tanh(u)) = sigmoid(2u).
 * CPU and CUDA tensors; the GPU computes the same fp32 operations as the CPU
 * reference (products and sums rounded one at a time, no fused multiply-adds),
 * so the two differ only in the exponential and quotient of the sigmoid (the
 * host's expf and division, the device's fast intrinsics: a few ulp).
 * The backward fused with the bias gradient and the FP8 cast + transpose is
 * te_dact_dbias_cast_transpose (opente/bias_grad.h). */
#ifndef OPENTE_ACTIVATION_H_
#define OPENTE_ACTIVATION_H_

#include <stdint.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The activation of te_activation_fwd / te_activation_bwd (passed as int32_t). */
typedef enum te_activation {
  TE_ACTIVATION_GELU = 0,
  TE_ACTIVATION_QGELU = 1,
  TE_ACTIVATION_RELU = 2,
  TE_ACTIVATION_SRELU = 3,
  TE_ACTIVATION_SILU = 4,
  TE_ACTIVATION_GEGLU = 5,  /* gated: gelu(a) * b */
  TE_ACTIVATION_QGEGLU = 6, /* gated: qgelu(a) * b */
  TE_ACTIVATION_REGLU = 7,  /* gated: relu(a) * b */
  TE_ACTIVATION_SREGLU = 8, /* gated: srelu(a) * b */
  TE_ACTIVATION_SWIGLU = 9  /* gated: silu(a) * b */
} te_activation;

/* Activation forward.
 * kind: a te_activation.
 * input: [..., cols] (at least one dim), float32, float16 or bfloat16; for a gated
 *   kind cols = 2H must be even, else H = cols.
 * output: [..., H] (input's leading dims), either
 *   - float32, float16 or bfloat16 (TE_SCALING_NONE; `data` written;
 *     columnwise_data must be null; `amax`, if set, is raised to max(amax, max|y|)
 *     over y as stored, NaNs ignored: what te_compute_amax of the output would add,
 *     in the same pass, for a current-scaling cast of it), or
 *   - float8_e4m3 / float8_e5m2 with TE_SCALING_PER_TENSOR, exactly as
 *     te_quantize's output: `scale` required; `data` (row-wise) and / or
 *     `columnwise_data` ([H, rows]); `scale_inv`, if set, receives 1/scale;
 *     `amax`, if set, is updated to max(amax, max|y|) over the fp32 y before
 *     scaling (NaNs ignored).
 * stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
te_status te_activation_fwd(int32_t kind, const te_tensor* input, const te_tensor* output, void* stream);

/* Activation backward.
 * grad: the output's gradient, [..., H], input's dtype.
 * input: the forward's input ([..., H], or [..., 2H] for a gated kind), float32,
 *   float16 or bfloat16.
 * dinput: input's shape and dtype, overwritten; its `amax`, if set, is raised to
 *   max(amax, max|dinput|) over dinput as stored (NaNs ignored), as for a float
 *   output of te_activation_fwd. */
te_status te_activation_bwd(int32_t kind, const te_tensor* grad, const te_tensor* input, const te_tensor* dinput,
                            void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_ACTIVATION_H_ */
