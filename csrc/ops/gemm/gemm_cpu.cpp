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
// here: this loop always accumulates in fp32. Each sum runs over k from 0, one
// product and one add at a time; large GEMMs split their output columns among
// threads, which leaves every element's arithmetic as it is (the results are the
// same bits on any number of cores).
#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
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

// Rows [0, rows) (rows <= kRowBlock) of the product of x ([rows, k] row-major, rows k
// apart) and a slice of y (row kk at y + kk * y_stride, `width` columns) into acc
// ([rows, width]), each element summed in order of kk from 0, one fp32 product and add
// at a time: the reference's order. The inner loop runs along the columns over
// independent sums, which the compiler vectorizes, and each row of y is read once for
// the block's rows. (A dot product a element, one chain of dependent adds, was 4.5x
// slower for an FP8 te.Linear step on 2 CPU cores.)
constexpr int64_t kRowBlock = 4;

void rows_times_matrix(const float* x, int64_t rows, const float* y, int64_t y_stride, int64_t k, int64_t width,
                       float* acc) {
  for (int64_t j = 0; j < rows * width; ++j) acc[j] = 0.0f;
  for (int64_t kk = 0; kk < k; ++kk) {
    const float* y_row = y + kk * y_stride;
    if (rows == kRowBlock) {
      const float x0 = x[kk], x1 = x[k + kk], x2 = x[2 * k + kk], x3 = x[3 * k + kk];
      float *a0 = acc, *a1 = acc + width, *a2 = acc + 2 * width, *a3 = acc + 3 * width;
      for (int64_t j = 0; j < width; ++j) {
        const float v = y_row[j];
        a0[j] += x0 * v;
        a1[j] += x1 * v;
        a2[j] += x2 * v;
        a3[j] += x3 * v;
      }
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const float xr = x[r * k + kk];
        float* ar = acc + r * width;
        for (int64_t j = 0; j < width; ++j) ar[j] += xr * y_row[j];
      }
    }
  }
}

// Columns a thread takes at least, and multiply-adds a GEMM needs before it is split
// over threads (a thread's start costs tens of microseconds).
constexpr int64_t kMinColumnsPerThread = 64;
constexpr int64_t kMinThreadedWork = int64_t(1) << 22;

// Runs column(j0, j1) over [0, n) split among threads, each taking whole columns, so
// every output element is computed by one thread, in the same order as alone: the
// result does not depend on the split. Exceptions are rethrown here.
template <class F>
void for_column_slices(int64_t n, int64_t work, F&& column) {
  const int64_t hardware = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()));
  const int64_t threads =
      work < kMinThreadedWork ? 1 : std::max<int64_t>(1, std::min(hardware, n / kMinColumnsPerThread));
  if (threads == 1) {
    column(int64_t(0), n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  const int64_t per = (n + threads - 1) / threads;
  auto slice = [&](int64_t t) {
    const int64_t j0 = t * per, j1 = std::min(n, j0 + per);
    if (j0 >= j1) return;
    try {
      column(j0, j1);
    } catch (...) {
      errors[size_t(t)] = std::current_exception();
    }
  };
  // Slice 0 on this thread; a thread that cannot be started leaves its slice (and the
  // later ones) to this thread too, after the others were joined.
  std::vector<std::thread> pool;
  int64_t started = 1;
  try {
    for (; started < threads; ++started) pool.emplace_back(slice, started);
  } catch (const std::system_error&) {
  }
  slice(0);
  for (std::thread& th : pool) th.join();
  for (int64_t t = started; t < threads; ++t) slice(t);
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
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

  // Output columns [j0, j1) of every row: the product, then the epilogue; returns their
  // max|D| (FP8 D). A column's bias gradient is summed over the rows in order.
  auto columns = [&](int64_t j0, int64_t j1) -> float {
    const int64_t w = j1 - j0;
    std::vector<float> block(size_t(kRowBlock * w));  // kRowBlock output rows' sums [kRowBlock, w]
    std::vector<float> t(static_cast<size_t>(w)), row(static_cast<size_t>(w));  // one output row's columns
    float* grad = bias_grad.data() + j0;
    float part_amax = 0.0f;
    for (int64_t i = 0; i < m; ++i) {
      if (i % kRowBlock == 0) {
        const int64_t rows = std::min(kRowBlock, m - i);
        rows_times_matrix(k > 0 ? &b[size_t(i * k)] : nullptr, rows, k > 0 ? a.data() + j0 : nullptr, n, k, w,
                          block.data());
      }
      const float* sums = &block[size_t((i % kRowBlock) * w)];
      for (int64_t j = 0; j < w; ++j) t[size_t(j)] = product_scale * sums[j];
      const int64_t at = i * n + j0;  // this row's first column in D (and aux)
      if (p.beta != 0.0f) {
        load_span(p.d, p.d_dtype, at, w, row.data());
        for (int64_t j = 0; j < w; ++j) t[size_t(j)] += p.beta * row[size_t(j)];
      }
      switch (epi) {
        case TE_GEMM_EPILOGUE_NONE:
        case TE_GEMM_EPILOGUE_BGRAD:
          break;
        case TE_GEMM_EPILOGUE_BIAS:
          for (int64_t j = 0; j < w; ++j) t[size_t(j)] += bias[size_t(j0 + j)];
          break;
        case TE_GEMM_EPILOGUE_GELU_AUX:
        case TE_GEMM_EPILOGUE_GELU_AUX_BIAS:
          if (epi == TE_GEMM_EPILOGUE_GELU_AUX_BIAS) {
            for (int64_t j = 0; j < w; ++j) t[size_t(j)] += bias[size_t(j0 + j)];
          }
          store_span(p.aux, p.aux_dtype, at, w, t.data());
          for (int64_t j = 0; j < w; ++j) t[size_t(j)] = gelu_tanh(t[size_t(j)]);
          break;
        case TE_GEMM_EPILOGUE_DGELU:
        case TE_GEMM_EPILOGUE_DGELU_BGRAD:
          load_span(p.aux, p.aux_dtype, at, w, row.data());
          for (int64_t j = 0; j < w; ++j) t[size_t(j)] *= gelu_tanh_grad(row[size_t(j)]);
          if (epi == TE_GEMM_EPILOGUE_DGELU_BGRAD) {
            for (int64_t j = 0; j < w; ++j) grad[j] += t[size_t(j)];
          }
          break;
      }
      if (fp8_out) {
        for (int64_t j = 0; j < w; ++j) {
          part_amax = std::fmax(part_amax, std::fabs(t[size_t(j)]));  // fmax skips NaN
          t[size_t(j)] *= d_scale;
        }
      }
      store_span(p.d, p.d_dtype, at, w, t.data());
    }
    return part_amax;
  };
  // Each slice's max joins under a lock; max does not depend on the order.
  std::mutex amax_mutex;
  for_column_slices(n, m * n * std::max<int64_t>(k, 1), [&](int64_t j0, int64_t j1) {
    const float part = columns(j0, j1);
    std::lock_guard<std::mutex> lock(amax_mutex);
    amax = std::fmax(amax, part);
  });

  if (epi == TE_GEMM_EPILOGUE_DGELU_BGRAD) store_span(p.bias_grad, p.bias_grad_dtype, 0, n, bias_grad.data());
  if (p.d_amax) *p.d_amax = amax;
}

}  // namespace opente
