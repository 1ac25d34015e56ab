// te_quantize against a reference built in the test: q = fp8(fp32(x * scale))
// with the independent encoder of test_util.h; amax = max(old, max|x|) with NaNs
// ignored; scale_inv = 1/scale; column-wise output = transpose of row-wise.
#include <cfloat>

#include "test_util.h"

namespace {

using namespace tt;

enum Layout { kRowwise = 1, kColumnwise = 2, kBoth = 3 };

const char* layout_name(Layout l) { return l == kRowwise ? "rowwise" : l == kColumnwise ? "columnwise" : "both"; }

const te_dtype kInDtypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};
const te_dtype kOutDtypes[] = {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2};
const Layout kLayouts[] = {kRowwise, kColumnwise, kBoth};

// [rows, cols] of the matrix view: the last dim is cols, a scalar is 1x1.
void matrix_dims(const std::vector<int64_t>& shape, int64_t* rows, int64_t* cols) {
  *cols = shape.empty() ? 1 : shape.back();
  *rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) *rows *= shape[i];
}

// The fp32 product x * scale: a double holds it exactly, so one rounding to
// float gives the correctly rounded fp32 product.
float fp32_mul(float a, float b) { return float(double(a) * double(b)); }

struct QuantizeCase {
  te_dtype in;
  te_dtype out;
  std::vector<int64_t> shape;
  Layout layout;
  float scale;
  uint32_t seed;
  float amax_init = 0.0f;
};

// Runs one cast on fresh random inputs with poisoned outputs and checks every
// output element, the guards past the ends, amax and scale_inv.
void check_quantize(const QuantizeCase& k, const std::vector<float>* given_inputs = nullptr) {
  SCOPED_TRACE(::testing::Message() << dtype_str(k.in) << " -> " << dtype_str(k.out) << " shape "
                                    << shape_str(k.shape) << " " << layout_name(k.layout) << " scale " << k.scale);
  const int64_t n = numel_of(k.shape);
  int64_t rows, cols;
  matrix_dims(k.shape, &rows, &cols);
  ASSERT_EQ(rows * cols, n);

  const std::vector<float> raw = given_inputs ? *given_inputs : quantize_inputs(size_t(n), k.scale, k.seed);
  Buffer in(n * elem_size(k.in));
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = store_value(in, k.in, i, raw[i]);

  Buffer out(n), out_t(n);
  float scale = k.scale, scale_inv = f32(0xABABABABu), amax = k.amax_init;
  te_tensor ti = make_tensor(k.in, k.shape, in.data());
  te_tensor to = make_tensor(k.out, k.shape, (k.layout & kRowwise) ? out.data() : nullptr, cpu(),
                             TE_SCALING_PER_TENSOR);
  to.columnwise_data = (k.layout & kColumnwise) ? out_t.data() : nullptr;
  to.scale = &scale;
  to.scale_inv = &scale_inv;
  to.amax = &amax;
  ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();

  const Format& f = format_of(k.out);
  int bad = 0;
  double want_amax = k.amax_init;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float xv = x[r * cols + c];
      if (!std::isnan(xv)) want_amax = std::max(want_amax, std::fabs(double(xv)));
      const uint32_t want = ref_encode(f, fp32_mul(xv, k.scale));
      if ((k.layout & kRowwise) && !same_code(f, out.get<uint8_t>(r * cols + c), want) && bad++ < 5) {
        ADD_FAILURE() << "rowwise [" << r << "," << c << "] x=" << xv << ": got 0x" << std::hex
                      << int(out.get<uint8_t>(r * cols + c)) << ", want 0x" << want;
      }
      if ((k.layout & kColumnwise) && !same_code(f, out_t.get<uint8_t>(c * rows + r), want) && bad++ < 5) {
        ADD_FAILURE() << "columnwise [" << c << "," << r << "] x=" << xv << ": got 0x" << std::hex
                      << int(out_t.get<uint8_t>(c * rows + r)) << ", want 0x" << want;
      }
      // the column-wise copy is the exact (byte-for-byte) transpose of the row-wise one
      if (k.layout == kBoth && out_t.get<uint8_t>(c * rows + r) != out.get<uint8_t>(r * cols + c) && bad++ < 5) {
        ADD_FAILURE() << "columnwise is not the transpose of rowwise at [" << r << "," << c << "]";
      }
    }
  }
  EXPECT_EQ(bad, 0) << "mismatching elements";
  EXPECT_TRUE(out.guard_intact()) << "row-wise output written past its end";
  EXPECT_TRUE(out_t.guard_intact()) << "column-wise output written past its end";
  EXPECT_EQ(double(amax), want_amax);
  EXPECT_EQ(scale_inv, float(1.0 / double(k.scale)));
}

