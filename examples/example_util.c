/* example_util.c — flag parsing, seeded random numbers, fatal checks, parameter dumps and their
 * comparison for the example trainers (see example_util.h). */
#include "example_util.h"

#include "agree_args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

const char *ex_prog = "loom example";

void ex_fatal(const char *file, int line, const char *call, loom_status_t st) {
  fprintf(stderr, "%s: %s:%d: %s: %s: %s\n", ex_prog, file, line, call, loom_strerror(st),
          loom_last_error(NULL));
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  abort(); // not reached: MPI_Abort does not return
}

// ---- flags ------------------------------------------------------------------------------------

int ex_next_flag(int argc, char **argv, int *i, const char *const *switches, char *flag,
                 size_t flagcap, const char **value, char *err, size_t errlen) {
  const char *arg = argv[*i], *eq = strchr(arg, '=');
  size_t flen = eq ? (size_t)(eq - arg) : strlen(arg);
  *value = NULL;
  if (strncmp(arg, "--", 2) != 0 || flen >= flagcap) {
    snprintf(err, errlen, "unexpected argument '%s' (flags start with --; see --help)", arg);
    return -1;
  }
  memcpy(flag, arg, flen);
  flag[flen] = '\0';
  for (const char *const *s = switches; s && *s; s++) {
    if (!strcmp(flag, *s)) {
      if (eq) {
        snprintf(err, errlen, "%s takes no value", flag);
        return -1;
      }
      return 0;
    }
  }
  if (eq) {
    *value = eq + 1;
  } else if (*i + 1 < argc) {
    *value = argv[++*i];
  } else {
    snprintf(err, errlen, "%s wants a value, or is not a flag of this program (see --help)", flag);
    return -1;
  }
  return 0;
}

