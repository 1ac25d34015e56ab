// The softmax family on the GPU: how its kernels hold a row, and the pieces the forward
// (softmax_fwd.cu) and the backward (softmax_bwd.cu) share. Memory bound: a forward reads
// x (and the mask) and writes y once, a backward reads dy and y and writes dx once.
//
// Rows that fit in registers take the row kernels: a group of G threads (a power
// of two up to 32 lanes of one warp, else G/32 whole warps) holds one row, each
// thread kN vectors of kV elements strided by G vectors, so a warp's loads are
// contiguous. The max and the sum are warp shuffles, plus one exchange through
// shared memory when a row spans several warps. Blocks hold 128 / G rows when
// G < 128. That covers sk up to 512 x 8 x 8 = 32768 for 16-bit types in 16-byte
// vectors (16384 for fp32), 512 x 16 = 8192 element by element. On sm_90 a longer
// row is split over a thread block cluster of P <= kMaxRowParts blocks of G <= 512
// threads (kSplit), each holding every P-th run of G vectors, and the blocks' maxima
// and sums meet once in distributed shared memory: the row is still read once, up to
// 262144 16-bit elements (not for the upper-triangular backward, nor the explicit
// mask's forward but in fp32 vectors: see kSplits, launch_bwd; the explicit mask's
// 16-bit rows past 16384 take the long-row kernel: see launch_fwd).
// A split launch starts only as many clusters as the GPU holds at once, which then
// stride over the rows (see launch_rows). Rows longer still, and GPUs
// before sm_90, take the long-row kernels: one block of 512 threads per row, an
// online max and sum in one pass over the row (rescaled once a vector: add_logits)
// and a second pass that reads the row again and writes; both take e^t as
// 2^(t log2 e) (fast_exp2).
//
// kV = 16 / sizeof(T) (16-byte loads and stores) where the buffers are 16-byte aligned
// (the mask kV-byte aligned): where sk is not a multiple of kV, the row kernels load each
// row's vectors from the aligned address before its start (kShifted; the explicit mask's
// bytes from two aligned vectors of its own row, which starts at another shift than x's:
// load_mask_pair); kV = 1 otherwise.
// The causal kinds load only the kept prefix of a row and store zeros past it.
//
// Registers (ptxas, sm_90a): at bf16 sk = 2048 the causal forward (a warp per
// row, 8 vectors a thread) takes 73, the whole-row forwards (two warps a row, 4
// vectors a thread, exponentials kept: see kExpOnce) 61 (64 with a mask), the
// backward 106, no spills: 16 to 32 warps an SM, each thread with 64 to 256 bytes
// of loads in flight.
#pragma once

#include <cooperative_groups.h>
#include <math.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "common/cuda_cluster_launch.h"
#include "common/cuda_elements.cuh"
#include "common/cuda_fast_math.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "common/fast_divmod.h"
#include "ops/softmax/softmax_params.h"
#include "ops/softmax/softmax_row_plan.h"

