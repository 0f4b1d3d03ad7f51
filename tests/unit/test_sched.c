/* test_sched.c — the step scheduler without MPI: dependency order, priorities, stable replay,
 * cycles, the frozen graph, failures, worker threads, the comm order, the timeline and its merge.
 */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../testutil.h"
#include "loom_sched.h"
#include "timeline.h"

// ---- recording tasks -------------------------------------------------------------------------

#define MAX_LOG 1024

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int order_log[MAX_LOG]; // task ids in the order they started
static int norder;

struct rec {
  int id;           // task id (set after loom_sched_add)
  int fail;         // return LOOM_ERR_CORRUPT (compute) or LOOM_ERR_SYSTEM (worker)
  int sleep_ms;     // how long the task takes
  int ran;          // times it ran
  atomic_int done;  // set when it finished (read across threads)
  pthread_t thread; // where it last ran
  int64_t t0, t1;   // when it last ran (ns)
  loom_sched_t *s;  // loom_sched_poll from inside, when set
};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void log_start(struct rec *r) {
  pthread_mutex_lock(&log_mu);
  if (norder < MAX_LOG) {
    order_log[norder++] = r->id;
  }
  r->ran++;
  r->thread = pthread_self();
  r->t0 = now_ns();
  pthread_mutex_unlock(&log_mu);
}

static void reset_log(struct rec *r, int n) {
  norder = 0;
  for (int i = 0; i < n; i++) {
    r[i].ran = 0;
    atomic_store(&r[i].done, 0);
  }
}

static loom_status_t rec_run(void *arg) {
  struct rec *r = arg;
  log_start(r);
  if (r->sleep_ms) {
    for (int i = 0; i < r->sleep_ms; i++) {
      sleep_ms(1);
      loom_sched_poll(r->s); // no-op on worker threads and when r->s is NULL
    }
  }
  r->t1 = now_ns();
  atomic_store(&r->done, 1);
  if (r->fail) {
    return loom_error(NULL, r->fail == 2 ? LOOM_ERR_SYSTEM : LOOM_ERR_CORRUPT,
                      r->fail == 2 ? "disk on fire in %d" : "bad payload in %d", r->id);
  }
  return LOOM_OK;
}

// A comm task without MPI: the operation completes at once (NULL request).
static loom_status_t rec_start(void *arg, loom_request_t **req) {
  struct rec *r = arg;
  log_start(r);
  r->t1 = now_ns();
  atomic_store(&r->done, 1);
  *req = NULL;
  return LOOM_OK;
}

// A comm task whose operation cannot start.
static loom_status_t fail_start(void *arg, loom_request_t **req) {
  struct rec *r = arg;
  log_start(r);
  *req = NULL;
  return loom_error(NULL, LOOM_ERR_MPI, "MPI_Iallreduce refused %d", r->id);
}

static int add_task(loom_sched_t *s, const char *name, loom_lane_t lane, int prio, struct rec *r) {
  loom_task_desc_t d = {.name = name, .lane = lane, .priority = prio, .arg = r, .bytes = 1234};
  if (lane == LOOM_LANE_COMM) {
    d.start = rec_start;
  } else {
    d.run = rec_run;
  }
  int id = -1;
  loom_status_t st = loom_sched_add(s, &d, &id);
  CHECK(st == LOOM_OK && id >= 0, "add %s: %s", name, loom_last_error(NULL));
  if (r) {
    r->id = id;
  }
  return id;
}

static void depend(loom_sched_t *s, int task, int after) {
  loom_status_t st = loom_sched_depend(s, task, after);
  CHECK(st == LOOM_OK, "depend(%d, %d): %s", task, after, loom_last_error(NULL));
}

static int position(int id) {
  for (int i = 0; i < norder; i++) {
    if (order_log[i] == id) {
      return i;
    }
  }
  return -1;
}

static loom_sched_t *new_sched(int workers) {
  loom_sched_opts_t o = {.workers = workers, .timeline = ""};
  loom_sched_t *s = NULL;
  loom_status_t st = loom_sched_create(NULL, &o, &s);
  CHECK(st == LOOM_OK && s, "create: %s", loom_last_error(NULL));
  if (!s) {
    exit(check_exit("test_sched"));
  }
  return s;
}

// ---- dependencies, priorities, replay --------------------------------------------------------

#define NDEP 20

// Random-looking DAG over compute and worker tasks: every task starts after its dependencies.
static void test_dependencies(void) {
  loom_sched_t *s = new_sched(2);
  struct rec r[NDEP] = {{0}};
  int deps[NDEP][NDEP] = {{0}};
  for (int i = 0; i < NDEP; i++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    r[i].sleep_ms = i % 4 == 3 ? 2 : 0;
    add_task(s, name, i % 5 == 3 ? LOOM_LANE_WORKER : LOOM_LANE_COMPUTE, (i * 7) % 3, &r[i]);
  }
  test_rng_t rng = test_rng(42);
  for (int i = 0; i < NDEP; i++) { // task i waits for some tasks j > i: acyclic by construction
    for (int j = i + 1; j < NDEP; j++) {
      if (test_int(&rng, 0, 3) == 0) {
        deps[i][j] = 1;
        depend(s, i, j);
      }
    }
  }
  depend(s, 0, NDEP - 1); // a duplicate dependency is accepted once
  depend(s, 0, NDEP - 1);
  for (int step = 0; step < 3; step++) {
    reset_log(r, NDEP);
    CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
    CHECK(norder == NDEP, "step %d: %d tasks ran, want %d", step, norder, NDEP);
    for (int i = 0; i < NDEP; i++) {
      CHECK(r[i].ran == 1, "step %d: t%d ran %d times", step, i, r[i].ran);
      for (int j = 0; j < NDEP; j++) {
        if (deps[i][j]) {
          CHECK(position(j) >= 0 && position(j) < position(i) && r[j].t1 <= r[i].t0,
                "step %d: t%d started before its dependency t%d finished", step, i, j);
        }
      }
    }
  }
  loom_step_stats_t st;
  CHECK(loom_sched_step_stats(s, &st) == LOOM_OK, "stats");
  CHECK(st.step == 2 && st.status == LOOM_OK && st.tasks_run == NDEP, "stats step %lld, %d tasks",
        (long long)st.step, st.tasks_run);
  CHECK(st.wall_ms > 0 && st.wall_ms + 1e-6 >= st.compute_ms && st.idle_ms >= 0,
        "stats wall %.3f compute %.3f idle %.3f", st.wall_ms, st.compute_ms, st.idle_ms);
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
}

