/* test_ops_util.c — loom_scale, loom_axpy, loom_norm2 and loom_checksum against references
 * (sizes 0, 1, odd, large; guard elements; FNV-1a for every dtype; bit flips), argument checks. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../testutil.h"
#include "error.h"

// Tolerances:
// - scale: exact against the float product x * alpha (one correctly rounded multiply).
// - axpy: exact against the float expression y + alpha * x (two roundings, no contraction
//   under -std=c11), and within atol 1e-6 + rtol 1e-6 of the double value.
// - norm2: rtol 1e-12 against a naive double sum (both accumulate in double; the order differs).
// - checksum: exact (known FNV-1a 64 values).

// ---------------------------------------------------------------------------------------------
// Helpers

static const int64_t sizes[] = {0, 1, 2, 7, 8, 9, 15, 17, 1000, 100003};
#define NSIZES (sizeof sizes / sizeof sizes[0])

// FNV-1a 64 written out here, independent of loom's: the reference for loom_checksum.
static uint64_t ref_fnv1a64(const void *bytes, size_t len) {
  const unsigned char *p = bytes;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) {
    h = (h ^ p[i]) * 0x100000001b3ull;
  }
  return h;
}

// Guard elements around a wrapped tensor: a call that writes one element before or past its
// tensor changes them (the tensors of test_tensor have no slack to catch that).
#define GUARD 8
static const float guard_value = -1234.5f;

// ---------------------------------------------------------------------------------------------
// scale, axpy, norm2

static void test_scale_axpy(void) {
  test_rng_t rng = test_rng(7);
  static const float alphas[] = {0.0f, 1.0f, -1.0f, 0.37f, -2.5e3f, 1e-20f};
  for (size_t s = 0; s < NSIZES; s++) {
    int64_t n = sizes[s];
    // Shapes vary: (n) and (1, n).
    int64_t shape[2] = {1, n};
    int ndim = s % 2 ? 1 : 2;
    const int64_t *sh = ndim == 1 ? shape + 1 : shape;
    loom_tensor_t x = test_tensor_f32(ndim, sh, "x"), y = test_tensor_f32(ndim, sh, "y");
    float *keep = malloc(sizeof(float) * (size_t)(n + 1));
    float *want_f = malloc(sizeof(float) * (size_t)(n + 1));
    double *want_d = malloc(sizeof(double) * (size_t)(n + 1));
    for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
      float alpha = alphas[k];
      test_fill_uniform(&rng, test_floats(&x), n, -3, 3);
      test_fill_uniform(&rng, test_floats(&y), n, -3, 3);
      test_copy_floats(keep, x.data, n);
      CHECK(loom_scale(&x, alpha) == LOOM_OK, "%s", loom_last_error(NULL));
      int64_t bad = 0;
      for (int64_t i = 0; i < n; i++) {
        float want = keep[i] * alpha;
        bad += memcmp(&test_floats(&x)[i], &want, sizeof want) != 0;
      }
      CHECK(bad == 0, "scale n=%lld alpha=%g: %lld wrong", (long long)n, (double)alpha,
            (long long)bad);

      test_copy_floats(x.data, keep, n);
      for (int64_t i = 0; i < n; i++) {
        want_f[i] = test_floats(&y)[i] + alpha * keep[i];
        want_d[i] = (double)test_floats(&y)[i] + (double)alpha * (double)keep[i];
      }
      CHECK(loom_axpy(&y, alpha, &x) == LOOM_OK, "%s", loom_last_error(NULL));
      CHECK(test_same_bits(want_f, y.data, n), "axpy n=%lld alpha=%g: not bitwise", (long long)n,
            (double)alpha);
      double atol = 1e-6 * fmax(1.0, fabs((double)alpha));
      CHECK(test_compare("axpy", test_floats(&y), want_d, n, atol, 1e-6) == 0, "axpy n=%lld",
            (long long)n);
      CHECK(test_same_bits(keep, x.data, n), "axpy changed x");
    }
    // axpy between different shapes of the same numel is fine, and covers every element: z
    // starts at 0.5, so z = 0.5 + 2 x, exact against the float expression (two roundings).
    int64_t other[2] = {n, 1};
    loom_tensor_t z = test_tensor_f32(2, other, "z");
    test_fill_value(test_floats(&z), n, 0.5f);
    CHECK(loom_axpy(&z, 2.0f, &x) == LOOM_OK, "axpy (n, 1) += (1, n): %s", loom_last_error(NULL));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
      float want = 0.5f + 2.0f * test_floats(&x)[i];
      bad += memcmp(&test_floats(&z)[i], &want, sizeof want) != 0;
    }
    CHECK(bad == 0, "axpy (%lld, 1) += 2 x (1, %lld): %lld of %lld elements are not 0.5 + 2 x",
          (long long)n, (long long)n, (long long)bad, (long long)n);
    loom_tensor_free(&z);
    free(keep);
    free(want_f);
    free(want_d);
    loom_tensor_free(&x);
    loom_tensor_free(&y);
  }
}

// scale and axpy write exactly their n elements: x and y are wrapped inside buffers with GUARD
// sentinels before and after, which must be unchanged (and x unchanged by axpy).
static void test_scale_axpy_guards(void) {
  test_rng_t rng = test_rng(9);
  for (size_t s = 0; s < NSIZES; s++) {
    int64_t n = sizes[s];
    float *xb = malloc(sizeof(float) * (size_t)(n + 2 * GUARD));
    float *yb = malloc(sizeof(float) * (size_t)(n + 2 * GUARD));
    float *keep = malloc(sizeof(float) * (size_t)(n + 1));
    test_fill_value(xb, n + 2 * GUARD, guard_value);
    test_fill_value(yb, n + 2 * GUARD, guard_value);
    test_fill_uniform(&rng, xb + GUARD, n, -3, 3);
    test_fill_uniform(&rng, yb + GUARD, n, -3, 3);
    loom_tensor_t x, y;
    CHECK(loom_tensor_wrap(&x, xb + GUARD, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "x") == LOOM_OK &&
              loom_tensor_wrap(&y, yb + GUARD, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "y") == LOOM_OK,
          "%s", loom_last_error(NULL));
    CHECK(loom_scale(&x, -0.75f) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_all_equal(xb, GUARD, guard_value) &&
              test_all_equal(xb + GUARD + n, GUARD, guard_value),
          "scale n=%lld wrote outside x", (long long)n);
    test_copy_floats(keep, xb + GUARD, n);
    CHECK(loom_axpy(&y, 1.5f, &x) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(test_all_equal(yb, GUARD, guard_value) &&
              test_all_equal(yb + GUARD + n, GUARD, guard_value),
          "axpy n=%lld wrote outside y", (long long)n);
    CHECK(test_same_bits(keep, xb + GUARD, n) && test_all_equal(xb, GUARD, guard_value) &&
              test_all_equal(xb + GUARD + n, GUARD, guard_value),
          "axpy n=%lld wrote to x or around it", (long long)n);
    free(xb);
    free(yb);
    free(keep);
  }
}

static void test_norm2(void) {
  test_rng_t rng = test_rng(13);
  for (size_t s = 0; s < NSIZES; s++) {
    int64_t n = sizes[s];
    loom_tensor_t x = test_tensor_f32(1, &n, "x");
    test_fill_uniform(&rng, test_floats(&x), n, -2, 2);
    double want = 0.0, got = -1.0;
    for (int64_t i = 0; i < n; i++) {
      want += (double)test_floats(&x)[i] * (double)test_floats(&x)[i];
    }
    want = sqrt(want);
    CHECK(loom_norm2(&x, &got) == LOOM_OK, "%s", loom_last_error(NULL));
    CHECK(fabs(got - want) <= 1e-12 * want, "norm2 n=%lld: %.17g want %.17g", (long long)n, got,
          want);
    loom_tensor_free(&x);
  }
  // Values whose squares overflow f32 (1e30^2 = 1e60): the double accumulator holds them.
  int64_t n = 5;
  loom_tensor_t big = test_tensor_f32(1, &n, "big");
  for (int i = 0; i < 5; i++) {
    test_floats(&big)[i] = i % 2 ? -3e30f : 4e30f;
  }
  double got = 0.0, want = sqrt(3.0 * (double)4e30f * (double)4e30f + 2.0 * (double)3e30f * 3e30f);
  CHECK(loom_norm2(&big, &got) == LOOM_OK && fabs(got - want) <= 1e-12 * want,
        "norm2 of 1e30 values: %g want %g", got, want);
  // Tiny values whose squares underflow f32 (1e-30^2 = 1e-60).
  for (int i = 0; i < 5; i++) {
    test_floats(&big)[i] = 1e-30f;
  }
  want = sqrt(5.0) * (double)1e-30f;
  CHECK(loom_norm2(&big, &got) == LOOM_OK && fabs(got - want) <= 1e-12 * want,
        "norm2 of 1e-30 values: %g want %g", got, want);
  // A 3-d tensor is just its elements.
  int64_t s3[3] = {2, 3, 4};
  loom_tensor_t t3 = test_tensor_f32(3, s3, "t3");
  for (int i = 0; i < 24; i++) {
    test_floats(&t3)[i] = 0.5f;
  }
  CHECK(loom_norm2(&t3, &got) == LOOM_OK && got == sqrt(6.0), "norm2 (2, 3, 4) of 0.5: %.17g", got);
  loom_tensor_free(&t3);
  loom_tensor_free(&big);
}

// ---------------------------------------------------------------------------------------------
// checksum

static void test_checksum(void) {
  uint64_t h = 0;
  int64_t one = 1, six = 6, zero = 0;
  loom_tensor_t a = test_tensor(LOOM_U8, 1, &one, "a");
  ((uint8_t *)a.data)[0] = 'a';
  CHECK(loom_checksum(&a, &h) == LOOM_OK && h == 0xaf63dc4c8601ec8cull,
        "FNV-1a 64 of \"a\": %016llx", (unsigned long long)h);
  loom_tensor_t foobar = test_tensor(LOOM_U8, 1, &six, "foobar");
  memcpy(foobar.data, "foobar", 6);
  CHECK(loom_checksum(&foobar, &h) == LOOM_OK && h == 0x85944171f73967e8ull,
        "FNV-1a 64 of \"foobar\": %016llx", (unsigned long long)h);
  loom_tensor_t empty = test_tensor(LOOM_F32, 1, &zero, "empty");
  CHECK(loom_checksum(&empty, &h) == LOOM_OK && h == 0xcbf29ce484222325ull,
        "FNV-1a 64 of nothing is the offset basis: %016llx", (unsigned long long)h);

  // Equal bytes give equal sums whatever the dtype and shape; one flipped bit changes the sum.
  test_rng_t rng = test_rng(19);
  int64_t n = 37, s2[2] = {37, 2}, bytes = 37 * 4;
  loom_tensor_t x = test_tensor_f32(1, &n, "x");
  loom_tensor_t y = test_tensor(LOOM_F16, 2, s2, "y"); // the same 148 bytes seen as f16
  loom_tensor_t z = test_tensor(LOOM_U8, 1, &bytes, "z");
  test_fill_uniform(&rng, test_floats(&x), n, -1, 1);
  memcpy(y.data, x.data, (size_t)bytes);
  memcpy(z.data, x.data, (size_t)bytes);
  uint64_t hx = 0, hy = 1, hz = 2;
  CHECK(loom_checksum(&x, &hx) == LOOM_OK && loom_checksum(&y, &hy) == LOOM_OK &&
            loom_checksum(&z, &hz) == LOOM_OK,
        "%s", loom_last_error(NULL));
  CHECK(hx == hy && hy == hz, "equal bytes: %016llx %016llx %016llx", (unsigned long long)hx,
        (unsigned long long)hy, (unsigned long long)hz);
  CHECK(loom_checksum(&x, &hy) == LOOM_OK && hy == hx, "not repeatable");
  uint8_t *p = x.data;
  for (int k = 0; k < 64; k++) {
    int64_t bit = test_int(&rng, 0, bytes * 8 - 1);
    p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    CHECK(loom_checksum(&x, &hy) == LOOM_OK && hy != hx, "flipping bit %lld kept the sum",
          (long long)bit);
    p[bit / 8] ^= (uint8_t)(1u << (bit % 8));
  }
  CHECK(loom_checksum(&x, &hy) == LOOM_OK && hy == hx, "flipping back restores the sum");
  // Every dtype is accepted, and the sum covers all of its bytes (numel * dtype size): random
  // bytes against the independent FNV-1a, at a size with a tail and at one past any small block.
  static const int64_t counts[] = {37, 70001};
  for (int d = 0; d < LOOM_DTYPE_COUNT; d++) {
    for (int c = 0; c < 2; c++) {
      loom_tensor_t t = test_tensor((loom_dtype_t)d, 1, &counts[c], "t");
      size_t tb = loom_tensor_bytes(&t);
      CHECK(tb == (size_t)counts[c] * loom_dtype_size((loom_dtype_t)d), "dtype %s: %zu bytes",
            loom_dtype_name((loom_dtype_t)d), tb);
      uint8_t *tp = t.data;
      for (size_t i = 0; i < tb; i++) {
        tp[i] = (uint8_t)test_next(&rng);
      }
      h = 0;
      CHECK(loom_checksum(&t, &h) == LOOM_OK, "dtype %s: %s", loom_dtype_name((loom_dtype_t)d),
            loom_last_error(NULL));
      uint64_t want = ref_fnv1a64(tp, tb);
      CHECK(h == want, "dtype %s n=%lld: %016llx want %016llx", loom_dtype_name((loom_dtype_t)d),
            (long long)counts[c], (unsigned long long)h, (unsigned long long)want);
      // The first and the last byte count.
      for (int end = 0; end < 2; end++) {
        size_t at = end ? tb - 1 : 0;
        tp[at] ^= 0x10;
        CHECK(loom_checksum(&t, &h) == LOOM_OK && h == ref_fnv1a64(tp, tb) && h != want,
              "dtype %s n=%lld: flipping byte %zu gives %016llx", loom_dtype_name((loom_dtype_t)d),
              (long long)counts[c], at, (unsigned long long)h);
        tp[at] ^= 0x10;
      }
      loom_tensor_free(&t);
    }
  }
  TEST_FREE(&a, &foobar, &empty, &x, &y, &z);
}

// ---------------------------------------------------------------------------------------------
// Bad arguments: LOOM_ERR_INVALID_ARG, a message, and nothing written.

static void test_bad_args(void) {
  int64_t n = 6, m = 5;
  loom_tensor_t x = test_tensor_f32(1, &n, "x"), y = test_tensor_f32(1, &n, "y");
  loom_tensor_t y5 = test_tensor_f32(1, &m, "y5");
  loom_tensor_t h16 = test_tensor(LOOM_F16, 1, &n, "h16");
  loom_tensor_t i32 = test_tensor(LOOM_I32, 1, &n, "i32");
  for (int i = 0; i < 6; i++) {
    test_floats(&x)[i] = 1.0f + (float)i;
    test_floats(&y)[i] = 42.0f;
  }
  float x0[6];
  memcpy(x0, x.data, sizeof x0);
  double d = 42.0;
  uint64_t h = 42;

  loom_error_clear();
  test_expect_fail(loom_scale(NULL, 2.0f), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_scale",
                   NULL, "NULL x");
  test_expect_fail(loom_scale(&h16, 2.0f), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_scale",
                   NULL, "f16 x");
  test_expect_fail(loom_scale(&x, NAN), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_scale",
                   NULL, "NaN alpha");
  test_expect_fail(loom_scale(&x, INFINITY), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_scale", NULL, "Inf alpha");
  test_expect_fail(loom_axpy(NULL, 1.0f, &x), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "NULL y");
  test_expect_fail(loom_axpy(&y, 1.0f, NULL), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "NULL x");
  test_expect_fail(loom_axpy(&y, 1.0f, &h16), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "f16 x");
  test_expect_fail(loom_axpy(&i32, 1.0f, &x), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "i32 y");
  test_expect_fail(loom_axpy(&y5, 1.0f, &x), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "5 vs 6 elements");
  test_expect_fail(loom_axpy(&y, 1.0f, &y), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_axpy",
                   NULL, "x is y");
  loom_tensor_t shifted = y; // overlapping by all but one element
  shifted.data = test_floats(&y) + 1;
  shifted.shape[0] = 5;
  loom_tensor_t y_head = y;
  y_head.shape[0] = 5;
  test_expect_fail(loom_axpy(&y_head, 1.0f, &shifted), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "partial overlap");
  test_expect_fail(loom_axpy(&y, NAN, &x), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_axpy",
                   NULL, "NaN alpha");
  test_expect_fail(loom_norm2(NULL, &d), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_norm2",
                   NULL, "NULL x");
  test_expect_fail(loom_norm2(&x, NULL), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_norm2",
                   NULL, "NULL out");
  test_expect_fail(loom_norm2(&h16, &d), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_norm2",
                   NULL, "f16 x");
  test_expect_fail(loom_checksum(NULL, &h), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_checksum", NULL, "NULL x");
  test_expect_fail(loom_checksum(&x, NULL), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_checksum", NULL, "NULL out");
  loom_tensor_t odd = x;
  odd.dtype = LOOM_DTYPE_COUNT;
  test_expect_fail(loom_checksum(&odd, &h), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_checksum", NULL, "invalid dtype");
  odd = x;
  odd.data = NULL;
  test_expect_fail(loom_checksum(&odd, &h), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_checksum", NULL, "NULL data");
  odd = x;
  odd.device = 0;
  if (loom_cuda_device_count() == 0) { // with a GPU, x's host pointer would reach a kernel
    test_expect_fail(loom_norm2(&odd, &d), LOOM_ERR_UNSUPPORTED, LOOM_ERR_INVALID_ARG, "loom_norm2",
                     NULL, "CUDA x");
  }
  test_expect_fail(loom_axpy(&y, 1.0f, &odd), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   "loom_axpy", NULL, "x on another device");

  CHECK(!memcmp(x0, x.data, sizeof x0), "x written by a failed call");
  for (int i = 0; i < 6; i++) {
    CHECK(test_floats(&y)[i] == 42.0f, "y[%d] written by a failed call", i);
  }
  CHECK(d == 42.0 && h == 42, "outputs written by a failed call");
  TEST_FREE(&x, &y, &y5, &h16, &i32);
}

int main(void) {
  test_scale_axpy();
  test_scale_axpy_guards();
  test_norm2();
  test_checksum();
  test_bad_args();
  return check_exit("test_ops_util");
}
