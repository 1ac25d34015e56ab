// FP8 -> fp32 / fp16 / bf16: out = fp8_to_float(q) * scale_inv, a flat pass.
#include "common/cuda_elements.cuh"
#include "common/cuda_flat_loop.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/quantize/quantize_params.h"

namespace opente {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// kVectorized: input 8-byte and output 16-byte aligned, eight elements a step.
template <te_dtype In, class Out, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t* __restrict__ in,  // [n]
                      Out* __restrict__ out,           // [n]
                      const float* __restrict__ scale_inv_ptr, int64_t n) {
  const float scale_inv = *scale_inv_ptr;
  const int64_t num_vec = kVectorized ? n / 8 : 0;
  if constexpr (kVectorized) {
    auto* vout = reinterpret_cast<Vec8<Out>*>(out);
    for_each_vector<kThreads, kUnroll>(reinterpret_cast<const uint2*>(in), num_vec, [&](int64_t v, const uint2& q) {
      Vec8<Out> y;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t word = k < 4 ? q.x : q.y;
        y.v[k] = from_float<Out>(fp8_to_float<In>(uint8_t(word >> (8 * (k % 4)))) * scale_inv);
      }
      vout[v] = y;
    });
  }
  for_each_element(num_vec * 8, n, [&](int64_t i) { out[i] = from_float<Out>(fp8_to_float<In>(in[i]) * scale_inv); });
}

template <te_dtype In, class Out>
void launch(const DequantizeParams& p, int device, cudaStream_t stream) {
  const auto* in = static_cast<const uint8_t*>(p.input);
  auto* out = static_cast<Out*>(p.output);
  const bool vectorized = is_aligned(in, 8) && is_aligned(out, 16);
  const auto kernel = vectorized ? dequantize_kernel<In, Out, true> : dequantize_kernel<In, Out, false>;
  const int64_t work = vectorized ? p.numel / 8 / kUnroll + 1 : p.numel;
  const int64_t grid = grid_stride_blocks((const void*)kernel, kThreads, work, device, kUncappedWaves);
  kernel<<<grid, kThreads, 0, stream>>>(in, out, p.scale_inv, p.numel);
  check_launch("dequantize_kernel");
}

}  // namespace

void dequantize_cuda(const DequantizeParams& p, int device, void* stream) {
  if (p.numel == 0) return;
  DeviceGuard guard(device);
  dispatch_fp8_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_float_dtype(p.out_dtype, [&](auto out_tag) {
      launch<decltype(in_tag)::value, typename CudaType<decltype(out_tag)::value>::type>(p, device,
                                                                                         as_stream(stream));
    });
  });
}

}  // namespace opente
