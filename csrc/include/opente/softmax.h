/* The softmax ops of the unfused attention path (Transformer Engine's
 * scaled_softmax, scaled_masked_softmax, scaled_upper_triang_masked_softmax and
 * scaled_aligned_causal_masked_softmax), forward and backward.
 *
 * Every op works on rows of sk elements (the last dim) and computes in fp32;
 * tensors are read and written in their dtype: float32, float16 or bfloat16 (one
 * dtype for all tensors of a call). For row r of input x, with z_j = scale * x_j:
 *
 *   scaled softmax          input [..., sk] (at least one dim):
 *       y_j = exp(z_j - m) / sum_k exp(z_k - m),   m = max_k z_k
 *   scaled masked softmax   input [b, h, sq, sk], mask [b or 1, 1, sq, sk] uint8:
 *       a nonzero mask element masks its position out: z_j is replaced by -10000
 *       (the value itself, not scaled), then y as above. As in Transformer Engine,
 *       masked positions take part in the max and the sum with that value, and a
 *       row whose max is exactly -10000 after masking - every position masked, the
 *       case that happens in practice - is written as all zeros. (Transformer
 *       Engine treats only mask value 1 as masked; any nonzero value is here.)
 *       A mask of batch 1 is broadcast over b; its head dim is always 1.
 *   scaled upper-triangular masked (causal) softmax   input [attn_batches, sq, sk],
 *       sq == sk: for the row's query index i, positions j > i are masked out
 *       (logit -inf): y is the softmax of z_0 .. z_i and exactly 0 for j > i.
 *   scaled aligned causal masked softmax   input [b, h, sq, sk], any sq and sk:
 *       bottom-right aligned; position j is kept when j <= i + (sk - sq). Masked
 *       positions count in the max and the sum with logit -10000 (Transformer
 *       Engine's value; it changes y only when the kept logits are below about
 *       -9900) and are written as exactly 0. A row that keeps nothing (i < sq - sk)
 *       is all zeros.
 *
 * Backward, from the forward's output y and the output's gradient dy:
 *
 *   dx_j = scale * (dy_j * y_j - y_j * sum_k dy_k * y_k)
 *
 * (= scale * y_j * (dy_j - sum_k dy_k y_k)). The masked softmax backward is the
 * plain one: its masked positions hold y = 0 and get dx = 0. The two causal
 * backward ops read dy and y only at kept positions, sum over those, and write
 * dx = 0 at the masked ones.
 *
 * In place: grad_input may be grad_output itself (the same data pointer), as
 * Transformer Engine runs its backward; every element of dy is read before the
 * element of dx at the same position is written. Any other overlap between the
 * buffers of a call is rejected (forward: output with input or mask; backward:
 * grad_input with a part of grad_output, or with softmax_output).
 *
 * Sizes: any sk >= 1, no upper limit (Transformer Engine's fused kernels stop at
 * 16384). Tensors with zero elements are accepted and nothing is written.
 * scale must be finite. The CPU reference sums each row in index order; the CUDA
 * kernels sum in another order and agree with it within fp32 rounding. One limit of
 * range: the CUDA kernels of rows that fit one block or one cluster (all but the
 * longest rows) exponentiate in base 2, from z_j * log2(e); where that overflows, at
 * |z_j| above FLT_MAX / log2(e) (about 2.36e38, reachable from float32 inputs only),
 * a row with a z_j above 2.36e38, or whose every z_j is below -2.36e38, comes out NaN
 * where the reference gives its finite softmax.
 *
 * stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
#ifndef OPENTE_SOFTMAX_H_
#define OPENTE_SOFTMAX_H_

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = softmax(scale * x) over the last dim. input: [..., sk]; output: input's shape and dtype. */
te_status te_scaled_softmax_fwd(const te_tensor* input, const te_tensor* output, float scale, void* stream);

/* grad_output, softmax_output, grad_input: one shape [..., sk] and dtype. */
te_status te_scaled_softmax_bwd(const te_tensor* grad_output, const te_tensor* softmax_output,
                                const te_tensor* grad_input, float scale, void* stream);

/* input: [b, h, sq, sk]; mask: [b or 1, 1, sq, sk], uint8 (a bool tensor's bytes);
 * output: input's shape and dtype. */
te_status te_scaled_masked_softmax_fwd(const te_tensor* input, const te_tensor* mask, const te_tensor* output,
                                       float scale, void* stream);

/* As te_scaled_softmax_bwd, for [b, h, sq, sk] tensors. */
te_status te_scaled_masked_softmax_bwd(const te_tensor* grad_output, const te_tensor* softmax_output,
                                       const te_tensor* grad_input, float scale, void* stream);

/* input, output: [attn_batches, sq, sk] with sq == sk. */
te_status te_scaled_upper_triang_masked_softmax_fwd(const te_tensor* input, const te_tensor* output, float scale,
                                                    void* stream);

te_status te_scaled_upper_triang_masked_softmax_bwd(const te_tensor* grad_output, const te_tensor* softmax_output,
                                                    const te_tensor* grad_input, float scale, void* stream);

/* input, output: [b, h, sq, sk]. */
te_status te_scaled_aligned_causal_masked_softmax_fwd(const te_tensor* input, const te_tensor* output, float scale,
                                                      void* stream);

te_status te_scaled_aligned_causal_masked_softmax_bwd(const te_tensor* grad_output,
                                                      const te_tensor* softmax_output, const te_tensor* grad_input,
                                                      float scale, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_SOFTMAX_H_ */
