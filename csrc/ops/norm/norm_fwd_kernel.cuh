// The LayerNorm and RMSNorm forward kernel of the register path (norm_fwd_rows_launch.cuh
// launches it; norm_fwd_tiled_launch.cuh its tiled form, both FP8 copies in one pass).
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
// at least two row groups a block (see launch_norm_fwd_rows).
//
// The tiled forms (kTile, norm_fwd_tiled.cu) walk tiles of consecutive rows instead:
// the row groups normalize a tile's rows in turn, the FP8 bytes of each go to the
// row-wise copy and (NormTile::kShared) to the tile in shared memory, and behind a
// barrier the block writes the tile's transpose (store_tile_transposed), from shared
// memory (tile_slot) or (NormTile::kRowwiseCopy) from the row-wise copy it has just
// written, still in the L2. The trailing form (NormTile::kTrailing, norm_trailing.h) takes
// row groups by ticket instead, and each ticket also transposes a share of a tile that
// earlier tickets wrote.
//
// Statistics (LayerNorm): one reduction of a pair, the sums of x and of x^2 (each
// chunk's 8 added pairwise, chunk_sum and chunk_sum_of_squares; past the row's end
// the elements count as 0): mu = sum(x) / n, variance = sum(x^2) / n - mu^2. The two
// passes of the CPU reference (a mean, then the squares about it) took two reductions
// a row, and rows of several warps wait at a barrier in each. In fp32 the difference
// loses the variance's low bits where mu^2 outweighs it (a row at an offset of 1000
// with a spread of 1), and a mean summed in fp32 is off by about |mean| * 1e-7 there:
// rows whose mu^2 exceeds their variance sum the deviations d = x - mu and d^2 again
// (a second reduction of a pair), and take mu + sum(d) / n and sum(d^2) / n - (sum(d) /
// n)^2, as accurate as the pivot's form (benchmarks/RESULTS.md, fifty-ninth session:
// a float32 model of both forms). Rows of Gaussian values, or
// with an outlier feature, take the one reduction. Until the sixty-first session the
// sums were of x - pivot, the pivot the mean of the row's first 8 elements (a
// broadcast load for rows of several warps; a subtraction an element): about 2.2
// instructions an element more (SASS). Tried instead (sixth session): a Welford / Chan
// merge in every shuffle step (6-25% slower on an H100), and the two passes with a
// correction of the mean by the deviations' sum for every row (1-6% slower).
// What follows the sums is counted too (rows of 64-512 elements, a thread's 16, were
// bound by instruction issue, ncu on an H100: 30 instructions an element for layernorm,
// 21 for rmsnorm): rsigma is rsqrtf, LayerNorm's x hat one FFMA (x * rsigma - mu *
// rsigma), and the small bucket's means a multiply by 1 / hidden (row_mean); layernorm's
// FP8 y 2-7% faster there, 1-4% at hidden 1024-12288, rmsnorm's up to 4%.
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
#pragma once

#include <type_traits>

#include "common/cuda_dependent_launch.cuh"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"
#include "ops/norm/norm_trailing.h"
#include "ops/quantize/cast_transpose.cuh"

