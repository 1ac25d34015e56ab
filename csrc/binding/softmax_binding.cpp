// Softmax ops of transformer_engine._core (see opente/softmax.h): the scaled,
// masked, upper-triangular and aligned causal softmax, forward and backward.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;
using opente_binding::as_ptr;
using opente_binding::call_core;

namespace {

using SoftmaxFwd = te_status (*)(const te_tensor*, const te_tensor*, float, void*);
using SoftmaxBwd = te_status (*)(const te_tensor*, const te_tensor*, const te_tensor*, float, void*);

void def_fwd(nb::module_& m, const char* name, SoftmaxFwd op) {
  m.def(
      name,
      [op](const te_tensor& input, const te_tensor& output, float scale, uintptr_t stream) {
        call_core([&] { return op(&input, &output, scale, as_ptr<void>(stream)); });
      },
      nb::arg("input"), nb::arg("output"), nb::arg("scale"), nb::arg("stream") = 0);
}

// grad_input may be grad_output itself (the backward in place).
void def_bwd(nb::module_& m, const char* name, SoftmaxBwd op) {
  m.def(
      name,
      [op](const te_tensor& grad_output, const te_tensor& softmax_output, const te_tensor& grad_input, float scale,
           uintptr_t stream) {
        call_core([&] { return op(&grad_output, &softmax_output, &grad_input, scale, as_ptr<void>(stream)); });
      },
      nb::arg("grad_output"), nb::arg("softmax_output"), nb::arg("grad_input"), nb::arg("scale"),
      nb::arg("stream") = 0);
}

}  // namespace

void bind_softmax(nb::module_& m) {
  def_fwd(m, "scaled_softmax_fwd", te_scaled_softmax_fwd);
  def_bwd(m, "scaled_softmax_bwd", te_scaled_softmax_bwd);

  m.def(
      "scaled_masked_softmax_fwd",
      [](const te_tensor& input, const te_tensor& mask, const te_tensor& output, float scale, uintptr_t stream) {
        call_core([&] { return te_scaled_masked_softmax_fwd(&input, &mask, &output, scale, as_ptr<void>(stream)); });
      },
      nb::arg("input"), nb::arg("mask"), nb::arg("output"), nb::arg("scale"), nb::arg("stream") = 0);
  def_bwd(m, "scaled_masked_softmax_bwd", te_scaled_masked_softmax_bwd);

  def_fwd(m, "scaled_upper_triang_masked_softmax_fwd", te_scaled_upper_triang_masked_softmax_fwd);
  def_bwd(m, "scaled_upper_triang_masked_softmax_bwd", te_scaled_upper_triang_masked_softmax_bwd);

  def_fwd(m, "scaled_aligned_causal_masked_softmax_fwd", te_scaled_aligned_causal_masked_softmax_fwd);
  def_bwd(m, "scaled_aligned_causal_masked_softmax_bwd", te_scaled_aligned_causal_masked_softmax_bwd);
}
