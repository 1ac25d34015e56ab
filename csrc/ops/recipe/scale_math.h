// The scalar rules of the recipes, shared by the CPU reference and the CUDA
// kernels so both compute the same floats in the same order.
#pragma once

#include "common/float_formats.h"

namespace opente {

OPENTE_HD bool finite_float(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

// Current scaling: scale = fp8_max / max(amax, epsilon); 1 when that is zero or
// not finite; FLT_MAX on overflow; optionally rounded down to a power of two.
OPENTE_HD float current_scale(float amax, float fp8_max, float epsilon, bool force_pow_2) {
  const float clamped = amax > epsilon ? amax : epsilon;
  if (!finite_float(amax) || amax != amax || !(clamped > 0.0f) || !finite_float(clamped)) return 1.0f;
  float scale = fp8_max / clamped;
  if (!finite_float(scale)) scale = bits_float(0x7f7fffffu);  // FLT_MAX
  // fp8_max >= 448 and amax <= FLT_MAX keep the scale normal, so dropping the
  // mantissa bits rounds it down to a power of two.
  if (force_pow_2) scale = bits_float(float_bits(scale) & 0xff800000u);
  return scale;
}

// max that propagates NaN: a NaN anywhere in an amax history makes the window's
// amax NaN, so the delayed-scaling update keeps the old scale (as a torch.max
// over the history would).
OPENTE_HD float max_propagate_nan(float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }

// Delayed scaling: fp8_max / amax / 2^margin when amax is positive and finite,
// else the previous scale; FLT_MAX on overflow.
OPENTE_HD float delayed_scale(float amax, float old_scale, float fp8_max, float margin_factor) {
  if (!(amax > 0.0f) || !finite_float(amax)) return old_scale;
  float scale = fp8_max / amax / margin_factor;
  if (!finite_float(scale)) scale = bits_float(0x7f7fffffu);
  return scale;
}

}  // namespace opente
