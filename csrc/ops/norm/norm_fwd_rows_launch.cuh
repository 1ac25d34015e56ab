// The row forward's launch for one input dtype, y dtype and kind of call: picks the
// register kernel (norm_fwd_kernel.cuh) by the row shape's bucket and form, and its
// grid. norm_fwd.cu turns a call's dtypes into the template arguments; the
// norm_fwd_rows_<y dtype>.cu files instantiate it, a file a y dtype, so that the
// forward's ~150 kernels compile in parallel: in one file they took 64 s of a
// 100 s clean build of the core on 2 cores, and were the whole build's longest step
// on 16 (README, build times).
#pragma once

#include <algorithm>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_fwd_kernel.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {

template <te_dtype kIn, te_dtype kOut, bool kVec, bool kAmax>
void launch_norm_fwd_rows(const NormFwdParams& p, const NormRowShape& shape, int device, void* stream) {
  using norm_kernels::kIsFp8;
  using norm_kernels::norm_fwd_rows_kernel;
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
    // A float y's amax where a row takes the whole block (hidden > 4096: one row group of
    // 160-512 threads) keeps a block a row, as without the amax: H100, two rounds each,
    // layernorm and rmsnorm at 2048-16384 x 5120-16384 1.0-3.3% faster so. An FP8 y there
    // keeps the cap and the pairs: layernorm's was 1.4-6.3% slower a block a row
    // (benchmarks/RESULTS.md, norm section, sixty-eighth session).
    const bool capped = takes_amax && (shape.rows_per_block > 1 || is_fp8(p.out_dtype));
    const int amax_waves = shape.threads_per_row < 32 ? 2 : kReducingKernelWaves;
    int64_t grid = norm_resident_grid(reinterpret_cast<const void*>(kernel), shape, 0, p.rows, device,
                                      capped ? amax_waves : kUncappedWaves);
    if (capped) {
      const int64_t row_groups = (p.rows + shape.rows_per_block - 1) / shape.rows_per_block;
      grid = std::max<int64_t>(1, std::min(grid, (row_groups + 1) / 2));
    }
    kernel<<<unsigned(grid), unsigned(shape.block_threads()), 0, as_stream(stream)>>>(
        p, shape.threads_per_row, shape.rows_per_block, 0, 1.0f / float(p.hidden), NormTrailingArgs{});
    check_launch("norm_fwd_rows_kernel");
  };
  // the one switch from the shape's bucket and the norm to template arguments
  const bool layernorm = p.type == NormType::kLayerNorm;
  constexpr bool k16BitRows = kVec && kIn != TE_DTYPE_FLOAT32;  // fp32 rows (72-128 registers): not measured
  auto launch_form = [&](auto chunks_tag, auto form_tag) {
    constexpr int kChunks = decltype(chunks_tag)::value;
    constexpr NormRowForm kForm = decltype(form_tag)::value;
    if (layernorm) {
      launch(norm_fwd_rows_kernel<kIn, kOut, kChunks, true, kVec, kAmax, NormTile::kNone, kForm>);
    } else {
      launch(norm_fwd_rows_kernel<kIn, kOut, kChunks, false, kVec, kAmax, NormTile::kNone, kForm>);
    }
  };
  // The extra chunk counts (norm_fwd_row_shape), for 16-bit rows with a y in x's dtype or
  // FP8 (the other ys keep the buckets' 2 and 4): three chunks a thread for the hidden <=
  // 512 bucket's rows that two leave lanes idle, 5 for rows of 257-320 on 8 lanes and
  // 513-640 on half a warp, 5 or 6 for rows of 1025-1536 on one warp.
  constexpr bool kExtraChunkRows = k16BitRows && (kOut == kIn || kIsFp8<kOut>);
  using SmallChunks = std::integral_constant<int, kNormFwdSmallChunks>;
  using SmallOddChunks = std::integral_constant<int, kNormFwdSmallOddChunks>;
  using Chunks = std::integral_constant<int, kNormFwdChunks>;
  using WideForm = std::integral_constant<NormRowForm, NormRowForm::kWide>;
  if (shape.chunks != kNormFwdSmallChunks && shape.chunks != kNormFwdChunks) {
    if constexpr (kExtraChunkRows) {
      switch (shape.chunks) {
        case kNormFwdSmallOddChunks:
          launch_form(SmallOddChunks{}, std::integral_constant<NormRowForm, NormRowForm::kImmediates>{});
          return;
        case 5: launch_form(std::integral_constant<int, 5>{}, WideForm{}); return;
        case 6: launch_form(std::integral_constant<int, 6>{}, WideForm{}); return;
      }
    }
    // norm_fwd_cuda's extra_chunk_rows and kExtraChunkRows disagree, or norm_fwd_row_shape gave another count
    fail(TE_ERROR_INTERNAL, concat("norm forward: no row kernel of ", shape.chunks, " chunks for this call"));
  }
  switch (norm_fwd_row_form(shape, k16BitRows, p.type)) {
    case NormRowForm::kImmediates:
      // rows of up to 512 elements, groups of a warp or less: they pass no named barrier,
      // and the immediates leave these kernels 9 barriers (H100, FP8 y: rmsnorm 1-3% faster
      // than with 16 reserved, layernorm within 1%). Bounded to 48 registers, 5 blocks an SM
      // where 64 held layernorm's to 4 (H100, one build, alternating rounds, FP8 y, us):
      // 65536 x 512 46.5 -> 45.2, 131072 x 512 85.5 -> 82.4, 262144 x 64 24.0 -> 23.6;
      // rmsnorm's took 48 under either bound
      launch_form(SmallChunks{}, std::integral_constant<NormRowForm, NormRowForm::kImmediates>{});
      break;
    case NormRowForm::kCompact:
      // 16-bit rows only (norm_fwd_row_form's compact_allowed): the others fall through
      if constexpr (k16BitRows) {
        launch_form(Chunks{}, std::integral_constant<NormRowForm, NormRowForm::kCompact>{});
        break;
      }
      [[fallthrough]];
    case NormRowForm::kWide:
      launch_form(Chunks{}, WideForm{});
      break;
  }
}

// An explicit instantiation of launch_norm_fwd_rows (one a line in the norm_fwd_rows_*.cu files)
#define OPENTE_NORM_FWD_ROWS(IN, OUT, VECTORIZED, FLOAT_AMAX)      \
  template void launch_norm_fwd_rows<IN, OUT, VECTORIZED, FLOAT_AMAX>( \
      const NormFwdParams&, const NormRowShape&, int, void*)

}  // namespace opente
