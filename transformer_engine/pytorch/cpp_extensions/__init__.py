"""Thin torch-tensor helpers over the core ops of ``transformer_engine._core``.

Each helper checks its torch arguments (dtype, device, contiguity), describes
them to the core as raw pointers and shapes, and runs the op on the tensor's
device and current CUDA stream. FP8 data travels as torch.uint8 tensors with an
explicit FP8 dtype (as in Transformer Engine); torch.float8_e4m3fn /
torch.float8_e5m2 tensors are accepted where FP8 data is read.
"""

from transformer_engine.pytorch.cpp_extensions.activation import (
    dgeglu,
    dgelu,
    dqgeglu,
    dqgelu,
    dreglu,
    drelu,
    dsilu,
    dsreglu,
    dsrelu,
    dswiglu,
    geglu,
    gelu,
    qgeglu,
    qgelu,
    reglu,
    relu,
    silu,
    sreglu,
    srelu,
    swiglu,
)
from transformer_engine.pytorch.cpp_extensions.bias_grad import (
    bgrad_quantize,
    dbias_dgelu,
    dbias_dqgelu,
    dbias_drelu,
    dbias_dsilu,
    dbias_dsrelu,
    dgeglu_cast_transpose,
    dqgeglu_cast_transpose,
    dreglu_cast_transpose,
    dsreglu_cast_transpose,
    dswiglu_cast_transpose,
)
from transformer_engine.pytorch.cpp_extensions.cast import compute_amax, dequantize, quantize, transpose
from transformer_engine.pytorch.cpp_extensions.fused_attn import fused_attn_bwd, fused_attn_fwd
from transformer_engine.pytorch.cpp_extensions.gemm import general_gemm, get_cublas_workspace_size_bytes
from transformer_engine.pytorch.cpp_extensions.normalization import (
    layernorm_bwd,
    layernorm_fwd,
    rmsnorm_bwd,
    rmsnorm_fwd,
)
from transformer_engine.pytorch.cpp_extensions.recipe import compute_scale_from_amax, delayed_scaling_update
from transformer_engine.pytorch.cpp_extensions.rope import fused_rope_backward, fused_rope_forward
from transformer_engine.pytorch.cpp_extensions.softmax import (
    scaled_aligned_causal_masked_softmax_backward,
    scaled_aligned_causal_masked_softmax_forward,
    scaled_masked_softmax_backward,
    scaled_masked_softmax_forward,
    scaled_softmax_backward,
    scaled_softmax_forward,
    scaled_upper_triang_masked_softmax_backward,
    scaled_upper_triang_masked_softmax_forward,
)
from transformer_engine.pytorch.cpp_extensions.tensor_desc import DType

__all__ = [
    "DType",
    "bgrad_quantize",
    "compute_amax",
    "compute_scale_from_amax",
    "dbias_dgelu",
    "dbias_dqgelu",
    "dbias_drelu",
    "dbias_dsilu",
    "dbias_dsrelu",
    "delayed_scaling_update",
    "dequantize",
    "dgeglu",
    "dgeglu_cast_transpose",
    "dgelu",
    "dqgeglu",
    "dqgeglu_cast_transpose",
    "dqgelu",
    "dreglu",
    "dreglu_cast_transpose",
    "drelu",
    "dsilu",
    "dsreglu",
    "dsreglu_cast_transpose",
    "dsrelu",
    "dswiglu",
    "dswiglu_cast_transpose",
    "fused_attn_bwd",
    "fused_attn_fwd",
    "fused_rope_backward",
    "fused_rope_forward",
    "geglu",
    "gelu",
    "general_gemm",
    "get_cublas_workspace_size_bytes",
    "layernorm_bwd",
    "layernorm_fwd",
    "qgeglu",
    "qgelu",
    "quantize",
    "reglu",
    "relu",
    "rmsnorm_bwd",
    "rmsnorm_fwd",
    "scaled_aligned_causal_masked_softmax_backward",
    "scaled_aligned_causal_masked_softmax_forward",
    "scaled_masked_softmax_backward",
    "scaled_masked_softmax_forward",
    "scaled_softmax_backward",
    "scaled_softmax_forward",
    "scaled_upper_triang_masked_softmax_backward",
    "scaled_upper_triang_masked_softmax_forward",
    "silu",
    "sreglu",
    "srelu",
    "swiglu",
    "transpose",
]
