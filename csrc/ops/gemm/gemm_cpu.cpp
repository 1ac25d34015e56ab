// CPU reference of the GEMM: fp32 accumulation, then the epilogue in the order
// cuBLASLt applies it, then one rounding to each output's dtype.
//
//   t = alpha * (scale_inv_A * scale_inv_B) * sum_k op_B(B)[m, k] op_A(A)[k, n]  +  beta * D_old
//   BIAS            t += bias[n]
//   GELU_AUX        aux = t;            D = gelu(t)
//   GELU_AUX_BIAS   t += bias[n]; aux = t; D = gelu(t)
//   DGELU           D = t * gelu'(aux)
//   DGELU_BGRAD     D = t * gelu'(aux);  bias_grad[n] = sum over m of that D (fp32, before rounding)
//   BGRAD           D = t;               bias_grad[m] = sum over k of op_B(B)[m, k] (dequantized)
//   FP8 D           amax = max|D| (NaN skipped), D = fp8(D * scale)
//
// FP8 operands are multiplied as their raw FP8 values and the fp32 sum is scaled
// afterwards, as cuBLASLt does. The split-accumulator option changes nothing
// here: this loop always accumulates in fp32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "common/host_elements.h"
#include "ops/gemm/gelu.h"
#include "ops/gemm/gemm_params.h"

namespace opente {

namespace {

// out[0, count) = base[offset, offset + count) as fp32.
void load_span(const void* base, te_dtype dtype, int64_t offset, int64_t count, float* out) {
  dispatch_any_float_dtype(dtype, [&](auto tag) {
    constexpr te_dtype kD = decltype(tag)::value;
    for (int64_t i = 0; i < count; ++i) out[i] = load_as_float<kD>(base, offset + i);
  });
}

// base[offset, offset + count) = values, rounded to dtype (nearest even).
void store_span(void* base, te_dtype dtype, int64_t offset, int64_t count, const float* values) {
  dispatch_any_float_dtype(dtype, [&](auto tag) {
    constexpr te_dtype kD = decltype(tag)::value;
    for (int64_t i = 0; i < count; ++i) store_from_float<kD>(base, offset + i, values[i]);
  });
}

// The [rows, cols] matrix an operand stands for, as raw fp32 values (FP8 not yet
// scaled). The storage is [rows, cols], or [cols, rows] when `storage_transposed`.
// std::vector scratch is fine in the reference; the CUDA path allocates nothing.
std::vector<float> load_matrix(const GemmOperand& op, int64_t rows, int64_t cols, bool storage_transposed) {
  std::vector<float> out(size_t(rows * cols));
  if (!storage_transposed) {
    load_span(op.data, op.dtype, 0, rows * cols, out.data());
    return out;
  }
  dispatch_any_float_dtype(op.dtype, [&](auto tag) {
    constexpr te_dtype kD = decltype(tag)::value;
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) out[size_t(r * cols + c)] = load_as_float<kD>(op.data, c * rows + r);
  });
  return out;
}

float dequant_factor(const GemmOperand& op) { return is_fp8(op.dtype) ? *op.scale_inv : 1.0f; }

// Rows [0, kRowBlock) of the product of x ([kRowBlock, k] row-major, rows k apart) and
// y ([k, n] row-major) into acc ([kRowBlock, n]), each element summed in order of kk
// from 0, one fp32 product and add at a time: the reference's order. The inner loop
// runs along n over independent sums, which the compiler vectorizes, and each row of y
// is read once for the block's rows. (A dot product a element, one chain of dependent
// adds, was 8x slower for an FP8 te.Linear step on 2 CPU cores.)
constexpr int64_t kRowBlock = 4;

void rows_times_matrix(const float* x, int64_t rows, const float* y, int64_t k, int64_t n, float* acc) {
  for (int64_t j = 0; j < rows * n; ++j) acc[j] = 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* y_row = y + kk * n;
    if (rows == kRowBlock) {
      const float x0 = x[kk], x1 = x[k + kk], x2 = x[2 * k + kk], x3 = x[3 * k + kk];
      float *a0 = acc, *a1 = acc + n, *a2 = acc + 2 * n, *a3 = acc + 3 * n;
      for (int64_t j = 0; j < n; ++j) {
        const float v = y_row[j];
        a0[j] += x0 * v;
        a1[j] += x1 * v;
        a2[j] += x2 * v;
        a3[j] += x3 * v;
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const float xr = x[r * k + kk];
        float* ar = acc + r * n;
        for (int64_t j = 0; j < n; ++j) ar[j] += xr * y_row[j];
      }
    }
  }
}

}  // namespace

