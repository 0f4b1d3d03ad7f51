/* sched.c — the step scheduler: builds the task graph, freezes it on the first run (cycle check,
 * fixed comm order), and replays it each step on the compute, comm and worker lanes with stats. */
#include "config.h"

#include "loom_sched.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctx.h"
#include "error.h"
#include "log.h"
#include "params.h"
#include "sched_internal.h"
#include "timeline.h"

#define BACKOFF_FIRST_NS 2000   // first sleep while waiting for comm or workers
#define BACKOFF_MAX_NS   200000 // the longest sleep between polls

enum task_state { TASK_WAITING = 0, TASK_READY, TASK_RUNNING, TASK_DONE };

struct task {
  loom_task_desc_t d; // d.name points to name
  char *name;
  int *pred, npred, cpred; // tasks this one waits for
  int *succ, nsucc, csucc; // tasks waiting for this one
  // Per step:
  int pending; // predecessors not done yet
  int state;   // enum task_state
  loom_request_t *req;
  int slot; // comm: timeline track while in flight
  int64_t t_start;
  struct loom_worker_job job;
  struct loom_gpu_task gpu; // CUDA schedulers
};

struct loom_sched {
  loom_ctx_t *ctx; // may be NULL
  int rank, nworkers;
  struct task *t; // (cap) tasks by id
  int n, cap;
  int frozen;

  // Fixed when the graph freezes:
  int *comm_seq; // (ncomm) the order comm tasks start in
  int ncomm, nworker_tasks;
  struct loom_heap compute_ready;     // (n) ready compute tasks
  int *inflight;                      // (ncomm) comm tasks with a request out, in start order
  int ninflight;                      //
  unsigned char *slot_busy;           // (ncomm) comm timeline tracks in use
  struct loom_worker_pool *pool;      // NULL without worker tasks
  struct loom_worker_job **collected; // (nworker_tasks) scratch for loom_worker_pool_collect
  int worker_inflight;                // submitted, not collected

  // The step in progress:
  int running;
  int starting; // inside a comm task's start: loom_sched_poll from there does nothing
  pthread_t run_thread;
  int next_comm; // index into comm_seq of the next comm task to start
  int remaining, tasks_run;
  loom_status_t failure;
  char failure_msg[LOOM_ERROR_MAX]; // its message: later tasks clear the thread's error
  int64_t step;
  int64_t comm_since; // when the in-flight comm count last went from 0 to 1
  int64_t compute_ns, comm_ns, worker_ns, exposed_comm_ns, exposed_worker_ns, polls, sleeps;
  loom_step_stats_t last;

  struct loom_timeline *tl; // NULL when off
  int64_t origin_ns;
  int64_t spin_ns;  // LOOM_SCHED_SPIN_US: poll without sleeping this long while comm is out
  long progress_us; // LOOM_SCHED_PROGRESS_US: progress thread interval; 0: no thread
  struct loom_progress *progress; // started at freeze when comm tasks exist; NULL otherwise
  int64_t progress_polls0;        // its poll count when the step began
  int cuda;                       // opts.cuda
  struct loom_sched_gpu *gpu;     // CUDA lanes (created at freeze when cuda is set)
  const char **names;             // (n) task names for the GPU timeline tracks
  double gpu_ms;                  // the last step's GPU compute time
};

static const char *const lane_names[LOOM_LANE_COUNT] = {"compute", "comm", "worker"};

// ---- building the graph ----------------------------------------------------------------------

static loom_status_t push_int(loom_ctx_t *ctx, int **v, int *n, int *cap, int x) {
  loom_status_t status = LOOM_OK;
  if (*n == *cap) {
    int ncap = *cap ? 2 * *cap : 4;
    int *nv = realloc(*v, (size_t)ncap * sizeof *nv);
    LOOM_CHECK_SYS(ctx, nv != NULL, "realloc(task dependencies)");
    *v = nv, *cap = ncap;
  }
  (*v)[(*n)++] = x;
fail:
  return status;
}

