// LayerNorm and RMSNorm forward on the GPU.
//
// A row group (norm_launch.h: a few lanes of a warp for short rows, one warp up to
// hidden 1024, several warps above) reads its row once into registers as 16-byte
// vectors, kept in the input dtype, then takes the mean and the variance from the
// registers (two passes, as the CPU reference) and writes y. Sums are shuffles
// inside a warp, plus one barrier of the group's warps alone for multi-warp rows.
// gamma and beta are read from global memory where y is formed: every row a
// thread visits uses the same columns, so after the first row they come from L1
// (the row loads are marked evict-first to keep them there). One wave of blocks;
// an FP8 output's amax costs one atomic a block.
//
// Statistics (LayerNorm of fp32 rows): the corrected two-pass algorithm. A mean
// summed in fp32 is off by about |mean| * 1e-7 (1e-4 at a mean of 1000, where
// torch's Welford mean is 1000x closer, and an fp32 y shows it); the second pass
// sums the deviations from it with their squares (one reduction of a pair), and
// their sum, of small numbers, moves mu onto the mean and takes its square off the
// variance. 16-bit rows cannot hold a spread that small next to a mean that large
// (their y's rounding is far coarser than the mean's error), and skip it: it made
// their forward 1-6% slower on an H100. A Welford / Chan merge in every shuffle
// step instead made the kernel 6-25% slower (both tried in the sixth session).
//
// What limits the speed is how many rows are in flight on an SM, which registers
// and shared memory bound. Hence the row held in its dtype, no shared memory for
// the weights (staged as fp32 they took 128 KiB a block at hidden 16384, one
// block an SM), and at most 64 registers (two 512-thread blocks an SM) for the
// vectorized kernels. On an H100 this took the layernorm forward at hidden 16384
// from 58% to 78% of copy bandwidth, and rmsnorm to 84-89% from hidden 4096 up
// (benchmarks/RESULTS.md).
//
// Rows that are not 16-byte vectors (hidden % 8 != 0, or a misaligned view) take
// the same kernel element by element, with the output dtype read at run time: one
// instantiation per input dtype for that rarer case. Rows too long for registers
// go to norm_fallback.cu.
#include <algorithm>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace {

using namespace norm_kernels;

// y to columns [col, col + 8) of output row `r` (and of the FP8 transposed output).
// Element-wise (!kVectorized): in the dtype p.out_dtype, kOut unused.
template <bool kVectorized, te_dtype kOut>
__device__ __forceinline__ void store_y(const NormFwdParams& p, int64_t r, int col, int hidden, bool fp8,
                                        const float (&y)[kChunk]) {
  if constexpr (!kVectorized) {
    if (p.output) {
      const int64_t row = r * p.hidden;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        if (col + i < hidden) store_element_as(p.output, row + col + i, p.out_dtype, y[i]);
      }
    }
  } else if (p.output) {
    using Out = typename Stored<kOut>::type;
    store_chunk<kVectorized, kOut>(static_cast<Out*>(p.output) + r * p.hidden, col, hidden, y);
  }
  if (fp8 && p.output_t) {  // [hidden, rows]: byte stores a row apart (a tiled transpose is still to come)
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (col + i < hidden) {
        const int64_t at = int64_t(col + i) * p.rows + r;
        if constexpr (!kVectorized) {
          store_element_as(p.output_t, at, p.out_dtype, y[i]);
        } else if constexpr (kIsFp8<kOut>) {
          store_element<kOut>(p.output_t, at, y[i]);
        }
      }
    }
  }
}

