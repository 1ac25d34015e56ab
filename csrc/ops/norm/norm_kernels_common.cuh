// Device-side building blocks of the norm kernels: a row group's view of its row
// (which columns a thread holds), chunk loads and stores with their bounds, the
// weights (read a chunk at a time by the forward, staged once per block by the
// backward), and the sums over a row group.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "common/cuda_async_copy.cuh"
#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "common/dtype.h"
#include "ops/norm/norm_launch.h"

namespace opente {
namespace norm_kernels {

constexpr int kChunk = 8;  // elements a thread loads at once: 16 bytes of a 16-bit dtype

template <te_dtype D>
constexpr bool kIsFp8 = D == TE_DTYPE_FLOAT8_E4M3 || D == TE_DTYPE_FLOAT8_E5M2;

__device__ __forceinline__ bool is_fp8_dtype(te_dtype d) {
  return d == TE_DTYPE_FLOAT8_E4M3 || d == TE_DTYPE_FLOAT8_E5M2;
}

// How a kernel stores an element of dtype D: its CUDA type, FP8 as a byte.
template <te_dtype D, bool = kIsFp8<D>>
struct Stored {
  using type = uint8_t;
};
template <te_dtype D>
struct Stored<D, false> {
  using type = typename CudaType<D>::type;
};

// A gamma / beta / dgamma element of a runtime dtype: the kernels touch the weights
// once per thread (or per column), so a switch costs less than more instantiations.
__device__ __forceinline__ float load_param(const void* p, int64_t i, te_dtype dtype) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: return __half2float(static_cast<const __half*>(p)[i]);
    case TE_DTYPE_BFLOAT16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void store_param(void* p, int64_t i, te_dtype dtype, float v) {
  switch (dtype) {
    case TE_DTYPE_FLOAT16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case TE_DTYPE_BFLOAT16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// One output element (FP8 as its byte).
template <te_dtype kOut>
__device__ __forceinline__ void store_element(void* base, int64_t i, float y) {
  if constexpr (kIsFp8<kOut>) {
    static_cast<uint8_t*>(base)[i] = float_to_fp8<kOut>(y);
  } else {
    using T = typename CudaType<kOut>::type;
    static_cast<T*>(base)[i] = from_float<T>(y);
  }
}

// The part of a block that normalizes one row at a time: `threads` consecutive
// threads (a power of two <= 32 inside a warp, or whole warps).
struct RowGroup {
  int threads;  // threads_per_row
  int index;    // which group of the block, [0, rows_per_block)
  int thread;   // this thread's rank in the group, [0, threads)

  __device__ __forceinline__ explicit RowGroup(int threads_per_row)
      : threads(threads_per_row),
        index(int(threadIdx.x) / threads_per_row),
        thread(int(threadIdx.x) % threads_per_row) {}

  // A block that is one row group: its index 0 a constant, not a division held in a register
  static __device__ __forceinline__ RowGroup whole_block() { return RowGroup(int(blockDim.x), 0, int(threadIdx.x)); }

  // Groups of a power of two of threads (the rows that fit in a warp: norm_row_shape.cpp):
  // the index and the rank by a shift and a mask. With the rank's range known the compiler
  // drops the sign extension of the column-wise FP8 copy's byte offsets and predicates
  // those stores where it branched around each (SASS, sm_90a, the forward's 6-chunk rows
  // of an FP8 y: the row loop 6187 -> 4912 instructions, 274 -> 6 sign extensions, 251 ->
  // 35 branch regions; a call for y^T alone runs them).
  static __device__ __forceinline__ RowGroup power_of_two(int threads_per_row) {
    const int shift = __ffs(threads_per_row) - 1;
    return RowGroup(threads_per_row, int(threadIdx.x) >> shift, int(threadIdx.x) & (threads_per_row - 1));
  }

  // Any group size, the index by a multiply by the reciprocal (MUFU.RCP, __fdividef's two
  // ulp) where the integer division and remainder take about 30 instructions a thread
  // (SASS): (threadIdx.x + 0.5) / threads_per_row lies at least 0.5 / threads_per_row from
  // an integer, over a thousand times that error for blocks of up to 1024 threads, so the
  // quotient truncates to the exact index. (nvcc's host pass parses this body too, and
  // has no __fdividef.)
  static __device__ __forceinline__ RowGroup by_reciprocal(int threads_per_row) {
#ifdef __CUDA_ARCH__
    const int group = int(__fdividef(float(threadIdx.x) + 0.5f, float(threads_per_row)));
#else
    const int group = int(threadIdx.x) / threads_per_row;
#endif
    return RowGroup(threads_per_row, group, int(threadIdx.x) - group * threads_per_row);
  }

  // First column of this thread's chunk j: neighbouring threads hold neighbouring
  // 8-element chunks, so a warp's loads of chunk j are contiguous.
  __device__ __forceinline__ int column(int j) const { return (j * threads + thread) * kChunk; }

 private:
  __device__ __forceinline__ RowGroup(int threads_per_row, int group_index, int thread_rank)
      : threads(threads_per_row), index(group_index), thread(thread_rank) {}
};

// Element i of a chunk as fp32. A bf16 is the upper half of an fp32, so element i
// is its 32-bit word shifted left (even i) or masked (odd i): one instruction,
// where converting the element taken out of the word took two (PRMT, then SHF).
// The norm kernels convert every element of x two or three times and of the
// weights once a row, and an ncu profile had the forward bound by instruction issue.
template <class T>
__device__ __forceinline__ float element_as_float(const Vec8<T>& v, int i) {
  return to_float(v.v[i]);
}
__device__ __forceinline__ float element_as_float(const Vec8<__nv_bfloat16>& v, int i) {
  const uint32_t word = reinterpret_cast<const uint32_t*>(&v)[i / 2];
  return __uint_as_float(i % 2 == 0 ? word << 16 : word & 0xffff0000u);
}

// Eight elements with a streaming load (ld.global.cs), which marks its lines first
// to evict: the forward's rows pass through L1 once and so do not push out the
// weights it reads again for every row. (The backward keeps plain loads: there
// streaming ones made hidden 16384 12-23% slower on an H100.)
template <class T>
__device__ __forceinline__ void load_evict_first(const T* at, Vec8<T>& v) {
  static_assert(sizeof(T) == 2, "16-bit elements: one 16-byte word");
  *reinterpret_cast<uint4*>(&v) = __ldcs(reinterpret_cast<const uint4*>(at));
}
__device__ __forceinline__ void load_evict_first(const float* at, Vec8<float>& v) {
  const float4 lo = __ldcs(reinterpret_cast<const float4*>(at)), hi = __ldcs(reinterpret_cast<const float4*>(at) + 1);
  v.v[0] = lo.x, v.v[1] = lo.y, v.v[2] = lo.z, v.v[3] = lo.w;
  v.v[4] = hi.x, v.v[5] = hi.y, v.v[6] = hi.z, v.v[7] = hi.w;
}

// A thread's chunks of one row (RowGroup::column), held as loaded: in the input
// dtype, converted to fp32 where they are used. Half the registers of fp32 for a
// 16-bit row, which leaves room for more rows in flight (the forward), or for
// values derived from them (x hat, dz * gamma) to be held or recomputed (the
// backward). Columns at or past `limit` hold 0. kVectorized: hidden % 8 == 0 and
// the row 16-byte aligned, so a chunk is all in the row or all past it and loads
// as one 16-byte vector (two for fp32); else element by element.
template <class T, int kChunks, bool kVectorized>
struct RowShare {
  Vec8<T> raw[kChunks];

  template <bool kEvictFirst = false>
  __device__ __forceinline__ void load(const T* row, const RowGroup& group, int limit) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int col = group.column(j);
      if constexpr (kVectorized) {
        if (col >= limit) {
#pragma unroll
          for (int i = 0; i < kChunk; ++i) raw[j].v[i] = from_float<T>(0.0f);
        } else if constexpr (kEvictFirst) {
          load_evict_first(row + col, raw[j]);
        } else {
          raw[j] = *reinterpret_cast<const Vec8<T>*>(row + col);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) raw[j].v[i] = col + i < limit ? row[col + i] : from_float<T>(0.0f);
      }
    }
  }

  __device__ __forceinline__ float at(int j, int i) const { return element_as_float(raw[j], i); }

  // Hides the held words' values from the compiler (no instruction), so that it
  // converts them again where they are next used rather than keep every converted
  // fp32 value live until then (for the forward, across the row's reduction: with
  // one-instruction bf16 conversions it did, and spilled).
  __device__ __forceinline__ void convert_again_later() {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int w = 0; w < int(sizeof(Vec8<T>)) / 4; ++w) asm volatile("" : "+r"(reinterpret_cast<uint32_t*>(&raw[j])[w]));
    }
  }

