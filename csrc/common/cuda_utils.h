// CUDA runtime plumbing shared by every kernel file: error checks that become
// opente::Error, a device guard, and the device's multiprocessor count.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

namespace opente {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(TE_ERROR_CUDA, concat("CUDA error in ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
}

// Checks the launch that just happened (bad configuration, no device, ...).
inline void check_launch(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

// Makes `device` current for the scope of an op, restoring the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice (is a CUDA GPU present?)");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Streaming multiprocessors of `device`, queried once per device.
int multiprocessor_count(int device);

// Blocks for a kernel that strides over its work: one thread per work item,
// capped at the blocks of `kernel` that are resident on all SMs at once (from
// its occupancy, so the grid is a single wave). At least 1.
int64_t grid_stride_blocks(const void* kernel, int threads, int64_t work_items, int device);

inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace opente
