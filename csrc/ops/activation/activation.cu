// Activations, forward and backward, on the GPU.
//
// Memory-bound element-wise passes. Without a column-wise copy both directions
// are flat walks over the output in vectors of 8 elements (16-byte loads of 16-bit
// inputs, two of fp32; gated kinds load a and b from the two halves of a row),
// in block-contiguous chunks with several loads per thread in flight, as the cast
// kernels do (common/cuda_flat_loop.cuh); odd hidden sizes, tails and unaligned
// pointers go element by element. An FP8 forward with the column-wise copy runs
// the tiled kernel of activation_tile.cuh, which writes both copies in one pass.
// Every kernel is compiled per activation (dispatch_base_activation), so the
// formulas of activation_params.h inline into straight-line code.
#include <algorithm>

#include "common/cuda_elements.cuh"
#include "common/cuda_reduce.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/activation/activation_device.cuh"
#include "ops/activation/activation_params.h"
#include "ops/activation/activation_tile.cuh"

namespace opente {
namespace {

constexpr int kThreads = 256;

// Vectors of 8 elements each thread loads per input before it computes any: about
// four 16-byte loads in flight per thread in all (a Vec8 of fp32 is two). With at
// most 64 registers (four blocks of 256 threads per SM) that keeps 64 KiB of loads
// in flight per SM, past what the memory's latency-bandwidth product asks (about
// 36 KiB on an H200). Unbounded, the compiler spent up to 156 registers
// interleaving the unrolled vectors, leaving one block per SM.
constexpr int kMinBlocksPerSm = 4;

template <class T>
__host__ __device__ constexpr int vectors_in_flight(int inputs) {
  const int loads = inputs * (sizeof(T) == 4 ? 2 : 1);
  return loads >= 4 ? 1 : 4 / loads;
}

// Offset of the first input element of output element `i` (an index into the
// [rows, H] output): the same index for plain kinds; for gated kinds the row's
// a half in the [rows, 2H] input (b is H further on). `by_h` divides by H.
template <bool kGated>
__device__ __forceinline__ int64_t input_offset(int64_t i, int64_t h, const FastDivmod& by_h) {
  if constexpr (kGated) {
    const int64_t r = by_h.div(i);
    return i + r * h;  // r * 2H + (i - r * H)
  } else {
    return i;
  }
}

// `vectorized` means: the input is 16-byte aligned, the output 16-byte (8-byte
// for FP8) aligned and, for gated kinds, H % 8 == 0. Then output elements
// [0, n - n % 8) go in vectors and the rest one by one; otherwise all one by one.
// The output dtype (FP8 or float) is read at run time.
template <class In, bool kGated, te_activation B>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    act_fwd_kernel(ActivationFwdParams p, bool vectorized, FastDivmod by_h) {
  constexpr int kUnroll = vectors_in_flight<In>(kGated ? 2 : 1);
  constexpr int64_t kChunk = int64_t(kThreads) * kUnroll;
  const In* in = static_cast<const In*>(p.input);  // [rows, H] or, gated, [rows, 2H]
  const int64_t h = p.hidden, n = p.rows * h;
  const te_dtype out_dtype = p.out_dtype;
  const bool fp8 = is_fp8_dtype(out_dtype);
  const float scale = fp8 ? *p.scale : 1.0f;
  float local_amax = 0.0f;

  const int64_t num_vec = vectorized ? n / 8 : 0;
  for (int64_t chunk = int64_t(blockIdx.x) * kChunk; chunk < num_vec; chunk += int64_t(gridDim.x) * kChunk) {
    Vec8<In> a[kUnroll], b[kGated ? kUnroll : 1];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = chunk + u * kThreads + threadIdx.x;
      if (v < num_vec) {
        const int64_t at = input_offset<kGated>(v * 8, h, by_h);
        a[u] = *reinterpret_cast<const Vec8<In>*>(in + at);
        if constexpr (kGated) b[u] = *reinterpret_cast<const Vec8<In>*>(in + at + h);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = chunk + u * kThreads + threadIdx.x;
      if (v < num_vec) {
        float y[8];
        to_float8(a[u], y);
#pragma unroll
        for (int k = 0; k < 8; ++k) y[k] = act_forward(B, y[k]);
        if constexpr (kGated) {
          float gate[8];
          to_float8(b[u], gate);
#pragma unroll
          for (int k = 0; k < 8; ++k) y[k] = act_mul(y[k], gate[k]);
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) local_amax = fmaxf(local_amax, fabsf(y[k]));  // used where p.amax is set
        emit8(te_dtype(opaque(int(out_dtype))), opaque(p.output), v * 8, y, scale);
      }
    }
  }
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = num_vec * 8 + int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const int64_t at = input_offset<kGated>(i, h, by_h);
    float y = act_forward(B, to_float(in[at]));
    if constexpr (kGated) y = act_mul(y, to_float(in[at + h]));
    local_amax = fmaxf(local_amax, fabsf(y));
    emit1(te_dtype(opaque(int(out_dtype))), p.output, i, y, scale);
  }
  // FP8: max|y| before scaling; a float output: of y as stored (a current-scaling cast's amax)
  if (p.amax) block_max_to_global<kThreads>(fp8 ? local_amax : rounded_as(out_dtype, local_amax), p.amax);
  if (fp8 && p.scale_inv && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
}

// The same walk over grad [rows, H]; dinput has the input's shape. Vectorized:
// all three pointers 16-byte aligned and, gated, H % 8 == 0.
template <class T, bool kGated, te_activation B>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    act_bwd_kernel(ActivationBwdParams p, bool vectorized, FastDivmod by_h) {
  constexpr int kUnroll = vectors_in_flight<T>(kGated ? 3 : 2);
  constexpr int64_t kChunk = int64_t(kThreads) * kUnroll;
  const T* grad = static_cast<const T*>(p.grad);  // [rows, H]
  const T* in = static_cast<const T*>(p.input);   // [rows, H] or, gated, [rows, 2H]
  T* din = static_cast<T*>(p.dinput);             // input's shape
  const int64_t h = p.hidden, n = p.rows * h;
  float local_amax = 0.0f;  // of dinput, used where p.amax is set

  const int64_t num_vec = vectorized ? n / 8 : 0;
  for (int64_t chunk = int64_t(blockIdx.x) * kChunk; chunk < num_vec; chunk += int64_t(gridDim.x) * kChunk) {
    Vec8<T> g[kUnroll], a[kUnroll], b[kGated ? kUnroll : 1];
    int64_t at[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = chunk + u * kThreads + threadIdx.x;
      if (v < num_vec) {
        at[u] = input_offset<kGated>(v * 8, h, by_h);
        g[u] = *reinterpret_cast<const Vec8<T>*>(grad + v * 8);
        a[u] = *reinterpret_cast<const Vec8<T>*>(in + at[u]);
        if constexpr (kGated) b[u] = *reinterpret_cast<const Vec8<T>*>(in + at[u] + h);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = chunk + u * kThreads + threadIdx.x;
      if (v < num_vec) {
        float gv[8], av[8], d[8];
        to_float8(g[u], gv);
        to_float8(a[u], av);
        if constexpr (kGated) {
          float bv[8], db[8];
          to_float8(b[u], bv);
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            d[k] = act_mul(act_mul(gv[k], bv[k]), act_derivative(B, av[k]));
            db[k] = act_mul(gv[k], act_forward(B, av[k]));
            local_amax = fmaxf(local_amax, fabsf(db[k]));
          }
          store8_as<T>(din, at[u] + h, db);
        } else {
#pragma unroll
          for (int k = 0; k < 8; ++k) d[k] = act_mul(gv[k], act_derivative(B, av[k]));
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) local_amax = fmaxf(local_amax, fabsf(d[k]));
        store8_as<T>(din, at[u], d);
      }
    }
  }
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = num_vec * 8 + int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const int64_t at = input_offset<kGated>(i, h, by_h);
    const float gv = to_float(grad[i]), av = to_float(in[at]);
    if constexpr (kGated) {
      const float bv = to_float(in[at + h]);
      const float d = act_mul(act_mul(gv, bv), act_derivative(B, av)), db = act_mul(gv, act_forward(B, av));
      local_amax = fmaxf(local_amax, fmaxf(fabsf(d), fabsf(db)));
      din[at] = from_float<T>(d);
      din[at + h] = from_float<T>(db);
    } else {
      const float d = act_mul(gv, act_derivative(B, av));
      local_amax = fmaxf(local_amax, fabsf(d));
      din[at] = from_float<T>(d);
    }
  }
  // of dinput as stored (rounded_as: the rounded max is the max of the rounded values)
  if (p.amax) block_max_to_global<kThreads>(rounded_as(p.dtype, local_amax), p.amax);
}

template <class Kernel, class Params>
void launch_flat(Kernel kernel, const Params& p, bool vectorized, bool reduces, int unroll, int device,
                 cudaStream_t stream, const char* name) {
  const int64_t n = p.rows * p.hidden;
  const int64_t work = vectorized ? n / 8 / unroll + 1 : n;
  // Only a kernel that raises an amax reduces at the end of each block.
  const int64_t grid = grid_stride_blocks(reinterpret_cast<const void*>(kernel), kThreads, work, device,
                                          reduces ? kReducingKernelWaves : kUncappedWaves);
  const FastDivmod by_h(std::max<int64_t>(p.hidden, 1), n);
  kernel<<<grid, kThreads, 0, stream>>>(p, vectorized, by_h);
  check_launch(name);
}

}  // namespace

