/* Matrix multiply with fused epilogues: cuBLASLt on the GPU, fp32-accumulating
 * loops on the CPU.
 *
 * The operands follow Transformer Engine's general_gemm(A, B): with row-major
 * storage,
 *
 *   D[m, n] = alpha * op_B(B)[m, k] @ op_A(A)[k, n]  +  beta * D[m, n]
 *
 *   op_A(A) = A^T, A stored [n, k]   when transa  (the "T" of layout "TN")
 *             A,   A stored [k, n]   otherwise
 *   op_B(B) = B^T, B stored [k, m]   when transb
 *             B,   B stored [m, k]   otherwise
 *
 * so a Linear layer (weight W [out, in], input X [tokens, in]) runs
 *   fprop  Y  = X @ W^T    A = W,  B = X,  transa, !transb   ("TN")
 *   dgrad  dX = dY @ W     A = W,  B = dY, !transa, !transb  ("NN")
 *   wgrad  dW = dY^T @ X   A = X,  B = dY, !transa, transb   ("NT")
 * Tensors with more than two dims are flattened to [d0*...*dn-2, dn-1].
 *
 * FP8 (Hopper): A and B in float8_e4m3 / float8_e5m2 (not both e5m2), each with
 * its per-tensor scale_inv. cuBLASLt only multiplies FP8 in the "TN" form; for
 * the other layouts an FP8 operand must carry its column-wise (transposed) copy
 * (te_quantize writes it), and the op uses that copy instead. */
#ifndef OPENTE_GEMM_H_
#define OPENTE_GEMM_H_

#include <stddef.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Epilogues act on the product P = alpha * op_B(B) @ op_A(A) (plus beta * D). */
typedef enum te_gemm_epilogue {
  TE_GEMM_EPILOGUE_NONE = 0,           /* D = P */
  TE_GEMM_EPILOGUE_BIAS = 1,           /* D = P + bias[n] */
  TE_GEMM_EPILOGUE_GELU_AUX = 2,       /* aux = P; D = gelu(P) (aux saved for backward) */
  TE_GEMM_EPILOGUE_GELU_AUX_BIAS = 3,  /* aux = P + bias[n]; D = gelu(aux) */
  TE_GEMM_EPILOGUE_DGELU = 4,          /* D = P * gelu'(aux), aux the saved pre-activation [m, n] */
  TE_GEMM_EPILOGUE_DGELU_BGRAD = 5,    /* D = P * gelu'(aux); bias_grad[n] = sum over m of D */
  /* D = P; bias_grad[m] = sum over k of op_B(B)[m, k] (in the wgrad GEMM: the sum
   * of dY over tokens, the bias gradient) */
  TE_GEMM_EPILOGUE_BGRAD = 6
} te_gemm_epilogue;

/* GELU is Transformer Engine's tanh form:
 *   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */

typedef struct te_gemm_config {
  int32_t transa;                /* nonzero: op_A(A) = A^T */
  int32_t transb;                /* nonzero: op_B(B) = B^T */
  int32_t epilogue;              /* te_gemm_epilogue */
  float alpha;                   /* usually 1 */
  float beta;                    /* 0, or 1 to accumulate into D (fuse_wgrad_accumulation) */
  int32_t use_split_accumulator; /* FP8: promote partial sums to fp32 (exact, slower);
                                    0 uses the tensor cores' faster accumulation */
} te_gemm_config;

/* The workspace te_gemm asks of CUDA callers: 32 MiB, as Transformer Engine
 * uses on Hopper. Pass at least this many bytes; CPU calls need none. */
size_t te_gemm_workspace_size(void);

/* A, B: the operands (see above), float32 / float16 / bfloat16 (both the same) or
 * FP8. D: the output [m, n]: float32, float16, bfloat16, or FP8 (then D.scale is
 * the quantization scale, beta must be 0, and D.amax, if set, receives max|D|
 * before scaling: overwritten, not accumulated; D.scale_inv is not written).
 * bias: [n], float32 / float16 / bfloat16, for the *_BIAS epilogues, else NULL.
 * aux: [m, n] pre-activation in D's dtype (bfloat16 when D is FP8), written by
 * GELU_AUX*, read by DGELU*, else NULL. bias_grad: [n] or [m] (see the
 * epilogues), written by *_BGRAD, else NULL. All on one device.
 * What cuBLASLt cannot run (a dtype combination, an epilogue with FP8 inputs)
 * returns TE_ERROR_NOT_IMPLEMENTED naming it; the CPU runs every combination. */
te_status te_gemm(const te_tensor* A, const te_tensor* B, const te_tensor* D, const te_tensor* bias,
                  const te_tensor* aux, const te_tensor* bias_grad, const te_gemm_config* config,
                  void* workspace, size_t workspace_size, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_GEMM_H_ */