  // Staged loads (kVectorized only): stage() starts copying this thread's chunks of
  // `row` into its slots of a shared-memory stage (cp.async: nothing is held in
  // registers while they are in flight), load_staged() reads them back into `raw`
  // once the copies are complete (wait_async_copies). Each thread reads only the
  // slots it copied, so no barrier is needed. A stage holds kStageWords 16-byte
  // words a thread: word w of thread t at stage[w * blockDim.x + t], so a warp's
  // accesses are consecutive words (no bank conflicts). Columns at or past `limit`
  // become zeros, and the row's first word stands in for their source (the copy
  // reads nothing there, but takes a mapped address): `row` must be a row of the
  // tensor even where limit is 0 (the callers pass row 0 past the last row). Every
  // address is made the same way, with no branch: where the source was picked from
  // two pointers, the compiler made each chunk's address in a predicated branch of
  // its own (about 60 instructions a row of two chunks of dz and x, SASS of the
  // pipelined backward).
  static constexpr int kWordsPerChunk = int(sizeof(Vec8<T>)) / 16;
  static constexpr int kStageWords = kChunks * kWordsPerChunk;

  __device__ __forceinline__ static void stage(uint4* stage, const T* row, const RowGroup& group, int limit) {
    static_assert(kVectorized, "staged loads take 16-byte vectors");
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int col = group.column(j);
      const bool valid = col < limit;
      const uint4* words = reinterpret_cast<const uint4*>(row + (valid ? col : 0));
#pragma unroll
      for (int w = 0; w < kWordsPerChunk; ++w) {
        copy_async_16_or_zero(stage + (j * kWordsPerChunk + w) * int(blockDim.x) + int(threadIdx.x),
                              words + (valid ? w : 0), valid);
      }
    }
  }

  __device__ __forceinline__ void load_staged(const uint4* stage) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int w = 0; w < kWordsPerChunk; ++w) {
        reinterpret_cast<uint4*>(&raw[j])[w] = stage[(j * kWordsPerChunk + w) * int(blockDim.x) + int(threadIdx.x)];
      }
    }
  }
};