loom_status_t loom_sched_create(loom_ctx_t *ctx, const loom_sched_opts_t *opts,
                                loom_sched_t **out) {
  loom_status_t status = LOOM_OK;
  loom_sched_t *s = NULL;
  loom_sched_opts_t o = {0};
  if (!out) {
    return loom_error(ctx, LOOM_ERR_INVALID_ARG, "loom_sched_create: the output pointer is NULL");
  }
  *out = NULL;
  if (opts) {
    o = *opts;
  }
  if (o.workers < 0) {
    return loom_error(ctx, LOOM_ERR_INVALID_ARG,
                      "loom_sched_create: workers = %d; give 0 (one thread) or more", o.workers);
  }
  s = calloc(1, sizeof *s);
  LOOM_CHECK_SYS(ctx, s != NULL, "calloc(loom_sched)");
  s->ctx = ctx;
  s->rank = ctx ? ctx->rank : o.rank;
  s->nworkers = o.workers > 0 ? o.workers : 1;
  s->origin_ns = loom_sched_now_ns();
  // More ranks than cores on this host: a rank that spins takes the core from the rank it shares
  // it with, which is still computing, so waits sleep with backoff from the first poll (unless
  // LOOM_SCHED_SPIN_US was set).
  int forced = 0;
  s->spin_ns = 1000 * (int64_t)(ctx ? loom_sched_spin_us_effective(ctx, &forced)
                                    : LOOM_SCHED_SPIN_US_DEFAULT);
  s->progress_us = ctx ? ctx->params.sched_progress_us : LOOM_SCHED_PROGRESS_US_DEFAULT;
  if (forced) {
    LOOM_INFO(LOOM_SUB_SCHED, "%d ranks on %d cores: the scheduler waits without spinning",
              ctx->local_size, ctx->topo.pub.cores);
  }
  s->cuda = o.cuda != 0;
#ifndef LOOM_HAVE_CUDA
  if (s->cuda) {
    free(s);
    return loom_error(ctx, LOOM_ERR_UNSUPPORTED,
                      "loom_sched_create: opts.cuda is set but this loom was built without CUDA: "
                      "reconfigure with --with-cuda, or leave opts.cuda at 0");
  }
#else
  if (s->cuda && loom_cuda_device_count() < 1) {
    free(s);
    return loom_error(ctx, LOOM_ERR_UNSUPPORTED,
                      "loom_sched_create: opts.cuda is set but this process sees no CUDA device "
                      "(no driver or GPU, or CUDA_VISIBLE_DEVICES hides them): leave opts.cuda at "
                      "0 on CPU-only ranks");
  }
#endif

  // The environment overrides the program, as for every tunable; then opts, then the config.
  const char *path = o.timeline;
  int tunable = 0; // LOOM_TIMELINE (environment or config): %r-less paths get the rank
  if (ctx && (ctx->params.source[LOOM_P_TIMELINE] == LOOM_SRC_ENV || !path)) {
    path = ctx->params.timeline;
    tunable = 1;
  }
  if (path && path[0]) {
    LOOM_CHECK(loom_timeline_open(ctx, path, s->rank, s->origin_ns, tunable, &s->tl));
  }
  *out = s;
  return LOOM_OK;
fail:
  free(s);
  return status;
}