// Ready compute tasks run by priority (higher first), ties by id; a task that becomes ready
// later with a higher priority jumps the queue. The order is the same for 5 steps.
static void test_priorities_and_replay(void) {
  loom_sched_t *s = new_sched(0);
  static const int prio[7] = {1, 5, 3, 5, 0, -2, 100};
  struct rec r[7] = {{0}};
  for (int i = 0; i < 7; i++) {
    char name[16];
    snprintf(name, sizeof name, "p%d", i);
    add_task(s, name, LOOM_LANE_COMPUTE, prio[i], &r[i]);
  }
  depend(s, 6, 2); // p6 (priority 100) waits for p2
  static const int want[7] = {1, 3, 2, 6, 0, 4, 5};
  int first[7];
  for (int step = 0; step < 5; step++) {
    reset_log(r, 7);
    CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
    CHECK(norder == 7, "step %d: %d tasks ran", step, norder);
    for (int i = 0; i < 7 && i < norder; i++) {
      CHECK(order_log[i] == want[i], "step %d: position %d ran p%d, want p%d", step, i,
            order_log[i], want[i]);
      if (step == 0) {
        first[i] = order_log[i];
      } else {
        CHECK(order_log[i] == first[i], "step %d differs from step 0 at %d", step, i);
      }
    }
  }
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
}

// ---- comm order ------------------------------------------------------------------------------

// Comm tasks start in one fixed order (a replay with instantaneous comm and worker tasks): m1 is
// ready before m2 but its turn comes after m2, which waits for a slow worker task.
static void test_comm_order(void) {
  loom_sched_t *s = new_sched(1);
  struct rec c0 = {0}, c1 = {.sleep_ms = 2}, w = {.sleep_ms = 30}, m0 = {0}, m1 = {0}, m2 = {0};
  c1.s = s; // polls from inside
  int ic0 = add_task(s, "c0", LOOM_LANE_COMPUTE, 2, &c0);
  int ic1 = add_task(s, "c1", LOOM_LANE_COMPUTE, 1, &c1);
  int iw = add_task(s, "w", LOOM_LANE_WORKER, 0, &w);
  int im0 = add_task(s, "m0", LOOM_LANE_COMM, 0, &m0);
  int im1 = add_task(s, "m1", LOOM_LANE_COMM, 50, &m1);
  int im2 = add_task(s, "m2", LOOM_LANE_COMM, 10, &m2);
  depend(s, im0, ic0);
  depend(s, iw, ic0);
  depend(s, im2, iw);
  depend(s, im1, ic1);
  for (int step = 0; step < 3; step++) {
    struct rec *all[6] = {&c0, &c1, &w, &m0, &m1, &m2};
    norder = 0;
    for (int i = 0; i < 6; i++) {
      all[i]->ran = 0;
    }
    CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
    CHECK(position(im0) < position(im2) && position(im2) < position(im1),
          "step %d: comm order m0 %d, m2 %d, m1 %d; want m0 < m2 < m1", step, position(im0),
          position(im2), position(im1));
    CHECK(m1.t0 >= w.t1, "step %d: m1 started before the worker task m2 waits for finished", step);
    CHECK(position(ic1) < position(im1), "m1 after c1");
    CHECK(m0.ran == 1 && m1.ran == 1 && m2.ran == 1 && w.ran == 1, "every task ran once");
  }
  loom_step_stats_t st;
  loom_sched_step_stats(s, &st);
  CHECK(st.exposed_worker_ms > 0 && st.sleeps > 0,
        "waiting for the worker task is exposed time (%.3f ms, %lld sleeps)", st.exposed_worker_ms,
        (long long)st.sleeps);
  CHECK(st.worker_ms >= 25, "worker busy %.3f ms, want >= 25", st.worker_ms);
  // c1 sleeps 2 ms on the compute lane: compute time not summed over the compute tasks (or
  // not counted at all) reads below that.
  CHECK(st.compute_ms >= 2.0 && st.compute_ms <= st.wall_ms + 1e-6,
        "compute busy %.3f ms (wall %.3f), want >= 2 (c1 sleeps 2 ms)", st.compute_ms, st.wall_ms);
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
}

// A comm task whose start polls the scheduler (an operation that makes progress as it starts):
// the comm tasks after it must not start from inside it, out of the comm order.
static int start_depth, start_depth_max;

static loom_status_t polling_start(void *arg, loom_request_t **req) {
  struct rec *r = arg;
  start_depth++;
  start_depth_max = start_depth > start_depth_max ? start_depth : start_depth_max;
  log_start(r);
  loom_sched_poll(r->s);
  *req = NULL;
  start_depth--;
  return LOOM_OK;
}

