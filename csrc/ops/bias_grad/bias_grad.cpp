// C API of the bias-gradient casts: validate the descriptors, then run the CPU
// reference or the CUDA kernels on grad's device.
#include "opente/bias_grad.h"

#include <cmath>

#include "common/dtype.h"
#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/activation/activation_checks.h"
#include "ops/activation/activation_params.h"
#include "ops/bias_grad/bias_grad_params.h"

using namespace opente;

namespace {

// An FP8 output with te_quantize's conventions; `n` elements.
void check_fp8_output(const te_tensor& out, int64_t n) {
  check_per_tensor_scaling(out, "output");
  check_pointer(out.scale, "output", "scale");
  if (n > 0) {
    OPENTE_CHECK_ARG(out.data || out.columnwise_data, "output.data and output.columnwise_data must not both be null");
  }
}

// dbias: [cols] in `like`'s dtype or float32 (the sums unrounded: an fp32 bias's
// gradient under torch.autocast) on its device.
void check_dbias(const te_tensor& dbias, const te_tensor& like, const char* like_name, int64_t cols) {
  OPENTE_CHECK_ARG(dbias.dtype == like.dtype || dbias.dtype == TE_DTYPE_FLOAT32, "dbias dtype must be ",
                   like_name, "'s (", dtype_name(like.dtype), ") or float32, got ", dtype_name(dbias.dtype));
  OPENTE_CHECK_ARG(dbias.ndim == 1 && dbias.shape[0] == cols, "dbias shape must be [", cols, "] (the last dim of ",
                   like_name, " ", shape_string(like), "), got ", shape_string(dbias));
  check_same_device(like.device, like_name, dbias.device, "dbias");
  if (cols > 0) check_pointer(dbias.data, "dbias", "data");
}

void check_workspace(const te_device& device, int64_t rows, int64_t cols, const void* workspace,
                     size_t workspace_size) {
  const size_t need = te_dbias_workspace_size(rows, cols, device);
  OPENTE_CHECK_ARG(workspace_size >= need, "workspace must be at least ", need, " bytes (te_dbias_workspace_size(",
                   rows, ", ", cols, ")), got ", workspace_size);
  if (need > 0) check_pointer(workspace, "workspace", "pointer");
}

void run(const DbiasCastParams& p, const te_device& device, [[maybe_unused]] void* workspace,
         [[maybe_unused]] void* stream) {
  if (device.type == TE_DEVICE_CPU) {
    dbias_cast_cpu(p);
  } else {
    OPENTE_CUDA_CALL("grad", dbias_cast_cuda(p, device.index, workspace, stream));
  }
}

// The checked params of te_dbias_cast_transpose (with the output's amax and scale_inv,
// which the current-scaling variant takes out again).
DbiasCastParams checked_dbias_cast(const te_tensor* grad_desc, const te_tensor* output_desc,
                                   const te_tensor* dbias_desc, void* workspace, size_t workspace_size) {
  const te_tensor& grad = checked_tensor(grad_desc, "grad");
  check_dtype(grad, "grad", is_high_precision_float(grad.dtype), "float32, float16 or bfloat16");
  OPENTE_CHECK_ARG(grad.ndim >= 1, "grad must have at least one dimension, got a scalar");
  const MatrixShape m = matrix_shape(grad);
  const int64_t n = m.rows * m.cols;
  if (n > 0) check_pointer(grad.data, "grad", "data");

  const te_tensor& out = checked_tensor(output_desc, "output");
  check_dtype(out, "output", is_fp8(out.dtype), "float8_e4m3 or float8_e5m2");
  check_same_shape(grad, "grad", out, "output");
  check_same_device(grad.device, "grad", out.device, "output");
  check_fp8_output(out, n);
  const te_tensor& dbias = checked_tensor(dbias_desc, "dbias");
  check_dbias(dbias, grad, "grad", m.cols);
  check_workspace(grad.device, m.rows, m.cols, workspace, workspace_size);

  DbiasCastParams p{};
  p.has_activation = false;
  p.kind = TE_ACTIVATION_GELU;  // not read
  p.grad = grad.data;
  p.output = out.data;
  p.output_t = out.columnwise_data;
  p.scale = out.scale;
  p.scale_inv = out.scale_inv;
  p.amax = out.amax;
  p.dbias = dbias.data;
  p.rows = m.rows;
  p.hidden = m.cols;
  p.in_dtype = te_dtype(grad.dtype);
  p.out_dtype = te_dtype(out.dtype);
  p.dbias_dtype = te_dtype(dbias.dtype);
  return p;
}

void dbias_cast_transpose(const te_tensor* grad_desc, const te_tensor* output_desc, const te_tensor* dbias_desc,
                          void* workspace, size_t workspace_size, void* stream) {
  const DbiasCastParams p = checked_dbias_cast(grad_desc, output_desc, dbias_desc, workspace, workspace_size);
  run(p, grad_desc->device, workspace, stream);
}

void dbias_cast_transpose_current_scaling(const te_tensor* grad_desc, const te_tensor* output_desc,
                                          const te_tensor* dbias_desc, float epsilon, int force_pow_2_scales,
                                          void* workspace, size_t workspace_size, [[maybe_unused]] void* stream) {
  DbiasCurrentScalingParams p{};
  p.cast = checked_dbias_cast(grad_desc, output_desc, dbias_desc, workspace, workspace_size);
  check_pointer(output_desc->amax, "output", "amax");
  OPENTE_CHECK_ARG(std::isfinite(epsilon) && epsilon >= 0.0f, "epsilon must be finite and >= 0, got ", epsilon);
  p.amax_out = p.cast.amax;  // written, not raised
  p.scale_out = static_cast<float*>(output_desc->scale);
  p.scale_inv = p.cast.scale_inv;
  p.fp8_max = fp8_max(p.cast.out_dtype);
  p.epsilon = epsilon;
  p.force_pow_2_scales = force_pow_2_scales != 0;
  p.cast.amax = nullptr;
  p.cast.scale_inv = nullptr;
  if (grad_desc->device.type == TE_DEVICE_CPU) {
    dbias_cast_current_scaling_cpu(p);
  } else {
    OPENTE_CUDA_CALL("grad", dbias_cast_current_scaling_cuda(p, grad_desc->device.index, workspace, stream));
  }
}

void dact_dbias_cast_transpose(int32_t kind_arg, const te_tensor* grad_desc, const te_tensor* act_input_desc,
                               const te_tensor* output_desc, const te_tensor* dbias_desc, void* workspace,
                               size_t workspace_size, void* stream) {
  const te_activation kind = checked_kind(kind_arg);
  const te_tensor& in = checked_tensor(act_input_desc, "act_input");
  MatrixShape m{};
  const int64_t h = checked_activation_input(in, "act_input", kind, &m);
  const int64_t n = m.rows * m.cols;
  if (n > 0) check_pointer(in.data, "act_input", "data");

  const te_tensor& grad = checked_tensor(grad_desc, "grad");
  check_same_dtype(grad, "grad", in, "act_input");
  check_halved_shape(grad, "grad", in, "act_input", h);
  check_same_device(in.device, "act_input", grad.device, "grad");
  if (n > 0) check_pointer(grad.data, "grad", "data");

  const te_tensor& out = checked_tensor(output_desc, "output");
  check_dtype(out, "output", is_high_precision_float(out.dtype) || is_fp8(out.dtype),
              "float32, float16, bfloat16, float8_e4m3 or float8_e5m2");
  check_same_shape(in, "act_input", out, "output");
  check_same_device(in.device, "act_input", out.device, "output");
  const bool fp8 = is_fp8(out.dtype);
  if (fp8) {
    check_fp8_output(out, n);
  } else {
    OPENTE_CHECK_ARG(out.columnwise_data == nullptr, "output.columnwise_data must be null for a ",
                     dtype_name(out.dtype), " output (only FP8 outputs have a column-wise copy)");
    if (n > 0) check_pointer(out.data, "output", "data");
  }
  const te_tensor* dbias = nullptr;
  if (dbias_desc) {
    dbias = &checked_tensor(dbias_desc, "dbias");
    check_dbias(*dbias, in, "act_input", m.cols);
    check_workspace(in.device, m.rows, m.cols, workspace, workspace_size);
  }

  DbiasCastParams p{};
  p.has_activation = true;
  p.kind = kind;
  p.grad = grad.data;
  p.act_input = in.data;
  p.output = out.data;
  p.output_t = fp8 ? out.columnwise_data : nullptr;
  p.scale = fp8 ? out.scale : nullptr;
  p.scale_inv = fp8 ? out.scale_inv : nullptr;
  p.amax = fp8 ? out.amax : nullptr;
  p.dbias = dbias ? dbias->data : nullptr;
  p.dbias_dtype = dbias ? te_dtype(dbias->dtype) : te_dtype(in.dtype);
  p.rows = m.rows;
  p.hidden = h;
  p.in_dtype = te_dtype(in.dtype);
  p.out_dtype = te_dtype(out.dtype);
  run(p, in.device, workspace, stream);
}

}  // namespace

