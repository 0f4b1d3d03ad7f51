/* fuzz_sim_profile.c — libFuzzer target for loom_sim's file loaders (sched/sim_io.c): any bytes as
 * a cluster file and as a profile; a profile that loads is simulated on a fixed cluster. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "loom_sim.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, "/dev/null"); // each rejection logs a WARN
  snprintf(path, sizeof path, "/tmp/fuzz_sim_profile.%ld", (long)getpid());
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    abort(); // the harness needs its temporary file
  }
  if (size && fwrite(data, 1, size, f) != size) {
    abort();
  }
  fclose(f);
  // The same bytes as a cluster file (loom_sim --cluster): what loads is complete and in range.
  loom_sim_cluster_t cl;
  if (loom_sim_cluster_load(path, &cl) == LOOM_OK) {
    const int max = 1 << 24;
    if (cl.nodes < 1 || cl.nodes > max || cl.ranks_per_node < 1 || cl.ranks_per_node > max ||
        cl.cores_per_node < 1 || cl.cores_per_node > max || !(cl.intra.gbps > 0.0) ||
        !(cl.inter.gbps > 0.0) || !(cl.intra.alpha_us >= 0.0) || !(cl.inter.alpha_us >= 0.0) ||
        !memchr(cl.name, 0, sizeof cl.name) || !cl.name[0]) {
      abort();
    }
  }
  loom_sim_profile_t p;
  loom_status_t st = loom_sim_profile_load(path, &p);
  if (st != LOOM_OK) {
    if (p.tensors || p.codecs || p.docs || p.batch_end || p.ntensors || p.ndocs) {
      abort(); // a failed load must leave an empty profile
    }
    return 0;
  }
  loom_sim_cluster_t c = {.nodes = 2, .ranks_per_node = 4, .cores_per_node = 2};
  snprintf(c.name, sizeof c.name, "fuzz");
  c.intra = (loom_link_t){.alpha_us = 2, .gbps = 40};
  c.inter = (loom_link_t){.alpha_us = 10, .gbps = 1};
  c.inter_shared = 1;
  for (int ranks = 1; ranks <= 8; ranks *= 2) {
    for (int attn = 0; attn < 2; attn++) {
      loom_sim_strategy_t s = {.grad = ranks == 8 && p.ncodecs > 0 ? 0 : LOOM_SIM_GRAD_NONE,
                               .moe_overlap = ranks % 3,
                               .attn_servers = attn};
      loom_sim_result_t r;
      if (loom_sim_predict(&p, &c, ranks, &s, 1, &r) == LOOM_OK && !(r.step_ms >= 0.0)) {
        abort(); // a prediction that loaded must be a number
      }
    }
  }
  loom_sim_profile_free(&p);
  return 0;
}
