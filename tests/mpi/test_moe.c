/* test_moe.c — the MoE layer under mpirun: expert parallelism over the world equals a single-rank
 * layer holding every expert, and the three overlap modes give the same bits. */
#define _POSIX_C_SOURCE 200809L // mkdtemp, setenv

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <unistd.h>

#include "../check_mpi.h"
#include "../quiet.h"
#include "../testutil.h"

// What is checked, at the np of the spec (the world is the expert-parallel group):
// - the single-rank layer itself equals a dense reference written out here in double (router
//   softmax and top-k from the unit-tested kernels, then capacity, every kept token through its
//   expert's FFN, the weighted sum, and the backward by hand), with non-zero biases: bugs that
//   the layer shares at every np (a wrong routing weight or slot, a bias dropped or offset, a
//   gradient scaled or not accumulated, a wrong capacity) fail here, not only ep vs single-rank;
// - y and dx are written inside sentinels (no row is left unwritten, nothing past either end),
//   and a second forward and backward gives the same y and dx and doubles every gradient (the
//   gradients accumulate; nothing of the first call leaks into the second);
// - forward y, backward dx and every parameter gradient equal those of the reference layer
//   (created with ep = NULL: this rank alone, every expert) on the same tokens within 1e-5
//   relative to the largest magnitude, for every overlap mode (an expert's gradients: the sum of
//   the references' over the ranks, since the expert saw every rank's tokens);
// - none, coarse and fine give bitwise the same y, dx and gradients;
// - tokens per rank differ (one rank has none), skewed routing (every token's first choice is
//   the last expert: other experts receive none), a capacity factor with each drop policy;
// - the token counts add up (sent = kept assignments; received over the group = sent);
// - a config that differs between ranks (top_k, hidden, seed), and E not divisible by np, fail
//   on every rank;
// - the tuning cache: loom_moe_tune (this rank alone) writes an entry that loom_moe_tuned finds
//   again, damaged lines are ignored, another shape finds nothing, over the world every rank
//   takes rank 0's entry, and a cache that is not a regular file (/dev/zero) is absent.

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

static int world_rank, world_size;

typedef struct run_out {
  float *y, *dx, *grad[LOOM_MOE_PARAM_COUNT];
  int64_t ngrad[LOOM_MOE_PARAM_COUNT];
  float aux;
  int64_t sent_total, dropped, received_total;
} run_out_t;

typedef struct scenario {
  const char *name;
  int64_t t;       // this rank's tokens
  int skew;        // route every token to the last expert first
  double capacity; // 0: dropless
  loom_moe_drop_t drop;
} scenario_t;

static void run_out_free(run_out_t *o) {
  free(o->y);
  free(o->dx);
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    free(o->grad[p]);
  }
}

static int close_rel(const float *a, const float *b, int64_t n, double tol, double *err);

// Non-zero biases (the layer starts them at zero, which hides a bias dropped or offset): a value
// per (global expert, index), the same in the reference and the expert-parallel layer.
static void set_biases(loom_moe_t *m, const loom_moe_config_t *cfg, int first, int nl) {
  float *b1 = loom_moe_param(m, LOOM_MOE_B1)->data, *b2 = loom_moe_param(m, LOOM_MOE_B2)->data;
  for (int e = 0; e < nl; e++) {
    const int g = first + e;
    for (int64_t i = 0; i < cfg->ffn; i++) {
      b1[e * cfg->ffn + i] = 0.05f * (float)((g * 131 + i * 17) % 23 - 11) / 11.0f;
    }
    for (int64_t i = 0; i < cfg->hidden; i++) {
      b2[e * cfg->hidden + i] = 0.05f * (float)((g * 71 + i * 29) % 19 - 9) / 9.0f;
    }
  }
}

static double gelu_ref(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double gelu_ref_grad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), th = tanh(u);
  return 0.5 * (1.0 + th) +
         0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

typedef struct dense_ref {
  float *y, *dx, *grad[LOOM_MOE_PARAM_COUNT]; // every expert's gradients (this rank's tokens)
  float aux;
} dense_ref_t;

