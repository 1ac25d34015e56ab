// Element access for the CPU reference implementations: read any float dtype
// as fp32 and write fp32 back with the project's rounding (float_formats.h).
#pragma once

#include <stdint.h>

#include "common/float_formats.h"
#include "opente/tensor.h"

namespace opente {

template <te_dtype D>
inline float load_as_float(const void* base, int64_t i) {
  if constexpr (D == TE_DTYPE_FLOAT32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (D == TE_DTYPE_FLOAT16) {
    return fp16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
  } else if constexpr (D == TE_DTYPE_BFLOAT16) {
    return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
  } else if constexpr (D == TE_DTYPE_FLOAT8_E4M3) {
    return fp8_bits_to_float<Fp8E4M3Traits>(static_cast<const uint8_t*>(base)[i]);
  } else {
    static_assert(D == TE_DTYPE_FLOAT8_E5M2, "load_as_float: not a float dtype");
    return fp8_bits_to_float<Fp8E5M2Traits>(static_cast<const uint8_t*>(base)[i]);
  }
}

template <te_dtype D>
inline void store_from_float(void* base, int64_t i, float v) {
  if constexpr (D == TE_DTYPE_FLOAT32) {
    static_cast<float*>(base)[i] = v;
  } else if constexpr (D == TE_DTYPE_FLOAT16) {
    static_cast<uint16_t*>(base)[i] = float_to_fp16_bits(v);
  } else if constexpr (D == TE_DTYPE_BFLOAT16) {
    static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v);
  } else if constexpr (D == TE_DTYPE_FLOAT8_E4M3) {
    static_cast<uint8_t*>(base)[i] = float_to_fp8_bits<Fp8E4M3Traits>(v);
  } else {
    static_assert(D == TE_DTYPE_FLOAT8_E5M2, "store_from_float: not a float dtype");
    static_cast<uint8_t*>(base)[i] = float_to_fp8_bits<Fp8E5M2Traits>(v);
  }
}

}  // namespace opente
