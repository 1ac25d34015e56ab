// C API of the recipe updates: validate, then run on the CPU or the GPU.
#include <cmath>

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/recipe/recipe_params.h"

using namespace opente;

namespace {

float checked_fp8_max(int32_t fp8_dtype) {
  OPENTE_CHECK_ARG(is_fp8(fp8_dtype), "fp8_dtype must be float8_e4m3 or float8_e5m2, got ",
                   dtype_name(fp8_dtype));
  return fp8_max(te_dtype(fp8_dtype));
}

}  // namespace

extern "C" te_status te_compute_scale_from_amax(const float* amax, float* scale, float* scale_inv,
                                                int32_t fp8_dtype, float epsilon, int force_pow_2_scales,
                                                te_device device, [[maybe_unused]] void* stream) {
  return run_op("te_compute_scale_from_amax", [&] {
    check_device(device, "device");
    OPENTE_CHECK_ARG(amax != nullptr, "amax must not be null");
    OPENTE_CHECK_ARG(scale != nullptr, "scale must not be null");
    OPENTE_CHECK_ARG(std::isfinite(epsilon) && epsilon >= 0.0f, "epsilon must be finite and >= 0, got ", epsilon);
    const CurrentScalingParams p{amax, scale, scale_inv, checked_fp8_max(fp8_dtype), epsilon,
                                 force_pow_2_scales != 0};
    if (device.type == TE_DEVICE_CPU) {
      current_scaling_cpu(p);
    } else {
      OPENTE_CUDA_CALL("device", current_scaling_cuda(p, device.index, stream));
    }
  });
}

extern "C" te_status te_delayed_scaling_update(const te_amax_history_group* groups, int64_t num_groups,
                                               int32_t amax_compute_algo, float margin, te_device device,
                                               [[maybe_unused]] void* stream) {
  return run_op("te_delayed_scaling_update", [&] {
    check_device(device, "device");
    OPENTE_CHECK_ARG(num_groups >= 0, "num_groups must be >= 0, got ", num_groups);
    OPENTE_CHECK_ARG(num_groups == 0 || groups != nullptr, "groups must not be null");
    OPENTE_CHECK_ARG(amax_compute_algo == TE_AMAX_COMPUTE_MAX || amax_compute_algo == TE_AMAX_COMPUTE_MOST_RECENT,
                     "amax_compute_algo must be max (0) or most_recent (1), got ", amax_compute_algo);
    OPENTE_CHECK_ARG(std::isfinite(margin), "margin must be finite, got ", margin);
    for (int64_t g = 0; g < num_groups; ++g) {
      const te_amax_history_group& grp = groups[g];
      OPENTE_CHECK_ARG(grp.history_len >= 1, "groups[", g, "].history_len must be >= 1, got ", grp.history_len);
      OPENTE_CHECK_ARG(grp.num_scales >= 0, "groups[", g, "].num_scales must be >= 0, got ", grp.num_scales);
      OPENTE_CHECK_ARG(is_fp8(grp.fp8_dtype), "groups[", g, "].fp8_dtype must be float8_e4m3 or float8_e5m2, got ",
                       dtype_name(grp.fp8_dtype));
      if (grp.num_scales > 0) {
        OPENTE_CHECK_ARG(grp.amax_history != nullptr, "groups[", g, "].amax_history must not be null");
        OPENTE_CHECK_ARG(grp.scale != nullptr, "groups[", g, "].scale must not be null");
      }
    }
    const float margin_factor = static_cast<float>(std::exp2(static_cast<double>(margin)));
    OPENTE_CHECK_ARG(margin_factor > 0.0f && std::isfinite(margin_factor), "margin ", margin,
                     " makes 2^margin overflow or underflow fp32");
    const DelayedScalingParams p{groups, num_groups, amax_compute_algo == TE_AMAX_COMPUTE_MAX, margin_factor};
    if (device.type == TE_DEVICE_CPU) {
      delayed_scaling_cpu(p);
    } else {
      OPENTE_CUDA_CALL("device", delayed_scaling_cuda(p, device.index, stream));
    }
  });
}
