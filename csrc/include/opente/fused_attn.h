/* Fused scaled dot product attention on cuDNN (its SDPA graphs, built through
 * cudnn-frontend): Transformer Engine's "F16 arbitrary sequence length" fused
 * attention backend, forward and backward.
 *
 * Shapes are given in the logical order [b, h, s, d] (batch, heads, sequence,
 * head dim) whatever the memory layout: each 4-D operand has element strides of
 * those four dims (te_attn_strides), so sbhd, bshd and views that slice Q, K and V
 * out of one fused projection are all described without copies. The head-dim
 * stride must be 1.
 *
 *   q [b, h, sq, dqk]   k [b, hg, skv, dqk]   v [b, hg, skv, dv]   o [b, h, sq, dv]
 *
 * h is a multiple of hg (GQA / MQA: query head i uses key/value head i / (h / hg)).
 * Q, K, V, O (and dO, dQ, dK, dV, bias, dbias) are float16 or bfloat16, one dtype.
 * dqk and dv are multiples of 8, at most 256. Data pointers of those operands are
 * 16-byte aligned (cuDNN reads them in 16-byte vectors); so must be every stride
 * but the head dim's, in bytes.
 *
 * Forward, for each batch n and head i (g the key/value head of i):
 *   S    = softmax_scale * q[n, i] k[n, g]^T (+ bias[n or 0, i or 0])   [sq, skv], fp32
 *   S    = -inf where the mask removes (query r, key c)
 *   P    = softmax over each row of S;  stats[n, i, r] = logsumexp(S[r, :])
 *   P    = dropout(P): each element kept with probability 1 - p and scaled by 1/(1 - p)
 *   o    = P v[n, g]
 * Backward: dq, dk, dv (and dbias) of that function for the gradient d_o of o,
 * from the saved stats (P recomputed, the same dropout mask from the same rng_state).
 *
 * Masks (te_attn_mask_type, Transformer Engine's NVTE_Mask_Type numbering) and the
 * sliding window (window_left, window_right; -1 is unlimited): query r keeps key c when
 *   r + off - window_left <= c <= r + off + window_right
 * with window_right = 0 for the causal types (window_right -1 or 0 is accepted for
 * them). The diagonal offset off is 0 for CAUSAL and PADDING_CAUSAL; for the other
 * types it is skv - sq, and for the padded ones kv_len[n] - q_len[n] per sequence.
 * Padding types take the true lengths of every sequence: seqlens_q [b] in [0, sq] and
 * seqlens_kv [b] in [0, skv], int32 on the device (not read on the host, so not
 * checked); query rows r >= q_len[n] and key columns c >= kv_len[n] are masked out.
 * What the kernels write into o and dq at padded query rows, and into dk / dv at
 * padded key rows, is unspecified (callers zero them if they need zeros).
 *
 * Bias (te_attn_bias_type, NVTE_Bias_Type numbering): NO_BIAS, or POST_SCALE_BIAS with
 * bias [bb, bh, sq, skv] contiguous, bb in {1, b}, bh in {1, h}, broadcast over the
 * dims of size 1. PRE_SCALE_BIAS and ALIBI are not implemented (TE_ERROR_NOT_IMPLEMENTED).
 * dbias (backward, optional): [1, h, sq, skv] only (cuDNN reduces dP into that shape).
 *
 * Dropout: probability p in [0, 1). p > 0 needs rng_state: int64 [2] on the device,
 * {seed, offset} of cuDNN's Philox generator; the backward must be given the same.
 *
 * stats: float32 [b, h, sq, 1] contiguous, the natural-log logsumexp of each row of
 * the masked, scaled logits; forward writes it (NULL: inference, no stats written),
 * backward reads it.
 *
 * What cuDNN itself refuses (a combination its kernels lack, e.g. bottom-right
 * causal masks with a bias or dropout unless sq == skv without padding, or sq > skv
 * with a bottom-right or windowed mask) comes back as TE_ERROR_NOT_IMPLEMENTED with
 * cuDNN's reason, from the workspace query already, before anything runs.
 *
 * Runs on CUDA tensors only, in builds with cuDNN (OPENTE_CUDNN); cuDNN itself is
 * loaded at the first call (see te_cudnn_version). CPU tensors get
 * TE_ERROR_NOT_IMPLEMENTED after the arguments are validated.
 *
 * Graphs are built once per configuration (shapes, strides, dtype, mask, window,
 * bias, dropout, whether stats are written, device) and cached, so only the first
 * call with a configuration pays cuDNN's plan building (milliseconds). The
 * softmax scale is passed by value and is not part of that configuration.
 *
 * Workspace: the caller allocates te_fused_attn_*_workspace_size() bytes on the
 * device (the query builds the graph, so it needs the GPU and returns a status). */
#ifndef OPENTE_FUSED_ATTN_H_
#define OPENTE_FUSED_ATTN_H_

