// LayerNorm and RMSNorm backward for long 16-bit rows (norm_bwd_pipelined_row_shape:
// hidden 4097 to 16384, a multiple of 8, 16-byte aligned): one row a block at a time,
// read from shared memory, into which the block copies the next row's dz and x
// (cp.async) while it works on this one.
//
// Why a kernel of its own: the register kernel (norm_bwd.cu) spread a row this long
// over a block of up to 512 threads, one or two blocks an SM, and a block loaded its
// row, waited, reduced and stored in turn, so while it computed no load of another
// row was in flight on its SM (layernorm at 4096 x 16384 took 181 us on an H100 where
// its bytes need 134 at copy speed). Here row i + 1's loads overlap row i's
// arithmetic and stores. The row is read from shared memory twice (the sums, then
// dx), so no register holds it across the row's reduction, and each thread keeps its
// 16 columns' sums (dgamma, dbeta) in registers: 64 registers, blocks of up to 1024
// threads. Two other forms (PipelinedForm): where that runs one block an SM, 56
// registers for hidden 8193 to 9216, two blocks an SM (layernorm's spills 32 bytes
// there, and still gained 7-11%); where it keeps as many blocks an SM (hidden 9217 to
// 12288, and 5121 to 6144 but for bf16 rmsnorm), 80, holding x hat and dz * gamma for dx
// instead of reading the row again (3-6% faster at 9217-12288, H100). (32 columns a
// thread, in half the threads and 128 registers, was 1-3% slower at hidden 5120 and
// 8192 and the same at 12288 and 16384, H100; against the forty-third session's
// shorter row loop 2-13% slower at 4104-8192 on an H200, forty-fourth session. Three
// stages, two rows in flight, where the smem fits them: 12288 no faster, 5120 and 8192
// 5-15% slower with fewer blocks an SM.)
//
// Shared memory: gamma's fp32 tile (stage_weights' order), then two stages of
// [dz, x][2 chunks][threads] 16-byte words (RowShare::stage's layout): 192 bytes a
// thread. Hidden 16384: 192 KiB, one block of 32 warps an SM; 9216: 108 KiB, two of 18
// (the compact form); 8192: 96 KiB, two of 16; 5120: 60 KiB, three of 10 (hence
// kNormMaxRowBlocks = 512).
//
// Partial sums and the finalize are norm_bwd.cu's: block b writes partials[b] =
// [sum dz * xhat, sum dz] over its rows, or, a grid of one block, dgamma / dbeta.
// LayerNorm's blocks on sm_90 mostly run in pairs (thread block clusters,
// cluster_blocks_for) that add their sums in distributed shared memory first, so pair
// c writes partials[c]: the partial rows are written to the L2, read back by the
// finalize and in the end written to DRAM, 2 * hidden floats a block, which with a
// block a row at a time was 4-6% of the rows' traffic (hidden 5120: 396 blocks, 16 MiB).
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "common/cuda_cluster_launch.h"
#include "common/cuda_dependent_launch.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace {

using namespace norm_kernels;

constexpr int kChunks = kNormBwdPipelinedChunks;

// The kernel's register bounds, chosen by norm_bwd_pipelined_cuda:
// - kPlain: blocks of up to 1024 threads; a minimum of 0 blocks leaves ptxas its own
//   choice under 64 registers (59 for rmsnorm).
// - kCompact: 56 registers (blocks of up to 576 threads, two an SM), where the plain form
//   runs one block an SM: rows of hidden 8193 to 9216 (544 to 576 threads), whose shared
//   memory fits two.
// - kHolding: 80 registers (blocks of up to 768 threads), where it runs as many blocks an
//   SM as the plain form: hidden 9217 to 12288, whose blocks are one an SM anyway (their
//   shared memory, 111-148 KiB, fits one), 5121 to 6144 (two; not bf16 rmsnorm, whose
//   plain form runs three), and fewer rows than SMs. x hat and dz * gamma are held across
//   the row's reduction instead of recomputed from the staged row for dx, so a row takes
//   fewer instructions (layernorm spills 4-12 bytes).
// - kWidest: kPlain's bounds, for blocks of more than kHoldingMaxThreads threads (hidden
//   12289 to 16384, one block an SM) where norm_memory_outruns_sms; it differs from
//   kPlain only in RMSNorm's dx, which takes the slope there (see kSlope below).
//   LayerNorm's plain kernel serves these rows.
enum class PipelinedForm { kPlain, kCompact, kHolding, kWidest };
constexpr int kCompactMaxThreads = 576;
constexpr int kHoldingMaxThreads = 768;

