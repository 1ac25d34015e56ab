// FastDivmod (common/fast_divmod.h), whose div() and div_fast() the kernels take for n / d
// where d is fixed for a launch (a softmax row's attention matrix and mask row, a gated
// activation's row), checked on the CPU against the division it replaces: the edges of
// every power of two among the divisors and the dividends, and random pairs.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/fast_divmod.h"

namespace {

using opente::FastDivmod;

constexpr int64_t kFastLimit = int64_t(1) << 31;  // dividends below it take the multiply

std::vector<int64_t> edges_below(int64_t limit) {
  std::vector<int64_t> values = {1, 2, 3, 5, 7, 12, 100, 1000, 2047, 4095, 65535, 1000003};
  for (int b = 1; b < 63 && (int64_t(1) << b) <= limit; ++b) {
    for (int64_t delta : {-1, 0, 1}) values.push_back((int64_t(1) << b) + delta);
  }
  std::vector<int64_t> kept;
  for (int64_t v : values) {
    if (v >= 1 && v < limit) kept.push_back(v);
  }
  return kept;
}

// div, and div_fast where the divisor allows it (every dividend below 2^31)
void expect_exact(const FastDivmod& by, int64_t d, int64_t n) {
  ASSERT_EQ(by.div(n), n / d) << "n " << n << " d " << d << " fast " << by.fast;
  if (by.fast) ASSERT_EQ(by.div_fast(n), n / d) << "div_fast: n " << n << " d " << d;
}

TEST(FastDivmod, EdgesOfDivisorsAndDividends) {
  for (int64_t d : edges_below(kFastLimit)) {
    const FastDivmod by(d, kFastLimit - 1);
    ASSERT_TRUE(by.fast) << d;
    for (int64_t n : edges_below(kFastLimit)) {
      expect_exact(by, d, n);
      for (int64_t k : {int64_t(0), int64_t(1), n}) {  // around multiples of d
        for (int64_t delta : {-1, 0, 1}) {
          const int64_t m = k * d + delta;
          if (m >= 0 && m < kFastLimit) expect_exact(by, d, m);
        }
      }
    }
    expect_exact(by, d, 0);
    expect_exact(by, d, kFastLimit - 1);
  }
}

TEST(FastDivmod, RandomPairs) {
  std::mt19937_64 rng(20261205);
  for (int i = 0; i < 200000; ++i) {
    const int64_t d = int64_t(rng() % uint64_t(kFastLimit - 1)) + 1;
    const int64_t small_d = int64_t(rng() % 5000) + 1;
    const int64_t n = int64_t(rng() % uint64_t(kFastLimit));
    expect_exact(FastDivmod(d, kFastLimit - 1), d, n);
    expect_exact(FastDivmod(small_d, kFastLimit - 1), small_d, n);
  }
}

// Dividends or divisors of 2^31 and past take the plain division, and stay exact.
TEST(FastDivmod, LargeOperandsDivideExactly) {
  const int64_t big = int64_t(1) << 40;
  const FastDivmod by_seven(7, big);
  EXPECT_FALSE(by_seven.fast);
  for (int64_t n : {int64_t(0), kFastLimit, big - 1, big}) expect_exact(by_seven, 7, n);
  const FastDivmod by_big(kFastLimit + 5, big);
  EXPECT_FALSE(by_big.fast);
  expect_exact(by_big, kFastLimit + 5, big);
  const FastDivmod by_one(1, kFastLimit - 1);
  EXPECT_TRUE(by_one.fast);
  expect_exact(by_one, 1, kFastLimit - 1);
}

}  // namespace