loom_status_t loom_sched_add(loom_sched_t *s, const loom_task_desc_t *d, int *id) {
  loom_status_t status = LOOM_OK;
  char *name = NULL;
  if (!s || !d || !id) {
    return loom_error(s ? s->ctx : NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sched_add: scheduler, descriptor and id must not be NULL");
  }
  *id = -1;
  const char *shown = d->name ? d->name : "(unnamed)";
  if (s->frozen) {
    return loom_error(s->ctx, LOOM_ERR_STATE,
                      "loom_sched_add('%s'): the graph has run and is fixed; add every task "
                      "before the first loom_sched_run",
                      shown);
  }
  if ((int)d->lane < 0 || d->lane >= LOOM_LANE_COUNT) {
    return loom_error(s->ctx, LOOM_ERR_INVALID_ARG,
                      "loom_sched_add('%s'): lane %d is not compute, comm or worker", shown,
                      (int)d->lane);
  }
  if (d->lane == LOOM_LANE_COMM ? (!d->start || d->run) : (!d->run || d->start)) {
    return loom_error(s->ctx, LOOM_ERR_INVALID_ARG,
                      "loom_sched_add('%s'): a %s task needs %s and not %s", shown,
                      lane_names[d->lane], d->lane == LOOM_LANE_COMM ? "start" : "run",
                      d->lane == LOOM_LANE_COMM ? "run" : "start");
  }
  if (s->n == s->cap) {
    int ncap = s->cap ? 2 * s->cap : 16;
    struct task *nt = realloc(s->t, (size_t)ncap * sizeof *nt);
    LOOM_CHECK_SYS(s->ctx, nt != NULL, "realloc(scheduler tasks)");
    s->t = nt, s->cap = ncap;
  }
  if (d->name) {
    name = strdup(d->name);
  } else {
    char buf[32];
    snprintf(buf, sizeof buf, "task%d", s->n);
    name = strdup(buf);
  }
  LOOM_CHECK_SYS(s->ctx, name != NULL, "strdup(task name)");
  struct task *t = &s->t[s->n];
  memset(t, 0, sizeof *t);
  t->d = *d;
  t->name = name;
  t->d.name = name;
  *id = s->n++;
  return LOOM_OK;
fail:
  free(name);
  return status;
}

loom_status_t loom_sched_depend(loom_sched_t *s, int task, int after) {
  loom_status_t status = LOOM_OK;
  if (!s) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_sched_depend: the scheduler is NULL");
  }
  if (s->frozen) {
    return loom_error(s->ctx, LOOM_ERR_STATE,
                      "loom_sched_depend(%d, %d): the graph has run and is fixed; add every "
                      "dependency before the first loom_sched_run",
                      task, after);
  }
  if (task < 0 || task >= s->n || after < 0 || after >= s->n) {
    return loom_error(s->ctx, LOOM_ERR_INVALID_ARG,
                      "loom_sched_depend(%d, %d): no such task (ids are 0..%d)", task, after,
                      s->n - 1);
  }
  if (task == after) {
    return loom_error(s->ctx, LOOM_ERR_INVALID_ARG,
                      "loom_sched_depend(%d, %d): task '%s' cannot wait for itself", task, after,
                      s->t[task].name);
  }
  struct task *t = &s->t[task], *a = &s->t[after];
  for (int i = 0; i < t->npred; i++) {
    if (t->pred[i] == after) {
      return LOOM_OK; // already there
    }
  }
  LOOM_CHECK(push_int(s->ctx, &t->pred, &t->npred, &t->cpred, after));
  status = push_int(s->ctx, &a->succ, &a->nsucc, &a->csucc, task);
  if (status != LOOM_OK) {
    t->npred--;
  }
fail:
  return status;
}

// ---- freezing: cycle check and the comm order ------------------------------------------------

// Describe one cycle among the tasks the topological pass could not order (state != DONE):
// each of them waits for at least one other of them, so walking predecessors must repeat.
static loom_status_t report_cycle(loom_sched_t *s) {
  loom_status_t status = LOOM_OK;
  int *seen = calloc((size_t)s->n, sizeof *seen); // 1 + position on the walk, 0 = not visited
  int *walk = calloc((size_t)s->n + 1, sizeof *walk);
  LOOM_CHECK_SYS(s->ctx, seen && walk, "calloc(cycle report)");
  int cur = 0;
  while (s->t[cur].state == TASK_DONE) {
    cur++;
  }
  int len = 0;
  while (!seen[cur]) {
    seen[cur] = ++len;
    walk[len - 1] = cur;
    const struct task *t = &s->t[cur];
    int next = -1;
    for (int i = 0; i < t->npred && next < 0; i++) {
      if (s->t[t->pred[i]].state != TASK_DONE) {
        next = t->pred[i];
      }
    }
    if (next < 0) { // cannot happen: every unordered task has an unordered predecessor
      status = loom_error(s->ctx, LOOM_ERR_INTERNAL, "loom_sched_run: cycle walk lost its way");
      goto fail;
    }
    cur = next;
  }
  // walk[seen[cur]-1 .. len-1] is the cycle, each waiting for the next: print it in execution
  // order (x -> y: y waits for x), which is the reverse.
  char msg[768];
  size_t o = 0;
  int first = seen[cur] - 1;
  for (int i = len - 1; i >= first - 1; i--) {
    int k = i >= first ? walk[i] : walk[len - 1];
    int w = snprintf(msg + o, sizeof msg - o, "%s'%s'", i == len - 1 ? "" : " -> ", s->t[k].name);
    if (w < 0 || (size_t)w >= sizeof msg - o) {
      o = sizeof msg - 1;
      break;
    }
    o += (size_t)w;
  }
  status = loom_error(s->ctx, LOOM_ERR_INVALID_ARG,
                      "loom_sched_run: the task graph has a cycle: %s (a -> b: b waits for a); "
                      "loom_sched_destroy it and build the graph again without one of these "
                      "dependencies",
                      msg);
fail:
  free(seen);
  free(walk);
  return status;
}

