/* layernorm.c — loom_layernorm_forward and _backward: check every argument (dtype, device,
 * shapes against in, eps, overlap) and then run the backend's kernel; a bad call writes nothing. */
#include "config.h"
#include "loom_compute.h"

#include <math.h>
#include <stdint.h>

#include "args.h"
#include "cpu/layernorm_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Shared checks.

// t (already checked) must hold one value per row of in (any shape).
static loom_status_t check_per_row(const char *op, const char *name, const loom_tensor_t *t,
                                   const loom_tensor_t *in, int64_t N) {
  if (loom_tensor_numel(t) == N) {
    return LOOM_OK;
  }
  char ts[LOOM_SHAPE_STR_MAX], is[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: %s %s does not match in %s: expected %lld elements (N), one per row", op,
                    name, loom_shape_str(t, ts), loom_shape_str(in, is), (long long)N);
}

static loom_status_t check_nonempty_rows(const char *op, const loom_tensor_t *in, int64_t N,
                                         int64_t C) {
  if (C > 0 || N == 0) {
    return LOOM_OK;
  }
  char is[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: in %s has rows of length 0: a row needs at least one element to "
                    "normalise",
                    op, loom_shape_str(in, is));
}

// ---------------------------------------------------------------------------------------------
// Forward.

loom_status_t loom_layernorm_forward(loom_tensor_t *out, loom_tensor_t *mean, loom_tensor_t *rstd,
                                     const loom_tensor_t *in, const loom_tensor_t *weight,
                                     const loom_tensor_t *bias, float eps) {
  static const char op[] = "loom_layernorm_forward";
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = out->device;
  int64_t N, C, rows, cols;
  if ((status = loom_arg_matrix(op, "out", out, LOOM_F32, dev, &rows, &cols)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "mean", mean, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "rstd", rstd, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "in", in, LOOM_F32, dev, &N, &C)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "weight", weight, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "bias", bias, LOOM_F32, dev)) != LOOM_OK) {
    return status;
  }
  if ((status = check_nonempty_rows(op, in, N, C)) != LOOM_OK ||
      (status = loom_arg_like(op, "out", out, "in", in, N, C)) != LOOM_OK ||
      (status = check_per_row(op, "mean", mean, in, N)) != LOOM_OK ||
      (status = check_per_row(op, "rstd", rstd, in, N)) != LOOM_OK ||
      (status = loom_arg_bias_of(op, "weight", weight, "in", in, C)) != LOOM_OK ||
      (status = loom_arg_bias_of(op, "bias", bias, "in", in, C)) != LOOM_OK) {
    return status;
  }
  if (!(eps >= 0.0f) || isinf(eps)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: eps is %g, expected a finite value >= 0 (1e-5 is typical)", op,
                      (double)eps);
  }
  const loom_tensor_t *inputs[] = {in, weight, bias};
  const char *input_names[] = {"in", "weight", "bias"};
  for (int i = 0; i < 3; i++) {
    if ((status = loom_arg_disjoint(op, "out", out, input_names[i], inputs[i], i == 0)) !=
            LOOM_OK ||
        (status = loom_arg_disjoint(op, "mean", mean, input_names[i], inputs[i], 0)) != LOOM_OK ||
        (status = loom_arg_disjoint(op, "rstd", rstd, input_names[i], inputs[i], 0)) != LOOM_OK) {
      return status;
    }
  }
  if ((status = loom_arg_disjoint(op, "mean", mean, "out", out, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "rstd", rstd, "out", out, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "rstd", rstd, "mean", mean, 0)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (out->device != LOOM_DEVICE_HOST) {
    return loom_cuda_layernorm_forward(
        N, C, eps, (const float *)in->data, (const float *)weight->data, (const float *)bias->data,
        (float *)out->data, (float *)mean->data, (float *)rstd->data);
  }
#endif
  loom_cpu_layernorm_forward(N, C, eps, (const float *)in->data, (const float *)weight->data,
                             (const float *)bias->data, (float *)out->data, (float *)mean->data,
                             (float *)rstd->data);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Backward.

loom_status_t loom_layernorm_backward(loom_tensor_t *din, loom_tensor_t *dweight,
                                      loom_tensor_t *dbias, const loom_tensor_t *dout,
                                      const loom_tensor_t *in, const loom_tensor_t *weight,
                                      const loom_tensor_t *mean, const loom_tensor_t *rstd) {
  static const char op[] = "loom_layernorm_backward";
  loom_status_t status = loom_arg_backend(op, "din", din);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = din->device;
  int64_t N, C, rows, cols;
  if ((status = loom_arg_matrix(op, "din", din, LOOM_F32, dev, &rows, &cols)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "dweight", dweight, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "dbias", dbias, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "dout", dout, LOOM_F32, dev, &rows, &cols)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "in", in, LOOM_F32, dev, &N, &C)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "weight", weight, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "mean", mean, LOOM_F32, dev)) != LOOM_OK ||
      (status = loom_arg_tensor(op, "rstd", rstd, LOOM_F32, dev)) != LOOM_OK) {
    return status;
  }
  if ((status = check_nonempty_rows(op, in, N, C)) != LOOM_OK ||
      (status = loom_arg_like(op, "din", din, "in", in, N, C)) != LOOM_OK ||
      (status = loom_arg_like(op, "dout", dout, "in", in, N, C)) != LOOM_OK ||
      (status = loom_arg_bias_of(op, "dweight", dweight, "in", in, C)) != LOOM_OK ||
      (status = loom_arg_bias_of(op, "dbias", dbias, "in", in, C)) != LOOM_OK ||
      (status = loom_arg_bias_of(op, "weight", weight, "in", in, C)) != LOOM_OK ||
      (status = check_per_row(op, "mean", mean, in, N)) != LOOM_OK ||
      (status = check_per_row(op, "rstd", rstd, in, N)) != LOOM_OK) {
    return status;
  }
  // din may be dout or in itself; every other pair of an output with anything must be disjoint.
  const loom_tensor_t *inputs[] = {dout, in, weight, mean, rstd};
  const char *input_names[] = {"dout", "in", "weight", "mean", "rstd"};
  for (int i = 0; i < 5; i++) {
    if ((status = loom_arg_disjoint(op, "din", din, input_names[i], inputs[i], i < 2)) != LOOM_OK ||
        (status = loom_arg_disjoint(op, "dweight", dweight, input_names[i], inputs[i], 0)) !=
            LOOM_OK ||
        (status = loom_arg_disjoint(op, "dbias", dbias, input_names[i], inputs[i], 0)) != LOOM_OK) {
      return status;
    }
  }
  if ((status = loom_arg_disjoint(op, "dweight", dweight, "din", din, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dbias", dbias, "din", din, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dbias", dbias, "dweight", dweight, 0)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (din->device != LOOM_DEVICE_HOST) {
    return loom_cuda_layernorm_backward(N, C, (const float *)dout->data, (const float *)in->data,
                                        (const float *)weight->data, (const float *)mean->data,
                                        (const float *)rstd->data, (float *)din->data,
                                        (float *)dweight->data, (float *)dbias->data);
  }
#endif
  loom_cpu_layernorm_backward(N, C, (const float *)dout->data, (const float *)in->data,
                              (const float *)weight->data, (const float *)mean->data,
                              (const float *)rstd->data, (float *)din->data, (float *)dweight->data,
                              (float *)dbias->data);
  return LOOM_OK;
}
