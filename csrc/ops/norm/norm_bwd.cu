// LayerNorm and RMSNorm backward on the GPU, in two kernels.
//
// 1. Rows: row groups as in the forward (norm_launch.h). A group loads its row of
//    dz and x once into registers, takes the row's two sums (one shuffle reduction
//    of a pair) and writes dx. Each thread also adds dz * xhat and dz for its
//    columns over all the rows it visits, in fp32 registers; at the end the block
//    adds its groups' sums in shared memory (a fixed pairwise order) and writes
//    one [2, hidden] row of partial sums to the workspace. So dz and x are read
//    exactly once.
// 2. Finalize: threads along hidden add the blocks' partial rows (coalesced) and
//    write dgamma and dbeta in the weights' dtype.
// The backward runs one wave of at most kNormMaxRowBlocks blocks, so its partial
// sums fit te_norm_workspace_size's [min(rows, 256), 2, hidden] floats. The sums'
// order depends on the grid (the GPU's SM count), and is the same from run to run.
// Rows too long for registers go to norm_fallback.cu, whose partials the same
// finalize kernel sums.
#include <algorithm>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace {

using namespace norm_kernels;

// Partial sums written by block b: partials[b][0][c] = sum dz * xhat, partials[b][1][c]
// = sum dz (LayerNorm only) over the block's rows. Dynamic shared memory
// (bwd_smem_bytes): gamma's weight tile, then the groups' column sums.
template <te_dtype kIn, int kChunks, bool kLayerNorm, bool kVectorized>
__global__ void __launch_bounds__(kNormMaxBlockThreads)
    norm_bwd_rows_kernel(NormBwdParams p, int threads_per_row, int rows_per_block, float* partials) {
  using In = typename CudaType<kIn>::type;
  // LayerNorm reduces (sum dyg, sum dyg * xhat) at once; RMSNorm only the second.
  using RowSums = std::conditional_t<kLayerNorm, float2, float>;
  constexpr int kColumnSums = kLayerNorm ? 2 : 1;  // dgamma (and dbeta)
  extern __shared__ float4 smem[];
  __shared__ RowSums scratch[2 * kNormMaxBlockWarps];
  const RowGroup group(threads_per_row);
  const int hidden = int(p.hidden);  // <= kNormBwdMaxRegisterHidden
  float* gamma_tile = reinterpret_cast<float*>(smem);
  // [rows_per_block][kColumnSums][hidden]
  float* group_sums = gamma_tile + weight_tile_floats(kChunks, threads_per_row);
  stage_weights<kChunks>(p.gamma, p.w_dtype, hidden, p.zero_centered_gamma ? 1.0f : 0.0f, threads_per_row,
                         gamma_tile);
  __syncthreads();
  float dgamma[kChunks][kChunk] = {}, dbeta[kChunks][kChunk] = {};  // this thread's columns, over its rows
  RowReduction<RowSums> reduction(scratch, group);

  // Block-uniform trip count, as in the forward.
  for (int64_t first = int64_t(blockIdx.x) * rows_per_block; first < p.rows;
       first += int64_t(gridDim.x) * rows_per_block) {
    const int64_t r = first + group.index;
    const bool active = r < p.rows;
    const int limit = active ? hidden : 0;
    const float mu = kLayerNorm && active ? p.mu[r] : 0.0f;
    const float rsigma = active ? p.rsigma[r] : 0.0f;
    const In* dz_row = static_cast<const In*>(p.dz) + r * p.hidden;  // [hidden]
    const In* x_row = static_cast<const In*>(p.x) + r * p.hidden;    // [hidden]
    // Past the row dz = 0 and x = mu, so xhat = 0 there and every sum skips the
    // column without a test (gamma's tile holds 0 there too).
    float dz[kChunks][kChunk], x[kChunks][kChunk];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      load_chunk<kVectorized>(dz_row, group.column(j), limit, 0.0f, dz[j]);
      load_chunk<kVectorized>(x_row, group.column(j), limit, mu, x[j]);
    }

    // The CPU reference's formulas, element by element.
    float xhat[kChunks][kChunk], dyg[kChunks][kChunk];
    float sum_dyg = 0.0f, sum_dyg_xhat = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float gamma[kChunk], dyg_xhat[kChunk];
      read_weights(gamma_tile, group, j, gamma);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        xhat[j][i] = (x[j][i] - mu) * rsigma;
        dyg[j][i] = dz[j][i] * gamma[i];
        dyg_xhat[i] = dyg[j][i] * xhat[j][i];
        dgamma[j][i] += dz[j][i] * xhat[j][i];
        if constexpr (kLayerNorm) dbeta[j][i] += dz[j][i];
      }
      if constexpr (kLayerNorm) sum_dyg += chunk_sum(dyg[j]);
      sum_dyg_xhat += chunk_sum(dyg_xhat);
    }
    float mean_dyg = 0.0f, mean_dyg_xhat;  // RMSNorm has no mean to subtract
    if constexpr (kLayerNorm) {
      const float2 sums = reduction.sum(make_float2(sum_dyg, sum_dyg_xhat));
      mean_dyg = sums.x / float(hidden);
      mean_dyg_xhat = sums.y / float(hidden);
    } else {
      mean_dyg_xhat = reduction.sum(sum_dyg_xhat) / float(hidden);
    }
    if (!active) continue;

    In* dx_row = static_cast<In*>(p.dx) + r * p.hidden;  // [hidden]
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      float dx[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) dx[i] = rsigma * (dyg[j][i] - mean_dyg - xhat[j][i] * mean_dyg_xhat);
      store_chunk<kVectorized, kIn>(dx_row, group.column(j), hidden, dx);
    }
  }

  // The block's column sums: each group's into its slice of shared memory (a group
  // covers every column exactly once), then slices folded pairwise in a fixed order.
  float* mine = group_sums + int64_t(group.index) * kColumnSums * hidden;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int col = group.column(j);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (col + i < hidden) {
        mine[col + i] = dgamma[j][i];
        if constexpr (kLayerNorm) mine[hidden + col + i] = dbeta[j][i];
      }
    }
  }
  __syncthreads();
  const int slice = kColumnSums * hidden;
  for (int n = rows_per_block; n > 1;) {
    const int half = (n + 1) / 2;  // slices [half, n) onto [0, n - half)
    for (int k = int(threadIdx.x); k < (n - half) * slice; k += int(blockDim.x)) {
      group_sums[k] += group_sums[k + half * slice];
    }
    __syncthreads();
    n = half;
  }
  float* out = partials + int64_t(blockIdx.x) * 2 * hidden;  // [2, hidden]; RMSNorm writes the first
  for (int k = int(threadIdx.x); k < slice; k += int(blockDim.x)) out[k] = group_sums[k];
}

