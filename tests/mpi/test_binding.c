/* test_binding.c — each rank's binding matches its report: the OS affinity mask has the PUs
 * of the reported cores, ranks on one host do not overlap while cores suffice, and the BLAS
 * thread count equals the rank's share. BINDING_TEST_CPUS (a list of OS CPUs, set by
 * binding_taskset.sh) is the set the job started on: every rank's mask must lie within it. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "loom.h"

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  const loom_topology_t *t = loom_topology(ctx);
  const char *mode = getenv("LOOM_BIND") ? getenv("LOOM_BIND") : "core";
  int first, count;
  loom_bound_cores(ctx, &first, &count);
  CHECK(t->cores >= 1 && t->pus >= t->cores && t->numa_nodes >= 1, "topology counts");
  CHECK(first >= 0 && count >= 1 && first + count <= t->cores, "cores %d+%d of %d", first, count,
        t->cores);
  cpu_set_t set;
  CPU_ZERO(&set);
  CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity");
  int pus_per_core = t->pus / t->cores;
  int rank = loom_rank(ctx), size = loom_size(ctx);
  // The starting set, when the job was started within one: "3" or "2,3" (OS CPU numbers).
  const char *expect = getenv("BINDING_TEST_CPUS");
  int expect_cores = t->cores; // cores the ranks may spread over
  if (expect) {
    cpu_set_t want;
    CPU_ZERO(&want);
    for (const char *p = expect; *p;) {
      char *end = NULL;
      long c = strtol(p, &end, 10);
      if (end == p || c < 0 || c >= CPU_SETSIZE) {
        CHECK(0, "BINDING_TEST_CPUS='%s' is not a comma list of CPUs", expect);
        break;
      }
      CPU_SET((int)c, &want);
      p = *end == ',' ? end + 1 : end;
    }
    cpu_set_t outside;
    CPU_XOR(&outside, &set, &want);
    CPU_AND(&outside, &outside, &set);
    CHECK(CPU_COUNT(&outside) == 0,
          "rank %d: bound to %d CPU(s) outside the %s the job started on (LOOM_BIND=%s)", rank,
          CPU_COUNT(&outside), expect, mode);
    expect_cores = CPU_COUNT(&want) / (pus_per_core > 0 ? pus_per_core : 1);
    expect_cores = expect_cores > 0 ? expect_cores : 1;
  }
  if (!strcmp(mode, "core")) {
    CHECK(CPU_COUNT(&set) == count * pus_per_core, "affinity has %d PUs, want %d", CPU_COUNT(&set),
          count * pus_per_core);
    CHECK(loom_blas_threads(ctx) == count, "blas threads %d, share %d", loom_blas_threads(ctx),
          count);
    // Single host in the tests: ranks get disjoint masks while there are enough cores.
    unsigned char mine[CPU_SETSIZE / 8] = {0}, all[64][CPU_SETSIZE / 8];
    for (int c = 0; c < CPU_SETSIZE; c++) {
      if (CPU_ISSET(c, &set)) {
        mine[c / 8] |= (unsigned char)(1u << (c % 8));
      }
    }
    if (size <= 64) {
      MPI_Allgather(mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
      for (int r = 0; r < size && size <= expect_cores; r++) {
        for (int b = 0; r != rank && b < (int)sizeof mine; b++) {
          CHECK((mine[b] & all[r][b]) == 0, "rank %d overlaps rank %d", rank, r);
        }
      }
    }
  } else if (!strcmp(mode, "numa")) {
    CHECK(CPU_COUNT(&set) >= count, "numa mask %d PUs, cores %d", CPU_COUNT(&set), count);
    CHECK(loom_blas_threads(ctx) >= 1, "blas threads");
  }
  char line[512];
  CHECK(loom_describe_placement(ctx, line, sizeof line) == LOOM_OK && strstr(line, "cores") &&
            strstr(line, "blas_threads"),
        "placement line: %s", line);
  CHECK(loom_gpu(ctx) < t->gpus || loom_gpu(ctx) == -1, "gpu index");
  if (t->gpus == 0) {
    CHECK(loom_gpu(ctx) == -1, "no GPU visible, none picked");
  }
  int rc = check_exit_all("test_binding");
  loom_finalize(ctx);
  return rc;
}
