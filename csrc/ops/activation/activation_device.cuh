// Device-side pieces shared by the activation kernels (activation.cu) and the
// fused backward kernels (ops/bias_grad/): the host switch that turns the
// runtime activation into a template argument, and fp32 results to the
// output's element type, eight at a time.
#pragma once

#include <stdint.h>

#include "common/cuda_elements.cuh"
#include "common/error.h"
#include "common/fast_divmod.h"
#include "ops/activation/activation_params.h"

namespace opente {

template <te_activation B>
struct BaseTag {
  static constexpr te_activation value = B;
};

// Calls f(BaseTag<base>{}) for one of the five plain activations: each kernel is
// compiled per activation, so no per-element branch is left in the hot loops.
template <class F>
void dispatch_base_activation(te_activation base, F&& f) {
  switch (base) {
    case TE_ACTIVATION_GELU: return f(BaseTag<TE_ACTIVATION_GELU>{});
    case TE_ACTIVATION_QGELU: return f(BaseTag<TE_ACTIVATION_QGELU>{});
    case TE_ACTIVATION_RELU: return f(BaseTag<TE_ACTIVATION_RELU>{});
    case TE_ACTIVATION_SRELU: return f(BaseTag<TE_ACTIVATION_SRELU>{});
    case TE_ACTIVATION_SILU: return f(BaseTag<TE_ACTIVATION_SILU>{});
    default: fail(TE_ERROR_INTERNAL, concat("dispatch_base_activation: not a plain activation: ", int(base)));
  }
}

// y[0..8) * scale as eight FP8 bytes (element order, low byte first).
template <te_dtype Fp8>
__device__ __forceinline__ uint2 pack8_fp8(const float (&y)[8], float scale) {
  uint32_t words[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const uint32_t lo = float2_to_fp8x2<Fp8>(act_mul(y[4 * w], scale), act_mul(y[4 * w + 1], scale));
    const uint32_t hi = float2_to_fp8x2<Fp8>(act_mul(y[4 * w + 2], scale), act_mul(y[4 * w + 3], scale));
    words[w] = lo | (hi << 16);
  }
  return make_uint2(words[0], words[1]);
}

// The output dtype is a run-time value in every kernel (a branch that is the same
// for all threads, taken once per eight elements): templates over it would
// multiply the kernels and the build time for no measurable work per element.
__device__ __forceinline__ bool is_fp8_dtype(te_dtype dtype) {
  return dtype == TE_DTYPE_FLOAT8_E4M3 || dtype == TE_DTYPE_FLOAT8_E5M2;
}

// The same value, hidden from the optimizer. Given a branch on a kernel-wide value
// (the output dtype, a null pointer) inside an unrolled loop, the compiler copied
// the whole loop, activation math included, once per outcome ("unswitching"):
// up to ten copies per kernel, and minutes of build time. Passed through an empty
// asm statement in each iteration, the value is new every time, so only the
// branch itself is repeated.
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}
template <class T>
__device__ __forceinline__ T* opaque(T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

template <class T>
__device__ __forceinline__ void store8_as(void* base, int64_t i, const float (&y)[8]) {
  Vec8<T> v;
#pragma unroll
  for (int k = 0; k < 8; ++k) v.v[k] = from_float<T>(y[k]);
  *reinterpret_cast<Vec8<T>*>(static_cast<T*>(base) + i) = v;
}

// Elements [i, i + 8) of a float32 / float16 / bfloat16 tensor (16-byte aligned).
__device__ __forceinline__ void store8_float(void* base, te_dtype dtype, int64_t i, const float (&y)[8]) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: store8_as<__half>(base, i, y); break;
    case TE_DTYPE_BFLOAT16: store8_as<__nv_bfloat16>(base, i, y); break;
    default: store8_as<float>(base, i, y);
  }
}

__device__ __forceinline__ void store1_float(void* base, te_dtype dtype, int64_t i, float y) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: static_cast<__half*>(base)[i] = __float2half_rn(y); break;
    case TE_DTYPE_BFLOAT16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(y); break;
    default: static_cast<float*>(base)[i] = y;
  }
}

// Writes y[0..8) * scale (FP8) or y[0..8) (float) to elements [i, i + 8) of `out`
// (FP8: 8-byte, float: 16-byte aligned) unless it is null, and returns the FP8
// bytes (zero for a float output). Callers pass `dtype` and `out` through opaque().
__device__ __forceinline__ uint2 emit8(te_dtype dtype, void* out, int64_t i, const float (&y)[8], float scale) {
  uint2 q = make_uint2(0u, 0u);
  switch (dtype) {
    case TE_DTYPE_FLOAT8_E4M3: q = pack8_fp8<TE_DTYPE_FLOAT8_E4M3>(y, scale); break;
    case TE_DTYPE_FLOAT8_E5M2: q = pack8_fp8<TE_DTYPE_FLOAT8_E5M2>(y, scale); break;
    default:
      if (out) store8_float(out, dtype, i, y);
      return q;
  }
  if (out) *reinterpret_cast<uint2*>(static_cast<uint8_t*>(out) + i) = q;
  return q;
}

// One FP8 byte of y * scale, the FP8 dtype known at run time (the generic paths).
__device__ __forceinline__ uint8_t fp8_code(te_dtype dtype, float scaled) {
  return dtype == TE_DTYPE_FLOAT8_E4M3 ? float_to_fp8<TE_DTYPE_FLOAT8_E4M3>(scaled)
                                       : float_to_fp8<TE_DTYPE_FLOAT8_E5M2>(scaled);
}

// Element i of `out`: y * scale as FP8, or y as a float dtype.
__device__ __forceinline__ void emit1(te_dtype dtype, void* out, int64_t i, float y, float scale) {
  if (is_fp8_dtype(dtype)) {
    static_cast<uint8_t*>(out)[i] = fp8_code(dtype, act_mul(y, scale));
  } else {
    store1_float(out, dtype, i, y);
  }
}

template <class In>
__device__ __forceinline__ void to_float8(const Vec8<In>& x, float (&v)[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = to_float(x.v[k]);
}

}  // namespace opente
