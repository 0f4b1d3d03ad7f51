/* tensor.c — tensor descriptors: validation of dtype, device, shape and name, zeroed allocation
 * on host or a CUDA device, wrapping caller memory, release, and copies across devices. */
#include "config.h"
#include "loom_tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "memory.h"

#define SHAPE_STR_MAX (LOOM_MAX_DIMS * 22 + 4) // "(" + up to 8 "-9223372036854775808, " + ")"

int64_t loom_tensor_numel(const loom_tensor_t *t) {
  if (t == NULL || t->ndim < 0 || t->ndim > LOOM_MAX_DIMS) {
    return 0;
  }
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] <= 0) {
      return 0; // an empty (or invalid, negative) extent
    }
    if (n > INT64_MAX / t->shape[i]) {
      return 0; // cannot be allocated; loom_tensor_alloc rejects it
    }
    n *= t->shape[i];
  }
  return n;
}

size_t loom_tensor_bytes(const loom_tensor_t *t) {
  if (t == NULL) {
    return 0;
  }
  int64_t n = loom_tensor_numel(t);
  size_t size = loom_dtype_size(t->dtype);
  if (size == 0 || (uint64_t)n > SIZE_MAX / size) {
    return 0;
  }
  return (size_t)n * size;
}

// "(2, 3, 4)" for a shape of ndim extents (ndim already checked); "()" for a scalar.
static const char *shape_str(char buf[SHAPE_STR_MAX], int ndim, const int64_t *shape) {
  size_t len = 0;
  buf[len++] = '(';
  buf[len] = '\0';
  for (int i = 0; i < ndim && shape != NULL; i++) {
    int w = snprintf(buf + len, SHAPE_STR_MAX - len, "%s%" PRId64, i > 0 ? ", " : "", shape[i]);
    if (w < 0 || (size_t)w >= SHAPE_STR_MAX - len) {
      break;
    }
    len += (size_t)w;
  }
  snprintf(buf + len, SHAPE_STR_MAX - len, ")");
  return buf;
}

// Check a tensor description and compute its element and byte counts. `what` names the caller.
static loom_status_t check_desc(const char *what, loom_dtype_t dtype, int device, int ndim,
                                const int64_t *shape, const char *name, int64_t *numel,
                                size_t *bytes) {
  const char *tname = name != NULL ? name : "";
  size_t name_len = 0;
  if (name != NULL) {
    while (name_len < LOOM_NAME_MAX && name[name_len] != '\0') {
      name_len++;
    }
    if (name_len >= LOOM_NAME_MAX) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: name '%.32s...' is too long: names have at most %d characters", what,
                        name, LOOM_NAME_MAX - 1);
    }
  }
  if (loom_dtype_size(dtype) == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: tensor '%s' has invalid dtype %d: use one of f32, f16, bf16, i8, u8, "
                      "i32, i64",
                      what, tname, (int)dtype);
  }
  if (device < LOOM_DEVICE_HOST) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: tensor '%s' has invalid device %d: use LOOM_DEVICE_HOST (-1) or a "
                      "CUDA device index >= 0",
                      what, tname, device);
  }
  if (ndim < 0 || ndim > LOOM_MAX_DIMS) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: tensor '%s' has ndim %d: use 0..%d", what,
                      tname, ndim, LOOM_MAX_DIMS);
  }
  if (ndim > 0 && shape == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: tensor '%s' has ndim %d but shape is NULL: pass %d extents", what, tname,
                      ndim, ndim);
  }
  int has_zero = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      char buf[SHAPE_STR_MAX];
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensor '%s' has shape %s with negative extent shape[%d] = %" PRId64
                        ": extents must be >= 0",
                        what, tname, shape_str(buf, ndim, shape), i, shape[i]);
    }
    has_zero |= shape[i] == 0;
  }
  int64_t n = 1;
  size_t size = loom_dtype_size(dtype);
  if (has_zero) {
    n = 0;
  }
  for (int i = 0; i < ndim && n > 0; i++) {
    if (n > INT64_MAX / shape[i] || (uint64_t)(n * shape[i]) > SIZE_MAX / size) {
      char buf[SHAPE_STR_MAX];
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensor '%s' of shape %s and dtype %s is too large: its size in "
                        "bytes overflows size_t",
                        what, tname, shape_str(buf, ndim, shape), loom_dtype_name(dtype));
    }
    n *= shape[i];
  }
  *numel = n;
  *bytes = (size_t)n * size;
  return LOOM_OK;
}

// Fill in every field but data and owns_data.
static void set_desc(loom_tensor_t *t, loom_dtype_t dtype, int device, int ndim,
                     const int64_t *shape, const char *name) {
  t->dtype = dtype;
  t->device = device;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
  }
  if (name != NULL) {
    memcpy(t->name, name, strlen(name) + 1); // length checked by check_desc
  }
}

