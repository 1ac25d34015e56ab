// Validation of te_tensor descriptors at the C API boundary. Each check throws
// opente::Error with a message that names the argument, what was expected and
// what was given; run_op() prefixes the op's name.
#pragma once

#include <stdint.h>

#include <string>

#include "common/dtype.h"
#include "opente/tensor.h"

namespace opente {

// A tensor [d0, ..., dn-1] seen as the matrix [d0*...*dn-2, dn-1].
struct MatrixShape {
  int64_t rows;
  int64_t cols;
};

int64_t numel(const te_tensor& t);
MatrixShape matrix_shape(const te_tensor& t);
std::string shape_string(const te_tensor& t);
std::string device_string(const te_device& d);

// The descriptor is non-null and well formed: ndim in [0, 8], dims >= 0, a known
// dtype, device and scaling mode. CUDA tensors in a build without CUDA raise
// TE_ERROR_NOT_IMPLEMENTED.
const te_tensor& checked_tensor(const te_tensor* t, const char* arg);

void check_device(const te_device& d, const char* arg);
void check_same_shape(const te_tensor& a, const char* a_name, const te_tensor& b, const char* b_name);
void check_same_device(const te_device& a, const char* a_name, const te_device& b, const char* b_name);
// `what` is e.g. "float32, float16 or bfloat16".
void check_dtype(const te_tensor& t, const char* arg, bool ok, const char* what);
// A pointer the op needs: non-null (data pointers only when the tensor has elements).
void check_pointer(const void* p, const char* arg, const char* field);
// A quantized tensor with one scale: block scaling modes raise TE_ERROR_NOT_IMPLEMENTED.
void check_per_tensor_scaling(const te_tensor& t, const char* arg);

[[noreturn]] void fail_without_cuda(const char* arg);

}  // namespace opente

// Calls a CUDA implementation; in a build without CUDA, a clear error instead.
#if OPENTE_WITH_CUDA
#define OPENTE_CUDA_CALL(arg, call) call
#else
#define OPENTE_CUDA_CALL(arg, call) ::opente::fail_without_cuda(arg)
#endif
