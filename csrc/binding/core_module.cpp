// transformer_engine._core: the thin binding over the C API.
//
// Everything crossing it is a plain integer (data pointers, shapes, dtype enums,
// the stream as cudaStream_t value), so the binding links against neither
// PyTorch nor JAX and one build serves both. A core error becomes a Python
// exception carrying the core's message: invalid argument -> ValueError,
// not implemented -> NotImplementedError, CUDA / internal -> RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;
using opente_binding::as_ptr;
using opente_binding::call_core;

// Op families bound in their own files (csrc/binding/*_binding.cpp).
void bind_softmax(nb::module_& m);
void bind_bias_grad(nb::module_& m);
void bind_rope(nb::module_& m);
void bind_fused_attn(nb::module_& m);
void bind_linear(nb::module_& m);

namespace {

te_tensor make_tensor(int32_t device_type, int32_t device_index, int32_t dtype, const std::vector<int64_t>& shape,
                      uintptr_t data, uintptr_t columnwise_data, uintptr_t scale, uintptr_t scale_inv,
                      uintptr_t amax, int32_t scaling_mode) {
  if (shape.size() > TE_MAX_DIMS) {
    throw nb::value_error(("shape has " + std::to_string(shape.size()) + " dims; OpenTE takes at most " +
                           std::to_string(TE_MAX_DIMS))
                              .c_str());
  }
  te_tensor t{};
  t.device = te_device{device_type, device_index};
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.data = as_ptr<void>(data);
  t.columnwise_data = as_ptr<void>(columnwise_data);
  t.scale = as_ptr<float>(scale);
  t.scale_inv = as_ptr<float>(scale_inv);
  t.amax = as_ptr<float>(amax);
  t.scaling_mode = scaling_mode;
  return t;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "OpenTE core ops over raw device pointers (see csrc/include/opente/)";
  // Descriptors held by exception tracebacks when the interpreter exits are
  // reported as leaks; the binding keeps no references of its own to leak.
  nb::set_leak_warnings(false);

  nb::enum_<te_dtype>(m, "DType", nb::is_arithmetic(), "Element types, numbered as Transformer Engine's DType")
      .value("kByte", TE_DTYPE_UINT8)
      .value("kInt32", TE_DTYPE_INT32)
      .value("kInt64", TE_DTYPE_INT64)
      .value("kFloat32", TE_DTYPE_FLOAT32)
      .value("kFloat16", TE_DTYPE_FLOAT16)
      .value("kBFloat16", TE_DTYPE_BFLOAT16)
      .value("kFloat8E4M3", TE_DTYPE_FLOAT8_E4M3)
      .value("kFloat8E5M2", TE_DTYPE_FLOAT8_E5M2);

  nb::enum_<te_device_type>(m, "DeviceType", nb::is_arithmetic())
      .value("CPU", TE_DEVICE_CPU)
      .value("CUDA", TE_DEVICE_CUDA);

  nb::enum_<te_scaling_mode>(m, "ScalingMode", nb::is_arithmetic())
      .value("NONE", TE_SCALING_NONE)
      .value("PER_TENSOR", TE_SCALING_PER_TENSOR)
      .value("BLOCK_1D", TE_SCALING_BLOCK_1D)
      .value("BLOCK_2D", TE_SCALING_BLOCK_2D);

  nb::enum_<te_amax_compute_algo>(m, "AmaxComputeAlgo", nb::is_arithmetic())
      .value("MAX", TE_AMAX_COMPUTE_MAX)
      .value("MOST_RECENT", TE_AMAX_COMPUTE_MOST_RECENT);

  nb::enum_<te_gemm_epilogue>(m, "GemmEpilogue", nb::is_arithmetic())
      .value("NONE", TE_GEMM_EPILOGUE_NONE)
      .value("BIAS", TE_GEMM_EPILOGUE_BIAS)
      .value("GELU_AUX", TE_GEMM_EPILOGUE_GELU_AUX)
      .value("GELU_AUX_BIAS", TE_GEMM_EPILOGUE_GELU_AUX_BIAS)
      .value("DGELU", TE_GEMM_EPILOGUE_DGELU)
      .value("DGELU_BGRAD", TE_GEMM_EPILOGUE_DGELU_BGRAD)
      .value("BGRAD", TE_GEMM_EPILOGUE_BGRAD);

  nb::enum_<te_activation>(m, "Activation", nb::is_arithmetic(), "Activation kinds (see opente/activation.h)")
      .value("GELU", TE_ACTIVATION_GELU)
      .value("QGELU", TE_ACTIVATION_QGELU)
      .value("RELU", TE_ACTIVATION_RELU)
      .value("SRELU", TE_ACTIVATION_SRELU)
      .value("SILU", TE_ACTIVATION_SILU)
      .value("GEGLU", TE_ACTIVATION_GEGLU)
      .value("QGEGLU", TE_ACTIVATION_QGEGLU)
      .value("REGLU", TE_ACTIVATION_REGLU)
      .value("SREGLU", TE_ACTIVATION_SREGLU)
      .value("SWIGLU", TE_ACTIVATION_SWIGLU);

  nb::class_<te_tensor>(m, "Tensor", "A non-owning tensor descriptor (te_tensor): pointers are integers")
      .def(
          "__init__",
          [](te_tensor* self, int32_t device_type, int32_t device_index, int32_t dtype, const std::vector<int64_t>& shape,
             uintptr_t data, uintptr_t columnwise_data, uintptr_t scale, uintptr_t scale_inv, uintptr_t amax,
             int32_t scaling_mode) {
            new (self) te_tensor(make_tensor(device_type, device_index, dtype, shape, data, columnwise_data, scale,
                                             scale_inv, amax, scaling_mode));
          },
          nb::arg("device_type"), nb::arg("device_index"), nb::arg("dtype"), nb::arg("shape"), nb::arg("data") = 0,
          nb::arg("columnwise_data") = 0, nb::arg("scale") = 0, nb::arg("scale_inv") = 0, nb::arg("amax") = 0,
          nb::arg("scaling_mode") = int32_t(TE_SCALING_NONE))
      .def_prop_ro("dtype", [](const te_tensor& t) { return t.dtype; })
      .def_prop_ro("shape", [](const te_tensor& t) { return std::vector<int64_t>(t.shape, t.shape + t.ndim); })
      .def_prop_ro("device", [](const te_tensor& t) { return std::make_tuple(t.device.type, t.device.index); });

  m.def("built_with_cuda", [] { return te_built_with_cuda() != 0; },
        "True when this build has CUDA kernels (nvcc was found at build time)");

  m.def(
      "quantize",
      [](const te_tensor& input, const te_tensor& output, uintptr_t stream) {
        call_core([&] { return te_quantize(&input, &output, as_ptr<void>(stream)); });
      },
      nb::arg("input"), nb::arg("output"), nb::arg("stream") = 0);

  // amax, scale and cast of current scaling in one call (output.amax and .scale are written).
  m.def(
      "quantize_current_scaling",
      [](const te_tensor& input, const te_tensor& output, float epsilon, bool force_pow_2_scales, uintptr_t stream) {
        call_core([&] {
          return te_quantize_current_scaling(&input, &output, epsilon, force_pow_2_scales ? 1 : 0,
                                             as_ptr<void>(stream));
        });
      },
      nb::arg("input"), nb::arg("output"), nb::arg("epsilon") = 0.0f, nb::arg("force_pow_2_scales") = false,
      nb::arg("stream") = 0);

  // Several casts, one core call (on the GPU one launch for the small ones).
  m.def(
      "multi_quantize",
      [](const std::vector<te_tensor>& inputs, const std::vector<te_tensor>& outputs, uintptr_t stream) {
        if (inputs.size() != outputs.size()) {
          throw nb::value_error("multi_quantize: inputs and outputs differ in length");
        }
        call_core(
            [&] { return te_multi_quantize(inputs.size(), inputs.data(), outputs.data(), as_ptr<void>(stream)); });
      },
      nb::arg("inputs"), nb::arg("outputs"), nb::arg("stream") = 0);

  m.def(
      "multi_quantize_current_scaling",
      [](const std::vector<te_tensor>& inputs, const std::vector<te_tensor>& outputs, float epsilon,
         bool force_pow_2_scales, uintptr_t stream) {
        if (inputs.size() != outputs.size()) {
          throw nb::value_error("multi_quantize_current_scaling: inputs and outputs differ in length");
        }
        call_core([&] {
          return te_multi_quantize_current_scaling(inputs.size(), inputs.data(), outputs.data(), epsilon,
                                                   force_pow_2_scales ? 1 : 0, as_ptr<void>(stream));
        });
      },
      nb::arg("inputs"), nb::arg("outputs"), nb::arg("epsilon") = 0.0f, nb::arg("force_pow_2_scales") = false,
      nb::arg("stream") = 0);

  m.def(
      "dequantize",
      [](const te_tensor& input, const te_tensor& output, uintptr_t stream) {
        call_core([&] { return te_dequantize(&input, &output, as_ptr<void>(stream)); });
      },
      nb::arg("input"), nb::arg("output"), nb::arg("stream") = 0);

  m.def(
      "compute_amax",
      [](const te_tensor& input, uintptr_t amax, uintptr_t stream) {
        call_core([&] { return te_compute_amax(&input, as_ptr<float>(amax), as_ptr<void>(stream)); });
      },
      nb::arg("input"), nb::arg("amax"), nb::arg("stream") = 0);

  m.def(
      "transpose",
      [](const te_tensor& input, const te_tensor& output, uintptr_t stream) {
        call_core([&] { return te_transpose(&input, &output, as_ptr<void>(stream)); });
      },
      nb::arg("input"), nb::arg("output"), nb::arg("stream") = 0);

  m.def(
      "compute_scale_from_amax",
      [](uintptr_t amax, uintptr_t scale, uintptr_t scale_inv, int32_t fp8_dtype, float epsilon,
         bool force_pow_2_scales, int32_t device_type, int32_t device_index, uintptr_t stream) {
        call_core([&] {
          return te_compute_scale_from_amax(as_ptr<const float>(amax), as_ptr<float>(scale), as_ptr<float>(scale_inv),
                                            fp8_dtype, epsilon, force_pow_2_scales ? 1 : 0,
                                            te_device{device_type, device_index}, as_ptr<void>(stream));
        });
      },
      nb::arg("amax"), nb::arg("scale"), nb::arg("scale_inv"), nb::arg("fp8_dtype"), nb::arg("epsilon"),
      nb::arg("force_pow_2_scales"), nb::arg("device_type"), nb::arg("device_index"), nb::arg("stream") = 0);

  m.def("gemm_workspace_size", [] { return te_gemm_workspace_size(); },
        "Bytes of workspace te_gemm asks of CUDA callers (32 MiB)");

  // D = alpha * op_B(B) @ op_A(A) + beta * D, then the epilogue (see opente/gemm.h).
  // bias, aux, bias_grad: None when the epilogue does not use them.
  m.def(
      "gemm",
      [](const te_tensor& A, const te_tensor& B, const te_tensor& D, const te_tensor* bias, const te_tensor* aux,
         const te_tensor* bias_grad, bool transa, bool transb, int32_t epilogue, float alpha, float beta,
         bool use_split_accumulator, uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
        const te_gemm_config config{transa ? 1 : 0, transb ? 1 : 0, epilogue, alpha, beta,
                                    use_split_accumulator ? 1 : 0};
        call_core([&] {
          return te_gemm(&A, &B, &D, bias, aux, bias_grad, &config, as_ptr<void>(workspace), workspace_size,
                         as_ptr<void>(stream));
        });
      },
      nb::arg("A"), nb::arg("B"), nb::arg("D"), nb::arg("bias").none(), nb::arg("aux").none(),
      nb::arg("bias_grad").none(), nb::arg("transa"), nb::arg("transb"),
      nb::arg("epilogue") = int32_t(TE_GEMM_EPILOGUE_NONE), nb::arg("alpha") = 1.0f, nb::arg("beta") = 0.0f,
      nb::arg("use_split_accumulator") = false, nb::arg("workspace") = 0, nb::arg("workspace_size") = 0,
      nb::arg("stream") = 0);

  m.def(
      "norm_workspace_size",
      [](int64_t rows, int64_t hidden, int32_t device_type, int32_t device_index) {
        return te_norm_workspace_size(rows, hidden, te_device{device_type, device_index});
      },
      nb::arg("rows"), nb::arg("hidden"), nb::arg("device_type"), nb::arg("device_index"),
      "Bytes of workspace the norm ops ask of CUDA callers for [rows, hidden] inputs (0 on the CPU)");

  // LayerNorm / RMSNorm (see opente/norm.h): statistics fp32, output float or FP8.
  m.def(
      "layernorm_fwd",
      [](const te_tensor& input, const te_tensor& gamma, const te_tensor& beta, float eps, bool zero_centered_gamma,
         const te_tensor& output, const te_tensor& mu, const te_tensor& rsigma, uintptr_t workspace,
         size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_layernorm_fwd(&input, &gamma, &beta, eps, zero_centered_gamma ? 1 : 0, &output, &mu, &rsigma,
                                  as_ptr<void>(workspace), workspace_size, as_ptr<void>(stream));
        });
      },
      nb::arg("input"), nb::arg("gamma"), nb::arg("beta"), nb::arg("eps"), nb::arg("zero_centered_gamma"),
      nb::arg("output"), nb::arg("mu"), nb::arg("rsigma"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0,
      nb::arg("stream") = 0);

