// The softmax backwards on the GPU: the row kernel (rows in registers, in a block or split
// over a cluster), the long-row kernel, and the launch that picks one (softmax_rows.cuh: the
// family's overview and shared pieces).
//
// In-place backward (grad_input == grad_output): every thread reads all of its
// elements of dy before the row's reduction and writes dx only at those same
// positions after it, so no thread overwrites what another still has to read.
#include "ops/softmax/softmax_rows.cuh"

namespace opente {
namespace {

using namespace softmax_kernels;

// ---- backward ---------------------------------------------------------------------------------

// kSplit: a row over a cluster's blocks, their vectors interleaved as in the forward.
// kShifted: rows that start inside a 16-byte vector, as in the forward. In place, a
// row's first and last vectors are read whole by the neighbouring row's threads too,
// which discard the elements that are not theirs, while they may be written.
template <class T, int kV, int kN, bool kSplit, bool kShifted = false>
__global__ void __launch_bounds__(kMaxThreadsPerRow) softmax_bwd_rows_kernel(SoftmaxBwdParams p, RowIndex index) {
  __shared__ float scratch[2][kMaxWarps];
  [[maybe_unused]] __shared__ float exchange[2];  // kSplit: alternate rows' dots
  const int sk = int(p.sk);
  const RowPart part = row_part<kSplit>();
  // element k of a thread: first + k * stride
  const int first = threadIdx.x * kV + part.index * blockDim.x * kV, stride = blockDim.x * kV * part.count;
  int slot = 0;
  for (int64_t g = blockIdx.x / part.count; g < index.row_groups; g += gridDim.x / part.count, slot ^= 1) {
    const int64_t row = g * blockDim.y + threadIdx.y;
    const bool valid = row < p.rows;
    const int kept = valid ? int(kept_prefix(p, index, row)) : 0;
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
      kV == 1 ? plan_rows(p.sk, kScalarCounts, split, kBwdWholeWarps, Fill::kLargestCount)
              : plan_rows(row_units<kV, kShifted>(p.sk), kVectorCounts, split, kBwdWholeWarps,
                          Fill::kSmallestInSameThreads);
  bool launched = false;
  if (!plan.long_rows) {
    switch (plan.per_thread) {
      case 2: launched = launch_bwd_rows<T, kV, 2, kShifted>(plan, p, device, stream); break;
      case 4:
        if constexpr (kV > 1) launched = launch_bwd_rows<T, kV, 4, kShifted>(plan, p, device, stream);
        break;
      case 6:
        if constexpr (kV > 1) launched = launch_bwd_rows<T, kV, 6, kShifted>(plan, p, device, stream);
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

}  // namespace

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
