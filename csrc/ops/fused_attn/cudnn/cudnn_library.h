// cuDNN, loaded on first use with dlopen (as cuBLASLt is for the GEMM): a build
// with cuDNN support imports and runs everything else on a machine without
// libcudnn, and says where it looked when fused attention asks for it.
// cudnn-frontend is compiled with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING and finds
// every backend symbol through the handle this loader sets.
#pragma once

#include <cudnn.h>
#include <stdint.h>

namespace opente {

// The loaded cuDNN's version (e.g. 91900); loads it first. Throws opente::Error
// (TE_ERROR_CUDA) when no libcudnn can be loaded or its major version is not the
// one this build was compiled against.
int64_t cudnn_runtime_version();

// CUDNN_FRONTEND_VERSION of the headers this build used (e.g. 13200).
int64_t cudnn_frontend_compiled_version();

// The cuDNN handle of `device`, created on first use and kept for the process.
cudnnHandle_t cudnn_handle(int device);

// cudnnSetStream, with a failure thrown as opente::Error.
void cudnn_set_stream(cudnnHandle_t handle, void* stream);

}  // namespace opente
