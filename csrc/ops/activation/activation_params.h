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

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;
constexpr float kQGeluA = 1.702f;

OPENTE_ACT_HD inline float act_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

OPENTE_ACT_HD inline float act_forward(te_activation base, float x) {
  switch (base) {
    case TE_ACTIVATION_GELU: return 0.5f * x * (1.0f + tanhf(kGeluK * (x + kGeluC * x * x * x)));
    case TE_ACTIVATION_QGELU: return x * act_sigmoid(kQGeluA * x);
    case TE_ACTIVATION_RELU: return x <= 0.0f ? 0.0f : x;  // NaN stays NaN
    case TE_ACTIVATION_SRELU: return x <= 0.0f ? 0.0f : x * x;
    default: return x * act_sigmoid(x);  // TE_ACTIVATION_SILU
  }
}

OPENTE_ACT_HD inline float act_derivative(te_activation base, float x) {
  switch (base) {
    case TE_ACTIVATION_GELU: {
      const float t = tanhf(kGeluK * (x + kGeluC * x * x * x));
      return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
    }
    case TE_ACTIVATION_QGELU: {
      const float s = act_sigmoid(kQGeluA * x);
      return s + kQGeluA * x * s * (1.0f - s);
    }
    case TE_ACTIVATION_RELU: return x > 0.0f ? 1.0f : 0.0f;
    case TE_ACTIVATION_SRELU: return x > 0.0f ? 2.0f * x : 0.0f;
    default: {  // TE_ACTIVATION_SILU
      const float s = act_sigmoid(x);
      return s + x * s * (1.0f - s);
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
  float* amax;           // [1], FP8 output only, updated as max(amax, max|y|); may be null
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
  int64_t rows;
  int64_t hidden;        // H: grad's columns
  te_dtype dtype;        // float32, float16, bfloat16 (grad, input, dinput)
};

void activation_fwd_cpu(const ActivationFwdParams& p);
void activation_bwd_cpu(const ActivationBwdParams& p);

#if OPENTE_WITH_CUDA
// Declared for issue 4's CUDA step; not defined (nor called) yet.
void activation_fwd_cuda(const ActivationFwdParams& p, int device, void* stream);
void activation_bwd_cuda(const ActivationBwdParams& p, int device, void* stream);
#endif

}  // namespace opente
