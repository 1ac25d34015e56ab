// Parameters of the GEMM after validation: each operand resolved to the storage
// actually read (row-wise data, or the column-wise copy with the transpose flag
// flipped), so the CPU reference and cuBLASLt see the same plain description.
//
//   D[m, n] = alpha * op_B(B)[m, k] @ op_A(A)[k, n] + beta * D, then the epilogue
//   op_A(A) = trans ? A^T (A stored [n, k]) : A (stored [k, n])
//   op_B(B) = trans ? B^T (B stored [k, m]) : B (stored [m, k])
#pragma once

#include <stdint.h>

#include "opente/gemm.h"

namespace opente {

struct GemmOperand {
  const void* data;        // row-major storage that is read
  te_dtype dtype;
  bool trans;              // the operand is the transpose of the storage
  const float* scale_inv;  // FP8: dequantization factor; else null
};

struct GemmParams {
  GemmOperand a, b;
  int64_t m, n, k;
  void* d;                 // [m, n]
  te_dtype d_dtype;
  const float* d_scale;    // FP8 D: quantization scale
  float* d_amax;           // FP8 D: max|D| before scaling; may be null
  const void* bias;        // [n]; may be null
  te_dtype bias_dtype;
  void* aux;               // [m, n]; may be null
  te_dtype aux_dtype;
  void* bias_grad;         // [n] (DGELU_BGRAD) or [m] (BGRAD); may be null
  te_dtype bias_grad_dtype;
  te_gemm_epilogue epilogue;
  float alpha;
  float beta;
  bool split_accumulator;
};

void gemm_cpu(const GemmParams& p);
#if OPENTE_WITH_CUDA
void gemm_cuda(const GemmParams& p, int device, void* workspace, size_t workspace_size, void* stream);
#endif

inline bool epilogue_has_bias(te_gemm_epilogue e) {
  return e == TE_GEMM_EPILOGUE_BIAS || e == TE_GEMM_EPILOGUE_GELU_AUX_BIAS;
}
inline bool epilogue_writes_aux(te_gemm_epilogue e) {
  return e == TE_GEMM_EPILOGUE_GELU_AUX || e == TE_GEMM_EPILOGUE_GELU_AUX_BIAS;
}
inline bool epilogue_reads_aux(te_gemm_epilogue e) {
  return e == TE_GEMM_EPILOGUE_DGELU || e == TE_GEMM_EPILOGUE_DGELU_BGRAD;
}
inline bool epilogue_has_bias_grad(te_gemm_epilogue e) {
  return e == TE_GEMM_EPILOGUE_DGELU_BGRAD || e == TE_GEMM_EPILOGUE_BGRAD;
}

}  // namespace opente
