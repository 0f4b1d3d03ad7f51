/* test_watchdog.c — LOOM_TIMEOUT and LOOM_CHECK_CONSISTENCY under mpirun: a rank that skips a
 * collective gets the job aborted with one message; mismatched calls fail on every rank. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../check_mpi.h"
#include "../testutil.h"

// Modes (argv[1]):
//   skip R [wait|finalize|refuse]
//                           every rank runs two allreduces on world; rank R skips the third
//                           ('grad.skip') and then sleeps outside MPI (wait), finalizes, or
//                           first makes the call with a receive tensor of another count, which
//                           it refuses (refuse); the others wait in it. Under LOOM_TIMEOUT=3 the
//                           job must abort with one message naming the ranks that arrived and
//                           rank R (with refuse: that it refused its call).
//   skip-test R             the same, the waiting ranks polling loom_iallreduce with loom_test
//                           (the scheduler's path).
//   skip-first R [...]      as skip, R skipping the group's first collective (the others wait
//                           while the group's private communicator is created).
//   skip-barrier R          every rank runs one allreduce; rank R skips the barrier that
//                           follows and sleeps; the others wait in it.
//   skip-sched R            a step scheduler (a compute task, then an allreduce task) runs
//                           three steps; rank R skips the fourth and sleeps: the others wait in
//                           it until LOOM_TIMEOUT (with LOOM_TIMELINE, their traces must hold
//                           the three steps: tests/mpi/watchdog_timeline.sh).
//   skip-moe R              an MoE forward on the ep group that rank R skips.
//   skip-attn R             an attention-server forward on world that rank R skips.
//   moe-consistency         LOOM_CHECK_CONSISTENCY=1 with an MoE layer on every rank: calls
//                           the last rank refuses or names differently fail on every rank.
//   attn-consistency        the same with an attention-server executor on world.
//   lost-recv               rank 0 receives a message rank 1 never sends.
//   diverge                 after one common allreduce, rank 0 allreduces 'grad.x' and rank 1
//                           starts one of 'grad.y' and sleeps: both entered operation #2, in
//                           different calls, and the report must say which call rank 1 made.
//   abort                   the last rank calls loom_abort while the others wait in an
//                           allreduce (no LOOM_TIMEOUT needed): the job ends with its reason.
//   slow S                  the last rank enters the allreduce S seconds late; every rank must
//                           complete (LOOM_TIMEOUT=0, or a timeout above S).
//   consistency             consistent calls of every collective pass; mismatched ones (name,
//                           count, dtype, op, root, operation, alltoallv counts, compressor seed)
//                           fail on every rank with LOOM_ERR_INVALID_ARG naming both sides when
//                           LOOM_CHECK_CONSISTENCY=1, and pass unchecked when it is 0.

static int rank, size;

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

static loom_tensor_t mk(loom_dtype_t dt, int64_t n, const char *name) {
  loom_tensor_t t = test_tensor(dt, 1, &n, name);
  if (t.data) {
    memset(t.data, 0, (size_t)n * loom_dtype_size(dt));
  }
  return t;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- timeouts ---------------------------------------------------------------------------------

static int skip(loom_ctx_t *ctx, int skipper, int warm, int poll, const char *after) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  loom_tensor_t a = mk(LOOM_F32, 256, "grad.a"), s = mk(LOOM_F32, 256, "grad.skip");
  for (int i = 0; i < warm; i++) {
    OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  }
  if (rank == skipper) {
    if (after && !strcmp(after, "finalize")) {
      loom_finalize(ctx); // blocks in the group's teardown: its peers never get there
      return 0;
    }
    if (after && !strcmp(after, "refuse")) { // refused here only: the peers wait (no check)
      loom_tensor_t shorter = mk(LOOM_F32, 128, "grad.skip");
      loom_status_t st = loom_allreduce(w, &s, &shorter, LOOM_SUM);
      CHECK(st == LOOM_ERR_INVALID_ARG, "a recv of another count is refused: %s",
            loom_strerror(st));
      test_free_tensors((loom_tensor_t *[]){&shorter}, 1);
    }
    sleep(60); // outside MPI: its slot is still readable
    return 0;
  }
  if (poll) {
    loom_request_t *req = NULL;
    OK(loom_iallreduce(w, &s, &s, LOOM_SUM, &req));
    int done = 0;
    while (!done) {
      OK(loom_test(&req, &done));
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  } else {
    OK(loom_allreduce(w, &s, &s, LOOM_SUM));
  }
  fprintf(stderr, "rank %d: the skipped allreduce completed\n", rank);
  return 1;
}

static int skip_barrier(loom_ctx_t *ctx, int skipper) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  loom_tensor_t a = mk(LOOM_F32, 256, "grad.a");
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  if (rank == skipper) {
    sleep(60);
    return 0;
  }
  OK(loom_barrier(w));
  fprintf(stderr, "rank %d: the skipped barrier completed\n", rank);
  return 1;
}

struct sched_arg {
  const loom_group_t *g;
  loom_tensor_t *t;
};

static loom_status_t sched_fill(void *arg) {
  struct sched_arg *a = arg;
  return loom_tensor_fill(a->t, 1.0);
}

static loom_status_t sched_allreduce(void *arg, loom_request_t **req) {
  struct sched_arg *a = arg;
  return loom_iallreduce(a->g, a->t, a->t, LOOM_SUM, req);
}

static int skip_sched(loom_ctx_t *ctx, int skipper) {
  loom_tensor_t t = mk(LOOM_F32, 256, "grad.sched");
  struct sched_arg a = {loom_group(ctx, LOOM_GROUP_WORLD), &t};
  loom_sched_t *s = NULL;
  OK(loom_sched_create(ctx, NULL, &s)); // the timeline: LOOM_TIMELINE
  int fill = -1, reduce = -1;
  loom_task_desc_t d = {.name = "fill", .lane = LOOM_LANE_COMPUTE, .run = sched_fill, .arg = &a};
  OK(loom_sched_add(s, &d, &fill));
  d = (loom_task_desc_t){.name = "grad.sched",
                         .lane = LOOM_LANE_COMM,
                         .start = sched_allreduce,
                         .arg = &a,
                         .bytes = 1024};
  OK(loom_sched_add(s, &d, &reduce));
  OK(loom_sched_depend(s, reduce, fill));
  for (int step = 0; step < 4; step++) {
    if (step == 3 && rank == skipper) {
      sleep(60); // (the job is aborted meanwhile)
      return 0;
    }
    OK(loom_sched_set_step(s, step));
    OK(loom_sched_run(s));
  }
  fprintf(stderr, "rank %d: the skipped step completed\n", rank);
  loom_sched_destroy(s);
  test_free_tensors((loom_tensor_t *[]){&t}, 1);
  return 1;
}

static int skip_moe(loom_ctx_t *ctx, int skipper) {
  const loom_group_t *ep = loom_group(ctx, LOOM_GROUP_EP);
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = 2 * loom_group_size(ep);
  cfg.top_k = 2;
  cfg.hidden = 8;
  cfg.ffn = 16;
  cfg.seed = 3;
  loom_moe_t *m = NULL;
  OK(loom_moe_create(ctx, ep, &cfg, &m));
  int64_t shape[2] = {4, 8};
  loom_tensor_t x = test_tensor(LOOM_F32, 2, shape, "moe.x"),
                y = test_tensor(LOOM_F32, 2, shape, "moe.y");
  float *xp = x.data;
  for (int i = 0; i < 32; i++) {
    xp[i] = (float)((i * 7 + rank) % 5) - 2.0f;
  }
  OK(loom_moe_forward(m, &x, &y, NULL));
  if (rank == skipper) {
    sleep(60);
    return 0;
  }
  OK(loom_moe_forward(m, &x, &y, NULL));
  fprintf(stderr, "rank %d: the skipped MoE forward completed\n", rank);
  return 1;
}

// An attention-server executor on w (causal, H heads of D): rank r's one document of rows rows
// is served by the next rank.
static loom_attn_exec_t *ring_executor(const loom_group_t *w, int H, int D, int rows) {
  loom_attn_doc_t *docs = calloc((size_t)size, sizeof *docs);
  loom_attn_task_t *tasks = calloc((size_t)size, sizeof *tasks);
  loom_attn_exec_t *x = NULL;
  CHECK(docs && tasks, "out of memory");
  for (int r = 0; docs && tasks && r < size; r++) {
    docs[r] = (loom_attn_doc_t){.owner = r, .len = rows};
    tasks[r] =
        (loom_attn_task_t){.doc = r, .q_lo = 0, .q_hi = rows, .owner = r, .server = (r + 1) % size};
  }
  OK(loom_attn_exec_create(w, docs, size, tasks, size, H, H, D, 1, 0.0f, &x));
  free(docs); // (the executor keeps its own copy of the plan)
  free(tasks);
  return x;
}

static int skip_attn(loom_ctx_t *ctx, int skipper) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  enum { H = 2, D = 4, ROWS = 6 };
  loom_attn_exec_t *x = ring_executor(w, H, D, ROWS);
  int64_t sq[3] = {ROWS, H, D}, sl[2] = {H, ROWS};
  loom_tensor_t q = test_tensor_f32(3, sq, "attn.q"), k = test_tensor_f32(3, sq, "attn.k");
  loom_tensor_t v = test_tensor_f32(3, sq, "attn.v"), o = test_tensor_f32(3, sq, "attn.out");
  loom_tensor_t l = test_tensor_f32(2, sl, "attn.lse");
  test_rng_t rng = test_rng(5u + (uint64_t)rank);
  test_fill_uniform(&rng, test_floats(&q), ROWS * H * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&k), ROWS * H * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&v), ROWS * H * D, -1, 1);
  OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
  if (rank == skipper) {
    sleep(60);
    return 0;
  }
  OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
  fprintf(stderr, "rank %d: the skipped attention forward completed\n", rank);
  return 1;
}

// Rank 0 receives from rank 1, which never sends.
static int lost_recv(loom_ctx_t *ctx) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  loom_tensor_t a = mk(LOOM_F32, 16, "msg");
  if (rank != 0) {
    sleep(60);
    return 0;
  }
  OK(loom_recv(w, &a, 1, 7));
  fprintf(stderr, "rank %d: the lost message arrived\n", rank);
  return 1;
}

static int diverge(loom_ctx_t *ctx) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  loom_tensor_t a = mk(LOOM_F32, 256, "grad.a"), x = mk(LOOM_F32, 256, "grad.x"),
                y = mk(LOOM_F32, 256, "grad.y");
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  if (rank != 0) { // another call at the same point, never progressed: rank 0 cannot finish
    loom_request_t *req = NULL;
    OK(loom_iallreduce(w, &y, &y, LOOM_SUM, &req));
    sleep(60);
    return 0;
  }
  OK(loom_allreduce(w, &x, &x, LOOM_SUM));
  fprintf(stderr, "rank %d: the diverged allreduce completed\n", rank);
  return 1;
}

static void abort_one(loom_ctx_t *ctx) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  loom_tensor_t a = mk(LOOM_F32, 256, "grad.a");
  if (rank == size - 1) {
    loom_abort(ctx, 3, "the test's reason");
  }
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  fprintf(stderr, "rank %d: the allreduce completed without the aborting rank\n", rank);
}

static void slow(loom_ctx_t *ctx, int delay) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  loom_tensor_t a = mk(LOOM_F32, 256, "grad.slow");
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  double t0 = now_s();
  if (rank == size - 1) {
    sleep((unsigned)delay);
  }
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  double waited = now_s() - t0;
  CHECK(waited >= delay - 0.5, "rank %d waited %.1f s for a peer %d s late", rank, waited, delay);
  test_free_tensors((loom_tensor_t *[]){&a}, 1);
}

// ---- consistency ------------------------------------------------------------------------------

// st must be the outcome the check predicts: LOOM_OK when off; when on, LOOM_ERR_INVALID_ARG
// whose message contains want (on every rank).
static void expect_mismatch(int on, loom_status_t st, const char *what, const char *want) {
  if (!on) {
    CHECK(st == LOOM_OK, "%s without the check: %s", what, loom_last_error(NULL));
    return;
  }
  const char *msg = loom_last_error(NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG, "%s: status %d (%s)", what, st, msg);
  CHECK(strstr(msg, want) != NULL, "%s: message lacks \"%s\": %s", what, want, msg);
  if (rank == 0 && st == LOOM_ERR_INVALID_ARG) {
    printf("%s: %s\n", what, msg);
  }
}

// Under the check, a call the last rank refused (its arguments): it returns its own error, which
// names the problem (mine), and every other rank LOOM_ERR_INVALID_ARG naming it (want), at once.
static void expect_refused(loom_status_t st, int me_last, const char *what, const char *mine,
                           const char *want) {
  const char *msg = loom_last_error(NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG, "%s: status %d (%s)", what, st, msg);
  CHECK(strstr(msg, me_last ? mine : want) != NULL, "%s: message lacks \"%s\": %s", what,
        me_last ? mine : want, msg);
  if (rank == 0 && st == LOOM_ERR_INVALID_ARG) {
    printf("%s: %s\n", what, msg);
  }
}

// LOOM_CHECK_CONSISTENCY=1 with an MoE layer on an ep group of every rank: consistent forwards
// and backwards pass; a forward or backward the last rank refuses (a wrong row count there) is
// an error on every rank at once, and so is a forward under another tensor name; the layer
// works after each.
static void moe_consistency(loom_ctx_t *ctx) {
  const loom_group_t *ep = loom_group(ctx, LOOM_GROUP_EP);
  const int last = size - 1, me_last = rank == last;
  CHECK(loom_group_size(ep) == size, "run with LOOM_EP_SIZE=%d", size);
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = 2 * size;
  cfg.top_k = 2;
  cfg.hidden = 8;
  cfg.ffn = 8;
  cfg.seed = 3;
  loom_moe_t *m = NULL;
  OK(loom_moe_create(ctx, ep, &cfg, &m));
  int64_t shape[2] = {4, 8}, short_shape[2] = {3, 8};
  loom_tensor_t x = test_tensor(LOOM_F32, 2, shape, "moe.x"),
                y = test_tensor(LOOM_F32, 2, shape, "moe.y");
  loom_tensor_t z = test_tensor(LOOM_F32, 2, shape, "moe.z");
  loom_tensor_t dy = test_tensor(LOOM_F32, 2, shape, "moe.dy"),
                dx = test_tensor(LOOM_F32, 2, shape, "moe.dx");
  loom_tensor_t y3 = test_tensor(LOOM_F32, 2, short_shape, "moe.y");
  for (int i = 0; i < 32; i++) {
    ((float *)x.data)[i] = ((float *)z.data)[i] = (float)((i * 7 + rank) % 5) - 2.0f;
    ((float *)dy.data)[i] = 0.01f * (float)(i % 3);
  }
  char want[256];
  OK(loom_moe_forward(m, &x, &y, NULL));
  OK(loom_moe_backward(m, &dy, &dx));
  // The last rank's y has 3 rows for x's 4.
  snprintf(want, sizeof want, "rank %d refused its call of moe_forward('moe.x') on group ep", last);
  loom_status_t st = loom_moe_forward(m, &x, me_last ? &y3 : &y, NULL);
  expect_refused(st, me_last, "refused MoE forward", "y holds 3 rows", want);
  // No rank has a forward to take back now: every rank refuses, each with its own reason.
  st = loom_moe_backward(m, &dy, &dx);
  CHECK(st == LOOM_ERR_STATE, "backward after the refused forward: %s", loom_last_error(NULL));
  // Another tensor name on the last rank.
  st = loom_moe_forward(m, me_last ? &z : &x, &y, NULL);
  snprintf(want, sizeof want,
           "rank 0 calls moe_forward('moe.x', f32) but rank %d calls moe_forward('moe.z', f32)",
           last);
  expect_mismatch(1, st, "MoE forward name", want);
  // A backward the last rank refuses (dx with 3 rows), after a forward every rank made.
  OK(loom_moe_forward(m, &x, &y, NULL));
  snprintf(want, sizeof want, "rank %d refused its call of moe_backward('moe.dy')", last);
  st = loom_moe_backward(m, &dy, me_last ? &y3 : &dx);
  expect_refused(st, me_last, "refused MoE backward", "dx 3", want);
  // The layer still works.
  OK(loom_moe_forward(m, &x, &y, NULL));
  OK(loom_moe_backward(m, &dy, &dx));
  loom_moe_destroy(m);
  test_free_tensors((loom_tensor_t *[]){&x, &y, &z, &dy, &dx, &y3}, 6);
}

// LOOM_CHECK_CONSISTENCY=1 with an attention-server executor on world (rank r's document is
// served by the next rank): a ship or backward the last rank refuses (a wrong row count there),
// or ships under another name, fails on every rank at once; the executor works after each.
static void attn_consistency(loom_ctx_t *ctx) {
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  const int last = size - 1, me_last = rank == last;
  enum { H = 2, D = 4, ROWS = 6 };
  loom_attn_exec_t *x = ring_executor(w, H, D, ROWS);
  int64_t sq[3] = {ROWS, H, D}, s5[3] = {ROWS - 1, H, D}, sl[2] = {H, ROWS};
  loom_tensor_t q = test_tensor_f32(3, sq, "attn.q"), k = test_tensor_f32(3, sq, "attn.k");
  loom_tensor_t v = test_tensor_f32(3, sq, "attn.v"), o = test_tensor_f32(3, sq, "attn.out");
  loom_tensor_t q2 = test_tensor_f32(3, sq, "attn.q2"), q5 = test_tensor_f32(3, s5, "attn.q");
  loom_tensor_t l = test_tensor_f32(2, sl, "attn.lse"), dout = test_tensor_f32(3, sq, "attn.dout");
  loom_tensor_t dq = test_tensor_f32(3, sq, "attn.dq"), dk = test_tensor_f32(3, sq, "attn.dk");
  loom_tensor_t dv = test_tensor_f32(3, sq, "attn.dv");
  test_rng_t rng = test_rng(5u + (uint64_t)rank);
  test_fill_uniform(&rng, test_floats(&q), ROWS * H * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&k), ROWS * H * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&v), ROWS * H * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&dout), ROWS * H * D, -1, 1);
  memcpy(q2.data, q.data, sizeof(float) * ROWS * H * D);
  char want[256];
  OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
  OK(loom_attn_exec_backward(x, &dout, &dq, &dk, &dv));
  snprintf(want, sizeof want, "rank %d refused its call of attn_ship('attn.q') on group world",
           last);
  loom_status_t st = loom_attn_exec_forward(x, me_last ? &q5 : &q, &k, &v, &o, &l);
  expect_refused(st, me_last, "refused attention ship", "q ", want);
  snprintf(want, sizeof want,
           "rank 0 calls attn_ship('attn.q', f32) but rank %d calls attn_ship('attn.q2', f32)",
           last);
  st = loom_attn_exec_forward(x, me_last ? &q2 : &q, &k, &v, &o, &l);
  expect_mismatch(1, st, "attention ship name", want);
  OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
  snprintf(want, sizeof want, "rank %d refused its call of attn_backward('attn.dout')", last);
  st = loom_attn_exec_backward(x, &dout, me_last ? &q5 : &dq, &dk, &dv);
  expect_refused(st, me_last, "refused attention backward", "dq ", want);
  OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
  OK(loom_attn_exec_backward(x, &dout, &dq, &dk, &dv));
  loom_attn_exec_destroy(x);
  test_free_tensors((loom_tensor_t *[]){&q, &k, &v, &o, &q2, &q5, &l, &dout, &dq, &dk, &dv}, 11);
}

static void consistency(loom_ctx_t *ctx) {
  const char *v = loom_tunable(ctx, "LOOM_CHECK_CONSISTENCY");
  const int on = v && !strcmp(v, "1");
  const loom_group_t *w = loom_group(ctx, LOOM_GROUP_WORLD);
  const int last = size - 1, me_last = rank == last;
  char want[256];
  loom_tensor_t a = mk(LOOM_F32, 1024, "grad.h0"), b = mk(LOOM_F32, 1024, "grad.h1");
  loom_tensor_t big = mk(LOOM_F32, 1024 * size, "grad.big");
  loom_tensor_t h = mk(LOOM_F16, 1024, "grad.h0"), i32 = mk(LOOM_I32, 1024, "grad.h0");
  loom_tensor_t b2k = mk(LOOM_F32, 1000 * size + 7, "grad.odd"); // a count no call here expects

  // Consistent calls of every collective pass.
  int64_t *counts = malloc(sizeof(int64_t) * (size_t)size);
  int64_t total = 0;
  for (int r = 0; r < size; r++) {
    counts[r] = r + 1;
    total += counts[r];
  }
  loom_tensor_t mine = mk(LOOM_F32, rank + 1, "gv.part"), all = mk(LOOM_F32, total, "gv.part");
  loom_tensor_t blk = mk(LOOM_F32, 1024, "rs.out");
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  OK(loom_reduce_scatter(w, &big, &blk, NULL, LOOM_SUM));
  OK(loom_allgather(w, &blk, &big));
  OK(loom_allgatherv(w, &mine, &all, counts));
  OK(loom_broadcast(w, &a, last));
  loom_tensor_t big2 = mk(LOOM_F32, 1024 * size, "grad.big");
  OK(loom_alltoall(w, &big, &big2));
  // alltoallv: rank r sends (r + j) % 3 elements to rank j.
  int64_t *sc = malloc(sizeof(int64_t) * (size_t)size),
          *rc = malloc(sizeof(int64_t) * (size_t)size);
  int64_t ns = 0, nr = 0;
  for (int j = 0; j < size; j++) {
    sc[j] = (rank + j) % 3;
    rc[j] = (j + rank) % 3;
    ns += sc[j];
    nr += rc[j];
  }
  loom_tensor_t vs = mk(LOOM_F32, ns, "a2av"), vr = mk(LOOM_F32, nr, "a2av");
  OK(loom_alltoallv(w, &vs, sc, &vr, rc));
  loom_compressor_t *c = NULL;
  OK(loom_compressor_create("fp16", &c));
  OK(loom_compressed_allreduce(w, c, LOOM_SCHEME_INDIVISIBLE, NULL, &a, LOOM_SUM, 11, NULL));
  OK(loom_barrier(w));

  // The same count and dtype under another name on the last rank.
  loom_status_t st = loom_allreduce(w, me_last ? &b : &a, me_last ? &b : &a, LOOM_SUM);
  snprintf(want, sizeof want,
           "rank 0 calls allreduce('grad.h0', 1024 f32, sum) but rank %d calls "
           "allreduce('grad.h1', 1024 f32, sum)",
           last);
  expect_mismatch(on, st, "name", want);
  // Another count (without the check this would go wrong: not run then).
  if (on) {
    // A barrier against an allreduce.
    st = me_last ? loom_allreduce(w, &a, &a, LOOM_SUM) : loom_barrier(w);
    snprintf(want, sizeof want, "rank 0 calls barrier() but rank %d calls allreduce('grad.h0'",
             last);
    expect_mismatch(on, st, "barrier against allreduce", want);
    loom_tensor_t shorter = mk(LOOM_F32, 1000, "grad.h0");
    st = loom_allreduce(w, me_last ? &shorter : &a, me_last ? &shorter : &a, LOOM_SUM);
    snprintf(want, sizeof want, "but rank %d calls allreduce('grad.h0', 1000 f32, sum)", last);
    expect_mismatch(on, st, "count", want);
    // Another dtype, another op, another root, another operation.
    st = loom_allreduce(w, me_last ? &h : &a, me_last ? &h : &a, LOOM_SUM);
    expect_mismatch(on, st, "dtype", "allreduce('grad.h0', 1024 f16, sum)");
    st = loom_allreduce(w, &a, &a, me_last ? LOOM_MAX : LOOM_SUM);
    expect_mismatch(on, st, "redop", "allreduce('grad.h0', 1024 f32, max)");
    st = loom_broadcast(w, &a, me_last ? 0 : last);
    snprintf(want, sizeof want,
             "rank 0 calls broadcast('grad.h0', 1024 f32, root %d) but rank %d calls "
             "broadcast('grad.h0', 1024 f32, root 0)",
             last, last);
    expect_mismatch(on, st, "root", want);
    st = me_last ? loom_broadcast(w, &a, 0) : loom_allreduce(w, &a, &a, LOOM_SUM);
    expect_mismatch(on, st, "operation", "calls broadcast('grad.h0', 1024 f32, root 0)");
    st = loom_allreduce(w, me_last ? &i32 : &a, me_last ? &i32 : &a, LOOM_SUM);
    expect_mismatch(on, st, "dtype i32", "1024 i32, sum");
    // alltoallv: the last rank expects one more element from rank 0 than rank 0 sends it.
    int64_t keep = rc[0];
    if (me_last) {
      rc[0] += 1;
    }
    loom_tensor_t vr2 = mk(LOOM_F32, nr + (me_last ? 1 : 0), "a2av");
    st = loom_alltoallv(w, &vs, sc, &vr2, rc);
    snprintf(want, sizeof want, "rank 0 sends %lld elements to rank %d, which expects %lld",
             (long long)((0 + last) % 3), last, (long long)((0 + last) % 3 + 1));
    expect_mismatch(on, st, "alltoallv counts", want);
    rc[0] = keep;
    test_free_tensors((loom_tensor_t *[]){&shorter, &vr2}, 2);
    // Compressed allreduce with another seed on the last rank.
    st = loom_compressed_allreduce(w, c, LOOM_SCHEME_INDIVISIBLE, NULL, &a, LOOM_SUM,
                                   me_last ? 12 : 11, NULL);
    expect_mismatch(on, st, "compressed seed", "with a different compressor, scheme or seed");
    // Calls the last rank refuses (bad arguments there only): the others do not wait for it.
    snprintf(want, sizeof want, "rank %d refused its call of allreduce('grad.h0') on group world",
             last);
    st = loom_allreduce(w, &a, me_last ? &b2k : &a, LOOM_SUM);
    expect_refused(st, me_last, "refused allreduce", "recv", want);
    snprintf(want, sizeof want, "rank %d refused its call of broadcast('grad.h0')", last);
    st = loom_broadcast(w, &a, me_last ? size : 0);
    expect_refused(st, me_last, "refused broadcast", "root", want);
    snprintf(want, sizeof want, "rank %d refused its call of reduce_scatter('grad.big')", last);
    st = loom_reduce_scatter(w, &big, me_last ? &b2k : &blk, NULL, LOOM_SUM);
    expect_refused(st, me_last, "refused reduce_scatter", "recv", want);
    snprintf(want, sizeof want, "rank %d refused its call of allgather('rs.out')", last);
    st = loom_allgather(w, &blk, me_last ? &b2k : &big);
    expect_refused(st, me_last, "refused allgather", "recv", want);
    snprintf(want, sizeof want, "rank %d refused its call of allgatherv('gv.part')", last);
    st = loom_allgatherv(w, &mine, &all, me_last ? NULL : counts);
    expect_refused(st, me_last, "refused allgatherv", "counts", want);
    snprintf(want, sizeof want, "rank %d refused its call of alltoall('grad.big')", last);
    st = loom_alltoall(w, &big, me_last ? &b2k : &big2);
    expect_refused(st, me_last, "refused alltoall", "recv", want);
    snprintf(want, sizeof want, "rank %d refused its call of alltoallv('a2av')", last);
    st = loom_alltoallv(w, &vs, me_last ? NULL : sc, &vr, rc);
    expect_refused(st, me_last, "refused alltoallv", "send_counts", want);
    snprintf(want, sizeof want, "rank %d refused its call of compressed_allreduce('grad.h0')",
             last);
    st = loom_compressed_allreduce(w, c, LOOM_SCHEME_INDIVISIBLE, NULL, &a,
                                   me_last ? LOOM_MAX : LOOM_SUM, 11, NULL);
    expect_refused(st, me_last, "refused compressed allreduce", "LOOM_SUM or LOOM_AVG", want);
    // The staged form: the last rank's tensor is larger than its stage.
    loom_host_stage_t *stage = NULL;
    OK(loom_host_stage_create(LOOM_DEVICE_HOST, 1024, &stage));
    snprintf(want, sizeof want, "rank %d refused its call of compressed_allreduce('grad.", last);
    st = loom_compressed_allreduce_staged(w, c, LOOM_SCHEME_INDIVISIBLE, NULL, me_last ? &big : &a,
                                          stage, LOOM_SUM, 11, NULL);
    expect_refused(st, me_last, "refused staged compressed allreduce", "the stage holds", want);
    OK(loom_compressed_allreduce_staged(w, c, LOOM_SCHEME_INDIVISIBLE, NULL, &a, stage, LOOM_SUM,
                                        11, NULL));
    loom_host_stage_destroy(stage);
  }
  // The group still works after the refused calls.
  OK(loom_allreduce(w, &a, &a, LOOM_SUM));
  OK(loom_alltoallv(w, &vs, sc, &vr, rc));
  loom_compressor_destroy(c);
  free(counts);
  free(sc);
  free(rc);
  test_free_tensors(
      (loom_tensor_t *[]){&a, &b, &big, &big2, &h, &i32, &mine, &all, &blk, &vs, &vr, &b2k}, 12);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  OK(loom_init(&argc, &argv, NULL, &ctx));
  if (!ctx) {
    return 1;
  }
  rank = loom_rank(ctx);
  size = loom_size(ctx);
  const char *mode = argc > 1 ? argv[1] : "consistency";
  int arg = argc > 2 ? atoi(argv[2]) : 0;
  if (!strcmp(mode, "skip") || !strcmp(mode, "skip-test") || !strcmp(mode, "skip-first")) {
    const int warm = strcmp(mode, "skip-first") ? 2 : 0;
    if (!skip(ctx, arg, warm, !strcmp(mode, "skip-test"), argc > 3 ? argv[3] : NULL)) {
      return 0; // the skipping rank: the job is aborted meanwhile
    }
  } else if (!strcmp(mode, "skip-sched")) {
    if (!skip_sched(ctx, arg)) {
      return 0;
    }
  } else if (!strcmp(mode, "skip-barrier")) {
    if (!skip_barrier(ctx, arg)) {
      return 0;
    }
  } else if (!strcmp(mode, "skip-moe")) {
    if (!skip_moe(ctx, arg)) {
      return 0;
    }
  } else if (!strcmp(mode, "attn-consistency")) {
    attn_consistency(ctx);
  } else if (!strcmp(mode, "moe-consistency")) {
    moe_consistency(ctx);
  } else if (!strcmp(mode, "skip-attn")) {
    if (!skip_attn(ctx, arg)) {
      return 0;
    }
  } else if (!strcmp(mode, "lost-recv")) {
    if (!lost_recv(ctx)) {
      return 0;
    }
  } else if (!strcmp(mode, "diverge")) {
    if (!diverge(ctx)) {
      return 0;
    }
  } else if (!strcmp(mode, "abort")) {
    abort_one(ctx);
  } else if (!strcmp(mode, "slow")) {
    slow(ctx, arg);
  } else {
    consistency(ctx);
  }
  int rc = check_exit_all("test_watchdog");
  loom_finalize(ctx);
  return rc;
}
