#include "opente/transpose.h"

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/transpose/transpose_params.h"

using namespace opente;

extern "C" te_status te_transpose(const te_tensor* input_desc, const te_tensor* output_desc, [[maybe_unused]] void* stream) {
  return run_op("te_transpose", [&] {
    const te_tensor& in = checked_tensor(input_desc, "input");
    const te_tensor& out = checked_tensor(output_desc, "output");
    OPENTE_CHECK_ARG(out.dtype == in.dtype, "output dtype must equal input dtype ", dtype_name(in.dtype),
                     ", got ", dtype_name(out.dtype));
    check_same_device(in.device, "input", out.device, "output");
    const MatrixShape m = matrix_shape(in);
    OPENTE_CHECK_ARG(out.ndim >= 1 && out.shape[0] == m.cols && numel(out) == m.rows * m.cols, "output shape ",
                     shape_string(out), " must be [", m.cols, ", ", m.rows, "] (the transpose of input shape ",
                     shape_string(in), ")");
    if (m.rows * m.cols > 0) {
      check_pointer(in.data, "input", "data");
      check_pointer(out.data, "output", "data");
    }

    const TransposeParams p{in.data, out.data, m.rows, m.cols, dtype_size(te_dtype(in.dtype))};
    if (in.device.type == TE_DEVICE_CPU) {
      transpose_cpu(p);
    } else {
      OPENTE_CUDA_CALL("input", transpose_cuda(p, in.device.index, stream));
    }
  });
}
