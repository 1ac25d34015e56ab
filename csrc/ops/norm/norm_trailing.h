// The schedule of the trailing tiles (NormTile::kTrailing, norm_fwd_kernel.cuh): both FP8
// copies of the norm forward in one pass for rows too wide for a block to keep a tile of
// its own in the L2 or in shared memory.
//
// The blocks take row groups in order from a counter (a ticket each, the row group of
// that number), normalize them and write the row-wise FP8 copy, as the row kernel does.
// Each ticket then also writes a share of the transposed copy: the share of row group
// `ticket - lag`, i.e. 1 / (tile_rows / rows_per_block) of the transpose of the tile that
// row group lies in, read back from the row-wise copy in the L2. `lag` (about two waves of
// row groups) is long enough for that tile's rows to have been written by the blocks
// before it, so that a ticket seldom waits, and short enough that the rows written but
// not yet transposed (a few waves: 9-13 MB on an H100 at any width) stay in the L2. The
// row-wise copy is then read from the L2 rather than DRAM, so DRAM moves 2 + 1 + 1 bytes
// an element where the two passes (the row kernel, then the byte transpose) move 2 + 1 +
// 1 + 1; a tile a block (NormTile::kRowwiseCopy) held 264 tiles in flight, which outgrew
// the L2 from hidden 4096 (benchmarks/RESULTS.md, twenty-third session).
//
// A tile's rows count up a counter as their row groups are written (a release after the
// block's barrier); a share waits for its tile's count (thread 0's polls, then the block's
// barrier: norm_kernels_common.cuh's wait_until_at_least) before reading it.
// Every row group a share waits for has a smaller ticket than the share's own (lag is at
// least the row groups of a tile), and tickets are taken in order by blocks that are
// running, so no wait can be on a block that has not started: the grid needs no
// co-residency. Tickets run past the last row group by `lag`, those only transposing.
//
// Plain C++ (with the CUDA qualifiers under nvcc), so that the CPU tests check that the
// shares cover every tile's transpose once and wait only on earlier tickets.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define OPENTE_NORM_HOST_DEVICE __host__ __device__
#else
#define OPENTE_NORM_HOST_DEVICE
#endif

namespace opente {

// Transposing units of a tile: an 8 x 8 byte block (8 rows of one 8-byte slot of the
// row-wise copy), row blocks fastest, so a warp's column stores write tile_rows
// consecutive bytes (whole 32-byte sectors) of 8 columns.
struct NormTrailingShare {
  int64_t tile = -1;  // -1: none (the first `lag` tickets)
  int64_t unit_begin = 0, unit_end = 0;
};

struct NormTrailingSchedule {
  int64_t rows = 0;
  int64_t hidden = 0;       // a multiple of 8
  int rows_per_block = 1;   // a power of two dividing tile_rows
  int tile_rows = 32;       // a multiple of 8
  int64_t lag = 0;          // >= tile_rows / rows_per_block

  OPENTE_NORM_HOST_DEVICE int64_t row_groups() const { return (rows + rows_per_block - 1) / rows_per_block; }
  OPENTE_NORM_HOST_DEVICE int64_t tickets() const { return row_groups() + lag; }
  OPENTE_NORM_HOST_DEVICE int64_t tiles() const { return (rows + tile_rows - 1) / tile_rows; }
  // the rows of row group g (the last may be short), and of tile t: what its counter reaches
  OPENTE_NORM_HOST_DEVICE int rows_of_group(int64_t g) const {
    const int64_t left = rows - g * rows_per_block;
    return int(left < rows_per_block ? left : rows_per_block);
  }
  OPENTE_NORM_HOST_DEVICE int rows_of_tile(int64_t t) const {
    const int64_t left = rows - t * tile_rows;
    return int(left < tile_rows ? left : tile_rows);
  }
  OPENTE_NORM_HOST_DEVICE int row_blocks() const { return tile_rows / 8; }
  OPENTE_NORM_HOST_DEVICE int64_t units_per_tile() const { return int64_t(row_blocks()) * (hidden / 8); }
  // What ticket `ticket` transposes: the share of row group ticket - lag, one part of its
  // tile's units for each row group the tile has (tile_rows / rows_per_block, fewer in a
  // short last tile; the last parts a unit longer where they do not divide).
  OPENTE_NORM_HOST_DEVICE NormTrailingShare share(int64_t ticket) const {
    NormTrailingShare s;
    const int64_t group = ticket - lag;
    if (group < 0 || group >= row_groups()) return s;
    const int64_t first_row = group * rows_per_block;
    s.tile = first_row / tile_rows;
    const int parts = (rows_of_tile(s.tile) + rows_per_block - 1) / rows_per_block;
    const int part = int(first_row % tile_rows) / rows_per_block;
    s.unit_begin = units_per_tile() * part / parts;
    s.unit_end = units_per_tile() * (part + 1) / parts;
    return s;
  }
};

// The forward kernel's argument for the trailing form (empty for the others): the
// counters (zeroed before the launch) and the lag.
struct NormTrailingArgs {
  unsigned* counters = nullptr;  // [0]: the next ticket; [1 + t]: tile t's rows written
  int64_t lag = 0;
  // the schedule's row_groups() and tickets(), worked out by the launch: in the kernel's
  // parameters rather than in registers (LayerNorm's kernel spilled its amax with them)
  int64_t row_groups = 0, tickets = 0;
};

// The counters a call of the trailing form needs zeroed in its workspace: the next
// ticket, then a tile's written rows for every tile.
inline size_t norm_trailing_counter_bytes(int64_t rows, int tile_rows) {
  return sizeof(unsigned) * size_t(1 + (rows + tile_rows - 1) / tile_rows);
}

}  // namespace opente
