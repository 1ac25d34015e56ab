// LayerNorm and RMSNorm forward with an FP8 y for 16-bit rows of 12288 to 16384 on
// devices whose memory outruns their SMs, pipelined (norm_fwd_pipelined_takes, where its
// timings are): one row a block at a time, read from shared memory, into
// which the block copies its next row (cp.async) while it works on this one, as the
// pipelined backward does (norm_bwd_pipelined.cu).
//
// Why: the row kernel (norm_fwd_kernel.cuh) loads a row group's row into registers,
// reduces it, then writes y, and while a group reduces and writes no load of its next
// row is in flight; at hidden 4096-16384 an SM holds two to four groups (64 registers a
// thread, 16 of them x). On an H200 its FP8 y reached 65-76% of a same-bytes copy there
// (benchmarks/RESULTS.md, thirty-second session), bound by instruction issue and
// latency together. Here the next row is in flight all the time, and x is read from the
// stage where it is used (twice, as the row kernel converts it twice) instead of held
// in registers across the row's reduction.
//
// The row kernel's row groups (norm_fwd_row_shape: four chunks a thread, whole warps;
// here a group is the block), its sums in the same order and its formulas (its kWide
// form's divisions by hidden), so mu, rsigma, y and the amax have the row kernel's bits:
// a row-wise call here and the row-wise pass of a call of both FP8 copies (the row
// kernel's, norm_fwd.cu) write the same bytes. Tried and
// dropped (benchmarks/RESULTS.md, the forty-eighth session): gamma and beta staged in
// shared memory as fp32 (5.7-33% slower on an H100: the tiles cost blocks), and both FP8
// copies as this kernel's pass then the transpose.

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace {

using namespace norm_kernels;

constexpr int kChunks = kNormFwdChunks;
constexpr int kMaxThreads = kNormMaxBlockThreads;  // hidden 16384: 512 threads of 32 elements
constexpr int kMaxWarps = kMaxThreads / 32;

// 64 registers at most (two blocks of 512 threads an SM, as the row kernel); ptxas takes
// 53-56 for layernorm, 47-48 for rmsnorm (sm_90a, no spills): at hidden 12288 (384
// threads, 48 KiB of stages) three blocks an SM, at 16384 two, as the row kernel.
template <te_dtype kIn, te_dtype kOut, bool kLayerNorm>
__global__ void __launch_bounds__(kMaxThreads, 2) norm_fwd_pipelined_kernel(NormFwdParams p) {
  using In = typename CudaType<kIn>::type;
  using Share = RowShare<In, kChunks, true>;
  static_assert(Share::kWordsPerChunk == 1, "16-bit rows: a chunk is one 16-byte word");
  static_assert(kIsFp8<kOut>, "y: FP8");
  extern __shared__ float4 smem[];
  __shared__ float scratch[2 * kMaxWarps];
  __shared__ float2 pair_scratch[kLayerNorm ? 2 * kMaxWarps : 1];
  // The block is one row group. Its index and thread made constants for the compiler: the
  // reductions' named barrier (1 + index) is then an immediate, and ptxas reserves two
  // barriers a block instead of all 16 (sync_row_group, norm_kernels_common.cuh).
  RowGroup group(int(blockDim.x));
  group.index = 0;
  group.thread = int(threadIdx.x);
  const int hidden = int(p.hidden);
  const int stage_words = Share::kStageWords * group.threads;
  uint4* stages = reinterpret_cast<uint4*>(smem);  // [2][chunks][threads] 16-byte words

  const In* x_rows = static_cast<const In*>(p.input);  // [rows, hidden]
  // Copies row r into `stage` (zeros past the last row: no traffic) as one commit group.
  // Each thread copies and later reads only its own words: no barrier.
  auto stage_row = [&](uint4* stage, int64_t r) {
    const bool active = r < p.rows;
    Share::stage(stage, x_rows + (active ? r : 0) * p.hidden, group, active ? hidden : 0);
    commit_async_copies();
  };
  const int64_t stride = gridDim.x;
  int64_t r = blockIdx.x;
  // Not for a grid of no rows (whose one block writes the scale_inv): x may then be a
  // null pointer.
  if (r < p.rows) stage_row(stages, r);

  [[maybe_unused]] RowReduction<float, kMaxWarps, true, true> reduction(scratch, group);  // RMSNorm's; whole warps
  RowReduction<float2, kMaxWarps, true, true> pair_reduction(pair_scratch, group);
  const float scale = *p.scale;
  float amax = 0.0f;
  for (int buffer = 0; r < p.rows; r += stride, buffer ^= 1) {
    const uint4* x_stage = stages + buffer * stage_words;
    stage_row(stages + (buffer ^ 1) * stage_words, r + stride);
    wait_async_copies<1>();  // this row's group; the next row's stays in flight
    auto x_chunk = [&](int j, float (&x)[kChunk]) {
      const Vec8<In> raw = staged_chunk<In>(x_stage, j);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) x[i] = element_as_float(raw, i);
    };

    // The statistics: the row kernel's (norm_fwd_kernel.cuh, "Statistics"), chunk by chunk
    // (0 past the row: the stage's zeros)
    float mu = 0.0f, variance;
    if constexpr (kLayerNorm) {
      float sum_x = 0.0f, sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        if (group.column(j) < hidden) {
          float x[kChunk];
          x_chunk(j, x);
          sum_x += chunk_sum(x);
          sum_sq += chunk_sum_of_squares(x);
        }
      }
      const auto row_mean = [&](float sum) { return sum / float(hidden); };
      const float2 sums = pair_reduction.sum(make_float2(sum_x, sum_sq));
      mu = row_mean(sums.x);
      variance = __fmaf_rn(-mu, mu, row_mean(sums.y));
      const auto deviations = [&](int j, float m, float (&d)[kChunk]) {
        float x[kChunk];
        x_chunk(j, x);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) d[i] = x[i] - m;
      };
      const bool far = mu * mu > variance;  // the same in every thread of the block
      far_row_statistics<kChunks>(
          far, mu, variance, pair_reduction, [&](int j) { return group.column(j) < hidden; }, deviations, row_mean,
          [] {});
      if (variance < 0.0f) variance = 0.0f;  // rounding; a NaN row stays NaN
    } else {
      float sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        float x[kChunk];
        x_chunk(j, x);
        sum_sq += chunk_sum_of_squares(x);
      }
      variance = reduction.sum(sum_sq) / float(hidden);
    }
    const float rsigma = rsqrtf(variance + p.eps);
    [[maybe_unused]] const float neg_mu_rsigma = -mu * rsigma;
    if (threadIdx.x == 0) {
      if constexpr (kLayerNorm) p.mu[r] = mu;
      p.rsigma[r] = rsigma;
    }

    // y, in the row kernel's form (its comments there)
    void* y_row = static_cast<typename Stored<kOut>::type*>(p.output) + r * p.hidden;
    auto write_y = [&](const auto& weights) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int col = group.column(j);
        if (col >= hidden) continue;
        float x[kChunk], y[kChunk], gamma[kChunk];
        [[maybe_unused]] float beta[kChunk];
        x_chunk(j, x);
        weights.load_gamma(col, hidden, gamma);
        if constexpr (kLayerNorm) weights.load_beta(col, hidden, beta);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          if constexpr (kLayerNorm) {
            y[i] = fmaf(x[i], rsigma, neg_mu_rsigma) * gamma[i];
          } else {
            y[i] = x[i] * rsigma * gamma[i];
          }
          if constexpr (kLayerNorm) y[i] += beta[i];
          amax = fmaxf(amax, fabsf(y[i]));
          y[i] *= scale;
        }
        store_chunk<true, kOut>(y_row, col, hidden, y);
      }
    };
    with_typed_weights(p.w_dtype, p.zero_centered_gamma, p.gamma, p.beta, write_y);
  }
  wait_all_async_copies();  // the zero-filled copies past the last row

  // max|y| before scaling (norm_fwd_kernel.cuh)
  if (p.amax) block_amax_to_global<kMaxWarps>(amax, p.amax);
  if (p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
}

