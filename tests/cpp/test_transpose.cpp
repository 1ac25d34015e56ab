// te_transpose: bytes move unchanged from in[r, c] to out[c, r] for element
// sizes 1, 2, 4 and 8, with output shapes [cols, rows] and [d_{n-1}, d0, ..., d_{n-2}].
#include "test_util.h"

namespace {

using namespace tt;

// Element sizes 1, 2, 4, 8 and the FP8 / bf16 / int32 dtypes besides.
const te_dtype kDtypes[] = {TE_DTYPE_UINT8,  TE_DTYPE_FLOAT16,     TE_DTYPE_FLOAT32,     TE_DTYPE_INT64,
                            TE_DTYPE_INT32,  TE_DTYPE_BFLOAT16,    TE_DTYPE_FLOAT8_E4M3, TE_DTYPE_FLOAT8_E5M2};

// Transposes random bytes (every bit pattern: float NaN payloads, -0 and
// subnormals must move as raw bytes, not through a float register) and checks
// each element against its source.
void check_transpose(te_dtype d, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                     uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_str(d) << " " << shape_str(in_shape) << " -> " << shape_str(out_shape));
  const size_t es = elem_size(d);
  const int64_t n = numel_of(in_shape);
  const int64_t cols = in_shape.empty() ? 1 : in_shape.back();
  const int64_t rows = cols ? n / cols : 0;
  Buffer in(n * es), out(n * es);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < n * int64_t(es); ++i) in.mem[i] = uint8_t(rng());
  const std::vector<uint8_t> in_before = in.mem;
  te_tensor ti = make_tensor(d, in_shape, in.data());
  te_tensor to = make_tensor(d, out_shape, out.data());
  ASSERT_EQ(te_transpose(&ti, &to, nullptr), TE_SUCCESS) << last_error();
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (memcmp(&out.mem[(c * rows + r) * es], &in.mem[(r * cols + c) * es], es) != 0 && bad++ < 5)
        ADD_FAILURE() << "out[" << c << "," << r << "] != in[" << r << "," << c << "]";
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(out.guard_intact()) << "written past the end";
  EXPECT_EQ(in.mem, in_before) << "input modified";
}

TEST(Transpose, MatricesAllElementSizes) {
  const std::vector<std::pair<int64_t, int64_t>> dims = {{1, 1}, {3, 17}, {17, 3}, {1, 40}, {40, 1},
                                                         {64, 64}, {65, 33}, {128, 7}};
  uint32_t seed = 1;
  for (te_dtype d : kDtypes)
    for (auto [r, c] : dims) check_transpose(d, {r, c}, {c, r}, seed++);
}

// An n-D input is the matrix [d0*...*d_{n-2}, d_{n-1}]; the output may be
// written as that matrix's transpose or as [d_{n-1}, d0, ..., d_{n-2}].
TEST(Transpose, HigherRankShapes) {
  uint32_t seed = 100;
  for (te_dtype d : kDtypes) {
    check_transpose(d, {2, 3, 5}, {5, 6}, seed++);
    check_transpose(d, {2, 3, 5}, {5, 2, 3}, seed++);
    check_transpose(d, {4, 1, 3, 7}, {7, 4, 1, 3}, seed++);
    check_transpose(d, {4, 1, 3, 7}, {7, 12}, seed++);
    check_transpose(d, {2, 3, 5}, {5, 3, 2}, seed++);  // shape[0] and numel are all that matter
  }
}

// 1-D: one row, so the output [n, 1] holds the same sequence; a scalar is 1x1.
TEST(Transpose, VectorAndScalar) {
  uint32_t seed = 200;
  for (te_dtype d : kDtypes) {
    check_transpose(d, {9}, {9, 1}, seed++);
    check_transpose(d, {9}, {9}, seed++);
    check_transpose(d, {}, {1}, seed++);
    check_transpose(d, {}, {1, 1}, seed++);
  }
}

// Empty tensors succeed, write nothing, and may have null data.
TEST(Transpose, ZeroSize) {
  for (te_dtype d : kDtypes) {
    for (auto [in_s, out_s] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
             {{0, 5}, {5, 0}}, {{5, 0}, {0, 5}}, {{0}, {0, 1}}, {{2, 0, 3}, {3, 2, 0}}}) {
      SCOPED_TRACE(::testing::Message() << dtype_str(d) << " " << shape_str(in_s));
      Buffer out(8);
      te_tensor ti = make_tensor(d, in_s, nullptr);
      te_tensor to = make_tensor(d, out_s, out.data());
      EXPECT_EQ(te_transpose(&ti, &to, nullptr), TE_SUCCESS) << last_error();
      EXPECT_TRUE(out.all_poison());
      to.data = nullptr;
      EXPECT_EQ(te_transpose(&ti, &to, nullptr), TE_SUCCESS) << last_error();
    }
  }
}

// Transposing twice gives the input back.
TEST(Transpose, TwiceIsIdentity) {
  std::vector<int64_t> a(7 * 13), b(a.size(), -1), c(a.size(), -1);
  std::mt19937_64 rng(3);
  for (auto& v : a) v = int64_t(rng());
  te_tensor ta = make_tensor(TE_DTYPE_INT64, {7, 13}, a.data());
  te_tensor tb = make_tensor(TE_DTYPE_INT64, {13, 7}, b.data());
  te_tensor tc = make_tensor(TE_DTYPE_INT64, {7, 13}, c.data());
  ASSERT_EQ(te_transpose(&ta, &tb, nullptr), TE_SUCCESS) << last_error();
  ASSERT_EQ(te_transpose(&tb, &tc, nullptr), TE_SUCCESS) << last_error();
  EXPECT_EQ(a, c);
  EXPECT_NE(a, b);
}

}  // namespace
