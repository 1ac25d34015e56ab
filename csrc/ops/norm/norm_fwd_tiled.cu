// Both FP8 copies of the norm forward in one pass: the register kernel
// (norm_fwd_kernel.cuh) in its tiled form. A block normalizes a tile of consecutive
// rows with the forward's row groups, writes their row-wise FP8 bytes and keeps them
// (in shared memory, or in the L2 as the row-wise copy's lines), then writes the tile's
// transpose from there, so the input is read once from DRAM and neither copy is read
// back from it. The two passes it replaces (the row kernel, then the byte transpose
// reading the row-wise copy again) move 2 + 1 + 1 + 1 bytes an element where this
// moves 2 + 1 + 1.
#include <algorithm>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_fwd_kernel.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {

using norm_kernels::norm_fwd_rows_kernel;

namespace {

NormFwdTileShape tile_shape_of(const NormFwdParams& p, int device) {
  return norm_fwd_tile_shape(p.hidden, p.output != nullptr, p.rows, p.in_dtype == TE_DTYPE_FLOAT32, p.type,
                             size_t(max_block_shared_memory(device)));
}

}  // namespace

bool norm_fwd_tiled_takes(const NormFwdParams& p, int device) {
  // 8-byte pieces of the transposed copy: rows % 8 == 0, both outputs 8-byte aligned;
  // 16-byte vectors of the row (hidden % 8 == 0 by norm_fwd_tile_shape). The cheap
  // tests go first: every norm forward asks, most without a transposed copy.
  return p.output_t && is_fp8(p.out_dtype) && p.rows > 0 && p.rows % 8 == 0 && is_aligned(p.input, 16) &&
         is_aligned(p.gamma, 16) && (p.beta == nullptr || is_aligned(p.beta, 16)) &&
         (p.output == nullptr || is_aligned(p.output, 8)) && is_aligned(p.output_t, 8) &&
         tile_shape_of(p, device).taken();
}

void norm_fwd_tiled_cuda(const NormFwdParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  const NormFwdTileShape tile = tile_shape_of(p, device);
  auto launch = [&](auto kernel) {
    // the kernel takes an amax (four waves at most, as norm_fwd_cuda's), and a block
    // at least a tile
    const int64_t tiles = (p.rows + tile.tile_rows - 1) / tile.tile_rows;
    const int64_t grid = std::min(tiles, norm_resident_grid(reinterpret_cast<const void*>(kernel), tile.rows,
                                                            tile.smem_bytes(), p.rows, device, kReducingKernelWaves));
    kernel<<<unsigned(grid), unsigned(tile.rows.block_threads()), tile.smem_bytes(), as_stream(stream)>>>(
        p, tile.rows.threads_per_row, tile.rows.rows_per_block, tile.tile_rows, 1.0f / float(p.hidden));
    check_launch("norm_fwd_rows_kernel (tiled)");
  };
  // the tiled rows hold kNormFwdChunks (hidden > 512), or the small bucket's two or three
  // (16-bit rows only, in their immediates form), or 5-6 for 16-bit one-warp rows
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_fp8_dtype(p.out_dtype, [&](auto out_tag) {
      constexpr te_dtype kIn = decltype(in_tag)::value, kOut = decltype(out_tag)::value;
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
    });
  });
}

}  // namespace opente
