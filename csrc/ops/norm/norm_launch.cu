// Grids of the norm kernels in waves of their occupancy (norm_launch.h).
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "common/cuda_utils.h"
#include "ops/norm/norm_launch.h"

namespace opente {

int64_t norm_resident_grid(const void* kernel, const NormRowShape& shape, size_t dynamic_smem, int64_t rows,
                           int device, int waves) {
  // Host-side queries, but not free: once per device, kernel and block shape. A
  // kernel's dynamic shared memory limit only grows, so every earlier shape still fits.
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*>, size_t> smem_limits;
  static std::map<std::tuple<int, const void*, int, size_t>, int> occupancy;
  const int threads = shape.block_threads();
  int per_sm = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    // Raised whenever a shape needs more: the 48 KiB default counts the kernel's static
    // shared memory too, so a dynamic size just under it can still fail to launch.
    size_t& limit = smem_limits[std::make_tuple(device, kernel)];
    if (dynamic_smem > limit) {
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dynamic_smem)),
                 "cudaFuncSetAttribute(norm, MaxDynamicSharedMemorySize)");
      limit = dynamic_smem;
    }
    const auto key = std::make_tuple(device, kernel, threads, dynamic_smem);
    auto it = occupancy.find(key);
    if (it != occupancy.end()) {
      per_sm = it->second;
    } else {
      cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, dynamic_smem),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor(norm)");
      per_sm = std::max(per_sm, 1);
      occupancy.emplace(key, per_sm);
    }
  }
  const int64_t wanted = (rows + shape.rows_per_block - 1) / shape.rows_per_block;
  if (waves == kUncappedWaves) return std::max<int64_t>(1, wanted);
  const int64_t resident = int64_t(per_sm) * multiprocessor_count(device);
  return std::max<int64_t>(1, std::min(wanted, resident * waves));
}

bool norm_memory_outruns_sms(int device) { return dram_gb_per_s_per_sm(device) >= kNormMemoryOutrunsSmsGBPerSm; }

int64_t norm_bwd_grid(int64_t resident_grid, int device) {
  if (resident_grid <= kNormMaxRowBlocks) return resident_grid;
  const int64_t sms = multiprocessor_count(device);
  return sms <= kNormMaxRowBlocks ? kNormMaxRowBlocks / sms * sms : kNormMaxRowBlocks;
}

}  // namespace opente
