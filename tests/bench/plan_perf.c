/* plan_perf.c — how long ByteComp's greedy planner (loom_plan_greedy) takes as the tensor count
 * grows, on a synthetic problem: 8 ranks on 2 nodes, 3 codecs, one worker lane, comm exposed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom.h"
#include "loom_plan.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Plan nt tensors of 1,000 to 100,999 values, one every 10 us of a backward of 10 nt us.
static int plan_one(int nt) {
  loom_plan_tensor_t *t = calloc((size_t)nt + 1, sizeof *t);
  loom_plan_choice_t *choice = calloc((size_t)nt + 1, sizeof *choice);
  if (!t || !choice) {
    fprintf(stderr, "plan_perf: out of memory for %d tensors\n", nt);
    free(t);
    free(choice);
    return 1;
  }
  for (int i = 0; i < nt; i++) {
    t[i] = (loom_plan_tensor_t){"grad", 1000 + (int64_t)i * 7919 % 100000, 10.0 * i};
  }
  const loom_codec_cost_t codecs[3] = {{"fp16", 5, 0.3, 5, 0.3, 2, 0},
                                       {"int8", 5, 0.5, 5, 0.5, 1, 4},
                                       {"topk:0.01", 20, 3, 5, 0.1, 0.08, 0}};
  const loom_plan_problem_t p = {.ntensors = nt,
                                 .tensors = t,
                                 .compute_us = 10.0 * nt,
                                 .ranks = 8,
                                 .nodes = 2,
                                 .intra = {5, 100},
                                 .inter = {20, 1},
                                 .ncodecs = 3,
                                 .codecs = codecs,
                                 .workers = 1};
  loom_plan_result_t r;
  const double t0 = now_s();
  loom_status_t st = loom_plan_greedy(&p, choice, &r);
  const double s = now_s() - t0;
  int compressed = 0;
  for (int i = 0; i < nt; i++) {
    compressed += choice[i].codec >= 0;
  }
  if (st == LOOM_OK) {
    printf("%9d %12.3f %14.0f %14.0f %12d\n", nt, s, p.compute_us, r.step_us, compressed);
  } else {
    fprintf(stderr, "plan_perf: %s\n", loom_last_error(NULL));
  }
  free(t);
  free(choice);
  return st != LOOM_OK;
}

int main(int argc, char **argv) {
  static const int fallback[] = {250, 500, 1000, 2000, 4000};
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    printf("usage: plan_perf [TENSORS...]   (default: 250 500 1000 2000 4000)\n"
           "Times loom_plan_greedy on a synthetic problem of each size (8 ranks on 2 nodes, 3 "
           "codecs, one worker lane).\n");
    return 0;
  }
  printf("# plan_perf: loom_plan_greedy, 8 ranks on 2 nodes (1 Gbit/s between), fp16, int8, "
         "topk:0.01, one worker lane\n");
  printf("# %7s %12s %14s %14s %12s\n", "tensors", "seconds", "compute_us", "step_us",
         "compressed");
  int rc = 0;
  const int n = argc > 1 ? argc - 1 : (int)(sizeof fallback / sizeof fallback[0]);
  for (int i = 0; i < n; i++) {
    char *end = NULL;
    long nt = argc > 1 ? strtol(argv[i + 1], &end, 10) : fallback[i];
    if (argc > 1 && (end == argv[i + 1] || *end != '\0' || nt < 1 || nt > 1000000)) {
      fprintf(stderr, "plan_perf: '%s' is not a tensor count in 1..1000000\n", argv[i + 1]);
      return 2;
    }
    rc |= plan_one((int)nt);
  }
  return rc;
}
