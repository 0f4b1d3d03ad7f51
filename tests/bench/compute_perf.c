/* compute_perf.c — CPU compute benchmark (not a test): loom_gemm against direct sgemm, varlen
 * attention GFLOP/s, padding-free vs padded, a PyTorch-comparable batch, and attention memory. */
#include "config.h"
#include "loom.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../testutil.h"

// Usage: compute_perf [-n ITERS] [-w WARMUP] [-t GEMM_THREADS] [--quick] [--json FILE]
// Times are medians over ITERS timed runs after WARMUP untimed ones. Attention always runs on one
// BLAS thread (the benchmark sets it); the GEMM table runs on GEMM_THREADS (default 1). The exit
// status is non-zero when a result is wrong (loom_gemm differs from sgemm, or attention produces
// a non-finite value) or the JSON file could not be written whole, never because a goal is missed.

#define D_HEAD  64
#define PT_SEED 104 // the seed of the (4) lengths; torch_attention.py uses the same

typedef struct opts {
  int iters, warmup, gemm_threads, quick;
  const char *json;
} opts_t;

static int wrong_total; // results that are wrong, for the exit status

// ---------------------------------------------------------------------------------------------
// Helpers: clock, the seeded length generator shared with torch_attention.py, tensors.

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_blas_threads(int n) {
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

// 64-bit LCG (Knuth's MMIX constants); a draw is the top 31 bits. torch_attention.py
// reimplements exactly this: state = state * A + C mod 2^64, draw = state >> 33.
typedef struct lcg {
  uint64_t state;
} lcg_t;

static uint32_t lcg_next(lcg_t *g) {
  g->state = g->state * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g->state >> 33);
}

// Lengths uniform in [lo, hi]: lo + draw % (hi - lo + 1).
static void draw_lengths(uint64_t seed, int B, int lo, int hi, int *len) {
  lcg_t g = {seed};
  for (int b = 0; b < B; b++) {
    len[b] = lo + (int)(lcg_next(&g) % (uint32_t)(hi - lo + 1));
  }
}

static loom_tensor_t tensor(loom_dtype_t dtype, int ndim, const int64_t *shape, const char *name) {
  loom_tensor_t t;
  if (loom_tensor_alloc(&t, dtype, LOOM_DEVICE_HOST, ndim, shape, name) != LOOM_OK) {
    fprintf(stderr, "compute_perf: cannot allocate %s: %s\n", name, loom_last_error(NULL));
    exit(2);
  }
  return t;
}

static void fill_random(loom_tensor_t *t, uint64_t seed) {
  lcg_t g = {seed};
  float *p = t->data;
  for (int64_t i = 0; i < loom_tensor_numel(t); i++) {
    p[i] = (float)lcg_next(&g) * (2.0f / 2147483648.0f) - 1.0f;
  }
}