#include <stddef.h>
#include <stdint.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum te_attn_mask_type {
  TE_ATTN_MASK_NO_MASK = 0,
  TE_ATTN_MASK_PADDING = 1,
  TE_ATTN_MASK_CAUSAL = 2,
  TE_ATTN_MASK_PADDING_CAUSAL = 3,
  TE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 4,
  TE_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT = 5
} te_attn_mask_type;

typedef enum te_attn_bias_type {
  TE_ATTN_BIAS_NONE = 0,
  TE_ATTN_BIAS_PRE_SCALE = 1,
  TE_ATTN_BIAS_POST_SCALE = 2,
  TE_ATTN_BIAS_ALIBI = 3
} te_attn_bias_type;

typedef struct te_fused_attn_config {
  int32_t mask_type;     /* te_attn_mask_type */
  int32_t bias_type;     /* te_attn_bias_type */
  int64_t window_left;   /* >= -1; -1: unlimited */
  int64_t window_right;  /* >= -1; -1: unlimited (causal types: -1 or 0) */
  float softmax_scale;   /* finite */
  float dropout;         /* probability in [0, 1) */
  int32_t deterministic; /* backward: nonzero asks cuDNN for its deterministic algorithm */
} te_fused_attn_config;

/* Element strides of the [b, h, s, d] dims of the four operands. In the backward,
 * a second te_attn_strides gives those of the gradients: dq, dk, dv and d_o (in o's slot). */
typedef struct te_attn_strides {
  int64_t q[4];
  int64_t k[4];
  int64_t v[4];
  int64_t o[4];
} te_attn_strides;

/* The cudnn-frontend version this library was built with (e.g. 13200 for 1.32.0),
 * or 0 for a build without cuDNN fused attention. */
int64_t te_cudnn_frontend_version(void);

/* Loads cuDNN (once; a failed load is retried on the next call) and writes its
 * version (e.g. 91900 for 9.19.0). The library is found as: the path in the
 * environment variable OPENTE_CUDNN_LIBRARY, else libcudnn.so.9 by the dynamic
 * loader (the copy PyTorch's CUDA wheels already mapped, or LD_LIBRARY_PATH), else
 * /usr/local/cuda/lib64/libcudnn.so.9. TE_ERROR_NOT_IMPLEMENTED in a build without
 * cuDNN support, TE_ERROR_CUDA when the library cannot be loaded (the message says
 * where it looked). */
te_status te_cudnn_version(int64_t* version);

/* Bytes of workspace te_fused_attn_fwd needs for these arguments (data pointers
 * may be NULL here). Builds and caches the graph: a configuration cuDNN cannot
 * run fails here with TE_ERROR_NOT_IMPLEMENTED. */
te_status te_fused_attn_fwd_workspace_size(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k,
                                           const te_tensor* v, const te_tensor* bias, const te_tensor* seqlens_q,
                                           const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor* o,
                                           const te_tensor* stats, const te_attn_strides* strides,
                                           size_t* workspace_size);

/* The forward. bias, seqlens_q / seqlens_kv, rng_state: NULL unless the bias type,
 * a padding mask type or dropout > 0 needs them (given when not needed: an error).
 * stats: NULL or float32 [b, h, sq, 1]. Writes o (and stats). */
te_status te_fused_attn_fwd(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k,
                            const te_tensor* v, const te_tensor* bias, const te_tensor* seqlens_q,
                            const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor* o,
                            const te_tensor* stats, const te_attn_strides* strides, void* workspace,
                            size_t workspace_size, void* stream);

/* Bytes of workspace te_fused_attn_bwd needs (as te_fused_attn_fwd_workspace_size). */
te_status te_fused_attn_bwd_workspace_size(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k,
                                           const te_tensor* v, const te_tensor* o, const te_tensor* d_o,
                                           const te_tensor* stats, const te_tensor* bias, const te_tensor* seqlens_q,
                                           const te_tensor* seqlens_kv, const te_tensor* rng_state, const te_tensor* dq,
                                           const te_tensor* dk, const te_tensor* dv, const te_tensor* dbias,
                                           const te_attn_strides* strides, const te_attn_strides* grad_strides,
                                           size_t* workspace_size);

/* The backward, with the forward's config, inputs, o and stats. d_o: o's shape and
 * dtype (strides in grad_strides->o). Writes dq, dk, dv (q's, k's and v's shapes,
 * strides in grad_strides) and dbias when given (NULL: the bias gets no gradient). */
te_status te_fused_attn_bwd(const te_fused_attn_config* config, const te_tensor* q, const te_tensor* k,
                            const te_tensor* v, const te_tensor* o, const te_tensor* d_o, const te_tensor* stats,
                            const te_tensor* bias, const te_tensor* seqlens_q, const te_tensor* seqlens_kv,
                            const te_tensor* rng_state, const te_tensor* dq, const te_tensor* dk, const te_tensor* dv,
                            const te_tensor* dbias, const te_attn_strides* strides, const te_attn_strides* grad_strides,
                            void* workspace, size_t workspace_size, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_FUSED_ATTN_H_ */
