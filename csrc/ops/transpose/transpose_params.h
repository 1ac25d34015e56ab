// Transpose of a [rows, cols] matrix of elements of any size (1, 2, 4 or 8 bytes).
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace opente {

struct TransposeParams {
  const void* input;  // [rows, cols]
  void* output;       // [cols, rows]
  int64_t rows;
  int64_t cols;
  size_t element_size;
};

void transpose_cpu(const TransposeParams& p);
#if OPENTE_WITH_CUDA
void transpose_cuda(const TransposeParams& p, int device, void* stream);
#endif

}  // namespace opente
