// Cast without transpose: a flat pass over the elements.
#pragma once

#include <stdint.h>

#include "common/cuda_elements.cuh"
#include "common/cuda_flat_loop.cuh"
#include "common/cuda_reduce.cuh"
#include "ops/quantize/vector_cast.cuh"

namespace opente {

constexpr int kCastThreads = 256;
// 16-byte loads each thread has in flight before it converts any.
constexpr int kCastUnroll = 4;

// kVectorized: input 16-byte and output 8-byte aligned, eight elements a step;
// the n % 8 tail (and everything, when not vectorized) goes element by element.
template <class In, te_dtype Out, bool kVectorized>
__global__ void __launch_bounds__(kCastThreads)
    cast_kernel(const In* __restrict__ in,          // [n]
                uint8_t* __restrict__ out,          // [n]
                const float* __restrict__ scale_ptr,
                float* __restrict__ scale_inv,      // may be null
                float* __restrict__ amax,           // may be null
                int64_t n) {
  const float scale = *scale_ptr;
  float local_amax = 0.0f;
  const int64_t num_vec = kVectorized ? n / 8 : 0;
  if constexpr (kVectorized) {
    auto* vout = reinterpret_cast<uint2*>(out);
    for_each_vector<kCastThreads, kCastUnroll>(reinterpret_cast<const Vec8<In>*>(in), num_vec,
                                               [&](int64_t v, const Vec8<In>& x) {
                                                 vout[v] = cast8_to_fp8<Out>(x, scale, local_amax);
                                               });
  }
  for_each_element(num_vec * 8, n, [&](int64_t i) {
    const float x = to_float(in[i]);
    local_amax = fmaxf(local_amax, fabsf(x));
    out[i] = float_to_fp8<Out>(x * scale);
  });
  if (amax) block_max_to_global<kCastThreads>(local_amax, amax);
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
}

}  // namespace opente