// A progress thread may call MPI beside the compute lane only under MPI_THREAD_MULTIPLE (and
// only while MPI is up: the scheduler also runs without MPI, in tests).
static int mpi_threads_ok(void) {
  int up = 0, down = 0, level = MPI_THREAD_SINGLE;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (!up || down || MPI_Query_thread(&level) != MPI_SUCCESS) {
    return 0;
  }
  if (level < MPI_THREAD_MULTIPLE) {
    LOOM_INFO(LOOM_SUB_SCHED,
              "no progress thread: MPI granted thread level %d, not "
              "MPI_THREAD_MULTIPLE; communication moves when the compute lane polls",
              level);
    return 0;
  }
  return 1;
}

// Replay the graph once with instantaneous comm and worker tasks: that orders the comm tasks
// (the order every rank starts them in) and proves the graph acyclic.
static loom_status_t freeze(loom_sched_t *s) {
  loom_status_t status = LOOM_OK;
  int cap = s->n > 0 ? s->n : 1;
  struct loom_heap ready[LOOM_LANE_COUNT] = {{0}};
  for (int l = 0; l < LOOM_LANE_COUNT; l++) {
    ready[l].cap = cap;
    ready[l].v = calloc((size_t)cap, sizeof *ready[l].v);
    LOOM_CHECK_SYS(s->ctx, ready[l].v != NULL, "calloc(scheduler heap)");
  }
  s->ncomm = s->nworker_tasks = 0;
  for (int i = 0; i < s->n; i++) {
    struct task *t = &s->t[i];
    t->pending = t->npred;
    t->state = TASK_WAITING;
    s->ncomm += t->d.lane == LOOM_LANE_COMM;
    s->nworker_tasks += t->d.lane == LOOM_LANE_WORKER;
    if (t->pending == 0) {
      loom_heap_push(&ready[t->d.lane], (struct loom_heap_item){t->d.priority, i, NULL});
    }
  }
  s->comm_seq = malloc((size_t)(s->ncomm > 0 ? s->ncomm : 1) * sizeof *s->comm_seq);
  LOOM_CHECK_SYS(s->ctx, s->comm_seq != NULL, "malloc(comm order)");
  int ordered = 0, ncomm = 0;
  for (;;) {
    int lane = ready[LOOM_LANE_COMM].n      ? LOOM_LANE_COMM
               : ready[LOOM_LANE_WORKER].n  ? LOOM_LANE_WORKER
               : ready[LOOM_LANE_COMPUTE].n ? LOOM_LANE_COMPUTE
                                            : -1;
    if (lane < 0) {
      break;
    }
    int id = loom_heap_pop(&ready[lane]).id;
    struct task *t = &s->t[id];
    t->state = TASK_DONE;
    ordered++;
    if (lane == LOOM_LANE_COMM) {
      s->comm_seq[ncomm++] = id;
    }
    for (int i = 0; i < t->nsucc; i++) {
      struct task *u = &s->t[t->succ[i]];
      if (--u->pending == 0) {
        loom_heap_push(&ready[u->d.lane], (struct loom_heap_item){u->d.priority, t->succ[i], NULL});
      }
    }
  }
  if (ordered < s->n) {
    status = report_cycle(s);
    goto fail;
  }

  s->compute_ready.cap = cap;
  s->compute_ready.v = calloc((size_t)cap, sizeof *s->compute_ready.v);
  s->inflight = calloc((size_t)(s->ncomm > 0 ? s->ncomm : 1), sizeof *s->inflight);
  s->slot_busy = calloc((size_t)(s->ncomm > 0 ? s->ncomm : 1), 1);
  s->collected =
      calloc((size_t)(s->nworker_tasks > 0 ? s->nworker_tasks : 1), sizeof *s->collected);
  LOOM_CHECK_SYS(s->ctx, s->compute_ready.v && s->inflight && s->slot_busy && s->collected,
                 "calloc(scheduler state)");
  if (s->nworker_tasks > 0) {
    // More threads than worker tasks would only wait: each task runs once a step.
    if (s->nworkers > s->nworker_tasks) {
      s->nworkers = s->nworker_tasks;
    }
    LOOM_CHECK(loom_worker_pool_create(s->ctx, s->nworkers, s->nworker_tasks, &s->pool));
  }
  if (s->ncomm > 0 && s->progress_us > 0 && mpi_threads_ok()) {
    LOOM_CHECK(loom_progress_create(s->ctx, s->progress_us, &s->progress));
  }
#ifdef LOOM_HAVE_CUDA
  if (s->cuda) {
    LOOM_CHECK(loom_sched_gpu_create(s->ctx, s->n, &s->gpu));
    s->names = calloc((size_t)cap, sizeof *s->names);
    LOOM_CHECK_SYS(s->ctx, s->names != NULL, "calloc(task names)");
    for (int i = 0; i < s->n; i++) {
      struct task *t = &s->t[i];
      t->gpu = (struct loom_gpu_task){.g = s->gpu,
                                      .id = i,
                                      .pred = t->pred,
                                      .npred = t->npred,
                                      .run = t->d.run,
                                      .arg = t->d.arg};
      s->names[i] = t->d.name;
    }
  }
#endif
  s->frozen = 1;
  LOOM_INFO(LOOM_SUB_SCHED,
            "graph frozen: %d tasks (%d comm, %d worker on %d threads), progress thread %s", s->n,
            s->ncomm, s->nworker_tasks, s->pool ? s->nworkers : 0, s->progress ? "on" : "off");
fail:
  for (int l = 0; l < LOOM_LANE_COUNT; l++) {
    free(ready[l].v);
  }
  if (!s->frozen) {
    free(s->comm_seq), s->comm_seq = NULL;
    free(s->compute_ready.v), s->compute_ready.v = NULL;
    free(s->inflight), s->inflight = NULL;
    free(s->slot_busy), s->slot_busy = NULL;
    free(s->collected), s->collected = NULL;
#ifdef LOOM_HAVE_CUDA
    loom_sched_gpu_destroy(s->gpu), s->gpu = NULL;
#endif
    free(s->names), s->names = NULL;
    loom_worker_pool_destroy(s->pool), s->pool = NULL; // (a later run creates them again)
    loom_progress_destroy(s->progress), s->progress = NULL;
  }
  return status;
}

