// Norm kernels for rows too long for the register kernels (hidden above
// kNormFwdMaxRegisterHidden forward, kNormBwdMaxRegisterHidden backward):
// correct for any length, element by element, not tuned.
//
// Forward: a block per row (the grid strides over rows); the row is cached in
// shared memory as fp32 when it fits, else re-read from L2 for each pass.
// Backward: a row kernel writes dx; a column kernel adds dz * xhat and dz over a
// fixed partition of the rows into the workspace ([min(rows, 256), 2, hidden]),
// which norm_bwd.cu's finalize kernel sums.
#include <algorithm>

#include "common/cuda_dependent_launch.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace {

using namespace norm_kernels;

constexpr int kThreads = 256;
// Row blocks of the backward's partial sums (<= kNormMaxRowBlocks): each adds a share
// of the rows for its columns, so more would only add partial rows to write and sum.
constexpr int64_t kBwdRowBlocks = 256;
// Rows up to this many elements are cached in shared memory (fp32): 192 KiB
// leaves room on Hopper's 227 KiB per block; longer rows are re-read from L2.
constexpr int64_t kMaxCachedHidden = 48 * 1024;

// Sum over the block, returned to every thread.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // the previous call's readers are done with `partial` and `total`
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x == 0) total = v;
  }
  __syncthreads();
  return total;
}

template <class In>
__global__ void __launch_bounds__(kThreads) norm_fwd_fallback_kernel(NormFwdParams p, bool cache_row) {
  extern __shared__ float row_cache[];  // [hidden] when cache_row
  const bool fp8 = p.out_dtype == TE_DTYPE_FLOAT8_E4M3 || p.out_dtype == TE_DTYPE_FLOAT8_E5M2;
  const bool layernorm = p.type == NormType::kLayerNorm;
  const int64_t hidden = p.hidden;
  const float scale = fp8 ? *p.scale : 1.0f;
  const float gamma_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  float local_amax = 0.0f;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const In* x = static_cast<const In*>(p.input) + r * hidden;  // [hidden]
    // each thread reads back only the columns it cached itself: no barrier needed
    auto value = [&](int64_t c) { return cache_row ? row_cache[c] : to_float(x[c]); };
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
      const float v = to_float(x[c]);
      if (cache_row) row_cache[c] = v;
      sum += v;
    }
    float mu = layernorm ? block_sum(sum) / float(hidden) : 0.0f;
    float sum_d = 0.0f, sum_sq = 0.0f;
    for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
      const float d = value(c) - mu;
      sum_d += d;
      sum_sq += d * d;
    }
    float variance = block_sum(sum_sq) / float(hidden);
    if (layernorm) {  // the corrected two-pass statistics of norm_fwd_kernel.cuh, for every dtype (an untuned path)
      const float correction = block_sum(sum_d) / float(hidden);
      mu += correction;
      variance -= correction * correction;
      if (variance < 0.0f) variance = 0.0f;  // rounding; a NaN row stays NaN (fmaxf would drop it)
    }
    const float rsigma = 1.0f / sqrtf(variance + p.eps);
    if (threadIdx.x == 0) {
      if (layernorm) p.mu[r] = mu;
      p.rsigma[r] = rsigma;
    }
    for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
      float y = (value(c) - mu) * rsigma * (load_param(p.gamma, c, p.w_dtype) + gamma_shift);
      if (layernorm) y += load_param(p.beta, c, p.w_dtype);
      local_amax = fmaxf(local_amax, fabsf(y));  // used for an FP8 y and where p.amax is set
      if (fp8) y *= scale;
      if (p.output) store_element_as(p.output, r * hidden + c, p.out_dtype, y);
      if (p.output_t) store_element_as(p.output_t, c * p.rows + r, p.out_dtype, y);
    }
  }
  // FP8: max|y| before scaling; a float y: of y as stored (as te_compute_amax of it)
  if (p.amax) block_amax_to_global(fp8 ? local_amax : rounded_as(p.out_dtype, local_amax), p.amax);
  if (fp8 && p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
}

