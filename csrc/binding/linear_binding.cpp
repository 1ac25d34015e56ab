// The FP8 steps of a linear layer, one call each, in transformer_engine._core
// (see opente/linear.h): te.Linear's forward and backward. current_scaling false:
// the FP8 outputs' given scales; true: te_current_scaling{epsilon, force_pow_2_scales}.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;
using opente_binding::as_ptr;
using opente_binding::call_core;

namespace {

const te_current_scaling* current_or_null(bool current_scaling, float epsilon, bool force_pow_2_scales,
                                          te_current_scaling& storage) {
  if (!current_scaling) return nullptr;
  storage = te_current_scaling{epsilon, force_pow_2_scales ? 1 : 0};
  return &storage;
}

}  // namespace

void bind_linear(nb::module_& m) {
  m.def(
      "linear_fp8_fwd",
      [](const te_tensor& input, const te_tensor& weight, const te_tensor* bias, const te_tensor* bias_converted,
         const te_tensor& input_fp8, const te_tensor& weight_fp8, const te_tensor& output, bool current_scaling,
         float epsilon, bool force_pow_2_scales, bool use_split_accumulator, uintptr_t workspace, size_t workspace_size,
         uintptr_t stream) {
        te_current_scaling storage;
        const te_current_scaling* current = current_or_null(current_scaling, epsilon, force_pow_2_scales, storage);
        call_core([&] {
          return te_linear_fp8_fwd(&input, &weight, bias, bias_converted, &input_fp8, &weight_fp8, &output, current,
                                   use_split_accumulator ? 1 : 0, as_ptr<void>(workspace), workspace_size,
                                   as_ptr<void>(stream));
        });
      },
      nb::arg("input"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("bias_converted").none(),
      nb::arg("input_fp8"), nb::arg("weight_fp8"), nb::arg("output"), nb::arg("current_scaling") = false,
      nb::arg("epsilon") = 0.0f, nb::arg("force_pow_2_scales") = false, nb::arg("use_split_accumulator") = false,
      nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);

  m.def(
      "linear_fp8_bwd",
      [](const te_tensor& grad_output, const te_tensor& grad_output_fp8, const te_tensor* dbias,
         const te_tensor* weight_fp8, const te_tensor* input_fp8, const te_tensor* grad_input,
         const te_tensor* grad_weight, bool current_scaling, float epsilon, bool force_pow_2_scales,
         bool split_accumulator_dgrad, bool split_accumulator_wgrad, uintptr_t dbias_workspace,
         size_t dbias_workspace_size, uintptr_t gemm_workspace, size_t gemm_workspace_size, uintptr_t stream) {
        te_current_scaling storage;
        const te_current_scaling* current = current_or_null(current_scaling, epsilon, force_pow_2_scales, storage);
        call_core([&] {
          return te_linear_fp8_bwd(&grad_output, &grad_output_fp8, dbias, weight_fp8, input_fp8, grad_input,
                                   grad_weight, current, split_accumulator_dgrad ? 1 : 0,
                                   split_accumulator_wgrad ? 1 : 0, as_ptr<void>(dbias_workspace), dbias_workspace_size,
                                   as_ptr<void>(gemm_workspace), gemm_workspace_size, as_ptr<void>(stream));
        });
      },
      nb::arg("grad_output"), nb::arg("grad_output_fp8"), nb::arg("dbias").none(), nb::arg("weight_fp8").none(),
      nb::arg("input_fp8").none(), nb::arg("grad_input").none(), nb::arg("grad_weight").none(),
      nb::arg("current_scaling") = false, nb::arg("epsilon") = 0.0f, nb::arg("force_pow_2_scales") = false,
      nb::arg("split_accumulator_dgrad") = true, nb::arg("split_accumulator_wgrad") = true,
      nb::arg("dbias_workspace") = 0, nb::arg("dbias_workspace_size") = 0, nb::arg("gemm_workspace") = 0,
      nb::arg("gemm_workspace_size") = 0, nb::arg("stream") = 0);
}
