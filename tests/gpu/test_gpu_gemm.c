/* test_gpu_gemm.c — loom_gemm (f32 and bf16), loom_gemm_residual and loom_bias_backward on
 * device 0 against the CPU backend: all transposes, alpha/beta, bias, sizes 0, 1, odd and ~1e6
 * outputs; strided GEMMs. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/linear_cpu.h"
#include "cuda/cuda_kernels.h"
#include "gpu_test.h"

// Tolerances, |got - want| <= atol + rtol |want|, inputs uniform in [-1, 1]:
// - f32: both sides are float GEMMs summing K products in different orders (OpenBLAS, cuBLAS with
//   TF32 off), each within ~K * 6e-8 * sum|a b| of the exact value: rtol 1e-5 and
//   atol = 2e-6 * (K + 1) * max(1, |alpha|) + 2e-6 * (1 + |beta|), twice the CPU unit test's bound
//   (two float results, not one against double). A wrong index or transpose is off by O(0.1..1).
// - bf16: the same inputs (rounded to bf16 on both sides), f32 accumulation, then c rounded to
//   bf16 (relative error <= 2^-9) and, with a bias, rounded again after the add: at most
//   0.002 |c| + 0.002 (|c| + |bias| <= 1), inside rtol 1e-2, atol 1e-2.
// - bias_backward: column sums in double (the device in a fixed two-stage order, the CPU row by
//   row), one float rounding at the end: rtol 1e-6, atol 1e-6.
#define BF16_RTOL 1e-2
#define BF16_ATOL 1e-2

static const char *kTest = "test_gpu_gemm";

// ---------------------------------------------------------------------------------------------
// Helpers

static loom_tensor_t host2(loom_dtype_t dt, int64_t r, int64_t c, const char *name) {
  int64_t shape[2] = {r, c};
  return test_tensor(dt, 2, shape, name);
}

static loom_tensor_t host1(int64_t n, const char *name) {
  return test_tensor_f32(1, &n, name);
}

// Fill an f32 host tensor with values uniform in [-1, 1], rounded to bf16 when bf16 (so that the
// f32 reference and the bf16 device inputs hold the same numbers).
static void fill_inputs(test_rng_t *rng, loom_tensor_t *t, int bf16) {
  int64_t n = loom_tensor_numel(t);
  float *x = test_floats(t);
  test_fill_uniform(rng, x, n, -1, 1);
  for (int64_t i = 0; bf16 && i < n; i++) {
    x[i] = loom_bf16_to_f32(loom_f32_to_bf16(x[i]));
  }
}

// A device copy of f32 host tensor h in dtype dt (f32 or bf16; the bf16 values are exact when h
// was filled by fill_inputs).
static loom_tensor_t upload_as(const loom_tensor_t *h, loom_dtype_t dt) {
  if (dt == LOOM_F32) {
    return gpu_upload(h);
  }
  loom_tensor_t hb = test_tensor(LOOM_BF16, h->ndim, h->shape, h->name);
  loom_f32_to_bf16_n(test_floats(h), (uint16_t *)hb.data, (size_t)loom_tensor_numel(h));
  loom_tensor_t d = gpu_upload(&hb);
  loom_tensor_free(&hb);
  return d;
}

// Compare device tensor d (f32 or bf16) with the f32 host tensor want.
static void compare_any(const char *what, const loom_tensor_t *d, const loom_tensor_t *want,
                        double rtol, double atol) {
  if (d->dtype == LOOM_F32) {
    gpu_compare(what, d, want, rtol, atol);
    return;
  }
  loom_tensor_t hb = gpu_download(d);
  loom_tensor_t hf = test_tensor_f32(d->ndim, d->shape, "got");
  loom_bf16_to_f32_n((const uint16_t *)hb.data, test_floats(&hf), (size_t)loom_tensor_numel(&hb));
  loom_tensor_t dd = gpu_upload(&hf); // gpu_compare takes a device f32 tensor
  gpu_compare(what, &dd, want, rtol, atol);
  TEST_FREE(&hb, &hf, &dd);
}

// ---------------------------------------------------------------------------------------------
// loom_gemm on device against loom_gemm on the host.

static void gemm_case(test_rng_t *rng, loom_dtype_t dt, int64_t M, int64_t N, int64_t K, int ta,
                      int tb, float alpha, float beta, int with_bias) {
  const int bf16 = dt == LOOM_BF16;
  loom_tensor_t a = ta ? host2(LOOM_F32, K, M, "a") : host2(LOOM_F32, M, K, "a");
  loom_tensor_t b = tb ? host2(LOOM_F32, N, K, "b") : host2(LOOM_F32, K, N, "b");
  loom_tensor_t c = host2(LOOM_F32, M, N, "c"), bias = host1(N, "bias");
  fill_inputs(rng, &a, bf16);
  fill_inputs(rng, &b, bf16);
  fill_inputs(rng, &bias, 0); // bias is f32 for both dtypes
  if (beta == 0.0f) {
    test_fill_value(test_floats(&c), M * N, NAN); // beta == 0 must not read c
  } else {
    fill_inputs(rng, &c, bf16);
  }
  loom_tensor_t da = upload_as(&a, dt), db = upload_as(&b, dt), dc = upload_as(&c, dt);
  loom_tensor_t dbias = gpu_upload(&bias);

  char what[200];
  snprintf(what, sizeof what, "%s gemm M=%lld N=%lld K=%lld ta=%d tb=%d alpha=%g beta=%g bias=%d",
           bf16 ? "bf16" : "f32", (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta,
           with_bias);
  loom_status_t st = loom_gemm(&c, &a, ta, &b, tb, with_bias ? &bias : NULL, alpha, beta);
  CHECK(st == LOOM_OK, "%s: host: %s", what, loom_last_error(NULL));
  st = loom_gemm(&dc, &da, ta, &db, tb, with_bias ? &dbias : NULL, alpha, beta);
  CHECK(st == LOOM_OK, "%s: device: %s", what, loom_last_error(NULL));
  if (st == LOOM_OK) {
    double rtol = bf16 ? BF16_RTOL : 1e-5;
    double atol = bf16 ? BF16_ATOL
                       : 2e-6 * (double)(K + 1) * fmax(1.0, fabs((double)alpha)) +
                             2e-6 * (1.0 + fabs((double)beta));
    compare_any(what, &dc, &c, rtol, atol);
  }
  TEST_FREE(&a, &b, &c, &bias, &da, &db, &dc, &dbias);
}

static void test_gemm(void) {
  test_rng_t rng = test_rng(11);
  // 1, odd (none a multiple of a tile), empty in each dimension, and ~1e6 outputs.
  static const int64_t shapes[][3] = {{1, 1, 1}, {17, 33, 65},    {65, 17, 33},
                                      {0, 5, 3}, {5, 0, 3},       {5, 3, 0},
                                      {0, 0, 0}, {129, 257, 100}, {1024, 1000, 96}};
  static const struct {
    float alpha, beta;
    int bias;
  } params[] = {{1.0f, 0.0f, 0}, {1.0f, 0.0f, 1}, {0.5f, -1.25f, 1}, {-2.0f, 1.0f, 0}};
  const loom_dtype_t dtypes[2] = {LOOM_F32, LOOM_BF16};
  for (int d = 0; d < 2; d++) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      for (int t = 0; t < 4; t++) {
        for (size_t p = 0; p < sizeof params / sizeof params[0]; p++) {
          gemm_case(&rng, dtypes[d], shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1,
                    params[p].alpha, params[p].beta, params[p].bias);
        }
      }
    }
  }
}

// loom_gemm_residual on device (the copy, then cuBLAS with beta 1) against the host's, with
// the residual apart from c and as c itself.
static void residual_case(test_rng_t *rng, loom_dtype_t dt, int64_t M, int64_t N, int64_t K) {
  const int bf16 = dt == LOOM_BF16;
  loom_tensor_t a = host2(LOOM_F32, M, K, "a"), b = host2(LOOM_F32, N, K, "b");
  loom_tensor_t r = host2(LOOM_F32, M, N, "res"), c = host2(LOOM_F32, M, N, "c");
  loom_tensor_t bias = host1(N, "bias");
  fill_inputs(rng, &a, bf16);
  fill_inputs(rng, &b, bf16);
  fill_inputs(rng, &r, bf16);
  fill_inputs(rng, &bias, 0);
  loom_tensor_t da = upload_as(&a, dt), db = upload_as(&b, dt), dr = upload_as(&r, dt);
  loom_tensor_t dc = upload_as(&r, dt), dbias = gpu_upload(&bias); // dc: overwritten
  char what[160];
  snprintf(what, sizeof what, "%s gemm_residual M=%lld N=%lld K=%lld", bf16 ? "bf16" : "f32",
           (long long)M, (long long)N, (long long)K);
  loom_status_t st = loom_gemm_residual(&c, &a, 0, &b, 1, &bias, &r);
  CHECK(st == LOOM_OK, "%s: host: %s", what, loom_last_error(NULL));
  const double rtol = bf16 ? BF16_RTOL : 1e-5, atol = bf16 ? BF16_ATOL : 2e-6 * (double)(K + 2);
  for (int in_place = 0; in_place < 2; in_place++) {
    st = loom_gemm_residual(&dc, &da, 0, &db, 1, &dbias, in_place ? &dc : &dr);
    CHECK(st == LOOM_OK, "%s: device (in place %d): %s", what, in_place, loom_last_error(NULL));
    if (st == LOOM_OK) {
      compare_any(what, &dc, &c, rtol, atol);
    }
    if (!in_place) { // dc = the residual again, for the in-place call
      TEST_FREE(&dc);
      dc = upload_as(&r, dt);
    }
  }
  compare_any(what, &dr, &r, 0.0, 0.0); // the residual is read, never written
  TEST_FREE(&a, &b, &r, &c, &bias, &da, &db, &dr, &dc, &dbias);
}

static void test_residual(void) {
  test_rng_t rng = test_rng(14);
  residual_case(&rng, LOOM_F32, 129, 257, 100);
  residual_case(&rng, LOOM_F32, 7, 5, 0);
  residual_case(&rng, LOOM_BF16, 129, 257, 100);
}

// ---------------------------------------------------------------------------------------------
// loom_cuda_gemm on strided sub-matrices (tiles of wider buffers, as attention and MoE call it)
// against loom_cpu_gemm_strided: the row strides reach cuBLAS as leading dimensions.

static void strided_case(test_rng_t *rng, int64_t M, int64_t N, int64_t K, int ta, int tb) {
  const int64_t pad = 7; // extra columns in every buffer: they must stay untouched
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  loom_tensor_t a = host2(LOOM_F32, a_rows, lda, "a"), b = host2(LOOM_F32, b_rows, ldb, "b");
  loom_tensor_t c = host2(LOOM_F32, M, ldc, "c"), bias = host1(N, "bias");
  fill_inputs(rng, &a, 0);
  fill_inputs(rng, &b, 0);
  fill_inputs(rng, &c, 0);
  fill_inputs(rng, &bias, 0);
  loom_tensor_t da = gpu_upload(&a), db = gpu_upload(&b), dc = gpu_upload(&c),
                dbias = gpu_upload(&bias);
  const float alpha = 0.75f, beta = 0.5f;
  char what[160];
  snprintf(what, sizeof what,
           "strided gemm M=%lld N=%lld K=%lld ta=%d tb=%d lda=%lld ldb=%lld "
           "ldc=%lld",
           (long long)M, (long long)N, (long long)K, ta, tb, (long long)lda, (long long)ldb,
           (long long)ldc);
  loom_cpu_gemm_strided(ta, tb, M, N, K, alpha, test_floats(&a), lda, test_floats(&b), ldb,
                        test_floats(&bias), beta, test_floats(&c), ldc);
  loom_status_t st = loom_cuda_gemm(LOOM_F32, ta, tb, M, N, K, alpha, da.data, lda, db.data, ldb,
                                    (const float *)dbias.data, beta, dc.data, ldc);
  CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error(NULL));
  // The pad columns of c compare too: both sides leave them as they were.
  gpu_compare(what, &dc, &c, 1e-5, 2e-6 * (double)(K + 1) + 2e-6 * 1.5);
  TEST_FREE(&a, &b, &c, &bias, &da, &db, &dc, &dbias);
}

static void test_strided(void) {
  test_rng_t rng = test_rng(12);
  for (int t = 0; t < 4; t++) {
    strided_case(&rng, 17, 33, 65, t & 1, t >> 1);
    strided_case(&rng, 1, 1, 1, t & 1, t >> 1);
  }
}

// ---------------------------------------------------------------------------------------------
// loom_bias_backward: dbias accumulates column sums of dout.

static void bias_case(test_rng_t *rng, int64_t M, int64_t N) {
  loom_tensor_t dout = host2(LOOM_F32, M, N, "dout"), dbias = host1(N, "dbias");
  fill_inputs(rng, &dout, 0);
  fill_inputs(rng, &dbias, 0); // it accumulates: start from non-zero values
  loom_tensor_t ddout = gpu_upload(&dout), ddbias = gpu_upload(&dbias);
  char what[120];
  snprintf(what, sizeof what, "bias_backward M=%lld N=%lld", (long long)M, (long long)N);
  CHECK(loom_bias_backward(&dbias, &dout) == LOOM_OK, "%s: host: %s", what, loom_last_error(NULL));
  loom_status_t st = loom_bias_backward(&ddbias, &ddout);
  CHECK(st == LOOM_OK, "%s: device: %s", what, loom_last_error(NULL));
  if (st == LOOM_OK) {
    gpu_compare(what, &ddbias, &dbias, 1e-6, 1e-6);
  }
  TEST_FREE(&dout, &dbias, &ddout, &ddbias);
}

static void test_bias_backward(void) {
  test_rng_t rng = test_rng(13);
  // One chunk (few rows, or very wide), several chunks, odd sizes, M == 0, ~1e6 elements.
  static const int64_t shapes[][2] = {{1, 1},    {0, 7},      {17, 33},   {63, 5},
                                      {1000, 3}, {4099, 257}, {3, 70001}, {8192, 130}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    bias_case(&rng, shapes[s][0], shapes[s][1]);
  }
}

int main(void) {
  gpu_require_device(kTest);
  test_gemm();
  test_strided();
  test_residual();
  test_bias_backward();
  return check_exit(kTest);
}
