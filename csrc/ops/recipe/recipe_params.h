// Parameters of the FP8 recipe updates (current and delayed scaling).
#pragma once

#include <stdint.h>

#include "opente/recipe.h"

namespace opente {

struct CurrentScalingParams {
  const float* amax;  // [1]
  float* scale;       // [1]
  float* scale_inv;   // [1]; may be null
  float fp8_max;
  float epsilon;
  bool force_pow_2_scales;
};

struct DelayedScalingParams {
  const te_amax_history_group* groups;  // host array
  int64_t num_groups;
  bool use_max;         // true: max over the history; false: most recent
  float margin_factor;  // 2^margin, computed once on the host so CPU and GPU divide by the same float
};

void current_scaling_cpu(const CurrentScalingParams& p);
void delayed_scaling_cpu(const DelayedScalingParams& p);
#if OPENTE_WITH_CUDA
void current_scaling_cuda(const CurrentScalingParams& p, int device, void* stream);
void delayed_scaling_cuda(const DelayedScalingParams& p, int device, void* stream);
#endif

}  // namespace opente
