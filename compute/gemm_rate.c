/* gemm_rate.c — loom_gemm_rate: this rank's f32 GEMM rate, the denominator of MFU; on the host
 * the BLAS's sgemm and loom's own kernel timed alternately, the faster one reported as best. */
#include "config.h"
#include "loom_compute.h"

#include <cblas.h>
#include <time.h>

#include "cpu/gemm_avx2.h"
#include "cpu/linear_cpu.h"
#include "error.h"

enum { RATE_MAX_REPS = 1000 }; // timed products per kernel, after one untimed

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The host: cblas_sgemm and, where loom_gemm would use it for this shape, loom's kernel, one after
// the other so that both see the same state of a shared host.
static loom_status_t host_rate(int64_t n, int reps, float *a, float *b, float *c,
                               loom_gemm_rate_t *rate) {
  const int use_loom = loom_cpu_gemm_uses_loom(0, n, 1.0f);
  double best_blas = 1e30, best_loom = 1e30;
  for (int rep = 0; rep <= reps; rep++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n,
                b, (int)n, 0.0f, c, (int)n);
    double t1 = now_s();
    if (use_loom && loom_cpu_gemm_avx2(0, n, n, n, 1.0f, a, n, b, n, NULL, 0.0f, c, n) != 0) {
      return loom_error(NULL, LOOM_ERR_NOMEM,
                        "loom_gemm_rate: no memory for the GEMM kernel's packing buffer (1 MiB): "
                        "free memory, or set LOOM_GEMM=blas");
    }
    double t2 = now_s();
    if (rep > 0) { // the first of each warms caches and the packing buffer
      best_blas = t1 - t0 < best_blas ? t1 - t0 : best_blas;
      best_loom = t2 - t1 < best_loom ? t2 - t1 : best_loom;
    }
  }
  const double flops = 2.0 * (double)n * (double)n * (double)n;
  rate->blas = flops / best_blas;
  rate->loom = use_loom ? flops / best_loom : 0.0;
  return LOOM_OK;
}

// A device: loom_gemm (cuBLAS) timed with a norm of c that waits for it.
static loom_status_t device_rate(int reps, loom_tensor_t *a, loom_tensor_t *b, loom_tensor_t *c,
                                 loom_gemm_rate_t *rate) {
  const double n = (double)a->shape[0];
  double best = 1e30, sync = 0.0;
  loom_status_t st = LOOM_OK;
  for (int rep = 0; rep <= reps && st == LOOM_OK; rep++) {
    double t0 = now_s();
    st = loom_gemm(c, a, 0, b, 0, NULL, 1.0f, 0.0f);
    st = st == LOOM_OK ? loom_norm2(c, &sync) : st; // the product is queued: the norm waits
    double dt = now_s() - t0;
    best = rep > 0 && dt < best ? dt : best;
  }
  rate->blas = st == LOOM_OK ? 2.0 * n * n * n / best : 0.0;
  rate->loom = 0.0;
  return st;
}

loom_status_t loom_gemm_rate(int device, int reps, loom_gemm_rate_t *rate) {
  if (!rate) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_gemm_rate: rate is NULL: pass a loom_gemm_rate_t to fill");
  }
  rate->best = rate->blas = rate->loom = 0.0;
  if (reps < 1 || reps > RATE_MAX_REPS) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_gemm_rate: reps is %d: time 1 to %d products (10 is steady to ~1%%)",
                      reps, RATE_MAX_REPS);
  }
  const int64_t n = device == LOOM_DEVICE_HOST ? 1024 : 4096, shape[2] = {n, n};
  loom_tensor_t a = {0}, b = {0}, c = {0};
  loom_status_t st = loom_tensor_alloc(&a, LOOM_F32, device, 2, shape, "gemm_rate_a");
  st = st == LOOM_OK ? loom_tensor_alloc(&b, LOOM_F32, device, 2, shape, "gemm_rate_b") : st;
  st = st == LOOM_OK ? loom_tensor_alloc(&c, LOOM_F32, device, 2, shape, "gemm_rate_c") : st;
  st = st == LOOM_OK ? loom_tensor_fill(&a, 0.5) : st;
  st = st == LOOM_OK ? loom_tensor_fill(&b, 0.25) : st;
  if (st == LOOM_OK) {
    st = device == LOOM_DEVICE_HOST ? host_rate(n, reps, a.data, b.data, c.data, rate)
                                    : device_rate(reps, &a, &b, &c, rate);
  }
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  if (st == LOOM_OK) {
    rate->best = rate->blas > rate->loom ? rate->blas : rate->loom;
  }
  return st;
}
