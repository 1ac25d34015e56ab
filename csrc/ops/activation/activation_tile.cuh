// Tiled element-wise kernels: read one tile of the input(s), compute an fp32
// value per element, and write in one pass the row-wise result (FP8 or float),
// the FP8 column-wise (transposed) copy, and the tile's column sums for a bias
// gradient. They serve the activation forward with a column-wise copy
// (activation.cu) and the fused backward casts of ops/bias_grad/
// (te_dbias_cast_transpose, te_dact_dbias_cast_transpose).
//
// The fast kernel is cast_transpose_kernel's design (ops/quantize/cast_transpose.cuh)
// with the value computed between load and cast: a block of 256 threads covers a
// 128 x 128 tile, each thread an 8 x 8 block whose rows all load at once through
// cp.async into shared memory; its FP8 bytes are transposed in registers with byte
// permutes and staged in a swizzled shared tile so that both outputs are written
// in full 128-byte lines. It needs rows % 8 == 0, H % 8 == 0 and aligned pointers;
// a generic kernel (32-column blocks, element by element) takes everything else.
//
// Column sums go to a workspace of [ceil(rows / 128), out_cols] fp32 partials,
// one row per 128-row block in every kernel, so the sum's grouping depends on the
// shape only, never on the GPU or on which kernel ran. With one row block they are
// the sums themselves, written to the output directly (no finalize launch).
#pragma once

#include <stdint.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <utility>

#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/activation/activation_device.cuh"
#include "ops/activation/activation_params.h"
#include "ops/quantize/cast_transpose.cuh"

