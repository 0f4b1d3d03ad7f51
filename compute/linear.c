/* linear.c — loom_gemm, loom_gemm_residual and loom_bias_backward: check every argument (dtype,
 * device, shapes, the BLAS int range, aliasing), then run the backend's kernel; a bad call writes
 * nothing. */
#include "config.h"
#include "loom_compute.h"

#include <limits.h>
#include <stdint.h>

#include "args.h"
#include "cpu/linear_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#include "memory.h"
#endif

// ---------------------------------------------------------------------------------------------
// GEMM.

// The sizes of a checked product: op(a) (M, K) @ op(b) (K, N) on device dev, in dtype dt; a and
// b have a_cols and b_cols columns as stored (their row strides).
typedef struct {
  int dev;
  loom_dtype_t dt;
  int64_t M, N, K, a_cols, b_cols;
} gemm_dims_t;

// Every check of loom_gemm's arguments (and loom_gemm_residual's, but the residual), as `op`.
static loom_status_t check_gemm(const char *op, const loom_tensor_t *c, const loom_tensor_t *a,
                                int trans_a, const loom_tensor_t *b, int trans_b,
                                const loom_tensor_t *bias, gemm_dims_t *d) {
  char cs[LOOM_SHAPE_STR_MAX], as[LOOM_SHAPE_STR_MAX], bs[LOOM_SHAPE_STR_MAX];
  loom_status_t status = loom_arg_backend(op, "c", c);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = c->device;
  // f32 everywhere; bf16 a, b and c (f32 accumulation, f32 bias) on CUDA devices.
  const loom_dtype_t dt = dev != LOOM_DEVICE_HOST && c->dtype == LOOM_BF16 ? LOOM_BF16 : LOOM_F32;
  if (dev == LOOM_DEVICE_HOST && c->dtype == LOOM_BF16) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: c %s is bf16 on the host: bf16 GEMM runs on CUDA devices; use f32 "
                      "tensors on the host",
                      op, loom_shape_str(c, cs));
  }
  int64_t M, N, a_rows, a_cols, b_rows, b_cols;
  if ((status = loom_arg_matrix(op, "c", c, dt, dev, &M, &N)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "a", a, dt, dev, &a_rows, &a_cols)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "b", b, dt, dev, &b_rows, &b_cols)) != LOOM_OK) {
    return status;
  }
  // op(a) is (a_m, K) and op(b) is (K_b, b_n).
  int64_t a_m = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
  int64_t K_b = trans_b ? b_cols : b_rows, b_n = trans_b ? b_rows : b_cols;
  if (K != K_b) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: inner dimensions differ: op(a) of a %s%s has %lld columns, op(b) of "
                      "b %s%s has %lld rows",
                      op, loom_shape_str(a, as), trans_a ? " (transposed)" : "", (long long)K,
                      loom_shape_str(b, bs), trans_b ? " (transposed)" : "", (long long)K_b);
  }
  if (a_m != M) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: c %s has %lld rows but op(a) of a %s%s has %lld: expected c (%lld, "
                      "%lld) for op(a) (M, K) @ op(b) (K, N)",
                      op, loom_shape_str(c, cs), (long long)M, loom_shape_str(a, as),
                      trans_a ? " (transposed)" : "", (long long)a_m, (long long)a_m,
                      (long long)b_n);
  }
  if (b_n != N) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: c %s has %lld columns but op(b) of b %s%s has %lld: expected c (%lld, "
                      "%lld) for op(a) (M, K) @ op(b) (K, N)",
                      op, loom_shape_str(c, cs), (long long)N, loom_shape_str(b, bs),
                      trans_b ? " (transposed)" : "", (long long)b_n, (long long)a_m,
                      (long long)b_n);
  }
  if (bias) {
    if ((status = loom_arg_tensor(op, "bias", bias, LOOM_F32, dev)) != LOOM_OK) {
      return status;
    }
    if (bias->ndim != 1 || bias->shape[0] != N) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: bias %s does not match c %s: expected bias (%lld), one value per "
                        "column of c, or NULL",
                        op, loom_shape_str(bias, bs), loom_shape_str(c, cs), (long long)N);
    }
  }
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: c %s = op(a) of a %s @ op(b) of b %s has M %lld, N %lld, K %lld: each "
                      "must be at most INT_MAX (%d) for BLAS; split the product",
                      op, loom_shape_str(c, cs), loom_shape_str(a, as), loom_shape_str(b, bs),
                      (long long)M, (long long)N, (long long)K, INT_MAX);
  }
  if ((status = loom_arg_disjoint(op, "c", c, "a", a, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "c", c, "b", b, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "c", c, "bias", bias, 0)) != LOOM_OK) {
    return status;
  }
  *d = (gemm_dims_t){dev, dt, M, N, K, a_cols, b_cols};
  return LOOM_OK;
}

