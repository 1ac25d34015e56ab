#include <algorithm>
#include <atomic>

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

int64_t grid_stride_blocks(int64_t work_items, int threads, int device) {
  const int64_t wanted = (work_items + threads - 1) / threads;
  const int64_t resident = int64_t(multiprocessor_count(device)) * (2048 / threads);
  return std::max<int64_t>(1, std::min(wanted, resident));
}

}  // namespace opente
