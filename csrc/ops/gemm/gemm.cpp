// C API of the GEMM: resolve each operand's storage and orientation, check
// shapes, dtypes and epilogue arguments, then run on the CPU or through cuBLASLt.
#include <string>

#include "common/error.h"
#include "common/tensor_checks.h"
#include "ops/gemm/gemm_params.h"

using namespace opente;

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // Transformer Engine's size on Hopper

const char* epilogue_name(int32_t e) {
  switch (e) {
    case TE_GEMM_EPILOGUE_NONE: return "none";
    case TE_GEMM_EPILOGUE_BIAS: return "bias";
    case TE_GEMM_EPILOGUE_GELU_AUX: return "gelu_aux";
    case TE_GEMM_EPILOGUE_GELU_AUX_BIAS: return "gelu_aux_bias";
    case TE_GEMM_EPILOGUE_DGELU: return "dgelu";
    case TE_GEMM_EPILOGUE_DGELU_BGRAD: return "dgelu_bgrad";
    case TE_GEMM_EPILOGUE_BGRAD: return "bgrad";
    default: return nullptr;
  }
}

// The storage an operand is read from. FP8 on CUDA must be read in cuBLASLt's
// one FP8 form ("TN": A transposed, B not), taking the column-wise copy when the
// requested orientation differs; otherwise the row-wise data is read, or the
// column-wise copy when only that exists.
GemmOperand resolve_operand(const te_tensor& t, const char* name, bool trans, bool fp8_wants_trans, bool on_cuda) {
  const bool fp8 = is_fp8(t.dtype);
  const bool has_elements = numel(t) > 0;
  bool use_columnwise;
  if (fp8 && on_cuda && has_elements) {
    use_columnwise = trans != fp8_wants_trans;
    if (use_columnwise) {
      OPENTE_CHECK_ARG(t.columnwise_data != nullptr, name, " is FP8 and used ", trans ? "transposed" : "untransposed",
                       ", which Hopper's FP8 GEMM reads only from the column-wise (transposed) copy: ", name,
                       ".columnwise_data must be set (te_quantize writes it)");
    }
  } else {
    use_columnwise = t.data == nullptr && t.columnwise_data != nullptr;
  }
  if (fp8) check_pointer(t.scale_inv, name, "scale_inv");
  const GemmOperand op{use_columnwise ? t.columnwise_data : t.data, te_dtype(t.dtype),
                       use_columnwise ? !trans : trans, fp8 ? t.scale_inv : nullptr};
  if (has_elements) check_pointer(op.data, name, "data");
  return op;
}

void check_float(const te_tensor& t, const char* name) {
  check_dtype(t, name, is_high_precision_float(t.dtype), "float32, float16 or bfloat16");
}

}  // namespace

extern "C" size_t te_gemm_workspace_size(void) { return kWorkspaceBytes; }

