// Independent float64 references of the activation formulas (opente/activation.h)
// with a bound on the error of the core's fp32 computation, shared by the tests
// of te_activation_* and of the fused backward casts (te_dact_dbias_cast_transpose).
//
// The core computes in fp32, so each element gets its own error bound (u = 2^-24):
//   relu, srelu:   one rounding at most: 2u |y|
//   gelu:          8u (|y| + |x|): 1 + tanh(.) cancels for x << 0, an absolute
//                  error of u |x|
//   gelu':         16u (1 + |y'| + |x| (1 + 3c x^2)): 1 - t^2 cancels for |x| >> 0
//   qgelu, silu:   8u |y| (1 + |z|), z = a x: exp(-z)'s argument is rounded
//   their ':       16u (1 + |z|) (1 + |y'|): 1 - s cancels for z >> 0
// then gated products and the grad multiply add |factor| * bound + 2u |result|,
// and the output dtype's rounding (half an ulp plus half the smallest subnormal).
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "test_util.h"

namespace tt {

constexpr double kK = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kC = 0.044715;

struct Kind {
  te_activation kind;
  const char* name;
  te_activation base;
  bool gated;
};
inline const Kind kKinds[] = {
    {TE_ACTIVATION_GELU, "gelu", TE_ACTIVATION_GELU, false},
    {TE_ACTIVATION_QGELU, "qgelu", TE_ACTIVATION_QGELU, false},
    {TE_ACTIVATION_RELU, "relu", TE_ACTIVATION_RELU, false},
    {TE_ACTIVATION_SRELU, "srelu", TE_ACTIVATION_SRELU, false},
    {TE_ACTIVATION_SILU, "silu", TE_ACTIVATION_SILU, false},
    {TE_ACTIVATION_GEGLU, "geglu", TE_ACTIVATION_GELU, true},
    {TE_ACTIVATION_QGEGLU, "qgeglu", TE_ACTIVATION_QGELU, true},
    {TE_ACTIVATION_REGLU, "reglu", TE_ACTIVATION_RELU, true},
    {TE_ACTIVATION_SREGLU, "sreglu", TE_ACTIVATION_SRELU, true},
    {TE_ACTIVATION_SWIGLU, "swiglu", TE_ACTIVATION_SILU, true},
};

struct Ref {
  double v;    // exact value
  double err;  // bound on the fp32 computation's error
};

inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

inline Ref ref_act(te_activation base, double x) {
  switch (base) {
    case TE_ACTIVATION_GELU: {
      const double y = 0.5 * x * (1.0 + std::tanh(kK * (x + kC * x * x * x)));
      return {y, 8 * kU * (std::fabs(y) + std::fabs(x))};
    }
    case TE_ACTIVATION_QGELU:
    case TE_ACTIVATION_SILU: {
      const double z = (base == TE_ACTIVATION_QGELU ? 1.702 : 1.0) * x;
      const double y = x * sigmoid(z);
      return {y, 8 * kU * std::fabs(y) * (1 + std::fabs(z))};
    }
    case TE_ACTIVATION_RELU: return {x > 0 ? x : 0.0, 0.0};
    default: {
      const double y = x > 0 ? x * x : 0.0;
      return {y, 2 * kU * y};
    }
  }
}

inline Ref ref_der(te_activation base, double x) {
  switch (base) {
    case TE_ACTIVATION_GELU: {
      const double t = std::tanh(kK * (x + kC * x * x * x));
      const double d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kK * (1 + 3 * kC * x * x);
      return {d, 16 * kU * (1 + std::fabs(d) + std::fabs(x) * (1 + 3 * kC * x * x))};
    }
    case TE_ACTIVATION_QGELU:
    case TE_ACTIVATION_SILU: {
      const double a = base == TE_ACTIVATION_QGELU ? 1.702 : 1.0;
      const double s = sigmoid(a * x);
      const double d = s + a * x * s * (1 - s);
      return {d, 16 * kU * (1 + std::fabs(a * x)) * (1 + std::fabs(d))};
    }
    case TE_ACTIVATION_RELU: return {x > 0 ? 1.0 : 0.0, 0.0};
    default: return {x > 0 ? 2 * x : 0.0, 0.0};
  }
}

// f * r, with the bound grown by the product's rounding.
inline Ref times(double f, Ref r) { return {f * r.v, std::fabs(f) * r.err + 2 * kU * std::fabs(f * r.v)}; }

inline double with_rounding(const Ref& r, te_dtype d) {
  return r.err + unit_roundoff(d) * (std::fabs(r.v) + r.err) + half_min_step(d);
}
inline double value_at(const Buffer& b, te_dtype d, size_t i) {
  if (d == TE_DTYPE_FLOAT32) return b.get<float>(i);
  return ref_decode(format_of(d), load_code(b, d, i));
}
inline int fp8_ordinal(uint32_t code) { return (code & 0x80u) ? -int(code & 0x7fu) : int(code & 0x7fu); }

// Random inputs in [-8, 8], a few exact zeros and small magnitudes, stored in d.
inline std::vector<float> random_inputs(Buffer& b, te_dtype d, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    float x = uni(rng);
    if (i % 17 == 0) x = 0.0f;
    if (i % 13 == 5) x = random_magnitude(rng, -20, -2);
    v[i] = store_value(b, d, i, x);
  }
  return v;
}

// Per output element (r, c) of [rows, h]: the reference of the forward, from the stored input.
inline Ref ref_forward(const Kind& k, const std::vector<float>& x, int64_t r, int64_t c, int64_t h) {
  if (!k.gated) return ref_act(k.base, x[r * h + c]);
  return times(x[r * 2 * h + h + c], ref_act(k.base, x[r * 2 * h + c]));
}

// Element (r, c) of the backward's dx [rows, cols] (cols = 2H gated, else H) from
// the gradient g [rows, H] and the stored forward input x [rows, cols].
inline Ref ref_backward(const Kind& k, const std::vector<float>& g, const std::vector<float>& x, int64_t r, int64_t c,
                        int64_t h) {
  if (!k.gated) return times(g[r * h + c], ref_der(k.base, x[r * h + c]));
  const int64_t cols = 2 * h, j = c % h;
  const double gr = g[r * h + j], a = x[r * cols + j], b = x[r * cols + h + j];
  if (c >= h) return times(gr, ref_act(k.base, a));
  Ref da = times(gr * b, ref_der(k.base, a));  // gr * b is exact in double, one fp32 rounding in the core
  da.err += 2 * kU * std::fabs(da.v);
  return da;
}

constexpr te_dtype kFloatTypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};

}  // namespace tt
