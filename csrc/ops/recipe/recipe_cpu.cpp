// CPU reference of the recipe updates.
#include <string.h>

#include "common/dtype.h"
#include "ops/recipe/recipe_params.h"
#include "ops/recipe/scale_math.h"

namespace opente {

void current_scaling_cpu(const CurrentScalingParams& p) {
  const float scale = current_scale(*p.amax, p.fp8_max, p.epsilon, p.force_pow_2_scales);
  *p.scale = scale;
  if (p.scale_inv) *p.scale_inv = 1.0f / scale;
}

void delayed_scaling_cpu(const DelayedScalingParams& p) {
  for (int64_t g = 0; g < p.num_groups; ++g) {
    const te_amax_history_group& grp = p.groups[g];
    float* hist = grp.amax_history;  // [history_len, num_scales]
    const int64_t len = grp.history_len, n = grp.num_scales;
    const float group_fp8_max = fp8_max(te_dtype(grp.fp8_dtype));
    for (int64_t j = 0; j < n; ++j) {
      float amax = hist[j];
      if (p.use_max) {
        for (int64_t i = 1; i < len; ++i) amax = max_propagate_nan(amax, hist[i * n + j]);
      }
      const float scale = delayed_scale(amax, grp.scale[j], group_fp8_max, p.margin_factor);
      grp.scale[j] = scale;
      if (grp.scale_inv) grp.scale_inv[j] = 1.0f / scale;
      // roll up by one row: row i <- row i+1, last row <- old row 0; then row 0 <- 0
      const float first = hist[j];
      for (int64_t i = 0; i + 1 < len; ++i) hist[i * n + j] = hist[(i + 1) * n + j];
      hist[(len - 1) * n + j] = first;
      hist[j] = 0.0f;
    }
  }
}

}  // namespace opente
