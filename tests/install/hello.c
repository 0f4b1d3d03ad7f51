/* hello.c — the install check: a program built against the installed loom with
 * `mpicc hello.c $(pkg-config --cflags --libs loom)` and run under mpirun. */
#include <stdio.h>

#include "loom.h"

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "hello: loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  const loom_group_t *world = loom_group(ctx, LOOM_GROUP_WORLD);
  int one = 1, sum = 0;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, loom_group_comm(world));
  printf("hello from rank %d of %d (loom %s): %d ranks answered\n", loom_rank(ctx), loom_size(ctx),
         loom_version(), sum);
  int ok = sum == loom_size(ctx);
  return loom_finalize(ctx) == LOOM_OK && ok ? 0 : 1;
}
