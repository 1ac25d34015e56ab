// LayerNorm and RMSNorm on the GPU.
//
// Forward: one block per row (the grid strides over rows). The row is read once
// into shared memory as fp32 when it fits, then the mean, the variance and the
// output come from there (two-pass statistics, as the CPU reference).
// Backward: a row kernel writes dx; a column kernel sums dz * xhat and dz over
// a fixed partition of the rows into the workspace ([row_blocks, 2, hidden]);
// a last kernel adds those partials in order and writes dgamma and dbeta. The
// fixed partition (norm_row_blocks) keeps the result independent of the GPU.
//
// The forward reads and writes rows in 8-element vectors when the hidden size
// and alignment allow; the backward is still element-wise, and the FP8
// column-wise output is written byte by byte. Vectorizing the backward and a
// tiled norm+cast+transpose are the next steps (benchmarks/RESULTS.md).
#include <algorithm>

#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_params.h"

namespace opente {
namespace {

constexpr int kThreads = 256;
// Rows up to this many elements are cached in shared memory (fp32): 192 KiB
// leaves room on Hopper's 227 KiB per block; longer rows are re-read from L2.
constexpr int64_t kMaxCachedHidden = 48 * 1024;

// gamma / beta in any float dtype: a uniform branch per element, cheaper than
// tripling the kernel instantiations.
__device__ __forceinline__ float load_param(const void* p, int64_t i, te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: return __half2float(static_cast<const __half*>(p)[i]);
    case TE_DTYPE_BFLOAT16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_param(void* p, int64_t i, te_dtype dtype, float v) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case TE_DTYPE_BFLOAT16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// Compensated (Kahan) summation: the column sums of dgamma / dbeta add up to
// `rows` terms in sequence, and plain fp32 accumulation lost up to 6x the error
// of PyTorch's tree reductions at 1024 rows (H200, rmsnorm fp16 1024x8192).
struct KahanSum {
  float sum = 0.0f, carry = 0.0f;
  __device__ __forceinline__ void add(float v) {
    const float y = v - carry;
    const float t = sum + y;
    carry = (t - sum) - y;
    sum = t;
  }
};

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

template <te_dtype Out>
__device__ __forceinline__ void store_output(void* base, int64_t i, float y) {
  if constexpr (Out == TE_DTYPE_FLOAT8_E4M3 || Out == TE_DTYPE_FLOAT8_E5M2) {
    static_cast<uint8_t*>(base)[i] = float_to_fp8<Out>(y);
  } else {
    using T = typename CudaType<Out>::type;
    static_cast<T*>(base)[i] = from_float<T>(y);
  }
}

// kW consecutive elements (kW = 8: one 16-byte load of 16-bit inputs, two of
// fp32; kW = 1: the general path for any hidden size or alignment).
template <int kW, class In>
__device__ __forceinline__ void load_values(const In* x, int64_t c, float (&v)[kW]) {
  if constexpr (kW == 8) {
    const Vec8<In> vec = *reinterpret_cast<const Vec8<In>*>(x + c);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float(vec.v[i]);
  } else {
    v[0] = to_float(x[c]);
  }
}

template <int kW>
__device__ __forceinline__ void cache_store(float* cache, int64_t c, const float (&v)[kW]) {
#pragma unroll
  for (int i = 0; i < kW; ++i) cache[c + i] = v[i];
}

template <int kW>
__device__ __forceinline__ void cache_load(const float* cache, int64_t c, float (&v)[kW]) {
#pragma unroll
  for (int i = 0; i < kW; ++i) v[i] = cache[c + i];
}

// y[0..kW) to output elements [i, i + kW): one vector store when kW = 8.
template <int kW, te_dtype Out>
__device__ __forceinline__ void store_outputs(void* base, int64_t i, const float (&y)[kW]) {
  if constexpr (kW == 8 && (Out == TE_DTYPE_FLOAT8_E4M3 || Out == TE_DTYPE_FLOAT8_E5M2)) {
    uint32_t words[2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      words[w] = uint32_t(float2_to_fp8x2<Out>(y[4 * w], y[4 * w + 1])) |
                 (uint32_t(float2_to_fp8x2<Out>(y[4 * w + 2], y[4 * w + 3])) << 16);
    }
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(base) + i) = make_uint2(words[0], words[1]);
  } else if constexpr (kW == 8) {
    using T = typename CudaType<Out>::type;
    Vec8<T> vec;
#pragma unroll
    for (int k = 0; k < 8; ++k) vec.v[k] = from_float<T>(y[k]);
    *reinterpret_cast<Vec8<T>*>(static_cast<T*>(base) + i) = vec;
  } else {
    store_output<Out>(base, i, y[0]);
  }
}

// kW = 8 needs hidden % 8 == 0, the input 16-byte and the row-wise output
// 16-byte (8-byte for FP8) aligned.
template <class In, te_dtype Out, int kW>
__global__ void __launch_bounds__(kThreads) norm_fwd_kernel(NormFwdParams p, bool cache_row) {
  extern __shared__ float row_cache[];  // [hidden] when cache_row
  constexpr bool kFp8 = Out == TE_DTYPE_FLOAT8_E4M3 || Out == TE_DTYPE_FLOAT8_E5M2;
  const bool layernorm = p.type == NormType::kLayerNorm;
  const int64_t hidden = p.hidden;
  const float scale = kFp8 ? *p.scale : 1.0f;
  const float gamma_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  float local_amax = 0.0f;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const In* x = static_cast<const In*>(p.input) + r * hidden;  // [hidden]
    // each thread reads back only the columns it cached itself: no barrier needed
    auto values = [&](int64_t c, float (&v)[kW]) {
      if (cache_row) {
        cache_load<kW>(row_cache, c, v);
      } else {
        load_values<kW>(x, c, v);
      }
    };
    float sum = 0.0f;
    for (int64_t c = int64_t(threadIdx.x) * kW; c < hidden; c += int64_t(kThreads) * kW) {
      float v[kW];
      load_values<kW>(x, c, v);
      if (cache_row) cache_store<kW>(row_cache, c, v);
#pragma unroll
      for (int i = 0; i < kW; ++i) sum += v[i];
    }
    const float mu = layernorm ? block_sum(sum) / float(hidden) : 0.0f;
    float sum_sq = 0.0f;
    for (int64_t c = int64_t(threadIdx.x) * kW; c < hidden; c += int64_t(kThreads) * kW) {
      float v[kW];
      values(c, v);
#pragma unroll
      for (int i = 0; i < kW; ++i) sum_sq += (v[i] - mu) * (v[i] - mu);
    }
    const float rsigma = 1.0f / sqrtf(block_sum(sum_sq) / float(hidden) + p.eps);
    if (threadIdx.x == 0) {
      if (layernorm) p.mu[r] = mu;
      p.rsigma[r] = rsigma;
    }
    for (int64_t c = int64_t(threadIdx.x) * kW; c < hidden; c += int64_t(kThreads) * kW) {
      float y[kW];
      values(c, y);
#pragma unroll
      for (int i = 0; i < kW; ++i) {
        y[i] = (y[i] - mu) * rsigma * (load_param(p.gamma, c + i, p.w_dtype) + gamma_shift);
        if (layernorm) y[i] += load_param(p.beta, c + i, p.w_dtype);
        if constexpr (kFp8) {
          local_amax = fmaxf(local_amax, fabsf(y[i]));
          y[i] *= scale;
        }
        if (p.output_t) store_output<Out>(p.output_t, (c + i) * p.rows + r, y[i]);
      }
      if (p.output) store_outputs<kW, Out>(p.output, r * hidden + c, y);
    }
  }
  if constexpr (kFp8) {
    if (p.amax) block_max_to_global<kThreads>(local_amax, p.amax);
    if (p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  }
}

// dx for each row (the grid strides over rows).
template <class In>
__global__ void __launch_bounds__(kThreads) norm_bwd_dx_kernel(NormBwdParams p) {
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

// Partial column sums over row block blockIdx.y: workspace[y][0][c] = sum dz * xhat,
// workspace[y][1][c] = sum dz, over rows [y * rows_per_block, (y + 1) * rows_per_block).
template <class In>
__global__ void __launch_bounds__(kThreads) norm_bwd_partials_kernel(NormBwdParams p, float* workspace,
                                                                     int64_t rows_per_block) {
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
  float* out = workspace + int64_t(blockIdx.y) * 2 * p.hidden;  // [2, hidden]
  out[c] = dgamma.sum;
  out[p.hidden + c] = dbeta.sum;
}

// dgamma[c] (and dbeta[c]) = the row blocks' partials added in order.
__global__ void __launch_bounds__(kThreads) norm_bwd_finalize_kernel(NormBwdParams p, const float* workspace,
                                                                     int64_t row_blocks) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.hidden) return;
  KahanSum dgamma, dbeta;
  for (int64_t b = 0; b < row_blocks; ++b) {
    dgamma.add(workspace[b * 2 * p.hidden + c]);
    dbeta.add(workspace[b * 2 * p.hidden + p.hidden + c]);
  }
  store_param(p.dgamma, c, p.w_dtype, dgamma.sum);
  if (p.dbeta) store_param(p.dbeta, c, p.w_dtype, dbeta.sum);
}

}  // namespace