namespace opente {
// The kernels' shared pieces, in a namespace of their own: softmax_fwd.cu and
// softmax_bwd.cu each use them inside their anonymous namespace.
namespace softmax_kernels {

// The row layout's constants and choices: ops/softmax/softmax_row_plan.h.
using namespace softmax_rows;

// At most 512 / 32 warps meet in a block-wide reduction.
constexpr int kMaxWarps = kMaxThreadsPerRow / 32;

// kV elements of T as the words a load brings: 32-bit words for vectors of 4
// bytes or more, so two 16-bit elements share a register (held one per register,
// as element arrays are, the 16-bit rows took twice the registers and spilled).
template <class T, int kV>
struct alignas(sizeof(T) * kV) Packed {
  static constexpr int kBytes = sizeof(T) * kV;
  using Word = std::conditional_t<(kBytes >= 4), uint32_t, std::conditional_t<kBytes == 2, uint16_t, uint8_t>>;
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  Word w[kWords];
};

template <class T, int kV>
__device__ __forceinline__ Packed<T, kV> load_packed(const T* p) {
  return *reinterpret_cast<const Packed<T, kV>*>(p);
}

// 16-byte vectors as one vector store each (store_words: the compiler split them in
// the kShifted kernels).
template <class T, int kV>
__device__ __forceinline__ void store_packed(T* p, const Packed<T, kV>& v) {
  if constexpr (Packed<T, kV>::kBytes == 16) {  // the vector kernels' (kV = 16 / sizeof(T))
    store_words(p, v.w[0], v.w[1], v.w[2], v.w[3]);
  } else {  // one element (kV = 1)
    *reinterpret_cast<Packed<T, kV>*>(p) = v;
  }
}

// kShifted rows (see launch_fwd): elements [lo, hi) of the vector at p, one at a time,
// the others left zero, as they belong to other rows or lie past the buffer's end (the
// stores: store_partial).
template <class T, int kV>
__device__ __forceinline__ Packed<T, kV> load_partial(const T* p, int lo, int hi) {
  Packed<T, kV> v{};
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    if (i >= lo && i < hi) memcpy(reinterpret_cast<char*>(&v) + i * sizeof(T), p + i, sizeof(T));
  }
  return v;
}

// Element i's bits (a 16-bit element in the low half), taken from the words by shifts: a
// constant i keeps the vector in registers.
template <class T, int kV>
__device__ __forceinline__ uint32_t element_bits(const Packed<T, kV>& v, int i) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 2, "element_bits: 32- or 16-bit elements");
  if constexpr (sizeof(T) == 4 || kV == 1) {
    return uint32_t(v.w[i]);
  } else {
    return i % 2 ? v.w[i / 2] >> 16 : v.w[i / 2] & 0xffffu;
  }
}

// Each element a store of its own width. Copied out of the vector's bytes (memcpy), every
// element went out as two byte stores (SASS, the kShifted kernels).
template <class T, int kV>
__device__ __forceinline__ void store_elements(T* p, const Packed<T, kV>& v, int lo, int hi) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    if (i >= lo && i < hi) reinterpret_cast<Bits*>(p)[i] = Bits(element_bits(v, i));
  }
}

// Word i of a 16-byte vector, i not known at compile time: selects, so that the vector
// stays in registers.
template <class T, int kV>
__device__ __forceinline__ uint32_t word_at(const Packed<T, kV>& v, int i) {
  return i == 0 ? v.w[0] : i == 1 ? v.w[1] : i == 2 ? v.w[2] : v.w[3];
}

// kShifted rows' first and last vectors (see store_row_vector): the row's part of the 16
// bytes at p, [lo, hi) in elements, as at most three stores of 8, 4 and 2 bytes, each
// aligned to its width (p is a vector's aligned address); the other elements belong to
// the neighbouring rows. Element by element (and as byte stores) a vector's edge was up
// to 16 stores, each a write request of its own for the L2 where a warp's stores reached
// many rows (ncu, H100, bf16 [8, 16, 512, 150]: the causal forward in groups of 4 threads
// 3.4 M requests, 52 a row, against 0.8 M in groups of 16). With the whole vectors'
// stores above, the shifted short rows ran 7-11% faster (H100, bf16 sk 150 and 257).
// A row that starts and ends inside one vector (sk < kV) goes element by element.
template <class T, int kV>
__device__ __forceinline__ void store_partial(T* p, const Packed<T, kV>& v, int lo, int hi) {
  static_assert(Packed<T, kV>::kBytes == 16, "store_partial: 16-byte vectors");
  char* bytes = reinterpret_cast<char*>(p);
  if (lo > 0 && hi < kV) {
    store_elements<T, kV>(p, v, lo, hi);
  } else if (lo > 0) {  // bytes [at, 16): the first vector's tail, the row's start
    int at = lo * int(sizeof(T));
    if (sizeof(T) == 2 && (at & 2)) {
      *reinterpret_cast<uint16_t*>(bytes + at) = uint16_t(word_at(v, at / 4) >> 16);
      at += 2;
    }
    if (at & 4) {
      *reinterpret_cast<uint32_t*>(bytes + at) = word_at(v, at / 4);
      at += 4;
    }
    if (at == 8) store_words(bytes + 8, v.w[2], v.w[3]);
  } else {  // bytes [0, n): the last vector's head, the row's end
    const int n = hi * int(sizeof(T));
    if (n & 8) store_words(bytes, v.w[0], v.w[1]);
    if (n & 4) *reinterpret_cast<uint32_t*>(bytes + (n & 8)) = word_at(v, (n & 8) / 4);
    if (sizeof(T) == 2 && (n & 2)) {
      *reinterpret_cast<uint16_t*>(bytes + (n & 12)) = uint16_t(word_at(v, (n & 12) / 4));
    }
  }
}