static void test_poll_from_start(void) {
  loom_sched_t *s = new_sched(0);
  struct rec m[3] = {{.s = s}, {.s = s}, {.s = s}};
  for (int i = 0; i < 3; i++) {
    loom_task_desc_t d = {
        .name = "m", .lane = LOOM_LANE_COMM, .start = polling_start, .arg = &m[i]};
    CHECK(loom_sched_add(s, &d, &m[i].id) == LOOM_OK, "add: %s", loom_last_error(NULL));
  }
  norder = start_depth = start_depth_max = 0;
  CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
  CHECK(start_depth_max == 1, "a comm task started inside another's start (depth %d)",
        start_depth_max);
  CHECK(norder == 3 && position(m[0].id) < position(m[1].id) &&
            position(m[1].id) < position(m[2].id),
        "comm order broken: %d tasks started, positions %d %d %d", norder, position(m[0].id),
        position(m[1].id), position(m[2].id));
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
}

// ---- errors ----------------------------------------------------------------------------------

static void test_cycle_and_bad_args(void) {
  loom_sched_t *s = new_sched(0);
  struct rec r[4] = {{0}};
  int a = add_task(s, "a", LOOM_LANE_COMPUTE, 0, &r[0]);
  int b = add_task(s, "b", LOOM_LANE_COMPUTE, 0, &r[1]);
  int c = add_task(s, "c", LOOM_LANE_COMPUTE, 0, &r[2]);
  int d = add_task(s, "d", LOOM_LANE_COMPUTE, 0, &r[3]);
  depend(s, b, a);
  depend(s, c, b);
  depend(s, a, c);
  depend(s, d, a);

  EXPECT_FAIL(loom_sched_depend(s, a, 99), "loom_sched_depend", "no such task");
  EXPECT_FAIL(loom_sched_depend(s, -1, a), "loom_sched_depend", "no such task");
  EXPECT_FAIL(loom_sched_depend(s, b, b), "loom_sched_depend", "itself");
  int id = 0;
  loom_task_desc_t bad = {.name = "bad", .lane = (loom_lane_t)7, .run = rec_run};
  EXPECT_FAIL(loom_sched_add(s, &bad, &id), "loom_sched_add", "lane 7");
  CHECK(id == -1, "a failed add gives id -1");
  bad.lane = LOOM_LANE_COMPUTE;
  bad.start = rec_start;
  EXPECT_FAIL(loom_sched_add(s, &bad, &id), "loom_sched_add", "needs run");
  bad.lane = LOOM_LANE_COMM;
  bad.run = NULL;
  bad.start = NULL;
  EXPECT_FAIL(loom_sched_add(s, &bad, &id), "loom_sched_add", "needs start");
  EXPECT_FAIL(loom_sched_add(s, NULL, &id), "loom_sched_add", "NULL");

  for (int attempt = 0; attempt < 2; attempt++) { // reported again, not only the first time
    loom_error_clear();
    loom_status_t st = loom_sched_run(s);
    test_expect_fail(st, LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, "loom_sched_run", "cycle",
                     TEST_HERE);
  }
  loom_error_clear();
  loom_sched_run(s);
  const char *msg = loom_last_error(NULL);
  CHECK(strstr(msg, "'b' -> 'c' -> 'a' -> 'b'") != NULL, "the cycle is spelled out: %s", msg);
  CHECK(strstr(msg, "'d'") == NULL, "d is not on the cycle: %s", msg);
  CHECK(r[0].ran + r[1].ran + r[2].ran + r[3].ran == 0, "nothing ran");
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
  loom_error_clear();

  // After the first run the graph is fixed.
  s = new_sched(0);
  struct rec x = {0}, y = {0};
  int ix = add_task(s, "x", LOOM_LANE_COMPUTE, 0, &x);
  CHECK(loom_sched_run(s) == LOOM_OK && x.ran == 1, "run x");
  loom_task_desc_t late = {.name = "late", .lane = LOOM_LANE_COMPUTE, .run = rec_run, .arg = &y};
  loom_error_clear();
  test_expect_fail(loom_sched_add(s, &late, &id), LOOM_ERR_STATE, LOOM_ERR_STATE, "loom_sched_add",
                   "fixed", TEST_HERE);
  loom_error_clear();
  test_expect_fail(loom_sched_depend(s, ix, ix), LOOM_ERR_STATE, LOOM_ERR_STATE,
                   "loom_sched_depend", "fixed", TEST_HERE);
  CHECK(loom_sched_run(s) == LOOM_OK && x.ran == 2 && y.ran == 0, "the fixed graph still runs");
  // The largest step loom_sched_set_step takes: the count stays there (its increment once
  // overflowed, which UBSan aborts on).
  CHECK(loom_sched_set_step(s, INT64_MAX) == LOOM_OK, "set_step(INT64_MAX): %s",
        loom_last_error(NULL));
  loom_step_stats_t ss;
  for (int k = 0; k < 2; k++) {
    CHECK(loom_sched_run(s) == LOOM_OK && loom_sched_step_stats(s, &ss) == LOOM_OK &&
              ss.step == INT64_MAX,
          "run %d after set_step(INT64_MAX): step %lld", k, (long long)ss.step);
  }
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
  CHECK(loom_sched_destroy(NULL) == LOOM_OK, "destroy(NULL)");

  loom_sched_opts_t o = {.workers = -1};
  loom_sched_t *none = NULL;
  EXPECT_FAIL(loom_sched_create(NULL, &o, &none), "loom_sched_create", "workers");
  CHECK(none == NULL, "no scheduler on failure");
}

