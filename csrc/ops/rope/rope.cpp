// C API of the rope family: validate the descriptors and the config, then run
// the CPU reference or the CUDA kernels on the input's device.
#include "opente/rope.h"

#include <stdint.h>

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/rope/rope_params.h"

using namespace opente;

namespace {

constexpr const char* kFloatDtypes = "float32, float16 or bfloat16";

// The names a direction gives its tensors in messages.
struct RopeArgNames {
  const char* input;
  const char* strides;
  const char* output;
};
constexpr RopeArgNames kFwdNames{"input", "input_strides", "output"};
constexpr RopeArgNames kBwdNames{"grad_output", "grad_output_strides", "grad_input"};

const char* format_name(int32_t format) {
  switch (format) {
    case TE_ROPE_SBHD:
      return "SBHD";
    case TE_ROPE_BSHD:
      return "BSHD";
    default:
      return "THD";
  }
}

void check_config(const te_rope_config* config) {
  OPENTE_CHECK_ARG(config != nullptr, "config must not be null");
  OPENTE_CHECK_ARG(config->format >= TE_ROPE_SBHD && config->format <= TE_ROPE_THD,
                   "config.format must be TE_ROPE_SBHD (0), TE_ROPE_BSHD (1) or TE_ROPE_THD (2), got ", config->format);
  OPENTE_CHECK_ARG(config->cp_size >= 1, "config.cp_size must be >= 1, got ", config->cp_size);
  OPENTE_CHECK_ARG(config->cp_rank >= 0 && config->cp_rank < config->cp_size, "config.cp_rank must be in [0, ",
                   config->cp_size, ") for cp_size ", config->cp_size, ", got ", config->cp_rank);
}

// The element strides of `t` (given, or the contiguous ones) and the offset of its
// last element (-1 when it has no elements).
struct Strides {
  int64_t of[TE_MAX_DIMS];
  int64_t last_offset;
};

Strides checked_strides(const te_tensor& t, const int64_t* given, const char* arg, const char* tensor) {
  Strides st{};
  int64_t contiguous = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    st.of[i] = given ? given[i] : contiguous;
    OPENTE_CHECK_ARG(st.of[i] >= 0, arg, "[", i, "] must be >= 0, got ", st.of[i]);
    contiguous *= t.shape[i];
  }
  st.last_offset = numel(t) == 0 ? -1 : 0;
  for (int i = 0; i < t.ndim && st.last_offset >= 0; ++i) {
    int64_t span;
    OPENTE_CHECK_ARG(!__builtin_mul_overflow(t.shape[i] - 1, st.of[i], &span) &&
                         !__builtin_add_overflow(st.last_offset, span, &st.last_offset),
                     arg, " with ", tensor, " shape ", shape_string(t), " reach past what int64 can address");
  }
  return st;
}

bool overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && a0 < b0 + uint64_t(b_bytes) && b0 < a0 + uint64_t(a_bytes);
}

// An optional int32 vector of `n` elements on `device`; null when not given.
const int32_t* checked_int32_vector(const te_tensor* desc, const char* arg, int64_t n, const te_device& device,
                                    const char* device_owner, const char* what) {
  const te_tensor& t = checked_tensor(desc, arg);
  check_dtype(t, arg, t.dtype == TE_DTYPE_INT32, "int32");
  OPENTE_CHECK_ARG(t.ndim == 1 && t.shape[0] == n, arg, " shape must be [", n, "] (", what, "), got ", shape_string(t));
  check_same_device(device, device_owner, t.device, arg);
  if (n > 0) check_pointer(t.data, arg, "data");
  return static_cast<const int32_t*>(t.data);
}

// On the CPU the THD sequence bounds can be read: they must describe sequences that
// lie in the t tokens, in order (opente/rope.h).
void check_host_cu_seqlens(const RopeParams& p, const char* input_name) {
  const int32_t* cu = p.cu_seqlens;
  OPENTE_CHECK_ARG(cu[0] >= 0, "cu_seqlens[0] must be >= 0, got ", cu[0]);
  for (int64_t i = 0; i < p.b; ++i) {
    OPENTE_CHECK_ARG(cu[i + 1] >= cu[i], "cu_seqlens must be non-decreasing, got cu_seqlens[", i, "] = ", cu[i],
                     " > cu_seqlens[", i + 1, "] = ", cu[i + 1]);
    const int64_t local = cu[i + 1] / p.cp_size - cu[i] / p.cp_size;
    OPENTE_CHECK_ARG(p.cp_size == 1 || local % 2 == 0, "cu_seqlens: with cp_size ", p.cp_size,
                     " every sequence's local length must be even (two chunks), sequence ", i, " has ", local);
  }
  OPENTE_CHECK_ARG(cu[p.b] / p.cp_size <= p.s, "cu_seqlens[", p.b, "] = ", cu[p.b],
                   p.cp_size > 1 ? concat(" (divided by cp_size ", p.cp_size, ")") : std::string(),
                   " must not exceed t = ", p.s, " (the tokens of ", input_name, ")");
}