// What the row kernels work out once a launch rather than once a row (launch_rows builds
// it): the row groups the grid strides over, and a row's place in its attention matrix and
// its mask row by multiplies (FastDivmod). As divisions these were 64-bit ones with a 32-bit
// path, 25-40 instructions each for every warp's every row: at bf16 [2, 16, 512, 2047] the
// masked forward spent about 130 of its 1038 instructions a warp on its four (H100, ncu's
// executed SASS), the scaled one 30 of 687; the causal kinds took two a row (the row
// groups, row % sq). The multiplies alone (FastDivmod::div_fast): the row kernels take
// rows below 2^31 (launch_rows), and the 64-bit division kept beside each multiply cost
// registers where it never ran (bf16 shifted backward of 8 vectors a thread 110 -> 101,
// fp16's of 4 73 -> 64, ptxas).
struct RowIndex {
  int64_t row_groups = 0;  // rows / blockDim.y, rounded up
  int64_t mask_rows = 0;   // the forward's kMasked: rows of its [mask batches * sq, sk] mask
  FastDivmod by_sq;        // row -> its attention matrix, b h + head
  FastDivmod by_heads;     // the forward's kMasked, a mask a batch: attention matrix -> batch

  // Whether the row kernels' multiplies divide every row: rows below 2^31 (by_sq's dividends;
  // by_heads', the attention matrices, are fewer; the backward leaves by_heads unbuilt).
  bool divides_by_multiplies() const { return by_sq.fast; }
};

// Rows of sq rows an attention matrix, in groups of block_rows.
inline RowIndex row_index(int64_t rows, int64_t sq, int64_t block_rows) {
  RowIndex index;
  index.row_groups = (rows + block_rows - 1) / block_rows;
  index.by_sq = FastDivmod(sq, rows - 1);
  return index;
}

inline RowIndex row_index(const SoftmaxBwdParams& p, int64_t block_rows) {
  return row_index(p.rows, p.sq, block_rows);
}

inline RowIndex row_index(const SoftmaxFwdParams& p, int64_t block_rows) {
  RowIndex index = row_index(p.rows, p.sq, block_rows);
  const int64_t matrices = p.rows / p.sq;
  index.by_heads = FastDivmod(p.heads, matrices - 1);
  if (p.kind == SoftmaxKind::kMasked) index.mask_rows = (p.mask_broadcast ? 1 : matrices / p.heads) * p.sq;
  return index;
}

// Row `row`'s kept prefix (softmax_kept_prefix).
template <class Params>
__device__ __forceinline__ int64_t kept_prefix(const Params& p, const RowIndex& index, int64_t row) {
  if (!softmax_is_causal(p.kind)) return p.sk;
  return softmax_causal_kept_prefix(row - index.by_sq.div_fast(row) * p.sq, p.sq, p.sk);
}

// The row of the mask that row `row` takes (softmax_mask_row).
__device__ __forceinline__ int64_t mask_row_of(const SoftmaxFwdParams& p, const RowIndex& index, int64_t row) {
  const int64_t matrix = index.by_sq.div_fast(row);
  const int64_t batch = p.mask_broadcast ? 0 : index.by_heads.div_fast(matrix);
  return batch * p.sq + (row - matrix * p.sq);
}

// kShifted: the elements from a row's aligned start (`shift` elements before the row) to
// the end of a buffer of `rows` rows, capped at INT_MAX. A vector that reaches past it
// (the last row's last one; with sk < kV also earlier rows' vectors) must not be loaded
// whole.
__device__ __forceinline__ int room_to_end(int64_t rows, int64_t row, int64_t sk, int shift) {
  const int64_t room = (rows - row) * sk + shift;
  return room < INT_MAX ? int(room) : INT_MAX;
}

// A shifted row's vector at offset o from the row's aligned start: whole, but where it
// reaches past the buffer's end (room_to_end), where it loads only the row's elements
// (those before `hi`).
template <class T, int kV, bool kShifted>
__device__ __forceinline__ Packed<T, kV> load_row_vector(const T* p, int o, int room, int hi) {
  if constexpr (kShifted) {
    if (o + kV > room) return load_partial<T, kV>(p, 0, hi);
  }
  return load_packed<T, kV>(p);
}

