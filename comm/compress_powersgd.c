/* compress_powersgd.c — PowerSGD (Vogels et al. 2019): one power-iteration step per allreduce,
 * M ~ P Q^T with a warm-started Q, two ordered allreduces (P, then Q) and error feedback. */
#include "config.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "compress_internal.h"
#include "error.h"
#include "memory.h"

// ---- what the host and device forms share -----------------------------------------------------

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

loom_status_t loom_powersgd_setup(const loom_compressor_t *c, const loom_ef_t *ef,
                                  const loom_tensor_t *t, loom_powersgd_dims_t *d) {
  if (!ef) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s on tensor '%s' needs error feedback (the low-rank error is large and "
                      "must be carried to the next step): pass a loom_ef_t",
                      c->name, t->name);
  }
  d->n = loom_tensor_numel(t);
  matrix_shape(t, d->n, &d->rows, &d->cols);
  const int64_t rows = d->rows, cols = d->cols;
  if (rows > INT_MAX || cols > INT_MAX) { // the BLAS takes int dimensions
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s on tensor '%s': its matrix view is %lld x %lld (the first dimension by "
                      "the rest), past the BLAS's limit of 2^31 - 1 a side: reshape the tensor, "
                      "or compress it with a payload codec",
                      c->name, t->name, (long long)rows, (long long)cols);
  }
  const int64_t rk64 =
      c->rank < rows ? (c->rank < cols ? c->rank : cols) : (rows < cols ? rows : cols);
  d->r = d->n > 0 && rk64 > 0 ? (int)rk64 : 0;
  return LOOM_OK;
}

void loom_powersgd_orthonormalise(float *p, int64_t rows, int r) {
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

// The fixed start of Q (cols x r), the same on every rank: a stream uniform in [-1, 1), into the
// columns j with redo[j] set.
static void random_start(float *q, int64_t nq, int r, const char *redo) {
  uint64_t s = 0x706f77657273ull; // "powers"
  for (int64_t i = 0; i < nq; i++) {
    s = loom_mix64(s);
    if (redo[i % r]) {
      q[i] = (float)((double)(s >> 11) * 0x1p-52 - 1.0);
    }
  }
}

loom_status_t loom_powersgd_warm_q(loom_ef_t *ef, const char *name, const loom_powersgd_dims_t *d,
                                   float **out) {
  loom_status_t status = LOOM_OK;
  float *q = NULL;
  int fresh = 0;
  const int64_t nq = d->cols * d->r;
  char redo[1024]; // (r) columns to start again (c->rank <= 1024)
  LOOM_CHECK(loom_ef_side(ef, name, nq, &q, &fresh));
  int nonfinite = 0;
  for (int64_t i = 0; i < nq && !fresh; i++) {
    nonfinite |= !isfinite(q[i]);
  }
  memset(redo, 1, (size_t)d->r);
  if (fresh || nonfinite) { // NaN would stay in Q through every later step
    random_start(q, nq, d->r, redo);
  }
  loom_powersgd_orthonormalise(q, d->cols, d->r); // the last step's summed Q, re-normalised
  // A column that vanished (a step whose gradient was zero, or of lower rank) would stay zero
  // for ever (P = M Q, Q = M^T P): it starts again, on every rank alike (Q is the same there).
  int vanished = 0;
  for (int j = 0; j < d->r; j++) {
    redo[j] = 1;
    for (int64_t i = 0; i < d->cols && redo[j]; i++) {
      redo[j] = q[i * d->r + j] == 0.0f;
    }
    vanished |= redo[j];
  }
  if (vanished) {
    random_start(q, nq, d->r, redo);
    loom_powersgd_orthonormalise(q, d->cols, d->r);
  }
  *out = q;
fail:
  return status;
}

size_t loom_powersgd_sent(const loom_powersgd_dims_t *d, int np) {
  return (size_t)((d->rows + d->cols) * d->r) * sizeof(float) * 2 * (size_t)(np - 1) / (size_t)np;
}

// ---- the host form ------------------------------------------------------------------------------

static loom_status_t sum_f32(const loom_group_t *g, float *x, int64_t n, const char *what) {
  loom_tensor_t v;
  loom_status_t status = loom_tensor_wrap(&v, x, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, what);
  return status != LOOM_OK ? status : loom_allreduce(g, &v, &v, LOOM_SUM);
}

loom_status_t loom_powersgd_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                      loom_ef_t *ef, loom_tensor_t *t, size_t *sent) {
  loom_powersgd_dims_t d;
  float *x = t->data, *res = NULL, *q = NULL;
  float *m = NULL, *p = NULL, *ql = NULL;
  loom_status_t status = loom_powersgd_setup(c, ef, t, &d);
  if (status != LOOM_OK || d.n == 0 || d.r == 0) {
    return status;
  }
  const int64_t n = d.n, rows = d.rows, cols = d.cols;
  const int r = d.r;
  LOOM_CHECK(loom_ef_residual(ef, t->name, n, &res));
  m = loom_host_alloc((size_t)(rows * cols) * sizeof(float));
  p = loom_host_alloc((size_t)(rows * r) * sizeof(float));
  ql = loom_host_alloc((size_t)(cols * r) * sizeof(float));
  if (!m || !p || !ql) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate a %lld x %lld matrix", c->name,
                        (long long)rows, (long long)cols);
    goto fail;
  }
  LOOM_CHECK(loom_powersgd_warm_q(ef, t->name, &d, &q)); // the warm start, orthonormalised
  // M = x + residual, zero-padded to rows x cols.
  for (int64_t i = 0; i < n; i++) {
    m[i] = x[i] + res[i];
  }
  memset(m + n, 0, (size_t)(rows * cols - n) * sizeof(float));
  // P = M Q, summed over ranks, orthonormalised.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, r, (int)cols, 1.0f, m,
              (int)cols, q, r, 0.0f, p, r);
  LOOM_CHECK(sum_f32(g, p, rows * r, "powersgd P"));
  loom_powersgd_orthonormalise(p, rows, r);
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
  *sent += loom_powersgd_sent(&d, loom_group_size(g));
fail:
  loom_host_free(m);
  loom_host_free(p);
  loom_host_free(ql);
  return status;
}
