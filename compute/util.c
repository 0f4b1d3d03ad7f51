/* util.c — loom_scale, loom_axpy, loom_norm2 and loom_checksum: argument checks, then the CPU
 * kernels. The checksum takes any dtype; the others are f32. */
#include "config.h"
#include "loom_compute.h"

#include <math.h>

#include "args.h"
#include "cpu/util_cpu.h"
#include "error.h"

loom_status_t loom_scale(loom_tensor_t *x, float alpha) {
  static const char op[] = "loom_scale";
  loom_status_t status = loom_arg_backend(op, "x", x);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "x", x, LOOM_F32, x->device);
  if (status != LOOM_OK) {
    return status;
  }
  if (!isfinite(alpha)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: alpha = %g, expected a finite value", op,
                      (double)alpha);
  }
  loom_cpu_scale(loom_tensor_numel(x), alpha, x->data);
  return LOOM_OK;
}

loom_status_t loom_axpy(loom_tensor_t *y, float alpha, const loom_tensor_t *x) {
  static const char op[] = "loom_axpy";
  char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  loom_status_t status = loom_arg_backend(op, "y", y);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "y", y, LOOM_F32, y->device);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "x", x, LOOM_F32, y->device);
  if (status != LOOM_OK) {
    return status;
  }
  if (loom_tensor_numel(x) != loom_tensor_numel(y)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: x %s has %lld elements and y %s has %lld: expected the same count", op,
                      loom_shape_str(x, s1), (long long)loom_tensor_numel(x), loom_shape_str(y, s2),
                      (long long)loom_tensor_numel(y));
  }
  if (loom_tensors_overlap(x, y)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: x %s and y %s share memory: pass separate buffers (use loom_scale for "
                      "y *= 1 + alpha)",
                      op, loom_shape_str(x, s1), loom_shape_str(y, s2));
  }
  if (!isfinite(alpha)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: alpha = %g, expected a finite value", op,
                      (double)alpha);
  }
  loom_cpu_axpy(loom_tensor_numel(y), alpha, x->data, y->data);
  return LOOM_OK;
}

loom_status_t loom_norm2(const loom_tensor_t *x, double *out) {
  static const char op[] = "loom_norm2";
  loom_status_t status = loom_arg_backend(op, "x", x);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "x", x, LOOM_F32, x->device);
  if (status != LOOM_OK) {
    return status;
  }
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: out is NULL: pass where to store the norm",
                      op);
  }
  *out = sqrt(loom_cpu_sumsq(loom_tensor_numel(x), x->data));
  return LOOM_OK;
}

loom_status_t loom_checksum(const loom_tensor_t *x, uint64_t *out) {
  static const char op[] = "loom_checksum";
  loom_status_t status = loom_arg_backend(op, "x", x);
  if (status != LOOM_OK) {
    return status;
  }
  if (loom_dtype_size(x->dtype) == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: x has dtype %d, which is not a loom dtype",
                      op, (int)x->dtype);
  }
  status = loom_arg_tensor(op, "x", x, x->dtype, x->device);
  if (status != LOOM_OK) {
    return status;
  }
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: out is NULL: pass where to store the checksum", op);
  }
  *out = loom_cpu_fnv1a64(LOOM_FNV1A64_OFFSET, x->data, loom_tensor_bytes(x));
  return LOOM_OK;
}
