/* test_gpu_sched.c — the scheduler's CUDA lanes: compute and worker tasks queue device ops on
 * their own streams, dependencies hold across streams (events), GPU spans reach the timeline. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_test.h"
#include "loom.h"

#define N (1 << 20) // elements: enough that a kernel outlasts a task's host time

typedef struct chain {
  loom_tensor_t x, y; // device
} chain_t;

static loom_status_t double_x(void *arg) { // compute: x *= 2
  return loom_scale(&((chain_t *)arg)->x, 2.0f);
}
static loom_status_t add_x(void *arg) { // worker: y += x
  chain_t *c = arg;
  return loom_axpy(&c->y, 1.0f, &c->x);
}
static loom_status_t triple_y(void *arg) { // compute: y *= 3
  return loom_scale(&((chain_t *)arg)->y, 3.0f);
}

int main(void) {
  gpu_require_device("test_gpu_sched");
  const int64_t shape[1] = {N};
  loom_tensor_t hx = test_tensor_f32(1, shape, "x"), hy = test_tensor_f32(1, shape, "y");
  test_rng_t rng = test_rng(7);
  test_fill_uniform(&rng, test_floats(&hx), N, -1.0, 1.0);
  test_fill_uniform(&rng, test_floats(&hy), N, -1.0, 1.0);
  chain_t c = {gpu_upload(&hx), gpu_upload(&hy)};

  const char *tl_path = "test_gpu_sched_timeline_%r.json";
  loom_sched_opts_t opts = {.workers = 1, .timeline = tl_path, .rank = 0, .cuda = 1};
  loom_sched_t *s = NULL;
  loom_status_t st = loom_sched_create(NULL, &opts, &s);
  CHECK(st == LOOM_OK, "loom_sched_create with cuda: %s", loom_last_error(NULL));
  int a = -1, w = -1, b = -1;
  loom_task_desc_t da = {.name = "double_x", .lane = LOOM_LANE_COMPUTE, .run = double_x, .arg = &c};
  loom_task_desc_t dw = {.name = "add_x", .lane = LOOM_LANE_WORKER, .run = add_x, .arg = &c};
  loom_task_desc_t db = {.name = "triple_y", .lane = LOOM_LANE_COMPUTE, .run = triple_y, .arg = &c};
  CHECK(loom_sched_add(s, &da, &a) == LOOM_OK && loom_sched_add(s, &dw, &w) == LOOM_OK &&
            loom_sched_add(s, &db, &b) == LOOM_OK,
        "add: %s", loom_last_error(NULL));
  CHECK(loom_sched_depend(s, w, a) == LOOM_OK && loom_sched_depend(s, b, w) == LOOM_OK,
        "depend: %s", loom_last_error(NULL));

  // Host reference of 3 steps: x = 2x; y = 3 (y + x), in the same f32 arithmetic.
  float *x = test_floats(&hx), *y = test_floats(&hy);
  const int steps = 3;
  for (int k = 0; k < steps; k++) {
    for (int64_t i = 0; i < N; i++) {
      x[i] = x[i] * 2.0f;
      y[i] = (y[i] + x[i]) * 3.0f;
    }
    st = loom_sched_run(s);
    CHECK(st == LOOM_OK, "step %d: %s", k, loom_last_error(NULL));
  }
  loom_step_stats_t stats;
  CHECK(loom_sched_step_stats(s, &stats) == LOOM_OK, "stats");
  CHECK(stats.gpu_ms > 0.0, "gpu_ms = %g: the compute stream's tasks took no GPU time",
        stats.gpu_ms);
  CHECK(stats.tasks_run == 3, "tasks_run = %d", stats.tasks_run);
  // The chain crosses streams twice per step; a missing wait would read x or y half-written.
  gpu_compare("x after 3 steps", &c.x, &hx, 0.0, 0.0);
  gpu_compare("y after 3 steps", &c.y, &hy, 1e-6, 1e-6);
  CHECK(loom_sched_destroy(s) == LOOM_OK, "destroy: %s", loom_last_error(NULL));

  // The timeline has the GPU tracks.
  FILE *f = fopen("test_gpu_sched_timeline_0.json", "r");
  CHECK(f != NULL, "timeline file missing");
  if (f) {
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    CHECK(strstr(buf, "gpu compute stream") && strstr(buf, "gpu worker stream"),
          "timeline lacks the gpu tracks");
    remove("test_gpu_sched_timeline_0.json");
  }
  loom_tensor_free(&c.x);
  loom_tensor_free(&c.y);
  loom_tensor_free(&hx);
  loom_tensor_free(&hy);
  return check_exit("test_gpu_sched");
}
