/* Rotary position embedding (RoPE), forward and backward: Transformer Engine's
 * fused_rope_forward / fused_rope_backward.
 *
 * Layouts (te_rope_format) of the input x and of the output:
 *   SBHD  [s, b, h, d]    BSHD  [b, s, h, d]
 *   THD   [t, h, d]: the b sequences packed back to back; sequence i holds tokens
 *         [cu_seqlens[i], cu_seqlens[i + 1]) (cu_seqlens: int32 [b + 1]).
 * freqs: float32 [s2, 1, 1, d2], as RotaryPositionEmbedding returns; row p holds the
 * d2 angles of position p. d2 is even and d2 <= d: features [0, d2) of every head are
 * rotated, features [d2, d) are copied unchanged.
 *
 * Rotation. Features pair up: (i, i + d2/2) for i < d2/2, or with `interleaved`
 * (2i, 2i + 1). For a pair (a, b) of a token at position p, with f = freqs[p]:
 *   forward   y_a = x_a cos f_a - x_b sin f_a        y_b = x_b cos f_b + x_a sin f_b
 *   backward  dx_a = dy_a cos f_a + dy_b sin f_b     dx_b = dy_b cos f_b - dy_a sin f_a
 * i.e. y = x cos f + rotate_half(x) sin f, and the backward is its transpose. Math is
 * fp32 (sin and cos of fp32 angles); x and y are float32, float16 or bfloat16 (one
 * dtype), y rounded once to nearest even.
 *
 * Positions. A token at index j of its sequence (s index for SBHD / BSHD; the offset
 * from its sequence's start for THD) has position
 *   p = j + start_positions[seq]            (start_positions: optional int32 [b]), or
 *   with context parallelism (cp_size > 1; no start_positions), sequences of local
 *   length n split in halves, this rank holding chunks cp_rank and 2 cp_size - 1 -
 *   cp_rank of the full sequence:
 *     p = j + cp_rank n/2                                  for j < n/2
 *     p = cp_size n - (cp_rank + 1) n/2 + (j - n/2)        for j >= n/2
 *   (n/2 rounded down). For THD every cu_seqlens value is divided by cp_size first
 *   (cu_seqlens then count the tokens of all ranks, Transformer Engine's
 *   cu_seqlens_padded), and n is the sequence's local length.
 * A position outside [0, s2) gives NaN in the rotated features (and the copied ones
 * are copied): it is not checked up front on the GPU, where start_positions and
 * cu_seqlens live in device memory. Without start_positions the SBHD / BSHD
 * positions are known and must lie in freqs (checked: s <= s2, or cp_size s <= s2
 * with s even under context parallelism).
 * THD tokens outside every sequence (padding before cu_seqlens[0] or from
 * cu_seqlens[b] on) are copied unchanged. On the CPU, cu_seqlens must be
 * non-decreasing with cu_seqlens[0] >= 0 and cu_seqlens[b] / cp_size <= t, and with
 * cp_size > 1 every local length even (checked); on the GPU those are not checked and
 * bad values give unspecified output values, but never a read or write outside the
 * buffers (cu_seqlens is searched, not trusted as an index).
 *
 * Strides. x may be any strided view (q, k and v sliced out of a fused projection):
 * input_strides gives the element stride of each of its dims (ndim values, >= 0), or
 * NULL for a contiguous x. The output is contiguous in the same layout. The output
 * must not overlap x (a rotation reads two elements for every one it writes).
 *
 * Sizes: any s, b, h, t and d (odd d too); tensors with no elements write
 * nothing. stream: a cudaStream_t for CUDA tensors; ignored on the CPU. */
#ifndef OPENTE_ROPE_H_
#define OPENTE_ROPE_H_

#include <stdint.h>

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum te_rope_format { TE_ROPE_SBHD = 0, TE_ROPE_BSHD = 1, TE_ROPE_THD = 2 } te_rope_format;

typedef struct te_rope_config {
  int32_t format;      /* te_rope_format */
  int32_t interleaved; /* nonzero: pairs (2i, 2i + 1); zero: (i, i + d2/2) */
  int32_t cp_size;     /* context-parallel world size, >= 1 */
  int32_t cp_rank;     /* in [0, cp_size) */
} te_rope_config;

/* output = rope(input). input: [s, b, h, d], [b, s, h, d] or [t, h, d] per
 * config->format, strided as input_strides says (NULL: contiguous); freqs: float32
 * [s2, 1, 1, d2]; cu_seqlens: int32 [b + 1] for THD, else NULL; start_positions:
 * int32 [b] or NULL; output: input's shape and dtype, contiguous. All on one device. */
te_status te_rope_fwd(const te_tensor* input, const int64_t* input_strides, const te_tensor* freqs,
                      const te_tensor* cu_seqlens, const te_tensor* start_positions, const te_tensor* output,
                      const te_rope_config* config, void* stream);

/* grad_input = the transposed rotation of grad_output, with the arguments of the
 * forward (grad_output in input's place, grad_input in output's). */
te_status te_rope_bwd(const te_tensor* grad_output, const int64_t* grad_output_strides, const te_tensor* freqs,
                      const te_tensor* cu_seqlens, const te_tensor* start_positions, const te_tensor* grad_input,
                      const te_rope_config* config, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_ROPE_H_ */
