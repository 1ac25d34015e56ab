// The rope family on the GPU. Memory bound: a call reads x once and writes y
// once (the freqs rows are small and shared by all b rows of a position, so
// they come from L2).
//
// Work: a unit is kP consecutive pairs of one head; a thread takes one unit of
// one row and loops over the heads of its head group, so the sin and cos of the
// unit's 2 kP angles are computed once (sincosf, full precision: angles reach
// 1e5 radians in long contexts) and serve every head. A row's units go to L
// lanes (L the power of two >= the units, at most 32); a 128-thread block holds
// 128 / L rows. Heads are split into groups (grid.y) only when the rows alone
// give fewer than ~1024 threads an SM (decoding: one token of a few sequences),
// trading sin/cos recomputation for parallelism.
//
// Vectorized path: 16-byte loads and stores (kV = 16 / sizeof(T) elements) when
// x has unit feature stride, every used stride and d are multiples of kV, the
// pairs' halves start on kV boundaries (d2/2, or d2 when interleaved, a multiple
// of kV) and both buffers are 16-byte aligned. A non-interleaved unit is then kV
// pairs read as two vectors (features [a, a + kV) and [a + d2/2, ...)), an
// interleaved unit kV/2 pairs read as one vector. Otherwise element by element
// through the strides (odd d, d2 not on vector boundaries, views with odd offsets).
// Features [d2, d) are copied by every lane of the row, a vector (or an element)
// per (head, chunk) item.
//
// kHeadUnroll heads' loads are issued before their math, so a thread keeps up to
// 2 kHeadUnroll 16-byte loads in flight. Registers (ptxas, sm_90a, CUDA 13.0):
// vectorized non-interleaved 128 (bf16), 96 (fp16), 78 (fp32); vectorized
// interleaved 48 to 78; element-wise 36 / 48; no spills (the 32-byte stack is
// sincosf's reduction of huge angles). At 128, four blocks (512 threads) an SM
// keep 64 KiB of loads in flight, above the ~25 KiB an SM needs to saturate HBM3.
//
// THD: a token finds its sequence by binary search over cu_seqlens (the largest
// i with cu_seqlens[i] / cp_size <= token); only entries [0, b] are ever read,
// so malformed bounds give wrong positions, never a stray access.
#include <math.h>
#include <stdint.h>

#include <algorithm>

#include "common/cuda_elements.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/rope/rope_params.h"

