// The softmax family on the GPU. Memory bound: a forward reads x (and the mask)
// and writes y once, a backward reads dy and y and writes dx once.
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
// load_shifted_mask); kV = 1 otherwise.
// The causal kinds load only the kept prefix of a row and store zeros past it.
//
// Registers (ptxas, sm_90a): at bf16 sk = 2048 the causal forward (a warp per
// row, 8 vectors a thread) takes 73, the whole-row forwards (two warps a row, 4
// vectors a thread, exponentials kept: see kExpOnce) 61 (64 with a mask), the
// backward 106, no spills: 16 to 32 warps an SM, each thread with 64 to 256 bytes
// of loads in flight.
//
// In-place backward (grad_input == grad_output): every thread reads all of its
// elements of dy before the row's reduction and writes dx only at those same
// positions after it, so no thread overwrites what another still has to read.
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
#include "ops/softmax/softmax_params.h"
#include "ops/softmax/softmax_row_plan.h"

namespace opente {
namespace {

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

template <class T, int kV>
__device__ __forceinline__ void store_packed(T* p, const Packed<T, kV>& v) {
  *reinterpret_cast<Packed<T, kV>*>(p) = v;
}

// kShifted rows (see launch_fwd): elements [lo, hi) of the vector at p, one at a time;
// the others are left zero (load) or untouched (store), as they belong to other rows or
// lie past the buffer's end.
template <class T, int kV>
__device__ __forceinline__ Packed<T, kV> load_partial(const T* p, int lo, int hi) {
  Packed<T, kV> v{};
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    if (i >= lo && i < hi) memcpy(reinterpret_cast<char*>(&v) + i * sizeof(T), p + i, sizeof(T));
  }
  return v;
}

template <class T, int kV>
__device__ __forceinline__ void store_partial(T* p, const Packed<T, kV>& v, int lo, int hi) {
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    if (i >= lo && i < hi) memcpy(p + i, reinterpret_cast<const char*>(&v) + i * sizeof(T), sizeof(T));
  }
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

template <int kV>
__device__ __forceinline__ Packed<uint8_t, kV> load_shifted_mask(const uint8_t* base, int o, int e, int end,
                                                                 int room) {
  static_assert(kV == 4 || kV == 8, "mask vectors of 4 or 8 bytes");
  constexpr int kWords = kV / 4;
  const Packed<uint8_t, kV> lo = load_mask_part<kV>(base, o, end, room, true);
  const Packed<uint8_t, kV> hi = load_mask_part<kV>(base, o + kV, end, room, e != 0);
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
    const uint32_t bits = kV == 1 ? uint32_t(x.w[0]) : (i % 2 ? uint32_t(x.w[i / 2]) >> 16 : x.w[i / 2] & 0xffffu);
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

// ---- forward: rows in registers ------------------------------------------------------------

// The row kernels work in base 2: t = x * scale * log2(e), y = exp2(t - max t) / sum.
// exp2 is one MUFU.EX2 (accurate expf is several instructions), and the exponent
// x * (scale log2 e) - max is one FMA. Its rounding, |t| 2^-24 relative, is of the
// order of the reference's own rounding of scale * x (tests/python/test_softmax.py).
constexpr float kMaskedLogit2 = kMaskedLogit * kLog2e;

// 2^t as fast_exp2 (common/cuda_fast_math.cuh), where exp2f's subnormal scaling made
// these kernels' SASS 16-704 instructions longer: y = 2^t / sum then differs from the
// reference by less than 2^-126, inside the tests' bound. The forward kinds were bound by
// instruction issue (H100: the masked forward 90% -> 96% of a same-bytes copy with it).

// The row stays in registers as loaded (16 registers for 32 bf16 elements), and
// each of the three passes (max, sum, store) converts it again: keeping the fp32
// logits instead doubled the registers and halved the warps, and with them the
// loads in flight that a memory-bound kernel lives on. launder() stops the
// compiler from keeping converted copies across the passes all the same.
//
// kExpOnce: the sum pass keeps its exponentials in fp32 registers and the store
// pass scales them, instead of computing each exponential twice. Two MUFU.EX2 an
// element made the multi-function unit, not memory, the limit of the whole-row
// kinds (bf16 [4, 16, 2048, 2048] on an H200: 73% of copy bandwidth with
// recomputation, 86% with kExpOnce at 4 vectors a thread; the masked kind 49% ->
// 66%). The causal kinds skip the exponentials of their masked tail, and there the
// extra registers cost more than the saved exponentials (72% -> 66%): they recompute.
//
// kSplit: launched in clusters of P blocks, the P blocks on one row at a time (see the
// top of the file), their vectors interleaved (block r's thread t holds vectors r G + t
// + k P G, so the blocks share a causal row's kept prefix evenly). Each block takes its
// max and its sum of exponentials relative to it, the blocks exchange the pairs once
// (as the long-row kernel's MaxSum), and each scales its exponentials to the row's.
//
// kShifted: sk is not a multiple of kV, so a row starts `shift` = (row sk) mod kV elements
// into a 16-byte vector. Its vectors are loaded from that aligned address on (elements of
// the neighbouring rows come along and are discarded) and its first and last vectors
// stored element by element (see launch_fwd).
template <class T, int kV, int kN, bool kExplicitMask, bool kExpOnce, bool kSplit, bool kShifted = false>
__global__ void __launch_bounds__(kMaxThreadsPerRow) softmax_fwd_rows_kernel(SoftmaxFwdParams p) {
  __shared__ float scratch[2][kMaxWarps];
  [[maybe_unused]] __shared__ float2 exchange[2];  // kSplit: alternate rows' (max, sum)
  // In-row indices are ints: a row holds at most kMaxRowParts * kMaxThreadsPerRow * kN * kV elements.
  const int sk = int(p.sk);
  const RowPart part = row_part<kSplit>();
  // element k of a thread: first + k * stride
  const int first = threadIdx.x * kV + part.index * blockDim.x * kV, stride = blockDim.x * kV * part.count;
  const int64_t row_groups = (p.rows + blockDim.y - 1) / blockDim.y;
  const bool tail_counts = softmax_tail_counts(p.kind);
  const float scale2 = p.scale * kLog2e;
  // the mask's rows (kShifted: where its buffer ends)
  [[maybe_unused]] const int64_t mask_rows =
      kExplicitMask ? (p.mask_broadcast ? 1 : p.rows / (p.heads * p.sq)) * p.sq : 0;
  int slot = 0;
  for (int64_t g = blockIdx.x / part.count; g < row_groups; g += gridDim.x / part.count, slot ^= 1) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const bool valid = row < p.rows;
    // Rows past the end load nothing but still join the block's reductions.
    const int kept = valid ? int(softmax_kept_prefix(p.kind, row, p.sq, sk)) : 0;
    // kShifted: in-row positions below count from the aligned address `shift` elements
    // before the row; 0 otherwise. (Row 0 starts aligned: nothing is read before x.)
    const int shift = kShifted && valid ? int((row * sk) % kV) : 0;
    [[maybe_unused]] const int room = kShifted && valid ? room_to_end(p.rows, row, sk, shift) : 0;
    const T* x = static_cast<const T*>(p.input) + (valid ? row * sk - shift : 0) + first;  // this thread's first vector
    const int64_t mask_row = kExplicitMask && valid ? softmax_mask_row(p, row) : 0;
    const uint8_t* mask = kExplicitMask && valid ? p.mask + mask_row * sk + first : nullptr;
    // kShifted with the mask: `mask` is the mask row's own aligned start instead, and x's
    // vectors fall at other offsets in it (see load_shifted_mask).
    [[maybe_unused]] int mask_shift = 0, mask_back = 0, mask_e = 0, mask_room = 0;
    if constexpr (kShifted && kExplicitMask) {
      mask_shift = int((mask_row * sk) % kV);
      mask_back = mask_shift < shift ? kV : 0;
      mask_e = mask_shift - shift + mask_back;
      mask_room = valid ? room_to_end(mask_rows, mask_row, sk, mask_shift) : 0;
      mask = valid ? p.mask + mask_row * sk - mask_shift : nullptr;
    }

    // All loads first, so that each thread has kN vectors in flight. (Zeros where
    // nothing is loaded: the passes below convert every vector and discard those.)
    Packed<T, kV> xv[kN] = {};
    Packed<uint8_t, kV> mv[kN] = {};
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (first + k * stride < kept + shift) {
        xv[k] = load_row_vector<T, kV, kShifted>(x + k * stride, first + k * stride, room,
                                                 sk + shift - (first + k * stride));
        if constexpr (kExplicitMask && kShifted) {
          mv[k] = load_shifted_mask<kV>(mask, first + k * stride - mask_back, mask_e, sk + mask_shift, mask_room);
        } else if constexpr (kExplicitMask) {
          mv[k] = load_packed<uint8_t, kV>(mask + k * stride);
        }
      }
    }
    // Selects, not branches, from here: per-element branches made the compiler
    // keep far more registers live. Positions past the kept prefix (and vectors
    // never loaded) stay out of the max and get exp 0.
    float m = -INFINITY;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int left = kept + shift - (first + k * stride);  // kept elements from vector k on
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        float t = element(xv[k], i) * scale2;
        if constexpr (kExplicitMask) t = mask_set(mv[k], i) ? kMaskedLogit2 : t;
        // skips NaN; the sum still turns NaN
        m = fmaxf(m, is_kept<kShifted>(i, left, shift - (first + k * stride)) ? t : -INFINITY);
      }
    }
    m = row_reduce(m, MaxOp{}, scratch[0]);
    if (tail_counts && kept < sk) m = fmaxf(m, kMaskedLogit2);
    // kSplit: the block's max. Where it is -inf (every logit of the block's share), its
    // exponentials take 0 in its place, so that they are 0, not -inf - -inf = NaN.
    [[maybe_unused]] const float block_max = m;
    if constexpr (kSplit) m = m == -INFINITY ? 0.0f : m;
    float masked_e = fast_exp2(kMaskedLogit2 - m);  // exp of a masked position's logit
    auto exp_at = [&](const Packed<T, kV>& xk, const Packed<uint8_t, kV>& mk, int i) {
      const float e = fast_exp2(fmaf(element(xk, i), scale2, -m));
      if constexpr (kExplicitMask) return mask_set(mk, i) ? masked_e : e;
      return e;
    };

    float sum = 0.0f;
    float kept_exp[kExpOnce ? kN : 1][kV];  // kExpOnce: the exponentials, for the store pass
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int left = kept + shift - (first + k * stride), lo = shift - (first + k * stride);
      if constexpr (kExpOnce) {  // whole rows: every loaded element is kept
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          kept_exp[k][i] = is_kept<kShifted>(i, left, lo) ? exp_at(xv[k], mv[k], i) : 0.0f;
          sum += kept_exp[k][i];
        }
      } else {
        launder(xv[k]);
        if constexpr (kExplicitMask) launder(mv[k]);
        if (left > 0) {  // no exponentials for vectors wholly past the kept prefix (causal)
#pragma unroll
          for (int i = 0; i < kV; ++i) sum += is_kept<kShifted>(i, left, lo) ? exp_at(xv[k], mv[k], i) : 0.0f;
        }
      }
    }
    sum = row_reduce(sum, SumOp{}, scratch[1]);
    [[maybe_unused]] float block_scale = 1.0f;  // kSplit: this block's exponentials to the row's
    if constexpr (kSplit) {
      const float2 pair = cluster_exchange(make_float2(block_max, sum), &exchange[slot], make_float2(-INFINITY, 0.0f));
      m = warp_butterfly(pair.x, MaxOp{});  // the row's max
      sum = warp_butterfly(m == -INFINITY ? pair.y : pair.y * fast_exp2(pair.x - m), SumOp{});
      block_scale = block_max == -INFINITY && m != -INFINITY ? 0.0f : fast_exp2(block_max - m);
      masked_e = fast_exp2(kMaskedLogit2 - m);
    }
    if (tail_counts && kept < sk) sum += float(sk - kept) * masked_e;
    // Transformer Engine's rule: a masked-softmax row whose max is the masked logit is zeros.
    const bool zero_row = kExplicitMask && m == kMaskedLogit2;
    const float inv_sum = 1.0f / sum;
    [[maybe_unused]] const float kept_exp_scale = block_scale * inv_sum;  // kSplit, kExpOnce

    if (valid) {
      T* y = static_cast<T*>(p.output) + row * sk - shift + first;  // this thread's first vector
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        if (first + k * stride < sk + shift) {
          if constexpr (!kExpOnce) {
            launder(xv[k]);
            if constexpr (kExplicitMask) launder(mv[k]);
          }
          const int left = zero_row ? 0 : kept + shift - (first + k * stride), lo = shift - (first + k * stride);
          float out[kV] = {};
          if constexpr (kExpOnce) {
#pragma unroll
            for (int i = 0; i < kV; ++i) {
              out[i] = zero_row ? 0.0f : kept_exp[k][i] * (kSplit ? kept_exp_scale : inv_sum);
            }
          } else if (left > 0) {
#pragma unroll
            for (int i = 0; i < kV; ++i) {
              out[i] = is_kept<kShifted>(i, left, lo) ? exp_at(xv[k], mv[k], i) * inv_sum : 0.0f;
            }
          }
          store_row_vector<T, kV, kShifted>(y + k * stride, pack<T, kV>(out), lo, sk + shift - (first + k * stride));
        }
      }
    }
  }
  if constexpr (kSplit) leave_cluster();
}

