/* gemm_perf.c — loom's own AVX2 GEMM against the BLAS's sgemm, side by side on one core, on the
 * products of a train_gpt step (forward and input gradients) and on 1024^3 (not a test). */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas_check.h"
#include "cpu/gemm_avx2.h"
#include "../testutil.h"

// Usage: gemm_perf [-n ITERS] [--width C] [--tokens T] [--json FILE]
// Each shape runs the BLAS and loom's kernel alternately, ITERS samples of each after two
// untimed ones; the table shows the medians. The BLAS runs on one thread (loom's kernel is
// single-threaded). The exit status is non-zero when the two disagree beyond rounding, or when
// this CPU cannot run loom's kernel; never because loom's kernel is slower.

typedef struct shape {
  const char *name; // what it is in a train_gpt block
  int trans_b;      // 1: c = a @ b^T (forward: b is the (out, in) weight); 0: c = a @ b
  int M, N, K;
  float beta; // 1: the product adds into c (the residual stream, or a second input gradient)
  int count;  // how many of it a block runs per step
  int bias;   // the forward adds a bias row
} shape_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static float *random_floats(size_t n, unsigned seed) {
  float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "gemm_perf: out of memory (%zu floats)\n", n);
    exit(2);
  }
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
  }
  return p;
}

typedef struct result {
  double blas_gflops, loom_gflops, blas_ms, loom_ms;
  int wrong;
} result_t;