int ex_parse_long(const char *flag, const char *v, long lo, long hi, long *out, char *err,
                  size_t errlen) {
  char *end = NULL;
  long x = strtol(v, &end, 10);
  if (!*v || *end || x < lo || x > hi) {
    snprintf(err, errlen, "%s wants an integer in %ld..%ld, got '%s'", flag, lo, hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

int ex_parse_int(const char *flag, const char *v, int lo, int hi, int *out, char *err,
                 size_t errlen) {
  long x = 0;
  if (ex_parse_long(flag, v, lo, hi, &x, err, errlen)) {
    return -1;
  }
  *out = (int)x;
  return 0;
}

int ex_parse_double(const char *flag, const char *v, double lo, double hi, double *out, char *err,
                    size_t errlen) {
  char *end = NULL;
  double x = strtod(v, &end);
  if (!*v || *end || !isfinite(x) || x < lo || x > hi) {
    snprintf(err, errlen, "%s wants a number in %g..%g, got '%s'", flag, lo, hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

int ex_parse_compress(const char *flag, const char *v, const char **spec, loom_scheme_t *scheme,
                      char *err, size_t errlen) {
  if (!strcmp(flag, "--compress")) {
    if (strcmp(v, "auto") != 0 && loom_compressor_check(v) != LOOM_OK) {
      snprintf(err, errlen, "--compress: %s", loom_last_error(NULL));
      return -1;
    }
    *spec = v;
    return 1;
  }
  if (!strcmp(flag, "--compress-scheme")) {
    if (loom_scheme_parse(v, scheme) != LOOM_OK) {
      snprintf(err, errlen,
               "--compress-scheme wants indivisible, divisible or hierarchical, got '%s'", v);
      return -1;
    }
    return 1;
  }
  return 0;
}

int ex_check_accum(int batch, int accum, char *err, size_t errlen) {
  if (accum >= 1 && batch % accum == 0) {
    return 0;
  }
  snprintf(err, errlen,
           "--accum %d does not divide --batch %d: each micro-batch takes --batch/--accum rows; "
           "use a --batch that is a multiple of --accum",
           accum, batch);
  return -1;
}

int ex_check_output(const char *flag, const char *path, char *err, size_t errlen) {
  if (!path) {
    return 0;
  }
  if (!*path) { // (--json= or an unset shell variable): fopen would fail only at the end
    snprintf(err, errlen, "%s wants a file path, got an empty one", flag);
    return -1;
  }
  struct stat st;
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s %s is a directory: give a file path", flag, path);
    return -1;
  }
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(dir, sizeof dir, ".");
  } else {
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  }
  // A probe file, not access(): root passes access() on folders it still cannot write in.
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.loom-probe-%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno != EEXIST) {
    snprintf(err, errlen,
             "%s %s: cannot write in %s: %s: give a path in an existing, writable directory (it "
             "is checked now so that the run's results are not lost at the end)",
             flag, path, dir, strerror(errno));
    return -1;
  }
  if (fd >= 0) {
    close(fd);
    unlink(probe);
  }
  return 0;
}

int ex_check_compress_env(const char *flag, const loom_ctx_t *ctx, char *err, size_t errlen) {
  const char *spec = loom_tunable(ctx, "LOOM_COMPRESS");
  if (flag || !spec || !strcmp(spec, "none") || !strcmp(spec, "auto")) {
    return 0;
  }
  if (loom_compressor_check(spec) != LOOM_OK) {
    snprintf(err, errlen,
             "LOOM_COMPRESS=%s: %s (set it to none, auto or a compressor spec, or "
             "pass --compress)",
             spec, loom_last_error(NULL));
    return -1;
  }
  return 0;
}

const char *ex_compress_spec(const char *prog, const char *flag, const loom_ctx_t *ctx, int dp_size,
                             int overlap_ok, int rank) {
  const char *spec = flag ? flag : loom_tunable(ctx, "LOOM_COMPRESS");
  if (!spec || strcmp(spec, "auto") != 0 || (dp_size > 1 && overlap_ok)) {
    return spec;
  }
  // (an explicit --compress auto without the overlapped sync is not met here: the trainers' flag
  // parsers refuse it, so only one data-parallel rank is left to say)
  if (flag && rank == 0 && dp_size <= 1) {
    printf("%s: --compress auto: one data-parallel rank sends nothing, so gradients travel "
           "uncompressed\n",
           prog);
  }
  return "none";
}

int ex_parse_device(const char *v, int *cuda, char *err, size_t errlen) {
  if (strcmp(v, "host") != 0 && strcmp(v, "cuda") != 0) {
    snprintf(err, errlen, "--device wants host or cuda, got '%s'", v);
    return -1;
  }
  *cuda = !strcmp(v, "cuda");
  return 0;
}

int ex_device(const char *prog, const loom_ctx_t *ctx, int cuda, int rank) {
  if (!cuda) {
    return LOOM_DEVICE_HOST;
  }
  if (loom_gpu(ctx) >= 0) {
    return loom_gpu(ctx);
  }
  if (rank == 0) {
    const char *gpu = loom_tunable(ctx, "LOOM_GPU");
    fprintf(stderr,
            "%s: --device cuda, but this rank has no GPU (LOOM_GPU=%s, %d visible): run where "
            "CUDA devices are visible, or use --device host\n",
            prog, gpu ? gpu : "auto", loom_cuda_device_count());
  }
  return -2;
}

// ---- random numbers ---------------------------------------------------------------------------

uint64_t ex_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t ex_compress_seed(uint64_t step, int tensor) {
  uint64_t state = (step << 20) ^ (uint64_t)(uint32_t)tensor; // distinct below 2^20 tensors
  return ex_splitmix64(&state);
}

float ex_uniform(uint64_t *state) {
  return (float)(ex_splitmix64(state) >> 40) / (float)(1 << 24);
}

float ex_normal(uint64_t *state) {
  double u1 = ((double)(ex_splitmix64(state) >> 11) + 1.0) / 9007199254740993.0; // (0, 1]
  double u2 = (double)(ex_splitmix64(state) >> 11) / 9007199254740992.0;         // [0, 1)
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

// ---- dumps ------------------------------------------------------------------------------------

int ex_expand_rank(const char *path, int rank, char *out, size_t cap) {
  size_t o = 0;
  for (const char *s = path; *s; s++) {
    if (s[0] == '%' && s[1] == 'r') {
      int w = snprintf(out + o, cap - o, "%d", rank);
      if (w < 0 || (size_t)w >= cap - o) {
        return -1;
      }
      o += (size_t)w;
      s++;
    } else {
      if (o + 1 >= cap) {
        return -1;
      }
      out[o++] = *s;
    }
  }
  out[o] = '\0';
  return 0;
}

int ex_dump_params(const char *path, int rank, const loom_tensor_t *const *tensors, int n) {
  char file[4096];
  if (ex_expand_rank(path, rank, file, sizeof file)) {
    fprintf(stderr, "%s: the dump path '%s' is too long\n", ex_prog, path);
    return -1;
  }
  FILE *f = fopen(file, "wb");
  if (!f) {
    fprintf(stderr, "%s: --dump-params: cannot write %s: %s\n", ex_prog, file, strerror(errno));
    return -1;
  }
  int ok = 1;
  for (int i = 0; i < n; i++) {
    size_t cnt = (size_t)loom_tensor_numel(tensors[i]);
    ok &= fwrite(tensors[i]->data, sizeof(float), cnt, f) == cnt;
  }
  ok &= fclose(f) == 0;
  if (!ok) {
    fprintf(stderr, "%s: writing %s failed\n", ex_prog, file);
  }
  return ok ? 0 : -1;
}

static float *read_floats(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "%s: --compare: cannot read %s: %s (a file written by --dump-params)\n",
            ex_prog, path, strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 20, len = 0;
  float *buf = malloc(cap * sizeof(float));
  while (buf) {
    len += fread(buf + len, sizeof(float), cap - len, f);
    if (len < cap) {
      break;
    }
    float *bigger = realloc(buf, 2 * cap * sizeof(float));
    if (!bigger) {
      free(buf);
    }
    buf = bigger;
    cap *= 2;
  }
  int bad = ferror(f) || !buf || fgetc(f) != EOF; // a partial trailing float is left unread
  fclose(f);
  if (bad) {
    fprintf(stderr, "%s: reading %s failed (or its size is not a multiple of 4)\n", ex_prog, path);
    free(buf);
    return NULL;
  }
  *n = len;
  return buf;
}

int ex_compare_dumps(const char *pa, const char *pb, double rtol) {
  size_t na = 0, nb = 0;
  float *a = read_floats(pa, &na), *b = read_floats(pb, &nb);
  int rc = 1;
  if (!a || !b) {
    goto done;
  }
  if (na != nb || na == 0) {
    fprintf(stderr, "compare: %s has %zu floats, %s has %zu\n", pa, na, pb, nb);
    goto done;
  }
  double sq = 0.0, worst = 0.0, maxabs = 0.0;
  for (size_t i = 0; i < na; i++) {
    sq += (double)a[i] * a[i];
  }
  double rms = sqrt(sq / (double)na);
  size_t bad = 0, worst_i = 0;
  for (size_t i = 0; i < na; i++) {
    double d = fabs((double)a[i] - b[i]);
    double scale = fmax(fmax(fabs(a[i]), fabs(b[i])), rms);
    double rel = d == 0.0 ? 0.0 : (isfinite(d) ? d / scale : INFINITY); // 0 vs 0: equal
    maxabs = fmax(maxabs, d);
    if (rel > worst || isnan(rel)) {
      worst = rel;
      worst_i = i;
    }
    if (!(rel <= rtol)) {
      if (bad < 5) {
        fprintf(stderr, "compare: element %zu: %.9g vs %.9g (relative %.3g > %.3g)\n", i, a[i],
                b[i], rel, rtol);
      }
      bad++;
    }
  }
  printf("compare: %zu floats, rms %.6g, max abs diff %.3g, max relative diff %.3g (element "
         "%zu), %zu over rtol %.3g\n",
         na, rms, maxabs, worst, worst_i, bad, rtol);
  rc = bad ? 1 : 0;
done:
  free(a);
  free(b);
  return rc;
}

int ex_write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "%s: cannot write %s: %s\n", ex_prog, path, strerror(errno));
    return -1;
  }
  int ok = fputs(text, f) >= 0;
  ok &= fclose(f) == 0;
  if (!ok) {
    fprintf(stderr, "%s: writing %s failed\n", ex_prog, path);
  }
  return ok ? 0 : -1;
}

int ex_nonfinite_skip(const loom_ctx_t *ctx) {
  const char *mode = loom_tunable(ctx, "LOOM_NONFINITE");
  return mode && !strcmp(mode, "skip");
}

void ex_nonfinite_step(const char *prog, const loom_ctx_t *ctx, long step, long total, double norm,
                       int rank, long *count) {
  (*count)++;
  if (!ex_nonfinite_skip(ctx)) {
    if (rank == 0) {
      fprintf(stderr,
              "%s: step %ld: the averaged gradient is not finite (global norm %g): aborting "
              "(LOOM_NONFINITE=abort; LOOM_NONFINITE=skip drops such steps; lower --lr or raise "
              "--clip if it recurs)\n",
              prog, step + 1, norm);
    }
    // loom_abort, not MPI_Abort: the ranks' timelines are written out first (LOOM_TIMELINE).
    char why[96];
    snprintf(why, sizeof why, "%s: step %ld: non-finite gradient (LOOM_NONFINITE=abort)", prog,
             step + 1);
    loom_abort(ctx, 3, why);
  }
  if (rank == 0) {
    printf("step %5ld/%ld  non-finite gradient (norm %g): step skipped on every rank (%ld so "
           "far)\n",
           step + 1, total, norm, *count);
    fflush(stdout);
  }
}

double ex_rss_mib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages_total = 0, pages_resident = 0;
  int ok = f && fscanf(f, "%ld %ld", &pages_total, &pages_resident) == 2;
  if (f) {
    fclose(f);
  }
  long page = sysconf(_SC_PAGESIZE);
  return ok && page > 0 ? (double)pages_resident * (double)page / (1024.0 * 1024.0) : -1.0;
}

