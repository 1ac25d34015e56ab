// C API of the quantize family: validate the descriptors, then run the CPU
// reference or the CUDA kernels on the tensors' device.
#include "opente/quantize.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/quantize/quantize_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";
constexpr const char* kFp8Dtypes = "float8_e4m3 or float8_e5m2";

// The checks of te_quantize, shared by te_quantize_current_scaling and the multi
// casts (whose arguments are named inputs[i] / outputs[i]): the cast's params.
QuantizeParams checked_cast(const te_tensor* input_desc, const te_tensor* output_desc, const char* in_name = "input",
                            const char* out_name = "output") {
  const te_tensor& in = checked_tensor(input_desc, in_name);
  const te_tensor& out = checked_tensor(output_desc, out_name);
  check_dtype(in, in_name, is_high_precision_float(in.dtype), kFloatDtypes);
  check_dtype(out, out_name, is_fp8(out.dtype), kFp8Dtypes);
  check_per_tensor_scaling(out, out_name);
  check_same_shape(in, in_name, out, out_name);
  check_same_device(in.device, in_name, out.device, out_name);
  check_pointer(out.scale, out_name, "scale");
  const MatrixShape m = matrix_shape(in);
  if (m.rows * m.cols > 0) {
    check_pointer(in.data, in_name, "data");
    OPENTE_CHECK_ARG(out.data || out.columnwise_data, out_name, ".data and ", out_name,
                     ".columnwise_data must not both be null");
  }
  return QuantizeParams{in.data, out.data, out.columnwise_data, out.scale, out.scale_inv, out.amax,
                        m.rows, m.cols, te_dtype(in.dtype), te_dtype(out.dtype)};
}

// A conversion pair of te_multi_quantize* (a float output), checked: the output takes
// data only, none of an FP8 output's fields.
QuantizeJob checked_conversion(const te_tensor* input_desc, const te_tensor* output_desc, const char* in_name,
                               const char* out_name) {
  const te_tensor& in = checked_tensor(input_desc, in_name);
  const te_tensor& out = checked_tensor(output_desc, out_name);
  check_dtype(in, in_name, is_high_precision_float(in.dtype), kFloatDtypes);
  check_same_shape(in, in_name, out, out_name);
  check_same_device(in.device, in_name, out.device, out_name);
  OPENTE_CHECK_ARG(!out.columnwise_data && !out.scale && !out.scale_inv && !out.amax, out_name,
                   " is a conversion (a ", dtype_name(out.dtype), " output): its columnwise_data, scale, scale_inv "
                   "and amax must be null");
  const MatrixShape m = matrix_shape(in);
  if (m.rows * m.cols > 0) {
    check_pointer(in.data, in_name, "data");
    check_pointer(out.data, out_name, "data");
  }
  QuantizeJob job{};
  job.cast = QuantizeParams{in.data, out.data, nullptr, nullptr, nullptr, nullptr,
                            m.rows, m.cols, te_dtype(in.dtype), te_dtype(out.dtype)};
  return job;
}

// A cast with the given scale (current_scaling false) or by current scaling, checked.
QuantizeJob checked_job(const te_tensor* input_desc, const te_tensor* output_desc, bool current_scaling,
                        float epsilon, int force_pow_2_scales, const char* in_name = "input",
                        const char* out_name = "output") {
  QuantizeJob job{checked_cast(input_desc, output_desc, in_name, out_name), nullptr, nullptr, 0.0f, 0.0f, false};
  if (current_scaling) {
    check_pointer(output_desc->amax, out_name, "amax");
    OPENTE_CHECK_ARG(std::isfinite(epsilon) && epsilon >= 0.0f, "epsilon must be finite and >= 0, got ", epsilon);
    job.amax_out = job.cast.amax;  // written, not raised
    job.scale_out = static_cast<float*>(output_desc->scale);
    job.cast.amax = nullptr;
    job.fp8_max = fp8_max(job.cast.out_dtype);
    job.epsilon = epsilon;
    job.force_pow_2_scales = force_pow_2_scales != 0;
  }
  return job;
}

void quantize_job_cpu(const QuantizeJob& job) {
  if (is_conversion(job)) {
    convert_cpu(job.cast);
  } else if (job.scale_out) {
    quantize_current_scaling_cpu(current_scaling_steps(job));
  } else {
    quantize_cpu(job.cast);
  }
}

// te_multi_quantize*: every pair checked before anything runs, all on one device.
te_status run_multi_quantize(const char* op, size_t count, const te_tensor* inputs, const te_tensor* outputs,
                             bool current_scaling, float epsilon, int force_pow_2_scales,
                             [[maybe_unused]] void* stream) {
  return run_op(op, [&] {
    OPENTE_CHECK_ARG(count == 0 || (inputs && outputs), "inputs and outputs must not be null");
    std::vector<QuantizeJob> jobs;
    jobs.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      const std::string in_name = "inputs[" + std::to_string(i) + "]";
      const std::string out_name = "outputs[" + std::to_string(i) + "]";
      if (is_high_precision_float(outputs[i].dtype)) {
        jobs.push_back(checked_conversion(&inputs[i], &outputs[i], in_name.c_str(), out_name.c_str()));
      } else {
        jobs.push_back(checked_job(&inputs[i], &outputs[i], current_scaling, epsilon, force_pow_2_scales,
                                   in_name.c_str(), out_name.c_str()));
      }
      if (i > 0) check_same_device(inputs[i].device, in_name.c_str(), inputs[0].device, "inputs[0]");
    }
    if (count == 0) return;
    if (inputs[0].device.type == TE_DEVICE_CPU) {
      for (const QuantizeJob& job : jobs) quantize_job_cpu(job);
    } else {
      OPENTE_CUDA_CALL("inputs", multi_quantize_cuda(jobs.data(), int64_t(count), inputs[0].device.index, stream));
    }
  });
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
    const QuantizeJob job = checked_job(input_desc, output_desc, true, epsilon, force_pow_2_scales);
    if (input_desc->device.type == TE_DEVICE_CPU) {
      quantize_job_cpu(job);
    } else {
      OPENTE_CUDA_CALL("input", quantize_current_scaling_cuda(job, input_desc->device.index, stream));
    }
  });
}

extern "C" te_status te_multi_quantize(size_t count, const te_tensor* inputs, const te_tensor* outputs,
                                       void* stream) {
  return run_multi_quantize("te_multi_quantize", count, inputs, outputs, false, 0.0f, 0, stream);
}

extern "C" te_status te_multi_quantize_current_scaling(size_t count, const te_tensor* inputs,
                                                       const te_tensor* outputs, float epsilon,
                                                       int force_pow_2_scales, void* stream) {
  return run_multi_quantize("te_multi_quantize_current_scaling", count, inputs, outputs, true, epsilon,
                            force_pow_2_scales, stream);
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
