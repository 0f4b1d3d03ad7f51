/* test_tensor.c — dtypes (sizes, names, parsing), tensor alloc/wrap/free/numel/bytes, argument
 * checks, alignment, host fill conversions for every dtype, copies, and device requests. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                                       \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

// A call that must fail with `want` and leave a message.
static void expect_status(loom_status_t got, loom_status_t want, const char *what) {
  if (got != want) {
    printf("FAIL: %s: got %s (%d), want %s (%d); last error: %s\n", what, loom_strerror(got),
           (int)got, loom_strerror(want), (int)want, loom_last_error(NULL));
    failures++;
  } else if (want != LOOM_OK && loom_last_error(NULL)[0] == '\0') {
    printf("FAIL: %s: failed as expected but left no error message\n", what);
    failures++;
  }
}

// ---------------------------------------------------------------------------------------------

static void test_dtypes(void) {
  static const struct {
    loom_dtype_t dtype;
    size_t size;
    const char *name;
  } table[] = {
      {LOOM_F32, 4, "f32"}, {LOOM_F16, 2, "f16"}, {LOOM_BF16, 2, "bf16"}, {LOOM_I8, 1, "i8"},
      {LOOM_U8, 1, "u8"},   {LOOM_I32, 4, "i32"}, {LOOM_I64, 8, "i64"},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    loom_dtype_t d = LOOM_DTYPE_COUNT;
    CHECK(loom_dtype_size(table[i].dtype) == table[i].size);
    CHECK(strcmp(loom_dtype_name(table[i].dtype), table[i].name) == 0);
    CHECK(loom_dtype_from_name(table[i].name, &d) == LOOM_OK && d == table[i].dtype);
  }
  CHECK(loom_dtype_size(LOOM_DTYPE_COUNT) == 0);
  CHECK(loom_dtype_size((loom_dtype_t)-1) == 0);
  CHECK(strcmp(loom_dtype_name(LOOM_DTYPE_COUNT), "invalid") == 0);
  CHECK(strcmp(loom_dtype_name((loom_dtype_t)99), "invalid") == 0);

  static const struct {
    const char *name;
    loom_dtype_t dtype;
  } aliases[] = {
      {"float32", LOOM_F32}, {"fp32", LOOM_F32}, {"FP32", LOOM_F32}, {"float16", LOOM_F16},
      {"fp16", LOOM_F16},    {"half", LOOM_F16}, {"Half", LOOM_F16}, {"bfloat16", LOOM_BF16},
      {"BF16", LOOM_BF16},   {"int8", LOOM_I8},  {"uint8", LOOM_U8}, {"int32", LOOM_I32},
      {"int64", LOOM_I64},   {"F32", LOOM_F32},  {"I64", LOOM_I64},
  };
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
    loom_dtype_t d = LOOM_DTYPE_COUNT;
    loom_status_t st = loom_dtype_from_name(aliases[i].name, &d);
    if (st != LOOM_OK || d != aliases[i].dtype) {
      printf("FAIL: loom_dtype_from_name(\"%s\") gave status %d dtype %d, want dtype %d\n",
             aliases[i].name, (int)st, (int)d, (int)aliases[i].dtype);
      failures++;
    }
  }

  const char *bad[] = {"f8", "", "float", "f32 ", "bf", "int16"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    loom_dtype_t d = LOOM_I8;
    expect_status(loom_dtype_from_name(bad[i], &d), LOOM_ERR_INVALID_ARG, bad[i]);
    CHECK(d == LOOM_I8); // untouched on failure
    CHECK(strstr(loom_last_error(NULL), "f32, f16, bf16, i8, u8, i32, i64") != NULL);
  }
  loom_dtype_t d = LOOM_I8;
  expect_status(loom_dtype_from_name("float8", &d), LOOM_ERR_INVALID_ARG, "unknown dtype");
  CHECK(strstr(loom_last_error(NULL), "'float8'") != NULL);
  expect_status(loom_dtype_from_name(NULL, &d), LOOM_ERR_INVALID_ARG, "NULL dtype name");
  expect_status(loom_dtype_from_name("f32", NULL), LOOM_ERR_INVALID_ARG, "NULL dtype out");
}

// ---------------------------------------------------------------------------------------------

static void test_alloc_wrap_free(void) {
  loom_tensor_t t;
  int64_t shape[3] = {2, 3, 5};
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 3, shape, "weights"), LOOM_OK,
                "alloc f32 (2, 3, 5)");
  CHECK(t.data != NULL && t.owns_data == 1 && t.device == LOOM_DEVICE_HOST);
  CHECK(t.dtype == LOOM_F32 && t.ndim == 3 && t.shape[0] == 2 && t.shape[2] == 5);
  CHECK(strcmp(t.name, "weights") == 0);
  CHECK(loom_tensor_numel(&t) == 30);
  CHECK(loom_tensor_bytes(&t) == 120);
  CHECK((uintptr_t)t.data % 64 == 0);
  const unsigned char *bytes = t.data;
  int zero = 1;
  for (size_t i = 0; i < loom_tensor_bytes(&t); i++) {
    zero &= bytes[i] == 0;
  }
  CHECK(zero);
  loom_tensor_free(&t);
  CHECK(t.data == NULL && t.owns_data == 0 && t.ndim == 0);
  loom_tensor_free(&t); // freeing twice is harmless
  loom_tensor_free(NULL);

  // Alignment for several sizes and dtypes; NULL name gives an empty one.
  for (int64_t n = 1; n < 200; n += 37) {
    for (int dt = 0; dt < LOOM_DTYPE_COUNT; dt++) {
      CHECK(loom_tensor_alloc(&t, (loom_dtype_t)dt, LOOM_DEVICE_HOST, 1, &n, NULL) == LOOM_OK);
      CHECK((uintptr_t)t.data % 64 == 0);
      CHECK(t.name[0] == '\0');
      CHECK(loom_tensor_bytes(&t) == (size_t)n * loom_dtype_size((loom_dtype_t)dt));
      loom_tensor_free(&t);
    }
  }

  // Scalar: ndim 0 has one element; shape may be NULL.
  CHECK(loom_tensor_alloc(&t, LOOM_I64, LOOM_DEVICE_HOST, 0, NULL, "step") == LOOM_OK);
  CHECK(loom_tensor_numel(&t) == 1 && loom_tensor_bytes(&t) == 8 && t.data != NULL);
  loom_tensor_free(&t);

  // Zero elements: valid, no memory.
  int64_t empty[2] = {4, 0};
  CHECK(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 2, empty, "empty") == LOOM_OK);
  CHECK(loom_tensor_numel(&t) == 0 && loom_tensor_bytes(&t) == 0 && t.data == NULL);
  CHECK(loom_tensor_fill(&t, 1.0) == LOOM_OK);
  loom_tensor_t t2;
  CHECK(loom_tensor_alloc(&t2, LOOM_F32, LOOM_DEVICE_HOST, 1, &empty[1], NULL) == LOOM_OK);
  CHECK(loom_tensor_copy(&t2, &t) == LOOM_OK);
  loom_tensor_free(&t2);
  loom_tensor_free(&t);

  // Maximum dims and the longest allowed name.
  int64_t eight[LOOM_MAX_DIMS] = {1, 2, 1, 2, 1, 2, 1, 3};
  char longest[LOOM_NAME_MAX];
  memset(longest, 'n', sizeof longest - 1);
  longest[sizeof longest - 1] = '\0';
  CHECK(loom_tensor_alloc(&t, LOOM_U8, LOOM_DEVICE_HOST, LOOM_MAX_DIMS, eight, longest) == LOOM_OK);
  CHECK(loom_tensor_numel(&t) == 24 && strcmp(t.name, longest) == 0);
  loom_tensor_free(&t);

  // Wrap: describes caller memory and never frees it.
  float buf[6] = {1, 2, 3, 4, 5, 6}; // (2, 3)
  int64_t s23[2] = {2, 3};
  CHECK(loom_tensor_wrap(&t, buf, LOOM_F32, LOOM_DEVICE_HOST, 2, s23, "buf") == LOOM_OK);
  CHECK(t.data == buf && t.owns_data == 0 && loom_tensor_numel(&t) == 6);
  CHECK(loom_tensor_fill(&t, 7.0) == LOOM_OK);
  CHECK(buf[0] == 7.0f && buf[5] == 7.0f);
  loom_tensor_free(&t);
  CHECK(t.data == NULL);
  buf[0] = 8.0f; // still ours
  CHECK(buf[0] == 8.0f);
  expect_status(loom_tensor_wrap(&t, NULL, LOOM_F32, LOOM_DEVICE_HOST, 2, s23, "null"),
                LOOM_ERR_INVALID_ARG, "wrap NULL data with 6 elements");
  CHECK(loom_tensor_wrap(&t, NULL, LOOM_F32, LOOM_DEVICE_HOST, 2, empty, "null") == LOOM_OK);

  // Re-describing a tensor in place, from its own shape and name (a reshaped view keeps its
  // name, the stable identity of compression state and checkpoints): both are read before t is
  // cleared (the name came out empty, the shape all zeros: a 0-element tensor, without error).
  CHECK(loom_tensor_wrap(&t, buf, LOOM_F32, LOOM_DEVICE_HOST, 2, s23, "grad.w") == LOOM_OK);
  int64_t s6 = 6;
  CHECK(loom_tensor_wrap(&t, t.data, t.dtype, t.device, 1, &s6, t.name) == LOOM_OK);
  CHECK(strcmp(t.name, "grad.w") == 0 && t.ndim == 1 && t.shape[0] == 6 && t.data == buf);
  CHECK(loom_tensor_wrap(&t, t.data, LOOM_I32, t.device, t.ndim, t.shape, t.name) == LOOM_OK);
  CHECK(strcmp(t.name, "grad.w") == 0 && loom_tensor_numel(&t) == 6 && t.dtype == LOOM_I32);
  loom_tensor_t a;
  CHECK(loom_tensor_alloc(&a, LOOM_F32, LOOM_DEVICE_HOST, 3, shape, "moments") == LOOM_OK);
  loom_tensor_t keep = a; // owns the memory; a is about to be reused for a second buffer
  CHECK(loom_tensor_alloc(&a, LOOM_F16, LOOM_DEVICE_HOST, a.ndim, a.shape, a.name) == LOOM_OK);
  CHECK(strcmp(a.name, "moments") == 0 && a.ndim == 3 && loom_tensor_numel(&a) == 30 &&
        a.data != NULL && a.data != keep.data);
  loom_tensor_free(&a);
  loom_tensor_free(&keep);
}

static void test_bad_args(void) {
  loom_tensor_t t;
  int64_t shape[LOOM_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 9, shape, "nine"),
                LOOM_ERR_INVALID_ARG, "ndim 9");
  CHECK(strstr(loom_last_error(NULL), "0..8") != NULL);
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, -1, shape, "neg"),
                LOOM_ERR_INVALID_ARG, "ndim -1");
  int64_t neg[2] = {3, -2};
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 2, neg, "neg"),
                LOOM_ERR_INVALID_ARG, "negative extent");
  CHECK(strstr(loom_last_error(NULL), "shape[1]") != NULL);
  CHECK(t.data == NULL);
  loom_tensor_free(&t); // safe after a failed alloc
  expect_status(loom_tensor_alloc(NULL, LOOM_F32, LOOM_DEVICE_HOST, 1, shape, "x"),
                LOOM_ERR_INVALID_ARG, "NULL tensor");
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 2, NULL, "x"),
                LOOM_ERR_INVALID_ARG, "NULL shape with ndim 2");
  expect_status(loom_tensor_alloc(&t, LOOM_DTYPE_COUNT, LOOM_DEVICE_HOST, 1, shape, "x"),
                LOOM_ERR_INVALID_ARG, "invalid dtype");
  expect_status(loom_tensor_alloc(&t, LOOM_F32, -2, 1, shape, "x"), LOOM_ERR_INVALID_ARG,
                "device -2");
  char too_long[LOOM_NAME_MAX + 1];
  memset(too_long, 'x', sizeof too_long - 1);
  too_long[sizeof too_long - 1] = '\0';
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 1, shape, too_long),
                LOOM_ERR_INVALID_ARG, "name of LOOM_NAME_MAX characters");
  int64_t huge[3] = {INT64_MAX / 2, 4, 1};
  expect_status(loom_tensor_alloc(&t, LOOM_F32, LOOM_DEVICE_HOST, 3, huge, "huge"),
                LOOM_ERR_INVALID_ARG, "element count overflow");
  int64_t big[2] = {(int64_t)1 << 62, 2};
  expect_status(loom_tensor_alloc(&t, LOOM_I64, LOOM_DEVICE_HOST, 2, big, "big"),
                LOOM_ERR_INVALID_ARG, "byte count overflow");
  expect_status(loom_tensor_wrap(NULL, shape, LOOM_F32, LOOM_DEVICE_HOST, 1, shape, "x"),
                LOOM_ERR_INVALID_ARG, "wrap NULL tensor");
  expect_status(loom_tensor_fill(NULL, 1.0), LOOM_ERR_INVALID_ARG, "fill NULL tensor");

  // A tensor whose data vanished.
  memset(&t, 0, sizeof t);
  t.dtype = LOOM_F32;
  t.device = LOOM_DEVICE_HOST;
  t.ndim = 1;
  t.shape[0] = 4;
  expect_status(loom_tensor_fill(&t, 1.0), LOOM_ERR_INVALID_ARG, "fill with NULL data");
  t.dtype = (loom_dtype_t)42;
  expect_status(loom_tensor_fill(&t, 1.0), LOOM_ERR_INVALID_ARG, "fill with invalid dtype");
}

// ---------------------------------------------------------------------------------------------
// Fill on the host: the stored bit pattern for each dtype.

static loom_tensor_t filled(loom_dtype_t dtype, double value) {
  loom_tensor_t t;
  int64_t n = 37;
  if (loom_tensor_alloc(&t, dtype, LOOM_DEVICE_HOST, 1, &n, "fill") != LOOM_OK ||
      loom_tensor_fill(&t, value) != LOOM_OK) {
    printf("FAIL: alloc/fill %s with %g: %s\n", loom_dtype_name(dtype), value,
           loom_last_error(NULL));
    failures++;
  }
  return t;
}

// Every element of t (37 of them) has the bytes of *want.
static void check_all(loom_tensor_t *t, const void *want, const char *what) {
  size_t size = loom_dtype_size(t->dtype);
  const unsigned char *p = t->data;
  for (int64_t i = 0; p != NULL && i < loom_tensor_numel(t); i++) {
    if (memcmp(p + (size_t)i * size, want, size) != 0) {
      printf("FAIL: fill %s: element %lld differs from the expected bits\n", what, (long long)i);
      failures++;
      break;
    }
  }
  loom_tensor_free(t);
}

static void fill_f32(double v, float want, const char *what) {
  loom_tensor_t t = filled(LOOM_F32, v);
  check_all(&t, &want, what);
}

static void fill_u16(loom_dtype_t dtype, double v, uint16_t want, const char *what) {
  loom_tensor_t t = filled(dtype, v);
  if (t.data != NULL && ((uint16_t *)t.data)[0] != want) {
    printf("FAIL: fill %s %s: got 0x%04X, want 0x%04X\n", loom_dtype_name(dtype), what,
           ((uint16_t *)t.data)[0], want);
    failures++;
  }
  check_all(&t, &want, what);
}

static void fill_i8(double v, int8_t want, const char *what) {
  loom_tensor_t t = filled(LOOM_I8, v);
  if (t.data != NULL && ((int8_t *)t.data)[0] != want) {
    printf("FAIL: fill i8 %s: got %d, want %d\n", what, ((int8_t *)t.data)[0], want);
    failures++;
  }
  check_all(&t, &want, what);
}

static void fill_u8(double v, uint8_t want, const char *what) {
  loom_tensor_t t = filled(LOOM_U8, v);
  if (t.data != NULL && ((uint8_t *)t.data)[0] != want) {
    printf("FAIL: fill u8 %s: got %u, want %u\n", what, ((uint8_t *)t.data)[0], want);
    failures++;
  }
  check_all(&t, &want, what);
}

static void fill_i32(double v, int32_t want, const char *what) {
  loom_tensor_t t = filled(LOOM_I32, v);
  if (t.data != NULL && ((int32_t *)t.data)[0] != want) {
    printf("FAIL: fill i32 %s: got %d, want %d\n", what, ((int32_t *)t.data)[0], want);
    failures++;
  }
  check_all(&t, &want, what);
}

static void fill_i64(double v, int64_t want, const char *what) {
  loom_tensor_t t = filled(LOOM_I64, v);
  if (t.data != NULL && ((int64_t *)t.data)[0] != want) {
    printf("FAIL: fill i64 %s: got %lld, want %lld\n", what, (long long)((int64_t *)t.data)[0],
           (long long)want);
    failures++;
  }
  check_all(&t, &want, what);
}

static void test_fill(void) {
  fill_f32(1.5, 1.5f, "f32 1.5");
  fill_f32(-0.1, -0.1f, "f32 -0.1 (rounded to nearest)");
  fill_f32(1e300, INFINITY, "f32 overflow");
  fill_u16(LOOM_F16, 1.5, 0x3E00, "1.5");
  fill_u16(LOOM_F16, -2.0, 0xC000, "-2");
  fill_u16(LOOM_F16, 65504.0, 0x7BFF, "max");
  fill_u16(LOOM_F16, 65520.0, 0x7C00, "overflow");
  fill_u16(LOOM_F16, 1e300, 0x7C00, "huge");
  fill_u16(LOOM_F16, -0.0, 0x8000, "-0");
  fill_u16(LOOM_F16, ldexp(1, -24), 0x0001, "smallest subnormal");
  // Rounded once from the double: a (float) cast first would make this the tie 1 + 2^-11 and
  // then round it down to 1.0.
  fill_u16(LOOM_F16, 1 + ldexp(1, -11) + ldexp(1, -40), 0x3C01, "just above a tie");
  fill_u16(LOOM_F16, 1 + ldexp(1, -11), 0x3C00, "tie to even");
  fill_u16(LOOM_BF16, 1.5, 0x3FC0, "1.5");
  fill_u16(LOOM_BF16, 1 + ldexp(1, -8), 0x3F80, "tie to even");
  fill_u16(LOOM_BF16, 1 + ldexp(1, -8) + ldexp(1, -40), 0x3F81, "just above a tie");
  fill_u16(LOOM_BF16, 1e300, 0x7F80, "huge");
  fill_u16(LOOM_BF16, -INFINITY, 0xFF80, "-Inf");
  {
    loom_tensor_t t = filled(LOOM_F16, NAN);
    uint16_t h = t.data != NULL ? ((uint16_t *)t.data)[0] : 0;
    CHECK((h & 0x7FFF) > 0x7C00);
    loom_tensor_free(&t);
    t = filled(LOOM_BF16, NAN);
    h = t.data != NULL ? ((uint16_t *)t.data)[0] : 0;
    CHECK((h & 0x7FFF) > 0x7F80);
    loom_tensor_free(&t);
    t = filled(LOOM_F32, NAN);
    CHECK(t.data != NULL && isnan(((float *)t.data)[0]));
    loom_tensor_free(&t);
  }

  fill_i8(300, 127, "300 saturates");
  fill_i8(-300, -128, "-300 saturates");
  fill_i8(-5, -5, "-5");
  fill_i8(INFINITY, 127, "+Inf");
  fill_u8(300, 255, "300 saturates");
  fill_u8(-5, 0, "-5 saturates");
  fill_u8(254.5, 255, "254.5 rounds up");
  fill_u8(NAN, 0, "NaN");
  fill_i32(NAN, 0, "NaN");
  fill_i32(2.5, 3, "2.5 rounds away from zero");
  fill_i32(-2.5, -3, "-2.5 rounds away from zero");
  fill_i32(2.4999, 2, "2.4999");
  fill_i32(0.49999999999999994, 0, "largest double below 0.5");
  fill_i32(-0.5, -1, "-0.5");
  fill_i32(1e10, INT32_MAX, "1e10 saturates");
  fill_i32(-1e10, INT32_MIN, "-1e10 saturates");
  fill_i32(-INFINITY, INT32_MIN, "-Inf");
  fill_i64(1e19, INT64_MAX, "1e19 saturates");
  fill_i64(-1e19, INT64_MIN, "-1e19 saturates");
  fill_i64(-9223372036854775808.0, INT64_MIN, "-2^63");
  fill_i64(4503599627370497.0, 4503599627370497LL, "2^52 + 1");
  fill_i64(-3.5, -4, "-3.5");
  fill_i64(NAN, 0, "NaN");
}

// ---------------------------------------------------------------------------------------------

static void test_copy(void) {
  loom_tensor_t a, b, c;
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s7[1] = {7};
  CHECK(loom_tensor_alloc(&a, LOOM_I32, LOOM_DEVICE_HOST, 2, s23, "a") == LOOM_OK);
  CHECK(loom_tensor_alloc(&b, LOOM_I32, LOOM_DEVICE_HOST, 2, s32, "b") == LOOM_OK);
  for (int i = 0; i < 6; i++) {
    ((int32_t *)a.data)[i] = i * 11 - 7;
  }
  CHECK(loom_tensor_copy(&b, &a) == LOOM_OK); // same count, different shape: allowed
  CHECK(memcmp(a.data, b.data, 6 * sizeof(int32_t)) == 0);
  CHECK(loom_tensor_copy(&a, &a) == LOOM_OK);
  { // Overlapping views of one host buffer (a shift by one element): copied as by memmove.
    loom_tensor_t lo, hi;
    int64_t s5[1] = {5};
    CHECK(loom_tensor_wrap(&lo, a.data, LOOM_I32, LOOM_DEVICE_HOST, 1, s5, "lo") == LOOM_OK);
    CHECK(loom_tensor_wrap(&hi, (int32_t *)a.data + 1, LOOM_I32, LOOM_DEVICE_HOST, 1, s5, "hi") ==
          LOOM_OK);
    CHECK(loom_tensor_copy(&hi, &lo) == LOOM_OK);
    const int32_t *v = a.data;
    CHECK(v[0] == -7 && v[1] == -7 && v[2] == 4 && v[3] == 15 && v[4] == 26 && v[5] == 37);
  }

  CHECK(loom_tensor_alloc(&c, LOOM_F32, LOOM_DEVICE_HOST, 2, s23, "c") == LOOM_OK);
  expect_status(loom_tensor_copy(&c, &a), LOOM_ERR_INVALID_ARG, "copy i32 into f32");
  CHECK(strstr(loom_last_error(NULL), "i32") != NULL && strstr(loom_last_error(NULL), "f32"));
  loom_tensor_free(&c);
  CHECK(loom_tensor_alloc(&c, LOOM_I32, LOOM_DEVICE_HOST, 1, s7, "c") == LOOM_OK);
  expect_status(loom_tensor_copy(&c, &a), LOOM_ERR_INVALID_ARG, "copy 6 elements into 7");
  CHECK(strstr(loom_last_error(NULL), "(2, 3)") != NULL &&
        strstr(loom_last_error(NULL), "(7)") != NULL);
  expect_status(loom_tensor_copy(NULL, &a), LOOM_ERR_INVALID_ARG, "copy into NULL");
  expect_status(loom_tensor_copy(&c, NULL), LOOM_ERR_INVALID_ARG, "copy from NULL");
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
}

// Device tensors: without a visible GPU every request fails with a reason.
static void test_device_requests(void) {
  int count = loom_cuda_device_count();
  loom_tensor_t t;
  int64_t n = 16;
  printf("test_tensor: %d CUDA device(s) visible\n", count);
  if (count == 0) {
    loom_status_t st = loom_tensor_alloc(&t, LOOM_F32, 0, 1, &n, "gpu");
#ifdef LOOM_HAVE_CUDA
    expect_status(st, LOOM_ERR_INVALID_ARG, "device tensor in a CUDA build without a GPU");
#else
    expect_status(st, LOOM_ERR_UNSUPPORTED, "device tensor in a build without CUDA");
    CHECK(strstr(loom_last_error(NULL), "--with-cuda") != NULL);
#endif
    CHECK(st == LOOM_ERR_UNSUPPORTED || st == LOOM_ERR_INVALID_ARG);
    CHECK(loom_last_error(NULL)[0] != '\0');
    CHECK(t.data == NULL);
    loom_tensor_free(&t);
    float x = 0;
    st = loom_tensor_wrap(&t, &x, LOOM_F32, 0, 0, NULL, "gpu");
    CHECK(st == LOOM_ERR_UNSUPPORTED || st == LOOM_ERR_INVALID_ARG);
    // A host tensor pretending to live on device 0: fill and copy refuse it too.
    CHECK(loom_tensor_wrap(&t, &x, LOOM_F32, LOOM_DEVICE_HOST, 0, NULL, "x") == LOOM_OK);
    t.device = 0;
    st = loom_tensor_fill(&t, 1.0);
    CHECK(st == LOOM_ERR_UNSUPPORTED || st == LOOM_ERR_INVALID_ARG);
    loom_tensor_t h;
    CHECK(loom_tensor_wrap(&h, &x, LOOM_F32, LOOM_DEVICE_HOST, 0, NULL, "h") == LOOM_OK);
    st = loom_tensor_copy(&h, &t);
    CHECK(st == LOOM_ERR_UNSUPPORTED || st == LOOM_ERR_INVALID_ARG);
    CHECK(x == 0.0f);
  } else {
    expect_status(loom_tensor_alloc(&t, LOOM_F32, count, 1, &n, "gpu"), LOOM_ERR_INVALID_ARG,
                  "device index == device count");
  }
}

int main(void) {
  test_dtypes();
  test_alloc_wrap_free();
  test_bad_args();
  test_fill();
  test_copy();
  test_device_requests();
  if (failures > 0) {
    printf("test_tensor: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_tensor: all checks passed\n");
  return 0;
}
