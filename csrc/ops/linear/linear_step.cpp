// The FP8 steps of a linear layer as one call each (opente/linear.h): every
// tensor's shape, dtype and device is checked first, then the composed ops run in
// the order Transformer Engine's Linear queues them. Device-neutral: the ops
// composed pick the CPU reference or the CUDA kernels.
#include "opente/linear.h"

#include "common/dtype.h"
#include "common/error.h"
#include "common/tensor_checks.h"
#include "opente/bias_grad.h"
#include "opente/gemm.h"
#include "opente/quantize.h"

using namespace opente;

namespace {

// A composed op's failure fails this op, with the composed op's message.
void check_status(te_status status) {
  if (status != TE_SUCCESS) fail(status, te_last_error_message());
}

// `t` (non-null) is the matrix [rows, cols] on `device`.
const te_tensor& checked_matrix(const te_tensor* t, const char* name, int64_t rows, int64_t cols,
                                const te_device& device, const char* device_of) {
  const te_tensor& m = checked_tensor(t, name);
  const MatrixShape shape = matrix_shape(m);
  OPENTE_CHECK_ARG(m.ndim >= 1 && shape.rows == rows && shape.cols == cols, name, " must be [", rows, ", ", cols,
                   "] as a matrix, got ", shape_string(m));
  check_same_device(device, device_of, m.device, name);
  return m;
}

void check_float(const te_tensor& t, const char* name) {
  check_dtype(t, name, is_high_precision_float(t.dtype), "float32, float16 or bfloat16");
}

// An FP8 cast's output (te_quantize's conventions; current scaling writes its amax)
// with the layouts the GEMMs read.
void check_fp8_cast(const te_tensor& t, const char* name, bool rowwise, bool columnwise,
                    const te_current_scaling* current) {
  check_dtype(t, name, is_fp8(t.dtype), "float8_e4m3 or float8_e5m2");
  check_per_tensor_scaling(t, name);
  check_pointer(t.scale, name, "scale");
  if (current) check_pointer(t.amax, name, "amax");
  const bool has_elements = numel(t) > 0;  // an empty tensor's buffers may be null
  if (rowwise && has_elements) check_pointer(t.data, name, "data");
  if (columnwise && has_elements) check_pointer(t.columnwise_data, name, "columnwise_data");
}

// The forward's FP8 copy an earlier call made, as a GEMM operand of the backward.
void check_fp8_operand(const te_tensor& t, const char* name) {
  check_dtype(t, name, is_fp8(t.dtype), "float8_e4m3 or float8_e5m2");
  check_per_tensor_scaling(t, name);
  if (numel(t) > 0) check_pointer(t.columnwise_data, name, "columnwise_data");
  check_pointer(t.scale_inv, name, "scale_inv");
}

// te_gemm's FP8 rule (m, n and k divisible by 16), checked before the casts run:
// rows, in and out are each of the three in one of the step's GEMMs.
void check_fp8_gemm_dims(int64_t rows, int64_t in, int64_t out) {
  OPENTE_CHECK_ARG(rows % 16 == 0 && in % 16 == 0 && out % 16 == 0,
                   "FP8 GEMMs need rows, in and out divisible by 16, got rows=", rows, ", in=", in, ", out=", out);
}

// An FP8 cast as a GEMM operand: its data and scale_inv, not the scale and amax the
// cast used (the GEMM reads neither).
te_tensor as_operand(const te_tensor& t) {
  te_tensor operand = t;
  operand.scale = nullptr;
  operand.amax = nullptr;
  return operand;
}

void linear_fp8_fwd(const te_tensor* input_desc, const te_tensor* weight_desc, const te_tensor* bias_desc,
                    const te_tensor* bias_converted_desc, const te_tensor* input_fp8_desc,
                    const te_tensor* weight_fp8_desc, const te_tensor* output_desc, const te_current_scaling* current,
                    int use_split_accumulator, void* workspace, size_t workspace_size, void* stream) {
  const te_tensor& input = checked_tensor(input_desc, "input");
  check_float(input, "input");
  OPENTE_CHECK_ARG(input.ndim >= 1, "input must have at least one dim, got a scalar");
  const auto [rows, in] = matrix_shape(input);
  const te_tensor& weight = checked_tensor(weight_desc, "weight");
  check_float(weight, "weight");
  OPENTE_CHECK_ARG(weight.ndim == 2 && weight.shape[1] == in, "weight must be [out, ", in,
                   "] (in = input's last dim), got ", shape_string(weight));
  const int64_t out = weight.shape[0];
  check_same_device(input.device, "input", weight.device, "weight");
  check_fp8_gemm_dims(rows, in, out);
  check_fp8_cast(checked_matrix(input_fp8_desc, "input_fp8", rows, in, input.device, "input"), "input_fp8", true, false,
                 current);
  check_fp8_cast(checked_matrix(weight_fp8_desc, "weight_fp8", out, in, input.device, "input"), "weight_fp8", true,
                 false, current);
  check_float(checked_matrix(output_desc, "output", rows, out, input.device, "input"), "output");
  if (bias_desc) check_float(checked_matrix(bias_desc, "bias", 1, out, input.device, "input"), "bias");
  if (bias_converted_desc) {
    OPENTE_CHECK_ARG(bias_desc, "bias_converted needs a bias to convert");
    check_float(checked_matrix(bias_converted_desc, "bias_converted", 1, out, input.device, "input"), "bias_converted");
  }

  const te_tensor casts_in[3] = {input, weight, bias_converted_desc ? *bias_desc : te_tensor{}};
  const te_tensor casts_out[3] = {*input_fp8_desc, *weight_fp8_desc,
                                  bias_converted_desc ? *bias_converted_desc : te_tensor{}};
  const size_t casts = bias_converted_desc ? 3 : 2;
  if (current) {
    check_status(te_multi_quantize_current_scaling(casts, casts_in, casts_out, current->epsilon,
                                                   current->force_pow_2_scales, stream));
  } else {
    check_status(te_multi_quantize(casts, casts_in, casts_out, stream));
  }

  const te_tensor* bias = bias_converted_desc ? bias_converted_desc : bias_desc;
  const te_gemm_config config{1,    0,    bias ? TE_GEMM_EPILOGUE_BIAS : TE_GEMM_EPILOGUE_NONE,
                              1.0f, 0.0f, use_split_accumulator ? 1 : 0};
  const te_tensor a = as_operand(*weight_fp8_desc);
  const te_tensor b = as_operand(*input_fp8_desc);
  check_status(te_gemm(&a, &b, output_desc, bias, nullptr, nullptr, &config, workspace, workspace_size, stream));
}

void linear_fp8_bwd(const te_tensor* grad_output_desc, const te_tensor* grad_output_fp8_desc,
                    const te_tensor* dbias_desc, const te_tensor* weight_fp8_desc, const te_tensor* input_fp8_desc,
                    const te_tensor* grad_input_desc, const te_tensor* grad_weight_desc,
                    const te_current_scaling* current, int split_accumulator_dgrad, int split_accumulator_wgrad,
                    void* dbias_workspace, size_t dbias_workspace_size, void* gemm_workspace,
                    size_t gemm_workspace_size, void* stream) {
  const te_tensor& dy = checked_tensor(grad_output_desc, "grad_output");
  check_float(dy, "grad_output");
  OPENTE_CHECK_ARG(dy.ndim >= 1, "grad_output must have at least one dim, got a scalar");
  const auto [rows, out] = matrix_shape(dy);
  OPENTE_CHECK_ARG(grad_input_desc || grad_weight_desc, "grad_input and grad_weight must not both be null");
  // in: from whichever of the forward's copies comes (the two must agree).
  const te_tensor& any_fp8 =
      checked_tensor(grad_input_desc ? weight_fp8_desc : input_fp8_desc, grad_input_desc ? "weight_fp8" : "input_fp8");
  OPENTE_CHECK_ARG(any_fp8.ndim >= 1, "the forward's FP8 copies must be matrices, got ", shape_string(any_fp8));
  const int64_t in = any_fp8.shape[any_fp8.ndim - 1];
  check_fp8_gemm_dims(rows, in, out);
  const te_tensor& dy_fp8 =
      checked_matrix(grad_output_fp8_desc, "grad_output_fp8", rows, out, dy.device, "grad_output");
  check_fp8_cast(dy_fp8, "grad_output_fp8", grad_input_desc != nullptr, grad_weight_desc != nullptr, current);
  if (grad_input_desc) {
    check_fp8_operand(checked_matrix(weight_fp8_desc, "weight_fp8", out, in, dy.device, "grad_output"), "weight_fp8");
    check_float(checked_matrix(grad_input_desc, "grad_input", rows, in, dy.device, "grad_output"), "grad_input");
  }
  if (grad_weight_desc) {
    check_fp8_operand(checked_matrix(input_fp8_desc, "input_fp8", rows, in, dy.device, "grad_output"), "input_fp8");
    check_float(checked_matrix(grad_weight_desc, "grad_weight", out, in, dy.device, "grad_output"), "grad_weight");
  }

  if (dbias_desc && current) {
    check_status(te_dbias_cast_transpose_current_scaling(&dy, grad_output_fp8_desc, dbias_desc, current->epsilon,
                                                         current->force_pow_2_scales, dbias_workspace,
                                                         dbias_workspace_size, stream));
  } else if (dbias_desc) {
    check_status(
        te_dbias_cast_transpose(&dy, grad_output_fp8_desc, dbias_desc, dbias_workspace, dbias_workspace_size, stream));
  } else if (current) {
    check_status(
        te_quantize_current_scaling(&dy, grad_output_fp8_desc, current->epsilon, current->force_pow_2_scales, stream));
  } else {
    check_status(te_quantize(&dy, grad_output_fp8_desc, stream));
  }
  const te_tensor dy_operand = as_operand(dy_fp8);
  if (grad_input_desc) {
    const te_gemm_config config{0, 0, TE_GEMM_EPILOGUE_NONE, 1.0f, 0.0f, split_accumulator_dgrad ? 1 : 0};
    const te_tensor w = as_operand(*weight_fp8_desc);
    check_status(te_gemm(&w, &dy_operand, grad_input_desc, nullptr, nullptr, nullptr, &config, gemm_workspace,
                         gemm_workspace_size, stream));
  }
  if (grad_weight_desc) {
    const te_gemm_config config{0, 1, TE_GEMM_EPILOGUE_NONE, 1.0f, 0.0f, split_accumulator_wgrad ? 1 : 0};
    const te_tensor x = as_operand(*input_fp8_desc);
    check_status(te_gemm(&x, &dy_operand, grad_weight_desc, nullptr, nullptr, nullptr, &config, gemm_workspace,
                         gemm_workspace_size, stream));
  }
}

}  // namespace

