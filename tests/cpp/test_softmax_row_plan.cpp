// The row layouts of the CUDA softmax kernels (ops/softmax/softmax_row_plan.h), checked
// on the CPU for every row length up to past the split range: the kernels rely on these
// properties (a group covers its row, sub-warp groups are powers of two inside a warp,
// larger ones whole warps, a split row's blocks hold it with the fewest warps and parts),
// and a GPU run only meets the lengths it tests.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "ops/softmax/softmax_row_plan.h"

namespace {

using namespace opente::softmax_rows;

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Every plan_rows result for `units` vectors of one count list, one whole-warp limit, one
// split setting and one Fill.
template <size_t kCounts>
void check_plan(int64_t units, const int (&counts)[kCounts], bool split, int64_t whole_warps, Fill fill) {
  const RowPlan plan = plan_rows(units, counts, split, whole_warps, fill);
  SCOPED_TRACE(testing::Message() << "units " << units << " split " << split << " whole_warps " << whole_warps
                                  << " fill " << int(fill));
  const int largest = counts[kCounts - 1];
  const int64_t one_block = int64_t(kMaxThreadsPerRow) * largest;
  if (plan.long_rows) {
    // only rows no block holds, and that no cluster holds where clusters may launch
    EXPECT_GT(units, one_block);
    if (split) {
      EXPECT_GT(units, one_block * kMaxRowParts);
    }
    EXPECT_EQ(plan.threads_per_row, kLongRowThreads);
    return;
  }
  const int64_t n = plan.per_thread, g = plan.threads_per_row;
  ASSERT_GE(g, 1);
  ASSERT_LE(g, kMaxThreadsPerRow);
  // the first count whose single warp holds the row (by kSmallestInSameThreads, of those
  // in groups of at least kMinSubWarpThreads, the one whose power-of-two group has fewer
  // slots than the first's, the first of the fewest), else the largest; by
  // kSmallestInSameThreads, where one block holds the row, the smallest count that holds
  // it in as many threads as the largest
  int expected_n = largest;
  int64_t fewest_slots = INT64_MAX;
  for (int c : counts) {
    if (units > 32 * int64_t(c)) continue;
    const int64_t threads = next_pow2((units + c - 1) / c);
    if (fill == Fill::kLargestCount) {
      expected_n = c;
      break;
    }
    if (fewest_slots == INT64_MAX || (threads >= kMinSubWarpThreads && threads * c < fewest_slots)) {
      fewest_slots = threads * c;
      expected_n = c;
    }
  }
  if (fill == Fill::kSmallestInSameThreads && units > 32 * int64_t(largest) && plan.parts == 1) {
    const int64_t largest_group = group_threads(units, largest, whole_warps);
    for (int c : counts) {
      if (group_threads(units, c, whole_warps) == largest_group) {
        expected_n = c;
        break;
      }
    }
    EXPECT_EQ(g, largest_group);  // no more threads than the largest count takes
  }
  EXPECT_EQ(n, expected_n);
  // the group (with its blocks) covers the row
  EXPECT_GE(g * n * plan.parts, units);
  if (plan.parts > 1) {
    ASSERT_TRUE(split);
    EXPECT_LE(plan.parts, kMaxRowParts);
    EXPECT_GT(units, one_block);                                  // one block does not hold it
    EXPECT_LT(int64_t(plan.parts - 1) * one_block, units);        // the fewest blocks
    EXPECT_EQ(g % 32, 0);                                         // whole warps
    EXPECT_LT((g - 32) * n * plan.parts, units);                  // the fewest of them
    EXPECT_GE(g, kMinBlockThreads);                               // a row a block: blockDim.y = 1
    EXPECT_EQ(block_rows(plan), 1);
    return;
  }
  if (g <= 32) {
    // lanes in an aligned power-of-two span of a warp (the shuffle butterfly), the fewest
    EXPECT_TRUE(is_power_of_two(g)) << g;
    if (g > 1) {
      EXPECT_LT(g / 2 * n, units);
    }
  } else {
    EXPECT_EQ(g % 32, 0) << g;
    const int64_t fewest_warps = ((units + n - 1) / n + 31) / 32 * 32;
    if (fewest_warps <= whole_warps) {
      EXPECT_EQ(g, fewest_warps);
    } else {  // beyond the limit a power of two, the smallest that holds the row
      EXPECT_TRUE(is_power_of_two(g)) << g;
      EXPECT_LT(g / 2 * n, units);
    }
  }
  // blocks of whole warps within __launch_bounds__, at least kMinBlockThreads where they
  // hold several row groups
  const int block = int(g) * block_rows(plan);
  EXPECT_EQ(block % 32, 0) << block;
  EXPECT_LE(block, kMaxThreadsPerRow);
  if (block_rows(plan) > 1) {
    EXPECT_GE(block, kMinBlockThreads);
  }
}

template <size_t kCounts>
void check_all_lengths(const int (&counts)[kCounts]) {
  const int64_t past_split = int64_t(kMaxRowParts) * kMaxThreadsPerRow * counts[kCounts - 1] + 1000;
  for (int64_t units = 1; units <= past_split; ++units) {
    for (const bool split : {false, true}) {
      for (const int64_t whole_warps : {kFwdWholeWarps, kBwdWholeWarps}) {
        for (const Fill fill : {Fill::kLargestCount, Fill::kSmallestInSameThreads}) {
          check_plan(units, counts, split, whole_warps, fill);
          if (::testing::Test::HasFailure()) return;  // one report, not thousands
        }
      }
    }
  }
}

TEST(SoftmaxRowPlan, VectorCountsEveryLength) { check_all_lengths(kVectorCounts); }
TEST(SoftmaxRowPlan, ScalarCountsEveryLength) { check_all_lengths(kScalarCounts); }
TEST(SoftmaxRowPlan, ExpOnceCountsEveryLength) { check_all_lengths(kExpOnceCounts); }

// The rule's measured cases (softmax_row_plan.h): whole warps where a power of two left
// slots empty, and the backward's power of two past kBwdWholeWarps.
TEST(SoftmaxRowPlan, WholeWarpsAndTheBackwardsLimit) {
  // bf16 sk 2047 shifted: 257 vectors, 4 a thread -> three warps, not four (kLargestCount;
  // the kExpOnce forwards take 3 a thread there: SmallestCountInTheSameThreads)
  RowPlan p = plan_rows(257, kExpOnceCounts, false, kFwdWholeWarps, Fill::kLargestCount);
  EXPECT_EQ(p.per_thread, 4);
  EXPECT_EQ(p.threads_per_row, 96);
  EXPECT_EQ(block_rows(p), 1);
  // bf16 sk 5120: 640 vectors -> 160 threads forward (kExpOnce) and backward (8 a thread: 80 -> 96)
  EXPECT_EQ(plan_rows(640, kExpOnceCounts, false, kFwdWholeWarps, Fill::kSmallestInSameThreads).threads_per_row, 160);
  EXPECT_EQ(plan_rows(640, kVectorCounts, false, kBwdWholeWarps, Fill::kLargestCount).threads_per_row, 96);
  // bf16 sk 10240 backward: 1280 vectors, 160 threads; sk 12288: 192 would pass the limit -> 256
  EXPECT_EQ(plan_rows(1280, kVectorCounts, false, kBwdWholeWarps, Fill::kLargestCount).threads_per_row, 160);
  EXPECT_EQ(plan_rows(1536, kVectorCounts, false, kBwdWholeWarps, Fill::kLargestCount).threads_per_row, 256);
  EXPECT_EQ(plan_rows(1536, kVectorCounts, false, kFwdWholeWarps, Fill::kLargestCount).threads_per_row, 192);
  // powers of two stay as they were: bf16 sk 2048 is 256 vectors, two warps of 4 a thread
  p = plan_rows(256, kExpOnceCounts, false, kFwdWholeWarps, Fill::kSmallestInSameThreads);
  EXPECT_EQ(p.threads_per_row, 64);
  EXPECT_EQ(block_rows(p), 2);
  // short rows: sub-warp groups, 128-thread blocks (sk 96 bf16: 12 vectors, 2 a thread -> 8 lanes)
  p = plan_rows(12, kVectorCounts, false, kBwdWholeWarps, Fill::kLargestCount);
  EXPECT_EQ(p.threads_per_row, 8);
  EXPECT_EQ(block_rows(p), 16);
}

// Fill::kSmallestInSameThreads (the kExpOnce forwards): 3 a thread where 4 would fill the
// same warps no more than three quarters, 4 elsewhere.
TEST(SoftmaxRowPlan, SmallestCountInTheSameThreads) {
  const auto plan = [](int64_t units) {
    return plan_rows(units, kExpOnceCounts, true, kFwdWholeWarps, Fill::kSmallestInSameThreads);
  };
  // bf16 sk 2047 shifted (257 vectors): 96 threads of 3, not of 4
  RowPlan p = plan(257);
  EXPECT_EQ(p.per_thread, 3);
  EXPECT_EQ(p.threads_per_row, 96);
  // bf16 sk 1536 (192 vectors): two warps of 3; sk 768 (96): one warp of 3
  EXPECT_EQ(plan(192).per_thread, 3);
  EXPECT_EQ(plan(192).threads_per_row, 64);
  EXPECT_EQ(plan(96).per_thread, 3);
  EXPECT_EQ(plan(96).threads_per_row, 32);
  // bf16 sk 4095 shifted (513 vectors): 3 a thread would take 192 threads, 4 take 160
  p = plan(513);
  EXPECT_EQ(p.per_thread, 4);
  EXPECT_EQ(p.threads_per_row, 160);
  // full at 4 (sk 2048, 3072, 5120 bf16) and short rows (sk 512) as the largest count leaves them
  for (const int64_t units : {256, 384, 640, 64}) {
    const RowPlan largest = plan_rows(units, kExpOnceCounts, true, kFwdWholeWarps, Fill::kLargestCount);
    EXPECT_EQ(plan(units).per_thread, largest.per_thread) << units;
    EXPECT_EQ(plan(units).threads_per_row, largest.threads_per_row) << units;
  }
  // a split row keeps the largest count, the one with a kSplit kernel (bf16 sk 24576: 3072 vectors)
  p = plan(3072);
  EXPECT_EQ(p.parts, 2);
  EXPECT_EQ(p.per_thread, 4);
}

// The recomputing forwards (the causal kinds) and the backward: 6 a thread where 8 would
// fill the same warps no more than three quarters.
TEST(SoftmaxRowPlan, VectorsSixInTheSameThreads) {
  const auto plan = [](int64_t units, int64_t whole_warps) {
    return plan_rows(units, kVectorCounts, true, whole_warps, Fill::kSmallestInSameThreads);
  };
  for (const int64_t whole_warps : {kFwdWholeWarps, kBwdWholeWarps}) {
    // bf16 sk 2047 shifted (257 vectors): two warps of 6, not of 8; sk 1536 (192): one warp of 6
    EXPECT_EQ(plan(257, whole_warps).per_thread, 6);
    EXPECT_EQ(plan(257, whole_warps).threads_per_row, 64);
    EXPECT_EQ(plan(192, whole_warps).per_thread, 6);
    EXPECT_EQ(plan(192, whole_warps).threads_per_row, 32);
    // sk 2048 (256) stays one warp of 8, sk 5120 (640) three warps of 8 (6 would take four)
    EXPECT_EQ(plan(256, whole_warps).per_thread, 8);
    EXPECT_EQ(plan(256, whole_warps).threads_per_row, 32);
    EXPECT_EQ(plan(640, whole_warps).per_thread, 8);
    EXPECT_EQ(plan(640, whole_warps).threads_per_row, 96);
    // split rows keep 8, the count with a kSplit kernel (bf16 sk 65536: 8192 vectors)
    EXPECT_EQ(plan(8192, whole_warps).parts, 2);
    EXPECT_EQ(plan(8192, whole_warps).per_thread, 8);
  }
  // the backward's power-of-two groups: bf16 sk 12288 (1536 vectors) in 256 threads of 6,
  // sk 20480 (2560) in 512 of 6; the forward's whole warps keep 8 there (192 and 320 threads)
  EXPECT_EQ(plan(1536, kBwdWholeWarps).per_thread, 6);
  EXPECT_EQ(plan(1536, kBwdWholeWarps).threads_per_row, 256);
  EXPECT_EQ(plan(2560, kBwdWholeWarps).per_thread, 6);
  EXPECT_EQ(plan(2560, kBwdWholeWarps).threads_per_row, 512);
  EXPECT_EQ(plan(1536, kFwdWholeWarps).per_thread, 8);
  EXPECT_EQ(plan(1536, kFwdWholeWarps).threads_per_row, 192);
  EXPECT_EQ(plan(2560, kFwdWholeWarps).per_thread, 8);
  EXPECT_EQ(plan(2560, kFwdWholeWarps).threads_per_row, 320);
}

// Rows one warp holds, by kSmallestInSameThreads: the fewest slots, so that fewer of a
// warp's instructions go to slots past the row's end.
TEST(SoftmaxRowPlan, SubWarpRowsFewestSlots) {
  const auto plan = [](int64_t units, const auto& counts) {
    return plan_rows(units, counts, true, kFwdWholeWarps, Fill::kSmallestInSameThreads);
  };
  // bf16 sk 257 shifted (33 vectors): 16 threads of 3 (kExpOnce), 8 of 6 (the others),
  // where the first count that fits took 32 threads of 2 (64 slots)
  RowPlan p = plan(33, kExpOnceCounts);
  EXPECT_EQ(p.per_thread, 3);
  EXPECT_EQ(p.threads_per_row, 16);
  EXPECT_EQ(block_rows(p), 8);
  p = plan(33, kVectorCounts);
  EXPECT_EQ(p.per_thread, 6);
  EXPECT_EQ(p.threads_per_row, 8);
  EXPECT_EQ(plan_rows(33, kExpOnceCounts, true, kFwdWholeWarps, Fill::kLargestCount).per_thread, 2);
  EXPECT_EQ(plan_rows(33, kExpOnceCounts, true, kFwdWholeWarps, Fill::kLargestCount).threads_per_row, 32);
  // full groups tie with larger counts and keep the smallest: bf16 sk 64, 128, 512 (8,
  // 16, 64 vectors; at 8, 4 threads of 2, 2 of 4 and 1 of 8 all leave no slot empty)
  for (const int64_t units : {8, 16, 64}) {
    EXPECT_EQ(plan(units, kExpOnceCounts).per_thread, 2) << units;
    EXPECT_EQ(plan(units, kVectorCounts).per_thread, 2) << units;
  }
  // groups of kMinSubWarpThreads and more: bf16 sk 150 shifted (20 vectors) in 4 threads
  // of 6; sk 40 (5 vectors) keeps 4 threads of 2, not 2 of 3 or 1 of 6
  p = plan(20, kVectorCounts);
  EXPECT_EQ(p.per_thread, 6);
  EXPECT_EQ(p.threads_per_row, 4);
  p = plan(5, kExpOnceCounts);
  EXPECT_EQ(p.per_thread, 2);
  EXPECT_EQ(p.threads_per_row, 4);
  p = plan(5, kVectorCounts);
  EXPECT_EQ(p.per_thread, 2);
  EXPECT_EQ(p.threads_per_row, 4);
}

TEST(SoftmaxRowPlan, SplitAndLongRows) {
  // bf16 sk 65536: 8192 vectors, 8 a thread -> two blocks of 512 threads; without
  // clusters the long-row kernel
  RowPlan p = plan_rows(8192, kVectorCounts, true, kFwdWholeWarps, Fill::kLargestCount);
  EXPECT_FALSE(p.long_rows);
  EXPECT_EQ(p.parts, 2);
  EXPECT_EQ(p.threads_per_row, 512);
  EXPECT_TRUE(plan_rows(8192, kVectorCounts, false, kFwdWholeWarps, Fill::kLargestCount).long_rows);
  // bf16 sk 40000: 5000 vectors -> two blocks of 320 threads (the fewest whole warps)
  p = plan_rows(5000, kVectorCounts, true, kBwdWholeWarps, Fill::kLargestCount);
  EXPECT_EQ(p.parts, 2);
  EXPECT_EQ(p.threads_per_row, 320);
  // past eight blocks: the long-row kernel (bf16 sk 262145 and up)
  EXPECT_TRUE(plan_rows(8 * 512 * 8 + 1, kVectorCounts, true, kFwdWholeWarps, Fill::kLargestCount).long_rows);
}

// A shifted row's vectors (kShifted) hold it at every shift inside a vector, and no more
// vectors than that needs; aligned rows are exactly sk / kV.
template <int kV>
void check_row_units() {
  for (int64_t sk = 1; sk <= 70001; ++sk) {
    const int64_t shifted = row_units<kV, true>(sk), aligned = row_units<kV, false>(sk);
    ASSERT_GE(shifted * kV, sk + kV - 1) << "sk " << sk;  // a row starting kV - 1 elements in
    ASSERT_LT((shifted - 1) * kV, sk + kV - 1) << "sk " << sk;
    if (sk % kV == 0) {
      ASSERT_EQ(aligned * kV, sk) << "sk " << sk;
    }
  }
}

TEST(SoftmaxRowPlan, ShiftedRowUnits) {
  check_row_units<4>();
  check_row_units<8>();
}

}  // namespace
