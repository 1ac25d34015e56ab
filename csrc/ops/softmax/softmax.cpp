// C API of the softmax family: validate the descriptors, then run the CPU
// reference or the CUDA kernels on the input's device.
#include <cmath>

#include "opente/softmax.h"

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/softmax/softmax_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";

// The [rows, sq, sk] a tensor of `kind` is seen as, after the kind's shape rules.
struct SoftmaxShape {
  int64_t rows;
  int64_t sq;
  int64_t sk;
  int64_t heads;  // dim 1 of a 4D tensor; 1 otherwise
};

SoftmaxShape checked_softmax_shape(const te_tensor& t, const char* arg, SoftmaxKind kind) {
  switch (kind) {
    case SoftmaxKind::kPlain:
      OPENTE_CHECK_ARG(t.ndim >= 1, arg, " must have at least one dimension (softmax over the last), got a scalar");
      break;
    case SoftmaxKind::kUpperTriang:
      OPENTE_CHECK_ARG(t.ndim == 3, arg, " must be 3D [attn_batches, sq, sk], got shape ", shape_string(t));
      OPENTE_CHECK_ARG(t.shape[1] == t.shape[2], arg,
                       " must be square in its last two dims (sq == sk) for the upper-triangular mask, got shape ",
                       shape_string(t));
      break;
    case SoftmaxKind::kMasked:
    case SoftmaxKind::kAlignedCausal:
      OPENTE_CHECK_ARG(t.ndim == 4, arg, " must be 4D [b, h, sq, sk], got shape ", shape_string(t));
      break;
  }
  const MatrixShape m = matrix_shape(t);
  SoftmaxShape s{m.rows, 1, m.cols, 1};
  if (kind != SoftmaxKind::kPlain) s.sq = t.shape[t.ndim - 2];
  if (t.ndim == 4) s.heads = t.shape[1];
  return s;
}

void check_same_dtype(const te_tensor& t, const char* arg, const te_tensor& like, const char* like_name) {
  OPENTE_CHECK_ARG(t.dtype == like.dtype, arg, " dtype must equal ", like_name, " dtype ", dtype_name(like.dtype),
                   ", got ", dtype_name(t.dtype));
}

// `t` has `like`'s dtype, shape and device.
const te_tensor& checked_like(const te_tensor* desc, const char* arg, const te_tensor& like, const char* like_name) {
  const te_tensor& t = checked_tensor(desc, arg);
  check_same_dtype(t, arg, like, like_name);
  check_same_shape(like, like_name, t, arg);
  check_same_device(like.device, like_name, t.device, arg);
  return t;
}

size_t byte_size(const te_tensor& t) { return size_t(numel(t)) * dtype_size(te_dtype(t.dtype)); }

bool overlap(const te_tensor& a, const te_tensor& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  const size_t na = byte_size(a), nb = byte_size(b);
  return na > 0 && nb > 0 && a0 < b0 + nb && b0 < a0 + na;
}

void check_no_overlap(const te_tensor& a, const char* a_name, const te_tensor& b, const char* b_name) {
  OPENTE_CHECK_ARG(!overlap(a, b), a_name, " must not overlap ", b_name, " in memory");
}

void check_scale(float scale) {
  OPENTE_CHECK_ARG(std::isfinite(scale), "scale must be finite, got ", double(scale));
}

void softmax_fwd(SoftmaxKind kind, const te_tensor* input_desc, const te_tensor* mask_desc,
                 const te_tensor* output_desc, float scale, [[maybe_unused]] void* stream) {
  const te_tensor& in = checked_tensor(input_desc, "input");
  check_dtype(in, "input", is_high_precision_float(in.dtype), kFloatDtypes);
  const SoftmaxShape s = checked_softmax_shape(in, "input", kind);
  const bool empty = s.rows == 0 || s.sk == 0;
  if (!empty) check_pointer(in.data, "input", "data");

  const te_tensor* mask = nullptr;
  bool mask_broadcast = false;
  if (kind == SoftmaxKind::kMasked) {
    mask = &checked_tensor(mask_desc, "mask");
    check_dtype(*mask, "mask", mask->dtype == TE_DTYPE_UINT8, "uint8 (a bool mask is passed as its bytes)");
    check_same_device(in.device, "input", mask->device, "mask");
    const int64_t b = in.shape[0];
    OPENTE_CHECK_ARG(mask->ndim == 4 && (mask->shape[0] == b || mask->shape[0] == 1) && mask->shape[1] == 1 &&
                         mask->shape[2] == s.sq && mask->shape[3] == s.sk,
                     "mask shape ", shape_string(*mask), " must be [", b, " or 1, 1, ", s.sq, ", ", s.sk,
                     "] for input shape ", shape_string(in));
    mask_broadcast = mask->shape[0] == 1;
    if (!empty) check_pointer(mask->data, "mask", "data");
  }

  const te_tensor& out = checked_like(output_desc, "output", in, "input");
  if (!empty) {
    check_pointer(out.data, "output", "data");
    check_no_overlap(out, "output", in, "input");
    if (mask) check_no_overlap(out, "output", *mask, "mask");
  }
  check_scale(scale);
  if (empty) return;

  SoftmaxFwdParams p{};
  p.kind = kind;
  p.input = in.data;
  p.mask = mask ? static_cast<const uint8_t*>(mask->data) : nullptr;
  p.output = out.data;
  p.rows = s.rows;
  p.sq = s.sq;
  p.sk = s.sk;
  p.heads = s.heads;
  p.mask_broadcast = mask_broadcast;
  p.scale = scale;
  p.dtype = te_dtype(in.dtype);
  if (in.device.type == TE_DEVICE_CPU) {
    softmax_fwd_cpu(p);
  } else {
    OPENTE_CUDA_CALL("input", softmax_fwd_cuda(p, in.device.index, stream));
  }
}

