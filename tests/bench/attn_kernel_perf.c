/* attn_kernel_perf.c — the CPU core-attention kernels side by side on the same input: the short
 * path (strips on FMA micro-kernels) against the FlashAttention-2 tiles on BLAS, one core. */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/attention_cpu.h"
#include "cpu/attention_short_cpu.h"
#include "../testutil.h"

// Usage: attn_kernel_perf [--profile FILE] [--iters N] [--heads H] [--head-dim D] [--width W]
// Workloads of 2048 tokens, causal, H heads of D (default 4 x 64, train_gpt's default model):
// - documents: the packed batches of a train_gpt --profile FILE (its `batch` lines, at most 32),
//   or without one, seeded lognormal document lengths (mean ~110, as train_gpt's corpus) cut
//   into rows of 256, as train_gpt packs them;
// - equal: every sequence of length L, for L = 64 .. 2048; both paths are forced at every L, to
//   show where the short path stops paying (loom_cpu_attn_short_limit, attention_short_cpu.h).
// Per workload and path: the median over N runs (default 5, after one warm-up) of forward and
// backward ms per batch, and the rate of the causal FLOPs (4 D H per pair forward, twice that
// backward) against the 1024^3 sgemm rate measured at start. The exit status is non-zero when
// the two paths disagree beyond 1e-4 relative to the largest value, or produce a non-finite one.
// --width 8 runs the short path's 8-wide micro-kernels on a CPU with AVX-512 (default: the
// widest the CPU has).

#define TOKENS    2048
#define ROW       256
#define MAX_BATCH 32
#define MAX_SEQ   (TOKENS + 1)

typedef struct workload {
  char name[48];
  int nb;           // batches
  int B[MAX_BATCH]; // sequences per batch
  int32_t *cu[MAX_BATCH];
  double pairs; // causal pairs over all batches
} workload_t;

typedef struct buffers {
  float *q, *k, *v, *dout, *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
} buffers_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, int n) {
  qsort(x, (size_t)n, sizeof *x, by_value);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) {
    fprintf(stderr, "attn_kernel_perf: out of memory (%zu bytes)\n", n);
    exit(2);
  }
  return p;
}

static uint64_t rng_state = 2026;

static double uniform(void) { // (0, 1)
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

// Adds a batch from sequence lengths that sum to TOKENS.
static void add_batch(workload_t *w, const int *len, int n) {
  int32_t *cu = xmalloc((size_t)(n + 1) * sizeof *cu);
  cu[0] = 0;
  for (int i = 0; i < n; i++) {
    cu[i + 1] = cu[i] + len[i];
    w->pairs += 0.5 * (double)len[i] * (len[i] + 1);
  }
  w->cu[w->nb] = cu;
  w->B[w->nb++] = n;
}

// train_gpt --profile FILE: lines "batch L1 L2 ..." whose lengths sum to the batch's tokens.
static int load_profile(workload_t *w, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "attn_kernel_perf: cannot open %s: write one with train_gpt --profile FILE\n",
            path);
    return -1;
  }
  char line[16384];
  int len[MAX_SEQ];
  while (w->nb < MAX_BATCH && fgets(line, sizeof line, f)) {
    if (strncmp(line, "batch ", 6) != 0) {
      continue;
    }
    int n = 0, sum = 0;
    for (char *p = line + 6, *end; n < MAX_SEQ; p = end) {
      long x = strtol(p, &end, 10);
      if (end == p) {
        break;
      }
      if (x < 0 || x > TOKENS) {
        n = -1;
        break;
      }
      len[n++] = (int)x;
      sum += (int)x;
    }
    if (n <= 0 || sum != TOKENS) {
      fprintf(stderr,
              "attn_kernel_perf: %s: a batch line that is not %d tokens of lengths (profile of "
              "train_gpt's default batch 8 x context 256?)\n",
              path, TOKENS);
      fclose(f);
      return -1;
    }
    add_batch(w, len, n);
  }
  fclose(f);
  if (w->nb == 0) {
    fprintf(stderr, "attn_kernel_perf: %s has no batch lines\n", path);
    return -1;
  }
  snprintf(w->name, sizeof w->name, "documents (profile)");
  return 0;
}

// Lognormal document lengths (median 80, sigma 1.0) in one stream, cut into rows of ROW tokens:
// each row holds the pieces of the documents that cross it.
static void make_documents(workload_t *w) {
  int doc_left = 0;
  for (int b = 0; b < 8; b++) {
    int len[MAX_SEQ], n = 0;
    for (int r = 0; r < TOKENS / ROW; r++) {
      for (int t = 0; t < ROW;) {
        if (doc_left == 0) {
          double z = sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform());
          doc_left = 1 + (int)(80.0 * exp(z));
        }
        int piece = doc_left < ROW - t ? doc_left : ROW - t;
        len[n++] = piece;
        doc_left -= piece;
        t += piece;
      }
    }
    add_batch(w, len, n);
  }
  snprintf(w->name, sizeof w->name, "documents (lognormal)");
}