// kShifted rows of the explicit mask: the mask's rows start at other shifts than x's
// (mask row r at (r sk) mod kV bytes into an aligned vector, x row i at (i sk) mod kV
// elements), so the kV mask bytes of x's vector k straddle two aligned mask vectors.
// `base` is the aligned address at or before the mask row's start, `o` the offset from
// it of the first of the two vectors (-kV: before the row, never loaded), `e` the bytes
// into it where x's vector begins, `end` the offset of the row's end, `room` of the
// buffer's (room_to_end). A vector that holds none of the row's bytes is not loaded (its
// bytes are never kept), nor the second where e = 0; one that reaches past the buffer's
// end loads only the row's bytes.
template <int kV>
__device__ __forceinline__ Packed<uint8_t, kV> load_mask_part(const uint8_t* base, int o, int end, int room,
                                                              bool wanted) {
  if (!wanted || o < 0 || o >= end) return {};
  if (o + kV > room) return load_partial<uint8_t, kV>(base + o, 0, end - o);
  return load_packed<uint8_t, kV>(base + o);
}

// The two aligned mask vectors of one of x's vectors (see load_mask_part), loaded into
// `lo` and `hi`; shifted_mask_bytes takes x's bytes from them. Two steps, so that a row's
// every load is in flight before the first shift waits on its vectors: with the shift
// inside the loads' loop the warps waited on each vector's mask in turn (ncu on an H100,
// the masked forward at bf16 [2, 16, 512, 2047]: a quarter of its stall samples, on the
// three vectors' first selects, each after its own load).
template <int kV>
__device__ __forceinline__ void load_mask_pair(const uint8_t* base, int o, int e, int end, int room,
                                               Packed<uint8_t, kV>& lo, Packed<uint8_t, kV>& hi) {
  lo = load_mask_part<kV>(base, o, end, room, true);
  hi = load_mask_part<kV>(base, o + kV, end, room, e != 0);
}

template <int kV>
__device__ __forceinline__ Packed<uint8_t, kV> shifted_mask_bytes(const Packed<uint8_t, kV>& lo,
                                                                  const Packed<uint8_t, kV>& hi, int e) {
  static_assert(kV == 4 || kV == 8, "mask vectors of 4 or 8 bytes");
  constexpr int kWords = kV / 4;
  uint32_t w[2 * kWords + 1];  // the two vectors' words, and a zero past them
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    w[j] = lo.w[j];
    w[kWords + j] = hi.w[j];
  }
  w[2 * kWords] = 0;
  const bool skip_word = e >= 4;  // kV = 8: the bytes begin in the second word
  Packed<uint8_t, kV> out;
#pragma unroll
  for (int j = 0; j < kWords; ++j) {
    out.w[j] = __funnelshift_r(skip_word ? w[j + 1] : w[j], skip_word ? w[j + 2] : w[j + 1], 8 * (e % 4));
  }
  return out;
}

// Stores a row's vector: whole, or for a shifted row's first and last vectors only the
// row's elements [lo, hi).
template <class T, int kV, bool kShifted>
__device__ __forceinline__ void store_row_vector(T* p, const Packed<T, kV>& v, int lo, int hi) {
  if constexpr (kShifted) {
    if (lo > 0 || hi < kV) {
      store_partial<T, kV>(p, v, lo, hi);
      return;
    }
  }
  store_packed<T, kV>(p, v);
}

// Whether element i of a row's vector k is one of its kept elements, with left = kept +
// shift - (first + k stride) and lo = shift - (first + k stride) (kShifted: lo > 0 for the
// positions before the row's start, in its first vector).
template <bool kShifted>
__device__ __forceinline__ bool is_kept(int i, int left, [[maybe_unused]] int lo) {
  if constexpr (kShifted) return i >= lo && i < left;
  return i < left;
}

// Element i as fp32.
template <class T, int kV>
__device__ __forceinline__ float element(const Packed<T, kV>& x, int i) {
  if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(x.w[i]);
  } else {
    static_assert(sizeof(T) == 2, "element: float, __half or __nv_bfloat16");
    const uint32_t bits = element_bits(x, i);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      return __uint_as_float(bits << 16);  // bf16 is the high half of an fp32
    } else {
      return __half2float(__ushort_as_half(uint16_t(bits)));
    }
  }
}