// A failing task ends the step: its status and message come back, its dependents and the tasks
// not started yet do not run, and what was in flight (a worker task) completes first.
static void test_failure(void) {
  loom_sched_t *s = new_sched(1);
  struct rec a = {0}, f = {.fail = 1}, c = {0}, w = {.sleep_ms = 30}, d = {0};
  int ia = add_task(s, "A", LOOM_LANE_COMPUTE, 10, &a);
  int iF = add_task(s, "F", LOOM_LANE_COMPUTE, 10, &f);
  int ic = add_task(s, "C", LOOM_LANE_COMPUTE, 10, &c);
  add_task(s, "W", LOOM_LANE_WORKER, 0, &w);
  add_task(s, "D", LOOM_LANE_COMPUTE, -10, &d);
  depend(s, iF, ia);
  depend(s, ic, iF);
  loom_error_clear();
  loom_status_t st = loom_sched_run(s);
  const char *msg = loom_last_error(NULL);
  CHECK(st == LOOM_ERR_CORRUPT, "the failing task's status comes back: %s", loom_strerror(st));
  CHECK(strstr(msg, "task 'F'") && strstr(msg, "bad payload in 1"),
        "the message names the task and keeps its own: %s", msg);
  CHECK(a.ran == 1 && f.ran == 1 && c.ran == 0 && d.ran == 0, "ran A %d F %d C %d D %d", a.ran,
        f.ran, c.ran, d.ran);
  CHECK(atomic_load(&w.done) == 1, "the worker task in flight completed before the return");
  loom_step_stats_t stats;
  loom_sched_step_stats(s, &stats);
  CHECK(stats.status == LOOM_ERR_CORRUPT && stats.tasks_run == 3, "stats: %s, %d tasks",
        loom_strerror(stats.status), stats.tasks_run);

  f.fail = 0; // the next step runs everything again
  a.ran = f.ran = c.ran = d.ran = w.ran = 0;
  CHECK(loom_sched_run(s) == LOOM_OK, "the next step: %s", loom_last_error(NULL));
  CHECK(a.ran == 1 && f.ran == 1 && c.ran == 1 && d.ran == 1 && w.ran == 1, "all ran");
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");

  // A failing worker task: its message is relayed from its thread.
  s = new_sched(2);
  struct rec bad = {.fail = 2}, after = {0};
  int ib = add_task(s, "encode", LOOM_LANE_WORKER, 0, &bad);
  int iaf = add_task(s, "after", LOOM_LANE_COMPUTE, 0, &after);
  depend(s, iaf, ib);
  loom_error_clear();
  st = loom_sched_run(s);
  msg = loom_last_error(NULL);
  CHECK(st == LOOM_ERR_SYSTEM, "worker failure status: %s", loom_strerror(st));
  CHECK(strstr(msg, "worker task 'encode'") && strstr(msg, "disk on fire"),
        "worker failure message: %s", msg);
  CHECK(after.ran == 0, "its dependent did not run");
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");

  // A comm task that cannot start: the comm tasks after it in the comm order do not start.
  s = new_sched(0);
  struct rec m0 = {0}, m1 = {0};
  loom_task_desc_t fd = {.name = "ar", .lane = LOOM_LANE_COMM, .start = fail_start, .arg = &m0};
  CHECK(loom_sched_add(s, &fd, &m0.id) == LOOM_OK, "add ar");
  add_task(s, "ar2", LOOM_LANE_COMM, 0, &m1);
  loom_error_clear();
  st = loom_sched_run(s);
  msg = loom_last_error(NULL);
  CHECK(st == LOOM_ERR_MPI, "comm start failure status: %s", loom_strerror(st));
  CHECK(strstr(msg, "comm task 'ar'") && strstr(msg, "refused 0"), "comm failure message: %s", msg);
  CHECK(m0.ran == 1 && m1.ran == 0, "ar tried once, ar2 not started");
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
  loom_error_clear();
}

// ---- worker threads --------------------------------------------------------------------------

static atomic_int w_running, w_overlap;

static loom_status_t overlap_run(void *arg) {
  struct rec *r = arg;
  log_start(r);
  atomic_fetch_add(&w_running, 1);
  // Wait (at most 2 s) until another worker task runs at the same time, unless one saw it.
  for (int i = 0; i < 2000 && !atomic_load(&w_overlap); i++) {
    if (atomic_load(&w_running) >= 2) {
      atomic_store(&w_overlap, 1);
    }
    sleep_ms(1);
  }
  atomic_fetch_sub(&w_running, 1);
  atomic_store(&r->done, 1);
  return LOOM_OK;
}

static int join_all_done(struct rec *r, int n) {
  for (int i = 0; i < n; i++) {
    if (!atomic_load(&r[i].done)) {
      return 0;
    }
  }
  return 1;
}

static struct rec *join_recs;

static loom_status_t join_run(void *arg) {
  struct rec *r = arg;
  log_start(r);
  r->done = join_all_done(join_recs, 6);
  return LOOM_OK;
}

static void test_workers(void) {
  loom_sched_t *s = new_sched(3);
  struct rec w[6] = {{0}}, first = {0}, join = {0};
  join_recs = w;
  int ifirst = add_task(s, "first", LOOM_LANE_COMPUTE, 0, &first);
  loom_task_desc_t jd = {.name = "join", .lane = LOOM_LANE_COMPUTE, .run = join_run, .arg = &join};
  int ijoin = -1;
  CHECK(loom_sched_add(s, &jd, &ijoin) == LOOM_OK, "add join");
  join.id = ijoin;
  for (int i = 0; i < 6; i++) {
    loom_task_desc_t d = {.name = "compress",
                          .lane = LOOM_LANE_WORKER,
                          .run = overlap_run,
                          .arg = &w[i],
                          .priority = i};
    CHECK(loom_sched_add(s, &d, &w[i].id) == LOOM_OK, "add worker task");
    depend(s, w[i].id, ifirst);
    depend(s, ijoin, w[i].id);
  }
  pthread_t self = pthread_self();
  for (int step = 0; step < 2; step++) {
    atomic_store(&w_overlap, 0);
    reset_log(w, 6);
    join.done = 0;
    CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
    for (int i = 0; i < 6; i++) {
      CHECK(w[i].ran == 1 && atomic_load(&w[i].done), "worker task %d ran once and completed", i);
      CHECK(!pthread_equal(w[i].thread, self), "worker task %d ran on the calling thread", i);
    }
    CHECK(pthread_equal(first.thread, self) && pthread_equal(join.thread, self),
          "compute tasks run on the calling thread");
    CHECK(atomic_load(&join.done) == 1, "the join task saw every worker task done");
    CHECK(atomic_load(&w_overlap) == 1, "with 3 workers, two worker tasks ran at once");
  }
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy joins the threads");
  // A pool never has more threads than worker tasks: a million asked for, one task, one thread
  // (the pool tried to start all of them and failed with pthread_create's EAGAIN).
  s = new_sched(1000000);
  struct rec one = {0};
  loom_task_desc_t od = {.name = "one", .lane = LOOM_LANE_WORKER, .run = overlap_run, .arg = &one};
  CHECK(loom_sched_add(s, &od, &one.id) == LOOM_OK, "add the worker task");
  CHECK(loom_sched_run(s) == LOOM_OK, "workers = 1000000, one worker task: %s",
        loom_last_error(NULL));
  CHECK(one.ran == 1 && atomic_load(&one.done), "the worker task ran once and completed");
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy");
}

