// Shared helpers of the C++ tests: independent reference conversions (written
// from the format definitions in double precision, sharing no code with
// csrc/common/float_formats.h), descriptor builders, poisoned buffers and
// random inputs.
#pragma once

#include <gtest/gtest.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "opente/opente.h"

namespace tt {

// ---------------------------------------------------------------------------
// Float formats, described by their parameters.
// ---------------------------------------------------------------------------

inline float f32(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}
inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

enum class Overflow { kInf, kSaturate };

struct Format {
  const char* name;
  int exp_bits;
  int mant_bits;
  int bias;
  bool ieee_special;  // all-ones exponent is inf/NaN (fp16, bf16, E5M2); E4M3 only has S.1111.111 = NaN
  Overflow overflow;  // what a value past the largest finite one becomes
};

constexpr Format kE4M3{"e4m3", 4, 3, 7, false, Overflow::kSaturate};
constexpr Format kE5M2{"e5m2", 5, 2, 15, true, Overflow::kSaturate};
constexpr Format kFp16{"fp16", 5, 10, 15, true, Overflow::kInf};
constexpr Format kBf16{"bf16", 8, 7, 127, true, Overflow::kInf};

inline int total_bits(const Format& f) { return 1 + f.exp_bits + f.mant_bits; }
inline uint32_t exp_all_ones(const Format& f) { return (1u << f.exp_bits) - 1u; }

// Decode a code from first principles: (-1)^s * 2^(e - bias) * (1 + m / 2^M),
// or 2^(1 - bias) * m / 2^M for e == 0.
inline double ref_decode(const Format& f, uint32_t code) {
  const int nbits = total_bits(f);
  const bool neg = (code >> (nbits - 1)) & 1u;
  const uint32_t e = (code >> f.mant_bits) & exp_all_ones(f);
  const uint32_t m = code & ((1u << f.mant_bits) - 1u);
  double mag;
  if (f.ieee_special && e == exp_all_ones(f)) {
    mag = m == 0 ? INFINITY : NAN;
  } else if (!f.ieee_special && e == exp_all_ones(f) && m == (1u << f.mant_bits) - 1u) {
    mag = NAN;
  } else if (e == 0) {
    mag = std::ldexp(double(m), 1 - f.bias - f.mant_bits);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(double(m), -f.mant_bits), int(e) - f.bias);
  }
  return neg ? -mag : mag;
}

// Largest finite value: E4M3 448, E5M2 57344, fp16 65504, bf16 ~3.39e38.
inline double ref_max_finite(const Format& f) {
  const int emax = int(exp_all_ones(f)) - (f.ieee_special ? 1 : 0) - f.bias;
  const double top_mant = f.ieee_special ? 2.0 - std::ldexp(1.0, -f.mant_bits)   // all mantissa bits
                                         : 2.0 - std::ldexp(2.0, -f.mant_bits);  // all but the NaN pattern
  return std::ldexp(top_mant, emax);
}

// Round a finite double to the format's grid, nearest-even, with an unbounded
// exponent range above (overflow is handled by the caller) and the subnormal
// step below. `x` must carry at most 53 significant bits (a float does).
inline double ref_round_to_grid(const Format& f, double x) {
  if (x == 0.0) return x;
  int e;
  std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
  int exp = e - 1;
  const int min_exp = 1 - f.bias;
  if (exp < min_exp) exp = min_exp;
  const double ulp = std::ldexp(1.0, exp - f.mant_bits);
  // x / ulp is exact (a power-of-two scaling); nearbyint rounds half to even.
  return std::nearbyint(x / ulp) * ulp;
}

// Encode a value already on the grid (finite, or +-inf for IEEE formats).
inline uint32_t ref_bits_of_grid_value(const Format& f, double r, bool neg) {
  const uint32_t sign = neg ? (1u << (total_bits(f) - 1)) : 0u;
  const double a = std::fabs(r);
  if (std::isinf(a)) return sign | (exp_all_ones(f) << f.mant_bits);
  if (a == 0.0) return sign;
  int e;
  std::frexp(a, &e);
  const int exp = e - 1;
  if (exp < 1 - f.bias) {  // subnormal: a = m * 2^(1 - bias - M)
    return sign | uint32_t(std::ldexp(a, f.bias - 1 + f.mant_bits));
  }
  const uint32_t m = uint32_t(std::ldexp(a, f.mant_bits - exp)) - (1u << f.mant_bits);
  return sign | (uint32_t(exp + f.bias) << f.mant_bits) | m;
}

