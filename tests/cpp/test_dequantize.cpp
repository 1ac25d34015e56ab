// te_dequantize: output = round_to_out_dtype(fp32(fp8_value(q) * scale_inv)),
// checked over every FP8 code against the independent decoder/encoder.
#include <cfloat>

#include "test_util.h"

namespace {

using namespace tt;

const te_dtype kFp8[] = {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2};
const te_dtype kOut[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};

// The expected output code (fp32: its bit pattern) of one element.
uint32_t want_code(te_dtype in, te_dtype out, uint8_t q, float scale_inv) {
  const float v = float(ref_decode(format_of(in), q));
  const float prod = float(double(v) * double(scale_inv));  // exact product, rounded once to fp32
  if (out == TE_DTYPE_FLOAT32) return bits_of(prod);
  return ref_encode(format_of(out), prod);
}

bool same_out(te_dtype out, uint32_t got, uint32_t want) {
  if (out == TE_DTYPE_FLOAT32) return std::isnan(f32(want)) ? std::isnan(f32(got)) : got == want;
  return same_code(format_of(out), got, want);
}

// Dequantizes `codes` (shape `shape`) and checks every element and the guard.
void check_dequantize(te_dtype in, te_dtype out, const std::vector<int64_t>& shape,
                      const std::vector<uint8_t>& codes, float scale_inv) {
  SCOPED_TRACE(::testing::Message() << dtype_str(in) << " -> " << dtype_str(out) << " shape " << shape_str(shape)
                                    << " scale_inv " << scale_inv);
  const int64_t n = numel_of(shape);
  ASSERT_EQ(size_t(n), codes.size());
  Buffer q(n), o(n * elem_size(out));
  for (int64_t i = 0; i < n; ++i) q.set<uint8_t>(i, codes[i]);
  float si = scale_inv;
  te_tensor ti = make_tensor(in, shape, q.data(), cpu(), TE_SCALING_PER_TENSOR);
  ti.scale_inv = &si;
  te_tensor to = make_tensor(out, shape, o.data());
  ASSERT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t want = want_code(in, out, codes[i], scale_inv);
    const uint32_t got = load_code(o, out, i);
    if (!same_out(out, got, want) && bad++ < 5)
      ADD_FAILURE() << "element " << i << " code 0x" << std::hex << int(codes[i]) << ": got 0x" << got
                    << ", want 0x" << want;
  }
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(o.guard_intact()) << "written past the end";
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(q.get<uint8_t>(i), codes[i]) << "input modified";
}

std::vector<uint8_t> all_codes() {
  std::vector<uint8_t> c(256);
  for (int i = 0; i < 256; ++i) c[i] = uint8_t(i);
  return c;
}

// All 256 codes (NaNs, E5M2 infinities, subnormals, -0) through every output
// dtype, with scales that are exact, inexact, and push fp16 into overflow and
// underflow.
TEST(Dequantize, EveryCodeEveryDtype) {
  const float scale_invs[] = {1.0f, 0.5f, 3.7e-3f, 1000.0f, 1.0f / 3.0f, 1e-7f, 1e30f, FLT_MAX};
  for (te_dtype in : kFp8)
    for (te_dtype out : kOut)
      for (float s : scale_invs) check_dequantize(in, out, {16, 16}, all_codes(), s);
}

