// The rope ops (opente/rope.h) on the CPU against a float64 reference written
// here from the header's definition (each pair's 2x2 rotation matrix, applied
// as is for the forward and transposed for the backward; context-parallel
// positions from the two chunks a rank holds), and their bad input.
//
// Error bound (u = 2^-24; the core computes in fp32): for an output element with
// terms x_a cos and x_b sin, M = |x_a cos| + |x_b sin|: sinf / cosf err by at
// most 1 ulp (2u relative), the two products and the sum by u each, so
// |y - ref| <= 4u M; 8u M is asserted (slack for the reference's own rounding),
// then the output dtype's rounding: half an ulp of |ref| + 8u M, and half its
// smallest subnormal step. Copied features and THD padding must be bit exact,
// positions outside freqs exactly NaN.
#include <algorithm>
#include <functional>
#include <numeric>

#include "test_util.h"

namespace {

using namespace tt;

const te_status INV = TE_ERROR_INVALID_ARGUMENT;
const te_status NIMP = TE_ERROR_NOT_IMPLEMENTED;

const te_dtype kDtypes[] = {TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16};
const te_rope_format kFormats[] = {TE_ROPE_SBHD, TE_ROPE_BSHD, TE_ROPE_THD};

const char* format_str(te_rope_format f) { return f == TE_ROPE_SBHD ? "sbhd" : f == TE_ROPE_BSHD ? "bshd" : "thd"; }

double value_at(const Buffer& b, te_dtype d, size_t i) {
  if (d == TE_DTYPE_FLOAT32) return b.get<float>(i);
  return ref_decode(format_of(d), load_code(b, d, i));
}

// ---- a problem and its float64 reference -------------------------------------------------------

struct Problem {
  te_rope_format format = TE_ROPE_SBHD;
  te_dtype dtype = TE_DTYPE_FLOAT32;
  int64_t s = 5, b = 2, h = 3, d = 8, d2 = 8;  // THD: s is t (tokens), b comes from cu
  int64_t s2 = 0;                              // freqs rows; 0: just enough (see freq_rows())
  bool interleaved = false;
  bool backward = false;
  std::vector<int32_t> cu;     // THD: [b + 1]
  std::vector<int32_t> start;  // empty: no start_positions
  int32_t cp_size = 1, cp_rank = 0;
  std::vector<int64_t> strides;  // input element strides; empty: contiguous
  int64_t offset = 0;            // the view's first element in its storage

