// The tiled forward's launch (both FP8 copies in one pass, norm_fwd_tiled.cu) for one
// input dtype and FP8 dtype: picks the register kernel's tiled form
// (norm_fwd_kernel.cuh) by the tile shape, and its grid. norm_fwd_tiled.cu turns a
// call's dtypes into the template arguments; norm_fwd_tiled_e4m3.cu and
// norm_fwd_tiled_e5m2.cu instantiate it, so that the two halves of its kernels
// compile in parallel.
#pragma once

#include <algorithm>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_fwd_kernel.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {

template <te_dtype kIn, te_dtype kOut>
void launch_norm_fwd_tiled(const NormFwdParams& p, const NormFwdTileShape& tile, int device, unsigned* counters,
                           void* stream) {
  using norm_kernels::norm_fwd_rows_kernel;
  auto launch = [&](auto kernel) {
    const void* const kernel_address = reinterpret_cast<const void*>(kernel);
    NormTrailingArgs trailing;
    int64_t grid;
    if (tile.tile == NormTile::kTrailing) {
      // one wave (the blocks take row groups by ticket), the lag two of its waves; the
      // counters zeroed on the stream before it
      grid = norm_resident_grid(kernel_address, tile.rows, 0, p.rows, device, 1);
      trailing.counters = counters;
      trailing.lag = norm_trailing_lag(grid, tile.rows.rows_per_block, tile.tile_rows);
      const NormTrailingSchedule schedule{p.rows, p.hidden, tile.rows.rows_per_block, tile.tile_rows, trailing.lag};
      trailing.row_groups = schedule.row_groups();
      trailing.tickets = schedule.tickets();
      cuda_check(cudaMemsetAsync(counters, 0, norm_trailing_counter_bytes(p.rows, tile.tile_rows), as_stream(stream)),
                 "cudaMemsetAsync(norm forward's trailing counters)");
    } else {
      // the kernel takes an amax (four waves at most, as launch_norm_fwd_rows'), and a block
      // at least a tile
      const int64_t tiles = (p.rows + tile.tile_rows - 1) / tile.tile_rows;
      grid = std::min(tiles, norm_resident_grid(kernel_address, tile.rows, tile.smem_bytes(), p.rows, device,
                                                kReducingKernelWaves));
    }
    kernel<<<unsigned(grid), unsigned(tile.rows.block_threads()), tile.smem_bytes(), as_stream(stream)>>>(
        p, tile.rows.threads_per_row, tile.rows.rows_per_block, tile.tile_rows, 1.0f / float(p.hidden), trailing);
    check_launch("norm_fwd_rows_kernel (tiled)");
  };
  // the tiled rows hold kNormFwdChunks (hidden > 512), or the small bucket's two or three
  // (16-bit rows only, in their immediates form), or 5-6 for 16-bit one-warp rows
  auto by_norm = [&](auto chunks_tag, auto tile_tag, auto form_tag) {
    constexpr int kChunks = decltype(chunks_tag)::value;
    constexpr NormTile kTile = decltype(tile_tag)::value;
    constexpr NormRowForm kForm = decltype(form_tag)::value;
    if (p.type == NormType::kLayerNorm) {
      launch(norm_fwd_rows_kernel<kIn, kOut, kChunks, true, true, false, kTile, kForm>);
    } else {
      launch(norm_fwd_rows_kernel<kIn, kOut, kChunks, false, true, false, kTile, kForm>);
    }
  };
  using Shared = std::integral_constant<NormTile, NormTile::kShared>;
  using FromRowwiseCopy = std::integral_constant<NormTile, NormTile::kRowwiseCopy>;
  using Trailing = std::integral_constant<NormTile, NormTile::kTrailing>;
  using Wide = std::integral_constant<NormRowForm, NormRowForm::kWide>;
  using Immediates = std::integral_constant<NormRowForm, NormRowForm::kImmediates>;
  using Chunks = std::integral_constant<int, kNormFwdChunks>;
  if (tile.rows.chunks == kNormFwdSmallChunks || tile.rows.chunks == kNormFwdSmallOddChunks) {
    if constexpr (kIn != TE_DTYPE_FLOAT32) {
      if (tile.rows.chunks == kNormFwdSmallOddChunks) {  // hidden 384
        by_norm(std::integral_constant<int, kNormFwdSmallOddChunks>{}, Shared{}, Immediates{});
      } else {
        by_norm(std::integral_constant<int, kNormFwdSmallChunks>{}, Shared{}, Immediates{});
      }
    } else {
      // norm_fwd_tile_shape keeps fp32 rows of the small bucket on the two passes (the
      // C++ test NormRowShape.TiledForward checks it): were that to change, say so
      fail(TE_ERROR_INTERNAL, "norm forward (tiled): no small-row tile kernel for fp32 rows");
    }
    return;
  }
  if (tile.tile == NormTile::kShared) {
    by_norm(Chunks{}, Shared{}, Wide{});
  } else if (tile.tile == NormTile::kTrailing) {
    // 16-bit rows past 7168 with the row kernel's four chunks (NormRowShape.TiledForward)
    if constexpr (kIn != TE_DTYPE_FLOAT32) {
      if (tile.rows.chunks == kNormFwdChunks) {
        by_norm(Chunks{}, Trailing{}, Wide{});
        return;
      }
    }
    fail(TE_ERROR_INTERNAL, concat("norm forward (trailing tiles): no kernel of ", tile.rows.chunks,
                                   " chunks for these rows"));
  } else if (tile.rows.chunks == kNormFwdChunks) {
    by_norm(Chunks{}, FromRowwiseCopy{}, Wide{});
  } else {
    // 16-bit rows of 1025-1536 on one warp, the row kernel's groups (norm_fwd_row_shape);
    // fp32 rows keep four chunks, and no other count reaches here (NormRowShape.TiledForward)
    if constexpr (kIn != TE_DTYPE_FLOAT32) {
      switch (tile.rows.chunks) {
        case 5: by_norm(std::integral_constant<int, 5>{}, FromRowwiseCopy{}, Wide{}); return;
        case 6: by_norm(std::integral_constant<int, 6>{}, FromRowwiseCopy{}, Wide{}); return;
      }
    }
    fail(TE_ERROR_INTERNAL,
         concat("norm forward (tiled): no kernel of ", tile.rows.chunks, " chunks for these rows"));
  }
}

// An explicit instantiation of launch_norm_fwd_tiled (one a line in norm_fwd_tiled_e4m3.cu and
// norm_fwd_tiled_e5m2.cu)
#define OPENTE_NORM_FWD_TILED(IN, OUT) \
  template void launch_norm_fwd_tiled<IN, OUT>(const NormFwdParams&, const NormFwdTileShape&, int, unsigned*, void*)

}  // namespace opente
