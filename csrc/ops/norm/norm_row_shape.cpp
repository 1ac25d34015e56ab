// Launch shapes of the norm kernels (norm_launch.h): plain C++, so the CPU test
// suite checks them for every hidden size.
#include <algorithm>

#include "ops/norm/norm_launch.h"

namespace opente {

namespace {

// Threads a row needs when each keeps `elements` columns: up to 32, the next power
// of two (the row's lanes then align inside a warp and reduce with shuffles alone);
// above, whole warps, at most kNormMaxBlockThreads. 0 when the row does not fit.
int threads_per_row(int64_t hidden, int elements) {
  const int64_t needed = (hidden + elements - 1) / elements;
  if (needed <= 32) {
    int threads = 1;
    while (threads < needed) threads *= 2;
    return threads;
  }
  const int64_t threads = (needed + 31) / 32 * 32;
  return threads <= kNormMaxBlockThreads ? int(threads) : 0;
}

// The columns a row group of `shape` covers: hidden and those past it.
int columns_covered(const NormRowShape& shape) { return shape.threads_per_row * shape.chunks * 8; }

NormRowShape row_shape(int64_t hidden, int chunks, int target_block_threads) {
  const int threads = threads_per_row(hidden, chunks * 8);
  if (threads == 0) return {};
  NormRowShape shape;
  shape.chunks = chunks;
  shape.threads_per_row = threads;
  shape.rows_per_block = std::max(1, target_block_threads / threads);
  return shape;
}

}  // namespace

// Forward: 16 elements a thread up to hidden 512 (2 chunks: short rows spread over
// more lanes), 32 above (4 chunks), so hidden 1024 is a warp a row and 4096 four
// warps. Only x lives in registers across the row, in its dtype (gamma and beta
// are read per chunk where y is formed): at most 64 registers for a 16-bit input,
// 56-92 for fp32 (ptxas, sm_90a, CUDA 13.0). Blocks of 256 threads: four blocks an
// SM for 16-bit rows, whose reductions and loads interleave.
// In the hidden <= 512 bucket, with `extra_chunk_rows`, 3 chunks (24 elements a thread)
// where their lanes hold fewer columns past the row than 2 chunks' (a tie keeps 2). H100,
// bf16 rows, one build, alternating rounds, us, two chunks / three: FP8 y, layernorm 65536 x
// 384 39.1 / 30.4, 131072 x 320 69.1 / 54.3, 262144 x 192 71.4 / 61.3, 262144 x 96 38.4 /
// 32.2; rmsnorm 32.7 / 28.5, 58.6 / 51.4, 63.1 / 59.0, 32.4 / 30.4; bf16 y, layernorm 42.8 /
// 39.8, 76.0 / 64.3, 80.9 / 75.6, 43.2 / 39.5 (rmsnorm 2-6% faster). Four chunks at the
// powers of two (a full row on fewer lanes) were 1-4% faster for layernorm's FP8 y at
// 128-512 but up to 37% slower for rmsnorm, and 0-13% slower with a bf16 y: not taken
// (benchmarks/RESULTS.md, thirtieth session).
// With `extra_chunk_rows`, rows of 1025-1536 on one warp of 5 or 6 chunks a thread, where 4
// chunks took two warps (a named barrier in every reduction) and, at hidden = 128 mod 256,
// left half of one warp's last chunk idle. H100, bf16 rows, one build, alternating rounds,
// FP8 y, us, two warps / one: layernorm 32768 x 1152 53.5 / 48.1, 16384 x 1152 29.5 / 24.5,
// 32768 x 1280 55.3 / 51.6, 32768 x 1408 59.8 / 56.8, 32768 x 1536 62.0 / 60.5; rmsnorm
// 48.9 / 46.0, 25.9 / 22.0, 51.5 / 49.7, 56.1 / 54.4, 59.3 / 58.4; with a bf16 y within
// +-1% to 7% faster (benchmarks/RESULTS.md, thirtieth session). Rows of 513-640 on half a
// warp of 5 chunks where 4 took a warp and left part of its third chunk idle (the 5-chunk
// kernels are the one-warp rows'), us, a warp / half: FP8 y, layernorm 65536 x 640 56.1 /
// 52.8, 65536 x 576 54.0 / 48.4, 65536 x 520 52.6 / 46.3; rmsnorm 52.2 / 50.7, 49.3 / 46.9,
// 46.9 / 44.6; bf16 y 0-9% faster.
// Rows of 257-320 on 8 lanes of 5 chunks (the same kernels), where three chunks took 16 lanes
// and left a sixth of the columns idle, us, three / five: FP8 y, layernorm 131072 x 320 54.4 /
// 52.1, 65536 x 320 28.3 / 25.6; rmsnorm 51.3 / 50.4, 24.1 / 24.1; bf16 y within 1%. Shorter
// rows were not taken: at 160 (4 lanes) rmsnorm's FP8 y lost 2.5%, at 80 (2 lanes) both norms
// 12-23% (benchmarks/RESULTS.md, thirty-first session).
NormRowShape norm_fwd_row_shape(int64_t hidden, bool extra_chunk_rows) {
  if (hidden > kNormFwdMaxRegisterHidden) return {};
  if (extra_chunk_rows && hidden >= kNormFwdWarpRowMinHidden && hidden <= kNormFwdWarpRowMaxHidden) {
    return row_shape(hidden, norm_fwd_warp_row_chunks(hidden), 256);
  }
  if (hidden > kNormFwdSmallMaxHidden) {
    const NormRowShape four = row_shape(hidden, kNormFwdChunks, 256);
    if (extra_chunk_rows && hidden <= kNormFwdHalfWarpRowMaxHidden) {
      const NormRowShape five = row_shape(hidden, kNormFwdFiveChunks, 256);
      if (columns_covered(five) < columns_covered(four)) return five;
    }
    return four;
  }
  const NormRowShape two = row_shape(hidden, kNormFwdSmallChunks, 256);
  if (!extra_chunk_rows) return two;
  if (hidden >= kNormFwdEightLaneRowMinHidden && hidden <= kNormFwdEightLaneRowMaxHidden) {
    return row_shape(hidden, kNormFwdFiveChunks, 256);
  }
  const NormRowShape three = row_shape(hidden, kNormFwdSmallOddChunks, 256);
  return columns_covered(three) < columns_covered(two) ? three : two;
}

namespace {

// Hopper's SM: 64K registers, 64 warps, 64 named barriers.
constexpr int kSmRegisters = 65536, kSmWarps = 64, kSmBarriers = 64;

// The registers a thread ptxas leaves a kernel bounded by __launch_bounds__(max_threads,
// min_blocks): whole 8-register steps.
constexpr int bounded_registers(int max_threads, int min_blocks) {
  return kSmRegisters / (max_threads * min_blocks) / 8 * 8;
}

// Blocks of `block_threads` an SM may hold at `registers` a thread, each block reserving
// `barriers`.
int resident_blocks(int block_threads, int registers, int barriers) {
  const int warps = block_threads / 32;
  const int by_registers = kSmRegisters / (registers * 32) / warps;  // whole warps' registers
  return std::min({by_registers, kSmWarps / warps, kSmBarriers / barriers});
}

// Row groups for a 32-row tile in a block of up to `block_threads`: the row kernel's for the
// same call (16-bit rows: its extra chunk counts, so the same sums), whole rows (whole warps
// above hidden 1024), as many as fit, a power of two so that they divide the tile, at most
// kNormFwdStagedMaxRowsPerBlock (their named barriers) where a row takes several warps and
// kNormFwdStagedMaxWarpRowsPerBlock where it takes one. H100, both FP8 copies, one-warp rows
// of 1152-1536 (bf16, us), 8 / 16 / 32 of them a block: layernorm 32768 x 1152 65.9 / 64.0 /
// 68.8, 32768 x 1280 73.0 / 69.7 / 73.4, 32768 x 1536 89.8 / 83.5 / 86.0; rmsnorm 64.7 / 62.4
// / 64.4, 71.8 / 68.5 / 69.0, 88.0 / 82.2 / 82.2; the two-warp rows' tile (8 a block) took
// 71.5, 74.1, 83.9 and 65.6, 69.8, 80.8 (benchmarks/RESULTS.md, thirtieth session).
NormRowShape tile_row_groups(int64_t hidden, int block_threads, bool fp32_input) {
  NormRowShape rows = norm_fwd_row_shape(hidden, /*extra_chunk_rows=*/!fp32_input);
  const int max_groups =
      rows.threads_per_row > 32 ? kNormFwdStagedMaxRowsPerBlock : kNormFwdStagedMaxWarpRowsPerBlock;
  int rows_per_block = 1;
  while (2 * rows_per_block * rows.threads_per_row <= block_threads && 2 * rows_per_block <= max_groups) {
    rows_per_block *= 2;
  }
  rows.rows_per_block = rows_per_block;
  return rows;
}

}  // namespace

// H100, FP8 y (bf16 -> E4M3), one build, alternating rounds, us, kCompact / kWide
// (benchmarks/RESULTS.md, twenty-sixth session): layernorm 16384 x 2560 54.1 / 57.5,
// 16384 x 5120 97.1 / 110.1, 8192 x 9216 89.1 / 95.6, 4096 x 12288 63.2 / 68.6. Where both
// hold as many blocks an SM (blocks of 256 threads, 320, 416-512) kWide's barrier numbers
// in a register were 1-3% faster than the immediates' switch (twenty-fifth session), so
// a tie keeps kWide. RMSNorm's kWide kernels take 56 registers, LayerNorm's 64 (ptxas,
// sm_90a), so at 8193-9216 and 10241-12288 kCompact adds RMSNorm no block; taken there
// with LayerNorm's figures it cost RMSNorm up to 1% (twenty-seventh session, same A/B:
// 4096 x 11264 56.7 / 56.2, 4096 x 12288 60.4 / 59.7; 8192 x 9216 85.0 both).
NormRowForm norm_fwd_row_form(const NormRowShape& shape, bool compact_allowed, NormType type) {
  if (shape.chunks == kNormFwdSmallChunks || shape.chunks == kNormFwdSmallOddChunks) return NormRowForm::kImmediates;
  const int threads = shape.block_threads();
  if (!compact_allowed || !shape.in_registers() || shape.threads_per_row <= 32 || threads > kNormFwdCompactMaxThreads) {
    return NormRowForm::kWide;
  }
  // a barrier number in a register reserves all 16 of the block's barriers
  constexpr int kWideBarriers = 16, kImmediateBarriers = kNormMaxRowGroupBarrier + 1;
  constexpr int kWideRegisters = bounded_registers(kNormMaxBlockThreads, kNormFwdWideMinBlocks);
  constexpr int kRmsWideRegisters = 56;  // what ptxas gives RMSNorm's kWide kernels under the same bound
  constexpr int kCompactRegisters = bounded_registers(kNormFwdCompactMaxThreads, kNormFwdCompactMinBlocks);
  static_assert(kWideRegisters == 64 && kCompactRegisters == 56, "the figures norm_launch.h gives");
  const bool rmsnorm = type == NormType::kRMSNorm;
  const int wide = resident_blocks(threads, rmsnorm ? kRmsWideRegisters : kWideRegisters, kWideBarriers);
  const int compact = resident_blocks(threads, kCompactRegisters, kImmediateBarriers);
  return compact > wide ? NormRowForm::kCompact : NormRowForm::kWide;
}

// The tiled forward. 16-bit rows of hidden 128, 256 and 512 (the hidden <= 512 bucket's
// rows that fill their lanes) keep a 64-row tile in shared memory with the row kernel's row
// groups (2 chunks, kImmediates), in its 256-thread blocks, four an SM at 64 registers.
// H100, bf16, FP8 y and y^T, against the two passes (the row kernel, then the byte
// transpose), us: layernorm 262144 x 128 62.5 -> 60.3, 262144 x 256 129.8 -> 113.2,
// 131072 x 512 129.4 -> 113.5, 262144 x 512 257.1 -> 221.6, 65536 x 512 62.4 -> 60.4;
// rmsnorm 262144 x 256 127.2 -> 106.0, 131072 x 512 126.6 -> 106.2 (once y outgrows the L2
// the second pass reads it from DRAM again); where the two passes' y stays in the L2,
// layernorm loses 1.5-3% (131072 x 128 32.5 -> 33.5, 65536 x 256 32.1 -> 32.6), rmsnorm still
// gains (31.4 -> 30.6, 31.3 -> 30.0). Hidden 384 with two chunks (a quarter of the lanes'
// second chunk past the row) lost up to 5% (layernorm 52.6 -> 55.2); with three chunks on 16
// lanes (thirtieth session) it gains, us, two passes / tile: layernorm 32768 x 384 25.8 /
// 23.9, 65536 x 384 47.0 / 46.4, 262144 x 384 194.3 / 170.1; rmsnorm 24.9 / 21.4, 45.3 /
// 42.6, 190.5 / 154.7. 128-row tiles lost 2-20% at 512; at 48 registers (five blocks an SM)
// the kernels spilled 8-24 bytes, up to 3% faster at 128-256 and up to 4% slower at 512, the
// same in sum. Four-chunk rows in 512-thread blocks were 1-5% faster still at 512 (another
// build), but their sums differ from the row kernel's, and y would change with the copies
// asked for (benchmarks/RESULTS.md, twenty-eighth session).
// Hidden 768 and 1024, the tile in shared memory: blocks of 512
// threads (the register kernels' bound), 16 rows of a warp each, so a 64-row tile (64 KiB
// at hidden 1024: two blocks an SM) takes four passes of the block. H100, against the two
// passes: 5-14% faster at hidden 768 and 1024; at 896 (a quarter of each warp's last
// chunk idle) rmsnorm 5% faster but layernorm 2% slower, so 896 keeps the two passes
// (benchmarks/RESULTS.md). Tiles of 32 rows were no faster there, of 16 (half sectors of
// the transposed copy) 1.2-2x slower.
// Hidden 1025 to 5120 read a 32-row tile back from the row-wise copy instead (whole
// sectors of the transposed copy, no shared memory), in blocks of up to 1024 threads, one
// an SM: a block's tile is then written and read back in half the time two blocks an SM
// take, which keeps it in the L2 for longer rows. H100, bf16, against the two passes:
// 1-16% faster (16384 x 2048 61.8 -> 57.5 us, 32768 x 2048 126.9 -> 109.5, 16384 x 4096
// 127.1 -> 115.8, 16384 x 5120 172.7 -> 164.0), the H200 1-17% at 1152-2560; 8192 x 8192
// even (128.1 -> 129.6). Blocks of 512 threads, two an SM (the same rows in flight), lost
// from 5120 up (16384 x 5120 207.1 us against 172.7) and at 3072-4096 where the tiles fit
// one wave (8192 rows): the tiles of the blocks in flight outgrew what the L2 keeps (ncu:
// at 8192 x 8192 most of the tile was read from DRAM again). fp32 rows keep those blocks
// (their registers do not fit 1024 threads) and their rule: up to 2560, and to 4096 from
// 16384 rows. Cache hints (y's lines kept with evict_last, y^T stored and the tile read
// evict-first), 64-row tiles, and (H200) a tile shared in a cluster's shared memory
// (blocks holding 16, 8 or 4 of its rows: 12-70% slower) did not help.
// RMSNorm's 16-bit rows of hidden 3072 to 7168 keep that 32-row tile in the shared memory
// of the same 1024-thread blocks (224 KiB at 7168): no L2 lines to lose, and the
// transpose reads shared memory. H100, against the tile from the row-wise copy: 16384 x
// 3072 88.8 -> 84.5 us (8192 x 3072 even, 44.8 / 45.1), 8192 x 4096 59.4 -> 57.1, 16384 x
// 4096 115.0 -> 108.0, 16384 x 5120 165.0 -> 150.6, and against the two passes 16384 x
// 6144 191.5 -> 169.9, 8192 x 7168 111.9 -> 104.1; mixed below 3072 (16384 x 1152 35.8 ->
// 37.6, 32768 x 2048 109.1 -> 106.0).
// LayerNorm takes it only past the row-wise copy's tile (from 5248): against that tile it
// lost at 3072-4096 (16384 x 3072 89.5 -> 94.0 us) and was even at 5120 (163.7 / 165.2);
// against the two passes 16384 x 6144 199.1 -> 186.9, 8192 x 7168 114.9 -> 113.8. Its row
// groups of several warps pass one named barrier more where they sum the squares again
// (norm_fwd_kernel.cuh), and the others pass a bare one instead so that racecheck stays
// clean (with uneven counts it reported the tile's writes and reads across the block's
// barrier as hazards; 16384 x 6144 took 184.6 us without the bare barrier, 186.9 with it,
// in runs a session apart).
// Wider 16-bit rows with a row-wise copy take the trailing tiles (norm_trailing.h) where they
// were timed faster than the two passes (norm_fwd_trailing_hidden), with the row kernel's row
// groups in its blocks of up to 512 threads: written in ticket order, the rows not yet
// transposed are a few waves' worth whatever the width, where a tile a block held 264
// tiles in flight.
// H100 SXM, bf16 rows, both FP8 copies, two passes against the trailing tiles, us (of a
// same-bytes copy; benchmarks/RESULTS.md, fifty-third session): rmsnorm 16384 x 7296 221.1 ->
// 204.6 (73.0% -> 78.8%), 8192 x 8192 125.5 -> 116.8, 8192 x 9216 140.3 -> 135.1, 4096 x
// 16384 127.2 -> 118.7, 8192 x 16384 248.2 -> 226.1 (72.8% -> 79.9%), but 4096 x 12288 93.6
// -> 95.6, where the row kernel's 56 registers hold three blocks of 384 threads an SM and the
// trailing kernel's 64 two; layernorm 4096 x 16384 130.4 -> 127.2, 8192 x 16384 254.4 ->
// 241.3, but 16384 x 7296 225.6 -> 229.1, 4096 x 12288 95.8 -> 98.5 and 8192 x 9216 142.7 ->
// 149.1 (the row kernel's compact form there; a compact trailing form, its transposes
// ahead of the row's loads so as not to spill, lost as much), and 8192 x 8192 127.0 ->
// 123.3 alone among its 7169-8192. fp32 rows were not timed.
bool norm_fwd_trailing_hidden(int64_t hidden, NormType type) {
  if (hidden > kNormFwdMaxRegisterHidden) return false;
  if (type == NormType::kLayerNorm) return hidden >= kNormFwdTrailingLnMinHidden;
  return hidden > kNormFwdSharedMaxHidden &&
         (hidden < kNormFwdTrailingRmsGapMinHidden || hidden > kNormFwdTrailingRmsGapMaxHidden);
}

NormFwdTileShape norm_fwd_tile_shape(int64_t hidden, bool rowwise_copy, int64_t rows, bool fp32_input, NormType type,
                                     size_t max_block_smem) {
  NormFwdTileShape tile;
  const bool staged_hidden =
      fp32_input ? hidden <= kNormFwdStagedFp32MaxHidden ||
                       (hidden <= kNormFwdStagedFp32WideMaxHidden && rows >= kNormFwdStagedFp32WideMinRows)
                 : hidden <= kNormFwdStagedMaxHidden;
  const int64_t shared_min_hidden = type == NormType::kRMSNorm ? kNormFwdRmsSharedMinHidden : kNormFwdLnSharedMinHidden;
  const bool wide_shared = !fp32_input && hidden >= shared_min_hidden && hidden <= kNormFwdSharedMaxHidden &&
                           hidden % 128 == 0 &&
                           size_t(kNormFwdSharedTileRows) * size_t(hidden) + kNormFwdStaticSmemBound <= max_block_smem;
  // the small bucket's 16-bit rows that fill their lanes (two chunks a thread at 128, 256
  // and 512, three at 384), multiples of 128
  const NormRowShape small_rows = norm_fwd_row_shape(hidden, /*extra_chunk_rows=*/true);
  const bool small_shared = !fp32_input && hidden >= kNormFwdSmallTiledMinHidden &&
                            hidden <= kNormFwdSmallMaxHidden && hidden % 128 == 0 &&
                            columns_covered(small_rows) == hidden;
  if (small_shared) {
    tile.rows = small_rows;  // the row kernel's row groups: the same sums, the same bytes
    tile.rows.rows_per_block = kNormFwdSmallMaxThreads / tile.rows.threads_per_row;
    tile.tile_rows = kNormFwdSmallTileRows;
    tile.tile = NormTile::kShared;
  } else if (hidden >= kNormFwdTiledMinHidden && hidden <= kNormFwdTiledMaxHidden && hidden % 256 == 0) {
    tile.rows = norm_fwd_row_shape(hidden);
    tile.rows.rows_per_block = kNormMaxBlockThreads / tile.rows.threads_per_row;
    tile.tile_rows = kNormFwdTileRows;
    tile.tile = NormTile::kShared;
  } else if (wide_shared) {
    tile.rows = tile_row_groups(hidden, kNormFwdStagedMaxBlockThreads, fp32_input);
    tile.tile_rows = kNormFwdSharedTileRows;
    tile.tile = NormTile::kShared;
  } else if (rowwise_copy && hidden >= kNormFwdStagedMinHidden && hidden % 8 == 0 && staged_hidden) {
    tile.rows = tile_row_groups(hidden, fp32_input ? kNormMaxBlockThreads : kNormFwdStagedMaxBlockThreads, fp32_input);
    tile.tile_rows = kNormFwdStagedTileRows;
    tile.tile = NormTile::kRowwiseCopy;
  } else if (rowwise_copy && !fp32_input && hidden % 8 == 0 && norm_fwd_trailing_hidden(hidden, type)) {
    tile.rows = tile_row_groups(hidden, kNormMaxBlockThreads, fp32_input);
    tile.tile_rows = kNormFwdTrailingTileRows;
    tile.tile = NormTile::kTrailing;
  } else {
    return tile;
  }
  tile.hidden = hidden;
  return tile;
}

// Backward: 16 elements a thread: x hat and dz * gamma live across the row's
// reduction, next to the dgamma / dbeta accumulators (94-101 registers for
// LayerNorm, 75-90 for RMSNorm). Blocks of 512 threads, one an SM: the block's
// partial sums go to the workspace once per block, so fewer, larger blocks write
// and re-read less. A 16-bit row alone in its block (hidden 4097 to 8192) keeps its
// accumulators in shared memory instead (see norm_bwd.cu). Past hidden 8192, 32
// elements a thread with the accumulators in shared memory (a row group of 288 to 512
// threads, alone in its block). Vectorized 16-bit rows past 4096 take the pipelined
// kernel's shape instead (below); these shapes serve fp32 and element-by-element rows
// there.
// Three chunks a thread where two leave lanes idle, as the forward's short rows take
// them, were 1-5% slower here (128 registers, staged; H100, layernorm 65536 x 384 61.9 ->
// 63.9 us, 262144 x 192 113.2 -> 118.5; benchmarks/RESULTS.md, thirtieth session).
NormRowShape norm_bwd_row_shape(int64_t hidden) {
  if (hidden > kNormBwdMaxRegisterHidden) return {};
  const int64_t register_limit = int64_t(kNormMaxBlockThreads) * kNormBwdChunks * 8;
  return row_shape(hidden, hidden <= register_limit ? kNormBwdChunks : kNormBwdLongChunks, kNormMaxBlockThreads);
}

// Pipelined backward: one row a block (rows_per_block 1), 16 elements a thread, so
// 288 to 1024 threads.
NormRowShape norm_bwd_pipelined_row_shape(int64_t hidden) {
  if (hidden <= kNormBwdPipelinedMinHidden || hidden > kNormBwdMaxRegisterHidden) return {};
  NormRowShape shape;
  shape.chunks = kNormBwdPipelinedChunks;
  const int64_t elements = shape.chunks * 8;
  shape.threads_per_row = int((hidden + elements - 1) / elements + 31) / 32 * 32;
  shape.rows_per_block = 1;
  return shape;
}

int64_t norm_even_steps_grid(int64_t items, int64_t grid) {
  if (grid <= 1 || items <= grid) return grid;
  const int64_t steps = (items + grid - 1) / grid;
  const int64_t even = (items + steps - 1) / steps;
  return (grid - even) * 16 <= grid ? even : grid;
}

// The finalize's width: narrow while wide blocks would be fewer than 1.5 an SM.
int norm_finalize_columns(int64_t hidden, int multiprocessors) {
  const int64_t wide_blocks = (hidden + kNormFinalizeWideColumns - 1) / kNormFinalizeWideColumns;
  return 2 * wide_blocks < 3 * int64_t(multiprocessors) ? kNormFinalizeNarrowColumns : kNormFinalizeWideColumns;
}

}  // namespace opente
