#include "common/cuda_cluster_launch.h"

#include <map>
#include <mutex>
#include <tuple>

#include "common/cuda_utils.h"

namespace opente {

int max_active_clusters(const void* kernel, int threads, size_t smem, int blocks, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, size_t, int>, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, threads, smem, blocks);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_launch_config(blocks, threads, smem, nullptr, blocks, attribute);
  int clusters = 0;
  cuda_check(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config), "cudaOccupancyMaxActiveClusters");
  cache.emplace(key, clusters);
  return clusters;
}

}  // namespace opente
