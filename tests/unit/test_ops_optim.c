/* test_ops_optim.c — loom_adamw_update, loom_sgd_update and loom_clip_grad_norm over several steps
 * against double-precision references of the PyTorch formulas, and argument checks. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// Tolerances:
// - AdamW and SGD: param, m, v and buf within atol 1e-6 + rtol 1e-5 of the double reference after
//   every one of several steps (each float step adds a few ulp; the step sizes are <= 0.1).
// - SGD's first step: buf equals grad + wd * param bitwise (PyTorch clones g into the buffer).
// - clip_grad_norm: the reported norm within rtol 1e-6 of the double norm (it is a float); the
//   clipped gradients within rtol 1e-6 of g * max_norm / (norm + 1e-6); gradients that need no
//   clipping are bitwise untouched.

// ---------------------------------------------------------------------------------------------
// Helpers

static double *to_double(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    d[i] = x[i];
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// AdamW

// torch.optim.AdamW (amsgrad off) in double.
static void ref_adamw(int64_t n, double *p, const float *g, double *m, double *v,
                      const loom_adamw_t *hp) {
  double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, eps = hp->eps, wd = hp->weight_decay;
  double bc1 = 1.0 - pow(b1, hp->step), bc2 = 1.0 - pow(b2, hp->step);
  for (int64_t i = 0; i < n; i++) {
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * g[i];
    v[i] = b2 * v[i] + (1.0 - b2) * (double)g[i] * g[i];
    p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
  }
}

static void adamw_case(test_rng_t *rng, int64_t n, loom_adamw_t hp, int steps) {
  char what[128];
  int64_t shape[2] = {1, n};
  loom_tensor_t p = test_tensor_f32(2, shape, "p"), g = test_tensor_f32(2, shape, "g");
  loom_tensor_t m = test_tensor_f32(2, shape, "m"), v = test_tensor_f32(2, shape, "v");
  test_fill_uniform(rng, test_floats(&p), n, -1, 1);
  double *pd = to_double(test_floats(&p), n), *md = to_double(test_floats(&m), n),
         *vd = to_double(test_floats(&v), n);
  for (int s = 0; s < steps; s++, hp.step++) {
    test_fill_uniform(rng, test_floats(&g), n, -1, 1);
    if (n > 3) {
      test_floats(&g)[3] = 0.0f; // a zero gradient: m = v = 0 must give no update, not 0/0
    }
    CHECK(loom_adamw_update(&p, &g, &m, &v, &hp) == LOOM_OK, "%s", loom_last_error(NULL));
    ref_adamw(n, pd, test_floats(&g), md, vd, &hp);
    snprintf(what, sizeof what, "adamw n=%lld lr=%g b1=%g b2=%g wd=%g step %d", (long long)n,
             (double)hp.lr, (double)hp.beta1, (double)hp.beta2, (double)hp.weight_decay, hp.step);
    CHECK(test_compare(what, test_floats(&p), pd, n, 1e-6, 1e-5) == 0, "%s: param", what);
    CHECK(test_compare(what, test_floats(&m), md, n, 1e-6, 1e-5) == 0, "%s: m", what);
    CHECK(test_compare(what, test_floats(&v), vd, n, 1e-6, 1e-5) == 0, "%s: v", what);
  }
  free(pd);
  free(md);
  free(vd);
  loom_tensor_free(&p);
  loom_tensor_free(&g);
  loom_tensor_free(&m);
  loom_tensor_free(&v);
}

static void test_adamw(void) {
  test_rng_t rng = test_rng(31);
  static const int64_t sizes[] = {1, 7, 1000, 4099};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    adamw_case(&rng, sizes[k], (loom_adamw_t){1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1}, 6);
    adamw_case(&rng, sizes[k], (loom_adamw_t){3e-3f, 0.0f, 0.5f, 1e-3f, 0.0f, 1}, 4);
    adamw_case(&rng, sizes[k], (loom_adamw_t){1e-1f, 0.8f, 0.99f, 1e-6f, 0.01f, 100}, 3);
  }

  // Step 1 in closed form: mhat = g, vhat = g^2, so p1 = p0 (1 - lr wd) - lr g / (|g| + eps).
  int64_t n = 3;
  loom_tensor_t p = test_tensor_f32(1, &n, "p"), g = test_tensor_f32(1, &n, "g");
  loom_tensor_t m = test_tensor_f32(1, &n, "m"), v = test_tensor_f32(1, &n, "v");
  const float p0[3] = {1.0f, -2.0f, 0.5f}, g0[3] = {0.25f, -4.0f, 1e-3f};
  memcpy(p.data, p0, sizeof p0);
  memcpy(g.data, g0, sizeof g0);
  loom_adamw_t hp = {0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1};
  CHECK(loom_adamw_update(&p, &g, &m, &v, &hp) == LOOM_OK, "%s", loom_last_error(NULL));
  for (int i = 0; i < 3; i++) {
    double lr = hp.lr, want = p0[i] * (1.0 - lr * hp.weight_decay) -
                              lr * g0[i] / (fabs((double)g0[i]) + (double)hp.eps);
    CHECK(fabs(test_floats(&p)[i] - want) <= 1e-6, "adamw step 1 [%d]: %.9g want %.9g", i,
          (double)test_floats(&p)[i], want);
  }
  // lr 0: the parameters do not move (bitwise), the moments still do: m = b1 m1 + (1 - b1) g,
  // v = b2 v1 + (1 - b2) g^2 from the step-1 moments. Each is two float products and a sum of
  // like-signed terms (no cancellation): a few ulp, well inside rtol 1e-6 (8 ulp of float).
  float m1[3], v1[3];
  memcpy(m1, m.data, sizeof m1);
  memcpy(v1, v.data, sizeof v1);
  memcpy(p.data, p0, sizeof p0);
  hp.lr = 0.0f;
  hp.step = 2;
  CHECK(loom_adamw_update(&p, &g, &m, &v, &hp) == LOOM_OK && !memcmp(p.data, p0, sizeof p0),
        "adamw with lr 0 moved the parameters");
  double m2[3], v2[3];
  for (int i = 0; i < 3; i++) {
    m2[i] = (double)hp.beta1 * m1[i] + (1.0 - (double)hp.beta1) * g0[i];
    v2[i] = (double)hp.beta2 * v1[i] + (1.0 - (double)hp.beta2) * (double)g0[i] * g0[i];
  }
  CHECK(test_compare("adamw lr 0: m", test_floats(&m), m2, 3, 0.0, 1e-6) == 0,
        "adamw with lr 0 must still update m = b1 m + (1 - b1) g");
  CHECK(test_compare("adamw lr 0: v", test_floats(&v), v2, 3, 0.0, 1e-6) == 0,
        "adamw with lr 0 must still update v = b2 v + (1 - b2) g^2");
  // An empty tensor is fine.
  int64_t zero = 0;
  loom_tensor_t e[4] = {test_tensor_f32(1, &zero, "e0"), test_tensor_f32(1, &zero, "e1"),
                        test_tensor_f32(1, &zero, "e2"), test_tensor_f32(1, &zero, "e3")};
  CHECK(loom_adamw_update(&e[0], &e[1], &e[2], &e[3], &hp) == LOOM_OK, "empty: %s",
        loom_last_error(NULL));
  for (int i = 0; i < 4; i++) {
    loom_tensor_free(&e[i]);
  }
  loom_tensor_free(&p);
  loom_tensor_free(&g);
  loom_tensor_free(&m);
  loom_tensor_free(&v);
}

// ---------------------------------------------------------------------------------------------
// SGD

// torch.optim.SGD (dampening 0) in double; buf NULL when momentum is 0.
static void ref_sgd(int64_t n, double *p, const float *grad, double *buf, const loom_sgd_t *hp) {
  double lr = hp->lr, mu = hp->momentum, wd = hp->weight_decay;
  for (int64_t i = 0; i < n; i++) {
    double g = grad[i] + wd * p[i];
    if (mu != 0.0) {
      buf[i] = mu * buf[i] + g;
      g = hp->nesterov ? g + mu * buf[i] : buf[i];
    }
    p[i] -= lr * g;
  }
}

static void sgd_case(test_rng_t *rng, int64_t n, loom_sgd_t hp, int with_buf, int steps) {
  char what[128];
  loom_tensor_t p = test_tensor_f32(1, &n, "p"), g = test_tensor_f32(1, &n, "g");
  loom_tensor_t b = test_tensor_f32(1, &n, "buf");
  test_fill_uniform(rng, test_floats(&p), n, -1, 1);
  if (hp.momentum == 0.0f && with_buf) {
    test_fill_uniform(rng, test_floats(&b), n, 5, 6); // must stay untouched
  }
  float *b0 = malloc(sizeof(float) * (size_t)(n + 1));
  memcpy(b0, b.data, sizeof(float) * (size_t)n);
  double *pd = to_double(test_floats(&p), n), *bd = to_double(test_floats(&b), n);
  for (int s = 0; s < steps; s++) {
    test_fill_uniform(rng, test_floats(&g), n, -1, 1);
    float *first = NULL;
    if (s == 0) { // what PyTorch puts in the buffer on the first step: g + wd * p, bitwise
      first = malloc(sizeof(float) * (size_t)(n + 1));
      for (int64_t i = 0; i < n; i++) {
        first[i] = test_floats(&g)[i] + hp.weight_decay * test_floats(&p)[i];
      }
    }
    CHECK(loom_sgd_update(&p, &g, with_buf ? &b : NULL, &hp) == LOOM_OK, "%s",
          loom_last_error(NULL));
    ref_sgd(n, pd, test_floats(&g), hp.momentum != 0.0f ? bd : NULL, &hp);
    snprintf(what, sizeof what, "sgd n=%lld lr=%g momentum=%g wd=%g nesterov=%d step %d",
             (long long)n, (double)hp.lr, (double)hp.momentum, (double)hp.weight_decay, hp.nesterov,
             s + 1);
    CHECK(test_compare(what, test_floats(&p), pd, n, 1e-6, 1e-5) == 0, "%s: param", what);
    if (hp.momentum != 0.0f) {
      CHECK(test_compare(what, test_floats(&b), bd, n, 1e-6, 1e-5) == 0, "%s: buf", what);
      if (first) {
        CHECK(!memcmp(first, b.data, sizeof(float) * (size_t)n),
              "%s: the first buffer is not g + wd * p", what);
      }
    } else if (with_buf) {
      CHECK(!memcmp(b0, b.data, sizeof(float) * (size_t)n), "%s: buf written with momentum 0",
            what);
    }
    free(first);
  }
  free(b0);
  free(pd);
  free(bd);
  loom_tensor_free(&p);
  loom_tensor_free(&g);
  loom_tensor_free(&b);
}

static void test_sgd(void) {
  test_rng_t rng = test_rng(37);
  static const int64_t sizes[] = {1, 7, 1000, 4099};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    int64_t n = sizes[k];
    sgd_case(&rng, n, (loom_sgd_t){0.1f, 0.9f, 0.0f, 0}, 1, 6);
    sgd_case(&rng, n, (loom_sgd_t){0.05f, 0.9f, 1e-2f, 1}, 1, 6);
    sgd_case(&rng, n, (loom_sgd_t){0.1f, 0.5f, 0.1f, 0}, 1, 5);
    sgd_case(&rng, n, (loom_sgd_t){0.1f, 0.0f, 1e-2f, 0}, 0, 4); // momentum 0, NULL buf
    sgd_case(&rng, n, (loom_sgd_t){0.1f, 0.0f, 0.0f, 0}, 1, 3);  // momentum 0, buf ignored
  }
}

// ---------------------------------------------------------------------------------------------
// clip_grad_norm

static void test_clip(void) {
  test_rng_t rng = test_rng(53);
  int64_t s1 = 1, s7 = 7, s0 = 0, s2[2] = {30, 10};
  loom_tensor_t a = test_tensor_f32(1, &s1, "a"), b = test_tensor_f32(1, &s7, "b");
  loom_tensor_t c = test_tensor_f32(2, s2, "c"), e = test_tensor_f32(1, &s0, "e");
  loom_tensor_t *grads[4] = {&a, &b, &e, &c};
  const int64_t total = 1 + 7 + 300;
  float keep[308], now[308];
  test_fill_uniform(&rng, test_floats(&a), 1, -1, 1);
  test_fill_uniform(&rng, test_floats(&b), 7, -1, 1);
  test_fill_uniform(&rng, test_floats(&c), 300, -1, 1);
  memcpy(keep, a.data, 4);
  memcpy(keep + 1, b.data, 28);
  memcpy(keep + 8, c.data, 1200);
  double sumsq = 0.0;
  for (int64_t i = 0; i < total; i++) {
    sumsq += (double)keep[i] * keep[i];
  }
  double norm = sqrt(sumsq);
  // Above the norm, at 0 and below 0: only measured, bitwise untouched.
  static const float no_clip[] = {1e9f, 0.0f, -1.0f, INFINITY};
  for (size_t k = 0; k < sizeof no_clip / sizeof no_clip[0]; k++) {
    float got = -1.0f;
    CHECK(loom_clip_grad_norm(grads, 4, no_clip[k], &got) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(fabs(got - norm) <= 1e-6 * norm, "max_norm %g: norm %.9g want %.9g", (double)no_clip[k],
          (double)got, norm);
    memcpy(now, a.data, 4);
    memcpy(now + 1, b.data, 28);
    memcpy(now + 8, c.data, 1200);
    CHECK(!memcmp(now, keep, sizeof keep), "max_norm %g changed the gradients", (double)no_clip[k]);
  }
  // Below the norm: every gradient scaled by max_norm / (norm + 1e-6); the new norm is max_norm.
  const float max_norm = (float)(norm / 3.0);
  float got = -1.0f;
  CHECK(loom_clip_grad_norm(grads, 4, max_norm, &got) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(fabs(got - norm) <= 1e-6 * norm, "clip: reported %.9g want %.9g (before clipping)",
        (double)got, norm);
  double coef = (double)max_norm / (norm + 1e-6), want[308];
  for (int64_t i = 0; i < total; i++) {
    want[i] = keep[i] * coef;
  }
  CHECK(test_compare("clip a", test_floats(&a), want, 1, 0, 1e-6) == 0, "clipped a");
  CHECK(test_compare("clip b", test_floats(&b), want + 1, 7, 0, 1e-6) == 0, "clipped b");
  CHECK(test_compare("clip c", test_floats(&c), want + 8, 300, 0, 1e-6) == 0, "clipped c");
  loom_tensor_t *cat[3] = {&a, &b, &c};
  CHECK(loom_clip_grad_norm(cat, 3, 0.0f, &got) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(fabs(got - max_norm) <= 1e-5 * max_norm, "norm after clipping %.9g want %.9g", (double)got,
        (double)max_norm);
  // NULL global_norm and n = 0 are fine; n = 0 measures 0. With NULL the gradients (norm
  // max_norm, about 3.4) are still clipped, to norm 1: each element is scaled in float (2^-24
  // relative), the double norm is rounded to float, and the coefficient's + 1e-6 is 3e-7 of the
  // norm; together below 5e-7, so rtol 2e-6.
  CHECK(loom_clip_grad_norm(grads, 4, 1.0f, NULL) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(max_norm > 2.0f, "the gradients' norm %g should be far above 1 for this check",
        (double)max_norm);
  got = -1.0f;
  CHECK(loom_clip_grad_norm(cat, 3, 0.0f, &got) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(fabs(got - 1.0) <= 2e-6, "clipping to 1 with NULL global_norm: norm after %.9g, want 1",
        (double)got);
  got = -1.0f;
  CHECK(loom_clip_grad_norm(NULL, 0, 1.0f, &got) == LOOM_OK && got == 0.0f, "n = 0: %g, %s",
        (double)got, loom_last_error(NULL));
  // A non-finite norm is reported and nothing is scaled (0 * Inf would make NaN).
  test_floats(&b)[2] = INFINITY;
  memcpy(now, b.data, 28);
  CHECK(loom_clip_grad_norm(grads, 4, 1.0f, &got) == LOOM_OK && isinf(got), "Inf norm: %g",
        (double)got);
  CHECK(!memcmp(now, b.data, 28), "an infinite norm scaled the gradients");
  // Finite gradients whose norm is past float's range: reported as Inf, so nothing is scaled
  // either (the caller sees a non-finite norm; it was scaled while Inf was reported).
  float *big = test_floats(&b);
  big[2] = 3e38f;
  big[3] = -3e38f;
  memcpy(now, b.data, 28);
  CHECK(loom_clip_grad_norm(grads, 4, 1.0f, &got) == LOOM_OK && isinf(got), "norm past FLT_MAX: %g",
        (double)got);
  CHECK(!memcmp(now, b.data, 28), "a norm reported as Inf scaled the gradients");
  big[2] = NAN; // and a NaN norm is reported as NaN (the trainers print it)
  memcpy(now, b.data, 28);
  CHECK(loom_clip_grad_norm(grads, 4, 1.0f, &got) == LOOM_OK && isnan(got), "NaN norm: %g",
        (double)got);
  CHECK(!memcmp(now, b.data, 28), "a NaN norm scaled the gradients");
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  loom_tensor_free(&e);
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: LOOM_ERR_INVALID_ARG, a message naming the op, and nothing written.

static void test_bad_args(void) {
  static const char ao[] = "loom_adamw_update", so[] = "loom_sgd_update";
  static const char co[] = "loom_clip_grad_norm";
  int64_t n = 4, n5 = 5, s22[2] = {2, 2};
  loom_tensor_t p = test_tensor_f32(1, &n, "p"), g = test_tensor_f32(1, &n, "g");
  loom_tensor_t m = test_tensor_f32(1, &n, "m"), v = test_tensor_f32(1, &n, "v");
  loom_tensor_t b = test_tensor_f32(1, &n, "b"), g5 = test_tensor_f32(1, &n5, "g5");
  loom_tensor_t g22 = test_tensor_f32(2, s22, "g22"), m16 = test_tensor(LOOM_F16, 1, &n, "m16");
  for (int i = 0; i < 4; i++) {
    test_floats(&p)[i] = 1.0f + (float)i;
    test_floats(&g)[i] = 0.5f;
    test_floats(&m)[i] = 0.25f;
    test_floats(&v)[i] = 0.125f;
    test_floats(&b)[i] = 2.0f;
  }
  float keep[5][4];
  loom_tensor_t *mine[5] = {&p, &g, &m, &v, &b};
  for (int k = 0; k < 5; k++) {
    memcpy(keep[k], mine[k]->data, sizeof keep[k]);
  }
  const loom_adamw_t good_a = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1};
  const loom_sgd_t good_s = {0.1f, 0.9f, 0.0f, 0};
  loom_adamw_t ha;
  loom_sgd_t hs;

  loom_error_clear();
  test_expect_fail(loom_adamw_update(NULL, &g, &m, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "NULL p");
  test_expect_fail(loom_adamw_update(&p, NULL, &m, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "NULL g");
  test_expect_fail(loom_adamw_update(&p, &g, NULL, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "NULL m");
  test_expect_fail(loom_adamw_update(&p, &g, &m, NULL, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "NULL v");
  test_expect_fail(loom_adamw_update(&p, &g, &m, &v, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "NULL hp");
  test_expect_fail(loom_adamw_update(&p, &g5, &m, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "grad (5)");
  test_expect_fail(loom_adamw_update(&p, &g22, &m, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "grad (2, 2) for param (4)");
  test_expect_fail(loom_adamw_update(&p, &g, &m16, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "f16 m");
  test_expect_fail(loom_adamw_update(&p, &g, &m, &m, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "m is v");
  test_expect_fail(loom_adamw_update(&p, &p, &m, &v, &good_a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "grad is p");
  struct {
    int field;
    float value;
  } bad_a[] = {{0, -1e-3f},   {0, NAN},   {0, INFINITY}, {1, 1.0f},    {1, -0.1f},  {1, NAN},
               {2, 1.0f},     {2, 1.5f},  {2, NAN},      {3, 0.0f},    {3, -1e-8f}, {3, NAN},
               {3, INFINITY}, {4, -0.1f}, {4, NAN},      {4, INFINITY}};
  for (size_t k = 0; k < sizeof bad_a / sizeof bad_a[0]; k++) {
    ha = good_a;
    float *f[5] = {&ha.lr, &ha.beta1, &ha.beta2, &ha.eps, &ha.weight_decay};
    *f[bad_a[k].field] = bad_a[k].value;
    test_expect_fail(loom_adamw_update(&p, &g, &m, &v, &ha), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, ao, NULL, "bad hyperparameter");
  }
  ha = good_a;
  ha.step = 0;
  test_expect_fail(loom_adamw_update(&p, &g, &m, &v, &ha), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "step 0");
  ha.step = -3;
  test_expect_fail(loom_adamw_update(&p, &g, &m, &v, &ha), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ao, NULL, "step -3");

  test_expect_fail(loom_sgd_update(NULL, &g, &b, &good_s), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, so, NULL, "NULL p");
  test_expect_fail(loom_sgd_update(&p, NULL, &b, &good_s), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, so, NULL, "NULL g");
  test_expect_fail(loom_sgd_update(&p, &g, NULL, &good_s), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, so, NULL, "NULL buf with momentum");
  test_expect_fail(loom_sgd_update(&p, &g, &b, NULL), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   so, NULL, "NULL hp");
  test_expect_fail(loom_sgd_update(&p, &g5, &b, &good_s), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, so, NULL, "grad (5)");
  test_expect_fail(loom_sgd_update(&p, &g, &g5, &good_s), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, so, NULL, "buf (5)");
  test_expect_fail(loom_sgd_update(&p, &g, &m16, &good_s), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, so, NULL, "f16 buf");
  test_expect_fail(loom_sgd_update(&p, &g, &g, &good_s), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   so, NULL, "buf is grad");
  struct {
    int field;
    float value;
  } bad_s[] = {{0, -0.1f}, {0, NAN},      {0, INFINITY}, {1, -0.5f},
               {1, NAN},   {1, INFINITY}, {2, -1e-4f},   {2, NAN}};
  for (size_t k = 0; k < sizeof bad_s / sizeof bad_s[0]; k++) {
    hs = good_s;
    float *f[3] = {&hs.lr, &hs.momentum, &hs.weight_decay};
    *f[bad_s[k].field] = bad_s[k].value;
    test_expect_fail(loom_sgd_update(&p, &g, &b, &hs), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                     so, NULL, "bad hyperparameter");
  }
  hs = good_s;
  hs.nesterov = 2;
  test_expect_fail(loom_sgd_update(&p, &g, &b, &hs), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, so,
                   NULL, "nesterov 2");
  hs.nesterov = 1;
  hs.momentum = 0.0f;
  test_expect_fail(loom_sgd_update(&p, &g, &b, &hs), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, so,
                   NULL, "nesterov without momentum");

  loom_tensor_t *list[3] = {&g, &m, NULL};
  float norm = 42.0f;
  test_expect_fail(loom_clip_grad_norm(list, -1, 1.0f, &norm), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, co, NULL, "n -1");
  test_expect_fail(loom_clip_grad_norm(NULL, 2, 1.0f, &norm), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, co, NULL, "NULL grads");
  test_expect_fail(loom_clip_grad_norm(list, 3, 1e-3f, &norm), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, co, NULL, "NULL grads[2]");
  list[2] = &m16;
  test_expect_fail(loom_clip_grad_norm(list, 3, 1e-3f, &norm), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, co, NULL, "f16 grads[2]");
  test_expect_fail(loom_clip_grad_norm(list, 2, NAN, &norm), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, co, NULL, "NaN max_norm");
  loom_tensor_t on_gpu = g;
  on_gpu.device = 0;
  list[0] = &on_gpu;
  test_expect_fail(loom_clip_grad_norm(list, 2, 1e-3f, &norm), LOOM_ERR_UNSUPPORTED,
                   LOOM_ERR_INVALID_ARG, co, NULL, "CUDA grads[0]");
  list[0] = &g;
  list[1] = &on_gpu;
  test_expect_fail(loom_clip_grad_norm(list, 2, 1e-3f, &norm), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, co, NULL, "grads[1] on another device");
  CHECK(norm == 42.0f, "global_norm written by a failed call");

  for (int k = 0; k < 5; k++) {
    CHECK(!memcmp(keep[k], mine[k]->data, sizeof keep[k]), "%s written by a failed call",
          mine[k]->name);
  }
  TEST_FREE(&p, &g, &m, &v, &b, &g5, &g22, &m16);
}

int main(void) {
  test_adamw();
  test_sgd();
  test_clip();
  test_bad_args();
  return check_exit("test_ops_optim");
}