namespace opente {
namespace norm_kernels {

// Row r of a vectorized y: the row kernel's y_row, made once a row, or with kFromRow
// (the kernels where ptxas spilled a held row) addressed here from r at each use.
template <te_dtype kOut, bool kFromRow>
__device__ __forceinline__ void* y_row_of(const NormFwdParams& p, int64_t r, void* y_row) {
  return kFromRow ? static_cast<typename Stored<kOut>::type*>(p.output) + r * p.hidden : y_row;
}

// y to columns [col, col + 8) of output row `r` (and of the FP8 transposed output).
// Element-wise (!kVectorized): in the dtype p.out_dtype, kOut unused, whichever
// pointers are set. Vectorized: the row-wise y to row r of p.output (y_row_of; y_row null
// where p.output is). A vectorized FP8 y: the row-wise y, or where `columnwise_alone` (the
// row kernel's call of a column-wise copy alone, norm_fwd.cu) that copy alone; the kernel
// tells the two apart once a row, since testing both pointers at every chunk took about 7
// instructions a chunk of layernorm's FP8 y (SASS; 2 now), and the H200 runs these kernels
// at their instruction issue bound: there 0-2.1% faster (layernorm 16384 x 4096 67.4 ->
// 66.2 us), on an H100 within 1.4% either way (benchmarks/RESULTS.md).
template <bool kVectorized, te_dtype kOut, bool kFromRow>
__device__ __forceinline__ void store_y(const NormFwdParams& p, int64_t r, void* y_row, int col, int hidden, bool fp8,
                                        bool columnwise_alone, const float (&y)[kChunk]) {
  // [hidden, rows], a column-wise copy alone the tiled form does not take: byte stores a row apart
  auto store_transposed = [&] {
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
  };
  if constexpr (!kVectorized) {
    if (p.output) {
      const int64_t row = r * p.hidden;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        if (col + i < hidden) store_element_as(p.output, row + col + i, p.out_dtype, y[i]);
      }
    }
    if (fp8 && p.output_t) store_transposed();
  } else if constexpr (kIsFp8<kOut>) {
    if (columnwise_alone) {
      store_transposed();
    } else {
      store_chunk<kVectorized, kOut>(y_row_of<kOut, kFromRow>(p, r, y_row), col, hidden, y);
    }
  } else if (p.output) {
    store_chunk<kVectorized, kOut>(y_row_of<kOut, kFromRow>(p, r, y_row), col, hidden, y);
  }
}

// The tiled kernel's shared-memory tile (NormTile::kShared): tile_rows rows of hidden FP8 bytes,
// as 8-byte slots, row r's slot s at r * slots + (s ^ swizzle), where the swizzle is
// the row's 8-row block times 128 / tile_rows (below 16; hidden % 128 == 0 keeps the
// slot in its row). A row group writes its row's consecutive slots (distinct banks);
// the transposing threads read one slot of 8 consecutive rows each, the tile's row
// blocks fastest across a half-warp: 128 / tile_rows neighbouring slots times
// tile_rows / 8 row blocks, which the swizzle spreads over 16 distinct slots (one
// shared-memory wavefront).
__device__ __forceinline__ int tile_slot(int r, int slot, int slots, int tile_rows) {
  return r * slots + (slot ^ ((r / 8) * (128 / tile_rows) % 16));
}

// One 8x8 byte block to out_t [hidden, rows]: rows [r0, r0 + 8) of 8-byte slot `slot`
// (load_row(k): row r0 + k's 8 bytes), transposed with byte permutes (cast_transpose.cuh),
// each column's 8 bytes one store.
template <class LoadRow>
__device__ __forceinline__ void store_block_transposed(LoadRow load_row, uint8_t* out_t, int64_t r0, int slot,
                                                       int64_t rows) {
  uint32_t lo[8], hi[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint2 v = load_row(k);
    lo[k] = v.x;
    hi[k] = v.y;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    *reinterpret_cast<uint2*>(out_t + int64_t(slot * 8 + j) * rows + r0) = byte_block_column(lo, hi, j);
  }
}

// The tile's transpose to out_t [hidden, rows] at row tile_first: each thread takes 8x8
// byte blocks (8 rows of one 8-byte slot, from load_slot(row in the tile, slot)),
// transposes them with byte permutes (cast_transpose.cuh) and stores each column's 8
// bytes. Lanes take the tile's row blocks fastest, so each store instruction writes the
// tile_rows bytes of a column whole (with rows % 8 == 0, an 8-row block is all in the
// matrix or all past it); read from the row-wise copy, each load instruction takes whole
// 64-byte runs of tile_rows / 8 rows. The caller's barrier lies between the tile's writes
// and this.
template <class LoadSlot>
__device__ __forceinline__ void store_tile_transposed(LoadSlot load_slot, uint8_t* out_t, int64_t tile_first,
                                                      int64_t rows, int hidden, int tile_rows) {
  const int row_blocks = tile_rows / 8, slots = hidden / 8;
  for (int b = int(threadIdx.x); b < row_blocks * slots; b += int(blockDim.x)) {
    const int row_block = b % row_blocks, slot = b / row_blocks;
    const int64_t r0 = tile_first + row_block * 8;
    if (r0 >= rows) continue;
    store_block_transposed([&](int k) { return load_slot(row_block * 8 + k, slot); }, out_t, r0, slot, rows);
  }
}

// Threads a block of the kernel may have: the hidden <= 512 bucket (kImmediates, every dtype;
// tiled or not) kNormFwdSmallMaxThreads; the other tiles a block (kShared, kRowwiseCopy) take
// 16-bit rows in blocks of up to kNormFwdStagedMaxBlockThreads (one an SM,
// norm_row_shape.cpp; the shared tile of hidden 768 / 1024 launches 512, two an SM, under the
// same 64 registers); the row kernel's compact form kNormFwdCompactMaxThreads; the rest (the
// trailing tiles and fp32 tiles too) blocks of up to kNormMaxBlockThreads (two an SM for
// 16-bit rows).
template <NormTile kTile>
constexpr bool kNormFwdTileABlock = kTile == NormTile::kShared || kTile == NormTile::kRowwiseCopy;
template <NormTile kTile, te_dtype kIn, NormRowForm kForm>
constexpr int kNormFwdBlockBound =
    kForm == NormRowForm::kImmediates                          ? kNormFwdSmallMaxThreads
    : kNormFwdTileABlock<kTile> && kIn != TE_DTYPE_FLOAT32 ? kNormFwdStagedMaxBlockThreads
    : kForm == NormRowForm::kCompact                          ? kNormFwdCompactMaxThreads
                                                              : kNormMaxBlockThreads;
// The blocks an SM __launch_bounds__ asks for: 16-bit vectorized rows kNormFwdWideMinBlocks
// blocks of kNormMaxBlockThreads' registers (64), the compact form kNormFwdCompactMinBlocks
// (56), the small bucket kNormFwdSmallMinBlocks (48), LayerNorm's three-chunk rows there
// kNormFwdSmallOddLnMinBlocks (64: at 48 they spilled 28-76 bytes) or, in its shared tile,
// kNormFwdSmallTiledMinBlocks (64: at 48 the tile loop's state spilled 8-24 bytes); fp32 and
// element-wise rows the registers of one block of kNormMaxBlockThreads (128).
template <NormTile kTile, te_dtype kIn, bool kVectorized, NormRowForm kForm, int kChunks, bool kLayerNorm>
constexpr int kNormFwdMinBlocks =
    !kVectorized || kIn == TE_DTYPE_FLOAT32 ? kNormMaxBlockThreads / kNormFwdBlockBound<kTile, kIn, kForm>
    : kForm == NormRowForm::kCompact        ? kNormFwdCompactMinBlocks
    : kForm == NormRowForm::kImmediates
        ? (kTile != NormTile::kNone                          ? kNormFwdSmallTiledMinBlocks
           : kChunks == kNormFwdSmallOddChunks && kLayerNorm ? kNormFwdSmallOddLnMinBlocks
                                                             : kNormFwdSmallMinBlocks)
        : kNormFwdWideMinBlocks * kNormMaxBlockThreads / kNormFwdBlockBound<kTile, kIn, kForm>;

// kChunks: the shape's bucket (8-element chunks a thread holds). kVectorized: see
// RowShare; it also requires gamma and beta 16-byte aligned, and the row-wise
// output 16-byte (FP8: 8-byte) aligned. kOut: the output dtype of the vectorized
// instantiations; the element-wise ones read p.out_dtype instead (one
// instantiation per input dtype for that rarer case; the dispatch passes kIn as
// kOut there). kFloatAmax: a vectorized float y in the input's dtype that also
// raises p.amax to max|y| as stored (a current-scaling cast of y follows from it:
// module_ops.FusedAmax); its own instantiations, so the plain float-y kernels carry
// no amax instructions (their PTX is the same as before it existed); the element-wise
// kernels test p.amax at run time. The register cap of 64 (two blocks of 512 threads an
// SM, or one of 1024: kNormFwdBlockBound), and the compact form's 56, are for 16-bit
// inputs: an fp32 row takes twice the registers, and the element-wise kernels' bounds and
// dtype switches more; capped, both spilled (ptxas, sm_90a). kForm: NormRowForm
// (norm_launch.h), the row kernel's block bound and barrier numbers. inv_hidden: 1 / hidden, the
// small bucket's means (row_mean).
template <te_dtype kIn, te_dtype kOut, int kChunks, bool kLayerNorm, bool kVectorized, bool kFloatAmax = false,
          NormTile kTile = NormTile::kNone, NormRowForm kForm = NormRowForm::kWide>
__global__ void __launch_bounds__(kNormFwdBlockBound<kTile, kIn, kForm>,
                                  kNormFwdMinBlocks<kTile, kIn, kVectorized, kForm, kChunks, kLayerNorm>)
    norm_fwd_rows_kernel(NormFwdParams p, int threads_per_row, int rows_per_block, int tile_rows, float inv_hidden,
                         NormTrailingArgs trailing) {
  constexpr int kMaxWarps = kNormFwdBlockBound<kTile, kIn, kForm> / 32;  // the block's warps at most
  using In = typename CudaType<kIn>::type;
  constexpr bool kMaybeFp8 = !kVectorized || kIsFp8<kOut>;
  constexpr bool kMaybeAmax = kMaybeFp8 || kFloatAmax;
  static_assert(!kFloatAmax || (kVectorized && kOut == kIn), "kFloatAmax: a vectorized y in the input's dtype");
  constexpr bool kTiled = kTile != NormTile::kNone;
  static_assert(!kTiled || (kVectorized && kIsFp8<kOut>), "a tile: a vectorized FP8 y");
  extern __shared__ uint2 transpose_tile[];  // NormTile::kShared: tile_slot's layout, tile_rows * hidden bytes
  if constexpr (kMaybeFp8) allow_dependent_launch();  // the transposed copy's kernel (norm_fwd_cuda)
  const bool fp8 = kVectorized ? kIsFp8<kOut> : is_fp8_dtype(p.out_dtype);
  // A vectorized FP8 y's column-wise copy alone, the row kernel's one call without a
  // row-wise y (norm_fwd.cu; the tiled forms write that copy from their tiles): store_y.
  constexpr bool kMaybeColumnwiseAlone = kVectorized && kIsFp8<kOut> && !kTiled;
  const bool columnwise_alone_call = kMaybeColumnwiseAlone && p.output_t != nullptr;
  // max|y| is taken for an FP8 y (before scaling) and where a float y's amax is asked for
  const bool takes_amax = kVectorized ? kIsFp8<kOut> || kFloatAmax : fp8 || p.amax != nullptr;
  __shared__ float scratch[kLayerNorm ? 1 : 2 * kMaxWarps];  // RMSNorm's statistics
  __shared__ float2 pair_scratch[kLayerNorm ? 2 * kMaxWarps : 1];
  // LayerNorm's trailing tiles take rows of more than half a block's threads (norm_launch.h):
  // a row group a block, whose index is 0 rather than a division held in a register (with
  // the ticket below, 168 bytes of spill in those kernels went to 8, ptxas sm_90a)
  constexpr bool kOneRowGroup = kTile == NormTile::kTrailing && kLayerNorm;
  // Rows of 6 chunks a thread take exactly a warp (norm_launch.h): the group's index and rank
  // a shift and a mask of a constant, where the division by threads_per_row was held in a
  // register that the 6-chunk tiles' kernels spilled and reloaded once a row (ptxas), and
  // the rank known to be below 32 (RowGroup::power_of_two)
  constexpr bool kWarpGroups = kChunks == kNormFwdWarpRowMaxChunks;
  // Rows of 2, 3, 5 or 6 chunks a thread take a warp or less (norm_launch.h): the compiler
  // drops the reductions' cross-warp code for them (and the 5- and 6-chunk kernels' spills)
  constexpr bool kGroupsInAWarp = kChunks != kNormFwdChunks;
  // Those groups are a power of two of threads (a shift and a mask); rows of 4 chunks take
  // whole warps, their index by a reciprocal, about 30 instructions fewer than the division
  // (with the reciprocal for every group, RMSNorm's 3-chunk rows spilled 16-24 bytes and
  // lost 1.3-5% at 65536 x 384, H100). The row-wise-copy tiles' rows in a warp keep the
  // division: under either other form ptxas spilled 8 bytes in their 5-chunk kernels (sm_90a).
  const RowGroup group = kOneRowGroup                      ? RowGroup::whole_block()
                         : kWarpGroups                     ? RowGroup::power_of_two(32)
                         : !kGroupsInAWarp                 ? RowGroup::by_reciprocal(threads_per_row)
                         : kTile == NormTile::kRowwiseCopy ? RowGroup(threads_per_row)
                                                           : RowGroup::power_of_two(threads_per_row);
  if constexpr (kGroupsInAWarp) __builtin_assume(threads_per_row <= 32);
  // and rows of 4 chunks (hidden > 512) whole warps (norm_row_shape.cpp; test_norm_row_shape.cpp's
  // forward shapes): their sums' shuffle steps run without a test of the group's width, which
  // cost a compare and a branch a step (SASS)
  if constexpr (!kGroupsInAWarp) __builtin_assume(group.threads >= 32 && group.threads % 32 == 0);
  const int hidden = int(p.hidden);  // <= kNormFwdMaxRegisterHidden
  static_assert(!kTiled || kForm != NormRowForm::kCompact,
                "the tiled kernels: kWide, or the small bucket's rows (kImmediates) in their shared tile");
  static_assert(kForm != NormRowForm::kCompact || (kVectorized && kIn != TE_DTYPE_FLOAT32),
                "the compact form's 56 registers: 16-bit vectorized rows");
  static_assert(kForm != NormRowForm::kImmediates || kChunks == kNormFwdSmallChunks ||
                    kChunks == kNormFwdSmallOddChunks,
                "the immediates' bound: the hidden <= 512 bucket's blocks");
  constexpr bool kImmediateBarrier = kForm != NormRowForm::kWide;
  [[maybe_unused]] RowReduction<float, kMaxWarps, kImmediateBarrier> reduction(scratch, group);
  RowReduction<float2, kMaxWarps, kImmediateBarrier> pair_reduction(pair_scratch, group);  // LayerNorm's statistics
  const float scale = fp8 ? *p.scale : 1.0f;
  float amax = 0.0f;
  // A row's mean of a sum: a multiply by inv_hidden (1 / hidden, from the launch) in the
  // hidden <= 512 bucket, where a thread's 16 elements carry a row's statistics and every
  // instruction counts; a division (about 10 instructions) elsewhere, where the multiply
  // took rmsnorm's kWide kernels from 56 registers to 64 and spilled layernorm's compact
  // ones (ptxas, sm_90a): 3-6% slower at hidden 11264 (H100).
  auto row_mean = [&](float sum) {
    if constexpr (kForm == NormRowForm::kImmediates) {
      return sum * inv_hidden;
    } else {
      return sum / float(hidden);
    }
  };

  // Normalizes the block's row groups from row `first` on. Every warp of the block
  // calls it the same number of times, so every warp joins every shuffle; a group past
  // the last row computes on zeros and writes nothing. tile_first: the tile's first
  // row (kTiled). while_loading: work for the time the row's loads are in flight (the
  // trailing tiles' transposes), called by every thread.
  auto normalize_rows = [&](int64_t first, [[maybe_unused]] int64_t tile_first, auto while_loading) {
    const int64_t r = first + group.index;
    const bool active = r < p.rows;
    RowShare<In, kChunks, kVectorized> x;
    x.template load</*kEvictFirst=*/true>(static_cast<const In*>(p.input) + r * p.hidden, group, active ? hidden : 0);
    while_loading();

    float mu = 0.0f, variance;  // RMSNorm: no centering, the mean square
    if constexpr (kLayerNorm) {
      // One reduction of the sums of x and x^2 (see "Statistics")
      float sum_x = 0.0f, sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        // columns past the row hold 0; a vectorized chunk past it is skipped whole
        if (!kVectorized || group.column(j) < hidden) {
          float v[kChunk];
#pragma unroll
          for (int i = 0; i < kChunk; ++i) v[i] = x.at(j, i);
          sum_x += chunk_sum(v);
          sum_sq += chunk_sum_of_squares(v);
        }
      }
      x.convert_again_later();  // not held as fp32 across the reduction for the far rows' sums
      const float2 sums = pair_reduction.sum(make_float2(sum_x, sum_sq));
      mu = row_mean(sums.x);
      variance = __fmaf_rn(-mu, mu, row_mean(sums.y));
      // A mean larger than the spread would cost the variance its low bits (and mu its
      // accuracy): such rows sum the deviations from mu and their squares again, and mu
      // takes their mean as a correction (far_row_statistics). Every thread of a
      // multi-warp group agrees on `far` already.
      // (a vectorized chunk wholly past the row is skipped; an element past it counts 0)
      const auto chunk_in_row = [&](int j) { return !kVectorized || group.column(j) < hidden; };
      const auto deviations = [&](int j, float m, float (&d)[kChunk]) {
        const int col = group.column(j);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) d[i] = in_row<kVectorized>(col, i, hidden) ? x.at(j, i) - m : 0.0f;
      };
      const bool far = mu * mu > variance;
      far_row_statistics<kChunks>(far, mu, variance, pair_reduction, chunk_in_row, deviations, row_mean, [&] {
        if constexpr (kTile == NormTile::kShared) {
          // The named barrier the far rows' sum passes, so that every group of the block
          // passes as many: with uneven counts compute-sanitizer's racecheck reported the
          // shared tile's writes and reads across the block's barrier as hazards.
          if (group.threads > 32) sync_row_group<kImmediateBarrier>(1 + group.index, group.threads);
        }
      });
      if (variance < 0.0f) variance = 0.0f;  // rounding; a NaN row stays NaN (fmaxf would drop it)
    } else {
      float sum_sq = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        float v[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[i] = x.at(j, i);  // 0 past the row
        sum_sq += chunk_sum_of_squares(v);
      }
      variance = row_mean(reduction.sum(sum_sq));
    }
    // MUFU.RSQ (2 ulp at most), where 1 / sqrtf took two correctly rounded steps of about
    // 20 instructions a row; inf for a variance of 0 with eps 0, NaN for a NaN row, as before
    const float rsigma = rsqrtf(variance + p.eps);
    [[maybe_unused]] const float neg_mu_rsigma = -mu * rsigma;  // LayerNorm's x hat in one FFMA below
    x.convert_again_later();
    if (!active) return;  // the group's last shuffle or barrier of this row is behind
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
    // Held for the row: taken from the pointer again at every chunk, the test cost a
    // constant load and two compares a chunk (SASS).
    [[maybe_unused]] bool columnwise_alone = false;  // the tiled forms store from their tiles
    if constexpr (kMaybeColumnwiseAlone) columnwise_alone = opaque_per_row(int(columnwise_alone_call)) != 0;
    // The row-wise y's row, its offset made once a row and held (opaque_per_row): left to
    // the compiler, the address was rebuilt from r at every chunk (9 instructions of the 84
    // a chunk of layernorm's FP8 y takes, SASS; 2 held), and the H200 runs these kernels at
    // their instruction issue bound. The offset rather than the pointer is made opaque:
    // a pointer out of the asm is no longer known to be global, and its stores became
    // generic ones (ST, not STG). Kernels where ptxas spilled the held row (sm_90a) take
    // their address from r as before (kFromRow; tools/sass_same.py: those kernels' code as
    // before the held row, but the 4-chunk rows' shuffles): the row-wise-copy tiles (8
    // bytes in the 5-chunk kernels; layernorm's both FP8 copies at 32768 x 1280 1.7%
    // slower), RMSNorm's 3-chunk rows (8-16 bytes; rmsnorm 65536 x 384 2-4.5% slower),
    // LayerNorm's 5-chunk and compact FP8 rows (8 bytes more; 32768 x 1280 0.9%, 8192 x
    // 6144 1.1% slower; H100 each). Element-wise rows index from p.output.
    constexpr bool kSpillingRows = (kChunks == 3 && !kLayerNorm) ||
                                   (kLayerNorm && kIsFp8<kOut> && (kChunks == 5 || kForm == NormRowForm::kCompact));
    constexpr bool kFromRow = kTile == NormTile::kRowwiseCopy || (kTile == NormTile::kNone && kSpillingRows);
    [[maybe_unused]] void* y_row = nullptr;
    if constexpr (kVectorized && !kFromRow) {
      if (p.output) y_row = static_cast<typename Stored<kOut>::type*>(p.output) + opaque_per_row(r * p.hidden);
    }
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
          // x hat, then * g, as the CPU reference; LayerNorm's x hat as x * rsigma - mu * rsigma,
          // one instruction where (x - mu) * rsigma took two: it differs from the reference's
          // rounding by about an ulp of mu * rsigma, within the tests' bounds
          if constexpr (kLayerNorm) {
            y[i] = fmaf(x.at(j, i), rsigma, neg_mu_rsigma) * gamma[i];
          } else {
            y[i] = x.at(j, i) * rsigma * gamma[i];
          }
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
        if constexpr (kTile == NormTile::kShared) {  // the row-wise copy (if asked for) and the tile's slot
          const uint2 bytes = fp8_chunk<kOut>(y);
          if (y_row) *reinterpret_cast<uint2*>(static_cast<uint8_t*>(y_row) + col) = bytes;
          transpose_tile[tile_slot(int(r - tile_first), col / kChunk, hidden / kChunk, tile_rows)] = bytes;
        } else if constexpr (kTile == NormTile::kRowwiseCopy || kTile == NormTile::kTrailing) {
          // the row-wise copy, read back below (kTrailing: by a later ticket)
          uint8_t* const row = static_cast<uint8_t*>(y_row_of<kOut, kFromRow>(p, r, y_row));
          *reinterpret_cast<uint2*>(row + col) = fp8_chunk<kOut>(y);
        } else {
          store_y<kVectorized, kOut, kFromRow>(p, r, y_row, col, hidden, fp8, columnwise_alone, y);
        }
      }
    };
    if constexpr (kVectorized) {
      with_typed_weights(p.w_dtype, p.zero_centered_gamma, p.gamma, p.beta, write_y);
    } else {
      write_y(RuntimeWeights(p.gamma, p.beta, p.w_dtype, p.zero_centered_gamma));
    }
  };
  if constexpr (kTile == NormTile::kTrailing) {
    // Row groups by ticket, each ticket also a share of an earlier tile's transpose
    // (norm_trailing.h), written while the ticket's row loads are in flight (between the
    // rows, the block's transposes would leave its DRAM loads idle). The next ticket is
    // taken a turn ahead, so that the atomic's latency passes under this turn's row.
    const NormTrailingSchedule schedule{p.rows, p.hidden, rows_per_block, tile_rows, trailing.lag};
    unsigned* const next_ticket = trailing.counters;
    unsigned* const tile_rows_written = trailing.counters + 1;
    __shared__ unsigned tickets[2];  // this turn's and the next's
    if (threadIdx.x == 0) tickets[0] = atomicAdd(next_ticket, 1u);
    __syncthreads();
    const int64_t row_groups = trailing.row_groups, tickets_end = trailing.tickets;
    const uint8_t* const rowwise = static_cast<const uint8_t*>(p.output);
    uint8_t* const out_t = static_cast<uint8_t*>(p.output_t);
    const int row_blocks = schedule.row_blocks();
    // A slot is written (by thread 0, a turn after it was read) behind the barriers that
    // end the turn its previous ticket was read in, and read behind the barrier that ends
    // the turn it was written in.
    for (int turn = 0;; turn ^= 1) {
      const int64_t ticket = tickets[turn];
      if (ticket >= tickets_end) break;
      if (threadIdx.x == 0) tickets[turn ^ 1] = atomicAdd(next_ticket, 1u);
      const NormTrailingShare share = schedule.share(ticket);
      // the share's tile whole: its row groups' tickets are older by the lag (two waves),
      // so thread 0 seldom waits; the others wait for it at the barrier below
      // (wait_until_at_least says why that suffices)
      if (threadIdx.x == 0 && share.tile >= 0) {
        wait_until_at_least(tile_rows_written + share.tile, unsigned(schedule.rows_of_tile(share.tile)));
      }
      auto transpose_share = [&] {
        __syncthreads();
        if (share.tile < 0) return;  // the first `lag` tickets: nothing to transpose yet
        const int64_t tile_first = share.tile * tile_rows;
        for (int64_t unit = share.unit_begin + threadIdx.x; unit < share.unit_end; unit += blockDim.x) {
          const int row_block = int(unit % row_blocks), slot = int(unit / row_blocks);
          const int64_t r0 = tile_first + row_block * 8;
          if (r0 >= p.rows) continue;
          // from the L2 (.cg): bytes another block wrote, never in this SM's L1
          const uint8_t* block = rowwise + r0 * p.hidden + slot * kChunk;
          store_block_transposed(
              [&](int k) { return __ldcg(reinterpret_cast<const uint2*>(block + int64_t(k) * p.hidden)); }, out_t,
              r0, slot, p.rows);
        }
      };
      if (ticket < row_groups) {
        normalize_rows(ticket * rows_per_block, 0, transpose_share);
      } else {
        transpose_share();  // past the last row group: the shares of the last `lag` alone
      }
      __syncthreads();  // the row group's row-wise bytes written, by every thread of the block
      if (threadIdx.x == 0) {
        // the turn's ticket read again from its slot (which only the next turn rewrites),
        // not held across the row, where with the statistics' registers it spilled (ptxas)
        const int64_t done = *static_cast<volatile unsigned*>(&tickets[turn]);
        if (done < row_groups) {
          release_add(tile_rows_written + done * rows_per_block / tile_rows, unsigned(schedule.rows_of_group(done)));
        }
      }
    }
  } else if constexpr (kTiled) {
    // A tile's rows, then (behind a barrier, which also makes the block's global writes
    // visible to the whole block) its transpose. A shared tile needs a second barrier, so
    // that the next tile's rows do not overwrite slots still being read; rows staged in
    // the row-wise copy go to new addresses.
    const int64_t tiles = (p.rows + tile_rows - 1) / tile_rows;
    uint8_t* out_t = static_cast<uint8_t*>(p.output_t);
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const int64_t tile_first = tile * tile_rows;
      for (int sub = 0; sub < tile_rows; sub += rows_per_block) normalize_rows(tile_first + sub, tile_first, [] {});
      __syncthreads();
      if constexpr (kTile == NormTile::kShared) {
        const int slots = hidden / kChunk;
        store_tile_transposed([&](int r, int slot) { return transpose_tile[tile_slot(r, slot, slots, tile_rows)]; },
                              out_t, tile_first, p.rows, hidden, tile_rows);
        __syncthreads();
      } else {
        const uint8_t* staged = static_cast<const uint8_t*>(p.output) + tile_first * p.hidden;
        store_tile_transposed(
            [&](int r, int slot) {
              return *reinterpret_cast<const uint2*>(staged + int64_t(r) * p.hidden + slot * kChunk);
            },
            out_t, tile_first, p.rows, hidden, tile_rows);
      }
    }
  } else {
    for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < p.rows;
         first += int64_t(gridDim.x) * rows_per_block) {
      normalize_rows(first, 0, [] {});
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
          group_amax_to_global<kMaxWarps, kImmediateBarrier>(amax, p.amax, group);
        } else {
          block_amax_to_global<kMaxWarps>(amax, p.amax);
        }
      }
    }
    if (fp8 && p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  }
}

}  // namespace norm_kernels
}  // namespace opente
