// C API of the norm family: validate the descriptors, then run the CPU
// reference or the CUDA kernels on the input's device.
#include <cmath>

#include "opente/norm.h"

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/norm/norm_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";

// The [rows, hidden] a norm input is seen as: at least one dim, hidden >= 1.
MatrixShape checked_norm_matrix(const te_tensor& t, const char* arg) {
  OPENTE_CHECK_ARG(t.ndim >= 1, arg, " must have at least one dimension (normalized over the last), got a scalar");
  const MatrixShape m = matrix_shape(t);
  OPENTE_CHECK_ARG(m.cols >= 1, arg, " hidden size (last dim) must be at least 1, got shape ", shape_string(t));
  return m;
}

// gamma, beta, dgamma, dbeta: `hidden` elements of a float dtype on the input's device.
const te_tensor& checked_weight(const te_tensor* desc, const char* arg, const te_tensor& input,
                                const char* input_name, int64_t hidden) {
  const te_tensor& t = checked_tensor(desc, arg);
  check_dtype(t, arg, is_high_precision_float(t.dtype), kFloatDtypes);
  check_same_device(input.device, input_name, t.device, arg);
  OPENTE_CHECK_ARG(numel(t) == hidden, arg, " must have hidden=", hidden, " elements (the last dim of ", input_name,
                   "), got shape ", shape_string(t));
  check_pointer(t.data, arg, "data");
  return t;
}

// mu, rsigma: `rows` float32 elements on the input's device.
const te_tensor& checked_stats(const te_tensor* desc, const char* arg, const te_tensor& input,
                               const char* input_name, int64_t rows) {
  const te_tensor& t = checked_tensor(desc, arg);
  check_dtype(t, arg, t.dtype == TE_DTYPE_FLOAT32, "float32 (statistics are fp32)");
  check_same_device(input.device, input_name, t.device, arg);
  OPENTE_CHECK_ARG(numel(t) == rows, arg, " must have rows=", rows, " elements (one per row of ", input_name, " ",
                   shape_string(input), "), got shape ", shape_string(t));
  if (rows > 0) check_pointer(t.data, arg, "data");
  return t;
}

void check_same_dtype(const te_tensor& t, const char* arg, const te_tensor& like, const char* like_name) {
  OPENTE_CHECK_ARG(t.dtype == like.dtype, arg, " dtype must equal ", like_name, " dtype ", dtype_name(like.dtype),
                   ", got ", dtype_name(t.dtype));
}

void check_eps(float eps) {
  OPENTE_CHECK_ARG(std::isfinite(eps) && eps >= 0.0f, "eps must be finite and >= 0, got ", double(eps));
}

void check_workspace(const te_device& device, const MatrixShape& m, const void* workspace, size_t workspace_size) {
  if (device.type != TE_DEVICE_CUDA) return;
  const size_t need = te_norm_workspace_size(m.rows, m.cols, device);
  OPENTE_CHECK_ARG(workspace_size >= need, "workspace must be at least ", need, " bytes (te_norm_workspace_size(",
                   m.rows, ", ", m.cols, ")), got ", workspace_size);
  if (need > 0) check_pointer(workspace, "workspace", "pointer");
}

