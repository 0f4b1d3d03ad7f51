/* test_compress.c — loom_compressed_allreduce under mpirun: every compressor and scheme equals
 * the decode-and-sum of the payloads computed here, bit for bit, identical on every rank. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "../chunk_arg.h"
#include "../testutil.h"
#include "compress_internal.h" // the shard seeds and int8:sr's per-rank encode seeds

// What is checked, at the np of the spec, for sizes 0, 1, 5, 3 np + 1, 1000 and 4099:
// - indivisible: the result is, bitwise, the rank-order sum of decode(encode(x_r)) where x_r is
//   rank r's input (each rank regenerates every rank's input), for every payload compressor
//   (int8:sr: rank r encodes with its own salted seed);
// - divisible: the result is, bitwise, decode(encode(sum_r decode(encode(x_r[shard])))) per
//   shard, with the shard's seed (and int8:sr's encode seeds salted by rank and stage:
//   loom_compress_encode_seed);
// - hierarchical: the node sums (rank order) compressed among the node leaders, decoded and
//   summed in node order (LOOM_NODE_SIZE from the spec's environment);
// - LOOM_AVG is the sum divided by np; bytes_sent is 0 at np 1 and smaller than what the same
//   scheme sends uncompressed (`none`);
// - error feedback over three steps, indivisible and divisible: the residual equals
//   y - decode(encode(y)), y = x + the previous residual, and the result is that of every
//   rank's y (each rank regenerates every rank's inputs and residuals);
// - loom_icompressed_allreduce with two calls in flight equals the blocking calls bitwise;
// - powersgd at full rank reproduces the exact sum, at rank 1 on rank-1 inputs too, and needs ef
//   and a matrix view whose sides fit the BLAS's int;
// - with --chunk N, all of it with MPI messages of at most N bytes (loom_mpi_set_chunk, the
//   library's test hook): payload gathers and all-to-alls go point to point, in pieces;
//   a step of zeros or of non-finite values does not stop the next ones from being exact;
// - errors: an f16 tensor, an unnamed tensor with ef, a bad op.
// With LOOM_COMPRESS_CHUNK set small in the spec, the flat schemes cut tensors into pipelined
// chunks, chunk k encoded on its own with seed + k: the expected values are computed so too.

static int world_rank, world_size;

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

static const char *const specs[] = {"none",    "fp16",     "bf16",         "int8",
                                    "int8:sr", "topk:0.1", "randomk:0.25", "efsign"};
#define NSPECS ((int)(sizeof specs / sizeof specs[0]))

// Rank r's input for a call, reproducible on every rank.
static void input(float *x, int64_t n, int r, int step) {
  test_rng_t rng = test_rng(1000u + 17u * (uint64_t)r + 131u * (uint64_t)step);
  test_fill_uniform(&rng, x, n, -2.0, 2.0);
}

// acc += decode(encode(x)) with the public codec: encoded with eseed (the encoding rank's seed),
// decoded with seed.
static void roundtrip_add(const loom_compressor_t *c, const float *x, int64_t n, uint64_t eseed,
                          uint64_t seed, float *acc) {
  size_t cap = loom_compressor_max_bytes(c, n), bytes = 0;
  void *p = malloc(cap ? cap : 1);
  OK(loom_compressor_encode(c, x, n, eseed, p, cap, &bytes));
  OK(loom_compressor_decode_add(c, p, bytes, n, seed, acc));
  free(p);
}

// Values per pipelined chunk of c by the rule of loom_compress.h: LOOM_COMPRESS_CHUNK bytes of
// f32 (default 4 MiB; 0: the whole tensor), top-k never cut.
static int64_t chunk_values(const loom_compressor_t *c, int64_t n) {
  const char *e = getenv("LOOM_COMPRESS_CHUNK");
  long long bytes = e ? atoll(e) : 4LL << 20;
  int64_t v = bytes > 0 && strncmp(loom_compressor_name(c), "topk", 4) != 0 ? bytes / 4 : n;
  return v < n ? v : (n > 0 ? n : 1);
}

// acc += decode(encode(x)) chunk by chunk, as the flat schemes cut x (chunk k with seed + k)
// when rank encodes it.
static void roundtrip_chunks(const loom_compressor_t *c, const float *x, int64_t n, uint64_t seed,
                             int rank, float *acc) {
  const int64_t chunk = chunk_values(c, n);
  for (int64_t lo = 0, k = 0; lo < n || (n == 0 && k == 0); lo += chunk, k++) {
    int64_t len = n - lo < chunk ? n - lo : chunk;
    const uint64_t ks = seed + (uint64_t)k;
    roundtrip_add(c, x + lo, len, loom_compress_encode_seed(c, ks, rank, 0), ks, acc + lo);
  }
}

// 1 when every rank holds the same n floats.
static int same_everywhere(const loom_group_t *g, const float *x, int64_t n) {
  int np = loom_group_size(g);
  float *all = malloc(sizeof(float) * (size_t)(n * np + 1));
  MPI_Allgather(x, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, loom_group_comm(g));
  int same = 1;
  for (int r = 1; r < np; r++) {
    same &= memcmp(all, all + (int64_t)r * n, sizeof(float) * (size_t)n) == 0;
  }
  free(all);
  return same;
}

static void shard_range(int64_t n, int np, int i, int64_t *lo, int64_t *len) {
  int64_t base = n / np, extra = n % np;
  *lo = i * base + (i < extra ? i : extra);
  *len = base + (i < extra);
}

static void test_scheme(const loom_group_t *g, const char *spec, loom_scheme_t scheme, int64_t n,
                        int node_size) {
  const int np = loom_group_size(g), me = loom_group_rank(g);
  loom_compressor_t *c = NULL;
  OK(loom_compressor_create(spec, &c));
  const uint64_t seed = 77;
  loom_tensor_t t = test_tensor_f32(1, &n, "grad");
  float *x = test_floats(&t);
  input(x, n, me, 0);
  float *want = calloc((size_t)n + 1, sizeof(float)), *xr = malloc(sizeof(float) * (size_t)(n + 1));
  size_t sent = 123;
  OK(loom_compressed_allreduce(g, c, scheme, NULL, &t, LOOM_SUM, seed, &sent));
  if (scheme == LOOM_SCHEME_INDIVISIBLE) {
    for (int r = 0; r < np; r++) {
      input(xr, n, r, 0);
      roundtrip_chunks(c, xr, n, seed, r, want);
    }
  } else if (scheme == LOOM_SCHEME_DIVISIBLE) {
    const int64_t chunk = chunk_values(c, n);
    for (int64_t clo = 0, k = 0; clo < n; clo += chunk, k++) {
      int64_t clen = n - clo < chunk ? n - clo : chunk;
      for (int i = 0; i < np; i++) {
        int64_t lo, len;
        shard_range(clen, np, i, &lo, &len);
        lo += clo;
        const uint64_t ss = loom_compress_shard_seed(seed + (uint64_t)k, i);
        float *acc = calloc((size_t)len + 1, sizeof(float));
        for (int r = 0; r < np; r++) {
          input(xr, n, r, 0);
          roundtrip_add(c, xr + lo, len, loom_compress_encode_seed(c, ss, r, 0), ss, acc);
        }
        // the owner (rank i) re-encodes the sum
        roundtrip_add(c, acc, len, loom_compress_encode_seed(c, ss, i, 1), ss, want + lo);
        free(acc);
      }
    }
  } else { // hierarchical: node sums in rank order, then indivisible among the leaders
    int nodes = node_size > 0 ? (np + node_size - 1) / node_size : 1;
    int per = node_size > 0 ? node_size : np;
    for (int k = 0; k < nodes; k++) {
      float *ns = calloc((size_t)n + 1, sizeof(float));
      for (int r = k * per; r < np && r < (k + 1) * per; r++) {
        input(xr, n, r, 0);
        for (int64_t i = 0; i < n; i++) {
          ns[i] += xr[i];
        }
      }
      roundtrip_chunks(c, ns, n, seed, k, want); // node k's leader is rank k of the leaders
      free(ns);
    }
  }
  CHECK(test_same_bits(x, want, n), "%s %s n=%lld: result differs from decode-and-sum", spec,
        loom_scheme_name(scheme), (long long)n);
  CHECK(same_everywhere(g, x, n), "%s %s n=%lld: ranks differ", spec, loom_scheme_name(scheme),
        (long long)n);
  CHECK(np > 1 || scheme == LOOM_SCHEME_HIERARCHICAL || sent == 0, "%s: %zu bytes sent at np 1",
        spec, sent);
  if (np > 1 && n >= 1000 && strcmp(spec, "none") != 0) { // fewer bytes than the same scheme
    loom_compressor_t *none = NULL;                       // uncompressed
    size_t sent_none = 0;
    OK(loom_compressor_create("none", &none));
    input(xr, n, me, 0);
    loom_tensor_t u = test_tensor_f32(1, &n, "grad");
    test_copy_floats(test_floats(&u), xr, n);
    OK(loom_compressed_allreduce(g, none, scheme, NULL, &u, LOOM_SUM, seed, &sent_none));
    // hierarchical: ranks that lead no node send only uncompressed bytes inside their node
    CHECK(sent < sent_none || (scheme == LOOM_SCHEME_HIERARCHICAL && sent == sent_none),
          "%s %s: %zu bytes sent, %zu uncompressed", spec, loom_scheme_name(scheme), sent,
          sent_none);
    TEST_FREE(&u);
    loom_compressor_destroy(none);
  }
  free(want);
  free(xr);
  TEST_FREE(&t);
  loom_compressor_destroy(c);
}

// Non-blocking: two calls in flight at once (different tensors, the second started before the
// first is waited for) equal the blocking calls bit for bit, error feedback included.
static void test_nonblocking(const loom_group_t *g, const char *spec, loom_scheme_t scheme) {
  const int me = loom_group_rank(g);
  int64_t n1 = 3001, n2 = 77;
  loom_compressor_t *c = NULL;
  loom_ef_t *ef_b = NULL, *ef_n = NULL;
  OK(loom_compressor_create(spec, &c));
  OK(loom_ef_create(&ef_b));
  OK(loom_ef_create(&ef_n));
  loom_tensor_t a = test_tensor_f32(1, &n1, "a"), b = test_tensor_f32(1, &n2, "b");
  loom_tensor_t a2 = test_tensor_f32(1, &n1, "a"), b2 = test_tensor_f32(1, &n2, "b");
  for (int step = 0; step < 2; step++) {
    input(test_floats(&a), n1, me, 30 + step);
    input(test_floats(&b), n2, me, 40 + step);
    test_copy_floats(test_floats(&a2), test_floats(&a), n1);
    test_copy_floats(test_floats(&b2), test_floats(&b), n2);
    size_t s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    OK(loom_compressed_allreduce(g, c, scheme, ef_b, &a, LOOM_AVG, (uint64_t)step, &s1));
    OK(loom_compressed_allreduce(g, c, scheme, ef_b, &b, LOOM_SUM, (uint64_t)step + 9, &s2));
    loom_request_t *r[2] = {NULL, NULL};
    OK(loom_icompressed_allreduce(g, c, scheme, ef_n, &a2, LOOM_AVG, (uint64_t)step, &s3, &r[0]));
    OK(loom_icompressed_allreduce(g, c, scheme, ef_n, &b2, LOOM_SUM, (uint64_t)step + 9, &s4,
                                  &r[1]));
    OK(loom_wait(&r[1])); // out of order: the first one is advanced meanwhile
    OK(loom_wait(&r[0]));
    CHECK(test_same_bits(test_floats(&a), test_floats(&a2), n1) &&
              test_same_bits(test_floats(&b), test_floats(&b2), n2),
          "%s %s step %d: non-blocking differs from blocking", spec, loom_scheme_name(scheme),
          step);
    CHECK(s1 == s3 && s2 == s4, "%s: bytes sent %zu/%zu vs %zu/%zu", spec, s1, s2, s3, s4);
  }
  TEST_FREE(&a, &b, &a2, &b2);
  loom_ef_destroy(ef_b);
  loom_ef_destroy(ef_n);
  loom_compressor_destroy(c);
}

static void test_avg(const loom_group_t *g) {
  const int np = loom_group_size(g), me = loom_group_rank(g);
  int64_t n = 257;
  loom_compressor_t *c = NULL;
  OK(loom_compressor_create("fp16", &c));
  loom_tensor_t a = test_tensor_f32(1, &n, "a"), b = test_tensor_f32(1, &n, "b");
  input(test_floats(&a), n, me, 1);
  input(test_floats(&b), n, me, 1);
  OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &a, LOOM_SUM, 5, NULL));
  OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &b, LOOM_AVG, 5, NULL));
  float *pa = test_floats(&a), *pb = test_floats(&b);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bad += pb[i] != pa[i] / (float)np;
  }
  CHECK(bad == 0, "AVG differs from SUM / np in %d elements", bad);
  TEST_FREE(&a, &b);
  loom_compressor_destroy(c);
}

// One error-feedback step of every rank, computed here: y_r = x_r + res_r (x_r this step's
// input), the result the scheme makes of the y_r (as in test_scheme) into want, and each res_r
// (np rows of n) replaced by y_r - decode(encode(y_r)) for the blocks rank r encoded first.
static void ef_expected(const loom_compressor_t *c, loom_scheme_t scheme, int np, int64_t n,
                        int step, float *res, float *want) {
  const uint64_t seed = (uint64_t)step;
  float *ys = malloc(sizeof(float) * (size_t)(np * n + 1));
  float *d = malloc(sizeof(float) * (size_t)(n + 1));
  for (int r = 0; r < np; r++) {
    input(ys + r * n, n, r, 10 + step);
    for (int64_t i = 0; i < n; i++) {
      ys[r * n + i] += res[r * n + i];
    }
  }
  test_fill_value(want, n, 0.0f);
  const int64_t chunk = chunk_values(c, n);
  for (int64_t clo = 0, k = 0; clo < n; clo += chunk, k++) {
    const int64_t clen = n - clo < chunk ? n - clo : chunk;
    const uint64_t sk = seed + (uint64_t)k;
    const int shards = scheme == LOOM_SCHEME_DIVISIBLE ? np : 1;
    for (int i = 0; i < shards; i++) {
      int64_t lo = 0, len = clen;
      if (shards > 1) {
        shard_range(clen, np, i, &lo, &len);
      }
      lo += clo;
      const uint64_t ss = shards > 1 ? loom_compress_shard_seed(sk, i) : sk;
      float *acc = shards > 1 ? calloc((size_t)len + 1, sizeof(float)) : want + lo;
      for (int r = 0; r < np; r++) {
        const uint64_t es = loom_compress_encode_seed(c, ss, r, 0);
        roundtrip_add(c, ys + r * n + lo, len, es, ss, acc); // the sum, in rank order
        test_fill_value(d, len, 0.0f);
        roundtrip_add(c, ys + r * n + lo, len, es, ss, d); // r's own decode: its residual
        for (int64_t j = 0; j < len; j++) {
          res[r * n + lo + j] = ys[r * n + lo + j] - d[j];
        }
      }
      if (shards > 1) { // the owner (rank i) re-encodes the sum, without error feedback
        roundtrip_add(c, acc, len, loom_compress_encode_seed(c, ss, i, 1), ss, want + lo);
        free(acc);
      }
    }
  }
  free(ys);
  free(d);
}

// Three steps with error feedback, indivisible and divisible: this rank's residual and the
// result (of every rank's input plus its residual) equal the ones computed here, bit for bit.
static void test_error_feedback(const loom_group_t *g) {
  const int np = loom_group_size(g), me = loom_group_rank(g);
  int64_t n = 1001;
  const char *ef_specs[] = {"topk:0.05", "efsign", "int8"};
  const loom_scheme_t schemes[] = {LOOM_SCHEME_INDIVISIBLE, LOOM_SCHEME_DIVISIBLE};
  for (int s = 0; s < 3; s++) {
    for (int sc = 0; sc < 2; sc++) {
      loom_compressor_t *c = NULL;
      loom_ef_t *ef = NULL;
      OK(loom_compressor_create(ef_specs[s], &c));
      OK(loom_ef_create(&ef));
      float *res_all = calloc((size_t)(np * n), sizeof(float));
      float *want = malloc(sizeof(float) * (size_t)n);
      loom_tensor_t t = test_tensor_f32(1, &n, "layer0.w");
      const char *sname = loom_scheme_name(schemes[sc]);
      for (int step = 0; step < 3; step++) {
        input(test_floats(&t), n, me, 10 + step);
        ef_expected(c, schemes[sc], np, n, step, res_all, want);
        OK(loom_compressed_allreduce(g, c, schemes[sc], ef, &t, LOOM_SUM, (uint64_t)step, NULL));
        float *res = NULL;
        OK(loom_ef_residual(ef, "layer0.w", n, &res));
        CHECK(res && test_same_bits(res, res_all + me * n, n),
              "%s %s step %d: residual != y - decode(encode(y))", ef_specs[s], sname, step);
        CHECK(test_same_bits(test_floats(&t), want, n),
              "%s %s step %d: result differs from the decode-and-sum of x + residual on every rank",
              ef_specs[s], sname, step);
        CHECK(same_everywhere(g, test_floats(&t), n), "%s %s step %d: ranks differ", ef_specs[s],
              sname, step);
      }
      CHECK(loom_ef_count(ef) == 1, "%d residuals", loom_ef_count(ef));
      free(res_all);
      free(want);
      TEST_FREE(&t);
      loom_ef_destroy(ef);
      loom_compressor_destroy(c);
    }
  }
}

// A rank-1 sum (largest value 12.5 tri, tri = np (np + 1) / 2) is exact for powersgd:1 up to
// float rounding: P = M Q and Q = M^T P (sums of 5 or 6 products, then of np ranks), the
// normalisation and P Q^T, a few ulps of the largest value (2 ulps seen at np 1..4). 64 ulps of
// it (64 * 2^-24 * 12.5 = 4.8e-5 per tri) keep 30x headroom; a wrong element is off by O(tri).
#define RANK1_TOL 4.8e-5

static void test_powersgd(const loom_group_t *g) {
  const int np = loom_group_size(g), me = loom_group_rank(g);
  // Full rank (4 x 6 at rank 4): P Q^T reproduces the sum exactly up to rounding.
  int64_t shape[2] = {4, 6}, n = 24;
  loom_compressor_t *c = NULL;
  loom_ef_t *ef = NULL;
  OK(loom_compressor_create("powersgd:4", &c));
  OK(loom_ef_create(&ef));
  loom_tensor_t t = test_tensor_f32(2, shape, "w");
  input(test_floats(&t), n, me, 20);
  OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &t, LOOM_SUM, 1, NULL));
  float *xr = malloc(sizeof(float) * (size_t)n);
  double worst = 0.0;
  double *sum = calloc((size_t)n, sizeof(double));
  for (int r = 0; r < np; r++) {
    input(xr, n, r, 20);
    for (int64_t i = 0; i < n; i++) {
      sum[i] += xr[i];
    }
  }
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(test_floats(&t)[i] - sum[i]);
    worst = d > worst || isnan(d) ? d : worst; // a NaN must fail the check below
  }
  CHECK(worst < 1e-4 * np, "powersgd:4 on 4 x 6: error %g", worst);
  CHECK(same_everywhere(g, test_floats(&t), n), "powersgd: ranks differ");
  // A matrix view with a side past the BLAS's int (2^31 x 1) is refused before any work: the
  // data is never read (one float here).
  {
    int64_t tall[2] = {(int64_t)1 << 31, 1};
    loom_tensor_t v;
    float one = 1.0f;
    OK(loom_tensor_wrap(&v, &one, LOOM_F32, LOOM_DEVICE_HOST, 2, tall, "tall"));
    CHECK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &v, LOOM_SUM, 1, NULL) ==
              LOOM_ERR_INVALID_ARG,
          "powersgd on a 2^31 x 1 tensor was not refused");
  }
  // Without error feedback: refused.
  CHECK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &t, LOOM_SUM, 1, NULL) ==
            LOOM_ERR_INVALID_ARG,
        "powersgd without ef accepted");
  TEST_FREE(&t);
  loom_compressor_destroy(c);
  // Rank 1 on rank-1 inputs (rank r holds (r + 1) u v^T) over a 1-D tensor of 30 = 5 x 6.
  OK(loom_compressor_create("powersgd:1", &c));
  int64_t m = 30;
  loom_tensor_t u = test_tensor_f32(1, &m, "u");
  for (int i = 0; i < 5; i++) {
    for (int j = 0; j < 6; j++) {
      test_floats(&u)[i * 6 + j] = (float)((me + 1) * (i + 1) * (j - 2.5));
    }
  }
  OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &u, LOOM_SUM, 1, NULL));
  double tri = np * (np + 1) / 2.0;
  worst = 0.0;
  for (int i = 0; i < 5; i++) {
    for (int j = 0; j < 6; j++) {
      double d = fabs(test_floats(&u)[i * 6 + j] - tri * (i + 1) * (j - 2.5));
      worst = d > worst || isnan(d) ? d : worst; // a NaN must fail the check below
    }
  }
  CHECK(worst < RANK1_TOL * tri, "powersgd:1 on a rank-1 sum: error %g", worst);
  TEST_FREE(&u);
  free(xr);
  free(sum);
  loom_ef_destroy(ef);
  loom_compressor_destroy(c);
}

// PowerSGD's warm start survives a step whose gradient is all zeros (a frozen layer, an embedding
// no token hit) or not finite (the step the trainer skips): the next rank-1 step is still the
// exact sum, not zeros or NaN for ever (Q = M^T P is zero, or NaN, after such a step).
static void test_powersgd_restart(const loom_group_t *g) {
  const int np = loom_group_size(g), me = loom_group_rank(g);
  loom_compressor_t *c = NULL;
  OK(loom_compressor_create("powersgd:1", &c));
  const float bad[3] = {0.0f, NAN, INFINITY};
  const char *what[3] = {"zeros", "NaN", "Inf"};
  for (int b = 0; b < 3; b++) {
    loom_ef_t *ef = NULL;
    OK(loom_ef_create(&ef));
    int64_t shape[2] = {5, 6}, n = 30;
    loom_tensor_t t = test_tensor_f32(2, shape, "w");
    float *x = test_floats(&t);
    for (int64_t i = 0; i < n; i++) {
      x[i] = i == 7 || b == 0 ? bad[b] : 1.0f;
    }
    OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &t, LOOM_SUM, 1, NULL));
    double tri = np * (np + 1) / 2.0, worst = 0.0;
    for (int step = 0; step < 2; step++) {
      for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 6; j++) {
          x[i * 6 + j] = (float)((me + 1) * (i + 1) * (j - 2.5));
        }
      }
      // the rank-1 part of what the bad step left in the residual is carried too (zero for b 0)
      float *res = NULL;
      OK(loom_ef_residual(ef, "w", n, &res));
      for (int64_t i = 0; i < n && res; i++) {
        res[i] = 0.0f;
      }
      OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &t, LOOM_SUM, 2, NULL));
      worst = 0.0;
      for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 6; j++) {
          double d = fabs(x[i * 6 + j] - tri * (i + 1) * (j - 2.5));
          worst = d > worst || isnan(d) ? d : worst;
        }
      }
      CHECK(worst < RANK1_TOL * tri, "powersgd:1 step %d after a step of %s: error %g", step,
            what[b], worst);
    }
    CHECK(same_everywhere(g, x, n), "powersgd after %s: ranks differ", what[b]);
    TEST_FREE(&t);
    loom_ef_destroy(ef);
  }
  loom_compressor_destroy(c);
}

static void test_errors(const loom_group_t *g) {
  loom_compressor_t *c = NULL;
  loom_ef_t *ef = NULL;
  OK(loom_compressor_create("int8", &c));
  OK(loom_ef_create(&ef));
  int64_t n = 8;
  loom_tensor_t h = test_tensor(LOOM_F16, 1, &n, "h");
  CHECK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &h, LOOM_SUM, 0, NULL) ==
            LOOM_ERR_UNSUPPORTED,
        "f16 tensor accepted");
  loom_tensor_t t = test_tensor_f32(1, &n, NULL);
  CHECK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &t, LOOM_SUM, 0, NULL) ==
            LOOM_ERR_INVALID_ARG,
        "unnamed tensor with ef accepted");
  CHECK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, NULL, &t, LOOM_MAX, 0, NULL) ==
            LOOM_ERR_INVALID_ARG,
        "LOOM_MAX accepted");
  TEST_FREE(&h, &t);
  loom_ef_destroy(ef);
  loom_compressor_destroy(c);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  world_rank = loom_rank(ctx);
  world_size = loom_size(ctx);
  int64_t chunk = 0; // --chunk N: MPI messages of at most N bytes (payloads travel as bytes)
  if (test_chunk_option("test_compress", argc, argv, world_rank, &chunk) != 0) {
    loom_finalize(ctx);
    return 2;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  const char *ns = getenv("LOOM_NODE_SIZE");
  int node_size = ns ? atoi(ns) : 0;
  const int64_t sizes[] = {0, 1, 5, 3 * world_size + 1, 1000, 4099};
  for (int s = 0; s < NSPECS; s++) {
    for (int sc = 0; sc < LOOM_SCHEME_COUNT; sc++) {
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        test_scheme(g, specs[s], (loom_scheme_t)sc, sizes[k], node_size);
      }
    }
  }
  for (int s = 0; s < NSPECS; s++) {
    for (int sc = 0; sc < LOOM_SCHEME_COUNT; sc++) {
      test_nonblocking(g, specs[s], (loom_scheme_t)sc);
    }
  }
  test_avg(g);
  test_error_feedback(g);
  test_powersgd(g);
  test_powersgd_restart(g);
  test_errors(g);
  int rc = check_exit_all("test_compress");
  loom_finalize(ctx);
  return rc;
}
