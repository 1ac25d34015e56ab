// Symbols of the CUDA libraries OpenTE opens at run time with dlopen (cuBLASLt for
// the GEMM, cuDNN for fused attention), so that importing OpenTE loads neither.
#pragma once

#include <dlfcn.h>

#include "common/error.h"

// A macro's value as a string literal (a library's SONAME from its version macro).
#define OPENTE_STR2(x) #x
#define OPENTE_STR(x) OPENTE_STR2(x)

namespace opente {

// fn = the symbol `name` of the opened `lib`; a TE_ERROR_CUDA naming `library` and
// the symbol when it has none.
template <class Fn>
void resolve_symbol(void* lib, const char* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!fn) fail(TE_ERROR_CUDA, concat(library, " has no symbol ", name));
}

}  // namespace opente
