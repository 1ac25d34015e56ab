// Plain parameter structs of the softmax family, shared by the dispatcher, the
// CPU reference and the CUDA kernels, and the per-row masking rules both follow.
// Shapes are already validated when these are built; sk >= 1 and rows >= 1.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "opente/tensor.h"

#ifdef __CUDACC__
#define OPENTE_HOST_DEVICE __host__ __device__
#else
#define OPENTE_HOST_DEVICE
#endif

namespace opente {

enum class SoftmaxKind {
  kPlain,          // no mask
  kMasked,         // explicit [b or 1, 1, sq, sk] mask
  kUpperTriang,    // causal, sq == sk, masked logits -inf
  kAlignedCausal,  // causal aligned bottom-right, masked logits -10000
};

// The logit Transformer Engine gives masked positions of the masked and the
// aligned causal softmax.
constexpr float kMaskedLogit = -10000.0f;

struct SoftmaxFwdParams {
  SoftmaxKind kind;
  const void* input;    // [rows, sk], dtype
  const uint8_t* mask;  // kMasked: [mask_batches, sq, sk], nonzero = masked; else null
  void* output;         // [rows, sk], dtype
  int64_t rows;         // b * h * sq (or attn_batches * sq, or the product of the leading dims)
  int64_t sq;           // rows per [sq, sk] attention matrix (1 for kPlain)
  int64_t sk;           // >= 1
  int64_t heads;        // h: attention matrices per batch (kMasked only; else 1)
  bool mask_broadcast;  // kMasked: the mask has batch 1
  float scale;
  te_dtype dtype;  // float32, float16, bfloat16
};

struct SoftmaxBwdParams {
  SoftmaxKind kind;            // kPlain and kMasked read whole rows; the causal kinds their kept prefix
  const void* grad_output;     // [rows, sk], dtype
  const void* softmax_output;  // [rows, sk], dtype
  void* grad_input;            // [rows, sk], dtype; may equal grad_output
  int64_t rows;
  int64_t sq;
  int64_t sk;
  float scale;
  te_dtype dtype;
};

OPENTE_HOST_DEVICE inline bool softmax_is_causal(SoftmaxKind kind) {
  return kind == SoftmaxKind::kUpperTriang || kind == SoftmaxKind::kAlignedCausal;
}

// The number of leading positions of row `row` that are not masked by a causal
// kind: j is kept when j <= i + (sk - sq), i = row % sq (upper-triangular has sq
// == sk, so j <= i). Whole rows for the other kinds. In [0, sk].
// softmax_causal_kept_prefix takes i itself (the CUDA row kernels divide by sq their own way).
OPENTE_HOST_DEVICE inline int64_t softmax_causal_kept_prefix(int64_t i, int64_t sq, int64_t sk) {
  const int64_t kept = i + (sk - sq) + 1;
  return kept < 0 ? 0 : (kept > sk ? sk : kept);
}

OPENTE_HOST_DEVICE inline int64_t softmax_kept_prefix(SoftmaxKind kind, int64_t row, int64_t sq, int64_t sk) {
  return softmax_is_causal(kind) ? softmax_causal_kept_prefix(row % sq, sq, sk) : sk;
}

// Whether the positions past the kept prefix join the max and the sum with
// kMaskedLogit (aligned causal) rather than not at all (-inf: upper-triangular).
OPENTE_HOST_DEVICE inline bool softmax_tail_counts(SoftmaxKind kind) { return kind == SoftmaxKind::kAlignedCausal; }

// Row of the [mask_batches * sq, sk] mask that input row `row` uses.
OPENTE_HOST_DEVICE inline int64_t softmax_mask_row(const SoftmaxFwdParams& p, int64_t row) {
  const int64_t batch = p.mask_broadcast ? 0 : row / (p.heads * p.sq);
  return batch * p.sq + row % p.sq;
}

void softmax_fwd_cpu(const SoftmaxFwdParams& p);
void softmax_bwd_cpu(const SoftmaxBwdParams& p);

#if OPENTE_WITH_CUDA
void softmax_fwd_cuda(const SoftmaxFwdParams& p, int device, void* stream);
void softmax_bwd_cuda(const SoftmaxBwdParams& p, int device, void* stream);
#endif

}  // namespace opente
