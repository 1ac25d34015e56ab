// The launch shapes of the CUDA norm kernels (ops/norm/norm_launch.h), checked on
// the CPU for every hidden size up to past the register limits: the kernels rely on
// these properties (a row group covers its row, warp-aligned groups, named barrier
// ids, shared memory within an SM's), and a GPU run only meets the sizes it tests.
#include <gtest/gtest.h>

#include <vector>

#include "ops/norm/norm_launch.h"
#include "ops/norm/norm_trailing.h"

namespace {

using opente::NormRowShape;

constexpr int kMaxSmemPerBlock = 227 * 1024;  // Hopper's opt-in limit

bool is_power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

// Properties every register-kernel shape must have; `what` names the case.
void check_shape(const NormRowShape& s, int64_t hidden, const char* what,
                 int max_block_threads = opente::kNormMaxBlockThreads) {
  SCOPED_TRACE(testing::Message() << what << " hidden " << hidden);
  ASSERT_TRUE(s.in_registers());
  const int t = s.threads_per_row;
  // a power of two inside a warp (lanes of a group stay in an aligned span of the
  // shuffle butterfly), or whole warps
  EXPECT_TRUE(t <= 32 ? is_power_of_two(t) : t % 32 == 0) << t;
  EXPECT_LE(t, opente::kNormMaxBlockThreads);
  // the group covers the row, and is the smallest that does
  const int64_t per_thread = int64_t(s.chunks) * 8;
  EXPECT_GE(int64_t(t) * per_thread, hidden);
  const int smaller = t <= 32 ? t / 2 : t - 32;
  if (smaller > 0) EXPECT_LT(int64_t(smaller) * per_thread, hidden);
  // blocks of whole warps, within the kernels' __launch_bounds__
  EXPECT_GE(s.rows_per_block, 1);
  EXPECT_EQ(s.block_threads() % 32, 0) << s.block_threads();
  EXPECT_LE(s.block_threads(), max_block_threads);
  // multi-warp groups synchronize on named barriers 1 ... rows_per_block (sync_row_group's
  // immediates end at kNormMaxRowGroupBarrier)
  if (t > 32) EXPECT_LE(s.rows_per_block, opente::kNormMaxRowGroupBarrier);
}

TEST(NormRowShape, ForwardBuckets) {
  for (int64_t hidden = 1; hidden <= opente::kNormFwdMaxRegisterHidden; ++hidden) {
    const NormRowShape s = opente::norm_fwd_row_shape(hidden);
    check_shape(s, hidden, "forward");
    EXPECT_EQ(s.chunks, hidden <= 512 ? opente::kNormFwdSmallChunks : opente::kNormFwdChunks) << hidden;
    // rows of 4 chunks are whole warps: the kernel's sums take that as given (norm_fwd_kernel.cuh)
    if (s.chunks == opente::kNormFwdChunks) EXPECT_TRUE(s.threads_per_row % 32 == 0) << hidden;
    // the weight tiles of gamma and beta (fp32) in shared memory
    EXPECT_LE(2 * s.chunks * 8 * s.threads_per_row * 4, kMaxSmemPerBlock) << hidden;
  }
  EXPECT_FALSE(opente::norm_fwd_row_shape(opente::kNormFwdMaxRegisterHidden + 1).in_registers());
  EXPECT_FALSE(opente::norm_fwd_row_shape(int64_t(1) << 40).in_registers());
}

TEST(NormRowShape, ForwardExtraChunkRows) {
  // with the extra chunk counts' kernels (16-bit vectorized rows): the hidden <= 512 bucket
  // takes whichever of 2 and 3 chunks a thread covers the row with fewer columns past it, but
  // 8 lanes of 5 chunks at 257-320; rows of 513-640 take half a warp of 5 chunks, rows of
  // 1025-1536 one warp of 5 or 6; the others the buckets' shapes
  for (int64_t hidden = 1; hidden <= opente::kNormFwdMaxRegisterHidden; ++hidden) {
    const NormRowShape s = opente::norm_fwd_row_shape(hidden, /*extra_chunk_rows=*/true);
    check_shape(s, hidden, "forward, extra chunk counts");
    const NormRowShape plain = opente::norm_fwd_row_shape(hidden);
    const int64_t columns = int64_t(s.threads_per_row) * s.chunks * 8;
    // the kernels of the most chunks take their groups as a warp, those of 4 chunks as whole
    // warps (norm_fwd_kernel.cuh)
    if (s.chunks == opente::kNormFwdWarpRowMaxChunks) EXPECT_EQ(s.threads_per_row, 32) << hidden;
    if (s.chunks == opente::kNormFwdChunks) EXPECT_TRUE(s.threads_per_row % 32 == 0) << hidden;
    if (hidden >= opente::kNormFwdWarpRowMinHidden && hidden <= opente::kNormFwdWarpRowMaxHidden) {
      EXPECT_EQ(s.threads_per_row, 32) << hidden;  // a warp a row: shuffles alone
      EXPECT_EQ(s.chunks, hidden <= 1280 ? 5 : 6) << hidden;
      EXPECT_EQ(s.block_threads(), 256) << hidden;
      EXPECT_LT(columns - hidden, 256) << hidden;  // no chunk wholly past the row
      EXPECT_EQ(opente::norm_fwd_row_form(s, true, opente::NormType::kLayerNorm), opente::NormRowForm::kWide);
      continue;
    }
    if (hidden > opente::kNormFwdSmallMaxHidden && hidden <= opente::kNormFwdHalfWarpRowMaxHidden) {
      EXPECT_EQ(s.threads_per_row, 16) << hidden;  // half a warp a row, where four chunks took a warp
      EXPECT_EQ(s.chunks, opente::kNormFwdFiveChunks) << hidden;
      EXPECT_LT(columns, int64_t(plain.threads_per_row) * plain.chunks * 8) << hidden;
      EXPECT_EQ(opente::norm_fwd_row_form(s, true, opente::NormType::kLayerNorm), opente::NormRowForm::kWide);
      continue;
    }
    if (hidden > opente::kNormFwdSmallMaxHidden) {
      EXPECT_TRUE(s.chunks == plain.chunks && s.threads_per_row == plain.threads_per_row) << hidden;
      continue;
    }
    if (hidden >= opente::kNormFwdEightLaneRowMinHidden && hidden <= opente::kNormFwdEightLaneRowMaxHidden) {
      EXPECT_EQ(s.threads_per_row, 8) << hidden;  // where three chunks took 16 lanes
      EXPECT_EQ(s.chunks, opente::kNormFwdFiveChunks) << hidden;
      EXPECT_EQ(s.block_threads(), opente::kNormFwdSmallMaxThreads) << hidden;
      EXPECT_LT(columns, int64_t(plain.threads_per_row) * plain.chunks * 8) << hidden;
      EXPECT_EQ(opente::norm_fwd_row_form(s, true, opente::NormType::kLayerNorm), opente::NormRowForm::kWide);
      continue;
    }
    ASSERT_TRUE(s.chunks == opente::kNormFwdSmallChunks || s.chunks == opente::kNormFwdSmallOddChunks) << hidden;
    // the immediates' 256-thread blocks, rows of a warp or less
    EXPECT_EQ(s.block_threads(), opente::kNormFwdSmallMaxThreads) << hidden;
    EXPECT_LE(s.threads_per_row, 32) << hidden;
    EXPECT_LE(columns, int64_t(plain.threads_per_row) * plain.chunks * 8) << hidden;
    EXPECT_EQ(opente::norm_fwd_row_form(s, true, opente::NormType::kLayerNorm), opente::NormRowForm::kImmediates);
  }
  auto shape = [](int64_t hidden) { return opente::norm_fwd_row_shape(hidden, true); };
  EXPECT_TRUE(shape(384).chunks == 3 && shape(384).threads_per_row == 16);  // two chunks: 8 of 32 lanes idle
  EXPECT_TRUE(shape(96).chunks == 3 && shape(96).threads_per_row == 4);
  EXPECT_TRUE(shape(320).chunks == 5 && shape(320).threads_per_row == 8);  // three chunks: 16 lanes
  EXPECT_TRUE(shape(264).chunks == 5 && shape(264).threads_per_row == 8);
  EXPECT_TRUE(shape(328).chunks == 3 && shape(328).threads_per_row == 16);
  EXPECT_TRUE(shape(160).chunks == 3 && shape(160).threads_per_row == 8);  // 5 chunks on 4 lanes: slower
  for (int64_t hidden : {8, 16, 64, 128, 200, 256, 392, 512}) EXPECT_EQ(shape(hidden).chunks, 2) << hidden;
  EXPECT_TRUE(shape(1152).chunks == 5 && shape(1152).threads_per_row == 32);  // four chunks: two warps
  EXPECT_TRUE(shape(1536).chunks == 6 && shape(1536).threads_per_row == 32);
  EXPECT_TRUE(shape(1544).chunks == 4 && shape(1544).threads_per_row == 64);
  EXPECT_TRUE(shape(1024).chunks == 4 && shape(1024).threads_per_row == 32);
  EXPECT_TRUE(shape(640).chunks == 5 && shape(640).threads_per_row == 16);  // four chunks: 20 of 32 lanes
  EXPECT_TRUE(shape(648).chunks == 4 && shape(648).threads_per_row == 32);
}

TEST(NormRowShape, RowForms) {
  using opente::NormRowForm;
  using opente::NormType;
  // the form whose registers, warps and barriers fit the most blocks an SM
  for (int64_t hidden = 1; hidden <= opente::kNormFwdMaxRegisterHidden + 1; ++hidden) {
    const NormRowShape s = opente::norm_fwd_row_shape(hidden);
    const bool ln_compact = (hidden > 2048 && hidden <= 3072) || (hidden > 4096 && hidden <= 7168) ||
                            (hidden > 8192 && hidden <= 9216) || (hidden > 10240 && hidden <= 12288);
    const NormRowForm ln_expected = hidden <= 512 ? NormRowForm::kImmediates
                                    : ln_compact  ? NormRowForm::kCompact
                                                  : NormRowForm::kWide;
    const bool rms_compact = (hidden > 2048 && hidden <= 3072) || (hidden > 4096 && hidden <= 7168);
    const NormRowForm rms_expected = hidden <= 512   ? NormRowForm::kImmediates
                                     : rms_compact   ? NormRowForm::kCompact
                                                     : NormRowForm::kWide;
    ASSERT_EQ(int(opente::norm_fwd_row_form(s, true, NormType::kLayerNorm)), int(ln_expected)) << hidden;
    ASSERT_EQ(int(opente::norm_fwd_row_form(s, true, NormType::kRMSNorm)), int(rms_expected)) << hidden;
    if (ln_compact) EXPECT_LE(s.block_threads(), opente::kNormFwdCompactMaxThreads) << hidden;
    // the small bucket's kernels are bounded to the blocks it launches
    if (hidden <= 512) EXPECT_LE(s.block_threads(), opente::kNormFwdSmallMaxThreads) << hidden;
    // fp32 or element-wise rows: never compact (their registers exceed the bounds)
    for (NormType type : {NormType::kLayerNorm, NormType::kRMSNorm}) {
      const NormRowForm wide = opente::norm_fwd_row_form(s, /*compact_allowed=*/false, type);
      EXPECT_EQ(int(wide), int(hidden <= 512 ? NormRowForm::kImmediates : NormRowForm::kWide)) << hidden;
    }
  }
}

TEST(NormRowShape, TiledForward) {
  using opente::NormTile;
  using opente::NormType;
  for (int64_t hidden = 1; hidden <= opente::kNormFwdMaxRegisterHidden + 1; ++hidden) {
    for (const NormType type : {NormType::kLayerNorm, NormType::kRMSNorm}) {
      for (const bool rowwise : {false, true}) {
        for (const bool fp32 : {false, true}) {
          for (const int64_t rows :
               {int64_t(8), opente::kNormFwdStagedFp32WideMinRows - 8, opente::kNormFwdStagedFp32WideMinRows}) {
            SCOPED_TRACE(testing::Message() << "tiled forward, " << rows << " x " << hidden << (fp32 ? ", fp32" : "")
                                            << (rowwise ? ", row-wise copy" : "")
                                            << (type == NormType::kRMSNorm ? ", rmsnorm" : ", layernorm"));
            const opente::NormFwdTileShape tile =
                opente::norm_fwd_tile_shape(hidden, rowwise, rows, fp32, type, kMaxSmemPerBlock);
            // the small bucket's rows that fill their lanes (128, 256, 512; 384 with three
            // chunks a thread), 16-bit
            const bool small_shared = !fp32 && (hidden == 128 || hidden == 256 || hidden == 384 || hidden == 512);
            const bool short_shared = small_shared || (hidden >= opente::kNormFwdTiledMinHidden &&
                                                       hidden <= opente::kNormFwdTiledMaxHidden && hidden % 256 == 0);
            const int64_t shared_min = type == NormType::kRMSNorm ? opente::kNormFwdRmsSharedMinHidden
                                                                  : opente::kNormFwdLnSharedMinHidden;
            const bool wide_shared = !short_shared && !fp32 && hidden >= shared_min &&
                                     hidden <= opente::kNormFwdSharedMaxHidden && hidden % 128 == 0;
            const int64_t staged_max = !fp32 ? opente::kNormFwdStagedMaxHidden
                                       : rows >= opente::kNormFwdStagedFp32WideMinRows
                                           ? opente::kNormFwdStagedFp32WideMaxHidden
                                           : opente::kNormFwdStagedFp32MaxHidden;
            const bool staged = !short_shared && !wide_shared && rowwise && hidden >= opente::kNormFwdStagedMinHidden &&
                                hidden <= staged_max && hidden % 8 == 0;
            // 16-bit rows with a row-wise copy where the trailing tiles were timed faster: RMSNorm's
            // past its shared tile but for 10241-12288, LayerNorm's from 12289
            const bool trailing_hidden = type == NormType::kRMSNorm ? hidden > 7168 && (hidden <= 10240 || hidden > 12288)
                                                                    : hidden > 12288;
            const bool trailing = !short_shared && !wide_shared && !staged && rowwise && !fp32 && hidden % 8 == 0 &&
                                  trailing_hidden && hidden <= opente::kNormFwdMaxRegisterHidden;
            ASSERT_EQ(tile.taken(), short_shared || wide_shared || staged || trailing);
            if (!tile.taken()) continue;
            EXPECT_EQ(tile.tile, trailing ? NormTile::kTrailing : staged ? NormTile::kRowwiseCopy : NormTile::kShared);
            // the forward's row groups (same chunks and lanes), more of them a block: up to
            // 1024 threads for the 16-bit rows of the hidden sizes past 1024 (the kernel's
            // __launch_bounds__, kNormFwdBlockBound)
            // (the trailing tiles: the row kernel's blocks of up to 512, two an SM)
            const int max_threads = small_shared                            ? opente::kNormFwdSmallMaxThreads
                                    : !short_shared && !fp32 && !trailing ? opente::kNormFwdStagedMaxBlockThreads
                                                                         : opente::kNormMaxBlockThreads;
            check_shape(tile.rows, hidden, "tiled forward", max_threads);
            // the row kernel's shape for the same call (16-bit rows with an FP8 y take the
            // extra chunk counts: three where they fill more lanes, 5-6 on a warp at 1025-1536)
            const NormRowShape plain = opente::norm_fwd_row_shape(hidden, !fp32);
            // the buckets launch_norm_fwd_tiled instantiates: the small one's with the row kernel's
            // row groups (the same sums), kNormFwdChunks above, 5 or 6 for 16-bit warp rows
            const bool warp_rows = !fp32 && hidden >= opente::kNormFwdWarpRowMinHidden &&
                                   hidden <= opente::kNormFwdWarpRowMaxHidden;
            // launch_norm_fwd_tiled has the trailing tiles' kernels of four chunks alone, kWide
            if (trailing) EXPECT_EQ(tile.rows.chunks, opente::kNormFwdChunks);
            // LayerNorm's trailing kernels build their row group as the whole block
            // (RowGroup::whole_block, norm_fwd_kernel.cuh)
            if (trailing && type == NormType::kLayerNorm) EXPECT_EQ(tile.rows.rows_per_block, 1) << hidden;
            // the kernels of other chunk counts take their groups to fit a warp (__builtin_assume)
            if (tile.rows.chunks != opente::kNormFwdChunks) EXPECT_LE(tile.rows.threads_per_row, 32) << hidden;
            if (tile.rows.chunks == opente::kNormFwdWarpRowMaxChunks) EXPECT_EQ(tile.rows.threads_per_row, 32) << hidden;
            EXPECT_EQ(tile.rows.chunks, small_shared    ? (hidden == 384 ? opente::kNormFwdSmallOddChunks
                                                                         : opente::kNormFwdSmallChunks)
                                        : warp_rows ? opente::norm_fwd_warp_row_chunks(hidden)
                                                    : opente::kNormFwdChunks);
            EXPECT_EQ(tile.rows.chunks, plain.chunks);
            EXPECT_EQ(tile.rows.threads_per_row, plain.threads_per_row);
            EXPECT_EQ(tile.hidden, hidden);
            // the block's row groups divide the tile; whole 32-byte sectors of the transposed copy
            EXPECT_TRUE(is_power_of_two(tile.rows.rows_per_block));
            EXPECT_EQ(tile.tile_rows % tile.rows.rows_per_block, 0);
            EXPECT_EQ(tile.tile_rows % 32, 0);
            if (tile.tile == NormTile::kShared) {
              // the tile's swizzle (row block times 128 / tile_rows) below 16 slots, and the
              // slots of a row within it (hidden % 128 == 0)
              EXPECT_LT((tile.tile_rows / 8 - 1) * (128 / tile.tile_rows), 16);
              EXPECT_EQ(hidden % 128, 0);
              // beside the kernel's static shared memory: the small bucket's blocks an SM, two for
              // the other short rows, one for wide ones
              const size_t blocks = small_shared ? opente::kNormFwdSmallTiledMinBlocks : short_shared ? 2 : 1;
              EXPECT_LE(blocks * (tile.smem_bytes() + opente::kNormFwdStaticSmemBound), size_t(kMaxSmemPerBlock));
            } else {
              EXPECT_EQ(tile.smem_bytes(), 0u);
            }
            if (small_shared) {
              EXPECT_EQ(tile.rows.threads_per_row * tile.rows.chunks * 8, hidden);  // every lane full
              EXPECT_EQ(tile.rows.block_threads(), opente::kNormFwdSmallMaxThreads);
              EXPECT_EQ(tile.tile_rows, opente::kNormFwdSmallTileRows);
            } else if (short_shared) {
              EXPECT_EQ(tile.rows.threads_per_row, 32);  // a warp a row
              EXPECT_EQ(tile.rows.block_threads(), opente::kNormMaxBlockThreads);
            } else if (warp_rows) {
              // rows of a warp (no named barriers): 16 a block
              EXPECT_EQ(tile.rows.threads_per_row, 32);
              EXPECT_EQ(tile.rows.rows_per_block, opente::kNormFwdStagedMaxWarpRowsPerBlock);
            } else {
              // the largest power of two of whole rows within a block, at most 8 (named barriers)
              EXPECT_LE(tile.rows.rows_per_block, opente::kNormFwdStagedMaxRowsPerBlock);
              EXPECT_TRUE(tile.rows.rows_per_block == opente::kNormFwdStagedMaxRowsPerBlock ||
                          2 * tile.rows.block_threads() > max_threads);
            }
          }
        }
      }
    }
  }
  const auto shape = [](int64_t hidden, bool rowwise, int64_t rows, bool fp32,
                        NormType type = NormType::kLayerNorm, size_t smem = kMaxSmemPerBlock) {
    return opente::norm_fwd_tile_shape(hidden, rowwise, rows, fp32, type, smem);
  };
  EXPECT_EQ(shape(512, false, 8, false).tile, NormTile::kShared);  // the small bucket's rows
  EXPECT_EQ(shape(384, true, 8, false).tile, NormTile::kShared);  // three chunks on 16 lanes
  EXPECT_EQ(shape(384, true, 8, false).rows.chunks, opente::kNormFwdSmallOddChunks);
  EXPECT_FALSE(shape(320, true, 8, false).taken());  // not a multiple of 128
  EXPECT_FALSE(shape(384, true, 8, true).taken());   // fp32 rows
  EXPECT_FALSE(shape(512, true, 65536, true).taken());  // fp32 rows
  EXPECT_FALSE(shape(64, true, 65536, false).taken());
  EXPECT_TRUE(shape(768, false, 8, false).taken());
  EXPECT_TRUE(shape(1024, true, 8, false).taken());
  EXPECT_FALSE(shape(896, true, 8, false).taken());
  EXPECT_FALSE(shape(2048, false, 8, false).taken());  // no row-wise copy to read back
  EXPECT_EQ(shape(2048, true, 8, false).tile, NormTile::kRowwiseCopy);
  // 16-bit hidden 4096: blocks of 1024 threads (eight rows of four warps), at any rows
  const opente::NormFwdTileShape wide = shape(4096, true, 8, false);
  EXPECT_EQ(wide.tile, NormTile::kRowwiseCopy);
  EXPECT_EQ(wide.rows.block_threads(), 1024);
  // LayerNorm's 16-bit rows past the row-wise copy's tile (5248 to 7168): the shared tile
  EXPECT_EQ(shape(5120, true, 8, false).tile, NormTile::kRowwiseCopy);
  EXPECT_FALSE(shape(5120, false, 8, false).taken());
  EXPECT_EQ(shape(5248, true, 8, false).tile, NormTile::kShared);
  EXPECT_EQ(shape(6144, false, 65536, false).tile, NormTile::kShared);
  EXPECT_EQ(shape(7168, true, 8, false).smem_bytes(), size_t(224 * 1024));
  EXPECT_FALSE(shape(7296, true, 8, false).taken());  // LayerNorm's trailing tiles from 12289
  EXPECT_EQ(shape(12296, true, 8, false).tile, NormTile::kTrailing);
  EXPECT_FALSE(shape(12296, false, 8, false).taken());  // the trailing tiles need the row-wise copy
  EXPECT_FALSE(shape(6144, true, 65536, true).taken());  // fp32 rows
  EXPECT_FALSE(shape(16384, true, 8, true).taken());
  // 16-bit hidden 16384 and 8192: the row kernel's blocks, one row of 16 warps, two of 8
  EXPECT_EQ(shape(16384, true, 8, false).rows.block_threads(), 512);
  EXPECT_EQ(shape(16384, true, 8, false).rows.rows_per_block, 1);
  EXPECT_EQ(shape(8192, true, 8, false, NormType::kRMSNorm).rows.rows_per_block, 2);
  EXPECT_FALSE(shape(16392, true, 8, false).taken());  // past the register rows
  // fp32 hidden 4096: the two passes below 16384 rows, the tile from the row-wise copy from there
  EXPECT_FALSE(shape(4096, true, 8192, true).taken());
  EXPECT_EQ(shape(4096, true, 16384, true).rows.block_threads(), 512);
  // RMSNorm, 16-bit rows of hidden 3072 to 7168: the tile in shared memory, with or
  // without a row-wise copy, 224 KiB at 7168; where the GPU's block holds less (an A100:
  // 163 KiB), the tile from the row-wise copy up to 5120 and the two passes above
  const opente::NormFwdTileShape rms = shape(7168, false, 8, false, NormType::kRMSNorm);
  EXPECT_EQ(rms.tile, NormTile::kShared);
  EXPECT_EQ(rms.smem_bytes(), size_t(224 * 1024));
  EXPECT_EQ(rms.rows.block_threads(), 4 * 224);
  EXPECT_EQ(shape(3072, true, 8, false, NormType::kRMSNorm).tile, NormTile::kShared);
  EXPECT_EQ(shape(2560, true, 8, false, NormType::kRMSNorm).tile, NormTile::kRowwiseCopy);
  EXPECT_EQ(shape(4104, true, 8, false, NormType::kRMSNorm).tile, NormTile::kRowwiseCopy);  // not a multiple of 128
  EXPECT_EQ(shape(8192, true, 8, false, NormType::kRMSNorm).tile, NormTile::kTrailing);
  EXPECT_EQ(shape(7176, true, 8, false, NormType::kRMSNorm).tile, NormTile::kTrailing);
  EXPECT_FALSE(shape(12288, true, 8, false, NormType::kRMSNorm).taken());  // the row kernel's three blocks an SM
  EXPECT_EQ(shape(12296, true, 8, false, NormType::kRMSNorm).tile, NormTile::kTrailing);
  EXPECT_FALSE(shape(4096, true, 16384, true, NormType::kRMSNorm).tile == NormTile::kShared);  // fp32 rows
  constexpr size_t kA100Smem = 163 * 1024;
  EXPECT_EQ(shape(5120, true, 8, false, NormType::kRMSNorm, kA100Smem).tile, NormTile::kShared);
  EXPECT_EQ(shape(5120, false, 8, false, NormType::kRMSNorm, kA100Smem).tile, NormTile::kShared);
  EXPECT_FALSE(shape(6144, true, 8, false, NormType::kRMSNorm, kA100Smem).taken());
  EXPECT_FALSE(shape(5248, true, 8, false, NormType::kLayerNorm, kA100Smem).taken());
}

// The trailing tiles' schedule (norm_trailing.h), for every row count to a few tiles past
// the lag and the shapes the forward launches: the tickets' shares transpose every unit of
// every tile once, a share waits only for row groups of smaller tickets (so for blocks that
// hold their tickets already), and a tile's counter reaches what the share waits for.
TEST(NormRowShape, TrailingSchedule) {
  for (const int rows_per_block : {1, 2, 4, 8}) {
    const int parts = opente::kNormFwdTrailingTileRows / rows_per_block;
    for (const int64_t hidden : {int64_t(1032), int64_t(16384)}) {  // 516 and 8192 units a tile
      for (const int64_t grid : {int64_t(1), int64_t(3), int64_t(264)}) {
        if (hidden > 1032 && grid > 3) continue;  // (the units to count: a few seconds more)
        const int64_t lag = opente::norm_trailing_lag(grid, rows_per_block, opente::kNormFwdTrailingTileRows);
        EXPECT_GE(lag, parts);
        for (int64_t rows = 8; rows <= 8 * lag + 200; rows += rows < 200 ? 8 : 1000) {
          SCOPED_TRACE(testing::Message() << rows << " x " << hidden << ", " << rows_per_block << " rows a block, lag "
                                          << lag);
          const opente::NormTrailingSchedule schedule{rows, hidden, rows_per_block, opente::kNormFwdTrailingTileRows,
                                                      lag};
          ASSERT_EQ(schedule.tickets(), schedule.row_groups() + lag);
          // every tile's rows, counted by its row groups, and the groups' ticket at most
          std::vector<int64_t> written(size_t(schedule.tiles()), 0), last_group(size_t(schedule.tiles()), -1);
          for (int64_t group = 0; group < schedule.row_groups(); ++group) {
            const int64_t tile = group * rows_per_block / opente::kNormFwdTrailingTileRows;
            ASSERT_LT(tile, schedule.tiles());
            // a row group lies in one tile
            ASSERT_EQ((group * rows_per_block + schedule.rows_of_group(group) - 1) / opente::kNormFwdTrailingTileRows,
                      tile);
            written[size_t(tile)] += schedule.rows_of_group(group);
            last_group[size_t(tile)] = group;
          }
          int64_t all_rows = 0;
          for (int64_t tile = 0; tile < schedule.tiles(); ++tile) {
            ASSERT_EQ(written[size_t(tile)], schedule.rows_of_tile(tile)) << "tile " << tile;
            all_rows += written[size_t(tile)];
          }
          ASSERT_EQ(all_rows, rows);
          // the shares: each unit of each tile once, from a ticket past every row group of the tile
          std::vector<int> covered(size_t(schedule.tiles() * schedule.units_per_tile()), 0);
          for (int64_t ticket = 0; ticket < schedule.tickets(); ++ticket) {
            const opente::NormTrailingShare share = schedule.share(ticket);
            if (ticket < lag) {
              ASSERT_EQ(share.tile, -1) << "ticket " << ticket;
              continue;
            }
            ASSERT_GE(share.tile, 0) << "ticket " << ticket;
            ASSERT_LT(last_group[size_t(share.tile)], ticket) << "ticket " << ticket;
            ASSERT_LE(share.unit_begin, share.unit_end);
            ASSERT_LE(share.unit_end, schedule.units_per_tile());
            for (int64_t unit = share.unit_begin; unit < share.unit_end; ++unit) {
              ++covered[size_t(share.tile * schedule.units_per_tile() + unit)];
            }
          }
          for (size_t unit = 0; unit < covered.size(); ++unit) ASSERT_EQ(covered[unit], 1) << "unit " << unit;
        }
      }
    }
  }
  // the counters' bytes: the ticket and one a tile
  EXPECT_EQ(opente::norm_trailing_counter_bytes(8, 32), 2 * sizeof(unsigned));
  EXPECT_EQ(opente::norm_trailing_counter_bytes(4104, 32), (1 + 129) * sizeof(unsigned));
}

TEST(NormRowShape, BackwardBuckets) {
  constexpr int64_t kRegisterSums = int64_t(opente::kNormMaxBlockThreads) * opente::kNormBwdChunks * 8;  // 8192
  for (int64_t hidden = 1; hidden <= opente::kNormBwdMaxRegisterHidden; ++hidden) {
    const NormRowShape s = opente::norm_bwd_row_shape(hidden);
    check_shape(s, hidden, "backward");
    const int64_t tile = int64_t(s.chunks) * 8 * s.threads_per_row;  // gamma's, in shared memory
    if (hidden <= kRegisterSums) {
      EXPECT_EQ(s.chunks, opente::kNormBwdChunks) << hidden;
      // plus the groups' dgamma / dbeta column sums, and two stage buffers of a 16-bit
      // row's dz and x (norm_bwd.cu; counted for every size, though only blocks of
      // several rows stage)
      const int64_t staged = 2 * 2 * int64_t(s.chunks) * 16 * s.block_threads();
      EXPECT_LE((tile + int64_t(s.rows_per_block) * 2 * hidden) * 4 + staged, kMaxSmemPerBlock) << hidden;
    } else {
      EXPECT_EQ(s.chunks, opente::kNormBwdLongChunks) << hidden;
      // one row group a block, whose dgamma / dbeta sums live in shared memory (tile order)
      EXPECT_EQ(s.rows_per_block, 1) << hidden;
      EXPECT_LE(3 * tile * 4, kMaxSmemPerBlock) << hidden;
    }
  }
  EXPECT_FALSE(opente::norm_bwd_row_shape(opente::kNormBwdMaxRegisterHidden + 1).in_registers());
}

TEST(NormRowShape, PipelinedBackward) {
  for (int64_t hidden = 1; hidden <= opente::kNormBwdMaxRegisterHidden + 1; ++hidden) {
    SCOPED_TRACE(testing::Message() << "pipelined backward, hidden " << hidden);
    const NormRowShape s = opente::norm_bwd_pipelined_row_shape(hidden);
    const bool taken = hidden > opente::kNormBwdPipelinedMinHidden && hidden <= opente::kNormBwdMaxRegisterHidden;
    ASSERT_EQ(s.in_registers(), taken);
    if (!taken) continue;
    // one row a block of whole warps, the smallest that covers the row, within the
    // kernel's __launch_bounds__ and its reduction's scratch (kMaxWarps)
    EXPECT_EQ(s.chunks, opente::kNormBwdPipelinedChunks);
    EXPECT_EQ(s.rows_per_block, 1);
    const int t = s.threads_per_row;
    EXPECT_EQ(t % 32, 0) << t;
    EXPECT_LE(t, opente::kNormBwdPipelinedMaxThreads);
    const int64_t per_thread = int64_t(s.chunks) * 8;
    EXPECT_GE(int64_t(t) * per_thread, hidden);
    EXPECT_LT(int64_t(t - 32) * per_thread, hidden);
    // gamma's fp32 tile and two stages of dz and x (16 bytes a chunk each)
    const int64_t smem = int64_t(s.chunks) * 8 * t * 4 + 2 * 2 * int64_t(s.chunks) * 16 * t;
    EXPECT_LE(smem, kMaxSmemPerBlock);
  }
}

TEST(NormRowShape, FinalizeColumns) {
  // An H100's 132 SMs: narrow blocks while 32-column blocks would be fewer than 198
  constexpr int kH100 = 132;
  for (int64_t hidden : {1, 64, 512, 1024, 2048, 4096, 5120, 6304}) {
    EXPECT_EQ(opente::norm_finalize_columns(hidden, kH100), opente::kNormFinalizeNarrowColumns) << hidden;
  }
  for (int64_t hidden : {6305, 6336, 8192, 12288, 16384, 65536}) {
    EXPECT_EQ(opente::norm_finalize_columns(hidden, kH100), opente::kNormFinalizeWideColumns) << hidden;
  }
  // the threshold scales with the SM count (a part with half an H100's SMs)
  EXPECT_EQ(opente::norm_finalize_columns(4096, 66), opente::kNormFinalizeWideColumns);
  EXPECT_EQ(opente::norm_finalize_columns(3136, 66), opente::kNormFinalizeNarrowColumns);
  // both divide the finalize's 512 threads into whole rows of lanes
  EXPECT_EQ(512 % opente::kNormFinalizeWideColumns, 0);
  EXPECT_EQ(512 % opente::kNormFinalizeNarrowColumns, 0);
}

TEST(NormRowShape, EvenStepsGrid) {
  using opente::norm_even_steps_grid;
  // an H100's wave of one block an SM: 2048 rows took 16 steps on 68 blocks, 15 on 64
  EXPECT_EQ(norm_even_steps_grid(2048, 132), 128);
  EXPECT_EQ(norm_even_steps_grid(4096, 132), 128);   // 31.03 steps: 32 on 128 blocks
  EXPECT_EQ(norm_even_steps_grid(8192, 396), 391);   // three blocks an SM, 21 steps
  EXPECT_EQ(norm_even_steps_grid(2112, 132), 132);   // already even
  // where the even grid would idle more than a sixteenth of the blocks: unchanged
  EXPECT_EQ(norm_even_steps_grid(131, 130), 130);    // 66 blocks would take the 2 steps
  EXPECT_EQ(norm_even_steps_grid(1000, 396), 396);   // 334 would
  EXPECT_EQ(norm_even_steps_grid(100, 132), 132);    // fewer items than blocks
  EXPECT_EQ(norm_even_steps_grid(5, 1), 1);
  // everywhere: no more blocks than given, no more steps, and the fewest blocks for those
  // steps where the grid changes, which then loses at most a sixteenth of its blocks
  for (int64_t grid = 1; grid <= 600; grid += 7) {
    for (int64_t items = 1; items <= 40 * grid; items += 1 + items / 13) {
      SCOPED_TRACE(testing::Message() << items << " items, grid " << grid);
      const int64_t even = norm_even_steps_grid(items, grid);
      const int64_t steps = (items + grid - 1) / grid;
      ASSERT_GE(even, 1);
      ASSERT_LE(even, grid);
      ASSERT_EQ((items + even - 1) / even, steps);
      if (even != grid) {
        EXPECT_LE((grid - even) * 16, grid);
        EXPECT_LT((even - 1) * steps, items) << "not the fewest";  // one block fewer would need a step more
      }
    }
  }
}

TEST(NormRowShape, BenchmarkedSizes) {
  auto same = [](const NormRowShape& s, int chunks, int threads, int rows) {
    return s.chunks == chunks && s.threads_per_row == threads && s.rows_per_block == rows;
  };
  // forward: 8 lanes a row for hidden 128, a warp for 1024, 4 warps for 4096
  EXPECT_TRUE(same(opente::norm_fwd_row_shape(128), 2, 8, 32));
  EXPECT_TRUE(same(opente::norm_fwd_row_shape(1024), 4, 32, 8));
  EXPECT_TRUE(same(opente::norm_fwd_row_shape(4096), 4, 128, 2));
  EXPECT_TRUE(same(opente::norm_fwd_row_shape(8192), 4, 256, 1));
  EXPECT_TRUE(same(opente::norm_fwd_row_shape(16384), 4, 512, 1));
  // backward: 512-thread blocks
  EXPECT_TRUE(same(opente::norm_bwd_row_shape(1), 2, 1, 512));
  EXPECT_TRUE(same(opente::norm_bwd_row_shape(1024), 2, 64, 8));
  EXPECT_TRUE(same(opente::norm_bwd_row_shape(4096), 2, 256, 2));
  EXPECT_TRUE(same(opente::norm_bwd_row_shape(8192), 2, 512, 1));
  EXPECT_TRUE(same(opente::norm_bwd_row_shape(8193), 4, 288, 1));
  EXPECT_TRUE(same(opente::norm_bwd_row_shape(16384), 4, 512, 1));
  // the pipelined backward (16-bit rows past 4096): a block a row, 16 elements a thread
  EXPECT_TRUE(same(opente::norm_bwd_pipelined_row_shape(5120), 2, 320, 1));
  EXPECT_TRUE(same(opente::norm_bwd_pipelined_row_shape(8192), 2, 512, 1));
  EXPECT_TRUE(same(opente::norm_bwd_pipelined_row_shape(16384), 2, 1024, 1));
}

}  // namespace
