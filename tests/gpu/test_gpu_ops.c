/* test_gpu_ops.c — the CUDA compute ops (activations, layer norm, loss, embedding, residual,
 * utilities, optimizers, MoE router) against the CPU backend on the same inputs. SKIP without GPU.
 */
#include "config.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gpu_test.h"
#include "loom.h"
#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_ctx.h"     // loom_cuda_set_stream: a scheduler lane's stream, made current
#include "cuda/cuda_kernels.h" // the bf16 conversions have no public op: called directly
#endif

// Every case builds random host inputs, uploads copies to device 0, runs the public op on both
// (the host tensors take the CPU backend, the reference) and compares. Outputs start as NaN on
// both sides so that an element the device leaves unwritten shows. Tolerances, and why:
// - Bitwise where the contract promises it or one IEEE operation per element leaves no choice:
//   embedding forward (a gather) and backward (rows of one id added in ascending i), residual
//   forward and backward (one add), scale (one multiply), the bf16 conversions, the optimizers
//   ("the same float arithmetic as the CPU kernels"), MoE top-K indices (same selection on
//   probabilities that differ by a few ulp at most, on logits spaced far apart or exactly tied).
// - f32 kernels that use expf/log (softmax, cross-entropy, MoE probs): rtol 1e-5. CUDA's expf is
//   within 2 ulp, glibc's within 1; sums are in double on both sides, in different orders.
// - GELU: rtol 1e-5, atol 1e-6 (the kernel repeats the CPU's operations, so bits should match;
//   the contract only promises the semantics). atol covers gelu' cancelling for x in -5..-2.
// - Row reductions in double whose float results may round the other way once (softmax
//   backward dot, layer-norm statistics): an absolute error of one float ulp of the reduced
//   value times the element's factor, covered by atol 1e-7 .. 1e-5 as stated per case.
// - Layer-norm dweight/dbias: float sums over N rows in different orders (CPU: row by row; GPU:
//   chunks of rows, then the chunks): atol 4e-7 * N (several times the typical random-walk
//   rounding error u * sqrt(N) * |partial sum|), rtol 1e-5.
// - sumsq (through loom_norm2): doubles in different fixed orders: 1e-12 relative.

#define IGNORE (-100)

// ---------------------------------------------------------------------------------------------
// Helpers

// A host f32 tensor of uniform values in [lo, hi).
static loom_tensor_t rand_f32(test_rng_t *rng, int ndim, const int64_t *shape, const char *name,
                              double lo, double hi) {
  loom_tensor_t t = test_tensor_f32(ndim, shape, name);
  test_fill_uniform(rng, test_floats(&t), loom_tensor_numel(&t), lo, hi);
  return t;
}

// A host f32 tensor of NaN: an output that the op must overwrite.
static loom_tensor_t nan_f32(int ndim, const int64_t *shape, const char *name) {
  loom_tensor_t t = test_tensor_f32(ndim, shape, name);
  test_fill_value(test_floats(&t), loom_tensor_numel(&t), NAN);
  return t;
}

static void check_ok(loom_status_t st, const char *what, const char *side) {
  CHECK(st == LOOM_OK, "%s (%s): %s: %s", what, side, loom_strerror(st), loom_last_error(NULL));
}

// Device tensor d holds the bytes of host tensor want; the first differing element is printed.
static void check_bits(const char *what, const loom_tensor_t *d, const loom_tensor_t *want) {
  loom_tensor_t h = gpu_download(d);
  size_t size = loom_dtype_size(h.dtype), bytes = loom_tensor_bytes(&h);
  int64_t n = loom_tensor_numel(&h), first = -1, bad = 0;
  if (bytes != loom_tensor_bytes(want)) {
    CHECK(0, "%s: %zu bytes on the device, %zu on the host", what, bytes, loom_tensor_bytes(want));
    loom_tensor_free(&h);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    if (memcmp((const char *)h.data + (size_t)i * size, (const char *)want->data + (size_t)i * size,
               size) != 0) {
      bad++;
      first = first < 0 ? i : first;
    }
  }
  if (bad) {
    uint64_t g = 0, w = 0;
    memcpy(&g, (const char *)h.data + (size_t)first * size, size);
    memcpy(&w, (const char *)want->data + (size_t)first * size, size);
    double gv = h.dtype == LOOM_F32 ? (double)((const float *)h.data)[first] : (double)g;
    double wv = h.dtype == LOOM_F32 ? (double)((const float *)want->data)[first] : (double)w;
    CHECK(0,
          "%s: %lld of %lld elements differ in bits; first [%lld] got 0x%llx (%.9g) want "
          "0x%llx (%.9g)",
          what, (long long)bad, (long long)n, (long long)first, (unsigned long long)g, gv,
          (unsigned long long)w, wv);
  }
  loom_tensor_free(&h);
}