// ---- timeline and merge ----------------------------------------------------------------------

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    return NULL;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  size_t got;
  while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      cap *= 2;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        free(buf);
      }
      buf = nb;
    }
  }
  fclose(f);
  if (buf) {
    buf[len] = '\0';
  }
  return buf;
}

static int count(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) {
    n++;
  }
  return n;
}

// Brackets and braces balance outside strings, and the text is one object.
static int balanced(const char *text) {
  int depth = 0, in_str = 0, closed = 0;
  for (const char *p = text; *p; p++) {
    if (in_str) {
      if (*p == '\\' && p[1]) {
        p++;
      } else if (*p == '"') {
        in_str = 0;
      }
      continue;
    }
    if (closed && !strchr(" \n", *p)) {
      return 0; // text after the closing brace
    }
    if (*p == '"') {
      in_str = 1;
    } else if (*p == '{' || *p == '[') {
      depth++;
    } else if (*p == '}' || *p == ']') {
      if (--depth < 0) {
        return 0;
      }
      closed = depth == 0;
    }
  }
  return depth == 0 && !in_str && closed && text[0] == '{';
}

// The first complete event named `name` in a trace: its start and duration (us) and track.
// Returns 0 when there is none or it does not parse.
static int find_event(const char *text, const char *name, double *ts, double *dur, int *tid) {
  char key[128];
  snprintf(key, sizeof key, "{\"name\":\"%s\",\"cat\":", name);
  const char *e = strstr(text, key);
  const char *t = e ? strstr(e, "\"ts\":") : NULL;
  return t && sscanf(t, "\"ts\":%lf,\"dur\":%lf,\"pid\":%*d,\"tid\":%d", ts, dur, tid) == 3;
}

static const char *odd_name = "odd \"quoted\" \\ name\n\x01";

static void build_timeline_graph(loom_sched_t *s, struct rec *r) {
  int f = add_task(s, "fwd", LOOM_LANE_COMPUTE, 0, &r[0]);
  int w = add_task(s, "compress", LOOM_LANE_WORKER, 0, &r[1]);
  int m = add_task(s, "allreduce", LOOM_LANE_COMM, 0, &r[2]);
  int o = add_task(s, odd_name, LOOM_LANE_COMPUTE, 0, &r[3]);
  r[0].sleep_ms = 1;
  r[1].sleep_ms = 1;
  depend(s, w, f);
  depend(s, m, w);
  depend(s, o, m);
}