constexpr int form_max_threads(PipelinedForm form) {
  return form == PipelinedForm::kCompact ? kCompactMaxThreads
         : form == PipelinedForm::kHolding ? kHoldingMaxThreads
                                           : kNormBwdPipelinedMaxThreads;
}
constexpr int form_min_blocks(PipelinedForm form) {
  return form == PipelinedForm::kCompact ? 2 : form == PipelinedForm::kHolding ? 1 : 0;
}

template <te_dtype kIn, bool kLayerNorm, PipelinedForm kForm>
__global__ void __launch_bounds__(form_max_threads(kForm), form_min_blocks(kForm))
    norm_bwd_pipelined_kernel(NormBwdParams p, float* partials, int cluster_blocks) {
  using In = typename CudaType<kIn>::type;
  using Share = RowShare<In, kChunks, true>;
  static_assert(Share::kWordsPerChunk == 1, "16-bit rows: a chunk is one 16-byte word");
  // LayerNorm reduces (sum dyg, sum dyg * xhat) at once; RMSNorm only the second.
  using RowSums = std::conditional_t<kLayerNorm, float2, float>;
  allow_dependent_launch();  // the finalize may take SMs our last blocks leave free
  extern __shared__ float4 smem[];
  constexpr int kMaxWarps = kNormBwdPipelinedMaxThreads / 32;
  __shared__ RowSums scratch[2 * kMaxWarps];
  const RowGroup group(int(blockDim.x));  // the block is one row group
  const int hidden = int(p.hidden);
  const int tile = weight_tile_floats(kChunks, group.threads);
  float* gamma_tile = reinterpret_cast<float*>(smem);
  const int stage_words = Share::kStageWords * group.threads;
  uint4* stages = reinterpret_cast<uint4*>(gamma_tile + tile);  // [2][dz, x][stage_words]
  const In* dz_rows = static_cast<const In*>(p.dz);  // [rows, hidden]
  const In* x_rows = static_cast<const In*>(p.x);    // [rows, hidden]
  // Copies row r's dz and x into `stage` (zeros past the last row: no traffic) as one
  // commit group. Each thread copies and later reads only its own words: no barrier.
  auto stage_row = [&](uint4* stage, int64_t r) {
    const bool active = r < p.rows;
    const int64_t offset = (active ? r : 0) * p.hidden;  // row 0 stands in past the last row (copies nothing)
    const int limit = active ? hidden : 0;
    Share::stage(stage, dz_rows + offset, group, limit);
    Share::stage(stage + stage_words, x_rows + offset, group, limit);
    commit_async_copies();
  };
  // The first row's copies in flight while gamma is staged (its loads and the tile's
  // stores), not behind them
  int64_t r = blockIdx.x;
  stage_row(stages, r);
  stage_weights<kChunks>(p.gamma, p.w_dtype, hidden, p.zero_centered_gamma ? 1.0f : 0.0f, group.threads,
                         gamma_tile);
  __syncthreads();

  float dgamma[kChunks][kChunk] = {}, dbeta[kLayerNorm ? kChunks : 1][kChunk] = {};
  // Blocks of whole warps. LayerNorm's warps' sums by lane (RowReduction): on an H100 0.6-3.7%
  // faster at hidden 9216-16384, within 1.5% either way at 5120-8192; RMSNorm's rows 2-4%
  // slower so, waiting on the five dependent shuffle steps where the loop's loads overlap, and
  // fp16 LayerNorm's compact form 12% (it spilled 32 more bytes): both keep warp order
  // (benchmarks/RESULTS.md, fifty-seventh session).
  constexpr bool kWarpsByLane = kLayerNorm && !(kForm == PipelinedForm::kCompact && kIn == TE_DTYPE_FLOAT16);
  RowReduction<RowSums, kMaxWarps, false, true, kWarpsByLane> reduction(scratch, group);
  const float inv_hidden = 1.0f / float(hidden);
  const int64_t stride = gridDim.x;
  for (int buffer = 0; r < p.rows; r += stride, buffer ^= 1) {
    const uint4* dz_stage = stages + buffer * 2 * stage_words;
    const uint4* x_stage = dz_stage + stage_words;
    stage_row(stages + (buffer ^ 1) * 2 * stage_words, r + stride);
    // (loading the statistics a row ahead, as the rows kernel does, made no difference:
    // H100, 8192 x 8192, 8192 x 5120, 4096 x 12288, 4096 x 16384)
    const float mu = kLayerNorm ? p.mu[r] : 0.0f, rsigma = p.rsigma[r];
    wait_async_copies<1>();  // this row's group; the next row's stays in flight

    // The CPU reference's formulas, as norm_bwd.cu's. Past the row
    // (a chunk lies wholly in it or past it) dz is 0 and so is gamma's tile, and x is 0
    // (the stage's zero fill), so x hat is finite there and adds 0 to every sum. With
    // scale 1 in place of rsigma "xhat" is x - mu (LayerNorm's dx below).
    auto xhat_and_dyg = [&](int j, float scale, float (&xhat)[kChunk], float (&dyg)[kChunk], float (&dz)[kChunk]) {
      const Vec8<In> dz_raw = staged_chunk<In>(dz_stage, j), x_raw = staged_chunk<In>(x_stage, j);
      float gamma[kChunk];
      read_weights(gamma_tile, group, j, gamma);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        dz[i] = element_as_float(dz_raw, i);
        xhat[i] = bwd_xhat<kLayerNorm>(element_as_float(x_raw, i), mu, scale);
        dyg[i] = dz[i] * gamma[i];
      }
    };
    float sum_dyg = 0.0f, sum_dyg_xhat = 0.0f;
    constexpr bool kHold = kForm == PipelinedForm::kHolding;
    float held_xhat[kHold ? kChunks : 1][kChunk], held_dyg[kHold ? kChunks : 1][kChunk];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float xhat[kChunk], dyg[kChunk], dz[kChunk], dyg_xhat[kChunk];
      xhat_and_dyg(j, rsigma, xhat, dyg, dz);
      if constexpr (kHold) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) held_xhat[j][i] = xhat[i], held_dyg[j][i] = dyg[i];
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        dyg_xhat[i] = dyg[i] * xhat[i];
        dgamma[j][i] += dz[i] * xhat[i];
        if constexpr (kLayerNorm) dbeta[j][i] += dz[i];
      }
      if constexpr (kLayerNorm) sum_dyg += chunk_sum(dyg);
      sum_dyg_xhat += chunk_sum(dyg_xhat);
    }
    const float2 means = bwd_row_means<kLayerNorm>(reduction, sum_dyg, sum_dyg_xhat, inv_hidden);
    const float mean_dyg = means.x, mean_dyg_xhat = means.y;

    In* dx_row = static_cast<In*>(p.dx) + r * p.hidden;  // [hidden]
    // LayerNorm's dx, where x hat is not held, takes x - mu times the slope rsigma *
    // mean(dz gamma x hat) in place of x hat times the mean: a multiply an element fewer
    // (x hat's), a rounding of the same size moved from x hat to the slope, and dz gamma -
    // mean(dz gamma) still formed first, so a row whose dx is 0 (a row of one element)
    // gets 0. H200, us, before / after: 16384 x 4104 133.6 / 132.2, 8192 x 5120 83.2 /
    // 82.3, 8192 x 8192 120.6 / 119.3, 8192 x 9216 (the compact form) 154.3 / 152.6.
    // RMSNorm keeps x hat times the mean but in its widest blocks: with the slope its
    // kernels, though as much shorter, lost 2-13% at most widths (16384 x 4104 121.8 /
    // 136.8, 8192 x 9216 125.5 / 134.6) and gained only at 4096 x 16384 (124.7 / 111.7):
    // ncu found the blocks' tail and the warps' waits moving, not the instructions
    // (benchmarks/RESULTS.md, the forty-fourth session).
    constexpr bool kSlope = (kLayerNorm || kForm == PipelinedForm::kWidest) && !kHold;
    const float slope = rsigma * mean_dyg_xhat;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float xhat[kChunk], dyg[kChunk], dz[kChunk], dx[kChunk];
      if constexpr (kHold) {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) xhat[i] = held_xhat[j][i], dyg[i] = held_dyg[j][i];
      } else {
        xhat_and_dyg(j, kSlope ? 1.0f : rsigma, xhat, dyg, dz);  // x - mu where kSlope
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        dx[i] = kSlope ? rsigma * fmaf(-xhat[i], slope, dyg[i] - mean_dyg)
                       : rsigma * (dyg[i] - mean_dyg - xhat[i] * mean_dyg_xhat);
      }
      store_chunk<true, kIn>(dx_row, group.column(j), hidden, dx);
    }
  }
  wait_all_async_copies();  // the zero-filled copies past the last row

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // LayerNorm's only: RMSNorm never runs in clusters (cluster_blocks_for), so its kernels
  // leave this out
  if constexpr (kLayerNorm) {
    if (cluster_blocks > 1) {
      // The block's sums into its shared memory as [kColumnSums][hidden] (the stages are
      // free once every thread is past its last staged read: 128 bytes a thread hold the
      // 8 bytes a column needs), then the cluster's blocks add them, each a share of the
      // columns, in rank order, into the cluster's partial row.
      constexpr int kColumnSums = 2;  // dgamma's, dbeta's
      __syncthreads();
      float* block_sums = reinterpret_cast<float*>(stages);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int col = group.column(j);
        if (col >= hidden) continue;
#pragma unroll
        for (int k = 0; k < kColumnSums; ++k) {
          const float(&sums)[kChunk] = k == 0 ? dgamma[j] : dbeta[j];
          float4* at = reinterpret_cast<float4*>(block_sums + k * hidden + col);
          at[0] = make_float4(sums[0], sums[1], sums[2], sums[3]);
          at[1] = make_float4(sums[4], sums[5], sums[6], sums[7]);
        }
      }
      namespace cg = cooperative_groups;
      const cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();  // every block's sums written, and visible across the cluster
      const int rank = int(cluster.block_rank());
      float* out = partials + int64_t(blockIdx.x / cluster_blocks) * 2 * hidden;
      const bool vector_out = reinterpret_cast<uintptr_t>(partials) % 16 == 0;
      const int quads = kColumnSums * hidden / 4;  // hidden % 8 == 0
      for (int q = rank * int(blockDim.x) + int(threadIdx.x); q < quads; q += cluster_blocks * int(blockDim.x)) {
        float4 sum = reinterpret_cast<const float4*>(cluster.map_shared_rank(block_sums, 0))[q];
        for (int b = 1; b < cluster_blocks; ++b) {
          const float4 v = reinterpret_cast<const float4*>(cluster.map_shared_rank(block_sums, b))[q];
          sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        if (vector_out) {
          reinterpret_cast<float4*>(out)[q] = sum;
        } else {
          out[4 * q] = sum.x, out[4 * q + 1] = sum.y, out[4 * q + 2] = sum.z, out[4 * q + 3] = sum.w;
        }
      }
      cluster.sync();  // no block leaves (freeing its shared memory) while another reads it
      return;
    }
  }
