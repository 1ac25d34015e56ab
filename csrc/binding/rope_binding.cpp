// Rotary position embedding ops of transformer_engine._core (see opente/rope.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;
using opente_binding::as_ptr;
using opente_binding::call_core;

namespace {

using RopeOp = te_status (*)(const te_tensor*, const int64_t*, const te_tensor*, const te_tensor*, const te_tensor*,
                             const te_tensor*, const te_rope_config*, void*);

// The C API reads ndim strides through a bare pointer: the count is checked here.
const int64_t* strides_of(const std::optional<std::vector<int64_t>>& strides, const te_tensor& t, const char* name) {
  if (!strides) return nullptr;
  if (strides->size() != size_t(t.ndim)) {
    throw nb::value_error((std::string(name) + " must have one stride per dim (" + std::to_string(t.ndim) + "), got " +
                           std::to_string(strides->size()))
                              .c_str());
  }
  return strides->data();
}

// x: input (forward) or grad_output (backward); y: output or grad_input.
void def_rope(nb::module_& m, const char* name, RopeOp op, const char* x_name, const char* strides_name,
              const char* y_name) {
  m.def(
      name,
      [op, strides_name](const te_tensor& x, const std::optional<std::vector<int64_t>>& x_strides,
                         const te_tensor& freqs, const te_tensor* cu_seqlens, const te_tensor* start_positions,
                         const te_tensor& y, int32_t format, bool interleaved, int32_t cp_size, int32_t cp_rank,
                         uintptr_t stream) {
        const int64_t* strides = strides_of(x_strides, x, strides_name);
        const te_rope_config config{format, interleaved ? 1 : 0, cp_size, cp_rank};
        call_core(
            [&] { return op(&x, strides, &freqs, cu_seqlens, start_positions, &y, &config, as_ptr<void>(stream)); });
      },
      nb::arg(x_name), nb::arg(strides_name).none(), nb::arg("freqs"), nb::arg("cu_seqlens").none(),
      nb::arg("start_positions").none(), nb::arg(y_name), nb::arg("format"), nb::arg("interleaved") = false,
      nb::arg("cp_size") = 1, nb::arg("cp_rank") = 0, nb::arg("stream") = 0);
}

}  // namespace

void bind_rope(nb::module_& m) {
  nb::enum_<te_rope_format>(m, "RopeFormat", nb::is_arithmetic(), "Tensor layouts of the rope ops")
      .value("SBHD", TE_ROPE_SBHD)
      .value("BSHD", TE_ROPE_BSHD)
      .value("THD", TE_ROPE_THD);
  def_rope(m, "rope_fwd", te_rope_fwd, "input", "input_strides", "output");
  def_rope(m, "rope_bwd", te_rope_bwd, "grad_output", "grad_output_strides", "grad_input");
}