// The forward of both norms; beta and mu are null for RMSNorm.
void norm_fwd(NormType type, const te_tensor* input_desc, const te_tensor* gamma_desc, const te_tensor* beta_desc,
              float eps, int zero_centered_gamma, const te_tensor* output_desc, const te_tensor* mu_desc,
              const te_tensor* rsigma_desc, void* workspace, size_t workspace_size,
              [[maybe_unused]] void* stream) {
  const bool layernorm = type == NormType::kLayerNorm;
  const te_tensor& in = checked_tensor(input_desc, "input");
  check_dtype(in, "input", is_high_precision_float(in.dtype), kFloatDtypes);
  const MatrixShape m = checked_norm_matrix(in, "input");
  const int64_t n = m.rows * m.cols;
  if (n > 0) check_pointer(in.data, "input", "data");

  const te_tensor& gamma = checked_weight(gamma_desc, "gamma", in, "input", m.cols);
  const te_tensor* beta = nullptr;
  if (layernorm) {
    beta = &checked_weight(beta_desc, "beta", in, "input", m.cols);
    check_same_dtype(*beta, "beta", gamma, "gamma");
  }
  check_eps(eps);

  const te_tensor& out = checked_tensor(output_desc, "output");
  check_dtype(out, "output", is_high_precision_float(out.dtype) || is_fp8(out.dtype),
              "float32, float16, bfloat16, float8_e4m3 or float8_e5m2");
  check_same_shape(in, "input", out, "output");
  check_same_device(in.device, "input", out.device, "output");
  const bool fp8 = is_fp8(out.dtype);
  if (fp8) {
    check_per_tensor_scaling(out, "output");
    check_pointer(out.scale, "output", "scale");
    if (n > 0) {
      OPENTE_CHECK_ARG(out.data || out.columnwise_data,
                       "output.data and output.columnwise_data must not both be null");
    }
  } else {
    OPENTE_CHECK_ARG(out.columnwise_data == nullptr, "output.columnwise_data must be null for a ",
                     dtype_name(out.dtype), " output (only FP8 outputs have a column-wise copy)");
    if (n > 0) check_pointer(out.data, "output", "data");
  }

  const te_tensor* mu = layernorm ? &checked_stats(mu_desc, "mu", in, "input", m.rows) : nullptr;
  const te_tensor& rsigma = checked_stats(rsigma_desc, "rsigma", in, "input", m.rows);
  check_workspace(in.device, m, workspace, workspace_size);

  NormFwdParams p{};
  p.type = type;
  p.input = in.data;
  p.gamma = gamma.data;
  p.beta = beta ? beta->data : nullptr;
  p.output = out.data;
  p.output_t = fp8 ? out.columnwise_data : nullptr;
  p.scale = fp8 ? out.scale : nullptr;
  p.scale_inv = fp8 ? out.scale_inv : nullptr;
  p.amax = out.amax;  // a float output's too: its max|y|, fused, for a current-scaling cast of it
  p.mu = mu ? static_cast<float*>(mu->data) : nullptr;
  p.rsigma = static_cast<float*>(rsigma.data);
  p.rows = m.rows;
  p.hidden = m.cols;
  p.eps = eps;
  p.zero_centered_gamma = zero_centered_gamma != 0;
  p.in_dtype = te_dtype(in.dtype);
  p.w_dtype = te_dtype(gamma.dtype);
  p.out_dtype = te_dtype(out.dtype);
  if (in.device.type == TE_DEVICE_CPU) {
    norm_fwd_cpu(p);
  } else {
    OPENTE_CUDA_CALL("input", norm_fwd_cuda(p, in.device.index, workspace, workspace_size, stream));
  }
}