static int run_cmd(const char *cmd) {
  int rc = system(cmd);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Runs the merge tool's command (its output goes to log): the exit status is want and the
// output names a and b.
static void merge_says(const char *cmd, const char *log, int want, const char *a, const char *b) {
  CHECK(run_cmd(cmd) == want, "exit status %d wanted: %s", want, cmd);
  char *out = slurp(log);
  CHECK(out && strstr(out, a) && strstr(out, b), "the message names '%s' and '%s': %s", a, b,
        out ? out : "(no output)");
  free(out);
}

static void test_timeline(void) {
  char dir[] = "/tmp/loom_test_sched_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp failed");
    return;
  }
  char pattern[256], f0[256], f1[256], merged[256], bad[256], log[256], cmd[4096];
  snprintf(pattern, sizeof pattern, "%s/tl_%%r.json", dir);
  snprintf(f0, sizeof f0, "%s/tl_0.json", dir);
  snprintf(f1, sizeof f1, "%s/tl_1.json", dir);
  snprintf(merged, sizeof merged, "%s/merged.json", dir);
  snprintf(bad, sizeof bad, "%s/bad.json", dir);
  snprintf(log, sizeof log, "%s/merge.log", dir);

  for (int rank = 0; rank < 2; rank++) {
    loom_sched_opts_t o = {.timeline = pattern, .rank = rank};
    loom_sched_t *s = NULL;
    CHECK(loom_sched_create(NULL, &o, &s) == LOOM_OK, "create with a timeline: %s",
          loom_last_error(NULL));
    if (!s) {
      return;
    }
    struct rec r[4] = {{0}};
    build_timeline_graph(s, r);
    CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
    CHECK(loom_sched_timeline_flush(s) == LOOM_OK, "flush");
    char *mid = slurp(rank ? f1 : f0);
    CHECK(mid && balanced(mid) && count(mid, "\"ph\":\"X\"") == 4,
          "after a flush the file is complete JSON with one step's 4 events");
    free(mid);
    CHECK(loom_sched_run(s) == LOOM_OK, "run: %s", loom_last_error(NULL));
    CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy writes the timeline: %s",
          loom_last_error(NULL));
  }

  char *t = slurp(f0);
  CHECK(t != NULL, "%s written (%%r expanded)", f0);
  if (t) {
    CHECK(balanced(t), "valid brackets in %s", f0);
    CHECK(strncmp(t, "{\"traceEvents\":[", 16) == 0, "starts with traceEvents");
    CHECK(count(t, "\"ph\":\"X\"") == 8, "8 events (4 tasks, 2 steps), got %d",
          count(t, "\"ph\":\"X\""));
    CHECK(strstr(t, "\"name\":\"fwd\",\"cat\":\"compute\""), "fwd on compute");
    CHECK(strstr(t, "\"name\":\"compress\",\"cat\":\"worker\""), "compress on worker");
    CHECK(strstr(t, "\"name\":\"allreduce\",\"cat\":\"comm\""), "allreduce on comm");
    CHECK(strstr(t, "\"name\":\"odd \\\"quoted\\\" \\\\ name\\n\\u0001\""),
          "names are JSON-escaped");
    CHECK(strstr(t, "\"thread_name\"") && strstr(t, "\"args\":{\"name\":\"compute\"}") &&
              strstr(t, "\"args\":{\"name\":\"comm\"}") &&
              strstr(t, "\"args\":{\"name\":\"worker\"}"),
          "lane metadata names compute, comm and worker");
    CHECK(strstr(t, "\"pid\":0,") && !strstr(t, "\"pid\":1,"), "pid is the rank");
    CHECK(strstr(t, "\"bytes\":1234,\"step\":0") && strstr(t, "\"step\":1}"), "args");
    // Times in microseconds since the scheduler was created, each event on its lane's track
    // (timeline.h: compute 1, comm 1001 + slot, worker 2001 + thread). fwd and compress sleep
    // 1 ms each (>= 1000 us; a duration in ms or ns reads 1 or 1e6), fwd ends before compress
    // starts, compress before allreduce (its dependencies). ts relative to the epoch of the
    // monotonic clock instead of the creation, or a wrong unit, breaks the bounds: the run took
    // well under 10 s.
    double ts[3], dur[3];
    int tid[3];
    const char *names[3] = {"fwd", "compress", "allreduce"};
    const int want_tid[3] = {1, 2001, 1001};
    for (int i = 0; i < 3; i++) {
      CHECK(find_event(t, names[i], &ts[i], &dur[i], &tid[i]), "event %s parses", names[i]);
      CHECK(ts[i] >= 0 && ts[i] < 1e7 && dur[i] >= 0 && dur[i] < 1e7,
            "%s: ts %.3f dur %.3f us, want within 0 .. 1e7 us", names[i], ts[i], dur[i]);
      CHECK(tid[i] == want_tid[i], "%s on track %d, want %d", names[i], tid[i], want_tid[i]);
    }
    CHECK(dur[0] >= 1000 && dur[1] >= 1000, "fwd %.3f us, compress %.3f us: each slept 1 ms",
          dur[0], dur[1]);
    CHECK(ts[0] + dur[0] <= ts[1] + 0.002 && ts[1] + dur[1] <= ts[2] + 0.002,
          "fwd [%.3f +%.3f], compress [%.3f +%.3f], allreduce at %.3f: out of dependency order",
          ts[0], dur[0], ts[1], dur[1], ts[2]);
    free(t);
  }

  const char *bdir = getenv("LOOM_BUILDDIR");
  char tool[1024];
  snprintf(tool, sizeof tool, "%s/loom_timeline_merge", bdir ? bdir : ".");
  if (access(tool, X_OK) != 0) {
    CHECK(0, "%s is not built (set LOOM_BUILDDIR)", tool);
  } else {
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0, f1, log);
    CHECK(run_cmd(cmd) == 0, "merge: %s", cmd);
    char *m = slurp(merged);
    CHECK(m && balanced(m), "merged file is valid");
    if (m) {
      CHECK(count(m, "\"ph\":\"X\"") == 16, "16 merged events, got %d", count(m, "\"ph\":\"X\""));
      CHECK(strstr(m, "\"pid\":0,") && strstr(m, "\"pid\":1,"), "both pids in the merged file");
      CHECK(strstr(m, "\"args\":{\"name\":\"rank 1\"}"), "process names kept");
    }
    free(m);

    // Malformed input: a clear error naming the file and the byte offset.
    static const struct {
      const char *text, *offset;
    } cases[] = {
        {"{\"traceEvents\":[{\"name\":\"x\",}]}", "offset 28"},
        {"{\"traceEvents\":[", "offset 16"},
        {"{\"other\":1}", "traceEvents"},
        {"{\"traceEvents\":[{\"name\":\"x\"}]} trailing", "offset 31"},
        // The file ends in a pid's digits: they were read with strtol past the buffer's end
        // (found by fuzz_timeline under ASan).
        {"{\"traceEvents\":[{\"pid\":12", "offset 25"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      FILE *f = fopen(bad, "w");
      if (f) {
        fputs(cases[i].text, f);
        fclose(f);
      }
      snprintf(cmd, sizeof cmd, "'%s' -f '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0, bad, log);
      merge_says(cmd, log, 1, bad, cases[i].offset);
    }
    // An input that is not a regular file (/dev/zero, which the reader once grew a buffer for
    // without end): refused at once, naming it.
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' -f '%s' '%s' /dev/zero >'%s' 2>&1", tool, merged, f0,
             log);
    merge_says(cmd, log, 1, "/dev/zero", "is not a regular file");
    // A FIFO, as an input or as an existing output: refused at once, never opened (opening it
    // would wait for a writer).
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s.fifo", merged);
    CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' -f '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0,
             fifo, log);
    merge_says(cmd, log, 1, fifo, "is not a regular file");
    snprintf(cmd, sizeof cmd, "timeout 60 '%s' '%s' '%s' >'%s' 2>&1", tool, fifo, f0, log);
    merge_says(cmd, log, 2, fifo, "exists");
    unlink(fifo);
    snprintf(cmd, sizeof cmd, "'%s' '%s' >'%s' 2>&1", tool, merged, log);
    CHECK(run_cmd(cmd) == 2, "usage error without inputs");
    // An existing output that is an earlier merge: refused without -f, which the message offers;
    // an option where the output goes is not taken for a file name.
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0, f1, log);
    merge_says(cmd, log, 2, "exists", "pass -f");
    snprintf(cmd, sizeof cmd, "'%s' --bogus '%s' >'%s' 2>&1", tool, f0, log);
    CHECK(run_cmd(cmd) == 2, "an unknown option is refused");
    snprintf(cmd, sizeof cmd, "'%s' -f '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0, f1, log);
    CHECK(run_cmd(cmd) == 0, "-f replaces an earlier merge");
    snprintf(cmd, sizeof cmd, "'%s' -f '%s' '%s' >'%s' 2>&1", tool, merged, f1, log);
    CHECK(run_cmd(cmd) == 0, "-f replaces an earlier merge (of 2 ranks) with a merge of 1");
    snprintf(cmd, sizeof cmd, "'%s' -f '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0, f1, log);
    CHECK(run_cmd(cmd) == 0, "-f replaces an earlier merge of one rank (it carries the mark)");
    // A glob over the traces alone (tl_*.json) makes rank 0's trace the output, not an input:
    // refused with -f or without, the trace kept, and -f is not offered.
    char *rank0 = slurp(f0);
    for (int force = 0; force < 2; force++) {
      snprintf(cmd, sizeof cmd, "'%s' %s '%s' '%s' >'%s' 2>&1", tool, force ? "-f" : "", f0, f1,
               log);
      merge_says(cmd, log, 2, "is a rank's trace", "merged.json");
      char *out = slurp(log);
      CHECK(out && !strstr(out, "pass -f"), "-f offered where it would destroy a trace: %s",
            out ? out : "(no output)");
      free(out);
    }
    char *rank0_after = slurp(f0);
    CHECK(rank0 && rank0_after && !strcmp(rank0, rank0_after), "rank 0's trace is unchanged");
    free(rank0), free(rank0_after);
    // The output named as one of the inputs (as a glob over the traces does): refused, the
    // trace kept.
    char *before = slurp(f1);
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s' '%s' >'%s' 2>&1", tool, f1, f0, f1, log);
    merge_says(cmd, log, 2, "is also input 1", f1);
    char *after = slurp(f1);
    CHECK(before && after && !strcmp(before, after), "the input named as output is unchanged");
    free(before), free(after);
    // One trace named twice (was: merged twice, with a warning only).
    snprintf(cmd, sizeof cmd, "'%s' -f '%s' '%s' '%s' '%s' >'%s' 2>&1", tool, merged, f0, f1, f0,
             log);
    merge_says(cmd, log, 2, "are the same file", "name each rank's trace once");
  }

  // An existing FIFO as the timeline path is refused at create, at once (opening it for writing
  // once waited for a reader forever). The create runs in a child under alarm(30).
  char tfifo[300];
  snprintf(tfifo, sizeof tfifo, "%s/tl.fifo", dir);
  CHECK(mkfifo(tfifo, 0600) == 0, "mkfifo %s", tfifo);
  pid_t child = fork();
  if (child == 0) {
    alarm(30);
    loom_sched_opts_t fo = {.timeline = tfifo};
    loom_sched_t *fs = NULL;
    loom_status_t fst = loom_sched_create(NULL, &fo, &fs);
    _exit(fst == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "FIFO") ? 0 : 1);
  }
  int wst = 0;
  CHECK(child > 0 && waitpid(child, &wst, 0) == child && WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
        "a FIFO as the timeline: refused at once (status 0x%x)", wst);
  unlink(tfifo);

  // A timeline path that cannot be created fails at create, naming the path.
  loom_sched_opts_t o = {.timeline = "/nonexistent-loom-dir/tl_%r.json"};
  loom_sched_t *s = NULL;
  loom_error_clear();
  test_expect_fail(loom_sched_create(NULL, &o, &s), LOOM_ERR_SYSTEM, LOOM_ERR_SYSTEM,
                   "/nonexistent-loom-dir/tl_0.json", "LOOM_TIMELINE", TEST_HERE);
  CHECK(s == NULL, "no scheduler on failure");

  remove(f0), remove(f1), remove(merged), remove(bad), remove(log);
  rmdir(dir);
}

