// te_quantize_current_scaling on the GPU: the amax reduction, the scale and the cast,
// queued in order on the caller's stream by one host call (the three kernels of the
// separate ops plus a 4-byte memset; nothing waits for the device). A small tensor
// takes one block of quantize_small.cu for all three.
#include "common/cuda_utils.h"
#include "ops/quantize/quantize_params.h"

namespace opente {

void quantize_current_scaling_cuda(const QuantizeJob& job, int device, void* stream) {
  if (small_quantize_fits(job.cast)) {
    quantize_small_cuda(&job, 1, device, stream);
    return;
  }
  const CurrentScalingQuantizeParams p = current_scaling_steps(job);
  current_scale_from_input_cuda(p.amax, p.scaling, device, stream);
  quantize_cuda(p.cast, device, stream);
}

void current_scale_from_input_cuda(const AmaxParams& amax, const CurrentScalingParams& scaling, int device,
                                   void* stream) {
  DeviceGuard guard(device);
  // amax_cuda raises amax to max(amax, max|x|): start the reduction from 0.
  cuda_check(cudaMemsetAsync(amax.amax, 0, sizeof(float), as_stream(stream)), "cudaMemsetAsync(amax)");
  amax_cuda(amax, device, stream);
  current_scaling_cuda(scaling, device, stream);
}

}  // namespace opente
