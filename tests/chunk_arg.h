/* chunk_arg.h — the `--chunk N` option the MPI tests share: every MPI transfer of the library in
 * pieces of at most N elements (loom_mpi_set_chunk, the test hook of comm_internal.h). */
#ifndef LOOM_TESTS_CHUNK_ARG_H
#define LOOM_TESTS_CHUNK_ARG_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "comm_internal.h" // loom_mpi_set_chunk (the library's test hook)
#include "testutil.h"      // test_int64_arg

// The command line of an MPI test that takes only [--chunk N] (argv as loom_init left it). With
// the option, sets the limit (call it on every rank, before any transfer: whether a gather or an
// all-to-all fits one MPI call must be decided alike everywhere) and says so on world rank 0.
// *chunk is N, or 0 without the option. 0, or -1 after printing why and the usage: the caller
// finalizes and exits with 2.
static inline int test_chunk_option(const char *prog, int argc, char **argv, int rank,
                                    int64_t *chunk) {
  *chunk = 0;
  if (argc == 1) {
    return 0;
  }
  if (argc != 3 || strcmp(argv[1], "--chunk") != 0) {
    fprintf(stderr, "usage: %s [--chunk N]\n", prog);
    return -1;
  }
  if (test_int64_arg(prog, "--chunk", argv[2], chunk) != 0 || *chunk < 1 ||
      *chunk > LOOM_MPI_CHUNK) {
    fprintf(stderr, "%s: --chunk %s: expected a whole number in 1..%lld\n", prog, argv[2],
            (long long)LOOM_MPI_CHUNK);
    return -1;
  }
  loom_mpi_set_chunk(*chunk);
  CHECK(loom_mpi_chunk() == *chunk, "loom_mpi_set_chunk(%lld) left the limit at %lld",
        (long long)*chunk, (long long)loom_mpi_chunk());
  if (rank == 0) {
    printf("%s: MPI transfers in pieces of at most %lld elements\n", prog, (long long)*chunk);
  }
  return 0;
}

#endif
