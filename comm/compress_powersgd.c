/* compress_powersgd.c — PowerSGD (Vogels et al. 2019): one power-iteration step per allreduce,
 * M ~ P Q^T with a warm-started Q, two ordered allreduces (P, then Q) and error feedback. */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "compress_internal.h"
#include "error.h"
#include "memory.h"

// The matrix view of a tensor: its first dimension by the rest when it has two or more, else
// a near-square rows x cols with the tail zero-padded.
static void matrix_shape(const loom_tensor_t *t, int64_t n, int64_t *rows, int64_t *cols) {
  if (t->ndim >= 2 && t->shape[0] > 0) {
    *rows = t->shape[0];
    *cols = n / t->shape[0];
    return;
  }
  int64_t c = (int64_t)ceil(sqrt((double)n));
  *cols = c > 0 ? c : 1;
  *rows = (n + *cols - 1) / *cols;
}

// Orthonormalise the r columns of p (rows x r, row-major) by modified Gram-Schmidt in double;
// a column that vanishes becomes zero. Deterministic: every rank gets the same bits.
static void orthonormalise(float *p, int64_t rows, int r) {
  for (int j = 0; j < r; j++) {
    for (int k = 0; k < j; k++) {
      double dot = 0.0;
      for (int64_t i = 0; i < rows; i++) {
        dot += (double)p[i * r + j] * p[i * r + k];
      }
      for (int64_t i = 0; i < rows; i++) {
        p[i * r + j] -= (float)(dot * p[i * r + k]);
      }
    }
    double norm = 0.0;
    for (int64_t i = 0; i < rows; i++) {
      norm += (double)p[i * r + j] * p[i * r + j];
    }
    norm = sqrt(norm);
    float inv = norm > 1e-30 ? (float)(1.0 / norm) : 0.0f;
    for (int64_t i = 0; i < rows; i++) {
      p[i * r + j] *= inv;
    }
  }
}

static loom_status_t sum_f32(const loom_group_t *g, float *x, int64_t n, const char *what) {
  loom_tensor_t v;
  loom_status_t status = loom_tensor_wrap(&v, x, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, what);
  return status != LOOM_OK ? status : loom_allreduce(g, &v, &v, LOOM_SUM);
}

loom_status_t loom_powersgd_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                      loom_ef_t *ef, loom_tensor_t *t, size_t *sent) {
  loom_status_t status = LOOM_OK;
  if (!ef) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s on tensor '%s' needs error feedback (the low-rank error is large and "
                      "must be carried to the next step): pass a loom_ef_t",
                      c->name, t->name);
  }
  const int64_t n = loom_tensor_numel(t);
  int64_t rows, cols;
  matrix_shape(t, n, &rows, &cols);
  const int64_t rk64 =
      c->rank < rows ? (c->rank < cols ? c->rank : cols) : (rows < cols ? rows : cols);
  const int r = (int)(rk64 > 0 ? rk64 : 0);
  float *x = t->data, *res = NULL, *q = NULL;
  float *m = NULL, *p = NULL, *ql = NULL;
  int fresh = 0;
  if (n == 0 || r == 0) {
    return LOOM_OK;
  }
  LOOM_CHECK(loom_ef_residual(ef, t->name, n, &res));
  LOOM_CHECK(loom_ef_side(ef, t->name, cols * r, &q, &fresh));
  m = loom_host_alloc((size_t)(rows * cols) * sizeof(float));
  p = loom_host_alloc((size_t)(rows * r) * sizeof(float));
  ql = loom_host_alloc((size_t)(cols * r) * sizeof(float));
  if (!m || !p || !ql) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate a %lld x %lld matrix", c->name,
                        (long long)rows, (long long)cols);
    goto fail;
  }
  if (fresh) { // the same start on every rank: a fixed stream, uniform in [-1, 1)
    uint64_t s = 0x706f77657273ull; // "powers"
    for (int64_t i = 0; i < cols * r; i++) {
      s = loom_mix64(s);
      q[i] = (float)((double)(s >> 11) * 0x1p-52 - 1.0);
    }
  }
  // M = x + residual, zero-padded to rows x cols.
  for (int64_t i = 0; i < n; i++) {
    m[i] = x[i] + res[i];
  }
  memset(m + n, 0, (size_t)(rows * cols - n) * sizeof(float));
  orthonormalise(q, cols, r); // warm start: the last step's summed Q, re-normalised
  // P = M Q, summed over ranks, orthonormalised.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, r, (int)cols, 1.0f, m,
              (int)cols, q, r, 0.0f, p, r);
  LOOM_CHECK(sum_f32(g, p, rows * r, "powersgd P"));
  orthonormalise(p, rows, r);
  // Q = M^T P: this rank's (for the residual) and the sum (the result and the next warm start).
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)cols, r, (int)rows, 1.0f, m, (int)cols,
              p, r, 0.0f, ql, r);
  memcpy(q, ql, (size_t)(cols * r) * sizeof(float));
  LOOM_CHECK(sum_f32(g, q, cols * r, "powersgd Q"));
  // residual = M - P Ql^T (what this rank's approximation missed); x = P Q^T (the sum).
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)cols, r, -1.0f, p, r, ql, r,
              1.0f, m, (int)cols);
  for (int64_t i = 0; i < n; i++) {
    res[i] = isfinite(m[i]) ? m[i] : 0.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)cols, r, 1.0f, p, r, q, r,
              0.0f, m, (int)cols);
  memcpy(x, m, (size_t)n * sizeof(float));
  const int np = loom_group_size(g);
  *sent += (size_t)((rows + cols) * r) * sizeof(float) * 2 * (size_t)(np - 1) / (size_t)np;
fail:
  loom_host_free(m);
  loom_host_free(p);
  loom_host_free(ql);
  return status;
}