namespace opente {

// What a tile computes per element, from which inputs (H = TileParams::hidden):
//   kIdentity  y = g                          in0 = g [rows, H]
//   kFwd       y = act(x)                     in0 = x [rows, H]
//   kFwdGated  y = act(a) * b                 in0 = [a | b] [rows, 2H]
//   kBwd       y = g * act'(x)                in0 = g [rows, H], in1 = x [rows, H]
//   kBwdGated  y = [g * b * act'(a) | g * act(a)]   in0 = g [rows, H], in1 = [a | b] [rows, 2H]
// The output has H columns, 2H for kBwdGated (its two halves are two outputs).
enum class TileMode { kIdentity, kFwd, kFwdGated, kBwd, kBwdGated };

__host__ __device__ constexpr int tile_inputs(TileMode m) {
  return m == TileMode::kBwdGated ? 3 : (m == TileMode::kFwdGated || m == TileMode::kBwd) ? 2 : 1;
}
__host__ __device__ constexpr int tile_outputs(TileMode m) { return m == TileMode::kBwdGated ? 2 : 1; }

// Rows per block of the column-sum partials (every tiled kernel's tile height).
constexpr int64_t kTileRowBlock = 128;
static_assert(kCtTileRows == kTileRowBlock, "the fast kernel's tile is the partials' row block");

struct TileParams {
  const void* in0;        // see TileMode; in_dtype
  const void* in1;        // see TileMode; null for kIdentity, kFwd, kFwdGated
  void* out;              // [rows, out_cols], out_dtype; may be null
  void* out_t;            // [out_cols, rows], FP8 only; may be null
  const float* scale;     // [1], FP8 output only
  float* scale_inv;       // [1], receives 1/scale; may be null
  float* amax;            // [1], raised to max|y| over the fp32 y; may be null
  float* partials;        // [ceil(rows / 128), out_cols] column sums of y per row block; may be null
  te_dtype sums_dtype;    // of sums: in_dtype or float32
  void* sums;             // [out_cols], sums_dtype: the column sums themselves, for rows <= 128 (one
                          // row block, no partials to add up); may be null, never with partials
  int64_t rows;
  int64_t hidden;         // H
  te_activation base;     // the plain activation (not read for kIdentity)
  te_dtype in_dtype;      // float32, float16, bfloat16
  te_dtype out_dtype;     // FP8, or (kBwd, kBwdGated) a float dtype
};

// The value of output half `o` from the element's inputs v (in TileMode's order),
// with the very operations of the CPU references (activation_cpu.cpp).
template <TileMode M>
__device__ __forceinline__ float tile_value(te_activation base, int o, const float* v) {
  if constexpr (M == TileMode::kIdentity) {
    return v[0];
  } else if constexpr (M == TileMode::kFwd) {
    return act_forward(base, v[0]);
  } else if constexpr (M == TileMode::kFwdGated) {
    return act_mul(act_forward(base, v[0]), v[1]);
  } else if constexpr (M == TileMode::kBwd) {
    return act_mul(v[0], act_derivative(base, v[1]));
  } else {
    return o == 0 ? act_mul(act_mul(v[0], v[2]), act_derivative(base, v[1])) : act_mul(v[0], act_forward(base, v[1]));
  }
}

// Row r of input tile j, at column 0 of the tile space.
template <TileMode M, class In>
__device__ __forceinline__ const In* tile_input_row(const TileParams& p, int j, int64_t r) {
  const int64_t h = p.hidden;
  const In* in0 = static_cast<const In*>(p.in0);
  const In* in1 = static_cast<const In*>(p.in1);
  if constexpr (M == TileMode::kIdentity || M == TileMode::kFwd) {
    return in0 + r * h;
  } else if constexpr (M == TileMode::kFwdGated) {
    return in0 + r * 2 * h + j * h;
  } else if constexpr (M == TileMode::kBwd) {
    return (j == 0 ? in0 : in1) + r * h;
  } else {
    return j == 0 ? in0 + r * h : in1 + r * 2 * h + (j - 1) * h;
  }
}

// Dynamic shared memory of act_tile_kernel: eight rows of 8 elements per thread and input.
template <class In, TileMode M>
__host__ __device__ constexpr int act_tile_staging_bytes() {
  return tile_inputs(M) * 8 * kCtThreads * int(sizeof(Vec8<In>));
}

// B: the plain activation (not read for kIdentity). The output dtype, FP8 or
// float, is a run-time value (see activation_device.cuh).
template <class In, TileMode M, te_activation B>
__global__ void __launch_bounds__(kCtThreads) act_tile_kernel(TileParams p, int64_t col_tiles) {
  constexpr int kIn = tile_inputs(M), kOuts = tile_outputs(M);
  // The transposed FP8 tile ([128 columns, 128 rows], swizzled) and the column sums
  // of each warp's 16 rows ([8 warps, 128 columns]). With one output they reuse the
  // staging area once every thread has read its inputs: dgelu's two bf16 inputs then
  // take 64 KiB of shared memory a block, three blocks per SM rather than two.
  constexpr int kTileBytes = kCtTileCols * kCtTileRows;
  constexpr int kSumsBytes = kCtThreads / 32 * kCtTileCols * int(sizeof(float));
  constexpr bool kReuseStaging = kOuts == 1;
  static_assert(act_tile_staging_bytes<In, M>() >= kTileBytes + kSumsBytes, "staging too small to reuse");
  // No early allow_dependent_launch(): the bias-gradient finalize's blocks, resident
  // while they waited for this grid, took room from its blocks (H200: 0.3-0.7 us slower
  // than letting the finalize start as our blocks exit, which still saves its launch).
  __shared__ alignas(16) uint8_t own_smem[kReuseStaging ? 16 : kTileBytes + kSumsBytes];
  extern __shared__ uint4 staging_bytes[];  // [kIn][8 rows][threads] of Vec8<In>
  auto* staging = reinterpret_cast<Vec8<In>*>(staging_bytes);
  uint8_t* tile_t = kReuseStaging ? reinterpret_cast<uint8_t*>(staging_bytes) : own_smem;
  float* warp_sums = reinterpret_cast<float*>(tile_t + kTileBytes);  // [8][128]
  const int64_t rows = p.rows, h = p.hidden, out_cols = kOuts * h;
  const te_dtype out_dtype = p.out_dtype;
  const bool fp8 = is_fp8_dtype(out_dtype);
  const bool transpose = fp8 && p.out_t != nullptr, sum_columns = p.partials != nullptr || p.sums != nullptr;
  const float scale = fp8 ? *p.scale : 1.0f;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row_tile = blockIdx.x / col_tiles;
  const int64_t row_base = row_tile * kCtTileRows, col_base = (blockIdx.x % col_tiles) * kCtTileCols;
  const int r_in_tile = warp * 16 + (lane / 16) * 8, c_in_tile = (lane % 16) * 8;
  const int64_t r0 = row_base + r_in_tile, c0 = col_base + c_in_tile;
  // rows % 8 == 0 and H % 8 == 0: a thread's 8 x 8 block is wholly inside or wholly outside
  const bool active = r0 < rows && c0 < h;
  if (active) {
#pragma unroll
    for (int j = 0; j < kIn; ++j) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const char* src = reinterpret_cast<const char*>(tile_input_row<M, In>(p, j, r0 + k) + c0);
        char* dst = reinterpret_cast<char*>(&staging[(j * 8 + k) * kCtThreads + threadIdx.x]);
#pragma unroll
        for (int chunk = 0; chunk < int(sizeof(Vec8<In>)); chunk += 16) copy_async_16(dst + chunk, src + chunk);
      }
    }
    wait_all_async_copies();
  }
  float local_amax = 0.0f;