static int count_nonfinite(const loom_tensor_t *t) {
  const float *p = t->data;
  int n = 0;
  for (int64_t i = 0; i < loom_tensor_numel(t); i++) {
    n += !isfinite(p[i]);
  }
  return n;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, cmp_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void check_ok(loom_status_t st, const char *what) {
  if (st != LOOM_OK) {
    fprintf(stderr, "compute_perf: %s failed: %s\n", what, loom_last_error(NULL));
    exit(2);
  }
}

// ---------------------------------------------------------------------------------------------
// Attention problems: a packed batch with its tensors.

typedef struct attn {
  int B, H;
  int64_t total;
  loom_tensor_t cu, q, k, v, out, lse, dout, dq, dk, dv;
} attn_t;

static void attn_init(attn_t *a, int B, const int *len, int H) {
  memset(a, 0, sizeof *a);
  a->B = B;
  a->H = H;
  const int64_t cs[1] = {B + 1};
  a->cu = tensor(LOOM_I32, 1, cs, "cu_seqlens");
  int32_t *cu = a->cu.data;
  for (int b = 0; b < B; b++) {
    cu[b + 1] = cu[b] + len[b];
  }
  a->total = cu[B];
  const int64_t s[3] = {a->total, H, D_HEAD}, ls[2] = {H, a->total};
  a->q = tensor(LOOM_F32, 3, s, "q");
  a->k = tensor(LOOM_F32, 3, s, "k");
  a->v = tensor(LOOM_F32, 3, s, "v");
  a->dout = tensor(LOOM_F32, 3, s, "dout");
  a->out = tensor(LOOM_F32, 3, s, "out");
  a->lse = tensor(LOOM_F32, 2, ls, "lse");
  a->dq = tensor(LOOM_F32, 3, s, "dq");
  a->dk = tensor(LOOM_F32, 3, s, "dk");
  a->dv = tensor(LOOM_F32, 3, s, "dv");
  fill_random(&a->q, 11);
  fill_random(&a->k, 12);
  fill_random(&a->v, 13);
  fill_random(&a->dout, 14);
}

static void attn_free(attn_t *a) {
  loom_tensor_t *all[] = {&a->cu,  &a->q,    &a->k,  &a->v,  &a->out,
                          &a->lse, &a->dout, &a->dq, &a->dk, &a->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    loom_tensor_free(all[i]);
  }
}

static void attn_fwd(attn_t *a) {
  check_ok(loom_attention_forward(&a->out, &a->lse, &a->q, &a->k, &a->v, &a->cu, &a->cu, 1, 0.0f),
           "loom_attention_forward");
}

static void attn_bwd(attn_t *a) {
  check_ok(loom_attention_backward(&a->dq, &a->dk, &a->dv, &a->dout, &a->q, &a->k, &a->v, &a->out,
                                   &a->lse, &a->cu, &a->cu, 1, 0.0f),
           "loom_attention_backward");
}

// Median forward and backward times (seconds) over o->iters runs after o->warmup.
static void attn_time(attn_t *a, const opts_t *o, double *fwd_s, double *bwd_s) {
  double *tf = malloc((size_t)o->iters * sizeof(double));
  double *tb = malloc((size_t)o->iters * sizeof(double));
  for (int it = -o->warmup; it < o->iters; it++) {
    double t0 = now_s();
    attn_fwd(a);
    double t1 = now_s();
    attn_bwd(a);
    double t2 = now_s();
    if (it >= 0) {
      tf[it] = t1 - t0;
      tb[it] = t2 - t1;
    }
  }
  *fwd_s = median(tf, o->iters);
  *bwd_s = median(tb, o->iters);
  free(tf);
  free(tb);
  int bad = count_nonfinite(&a->out) + count_nonfinite(&a->dq) + count_nonfinite(&a->dk) +
            count_nonfinite(&a->dv);
  if (bad) {
    fprintf(stderr, "compute_perf: attention produced %d non-finite values\n", bad);
    wrong_total += bad;
  }
}

// Causal FLOPs of one forward: 2 matrix products of 2 * D flops per visible (query, key) pair.
static double causal_fwd_flops(int H, const int *len, int B) {
  double pairs = 0;
  for (int b = 0; b < B; b++) {
    pairs += 0.5 * (double)len[b] * (len[b] + 1);
  }
  return 4.0 * H * D_HEAD * pairs;
}

// ---------------------------------------------------------------------------------------------
// (1) GEMM: loom_gemm against cblas_sgemm on the same buffers, interleaved.

typedef struct gemm_row {
  int n;
  double direct_gflops, loom_gflops, ratio;
  int wrong;
} gemm_row_t;

static gemm_row_t bench_gemm(int n, const opts_t *o) {
  const int64_t s[2] = {n, n};
  loom_tensor_t a = tensor(LOOM_F32, 2, s, "a"), b = tensor(LOOM_F32, 2, s, "b");
  loom_tensor_t c1 = tensor(LOOM_F32, 2, s, "c_direct"), c2 = tensor(LOOM_F32, 2, s, "c_loom");
  fill_random(&a, 1);
  fill_random(&b, 2);
  const double flops = 2.0 * n * n * n;
  const int reps = flops >= 2e9 ? 1 : (int)(2e9 / flops); // ~20 ms or more per sample
  double *td = malloc((size_t)o->iters * sizeof(double));
  double *tl = malloc((size_t)o->iters * sizeof(double));
  for (int it = -o->warmup; it < o->iters; it++) {
    double t0 = now_s();
    for (int r = 0; r < reps; r++) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data, n, b.data, n,
                  0.0f, c1.data, n);
    }
    double t1 = now_s();
    for (int r = 0; r < reps; r++) {
      check_ok(loom_gemm(&c2, &a, 0, &b, 0, NULL, 1.0f, 0.0f), "loom_gemm");
    }
    double t2 = now_s();
    if (it >= 0) {
      td[it] = (t1 - t0) / reps;
      tl[it] = (t2 - t1) / reps;
    }
  }
  gemm_row_t row = {n, 0, 0, 0, 0};
  row.direct_gflops = flops / median(td, o->iters) * 1e-9;
  row.loom_gflops = flops / median(tl, o->iters) * 1e-9;
  row.ratio = row.loom_gflops / row.direct_gflops;
  const float *x = c1.data, *y = c2.data;
  for (int64_t i = 0; i < (int64_t)n * n; i++) {
    row.wrong += !(fabsf(x[i] - y[i]) <= 1e-4f * (1.0f + fabsf(x[i])));
  }
  wrong_total += row.wrong;
  free(td);
  free(tl);
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c1);
  loom_tensor_free(&c2);
  return row;
}