// Spot values derived by hand, so the test does not only trust the reference:
// E4M3 448 * 0.5 = 224; E5M2 57344 * 2 = 114688 (fp16: inf, bf16: exact);
// E4M3 2^-9 * 2^-20 in fp16 flushes to 0.
TEST(Dequantize, HandDerivedValues) {
  {
    Buffer q(1), o(4);
    q.set<uint8_t>(0, 0x7e);
    float si = 0.5f;
    te_tensor ti = make_tensor(TE_DTYPE_FLOAT8_E4M3, {1}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    ti.scale_inv = &si;
    te_tensor to = make_tensor(TE_DTYPE_FLOAT32, {1}, o.data());
    ASSERT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(o.get<float>(0), 224.0f);
  }
  {
    Buffer q(2), o(4);
    q.set<uint8_t>(0, 0x7b);
    q.set<uint8_t>(1, 0xfb);
    float si = 2.0f;
    te_tensor ti = make_tensor(TE_DTYPE_FLOAT8_E5M2, {2}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    ti.scale_inv = &si;
    te_tensor to = make_tensor(TE_DTYPE_FLOAT16, {2}, o.data());
    ASSERT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(o.get<uint16_t>(0), 0x7c00u);  // 114688 > 65504: fp16 +inf
    EXPECT_EQ(o.get<uint16_t>(1), 0xfc00u);
    to.dtype = TE_DTYPE_BFLOAT16;
    ASSERT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(o.get<uint16_t>(0), 0x47e0u);  // 114688 = 1.75 * 2^16: exp 143 = 0x8f, mant 0x60
    EXPECT_EQ(o.get<uint16_t>(1), 0xc7e0u);
  }
  {
    Buffer q(1), o(2);
    q.set<uint8_t>(0, 0x01);  // 2^-9
    float si = std::ldexp(1.0f, -20);
    te_tensor ti = make_tensor(TE_DTYPE_FLOAT8_E4M3, {1}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    ti.scale_inv = &si;
    te_tensor to = make_tensor(TE_DTYPE_FLOAT16, {1}, o.data());
    ASSERT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(o.get<uint16_t>(0), 0x0000u);  // 2^-29 is below half fp16's smallest step
  }
}

// Shapes: 1-D, 3-D, scalar, and empty (which writes nothing).
TEST(Dequantize, Shapes) {
  std::mt19937 rng(5);
  const std::vector<std::vector<int64_t>> shapes = {{1}, {1, 1}, {3, 17}, {2, 3, 5}, {}, {7, 1, 1, 3}};
  for (const auto& s : shapes) {
    std::vector<uint8_t> codes(numel_of(s));
    for (auto& c : codes) c = uint8_t(rng());
    for (te_dtype in : kFp8)
      for (te_dtype out : kOut) check_dequantize(in, out, s, codes, 0.75f);
  }
  for (const std::vector<int64_t>& s : std::vector<std::vector<int64_t>>{{0}, {0, 3}, {3, 0}}) {
    Buffer o(16);
    float si = 1.0f;
    te_tensor ti = make_tensor(TE_DTYPE_FLOAT8_E4M3, s, nullptr, cpu(), TE_SCALING_PER_TENSOR);
    ti.scale_inv = &si;
    te_tensor to = make_tensor(TE_DTYPE_FLOAT32, s, o.data());
    EXPECT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_TRUE(o.all_poison()) << shape_str(s);
    to.data = nullptr;  // no elements: null data is fine
    EXPECT_EQ(te_dequantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
  }
}

// quantize then dequantize with a power-of-two scale gives back exactly the FP8
// grid value divided by the scale, and the original value for inputs already on
// the grid.
TEST(Dequantize, RoundTripWithQuantize) {
  for (te_dtype fp8 : kFp8) {
    const Format& f = format_of(fp8);
    std::vector<float> x;
    for (uint32_t c = 0; c < 0x80; ++c) {
      const double v = ref_decode(f, c);
      if (std::isfinite(v)) {
        x.push_back(float(v / 8.0));  // on the grid after scale 8
        x.push_back(float(-v / 8.0));
      }
    }
    const int64_t n = int64_t(x.size());
    Buffer q(n);
    float scale = 8.0f, scale_inv = 0.0f;
    te_tensor tx = make_tensor(TE_DTYPE_FLOAT32, {n}, x.data());
    te_tensor tq = make_tensor(fp8, {n}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    tq.scale = &scale;
    tq.scale_inv = &scale_inv;
    ASSERT_EQ(te_quantize(&tx, &tq, nullptr), TE_SUCCESS) << last_error();
    std::vector<float> back(n, -1.0f);
    te_tensor tb = make_tensor(TE_DTYPE_FLOAT32, {n}, back.data());
    ASSERT_EQ(te_dequantize(&tq, &tb, nullptr), TE_SUCCESS) << last_error();
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(back[i], x[i]) << dtype_str(fp8) << " i=" << i;
      EXPECT_EQ(std::signbit(back[i]), std::signbit(x[i])) << dtype_str(fp8) << " i=" << i;
    }
  }
}

}  // namespace