// Chunk j of this thread's share of a staged 16-bit row (RowShare::stage's layout, one
// 16-byte word a chunk), read back by the thread that staged it.
template <class In>
__device__ __forceinline__ Vec8<In> staged_chunk(const uint4* stage, int j) {
  Vec8<In> v;
  *reinterpret_cast<uint4*>(&v) = stage[j * int(blockDim.x) + int(threadIdx.x)];
  return v;
}

// `ptr`, made opaque to the compiler once per row: loads through it cannot be
// hoisted out of the row loop as invariant. Hoisted, every chunk's weights
// stayed in registers across the rows (up to 64 more; ptxas then spilled). A value
// (a flag, a row's offset) made opaque is held as made, not rebuilt at each use.
template <class T>
__device__ __forceinline__ T* opaque_per_row(T* ptr) {
  asm volatile("" : "+l"(ptr));
  return ptr;
}
__device__ __forceinline__ int opaque_per_row(int v) {
  asm volatile("" : "+r"(v));
  return v;
}
__device__ __forceinline__ int64_t opaque_per_row(int64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}

// The forward's weights, read a chunk at a time: load_gamma(col, hidden, v) puts
// columns [col, col + 8) of gamma (plus 1 for zero_centered_gamma) as fp32 into v,
// 0 past `hidden`; load_beta the same of beta. The same chunks are read for every
// row a thread visits, so they come from L1; built once per row, the pointers are
// made opaque there (opaque_per_row) so that they are read there.
// TypedWeights: for the vectorized rows (hidden % 8 == 0, 16-byte aligned vectors,
// a chunk in the row), W the weights' element type; one or two 16-byte loads.
template <class W, bool kCentered>
struct TypedWeights {
  const W* gamma;
  const W* beta;

  __device__ __forceinline__ TypedWeights(const void* g, const void* b)
      : gamma(opaque_per_row(static_cast<const W*>(g))), beta(opaque_per_row(static_cast<const W*>(b))) {}

