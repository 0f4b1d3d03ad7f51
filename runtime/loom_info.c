/* loom_info.c — the loom_info program: version, build features, topology and tunables; under
 * mpirun it also prints every rank's placement and groups, once, in rank order. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom.h"

#define LINE_MAX_LEN 1024

static void usage(FILE *out) {
  fprintf(out,
          "usage: loom_info [--tunables-markdown] [--layout NP]\n"
          "  (no option)           init under mpirun; rank 0 prints version, features, topology\n"
          "                        and tunables, then every rank's placement and groups\n"
          "  --tunables-markdown   print the tunables table of the README and exit (no MPI)\n"
          "  --layout NP           print which rank is in which group for np 1..NP under the\n"
          "                        current LOOM_NODE_SIZE, LOOM_EP_SIZE, LOOM_ATTN_SERVERS\n"
          "  --help                this text\n");
}

// One line per rank: placement, then each group as rank/size.
static void describe_rank(loom_ctx_t *ctx, char *line, size_t len) {
  char where[512];
  loom_describe_placement(ctx, where, sizeof where);
  int role = loom_role(ctx);
  size_t o = (size_t)snprintf(line, len, "rank %d: %s role %s%s%s |", loom_rank(ctx), where,
                              (role & LOOM_ROLE_TRAINER) ? "train" : "",
                              role == (LOOM_ROLE_TRAINER | LOOM_ROLE_ATTN_SERVER) ? "+" : "",
                              (role & LOOM_ROLE_ATTN_SERVER) ? "serve" : "");
  for (int k = 1; k < LOOM_GROUP_COUNT && o < len; k++) {
    const loom_group_t *g = loom_group(ctx, (loom_group_kind_t)k);
    if (loom_group_rank(g) < 0) {
      o += (size_t)snprintf(line + o, len - o, " %s -", loom_group_kind_name((loom_group_kind_t)k));
    } else {
      o += (size_t)snprintf(line + o, len - o, " %s %d/%d",
                            loom_group_kind_name((loom_group_kind_t)k), loom_group_rank(g),
                            loom_group_size(g));
    }
  }
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--tunables-markdown")) {
      loom_print_tunables_markdown(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--layout")) {
      char *end = NULL;
      errno = 0;
      long np = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
      if (i + 2 < argc) {
        fprintf(stderr, "loom_info: unexpected '%s' after --layout %s\n", argv[i + 2], argv[i + 1]);
        return 2;
      }
      if (i + 1 >= argc || end == argv[i + 1] || *end || errno || np < 1 || np > INT_MAX) {
        fprintf(stderr, "loom_info: --layout wants a whole number of ranks >= 1, got '%s'\n",
                i + 1 < argc ? argv[i + 1] : "(nothing)");
        return 2;
      }
      return loom_print_layout(stdout, (int)np) == LOOM_OK ? 0 : 1;
    } else {
      fprintf(stderr, "loom_info: unknown option '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  loom_ctx_t *ctx = NULL;
  loom_status_t st = loom_init(&argc, &argv, NULL, &ctx);
  if (st != LOOM_OK) {
    fprintf(stderr, "loom_info: loom_init failed: %s: %s\n", loom_strerror(st),
            loom_last_error(NULL));
    return 1;
  }
  int rank = loom_rank(ctx), size = loom_size(ctx);
  char line[LINE_MAX_LEN] = "";
  describe_rank(ctx, line, sizeof line);
  char *all = rank == 0 ? malloc((size_t)size * LINE_MAX_LEN) : NULL;
  if (rank == 0 && !all) {
    fprintf(stderr, "loom_info: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Gather(line, LINE_MAX_LEN, MPI_CHAR, all, LINE_MAX_LEN, MPI_CHAR, 0,
             loom_group_comm(loom_group(ctx, LOOM_GROUP_WORLD)));
  if (rank == 0) {
    loom_print_info(ctx, stdout);
    printf("ranks:\n");
    for (int r = 0; r < size; r++) {
      all[(size_t)r * LINE_MAX_LEN + LINE_MAX_LEN - 1] = '\0';
      printf("  %s\n", all + (size_t)r * LINE_MAX_LEN);
    }
    fflush(stdout);
    free(all);
  }
  return loom_finalize(ctx) == LOOM_OK ? 0 : 1;
}
