/* test_error_paths.c — after errors in every layer the runtime stays usable and loom_finalize
 * works: a failed loom_init leaves MPI to a second one, failed calls leave the context, the
 * scheduler, fusion and compression usable, and finalize returns LOOM_OK (np 2..4). */
#include "config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../check.h"
#include "../quiet.h"
#include "loom.h"
#include "loom_sched.h"

static int fail_next; // the task below fails while this is set

static loom_status_t task_maybe_fail(void *arg) {
  (void)arg;
  if (fail_next) {
    return LOOM_ERR_INVALID_ARG; // a planted failure
  }
  return LOOM_OK;
}

// Section 3's second graph: rank 1 is late to the allreduce, so on the others it is still in
// flight when the failing task ends the step (polling it used to clear the failure's message).
static const loom_group_t *late_group;
static loom_tensor_t late_t;

static loom_status_t task_late(void *arg) {
  (void)arg;
  if (loom_group_rank(late_group) == 1) {
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
  }
  return LOOM_OK;
}

static loom_status_t start_late_allreduce(void *arg, loom_request_t **req) {
  (void)arg;
  return loom_iallreduce(late_group, &late_t, &late_t, LOOM_SUM, req);
}

// A correct allreduce of ones: every rank must see the group size (the context still works).
static void check_allreduce_works(const loom_group_t *g, const char *after) {
  float v[5];
  int64_t n = 5;
  loom_tensor_t t;
  for (int i = 0; i < 5; i++) {
    v[i] = 1.0f;
  }
  CHECK(loom_tensor_wrap(&t, v, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "ones") == LOOM_OK, "wrap");
  loom_status_t st = loom_allreduce(g, &t, &t, LOOM_SUM);
  CHECK(st == LOOM_OK && v[4] == (float)loom_group_size(g), "allreduce after %s: %s, %g", after,
        loom_strerror(st), (double)v[4]);
}