// ---- one step --------------------------------------------------------------------------------

static void make_ready(loom_sched_t *s, int id) {
  struct task *t = &s->t[id];
  t->state = TASK_READY;
  if (t->d.lane == LOOM_LANE_COMPUTE) {
    loom_heap_push(&s->compute_ready, (struct loom_heap_item){t->d.priority, id, NULL});
  } else if (t->d.lane == LOOM_LANE_WORKER && s->failure == LOOM_OK) {
    t->state = TASK_RUNNING;
    t->job = (struct loom_worker_job){
        .fn = t->d.run, .arg = t->d.arg, .priority = t->d.priority, .id = id};
#ifdef LOOM_HAVE_CUDA
    if (s->gpu) {
      t->job.fn = loom_sched_gpu_worker_trampoline;
      t->job.arg = &t->gpu;
    }
#endif
    s->worker_inflight++;
    loom_worker_pool_submit(s->pool, &t->job);
  } // comm tasks start in comm_seq order: see launch_comm
}

// Record the first failure of the step, naming the task; msg is what the task reported.
static void task_failed(loom_sched_t *s, const struct task *t, loom_status_t st, const char *msg) {
  if (s->failure != LOOM_OK) {
    return;
  }
  s->failure = st;
  snprintf(s->failure_msg, sizeof s->failure_msg, "step %lld: %s task '%s' failed: %s",
           (long long)s->step, lane_names[t->d.lane], t->name,
           msg && msg[0] ? msg : loom_strerror(st));
  loom_error(s->ctx, st, "%s", s->failure_msg);
}

// Task id finished at t1 (started at t0, on timeline track tid) with status st.
static void complete(loom_sched_t *s, int id, loom_status_t st, const char *msg, int64_t t0,
                     int64_t t1, int tid) {
  struct task *t = &s->t[id];
  t->state = TASK_DONE;
  s->remaining--;
  s->tasks_run++;
  loom_timeline_event(s->tl, t->name, lane_names[t->d.lane], tid, t0, t1, t->d.bytes, s->step);
  if (st != LOOM_OK) {
    task_failed(s, t, st, msg);
    return;
  }
  for (int i = 0; i < t->nsucc; i++) {
    if (--s->t[t->succ[i]].pending == 0) {
      make_ready(s, t->succ[i]);
    }
  }
}

