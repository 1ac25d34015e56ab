#include "ops/gemm/cublaslt_api.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "common/error.h"

namespace opente {
namespace {

#define OPENTE_STR2(x) #x
#define OPENTE_STR(x) OPENTE_STR2(x)
// The SONAME of the cuBLAS we were compiled against (libcublasLt.so.13 for CUDA 13).
constexpr const char* kLibrary = "libcublasLt.so." OPENTE_STR(CUBLAS_VER_MAJOR);
constexpr const char* kToolkitLibrary = "/usr/local/cuda/lib64/libcublasLt.so." OPENTE_STR(CUBLAS_VER_MAJOR);

template <class Fn>
void resolve(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!fn) fail(TE_ERROR_CUDA, concat(kLibrary, " has no symbol ", name));
}

CublasLtApi load() {
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen(kToolkitLibrary, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fail(TE_ERROR_CUDA, concat("cannot load ", kLibrary, " for the GEMM: import torch first (its CUDA wheels ship it) ",
                               "or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH (", dlerror(), ")"));
  }
  CublasLtApi api{};
  resolve(lib, "cublasLtCreate", api.create);
  resolve(lib, "cublasLtGetStatusString", api.status_string);
  resolve(lib, "cublasLtMatmulDescCreate", api.desc_create);
  resolve(lib, "cublasLtMatmulDescDestroy", api.desc_destroy);
  resolve(lib, "cublasLtMatmulDescSetAttribute", api.desc_set);
  resolve(lib, "cublasLtMatrixLayoutCreate", api.layout_create);
  resolve(lib, "cublasLtMatrixLayoutDestroy", api.layout_destroy);
  resolve(lib, "cublasLtMatmulPreferenceCreate", api.pref_create);
  resolve(lib, "cublasLtMatmulPreferenceDestroy", api.pref_destroy);
  resolve(lib, "cublasLtMatmulPreferenceSetAttribute", api.pref_set);
  resolve(lib, "cublasLtMatmulAlgoGetHeuristic", api.heuristic);
  resolve(lib, "cublasLtMatmul", api.matmul);
  return api;
}

}  // namespace

const CublasLtApi& cublaslt_api() {
  // Not std::call_once: a failed load must be retried (and report its error) on the next call.
  static std::mutex mutex;
  static CublasLtApi api{};
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded) {
    api = load();
    loaded = true;
  }
  return api;
}

void cublas_check(cublasStatus_t status, const char* call, const char* what_unsupported) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const char* name = cublaslt_api().status_string(status);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
    fail(TE_ERROR_NOT_IMPLEMENTED, concat("cuBLASLt does not support ", what_unsupported, " (", call, ": ", name, ")"));
  }
  fail(TE_ERROR_CUDA, concat("cuBLASLt error in ", call, ": ", name));
}

}  // namespace opente
