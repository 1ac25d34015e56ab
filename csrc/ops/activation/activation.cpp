// C API of the activation family: validate the descriptors, then run the CPU
// reference. CUDA tensors are refused until issue 4's CUDA step adds kernels.
#include "opente/activation.h"

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/activation/activation_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";

const char* activation_name(te_activation kind) {
  static const char* const kNames[kNumActivations] = {"gelu",   "qgelu", "relu",  "srelu",  "silu",
                                                      "geglu",  "qgeglu", "reglu", "sreglu", "swiglu"};
  return kNames[kind];
}

te_activation checked_kind(int32_t kind) {
  OPENTE_CHECK_ARG(is_valid_activation(kind), "kind must be a te_activation (0 to ", kNumActivations - 1,
                   "), got ", kind);
  return te_activation(kind);
}

// The forward input (or the backward's copy of it): [rows, cols] with cols = 2H
// (even) for a gated kind. Returns H.
int64_t checked_activation_input(const te_tensor& in, const char* arg, te_activation kind, MatrixShape* m) {
  check_dtype(in, arg, is_high_precision_float(in.dtype), kFloatDtypes);
  OPENTE_CHECK_ARG(in.ndim >= 1, arg, " must have at least one dimension, got a scalar");
  *m = matrix_shape(in);
  if (!is_gated_activation(kind)) return m->cols;
  OPENTE_CHECK_ARG(m->cols % 2 == 0, arg, " last dim must be even for the gated activation ",
                   activation_name(kind), " (a = first half, b = second half), got shape ", shape_string(in));
  return m->cols / 2;
}

// `t` has `in`'s leading dims and last dim h.
void check_halved_shape(const te_tensor& t, const char* arg, const te_tensor& in, const char* in_name, int64_t h) {
  bool ok = t.ndim == in.ndim;
  for (int32_t i = 0; ok && i + 1 < in.ndim; ++i) ok = t.shape[i] == in.shape[i];
  ok = ok && t.shape[in.ndim - 1] == h;
  OPENTE_CHECK_ARG(ok, arg, " shape must be ", in_name, "'s leading dims with last dim ", h, " (", in_name, " ",
                   shape_string(in), "), got ", shape_string(t));
}

void check_same_dtype(const te_tensor& t, const char* arg, const te_tensor& like, const char* like_name) {
  OPENTE_CHECK_ARG(t.dtype == like.dtype, arg, " dtype must equal ", like_name, " dtype ", dtype_name(like.dtype),
                   ", got ", dtype_name(t.dtype));
}

[[noreturn]] void fail_cuda_not_written() {
  fail(TE_ERROR_NOT_IMPLEMENTED, "CUDA tensors are not supported yet (kernels arrive with issue 4's CUDA step)");
}

void activation_fwd(int32_t kind_arg, const te_tensor* input_desc, const te_tensor* output_desc) {
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
  if (in.device.type != TE_DEVICE_CPU) fail_cuda_not_written();

  ActivationFwdParams p{};
  p.kind = kind;
  p.input = in.data;
  p.output = out.data;
  p.output_t = fp8 ? out.columnwise_data : nullptr;
  p.scale = fp8 ? out.scale : nullptr;
  p.scale_inv = fp8 ? out.scale_inv : nullptr;
  p.amax = fp8 ? out.amax : nullptr;
  p.rows = m.rows;
  p.hidden = h;
  p.in_dtype = te_dtype(in.dtype);
  p.out_dtype = te_dtype(out.dtype);
  activation_fwd_cpu(p);
}

void activation_bwd(int32_t kind_arg, const te_tensor* grad_desc, const te_tensor* input_desc,
                    const te_tensor* dinput_desc) {
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
  if (in.device.type != TE_DEVICE_CPU) fail_cuda_not_written();

  ActivationBwdParams p{};
  p.kind = kind;
  p.grad = grad.data;
  p.input = in.data;
  p.dinput = dinput.data;
  p.rows = m.rows;
  p.hidden = h;
  p.dtype = te_dtype(in.dtype);
  activation_bwd_cpu(p);
}

}  // namespace

extern "C" te_status te_activation_fwd(int32_t kind, const te_tensor* input, const te_tensor* output,
                                       [[maybe_unused]] void* stream) {
  return run_op("te_activation_fwd", [&] { activation_fwd(kind, input, output); });
}

extern "C" te_status te_activation_bwd(int32_t kind, const te_tensor* grad, const te_tensor* input,
                                       const te_tensor* dinput, [[maybe_unused]] void* stream) {
  return run_op("te_activation_bwd", [&] { activation_bwd(kind, grad, input, dinput); });
}
