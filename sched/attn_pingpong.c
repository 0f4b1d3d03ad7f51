/* attn_pingpong.c — two nano-batches of attention-server forwards as step-scheduler tasks: ship A
 * and B on the comm lane, compute A then B on the compute lane, finish A and B on the comm lane. */
#include "config.h"

#include <limits.h>
#include <stdio.h>

#include "error.h"
#include "loom_attn_plan.h"
#include "loom_sched.h"

// The graph keeps pointers to the caller's nano-batch descriptions (they outlive the graph).
static loom_status_t start_ship(void *arg, loom_request_t **req) {
  const loom_attn_nano_t *n = arg;
  return loom_attn_exec_ship_start(n->x, n->q, n->k, n->v, req);
}

static loom_status_t run_compute(void *arg) {
  const loom_attn_nano_t *n = arg;
  return loom_attn_exec_compute(n->x);
}

static loom_status_t start_finish(void *arg, loom_request_t **req) {
  const loom_attn_nano_t *n = arg;
  return loom_attn_exec_finish_start(n->x, n->out, n->lse, req);
}

// Bytes a nano-batch's q rows hold (for the timeline).
static size_t q_bytes(const loom_attn_nano_t *n) {
  return n->q ? loom_tensor_bytes(n->q) : 0;
}

loom_status_t loom_sched_add_attn_pingpong(loom_sched_t *s, loom_attn_nano_t nano[2], int after,
                                           int priority, const char *name, int ids[6]) {
  static const char op[] = "loom_sched_add_attn_pingpong";
  loom_status_t status = LOOM_OK;
  if (!s || !nano || !ids || !nano[0].x || !nano[1].x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: s, nano, nano[0].x, nano[1].x and ids must be set (two executors, one "
                      "per nano-batch)",
                      op);
  }
  if (priority == INT_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: priority = INT_MAX: nano-batch A's compute takes priority + 1, so pass "
                      "at most INT_MAX - 1",
                      op);
  }
  if (nano[0].x == nano[1].x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: the two nano-batches share one executor: make one per nano-batch", op);
  }
  const char *base = name ? name : "attn";
  const char *what[3] = {"ship", "compute", "finish"};
  for (int phase = 0; phase < 3; phase++) {
    for (int h = 0; h < 2; h++) {
      char label[96];
      snprintf(label, sizeof label, "%s.%s.%c", base, what[phase], 'A' + h);
      loom_task_desc_t d = {.name = label,
                            .lane = phase == 1 ? LOOM_LANE_COMPUTE : LOOM_LANE_COMM,
                            .priority = priority + (h == 0), // A's kernel before B's
                            .run = phase == 1 ? run_compute : NULL,
                            .start = phase == 0   ? start_ship
                                     : phase == 2 ? start_finish
                                                  : NULL,
                            .arg = &nano[h],
                            .bytes = q_bytes(&nano[h])};
      LOOM_CHECK(loom_sched_add(s, &d, &ids[2 * phase + h]));
    }
  }
  // ship A, ship B -> compute A -> compute B; each finish after its compute (finish A is posted
  // before compute B runs, and completes while B computes when A's results have arrived).
  const int deps[][2] = {{ids[2], ids[0]}, {ids[3], ids[1]}, {ids[3], ids[2]},
                         {ids[4], ids[2]}, {ids[5], ids[3]}, {ids[1], ids[0]}};
  for (size_t i = 0; i < sizeof deps / sizeof deps[0]; i++) {
    LOOM_CHECK(loom_sched_depend(s, deps[i][0], deps[i][1]));
  }
  if (after >= 0) {
    LOOM_CHECK(loom_sched_depend(s, ids[0], after));
  }
fail:
  return status;
}
