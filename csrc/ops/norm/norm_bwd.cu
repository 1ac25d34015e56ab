// LayerNorm and RMSNorm backward on the GPU, in two kernels (one for rows up to
// kNormBwdInGridFinalizeMaxHidden).
//
// 1. Rows (vectorized 16-bit rows longer than 4096 take norm_bwd_pipelined.cu's
//    kernel instead, which writes the same partial sums): row groups as in the
//    forward (norm_launch.h). A group loads its row of dz and x once into
//    registers, in their dtype, takes the row's two sums (one shuffle reduction of
//    a pair) and writes dx. Each thread also adds dz * xhat and dz for its columns
//    over all the rows it visits: in fp32 registers, or, for a row group alone in
//    its block (bwd_sums_shared), in its own slots of shared memory, with x hat and
//    dz * gamma recomputed for dx rather than held across the reduction. At the end
//    the block adds its groups' sums in shared memory (a fixed pairwise order) and
//    writes one [2, hidden] row of partial sums to the workspace. So dz and x are
//    read exactly once.
// 2. Finalize: threads along hidden add the blocks' partial rows (coalesced) and
//    write dgamma and dbeta in the weights' dtype. A grid of one block (a few rows)
//    writes them itself instead, and the finalize is not launched. The finalize is a
//    programmatic dependent launch (common/cuda_dependent_launch.cuh): its blocks
//    start on SMs the rows kernel's last blocks leave free and wait there for its
//    partials, which saved 1-2 us a backward at hidden 8192-16384 (H100). Rows up
//    to kNormBwdInGridFinalizeMaxHidden skip it: the rows kernel is a cooperative
//    launch, and once a grid-wide barrier has seen every partial row written, each
//    block sums a share of the columns (finalize_share), 1-2 us sooner (H100).
// The backward runs one wave (one to four blocks an SM) of at most kNormMaxRowBlocks
// blocks, so its partial sums fit te_norm_workspace_size's [min(rows, 512), 2, hidden]
// floats. The sums' order depends on the grid (the GPU's SM count), and is the same
// from run to run.
// Rows too long for registers go to norm_fallback.cu, whose partials the same
// finalize kernel sums.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_dependent_launch.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace {

using namespace norm_kernels;

// dz * xhat and dz of chunk j added to this thread's slots of the shared-memory
// accumulators (the long-row bucket), kept in the weight tile's order: [kSums][tile].
template <int kSums>
__device__ __forceinline__ void accumulate_chunk(float* sums, int tile, const RowGroup& group, int j,
                                                 const float (&dz)[kChunk], const float (&xhat)[kChunk]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int quad = (j * 2 + h) * group.threads + group.thread;
    float4* dgamma = reinterpret_cast<float4*>(sums) + quad;
    float4 a = *dgamma;
    a.x += dz[4 * h] * xhat[4 * h], a.y += dz[4 * h + 1] * xhat[4 * h + 1];
    a.z += dz[4 * h + 2] * xhat[4 * h + 2], a.w += dz[4 * h + 3] * xhat[4 * h + 3];
    *dgamma = a;
    if constexpr (kSums == 2) {
      float4* dbeta = reinterpret_cast<float4*>(sums + tile) + quad;
      float4 b = *dbeta;
      b.x += dz[4 * h], b.y += dz[4 * h + 1], b.z += dz[4 * h + 2], b.w += dz[4 * h + 3];
      *dbeta = b;
    }
  }
}

// Where a thread adds up its columns' dgamma / dbeta: in shared memory for the long
// rows (32 elements a thread) and for 16-bit rows alone in their block (hidden 4097
// to 8192; here only element-by-element ones: the vectorized go to the pipelined
// kernel), in registers otherwise (a block's groups then fold their sums through
// shared memory at the end; fp32 rows keep them there too). For blocks of several
// rows the shared sums lost (RMSNorm at 16384 x 4096: 90.4% -> 82.5% of copy
// bandwidth, 32768 x 1024: 84.4% -> 78.7%, H100).
bool bwd_sums_shared(const NormBwdParams& p, const NormRowShape& shape) {
  return shape.chunks == kNormBwdLongChunks || (shape.rows_per_block == 1 && dtype_size(p.in_dtype) == 2);
}

// Whether the rows kernel stages its rows through shared memory: vectorized 16-bit
// rows of the register bucket, in blocks of several rows (hidden <= 4096). Not fp32
// (twice the bytes; at hidden 8192 the buffers, the weight tile and the sums would
// not fit), nor the rows alone in their block, whose sums take the shared memory
// (staged, layernorm at 8192 x 8192 was 3% (H100) to 6% (H200) slower, when those
// still held their sums in registers).
bool bwd_rows_staged(const NormBwdParams& p, const NormRowShape& shape, bool vectorized) {
  return vectorized && shape.chunks == kNormBwdChunks && dtype_size(p.in_dtype) == 2 && !bwd_sums_shared(p, shape);
}