// Single-thread sgemm GFLOP/s at 1024 (the reference for attention's fraction).
static double sgemm_1t_gflops(const opts_t *o) {
  set_blas_threads(1);
  const int n = 1024;
  const int64_t s[2] = {n, n};
  loom_tensor_t a = tensor(LOOM_F32, 2, s, "a"), b = tensor(LOOM_F32, 2, s, "b"),
                c = tensor(LOOM_F32, 2, s, "c");
  fill_random(&a, 3);
  fill_random(&b, 4);
  double *t = malloc((size_t)o->iters * sizeof(double));
  for (int it = -o->warmup; it < o->iters; it++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data, n, b.data, n,
                0.0f, c.data, n);
    if (it >= 0) {
      t[it] = now_s() - t0;
    }
  }
  double g = 2.0 * n * n * n / median(t, o->iters) * 1e-9;
  free(t);
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  return g;
}

// ---------------------------------------------------------------------------------------------
// Results and the report.

typedef struct attn_row {
  int H, T;
  double fwd_ms, bwd_ms, gflops, fraction;
} attn_row_t;

typedef struct results {
  gemm_row_t gemm[4];
  int n_gemm;
  double sgemm_1t;
  attn_row_t attn[10];
  int n_attn;
  // (3) padding-free vs padded
  int pf_B, pf_max;
  double pf_mean_len, pf_packed_ms, pf_padded_ms, pf_speedup, pf_ideal;
  // (4) the PyTorch batch
  int pt_B, pt_T, pt_H, pt_len[8];
  double pt_mean_len, pt_fwd_ms, pt_bwd_ms;
  // (5) memory
  int mem_T, mem_H;
  double mem_delta_mib, mem_tensors_mib, mem_scores_mib, mem_ms;
} results_t;

// 0, or -1 when the file could not be written whole (said).
static int write_json(const results_t *r, const opts_t *o) {
  FILE *f = test_output_open("compute_perf", "--json", o->json, "w");
  if (!f) {
    return -1;
  }
  fprintf(f, "{\n  \"iters\": %d, \"warmup\": %d, \"quick\": %d, \"gemm_threads\": %d,\n", o->iters,
          o->warmup, o->quick, o->gemm_threads);
  fprintf(f, "  \"gemm\": [");
  for (int i = 0; i < r->n_gemm; i++) {
    const gemm_row_t *g = &r->gemm[i];
    fprintf(f,
            "%s\n    {\"n\": %d, \"direct_gflops\": %.2f, \"loom_gflops\": %.2f, \"ratio\": %.4f, "
            "\"wrong\": %d}",
            i ? "," : "", g->n, g->direct_gflops, g->loom_gflops, g->ratio, g->wrong);
  }
  fprintf(f, "\n  ],\n  \"sgemm_1t_gflops\": %.2f,\n  \"attention\": [", r->sgemm_1t);
  for (int i = 0; i < r->n_attn; i++) {
    const attn_row_t *a = &r->attn[i];
    fprintf(f,
            "%s\n    {\"H\": %d, \"D\": %d, \"T\": %d, \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, "
            "\"gflops\": %.2f, \"fraction_of_sgemm\": %.3f}",
            i ? "," : "", a->H, D_HEAD, a->T, a->fwd_ms, a->bwd_ms, a->gflops, a->fraction);
  }
  fprintf(f,
          "\n  ],\n  \"padding_free\": {\"B\": %d, \"max_len\": %d, \"mean_len\": %.1f, "
          "\"packed_ms\": %.3f, \"padded_ms\": %.3f, \"speedup\": %.3f, \"ideal\": %.3f},\n",
          r->pf_B, r->pf_max, r->pf_mean_len, r->pf_packed_ms, r->pf_padded_ms, r->pf_speedup,
          r->pf_ideal);
  fprintf(f, "  \"torch_batch\": {\"B\": %d, \"T\": %d, \"H\": %d, \"D\": %d, \"lengths\": [",
          r->pt_B, r->pt_T, r->pt_H, D_HEAD);
  for (int b = 0; b < r->pt_B; b++) {
    fprintf(f, "%s%d", b ? ", " : "", r->pt_len[b]);
  }
  fprintf(f, "], \"mean_len\": %.1f, \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"total_ms\": %.3f},\n",
          r->pt_mean_len, r->pt_fwd_ms, r->pt_bwd_ms, r->pt_fwd_ms + r->pt_bwd_ms);
  fprintf(f,
          "  \"memory\": {\"T\": %d, \"H\": %d, \"D\": %d, \"peak_rss_delta_mib\": %.1f, "
          "\"tensors_mib\": %.1f, \"score_matrix_mib\": %.1f, \"fwd_bwd_ms\": %.1f},\n",
          r->mem_T, r->mem_H, D_HEAD, r->mem_delta_mib, r->mem_tensors_mib, r->mem_scores_mib,
          r->mem_ms);
  fprintf(f, "  \"wrong\": %d\n}\n", wrong_total);
  return test_output_close("compute_perf", "--json", o->json, f);
}