static int free_slot(const loom_sched_t *s) {
  int k = 0;
  while (k < s->ncomm && s->slot_busy[k]) {
    k++;
  }
  return k;
}

// Start the comm tasks whose turn has come, in comm_seq order.
static void launch_comm(loom_sched_t *s) {
  while (s->failure == LOOM_OK && s->next_comm < s->ncomm) {
    int id = s->comm_seq[s->next_comm];
    struct task *t = &s->t[id];
    if (t->state != TASK_READY) {
      return;
    }
    s->next_comm++;
    loom_error_clear();
    t->req = NULL;
    t->t_start = loom_sched_now_ns();
    loom_status_t st = LOOM_OK;
#ifdef LOOM_HAVE_CUDA
    if (s->gpu) {
      st = loom_sched_gpu_order(&t->gpu);
    }
#endif
    if (st == LOOM_OK) {
      s->starting = 1;
      st = t->d.start(t->d.arg, &t->req);
      s->starting = 0;
    }
    int slot = free_slot(s);
    if (st != LOOM_OK || !t->req) { // failed, or completed at once
      char msg[LOOM_SCHED_ERR_MAX];
      snprintf(msg, sizeof msg, "%s", st != LOOM_OK ? loom_last_error(NULL) : "");
      if (t->req) { // a start that failed yet left a request: completed here, not leaked
        (void)loom_wait(&t->req);
      }
      t->req = NULL;
      complete(s, id, st, msg, t->t_start, loom_sched_now_ns(), LOOM_TL_TID_COMM + slot);
      continue;
    }
    t->state = TASK_RUNNING;
    t->slot = slot;
    s->slot_busy[slot] = 1;
    if (s->ninflight == 0) {
      s->comm_since = t->t_start;
      loom_progress_activate(s->progress, 1);
    }
    s->inflight[s->ninflight++] = id;
  }
}