// A row group's share of one row's backward inputs: dz and x as loaded (RowShare),
// and the row's statistics. mu and rsigma are 0 for a row past the last.
template <class In, int kChunks, bool kVectorized>
struct RowInputs {
  RowShare<In, kChunks, kVectorized> dz, x;
  float mu, rsigma;

  __device__ __forceinline__ void load(const NormBwdParams& p, const In* dz_rows, const In* x_rows, int64_t r,
                                       const RowGroup& group, bool layernorm) {
    const int limit = r < p.rows ? int(p.hidden) : 0;
    dz.load(dz_rows + r * p.hidden, group, limit);
    x.load(x_rows + r * p.hidden, group, limit);
    load_statistics(p, r, layernorm);
  }

  // Staged loads (see RowShare::stage): a row's dz and x into one buffer of two
  // stages (dz's, then x's), read back later with load_staged.
  __device__ __forceinline__ static void stage(uint4* buffer, int stage_words, const NormBwdParams& p,
                                               const In* dz_rows, const In* x_rows, int64_t r,
                                               const RowGroup& group) {
    const bool active = r < p.rows;
    const int64_t offset = (active ? r : 0) * p.hidden;  // row 0 stands in past the last row (copies nothing)
    const int limit = active ? int(p.hidden) : 0;
    RowShare<In, kChunks, kVectorized>::stage(buffer, dz_rows + offset, group, limit);
    RowShare<In, kChunks, kVectorized>::stage(buffer + stage_words, x_rows + offset, group, limit);
  }

  __device__ __forceinline__ void load_staged(const uint4* buffer, int stage_words) {
    dz.load_staged(buffer);
    x.load_staged(buffer + stage_words);
  }

  __device__ __forceinline__ void load_statistics(const NormBwdParams& p, int64_t r, bool layernorm) {
    const float2 stats = statistics_of(p, r, layernorm);
    mu = stats.x, rsigma = stats.y;
  }

  // Row r's (mu, rsigma); zeros for a row past the last.
  __device__ __forceinline__ static float2 statistics_of(const NormBwdParams& p, int64_t r, bool layernorm) {
    const bool active = r < p.rows;
    return make_float2(layernorm && active ? p.mu[r] : 0.0f, active ? p.rsigma[r] : 0.0f);
  }

  // Chunk j's x hat and dz * gamma (past the row: dz * gamma 0, x hat finite).
  template <bool kLayerNorm>
  __device__ __forceinline__ void xhat_and_dyg(const float* gamma_tile, const RowGroup& group, int j,
                                               float (&xhat)[kChunk], float (&dyg)[kChunk]) const {
    float gamma[kChunk];
    read_weights(gamma_tile, group, j, gamma);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      xhat[i] = bwd_xhat<kLayerNorm>(x.at(j, i), mu, rsigma);
      dyg[i] = dz.at(j, i) * gamma[i];
    }
  }
};

// This block's share of the finalize, inside the rows kernel once the whole grid has
// written its partial rows (finalize_in_grid): columns [b * width, (b + 1) * width) of
// the [slots][2 * hidden] partial rows (dgamma's hidden columns, then dbeta's), each
// summed by up to kInGridLanes lanes of threads (a compensated sum over every lanes-th
// slot), the lanes then added pairwise in shared memory (`scratch`, blockDim.x floats).
// The order depends only on the grid, so the bits are the same from run to run.
constexpr int kInGridLanes = 32;

