// CPU reference of the activation family: plain element-wise loops in fp32.
#include <cmath>

#include "common/dtype.h"
#include "common/host_elements.h"
#include "ops/activation/activation_params.h"

namespace opente {

namespace {

template <te_dtype kIn, te_dtype kOut>
void activation_fwd_typed(const ActivationFwdParams& p) {
  constexpr bool kFp8 = kOut == TE_DTYPE_FLOAT8_E4M3 || kOut == TE_DTYPE_FLOAT8_E5M2;
  const bool gated = is_gated_activation(p.kind);
  const te_activation base = base_activation(p.kind);
  const int64_t h = p.hidden;
  const int64_t in_cols = gated ? 2 * h : h;
  const float scale = kFp8 ? *p.scale : 1.0f;
  float amax = 0.0f;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < h; ++c) {
      float y = act_forward(base, load_as_float<kIn>(p.input, r * in_cols + c));
      if (gated) y *= load_as_float<kIn>(p.input, r * in_cols + h + c);
      if constexpr (kFp8) {
        amax = std::fmax(amax, std::fabs(y));  // fmax skips NaN
        y *= scale;
      }
      if (p.output) store_from_float<kOut>(p.output, r * h + c, y);
      if (p.output_t) store_from_float<kOut>(p.output_t, c * p.rows + r, y);
      if constexpr (!kFp8) {
        if (p.amax) amax = std::fmax(amax, std::fabs(load_as_float<kOut>(p.output, r * h + c)));  // as stored
      }
    }
  }
  if (p.amax) *p.amax = std::fmax(*p.amax, amax);
  if constexpr (kFp8) {
    if (p.scale_inv) *p.scale_inv = 1.0f / scale;
  }
}

// max(amax, |dinput[i]|) as stored, NaN skipped (read back only where an amax is asked for).
template <te_dtype kT>
float raise_by_stored(float amax, const void* dinput, int64_t i) {
  return std::fmax(amax, std::fabs(load_as_float<kT>(dinput, i)));
}

template <te_dtype kT>
void activation_bwd_typed(const ActivationBwdParams& p) {
  const bool gated = is_gated_activation(p.kind);
  const te_activation base = base_activation(p.kind);
  const int64_t h = p.hidden;
  const int64_t in_cols = gated ? 2 * h : h;
  float amax = 0.0f;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < h; ++c) {
      const float g = load_as_float<kT>(p.grad, r * h + c);
      const float a = load_as_float<kT>(p.input, r * in_cols + c);
      if (gated) {
        const float b = load_as_float<kT>(p.input, r * in_cols + h + c);
        store_from_float<kT>(p.dinput, r * in_cols + c, g * b * act_derivative(base, a));
        store_from_float<kT>(p.dinput, r * in_cols + h + c, g * act_forward(base, a));
        if (p.amax) amax = raise_by_stored<kT>(amax, p.dinput, r * in_cols + h + c);
      } else {
        store_from_float<kT>(p.dinput, r * in_cols + c, g * act_derivative(base, a));
      }
      if (p.amax) amax = raise_by_stored<kT>(amax, p.dinput, r * in_cols + c);
    }
  }
  if (p.amax) *p.amax = std::fmax(*p.amax, amax);
}

}  // namespace

void activation_fwd_cpu(const ActivationFwdParams& p) {
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_any_float_dtype(p.out_dtype, [&](auto out_tag) {
      activation_fwd_typed<decltype(in_tag)::value, decltype(out_tag)::value>(p);
    });
  });
}

void activation_bwd_cpu(const ActivationBwdParams& p) {
  dispatch_float_dtype(p.dtype, [&](auto tag) { activation_bwd_typed<decltype(tag)::value>(p); });
}

}  // namespace opente
