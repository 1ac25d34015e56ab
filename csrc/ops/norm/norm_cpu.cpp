// CPU reference of the norm family: plain loops in fp32, summing each row (and,
// in the backward, each column of dgamma / dbeta) in index order; the forward's
// row statistics are summed in double. The CUDA kernels sum in another order and
// must agree within fp32 reduction error.
#include <cmath>
#include <vector>

#include "common/dtype.h"
#include "common/host_elements.h"
#include "ops/norm/norm_params.h"

namespace opente {

namespace {

// g = gamma (+ 1 when zero-centered), as fp32.
template <te_dtype kW>
std::vector<float> effective_gamma(const void* gamma, int64_t hidden, bool zero_centered) {
  std::vector<float> g(static_cast<size_t>(hidden));
  for (int64_t c = 0; c < hidden; ++c) g[c] = load_as_float<kW>(gamma, c) + (zero_centered ? 1.0f : 0.0f);
  return g;
}

template <te_dtype kIn, te_dtype kW, te_dtype kOut>
void norm_fwd_typed(const NormFwdParams& p) {
  constexpr bool kFp8 = kOut == TE_DTYPE_FLOAT8_E4M3 || kOut == TE_DTYPE_FLOAT8_E5M2;
  const bool layernorm = p.type == NormType::kLayerNorm;
  const int64_t hidden = p.hidden;
  const std::vector<float> g = effective_gamma<kW>(p.gamma, hidden, p.zero_centered_gamma);
  std::vector<float> b(size_t(hidden), 0.0f);
  if (layernorm) {
    for (int64_t c = 0; c < hidden; ++c) b[c] = load_as_float<kW>(p.beta, c);
  }
  const float scale = kFp8 ? *p.scale : 1.0f;
  float amax = 0.0f;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t row = r * hidden;
    float mu = 0.0f;  // RMSNorm: no centering
    // Row sums in double: added in index order, fp32 sums of 16k terms were 10x
    // torch's error (which sums in a tree); the CUDA kernels sum in fp32 trees.
    if (layernorm) {
      double sum = 0.0;
      for (int64_t c = 0; c < hidden; ++c) sum += load_as_float<kIn>(p.input, row + c);
      mu = float(sum / double(hidden));
    }
    double sum_d = 0.0, sum_sq = 0.0;  // of x - mu and (x - mu)^2 (RMSNorm: mean(x^2))
    for (int64_t c = 0; c < hidden; ++c) {
      const float d = load_as_float<kIn>(p.input, row + c) - mu;
      sum_d += d;
      sum_sq += double(d) * d;
    }
    float variance = float(sum_sq / double(hidden));
    if (layernorm) {
      // The corrected two-pass statistics, as the CUDA kernels (norm_fwd_kernel.cuh): the
      // deviations' sum moves mu onto the mean and takes its square off the variance.
      const float correction = float(sum_d / double(hidden));
      mu += correction;
      variance -= correction * correction;
      if (variance < 0.0f) variance = 0.0f;  // rounding; a NaN row stays NaN (fmax would drop it)
    }
    const float rsigma = 1.0f / std::sqrt(variance + p.eps);
    if (layernorm) p.mu[r] = mu;
    p.rsigma[r] = rsigma;
    for (int64_t c = 0; c < hidden; ++c) {
      const float xhat = (load_as_float<kIn>(p.input, row + c) - mu) * rsigma;
      float y = xhat * g[c];
      if (layernorm) y += b[c];
      if constexpr (kFp8) {
        amax = std::fmax(amax, std::fabs(y));  // fmax skips NaN
        y *= scale;
      }
      if (p.output) store_from_float<kOut>(p.output, row + c, y);
      if (p.output_t) store_from_float<kOut>(p.output_t, c * p.rows + r, y);
      if constexpr (!kFp8) {
        if (p.amax) amax = std::fmax(amax, std::fabs(load_as_float<kOut>(p.output, row + c)));  // as stored
      }
    }
  }
  if (p.amax) *p.amax = std::fmax(*p.amax, amax);
  if constexpr (kFp8) {
    if (p.scale_inv) *p.scale_inv = 1.0f / scale;
  }
}

template <te_dtype kIn, te_dtype kW>
void norm_bwd_typed(const NormBwdParams& p) {
  const bool layernorm = p.type == NormType::kLayerNorm;
  const int64_t hidden = p.hidden;
  const std::vector<float> g = effective_gamma<kW>(p.gamma, hidden, p.zero_centered_gamma);
  std::vector<float> dgamma(size_t(hidden), 0.0f), dbeta(size_t(hidden), 0.0f);
  std::vector<float> xhat(static_cast<size_t>(hidden)), dyg(static_cast<size_t>(hidden));
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t row = r * hidden;
    const float mu = layernorm ? p.mu[r] : 0.0f;
    const float rsigma = p.rsigma[r];
    float sum_dyg = 0.0f, sum_dyg_xhat = 0.0f;
    for (int64_t c = 0; c < hidden; ++c) {
      const float dy = load_as_float<kIn>(p.dz, row + c);
      xhat[c] = (load_as_float<kIn>(p.x, row + c) - mu) * rsigma;
      dyg[c] = dy * g[c];
      sum_dyg += dyg[c];
      sum_dyg_xhat += dyg[c] * xhat[c];
      dgamma[c] += dy * xhat[c];
      dbeta[c] += dy;
    }
    // RMSNorm has no mean to subtract: its output does not depend on a shift of x.
    const float mean_dyg = layernorm ? sum_dyg / float(hidden) : 0.0f;
    const float mean_dyg_xhat = sum_dyg_xhat / float(hidden);
    for (int64_t c = 0; c < hidden; ++c) {
      store_from_float<kIn>(p.dx, row + c, rsigma * (dyg[c] - mean_dyg - xhat[c] * mean_dyg_xhat));
    }
  }
  for (int64_t c = 0; c < hidden; ++c) {
    store_from_float<kW>(p.dgamma, c, dgamma[c]);
    if (layernorm) store_from_float<kW>(p.dbeta, c, dbeta[c]);
  }
}

}  // namespace

void norm_fwd_cpu(const NormFwdParams& p) {
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_float_dtype(p.w_dtype, [&](auto w_tag) {
      dispatch_any_float_dtype(p.out_dtype, [&](auto out_tag) {
        norm_fwd_typed<decltype(in_tag)::value, decltype(w_tag)::value, decltype(out_tag)::value>(p);
      });
    });
  });
}

void norm_bwd_cpu(const NormBwdParams& p) {
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_float_dtype(p.w_dtype, [&](auto w_tag) {
      norm_bwd_typed<decltype(in_tag)::value, decltype(w_tag)::value>(p);
    });
  });
}

}  // namespace opente
