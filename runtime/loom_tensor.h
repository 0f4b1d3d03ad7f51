/* loom_tensor.h — tensors (data, dtype, device, shape, name), dtype helpers, fp16/bf16
 * conversion, aligned host memory, and device-agnostic fill. Include loom.h rather than this. */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_dtype {
  LOOM_F32 = 0,
  LOOM_F16,
  LOOM_BF16,
  LOOM_I8,
  LOOM_U8,
  LOOM_I32,
  LOOM_I64,
  LOOM_DTYPE_COUNT
} loom_dtype_t;

#define LOOM_MAX_DIMS    8
#define LOOM_NAME_MAX    96
#define LOOM_DEVICE_HOST (-1) // tensor.device: host memory; 0.. is a CUDA device index

typedef struct loom_tensor {
  void *data; // numel elements of dtype, contiguous, row-major
  loom_dtype_t dtype;
  int device;                   // LOOM_DEVICE_HOST or a CUDA device index
  int ndim;                     // 0 (scalar) .. LOOM_MAX_DIMS
  int64_t shape[LOOM_MAX_DIMS]; // extents of the first ndim dimensions
  char name[LOOM_NAME_MAX];     // stable identity: compression state, checkpoints
  int owns_data;                // 1 if loom_tensor_free releases data
} loom_tensor_t;

LOOM_API size_t loom_dtype_size(loom_dtype_t dtype);      // bytes per element, 0 if invalid
LOOM_API const char *loom_dtype_name(loom_dtype_t dtype); // "f32", "bf16", ... or "invalid"
// Parse a dtype name ("f32", "fp16", "bf16", "int8"...); LOOM_ERR_INVALID_ARG names the choices.
LOOM_API loom_status_t loom_dtype_from_name(const char *name, loom_dtype_t *dtype);

LOOM_API int64_t loom_tensor_numel(const loom_tensor_t *t);
LOOM_API size_t loom_tensor_bytes(const loom_tensor_t *t);
// Allocate a zeroed tensor on device (LOOM_DEVICE_HOST or a CUDA index). Host memory is
// 64-byte aligned. name may be NULL.
LOOM_API loom_status_t loom_tensor_alloc(loom_tensor_t *t, loom_dtype_t dtype, int device, int ndim,
                                         const int64_t *shape, const char *name);
// Describe caller-owned memory without copying it; loom_tensor_free leaves it alone.
LOOM_API loom_status_t loom_tensor_wrap(loom_tensor_t *t, void *data, loom_dtype_t dtype,
                                        int device, int ndim, const int64_t *shape,
                                        const char *name);
LOOM_API void loom_tensor_free(loom_tensor_t *t);
// Set every element to value, converted to the dtype: f16/bf16/f32 round to nearest even;
// integers round half away from zero, saturate to the type's range, and take 0 for NaN.
// Runs on the tensor's device, in the order of the calling thread's current CUDA stream (the
// stream loom's ops use; a scheduler lane's inside a task): after the kernels queued there before
// it, before those queued after it. It may still be running on return: work on another stream
// must wait for this one (an event) first.
LOOM_API loom_status_t loom_tensor_fill(loom_tensor_t *t, double value);
// Copy src into dst (same dtype and element count) across host and devices; host views of one
// buffer may overlap (copied as by memmove). A device side is read or written in the current
// CUDA stream's order (as loom_tensor_fill). A copy to or from the host is complete on return;
// a copy between device buffers may still be in flight (kernels queued afterwards on the same
// stream see dst).
LOOM_API loom_status_t loom_tensor_copy(loom_tensor_t *dst, const loom_tensor_t *src);

// Number of CUDA devices this process sees (0 without the CUDA backend or without a GPU).
LOOM_API int loom_cuda_device_count(void);

// 64-byte aligned host memory (NULL on failure or bytes == 0); release with loom_host_free.
LOOM_API void *loom_host_alloc(size_t bytes);
LOOM_API void loom_host_free(void *p);

// IEEE half and bfloat16: round to nearest even; NaN stays NaN (quiet), Inf stays Inf,
// overflow gives Inf, subnormals are produced and read exactly.
LOOM_API uint16_t loom_f32_to_f16(float x);
LOOM_API float loom_f16_to_f32(uint16_t h);
LOOM_API uint16_t loom_f32_to_bf16(float x);
LOOM_API float loom_bf16_to_f32(uint16_t h);
// Bulk conversions of n elements (none when src or dst is NULL).
LOOM_API void loom_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
LOOM_API void loom_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
LOOM_API void loom_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n);
LOOM_API void loom_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif
