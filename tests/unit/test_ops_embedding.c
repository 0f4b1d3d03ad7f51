/* test_ops_embedding.c — loom_embedding_* and loom_residual_* against references (random shapes,
 * repeated ids, batched ids), finite-difference gradients, guards around outputs, bad arguments. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// Tolerances:
// - embedding forward: exact (a gather copies bits).
// - embedding backward: bitwise equal to a float reference that adds rows in id order (the
//   documented deterministic order), and within atol 1e-5 + rtol 1e-5 of a double reference.
// - residual forward: exact against the float sum a[i] + b[i] (one correctly rounded add);
//   residual backward likewise exact against float accumulation.
// - finite differences of L = sum(out * w) in double through loom's forward (h = 1e-2; L is
//   linear in the inputs, so only double rounding remains): atol 1e-5, rtol 1e-5.

// ---------------------------------------------------------------------------------------------
// Embedding against references

static void embedding_case(test_rng_t *rng, int64_t vocab, int64_t c, int64_t b, int64_t t) {
  char what[96];
  snprintf(what, sizeof what, "V=%lld C=%lld ids (%lld, %lld)", (long long)vocab, (long long)c,
           (long long)b, (long long)t);
  int64_t n = b * t;
  int64_t tshape[2] = {vocab, c}, ishape[2] = {b, t}, oshape[3] = {b, t, c};
  loom_tensor_t table = test_tensor_f32(2, tshape, "table");
  loom_tensor_t dtable = test_tensor_f32(2, tshape, "dtable");
  loom_tensor_t ids = test_tensor(LOOM_I32, 2, ishape, "ids");
  loom_tensor_t out = test_tensor_f32(3, oshape, "out");
  loom_tensor_t dout = test_tensor_f32(3, oshape, "dout");
  int32_t *id = ids.data;
  test_fill_uniform(rng, test_floats(&table), vocab * c, -1, 1);
  test_fill_uniform(rng, test_floats(&dtable), vocab * c, -1, 1);
  test_fill_uniform(rng, test_floats(&out), n * c, 50, 60); // garbage: must be overwritten
  test_fill_uniform(rng, test_floats(&dout), n * c, -1, 1);
  for (int64_t i = 0; i < n; i++) {
    // Small id range half of the time: many repeats exercise the accumulation order.
    id[i] = (int32_t)test_int(rng, 0, i % 2 ? vocab - 1 : (vocab - 1) / 4);
  }

  CHECK(loom_embedding_forward(&out, &ids, &table) == LOOM_OK, "%s: %s", what,
        loom_last_error(NULL));
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; i++) {
    wrong += memcmp(test_floats(&out) + i * c, test_floats(&table) + (int64_t)id[i] * c,
                    sizeof(float) * (size_t)c) != 0;
  }
  CHECK(wrong == 0, "%s: %lld rows differ from table[ids]", what, (long long)wrong);

  // Backward: float reference in row order (bitwise) and double reference (tolerance).
  float *ref_f = malloc(sizeof(float) * (size_t)(vocab * c));
  double *ref_d = malloc(sizeof(double) * (size_t)(vocab * c));
  memcpy(ref_f, dtable.data, sizeof(float) * (size_t)(vocab * c));
  for (int64_t k = 0; k < vocab * c; k++) {
    ref_d[k] = test_floats(&dtable)[k];
  }
  for (int64_t i = 0; i < n; i++) {
    for (int64_t j = 0; j < c; j++) {
      ref_f[(int64_t)id[i] * c + j] += test_floats(&dout)[i * c + j];
      ref_d[(int64_t)id[i] * c + j] += test_floats(&dout)[i * c + j];
    }
  }
  CHECK(loom_embedding_backward(&dtable, &ids, &dout) == LOOM_OK, "%s: %s", what,
        loom_last_error(NULL));
  CHECK(!memcmp(ref_f, dtable.data, sizeof(float) * (size_t)(vocab * c)),
        "%s: dtable differs bitwise from row-order accumulation", what);
  CHECK(test_compare(what, test_floats(&dtable), ref_d, vocab * c, 1e-5, 1e-5) == 0, "%s", what);

  // Flattened ids (N) with out (N, C) work too.
  int64_t flat[1] = {n}, oflat[2] = {n, c};
  loom_tensor_t ids_flat = ids, out_flat = out;
  ids_flat.ndim = 1;
  ids_flat.shape[0] = flat[0];
  out_flat.ndim = 2;
  out_flat.shape[0] = oflat[0];
  out_flat.shape[1] = oflat[1];
  test_fill_value(test_floats(&out), n * c, NAN);
  CHECK(loom_embedding_forward(&out_flat, &ids_flat, &table) == LOOM_OK, "%s flat: %s", what,
        loom_last_error(NULL));
  wrong = 0;
  for (int64_t i = 0; i < n; i++) {
    wrong += memcmp(test_floats(&out) + i * c, test_floats(&table) + (int64_t)id[i] * c,
                    sizeof(float) * (size_t)c) != 0;
  }
  CHECK(wrong == 0, "%s flat: %lld rows differ from table[ids]", what, (long long)wrong);

  free(ref_f);
  free(ref_d);
  loom_tensor_free(&table);
  loom_tensor_free(&dtable);
  loom_tensor_free(&ids);
  loom_tensor_free(&out);
  loom_tensor_free(&dout);
}

static void test_embedding(void) {
  test_rng_t rng = test_rng(17);
  embedding_case(&rng, 1, 1, 1, 1);
  embedding_case(&rng, 1, 5, 3, 7);
  embedding_case(&rng, 13, 1, 1, 9);
  embedding_case(&rng, 50257, 8, 2, 5);
  embedding_case(&rng, 7, 33, 4, 64); // many repeats
  embedding_case(&rng, 20, 16, 0, 4); // no ids
  for (int r = 0; r < 10; r++) {
    embedding_case(&rng, test_int(&rng, 1, 200), test_int(&rng, 1, 70), test_int(&rng, 1, 4),
                   test_int(&rng, 1, 33));
  }
}

// d sum(out * w) / d table = scatter of w, by central differences through loom's forward.
static void test_embedding_fd(void) {
  const int64_t vocab = 5, c = 3, n = 7;
  int64_t tshape[2] = {vocab, c}, ishape[1] = {n}, oshape[2] = {n, c};
  loom_tensor_t table = test_tensor_f32(2, tshape, "table");
  loom_tensor_t dtable = test_tensor_f32(2, tshape, "dtable");
  loom_tensor_t ids = test_tensor(LOOM_I32, 1, ishape, "ids");
  loom_tensor_t out = test_tensor_f32(2, oshape, "out");
  loom_tensor_t w = test_tensor_f32(2, oshape, "w");
  test_rng_t rng = test_rng(29);
  test_fill_uniform(&rng, test_floats(&table), vocab * c, -1, 1);
  test_fill_uniform(&rng, test_floats(&w), n * c, -1, 1);
  static const int32_t id[7] = {2, 0, 2, 4, 2, 0, 1}; // row 3 unused: its gradient is 0
  memcpy(ids.data, id, sizeof id);
  CHECK(loom_embedding_backward(&dtable, &ids, &w) == LOOM_OK, "%s", loom_last_error(NULL));
  double fd[15];
  for (int64_t k = 0; k < vocab * c; k++) {
    float keep = test_floats(&table)[k];
    float at[2] = {keep + 1e-2f, keep - 1e-2f};
    double l[2];
    for (int s = 0; s < 2; s++) {
      test_floats(&table)[k] = at[s];
      CHECK(loom_embedding_forward(&out, &ids, &table) == LOOM_OK, "%s", loom_last_error(NULL));
      l[s] = test_dot(test_floats(&out), test_floats(&w), n * c);
    }
    test_floats(&table)[k] = keep;
    fd[k] = (l[0] - l[1]) / ((double)at[0] - (double)at[1]);
  }
  CHECK(test_compare("dtable vs finite differences", test_floats(&dtable), fd, vocab * c, 1e-5,
                     1e-5) == 0,
        "embedding finite differences");
  loom_tensor_free(&table);
  loom_tensor_free(&dtable);
  loom_tensor_free(&ids);
  loom_tensor_free(&out);
  loom_tensor_free(&w);
}

// ---------------------------------------------------------------------------------------------
// Residual

static void residual_case(test_rng_t *rng, int ndim, const int64_t *shape) {
  loom_tensor_t a = test_tensor_f32(ndim, shape, "a"), b = test_tensor_f32(ndim, shape, "b");
  loom_tensor_t out = test_tensor_f32(ndim, shape, "out"), dout = test_tensor_f32(ndim, shape, "d");
  loom_tensor_t da = test_tensor_f32(ndim, shape, "da"), db = test_tensor_f32(ndim, shape, "db");
  int64_t n = loom_tensor_numel(&a);
  test_fill_uniform(rng, test_floats(&a), n, -2, 2);
  test_fill_uniform(rng, test_floats(&b), n, -2, 2);
  test_fill_uniform(rng, test_floats(&out), n, 50, 60);
  test_fill_uniform(rng, test_floats(&dout), n, -1, 1);
  test_fill_uniform(rng, test_floats(&da), n, -1, 1);
  test_fill_uniform(rng, test_floats(&db), n, -1, 1);
  float *sum = malloc(sizeof(float) * (size_t)(n + 1)),
        *da0 = malloc(sizeof(float) * (size_t)(n + 1));
  float *db0 = malloc(sizeof(float) * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    sum[i] = test_floats(&a)[i] + test_floats(&b)[i];
    da0[i] = test_floats(&da)[i];
    db0[i] = test_floats(&db)[i];
  }
  int64_t bad = 0;
  CHECK(loom_residual_forward(&out, &a, &b) == LOOM_OK, "%s", loom_last_error(NULL));
  for (int64_t i = 0; i < n; i++) {
    bad += test_floats(&out)[i] != sum[i];
  }
  CHECK(bad == 0, "residual forward: %lld of %lld wrong", (long long)bad, (long long)n);

  CHECK(loom_residual_backward(&da, &db, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += test_floats(&da)[i] != da0[i] + test_floats(&dout)[i];
    bad += test_floats(&db)[i] != db0[i] + test_floats(&dout)[i];
  }
  CHECK(bad == 0, "residual backward: %lld wrong", (long long)bad);
  // One side NULL: the other still accumulates; both NULL is a no-op.
  CHECK(loom_residual_backward(NULL, &db, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_residual_backward(&da, NULL, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(loom_residual_backward(NULL, NULL, &dout) == LOOM_OK, "%s", loom_last_error(NULL));
  bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += test_floats(&da)[i] != (da0[i] + test_floats(&dout)[i]) + test_floats(&dout)[i];
    bad += test_floats(&db)[i] != (db0[i] + test_floats(&dout)[i]) + test_floats(&dout)[i];
  }
  CHECK(bad == 0, "residual backward with a NULL side: %lld wrong", (long long)bad);

  // out may alias a or b.
  test_copy_floats(out.data, a.data, n);
  CHECK(loom_residual_forward(&out, &out, &b) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_same_bits(out.data, sum, n), "out aliasing a");
  test_copy_floats(out.data, b.data, n);
  CHECK(loom_residual_forward(&out, &a, &out) == LOOM_OK, "%s", loom_last_error(NULL));
  CHECK(test_same_bits(out.data, sum, n), "out aliasing b");
  free(sum);
  free(da0);
  free(db0);
  TEST_FREE(&a, &b, &out, &dout, &da, &db);
}

static void test_residual(void) {
  test_rng_t rng = test_rng(41);
  int64_t s1[1] = {1}, s2[2] = {3, 7}, s3[3] = {2, 5, 129}, s4[1] = {100003}, s0[2] = {0, 4};
  residual_case(&rng, 1, s1);
  residual_case(&rng, 2, s2);
  residual_case(&rng, 3, s3);
  residual_case(&rng, 1, s4);
  residual_case(&rng, 2, s0);
}

// d sum(w * (a + b)) / da = d / db = w, by central differences through loom's forward.
static void test_residual_fd(void) {
  int64_t shape[2] = {3, 5};
  const int64_t n = 15;
  loom_tensor_t a = test_tensor_f32(2, shape, "a"), b = test_tensor_f32(2, shape, "b");
  loom_tensor_t out = test_tensor_f32(2, shape, "out"), w = test_tensor_f32(2, shape, "w");
  loom_tensor_t da = test_tensor_f32(2, shape, "da"), db = test_tensor_f32(2, shape, "db");
  test_rng_t rng = test_rng(43);
  test_fill_uniform(&rng, test_floats(&a), n, -0.5, 0.5);
  test_fill_uniform(&rng, test_floats(&b), n, -0.5, 0.5);
  test_fill_uniform(&rng, test_floats(&w), n, -1, 1);
  CHECK(loom_residual_backward(&da, &db, &w) == LOOM_OK, "%s", loom_last_error(NULL));
  loom_tensor_t *inputs[2] = {&a, &b}, *grads[2] = {&da, &db};
  for (int which = 0; which < 2; which++) {
    double fd[15];
    float *x = test_floats(inputs[which]);
    for (int64_t k = 0; k < n; k++) {
      float keep = x[k];
      float at[2] = {keep + 1e-2f, keep - 1e-2f};
      double l[2];
      for (int s = 0; s < 2; s++) {
        x[k] = at[s];
        CHECK(loom_residual_forward(&out, &a, &b) == LOOM_OK, "%s", loom_last_error(NULL));
        l[s] = test_dot(test_floats(&out), test_floats(&w), n);
      }
      x[k] = keep;
      fd[k] = (l[0] - l[1]) / ((double)at[0] - (double)at[1]);
    }
    // a + b rounds in float: the two rounding errors of the perturbed element add up to at
    // most one ulp of |a + b| < 1.01, i.e. 2^-23, over 2h = 0.02: 6e-6, times |w| <= 1.
    CHECK(test_compare(which ? "db vs finite differences" : "da vs finite differences",
                       test_floats(grads[which]), fd, n, 1e-5, 1e-5) == 0,
          "residual finite differences");
  }
  TEST_FREE(&a, &b, &out, &w, &da, &db);
}

// ---------------------------------------------------------------------------------------------
// Guards: each op writes exactly its output. Every tensor is wrapped inside sentinels
// (test_guarded_f32) that must survive the call; the ids use the first and the last table row,
// where a row offset off by one would write before or past dtable.

static void guards_case(test_rng_t *rng, int64_t vocab, int64_t c, int64_t n) {
  int64_t tshape[2] = {vocab, c}, oshape[2] = {n, c};
  test_guarded_t table = test_guarded_f32(2, tshape, "table");
  test_guarded_t dtable = test_guarded_f32(2, tshape, "dtable");
  test_guarded_t out = test_guarded_f32(2, oshape, "out"), dout = test_guarded_f32(2, oshape, "d");
  test_guarded_t b = test_guarded_f32(2, oshape, "b"), da = test_guarded_f32(2, oshape, "da");
  test_guarded_t db = test_guarded_f32(2, oshape, "db");
  const test_guarded_t *all[] = {&table, &dtable, &out, &dout, &b, &da, &db};
  loom_tensor_t ids = test_tensor(LOOM_I32, 1, &n, "ids");
  int32_t *id = ids.data;
  for (int64_t i = 0; i < n; i++) {
    id[i] = i % 3 == 0   ? 0
            : i % 3 == 1 ? (int32_t)(vocab - 1)
                         : (int32_t)test_int(rng, 0, vocab - 1);
  }
  test_fill_uniform(rng, test_floats(&table.t), vocab * c, -1, 1);
  test_fill_uniform(rng, test_floats(&dtable.t), vocab * c, -1, 1);
  test_fill_uniform(rng, test_floats(&dout.t), n * c, -1, 1);
  test_fill_uniform(rng, test_floats(&b.t), n * c, -1, 1);
  test_fill_uniform(rng, test_floats(&da.t), n * c, -1, 1);
  test_fill_uniform(rng, test_floats(&db.t), n * c, -1, 1);
  const char *ops[4] = {"embedding forward", "embedding backward", "residual forward",
                        "residual backward"};
  for (int op = 0; op < 4; op++) {
    loom_status_t st = op == 0   ? loom_embedding_forward(&out.t, &ids, &table.t)
                       : op == 1 ? loom_embedding_backward(&dtable.t, &ids, &dout.t)
                       : op == 2 ? loom_residual_forward(&out.t, &dout.t, &b.t)
                                 : loom_residual_backward(&da.t, &db.t, &dout.t);
    CHECK(st == LOOM_OK, "%s: %s", ops[op], loom_last_error(NULL));
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
      CHECK(test_guards_intact(all[i]), "%s V=%lld C=%lld N=%lld: wrote outside %s", ops[op],
            (long long)vocab, (long long)c, (long long)n, all[i]->t.name);
    }
  }
  test_guarded_free(&table);
  test_guarded_free(&dtable);
  test_guarded_free(&out);
  test_guarded_free(&dout);
  test_guarded_free(&b);
  test_guarded_free(&da);
  test_guarded_free(&db);
  loom_tensor_free(&ids);
}

static void test_guards(void) {
  test_rng_t rng = test_rng(53);
  guards_case(&rng, 1, 1, 1);
  guards_case(&rng, 2, 1, 5);
  guards_case(&rng, 11, 5, 7);
  guards_case(&rng, 40, 33, 64);
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: LOOM_ERR_INVALID_ARG, a message, and nothing written.

static void test_bad_args(void) {
  static const char ef[] = "loom_embedding_forward", eb[] = "loom_embedding_backward";
  static const char rf[] = "loom_residual_forward", rb[] = "loom_residual_backward";
  int64_t tshape[2] = {6, 4}, t3[3] = {2, 3, 4}, ishape[1] = {5}, oshape[2] = {5, 4};
  int64_t o_wrong[2] = {5, 3}, o_rows[2] = {4, 4};
  loom_tensor_t table = test_tensor_f32(2, tshape, "table");
  loom_tensor_t table3 = test_tensor_f32(3, t3, "table3");
  loom_tensor_t table16 = test_tensor(LOOM_F16, 2, tshape, "table16");
  loom_tensor_t ids = test_tensor(LOOM_I32, 1, ishape, "ids");
  loom_tensor_t ids_f = test_tensor_f32(1, ishape, "ids_f");
  loom_tensor_t ids64 = test_tensor(LOOM_I64, 1, ishape, "ids64");
  loom_tensor_t out = test_tensor_f32(2, oshape, "out");
  loom_tensor_t out_c = test_tensor_f32(2, o_wrong, "out_c");
  loom_tensor_t out_n = test_tensor_f32(2, o_rows, "out_n");
  loom_tensor_t a = test_tensor_f32(2, oshape, "a"), b = test_tensor_f32(2, o_wrong, "b");
  loom_tensor_t flat = test_tensor_f32(1, ishape, "flat");
  test_rng_t rng = test_rng(47);
  test_fill_uniform(&rng, test_floats(&table), 24, -1, 1);
  test_fill_uniform(&rng, test_floats(&a), 20, -1, 1);
  for (int i = 0; i < 20; i++) {
    test_floats(&out)[i] = 42.0f;
  }
  float table0[24];
  memcpy(table0, table.data, sizeof table0);
  int32_t *id = ids.data;
  for (int i = 0; i < 5; i++) {
    id[i] = i;
  }

  loom_error_clear();
  test_expect_fail(loom_embedding_forward(NULL, &ids, &table), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "NULL out");
  test_expect_fail(loom_embedding_forward(&out, NULL, &table), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "NULL ids");
  test_expect_fail(loom_embedding_forward(&out, &ids, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "NULL table");
  test_expect_fail(loom_embedding_forward(&out, &ids_f, &table), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "f32 ids");
  test_expect_fail(loom_embedding_forward(&out, &ids64, &table), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "i64 ids");
  test_expect_fail(loom_embedding_forward(&out, &ids, &table16), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "f16 table");
  test_expect_fail(loom_embedding_forward(&out, &ids, &table3), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "3-d table");
  test_expect_fail(loom_embedding_forward(&out_c, &ids, &table), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "out with the wrong C");
  test_expect_fail(loom_embedding_forward(&out_n, &ids, &table), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "out with the wrong N");
  int32_t bad_ids[] = {6, -1, 1 << 30, INT32_MIN};
  for (int k = 0; k < 4; k++) {
    id[4] = bad_ids[k]; // the last id: earlier rows would have been written
    test_expect_fail(loom_embedding_forward(&out, &ids, &table), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, ef, NULL, "id out of range");
    test_expect_fail(loom_embedding_backward(&table, &ids, &a), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, eb, NULL, "id out of range");
  }
  id[4] = 4;
  test_expect_fail(loom_embedding_backward(NULL, &ids, &a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, eb, NULL, "NULL dtable");
  test_expect_fail(loom_embedding_backward(&table, &ids, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, eb, NULL, "NULL dout");
  test_expect_fail(loom_embedding_backward(&table, &ids_f, &a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, eb, NULL, "f32 ids");
  test_expect_fail(loom_embedding_backward(&table, &ids, &b), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, eb, NULL, "dout with the wrong C");
  test_expect_fail(loom_embedding_backward(&table, &ids, &out_n), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, eb, NULL, "dout with the wrong N");
  // Rows in the table's own memory: the row copies would overlap (memcpy) and the scatter would
  // add to rows it still reads.
  {
    loom_tensor_t out_in = out, dout_in = a;
    out_in.data = test_floats(&table) + 2; // 5 x 4 floats from the middle of table row 0
    dout_in.data = test_floats(&table) + 4;
    test_expect_fail(loom_embedding_forward(&out_in, &ids, &table), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, ef, "out (5, 4) f32 on host overlaps table",
                     "out inside table");
    test_expect_fail(loom_embedding_backward(&table, &ids, &dout_in), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, eb, "dtable (6, 4) f32 on host overlaps dout",
                     "dout inside dtable");
  }
  loom_tensor_t on_gpu = out;
  on_gpu.device = 0;
  // Without CUDA: unsupported; with CUDA: no device visible, or table on the host.
  test_expect_fail(loom_embedding_forward(&on_gpu, &ids, &table), LOOM_ERR_UNSUPPORTED,
                   LOOM_ERR_INVALID_ARG, ef, NULL, "CUDA out");

  test_expect_fail(loom_residual_forward(NULL, &a, &a), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   rf, NULL, "NULL out");
  test_expect_fail(loom_residual_forward(&out, NULL, &a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rf, NULL, "NULL a");
  test_expect_fail(loom_residual_forward(&out, &a, &b), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   rf, NULL, "b (5, 3)");
  test_expect_fail(loom_residual_forward(&out, &flat, &a), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rf, NULL, "a with another shape");
  test_expect_fail(loom_residual_forward(&out, &a, &ids_f), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rf, NULL, "b (5)");
  test_expect_fail(loom_residual_backward(&a, &b, &out), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   rb, NULL, "db (5, 3)");
  test_expect_fail(loom_residual_backward(&table, NULL, &out), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rb, NULL, "da (6, 4)");
  test_expect_fail(loom_residual_backward(&a, NULL, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rb, NULL, "NULL dout");
  test_expect_fail(loom_residual_backward(NULL, NULL, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rb, NULL, "all NULL");
  test_expect_fail(loom_residual_backward(&out, NULL, &out), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, rb, NULL, "da is dout");
  // Part of one buffer: out (or db) one row ahead of a (or dout) would overwrite the rows it
  // still has to read.
  {
    int64_t shape6[2] = {6, 4};
    loom_tensor_t both = test_tensor_f32(2, shape6, "both");
    test_fill_uniform(&rng, test_floats(&both), 24, -1, 1);
    float both0[24];
    memcpy(both0, both.data, sizeof both0);
    loom_tensor_t lo = a, hi = out;
    lo.data = both.data;
    hi.data = test_floats(&both) + 4;
    test_expect_fail(loom_residual_forward(&hi, &lo, &a), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, rf, "out (5, 4) f32 on host partially overlaps a",
                     "out one row past a");
    test_expect_fail(loom_residual_forward(&lo, &a, &hi), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, rf, "out (5, 4) f32 on host partially overlaps b",
                     "out one row before b");
    test_expect_fail(loom_residual_backward(NULL, &hi, &lo), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, rb, "db (5, 4) f32 on host overlaps dout",
                     "db one row past dout");
    CHECK(!memcmp(both0, both.data, sizeof both0), "a shared buffer written by a failed call");
    TEST_FREE(&both);
  }

  for (int i = 0; i < 20; i++) {
    CHECK(test_floats(&out)[i] == 42.0f, "out[%d] written by a failed call", i);
  }
  CHECK(!memcmp(table0, table.data, sizeof table0), "table written by a failed call");
  TEST_FREE(&table, &table3, &table16, &ids, &ids_f, &ids64, &out, &out_c, &out_n, &a, &b, &flat);
}

int main(void) {
  test_embedding();
  test_embedding_fd();
  test_residual();
  test_residual_fd();
  test_guards();
  test_bad_args();
  return check_exit("test_ops_embedding");
}
