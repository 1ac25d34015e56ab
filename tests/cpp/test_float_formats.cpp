// The project's bit-level conversions (common/float_formats.h) against the
// independent double-precision references of test_util.h.
#include <cfloat>

#include "common/float_formats.h"
#include "test_util.h"

namespace {

using namespace tt;

bool is_e4m3(const Format& f) { return &f == &kE4M3; }

float lib_decode(const Format& f, uint32_t c) {
  if (is_e4m3(f)) return opente::fp8_bits_to_float<opente::Fp8E4M3Traits>(uint8_t(c));
  if (&f == &kE5M2) return opente::fp8_bits_to_float<opente::Fp8E5M2Traits>(uint8_t(c));
  if (&f == &kFp16) return opente::fp16_bits_to_float(uint16_t(c));
  return opente::bf16_bits_to_float(uint16_t(c));
}

uint32_t lib_encode(const Format& f, float x) {
  if (is_e4m3(f)) return opente::float_to_fp8_bits<opente::Fp8E4M3Traits>(x);
  if (&f == &kE5M2) return opente::float_to_fp8_bits<opente::Fp8E5M2Traits>(x);
  if (&f == &kFp16) return opente::float_to_fp16_bits(x);
  return opente::float_to_bf16_bits(x);
}

const Format* const kFp8Formats[] = {&kE4M3, &kE5M2};
const Format* const kAllFormats[] = {&kE4M3, &kE5M2, &kFp16, &kBf16};

uint32_t max_code(const Format& f) { return ref_encode(f, ref_max_finite(f)); }
uint32_t sign_bit(const Format& f) { return 1u << (total_bits(f) - 1); }

// Checks lib_encode(x) against the reference encoder; returns false (and
// reports) on the first mismatch so a broken rule gives one line, not millions.
bool check_encode(const Format& f, float x) {
  const uint32_t want = ref_encode(f, x);
  const uint32_t got = lib_encode(f, x);
  if (same_code(f, got, want)) return true;
  ADD_FAILURE() << f.name << ": encode(" << x << " = 0x" << std::hex << bits_of(x) << ") = 0x" << got
                << ", want 0x" << want;
  return false;
}

// ---- the reference itself, pinned to values from the format definitions ----

TEST(FloatFormatReference, KnownValues) {
  // FP8 (Micikevicius et al. 2022, "FP8 formats for deep learning")
  EXPECT_EQ(ref_decode(kE4M3, 0x7e), 448.0);
  EXPECT_EQ(ref_decode(kE4M3, 0x38), 1.0);
  EXPECT_EQ(ref_decode(kE4M3, 0x08), std::ldexp(1.0, -6));  // smallest normal
  EXPECT_EQ(ref_decode(kE4M3, 0x01), std::ldexp(1.0, -9));  // smallest subnormal
  EXPECT_EQ(ref_decode(kE4M3, 0x78), 256.0);                // exponent 1111 is still a number
  EXPECT_EQ(ref_decode(kE4M3, 0xfe), -448.0);
  EXPECT_TRUE(std::isnan(ref_decode(kE4M3, 0x7f)));
  EXPECT_TRUE(std::isnan(ref_decode(kE4M3, 0xff)));
  EXPECT_EQ(ref_decode(kE5M2, 0x7b), 57344.0);
  EXPECT_EQ(ref_decode(kE5M2, 0x3c), 1.0);
  EXPECT_EQ(ref_decode(kE5M2, 0x04), std::ldexp(1.0, -14));
  EXPECT_EQ(ref_decode(kE5M2, 0x01), std::ldexp(1.0, -16));
  EXPECT_EQ(ref_decode(kE5M2, 0x7c), INFINITY);
  EXPECT_EQ(ref_decode(kE5M2, 0xfc), -INFINITY);
  EXPECT_TRUE(std::isnan(ref_decode(kE5M2, 0x7d)));
  EXPECT_EQ(ref_max_finite(kE4M3), 448.0);
  EXPECT_EQ(ref_max_finite(kE5M2), 57344.0);
  // IEEE binary16 and bfloat16
  EXPECT_EQ(ref_decode(kFp16, 0x3c00), 1.0);
  EXPECT_EQ(ref_decode(kFp16, 0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(ref_decode(kFp16, 0x7bff), 65504.0);
  EXPECT_EQ(ref_decode(kFp16, 0x7c00), INFINITY);
  EXPECT_EQ(ref_max_finite(kFp16), 65504.0);
  EXPECT_EQ(ref_decode(kBf16, 0x3f80), 1.0);
  EXPECT_EQ(ref_decode(kBf16, 0xc0a0), -5.0);
  EXPECT_EQ(ref_max_finite(kBf16), double(f32(0x7f7f0000u)));
  // the encoder: 1.0625 is the tie between E4M3 1.0 and 1.125 -> even (1.0)
  EXPECT_EQ(ref_encode(kE4M3, 1.0625), 0x38u);
  EXPECT_EQ(ref_encode(kE4M3, 1.1875), 0x3au);  // tie between 1.125 (odd) and 1.25 (even)
  EXPECT_EQ(ref_encode(kE4M3, 1e6), 0x7eu);
  EXPECT_EQ(ref_encode(kFp16, 65520.0), 0x7c00u);
}

// ---- decoding ----

// Every code of every format decodes to the value of its definition.
TEST(FloatFormats, DecodeEveryCode) {
  for (const Format* f : kAllFormats) {
    const uint32_t n = 1u << total_bits(*f);
    int bad = 0;
    for (uint32_t c = 0; c < n && bad < 5; ++c) {
      const double want = ref_decode(*f, c);
      const float got = lib_decode(*f, c);
      if (std::isnan(want) ? !std::isnan(got) : (double(got) != want || std::signbit(got) != std::signbit(want))) {
        ++bad;
        ADD_FAILURE() << f->name << ": decode(0x" << std::hex << c << ") = " << got << ", want " << want;
      }
    }
  }
}

// ---- encoding: every code round-trips (FP8 infinities saturate); NaN stays NaN ----

TEST(FloatFormats, EveryCodeRoundTripsThroughFloat) {
  for (const Format* f : kAllFormats) {
    const uint32_t n = 1u << total_bits(*f);
    int bad = 0;
    for (uint32_t c = 0; c < n && bad < 5; ++c) {
      const uint32_t back = lib_encode(*f, lib_decode(*f, c));
      const double v = ref_decode(*f, c);
      // E5M2's infinity codes are the exception: FP8 casts saturate them to +-max
      const bool sat_inf = std::isinf(v) && f->overflow == Overflow::kSaturate;
      const uint32_t want = sat_inf ? (max_code(*f) | (c & sign_bit(*f))) : c;
      if (std::isnan(v) ? !std::isnan(ref_decode(*f, back)) : back != want) {
        ++bad;
        ADD_FAILURE() << f->name << ": 0x" << std::hex << c << " -> 0x" << back;
      }
    }
  }
}

// For every pair of adjacent finite values a < b (zero and subnormals included):
// the midpoint goes to the code with the even mantissa, values just off the
// midpoint go to the nearer one, and the same holds for negative values.
TEST(FloatFormats, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (const Format* f : kAllFormats) {
    const uint32_t top = max_code(*f);
    int bad = 0;
    for (uint32_t c = 0; c < top && bad < 5; ++c) {
      const double a = ref_decode(*f, c), b = ref_decode(*f, c + 1);
      ASSERT_LT(a, b) << f->name << " code " << c;
      const float mid = float((a + b) / 2);
      ASSERT_EQ(double(mid), (a + b) / 2) << "midpoint not exact in float";
      const uint32_t even = (c % 2 == 0) ? c : c + 1;
      const float below = std::nextafter(mid, float(a)), above = std::nextafter(mid, float(b));
      const float quarter = float(a + (b - a) / 4), three_quarters = float(a + 3 * (b - a) / 4);
      const struct {
        float x;
        uint32_t want;
      } cases[] = {{mid, even}, {below, c}, {above, c + 1}, {quarter, c}, {three_quarters, c + 1}};
      for (const auto& k : cases) {
        for (int s = 0; s < 2; ++s) {
          const float x = s ? -k.x : k.x;
          const uint32_t want = s ? (k.want | sign_bit(*f)) : k.want;
          const uint32_t got = lib_encode(*f, x);
          if (got != want) {
            ++bad;
            ADD_FAILURE() << f->name << ": encode(" << x << ") = 0x" << std::hex << got << ", want 0x" << want;
          }
        }
      }
    }
  }
}

// ---- FP8 specials ----

// Past the largest finite value FP8 saturates to it: just above max, the
// midpoint to the next (missing) value, huge values, FLT_MAX and infinity.
TEST(FloatFormats, Fp8SaturatesToMax) {
  EXPECT_EQ(max_code(kE4M3), 0x7eu);
  EXPECT_EQ(max_code(kE5M2), 0x7bu);
  for (const Format* f : kFp8Formats) {
    const float maxv = float(ref_max_finite(*f));
    const float step_above = is_e4m3(*f) ? 32.0f : 4096.0f;  // spacing at the top binade
    const float xs[] = {maxv, std::nextafter(maxv, INFINITY), maxv + step_above / 2, maxv + step_above,
                        maxv * 2, 1e20f, FLT_MAX, INFINITY};
    for (float x : xs) {
      EXPECT_EQ(lib_encode(*f, x), max_code(*f)) << f->name << " x=" << x;
      EXPECT_EQ(lib_encode(*f, -x), max_code(*f) | 0x80u) << f->name << " x=" << -x;
    }
  }
}

TEST(FloatFormats, NaNStaysNaN) {
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7fa00000u};
  for (const Format* f : kAllFormats) {
    for (uint32_t b : nans) {
      const uint32_t got = lib_encode(*f, f32(b));
      EXPECT_TRUE(std::isnan(ref_decode(*f, got))) << f->name << ": NaN 0x" << std::hex << b << " -> 0x" << got;
    }
  }
}

// FP8 subnormals (E4M3 step 2^-9, E5M2 step 2^-16) encode exactly; below half a
// step values flush to zero keeping their sign; half a step ties to zero.
TEST(FloatFormats, Fp8SubnormalsAndUnderflow) {
  for (const Format* f : kFp8Formats) {
    const int step_exp = is_e4m3(*f) ? -9 : -16;
    const uint32_t nsub = 1u << f->mant_bits;  // codes 1 .. nsub-1 are subnormal, nsub the smallest normal
    for (uint32_t k = 0; k <= nsub; ++k) {
      const float x = std::ldexp(float(k), step_exp);
      EXPECT_EQ(lib_encode(*f, x), k) << f->name << " k=" << k;
      EXPECT_EQ(lib_encode(*f, -x), k | 0x80u) << f->name << " k=-" << k;
    }
    const float half = std::ldexp(1.0f, step_exp - 1);
    EXPECT_EQ(lib_encode(*f, half), 0x00u) << f->name;
    EXPECT_EQ(lib_encode(*f, -half), 0x80u) << f->name;
    EXPECT_EQ(lib_encode(*f, std::nextafter(half, 1.0f)), 0x01u) << f->name;
    EXPECT_EQ(lib_encode(*f, std::nextafter(half, 0.0f)), 0x00u) << f->name;
    EXPECT_EQ(lib_encode(*f, std::ldexp(1.0f, -40)), 0x00u) << f->name;
    EXPECT_EQ(lib_encode(*f, FLT_MIN), 0x00u) << f->name;
    EXPECT_EQ(lib_encode(*f, f32(1)), 0x00u) << f->name;          // fp32 subnormal
    EXPECT_EQ(lib_encode(*f, -f32(1)), 0x80u) << f->name;         // keeps the sign
    EXPECT_EQ(lib_encode(*f, 0.0f), 0x00u) << f->name;
    EXPECT_EQ(lib_encode(*f, -0.0f), 0x80u) << f->name;           // negative zero keeps its sign
  }
}

// ---- fp16 / bf16 boundaries ----

TEST(FloatFormats, Fp16OverflowAndUnderflowBoundaries) {
  EXPECT_EQ(lib_encode(kFp16, 65504.0f), 0x7bffu);
  EXPECT_EQ(lib_encode(kFp16, std::nextafter(65520.0f, 0.0f)), 0x7bffu);  // below the tie: max
  EXPECT_EQ(lib_encode(kFp16, 65520.0f), 0x7c00u);  // the tie with 65536 goes to even, i.e. inf
  EXPECT_EQ(lib_encode(kFp16, -65520.0f), 0xfc00u);
  EXPECT_EQ(lib_encode(kFp16, INFINITY), 0x7c00u);
  EXPECT_EQ(lib_encode(kFp16, -INFINITY), 0xfc00u);
  EXPECT_EQ(lib_encode(kFp16, FLT_MAX), 0x7c00u);
  EXPECT_EQ(lib_encode(kFp16, std::ldexp(1.0f, -24)), 0x0001u);
  EXPECT_EQ(lib_encode(kFp16, std::ldexp(1.0f, -25)), 0x0000u);  // tie with 0 goes to 0
  EXPECT_EQ(lib_encode(kFp16, std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(lib_encode(kFp16, std::ldexp(3.0f, -25)), 0x0002u);  // tie between 1 and 2 steps -> 2
  EXPECT_EQ(lib_encode(kFp16, -0.0f), 0x8000u);
  EXPECT_EQ(lib_encode(kFp16, -f32(1)), 0x8000u);
  // largest subnormal rounding up into the smallest normal
  EXPECT_EQ(lib_encode(kFp16, std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400u);
}

TEST(FloatFormats, Bf16OverflowAndSpecials) {
  EXPECT_EQ(lib_encode(kBf16, f32(0x7f7f0000u)), 0x7f7fu);  // largest finite bf16
  EXPECT_EQ(lib_encode(kBf16, FLT_MAX), 0x7f80u);            // rounds past it to inf
  EXPECT_EQ(lib_encode(kBf16, -FLT_MAX), 0xff80u);
  EXPECT_EQ(lib_encode(kBf16, f32(0x7f7f7fffu)), 0x7f7fu);   // just below the tie
  EXPECT_EQ(lib_encode(kBf16, INFINITY), 0x7f80u);
  EXPECT_EQ(lib_encode(kBf16, -0.0f), 0x8000u);
  EXPECT_EQ(lib_encode(kBf16, f32(0x00008000u)), 0x0000u);   // subnormal tie to even (0)
  EXPECT_EQ(lib_encode(kBf16, f32(0x00018000u)), 0x0002u);   // subnormal tie to even (2)
  EXPECT_EQ(lib_encode(kBf16, 1.0f), 0x3f80u);
}

// ---- random inputs against the reference ----

// Random bit patterns (every class of float, NaN payloads, subnormals) and
// random values in each format's own range.
TEST(FloatFormats, RandomFloatsMatchReference) {
  std::mt19937 rng(12345);
  for (const Format* f : kAllFormats) {
    const int lo = 1 - f->bias - f->mant_bits - 3;
    const int hi = int(std::log2(ref_max_finite(*f))) + 3;
    bool ok = true;
    for (int i = 0; i < 200000 && ok; ++i) ok = check_encode(*f, f32(uint32_t(rng())));
    for (int i = 0; i < 200000 && ok; ++i) ok = check_encode(*f, random_magnitude(rng, lo, hi));
  }
}

}  // namespace