  __device__ __forceinline__ void load_gamma(int col, int /*hidden*/, float (&v)[kChunk]) const {
    load(gamma, col, v);
    if constexpr (kCentered) {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] += 1.0f;
    }
  }
  __device__ __forceinline__ void load_beta(int col, int /*hidden*/, float (&v)[kChunk]) const { load(beta, col, v); }

 private:
  __device__ __forceinline__ static void load(const W* w, int col, float (&v)[kChunk]) {
    Vec8<W> raw;
#pragma unroll
    for (int k = 0; k < int(sizeof(raw)) / 16; ++k) {
      reinterpret_cast<uint4*>(&raw)[k] = __ldg(reinterpret_cast<const uint4*>(w + col) + k);
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = element_as_float(raw, i);
  }
};

// RuntimeWeights: for the element-wise rows, the dtype read at run time, element by
// element (typed copies of these kernels spilled hundreds of bytes).
struct RuntimeWeights {
  const void* gamma;
  const void* beta;
  te_dtype dtype;
  float gamma_shift;

  __device__ __forceinline__ RuntimeWeights(const void* g, const void* b, te_dtype d, bool zero_centered_gamma)
      : gamma(opaque_per_row(g)), beta(opaque_per_row(b)), dtype(d), gamma_shift(zero_centered_gamma ? 1.0f : 0.0f) {}

  __device__ __forceinline__ void load_gamma(int col, int hidden, float (&v)[kChunk]) const {
    load(gamma, col, hidden, gamma_shift, v);
  }
  __device__ __forceinline__ void load_beta(int col, int hidden, float (&v)[kChunk]) const {
    load(beta, col, hidden, 0.0f, v);
  }

 private:
  __device__ __forceinline__ void load(const void* w, int col, int hidden, float shift, float (&v)[kChunk]) const {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = col + i < hidden ? load_param(w, col + i, dtype) + shift : 0.0f;
  }
};

// Calls f(DTypeTag<d>{}) for the weights' dtype d (fp32, fp16 or bf16) on the device.
template <class F>
__device__ __forceinline__ void with_weight_dtype(te_dtype dtype, F&& f) {
  switch (dtype) {
    case TE_DTYPE_BFLOAT16: f(DTypeTag<TE_DTYPE_BFLOAT16>{}); break;
    case TE_DTYPE_FLOAT16: f(DTypeTag<TE_DTYPE_FLOAT16>{}); break;
    default: f(DTypeTag<TE_DTYPE_FLOAT32>{});
  }
}

// Calls f(TypedWeights<W, centered>(gamma, beta)) for the weights' dtype W and
// zero_centered_gamma as template arguments: one switch a row rather than one a chunk.
template <class F>
__device__ __forceinline__ void with_typed_weights(te_dtype dtype, bool zero_centered_gamma, const void* gamma,
                                                   const void* beta, F&& f) {
  with_weight_dtype(dtype, [&](auto weight_tag) {
    using W = typename CudaType<decltype(weight_tag)::value>::type;
    if (zero_centered_gamma) {
      f(TypedWeights<W, true>(gamma, beta));
    } else {
      f(TypedWeights<W, false>(gamma, beta));
    }
  });
}

// Whether element i of the chunk at `col` lies in the row (for kVectorized the
// whole chunk does or does not: one predicate a chunk instead of eight, which
// ptxas would otherwise keep in registers across the row loop).
template <bool kVectorized>
__device__ __forceinline__ bool in_row(int col, int i, int hidden) {
  return kVectorized ? col < hidden : col + i < hidden;
}

// A chunk's eight FP8 bytes (element 0 in the lowest byte).
template <te_dtype kOut>
__device__ __forceinline__ uint2 fp8_chunk(const float (&y)[kChunk]) {
  uint32_t words[2];
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    words[w] = uint32_t(float2_to_fp8x2<kOut>(y[4 * w], y[4 * w + 1])) |
               (uint32_t(float2_to_fp8x2<kOut>(y[4 * w + 2], y[4 * w + 3])) << 16);
  }
  return make_uint2(words[0], words[1]);
}

