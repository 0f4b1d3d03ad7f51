/* timeshare_perf.c — what sharing a core costs beyond the shares: K processes pinned to one core
 * run the same sgemm loop as one alone, over a sweep of sizes; prints loom_sim's `timeshare`. */
#include "config.h" // _GNU_SOURCE: sched_setaffinity, CPU_SET

#include <cblas.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SWEEP      4
#define MAX_ROUNDS 64 // --rounds at most (the rounds' values of a size sit in an array)
static const int sweep_n[SWEEP] = {128, 192, 256, 384};

typedef struct opts {
  int k, n, iters, rounds, core; // n, iters: 0 = the sweep, ~0.25 s of work per process
} opts_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: timeshare_perf [--ranks-per-core K] [--n N] [--iters I] [--rounds R] [--core C]\n"
          "  Runs I products of N x N f32 matrices (one BLAS thread) in one process pinned to\n"
          "  core C, then in K such processes at once on that core, R times alternating, and\n"
          "  takes T_K / (K T_1) - 1 (the median of the rounds): the cost of sharing a core\n"
          "  beyond the K shares (context switches, caches refilled). It depends on the working\n"
          "  set, so by default N sweeps 128, 192, 256 and 384 (I: about 0.25 s of work each),\n"
          "  and the last line, `timeshare F`, is the median over the sizes. loom_sim's cluster\n"
          "  files take that line: a core holding K > 1 ranks runs a step K (1 + F) times as\n"
          "  long. Defaults: K 2, the sweep, R 5 (at most %d), C 0.\n",
          MAX_ROUNDS);
}

static int parse(int argc, char **argv, opts_t *o) {
  *o = (opts_t){.k = 2, .n = 0, .iters = 0, .rounds = 5, .core = 0};
  for (int i = 1; i < argc; i++) {
    int *dst = !strcmp(argv[i], "--ranks-per-core") ? &o->k
               : !strcmp(argv[i], "--n")            ? &o->n
               : !strcmp(argv[i], "--iters")        ? &o->iters
               : !strcmp(argv[i], "--rounds")       ? &o->rounds
               : !strcmp(argv[i], "--core")         ? &o->core
                                                    : NULL;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      exit(0);
    }
    char *end = NULL;
    long v = dst && i + 1 < argc ? strtol(argv[i + 1], &end, 10) : -1;
    if (!dst || !end || end == argv[i + 1] || *end || v < (dst == &o->core ? 0 : 1) || v > 100000) {
      fprintf(stderr, "timeshare_perf: bad argument '%s'%s%s (see --help)\n", argv[i],
              dst && i + 1 < argc ? " " : "", dst && i + 1 < argc ? argv[i + 1] : "");
      return -1;
    }
    *dst = (int)v;
    i++;
  }
  if (o->k < 2 || o->k > 64 || o->n > 4096) {
    fprintf(stderr,
            "timeshare_perf: --ranks-per-core %d (2..64) or --n %d (1..4096) out of range\n", o->k,
            o->n);
    return -1;
  }
  if (o->rounds > MAX_ROUNDS) {
    fprintf(stderr, "timeshare_perf: --rounds %d: at most %d rounds; give --rounds 1..%d\n",
            o->rounds, MAX_ROUNDS, MAX_ROUNDS);
    return -1;
  }
  return 0;
}

// One process's work: pinned to the core, iters products (C = A B).
static int work(const opts_t *o) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(o->core, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    fprintf(stderr,
            "timeshare_perf: cannot pin to core %d: %s (pass --core with a core this "
            "process may use)\n",
            o->core, strerror(errno));
    return 1;
  }
  const size_t nn = (size_t)o->n * (size_t)o->n;
  float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
  if (!a || !b || !c) {
    fprintf(stderr, "timeshare_perf: out of memory for N = %d\n", o->n);
    return 1;
  }
  for (size_t i = 0; i < nn; i++) {
    a[i] = 1e-3f * (float)(i % 7);
    b[i] = 1e-3f * (float)(i % 5);
  }
  for (int it = 0; it < o->iters; it++) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, o->n, o->n, o->n, 1.0f, a, o->n, b, o->n,
                0.0f, c, o->n);
  }
  int bad = c[0] != c[0]; // keeps the products
  free(a);
  free(b);
  free(c);
  return bad;
}

// Wall time of k processes doing the work at once (all start together; the last one to finish).
static double group(const opts_t *o, int k) {
  pid_t pid[64];
  const double t0 = now_s();
  for (int i = 0; i < k; i++) {
    pid[i] = fork();
    if (pid[i] == 0) {
      _exit(work(o));
    }
    if (pid[i] < 0) {
      fprintf(stderr, "timeshare_perf: fork: %s\n", strerror(errno));
      return -1.0;
    }
  }
  int failed = 0;
  for (int i = 0; i < k; i++) {
    int st = 0;
    failed |= waitpid(pid[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return failed ? -1.0 : now_s() - t0;
}

static int cmp_double(const void *x, const void *y) {
  const double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(int argc, char **argv) {
  opts_t o;
  if (parse(argc, argv, &o) != 0) {
    return 2;
  }
  // One BLAS thread in every child (the children inherit the environment before the library
  // starts its threads).
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  const int rounds = o.rounds;
  double per_size[SWEEP] = {0};
  const int nsizes = o.n ? 1 : SWEEP;
  printf("# timeshare_perf: %d processes on core %d against one, %d rounds per size\n", o.k, o.core,
         rounds);
  printf("#    n  iters  round   T_1 (s)   T_%d (s)   T_%d / (%d T_1)\n", o.k, o.k, o.k);
  for (int z = 0; z < nsizes; z++) {
    opts_t one = o;
    one.n = o.n ? o.n : sweep_n[z];
    const double flops = 2.0 * one.n * one.n * (double)one.n;
    one.iters = o.iters ? o.iters : (int)(2.5e10 / flops) + 1; // ~0.25 s at ~100 GFLOP/s
    if (group(&one, 1) < 0) { // warm-up (page faults, the library's first call)
      return 1;
    }
    double f[MAX_ROUNDS] = {0};
    for (int r = 0; r < rounds; r++) {
      const double t1 = group(&one, 1), tk = group(&one, o.k);
      if (t1 <= 0 || tk <= 0) {
        return 1;
      }
      f[r] = tk / (o.k * t1);
      printf("  %5d  %5d  %5d  %8.3f  %8.3f  %8.3f\n", one.n, one.iters, r, t1, tk, f[r]);
    }
    qsort(f, (size_t)rounds, sizeof f[0], cmp_double);
    per_size[z] = (rounds % 2 ? f[rounds / 2] : 0.5 * (f[rounds / 2 - 1] + f[rounds / 2])) - 1.0;
    printf("# n %d: %.3f\n", one.n, per_size[z]);
  }
  qsort(per_size, (size_t)nsizes, sizeof per_size[0], cmp_double);
  double med =
      nsizes % 2 ? per_size[nsizes / 2] : 0.5 * (per_size[nsizes / 2 - 1] + per_size[nsizes / 2]);
  med = med > 0 ? med : 0.0;
  printf("timeshare %.3f   # the median over %d size(s): put this line in the cluster file\n", med,
         nsizes);
  return 0;
}