// Two schedulers of one process on one timeline file each rewrote it at their own offsets (a
// file that was not JSON, events lost, every call LOOM_OK). A program's own path is refused at
// the second create, naming the fix; LOOM_TIMELINE's path gives the second NAME.s1.EXT.
static void test_timeline_shared_file(void) {
  char dir[] = "/tmp/loom_test_sched_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp failed");
    return;
  }
  char path[256], s1[256];
  snprintf(path, sizeof path, "%s/tl.json", dir);
  snprintf(s1, sizeof s1, "%s/tl.s1.json", dir);
  loom_sched_opts_t o = {.timeline = path};
  loom_sched_t *a = NULL, *b = NULL;
  CHECK(loom_sched_create(NULL, &o, &a) == LOOM_OK, "create: %s", loom_last_error(NULL));
  if (!a) {
    return;
  }
  struct rec ra = {0}, rb = {0};
  add_task(a, "a_task_with_a_long_name", LOOM_LANE_COMPUTE, 0, &ra);
  CHECK(loom_sched_run(a) == LOOM_OK && loom_sched_run(a) == LOOM_OK, "run a");
  loom_error_clear();
  test_expect_fail(loom_sched_create(NULL, &o, &b), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG,
                   path, "another loom_sched", TEST_HERE);
  CHECK(b == NULL, "no second scheduler on the same file");
  struct loom_timeline *tl = NULL;
  CHECK(loom_timeline_open(NULL, path, 0, 0, 1, &tl) == LOOM_OK && tl,
        "LOOM_TIMELINE's path taken by another scheduler: %s", loom_last_error(NULL));
  if (tl) {
    CHECK(!strcmp(loom_timeline_file(tl), s1), "the second file is %s, not %s", s1,
          loom_timeline_file(tl));
    loom_timeline_event(tl, "b", "compute", LOOM_TL_TID_COMPUTE, 1000, 2000, 0, 0);
    CHECK(loom_timeline_close(tl) == LOOM_OK, "close the second timeline");
  }
  CHECK(loom_sched_destroy(a) == LOOM_OK, "destroy a");
  char *t = slurp(path);
  CHECK(t && balanced(t) && count(t, "\"ph\":\"X\"") == 2, "%s holds a's 2 events as JSON: %s",
        path, t ? t : "(missing)");
  free(t);
  t = slurp(s1);
  CHECK(t && balanced(t) && count(t, "\"ph\":\"X\"") == 1, "%s holds the second's event: %s", s1,
        t ? t : "(missing)");
  free(t);
  // /dev/null, where nothing is rewritten, may be every scheduler's timeline at once.
  loom_sched_opts_t dn = {.timeline = "/dev/null"};
  loom_sched_t *n1 = NULL, *n2 = NULL;
  CHECK(loom_sched_create(NULL, &dn, &n1) == LOOM_OK &&
            loom_sched_create(NULL, &dn, &n2) == LOOM_OK,
        "two schedulers on /dev/null: %s", loom_last_error(NULL));
  loom_sched_destroy(n1);
  loom_sched_destroy(n2);
  // Once the first is destroyed its path is free again.
  CHECK(loom_sched_create(NULL, &o, &b) == LOOM_OK, "create after destroy: %s",
        loom_last_error(NULL));
  add_task(b, "b", LOOM_LANE_COMPUTE, 0, &rb);
  CHECK(loom_sched_run(b) == LOOM_OK && loom_sched_destroy(b) == LOOM_OK, "run b");
  remove(path), remove(s1);
  rmdir(dir);
}

