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

// Makes `device` current for the scope of an op, restoring the caller's device. Calls
// cudaSetDevice only when the device changes: every op takes a guard, and the caller's
// device is almost always the op's already.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice (is a CUDA GPU present?)");
    if (previous_ != device) {
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Streaming multiprocessors of `device`, queried once per device.
int multiprocessor_count(int device);
// The major compute capability of `device` (9 for Hopper), queried once per device.
int compute_capability_major(int device);
// The most shared memory a block of `device` may take, static and dynamic together, once
// a kernel opts in (cudaFuncAttributeMaxDynamicSharedMemorySize): 227 KiB on Hopper, 163
// KiB on an A100. Queried once per device.
int max_block_shared_memory(int device);
// The device's peak DRAM bandwidth an SM, GB/s, from its memory clock and bus width
// (H100 SXM 25.4: 3.35 TB/s over 132 SMs; H200 37.2: 4.9 TB/s over the same SMs); 0
// where the device reports no memory clock. Kernels that choose a form by how far memory
// outruns an SM's issue read it. Queried once per device. The environment variable
// OPENTE_DRAM_GB_PER_S_PER_SM, where set, replaces it for every device (tests run the
// H200's forms on an H100 with it, and a device whose attributes mislead can be set
// right: under MIG they may give the whole GPU's memory bus beside the instance's SMs);
// a value that is not a number >= 0 is an invalid argument.
double dram_gb_per_s_per_sm(int device);
// Whether `device` takes cooperative launches (cudaLaunchAttributeCooperative: the grid's
// blocks all resident at once, so they may wait on one another). Queried once per device.
bool cooperative_launch_supported(int device);

// Blocks for a kernel that strides over its work: one thread per work item,
// capped at `waves` times the blocks of `kernel` that are resident on all SMs at
// once (from its occupancy); waves = 0: no cap, every block makes one pass. At least 1.
//
// How many waves, measured on an H100 (bf16, 16384 x 4096): the element-wise kernels
// with no block-wide reduction read and wrote at 94-100% of copy bandwidth with a
// block per pass, 82-92% striding over one wave (new blocks start on whichever SM
// frees up, where a strided block holds its SM to the end). A kernel whose blocks
// each end in a reduction (the amax of an FP8 output) pays that ending once per
// block: four waves were best there (gelu -> FP8 91.5%, against 88.4% in one wave and
// 87.6% uncapped).
constexpr int kUncappedWaves = 0;
constexpr int kReducingKernelWaves = 4;
int64_t grid_stride_blocks(const void* kernel, int threads, int64_t work_items, int device, int waves = 1);

inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace opente
