// Bias-gradient casts of transformer_engine._core (see opente/bias_grad.h).
#include <nanobind/nanobind.h>

#include <cstdint>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;
using opente_binding::as_ptr;
using opente_binding::call_core;

void bind_bias_grad(nb::module_& m) {
  m.def(
      "dbias_workspace_size",
      [](int64_t rows, int64_t cols, int32_t device_type, int32_t device_index) {
        return te_dbias_workspace_size(rows, cols, te_device{device_type, device_index});
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("device_type"), nb::arg("device_index"),
      "Bytes of workspace the dbias ops ask of CUDA callers for a [rows, cols] gradient (0 on the CPU)");

  // dbias = column sums of grad; grad cast to FP8 row-wise and / or column-wise.
  m.def(
      "dbias_cast_transpose",
      [](const te_tensor& grad, const te_tensor& output, const te_tensor& dbias, uintptr_t workspace,
         size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_dbias_cast_transpose(&grad, &output, &dbias, as_ptr<void>(workspace), workspace_size,
                                         as_ptr<void>(stream));
        });
      },
      nb::arg("grad"), nb::arg("output"), nb::arg("dbias"), nb::arg("workspace") = 0, nb::arg("workspace_size") = 0,
      nb::arg("stream") = 0);

  // The same under current scaling: output.amax and output.scale are written first.
  m.def(
      "dbias_cast_transpose_current_scaling",
      [](const te_tensor& grad, const te_tensor& output, const te_tensor& dbias, float epsilon,
         bool force_pow_2_scales, uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_dbias_cast_transpose_current_scaling(&grad, &output, &dbias, epsilon, force_pow_2_scales ? 1 : 0,
                                                         as_ptr<void>(workspace), workspace_size,
                                                         as_ptr<void>(stream));
        });
      },
      nb::arg("grad"), nb::arg("output"), nb::arg("dbias"), nb::arg("epsilon"), nb::arg("force_pow_2_scales"),
      nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);

  // dx = activation backward (FP8 or float), dbias = column sums of dx (None: not computed).
  m.def(
      "dact_dbias_cast_transpose",
      [](int32_t kind, const te_tensor& grad, const te_tensor& act_input, const te_tensor& output,
         const te_tensor* dbias, uintptr_t workspace, size_t workspace_size, uintptr_t stream) {
        call_core([&] {
          return te_dact_dbias_cast_transpose(kind, &grad, &act_input, &output, dbias, as_ptr<void>(workspace),
                                              workspace_size, as_ptr<void>(stream));
        });
      },
      nb::arg("kind"), nb::arg("grad"), nb::arg("act_input"), nb::arg("output"), nb::arg("dbias").none(),
      nb::arg("workspace") = 0, nb::arg("workspace_size") = 0, nb::arg("stream") = 0);
}