// kV fp32 values rounded to T (nearest even), packed.
template <class T, int kV>
__device__ __forceinline__ Packed<T, kV> pack(const float (&v)[kV]) {
  Packed<T, kV> out;
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int i = 0; i < kV; ++i) out.w[i] = __float_as_uint(v[i]);
  } else if constexpr (kV == 1) {
    const T t = from_float<T>(v[0]);
    out.w[0] = *reinterpret_cast<const uint16_t*>(&t);
  } else {
#pragma unroll
    for (int j = 0; j < kV / 2; ++j) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);  // .x: the low half
        out.w[j] = *reinterpret_cast<const uint32_t*>(&pair);
      } else {
        const __half2 pair = __floats2half2_rn(v[2 * j], v[2 * j + 1]);
        out.w[j] = *reinterpret_cast<const uint32_t*>(&pair);
      }
    }
  }
  return out;
}

// Whether byte i of a mask vector is nonzero (masked).
template <int kV>
__device__ __forceinline__ bool mask_set(const Packed<uint8_t, kV>& m, int i) {
  if constexpr (kV >= 4) {
    return ((m.w[i / 4] >> (8 * (i % 4))) & 0xffu) != 0;
  } else {
    static_assert(kV == 1, "mask vectors of 1, 4 or 8 bytes");
    return m.w[0] != 0;
  }
}

// An empty asm that claims to change the words: the compiler can no longer reuse
// fp32 values it converted earlier and converts again, instead of keeping both the
// packed and the converted copies live.
template <class T, int kV>
__device__ __forceinline__ void launder(Packed<T, kV>& x) {
#pragma unroll
  for (int w = 0; w < Packed<T, kV>::kWords; ++w) {
    if constexpr (sizeof(x.w[0]) == 4) {
      asm volatile("" : "+r"(x.w[w]));
    } else if constexpr (sizeof(x.w[0]) == 2) {
      asm volatile("" : "+h"(x.w[w]));
    }  // a single byte (a scalar mask element) costs nothing to keep
  }
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// `v` combined over the blockDim.x threads of this thread's row (the threads that
// share threadIdx.y); every one of them gets the same bits (the butterfly pairs
// commute). With more than one warp per row the warps meet in `scratch` (one
// float per warp of the block): consecutive calls must use different scratch
// arrays, which lets each call get by with one barrier. Every thread of the
// block must call it.
template <class Op>
__device__ __forceinline__ float row_reduce(float v, Op op, float* scratch) {
  const int group = blockDim.x;
  const int width = group < 32 ? group : 32;
  // A loop over the width's steps (5 instructions a step). Unrolled, each step under a test
  // of the width, the predicated-off steps still issue: more instructions for groups of
  // fewer than 16 lanes, as many at 16, about 11 fewer a row (its two reductions) at whole
  // warps (tools/sass_loops.py, fifty-first session), and a spill in one fp16 kernel; so it
  // stays a loop.
  for (int offset = width / 2; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (group > 32) {
    const int tid = threadIdx.y * group + threadIdx.x;
    if (tid % 32 == 0) scratch[tid / 32] = v;
    __syncthreads();
    const int warps = group / 32;
    const float* partials = scratch + threadIdx.y * warps;
    v = partials[0];
#pragma unroll 1  // unrolled, this loop alone took the register count to 128
    for (int w = 1; w < warps; ++w) v = op(v, partials[w]);
  }
  return v;
}

// This block's part of its rows (kSplit: the block's rank in its cluster, and the
// cluster's size); the whole rows otherwise.
struct RowPart {
  int index;
  int count;
};

template <bool kSplit>
__device__ __forceinline__ RowPart row_part() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kSplit) {
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    return {int(cluster.block_rank()), int(cluster.num_blocks())};
  }
#endif
  return {0, 1};
}