static const char *mark(double value, double goal) {
  return value >= goal ? "ok" : "BELOW GOAL";
}

static void print_report(const results_t *r, const opts_t *o) {
  printf("# loom compute_perf: iters %d, warmup %d (medians)%s\n", o->iters, o->warmup,
         o->quick ? ", --quick" : "");
  printf("#\n# (1) GEMM, square f32, %d BLAS thread(s): loom_gemm vs cblas_sgemm (goal ratio >= "
         "0.97)\n",
         o->gemm_threads);
  printf("#  %6s  %14s  %14s  %7s  %6s\n", "n", "sgemm GFLOP/s", "loom GFLOP/s", "ratio", "#wrong");
  for (int i = 0; i < r->n_gemm; i++) {
    const gemm_row_t *g = &r->gemm[i];
    printf("   %6d  %14.1f  %14.1f  %7.3f  %6d  %s\n", g->n, g->direct_gflops, g->loom_gflops,
           g->ratio, g->wrong, mark(g->ratio, 0.97));
  }
  printf("#\n# (2) causal attention fwd+bwd, 1 thread, D=%d, one sequence of T tokens; FLOPs "
         "counted causal:\n#     fwd 4*H*D*T(T+1)/2, bwd 2.5x fwd. Reference: sgemm 1024^3 on 1 "
         "thread = %.1f GFLOP/s (goal fraction >= 0.4)\n",
         D_HEAD, r->sgemm_1t);
  printf("#  %2s  %6s  %10s  %10s  %10s  %9s  %8s\n", "H", "T", "fwd ms", "bwd ms", "total ms",
         "GFLOP/s", "fraction");
  for (int i = 0; i < r->n_attn; i++) {
    const attn_row_t *a = &r->attn[i];
    printf("   %2d  %6d  %10.2f  %10.2f  %10.2f  %9.1f  %8.3f  %s\n", a->H, a->T, a->fwd_ms,
           a->bwd_ms, a->fwd_ms + a->bwd_ms, a->gflops, a->fraction, mark(a->fraction, 0.4));
  }
  printf("#\n# (3) padding-free vs padded, causal fwd+bwd, 1 thread, B=%d, H=4, D=%d, lengths "
         "uniform 1..%d (seeded), mean %.0f (mean/max %.2f)\n",
         r->pf_B, D_HEAD, r->pf_max - 1, r->pf_mean_len, r->pf_mean_len / r->pf_max);
  printf("#  %12s  %12s  %8s  %16s\n", "packed ms", "padded ms", "speedup", "ideal (pairs)");
  printf("   %12.1f  %12.1f  %8.2f  %16.2f  %s (goal >= 1.8)\n", r->pf_packed_ms, r->pf_padded_ms,
         r->pf_speedup, r->pf_ideal, mark(r->pf_speedup, 1.8));
  printf("#\n# (4) PyTorch comparison batch: B=%d, T=%d, H=%d, D=%d, causal, lengths (seed %d, "
         "256 + draw %% 749) mean %.1f:\n#    ",
         r->pt_B, r->pt_T, r->pt_H, D_HEAD, PT_SEED, r->pt_mean_len);
  for (int b = 0; b < r->pt_B; b++) {
    printf(" %d", r->pt_len[b]);
  }
  printf("\n#  %10s  %10s  %10s\n", "fwd ms", "bwd ms", "total ms");
  printf("   %10.2f  %10.2f  %10.2f   (compare: tests/bench/torch_attention.py)\n", r->pt_fwd_ms,
         r->pt_bwd_ms, r->pt_fwd_ms + r->pt_bwd_ms);
  printf("#\n# (5) memory of causal fwd+bwd at T=%d, H=%d, D=%d, 1 thread (measured first, "
         "peak RSS growth)\n",
         r->mem_T, r->mem_H, D_HEAD);
  printf("#  %14s  %16s  %18s  %10s\n", "peak RSS MiB", "tensors MiB", "T x T scores MiB",
         "fwd+bwd ms");
  printf("   %14.1f  %16.1f  %18.1f  %10.1f\n", r->mem_delta_mib, r->mem_tensors_mib,
         r->mem_scores_mib, r->mem_ms);
  printf("#\n# wrong results: %d\n", wrong_total);
}

