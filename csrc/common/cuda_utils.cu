#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "common/cuda_utils.h"

namespace opente {

int multiprocessor_count(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};
  OPENTE_CHECK_ARG(device >= 0 && device < kMaxDevices, "device index ", device, " is out of range");
  int count = cached[device].load(std::memory_order_relaxed);
  if (count == 0) {
    cuda_check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(MultiProcessorCount)");
    cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

namespace {

// Occupancy of a kernel at a block size, computed once per (kernel, block size).
int resident_blocks_per_sm(const void* kernel, int threads) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(kernel, threads);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int blocks = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  cache.emplace(key, std::max(blocks, 1));
  return std::max(blocks, 1);
}

}  // namespace

int64_t grid_stride_blocks(const void* kernel, int threads, int64_t work_items, int device, int waves) {
  const int64_t wanted = (work_items + threads - 1) / threads;
  if (waves == kUncappedWaves) return std::max<int64_t>(1, wanted);
  const int64_t resident = int64_t(resident_blocks_per_sm(kernel, threads)) * multiprocessor_count(device);
  return std::max<int64_t>(1, std::min(wanted, resident * waves));
}

}  // namespace opente