// loom_sched_timeline_flush from a worker task while the compute lane records events: the flush
// and the recording shared the event buffer without a lock (events lost between the write and
// the reset of the count, the file's end rewritten by two threads).
#define FLUSH_NC 500 // trivial compute tasks, each an event recorded while the worker flushes

struct flusher {
  loom_sched_t *s;
  atomic_int computed; // compute tasks done this step
  atomic_int started;  // the worker task runs
  int flushes, failed;
};

static loom_status_t count_run(void *arg) {
  struct flusher *f = arg;
  // The first waits until the worker task flushes, each takes a few microseconds: the events
  // are recorded while the worker flushes.
  int64_t until = now_ns() + (atomic_load(&f->computed) == 0 ? 2000000000LL : 5000);
  while (now_ns() < until && !(atomic_load(&f->computed) == 0 && atomic_load(&f->started))) {
  }
  atomic_fetch_add(&f->computed, 1);
  return LOOM_OK;
}

static loom_status_t flush_run(void *arg) {
  struct flusher *f = arg;
  int64_t give_up = now_ns() + 10 * 1000000000LL;
  atomic_store(&f->started, 1);
  while (atomic_load(&f->computed) < FLUSH_NC && now_ns() < give_up) {
    f->failed += loom_sched_timeline_flush(f->s) != LOOM_OK;
    f->flushes++;
    sched_yield();
  }
  return LOOM_OK;
}

static void test_timeline_flush_from_worker(void) {
  char dir[] = "/tmp/loom_test_sched_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK(0, "mkdtemp failed");
    return;
  }
  char path[256];
  snprintf(path, sizeof path, "%s/tl.json", dir);
  loom_sched_opts_t o = {.workers = 1, .timeline = path};
  struct flusher f = {0};
  CHECK(loom_sched_create(NULL, &o, &f.s) == LOOM_OK, "create: %s", loom_last_error(NULL));
  if (!f.s) {
    return;
  }
  loom_task_desc_t fd = {.name = "flush", .lane = LOOM_LANE_WORKER, .run = flush_run, .arg = &f};
  int id = -1;
  CHECK(loom_sched_add(f.s, &fd, &id) == LOOM_OK, "add the flushing worker task");
  for (int i = 0; i < FLUSH_NC; i++) {
    loom_task_desc_t cd = {.lane = LOOM_LANE_COMPUTE, .run = count_run, .arg = &f};
    CHECK(loom_sched_add(f.s, &cd, &id) == LOOM_OK, "add compute task %d", i);
  }
  const int steps = 8;
  for (int step = 0; step < steps; step++) {
    atomic_store(&f.computed, 0);
    atomic_store(&f.started, 0);
    CHECK(loom_sched_run(f.s) == LOOM_OK, "step %d: %s", step, loom_last_error(NULL));
  }
  CHECK(f.failed == 0, "%d of %d flushes from the worker task failed", f.failed, f.flushes);
  CHECK(loom_sched_destroy(f.s) == LOOM_OK, "destroy: %s", loom_last_error(NULL));
  char *t = slurp(path);
  int want = steps * (FLUSH_NC + 1);
  CHECK(t && balanced(t) && count(t, "\"ph\":\"X\"") == want,
        "%s holds all %d events as JSON after %d flushes from a worker task (%d events, %s)", path,
        want, f.flushes, t ? count(t, "\"ph\":\"X\"") : 0,
        t ? (balanced(t) ? "balanced" : "not JSON") : "missing");
  free(t);
  remove(path);
  rmdir(dir);
}

int main(void) {
  test_dependencies();
  test_priorities_and_replay();
  test_comm_order();
  test_poll_from_start();
  test_cycle_and_bad_args();
  test_failure();
  test_workers();
  test_timeline();
  test_timeline_shared_file();
  test_timeline_flush_from_worker();
  return check_exit("test_sched");
}
