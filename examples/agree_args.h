/* agree_args.h — the check, right after MPI starts, that every rank was given rank 0's command
 * line: shared by the example trainers (ex_agree_start) and the MPI benchmarks (tests/bench). */
#ifndef LOOM_EXAMPLES_AGREE_ARGS_H
#define LOOM_EXAMPLES_AGREE_ARGS_H

// Collective over MPI_COMM_WORLD: call it on every rank once MPI is initialised. 0 when every
// rank's argv[1..argc) is rank 0's; else 2, after the lowest rank that differs printed "PROG:
// rank N was started with other arguments than rank 0: argument K is 'X' here and 'Y' on rank
// 0. Every rank must run the same command line (WHY)" (K counts from 1, 'X' or 'Y' is '(none)'
// where one list is shorter). Every rank gets the same answer, so that all can stop together:
// ranks whose arguments differ would post collectives of other sizes (undefined in MPI: corrupt
// memory) or wait for each other until LOOM_TIMEOUT.
int ex_agree_args(const char *prog, const char *why, int argc, char **argv);

#endif
