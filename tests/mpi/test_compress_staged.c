/* test_compress_staged.c — loom_icompressed_allreduce_staged under mpirun with host stages: the
 * deferred start (tags at the call, encode once the copy landed) gives the host path's bits. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "../testutil.h"
#include "compress_internal.h" // loom_host_stage_fail_copies (the library's test hook)

// What is checked, at the np of the spec (and its LOOM_COMPRESS_CHUNK), on host tensors through
// host stages (the same request as for a CUDA tensor, with memcpy for the copies):
// - every compressor (powersgd included) and scheme, SUM and AVG, over three steps with error
//   feedback: the staged result, the residual, powersgd's warm-started Q and bytes_sent equal,
//   bit for bit, loom_icompressed_allreduce on a copy of the same tensor with its own loom_ef_t;
//   the blocking form likewise;
// - several in flight on one group, mixed with host compressed allreduces and a plain
//   loom_iallreduce, completed in reverse order: every result equals its blocking reference;
// - a stage serves call after call (one at a time), and a tensor smaller than the stage; the
//   staged tensor sits inside sentinels that the copy back must leave alone;
// - errors before anything is posted: a NULL group, compressor, tensor, stage or req, a bad
//   scheme or op, an f16 tensor, a tensor larger than the stage (by one value, too), a stage made
//   for another device;
//   stages for a device this process cannot use (LOOM_ERR_UNSUPPORTED in a build without CUDA), a
//   negative size, a NULL out;
// - a copy to the host that fails on the last rank (the test hook), blocking and non-blocking,
//   divisible and indivisible, and under hierarchical and powersgd, with error feedback: that
//   rank gets the copy's error, every other rank LOOM_ERR_CORRUPT (nobody waits), no tensor
//   changes nor the failing rank's residual (under hierarchical and powersgd no rank's), and the
//   next call on the same stage gives the host path's bits.

static int world_rank, world_size;

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

static const char *const specs[] = {"none",         "fp16",   "bf16",     "int8",      "int8:sr",
                                    "randomk:0.25", "efsign", "topk:0.1", "powersgd:2"};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

static void input(float *x, int64_t n, int step, int salt) {
  test_rng_t rng =
      test_rng(7000u + 31u * (uint64_t)world_rank + 977u * (uint64_t)step + 13u * (uint64_t)salt);
  test_fill_uniform(&rng, x, n, -2.0, 2.0);
}

static int same_bits(const float *a, const float *b, int64_t n) {
  return n == 0 || memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

// An f32 host tensor of rows x cols named name (rows 0: 1-d of cols values).
static loom_tensor_t make(int64_t rows, int64_t cols, const char *name) {
  loom_tensor_t t;
  int64_t shape[2] = {rows, cols};
  OK(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, rows ? 2 : 1, rows ? shape : shape + 1,
                       name));
  return t;
}

// The residual (or, for powersgd, the warm-started Q) of name in ef, as entry bits: 1 when both
// tables hold the same entries for name.
static int same_state(const loom_ef_t *a, const loom_ef_t *b, const char *name) {
  for (int table = 0; table < 2; table++) {
    const int na = table ? loom_ef_state_count(a) : loom_ef_count(a);
    const int nb = table ? loom_ef_state_count(b) : loom_ef_count(b);
    if (na != nb) {
      return 0;
    }
    for (int i = 0; i < na; i++) {
      const char *ka = NULL, *kb = NULL;
      const float *da = NULL, *db = NULL;
      int64_t la = 0, lb = 0;
      if ((table ? loom_ef_state_entry(a, i, &ka, &da, &la) : loom_ef_entry(a, i, &ka, &da, &la)) !=
              LOOM_OK ||
          (table ? loom_ef_state_entry(b, i, &kb, &db, &lb) : loom_ef_entry(b, i, &kb, &db, &lb)) !=
              LOOM_OK) {
        return 0;
      }
      if (strcmp(ka, kb) || la != lb || (strcmp(ka, name) == 0 && !same_bits(da, db, la))) {
        return 0;
      }
    }
  }
  return 1;
}

// Every compressor and scheme, SUM and AVG, three steps with error feedback, non-blocking and
// blocking: the staged path equals the host path bitwise.
static void check_equal(const loom_group_t *g, loom_host_stage_t *stage, int64_t rows,
                        int64_t cols) {
  const int64_t n = rows ? rows * cols : cols;
  for (int k = 0; k < NSPECS; k++) {
    loom_compressor_t *c = NULL;
    OK(loom_compressor_create(specs[k], &c));
    for (int s = 0; s < LOOM_SCHEME_COUNT; s++) {
      for (int blocking = 0; blocking < 2; blocking++) {
        const loom_redop_t op = (s + blocking) % 2 ? LOOM_AVG : LOOM_SUM;
        loom_ef_t *ef_a = NULL, *ef_b = NULL;
        OK(loom_ef_create(&ef_a));
        OK(loom_ef_create(&ef_b));
        // The staged tensor sits inside sentinels: the copy back writes exactly its values.
        int64_t shape[2] = {rows, cols};
        test_guarded_t ga = test_guarded_f32(rows ? 2 : 1, rows ? shape : shape + 1, "grad.w");
        loom_tensor_t a = ga.t, b = make(rows, cols, "grad.w");
        for (int step = 0; step < 3; step++) {
          input(a.data, n, step, k);
          memcpy(b.data, a.data, (size_t)n * sizeof(float));
          size_t sent_a = 1, sent_b = 2;
          loom_request_t *ra = NULL, *rb = NULL;
          if (blocking) {
            OK(loom_compressed_allreduce_staged(g, c, (loom_scheme_t)s, ef_a, &a, stage, op,
                                                (uint64_t)step, &sent_a));
            OK(loom_compressed_allreduce(g, c, (loom_scheme_t)s, ef_b, &b, op, (uint64_t)step,
                                         &sent_b));
          } else {
            OK(loom_icompressed_allreduce_staged(g, c, (loom_scheme_t)s, ef_a, &a, stage, op,
                                                 (uint64_t)step, &sent_a, &ra));
            OK(loom_icompressed_allreduce(g, c, (loom_scheme_t)s, ef_b, &b, op, (uint64_t)step,
                                          &sent_b, &rb));
            CHECK(ra != NULL, "%s %s: a staged call always returns a request", specs[k],
                  loom_scheme_name((loom_scheme_t)s));
            OK(loom_wait(&ra));
            OK(loom_wait(&rb));
          }
          CHECK(same_bits(a.data, b.data, n), "%s %s %s step %d %s: staged result differs",
                specs[k], loom_scheme_name((loom_scheme_t)s), op == LOOM_AVG ? "avg" : "sum", step,
                blocking ? "blocking" : "non-blocking");
          CHECK(test_guards_intact(&ga), "%s %s step %d: the staged call wrote outside the tensor",
                specs[k], loom_scheme_name((loom_scheme_t)s), step);
          CHECK(sent_a == sent_b, "%s %s: bytes sent %zu staged, %zu host", specs[k],
                loom_scheme_name((loom_scheme_t)s), sent_a, sent_b);
          CHECK(same_state(ef_a, ef_b, "grad.w"), "%s %s step %d: error-feedback state differs",
                specs[k], loom_scheme_name((loom_scheme_t)s), step);
        }
        test_guarded_free(&ga);
        loom_tensor_free(&b);
        loom_ef_destroy(ef_a);
        loom_ef_destroy(ef_b);
      }
    }
    loom_compressor_destroy(c);
  }
}

// Several in flight on one group (started in the same order everywhere, completed in reverse):
// staged int8 divisible, host fp16 indivisible, a plain allreduce, staged efsign indivisible.
static void check_in_flight(const loom_group_t *g, loom_host_stage_t *s1, loom_host_stage_t *s2) {
  enum { N = 777 };
  loom_compressor_t *i8 = NULL, *f16 = NULL, *sign = NULL;
  OK(loom_compressor_create("int8", &i8));
  OK(loom_compressor_create("fp16", &f16));
  OK(loom_compressor_create("efsign", &sign));
  loom_ef_t *ef = NULL, *ref_ef = NULL;
  OK(loom_ef_create(&ef));
  OK(loom_ef_create(&ref_ef));
  loom_tensor_t t[4], ref[4];
  static const char *const names[4] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; i++) {
    t[i] = make(0, N - 100 * i, names[i]);
    ref[i] = make(0, N - 100 * i, names[i]);
    input(t[i].data, loom_tensor_numel(&t[i]), 9, i);
    memcpy(ref[i].data, t[i].data, loom_tensor_bytes(&t[i]));
  }
  loom_request_t *r[4] = {NULL, NULL, NULL, NULL};
  OK(loom_icompressed_allreduce_staged(g, i8, LOOM_SCHEME_DIVISIBLE, ef, &t[0], s1, LOOM_AVG, 5,
                                       NULL, &r[0]));
  OK(loom_icompressed_allreduce(g, f16, LOOM_SCHEME_INDIVISIBLE, ef, &t[1], LOOM_SUM, 5, NULL,
                                &r[1]));
  OK(loom_iallreduce(g, &t[2], &t[2], LOOM_AVG, &r[2]));
  OK(loom_icompressed_allreduce_staged(g, sign, LOOM_SCHEME_INDIVISIBLE, ef, &t[3], s2, LOOM_SUM, 5,
                                       NULL, &r[3]));
  for (int i = 3; i >= 0; i--) {
    OK(loom_wait(&r[i]));
  }
  OK(loom_compressed_allreduce(g, i8, LOOM_SCHEME_DIVISIBLE, ref_ef, &ref[0], LOOM_AVG, 5, NULL));
  OK(loom_compressed_allreduce(g, f16, LOOM_SCHEME_INDIVISIBLE, ref_ef, &ref[1], LOOM_SUM, 5,
                               NULL));
  OK(loom_allreduce(g, &ref[2], &ref[2], LOOM_AVG));
  OK(loom_compressed_allreduce(g, sign, LOOM_SCHEME_INDIVISIBLE, ref_ef, &ref[3], LOOM_SUM, 5,
                               NULL));
  for (int i = 0; i < 4; i++) {
    CHECK(same_bits(t[i].data, ref[i].data, loom_tensor_numel(&t[i])),
          "in flight: tensor %s differs from its blocking reference", names[i]);
    loom_tensor_free(&t[i]);
    loom_tensor_free(&ref[i]);
  }
  loom_ef_destroy(ef);
  loom_ef_destroy(ref_ef);
  loom_compressor_destroy(i8);
  loom_compressor_destroy(f16);
  loom_compressor_destroy(sign);
}

// Calls that fail before anything is posted (the same on every rank), and bad stages.
static void check_errors(const loom_group_t *g, loom_host_stage_t *stage, int64_t stage_cap) {
  loom_compressor_t *c = NULL;
  OK(loom_compressor_create("int8", &c));
  loom_request_t *r = NULL;
  size_t sent = 7;
  loom_tensor_t big = make(0, 5000, "big"), half;
  int64_t n = 8;
  OK(loom_tensor_alloc(&half, LOOM_F16, LOOM_DEVICE_HOST, 1, &n, "half"));
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, NULL, stage, LOOM_SUM,
                                          0, &sent, &r) == LOOM_ERR_INVALID_ARG &&
            sent == 0 && r == NULL,
        "a NULL tensor is refused: %s", loom_last_error(NULL));
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &big, NULL, LOOM_SUM,
                                          0, NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a NULL stage is refused");
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &big, stage, LOOM_SUM,
                                          0, NULL, NULL) == LOOM_ERR_INVALID_ARG,
        "a NULL req is refused");
  loom_tensor_t small = make(0, 8, "small");
  CHECK(loom_icompressed_allreduce_staged(NULL, c, LOOM_SCHEME_DIVISIBLE, NULL, &small, stage,
                                          LOOM_SUM, 0, NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a NULL group is refused");
  CHECK(loom_icompressed_allreduce_staged(g, NULL, LOOM_SCHEME_DIVISIBLE, NULL, &small, stage,
                                          LOOM_SUM, 0, NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a NULL compressor is refused");
  CHECK(loom_icompressed_allreduce_staged(g, c, (loom_scheme_t)7, NULL, &small, stage, LOOM_SUM, 0,
                                          NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a bad scheme is refused");
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &small, stage,
                                          LOOM_MAX, 0, NULL, &r) == LOOM_ERR_INVALID_ARG,
        "an op other than sum and avg is refused");
  loom_tensor_free(&small);
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &half, stage, LOOM_SUM,
                                          0, NULL, &r) == LOOM_ERR_UNSUPPORTED,
        "an f16 tensor is refused");
  loom_status_t st = loom_compressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &big,
                                                      stage, LOOM_SUM, 0, NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "stage holds"),
        "a tensor larger than the stage is refused: %s", loom_last_error(NULL));
  // One value more than the stage holds is refused too (the stage would overflow by one).
  loom_tensor_t over = make(0, stage_cap + 1, "over");
  st = loom_compressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &over, stage, LOOM_SUM,
                                        0, NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "stage holds"),
        "a tensor of the stage's size + 1 is refused: %s", loom_last_error(NULL));
  loom_tensor_free(&over);
  loom_tensor_t dev = big; // claims a CUDA device: the stage is a host one
  dev.device = 0;
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &dev, stage, LOOM_SUM,
                                          0, NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a tensor on another device than the stage is refused");
  loom_host_stage_t *s = NULL;
  CHECK(loom_host_stage_create(LOOM_DEVICE_HOST, -1, &s) == LOOM_ERR_INVALID_ARG && !s,
        "a negative size is refused");
  CHECK(loom_host_stage_create(LOOM_DEVICE_HOST, 4, NULL) == LOOM_ERR_INVALID_ARG,
        "a NULL out is refused");
  if (loom_cuda_device_count() == 0) {
    st = loom_host_stage_create(0, 16, &s);
#ifdef LOOM_HAVE_CUDA
    CHECK(st == LOOM_ERR_INVALID_ARG && !s, "no GPU visible: device 0 is refused: %s",
          loom_last_error(NULL));
#else
    CHECK(st == LOOM_ERR_UNSUPPORTED && !s && strstr(loom_last_error(NULL), "without CUDA"),
          "a build without CUDA refuses a CUDA stage: %s", loom_last_error(NULL));
#endif
  }
  OK(loom_host_stage_create(LOOM_DEVICE_HOST, 0, &s)); // an empty stage serves empty tensors
  loom_tensor_t empty = make(0, 0, "empty");
  OK(loom_compressed_allreduce_staged(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &empty, s, LOOM_SUM, 0,
                                      NULL));
  loom_host_stage_destroy(s);
  loom_host_stage_destroy(NULL);
  loom_tensor_free(&empty);
  loom_tensor_free(&big);
  loom_tensor_free(&half);
  loom_compressor_destroy(c);
}

// The last rank's copy to the host fails (the stage's test hook): every rank still completes.
// Variants 0-3: int8, (indivisible, divisible) x (blocking, not); 4, 5: int8 hierarchical and
// powersgd:2 (they run in the call, after the ranks agree that every copy landed), blocking.
static void check_copy_failure(const loom_group_t *g, loom_host_stage_t *stage) {
  loom_compressor_t *int8 = NULL, *psgd = NULL;
  OK(loom_compressor_create("int8", &int8));
  OK(loom_compressor_create("powersgd:2", &psgd));
  const int64_t n = 1000;
  const int failing = world_size - 1;
  for (int variant = 0; variant < 6; variant++) {
    static const loom_scheme_t schemes[6] = {LOOM_SCHEME_INDIVISIBLE,  LOOM_SCHEME_DIVISIBLE,
                                             LOOM_SCHEME_INDIVISIBLE,  LOOM_SCHEME_DIVISIBLE,
                                             LOOM_SCHEME_HIERARCHICAL, LOOM_SCHEME_DIVISIBLE};
    const loom_scheme_t scheme = schemes[variant];
    const loom_compressor_t *c = variant == 5 ? psgd : int8;
    const int nonblocking = variant == 2 || variant == 3, in_call = variant >= 4;
    const int64_t rows = variant == 5 ? 25 : 0, cols = variant == 5 ? 40 : n; // powersgd: a matrix
    loom_ef_t *ef = NULL, *ref_ef = NULL;
    OK(loom_ef_create(&ef));
    OK(loom_ef_create(&ref_ef));
    loom_tensor_t t = make(rows, cols, "grad.fail"), ref = make(rows, cols, "grad.fail"),
                  keep = make(rows, cols, "k");
    // A first call gives both tables a residual, so that "untouched" means something.
    input(t.data, n, 0, variant);
    memcpy(ref.data, t.data, (size_t)n * sizeof(float));
    OK(loom_compressed_allreduce_staged(g, c, scheme, ef, &t, stage, LOOM_SUM, 3, NULL));
    OK(loom_compressed_allreduce(g, c, scheme, ref_ef, &ref, LOOM_SUM, 3, NULL));
    input(t.data, n, 1, variant);
    memcpy(keep.data, t.data, (size_t)n * sizeof(float));
    if (world_rank == failing) {
      loom_host_stage_fail_copies(stage, 1);
    }
    loom_status_t st;
    size_t sent = 0;
    if (nonblocking) {
      loom_request_t *r = NULL;
      st = loom_icompressed_allreduce_staged(g, c, scheme, ef, &t, stage, LOOM_SUM, 4, &sent, &r);
      CHECK(st == LOOM_OK && r, "variant %d: the call with a failed copy returns %s: %s", variant,
            loom_strerror(st), loom_last_error(NULL));
      st = r ? loom_wait(&r) : st;
    } else {
      st = loom_compressed_allreduce_staged(g, c, scheme, ef, &t, stage, LOOM_SUM, 4, &sent);
    }
    if (world_rank == failing) {
      CHECK(st == LOOM_ERR_CUDA && strstr(loom_last_error(NULL), "injected"),
            "variant %d: the failing rank got %s: %s", variant, loom_strerror(st),
            loom_last_error(NULL));
    } else {
      CHECK(st == LOOM_ERR_CORRUPT && strstr(loom_last_error(NULL), "could not encode"),
            "variant %d: rank %d got %s: %s (want CORRUPT: a peer could not encode)", variant,
            world_rank, loom_strerror(st), loom_last_error(NULL));
    }
    char named[48]; // the failing rank's number, not only the words
    snprintf(named, sizeof named, "world rank %d failed", failing);
    CHECK(!in_call || world_rank == failing || strstr(loom_last_error(NULL), named),
          "variant %d: the message should name the failing rank (%s): %s", variant, named,
          loom_last_error(NULL));
    CHECK(same_bits(t.data, keep.data, n), "variant %d: a failed call changed the tensor", variant);
    // The failing rank encoded nothing; under a flat scheme its peers encoded (their residuals
    // moved, as in any flat allreduce that a peer's error ends) before the failed blocks arrived;
    // hierarchical and powersgd stop on every rank before anything is encoded.
    CHECK((world_rank != failing && !in_call) || same_state(ef, ref_ef, "grad.fail"),
          "variant %d: the failed copy changed rank %d's residual", variant, world_rank);
    // The same stage and group go on: the next call (fresh error feedback on both sides, as
    // powersgd needs one) equals the host path.
    loom_ef_t *ef2 = NULL, *ref_ef2 = NULL;
    OK(loom_ef_create(&ef2));
    OK(loom_ef_create(&ref_ef2));
    memcpy(ref.data, t.data, (size_t)n * sizeof(float));
    OK(loom_compressed_allreduce_staged(g, c, scheme, ef2, &t, stage, LOOM_SUM, 5, NULL));
    OK(loom_compressed_allreduce(g, c, scheme, ref_ef2, &ref, LOOM_SUM, 5, NULL));
    CHECK(same_bits(t.data, ref.data, n),
          "variant %d: the call after the failure differs from the host path", variant);
    loom_tensor_free(&t);
    loom_tensor_free(&ref);
    loom_tensor_free(&keep);
    loom_ef_destroy(ef);
    loom_ef_destroy(ref_ef);
    loom_ef_destroy(ef2);
    loom_ef_destroy(ref_ef2);
  }
  loom_compressor_destroy(int8);
  loom_compressor_destroy(psgd);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  world_rank = loom_group_rank(g);
  world_size = loom_group_size(g);
  loom_host_stage_t *s1 = NULL, *s2 = NULL;
  OK(loom_host_stage_create(LOOM_DEVICE_HOST, 4099, &s1));
  OK(loom_host_stage_create(LOOM_DEVICE_HOST, 1000, &s2));
  check_equal(g, s1, 0, 4099); // 1-d, the stage's full size
  check_equal(g, s1, 24, 40);  // a matrix (powersgd's view), smaller than the stage
  check_equal(g, s2, 0, 5);
  check_in_flight(g, s1, s2);
  check_errors(g, s2, 1000);
  check_copy_failure(g, s2);
  loom_host_stage_destroy(s1);
  loom_host_stage_destroy(s2);
  if (world_rank == 0 && check_failures == 0) {
    printf("test_compress_staged: np %d: staged compressed allreduces equal the host path\n",
           world_size);
  }
  int rc = check_exit_all("test_compress_staged");
  loom_finalize(ctx);
  return rc;
}
