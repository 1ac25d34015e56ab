// LayerNorm and RMSNorm forward on the GPU.
//
// A row group (norm_launch.h: a few lanes of a warp for short rows, one warp up to
// hidden 1024, several warps above) reads its row once into registers as 16-byte
// vectors, kept in the input dtype, then takes the mean and the variance from the
// registers (see "Statistics") and writes y. Sums are shuffles inside a warp, plus
// one barrier of the group's warps alone for multi-warp rows.
// gamma and beta are read from global memory where y is formed: every row a
// thread visits uses the same columns, so after the first row they come from L1
// (the row loads are marked evict-first to keep them there). A block per row
// group (a block that has finished frees its SM for the next; striding blocks over
// one wave was 2-5% slower), except where the kernel takes an amax (an FP8 y, or a
// float y's), which costs a reduction and an atomic per block (per row group for rows
// of several warps): there at most four waves (two for rows shorter than a warp), and
// at least two row groups a block (see norm_fwd_cuda).
//
// Statistics (LayerNorm): one reduction of a pair, the sums of d = x - pivot and
// of d^2, where the pivot is the mean of the row's first 8 elements (a shuffle from
// the group's first lane, or a broadcast load for rows of several warps; past the
// row's end the elements count as 0): mu = pivot + sum(d) / n, variance = sum(d^2) / n - (sum(d) / n)^2. The two
// passes of the CPU reference (a mean, then the squares about it) took two
// reductions a row, and rows of several warps wait at a barrier in each. The
// shift keeps the sums small where the row's mean is far from zero: a mean summed
// in fp32 is off by about |mean| * 1e-7 (1e-4 at a mean of 1000 with a spread of 1,
// 1000x torch's Welford mean). Where the pivot lies more than a standard deviation
// from the mean (an outlier among the first elements; about 0.5% of Gaussian rows)
// the subtraction would cost the variance its low bits, and those rows sum the
// squares about mu again in a second reduction. Tried instead (sixth session): a
// Welford / Chan merge in every shuffle step (6-25% slower on an H100), and the two
// passes with a correction of the mean by the deviations' sum (1-6% slower).
//
// What limits the speed is how many rows are in flight on an SM, which registers
// and shared memory bound. Hence the row held in its dtype, no shared memory for
// the weights (staged as fp32 they took 128 KiB a block at hidden 16384, one
// block an SM), and at most 64 registers (two 512-thread blocks an SM) for the
// vectorized kernels. On an H100 this took the layernorm forward at hidden 16384
// from 58% to 78% of copy bandwidth, and rmsnorm to 84-89% from hidden 4096 up
// (benchmarks/RESULTS.md). Past that, an ncu profile on an H200 (seventh session)
// found the layernorm forward bound by instruction issue (a warp instruction issued
// in 71-76% of cycles, DRAM at 53%): the weights' dtype switch and zero_centered_gamma
// now leave the chunk loop (see "y" below), bf16 converts in one instruction
// (element_as_float), and padded chunks skip their sums; 21-29% fewer instructions,
// 15-26% faster there.
//
// Rows that are not 16-byte vectors (hidden % 8 != 0, or a misaligned view) take
// the same kernel element by element, with the output dtype read at run time: one
// instantiation per input dtype for that rarer case. Rows too long for registers
// go to norm_fallback.cu.
#include <algorithm>
#include <type_traits>

