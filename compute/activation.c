/* activation.c — loom_gelu_* and loom_softmax_*: check every argument (dtype, device, matching
 * shapes, overlap) and then run the backend's kernel; a bad call writes nothing. */
#include "config.h"
#include "loom_compute.h"

#include <stdint.h>

#include "args.h"
#include "cpu/activation_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Shared checks.

static loom_status_t check_same_numel(const char *op, const char *name, const loom_tensor_t *t,
                                      const char *ref_name, const loom_tensor_t *ref) {
  if (loom_tensor_numel(t) == loom_tensor_numel(ref)) {
    return LOOM_OK;
  }
  char ts[LOOM_SHAPE_STR_MAX], rs[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: %s %s has %lld elements but %s %s has %lld: expected the same number", op,
                    name, loom_shape_str(t, ts), (long long)loom_tensor_numel(t), ref_name,
                    loom_shape_str(ref, rs), (long long)loom_tensor_numel(ref));
}

// ---------------------------------------------------------------------------------------------
// GELU.

loom_status_t loom_gelu_forward(loom_tensor_t *out, const loom_tensor_t *in) {
  static const char op[] = "loom_gelu_forward";
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = out->device;
  if ((status = loom_arg_tensor(op, "out", out, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "in", in, LOOM_F32, dev)) != LOOM_OK ||
      (status = check_same_numel(op, "out", out, "in", in)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "out", out, "in", in, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_gelu_forward(loom_tensor_numel(in), (const float *)in->data,
                                  (float *)out->data);
  }
#endif
  loom_cpu_gelu_forward(loom_tensor_numel(in), (const float *)in->data, (float *)out->data);
  return LOOM_OK;
}

loom_status_t loom_gelu_backward(loom_tensor_t *din, const loom_tensor_t *in,
                                 const loom_tensor_t *dout) {
  static const char op[] = "loom_gelu_backward";
  loom_status_t status = loom_arg_backend(op, "din", din);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = din->device;
  if ((status = loom_arg_tensor(op, "din", din, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "in", in, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "dout", dout, LOOM_F32, dev)) != LOOM_OK ||
      (status = check_same_numel(op, "in", in, "din", din)) != LOOM_OK ||
      (status = check_same_numel(op, "dout", dout, "din", din)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "din", din, "in", in, 1)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "din", din, "dout", dout, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_gelu_backward(loom_tensor_numel(din), (const float *)in->data,
                                   (const float *)dout->data, (float *)din->data);
  }
#endif
  loom_cpu_gelu_backward(loom_tensor_numel(din), (const float *)in->data, (const float *)dout->data,
                         (float *)din->data);
  return LOOM_OK;
}

loom_status_t loom_gelu_forward_deriv(loom_tensor_t *out, loom_tensor_t *deriv,
                                      const loom_tensor_t *in) {
  static const char op[] = "loom_gelu_forward_deriv";
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = out->device;
  if ((status = loom_arg_tensor(op, "out", out, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "deriv", deriv, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "in", in, LOOM_F32, dev)) != LOOM_OK ||
      (status = check_same_numel(op, "out", out, "in", in)) != LOOM_OK ||
      (status = check_same_numel(op, "deriv", deriv, "in", in)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "out", out, "in", in, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "out", out, "deriv", deriv, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "deriv", deriv, "in", in, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_gelu_forward_deriv(loom_tensor_numel(in), (const float *)in->data,
                                        (float *)out->data, (float *)deriv->data);
  }
#endif
  loom_cpu_gelu_forward_deriv(loom_tensor_numel(in), (const float *)in->data, (float *)out->data,
                              (float *)deriv->data);
  return LOOM_OK;
}

loom_status_t loom_gelu_backward_deriv(loom_tensor_t *din, loom_tensor_t *dbias,
                                       const loom_tensor_t *deriv, const loom_tensor_t *dout) {
  static const char op[] = "loom_gelu_backward_deriv";
  loom_status_t status = loom_arg_backend(op, "din", din);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = din->device;
  int64_t M, N;
  if ((status = loom_arg_matrix(op, "din", din, LOOM_F32, dev, &M, &N)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "deriv", deriv, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "dout", dout, LOOM_F32, dev)) != LOOM_OK ||
      (status = check_same_numel(op, "deriv", deriv, "din", din)) != LOOM_OK ||
      (status = check_same_numel(op, "dout", dout, "din", din)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "din", din, "deriv", deriv, 1)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "din", din, "dout", dout, 1)) != LOOM_OK) {
    return status;
  }
  if (dbias) {
    if ((status = loom_arg_tensor(op, "dbias", dbias, LOOM_F32, dev)) != LOOM_OK ||
        (status = loom_arg_bias_of(op, "dbias", dbias, "din", din, N)) != LOOM_OK ||
        (status = loom_arg_disjoint(op, "dbias", dbias, "din", din, 0)) != LOOM_OK ||
        (status = loom_arg_disjoint(op, "dbias", dbias, "deriv", deriv, 0)) != LOOM_OK ||
        (status = loom_arg_disjoint(op, "dbias", dbias, "dout", dout, 0)) != LOOM_OK) {
      return status;
    }
  }
  float *db = dbias ? (float *)dbias->data : NULL;
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_gelu_backward_deriv(M, N, (const float *)deriv->data,
                                         (const float *)dout->data, (float *)din->data, db);
  }
#endif
  loom_cpu_gelu_backward_deriv(M, N, (const float *)deriv->data, (const float *)dout->data,
                               (float *)din->data, db);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Softmax.

loom_status_t loom_softmax_forward(loom_tensor_t *out, const loom_tensor_t *in) {
  static const char op[] = "loom_softmax_forward";
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = out->device;
  int64_t N, C, out_rows, out_cols;
  if ((status = loom_arg_matrix(op, "out", out, LOOM_F32, dev, &out_rows, &out_cols)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "in", in, LOOM_F32, dev, &N, &C)) != LOOM_OK ||
      (status = loom_arg_like(op, "out", out, "in", in, N, C)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "out", out, "in", in, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_softmax_forward(N, C, (const float *)in->data, (float *)out->data);
  }
#endif
  loom_cpu_softmax_forward(N, C, (const float *)in->data, (float *)out->data);
  return LOOM_OK;
}

loom_status_t loom_softmax_backward(loom_tensor_t *din, const loom_tensor_t *out,
                                    const loom_tensor_t *dout) {
  static const char op[] = "loom_softmax_backward";
  loom_status_t status = loom_arg_backend(op, "din", din);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = din->device;
  int64_t N, C, rows, cols;
  if ((status = loom_arg_matrix(op, "din", din, LOOM_F32, dev, &rows, &cols)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "out", out, LOOM_F32, dev, &N, &C)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "dout", dout, LOOM_F32, dev, &rows, &cols)) != LOOM_OK ||
      (status = loom_arg_like(op, "din", din, "out", out, N, C)) != LOOM_OK ||
      (status = loom_arg_like(op, "dout", dout, "out", out, N, C)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "din", din, "out", out, 1)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "din", din, "dout", dout, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_softmax_backward(N, C, (const float *)out->data, (const float *)dout->data,
                                      (float *)din->data);
  }
#endif
  loom_cpu_softmax_backward(N, C, (const float *)out->data, (const float *)dout->data,
                            (float *)din->data);
  return LOOM_OK;
}
