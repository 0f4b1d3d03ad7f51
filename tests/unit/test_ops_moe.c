/* test_ops_moe.c — the MoE router (loom_moe_router_forward/backward, loom_moe_aux_loss) against
 * double-precision references, ties, balanced routing, finite differences and argument checks. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// Tolerances (float kernels against double references):
// - probs: atol 1e-6 + rtol 1e-5 (expf and two float roundings per element).
// - weight: atol 1e-6 + rtol 1e-5 (a float probability over a double sum); row sums within 1e-5.
// - idx: exact, against a top-K of loom's own float probs with the tie rule; and the kept set
//   must be the top of the double reference up to 1e-6 (near-equal probabilities may swap).
// - aux: rtol 1e-5 (sums in double, one float rounding at the end).
// - dprobs of aux, against central differences (h = 1e-3) of the double formula, which is linear
//   in probs (no truncation error): atol 1e-6 * |coef| + rtol 1e-5. Balanced routing: rtol 1e-6.
// - dlogits against the double backward formula: atol 2e-6 * max|dp| + rtol 1e-4 (loom's float
//   probs and weight are the inputs; p * (dp - dot) cancels, so the error is absolute).
// - finite differences of the double loss (h = 1e-5, truncation ~h^2): atol 1e-6, rtol 1e-4.
// - finite differences of loom's own float forward (eps = 1e-3; float rounding of the loss
//   / 2 eps ~ 5e-5): atol 1e-4, rtol 1e-3.

// ---------------------------------------------------------------------------------------------
// References

// Double softmax of the row x (e entries).
static void ref_softmax(const double *x, int64_t e, double *p) {
  double mx = -INFINITY, s = 0.0;
  for (int64_t j = 0; j < e; j++) {
    mx = fmax(mx, x[j]);
  }
  for (int64_t j = 0; j < e; j++) {
    p[j] = exp(x[j] - mx);
    s += p[j];
  }
  for (int64_t j = 0; j < e; j++) {
    p[j] /= s;
  }
}

// The K largest of p (e entries) in descending order, ties to the lower index: a stable
// insertion into the kept list.
static void ref_topk(const float *p, int64_t e, int64_t k, int32_t *idx) {
  int64_t n = 0;
  for (int64_t j = 0; j < e; j++) {
    int64_t at = n;
    while (at > 0 && p[j] > p[idx[at - 1]]) {
      at--;
    }
    if (at >= k) {
      continue;
    }
    for (int64_t m = (n < k ? n : k - 1); m > at; m--) {
      idx[m] = idx[m - 1];
    }
    idx[at] = (int32_t)j;
    n += n < k;
  }
}

// Double aux loss: coef * E * sum_e f_e P_e.
static double ref_aux(const float *probs, const int32_t *idx, int64_t t, int64_t e, int64_t k,
                      double coef) {
  if (t == 0) {
    return 0.0;
  }
  double total = 0.0;
  for (int64_t x = 0; x < e; x++) {
    double f = 0.0, P = 0.0;
    for (int64_t i = 0; i < t * k; i++) {
      f += idx[i] == x;
    }
    for (int64_t r = 0; r < t; r++) {
      P += probs[r * e + x];
    }
    total += f / (double)(t * k) * (P / (double)t);
  }
  return coef * (double)e * total;
}

// The router loss L = sum(dw * weight) + sum(extra * probs) over logits x (double, T x E) with
// the selection idx held fixed.
static double ref_router_loss(const double *x, int64_t t, int64_t e, int64_t k, const int32_t *idx,
                              const float *dw, const float *extra) {
  double L = 0.0, *p = malloc(sizeof(double) * (size_t)e);
  for (int64_t r = 0; r < t; r++) {
    ref_softmax(x + r * e, e, p);
    double S = 0.0;
    for (int64_t m = 0; m < k; m++) {
      S += p[idx[r * k + m]];
    }
    for (int64_t m = 0; m < k; m++) {
      L += (double)dw[r * k + m] * p[idx[r * k + m]] / S;
    }
    for (int64_t j = 0; extra && j < e; j++) {
      L += (double)extra[r * e + j] * p[j];
    }
  }
  free(p);
  return L;
}

// The analytic gradient of ref_router_loss (double), into dx (T x E).
static void ref_router_backward(const double *x, int64_t t, int64_t e, int64_t k,
                                const int32_t *idx, const float *dw, const float *extra,
                                double *dx) {
  double *p = malloc(sizeof(double) * (size_t)e), *dp = malloc(sizeof(double) * (size_t)e);
  for (int64_t r = 0; r < t; r++) {
    ref_softmax(x + r * e, e, p);
    double S = 0.0, s = 0.0, dot = 0.0;
    for (int64_t m = 0; m < k; m++) {
      S += p[idx[r * k + m]];
    }
    for (int64_t m = 0; m < k; m++) {
      s += (double)dw[r * k + m] * p[idx[r * k + m]] / S;
    }
    for (int64_t j = 0; j < e; j++) {
      dp[j] = extra ? (double)extra[r * e + j] : 0.0;
    }
    for (int64_t m = 0; m < k; m++) {
      dp[idx[r * k + m]] += ((double)dw[r * k + m] - s) / S;
    }
    for (int64_t j = 0; j < e; j++) {
      dot += dp[j] * p[j];
    }
    for (int64_t j = 0; j < e; j++) {
      dx[r * e + j] = p[j] * (dp[j] - dot);
    }
  }
  free(p);
  free(dp);
}

static double *to_doubles(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    d[i] = x[i];
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Forward against the reference

typedef struct router_case {
  int64_t t, e, k;
  double offset; // added to every logit (stability)
} router_case_t;

static void run_forward(test_rng_t *rng, const router_case_t *c) {
  char what[128];
  const int64_t T = c->t, E = c->e, K = c->k;
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t logits = test_tensor_f32(2, se, "logits"), probs = test_tensor_f32(2, se, "probs");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), weight = test_tensor_f32(2, sk, "w");
  float *x = logits.data, *p = probs.data, *w = weight.data;
  int32_t *ix = idx.data;
  test_fill_uniform(rng, x, T * E, c->offset - 4.0, c->offset + 4.0);
  test_fill_value(p, T * E, NAN); // every output element must be overwritten
  test_fill_value(w, T * K, NAN);
  for (int64_t i = 0; i < T * K; i++) {
    ix[i] = -7;
  }
  snprintf(what, sizeof what, "forward T=%lld E=%lld K=%lld offset %g", (long long)T, (long long)E,
           (long long)K, c->offset);
  loom_status_t st = loom_moe_router_forward(&probs, &idx, &weight, &logits);
  CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error(NULL));

  double *xd = to_doubles(x, T * E), *pd = malloc(sizeof(double) * (size_t)(T * E + 1));
  double *wd = malloc(sizeof(double) * (size_t)(T * K + 1));
  int32_t *want_idx = malloc(sizeof(int32_t) * (size_t)(K + 1));
  for (int64_t r = 0; r < T; r++) {
    ref_softmax(xd + r * E, E, pd + r * E);
  }
  CHECK(test_compare(what, p, pd, T * E, 1e-6, 1e-5) == 0, "%s: probs", what);
  for (int64_t r = 0; r < T; r++) {
    const int32_t *got = ix + r * K;
    ref_topk(p + r * E, E, K, want_idx);
    CHECK(memcmp(got, want_idx, sizeof(int32_t) * (size_t)K) == 0,
          "%s: row %lld idx differs from the top-K of its probs (first %d, want %d)", what,
          (long long)r, (int)got[0], (int)want_idx[0]);
    // The kept set is the top of the double reference, up to near-ties.
    double kept_min = INFINITY, rest_max = -INFINITY, S = 0.0, wsum = 0.0;
    for (int64_t j = 0; j < E; j++) {
      int kept = 0;
      for (int64_t m = 0; m < K; m++) {
        kept |= got[m] == j;
      }
      if (kept) {
        kept_min = fmin(kept_min, pd[r * E + j]);
      } else {
        rest_max = fmax(rest_max, pd[r * E + j]);
      }
    }
    CHECK(kept_min >= rest_max - 1e-6, "%s: row %lld keeps %g but drops %g", what, (long long)r,
          kept_min, rest_max);
    for (int64_t m = 0; m < K; m++) {
      S += pd[r * E + got[m]];
    }
    for (int64_t m = 0; m < K; m++) {
      wd[r * K + m] = pd[r * E + got[m]] / S;
      wsum += w[r * K + m];
    }
    CHECK(fabs(wsum - 1.0) <= 1e-5, "%s: row %lld weights sum to %.9g", what, (long long)r, wsum);
  }
  CHECK(test_compare(what, w, wd, T * K, 1e-6, 1e-5) == 0, "%s: weight", what);
  free(xd);
  free(pd);
  free(wd);
  free(want_idx);
  TEST_FREE(&logits, &probs, &idx, &weight);
}

static void test_forward(void) {
  test_rng_t rng = test_rng(31);
  static const router_case_t cases[] = {
      {0, 4, 2, 0.0},   {0, 1, 1, 0.0},    {1, 1, 1, 0.0},     {5, 4, 1, 0.0},
      {5, 4, 4, 0.0},   {7, 8, 2, 0.0},    {16, 64, 8, 0.0},   {3, 128, 128, 0.0},
      {9, 16, 16, 0.0}, {6, 8, 2, 1000.0}, {6, 8, 3, -1000.0}, {33, 256, 1, 0.0},
      {2, 3, 3, 50.0},  {100, 32, 4, 0.0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_forward(&rng, &cases[i]);
  }
  for (int r = 0; r < 20; r++) {
    router_case_t c = {test_int(&rng, 0, 40), test_int(&rng, 1, 70), 1, 0.0};
    c.k = test_int(&rng, 1, c.e);
    run_forward(&rng, &c);
  }
  // A leading batch may be flattened: (2, 3, E) logits with (6, K) outputs.
  int64_t s3[3] = {2, 3, 5}, se[2] = {6, 5}, sk[2] = {6, 2};
  loom_tensor_t x3 = test_tensor_f32(3, s3, "logits3"), p = test_tensor_f32(2, se, "probs");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), w = test_tensor_f32(2, sk, "w");
  loom_tensor_t x2 = test_tensor_f32(2, se, "logits2"), p2 = test_tensor_f32(2, se, "probs2");
  loom_tensor_t idx2 = test_tensor(LOOM_I32, 2, sk, "idx2"), w2 = test_tensor_f32(2, sk, "w2");
  test_fill_uniform(&rng, x3.data, 30, -2, 2);
  test_copy_floats(x2.data, x3.data, 30);
  test_fill_value(p.data, 30, NAN);
  test_fill_value(w.data, 12, NAN);
  CHECK(loom_moe_router_forward(&p, &idx, &w, &x3) == LOOM_OK, "flattened batch: %s",
        loom_last_error(NULL));
  // The same bits as the (6, E) logits: every row is routed, none twice.
  CHECK(loom_moe_router_forward(&p2, &idx2, &w2, &x2) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_same_bits(p.data, p2.data, 30) && test_same_bits(w.data, w2.data, 12) &&
            !memcmp(idx.data, idx2.data, sizeof(int32_t) * 12),
        "flattened batch: the outputs differ from those of the (6, 5) logits");
  TEST_FREE(&x3, &p, &idx, &w, &x2, &p2, &idx2, &w2);
}

// ---------------------------------------------------------------------------------------------
// Ties: equal probabilities go to the lower expert index.

static void test_ties(void) {
  enum { T = 6, E = 5, K = 3 };
  static const float x[T][E] = {
      {0, 0, 0, 0, 0},             // all equal: 0, 1, 2
      {1, 3, 3, 0, 3},             // 1, 2, 4
      {2, 2, 1, 1, 1},             // 0, 1, 2
      {-1, 5, -1, 5, -1},          // 3 ranks after 1, then the lowest of the -1s: 1, 3, 0
      {4, 4, 4, 4, 7},             // 4, 0, 1
      {-INFINITY, 1, 1, 1, 1e-30f} // 1, 2, 3
  };
  static const int32_t want[T][K] = {{0, 1, 2}, {1, 2, 4}, {0, 1, 2},
                                     {1, 3, 0}, {4, 0, 1}, {1, 2, 3}};
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t logits = test_tensor_f32(2, se, "logits"), probs = test_tensor_f32(2, se, "probs");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), weight = test_tensor_f32(2, sk, "w");
  test_copy_floats(logits.data, &x[0][0], T * E);
  CHECK(loom_moe_router_forward(&probs, &idx, &weight, &logits) == LOOM_OK, "ties: %s",
        loom_last_error(NULL));
  const int32_t *ix = idx.data;
  const float *w = weight.data;
  for (int r = 0; r < T; r++) {
    CHECK(!memcmp(ix + r * K, want[r], sizeof want[r]), "ties row %d: idx %d %d %d, want %d %d %d",
          r, (int)ix[r * K], (int)ix[r * K + 1], (int)ix[r * K + 2], (int)want[r][0],
          (int)want[r][1], (int)want[r][2]);
  }
  for (int m = 0; m < K; m++) {
    CHECK(fabsf(w[m] - 1.0f / 3.0f) <= 1e-7f, "equal logits: weight %d = %.9g, want 1/3", m,
          (double)w[m]);
  }
  // Determinism: a second call gives the same bits.
  loom_tensor_t idx2 = test_tensor(LOOM_I32, 2, sk, "idx2"), w2 = test_tensor_f32(2, sk, "w2");
  CHECK(loom_moe_router_forward(&probs, &idx2, &w2, &logits) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(!memcmp(idx.data, idx2.data, sizeof(int32_t) * T * K) && test_same_bits(w, w2.data, T * K),
        "a second forward differs");

  // Degenerate rows still give K distinct valid experts: all -inf (no mass: weight 0) and NaN.
  float *xl = logits.data;
  for (int j = 0; j < E; j++) {
    xl[j] = -INFINITY;
    xl[E + j] = j == 2 ? NAN : (float)j;
  }
  CHECK(loom_moe_router_forward(&probs, &idx, &weight, &logits) == LOOM_OK, "%s",
        loom_last_error(NULL));
  for (int r = 0; r < 2; r++) {
    for (int m = 0; m < K; m++) {
      int32_t v = ix[r * K + m];
      CHECK(v >= 0 && v < E, "degenerate row %d: idx %d out of range", r, (int)v);
      for (int q = 0; q < m; q++) {
        CHECK(ix[r * K + q] != v, "degenerate row %d: expert %d kept twice", r, (int)v);
      }
    }
  }
  CHECK(ix[0] == 0 && ix[1] == 1 && ix[2] == 2 && w[0] == 0.0f && w[1] == 0.0f && w[2] == 0.0f,
        "-inf row: idx %d %d %d weights %g %g %g, want 0 1 2 and zero weights", (int)ix[0],
        (int)ix[1], (int)ix[2], (double)w[0], (double)w[1], (double)w[2]);
  TEST_FREE(&logits, &probs, &idx, &weight, &idx2, &w2);
}

// ---------------------------------------------------------------------------------------------
// The aux loss

static void run_aux(test_rng_t *rng, int64_t T, int64_t E, int64_t K, float coef) {
  char what[128];
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t logits = test_tensor_f32(2, se, "logits"), probs = test_tensor_f32(2, se, "probs");
  loom_tensor_t dprobs = test_tensor_f32(2, se, "dprobs"), before = test_tensor_f32(2, se, "b");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), weight = test_tensor_f32(2, sk, "w");
  test_fill_uniform(rng, logits.data, T * E, -3, 3);
  CHECK(loom_moe_router_forward(&probs, &idx, &weight, &logits) == LOOM_OK, "%s",
        loom_last_error(NULL));
  test_fill_uniform(rng, dprobs.data, T * E, -1, 1); // accumulated into
  test_copy_floats(before.data, dprobs.data, T * E);
  snprintf(what, sizeof what, "aux T=%lld E=%lld K=%lld coef %g", (long long)T, (long long)E,
           (long long)K, (double)coef);

  float aux = NAN, aux2 = NAN;
  CHECK(loom_moe_aux_loss(&aux, &dprobs, &probs, &idx, coef) == LOOM_OK, "%s: %s", what,
        loom_last_error(NULL));
  CHECK(loom_moe_aux_loss(&aux2, NULL, &probs, &idx, coef) == LOOM_OK && aux2 == aux,
        "%s: NULL dprobs gives %g, with dprobs %g", what, (double)aux2, (double)aux);
  double want = ref_aux(probs.data, idx.data, T, E, K, coef);
  CHECK(fabs(aux - want) <= 1e-5 * fabs(want) + 1e-12, "%s: %.9g want %.9g", what, (double)aux,
        want);

  // dprobs: before + the gradient, against central differences of the double formula (f fixed:
  // idx does not move; the loss is linear in probs, so h only meets rounding).
  double *g = malloc(sizeof(double) * (size_t)(T * E + 1));
  float *pf = probs.data, *b = before.data;
  for (int64_t i = 0; i < T * E; i++) {
    const float keep = pf[i];
    const double h = 1e-3;
    pf[i] = (float)(keep + h);
    double up = ref_aux(pf, idx.data, T, E, K, coef), hu = (double)pf[i] - keep;
    pf[i] = (float)(keep - h);
    double down = ref_aux(pf, idx.data, T, E, K, coef), hd = keep - (double)pf[i];
    pf[i] = keep;
    g[i] = (double)b[i] + (up - down) / (hu + hd);
  }
  CHECK(test_compare(what, dprobs.data, g, T * E, 1e-6 * fabs(coef), 1e-5) == 0,
        "%s: dprobs vs finite differences", what);
  free(g);
  TEST_FREE(&logits, &probs, &dprobs, &before, &idx, &weight);
}

// Balanced routing: f_e = 1/E for every e, so E * sum_e f_e P_e = sum_e P_e = 1 for any probs
// whose rows sum to 1, and aux == coef.
static void test_aux_balanced(test_rng_t *rng, int64_t E, int64_t K, int uniform) {
  const int64_t T = 3 * E;
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t probs = test_tensor_f32(2, se, "probs"), dprobs = test_tensor_f32(2, se, "dp");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx");
  float *p = probs.data;
  int32_t *ix = idx.data;
  for (int64_t r = 0; r < T; r++) {
    double s = 0.0;
    for (int64_t j = 0; j < E; j++) {
      p[r * E + j] = uniform ? 1.0f / (float)E : (float)test_uniform(rng, 0.1, 1.0);
      s += p[r * E + j];
    }
    for (int64_t j = 0; j < E && !uniform; j++) {
      p[r * E + j] = (float)(p[r * E + j] / s);
    }
    for (int64_t m = 0; m < K; m++) {
      ix[r * K + m] = (int32_t)((r + m) % E); // every expert gets K * T / E = 3K assignments
    }
  }
  test_fill_value(dprobs.data, T * E, 0.0f);
  const float coef = 0.01f;
  float aux = NAN;
  CHECK(loom_moe_aux_loss(&aux, &dprobs, &probs, &idx, coef) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(fabs((double)aux - coef) <= 1e-6 * coef, "balanced E=%lld K=%lld %s: aux %.9g want %g",
        (long long)E, (long long)K, uniform ? "uniform" : "random", (double)aux, (double)coef);
  // The gradient is coef * E * (1/E) / T = coef / T everywhere.
  double want = (double)coef / (double)T;
  const float *d = dprobs.data;
  for (int64_t i = 0; i < T * E; i++) {
    CHECK(fabs(d[i] - want) <= 1e-6 * want, "balanced dprobs[%lld] = %.9g want %.9g", (long long)i,
          (double)d[i], want);
  }
  TEST_FREE(&probs, &dprobs, &idx);
}

static void test_aux(void) {
  test_rng_t rng = test_rng(47);
  run_aux(&rng, 1, 1, 1, 0.01f);
  run_aux(&rng, 8, 4, 2, 0.01f);
  run_aux(&rng, 8, 4, 4, 1.0f);
  run_aux(&rng, 13, 8, 1, 0.1f);
  run_aux(&rng, 32, 16, 4, 0.01f);
  run_aux(&rng, 5, 64, 8, -0.5f);
  run_aux(&rng, 7, 3, 3, 0.0f);
  for (int r = 0; r < 10; r++) {
    int64_t e = test_int(&rng, 1, 20);
    run_aux(&rng, test_int(&rng, 1, 30), e, test_int(&rng, 1, e), 0.02f);
  }
  test_aux_balanced(&rng, 4, 1, 1);
  test_aux_balanced(&rng, 8, 2, 1);
  test_aux_balanced(&rng, 8, 8, 0);
  test_aux_balanced(&rng, 16, 4, 0);

  // T = 0: aux 0 and nothing to add.
  int64_t se[2] = {0, 4}, sk[2] = {0, 2};
  loom_tensor_t p0 = test_tensor_f32(2, se, "p0"), d0 = test_tensor_f32(2, se, "d0");
  loom_tensor_t i0 = test_tensor(LOOM_I32, 2, sk, "i0");
  float aux = NAN;
  CHECK(loom_moe_aux_loss(&aux, &d0, &p0, &i0, 0.01f) == LOOM_OK && aux == 0.0f,
        "T = 0: %s, aux %g", loom_last_error(NULL), (double)aux);
  TEST_FREE(&p0, &d0, &i0);
}

// ---------------------------------------------------------------------------------------------
// The backward

// Logits with clear gaps (>= 0.3 between any two of a row) so that a perturbation of 1e-3 never
// changes the selection: 0.4 * a random permutation + noise in +-0.05.
static void fill_gapped(test_rng_t *rng, float *x, int64_t T, int64_t E) {
  int64_t *perm = malloc(sizeof(int64_t) * (size_t)E);
  for (int64_t r = 0; r < T; r++) {
    for (int64_t j = 0; j < E; j++) {
      perm[j] = j;
    }
    for (int64_t j = E - 1; j > 0; j--) {
      int64_t q = test_int(rng, 0, j), tmp = perm[j];
      perm[j] = perm[q];
      perm[q] = tmp;
    }
    for (int64_t j = 0; j < E; j++) {
      x[r * E + j] =
          (float)(0.4 * (double)perm[j] - 0.2 * (double)E + test_uniform(rng, -0.05, 0.05));
    }
  }
  free(perm);
}

static void run_backward(test_rng_t *rng, int64_t T, int64_t E, int64_t K, int with_extra,
                         int finite_diff) {
  char what[128];
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t logits = test_tensor_f32(2, se, "logits"), probs = test_tensor_f32(2, se, "probs");
  loom_tensor_t dlogits = test_tensor_f32(2, se, "dlogits"), extra = test_tensor_f32(2, se, "ex");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), weight = test_tensor_f32(2, sk, "w");
  loom_tensor_t dweight = test_tensor_f32(2, sk, "dw"), idx2 = test_tensor(LOOM_I32, 2, sk, "i2");
  float *x = logits.data, *ex = with_extra ? extra.data : NULL;
  fill_gapped(rng, x, T, E);
  test_fill_uniform(rng, dweight.data, T * K, -1, 1);
  test_fill_uniform(rng, extra.data, T * E, -1, 1);
  test_fill_uniform(rng, dlogits.data, T * E, 50, 60); // overwritten
  snprintf(what, sizeof what, "backward T=%lld E=%lld K=%lld%s", (long long)T, (long long)E,
           (long long)K, with_extra ? " with extra" : "");
  CHECK(loom_moe_router_forward(&probs, &idx, &weight, &logits) == LOOM_OK, "%s",
        loom_last_error(NULL));
  loom_status_t st = loom_moe_router_backward(&dlogits, &dweight, &probs, &idx, &weight,
                                              with_extra ? &extra : NULL);
  CHECK(st == LOOM_OK, "%s: %s", what, loom_last_error(NULL));

  // (a) The analytic double gradient.
  double *xd = to_doubles(x, T * E), *want = malloc(sizeof(double) * (size_t)(T * E + 1));
  ref_router_backward(xd, T, E, K, idx.data, dweight.data, ex, want);
  double dpmax = 2.0 + (with_extra ? 1.0 : 0.0); // |dp| <= |extra| + 2 max|dweight| / S
  CHECK(test_compare(what, dlogits.data, want, T * E, 2e-6 * dpmax, 1e-4) == 0,
        "%s: against the analytic reference", what);

  // (b) Central differences of the double loss (h = 1e-5).
  if (finite_diff) {
    for (int64_t i = 0; i < T * E; i++) {
      const double h = 1e-5, keep = xd[i];
      xd[i] = keep + h;
      double up = ref_router_loss(xd, T, E, K, idx.data, dweight.data, ex);
      xd[i] = keep - h;
      double down = ref_router_loss(xd, T, E, K, idx.data, dweight.data, ex);
      xd[i] = keep;
      want[i] = (up - down) / (2 * h);
    }
    CHECK(test_compare(what, dlogits.data, want, T * E, 1e-6, 1e-4) == 0,
          "%s: against finite differences of the double loss", what);

    // (c) Central differences of loom's own forward (eps = 1e-3), the selection unchanged.
    for (int64_t i = 0; i < T * E; i++) {
      const float keep = x[i];
      float at[2] = {keep + 1e-3f, keep - 1e-3f};
      double L[2];
      for (int s = 0; s < 2; s++) {
        x[i] = at[s];
        CHECK(loom_moe_router_forward(&probs, &idx2, &weight, &logits) == LOOM_OK, "%s",
              loom_last_error(NULL));
        CHECK(!memcmp(idx2.data, idx.data, sizeof(int32_t) * (size_t)(T * K)),
              "%s: the selection moved under a perturbation of logit %lld", what, (long long)i);
        L[s] = test_dot(dweight.data, weight.data, T * K) +
               (ex ? test_dot(ex, probs.data, T * E) : 0.0);
      }
      x[i] = keep;
      want[i] = (L[0] - L[1]) / ((double)at[0] - (double)at[1]);
    }
    CHECK(test_compare(what, dlogits.data, want, T * E, 1e-4, 1e-3) == 0,
          "%s: against finite differences of loom's forward", what);
  }

  // In place (dlogits is dprobs_extra): bitwise the same as out of place.
  if (with_extra) {
    CHECK(loom_moe_router_forward(&probs, &idx, &weight, &logits) == LOOM_OK, "%s",
          loom_last_error(NULL));
    CHECK(loom_moe_router_backward(&dlogits, &dweight, &probs, &idx, &weight, &extra) == LOOM_OK,
          "%s", loom_last_error(NULL));
    CHECK(loom_moe_router_backward(&extra, &dweight, &probs, &idx, &weight, &extra) == LOOM_OK,
          "%s: in place: %s", what, loom_last_error(NULL));
    CHECK(test_same_bits(extra.data, dlogits.data, T * E), "%s: in place differs", what);
  }
  free(xd);
  free(want);
  TEST_FREE(&logits, &probs, &dlogits, &extra, &idx, &weight, &dweight, &idx2);
}

static void test_backward(void) {
  test_rng_t rng = test_rng(59);
  static const int64_t shapes[][3] = {{1, 1, 1}, {1, 2, 1}, {4, 4, 2},  {3, 4, 4},
                                      {5, 8, 1}, {6, 8, 2}, {4, 16, 4}, {2, 16, 16}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    for (int with_extra = 0; with_extra < 2; with_extra++) {
      run_backward(&rng, shapes[i][0], shapes[i][1], shapes[i][2], with_extra, 1);
    }
  }
  run_backward(&rng, 64, 128, 8, 1, 0);
  run_backward(&rng, 0, 8, 2, 1, 1);

  // The aux loss's gradient as dprobs_extra: the router gradient of coef * aux equals the
  // backward with that extra (chained through loom_moe_aux_loss).
  const int64_t T = 6, E = 4, K = 2;
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t logits = test_tensor_f32(2, se, "logits"), probs = test_tensor_f32(2, se, "probs");
  loom_tensor_t dprobs = test_tensor_f32(2, se, "dp"), dlogits = test_tensor_f32(2, se, "dl");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), weight = test_tensor_f32(2, sk, "w");
  loom_tensor_t dweight = test_tensor_f32(2, sk, "dw");
  fill_gapped(&rng, logits.data, T, E);
  test_fill_value(dweight.data, T * K, 0.0f);
  test_fill_value(dprobs.data, T * E, 0.0f);
  float aux = 0.0f;
  CHECK(loom_moe_router_forward(&probs, &idx, &weight, &logits) == LOOM_OK &&
            loom_moe_aux_loss(&aux, &dprobs, &probs, &idx, 0.5f) == LOOM_OK &&
            loom_moe_router_backward(&dlogits, &dweight, &probs, &idx, &weight, &dprobs) == LOOM_OK,
        "aux chain: %s", loom_last_error(NULL));
  // d aux / d logits with f fixed, by central differences of the double aux over the softmax.
  double *xd = to_doubles(logits.data, T * E), *fd = malloc(sizeof(double) * (size_t)(T * E));
  double *pd = malloc(sizeof(double) * (size_t)E);
  for (int64_t i = 0; i < T * E; i++) {
    double L[2];
    const double keep = xd[i], h = 1e-5;
    for (int s = 0; s < 2; s++) {
      xd[i] = keep + (s ? -h : h);
      // aux = coef * E * sum_e f_e mean_r p_re over double probs (float ones would lose the h).
      double total = 0.0;
      for (int64_t r = 0; r < T; r++) {
        ref_softmax(xd + r * E, E, pd);
        for (int64_t j = 0; j < E; j++) {
          double f = 0.0;
          for (int64_t q = 0; q < T * K; q++) {
            f += ((int32_t *)idx.data)[q] == j;
          }
          total += f / (double)(T * K) * pd[j] / (double)T;
        }
      }
      L[s] = 0.5 * (double)E * total;
    }
    xd[i] = keep;
    fd[i] = (L[0] - L[1]) / (2 * h);
  }
  CHECK(test_compare("aux chain", dlogits.data, fd, T * E, 1e-6, 1e-4) == 0,
        "router gradient of the aux loss");
  free(xd);
  free(fd);
  free(pd);
  TEST_FREE(&logits, &probs, &dprobs, &dlogits, &idx, &weight, &dweight);
}

// ---------------------------------------------------------------------------------------------
// Guards: the three ops write exactly their outputs. Every tensor is wrapped inside sentinels
// (test_guarded_f32; idx is its i32 view) that must survive each call, and the outputs equal those
// of the same calls on plain tensors, bit for bit.

static void test_guards(void) {
  test_rng_t rng = test_rng(61);
  static const int64_t gshapes[][3] = {{1, 1, 1}, {3, 5, 2}, {7, 16, 4}, {4, 8, 8}};
  for (int s = 0; s < 4; s++) {
    const int64_t T = gshapes[s][0], E = gshapes[s][1], K = gshapes[s][2];
    int64_t se[2] = {T, E}, sk[2] = {T, K};
    test_guarded_t x = test_guarded_f32(2, se, "logits"), p = test_guarded_f32(2, se, "probs");
    test_guarded_t ix = test_guarded_f32(2, sk, "idx"), w = test_guarded_f32(2, sk, "weight");
    test_guarded_t dl = test_guarded_f32(2, se, "dlogits"), dp = test_guarded_f32(2, se, "dprobs");
    test_guarded_t dw = test_guarded_f32(2, sk, "dweight");
    CHECK(loom_tensor_wrap(&ix.t, ix.buf + TEST_GUARD, LOOM_I32, LOOM_DEVICE_HOST, 2, sk, "idx") ==
              LOOM_OK,
          "%s", loom_last_error(NULL));
    test_guarded_t *const all[] = {&x, &p, &ix, &w, &dl, &dp, &dw};
    loom_tensor_t rp = test_tensor_f32(2, se, "rp"), ridx = test_tensor(LOOM_I32, 2, sk, "ridx");
    loom_tensor_t rw = test_tensor_f32(2, sk, "rw"), rdl = test_tensor_f32(2, se, "rdl");
    loom_tensor_t rdp = test_tensor_f32(2, se, "rdp");
    fill_gapped(&rng, x.t.data, T, E);
    test_fill_uniform(&rng, dw.t.data, T * K, -1, 1);
    test_fill_uniform(&rng, dp.t.data, T * E, -1, 1);
    test_copy_floats(rdp.data, dp.t.data, T * E);
    float aux = 0.0f, raux = 0.0f;
    const char *ops[3] = {"router forward", "aux loss", "router backward"};
    for (int op = 0; op < 3; op++) {
      loom_status_t st = op == 0 ? loom_moe_router_forward(&p.t, &ix.t, &w.t, &x.t)
                         : op == 1
                             ? loom_moe_aux_loss(&aux, &dp.t, &p.t, &ix.t, 0.1f)
                             : loom_moe_router_backward(&dl.t, &dw.t, &p.t, &ix.t, &w.t, &dp.t);
      loom_status_t rst = op == 0   ? loom_moe_router_forward(&rp, &ridx, &rw, &x.t)
                          : op == 1 ? loom_moe_aux_loss(&raux, &rdp, &rp, &ridx, 0.1f)
                                    : loom_moe_router_backward(&rdl, &dw.t, &rp, &ridx, &rw, &rdp);
      CHECK(st == LOOM_OK && rst == LOOM_OK, "%s: %s", ops[op], loom_last_error(NULL));
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        CHECK(test_guards_intact(all[i]), "%s T=%lld E=%lld K=%lld: wrote outside %s", ops[op],
              (long long)T, (long long)E, (long long)K, all[i]->t.name);
      }
    }
    CHECK(test_same_bits(p.t.data, rp.data, T * E) && test_same_bits(w.t.data, rw.data, T * K) &&
              !memcmp(ix.t.data, ridx.data, sizeof(int32_t) * (size_t)(T * K)) && aux == raux &&
              test_same_bits(dp.t.data, rdp.data, T * E) &&
              test_same_bits(dl.t.data, rdl.data, T * E),
          "T=%lld E=%lld K=%lld: guarded outputs differ", (long long)T, (long long)E, (long long)K);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      test_guarded_free(all[i]);
    }
    TEST_FREE(&rp, &ridx, &rw, &rdl, &rdp);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: LOOM_ERR_INVALID_ARG, a message, and nothing written.

static void test_bad_args(void) {
  static const char fwd[] = "loom_moe_router_forward", aux_op[] = "loom_moe_aux_loss",
                    bwd[] = "loom_moe_router_backward";
  enum { T = 3, E = 5, K = 2 };
  int64_t se[2] = {T, E}, sk[2] = {T, K}, se6[2] = {T, E + 1}, se4[2] = {T + 1, E},
          sk3[2] = {T, K + 1}, sk4[2] = {T + 1, K}, sk6[2] = {T, E + 1}, sk0[2] = {T, 0},
          big[1] = {2 * T * E};
  loom_tensor_t logits = test_tensor_f32(2, se, "logits"), probs = test_tensor_f32(2, se, "probs");
  loom_tensor_t idx_out = test_tensor(LOOM_I32, 2, sk, "idx_out");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx"), weight = test_tensor_f32(2, sk, "w");
  loom_tensor_t dlogits = test_tensor_f32(2, se, "dlogits"), dprobs = test_tensor_f32(2, se, "dp");
  loom_tensor_t dweight = test_tensor_f32(2, sk, "dw"), extra = test_tensor_f32(2, se, "extra");
  loom_tensor_t in_probs = test_tensor_f32(2, se, "in_probs"), in_w = test_tensor_f32(2, sk, "iw");
  loom_tensor_t probs6 = test_tensor_f32(2, se6, "probs6"), probs4 = test_tensor_f32(2, se4, "p4");
  loom_tensor_t idx_f = test_tensor_f32(2, sk, "idx_f"), w3 = test_tensor_f32(2, sk3, "w3");
  loom_tensor_t idx4 = test_tensor(LOOM_I32, 2, sk4, "idx4");
  loom_tensor_t idx6 = test_tensor(LOOM_I32, 2, sk6, "idx6"), w6 = test_tensor_f32(2, sk6, "w6");
  loom_tensor_t idx0 = test_tensor(LOOM_I32, 2, sk0, "idx0"), w0 = test_tensor_f32(2, sk0, "w0");
  loom_tensor_t logits16 = test_tensor(LOOM_F16, 2, se, "logits16");
  loom_tensor_t buf = test_tensor_f32(1, big, "buf");
  test_rng_t rng = test_rng(3);
  test_fill_uniform(&rng, logits.data, T * E, -2, 2);
  test_fill_uniform(&rng, extra.data, T * E, -1, 1);
  test_fill_uniform(&rng, dweight.data, T * K, -1, 1);
  CHECK(loom_moe_router_forward(&in_probs, &idx, &in_w, &logits) == LOOM_OK, "%s",
        loom_last_error(NULL));
  for (int i = 0; i < T * K; i++) {
    ((int32_t *)idx_out.data)[i] = 42;
  }
  memset(idx6.data, 0, sizeof(int32_t) * T * (E + 1));
  test_fill_value(probs.data, T * E, 42.0f);
  test_fill_value(weight.data, T * K, 42.0f);
  test_fill_value(dlogits.data, T * E, 42.0f);
  test_fill_value(dprobs.data, T * E, 42.0f);
  test_fill_value(buf.data, 2 * T * E, 42.0f);
  float aux = 42.0f;

  // Forward.
  EXPECT_FAIL(loom_moe_router_forward(NULL, &idx_out, &weight, &logits), fwd, "probs");
  EXPECT_FAIL(loom_moe_router_forward(&probs, NULL, &weight, &logits), fwd, "idx");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_out, NULL, &logits), fwd, "weight");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_out, &weight, NULL), fwd, "logits");
  EXPECT_FAIL(loom_moe_router_forward(&probs6, &idx_out, &weight, &logits), fwd, "probs (3, 6)");
  EXPECT_FAIL(loom_moe_router_forward(&probs4, &idx_out, &weight, &logits), fwd, "probs (4, 5)");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_f, &weight, &logits), fwd, "expected dtype i32");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx4, &weight, &logits), fwd, "idx (4, 2)");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_out, &w3, &logits), fwd, "weight (3, 3)");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx6, &w6, &logits), fwd, "1 <= K <= E");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx0, &w0, &logits), fwd, "1 <= K <= E");
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_out, &weight, &logits16), fwd, "logits");
  EXPECT_FAIL(loom_moe_router_forward(&logits, &idx_out, &weight, &logits), fwd, "overlaps");
  loom_tensor_t alias = weight; // weight's view over the first floats of probs
  alias.data = probs.data;
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_out, &alias, &logits), fwd, "overlaps");
  loom_tensor_t alias_i = idx_out; // idx over logits
  alias_i.data = logits.data;
  EXPECT_FAIL(loom_moe_router_forward(&probs, &alias_i, &weight, &logits), fwd, "overlaps");
  loom_tensor_t on_gpu = probs;
  on_gpu.device = 0;
  EXPECT_FAIL_DEVICE(loom_moe_router_forward(&on_gpu, &idx_out, &weight, &logits), fwd, "probs");
  on_gpu = logits;
  on_gpu.device = 0;
  EXPECT_FAIL(loom_moe_router_forward(&probs, &idx_out, &weight, &on_gpu), fwd, "logits");

  // Aux loss.
  EXPECT_FAIL(loom_moe_aux_loss(NULL, &dprobs, &in_probs, &idx, 0.01f), aux_op, "aux is NULL");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, NULL, &idx, 0.01f), aux_op, "probs");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, NULL, 0.01f), aux_op, "idx");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &probs6, &in_probs, &idx, 0.01f), aux_op, "dprobs (3, 6)");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, &idx_f, 0.01f), aux_op, "i32");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, &idx4, 0.01f), aux_op, "idx (4, 2)");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, &idx6, 0.01f), aux_op, "1 <= K <= E");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, &idx, NAN), aux_op, "coef");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, &idx, INFINITY), aux_op, "coef");
  EXPECT_FAIL(loom_moe_aux_loss(&aux, &in_probs, &in_probs, &idx, 0.01f), aux_op, "overlaps");
  on_gpu = in_probs;
  on_gpu.device = 0;
  EXPECT_FAIL_DEVICE(loom_moe_aux_loss(&aux, &dprobs, &on_gpu, &idx, 0.01f), aux_op, "probs");

  // Backward.
  EXPECT_FAIL(loom_moe_router_backward(NULL, &dweight, &in_probs, &idx, &in_w, &extra), bwd,
              "dlogits");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, NULL, &in_probs, &idx, &in_w, &extra), bwd,
              "dweight");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, NULL, &idx, &in_w, &extra), bwd,
              "probs");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, &in_probs, NULL, &in_w, &extra), bwd,
              "idx");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, &in_probs, &idx, NULL, &extra), bwd,
              "weight");
  EXPECT_FAIL(loom_moe_router_backward(&probs6, &dweight, &in_probs, &idx, &in_w, &extra), bwd,
              "dlogits (3, 6)");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &w3, &in_probs, &idx, &in_w, &extra), bwd,
              "dweight (3, 3)");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, &in_probs, &idx, &w3, &extra), bwd,
              "weight (3, 3)");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, &in_probs, &idx, &in_w, &probs6), bwd,
              "dprobs_extra (3, 6)");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, &in_probs, &idx_f, &in_w, &extra), bwd,
              "i32");
  EXPECT_FAIL(loom_moe_router_backward(&dlogits, &w6, &in_probs, &idx6, &w6, &extra), bwd,
              "1 <= K <= E");
  EXPECT_FAIL(loom_moe_router_backward(&in_probs, &dweight, &in_probs, &idx, &in_w, &extra), bwd,
              "overlaps");
  loom_tensor_t part = dlogits, part_extra = dlogits; // two views of buf, one float apart
  part.data = buf.data;
  part_extra.data = (float *)buf.data + 1;
  EXPECT_FAIL(loom_moe_router_backward(&part, &dweight, &in_probs, &idx, &in_w, &part_extra), bwd,
              "partially overlaps");
  on_gpu = dlogits;
  on_gpu.device = 0;
  EXPECT_FAIL_DEVICE(loom_moe_router_backward(&on_gpu, &dweight, &in_probs, &idx, &in_w, &extra),
                     bwd, "dlogits");

  // Expert indices out of range, in the last row so that earlier rows would have been written.
  static const int32_t bad[] = {E, -1, 1 << 30, INT32_MIN};
  int32_t *ix = idx.data;
  const int32_t keep = ix[T * K - 1];
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    ix[T * K - 1] = bad[b];
    EXPECT_FAIL(loom_moe_aux_loss(&aux, &dprobs, &in_probs, &idx, 0.01f), aux_op, "row 2");
    EXPECT_FAIL(loom_moe_router_backward(&dlogits, &dweight, &in_probs, &idx, &in_w, &extra), bwd,
                "row 2");
  }
  ix[T * K - 1] = keep;

  CHECK(test_all_equal(probs.data, T * E, 42.0f), "probs written by a failed call");
  CHECK(test_all_equal(weight.data, T * K, 42.0f), "weight written by a failed call");
  CHECK(test_all_equal(dlogits.data, T * E, 42.0f), "dlogits written by a failed call");
  CHECK(test_all_equal(dprobs.data, T * E, 42.0f), "dprobs written by a failed call");
  CHECK(test_all_equal(buf.data, 2 * T * E, 42.0f), "buf written by a failed call");
  CHECK(aux == 42.0f, "aux written by a failed call");
  for (int i = 0; i < T * K; i++) {
    CHECK(((int32_t *)idx_out.data)[i] == 42, "idx[%d] written by a failed call", i);
  }
  TEST_FREE(&logits, &probs, &idx_out, &idx, &weight, &dlogits, &dprobs, &dweight, &extra,
            &in_probs, &in_w, &probs6, &probs4, &idx_f, &w3, &idx4, &idx6, &w6, &idx0, &w0,
            &logits16, &buf);
}

int main(void) {
  test_forward();
  test_ties();
  test_aux();
  test_backward();
  test_guards();
  test_bad_args();
  return check_exit("test_ops_moe");
}
