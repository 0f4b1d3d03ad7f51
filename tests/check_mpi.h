/* check_mpi.h — the exit status of an MPI test: every rank learns whether any rank failed, so
 * mpirun reports a failure wherever it happened. Call before MPI is finalized. */
#ifndef LOOM_TESTS_CHECK_MPI_H
#define LOOM_TESTS_CHECK_MPI_H

#include <mpi.h>

#include "check.h"

// The status this rank should exit with: 1 when any rank of MPI_COMM_WORLD had a failed CHECK.
static inline int check_exit_all(const char *name) {
  int any = 0;
  MPI_Allreduce(&check_failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && !check_failures) {
    fprintf(stderr, "%s: another rank failed\n", name);
    return 1;
  }
  return check_exit(name);
}

#endif