// Test every outstanding request and collect finished worker tasks. Returns how many tasks
// completed.
static int poll_lanes(loom_sched_t *s) {
  int completed = 0, keep = 0;
  int64_t last_done = 0;
  for (int i = 0; i < s->ninflight; i++) {
    int id = s->inflight[i];
    struct task *t = &s->t[id];
    int done = 0;
    loom_error_clear();
    loom_status_t st = loom_test(&t->req, &done);
    s->polls++;
    if (st == LOOM_OK && !done) {
      s->inflight[keep++] = id;
      continue;
    }
    char msg[LOOM_SCHED_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", st != LOOM_OK ? loom_last_error(NULL) : "");
    int64_t now = loom_sched_now_ns();
    t->req = NULL;
    s->slot_busy[t->slot] = 0;
    complete(s, id, st, msg, t->t_start, now, LOOM_TL_TID_COMM + t->slot);
    completed++;
    last_done = now;
  }
  if (s->ninflight > 0 && keep == 0) { // nothing in flight any more
    s->comm_ns += last_done - s->comm_since;
    loom_progress_activate(s->progress, 0);
  }
  s->ninflight = keep;
  if (s->worker_inflight > 0) {
    s->polls++;
    int n = loom_worker_pool_collect(s->pool, s->collected, s->nworker_tasks);
    for (int i = 0; i < n; i++) {
      struct loom_worker_job *job = s->collected[i];
      s->worker_inflight--;
      s->worker_ns += job->t_end - job->t_start;
      complete(s, job->id, job->status, job->err, job->t_start, job->t_end,
               LOOM_TL_TID_WORKER + job->worker);
    }
    completed += n;
  }
  return completed;
}

// Nothing to compute: wait until a request or worker task completes. While only requests are
// out, poll back to back for up to spin_ns, yielding the core between polls: this rank has no
// other use for it, sched_yield hands it to another rank or thread that wants it, and Open MPI
// moves a large shared-memory message one fragment per poll, so a sleep between polls (at least
// the 50 us timer slack) would stretch every transfer. After that, or while worker tasks are
// out (they need the cores), sleep with exponential backoff between polls.
static void wait_lanes(loom_sched_t *s) {
  int64_t t0 = loom_sched_now_ns();
  int on_comm = s->ninflight > 0;
  long delay = BACKOFF_FIRST_NS;
  for (;;) {
    if (s->worker_inflight == 0 && loom_sched_now_ns() - t0 < s->spin_ns) {
      sched_yield();
      if (poll_lanes(s) > 0) {
        break;
      }
      continue;
    }
    struct timespec ts = {0, delay};
    nanosleep(&ts, NULL);
    s->sleeps++;
    if (poll_lanes(s) > 0) {
      break;
    }
    delay = delay * 2 < BACKOFF_MAX_NS ? delay * 2 : BACKOFF_MAX_NS;
  }
  int64_t waited = loom_sched_now_ns() - t0;
  if (on_comm) {
    s->exposed_comm_ns += waited;
  } else {
    s->exposed_worker_ns += waited;
  }
}

static void run_compute(loom_sched_t *s, int id) {
  struct task *t = &s->t[id];
  t->state = TASK_RUNNING;
  loom_error_clear();
  int64_t t0 = loom_sched_now_ns();
  loom_status_t st;
#ifdef LOOM_HAVE_CUDA
  if (s->gpu) {
    st = loom_sched_gpu_run(&t->gpu, 0);
  } else
#endif
  {
    st = t->d.run(t->d.arg);
  }
  int64_t t1 = loom_sched_now_ns();
  s->compute_ns += t1 - t0;
  char msg[LOOM_SCHED_ERR_MAX];
  snprintf(msg, sizeof msg, "%s", st != LOOM_OK ? loom_last_error(NULL) : "");
  complete(s, id, st, msg, t0, t1, LOOM_TL_TID_COMPUTE);
}

void loom_sched_poll(loom_sched_t *s) {
  // From inside a comm task's start (an operation that polls while it starts), launch_comm
  // would start the next comm tasks before this one, out of the comm order every rank follows.
  if (!s || !s->running || s->starting || !pthread_equal(pthread_self(), s->run_thread)) {
    return;
  }
  poll_lanes(s);
  launch_comm(s);
}

static double ms(int64_t ns) {
  return (double)ns / 1e6;
}

loom_status_t loom_sched_run(loom_sched_t *s) {
  loom_status_t status = LOOM_OK;
  if (!s) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_sched_run: the scheduler is NULL");
  }
  if (s->running) {
    return loom_error(s->ctx, LOOM_ERR_STATE,
                      "loom_sched_run: called from inside a task of the same scheduler");
  }
  if (!s->frozen) {
    LOOM_CHECK(freeze(s));
  }
  int64_t t_begin = loom_sched_now_ns();
  s->running = 1;
  s->run_thread = pthread_self();
  s->next_comm = 0;
  s->remaining = s->n;
  s->tasks_run = 0;
  s->failure = LOOM_OK;
  s->compute_ns = s->comm_ns = s->worker_ns = s->exposed_comm_ns = s->exposed_worker_ns = 0;
  s->polls = s->sleeps = 0;
  s->progress_polls0 = loom_progress_polls(s->progress);
  s->compute_ready.n = 0;
  for (int i = 0; i < s->n; i++) {
    s->t[i].pending = s->t[i].npred;
    s->t[i].state = TASK_WAITING;
    s->t[i].req = NULL;
  }
#ifdef LOOM_HAVE_CUDA
  if (s->gpu && (status = loom_sched_gpu_step_begin(s->gpu)) != LOOM_OK) {
    s->running = 0;
    return status;
  }
#endif
  for (int i = 0; i < s->n; i++) {
    if (s->t[i].npred == 0) {
      make_ready(s, i);
    }
  }
  for (;;) {
    launch_comm(s);
    poll_lanes(s);
    launch_comm(s);
    if (s->failure == LOOM_OK && s->compute_ready.n > 0) {
      run_compute(s, loom_heap_pop(&s->compute_ready).id);
      continue;
    }
    if (s->ninflight + s->worker_inflight == 0) {
      break;
    }
    wait_lanes(s);
  }
  status = s->failure;
  if (status != LOOM_OK) { // the tasks that ran after the failure cleared the thread's error
    loom_error_set_quiet(s->failure_msg);
  }
  if (status == LOOM_OK && s->remaining != 0) {
    status = loom_error(s->ctx, LOOM_ERR_INTERNAL,
                        "loom_sched_run: step %lld ended with %d tasks not run", (long long)s->step,
                        s->remaining);
  }
  s->gpu_ms = 0.0;
#ifdef LOOM_HAVE_CUDA
  if (s->gpu) {
    loom_status_t gst = loom_sched_gpu_step_end(s->gpu, s->tl, s->names, s->step, &s->gpu_ms);
    if (status == LOOM_OK) {
      status = gst;
    }
  }
#endif
  int64_t wall = loom_sched_now_ns() - t_begin;
  loom_step_stats_t *st = &s->last;
  *st = (loom_step_stats_t){
      .step = s->step,
      .status = status,
      .tasks_run = s->tasks_run,
      .wall_ms = ms(wall),
      .compute_ms = ms(s->compute_ns),
      .comm_ms = ms(s->comm_ns),
      .worker_ms = ms(s->worker_ns),
      .exposed_comm_ms = ms(s->exposed_comm_ns),
      .exposed_worker_ms = ms(s->exposed_worker_ns),
      .idle_ms = ms(wall - s->compute_ns - s->exposed_comm_ns - s->exposed_worker_ns),
      .polls = s->polls,
      .sleeps = s->sleeps,
      .progress_polls = loom_progress_polls(s->progress) - s->progress_polls0,
      .gpu_ms = s->gpu_ms,
  };
  if (st->idle_ms < 0) {
    st->idle_ms = 0;
  }
  LOOM_INFO(LOOM_SUB_SCHED,
            "step %lld: wall %.3f ms, compute %.3f ms, exposed comm %.3f ms, idle %.3f ms "
            "(comm in flight %.3f ms, worker %.3f ms, exposed worker %.3f ms, %lld polls, "
            "%lld sleeps, %lld progress-thread polls)%s",
            (long long)st->step, st->wall_ms, st->compute_ms, st->exposed_comm_ms, st->idle_ms,
            st->comm_ms, st->worker_ms, st->exposed_worker_ms, (long long)st->polls,
            (long long)st->sleeps, (long long)st->progress_polls,
            status == LOOM_OK ? "" : " FAILED");
  if (s->step < INT64_MAX) { // the count stops there (loom_sched_set_step(INT64_MAX) is valid)
    s->step++;
  }
  s->running = 0;
fail:
  return status;
}