static void make_equal(workload_t *w, int L) {
  int len[MAX_SEQ], n = 0;
  for (int t = 0; t < TOKENS; t += L) {
    len[n++] = TOKENS - t < L ? TOKENS - t : L;
  }
  for (int b = 0; b < 2; b++) {
    add_batch(w, len, n);
  }
  snprintf(w->name, sizeof w->name, "equal L = %d", L);
}

static void free_workload(workload_t *w) {
  for (int b = 0; b < w->nb; b++) {
    free(w->cu[b]);
  }
}

static double sgemm_rate(void) {
  const int n = 1024;
  float *a = xmalloc((size_t)n * n * sizeof(float)), *b = xmalloc((size_t)n * n * sizeof(float));
  float *c = xmalloc((size_t)n * n * sizeof(float));
  for (int i = 0; i < n * n; i++) {
    a[i] = 0.5f;
    b[i] = 0.25f;
  }
  double best = 1e30;
  for (int rep = 0; rep < 4; rep++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double dt = now_s() - t0;
    best = rep > 0 && dt < best ? dt : best;
  }
  free(a);
  free(b);
  free(c);
  return 2.0 * n * n * (double)n / best;
}

// One forward + backward of batch b on path p (0 tiles, 1 short); returns 0 or exits.
static void run_batch(const workload_t *w, int b, int p, int H, int D, buffers_t *x, double *tf,
                      double *tb) {
  const int32_t *cu = w->cu[b];
  double t0 = now_s();
  loom_status_t st = loom_cpu_attention_fwd(x->out[p], x->lse[p], x->q, x->k, x->v, cu, cu, w->B[b],
                                            H, H, D, 1, 0.0f);
  double t1 = now_s();
  if (st == LOOM_OK) {
    st = loom_cpu_attention_bwd(x->dq[p], x->dk[p], x->dv[p], x->dout, x->q, x->k, x->v, x->out[p],
                                x->lse[p], cu, cu, w->B[b], H, H, D, 1, 0.0f);
  }
  double t2 = now_s();
  if (st != LOOM_OK) {
    fprintf(stderr, "attn_kernel_perf: attention failed: %s\n", loom_last_error(NULL));
    exit(2);
  }
  *tf += t1 - t0;
  *tb += t2 - t1;
}

// Largest |a - b| / max(1, max |a|), or +inf when either holds a non-finite value.
static double rel_diff(const float *a, const float *b, size_t n) {
  double d = 0.0, m = 1.0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) {
      return INFINITY;
    }
    d = fmax(d, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)a[i]));
  }
  return d / m;
}

// Times both paths (interleaved batch by batch), prints a row; returns the worst disagreement.
static double bench(const workload_t *w, int iters, int H, int D, double sgemm, int force_short,
                    buffers_t *x) {
  double f[2][64], bw[2][64], worst = 0.0;
  const size_t nq = (size_t)TOKENS * H * D;
  for (int it = -1; it < iters; it++) { // it = -1: warm-up
    double tf[2] = {0, 0}, tb[2] = {0, 0};
    for (int b = 0; b < w->nb; b++) {
      for (int p = 0; p < 2; p++) {
        loom_attn_short_max = p == 0 ? -1 : (force_short ? TOKENS : 0);
        run_batch(w, b, p, H, D, x, &tf[p], &tb[p]);
      }
      float *got[4] = {x->out[1], x->dq[1], x->dk[1], x->dv[1]};
      float *want[4] = {x->out[0], x->dq[0], x->dk[0], x->dv[0]};
      for (int i = 0; i < 4; i++) {
        worst = fmax(worst, rel_diff(want[i], got[i], nq));
      }
    }
    if (it >= 0) {
      for (int p = 0; p < 2; p++) {
        f[p][it] = 1e3 * tf[p] / w->nb;
        bw[p][it] = 1e3 * tb[p] / w->nb;
      }
    }
  }
  loom_attn_short_max = 0;
  const double flops = 4.0 * D * H * w->pairs / w->nb; // forward, per batch
  double mf[2], mb[2];
  for (int p = 0; p < 2; p++) {
    mf[p] = median(f[p], iters);
    mb[p] = median(bw[p], iters);
  }
  printf("%-22s %7.2f %7.2f %5.2f   %7.2f %7.2f %5.2f   %6.2fx  %8.1e\n", w->name, mf[0], mb[0],
         3 * flops / (1e-3 * (mf[0] + mb[0])) / sgemm, mf[1], mb[1],
         3 * flops / (1e-3 * (mf[1] + mb[1])) / sgemm, (mf[0] + mb[0]) / (mf[1] + mb[1]), worst);
  return worst;
}

