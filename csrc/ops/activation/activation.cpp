// C API of the activation family: validate the descriptors, then run the CPU
// reference or the CUDA kernels on the input's device.
#include "opente/activation.h"

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/activation/activation_checks.h"
#include "ops/activation/activation_params.h"

using namespace opente;

namespace {

void activation_fwd(int32_t kind_arg, const te_tensor* input_desc, const te_tensor* output_desc,
                    [[maybe_unused]] void* stream) {
  const te_activation kind = checked_kind(kind_arg);
  const te_tensor& in = checked_tensor(input_desc, "input");
  MatrixShape m{};
  const int64_t h = checked_activation_input(in, "input", kind, &m);
  if (m.rows * m.cols > 0) check_pointer(in.data, "input", "data");

  const te_tensor& out = checked_tensor(output_desc, "output");
  check_dtype(out, "output", is_high_precision_float(out.dtype) || is_fp8(out.dtype),
              "float32, float16, bfloat16, float8_e4m3 or float8_e5m2");
  check_halved_shape(out, "output", in, "input", h);
  check_same_device(in.device, "input", out.device, "output");
  const int64_t n_out = m.rows * h;
  const bool fp8 = is_fp8(out.dtype);
  if (fp8) {
    check_per_tensor_scaling(out, "output");
    check_pointer(out.scale, "output", "scale");
    if (n_out > 0) {
      OPENTE_CHECK_ARG(out.data || out.columnwise_data,
                       "output.data and output.columnwise_data must not both be null");
    }
  } else {
    OPENTE_CHECK_ARG(out.columnwise_data == nullptr, "output.columnwise_data must be null for a ",
                     dtype_name(out.dtype), " output (only FP8 outputs have a column-wise copy)");
    if (n_out > 0) check_pointer(out.data, "output", "data");
  }

  ActivationFwdParams p{};
  p.kind = kind;
  p.input = in.data;
  p.output = out.data;
  p.output_t = fp8 ? out.columnwise_data : nullptr;
  p.scale = fp8 ? out.scale : nullptr;
  p.scale_inv = fp8 ? out.scale_inv : nullptr;
  p.amax = out.amax;  // a float output's too: its max|y|, fused, for a current-scaling cast of it
  p.rows = m.rows;
  p.hidden = h;
  p.in_dtype = te_dtype(in.dtype);
  p.out_dtype = te_dtype(out.dtype);
  if (in.device.type == TE_DEVICE_CPU) {
    activation_fwd_cpu(p);
  } else {
    OPENTE_CUDA_CALL("input", activation_fwd_cuda(p, in.device.index, stream));
  }
}

void activation_bwd(int32_t kind_arg, const te_tensor* grad_desc, const te_tensor* input_desc,
                    const te_tensor* dinput_desc, [[maybe_unused]] void* stream) {
  const te_activation kind = checked_kind(kind_arg);
  const te_tensor& in = checked_tensor(input_desc, "input");
  MatrixShape m{};
  const int64_t h = checked_activation_input(in, "input", kind, &m);

  const te_tensor& grad = checked_tensor(grad_desc, "grad");
  check_same_dtype(grad, "grad", in, "input");
  check_halved_shape(grad, "grad", in, "input", h);
  check_same_device(in.device, "input", grad.device, "grad");
  const te_tensor& dinput = checked_tensor(dinput_desc, "dinput");
  check_same_dtype(dinput, "dinput", in, "input");
  check_same_shape(in, "input", dinput, "dinput");
  check_same_device(in.device, "input", dinput.device, "dinput");
  if (m.rows * m.cols > 0) {
    check_pointer(grad.data, "grad", "data");
    check_pointer(in.data, "input", "data");
    check_pointer(dinput.data, "dinput", "data");
  }

  ActivationBwdParams p{};
  p.kind = kind;
  p.grad = grad.data;
  p.input = in.data;
  p.dinput = dinput.data;
  p.amax = dinput.amax;
  p.rows = m.rows;
  p.hidden = h;
  p.dtype = te_dtype(in.dtype);
  if (in.device.type == TE_DEVICE_CPU) {
    activation_bwd_cpu(p);
  } else {
    OPENTE_CUDA_CALL("input", activation_bwd_cuda(p, in.device.index, stream));
  }
}

}  // namespace

extern "C" te_status te_activation_fwd(int32_t kind, const te_tensor* input, const te_tensor* output,
                                       void* stream) {
  return run_op("te_activation_fwd", [&] { activation_fwd(kind, input, output, stream); });
}

extern "C" te_status te_activation_bwd(int32_t kind, const te_tensor* grad, const te_tensor* input,
                                       const te_tensor* dinput, void* stream) {
  return run_op("te_activation_bwd", [&] { activation_bwd(kind, grad, input, dinput, stream); });
}
