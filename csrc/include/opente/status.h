/* Errors of the OpenTE C API.
 *
 * Every op returns a te_status. On failure, te_last_error_message() gives a
 * message naming the op, the argument and what was expected, e.g.
 *   "te_quantize: output dtype must be float8_e4m3 or float8_e5m2, got bfloat16".
 * The message lives in thread-local storage and stays valid until the next
 * failing call on the same thread. */
#ifndef OPENTE_STATUS_H_
#define OPENTE_STATUS_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef enum te_status {
  TE_SUCCESS = 0,
  TE_ERROR_INVALID_ARGUMENT = 1, /* wrong dtype, shape, device, null pointer ... */
  TE_ERROR_NOT_IMPLEMENTED = 2,  /* a valid request this build or op cannot serve */
  TE_ERROR_CUDA = 3,             /* the CUDA runtime reported an error */
  TE_ERROR_INTERNAL = 4          /* a bug in OpenTE */
} te_status;

const char* te_last_error_message(void);

/* 1 when this library was built with CUDA kernels, else 0. */
int te_built_with_cuda(void);

#ifdef __cplusplus
}
#endif

#endif /* OPENTE_STATUS_H_ */