// dx for each row (the grid strides over rows).
template <class In>
__global__ void __launch_bounds__(kThreads) norm_bwd_dx_fallback_kernel(NormBwdParams p) {
  const bool layernorm = p.type == NormType::kLayerNorm;
  const int64_t hidden = p.hidden;
  const float gamma_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const In* dz = static_cast<const In*>(p.dz) + r * hidden;  // [hidden]
    const In* x = static_cast<const In*>(p.x) + r * hidden;    // [hidden]
    const float mu = layernorm ? p.mu[r] : 0.0f, rsigma = p.rsigma[r];
    float sum_dyg = 0.0f, sum_dyg_xhat = 0.0f;
    for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
      const float dyg = to_float(dz[c]) * (load_param(p.gamma, c, p.w_dtype) + gamma_shift);
      sum_dyg += dyg;
      sum_dyg_xhat += dyg * (to_float(x[c]) - mu) * rsigma;
    }
    const float mean_dyg = layernorm ? block_sum(sum_dyg) / float(hidden) : 0.0f;
    const float mean_dyg_xhat = block_sum(sum_dyg_xhat) / float(hidden);
    In* dx = static_cast<In*>(p.dx) + r * hidden;
    for (int64_t c = threadIdx.x; c < hidden; c += kThreads) {
      const float dyg = to_float(dz[c]) * (load_param(p.gamma, c, p.w_dtype) + gamma_shift);
      const float xhat = (to_float(x[c]) - mu) * rsigma;
      dx[c] = from_float<In>(rsigma * (dyg - mean_dyg - xhat * mean_dyg_xhat));
    }
  }
}

// Partial column sums over row block blockIdx.y: partials[y][0][c] = sum dz * xhat,
// partials[y][1][c] = sum dz, over rows [y * rows_per_block, (y + 1) * rows_per_block).
// Those are rows / 256 terms in sequence: compensated, since plain fp32 lost up to
// 6x the error of PyTorch's tree reductions there (H200, rmsnorm fp16 1024x8192).
template <class In>
__global__ void __launch_bounds__(kThreads)
    norm_bwd_partials_fallback_kernel(NormBwdParams p, float* partials, int64_t rows_per_block) {
  allow_dependent_launch();  // the finalize may take SMs our last blocks leave free
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.hidden) return;
  const bool layernorm = p.type == NormType::kLayerNorm;
  const int64_t first = int64_t(blockIdx.y) * rows_per_block;
  const int64_t last = first + rows_per_block < p.rows ? first + rows_per_block : p.rows;
  KahanSum dgamma, dbeta;
  for (int64_t r = first; r < last; ++r) {
    const float dy = to_float(static_cast<const In*>(p.dz)[r * p.hidden + c]);
    const float mu = layernorm ? p.mu[r] : 0.0f;
    dgamma.add(dy * (to_float(static_cast<const In*>(p.x)[r * p.hidden + c]) - mu) * p.rsigma[r]);
    dbeta.add(dy);
  }
  float* out = partials + int64_t(blockIdx.y) * 2 * p.hidden;  // [2, hidden]
  out[c] = dgamma.sum;
  out[p.hidden + c] = dbeta.sum;
}

}  // namespace

void norm_fwd_fallback_cuda(const NormFwdParams& p, int device, void* stream) {
  const bool cache_row = p.hidden <= kMaxCachedHidden;
  const size_t smem = cache_row ? size_t(p.hidden) * sizeof(float) : 0;
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    const auto kernel = norm_fwd_fallback_kernel<typename CudaType<decltype(in_tag)::value>::type>;
    if (smem > 48 * 1024) {
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                 "cudaFuncSetAttribute(norm_fwd_fallback_kernel)");
    }
    int per_sm = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor(norm_fwd_fallback_kernel)");
    // at least one block: with zero rows it still writes an FP8 output's scale_inv
    const int64_t grid = std::max<int64_t>(
        1, std::min<int64_t>(p.rows, int64_t(std::max(per_sm, 1)) * multiprocessor_count(device)));
    kernel<<<unsigned(grid), kThreads, smem, as_stream(stream)>>>(p, cache_row);
    check_launch("norm_fwd_fallback_kernel");
  });
}

int64_t norm_bwd_fallback_cuda(const NormBwdParams& p, int device, float* partials, void* stream) {
  if (p.rows <= 0) return 0;  // the caller's finalize writes the zeros
  const cudaStream_t s = as_stream(stream);
  const int64_t row_blocks = std::min(p.rows, kBwdRowBlocks);
  const int64_t rows_per_block = (p.rows + row_blocks - 1) / row_blocks;
  const int64_t col_blocks = (p.hidden + kThreads - 1) / kThreads;
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    using In = typename CudaType<decltype(in_tag)::value>::type;
    const int64_t grid = std::min<int64_t>(p.rows, int64_t(multiprocessor_count(device)) * (2048 / kThreads));
    norm_bwd_dx_fallback_kernel<In><<<unsigned(grid), kThreads, 0, s>>>(p);
    check_launch("norm_bwd_dx_fallback_kernel");
    norm_bwd_partials_fallback_kernel<In><<<dim3(unsigned(col_blocks), unsigned(row_blocks)), kThreads, 0, s>>>(
        p, partials, rows_per_block);
    check_launch("norm_bwd_partials_fallback_kernel");
  });
  return row_blocks;
}

}  // namespace opente
