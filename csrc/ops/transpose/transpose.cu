// Transpose of any element size through a shared-memory tile; FP8 bytes in 8x8
// blocks (cast_transpose.cuh's tile without the cast) where the shape allows.
#include <algorithm>

#include "common/cuda_dependent_launch.cuh"
#include "common/cuda_utils.h"
#include "ops/quantize/cast_transpose.cuh"
#include "ops/transpose/transpose_params.h"

namespace opente {
namespace {

constexpr int kTile = 32;
constexpr int kThreads = 256;

// One 32 x 32 tile per block; the +1 column of padding keeps the column-wise
// reads of 4- and 8-byte elements free of bank conflicts.
template <class T>
__global__ void __launch_bounds__(kThreads)
    transpose_kernel(const T* __restrict__ in,  // [rows, cols]
                     T* __restrict__ out,       // [cols, rows]
                     int64_t rows, int64_t cols, int64_t col_tiles) {
  __shared__ T tile[kTile][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  constexpr int kRowStep = kThreads / kTile;
  const int64_t row_base = (blockIdx.x / col_tiles) * kTile;
  const int64_t col_base = (blockIdx.x % col_tiles) * kTile;
  for (int i = ty; i < kTile; i += kRowStep) {
    const int64_t r = row_base + i, c = col_base + tx;
    if (r < rows && c < cols) tile[i][tx] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = ty; i < kTile; i += kRowStep) {
    const int64_t c = col_base + i, r = row_base + tx;
    if (r < rows && c < cols) out[c * rows + r] = tile[tx][i];
  }
}

// Bytes (the FP8 copies' transposes): cast_transpose_kernel's tile of 128 x 128 without
// the cast. Each thread reads an 8x8 block as eight 8-byte rows (a half-warp reads a
// row's 128 bytes), transposes it with byte permutes, and the tile's transpose is
// staged in shared memory so that its stores are whole lines too. On an H100: 84% of
// copy bandwidth (87% of a same-bytes copy) at 8192 x 8192, where transpose_kernel's
// byte a thread reached 40%. Needs rows % 8 == cols % 8 == 0 and both matrices
// 8-byte aligned.
__global__ void __launch_bounds__(kCtThreads)
    byte_transpose_kernel(const uint8_t* __restrict__ in,  // [rows, cols]
                          uint8_t* __restrict__ out,       // [cols, rows]
                          int64_t rows, int64_t cols, int64_t col_tiles) {
  __shared__ alignas(16) uint8_t tile_t[kCtTileCols * kCtTileRows];  // transposed_slot's layout
  wait_for_prerequisite_grid();  // launched dependent: the kernel before may still be writing `in`
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row_base = (blockIdx.x / col_tiles) * kCtTileRows;
  const int64_t col_base = (blockIdx.x % col_tiles) * kCtTileCols;
  const int r_in_tile = warp * 16 + (lane / 16) * 8, c_in_tile = (lane % 16) * 8;
  const int64_t r0 = row_base + r_in_tile, c0 = col_base + c_in_tile;
  if (r0 < rows && c0 < cols) {  // the 8x8 block is all inside or all outside
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint2 row = __ldcs(reinterpret_cast<const uint2*>(in + (r0 + k) * cols + c0));
      lo[k] = row.x;
      hi[k] = row.y;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<uint2*>(tile_t + transposed_slot(c_in_tile + j, r_in_tile)) = byte_block_column(lo, hi, j);
    }
  }
  __syncthreads();
  store_transposed_tile(tile_t, out, row_base, col_base, rows, cols);
}

void launch_bytes(const TransposeParams& p, int device, cudaStream_t stream) {
  const int64_t col_tiles = (p.cols + kCtTileCols - 1) / kCtTileCols;
  const int64_t row_tiles = (p.rows + kCtTileRows - 1) / kCtTileRows;
  // dependent: after the norm forward's FP8 kernel (norm_fwd_cuda) its blocks take the
  // SMs that kernel's last wave leaves (1-1.5 us of 28-135 on an H100)
  launch_dependent(byte_transpose_kernel, dim3(unsigned(row_tiles * col_tiles)), dim3(kCtThreads), 0, stream, device,
                   "byte_transpose_kernel", static_cast<const uint8_t*>(p.input), static_cast<uint8_t*>(p.output),
                   p.rows, p.cols, col_tiles);
}

template <class T>
void launch(const TransposeParams& p, cudaStream_t stream) {
  const int64_t col_tiles = std::max<int64_t>(1, (p.cols + kTile - 1) / kTile);
  const int64_t row_tiles = std::max<int64_t>(1, (p.rows + kTile - 1) / kTile);
  transpose_kernel<T><<<row_tiles * col_tiles, kThreads, 0, stream>>>(static_cast<const T*>(p.input),
                                                                      static_cast<T*>(p.output), p.rows, p.cols,
                                                                      col_tiles);
  check_launch("transpose_kernel");
}

}  // namespace

void transpose_cuda(const TransposeParams& p, int device, void* stream) {
  if (p.rows * p.cols == 0) return;
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  switch (p.element_size) {
    case 1:
      if (p.rows % 8 == 0 && p.cols % 8 == 0 && is_aligned(p.input, 8) && is_aligned(p.output, 8)) {
        return launch_bytes(p, device, s);
      }
      return launch<uint8_t>(p, s);
    case 2: return launch<uint16_t>(p, s);
    case 4: return launch<uint32_t>(p, s);
    case 8: return launch<uint64_t>(p, s);
    default: fail(TE_ERROR_INTERNAL, concat("transpose_cuda: unexpected element size ", p.element_size));
  }
}

}  // namespace opente