// A host i32 tensor of random targets in 0..v-1, IGNORE for about one in ignore_every (0: none).
static loom_tensor_t rand_targets(test_rng_t *rng, int64_t n, int64_t v, int ignore_every) {
  loom_tensor_t t = test_tensor(LOOM_I32, 1, &n, "targets");
  int32_t *p = t.data;
  for (int64_t i = 0; i < n; i++) {
    int ignore = v <= 0 || (ignore_every > 0 && test_int(rng, 0, ignore_every - 1) == 0);
    p[i] = ignore ? IGNORE : (int32_t)test_int(rng, 0, v - 1);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// GELU

static void gelu_case(test_rng_t *rng, int64_t n) {
  char what[64];
  snprintf(what, sizeof what, "gelu n=%lld", (long long)n);
  loom_tensor_t x = rand_f32(rng, 1, &n, "x", -12.0, 12.0);
  float *xv = test_floats(&x);
  const float special[] = {NAN,    INFINITY,  -INFINITY, 0.0f,   -0.0f, 10.0f,
                           -10.0f, -10.0001f, 10.0001f,  1e-30f, -3.5f};
  for (int64_t i = 0; i < n && i < (int64_t)(sizeof special / sizeof special[0]); i++) {
    xv[i * 7 % n] = special[i];
  }
  loom_tensor_t dout = rand_f32(rng, 1, &n, "dout", -1.0, 1.0);
  loom_tensor_t out = nan_f32(1, &n, "out"), din = nan_f32(1, &n, "din");
  loom_tensor_t dx = gpu_upload(&x), ddout = gpu_upload(&dout);
  loom_tensor_t dout_d = gpu_upload(&out), ddin = gpu_upload(&din);

  check_ok(loom_gelu_forward(&out, &x), what, "cpu");
  check_ok(loom_gelu_forward(&dout_d, &dx), what, "gpu");
  gpu_compare("gelu forward", &dout_d, &out, 1e-5, 1e-6);
  check_ok(loom_gelu_backward(&din, &x, &dout), what, "cpu");
  check_ok(loom_gelu_backward(&ddin, &dx, &ddout), what, "gpu");
  gpu_compare("gelu backward", &ddin, &din, 1e-5, 1e-6);

  // In place: din = dout (backward), then out = in (forward, which overwrites dx last).
  check_ok(loom_gelu_backward(&ddout, &dx, &ddout), what, "gpu din = dout");
  gpu_compare("gelu backward in place", &ddout, &din, 1e-5, 1e-6);
  check_ok(loom_gelu_forward(&dx, &dx), what, "gpu in place");
  gpu_compare("gelu forward in place", &dx, &out, 1e-5, 1e-6);
  TEST_FREE(&x, &dout, &out, &din, &dx, &ddout, &dout_d, &ddin);
}

// The saved-derivative pair against the CPU: deriv in place of the input, din in place of dout,
// and the fused bias gradient (CPU: one pass; GPU: the product, then loom_bias_backward).
static void gelu_deriv_case(test_rng_t *rng, int64_t M, int64_t N) {
  char what[64];
  snprintf(what, sizeof what, "gelu deriv (%lld, %lld)", (long long)M, (long long)N);
  const int64_t shape[2] = {M, N};
  loom_tensor_t x = rand_f32(rng, 2, shape, "x", -12.0, 12.0);
  loom_tensor_t dout = rand_f32(rng, 2, shape, "dout", -1.0, 1.0);
  loom_tensor_t db = rand_f32(rng, 1, &N, "db", -1.0, 1.0), out = nan_f32(2, shape, "out");
  loom_tensor_t dx = gpu_upload(&x), ddout = gpu_upload(&dout), ddb = gpu_upload(&db);
  loom_tensor_t dout_d = gpu_upload(&out);

  check_ok(loom_gelu_forward_deriv(&out, &x, &x), what, "cpu forward");
  check_ok(loom_gelu_forward_deriv(&dout_d, &dx, &dx), what, "gpu forward");
  gpu_compare("gelu forward_deriv out", &dout_d, &out, 1e-5, 1e-6);
  gpu_compare("gelu forward_deriv deriv", &dx, &x, 1e-5, 1e-6);
  check_ok(loom_gelu_backward_deriv(&dout, &db, &x, &dout), what, "cpu backward");
  check_ok(loom_gelu_backward_deriv(&ddout, &ddb, &dx, &ddout), what, "gpu backward");
  gpu_compare("gelu backward_deriv din", &ddout, &dout, 1e-5, 1e-6);
  gpu_compare("gelu backward_deriv dbias", &ddb, &db, 1e-5, 1e-5);
  TEST_FREE(&x, &dout, &db, &out, &dx, &ddout, &ddb, &dout_d);
}

// ---------------------------------------------------------------------------------------------
// Softmax

static void softmax_case(test_rng_t *rng, int64_t N, int64_t C, int special_rows) {
  char what[64];
  snprintf(what, sizeof what, "softmax (%lld, %lld)", (long long)N, (long long)C);
  int64_t shape[2] = {N, C};
  loom_tensor_t x = rand_f32(rng, 2, shape, "x", -20.0, 20.0);
  float *xv = test_floats(&x);
  if (special_rows && N >= 4 && C >= 3) {
    for (int64_t j = 0; j < C; j++) {
      xv[j] = -INFINITY;                         // row 0: no mass: zeros
      xv[C + j] = j % 2 ? -INFINITY : xv[C + j]; // row 1: some entries -inf
    }
    xv[2 * C + 1] = NAN;   // row 2: NaN everywhere
    xv[3 * C + 2] = 80.0f; // row 3: one entry dominates
  }
  if (special_rows && N >= 5 && C >= 3) {
    for (int64_t j = 0; j < C; j++) {
      xv[4 * C + j] = j == 1 ? NAN : -INFINITY; // row 4: a NaN among -inf: NaN everywhere
    }
  }
  loom_tensor_t out = nan_f32(2, shape, "out"), din = nan_f32(2, shape, "din");
  loom_tensor_t dout = rand_f32(rng, 2, shape, "dout", -1.0, 1.0);
  loom_tensor_t dx = gpu_upload(&x), dout_d = gpu_upload(&out), ddin = gpu_upload(&din);

  check_ok(loom_softmax_forward(&out, &x), what, "cpu");
  check_ok(loom_softmax_forward(&dout_d, &dx), what, "gpu");
  gpu_compare("softmax forward", &dout_d, &out, 1e-5, 1e-12);

  // The backward of the CPU's probabilities on both sides: the same inputs.
  loom_tensor_t dy = gpu_upload(&out), ddout = gpu_upload(&dout);
  check_ok(loom_softmax_backward(&din, &out, &dout), what, "cpu");
  check_ok(loom_softmax_backward(&ddin, &dy, &ddout), what, "gpu");
  gpu_compare("softmax backward", &ddin, &din, 1e-5, 1e-7);
  check_ok(loom_softmax_backward(&ddout, &dy, &ddout), what, "gpu din = dout");
  gpu_compare("softmax backward in place", &ddout, &din, 1e-5, 1e-7);

  check_ok(loom_softmax_forward(&dx, &dx), what, "gpu in place");
  gpu_compare("softmax forward in place", &dx, &out, 1e-5, 1e-12);
  TEST_FREE(&x, &out, &din, &dout, &dx, &dout_d, &ddin, &dy, &ddout);
}

// ---------------------------------------------------------------------------------------------
// Layer norm

static void layernorm_case(test_rng_t *rng, int64_t N, int64_t C, double offset) {
  char what[80];
  snprintf(what, sizeof what, "layernorm (%lld, %lld) offset %g", (long long)N, (long long)C,
           offset);
  int64_t shape[2] = {N, C};
  const float eps = 1e-5f;
  loom_tensor_t x = rand_f32(rng, 2, shape, "x", offset - 2.0, offset + 2.0);
  loom_tensor_t w = rand_f32(rng, 1, &C, "w", 0.5, 1.5), b = rand_f32(rng, 1, &C, "b", -1, 1);
  loom_tensor_t out = nan_f32(2, shape, "out"), mean = nan_f32(1, &N, "mean");
  loom_tensor_t rstd = nan_f32(1, &N, "rstd");
  loom_tensor_t dx = gpu_upload(&x), dw = gpu_upload(&w), db = gpu_upload(&b);
  loom_tensor_t dout_d = gpu_upload(&out), dmean = gpu_upload(&mean), drstd = gpu_upload(&rstd);

  check_ok(loom_layernorm_forward(&out, &mean, &rstd, &x, &w, &b, eps), what, "cpu");
  check_ok(loom_layernorm_forward(&dout_d, &dmean, &drstd, &dx, &dw, &db, eps), what, "gpu");
  gpu_compare("layernorm out", &dout_d, &out, 1e-5, 1e-6);
  gpu_compare("layernorm mean", &dmean, &mean, 1e-6, 1e-7);
  gpu_compare("layernorm rstd", &drstd, &rstd, 1e-6, 0.0);

  // Backward from the CPU's mean and rstd on both sides; dweight and dbias accumulate onto
  // random values.
  loom_tensor_t dy = rand_f32(rng, 2, shape, "dy", -1.0, 1.0), din = nan_f32(2, shape, "din");
  loom_tensor_t gw = rand_f32(rng, 1, &C, "gw", -1, 1), gb = rand_f32(rng, 1, &C, "gb", -1, 1);
  loom_tensor_t ddy = gpu_upload(&dy), ddin = gpu_upload(&din), dgw = gpu_upload(&gw);
  loom_tensor_t dgb = gpu_upload(&gb), dmean_h = gpu_upload(&mean), drstd_h = gpu_upload(&rstd);
  loom_tensor_t dgw2 = gpu_upload(&gw), dgb2 = gpu_upload(&gb);
  check_ok(loom_layernorm_backward(&din, &gw, &gb, &dy, &x, &w, &mean, &rstd), what, "cpu");
  check_ok(loom_layernorm_backward(&ddin, &dgw, &dgb, &ddy, &dx, &dw, &dmean_h, &drstd_h), what,
           "gpu");
  gpu_compare("layernorm din", &ddin, &din, 1e-5, 1e-5);
  gpu_compare("layernorm dweight", &dgw, &gw, 1e-5, 4e-7 * (double)N);
  gpu_compare("layernorm dbias", &dgb, &gb, 1e-5, 4e-7 * (double)N);
  // din = dout: the parameter gradients must still see the original dout.
  check_ok(loom_layernorm_backward(&ddy, &dgw2, &dgb2, &ddy, &dx, &dw, &dmean_h, &drstd_h), what,
           "gpu din = dout");
  gpu_compare("layernorm din in place", &ddy, &din, 1e-5, 1e-5);
  gpu_compare("layernorm dweight (din = dout)", &dgw2, &gw, 1e-5, 4e-7 * (double)N);

  // Forward in place: out = in.
  check_ok(loom_layernorm_forward(&dx, &dmean, &drstd, &dx, &dw, &db, eps), what, "gpu in place");
  gpu_compare("layernorm out in place", &dx, &out, 1e-5, 1e-6);
  TEST_FREE(&x, &w, &b, &out, &mean, &rstd, &dx, &dw, &db, &dout_d, &dmean, &drstd, &dy, &din, &gw,
            &gb, &ddy, &ddin, &dgw, &dgb, &dmean_h, &drstd_h, &dgw2, &dgb2);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

static void loss_case(test_rng_t *rng, int64_t n, int64_t v, int ignore_every) {
  char what[80];
  snprintf(what, sizeof what, "cross-entropy n=%lld v=%lld", (long long)n, (long long)v);
  int64_t shape[2] = {n, v};
  const float dloss = 1.7f;
  loom_tensor_t logits = rand_f32(rng, 2, shape, "logits", -8.0, 8.0);
  loom_tensor_t targets = rand_targets(rng, n, v, ignore_every);
  loom_tensor_t losses = nan_f32(1, &n, "losses"), dlogits = nan_f32(2, shape, "dlogits");
  loom_tensor_t dlg = gpu_upload(&logits), dtg = gpu_upload(&targets);
  loom_tensor_t dls = gpu_upload(&losses), ddl = gpu_upload(&dlogits);
  float mean = NAN, dmean = NAN;

  check_ok(loom_cross_entropy_forward(&losses, &mean, &logits, &targets, IGNORE), what, "cpu");
  check_ok(loom_cross_entropy_forward(&dls, &dmean, &dlg, &dtg, IGNORE), what, "gpu");
  gpu_compare("cross-entropy losses", &dls, &losses, 1e-5, 1e-5);
  CHECK(fabs((double)dmean - (double)mean) <= 1e-5 * fabs((double)mean) + 1e-6,
        "%s: mean loss %.9g, cpu %.9g", what, (double)dmean, (double)mean);

  int64_t valid = 0;
  for (int64_t i = 0; i < n; i++) {
    valid += ((int32_t *)targets.data)[i] != IGNORE;
  }
  double scale = valid ? (double)dloss / (double)valid : 0.0;
  check_ok(loom_cross_entropy_backward(&dlogits, &logits, &targets, IGNORE, dloss), what, "cpu");
  check_ok(loom_cross_entropy_backward(&ddl, &dlg, &dtg, IGNORE, dloss), what, "gpu");
  gpu_compare("cross-entropy dlogits", &ddl, &dlogits, 1e-5, 1e-6 * scale);
  check_ok(loom_cross_entropy_backward(&dlg, &dlg, &dtg, IGNORE, dloss), what, "gpu in place");
  gpu_compare("cross-entropy dlogits in place", &dlg, &dlogits, 1e-5, 1e-6 * scale);
  TEST_FREE(&logits, &targets, &losses, &dlogits, &dlg, &dtg, &dls, &ddl);
}

// A target outside 0..V-1 that is not ignore_index is rejected on the device too.
static void loss_bad_target(void) {
  int64_t n = 3, shape[2] = {3, 5};
  loom_tensor_t logits = test_tensor_f32(2, shape, "logits"), losses = test_tensor_f32(1, &n, "l");
  loom_tensor_t targets = test_tensor(LOOM_I32, 1, &n, "targets");
  ((int32_t *)targets.data)[0] = 1;
  ((int32_t *)targets.data)[1] = IGNORE;
  ((int32_t *)targets.data)[2] = 5;
  loom_tensor_t dlg = gpu_upload(&logits), dls = gpu_upload(&losses), dtg = gpu_upload(&targets);
  EXPECT_FAIL(loom_cross_entropy_forward(&dls, NULL, &dlg, &dtg, IGNORE),
              "loom_cross_entropy_forward", NULL);
  EXPECT_FAIL(loom_cross_entropy_backward(&dlg, &dlg, &dtg, IGNORE, 1.0f),
              "loom_cross_entropy_backward", NULL);
  TEST_FREE(&logits, &losses, &targets, &dlg, &dls, &dtg);
}

// ---------------------------------------------------------------------------------------------
// Embedding and residual

static void embedding_case(test_rng_t *rng, int64_t V, int64_t n, int64_t c) {
  char what[80];
  snprintf(what, sizeof what, "embedding V=%lld n=%lld c=%lld", (long long)V, (long long)n,
           (long long)c);
  int64_t tshape[2] = {V, c}, oshape[2] = {n, c};
  loom_tensor_t table = rand_f32(rng, 2, tshape, "table", -1, 1);
  loom_tensor_t dtable = rand_f32(rng, 2, tshape, "dtable", -1, 1);
  loom_tensor_t ids = test_tensor(LOOM_I32, 1, &n, "ids");
  for (int64_t i = 0; i < n; i++) {
    // Half of the ids from the first quarter of the vocabulary: many repeats.
    ((int32_t *)ids.data)[i] = (int32_t)test_int(rng, 0, i % 2 ? V - 1 : (V - 1) / 4);
  }
  loom_tensor_t out = nan_f32(2, oshape, "out"), dout = rand_f32(rng, 2, oshape, "dout", -1, 1);
  loom_tensor_t dtab = gpu_upload(&table), ddtab = gpu_upload(&dtable), dids = gpu_upload(&ids);
  loom_tensor_t dout_d = gpu_upload(&out), ddout = gpu_upload(&dout);

  check_ok(loom_embedding_forward(&out, &ids, &table), what, "cpu");
  check_ok(loom_embedding_forward(&dout_d, &dids, &dtab), what, "gpu");
  check_bits("embedding forward", &dout_d, &out);
  check_ok(loom_embedding_backward(&dtable, &ids, &dout), what, "cpu");
  check_ok(loom_embedding_backward(&ddtab, &dids, &ddout), what, "gpu");
  check_bits("embedding backward (rows of one id in ascending i)", &ddtab, &dtable);
  TEST_FREE(&table, &dtable, &ids, &out, &dout, &dtab, &ddtab, &dids, &dout_d, &ddout);
}

// An id outside 0..V-1 on the device is rejected (checked on a host copy) and nothing is written.
static void embedding_bad_ids(void) {
  int64_t n = 4, tshape[2] = {6, 3}, oshape[2] = {4, 3};
  loom_tensor_t table = test_tensor_f32(2, tshape, "table"), out = test_tensor_f32(2, oshape, "o");
  loom_tensor_t ids = test_tensor(LOOM_I32, 1, &n, "ids");
  loom_tensor_t dtab = gpu_upload(&table), dout = gpu_upload(&out);
  const int32_t bad[2] = {6, -1};
  for (int k = 0; k < 2; k++) {
    for (int64_t i = 0; i < n; i++) {
      ((int32_t *)ids.data)[i] = i == 2 ? bad[k] : (int32_t)i;
    }
    loom_tensor_t dids = gpu_upload(&ids);
    EXPECT_FAIL(loom_embedding_forward(&dout, &dids, &dtab), "loom_embedding_forward", NULL);
    EXPECT_FAIL(loom_embedding_backward(&dtab, &dids, &dout), "loom_embedding_backward", NULL);
    loom_tensor_free(&dids);
  }
  check_bits("embedding: table untouched by the rejected backward", &dtab, &table);
  TEST_FREE(&table, &out, &ids, &dtab, &dout);
}

static void residual_case(test_rng_t *rng, int64_t n) {
  char what[64];
  snprintf(what, sizeof what, "residual n=%lld", (long long)n);
  loom_tensor_t a = rand_f32(rng, 1, &n, "a", -1, 1), b = rand_f32(rng, 1, &n, "b", -1e3, 1e3);
  loom_tensor_t out = nan_f32(1, &n, "out"), g = rand_f32(rng, 1, &n, "g", -1, 1);
  loom_tensor_t da = gpu_upload(&a), db = gpu_upload(&b), dout_d = gpu_upload(&out);
  loom_tensor_t dg = gpu_upload(&g);

  check_ok(loom_residual_forward(&out, &a, &b), what, "cpu");
  check_ok(loom_residual_forward(&dout_d, &da, &db), what, "gpu");
  check_bits("residual forward", &dout_d, &out);
  // Backward: a += g and b += g on both sides (loom_cuda_accumulate), then one side only.
  check_ok(loom_residual_backward(&a, &b, &g), what, "cpu");
  check_ok(loom_residual_backward(&da, &db, &dg), what, "gpu");
  check_bits("residual backward da", &da, &a);
  check_bits("residual backward db", &db, &b);
  check_ok(loom_residual_backward(NULL, &b, &g), what, "cpu db only");
  check_ok(loom_residual_backward(NULL, &db, &dg), what, "gpu db only");
  check_bits("residual backward db only", &db, &b);
  // Forward in place: out = a.
  check_ok(loom_residual_forward(&a, &a, &b), what, "cpu in place");
  check_ok(loom_residual_forward(&da, &da, &db), what, "gpu in place");
  check_bits("residual forward in place", &da, &a);
  TEST_FREE(&a, &b, &out, &g, &da, &db, &dout_d, &dg);
}

// ---------------------------------------------------------------------------------------------
// Utilities

static void util_case(test_rng_t *rng, int64_t n) {
  char what[64];
  snprintf(what, sizeof what, "util n=%lld", (long long)n);
  loom_tensor_t x = rand_f32(rng, 1, &n, "x", -3, 3), y = rand_f32(rng, 1, &n, "y", -3, 3);
  loom_tensor_t dx = gpu_upload(&x), dy = gpu_upload(&y);

  check_ok(loom_scale(&x, -0.37f), what, "cpu scale");
  check_ok(loom_scale(&dx, -0.37f), what, "gpu scale");
  check_bits("scale", &dx, &x);
  // axpy: the kernel avoids FMA like the CPU, but only the semantics are promised.
  check_ok(loom_axpy(&y, 1.3f, &x), what, "cpu axpy");
  check_ok(loom_axpy(&dy, 1.3f, &dx), what, "gpu axpy");
  gpu_compare("axpy", &dy, &y, 1e-6, 1e-6);

  // norm2 of the same values on both sides (the host's y uploaded again).
  loom_tensor_t dy2 = gpu_upload(&y);
  double want = -1.0, got = -2.0;
  check_ok(loom_norm2(&y, &want), what, "cpu norm2");
  check_ok(loom_norm2(&dy2, &got), what, "gpu norm2");
  CHECK(fabs(got - want) <= 1e-12 * want, "%s: norm2 %.17g, cpu %.17g", what, got, want);
  TEST_FREE(&x, &y, &dx, &dy, &dy2);
}

// norm2 values that need the double accumulator (squares beyond f32's range) and exact sums.
static void norm2_special(void) {
  int64_t n = 5, s3[3] = {2, 3, 4};
  loom_tensor_t big = test_tensor_f32(1, &n, "big"), t3 = test_tensor_f32(3, s3, "t3");
  for (int i = 0; i < 5; i++) {
    test_floats(&big)[i] = i % 2 ? -3e30f : 4e30f;
  }
  test_fill_value(test_floats(&t3), 24, 0.5f);
  loom_tensor_t dbig = gpu_upload(&big), dt3 = gpu_upload(&t3);
  double want = 0.0, got = 0.0;
  check_ok(loom_norm2(&big, &want), "norm2 1e30", "cpu");
  check_ok(loom_norm2(&dbig, &got), "norm2 1e30", "gpu");
  CHECK(fabs(got - want) <= 1e-12 * want, "norm2 of 1e30 values: %.17g, cpu %.17g", got, want);
  check_ok(loom_norm2(&dt3, &got), "norm2 (2, 3, 4)", "gpu");
  CHECK(got == sqrt(6.0), "norm2 (2, 3, 4) of 0.5: %.17g", got);
  TEST_FREE(&big, &t3, &dbig, &dt3);
}

#ifdef LOOM_HAVE_CUDA
// f32 <-> bf16 on the device against runtime/half.c, bit for bit: random values over the whole
// exponent range, then the edges (NaN payloads, infinities, FLT_MAX, ties, subnormals, zeros).
static void bf16_case(test_rng_t *rng, int64_t n) {
  char what[64];
  snprintf(what, sizeof what, "bf16 n=%lld", (long long)n);
  loom_tensor_t f = test_tensor_f32(1, &n, "f"), h = test_tensor(LOOM_BF16, 1, &n, "h");
  loom_tensor_t back = test_tensor_f32(1, &n, "back");
  uint32_t *bits = f.data;
  const uint32_t edges[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu, 0x7F800000u,
                            0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F7F8000u, 0x7F7F7FFFu,
                            0x3F808000u, 0x3F818000u, 0x3F808001u, 0x00000001u, 0x80008000u,
                            0x00018000u, 0x00000000u, 0x80000000u, 0x007FFFFFu};
  for (int64_t i = 0; i < n; i++) {
    bits[i] = (uint32_t)test_next(rng);
  }
  for (int64_t i = 0; i < n && i < (int64_t)(sizeof edges / sizeof edges[0]); i++) {
    bits[i] = edges[i];
  }
  loom_f32_to_bf16_n(f.data, h.data, (size_t)n);
  loom_bf16_to_f32_n(h.data, back.data, (size_t)n);
  loom_tensor_t df = gpu_upload(&f), dh = gpu_upload(&h), dback = gpu_upload(&back);
  // Clear the device outputs (the uploads hold the expected values).
  check_ok(loom_tensor_fill(&dh, 0.0), what, "gpu fill");
  check_ok(loom_tensor_fill(&dback, 0.0), what, "gpu fill");
  check_ok(loom_cuda_f32_to_bf16(n, df.data, dh.data), what, "gpu f32 -> bf16");
  check_bits("f32 -> bf16", &dh, &h);
  // Back from the host's bf16 values, so that this checks the reverse conversion alone.
  loom_tensor_t dh_host = gpu_upload(&h);
  check_ok(loom_cuda_bf16_to_f32(n, dh_host.data, dback.data), what, "gpu bf16 -> f32");
  check_bits("bf16 -> f32", &dback, &back);
  TEST_FREE(&f, &h, &back, &df, &dh, &dback, &dh_host);
}
#endif

// ---------------------------------------------------------------------------------------------
// Optimizers: several steps, bitwise after each.

static void adamw_case(test_rng_t *rng, int64_t n, loom_adamw_t hp, int steps) {
  char what[96];
  snprintf(what, sizeof what, "adamw n=%lld lr %g wd %g", (long long)n, (double)hp.lr,
           (double)hp.weight_decay);
  loom_tensor_t p = rand_f32(rng, 1, &n, "p", -1, 1), m = test_tensor_f32(1, &n, "m");
  loom_tensor_t v = test_tensor_f32(1, &n, "v");
  loom_tensor_t dp = gpu_upload(&p), dm = gpu_upload(&m), dv = gpu_upload(&v);
  for (int s = 0; s < steps; s++, hp.step++) {
    loom_tensor_t g = rand_f32(rng, 1, &n, "g", -1e-2, 1e-2);
    loom_tensor_t dg = gpu_upload(&g);
    check_ok(loom_adamw_update(&p, &g, &m, &v, &hp), what, "cpu");
    check_ok(loom_adamw_update(&dp, &dg, &dm, &dv, &hp), what, "gpu");
    check_bits("adamw param", &dp, &p);
    check_bits("adamw m", &dm, &m);
    check_bits("adamw v", &dv, &v);
    TEST_FREE(&g, &dg);
  }
  TEST_FREE(&p, &m, &v, &dp, &dm, &dv);
}

static void sgd_case(test_rng_t *rng, int64_t n, loom_sgd_t hp, int with_buf, int steps) {
  char what[96];
  snprintf(what, sizeof what, "sgd n=%lld momentum %g nesterov %d buf %d", (long long)n,
           (double)hp.momentum, hp.nesterov, with_buf);
  loom_tensor_t p = rand_f32(rng, 1, &n, "p", -1, 1), b = test_tensor_f32(1, &n, "buf");
  loom_tensor_t dp = gpu_upload(&p), db = gpu_upload(&b);
  for (int s = 0; s < steps; s++) {
    loom_tensor_t g = rand_f32(rng, 1, &n, "g", -1, 1);
    loom_tensor_t dg = gpu_upload(&g);
    check_ok(loom_sgd_update(&p, &g, with_buf ? &b : NULL, &hp), what, "cpu");
    check_ok(loom_sgd_update(&dp, &dg, with_buf ? &db : NULL, &hp), what, "gpu");
    check_bits("sgd param", &dp, &p);
    check_bits("sgd buf", &db, &b);
    TEST_FREE(&g, &dg);
  }
  TEST_FREE(&p, &b, &dp, &db);
}

// ---------------------------------------------------------------------------------------------
// MoE router

// Logits whose row entries are a random permutation of distinct values 0.05 apart (probability
// ratios of at least e^0.05: no near-ties for the top-K to split differently), plus a row offset.
static loom_tensor_t router_logits(test_rng_t *rng, int64_t T, int64_t E) {
  int64_t shape[2] = {T, E};
  loom_tensor_t x = test_tensor_f32(2, shape, "logits");
  float *xv = test_floats(&x);
  for (int64_t t = 0; t < T; t++) {
    float *row = xv + t * E;
    double offset = test_uniform(rng, -3.0, 3.0);
    for (int64_t j = 0; j < E; j++) {
      row[j] = (float)(offset + 0.05 * (double)j);
    }
    for (int64_t j = E - 1; j > 0; j--) { // Fisher-Yates
      int64_t k = test_int(rng, 0, j);
      float tmp = row[j];
      row[j] = row[k];
      row[k] = tmp;
    }
  }
  return x;
}

// Rows that test the tie and NaN rules (E >= 4, T >= 6): all equal; two equal maxima; a NaN
// (the row's softmax is NaN: every key ranks as -1, so idx is 0..K-1); all -inf (zero weights);
// some -inf; one +inf (NaN again).
static void router_special_rows(float *x, int64_t T, int64_t E) {
  for (int64_t j = 0; j < E; j++) {
    x[0 * E + j] = 0.25f;
    x[1 * E + j] = (float)j * 0.1f;
    x[3 * E + j] = -INFINITY;
    x[4 * E + j] = j % 2 ? -INFINITY : (float)j;
  }
  x[1 * E + 1] = x[1 * E + 3] = 5.0f;
  x[2 * E + 2] = NAN;
  x[5 * E + 1] = INFINITY;
  (void)T;
}

static void moe_case(test_rng_t *rng, int64_t T, int64_t E, int64_t K, int special) {
  char what[80];
  snprintf(what, sizeof what, "moe T=%lld E=%lld K=%lld", (long long)T, (long long)E, (long long)K);
  int64_t se[2] = {T, E}, sk[2] = {T, K};
  loom_tensor_t logits = router_logits(rng, T, E);
  if (special) {
    router_special_rows(test_floats(&logits), T, E);
  }
  loom_tensor_t probs = nan_f32(2, se, "probs"), weight = nan_f32(2, sk, "weight");
  loom_tensor_t idx = test_tensor(LOOM_I32, 2, sk, "idx");
  loom_tensor_t dlg = gpu_upload(&logits), dprobs = gpu_upload(&probs);
  loom_tensor_t dweight = gpu_upload(&weight), didx = gpu_upload(&idx);

  check_ok(loom_moe_router_forward(&probs, &idx, &weight, &logits), what, "cpu forward");
  check_ok(loom_moe_router_forward(&dprobs, &didx, &dweight, &dlg), what, "gpu forward");
  gpu_compare("moe probs", &dprobs, &probs, 1e-5, 1e-7);
  check_bits("moe idx", &didx, &idx);
  gpu_compare("moe weight", &dweight, &weight, 1e-5, 1e-7);

  // The aux loss and the backward from the CPU's forward outputs on both sides.
  loom_tensor_t hp = gpu_upload(&probs), hidx = gpu_upload(&idx), hw = gpu_upload(&weight);
  loom_tensor_t extra = rand_f32(rng, 2, se, "extra", -1e-2, 1e-2);
  loom_tensor_t dextra = gpu_upload(&extra);
  const float coef = 0.01f;
  float aux = NAN, daux = NAN, daux2 = NAN;
  check_ok(loom_moe_aux_loss(&aux, &extra, &probs, &idx, coef), what, "cpu aux");
  check_ok(loom_moe_aux_loss(&daux, &dextra, &hp, &hidx, coef), what, "gpu aux");
  CHECK((isnan(aux) && isnan(daux)) || fabs((double)daux - (double)aux) <= 1e-6 * fabs(aux),
        "%s: aux %.9g, cpu %.9g", what, (double)daux, (double)aux);
  gpu_compare("moe aux dprobs", &dextra, &extra, 1e-6, 1e-9);
  check_ok(loom_moe_aux_loss(&daux2, NULL, &hp, &hidx, coef), what, "gpu aux without dprobs");
  CHECK(memcmp(&daux, &daux2, sizeof daux) == 0, "%s: aux %.9g without dprobs, %.9g with", what,
        (double)daux2, (double)daux);

  // Backward with and without the extra gradient, and in place (dlogits = dprobs_extra).
  loom_tensor_t dw = rand_f32(rng, 2, sk, "dw", -1, 1), ddw = gpu_upload(&dw);
  loom_tensor_t dlogits = nan_f32(2, se, "dlogits"), ddlogits = gpu_upload(&dlogits);
  check_ok(loom_moe_router_backward(&dlogits, &dw, &probs, &idx, &weight, &extra), what,
           "cpu backward");
  check_ok(loom_moe_router_backward(&ddlogits, &ddw, &hp, &hidx, &hw, &dextra), what,
           "gpu backward");
  gpu_compare("moe dlogits", &ddlogits, &dlogits, 1e-5, 1e-6);
  check_ok(loom_moe_router_backward(&dextra, &ddw, &hp, &hidx, &hw, &dextra), what,
           "gpu backward in place");
  gpu_compare("moe dlogits in place", &dextra, &dlogits, 1e-5, 1e-6);
  check_ok(loom_moe_router_backward(&dlogits, &dw, &probs, &idx, &weight, NULL), what,
           "cpu backward without extra");
  check_ok(loom_moe_router_backward(&ddlogits, &ddw, &hp, &hidx, &hw, NULL), what,
           "gpu backward without extra");
  gpu_compare("moe dlogits without extra", &ddlogits, &dlogits, 1e-5, 1e-6);
  TEST_FREE(&logits, &probs, &weight, &idx, &dlg, &dprobs, &dweight, &didx, &hp, &hidx, &hw, &extra,
            &dextra, &dw, &ddw, &dlogits, &ddlogits);
}

// ---------------------------------------------------------------------------------------------

#ifdef LOOM_HAVE_CUDA
// loom_tensor_fill and loom_tensor_copy in the current stream's order, as a scheduler lane runs
// them (a cudaStreamNonBlocking stream, which the legacy stream does not wait for): eight
// accumulating f32 GEMMs of 4096^3 (~20 ms on an H200) write c on the stream, then c is copied
// device to device at once, and the copy must see the last GEMM's values. Before the fix the copy
// ran on the legacy stream, beside the GEMMs, and train_gpt's forward read activations early.
static void stream_order_case(void) {
  const int64_t n = 4096, shape[2] = {n, n}, reps = 8;
  cudaStream_t s = NULL;
  loom_tensor_t a, b, c, dst;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  check_ok(loom_tensor_alloc(&a, LOOM_F32, 0, 2, shape, "a"), "stream order: alloc", "device");
  check_ok(loom_tensor_alloc(&b, LOOM_F32, 0, 2, shape, "b"), "stream order: alloc", "device");
  check_ok(loom_tensor_alloc(&c, LOOM_F32, 0, 2, shape, "c"), "stream order: alloc", "device");
  check_ok(loom_tensor_alloc(&dst, LOOM_F32, 0, 2, shape, "dst"), "stream order: alloc", "device");
  loom_cuda_set_stream(s);
  check_ok(loom_tensor_fill(&a, 0.5), "stream order: fill a", "device");
  check_ok(loom_tensor_fill(&b, 0.25), "stream order: fill b", "device");
  check_ok(loom_tensor_fill(&c, -1.0), "stream order: fill c", "device");
  check_ok(loom_tensor_fill(&dst, -2.0), "stream order: fill dst", "device");
  for (int r = 0; r < reps; r++) { // c = 0.125 n per product (exact), accumulated: 512 * reps
    check_ok(loom_gemm(&c, &a, 0, &b, 0, NULL, 1.0f, r ? 1.0f : 0.0f), "stream order: gemm",
             "device");
  }
  check_ok(loom_tensor_copy(&dst, &c), "stream order: copy", "device");
  loom_tensor_t h = gpu_download(&dst); // waits for the stream
  loom_cuda_set_stream(0);
  const float want = 0.125f * (float)n * (float)reps;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n * n; i++) {
    if (test_floats(&h)[i] != want) {
      bad++;
      first = first < 0 ? i : first;
    }
  }
  CHECK(bad == 0, "stream order: %lld of %lld copied values differ from %g; first [%lld] = %g",
        (long long)bad, (long long)(n * n), (double)want, (long long)first,
        first >= 0 ? (double)test_floats(&h)[first] : 0.0);
  loom_tensor_free(&h);
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  loom_tensor_free(&dst);
  cudaStreamDestroy(s);
}
#endif

int main(void) {
  gpu_require_device("test_gpu_ops");
#ifdef LOOM_HAVE_CUDA
  stream_order_case();
#endif
  test_rng_t rng = test_rng(20240611);

  const int64_t sizes[] = {0, 1, 37, 257, 1000003};
  for (int k = 0; k < 5; k++) {
    gelu_case(&rng, sizes[k]);
    gelu_deriv_case(&rng, sizes[k] > 1000 ? 977 : 3, sizes[k] > 1000 ? 1024 : sizes[k]);
    residual_case(&rng, sizes[k]);
    util_case(&rng, sizes[k]);
#ifdef LOOM_HAVE_CUDA
    bf16_case(&rng, sizes[k]);
#endif
    adamw_case(&rng, sizes[k], (loom_adamw_t){1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1}, 3);
    adamw_case(&rng, sizes[k], (loom_adamw_t){1e-1f, 0.8f, 0.99f, 1e-6f, 0.01f, 100}, 2);
    sgd_case(&rng, sizes[k], (loom_sgd_t){0.1f, 0.9f, 0.0f, 0}, 1, 3);
    sgd_case(&rng, sizes[k], (loom_sgd_t){0.05f, 0.9f, 1e-2f, 1}, 1, 3);
    sgd_case(&rng, sizes[k], (loom_sgd_t){0.1f, 0.0f, 1e-2f, 0}, 0, 2); // momentum 0, no buf
  }
  norm2_special();

  // Rows: one warp per row up to 256 columns, eight beyond; sizes on both sides of that and of
  // the block size, a vocabulary-sized row, ~1e6 elements.
  const int64_t rows[][2] = {{1, 1}, {7, 1},       {3, 37},    {5, 256},  {6, 257},
                             {4, 9}, {1000, 1003}, {2, 50257}, {33, 4097}};
  for (int k = 0; k < 9; k++) {
    softmax_case(&rng, rows[k][0], rows[k][1], rows[k][0] == 4 || rows[k][0] == 6);
    layernorm_case(&rng, rows[k][0], rows[k][1], 0.0);
  }
  layernorm_case(&rng, 2049, 769, 0.0);  // several chunks of rows in dweight/dbias
  layernorm_case(&rng, 130, 300, 100.0); // a large common offset: the double statistics matter
  // An offset whose float mean is off by 5e-4 of a spread of 1: the backward's xhat needs the
  // mean's rounding recovered (delta), on the GPU as on the CPU.
  layernorm_case(&rng, 130, 300, 1e4);

  loss_case(&rng, 1, 1, 0);
  loss_case(&rng, 5, 3, 1); // every row ignored: mean 0, zero gradient
  loss_case(&rng, 300, 129, 8);
  loss_case(&rng, 67, 50257, 4);
  loss_case(&rng, 1000, 1000, 16);
  loss_bad_target();

  embedding_case(&rng, 1, 1, 1);
  embedding_case(&rng, 7, 4099, 771); // few ids: long runs of repeats in every row
  embedding_case(&rng, 5000, 2048, 768);
  embedding_case(&rng, 300, 1000, 1);
  embedding_bad_ids();

  moe_case(&rng, 0, 4, 2, 0);
  moe_case(&rng, 1, 1, 1, 0);
  moe_case(&rng, 6, 8, 3, 1); // ties, NaN, -inf and +inf rows
  moe_case(&rng, 37, 8, 8, 0);
  moe_case(&rng, 1000, 64, 2, 0);
  moe_case(&rng, 4099, 129, 3, 0);

  return check_exit("test_gpu_ops");
}