void activation_fwd_cuda(const ActivationFwdParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  const cudaStream_t s = as_stream(stream);
  const bool gated = is_gated_activation(p.kind);
  const bool fp8 = is_fp8(p.out_dtype);
  if (p.output_t) {
    TileParams t{};
    t.in0 = p.input;
    t.out = p.output;
    t.out_t = p.output_t;
    t.scale = p.scale;
    t.scale_inv = p.scale_inv;
    t.amax = p.amax;
    t.rows = p.rows;
    t.hidden = p.hidden;
    t.base = base_activation(p.kind);
    t.in_dtype = p.in_dtype;
    t.out_dtype = p.out_dtype;
    if (gated) {
      launch_act_tile<TileMode::kFwdGated>(t, device, s);
    } else {
      launch_act_tile<TileMode::kFwd>(t, device, s);
    }
    return;
  }
  // An empty float output has nothing to write; an FP8 one still gets scale_inv.
  if (p.rows * p.hidden == 0 && !fp8) return;
  const bool vectorized = (!gated || p.hidden % 8 == 0) && is_aligned(p.input, 16) &&
                          is_aligned(p.output, fp8 ? 8 : 16);
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    using In = typename CudaType<decltype(in_tag)::value>::type;
    dispatch_base_activation(base_activation(p.kind), [&](auto act_tag) {
      constexpr te_activation kB = decltype(act_tag)::value;
      const auto kernel = gated ? act_fwd_kernel<In, true, kB> : act_fwd_kernel<In, false, kB>;
      launch_flat(kernel, p, vectorized, p.amax != nullptr, vectors_in_flight<In>(gated ? 2 : 1), device, s,
                  "act_fwd_kernel");
    });
  });
}

void activation_bwd_cuda(const ActivationBwdParams& p, int device, void* stream) {
  if (p.rows * p.hidden == 0) return;
  DeviceGuard guard(device);
  const bool gated = is_gated_activation(p.kind);
  const bool vectorized = (!gated || p.hidden % 8 == 0) && is_aligned(p.grad, 16) && is_aligned(p.input, 16) &&
                          is_aligned(p.dinput, 16);
  dispatch_float_dtype(p.dtype, [&](auto tag) {
    using T = typename CudaType<decltype(tag)::value>::type;
    dispatch_base_activation(base_activation(p.kind), [&](auto act_tag) {
      constexpr te_activation kB = decltype(act_tag)::value;
      const auto kernel = gated ? act_bwd_kernel<T, true, kB> : act_bwd_kernel<T, false, kB>;
      launch_flat(kernel, p, vectorized, p.amax != nullptr, vectors_in_flight<T>(gated ? 3 : 2), device,
                  as_stream(stream), "act_bwd_kernel");
    });
  });
}

}  // namespace opente