  int64_t batches() const { return format == TE_ROPE_THD ? int64_t(cu.size()) - 1 : b; }
  std::vector<int64_t> shape() const {
    if (format == TE_ROPE_THD) return {s, h, d};
    if (format == TE_ROPE_SBHD) return {s, b, h, d};
    return {b, s, h, d};
  }
  std::vector<int64_t> view_strides() const {
    if (!strides.empty()) return strides;
    const std::vector<int64_t> sh = shape();
    std::vector<int64_t> st(sh.size());
    int64_t c = 1;
    for (size_t i = sh.size(); i-- > 0;) st[i] = c, c *= sh[i];
    return st;
  }
  int64_t storage_elements() const {
    const std::vector<int64_t> sh = shape(), st = view_strides();
    int64_t last = offset;
    for (size_t i = 0; i < sh.size(); ++i) {
      if (sh[i] == 0) return offset;
      last += (sh[i] - 1) * st[i];
    }
    return last + 1;
  }
  int64_t freq_rows() const { return s2 > 0 ? s2 : cp_size * std::max<int64_t>(s, 1) + 8; }
};

// Position of local token j of a sequence of local length n: the start offset, or
// with context parallelism the rank's two chunks of n/2 tokens of the full sequence
// of 2 cp_size chunks (chunk cp_rank, then chunk 2 cp_size - 1 - cp_rank).
int64_t reference_position(const Problem& pb, int64_t j, int64_t n, int64_t start) {
  if (pb.cp_size == 1) return j + start;
  const int64_t chunk = n / 2;
  const int64_t which = j < chunk ? pb.cp_rank : 2 * pb.cp_size - 1 - pb.cp_rank;
  return which * chunk + (j < chunk ? j : j - chunk);
}

struct Data {
  Buffer x;                  // the input's storage
  std::vector<float> freqs;  // [s2, d2]
  Buffer y;                  // the output, contiguous
};

Data make_data(const Problem& pb, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> angle(-100.0, 100.0);
  Data dt{Buffer(size_t(pb.storage_elements()) * elem_size(pb.dtype)),
          {},
          Buffer(size_t(numel_of(pb.shape())) * elem_size(pb.dtype))};
  for (int64_t i = 0; i < pb.storage_elements(); ++i) store_value(dt.x, pb.dtype, size_t(i), float(normal(rng)));
  dt.freqs.resize(size_t(pb.freq_rows() * pb.d2));
  for (float& f : dt.freqs) f = float(angle(rng));
  return dt;
}

// The float64 expectation of every output element, its bound, and what must be exact.
struct Expected {
  std::vector<double> value;
  std::vector<double> bound;  // before the output rounding
  std::vector<bool> exact;    // copied: the input's bits
  std::vector<bool> nan;      // position outside freqs
};

Expected reference(const Problem& pb, const Data& dt) {
  const std::vector<int64_t> sh = pb.shape(), st = pb.view_strides();
  const int64_t rows = pb.format == TE_ROPE_THD ? pb.s : pb.s * pb.b;
  const size_t n = size_t(rows * pb.h * pb.d);
  Expected e{std::vector<double>(n), std::vector<double>(n, 0.0), std::vector<bool>(n, false),
             std::vector<bool>(n, false)};
  // Per output row: the input row's first element and the position (or none).
  std::vector<int64_t> row_in(static_cast<size_t>(rows)), row_pos(static_cast<size_t>(rows));
  std::vector<bool> row_rotates(static_cast<size_t>(rows), false);
  if (pb.format == TE_ROPE_THD) {
    for (int64_t r = 0; r < rows; ++r) row_in[r] = pb.offset + r * st[0];
    for (int64_t i = 0; i + 1 < int64_t(pb.cu.size()); ++i) {
      const int64_t begin = pb.cu[i] / pb.cp_size, end = pb.cu[i + 1] / pb.cp_size;
      for (int64_t tok = begin; tok < end; ++tok) {
        row_rotates[tok] = true;
        row_pos[tok] = reference_position(pb, tok - begin, end - begin, pb.start.empty() ? 0 : pb.start[i]);
      }
    }
  } else {
    for (int64_t si = 0; si < pb.s; ++si) {
      for (int64_t bi = 0; bi < pb.b; ++bi) {
        const bool sbhd = pb.format == TE_ROPE_SBHD;
        const int64_t r = sbhd ? si * pb.b + bi : bi * pb.s + si;
        row_in[r] = pb.offset + (sbhd ? si * st[0] + bi * st[1] : bi * st[0] + si * st[1]);
        row_pos[r] = reference_position(pb, si, pb.s, pb.start.empty() ? 0 : pb.start[bi]);
        row_rotates[r] = true;
      }
    }
  }
  const int64_t sh_h = st[sh.size() - 2], sd = st[sh.size() - 1];
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < pb.h; ++k) {
      auto x = [&](int64_t f) { return value_at(dt.x, pb.dtype, size_t(row_in[r] + k * sh_h + f * sd)); };
      for (int64_t f = 0; f < pb.d; ++f) {
        const size_t o = size_t((r * pb.h + k) * pb.d + f);
        if (!row_rotates[r] || f >= pb.d2) {
          e.value[o] = x(f);
          e.exact[o] = true;
          continue;
        }
        const int64_t pos = row_pos[r];
        if (pos < 0 || pos >= pb.freq_rows()) {
          e.nan[o] = true;
          continue;
        }
        // The pair (a, b) holding f and its rotation matrix [[ca, -sa], [sb, cb]].
        const int64_t a = pb.interleaved ? f - f % 2 : (f < pb.d2 / 2 ? f : f - pb.d2 / 2);
        const int64_t bb = pb.interleaved ? a + 1 : a + pb.d2 / 2;
        const double ta = dt.freqs[size_t(pos * pb.d2 + a)], tb = dt.freqs[size_t(pos * pb.d2 + bb)];
        const double m[2][2] = {{std::cos(ta), -std::sin(ta)}, {std::sin(tb), std::cos(tb)}};
        const int row = f == a ? 0 : 1;
        double c0, c1;  // the coefficients of x_a and x_b in this output
        if (!pb.backward) {
          c0 = m[row][0], c1 = m[row][1];
        } else {
          c0 = m[0][row], c1 = m[1][row];
        }
        e.value[o] = c0 * x(a) + c1 * x(bb);
        e.bound[o] = 8 * kU * (std::fabs(c0 * x(a)) + std::fabs(c1 * x(bb)));
      }
    }
  }
  return e;
}