// ---------------------------------------------------------------------------------------------

static long max_rss_kib(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss; // KiB on Linux
}

// Resident set now (KiB) from /proc/self/statm; the peak so far where that is unavailable.
static long current_rss_kib(void) {
  long pages = -1, resident = -1;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) {
      resident = -1;
    }
    fclose(f);
  }
  long page_kib = sysconf(_SC_PAGESIZE) / 1024;
  return resident >= 0 && page_kib > 0 ? resident * page_kib : max_rss_kib();
}

static void usage(FILE *f) {
  fprintf(f, "usage: compute_perf [-n ITERS] [-w WARMUP] [-t GEMM_THREADS] [--quick] "
             "[--json FILE]\n"
             "  -n ITERS        timed runs per measurement, median reported (default 5; 2 with "
             "--quick)\n"
             "  -w WARMUP       untimed runs first (default 1)\n"
             "  -t THREADS      BLAS threads for the GEMM table (default 1); attention uses 1\n"
             "  --quick         smaller sizes, about 20 s\n"
             "  --json FILE     also write the numbers as JSON\n");
}

static int parse_int(const char *s, int lo, const char *flag) {
  char *end = NULL;
  long v = s ? strtol(s, &end, 10) : 0;
  if (!s || *end != '\0' || v < lo || v > 1000000) {
    fprintf(stderr, "compute_perf: %s needs an integer >= %d\n", flag, lo);
    usage(stderr);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  opts_t o = {-1, -1, 1, 0, NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n")) {
      o.iters = parse_int(i + 1 < argc ? argv[++i] : NULL, 1, "-n");
    } else if (!strcmp(argv[i], "-w")) {
      o.warmup = parse_int(i + 1 < argc ? argv[++i] : NULL, 0, "-w");
    } else if (!strcmp(argv[i], "-t")) {
      o.gemm_threads = parse_int(i + 1 < argc ? argv[++i] : NULL, 1, "-t");
    } else if (!strcmp(argv[i], "--quick")) {
      o.quick = 1;
    } else if (!strcmp(argv[i], "--json")) {
      if (i + 1 == argc) {
        fprintf(stderr, "compute_perf: --json needs a value (the file to write)\n");
        usage(stderr);
        return 2;
      }
      o.json = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "compute_perf: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (test_output_writable("compute_perf", "--json", o.json) != 0) { // now, not minutes later
    return 2;
  }
  if (o.iters < 0) {
    o.iters = o.quick ? 2 : 5;
  }
  if (o.warmup < 0) {
    o.warmup = 1;
  }
  results_t r;
  memset(&r, 0, sizeof r);
  set_blas_threads(1);

  // (5) first, so that no earlier phase has raised the peak (ru_maxrss): warm BLAS and the
  // kernels up on a small problem; then the peak RSS during one fwd+bwd at T, minus the resident
  // set just before it, is what the phase needs (tensors, workspace, BLAS buffers).
  {
    int small = 256;
    attn_t w;
    attn_init(&w, 1, &small, 4);
    attn_fwd(&w);
    attn_bwd(&w);
    attn_free(&w);
    r.mem_T = o.quick ? 4096 : 16384;
    r.mem_H = 4;
    long before = current_rss_kib(); // the phase's peak is ru_maxrss after it, minus this
    attn_t a;
    attn_init(&a, 1, &r.mem_T, r.mem_H);
    double t0 = now_s();
    attn_fwd(&a);
    attn_bwd(&a);
    r.mem_ms = (now_s() - t0) * 1e3;
    r.mem_delta_mib = (double)(max_rss_kib() - before) / 1024.0;
    // q, k, v, out, dout, dq, dk, dv (T, H, D) and lse (H, T).
    r.mem_tensors_mib = (8.0 * D_HEAD + 1) * (double)a.total * r.mem_H * 4 / (1024.0 * 1024.0);
    r.mem_scores_mib = (double)r.mem_T * r.mem_T * 4 / (1024.0 * 1024.0);
    wrong_total += count_nonfinite(&a.out) + count_nonfinite(&a.dq);
    attn_free(&a);
  }

  // (1) GEMM.
  set_blas_threads(o.gemm_threads);
  static const int gemm_n[4] = {256, 512, 1024, 2048};
  r.n_gemm = o.quick ? 3 : 4;
  for (int i = 0; i < r.n_gemm; i++) {
    r.gemm[i] = bench_gemm(gemm_n[i], &o);
  }

  // (2) attention GFLOP/s on one thread.
  r.sgemm_1t = sgemm_1t_gflops(&o);
  set_blas_threads(1);
  static const int Ts[5] = {512, 1024, 2048, 4096, 8192};
  const int nT = o.quick ? 3 : 5, nH = o.quick ? 1 : 2;
  for (int hi = 0; hi < nH; hi++) {
    for (int ti = 0; ti < nT; ti++) {
      attn_row_t *row = &r.attn[r.n_attn++];
      row->H = hi ? 8 : 4;
      row->T = Ts[ti];
      attn_t a;
      attn_init(&a, 1, &row->T, row->H);
      double f, b;
      attn_time(&a, &o, &f, &b);
      attn_free(&a);
      row->fwd_ms = f * 1e3;
      row->bwd_ms = b * 1e3;
      row->gflops = 3.5 * causal_fwd_flops(row->H, &row->T, 1) / (f + b) * 1e-9;
      row->fraction = row->gflops / r.sgemm_1t;
    }
  }

  // (3) padding-free vs padded: the same kernel on the packed batch and on every sequence
  // padded to the maximum length (cu_seqlens with equal lengths).
  {
    r.pf_B = o.quick ? 8 : 16;
    r.pf_max = o.quick ? 1024 : 2048;
    int len[16], padded[16];
    draw_lengths(o.quick ? 55 : 11, r.pf_B, 1, r.pf_max - 1, len); // mean ~max/2
    double sum = 0;
    for (int b = 0; b < r.pf_B; b++) {
      sum += len[b];
      padded[b] = r.pf_max;
    }
    r.pf_mean_len = sum / r.pf_B;
    attn_t a;
    double f, b;
    attn_init(&a, r.pf_B, len, 4);
    attn_time(&a, &o, &f, &b);
    attn_free(&a);
    r.pf_packed_ms = (f + b) * 1e3;
    attn_init(&a, r.pf_B, padded, 4);
    attn_time(&a, &o, &f, &b);
    attn_free(&a);
    r.pf_padded_ms = (f + b) * 1e3;
    r.pf_speedup = r.pf_padded_ms / r.pf_packed_ms;
    r.pf_ideal = causal_fwd_flops(4, padded, r.pf_B) / causal_fwd_flops(4, len, r.pf_B);
  }

  // (4) The batch tests/bench/torch_attention.py runs in PyTorch.
  {
    r.pt_B = 8;
    r.pt_T = 1024;
    r.pt_H = 4;
    draw_lengths(PT_SEED, r.pt_B, 256, 1004, r.pt_len); // mean 630.25
    double sum = 0;
    for (int b = 0; b < r.pt_B; b++) {
      sum += r.pt_len[b];
    }
    r.pt_mean_len = sum / r.pt_B;
    attn_t a;
    double f, b;
    attn_init(&a, r.pt_B, r.pt_len, r.pt_H);
    attn_time(&a, &o, &f, &b);
    attn_free(&a);
    r.pt_fwd_ms = f * 1e3;
    r.pt_bwd_ms = b * 1e3;
  }

  print_report(&r, &o);
  const int unwritten = o.json && write_json(&r, &o) != 0;
  return wrong_total || unwritten ? 1 : 0;
}