// ---- forward: long rows ----------------------------------------------------------------------

// The logit of element i of a loaded vector: scaled, or the masked value.
template <class T, int kV, bool kExplicitMask>
__device__ __forceinline__ float logit(const Packed<T, kV>& x, const Packed<uint8_t, kV>& mask, int i, float scale) {
  const float z = element(x, i) * scale;
  if constexpr (kExplicitMask) return mask_set(mask, i) ? kMaskedLogit : z;
  return z;
}

// A running max and the sum of exp(z - max) over the logits seen so far.
struct MaxSum {
  float m;
  float s;
};

// Adds a vector's logits z[0..kV) (-inf for those past the kept prefix): the running sum is
// rescaled once to the new max, then each logit adds e^(z - max) with no branch. One
// logit at a time, each behind a test of the running max (a divergent branch an element),
// the forward was 2-3% slower at sk 65536 and 8-10% at 131072 (H100, bench_softmax.py). A
// -inf max (every logit so far -inf) takes 0 in its place, so that no -inf - -inf makes a
// NaN; a +inf logit makes the row NaN through inf - inf, as the reference's exp(inf - inf)
// does; a NaN logit, through its own term (test_fwd_special_logits_cuda).
template <int kV>
__device__ __forceinline__ void add_logits(MaxSum& t, const float (&z)[kV]) {
  float m = t.m;
#pragma unroll
  for (int i = 0; i < kV; ++i) m = fmaxf(m, z[i]);
  // z - max before the multiply by log2 e, as the output pass takes it: folded into one
  // FFMA the max's own rounding in log2 units (an ulp of 2^13 near a max of -10000) would
  // scale the sum against y
  const float m_or_0 = m == -INFINITY ? 0.0f : m;
  float s = t.s * fast_exp(t.m - m_or_0);
#pragma unroll
  for (int i = 0; i < kV; ++i) s += fast_exp(z[i] - m_or_0);
  t = MaxSum{m, s};
}