template <te_dtype kIn, te_dtype kOut>
void launch(const NormFwdParams& p, const NormRowShape& shape, int device, void* stream) {
  auto kernel = p.type == NormType::kLayerNorm ? norm_fwd_pipelined_kernel<kIn, kOut, true>
                                               : norm_fwd_pipelined_kernel<kIn, kOut, false>;
  const int threads = shape.threads_per_row;
  const size_t smem = 2 * size_t(kChunks) * 16 * size_t(threads);  // [2][chunks][threads] 16-byte words
  NormRowShape block = shape;
  block.rows_per_block = 1;
  // one wave; at least one block even for zero rows (it writes the scale_inv)
  const int64_t grid = norm_resident_grid(reinterpret_cast<const void*>(kernel), block, smem, p.rows, device);
  kernel<<<unsigned(grid), unsigned(threads), smem, as_stream(stream)>>>(p);
  check_launch("norm_fwd_pipelined_kernel");
}

}  // namespace

bool norm_fwd_pipelined_takes(const NormFwdParams& p, bool vectorized, int device) {
  return vectorized && dtype_size(p.in_dtype) == 2 && is_fp8(p.out_dtype) && p.output != nullptr &&
         p.output_t == nullptr && p.hidden >= kNormFwdPipelinedMinHidden && p.hidden <= kNormFwdMaxRegisterHidden &&
         norm_memory_outruns_sms(device);
}

void norm_fwd_pipelined_cuda(const NormFwdParams& p, int device, void* stream) {
  const NormRowShape shape = norm_fwd_row_shape(p.hidden, /*extra_chunk_rows=*/true);
  if (shape.chunks != kChunks || shape.threads_per_row % 32 != 0) {
    fail(TE_ERROR_INTERNAL, concat("norm forward, pipelined: no kernel for hidden ", p.hidden));
  }
  // the call's dtypes to template arguments
  auto with_input = [&](auto in_tag) {
    constexpr te_dtype kIn = decltype(in_tag)::value;
    if (p.out_dtype == TE_DTYPE_FLOAT8_E4M3) {
      launch<kIn, TE_DTYPE_FLOAT8_E4M3>(p, shape, device, stream);
    } else {
      launch<kIn, TE_DTYPE_FLOAT8_E5M2>(p, shape, device, stream);
    }
  };
  if (p.in_dtype == TE_DTYPE_BFLOAT16) {
    with_input(DTypeTag<TE_DTYPE_BFLOAT16>{});
  } else {
    with_input(DTypeTag<TE_DTYPE_FLOAT16>{});
  }
}

}  // namespace opente
