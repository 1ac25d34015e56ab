// Launch shapes of the CUDA norm kernels: the one place for their heuristics.
//
// The register kernels (norm_fwd.cu, norm_bwd.cu) give each row to a group of
// `threads_per_row` threads; each thread keeps `chunks` 8-element pieces of the
// row in registers (chunk j of thread t covers columns (j * threads_per_row + t) * 8
// ... + 7), so a group covers threads_per_row * chunks * 8 >= hidden columns.
// A block holds `rows_per_block` such groups side by side. Rows whose hidden size
// does not fit the largest group go to the fallback kernels (norm_fallback.cu).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ops/norm/norm_params.h"

namespace opente {

// Threads of a block of the register kernels, at most (their __launch_bounds__):
// 128 registers a thread, so that even the largest row group (16 warps) fits an SM.
constexpr int kNormMaxBlockThreads = 512;
constexpr int kNormMaxBlockWarps = kNormMaxBlockThreads / 32;
// The named barriers of row groups of several warps: 1 + the group's index in its block
// (barrier 0 is __syncthreads'), at most 8 groups a block (512 threads of 64-thread
// groups; the tiled forward's kNormFwdStagedMaxRowsPerBlock); groups of a warp or less
// use shuffles alone.
constexpr int kNormMaxRowGroupBarrier = 8;
static_assert(kNormMaxBlockThreads / 64 <= kNormMaxRowGroupBarrier, "a row group without a named barrier");

struct NormRowShape {
  int chunks = 0;           // 8-element chunks a thread holds: a compile-time bucket; 0 = fallback
  int threads_per_row = 0;  // a power of two <= 32 (several rows a warp), or a multiple of 32 <= 512
  int rows_per_block = 0;   // row groups of a block