loom_status_t loom_gemm(loom_tensor_t *c, const loom_tensor_t *a, int trans_a,
                        const loom_tensor_t *b, int trans_b, const loom_tensor_t *bias, float alpha,
                        float beta) {
  gemm_dims_t d;
  loom_status_t status = check_gemm("loom_gemm", c, a, trans_a, b, trans_b, bias, &d);
  if (status != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (d.dev != LOOM_DEVICE_HOST) {
    // Row strides of the matrices as stored: a is (M, K), or (K, M) with trans_a.
    return loom_cuda_gemm(d.dt, trans_a, trans_b, d.M, d.N, d.K, alpha, a->data, d.a_cols, b->data,
                          d.b_cols, bias ? (const float *)bias->data : NULL, beta, c->data, d.N);
  }
#endif
  loom_cpu_gemm(trans_a, trans_b, d.M, d.N, d.K, alpha, (const float *)a->data,
                (const float *)b->data, bias ? (const float *)bias->data : NULL, beta,
                (float *)c->data);
  return LOOM_OK;
}

loom_status_t loom_gemm_residual(loom_tensor_t *c, const loom_tensor_t *a, int trans_a,
                                 const loom_tensor_t *b, int trans_b, const loom_tensor_t *bias,
                                 const loom_tensor_t *residual) {
  static const char op[] = "loom_gemm_residual";
  gemm_dims_t d;
  loom_status_t status = check_gemm(op, c, a, trans_a, b, trans_b, bias, &d);
  if (status != LOOM_OK) {
    return status;
  }
  if (!residual) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: residual is NULL: pass the (M, N) tensor to add, or call loom_gemm", op);
  }
  int64_t rows, cols;
  if ((status = loom_arg_matrix(op, "residual", residual, d.dt, d.dev, &rows, &cols)) != LOOM_OK) {
    return status;
  }
  if (rows != d.M || cols != d.N) {
    char cs[LOOM_SHAPE_STR_MAX], rs[LOOM_SHAPE_STR_MAX];
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: residual %s does not match c %s: expected residual (%lld, %lld), the "
                      "shape of c",
                      op, loom_shape_str(residual, rs), loom_shape_str(c, cs), (long long)d.M,
                      (long long)d.N);
  }
  // In place (residual is c) or apart: a partial overlap would read sums already written.
  if ((status = loom_arg_disjoint(op, "c", c, "residual", residual, 1)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (d.dev != LOOM_DEVICE_HOST) { // the copy, then cuBLAS adds the product (beta = 1)
    if (residual->data != c->data &&
        (status = loom_memcpy_any(c->data, d.dev, residual->data, d.dev,
                                  (size_t)(d.M * d.N) * loom_dtype_size(d.dt))) != LOOM_OK) {
      return status;
    }
    return loom_cuda_gemm(d.dt, trans_a, trans_b, d.M, d.N, d.K, 1.0f, a->data, d.a_cols, b->data,
                          d.b_cols, bias ? (const float *)bias->data : NULL, 1.0f, c->data, d.N);
  }
#endif
  loom_cpu_gemm_residual(trans_a, trans_b, d.M, d.N, d.K, (const float *)a->data,
                         (const float *)b->data, bias ? (const float *)bias->data : NULL,
                         (const float *)residual->data, (float *)c->data);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Bias gradient.

loom_status_t loom_bias_backward(loom_tensor_t *dbias, const loom_tensor_t *dout) {
  static const char op[] = "loom_bias_backward";
  loom_status_t status = loom_arg_backend(op, "dbias", dbias);
  if (status != LOOM_OK) {
    return status;
  }
  int64_t M, N;
  if ((status = loom_arg_tensor(op, "dbias", dbias, LOOM_F32, dbias->device)) != LOOM_OK ||
      (status = loom_arg_matrix(op, "dout", dout, LOOM_F32, dbias->device, &M, &N)) != LOOM_OK) {
    return status;
  }
  if ((status = loom_arg_bias_of(op, "dbias", dbias, "dout", dout, N)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dbias", dbias, "dout", dout, 0)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dbias->device != LOOM_DEVICE_HOST) {
    return loom_cuda_bias_backward(M, N, (const float *)dout->data, (float *)dbias->data);
  }
#endif
  loom_cpu_bias_backward(M, N, (const float *)dout->data, (float *)dbias->data);
  return LOOM_OK;
}