// ---- stats, timeline, teardown ---------------------------------------------------------------

loom_status_t loom_sched_set_step(loom_sched_t *s, int64_t step) {
  if (!s || step < 0) {
    return loom_error(s ? s->ctx : NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sched_set_step: %s; give a scheduler and a step of 0 or more",
                      s ? "the step is negative" : "the scheduler is NULL");
  }
  if (s->running) {
    return loom_error(s->ctx, LOOM_ERR_STATE,
                      "loom_sched_set_step: called during loom_sched_run; call it between steps");
  }
  s->step = step;
  return LOOM_OK;
}

loom_status_t loom_sched_step_stats(const loom_sched_t *s, loom_step_stats_t *out) {
  if (!s || !out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sched_step_stats: scheduler and output must not be NULL");
  }
  *out = s->last;
  return LOOM_OK;
}

loom_status_t loom_sched_timeline_flush(loom_sched_t *s) {
  if (!s) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sched_timeline_flush: the scheduler is NULL");
  }
  return loom_timeline_flush(s->tl);
}

loom_status_t loom_sched_destroy(loom_sched_t *s) {
  if (!s) {
    return LOOM_OK;
  }
  if (s->running) {
    return loom_error(s->ctx, LOOM_ERR_STATE,
                      "loom_sched_destroy: called from inside a task of the same scheduler");
  }
  loom_status_t status = loom_timeline_close(s->tl);
  loom_worker_pool_destroy(s->pool);
  loom_progress_destroy(s->progress);
  for (int i = 0; i < s->n; i++) {
    free(s->t[i].name);
    free(s->t[i].pred);
    free(s->t[i].succ);
  }
  free(s->t);
  free(s->comm_seq);
  free(s->compute_ready.v);
  free(s->inflight);
  free(s->slot_busy);
  free(s->collected);
#ifdef LOOM_HAVE_CUDA
  loom_sched_gpu_destroy(s->gpu);
#endif
  free(s->names);
  free(s);
  return status;
}
