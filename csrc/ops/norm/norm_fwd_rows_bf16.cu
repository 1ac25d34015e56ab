// The row forward's kernels that write a bf16 y, from each input dtype
// (norm_fwd_rows_launch.cuh: a file a y dtype, so that they compile in parallel).
#include "ops/norm/norm_fwd_rows_launch.cuh"

namespace opente {

OPENTE_NORM_FWD_ROWS(TE_DTYPE_FLOAT32, TE_DTYPE_BFLOAT16, true, false);
OPENTE_NORM_FWD_ROWS(TE_DTYPE_FLOAT16, TE_DTYPE_BFLOAT16, true, false);
OPENTE_NORM_FWD_ROWS(TE_DTYPE_BFLOAT16, TE_DTYPE_BFLOAT16, true, false);
OPENTE_NORM_FWD_ROWS(TE_DTYPE_BFLOAT16, TE_DTYPE_BFLOAT16, true, true);    // with the y's amax
OPENTE_NORM_FWD_ROWS(TE_DTYPE_BFLOAT16, TE_DTYPE_BFLOAT16, false, false);  // element by element

}  // namespace opente
