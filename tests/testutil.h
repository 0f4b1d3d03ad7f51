/* testutil.h — helpers the compute tests share: a seeded random generator, random tensors,
 * and a tolerance comparison that reports the worst element. Header-only, static functions. */
#ifndef LOOM_TESTS_TESTUTIL_H
#define LOOM_TESTS_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "loom.h"

// xorshift64*: deterministic across platforms for a given seed.
typedef struct test_rng {
  uint64_t s;
} test_rng_t;

static inline test_rng_t test_rng(uint64_t seed) {
  test_rng_t r = {seed * 0x9E3779B97F4A7C15ull + 1};
  return r;
}

static inline uint64_t test_next(test_rng_t *r) {
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545F4914F6CDD1Dull;
}

// Uniform in [lo, hi).
static inline double test_uniform(test_rng_t *r, double lo, double hi) {
  return lo + (hi - lo) * (double)(test_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

// Integer in [lo, hi].
static inline int64_t test_int(test_rng_t *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(test_next(r) % (uint64_t)(hi - lo + 1));
}

static inline void test_fill_uniform(test_rng_t *r, float *x, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) {
    x[i] = (float)test_uniform(r, lo, hi);
  }
}

// Compare got (float) with want (double) elementwise: |got - want| <= atol + rtol * |want|.
// Prints the worst violation with its index and returns the number of violations.
static inline int64_t test_compare(const char *what, const float *got, const double *want,
                                   int64_t n, double atol, double rtol) {
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - want[i]);
    double tol = atol + rtol * fabs(want[i]);
    if (!(err <= tol)) { // also catches NaN
      bad++;
      double excess = isnan(err) ? INFINITY : err - tol;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad) {
    fprintf(
        stderr,
        "FAIL %s: %lld of %lld elements outside atol %g rtol %g; worst [%lld] got %.9g want %.9g\n",
        what, (long long)bad, (long long)n, atol, rtol, (long long)worst, (double)got[worst],
        want[worst]);
  }
  return bad;
}

// A host f32 tensor of the given shape; aborts the test on allocation failure.
static inline loom_tensor_t test_tensor_f32(int ndim, const int64_t *shape, const char *name) {
  loom_tensor_t t;
  if (loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, ndim, shape, name) != LOOM_OK) {
    fprintf(stderr, "test_tensor_f32(%s): %s\n", name, loom_last_error(NULL));
    exit(2);
  }
  return t;
}

#endif
