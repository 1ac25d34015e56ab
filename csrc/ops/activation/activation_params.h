// Plain parameter structs of the activation family (forward and backward),
// shared by the dispatcher, the CPU reference and the CUDA kernels, and the
// fp32 formulas of each activation and its derivative (host and device).
// Shapes are already validated when the structs are built.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cmath>

#include "opente/activation.h"
#include "opente/tensor.h"
#ifdef __CUDACC__
#include "common/cuda_fast_math.cuh"
#endif

#ifdef __CUDACC__
#define OPENTE_ACT_HD __host__ __device__
#else
#define OPENTE_ACT_HD
#endif

namespace opente {

constexpr int32_t kNumActivations = 10;

inline bool is_valid_activation(int32_t kind) { return kind >= 0 && kind < kNumActivations; }

// geglu, qgeglu, reglu, sreglu, swiglu: input [rows, 2H], a = first half, b = second.
inline bool is_gated_activation(te_activation kind) { return kind >= TE_ACTIVATION_GEGLU; }

// The element-wise function under a kind: gelu for geglu, silu for swiglu, ...
inline te_activation base_activation(te_activation kind) {
  return is_gated_activation(kind) ? te_activation(kind - TE_ACTIVATION_GEGLU) : kind;
}

// ---- fp32 formulas (opente/activation.h); `base` is one of the 5 plain kinds ----
//
// Every product and sum is rounded on its own (act_mul, act_add): nvcc would
// otherwise fuse a * b + c into one fused multiply-add with a single rounding,
// and the GPU would differ from the CPU reference in more places than where
// the device's exponential and quotient round differently from the host's (and
// gelu's exp(-2u), whose argument the GPU takes with its constants folded).

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;
constexpr float kQGeluA = 1.702f;

OPENTE_ACT_HD inline float act_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

OPENTE_ACT_HD inline float act_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

OPENTE_ACT_HD inline float act_sub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// 1 / (1 + exp(-x)). On the GPU 1 / (1 + 2^(-x log2 e)) from fast_exp2 and fast_rcp
// (2 + |x| ulp for the exponential, 1 for the reciprocal), well inside the bounds the
// tests derive; their flushed subnormals never matter here (2^x is added to 1). The
// accurate expf and the IEEE division cost about 25 instructions an element, and made
// the gelu and silu kernels compute-bound (on an H100 a bf16 -> FP8 kernel reached
// 68-76% of copy bandwidth with them, 85-95% with __expf and __fdividef); on an H200,
// whose copy is 1.4x the H100's, gelu -> FP8 went from 78% of a same-bytes copy with
// __expf and __fdividef to 94% with these. Where 1 + exp(-x) passes 2^126 (x below
// -87.3) the quotient is flushed to 0 (as __fdividef returned 0): sigmoid(x) is below
// 2^-126 there.
OPENTE_ACT_HD inline float act_sigmoid(float x) {
#ifdef __CUDA_ARCH__
  return fast_rcp(act_add(1.0f, fast_exp2(act_mul(-kLog2e, x))));
#else
  return 1.0f / act_add(1.0f, expf(-x));
#endif
}

// sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), shared by gelu and its derivative:
// the tanh form's 0.5 (1 + tanh(u)) is sigmoid(2u), which needs no tanh and
// does not cancel for x << 0. On the GPU exp(-2u) is 2^(x (a + b x^2)) with the
// constants folded (a = -2 sqrt(2/pi) log2 e, b = 0.044715 a): x^2, one fused
// multiply-add and a multiply where the host's form takes five operations (the gelu
// kernels are bound by instruction issue on an H200).
#ifdef __CUDACC__
constexpr float kGeluExp2A = -2.0f * kGeluK * kLog2e;  // kLog2e: common/cuda_fast_math.cuh
constexpr float kGeluExp2B = kGeluExp2A * kGeluC;
#endif

OPENTE_ACT_HD inline float gelu_sigmoid(float x) {
#ifdef __CUDA_ARCH__
  const float z = act_mul(x, __fmaf_rn(kGeluExp2B, act_mul(x, x), kGeluExp2A));
  return fast_rcp(act_add(1.0f, fast_exp2(z)));
#else
  const float x3 = act_mul(act_mul(act_mul(kGeluC, x), x), x);
  return act_sigmoid(act_mul(2.0f * kGeluK, act_add(x, x3)));
#endif
}

OPENTE_ACT_HD inline float act_forward(te_activation base, float x) {
  switch (base) {
    case TE_ACTIVATION_GELU: return act_mul(x, gelu_sigmoid(x));  // 0.5 x (1 + tanh(u))
    case TE_ACTIVATION_QGELU: return act_mul(x, act_sigmoid(act_mul(kQGeluA, x)));
    case TE_ACTIVATION_RELU: return x <= 0.0f ? 0.0f : x;  // NaN stays NaN
    case TE_ACTIVATION_SRELU: return x <= 0.0f ? 0.0f : act_mul(x, x);
    default: return act_mul(x, act_sigmoid(x));  // TE_ACTIVATION_SILU
  }
}

OPENTE_ACT_HD inline float act_derivative(te_activation base, float x) {
  switch (base) {
    case TE_ACTIVATION_GELU: {
      // 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u);
      // with s = sigmoid(2u): 0.5 (1 + t) = s and 0.5 (1 - t^2) = 2 s (1 - s)
      const float s = gelu_sigmoid(x);
      const float inner = act_add(1.0f, act_mul(act_mul(3.0f * kGeluC, x), x));
      const float slope = act_mul(act_mul(act_mul(act_mul(2.0f * x, s), act_sub(1.0f, s)), kGeluK), inner);
      return act_add(s, slope);
    }
    case TE_ACTIVATION_QGELU: {
      const float s = act_sigmoid(act_mul(kQGeluA, x));
      return act_add(s, act_mul(act_mul(act_mul(kQGeluA, x), s), act_sub(1.0f, s)));
    }
    case TE_ACTIVATION_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case TE_ACTIVATION_SRELU: return x > 0.0f ? act_mul(2.0f, x) : 0.0f;
    default: {  // TE_ACTIVATION_SILU
      const float s = act_sigmoid(x);
      return act_add(s, act_mul(act_mul(x, s), act_sub(1.0f, s)));
    }
  }
}

struct ActivationFwdParams {
  te_activation kind;
  const void* input;     // [rows, H] or, gated, [rows, 2H]; in_dtype
  void* output;          // [rows, H], out_dtype; may be null when out_dtype is FP8
  void* output_t;        // [H, rows], out_dtype (FP8 only); may be null
  const float* scale;    // [1], FP8 output only; else null
  float* scale_inv;      // [1], FP8 output only, receives 1/scale; may be null
  float* amax;           // [1], updated as max(amax, max|y|) (a float output: of y as stored); may be null
  int64_t rows;
  int64_t hidden;        // H: the output's columns
  te_dtype in_dtype;     // float32, float16, bfloat16
  te_dtype out_dtype;    // float32, float16, bfloat16, float8_e4m3, float8_e5m2
};

struct ActivationBwdParams {
  te_activation kind;
  const void* grad;      // [rows, H], dtype
  const void* input;     // [rows, H] or, gated, [rows, 2H]; dtype
  void* dinput;          // input's shape, dtype
  float* amax;           // [1], updated as max(amax, max|dinput|) of dinput as stored; may be null
  int64_t rows;
  int64_t hidden;        // H: grad's columns
  te_dtype dtype;        // float32, float16, bfloat16 (grad, input, dinput)
};

void activation_fwd_cpu(const ActivationFwdParams& p);
void activation_bwd_cpu(const ActivationBwdParams& p);

#if OPENTE_WITH_CUDA
void activation_fwd_cuda(const ActivationFwdParams& p, int device, void* stream);
void activation_bwd_cuda(const ActivationBwdParams& p, int device, void* stream);
#endif

}  // namespace opente