// Reference encoder: round to nearest even; overflow to inf or saturate to the
// largest finite value per format (infinities saturate too); NaN gives some NaN
// code (compare NaNs with ref_decode(...) being NaN, not by bits).
inline uint32_t ref_encode(const Format& f, double x) {
  const bool neg = std::signbit(x);
  const uint32_t sign = neg ? (1u << (total_bits(f) - 1)) : 0u;
  if (std::isnan(x)) return sign | (exp_all_ones(f) << f.mant_bits) | ((1u << f.mant_bits) - 1u);
  const double maxv = ref_max_finite(f);
  double r = std::isinf(x) ? x : ref_round_to_grid(f, x);
  if (std::fabs(r) > maxv) {
    r = f.overflow == Overflow::kSaturate ? maxv : INFINITY;
  }
  return ref_bits_of_grid_value(f, r, neg);
}

// Codes compare equal, or both are NaN.
inline bool same_code(const Format& f, uint32_t got, uint32_t want) {
  if (std::isnan(ref_decode(f, want))) return std::isnan(ref_decode(f, got));
  return got == want;
}

inline const Format& format_of(te_dtype d) {
  switch (d) {
    case TE_DTYPE_FLOAT8_E4M3: return kE4M3;
    case TE_DTYPE_FLOAT8_E5M2: return kE5M2;
    case TE_DTYPE_FLOAT16: return kFp16;
    default: return kBf16;
  }
}

inline size_t elem_size(te_dtype d) {
  switch (d) {
    case TE_DTYPE_UINT8:
    case TE_DTYPE_FLOAT8_E4M3:
    case TE_DTYPE_FLOAT8_E5M2: return 1;
    case TE_DTYPE_FLOAT16:
    case TE_DTYPE_BFLOAT16: return 2;
    case TE_DTYPE_INT32:
    case TE_DTYPE_FLOAT32: return 4;
    default: return 8;
  }
}

