// Cast + transpose in one pass: read the high-precision input once, write the
// row-wise FP8 result and its transpose (the column-wise copy Hopper's TN-only
// FP8 GEMM needs).
#pragma once

#include <stdint.h>

#include "common/cuda_async_copy.cuh"
#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "ops/quantize/vector_cast.cuh"

namespace opente {

// Fast path. Each thread casts an 8x8 block held in registers and transposes
// its bytes with byte permutes. A warp covers 16 rows x 128 columns (2 x 16
// blocks) and a block of 8 warps a 128 x 128 tile, so loads read 256 bytes
// per row and row-wise stores write whole 128-byte lines. The tile's transpose
// (128 rows of 128 bytes) is staged in shared memory so that its stores also
// write whole lines. (Storing each thread's 8-byte transposed rows straight to
// memory wrote 32-byte pieces of 8 lines per instruction: 80% of copy
// bandwidth, H200. A 128 x 64 tile staged through shared memory: 84%.)
constexpr int kCtThreads = 256;
constexpr int kCtTileRows = 128;
constexpr int kCtTileCols = 128;

// Shared-memory byte of row `c`, byte `r` of the transposed tile. Its 8-byte
// slots are XOR-swizzled by (c / 8): the 16 threads of a half-warp write rows 8
// apart and read 16 slots of one row, each time to 16 distinct slots, so every
// access is free of bank conflicts.
__device__ __forceinline__ int transposed_slot(int c, int r) {
  return c * kCtTileRows + ((((r / 8) ^ (c / 8)) % 16) * 8) + (r % 8);
}

// Column j of an 8x8 block of bytes held as rows: row k is the 8 bytes
// (lo[k], hi[k]), little-endian. Column j is byte j of every row, gathered two rows
// at a time with byte permutes, returned as 8 bytes (row 0 in the lowest).
__device__ __forceinline__ uint2 byte_block_column(const uint32_t (&lo)[8], const uint32_t (&hi)[8], int j) {
  const uint32_t* src = j < 4 ? lo : hi;
  const uint32_t select_pair = (j % 4) | ((j % 4 + 4) << 4);
  const uint32_t p01 = __byte_perm(src[0], src[1], select_pair);
  const uint32_t p23 = __byte_perm(src[2], src[3], select_pair);
  const uint32_t p45 = __byte_perm(src[4], src[5], select_pair);
  const uint32_t p67 = __byte_perm(src[6], src[7], select_pair);
  return make_uint2(__byte_perm(p01, p23, 0x5410), __byte_perm(p45, p67, 0x5410));
}

// Writes a staged transposed tile (tile_t: [kCtTileCols columns, kCtTileRows rows],
// transposed_slot's layout) to out_t [cols, rows] at column row_base of row col_base:
// 128 rows of 16 slots of 8 bytes, a half-warp to a row's 128 bytes (a whole line).
// The caller's barrier lies between the tile's writes and this.
__device__ __forceinline__ void store_transposed_tile(const uint8_t* tile_t, uint8_t* out_t, int64_t row_base,
                                                      int64_t col_base, int64_t rows, int64_t cols) {
  constexpr int kSlotsPerRow = kCtTileRows / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kCtTileCols * kSlotsPerRow; i += kCtThreads) {
    const int c = i / kSlotsPerRow, r = (i % kSlotsPerRow) * 8;
    const int64_t out_row = col_base + c, out_col = row_base + r;
    if (out_row < cols && out_col < rows) {
      *reinterpret_cast<uint2*>(out_t + out_row * rows + out_col) =
          *reinterpret_cast<const uint2*>(tile_t + transposed_slot(c, r));
    }
  }
}

// Dynamic shared memory of cast_transpose_kernel: eight input vectors per thread.
template <class In>
constexpr int cast_transpose_staging_bytes() {
  return 8 * kCtThreads * int(sizeof(Vec8<In>));
}

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
  __shared__ alignas(16) uint8_t tile_t[kCtTileCols * kCtTileRows];  // [128 columns, 128 rows], swizzled
  extern __shared__ uint4 staging_bytes[];  // cast_transpose_staging_bytes<In>(), 16-byte aligned
  const float scale = *scale_ptr;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row_base = (blockIdx.x / col_tiles) * kCtTileRows;
  const int64_t col_base = (blockIdx.x % col_tiles) * kCtTileCols;
  const int r_in_tile = warp * 16 + (lane / 16) * 8, c_in_tile = (lane % 16) * 8;
  const int64_t r0 = row_base + r_in_tile, c0 = col_base + c_in_tile;
  float local_amax = 0.0f;
  if (r0 < rows && c0 < cols) {
    // All eight row loads go out at once as asynchronous copies into this thread's
    // staging slots ([k][thread]: a warp's 16-byte reads stay conflict-free). Plain
    // loads let the compiler issue four, convert them, then the rest one by one.
    auto* staging = reinterpret_cast<Vec8<In>*>(staging_bytes);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const char* src = reinterpret_cast<const char*>(in + (r0 + k) * cols + c0);
      char* dst = reinterpret_cast<char*>(&staging[k * kCtThreads + threadIdx.x]);
#pragma unroll
      for (int chunk = 0; chunk < int(sizeof(Vec8<In>)); chunk += 16) copy_async_16(dst + chunk, src + chunk);
    }
    wait_all_async_copies();
    Vec8<In> x[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = staging[k * kCtThreads + threadIdx.x];
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
      *reinterpret_cast<uint2*>(tile_t + transposed_slot(c_in_tile + j, r_in_tile)) = byte_block_column(lo, hi, j);
    }
  }
  __syncthreads();
  store_transposed_tile(tile_t, out_t, row_base, col_base, rows, cols);
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
