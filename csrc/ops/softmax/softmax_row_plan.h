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
// vectors takes the first count that fits it in one warp (or, by Fill, the one of those
// with the fewest slots), else the last one (or, by Fill, the smallest that needs no
// more threads than the last) with as many threads as it needs (see plan_rows).
// kVectorCounts, by Fill (the recomputing forwards: the causal kinds and whole rows past
// the kExpOnce kernels; the backward): 6 where 8 a thread would fill its warps no more
// than three quarters (129-192 vectors in one warp, bf16 sk about 1025-1536; 257-384 in
// two, 2049-3072; 513-576 in three, 4097-4608; the backward's power-of-two groups too:
// 1281-1536 in 256 threads, 2049-3072 in 512).
constexpr int kVectorCounts[] = {2, 4, 6, 8};
constexpr int kScalarCounts[] = {2, 8, 16};
// Vectors per thread for the kExpOnce row kernels: at most 4, so that the fp32
// exponentials (4 x kV registers a vector) leave room for enough warps. 3 for rows that
// 4 a thread would fill no more than three quarters of (Fill): bf16 sk 2047 (257 shifted
// vectors) fills 96 threads of 3 to 89%, of 4 to 67%.
constexpr int kExpOnceCounts[] = {2, 3, 4};

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

// How a row of more than one warp's vectors picks its count (plan_rows): the largest of
// the list, or the smallest whose group has no more threads than the largest's. The
// same warps then hold the row with fewer vector slots past its end, and a slot past
// the end still costs its instructions (the kernels convert every slot: selects, not
// branches). The kExpOnce forwards, bound by instruction issue, reached a same-bytes
// copy's fraction about as their slots were filled (H200, bf16 shifted rows: sk 2047 59%
// at 67% filled, 4095 65% at 80%; 5120 90% at 100%); at sk 2047 (257 vectors) 96 threads
// of 3 run a row trip of 947 instructions each (SASS, bf16, kShifted), of 4 1215.
// A row that one warp holds (sub-warp groups) takes, by kSmallestInSameThreads, the count
// whose power-of-two group leaves the fewest slots (threads x count; the smaller count
// where two tie) in groups of at least kMinSubWarpThreads, where kLargestCount takes the
// first count that fits: bf16 sk 257 (33 shifted vectors) in 16 threads of 3 (48 slots)
// rather than 32 of 2 (64), the causal forwards and the backward in 8 threads of 6 (H100,
// bf16 [8, 16, 256, 257]: every kind 1.4-1.7x faster; sk 136 and 150 in 8 of 3 and 4 of 6,
// 1.1-1.6x; before store_partial's aligned stores, the shifted rows of 4 and 8 threads
// lost up to 2.1x to their edges' byte stores).
enum class Fill { kLargestCount, kSmallestInSameThreads };

// The fewest threads a row group takes for fewer slots (by kSmallestInSameThreads): in 2
// threads of 3 or 1 of 6 (bf16 sk 40, 5 vectors) a warp's loads and stores spread over 16
// to 32 rows, and the backward ran 1.6x slower, the causal forward 1.4x, than in 4 of 2
// (H100).
constexpr int kMinSubWarpThreads = 4;

// Threads of a group that holds `units` vectors at n a thread: the fewest whole warps
// up to `whole_warps` threads, beyond it the smallest power of two.
inline int64_t group_threads(int64_t units, int n, int64_t whole_warps) {
  const int64_t threads = (units + n - 1) / n;
  const int64_t in_warps = (threads + 31) / 32 * 32;
  return in_warps <= whole_warps ? in_warps : next_pow2(threads);
}

// A row of `units` vectors takes a per-thread count that fits it into one warp, by
// `fill` (sub-warp groups for short rows, so no lanes idle; a whole warp with 8
// vectors a thread at sk = 2048 bf16), else a count by `fill` and as many warps
// as needed (group_threads), else (`split`: clusters launch here) the largest count
// on the fewest blocks (up to kMaxRowParts) of at most kMaxThreadsPerRow threads, and
// in them the fewest whole warps that hold the row, else the long-row kernels. (With
// 512 threads a block at sk = 40000 bf16, 39% of the registers held no vector and
// the upper-triangular kind ran 15-20% slower than the long-row kernel, H100.)
template <size_t kCounts>
RowPlan plan_rows(int64_t units, const int (&counts)[kCounts], bool split, int64_t whole_warps, Fill fill) {
  if (units <= 32 * int64_t(counts[kCounts - 1])) {  // one warp holds the row
    RowPlan best{};
    for (int n : counts) {  // ascending
      if (units > 32 * int64_t(n)) continue;
      const RowPlan plan{false, n, int(next_pow2((units + n - 1) / n)), 1};
      if (best.per_thread == 0) {
        best = plan;
        if (fill == Fill::kLargestCount) break;  // the first count that fits
      } else if (plan.threads_per_row >= kMinSubWarpThreads &&
                 plan.threads_per_row * n < best.threads_per_row * best.per_thread) {
        best = plan;
      }
    }
    return best;
  }
  int n = counts[kCounts - 1];
  int64_t group = group_threads(units, n, whole_warps);
  if (fill == Fill::kSmallestInSameThreads && group <= kMaxThreadsPerRow) {  // (a split row keeps the largest)
    for (int c : counts) {  // ascending; a smaller count never takes fewer threads
      if (group_threads(units, c, whole_warps) == group) {
        n = c;
        break;
      }
    }
  }
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
