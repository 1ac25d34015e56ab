/* OpenTE core C API: include this for every op family. */
#ifndef OPENTE_OPENTE_H_
#define OPENTE_OPENTE_H_

#include "opente/activation.h"
#include "opente/bias_grad.h"
#include "opente/fused_attn.h"
#include "opente/gemm.h"
#include "opente/linear.h"
#include "opente/norm.h"
#include "opente/quantize.h"
#include "opente/recipe.h"
#include "opente/rope.h"
#include "opente/softmax.h"
#include "opente/status.h"
#include "opente/tensor.h"
#include "opente/transpose.h"

#endif /* OPENTE_OPENTE_H_ */