#endif

  // This thread's columns of the block's partial row [2, hidden] (RMSNorm writes the
  // first half); a grid of one block writes dgamma / dbeta itself, rounded once, as the
  // finalize rounds a sum of one partial row.
  float* out = partials + int64_t(blockIdx.x) * 2 * hidden;
  const bool direct = gridDim.x == 1;
  // 16-byte stores where the workspace is 16-byte aligned (hidden % 8 == 0: then every
  // block's row and every chunk's columns are too)
  const bool vector_out = reinterpret_cast<uintptr_t>(partials) % 16 == 0;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int col = group.column(j);
    if (col >= hidden) continue;
#pragma unroll
    for (int k = 0; k < (kLayerNorm ? 2 : 1); ++k) {
      const float(&sums)[kChunk] = k == 0 ? dgamma[j] : dbeta[kLayerNorm ? j : 0];
      if (direct) {
        void* param = k == 0 ? p.dgamma : p.dbeta;
#pragma unroll
        for (int i = 0; i < kChunk; ++i) store_param(param, col + i, p.w_dtype, sums[i]);
      } else if (vector_out) {
        float4* at = reinterpret_cast<float4*>(out + k * hidden + col);
        at[0] = make_float4(sums[0], sums[1], sums[2], sums[3]);
        at[1] = make_float4(sums[4], sums[5], sums[6], sums[7]);
      } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) out[k * hidden + col + i] = sums[i];
      }
    }
  }
}

