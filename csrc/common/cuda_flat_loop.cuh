// The loop of the flat, memory-bound kernels (cast, dequantize, amax).
//
// Vectors go in block-contiguous chunks of kThreads * kUnroll: each warp access
// is contiguous, and each block walks one contiguous stretch of memory at a
// time (better DRAM locality than a thread-strided walk). The grid strides over
// chunks. Each thread issues all kUnroll loads before handling any, so several
// 16-byte loads per thread are in flight.
#pragma once

#include <stdint.h>

namespace opente {

template <int kThreads, int kUnroll, class Vec, class Handle>
__device__ __forceinline__ void for_each_vector(const Vec* __restrict__ in, int64_t num_vec, Handle&& handle) {
  constexpr int64_t kChunk = int64_t(kThreads) * kUnroll;
  for (int64_t chunk = int64_t(blockIdx.x) * kChunk; chunk < num_vec; chunk += int64_t(gridDim.x) * kChunk) {
    Vec x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = chunk + u * kThreads + threadIdx.x;
      if (v < num_vec) x[u] = in[v];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = chunk + u * kThreads + threadIdx.x;
      if (v < num_vec) handle(v, x[u]);
    }
  }
}

// Element by element over [first, n), grid-strided: the tail past the vectors,
// or everything when the pointers are not aligned for vector access.
template <class Handle>
__device__ __forceinline__ void for_each_element(int64_t first, int64_t n, Handle&& handle) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = first + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) handle(i);
}

}  // namespace opente