extern "C" size_t te_dbias_workspace_size(int64_t rows, int64_t cols, te_device device) {
  if (device.type != TE_DEVICE_CUDA || rows <= 0 || cols <= 0) return 0;
  return dbias_workspace_bytes(rows, cols);
}

extern "C" te_status te_dbias_cast_transpose(const te_tensor* grad, const te_tensor* output, const te_tensor* dbias,
                                             void* workspace, size_t workspace_size, void* stream) {
  return run_op("te_dbias_cast_transpose",
                [&] { dbias_cast_transpose(grad, output, dbias, workspace, workspace_size, stream); });
}

extern "C" te_status te_dbias_cast_transpose_current_scaling(const te_tensor* grad, const te_tensor* output,
                                                             const te_tensor* dbias, float epsilon,
                                                             int force_pow_2_scales, void* workspace,
                                                             size_t workspace_size, void* stream) {
  return run_op("te_dbias_cast_transpose_current_scaling", [&] {
    dbias_cast_transpose_current_scaling(grad, output, dbias, epsilon, force_pow_2_scales, workspace, workspace_size,
                                         stream);
  });
}

extern "C" te_status te_dact_dbias_cast_transpose(int32_t kind, const te_tensor* grad, const te_tensor* act_input,
                                                  const te_tensor* output, const te_tensor* dbias, void* workspace,
                                                  size_t workspace_size, void* stream) {
  return run_op("te_dact_dbias_cast_transpose", [&] {
    dact_dbias_cast_transpose(kind, grad, act_input, output, dbias, workspace, workspace_size, stream);
  });
}
