/* test_fusion.c — loom_fusion_allreduce of 1000 tensors of random sizes (empty ones, and some
 * larger than the threshold) equals one allreduce per tensor bitwise, with the expected buckets. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "../chunk_arg.h"
#include "../testutil.h"

// What is checked, for thresholds 1 byte (nothing fuses), 1 KiB, 64 KiB and 0 (the
// LOOM_FUSION_THRESHOLD default, or what the spec's environment sets):
// - f32 SUM, f16 AVG and i32 MAX over 1000 tensors equal an unfused loom_allreduce of each
//   tensor, bit for bit, twice in a row (the bucket buffers are reused);
// - loom_fusion_buckets equals the plan computed here: tensors packed in order until the next
//   would pass the threshold, a larger one alone, empty ones in no bucket;
// - a dtype mismatch, a NULL tensor and two tensors sharing memory are LOOM_ERR_INVALID_ARG;
// - the plan kept from the last call is not reused when the tensors change: another data
//   pointer, a shorter shape, fewer tensors, another order (results and buckets checked);
// - large buckets move in pieces with tensors straddling piece boundaries (the default
//   threshold packs everything into one bucket of several MiB).
// With --chunk N every MPI transfer goes in pieces of at most N elements (loom_mpi_set_chunk, the
// library's test hook): with N = 3 every bucket's messages split into pieces with a short last
// one, and tensors straddle piece boundaries inside the buckets. Below N = 1000 (each piece is a
// message) the first of the checks above runs on 64 tensors of at most 600 elements, and the
// kept plan's on 60 tensors of at most 70.

static int ntensors = 1000; // of run(): fewer with a small --chunk (see the top comment)

static int world_rank;

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

// Element counts of the tensors, the same on every rank: mostly small, some empty, some large
// (up to `large` elements).
static void sizes(int64_t *count, int64_t large) {
  test_rng_t rng = test_rng(2024);
  for (int i = 0; i < ntensors; i++) {
    int64_t kind = test_int(&rng, 0, 99);
    count[i] = kind < 8 ? 0 : kind < 94 ? test_int(&rng, 1, 300) : test_int(&rng, 300, large);
  }
}

// Buckets of the documented plan for the first n tensors.
static int expected_buckets_n(const int64_t *count, int n, size_t es, size_t threshold) {
  int nb = 0, open = 0;
  size_t bytes_in = 0;
  for (int i = 0; i < n; i++) {
    size_t b = (size_t)count[i] * es;
    if (b == 0) {
      continue;
    }
    if (open && bytes_in + b <= threshold && b <= threshold) {
      bytes_in += b;
      continue;
    }
    nb++;
    bytes_in = b;
    open = b <= threshold;
  }
  return nb;
}

static int expected_buckets(const int64_t *count, size_t es, size_t threshold) {
  return expected_buckets_n(count, ntensors, es, threshold);
}

static void fill_random(loom_tensor_t *t, test_rng_t *rng) {
  for (int64_t i = 0; i < loom_tensor_numel(t); i++) {
    double v = test_uniform(rng, -1.0, 1.0) * (test_int(rng, 0, 9) == 0 ? 1e6 : 1.0);
    switch (t->dtype) {
    case LOOM_F32:
      ((float *)t->data)[i] = (float)v;
      break;
    case LOOM_F16:
      ((uint16_t *)t->data)[i] = loom_f32_to_f16((float)(v / 1e3));
      break;
    default:
      ((int32_t *)t->data)[i] = (int32_t)(v * 1000);
      break;
    }
  }
}

static void copy_all(loom_tensor_t *dst, const loom_tensor_t *src) {
  for (int i = 0; i < ntensors; i++) {
    if (loom_tensor_bytes(&src[i])) {
      memcpy(dst[i].data, src[i].data, loom_tensor_bytes(&src[i]));
    }
  }
}

// One dtype and op: the unfused reference, then every threshold.
static void run(loom_ctx_t *ctx, const loom_group_t *g, loom_dtype_t dt, loom_redop_t op,
                const int64_t *count) {
  size_t def = 64u << 20;
  const char *env = getenv("LOOM_FUSION_THRESHOLD");
  if (env) {
    def = (size_t)strtoull(env, NULL, 10);
  }
  const size_t thresholds[] = {1, 1024, 65536, 0};
  loom_tensor_t *orig = calloc(ntensors, sizeof *orig), *ref = calloc(ntensors, sizeof *ref);
  loom_tensor_t *work = calloc(ntensors, sizeof *work);
  loom_tensor_t **ptrs = calloc(ntensors, sizeof *ptrs);
  test_rng_t rng = test_rng(77 + (uint64_t)world_rank);
  for (int i = 0; i < ntensors; i++) {
    char name[32];
    snprintf(name, sizeof name, "grad%d", i);
    orig[i] = test_tensor(dt, 1, &count[i], name);
    ref[i] = test_tensor(dt, 1, &count[i], name);
    work[i] = test_tensor(dt, 1, &count[i], name);
    fill_random(&orig[i], &rng);
    ptrs[i] = &work[i];
  }
  copy_all(ref, orig);
  for (int i = 0; i < ntensors; i++) {
    OK(loom_allreduce(g, &ref[i], &ref[i], op));
  }
  for (int t = 0; t < 4; t++) {
    loom_fusion_t *f = NULL;
    OK(loom_fusion_create(ctx, g, thresholds[t], &f));
    size_t thr = thresholds[t] ? thresholds[t] : def;
    int want = expected_buckets(count, loom_dtype_size(dt), thr);
    for (int rep = 0; rep < 2; rep++) {
      copy_all(work, orig);
      OK(loom_fusion_allreduce(f, ptrs, ntensors, op));
      CHECK(loom_fusion_buckets(f) == want, "%s threshold %zu: %d buckets, expected %d",
            loom_dtype_name(dt), thr, loom_fusion_buckets(f), want);
      int bad = -1;
      for (int i = 0; i < ntensors && bad < 0; i++) {
        if (loom_tensor_bytes(&ref[i]) &&
            memcmp(work[i].data, ref[i].data, loom_tensor_bytes(&ref[i])) != 0) {
          bad = i;
        }
      }
      CHECK(bad < 0, "world rank %d: %s threshold %zu call %d: tensor %d differs from unfused",
            world_rank, loom_dtype_name(dt), thr, rep, bad);
    }
    OK(loom_fusion_allreduce(f, ptrs, 0, op));
    CHECK(loom_fusion_buckets(f) == 0, "no tensors: %d buckets", loom_fusion_buckets(f));
    loom_fusion_destroy(f);
  }
  for (int i = 0; i < ntensors; i++) {
    TEST_FREE(&orig[i], &ref[i], &work[i]);
  }
  free(orig);
  free(ref);
  free(work);
  free(ptrs);
}

// ---- the kept plan ------------------------------------------------------------------------------

// loom_fusion_allreduce(f, t, n) must equal an unfused allreduce of each tensor and use the
// documented buckets. Every rank fills with the same formula (rank-dependent), so the check is
// local: element k of tensor i is (i + k) % 13 - 6 + rank (small integers: exact in any order).
static void fused_matches(loom_fusion_t *f, const loom_group_t *g, loom_tensor_t **t, int n,
                          size_t threshold, const char *what) {
  int me = loom_group_rank(g), np = loom_group_size(g);
  int64_t *count = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
  for (int i = 0; i < n; i++) {
    count[i] = loom_tensor_numel(t[i]);
    for (int64_t k = 0; k < count[i]; k++) {
      ((float *)t[i]->data)[k] = (float)((i + k) % 13 - 6 + me);
    }
  }
  OK(loom_fusion_allreduce(f, t, n, LOOM_SUM));
  int bad = -1;
  for (int i = 0; i < n && bad < 0; i++) {
    for (int64_t k = 0; k < count[i] && bad < 0; k++) {
      float want = (float)(np * ((i + k) % 13 - 6) + np * (np - 1) / 2);
      bad = ((float *)t[i]->data)[k] == want ? -1 : i;
    }
  }
  CHECK(bad < 0, "world rank %d: %s: tensor %d is wrong", world_rank, what, bad);
  int want = expected_buckets_n(count, n, sizeof(float), threshold);
  CHECK(loom_fusion_buckets(f) == want, "%s: %d buckets, expected %d", what, loom_fusion_buckets(f),
        want);
  free(count);
}

// The same fusion object called with changing tensors (N of them, 1..len elements): each change
// must be planned anew.
static void plan_changes(loom_ctx_t *ctx, const loom_group_t *g, const int N, const int len) {
  const size_t threshold = 8192;
  loom_tensor_t *ts = calloc((size_t)N + 1, sizeof *ts);
  loom_tensor_t **p = calloc((size_t)N, sizeof *p);
  for (int i = 0; i <= N; i++) {
    // 1..len elements, several per bucket; the spare ts[N] is the longest, since ts[11] borrows
    // its memory below
    int64_t c = i == N ? len : 1 + (i * 37) % len;
    ts[i] = test_tensor(LOOM_F32, 1, &c, "t");
  }
  for (int i = 0; i < N; i++) {
    p[i] = &ts[i];
  }
  loom_fusion_t *f = NULL;
  OK(loom_fusion_create(ctx, g, threshold, &f));
  fused_matches(f, g, p, N, threshold, "first call");
  fused_matches(f, g, p, N, threshold, "same tensors again");
  p[7] = &ts[N]; // another tensor (other data, other size) in the same place
  fused_matches(f, g, p, N, threshold, "one tensor replaced");
  void *data = ts[11].data; // the same tensor struct pointing at other memory
  ts[11].data = ts[N].data;
  p[7] = &ts[7];
  fused_matches(f, g, p, N, threshold, "one data pointer changed");
  ts[11].data = data;
  ts[20].shape[0] -= 1; // shorter: its last element must be left alone
  float *last = (float *)ts[20].data + ts[20].shape[0];
  *last = 12345.0f;
  fused_matches(f, g, p, N, threshold, "one shape shortened");
  CHECK(*last == 12345.0f, "element past a shortened tensor was written");
  ts[20].shape[0] += 1;
  fused_matches(f, g, p, N / 2, threshold, "fewer tensors");
  loom_tensor_t *tmp = p[0]; // another order
  p[0] = p[N - 1];
  p[N - 1] = tmp;
  fused_matches(f, g, p, N, threshold, "another order");
  fused_matches(f, g, p, N, threshold, "another order again");
  loom_fusion_destroy(f);
  for (int i = 0; i <= N; i++) {
    loom_tensor_free(&ts[i]);
  }
  free(ts);
  free(p);
}

// A call that must fail with LOOM_ERR_INVALID_ARG and a message containing needle.
static void expect_invalid(loom_status_t got, const char *needle, const char *where) {
  const char *msg = loom_last_error(NULL);
  CHECK(got == LOOM_ERR_INVALID_ARG, "%s: got %s (%s)", where, loom_strerror(got), msg);
  CHECK(strstr(msg, "loom_fusion_allreduce") && strstr(msg, needle),
        "%s: message '%s' should contain '%s'", where, msg, needle);
}

static void bad_args(loom_ctx_t *ctx, const loom_group_t *g) {
  int64_t four = 4;
  loom_tensor_t a[3];
  for (int i = 0; i < 3; i++) {
    a[i] = test_tensor(i == 2 ? LOOM_F16 : LOOM_F32, 1, &four, "a");
  }
  loom_tensor_t *p[3] = {&a[0], &a[1], &a[2]};
  loom_fusion_t *f = NULL;
  OK(loom_fusion_create(ctx, g, 1024, &f));
  expect_invalid(loom_fusion_allreduce(f, p, 3, LOOM_SUM), "tensors[2]", TEST_HERE);
  p[2] = NULL;
  expect_invalid(loom_fusion_allreduce(f, p, 3, LOOM_SUM), "tensors[2] is NULL", TEST_HERE);
  p[2] = &a[0];
  expect_invalid(loom_fusion_allreduce(f, p, 3, LOOM_SUM), "share memory", TEST_HERE);
  loom_tensor_t ints = test_tensor(LOOM_I32, 1, &four, "ints");
  loom_tensor_t *q[1] = {&ints};
  expect_invalid(loom_fusion_allreduce(f, q, 1, LOOM_AVG), "LOOM_AVG", TEST_HERE);
  expect_invalid(loom_fusion_allreduce(NULL, q, 1, LOOM_SUM), "fusion is NULL", TEST_HERE);
  expect_invalid(loom_fusion_allreduce(f, NULL, 1, LOOM_SUM), "tensors is NULL", TEST_HERE);
  loom_fusion_destroy(f);
  CHECK(loom_fusion_create(ctx, g, 0, NULL) == LOOM_ERR_INVALID_ARG, "create without an out");
  TEST_FREE(&a[0], &a[1], &a[2], &ints);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  world_rank = loom_rank(ctx);
  int64_t chunk = 0; // --chunk N: MPI transfers in pieces of at most N elements
  if (test_chunk_option("test_fusion", argc, argv, world_rank, &chunk) != 0) {
    loom_finalize(ctx);
    return 2;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  const int small = chunk > 0 && chunk < 1000; // (see the top comment)
  ntensors = small ? 64 : 1000;
  int64_t *count = malloc(sizeof(int64_t) * (size_t)ntensors);
  sizes(count, small ? 600 : 40000);
  run(ctx, g, LOOM_F32, LOOM_SUM, count);
  run(ctx, g, LOOM_F16, LOOM_AVG, count);
  run(ctx, g, LOOM_I32, LOOM_MAX, count);
  bad_args(ctx, g);
  plan_changes(ctx, g, small ? 60 : 300, small ? 70 : 700);
  free(count);

  int rc = check_exit_all("test_fusion");
  loom_finalize(ctx);
  return rc;
}
