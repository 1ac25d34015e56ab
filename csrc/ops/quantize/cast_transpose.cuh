// Cast + transpose in one pass: read the high-precision input once, write the
// row-wise FP8 result and its transpose (the column-wise copy Hopper's TN-only
// FP8 GEMM needs).
#pragma once

#include <stdint.h>

#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "ops/quantize/vector_cast.cuh"

namespace opente {

// Fast path. Each thread casts an 8x8 block held in registers and transposes
// its bytes with byte permutes: no shared memory. A warp covers 32 rows x 64
// columns as 4 x 8 blocks, so each load instruction reads 128 contiguous bytes
// per row and each transposed store fills whole 32-byte sectors (4 threads
// write 8 bytes each of one output row). A block of 4 warps covers 128 x 64.
constexpr int kCtThreads = 128;
constexpr int kCtTileRows = 128;
constexpr int kCtTileCols = 64;

// Needs rows % 8 == cols % 8 == 0, input 16-byte and outputs 8-byte aligned.
template <class In, te_dtype Out>
__global__ void __launch_bounds__(kCtThreads)
    cast_transpose_kernel(const In* __restrict__ in,        // [rows, cols]
                          uint8_t* __restrict__ out,        // [rows, cols]; may be null
                          uint8_t* __restrict__ out_t,      // [cols, rows]
                          const float* __restrict__ scale_ptr,
                          float* __restrict__ scale_inv,    // may be null
                          float* __restrict__ amax,         // may be null
                          int64_t rows, int64_t cols, int64_t col_tiles) {
  const float scale = *scale_ptr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t tile_r = blockIdx.x / col_tiles, tile_c = blockIdx.x % col_tiles;
  const int64_t r0 = tile_r * kCtTileRows + warp * 32 + (lane / 8) * 8;
  const int64_t c0 = tile_c * kCtTileCols + (lane % 8) * 8;
  float local_amax = 0.0f;
  if (r0 < rows && c0 < cols) {
    Vec8<In> x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = *reinterpret_cast<const Vec8<In>*>(in + (r0 + k) * cols + c0);
    uint32_t lo[8], hi[8];  // row k of the block: FP8 bytes 0-3 and 4-7
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint2 q = cast8_to_fp8<Out>(x[k], scale, local_amax);
      lo[k] = q.x;
      hi[k] = q.y;
    }
    if (out) {
#pragma unroll
      for (int k = 0; k < 8; ++k) *reinterpret_cast<uint2*>(out + (r0 + k) * cols + c0) = make_uint2(lo[k], hi[k]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // column j of the block = bytes j of rows 0..7, gathered two rows at a time
      const uint32_t* src = j < 4 ? lo : hi;
      const uint32_t select_pair = (j % 4) | ((j % 4 + 4) << 4);
      const uint32_t p01 = __byte_perm(src[0], src[1], select_pair);
      const uint32_t p23 = __byte_perm(src[2], src[3], select_pair);
      const uint32_t p45 = __byte_perm(src[4], src[5], select_pair);
      const uint32_t p67 = __byte_perm(src[6], src[7], select_pair);
      *reinterpret_cast<uint2*>(out_t + (c0 + j) * rows + r0) =
          make_uint2(__byte_perm(p01, p23, 0x5410), __byte_perm(p45, p67, 0x5410));
    }
  }
  if (amax) block_max_to_global<kCtThreads>(local_amax, amax);
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
}

// Any shape and alignment: a 32 x 32 tile through shared memory, one element
// per access, bounds-checked.
constexpr int kCtGenericTile = 32;
constexpr int kCtGenericThreads = 256;

template <class In, te_dtype Out>
__global__ void __launch_bounds__(kCtGenericThreads)
    cast_transpose_generic_kernel(const In* __restrict__ in, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                                  const float* __restrict__ scale_ptr, float* __restrict__ scale_inv,
                                  float* __restrict__ amax, int64_t rows, int64_t cols, int64_t col_tiles) {
  __shared__ uint8_t tile[kCtGenericTile][kCtGenericTile + 1];
  const float scale = *scale_ptr;
  const int tx = threadIdx.x % kCtGenericTile, ty = threadIdx.x / kCtGenericTile;
  constexpr int kRowStep = kCtGenericThreads / kCtGenericTile;
  const int64_t row_base = (blockIdx.x / col_tiles) * kCtGenericTile;
  const int64_t col_base = (blockIdx.x % col_tiles) * kCtGenericTile;
  float local_amax = 0.0f;
  for (int i = ty; i < kCtGenericTile; i += kRowStep) {
    const int64_t r = row_base + i, c = col_base + tx;
    if (r < rows && c < cols) {
      const float x = to_float(in[r * cols + c]);
      local_amax = fmaxf(local_amax, fabsf(x));
      const uint8_t q = float_to_fp8<Out>(x * scale);
      if (out) out[r * cols + c] = q;
      tile[i][tx] = q;
    }
  }
  __syncthreads();
  for (int i = ty; i < kCtGenericTile; i += kRowStep) {
    const int64_t c = col_base + i, r = row_base + tx;
    if (r < rows && c < cols) out_t[c * rows + r] = tile[tx][i];
  }
  if (amax) block_max_to_global<kCtGenericThreads>(local_amax, amax);
  if (scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = 1.0f / scale;
}

}  // namespace opente
