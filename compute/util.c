/* util.c — loom_scale, loom_axpy, loom_norm2 and loom_checksum: argument checks, then the CPU
 * kernels. The checksum takes any dtype; the others are f32. */
#include "config.h"
#include "loom_compute.h"

#include <math.h>

#include "args.h"
#include "cpu/util_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_ctx.h"
#endif
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Shared checks

// The op's first tensor: present, on a backend that is built, f32.
static loom_status_t check_first_f32(const char *op, const char *name, const loom_tensor_t *t) {
  loom_status_t status = loom_arg_backend(op, name, t);
  if (status != LOOM_OK) {
    return status;
  }
  return loom_arg_tensor(op, name, t, LOOM_F32, t->device);
}

static loom_status_t check_alpha(const char *op, float alpha) {
  if (isfinite(alpha)) {
    return LOOM_OK;
  }
  return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: alpha = %g, expected a finite value", op,
                    (double)alpha);
}

#ifdef LOOM_HAVE_CUDA
// FNV-1a 64 of a device tensor's bytes: the same hash as on the host, computed over host copies
// of 1 MiB chunks (a checksum is a consistency check, not a step-path op).
static loom_status_t checksum_device(const loom_tensor_t *x, uint64_t *out) {
  const size_t chunk = (size_t)1 << 20;
  size_t bytes = loom_tensor_bytes(x);
  uint64_t hash = LOOM_FNV1A64_OFFSET;
  unsigned char *buf = loom_host_alloc(chunk);
  if (!buf) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_checksum: no host memory for a %zu-byte chunk",
                      chunk);
  }
  loom_status_t status = LOOM_OK;
  for (size_t off = 0; off < bytes && status == LOOM_OK; off += chunk) {
    size_t len = bytes - off < chunk ? bytes - off : chunk;
    status = loom_cuda_to_host(buf, (const unsigned char *)x->data + off, len);
    if (status == LOOM_OK) {
      hash = loom_cpu_fnv1a64(hash, buf, len);
    }
  }
  loom_host_free(buf);
  if (status == LOOM_OK) {
    *out = hash;
  }
  return status;
}
#endif

// ---------------------------------------------------------------------------------------------
// Ops

loom_status_t loom_scale(loom_tensor_t *x, float alpha) {
  static const char op[] = "loom_scale";
  loom_status_t status = check_first_f32(op, "x", x);
  if (status != LOOM_OK || (status = check_alpha(op, alpha)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (x->device != LOOM_DEVICE_HOST) {
    return loom_cuda_scale(loom_tensor_numel(x), alpha, x->data);
  }
#endif
  loom_cpu_scale(loom_tensor_numel(x), alpha, x->data);
  return LOOM_OK;
}

loom_status_t loom_axpy(loom_tensor_t *y, float alpha, const loom_tensor_t *x) {
  static const char op[] = "loom_axpy";
  char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  loom_status_t status = check_first_f32(op, "y", y);
  if (status != LOOM_OK || (status = loom_arg_tensor(op, "x", x, LOOM_F32, y->device)) != LOOM_OK) {
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
  if ((status = check_alpha(op, alpha)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (y->device != LOOM_DEVICE_HOST) {
    return loom_cuda_axpy(loom_tensor_numel(y), alpha, x->data, y->data);
  }
#endif
  loom_cpu_axpy(loom_tensor_numel(y), alpha, x->data, y->data);
  return LOOM_OK;
}

loom_status_t loom_norm2(const loom_tensor_t *x, double *out) {
  static const char op[] = "loom_norm2";
  loom_status_t status = check_first_f32(op, "x", x);
  if (status != LOOM_OK) {
    return status;
  }
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: out is NULL: pass where to store the norm",
                      op);
  }
#ifdef LOOM_HAVE_CUDA
  if (x->device != LOOM_DEVICE_HOST) {
    double sumsq = 0.0;
    status = loom_cuda_sumsq(loom_tensor_numel(x), x->data, &sumsq);
    if (status == LOOM_OK) {
      *out = sqrt(sumsq);
    }
    return status;
  }
#endif
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
#ifdef LOOM_HAVE_CUDA
  if (x->device != LOOM_DEVICE_HOST) {
    return checksum_device(x, out);
  }
#endif
  *out = loom_cpu_fnv1a64(LOOM_FNV1A64_OFFSET, x->data, loom_tensor_bytes(x));
  return LOOM_OK;
}
