// One special-function instruction each: 2^x (ex2.approx.ftz, 2 ulp) and 1/x
// (rcp.approx.ftz, 1 ulp). exp2f, __expf and __fdividef compile (without -ftz) to the
// same MUFU instructions plus several that scale subnormal operands and results; these
// flush subnormals to 0 instead. The activation and softmax kernels, bound by
// instruction issue on an H200 (and the softmax forwards on an H100), take these where
// a subnormal result would be flushed or dropped anyway (benchmarks/RESULTS.md,
// thirty-second session).
#pragma once

namespace opente {

constexpr float kLog2e = 1.4426950408889634f;  // log2(e): e^x = 2^(x log2 e)

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// e^x as 2^(x log2 e): the multiply's rounding moves the result by |x| ulp at most
__device__ __forceinline__ float fast_exp(float x) { return fast_exp2(x * kLog2e); }

__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace opente
