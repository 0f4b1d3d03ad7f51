/* test_init_adopt.c — loom_init adopting an MPI the caller initialised: the granted thread
 * level is recorded, loom_finalize leaves MPI running, and the caller finalizes it. */
#include "../check_mpi.h"
#include "loom.h"

int main(int argc, char **argv) {
  int provided = -1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  loom_config_t cfg;
  loom_config_init(&cfg);
  cfg.bind = "none"; // a program that manages its own binding
  loom_ctx_t *ctx = NULL;
  loom_status_t st = loom_init(&argc, &argv, &cfg, &ctx);
  CHECK(st == LOOM_OK, "adopting init: %s", loom_last_error(NULL));
  if (st != LOOM_OK) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  CHECK(loom_owns_mpi(ctx) == 0, "adopted MPI is not owned");
  CHECK(loom_mpi_thread_level(ctx) == provided, "level %d, provided %d", loom_mpi_thread_level(ctx),
        provided);
  int first, count;
  loom_bound_cores(ctx, &first, &count);
  CHECK(first == 0 && count == loom_topology(ctx)->cores, "bind=none reports the whole host");
  CHECK(loom_finalize(ctx) == LOOM_OK, "finalize");
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(!finalized, "MPI still running after loom_finalize");
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CHECK(sum == size, "MPI usable after loom_finalize");
  int rc = check_exit_all("test_init_adopt");
  MPI_Finalize();
  return rc;
}
