/* test_sched_overlap.c — the scheduler under mpirun: a backward pass whose gradient buckets are
 * allreduced (loom_iallreduce) while earlier layers compute; checks sums, order and the timeline;
 * then the progress thread: an allreduce in flight during a compute task that never polls. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../check_mpi.h"
#include "loom.h"
#include "loom_sched.h"

#define NLAYERS         6
#define BUCKET          (1 << 20) // floats per gradient bucket (4 MB)
#define GEMM_N          192 // each backward task runs GEMMS_PER_LAYER (N, N) x (N, N) products
#define GEMMS_PER_LAYER 12
#define STEPS           5
#define MAX_EVENTS      64

enum { EV_BWD = 100, EV_AR = 200, EV_PREFETCH = 300, EV_OPT = 400 };

struct model {
  loom_ctx_t *ctx;
  const loom_group_t *dp;
  loom_sched_t *s;
  int rank, size;
  int64_t step;
  loom_tensor_t a, b, c;       // (GEMM_N, GEMM_N) operands of the busy work
  loom_tensor_t grad[NLAYERS]; // (BUCKET) gradient bucket of each layer
  struct layer {
    struct model *m;
    int k;
  } layer[NLAYERS];
  int events[MAX_EVENTS]; // what ran, in order
  int nevents;
  double norm0;  // sum of bucket 0 after its allreduce, from the worker task
  int64_t wrong; // elements off their expected sum
};

static void note(struct model *m, int ev) {
  if (m->nevents < MAX_EVENTS) {
    m->events[m->nevents++] = ev;
  }
}

// Every rank fills bucket k of step t with (rank + 1)(t + 1) + k + (i % 13) / 4: the sum over
// ranks is exact in f32.
static float grad_value(int rank, int64_t step, int k, int64_t i) {
  return (float)((rank + 1) * (step + 1) + k) + (float)(i % 13) * 0.25f;
}

static double grad_sum(int size, int64_t step, int k, int64_t i) {
  return (double)(step + 1) * size * (size + 1) / 2 + (double)size * (k + (double)(i % 13) * 0.25);
}

static loom_status_t busy(struct model *m) {
  for (int i = 0; i < GEMMS_PER_LAYER; i++) {
    loom_status_t st = loom_gemm(&m->c, &m->a, 0, &m->b, 0, NULL, 1.0f, 0.0f);
    if (st != LOOM_OK) {
      return st;
    }
    loom_sched_poll(m->s); // let the allreduces in flight progress between the GEMMs
  }
  return LOOM_OK;
}

static loom_status_t backward(void *arg) {
  struct layer *l = arg;
  struct model *m = l->m;
  loom_status_t st = busy(m);
  float *g = m->grad[l->k].data;
  for (int64_t i = 0; i < BUCKET; i++) {
    g[i] = grad_value(m->rank, m->step, l->k, i);
  }
  note(m, EV_BWD + l->k);
  return st;
}

static loom_status_t allreduce(void *arg, loom_request_t **req) {
  struct layer *l = arg;
  struct model *m = l->m;
  note(m, EV_AR + l->k);
  return loom_iallreduce(m->dp, &m->grad[l->k], &m->grad[l->k], LOOM_SUM, req);
}

// Worker lane: a stand-in for offloaded work on a reduced bucket (no MPI here).
static loom_status_t norm0(void *arg) {
  struct model *m = arg;
  const float *g = m->grad[0].data;
  double sum = 0;
  for (int64_t i = 0; i < BUCKET; i++) {
    sum += g[i];
  }
  m->norm0 = sum;
  return LOOM_OK;
}

// Independent compute that fills the compute lane while the last allreduces are in flight.
static loom_status_t prefetch(void *arg) {
  struct model *m = arg;
  note(m, EV_PREFETCH);
  return busy(m);
}

static loom_status_t optimizer(void *arg) {
  struct model *m = arg;
  note(m, EV_OPT);
  double want0 = 0;
  for (int k = 0; k < NLAYERS; k++) {
    const float *g = m->grad[k].data;
    for (int64_t i = 0; i < BUCKET; i++) {
      double want = grad_sum(m->size, m->step, k, i);
      if ((double)g[i] != want) {
        if (m->wrong++ < 5) {
          fprintf(stderr, "rank %d step %lld: bucket %d [%lld] = %.9g, want %.9g\n", m->rank,
                  (long long)m->step, k, (long long)i, (double)g[i], want);
        }
      }
      want0 += k == 0 ? want : 0;
    }
  }
  if (m->norm0 != want0) {
    m->wrong++;
    fprintf(stderr, "rank %d step %lld: worker sum of bucket 0 %.17g, want %.17g\n", m->rank,
            (long long)m->step, m->norm0, want0);
  }
  return LOOM_OK;
}

static int find(const struct model *m, int ev) {
  for (int i = 0; i < m->nevents; i++) {
    if (m->events[i] == ev) {
      return i;
    }
  }
  return -1;
}

static int add(loom_sched_t *s, loom_task_desc_t d) {
  int id = -1;
  if (loom_sched_add(s, &d, &id) != LOOM_OK) {
    fprintf(stderr, "loom_sched_add(%s): %s\n", d.name, loom_last_error(NULL));
    exit(1);
  }
  return id;
}

static void dep(loom_sched_t *s, int task, int after) {
  CHECK(loom_sched_depend(s, task, after) == LOOM_OK, "depend: %s", loom_last_error(NULL));
}

// The rank's timeline file is complete JSON holding the tasks and the rank as pid.
static void check_timeline(const char *path, int rank) {
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL, "rank %d: timeline %s was not written", rank, path);
  if (!f) {
    return;
  }
  static char text[1 << 22];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  char pid[32];
  snprintf(pid, sizeof pid, "\"pid\":%d,", rank);
  CHECK(!strncmp(text, "{\"traceEvents\":[", 16) && n > 4 && !strcmp(text + n - 4, "\n]}\n"),
        "rank %d: %s is one traceEvents object", rank, path);
  CHECK(strstr(text, "\"name\":\"allreduce 3\",\"cat\":\"comm\"") &&
            strstr(text, "\"name\":\"backward 0\",\"cat\":\"compute\"") &&
            strstr(text, "\"name\":\"norm0\",\"cat\":\"worker\"") && strstr(text, pid),
        "rank %d: %s holds the tasks with pid %d", rank, path, rank);
  remove(path);
}

// ---- the progress thread ----------------------------------------------------------------------

struct quiet {
  const loom_group_t *g;
  loom_tensor_t t; // (BUCKET) f32: rank + i % 7 on every rank before the allreduce
};

static loom_status_t quiet_fill(void *arg) {
  struct quiet *q = arg;
  float *x = q->t.data;
  for (int64_t i = 0; i < BUCKET; i++) {
    x[i] = (float)(loom_group_rank(q->g) + i % 7);
  }
  return LOOM_OK;
}

static loom_status_t quiet_allreduce(void *arg, loom_request_t **req) {
  struct quiet *q = arg;
  return loom_iallreduce(q->g, &q->t, &q->t, LOOM_SUM, req);
}

static loom_status_t quiet_sleep(void *arg) { // 30 ms of "compute" that never polls
  (void)arg;
  struct timespec ts = {0, 30 * 1000 * 1000};
  nanosleep(&ts, NULL);
  return LOOM_OK;
}

// fill -> allreduce, and a sleeping compute task after fill that does not call loom_sched_poll:
// the allreduce is in flight during the sleep, so the progress thread (on by default whenever
// MPI granted MPI_THREAD_MULTIPLE) must run; and the sum must be right.
static void test_progress_thread(loom_ctx_t *ctx, const loom_group_t *g, int rank) {
  int n = loom_group_size(g), level = 0;
  MPI_Query_thread(&level);
  const char *env = getenv("LOOM_SCHED_PROGRESS_US");
  // At np 1 the allreduce may finish before the sleep starts: no claim either way.
  long interval_us = env ? atol(env) : 1000;
  int expect_thread = level == MPI_THREAD_MULTIPLE && interval_us != 0;
  // A round every interval at most (the thread sleeps that long between its polls); an interval
  // longer than the 30 ms task may leave a step without any round (the thread still sleeps).
  int expect_polls = expect_thread && interval_us <= 10000;
  struct quiet q = {.g = g};
  int64_t count = BUCKET;
  CHECK(loom_tensor_alloc(&q.t, LOOM_F32, LOOM_DEVICE_HOST, 1, &count, "quiet") == LOOM_OK,
        "alloc quiet");
  loom_sched_t *s = NULL;
  CHECK(loom_sched_create(ctx, &(loom_sched_opts_t){.timeline = ""}, &s) == LOOM_OK, "create: %s",
        loom_last_error(ctx));
  int fill = add(
      s,
      (loom_task_desc_t){
          .name = "fill", .lane = LOOM_LANE_COMPUTE, .priority = 1, .run = quiet_fill, .arg = &q});
  int ar = add(s, (loom_task_desc_t){.name = "allreduce.quiet",
                                     .lane = LOOM_LANE_COMM,
                                     .start = quiet_allreduce,
                                     .arg = &q,
                                     .bytes = BUCKET * sizeof(float)});
  int nap = add(s, (loom_task_desc_t){
                       .name = "sleep", .lane = LOOM_LANE_COMPUTE, .run = quiet_sleep, .arg = &q});
  dep(s, ar, fill);
  dep(s, nap, fill);
  for (int step = 0; step < 3; step++) {
    CHECK(loom_sched_run(s) == LOOM_OK, "rank %d progress step %d: %s", rank, step,
          loom_last_error(ctx));
    loom_step_stats_t ss;
    loom_sched_step_stats(s, &ss);
    CHECK(n == 1 || (expect_polls     ? ss.progress_polls > 0
                     : !expect_thread ? ss.progress_polls == 0
                                      : 1),
          "rank %d step %d: %lld progress-thread polls during a 30 ms task that never polls (a "
          "thread is %sexpected: np %d, MPI thread level %d)",
          rank, step, (long long)ss.progress_polls, expect_thread ? "" : "not ", n, level);
    CHECK(!expect_thread || ss.progress_polls <= 2 + (int64_t)(ss.wall_ms * 1000 / interval_us),
          "rank %d step %d: %lld progress-thread polls in a %.1f ms step with "
          "LOOM_SCHED_PROGRESS_US=%ld (the thread must sleep that long between polls)",
          rank, step, (long long)ss.progress_polls, ss.wall_ms, interval_us);
    const float *x = q.t.data;
    int64_t wrong = 0;
    for (int64_t i = 0; i < BUCKET; i++) {
      wrong += x[i] != (float)((double)n * (n - 1) / 2 + (double)n * (i % 7));
    }
    CHECK(wrong == 0, "rank %d step %d: %lld wrong sums with the progress thread", rank, step,
          (long long)wrong);
    if (rank == 0 && step == 0) {
      printf("progress thread: %lld polls in a %.1f ms step (expected %s)\n",
             (long long)ss.progress_polls, ss.wall_ms, expect_thread ? "some" : "none");
    }
  }
  // Destroying wakes the thread out of its sleep between polls (was: destroy waited out the
  // rest of an interval, up to the whole second at LOOM_SCHED_PROGRESS_US=1000000).
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy: %s", loom_last_error(ctx));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  const double destroy_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  CHECK(
      interval_us < 500000 || destroy_ms < 250.0,
      "rank %d: loom_sched_destroy took %.1f ms with LOOM_SCHED_PROGRESS_US=%ld (it must wake the "
      "progress thread, not wait out its interval)",
      rank, destroy_ms, interval_us);
  loom_tensor_free(&q.t);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  loom_status_t st = loom_init(&argc, &argv, NULL, &ctx);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s: %s\n", loom_strerror(st), loom_last_error(NULL));
    return 1;
  }
  static struct model model;
  struct model *m = &model;
  m->ctx = ctx;
  m->dp = loom_group(ctx, LOOM_GROUP_DP);
  m->rank = loom_rank(ctx);
  m->size = loom_group_size(m->dp);
  MPI_Comm world = loom_group_comm(loom_group(ctx, LOOM_GROUP_WORLD));

  int64_t sq[2] = {GEMM_N, GEMM_N}, bucket = BUCKET;
  CHECK(loom_tensor_alloc(&m->a, LOOM_F32, LOOM_DEVICE_HOST, 2, sq, "a") == LOOM_OK &&
            loom_tensor_alloc(&m->b, LOOM_F32, LOOM_DEVICE_HOST, 2, sq, "b") == LOOM_OK &&
            loom_tensor_alloc(&m->c, LOOM_F32, LOOM_DEVICE_HOST, 2, sq, "c") == LOOM_OK,
        "alloc");
  loom_tensor_fill(&m->a, 0.01);
  loom_tensor_fill(&m->b, 0.02);
  for (int k = 0; k < NLAYERS; k++) {
    char name[32];
    snprintf(name, sizeof name, "grad%d", k);
    CHECK(loom_tensor_alloc(&m->grad[k], LOOM_F32, LOOM_DEVICE_HOST, 1, &bucket, name) == LOOM_OK,
          "alloc %s", name);
  }

  // The timeline path: LOOM_TIMELINE when the spec sets it, else one rank 0 picks.
  long tag = (long)getpid();
  MPI_Bcast(&tag, 1, MPI_LONG, 0, world);
  char pattern[256], path[300];
  const char *env = getenv("LOOM_TIMELINE");
  if (env && env[0]) {
    snprintf(pattern, sizeof pattern, "%s", env);
  } else {
    const char *tmp = getenv("TMPDIR");
    snprintf(pattern, sizeof pattern, "%s/loom_sched_overlap_%ld_%%r.json", tmp ? tmp : "/tmp",
             tag);
  }
  const char *r = strstr(pattern, "%r"), *dot = strrchr(pattern, '.');
  int np = 1;
  MPI_Comm_size(world, &np);
  if (r) {
    snprintf(path, sizeof path, "%.*s%d%s", (int)(r - pattern), pattern, m->rank, r + 2);
  } else if (np > 1) { // no %r: loom writes NAME.RANK.EXT, one file per rank
    const int at = dot ? (int)(dot - pattern) : (int)strlen(pattern);
    snprintf(path, sizeof path, "%.*s.%d%s", at, pattern, m->rank, pattern + at);
  } else {
    snprintf(path, sizeof path, "%s", pattern);
  }

  // The graph: backward runs from the last layer down; bucket k's allreduce waits for layer
  // k's backward; a worker task sums bucket 0 once reduced; the optimizer waits for all.
  // LOOM_TIMELINE in the environment overrides the program's path, as for every tunable.
  loom_sched_opts_t opts = {
      .workers = 1, .timeline = env && env[0] ? "/nonexistent-loom/overridden_%r.json" : pattern};
  st = loom_sched_create(ctx, &opts, &m->s);
  CHECK(st == LOOM_OK, "loom_sched_create: %s", loom_last_error(ctx));
  if (st != LOOM_OK) {
    return 1;
  }
  loom_sched_t *s = m->s;
  int bwd[NLAYERS], ar[NLAYERS];
  for (int k = NLAYERS - 1; k >= 0; k--) {
    char name[32];
    m->layer[k] = (struct layer){m, k};
    snprintf(name, sizeof name, "backward %d", k);
    bwd[k] = add(s, (loom_task_desc_t){.name = name,
                                       .lane = LOOM_LANE_COMPUTE,
                                       .priority = 10,
                                       .run = backward,
                                       .arg = &m->layer[k]});
    snprintf(name, sizeof name, "allreduce %d", k);
    ar[k] = add(s, (loom_task_desc_t){.name = name,
                                      .lane = LOOM_LANE_COMM,
                                      .priority = NLAYERS - k,
                                      .start = allreduce,
                                      .arg = &m->layer[k],
                                      .bytes = BUCKET * sizeof(float)});
    dep(s, ar[k], bwd[k]);
    if (k < NLAYERS - 1) {
      dep(s, bwd[k], bwd[k + 1]);
    }
  }
  int nrm = add(s, (loom_task_desc_t){.name = "norm0",
                                      .lane = LOOM_LANE_WORKER,
                                      .run = norm0,
                                      .arg = m,
                                      .bytes = BUCKET * sizeof(float)});
  int pre = add(s, (loom_task_desc_t){.name = "prefetch",
                                      .lane = LOOM_LANE_COMPUTE,
                                      .priority = -1,
                                      .run = prefetch,
                                      .arg = m});
  int opt = add(s, (loom_task_desc_t){
                       .name = "optimizer", .lane = LOOM_LANE_COMPUTE, .run = optimizer, .arg = m});
  (void)pre;
  dep(s, nrm, ar[0]);
  dep(s, opt, nrm);
  for (int k = 0; k < NLAYERS; k++) {
    dep(s, opt, ar[k]);
  }

  if (m->rank == 0) {
    printf("np %d, %d layers, %d MB buckets, %d steps\n", m->size, NLAYERS,
           (int)(BUCKET * sizeof(float) >> 20), STEPS);
    printf("%4s %9s %9s %9s %9s %9s %9s %7s\n", "step", "wall_ms", "compute", "comm", "exposed",
           "worker", "idle", "polls");
  }
  for (int t = 0; t < STEPS; t++) {
    m->step = t;
    m->nevents = 0;
    st = loom_sched_run(s);
    CHECK(st == LOOM_OK, "rank %d step %d: %s", m->rank, t, loom_last_error(ctx));
    // Order: each allreduce after its backward; allreduces start last layer first, the same
    // on every rank; the optimizer after everything.
    for (int k = 0; k < NLAYERS; k++) {
      CHECK(find(m, EV_AR + k) > find(m, EV_BWD + k) && find(m, EV_BWD + k) >= 0,
            "rank %d step %d: allreduce %d before its backward", m->rank, t, k);
      if (k > 0) {
        CHECK(find(m, EV_AR + k - 1) > find(m, EV_AR + k), "rank %d step %d: comm order", m->rank,
              t);
      }
    }
    // The optimizer after every backward and allreduce (the low-priority prefetch may follow it
    // when the allreduces finish at once, as at np 1).
    int opt_after = m->nevents == 2 * NLAYERS + 2 && find(m, EV_OPT) >= 0;
    for (int k = 0; k < NLAYERS; k++) {
      opt_after = opt_after && find(m, EV_OPT) > find(m, EV_AR + k);
    }
    CHECK(opt_after, "rank %d step %d: optimizer after every allreduce, %d events", m->rank, t,
          m->nevents);
    loom_step_stats_t ss;
    loom_sched_step_stats(s, &ss);
    CHECK(ss.step == t && ss.tasks_run == 2 * NLAYERS + 3 && ss.wall_ms >= ss.compute_ms &&
              ss.comm_ms > 0,
          "rank %d step %d stats: step %lld, %d tasks, wall %.3f, compute %.3f, comm %.3f", m->rank,
          t, (long long)ss.step, ss.tasks_run, ss.wall_ms, ss.compute_ms, ss.comm_ms);
    if (m->rank == 0) {
      printf("%4lld %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %7lld\n", (long long)ss.step, ss.wall_ms,
             ss.compute_ms, ss.comm_ms, ss.exposed_comm_ms, ss.worker_ms, ss.idle_ms,
             (long long)ss.polls);
    }
  }
  CHECK(m->wrong == 0, "rank %d: %lld wrong elements", m->rank, (long long)m->wrong);
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy: %s", loom_last_error(ctx));
  check_timeline(path, m->rank);
  test_progress_thread(ctx, m->dp, m->rank);

  loom_tensor_free(&m->a);
  loom_tensor_free(&m->b);
  loom_tensor_free(&m->c);
  for (int k = 0; k < NLAYERS; k++) {
    loom_tensor_free(&m->grad[k]);
  }
  int rc = check_exit_all("test_sched_overlap");
  loom_finalize(ctx);
  return rc;
}