void norm_fwd_cuda(const NormFwdParams& p, int device, void* /*workspace*/, size_t /*workspace_size*/, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  const bool cache_row = p.hidden <= kMaxCachedHidden;
  const size_t smem = cache_row ? size_t(p.hidden) * sizeof(float) : 0;
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) {
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                 "cudaFuncSetAttribute(norm_fwd_kernel)");
    }
    int per_sm = 0;
    cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    // at least one block: with zero rows it still writes an FP8 output's scale_inv
    const int64_t grid = std::max<int64_t>(
        1, std::min<int64_t>(p.rows, int64_t(std::max(per_sm, 1)) * multiprocessor_count(device)));
    kernel<<<grid, kThreads, smem, s>>>(p, cache_row);
    check_launch("norm_fwd_kernel");
  };
  const bool vectorized = p.hidden % 8 == 0 && is_aligned(p.input, 16) &&
                          is_aligned(p.output, is_fp8(p.out_dtype) ? 8 : 16);
  auto launch_for = [&](auto in_tag, auto out_tag) {
    using In = typename CudaType<decltype(in_tag)::value>::type;
    constexpr te_dtype kOut = decltype(out_tag)::value;
    if (vectorized) {
      launch(norm_fwd_kernel<In, kOut, 8>);
    } else {
      launch(norm_fwd_kernel<In, kOut, 1>);
    }
  };
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    if (is_fp8(p.out_dtype)) {
      dispatch_fp8_dtype(p.out_dtype, [&](auto out_tag) { launch_for(in_tag, out_tag); });
    } else {
      dispatch_float_dtype(p.out_dtype, [&](auto out_tag) { launch_for(in_tag, out_tag); });
    }
  });
}

