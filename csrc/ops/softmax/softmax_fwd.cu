// The softmax forwards on the GPU: the row kernels (rows in registers, in a block or split
// over a cluster), the long-row kernel, and the launch that picks one (softmax_rows.cuh: the
// family's overview and shared pieces).
#include "ops/softmax/softmax_rows.cuh"

namespace opente {
namespace {

using namespace softmax_kernels;

// ---- forward: rows in registers ------------------------------------------------------------

// The row kernels work in base 2: t = x * scale * log2(e), y = exp2(t - max t) / sum.
// exp2 is one MUFU.EX2 (accurate expf is several instructions), and the exponent
// x * (scale log2 e) - max is one FMA (the kExpOnce kernels: the rounded t kept from the
// max pass, less the max). Its rounding, |t| 2^-24 relative (twice that kept), is of the
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
// kExpOnce: the max pass keeps the logits in fp32 registers, the sum pass turns them into
// their exponentials in place and the store pass scales them, instead of converting x
// and computing each exponential twice. Two MUFU.EX2 an
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
__global__ void __launch_bounds__(kMaxThreadsPerRow) softmax_fwd_rows_kernel(SoftmaxFwdParams p, RowIndex index) {
  __shared__ float scratch[2][kMaxWarps];
  [[maybe_unused]] __shared__ float2 exchange[2];  // kSplit: alternate rows' (max, sum)
  // In-row indices are ints: a row holds at most kMaxRowParts * kMaxThreadsPerRow * kN * kV elements.
  const int sk = int(p.sk);
  const RowPart part = row_part<kSplit>();
  // element k of a thread: first + k * stride
  const int first = threadIdx.x * kV + part.index * blockDim.x * kV, stride = blockDim.x * kV * part.count;
  const bool tail_counts = softmax_tail_counts(p.kind);
  const float scale2 = p.scale * kLog2e;
  int slot = 0;
  for (int64_t g = blockIdx.x / part.count; g < index.row_groups; g += gridDim.x / part.count, slot ^= 1) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const bool valid = row < p.rows;
    // Rows past the end load nothing but still join the block's reductions.
    const int kept = valid ? int(kept_prefix(p, index, row)) : 0;
    // kShifted: in-row positions below count from the aligned address `shift` elements
    // before the row; 0 otherwise. (Row 0 starts aligned: nothing is read before x.)
    const int shift = kShifted && valid ? int((row * sk) % kV) : 0;
    [[maybe_unused]] const int room = kShifted && valid ? room_to_end(p.rows, row, sk, shift) : 0;
    const T* x = static_cast<const T*>(p.input) + (valid ? row * sk - shift : 0) + first;  // this thread's first vector
    const int64_t mask_row = kExplicitMask && valid ? mask_row_of(p, index, row) : 0;
    const uint8_t* mask = kExplicitMask && valid ? p.mask + mask_row * sk + first : nullptr;
    // kShifted with the mask: `mask` is the mask row's own aligned start instead, and x's
    // vectors fall at other offsets in it (see load_mask_pair).
    [[maybe_unused]] int mask_shift = 0, mask_back = 0, mask_e = 0, mask_room = 0;
    if constexpr (kShifted && kExplicitMask) {
      mask_shift = int((mask_row * sk) % kV);
      mask_back = mask_shift < shift ? kV : 0;
      mask_e = mask_shift - shift + mask_back;
      mask_room = valid ? room_to_end(index.mask_rows, mask_row, sk, mask_shift) : 0;
      mask = valid ? p.mask + mask_row * sk - mask_shift : nullptr;
    }

    // All loads first, so that each thread has kN vectors in flight. (Zeros where
    // nothing is loaded: the passes below convert every vector and discard those.)
    Packed<T, kV> xv[kN] = {};
    Packed<uint8_t, kV> mv[kN] = {};
    [[maybe_unused]] Packed<uint8_t, kV> mask_hi[kExplicitMask && kShifted ? kN : 1] = {};
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if (first + k * stride < kept + shift) {
        xv[k] = load_row_vector<T, kV, kShifted>(x + k * stride, first + k * stride, room,
                                                 sk + shift - (first + k * stride));
        if constexpr (kExplicitMask && kShifted) {
          load_mask_pair<kV>(mask, first + k * stride - mask_back, mask_e, sk + mask_shift, mask_room, mv[k],
                             mask_hi[k]);
        } else if constexpr (kExplicitMask) {
          mv[k] = load_packed<uint8_t, kV>(mask + k * stride);
        }
      }
    }
    if constexpr (kExplicitMask && kShifted) {  // x's mask bytes, once every load is in flight
#pragma unroll
      for (int k = 0; k < kN; ++k) mv[k] = shifted_mask_bytes<kV>(mv[k], mask_hi[k], mask_e);
    }
    // Selects, not branches, from here: per-element branches made the compiler
    // keep far more registers live. Positions past the kept prefix (and vectors
    // never loaded) stay out of the max and get exp 0.
    float m = -INFINITY;
    // kExpOnce: the logits (-inf where not kept) as the max pass makes them, then in place
    // their exponentials, which the store pass scales. The sum pass then neither converts
    // x again nor tests the mask, and x and the mask are dead after the max pass.
    float kept_exp[kExpOnce ? kN : 1][kV];
    // The recomputing kernels of up to 6 vectors a thread (the causal kinds' rows of about
    // sk 2048-4608 in 16-bit elements) skip the max pass's conversions of vectors wholly
    // past the kept prefix, one branch a vector as the sum pass. Not the 8-vector kernels,
    // whose registers grew with the branch (bf16 shifted: 64 -> 93, ptxas), nor kExpOnce's,
    // whose rows are whole.
    constexpr bool kSkipTail = !kExpOnce && kN <= 6;
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const int left = kept + shift - (first + k * stride);  // kept elements from vector k on
      if (kSkipTail && left <= 0) continue;
#pragma unroll
      for (int i = 0; i < kV; ++i) {
        float t = element(xv[k], i) * scale2;
        if constexpr (kExplicitMask) t = mask_set(mv[k], i) ? kMaskedLogit2 : t;
        const float kept_t = is_kept<kShifted>(i, left, shift - (first + k * stride)) ? t : -INFINITY;
        if constexpr (kExpOnce) kept_exp[k][i] = kept_t;
        m = fmaxf(m, kept_t);  // skips NaN; the sum still turns NaN
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
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      if constexpr (kExpOnce) {
        // 2^(t - max): 0 for -inf (not kept); a masked logit's is masked_e, bit for bit
#pragma unroll
        for (int i = 0; i < kV; ++i) {
          kept_exp[k][i] = fast_exp2(kept_exp[k][i] - m);
          sum += kept_exp[k][i];
        }
      } else {
        const int left = kept + shift - (first + k * stride), lo = shift - (first + k * stride);
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

// ---- launch ---------------------------------------------------------------------------------

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
      kV == 1 ? plan_rows(p.sk, kScalarCounts, split && kSplits<1, 16, false, kExplicitMask>, kFwdWholeWarps,
                          Fill::kLargestCount)
              : plan_rows(units, kVectorCounts, split && kSplits<kV, 8, false, kExplicitMask>, kFwdWholeWarps,
                          Fill::kSmallestInSameThreads);
  bool launched = false;
  if (!plan.long_rows) {
    switch (plan.per_thread) {
      case 2: launched = launch_fwd_rows<T, kV, 2, kExplicitMask, false, kShifted>(plan, p, device, stream); break;
      case 4:
        if constexpr (kV > 1) {
          launched = launch_fwd_rows<T, kV, 4, kExplicitMask, false, kShifted>(plan, p, device, stream);
        }
        break;
      case 6:
        if constexpr (kV > 1) {
          launched = launch_fwd_rows<T, kV, 6, kExplicitMask, false, kShifted>(plan, p, device, stream);
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
      const RowPlan plan = plan_rows(units, kExpOnceCounts, split && kSplits<kV, 4, true, kExplicitMask, kShifted>,
                                     kFwdWholeWarps, Fill::kSmallestInSameThreads);
      if (!plan.long_rows) {  // else the 8-vector kernels below (the explicit mask: the long-row kernel)
        if (plan.per_thread == 2 && launch_fwd_rows<T, kV, 2, kExplicitMask, true, kShifted>(plan, p, device, stream)) {
          return;
        }
        if (plan.per_thread == 3 && launch_fwd_rows<T, kV, 3, kExplicitMask, true, kShifted>(plan, p, device, stream)) {
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

}  // namespace opente
