/* Scaling-factor updates of the FP8 recipes, computed on the tensor's device so
 * that a training step never waits on the host. */
#ifndef OPENTE_RECIPE_H_
#define OPENTE_RECIPE_H_

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Current scaling: from one amax, compute
 *   scale = fp8_max / max(amax, epsilon)
 * where fp8_max is the largest finite value of fp8_dtype. If that max is zero or
 * not finite, scale = 1. A scale that overflows becomes FLT_MAX. With
 * force_pow_2_scales the scale is rounded down to a power of two (exact in FP8
 * arithmetic). scale_inv (optional) receives 1/scale.
 * amax, scale, scale_inv: one fp32 each, all on `device`. */
te_status te_compute_scale_from_amax(const float* amax, float* scale, float* scale_inv,
                                     int32_t fp8_dtype, float epsilon, int force_pow_2_scales,
                                     te_device device, void* stream);

typedef enum te_amax_compute_algo {
  TE_AMAX_COMPUTE_MAX = 0,        /* max over the whole history */
  TE_AMAX_COMPUTE_MOST_RECENT = 1 /* row 0 of the history */
} te_amax_compute_algo;

/* One group of FP8 tensors that share an amax history (one module's metadata in one
 * direction). Each group names its own format, so that one launch can update the
 * forward (E4M3) and the backward (E5M2) scales of a HYBRID recipe together. */
typedef struct te_amax_history_group {
  float* amax_history;  /* [history_len, num_scales], row 0 the current step */
  float* scale;         /* [num_scales], read and updated */
  float* scale_inv;     /* [num_scales], written; may be NULL */
  int64_t history_len;  /* >= 1 */
  int64_t num_scales;   /* >= 0 */
  int32_t fp8_dtype;    /* the format these scales cast to: float8_e4m3 or float8_e5m2 */
} te_amax_history_group;

/* Delayed scaling, for many groups in one launch. For every scale j of every group:
 *   amax  = max over rows of amax_history[:, j]  (MAX) or amax_history[0, j]  (MOST_RECENT)
 *           (a NaN anywhere in the window makes amax NaN)
 *   scale = fp8_max / amax / 2^margin  when amax > 0 and finite, else unchanged
 *           (fp8_max: the largest finite value of the group's fp8_dtype);
 *           a scale that overflows becomes FLT_MAX
 *   scale_inv = 1 / scale
 * then the history rolls up by one row (row i takes row i+1, the last row takes
 * the old row 0) and row 0 is zeroed, ready for the next step's casts.
 * `groups` is a host array; the buffers it points to live on `device`. */
te_status te_delayed_scaling_update(const te_amax_history_group* groups, int64_t num_groups,
                                    int32_t amax_compute_algo, float margin, te_device device,
                                    void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_RECIPE_H_ */
