// cuBLASLt, loaded on first use with dlopen. Importing the extension and
// running CPU ops must not need libcublasLt.so (a CUDA build works on a machine
// without a GPU or CUDA libraries); the first CUDA GEMM loads it, normally the
// copy PyTorch's CUDA wheels already mapped into the process.
#pragma once

#include <cublasLt.h>

namespace opente {

struct CublasLtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

// The loaded library, or opente::Error (TE_ERROR_CUDA) saying how to make it findable.
const CublasLtApi& cublaslt_api();

// Throws opente::Error for a failed cuBLASLt call: TE_ERROR_NOT_IMPLEMENTED for
// CUBLAS_STATUS_NOT_SUPPORTED (with `what_unsupported`), TE_ERROR_CUDA otherwise.
void cublas_check(cublasStatus_t status, const char* call, const char* what_unsupported = "");

}  // namespace opente
