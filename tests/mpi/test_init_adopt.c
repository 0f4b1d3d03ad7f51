/* test_init_adopt.c — loom_init adopting an MPI the caller initialised: the granted thread
 * level is recorded, loom_finalize leaves MPI running, and the caller finalizes it. */
#include <string.h>

#include "../check_mpi.h"
#include "../quiet.h"
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
  // The caller finalizing MPI before loom_finalize: loom's communicators went with MPI, so
  // loom_finalize says how to order the calls (was: MPI_Comm_free after MPI_Finalize, which
  // Open MPI answers by aborting the process).
  loom_ctx_t *late = NULL;
  CHECK(loom_init(&argc, &argv, &cfg, &late) == LOOM_OK, "second adopting init: %s",
        loom_last_error(NULL));
  int rc = check_exit_all("test_init_adopt");
  MPI_Finalize();
  if (late) {
    quiet_begin();
    st = loom_finalize(late);
    quiet_end();
    CHECK(st == LOOM_ERR_STATE && strstr(loom_last_error(NULL), "after MPI_Finalize") &&
              strstr(loom_last_error(NULL), "before MPI_Finalize"),
          "loom_finalize after the caller's MPI_Finalize: %s: %s", loom_strerror(st),
          loom_last_error(NULL));
  }
  return check_failures ? check_exit("test_init_adopt") : rc;
}
