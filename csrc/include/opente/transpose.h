/* Matrix transpose of any dtype (FP8 data included: bytes move unchanged). */
#ifndef OPENTE_TRANSPOSE_H_
#define OPENTE_TRANSPOSE_H_

#include "opente/status.h"
#include "opente/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* input [d0, ..., dn-1] seen as [rows, cols] with cols = dn-1; output holds
 * [cols, rows]: same dtype and device, output->shape[0] == cols and the same
 * number of elements (so both [cols, rows] and [dn-1, d0, ..., dn-2] work).
 * Only the row-wise `data` pointers are used. */
te_status te_transpose(const te_tensor* input, const te_tensor* output, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_TRANSPOSE_H_ */