// kChunks: the shape's bucket (8-element chunks a thread holds). kVectorized: see
// RowShare; it also requires gamma and beta 16-byte aligned, and the row-wise
// output 16-byte (FP8: 8-byte) aligned. kOut: the output dtype of the vectorized
// instantiations; the element-wise ones read p.out_dtype instead (one
// instantiation per input dtype for that rarer case; the dispatch passes kIn as
// kOut there). The register cap of 64 (two blocks an SM) is for 16-bit inputs:
// an fp32 row takes twice the registers, and the element-wise kernels' bounds
// and dtype switches more; capped, both spilled (ptxas, sm_90a).
template <te_dtype kIn, te_dtype kOut, int kChunks, bool kLayerNorm, bool kVectorized>
__global__ void __launch_bounds__(kNormMaxBlockThreads, kVectorized && kIn != TE_DTYPE_FLOAT32 ? 2 : 1)
    norm_fwd_rows_kernel(NormFwdParams p, int threads_per_row, int rows_per_block) {
  using In = typename CudaType<kIn>::type;
  constexpr bool kMaybeFp8 = !kVectorized || kIsFp8<kOut>;
  const bool fp8 = kVectorized ? kIsFp8<kOut> : is_fp8_dtype(p.out_dtype);
  __shared__ float scratch[2 * kNormMaxBlockWarps];
  // LayerNorm of fp32 rows: the mean corrected in the second pass (see "Statistics")
  constexpr bool kCorrectMean = kLayerNorm && kIn == TE_DTYPE_FLOAT32;
  __shared__ float2 pair_scratch[kCorrectMean ? 2 * kNormMaxBlockWarps : 1];
  const RowGroup group(threads_per_row);
  const int hidden = int(p.hidden);  // <= kNormFwdMaxRegisterHidden
  const float gamma_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  RowReduction<float> reduction(scratch, group);
  RowReduction<float2> pair_reduction(pair_scratch, group);  // kCorrectMean's second pass
  const float scale = fp8 ? *p.scale : 1.0f;
  float amax = 0.0f;

  // The trip count is the block's, so every warp joins every shuffle; a group past
  // the last row computes on zeros and writes nothing.
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < p.rows;
       first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t r = first + group.index;
    const bool active = r < p.rows;
    RowShare<In, kChunks, kVectorized> x;
    x.template load</*kEvictFirst=*/true>(static_cast<const In*>(p.input) + r * p.hidden, group, active ? hidden : 0);

    float mu = 0.0f;  // RMSNorm: no centering
    if constexpr (kLayerNorm) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = x.at(j, i);
        sum += chunk_sum(v);
      }
      mu = reduction.sum(sum) / float(hidden);
    }
    // Second pass: the squared deviations from mu, and (kCorrectMean) the deviations
    // themselves, which correct mu (see "Statistics" at the top).
    float sum_d = 0.0f, sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int col = group.column(j);
      float dev[kChunk], sq[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const float d = x.at(j, i) - mu;
        dev[i] = in_row<kVectorized>(col, i, hidden) ? d : 0.0f;
        sq[i] = in_row<kVectorized>(col, i, hidden) ? d * d : 0.0f;
      }
      if constexpr (kCorrectMean) sum_d += chunk_sum(dev);
      sum_sq += chunk_sum(sq);
    }
    float variance;
    if constexpr (kCorrectMean) {
      const float2 sums = pair_reduction.sum(make_float2(sum_d, sum_sq));
      const float correction = sums.x / float(hidden);
      mu += correction;
      variance = sums.y / float(hidden) - correction * correction;
      if (variance < 0.0f) variance = 0.0f;  // rounding; a NaN row stays NaN (fmaxf would drop it)
    } else {
      variance = reduction.sum(sum_sq) / float(hidden);
    }
    const float rsigma = 1.0f / sqrtf(variance + p.eps);
    if (!active) continue;  // the group's last shuffle or barrier of this row is behind
    if (group.thread == 0) {
      if constexpr (kLayerNorm) p.mu[r] = mu;
      p.rsigma[r] = rsigma;
    }

    const void* gamma_row = opaque_per_row(p.gamma);
    const void* beta_row = kLayerNorm ? opaque_per_row(p.beta) : nullptr;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int col = group.column(j);
      float y[kChunk], gamma[kChunk], beta[kChunk];
      load_weight_chunk<kVectorized>(gamma_row, p.w_dtype, col, hidden, gamma_shift, gamma);
      if constexpr (kLayerNorm) load_weight_chunk<kVectorized>(beta_row, p.w_dtype, col, hidden, 0.0f, beta);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        y[i] = (x.at(j, i) - mu) * rsigma * gamma[i];  // the CPU reference's order: xhat, then * g
        if constexpr (kLayerNorm) y[i] += beta[i];
        if constexpr (kMaybeFp8) {
          if (fp8) {
            // past the row y is 0 (or NaN where rsigma is inf), which fmaxf ignores
            amax = fmaxf(amax, fabsf(y[i]));
            y[i] *= scale;
          }
        }
      }
      store_y<kVectorized, kOut>(p, r, col, hidden, fp8, y);
    }
  }

  if constexpr (kMaybeFp8) {
    if (fp8) {
      if (p.amax) block_amax_to_global(amax, p.amax);
      if (p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
    }
  }
}

}  // namespace

void norm_fwd_cuda(const NormFwdParams& p, int device, void* /*workspace: unused*/, size_t /*workspace_size*/,
                   void* stream) {
  DeviceGuard guard(device);
  const NormRowShape shape = norm_fwd_row_shape(p.hidden);
  if (!shape.in_registers()) {
    norm_fwd_fallback_cuda(p, device, stream);
    return;
  }
  auto launch = [&](auto kernel) {
    // at least one block even for zero rows: it still writes an FP8 output's scale_inv
    const int64_t grid = norm_resident_grid(reinterpret_cast<const void*>(kernel), shape, 0, p.rows, device);
    kernel<<<unsigned(grid), unsigned(shape.block_threads()), 0, as_stream(stream)>>>(
        p, shape.threads_per_row, shape.rows_per_block);
    check_launch("norm_fwd_rows_kernel");
  };
  // the one switch from the shape's bucket and the norm to template arguments
  auto launch_bucket = [&](auto in_tag, auto out_tag, auto vectorized_tag) {
    constexpr te_dtype kIn = decltype(in_tag)::value, kOut = decltype(out_tag)::value;
    constexpr bool kVec = decltype(vectorized_tag)::value;
    const bool layernorm = p.type == NormType::kLayerNorm;
    if (shape.chunks == kNormFwdSmallChunks) {
      if (layernorm) {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdSmallChunks, true, kVec>);
      } else {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdSmallChunks, false, kVec>);
      }
    } else {
      if (layernorm) {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdChunks, true, kVec>);
      } else {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdChunks, false, kVec>);
      }
    }
  };
  const bool vectorized = p.hidden % kChunk == 0 && is_aligned(p.input, 16) && is_aligned(p.gamma, 16) &&
                          (p.beta == nullptr || is_aligned(p.beta, 16)) &&
                          (p.output == nullptr || is_aligned(p.output, is_fp8(p.out_dtype) ? 8 : 16));
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    if (vectorized) {
      dispatch_any_float_dtype(p.out_dtype, [&](auto out_tag) {
        launch_bucket(in_tag, out_tag, std::true_type{});
      });
    } else {
      launch_bucket(in_tag, in_tag, std::false_type{});
    }
  });
}

}  // namespace opente
