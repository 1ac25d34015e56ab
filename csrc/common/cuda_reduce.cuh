// Reductions inside kernels: block-wide max of non-negative floats, folded into a
// global amax with one atomic per block or returned to every thread; compensated sums.
#pragma once

#include <stdint.h>

namespace opente {

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// For non-negative floats, the IEEE bit patterns order like the values, so an
// integer atomicMax is a float max. Both `*amax` and `v` must be >= 0 (and not NaN).
__device__ __forceinline__ void atomic_max_nonnegative(float* amax, float v) {
  atomicMax(reinterpret_cast<int*>(amax), __float_as_int(v));
}

// Every thread of the block calls this with its partial max; thread 0 updates
// *amax. kThreads is the block size (a multiple of 32, at most 1024).
template <int kThreads>
__device__ __forceinline__ void block_max_to_global(float v, float* amax) {
  __shared__ float warp_results[kThreads / 32];
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_results[lane] : 0.0f;
    v = warp_max(v);
    if (lane == 0) atomic_max_nonnegative(amax, v);
  }
}

// The block's max of non-negative floats, returned to every thread (all of them
// must call it). kThreads is the block size (a multiple of 32, at most 1024).
template <int kThreads>
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_results[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_max(v);
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  return warp_max(lane < kThreads / 32 ? warp_results[lane] : 0.0f);
}

// Compensated (Kahan) summation, for long sequential sums outside the hot loops
// (the partial sums of dbias, dgamma and dbeta over row blocks).
struct KahanSum {
  float sum = 0.0f, carry = 0.0f;
  __device__ __forceinline__ void add(float v) {
    const float y = v - carry;
    const float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
};

}  // namespace opente
