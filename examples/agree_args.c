/* agree_args.c — every rank compares its command line with rank 0's, and the lowest rank that
 * differs names the first argument that does (see agree_args.h). */
#include "agree_args.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// argv[1..argc) joined by NULs into a new buffer of *len bytes (NULL when out of memory).
static char *join_args(int argc, char **argv, int *len) {
  size_t n = 0;
  for (int i = 1; i < argc; i++) {
    n += strlen(argv[i]) + 1;
  }
  char *buf = malloc(n + 1), *p = buf;
  for (int i = 1; buf && i < argc; i++) {
    size_t k = strlen(argv[i]) + 1;
    memcpy(p, argv[i], k);
    p += k;
  }
  *len = n > INT_MAX ? INT_MAX : (int)n;
  return buf;
}

int ex_agree_args(const char *prog, const char *why, int argc, char **argv) {
  int rank = 0, first = INT_MAX;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Rank 0's command line to every rank; each compares its own with it.
  int len = 0, len0 = 0;
  char *mine_args = join_args(argc, argv, &len);
  len0 = len;
  MPI_Bcast(&len0, 1, MPI_INT, 0, MPI_COMM_WORLD);
  char *args0 = rank == 0 ? mine_args : malloc((size_t)len0 + 1);
  int ok = mine_args && args0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    if (!ok) {
      fprintf(stderr, "%s: rank %d: out of memory comparing the ranks' command lines\n", prog,
              rank);
    }
    if (args0 != mine_args) {
      free(args0);
    }
    free(mine_args);
    return 2;
  }
  MPI_Bcast(args0, len0, MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = len == len0 && memcmp(mine_args, args0, (size_t)len) == 0;
  int mine = same ? INT_MAX : rank;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!same && rank == first) { // the first argument that differs, or the one missing
    const char *a = mine_args, *b = args0, *end_a = mine_args + len, *end_b = args0 + len0;
    int k = 1;
    while (a < end_a && b < end_b && !strcmp(a, b)) {
      a += strlen(a) + 1;
      b += strlen(b) + 1;
      k++;
    }
    fprintf(stderr,
            "%s: rank %d was started with other arguments than rank 0: argument %d is '%.200s' "
            "here and '%.200s' on rank 0. Every rank must run the same command line (%s)\n",
            prog, rank, k, a < end_a ? a : "(none)", b < end_b ? b : "(none)", why);
  }
  if (args0 != mine_args) {
    free(args0);
  }
  free(mine_args);
  return first == INT_MAX ? 0 : 2;
}
