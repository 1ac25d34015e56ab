// Transpose of any element size through a shared-memory tile.
#include <algorithm>

#include "common/cuda_utils.h"
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
    case 1: return launch<uint8_t>(p, s);
    case 2: return launch<uint16_t>(p, s);
    case 4: return launch<uint32_t>(p, s);
    case 8: return launch<uint64_t>(p, s);
    default: fail(TE_ERROR_INTERNAL, concat("transpose_cuda: unexpected element size ", p.element_size));
  }
}

}  // namespace opente
