// Launches in thread block clusters (Hopper and later): blocks of one cluster run at
// once on one GPC and may read each other's shared memory (distributed shared memory).
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace opente {

// A launch of `grid` blocks (a multiple of `blocks`) of `threads` in clusters of
// `blocks` along x; `attribute` holds the cluster shape the config points to, so it
// must outlive the launch.
inline cudaLaunchConfig_t cluster_launch_config(int64_t grid, int threads, size_t smem, cudaStream_t stream,
                                                int blocks, cudaLaunchAttribute& attribute) {
  attribute = cudaLaunchAttribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(blocks), attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(grid));
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return config;
}

// How many clusters of `blocks` of `kernel`'s blocks (`threads` threads, `smem` bytes of
// dynamic shared memory) can run at once on `device`, the current device; 0 where
// none can (a partitioned context with too few SMs a GPC). Cached: a host query, not free.
int max_active_clusters(const void* kernel, int threads, size_t smem, int blocks, int device);

}  // namespace opente