// Blocks a cluster: 2 (pairs) for LayerNorm where the partial rows weigh: at most
// kClusterMaxRowsPerBlock rows a block (then the blocks' [2, hidden] partial rows, written,
// read back and written to DRAM, are 4% of the rows' traffic or more), the pairs still fit
// the one wave norm_resident_grid sized the grid to, and keep two or more partial rows (a
// grid of one cluster would have to write dgamma itself). 1 (no clusters) otherwise, and
// before sm_90. H100, against no clusters (benchmarks/RESULTS.md): layernorm 2048 x 16384
// 100.0 -> 95.1 us, 4096 x 12288 134.2 -> 129.6, 4096 x 16384 167.0 -> 161.7, 8192 x 8192
// 159.5 -> 155.9, 8192 x 5120 106.3 -> 105.1; with more rows a block 0.5-1.4% either way
// (32768 x 5120, 83 rows a block: 365 -> 367-370), and rmsnorm (one partial sum a column)
// gained nothing anywhere (within 1% either way; its kernels leave the cluster path out).
// Clusters of 4 did not fit the wave (the cluster occupancy query gave fewer than a
// quarter of the resident blocks).
constexpr int64_t kClusterMaxRowsPerBlock = 32;
int cluster_blocks_for(const void* kernel, int threads, size_t smem, int64_t grid, int64_t rows, bool layernorm,
                       int device) {
  constexpr int kBlocks = 2;
  if (compute_capability_major(device) < 9 || !layernorm || rows > kClusterMaxRowsPerBlock * grid) return 1;
  const int64_t rounded = grid / kBlocks * kBlocks;
  if (rounded < 2 * kBlocks || (grid - rounded) * 16 > grid) return 1;
  return int64_t(max_active_clusters(kernel, threads, smem, kBlocks, device)) * kBlocks >= rounded ? kBlocks : 1;
}

}  // namespace