// Every input dtype x FP8 dtype x layout, over shapes that are tiny, odd,
// 1-D, 3-D, scalar and empty.
TEST(Quantize, AllDtypesLayoutsAndShapes) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 1}, {3, 17}, {17, 3}, {33}, {2, 3, 5}, {1, 2, 1, 7},
                                                    {},     {0, 5},  {5, 0},  {0}, {2, 0, 3}, {19, 70}};
  uint32_t seed = 1;
  for (te_dtype in : kInDtypes)
    for (te_dtype out : kOutDtypes)
      for (Layout l : kLayouts)
        for (const auto& s : shapes) check_quantize({in, out, s, l, 2.0f, seed++});
}

// Scales that are not powers of two: the fp32 product rounds before the FP8 cast.
TEST(Quantize, NonPowerOfTwoScales) {
  uint32_t seed = 100;
  for (float scale : {3.7f, 0.013f, 1234.5f, 1.0f / 3.0f, 1e-6f, 3e6f})
    for (te_dtype in : kInDtypes)
      for (te_dtype out : kOutDtypes) check_quantize({in, out, {16, 33}, kBoth, scale, seed++});
}

// Hand-derived codes for the edge cases of the cast (scale 1, E4M3 and E5M2).
TEST(Quantize, SpecialValues) {
  const std::vector<float> xs = {NAN,        -NAN,  INFINITY,         -INFINITY,
                                 0.0f,       -0.0f, 448.0f,           449.0f,
                                 464.0f,     -1e4f, std::ldexp(1.f, -10), std::ldexp(3.f, -10),
                                 1.0f,       1.0625f, FLT_MAX,        57344.0f,
                                 61440.0f,   -1e30f, std::ldexp(1.f, -17), std::ldexp(3.f, -17)};
  // E4M3: inf and everything >= 448 saturate to 0x7e; 2^-10 is half the smallest
  // step (tie -> 0), 3*2^-10 the tie between steps 1 and 2 (-> 2); 1.0625 the tie
  // between 1.0 (0x38) and 1.125 (0x39) -> 0x38.
  const int e4m3[] = {-1,   -1,   0x7e, 0xfe, 0x00, 0x80, 0x7e, 0x7e, 0x7e, 0xfe,
                      0x00, 0x02, 0x38, 0x38, 0x7e, 0x7e, 0x7e, 0xfe, 0x00, 0x00};
  // E5M2: 448 = 1.75*2^8 = 0x5f (449 and 464 are nearer it than 512); 1e4 is
  // nearest 10240 = 1.25*2^13 = 0x71; 2^-10 = 0x14 and 1.5*2^-9 = 0x1a are normal;
  // 1.0 = 0x3c, 1.0625 lies below the tie at 1.125 -> 0x3c; 2^-17 ties to 0,
  // 3*2^-17 ties between 1 and 2 steps of 2^-16 -> 2; max 57344 = 0x7b.
  const int e5m2[] = {-1,   -1,   0x7b, 0xfb, 0x00, 0x80, 0x5f, 0x5f, 0x5f, 0xf1,
                      0x14, 0x1a, 0x3c, 0x3c, 0x7b, 0x7b, 0x7b, 0xfb, 0x00, 0x02};
  for (te_dtype out : kOutDtypes) {
    SCOPED_TRACE(dtype_str(out));
    const int* want = out == TE_DTYPE_FLOAT8_E4M3 ? e4m3 : e5m2;
    Buffer q(xs.size());
    float scale = 1.0f, amax = 0.0f;
    std::vector<float> in = xs;
    te_tensor ti = make_tensor(TE_DTYPE_FLOAT32, {int64_t(xs.size())}, in.data());
    te_tensor to = make_tensor(out, {int64_t(xs.size())}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    to.scale = &scale;
    to.amax = &amax;
    ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    for (size_t i = 0; i < xs.size(); ++i) {
      const uint8_t got = q.get<uint8_t>(i);
      if (want[i] < 0) {
        EXPECT_TRUE(std::isnan(ref_decode(format_of(out), got))) << "x=" << xs[i] << " got 0x" << std::hex << int(got);
      } else {
        EXPECT_EQ(int(got), want[i]) << "x=" << xs[i];
      }
    }
    EXPECT_EQ(amax, INFINITY);  // |inf| is the max; the NaNs are ignored
  }
}

// q = fp8(x * scale) rounds the fp32 product, not the exact one: pick x and
// scale whose exact product lies just off an FP8 midpoint m but whose fp32
// product is m itself; the cast must then tie to even. (CPU and GPU must agree
// on this double rounding bit for bit.)
TEST(Quantize, RoundsTheFp32Product) {
  int above = 0, below = 0;
  for (te_dtype out : {TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2}) {
    const Format& f = format_of(out);
    const uint32_t one = ref_encode(f, 1.0);
    for (uint32_t c = one; c < one + (1u << f.mant_bits); ++c) {  // the ties in [1, 2)
      const double m = (ref_decode(f, c) + ref_decode(f, c + 1)) / 2;
      const uint32_t even = (c % 2 == 0) ? c : c + 1;
      for (float x : {3.0f, 5.0f, 7.0f, 1.0f + std::ldexp(1.0f, -23)}) {
        float scale = float(m / x);
        const double exact = double(x) * double(scale);
        if (fp32_mul(x, scale) != float(m) || exact == m) continue;  // not a double-rounding case
        (exact > m ? above : below)++;
        float amax = 0.0f;
        uint8_t q = 0xAB;
        te_tensor ti = make_tensor(TE_DTYPE_FLOAT32, {1}, &x);
        te_tensor to = make_tensor(out, {1}, &q, cpu(), TE_SCALING_PER_TENSOR);
        to.scale = &scale;
        to.amax = &amax;
        ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
        EXPECT_EQ(q, even) << f.name << " x=" << x << " scale=" << scale << " tie " << m
                           << (exact > m ? " (exact product above it)" : " (exact product below it)");
      }
    }
  }
  EXPECT_GT(above, 0);  // the construction produced cases on both sides
  EXPECT_GT(below, 0);
}

// amax is of the input, before scaling, and accumulates with what the buffer holds.
TEST(Quantize, AmaxAccumulatesAndIgnoresNaN) {
  std::vector<float> in = {1.5f, NAN, -7.25f, 2.0f, -NAN};
  Buffer q(in.size());
  te_tensor ti = make_tensor(TE_DTYPE_FLOAT32, {5}, in.data());
  te_tensor to = make_tensor(TE_DTYPE_FLOAT8_E4M3, {5}, q.data(), cpu(), TE_SCALING_PER_TENSOR);
  float scale = 16.0f, amax;
  to.scale = &scale;
  to.amax = &amax;
  for (float init : {0.0f, 1.0f, 7.25f, 8.0f, 1e30f}) {
    amax = init;
    ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_EQ(amax, std::max(init, 7.25f)) << "init " << init;
  }
  // a running max over two casts
  amax = 0.0f;
  ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS);
  std::vector<float> in2 = {-3.0f, 5.0f};
  te_tensor ti2 = make_tensor(TE_DTYPE_FLOAT32, {2}, in2.data());
  te_tensor to2 = to;
  to2.shape[0] = 2;
  ASSERT_EQ(te_quantize(&ti2, &to2, nullptr), TE_SUCCESS);
  EXPECT_EQ(amax, 7.25f);
  // all-NaN input leaves amax as it was
  std::vector<float> nans = {NAN, -NAN};
  te_tensor ti3 = make_tensor(TE_DTYPE_FLOAT32, {2}, nans.data());
  amax = 0.5f;
  ASSERT_EQ(te_quantize(&ti3, &to2, nullptr), TE_SUCCESS);
  EXPECT_EQ(amax, 0.5f);
}