// dgamma[c] (dbeta[c]) = sum over the `slots` partial rows [slots, 2, hidden]. A block
// takes 32 columns; its 16 rows of threads each add every 16th slot, then row 0 adds
// the 16 results in order.
constexpr int kFinalizeColumns = 32;
constexpr int kFinalizeLanes = 16;

__global__ void __launch_bounds__(kFinalizeColumns* kFinalizeLanes)
    norm_bwd_finalize_kernel(const float* partials, int64_t slots, int64_t hidden, void* dgamma, void* dbeta,
                             te_dtype w_dtype) {
  __shared__ float sums[2][kFinalizeLanes][kFinalizeColumns];
  const int64_t c = int64_t(blockIdx.x) * kFinalizeColumns + threadIdx.x;
  KahanSum dg, db;  // up to 256 / 16 terms a lane, then 16 lanes: cheap to compensate here
  if (c < hidden) {
    for (int64_t s = threadIdx.y; s < slots; s += kFinalizeLanes) {
      const float* slot = partials + s * 2 * hidden;  // [2, hidden]
      dg.add(slot[c]);
      if (dbeta) db.add(slot[hidden + c]);
    }
  }
  sums[0][threadIdx.y][threadIdx.x] = dg.sum;
  sums[1][threadIdx.y][threadIdx.x] = db.sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < hidden) {
    KahanSum dg_all, db_all;
    for (int y = 0; y < kFinalizeLanes; ++y) {
      dg_all.add(sums[0][y][threadIdx.x]);
      db_all.add(sums[1][y][threadIdx.x]);
    }
    store_param(dgamma, c, w_dtype, dg_all.sum);
    if (dbeta) store_param(dbeta, c, w_dtype, db_all.sum);
  }
}

size_t bwd_smem_bytes(const NormBwdParams& p, const NormRowShape& shape) {
  const int column_sums = p.type == NormType::kLayerNorm ? 2 : 1;
  return (size_t(weight_tile_floats(shape.chunks, shape.threads_per_row)) +
          size_t(shape.rows_per_block) * column_sums * size_t(p.hidden)) *
         sizeof(float);
}

// Launches the rows kernel; returns how many partial rows it writes.
int64_t launch_rows_kernel(const NormBwdParams& p, const NormRowShape& shape, int device, float* partials,
                           cudaStream_t stream) {
  const bool layernorm = p.type == NormType::kLayerNorm;
  const bool vectorized =
      p.hidden % kChunk == 0 && is_aligned(p.dz, 16) && is_aligned(p.x, 16) && is_aligned(p.dx, 16);
  const size_t smem = bwd_smem_bytes(p, shape);
  int64_t grid = 0;
  auto launch = [&](auto kernel) {
    const void* fn = reinterpret_cast<const void*>(kernel);
    grid = std::min(norm_resident_grid(fn, shape, smem, p.rows, device), kNormMaxRowBlocks);
    kernel<<<unsigned(grid), unsigned(shape.block_threads()), smem, stream>>>(
        p, shape.threads_per_row, shape.rows_per_block, partials);
    check_launch("norm_bwd_rows_kernel");
  };
  // the one switch to template arguments (a single bucket: two chunks a thread)
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    constexpr te_dtype kIn = decltype(in_tag)::value;
    if (vectorized) {
      if (layernorm) {
        launch(norm_bwd_rows_kernel<kIn, 2, true, true>);
      } else {
        launch(norm_bwd_rows_kernel<kIn, 2, false, true>);
      }
    } else {
      if (layernorm) {
        launch(norm_bwd_rows_kernel<kIn, 2, true, false>);
      } else {
        launch(norm_bwd_rows_kernel<kIn, 2, false, false>);
      }
    }
  });
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
    if (shape.in_registers()) {
      slots = launch_rows_kernel(p, shape, device, partials, s);
    } else {
      norm_bwd_fallback_cuda(p, device, partials, stream);
      slots = norm_row_blocks(p.rows);
    }
  }
  const int64_t col_blocks = (p.hidden + kFinalizeColumns - 1) / kFinalizeColumns;
  norm_bwd_finalize_kernel<<<unsigned(col_blocks), dim3(kFinalizeColumns, kFinalizeLanes), 0, s>>>(
      partials, slots, p.hidden, p.dgamma, p.dbeta, p.w_dtype);
  check_launch("norm_bwd_finalize_kernel");
}

}  // namespace opente
