/* test_init.c — loom_init owning MPI: ranks and sizes match MPI, the thread level is recorded,
 * nodes and local ranks are consistent, a second context adopts MPI, finalize refuses while a
 * request is in flight or when the context was finalized already, and MPI ends with the last
 * context finalized. */
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../quiet.h"
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
    // Finalizing it again (a cleanup path that runs twice) is refused, reading nothing of the
    // freed context (was: a read and a second free of freed memory).
    quiet_begin();
    st = loom_finalize(second);
    quiet_end();
    CHECK(st == LOOM_ERR_STATE && strstr(loom_last_error(NULL), "not a live context"),
          "second finalize of a context: %s: %s", loom_strerror(st), loom_last_error(NULL));
  }
  CHECK(loom_finalize(NULL) == LOOM_ERR_INVALID_ARG, "finalize(NULL) rejected");

  // A request in flight: loom_finalize refuses, frees nothing, and the request completes after.
  const loom_group_t *world = loom_group(ctx, LOOM_GROUP_WORLD);
  float one = 1.0f;
  int64_t n1 = 1;
  loom_tensor_t t;
  loom_tensor_wrap(&t, &one, LOOM_F32, LOOM_DEVICE_HOST, 1, &n1, "one");
  loom_request_t *req = NULL;
  CHECK(loom_iallreduce(world, &t, &t, LOOM_SUM, &req) == LOOM_OK, "iallreduce");
  quiet_begin();
  st = loom_finalize(ctx);
  quiet_end();
  CHECK(st == LOOM_ERR_STATE && strstr(loom_last_error(NULL), "1 request(s)") &&
            strstr(loom_last_error(NULL), "loom_wait"),
        "finalize with a request in flight: %s: %s", loom_strerror(st), loom_last_error(NULL));
  CHECK(loom_wait(&req) == LOOM_OK && one == (float)size, "the request after: %g", (double)one);
  // With another context live, a request of the first never makes the other's finalize refuse
  // (a correct program is never refused; requests are counted per process).
  loom_ctx_t *fourth = NULL;
  CHECK(loom_init(NULL, NULL, NULL, &fourth) == LOOM_OK, "fourth init");
  one = 1.0f;
  CHECK(loom_iallreduce(world, &t, &t, LOOM_SUM, &req) == LOOM_OK, "iallreduce");
  if (fourth) {
    CHECK(loom_finalize(fourth) == LOOM_OK, "finalize another context: %s", loom_last_error(NULL));
  }
  CHECK(loom_wait(&req) == LOOM_OK && one == (float)size, "the request after: %g", (double)one);

  // The owning context finalized first while another is live: MPI stays up for the other, and
  // its finalize ends MPI.
  loom_ctx_t *third = NULL;
  CHECK(loom_init(NULL, NULL, NULL, &third) == LOOM_OK, "third init");
  int failures = check_failures, any = 0;
  MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(loom_finalize(ctx) == LOOM_OK, "finalize");
  int finalized = 0;
  MPI_Finalized(&finalized);
  CHECK(!finalized, "MPI stays up while another context is live");
  if (third) {
    one = 1.0f;
    CHECK(loom_allreduce(loom_group(third, LOOM_GROUP_WORLD), &t, &t, LOOM_SUM) == LOOM_OK &&
              one == (float)size,
          "the other context works after: %g", (double)one);
    CHECK(loom_finalize(third) == LOOM_OK, "finalize third");
  }
  MPI_Finalized(&finalized);
  CHECK(finalized, "the last context's finalize ended MPI, which the first had initialised");
  // A loom_init after that cannot initialise MPI again: the message says how to keep MPI up.
  loom_ctx_t *after = NULL;
  quiet_begin();
  st = loom_init(NULL, NULL, NULL, &after);
  quiet_end();
  CHECK(st == LOOM_ERR_STATE && !after && strstr(loom_last_error(NULL), "MPI_Init_thread") &&
            strstr(loom_last_error(NULL), "adopts"),
        "loom_init after MPI_Finalize: %s: %s", loom_strerror(st), loom_last_error(NULL));
  return any ? 1 : check_exit("test_init");
}
