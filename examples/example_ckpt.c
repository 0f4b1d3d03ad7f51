/* example_ckpt.c — checkpoint directories of the example trainers: per-rank files through
 * loom_checkpoint_save, a "latest" pointer written last, and agreement on failure. */
#include "config.h"

#include "example_ckpt.h"
#include "example_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mpi.h>

int ex_parse_ckpt(const char *flag, const char *v, ex_ckpt_opts_t *o, char *err, size_t errlen) {
  if (!strcmp(flag, "--resume")) {
    o->resume = 1;
  } else if (!strcmp(flag, "--ckpt")) {
    o->dir = v;
  } else if (!strcmp(flag, "--save-every")) {
    return ex_parse_long(flag, v, 0, 1L << 40, &o->save_every, err, errlen) ? -1 : 1;
  } else if (!strcmp(flag, "--die-at")) {
    return ex_parse_long(flag, v, 0, 1L << 40, &o->die_at, err, errlen) ? -1 : 1;
  } else {
    return 0;
  }
  return 1;
}

int ex_check_ckpt(const ex_ckpt_opts_t *o, char *err, size_t errlen) {
  if (o->dir && !*o->dir) { // "" + "/latest" would be the root folder's /latest
    snprintf(err, errlen, "--ckpt wants a directory, got an empty path");
    return -1;
  }
  if ((o->save_every > 0 || o->resume) && !o->dir) {
    snprintf(err, errlen, "--save-every and --resume need --ckpt DIR (where checkpoints live)");
    return -1;
  }
  if (o->dir && !o->save_every && !o->resume) {
    snprintf(err, errlen, "--ckpt %s without --save-every N or --resume does nothing: add one",
             o->dir);
    return -1;
  }
  if (o->save_every > 0) { // made and probed now, not at the first save
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/probe", o->dir);
    struct stat st;
    if (mkdir(o->dir, 0755) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "--ckpt %s: cannot create it: %s: give a writable directory", o->dir,
               strerror(errno));
      return -1;
    }
    if (stat(o->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "--ckpt %s is not a directory: give a directory", o->dir);
      return -1;
    }
    return ex_check_output("--ckpt", probe, err, errlen);
  }
  return 0;
}