static result_t run_shape(const shape_t *s, int iters) {
  const int M = s->M, N = s->N, K = s->K;
  float *a = random_floats((size_t)M * K, 1), *b = random_floats((size_t)N * K, 2);
  float *bias = s->bias ? random_floats((size_t)N, 3) : NULL;
  float *c0 = random_floats((size_t)M * N, 4); // the values c holds before each product
  float *c1 = malloc((size_t)M * N * sizeof(float)), *c2 = malloc((size_t)M * N * sizeof(float));
  double *tb = malloc((size_t)iters * sizeof(double)), *tl = malloc((size_t)iters * sizeof(double));
  if (!c1 || !c2 || !tb || !tl) {
    fprintf(stderr, "gemm_perf: out of memory\n");
    exit(2);
  }
  const int lda = K, ldb = s->trans_b ? K : N;
  result_t r = {0};
  for (int it = -2; it < iters; it++) {
    memcpy(c1, c0, (size_t)M * N * sizeof(float));
    memcpy(c2, c0, (size_t)M * N * sizeof(float));
    double t0 = now_s();
    // As loom_cpu_gemm runs a bias on the BLAS: with beta == 0 it first sets c to the bias rows
    // and then adds the product (beta = 1); otherwise it adds the bias after the product.
    const int bias_first = bias && s->beta == 0.0f;
    for (int i = 0; bias_first && i < M; i++) {
      memcpy(c1 + (size_t)i * N, bias, (size_t)N * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans, M, N, K, 1.0f,
                a, lda, b, ldb, bias_first ? 1.0f : s->beta, c1, N);
    for (int i = 0; bias && !bias_first && i < M; i++) {
      for (int j = 0; j < N; j++) {
        c1[(size_t)i * N + j] += bias[j];
      }
    }
    double t1 = now_s();
    if (loom_cpu_gemm_avx2(s->trans_b, M, N, K, 1.0f, a, lda, b, ldb, bias, s->beta, c2, N) != 0) {
      fprintf(stderr, "gemm_perf: loom_cpu_gemm_avx2 could not allocate its packing buffer\n");
      exit(2);
    }
    double t2 = now_s();
    if (it >= 0) {
      tb[it] = t1 - t0;
      tl[it] = t2 - t1;
    }
  }
  for (size_t i = 0; i < (size_t)M * N; i++) {
    r.wrong += !(fabsf(c1[i] - c2[i]) <= 1e-5f * (float)K * (1.0f + fabsf(c1[i])) / 64.0f);
  }
  const double flops = 2.0 * M * N * K;
  r.blas_ms = median(tb, iters) * 1e3;
  r.loom_ms = median(tl, iters) * 1e3;
  r.blas_gflops = flops / r.blas_ms * 1e-6;
  r.loom_gflops = flops / r.loom_ms * 1e-6;
  free(a), free(b), free(bias), free(c0), free(c1), free(c2), free(tb), free(tl);
  return r;
}

int main(int argc, char **argv) {
  int iters = 15, C = 256, T = 2048;
  const char *json = NULL;
  for (int i = 1; i < argc; i++) {
    int *num = !strcmp(argv[i], "-n")         ? &iters
               : !strcmp(argv[i], "--width")  ? &C
               : !strcmp(argv[i], "--tokens") ? &T
                                              : NULL;
    if (num && i + 1 < argc) {
      if (test_int_arg("gemm_perf", argv[i], argv[i + 1], num) != 0) {
        return 2;
      }
      i++;
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: gemm_perf [-n ITERS (15)] [--width C (256)] [--tokens T (2048)] "
             "[--json FILE]\n"
             "loom's AVX2 GEMM against the BLAS's sgemm on one core, on the products of a\n"
             "train_gpt step of width C and T tokens and on 1024^3; a table of medians.\n");
      return 0;
    } else if (num || !strcmp(argv[i], "--json")) {
      fprintf(stderr, "gemm_perf: %s needs a value; see --help\n", argv[i]);
      return 2;
    } else {
      fprintf(stderr, "gemm_perf: unknown flag '%s'; see --help\n", argv[i]);
      return 2;
    }
  }
  if (iters < 1 || C < 1 || T < 1 || C > 16384 || T > 1 << 20) {
    fprintf(stderr, "gemm_perf: -n, --width and --tokens must be positive (width <= 16384, "
                    "tokens <= 1048576)\n");
    return 2;
  }
  if (!loom_cpu_gemm_avx2_ok()) {
    fprintf(stderr, "gemm_perf: this CPU lacks AVX2 or FMA: loom's kernel does not run here, and "
                    "loom_gemm uses the BLAS for every product\n");
    return 1;
  }
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  openblas_set_num_threads(1);
#endif
  const shape_t shapes[] = {
      {"fwd q, k, v", 1, T, C, C, 0.0f, 3, 1},
      {"fwd out proj (+residual)", 1, T, C, C, 1.0f, 1, 1},
      {"fwd fc1", 1, T, 4 * C, C, 0.0f, 1, 1},
      {"fwd fc2 (+residual)", 1, T, C, 4 * C, 1.0f, 1, 1},
      {"dX fc2 -> d h", 0, T, 4 * C, C, 0.0f, 1, 0},
      {"dX fc1 -> d ln2", 0, T, C, 4 * C, 0.0f, 1, 0},
      {"dX out proj", 0, T, C, C, 0.0f, 1, 0},
      {"dX q, k, v (sum)", 0, T, C, C, 1.0f, 3, 0},
      {"square 1024^3", 0, 1024, 1024, 1024, 0.0f, 0, 0},
  };
  const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
  printf("# gemm_perf: OpenBLAS core %s, 1 thread, against loom's AVX2 kernel; width %d, %d tokens;"
         " medians of %d\n",
         loom_blas_core(), C, T, iters);
  printf("%-26s %6s %6s %6s %5s %10s %10s %7s %6s\n", "product", "M", "N", "K", "ops", "BLAS GF/s",
         "loom GF/s", "ratio", "wrong");
  double block_blas = 0, block_loom = 0;
  int wrong = 0;
  FILE *jf = json ? test_output_open("gemm_perf", "--json", json, "w") : NULL;
  if (json && !jf) {
    return 2;
  }
  if (jf) {
    fprintf(jf, "{\"blas_core\": \"%s\", \"width\": %d, \"tokens\": %d, \"shapes\": [",
            loom_blas_core(), C, T);
  }
  for (int i = 0; i < nshapes; i++) {
    const shape_t *s = &shapes[i];
    result_t r = run_shape(s, iters);
    wrong += r.wrong;
    block_blas += s->count * r.blas_ms;
    block_loom += s->count * r.loom_ms;
    printf("%-26s %6d %6d %6d %5s %10.1f %10.1f %7.3f %6d\n", s->name, s->M, s->N, s->K,
           s->trans_b ? "NT" : "NN", r.blas_gflops, r.loom_gflops, r.loom_gflops / r.blas_gflops,
           r.wrong);
    if (jf) {
      fprintf(jf,
              "%s{\"name\": \"%s\", \"M\": %d, \"N\": %d, \"K\": %d, \"blas_gflops\": %.2f, "
              "\"loom_gflops\": %.2f, \"wrong\": %d}",
              i ? ", " : "", s->name, s->M, s->N, s->K, r.blas_gflops, r.loom_gflops, r.wrong);
    }
  }
  printf("# a block's forward and input-gradient products (the weight gradients, a^T @ b, stay on "
         "the BLAS): BLAS %.2f ms, loom %.2f ms, loom / BLAS time %.3f\n",
         block_blas, block_loom, block_loom / block_blas);
  if (jf) {
    fprintf(jf, "], \"block_blas_ms\": %.3f, \"block_loom_ms\": %.3f}\n", block_blas, block_loom);
  }
  const int unwritten = jf && test_output_close("gemm_perf", "--json", json, jf) != 0;
  if (wrong) {
    fprintf(stderr, "gemm_perf: %d results differ between the BLAS and loom's kernel\n", wrong);
  }
  return wrong || unwritten ? 1 : 0;
}