void norm_bwd_cuda(const NormBwdParams& p, int device, void* workspace, size_t workspace_size, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  const int64_t row_blocks = norm_row_blocks(p.rows);
  OPENTE_CHECK_ARG(workspace_size >= norm_workspace_bytes(p.rows, p.hidden), "workspace must be at least ",
                   norm_workspace_bytes(p.rows, p.hidden), " bytes (te_norm_workspace_size), got ", workspace_size);
  auto* partials = static_cast<float*>(workspace);
  const int64_t col_blocks = (p.hidden + kThreads - 1) / kThreads;
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    using In = typename CudaType<decltype(in_tag)::value>::type;
    if (p.rows > 0) {
      const int64_t grid = std::min<int64_t>(p.rows, int64_t(multiprocessor_count(device)) * (2048 / kThreads));
      norm_bwd_dx_kernel<In><<<grid, kThreads, 0, s>>>(p);
      check_launch("norm_bwd_dx_kernel");
      const int64_t rows_per_block = (p.rows + row_blocks - 1) / row_blocks;
      norm_bwd_partials_kernel<In><<<dim3(unsigned(col_blocks), unsigned(row_blocks)), kThreads, 0, s>>>(
          p, partials, rows_per_block);
      check_launch("norm_bwd_partials_kernel");
    }
  });
  norm_bwd_finalize_kernel<<<unsigned(col_blocks), kThreads, 0, s>>>(p, partials, row_blocks);
  check_launch("norm_bwd_finalize_kernel");
}

}  // namespace opente
