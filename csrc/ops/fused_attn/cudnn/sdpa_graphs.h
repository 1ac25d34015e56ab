// cuDNN SDPA graphs (forward and backward) for validated fused attention calls.
// The only translation unit that includes cudnn-frontend's (heavy) headers is
// sdpa_graphs.cpp; this header keeps them out of everything else.
#pragma once

#include <stddef.h>

#include "ops/fused_attn/fused_attn_params.h"

namespace opente {

// Bytes of workspace the graph of `p` needs. Builds it on first use (and caches
// it, or cuDNN's refusal): a configuration cuDNN cannot run throws opente::Error
// with TE_ERROR_NOT_IMPLEMENTED and cuDNN's reason.
size_t sdpa_workspace_size(const SdpaParams& p);

// Runs the graph of `p` on `stream` (built first if it is not cached).
// workspace_size must be at least sdpa_workspace_size(p).
void sdpa_run(const SdpaParams& p, void* workspace, size_t workspace_size, void* stream);

}  // namespace opente