te_status run_problem(const Problem& pb, Data& dt) {
  const std::vector<int64_t> sh = pb.shape();
  te_tensor in = make_tensor(pb.dtype, sh, static_cast<char*>(dt.x.data()) + pb.offset * elem_size(pb.dtype));
  te_tensor out = make_tensor(pb.dtype, sh, dt.y.data());
  te_tensor freqs = make_tensor(TE_DTYPE_FLOAT32, {pb.freq_rows(), 1, 1, pb.d2}, dt.freqs.data());
  std::vector<int32_t> cu = pb.cu, start = pb.start;
  te_tensor tcu = make_tensor(TE_DTYPE_INT32, {int64_t(cu.size())}, cu.data());
  te_tensor tstart = make_tensor(TE_DTYPE_INT32, {int64_t(start.size())}, start.data());
  const te_rope_config config{pb.format, pb.interleaved ? 1 : 0, pb.cp_size, pb.cp_rank};
  const int64_t* strides = pb.strides.empty() ? nullptr : pb.strides.data();
  const te_tensor* cu_ptr = pb.format == TE_ROPE_THD ? &tcu : nullptr;
  const te_tensor* start_ptr = pb.start.empty() ? nullptr : &tstart;
  return pb.backward ? te_rope_bwd(&in, strides, &freqs, cu_ptr, start_ptr, &out, &config, nullptr)
                     : te_rope_fwd(&in, strides, &freqs, cu_ptr, start_ptr, &out, &config, nullptr);
}

std::string describe(const Problem& pb) {
  std::string s = std::string(pb.backward ? "bwd " : "fwd ") + format_str(pb.format) + " " + dtype_str(pb.dtype) +
                  " shape " + shape_str(pb.shape()) + " d2=" + std::to_string(pb.d2) +
                  (pb.interleaved ? " interleaved" : "");
  if (!pb.strides.empty()) s += " strides " + shape_str(pb.strides);
  if (!pb.start.empty()) s += " start_positions";
  if (pb.cp_size > 1) s += " cp " + std::to_string(pb.cp_rank) + "/" + std::to_string(pb.cp_size);
  return s;
}

// Runs pb on fresh data and checks every output element.
void check_problem(const Problem& pb, uint32_t seed = 1) {
  SCOPED_TRACE(describe(pb));
  Data dt = make_data(pb, seed);
  ASSERT_EQ(run_problem(pb, dt), TE_SUCCESS) << last_error();
  const Expected e = reference(pb, dt);
  const double unit = unit_roundoff(pb.dtype), tiny = half_min_step(pb.dtype);
  int failures = 0;
  for (size_t o = 0; o < e.value.size() && failures < 5; ++o) {
    const double got = value_at(dt.y, pb.dtype, o);
    bool ok;
    if (e.nan[o]) {
      ok = std::isnan(got);
    } else if (e.exact[o]) {
      ok = got == e.value[o];  // the stored input value itself
    } else {
      ok = std::fabs(got - e.value[o]) <= e.bound[o] + unit * (std::fabs(e.value[o]) + e.bound[o]) + tiny;
    }
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "element " << o << ": got " << got << ", want " << e.value[o]
                    << (e.nan[o]     ? " (NaN)"
                        : e.exact[o] ? " (exact copy)"
                                     : "")
                    << " bound " << e.bound[o];
    }
  }
  EXPECT_TRUE(dt.y.guard_intact()) << "wrote past the output";
}