void gemm_cpu(const GemmParams& p) {
  const int64_t m = p.m, n = p.n, k = p.k;
  const te_gemm_epilogue epi = p.epilogue;
  const bool empty = m == 0 || n == 0;

  // op_B(B) [m, k]: needed for the product, and by BGRAD even when n == 0.
  std::vector<float> b;
  const bool need_b = k > 0 && m > 0 && (!empty || epi == TE_GEMM_EPILOGUE_BGRAD);
  if (need_b) {
    if (p.b.data == nullptr) {
      fail(TE_ERROR_INTERNAL, concat("gemm_cpu: B has no data to read (m=", m, ", n=", n, ", k=", k, ", epilogue ",
                                     int(epi), "); te_gemm did not resolve B's storage"));
    }
    b = load_matrix(p.b, m, k, /*storage_transposed=*/p.b.trans);  // B stored [k, m] when trans
  }

  if (epi == TE_GEMM_EPILOGUE_BGRAD) {
    std::vector<float> bias_grad(size_t(m), 0.0f);  // [m]
    if (k > 0) {
      const float factor = dequant_factor(p.b);
      for (int64_t i = 0; i < m; ++i) {
        float sum = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) sum += b[size_t(i * k + kk)];
        bias_grad[size_t(i)] = sum * factor;
      }
    }
    store_span(p.bias_grad, p.bias_grad_dtype, 0, m, bias_grad.data());
  }

  if (empty) {
    // sums over no rows, maxima over no elements
    if (epi == TE_GEMM_EPILOGUE_DGELU_BGRAD) {
      const std::vector<float> zeros(size_t(n), 0.0f);
      store_span(p.bias_grad, p.bias_grad_dtype, 0, n, zeros.data());
    }
    if (p.d_amax) *p.d_amax = 0.0f;
    return;
  }

  // op_A(A) [k, n]: each block of output rows is op_B(B)'s rows times it (rows_times_matrix).
  std::vector<float> a;
  if (k > 0) a = load_matrix(p.a, k, n, /*storage_transposed=*/p.a.trans);  // A stored [n, k] when trans
  const float product_scale = k > 0 ? p.alpha * (dequant_factor(p.a) * dequant_factor(p.b)) : p.alpha;

  std::vector<float> bias(epilogue_has_bias(epi) ? size_t(n) : 0);  // [n]
  if (epilogue_has_bias(epi)) load_span(p.bias, p.bias_dtype, 0, n, bias.data());
  std::vector<float> bias_grad(size_t(n), 0.0f);  // [n], DGELU_BGRAD
  const bool fp8_out = is_fp8(p.d_dtype);
  const float d_scale = fp8_out ? *p.d_scale : 1.0f;
  float amax = 0.0f;

  std::vector<float> block(size_t(kRowBlock * n));  // kRowBlock output rows' sums [kRowBlock, n]
  std::vector<float> t(static_cast<size_t>(n)), row(static_cast<size_t>(n));  // one output row [n]
  for (int64_t i = 0; i < m; ++i) {
    if (i % kRowBlock == 0) {
      const int64_t rows = std::min(kRowBlock, m - i);
      rows_times_matrix(k > 0 ? &b[size_t(i * k)] : nullptr, rows, a.data(), k, n, block.data());
    }
    const float* sums = &block[size_t((i % kRowBlock) * n)];
    for (int64_t j = 0; j < n; ++j) t[size_t(j)] = product_scale * sums[j];
    if (p.beta != 0.0f) {
      load_span(p.d, p.d_dtype, i * n, n, row.data());
      for (int64_t j = 0; j < n; ++j) t[size_t(j)] += p.beta * row[size_t(j)];
    }
    switch (epi) {
      case TE_GEMM_EPILOGUE_NONE:
      case TE_GEMM_EPILOGUE_BGRAD:
        break;
      case TE_GEMM_EPILOGUE_BIAS:
        for (int64_t j = 0; j < n; ++j) t[size_t(j)] += bias[size_t(j)];
        break;
      case TE_GEMM_EPILOGUE_GELU_AUX:
      case TE_GEMM_EPILOGUE_GELU_AUX_BIAS:
        if (epi == TE_GEMM_EPILOGUE_GELU_AUX_BIAS) {
          for (int64_t j = 0; j < n; ++j) t[size_t(j)] += bias[size_t(j)];
        }
        store_span(p.aux, p.aux_dtype, i * n, n, t.data());
        for (int64_t j = 0; j < n; ++j) t[size_t(j)] = gelu_tanh(t[size_t(j)]);
        break;
      case TE_GEMM_EPILOGUE_DGELU:
      case TE_GEMM_EPILOGUE_DGELU_BGRAD:
        load_span(p.aux, p.aux_dtype, i * n, n, row.data());
        for (int64_t j = 0; j < n; ++j) t[size_t(j)] *= gelu_tanh_grad(row[size_t(j)]);
        if (epi == TE_GEMM_EPILOGUE_DGELU_BGRAD) {
          for (int64_t j = 0; j < n; ++j) bias_grad[size_t(j)] += t[size_t(j)];
        }
        break;
    }
    if (fp8_out) {
      for (int64_t j = 0; j < n; ++j) {
        amax = std::fmax(amax, std::fabs(t[size_t(j)]));  // fmax skips NaN
        t[size_t(j)] *= d_scale;
      }
    }
    store_span(p.d, p.d_dtype, i * n, n, t.data());
  }

  if (epi == TE_GEMM_EPILOGUE_DGELU_BGRAD) store_span(p.bias_grad, p.bias_grad_dtype, 0, n, bias_grad.data());
  if (p.d_amax) *p.d_amax = amax;
}

}  // namespace opente