// scale_inv and amax are optional; the data is the same without them.
TEST(Quantize, ScaleInvAndAmaxOptional) {
  const int64_t n = 40;
  std::vector<float> in = quantize_inputs(n, 0.5f, 7);
  Buffer with(n), without(n);
  float scale = 0.5f, scale_inv = 0.0f, amax = 0.0f;
  te_tensor ti = make_tensor(TE_DTYPE_FLOAT32, {4, 10}, in.data());
  te_tensor to = make_tensor(TE_DTYPE_FLOAT8_E5M2, {4, 10}, with.data(), cpu(), TE_SCALING_PER_TENSOR);
  to.scale = &scale;
  to.scale_inv = &scale_inv;
  to.amax = &amax;
  ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(scale_inv, 2.0f);
  to.data = without.data();
  to.scale_inv = nullptr;
  to.amax = nullptr;
  ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(with.mem, without.mem);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_TRUE(same_code(kE5M2, without.get<uint8_t>(i), ref_encode(kE5M2, fp32_mul(in[i], 0.5f))));
}

// An empty tensor writes no data and leaves amax alone; scale_inv still gets 1/scale.
TEST(Quantize, ZeroSizeWritesNoData) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{0}, {0, 4}, {4, 0}, {3, 0, 2}}) {
    SCOPED_TRACE(shape_str(shape));
    Buffer q(8), qt(8);
    float scale = 4.0f, scale_inv = 0.0f, amax = 3.0f;
    te_tensor ti = make_tensor(TE_DTYPE_BFLOAT16, shape, nullptr);  // no elements: data may be null
    te_tensor to = make_tensor(TE_DTYPE_FLOAT8_E4M3, shape, q.data(), cpu(), TE_SCALING_PER_TENSOR);
    to.columnwise_data = qt.data();
    to.scale = &scale;
    to.scale_inv = &scale_inv;
    to.amax = &amax;
    ASSERT_EQ(te_quantize(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    EXPECT_TRUE(q.all_poison());
    EXPECT_TRUE(qt.all_poison());
    EXPECT_EQ(amax, 3.0f);
    EXPECT_EQ(scale_inv, 0.25f);
  }
}

}  // namespace
