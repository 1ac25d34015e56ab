// Facts about te_dtype values, and the one switch that turns a runtime dtype
// into a compile-time one. Each op family calls dispatch_dtype() once and maps
// the DTypeTag to its own C++ element type (host structs on the CPU, CUDA's
// __half / __nv_bfloat16 in kernels).
#pragma once

#include <stddef.h>

#include "common/error.h"
#include "opente/tensor.h"

namespace opente {

const char* dtype_name(int32_t dtype);  // "bfloat16", or "invalid(42)"
bool dtype_is_valid(int32_t dtype);
size_t dtype_size(te_dtype dtype);
inline bool is_fp8(int32_t dtype) { return dtype == TE_DTYPE_FLOAT8_E4M3 || dtype == TE_DTYPE_FLOAT8_E5M2; }
inline bool is_high_precision_float(int32_t dtype) {
  return dtype == TE_DTYPE_FLOAT32 || dtype == TE_DTYPE_FLOAT16 || dtype == TE_DTYPE_BFLOAT16;
}
// Largest finite value of an FP8 format: 448 (E4M3) or 57344 (E5M2).
float fp8_max(te_dtype dtype);

template <te_dtype D>
struct DTypeTag {
  static constexpr te_dtype value = D;
};

// Calls f(DTypeTag<d>{}) for a float dtype d among fp32, fp16, bf16.
template <class F>
decltype(auto) dispatch_float_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT32: return f(DTypeTag<TE_DTYPE_FLOAT32>{});
    case TE_DTYPE_FLOAT16: return f(DTypeTag<TE_DTYPE_FLOAT16>{});
    case TE_DTYPE_BFLOAT16: return f(DTypeTag<TE_DTYPE_BFLOAT16>{});
    default: fail(TE_ERROR_INTERNAL, concat("dispatch_float_dtype: unexpected dtype ", dtype_name(dtype)));
  }
}

// Calls f(DTypeTag<d>{}) for d = float8_e4m3 or float8_e5m2.
template <class F>
decltype(auto) dispatch_fp8_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_FLOAT8_E4M3: return f(DTypeTag<TE_DTYPE_FLOAT8_E4M3>{});
    case TE_DTYPE_FLOAT8_E5M2: return f(DTypeTag<TE_DTYPE_FLOAT8_E5M2>{});
    default: fail(TE_ERROR_INTERNAL, concat("dispatch_fp8_dtype: unexpected dtype ", dtype_name(dtype)));
  }
}

// Calls f(DTypeTag<d>{}) for any float dtype d: fp32, fp16, bf16 or FP8.
template <class F>
decltype(auto) dispatch_any_float_dtype(int32_t dtype, F&& f) {
  if (is_fp8(dtype)) return dispatch_fp8_dtype(dtype, f);
  return dispatch_float_dtype(dtype, f);
}

}  // namespace opente