static void dense_ref_free(dense_ref_t *r) {
  free(r->y);
  free(r->dx);
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    free(r->grad[p]);
  }
}

// The layer with every expert (params of m, ep NULL) on T tokens, written out independently of
// comm/moe*.c: only the router's softmax/top-k/renormalisation, aux loss and their backward come
// from the compute kernels (unit-tested on their own).
static void dense_reference(loom_moe_t *m, const loom_moe_config_t *cfg, int64_t T, const float *x,
                            const float *dy, dense_ref_t *r) {
  const int64_t H = cfg->hidden, F = cfg->ffn, E = cfg->num_experts;
  const int K = cfg->top_k;
  const float *wr = loom_moe_param(m, LOOM_MOE_ROUTER)->data;
  const float *w1 = loom_moe_param(m, LOOM_MOE_W1)->data,
              *b1 = loom_moe_param(m, LOOM_MOE_B1)->data;
  const float *w2 = loom_moe_param(m, LOOM_MOE_W2)->data,
              *b2 = loom_moe_param(m, LOOM_MOE_B2)->data;
  const int64_t np[LOOM_MOE_PARAM_COUNT] = {H * E, E * H * F, E * F, E * F * H, E * H};
  memset(r, 0, sizeof *r);
  r->y = calloc((size_t)(T * H + 1), sizeof(float));
  r->dx = calloc((size_t)(T * H + 1), sizeof(float));
  double *gd[LOOM_MOE_PARAM_COUNT];
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    r->grad[p] = calloc((size_t)np[p], sizeof(float));
    gd[p] = calloc((size_t)np[p], sizeof(double));
  }
  float *logits = calloc((size_t)(T * E + 1), sizeof(float));
  float *probs = calloc((size_t)(T * E + 1), sizeof(float));
  float *dprobs = calloc((size_t)(T * E + 1), sizeof(float));
  float *weight = calloc((size_t)(T * K + 1), sizeof(float));
  float *dw = calloc((size_t)(T * K + 1), sizeof(float));
  int32_t *idx = calloc((size_t)(T * K + 1), sizeof(int32_t));
  int *keep = calloc((size_t)(T * K + 1), sizeof(int));
  int64_t *order = calloc((size_t)(T * K + 1), sizeof(int64_t));
  double *pre = calloc((size_t)F, sizeof(double)), *hh = calloc((size_t)F, sizeof(double));
  double *out = calloc((size_t)H, sizeof(double)), *dpre = calloc((size_t)F, sizeof(double));
  double *dxd = calloc((size_t)(T * H + 1), sizeof(double)),
         *yt = calloc((size_t)H, sizeof(double));
  for (int64_t t = 0; t < T; t++) {
    for (int64_t e = 0; e < E; e++) {
      double s = 0.0;
      for (int64_t h = 0; h < H; h++) {
        s += (double)x[t * H + h] * wr[h * E + e];
      }
      logits[t * E + e] = (float)s;
    }
  }
  loom_tensor_t tl, tp, ti, tw, td, tdw;
  const int64_t se[2] = {T, E}, sk[2] = {T, K};
  OK(loom_tensor_wrap(&tl, logits, LOOM_F32, LOOM_DEVICE_HOST, 2, se, "logits"));
  OK(loom_tensor_wrap(&tp, probs, LOOM_F32, LOOM_DEVICE_HOST, 2, se, "probs"));
  OK(loom_tensor_wrap(&td, dprobs, LOOM_F32, LOOM_DEVICE_HOST, 2, se, "dprobs"));
  OK(loom_tensor_wrap(&ti, idx, LOOM_I32, LOOM_DEVICE_HOST, 2, sk, "idx"));
  OK(loom_tensor_wrap(&tw, weight, LOOM_F32, LOOM_DEVICE_HOST, 2, sk, "weight"));
  OK(loom_tensor_wrap(&tdw, dw, LOOM_F32, LOOM_DEVICE_HOST, 2, sk, "dweight"));
  OK(loom_moe_router_forward(&tp, &ti, &tw, &tl));
  if (cfg->aux_coef > 0.0f) {
    OK(loom_moe_aux_loss(&r->aux, &td, &tp, &ti, cfg->aux_coef));
  }
  // Capacity: per expert, ceil(factor * T * K / E) of its assignments, in token order or by
  // weight (descending, ties by token order).
  for (int64_t i = 0; i < T * K; i++) {
    keep[i] = 1;
  }
  if (cfg->capacity_factor > 0.0 && T > 0) {
    const int64_t cap = (int64_t)ceil(cfg->capacity_factor * (double)(T * K) / (double)E);
    for (int g = 0; g < E; g++) {
      int64_t n = 0;
      for (int64_t i = 0; i < T * K; i++) {
        if (idx[i] == g) {
          order[n++] = i;
        }
      }
      for (int64_t a = 1; cfg->drop == LOOM_MOE_DROP_LOW_WEIGHT && a < n; a++) { // insertion sort
        for (int64_t b = a; b > 0 && weight[order[b]] > weight[order[b - 1]]; b--) {
          const int64_t tmp = order[b];
          order[b] = order[b - 1];
          order[b - 1] = tmp;
        }
      }
      for (int64_t j = cap; j < n; j++) {
        keep[order[j]] = 0;
      }
    }
  }
  for (int64_t t = 0; t < T; t++) {
    const float *xt = x + t * H, *dyt = dy + t * H;
    memset(yt, 0, sizeof(double) * (size_t)H);
    for (int k = 0; k < K; k++) {
      const int64_t i = t * K + k, g = idx[i];
      if (!keep[i]) {
        continue;
      }
      for (int64_t f = 0; f < F; f++) {
        double s = b1[g * F + f];
        for (int64_t h = 0; h < H; h++) {
          s += (double)xt[h] * w1[(g * H + h) * F + f];
        }
        pre[f] = s;
        hh[f] = gelu_ref(s);
      }
      double dwi = 0.0;
      for (int64_t h = 0; h < H; h++) {
        double s = b2[g * H + h];
        for (int64_t f = 0; f < F; f++) {
          s += hh[f] * w2[(g * F + f) * H + h];
        }
        out[h] = s;
        yt[h] += (double)weight[i] * s;
        dwi += (double)dyt[h] * s;
      }
      dw[i] = (float)dwi;
      for (int64_t f = 0; f < F; f++) { // dout = weight * dy
        double s = 0.0;
        for (int64_t h = 0; h < H; h++) {
          const double dout = (double)weight[i] * dyt[h];
          s += dout * w2[(g * F + f) * H + h];
          gd[LOOM_MOE_W2][(g * F + f) * H + h] += hh[f] * dout;
        }
        dpre[f] = s * gelu_ref_grad(pre[f]);
        gd[LOOM_MOE_B1][g * F + f] += dpre[f];
      }
      for (int64_t h = 0; h < H; h++) {
        gd[LOOM_MOE_B2][g * H + h] += (double)weight[i] * dyt[h];
        double s = 0.0;
        for (int64_t f = 0; f < F; f++) {
          s += dpre[f] * w1[(g * H + h) * F + f];
          gd[LOOM_MOE_W1][(g * H + h) * F + f] += (double)xt[h] * dpre[f];
        }
        dxd[t * H + h] += s;
      }
    }
    for (int64_t h = 0; h < H; h++) {
      r->y[t * H + h] = (float)yt[h];
    }
  }
  // The router: dlogits from the kernel (in place on dprobs), then Wr and x.
  OK(loom_moe_router_backward(&td, &tdw, &tp, &ti, &tw, &td));
  for (int64_t t = 0; t < T; t++) {
    for (int64_t e = 0; e < E; e++) {
      const double d = dprobs[t * E + e];
      for (int64_t h = 0; h < H; h++) {
        gd[LOOM_MOE_ROUTER][h * E + e] += (double)x[t * H + h] * d;
        dxd[t * H + h] += d * wr[h * E + e];
      }
    }
  }
  for (int64_t i = 0; i < T * H; i++) {
    r->dx[i] = (float)dxd[i];
  }
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    for (int64_t i = 0; i < np[p]; i++) {
      r->grad[p][i] = (float)gd[p][i];
    }
    free(gd[p]);
  }
  free(logits);
  free(probs);
  free(dprobs);
  free(weight);
  free(dw);
  free(idx);
  free(keep);
  free(order);
  free(pre);
  free(hh);
  free(out);
  free(dpre);
  free(dxd);
  free(yt);
}