int main(int argc, char **argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); // adopted by loom_init
  loom_ctx_t *ctx = NULL;
  // 1. A bad config fails loom_init on every rank with a message; MPI (the caller's) survives,
  //    and a second loom_init with a good config succeeds.
  loom_config_t bad;
  loom_config_init(&bad);
  bad.bind = "socket";
  quiet_begin();
  loom_status_t st = loom_init(&argc, &argv, &bad, &ctx);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && ctx == NULL, "bad LOOM_BIND: %s", loom_strerror(st));
  CHECK(strstr(loom_last_error(NULL), "socket") != NULL, "message: %s", loom_last_error(NULL));
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(!finalized, "a failed loom_init finalized the caller's MPI");
  st = loom_init(&argc, &argv, NULL, &ctx);
  CHECK(st == LOOM_OK && ctx != NULL, "second loom_init: %s", loom_last_error(NULL));
  if (!ctx) {
    MPI_Finalize();
    return 1;
  }
  const loom_group_t *world = loom_group(ctx, LOOM_GROUP_WORLD);
  const int rank = loom_rank(ctx);

  // 2. Collectives: bad arguments fail locally (every rank alike), nothing is left in flight.
  float a[4] = {0}, b[6] = {0};
  int64_t n4 = 4, n6 = 6;
  loom_tensor_t ta, tb;
  loom_tensor_wrap(&ta, a, LOOM_F32, LOOM_DEVICE_HOST, 1, &n4, "a");
  loom_tensor_wrap(&tb, b, LOOM_F32, LOOM_DEVICE_HOST, 1, &n6, "b");
  quiet_begin();
  st = loom_allreduce(world, &ta, &tb, LOOM_SUM);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG, "allreduce of 4 into 6: %s", loom_strerror(st));
  CHECK(strstr(loom_last_error(ctx), "allreduce") != NULL,
        "loom_last_error(ctx) has the collective's message: '%s'", loom_last_error(ctx));
  check_allreduce_works(world, "a rejected allreduce");
  // A receive shorter than the message sent to it: a named error on the receiver (the group
  // communicators return MPI's errors to loom; Open MPI's default aborted the job), nothing
  // written past the receive, and the next exchange on the same tag works.
  if (rank < 2 && loom_group_size(world) >= 2) {
    float m[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
    int64_t n8 = 8, n4r = 4;
    loom_tensor_t tm, tg;
    for (int i = 0; i < 8; i++) {
      got[i] = -1.0f;
    }
    loom_tensor_wrap(&tm, m, LOOM_F32, LOOM_DEVICE_HOST, 1, &n8, "eight");
    loom_tensor_wrap(&tg, got, LOOM_F32, LOOM_DEVICE_HOST, 1, &n4r, "four");
    if (rank == 0) {
      CHECK(loom_send(world, &tm, 1, 9) == LOOM_OK, "send 8: %s", loom_last_error(NULL));
    } else {
      quiet_begin();
      st = loom_recv(world, &tg, 0, 9);
      quiet_end();
      CHECK(st == LOOM_ERR_MPI && strstr(loom_last_error(ctx), "longer than the receive") &&
                strstr(loom_last_error(ctx), "from rank 0") &&
                strstr(loom_last_error(ctx), "loom_recv"),
            "receive of 4 for a message of 8: %s: %s", loom_strerror(st), loom_last_error(ctx));
      CHECK(got[4] == -1.0f && got[7] == -1.0f, "the truncated receive wrote past its 4 floats");
    }
    loom_tensor_wrap(&tg, got, LOOM_F32, LOOM_DEVICE_HOST, 1, &n8, "eight");
    if (rank == 0) {
      CHECK(loom_send(world, &tm, 1, 9) == LOOM_OK, "send 8 again: %s", loom_last_error(NULL));
    } else {
      st = loom_recv(world, &tg, 0, 9);
      CHECK(st == LOOM_OK && got[0] == 1.0f && got[7] == 8.0f, "receive of 8 after: %s: %g %g",
            loom_last_error(ctx), (double)got[0], (double)got[7]);
    }
  }
  check_allreduce_works(world, "a truncated receive");

  // 3. The scheduler: a failing task ends the step with its error; the next step runs clean.
  loom_sched_t *s = NULL;
  loom_sched_opts_t so = {.timeline = ""};
  CHECK(loom_sched_create(ctx, &so, &s) == LOOM_OK, "sched create");
  loom_task_desc_t d = {.name = "maybe", .lane = LOOM_LANE_COMPUTE, .run = task_maybe_fail};
  int id;
  CHECK(loom_sched_add(s, &d, &id) == LOOM_OK, "sched add");
  fail_next = 1;
  quiet_begin();
  st = loom_sched_run(s);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "maybe") != NULL,
        "failing step: %s: %s", loom_strerror(st), loom_last_error(NULL));
  fail_next = 0;
  CHECK(loom_sched_run(s) == LOOM_OK, "the step after a failed one: %s", loom_last_error(NULL));
  CHECK(loom_sched_destroy(s) == LOOM_OK, "sched destroy");
  // The failure's message survives the allreduce still in flight, and carries the step number
  // that loom_sched_set_step gave (a resumed loop's own).
  float late_v[3] = {1.0f, 1.0f, 1.0f};
  int64_t n3 = 3;
  late_group = world;
  loom_tensor_wrap(&late_t, late_v, LOOM_F32, LOOM_DEVICE_HOST, 1, &n3, "late");
  CHECK(loom_sched_create(ctx, &so, &s) == LOOM_OK, "sched create");
  loom_task_desc_t dl = {
      .name = "late", .lane = LOOM_LANE_COMPUTE, .run = task_late, .priority = 1};
  loom_task_desc_t da = {.name = "ar", .lane = LOOM_LANE_COMM, .start = start_late_allreduce};
  int il, ia;
  CHECK(loom_sched_add(s, &dl, &il) == LOOM_OK && loom_sched_add(s, &da, &ia) == LOOM_OK &&
            loom_sched_add(s, &d, &id) == LOOM_OK && loom_sched_depend(s, ia, il) == LOOM_OK,
        "sched add: %s", loom_last_error(NULL));
  quiet_begin();
  st = loom_sched_set_step(s, -1);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG, "set_step -1: %s", loom_strerror(st));
  CHECK(loom_sched_set_step(s, 41) == LOOM_OK, "set_step: %s", loom_last_error(NULL));
  fail_next = 1;
  quiet_begin();
  st = loom_sched_run(s);
  quiet_end();
  fail_next = 0;
  CHECK(st == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "step 41: compute task 'maybe'"),
        "failing step with an allreduce in flight: %s: '%s'", loom_strerror(st),
        loom_last_error(NULL));
  CHECK(late_v[0] == (float)loom_group_size(world), "the allreduce in flight completed: %g",
        (double)late_v[0]);
  loom_step_stats_t ss;
  CHECK(loom_sched_step_stats(s, &ss) == LOOM_OK && ss.step == 41, "stats step %lld",
        (long long)ss.step);
  CHECK(loom_sched_run(s) == LOOM_OK && loom_sched_step_stats(s, &ss) == LOOM_OK && ss.step == 42,
        "the next step is 42: %lld", (long long)ss.step);
  CHECK(loom_sched_destroy(s) == LOOM_OK, "sched destroy");

  // 4. Fusion and compression: bad calls fail, the objects keep working.
  loom_fusion_t *fu = NULL;
  CHECK(loom_fusion_create(ctx, world, 0, &fu) == LOOM_OK, "fusion create");
  loom_tensor_t *list[2] = {&ta, NULL};
  quiet_begin();
  st = loom_fusion_allreduce(fu, list, 2, LOOM_SUM);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG, "fusion with a NULL tensor: %s", loom_strerror(st));
  a[0] = 1.0f;
  CHECK(loom_fusion_allreduce(fu, list, 1, LOOM_SUM) == LOOM_OK &&
            a[0] == (float)loom_group_size(world),
        "fusion after an error: %g", (double)a[0]);
  loom_fusion_destroy(fu);
  loom_compressor_t *c = NULL;
  quiet_begin();
  st = loom_compressor_create("topk:7", &c);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && c == NULL, "topk:7: %s", loom_strerror(st));

  // 5. A checkpoint that is not there, and one that is damaged: errors, nothing written.
  char path[96];
  snprintf(path, sizeof path, "/tmp/loom-errpath-%d-%d.ckpt", (int)getpid(), rank);
  loom_ckpt_info_t info = {.world_size = loom_size(ctx), .rank = rank, .step = 3};
  const loom_tensor_t *save[1] = {&ta};
  CHECK(loom_checkpoint_save(path, &info, save, 1) == LOOM_OK, "save: %s", loom_last_error(NULL));
  FILE *f = fopen(path, "r+b");
  if (f) {
    fseek(f, 40, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
  }
  a[0] = 42.0f;
  loom_tensor_t *load[1] = {&ta};
  int64_t step = -1;
  quiet_begin();
  st = loom_checkpoint_load(path, &info, load, 1, &step);
  quiet_end();
  CHECK(st == LOOM_ERR_CORRUPT && a[0] == 42.0f, "damaged checkpoint: %s, a[0] %g",
        loom_strerror(st), (double)a[0]);
  remove(path);
  quiet_begin();
  st = loom_checkpoint_load(path, &info, load, 1, &step);
  quiet_end();
  CHECK(st == LOOM_ERR_SYSTEM, "missing checkpoint: %s", loom_strerror(st));
  check_allreduce_works(world, "the errors above");

  // 6. Finalize after all of that: LOOM_OK, and MPI (the caller's) is still ours to finalize.
  CHECK(loom_finalize(ctx) == LOOM_OK, "loom_finalize after errors: %s", loom_last_error(NULL));
  MPI_Finalized(&finalized);
  CHECK(!finalized, "loom_finalize ended the caller's MPI");
  int failed = check_failures;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Finalize();
  if (rank == 0) {
    printf("test_error_paths: %s\n", failed ? "FAILED" : "all checks passed on every rank");
  }
  return failed ? 1 : 0;
}
