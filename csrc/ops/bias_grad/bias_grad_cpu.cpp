// CPU reference of the bias-gradient casts: dx element by element with the
// activation formulas of activation_params.h (the very operations of
// te_activation_bwd's reference), then quantized as te_quantize does; dbias sums
// the fp32 dx in double precision and rounds once.
#include <cmath>
#include <vector>

#include "common/dtype.h"
#include "common/host_elements.h"
#include "ops/activation/activation_params.h"
#include "ops/bias_grad/bias_grad_params.h"
#include "ops/quantize/quantize_params.h"

namespace opente {

namespace {

template <te_dtype kIn, te_dtype kOut>
void dbias_cast_typed(const DbiasCastParams& p) {
  constexpr bool kFp8 = kOut == TE_DTYPE_FLOAT8_E4M3 || kOut == TE_DTYPE_FLOAT8_E5M2;
  const bool gated = p.has_activation && is_gated_activation(p.kind);
  const te_activation base = base_activation(p.kind);
  const int64_t rows = p.rows, h = p.hidden, cols = gated ? 2 * h : h;
  const float scale = kFp8 ? *p.scale : 1.0f;
  std::vector<double> sums(p.dbias ? cols : 0, 0.0);
  float amax = 0.0f;
  auto emit = [&](int64_t r, int64_t c, float dx) {
    if (p.dbias) sums[c] += dx;
    if constexpr (kFp8) {
      amax = std::fmax(amax, std::fabs(dx));  // fmax skips NaN
      dx *= scale;
    }
    if (p.output) store_from_float<kOut>(p.output, r * cols + c, dx);
    if (p.output_t) store_from_float<kOut>(p.output_t, c * rows + r, dx);
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < h; ++c) {
      const float g = load_as_float<kIn>(p.grad, r * h + c);
      if (!p.has_activation) {
        emit(r, c, g);
      } else if (!gated) {
        emit(r, c, g * act_derivative(base, load_as_float<kIn>(p.act_input, r * h + c)));
      } else {
        const float a = load_as_float<kIn>(p.act_input, r * cols + c);
        const float b = load_as_float<kIn>(p.act_input, r * cols + h + c);
        emit(r, c, g * b * act_derivative(base, a));
        emit(r, h + c, g * act_forward(base, a));
      }
    }
  }
  if (p.dbias) {
    dispatch_float_dtype(p.dbias_dtype, [&](auto dbias_tag) {
      for (int64_t c = 0; c < cols; ++c) store_from_float<decltype(dbias_tag)::value>(p.dbias, c, float(sums[c]));
    });
  }
  if constexpr (kFp8) {
    if (p.amax) *p.amax = std::fmax(*p.amax, amax);
    if (p.scale_inv) *p.scale_inv = 1.0f / scale;
  }
}

}  // namespace

void dbias_cast_cpu(const DbiasCastParams& p) {
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_any_float_dtype(p.out_dtype, [&](auto out_tag) {
      dbias_cast_typed<decltype(in_tag)::value, decltype(out_tag)::value>(p);
    });
  });
}

// The steps of te_quantize_current_scaling's reference, then the cast with dbias.
void dbias_cast_current_scaling_cpu(const DbiasCurrentScalingParams& p) {
  const DbiasCastParams& c = p.cast;
  current_scale_from_input_cpu(AmaxParams{c.grad, p.amax_out, c.rows * c.hidden, c.in_dtype},
                               CurrentScalingParams{p.amax_out, p.scale_out, p.scale_inv, p.fp8_max, p.epsilon,
                                                    p.force_pow_2_scales});
  dbias_cast_cpu(c);
}

}  // namespace opente