__device__ __forceinline__ void finalize_share(const float* partials, int slots, int hidden, int column_sums,
                                               float* scratch, void* dgamma, void* dbeta, te_dtype w_dtype) {
  const int columns = column_sums * hidden;
  const int width = (columns + int(gridDim.x) - 1) / int(gridDim.x);
  const int first = int(blockIdx.x) * width;
  const int threads = int(blockDim.x);
  for (int base = 0; base < width; base += threads) {
    const int n = min(threads, width - base);
    int lanes = 1;
    while (2 * lanes * n <= threads && 2 * lanes <= kInGridLanes) lanes *= 2;
    const int tx = int(threadIdx.x) % n, ty = int(threadIdx.x) / n;
    const int k = first + base + tx;
    if (ty < lanes) {
      KahanSum sum;
      if (k < columns) {
        // kBatch slots' loads in flight before their sums, as many as a lane has at a grid
        // of up to kBatch * lanes blocks (a wave of 132 one-block SMs: 5 a lane): this sits on
        // the op's critical path, and batches of 4 left a fifth load, a second L2 round trip,
        // to the first lanes of each column. The sums in slot order, as one at a time.
        // Batches of 24, and this batch's addresses and tests in fewer integer instructions,
        // were both 0.5-2.8% slower on an H100 (benchmarks/RESULTS.md, seventy-first session).
        constexpr int kBatch = 8;
        for (int s = ty; s < slots; s += kBatch * lanes) {
          float v[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            v[u] = s + u * lanes < slots ? partials[int64_t(s + u * lanes) * 2 * hidden + k] : 0.0f;
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            if (s + u * lanes < slots) sum.add(v[u]);
          }
        }
      }
      scratch[ty * n + tx] = sum.sum;
    }
    for (int half = lanes / 2; half >= 1; half /= 2) {
      __syncthreads();
      if (ty < half) scratch[ty * n + tx] += scratch[(ty + half) * n + tx];
    }
    __syncthreads();
    if (ty == 0 && k < columns) {
      if (k < hidden) {
        store_param(dgamma, k, w_dtype, scratch[tx]);
      } else {
        store_param(dbeta, k - hidden, w_dtype, scratch[tx]);
      }
    }
    __syncthreads();  // scratch is reused by the next columns
  }
}

// The block's row groups' column sums end in rows_per_block slices of shared memory,
// folded pairwise: slices [half, n) onto [0, n - half), half = (n + 1) / 2, until one is
// left. The last rounds, from at most kRegisterFoldSlices slices, run in registers, a
// quad of every slice a thread (fold_quad_slices), in the same order: the same bits.
constexpr int kRegisterFoldSlices = 8;

__device__ __forceinline__ float4 add_quads(float4 a, const float4& b) {
  a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
  return a;
}

// The rounds from kSlices slices, s[0] the result: unrolled, so s stays in registers.
template <int kSlices>
__device__ __forceinline__ void fold_slices_in_order(float4 (&s)[kRegisterFoldSlices]) {
  if constexpr (kSlices > 1) {
    constexpr int half = (kSlices + 1) / 2;
#pragma unroll
    for (int k = 0; k < kSlices - half; ++k) s[k] = add_quads(s[k], s[k + half]);
    fold_slices_in_order<half>(s);
  }
}

// Slice k's quad at first[k * stride], for k < slices (1 to kRegisterFoldSlices), folded.
__device__ __forceinline__ float4 fold_quad_slices(const float4* first, int stride, int slices) {
  float4 s[kRegisterFoldSlices];
#pragma unroll
  for (int k = 0; k < kRegisterFoldSlices; ++k) {
    if (k < slices) s[k] = first[k * stride];  // every load before the first add
  }
  switch (slices) {
    case 8: fold_slices_in_order<8>(s); break;
    case 7: fold_slices_in_order<7>(s); break;
    case 6: fold_slices_in_order<6>(s); break;
    case 5: fold_slices_in_order<5>(s); break;
    case 4: fold_slices_in_order<4>(s); break;
    case 3: fold_slices_in_order<3>(s); break;
    case 2: fold_slices_in_order<2>(s); break;
    default: break;  // one slice: the sums themselves
  }
  return s[0];
}
static_assert(kRegisterFoldSlices == 8, "fold_quad_slices' cases go up to 8 slices");

