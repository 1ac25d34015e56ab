#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "common/cuda_utils.h"

namespace opente {

namespace {

constexpr int kMaxDevices = 64;

// cudaDeviceGetAttribute(attribute, device), queried once per device into `cache` (every
// attribute asked for here is nonzero, so 0 means "not queried yet").
int cached_device_attribute(std::atomic<int> (&cache)[kMaxDevices], cudaDeviceAttr attribute, int device,
                            const char* what) {
  OPENTE_CHECK_ARG(device >= 0 && device < kMaxDevices, "device index ", device, " is out of range");
  int value = cache[device].load(std::memory_order_relaxed);
  if (value == 0) {
    cuda_check(cudaDeviceGetAttribute(&value, attribute, device), what);
    cache[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

}  // namespace

int multiprocessor_count(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_device_attribute(cached, cudaDevAttrMultiProcessorCount, device,
                                 "cudaDeviceGetAttribute(MultiProcessorCount)");
}

int compute_capability_major(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_device_attribute(cached, cudaDevAttrComputeCapabilityMajor, device,
                                 "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
}

int max_block_shared_memory(int device) {
  static std::atomic<int> cached[kMaxDevices] = {};
  return cached_device_attribute(cached, cudaDevAttrMaxSharedMemoryPerBlockOptin, device,
                                 "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
}

namespace {

// OPENTE_DRAM_GB_PER_S_PER_SM, read once: a number >= 0, or -1 where it is not set.
double dram_figure_from_environment() {
  static const double figure = [] {
    const char* text = getenv("OPENTE_DRAM_GB_PER_S_PER_SM");
    if (!text || !*text) return -1.0;
    char* end = nullptr;
    const double value = strtod(text, &end);
    return *end == '\0' && value >= 0.0 && value < 1e9 ? value : -2.0;  // -2: not a figure
  }();
  OPENTE_CHECK_ARG(figure != -2.0, "OPENTE_DRAM_GB_PER_S_PER_SM=", getenv("OPENTE_DRAM_GB_PER_S_PER_SM"),
                   " is not a bandwidth (GB/s an SM, a number >= 0)");
  return figure;
}

}  // namespace

double dram_gb_per_s_per_sm(int device) {
  const double from_environment = dram_figure_from_environment();
  if (from_environment >= 0.0) return from_environment;
  static std::atomic<int> clock_khz[kMaxDevices] = {};
  static std::atomic<int> bus_bits[kMaxDevices] = {};
  const double clock = cached_device_attribute(clock_khz, cudaDevAttrMemoryClockRate, device,
                                               "cudaDeviceGetAttribute(MemoryClockRate)");
  const double bits = cached_device_attribute(bus_bits, cudaDevAttrGlobalMemoryBusWidth, device,
                                              "cudaDeviceGetAttribute(GlobalMemoryBusWidth)");
  // two transfers a clock (the attribute is the peak clock of DDR / HBM memory)
  return 2.0 * clock * 1e3 * (bits / 8) / 1e9 / multiprocessor_count(device);
}

bool cooperative_launch_supported(int device) {
  // cached as the attribute + 1: the attribute itself may be 0
  static std::atomic<int> cached[kMaxDevices] = {};
  OPENTE_CHECK_ARG(device >= 0 && device < kMaxDevices, "device index ", device, " is out of range");
  int value = cached[device].load(std::memory_order_relaxed);
  if (value == 0) {
    cuda_check(cudaDeviceGetAttribute(&value, cudaDevAttrCooperativeLaunch, device),
               "cudaDeviceGetAttribute(CooperativeLaunch)");
    cached[device].store(++value, std::memory_order_relaxed);
  }
  return value > 1;
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
