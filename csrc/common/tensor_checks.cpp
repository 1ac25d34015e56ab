#include "common/tensor_checks.h"

namespace opente {

int64_t numel(const te_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}

MatrixShape matrix_shape(const te_tensor& t) {
  if (t.ndim == 0) return {1, 1};
  const int64_t cols = t.shape[t.ndim - 1];
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) rows *= t.shape[i];
  return {rows, cols};
}

std::string shape_string(const te_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

std::string device_string(const te_device& d) {
  if (d.type == TE_DEVICE_CPU) return "cpu";
  return concat("cuda:", d.index);
}

[[noreturn]] void fail_without_cuda(const char* arg) {
  fail(TE_ERROR_NOT_IMPLEMENTED,
       concat(arg, " is a CUDA tensor, but this build of OpenTE has no CUDA kernels "
                   "(nvcc was not found when it was built)"));
}

void check_device(const te_device& d, const char* arg) {
  OPENTE_CHECK_ARG(d.type == TE_DEVICE_CPU || d.type == TE_DEVICE_CUDA, arg,
                   " device type must be cpu (0) or cuda (1), got ", d.type);
  OPENTE_CHECK_ARG(d.type == TE_DEVICE_CUDA ? d.index >= 0 : d.index == 0, arg, " device index must be ",
                   d.type == TE_DEVICE_CUDA ? ">= 0" : "0 for the CPU", ", got ", d.index);
#if !OPENTE_WITH_CUDA
  if (d.type == TE_DEVICE_CUDA) fail_without_cuda(arg);
#endif
}

const te_tensor& checked_tensor(const te_tensor* t, const char* arg) {
  OPENTE_CHECK_ARG(t != nullptr, arg, " must not be null");
  OPENTE_CHECK_ARG(t->ndim >= 0 && t->ndim <= TE_MAX_DIMS, arg, " ndim must be in [0, ", TE_MAX_DIMS,
                   "], got ", t->ndim);
  int64_t elements = 1;
  for (int i = 0; i < t->ndim; ++i) {
    OPENTE_CHECK_ARG(t->shape[i] >= 0, arg, " shape must not be negative, got ", shape_string(*t));
    // Every later size computation multiplies dims: reject a count int64 cannot hold.
    OPENTE_CHECK_ARG(!__builtin_mul_overflow(elements, t->shape[i], &elements), arg, " shape ", shape_string(*t),
                     " has more elements than int64 can count");
  }
  OPENTE_CHECK_ARG(dtype_is_valid(t->dtype), arg, " dtype is not a te_dtype: ", t->dtype);
  OPENTE_CHECK_ARG(t->scaling_mode >= TE_SCALING_NONE && t->scaling_mode <= TE_SCALING_BLOCK_2D, arg,
                   " scaling_mode is not a te_scaling_mode: ", t->scaling_mode);
  check_device(t->device, arg);
  return *t;
}

void check_same_shape(const te_tensor& a, const char* a_name, const te_tensor& b, const char* b_name) {
  bool same = a.ndim == b.ndim;
  for (int i = 0; same && i < a.ndim; ++i) same = a.shape[i] == b.shape[i];
  OPENTE_CHECK_ARG(same, b_name, " shape ", shape_string(b), " must equal ", a_name, " shape ",
                   shape_string(a));
}

void check_same_device(const te_device& a, const char* a_name, const te_device& b, const char* b_name) {
  OPENTE_CHECK_ARG(a.type == b.type && (a.type == TE_DEVICE_CPU || a.index == b.index), b_name,
                   " is on ", device_string(b), " but ", a_name, " is on ", device_string(a));
}

void check_dtype(const te_tensor& t, const char* arg, bool ok, const char* what) {
  OPENTE_CHECK_ARG(ok, arg, " dtype must be ", what, ", got ", dtype_name(t.dtype));
}

void check_pointer(const void* p, const char* arg, const char* field) {
  OPENTE_CHECK_ARG(p != nullptr, arg, ".", field, " must not be null");
}

void check_per_tensor_scaling(const te_tensor& t, const char* arg) {
  if (t.scaling_mode == TE_SCALING_BLOCK_1D || t.scaling_mode == TE_SCALING_BLOCK_2D) {
    fail(TE_ERROR_NOT_IMPLEMENTED, concat(arg, " scaling_mode ",
                                          t.scaling_mode == TE_SCALING_BLOCK_1D ? "1x128" : "128x128",
                                          " block scaling is not implemented yet"));
  }
  OPENTE_CHECK_ARG(t.scaling_mode == TE_SCALING_PER_TENSOR, arg, " scaling_mode must be per-tensor (1), got ",
                   t.scaling_mode);
}

}  // namespace opente
