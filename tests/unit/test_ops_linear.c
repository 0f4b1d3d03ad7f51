/* test_ops_linear.c — loom_gemm, loom_gemm_residual and loom_bias_backward against references
 * (odd and prime shapes, all transposes, alpha/beta, bias) on the BLAS and on loom's AVX2 kernel,
 * linear-layer gradients, bad arguments. */
#include "config.h"
#include "loom.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "blas_check.h"
#include "cpu/gemm_avx2.h"
#include "cpu/linear_cpu.h"
#include "error.h"
#include "params.h"

static const char *gemm_kernel = "blas"; // the LOOM_GEMM mode the gemm tests run under

// Tolerances (float kernels against double references, inputs uniform in [-1, 1]):
// - gemm: |got - want| <= atol + rtol |want| with rtol 1e-5 and
//   atol = 1e-6 * (K + 1) * max(1, |alpha|) + 1e-6 * (1 + |beta|). A float dot product of length
//   K has error ~ K * 6e-8 * sum|a b| at worst and ~ sqrt(K) * 6e-8 typically; the bound keeps
//   10x headroom over the worst case seen while a wrong index or transpose is off by O(0.1..1).
// - K == 0, beta == 0 and bias rows: exact (no arithmetic besides one add or multiply).
// - bias_backward: atol 1e-6, rtol 1e-6 (column sums in double, one float rounding at the end).
// - finite differences of the linear layer (float forward, h = 1e-2, loss in double): the loss is
//   linear in each parameter, so only float rounding of the outputs counts (~1e-6 / 2h):
//   atol 1e-3, rtol 1e-2.

#define FD_H    1e-2f
#define FD_ATOL 1e-3
#define FD_RTOL 1e-2

// ---------------------------------------------------------------------------------------------
// Helpers

static loom_tensor_t tensor2(int64_t r, int64_t c, const char *name) {
  int64_t shape[2] = {r, c};
  return test_tensor_f32(2, shape, name);
}

static loom_tensor_t tensor1(int64_t n, const char *name) {
  return test_tensor_f32(1, &n, name);
}

// op(x)[i][j] of a row-major matrix stored as (rows, cols), transposed when t.
static double at(const float *x, int t, int64_t rows_op, int64_t cols_op, int64_t i, int64_t j) {
  return t ? (double)x[j * rows_op + i] : (double)x[i * cols_op + j];
}

// want = alpha * op(a) @ op(b) + beta * c0 + bias, in double; beta == 0 ignores c0.
static void ref_gemm(double *want, const float *a, int ta, const float *b, int tb,
                     const float *bias, const float *c0, float alpha, float beta, int64_t M,
                     int64_t N, int64_t K) {
  for (int64_t i = 0; i < M; i++) {
    for (int64_t j = 0; j < N; j++) {
      double s = 0.0;
      for (int64_t k = 0; k < K; k++) {
        s += at(a, ta, M, K, i, k) * at(b, tb, K, N, k, j);
      }
      double w = (double)alpha * s;
      if (beta != 0.0f) {
        w += (double)beta * (double)c0[i * N + j];
      }
      if (bias) {
        w += (double)bias[j];
      }
      want[i * N + j] = w;
    }
  }
}

static double gemm_atol(int64_t K, float alpha, float beta) {
  return 1e-6 * (double)(K + 1) * fmax(1.0, fabs((double)alpha)) + 1e-6 * (1.0 + fabs(beta));
}

// ---------------------------------------------------------------------------------------------
// gemm against the reference

static void gemm_case(test_rng_t *rng, int64_t M, int64_t N, int64_t K, int ta, int tb, float alpha,
                      float beta, int with_bias, int nan_c) {
  loom_tensor_t a = ta ? tensor2(K, M, "a") : tensor2(M, K, "a");
  loom_tensor_t b = tb ? tensor2(N, K, "b") : tensor2(K, N, "b");
  loom_tensor_t c = tensor2(M, N, "c"), bias = tensor1(N, "bias");
  test_fill_uniform(rng, test_floats(&a), M * K, -1, 1);
  test_fill_uniform(rng, test_floats(&b), K * N, -1, 1);
  test_fill_uniform(rng, test_floats(&bias), N, -1, 1);
  if (nan_c) {
    test_fill_value(test_floats(&c), M * N, NAN); // beta == 0 must not read c
  } else {
    test_fill_uniform(rng, test_floats(&c), M * N, -1, 1);
  }
  float *c0 = malloc(sizeof(float) * (size_t)(M * N + 1));
  double *want = malloc(sizeof(double) * (size_t)(M * N + 1));
  if (M * N > 0) {
    memcpy(c0, test_floats(&c), sizeof(float) * (size_t)(M * N));
  }
  ref_gemm(want, test_floats(&a), ta, test_floats(&b), tb, with_bias ? test_floats(&bias) : NULL,
           c0, alpha, beta, M, N, K);

  loom_status_t st = loom_gemm(&c, &a, ta, &b, tb, with_bias ? &bias : NULL, alpha, beta);
  char what[160];
  snprintf(what, sizeof what, "%s gemm M=%lld N=%lld K=%lld ta=%d tb=%d alpha=%g beta=%g bias=%d",
           gemm_kernel, (long long)M, (long long)N, (long long)K, ta, tb, alpha, beta, with_bias);
  CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error(NULL));
  CHECK(test_compare(what, test_floats(&c), want, M * N, gemm_atol(K, alpha, beta), 1e-5) == 0,
        "%s", what);
  free(c0);
  free(want);
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  loom_tensor_free(&bias);
}