// ---- semantics ----------------------------------------------------------------------------------

// Shapes per format: sequences of different lengths for THD (one empty).
Problem base(te_rope_format f, int64_t d, int64_t d2) {
  Problem pb;
  pb.format = f;
  pb.d = d;
  pb.d2 = d2;
  if (f == TE_ROPE_THD) {
    pb.cu = {0, 3, 3, 10, 11};
    pb.s = 11;
  }
  return pb;
}

TEST(Rope, FormatsDtypesAndFeatureSplits) {
  // (d, d2): all rotated; odd d with a passthrough tail; d2 not a multiple of 4;
  // nothing rotated; a single pair.
  const int64_t dims[][2] = {{8, 8}, {7, 4}, {16, 6}, {5, 0}, {2, 2}, {33, 32}};
  for (te_rope_format f : kFormats)
    for (te_dtype dt : kDtypes)
      for (bool inter : {false, true})
        for (bool bwd : {false, true})
          for (const auto& dd : dims) {
            Problem pb = base(f, dd[0], dd[1]);
            pb.dtype = dt;
            pb.interleaved = inter;
            pb.backward = bwd;
            check_problem(pb);
          }
}

// q sliced out of a fused [s, b, h, 3d] QKV projection (feature offset d), a BSHD
// view of SBHD memory (s and b strides swapped), every other feature (stride 2),
// a THD view with padded token rows, and a broadcast (stride 0) batch.
TEST(Rope, StridedInputs) {
  for (bool inter : {false, true}) {
    for (bool bwd : {false, true}) {
      Problem q = base(TE_ROPE_SBHD, 8, 6);
      q.strides = {q.b * q.h * 3 * q.d, q.h * 3 * q.d, 3 * q.d, 1};
      q.offset = q.d;
      Problem t = base(TE_ROPE_BSHD, 8, 8);
      t.strides = {t.h * t.d, t.b * t.h * t.d, t.d, 1};
      Problem every_other = base(TE_ROPE_SBHD, 6, 4);
      every_other.strides = {every_other.b * every_other.h * 12, every_other.h * 12, 12, 2};
      every_other.offset = 1;
      Problem thd = base(TE_ROPE_THD, 8, 8);
      thd.strides = {thd.h * thd.d + 5, thd.d, 1};
      Problem broadcast = base(TE_ROPE_BSHD, 4, 4);
      broadcast.strides = {0, broadcast.h * broadcast.d, broadcast.d, 1};
      for (Problem* pb : {&q, &t, &every_other, &thd, &broadcast}) {
        for (te_dtype dt : kDtypes) {
          pb->interleaved = inter;
          pb->backward = bwd;
          pb->dtype = dt;
          check_problem(*pb);
        }
      }
    }
  }
}

TEST(Rope, StartPositions) {
  for (te_rope_format f : kFormats) {
    for (bool bwd : {false, true}) {
      Problem pb = base(f, 8, 8);
      pb.backward = bwd;
      pb.start = f == TE_ROPE_THD ? std::vector<int32_t>{4, 0, 7, 1} : std::vector<int32_t>{3, 9};
      pb.s2 = pb.s + 10;
      check_problem(pb);
    }
  }
}

// Positions past freqs (or negative) give NaN in the rotated features only.
TEST(Rope, PositionsOutsideFreqsAreNan) {
  for (te_rope_format f : kFormats) {
    Problem pb = base(f, 6, 4);
    pb.start = f == TE_ROPE_THD ? std::vector<int32_t>{0, 0, 9, -1} : std::vector<int32_t>{2, -1};
    pb.s2 = pb.s + 3;
    check_problem(pb);
    Data dt = make_data(pb, 2);
    ASSERT_EQ(run_problem(pb, dt), TE_SUCCESS);
    const Expected e = reference(pb, dt);
    EXPECT_GT(std::count(e.nan.begin(), e.nan.end(), true), 0) << "the case must reach past freqs";
  }
}

