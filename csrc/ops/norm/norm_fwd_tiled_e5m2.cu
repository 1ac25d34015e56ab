// The tiled forward's kernels (both FP8 copies in one pass) that write E5M2 bytes, from
// each input dtype (norm_fwd_tiled_launch.cuh: a file an FP8 dtype, so that they compile in
// parallel).
#include "ops/norm/norm_fwd_tiled_launch.cuh"

namespace opente {

OPENTE_NORM_FWD_TILED(TE_DTYPE_FLOAT32, TE_DTYPE_FLOAT8_E5M2);
OPENTE_NORM_FWD_TILED(TE_DTYPE_FLOAT16, TE_DTYPE_FLOAT8_E5M2);
OPENTE_NORM_FWD_TILED(TE_DTYPE_BFLOAT16, TE_DTYPE_FLOAT8_E5M2);

}  // namespace opente