extern "C" te_status te_linear_fp8_fwd(const te_tensor* input, const te_tensor* weight, const te_tensor* bias,
                                       const te_tensor* bias_converted, const te_tensor* input_fp8,
                                       const te_tensor* weight_fp8, const te_tensor* output,
                                       const te_current_scaling* current_scaling, int use_split_accumulator,
                                       void* workspace, size_t workspace_size, void* stream) {
  return run_op("te_linear_fp8_fwd", [&] {
    linear_fp8_fwd(input, weight, bias, bias_converted, input_fp8, weight_fp8, output, current_scaling,
                   use_split_accumulator, workspace, workspace_size, stream);
  });
}

extern "C" te_status te_linear_fp8_bwd(const te_tensor* grad_output, const te_tensor* grad_output_fp8,
                                       const te_tensor* dbias, const te_tensor* weight_fp8, const te_tensor* input_fp8,
                                       const te_tensor* grad_input, const te_tensor* grad_weight,
                                       const te_current_scaling* current_scaling, int split_accumulator_dgrad,
                                       int split_accumulator_wgrad, void* dbias_workspace, size_t dbias_workspace_size,
                                       void* gemm_workspace, size_t gemm_workspace_size, void* stream) {
  return run_op("te_linear_fp8_bwd", [&] {
    linear_fp8_bwd(grad_output, grad_output_fp8, dbias, weight_fp8, input_fp8, grad_input, grad_weight, current_scaling,
                   split_accumulator_dgrad, split_accumulator_wgrad, dbias_workspace, dbias_workspace_size,
                   gemm_workspace, gemm_workspace_size, stream);
  });
}