TEST(Rope, ContextParallel) {
  for (te_rope_format f : kFormats) {
    for (int32_t rank = 0; rank < 3; ++rank) {
      for (bool bwd : {false, true}) {
        Problem pb = base(f, 8, 8);
        pb.cp_size = 3;
        pb.cp_rank = rank;
        pb.backward = bwd;
        pb.interleaved = rank == 1;
        if (f == TE_ROPE_THD) {
          pb.cu = {0, 12, 12, 36, 48};  // full lengths 12, 0, 24, 12: local 4, 0, 8, 4
          pb.s = 16;
          pb.s2 = 24;
        } else {
          pb.s = 4;
          pb.s2 = 12;  // exactly cp_size * s: the last chunk reaches the last row
        }
        check_problem(pb);
      }
    }
  }
}

// Tokens before cu_seqlens[0] and from cu_seqlens[b] on are copied.
TEST(Rope, ThdPaddingIsCopied) {
  for (bool inter : {false, true}) {
    Problem pb = base(TE_ROPE_THD, 8, 8);
    pb.cu = {2, 5, 5, 9};
    pb.s = 13;
    pb.interleaved = inter;
    check_problem(pb);
  }
}

TEST(Rope, EmptyInputsWriteNothing) {
  for (te_rope_format f : kFormats) {
    for (int which = 0; which < 3; ++which) {
      Problem pb = base(f, 8, 8);
      if (which == 0) pb.s = 0, pb.cu = {0, 0};
      if (which == 1) pb.h = 0;
      if (which == 2) pb.b = 0, pb.cu = {0};
      if (f == TE_ROPE_THD && which == 2) pb.s = 0;
      SCOPED_TRACE(describe(pb));
      Data dt = make_data(pb, 3);
      EXPECT_EQ(run_problem(pb, dt), TE_SUCCESS) << last_error();
      EXPECT_TRUE(dt.y.all_poison());
    }
  }
}

// The backward is the forward's transpose: <bwd(g), x> == <g, fwd(x)> (fp32, double sums).
TEST(Rope, BackwardIsTheTranspose) {
  for (te_rope_format f : kFormats) {
    for (bool inter : {false, true}) {
      Problem pb = base(f, 10, 6);
      pb.interleaved = inter;
      Data x = make_data(pb, 11), g = make_data(pb, 12);
      g.freqs = x.freqs;
      ASSERT_EQ(run_problem(pb, x), TE_SUCCESS) << last_error();
      pb.backward = true;
      ASSERT_EQ(run_problem(pb, g), TE_SUCCESS) << last_error();
      double lhs = 0, rhs = 0, scale = 0;
      for (size_t i = 0; i < size_t(numel_of(pb.shape())); ++i) {
        lhs += double(g.y.get<float>(i)) * x.x.get<float>(i);
        rhs += double(g.x.get<float>(i)) * x.y.get<float>(i);
        scale += std::fabs(double(g.y.get<float>(i)) * x.x.get<float>(i));
      }
      EXPECT_NEAR(lhs, rhs, 16 * kU * scale) << format_str(f) << (inter ? " interleaved" : "");
    }
  }
}

// ---- bad input ----------------------------------------------------------------------------------

// Valid arguments: fp32 input [4, 2, 3, 8] (SBHD) or [9, 3, 8] (THD, cu {0, 4, 9}),
// freqs [8, 1, 1, 8], start_positions [2] and output; each case spoils one thing.
// x has room past the input for the strided case's span.
struct Args {
  std::vector<float> x, y, freqs;
  std::vector<int32_t> cu{0, 4, 9}, start{0, 1};
  std::vector<int64_t> strides;
  te_tensor in, out, tf, tcu, tstart;
  te_rope_config config{TE_ROPE_SBHD, 0, 1, 0};
  const te_tensor *in_ptr = &in, *out_ptr = &out, *f_ptr = &tf, *cu_ptr = nullptr, *start_ptr = nullptr;
  const int64_t* strides_ptr = nullptr;
  const te_rope_config* config_ptr = &config;
  bool backward = false;

