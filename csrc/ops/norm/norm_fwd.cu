// LayerNorm and RMSNorm forward on the GPU: which path a call takes (the tiled
// kernel of both FP8 copies, the pipelined kernel of an FP8 y's widest rows where memory
// outruns the SMs, the row kernel, the fallback for rows too long for registers), the
// transposed FP8 copy, and the row kernel's dtypes as template arguments of its launch
// (norm_fwd_rows_launch.cuh, compiled in norm_fwd_rows_*.cu).
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/dtype.h"
#include "ops/norm/norm_kernels_common.cuh"
#include "ops/norm/norm_launch.h"
#include "ops/transpose/transpose_params.h"

namespace opente {

using norm_kernels::kChunk;

namespace {

// One row-wise y (or none, or a column-wise copy alone) in one pass: the pipelined kernel
// where it takes the call and `pipelined_allowed`, else the row kernel, else the fallback.
void norm_fwd_in_rows(const NormFwdParams& p, int device, void* stream, bool pipelined_allowed) {
  // the row kernel writes one of the two (a row decides which, norm_fwd_kernel.cuh's store_y)
  if (p.output && p.output_t) fail(TE_ERROR_INTERNAL, "norm_fwd_in_rows: both FP8 copies, which take two passes");
  DeviceGuard guard(device);
  const bool vectorized = p.hidden % kChunk == 0 && is_aligned(p.input, 16) && is_aligned(p.gamma, 16) &&
                          (p.beta == nullptr || is_aligned(p.beta, 16)) &&
                          (p.output == nullptr || is_aligned(p.output, is_fp8(p.out_dtype) ? 8 : 16));
  if (pipelined_allowed && norm_fwd_pipelined_takes(p, vectorized, device)) {
    norm_fwd_pipelined_cuda(p, device, stream);
    return;
  }
  // the calls launch_norm_fwd_rows has the extra chunk counts' kernels for (its kExtraChunkRows)
  const bool extra_chunk_rows = vectorized && p.in_dtype != TE_DTYPE_FLOAT32 &&
                                (p.out_dtype == p.in_dtype || is_fp8(p.out_dtype));
  const NormRowShape shape = norm_fwd_row_shape(p.hidden, extra_chunk_rows);
  if (!shape.in_registers()) {
    norm_fwd_fallback_cuda(p, device, stream);
    return;
  }
  // the call's dtypes to template arguments; the launch by row shape is launch_norm_fwd_rows's
  auto launch = [&](auto in_tag, auto out_tag, auto vectorized_tag, auto float_amax_tag) {
    launch_norm_fwd_rows<decltype(in_tag)::value, decltype(out_tag)::value, decltype(vectorized_tag)::value,
                       decltype(float_amax_tag)::value>(p, shape, device, stream);
  };
  dispatch_float_dtype(p.in_dtype, [&](auto in_tag) {
    if (vectorized && p.amax && p.out_dtype == p.in_dtype) {
      // a float y's amax (FP8 ys always take theirs): the modules' case, y in x's dtype
      launch(in_tag, in_tag, std::true_type{}, std::true_type{});
    } else if (vectorized && (!p.amax || is_fp8(p.out_dtype))) {
      dispatch_any_float_dtype(p.out_dtype, [&](auto out_tag) {
        launch(in_tag, out_tag, std::true_type{}, std::false_type{});
      });
    } else {  // and a float y of another dtype with its amax
      launch(in_tag, in_tag, std::false_type{}, std::false_type{});
    }
  });
}

}  // namespace

void norm_fwd_cuda(const NormFwdParams& p, int device, void* workspace, size_t workspace_size, void* stream) {
  // both FP8 copies in one pass where the shape allows
  if (norm_fwd_tiled_takes(p, device, workspace, workspace_size)) {
    norm_fwd_tiled_cuda(p, device, workspace, stream);
    return;
  }
  if (p.output_t && p.output) {
    // Both FP8 copies elsewhere: the row-wise one from the kernel, then its bytes
    // transposed in tiles (transpose.cu). Written from the kernel, the transposed copy
    // was a byte store a row apart for every element, 12-15x the row-wise forward's time
    // (H100: 1177 us against 79 at 16384 x 4096; 231 against 20 at 16384 x 768). A
    // column-wise copy alone outside the tiled kernel's shapes still takes those stores:
    // it has no row-wise buffer to transpose from. The FP8 kernels allow a dependent
    // launch, so the transpose's blocks start as the kernel's last wave drains and wait
    // on the GPU for its bytes (1-1.5 us on an H100).
    NormFwdParams rowwise = p;
    rowwise.output_t = nullptr;
    // (the row kernel: with the pipelined one this path was slower, norm_launch.h)
    norm_fwd_in_rows(rowwise, device, stream, /*pipelined_allowed=*/false);
    transpose_cuda(TransposeParams{p.output, p.output_t, p.rows, p.hidden, 1}, device, stream);
    return;
  }
  norm_fwd_in_rows(p, device, stream, /*pipelined_allowed=*/true);
}

}  // namespace opente
