// Cast without transpose: a flat, grid-stride pass over the elements.
#pragma once

#include <stdint.h>

#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "ops/quantize/vector_cast.cuh"

namespace opente {

constexpr int kCastThreads = 256;
// Vectors each thread loads before it converts any: keeps 4 x 16 bytes in
// flight per thread, enough to cover memory latency at full occupancy.
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
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t tail_start = 0;
  if constexpr (kVectorized) {
    const int64_t num_vec = n / 8;
    const auto* vin = reinterpret_cast<const Vec8<In>*>(in);
    auto* vout = reinterpret_cast<uint2*>(out);
    for (int64_t base = tid; base < num_vec; base += stride * kCastUnroll) {
      Vec8<In> x[kCastUnroll];
#pragma unroll
      for (int u = 0; u < kCastUnroll; ++u) {
        if (base + u * stride < num_vec) x[u] = vin[base + u * stride];
      }
#pragma unroll
      for (int u = 0; u < kCastUnroll; ++u) {
        if (base + u * stride < num_vec) vout[base + u * stride] = cast8_to_fp8<Out>(x[u], scale, local_amax);
      }
    }
    tail_start = num_vec * 8;
  }
  for (int64_t i = tail_start + tid; i < n; i += stride) {
    const float x = to_float(in[i]);
    local_amax = fmaxf(local_amax, fabsf(x));
    out[i] = float_to_fp8<Out>(x * scale);
  }
  if (amax) block_max_to_global<kCastThreads>(local_amax, amax);
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
}

}  // namespace opente
