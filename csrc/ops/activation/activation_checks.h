// Descriptor checks shared by the activation ops and the fused backward casts
// of ops/bias_grad/ (which take the same kinds and the same forward input).
// Each throws opente::Error naming the argument, as tensor_checks.h does.
#pragma once

#include <stdint.h>

#include "common/tensor_checks.h"
#include "opente/activation.h"

namespace opente {

const char* activation_name(te_activation kind);  // "gelu", ..., "swiglu"

// `kind` is a te_activation.
te_activation checked_kind(int32_t kind);

// The forward's input: float32 / float16 / bfloat16, at least one dim, seen as
// [rows, cols] (*m); for a gated kind cols = 2H must be even. Returns H.
int64_t checked_activation_input(const te_tensor& in, const char* arg, te_activation kind, MatrixShape* m);

// `t` has `in`'s leading dims and last dim h.
void check_halved_shape(const te_tensor& t, const char* arg, const te_tensor& in, const char* in_name, int64_t h);

void check_same_dtype(const te_tensor& t, const char* arg, const te_tensor& like, const char* like_name);

}  // namespace opente
