#include "ops/activation/activation_checks.h"

#include "common/error.h"
#include "ops/activation/activation_params.h"

namespace opente {

const char* activation_name(te_activation kind) {
  static const char* const kNames[kNumActivations] = {"gelu",  "qgelu",  "relu",  "srelu",  "silu",
                                                      "geglu", "qgeglu", "reglu", "sreglu", "swiglu"};
  return is_valid_activation(kind) ? kNames[kind] : "invalid";
}

te_activation checked_kind(int32_t kind) {
  OPENTE_CHECK_ARG(is_valid_activation(kind), "kind must be a te_activation (0 to ", kNumActivations - 1,
                   "), got ", kind);
  return te_activation(kind);
}

int64_t checked_activation_input(const te_tensor& in, const char* arg, te_activation kind, MatrixShape* m) {
  check_dtype(in, arg, is_high_precision_float(in.dtype), "float32, float16 or bfloat16");
  OPENTE_CHECK_ARG(in.ndim >= 1, arg, " must have at least one dimension, got a scalar");
  *m = matrix_shape(in);
  if (!is_gated_activation(kind)) return m->cols;
  OPENTE_CHECK_ARG(m->cols % 2 == 0, arg, " last dim must be even for the gated activation ",
                   activation_name(kind), " (a = first half, b = second half), got shape ", shape_string(in));
  return m->cols / 2;
}

void check_halved_shape(const te_tensor& t, const char* arg, const te_tensor& in, const char* in_name, int64_t h) {
  bool ok = t.ndim == in.ndim;
  for (int32_t i = 0; ok && i + 1 < in.ndim; ++i) ok = t.shape[i] == in.shape[i];
  ok = ok && t.shape[in.ndim - 1] == h;
  OPENTE_CHECK_ARG(ok, arg, " shape must be ", in_name, "'s leading dims with last dim ", h, " (", in_name, " ",
                   shape_string(in), "), got ", shape_string(t));
}

void check_same_dtype(const te_tensor& t, const char* arg, const te_tensor& like, const char* like_name) {
  OPENTE_CHECK_ARG(t.dtype == like.dtype, arg, " dtype must equal ", like_name, " dtype ", dtype_name(like.dtype),
                   ", got ", dtype_name(t.dtype));
}

}  // namespace opente
