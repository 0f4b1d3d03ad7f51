/* test_cuda_fill.c — device tensors: zeroed allocation, fill of every dtype at sizes 0, 1 and
 * 1000003 checked element by element on the host, and device-to-device copies. SKIP without GPU. */
#include "config.h"
#include "loom.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define SKIP 77

static void report(const char *what, loom_status_t st) {
  printf("FAIL: %s: %s: %s\n", what, loom_strerror(st), loom_last_error(NULL));
  failures++;
}

// Every element of the host tensor h equals the first element of the host tensor want (same
// dtype); both hold numel elements. Prints the first mismatch.
static void check_equal(const loom_tensor_t *h, const loom_tensor_t *want, const char *what) {
  size_t size = loom_dtype_size(h->dtype);
  int64_t n = loom_tensor_numel(h);
  const unsigned char *got = h->data;    // (n * size,)
  const unsigned char *ref = want->data; // (n * size,)
  for (int64_t i = 0; i < n; i++) {
    if (memcmp(got + (size_t)i * size, ref + (size_t)i * size, size) != 0) {
      unsigned long long g = 0, r = 0;
      memcpy(&g, got + (size_t)i * size, size);
      memcpy(&r, ref + (size_t)i * size, size);
      printf("FAIL: %s: element %lld of %lld is 0x%llX, want 0x%llX\n", what, (long long)i,
             (long long)n, g, r);
      failures++;
      return;
    }
  }
}

// Copy device tensor d to a new host tensor and compare it with want.
static void check_device(const loom_tensor_t *d, const loom_tensor_t *want, const char *what) {
  loom_tensor_t h;
  loom_status_t st = loom_tensor_alloc(&h, d->dtype, LOOM_DEVICE_HOST, d->ndim, d->shape, "back");
  if (st != LOOM_OK) {
    report(what, st);
    return;
  }
  if (h.data != NULL) {
    memset(h.data, 0xA5, loom_tensor_bytes(&h)); // so a copy that does nothing shows
  }
  st = loom_tensor_copy(&h, d);
  if (st != LOOM_OK) {
    report(what, st);
  } else {
    check_equal(&h, want, what);
  }
  loom_tensor_free(&h);
}

static void run_case(int device, loom_dtype_t dtype, int64_t n, double value) {
  char what[160];
  loom_tensor_t d = {0}, d2 = {0}, zero = {0}, ref = {0};
  loom_status_t st;
  snprintf(what, sizeof what, "device %d %s x %lld value %g", device, loom_dtype_name(dtype),
           (long long)n, value);

  // Reference results computed on the host.
  if ((st = loom_tensor_alloc(&zero, dtype, LOOM_DEVICE_HOST, 1, &n, "zero")) != LOOM_OK ||
      (st = loom_tensor_alloc(&ref, dtype, LOOM_DEVICE_HOST, 1, &n, "ref")) != LOOM_OK ||
      (st = loom_tensor_fill(&ref, value)) != LOOM_OK) {
    report(what, st);
    goto done;
  }

  if ((st = loom_tensor_alloc(&d, dtype, device, 1, &n, "dev")) != LOOM_OK) {
    report(what, st);
    goto done;
  }
  if (n > 0 && d.data == NULL) {
    printf("FAIL: %s: allocation returned NULL data\n", what);
    failures++;
    goto done;
  }
  check_device(&d, &zero, what); // freshly allocated device memory is zeroed

  if ((st = loom_tensor_fill(&d, value)) != LOOM_OK) {
    report(what, st);
    goto done;
  }
  check_device(&d, &ref, what);

  // Device -> device on the same device, and host -> device back again.
  if ((st = loom_tensor_alloc(&d2, dtype, device, 1, &n, "dev2")) != LOOM_OK ||
      (st = loom_tensor_copy(&d2, &d)) != LOOM_OK) {
    report(what, st);
    goto done;
  }
  check_device(&d2, &ref, what);
  if ((st = loom_tensor_copy(&d2, &zero)) != LOOM_OK) {
    report(what, st);
    goto done;
  }
  check_device(&d2, &zero, what);
  check_device(&d, &ref, what); // the source is untouched

done:
  loom_tensor_free(&d);
  loom_tensor_free(&d2);
  loom_tensor_free(&zero);
  loom_tensor_free(&ref);
}

// Copy between two different devices (only with two or more GPUs).
static void run_cross_device(int n_devices) {
  int64_t n = 1000003;
  loom_tensor_t a = {0}, b = {0}, ref = {0};
  loom_status_t st;
  if ((st = loom_tensor_alloc(&ref, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "ref")) != LOOM_OK ||
      (st = loom_tensor_fill(&ref, -3.25)) != LOOM_OK ||
      (st = loom_tensor_alloc(&a, LOOM_F32, 0, 1, &n, "a")) != LOOM_OK ||
      (st = loom_tensor_alloc(&b, LOOM_F32, n_devices - 1, 1, &n, "b")) != LOOM_OK ||
      (st = loom_tensor_fill(&a, -3.25)) != LOOM_OK || (st = loom_tensor_copy(&b, &a)) != LOOM_OK) {
    report("cross-device copy", st);
  } else {
    check_device(&b, &ref, "cross-device copy");
  }
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&ref);
}

int main(void) {
  int count = loom_cuda_device_count();
  if (count == 0) {
    printf("SKIP: no CUDA device visible\n");
    return SKIP;
  }
  printf("test_cuda_fill: %d CUDA device(s)\n", count);

  static const struct {
    loom_dtype_t dtype;
    double value;
  } cases[] = {
      {LOOM_F32, 1.5},  {LOOM_F32, -0.1},   {LOOM_F16, 1.5},   {LOOM_F16, 70000.0},
      {LOOM_BF16, 1.5}, {LOOM_BF16, -3e38}, {LOOM_I8, -300.0}, {LOOM_I8, 42.5},
      {LOOM_U8, 200.0}, {LOOM_I32, -2.5},   {LOOM_I32, 1e10},  {LOOM_I64, -123456789012.0},
  };
  const int64_t sizes[] = {0, 1, 1000003};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      run_case(0, cases[c].dtype, sizes[s], cases[c].value);
    }
  }
  if (count > 1) {
    run_case(count - 1, LOOM_I64, 1000003, 7.0);
    run_cross_device(count);
  }

  // A few known device results, independent of the host fill.
  {
    int64_t n = 1000003;
    loom_tensor_t d = {0}, h = {0};
    if (loom_tensor_alloc(&d, LOOM_F16, 0, 1, &n, "d") == LOOM_OK &&
        loom_tensor_alloc(&h, LOOM_F16, LOOM_DEVICE_HOST, 1, &n, "h") == LOOM_OK &&
        loom_tensor_fill(&d, 1.5) == LOOM_OK && loom_tensor_copy(&h, &d) == LOOM_OK) {
      const uint16_t *p = h.data; // (n,)
      if (p[0] != 0x3E00 || p[n / 2] != 0x3E00 || p[n - 1] != 0x3E00) {
        printf("FAIL: f16 fill 1.5 on device: got 0x%04X 0x%04X 0x%04X, want 0x3E00\n", p[0],
               p[n / 2], p[n - 1]);
        failures++;
      }
    } else {
      report("f16 fill 1.5 on device", LOOM_ERR_CUDA);
    }
    loom_tensor_free(&d);
    loom_tensor_free(&h);
  }

  if (failures > 0) {
    printf("test_cuda_fill: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_cuda_fill: all checks passed\n");
  return 0;
}
