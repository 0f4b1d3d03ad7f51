/* test_compress_sr.c — int8:sr under mpirun: the compressed allreduce of constant values, repeated
 * with a new seed each time, is unbiased on average, and every rank holds the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "../testutil.h"

// What is checked, at the np of the spec (and its LOOM_COMPRESS_CHUNK), for int8:sr under the
// indivisible and divisible schemes, blocking, non-blocking and staged (a host stage), over
// TRIALS calls with seeds 0, 1, 2, ... on the same inputs:
// - every rank holds the same bits after every call, and the three entry points agree bitwise;
// - the mean error of the sum (over the trials and the values) is within 4 standard errors of
//   zero (the standard error from the spread of the per-trial means; seeds are fixed, so the
//   outcome is reproducible). Every 8th value is 1.0 on every rank (so that every chunk's and
//   shard's int8 scale is 1/127, and the owner's re-encode scale np/127), the others lie between
//   two int8 levels, rank by rank:
//     "mixed": rank 0 holds 40.5/127, the others 40/127. With one random stream for every rank
//       and for the owner's re-encode (the old int8:sr) the divisible sum was biased by half a
//       level (1/254) per value, since the re-encode rounded in step with rank 0's rounding;
//     "spread": rank r holds (40 + frac(0.3 + 0.37 r))/127;
//     "same": every rank holds 40.3/127; under the indivisible scheme the error of the sum also
//       has the variance of np independent roundings (np 0.3 0.7 levels^2), not that of one
//       rounding np times over (np^2 0.3 0.7), which is what one stream for every rank gave.
// The measured means are printed on rank 0 (in int8 levels of the inputs, 1/127).

static int world_rank, world_size;

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

#define TRIALS 400
#define ANCHOR 8 // every ANCHOR-th value is 1.0: any 8 contiguous values hold one

enum { MIXED, SPREAD, SAME, NCONFIG };
static const char *const config_names[NCONFIG] = {"mixed", "spread", "same"};

// Rank r's value (in int8 levels, 1/127) at a non-anchor position under config.
static double level(int config, int r) {
  switch (config) {
  case MIXED:
    return r == 0 ? 40.5 : 40.0;
  case SPREAD: {
    double f = 0.3 + 0.37 * r;
    return 40.0 + (f - floor(f));
  }
  default:
    return 40.3;
  }
}

static void input(float *x, int64_t n, int config, int r) {
  for (int64_t i = 0; i < n; i++) {
    x[i] = i % ANCHOR == 0 ? 1.0f : (float)(level(config, r) / 127.0);
  }
}

// 1 when every rank of g holds the same n floats.
static int same_everywhere(const loom_group_t *g, const float *x, int64_t n) {
  const int np = loom_group_size(g);
  float *all = malloc(sizeof(float) * (size_t)(n * np + 1));
  MPI_Allgather(x, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, loom_group_comm(g));
  int same = 1;
  for (int r = 1; r < np; r++) {
    same &= memcmp(all, all + (int64_t)r * n, sizeof(float) * (size_t)n) == 0;
  }
  free(all);
  return same;
}

static void test_config(const loom_group_t *g, loom_host_stage_t *stage, loom_scheme_t scheme,
                        int config, int64_t n) {
  const int np = loom_group_size(g), me = loom_group_rank(g);
  loom_compressor_t *c = NULL;
  OK(loom_compressor_create("int8:sr", &c));
  loom_tensor_t a = test_tensor_f32(1, &n, "grad.sr"), b = test_tensor_f32(1, &n, "grad.sr");
  loom_tensor_t s = test_tensor_f32(1, &n, "grad.sr");
  float *x = test_floats(&a), *xb = test_floats(&b), *xs = test_floats(&s);
  float *xr = malloc(sizeof(float) * (size_t)n);
  double *exact = calloc((size_t)n, sizeof(double));
  for (int r = 0; r < np; r++) { // the exact sum of the ranks' inputs
    input(xr, n, config, r);
    for (int64_t i = 0; i < n; i++) {
      exact[i] += xr[i];
    }
  }
  // Errors in input levels (1/127): per-trial means, and the sums over every value for the
  // variance.
  double mean_sum = 0.0, mean_sq = 0.0, err_sum = 0.0, err_sq = 0.0;
  int64_t values = 0;
  int differ = 0, disagree = 0, failed = 0;
  for (int t = 0; t < TRIALS && !failed; t++) {
    const uint64_t seed = (uint64_t)t;
    input(x, n, config, me);
    input(xb, n, config, me);
    input(xs, n, config, me);
    loom_status_t st = loom_compressed_allreduce(g, c, scheme, NULL, &a, LOOM_SUM, seed, NULL);
    loom_request_t *req = NULL;
    loom_status_t sb =
        loom_icompressed_allreduce(g, c, scheme, NULL, &b, LOOM_SUM, seed, NULL, &req);
    if (sb == LOOM_OK) {
      sb = loom_wait(&req);
    }
    loom_status_t ss =
        loom_compressed_allreduce_staged(g, c, scheme, NULL, &s, stage, LOOM_SUM, seed, NULL);
    if (st != LOOM_OK || sb != LOOM_OK || ss != LOOM_OK) {
      CHECK(0, "%s %s trial %d: %s / %s / %s: %s", config_names[config], loom_scheme_name(scheme),
            t, loom_strerror(st), loom_strerror(sb), loom_strerror(ss), loom_last_error(NULL));
      failed = 1;
      break;
    }
    differ += !same_everywhere(g, x, n);
    disagree += !test_same_bits(x, xb, n) || !test_same_bits(x, xs, n);
    double trial = 0.0;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
      if (i % ANCHOR != 0) {
        double e = ((double)x[i] - exact[i]) * 127.0;
        trial += e;
        err_sum += e;
        err_sq += e * e;
        m++;
      }
    }
    values += m;
    trial /= (double)m;
    mean_sum += trial;
    mean_sq += trial * trial;
  }
  if (!failed) {
    const double mean = mean_sum / TRIALS;
    const double sd = sqrt(fmax(mean_sq / TRIALS - mean * mean, 0.0) * TRIALS / (TRIALS - 1));
    const double se = sd / sqrt((double)TRIALS);
    const double var =
        err_sq / (double)values - (err_sum / (double)values) * (err_sum / (double)values);
    if (me == 0) {
      printf("int8:sr %-11s %-6s np %d n %lld: mean error %+.5f levels, standard error %.5f "
             "(%+.1f se), variance %.4f levels^2\n",
             loom_scheme_name(scheme), config_names[config], np, (long long)n, mean, se,
             se > 0.0 ? mean / se : 0.0, var);
    }
    CHECK(differ == 0, "%s %s: ranks hold different results in %d of %d trials",
          config_names[config], loom_scheme_name(scheme), differ, TRIALS);
    CHECK(disagree == 0,
          "%s %s: blocking, non-blocking and staged results differ in %d of %d trials",
          config_names[config], loom_scheme_name(scheme), disagree, TRIALS);
    // Float rounding of the decoded values (q * scale, sums of np of them) is below 1e-4
    // levels; the rest must be noise.
    CHECK(fabs(mean) <= 4.0 * se + 1e-4,
          "%s %s: mean error %+.5f levels is %.1f standard errors (%.5f) from zero: biased",
          config_names[config], loom_scheme_name(scheme), mean, mean / se, se);
    CHECK(np == 1 || sd > 0.0, "%s %s: the rounding never varied", config_names[config],
          loom_scheme_name(scheme));
    if (config == SAME && scheme == LOOM_SCHEME_INDIVISIBLE && np > 1) {
      const double indep = np * 0.3 * 0.7;
      CHECK(var > 0.75 * indep && var < 1.25 * indep,
            "same indivisible: error variance %.4f levels^2, %.4f for independent roundings "
            "(%.4f when every rank rounds alike)",
            var, indep, np * indep);
    }
  }
  free(xr);
  free(exact);
  TEST_FREE(&a, &b, &s);
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
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  const int64_t n = 128 * (int64_t)world_size;
  loom_host_stage_t *stage = NULL;
  OK(loom_host_stage_create(LOOM_DEVICE_HOST, n, &stage));
  for (int config = 0; config < NCONFIG && stage; config++) {
    test_config(g, stage, LOOM_SCHEME_INDIVISIBLE, config, n);
    test_config(g, stage, LOOM_SCHEME_DIVISIBLE, config, n);
  }
  loom_host_stage_destroy(stage);
  int rc = check_exit_all("test_compress_sr");
  loom_finalize(ctx);
  return rc;
}
