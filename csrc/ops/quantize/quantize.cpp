// C API of the quantize family: validate the descriptors, then run the CPU
// reference or the CUDA kernels on the tensors' device.
#include "opente/quantize.h"

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/quantize/quantize_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";
constexpr const char* kFp8Dtypes = "float8_e4m3 or float8_e5m2";

}  // namespace

extern "C" te_status te_quantize(const te_tensor* input_desc, const te_tensor* output_desc, [[maybe_unused]] void* stream) {
  return run_op("te_quantize", [&] {
    const te_tensor& in = checked_tensor(input_desc, "input");
    const te_tensor& out = checked_tensor(output_desc, "output");
    check_dtype(in, "input", is_high_precision_float(in.dtype), kFloatDtypes);
    check_dtype(out, "output", is_fp8(out.dtype), kFp8Dtypes);
    check_per_tensor_scaling(out, "output");
    check_same_shape(in, "input", out, "output");
    check_same_device(in.device, "input", out.device, "output");
    check_pointer(out.scale, "output", "scale");
    const MatrixShape m = matrix_shape(in);
    if (m.rows * m.cols > 0) {
      check_pointer(in.data, "input", "data");
      OPENTE_CHECK_ARG(out.data || out.columnwise_data,
                       "output.data and output.columnwise_data must not both be null");
    }

    const QuantizeParams p{in.data, out.data, out.columnwise_data, out.scale, out.scale_inv, out.amax,
                           m.rows, m.cols, te_dtype(in.dtype), te_dtype(out.dtype)};
    if (in.device.type == TE_DEVICE_CPU) {
      quantize_cpu(p);
    } else {
      OPENTE_CUDA_CALL("input", quantize_cuda(p, in.device.index, stream));
    }
  });
}

extern "C" te_status te_dequantize(const te_tensor* input_desc, const te_tensor* output_desc, [[maybe_unused]] void* stream) {
  return run_op("te_dequantize", [&] {
    const te_tensor& in = checked_tensor(input_desc, "input");
    const te_tensor& out = checked_tensor(output_desc, "output");
    check_dtype(in, "input", is_fp8(in.dtype), kFp8Dtypes);
    check_dtype(out, "output", is_high_precision_float(out.dtype), kFloatDtypes);
    check_per_tensor_scaling(in, "input");
    check_same_shape(in, "input", out, "output");
    check_same_device(in.device, "input", out.device, "output");
    check_pointer(in.scale_inv, "input", "scale_inv");
    const int64_t n = numel(in);
    if (n > 0) {
      check_pointer(in.data, "input", "data");
      check_pointer(out.data, "output", "data");
    }

    const DequantizeParams p{in.data, out.data, in.scale_inv, n, te_dtype(in.dtype), te_dtype(out.dtype)};
    if (in.device.type == TE_DEVICE_CPU) {
      dequantize_cpu(p);
    } else {
      OPENTE_CUDA_CALL("input", dequantize_cuda(p, in.device.index, stream));
    }
  });
}

extern "C" te_status te_compute_amax(const te_tensor* input_desc, float* amax, [[maybe_unused]] void* stream) {
  return run_op("te_compute_amax", [&] {
    const te_tensor& in = checked_tensor(input_desc, "input");
    check_dtype(in, "input", is_high_precision_float(in.dtype), kFloatDtypes);
    OPENTE_CHECK_ARG(amax != nullptr, "amax must not be null");
    const int64_t n = numel(in);
    if (n > 0) check_pointer(in.data, "input", "data");

    const AmaxParams p{in.data, amax, n, te_dtype(in.dtype)};
    if (in.device.type == TE_DEVICE_CPU) {
      amax_cpu(p);
    } else {
      OPENTE_CUDA_CALL("input", amax_cuda(p, in.device.index, stream));
    }
  });
}
