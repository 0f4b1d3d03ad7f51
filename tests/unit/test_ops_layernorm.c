/* test_ops_layernorm.c — loom_layernorm_forward/_backward against a double-precision reference
 * (odd, batched, offset, low-variance rows), accumulation, finite differences, guards, bad args. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// Tolerances (float kernels against a double reference):
// - mean: atol 1e-7 * (1 + |offset|) + rtol 1e-6; rstd: rtol 1e-5. Both are computed in double
//   and rounded once to float.
// - out: atol 2e-6, rtol 1e-5, also for rows at +100 and rows with a variance below eps: x - mean
//   is taken in double, so only the float roundings of rstd, the product and the sum remain.
// - din: atol 1e-5 * max(1, rstd), rtol 1e-4 (din scales with rstd, which is ~150 for rows of
//   spread 1e-2 and ~300 for the rows below eps); dweight and dbias (accumulated row by row in
//   float onto random values): atol 2e-5, rtol 1e-5. The reference backward uses the exact
//   (double) mean and rstd: the op must not inherit the saved float mean's rounding (see
//   ln_case).
// - finite differences of the float forward (h = 1e-2, L = sum(out * w) in double): changing an
//   input re-rounds a whole row of outputs (~sqrt(C) * 1e-7 / 2h) and the truncation is
//   h^2 / 6 * |f'''| ~ 1e-4: atol 1e-3, rtol 1e-2.

#define EPS  1e-5f
#define FD_H 1e-2f

// ---------------------------------------------------------------------------------------------
// Reference

typedef struct ref {
  double *out, *mean, *rstd, *din, *dweight, *dbias;
} ref_t;

static void ref_forward(const float *x, const float *w, const float *b, int64_t N, int64_t C,
                        float eps, ref_t *r) {
  for (int64_t i = 0; i < N; i++) {
    const float *row = x + i * C;
    double m = 0.0, v = 0.0;
    for (int64_t j = 0; j < C; j++) {
      m += row[j];
    }
    m /= (double)C;
    for (int64_t j = 0; j < C; j++) {
      v += ((double)row[j] - m) * ((double)row[j] - m);
    }
    v /= (double)C;
    double rs = 1.0 / sqrt(v + (double)eps);
    r->mean[i] = m;
    r->rstd[i] = rs;
    for (int64_t j = 0; j < C; j++) {
      r->out[i * C + j] = ((double)row[j] - m) * rs * (double)w[j] + (double)b[j];
    }
  }
}

// din overwritten; dweight, dbias accumulated onto dw0, db0. Uses r->mean and r->rstd.
static void ref_backward(const float *dy, const float *x, const float *w, const float *dw0,
                         const float *db0, int64_t N, int64_t C, ref_t *r) {
  for (int64_t j = 0; j < C; j++) {
    r->dweight[j] = dw0[j];
    r->dbias[j] = db0[j];
  }
  for (int64_t i = 0; i < N; i++) {
    double gm = 0.0, gnm = 0.0;
    for (int64_t j = 0; j < C; j++) {
      double nrm = ((double)x[i * C + j] - r->mean[i]) * r->rstd[i];
      double g = (double)dy[i * C + j] * (double)w[j];
      gm += g;
      gnm += g * nrm;
      r->dweight[j] += (double)dy[i * C + j] * nrm;
      r->dbias[j] += (double)dy[i * C + j];
    }
    gm /= (double)C;
    gnm /= (double)C;
    for (int64_t j = 0; j < C; j++) {
      double nrm = ((double)x[i * C + j] - r->mean[i]) * r->rstd[i];
      double g = (double)dy[i * C + j] * (double)w[j];
      r->din[i * C + j] = r->rstd[i] * (g - gm - nrm * gnm);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Against the reference

// One problem: x (dims..., C), weight and bias (C), mean and rstd (dims...), all the gradients.
typedef struct ln {
  int64_t N, C;
  loom_tensor_t x, w, b, out, mean, rstd, dy, dx, dw, db;
} ln_t;

static ln_t ln_alloc(int ndim, const int64_t *shape) {
  ln_t p;
  p.C = shape[ndim - 1];
  p.N = 1;
  for (int i = 0; i < ndim - 1; i++) {
    p.N *= shape[i];
  }
  p.x = test_tensor_f32(ndim, shape, "x");
  p.out = test_tensor_f32(ndim, shape, "out");
  p.dy = test_tensor_f32(ndim, shape, "dy");
  p.dx = test_tensor_f32(ndim, shape, "dx");
  p.w = test_tensor_f32(1, &p.C, "w");
  p.b = test_tensor_f32(1, &p.C, "b");
  p.dw = test_tensor_f32(1, &p.C, "dw");
  p.db = test_tensor_f32(1, &p.C, "db");
  // mean and rstd keep the leading dimensions, (B, T) for a (B, T, C) input (any shape with N
  // elements is accepted); a 1-D input has a single row.
  int64_t one = 1;
  p.mean = test_tensor_f32(ndim > 1 ? ndim - 1 : 1, ndim > 1 ? shape : &one, "mean");
  p.rstd = test_tensor_f32(ndim > 1 ? ndim - 1 : 1, ndim > 1 ? shape : &one, "rstd");
  return p;
}

static void ln_free(ln_t *p) {
  loom_tensor_t *ts[] = {&p->x,    &p->w,  &p->b,  &p->out, &p->mean,
                         &p->rstd, &p->dy, &p->dx, &p->dw,  &p->db};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    loom_tensor_free(ts[i]);
  }
}

static void ln_case(test_rng_t *rng, int ndim, const int64_t *shape, double offset, double scale) {
  ln_t p = ln_alloc(ndim, shape);
  const int64_t N = p.N, C = p.C, n = N * C;
  test_fill_uniform(rng, test_floats(&p.x), n, offset - scale, offset + scale);
  test_fill_uniform(rng, test_floats(&p.w), C, 0.5, 1.5);
  test_fill_uniform(rng, test_floats(&p.b), C, -1, 1);
  test_fill_uniform(rng, test_floats(&p.dy), n, -1, 1);
  test_fill_uniform(rng, test_floats(&p.dw), C, -1, 1); // parameter gradients accumulate
  test_fill_uniform(rng, test_floats(&p.db), C, -1, 1);
  test_fill_value(test_floats(&p.out), n, NAN);
  test_fill_value(test_floats(&p.dx), n, NAN); // din is overwritten
  test_fill_value(test_floats(&p.mean), N, NAN);
  test_fill_value(test_floats(&p.rstd), N, NAN);
  float *dw0 = malloc(sizeof(float) * (size_t)C), *db0 = malloc(sizeof(float) * (size_t)C);
  memcpy(dw0, test_floats(&p.dw), sizeof(float) * (size_t)C);
  memcpy(db0, test_floats(&p.db), sizeof(float) * (size_t)C);

  ref_t r;
  double *mem = malloc(sizeof(double) * (size_t)(2 * n + 2 * N + 2 * C));
  r.out = mem;
  r.din = mem + n;
  r.mean = mem + 2 * n;
  r.rstd = r.mean + N;
  r.dweight = r.rstd + N;
  r.dbias = r.dweight + C;
  ref_forward(test_floats(&p.x), test_floats(&p.w), test_floats(&p.b), N, C, EPS, &r);
  CHECK(loom_layernorm_forward(&p.out, &p.mean, &p.rstd, &p.x, &p.w, &p.b, EPS) == LOOM_OK, "%s",
        loom_last_error(NULL));
  char what[128];
  snprintf(what, sizeof what, "layernorm N=%lld C=%lld offset=%g scale=%g", (long long)N,
           (long long)C, offset, scale);
  CHECK(test_compare("mean", test_floats(&p.mean), r.mean, N, 1e-7 * (1 + fabs(offset)), 1e-6) == 0,
        "%s", what);
  CHECK(test_compare("rstd", test_floats(&p.rstd), r.rstd, N, 0, 1e-5) == 0, "%s", what);
  CHECK(test_compare("out", test_floats(&p.out), r.out, n, 2e-6, 1e-5) == 0, "%s", what);

  // The reference backward uses the exact (double) mean and rstd of ref_forward. The saved float
  // mean is off by up to half an ulp of the row's offset, which x - mean amplified by rstd would
  // turn into a gradient error of ~ulp(offset) * rstd^2 relative (rows of 1e4 + 1e-2 noise: the
  // float mean is off by up to 5e-4, 5% of the spread); the op recovers the exact mean from x.
  ref_backward(test_floats(&p.dy), test_floats(&p.x), test_floats(&p.w), dw0, db0, N, C, &r);
  CHECK(loom_layernorm_backward(&p.dx, &p.dw, &p.db, &p.dy, &p.x, &p.w, &p.mean, &p.rstd) ==
            LOOM_OK,
        "%s", loom_last_error(NULL));
  double rstd_max = 1.0;
  for (int64_t i = 0; i < N; i++) {
    rstd_max = r.rstd[i] > rstd_max ? r.rstd[i] : rstd_max;
  }
  CHECK(test_compare("din", test_floats(&p.dx), r.din, n, 1e-5 * rstd_max, 1e-4) == 0, "%s", what);
  CHECK(test_compare("dweight +=", test_floats(&p.dw), r.dweight, C, 2e-5, 1e-5) == 0, "%s", what);
  CHECK(test_compare("dbias +=", test_floats(&p.db), r.dbias, C, 2e-5, 1e-5) == 0, "%s", what);

  // In place: out = in, din = dout and din = in give the same bits as the separate calls.
  loom_tensor_t y = p.out, g = p.dy;
  y.data = malloc(sizeof(float) * (size_t)n);
  g.data = malloc(sizeof(float) * (size_t)n);
  loom_tensor_t mean2 = p.mean, rstd2 = p.rstd, dw2 = p.dw, db2 = p.db;
  mean2.data = malloc(sizeof(float) * (size_t)N);
  rstd2.data = malloc(sizeof(float) * (size_t)N);
  dw2.data = malloc(sizeof(float) * (size_t)C);
  db2.data = malloc(sizeof(float) * (size_t)C);
  memcpy(y.data, p.x.data, sizeof(float) * (size_t)n);
  CHECK(loom_layernorm_forward(&y, &mean2, &rstd2, &y, &p.w, &p.b, EPS) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(test_same_bits(test_floats(&y), test_floats(&p.out), n) &&
            test_same_bits(test_floats(&mean2), test_floats(&p.mean), N) &&
            test_same_bits(test_floats(&rstd2), test_floats(&p.rstd), N),
        "layernorm forward in place differs: %s", what);
  for (int alias = 0; alias < 2; alias++) { // 0: din = dout, 1: din = in
    memcpy(g.data, p.dy.data, sizeof(float) * (size_t)n);
    memcpy(y.data, p.x.data, sizeof(float) * (size_t)n);
    memcpy(dw2.data, dw0, sizeof(float) * (size_t)C);
    memcpy(db2.data, db0, sizeof(float) * (size_t)C);
    loom_tensor_t *d = alias ? &y : &g;
    CHECK(loom_layernorm_backward(d, &dw2, &db2, &g, &y, &p.w, &p.mean, &p.rstd) == LOOM_OK, "%s",
          loom_last_error(NULL));
    CHECK(test_same_bits(test_floats(d), test_floats(&p.dx), n) &&
              test_same_bits(test_floats(&dw2), test_floats(&p.dw), C) &&
              test_same_bits(test_floats(&db2), test_floats(&p.db), C),
          "layernorm backward in place (din = %s) differs: %s", alias ? "in" : "dout", what);
  }
  free(y.data);
  free(g.data);
  free(mean2.data);
  free(rstd2.data);
  free(dw2.data);
  free(db2.data);
  free(mem);
  free(dw0);
  free(db0);
  ln_free(&p);
}

static void test_reference(void) {
  test_rng_t rng = test_rng(21);
  static const int64_t shapes[][4] = {{1, 1},        {1, 37},     {2, 37, 1},  {2, 5, 129},
                                      {3, 3, 7, 37}, {2, 4, 768}, {2, 129, 2}, {3, 2, 3, 1000}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int ndim = (int)shapes[s][0];
    ln_case(&rng, ndim, &shapes[s][1], 0.0, 1.0);
    ln_case(&rng, ndim, &shapes[s][1], 100.0, 1.0); // a large common offset: stable variance
    ln_case(&rng, ndim, &shapes[s][1], 0.5, 1e-3);  // variance below eps
    ln_case(&rng, ndim, &shapes[s][1], 1e4, 1e-2);  // |mean| >> spread: the float mean is coarse
  }
}

// N == 0 is a no-op that succeeds.
static void test_empty(void) {
  int64_t s[2] = {0, 5}, c = 5, zero = 0;
  loom_tensor_t x = test_tensor_f32(2, s, "x"), out = test_tensor_f32(2, s, "out");
  loom_tensor_t m = test_tensor_f32(1, &zero, "m"), r = test_tensor_f32(1, &zero, "r");
  loom_tensor_t w = test_tensor_f32(1, &c, "w"), b = test_tensor_f32(1, &c, "b");
  loom_tensor_t dw = test_tensor_f32(1, &c, "dw"), db = test_tensor_f32(1, &c, "db");
  loom_tensor_fill(&dw, 7.0);
  loom_tensor_fill(&db, 7.0);
  CHECK(loom_layernorm_forward(&out, &m, &r, &x, &w, &b, EPS) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(loom_layernorm_backward(&out, &dw, &db, &x, &x, &w, &m, &r) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(test_all_equal(test_floats(&dw), 5, 7.0f) && test_all_equal(test_floats(&db), 5, 7.0f),
        "N == 0 changed dweight");
  loom_tensor_t ts[] = {x, out, m, r, w, b, dw, db};
  for (int i = 0; i < 8; i++) {
    loom_tensor_free(&ts[i]);
  }
}

// eps = 0 is valid (a finite value >= 0): rows with a spread need no regulariser, and the result
// follows the reference with eps 0 (rstd = 1 / std exactly).
static void test_eps_zero(void) {
  test_rng_t rng = test_rng(24);
  int64_t shape[2] = {3, 37};
  ln_t p = ln_alloc(2, shape);
  const int64_t N = p.N, C = p.C, n = N * C;
  test_fill_uniform(&rng, test_floats(&p.x), n, -1, 1);
  test_fill_uniform(&rng, test_floats(&p.w), C, 0.5, 1.5);
  test_fill_uniform(&rng, test_floats(&p.b), C, -1, 1);
  test_fill_value(test_floats(&p.out), n, NAN);
  double *mem = malloc(sizeof(double) * (size_t)(n + 2 * N));
  ref_t r = {.out = mem, .mean = mem + n, .rstd = mem + n + N};
  ref_forward(test_floats(&p.x), test_floats(&p.w), test_floats(&p.b), N, C, 0.0f, &r);
  CHECK(loom_layernorm_forward(&p.out, &p.mean, &p.rstd, &p.x, &p.w, &p.b, 0.0f) == LOOM_OK,
        "eps = 0 refused: %s", loom_last_error(NULL));
  CHECK(test_compare("rstd, eps 0", test_floats(&p.rstd), r.rstd, N, 0, 1e-5) == 0 &&
            test_compare("out, eps 0", test_floats(&p.out), r.out, n, 2e-6, 1e-5) == 0,
        "layernorm with eps = 0");
  free(mem);
  ln_free(&p);
}

// ---------------------------------------------------------------------------------------------
// Finite differences: L = sum(out * u) with random u; the gradients from loom_layernorm_backward
// (dout = u) against central differences of the float forward in in, weight and bias.

static double ln_loss(ln_t *p, const loom_tensor_t *u) {
  CHECK(loom_layernorm_forward(&p->out, &p->mean, &p->rstd, &p->x, &p->w, &p->b, EPS) == LOOM_OK,
        "%s", loom_last_error(NULL));
  return test_dot(test_floats(&p->out), test_floats(u), p->N * p->C);
}

static void fd_case(test_rng_t *rng, int ndim, const int64_t *shape) {
  ln_t p = ln_alloc(ndim, shape);
  const int64_t N = p.N, C = p.C, n = N * C;
  test_fill_uniform(rng, test_floats(&p.x), n, -1, 1);
  test_fill_uniform(rng, test_floats(&p.w), C, 0.5, 1.5);
  test_fill_uniform(rng, test_floats(&p.b), C, -1, 1);
  test_fill_uniform(rng, test_floats(&p.dy), n, -1, 1); // u
  test_fill_uniform(rng, test_floats(&p.dw), C, -1, 1);
  test_fill_uniform(rng, test_floats(&p.db), C, -1, 1);
  float *dw0 = malloc(sizeof(float) * (size_t)C), *db0 = malloc(sizeof(float) * (size_t)C);
  memcpy(dw0, test_floats(&p.dw), sizeof(float) * (size_t)C);
  memcpy(db0, test_floats(&p.db), sizeof(float) * (size_t)C);
  CHECK(loom_layernorm_forward(&p.out, &p.mean, &p.rstd, &p.x, &p.w, &p.b, EPS) == LOOM_OK, "%s",
        loom_last_error(NULL));
  CHECK(loom_layernorm_backward(&p.dx, &p.dw, &p.db, &p.dy, &p.x, &p.w, &p.mean, &p.rstd) ==
            LOOM_OK,
        "%s", loom_last_error(NULL));

  enum { SAMPLES = 48 };
  double fd[SAMPLES] = {0};
  float an[SAMPLES] = {0};
  struct {
    const char *name;
    float *param, *grad, *grad0;
    int64_t n;
  } params[] = {{"din (finite differences)", test_floats(&p.x), test_floats(&p.dx), NULL, n},
                {"dweight (finite differences)", test_floats(&p.w), test_floats(&p.dw), dw0, C},
                {"dbias (finite differences)", test_floats(&p.b), test_floats(&p.db), db0, C}};
  for (int k = 0; k < 3; k++) {
    int64_t m = params[k].n < SAMPLES ? params[k].n : SAMPLES;
    for (int64_t s = 0; s < m; s++) {
      int64_t i = params[k].n <= SAMPLES ? s : test_int(rng, 0, params[k].n - 1);
      float v = params[k].param[i];
      params[k].param[i] = v + FD_H;
      double xp = params[k].param[i], lp = ln_loss(&p, &p.dy);
      params[k].param[i] = v - FD_H;
      double xm = params[k].param[i], lm = ln_loss(&p, &p.dy);
      params[k].param[i] = v;
      fd[s] = (lp - lm) / (xp - xm);
      an[s] = params[k].grad0 ? params[k].grad[i] - params[k].grad0[i] : params[k].grad[i];
    }
    char what[96];
    snprintf(what, sizeof what, "%s N=%lld C=%lld", params[k].name, (long long)N, (long long)C);
    CHECK(test_compare(what, an, fd, m, 1e-3, 1e-2) == 0, "%s", what);
  }
  free(dw0);
  free(db0);
  ln_free(&p);
}

static void test_finite_diff(void) {
  test_rng_t rng = test_rng(22);
  static const int64_t shapes[][4] = {{1, 2},       {1, 37},     {2, 5, 129},
                                      {3, 2, 3, 7}, {2, 3, 768}, {2, 17, 5}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    fd_case(&rng, (int)shapes[s][0], &shapes[s][1]);
  }
}

// Every tensor of all[0, n) kept its sentinels through the op `what` at (N, C).
static void guards_intact(test_guarded_t *const *all, size_t n, const char *what, int64_t N,
                          int64_t C) {
  for (size_t i = 0; i < n; i++) {
    CHECK(test_guards_intact(all[i]), "%s (%lld, %lld): wrote outside %s", what, (long long)N,
          (long long)C, all[i]->t.name);
  }
}

// ---------------------------------------------------------------------------------------------
// Guards: forward and backward write exactly their outputs. Every tensor is wrapped inside
// sentinels (test_guarded_f32) that must survive both calls; the outputs must equal those of the
// same calls on plain tensors, bit for bit.

static void test_guards(void) {
  test_rng_t rng = test_rng(23);
  static const int64_t gshapes[][2] = {{1, 1}, {3, 7}, {5, 37}, {2, 129}};
  for (int s = 0; s < 4; s++) {
    const int64_t N = gshapes[s][0], C = gshapes[s][1], n = N * C;
    test_guarded_t x = test_guarded_f32(2, gshapes[s], "x"), w = test_guarded_f32(1, &C, "w");
    test_guarded_t b = test_guarded_f32(1, &C, "b"), out = test_guarded_f32(2, gshapes[s], "out");
    test_guarded_t mean = test_guarded_f32(1, &N, "mean"), rstd = test_guarded_f32(1, &N, "rstd");
    test_guarded_t dy = test_guarded_f32(2, gshapes[s], "dy");
    test_guarded_t dx = test_guarded_f32(2, gshapes[s], "dx");
    test_guarded_t dw = test_guarded_f32(1, &C, "dw"), db = test_guarded_f32(1, &C, "db");
    test_guarded_t *const all[] = {&x, &w, &b, &out, &mean, &rstd, &dy, &dx, &dw, &db};
    ln_t p = ln_alloc(2, gshapes[s]); // the same calls on plain tensors
    test_fill_uniform(&rng, test_floats(&x.t), n, -1, 1);
    test_fill_uniform(&rng, test_floats(&w.t), C, 0.5, 1.5);
    test_fill_uniform(&rng, test_floats(&b.t), C, -1, 1);
    test_fill_uniform(&rng, test_floats(&dy.t), n, -1, 1);
    test_fill_uniform(&rng, test_floats(&dw.t), C, -1, 1);
    test_fill_uniform(&rng, test_floats(&db.t), C, -1, 1);
    test_copy_floats(p.dw.data, dw.t.data, C);
    test_copy_floats(p.db.data, db.t.data, C);
    CHECK(loom_layernorm_forward(&out.t, &mean.t, &rstd.t, &x.t, &w.t, &b.t, EPS) == LOOM_OK &&
              loom_layernorm_forward(&p.out, &p.mean, &p.rstd, &x.t, &w.t, &b.t, EPS) == LOOM_OK,
          "%s", loom_last_error(NULL));
    guards_intact(all, sizeof all / sizeof all[0], "forward", N, C);
    CHECK(test_same_bits(test_floats(&out.t), test_floats(&p.out), n) &&
              test_same_bits(test_floats(&mean.t), test_floats(&p.mean), N) &&
              test_same_bits(test_floats(&rstd.t), test_floats(&p.rstd), N),
          "forward (%lld, %lld): guarded outputs differ", (long long)N, (long long)C);
    CHECK(loom_layernorm_backward(&dx.t, &dw.t, &db.t, &dy.t, &x.t, &w.t, &mean.t, &rstd.t) ==
                  LOOM_OK &&
              loom_layernorm_backward(&p.dx, &p.dw, &p.db, &dy.t, &x.t, &w.t, &mean.t, &rstd.t) ==
                  LOOM_OK,
          "%s", loom_last_error(NULL));
    guards_intact(all, sizeof all / sizeof all[0], "backward", N, C);
    CHECK(test_same_bits(test_floats(&dx.t), test_floats(&p.dx), n) &&
              test_same_bits(test_floats(&dw.t), test_floats(&p.dw), C) &&
              test_same_bits(test_floats(&db.t), test_floats(&p.db), C),
          "backward (%lld, %lld): guarded outputs differ", (long long)N, (long long)C);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      test_guarded_free(all[i]);
    }
    ln_free(&p);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: each fails with a message and leaves every output untouched.

static void test_bad_args(void) {
  int64_t s35[2] = {3, 5}, s53[2] = {5, 3}, s30[2] = {3, 0}, s15[2] = {1, 5}, c5 = 5, c4 = 4;
  int64_t n3 = 3, n4 = 4, zero = 0;
  loom_tensor_t x = test_tensor_f32(2, s35, "x"), dy = test_tensor_f32(2, s35, "dy");
  loom_tensor_t w = test_tensor_f32(1, &c5, "w"), b = test_tensor_f32(1, &c5, "b");
  loom_tensor_t out = test_tensor_f32(2, s35, "out"), out53 = test_tensor_f32(2, s53, "out53");
  loom_tensor_t mean = test_tensor_f32(1, &n3, "mean"), rstd = test_tensor_f32(1, &n3, "rstd");
  loom_tensor_t mean4 = test_tensor_f32(1, &n4, "mean4"), w4 = test_tensor_f32(1, &c4, "w4");
  loom_tensor_t b15 = test_tensor_f32(2, s15, "b15");
  loom_tensor_t dw = test_tensor_f32(1, &c5, "dw"), db = test_tensor_f32(1, &c5, "db");
  loom_tensor_t x30 = test_tensor_f32(2, s30, "x30"), out30 = test_tensor_f32(2, s30, "out30");
  loom_tensor_t w0 = test_tensor_f32(1, &zero, "w0");
  loom_tensor_fill(&x, 0.5);
  loom_tensor_fill(&dy, 0.25);
  loom_tensor_fill(&w, 1.0);
  loom_tensor_fill(&b, 0.0);
  loom_tensor_fill(&rstd, 1.0);
  loom_tensor_t outs[] = {out, out53, mean, mean4, dw, db};
  for (int i = 0; i < 6; i++) {
    loom_tensor_fill(&outs[i], 7.0);
  }
  loom_tensor_t x_bf16, out_dev = out, w_dev = w, din_dev = out, rstd_dev = rstd;
  loom_tensor_wrap(&x_bf16, x.data, LOOM_BF16, LOOM_DEVICE_HOST, 2, s35, "x_bf16");
  out_dev.device = din_dev.device = w_dev.device = rstd_dev.device = 0;
  // Views of out's memory: a partial overlap with it, and a (3) vector inside it.
  float buf[40];
  for (int i = 0; i < 40; i++) {
    buf[i] = 7.0f;
  }
  loom_tensor_t p1, p2, v3;
  loom_tensor_wrap(&p1, buf, LOOM_F32, LOOM_DEVICE_HOST, 2, s35, "p1");
  loom_tensor_wrap(&p2, buf + 5, LOOM_F32, LOOM_DEVICE_HOST, 2, s35, "p2");
  loom_tensor_wrap(&v3, buf + 2, LOOM_F32, LOOM_DEVICE_HOST, 1, &n3, "v3");

  static const char f[] = "loom_layernorm_forward";
  EXPECT_FAIL(loom_layernorm_forward(NULL, &mean, &rstd, &x, &w, &b, EPS), f, "out is NULL");
  EXPECT_FAIL(loom_layernorm_forward(&out, NULL, &rstd, &x, &w, &b, EPS), f, "mean is NULL");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, NULL, &x, &w, &b, EPS), f, "rstd is NULL");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, NULL, &w, &b, EPS), f, "in is NULL");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, NULL, &b, EPS), f, "weight is NULL");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w, NULL, EPS), f, "bias is NULL");
  EXPECT_FAIL(loom_layernorm_forward(&out53, &mean, &rstd, &x, &w, &b, EPS), f, "(5, 3)");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean4, &rstd, &x, &w, &b, EPS), f, "mean (4)");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &mean4, &x, &w, &b, EPS), f, "rstd (4)");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w4, &b, EPS), f, "weight (4)");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w, &b15, EPS), f, "bias (1, 5)");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x_bf16, &w, &b, EPS), f, "bf16");
  EXPECT_FAIL_DEVICE(loom_layernorm_forward(&out_dev, &mean, &rstd, &x, &w, &b, EPS), f, "out");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w_dev, &b, EPS), f, "cuda:0");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w, &b, -1e-5f), f, "eps");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w, &b, NAN), f, "eps");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &rstd, &x, &w, &b, INFINITY), f, "eps");
  EXPECT_FAIL(loom_layernorm_forward(&out30, &mean, &rstd, &x30, &w0, &w0, EPS), f, "length 0");
  EXPECT_FAIL(loom_layernorm_forward(&p2, &mean, &rstd, &p1, &w, &b, EPS), f, "overlaps");
  EXPECT_FAIL(loom_layernorm_forward(&p1, &v3, &rstd, &x, &w, &b, EPS), f, "overlaps");
  EXPECT_FAIL(loom_layernorm_forward(&out, &mean, &mean, &x, &w, &b, EPS), f, "overlaps");

  static const char g[] = "loom_layernorm_backward";
  EXPECT_FAIL(loom_layernorm_backward(NULL, &dw, &db, &dy, &x, &w, &mean, &rstd), g, "din is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, NULL, &db, &dy, &x, &w, &mean, &rstd), g,
              "dweight is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, NULL, &dy, &x, &w, &mean, &rstd), g,
              "dbias is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, NULL, &x, &w, &mean, &rstd), g,
              "dout is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, NULL, &w, &mean, &rstd), g,
              "in is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, NULL, &mean, &rstd), g,
              "weight is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &w, NULL, &rstd), g, "mean is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &w, &mean, NULL), g, "rstd is NULL");
  EXPECT_FAIL(loom_layernorm_backward(&out53, &dw, &db, &dy, &x, &w, &mean, &rstd), g, "(5, 3)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &out53, &x, &w, &mean, &rstd), g, "(5, 3)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &w4, &db, &dy, &x, &w, &mean, &rstd), g, "dweight (4)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &b15, &dy, &x, &w, &mean, &rstd), g,
              "dbias (1, 5)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &w4, &mean, &rstd), g, "weight (4)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &w, &mean4, &rstd), g, "mean (4)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &w, &mean, &mean4), g, "rstd (4)");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x_bf16, &w, &mean, &rstd), g, "bf16");
  EXPECT_FAIL_DEVICE(loom_layernorm_backward(&din_dev, &dw, &db, &dy, &x, &w, &mean, &rstd), g,
                     "din");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &w, &mean, &rstd_dev), g, "cuda:0");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &dw, &dy, &x, &w, &mean, &rstd), g, "overlaps");
  EXPECT_FAIL(loom_layernorm_backward(&out, &dw, &db, &dy, &x, &dw, &mean, &rstd), g, "overlaps");
  EXPECT_FAIL(loom_layernorm_backward(&p2, &dw, &db, &p1, &x, &w, &mean, &rstd), g, "overlaps");

  CHECK(test_all_equal(test_floats(&out), 15, 7.0f) &&
            test_all_equal(test_floats(&out53), 15, 7.0f) &&
            test_all_equal(test_floats(&mean), 3, 7.0f) &&
            test_all_equal(test_floats(&mean4), 4, 7.0f) &&
            test_all_equal(test_floats(&rstd), 3, 1.0f) &&
            test_all_equal(test_floats(&dw), 5, 7.0f) &&
            test_all_equal(test_floats(&db), 5, 7.0f) && test_all_equal(buf, 40, 7.0f),
        "a failed call wrote its output");
  loom_tensor_t ts[] = {x,     dy, w,   b,  out, out53, mean,  rstd,
                        mean4, w4, b15, dw, db,  x30,   out30, w0};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    loom_tensor_free(&ts[i]);
  }
}

int main(void) {
  test_reference();
  test_empty();
  test_eps_zero();
  test_finite_diff();
  test_guards();
  test_bad_args();
  return check_exit("test_ops_layernorm");
}
