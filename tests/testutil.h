/* testutil.h — header-only helpers the compute tests share: a seeded random generator, host
 * tensors, float buffers, a tolerance comparison, and checks of calls that must fail. */
#ifndef LOOM_TESTS_TESTUTIL_H
#define LOOM_TESTS_TESTUTIL_H

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/agree_args.h"
#include "check.h"
#include "error.h"
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

// ---------------------------------------------------------------------------------------------
// Host tensors

// A host tensor of dtype and the given shape; aborts the test on allocation failure.
static inline loom_tensor_t test_tensor(loom_dtype_t dtype, int ndim, const int64_t *shape,
                                        const char *name) {
  loom_tensor_t t;
  if (loom_tensor_alloc(&t, dtype, LOOM_DEVICE_HOST, ndim, shape, name) != LOOM_OK) {
    fprintf(stderr, "test_tensor(%s): %s\n", name, loom_last_error(NULL));
    exit(2);
  }
  return t;
}

// A host f32 tensor of the given shape; aborts the test on allocation failure.
static inline loom_tensor_t test_tensor_f32(int ndim, const int64_t *shape, const char *name) {
  return test_tensor(LOOM_F32, ndim, shape, name);
}

// The elements of an f32 tensor (NULL for an empty one).
static inline float *test_floats(const loom_tensor_t *t) {
  return (float *)t->data;
}

// Frees the n tensors t[0..n); TEST_FREE(&a, &b, ...) frees a list.
static inline void test_free_tensors(loom_tensor_t *const *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    loom_tensor_free(t[i]);
  }
}
#define TEST_FREE(...)                                                                             \
  test_free_tensors((loom_tensor_t *const[]){__VA_ARGS__},                                         \
                    sizeof((loom_tensor_t *const[]){__VA_ARGS__}) / sizeof(loom_tensor_t *))

// ---------------------------------------------------------------------------------------------
// Float buffers. n <= 0 never touches the pointers (an empty tensor's data is NULL).

// x[0..n) = v (NaN marks outputs that a call must overwrite).
static inline void test_fill_value(float *x, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++) {
    x[i] = v;
  }
}

// 1 when every one of x[0..n) has the bits of v (so NaN and -0 compare as themselves).
static inline int test_all_equal(const float *x, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++) {
    if (memcmp(&x[i], &v, sizeof v) != 0) {
      return 0;
    }
  }
  return 1;
}