loom_status_t loom_tensor_alloc(loom_tensor_t *t, loom_dtype_t dtype, int device, int ndim,
                                const int64_t *shape, const char *name) {
  loom_status_t status = LOOM_OK;
  int64_t numel = 0;
  size_t bytes = 0;
  void *data = NULL;
  loom_tensor_t d; // the new description, made before *t is cleared: shape and name may point
                   // into *t (a tensor re-described in place from its own shape or name)
  if (t == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_tensor_alloc: t is NULL");
  }
  memset(&d, 0, sizeof d);
  status = check_desc("loom_tensor_alloc", dtype, device, ndim, shape, name, &numel, &bytes);
  if (status == LOOM_OK) {
    set_desc(&d, dtype, device, ndim, shape, name);
  }
  memset(t, 0, sizeof *t);
  t->device = LOOM_DEVICE_HOST; // a failed alloc leaves an empty host tensor: free is safe
  LOOM_CHECK(status);
  if (device == LOOM_DEVICE_HOST) {
    if (bytes > 0) {
      data = loom_host_alloc(bytes);
      if (data == NULL) {
        return loom_error(NULL, LOOM_ERR_NOMEM,
                          "allocating %zu bytes of host memory for tensor '%s' failed", bytes,
                          d.name);
      }
      memset(data, 0, bytes);
    }
  } else {
    LOOM_CHECK(loom_device_alloc(device, bytes, &data)); // checks the device even for 0 bytes
  }
  d.data = data;
  d.owns_data = 1;
  *t = d;
  if (loom_log_level >= LOOM_LOG_TRACE) {
    char buf[SHAPE_STR_MAX];
    LOOM_TRACE(LOOM_SUB_MEM,
               "tensor '%s' %s %s (%" PRId64 " elements) on device %d: %zu bytes at %p", t->name,
               loom_dtype_name(dtype), shape_str(buf, ndim, t->shape), numel, device, bytes, data);
  }
  return LOOM_OK;

fail:
  return status;
}

loom_status_t loom_tensor_wrap(loom_tensor_t *t, void *data, loom_dtype_t dtype, int device,
                               int ndim, const int64_t *shape, const char *name) {
  loom_status_t status = LOOM_OK;
  int64_t numel = 0;
  size_t bytes = 0;
  loom_tensor_t d; // made before *t is cleared: shape and name may point into *t (as in alloc)
  if (t == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_tensor_wrap: t is NULL");
  }
  memset(&d, 0, sizeof d);
  status = check_desc("loom_tensor_wrap", dtype, device, ndim, shape, name, &numel, &bytes);
  if (status == LOOM_OK) {
    set_desc(&d, dtype, device, ndim, shape, name);
  }
  memset(t, 0, sizeof *t);
  t->device = LOOM_DEVICE_HOST;
  LOOM_CHECK(status);
  LOOM_CHECK(loom_device_check(device));
  if (data == NULL && numel > 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_wrap: tensor '%s' has %" PRId64 " elements but data is NULL",
                      d.name, numel);
  }
  d.data = data;
  d.owns_data = 0;
  *t = d;
  return LOOM_OK;

fail:
  return status;
}

void loom_tensor_free(loom_tensor_t *t) {
  if (t == NULL) {
    return;
  }
  if (t->owns_data && t->data != NULL) {
    if (t->device == LOOM_DEVICE_HOST) {
      loom_host_free(t->data);
    } else {
      loom_device_free(t->device, t->data);
    }
  }
  memset(t, 0, sizeof *t);
}

// A tensor passed in by the caller: its descriptor is sane and data is present when needed.
static loom_status_t check_tensor(const char *what, const char *role, const loom_tensor_t *t) {
  int64_t numel = 0;
  size_t bytes = 0;
  if (t == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s tensor is NULL", what, role);
  }
  loom_status_t status =
      check_desc(what, t->dtype, t->device, t->ndim, t->shape, t->name, &numel, &bytes);
  if (status != LOOM_OK) {
    return status;
  }
  if (t->data == NULL && numel > 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s tensor '%s' has %" PRId64 " elements but data is NULL", what, role,
                      t->name, numel);
  }
  return LOOM_OK;
}

loom_status_t loom_tensor_copy(loom_tensor_t *dst, const loom_tensor_t *src) {
  loom_status_t status = LOOM_OK;
  LOOM_CHECK(check_tensor("loom_tensor_copy", "destination", dst));
  LOOM_CHECK(check_tensor("loom_tensor_copy", "source", src));
  if (dst->dtype != src->dtype || loom_tensor_numel(dst) != loom_tensor_numel(src)) {
    char dbuf[SHAPE_STR_MAX], sbuf[SHAPE_STR_MAX];
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_tensor_copy: cannot copy %s %s tensor '%s' into %s %s tensor '%s': "
                      "dtype and element count must match",
                      loom_dtype_name(src->dtype), shape_str(sbuf, src->ndim, src->shape),
                      src->name, loom_dtype_name(dst->dtype),
                      shape_str(dbuf, dst->ndim, dst->shape), dst->name);
  }
  LOOM_CHECK(
      loom_memcpy_any(dst->data, dst->device, src->data, src->device, loom_tensor_bytes(src)));
  return LOOM_OK;

fail:
  return status;
}