// Build a layer (ep NULL: the reference), run one forward and backward on this rank's tokens.
// ref_first: for the reference, the first global expert whose gradients are kept (the ones this
// rank holds in the distributed layer), el of them.
static void run_layer(loom_ctx_t *ctx, const loom_group_t *ep, const loom_moe_config_t *cfg,
                      const scenario_t *sc, int ref_first, int el, run_out_t *o) {
  memset(o, 0, sizeof *o);
  loom_moe_t *m = NULL;
  OK(loom_moe_create(ctx, ep, cfg, &m));
  if (!m) {
    return;
  }
  const int64_t H = cfg->hidden, T = sc->t;
  if (sc->skew) { // a large positive weight column for the last expert: positive x routes there
    float *r = loom_moe_param(m, LOOM_MOE_ROUTER)->data;
    for (int64_t i = 0; i < H; i++) {
      r[i * cfg->num_experts + cfg->num_experts - 1] += 4.0f / sqrtf((float)H);
    }
  }
  set_biases(m, cfg, ep ? loom_group_rank(ep) * el : 0, ep ? el : cfg->num_experts);
  int64_t shape[2] = {T, H};
  loom_tensor_t x = test_tensor_f32(2, shape, "x"), dy = test_tensor_f32(2, shape, "dy");
  // y and dx inside sentinels, their own elements set to NaN: every row must be written, and
  // nothing before or past them.
  test_guarded_t y = test_guarded_f32(2, shape, "y"), dx = test_guarded_f32(2, shape, "dx");
  test_fill_value(test_floats(&y.t), T * H, NAN);  // (the sentinel is too small to show a row
  test_fill_value(test_floats(&dx.t), T * H, NAN); // left unwritten where the reference is 0)
  test_rng_t rng = test_rng(500u + 31u * (uint64_t)world_rank);
  test_fill_uniform(&rng, test_floats(&x), T * H, sc->skew ? 0.0 : -1.0, 1.0);
  test_fill_uniform(&rng, test_floats(&dy), T * H, -1.0, 1.0);
  OK(loom_moe_forward(m, &x, &y.t, &o->aux));
  OK(loom_moe_backward(m, &dy, &dx.t));
  CHECK(test_guards_intact(&y) && test_guards_intact(&dx),
        "%s (%s): a write before or past y or dx", sc->name, ep ? "ep" : "single-rank");
  o->y = malloc(sizeof(float) * (size_t)(T * H + 1));
  o->dx = malloc(sizeof(float) * (size_t)(T * H + 1));
  if (T > 0) { // an empty tensor has no data pointer
    memcpy(o->y, test_floats(&y.t), sizeof(float) * (size_t)(T * H));
    memcpy(o->dx, test_floats(&dx.t), sizeof(float) * (size_t)(T * H));
  }
  if (!ep) { // the single-rank layer against the dense reference (this rank's tokens)
    dense_ref_t r;
    double err = 0.0;
    dense_reference(m, cfg, T, test_floats(&x), test_floats(&dy), &r);
    CHECK(close_rel(o->y, r.y, T * H, 1e-4, &err), "%s: y off the dense reference by %g", sc->name,
          err);
    CHECK(close_rel(o->dx, r.dx, T * H, 1e-4, &err), "%s: dx off the dense reference by %g",
          sc->name, err);
    CHECK(fabsf(o->aux - r.aux) <= 1e-6f * fmaxf(1.0f, fabsf(r.aux)),
          "%s: aux %g, the dense reference %g", sc->name, (double)o->aux, (double)r.aux);
    static const char *const pn[] = {"router", "w1", "b1", "w2", "b2"};
    for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
      const loom_tensor_t *g = loom_moe_grad(m, (loom_moe_param_t)p);
      CHECK(close_rel(g->data, r.grad[p], loom_tensor_numel(g), 1e-4, &err),
            "%s: %s grad off the dense reference by %g", sc->name, pn[p], err);
    }
    dense_ref_free(&r);
  }
  // A second step on the same tokens: the same y and dx bit for bit, every gradient doubled
  // (accumulated, not overwritten; nothing left over from the first step changes the second).
  float *g1[LOOM_MOE_PARAM_COUNT];
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    const loom_tensor_t *g = loom_moe_grad(m, (loom_moe_param_t)p);
    const int64_t n = loom_tensor_numel(g);
    g1[p] = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
      g1[p][i] = 2.0f * ((const float *)g->data)[i];
    }
  }
  test_fill_value(test_floats(&y.t), T * H, NAN);
  test_fill_value(test_floats(&dx.t), T * H, NAN);
  float aux2 = 0.0f;
  OK(loom_moe_forward(m, &x, &y.t, &aux2));
  OK(loom_moe_backward(m, &dy, &dx.t));
  CHECK(test_same_bits(o->y, test_floats(&y.t), T * H) &&
            test_same_bits(o->dx, test_floats(&dx.t), T * H) && aux2 == o->aux,
        "%s (%s): a second step on the same tokens gave another y, dx or aux", sc->name,
        ep ? "ep" : "single-rank");
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    const loom_tensor_t *g = loom_moe_grad(m, (loom_moe_param_t)p);
    double err = 0.0;
    CHECK(close_rel(g->data, g1[p], loom_tensor_numel(g), 1e-5, &err),
          "%s (%s): param %d's gradient after two steps is not twice one step's (off by %g)",
          sc->name, ep ? "ep" : "single-rank", p, err);
    for (int64_t i = 0; i < loom_tensor_numel(g); i++) { // back to one step's, for the compare
      ((float *)g->data)[i] *= 0.5f;
    }
    free(g1[p]);
  }
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    const loom_tensor_t *g = loom_moe_grad(m, (loom_moe_param_t)p);
    int64_t n = loom_tensor_numel(g), per = n;
    const float *src = g->data;
    float *sum = NULL;
    if (p != LOOM_MOE_ROUTER) { // the reference holds every expert: keep this rank's share
      per = n / (ep ? el : cfg->num_experts);
      if (!ep) { // of the sum over the ranks' tokens (each rank's reference saw its own only)
        sum = malloc(sizeof(float) * (size_t)(per * cfg->num_experts));
        MPI_Allreduce(src, sum, (int)(per * cfg->num_experts), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        src = sum + per * ref_first;
      }
      n = per * el;
    }
    o->ngrad[p] = n;
    o->grad[p] = malloc(sizeof(float) * (size_t)(n + 1));
    memcpy(o->grad[p], src, sizeof(float) * (size_t)n);
    free(sum);
  }
  loom_moe_stats_t st;
  loom_moe_stats(m, &st);
  for (int e = 0; e < st.num_experts; e++) {
    o->sent_total += st.sent[e];
  }
  for (int e = 0; e < st.local_experts; e++) {
    o->received_total += st.received[e];
  }
  o->dropped = st.dropped;
  TEST_FREE(&x, &dy);
  test_guarded_free(&y);
  test_guarded_free(&dx);
  loom_moe_destroy(m);
}

