// Both FP8 copies of the norm forward in one pass: the register kernel
// (norm_fwd_kernel.cuh) in its tiled form. A block normalizes a tile of consecutive
// rows with the forward's row groups, writes their row-wise FP8 bytes and keeps them
// (in shared memory, or in the L2 as the row-wise copy's lines), then writes the tile's
// transpose from there, so the input is read once from DRAM and neither copy is read
// back from it. The two passes it replaces (the row kernel, then the byte transpose
// reading the row-wise copy again) move 2 + 1 + 1 + 1 bytes an element where this
// moves 2 + 1 + 1. This file decides whether a call takes it; the launch is
// norm_fwd_tiled_launch.cuh's, compiled in norm_fwd_tiled_e4m3.cu and norm_fwd_tiled_e5m2.cu.
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_launch.h"

namespace opente {

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
  // the call's dtypes to template arguments; the launch by tile shape is launch_norm_fwd_tiled's
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_fp8_dtype(p.out_dtype, [&](auto out_tag) {
      launch_norm_fwd_tiled<decltype(in_tag)::value, decltype(out_tag)::value>(p, tile, device, stream);
    });
  });
}

}  // namespace opente
