/* The tensor descriptor: a non-owning view of memory the caller allocated.
 *
 * The core never allocates tensor memory. A descriptor names the device, the
 * dtype and the logical (row-major, contiguous) shape, and points at:
 *   data             row-wise elements, shape `shape`;
 *   columnwise_data  optional transposed copy, shape [shape[ndim-1], rows] where
 *                    rows is the product of the other dims (Hopper's FP8 GEMM
 *                    only takes the TN layout, so backward needs this copy);
 *   scale            fp32 factor a quantizing cast multiplies by (read);
 *   scale_inv        fp32 1/scale, the factor that dequantizes (written by the cast);
 *   amax             fp32 running max |x| of the high-precision input (updated by
 *                    the cast).
 * scale, scale_inv and amax live on the tensor's device. For per-tensor scaling
 * each is a single float. Block scaling modes (later) keep the same fields: the
 * number and layout of scale_inv entries follow from the shape and the mode. */
#ifndef OPENTE_TENSOR_H_
#define OPENTE_TENSOR_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TE_MAX_DIMS 8

typedef enum te_device_type { TE_DEVICE_CPU = 0, TE_DEVICE_CUDA = 1 } te_device_type;

typedef struct te_device {
  int32_t type;  /* te_device_type */
  int32_t index; /* CUDA ordinal; 0 for the CPU */
} te_device;

/* Values match Transformer Engine's DType numbering where it has one. */
typedef enum te_dtype {
  TE_DTYPE_UINT8 = 0,
  TE_DTYPE_INT32 = 2,
  TE_DTYPE_INT64 = 3,
  TE_DTYPE_FLOAT32 = 4,
  TE_DTYPE_FLOAT16 = 5,
  TE_DTYPE_BFLOAT16 = 6,
  TE_DTYPE_FLOAT8_E4M3 = 7,
  TE_DTYPE_FLOAT8_E5M2 = 8
} te_dtype;

typedef enum te_scaling_mode {
  TE_SCALING_NONE = 0,       /* not quantized: scale fields unused */
  TE_SCALING_PER_TENSOR = 1, /* one scale for the whole tensor (delayed or current) */
  TE_SCALING_BLOCK_1D = 2,   /* 1x128 blocks (reserved) */
  TE_SCALING_BLOCK_2D = 3    /* 128x128 blocks (reserved) */
} te_scaling_mode;

typedef struct te_tensor {
  te_device device;
  int32_t dtype; /* te_dtype */
  int32_t ndim;  /* 0 .. TE_MAX_DIMS; 0 is a scalar (one element) */
  int64_t shape[TE_MAX_DIMS];
  void* data;
  void* columnwise_data;
  float* scale;
  float* scale_inv;
  float* amax;
  int32_t scaling_mode; /* te_scaling_mode */
} te_tensor;

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_TENSOR_H_ */
