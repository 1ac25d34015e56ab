#include "ops/gemm/cublaslt_api.h"

#include <mutex>
#include <string>

#include "common/dynamic_library.h"
#include "common/error.h"

namespace opente {
namespace {

// The SONAME of the cuBLAS we were compiled against (libcublasLt.so.13 for CUDA 13).
constexpr const char* kLibrary = "libcublasLt.so." OPENTE_STR(CUBLAS_VER_MAJOR);
constexpr const char* kToolkitLibrary = "/usr/local/cuda/lib64/libcublasLt.so." OPENTE_STR(CUBLAS_VER_MAJOR);

CublasLtApi load() {
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) lib = dlopen(kToolkitLibrary, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fail(TE_ERROR_CUDA, concat("cannot load ", kLibrary, " for the GEMM: import torch first (its CUDA wheels ship it) ",
                               "or put the CUDA toolkit's lib64 on LD_LIBRARY_PATH (", dlerror(), ")"));
  }
  CublasLtApi api{};
  resolve_symbol(lib, kLibrary, "cublasLtCreate", api.create);
  resolve_symbol(lib, kLibrary, "cublasLtGetStatusString", api.status_string);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulDescCreate", api.desc_create);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulDescDestroy", api.desc_destroy);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulDescSetAttribute", api.desc_set);
  resolve_symbol(lib, kLibrary, "cublasLtMatrixLayoutCreate", api.layout_create);
  resolve_symbol(lib, kLibrary, "cublasLtMatrixLayoutDestroy", api.layout_destroy);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulPreferenceCreate", api.pref_create);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulPreferenceDestroy", api.pref_destroy);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulPreferenceSetAttribute", api.pref_set);
  resolve_symbol(lib, kLibrary, "cublasLtMatmulAlgoGetHeuristic", api.heuristic);
  resolve_symbol(lib, kLibrary, "cublasLtMatmul", api.matmul);
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
