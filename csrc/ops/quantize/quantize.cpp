// C API of the quantize family: validate the descriptors, then run the CPU
// reference or the CUDA kernels on the tensors' device.
#include "opente/quantize.h"

#include <cmath>

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/quantize/quantize_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";
constexpr const char* kFp8Dtypes = "float8_e4m3 or float8_e5m2";

// The checks of te_quantize, shared by te_quantize_current_scaling: the cast's params.
QuantizeParams checked_cast(const te_tensor* input_desc, const te_tensor* output_desc) {
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
  return QuantizeParams{in.data, out.data, out.columnwise_data, out.scale, out.scale_inv, out.amax,
                        m.rows, m.cols, te_dtype(in.dtype), te_dtype(out.dtype)};
}

}  // namespace

extern "C" te_status te_quantize(const te_tensor* input_desc, const te_tensor* output_desc, [[maybe_unused]] void* stream) {
  return run_op("te_quantize", [&] {
    const QuantizeParams p = checked_cast(input_desc, output_desc);
    if (input_desc->device.type == TE_DEVICE_CPU) {
      quantize_cpu(p);
    } else {
      OPENTE_CUDA_CALL("input", quantize_cuda(p, input_desc->device.index, stream));
    }
  });
}

extern "C" te_status te_quantize_current_scaling(const te_tensor* input_desc, const te_tensor* output_desc,
                                                 float epsilon, int force_pow_2_scales,
                                                 [[maybe_unused]] void* stream) {
  return run_op("te_quantize_current_scaling", [&] {
    QuantizeParams cast = checked_cast(input_desc, output_desc);
    check_pointer(output_desc->amax, "output", "amax");
    OPENTE_CHECK_ARG(std::isfinite(epsilon) && epsilon >= 0.0f, "epsilon must be finite and >= 0, got ", epsilon);
    const AmaxParams amax{cast.input, cast.amax, cast.rows * cast.cols, cast.in_dtype};
    // The scale step writes scale_inv (also for an empty input, which the cast skips);
    // the cast neither re-reduces amax nor rewrites scale_inv.
    const CurrentScalingParams scaling{cast.amax, output_desc->scale, cast.scale_inv, fp8_max(cast.out_dtype),
                                       epsilon, force_pow_2_scales != 0};
    cast.amax = nullptr;
    cast.scale_inv = nullptr;
    const CurrentScalingQuantizeParams p{amax, scaling, cast};
    if (input_desc->device.type == TE_DEVICE_CPU) {
      quantize_current_scaling_cpu(p);
    } else {
      OPENTE_CUDA_CALL("input", quantize_current_scaling_cuda(p, input_desc->device.index, stream));
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