#pragma unroll
  for (int o = 0; o < kOuts; ++o) {
    float col_sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t lo[8], hi[8];  // FP8 row k of the block: bytes 0-3 and 4-7
    if (active) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        float x[kIn][8];
#pragma unroll
        for (int j = 0; j < kIn; ++j) {
          // copied whole first: converted straight from shared memory, it was read 2 bytes
          // at a time (64 LDS.U16 per row instead of 8 LDS.128; 16-bit inputs)
          const Vec8<In> raw = staging[(j * 8 + k) * kCtThreads + threadIdx.x];
          to_float8(raw, x[j]);
        }
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float v[kIn];
#pragma unroll
          for (int j = 0; j < kIn; ++j) v[j] = x[j][e];
          y[e] = tile_value<M>(B, o, v);
          col_sum[e] += y[e];
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) local_amax = fmaxf(local_amax, fabsf(y[e]));  // used for FP8 only
        const uint2 q = emit8(te_dtype(opaque(int(out_dtype))), opaque(p.out), (r0 + k) * out_cols + o * h + c0, y,
                              scale);
        lo[k] = q.x;
        hi[k] = q.y;
      }
    }
    if constexpr (kReuseStaging) __syncthreads();  // all inputs read: the staging area is free
    if (active && opaque(int(transpose))) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<uint2*>(tile_t + transposed_slot(c_in_tile + j, r_in_tile)) = byte_block_column(lo, hi, j);
      }
    }
    if (opaque(int(sum_columns))) {
      // lanes l and l + 16 hold the same 8 columns for the warp's two 8-row groups
#pragma unroll
      for (int e = 0; e < 8; ++e) col_sum[e] += __shfl_xor_sync(0xffffffffu, col_sum[e], 16);
      if (lane < 16) {
#pragma unroll
        for (int e = 0; e < 8; ++e) warp_sums[warp * kCtTileCols + c_in_tile + e] = col_sum[e];
      }
    }
    __syncthreads();
    if (transpose) {
      // 128 rows x 16 slots of 8 bytes; a half-warp writes one row's 128 bytes
      constexpr int kSlotsPerRow = kCtTileRows / 8;
      for (int i = threadIdx.x; i < kCtTileCols * kSlotsPerRow; i += kCtThreads) {
        const int c = i / kSlotsPerRow, r = (i % kSlotsPerRow) * 8;
        const int64_t out_row = col_base + c, out_col = row_base + r;
        if (out_row < h && out_col < rows) {
          *reinterpret_cast<uint2*>(static_cast<uint8_t*>(p.out_t) + (o * h + out_row) * rows + out_col) =
              *reinterpret_cast<const uint2*>(tile_t + transposed_slot(c, r));
        }
      }
    }
    if (sum_columns && threadIdx.x < kCtTileCols) {
      const int64_t c = col_base + threadIdx.x;
      if (c < h && row_base < rows) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kCtThreads / 32; ++w) sum += warp_sums[w * kCtTileCols + threadIdx.x];
        if (p.sums) {
          if (p.sums_dtype == TE_DTYPE_FLOAT32) {
            static_cast<float*>(p.sums)[o * h + c] = sum;
          } else {
            static_cast<In*>(p.sums)[o * h + c] = from_float<In>(sum);
          }
        } else {
          p.partials[row_tile * out_cols + o * h + c] = sum;
        }
      }
    }
    if (o + 1 < kOuts) __syncthreads();  // tile_t and warp_sums are rewritten for the next half
  }
  if (fp8) {
    if (p.amax) block_max_to_global<kCtThreads>(local_amax, p.amax);
    if (p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  }
}