// 1 when a[0..n) and b[0..n) hold the same bits.
static inline int test_same_bits(const float *a, const float *b, int64_t n) {
  return n <= 0 || memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

// dst[0..n) = src[0..n).
static inline void test_copy_floats(float *dst, const float *src, int64_t n) {
  if (n > 0) {
    memcpy(dst, src, sizeof(float) * (size_t)n);
  }
}

// sum(a * w) over n elements in double: the loss of the finite-difference checks.
static inline double test_dot(const float *a, const float *w, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) {
    s += (double)a[i] * (double)w[i];
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Guarded tensors: an f32 host tensor wrapped inside TEST_GUARD sentinel values on each side.
// A call that writes one element before or past its tensor changes a sentinel (a test_tensor
// allocation has no slack to show that: the write lands in the allocator's bookkeeping).

#define TEST_GUARD 16

typedef struct test_guarded {
  float *buf;      // (TEST_GUARD + numel + TEST_GUARD)
  loom_tensor_t t; // the middle
} test_guarded_t;

// The sentinel: 0xA5 bytes (a small negative float no kernel produces by chance).
static inline float test_guard_value(void) {
  float v;
  memset(&v, 0xA5, sizeof v);
  return v;
}

// The tensor's own elements are set to the sentinel too (an output must overwrite them).
static inline test_guarded_t test_guarded_f32(int ndim, const int64_t *shape, const char *name) {
  test_guarded_t g;
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    n *= shape[i];
  }
  g.buf = malloc(sizeof(float) * (size_t)(n + 2 * TEST_GUARD));
  if (!g.buf || loom_tensor_wrap(&g.t, g.buf + TEST_GUARD, LOOM_F32, LOOM_DEVICE_HOST, ndim, shape,
                                 name) != LOOM_OK) {
    fprintf(stderr, "test_guarded_f32(%s): %s\n", name, loom_last_error(NULL));
    exit(2);
  }
  test_fill_value(g.buf, n + 2 * TEST_GUARD, test_guard_value());
  return g;
}

// 1 when the sentinels on both sides of g's tensor are unchanged.
static inline int test_guards_intact(const test_guarded_t *g) {
  int64_t n = loom_tensor_numel(&g->t);
  return test_all_equal(g->buf, TEST_GUARD, test_guard_value()) &&
         test_all_equal(g->buf + TEST_GUARD + n, TEST_GUARD, test_guard_value());
}

static inline void test_guarded_free(test_guarded_t *g) {
  free(g->buf);
  g->buf = NULL;
}

// ---------------------------------------------------------------------------------------------
// Calls that must fail

#define TEST_STR_(x) #x
#define TEST_STR(x)  TEST_STR_(x)
// "file.c:123": where the macro stands, to label a failure.
#define TEST_HERE __FILE__ ":" TEST_STR(__LINE__)

// A call that returned got must have failed with want or also (pass want twice when only one
// status will do) and left a last-error message that names op and contains needle (NULL: only
// op). Failures are CHECKs labelled what; the error is cleared for the next call.
static inline void test_expect_fail(loom_status_t got, loom_status_t want, loom_status_t also,
                                    const char *op, const char *needle, const char *what) {
  const char *msg = loom_last_error(NULL);
  if (!needle) {
    needle = "";
  }
  CHECK(got == want || got == also, "%s: got %s, want %s (last error: %s)", what,
        loom_strerror(got), loom_strerror(want), msg);
  CHECK(msg[0] != '\0' && strstr(msg, op) != NULL && strstr(msg, needle) != NULL,
        "%s: message '%s' should name %s and contain '%s'", what, msg, op, needle);
  loom_error_clear();
}

// Clears the last error, runs call and checks that it fails with LOOM_ERR_INVALID_ARG and a
// message naming op and containing needle; a failure names the line of the EXPECT_FAIL.
#define EXPECT_FAIL(call, op, needle)                                                              \
  do {                                                                                             \
    loom_error_clear();                                                                            \
    test_expect_fail((call), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, op, needle, TEST_HERE);   \
  } while (0)

// As EXPECT_FAIL for a call whose first tensor is on a CUDA device: LOOM_ERR_UNSUPPORTED (no CUDA
// compute backend) or LOOM_ERR_INVALID_ARG.
#define EXPECT_FAIL_DEVICE(call, op, needle)                                                       \
  do {                                                                                             \
    loom_error_clear();                                                                            \
    test_expect_fail((call), LOOM_ERR_UNSUPPORTED, LOOM_ERR_INVALID_ARG, op, needle, TEST_HERE);   \
  } while (0)

// Store v as element i of a buffer of dtype dt (floats round to nearest even, once; integers
// are converted by C's rules, so pass values that fit).
static inline void test_put(loom_dtype_t dt, void *p, int64_t i, double v) {
  switch (dt) {
  case LOOM_F32:
    ((float *)p)[i] = (float)v;
    break;
  case LOOM_F16:
    ((uint16_t *)p)[i] = loom_f32_to_f16((float)v);
    break;
  case LOOM_BF16:
    ((uint16_t *)p)[i] = loom_f32_to_bf16((float)v);
    break;
  case LOOM_I8:
    ((int8_t *)p)[i] = (int8_t)v;
    break;
  case LOOM_U8:
    ((uint8_t *)p)[i] = (uint8_t)v;
    break;
  case LOOM_I32:
    ((int32_t *)p)[i] = (int32_t)v;
    break;
  default:
    ((int64_t *)p)[i] = (int64_t)v;
    break;
  }
}

// A benchmark's output file (the path given to flag) opened with mode; NULL after saying why.
static inline FILE *test_output_open(const char *prog, const char *flag, const char *path,
                                     const char *mode) {
  FILE *f = fopen(path, mode);
  if (!f) {
    fprintf(stderr, "%s: %s %s: %s: give a writable file path\n", prog, flag, path,
            strerror(errno));
  }
  return f;
}

// A benchmark's output file, checked before its runs so that their results are not lost at the
// end: opened for appending (and created when missing). 0, or -1 after saying why.
static inline int test_output_writable(const char *prog, const char *flag, const char *path) {
  FILE *f = path ? test_output_open(prog, flag, path, "a") : NULL;
  if (path && !f) {
    return -1;
  }
  if (f) {
    fclose(f);
  }
  return 0;
}

// Closes a benchmark's output file after its writes: 0, or -1 after naming the file and the
// error (a full disk, an I/O error), so that a truncated file never passes for a written one.
static inline int test_output_close(const char *prog, const char *flag, const char *path, FILE *f) {
  int failed = fflush(f) != 0; // what is still buffered; errno says why it failed
  int err = errno;
  failed |= ferror(f) != 0; // an earlier write failed (errno is still its reason)
  if (fclose(f) != 0 && !failed) {
    failed = 1;
    err = errno;
  }
  if (failed) {
    fprintf(stderr,
            "%s: %s %s: writing failed: %s: the file is incomplete; free space or give "
            "another path\n",
            prog, flag, path, err ? strerror(err) : "a write error");
  }
  return failed ? -1 : 0;
}

// A loom call of an MPI benchmark that returned st on this rank: anything but LOOM_OK ends the
// whole job (loom_abort, which names this rank) with prog, what failed and loom's message. Its
// peers may be waiting for this rank inside a collective: returning would leave them there until
// LOOM_TIMEOUT, or for ever (README, "One rank's error ends the job").
static inline void test_job_check(loom_status_t st, const char *prog, const char *what) {
  if (st != LOOM_OK) {
    const char *msg = loom_last_error(NULL);
    char why[1280];
    snprintf(why, sizeof why, "%s: %s failed (%s)%s%s", prog, what, loom_strerror(st),
             msg[0] ? ": " : "", msg);
    loom_abort(NULL, 1, why);
  }
}

// A raw MPI call of an MPI benchmark that returned rc on this rank: anything but MPI_SUCCESS ends
// the whole job as test_job_check does, with MPI's own text for rc ("MPI_ERR_TRUNCATE: message
// truncated"). The call must return its errors: on a loom group's communicator it does (loom
// sets MPI_ERRORS_RETURN there); MPI_COMM_WORLD keeps MPI_ERRORS_ARE_FATAL unless set otherwise.
static inline void test_mpi_job_check(int rc, const char *prog, const char *what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) {
      snprintf(msg, sizeof msg, "MPI error code %d", rc);
    }
    char why[512 + MPI_MAX_ERROR_STRING];
    snprintf(why, sizeof why, "%s: %s failed: %s", prog, what, msg);
    loom_abort(NULL, 1, why);
  }
}

