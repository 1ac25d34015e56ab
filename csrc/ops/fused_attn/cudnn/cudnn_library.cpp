#include "ops/fused_attn/cudnn/cudnn_library.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include <array>
#include <mutex>
#include <string>

#include "common/cuda_utils.h"
#include "common/dynamic_library.h"
#include "common/error.h"
#include "cudnn_frontend_version.h"

// cudnn-frontend's dynamic loading resolves every cuDNN symbol in this handle
// (declared by cudnn_frontend_shim.h); it is set once, before any frontend call.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace opente {
namespace {

// The SONAME of the cuDNN major we were compiled against (libcudnn.so.9).
constexpr const char* kLibrary = "libcudnn.so." OPENTE_STR(CUDNN_MAJOR);
constexpr const char* kToolkitLibrary = "/usr/local/cuda/lib64/libcudnn.so." OPENTE_STR(CUDNN_MAJOR);

struct CudnnApi {
  int64_t version = 0;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
};

// OPENTE_CUDNN_LIBRARY, then the loader's search (finds the copy torch already
// mapped: dlopen matches a loaded library by its SONAME), then the toolkit's.
void* open_library() {
  std::string tried;
  const char* user = getenv("OPENTE_CUDNN_LIBRARY");
  const char* candidates[] = {user && *user ? user : nullptr, kLibrary, kToolkitLibrary};
  for (const char* name : candidates) {
    if (!name) continue;
    if (void* lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) return lib;
    const char* why = dlerror();
    tried += concat(tried.empty() ? "" : "; ", name, ": ", why ? why : "not found");
  }
  fail(TE_ERROR_CUDA, concat("cuDNN not found (", tried, "). Import torch first (its CUDA wheels ship ", kLibrary,
                             " in nvidia/cudnn/lib), put that folder on LD_LIBRARY_PATH, or set ",
                             "OPENTE_CUDNN_LIBRARY to the library's path"));
}

CudnnApi load() {
  void* lib = open_library();
  CudnnApi api;
  decltype(&cudnnGetVersion) get_version = nullptr;
  resolve_symbol(lib, kLibrary, "cudnnGetVersion", get_version);
  resolve_symbol(lib, kLibrary, "cudnnCreate", api.create);
  resolve_symbol(lib, kLibrary, "cudnnSetStream", api.set_stream);
  resolve_symbol(lib, kLibrary, "cudnnGetErrorString", api.error_string);
  api.version = int64_t(get_version());
  const int64_t major = api.version / 10000;
  if (major != CUDNN_MAJOR) {
    fail(TE_ERROR_CUDA, concat("the loaded cuDNN is version ", api.version, ", but OpenTE was built against cuDNN ",
                               CUDNN_MAJOR, ".x headers"));
  }
  // The frontend reaches the CUDA runtime through its own dlopen and, finding both
  // libcudart.so.12 and .13, would take the first: name the one whose ABI we were
  // compiled against, unless the user already chose.
  const std::string cudart = concat("libcudart.so.", CUDART_VERSION / 1000);
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
  cudnn_frontend::cudnn_dlhandle = lib;
  return api;
}

const CudnnApi& api() {
  // Not std::call_once: a failed load must be retried (and report its error) on the next call.
  static std::mutex mutex;
  static CudnnApi loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded.version == 0) loaded = load();
  return loaded;
}

void cudnn_check(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  fail(TE_ERROR_CUDA, concat("cuDNN error in ", call, ": ", api().error_string(status)));
}

}  // namespace

int64_t cudnn_runtime_version() { return api().version; }

int64_t cudnn_frontend_compiled_version() { return CUDNN_FRONTEND_VERSION; }

cudnnHandle_t cudnn_handle(int device) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static std::array<cudnnHandle_t, kMaxDevices> handles{};
  OPENTE_CHECK_ARG(device >= 0 && device < kMaxDevices, "device index ", device, " is out of range");
  const CudnnApi& cudnn = api();
  std::lock_guard<std::mutex> lock(mutex);
  if (!handles[device]) {
    DeviceGuard guard(device);  // cudnnCreate binds the handle to the current device
    cudnn_check(cudnn.create(&handles[device]), "cudnnCreate");
  }
  return handles[device];
}

void cudnn_set_stream(cudnnHandle_t handle, void* stream) {
  cudnn_check(api().set_stream(handle, static_cast<cudaStream_t>(stream)), "cudnnSetStream");
}

}  // namespace opente