#include "common/cuda_dependent_launch.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"
#include "ops/transpose/transpose_params.h"

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
  if (fp8 && p.output_t) {  // [hidden, rows], a column-wise copy alone: byte stores a row apart (see norm_fwd_cuda)
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

// The mean of the row's first min(8, hidden) elements: the shift of LayerNorm's
// sums (see "Statistics") for rows of several warps. Every thread of the group reads
// the same bytes (one broadcast load, from L1 or L2: the group's first thread is
// loading them too).
template <class In, bool kVectorized>
__device__ __forceinline__ float row_pivot(const In* row, int hidden) {
  if constexpr (kVectorized) {  // hidden % 8 == 0 and the row 16-byte aligned
    const Vec8<In> head = *reinterpret_cast<const Vec8<In>*>(row);
    float v[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = to_float(head.v[i]);
    return chunk_sum(v) * (1.0f / kChunk);
  } else {
    const int n = hidden < kChunk ? hidden : kChunk;
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += to_float(row[i]);
    return sum / float(n);
  }
}

// kChunks: the shape's bucket (8-element chunks a thread holds). kVectorized: see
// RowShare; it also requires gamma and beta 16-byte aligned, and the row-wise
// output 16-byte (FP8: 8-byte) aligned. kOut: the output dtype of the vectorized
// instantiations; the element-wise ones read p.out_dtype instead (one
// instantiation per input dtype for that rarer case; the dispatch passes kIn as
// kOut there). kFloatAmax: a vectorized float y in the input's dtype that also
// raises p.amax to max|y| as stored (a current-scaling cast of y follows from it:
// module_ops.FusedAmax); its own instantiations, so the plain float-y kernels carry
// no amax instructions (their PTX is the same as before it existed); the element-wise
// kernels test p.amax at run time. The register cap of 64 (two blocks an SM) is for
// 16-bit inputs: an fp32 row takes twice the registers, and the element-wise kernels'
// bounds and dtype switches more; capped, both spilled (ptxas, sm_90a).
template <te_dtype kIn, te_dtype kOut, int kChunks, bool kLayerNorm, bool kVectorized, bool kFloatAmax = false>
__global__ void __launch_bounds__(kNormMaxBlockThreads, kVectorized && kIn != TE_DTYPE_FLOAT32 ? 2 : 1)
    norm_fwd_rows_kernel(NormFwdParams p, int threads_per_row, int rows_per_block) {
  using In = typename CudaType<kIn>::type;
  constexpr bool kMaybeFp8 = !kVectorized || kIsFp8<kOut>;
  constexpr bool kMaybeAmax = kMaybeFp8 || kFloatAmax;
  static_assert(!kFloatAmax || (kVectorized && kOut == kIn), "kFloatAmax: a vectorized y in the input's dtype");
  if constexpr (kMaybeFp8) allow_dependent_launch();  // the transposed copy's kernel (norm_fwd_cuda)
  const bool fp8 = kVectorized ? kIsFp8<kOut> : is_fp8_dtype(p.out_dtype);
  // max|y| is taken for an FP8 y (before scaling) and where a float y's amax is asked for
  const bool takes_amax = kVectorized ? kIsFp8<kOut> || kFloatAmax : fp8 || p.amax != nullptr;
  __shared__ float scratch[2 * kNormMaxBlockWarps];
  __shared__ float2 pair_scratch[kLayerNorm ? 2 * kNormMaxBlockWarps : 1];
  const RowGroup group(threads_per_row);
  const int hidden = int(p.hidden);  // <= kNormFwdMaxRegisterHidden
  RowReduction<float> reduction(scratch, group);
  RowReduction<float2> pair_reduction(pair_scratch, group);  // LayerNorm's statistics
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

    float mu = 0.0f, variance;  // RMSNorm: no centering, the mean square
    if constexpr (kLayerNorm) {
      // One reduction of the deviations from the pivot and their squares (see "Statistics").
      float pivot;
      if (group.threads <= 32) {
        // The group's first thread holds the row's first chunk: a shuffle, not a load,
        // for rows of one warp or less (whose critical path the load lengthened by 1-2%).
        float head[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) head[i] = x.at(0, i);
        pivot = __shfl_sync(0xffffffffu, chunk_sum(head) * (1.0f / kChunk), 0, group.threads);
      } else {
        const In* row = static_cast<const In*>(p.input) + r * p.hidden;
        pivot = active ? row_pivot<In, kVectorized>(row, hidden) : 0.0f;
      }
      float sum_d = 0.0f, sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int col = group.column(j);
        float dev[kChunk], sq[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          const float d = x.at(j, i) - pivot;
          // vectorized: a chunk is all in the row or all past it, tested once below
          dev[i] = kVectorized || in_row<kVectorized>(col, i, hidden) ? d : 0.0f;
          sq[i] = dev[i] * dev[i];
        }
        if (!kVectorized || col < hidden) {
          sum_d += chunk_sum(dev);
          sum_sq += chunk_sum(sq);
        }
      }
      const float2 sums = pair_reduction.sum(make_float2(sum_d, sum_sq));
      const float shift = sums.x / float(hidden);  // mean - pivot
      mu = pivot + shift;
      variance = sums.y / float(hidden) - shift * shift;
      // A pivot more than a standard deviation off the mean (an outlier among the row's
      // first elements) would cost the variance its low bits: such rows sum the squares
      // about mu again. Warp-uniform, as the sum's full-warp shuffles need (rows of up to
      // 512 elements share a warp); every thread of a multi-warp group agrees already.
      const bool far = shift * shift > variance;
      if (__any_sync(0xffffffffu, far)) {
        float again = 0.0f;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const int col = group.column(j);
          float sq[kChunk];
#pragma unroll
          for (int i = 0; i < kChunk; ++i) {
            const float d = x.at(j, i) - mu;
            sq[i] = in_row<kVectorized>(col, i, hidden) ? d * d : 0.0f;
          }
          again += chunk_sum(sq);
        }
        again = reduction.sum(again) / float(hidden);
        if (far) variance = again;
      }
      if (variance < 0.0f) variance = 0.0f;  // rounding; a NaN row stays NaN (fmaxf would drop it)
    } else {
      float sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        float sq[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) sq[i] = x.at(j, i) * x.at(j, i);  // 0 past the row
        sum_sq += chunk_sum(sq);
      }
      variance = reduction.sum(sum_sq) / float(hidden);
    }
    const float rsigma = 1.0f / sqrtf(variance + p.eps);
    x.convert_again_later();
    if (!active) continue;  // the group's last shuffle or barrier of this row is behind
    if (group.thread == 0) {
      if constexpr (kLayerNorm) p.mu[r] = mu;
      p.rsigma[r] = rsigma;
    }

    // y. Vectorized rows take the weights' dtype and zero_centered_gamma as template
    // arguments: one switch a row rather than one a chunk, and no "+ 0" where gamma
    // is not shifted (the compiler must keep x + 0.0f: it turns -0 into +0). An ncu
    // profile on an H200 had this kernel issuing instructions in 76% of its cycles.
    // Element-wise rows read the weights' dtype at run time (their six typed copies
    // spilled hundreds of bytes).
    auto write_y = [&](const auto& weights) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int col = group.column(j);
        if (kVectorized && col >= hidden) continue;  // a chunk past the row: nothing to write
        float y[kChunk], gamma[kChunk];
        [[maybe_unused]] float beta[kChunk];  // LayerNorm's
        weights.load_gamma(col, hidden, gamma);
        if constexpr (kLayerNorm) weights.load_beta(col, hidden, beta);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          y[i] = (x.at(j, i) - mu) * rsigma * gamma[i];  // the CPU reference's order: xhat, then * g
          if constexpr (kLayerNorm) y[i] += beta[i];
          // past the row (element-wise kernels) y is 0, or NaN where rsigma is inf, which
          // fmaxf ignores
          if constexpr (kMaybeAmax) {
            if (takes_amax) amax = fmaxf(amax, fabsf(y[i]));
          }
          if constexpr (kMaybeFp8) {
            if (fp8) y[i] *= scale;
          }
        }
        store_y<kVectorized, kOut>(p, r, col, hidden, fp8, y);
      }
    };
    if constexpr (kVectorized) {
      with_weight_dtype(p.w_dtype, [&](auto weight_tag) {
        using W = typename CudaType<decltype(weight_tag)::value>::type;
        if (p.zero_centered_gamma) {
          write_y(TypedWeights<W, true>(p.gamma, p.beta));
        } else {
          write_y(TypedWeights<W, false>(p.gamma, p.beta));
        }
      });
    } else {
      write_y(RuntimeWeights(p.gamma, p.beta, p.w_dtype, p.zero_centered_gamma));
    }
  }

  if constexpr (kMaybeAmax) {
    // FP8: max|y| before scaling. A float y: of y as stored (rounded_as: the rounded max
    // is the max of the rounded values), what te_compute_amax of the output would give.
    if (!fp8) amax = rounded_as(p.out_dtype, amax);
    if (takes_amax) {
      // Rows of several warps fold their amax group by group; shorter rows' groups share
      // warps, and one atomic a block was faster there than one a warp (RESULTS.md,
      // twelfth session). Folded over the whole block, rows of several warps made
      // compute-sanitizer's racecheck report a hazard between a group's slot write and
      // thread 0's read behind __syncthreads (H100, hidden 4096, two groups a block, only
      // in a long test run; no cause found): group by group the slots are only read by
      // warps that passed the group's own barrier with the writers, and racecheck is
      // clean; the time was the same at hidden 2048-8192.
      if (p.amax) {
        if (group.threads > 32) {
          group_amax_to_global(amax, p.amax, group);
        } else {
          block_amax_to_global(amax, p.amax);
        }
      }
    }
    if (fp8 && p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  }
}

}  // namespace

