// Softmax ops of transformer_engine._core (see opente/softmax.h).
#include <nanobind/nanobind.h>

#include "binding/binding_util.h"
#include "opente/opente.h"

namespace nb = nanobind;

void bind_softmax(nb::module_& m) {
  (void)m;  // the softmax ops register here
}