extern "C" te_status te_gemm(const te_tensor* A_desc, const te_tensor* B_desc, const te_tensor* D_desc,
                             const te_tensor* bias_desc, const te_tensor* aux_desc, const te_tensor* bias_grad_desc,
                             const te_gemm_config* config, [[maybe_unused]] void* workspace,
                             [[maybe_unused]] size_t workspace_size, [[maybe_unused]] void* stream) {
  return run_op("te_gemm", [&] {
    const te_tensor& A = checked_tensor(A_desc, "A");
    const te_tensor& B = checked_tensor(B_desc, "B");
    const te_tensor& D = checked_tensor(D_desc, "D");
    OPENTE_CHECK_ARG(config != nullptr, "config must not be null");
    const te_gemm_config& cfg = *config;
    const char* epi_name = epilogue_name(cfg.epilogue);
    OPENTE_CHECK_ARG(epi_name != nullptr, "config.epilogue is not a te_gemm_epilogue: ", cfg.epilogue);
    const te_gemm_epilogue epilogue = te_gemm_epilogue(cfg.epilogue);
    check_same_device(A.device, "A", B.device, "B");
    check_same_device(A.device, "A", D.device, "D");
    const bool on_cuda = A.device.type == TE_DEVICE_CUDA;

    // dtypes: both inputs high precision and equal, or both FP8 (not both E5M2)
    const bool fp8_inputs = is_fp8(A.dtype);
    if (fp8_inputs) {
      check_dtype(B, "B", is_fp8(B.dtype), "float8_e4m3 or float8_e5m2 (A is FP8)");
      OPENTE_CHECK_ARG(!(A.dtype == TE_DTYPE_FLOAT8_E5M2 && B.dtype == TE_DTYPE_FLOAT8_E5M2),
                       "A and B must not both be float8_e5m2 (FP8 GEMMs take E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3)");
    } else {
      check_float(A, "A");
      OPENTE_CHECK_ARG(B.dtype == A.dtype, "B dtype must equal A dtype ", dtype_name(A.dtype), ", got ",
                       dtype_name(B.dtype));
    }
    check_dtype(D, "D", is_high_precision_float(D.dtype) || is_fp8(D.dtype),
                "float32, float16, bfloat16, float8_e4m3 or float8_e5m2");
    if (is_fp8(D.dtype)) {
      check_pointer(D.scale, "D", "scale");
      OPENTE_CHECK_ARG(cfg.beta == 0.0f, "config.beta must be 0 with an FP8 output D, got ", cfg.beta);
    }

    // shapes: op_A(A) is [k, n], op_B(B) is [m, k], D is [m, n]
    const MatrixShape a = matrix_shape(A), b = matrix_shape(B), d = matrix_shape(D);
    const bool transa = cfg.transa != 0, transb = cfg.transb != 0;
    const int64_t n = transa ? a.rows : a.cols, k_a = transa ? a.cols : a.rows;
    const int64_t m = transb ? b.cols : b.rows, k_b = transb ? b.rows : b.cols;
    OPENTE_CHECK_ARG(k_a == k_b, "inner dimensions differ: op_A(A) is [", k_a, ", ", n, "] (A ", shape_string(A),
                     transa ? ", transposed" : "", ") but op_B(B) is [", m, ", ", k_b, "] (B ", shape_string(B),
                     transb ? ", transposed" : "", ")");
    OPENTE_CHECK_ARG(d.rows == m && d.cols == n, "D shape ", shape_string(D), " must be [", m, ", ", n,
                     "] (op_B(B) @ op_A(A))");
    if (fp8_inputs) {
      OPENTE_CHECK_ARG(m % 16 == 0 && n % 16 == 0 && k_a % 16 == 0, "FP8 GEMM needs m, n and k divisible by 16 ",
                       "(cuBLASLt's FP8 alignment), got m=", m, ", n=", n, ", k=", k_a);
    }

    // epilogue arguments: present exactly when the epilogue uses them
    auto optional = [&](const te_tensor* t, const char* name, bool wanted) -> const te_tensor* {
      if (!wanted) {
        OPENTE_CHECK_ARG(t == nullptr, name, " must be null with epilogue ", epi_name);
        return nullptr;
      }
      OPENTE_CHECK_ARG(t != nullptr, name, " is required by epilogue ", epi_name);
      const te_tensor& checked = checked_tensor(t, name);
      check_same_device(A.device, "A", checked.device, name);
      return &checked;
    };
    const te_tensor* bias = optional(bias_desc, "bias", epilogue_has_bias(epilogue));
    const te_tensor* aux = optional(aux_desc, "aux", epilogue_writes_aux(epilogue) || epilogue_reads_aux(epilogue));
    const te_tensor* bias_grad = optional(bias_grad_desc, "bias_grad", epilogue_has_bias_grad(epilogue));
    if (bias) {
      check_float(*bias, "bias");
      OPENTE_CHECK_ARG(numel(*bias) == n, "bias must have n=", n, " elements, got shape ", shape_string(*bias));
    }
    if (aux) {
      check_float(*aux, "aux");
      const MatrixShape x = matrix_shape(*aux);
      OPENTE_CHECK_ARG(x.rows == m && x.cols == n, "aux shape ", shape_string(*aux), " must be [", m, ", ", n, "]");
    }
    if (bias_grad) {
      check_float(*bias_grad, "bias_grad");
      const int64_t len = epilogue == TE_GEMM_EPILOGUE_BGRAD ? m : n;
      OPENTE_CHECK_ARG(numel(*bias_grad) == len, "bias_grad must have ", len, " elements (",
                       epilogue == TE_GEMM_EPILOGUE_BGRAD ? "m" : "n", ") with epilogue ", epi_name, ", got shape ",
                       shape_string(*bias_grad));
    }

    const bool empty = m == 0 || n == 0;
    if (!empty) {
      check_pointer(D.data, "D", "data");
      if (bias) check_pointer(bias->data, "bias", "data");
      if (aux) check_pointer(aux->data, "aux", "data");
    }
    if (bias_grad && numel(*bias_grad) > 0) check_pointer(bias_grad->data, "bias_grad", "data");
    GemmParams p{};
    p.a = resolve_operand(A, "A", transa, /*fp8_wants_trans=*/true, on_cuda);
    p.b = resolve_operand(B, "B", transb, /*fp8_wants_trans=*/false, on_cuda);
    p.m = m;
    p.n = n;
    p.k = k_a;
    p.d = D.data;
    p.d_dtype = te_dtype(D.dtype);
    p.d_scale = D.scale;
    p.d_amax = is_fp8(D.dtype) ? D.amax : nullptr;
    p.bias = bias ? bias->data : nullptr;
    p.bias_dtype = bias ? te_dtype(bias->dtype) : TE_DTYPE_FLOAT32;
    p.aux = aux ? aux->data : nullptr;
    p.aux_dtype = aux ? te_dtype(aux->dtype) : TE_DTYPE_FLOAT32;
    p.bias_grad = bias_grad ? bias_grad->data : nullptr;
    p.bias_grad_dtype = bias_grad ? te_dtype(bias_grad->dtype) : TE_DTYPE_FLOAT32;
    p.epilogue = epilogue;
    p.alpha = cfg.alpha;
    p.beta = cfg.beta;
    p.split_accumulator = cfg.use_split_accumulator != 0;

    if (!on_cuda) {
      gemm_cpu(p);
    } else {
      OPENTE_CHECK_ARG(workspace_size >= kWorkspaceBytes, "workspace must be at least ", kWorkspaceBytes,
                       " bytes (te_gemm_workspace_size()), got ", workspace_size);
      check_pointer(workspace, "workspace", "pointer");
      OPENTE_CUDA_CALL("A", gemm_cuda(p, A.device.index, workspace, workspace_size, stream));
    }
  });
}