// Commutes bit for bit, so butterfly partners agree.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};
  return {m, a.s * fast_exp(a.m - m) + b.s * fast_exp(b.m - m)};
}

// MaxSum over the block (one row per block); alternate `slot` between calls.
__device__ __forceinline__ MaxSum block_reduce(MaxSum t, float (*scratch_m)[kMaxWarps],
                                               float (*scratch_s)[kMaxWarps], int slot) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    t = combine(t, MaxSum{__shfl_xor_sync(0xffffffffu, t.m, offset), __shfl_xor_sync(0xffffffffu, t.s, offset)});
  }
  const int warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) {
    scratch_m[slot][threadIdx.x / 32] = t.m;
    scratch_s[slot][threadIdx.x / 32] = t.s;
  }
  __syncthreads();
  t = MaxSum{scratch_m[slot][0], scratch_s[slot][0]};
#pragma unroll 1
  for (int w = 1; w < warps; ++w) t = combine(t, MaxSum{scratch_m[slot][w], scratch_s[slot][w]});
  return t;
}

template <class T, int kV, bool kExplicitMask>
__global__ void __launch_bounds__(kLongRowThreads) softmax_fwd_long_rows_kernel(SoftmaxFwdParams p) {
  __shared__ float scratch_m[2][kMaxWarps], scratch_s[2][kMaxWarps];
  const int64_t sk = p.sk;
  const int64_t stride = int64_t(blockDim.x) * kV;
  const bool tail_counts = softmax_tail_counts(p.kind);
  int slot = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, slot ^= 1) {
    const int64_t kept = softmax_kept_prefix(p.kind, row, p.sq, sk);
    const T* x = static_cast<const T*>(p.input) + row * sk;                                  // [sk]
    const uint8_t* mask = kExplicitMask ? p.mask + softmax_mask_row(p, row) * sk : nullptr;  // [sk]
    Packed<uint8_t, kV> mv{};
    MaxSum t{-INFINITY, 0.0f};
    for (int64_t c = int64_t(threadIdx.x) * kV; c < kept; c += stride) {
      const Packed<T, kV> xv = load_packed<T, kV>(x + c);
      if constexpr (kExplicitMask) mv = load_packed<uint8_t, kV>(mask + c);
      float z[kV];
#pragma unroll
      for (int i = 0; i < kV; ++i) z[i] = c + i < kept ? logit<T, kV, kExplicitMask>(xv, mv, i, p.scale) : -INFINITY;
      add_logits(t, z);
    }
    t = block_reduce(t, scratch_m, scratch_s, slot);
    if (tail_counts && kept < sk) {
      const float m = fmaxf(t.m, kMaskedLogit);
      t.s = t.s * fast_exp(t.m - m) + float(sk - kept) * fast_exp(kMaskedLogit - m);
      t.m = m;
    }
    const bool zero_row = kExplicitMask && t.m == kMaskedLogit;
    const float inv_sum = 1.0f / t.s;

    T* y = static_cast<T*>(p.output) + row * sk;  // [sk]
    for (int64_t c = int64_t(threadIdx.x) * kV; c < sk; c += stride) {
      float out[kV] = {};
      if (c < kept && !zero_row) {
        const Packed<T, kV> xv = load_packed<T, kV>(x + c);
        if constexpr (kExplicitMask) mv = load_packed<uint8_t, kV>(mask + c);
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          const float e = fast_exp(logit<T, kV, kExplicitMask>(xv, mv, i, p.scale) - t.m);
          out[i] = c + i < kept ? e * inv_sum : 0.0f;
        }
      }
      store_packed<T, kV>(y + c, pack<T, kV>(out));
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------

// kSplit: a row over a cluster's blocks, their vectors interleaved as in the forward.
// kShifted: rows that start inside a 16-byte vector, as in the forward. In place, a
// row's first and last vectors are read whole by the neighbouring row's threads too,
// which discard the elements that are not theirs, while they may be written.
template <class T, int kV, int kN, bool kSplit, bool kShifted = false>
__global__ void __launch_bounds__(kMaxThreadsPerRow) softmax_bwd_rows_kernel(SoftmaxBwdParams p) {
  __shared__ float scratch[2][kMaxWarps];
  [[maybe_unused]] __shared__ float exchange[2];  // kSplit: alternate rows' dots
  const int sk = int(p.sk);
  const RowPart part = row_part<kSplit>();
  // element k of a thread: first + k * stride
  const int first = threadIdx.x * kV + part.index * blockDim.x * kV, stride = blockDim.x * kV * part.count;
  const int64_t row_groups = (p.rows + blockDim.y - 1) / blockDim.y;
  int slot = 0;
  for (int64_t g = blockIdx.x / part.count; g < row_groups; g += gridDim.x / part.count, slot ^= 1) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const bool valid = row < p.rows;
    const int kept = valid ? int(softmax_kept_prefix(p.kind, row, p.sq, sk)) : 0;
    const int shift = kShifted && valid ? int((row * sk) % kV) : 0;  // as in the forward
    [[maybe_unused]] const int room = kShifted && valid ? room_to_end(p.rows, row, sk, shift) : 0;
    const int64_t offset = (valid ? row * sk - shift : 0) + first;
    const T* dy = static_cast<const T*>(p.grad_output) + offset;
    const T* y = static_cast<const T*>(p.softmax_output) + offset;

    // Held packed (half the registers of fp32 for 16-bit types), converted twice.
    Packed<T, kV> dyv[kN] = {}, yv[kN] = {};
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (first + k * stride < kept + shift) {
        const int hi = sk + shift - (first + k * stride);
        dyv[k] = load_row_vector<T, kV, kShifted>(dy + k * stride, first + k * stride, room, hi);
        yv[k] = load_row_vector<T, kV, kShifted>(y + k * stride, first + k * stride, room, hi);
      }
    }
    float dot = 0.0f;  // selects, not branches (see the forward)
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int left = kept + shift - (first + k * stride);  // kept elements from vector k on
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        dot += is_kept<kShifted>(i, left, shift - (first + k * stride)) ? element(dyv[k], i) * element(yv[k], i) : 0.0f;
      }
    }
    dot = row_reduce(dot, SumOp{}, scratch[slot]);
    if constexpr (kSplit) dot = warp_butterfly(cluster_exchange(dot, &exchange[slot], 0.0f), SumOp{});

    if (valid) {
      T* dx = static_cast<T*>(p.grad_input) + offset;  // may be dy
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        if (first + k * stride < sk + shift) {
          launder(dyv[k]);
          launder(yv[k]);
          const int left = kept + shift - (first + k * stride), lo = shift - (first + k * stride);
          float out[kV];
#pragma unroll
          for (int i = 0; i < kV; ++i) {
            const float yi = element(yv[k], i);
            out[i] = is_kept<kShifted>(i, left, lo) ? p.scale * (element(dyv[k], i) * yi - yi * dot) : 0.0f;
          }
          store_row_vector<T, kV, kShifted>(dx + k * stride, pack<T, kV>(out), lo, sk + shift - (first + k * stride));
        }
      }
    }
  }
  if constexpr (kSplit) leave_cluster();
}

