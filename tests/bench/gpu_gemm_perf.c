/* gpu_gemm_perf.c — CUDA GEMM benchmark (not a test): f32 (no TF32) and bf16 loom_gemm on device
 * tensors at 4096^3 and 8192^3, TFLOP/s from the median of timed runs, spot-checked on the host. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../testutil.h"

#include <cuda_runtime_api.h>

// Usage: gpu_gemm_perf [-n ITERS] [-w WARMUP] [--json FILE]
// Each size and dtype: WARMUP untimed runs, then ITERS timed ones (median reported), each timed
// between two cudaDeviceSynchronize calls. C = A @ B, all (N, N), inputs uniform in [-1, 1].
// Exit 77 without a CUDA device; non-zero when a GEMM fails or a spot-checked element of C is
// wrong (16 elements against a dot product in double), never because of the speed.

#define SPOT_CHECKS 16

typedef struct opts {
  int iters, warmup;
  const char *json;
} opts_t;

typedef struct row {
  const char *dtype;
  int n;
  double median_ms, tflops;
  int wrong;
} row_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void die(const char *what) {
  fprintf(stderr, "gpu_gemm_perf: %s: %s\n", what, loom_last_error(NULL));
  exit(1);
}

static void sync_device(void) {
  cudaError_t rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    fprintf(stderr, "gpu_gemm_perf: cudaDeviceSynchronize: %s\n", cudaGetErrorString(rc));
    exit(1);
  }
}

// 64-bit LCG; values uniform in [-1, 1).
static void fill_random(float *x, int64_t n, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (float)(s >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
}

// A device (n, n) matrix of dtype holding host (the bf16 copy rounds host in place first, so the
// host values are those the device multiplies).
static loom_tensor_t upload(float *host, int n, loom_dtype_t dtype, const char *name) {
  int64_t shape[2] = {n, n}, numel = (int64_t)n * n;
  loom_tensor_t h, d;
  if (dtype == LOOM_BF16) {
    if (loom_tensor_alloc(&h, LOOM_BF16, LOOM_DEVICE_HOST, 2, shape, name) != LOOM_OK) {
      die("host allocation");
    }
    loom_f32_to_bf16_n(host, (uint16_t *)h.data, (size_t)numel);
    loom_bf16_to_f32_n((const uint16_t *)h.data, host, (size_t)numel);
  } else if (loom_tensor_wrap(&h, host, LOOM_F32, LOOM_DEVICE_HOST, 2, shape, name) != LOOM_OK) {
    die("wrap");
  }
  if (loom_tensor_alloc(&d, dtype, 0, 2, shape, name) != LOOM_OK) {
    die("device allocation");
  }
  if (loom_tensor_copy(&d, &h) != LOOM_OK) {
    die("upload");
  }
  loom_tensor_free(&h);
  return d;
}

// Elements of device c (dtype), at SPOT_CHECKS pseudo-random positions, that differ from the dot
// product in double by more than 1e-4 sum |a_ik b_kj| (f32 accumulation: ~1e-6 typical), plus
// 2^-8 |c| for bf16 (the rounding of the output). A wrong element is off by ~|c| ~ sqrt(N) / 3,
// far beyond both (sum |a b| ~ N / 4).
static int spot_check(const loom_tensor_t *dc, const float *a, const float *b, int n) {
  int64_t shape[2] = {n, n}, numel = (int64_t)n * n;
  loom_tensor_t h;
  if (loom_tensor_alloc(&h, dc->dtype, LOOM_DEVICE_HOST, 2, shape, "c") != LOOM_OK ||
      loom_tensor_copy(&h, dc) != LOOM_OK) {
    die("download");
  }
  const double out_tol = dc->dtype == LOOM_BF16 ? 0x1p-8 : 0.0;
  int wrong = 0;
  uint64_t s = 12345;
  for (int t = 0; t < SPOT_CHECKS; t++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int64_t idx = (int64_t)((s >> 20) % (uint64_t)numel), i = idx / n, j = idx % n;
    double want = 0.0, mag = 0.0;
    for (int64_t k = 0; k < n; k++) {
      double p = (double)a[i * n + k] * (double)b[k * n + j];
      want += p;
      mag += fabs(p);
    }
    double got = dc->dtype == LOOM_BF16 ? loom_bf16_to_f32(((const uint16_t *)h.data)[idx])
                                        : ((const float *)h.data)[idx];
    if (!(fabs(got - want) <= 1e-4 * mag + out_tol * fabs(want))) {
      fprintf(stderr, "gpu_gemm_perf: %s n=%d: c[%lld, %lld] = %.9g, want %.9g\n",
              loom_dtype_name(dc->dtype), n, (long long)i, (long long)j, got, want);
      wrong++;
    }
  }
  loom_tensor_free(&h);
  return wrong;
}

static row_t bench(int n, loom_dtype_t dtype, const opts_t *o) {
  row_t r = {loom_dtype_name(dtype), n, 0.0, 0.0, 0};
  int64_t numel = (int64_t)n * n;
  float *a = malloc(sizeof(float) * (size_t)numel), *b = malloc(sizeof(float) * (size_t)numel);
  double *ms = malloc(sizeof(double) * (size_t)o->iters);
  if (!a || !b || !ms) {
    fprintf(stderr, "gpu_gemm_perf: out of host memory\n");
    exit(1);
  }
  fill_random(a, numel, 1 + (uint64_t)n);
  fill_random(b, numel, 2 + (uint64_t)n);
  loom_tensor_t da = upload(a, n, dtype, "a"), db = upload(b, n, dtype, "b");
  int64_t shape[2] = {n, n};
  loom_tensor_t dc;
  if (loom_tensor_alloc(&dc, dtype, 0, 2, shape, "c") != LOOM_OK) {
    die("device allocation");
  }
  for (int w = 0; w < o->warmup; w++) {
    if (loom_gemm(&dc, &da, 0, &db, 0, NULL, 1.0f, 0.0f) != LOOM_OK) {
      die("loom_gemm");
    }
  }
  for (int it = 0; it < o->iters; it++) {
    sync_device();
    double t0 = now_s();
    if (loom_gemm(&dc, &da, 0, &db, 0, NULL, 1.0f, 0.0f) != LOOM_OK) {
      die("loom_gemm");
    }
    sync_device();
    ms[it] = 1e3 * (now_s() - t0);
  }
  qsort(ms, (size_t)o->iters, sizeof(double), cmp_double);
  r.median_ms = o->iters % 2 ? ms[o->iters / 2] : 0.5 * (ms[o->iters / 2 - 1] + ms[o->iters / 2]);
  r.tflops = 2.0 * (double)n * (double)n * (double)n / (r.median_ms * 1e-3) / 1e12;
  r.wrong = spot_check(&dc, a, b, n);
  loom_tensor_free(&da);
  loom_tensor_free(&db);
  loom_tensor_free(&dc);
  free(a);
  free(b);
  free(ms);
  return r;
}

static void usage(FILE *f) {
  fprintf(f, "usage: gpu_gemm_perf [-n ITERS] [-w WARMUP] [--json FILE]\n"
             "  -n ITERS        timed runs per size and dtype, median reported (default 10)\n"
             "  -w WARMUP       untimed runs first (default 3)\n"
             "  --json FILE     also write the numbers as JSON\n");
}

static int parse_int(const char *s, int lo, const char *flag) {
  int v = 0;
  if (test_int_arg("gpu_gemm_perf", flag, s, &v) != 0) {
    exit(2);
  }
  if (v < lo || v > 1000000) {
    fprintf(stderr, "gpu_gemm_perf: %s needs an integer >= %d\n", flag, lo);
    usage(stderr);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  opts_t o = {10, 3, NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n")) {
      o.iters = parse_int(i + 1 < argc ? argv[++i] : NULL, 1, "-n");
    } else if (!strcmp(argv[i], "-w")) {
      o.warmup = parse_int(i + 1 < argc ? argv[++i] : NULL, 0, "-w");
    } else if (!strcmp(argv[i], "--json")) {
      if (i + 1 == argc) {
        fprintf(stderr, "gpu_gemm_perf: --json needs a value (the file to write)\n");
        usage(stderr);
        return 2;
      }
      o.json = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "gpu_gemm_perf: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (test_output_writable("gpu_gemm_perf", "--json", o.json) != 0) { // now, not after the run
    return 2;
  }
  if (loom_cuda_device_count() <= 0) {
    printf("gpu_gemm_perf: SKIP: no CUDA device visible (or loom built without CUDA)\n");
    return 77;
  }
  struct cudaDeviceProp prop;
  const char *device = cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "unknown";

  static const int sizes[2] = {4096, 8192};
  static const loom_dtype_t dtypes[2] = {LOOM_F32, LOOM_BF16};
  row_t rows[4];
  int nrows = 0, wrong = 0;
  printf("# gpu_gemm_perf on %s: C = A @ B, (N, N) matrices, median of %d runs after %d warmup\n",
         device, o.iters, o.warmup);
  printf("%6s %6s %12s %10s %6s\n", "dtype", "N", "median(ms)", "TFLOP/s", "#wrong");
  for (int d = 0; d < 2; d++) {
    for (int s = 0; s < 2; s++) {
      row_t r = bench(sizes[s], dtypes[d], &o);
      printf("%6s %6d %12.3f %10.2f %6d\n", r.dtype, r.n, r.median_ms, r.tflops, r.wrong);
      fflush(stdout);
      wrong += r.wrong;
      rows[nrows++] = r;
    }
  }
  if (o.json) {
    FILE *f = test_output_open("gpu_gemm_perf", "--json", o.json, "w");
    if (!f) {
      return 1;
    }
    fprintf(f, "{\n  \"device\": \"%s\", \"iters\": %d, \"warmup\": %d,\n  \"gemm\": [", device,
            o.iters, o.warmup);
    for (int i = 0; i < nrows; i++) {
      fprintf(f,
              "%s\n    {\"dtype\": \"%s\", \"n\": %d, \"median_ms\": %.4f, \"tflops\": %.3f, "
              "\"wrong\": %d}",
              i ? "," : "", rows[i].dtype, rows[i].n, rows[i].median_ms, rows[i].tflops,
              rows[i].wrong);
    }
    fprintf(f, "\n  ]\n}\n");
    if (test_output_close("gpu_gemm_perf", "--json", o.json, f) != 0) {
      return 1;
    }
  }
  return wrong ? 1 : 0;
}
