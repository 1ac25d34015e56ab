// Both FP8 copies of the norm forward in one pass: the register kernel
// (norm_fwd_kernel.cuh) in its tiled form. A block normalizes a tile of consecutive
// rows with the forward's row groups, writes their row-wise FP8 bytes and keeps them
// (in shared memory, or in the L2 as the row-wise copy's lines), then writes the tile's
// transpose from there, so the input is read once from DRAM and neither copy is read
// back from it; rows too wide for a tile a block in the L2 take the trailing tiles
// (norm_trailing.h), transposed by the blocks that come two waves of rows after. The two
// passes it replaces (the row kernel, then the byte transpose reading the row-wise copy
// again) move 2 + 1 + 1 + 1 bytes an element where this moves 2 + 1 + 1. This file
// decides whether a call takes it; the launch is norm_fwd_tiled_launch.cuh's, compiled in
// norm_fwd_tiled_e4m3.cu and norm_fwd_tiled_e5m2.cu.
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_launch.h"
#include "ops/norm/norm_trailing.h"

namespace opente {

namespace {

NormFwdTileShape tile_shape_of(const NormFwdParams& p, int device) {
  return norm_fwd_tile_shape(p.hidden, p.output != nullptr, p.rows, p.in_dtype == TE_DTYPE_FLOAT32, p.type,
                             size_t(max_block_shared_memory(device)));
}

}  // namespace

bool norm_fwd_tiled_takes(const NormFwdParams& p, int device, const void* workspace, size_t workspace_size) {
  // 8-byte pieces of the transposed copy: rows % 8 == 0, both outputs 8-byte aligned;
  // 16-byte vectors of the row (hidden % 8 == 0 by norm_fwd_tile_shape). The cheap
  // tests go first: every norm forward asks, most without a transposed copy.
  if (!(p.output_t && is_fp8(p.out_dtype) && p.rows > 0 && p.rows % 8 == 0 && is_aligned(p.input, 16) &&
        is_aligned(p.gamma, 16) && (p.beta == nullptr || is_aligned(p.beta, 16)) &&
        (p.output == nullptr || is_aligned(p.output, 8)) && is_aligned(p.output_t, 8))) {
    return false;
  }
  const NormFwdTileShape tile = tile_shape_of(p, device);
  if (tile.tile == NormTile::kTrailing) {
    // its counters in the workspace, tickets (row groups and the lag) within 32 bits, and a
    // device whose memory does not outrun its SMs (timed on an H100 alone; where rows are
    // bound by the SMs' instructions, as on an H200, its transposes add to them)
    return is_aligned(workspace, alignof(unsigned)) &&
           workspace_size >= norm_trailing_counter_bytes(p.rows, tile.tile_rows) && p.rows < (int64_t(1) << 30) &&
           !norm_memory_outruns_sms(device);
  }
  return tile.taken();
}

void norm_fwd_tiled_cuda(const NormFwdParams& p, int device, void* workspace, void* stream) {
  DeviceGuard guard(device);
  const NormFwdTileShape tile = tile_shape_of(p, device);
  // the call's dtypes to template arguments; the launch by tile shape is launch_norm_fwd_tiled's
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_fp8_dtype(p.out_dtype, [&](auto out_tag) {
      unsigned* const counters = static_cast<unsigned*>(workspace);  // the trailing tiles'
      launch_norm_fwd_tiled<decltype(in_tag)::value, decltype(out_tag)::value>(p, tile, device, counters, stream);
    });
  });
}

}  // namespace opente