// ---- any shape and alignment: 128-row x 32-column blocks, element by element ----

constexpr int kTileGenericCols = 32;
constexpr int kTileGenericThreads = 256;
constexpr int kTileGenericRowStep = kTileGenericThreads / kTileGenericCols;  // 8

template <class In>
__device__ __forceinline__ void load_tile_element(const TileParams& p, TileMode mode, int64_t r, int64_t c,
                                                  float (&v)[3]) {
  const int64_t h = p.hidden;
  const In* in0 = static_cast<const In*>(p.in0);
  const In* in1 = static_cast<const In*>(p.in1);
  switch (mode) {
    case TileMode::kIdentity:
    case TileMode::kFwd: v[0] = to_float(in0[r * h + c]); break;
    case TileMode::kFwdGated:
      v[0] = to_float(in0[r * 2 * h + c]);
      v[1] = to_float(in0[r * 2 * h + h + c]);
      break;
    case TileMode::kBwd:
      v[0] = to_float(in0[r * h + c]);
      v[1] = to_float(in1[r * h + c]);
      break;
    case TileMode::kBwdGated:
      v[0] = to_float(in0[r * h + c]);
      v[1] = to_float(in1[r * 2 * h + c]);
      v[2] = to_float(in1[r * 2 * h + h + c]);
      break;
  }
}

__device__ __forceinline__ float tile_value_any(TileMode mode, te_activation base, int o, const float* v) {
  switch (mode) {
    case TileMode::kIdentity: return tile_value<TileMode::kIdentity>(base, o, v);
    case TileMode::kFwd: return tile_value<TileMode::kFwd>(base, o, v);
    case TileMode::kFwdGated: return tile_value<TileMode::kFwdGated>(base, o, v);
    case TileMode::kBwd: return tile_value<TileMode::kBwd>(base, o, v);
    default: return tile_value<TileMode::kBwdGated>(base, o, v);
  }
}

