/* args.c — argument checks shared by every compute op; messages name the op, the argument, what
 * it is and what was expected, so that a caller can fix the call without reading loom. */
#include "config.h"

#include "args.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_ctx.h"
#endif

const char *loom_shape_str(const loom_tensor_t *t, char buf[LOOM_SHAPE_STR_MAX]) {
  if (!t) {
    snprintf(buf, LOOM_SHAPE_STR_MAX, "NULL");
    return buf;
  }
  size_t o = (size_t)snprintf(buf, LOOM_SHAPE_STR_MAX, "(");
  for (int i = 0; i < t->ndim && i < LOOM_MAX_DIMS && o < LOOM_SHAPE_STR_MAX; i++) {
    o += (size_t)snprintf(buf + o, LOOM_SHAPE_STR_MAX - o, "%s%lld", i ? ", " : "",
                          (long long)t->shape[i]);
  }
  if (o < LOOM_SHAPE_STR_MAX) {
    char dev[16] = "host";
    if (t->device != LOOM_DEVICE_HOST) {
      snprintf(dev, sizeof dev, "cuda:%d", t->device);
    }
    snprintf(buf + o, LOOM_SHAPE_STR_MAX - o, ") %s on %s", loom_dtype_name(t->dtype), dev);
  }
  return buf;
}

loom_status_t loom_arg_backend(const char *op, const char *name, const loom_tensor_t *t) {
  if (!t) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
  }
  if (t->device == LOOM_DEVICE_HOST) {
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  loom_status_t status = loom_cuda_use_device(t->device);
  if (status != LOOM_OK) {
    char why[256]; // copied: loom_error rewrites the buffer loom_last_error points to
    snprintf(why, sizeof why, "%s", loom_last_error(NULL));
    return loom_error(NULL, status, "%s: %s is on CUDA device %d: %s", op, name, t->device, why);
  }
  return LOOM_OK;
#else
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "%s: %s is on CUDA device %d, but this loom was built without the CUDA "
                    "backend: reconfigure with --with-cuda, or pass host tensors "
                    "(LOOM_DEVICE_HOST)",
                    op, name, t->device);
#endif
}

loom_status_t loom_arg_tensor(const char *op, const char *name, const loom_tensor_t *t,
                              loom_dtype_t dtype, int device) {
  char s[LOOM_SHAPE_STR_MAX];
  if (!t) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
  }
  if (!memchr(t->name, '\0', sizeof t->name)) { // (read as a string by the watchdog and the logs)
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s's name '%.32s...' is not NUL-terminated within its %d bytes: end it "
                      "(names have at most %d characters; loom_tensor_alloc and wrap end them)",
                      op, name, t->name, LOOM_NAME_MAX, LOOM_NAME_MAX - 1);
  }
  if (t->ndim < 0 || t->ndim > LOOM_MAX_DIMS) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s has ndim %d, outside 0..%d", op, name,
                      t->ndim, LOOM_MAX_DIMS);
  }
  int64_t numel = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] < 0) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s %s has a negative extent", op, name,
                        loom_shape_str(t, s));
    }
    if (__builtin_mul_overflow(numel, t->shape[i], &numel) || numel > (int64_t)(SIZE_MAX / 8)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: %s %s has more elements than fit in memory", op, name,
                        loom_shape_str(t, s));
    }
  }
  if (t->dtype != dtype) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is %s, expected dtype %s", op, name,
                      loom_shape_str(t, s), loom_dtype_name(dtype));
  }
  if (t->device != device) {
    char where[32] = "the host";
    if (device != LOOM_DEVICE_HOST) {
      snprintf(where, sizeof where, "CUDA device %d", device);
    }
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is %s, but the op's first tensor is on %s: put all tensors of one "
                      "call on one device",
                      op, name, loom_shape_str(t, s), where);
  }
  if (!t->data && loom_tensor_numel(t) > 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s %s has NULL data", op, name,
                      loom_shape_str(t, s));
  }
  return LOOM_OK;
}

loom_status_t loom_arg_matrix(const char *op, const char *name, const loom_tensor_t *t,
                              loom_dtype_t dtype, int device, int64_t *rows, int64_t *cols) {
  loom_status_t status = loom_arg_tensor(op, name, t, dtype, device);
  if (status != LOOM_OK) {
    return status;
  }
  if (t->ndim < 1) {
    char s[LOOM_SHAPE_STR_MAX];
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is %s, expected at least one dimension",
                      op, name, loom_shape_str(t, s));
  }
  int64_t r = 1;
  for (int i = 0; i < t->ndim - 1; i++) {
    r *= t->shape[i];
  }
  *rows = r;
  *cols = t->shape[t->ndim - 1];
  return LOOM_OK;
}