int main(int argc, char **argv) {
  const char *profile = NULL;
  int iters = 5, H = 4, D = 64, width = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      printf("usage: attn_kernel_perf [--profile FILE] [--iters N (5)] [--heads H (4)] "
             "[--head-dim D (64)] [--width 8|16 (the widest the CPU has)]\n");
      return 0;
    }
    if (!val) {
      fprintf(stderr, "attn_kernel_perf: %s needs a value (see --help)\n", a);
      return 2;
    }
    int bad = 0; // a number flag's value that is not a whole number (said)
    if (strcmp(a, "--profile") == 0) {
      profile = val;
    } else if (strcmp(a, "--iters") == 0) {
      bad = test_int_arg("attn_kernel_perf", a, val, &iters);
    } else if (strcmp(a, "--heads") == 0) {
      bad = test_int_arg("attn_kernel_perf", a, val, &H);
    } else if (strcmp(a, "--head-dim") == 0) {
      bad = test_int_arg("attn_kernel_perf", a, val, &D);
    } else if (strcmp(a, "--width") == 0) {
      bad = test_int_arg("attn_kernel_perf", a, val, &width);
    } else {
      fprintf(stderr, "attn_kernel_perf: unknown flag %s (see --help)\n", a);
      return 2;
    }
    if (bad) {
      return 2;
    }
    i++;
  }
  if (iters < 1 || iters > 64 || H < 1 || H > 64 || D < 1 || D > 512 ||
      (width != 0 && width != 8 && width != 16)) {
    fprintf(stderr,
            "attn_kernel_perf: --iters 1..64, --heads 1..64, --head-dim 1..512, --width 8 or 16\n");
    return 2;
  }
  loom_attn_vector_width = width == 8 ? 8 : 0;
  if (width == 16 && loom_cpu_attn_vector_width() != 16) {
    fprintf(stderr, "attn_kernel_perf: --width 16 needs a CPU with AVX-512 (this one has not)\n");
    return 2;
  }
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  openblas_set_num_threads(1);
#endif
  buffers_t x;
  memset(&x, 0, sizeof x);
  const size_t nq = (size_t)TOKENS * H * D;
  float **all[] = {&x.q,     &x.k,     &x.v,     &x.dout,  &x.out[0], &x.out[1],
                   &x.dq[0], &x.dq[1], &x.dk[0], &x.dk[1], &x.dv[0],  &x.dv[1]};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    *all[i] = xmalloc(nq * sizeof(float));
    for (size_t j = 0; j < nq; j++) {
      (*all[i])[j] = (float)(2.0 * uniform() - 1.0);
    }
  }
  x.lse[0] = xmalloc((size_t)TOKENS * H * sizeof(float));
  x.lse[1] = xmalloc((size_t)TOKENS * H * sizeof(float));

  const double sgemm = sgemm_rate();
  printf("# attn_kernel_perf: %d tokens per batch, causal, %d heads x D = %d, one core; sgemm "
         "1024^3 %.1f GFLOP/s; short path's micro-kernels %d-wide\n",
         TOKENS, H, D, sgemm / 1e9, loom_cpu_attn_vector_width());
  printf("# ms per batch (median of %d); rate = causal FLOPs (fwd + bwd) / sgemm rate; short "
         "path up to %d keys by default%s\n",
         iters, loom_cpu_attn_short_limit(),
         D % 16 ? " (D % 16 != 0: the short path is not taken)" : "");
  printf("%-22s %7s %7s %5s   %7s %7s %5s   %7s  %8s\n", "workload", "tiles", "bwd", "rate",
         "short", "bwd", "rate", "speedup", "max diff");
  double worst = 0.0;
  workload_t w = {0};
  if (profile ? load_profile(&w, profile) : (make_documents(&w), 0)) {
    return 2;
  }
  worst = fmax(worst, bench(&w, iters, H, D, sgemm, 0, &x));
  free_workload(&w);
  static const int Ls[] = {64, 128, 256, 512, 768, 1024, 2048};
  for (size_t i = 0; i < sizeof Ls / sizeof *Ls; i++) {
    workload_t e = {0};
    make_equal(&e, Ls[i]);
    worst = fmax(worst, bench(&e, iters, H, D, sgemm, 1, &x));
    free_workload(&e);
  }
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
    free(*all[i]);
  }
  free(x.lse[0]);
  free(x.lse[1]);
  if (!(worst <= 1e-4)) {
    fprintf(stderr, "attn_kernel_perf: the two paths disagree: %.3g relative (limit 1e-4)\n",
            worst);
    return 1;
  }
  return 0;
}