// The mode, the activation and the output dtype are run-time values here: this
// path exists for correctness on odd shapes, and one kernel per input dtype keeps
// the build small.
template <class In>
__global__ void __launch_bounds__(kTileGenericThreads)
    act_tile_generic_kernel(TileParams p, TileMode mode, int64_t col_tiles) {
  __shared__ uint8_t tile[2][kTileGenericCols][kTileGenericCols + 1];  // [half][row][column] FP8 bytes
  __shared__ float sums[2][kTileGenericRowStep][kTileGenericCols];
  // (no early allow_dependent_launch(), as in act_tile_kernel)
  const bool fp8 = is_fp8_dtype(p.out_dtype);
  const int n_out = mode == TileMode::kBwdGated ? 2 : 1;
  const float scale = fp8 ? *p.scale : 1.0f;
  const int64_t rows = p.rows, h = p.hidden, out_cols = n_out * h;
  const int tx = threadIdx.x % kTileGenericCols, ty = threadIdx.x / kTileGenericCols;
  const int64_t row_tile = blockIdx.x / col_tiles;
  const int64_t row_base = row_tile * kTileRowBlock, col_base = (blockIdx.x % col_tiles) * kTileGenericCols;
  float col_sum[2] = {0.0f, 0.0f};
  float local_amax = 0.0f;
  for (int sub = 0; sub < kTileRowBlock; sub += kTileGenericCols) {
    for (int i = ty; i < kTileGenericCols; i += kTileGenericRowStep) {
      const int64_t r = row_base + sub + i, c = col_base + tx;
      if (r < rows && c < h) {
        float v[3];
        load_tile_element<In>(p, mode, r, c, v);
        for (int o = 0; o < n_out; ++o) {
          const float y = tile_value_any(mode, p.base, o, v);
          col_sum[o] += y;
          local_amax = fmaxf(local_amax, fabsf(y));  // used for FP8 only
          const int64_t index = r * out_cols + o * h + c;
          if (fp8) {
            const uint8_t q = fp8_code(p.out_dtype, act_mul(y, scale));
            if (p.out) static_cast<uint8_t*>(p.out)[index] = q;
            tile[o][i][tx] = q;
          } else if (p.out) {
            store1_float(p.out, p.out_dtype, index, y);
          }
        }
      }
    }
    if (fp8 && p.out_t) {
      __syncthreads();
      for (int o = 0; o < n_out; ++o) {
        for (int i = ty; i < kTileGenericCols; i += kTileGenericRowStep) {
          const int64_t c = col_base + i, r = row_base + sub + tx;
          if (r < rows && c < h) static_cast<uint8_t*>(p.out_t)[(o * h + c) * rows + r] = tile[o][tx][i];
        }
      }
      __syncthreads();
    }
  }
  if (p.partials || p.sums) {
    for (int o = 0; o < n_out; ++o) sums[o][ty][tx] = col_sum[o];
    __syncthreads();
    const int64_t c = col_base + tx;
    if (ty == 0 && c < h && row_base < rows) {
      for (int o = 0; o < n_out; ++o) {
        float sum = 0.0f;
        for (int g = 0; g < kTileGenericRowStep; ++g) sum += sums[o][g][tx];
        if (p.sums) {
          store1_float(p.sums, p.sums_dtype, o * h + c, sum);
        } else {
          p.partials[row_tile * out_cols + o * h + c] = sum;
        }
      }
    }
  }
  if (fp8) {
    if (p.amax) block_max_to_global<kTileGenericThreads>(local_amax, p.amax);
    if (p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
  }
}

// ---- launch ----

// Sets a kernel's dynamic shared memory limit, once per kernel and device: by
// default static plus dynamic shared memory may not pass 48 KiB, and the fast
// kernel's staging takes 32 to 192 KiB.
inline void allow_dynamic_smem(const void* kernel, int bytes, int device) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device})) return;
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             "cudaFuncSetAttribute(act_tile_kernel)");
  done.insert({kernel, device});
}

template <class In, TileMode M>
void launch_act_tile_fast(const TileParams& p, int device, cudaStream_t stream) {
  const int64_t col_tiles = std::max<int64_t>(1, (p.hidden + kCtTileCols - 1) / kCtTileCols);
  const int64_t row_tiles = std::max<int64_t>(1, (p.rows + kCtTileRows - 1) / kCtTileRows);
  constexpr int kStaging = act_tile_staging_bytes<In, M>();
  auto launch = [&](auto kernel) {
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kStaging, device);
    kernel<<<row_tiles * col_tiles, kCtThreads, kStaging, stream>>>(p, col_tiles);
    check_launch("act_tile_kernel");
  };
  if constexpr (M == TileMode::kIdentity) {
    launch(act_tile_kernel<In, M, TE_ACTIVATION_GELU>);  // the activation is not read
  } else {
    dispatch_base_activation(p.base, [&](auto tag) { launch(act_tile_kernel<In, M, decltype(tag)::value>); });
  }
}

// Runs mode M over p on `stream` (float outputs: kBwd and kBwdGated only, out_t null).
template <TileMode M>
void launch_act_tile(const TileParams& p, int device, cudaStream_t stream) {
  const bool fp8 = is_fp8(p.out_dtype);
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    using In = typename CudaType<decltype(in_tag)::value>::type;
    const bool fast = p.rows % 8 == 0 && p.hidden % 8 == 0 && is_aligned(p.in0, 16) && is_aligned(p.in1, 16) &&
                      is_aligned(p.out, fp8 ? 8 : 16) && is_aligned(p.out_t, 8);
    if (fast) {
      launch_act_tile_fast<In, M>(p, device, stream);
    } else {
      const int64_t col_tiles = std::max<int64_t>(1, (p.hidden + kTileGenericCols - 1) / kTileGenericCols);
      const int64_t row_tiles = std::max<int64_t>(1, (p.rows + kTileRowBlock - 1) / kTileRowBlock);
      act_tile_generic_kernel<In><<<row_tiles * col_tiles, kTileGenericThreads, 0, stream>>>(p, M, col_tiles);
      check_launch("act_tile_generic_kernel");
    }
  });
}

}  // namespace opente
