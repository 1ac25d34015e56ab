// How the CUDA softmax kernels (softmax_fwd.cu, softmax_bwd.cu) lay a row on threads: the row kernels'
// group of threads, the vectors each thread holds, the blocks of a split row, or the
// long-row kernels. Plain C++, so that the CPU test suite checks the choice for every
// row length (tests/cpp/test_softmax_row_plan.cpp); a GPU run meets only the lengths
// it tests.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <algorithm>

namespace opente {
namespace softmax_rows {

// Row groups span up to 512 threads (__launch_bounds__ leaves 128 registers a
// thread); blocks of several row groups have at least 128 threads (block_rows).
constexpr int kMaxThreadsPerRow = 512;
constexpr int kMinBlockThreads = 128;
constexpr int kLongRowThreads = 512;
// Blocks a row may be split over (kSplit): the portable cluster size.
constexpr int kMaxRowParts = 8;

// Vectors per thread in the row kernels, smallest first: a row of `units`
// vectors takes the first count that fits it in one warp, else the last one with
// as many threads as it needs (see plan_rows).
constexpr int kVectorCounts[] = {2, 4, 8};
constexpr int kScalarCounts[] = {2, 8, 16};
// Vectors per thread for the kExpOnce row kernels: at most 4, so that the fp32
// exponentials (4 x kV registers a vector) leave room for enough warps.
constexpr int kExpOnceCounts[] = {2, 4};

// Row groups in whole warps rather than powers of two, up to these many threads (see
// plan_rows). The forward gains where the power of two leaves slots empty (H200, bf16:
// sk 5120 160 threads against 256, 1.37x; 4095 shifted 1.47x; 12288 1.10x; no loss from
// 2047 to 28672); the backward (106-121 registers) gains up to five warps (sk 5120 and
// 10240 1.07x, fp32 4099 1.19x) and loses 2-7% at six, seven, ten and fourteen
// (sk 12288, 14336, 20480, 28672), where it keeps the power of two.
constexpr int64_t kFwdWholeWarps = kMaxThreadsPerRow;
constexpr int64_t kBwdWholeWarps = 160;

// How rows of sk elements are laid out on threads (the one place of these choices).
struct RowPlan {
  bool long_rows;       // the long-row kernels; the fields below are for the row kernels
  int per_thread;       // kN: vectors a thread holds
  int threads_per_row;  // G: a power of two up to 32, else whole warps, at most kMaxThreadsPerRow
  int parts;            // blocks a row: > 1 splits it over a cluster (kSplit)
};

inline int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// A row of `units` vectors takes the first per-thread count that fits it into
// one warp (sub-warp groups for short rows, so no lanes idle; a whole warp with 8
// vectors a thread at sk = 2048 bf16), else the largest count and as many warps
// as needed (up to `whole_warps` threads the fewest whole warps that hold the row,
// beyond it a power of two), else (`split`: clusters launch here) the largest count
// on the fewest blocks (up to kMaxRowParts) of at most kMaxThreadsPerRow threads, and
// in them the fewest whole warps that hold the row, else the long-row kernels. (With
// 512 threads a block at sk = 40000 bf16, 39% of the registers held no vector and
// the upper-triangular kind ran 15-20% slower than the long-row kernel, H100.)
template <size_t kCounts>
RowPlan plan_rows(int64_t units, const int (&counts)[kCounts], bool split, int64_t whole_warps) {
  for (int n : counts) {
    if (units <= 32 * int64_t(n)) return {false, n, int(next_pow2((units + n - 1) / n)), 1};
  }
  const int n = counts[kCounts - 1];
  const int64_t threads = (units + n - 1) / n;
  const int64_t in_warps = (threads + 31) / 32 * 32;
  const int64_t group = in_warps <= whole_warps ? in_warps : next_pow2(threads);
  if (group <= kMaxThreadsPerRow) return {false, n, int(group), 1};
  const int64_t block_units = int64_t(kMaxThreadsPerRow) * n;
  const int64_t parts = (units + block_units - 1) / block_units;
  // at least 8 (a split row has more than kMaxThreadsPerRow * n units): blockDim.y = 1
  const int64_t warps = (units + parts * n * 32 - 1) / (parts * n * 32);
  if (split && parts <= kMaxRowParts) return {false, n, int(32 * warps), int(parts)};
  return {true, 0, kLongRowThreads, 1};
}

// Row groups a block of the row kernels holds (blockDim.y): 128 / G for groups of fewer
// than 128 threads, else one (a group of 96 threads is a block of 96).
inline int block_rows(const RowPlan& plan) { return std::max(1, kMinBlockThreads / plan.threads_per_row); }

// The vectors a row of sk elements spans: kShifted, from the aligned address up to kV - 1
// elements before it.
template <int kV, bool kShifted>
int64_t row_units(int64_t sk) {
  return kShifted ? (sk + 2 * (kV - 1)) / kV : sk / kV;
}

}  // namespace softmax_rows
}  // namespace opente