static void test_gemm_reference(void) {
  test_rng_t rng = test_rng(1);
  // Sizes 1, odd, primes (37, 129 = 3 * 43, 257), around powers of two, empty, and none a
  // multiple of a BLAS tile; the last is big enough for OpenBLAS to use several threads.
  // The last three ({-1, -1, -1}) are drawn at random in 1..150.
  int64_t shapes[][3] = {{1, 1, 1},    {1, 1, 37},    {37, 1, 1},     {1, 37, 1},   {2, 3, 4},
                         {5, 7, 3},    {37, 129, 17}, {129, 37, 129}, {13, 1, 129}, {64, 65, 63},
                         {3, 5, 0},    {0, 5, 3},     {5, 0, 3},      {0, 0, 0},    {200, 300, 257},
                         {-1, -1, -1}, {-1, -1, -1},  {-1, -1, -1}};
  const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
  for (int s = 0; s < nshapes; s++) {
    for (int d = 0; d < 3; d++) {
      if (shapes[s][d] < 0) {
        shapes[s][d] = test_int(&rng, 1, 150);
      }
    }
  }
  static const struct {
    float alpha, beta;
    int bias, nan_c;
  } params[] = {{1.0f, 0.0f, 0, 0},
                {1.0f, 0.0f, 1, 1},
                {0.5f, 1.0f, 1, 0},
                {-2.0f, -0.75f, 0, 0},
                {1.5f, 0.0f, 1, 0}};
  for (int s = 0; s < nshapes; s++) {
    for (int t = 0; t < 4; t++) {
      for (size_t p = 0; p < sizeof params / sizeof params[0]; p++) {
        gemm_case(&rng, shapes[s][0], shapes[s][1], shapes[s][2], t & 1, t >> 1, params[p].alpha,
                  params[p].beta, params[p].bias, params[p].nan_c);
      }
    }
  }
}

// A (B, T, K) input times a (K, N) weight into a (B, T, N) output: leading dimensions flatten.
static void test_gemm_batched_3d(void) {
  test_rng_t rng = test_rng(2);
  int64_t B = 3, T = 7, K = 37, N = 11;
  int64_t xs[3] = {B, T, K}, ys[3] = {B, T, N};
  loom_tensor_t x = test_tensor_f32(3, xs, "x"), y = test_tensor_f32(3, ys, "y");
  loom_tensor_t w = tensor2(K, N, "w"), bias = tensor1(N, "bias");
  test_fill_uniform(&rng, test_floats(&x), B * T * K, -1, 1);
  test_fill_uniform(&rng, test_floats(&w), K * N, -1, 1);
  test_fill_uniform(&rng, test_floats(&bias), N, -1, 1);
  double *want = malloc(sizeof(double) * (size_t)(B * T * N));
  ref_gemm(want, test_floats(&x), 0, test_floats(&w), 0, test_floats(&bias), NULL, 1.0f, 0.0f,
           B * T, N, K);
  CHECK(loom_gemm(&y, &x, 0, &w, 0, &bias, 1.0f, 0.0f) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_compare("gemm (B,T,K)x(K,N)", test_floats(&y), want, B * T * N, gemm_atol(K, 1, 0),
                     1e-5) == 0,
        "3-D gemm");
  free(want);
  loom_tensor_free(&x);
  loom_tensor_free(&y);
  loom_tensor_free(&w);
  loom_tensor_free(&bias);
}

// K == 0: op(a) @ op(b) is zero, so c = beta * c + bias exactly; M or N == 0 is a no-op.
static void test_gemm_empty(void) {
  int64_t M = 3, N = 5;
  loom_tensor_t a = tensor2(M, 0, "a"), b = tensor2(0, N, "b"), c = tensor2(M, N, "c");
  loom_tensor_t bias = tensor1(N, "bias");
  for (int64_t j = 0; j < N; j++) {
    test_floats(&bias)[j] = (float)j - 1.5f;
  }
  test_fill_value(test_floats(&c), M * N, NAN);
  CHECK(loom_gemm(&c, &a, 0, &b, 0, &bias, 1.0f, 0.0f) == LOOM_OK, "%s", loom_last_error(NULL));
  int ok = 1;
  for (int64_t i = 0; i < M * N; i++) {
    ok &= test_floats(&c)[i] == test_floats(&bias)[i % N];
  }
  CHECK(ok, "K == 0, beta == 0: c should be the bias rows (NaN in c ignored)");

  for (int64_t i = 0; i < M * N; i++) {
    test_floats(&c)[i] = (float)i;
  }
  loom_tensor_t at = tensor2(0, M, "at"), bt = tensor2(N, 0, "bt"); // transposed storage
  CHECK(loom_gemm(&c, &at, 1, &bt, 1, NULL, 2.0f, 0.5f) == LOOM_OK, "%s", loom_last_error(NULL));
  ok = 1;
  for (int64_t i = 0; i < M * N; i++) {
    ok &= test_floats(&c)[i] == 0.5f * (float)i;
  }
  CHECK(ok, "K == 0, beta == 0.5: c should be scaled by beta");

  loom_tensor_t a0 = tensor2(0, 4, "a0"), b0 = tensor2(4, N, "b0"), c0 = tensor2(0, N, "c0");
  CHECK(loom_gemm(&c0, &a0, 0, &b0, 0, &bias, 1.0f, 0.0f) == LOOM_OK, "M == 0: %s",
        loom_last_error(NULL));
  loom_tensor_t b1 = tensor2(4, 0, "b1"), c1 = tensor2(0, 0, "c1");
  CHECK(loom_gemm(&c1, &a0, 0, &b1, 0, NULL, 1.0f, 0.0f) == LOOM_OK, "M == N == 0: %s",
        loom_last_error(NULL));
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  loom_tensor_free(&bias);
  loom_tensor_free(&a0);
  loom_tensor_free(&b0);
  loom_tensor_free(&c0);
  loom_tensor_free(&b1);
  loom_tensor_free(&c1);
  loom_tensor_free(&at);
  loom_tensor_free(&bt);
}

// The strided kernel on tiles of packed tensors (one head of (T, H, D), as attention uses it),
// writing into the middle of a wider matrix: elements outside the tile stay untouched.
static void test_gemm_strided_tiles(void) {
  test_rng_t rng = test_rng(3);
  const int64_t T = 37, H = 3, D = 13, ldc = 50, h = 1;
  float *q = malloc(sizeof(float) * (size_t)(T * H * D));
  float *k = malloc(sizeof(float) * (size_t)(T * H * D));
  float *s = malloc(sizeof(float) * (size_t)(T * ldc));
  double *want = malloc(sizeof(double) * (size_t)(T * ldc));
  test_fill_uniform(&rng, q, T * H * D, -1, 1);
  test_fill_uniform(&rng, k, T * H * D, -1, 1);
  for (int64_t i = 0; i < T * ldc; i++) {
    s[i] = -7.0f;
    want[i] = -7.0;
  }
  // S[:, 5:5+T] = 0.25 * Q_h @ K_h^T
  for (int64_t i = 0; i < T; i++) {
    for (int64_t j = 0; j < T; j++) {
      double acc = 0.0;
      for (int64_t d = 0; d < D; d++) {
        acc += (double)q[(i * H + h) * D + d] * (double)k[(j * H + h) * D + d];
      }
      want[i * ldc + 5 + j] = 0.25 * acc;
    }
  }
  loom_cpu_gemm_strided(0, 1, T, T, D, 0.25f, q + h * D, H * D, k + h * D, H * D, NULL, 0.0f, s + 5,
                        ldc);
  CHECK(test_compare("strided gemm tile", s, want, T * ldc, gemm_atol(D, 1, 0), 1e-5) == 0,
        "strided tile");
  free(q);
  free(k);
  free(s);
  free(want);
}

