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

// The roll moves this many elements a thread between barriers: its loads are in flight
// together, rather than one global-memory latency an element.
constexpr int kRollPerThread = 8;

// One block per group. A group's history is [history_len, num_scales] row-major: a few
// scales wide (3 for a Linear's forward) and up to a thousand rows long, so the block
// spreads over its rows as well as its columns (a thread a column walking every row
// took 62 us at 1024 rows, H200: longer than the rest of a small layer's step).
__global__ void __launch_bounds__(kThreads) delayed_scaling_kernel(GroupBatch batch, bool use_max, float margin_factor) {
  __shared__ float partial[kThreads];
  const te_amax_history_group g = batch.groups[blockIdx.x];
  const float fp8_max = batch.fp8_max[blockIdx.x];
  const int64_t cols = g.num_scales, len = g.history_len;
  float* const hist = g.amax_history;
  const int64_t window = use_max ? len : 1;  // the rows the amax is taken over

  // 1. The scales, up to kThreads columns at a time: thread t takes column t % width and
  // every lanes-th row from row t / width (lanes a power of two for the tree below).
  for (int64_t first_col = 0; first_col < cols; first_col += kThreads) {
    const int width = int(cols - first_col < kThreads ? cols - first_col : kThreads);
    int lanes = 1;
    while (lanes * 2 * width <= kThreads) lanes *= 2;
    const int col = int(threadIdx.x) % width, lane = int(threadIdx.x) / width;
    const int64_t j = first_col + col;
    float amax = -INFINITY;  // max_propagate_nan's identity
    if (lane < lanes) {
      for (int64_t i = lane; i < window; i += lanes) amax = max_propagate_nan(amax, hist[i * cols + j]);
    }
    partial[threadIdx.x] = amax;
    __syncthreads();
    for (int stride = lanes / 2; stride > 0; stride /= 2) {
      if (lane < stride) {
        partial[threadIdx.x] = max_propagate_nan(partial[threadIdx.x], partial[threadIdx.x + stride * width]);
      }
      __syncthreads();
    }
    if (lane == 0) {
      const float scale = delayed_scale(partial[col], g.scale[j], fp8_max, margin_factor);
      g.scale[j] = scale;
      if (g.scale_inv) g.scale_inv[j] = 1.0f / scale;
    }
    __syncthreads();  // partial is reused, and the roll below overwrites rows read above
  }

  // 2. The roll, in place: rows 1 .. len-2 take rows 2 .. len-1, chunk by chunk upwards.
  // A chunk's loads come before its stores (the barrier), and later chunks read only
  // above what it wrote.
  const int64_t shifted_end = (len - 1) * cols;  // one past the last element written
  for (int64_t base = cols; base < shifted_end; base += int64_t(kThreads) * kRollPerThread) {
    float v[kRollPerThread];
#pragma unroll
    for (int k = 0; k < kRollPerThread; ++k) {
      const int64_t e = base + k * kThreads + threadIdx.x;
      if (e < shifted_end) v[k] = hist[e + cols];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kRollPerThread; ++k) {
      const int64_t e = base + k * kThreads + threadIdx.x;
      if (e < shifted_end) hist[e] = v[k];
    }
  }
  __syncthreads();
  // Row 0, which nothing above wrote, goes to the last row; then row 0 is zeroed for
  // the next step's casts (with one row, the same element: zero).
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const float first = hist[j];
    hist[(len - 1) * cols + j] = first;
    hist[j] = 0.0f;
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