namespace opente {
namespace {

constexpr int kBlockThreads = 128;
constexpr int kMaxLanesPerRow = 32;
constexpr int kHeadUnroll = 4;
// Threads an SM below which heads are split into groups (about half of what an
// SM holds at the kernel's register use).
constexpr int64_t kTargetThreadsPerSm = 1024;

struct RopeLaunch {
  int64_t rows;
  int lanes;                // L: threads of one row, a power of two <= 32
  int64_t heads_per_group;  // heads a thread loops over
};

// kN elements of T loaded or stored as one access.
template <class T, int kN>
struct alignas(sizeof(T) * kN) Run {
  T e[kN];
};

// kN elements at p, p + stride, ...: one vector access when kVec (stride 1,
// aligned), else one access each.
template <class T, int kN, bool kVec>
__device__ __forceinline__ void load_run(const T* p, int64_t stride, T (&e)[kN]) {
  if constexpr (kVec) {
    const Run<T, kN> r = *reinterpret_cast<const Run<T, kN>*>(p);
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = r.e[i];
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) e[i] = p[i * stride];
  }
}

// The output is contiguous.
template <class T, int kN, bool kVec>
__device__ __forceinline__ void store_run(T* p, const T (&e)[kN]) {
  if constexpr (kVec) {
    Run<T, kN> r;
#pragma unroll
    for (int i = 0; i < kN; ++i) r.e[i] = e[i];
    if constexpr (sizeof(r) == 16) {  // as one store (store_words): as a struct copy, four in some kernels
      uint4 w;
      memcpy(&w, &r, sizeof(w));
      store_words(p, w.x, w.y, w.z, w.w);
    } else if constexpr (sizeof(r) == 8) {
      uint2 w;
      memcpy(&w, &r, sizeof(w));
      store_words(p, w.x, w.y);
    } else {
      *reinterpret_cast<Run<T, kN>*>(p) = r;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) p[i] = e[i];
  }
}

// Where a row's input starts, its tokens' position and whether it is rotated (THD
// tokens outside every sequence are copied).
struct RowPlace {
  int64_t in_offset;
  int64_t position;
  bool rotate;
};

__device__ __forceinline__ int64_t scaled_bound(const RopeParams& p, int64_t i) { return p.cu_seqlens[i] / p.cp_size; }

__device__ RowPlace row_place(const RopeParams& p, int64_t row) {
  if (p.format != TE_ROPE_THD) {
    int64_t j, batch;
    rope_sb_of_row(p, row, &j, &batch);
    const int64_t start = p.start_positions ? p.start_positions[batch] : 0;
    return {j * p.stride_s + batch * p.stride_b, rope_position(j, p.s, start, p.cp_size, p.cp_rank), true};
  }
  RowPlace place{row * p.stride_s, 0, false};
  if (p.b == 0 || scaled_bound(p, 0) > row) return place;
  int64_t lo = 0, hi = p.b;  // bound(lo) <= row; hi == b or bound(hi) > row
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (scaled_bound(p, mid) <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int64_t begin = scaled_bound(p, lo), end = scaled_bound(p, lo + 1);
  if (row >= end) return place;
  const int64_t start = p.start_positions ? p.start_positions[lo] : 0;
  place.position = rope_position(row - begin, end - begin, start, p.cp_size, p.cp_rank);
  place.rotate = true;
  return place;
}

template <class T, bool kVec, bool kInterleaved>
__global__ void __launch_bounds__(kBlockThreads) rope_kernel(const RopeParams p, const RopeLaunch g) {
  constexpr int kV = kVec ? int(16 / sizeof(T)) : 1;
  constexpr int kP = kInterleaved ? (kV >= 2 ? kV / 2 : 1) : kV;  // pairs a unit
  // Elements a run loads: a non-interleaved unit is two runs of kP, an
  // interleaved one a single run of 2 kP (the pairs side by side).
  constexpr int kRun = kInterleaved ? 2 * kP : kP;

  const int lane = int(threadIdx.x) % g.lanes;
  const int64_t row = int64_t(blockIdx.x) * (kBlockThreads / g.lanes) + int64_t(threadIdx.x) / g.lanes;
  if (row >= g.rows) return;  // no block-wide synchronization below
  const int64_t head_begin = int64_t(blockIdx.y) * g.heads_per_group;
  const int64_t head_end = min(p.h, head_begin + g.heads_per_group);

  const RowPlace place = row_place(p, row);
  const T* in = static_cast<const T*>(p.input) + place.in_offset;
  T* out = static_cast<T*>(p.output) + row * p.h * p.d;
  const int64_t half = p.d2 / 2;
  const bool in_freqs = place.position >= 0 && place.position < p.s2;
  const float* angles = p.freqs + (in_freqs ? place.position * p.d2 : 0);

  const int64_t units = half / kP;
  for (int64_t u = lane; u < units; u += g.lanes) {
    const int64_t first = kInterleaved ? 2 * u * kP : u * kP;  // feature of the unit's first element
    // y_a = x_a ka1 + x_b ka2, y_b = x_b kb1 + x_a kb2 for the pair (a, b):
    // forward ka2 = -sin f_a, kb2 = sin f_b; backward ka2 = sin f_b, kb2 = -sin f_a.
    float ka1[kP], ka2[kP], kb1[kP], kb2[kP];
    if (place.rotate) {
#pragma unroll
      for (int m = 0; m < kP; ++m) {
        const int64_t a = kInterleaved ? first + 2 * m : first + m;
        const int64_t b = kInterleaved ? a + 1 : a + half;
        float sa, ca, sb, cb;
        sincosf(in_freqs ? angles[a] : __int_as_float(0x7fc00000), &sa, &ca);  // out of freqs: NaN
        sincosf(in_freqs ? angles[b] : __int_as_float(0x7fc00000), &sb, &cb);
        ka1[m] = ca;
        kb1[m] = cb;
        ka2[m] = p.backward ? sb : -sa;
        kb2[m] = p.backward ? -sa : sb;
      }
    }
    for (int64_t k0 = head_begin; k0 < head_end; k0 += kHeadUnroll) {
      T xa[kHeadUnroll][kRun], xb[kHeadUnroll][kRun];  // xb unused when interleaved
#pragma unroll
      for (int q = 0; q < kHeadUnroll; ++q) {
        if (k0 + q >= head_end) continue;
        const T* head = in + (k0 + q) * p.stride_h;
        load_run<T, kRun, kVec>(head + first * p.stride_d, p.stride_d, xa[q]);
        if constexpr (!kInterleaved) load_run<T, kRun, kVec>(head + (first + half) * p.stride_d, p.stride_d, xb[q]);
      }
#pragma unroll
      for (int q = 0; q < kHeadUnroll; ++q) {
        if (k0 + q >= head_end) continue;
        T* head = out + (k0 + q) * p.d;
        if (place.rotate) {
#pragma unroll
          for (int m = 0; m < kP; ++m) {
            // Positions of the pair's elements in the runs.
            T& ea = kInterleaved ? xa[q][2 * m] : xa[q][m];
            T& eb = kInterleaved ? xa[q][2 * m + 1] : xb[q][m];
            const float x_a = to_float(ea), x_b = to_float(eb);
            ea = from_float<T>(x_a * ka1[m] + x_b * ka2[m]);
            eb = from_float<T>(x_b * kb1[m] + x_a * kb2[m]);
          }
        }
        store_run<T, kRun, kVec>(head + first, xa[q]);
        if constexpr (!kInterleaved) store_run<T, kRun, kVec>(head + first + half, xb[q]);
      }
    }
  }

  // Features [d2, d) pass through.
  const int64_t chunks = (p.d - p.d2) / kV;
  const int64_t items = (head_end - head_begin) * chunks;
  for (int64_t i = lane; i < items; i += g.lanes) {
    const int64_t k = head_begin + i / chunks, f = p.d2 + (i % chunks) * kV;
    T e[kV];
    load_run<T, kV, kVec>(in + k * p.stride_h + f * p.stride_d, p.stride_d, e);
    store_run<T, kV, kVec>(out + k * p.d + f, e);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A stride that is used (its dim has more than one index) and is not a multiple of kV.
bool breaks_vectors(int64_t extent, int64_t stride, int kV) { return extent > 1 && stride % kV != 0; }

template <class T, bool kVec, bool kInterleaved>
void launch(const RopeParams& p, int device, cudaStream_t stream) {
  constexpr int kV = kVec ? int(16 / sizeof(T)) : 1;
  constexpr int kP = kInterleaved ? (kV >= 2 ? kV / 2 : 1) : kV;
  RopeLaunch g{};
  g.rows = rope_rows(p);
  const int64_t units = (p.d2 / 2) / kP;
  const int64_t per_row = units > 0 ? units : (p.d - p.d2) / kV;  // the copy chunks when nothing rotates
  g.lanes = 1;
  while (g.lanes < kMaxLanesPerRow && g.lanes < per_row) g.lanes *= 2;

  // Split the heads only when the rows leave the GPU mostly idle.
  const int64_t target = kTargetThreadsPerSm * multiprocessor_count(device);
  const int64_t threads = g.rows * g.lanes;
  int64_t groups = threads >= target ? 1 : std::min<int64_t>(p.h, ceil_div(target, threads));
  groups = std::clamp<int64_t>(groups, 1, 65535);  // grid.y
  g.heads_per_group = ceil_div(p.h, groups);
  if (g.heads_per_group > kHeadUnroll) g.heads_per_group = ceil_div(g.heads_per_group, kHeadUnroll) * kHeadUnroll;
  groups = ceil_div(p.h, g.heads_per_group);

  const int64_t row_blocks = ceil_div(g.rows, kBlockThreads / g.lanes);
  OPENTE_CHECK_ARG(row_blocks <= INT32_MAX, "input has ", g.rows, " rows (tokens), more than one launch covers");
  rope_kernel<T, kVec, kInterleaved><<<dim3(unsigned(row_blocks), unsigned(groups)), kBlockThreads, 0, stream>>>(p, g);
  check_launch("rope_kernel");
}

}  // namespace

void rope_cuda(const RopeParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = typename CudaType<decltype(tag)::value>::type;
    constexpr int kV = 16 / sizeof(T);
    const bool thd = p.format == TE_ROPE_THD;
    const bool vectorized = p.stride_d == 1 && p.d % kV == 0 && (p.interleaved ? p.d2 : p.d2 / 2) % kV == 0 &&
                            !breaks_vectors(p.s, p.stride_s, kV) && !(!thd && breaks_vectors(p.b, p.stride_b, kV)) &&
                            !breaks_vectors(p.h, p.stride_h, kV) && is_aligned(p.input, 16) && is_aligned(p.output, 16);
    if (p.interleaved) {
      vectorized ? launch<T, true, true>(p, device, s) : launch<T, false, true>(p, device, s);
    } else {
      vectorized ? launch<T, true, false>(p, device, s) : launch<T, false, false>(p, device, s);
    }
  });
}

}  // namespace opente