template <class T, int kV>
__global__ void __launch_bounds__(kLongRowThreads) softmax_bwd_long_rows_kernel(SoftmaxBwdParams p) {
  __shared__ float scratch[2][kMaxWarps];
  const int64_t sk = p.sk;
  const int64_t stride = int64_t(blockDim.x) * kV;
  int slot = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, slot ^= 1) {
    const int64_t kept = softmax_kept_prefix(p.kind, row, p.sq, sk);
    const T* dy = static_cast<const T*>(p.grad_output) + row * sk;    // [sk]
    const T* y = static_cast<const T*>(p.softmax_output) + row * sk;  // [sk]
    float dot = 0.0f;
    for (int64_t c = int64_t(threadIdx.x) * kV; c < kept; c += stride) {
      const Packed<T, kV> dyv = load_packed<T, kV>(dy + c), yv = load_packed<T, kV>(y + c);
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        if (c + i < kept) dot += element(dyv, i) * element(yv, i);
      }
    }
    dot = row_reduce(dot, SumOp{}, scratch[slot]);

    // The same thread reads dy at c (again) before it writes dx at c.
    T* dx = static_cast<T*>(p.grad_input) + row * sk;  // [sk]; may be dy
    for (int64_t c = int64_t(threadIdx.x) * kV; c < sk; c += stride) {
      float out[kV] = {};
      if (c < kept) {
        const Packed<T, kV> dyv = load_packed<T, kV>(dy + c), yv = load_packed<T, kV>(y + c);
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          const float yi = element(yv, i);
          out[i] = c + i < kept ? p.scale * (element(dyv, i) * yi - yi * dot) : 0.0f;
        }
      }
      store_packed<T, kV>(dx + c, pack<T, kV>(out));
    }
  }
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
// cannot run such a cluster (a partitioned context): the caller then takes the
// long-row kernel.
template <class Params>
bool launch_rows(void (*kernel)(Params), const RowPlan& plan, const Params& p, int device, cudaStream_t stream,
                 const char* name) {
  const dim3 block(unsigned(plan.threads_per_row), unsigned(block_rows(plan)));
  const int64_t row_groups = (p.rows + block.y - 1) / block.y;
  if (plan.parts == 1) {
    kernel<<<unsigned(std::min<int64_t>(row_groups, INT32_MAX)), block, 0, stream>>>(p);
    check_launch(name);
    return true;
  }
  const void* fn = reinterpret_cast<const void*>(kernel);
  const int resident = max_active_clusters(fn, plan.threads_per_row, 0, plan.parts, device);
  if (resident == 0) return false;
  const int64_t grid = std::min<int64_t>(row_groups, resident) * plan.parts;
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_launch_config(grid, plan.threads_per_row, 0, stream, plan.parts, attribute);
  cuda_check(cudaLaunchKernelEx(&config, kernel, p), name);
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

// The row kernel of kN vectors a thread for `plan`: its kSplit form for a split plan.
// Returns false where the split launch could not run (see launch_rows).
template <class T, int kV, int kN, bool kExplicitMask, bool kExpOnce, bool kShifted>
bool launch_fwd_rows(const RowPlan& plan, const SoftmaxFwdParams& p, int device, cudaStream_t stream) {
  constexpr const char* kName = "softmax_fwd_rows_kernel";
  if constexpr (kSplits<kV, kN, kExpOnce, kExplicitMask, kShifted>) {
    if (plan.parts > 1) {
      return launch_rows(softmax_fwd_rows_kernel<T, kV, kN, kExplicitMask, kExpOnce, true, kShifted>, plan, p, device,
                         stream, kName);
    }
  }
  return launch_rows(softmax_fwd_rows_kernel<T, kV, kN, kExplicitMask, kExpOnce, false, kShifted>, plan, p, device,
                     stream, kName);
}

// The kernels that compute each exponential twice (see kExpOnce) for rows the kExpOnce
// kernels do not take, and the long-row kernels past them.
template <class T, int kV, bool kExplicitMask, bool kShifted>
void launch_fwd_recomputing(const SoftmaxFwdParams& p, int64_t units, int device, bool split, cudaStream_t stream) {
  const RowPlan plan =
      kV == 1 ? plan_rows(p.sk, kScalarCounts, split && kSplits<1, 16, false, kExplicitMask>, kFwdWholeWarps)
              : plan_rows(units, kVectorCounts, split && kSplits<kV, 8, false, kExplicitMask>, kFwdWholeWarps);
  bool launched = false;
  if (!plan.long_rows) {
    switch (plan.per_thread) {
      case 2: launched = launch_fwd_rows<T, kV, 2, kExplicitMask, false, kShifted>(plan, p, device, stream); break;
      case 4:
        if constexpr (kV > 1) {
          launched = launch_fwd_rows<T, kV, 4, kExplicitMask, false, kShifted>(plan, p, device, stream);
        }
        break;
      case 8: launched = launch_fwd_rows<T, kV, 8, kExplicitMask, false, kShifted>(plan, p, device, stream); break;
      case 16:
        if constexpr (kV == 1) {
          launched = launch_fwd_rows<T, 1, 16, kExplicitMask, false, kShifted>(plan, p, device, stream);
        }
        break;
      default: fail(TE_ERROR_INTERNAL, concat("softmax: no row kernel for ", plan.per_thread, " vectors a thread"));
    }
  }
  if (!launched) {
    launch_long_rows(softmax_fwd_long_rows_kernel<T, kShifted ? 1 : kV, kExplicitMask>, p, stream,
                     "softmax_fwd_long_rows_kernel");
  }
}

// `split`: rows too long for a block may be split where the kernel that holds them has
// a kSplit form (kSplits). kShifted rows too long for the row kernels take the long-row
// kernel element by element. The explicit mask's rows in vectors that the kExpOnce
// kernels do not hold take the long-row kernel: its 8-vector kernel (95 registers) ran
// at 0.75-0.82x that (H200, bf16 [1, 16, 128, 24576 / 32768]; 1.02x at [1, 16, 64,
// 20000]), the kShifted one (102) at 0.91x ([1, 16, 64, 20001]), the split fp32 kShifted
// one (79) at 0.63x.
template <class T, int kV, bool kExplicitMask, bool kShifted = false>
void launch_fwd(const SoftmaxFwdParams& p, int device, bool split, cudaStream_t stream) {
  const bool whole_rows = p.kind == SoftmaxKind::kPlain || p.kind == SoftmaxKind::kMasked;
  const int64_t units = row_units<kV, kShifted>(p.sk);
  if constexpr (kV > 1) {
    if (whole_rows) {
      const RowPlan plan =
          plan_rows(units, kExpOnceCounts, split && kSplits<kV, 4, true, kExplicitMask, kShifted>, kFwdWholeWarps);
      if (!plan.long_rows) {  // else the 8-vector kernels below (the explicit mask: the long-row kernel)
        if (plan.per_thread == 2 && launch_fwd_rows<T, kV, 2, kExplicitMask, true, kShifted>(plan, p, device, stream)) {
          return;
        }
        if (plan.per_thread == 4 && launch_fwd_rows<T, kV, 4, kExplicitMask, true, kShifted>(plan, p, device, stream)) {
          return;
        }
        split = false;  // the clusters did not launch: nor will the 8-vector ones
      }
    }
  }
  if constexpr (kExplicitMask && kV > 1) {
    launch_long_rows(softmax_fwd_long_rows_kernel<T, kShifted ? 1 : kV, true>, p, stream,
                     "softmax_fwd_long_rows_kernel");
  } else {
    launch_fwd_recomputing<T, kV, kExplicitMask, kShifted>(p, units, device, split, stream);
  }
}

template <class T, int kV, int kN, bool kShifted>
bool launch_bwd_rows(const RowPlan& plan, const SoftmaxBwdParams& p, int device, cudaStream_t stream) {
  constexpr const char* kName = "softmax_bwd_rows_kernel";
  if constexpr (kSplits<kV, kN, false>) {
    if (plan.parts > 1) {
      return launch_rows(softmax_bwd_rows_kernel<T, kV, kN, true, kShifted>, plan, p, device, stream, kName);
    }
  }
  return launch_rows(softmax_bwd_rows_kernel<T, kV, kN, false, kShifted>, plan, p, device, stream, kName);
}

// The upper-triangular kind's backward does not split its rows: its rows keep half their
// length on average, and the split blocks' short lives cost more than the long-row
// kernel's second read (H100, bf16: [1, 40000, 40000] 4072 us split against 3110, at
// 65536 even), where the other kinds' split backward ran up to 1.32x as fast (sk 65536).
template <class T, int kV, bool kShifted = false>
void launch_bwd(const SoftmaxBwdParams& p, int device, bool split, cudaStream_t stream) {
  split = split && p.kind != SoftmaxKind::kUpperTriang;
  const RowPlan plan =
      kV == 1 ? plan_rows(p.sk, kScalarCounts, split, kBwdWholeWarps)
              : plan_rows(row_units<kV, kShifted>(p.sk), kVectorCounts, split, kBwdWholeWarps);
  bool launched = false;
  if (!plan.long_rows) {
    switch (plan.per_thread) {
      case 2: launched = launch_bwd_rows<T, kV, 2, kShifted>(plan, p, device, stream); break;
      case 4:
        if constexpr (kV > 1) launched = launch_bwd_rows<T, kV, 4, kShifted>(plan, p, device, stream);
        break;
      case 8: launched = launch_bwd_rows<T, kV, 8, kShifted>(plan, p, device, stream); break;
      case 16:
        if constexpr (kV == 1) launched = launch_bwd_rows<T, 1, 16, kShifted>(plan, p, device, stream);
        break;
      default: fail(TE_ERROR_INTERNAL, concat("softmax: no row kernel for ", plan.per_thread, " vectors a thread"));
    }
  }
  if (!launched) {
    launch_long_rows(softmax_bwd_long_rows_kernel<T, kShifted ? 1 : kV>, p, stream, "softmax_bwd_long_rows_kernel");
  }
}

// Whether rows too long for one block may be split over a cluster (sm_90 and later).
bool split_rows(int device) { return compute_capability_major(device) >= 9; }

}  // namespace