// Every block's `value` (the same in every thread of the block) to the lanes of each
// warp: lane b gets block b's, lanes past the cluster's blocks get `none`; the caller
// combines them by a butterfly over the warp (every lane of every block then holds the
// same bits). Every thread of every block of the cluster calls it, a block holding one
// row. `exchange` is a __shared__ slot: consecutive calls use different ones, which
// lets each call get by with one cluster barrier (a block writes a slot again only past
// the next call's barrier, which every block reaches after it has read this one). A
// block calls leave_cluster() before it exits, so none frees its shared memory while
// another still reads it.
template <class V>
__device__ __forceinline__ V cluster_exchange(V value, V* exchange, V none) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) *exchange = value;
  cluster.sync();  // every block's value written and visible across the cluster
  const unsigned lane = threadIdx.x % 32;
  return lane < cluster.num_blocks() ? *cluster.map_shared_rank(exchange, lane) : none;
#else
  return value;
#endif
}

__device__ __forceinline__ void leave_cluster() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
}

template <class Op>
__device__ __forceinline__ float warp_butterfly(float v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// ---- launch ---------------------------------------------------------------------------------

// The row layout (RowPlan, plan_rows): ops/softmax/softmax_row_plan.h.
//
// Blocks of G x block_rows (128 / G, at least 1) threads, one row per threadIdx.y; the grid
// strides over the row groups beyond 2^31 - 1 blocks. A split plan launches
// `parts` blocks a row in clusters of `parts` (kernel: its kSplit form), no more
// clusters than the GPU holds at once, striding over the rows: a cluster a row
// group, launched as the last ones ended, ran 8-17% slower (H100, bf16, sk 40000-
// 131072: bench_softmax.py). It returns false, launching nothing, where the GPU
// cannot run such a cluster (a partitioned context), or where the rows reach 2^31 (the
// kernels divide a row index by multiplies: RowIndex): the caller then takes the long-row
// kernel.
template <class Params>
bool launch_rows(void (*kernel)(Params, RowIndex), const RowPlan& plan, const Params& p, int device,
                 cudaStream_t stream, const char* name) {
  const dim3 block(unsigned(plan.threads_per_row), unsigned(block_rows(plan)));
  const RowIndex index = row_index(p, block.y);
  if (!index.divides_by_multiplies()) return false;
  const int64_t row_groups = index.row_groups;
  if (plan.parts == 1) {
    kernel<<<unsigned(std::min<int64_t>(row_groups, INT32_MAX)), block, 0, stream>>>(p, index);
    check_launch(name);
    return true;
  }
  const void* fn = reinterpret_cast<const void*>(kernel);
  const int resident = max_active_clusters(fn, plan.threads_per_row, 0, plan.parts, device);
  if (resident == 0) return false;
  const int64_t grid = std::min<int64_t>(row_groups, resident) * plan.parts;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_launch_config(grid, plan.threads_per_row, 0, stream, plan.parts, attribute);
  cuda_check(cudaLaunchKernelEx(&config, kernel, p, index), name);
  return true;
}

template <class Kernel, class Params>
void launch_long_rows(Kernel kernel, const Params& p, cudaStream_t stream, const char* name) {
  kernel<<<unsigned(std::min<int64_t>(p.rows, INT32_MAX)), kLongRowThreads, 0, stream>>>(p);
  check_launch(name);
}

// Whether the row kernel of kN vectors a thread has a kSplit form: only the largest count
// of its list (kExpOnceCounts, kScalarCounts, kVectorCounts) does, and of the explicit
// mask's forward only the fp32 kExpOnce kernel (16 elements a thread, 64 registers):
// 1.05-1.13x the long-row kernel (H100, [1, 16, 64, 20000 / 40000], [1, 8, 64, 65536]).
// The 16-bit kExpOnce kernels (32 elements and their mask bytes a thread) took 80
// registers split, a block an SM (64 and spills when bounded to two), and ran at 0.79x
// ([1, 16, 64, 40000] bf16: 63.8 us against 50.3); the element-by-element one at
// 0.84-0.90x ([1, 16, 64, 20001 / 40001] bf16). Nor does the mask's kShifted form (see
// launch_fwd).
template <int kV, int kN, bool kExpOnce, bool kExplicitMask = false, bool kShifted = false>
constexpr bool kSplits = kN == (kExpOnce ? 4 : (kV == 1 ? 16 : 8)) &&
                         (!kExplicitMask || (kExpOnce && kV * kN <= 16 && !kShifted));

// Whether rows too long for one block may be split over a cluster (sm_90 and later).
inline bool split_rows(int device) { return compute_capability_major(device) >= 9; }

}  // namespace softmax_kernels
}  // namespace opente