  m.def(
      "layernorm_bwd",
      [](const te_tensor& dz, const te_tensor& x, const te_tensor& mu, const te_tensor& rsigma,
         const te_tensor& gamma, bool zero_centered_gamma, const te_tensor& dx, const te_tensor& dgamma,
         const te_tensor& dbeta, uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_layernorm_bwd(&dz, &x, &mu, &rsigma, &gamma, zero_centered_gamma ? 1 : 0, &dx, &dgamma, &dbeta,
                                  as_ptr<void>(workspace), workspace_size, as_ptr<void>(stream));
        });
      },
      nb::arg("dz"), nb::arg("x"), nb::arg("mu"), nb::arg("rsigma"), nb::arg("gamma"), nb::arg("zero_centered_gamma"),
      nb::arg("dx"), nb::arg("dgamma"), nb::arg("dbeta"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0,
      nb::arg("stream") = 0);

  m.def(
      "rmsnorm_fwd",
      [](const te_tensor& input, const te_tensor& gamma, float eps, bool zero_centered_gamma, const te_tensor& output,
         const te_tensor& rsigma, uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_rmsnorm_fwd(&input, &gamma, eps, zero_centered_gamma ? 1 : 0, &output, &rsigma,
                                as_ptr<void>(workspace), workspace_size, as_ptr<void>(stream));
        });
      },
      nb::arg("input"), nb::arg("gamma"), nb::arg("eps"), nb::arg("zero_centered_gamma"), nb::arg("output"),
      nb::arg("rsigma"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);

  m.def(
      "rmsnorm_bwd",
      [](const te_tensor& dz, const te_tensor& x, const te_tensor& rsigma, const te_tensor& gamma,
         bool zero_centered_gamma, const te_tensor& dx, const te_tensor& dgamma, uintptr_t workspace,
         size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_rmsnorm_bwd(&dz, &x, &rsigma, &gamma, zero_centered_gamma ? 1 : 0, &dx, &dgamma,
                                as_ptr<void>(workspace), workspace_size, as_ptr<void>(stream));
        });
      },
      nb::arg("dz"), nb::arg("x"), nb::arg("rsigma"), nb::arg("gamma"), nb::arg("zero_centered_gamma"), nb::arg("dx"),
      nb::arg("dgamma"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);

  // Activations (see opente/activation.h): output float or FP8; gated kinds halve the last dim.
  m.def(
      "activation_fwd",
      [](int32_t kind, const te_tensor& input, const te_tensor& output, uintptr_t stream) {
        call_core([&] { return te_activation_fwd(kind, &input, &output, as_ptr<void>(stream)); });
      },
      nb::arg("kind"), nb::arg("input"), nb::arg("output"), nb::arg("stream") = 0);

  m.def(
      "activation_bwd",
      [](int32_t kind, const te_tensor& grad, const te_tensor& input, const te_tensor& dinput, uintptr_t stream) {
        call_core([&] { return te_activation_bwd(kind, &grad, &input, &dinput, as_ptr<void>(stream)); });
      },
      nb::arg("kind"), nb::arg("grad"), nb::arg("input"), nb::arg("dinput"), nb::arg("stream") = 0);

  // groups: (amax_history, scale, scale_inv, history_len, num_scales, fp8_dtype) per group, pointers as integers.
  m.def(
      "delayed_scaling_update",
      [](const std::vector<std::tuple<uintptr_t, uintptr_t, uintptr_t, int64_t, int64_t, int32_t>>& groups,
         int32_t amax_compute_algo, float margin, int32_t device_type, int32_t device_index, uintptr_t stream) {
        std::vector<te_amax_history_group> descs;
        descs.reserve(groups.size());
        for (const auto& [history, scale, scale_inv, history_len, num_scales, fp8_dtype] : groups) {
          descs.push_back({as_ptr<float>(history), as_ptr<float>(scale), as_ptr<float>(scale_inv), history_len,
                           num_scales, fp8_dtype});
        }
        call_core([&] {
          return te_delayed_scaling_update(descs.data(), static_cast<int64_t>(descs.size()), amax_compute_algo, margin,
                                           te_device{device_type, device_index}, as_ptr<void>(stream));
        });
      },
      nb::arg("groups"), nb::arg("amax_compute_algo"), nb::arg("margin"), nb::arg("device_type"),
      nb::arg("device_index"), nb::arg("stream") = 0);

  bind_softmax(m);
  bind_bias_grad(m);
  bind_rope(m);
  bind_fused_attn(m);
  bind_linear(m);
}
