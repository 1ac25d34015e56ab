// Shared by the binding's source files (core_module.cpp and one file per op
// family that registers itself from there): core status -> Python exception,
// GIL release around core calls, integer -> pointer.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>

#include "opente/status.h"

namespace opente_binding {

namespace nb = nanobind;

inline void raise_on_error(te_status status) {
  if (status == TE_SUCCESS) return;
  const std::string message = te_last_error_message();
  PyObject* type = status == TE_ERROR_INVALID_ARGUMENT  ? PyExc_ValueError
                   : status == TE_ERROR_NOT_IMPLEMENTED ? PyExc_NotImplementedError
                                                        : PyExc_RuntimeError;
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

// Runs a core call without the GIL (CPU ops on large tensors take a while),
// then raises its error, if any, with the GIL held again.
template <class Call>
inline void call_core(Call&& call) {
  te_status status;
  {
    nb::gil_scoped_release release;
    status = call();
  }
  raise_on_error(status);
}

template <class T>
inline T* as_ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace opente_binding
