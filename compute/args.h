/* args.h — argument checks shared by every compute op: tensors present, dtype, device, shapes,
 * each failure a LOOM_ERR_INVALID_ARG naming the op, the argument and its shape. */
#ifndef LOOM_COMPUTE_ARGS_H
#define LOOM_COMPUTE_ARGS_H

#include <stdint.h>

#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_SHAPE_STR_MAX 96

// "(4, 3, 64) f32 on host" style description of t (or "NULL").
const char *loom_shape_str(const loom_tensor_t *t, char buf[LOOM_SHAPE_STR_MAX]);

// The backend for an op whose first tensor is t: LOOM_OK for host tensors; for a CUDA tensor,
// LOOM_OK after making its device current (LOOM_ERR_UNSUPPORTED in a build without CUDA, an
// error naming the device when this process cannot see it). NULL t is LOOM_ERR_INVALID_ARG.
loom_status_t loom_arg_backend(const char *op, const char *name, const loom_tensor_t *t);

// t non-NULL, of dtype, on device, with data unless it is empty.
loom_status_t loom_arg_tensor(const char *op, const char *name, const loom_tensor_t *t,
                              loom_dtype_t dtype, int device);

// As loom_arg_tensor, and t viewed as a matrix: *cols = last extent, *rows = product of the
// others (ndim >= 1; an ndim-1 tensor is one row).
loom_status_t loom_arg_matrix(const char *op, const char *name, const loom_tensor_t *t,
                              loom_dtype_t dtype, int device, int64_t *rows, int64_t *cols);

// t (already checked) viewed as a matrix must be (rows, cols), the matrix view of ref: the
// product of its leading extents is rows and its last extent cols. The message names t and ref.
loom_status_t loom_arg_like(const char *op, const char *name, const loom_tensor_t *t,
                            const char *ref_name, const loom_tensor_t *ref, int64_t rows,
                            int64_t cols);

// As loom_arg_tensor, and t holds exactly n elements (any shape).
loom_status_t loom_arg_numel(const char *op, const char *name, const loom_tensor_t *t,
                             loom_dtype_t dtype, int device, int64_t n);

// As loom_arg_tensor, and t has exactly the given shape.
loom_status_t loom_arg_shape(const char *op, const char *name, const loom_tensor_t *t,
                             loom_dtype_t dtype, int device, int ndim, const int64_t *shape);

// A bias gradient: t (already checked) must be (cols), one value per column of the matrix view of
// ref (cols its last extent). The message names both and the shape expected.
loom_status_t loom_arg_bias_of(const char *op, const char *name, const loom_tensor_t *t,
                               const char *ref_name, const loom_tensor_t *ref, int64_t cols);

// 1 when the bytes of a and b overlap; NULL, empty or data-less tensors never do.
int loom_tensors_overlap(const loom_tensor_t *a, const loom_tensor_t *b);

// LOOM_ERR_INVALID_ARG when output x and input y (y may be NULL) overlap. With allow_same, the
// two may be exactly the same memory (in-place use); a partial overlap is still rejected.
loom_status_t loom_arg_disjoint(const char *op, const char *xname, const loom_tensor_t *x,
                                const char *yname, const loom_tensor_t *y, int allow_same);

// A host-readable view of the i32 values of t (already checked): t->data for a host tensor,
// else a copy made on the current stream (the call waits for it), returned in *owned for
// loom_host_free. For the checks of ids, targets and offsets that live on a device.
loom_status_t loom_arg_i32_view(const char *op, const char *name, const loom_tensor_t *t,
                                const int32_t **view, int32_t **owned);

#ifdef __cplusplus
}
#endif
#endif