  bool in_registers() const { return chunks > 0; }
  int block_threads() const { return threads_per_row * rows_per_block; }
};

// The forward's shape for rows of `hidden` elements; chunks == 0 beyond kNormFwdMaxRegisterHidden.
// `extra_chunk_rows`: the call has the kernels of the extra chunk counts (16-bit vectorized
// rows with a y in x's dtype or FP8, norm_fwd.cu):
// - kNormFwdSmallOddChunks, which the hidden <= 512 bucket takes where three chunks a thread
//   leave fewer of its lanes idle than two (hidden 17-24, 33-48, 65-96, 129-192, 321-384: 384
//   on 16 lanes, where two chunks leave 8 of 32 lanes idle);
// - rows of kNormFwdEightLaneRowMinHidden to kNormFwdEightLaneRowMaxHidden on 8 lanes of
//   kNormFwdFiveChunks, where three chunks took 16 lanes (320 of 384 columns);
// - rows of 513 to kNormFwdHalfWarpRowMaxHidden on half a warp, kNormFwdFiveChunks a
//   thread, where 4 chunks took a warp and left part of it idle in their third;
// - rows of kNormFwdWarpRowMinHidden to kNormFwdWarpRowMaxHidden on one warp, 5 or 6 chunks
//   a thread (norm_fwd_warp_row_chunks), where 4 chunks took two warps and their reductions
//   a named barrier.
NormRowShape norm_fwd_row_shape(int64_t hidden, bool extra_chunk_rows = false);
constexpr int kNormFwdFiveChunks = 5;
constexpr int64_t kNormFwdEightLaneRowMinHidden = 257;
constexpr int64_t kNormFwdEightLaneRowMaxHidden = 320;
constexpr int64_t kNormFwdHalfWarpRowMaxHidden = 640;
constexpr int64_t kNormFwdWarpRowMinHidden = 1025;
constexpr int64_t kNormFwdWarpRowMaxHidden = 1536;
constexpr int norm_fwd_warp_row_chunks(int64_t hidden) { return int((hidden + 255) / 256); }  // 5 or 6
// The most chunks a thread of the forward's rows: only the one-warp rows of 1281-1536 take
// them, whose 27-32 threads' worth of columns threads_per_row rounds up to a whole warp
// (norm_row_shape.cpp); the kernel takes the 32 as given (norm_fwd_kernel.cuh)
constexpr int kNormFwdWarpRowMaxChunks = 6;
static_assert(norm_fwd_warp_row_chunks(kNormFwdWarpRowMaxHidden) == kNormFwdWarpRowMaxChunks &&
                  norm_fwd_warp_row_chunks(kNormFwdWarpRowMaxHidden - 256) < kNormFwdWarpRowMaxChunks &&
                  (kNormFwdWarpRowMaxHidden - 256 + 1 + kNormFwdWarpRowMaxChunks * 8 - 1) / (kNormFwdWarpRowMaxChunks * 8) > 16,
              "the forward's rows of 6 chunks: 1281-1536 columns, 27-32 threads, a warp of 32");
// The row forward kernel's forms (its last template argument, norm_fwd_kernel.cuh); an
// SM holds as many blocks as the scarcest of registers, warps and named barriers allow:
// - kWide: blocks of up to kNormMaxBlockThreads, two an SM at 64 registers; a row
//   group's barrier number in a register, so ptxas reserves all 16 of the block's
//   barriers and an SM (64 barriers) holds at most 4 blocks.
// - kImmediates (the hidden <= 512 bucket): the barrier numbers as immediates
//   (sync_row_group, norm_kernels_common.cuh: kNormMaxRowGroupBarrier + 1 barriers), blocks
//   of kNormFwdSmallMaxThreads (all that bucket launches) bounded for kNormFwdSmallMinBlocks
//   an SM: 48 registers (ptxas, sm_90a: no spills but fp16 layernorm's FP8 y, 4 bytes), 5
//   blocks an SM where 64 held 4; LayerNorm's three-chunk rows (kNormFwdSmallOddChunks) for
//   kNormFwdSmallOddLnMinBlocks (64 registers); in the shared tile of both FP8 copies
//   (norm_fwd_tiled.cu) for kNormFwdSmallTiledMinBlocks (64 registers: the tile loop's state
//   spilled at 48).
// - kCompact: the immediates in blocks of up to kNormFwdCompactMaxThreads, bounded for
//   kNormFwdCompactMinBlocks an SM (56 registers; ptxas, sm_90a: no spills).
enum class NormRowForm { kWide, kImmediates, kCompact };
constexpr int kNormFwdWideMinBlocks = 2;  // of kNormMaxBlockThreads
constexpr int kNormFwdSmallMaxThreads = 256;
constexpr int kNormFwdSmallMinBlocks = 5;
constexpr int kNormFwdSmallTiledMinBlocks = 4;  // the same rows in their shared tile (norm_fwd_tiled.cu)
constexpr int kNormFwdSmallOddLnMinBlocks = 4;  // LayerNorm's three-chunk rows: at 48 registers they spilled
constexpr int kNormFwdCompactMaxThreads = 384;
constexpr int kNormFwdCompactMinBlocks = 3;
// The form for `shape`: kImmediates for the hidden <= 512 bucket; kCompact for 16-bit
// vectorized rows (`compact_allowed`) where it fits more blocks an SM than kWide
// (LayerNorm: hidden 2049-3072, 4097-7168, 8193-9216, 10241-12288; RMSNorm, whose kWide
// kernels take fewer registers: 2049-3072, 4097-7168); kWide elsewhere.
NormRowForm norm_fwd_row_form(const NormRowShape& shape, bool compact_allowed, NormType type);
// Both FP8 copies in one pass (norm_fwd_tiled.cu): a block normalizes `tile_rows`
// consecutive rows with the forward's row groups, keeps their FP8 bytes, then writes the
// tile's transpose, tile_rows consecutive bytes (whole 32-byte sectors) of each of its
// columns. The tile stays in shared memory (short rows, and wider 16-bit rows up to what
// a block's shared memory holds: RMSNorm's from 3072, LayerNorm's from 5248) or is read
// back from the row-wise copy the block has just written, while its lines are still in
// the L2; or, for wider rows, each tile is transposed by blocks that take its share two
// waves of rows later, from the row-wise copy in the L2 (norm_trailing.h).
enum class NormTile {
  kNone,         // the row kernel alone
  kShared,       // the tile in shared memory (tile_slot's layout)
  kRowwiseCopy,  // the tile read back from the row-wise output, behind the block's barrier
  kTrailing,     // the tiles read back from the row-wise output by later tickets (norm_trailing.h)
};
struct NormFwdTileShape {
  NormRowShape rows;  // the forward's row groups, rows_per_block a power of two dividing tile_rows
  int64_t hidden = 0;
  int tile_rows = 0;  // 0: not taken (the row kernel, then the byte transpose)
  NormTile tile = NormTile::kNone;

