/* test_init_adopt.c — loom_init adopting an MPI the caller initialised: the granted thread
 * level is recorded, loom_finalize leaves MPI running, a failed init closes its log file, and the
 * caller finalizes it. */
#define _POSIX_C_SOURCE 200809L // readlink, getpid, access

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check_mpi.h"
#include "../quiet.h"
#include "loom.h"

// How many of this process's file descriptors are open on path.
static int open_descriptors_to(const char *path) {
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    char link[300], target[512];
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t len = readlink(link, target, sizeof target - 1);
    if (len > 0) {
      target[len] = '\0';
      n += strcmp(target, path) == 0;
    }
  }
  if (d) {
    closedir(d);
  }
  return n;
}

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
  // A failed init closes its LOOM_DEBUG_FILE (was: the file stayed open, one descriptor per
  // failed attempt, in a program that goes on after it).
  char dbg[512];
  snprintf(dbg, sizeof dbg, "%s/loom_adopt_dbg_%ld.log",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
  loom_config_t bad = cfg;
  bad.debug_file = dbg;
  bad.ep_size = size + 1; // no layout has an expert group larger than the world
  loom_ctx_t *failed = NULL;
  quiet_begin();
  st = loom_init(&argc, &argv, &bad, &failed);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && !failed, "init with LOOM_EP_SIZE %d at np %d: %s", size + 1,
        size, loom_strerror(st));
  CHECK(access(dbg, F_OK) == 0, "LOOM_DEBUG_FILE %s was not created", dbg);
  CHECK(open_descriptors_to(dbg) == 0, "a failed loom_init left %d descriptor(s) open on %s",
        open_descriptors_to(dbg), dbg);
  unlink(dbg);
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