// ---------------------------------------------------------------------------------------------
// bias_backward

static void test_bias_backward(void) {
  test_rng_t rng = test_rng(4);
  const int64_t shapes[][3] = {{1, 1, 1},   {1, 37, 1}, {1, 1, 37}, {1, 129, 300},
                               {1, 5, 513}, {1, 0, 7},  {2, 3, 5},  {4, 33, 257}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t B = shapes[s][0], T = shapes[s][1], N = shapes[s][2], M = B * T;
    int64_t ds[3] = {B, T, N};
    loom_tensor_t dout = test_tensor_f32(3, ds, "dout"), dbias = tensor1(N, "dbias");
    test_fill_uniform(&rng, test_floats(&dout), M * N, -1, 1);
    test_fill_uniform(&rng, test_floats(&dbias), N, -1, 1);
    double *want = malloc(sizeof(double) * (size_t)N);
    for (int64_t j = 0; j < N; j++) {
      want[j] = (double)test_floats(&dbias)[j]; // accumulated: dbias += column sums
      for (int64_t i = 0; i < M; i++) {
        want[j] += (double)test_floats(&dout)[i * N + j];
      }
    }
    CHECK(loom_bias_backward(&dbias, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
    char what[96];
    snprintf(what, sizeof what, "bias_backward M=%lld N=%lld", (long long)M, (long long)N);
    CHECK(test_compare(what, test_floats(&dbias), want, N, 1e-6, 1e-6) == 0, "%s", what);
    free(want);
    loom_tensor_free(&dout);
    loom_tensor_free(&dbias);
  }
}

// ---------------------------------------------------------------------------------------------
// Linear layer: forward, backward through loom_gemm/loom_bias_backward, finite differences

typedef struct layer {
  int w_out_major; // 1: W is (Cout, Cin) and Y = X W^T + b; 0: W is (Cin, Cout) and Y = X W + b
  loom_tensor_t x, w, b, y, g; // x (B, T, Cin), y and g (B, T, Cout)
} layer_t;

static void layer_forward(layer_t *l) {
  loom_status_t st =
      loom_gemm(&l->y, &l->x, 0, &l->w, l->w_out_major, &l->b, 1.0f, 0.0f); // y = x op(w) + b
  CHECK(st == LOOM_OK, "forward: %s", loom_last_error(NULL));
}

// L = sum(y * g) in double.
static double layer_loss(layer_t *l) {
  layer_forward(l);
  return test_dot(test_floats(&l->y), test_floats(&l->g), loom_tensor_numel(&l->y));
}

// Central difference of the loss in up to `samples` entries of p (all when fewer); fills the
// entry indices and the differences.
static int64_t finite_diff(layer_t *l, float *p, int64_t n, test_rng_t *rng, int64_t samples,
                           int64_t *idx, double *fd) {
  int64_t m = n < samples ? n : samples;
  for (int64_t s = 0; s < m; s++) {
    int64_t i = n <= samples ? s : test_int(rng, 0, n - 1);
    float v = p[i];
    p[i] = v + FD_H;
    float xp = p[i];
    double lp = layer_loss(l);
    p[i] = v - FD_H;
    float xm = p[i];
    double lm = layer_loss(l);
    p[i] = v;
    idx[s] = i;
    fd[s] = (lp - lm) / ((double)xp - (double)xm);
  }
  return m;
}

static void layer_case(test_rng_t *rng, int w_out_major, int64_t B, int64_t T, int64_t Cin,
                       int64_t Cout) {
  const int64_t M = B * T;
  int64_t xs[3] = {B, T, Cin}, ys[3] = {B, T, Cout};
  layer_t l = {.w_out_major = w_out_major};
  l.x = test_tensor_f32(3, xs, "x");
  l.w = w_out_major ? tensor2(Cout, Cin, "w") : tensor2(Cin, Cout, "w");
  l.b = tensor1(Cout, "b");
  l.y = test_tensor_f32(3, ys, "y");
  l.g = test_tensor_f32(3, ys, "g");
  loom_tensor_t dx = test_tensor_f32(3, xs, "dx");
  loom_tensor_t dw = w_out_major ? tensor2(Cout, Cin, "dw") : tensor2(Cin, Cout, "dw");
  loom_tensor_t db = tensor1(Cout, "db");
  test_fill_uniform(rng, test_floats(&l.x), M * Cin, -1, 1);
  test_fill_uniform(rng, test_floats(&l.w), Cin * Cout, -1, 1);
  test_fill_uniform(rng, test_floats(&l.b), Cout, -1, 1);
  test_fill_uniform(rng, test_floats(&l.g), M * Cout, -1, 1);
  test_fill_value(test_floats(&dx), M * Cin, NAN);             // din is overwritten
  test_fill_uniform(rng, test_floats(&dw), Cin * Cout, -1, 1); // parameter gradients accumulate
  test_fill_uniform(rng, test_floats(&db), Cout, -1, 1);
  float *dw0 = malloc(sizeof(float) * (size_t)(Cin * Cout));
  float *db0 = malloc(sizeof(float) * (size_t)Cout);
  memcpy(dw0, test_floats(&dw), sizeof(float) * (size_t)(Cin * Cout));
  memcpy(db0, test_floats(&db), sizeof(float) * (size_t)Cout);

  layer_forward(&l);
  loom_status_t st;
  if (w_out_major) {
    st = loom_gemm(&dx, &l.g, 0, &l.w, 0, NULL, 1.0f, 0.0f); // dX = dY W
    CHECK(st == LOOM_OK, "dx: %s", loom_last_error(NULL));
    st = loom_gemm(&dw, &l.g, 1, &l.x, 0, NULL, 1.0f, 1.0f); // dW += dY^T X
  } else {
    st = loom_gemm(&dx, &l.g, 0, &l.w, 1, NULL, 1.0f, 0.0f); // dX = dY W^T
    CHECK(st == LOOM_OK, "dx: %s", loom_last_error(NULL));
    st = loom_gemm(&dw, &l.x, 1, &l.g, 0, NULL, 1.0f, 1.0f); // dW += X^T dY
  }
  CHECK(st == LOOM_OK, "dw: %s", loom_last_error(NULL));
  CHECK(loom_bias_backward(&db, &l.g) == LOOM_OK, "db: %s", loom_last_error(NULL));

  char what[160];
  snprintf(what, sizeof what, "linear %s B=%lld T=%lld Cin=%lld Cout=%lld",
           w_out_major ? "W(out,in)" : "W(in,out)", (long long)B, (long long)T, (long long)Cin,
           (long long)Cout);

  // Against the double reference: dX overwritten, dW and db accumulated onto their old values.
  double *ref = malloc(sizeof(double) * (size_t)(M * Cin + Cin * Cout + Cout));
  if (w_out_major) {
    ref_gemm(ref, test_floats(&l.g), 0, test_floats(&l.w), 0, NULL, NULL, 1, 0, M, Cin, Cout);
    ref_gemm(ref + M * Cin, test_floats(&l.g), 1, test_floats(&l.x), 0, NULL, dw0, 1, 1, Cout, Cin,
             M);
  } else {
    ref_gemm(ref, test_floats(&l.g), 0, test_floats(&l.w), 1, NULL, NULL, 1, 0, M, Cin, Cout);
    ref_gemm(ref + M * Cin, test_floats(&l.x), 1, test_floats(&l.g), 0, NULL, dw0, 1, 1, Cin, Cout,
             M);
  }
  for (int64_t j = 0; j < Cout; j++) {
    double s = db0[j];
    for (int64_t i = 0; i < M; i++) {
      s += (double)test_floats(&l.g)[i * Cout + j];
    }
    ref[M * Cin + Cin * Cout + j] = s;
  }
  CHECK(test_compare("dX vs reference", test_floats(&dx), ref, M * Cin, gemm_atol(Cout, 1, 0),
                     1e-5) == 0,
        "%s", what);
  CHECK(test_compare("dW += vs reference", test_floats(&dw), ref + M * Cin, Cin * Cout,
                     gemm_atol(M, 1, 1), 1e-5) == 0,
        "%s", what);
  CHECK(test_compare("db += vs reference", test_floats(&db), ref + M * Cin + Cin * Cout, Cout, 1e-6,
                     1e-6) == 0,
        "%s", what);

  // Against central differences of the float forward.
  enum { SAMPLES = 24 };
  int64_t idx[SAMPLES];
  double fd[SAMPLES] = {0};
  float an[SAMPLES] = {0};
  struct {
    const char *name;
    float *p, *grad, *grad0;
    int64_t n;
  } params[] = {{"dX (finite differences)", test_floats(&l.x), test_floats(&dx), NULL, M * Cin},
                {"dW (finite differences)", test_floats(&l.w), test_floats(&dw), dw0, Cin * Cout},
                {"db (finite differences)", test_floats(&l.b), test_floats(&db), db0, Cout}};
  for (int p = 0; p < 3; p++) {
    int64_t m = finite_diff(&l, params[p].p, params[p].n, rng, SAMPLES, idx, fd);
    for (int64_t s = 0; s < m; s++) {
      int64_t i = idx[s];
      an[s] = params[p].grad0 ? params[p].grad[i] - params[p].grad0[i] : params[p].grad[i];
    }
    CHECK(test_compare(params[p].name, an, fd, m, FD_ATOL, FD_RTOL) == 0, "%s", what);
  }

  free(ref);
  free(dw0);
  free(db0);
  loom_tensor_free(&l.x);
  loom_tensor_free(&l.w);
  loom_tensor_free(&l.b);
  loom_tensor_free(&l.y);
  loom_tensor_free(&l.g);
  loom_tensor_free(&dx);
  loom_tensor_free(&dw);
  loom_tensor_free(&db);
}

static void test_linear_layer_grad(void) {
  test_rng_t rng = test_rng(5);
  const int64_t shapes[][4] = {
      {1, 1, 1, 1}, {2, 3, 5, 7}, {3, 7, 37, 13}, {2, 5, 129, 3}, {1, 1, 17, 129}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    for (int layout = 0; layout < 2; layout++) {
      layer_case(&rng, layout, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: each fails with a message and leaves every output untouched.

static void test_gemm_bad_args(void) {
  static const char op[] = "loom_gemm";
  float buf[64];
  for (int i = 0; i < 64; i++) {
    buf[i] = 7.0f;
  }
  loom_tensor_t a = tensor2(4, 3, "a"), b = tensor2(3, 5, "b"), c = tensor2(4, 5, "c");
  loom_tensor_t bias = tensor1(5, "bias");
  loom_tensor_fill(&a, 1.0);
  loom_tensor_fill(&b, 1.0);
  loom_tensor_fill(&c, 7.0);
  loom_tensor_t b_k4 = tensor2(4, 5, "b_k4"), a_m6 = tensor2(6, 3, "a_m6");
  loom_tensor_t b_n6 = tensor2(3, 6, "b_n6"), bias4 = tensor1(4, "bias4");
  loom_tensor_t bias_2d = tensor2(1, 5, "bias_2d");

  EXPECT_FAIL(loom_gemm(NULL, &a, 0, &b, 0, NULL, 1, 0), op, "c is NULL");
  EXPECT_FAIL(loom_gemm(&c, NULL, 0, &b, 0, NULL, 1, 0), op, "a is NULL");
  EXPECT_FAIL(loom_gemm(&c, &a, 0, NULL, 0, NULL, 1, 0), op, "b is NULL");
  EXPECT_FAIL(loom_gemm(&c, &a, 0, &b_k4, 0, NULL, 1, 0), op, "(4, 5)");  // K: 3 vs 4
  EXPECT_FAIL(loom_gemm(&c, &a, 1, &b, 0, NULL, 1, 0), op, "transposed"); // op(a) is (3, 4)
  EXPECT_FAIL(loom_gemm(&c, &a, 0, &b, 1, NULL, 1, 0), op, "transposed"); // op(b) is (5, 3)
  EXPECT_FAIL(loom_gemm(&c, &a_m6, 0, &b, 0, NULL, 1, 0), op, "(6, 3)");  // M: 4 vs 6
  EXPECT_FAIL(loom_gemm(&c, &a, 0, &b_n6, 0, NULL, 1, 0), op, "(3, 6)");  // N: 5 vs 6
  EXPECT_FAIL(loom_gemm(&c, &a, 0, &b, 0, &bias4, 1, 0), op, "bias (4)");
  EXPECT_FAIL(loom_gemm(&c, &a, 0, &b, 0, &bias_2d, 1, 0), op, "bias (1, 5)");

  // Wrong dtypes: the same memory described as bf16 or i32.
  loom_tensor_t a_bf16, c_i32;
  loom_tensor_wrap(&a_bf16, a.data, LOOM_BF16, LOOM_DEVICE_HOST, 2, a.shape, "a_bf16");
  loom_tensor_wrap(&c_i32, c.data, LOOM_I32, LOOM_DEVICE_HOST, 2, c.shape, "c_i32");
  EXPECT_FAIL(loom_gemm(&c, &a_bf16, 0, &b, 0, NULL, 1, 0), op, "bf16");
  EXPECT_FAIL(loom_gemm(&c_i32, &a, 0, &b, 0, NULL, 1, 0), op, "i32");

  // A "CUDA" tensor (host memory labelled device 0): unsupported as the first tensor, a device
  // mismatch as any other.
  loom_tensor_t c_dev = c, a_dev = a;
  c_dev.device = 0;
  a_dev.device = 0;
  EXPECT_FAIL_DEVICE(loom_gemm(&c_dev, &a, 0, &b, 0, NULL, 1, 0), op, "c");
  EXPECT_FAIL(loom_gemm(&c, &a_dev, 0, &b, 0, NULL, 1, 0), op, "cuda:0");

  // Negative extent, no dimension.
  loom_tensor_t a_neg = a, c_scalar = c;
  a_neg.shape[0] = -4;
  c_scalar.ndim = 0;
  EXPECT_FAIL(loom_gemm(&c, &a_neg, 0, &b, 0, NULL, 1, 0), op, "negative");
  EXPECT_FAIL(loom_gemm(&c_scalar, &a, 0, &b, 0, NULL, 1, 0), op, "dimension");

  // Extents beyond BLAS's int (never dereferenced: the check comes first).
  int64_t huge_a[2] = {1, (int64_t)INT_MAX + 1}, huge_b[2] = {(int64_t)INT_MAX + 1, 5};
  loom_tensor_t a_huge, b_huge;
  loom_tensor_wrap(&a_huge, buf, LOOM_F32, LOOM_DEVICE_HOST, 2, huge_a, "a_huge");
  loom_tensor_wrap(&b_huge, buf, LOOM_F32, LOOM_DEVICE_HOST, 2, huge_b, "b_huge");
  loom_tensor_t c1 = tensor2(1, 5, "c1");
  loom_tensor_fill(&c1, 7.0);
  EXPECT_FAIL(loom_gemm(&c1, &a_huge, 0, &b_huge, 0, NULL, 1, 0), op, "INT_MAX");
  CHECK(test_all_equal(test_floats(&c1), 5, 7.0f), "c1 written by a failed call");

  // The output sharing memory with an input.
  int64_t s43[2] = {4, 3}, s45[2] = {4, 5}, s35[2] = {3, 5};
  loom_tensor_t a_buf, b_buf, c_buf;
  loom_tensor_wrap(&a_buf, buf, LOOM_F32, LOOM_DEVICE_HOST, 2, s43, "a_buf");
  loom_tensor_wrap(&b_buf, buf + 20, LOOM_F32, LOOM_DEVICE_HOST, 2, s35, "b_buf");
  loom_tensor_wrap(&c_buf, buf + 8, LOOM_F32, LOOM_DEVICE_HOST, 2, s45, "c_buf");
  EXPECT_FAIL(loom_gemm(&c_buf, &a_buf, 0, &b, 0, NULL, 1, 0), op, "overlap");
  EXPECT_FAIL(loom_gemm(&c_buf, &a, 0, &b_buf, 0, NULL, 1, 0), op, "overlap");
  CHECK(test_all_equal(buf, 64, 7.0f), "buffer written by a failed call");
  CHECK(test_all_equal(test_floats(&c), 20, 7.0f), "c written by a failed call");

  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  loom_tensor_free(&c1);
  loom_tensor_free(&bias);
  loom_tensor_free(&b_k4);
  loom_tensor_free(&a_m6);
  loom_tensor_free(&b_n6);
  loom_tensor_free(&bias4);
  loom_tensor_free(&bias_2d);
}

static void test_bias_backward_bad_args(void) {
  static const char op[] = "loom_bias_backward";
  loom_tensor_t dout = tensor2(3, 5, "dout"), dbias = tensor1(5, "dbias");
  loom_tensor_t dbias4 = tensor1(4, "dbias4"), dbias_2d = tensor2(1, 5, "dbias_2d");
  loom_tensor_fill(&dout, 1.0);
  loom_tensor_fill(&dbias, 7.0);
  loom_tensor_fill(&dbias4, 7.0);
  loom_tensor_fill(&dbias_2d, 7.0);
  loom_tensor_t dout_bf16;
  loom_tensor_wrap(&dout_bf16, dout.data, LOOM_BF16, LOOM_DEVICE_HOST, 2, dout.shape, "dout_bf16");
  loom_tensor_t dbias_dev = dbias, dout_dev = dout;
  dbias_dev.device = 0;
  dout_dev.device = 0;
  loom_tensor_t dbias_alias;
  loom_tensor_wrap(&dbias_alias, dout.data, LOOM_F32, LOOM_DEVICE_HOST, 1, dbias.shape, "alias");

  EXPECT_FAIL(loom_bias_backward(NULL, &dout), op, "dbias is NULL");
  EXPECT_FAIL(loom_bias_backward(&dbias, NULL), op, "dout is NULL");
  EXPECT_FAIL(loom_bias_backward(&dbias4, &dout), op, "(3, 5)");
  EXPECT_FAIL(loom_bias_backward(&dbias_2d, &dout), op, "(1, 5)");
  EXPECT_FAIL(loom_bias_backward(&dbias, &dout_bf16), op, "bf16");
  EXPECT_FAIL_DEVICE(loom_bias_backward(&dbias_dev, &dout), op, "dbias");
  EXPECT_FAIL(loom_bias_backward(&dbias, &dout_dev), op, "cuda:0");
  EXPECT_FAIL(loom_bias_backward(&dbias_alias, &dout), op, "overlap");
  CHECK(test_all_equal(test_floats(&dbias), 5, 7.0f) &&
            test_all_equal(test_floats(&dbias4), 4, 7.0f) &&
            test_all_equal(test_floats(&dbias_2d), 5, 7.0f) &&
            test_all_equal(test_floats(&dout), 15, 1.0f),
        "a failed call wrote its output");
  loom_tensor_free(&dout);
  loom_tensor_free(&dbias);
  loom_tensor_free(&dbias4);
  loom_tensor_free(&dbias_2d);
}

// loom's kernel where its blocking shows: M past MC (96) with a partial micro-tile, N past the
// packed width (1024) with a partial panel, K past KC (256) so that c is added to block by
// block, row strides wider than the rows, and the same bits on a second call.
static void test_gemm_loom_blocks(void) {
  test_rng_t rng = test_rng(9);
  const int64_t M = 101, N = 1041, K = 521, lda = K + 3, ldb_n = N + 5, ldb_t = K + 7, ldc = N + 2;
  float *a = malloc(sizeof(float) * (size_t)(M * lda));
  float *b_n = malloc(sizeof(float) * (size_t)(K * ldb_n)); // (K, N), exactly: ASan sees overruns
  float *b_t = malloc(sizeof(float) * (size_t)(N * ldb_t)); // (N, K)
  float *bias = malloc(sizeof(float) * (size_t)N), *c = malloc(sizeof(float) * (size_t)(M * ldc));
  float *c2 = malloc(sizeof(float) * (size_t)(M * ldc)),
        *c0 = malloc(sizeof(float) * (size_t)(M * N));
  double *want = malloc(sizeof(double) * (size_t)(M * N));
  test_fill_uniform(&rng, a, M * lda, -1, 1);
  test_fill_uniform(&rng, b_n, K * ldb_n, -1, 1);
  test_fill_uniform(&rng, b_t, N * ldb_t, -1, 1);
  test_fill_uniform(&rng, bias, N, -1, 1);
  for (int tb = 0; tb < 2; tb++) {
    const int64_t ldb = tb ? ldb_t : ldb_n;
    const float *b = tb ? b_t : b_n;
    for (int with_beta = 0; with_beta < 2; with_beta++) {
      const float alpha = with_beta ? 0.5f : 1.0f, beta = with_beta ? -1.25f : 0.0f;
      test_fill_uniform(&rng, c, M * ldc, -1, 1);
      for (int64_t i = 0; i < M; i++) {
        memcpy(c0 + i * N, c + i * ldc, sizeof(float) * (size_t)N);
      }
      memcpy(c2, c, sizeof(float) * (size_t)(M * ldc));
      for (int64_t i = 0; i < M; i++) { // the reference on the strided operands
        for (int64_t j = 0; j < N; j++) {
          double sum = 0.0;
          for (int64_t k = 0; k < K; k++) {
            sum += (double)a[i * lda + k] * (double)(tb ? b[j * ldb + k] : b[k * ldb + j]);
          }
          want[i * N + j] = (double)alpha * sum + (double)beta * c0[i * N + j] + bias[j];
        }
      }
      char what[96];
      snprintf(what, sizeof what, "loom kernel blocks tb=%d beta=%g", tb, beta);
      CHECK(loom_cpu_gemm_avx2(tb, M, N, K, alpha, a, lda, b, ldb, bias, beta, c, ldc) == 0,
            "%s: packing buffer", what);
      int bad = 0;
      for (int64_t i = 0; i < M && !bad; i++) {
        bad = test_compare(what, c + i * ldc, want + i * N, N, gemm_atol(K, alpha, beta), 1e-5);
        for (int64_t j = N; j < ldc && !bad; j++) { // the gap between rows is not c's
          bad = memcmp(&c[i * ldc + j], &c2[i * ldc + j], sizeof(float)) != 0;
        }
      }
      CHECK(!bad, "%s: values, or the gap between c's rows was written", what);
      CHECK(loom_cpu_gemm_avx2(tb, M, N, K, alpha, a, lda, b, ldb, bias, beta, c2, ldc) == 0 &&
                memcmp(c, c2, sizeof(float) * (size_t)(M * ldc)) == 0,
            "%s: a second call gave other bits", what);
    }
  }
  free(a), free(b_n), free(b_t), free(bias), free(c), free(c2), free(c0), free(want);
}

// Which kernel loom_cpu_gemm picks under each mode (auto, before loom_init, by its rule).
static void test_gemm_dispatch(void) {
  const int ok = loom_cpu_gemm_avx2_ok();
  loom_gemm_mode_set(LOOM_GEMM_MODE_BLAS);
  CHECK(!loom_cpu_gemm_uses_loom(0, 4096, 1.0f), "LOOM_GEMM=blas picked loom's kernel");
  loom_gemm_mode_set(LOOM_GEMM_MODE_LOOM);
  CHECK(loom_cpu_gemm_uses_loom(0, 4096, 1.0f) == ok,
        "LOOM_GEMM=loom: loom's kernel runs exactly where the CPU has AVX2 and FMA");
  CHECK(!loom_cpu_gemm_uses_loom(1, 4096, 1.0f), "a transposed a went to loom's kernel");
  CHECK(!loom_cpu_gemm_uses_loom(0, 4096, 0.0f), "alpha == 0 went to loom's kernel");
  loom_gemm_mode_set(LOOM_GEMM_MODE_AUTO);
  const int want = ok && loom_blas_core_is_avx2(loom_blas_core()) && loom_blas_threads_now() == 1;
  CHECK(loom_gemm_auto_picks_loom(loom_blas_threads_now()) == want &&
            loom_cpu_gemm_uses_loom(0, 4096, 1.0f) == want,
        "LOOM_GEMM=auto with OpenBLAS core %s on %d thread(s): expected %s", loom_blas_core(),
        loom_blas_threads_now(), want ? "loom's kernel" : "the BLAS");
  CHECK(!loom_gemm_auto_picks_loom(2), "auto picked loom's kernel for a 2-thread BLAS");
  CHECK(!loom_cpu_gemm_uses_loom(0, LOOM_GEMM_AUTO_MIN_ROWS - 1, 1.0f) &&
            loom_cpu_gemm_uses_loom(0, LOOM_GEMM_AUTO_MIN_ROWS, 1.0f) == want,
        "LOOM_GEMM=auto: loom's kernel from %d rows only", LOOM_GEMM_AUTO_MIN_ROWS);
  loom_gemm_mode_set(LOOM_GEMM_MODE_LOOM);
  CHECK(loom_cpu_gemm_uses_loom(0, 1, 1.0f) == ok, "LOOM_GEMM=loom: a 1-row product on the BLAS");
  loom_gemm_mode_set(LOOM_GEMM_MODE_AUTO);
}

// loom's kernel: a row's bits do not depend on the other rows of its product, nor a column's on
// the other columns (edge tiles round as full ones); alpha == 0 leaves Inf and NaN in a out.
static void test_gemm_loom_independent(void) {
  test_rng_t rng = test_rng(10);
  const int64_t M = 13, N = 40, K = 300;
  float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(N * K));
  float *bias = malloc(sizeof(float) * (size_t)N), *c = malloc(sizeof(float) * (size_t)(M * N));
  float *part = malloc(sizeof(float) * (size_t)(M * N));
  test_fill_uniform(&rng, a, M * K, -1, 1);
  test_fill_uniform(&rng, b, N * K, -1, 1);
  test_fill_uniform(&rng, bias, N, -1, 1);
  CHECK(loom_cpu_gemm_avx2(1, M, N, K, 1.0f, a, K, b, K, bias, 0.0f, c, N) == 0, "full product");
  int rows_same = 1, cols_same = 1;
  for (int64_t i = 0; i < M; i++) { // row i alone: an edge tile of one row
    CHECK(loom_cpu_gemm_avx2(1, 1, N, K, 1.0f, a + i * K, K, b, K, bias, 0.0f, part + i * N, N) ==
              0,
          "row %lld", (long long)i);
  }
  rows_same = memcmp(c, part, sizeof(float) * (size_t)(M * N)) == 0;
  // Columns [0, 7) and [7, 40): partial panels against the full product's panels.
  CHECK(loom_cpu_gemm_avx2(1, M, 7, K, 1.0f, a, K, b, K, bias, 0.0f, part, N) == 0 &&
            loom_cpu_gemm_avx2(1, M, N - 7, K, 1.0f, a, K, b + 7 * K, K, bias + 7, 0.0f, part + 7,
                               N) == 0,
        "column slices");
  cols_same = memcmp(c, part, sizeof(float) * (size_t)(M * N)) == 0;
  CHECK(rows_same, "a row computed alone differs in bits from the same row in a 13-row product");
  CHECK(cols_same, "columns computed in two slices differ in bits from the whole product");
  // alpha == 0 through the dispatch: c = beta * c + bias, the Inf in a never multiplied.
  loom_gemm_mode_set(LOOM_GEMM_MODE_LOOM);
  a[3] = INFINITY;
  test_fill_value(c, M * N, 2.0f);
  loom_cpu_gemm_strided(0, 1, M, N, K, 0.0f, a, K, b, K, bias, 0.5f, c, N);
  int finite = 1;
  for (int64_t i = 0; i < M * N; i++) {
    finite &= c[i] == 1.0f + bias[i % N];
  }
  CHECK(finite, "alpha == 0 with an Inf in a: c should be 0.5 * c + bias");
  loom_gemm_mode_set(LOOM_GEMM_MODE_AUTO);
  free(a), free(b), free(bias), free(c), free(part);
}

// loom_gemm_residual: the bits of copying the residual into c and loom_gemm(alpha 1, beta 1),
// with the residual apart from c (left unchanged) and as c itself, across the kernel's blocking
// edges (N past 1024, K past 256) and every transpose; K == 0 gives residual + bias exactly.
static void residual_case(test_rng_t *rng, int64_t M, int64_t N, int64_t K, int ta, int tb,
                          int with_bias) {
  loom_tensor_t a = ta ? tensor2(K, M, "a") : tensor2(M, K, "a");
  loom_tensor_t b = tb ? tensor2(N, K, "b") : tensor2(K, N, "b");
  loom_tensor_t res = tensor2(M, N, "res"), c = tensor2(M, N, "c"), c2 = tensor2(M, N, "c2");
  loom_tensor_t bias = tensor1(N, "bias");
  test_fill_uniform(rng, test_floats(&a), M * K, -1, 1);
  test_fill_uniform(rng, test_floats(&b), K * N, -1, 1);
  test_fill_uniform(rng, test_floats(&bias), N, -1, 1);
  test_fill_uniform(rng, test_floats(&res), M * N, -1, 1);
  test_fill_value(test_floats(&c), M * N, NAN); // overwritten: never read
  const size_t bytes = sizeof(float) * (size_t)(M * N);
  float *res0 = malloc(bytes + 1);
  memcpy(res0, test_floats(&res), bytes);
  char what[160];
  snprintf(what, sizeof what, "%s gemm_residual M=%lld N=%lld K=%lld ta=%d tb=%d bias=%d",
           gemm_kernel, (long long)M, (long long)N, (long long)K, ta, tb, with_bias);
  const loom_tensor_t *bp = with_bias ? &bias : NULL;
  loom_status_t st = loom_gemm_residual(&c, &a, ta, &b, tb, bp, &res);
  CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error(NULL));
  memcpy(test_floats(&c2), res0, bytes); // the unfused pair
  CHECK(loom_gemm(&c2, &a, ta, &b, tb, bp, 1.0f, 1.0f) == LOOM_OK, "%s: loom_gemm", what);
  CHECK(memcmp(test_floats(&c), test_floats(&c2), bytes) == 0,
        "%s: bits differ from the copy and loom_gemm(beta 1)", what);
  CHECK(memcmp(test_floats(&res), res0, bytes) == 0, "%s: the residual was written", what);
  if (K == 0) {
    int exact = 1;
    for (int64_t i = 0; i < M * N; i++) {
      exact &= test_floats(&c)[i] == res0[i] + (with_bias ? test_floats(&bias)[i % N] : 0.0f);
    }
    CHECK(exact, "%s: K == 0 should give residual + bias exactly", what);
  }
  memcpy(test_floats(&c), res0, bytes); // in place: the residual is c
  st = loom_gemm_residual(&c, &a, ta, &b, tb, bp, &c);
  CHECK(st == LOOM_OK && memcmp(test_floats(&c), test_floats(&c2), bytes) == 0,
        "%s: in place (residual is c) differs: %s", what, loom_last_error(NULL));
  free(res0);
  loom_tensor_free(&a), loom_tensor_free(&b), loom_tensor_free(&res), loom_tensor_free(&c);
  loom_tensor_free(&c2), loom_tensor_free(&bias);
}

static void test_gemm_residual(void) {
  test_rng_t rng = test_rng(11);
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      residual_case(&rng, 13, 40, 300, ta, tb, 1);
      residual_case(&rng, 7, 5, 0, ta, tb, tb);
    }
  }
  residual_case(&rng, 101, 1041, 521, 0, 1, 1); // two N blocks, three K blocks
  residual_case(&rng, 101, 1041, 521, 0, 0, 0);
  residual_case(&rng, 600, 64, 256, 0, 1, 1); // 600 rows (train_gpt-like: many MC blocks)
}

// loom_gemm_residual's own refusals (loom_gemm's checks are shared): a NULL, misshapen or
// partly overlapping residual; c is left as it was.
static void test_gemm_residual_bad_args(void) {
  static const char op[] = "loom_gemm_residual";
  const int64_t M = 4, N = 5, K = 3;
  loom_tensor_t a = tensor2(M, K, "a"), b = tensor2(K, N, "b");
  loom_tensor_t big = tensor2(M + 1, N, "big"), r45 = tensor2(N, M, "r54");
  loom_tensor_fill(&a, 1.0);
  loom_tensor_fill(&b, 1.0);
  loom_tensor_fill(&big, 7.0);
  loom_tensor_fill(&r45, 1.0);
  int64_t shape[2] = {M, N};
  loom_tensor_t c, shifted; // c is big's first M rows; shifted starts one row further
  CHECK(loom_tensor_wrap(&c, big.data, LOOM_F32, LOOM_DEVICE_HOST, 2, shape, "c") == LOOM_OK &&
            loom_tensor_wrap(&shifted, test_floats(&big) + N, LOOM_F32, LOOM_DEVICE_HOST, 2, shape,
                             "shifted") == LOOM_OK,
        "wrap");
  EXPECT_FAIL(loom_gemm_residual(&c, &a, 0, &b, 0, NULL, NULL), op, "residual is NULL");
  EXPECT_FAIL(loom_gemm_residual(&c, &a, 0, &b, 0, NULL, &r45), op, "expected residual (4, 5)");
  EXPECT_FAIL(loom_gemm_residual(&c, &a, 0, &b, 0, NULL, &shifted), op, "overlap");
  EXPECT_FAIL(loom_gemm_residual(&c, &a, 0, &b, 1, NULL, &c), op, "transposed"); // loom_gemm's
  int untouched = 1;
  for (int64_t i = 0; i < (M + 1) * N; i++) {
    untouched &= test_floats(&big)[i] == 7.0f;
  }
  CHECK(untouched, "%s: a refused call wrote c", op);
  loom_tensor_free(&a), loom_tensor_free(&b), loom_tensor_free(&big), loom_tensor_free(&r45);
}

// loom_gemm_rate on the host: both kernels timed where loom's runs, best the faster; a NULL
// result and a count of products outside 1..1000 are refused.
static void test_gemm_rate(void) {
  for (int mode = LOOM_GEMM_MODE_BLAS; mode <= LOOM_GEMM_MODE_LOOM; mode++) {
    loom_gemm_mode_set(mode);
    loom_gemm_rate_t r;
    loom_status_t st = loom_gemm_rate(LOOM_DEVICE_HOST, 2, &r);
    CHECK(st == LOOM_OK, "loom_gemm_rate: %s", loom_last_error(NULL));
    const int loom_runs = loom_cpu_gemm_uses_loom(0, 1024, 1.0f);
    CHECK(r.blas > 1e8 && (loom_runs ? r.loom > 1e8 : r.loom == 0.0),
          "mode %d: blas %g, loom %g FLOP/s (loom's kernel %s here)", mode, r.blas, r.loom,
          loom_runs ? "runs" : "does not run");
    CHECK(r.best == (r.blas > r.loom ? r.blas : r.loom), "best %g is not max(%g, %g)", r.best,
          r.blas, r.loom);
  }
  loom_gemm_mode_set(LOOM_GEMM_MODE_AUTO);
  CHECK(loom_gemm_rate(LOOM_DEVICE_HOST, 10, NULL) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "rate is NULL"),
        "a NULL rate: %s", loom_last_error(NULL));
  const int bad_reps[2] = {0, 1001};
  for (int i = 0; i < 2; i++) {
    loom_gemm_rate_t r = {1.0, 1.0, 1.0};
    loom_status_t st = loom_gemm_rate(LOOM_DEVICE_HOST, bad_reps[i], &r);
    CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "time 1 to 1000 products") &&
              r.best == 0.0 && r.blas == 0.0 && r.loom == 0.0,
          "reps %d: status %d, '%s', best %g", bad_reps[i], (int)st, loom_last_error(NULL), r.best);
  }
}

// Every gemm test under one LOOM_GEMM mode.
static void gemm_tests(int mode, const char *name) {
  loom_gemm_mode_set(mode);
  gemm_kernel = name;
  test_gemm_reference();
  test_gemm_batched_3d();
  test_gemm_empty();
  test_gemm_strided_tiles();
  test_linear_layer_grad();
  test_gemm_residual();
  loom_gemm_mode_set(LOOM_GEMM_MODE_AUTO);
}

int main(void) {
  gemm_tests(LOOM_GEMM_MODE_BLAS, "blas");
  if (loom_cpu_gemm_avx2_ok()) {
    gemm_tests(LOOM_GEMM_MODE_LOOM, "loom");
    test_gemm_loom_blocks();
    test_gemm_loom_independent();
  } else {
    printf("test_ops_linear: this CPU lacks AVX2 or FMA: loom's kernel not tested\n");
  }
  test_gemm_dispatch();
  test_gemm_rate();
  test_bias_backward();
  test_gemm_bad_args();
  test_gemm_residual_bad_args();
  test_bias_backward_bad_args();
  return check_exit("test_ops_linear");
}