// max |a - b| <= tol * max(max |b|, 1e-3)
static int close_rel(const float *a, const float *b, int64_t n, double tol, double *err) {
  double big = 1e-3, worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) { // fmax would drop it: a NaN in either is never close
      *err = NAN;
      return 0;
    }
    big = fmax(big, fabs((double)b[i]));
    worst = fmax(worst, d);
  }
  *err = worst / big;
  return isfinite(worst) && worst <= tol * big;
}

static void compare(const char *what, const run_out_t *got, const run_out_t *want, int64_t n_rows,
                    int64_t H, int exact) {
  static const char *const pn[] = {"router", "w1", "b1", "w2", "b2"};
  double err = 0.0;
  if (exact) {
    CHECK(test_same_bits(got->y, want->y, n_rows * H), "%s: y differs bitwise", what);
    CHECK(test_same_bits(got->dx, want->dx, n_rows * H), "%s: dx differs bitwise", what);
  } else {
    CHECK(close_rel(got->y, want->y, n_rows * H, 1e-5, &err), "%s: y off by %g", what, err);
    CHECK(close_rel(got->dx, want->dx, n_rows * H, 1e-5, &err), "%s: dx off by %g", what, err);
    CHECK(fabsf(got->aux - want->aux) <= 1e-6f * fmaxf(1.0f, fabsf(want->aux)), "%s: aux %g vs %g",
          what, (double)got->aux, (double)want->aux);
  }
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    CHECK(got->ngrad[p] == want->ngrad[p], "%s: %s grad sizes %lld vs %lld", what, pn[p],
          (long long)got->ngrad[p], (long long)want->ngrad[p]);
    if (got->ngrad[p] != want->ngrad[p]) {
      continue;
    }
    if (exact) {
      CHECK(test_same_bits(got->grad[p], want->grad[p], got->ngrad[p]),
            "%s: %s grad differs bitwise", what, pn[p]);
    } else {
      // Weight gradients sum over many rows in a different order: 1e-5 of the largest entry.
      CHECK(close_rel(got->grad[p], want->grad[p], got->ngrad[p], 1e-5, &err),
            "%s: %s grad off by %g", what, pn[p], err);
    }
  }
}