void rope(const RopeArgNames& names, const te_tensor* input_desc, const int64_t* input_strides,
          const te_tensor* freqs_desc, const te_tensor* cu_seqlens_desc, const te_tensor* start_positions_desc,
          const te_tensor* output_desc, const te_rope_config* config, bool backward, [[maybe_unused]] void* stream) {
  check_config(config);
  const auto format = static_cast<te_rope_format>(config->format);
  const bool thd = format == TE_ROPE_THD;

  const te_tensor& in = checked_tensor(input_desc, names.input);
  check_dtype(in, names.input, is_high_precision_float(in.dtype), kFloatDtypes);
  const int want_ndim = thd ? 3 : 4;
  OPENTE_CHECK_ARG(in.ndim == want_ndim, names.input, " must be ", want_ndim, "D ",
                   format == TE_ROPE_SBHD   ? "[s, b, h, d]"
                   : format == TE_ROPE_BSHD ? "[b, s, h, d]"
                                            : "[t, h, d]",
                   " for format ", format_name(format), ", got shape ", shape_string(in));
  const Strides st = checked_strides(in, input_strides, names.strides, names.input);

  RopeParams p{};
  p.format = format;
  p.h = in.shape[want_ndim - 2];
  p.d = in.shape[want_ndim - 1];
  p.stride_h = st.of[want_ndim - 2];
  p.stride_d = st.of[want_ndim - 1];
  if (format == TE_ROPE_SBHD) {
    p.s = in.shape[0], p.b = in.shape[1], p.stride_s = st.of[0], p.stride_b = st.of[1];
  } else if (format == TE_ROPE_BSHD) {
    p.b = in.shape[0], p.s = in.shape[1], p.stride_b = st.of[0], p.stride_s = st.of[1];
  } else {
    p.s = in.shape[0], p.stride_s = st.of[0];
  }

  const te_tensor& freqs = checked_tensor(freqs_desc, "freqs");
  check_dtype(freqs, "freqs", freqs.dtype == TE_DTYPE_FLOAT32, "float32");
  OPENTE_CHECK_ARG(freqs.ndim == 4 && freqs.shape[1] == 1 && freqs.shape[2] == 1,
                   "freqs must be 4D [s2, 1, 1, d2], got shape ", shape_string(freqs));
  check_same_device(in.device, names.input, freqs.device, "freqs");
  p.s2 = freqs.shape[0];
  p.d2 = freqs.shape[3];
  OPENTE_CHECK_ARG(p.d2 % 2 == 0, "freqs last dim d2 must be even (features rotate in pairs), got ", p.d2);
  OPENTE_CHECK_ARG(p.d2 <= p.d, "freqs last dim d2 = ", p.d2, " must not exceed the head dim d = ", p.d, " of ",
                   names.input, " shape ", shape_string(in));

  if (thd) {
    OPENTE_CHECK_ARG(cu_seqlens_desc != nullptr, "cu_seqlens must be given for format THD");
    const te_tensor& cu = checked_tensor(cu_seqlens_desc, "cu_seqlens");
    OPENTE_CHECK_ARG(cu.ndim == 1 && cu.shape[0] >= 1, "cu_seqlens must be 1D [b + 1], got shape ", shape_string(cu));
    p.b = cu.shape[0] - 1;
    p.cu_seqlens =
        checked_int32_vector(cu_seqlens_desc, "cu_seqlens", p.b + 1, in.device, names.input, "b + 1 sequence bounds");
  } else {
    OPENTE_CHECK_ARG(cu_seqlens_desc == nullptr, "cu_seqlens must be null for format ", format_name(format),
                     " (it describes THD's packed sequences)");
  }
  if (start_positions_desc != nullptr) {
    OPENTE_CHECK_ARG(config->cp_size == 1, "start_positions is not supported with context parallelism (cp_size ",
                     config->cp_size, ")");
    p.start_positions = checked_int32_vector(start_positions_desc, "start_positions", p.b, in.device, names.input,
                                             "one offset per sequence");
  }

  const te_tensor& out = checked_tensor(output_desc, names.output);
  check_same_shape(in, names.input, out, names.output);
  OPENTE_CHECK_ARG(out.dtype == in.dtype, names.output, " dtype must equal ", names.input, " dtype ",
                   dtype_name(in.dtype), ", got ", dtype_name(out.dtype));
  check_same_device(in.device, names.input, out.device, names.output);

  // SBHD / BSHD positions are known from the shape unless offsets are given.
  if (!thd && config->cp_size > 1) {
    OPENTE_CHECK_ARG(p.s % 2 == 0, names.input, " sequence length s must be even with context parallelism (cp_size ",
                     config->cp_size, "), got ", p.s);
  }
  if (!thd && p.start_positions == nullptr && p.s > 0 && p.d2 > 0) {
    const int64_t last = rope_position(p.s - 1, p.s, 0, config->cp_size, config->cp_rank);
    const int64_t last_first_half = rope_position(p.s / 2 - 1, p.s, 0, config->cp_size, config->cp_rank);
    const int64_t needed = (last > last_first_half ? last : last_first_half) + 1;
    OPENTE_CHECK_ARG(needed <= p.s2, "freqs has ", p.s2, " positions, but ", names.input, " sequence length ", p.s,
                     config->cp_size > 1 ? concat(" on rank ", config->cp_rank, " of ", config->cp_size) : "",
                     " needs ", needed);
  }

  const int64_t elements = numel(in);
  if (elements == 0) return;
  check_pointer(in.data, names.input, "data");
  check_pointer(out.data, names.output, "data");
  if (p.d2 > 0) check_pointer(freqs.data, "freqs", "data");
  const int64_t esize = int64_t(dtype_size(te_dtype(in.dtype)));
  OPENTE_CHECK_ARG(!overlap(out.data, elements * esize, in.data, (st.last_offset + 1) * esize), names.output,
                   " must not overlap ", names.input, " in memory");
  // The small inputs are read by every block while others write: no overlap either.
  OPENTE_CHECK_ARG(!overlap(out.data, elements * esize, freqs.data, p.s2 * p.d2 * 4), names.output,
                   " must not overlap freqs in memory");
  if (p.cu_seqlens) {
    OPENTE_CHECK_ARG(!overlap(out.data, elements * esize, p.cu_seqlens, (p.b + 1) * 4), names.output,
                     " must not overlap cu_seqlens in memory");
  }
  if (p.start_positions) {
    OPENTE_CHECK_ARG(!overlap(out.data, elements * esize, p.start_positions, p.b * 4), names.output,
                     " must not overlap start_positions in memory");
  }

  p.input = in.data;
  p.output = out.data;
  p.freqs = static_cast<const float*>(freqs.data);
  p.dtype = te_dtype(in.dtype);
  p.interleaved = config->interleaved != 0;
  p.backward = backward;
  p.cp_size = config->cp_size;
  p.cp_rank = config->cp_rank;
  if (in.device.type == TE_DEVICE_CPU) {
    if (thd) check_host_cu_seqlens(p, names.input);
    rope_cpu(p);
  } else {
    OPENTE_CUDA_CALL(names.input, rope_cuda(p, in.device.index, stream));
  }
}

}  // namespace

extern "C" te_status te_rope_fwd(const te_tensor* input, const int64_t* input_strides, const te_tensor* freqs,
                                 const te_tensor* cu_seqlens, const te_tensor* start_positions, const te_tensor* output,
                                 const te_rope_config* config, void* stream) {
  return run_op("te_rope_fwd", [&] {
    rope(kFwdNames, input, input_strides, freqs, cu_seqlens, start_positions, output, config, false, stream);
  });
}

extern "C" te_status te_rope_bwd(const te_tensor* grad_output, const int64_t* grad_output_strides,
                                 const te_tensor* freqs, const te_tensor* cu_seqlens, const te_tensor* start_positions,
                                 const te_tensor* grad_input, const te_rope_config* config, void* stream) {
  return run_op("te_rope_bwd", [&] {
    rope(kBwdNames, grad_output, grad_output_strides, freqs, cu_seqlens, start_positions, grad_input, config, true,
         stream);
  });
}