// y[0..8) to columns [col, col + 8) of a row of kOut elements, those < hidden.
// kVectorized as for RowShare (for FP8 the row need only be 8-byte aligned).
template <bool kVectorized, te_dtype kOut>
__device__ __forceinline__ void store_chunk(void* row, int col, int hidden, const float (&y)[kChunk]) {
  if constexpr (kVectorized) {
    if (col >= hidden) return;
    if constexpr (kIsFp8<kOut>) {
      *reinterpret_cast<uint2*>(static_cast<uint8_t*>(row) + col) = fp8_chunk<kOut>(y);
    } else {
      using T = typename CudaType<kOut>::type;
      Vec8<T> vec;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) vec.v[i] = from_float<T>(y[i]);
      *reinterpret_cast<Vec8<T>*>(static_cast<T*>(row) + col) = vec;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (col + i < hidden) store_element<kOut>(row, col + i, y[i]);
    }
  }
}

// One element of a runtime dtype: float or FP8 (a uniform branch).
__device__ __forceinline__ void store_element_as(void* base, int64_t i, te_dtype dtype, float y) {
  switch (dtype) {
    case TE_DTYPE_FLOAT8_E4M3: store_element<TE_DTYPE_FLOAT8_E4M3>(base, i, y); break;
    case TE_DTYPE_FLOAT8_E5M2: store_element<TE_DTYPE_FLOAT8_E5M2>(base, i, y); break;
    default: store_param(base, i, dtype, y);
  }
}

// gamma staged once per block in shared memory as fp32, for the backward (whose
// registers go to dz, x and the column sums), in the order the row group reads
// it: float4 number (j * 2 + h) * threads + t holds columns column(j) + 4h ... + 3
// of thread t, so a warp's reads of one half-chunk are consecutive 16-byte words
// (no bank conflicts), and the groups of a block (same columns) share it. Columns
// past `hidden` hold 0, so padded columns contribute nothing.
// Size: weight_tile_floats(chunks, threads) floats, a multiple of 8.
__host__ __device__ constexpr int weight_tile_floats(int chunks, int threads_per_row) {
  return chunks * kChunk * threads_per_row;
}

// Every thread of the block calls this; __syncthreads() before the tile is read. The
// block is whole row groups: group g stages chunks g, g + groups, ... of its threads'
// columns, each thread its own lane's, every load issued before the first store. (Staged
// a float a thread at a time, each load waited on before the next and its place in the
// tile found by two divisions, gamma held every block for 16 L2 round trips at hidden
// 5120 or 16384 before its rows' work began; so staged, and with the first row's copies
// issued before it, the backward was 0.4-6% faster on an H100, layernorm 2048 x 16384
// 90.2 -> 86.0 us, 8192 x 5120 103.4 -> 99.5, and layernorm's 4-7% on an H200:
// benchmarks/RESULTS.md, fifty-eighth session.)
template <int kChunks>
__device__ __forceinline__ void stage_weights(const void* w, te_dtype dtype, int hidden, float shift,
                                              int threads_per_row, float* tile) {
  const RowGroup group(threads_per_row);
  const int groups = int(blockDim.x) / threads_per_row;
  // whole chunks (all in the row or all past it) as 16-byte words where they are aligned
  const bool vectorized = hidden % kChunk == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  float v[kChunks][kChunk];
  with_weight_dtype(dtype, [&](auto weight_tag) {
    using W = typename CudaType<decltype(weight_tag)::value>::type;
    const W* weights = static_cast<const W*>(w);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      // past the tile (k * groups >= kChunks) col >= hidden: nothing is loaded
      const int col = group.column(group.index + k * groups);
      if (vectorized) {
        Vec8<W> raw{};
        if (col < hidden) {
#pragma unroll
          for (int q = 0; q < int(sizeof(raw)) / 16; ++q) {
            reinterpret_cast<uint4*>(&raw)[q] = __ldg(reinterpret_cast<const uint4*>(weights + col) + q);
          }
        }
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[k][i] = col < hidden ? element_as_float(raw, i) + shift : 0.0f;
      } else {
#pragma unroll
        for (int i = 0; i < kChunk; ++i) v[k][i] = col + i < hidden ? to_float(weights[col + i]) + shift : 0.0f;
      }
    }
  });
  float4* quads = reinterpret_cast<float4*>(tile);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int j = group.index + k * groups;
    if (j >= kChunks) break;
    quads[2 * j * threads_per_row + group.thread] = make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
    quads[(2 * j + 1) * threads_per_row + group.thread] = make_float4(v[k][4], v[k][5], v[k][6], v[k][7]);
  }
}