// Partial sums written by block b: partials[b][0][c] = sum dz * xhat, partials[b][1][c]
// = sum dz (LayerNorm only) over the block's rows. Each thread adds them for its
// columns over the rows it visits: in registers (kNormBwdChunks), or, for the long
// rows of the kNormBwdLongChunks bucket (one row group a block), in shared memory.
// Dynamic shared memory (bwd_smem_bytes): the stage buffers of staged rows (below),
// gamma's weight tile, then the sums.
//
// kStaged (bwd_rows_staged: vectorized 16-bit rows, blocks of several): the next
// row's dz and x are copied into shared memory (cp.async) while the group works on
// this one (2-11% faster, H200), and its mu and rsigma loaded into two registers (see
// the row loop). Loading dz and x into registers ahead instead (tried in the sixth
// session) took registers the bucket has no room for, and was 9-17% slower.
// The forward does not stage: it is bound by instruction issue, and staged it was
// 5-20% slower (H100, seventh session).
//
// kSharedSums (bwd_sums_shared: one row group a block): the column sums in shared
// memory and x hat, dz * gamma recomputed for dx (holding them spilled the long
// rows' registers). Only rows the pipelined kernel does not take come here: fp32,
// and 16-bit rows element by element (whose 64-register form for two blocks an SM
// spilled 84-176 bytes).
template <te_dtype kIn, int kChunks, bool kLayerNorm, bool kVectorized, bool kStaged, bool kSharedSums>
__global__ void __launch_bounds__(kNormMaxBlockThreads)
    norm_bwd_rows_kernel(NormBwdParams p, int threads_per_row, int rows_per_block, float* partials,
                         bool finalize_in_grid) {
  using In = typename CudaType<kIn>::type;
  // LayerNorm reduces (sum dyg, sum dyg * xhat) at once; RMSNorm only the second.
  using RowSums = std::conditional_t<kLayerNorm, float2, float>;
  constexpr int kColumnSums = kLayerNorm ? 2 : 1;  // dgamma (and dbeta)
  static_assert(kSharedSums || kChunks == kNormBwdChunks, "the long rows' sums do not fit in registers");
  static_assert(!kStaged || (kVectorized && !kSharedSums), "staged rows: 16-byte vectors, sums in registers");
  using Inputs = RowInputs<In, kChunks, kVectorized>;
  allow_dependent_launch();  // the finalize may take SMs our last blocks leave free
  extern __shared__ float4 smem[];
  __shared__ RowSums scratch[2 * kNormMaxBlockWarps];
  const RowGroup group(threads_per_row);
  const int hidden = int(p.hidden);  // <= kNormBwdMaxRegisterHidden
  const int tile = weight_tile_floats(kChunks, threads_per_row);
  // [2 buffers][dz, x][RowShare::kStageWords * blockDim.x] when kStaged
  uint4* stages = reinterpret_cast<uint4*>(smem);
  const int stage_words = RowShare<In, kChunks, kVectorized>::kStageWords * int(blockDim.x);
  float* gamma_tile = reinterpret_cast<float*>(smem) + (kStaged ? 2 * 2 * 4 * stage_words : 0);
  // kSharedSums: [kColumnSums][tile]; else [rows_per_block][kColumnSums][tile]; both in the tile's order
  float* sums = gamma_tile + tile;
  // gamma's tile (and the shared sums' zeros); staged rows issue their first step's
  // copies before it (kept here otherwise: moved there, the fp32 rows kernels took 5-8
  // more registers)
  auto stage_block = [&] {
    stage_weights<kChunks>(p.gamma, p.w_dtype, hidden, p.zero_centered_gamma ? 1.0f : 0.0f, threads_per_row,
                           gamma_tile);
    if constexpr (kSharedSums) {
      for (int f = int(threadIdx.x); f < kColumnSums * tile; f += int(blockDim.x)) sums[f] = 0.0f;
    }
    __syncthreads();
  };
  if constexpr (!kStaged) stage_block();
  // this thread's columns, over its rows (unused with kSharedSums)
  float dgamma[kChunks][kChunk] = {}, dbeta[kChunks][kChunk] = {};
  RowReduction<RowSums> reduction(scratch, group);
  const float inv_hidden = 1.0f / float(hidden);

  // Block-uniform trip count, as in the forward.
  const In* dz_rows = static_cast<const In*>(p.dz);  // [rows, hidden]
  const In* x_rows = static_cast<const In*>(p.x);    // [rows, hidden]
  const int64_t stride = int64_t(gridDim.x) * rows_per_block;
  int64_t r = int64_t(blockIdx.x) * rows_per_block + group.index;
  // Staged rows load the statistics a step ahead too, beside the copies. Loaded where
  // x hat first needs them, a global load's whole latency stood between every row and
  // its sums (ncu, layernorm at 16384 x 2048, H100: warps waited on L1TEX data in 42%
  // of their cycles). A step ahead, layernorm (H100, alternating A/B): 16384 x 768
  // 43.3 -> 39.0 us, 8192 x 3072 74.8 -> 64.4, 16384 x 2048 84.9 -> 81.1, 16384 x 4096
  // 160.1 -> 152.3; rmsnorm 16384 x 768 38.7 -> 35.9, but 16384 x 4096 147.9 -> 153.0
  // (both above 89% of a same-bytes copy).
  [[maybe_unused]] float2 next_statistics = make_float2(0.0f, 0.0f);
  if constexpr (kStaged) {
    Inputs::stage(stages, stage_words, p, dz_rows, x_rows, r, group);
    commit_async_copies();
    next_statistics = Inputs::statistics_of(p, r, kLayerNorm);
  }
  if constexpr (kStaged) stage_block();  // behind the first step's copies, which it overlaps
  int buffer = 0;
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < p.rows;
       first += stride, r += stride, buffer ^= 1) {
    Inputs row;
    if constexpr (kStaged) {
      // the next step's copies first (zeros past the last row: no traffic), then this one's
      Inputs::stage(stages + (buffer ^ 1) * 2 * stage_words, stage_words, p, dz_rows, x_rows, r + stride, group);
      commit_async_copies();
      row.mu = next_statistics.x, row.rsigma = next_statistics.y;
      next_statistics = Inputs::statistics_of(p, r + stride, kLayerNorm);
      wait_async_copies<1>();
      row.load_staged(stages + buffer * 2 * stage_words, stage_words);
    } else {
      row.load(p, dz_rows, x_rows, r, group, kLayerNorm);
    }

    // The CPU reference's formulas, element by element. Past the row dz = 0 and x = 0
    // (the loads' zero fill), so x hat is finite there and every sum adds 0 for the
    // column (gamma's tile holds 0 there too); a group past the last row has dz = 0 and
    // rsigma = 0 throughout.
    float sum_dyg = 0.0f, sum_dyg_xhat = 0.0f;
    // x hat and dz * gamma, held for dx when kHold (sums in registers: faster than
    // recomputing them), recomputed there otherwise (the long rows' registers went to
    // spills when they were held)
    constexpr bool kHold = !kSharedSums;
    float held_xhat[kHold ? kChunks : 1][kChunk], held_dyg[kHold ? kChunks : 1][kChunk];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float xhat[kChunk], dyg[kChunk], dyg_xhat[kChunk];
      row.template xhat_and_dyg<kLayerNorm>(gamma_tile, group, j, xhat, dyg);
      if constexpr (kHold) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) held_xhat[j][i] = xhat[i], held_dyg[j][i] = dyg[i];
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        dyg_xhat[i] = dyg[i] * xhat[i];
        if constexpr (!kSharedSums) {
          dgamma[j][i] += row.dz.at(j, i) * xhat[i];
          if constexpr (kLayerNorm) dbeta[j][i] += row.dz.at(j, i);
        }
      }
      if constexpr (kSharedSums) {
        float dz[kChunk];
#pragma unroll
        for (int i = 0; i < kChunk; ++i) dz[i] = row.dz.at(j, i);
        accumulate_chunk<kColumnSums>(sums, tile, group, j, dz, xhat);
      }
      if constexpr (kLayerNorm) sum_dyg += chunk_sum(dyg);
      sum_dyg_xhat += chunk_sum(dyg_xhat);
    }
    const float2 means = bwd_row_means<kLayerNorm>(reduction, sum_dyg, sum_dyg_xhat, inv_hidden);
    const float mean_dyg = means.x, mean_dyg_xhat = means.y;

    if (r < p.rows) {
      In* dx_row = static_cast<In*>(p.dx) + r * p.hidden;  // [hidden]
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        float xhat[kChunk], dyg[kChunk], dx[kChunk];
        if constexpr (kHold) {
#pragma unroll
          for (int i = 0; i < kChunk; ++i) xhat[i] = held_xhat[j][i], dyg[i] = held_dyg[j][i];
        } else {
          row.template xhat_and_dyg<kLayerNorm>(gamma_tile, group, j, xhat, dyg);
        }
#pragma unroll
        for (int i = 0; i < kChunk; ++i) dx[i] = row.rsigma * (dyg[i] - mean_dyg - xhat[i] * mean_dyg_xhat);
        store_chunk<kVectorized, kIn>(dx_row, group.column(j), hidden, dx);
      }
    }
  }

  if constexpr (kStaged) wait_all_async_copies();  // the zero-filled copies past the last row

  float* out = partials + int64_t(blockIdx.x) * 2 * hidden;  // [2, hidden]; RMSNorm writes the first
  // A grid of one block (a few rows) holds the whole sums: it writes dgamma / dbeta
  // itself, rounded once as the finalize rounds a sum of one partial row, and the
  // finalize kernel is not launched.
  const bool direct = gridDim.x == 1;
  // column sum k of [2, hidden]: dgamma's (k < hidden), then dbeta's
  auto emit = [&](int k, float v) {
    if (!direct) {
      out[k] = v;
    } else if (k < hidden) {
      store_param(p.dgamma, k, p.w_dtype, v);
    } else {
      store_param(p.dbeta, k - hidden, p.w_dtype, v);
    }
  };
  if constexpr (kSharedSums) {
    __syncthreads();  // one row group a block: its sums are the block's
    // the block's sums, [kColumnSums][tile] in the tile's order, read back in column order
    for (int c = int(threadIdx.x); c < hidden; c += int(blockDim.x)) {
      const int f = tile_index(c, threads_per_row);
      emit(c, sums[f]);
      if constexpr (kLayerNorm) emit(hidden + c, sums[tile + f]);
    }
  } else {
    // The groups' sums into their slices of shared memory, [kColumnSums][tile] each in the
    // weight tile's order (a thread's chunk as two 16-byte words beside its neighbours'),
    // then the slices folded pairwise in a fixed order, element by element, into one:
    // the same additions as in column order, so the same bits. Stored in
    // column order, a thread's 8 columns 32 bytes past its neighbour's, each 4-byte store of
    // a warp met the same 4 banks 8 times (256 store cycles a warp for LayerNorm's 32 sums a
    // thread, 4096 for a block of 16 warps at its end); so, LayerNorm's backward was
    // 1.5-4.1% faster on an H100 (16384 x 768 36.5 -> 35.5 us, 65536 x 256 44.4 -> 42.6,
    // 262144 x 64 44.9 -> 43.3), RMSNorm's 0.3-1.9% (benchmarks/RESULTS.md, seventieth
    // session). The entries past the row (a row group's lanes past hidden) hold sums of
    // zeros and are never stored.
    float* mine = sums + int64_t(group.index) * kColumnSums * tile;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int quad = (j * 2 + h) * group.threads + group.thread;
        reinterpret_cast<float4*>(mine)[quad] =
            make_float4(dgamma[j][4 * h], dgamma[j][4 * h + 1], dgamma[j][4 * h + 2], dgamma[j][4 * h + 3]);
        if constexpr (kLayerNorm) {
          reinterpret_cast<float4*>(mine + tile)[quad] =
              make_float4(dbeta[j][4 * h], dbeta[j][4 * h + 1], dbeta[j][4 * h + 2], dbeta[j][4 * h + 3]);
        }
      }
    }
    __syncthreads();
    // Rounds in shared memory while more than kRegisterFoldSlices slices are left (rows of
    // up to 512 columns, on 32 lanes or fewer: 16 or more row groups a block)...
    const int slice_quads = kColumnSums * tile / 4;  // the tile is whole chunks: a multiple of 8
    float4* quads = reinterpret_cast<float4*>(sums);
    int n = rows_per_block;
    while (n > kRegisterFoldSlices) {
      const int half = (n + 1) / 2;  // slices [half, n) onto [0, n - half)
      for (int k = int(threadIdx.x); k < (n - half) * slice_quads; k += int(blockDim.x)) {
        quads[k] = add_quads(quads[k], quads[k + half * slice_quads]);
      }
      __syncthreads();
      n = half;
    }
    // ...then the rest of the rounds in registers, a thread a chunk (8 columns, two quads)
    // of every slice, each quad's loads 16-byte words in the tile's order (a warp's meet
    // no bank twice), its 8 sums stored as they end. At hidden 768 (8 slices of 8 KiB)
    // layernorm's block, its slices stored, then read and wrote about 180 KiB of shared
    // memory between three barriers, when every round was a pass over shared memory and the
    // sums were read back once more in column order to be stored; this way it reads the
    // slices' 64 KiB once, and no barrier follows: layernorm's backward 2.0% faster at
    // 16384 x 768 (35.2 -> 34.5 us on an H100) and 2.5% at 4096 x 768, rmsnorm's 0.7% and
    // 2.2%, none slower, dgamma / dbeta the same bits (tools/norm_bwd_same_bits.py;
    // benchmarks/RESULTS.md, seventy-fourth session).
    const int tile_quads = tile / 4, tile_chunks = tile / kChunk;  // a column sum's
    // 16-byte stores where every partial row and column sum starts on 16 bytes
    const bool vector_out = !direct && hidden % 4 == 0 && reinterpret_cast<uintptr_t>(partials) % 16 == 0;
    for (int c = int(threadIdx.x); c < kColumnSums * tile_chunks; c += int(blockDim.x)) {
      // chunk j of the row group's thread t, in column sum k
      const int k = c / tile_chunks, t = c % tile_chunks % threads_per_row, j = c % tile_chunks / threads_per_row;
      const int col = (j * threads_per_row + t) * kChunk;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int quad = k * tile_quads + (j * 2 + h) * threads_per_row + t;
        const float4 v = fold_quad_slices(quads + quad, slice_quads, n);
        const int first = col + 4 * h;
        if (vector_out) {
          if (first < hidden) *reinterpret_cast<float4*>(out + k * hidden + first) = v;
        } else {
          const float folded[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (first + i < hidden) emit(k * hidden + first + i, folded[i]);
          }
        }
      }
    }
  }
  if (finalize_in_grid) {
    // launched cooperatively (every block resident): once every block's partial row is
    // written and visible, each block sums its share of the columns
    cooperative_groups::this_grid().sync();
    finalize_share(partials, int(gridDim.x), hidden, kColumnSums, gamma_tile, p.dgamma, p.dbeta, p.w_dtype);
  }
}

