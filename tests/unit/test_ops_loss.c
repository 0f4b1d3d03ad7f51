/* test_ops_loss.c — loom_cross_entropy_forward/backward against a double-precision reference
 * (random shapes up to V = 50257, ignored rows), finite differences, and argument checks. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

#define IGNORE (-100)

// Tolerances (float kernels against double references):
// - losses and mean loss: atol 1e-5 + rtol 1e-5. The loss is log(sum) in double minus an exact
//   float difference, so only expf (<= 1 ulp each) and the final float rounding contribute.
// - dlogits: atol 1e-6 * |scale| + rtol 1e-5, scale = dloss / n_valid: each element is
//   scale * p with a few float roundings; the target element p - 1 cancels, so its error is
//   absolute, a few ulp of scale.
// - finite differences of the double reference (h = 1e-4, truncation ~h^2): atol 1e-6, rtol 1e-4.
// - finite differences of loom's own float forward (h = 1e-2; float loss rounding / 2h ~ 1e-5
//   plus truncation ~1e-5): atol 1e-4 / n_valid, rtol 2e-3.

// ---------------------------------------------------------------------------------------------
// Reference

// Double-precision loss of one row.
static double ref_row_loss(const float *x, int64_t v, int32_t t) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < v; j++) {
    mx = fmax(mx, (double)x[j]);
  }
  double s = exp((double)x[t] - mx); // the target's term: s > 0 (and the loop adds the rest)
  for (int64_t j = 0; j < v; j++) {
    s += j == t ? 0.0 : exp((double)x[j] - mx);
  }
  return log(s) + mx - (double)x[t];
}

// Double-precision mean loss over the non-ignored rows of logits given as doubles.
static double ref_mean_loss_d(const double *x, int64_t n, int64_t v, const int32_t *t,
                              int32_t ignore) {
  double total = 0.0;
  int64_t valid = 0;
  for (int64_t i = 0; i < n; i++) {
    if (t[i] == ignore) {
      continue;
    }
    const double *r = x + i * v;
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; j++) {
      mx = fmax(mx, r[j]);
    }
    double s = exp(r[t[i]] - mx); // the target's term first: s > 0
    for (int64_t j = 0; j < v; j++) {
      s += j == t[i] ? 0.0 : exp(r[j] - mx);
    }
    total += log(s) + mx - r[t[i]];
    valid++;
  }
  return valid ? total / (double)valid : 0.0;
}

// Double-precision gradient of dloss * mean loss.
static void ref_backward(const float *x, int64_t n, int64_t v, const int32_t *t, int32_t ignore,
                         double dloss, double *dx) {
  int64_t valid = 0;
  for (int64_t i = 0; i < n; i++) {
    valid += t[i] != ignore;
  }
  for (int64_t i = 0; i < n; i++) {
    const float *r = x + i * v;
    double *d = dx + i * v;
    if (t[i] == ignore) {
      for (int64_t j = 0; j < v; j++) {
        d[j] = 0.0;
      }
      continue;
    }
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; j++) {
      mx = fmax(mx, (double)r[j]);
    }
    double s = 0.0;
    for (int64_t j = 0; j < v; j++) {
      s += exp((double)r[j] - mx);
    }
    for (int64_t j = 0; j < v; j++) {
      d[j] = dloss / (double)valid * (exp((double)r[j] - mx) / s - (j == t[i]));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward and backward against the reference

typedef struct ce_case {
  int64_t n, v;
  double ignore_frac; // share of rows whose target is the ignore index
  int32_t ignore;     // the ignore index (may be a valid class)
  double offset;      // added to every logit (stability)
  float dloss;
} ce_case_t;

static void run_case(test_rng_t *rng, const ce_case_t *c) {
  char what[128];
  int64_t shape[2] = {c->n, c->v};
  loom_tensor_t logits = test_tensor_f32(2, shape, "logits");
  loom_tensor_t dlogits = test_tensor_f32(2, shape, "dlogits");
  loom_tensor_t losses = test_tensor_f32(1, shape, "losses");
  loom_tensor_t targets = test_tensor(LOOM_I32, 1, shape, "targets");
  float *x = logits.data;
  int32_t *t = targets.data;
  test_fill_uniform(rng, x, c->n * c->v, c->offset - 4.0, c->offset + 4.0);
  int64_t valid = 0;
  for (int64_t i = 0; i < c->n; i++) {
    t[i] =
        test_uniform(rng, 0, 1) < c->ignore_frac ? c->ignore : (int32_t)test_int(rng, 0, c->v - 1);
    valid += t[i] != c->ignore;
  }
  // Garbage in the outputs: every element must be overwritten.
  test_fill_uniform(rng, losses.data, c->n, 50, 60);
  test_fill_uniform(rng, dlogits.data, c->n * c->v, 50, 60);

  float mean = -1.0f;
  loom_status_t st = loom_cross_entropy_forward(&losses, &mean, &logits, &targets, c->ignore);
  CHECK(st == LOOM_OK, "forward N=%lld V=%lld: %s", (long long)c->n, (long long)c->v,
        loom_last_error(NULL));

  double *want = malloc(sizeof(double) * (size_t)(c->n * c->v + 1));
  double total = 0.0;
  for (int64_t i = 0; i < c->n; i++) {
    want[i] = t[i] == c->ignore ? 0.0 : ref_row_loss(x + i * c->v, c->v, t[i]);
    total += want[i];
  }
  double want_mean = valid ? total / (double)valid : 0.0;
  snprintf(what, sizeof what, "losses N=%lld V=%lld offset %g", (long long)c->n, (long long)c->v,
           c->offset);
  CHECK(test_compare(what, losses.data, want, c->n, 1e-5, 1e-5) == 0, "%s", what);
  CHECK(fabs(mean - want_mean) <= 1e-5 + 1e-5 * fabs(want_mean), "%s: mean %.9g want %.9g", what,
        (double)mean, want_mean);
  for (int64_t i = 0; i < c->n; i++) {
    if (t[i] == c->ignore) {
      CHECK(((float *)losses.data)[i] == 0.0f, "%s: ignored row %lld has loss %g", what,
            (long long)i, (double)((float *)losses.data)[i]);
    }
  }
  // A NULL mean_loss is fine, and the losses are still written (garbage in them again first).
  test_fill_uniform(rng, losses.data, c->n, 50, 60);
  CHECK(loom_cross_entropy_forward(&losses, NULL, &logits, &targets, c->ignore) == LOOM_OK,
        "forward with NULL mean_loss");
  CHECK(test_compare(what, losses.data, want, c->n, 1e-5, 1e-5) == 0,
        "%s: losses with a NULL mean_loss", what);

  st = loom_cross_entropy_backward(&dlogits, &logits, &targets, c->ignore, c->dloss);
  CHECK(st == LOOM_OK, "backward: %s", loom_last_error(NULL));
  ref_backward(x, c->n, c->v, t, c->ignore, c->dloss, want);
  double scale = valid ? fabs((double)c->dloss / (double)valid) : 0.0;
  snprintf(what, sizeof what, "dlogits N=%lld V=%lld dloss %g", (long long)c->n, (long long)c->v,
           (double)c->dloss);
  CHECK(test_compare(what, dlogits.data, want, c->n * c->v, 1e-6 * scale, 1e-5) == 0, "%s", what);

  // In place (dlogits is logits, as llm.c does): bitwise the same as out of place.
  if (c->n * c->v <= 1 << 20) {
    loom_tensor_t inplace = test_tensor_f32(2, shape, "inplace");
    memcpy(inplace.data, x, sizeof(float) * (size_t)(c->n * c->v));
    st = loom_cross_entropy_backward(&inplace, &inplace, &targets, c->ignore, c->dloss);
    CHECK(st == LOOM_OK &&
              !memcmp(inplace.data, dlogits.data, sizeof(float) * (size_t)(c->n * c->v)),
          "%s: in-place backward differs from out of place", what);
    loom_tensor_free(&inplace);
  }
  free(want);
  loom_tensor_free(&logits);
  loom_tensor_free(&dlogits);
  loom_tensor_free(&losses);
  loom_tensor_free(&targets);
}

static void test_reference(void) {
  test_rng_t rng = test_rng(11);
  static const ce_case_t cases[] = {
      {1, 1, 0.0, IGNORE, 0.0, 1.0f},      {1, 2, 0.0, IGNORE, 0.0, 1.0f},
      {3, 5, 0.3, IGNORE, 0.0, 1.0f},      {7, 13, 0.3, IGNORE, 0.0, 2.5f},
      {17, 257, 0.2, IGNORE, 0.0, 1.0f},   {33, 1000, 0.1, IGNORE, 0.0, -0.5f},
      {64, 31, 0.5, 0, 0.0, 1.0f},         {5, 11, 0.2, IGNORE, 1000.0, 1.0f},
      {4, 9, 0.0, IGNORE, -1000.0, 1.0f},  {2, 50257, 0.0, IGNORE, 0.0, 1.0f},
      {3, 50257, 0.34, IGNORE, 0.0, 1.0f},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    run_case(&rng, &cases[k]);
  }
  // Random shapes.
  for (int r = 0; r < 20; r++) {
    ce_case_t c = {test_int(&rng, 1, 40), test_int(&rng, 1, 300), 0.25, IGNORE, 0.0, 1.0f};
    run_case(&rng, &c);
  }
}

// Every row ignored: mean 0, losses 0, gradient 0 (no division by zero).
static void test_all_ignored(void) {
  int64_t shape[2] = {4, 6};
  loom_tensor_t logits = test_tensor_f32(2, shape, "logits");
  loom_tensor_t dlogits = test_tensor_f32(2, shape, "dlogits");
  loom_tensor_t losses = test_tensor_f32(1, shape, "losses");
  loom_tensor_t targets = test_tensor(LOOM_I32, 1, shape, "targets");
  test_rng_t rng = test_rng(5);
  test_fill_uniform(&rng, logits.data, 24, -3, 3);
  test_fill_uniform(&rng, losses.data, 4, 1, 2);
  test_fill_uniform(&rng, dlogits.data, 24, 1, 2);
  for (int i = 0; i < 4; i++) {
    ((int32_t *)targets.data)[i] = IGNORE;
  }
  float mean = 7.0f;
  CHECK(loom_cross_entropy_forward(&losses, &mean, &logits, &targets, IGNORE) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(mean == 0.0f, "all ignored: mean %g, want 0", (double)mean);
  CHECK(loom_cross_entropy_backward(&dlogits, &logits, &targets, IGNORE, 1.0f) == LOOM_OK, "%s",
        loom_last_error(NULL));
  for (int i = 0; i < 24; i++) {
    CHECK(i >= 4 || ((float *)losses.data)[i] == 0.0f, "loss[%d] = %g", i,
          (double)((float *)losses.data)[i]);
    CHECK(((float *)dlogits.data)[i] == 0.0f, "dlogits[%d] = %g", i,
          (double)((float *)dlogits.data)[i]);
  }
  // N = 0 is an empty batch: fine, mean 0.
  int64_t empty[2] = {0, 6};
  loom_tensor_t l0 = test_tensor_f32(2, empty, "l0"), o0 = test_tensor_f32(1, empty, "o0");
  loom_tensor_t t0 = test_tensor(LOOM_I32, 1, empty, "t0");
  mean = 7.0f;
  CHECK(loom_cross_entropy_forward(&o0, &mean, &l0, &t0, IGNORE) == LOOM_OK && mean == 0.0f,
        "empty batch: %s, mean %g", loom_last_error(NULL), (double)mean);
  // V = 0 with every row ignored: losses 0, mean 0; the backward has nothing to write.
  int64_t novocab[2] = {3, 0};
  loom_tensor_t lv = test_tensor_f32(2, novocab, "lv"), ov = test_tensor_f32(1, novocab, "ov");
  loom_tensor_t tv = test_tensor(LOOM_I32, 1, novocab, "tv");
  for (int i = 0; i < 3; i++) {
    ((int32_t *)tv.data)[i] = IGNORE;
    ((float *)ov.data)[i] = 5.0f;
  }
  mean = 7.0f;
  CHECK(loom_cross_entropy_forward(&ov, &mean, &lv, &tv, IGNORE) == LOOM_OK && mean == 0.0f,
        "V = 0: %s, mean %g", loom_last_error(NULL), (double)mean);
  for (int i = 0; i < 3; i++) {
    CHECK(((float *)ov.data)[i] == 0.0f, "V = 0: loss[%d] = %g", i, (double)((float *)ov.data)[i]);
  }
  CHECK(loom_cross_entropy_backward(&lv, &lv, &tv, IGNORE, 1.0f) == LOOM_OK, "V = 0 backward: %s",
        loom_last_error(NULL));
  loom_tensor_free(&lv);
  loom_tensor_free(&ov);
  loom_tensor_free(&tv);
  loom_tensor_free(&l0);
  loom_tensor_free(&o0);
  loom_tensor_free(&t0);
  loom_tensor_free(&logits);
  loom_tensor_free(&dlogits);
  loom_tensor_free(&losses);
  loom_tensor_free(&targets);
}

// ---------------------------------------------------------------------------------------------
// Finite differences: d mean_loss / d logits

static void test_finite_differences(void) {
  const int64_t n = 4, v = 7;
  int64_t shape[2] = {n, v};
  loom_tensor_t logits = test_tensor_f32(2, shape, "logits");
  loom_tensor_t dlogits = test_tensor_f32(2, shape, "dlogits");
  loom_tensor_t losses = test_tensor_f32(1, shape, "losses");
  loom_tensor_t targets = test_tensor(LOOM_I32, 1, shape, "targets");
  test_rng_t rng = test_rng(23);
  float *x = logits.data;
  int32_t *t = targets.data;
  test_fill_uniform(&rng, x, n * v, -2, 2);
  t[0] = 3;
  t[1] = IGNORE;
  t[2] = 0;
  t[3] = 6;
  const int64_t valid = 3;
  CHECK(loom_cross_entropy_backward(&dlogits, &logits, &targets, IGNORE, 1.0f) == LOOM_OK, "%s",
        loom_last_error(NULL));

  // (a) Central differences of the double-precision mean loss (h = 1e-4).
  double xd[28], fd[28];
  for (int64_t i = 0; i < n * v; i++) {
    xd[i] = x[i];
  }
  for (int64_t i = 0; i < n * v; i++) {
    const double h = 1e-4, keep = xd[i];
    xd[i] = keep + h;
    double up = ref_mean_loss_d(xd, n, v, t, IGNORE);
    xd[i] = keep - h;
    double down = ref_mean_loss_d(xd, n, v, t, IGNORE);
    xd[i] = keep;
    fd[i] = (up - down) / (2 * h);
  }
  CHECK(test_compare("dlogits vs FD of the double loss", dlogits.data, fd, n * v, 1e-6, 1e-4) == 0,
        "finite differences (double reference)");

  // (b) Central differences of loom's own forward: the per-row float losses summed in double.
  for (int64_t i = 0; i < n * v; i++) {
    const float keep = x[i];
    double sum[2];
    float at[2] = {keep + 1e-2f, keep - 1e-2f};
    for (int s = 0; s < 2; s++) {
      x[i] = at[s];
      CHECK(loom_cross_entropy_forward(&losses, NULL, &logits, &targets, IGNORE) == LOOM_OK, "%s",
            loom_last_error(NULL));
      sum[s] = 0.0;
      for (int64_t r = 0; r < n; r++) {
        sum[s] += ((float *)losses.data)[r];
      }
    }
    x[i] = keep;
    fd[i] = (sum[0] - sum[1]) / (double)valid / ((double)at[0] - (double)at[1]);
  }
  CHECK(test_compare("dlogits vs FD of loom's forward", dlogits.data, fd, n * v, 1e-4 / valid,
                     2e-3) == 0,
        "finite differences (loom forward)");
  loom_tensor_free(&logits);
  loom_tensor_free(&dlogits);
  loom_tensor_free(&losses);
  loom_tensor_free(&targets);
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: LOOM_ERR_INVALID_ARG, a message, and nothing written.

static void test_bad_args(void) {
  static const char fwd[] = "loom_cross_entropy_forward", bwd[] = "loom_cross_entropy_backward";
  int64_t shape[2] = {3, 5}, tshape[2] = {5, 3}, n4[1] = {4};
  loom_tensor_t logits = test_tensor_f32(2, shape, "logits");
  loom_tensor_t dlogits = test_tensor_f32(2, shape, "dlogits");
  loom_tensor_t losses = test_tensor_f32(1, shape, "losses");
  loom_tensor_t targets = test_tensor(LOOM_I32, 1, shape, "targets");
  loom_tensor_t logits16 = test_tensor(LOOM_F16, 2, shape, "logits16");
  loom_tensor_t targets_f = test_tensor_f32(1, shape, "targets_f");
  loom_tensor_t losses_i = test_tensor(LOOM_I32, 1, shape, "losses_i");
  loom_tensor_t targets4 = test_tensor(LOOM_I32, 1, n4, "targets4");
  loom_tensor_t losses4 = test_tensor_f32(1, n4, "losses4");
  loom_tensor_t dlogits_t = test_tensor_f32(2, tshape, "dlogits_t");
  test_rng_t rng = test_rng(3);
  test_fill_uniform(&rng, logits.data, 15, -1, 1);
  int32_t *t = targets.data;
  t[0] = 1;
  t[1] = 4;
  t[2] = 2;
  // Sentinels: a failing call must leave them alone.
  for (int i = 0; i < 3; i++) {
    ((float *)losses.data)[i] = 42.0f;
  }
  for (int i = 0; i < 15; i++) {
    ((float *)dlogits.data)[i] = 42.0f;
  }
  float mean = 42.0f;

  loom_error_clear();
  test_expect_fail(loom_cross_entropy_forward(NULL, &mean, &logits, &targets, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "NULL losses");
  test_expect_fail(loom_cross_entropy_forward(&losses, &mean, NULL, &targets, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "NULL logits");
  test_expect_fail(loom_cross_entropy_forward(&losses, &mean, &logits, NULL, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "NULL targets");
  test_expect_fail(loom_cross_entropy_forward(&losses, &mean, &logits16, &targets, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "f16 logits");
  test_expect_fail(loom_cross_entropy_forward(&losses, &mean, &logits, &targets_f, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "f32 targets");
  test_expect_fail(loom_cross_entropy_forward(&losses_i, &mean, &logits, &targets, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "i32 losses");
  test_expect_fail(loom_cross_entropy_forward(&losses, &mean, &logits, &targets4, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "4 targets for 3 rows");
  test_expect_fail(loom_cross_entropy_forward(&losses4, &mean, &logits, &targets, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "4 losses for 3 rows");
  // Targets out of range, in the last row so that earlier rows would have been written.
  int32_t bad_targets[] = {5, -1, -100, 1 << 30};
  for (int k = 0; k < 4; k++) {
    t[2] = bad_targets[k];
    int32_t ignore = k == 2 ? -1 : IGNORE; // -100 is out of range when it is not the ignore index
    test_expect_fail(loom_cross_entropy_forward(&losses, &mean, &logits, &targets, ignore),
                     LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL, "target out of range");
    test_expect_fail(loom_cross_entropy_backward(&dlogits, &logits, &targets, ignore, 1.0f),
                     LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "target out of range");
  }
  t[2] = 2;
  test_expect_fail(loom_cross_entropy_backward(NULL, &logits, &targets, IGNORE, 1.0f),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "NULL dlogits");
  test_expect_fail(loom_cross_entropy_backward(&dlogits, NULL, &targets, IGNORE, 1.0f),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "NULL logits");
  test_expect_fail(loom_cross_entropy_backward(&dlogits_t, &logits, &targets, IGNORE, 1.0f),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "transposed dlogits");
  test_expect_fail(loom_cross_entropy_backward(&dlogits, &logits16, &targets, IGNORE, 1.0f),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "f16 logits");
  test_expect_fail(loom_cross_entropy_backward(&dlogits, &logits, &targets_f, IGNORE, 1.0f),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "f32 targets");
  test_expect_fail(loom_cross_entropy_backward(&dlogits, &logits, &targets4, IGNORE, 1.0f),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "4 targets for 3 rows");
  test_expect_fail(loom_cross_entropy_backward(&dlogits, &logits, &targets, IGNORE, NAN),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "NaN dloss");
  test_expect_fail(loom_cross_entropy_backward(&dlogits, &logits, &targets, IGNORE, INFINITY),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd, NULL, "Inf dloss");
  // Outputs in an input's memory: dlogits one row further on than logits (in place is logits
  // itself: the rows ahead would be overwritten before they are read), losses inside logits.
  {
    int64_t shape4[2] = {4, 5};
    loom_tensor_t both = test_tensor_f32(2, shape4, "both");
    memcpy(both.data, logits.data, 15 * sizeof(float));
    test_fill_value((float *)both.data + 15, 5, 42.0f);
    loom_tensor_t in_both = logits, ahead = dlogits, losses_in = losses;
    in_both.data = both.data;
    ahead.data = (float *)both.data + 5;
    losses_in.data = (float *)both.data + 1;
    test_expect_fail(loom_cross_entropy_backward(&ahead, &in_both, &targets, IGNORE, 1.0f),
                     LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, bwd,
                     "dlogits (3, 5) f32 on host partially overlaps logits",
                     "dlogits one row past logits");
    test_expect_fail(loom_cross_entropy_forward(&losses_in, &mean, &in_both, &targets, IGNORE),
                     LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd,
                     "losses (3) f32 on host overlaps logits", "losses inside logits");
    CHECK(memcmp(both.data, logits.data, 15 * sizeof(float)) == 0 &&
              ((float *)both.data)[19] == 42.0f,
          "logits written by a failed call");
    TEST_FREE(&both);
  }
  // A CUDA first tensor: unsupported without CUDA, else no device visible or logits on the host;
  // a CUDA tensor beside a host one is a bad call.
  loom_tensor_t on_gpu = losses;
  on_gpu.device = 0;
  test_expect_fail(loom_cross_entropy_forward(&on_gpu, &mean, &logits, &targets, IGNORE),
                   LOOM_ERR_UNSUPPORTED, LOOM_ERR_INVALID_ARG, fwd, NULL, "CUDA losses");
  on_gpu = logits;
  on_gpu.device = 0;
  test_expect_fail(loom_cross_entropy_forward(&losses, &mean, &on_gpu, &targets, IGNORE),
                   LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, fwd, NULL,
                   "logits on another device");

  for (int i = 0; i < 3; i++) {
    CHECK(((float *)losses.data)[i] == 42.0f, "losses[%d] written by a failed call", i);
  }
  for (int i = 0; i < 15; i++) {
    CHECK(((float *)dlogits.data)[i] == 42.0f, "dlogits[%d] written by a failed call", i);
  }
  CHECK(mean == 42.0f, "mean_loss written by a failed call");

  TEST_FREE(&logits, &dlogits, &losses, &targets, &logits16, &targets_f, &losses_i, &targets4,
            &losses4, &dlogits_t);
}

int main(void) {
  test_reference();
  test_all_ignored();
  test_finite_differences();
  test_bad_args();
  return check_exit("test_ops_loss");
}