  bool taken() const { return tile_rows > 0; }
  // the shared tile's FP8 bytes; none where the row-wise copy holds the tile
  size_t smem_bytes() const { return tile == NormTile::kShared ? size_t(tile_rows) * size_t(hidden) : 0; }
};
// For `rows` rows of `hidden` elements of norm `type`, whether the call writes a row-wise
// copy, whether x is fp32, and the most shared memory a block of the GPU may take
// (max_block_shared_memory):
// - for 16-bit rows of the hidden <= 512 bucket that fill their lanes, multiples of 128 from
//   kNormFwdSmallTiledMinHidden (128, 256, 512, and 384 in three chunks a thread), a shared
//   tile of kNormFwdSmallTileRows rows with the row kernel's own row groups
//   (NormRowForm::kImmediates: the same sums, so the same bytes and statistics as a
//   row-wise call) in blocks of kNormFwdSmallMaxThreads;
// - a shared tile of 64 rows for hidden 768 and 1024 (multiples of 128 keep the tile's
//   swizzled 8-byte slots in their row: norm_fwd_kernel.cuh; 896 was measured and left
//   out, see norm_row_shape.cpp), in blocks of kNormMaxBlockThreads;
// - for 16-bit rows of hidden kNormFwdRmsSharedMinHidden (RMSNorm) or
//   kNormFwdLnSharedMinHidden (LayerNorm) to kNormFwdSharedMaxHidden, multiples of 128, a
//   shared tile of kNormFwdSharedTileRows rows in blocks of up to
//   kNormFwdStagedMaxBlockThreads, where the tile beside the kernel's static shared
//   memory (kNormFwdStaticSmemBound) fits the GPU's block;
// - else with a row-wise copy, the tile from it for hidden kNormFwdStagedMinHidden to
//   kNormFwdStagedMaxHidden, multiples of 8, in blocks of up to
//   kNormFwdStagedMaxBlockThreads; for fp32 rows (whose registers allow blocks of
//   kNormMaxBlockThreads only) up to kNormFwdStagedFp32MaxHidden, and to
//   kNormFwdStagedFp32WideMaxHidden with kNormFwdStagedFp32WideMinRows rows or more;
// - else with a row-wise copy, for 16-bit rows of the hidden sizes norm_fwd_trailing_hidden
//   gives, multiples of 8, the trailing tiles (norm_trailing.h) of kNormFwdTrailingTileRows
//   rows, with the row kernel's row groups in blocks of up to kNormMaxBlockThreads (kWide)
//   (norm_fwd_tiled_takes declines them where the device's memory outruns its SMs).
NormFwdTileShape norm_fwd_tile_shape(int64_t hidden, bool rowwise_copy, int64_t rows, bool fp32_input, NormType type,
                                     size_t max_block_smem);
constexpr int64_t kNormFwdSmallTiledMinHidden = 128;
constexpr int kNormFwdSmallTileRows = 64;
constexpr int64_t kNormFwdTiledMinHidden = 768;
constexpr int64_t kNormFwdTiledMaxHidden = 1024;
constexpr int kNormFwdTileRows = 64;
constexpr int64_t kNormFwdStagedMinHidden = 1025;
constexpr int64_t kNormFwdStagedMaxHidden = 5120;
constexpr int64_t kNormFwdStagedFp32MaxHidden = 2560;
constexpr int64_t kNormFwdStagedFp32WideMaxHidden = 4096;
constexpr int64_t kNormFwdStagedFp32WideMinRows = 16384;
constexpr int kNormFwdStagedTileRows = 32;
// One block an SM (64 registers a thread), at most 8 row groups (their named barriers
// are 1 to 8; the hardware has 16)
constexpr int kNormFwdStagedMaxBlockThreads = 1024;
constexpr int kNormFwdStagedMaxRowsPerBlock = 8;
static_assert(kNormFwdStagedMaxRowsPerBlock <= kNormMaxRowGroupBarrier, "a row group without a named barrier");
// Rows of one warp (1025-1536, norm_fwd_row_shape's extra chunk counts) pass no named
// barrier: 16 of them a block (512 threads) were faster than 8 or 32 (norm_row_shape.cpp)
constexpr int kNormFwdStagedMaxWarpRowsPerBlock = 16;
constexpr int64_t kNormFwdRmsSharedMinHidden = 3072;
constexpr int64_t kNormFwdLnSharedMinHidden = kNormFwdStagedMaxHidden + 1;  // where the row-wise copy's tile ends
constexpr int64_t kNormFwdSharedMaxHidden = 7168;                           // 224 KiB of tile: Hopper's 227 KiB a block
constexpr int kNormFwdSharedTileRows = 32;
// the forward kernel's static shared memory (reduction and amax slots, under 1 KiB), at most
constexpr size_t kNormFwdStaticSmemBound = 2048;
constexpr int kNormFwdTrailingTileRows = 32;
// The trailing tiles' hidden sizes (16-bit rows with a row-wise copy), where they were timed
// faster than the two passes on an H100 (norm_row_shape.cpp): RMSNorm's past its shared
// tile (7169) but for kNormFwdTrailingRmsGapMinHidden to kNormFwdTrailingRmsGapMaxHidden,
// LayerNorm's from kNormFwdTrailingLnMinHidden; to kNormFwdMaxRegisterHidden.
bool norm_fwd_trailing_hidden(int64_t hidden, NormType type);
constexpr int64_t kNormFwdTrailingRmsGapMinHidden = 10241;
constexpr int64_t kNormFwdTrailingRmsGapMaxHidden = 12288;
constexpr int64_t kNormFwdTrailingLnMinHidden = 12289;
// The trailing tiles' lag (norm_trailing.h), in waves of the grid's row groups: a ticket
// transposes the share of the row group taken this many waves before it (plus a tile's
// row groups, so that its whole tile is older than the ticket).
constexpr int kNormFwdTrailingLagWaves = 2;
inline int64_t norm_trailing_lag(int64_t grid, int rows_per_block, int tile_rows) {
  return kNormFwdTrailingLagWaves * grid + tile_rows / rows_per_block;
}

// The backward's; chunks == 0 beyond kNormBwdMaxRegisterHidden.
NormRowShape norm_bwd_row_shape(int64_t hidden);
// The pipelined backward's (norm_bwd_pipelined.cu: 16-bit rows, one a block of up to
// kNormBwdPipelinedMaxThreads, 16 elements a thread): hidden kNormBwdPipelinedMinHidden + 1
// to kNormBwdMaxRegisterHidden; chunks == 0 outside.
NormRowShape norm_bwd_pipelined_row_shape(int64_t hidden);

// The compile-time buckets: chunks a thread holds. Forward: 2 (hidden <= 512; 3 where
// that fills more lanes, 5 on 8 lanes at 257-320, see norm_fwd_row_shape) or 4 (5 on half a
// warp at 513-640, 5 or 6 on one warp at 1025-1536).
// Backward: 2 up to hidden 8192 (a column costs it x hat, dz * gamma and two
// accumulators in registers), 4 above, with the accumulators in shared memory
// (one row group of up to 512 threads a block).
constexpr int kNormFwdSmallChunks = 2;
constexpr int kNormFwdSmallOddChunks = 3;
constexpr int64_t kNormFwdSmallMaxHidden = 512;  // the hidden <= 512 bucket's
constexpr int kNormFwdChunks = 4;
constexpr int kNormBwdChunks = 2;
constexpr int kNormBwdLongChunks = 4;
constexpr int kNormBwdPipelinedChunks = 2;
constexpr int kNormBwdPipelinedMaxThreads = 1024;
// Rows up to this long go to blocks of several rows (the pipelined kernel's grid, one
// row a block, would be limited to kNormMaxRowBlocks blocks of a few warps).
constexpr int64_t kNormBwdPipelinedMinHidden = 4096;

// Columns a block of the backward's finalize kernel (norm_bwd.cu) sums on a GPU of
// `multiprocessors` SMs: kNormFinalizeWideColumns (whole 128-byte lines of the partial
// rows), or kNormFinalizeNarrowColumns where wide blocks would number fewer than 1.5 an
// SM (hidden up to ~6300 on an H100): twice the blocks finished 0.6-1.2 us sooner at
// hidden 512-5120, where narrow blocks were 0.5-1.7 us slower at 8192-16384 (H100).
constexpr int kNormFinalizeWideColumns = 32;
constexpr int kNormFinalizeNarrowColumns = 16;
int norm_finalize_columns(int64_t hidden, int multiprocessors);

// Rows up to this long (the register backward, norm_bwd.cu) have their dgamma / dbeta
// summed inside the rows kernel (a cooperative launch: a grid-wide barrier, then each
// block sums a share of the columns of the partial rows) rather than by a finalize
// kernel launched after it. H100, layernorm / rmsnorm backward, us, finalize kernel
// against in the grid: 262144 x 64 47.6 / 46.0 and 44.7 / 43.6, 65536 x 256 46.8 / 45.0
// and 44.3 / 43.0, 16384 x 1024 47.1 / 45.6 and 44.8 / 43.6, 8192 x 3072 64.0 / 63.3 and
// 61.8 / 60.9; but 16384 x 4096 155.3 / 156.0 and 153.7 / 153.9 (there each block's
// share is 63 columns of 132 partial rows).
constexpr int64_t kNormBwdInGridFinalizeMaxHidden = 3072;

// Longest rows the register kernels take: 512 threads x 32 elements.
constexpr int64_t kNormFwdMaxRegisterHidden = int64_t(kNormMaxBlockThreads) * kNormFwdChunks * 8;
constexpr int64_t kNormBwdMaxRegisterHidden = int64_t(kNormMaxBlockThreads) * kNormBwdLongChunks * 8;

// What the forward kernel takes as given (norm_fwd_kernel.cuh): rows of other chunk counts
// than kNormFwdChunks fit a warp (the small bucket's, the eight-lane and half-warp rows of
// five chunks, the warp rows of five or six), and LayerNorm's trailing tiles' rows take more
// than half of a block's threads (a row group a block).
static_assert(kNormFwdSmallMaxHidden <= 32 * kNormFwdSmallChunks * 8 &&
                  kNormFwdHalfWarpRowMaxHidden <= 32 * kNormFwdFiveChunks * 8 &&
                  norm_fwd_warp_row_chunks(kNormFwdWarpRowMaxHidden) * 8 * 32 >= kNormFwdWarpRowMaxHidden,
              "the forward's rows of 2, 3, 5 or 6 chunks a thread: a warp or less");
static_assert(2 * ((kNormFwdTrailingLnMinHidden + kNormFwdChunks * 8 - 1) / (kNormFwdChunks * 8)) > kNormMaxBlockThreads,
              "LayerNorm's trailing tiles: a row group a block");

// Blocks for a register kernel striding over `rows` rows: `waves` waves (the
// kernel's occupancy at this block size and dynamic shared memory, times the SM
// count; 0: uncapped, see grid_stride_blocks), no more blocks than row groups need,
// at least 1. Also raises the kernel's dynamic shared memory limit on `device` (the
// current device) when `dynamic_smem` needs it.
int64_t norm_resident_grid(const void* kernel, const NormRowShape& shape, size_t dynamic_smem, int64_t rows,
                           int device, int waves = 1);

// The backward's grid from its resident one (norm_resident_grid): at most
// kNormMaxRowBlocks (the workspace's partial rows), and where that cap binds, the
// largest multiple of the SM count under it, so that every SM holds as many blocks
// (the blocks take as many rows each: rows are strided over the grid). It binds where
// four blocks fit an SM on 132 SMs: bf16 rmsnorm's pipelined rows of hidden 4097-4608,
// where 512 blocks left 116 SMs with four and 16 with three. H100, us, 512 blocks / 528
// (four on every SM, the cap raised) / 396 (this rule, three on every SM): rmsnorm
// 16384 x 4104 166.1 / 165.2 / 156.4, 16384 x 4608 179.9 / 179.4 / 167.4. So evening the
// grid out gains little; three blocks an SM beat four there. On 171-256 SMs, where
// three an SM would pass the cap, the rule gives two an SM; no GPU of that size has
// timed it.
int64_t norm_bwd_grid(int64_t resident_grid, int device);

// A grid of `grid` blocks striding over `items` (rows, a row a block a step) takes
// ceil(items / grid) steps a block, and where items is not a multiple of grid some blocks
// run one step fewer while their SMs wait for the rest (grid * steps - items blocks, up to
// grid - 1). This gives the fewest blocks that take the items in as many steps, so that
// fewer than `steps` blocks run one fewer, where that idles at most a sixteenth of the grid
// (always where blocks take 16 steps or more); else `grid`. Taken by the pipelined
// backward, whose steps are rows of 4097 to 16384 (benchmarks/RESULTS.md, seventy-second
// session): H100, us, 3 rounds, base / even steps: layernorm 2048 x 16384 (68 blocks of
// 132 ran 16 rows, 64 ran 15; now 128 blocks run 16) 86.7 / 85.6, 4096 x 12288 121.3 /
// 118.3, 8192 x 8192 157.0 / 153.8, 2048 x 8192 50.0 / 49.2; rmsnorm 2048 x 8192 47.6 /
// 46.3, 2048 x 16384 83.8 / 83.1; no shape slower by more than 0.4% (rmsnorm 4096 x 12288
// 115.0 / 115.4). The register backward's steps (a block's row groups, hidden <= 4096)
// moved within 0.7% either way under it, and keep their grid.
int64_t norm_even_steps_grid(int64_t items, int64_t grid);

// The pipelined backward (norm_bwd_pipelined.cu): whether it takes these rows (16-bit,
// vectorized, norm_bwd_pipelined_row_shape), and its launch, which writes dx and
// [slots, 2, hidden] partial sums into `partials` (a slot a block, or a pair of blocks
// on sm_90; slots <= kNormMaxRowBlocks, returned), or dgamma / dbeta themselves for a
// grid of 1.
bool norm_bwd_pipelined_takes(const NormBwdParams& p);
int64_t norm_bwd_pipelined_cuda(const NormBwdParams& p, int device, float* partials, void* stream);

// The row forward's launch (norm_fwd_rows_launch.cuh) for input kIn, y kOut, 16-byte
// vectors of the row or element by element (kVectorized), and whether a float y takes
// its amax (kFloatAmax); norm_fwd.cu calls it, the norm_fwd_rows_<y dtype>.cu files
// instantiate it.
template <te_dtype kIn, te_dtype kOut, bool kVectorized, bool kFloatAmax>
void launch_norm_fwd_rows(const NormFwdParams& p, const NormRowShape& shape, int device, void* stream);

// The tiled forward (norm_fwd_tiled.cu): whether it takes this call (an FP8 y with its
// transposed copy, a shape norm_fwd_tile_shape takes on `device`, rows % 8 == 0, aligned buffers),
// and its launch.
// The trailing tiles take their counters from the workspace (`workspace_size` bytes,
// norm_trailing_counter_bytes): where it is not 4-byte aligned or too small for them (te_norm_workspace_size's
// holds them up to 32768 x hidden rows) the call keeps the two passes.
bool norm_fwd_tiled_takes(const NormFwdParams& p, int device, const void* workspace, size_t workspace_size);
void norm_fwd_tiled_cuda(const NormFwdParams& p, int device, void* workspace, void* stream);
// Its launch (norm_fwd_tiled_launch.cuh) for input kIn and FP8 y kOut, of the call's tile
// shape; norm_fwd_tiled_e4m3.cu and norm_fwd_tiled_e5m2.cu instantiate it. `counters`: the
// trailing tiles' (zeroed here), in the workspace.
template <te_dtype kIn, te_dtype kOut>
void launch_norm_fwd_tiled(const NormFwdParams& p, const NormFwdTileShape& tile, int device, unsigned* counters,
                           void* stream);

// Whether `device`'s memory outruns its SMs as an H200's does: its peak DRAM bandwidth an
// SM (dram_gb_per_s_per_sm, common/cuda_utils.h) is at least kNormMemoryOutrunsSmsGBPerSm.
// Where it does, a row's instructions and latency bound these kernels more than memory,
// and two forms won that lost on an H100 SXM (25.4 GB/s an SM; the H200 about 37): the
// pipelined FP8 forward and RMSNorm's widest backward form (benchmarks/RESULTS.md, the
// forty-fourth, forty-eighth and forty-ninth sessions). Untimed: devices between the two
// keep the other kernels, those past an H200's figure take these.
constexpr double kNormMemoryOutrunsSmsGBPerSm = 32;
bool norm_memory_outruns_sms(int device);

// The pipelined forward (norm_fwd_pipelined.cu): whether it takes this call (16-bit
// `vectorized` rows of kNormFwdPipelinedMinHidden to kNormFwdMaxRegisterHidden, an FP8
// y, row-wise only, where norm_memory_outruns_sms), and its launch. Its row groups, sums
// and formulas are the row kernel's, so are its results' bits. From its timings beside
// the row kernel's (FP8 y, us, row kernel / pipelined): on an H200 rmsnorm 4096 x 12288
// 48.3 / 46.5, 4096 x 16384 65.2 / 59.2 (77% -> 85% of a same-bytes copy), layernorm 57.7
// / 56.6 and 74.7 / 73.4; at hidden 2048-8192 layernorm 3.5-6.0% slower (16384 x 4096
// 67.0 / 70.0), rmsnorm from 3.6% slower to 2.3% faster; on an H100 SXM 1.4-9.7% slower
// at 2048-12288 and within 4% at 16384. Both FP8 copies above the tiled kernel's widths
// (the row-wise pass then the transpose) lost 2-5% with it at 12288 on the H200, so that
// path keeps the row kernel.
constexpr int64_t kNormFwdPipelinedMinHidden = 12288;
bool norm_fwd_pipelined_takes(const NormFwdParams& p, bool vectorized, int device);
void norm_fwd_pipelined_cuda(const NormFwdParams& p, int device, void* stream);

// Fallback kernels for rows too long for registers.
void norm_fwd_fallback_cuda(const NormFwdParams& p, int device, void* stream);
// Writes dx and [row_blocks, 2, hidden] fp32 partial sums of dgamma and dbeta into
// `partials` (row_blocks <= norm_row_blocks(rows), returned); norm_bwd.cu's finalize
// kernel sums them.
int64_t norm_bwd_fallback_cuda(const NormBwdParams& p, int device, float* partials, void* stream);

}  // namespace opente
