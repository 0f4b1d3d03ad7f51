/* test_attention.c — varlen attention (forward, backward) against a naive padded-free double
 * reference, finite differences of the backward, determinism, empty batches and bad arguments. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "cpu/attention_short_cpu.h"
#include "error.h"

// Tolerances (float tiles against a double reference; q, k, v, dout uniform, |v| <= 1):
// - out: atol 2e-5 + rtol 1e-4. Each output is a convex combination of v rows: the float
//   sgemm sums, the exp2 polynomial (rel. error < 2.5e-7) and the online rescaling give
//   errors of a few 1e-7 per term; measured worst 1.3e-6.
// - lse: atol 2e-5 + rtol 1e-5 (|lse| <= ~30 here; float log2 and the running sum).
// - dq, dk, dv: atol 2e-5 * max(1, max|want|) + rtol 1e-3. They are sums over up to a few
//   thousand rows of products with cancelling signs (dS = P (dP - Di)), so the error is
//   absolute, relative to the tensor's scale; measured worst 1.3e-6 of the scale.
// - finite differences of loom's float forward (h = 1e-2, loss = sum(out * w) in double):
//   truncation ~h^2 and float rounding ~1e-6 / 2h: atol 2e-3 + rtol 1e-2.
#define OUT_ATOL  2e-5
#define OUT_RTOL  1e-4
#define LSE_ATOL  2e-5
#define LSE_RTOL  1e-5
#define GRAD_ATOL 2e-5
#define GRAD_RTOL 1e-3
#define FD_H      1e-2
#define FD_ATOL   2e-3
#define FD_RTOL   1e-2

// ---------------------------------------------------------------------------------------------
// Helpers

static double max_abs(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    m = fmax(m, fabs(x[i]));
  }
  return m;
}

// A packed varlen batch: tensors, the double reference, and its configuration.
typedef struct batch {
  int B, H, H_kv, D, causal;
  float scale; // as passed (<= 0: default)
  int64_t total_q, total_k;
  loom_tensor_t cu_q, cu_k, q, k, v, dout, out, lse, dq, dk, dv;
  double *r_out, *r_lse, *r_dq, *r_dk, *r_dv; // reference, same layouts
} batch_t;

// The outputs of a call (out, lse, dq, dk, dv): set every element to x, or check that each is x.
static void fill_outputs(batch_t *t, float x) {
  loom_tensor_t *o[] = {&t->out, &t->lse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof o / sizeof o[0]; i++) {
    test_fill_value(o[i]->data, loom_tensor_numel(o[i]), x);
  }
}

static int outputs_equal(const batch_t *t, float x) {
  const loom_tensor_t *o[] = {&t->out, &t->lse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof o / sizeof o[0]; i++) {
    if (!test_all_equal(o[i]->data, loom_tensor_numel(o[i]), x)) {
      return 0;
    }
  }
  return 1;
}

static void batch_init(batch_t *t, test_rng_t *rng, int B, const int *lq, const int *lk, int H,
                       int H_kv, int D, int causal, float scale, double qk_range) {
  memset(t, 0, sizeof *t);
  t->B = B;
  t->H = H;
  t->H_kv = H_kv;
  t->D = D;
  t->causal = causal;
  t->scale = scale;
  const int64_t cu_shape[1] = {B + 1};
  t->cu_q = test_tensor(LOOM_I32, 1, cu_shape, "cu_seqlens_q");
  t->cu_k = test_tensor(LOOM_I32, 1, cu_shape, "cu_seqlens_k");
  int32_t *cq = t->cu_q.data, *ck = t->cu_k.data;
  cq[0] = ck[0] = 0;
  for (int b = 0; b < B; b++) {
    cq[b + 1] = cq[b] + lq[b];
    ck[b + 1] = ck[b] + lk[b];
  }
  t->total_q = cq[B];
  t->total_k = ck[B];
  const int64_t qs[3] = {t->total_q, H, D}, ks[3] = {t->total_k, H_kv, D}, ls[2] = {H, t->total_q};
  t->q = test_tensor(LOOM_F32, 3, qs, "q");
  t->k = test_tensor(LOOM_F32, 3, ks, "k");
  t->v = test_tensor(LOOM_F32, 3, ks, "v");
  t->dout = test_tensor(LOOM_F32, 3, qs, "dout");
  t->out = test_tensor(LOOM_F32, 3, qs, "out");
  t->lse = test_tensor(LOOM_F32, 2, ls, "lse");
  t->dq = test_tensor(LOOM_F32, 3, qs, "dq");
  t->dk = test_tensor(LOOM_F32, 3, ks, "dk");
  t->dv = test_tensor(LOOM_F32, 3, ks, "dv");
  test_fill_uniform(rng, t->q.data, loom_tensor_numel(&t->q), -qk_range, qk_range);
  test_fill_uniform(rng, t->k.data, loom_tensor_numel(&t->k), -qk_range, qk_range);
  test_fill_uniform(rng, t->v.data, loom_tensor_numel(&t->v), -1, 1);
  test_fill_uniform(rng, t->dout.data, loom_tensor_numel(&t->dout), -1, 1);
  // Outputs start as NaN: every element must be overwritten.
  fill_outputs(t, NAN);
}

static void batch_free(batch_t *t) {
  TEST_FREE(&t->cu_q, &t->cu_k, &t->q, &t->k, &t->v, &t->dout, &t->out, &t->lse, &t->dq, &t->dk,
            &t->dv);
  free(t->r_out);
  free(t->r_lse);
  free(t->r_dq);
  free(t->r_dk);
  free(t->r_dv);
}

// ---------------------------------------------------------------------------------------------
// The naive reference: one query row at a time (scores over its sequence's keys in double),
// forward and backward, with the mask written out; no tiles, no online softmax.

static void reference(batch_t *t) {
  const int H = t->H, H_kv = t->H_kv, D = t->D, group = H / H_kv;
  const double scale = t->scale > 0 ? t->scale : 1.0 / sqrt((double)D);
  const int64_t nq = t->total_q * H * D, nk = t->total_k * H_kv * D;
  t->r_out = calloc((size_t)nq + 1, sizeof(double));
  t->r_lse = calloc((size_t)(t->total_q * H) + 1, sizeof(double));
  t->r_dq = calloc((size_t)nq + 1, sizeof(double));
  t->r_dk = calloc((size_t)nk + 1, sizeof(double));
  t->r_dv = calloc((size_t)nk + 1, sizeof(double));
  const int32_t *cq = t->cu_q.data, *ck = t->cu_k.data;
  const float *q = t->q.data, *k = t->k.data, *v = t->v.data, *dout = t->dout.data;
  int max_lk = 0;
  for (int b = 0; b < t->B; b++) {
    max_lk = ck[b + 1] - ck[b] > max_lk ? ck[b + 1] - ck[b] : max_lk;
  }
  double *p = malloc(((size_t)max_lk + 1) * sizeof(double));
  double *dp = malloc(((size_t)max_lk + 1) * sizeof(double));
  for (int b = 0; b < t->B; b++) {
    const int lq = cq[b + 1] - cq[b], lk = ck[b + 1] - ck[b];
    for (int h = 0; h < H; h++) {
      const int g = h / group;
      for (int i = 0; i < lq; i++) {
        const int64_t qi = ((cq[b] + i) * (int64_t)H + h) * D;
        int end = lk;
        if (t->causal && i + lk - lq + 1 < end) {
          end = i + lk - lq + 1;
        }
        if (end <= 0) {
          t->r_lse[h * t->total_q + cq[b] + i] = -INFINITY;
          continue; // zero output and gradients
        }
        double m = -INFINITY;
        for (int j = 0; j < end; j++) {
          const int64_t kj = ((ck[b] + j) * (int64_t)H_kv + g) * D;
          double s = 0;
          for (int d = 0; d < D; d++) {
            s += (double)q[qi + d] * k[kj + d];
          }
          p[j] = s * scale;
          m = fmax(m, p[j]);
        }
        double sum = exp(p[0] - m); // end >= 1 here
        for (int j = 1; j < end; j++) {
          sum += exp(p[j] - m);
        }
        const double lse = m + log(sum);
        t->r_lse[h * t->total_q + cq[b] + i] = lse;
        double di = 0;
        for (int j = 0; j < end; j++) {
          const int64_t kj = ((ck[b] + j) * (int64_t)H_kv + g) * D;
          p[j] = exp(p[j] - lse);
          double s = 0;
          for (int d = 0; d < D; d++) {
            t->r_out[qi + d] += p[j] * v[kj + d];
            s += (double)dout[qi + d] * v[kj + d];
          }
          dp[j] = s;
          di += p[j] * s;
        }
        for (int j = 0; j < end; j++) {
          const int64_t kj = ((ck[b] + j) * (int64_t)H_kv + g) * D;
          const double ds = p[j] * (dp[j] - di) * scale;
          for (int d = 0; d < D; d++) {
            t->r_dq[qi + d] += ds * k[kj + d];
            t->r_dk[kj + d] += ds * q[qi + d];
            t->r_dv[kj + d] += p[j] * dout[qi + d];
          }
        }
      }
    }
  }
  free(p);
  free(dp);
}

// lse: -inf exactly where the reference has -inf, within tolerance elsewhere.
static int64_t compare_lse(const char *what, const float *got, const double *want, int64_t n) {
  int64_t bad = 0;
  double *w = malloc(((size_t)n + 1) * sizeof(double));
  float *g = malloc(((size_t)n + 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) {
    if (isinf(want[i])) {
      if (!(isinf(got[i]) && got[i] < 0)) {
        if (!bad) {
          fprintf(stderr, "FAIL %s: [%lld] got %g, want -inf (a row without keys)\n", what,
                  (long long)i, (double)got[i]);
        }
        bad++;
      }
      w[i] = 0;
      g[i] = 0;
    } else {
      w[i] = want[i];
      g[i] = got[i];
    }
  }
  bad += test_compare(what, g, w, n, LSE_ATOL, LSE_RTOL);
  free(w);
  free(g);
  return bad;
}

// Largest |got - want| / max(1, max|want|): printed so that the tolerances can be judged.
static double scaled_err(const float *got, const double *want, int64_t n) {
  double e = 0, s = fmax(1.0, max_abs(want, n));
  for (int64_t i = 0; i < n; i++) {
    e = fmax(e, fabs((double)got[i] - want[i]) / s);
  }
  return e;
}

static double worst_out, worst_grad; // over all cases, for the summary line

// Forward and backward of one batch against the reference; backward twice for determinism.
static void check_batch(const char *name, batch_t *t) {
  char what[160];
  loom_status_t st = loom_attention_forward(&t->out, &t->lse, &t->q, &t->k, &t->v, &t->cu_q,
                                            &t->cu_k, t->causal, t->scale);
  CHECK(st == LOOM_OK, "%s: forward: %s", name, loom_last_error(NULL));
  st = loom_attention_backward(&t->dq, &t->dk, &t->dv, &t->dout, &t->q, &t->k, &t->v, &t->out,
                               &t->lse, &t->cu_q, &t->cu_k, t->causal, t->scale);
  CHECK(st == LOOM_OK, "%s: backward: %s", name, loom_last_error(NULL));
  reference(t);
  const int64_t nq = loom_tensor_numel(&t->q), nk = loom_tensor_numel(&t->k);
  snprintf(what, sizeof what, "%s out", name);
  CHECK(test_compare(what, t->out.data, t->r_out, nq, OUT_ATOL, OUT_RTOL) == 0, "%s", what);
  snprintf(what, sizeof what, "%s lse", name);
  CHECK(compare_lse(what, t->lse.data, t->r_lse, t->total_q * t->H) == 0, "%s", what);
  const struct {
    const char *n;
    const loom_tensor_t *got;
    const double *want;
    int64_t count;
  } g[] = {{"dq", &t->dq, t->r_dq, nq}, {"dk", &t->dk, t->r_dk, nk}, {"dv", &t->dv, t->r_dv, nk}};
  worst_out = fmax(worst_out, scaled_err(t->out.data, t->r_out, nq));
  for (int i = 0; i < 3; i++) {
    snprintf(what, sizeof what, "%s %s", name, g[i].n);
    const double atol = GRAD_ATOL * fmax(1.0, max_abs(g[i].want, g[i].count));
    CHECK(test_compare(what, g[i].got->data, g[i].want, g[i].count, atol, GRAD_RTOL) == 0, "%s",
          what);
    worst_grad = fmax(worst_grad, scaled_err(g[i].got->data, g[i].want, g[i].count));
  }

  // Determinism: a second backward gives the same bits (GQA sums in a fixed order).
  loom_tensor_t dq2 = test_tensor(LOOM_F32, 3, t->dq.shape, "dq2");
  loom_tensor_t dk2 = test_tensor(LOOM_F32, 3, t->dk.shape, "dk2");
  loom_tensor_t dv2 = test_tensor(LOOM_F32, 3, t->dv.shape, "dv2");
  st = loom_attention_backward(&dq2, &dk2, &dv2, &t->dout, &t->q, &t->k, &t->v, &t->out, &t->lse,
                               &t->cu_q, &t->cu_k, t->causal, t->scale);
  CHECK(st == LOOM_OK && test_same_bits(dq2.data, t->dq.data, nq) &&
            test_same_bits(dk2.data, t->dk.data, nk) && test_same_bits(dv2.data, t->dv.data, nk),
        "%s: a second backward differs", name);
  loom_tensor_free(&dq2);
  loom_tensor_free(&dk2);
  loom_tensor_free(&dv2);
}

static void run_case(const char *name, test_rng_t *rng, int B, const int *lq, const int *lk, int H,
                     int H_kv, int D, int causal, float scale, double qk_range) {
  batch_t t;
  batch_init(&t, rng, B, lq, lk, H, H_kv, D, causal, scale, qk_range);
  check_batch(name, &t);
  batch_free(&t);
}

// ---------------------------------------------------------------------------------------------
// Cases against the reference

static void test_long(void) {
  test_rng_t rng = test_rng(1);
  // Causal, a few thousand tokens; the second sequence is a query shard over a longer key
  // prefix (bottom-right alignment), as attention servers see it. GQA with one KV head.
  const int lq1[2] = {2600, 900}, lk1[2] = {2600, 1400};
  run_case("long causal H=2 H_kv=1 D=64", &rng, 2, lq1, lk1, 2, 1, 64, 1, 0.0f, 1.0);
  // Non-causal, q longer and shorter than k, D = 16.
  const int lq2[3] = {1500, 300, 1}, lk2[3] = {1000, 2000, 1};
  run_case("long non-causal H=2 H_kv=2 D=16", &rng, 3, lq2, lk2, 2, 2, 16, 0, 0.0f, 1.0);
}

// Lengths on and around the tile edges (multiples of 64), empty sequences, and causal rows
// without keys.
static void test_edges(void) {
  test_rng_t rng = test_rng(2);
  const int lq[] = {63, 64, 65, 127, 128, 129, 200, 0, 5, 1, 257, 7, 3};
  const int lk[] = {63, 64, 65, 128, 129, 300, 130, 5, 0, 1, 257, 7, 0};
  const int B = (int)(sizeof lq / sizeof lq[0]);
  for (int causal = 0; causal <= 1; causal++) {
    char name[96];
    snprintf(name, sizeof name, "edges causal=%d H=4 H_kv=2 D=16", causal);
    run_case(name, &rng, B, lq, lk, 4, 2, 16, causal, 0.0f, 1.0);
  }
  // Peaky softmax (scores ~ +-10): the running maximum changes often across key tiles.
  run_case("edges peaky causal H=2 H_kv=1 D=80", &rng, B, lq, lk, 2, 1, 80, 1, 1.0f, 1.0);
}

// Many small random batches over D, GQA layouts, causal, scale, lq vs lk, zero lengths.
static void test_random(void) {
  test_rng_t rng = test_rng(3);
  static const int Ds[] = {1, 16, 64, 80};
  static const int heads[][2] = {{8, 2}, {8, 1}, {2, 2}, {3, 1}, {1, 1}, {6, 3}};
  for (int c = 0; c < 48; c++) {
    const int D = Ds[c % 4];
    const int H = heads[(c / 4) % 6][0], H_kv = heads[(c / 4) % 6][1];
    const int causal = (c / 2) % 2;
    const int B = (int)test_int(&rng, 1, H * D > 128 ? 4 : 10);
    int lq[10], lk[10];
    for (int b = 0; b < B; b++) {
      lk[b] = test_int(&rng, 0, 4) == 0 ? 0 : (int)test_int(&rng, 1, 150);
      const int mode = (int)test_int(&rng, 0, 2); // same length, shorter q, independent
      lq[b] = mode == 0   ? lk[b]
              : mode == 1 ? (int)test_int(&rng, 0, lk[b])
                          : (int)test_int(&rng, 0, 150);
    }
    const float scale = test_int(&rng, 0, 3) == 0 ? (float)test_uniform(&rng, 0.05, 1.0) : 0.0f;
    char name[128];
    snprintf(name, sizeof name, "random #%d B=%d H=%d H_kv=%d D=%d causal=%d scale=%g", c, B, H,
             H_kv, D, causal, (double)scale);
    run_case(name, &rng, B, lq, lk, H, H_kv, D, causal, scale, 1.0);
  }
}

// Both CPU paths against the reference on the same kinds of batch, each forced for every
// sequence: the short path (strips of LOOM_ATTN_STRIP query rows on FMA micro-kernels) and the
// FlashAttention-2 tiles. Lengths around the strip size, rows without keys (lq > lk, lk = 0),
// keys without queries, GQA. Then the default split at its limit (loom_cpu_attn_short_limit()
// keys take the short path, one more the tiles) in one batch.
static void test_paths(void) {
  test_rng_t rng = test_rng(11);
  const int lq[] = {1, 5, 6, 7, 12, 13, 100, 0, 40, 300, 17, 64};
  const int lk[] = {1, 5, 6, 7, 12, 13, 100, 9, 0, 250, 31, 65};
  const int B = (int)(sizeof lq / sizeof lq[0]);
  static const int Ds[] = {16, 64, 80};
  for (int path = 0; path < 2; path++) {
    loom_attn_short_max = path == 0 ? -1 : 1 << 30;
    for (int c = 0; c < 6; c++) {
      const int D = Ds[c % 3], causal = c / 3;
      char name[96];
      snprintf(name, sizeof name, "%s path causal=%d H=4 H_kv=2 D=%d", path ? "short" : "tiled",
               causal, D);
      run_case(name, &rng, B, lq, lk, 4, 2, D, causal, 0.0f, 1.0);
    }
  }
  loom_attn_short_max = 0;
  const int lim = loom_cpu_attn_short_limit();
  CHECK(lim == LOOM_ATTN_SHORT_MAX || lim == LOOM_ATTN_SHORT_MAX_WIDE, "default limit %d", lim);
  const int lq2[3] = {lim, lim + 1, 3};
  const int lk2[3] = {lim, lim + 1, 3};
  run_case("at the short-path limit causal H=2 H_kv=1 D=32", &rng, 3, lq2, lk2, 2, 1, 32, 1, 0.0f,
           1.0);
}

// The short path's micro-kernels at both vector widths (8, and 16 where the CPU has AVX-512) on
// the same batches: each against the reference, and the same bits from both. D = 48 and 80 and
// key counts that are odd multiples of 16 take the 16-wide kernels' 16-column tails.
static void test_widths(void) {
  const int wide = loom_cpu_attn_vector_width();
  test_rng_t rng = test_rng(12);
  const int lq[] = {1, 6, 7, 16, 17, 31, 33, 100, 250, 12, 48};
  const int lk[] = {1, 6, 7, 16, 17, 31, 33, 100, 250, 40, 48};
  const int B = (int)(sizeof lq / sizeof lq[0]);
  static const int Ds[] = {16, 48, 64, 80};
  loom_attn_short_max = 1 << 30;
  for (int c = 0; c < 8; c++) {
    const int D = Ds[c % 4], causal = c / 4;
    batch_t t;
    batch_init(&t, &rng, B, lq, lk, 4, 2, D, causal, 0.0f, 1.0);
    char name[96];
    snprintf(name, sizeof name, "8-wide kernels causal=%d H=4 H_kv=2 D=%d", causal, D);
    loom_attn_vector_width = 8;
    check_batch(name, &t);
    loom_attn_vector_width = 0;
    const loom_tensor_t *o[5] = {&t.out, &t.lse, &t.dq, &t.dk, &t.dv};
    float *first[5];
    for (int i = 0; i < 5; i++) {
      const size_t bytes = (size_t)loom_tensor_numel(o[i]) * sizeof(float);
      first[i] = malloc(bytes ? bytes : 1);
      memcpy(first[i], o[i]->data, bytes);
    }
    fill_outputs(&t, NAN);
    CHECK(loom_attention_forward(&t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, causal,
                                 0.0f) == LOOM_OK &&
              loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v, &t.out,
                                      &t.lse, &t.cu_q, &t.cu_k, causal, 0.0f) == LOOM_OK,
          "%d-wide kernels causal=%d D=%d: %s", wide, causal, D, loom_last_error(NULL));
    for (int i = 0; i < 5; i++) {
      CHECK(test_same_bits(first[i], o[i]->data, loom_tensor_numel(o[i])),
            "%d-wide kernels causal=%d D=%d: output %d differs from the 8-wide kernels' bits", wide,
            causal, D, i);
      free(first[i]);
    }
    batch_free(&t);
  }
  loom_attn_short_max = 0;
  printf("test_attention: the %d-wide kernels gave the 8-wide kernels' bits%s\n", wide,
         wide == 8 ? " (no AVX-512 here: one width only)" : "");
}

// The way padded code computes attention: pad q, k, v to (B, T, H, D) with loom_varlen_unpack,
// build each head's full T x T score matrix with a mask (padding keys, padding query rows and the
// bottom-right causal triangle at -inf), softmax in double, then pack the padded output back.
// An independent check of the packed kernel's output and LSE (tolerances as above).
static void test_padded_reference(void) {
  test_rng_t rng = test_rng(7);
  for (int c = 0; c < 6; c++) {
    const int B = 1 + (int)test_int(&rng, 0, 4), H = 4, H_kv = c % 2 ? 2 : 4, D = 32;
    const int causal = c < 4;
    int lq[5], lk[5], T = 1;
    for (int b = 0; b < B; b++) {
      lk[b] = (int)test_int(&rng, 0, c == 5 ? 1500 : 300);
      lq[b] = c % 3 == 2 ? (int)test_int(&rng, 0, lk[b]) : lk[b]; // query shards when c % 3 == 2
      T = lk[b] > T ? lk[b] : T;
    }
    batch_t t;
    batch_init(&t, &rng, B, lq, lk, H, H_kv, D, causal, 0.0f, 1.0);
    CHECK(loom_attention_forward(&t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, causal,
                                 0.0f) == LOOM_OK,
          "padded case %d: %s", c, loom_last_error(NULL));
    const int64_t qs[4] = {B, T, H, D}, ks[4] = {B, T, H_kv, D};
    loom_tensor_t pq = test_tensor(LOOM_F32, 4, qs, "pq"), pk = test_tensor(LOOM_F32, 4, ks, "pk");
    loom_tensor_t pv = test_tensor(LOOM_F32, 4, ks, "pv"), po = test_tensor(LOOM_F32, 4, qs, "po");
    loom_tensor_t packed = test_tensor(LOOM_F32, 3, t.q.shape, "packed");
    CHECK(loom_varlen_unpack(&pq, &t.q, &t.cu_q) == LOOM_OK &&
              loom_varlen_unpack(&pk, &t.k, &t.cu_k) == LOOM_OK &&
              loom_varlen_unpack(&pv, &t.v, &t.cu_k) == LOOM_OK,
          "unpack: %s", loom_last_error(NULL));
    const float *Q = pq.data, *K = pk.data, *V = pv.data;
    float *O = po.data;
    const double scale = 1.0 / sqrt((double)D);
    double *lse = malloc(sizeof(double) * (size_t)(B * T * H) + 1);
    double *row = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < H; h++) {
        const int hk = h / (H / H_kv);
        for (int i = 0; i < T; i++) {
          double m = -INFINITY, sum = 0;
          for (int j = 0; j < T; j++) { // the full padded row, masked
            int visible = i < lq[b] && j < lk[b] && (!causal || j <= i + lk[b] - lq[b]);
            double dot = 0;
            for (int d = 0; d < D; d++) {
              dot += (double)Q[((int64_t)(b * T + i) * H + h) * D + d] *
                     K[((int64_t)(b * T + j) * H_kv + hk) * D + d];
            }
            row[j] = visible ? dot * scale : -INFINITY;
            m = fmax(m, row[j]);
          }
          for (int j = 0; j < T && m > -INFINITY; j++) {
            sum += exp(row[j] - m);
          }
          lse[(b * T + i) * H + h] = m > -INFINITY ? m + log(sum) : -INFINITY;
          for (int d = 0; d < D; d++) {
            double o = 0;
            for (int j = 0; j < T && m > -INFINITY; j++) {
              o += exp(row[j] - m) / sum * V[((int64_t)(b * T + j) * H_kv + hk) * D + d];
            }
            O[((int64_t)(b * T + i) * H + h) * D + d] = (float)o;
          }
        }
      }
    }
    // Pack the padded output and LSE, then compare with the packed kernel.
    CHECK(loom_varlen_pack(&packed, &po, &t.cu_q) == LOOM_OK, "pack: %s", loom_last_error(NULL));
    const int32_t *cq = t.cu_q.data;
    double *want_out = malloc(sizeof(double) * (size_t)loom_tensor_numel(&packed) + 1);
    double *want_lse = malloc(sizeof(double) * (size_t)(t.total_q * H) + 1);
    for (int64_t i = 0; i < loom_tensor_numel(&packed); i++) {
      want_out[i] = ((const float *)packed.data)[i];
    }
    for (int b = 0; b < B; b++) {
      for (int i = 0; i < lq[b]; i++) {
        for (int h = 0; h < H; h++) {
          want_lse[(int64_t)h * t.total_q + cq[b] + i] = lse[(b * T + i) * H + h];
        }
      }
    }
    char what[64];
    snprintf(what, sizeof what, "padded reference case %d out", c);
    CHECK(test_compare(what, t.out.data, want_out, loom_tensor_numel(&t.out), OUT_ATOL, OUT_RTOL) ==
              0,
          "%s", what);
    snprintf(what, sizeof what, "padded reference case %d lse", c);
    CHECK(compare_lse(what, t.lse.data, want_lse, t.total_q * H) == 0, "%s", what);
    free(lse);
    free(row);
    free(want_out);
    free(want_lse);
    TEST_FREE(&pq, &pk, &pv, &po, &packed);
    batch_free(&t);
  }
}

// B = 0 (cu_seqlens = {0}, empty tensors) and a batch of only empty sequences.
static void test_empty(void) {
  test_rng_t rng = test_rng(4);
  run_case("B=0", &rng, 0, NULL, NULL, 4, 2, 8, 1, 0.0f, 1.0);
  const int z[3] = {0, 0, 0}, some[3] = {0, 4, 0};
  run_case("all empty", &rng, 3, z, z, 4, 2, 8, 1, 0.0f, 1.0);
  run_case("keys only", &rng, 3, z, some, 4, 2, 8, 0, 0.0f, 1.0);    // dk, dv = 0
  run_case("queries only", &rng, 3, some, z, 4, 2, 8, 0, 0.0f, 1.0); // out 0, lse -inf
}

// A NaN in one element of k, v, q or dout, on both paths, causal, in the last sequence of a
// varlen batch (bottom-right aligned when Lq < Lk; sequences within one tile and over several):
// exactly the rows and key rows whose exact result depends on it are NaN, and every other output
// stays what the same batch without the NaN gives. Query row i sees key j when
// j <= i + Lk - Lq. With a NaN in
// - key j: out, lse and dq of the rows that see j (their scores and softmax are NaN); not the
//   rows before it, which a dense tile reached as 0 * NaN (dq = dS K with dS = 0 masked);
// - value j: out and dq of the rows that see j, no lse, no dv (P dO does not read v);
// - query i: out, lse and dq of row i, dk and dv of the keys row i sees (P of row i is NaN);
// - dout i: dq of row i, dk and dv of the keys row i sees (Di and dP of row i are NaN).
// dk with a NaN key or value is not checked: every key row's dk reads a row that sees it.
typedef struct nan_case {
  const char *path, *tensor;
  int pos;                  // the NaN's row in the last sequence (of k or v, or of q or dout)
  int64_t first_q, first_k; // the last sequence's first row in q and k
  int lq, lk;
} nan_case_t;

// Whether packed query row i sees packed key row j (both in the last sequence).
static int sees(const nan_case_t *c, int64_t i, int64_t j) {
  const int64_t qi = i - c->first_q, kj = j - c->first_k;
  return qi >= 0 && qi < c->lq && kj >= 0 && kj < c->lk && kj <= qi + c->lk - c->lq;
}

// Rows [0, n) (row i: count floats, stride apart, from i * row) of got against base: a NaN
// exactly in the rows want_nan marks, the others within 1e-5 relative of base.
static void check_rows(const nan_case_t *c, const char *what, const float *got, const float *base,
                       int64_t n, int64_t row, int64_t stride, int64_t count,
                       const char *want_nan) {
  for (int64_t i = 0; i < n; i++) {
    const float *g = got + i * row, *b = base + i * row;
    int nan = 0, far = 0;
    for (int64_t e = 0; e < count; e++) {
      const float x = g[e * stride], y = b[e * stride];
      nan |= isnan(x) != 0;
      far |= !isnan(x) && !(fabsf(x - y) <= 1e-5f * (1.0f + fabsf(y)));
    }
    CHECK(nan == want_nan[i] && (nan || !far),
          "%s path, NaN in %s row %d: %s row %lld %s (want %s)", c->path, c->tensor, c->pos, what,
          (long long)i,
          nan   ? "has a NaN"
          : far ? "differs from the run without the NaN"
                : "is finite",
          want_nan[i] ? "a NaN" : "the values without the NaN");
  }
}

static void test_nan_masked(void) {
  static const char *names[4] = {"k", "v", "q", "dout"};
  static const struct {
    int B, lq[2], lk[2], pos[4]; // pos: the NaN's row for k, v, q, dout
  } shapes[] = {
      {2, {7, 40}, {7, 40}, {5, 5, 5, 5}},          // one tile
      {2, {20, 150}, {20, 150}, {100, 70, 90, 60}}, // several tiles, the NaN in a diagonal one
      {2, {5, 30}, {9, 50}, {35, 33, 8, 12}},       // bottom-right: row i sees keys <= i + 20
  };
  const int H = 2, H_kv = 1, D = 16;
  for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
    for (int path = 0; path < 2; path++) {
      for (int which = 0; which < 4; which++) {
        test_rng_t rng = test_rng(8 + sh);
        batch_t t;
        batch_init(&t, &rng, shapes[sh].B, shapes[sh].lq, shapes[sh].lk, H, H_kv, D, 1, 0.0f, 1.0);
        const int32_t *cq = t.cu_q.data, *ck = t.cu_k.data;
        const int last = shapes[sh].B - 1;
        const nan_case_t c = {
            path ? "short" : "tiled", names[which],       shapes[sh].pos[which], cq[last], ck[last],
            shapes[sh].lq[last],      shapes[sh].lk[last]};
        loom_attn_short_max = path == 0 ? -1 : 1 << 30;
        float *base[5] = {NULL};
        loom_tensor_t *outs[5] = {&t.out, &t.lse, &t.dq, &t.dk, &t.dv};
        for (int run = 0; run < 2; run++) {
          if (run == 1) { // element 3 of head 0 (k, v: the only key/value head)
            loom_tensor_t *in[4] = {&t.k, &t.v, &t.q, &t.dout};
            const int64_t first = which <= 1 ? c.first_k : c.first_q;
            const int64_t row = which <= 1 ? (int64_t)H_kv * D : (int64_t)H * D;
            ((float *)in[which]->data)[(first + c.pos) * row + 3] = NAN;
          }
          CHECK(loom_attention_forward(&t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 1, 0) ==
                    LOOM_OK,
                "%s", loom_last_error(NULL));
          CHECK(loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v, &t.out,
                                        &t.lse, &t.cu_q, &t.cu_k, 1, 0) == LOOM_OK,
                "%s", loom_last_error(NULL));
          if (run == 0) {
            for (int o = 0; o < 5; o++) {
              const int64_t n = loom_tensor_numel(outs[o]);
              base[o] = malloc(sizeof(float) * (size_t)(n ? n : 1));
              memcpy(base[o], outs[o]->data, sizeof(float) * (size_t)n);
            }
          }
        }
        loom_attn_short_max = 0;
        // The rows that must hold a NaN: want_q (out, dq), want_lse, want_k (dk, dv).
        const int64_t nq = t.total_q, nk = t.total_k;
        char *want_q = calloc((size_t)nq, 1), *want_lse = calloc((size_t)nq, 1);
        char *want_k = calloc((size_t)nk, 1);
        for (int64_t i = 0; i < nq; i++) {
          if (which <= 1) {
            want_q[i] = (char)sees(&c, i, c.first_k + c.pos);
            want_lse[i] = (char)(which == 0 && want_q[i]);
          } else {
            want_q[i] = (char)(i == c.first_q + c.pos);
            want_lse[i] = (char)(which == 2 && want_q[i]);
          }
        }
        for (int64_t j = 0; j < nk && which >= 2; j++) {
          want_k[j] = (char)sees(&c, c.first_q + c.pos, j);
        }
        const int64_t qrow = (int64_t)H * D, krow = (int64_t)H_kv * D;
        if (which != 3) { // dout does not reach the forward
          check_rows(&c, "out", t.out.data, base[0], nq, qrow, 1, qrow, want_q);
        }
        check_rows(&c, "lse", t.lse.data, base[1], nq, 1, nq, H, want_lse); // (H, total_q)
        check_rows(&c, "dq", t.dq.data, base[2], nq, qrow, 1, qrow, want_q);
        if (which >= 1) { // dk with a NaN value: every key row's dk reads a row that sees it
          check_rows(&c, "dv", t.dv.data, base[4], nk, krow, 1, krow, want_k);
        }
        if (which >= 2) {
          check_rows(&c, "dk", t.dk.data, base[3], nk, krow, 1, krow, want_k);
        }
        free(want_q);
        free(want_lse);
        free(want_k);
        for (int o = 0; o < 5; o++) {
          free(base[o]);
        }
        batch_free(&t);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Finite differences: loss = sum(out * w) with loom's own forward, against its backward.

static double fd_loss(batch_t *t, const float *w) {
  loom_status_t st = loom_attention_forward(&t->out, &t->lse, &t->q, &t->k, &t->v, &t->cu_q,
                                            &t->cu_k, t->causal, t->scale);
  CHECK(st == LOOM_OK, "fd forward: %s", loom_last_error(NULL));
  return test_dot(t->out.data, w, loom_tensor_numel(&t->out));
}

static void test_finite_differences(void) {
  for (int causal = 0; causal <= 1; causal++) {
    test_rng_t rng = test_rng(5 + (uint64_t)causal);
    const int lq[2] = {3, 6}, lk[2] = {5, 6};
    batch_t t;
    batch_init(&t, &rng, 2, lq, lk, 4, 2, 4, causal, 0.0f, 1.0);
    const float *w = t.dout.data; // dout = w: the gradient of sum(out * w)
    fd_loss(&t, w);
    loom_status_t st = loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v,
                                               &t.out, &t.lse, &t.cu_q, &t.cu_k, causal, 0.0f);
    CHECK(st == LOOM_OK, "fd backward: %s", loom_last_error(NULL));
    loom_tensor_t *inputs[3] = {&t.q, &t.k, &t.v}, *grads[3] = {&t.dq, &t.dk, &t.dv};
    for (int a = 0; a < 3; a++) {
      const int64_t n = loom_tensor_numel(inputs[a]);
      double *num = malloc((size_t)n * sizeof(double));
      float *x = inputs[a]->data;
      for (int64_t i = 0; i < n; i++) {
        const float x0 = x[i];
        x[i] = x0 + (float)FD_H;
        const double up = fd_loss(&t, w);
        x[i] = x0 - (float)FD_H;
        const double down = fd_loss(&t, w);
        x[i] = x0;
        num[i] = (up - down) / (2 * FD_H);
      }
      char what[64];
      static const char *const names[3] = {"dq", "dk", "dv"};
      snprintf(what, sizeof what, "finite differences causal=%d %s", causal, names[a]);
      CHECK(test_compare(what, grads[a]->data, num, n, FD_ATOL, FD_RTOL) == 0, "%s", what);
      free(num);
    }
    batch_free(&t);
  }
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: LOOM_ERR_INVALID_ARG (or UNSUPPORTED for a CUDA first tensor), a message that
// names the op and the argument, and untouched outputs.

#define SENTINEL 7.0f

static void expect_bad(batch_t *t, loom_status_t got, loom_status_t want, const char *op,
                       const char *needle, const char *what) {
  test_expect_fail(got, want, want, op, needle, what);
  CHECK(outputs_equal(t, SENTINEL), "%s: an output was written", what);
  fill_outputs(t, SENTINEL);
}

static loom_status_t fwd(batch_t *t, loom_tensor_t *out, loom_tensor_t *lse, loom_tensor_t *q,
                         loom_tensor_t *k, loom_tensor_t *v, loom_tensor_t *cq, loom_tensor_t *ck,
                         float scale) {
  (void)t;
  return loom_attention_forward(out, lse, q, k, v, cq, ck, 1, scale);
}

static void test_bad_args(void) {
  static const char F[] = "loom_attention_forward", Bw[] = "loom_attention_backward";
  test_rng_t rng = test_rng(7);
  const int lq[3] = {12, 0, 2}, lk[3] = {12, 3, 4};
  batch_t t;
  batch_init(&t, &rng, 3, lq, lk, 4, 2, 8, 1, 0.0f, 1.0);
  fill_outputs(&t, SENTINEL);
  int32_t *cq = t.cu_q.data, *ck = t.cu_k.data;

  // cu_seqlens values.
  cq[1] = 12;
  cq[2] = 10; // 0, 12, 10, 14
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F,
             "cu_seqlens_q[2]=10 < cu_seqlens_q[1]=12: offsets must be non-decreasing",
             "non-monotonic cu_seqlens_q");
  cq[2] = 12;
  ck[3] = 18;
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "cu_seqlens_k[3]=18, but k has 19 rows",
             "wrong last offset of cu_seqlens_k");
  ck[3] = 19;
  ck[0] = 1;
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "cu_seqlens_k[0]=1", "cu_seqlens_k not starting at 0");
  ck[0] = 0;
  CHECK(fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0) == LOOM_OK,
        "restored arguments: %s", loom_last_error(NULL));
  fill_outputs(&t, SENTINEL);

  // Shapes.
  const int64_t s_kd[3] = {19, 2, 4}, s_v[3] = {19, 1, 8}, s_h3[3] = {19, 3, 8}, s_lse[2] = {4, 13};
  const int64_t s_out[3] = {14, 4, 9}, s_cu[1] = {3}, s_q4[4] = {14, 4, 8, 1};
  loom_tensor_t kd = test_tensor(LOOM_F32, 3, s_kd, "k"), v1 = test_tensor(LOOM_F32, 3, s_v, "v");
  loom_tensor_t h3 = test_tensor(LOOM_F32, 3, s_h3, "k"),
                lse2 = test_tensor(LOOM_F32, 2, s_lse, "lse");
  loom_tensor_t out2 = test_tensor(LOOM_F32, 3, s_out, "out"),
                cu2 = test_tensor(LOOM_I32, 1, s_cu, "cu");
  loom_tensor_t q4 = test_tensor(LOOM_F32, 4, s_q4, "q");
  loom_tensor_t qbf = test_tensor(LOOM_BF16, 3, t.q.shape, "q");
  loom_tensor_t cuf = test_tensor(LOOM_F32, 1, t.cu_q.shape, "cu");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &kd, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "k is (19, 2, 4)", "k with another D");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &v1, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "v is (19, 1, 8)", "v shaped unlike k");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &h3, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "H must be a multiple of H_kv", "H % H_kv != 0");
  expect_bad(&t, fwd(&t, &t.out, &lse2, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "lse is (4, 13)", "lse of the wrong shape");
  expect_bad(&t, fwd(&t, &out2, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "out is (14, 4, 9)", "out shaped unlike q");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &cu2, 0), LOOM_ERR_INVALID_ARG,
             F, "cu_seqlens_k is (3)", "cu_seqlens_k with another B");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &q4, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "q is (14, 4, 8, 1)", "4-D q");

  // Outputs in an input's memory (in place, later key tiles would read q rows already
  // overwritten), or in each other's: refused, nothing written.
  expect_bad(&t, fwd(&t, &t.q, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0), LOOM_ERR_INVALID_ARG,
             F, "out (14, 4, 8) f32 on host overlaps q", "out in q's memory");
  {
    loom_tensor_t in_v = t.lse, in_out = t.lse;
    in_v.data = t.v.data;
    in_out.data = t.out.data;
    expect_bad(&t, fwd(&t, &t.out, &in_v, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
               LOOM_ERR_INVALID_ARG, F, "lse (4, 14) f32 on host overlaps v", "lse in v's memory");
    expect_bad(&t, fwd(&t, &t.out, &in_out, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
               LOOM_ERR_INVALID_ARG, F, "out (14, 4, 8) f32 on host overlaps lse",
               "lse in out's memory");
  }

  // NULL pointers and dtypes.
  expect_bad(&t, fwd(&t, &t.out, &t.lse, NULL, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "q is NULL", "NULL q");
  expect_bad(&t, fwd(&t, NULL, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0), LOOM_ERR_INVALID_ARG,
             F, "out is NULL", "NULL out");
  expect_bad(&t, fwd(&t, &t.out, NULL, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0), LOOM_ERR_INVALID_ARG,
             F, "lse is NULL", "NULL lse");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, NULL, &t.cu_k, 0), LOOM_ERR_INVALID_ARG,
             F, "cu_seqlens_q is NULL", "NULL cu_seqlens_q");
  void *keep = t.v.data;
  t.v.data = NULL;
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "NULL data", "v with NULL data");
  t.v.data = keep;
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &qbf, &t.k, &t.v, &t.cu_q, &t.cu_k, 0),
             LOOM_ERR_INVALID_ARG, F, "expected dtype f32", "bf16 q");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &cuf, &t.cu_k, 0), LOOM_ERR_INVALID_ARG,
             F, "expected dtype i32", "f32 cu_seqlens_q");
  expect_bad(&t, fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, NAN),
             LOOM_ERR_INVALID_ARG, F, "scale", "NaN scale");
  // out on CUDA: unsupported without the backend; with it, no device visible, or (on a GPU
  // machine) q on the host: a bad call either way, and nothing is written.
  t.out.device = 0;
  {
    loom_status_t got = fwd(&t, &t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 0);
    test_expect_fail(got, LOOM_ERR_UNSUPPORTED, LOOM_ERR_INVALID_ARG, F, "CUDA", "CUDA out");
    t.out.device = LOOM_DEVICE_HOST;
    CHECK(outputs_equal(&t, SENTINEL), "CUDA out: an output was written");
    fill_outputs(&t, SENTINEL);
  }

  // Backward: the same checks plus its own tensors.
  CHECK(loom_attention_forward(&t.out, &t.lse, &t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, 1, 0) == LOOM_OK,
        "forward: %s", loom_last_error(NULL));
  loom_tensor_t out_keep = test_tensor(LOOM_F32, 3, t.q.shape, "out"),
                lse_keep = test_tensor(LOOM_F32, 2, t.lse.shape, "lse");
  memcpy(out_keep.data, t.out.data, loom_tensor_bytes(&t.out));
  memcpy(lse_keep.data, t.lse.data, loom_tensor_bytes(&t.lse));
  fill_outputs(&t, SENTINEL);
  expect_bad(&t,
             loom_attention_backward(&t.dq, NULL, &t.dv, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "dk is NULL", "NULL dk");
  expect_bad(&t,
             loom_attention_backward(&t.dq, &t.dk, &t.dv, &out2, &t.q, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "dout is (14, 4, 9)", "dout shaped unlike q");
  expect_bad(&t,
             loom_attention_backward(&t.dq, &t.dk, &v1, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "dv is (19, 1, 8)", "dv shaped unlike k");
  expect_bad(&t,
             loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                     &lse2, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "lse is (4, 13)", "backward lse of the wrong shape");
  expect_bad(&t,
             loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &qbf, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "expected dtype f32", "backward bf16 q");
  expect_bad(&t,
             loom_attention_backward(&t.dout, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "dq (14, 4, 8) f32 on host overlaps dout",
             "dq in dout's memory");
  expect_bad(&t,
             loom_attention_backward(&t.dq, &t.dk, &t.dk, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "dk (19, 2, 8) f32 on host overlaps dv",
             "dv in dk's memory");
  // A gradient in the memory of cu_seqlens_q or _k (which the kernels read while they zero and
  // write the gradients sequence by sequence): refused like the other inputs, nothing written.
  for (int which = 0; which < 2; which++) {
    loom_tensor_t *grad = which ? &t.dk : &t.dq, *cu = which ? &t.cu_k : &t.cu_q;
    const int64_t n = loom_tensor_numel(grad), ncu = loom_tensor_numel(cu);
    float *held = malloc(sizeof(float) * (size_t)(n + ncu));
    test_fill_value(held, n + ncu, SENTINEL);
    loom_tensor_t g_view = *grad, cu_view = *cu;
    g_view.data = held;
    cu_view.data = held + n - 1; // the gradient's last element is cu's first
    memcpy(cu_view.data, cu->data, loom_tensor_bytes(cu));
    expect_bad(&t,
               loom_attention_backward(which ? &t.dq : &g_view, which ? &g_view : &t.dk, &t.dv,
                                       &t.dout, &t.q, &t.k, &t.v, &out_keep, &lse_keep,
                                       which ? &t.cu_q : &cu_view, which ? &cu_view : &t.cu_k, 1,
                                       0),
               LOOM_ERR_INVALID_ARG, Bw,
               which ? "dk (19, 2, 8) f32 on host overlaps cu_seqlens_k"
                     : "dq (14, 4, 8) f32 on host overlaps cu_seqlens_q",
               which ? "dk over cu_seqlens_k" : "dq over cu_seqlens_q");
    CHECK(test_all_equal(held, n - 1, SENTINEL) &&
              memcmp(cu_view.data, cu->data, loom_tensor_bytes(cu)) == 0,
          "%s: the refused backward wrote its gradient", which ? "dk" : "dq");
    free(held);
  }
  cq[1] = 13;
  cq[2] = 12;
  expect_bad(&t,
             loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                     &lse_keep, &t.cu_q, &t.cu_k, 1, 0),
             LOOM_ERR_INVALID_ARG, Bw, "cu_seqlens_q[2]=12 < cu_seqlens_q[1]=13",
             "backward non-monotonic cu_seqlens_q");
  cq[1] = 12;
  CHECK(loom_attention_backward(&t.dq, &t.dk, &t.dv, &t.dout, &t.q, &t.k, &t.v, &out_keep,
                                &lse_keep, &t.cu_q, &t.cu_k, 1, 0) == LOOM_OK,
        "backward with restored arguments: %s", loom_last_error(NULL));

  loom_tensor_t *extra[] = {&kd, &v1,  &h3,  &lse2,     &out2,    &cu2,
                            &q4, &qbf, &cuf, &out_keep, &lse_keep};
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    loom_tensor_free(extra[i]);
  }
  batch_free(&t);
}

// ---------------------------------------------------------------------------------------------

int main(void) {
  test_long();
  test_edges();
  test_random();
  test_paths();
  test_widths();
  test_empty();
  test_nan_masked();
  test_padded_reference();
  test_finite_differences();
  test_bad_args();
  printf("worst error / max(1, max|reference|): out %.2e, gradients %.2e\n", worst_out, worst_grad);
  return check_exit("test_attention");
}