// dgamma[c] (dbeta[c]) = sum over the `slots` partial rows [slots, 2, hidden]. A block
// takes kColumns columns (norm_finalize_columns); its kLanes rows of threads each add
// every kLanes-th slot, then row 0 adds the kLanes results in order.
constexpr int kFinalizeThreads = 512;

template <int kColumns>
__global__ void __launch_bounds__(kFinalizeThreads)
    norm_bwd_finalize_kernel(const float* partials, int64_t slots, int64_t hidden, void* dgamma, void* dbeta,
                             te_dtype w_dtype) {
  constexpr int kLanes = kFinalizeThreads / kColumns;
  __shared__ float sums[2][kLanes][kColumns];
  wait_for_prerequisite_grid();  // the rows kernel's partials (launch_dependent)
  const int tx = int(threadIdx.x) % kColumns, ty = int(threadIdx.x) / kColumns;
  const int64_t c = int64_t(blockIdx.x) * kColumns + tx;
  KahanSum dg, db;  // up to 512 / kLanes terms a lane, then kLanes lanes: cheap to compensate here
  if (c < hidden) {
    for (int64_t s = ty; s < slots; s += kLanes) {
      const float* slot = partials + s * 2 * hidden;  // [2, hidden]
      dg.add(slot[c]);
      if (dbeta) db.add(slot[hidden + c]);
    }
  }
  sums[0][ty][tx] = dg.sum;
  sums[1][ty][tx] = db.sum;
  __syncthreads();
  if (ty == 0 && c < hidden) {
    KahanSum dg_all, db_all;
    for (int y = 0; y < kLanes; ++y) {
      dg_all.add(sums[0][y][tx]);
      db_all.add(sums[1][y][tx]);
    }
    store_param(dgamma, c, w_dtype, dg_all.sum);
    if (dbeta) store_param(dbeta, c, w_dtype, db_all.sum);
  }
}

