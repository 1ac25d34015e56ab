// Bit-level conversions between fp32 and the narrow float formats (fp16, bf16,
// FP8 E4M3 / E5M2). They define the rounding the whole project follows: round
// to nearest even, FP8 saturating to the largest finite value, NaN kept as NaN.
// The CPU reference uses them directly; the CUDA kernels use the hardware
// conversions, and the GPU tests check both agree bit for bit.
#pragma once

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define OPENTE_HD __host__ __device__ __forceinline__
#else
#define OPENTE_HD inline
#endif

namespace opente {

OPENTE_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

OPENTE_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// mant >> shift, rounded to nearest, ties to even. shift in [1, 31].
OPENTE_HD uint32_t shift_right_rne(uint32_t mant, int shift) {
  if (shift > 31) return 0;
  const uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// ---- bf16 ------------------------------------------------------------------

OPENTE_HD float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

OPENTE_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // canonical NaN, as cvt.rn.bf16.f32
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---- fp16 ------------------------------------------------------------------

OPENTE_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  // subnormal: mant * 2^-24, exact in fp32
  const float mag = float(mant) * bits_float(0x33800000u);
  return sign ? -mag : mag;
}

OPENTE_HD uint16_t float_to_fp16_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0x7fff;                   // canonical NaN, as cvt.rn.f16.f32
  if (mag >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (mag >= 0x38800000u) {                                // normal in fp16
    const uint32_t exp = (mag >> 23) - 112u;
    const uint32_t q = shift_right_rne((exp << 23) | (mag & 0x7fffffu), 13);
    return uint16_t(sign | q);  // a mantissa carry rolls into the exponent
  }
  if (mag <= 0x33000000u) return sign;  // <= 2^-25: rounds to zero
  const int exp = int(mag >> 23) - 127;  // in [-25, -15]
  const uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
  return uint16_t(sign | shift_right_rne(mant, -exp - 1));
}

// ---- FP8 ---------------------------------------------------------------------

// E4M3: bias 7, 3 mantissa bits, no infinity, 0x7f is NaN, max 448 (0x7e).
// E5M2: bias 15, 2 mantissa bits, IEEE-like, max 57344 (0x7b).
struct Fp8E4M3Traits {
  static constexpr int kBias = 7;
  static constexpr int kMantBits = 3;
  static constexpr uint32_t kMaxBits = 0x7e;
  static constexpr uint32_t kMaxAsFloatBits = 0x43e00000u;  // 448.0f
  static constexpr uint8_t kNaN = 0x7f;
};
struct Fp8E5M2Traits {
  static constexpr int kBias = 15;
  static constexpr int kMantBits = 2;
  static constexpr uint32_t kMaxBits = 0x7b;
  static constexpr uint32_t kMaxAsFloatBits = 0x47600000u;  // 57344.0f
  static constexpr uint8_t kNaN = 0x7f;
};

template <class Fmt>
OPENTE_HD uint8_t float_to_fp8_bits(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return Fmt::kNaN;  // canonical, sign dropped: what cvt.satfinite and a GPU multiply give
  if (mag >= Fmt::kMaxAsFloatBits) return uint8_t(sign | Fmt::kMaxBits);  // saturate, inf too
  if (mag < 0x00800000u) return sign;  // fp32 subnormals are far below FP8's smallest step
  const int exp = int(mag >> 23) - 127;
  const uint32_t mant = (mag & 0x7fffffu) | 0x800000u;
  constexpr int kMinNormalExp = 1 - Fmt::kBias;
  uint32_t q;
  if (exp >= kMinNormalExp) {
    // keep the implicit one at bit kMantBits; a carry into bit kMantBits+1 bumps the exponent
    q = shift_right_rne(mant, 23 - Fmt::kMantBits) + (uint32_t(exp + Fmt::kBias - 1) << Fmt::kMantBits);
  } else {
    q = shift_right_rne(mant, 23 - Fmt::kMantBits + (kMinNormalExp - exp));  // subnormal steps
  }
  if (q > Fmt::kMaxBits) q = Fmt::kMaxBits;
  return uint8_t(sign | q);
}

template <class Fmt>
OPENTE_HD float fp8_bits_to_float(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t exp = (b >> Fmt::kMantBits) & ((1u << (7 - Fmt::kMantBits)) - 1u);
  const uint32_t mant = b & ((1u << Fmt::kMantBits) - 1u);
  constexpr uint32_t kExpMax = (1u << (7 - Fmt::kMantBits)) - 1u;
  if (Fmt::kMantBits == 3) {
    if ((b & 0x7fu) == 0x7fu) return bits_float(sign | 0x7fc00000u);
  } else if (exp == kExpMax) {
    return bits_float(sign | (mant ? 0x7fc00000u : 0x7f800000u));
  }
  if (exp == 0) {
    // subnormal: mant * 2^(1 - bias - mant_bits), exact in fp32
    const float step = bits_float(uint32_t(127 + 1 - Fmt::kBias - Fmt::kMantBits) << 23);
    const float mag = float(mant) * step;
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp - Fmt::kBias + 127u) << 23) | (mant << (23 - Fmt::kMantBits)));
}

}  // namespace opente