loom_status_t ex_cpu_lane_stage(loom_host_stage_t **stage, const loom_tensor_t *g, int cpu) {
  if (cpu && !*stage) {
    return loom_host_stage_create(g->device, loom_tensor_numel(g), stage);
  }
  if (!cpu && *stage) {
    loom_host_stage_destroy(*stage);
    *stage = NULL;
  }
  return LOOM_OK;
}

static int by_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y ? 1 : 0;
}

double ex_median(double *x, long n) {
  if (n <= 0) {
    return 0.0;
  }
  qsort(x, (size_t)n, sizeof *x, by_double);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

const char *ex_json_num(char *buf, size_t cap, double v, int decimals) {
  if (isfinite(v)) {
    snprintf(buf, cap, "%.*f", decimals, v);
  } else {
    snprintf(buf, cap, "null");
  }
  return buf;
}

int ex_agree_start(const char *prog, int bad, const char *err, int argc, char **argv) {
  int rank = 0, first = INT_MAX;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int mine = bad ? rank : INT_MAX;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first != INT_MAX) {
    if (rank == first) { // rank 0's message stands alone; another's names its rank
      if (rank == 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
      } else {
        fprintf(stderr, "%s: rank %d: %s\n", prog, rank, err);
      }
    }
    return 2;
  }
  return ex_agree_args(prog, "the model's shapes, the data order and the steps come from it", argc,
                       argv);
}

void ex_report_init_failure(const char *prog) {
  const char *msg = loom_last_error(NULL);
  int rank = -1, used = 0;
  if (sscanf(msg, "rank %d: %n", &rank, &used) == 1 && used > 0) {
    return; // relayed: the rank it came from prints it
  }
  fprintf(stderr, "%s: loom_init: %s\n", prog, msg);
}
