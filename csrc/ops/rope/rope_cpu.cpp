// CPU reference of the rope family: token by token, the position first, then
// the sin and cos of the token's d2 angles (fp32), then every head's pairs.
// The CUDA kernels find THD tokens' sequences by a binary search instead of
// walking the sequences, and multiply-add with FMAs; they agree with this
// within fp32 rounding.
#include <cmath>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "common/host_elements.h"
#include "ops/rope/rope_params.h"

namespace opente {

namespace {

constexpr int64_t kNoPosition = std::numeric_limits<int64_t>::min();  // a THD token of no sequence

// The position of every output row; kNoPosition for THD padding.
std::vector<int64_t> row_positions(const RopeParams& p) {
  const int64_t rows = rope_rows(p);
  std::vector<int64_t> pos(static_cast<size_t>(rows), kNoPosition);
  if (p.format != TE_ROPE_THD) {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t j, batch;
      rope_sb_of_row(p, r, &j, &batch);
      const int64_t start = p.start_positions ? p.start_positions[batch] : 0;
      pos[r] = rope_position(j, p.s, start, p.cp_size, p.cp_rank);
    }
    return pos;
  }
  for (int64_t i = 0; i < p.b; ++i) {
    const int64_t begin = p.cu_seqlens[i] / p.cp_size, end = p.cu_seqlens[i + 1] / p.cp_size;
    const int64_t start = p.start_positions ? p.start_positions[i] : 0;
    for (int64_t tok = begin; tok < end && tok < rows; ++tok) {
      pos[tok] = rope_position(tok - begin, end - begin, start, p.cp_size, p.cp_rank);
    }
  }
  return pos;
}

int64_t input_row_offset(const RopeParams& p, int64_t row) {
  if (p.format == TE_ROPE_THD) return row * p.stride_s;
  int64_t j, batch;
  rope_sb_of_row(p, row, &j, &batch);
  return j * p.stride_s + batch * p.stride_b;
}

template <te_dtype D>
void rope_typed(const RopeParams& p) {
  const int64_t d2 = p.d2, half = d2 / 2;
  const std::vector<int64_t> positions = row_positions(p);
  std::vector<float> cos_f(static_cast<size_t>(d2)), sin_f(static_cast<size_t>(d2));
  std::vector<float> x(static_cast<size_t>(p.d));  // one head of the input row
  for (int64_t r = 0; r < rope_rows(p); ++r) {
    const int64_t pos = positions[r];
    const bool rotate = pos != kNoPosition;
    const bool in_freqs = pos >= 0 && pos < p.s2;
    for (int64_t f = 0; f < d2; ++f) {
      const float angle = in_freqs ? p.freqs[pos * d2 + f] : std::numeric_limits<float>::quiet_NaN();
      cos_f[f] = std::cos(angle);
      sin_f[f] = std::sin(angle);
    }
    const int64_t in_row = input_row_offset(p, r);
    for (int64_t k = 0; k < p.h; ++k) {
      for (int64_t f = 0; f < p.d; ++f) x[f] = load_as_float<D>(p.input, in_row + k * p.stride_h + f * p.stride_d);
      const int64_t out_head = (r * p.h + k) * p.d;
      for (int64_t f = 0; f < p.d; ++f) {
        float y = x[f];
        if (rotate && f < d2) {
          // The partner of f in its pair, and whether f is the pair's first element.
          const bool first = p.interleaved ? f % 2 == 0 : f < half;
          const int64_t partner = p.interleaved ? (first ? f + 1 : f - 1) : (first ? f + half : f - half);
          // forward: y_f = x_f cos f_f -+ x_partner sin f_f (minus for the first element);
          // backward (the transpose): x_partner's sine and the opposite signs.
          const float sin_used = p.backward ? sin_f[partner] : sin_f[f];
          const float rotated = (first != p.backward) ? -x[partner] : x[partner];
          y = x[f] * cos_f[f] + rotated * sin_used;
        }
        store_from_float<D>(p.output, out_head + f, y);
      }
    }
  }
}

}  // namespace

void rope_cpu(const RopeParams& p) {
  dispatch_float_dtype(p.dtype, [&](auto tag) { rope_typed<decltype(tag)::value>(p); });
}

}  // namespace opente