size_t bwd_smem_bytes(const NormBwdParams& p, const NormRowShape& shape, bool staged) {
  const size_t column_sums = p.type == NormType::kLayerNorm ? 2 : 1;
  const size_t tile = weight_tile_floats(shape.chunks, shape.threads_per_row);
  // the shared sums, or the row groups' slices of the register sums (both in the tile's order)
  const size_t sums = (bwd_sums_shared(p, shape) ? 1 : size_t(shape.rows_per_block)) * column_sums * tile;
  // two buffers of dz's and x's chunks (RowShare::stage): 16 bytes a chunk of a 16-bit row
  const size_t stages = staged ? 2 * 2 * size_t(shape.chunks) * 16 * size_t(shape.block_threads()) : 0;
  return stages + (tile + sums) * sizeof(float);
}

// Launches the rows kernel; returns how many partial rows it leaves for the finalize
// kernel, or 1 where it wrote dgamma / dbeta itself.
int64_t launch_rows_kernel(const NormBwdParams& p, const NormRowShape& shape, int device, float* partials,
                           cudaStream_t stream) {
  const bool layernorm = p.type == NormType::kLayerNorm;
  const bool vectorized =
      p.hidden % kChunk == 0 && is_aligned(p.dz, 16) && is_aligned(p.x, 16) && is_aligned(p.dx, 16);
  const bool staged = bwd_rows_staged(p, shape, vectorized);
  const size_t smem = bwd_smem_bytes(p, shape, staged);
  int64_t grid = 0;
  auto launch = [&](auto kernel) {
    const void* fn = reinterpret_cast<const void*>(kernel);
    grid = norm_bwd_grid(norm_resident_grid(fn, shape, smem, p.rows, device), device);
    // The grid is resident (one wave), so a cooperative launch only asks the GPU to
    // promise it, which the grid-wide barrier before the finalize share needs.
    const bool in_grid =
        grid > 1 && p.hidden <= kNormBwdInGridFinalizeMaxHidden && cooperative_launch_supported(device);
    cudaLaunchAttribute cooperative{};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(grid));
    config.blockDim = dim3(unsigned(shape.block_threads()));
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &cooperative;
    config.numAttrs = in_grid ? 1 : 0;
    cudaError_t err =
        cudaLaunchKernelEx(&config, kernel, p, shape.threads_per_row, shape.rows_per_block, partials, in_grid);
    if (in_grid && err == cudaErrorCooperativeLaunchTooLarge) {
      // fewer SMs than the device has (MPS, a partitioned context): the plain launch, and
      // the finalize kernel after it
      (void)cudaGetLastError();
      config.numAttrs = 0;
      err = cudaLaunchKernelEx(&config, kernel, p, shape.threads_per_row, shape.rows_per_block, partials, false);
      cuda_check(err, "norm_bwd_rows_kernel");
      return;
    }
    cuda_check(err, "norm_bwd_rows_kernel");
    if (in_grid) grid = 1;  // dgamma / dbeta written: no finalize kernel
  };
  // the one switch from the shape's bucket and the norm to template arguments
  auto launch_bucket = [&](auto in_tag, auto vectorized_tag) {
    constexpr te_dtype kIn = decltype(in_tag)::value;
    constexpr bool kVec = decltype(vectorized_tag)::value;
    auto launch_norm = [&](auto chunks_tag, auto staged_tag, auto shared_tag) {
      constexpr int kChunks = decltype(chunks_tag)::value;
      constexpr bool kStaged = decltype(staged_tag)::value, kShared = decltype(shared_tag)::value;
      if (layernorm) {
        launch(norm_bwd_rows_kernel<kIn, kChunks, true, kVec, kStaged, kShared>);
      } else {
        launch(norm_bwd_rows_kernel<kIn, kChunks, false, kVec, kStaged, kShared>);
      }
    };
    using Chunks = std::integral_constant<int, kNormBwdChunks>;
    using LongChunks = std::integral_constant<int, kNormBwdLongChunks>;
    if (shape.chunks == kNormBwdChunks && !bwd_sums_shared(p, shape)) {
      constexpr bool kMayStage = kVec && kIn != TE_DTYPE_FLOAT32;
      if (kMayStage && staged) {
        launch_norm(Chunks{}, std::bool_constant<kMayStage>{}, std::false_type{});
      } else {
        launch_norm(Chunks{}, std::false_type{}, std::false_type{});
      }
    } else if constexpr (!(kVec && kIn != TE_DTYPE_FLOAT32)) {  // those are the pipelined kernel's
      if (shape.chunks == kNormBwdLongChunks) {
        launch_norm(LongChunks{}, std::false_type{}, std::true_type{});
      } else if constexpr (kIn != TE_DTYPE_FLOAT32) {  // 16-bit rows alone in their block (bwd_sums_shared)
        launch_norm(Chunks{}, std::false_type{}, std::true_type{});
      }
    }
  };
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    if (vectorized) {
      launch_bucket(in_tag, std::true_type{});
    } else {
      launch_bucket(in_tag, std::false_type{});
    }
  });
  // fp32 rows keep their sums in registers up to hidden 8192 (bwd_sums_shared), and
  // norm_bwd_cuda sends vectorized 16-bit rows alone in a block (hidden > 4096) to the
  // pipelined kernel: every shape that comes here has its kernel
  if (grid == 0) fail(TE_ERROR_INTERNAL, concat("norm backward: no rows kernel for hidden ", p.hidden));
  return grid;
}

}  // namespace

