#include <string.h>

#include "ops/transpose/transpose_params.h"

namespace opente {

void transpose_cpu(const TransposeParams& p) {
  const char* in = static_cast<const char*>(p.input);
  char* out = static_cast<char*>(p.output);
  const size_t es = p.element_size;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) memcpy(out + (c * p.rows + r) * es, in + (r * p.cols + c) * es, es);
  }
}

}  // namespace opente
