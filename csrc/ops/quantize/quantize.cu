// Launch of the FP8 cast: cast only, or cast + transpose when the column-wise
// copy is wanted (a small tensor: quantize_small.cu, one block). The one dtype
// switch of the many-block casts lives here.
#include <algorithm>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/quantize/cast.cuh"
#include "ops/quantize/cast_transpose.cuh"
#include "ops/quantize/quantize_params.h"

namespace opente {
namespace {

template <class In, te_dtype Out>
void launch_cast(const QuantizeParams& p, int device, cudaStream_t stream) {
  const int64_t n = p.rows * p.cols;
  const auto* in = static_cast<const In*>(p.input);
  auto* out = static_cast<uint8_t*>(p.output);
  const bool vectorized = is_aligned(in, 16) && is_aligned(out, 8);
  const auto kernel = vectorized ? cast_kernel<In, Out, true> : cast_kernel<In, Out, false>;
  const int64_t work = vectorized ? n / 8 / kCastUnroll + 1 : n;
  const int64_t grid = grid_stride_blocks((const void*)kernel, kCastThreads, work, device);
  kernel<<<grid, kCastThreads, 0, stream>>>(in, out, p.scale, p.scale_inv, p.amax, n);
  check_launch("cast_kernel");
}

template <class In, te_dtype Out>
void launch_cast_transpose(const QuantizeParams& p, cudaStream_t stream) {
  const auto* in = static_cast<const In*>(p.input);
  auto* out = static_cast<uint8_t*>(p.output);
  auto* out_t = static_cast<uint8_t*>(p.output_t);
  const bool fast = p.rows % 8 == 0 && p.cols % 8 == 0 && is_aligned(in, 16) && is_aligned(out, 8) && is_aligned(out_t, 8);
  if (fast) {
    const int64_t col_tiles = std::max<int64_t>(1, (p.cols + kCtTileCols - 1) / kCtTileCols);
    const int64_t row_tiles = std::max<int64_t>(1, (p.rows + kCtTileRows - 1) / kCtTileRows);
    constexpr int kStaging = cast_transpose_staging_bytes<In>();
    static const cudaError_t smem_ok =  // fp32 inputs stage 64 KiB: past the 48 KiB default
        cudaFuncSetAttribute(cast_transpose_kernel<In, Out>, cudaFuncAttributeMaxDynamicSharedMemorySize, kStaging);
    cuda_check(smem_ok, "cudaFuncSetAttribute(cast_transpose_kernel)");
    cast_transpose_kernel<In, Out><<<row_tiles * col_tiles, kCtThreads, kStaging, stream>>>(
        in, out, out_t, p.scale, p.scale_inv, p.amax, p.rows, p.cols, col_tiles);
    check_launch("cast_transpose_kernel");
  } else {
    const int64_t col_tiles = std::max<int64_t>(1, (p.cols + kCtGenericTile - 1) / kCtGenericTile);
    const int64_t row_tiles = std::max<int64_t>(1, (p.rows + kCtGenericTile - 1) / kCtGenericTile);
    cast_transpose_generic_kernel<In, Out><<<row_tiles * col_tiles, kCtGenericThreads, 0, stream>>>(
        in, out, out_t, p.scale, p.scale_inv, p.amax, p.rows, p.cols, col_tiles);
    check_launch("cast_transpose_generic_kernel");
  }
}

}  // namespace

void quantize_cuda(const QuantizeParams& p, int device, void* stream) {
  if (small_quantize_fits(p)) {
    const QuantizeJob job{p, nullptr, nullptr, 0.0f, 0.0f, false};
    quantize_small_cuda(&job, 1, device, stream);
    return;
  }
  DeviceGuard guard(device);
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_fp8_dtype(p.out_dtype, [&](auto out_tag) {
      using In = typename CudaType<decltype(in_tag)::value>::type;
      constexpr te_dtype kOut = decltype(out_tag)::value;
      if (p.output_t) {
        launch_cast_transpose<In, kOut>(p, as_stream(stream));
      } else {
        launch_cast<In, kOut>(p, device, as_stream(stream));
      }
    });
  });
}

}  // namespace opente
