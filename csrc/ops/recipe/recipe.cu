// Recipe updates on the GPU, so a training step never waits on the host.
#include <algorithm>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/recipe/recipe_params.h"
#include "ops/recipe/scale_math.h"

namespace opente {
namespace {

__global__ void current_scaling_kernel(CurrentScalingParams p) {
  const float scale = current_scale(*p.amax, p.fp8_max, p.epsilon, p.force_pow_2_scales);
  *p.scale = scale;
  if (p.scale_inv) *p.scale_inv = 1.0f / scale;
}

// Groups travel by value in the kernel's parameters, with each group's fp8_max
// (from its format, looked up on the host): 64 groups of 48 + 4 bytes stay well
// inside the 4 KiB parameter space.
constexpr int kGroupsPerLaunch = 64;
constexpr int kThreads = 256;

struct GroupBatch {
  te_amax_history_group groups[kGroupsPerLaunch];
  float fp8_max[kGroupsPerLaunch];
};

// One block per group; each thread owns whole columns (scales) of its history.
__global__ void __launch_bounds__(kThreads) delayed_scaling_kernel(GroupBatch batch, bool use_max, float margin_factor) {
  const te_amax_history_group g = batch.groups[blockIdx.x];
  const float fp8_max = batch.fp8_max[blockIdx.x];
  for (int64_t j = threadIdx.x; j < g.num_scales; j += blockDim.x) {
    float* hist = g.amax_history + j;  // column j: element i at hist[i * num_scales]
    const float first = hist[0];
    float amax = first;
    if (use_max) {
      for (int64_t i = 1; i < g.history_len; ++i) amax = max_propagate_nan(amax, hist[i * g.num_scales]);
    }
    const float scale = delayed_scale(amax, g.scale[j], fp8_max, margin_factor);
    g.scale[j] = scale;
    if (g.scale_inv) g.scale_inv[j] = 1.0f / scale;
    for (int64_t i = 0; i + 1 < g.history_len; ++i) hist[i * g.num_scales] = hist[(i + 1) * g.num_scales];
    hist[(g.history_len - 1) * g.num_scales] = first;
    hist[0] = 0.0f;
  }
}

}  // namespace

void current_scaling_cuda(const CurrentScalingParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  current_scaling_kernel<<<1, 1, 0, as_stream(stream)>>>(p);
  check_launch("current_scaling_kernel");
}

void delayed_scaling_cuda(const DelayedScalingParams& p, int device, void* stream) {
  if (p.num_groups == 0) return;
  DeviceGuard guard(device);
  for (int64_t first = 0; first < p.num_groups; first += kGroupsPerLaunch) {
    const int count = int(std::min<int64_t>(kGroupsPerLaunch, p.num_groups - first));
    GroupBatch batch{};
    std::copy(p.groups + first, p.groups + first + count, batch.groups);
    for (int i = 0; i < count; ++i) batch.fp8_max[i] = fp8_max(te_dtype(batch.groups[i].fp8_dtype));
    delayed_scaling_kernel<<<count, kThreads, 0, as_stream(stream)>>>(batch, p.use_max, p.margin_factor);
    check_launch("delayed_scaling_kernel");
  }
}

}  // namespace opente
