// Division by a divisor fixed for a kernel launch, as a multiply-high and a shift instead
// of the 20-40 instructions of an integer division, where every dividend is below 2^31
// (Granlund and Montgomery: m = ceil(2^p / d), p = 31 + ceil(log2 d), q = (n m) >> p,
// exact for n < 2^31); a plain 64-bit division otherwise. Built on the host, passed to a
// kernel by value; div() runs on either side, so that the CPU tests check it.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define OPENTE_FAST_DIVMOD_FN __host__ __device__ __forceinline__
#else
#define OPENTE_FAST_DIVMOD_FN inline
#endif

namespace opente {

struct FastDivmod {
  int64_t divisor = 1;
  uint32_t multiplier = 0;
  uint32_t shift = 0;
  bool fast = false;  // every dividend < 2^31

  FastDivmod() = default;
  // d >= 1; max_dividend: the largest dividend div() will be given.
  FastDivmod(int64_t d, int64_t max_dividend) : divisor(d) {
    fast = d >= 1 && d < (int64_t(1) << 31) && max_dividend < (int64_t(1) << 31);
    if (!fast || d == 1) return;
    uint32_t log2_ceil = 0;
    while ((int64_t(1) << log2_ceil) < d) ++log2_ceil;
    const uint32_t p = 31 + log2_ceil;
    multiplier = uint32_t(((uint64_t(1) << p) + uint64_t(d) - 1) / uint64_t(d));
    shift = p - 32;
  }

  // n / divisor, for 0 <= n <= max_dividend
  OPENTE_FAST_DIVMOD_FN int64_t div(int64_t n) const {
    if (!fast) return n / divisor;
    if (divisor == 1) return n;
    return int64_t(high_word(uint32_t(n), multiplier) >> shift);
  }

  // n / divisor where the host has made sure of `fast`: the multiply alone, with neither the
  // branch nor the 64-bit division beside it, whose registers a kernel pays for even where
  // it never runs (the softmax row kernels: up to 16 more, ptxas).
  OPENTE_FAST_DIVMOD_FN int64_t div_fast(int64_t n) const {
    const uint32_t q = high_word(uint32_t(n), multiplier) >> shift;
    return multiplier == 0 ? n : int64_t(q);  // multiplier 0: the divisor 1
  }

 private:
  // the high 32 bits of a b
  static OPENTE_FAST_DIVMOD_FN uint32_t high_word(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return uint32_t((uint64_t(a) * b) >> 32);
#endif
  }
};

}  // namespace opente

#undef OPENTE_FAST_DIVMOD_FN
