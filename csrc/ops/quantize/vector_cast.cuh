// Eight elements to eight FP8 bytes, with their amax, the building block of the
// cast kernels.
#pragma once

#include <stdint.h>

#include "common/cuda_elements.cuh"

namespace opente {

// Casts x * scale to FP8 (bytes in element order, little end first) and folds
// max|x| (NaNs skipped by fmaxf) into `amax`.
template <te_dtype Out, class In>
__device__ __forceinline__ uint2 cast8_to_fp8(const Vec8<In>& x, float scale, float& amax) {
  uint32_t words[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    uint32_t packed = 0;
#pragma unroll
    for (int pair = 0; pair < 2; ++pair) {
      const float a = to_float(x.v[w * 4 + pair * 2]);
      const float b = to_float(x.v[w * 4 + pair * 2 + 1]);
      amax = fmaxf(amax, fmaxf(fabsf(a), fabsf(b)));
      packed |= uint32_t(float2_to_fp8x2<Out>(a * scale, b * scale)) << (16 * pair);
    }
    words[w] = packed;
  }
  return make_uint2(words[0], words[1]);
}

}  // namespace opente