loom_status_t loom_arg_like(const char *op, const char *name, const loom_tensor_t *t,
                            const char *ref_name, const loom_tensor_t *ref, int64_t rows,
                            int64_t cols) {
  int64_t r = 1;
  for (int i = 0; i < t->ndim - 1; i++) {
    r *= t->shape[i];
  }
  if (t->ndim >= 1 && r == rows && t->shape[t->ndim - 1] == cols) {
    return LOOM_OK;
  }
  char ts[LOOM_SHAPE_STR_MAX], rs[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: %s %s does not match %s %s: expected (%lld, %lld) rows and columns "
                    "(leading dimensions may be flattened)",
                    op, name, loom_shape_str(t, ts), ref_name, loom_shape_str(ref, rs),
                    (long long)rows, (long long)cols);
}

loom_status_t loom_arg_numel(const char *op, const char *name, const loom_tensor_t *t,
                             loom_dtype_t dtype, int device, int64_t n) {
  loom_status_t status = loom_arg_tensor(op, name, t, dtype, device);
  if (status == LOOM_OK && loom_tensor_numel(t) != n) {
    char s[LOOM_SHAPE_STR_MAX];
    status =
        loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is %s with %lld elements, expected %lld", op,
                   name, loom_shape_str(t, s), (long long)loom_tensor_numel(t), (long long)n);
  }
  return status;
}

loom_status_t loom_arg_shape(const char *op, const char *name, const loom_tensor_t *t,
                             loom_dtype_t dtype, int device, int ndim, const int64_t *shape) {
  loom_status_t status = loom_arg_tensor(op, name, t, dtype, device);
  if (status != LOOM_OK) {
    return status;
  }
  int same = t->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) {
    same = t->shape[i] == shape[i];
  }
  if (!same) {
    char s[LOOM_SHAPE_STR_MAX], want[LOOM_SHAPE_STR_MAX];
    loom_tensor_t expected = {0};
    expected.ndim = ndim;
    expected.dtype = dtype;
    expected.device = device;
    for (int i = 0; i < ndim && i < LOOM_MAX_DIMS; i++) {
      expected.shape[i] = shape[i];
    }
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is %s, expected %s", op, name,
                        loom_shape_str(t, s), loom_shape_str(&expected, want));
  }
  return status;
}

int loom_tensors_overlap(const loom_tensor_t *a, const loom_tensor_t *b) {
  if (!a || !b || !a->data || !b->data) {
    return 0;
  }
  size_t na = loom_tensor_bytes(a), nb = loom_tensor_bytes(b);
  uintptr_t pa = (uintptr_t)a->data, pb = (uintptr_t)b->data;
  return na && nb && pa < pb + nb && pb < pa + na;
}

loom_status_t loom_arg_bias_of(const char *op, const char *name, const loom_tensor_t *t,
                               const char *ref_name, const loom_tensor_t *ref, int64_t cols) {
  if (t->ndim == 1 && t->shape[0] == cols) {
    return LOOM_OK;
  }
  char ts[LOOM_SHAPE_STR_MAX], rs[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: %s %s does not match %s %s: expected %s (%lld), one value per column of "
                    "%s (its last extent)",
                    op, name, loom_shape_str(t, ts), ref_name, loom_shape_str(ref, rs), name,
                    (long long)cols, ref_name);
}

loom_status_t loom_arg_disjoint(const char *op, const char *xname, const loom_tensor_t *x,
                                const char *yname, const loom_tensor_t *y, int allow_same) {
  if (!loom_tensors_overlap(x, y)) {
    return LOOM_OK;
  }
  if (allow_same && x->data == y->data && loom_tensor_bytes(x) == loom_tensor_bytes(y)) {
    return LOOM_OK;
  }
  char xs[LOOM_SHAPE_STR_MAX], ys[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s %s %s %s %s: %s", op, xname,
                    loom_shape_str(x, xs), allow_same ? "partially overlaps" : "overlaps", yname,
                    loom_shape_str(y, ys),
                    allow_same ? "pass the same tensor for in-place use, or disjoint memory"
                               : "the output must not overlap an input");
}

loom_status_t loom_arg_i32_view(const char *op, const char *name, const loom_tensor_t *t,
                                const int32_t **view, int32_t **owned) {
  *owned = NULL;
  *view = (const int32_t *)t->data;
  if (t->device == LOOM_DEVICE_HOST || loom_tensor_numel(t) == 0) {
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  size_t bytes = loom_tensor_bytes(t);
  int32_t *copy = loom_host_alloc(bytes);
  if (!copy) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: no host memory (%zu bytes) to check %s", op, bytes,
                      name);
  }
  loom_status_t status = loom_cuda_to_host(copy, t->data, bytes);
  if (status != LOOM_OK) {
    loom_host_free(copy);
    return status;
  }
  *view = copy;
  *owned = copy;
  return LOOM_OK;
#else
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "%s: %s is on CUDA device %d in a build without CUDA", op, name, t->device);
#endif
}
