/* test_ops_activation.c — loom_gelu_* and loom_softmax_* against double-precision references on
 * odd and batched shapes and extreme inputs, in place, finite differences, the saved-derivative
 * GELU pair against the plain one bit for bit, guards around every output, bad arguments. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// Tolerances (float kernels against double references):
// - gelu forward: atol 1e-6, rtol 1e-5. tanhf is within ~2 ulp; for x < 0 the 1 + tanh term
//   cancels, which turns that into an absolute error <= 0.5 |x| * 1.2e-7 (< 4e-7 for |x| <= 6).
// - gelu backward: atol 2e-6, rtol 1e-5. For x in about -5..-2 the two terms of gelu' nearly
//   cancel, and tanhf's absolute error near -1 (~6e-8) is multiplied by 0.5 |x| k (1 + 3 c x^2)
//   (up to ~5): errors up to ~6e-7 are inherent to a float tanh.
// - softmax forward: atol 1e-7, rtol 1e-5. Each output is expf(x - max) (<= 1 ulp, plus the
//   rounding of x - max, <= 5e-7 relative for |x - max| <= 16) times 1 / sum (sum in double).
// - softmax backward: atol 2e-7, rtol 1e-5 (dot product in double; dout - dot cancels in float).
// - finite differences of the float forward (h = 1e-2, loss L = sum(out * w) in double):
//   truncation h^2 / 6 * |f'''| (<= ~4e-5 here) plus output rounding / 2h (~1e-5):
//   gelu atol 2e-4, rtol 2e-3; softmax atol 1e-4, rtol 2e-3.

#define FD_H 1e-2f
#define PI   3.14159265358979323846

// ---------------------------------------------------------------------------------------------
// Helpers

// Shapes shared by the tests: ndim then extents (sizes 1, odd, primes, batched (B, T, C)).
static const int64_t shapes[][5] = {{1, 1},      {1, 37},        {2, 1, 1},     {2, 37, 1},
                                    {2, 5, 129}, {3, 2, 3, 5},   {3, 3, 7, 37}, {2, 2, 1000},
                                    {2, 129, 2}, {4, 2, 1, 3, 7}};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static loom_tensor_t shaped(int s, const char *name) {
  return test_tensor_f32((int)shapes[s][0], &shapes[s][1], name);
}

// L = sum(forward(in) * w): central differences in up to SAMPLES entries of in (all of them when
// fewer, else drawn from rng) against din, the backward with dout = w. in is restored.
typedef loom_status_t (*forward_fn)(loom_tensor_t *out, const loom_tensor_t *in);

static void check_finite_diff(const char *what, test_rng_t *rng, forward_fn forward,
                              loom_tensor_t *in, loom_tensor_t *out, const loom_tensor_t *w,
                              const loom_tensor_t *din, double atol, double rtol) {
  enum { SAMPLES = 64 };
  float *x = test_floats(in);
  int64_t n = loom_tensor_numel(in), m = n < SAMPLES ? n : SAMPLES;
  double fd[SAMPLES] = {0};
  float an[SAMPLES] = {0};
  for (int64_t k = 0; k < m; k++) {
    int64_t i = n <= SAMPLES ? k : test_int(rng, 0, n - 1);
    float v = x[i];
    double loss[2], xv[2];
    for (int side = 0; side < 2; side++) {
      x[i] = side ? v - FD_H : v + FD_H;
      xv[side] = x[i];
      CHECK(forward(out, in) == LOOM_OK, "%s", loom_last_error(NULL));
      loss[side] = test_dot(test_floats(out), test_floats(w), n);
    }
    x[i] = v;
    fd[k] = (loss[0] - loss[1]) / (xv[0] - xv[1]);
    an[k] = test_floats(din)[i];
  }
  CHECK(test_compare(what, an, fd, m, atol, rtol) == 0, "%s", what);
}

// ---------------------------------------------------------------------------------------------
// GELU

static double ref_gelu(double x) {
  const double k = sqrt(2.0 / PI), c = 0.044715;
  return 0.5 * x * (1.0 + tanh(k * (x + c * x * x * x)));
}

static double ref_gelu_grad(double x) {
  const double k = sqrt(2.0 / PI), c = 0.044715;
  double t = tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}

// Uniform in [-6, 6], with some extreme values sprinkled in where there is room.
static void fill_gelu_inputs(test_rng_t *rng, float *x, int64_t n) {
  static const float special[] = {0.0f,   -0.0f, 1e-8f,  -1e-8f, 10.0f,  -10.0f, 30.0f,
                                  -30.0f, 1e10f, -1e10f, 1e20f,  -1e20f, 3e38f,  -3e38f};
  test_fill_uniform(rng, x, n, -6, 6);
  for (int64_t i = 0; i < n && n >= 100 && i < (int64_t)(sizeof special / sizeof special[0]); i++) {
    x[test_int(rng, 0, n - 1)] = special[i];
  }
}

static void test_gelu_reference(void) {
  test_rng_t rng = test_rng(11);
  for (int s = 0; s < NSHAPES; s++) {
    loom_tensor_t in = shaped(s, "in"), out = shaped(s, "out"), dout = shaped(s, "dout");
    loom_tensor_t din = shaped(s, "din");
    int64_t n = loom_tensor_numel(&in);
    fill_gelu_inputs(&rng, test_floats(&in), n);
    test_fill_uniform(&rng, test_floats(&dout), n, -1, 1);
    test_fill_value(test_floats(&out), n, NAN);
    test_fill_value(test_floats(&din), n, NAN);
    double *want = malloc(sizeof(double) * (size_t)n);
    double *want_d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
      want[i] = ref_gelu((double)test_floats(&in)[i]);
      want_d[i] = (double)test_floats(&dout)[i] * ref_gelu_grad((double)test_floats(&in)[i]);
    }
    CHECK(loom_gelu_forward(&out, &in) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(loom_gelu_backward(&din, &in, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
    char what[64];
    snprintf(what, sizeof what, "gelu forward, shape %d (n %lld)", s, (long long)n);
    CHECK(test_compare(what, test_floats(&out), want, n, 1e-6, 1e-5) == 0, "%s", what);
    snprintf(what, sizeof what, "gelu backward, shape %d (n %lld)", s, (long long)n);
    CHECK(test_compare(what, test_floats(&din), want_d, n, 2e-6, 1e-5) == 0, "%s", what);

    // In place: out = in, and din = dout, give the same bits as the separate calls.
    loom_tensor_t x = shaped(s, "x"), g = shaped(s, "g");
    memcpy(test_floats(&x), test_floats(&in), sizeof(float) * (size_t)n);
    memcpy(test_floats(&g), test_floats(&dout), sizeof(float) * (size_t)n);
    CHECK(loom_gelu_backward(&g, &x, &g) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(&g), test_floats(&din), n),
          "gelu backward in place (din = dout) differs");
    memcpy(test_floats(&g), test_floats(&dout), sizeof(float) * (size_t)n);
    CHECK(loom_gelu_backward(&x, &x, &g) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(&x), test_floats(&din), n),
          "gelu backward in place (din = in) differs");
    memcpy(test_floats(&x), test_floats(&in), sizeof(float) * (size_t)n);
    CHECK(loom_gelu_forward(&x, &x) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(&x), test_floats(&out), n), "gelu forward in place differs");

    free(want);
    free(want_d);
    loom_tensor_free(&in);
    loom_tensor_free(&out);
    loom_tensor_free(&dout);
    loom_tensor_free(&din);
    loom_tensor_free(&x);
    loom_tensor_free(&g);
  }
}

// loom_gelu_forward_deriv and loom_gelu_backward_deriv give the bits of the plain pair (and of
// loom_bias_backward for the fused bias gradient): in place, and on both sides of the widest
// matrix whose column sums are fused (2048 columns), the widest taking the two-pass path.
static void check_gelu_deriv(int ndim, const int64_t *shape, test_rng_t *rng) {
  loom_tensor_t in = test_tensor_f32(ndim, shape, "in"), out = test_tensor_f32(ndim, shape, "out");
  loom_tensor_t dout = test_tensor_f32(ndim, shape, "dout"),
                ref = test_tensor_f32(ndim, shape, "r");
  loom_tensor_t one = test_tensor_f32(ndim, shape, "one"), d = test_tensor_f32(ndim, shape, "d");
  loom_tensor_t x = test_tensor_f32(ndim, shape, "x"), y = test_tensor_f32(ndim, shape, "y");
  const int64_t n = loom_tensor_numel(&in), N = shape[ndim - 1];
  loom_tensor_t db = test_tensor_f32(1, &N, "db"), db_ref = test_tensor_f32(1, &N, "db_ref");
  fill_gelu_inputs(rng, test_floats(&in), n);
  test_fill_uniform(rng, test_floats(&dout), n, -1, 1);
  test_fill_uniform(rng, test_floats(&db), N, -1, 1);
  memcpy(test_floats(&db_ref), test_floats(&db), sizeof(float) * (size_t)N);
  test_fill_value(test_floats(&one), n, 1.0f);
  test_fill_value(test_floats(&d), n, NAN);

  // The references: gelu and gelu' (the backward with dout = 1), dout * gelu', its column sums.
  CHECK(loom_gelu_forward(&ref, &in) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_gelu_backward(&d, &in, &one) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_gelu_backward(&one, &in, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_bias_backward(&db_ref, &one) == LOOM_OK, "%s", loom_last_error(NULL));

  // Forward, deriv in place of the input as train_gpt uses it.
  memcpy(test_floats(&x), test_floats(&in), sizeof(float) * (size_t)n);
  CHECK(loom_gelu_forward_deriv(&out, &x, &x) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_same_bits(test_floats(&out), test_floats(&ref), n), "gelu_forward_deriv: out, n %lld",
        (long long)n);
  CHECK(test_same_bits(test_floats(&x), test_floats(&d), n), "gelu_forward_deriv: deriv, n %lld",
        (long long)n);
  // Backward in place of dout, with and without the bias gradient.
  memcpy(test_floats(&y), test_floats(&dout), sizeof(float) * (size_t)n);
  CHECK(loom_gelu_backward_deriv(&y, &db, &x, &y) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_same_bits(test_floats(&y), test_floats(&one), n), "gelu_backward_deriv: din, n %lld",
        (long long)n);
  CHECK(test_same_bits(test_floats(&db), test_floats(&db_ref), N),
        "gelu_backward_deriv: dbias differs from loom_bias_backward, N %lld", (long long)N);
  test_fill_value(test_floats(&y), n, NAN);
  CHECK(loom_gelu_backward_deriv(&y, NULL, &x, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_same_bits(test_floats(&y), test_floats(&one), n),
        "gelu_backward_deriv without dbias: din, n %lld", (long long)n);

  loom_tensor_t *all[] = {&in, &out, &dout, &ref, &one, &d, &x, &y, &db, &db_ref};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    loom_tensor_free(all[i]);
  }
}

static void test_gelu_deriv(void) {
  test_rng_t rng = test_rng(23);
  for (int s = 0; s < NSHAPES; s++) {
    check_gelu_deriv((int)shapes[s][0], &shapes[s][1], &rng);
  }
  static const int64_t wide[][2] = {{5, 2048}, {3, 2049}, {64, 1024}};
  for (int s = 0; s < 3; s++) {
    check_gelu_deriv(2, wide[s], &rng);
  }
}

// Saturation: huge |x| gives gelu = x or 0 and gelu' = 1 or 0 exactly, never NaN; NaN stays NaN.
static void test_gelu_extremes(void) {
  float xs[] = {1e20f, -1e20f, 3e38f, -3e38f, INFINITY, 50.0f, -50.0f, NAN};
  float want_y[] = {1e20f, 0.0f, 3e38f, 0.0f, INFINITY, 50.0f, 0.0f, NAN};
  float want_d[] = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f, NAN};
  int64_t n = (int64_t)(sizeof xs / sizeof xs[0]);
  loom_tensor_t in = test_tensor_f32(1, &n, "in"), out = test_tensor_f32(1, &n, "out");
  loom_tensor_t dout = test_tensor_f32(1, &n, "dout"), din = test_tensor_f32(1, &n, "din");
  memcpy(test_floats(&in), xs, sizeof xs);
  loom_tensor_fill(&dout, 1.0);
  CHECK(loom_gelu_forward(&out, &in) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_gelu_backward(&din, &in, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  for (int64_t i = 0; i < n; i++) {
    float y = test_floats(&out)[i], d = test_floats(&din)[i];
    int ok_y = isnan(want_y[i]) ? isnan(y) : y == want_y[i];
    int ok_d = isnan(want_d[i]) ? isnan(d) : d == want_d[i];
    CHECK(ok_y && ok_d, "gelu(%g) = %g (want %g), gelu' = %g (want %g)", (double)xs[i], (double)y,
          (double)want_y[i], (double)d, (double)want_d[i]);
  }
  loom_tensor_free(&in);
  loom_tensor_free(&out);
  loom_tensor_free(&dout);
  loom_tensor_free(&din);
}

// L = sum(gelu(x) * w): dL/dx from loom_gelu_backward(dout = w) against central differences.
static void test_gelu_finite_diff(void) {
  test_rng_t rng = test_rng(12);
  for (int s = 0; s < NSHAPES; s++) {
    loom_tensor_t in = shaped(s, "in"), out = shaped(s, "out"), w = shaped(s, "w");
    loom_tensor_t din = shaped(s, "din");
    int64_t n = loom_tensor_numel(&in);
    test_fill_uniform(&rng, test_floats(&in), n, -4, 4);
    test_fill_uniform(&rng, test_floats(&w), n, -1, 1);
    CHECK(loom_gelu_backward(&din, &in, &w) == LOOM_OK, "%s", loom_last_error(NULL));
    char what[64];
    snprintf(what, sizeof what, "gelu finite differences, shape %d", s);
    check_finite_diff(what, &rng, loom_gelu_forward, &in, &out, &w, &din, 2e-4, 2e-3);
    loom_tensor_free(&in);
    loom_tensor_free(&out);
    loom_tensor_free(&w);
    loom_tensor_free(&din);
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax

static void ref_softmax(const float *x, int64_t N, int64_t C, double *y) {
  for (int64_t r = 0; r < N; r++) {
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < C; j++) {
      m = fmax(m, (double)x[r * C + j]);
    }
    for (int64_t j = 0; j < C; j++) {
      y[r * C + j] = m == -INFINITY ? 0.0 : exp((double)x[r * C + j] - m);
      s += y[r * C + j];
    }
    for (int64_t j = 0; j < C; j++) {
      y[r * C + j] = s > 0 ? y[r * C + j] / s : 0.0;
    }
  }
}

static void ref_softmax_backward(const float *y, const float *dy, int64_t N, int64_t C,
                                 double *dx) {
  for (int64_t r = 0; r < N; r++) {
    double dot = 0.0;
    for (int64_t j = 0; j < C; j++) {
      dot += (double)y[r * C + j] * (double)dy[r * C + j];
    }
    for (int64_t j = 0; j < C; j++) {
      dx[r * C + j] = (double)y[r * C + j] * ((double)dy[r * C + j] - dot);
    }
  }
}

static void matrix_dims(const loom_tensor_t *t, int64_t *N, int64_t *C) {
  *C = t->shape[t->ndim - 1];
  *N = loom_tensor_numel(t) / (*C > 0 ? *C : 1);
}

// Logits in [-5, 5]; where there are several rows: one offset by +1000 (exp would overflow
// without subtracting the max), one with -inf entries (masked), one all -inf (gives zeros), one
// constant.
static void fill_logits(test_rng_t *rng, float *x, int64_t N, int64_t C) {
  test_fill_uniform(rng, x, N * C, -5, 5);
  if (N >= 4) {
    for (int64_t j = 0; j < C; j++) {
      x[0 * C + j] += 1000.0f;
      if (j % 3 == 1) {
        x[1 * C + j] = -INFINITY;
      }
      x[2 * C + j] = -INFINITY;
      x[3 * C + j] = 0.25f;
    }
  }
}

// Rows without a finite entry: all -inf gives zeros (no mass), but a NaN among -inf entries,
// or a row of NaN, gives NaN everywhere, as a NaN beside finite entries does: it never wins
// the maximum, and must not vanish into a row of zeros. Also in place.
static void test_softmax_nan_rows(void) {
  int64_t shape[2] = {4, 3};
  loom_tensor_t in = test_tensor_f32(2, shape, "in"), out = test_tensor_f32(2, shape, "out");
  const float x[12] = {-INFINITY, -INFINITY, -INFINITY, NAN,  NAN, NAN,
                       -INFINITY, NAN,       -INFINITY, 1.0f, NAN, 2.0f};
  memcpy(in.data, x, sizeof x);
  for (int pass = 0; pass < 2; pass++) { // separate, then in place
    loom_tensor_t *o = pass ? &in : &out;
    test_fill_value(test_floats(&out), 12, 42.0f);
    CHECK(loom_softmax_forward(o, &in) == LOOM_OK, "%s", loom_last_error(NULL));
    const float *y = test_floats(o);
    for (int j = 0; j < 3; j++) {
      CHECK(y[j] == 0.0f, "softmax of a row of -inf (pass %d): [%d] = %g, want 0", pass, j,
            (double)y[j]);
      for (int r = 1; r < 4; r++) {
        CHECK(isnan(y[r * 3 + j]), "softmax of row %d with a NaN (pass %d): [%d] = %g, want NaN", r,
              pass, j, (double)y[r * 3 + j]);
      }
    }
  }
  loom_tensor_free(&in);
  loom_tensor_free(&out);
}

static void test_softmax_reference(void) {
  test_rng_t rng = test_rng(13);
  for (int s = 0; s < NSHAPES; s++) {
    loom_tensor_t in = shaped(s, "in"), out = shaped(s, "out"), dout = shaped(s, "dout");
    loom_tensor_t din = shaped(s, "din");
    int64_t N, C, n = loom_tensor_numel(&in);
    matrix_dims(&in, &N, &C);
    fill_logits(&rng, test_floats(&in), N, C);
    test_fill_uniform(&rng, test_floats(&dout), n, -1, 1);
    test_fill_value(test_floats(&out), n, NAN);
    test_fill_value(test_floats(&din), n, NAN);
    double *want = malloc(sizeof(double) * (size_t)n);
    ref_softmax(test_floats(&in), N, C, want);
    CHECK(loom_softmax_forward(&out, &in) == LOOM_OK, "%s", loom_last_error(NULL));
    char what[80];
    snprintf(what, sizeof what, "softmax forward, shape %d (%lld x %lld)", s, (long long)N,
             (long long)C);
    CHECK(test_compare(what, test_floats(&out), want, n, 1e-7, 1e-5) == 0, "%s", what);
    ref_softmax_backward(test_floats(&out), test_floats(&dout), N, C, want);
    CHECK(loom_softmax_backward(&din, &out, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "softmax backward, shape %d (%lld x %lld)", s, (long long)N,
             (long long)C);
    CHECK(test_compare(what, test_floats(&din), want, n, 2e-7, 1e-5) == 0, "%s", what);

    // In place: out = in, din = dout and din = out give the same bits.
    loom_tensor_t x = shaped(s, "x"), g = shaped(s, "g");
    memcpy(test_floats(&x), test_floats(&in), sizeof(float) * (size_t)n);
    CHECK(loom_softmax_forward(&x, &x) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(&x), test_floats(&out), n),
          "softmax forward in place differs");
    memcpy(test_floats(&g), test_floats(&dout), sizeof(float) * (size_t)n);
    CHECK(loom_softmax_backward(&g, &x, &g) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(&g), test_floats(&din), n),
          "softmax backward in place (din = dout) differs");
    CHECK(loom_softmax_backward(&x, &x, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(&x), test_floats(&din), n),
          "softmax backward in place (din = out) differs");

    free(want);
    loom_tensor_free(&in);
    loom_tensor_free(&out);
    loom_tensor_free(&dout);
    loom_tensor_free(&din);
    loom_tensor_free(&x);
    loom_tensor_free(&g);
  }
}

// L = sum(softmax(x) * w): dL/dx from loom_softmax_backward(dout = w) against central differences.
static void test_softmax_finite_diff(void) {
  test_rng_t rng = test_rng(14);
  for (int s = 0; s < NSHAPES; s++) {
    loom_tensor_t in = shaped(s, "in"), out = shaped(s, "out"), w = shaped(s, "w");
    loom_tensor_t din = shaped(s, "din");
    int64_t N, C, n = loom_tensor_numel(&in);
    matrix_dims(&in, &N, &C);
    test_fill_uniform(&rng, test_floats(&in), n, -3, 3);
    test_fill_uniform(&rng, test_floats(&w), n, -1, 1);
    CHECK(loom_softmax_forward(&out, &in) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(loom_softmax_backward(&din, &out, &w) == LOOM_OK, "%s", loom_last_error(NULL));
    char what[64];
    snprintf(what, sizeof what, "softmax finite differences, shape %d", s);
    check_finite_diff(what, &rng, loom_softmax_forward, &in, &out, &w, &din, 1e-4, 2e-3);
    loom_tensor_free(&in);
    loom_tensor_free(&out);
    loom_tensor_free(&w);
    loom_tensor_free(&din);
  }
}

// ---------------------------------------------------------------------------------------------
// Guards: every op writes exactly its outputs. Inputs and outputs are wrapped inside sentinels
// (test_guarded_f32), which must survive each call, and each output holds the bits of the same
// call on plain tensors. Covers the fused and the two-pass bias gradient (2049 columns).

static void check_guards(const char *what, const test_guarded_t *const *g, int count) {
  for (int i = 0; i < count; i++) {
    CHECK(test_guards_intact(g[i]), "%s: wrote outside %s", what, g[i]->t.name);
  }
}

static void test_guards(void) {
  test_rng_t rng = test_rng(29);
  static const int64_t gshapes[][2] = {{1, 1}, {3, 7}, {2, 37}, {5, 129}, {2, 2049}};
  for (int s = 0; s < 5; s++) {
    const int64_t *shape = gshapes[s], n = shape[0] * shape[1], N = shape[1];
    test_guarded_t in = test_guarded_f32(2, shape, "in"), dout = test_guarded_f32(2, shape, "dout");
    test_guarded_t out = test_guarded_f32(2, shape, "out"), din = test_guarded_f32(2, shape, "din");
    test_guarded_t deriv = test_guarded_f32(2, shape, "deriv"), db = test_guarded_f32(1, &N, "db");
    const test_guarded_t *all[] = {&in, &dout, &out, &din, &deriv, &db};
    loom_tensor_t r_out = test_tensor_f32(2, shape, "r_out"),
                  r_din = test_tensor_f32(2, shape, "r");
    loom_tensor_t r_db = test_tensor_f32(1, &N, "r_db");
    fill_gelu_inputs(&rng, test_floats(&in.t), n);
    test_fill_uniform(&rng, test_floats(&dout.t), n, -1, 1);
    test_fill_uniform(&rng, test_floats(&db.t), N, -1, 1);
    test_copy_floats(r_db.data, db.t.data, N);
    char what[96];

    CHECK(loom_gelu_forward(&out.t, &in.t) == LOOM_OK &&
              loom_gelu_forward(&r_out, &in.t) == LOOM_OK,
          "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "gelu forward (%lld, %lld)", (long long)shape[0], (long long)N);
    check_guards(what, all, 6);
    CHECK(test_same_bits(test_floats(&out.t), test_floats(&r_out), n), "%s: out differs", what);

    CHECK(loom_gelu_backward(&din.t, &in.t, &dout.t) == LOOM_OK &&
              loom_gelu_backward(&r_din, &in.t, &dout.t) == LOOM_OK,
          "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "gelu backward (%lld, %lld)", (long long)shape[0], (long long)N);
    check_guards(what, all, 6);
    CHECK(test_same_bits(test_floats(&din.t), test_floats(&r_din), n), "%s: din differs", what);

    test_fill_value(test_floats(&out.t), n, NAN);
    CHECK(loom_gelu_forward_deriv(&out.t, &deriv.t, &in.t) == LOOM_OK, "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "gelu forward_deriv (%lld, %lld)", (long long)shape[0],
             (long long)N);
    check_guards(what, all, 6);
    CHECK(test_same_bits(test_floats(&out.t), test_floats(&r_out), n), "%s: out differs", what);

    test_fill_value(test_floats(&din.t), n, NAN);
    CHECK(loom_gelu_backward_deriv(&din.t, &db.t, &deriv.t, &dout.t) == LOOM_OK &&
              loom_bias_backward(&r_db, &r_din) == LOOM_OK,
          "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "gelu backward_deriv (%lld, %lld)", (long long)shape[0],
             (long long)N);
    check_guards(what, all, 6);
    CHECK(test_same_bits(test_floats(&din.t), test_floats(&r_din), n), "%s: din differs", what);
    CHECK(test_same_bits(test_floats(&db.t), test_floats(&r_db), N), "%s: dbias differs", what);

    CHECK(loom_softmax_forward(&out.t, &in.t) == LOOM_OK &&
              loom_softmax_forward(&r_out, &in.t) == LOOM_OK,
          "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "softmax forward (%lld, %lld)", (long long)shape[0], (long long)N);
    check_guards(what, all, 6);
    CHECK(test_same_bits(test_floats(&out.t), test_floats(&r_out), n), "%s: out differs", what);

    CHECK(loom_softmax_backward(&din.t, &out.t, &dout.t) == LOOM_OK &&
              loom_softmax_backward(&r_din, &r_out, &dout.t) == LOOM_OK,
          "%s", loom_last_error(NULL));
    snprintf(what, sizeof what, "softmax backward (%lld, %lld)", (long long)shape[0], (long long)N);
    check_guards(what, all, 6);
    CHECK(test_same_bits(test_floats(&din.t), test_floats(&r_din), n), "%s: din differs", what);

    test_guarded_free(&in);
    test_guarded_free(&dout);
    test_guarded_free(&out);
    test_guarded_free(&din);
    test_guarded_free(&deriv);
    test_guarded_free(&db);
    TEST_FREE(&r_out, &r_din, &r_db);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: each fails with a message and leaves every output untouched.

static void test_bad_args(void) {
  int64_t s35[2] = {3, 5}, s53[2] = {5, 3}, s16[1] = {16}, s8[1] = {8};
  loom_tensor_t a = test_tensor_f32(2, s35, "a"), b = test_tensor_f32(2, s35, "b");
  loom_tensor_t o = test_tensor_f32(2, s35, "o"), o53 = test_tensor_f32(2, s53, "o53");
  loom_tensor_t o16 = test_tensor_f32(1, s16, "o16");
  loom_tensor_fill(&a, 0.5);
  loom_tensor_fill(&b, 0.25);
  loom_tensor_fill(&o, 7.0);
  loom_tensor_fill(&o53, 7.0);
  loom_tensor_fill(&o16, 7.0);
  loom_tensor_t a_bf16, o_dev = o, a_dev = a;
  loom_tensor_wrap(&a_bf16, a.data, LOOM_BF16, LOOM_DEVICE_HOST, 2, s35, "a_bf16");
  o_dev.device = 0;
  a_dev.device = 0;
  // Partial overlap: x = buf[0..8), y = buf[4..12).
  float buf[24];
  for (int i = 0; i < 24; i++) {
    buf[i] = 7.0f;
  }
  loom_tensor_t x_buf, y_buf, z_buf;
  loom_tensor_wrap(&x_buf, buf, LOOM_F32, LOOM_DEVICE_HOST, 1, s8, "x_buf");
  loom_tensor_wrap(&y_buf, buf + 4, LOOM_F32, LOOM_DEVICE_HOST, 1, s8, "y_buf");
  loom_tensor_wrap(&z_buf, buf + 16, LOOM_F32, LOOM_DEVICE_HOST, 1, s8, "z_buf");

  static const char gf[] = "loom_gelu_forward", gb[] = "loom_gelu_backward";
  EXPECT_FAIL(loom_gelu_forward(NULL, &a), gf, "out is NULL");
  EXPECT_FAIL(loom_gelu_forward(&o, NULL), gf, "in is NULL");
  EXPECT_FAIL(loom_gelu_forward(&o16, &a), gf, "(3, 5)"); // 16 vs 15 elements
  EXPECT_FAIL(loom_gelu_forward(&o, &a_bf16), gf, "bf16");
  EXPECT_FAIL_DEVICE(loom_gelu_forward(&o_dev, &a), gf, "out");
  EXPECT_FAIL(loom_gelu_forward(&o, &a_dev), gf, "cuda:0");
  EXPECT_FAIL(loom_gelu_forward(&y_buf, &x_buf), gf, "overlap");
  EXPECT_FAIL(loom_gelu_backward(NULL, &a, &b), gb, "din is NULL");
  EXPECT_FAIL(loom_gelu_backward(&o, NULL, &b), gb, "in is NULL");
  EXPECT_FAIL(loom_gelu_backward(&o, &a, NULL), gb, "dout is NULL");
  EXPECT_FAIL(loom_gelu_backward(&o16, &a, &b), gb, "(16)");
  EXPECT_FAIL(loom_gelu_backward(&o, &a, &o16), gb, "(16)");
  EXPECT_FAIL(loom_gelu_backward(&o, &a_bf16, &b), gb, "bf16");
  EXPECT_FAIL_DEVICE(loom_gelu_backward(&o_dev, &a, &b), gb, "din");
  EXPECT_FAIL(loom_gelu_backward(&o, &a, &a_dev), gb, "cuda:0");
  EXPECT_FAIL(loom_gelu_backward(&y_buf, &x_buf, &z_buf), gb, "overlap");
  EXPECT_FAIL(loom_gelu_backward(&y_buf, &z_buf, &x_buf), gb, "overlap");

  static const char gfd[] = "loom_gelu_forward_deriv", gbd[] = "loom_gelu_backward_deriv";
  loom_tensor_t db5 = test_tensor_f32(1, (const int64_t[]){5}, "db5");
  loom_tensor_t db3 = test_tensor_f32(1, (const int64_t[]){3}, "db3");
  loom_tensor_fill(&db5, 7.0);
  loom_tensor_fill(&db3, 7.0);
  EXPECT_FAIL(loom_gelu_forward_deriv(NULL, &o, &a), gfd, "out is NULL");
  EXPECT_FAIL(loom_gelu_forward_deriv(&o, NULL, &a), gfd, "deriv is NULL");
  EXPECT_FAIL(loom_gelu_forward_deriv(&o, &o53, NULL), gfd, "in is NULL");
  EXPECT_FAIL(loom_gelu_forward_deriv(&o, &o16, &a), gfd, "(16)");
  EXPECT_FAIL(loom_gelu_forward_deriv(&o, &o, &a), gfd, "overlap"); // out and deriv the same
  EXPECT_FAIL(loom_gelu_forward_deriv(&x_buf, &z_buf, &x_buf), gfd, "overlap"); // out = in
  EXPECT_FAIL(loom_gelu_forward_deriv(&z_buf, &y_buf, &x_buf), gfd, "overlap");
  EXPECT_FAIL(loom_gelu_forward_deriv(&o, &a_dev, &b), gfd, "cuda:0");
  EXPECT_FAIL(loom_gelu_backward_deriv(NULL, NULL, &a, &b), gbd, "din is NULL");
  EXPECT_FAIL(loom_gelu_backward_deriv(&o, NULL, NULL, &b), gbd, "deriv is NULL");
  EXPECT_FAIL(loom_gelu_backward_deriv(&o, NULL, &a, &o16), gbd, "(16)");
  EXPECT_FAIL(loom_gelu_backward_deriv(&o, &db3, &a, &b), gbd, "expected dbias (5)");
  EXPECT_FAIL(loom_gelu_backward_deriv(&o, &o53, &a, &b), gbd, "expected dbias (5)");
  EXPECT_FAIL(loom_gelu_backward_deriv(&o, &a_bf16, &a, &b), gbd, "bf16");
  EXPECT_FAIL(loom_gelu_backward_deriv(&y_buf, NULL, &x_buf, &z_buf), gbd, "overlap");
  EXPECT_FAIL(loom_gelu_backward_deriv(&z_buf, &y_buf, &x_buf, &z_buf), gbd, "overlap");
  CHECK(test_all_equal(test_floats(&db5), 5, 7.0f) && test_all_equal(test_floats(&db3), 3, 7.0f),
        "a failed call wrote its dbias");
  loom_tensor_free(&db5);
  loom_tensor_free(&db3);

  static const char sf[] = "loom_softmax_forward", sb[] = "loom_softmax_backward";
  EXPECT_FAIL(loom_softmax_forward(NULL, &a), sf, "out is NULL");
  EXPECT_FAIL(loom_softmax_forward(&o, NULL), sf, "in is NULL");
  EXPECT_FAIL(loom_softmax_forward(&o53, &a), sf, "(5, 3)"); // same numel, other shape
  EXPECT_FAIL(loom_softmax_forward(&o16, &a), sf, "(16)");
  EXPECT_FAIL(loom_softmax_forward(&o, &a_bf16), sf, "bf16");
  EXPECT_FAIL_DEVICE(loom_softmax_forward(&o_dev, &a), sf, "out");
  EXPECT_FAIL(loom_softmax_forward(&o, &a_dev), sf, "cuda:0");
  EXPECT_FAIL(loom_softmax_forward(&y_buf, &x_buf), sf, "overlap");
  EXPECT_FAIL(loom_softmax_backward(NULL, &a, &b), sb, "din is NULL");
  EXPECT_FAIL(loom_softmax_backward(&o, NULL, &b), sb, "out is NULL");
  EXPECT_FAIL(loom_softmax_backward(&o, &a, NULL), sb, "dout is NULL");
  EXPECT_FAIL(loom_softmax_backward(&o53, &a, &b), sb, "(5, 3)");
  EXPECT_FAIL(loom_softmax_backward(&o, &a, &o53), sb, "(5, 3)");
  EXPECT_FAIL(loom_softmax_backward(&o, &a_bf16, &b), sb, "bf16");
  EXPECT_FAIL_DEVICE(loom_softmax_backward(&o_dev, &a, &b), sb, "din");
  EXPECT_FAIL(loom_softmax_backward(&o, &a, &a_dev), sb, "cuda:0");
  EXPECT_FAIL(loom_softmax_backward(&y_buf, &x_buf, &z_buf), sb, "overlap");

  CHECK(test_all_equal(test_floats(&o), 15, 7.0f) && test_all_equal(test_floats(&o53), 15, 7.0f) &&
            test_all_equal(test_floats(&o16), 16, 7.0f) && test_all_equal(buf, 24, 7.0f),
        "a failed call wrote its output");
  CHECK(test_all_equal(test_floats(&a), 15, 0.5f) && test_all_equal(test_floats(&b), 15, 0.25f),
        "a failed call wrote an input");
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&o);
  loom_tensor_free(&o53);
  loom_tensor_free(&o16);
}

int main(void) {
  test_gelu_reference();
  test_gelu_extremes();
  test_gelu_finite_diff();
  test_gelu_deriv();
  test_softmax_reference();
  test_softmax_nan_rows();
  test_softmax_finite_diff();
  test_guards();
  test_bad_args();
  return check_exit("test_ops_activation");
}
