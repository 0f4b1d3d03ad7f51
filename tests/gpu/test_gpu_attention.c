/* test_gpu_attention.c — loom_attention_forward/backward on device 0 against the CPU backend: f32
 * and bf16, causal or not, GQA, empty and one-token documents, Lq < Lk, D = 1 .. 256. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"

// Tolerances, |got - want| <= atol + rtol |want|, with q, k, v, dout uniform in [-1, 1] and the
// CPU backend (f32 tiles, its own tests bound it against double) as the reference:
// - f32: both sides are float computations of the same sums in different orders (and exp2f
//   against the CPU's exp2 polynomial, both within ~2.5e-7): twice the CPU test's bounds
//   against double. out atol 4e-5 rtol 2e-4; lse atol 4e-5 rtol 2e-5; dq, dk, dv
//   atol 4e-5 * max(1, max|want|) rtol 2e-3 (sums with cancelling signs: the error is absolute,
//   relative to the tensor's scale).
// - bf16: the reference runs in f32 on the same bf16-rounded inputs. The device rounds P and dS
//   to bf16 before their products (relative 2^-9 each) and rounds every output to bf16 (2^-9
//   again), and its Di = rowsum(dO * O) uses the bf16 output: out atol 1e-2 rtol 2e-2; dq, dk,
//   dv atol 2e-2 * max(1, max|want|) rtol 2e-2. lse sees no bf16 rounding (scores of exact
//   bf16 products summed in f32, softmax in f32): atol 2e-4 rtol 2e-4, tight enough that one
//   key too many or too few in a row of a few hundred shows.
// Rows that see no key must give lse = -inf on both sides (and zero outputs and gradients).

static const char *kTest = "test_gpu_attention";

typedef struct tol {
  double out_atol, out_rtol, lse_atol, lse_rtol, grad_atol, grad_rtol;
} tol_t;

static const tol_t kTolF32 = {4e-5, 2e-4, 4e-5, 2e-5, 4e-5, 2e-3};
static const tol_t kTolBf16 = {1e-2, 2e-2, 2e-4, 2e-4, 2e-2, 2e-2};

// ---------------------------------------------------------------------------------------------
// Helpers

// Values uniform in [-1, 1], rounded to bf16 when bf16 (the f32 reference and the bf16 device
// inputs then hold the same numbers).
static void fill_inputs(test_rng_t *rng, loom_tensor_t *t, int bf16) {
  const int64_t n = loom_tensor_numel(t);
  float *x = test_floats(t);
  test_fill_uniform(rng, x, n, -1, 1);
  for (int64_t i = 0; bf16 && i < n; i++) {
    x[i] = loom_bf16_to_f32(loom_f32_to_bf16(x[i]));
  }
}

// A device copy of f32 host tensor h in dtype dt (f32 or bf16: exact after fill_inputs).
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

// A device tensor of dtype dt and the given shape, every element NaN: a result must overwrite it.
static loom_tensor_t device_nan(loom_dtype_t dt, int ndim, const int64_t *shape, const char *name) {
  loom_tensor_t d;
  loom_status_t st = loom_tensor_alloc(&d, dt, 0, ndim, shape, name);
  if (st == LOOM_OK) {
    st = loom_tensor_fill(&d, NAN);
  }
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: device tensor %s: %s: %s\n", name, loom_strerror(st),
            loom_last_error(NULL));
    exit(1);
  }
  return d;
}

// A host f32 copy of device tensor d (f32 or bf16).
static loom_tensor_t fetch_f32(const loom_tensor_t *d) {
  loom_tensor_t h = gpu_download(d);
  if (d->dtype == LOOM_F32) {
    return h;
  }
  loom_tensor_t f = test_tensor_f32(d->ndim, d->shape, d->name);
  loom_bf16_to_f32_n((const uint16_t *)h.data, test_floats(&f), (size_t)loom_tensor_numel(&h));
  loom_tensor_free(&h);
  return f;
}

static double max_abs(const loom_tensor_t *t) {
  const float *x = test_floats(t);
  double m = 0.0;
  for (int64_t i = 0; i < loom_tensor_numel(t); i++) {
    m = fmax(m, fabs((double)x[i]));
  }
  return m;
}

// Device tensor d against host f32 tensor want: |got - want| <= atol + rtol |want|; an infinite
// value must be matched exactly (lse = -inf of a row without keys); NaN never passes. Counts one
// CHECK failure and prints the worst element when any differs.
static void compare(const char *what, const loom_tensor_t *d, const loom_tensor_t *want,
                    double rtol, double atol) {
  loom_tensor_t h = fetch_f32(d);
  const float *g = test_floats(&h), *w = test_floats(want);
  const int64_t n = loom_tensor_numel(&h);
  int64_t bad = 0, worst = -1;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double gi = g[i], wi = w[i];
    double excess;
    if (isinf(wi) || isinf(gi)) {
      excess = gi == wi ? 0.0 : INFINITY;
    } else {
      const double err = fabs(gi - wi), tol = atol + rtol * fabs(wi);
      excess = err <= tol ? 0.0 : (isnan(err) ? INFINITY : err - tol);
    }
    if (excess > 0.0) {
      if (worst < 0 || excess > worst_excess) {
        worst = i, worst_excess = excess;
      }
      bad++;
    }
  }
  CHECK(bad == 0,
        "%s: %lld of %lld elements differ beyond rtol %g atol %g; worst [%lld] got %.9g want "
        "%.9g",
        what, (long long)bad, (long long)n, rtol, atol, (long long)worst,
        worst >= 0 ? (double)g[worst] : 0.0, worst >= 0 ? (double)w[worst] : 0.0);
  loom_tensor_free(&h);
}

// ---------------------------------------------------------------------------------------------
// One case: the same batch through the CPU backend (host tensors) and device 0.

typedef struct spec {
  loom_dtype_t dt;
  int B;
  const int *lq, *lk; // B lengths each
  int H, H_kv, D, causal;
  float scale; // <= 0: 1/sqrt(D)
} spec_t;

static void run_case(test_rng_t *rng, const spec_t *c) {
  const int bf16 = c->dt == LOOM_BF16;
  const tol_t *tol = bf16 ? &kTolBf16 : &kTolF32;
  char name[160], what[200];
  snprintf(name, sizeof name, "%s B=%d H=%d H_kv=%d D=%d causal=%d scale=%g", bf16 ? "bf16" : "f32",
           c->B, c->H, c->H_kv, c->D, c->causal, (double)c->scale);

  // Offsets and host tensors (the reference).
  const int64_t cu_shape[1] = {c->B + 1};
  loom_tensor_t cu_q = test_tensor(LOOM_I32, 1, cu_shape, "cu_seqlens_q");
  loom_tensor_t cu_k = test_tensor(LOOM_I32, 1, cu_shape, "cu_seqlens_k");
  int32_t *cq = cu_q.data, *ck = cu_k.data;
  cq[0] = ck[0] = 0;
  for (int b = 0; b < c->B; b++) {
    cq[b + 1] = cq[b] + c->lq[b];
    ck[b + 1] = ck[b] + c->lk[b];
  }
  const int64_t qs[3] = {cq[c->B], c->H, c->D}, ks[3] = {ck[c->B], c->H_kv, c->D};
  const int64_t ls[2] = {c->H, cq[c->B]};
  loom_tensor_t q = test_tensor_f32(3, qs, "q"), k = test_tensor_f32(3, ks, "k");
  loom_tensor_t v = test_tensor_f32(3, ks, "v"), dout = test_tensor_f32(3, qs, "dout");
  loom_tensor_t out = test_tensor_f32(3, qs, "out"), lse = test_tensor_f32(2, ls, "lse");
  loom_tensor_t dq = test_tensor_f32(3, qs, "dq"), dk = test_tensor_f32(3, ks, "dk");
  loom_tensor_t dv = test_tensor_f32(3, ks, "dv");
  fill_inputs(rng, &q, bf16);
  fill_inputs(rng, &k, bf16);
  fill_inputs(rng, &v, bf16);
  fill_inputs(rng, &dout, bf16);
  loom_status_t st =
      loom_attention_forward(&out, &lse, &q, &k, &v, &cu_q, &cu_k, c->causal, c->scale);
  CHECK(st == LOOM_OK, "%s: host forward: %s", name, loom_last_error(NULL));
  st = loom_attention_backward(&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse, &cu_q, &cu_k,
                               c->causal, c->scale);
  CHECK(st == LOOM_OK, "%s: host backward: %s", name, loom_last_error(NULL));

  // Device: inputs in dtype dt (offsets i32 on the device too), outputs start as NaN.
  loom_tensor_t d_cu_q = gpu_upload(&cu_q), d_cu_k = gpu_upload(&cu_k);
  loom_tensor_t d_q = upload_as(&q, c->dt), d_k = upload_as(&k, c->dt);
  loom_tensor_t d_v = upload_as(&v, c->dt), d_dout = upload_as(&dout, c->dt);
  loom_tensor_t d_out = device_nan(c->dt, 3, qs, "out"), d_lse = device_nan(LOOM_F32, 2, ls, "lse");
  loom_tensor_t d_dq = device_nan(c->dt, 3, qs, "dq"), d_dk = device_nan(c->dt, 3, ks, "dk");
  loom_tensor_t d_dv = device_nan(c->dt, 3, ks, "dv");
  st = loom_attention_forward(&d_out, &d_lse, &d_q, &d_k, &d_v, &d_cu_q, &d_cu_k, c->causal,
                              c->scale);
  CHECK(st == LOOM_OK, "%s: device forward: %s", name, loom_last_error(NULL));
  if (st == LOOM_OK) {
    snprintf(what, sizeof what, "%s: out", name);
    compare(what, &d_out, &out, tol->out_rtol, tol->out_atol);
    snprintf(what, sizeof what, "%s: lse", name);
    compare(what, &d_lse, &lse, tol->lse_rtol, tol->lse_atol);
    // The backward takes the device's own forward results, as training does.
    st = loom_attention_backward(&d_dq, &d_dk, &d_dv, &d_dout, &d_q, &d_k, &d_v, &d_out, &d_lse,
                                 &d_cu_q, &d_cu_k, c->causal, c->scale);
    CHECK(st == LOOM_OK, "%s: device backward: %s", name, loom_last_error(NULL));
  }
  if (st == LOOM_OK) {
    const struct {
      const char *n;
      const loom_tensor_t *got, *want;
    } g[3] = {{"dq", &d_dq, &dq}, {"dk", &d_dk, &dk}, {"dv", &d_dv, &dv}};
    for (int i = 0; i < 3; i++) {
      snprintf(what, sizeof what, "%s: %s", name, g[i].n);
      compare(what, g[i].got, g[i].want, tol->grad_rtol,
              tol->grad_atol * fmax(1.0, max_abs(g[i].want)));
    }
    // Determinism: a second backward gives the same bytes (no atomics; GQA sums in order).
    loom_tensor_t e_dq = device_nan(c->dt, 3, qs, "dq2"), e_dk = device_nan(c->dt, 3, ks, "dk2");
    loom_tensor_t e_dv = device_nan(c->dt, 3, ks, "dv2");
    st = loom_attention_backward(&e_dq, &e_dk, &e_dv, &d_dout, &d_q, &d_k, &d_v, &d_out, &d_lse,
                                 &d_cu_q, &d_cu_k, c->causal, c->scale);
    CHECK(st == LOOM_OK, "%s: second device backward: %s", name, loom_last_error(NULL));
    if (st == LOOM_OK) {
      loom_tensor_t a_dq = gpu_download(&d_dq), a_dk = gpu_download(&d_dk);
      loom_tensor_t a_dv = gpu_download(&d_dv);
      CHECK(gpu_same_bytes(&e_dq, &a_dq) && gpu_same_bytes(&e_dk, &a_dk) &&
                gpu_same_bytes(&e_dv, &a_dv),
            "%s: a second device backward differs", name);
      TEST_FREE(&a_dq, &a_dk, &a_dv);
    }
    TEST_FREE(&e_dq, &e_dk, &e_dv);
  }
  TEST_FREE(&cu_q, &cu_k, &q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv);
  TEST_FREE(&d_cu_q, &d_cu_k, &d_q, &d_k, &d_v, &d_dout, &d_out, &d_lse, &d_dq, &d_dk, &d_dv);
}

// ---------------------------------------------------------------------------------------------
// Cases

// Documents: one token; keys without queries; odd lengths (no multiple of a tile); a query shard
// over a longer key prefix (Lq < Lk, bottom-right); exactly one 64-row tile; queries without
// keys; Lq > Lk (causal: the first rows see no key); an empty document; several tiles.
static const int kLq[] = {1, 0, 77, 130, 64, 5, 10, 0, 200};
static const int kLk[] = {1, 4, 77, 190, 64, 0, 4, 0, 200};
#define N_DOCS ((int)(sizeof kLq / sizeof kLq[0]))

// f32 and bf16, causal or not, D = 32, 64, 128 (the bf16 tensor-core sizes), GQA H=4, H_kv=2.
static void test_mixed_documents(void) {
  test_rng_t rng = test_rng(1);
  static const int Ds[3] = {32, 64, 128};
  const loom_dtype_t dts[2] = {LOOM_F32, LOOM_BF16};
  for (int d = 0; d < 2; d++) {
    for (int causal = 0; causal <= 1; causal++) {
      for (int i = 0; i < 3; i++) {
        const spec_t c = {dts[d], N_DOCS, kLq, kLk, 4, 2, Ds[i], causal, 0.0f};
        run_case(&rng, &c);
      }
    }
  }
}

// Other head layouts and an explicit scale; head sizes of the FMA kernels (bf16 D = 16 and 80,
// f32 D = 1 and 256: tiles of 32 and 16 rows).
static void test_layouts(void) {
  test_rng_t rng = test_rng(2);
  const spec_t cases[] = {
      {LOOM_BF16, N_DOCS, kLq, kLk, 4, 1, 64, 1, 0.3f},
      {LOOM_F32, N_DOCS, kLq, kLk, 4, 1, 64, 1, 0.3f},
      {LOOM_BF16, N_DOCS, kLq, kLk, 2, 2, 128, 0, 0.0f},
      {LOOM_F32, N_DOCS, kLq, kLk, 3, 1, 32, 1, 0.0f},
      {LOOM_BF16, N_DOCS, kLq, kLk, 4, 2, 16, 1, 0.0f},
      {LOOM_BF16, N_DOCS, kLq, kLk, 2, 1, 80, 0, 0.0f},
      {LOOM_F32, N_DOCS, kLq, kLk, 2, 1, 1, 1, 0.0f},
      {LOOM_F32, N_DOCS, kLq, kLk, 2, 2, 256, 1, 0.0f},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_case(&rng, &cases[i]);
  }
}

// Longer documents (~2 M elements per tensor): many key tiles per query tile, the causal skip of
// fully masked tiles, a query shard of a long key prefix.
static void test_long(void) {
  test_rng_t rng = test_rng(3);
  static const int lq[3] = {1500, 700, 33}, lk[3] = {1500, 1000, 33};
  const spec_t cases[] = {
      {LOOM_BF16, 3, lq, lk, 4, 2, 128, 1, 0.0f},
      {LOOM_F32, 3, lq, lk, 4, 2, 128, 1, 0.0f},
      {LOOM_BF16, 3, lq, lk, 2, 1, 64, 0, 0.0f},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_case(&rng, &cases[i]);
  }
}

// No sequences (cu_seqlens = {0}, empty tensors) and only empty ones.
static void test_empty(void) {
  test_rng_t rng = test_rng(4);
  static const int z[3] = {0, 0, 0};
  const spec_t cases[] = {
      {LOOM_BF16, 0, NULL, NULL, 4, 2, 64, 1, 0.0f},
      {LOOM_F32, 3, z, z, 4, 2, 64, 1, 0.0f},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_case(&rng, &cases[i]);
  }
}

int main(void) {
  gpu_require_device(kTest);
  test_mixed_documents();
  test_layouts();
  test_long();
  test_empty();
  return check_exit(kTest);
}