// Where column `col` lies in a tile (the inverse of stage_weights' order).
__device__ __forceinline__ int tile_index(int col, int threads_per_row) {
  const int chunk = col / kChunk, t = chunk % threads_per_row, j = chunk / threads_per_row;
  const int h = (col % kChunk) / 4;
  return ((j * 2 + h) * threads_per_row + t) * 4 + col % 4;
}

// This thread's chunk j of a staged weight vector.
__device__ __forceinline__ void read_weights(const float* tile, const RowGroup& group, int j, float (&v)[kChunk]) {
  const float4* quads = reinterpret_cast<const float4*>(tile);
  const float4 lo = quads[(j * 2) * group.threads + group.thread];
  const float4 hi = quads[(j * 2 + 1) * group.threads + group.thread];
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
  v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

// The 8 values of a chunk added pairwise: a thread's share of a row sum then adds
// kChunks of these in turn, so its rounding error grows with log2(8) + kChunks
// terms instead of 8 * kChunks (same additions, more of them independent).
__device__ __forceinline__ float chunk_sum(const float (&v)[kChunk]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// The squares of a chunk's 8 values added as chunk_sum adds them: each pair's sum one FFMA
// on the first one's product (4 FMUL, 4 FFMA and 3 FADD), the form the compiler gave the
// squares then chunk_sum by contraction (RMSNorm's instruction counts are the same, ncu).
// Written out with the _rn intrinsics, so that every kernel that sums squares gets these
// bits (an implicit contraction is the compiler's choice, kernel by kernel).
__device__ __forceinline__ float chunk_sum_of_squares(const float (&v)[kChunk]) {
  float pair[kChunk / 2];
#pragma unroll
  for (int k = 0; k < kChunk / 2; ++k) pair[k] = __fmaf_rn(v[2 * k + 1], v[2 * k + 1], __fmul_rn(v[2 * k], v[2 * k]));
  return (pair[0] + pair[1]) + (pair[2] + pair[3]);
}

// LayerNorm's statistics of a row whose mean outweighs its spread (`far`: mu^2 > variance,
// both from the raw moments; norm_fwd_kernel.cuh, "Statistics"): the sums of the deviations
// d = x - mu and of d^2 (a second reduction of a pair), and mu + sum(d) / n, sum(d^2) / n -
// (sum(d) / n)^2 in place of mu and the variance. Called by every thread of the warp (its
// sums take full-warp shuffles, and rows of up to 512 elements share a warp), which runs
// the sums if any of its rows is far; a row that is not keeps its statistics.
// in_row(j): whether chunk j holds columns of the row (a chunk wholly past it is not
// added); deviations(j, mu, d): its deviations (0 past the row); mean(sum): the row's mean
// of a sum; otherwise(): what a warp without a far row does instead of the sums.
template <int kChunks, class PairReduction, class InRow, class Deviations, class Mean, class Otherwise>
__device__ __forceinline__ void far_row_statistics(bool far, float& mu, float& variance, PairReduction& reduction,
                                                   InRow in_row, Deviations deviations, Mean mean,
                                                   Otherwise otherwise) {
  if (__any_sync(0xffffffffu, far)) {
    float sum_d = 0.0f, sum_dd = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      if (in_row(j)) {
        float d[kChunk];
        deviations(j, mu, d);
        sum_d += chunk_sum(d);
        sum_dd += chunk_sum_of_squares(d);
      }
    }
    const float2 again = reduction.sum(make_float2(sum_d, sum_dd));
    if (far) {
      const float shift = mean(again.x);
      mu += shift;
      variance = __fmaf_rn(-shift, shift, mean(again.y));
    }
  } else {
    otherwise();
  }
}

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float2 add(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float shfl_xor(float v, int offset) { return __shfl_xor_sync(0xffffffffu, v, offset); }
__device__ __forceinline__ float2 shfl_xor(float2 v, int offset) {
  return make_float2(__shfl_xor_sync(0xffffffffu, v.x, offset), __shfl_xor_sync(0xffffffffu, v.y, offset));
}

template <int kBarrier>
__device__ __forceinline__ void bar_sync(int threads) {
  asm volatile("bar.sync %0, %1;" ::"n"(kBarrier), "r"(threads) : "memory");
}

// Waits for the `threads` threads (whole warps) of one row group only, so the other
// groups of the block go on loading and storing meanwhile. Given the barrier's number
// in a register, ptxas reserves all 16 of a block's barriers, and an H100 SM then holds
// 4 blocks at most (ncu's "Block Limit Barriers"), fewer than the registers allow the
// row forward's blocks of 160 and 192 threads (hidden 2049-3072 and 4097-6144: 43% of the
// SM's warps in flight instead of 30% at 5120). kImmediate takes it as an immediate (a
// switch, uniform in a warp), so 9 barriers, 7 blocks; where the limit does not bind the
// switch costs 1-3% (norm_fwd_row_form, norm_launch.h, says where the forward takes it).
template <bool kImmediate>
__device__ __forceinline__ void sync_row_group(int barrier, int threads) {
  if constexpr (kImmediate) {
    static_assert(kNormMaxRowGroupBarrier == 8, "one case a barrier");
    switch (barrier) {
      case 1: bar_sync<1>(threads); break;
      case 2: bar_sync<2>(threads); break;
      case 3: bar_sync<3>(threads); break;
      case 4: bar_sync<4>(threads); break;
      case 5: bar_sync<5>(threads); break;
      case 6: bar_sync<6>(threads); break;
      case 7: bar_sync<7>(threads); break;
      case 8: bar_sync<8>(threads); break;
      default: __trap();  // past kNormMaxRowGroupBarrier: a launch shape the C++ tests rule out
    }
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(barrier), "r"(threads) : "memory");
  }
}

// Sums over a row group, returned to all its threads: a shuffle butterfly inside the
// warp, then (groups of several warps) the warps' sums through shared memory, added
// in warp order. Every thread ends with the same bits (a + b == b + a in IEEE), so
// the statistics a group derives agree across its threads.
// Scratch: [2][kMaxWarps] alternating between calls, so one barrier a sum
// suffices: a warp that writes a buffer again has passed the barrier of the sum in
// between, which every reader of the buffer's previous sum has reached first.
// All threads of a warp must call sum() together (full-warp shuffles).
// kImmediateBarrier: sync_row_group's. kWholeWarps: the groups are whole warps (a
// block a row), so every shuffle step runs, without a test of the group's width.
// kWarpsByLane: the warps' sums added by lanes instead, lane w taking warp w's, in a
// second butterfly (same bits in every lane again, another order than warp order): a
// load and five shuffle steps, where the loop took a load and an add a warp in every
// thread (87 instructions a row at 24 warps, the backward's widest rows: SASS), but five
// dependent steps on the row's critical path. LayerNorm's pipelined backward takes it (its
// tests hold each kernel to the references' error bounds, not to each other's bits); the
// forward keeps warp order, whose bits its kernels share.
template <class V, int kMaxWarps = kNormMaxBlockWarps, bool kImmediateBarrier = false, bool kWholeWarps = false,
          bool kWarpsByLane = false>
class RowReduction {
 public:
  __device__ __forceinline__ RowReduction(V* scratch, const RowGroup& group) : scratch_(scratch), group_(group) {}

  __device__ __forceinline__ V sum(V v) {
    const int width = kWholeWarps || group_.threads >= 32 ? 32 : group_.threads;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      if (kWholeWarps || offset < width) v = add(v, shfl_xor(v, offset));  // lanes of a group stay in its aligned span
    }
    if (group_.threads <= 32) return v;
    const int warps = group_.threads / 32;
    const int first_warp = group_.index * warps;
    V* buf = scratch_ + parity_ * kMaxWarps;
    parity_ ^= 1;
    if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
    sync_row_group<kImmediateBarrier>(1 + group_.index, group_.threads);  // barrier 0 is __syncthreads'
    if constexpr (kWarpsByLane) {
      static_assert(kMaxWarps <= 32, "a lane a warp");
      const int lane = int(threadIdx.x % 32);
      V total = lane < warps ? buf[first_warp + lane] : V{};
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) total = add(total, shfl_xor(total, offset));
      return total;
    } else {
      V total = buf[first_warp];
      for (int w = 1; w < warps; ++w) total = add(total, buf[first_warp + w]);
      return total;
    }
  }

 private:
  V* scratch_;
  RowGroup group_;
  int parity_ = 0;
};