void softmax_fwd_cuda(const SoftmaxFwdParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  const bool masked = p.kind == SoftmaxKind::kMasked;
  const bool split = split_rows(device);
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = typename CudaType<decltype(tag)::value>::type;
    constexpr int kVec = 16 / sizeof(T);
    const bool aligned = is_aligned(p.input, 16) && is_aligned(p.output, 16);
    if (masked) {
      if (!aligned || !is_aligned(p.mask, kVec)) {
        launch_fwd<T, 1, true>(p, device, split, s);
      } else {  // rows of other lengths: x's and the mask's vectors shifted to each row's start
        p.sk % kVec == 0 ? launch_fwd<T, kVec, true>(p, device, split, s)
                         : launch_fwd<T, kVec, true, true>(p, device, split, s);
      }
    } else if (aligned) {  // rows of other lengths: vectors shifted to each row's start
      p.sk % kVec == 0 ? launch_fwd<T, kVec, false>(p, device, split, s)
                       : launch_fwd<T, kVec, false, true>(p, device, split, s);
    } else {
      launch_fwd<T, 1, false>(p, device, split, s);
    }
  });
}

void softmax_bwd_cuda(const SoftmaxBwdParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  const bool split = split_rows(device);
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = typename CudaType<decltype(tag)::value>::type;
    constexpr int kVec = 16 / sizeof(T);
    const bool aligned =
        is_aligned(p.grad_output, 16) && is_aligned(p.softmax_output, 16) && is_aligned(p.grad_input, 16);
    if (!aligned) {
      launch_bwd<T, 1>(p, device, split, s);
    } else {  // rows of other lengths: vectors shifted to each row's start
      p.sk % kVec == 0 ? launch_bwd<T, kVec>(p, device, split, s) : launch_bwd<T, kVec, true>(p, device, split, s);
    }
  });
}

}  // namespace opente
