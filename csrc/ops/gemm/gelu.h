// GELU in Transformer Engine's tanh form and its exact derivative, in fp32, for
// the CPU reference of the GEMM epilogues (GELU_AUX*, DGELU*):
//
//   gelu(x)  = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
#pragma once

#include <cmath>

namespace opente {

constexpr float kGeluSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubicCoeff = 0.044715f;

inline float gelu_tanh(float x) {
  const float u = kGeluSqrt2OverPi * x * (1.0f + kGeluCubicCoeff * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}

inline float gelu_tanh_grad(float x) {
  const float x2 = x * x;
  const float th = std::tanh(kGeluSqrt2OverPi * x * (1.0f + kGeluCubicCoeff * x2));
  const float sech2 = 1.0f - th * th;
  // Far in the tails tanh(u) is +-1 in fp32 and the sech^2 term is exactly 0;
  // skipping it keeps 0 * inf (x^2 overflowing for |x| > 1.8e19) from making NaN.
  if (sech2 == 0.0f) return 0.5f * (1.0f + th);
  const float du_dx = kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubicCoeff * x2);
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * du_dx;
}

}  // namespace opente