  explicit Args(te_rope_format f = TE_ROPE_SBHD) : x(512, 0.5f), y(256, -7.0f), freqs(64, 0.25f) {
    const std::vector<int64_t> shape =
        f == TE_ROPE_THD ? std::vector<int64_t>{9, 3, 8} : std::vector<int64_t>{4, 2, 3, 8};
    in = make_tensor(TE_DTYPE_FLOAT32, shape, x.data());
    out = make_tensor(TE_DTYPE_FLOAT32, shape, y.data());
    tf = make_tensor(TE_DTYPE_FLOAT32, {8, 1, 1, 8}, freqs.data());
    tcu = make_tensor(TE_DTYPE_INT32, {3}, cu.data());
    tstart = make_tensor(TE_DTYPE_INT32, {2}, start.data());
    config.format = f;
    if (f == TE_ROPE_THD) cu_ptr = &tcu;
  }
  te_status run() {
    return backward ? te_rope_bwd(in_ptr, strides_ptr, f_ptr, cu_ptr, start_ptr, out_ptr, config_ptr, nullptr)
                    : te_rope_fwd(in_ptr, strides_ptr, f_ptr, cu_ptr, start_ptr, out_ptr, config_ptr, nullptr);
  }
  bool untouched() const {
    return std::all_of(y.begin(), y.end(), [](float v) { return v == -7.0f; });
  }
};

// Message parts name the direction's tensors through placeholders: {in} is input
// or grad_output, {out} output or grad_input.
struct BadCase {
  const char* name;
  te_rope_format format;
  std::function<void(Args&)> spoil;
  std::vector<std::string> parts;
};

std::string named(std::string part, bool backward) {
  const std::pair<const char*, const char*> names[] = {{"{in}", backward ? "grad_output" : "input"},
                                                       {"{out}", backward ? "grad_input" : "output"}};
  for (const auto& [placeholder, name] : names) {
    for (size_t at = part.find(placeholder); at != std::string::npos; at = part.find(placeholder, at)) {
      part.replace(at, std::string(placeholder).size(), name);
    }
  }
  return part;
}

TEST(RopeBadInput, BaselinesSucceed) {
  for (te_rope_format f : kFormats) {
    for (bool bwd : {false, true}) {
      Args a(f);
      a.backward = bwd;
      EXPECT_EQ(a.run(), TE_SUCCESS) << format_str(f) << ": " << last_error();
      EXPECT_FALSE(a.untouched());
    }
  }
}