bool norm_bwd_pipelined_takes(const NormBwdParams& p) {
  return norm_bwd_pipelined_row_shape(p.hidden).chunks > 0 && dtype_size(p.in_dtype) == 2 && p.hidden % kChunk == 0 &&
         is_aligned(p.dz, 16) && is_aligned(p.x, 16) && is_aligned(p.dx, 16);
}

int64_t norm_bwd_pipelined_cuda(const NormBwdParams& p, int device, float* partials, void* stream) {
  const NormRowShape shape = norm_bwd_pipelined_row_shape(p.hidden);
  const size_t tile = weight_tile_floats(kChunks, shape.threads_per_row);
  // [2][dz, x][chunks][threads] 16-byte words
  const size_t stages = 2 * 2 * size_t(kChunks) * 16 * size_t(shape.threads_per_row);
  const size_t smem = tile * sizeof(float) + stages;
  const bool layernorm = p.type == NormType::kLayerNorm;
  int64_t slots = 0;
  auto launch = [&](auto kernel, auto compact_kernel, auto holding_kernel, auto widest_kernel) {
    // blocks wider than the holding form's: the widest form (RMSNorm's dx by the slope)
    // where memory outruns the SMs as on an H200 (norm_memory_outruns_sms: RMSNorm's dx by
    // the slope at hidden 13312-16384 9.5-11.5% faster there, 4096 x 16384 123.6 -> 111.8
    // us, 8192 x 16384 225.4 -> 203.6; 1.9-6.2% slower on an H100 SXM, 153.6 -> 162.2 and
    // 285.8 -> 303.6)
    if (shape.threads_per_row > kHoldingMaxThreads && norm_memory_outruns_sms(device)) {
      kernel = widest_kernel;
    }
    const void* fn = reinterpret_cast<const void*>(kernel);
    int64_t grid = norm_bwd_grid(norm_resident_grid(fn, shape, smem, p.rows, device), device);
    // The compact form where the plain one runs a block an SM and it runs two. H100, us,
    // plain / compact: layernorm 8192 x 8704 193.3 / 171.5, 8192 x 9216 198.1 / 179.5,
    // 16384 x 9216 374.9 / 344.7, 4096 x 9216 108.8 / 101.6; rmsnorm 8192 x 9216 185.6 /
    // 180.7, 16384 x 9216 355.0 / 345.7. Where it would take three blocks an SM to four
    // (hidden 4104-4608) or two to three (5128-6144) it was 1-8% slower (rmsnorm 16384 x
    // 6144 220.9 / 238.2): spread over more blocks, the SM's rows do not go faster.
    // Else the holding form wherever it keeps the plain form's blocks an SM: at one block
    // an SM (H100, us, plain / holding): layernorm 4096 x 9728 111.4 / 108.5, 8192 x 10240
    // 212.9 / 206.5, 4096 x 11264 124.1 / 120.1, 4096 x 12288 130.2 / 126.8, 8192 x 12288
    // 241.4 / 233.1; rmsnorm 104.8 / 100.7, 201.5 / 190.4, 115.5 / 110.1, 123.1 / 118.6,
    // 225.5 / 219.2; and at two blocks an SM at hidden 5121-6144 (blocks of 321-384
    // threads: layernorm's, and fp16 rmsnorm's, whose 57 registers are allocated as 64;
    // bf16 rmsnorm's plain form, at 54, runs three there), where a row takes about a sixth
    // fewer instructions (SASS, bf16 layernorm 565 -> 469 a trip of 16 elements a thread),
    // which an H200 bound by issue needs: layernorm 8192 x 6144 100.0 / 94.6 us (H200, a
    // build whose x hat was one FFMA; both forms a row trip about 30 instructions shorter).
    // Where it would run fewer blocks an SM than the plain form it lost 3-39% (H200,
    // layernorm 8192 x 8192 120.8 / 160.1 us, 16384 x 4104 133.7 / 147.8).
    bool compact = false;
    if (grid <= multiprocessor_count(device) && shape.threads_per_row <= kCompactMaxThreads) {
      const void* compact_fn = reinterpret_cast<const void*>(compact_kernel);
      const int64_t compact_grid =
          norm_bwd_grid(norm_resident_grid(compact_fn, shape, smem, p.rows, device), device);
      if (compact_grid > grid) kernel = compact_kernel, fn = compact_fn, grid = compact_grid, compact = true;
    }
    if (!compact && shape.threads_per_row <= kHoldingMaxThreads) {
      const void* holding_fn = reinterpret_cast<const void*>(holding_kernel);
      const int64_t holding_grid =
          norm_bwd_grid(norm_resident_grid(holding_fn, shape, smem, p.rows, device), device);
      if (holding_grid >= grid) kernel = holding_kernel, fn = holding_fn, grid = holding_grid;
    }
    const int cluster = cluster_blocks_for(fn, shape.threads_per_row, smem, grid, p.rows, layernorm, device);
    // every block (cluster) as many rows, on the fewest blocks, where that idles few SMs
    grid = (norm_even_steps_grid(p.rows, grid / cluster * cluster) + cluster - 1) / cluster * cluster;
    if (cluster == 1) {
      kernel<<<unsigned(grid), unsigned(shape.threads_per_row), smem, as_stream(stream)>>>(p, partials, 1);
      check_launch("norm_bwd_pipelined_kernel");
      slots = grid;
      return;
    }
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        cluster_launch_config(grid, shape.threads_per_row, smem, as_stream(stream), cluster, attribute);
    cuda_check(cudaLaunchKernelEx(&config, kernel, p, partials, cluster), "norm_bwd_pipelined_kernel (clusters)");
    slots = grid / cluster;
  };
  // the one switch from the dtype and the norm to template arguments; launch picks the form
  auto launch_forms = [&](auto in_tag, auto layernorm_tag) {
    constexpr te_dtype kIn = decltype(in_tag)::value;
    constexpr bool kLayerNorm = decltype(layernorm_tag)::value;
    // (LayerNorm's widest rows run its plain kernel, which the widest form would repeat)
    constexpr PipelinedForm kWidest = kLayerNorm ? PipelinedForm::kPlain : PipelinedForm::kWidest;
    launch(norm_bwd_pipelined_kernel<kIn, kLayerNorm, PipelinedForm::kPlain>,
           norm_bwd_pipelined_kernel<kIn, kLayerNorm, PipelinedForm::kCompact>,
           norm_bwd_pipelined_kernel<kIn, kLayerNorm, PipelinedForm::kHolding>,
           norm_bwd_pipelined_kernel<kIn, kLayerNorm, kWidest>);
  };
  using Bf16 = std::integral_constant<te_dtype, TE_DTYPE_BFLOAT16>;
  using Fp16 = std::integral_constant<te_dtype, TE_DTYPE_FLOAT16>;
  if (p.in_dtype == TE_DTYPE_BFLOAT16) {
    layernorm ? launch_forms(Bf16{}, std::true_type{}) : launch_forms(Bf16{}, std::false_type{});
  } else {
    layernorm ? launch_forms(Fp16{}, std::true_type{}) : launch_forms(Fp16{}, std::false_type{});
  }
  return slots;
}

}  // namespace opente
