/* embed_min.c — the smallest program that embeds loom in an existing C training loop: each rank
 * fits y = 3x + 2 on its own points, and loom averages the gradients so all ranks keep one model.
 */
#include <stdio.h>
#include <string.h>

#include "loom.h"

// Every loom call returns a status; on failure loom_last_error says what happened and what to do.
// An error this rank alone meets ends the whole job (loom_abort): the other ranks may be waiting
// for this one in a collective, and returning would leave them there.
#define TRY(call)                                                                                  \
  do {                                                                                             \
    if ((call) != LOOM_OK) {                                                                       \
      fprintf(stderr, "embed_min: %s failed\n", #call);                                            \
      loom_abort(ctx, 1, NULL);                                                                    \
    }                                                                                              \
  } while (0)

int main(int argc, char **argv) {
  if (argc > 1) { // it takes no arguments: settings come from LOOM_* variables
    fprintf(argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
            "usage: mpirun -np N embed_min (no arguments; loom reads LOOM_* variables)\n");
    return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
  }
  loom_ctx_t *ctx = NULL;
  // Initialises MPI (or adopts yours), binds this rank to its cores, and builds the groups.
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "embed_min: loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  // The data-parallel group: every training rank. Its rank and size pick this rank's data.
  const loom_group_t *dp = loom_group(ctx, LOOM_GROUP_DP);
  int rank = loom_group_rank(dp), np = loom_group_size(dp);
  if (rank < 0) { // a dedicated attention server (LOOM_ATTN_SERVERS=N): it trains nothing
    return loom_finalize(ctx) == LOOM_OK ? 0 : 1;
  }

  // The existing model and loop use plain floats. loom only needs to see the buffer it reduces:
  // wrap it (no copy) as a 3-element tensor {dL/dw, dL/db, loss}.
  float w = 0.0f, b = 0.0f, lr = 0.1f, buf[3];
  int64_t three = 3;
  loom_tensor_t g;
  TRY(loom_tensor_wrap(&g, buf, LOOM_F32, LOOM_DEVICE_HOST, 1, &three, "grad"));

  for (int step = 0; step <= 100; step++) {
    // Each rank's 16 points: together the ranks cover x in [-1, 1) once, each a disjoint slice.
    buf[0] = buf[1] = buf[2] = 0.0f;
    for (int i = 0; i < 16; i++) {
      float x = -1.0f + 2.0f * (float)(rank * 16 + i) / (float)(16 * np);
      float err = w * x + b - (3.0f * x + 2.0f); // prediction minus target
      buf[0] += 2.0f * err * x / 16.0f;          // d(mean squared error)/dw
      buf[1] += 2.0f * err / 16.0f;              // d(mean squared error)/db
      buf[2] += err * err / 16.0f;               // mean squared error
    }
    // The one line that makes it data-parallel: in-place average over the DP group. Every rank
    // gets bitwise the same mean, so the replicas never drift apart.
    TRY(loom_allreduce(dp, &g, &g, LOOM_AVG));
    w -= lr * buf[0]; // plain SGD, unchanged from the single-process loop
    b -= lr * buf[1];
    if (rank == 0 && step % 20 == 0) {
      printf("step %3d  loss %.3e  w %.4f  b %.4f\n", step, buf[2], w, b);
    }
  }
  return loom_finalize(ctx) == LOOM_OK ? 0 : 1; // finalizes MPI if loom_init started it
}
