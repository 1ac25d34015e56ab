// Programmatic dependent launch (Hopper and later): a small kernel that only sums
// what the kernel before it wrote (a finalize over partial sums) is launched while
// that kernel still runs, its blocks take the SMs the other's last wave leaves
// free, and they wait on the GPU for it to finish. A plain launch only starts
// once the first kernel has completed and adds the launch and ramp-up to the op.
//
// The first kernel calls allow_dependent_launch() (every block, early), the second
// calls wait_for_prerequisite_grid() before its first read and is launched with
// launch_dependent(). The wait returns once the whole first grid has completed and
// its writes are visible, so the order of results is that of a plain launch. Before
// sm_90 both device calls compile to nothing and launch_dependent launches the plain
// way: the second kernel then runs after the first, as it always did.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_utils.h"

namespace opente {

// Lets the grid launched next with launch_dependent() start before this one ends.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits until the grids this one depends on have completed and their writes are
// visible; a no-op for a grid launched the plain way.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) on `device` (the current one),
// allowed to start before the stream's previous kernel has finished where the GPU
// can (see above); `name` for the error message.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      int device, const char* name, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = compute_capability_major(device) >= 9 ? 1 : 0;
  cuda_check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

}  // namespace opente
