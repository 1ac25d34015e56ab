// amax = max(amax, max|x|): a flat reduction, one atomic per block.
#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/quantize/quantize_params.h"

namespace opente {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <class In, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const In* __restrict__ in,  // [n]
                float* __restrict__ amax, int64_t n) {
  float local_amax = 0.0f;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t tail_start = 0;
  if constexpr (kVectorized) {
    const int64_t num_vec = n / 8;
    const auto* vin = reinterpret_cast<const Vec8<In>*>(in);
    for (int64_t base = tid; base < num_vec; base += stride * kUnroll) {
      Vec8<In> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * stride < num_vec) x[u] = vin[base + u * stride];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (base + u * stride < num_vec) {
#pragma unroll
          for (int k = 0; k < 8; ++k) local_amax = fmaxf(local_amax, fabsf(to_float(x[u].v[k])));
        }
      }
    }
    tail_start = num_vec * 8;
  }
  for (int64_t i = tail_start + tid; i < n; i += stride) local_amax = fmaxf(local_amax, fabsf(to_float(in[i])));
  block_max_to_global<kThreads>(local_amax, amax);
}

}  // namespace

void amax_cuda(const AmaxParams& p, int device, void* stream) {
  if (p.numel == 0) return;
  DeviceGuard guard(device);
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using In = typename CudaType<decltype(tag)::value>::type;
    const auto* in = static_cast<const In*>(p.input);
    const bool vectorized = is_aligned(in, 16);
    const int64_t grid = grid_stride_blocks(vectorized ? p.numel / 8 / kUnroll + 1 : p.numel, kThreads, device);
    if (vectorized) {
      amax_kernel<In, true><<<grid, kThreads, 0, as_stream(stream)>>>(in, p.amax, p.numel);
    } else {
      amax_kernel<In, false><<<grid, kThreads, 0, as_stream(stream)>>>(in, p.amax, p.numel);
    }
    check_launch("amax_kernel");
  });
}

}  // namespace opente
