#include "common/error.h"

namespace {
thread_local std::string last_error;
}

namespace opente {
void set_last_error(const std::string& message) { last_error = message; }
}  // namespace opente

extern "C" const char* te_last_error_message(void) { return last_error.c_str(); }

extern "C" int te_built_with_cuda(void) { return OPENTE_WITH_CUDA; }