void softmax_bwd(SoftmaxKind kind, const te_tensor* grad_output_desc, const te_tensor* softmax_output_desc,
                 const te_tensor* grad_input_desc, float scale, [[maybe_unused]] void* stream) {
  const te_tensor& y = checked_tensor(softmax_output_desc, "softmax_output");
  check_dtype(y, "softmax_output", is_high_precision_float(y.dtype), kFloatDtypes);
  const SoftmaxShape s = checked_softmax_shape(y, "softmax_output", kind);
  const te_tensor& dy = checked_like(grad_output_desc, "grad_output", y, "softmax_output");
  const te_tensor& dx = checked_like(grad_input_desc, "grad_input", y, "softmax_output");
  const bool empty = s.rows == 0 || s.sk == 0;
  if (!empty) {
    check_pointer(dy.data, "grad_output", "data");
    check_pointer(y.data, "softmax_output", "data");
    check_pointer(dx.data, "grad_input", "data");
    // In place is grad_input == grad_output exactly; a shifted view would let a
    // row overwrite elements another row has still to read.
    if (dx.data != dy.data) check_no_overlap(dx, "grad_input", dy, "grad_output (unless it is the same buffer)");
    check_no_overlap(dx, "grad_input", y, "softmax_output");
  }
  check_scale(scale);
  if (empty) return;

  SoftmaxBwdParams p{};
  p.kind = kind;
  p.grad_output = dy.data;
  p.softmax_output = y.data;
  p.grad_input = dx.data;
  p.rows = s.rows;
  p.sq = s.sq;
  p.sk = s.sk;
  p.scale = scale;
  p.dtype = te_dtype(y.dtype);
  if (y.device.type == TE_DEVICE_CPU) {
    softmax_bwd_cpu(p);
  } else {
    OPENTE_CUDA_CALL("softmax_output", softmax_bwd_cuda(p, y.device.index, stream));
  }
}

}  // namespace

extern "C" te_status te_scaled_softmax_fwd(const te_tensor* input, const te_tensor* output, float scale,
                                          void* stream) {
  return run_op("te_scaled_softmax_fwd",
                [&] { softmax_fwd(SoftmaxKind::kPlain, input, nullptr, output, scale, stream); });
}

extern "C" te_status te_scaled_softmax_bwd(const te_tensor* grad_output, const te_tensor* softmax_output,
                                          const te_tensor* grad_input, float scale, void* stream) {
  return run_op("te_scaled_softmax_bwd",
                [&] { softmax_bwd(SoftmaxKind::kPlain, grad_output, softmax_output, grad_input, scale, stream); });
}

extern "C" te_status te_scaled_masked_softmax_fwd(const te_tensor* input, const te_tensor* mask,
                                                 const te_tensor* output, float scale, void* stream) {
  return run_op("te_scaled_masked_softmax_fwd",
                [&] { softmax_fwd(SoftmaxKind::kMasked, input, mask, output, scale, stream); });
}

extern "C" te_status te_scaled_masked_softmax_bwd(const te_tensor* grad_output, const te_tensor* softmax_output,
                                                 const te_tensor* grad_input, float scale, void* stream) {
  return run_op("te_scaled_masked_softmax_bwd",
                [&] { softmax_bwd(SoftmaxKind::kMasked, grad_output, softmax_output, grad_input, scale, stream); });
}

extern "C" te_status te_scaled_upper_triang_masked_softmax_fwd(const te_tensor* input, const te_tensor* output,
                                                              float scale, void* stream) {
  return run_op("te_scaled_upper_triang_masked_softmax_fwd",
                [&] { softmax_fwd(SoftmaxKind::kUpperTriang, input, nullptr, output, scale, stream); });
}

extern "C" te_status te_scaled_upper_triang_masked_softmax_bwd(const te_tensor* grad_output,
                                                              const te_tensor* softmax_output,
                                                              const te_tensor* grad_input, float scale,
                                                              void* stream) {
  return run_op("te_scaled_upper_triang_masked_softmax_bwd", [&] {
    softmax_bwd(SoftmaxKind::kUpperTriang, grad_output, softmax_output, grad_input, scale, stream);
  });
}

extern "C" te_status te_scaled_aligned_causal_masked_softmax_fwd(const te_tensor* input, const te_tensor* output,
                                                                float scale, void* stream) {
  return run_op("te_scaled_aligned_causal_masked_softmax_fwd",
                [&] { softmax_fwd(SoftmaxKind::kAlignedCausal, input, nullptr, output, scale, stream); });
}

extern "C" te_status te_scaled_aligned_causal_masked_softmax_bwd(const te_tensor* grad_output,
                                                                const te_tensor* softmax_output,
                                                                const te_tensor* grad_input, float scale,
                                                                void* stream) {
  return run_op("te_scaled_aligned_causal_masked_softmax_bwd", [&] {
    softmax_bwd(SoftmaxKind::kAlignedCausal, grad_output, softmax_output, grad_input, scale, stream);
  });
}