// The backward's row means over a row group, from this thread's shares of the row
// sums: (mean of dz * gamma, mean of dz * gamma * x hat). RMSNorm reduces only the
// second (it has no mean to subtract: the first is 0); LayerNorm both in one reduction
// of a pair.
// inv_hidden: 1 / hidden, made once a kernel (a multiply a mean, where a division took
// about ten instructions and a call for its slow path, twice a row).
template <bool kLayerNorm, class Reduction>
__device__ __forceinline__ float2 bwd_row_means(Reduction& reduction, float sum_dyg, float sum_dyg_xhat,
                                                float inv_hidden) {
  if constexpr (kLayerNorm) {
    const float2 row_sums = reduction.sum(make_float2(sum_dyg, sum_dyg_xhat));
    return make_float2(row_sums.x * inv_hidden, row_sums.y * inv_hidden);
  } else {
    return make_float2(0.0f, reduction.sum(sum_dyg_xhat) * inv_hidden);
  }
}

// The backward's x hat of one element: LayerNorm's (x - mu) * rsigma, RMSNorm's x * rsigma.
// Not the forward's single FFMA (x * rsigma - mu * rsigma): where mu * rsigma is large
// (rows at an offset of 1000) that form's rounding of mu * rsigma is many times torch's
// error in dgamma and dx (test_bwd_hard_rows), and a row of one element would get a
// nonzero x hat; x - mu is exact there.
template <bool kLayerNorm>
__device__ __forceinline__ float bwd_xhat(float x, float mu, float rsigma) {
  if constexpr (kLayerNorm) {
    return (x - mu) * rsigma;
  } else {
    return x * rsigma;
  }
}

