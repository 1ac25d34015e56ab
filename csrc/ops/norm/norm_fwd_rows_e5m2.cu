// The row forward's kernels that write an FP8 (E5M2) y, from each input dtype
// (norm_fwd_rows_launch.cuh: a file a y dtype, so that they compile in parallel).
#include "ops/norm/norm_fwd_rows_launch.cuh"

namespace opente {

OPENTE_NORM_FWD_ROWS(TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT8_E5M2, true, false);
OPENTE_NORM_FWD_ROWS(TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8_E5M2, true, false);
OPENTE_NORM_FWD_ROWS(TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E5M2, true, false);

}  // namespace opente