void norm_fwd_cuda(const NormFwdParams& p, int device, void* workspace, size_t workspace_size, void* stream) {
  if (p.output_t && p.output) {
    // Both FP8 copies: the row-wise one from the kernel, then its bytes transposed in
    // tiles (transpose.cu). Written from the kernel, the transposed copy was a byte store
    // a row apart for every element, 12-15x the row-wise forward's time (H100: 1177 us
    // against 79 at 16384 x 4096; 231 against 20 at 16384 x 768). A column-wise copy
    // alone still takes those stores: it has no row-wise buffer to transpose from. The
    // FP8 kernels allow a dependent launch, so the transpose's blocks start as the
    // kernel's last wave drains and wait on the GPU for its bytes (1-1.5 us on an H100).
    NormFwdParams rowwise = p;
    rowwise.output_t = nullptr;
    norm_fwd_cuda(rowwise, device, workspace, workspace_size, stream);
    transpose_cuda(TransposeParams{p.output, p.output_t, p.rows, p.hidden, 1}, device, stream);
    return;
  }
  DeviceGuard guard(device);
  const NormRowShape shape = norm_fwd_row_shape(p.hidden);
  if (!shape.in_registers()) {
    norm_fwd_fallback_cuda(p, device, stream);
    return;
  }
  const bool takes_amax = is_fp8(p.out_dtype) || p.amax;
  auto launch = [&](auto kernel) {
    // at least one block even for zero rows: it still writes an FP8 output's scale_inv
    // A kernel that takes an amax ends each block in its reduction (cuda_utils.h:
    // grid_stride_blocks): four waves at most (two where a warp holds several rows),
    // and, where that would still give a block a single row group, half as many blocks,
    // each striding over two. H100, FP8 y (alternating A/B): layernorm 16384 x 768 20.0
    // -> 18.7 us, rmsnorm 17.7 -> 17.0 (two row groups a block); rows of several to a
    // warp in two waves, 65536 x 256 24.8 -> 23.5 / 21.4 -> 19.9, 262144 x 64 25.4 ->
    // 24.0 / 22.0 -> 20.6; shapes whose four waves already stride (65536 x 768, 32768 x
    // 1024, 4096 x 12288) are unchanged. No fixed wave count was best everywhere
    // (benchmarks/RESULTS.md).
    const int amax_waves = shape.threads_per_row < 32 ? 2 : kReducingKernelWaves;
    int64_t grid = norm_resident_grid(reinterpret_cast<const void*>(kernel), shape, 0, p.rows, device,
                                      takes_amax ? amax_waves : kUncappedWaves);
    if (takes_amax) {
      const int64_t row_groups = (p.rows + shape.rows_per_block - 1) / shape.rows_per_block;
      grid = std::max<int64_t>(1, std::min(grid, (row_groups + 1) / 2));
    }
    kernel<<<unsigned(grid), unsigned(shape.block_threads()), 0, as_stream(stream)>>>(
        p, shape.threads_per_row, shape.rows_per_block);
    check_launch("norm_fwd_rows_kernel");
  };
  // the one switch from the shape's bucket and the norm to template arguments
  auto launch_bucket = [&](auto in_tag, auto out_tag, auto vectorized_tag, auto float_amax_tag) {
    constexpr te_dtype kIn = decltype(in_tag)::value, kOut = decltype(out_tag)::value;
    constexpr bool kVec = decltype(vectorized_tag)::value, kAmax = decltype(float_amax_tag)::value;
    const bool layernorm = p.type == NormType::kLayerNorm;
    if (shape.chunks == kNormFwdSmallChunks) {
      if (layernorm) {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdSmallChunks, true, kVec, kAmax>);
      } else {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdSmallChunks, false, kVec, kAmax>);
      }
    } else {
      if (layernorm) {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdChunks, true, kVec, kAmax>);
      } else {
        launch(norm_fwd_rows_kernel<kIn, kOut, kNormFwdChunks, false, kVec, kAmax>);
      }
    }
  };
  const bool vectorized = p.hidden % kChunk == 0 && is_aligned(p.input, 16) && is_aligned(p.gamma, 16) &&
                          (p.beta == nullptr || is_aligned(p.beta, 16)) &&
                          (p.output == nullptr || is_aligned(p.output, is_fp8(p.out_dtype) ? 8 : 16));
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    if (vectorized && p.amax && p.out_dtype == p.in_dtype) {
      // a float y's amax (FP8 ys always take theirs): the modules' case, y in x's dtype
      launch_bucket(in_tag, in_tag, std::true_type{}, std::true_type{});
    } else if (vectorized && (!p.amax || is_fp8(p.out_dtype))) {
      dispatch_any_float_dtype(p.out_dtype, [&](auto out_tag) {
        launch_bucket(in_tag, out_tag, std::true_type{}, std::false_type{});
      });
    } else {  // and a float y of another dtype with its amax
      launch_bucket(in_tag, in_tag, std::false_type{}, std::false_type{});
    }
  });
}

}  // namespace opente
