// The row layouts of the CUDA softmax kernels (ops/softmax/softmax_row_plan.h), checked
// on the CPU for every row length up to past the split range: the kernels rely on these
// properties (a group covers its row, sub-warp groups are powers of two inside a warp,
// larger ones whole warps, a split row's blocks hold it with the fewest warps and parts),
// and a GPU run only meets the lengths it tests.
#include <gtest/gtest.h>

#include <string>

#include "ops/softmax/softmax_row_plan.h"

namespace {

using namespace opente::softmax_rows;

bool is_power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Every plan_rows result for `units` vectors of one count list, one whole-warp limit and
// one split setting.
template <size_t kCounts>
void check_plan(int64_t units, const int (&counts)[kCounts], bool split, int64_t whole_warps) {
  const RowPlan plan = plan_rows(units, counts, split, whole_warps);
  SCOPED_TRACE(testing::Message() << "units " << units << " split " << split << " whole_warps " << whole_warps);
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
  // the first count whose single warp holds the row, else the largest
  int expected_n = largest;
  for (int c : counts) {
    if (units <= 32 * int64_t(c)) {
      expected_n = c;
      break;
    }
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
        check_plan(units, counts, split, whole_warps);
        if (::testing::Test::HasFailure()) return;  // one report, not thousands
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
  // bf16 sk 2047 shifted: 257 vectors, 4 a thread -> three warps, not four
  RowPlan p = plan_rows(257, kExpOnceCounts, false, kFwdWholeWarps);
  EXPECT_EQ(p.per_thread, 4);
  EXPECT_EQ(p.threads_per_row, 96);
  EXPECT_EQ(block_rows(p), 1);
  // bf16 sk 5120: 640 vectors -> 160 threads forward (kExpOnce) and backward (8 a thread: 80 -> 96)
  EXPECT_EQ(plan_rows(640, kExpOnceCounts, false, kFwdWholeWarps).threads_per_row, 160);
  EXPECT_EQ(plan_rows(640, kVectorCounts, false, kBwdWholeWarps).threads_per_row, 96);
  // bf16 sk 10240 backward: 1280 vectors, 160 threads; sk 12288: 192 would pass the limit -> 256
  EXPECT_EQ(plan_rows(1280, kVectorCounts, false, kBwdWholeWarps).threads_per_row, 160);
  EXPECT_EQ(plan_rows(1536, kVectorCounts, false, kBwdWholeWarps).threads_per_row, 256);
  EXPECT_EQ(plan_rows(1536, kVectorCounts, false, kFwdWholeWarps).threads_per_row, 192);
  // powers of two stay as they were: bf16 sk 2048 is 256 vectors, two warps of 4 a thread
  p = plan_rows(256, kExpOnceCounts, false, kFwdWholeWarps);
  EXPECT_EQ(p.threads_per_row, 64);
  EXPECT_EQ(block_rows(p), 2);
  // short rows: sub-warp groups, 128-thread blocks (sk 96 bf16: 12 vectors, 2 a thread -> 8 lanes)
  p = plan_rows(12, kVectorCounts, false, kBwdWholeWarps);
  EXPECT_EQ(p.threads_per_row, 8);
  EXPECT_EQ(block_rows(p), 16);
}

TEST(SoftmaxRowPlan, SplitAndLongRows) {
  // bf16 sk 65536: 8192 vectors, 8 a thread -> two blocks of 512 threads; without
  // clusters the long-row kernel
  RowPlan p = plan_rows(8192, kVectorCounts, true, kFwdWholeWarps);
  EXPECT_FALSE(p.long_rows);
  EXPECT_EQ(p.parts, 2);
  EXPECT_EQ(p.threads_per_row, 512);
  EXPECT_TRUE(plan_rows(8192, kVectorCounts, false, kFwdWholeWarps).long_rows);
  // bf16 sk 40000: 5000 vectors -> two blocks of 320 threads (the fewest whole warps)
  p = plan_rows(5000, kVectorCounts, true, kBwdWholeWarps);
  EXPECT_EQ(p.parts, 2);
  EXPECT_EQ(p.threads_per_row, 320);
  // past eight blocks: the long-row kernel (bf16 sk 262145 and up)
  EXPECT_TRUE(plan_rows(8 * 512 * 8 + 1, kVectorCounts, true, kFwdWholeWarps).long_rows);
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