// Right after loom_init in an MPI benchmark, on every rank: 0 when every rank was started with
// rank 0's arguments, else 2 after the lowest rank that differs named the first argument that does
// (ex_agree_args, as the example trainers check). Ranks given other arguments that each accepts
// (an MPMD line) would run collectives of other sizes or counts: a hang until LOOM_TIMEOUT, or an
// error in a later call that hides the cause. BENCH_ALLOW_OTHER_ARGS=1 on every rank skips the
// check, for tests that give one rank other arguments on purpose to make a call fail there.
static inline int test_bench_agree_args(const char *prog, int argc, char **argv) {
  const char *allow = getenv("BENCH_ALLOW_OTHER_ARGS");
  int mine = allow && !strcmp(allow, "1"), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD); // the same choice everywhere
  if (all) {
    return 0;
  }
  return ex_agree_args(prog, "the sizes, counts and iterations of every collective come from it",
                       argc, argv);
}

// A whole-number command-line value: digits only (a sign allowed), no overflow of 64 bits;
// the caller checks its range. 0, or -1 after naming the flag and the value.
static inline int test_int64_arg(const char *prog, const char *flag, const char *s, int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || end == s || *end || errno) {
    fprintf(stderr, "%s: %s %s: expected a whole number\n", prog, flag, s ? s : "(missing)");
    return -1;
  }
  *out = (int64_t)v;
  return 0;
}

// The same for an int.
static inline int test_int_arg(const char *prog, const char *flag, const char *s, int *out) {
  int64_t v = 0;
  if (test_int64_arg(prog, flag, s, &v) != 0) {
    return -1;
  }
  if (v < -2147483647L || v > 2147483647L) {
    fprintf(stderr, "%s: %s %s: expected a whole number\n", prog, flag, s);
    return -1;
  }
  *out = (int)v;
  return 0;
}

// A finite real command-line value (no trailing text); the caller checks its range.
static inline int test_real_arg(const char *prog, const char *flag, const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double v = s ? strtod(s, &end) : 0.0;
  if (!s || end == s || *end || errno || !isfinite(v)) {
    fprintf(stderr, "%s: %s %s: expected a number\n", prog, flag, s ? s : "(missing)");
    return -1;
  }
  *out = v;
  return 0;
}

#endif