// The backward of both norms; mu and dbeta are null for RMSNorm.
void norm_bwd(NormType type, const te_tensor* dz_desc, const te_tensor* x_desc, const te_tensor* mu_desc,
              const te_tensor* rsigma_desc, const te_tensor* gamma_desc, int zero_centered_gamma,
              const te_tensor* dx_desc, const te_tensor* dgamma_desc, const te_tensor* dbeta_desc, void* workspace,
              size_t workspace_size, [[maybe_unused]] void* stream) {
  const bool layernorm = type == NormType::kLayerNorm;
  const te_tensor& x = checked_tensor(x_desc, "x");
  check_dtype(x, "x", is_high_precision_float(x.dtype), kFloatDtypes);
  const MatrixShape m = checked_norm_matrix(x, "x");
  const int64_t n = m.rows * m.cols;

  const te_tensor& dz = checked_tensor(dz_desc, "dz");
  check_same_dtype(dz, "dz", x, "x");
  check_same_shape(x, "x", dz, "dz");
  check_same_device(x.device, "x", dz.device, "dz");
  const te_tensor& dx = checked_tensor(dx_desc, "dx");
  check_same_dtype(dx, "dx", x, "x");
  check_same_shape(x, "x", dx, "dx");
  check_same_device(x.device, "x", dx.device, "dx");
  if (n > 0) {
    check_pointer(dz.data, "dz", "data");
    check_pointer(x.data, "x", "data");
    check_pointer(dx.data, "dx", "data");
  }

  const te_tensor* mu = layernorm ? &checked_stats(mu_desc, "mu", x, "x", m.rows) : nullptr;
  const te_tensor& rsigma = checked_stats(rsigma_desc, "rsigma", x, "x", m.rows);
  const te_tensor& gamma = checked_weight(gamma_desc, "gamma", x, "x", m.cols);
  const te_tensor& dgamma = checked_weight(dgamma_desc, "dgamma", x, "x", m.cols);
  check_same_dtype(dgamma, "dgamma", gamma, "gamma");
  const te_tensor* dbeta = nullptr;
  if (layernorm) {
    dbeta = &checked_weight(dbeta_desc, "dbeta", x, "x", m.cols);
    check_same_dtype(*dbeta, "dbeta", gamma, "gamma");
  }
  check_workspace(x.device, m, workspace, workspace_size);

  NormBwdParams p{};
  p.type = type;
  p.dz = dz.data;
  p.x = x.data;
  p.mu = mu ? static_cast<const float*>(mu->data) : nullptr;
  p.rsigma = static_cast<const float*>(rsigma.data);
  p.gamma = gamma.data;
  p.dx = dx.data;
  p.dgamma = dgamma.data;
  p.dbeta = dbeta ? dbeta->data : nullptr;
  p.rows = m.rows;
  p.hidden = m.cols;
  p.zero_centered_gamma = zero_centered_gamma != 0;
  p.in_dtype = te_dtype(x.dtype);
  p.w_dtype = te_dtype(gamma.dtype);
  if (x.device.type == TE_DEVICE_CPU) {
    norm_bwd_cpu(p);
  } else {
    OPENTE_CUDA_CALL("x", norm_bwd_cuda(p, x.device.index, workspace, workspace_size, stream));
  }
}

}  // namespace

extern "C" size_t te_norm_workspace_size(int64_t rows, int64_t hidden, te_device device) {
  return device.type == TE_DEVICE_CUDA ? norm_workspace_bytes(rows, hidden) : 0;
}

extern "C" te_status te_layernorm_fwd(const te_tensor* input, const te_tensor* gamma, const te_tensor* beta,
                                      float eps, int zero_centered_gamma, const te_tensor* output,
                                      const te_tensor* mu, const te_tensor* rsigma, void* workspace,
                                      size_t workspace_size, void* stream) {
  return run_op("te_layernorm_fwd", [&] {
    norm_fwd(NormType::kLayerNorm, input, gamma, beta, eps, zero_centered_gamma, output, mu, rsigma, workspace,
             workspace_size, stream);
  });
}

extern "C" te_status te_layernorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* mu,
                                      const te_tensor* rsigma, const te_tensor* gamma, int zero_centered_gamma,
                                      const te_tensor* dx, const te_tensor* dgamma, const te_tensor* dbeta,
                                      void* workspace, size_t workspace_size, void* stream) {
  return run_op("te_layernorm_bwd", [&] {
    norm_bwd(NormType::kLayerNorm, dz, x, mu, rsigma, gamma, zero_centered_gamma, dx, dgamma, dbeta, workspace,
             workspace_size, stream);
  });
}

extern "C" te_status te_rmsnorm_fwd(const te_tensor* input, const te_tensor* gamma, float eps,
                                    int zero_centered_gamma, const te_tensor* output, const te_tensor* rsigma,
                                    void* workspace, size_t workspace_size, void* stream) {
  return run_op("te_rmsnorm_fwd", [&] {
    norm_fwd(NormType::kRMSNorm, input, gamma, nullptr, eps, zero_centered_gamma, output, nullptr, rsigma,
             workspace, workspace_size, stream);
  });
}

extern "C" te_status te_rmsnorm_bwd(const te_tensor* dz, const te_tensor* x, const te_tensor* rsigma,
                                    const te_tensor* gamma, int zero_centered_gamma, const te_tensor* dx,
                                    const te_tensor* dgamma, void* workspace, size_t workspace_size,
                                    void* stream) {
  return run_op("te_rmsnorm_bwd", [&] {
    norm_bwd(NormType::kRMSNorm, dz, x, nullptr, rsigma, gamma, zero_centered_gamma, dx, dgamma, nullptr, workspace,
             workspace_size, stream);
  });
}