// Max of non-negative per-thread values over the block, folded into *amax with one
// atomic (a block of any multiple of 32 threads, at most kMaxWarps warps).
// Every thread of the block must call it.
template <int kMaxWarps = kNormMaxBlockWarps>
__device__ __forceinline__ void block_amax_to_global(float v, float* amax) {
  __shared__ float warp_max_values[kMaxWarps];
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) warp_max_values[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < int(blockDim.x) / 32; ++w) m = fmaxf(m, warp_max_values[w]);
    atomic_max_nonnegative(amax, m);
  }
}

// The same for a row group of several whole warps (group.threads > 32), with one
// atomic a group: its warps' maxima meet in their own slots behind the group's own
// barrier (RowReduction's), so no group waits for the block's others. Every thread of
// the group must call it.
template <int kMaxWarps = kNormMaxBlockWarps, bool kImmediateBarrier = false>
__device__ __forceinline__ void group_amax_to_global(float v, float* amax, const RowGroup& group) {
  __shared__ float warp_max_values[kMaxWarps];
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) warp_max_values[threadIdx.x / 32] = v;
  sync_row_group<kImmediateBarrier>(1 + group.index, group.threads);
  if (group.thread == 0) {
    const int first_warp = int(threadIdx.x) / 32, warps = group.threads / 32;
    float m = 0.0f;
    for (int w = 0; w < warps; ++w) m = fmaxf(m, warp_max_values[first_warp + w]);
    atomic_max_nonnegative(amax, m);
  }
}

// A counter other blocks wait on (the trailing tiles' rows written, norm_trailing.h). The
// writer: every thread's stores, the block's barrier, then one thread's add with release
// semantics at GPU scope, which orders the block's stores before it (release is cumulative
// over what the barrier ordered before it, as cooperative groups' grid barrier has it).
// SASS: MEMBAR.ALL.GPU, then the RED; __threadfence() before a plain atomicAdd added a
// CCTL.IVALL, which empties the SM's L1 of the weights that every row reads again.
__device__ __forceinline__ void release_add(unsigned* counter, unsigned n) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(counter), "r"(n) : "memory");
}

// The reader: one thread polls the counter (relaxed loads at GPU scope, read at the L2)
// until it reaches `target`, and the block's barrier then holds the others until it has.
// They read what the counter guards with L2 loads (ld.global.cg) issued after that
// barrier, which the writer's release made complete at the L2 before the add. An acquire
// load (ld.acquire.gpu) would do the same and add a CCTL.IVALL each ticket, emptying the
// SM's L1 of the weights (2 x hidden x 4 bytes a row for fp32 gamma and beta, more than
// the row's own bytes from DRAM at 16-bit x).
__device__ __forceinline__ void wait_until_at_least(const unsigned* counter, unsigned target) {
  for (;;) {
    unsigned seen;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen >= target) return;
    __nanosleep(64);
  }
}

}  // namespace norm_kernels
}  // namespace opente
