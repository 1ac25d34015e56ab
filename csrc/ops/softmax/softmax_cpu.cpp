// CPU reference of the softmax family: one row at a time in fp32, the max, then
// the sum of exponentials in index order, then the division. The CUDA kernels
// sum in another order (and multiply by the reciprocal) and must agree within
// fp32 rounding.
#include <cmath>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "common/host_elements.h"
#include "ops/softmax/softmax_params.h"

namespace opente {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <te_dtype D>
void softmax_fwd_typed(const SoftmaxFwdParams& p) {
  const int64_t sk = p.sk;
  std::vector<float> z(static_cast<size_t>(sk));  // the row's logits
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t row = r * sk;
    const int64_t kept = softmax_kept_prefix(p.kind, r, p.sq, sk);
    const uint8_t* mask = p.kind == SoftmaxKind::kMasked ? p.mask + softmax_mask_row(p, r) * sk : nullptr;
    // Positions past the kept prefix are never read: -inf leaves the max and
    // the sum alone, kMaskedLogit joins them (aligned causal).
    const float tail = softmax_tail_counts(p.kind) ? kMaskedLogit : kNegInf;
    float m = kNegInf;
    for (int64_t j = 0; j < sk; ++j) {
      if (j >= kept) {
        z[j] = tail;
      } else if (mask && mask[j] != 0) {
        z[j] = kMaskedLogit;
      } else {
        z[j] = load_as_float<D>(p.input, row + j) * p.scale;
      }
      m = std::fmax(m, z[j]);  // fmax skips NaN; a NaN logit still makes the sum NaN
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < sk; ++j) sum += std::exp(z[j] - m);
    // Transformer Engine's rule for the masked softmax: a row whose max is the
    // masked logit (every position masked) is written as zeros.
    const bool zero_row = mask && m == kMaskedLogit;
    for (int64_t j = 0; j < sk; ++j) {
      const float y = (zero_row || j >= kept) ? 0.0f : std::exp(z[j] - m) / sum;
      store_from_float<D>(p.output, row + j, y);
    }
  }
}

// Safe in place (grad_input == grad_output): element j is read before it is written.
template <te_dtype D>
void softmax_bwd_typed(const SoftmaxBwdParams& p) {
  const int64_t sk = p.sk;
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t row = r * sk;
    const int64_t kept = softmax_kept_prefix(p.kind, r, p.sq, sk);
    float dot = 0.0f;  // sum of dy * y over the kept positions
    for (int64_t j = 0; j < kept; ++j) {
      dot += load_as_float<D>(p.grad_output, row + j) * load_as_float<D>(p.softmax_output, row + j);
    }
    for (int64_t j = 0; j < sk; ++j) {
      float dx = 0.0f;
      if (j < kept) {
        const float y = load_as_float<D>(p.softmax_output, row + j);
        dx = p.scale * (load_as_float<D>(p.grad_output, row + j) * y - y * dot);
      }
      store_from_float<D>(p.grad_input, row + j, dx);
    }
  }
}

}  // namespace

void softmax_fwd_cpu(const SoftmaxFwdParams& p) {
  dispatch_float_dtype(p.dtype, [&](auto tag) { softmax_fwd_typed<decltype(tag)::value>(p); });
}

void softmax_bwd_cpu(const SoftmaxBwdParams& p) {
  dispatch_float_dtype(p.dtype, [&](auto tag) { softmax_bwd_typed<decltype(tag)::value>(p); });
}

}  // namespace opente
