// Float -> float conversions (fp32 / fp16 / bf16, round to nearest even): the
// conversion jobs of te_multi_quantize* too large for the one-block kernel
// (quantize_small.cu), a flat pass.
#include "common/cuda_elements.cuh"
#include "common/cuda_flat_loop.cuh"
#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/quantize/quantize_params.h"

namespace opente {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// kVectorized: input and output 16-byte aligned, eight elements a step.
template <class In, class Out, bool kVectorized>
__global__ void __launch_bounds__(kThreads)
    convert_kernel(const In* __restrict__ in, Out* __restrict__ out, int64_t n) {
  const int64_t num_vec = kVectorized ? n / 8 : 0;
  if constexpr (kVectorized) {
    auto* vout = reinterpret_cast<Vec8<Out>*>(out);
    for_each_vector<kThreads, kUnroll>(reinterpret_cast<const Vec8<In>*>(in), num_vec,
                                       [&](int64_t v, const Vec8<In>& x) {
                                         Vec8<Out> y;
#pragma unroll
                                         for (int k = 0; k < 8; ++k) y.v[k] = from_float<Out>(to_float(x.v[k]));
                                         vout[v] = y;
                                       });
  }
  for_each_element(num_vec * 8, n, [&](int64_t i) { out[i] = from_float<Out>(to_float(in[i])); });
}

template <class In, class Out>
void launch(const QuantizeParams& p, int64_t n, int device, cudaStream_t stream) {
  const auto* in = static_cast<const In*>(p.input);
  auto* out = static_cast<Out*>(p.output);
  const bool vectorized = is_aligned(in, 16) && is_aligned(out, 16);
  const auto kernel = vectorized ? convert_kernel<In, Out, true> : convert_kernel<In, Out, false>;
  const int64_t work = vectorized ? n / 8 / kUnroll + 1 : n;
  const int64_t grid = grid_stride_blocks((const void*)kernel, kThreads, work, device, kUncappedWaves);
  kernel<<<grid, kThreads, 0, stream>>>(in, out, n);
  check_launch("convert_kernel");
}

}  // namespace

void convert_cuda(const QuantizeParams& p, int device, void* stream) {
  const int64_t n = p.rows * p.cols;
  if (n == 0) return;
  DeviceGuard guard(device);
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    dispatch_float_dtype(p.out_dtype, [&](auto out_tag) {
      launch<typename CudaType<decltype(in_tag)::value>::type, typename CudaType<decltype(out_tag)::value>::type>(
          p, n, device, as_stream(stream));
    });
  });
}

}  // namespace opente
