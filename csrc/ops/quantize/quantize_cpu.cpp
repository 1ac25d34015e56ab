// CPU reference of the quantize family: plain loops that define the semantics
// the CUDA kernels must reproduce bit for bit.
#include <cmath>

#include "common/dtype.h"
#include "common/host_elements.h"
#include "ops/quantize/quantize_params.h"

namespace opente {

void quantize_cpu(const QuantizeParams& p) {
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_fp8_dtype(p.out_dtype, [&](auto out_tag) {
      constexpr te_dtype kIn = decltype(in_tag)::value;
      constexpr te_dtype kOut = decltype(out_tag)::value;
      const float scale = *p.scale;
      float amax = 0.0f;
      for (int64_t r = 0; r < p.rows; ++r) {
        for (int64_t c = 0; c < p.cols; ++c) {
          const float x = load_as_float<kIn>(p.input, r * p.cols + c);
          amax = std::fmax(amax, std::fabs(x));  // fmax skips NaN
          const float scaled = x * scale;
          if (p.output) store_from_float<kOut>(p.output, r * p.cols + c, scaled);
          if (p.output_t) store_from_float<kOut>(p.output_t, c * p.rows + r, scaled);
        }
      }
      if (p.amax) *p.amax = std::fmax(*p.amax, amax);
      if (p.scale_inv) *p.scale_inv = 1.0f / scale;
    });
  });
}

void convert_cpu(const QuantizeParams& p) {
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_float_dtype(p.out_dtype, [&](auto out_tag) {
      constexpr te_dtype kIn = decltype(in_tag)::value;
      constexpr te_dtype kOut = decltype(out_tag)::value;
      for (int64_t i = 0; i < p.rows * p.cols; ++i) store_from_float<kOut>(p.output, i, load_as_float<kIn>(p.input, i));
    });
  });
}

void dequantize_cpu(const DequantizeParams& p) {
  dispatch_fp8_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_float_dtype(p.out_dtype, [&](auto out_tag) {
      constexpr te_dtype kIn = decltype(in_tag)::value;
      constexpr te_dtype kOut = decltype(out_tag)::value;
      const float scale_inv = *p.scale_inv;
      for (int64_t i = 0; i < p.numel; ++i) {
        store_from_float<kOut>(p.output, i, load_as_float<kIn>(p.input, i) * scale_inv);
      }
    });
  });
}

void amax_cpu(const AmaxParams& p) {
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    constexpr te_dtype kIn = decltype(tag)::value;
    float amax = 0.0f;
    for (int64_t i = 0; i < p.numel; ++i) amax = std::fmax(amax, std::fabs(load_as_float<kIn>(p.input, i)));
    *p.amax = std::fmax(*p.amax, amax);
  });
}

void current_scale_from_input_cpu(const AmaxParams& amax, const CurrentScalingParams& scaling) {
  *amax.amax = 0.0f;  // a fresh reduction
  amax_cpu(amax);
  current_scaling_cpu(scaling);
}

void quantize_current_scaling_cpu(const CurrentScalingQuantizeParams& p) {
  current_scale_from_input_cpu(p.amax, p.scaling);
  quantize_cpu(p.cast);
}

}  // namespace opente
