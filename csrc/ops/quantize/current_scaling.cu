// te_quantize_current_scaling on the GPU: the amax reduction, the scale and the cast,
// queued in order on the caller's stream by one host call (the three kernels of the
// separate ops plus a 4-byte memset; nothing waits for the device).
#include "common/cuda_utils.h"
#include "ops/quantize/quantize_params.h"

namespace opente {

void quantize_current_scaling_cuda(const CurrentScalingQuantizeParams& p, int device, void* stream) {
  DeviceGuard guard(device);
  // amax_cuda raises amax to max(amax, max|x|): start the reduction from 0.
  cuda_check(cudaMemsetAsync(p.amax.amax, 0, sizeof(float), as_stream(stream)), "cudaMemsetAsync(amax)");
  amax_cuda(p.amax, device, stream);
  current_scaling_cuda(p.scaling, device, stream);
  quantize_cuda(p.cast, device, stream);
}

}  // namespace opente