int ex_any(const loom_group_t *g, int bad) {
  int32_t v = bad != 0;
  int64_t one = 1;
  loom_tensor_t t;
  if (loom_tensor_wrap(&t, &v, LOOM_I32, LOOM_DEVICE_HOST, 1, &one, "any") != LOOM_OK ||
      loom_allreduce(g, &t, &t, LOOM_MAX) != LOOM_OK) {
    fprintf(stderr, "checkpoint: agreeing over the group failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  return v != 0;
}

int ex_ckpt_path(char *out, size_t cap, const char *dir, long step, int rank) {
  int n = snprintf(out, cap, "%s/step-%08ld/rank-%05d.ckpt", dir, step, rank);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static int make_dir(const char *path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "checkpoint: cannot create directory %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

// DIR/latest = step, through a temporary file, fsync and rename.
static int write_latest(const char *dir, long step) {
  char tmp[4096], path[4096], text[32];
  snprintf(path, sizeof path, "%s/latest", dir);
  snprintf(tmp, sizeof tmp, "%s/latest.tmp", dir);
  int len = snprintf(text, sizeof text, "%ld\n", step);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int ok = fd >= 0 && write(fd, text, (size_t)len) == len && fsync(fd) == 0;
  if (fd >= 0 && close(fd) != 0) {
    ok = 0;
  }
  ok = ok && rename(tmp, path) == 0;
  int dfd = ok ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  ok = ok && dfd >= 0 && fsync(dfd) == 0;
  if (dfd >= 0) {
    close(dfd);
  }
  if (!ok) {
    fprintf(stderr, "checkpoint: cannot update %s: %s\n", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

int ex_ckpt_save(const char *dir, const loom_group_t *g, long step, long drop,
                 const loom_tensor_t *const *t, int n) {
  const int rank = loom_group_rank(g);
  char sub[4096], path[4096];
  int bad = 0;
  snprintf(sub, sizeof sub, "%s/step-%08ld", dir, step);
  if (rank == 0) {
    bad = make_dir(dir) != 0 || make_dir(sub) != 0;
  }
  if (ex_any(g, bad)) {
    return -1;
  }
  loom_ckpt_info_t info = {.world_size = loom_group_size(g), .rank = rank, .step = step};
  if (ex_ckpt_path(path, sizeof path, dir, step, rank) != 0) {
    fprintf(stderr, "checkpoint: the path under %s is too long\n", dir);
    bad = 1;
  } else if (loom_checkpoint_save(path, &info, t, n) != LOOM_OK) {
    fprintf(stderr, "checkpoint: rank %d: %s\n", rank, loom_last_error(NULL));
    bad = 1;
  }
  if (ex_any(g, bad)) {
    return -1;
  }
  if (rank == 0) {
    bad = write_latest(dir, step) != 0;
  }
  if (ex_any(g, bad)) {
    return -1;
  }
  if (drop >= 0 && ex_ckpt_path(path, sizeof path, dir, drop, rank) == 0) {
    unlink(path); // (missing already: nothing to do)
    if (ex_any(g, 0) == 0 && rank == 0) {
      snprintf(sub, sizeof sub, "%s/step-%08ld", dir, drop);
      rmdir(sub);
    }
  }
  return 0;
}

long ex_ckpt_latest(const char *dir, const loom_group_t *g) {
  int64_t step = -1;
  if (loom_group_rank(g) == 0) {
    char path[4096];
    snprintf(path, sizeof path, "%s/latest", dir);
    FILE *f = fopen(path, "r");
    if (f) {
      // Only digits and one newline (as write_latest puts it): anything else is damage.
      char text[32] = "";
      size_t got = fread(text, 1, sizeof text - 1, f);
      text[got] = '\0';
      size_t digits = strspn(text, "0123456789");
      const int whole = digits >= 1 && digits <= 18 &&
                        (got == digits || (got == digits + 1 && text[digits] == '\n'));
      step = whole ? (int64_t)strtoll(text, NULL, 10) : -2;
      if (step == -2) {
        fprintf(stderr,
                "checkpoint: %s does not hold a step number (digits and a newline): remove it "
                "or point --ckpt elsewhere\n",
                path);
      }
      fclose(f);
    } else if (errno != ENOENT) {
      fprintf(stderr, "checkpoint: cannot read %s: %s\n", path, strerror(errno));
      step = -2;
    }
  }
  int64_t one = 1;
  loom_tensor_t t;
  if (loom_tensor_wrap(&t, &step, LOOM_I64, LOOM_DEVICE_HOST, 1, &one, "latest") != LOOM_OK ||
      loom_broadcast(g, &t, 0) != LOOM_OK) {
    fprintf(stderr, "checkpoint: broadcast of the latest step failed: %s\n", loom_last_error(NULL));
    return -2;
  }
  return (long)step;
}

// ---- the tensors of a checkpoint ------------------------------------------------------------

static void fatal_oom(void) {
  fprintf(stderr, "checkpoint: out of memory\n");
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void ex_ckpt_set_init(ex_ckpt_set_t *cs, int cap, const loom_ef_t *ef, int nplan) {
  memset(cs, 0, sizeof *cs);
  cs->cap = cap + loom_ef_count(ef) + loom_ef_state_count(ef) + 3;
  cs->t = calloc((size_t)cs->cap, sizeof *cs->t);
  cs->p = calloc((size_t)cs->cap, sizeof *cs->p);
  cs->plan = calloc(3 * (size_t)nplan + 1, sizeof *cs->plan);
  if (!cs->t || !cs->p || !cs->plan) {
    fatal_oom();
  }
}

void ex_ckpt_set_add(ex_ckpt_set_t *cs, const loom_tensor_t *src, const char *name) {
  if (cs->n == cs->cap) {
    fprintf(stderr, "checkpoint: more tensors than the set was made for (%d)\n", cs->cap);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  loom_tensor_t *v = &cs->t[cs->n];
  if (loom_tensor_wrap(v, src->data, src->dtype, src->device, src->ndim, src->shape, name) !=
      LOOM_OK) {
    fprintf(stderr, "checkpoint: %s: %s\n", name, loom_last_error(NULL));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  cs->p[cs->n++] = v;
}

// Residuals as "ef:NAME", codec state (PowerSGD's Q) as "efq:NAME".
void ex_ckpt_set_add_ef(ex_ckpt_set_t *cs, const loom_ef_t *ef) {
  const int nres = loom_ef_count(ef), nall = nres + loom_ef_state_count(ef);
  for (int i = 0; ef && i < nall; i++) {
    const char *ename = NULL;
    const float *data = NULL;
    int64_t n = 0;
    char name[LOOM_NAME_MAX];
    loom_tensor_t r;
    loom_status_t st = i < nres ? loom_ef_entry(ef, i, &ename, &data, &n)
                                : loom_ef_state_entry(ef, i - nres, &ename, &data, &n);
    if (st != LOOM_OK ||
        loom_tensor_wrap(&r, (void *)data, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "ef") != LOOM_OK) {
      fprintf(stderr, "checkpoint: error-feedback entry %d: %s\n", i, loom_last_error(NULL));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    snprintf(name, sizeof name, "%s:%s", i < nres ? "ef" : "efq", ename);
    ex_ckpt_set_add(cs, &r, name);
  }
}

void ex_ckpt_set_add_plan(ex_ckpt_set_t *cs, const int *codec, const loom_scheme_t *scheme,
                          const int *lane, int n) {
  for (int k = 0; k < n; k++) {
    cs->plan[k] = codec[k];
    cs->plan[n + k] = (int32_t)scheme[k];
    cs->plan[2 * n + k] = lane ? lane[k] : 0;
  }
  int64_t len = n;
  loom_tensor_t c, s, l;
  loom_tensor_wrap(&c, cs->plan, LOOM_I32, LOOM_DEVICE_HOST, 1, &len, "auto.codec");
  loom_tensor_wrap(&s, cs->plan + n, LOOM_I32, LOOM_DEVICE_HOST, 1, &len, "auto.scheme");
  loom_tensor_wrap(&l, cs->plan + 2 * n, LOOM_I32, LOOM_DEVICE_HOST, 1, &len, "auto.lane");
  ex_ckpt_set_add(cs, &c, "auto.codec");
  ex_ckpt_set_add(cs, &s, "auto.scheme");
  if (lane) {
    ex_ckpt_set_add(cs, &l, "auto.lane");
  }
}

void ex_ckpt_set_add_flags(ex_ckpt_set_t *cs, const ex_ckpt_flag_t *flags, int n) {
  for (int i = 0; i < n; i++) {
    char name[LOOM_NAME_MAX];
    int64_t one = 1;
    loom_tensor_t v;
    snprintf(name, sizeof name, "flag:%s", flags[i].name);
    if (loom_tensor_wrap(&v, (void *)&flags[i].value, LOOM_I64, LOOM_DEVICE_HOST, 1, &one, name) !=
        LOOM_OK) {
      fprintf(stderr, "checkpoint: %s: %s\n", name, loom_last_error(NULL));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    ex_ckpt_set_add(cs, &v, name);
  }
}

void ex_ckpt_set_free(ex_ckpt_set_t *cs) {
  free(cs->t);
  free(cs->p);
  free(cs->plan);
  memset(cs, 0, sizeof *cs);
}

// One entry beyond the fixed tensors: a residual or half of a plan. Returns 0, or -1 (printed).
static int load_extra(const char *prog, const char *path, int rank, const loom_tensor_t *v,
                      loom_ef_t *ef, int *codec, loom_scheme_t *scheme, int *lane, int n, int ncand,
                      int *planned, const ex_ckpt_flag_t *flags, int nflags) {
  for (int k = 0; !strncmp(v->name, "flag:", 5) && k < nflags; k++) {
    if (strcmp(v->name + 5, flags[k].name) != 0) {
      continue;
    }
    const int whole = v->dtype == LOOM_I64 && v->ndim == 1 && v->shape[0] == 1;
    if (!whole || *(const int64_t *)v->data != flags[k].value) {
      fprintf(stderr,
              "%s: --resume: rank %d: %s was saved with %s %lld, this run has %s %lld: resume "
              "with the %s it was saved with\n",
              prog, rank, path, flags[k].name, whole ? (long long)*(const int64_t *)v->data : -1LL,
              flags[k].name, (long long)flags[k].value, flags[k].name);
      return -1;
    }
  }
  const int is_res = !strncmp(v->name, "ef:", 3), is_state = !strncmp(v->name, "efq:", 4);
  if (is_res || is_state) { // residuals and codec state come back by name
    const char *key = v->name + (is_res ? 3 : 4);
    if (!ef || v->dtype != LOOM_F32 || v->ndim != 1) {
      fprintf(stderr,
              "%s: --resume: rank %d: %s holds error-feedback residuals but this run %s: "
              "resume with the --compress it was saved with\n",
              prog, rank, path, ef ? "cannot take them" : "compresses nothing");
      return -1;
    }
    if ((is_res ? loom_ef_set(ef, key, v->data, v->shape[0])
                : loom_ef_state_set(ef, key, v->data, v->shape[0])) != LOOM_OK) {
      fprintf(stderr, "%s: --resume: rank %d: %s: entry '%s' is refused: %s\n", prog, rank, path,
              v->name, loom_last_error(NULL)); // the library's reason (a non-finite residual...)
      return -1;
    }
    return 0;
  }
  int is_codec = !strcmp(v->name, "auto.codec"), is_scheme = !strcmp(v->name, "auto.scheme");
  int is_lane = !strcmp(v->name, "auto.lane");
  if (!is_codec && !is_scheme && !is_lane) {
    return 0; // a fixed tensor, loaded already
  }
  if (!codec || v->dtype != LOOM_I32 || v->ndim != 1 || v->shape[0] != n) {
    fprintf(stderr,
            "%s: --resume: rank %d: %s holds a --compress auto plan of %lld parts but this "
            "run is not --compress auto with %d parts\n",
            prog, rank, path, (long long)v->shape[0], n);
    return -1;
  }
  const int32_t *x = v->data;
  const int lo = is_scheme ? 0 : -1, hi = is_scheme ? LOOM_SCHEME_COUNT - 1 : ncand - 1;
  for (int k = 0; k < n && !is_lane; k++) { // codecs: -1 (uncompressed) or a candidate
    if (x[k] < lo || x[k] > hi) {
      fprintf(stderr,
              "%s: --resume: rank %d: %s holds %s %d for part %d of its --compress auto "
              "plan, not one of %d..%d: the file is damaged; resume from an earlier step or "
              "start afresh\n",
              prog, rank, path, is_scheme ? "scheme" : "codec", (int)x[k], k, lo, hi);
      return -1;
    }
  }
  for (int k = 0; k < n; k++) {
    if (is_codec) {
      codec[k] = x[k]; // -1: uncompressed
    } else if (is_scheme) {
      scheme[k] = (loom_scheme_t)x[k];
    } else if (lane) { // the lanes a device plan can give; anything else: the GPU's (0)
      lane[k] = x[k] == LOOM_LANE_WORKER || x[k] == LOOM_PLAN_LANE_GPU ? x[k] : 0;
    }
  }
  *planned |= is_codec ? 1 : (is_scheme ? 2 : 0); // a plan is its codecs and its schemes
  return 0;
}

// A --compress auto plan is the same on every rank (each rank encodes what the others decode):
// files from different runs would make the first step's exchange fail as a corrupt payload, far
// from the cause. FNV-1a over the plan, its lowest and highest value over the group compared.
static int plans_agree(const char *prog, const char *path, const loom_group_t *g, const int *codec,
                       const loom_scheme_t *scheme, const int *lane, int n, int planned) {
  uint64_t h = 1469598103934665603ULL;
  for (int k = 0; planned && k < n; k++) {
    const int64_t part[3] = {codec[k], (int64_t)scheme[k], lane ? lane[k] : 0};
    for (int j = 0; j < 3; j++) {
      h = (h ^ (uint64_t)part[j]) * 1099511628211ULL;
    }
  }
  int64_t v[2] = {(int64_t)(h >> 1), -(int64_t)(h >> 1)}, two = 2; // max of h, max of -h
  loom_tensor_t t;
  if (loom_tensor_wrap(&t, v, LOOM_I64, LOOM_DEVICE_HOST, 1, &two, "plan.hash") != LOOM_OK ||
      loom_allreduce(g, &t, &t, LOOM_MAX) != LOOM_OK) {
    fprintf(stderr, "checkpoint: agreeing over the group failed: %s\n", loom_last_error(NULL));
    return 0;
  }
  if (v[0] == -v[1]) {
    return 1;
  }
  if (loom_group_rank(g) == 0) {
    fprintf(stderr,
            "%s: --resume: the ranks' checkpoints hold different --compress auto plans (rank 0 "
            "read %s): they come from different runs; resume every rank from one run's folder, "
            "or start afresh\n",
            prog, path);
  }
  return 0;
}

int ex_ckpt_load(const char *prog, const char *dir, const loom_group_t *g, long step,
                 const ex_ckpt_set_t *fixed, loom_ef_t *ef, int *codec, loom_scheme_t *scheme,
                 int *lane, int n, int ncand, int *planned, const ex_ckpt_flag_t *flags,
                 int nflags) {
  const int rank = loom_group_rank(g);
  char path[4096];
  loom_ckpt_info_t me = {.world_size = loom_group_size(g), .rank = rank};
  int bad = ex_ckpt_path(path, sizeof path, dir, step, rank) != 0;
  loom_checkpoint_t *ck = NULL;
  int64_t saved = -1;
  if (!bad && (loom_checkpoint_load(path, &me, (loom_tensor_t *const *)fixed->p, fixed->n,
                                    &saved) != LOOM_OK ||
               loom_checkpoint_open(path, &ck) != LOOM_OK)) {
    fprintf(stderr, "%s: --resume: rank %d: %s\n", prog, rank, loom_last_error(NULL));
    bad = 1;
  }
  if (!bad && saved != step) { // a file copied in from another save: the replicas would differ
    fprintf(stderr,
            "%s: --resume: rank %d: %s holds step %lld, not %ld as its folder and %s/latest "
            "say: it was copied from another save; restore that folder from one save, or "
            "resume from an earlier step\n",
            prog, rank, path, (long long)saved, step, dir);
    bad = 1;
  }
  *planned = 0;
  for (int i = 0; !bad && i < loom_checkpoint_count(ck); i++) {
    loom_tensor_t v;
    bad = loom_checkpoint_entry(ck, i, &v) != LOOM_OK ||
          load_extra(prog, path, rank, &v, ef, codec, scheme, lane, n, ncand, planned, flags,
                     nflags) != 0;
  }
  loom_checkpoint_close(ck);
  if (!bad && (*planned == 1 || *planned == 2)) { // lanes come with a device plan, or not at all
    fprintf(stderr,
            "%s: --resume: rank %d: %s holds the %s of a --compress auto plan but not its %s: "
            "the file is damaged; resume from an earlier step or start afresh\n",
            prog, rank, path, *planned == 1 ? "codecs" : "schemes",
            *planned == 1 ? "schemes" : "codecs");
    bad = 1;
  }
  *planned = *planned == 3;
  if (ex_any(g, bad)) {
    return -1;
  }
  return plans_agree(prog, path, g, codec, scheme, lane, n, *planned) ? 0 : -1;
}
