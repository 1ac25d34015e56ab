// Element types and conversions inside CUDA kernels. The FP8 and narrowing
// conversions use the hardware instructions (cvt.rn.satfinite...), which the
// GPU tests check against the CPU reference (float_formats.h) bit for bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "opente/tensor.h"

namespace opente {

template <te_dtype D>
struct CudaType;
template <>
struct CudaType<TE_DTYPE_FLOAT32> {
  using type = float;
};
template <>
struct CudaType<TE_DTYPE_FLOAT16> {
  using type = __half;
};
template <>
struct CudaType<TE_DTYPE_BFLOAT16> {
  using type = __nv_bfloat16;
};

// One 16-byte or 8-byte global store of these 32-bit words, written out as PTX. As plain
// C++ stores, of a struct or of a uint4, the softmax's shifted rows' vectors (beside a
// branch of element stores) came out of the compiler as four 32-bit stores each (PTX);
// __stwb's st.global.wb came out as a strong store (STG.E.128.STRONG.SM, SASS). The
// "memory" clobber keeps the store in order with the other memory accesses, as a plain
// store is kept (the softmax kernels' SASS the same with it as without).
__device__ __forceinline__ void store_words(void* p, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w0), "r"(w1), "r"(w2), "r"(w3) : "memory");
}
__device__ __forceinline__ void store_words(void* p, uint32_t w0, uint32_t w1) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w0), "r"(w1) : "memory");
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x rounded to a float dtype's precision (float16 / bfloat16; anything else: x).
// Rounding is monotone, so the rounded max of some values is the max of the rounded
// values: a kernel's amax of what it stores, from the fp32 max.
__device__ __forceinline__ float rounded_as(te_dtype dtype, float x) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: return __half2float(__float2half_rn(x));
    case TE_DTYPE_BFLOAT16: return __bfloat162float(__float2bfloat16_rn(x));
    default: return x;
  }
}

template <te_dtype Fp8>
struct Fp8Interpretation {
  static_assert(Fp8 == TE_DTYPE_FLOAT8_E4M3 || Fp8 == TE_DTYPE_FLOAT8_E5M2, "not an FP8 dtype");
  static constexpr __nv_fp8_interpretation_t value = Fp8 == TE_DTYPE_FLOAT8_E4M3 ? __NV_E4M3 : __NV_E5M2;
};

// Round to nearest even, saturating to the largest finite value; NaN stays NaN.
template <te_dtype Fp8>
__device__ __forceinline__ uint8_t float_to_fp8(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, Fp8Interpretation<Fp8>::value);
}

// Two values at once (one cvt instruction): `lo` lands in the low byte.
template <te_dtype Fp8>
__device__ __forceinline__ uint16_t float2_to_fp8x2(float lo, float hi) {
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, Fp8Interpretation<Fp8>::value);
}

template <te_dtype Fp8>
__device__ __forceinline__ float fp8_to_float(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, Fp8Interpretation<Fp8>::value)));
}

// Eight consecutive elements, loaded and stored as one or two 16-byte vectors.
template <class T>
struct alignas(16) Vec8 {  // 16 or 32 bytes: one or two 128-bit accesses
  T v[8];
};

}  // namespace opente
