// amax = max(amax, max|x|): a flat reduction, one atomic per block.
#include "common/cuda_elements.cuh"
#include "common/cuda_flat_loop.cuh"
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
  const int64_t num_vec = kVectorized ? n / 8 : 0;
  if constexpr (kVectorized) {
    for_each_vector<kThreads, kUnroll>(reinterpret_cast<const Vec8<In>*>(in), num_vec,
                                       [&](int64_t, const Vec8<In>& x) {
#pragma unroll
                                         for (int k = 0; k < 8; ++k) local_amax = fmaxf(local_amax, fabsf(to_float(x.v[k])));
                                       });
  }
  for_each_element(num_vec * 8, n, [&](int64_t i) { local_amax = fmaxf(local_amax, fabsf(to_float(in[i]))); });
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
    const auto kernel = vectorized ? amax_kernel<In, true> : amax_kernel<In, false>;
    const int64_t work = vectorized ? p.numel / 8 / kUnroll + 1 : p.numel;
    const int64_t grid = grid_stride_blocks((const void*)kernel, kThreads, work, device);
    kernel<<<grid, kThreads, 0, as_stream(stream)>>>(in, p.amax, p.numel);
    check_launch("amax_kernel");
  });
}

}  // namespace opente
