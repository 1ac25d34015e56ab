#include "common/dtype.h"

#include <string>

namespace opente {

bool dtype_is_valid(int32_t dtype) {
  switch (dtype) {
    case TE_DTYPE_UINT8:
    case TE_DTYPE_INT32:
    case TE_DTYPE_INT64:
    case TE_DTYPE_FLOAT32:
    case TE_DTYPE_FLOAT16:
    case TE_DTYPE_BFLOAT16:
    case TE_DTYPE_FLOAT8_E4M3:
    case TE_DTYPE_FLOAT8_E5M2: return true;
    default: return false;
  }
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case TE_DTYPE_UINT8: return "uint8";
    case TE_DTYPE_INT32: return "int32";
    case TE_DTYPE_INT64: return "int64";
    case TE_DTYPE_FLOAT32: return "float32";
    case TE_DTYPE_FLOAT16: return "float16";
    case TE_DTYPE_BFLOAT16: return "bfloat16";
    case TE_DTYPE_FLOAT8_E4M3: return "float8_e4m3";
    case TE_DTYPE_FLOAT8_E5M2: return "float8_e5m2";
    default: {
      thread_local std::string name;
      name = concat("invalid(", dtype, ")");
      return name.c_str();
    }
  }
}

size_t dtype_size(te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_UINT8:
    case TE_DTYPE_FLOAT8_E4M3:
    case TE_DTYPE_FLOAT8_E5M2: return 1;
    case TE_DTYPE_FLOAT16:
    case TE_DTYPE_BFLOAT16: return 2;
    case TE_DTYPE_INT32:
    case TE_DTYPE_FLOAT32: return 4;
    case TE_DTYPE_INT64: return 8;
  }
  fail(TE_ERROR_INTERNAL, concat("dtype_size: invalid dtype ", int(dtype)));
}

float fp8_max(te_dtype dtype) {
  if (dtype == TE_DTYPE_FLOAT8_E4M3) return 448.0f;
  if (dtype == TE_DTYPE_FLOAT8_E5M2) return 57344.0f;
  fail(TE_ERROR_INTERNAL, concat("fp8_max: not an FP8 dtype: ", dtype_name(dtype)));
}

}  // namespace opente
