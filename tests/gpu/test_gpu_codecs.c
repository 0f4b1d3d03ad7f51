/* test_gpu_codecs.c — the device codecs against the CPU codecs: same payload bytes, cross decoding
 * (device payload on the host, host payload on the device), corrupt payloads, error feedback. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "cuda/codecs_cuda.h"
#include "gpu_test.h"

// Comparisons are exact (bits; any NaN equals any NaN, as NaN payloads differ between x86 and the
// GPU): the device codecs do the same float operations as the CPU ones, element by element, in
// the same order, with no FMA contraction; the only sums (int8's max, efsign's mean magnitude)
// are an exact max and a scale proven equal to the CPU's (codecs_cuda.cu, efsign_scale).

static const char *kTest = "test_gpu_codecs";

static const char *const kSpecs[] = {"none",    "fp16",      "bf16",         "int8",
                                     "int8:sr", "topk:0.01", "randomk:0.01", "efsign"};
#define NSPECS ((int)(sizeof kSpecs / sizeof kSpecs[0]))

// ---------------------------------------------------------------------------------------------
// Device buffers: loom tensors on device 0, with raw copies through wrapped host memory.

static loom_tensor_t dev_alloc(loom_dtype_t dt, int64_t n, const char *name) {
  loom_tensor_t d;
  loom_status_t st = loom_tensor_alloc(&d, dt, 0, 1, &n, name);
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: device allocation of %s: %s\n", name, loom_last_error(NULL));
    exit(1);
  }
  return d;
}

// Copy bytes between host memory and device memory (dir 1: to the device).
static void copy_bytes(void *dev, void *host, size_t bytes, int to_device) {
  if (bytes == 0) {
    return;
  }
  int64_t n = (int64_t)bytes;
  loom_tensor_t h, d;
  loom_status_t st = loom_tensor_wrap(&h, host, LOOM_U8, LOOM_DEVICE_HOST, 1, &n, "host");
  if (st == LOOM_OK) {
    st = loom_tensor_wrap(&d, dev, LOOM_U8, 0, 1, &n, "dev");
  }
  if (st == LOOM_OK) {
    st = to_device ? loom_tensor_copy(&d, &h) : loom_tensor_copy(&h, &d);
  }
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: copy of %zu bytes: %s\n", bytes, loom_last_error(NULL));
    exit(1);
  }
}

static void to_dev(void *dev, const void *host, size_t bytes) {
  copy_bytes(dev, (void *)host, bytes, 1);
}

static void from_dev(void *host, const void *dev, size_t bytes) {
  copy_bytes((void *)dev, host, bytes, 0);
}

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes > 0 ? bytes : 1);
  if (!p) {
    fprintf(stderr, "FAIL: out of host memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

// 1 when a[0..n) and b[0..n) are the same floats (bits; NaN equals NaN); else reports the first
// difference.
static int same_floats(const char *what, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t ua, ub;
    memcpy(&ua, &a[i], 4);
    memcpy(&ub, &b[i], 4);
    if (ua != ub && !(isnan(a[i]) && isnan(b[i]))) {
      CHECK(0, "%s: element %lld of %lld: %.9g (0x%08x) vs %.9g (0x%08x)", what, (long long)i,
            (long long)n, (double)a[i], ua, (double)b[i], ub);
      return 0;
    }
  }
  return 1;
}

static int same_bytes(const char *what, const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
  if (na != nb) {
    CHECK(0, "%s: %zu bytes vs %zu", what, na, nb);
    return 0;
  }
  for (size_t i = 0; i < na; i++) {
    if (a[i] != b[i]) {
      CHECK(0, "%s: byte %zu of %zu: 0x%02x vs 0x%02x%s", what, i, na, a[i], b[i],
            i < LOOM_PAYLOAD_HEADER ? " (header)" : "");
      return 0;
    }
  }
  return 1;
}

// Inputs: uniform in [-1, 1]; or ("ties") few distinct magnitudes, so top-k must break ties.
static void make_input(float *x, int64_t n, uint64_t seed, int ties) {
  test_rng_t r = test_rng(seed);
  for (int64_t i = 0; i < n; i++) {
    x[i] = ties ? (float)test_int(&r, -8, 8) / 8.0f : (float)test_uniform(&r, -1, 1);
  }
}

// ---------------------------------------------------------------------------------------------
// Encode on both sides, compare the bytes, decode each side's payload on the other side.

static void codec_case(const loom_compressor_t *c, int64_t n, int ties, int misalign,
                       const float *x_in) {
  char what[160];
  snprintf(what, sizeof what, "%s n=%lld%s%s%s", loom_compressor_name(c), (long long)n,
           ties ? " ties" : "", misalign ? " odd address" : "", x_in ? " given input" : "");
  const uint64_t seed = 0x5eed0000ull + (uint64_t)n;
  const size_t cap = loom_compressor_max_bytes(c, n);
  float *x = xmalloc(sizeof(float) * (size_t)n), *acc0 = xmalloc(sizeof(float) * (size_t)n);
  float *acc_h = xmalloc(sizeof(float) * (size_t)n), *acc_d = xmalloc(sizeof(float) * (size_t)n);
  uint8_t *pay_h = xmalloc(cap), *pay_d = xmalloc(cap);
  if (x_in) {
    memcpy(x, x_in, sizeof(float) * (size_t)n);
  } else {
    make_input(x, n, seed, ties);
  }
  make_input(acc0, n, seed + 1, 0);

  loom_tensor_t dx = dev_alloc(LOOM_F32, n, "x"), dacc = dev_alloc(LOOM_F32, n, "acc");
  loom_tensor_t dpay = dev_alloc(LOOM_U8, (int64_t)cap + 1, "payload");
  uint8_t *dp = (uint8_t *)dpay.data + (misalign ? 1 : 0);
  to_dev(dx.data, x, sizeof(float) * (size_t)n);

  // Encode.
  size_t bytes_h = 0, bytes_d = 0;
  loom_status_t st = loom_codec_encode(c, x, n, seed, pay_h, cap, &bytes_h);
  CHECK(st == LOOM_OK, "%s: host encode: %s", what, loom_last_error(NULL));
  st = loom_cuda_codec_encode(c, (const float *)dx.data, n, seed, dp, cap, &bytes_d);
  CHECK(st == LOOM_OK, "%s: device encode: %s", what, loom_last_error(NULL));
  if (st != LOOM_OK) {
    goto done;
  }
  from_dev(pay_d, dp, bytes_d);
  {
    char w[200];
    snprintf(w, sizeof w, "%s: payload bytes (device vs host)", what);
    same_bytes(w, pay_d, bytes_d, pay_h, bytes_h);
  }

  // Device payload decoded on the host; host payload decoded on the device.
  memcpy(acc_h, acc0, sizeof(float) * (size_t)n);
  st = loom_codec_decode_add(c, pay_d, bytes_d, n, seed, acc_h);
  CHECK(st == LOOM_OK, "%s: host decode of the device payload: %s", what, loom_last_error(NULL));
  to_dev(dp, pay_h, bytes_h);
  to_dev(dacc.data, acc0, sizeof(float) * (size_t)n);
  st = loom_cuda_codec_decode_add(c, dp, bytes_h, n, seed, (float *)dacc.data);
  CHECK(st == LOOM_OK, "%s: device decode of the host payload: %s", what, loom_last_error(NULL));
  from_dev(acc_d, dacc.data, sizeof(float) * (size_t)n);
  {
    char w[200];
    snprintf(w, sizeof w, "%s: decode_add (device vs host)", what);
    same_floats(w, acc_d, acc_h, n);
  }

done:
  TEST_FREE(&dx, &dacc, &dpay);
  free(x);
  free(acc0);
  free(acc_h);
  free(acc_d);
  free(pay_h);
  free(pay_d);
  loom_error_clear();
}

static void test_codecs(void) {
  const int64_t sizes[] = {0, 1, 1000, (1 << 20) + 7};
  for (int s = 0; s < NSPECS; s++) {
    loom_compressor_t *c = NULL;
    CHECK(loom_compressor_create(kSpecs[s], &c) == LOOM_OK, "%s: %s", kSpecs[s],
          loom_last_error(NULL));
    if (!c) {
      continue;
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
      codec_case(c, sizes[i], 0, 0, NULL);
      codec_case(c, sizes[i], 1, 0, NULL);
    }
    codec_case(c, 1001, 0, 1, NULL); // payload at an odd address: byte-wise access
    loom_compressor_destroy(c);
  }
}

// Special inputs: non-finite values (flagged payloads for int8, top-k and efsign; carried by the
// others), and efsign means that sit on a float rounding boundary (the exact-sum fallback).
static void test_special_inputs(void) {
  float x[1000];
  make_input(x, 1000, 77, 0);
  x[500] = INFINITY;
  for (int s = 0; s < NSPECS; s++) {
    loom_compressor_t *c = NULL;
    if (loom_compressor_create(kSpecs[s], &c) == LOOM_OK) {
      codec_case(c, 1000, 0, 0, x);
      x[500] = NAN;
      codec_case(c, 1000, 0, 0, x);
      x[500] = INFINITY;
      loom_compressor_destroy(c);
    }
  }
  // efsign: mean of {1, 1 + 2^-23} is 1 + 2^-24, halfway between two floats: the device sum's
  // error bound straddles the boundary, so the exact CPU-order sum decides (round to even: 1).
  loom_compressor_t *c = NULL;
  if (loom_compressor_create("efsign", &c) == LOOM_OK) {
    float mid[16];
    for (int i = 0; i < 16; i++) {
      mid[i] = i % 2 ? 1.0f + 0x1p-23f : -1.0f;
    }
    codec_case(c, 2, 0, 0, mid);
    codec_case(c, 16, 0, 0, mid);
    codec_case(c, 13, 0, 0, mid); // a tail after the 8-lane part
    loom_compressor_destroy(c);
  }
}

// ---------------------------------------------------------------------------------------------
// Corrupt payloads: LOOM_ERR_CORRUPT and acc untouched.

typedef enum {
  DMG_MAGIC,
  DMG_TRUNCATED,
  DMG_LONGER,
  DMG_INDEX,
  DMG_REPEATED,
  DMG_INT8_MIN,
  DMG_SCALE,
  DMG_PADDING
} damage_t;

static const char *const kDamage[] = {"bad magic",          "truncated",      "too long",
                                      "index out of range", "repeated index", "int8 -128",
                                      "negative scale",     "padding bits"};

static void corrupt_case(const loom_compressor_t *c, int64_t n, damage_t damage) {
  const uint64_t seed = 99;
  const size_t cap = loom_compressor_max_bytes(c, n);
  float *x = xmalloc(sizeof(float) * (size_t)n), *acc0 = xmalloc(sizeof(float) * (size_t)n),
        *acc = xmalloc(sizeof(float) * (size_t)n);
  uint8_t *pay = xmalloc(cap + 1);
  size_t bytes = 0;
  char what[160];
  snprintf(what, sizeof what, "%s n=%lld %s", loom_compressor_name(c), (long long)n,
           kDamage[damage]);
  make_input(x, n, 5, 0);
  make_input(acc0, n, 6, 0);
  CHECK(loom_codec_encode(c, x, n, seed, pay, cap, &bytes) == LOOM_OK, "%s: encode: %s", what,
        loom_last_error(NULL));
  const int64_t k = loom_codec_keep(c, n);
  uint8_t *body = pay + LOOM_PAYLOAD_HEADER;
  switch (damage) {
  case DMG_MAGIC:
    pay[0] ^= 0xFF;
    break;
  case DMG_TRUNCATED:
    bytes -= 1;
    break;
  case DMG_LONGER:
    pay[bytes] = 0;
    bytes += 1;
    break;
  case DMG_INDEX: { // the last top-k index: n (one past the end)
    uint32_t bad = (uint32_t)n;
    memcpy(body + 4 * (k - 1), &bad, 4);
    break;
  }
  case DMG_REPEATED: // index 1 = index 0
    memcpy(body + 4, body, 4);
    break;
  case DMG_INT8_MIN:
    body[4 + n / 2] = 0x80;
    break;
  case DMG_SCALE: {
    float neg = -1.0f;
    memcpy(body, &neg, 4);
    break;
  }
  case DMG_PADDING: // a bit after the last sign
    body[4 + n / 8] |= (uint8_t)(0x80u);
    break;
  }
  loom_tensor_t dacc = dev_alloc(LOOM_F32, n, "acc"),
                dpay = dev_alloc(LOOM_U8, (int64_t)cap + 1, "payload");
  to_dev(dacc.data, acc0, sizeof(float) * (size_t)n);
  to_dev(dpay.data, pay, bytes);
  loom_error_clear();
  loom_status_t st =
      loom_cuda_codec_decode_add(c, (const uint8_t *)dpay.data, bytes, n, seed, (float *)dacc.data);
  CHECK(st == LOOM_ERR_CORRUPT, "%s: got %s, want %s (%s)", what, loom_strerror(st),
        loom_strerror(LOOM_ERR_CORRUPT), loom_last_error(NULL));
  // The CPU decoder agrees that the payload is corrupt.
  memcpy(acc, acc0, sizeof(float) * (size_t)n);
  CHECK(loom_codec_decode_add(c, pay, bytes, n, seed, acc) == LOOM_ERR_CORRUPT,
        "%s: the host decoder accepts it", what);
  from_dev(acc, dacc.data, sizeof(float) * (size_t)n);
  char w[200];
  snprintf(w, sizeof w, "%s: acc must be unchanged", what);
  same_floats(w, acc, acc0, n);
  loom_error_clear();
  TEST_FREE(&dacc, &dpay);
  free(x);
  free(acc0);
  free(acc);
  free(pay);
}

static void test_corrupt(void) {
  for (int s = 0; s < NSPECS; s++) {
    loom_compressor_t *c = NULL;
    if (loom_compressor_create(kSpecs[s], &c) != LOOM_OK) {
      continue;
    }
    const int64_t n = 1003; // 1003 % 8 = 3: efsign has padding bits
    corrupt_case(c, n, DMG_MAGIC);
    corrupt_case(c, n, DMG_TRUNCATED);
    corrupt_case(c, n, DMG_LONGER);
    if (!strncmp(kSpecs[s], "topk", 4)) {
      corrupt_case(c, n, DMG_INDEX);
      corrupt_case(c, n, DMG_REPEATED);
    }
    if (!strncmp(kSpecs[s], "int8", 4)) {
      corrupt_case(c, n, DMG_INT8_MIN);
      corrupt_case(c, n, DMG_SCALE);
    }
    if (!strcmp(kSpecs[s], "efsign")) {
      corrupt_case(c, n, DMG_SCALE);
      corrupt_case(c, n, DMG_PADDING);
    }
    loom_compressor_destroy(c);
  }
  // Shorter than a header.
  loom_compressor_t *c = NULL;
  if (loom_compressor_create("fp16", &c) == LOOM_OK) {
    loom_tensor_t dacc = dev_alloc(LOOM_F32, 4, "acc"), dpay = dev_alloc(LOOM_U8, 16, "payload");
    loom_status_t st =
        loom_cuda_codec_decode_add(c, (const uint8_t *)dpay.data, 15, 4, 0, (float *)dacc.data);
    CHECK(st == LOOM_ERR_CORRUPT, "15-byte payload: got %s", loom_strerror(st));
    loom_error_clear();
    TEST_FREE(&dacc, &dpay);
    loom_compressor_destroy(c);
  }
}

// ---------------------------------------------------------------------------------------------
// Error feedback and refusals.

static void ef_case(const loom_compressor_t *c, int64_t n) {
  char what[160];
  snprintf(what, sizeof what, "ef_encode %s n=%lld", loom_compressor_name(c), (long long)n);
  const uint64_t seed = 4242 + (uint64_t)n;
  const size_t cap = loom_compressor_max_bytes(c, n);
  const size_t fb = sizeof(float) * (size_t)n;
  float *x = xmalloc(fb), *res = xmalloc(fb), *y = xmalloc(fb), *got = xmalloc(fb);
  uint8_t *pay_h = xmalloc(cap), *pay_d = xmalloc(cap);
  make_input(x, n, seed, 0);
  make_input(res, n, seed + 1, 0);
  for (int64_t i = 0; i < n; i++) {
    res[i] *= 0.1f; // a residual smaller than the gradient, as in training
  }
  loom_tensor_t dx = dev_alloc(LOOM_F32, n, "x"), dres = dev_alloc(LOOM_F32, n, "res"),
                dy = dev_alloc(LOOM_F32, n, "y"), dpay = dev_alloc(LOOM_U8, (int64_t)cap, "pay");
  to_dev(dx.data, x, fb);
  to_dev(dres.data, res, fb);
  size_t bytes_h = 0, bytes_d = 0;
  loom_status_t st = loom_ef_encode(c, res, y, x, n, seed, pay_h, cap, &bytes_h);
  CHECK(st == LOOM_OK, "%s: host: %s", what, loom_last_error(NULL));
  st = loom_cuda_ef_encode(c, (float *)dres.data, (float *)dy.data, (const float *)dx.data, n, seed,
                           (uint8_t *)dpay.data, cap, &bytes_d);
  CHECK(st == LOOM_OK, "%s: device: %s", what, loom_last_error(NULL));
  if (st == LOOM_OK) {
    char w[200];
    from_dev(pay_d, dpay.data, bytes_d);
    snprintf(w, sizeof w, "%s: payload", what);
    same_bytes(w, pay_d, bytes_d, pay_h, bytes_h);
    from_dev(got, dres.data, fb);
    snprintf(w, sizeof w, "%s: residual", what);
    same_floats(w, got, res, n);
    from_dev(got, dy.data, fb);
    snprintf(w, sizeof w, "%s: y = x + res", what);
    same_floats(w, got, y, n);
  }
  // res NULL: a plain encode of x.
  st = loom_codec_encode(c, x, n, seed, pay_h, cap, &bytes_h);
  CHECK(st == LOOM_OK, "%s: host plain encode: %s", what, loom_last_error(NULL));
  st = loom_cuda_ef_encode(c, NULL, (float *)dy.data, (const float *)dx.data, n, seed,
                           (uint8_t *)dpay.data, cap, &bytes_d);
  CHECK(st == LOOM_OK, "%s (res NULL): device: %s", what, loom_last_error(NULL));
  if (st == LOOM_OK) {
    char w[200];
    from_dev(pay_d, dpay.data, bytes_d);
    snprintf(w, sizeof w, "%s (res NULL): payload", what);
    same_bytes(w, pay_d, bytes_d, pay_h, bytes_h);
  }
  TEST_FREE(&dx, &dres, &dy, &dpay);
  free(x);
  free(res);
  free(y);
  free(got);
  free(pay_h);
  free(pay_d);
  loom_error_clear();
}

static void test_ef_and_refusals(void) {
  for (int s = 0; s < NSPECS; s++) {
    loom_compressor_t *c = NULL;
    if (loom_compressor_create(kSpecs[s], &c) == LOOM_OK) {
      ef_case(c, 1000);
      ef_case(c, (1 << 20) + 7);
      loom_compressor_destroy(c);
    }
  }
  loom_compressor_t *c = NULL;
  if (loom_compressor_create("powersgd:2", &c) == LOOM_OK) {
    loom_tensor_t dx = dev_alloc(LOOM_F32, 8, "x"), dpay = dev_alloc(LOOM_U8, 64, "payload");
    size_t bytes = 0;
    loom_status_t st =
        loom_cuda_codec_encode(c, (const float *)dx.data, 8, 0, (uint8_t *)dpay.data, 64, &bytes);
    CHECK(st == LOOM_ERR_UNSUPPORTED, "powersgd encode: got %s", loom_strerror(st));
    loom_error_clear();
    TEST_FREE(&dx, &dpay);
    loom_compressor_destroy(c);
  }
  // A payload buffer one byte short: LOOM_ERR_INVALID_ARG, as the CPU codec.
  if (loom_compressor_create("int8", &c) == LOOM_OK) {
    const int64_t n = 100;
    const size_t cap = loom_compressor_max_bytes(c, n);
    loom_tensor_t dx = dev_alloc(LOOM_F32, n, "x"), dpay = dev_alloc(LOOM_U8, (int64_t)cap, "p");
    size_t bytes = 0;
    loom_status_t st = loom_cuda_codec_encode(c, (const float *)dx.data, n, 0, (uint8_t *)dpay.data,
                                              cap - 1, &bytes);
    CHECK(st == LOOM_ERR_INVALID_ARG && bytes == 0, "short payload buffer: got %s",
          loom_strerror(st));
    loom_error_clear();
    TEST_FREE(&dx, &dpay);
    loom_compressor_destroy(c);
  }
}

int main(void) {
  gpu_require_device(kTest);
  test_codecs();
  test_special_inputs();
  test_corrupt();
  test_ef_and_refusals();
  return check_exit(kTest);
}