// norm.cpp has checked the workspace against te_norm_workspace_size: it holds
// [norm_row_blocks(rows), 2, hidden] floats, and neither path writes more rows.
void norm_bwd_cuda(const NormBwdParams& p, int device, void* workspace, size_t /*workspace_size*/, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  auto* partials = static_cast<float*>(workspace);  // [slots, 2, hidden]
  int64_t slots = 0;                                // zero rows: dgamma = dbeta = 0
  if (p.rows > 0) {
    const NormRowShape shape = norm_bwd_row_shape(p.hidden);
    if (norm_bwd_pipelined_takes(p)) {
      slots = norm_bwd_pipelined_cuda(p, device, partials, stream);
      if (slots == 1) return;  // one block wrote dgamma / dbeta itself
    } else if (shape.in_registers()) {
      slots = launch_rows_kernel(p, shape, device, partials, s);
      if (slots == 1) return;  // one block wrote dgamma / dbeta itself
    } else {
      slots = norm_bwd_fallback_cuda(p, device, partials, stream);
    }
  }
  auto finalize = [&](auto kernel, int64_t columns) {
    // started while the rows kernel's last blocks run; it waits for their partials
    launch_dependent(kernel, dim3(unsigned((p.hidden + columns - 1) / columns)), dim3(kFinalizeThreads), 0, s,
                     device, "norm_bwd_finalize_kernel", static_cast<const float*>(partials), slots, p.hidden,
                     p.dgamma, p.dbeta, p.w_dtype);
  };
  if (norm_finalize_columns(p.hidden, multiprocessor_count(device)) == kNormFinalizeNarrowColumns) {
    finalize(norm_bwd_finalize_kernel<kNormFinalizeNarrowColumns>, kNormFinalizeNarrowColumns);
  } else {
    finalize(norm_bwd_finalize_kernel<kNormFinalizeWideColumns>, kNormFinalizeWideColumns);
  }
}

}  // namespace opente