TEST(RopeBadInput, Cases) {
  const te_rope_format S = TE_ROPE_SBHD, T = TE_ROPE_THD;
  const BadCase cases[] = {
      {"null config", S, [](Args& a) { a.config_ptr = nullptr; }, {"config must not be null"}},
      {"bad format", S, [](Args& a) { a.config.format = 3; }, {"config.format must be TE_ROPE_SBHD", "got 3"}},
      {"cp_size 0", S, [](Args& a) { a.config.cp_size = 0; }, {"config.cp_size must be >= 1, got 0"}},
      {"cp_rank",
       S,
       [](Args& a) { a.config.cp_size = 2, a.config.cp_rank = 2; },
       {"config.cp_rank must be in [0, 2)", "got 2"}},
      {"null input", S, [](Args& a) { a.in_ptr = nullptr; }, {"{in} must not be null"}},
      {"int32 input",
       S,
       [](Args& a) { a.in.dtype = TE_DTYPE_INT32; },
       {"{in} dtype must be float32, float16 or bfloat16, got int32"}},
      {"fp8 input",
       S,
       [](Args& a) { a.in.dtype = TE_DTYPE_FLOAT8_E4M3; },
       {"{in} dtype must be float32, float16 or bfloat16, got float8_e4m3"}},
      {"3D sbhd",
       S,
       [](Args& a) { a.in.ndim = 3; },
       {"{in} must be 4D [s, b, h, d] for format SBHD, got shape [4, 2, 3]"}},
      {"3D bshd",
       S,
       [](Args& a) { a.config.format = TE_ROPE_BSHD, a.in.ndim = 3; },
       {"{in} must be 4D [b, s, h, d] for format BSHD"}},
      {"4D thd",
       T,
       [](Args& a) { a.in.ndim = 4, a.in.shape[3] = 1; },
       {"{in} must be 3D [t, h, d] for format THD, got shape [9, 3, 8, 1]"}},
      {"negative stride",
       S,
       [](Args& a) {
         a.strides = {48, 24, 8, -1}, a.strides_ptr = a.strides.data();
       },
       {"{in}_strides[3] must be >= 0, got -1"}},
      {"null freqs", S, [](Args& a) { a.f_ptr = nullptr; }, {"freqs must not be null"}},
      {"fp16 freqs", S, [](Args& a) { a.tf.dtype = TE_DTYPE_FLOAT16; }, {"freqs dtype must be float32, got float16"}},
      {"2D freqs",
       S,
       [](Args& a) { a.tf.ndim = 2, a.tf.shape[1] = 8; },
       {"freqs must be 4D [s2, 1, 1, d2], got shape [8, 8]"}},
      {"freqs heads",
       S,
       [](Args& a) { a.tf.shape[2] = 3; },
       {"freqs must be 4D [s2, 1, 1, d2], got shape [8, 1, 3, 8]"}},
      {"odd d2", S, [](Args& a) { a.tf.shape[3] = 7; }, {"freqs last dim d2 must be even", "got 7"}},
      {"d2 > d",
       S,
       [](Args& a) { a.tf.shape[3] = 10; },
       {"freqs last dim d2 = 10 must not exceed the head dim d = 8 of {in} shape [4, 2, 3, 8]"}},
      {"short freqs",
       S,
       [](Args& a) { a.tf.shape[0] = 3; },
       {"freqs has 3 positions, but {in} sequence length 4 needs 4"}},
      {"short freqs cp",
       S,
       [](Args& a) { a.config.cp_size = 2, a.tf.shape[0] = 7; },
       {"freqs has 7 positions, but {in} sequence length 4 on rank 0 of 2 needs 8"}},
      {"odd s cp",
       S,
       [](Args& a) { a.config.cp_size = 2, a.in.shape[0] = 3, a.out.shape[0] = 3; },
       {"{in} sequence length s must be even with context parallelism (cp_size 2), got 3"}},
      {"missing cu_seqlens", T, [](Args& a) { a.cu_ptr = nullptr; }, {"cu_seqlens must be given for format THD"}},
      {"cu_seqlens with sbhd", S, [](Args& a) { a.cu_ptr = &a.tcu; }, {"cu_seqlens must be null for format SBHD"}},
      {"cu_seqlens dtype",
       T,
       [](Args& a) { a.tcu.dtype = TE_DTYPE_INT64; },
       {"cu_seqlens dtype must be int32, got int64"}},
      {"cu_seqlens 2D",
       T,
       [](Args& a) { a.tcu.ndim = 2, a.tcu.shape[1] = 1; },
       {"cu_seqlens must be 1D [b + 1], got shape [3, 1]"}},
      {"cu_seqlens empty", T, [](Args& a) { a.tcu.shape[0] = 0; }, {"cu_seqlens must be 1D [b + 1], got shape [0]"}},
      {"null cu_seqlens data", T, [](Args& a) { a.tcu.data = nullptr; }, {"cu_seqlens.data must not be null"}},
      {"decreasing cu_seqlens",
       T,
       [](Args& a) {
         a.cu = {0, 5, 4};
       },
       {"cu_seqlens must be non-decreasing, got cu_seqlens[1] = 5 > cu_seqlens[2] = 4"}},
      {"negative cu_seqlens",
       T,
       [](Args& a) {
         a.cu = {-1, 4, 9};
       },
       {"cu_seqlens[0] must be >= 0, got -1"}},
      {"cu_seqlens past t",
       T,
       [](Args& a) {
         a.cu = {0, 4, 10};
       },
       {"cu_seqlens[2] = 10 must not exceed t = 9 (the tokens of {in})"}},
      {"odd local length cp",
       T,
       [](Args& a) {
         a.config.cp_size = 2, a.cu = {0, 4, 10};
       },
       {"with cp_size 2 every sequence's local length must be even", "sequence 1 has 3"}},
      {"start_positions length",
       S,
       [](Args& a) { a.start_ptr = &a.tstart, a.tstart.shape[0] = 1; },
       {"start_positions shape must be [2] (one offset per sequence), got [1]"}},
      {"start_positions dtype",
       S,
       [](Args& a) { a.start_ptr = &a.tstart, a.tstart.dtype = TE_DTYPE_FLOAT32; },
       {"start_positions dtype must be int32, got float32"}},
      {"start_positions with cp",
       S,
       [](Args& a) { a.start_ptr = &a.tstart, a.config.cp_size = 2; },
       {"start_positions is not supported with context parallelism (cp_size 2)"}},
      {"null start data",
       T,
       [](Args& a) { a.start_ptr = &a.tstart, a.tstart.data = nullptr; },
       {"start_positions.data must not be null"}},
      {"null output", S, [](Args& a) { a.out_ptr = nullptr; }, {"{out} must not be null"}},
      {"output dtype",
       S,
       [](Args& a) { a.out.dtype = TE_DTYPE_BFLOAT16; },
       {"{out} dtype must equal {in} dtype float32, got bfloat16"}},
      {"output shape",
       S,
       [](Args& a) { a.out.shape[2] = 2; },
       {"{out} shape [4, 2, 2, 8] must equal {in} shape [4, 2, 3, 8]"}},
      {"null input data", S, [](Args& a) { a.in.data = nullptr; }, {"{in}.data must not be null"}},
      {"null output data", S, [](Args& a) { a.out.data = nullptr; }, {"{out}.data must not be null"}},
      {"null freqs data", S, [](Args& a) { a.tf.data = nullptr; }, {"freqs.data must not be null"}},
      {"output is input", S, [](Args& a) { a.out.data = a.x.data(); }, {"{out} must not overlap {in} in memory"}},
      {"output over freqs", S, [](Args& a) { a.out.data = a.freqs.data() + 60; }, {"{out} must not overlap freqs"}},
      {"output over cu_seqlens", T, [](Args& a) { a.out.data = a.cu.data(); }, {"{out} must not overlap cu_seqlens"}},
      {"output over start_positions",
       S,
       [](Args& a) { a.start_ptr = &a.tstart, a.out.data = a.start.data() + 1; },
       {"{out} must not overlap start_positions"}},
      {"output in a strided input's span",
       S,
       [](Args& a) {
         a.strides = {96, 48, 16, 2};  // the input spans x[0, 383]
         a.strides_ptr = a.strides.data();
         a.out.data = a.x.data() + 200;
       },
       {"{out} must not overlap {in} in memory"}},
  };
  for (const BadCase& c : cases) {
    for (bool bwd : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + (bwd ? " / bwd" : " / fwd"));
      Args a(c.format);
      a.backward = bwd;
      c.spoil(a);
      std::vector<std::string> parts;
      for (const std::string& p : c.parts) parts.push_back(named(p, bwd));
      EXPECT_TRUE(is_error(a.run(), INV, bwd ? "te_rope_bwd" : "te_rope_fwd", parts));
      EXPECT_TRUE(a.untouched());
    }
  }
}

// One tensor on a GPU, the others on the CPU: a CPU-only build refuses the CUDA
// tensor itself (naming it); a CUDA build reports the mismatch.
TEST(RopeBadInput, MismatchedDevices) {
  const struct {
    const char* arg;
    std::function<te_tensor&(Args&)> pick;
    bool start;
  } cases[] = {
      {"output", [](Args& a) -> te_tensor& { return a.out; }, false},
      {"freqs", [](Args& a) -> te_tensor& { return a.tf; }, false},
      {"cu_seqlens", [](Args& a) -> te_tensor& { return a.tcu; }, false},
      {"start_positions", [](Args& a) -> te_tensor& { return a.tstart; }, true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.arg);
    Args a(TE_ROPE_THD);
    if (c.start) a.start_ptr = &a.tstart;
    c.pick(a).device = cuda(0);
    if (te_built_with_cuda()) {
      EXPECT_TRUE(is_error(a.run(), INV, "te_rope_fwd", {std::string(c.arg) + " is on cuda:0 but input is on cpu"}));
    } else {
      EXPECT_TRUE(is_error(a.run(), NIMP, "te_rope_fwd", {c.arg, "CUDA"}));
    }
    EXPECT_TRUE(a.untouched());
  }
}

}  // namespace