inline const char* dtype_str(te_dtype d) {
  switch (d) {
    case TE_DTYPE_UINT8: return "uint8";
    case TE_DTYPE_INT32: return "int32";
    case TE_DTYPE_INT64: return "int64";
    case TE_DTYPE_FLOAT32: return "float32";
    case TE_DTYPE_FLOAT16: return "float16";
    case TE_DTYPE_BFLOAT16: return "bfloat16";
    case TE_DTYPE_FLOAT8_E4M3: return "float8_e4m3";
    case TE_DTYPE_FLOAT8_E5M2: return "float8_e5m2";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Buffers of a float dtype: the raw bytes plus the exact value of each element.
// ---------------------------------------------------------------------------

constexpr uint8_t kPoison = 0xAB;
constexpr size_t kGuard = 32;  // poisoned bytes past the end, to catch overruns

// A byte buffer poisoned with 0xAB, with a guard zone after `bytes`.
struct Buffer {
  std::vector<uint8_t> mem;
  size_t bytes = 0;
  explicit Buffer(size_t nbytes = 0) : mem(nbytes + kGuard, kPoison), bytes(nbytes) {}
  void* data() { return mem.data(); }
  template <class T>
  T get(size_t i) const {
    T v;
    memcpy(&v, mem.data() + i * sizeof(T), sizeof(T));
    return v;
  }
  template <class T>
  void set(size_t i, T v) {
    memcpy(mem.data() + i * sizeof(T), &v, sizeof(T));
  }
  bool guard_intact() const {
    for (size_t i = bytes; i < mem.size(); ++i)
      if (mem[i] != kPoison) return false;
    return true;
  }
  bool all_poison() const {
    for (uint8_t b : mem)
      if (b != kPoison) return false;
    return true;
  }
};

// Store float `v` into element i of a buffer of dtype d using the reference
// encoder; returns the exact value now held (what the library will read).
inline float store_value(Buffer& b, te_dtype d, size_t i, float v) {
  if (d == TE_DTYPE_FLOAT32) {
    b.set<float>(i, v);
    return v;
  }
  const Format& f = format_of(d);
  const uint32_t code = ref_encode(f, v);
  if (total_bits(f) == 8) {
    b.set<uint8_t>(i, uint8_t(code));
  } else {
    b.set<uint16_t>(i, uint16_t(code));
  }
  return float(ref_decode(f, code));
}

// Read element i of a buffer of dtype d as a code (float32: its bit pattern).
inline uint32_t load_code(const Buffer& b, te_dtype d, size_t i) {
  switch (elem_size(d)) {
    case 1: return b.get<uint8_t>(i);
    case 2: return b.get<uint16_t>(i);
    default: return b.get<uint32_t>(i);
  }
}

// ---------------------------------------------------------------------------
// Descriptors.
// ---------------------------------------------------------------------------

inline te_device cpu() { return te_device{TE_DEVICE_CPU, 0}; }
inline te_device cuda(int index = 0) { return te_device{TE_DEVICE_CUDA, index}; }

inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

inline te_tensor make_tensor(te_dtype dtype, const std::vector<int64_t>& shape, void* data,
                             te_device dev = cpu(), int32_t scaling = TE_SCALING_NONE) {
  te_tensor t;
  memset(&t, 0, sizeof(t));
  t.device = dev;
  t.dtype = dtype;
  t.ndim = int32_t(shape.size());
  for (size_t i = 0; i < shape.size() && i < TE_MAX_DIMS; ++i) t.shape[i] = shape[i];
  t.data = data;
  t.scaling_mode = scaling;
  return t;
}

inline std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

inline std::string last_error() { return te_last_error_message(); }

constexpr double kU = 1.0 / 16777216.0;  // 2^-24, fp32's unit roundoff

// Half an ulp at 1, and half the smallest subnormal step, of a float output dtype.
inline double unit_roundoff(te_dtype d) {
  switch (d) {
    case TE_DTYPE_FLOAT16: return std::ldexp(1.0, -11);
    case TE_DTYPE_BFLOAT16: return std::ldexp(1.0, -8);
    default: return kU;
  }
}
inline double half_min_step(te_dtype d) {
  switch (d) {
    case TE_DTYPE_FLOAT16: return std::ldexp(1.0, -25);
    case TE_DTYPE_BFLOAT16: return std::ldexp(1.0, -134);
    default: return std::ldexp(1.0, -150);
  }
}

// A bad-input call's outcome: the wanted status, a message that starts with "<op>: " and
// names every one of `parts` (the argument, what was expected, what was given).
inline ::testing::AssertionResult is_error(te_status got, te_status want, const std::string& op,
                                           const std::vector<std::string>& parts) {
  const std::string msg = last_error();
  if (got != want)
    return ::testing::AssertionFailure() << "status " << got << ", want " << want << " (message: " << msg << ")";
  if (msg.rfind(op + ": ", 0) != 0)
    return ::testing::AssertionFailure() << "message does not start with '" << op << ": ': " << msg;
  for (const std::string& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << p << "': " << msg;
  return ::testing::AssertionSuccess() << msg;
}

// ---------------------------------------------------------------------------
// Random values spread over many magnitudes.
// ---------------------------------------------------------------------------

// A value whose magnitude is log-uniform in [2^lo, 2^hi], random sign and mantissa.
inline float random_magnitude(std::mt19937& rng, int lo, int hi) {
  std::uniform_real_distribution<double> e(lo, hi);
  std::uniform_int_distribution<int> s(0, 1);
  const double v = std::exp2(e(rng));
  return float(s(rng) ? -v : v);
}

// Inputs for a quantizing cast with `scale`: scaled magnitudes from deep in the
// FP8 subnormal range to beyond E5M2's max, exact FP8 midpoints (ties), zeros of
// both signs, and, if `specials`, NaN and +-inf.
inline std::vector<float> quantize_inputs(size_t n, float scale, uint32_t seed, bool specials = true) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> kind(0, 19);
  std::vector<float> v(n);
  // E4M3 and E5M2 midpoints (ties), scaled back by the scale (exact when the
  // scale is a power of 2)
  std::vector<double> mids;
  for (uint32_t c = 0; c < 0x7e; ++c) mids.push_back((ref_decode(kE4M3, c) + ref_decode(kE4M3, c + 1)) / 2);
  for (uint32_t c = 0; c < 0x7b; ++c) mids.push_back((ref_decode(kE5M2, c) + ref_decode(kE5M2, c + 1)) / 2);
  std::uniform_int_distribution<size_t> pick(0, mids.size() - 1);
  for (size_t i = 0; i < n; ++i) {
    const int k = kind(rng);
    float x;
    if (k < 12) {
      x = random_magnitude(rng, -20, 18) / scale;  // E4M3/E5M2 subnormals ... above E5M2 max
    } else if (k < 15) {
      x = random_magnitude(rng, 7, 10) / scale;  // near E4M3's max (448)
    } else if (k < 17) {
      x = float(mids[pick(rng)] / scale) * (rng() & 1 ? 1.f : -1.f);
    } else if (k == 17) {
      x = (rng() & 1) ? 0.0f : -0.0f;
    } else if (k == 18 && specials) {
      x = (rng() & 1) ? NAN : -NAN;
    } else if (k == 19 && specials) {
      x = (rng() & 1) ? INFINITY : -INFINITY;
    } else {
      x = random_magnitude(rng, -4, 4);
    }
    v[i] = x;
  }
  return v;
}

}  // namespace tt
