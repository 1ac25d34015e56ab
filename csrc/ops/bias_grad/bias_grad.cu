// The bias-gradient casts on the GPU: one pass of the tiled kernel of
// ops/activation/activation_tile.cuh (dx computed per element, written row-wise
// and / or column-wise, and each 128-row block's column sums written to the
// workspace), then dbias_finalize_kernel adds the partials of each column (for at
// most 128 rows the tile kernel writes dbias itself). The finalize is a programmatic
// dependent launch (common/cuda_dependent_launch.cuh): 1.0-1.5 us of a 104-152 us
// backward cast saved on an H100 (16384 x 4096).
#include <algorithm>

#include "common/cuda_dependent_launch.cuh"
#include "common/cuda_elements.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/activation/activation_tile.cuh"
#include "ops/bias_grad/bias_grad_params.h"
#include "ops/quantize/quantize_params.h"

namespace opente {
namespace {

static_assert(kDbiasRowBlock == kTileRowBlock, "the workspace size assumes the kernels' row blocks");

// 32 columns per block (coalesced 128-byte rows of the partials) and 8 groups of
// row blocks, so that a [128, 4096] workspace is read by 128 blocks in a few
// microseconds rather than by 16 blocks walking 128 dependent rows. (16 columns and 16
// groups measured the same, H100.)
constexpr int kFinalizeCols = 32;
constexpr int kFinalizeGroups = 8;

template <class T>
__global__ void __launch_bounds__(kFinalizeCols* kFinalizeGroups)
    dbias_finalize_kernel(const float* __restrict__ partials,  // [row_blocks, cols]
                          T* __restrict__ dbias,               // [cols]
                          int64_t row_blocks, int64_t cols) {
  __shared__ float group_sums[kFinalizeGroups][kFinalizeCols];
  wait_for_prerequisite_grid();  // the tile kernel's partials (launch_dependent)
  const int tx = threadIdx.x % kFinalizeCols, ty = threadIdx.x / kFinalizeCols;
  const int64_t c = int64_t(blockIdx.x) * kFinalizeCols + tx;
  KahanSum group;
  if (c < cols) {
    for (int64_t b = ty; b < row_blocks; b += kFinalizeGroups) group.add(partials[b * cols + c]);
  }
  group_sums[ty][tx] = group.sum;
  __syncthreads();
  if (ty == 0 && c < cols) {
    KahanSum total;
#pragma unroll
    for (int g = 0; g < kFinalizeGroups; ++g) total.add(group_sums[g][tx]);
    dbias[c] = from_float<T>(total.sum);
  }
}

}  // namespace

void dbias_cast_cuda(const DbiasCastParams& p, int device, void* workspace, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  const bool gated = p.has_activation && is_gated_activation(p.kind);
  const int64_t cols = gated ? 2 * p.hidden : p.hidden;
  // a float output with nothing to write and no dbias: no work at all
  if (p.rows * cols == 0 && !is_fp8(p.out_dtype) && !p.dbias) return;

  TileParams t{};
  t.in0 = p.grad;
  t.in1 = p.act_input;
  t.out = p.output;
  t.out_t = p.output_t;
  t.scale = p.scale;
  t.scale_inv = p.scale_inv;
  t.amax = p.amax;
  // Rows of one 128-row block: the block's column sums are dbias (rounded once, as the
  // finalize rounds a sum of one partial), and the finalize launch is saved.
  const int64_t row_blocks = (p.rows + kDbiasRowBlock - 1) / kDbiasRowBlock;  // 0 rows: dbias = 0
  const bool direct = p.dbias && row_blocks == 1;
  t.partials = p.dbias && !direct ? static_cast<float*>(workspace) : nullptr;
  t.sums = direct ? p.dbias : nullptr;
  t.sums_dtype = p.dbias_dtype;
  t.rows = p.rows;
  t.hidden = p.hidden;
  t.base = base_activation(p.kind);
  t.in_dtype = p.in_dtype;
  t.out_dtype = p.out_dtype;
  if (!p.has_activation) {
    launch_act_tile<TileMode::kIdentity>(t, device, s);
  } else if (gated) {
    launch_act_tile<TileMode::kBwdGated>(t, device, s);
  } else {
    launch_act_tile<TileMode::kBwd>(t, device, s);
  }

  if (!p.dbias || direct || cols == 0) return;
  const int64_t grid = (cols + kFinalizeCols - 1) / kFinalizeCols;
  dispatch_float_dtype(p.dbias_dtype, [&](auto tag) {
    using T = typename CudaType<decltype(tag)::value>::type;
    // started as the tile kernel's blocks exit (they allow no earlier start:
    // act_tile_kernel); it waits for their partials
    launch_dependent(dbias_finalize_kernel<T>, dim3(unsigned(grid)), dim3(kFinalizeCols * kFinalizeGroups), 0, s,
                     device, "dbias_finalize_kernel", static_cast<const float*>(workspace), static_cast<T*>(p.dbias),
                     row_blocks, cols);
  });
}

void dbias_cast_current_scaling_cuda(const DbiasCurrentScalingParams& p, int device, void* workspace,
                                     void* stream) {
  const DbiasCastParams& c = p.cast;
  QuantizeJob job{QuantizeParams{c.grad, c.output, c.output_t, p.scale_out, p.scale_inv, nullptr, c.rows, c.hidden,
                                 c.in_dtype, c.out_dtype},
                  p.amax_out, p.scale_out, p.fp8_max, p.epsilon, p.force_pow_2_scales, c.dbias, c.dbias_dtype};
  if (small_quantize_fits(job.cast)) {
    quantize_small_cuda(&job, 1, device, stream);  // amax, scale, cast and dbias: one block
    return;
  }
  current_scale_from_input_cuda(AmaxParams{c.grad, p.amax_out, c.rows * c.hidden, c.in_dtype},
                                CurrentScalingParams{p.amax_out, p.scale_out, p.scale_inv, p.fp8_max, p.epsilon,
                                                     p.force_pow_2_scales},
                                device, stream);
  dbias_cast_cuda(c, device, workspace, stream);
}

}  // namespace opente
