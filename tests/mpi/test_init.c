/* test_init.c — loom_init owning MPI: ranks and sizes match MPI, the thread level is recorded,
 * nodes and local ranks are consistent, a second context adopts MPI, finalize ends MPI. */
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "loom.h"

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  loom_status_t st = loom_init(&argc, &argv, NULL, &ctx);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s: %s\n", loom_strerror(st), loom_last_error(NULL));
    return 1;
  }
  int rank, size, level;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Query_thread(&level);
  CHECK(loom_rank(ctx) == rank && loom_size(ctx) == size, "rank/size");
  CHECK(loom_owns_mpi(ctx) == 1, "loom_init initialised MPI, so it owns it");
  CHECK(loom_mpi_thread_level(ctx) == level, "thread level %d vs %d", loom_mpi_thread_level(ctx),
        level);
  CHECK(loom_local_rank(ctx) >= 0 && loom_local_rank(ctx) < loom_local_size(ctx), "local rank");
  CHECK(loom_node(ctx) >= 0 && loom_node(ctx) < loom_num_nodes(ctx), "node index");
  CHECK(!strcmp(loom_version(), LOOM_VERSION_STRING), "version");
  CHECK(loom_last_error(ctx)[0] == '\0', "no error after success");

  // Local sizes add up to the world size over the node leaders.
  int lead = loom_local_rank(ctx) == 0 ? loom_local_size(ctx) : 0, total = 0;
  MPI_Allreduce(&lead, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == size, "local sizes sum to %d, want %d", total, size);

  // A second context adopts the running MPI.
  loom_ctx_t *second = NULL;
  CHECK(loom_init(NULL, NULL, NULL, &second) == LOOM_OK, "second init");
  if (second) {
    CHECK(loom_owns_mpi(second) == 0, "second context adopts MPI");
    CHECK(loom_finalize(second) == LOOM_OK, "finalize second");
    int finalized = 0;
    MPI_Finalized(&finalized);
    CHECK(!finalized, "finalizing the adopting context keeps MPI alive");
  }
  CHECK(loom_finalize(NULL) == LOOM_ERR_INVALID_ARG, "finalize(NULL) rejected");
  int failures = check_failures, any = 0;
  MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(loom_finalize(ctx) == LOOM_OK, "finalize");
  int finalized = 0;
  MPI_Finalized(&finalized);
  CHECK(finalized, "loom_finalize finalized MPI it owned");
  return any ? 1 : check_exit("test_init");
}