static void test_scenario(loom_ctx_t *ctx, const loom_group_t *world, const scenario_t *sc) {
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = 2 * world_size;
  cfg.top_k = 2;
  cfg.hidden = 24;
  cfg.ffn = 40;
  cfg.chunks = 3;
  cfg.col_slices = 3;
  cfg.capacity_factor = sc->capacity;
  cfg.drop = sc->drop;
  cfg.seed = 7;
  const int el = cfg.num_experts / world_size;
  run_out_t ref, mode[LOOM_MOE_OVERLAP_COUNT];
  cfg.overlap = LOOM_MOE_OVERLAP_NONE;
  run_layer(ctx, NULL, &cfg, sc, world_rank * el, el, &ref);
  for (int o = 0; o < LOOM_MOE_OVERLAP_COUNT; o++) {
    cfg.overlap = o;
    run_layer(ctx, world, &cfg, sc, 0, el, &mode[o]);
    char what[128];
    snprintf(what, sizeof what, "%s, %s vs the single-rank layer", sc->name,
             loom_moe_overlap_name(o));
    compare(what, &mode[o], &ref, sc->t, cfg.hidden, 0);
    if (o > 0) {
      snprintf(what, sizeof what, "%s, %s vs none", sc->name, loom_moe_overlap_name(o));
      compare(what, &mode[o], &mode[0], sc->t, cfg.hidden, 1);
    }
  }
  // The counts: this rank's kept assignments; over the group, received = sent.
  const run_out_t *f = &mode[LOOM_MOE_OVERLAP_FINE];
  CHECK(f->sent_total + f->dropped == sc->t * cfg.top_k, "%s: sent %lld + dropped %lld != %lld",
        sc->name, (long long)f->sent_total, (long long)f->dropped, (long long)(sc->t * cfg.top_k));
  CHECK(sc->capacity > 0 || f->dropped == 0, "%s: dropless run dropped %lld", sc->name,
        (long long)f->dropped);
  long long tot[2] = {f->sent_total, f->received_total};
  MPI_Allreduce(MPI_IN_PLACE, tot, 2, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  CHECK(tot[0] == tot[1], "%s: %lld assignments sent, %lld received", sc->name, tot[0], tot[1]);
  if (sc->capacity > 0 && sc->skew && cfg.num_experts > cfg.top_k) {
    long long dropped = f->dropped;
    MPI_Allreduce(MPI_IN_PLACE, &dropped, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(dropped > 0, "%s: a skewed routing at capacity 1 dropped nothing", sc->name);
  }
  run_out_free(&ref);
  for (int o = 0; o < LOOM_MOE_OVERLAP_COUNT; o++) {
    run_out_free(&mode[o]);
  }
}

static void test_config_errors(loom_ctx_t *ctx, const loom_group_t *world) {
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = 2 * world_size;
  cfg.top_k = world_rank == 0 ? 1 : 2; // differs on rank 0
  cfg.hidden = 8;
  cfg.ffn = 8;
  loom_moe_t *m = NULL;
  loom_status_t st = loom_moe_create(ctx, world, &cfg, &m);
  if (world_size > 1) {
    CHECK(st == LOOM_ERR_INVALID_ARG && !m, "top_k differing between ranks: %s", loom_strerror(st));
    CHECK(strstr(loom_last_error(NULL), "top_k") != NULL, "message does not name top_k: %s",
          loom_last_error(NULL));
  } else {
    CHECK(st == LOOM_OK, "np 1: %s", loom_last_error(NULL));
  }
  loom_moe_destroy(m);
  m = NULL;
  cfg.top_k = 2;
  cfg.num_experts = world_size == 1 ? 0 : 2 * world_size + 1; // not a multiple of np
  st = loom_moe_create(ctx, world, &cfg, &m);
  CHECK(st == LOOM_ERR_INVALID_ARG && !m, "num_experts %d at np %d accepted", cfg.num_experts,
        world_size);
  loom_moe_destroy(m);
  m = NULL;
  cfg.num_experts = 2 * world_size;
  cfg.hidden = world_rank == world_size - 1 ? 16 : 8; // hidden differs on the last rank
  st = loom_moe_create(ctx, world, &cfg, &m);
  CHECK(world_size == 1 || (st == LOOM_ERR_INVALID_ARG && !m), "hidden differing accepted");
  loom_moe_destroy(m);
  m = NULL;
  // A seed that differs (one per rank, as for data shuffling): the replicated router would
  // differ between the ranks without a word.
  cfg.hidden = 8;
  cfg.seed = 1000u + (uint64_t)world_rank;
  st = loom_moe_create(ctx, world, &cfg, &m);
  if (world_size > 1) {
    CHECK(st == LOOM_ERR_INVALID_ARG && !m, "seed differing between ranks: %s", loom_strerror(st));
    CHECK(strstr(loom_last_error(NULL), "seed") != NULL, "message does not name seed: %s",
          loom_last_error(NULL));
  }
  loom_moe_destroy(m);
}

static void test_tuning_cache(loom_ctx_t *ctx, const loom_group_t *world) {
  char dir[] = "/tmp/loom-moe-tune-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");
  setenv("LOOM_CACHE_DIR", dir, 1);
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = 4;
  cfg.top_k = 2;
  cfg.hidden = 8;
  cfg.ffn = 12;
  cfg.overlap = LOOM_MOE_OVERLAP_FINE;
  loom_moe_tuning_t best = {0, 0, 0.0};
  OK(loom_moe_tune(ctx, NULL, &cfg, 16, 1, NULL, &best));
  CHECK(best.chunks >= 1 && best.chunks <= 8 && best.slices >= 1 && best.slices <= 8 && best.ms > 0,
        "tune: chunks %d slices %d ms %g", best.chunks, best.slices, best.ms);
  // Damage the file: lines that must be ignored, before and after the real one.
  DIR *d = opendir(dir);
  struct dirent *de;
  char path[1024] = "";
  while (d && (de = readdir(d))) {
    if (strncmp(de->d_name, "moe-tune-", 9) == 0) {
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    }
  }
  if (d) {
    closedir(d);
  }
  CHECK(path[0], "no moe-tune cache file in %s", dir);
  FILE *f = fopen(path, "a");
  if (f) {
    fprintf(f, "garbage\n4 2 8 12 1 2 16 999 4 1.0\n4 2 8 12 1 2 16 -1 4 1.0\n4 2 8 12 1 2\n");
    // Numbers past an int, which once wrapped into the grid (2^32 + 1 read as 1), and a line
    // longer than the reader's buffer whose last piece reads as an entry of its own.
    const int c2 = best.chunks == 1 ? 2 : 1, s2 = best.slices == 1 ? 2 : 1;
    fprintf(f, "4 2 8 12 1 2 16 %lld %lld 1.0\n", (1LL << 32) + c2, (1LL << 32) + s2);
    fprintf(f, "4294967300 2 8 12 1 2 16 %d %d 1.0\n", c2, s2);
    fprintf(f, "%0300d%20s4 2 8 12 1 2 16 %d %d 1.0\n", 0, "", c2, s2);
    fclose(f);
  }
  loom_moe_config_t look = cfg;
  CHECK(loom_moe_tuned(ctx, NULL, &look, 1, 20) == 1 && look.chunks == best.chunks &&
            look.col_slices == best.slices,
        "tuned: %d x %d, tuned %d x %d", look.chunks, look.col_slices, best.chunks, best.slices);
  look = cfg;
  look.hidden = 16; // another shape
  CHECK(loom_moe_tuned(ctx, NULL, &look, 1, 16) == 0 && look.chunks == 0, "another shape matched");
  look = cfg;
  look.chunks = 3; // given: only the slices come from the cache
  CHECK(loom_moe_tuned(ctx, NULL, &look, 1, 16) == 1 && look.chunks == 3 &&
            look.col_slices == best.slices,
        "a given chunk count was overwritten");
  // Over the world every rank takes rank 0's split (each rank tuned into its own directory).
  int want[2] = {best.chunks, best.slices};
  MPI_Bcast(want, 2, MPI_INT, 0, MPI_COMM_WORLD);
  look = cfg;
  CHECK(loom_moe_tuned(ctx, world, &look, 1, 16) == 1 && look.chunks == want[0] &&
            look.col_slices == want[1],
        "over the world: %d x %d, rank 0 tuned %d x %d", look.chunks, look.col_slices, want[0],
        want[1]);
  // A cache that is not a regular file (/dev/zero: an endless run of NUL lines, which the
  // reader once looped over forever) is treated as absent, after one warning.
  unlink(path);
  CHECK(symlink("/dev/zero", path) == 0, "symlink %s -> /dev/zero failed", path);
  quiet_begin();
  alarm(60); // (a reader that never ends fails the test instead of hanging it)
  look = cfg;
  int found = loom_moe_tuned(ctx, NULL, &look, 1, 16);
  alarm(0);
  quiet_end();
  CHECK(found == 0 && look.chunks == 0 && look.col_slices == 0,
        "/dev/zero as the cache: %d, %d x %d", found, look.chunks, look.col_slices);
  unlink(path);
  rmdir(dir);
  unsetenv("LOOM_CACHE_DIR");
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  world_rank = loom_rank(ctx);
  world_size = loom_size(ctx);
  const loom_group_t *world = loom_group(ctx, LOOM_GROUP_WORLD);
  const int last = world_rank == world_size - 1 && world_size > 1;
  const scenario_t scenarios[] = {
      {"uneven tokens", 5 + 7 * world_rank, 0, 0.0, LOOM_MOE_DROP_LATE},
      {"one rank without tokens", last ? 0 : 9 + world_rank, 0, 0.0, LOOM_MOE_DROP_LATE},
      {"skewed routing", 13 + world_rank, 1, 0.0, LOOM_MOE_DROP_LATE},
      {"capacity 1, drop late", 11 + 2 * world_rank, 1, 1.0, LOOM_MOE_DROP_LATE},
      {"capacity 1.25, drop low weight", 11 + 2 * world_rank, 0, 1.25, LOOM_MOE_DROP_LOW_WEIGHT},
      {"capacity 1, drop low weight, skewed", 17, 1, 1.0, LOOM_MOE_DROP_LOW_WEIGHT},
  };
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
    test_scenario(ctx, world, &scenarios[i]);
  }
  test_config_errors(ctx, world);
  test_tuning_cache(ctx, world);
  int rc = check_exit_all("test_moe");
  loom_finalize(ctx);
  return rc;
}
