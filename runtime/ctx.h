/* ctx.h — the runtime context behind loom_ctx_t: ranks, resolved tunables, topology and
 * placement, groups, and the last error. Internal: only runtime/ reads the fields directly. */
#ifndef LOOM_CTX_H
#define LOOM_CTX_H

#include <mpi.h>

#include "loom_core.h"
#include "params.h"
#include "topology.h"

#define LOOM_ERROR_MAX 1024

struct loom_group {
  loom_group_kind_t kind;
  MPI_Comm comm;    // MPI_COMM_NULL when this rank is not a member
  int rank;         // -1 when not a member
  int size;         // 0 when not a member
  int *world_ranks; // (size) world rank of each group rank
  void *nccl;       // the group's NCCL communicator, created by comm/ on first device use
  void (*nccl_destroy)(void *nccl);
  int node;   // this rank's (emulated) node
  void *hier; // node and node-leader sub-groups, created by comm/ on first hierarchical use
  void (*hier_destroy)(void *hier);
  int64_t compress_chunk; // LOOM_COMPRESS_CHUNK: f32 bytes per chunk of a compressed call
};

struct loom_ctx {
  int rank, size;             // MPI_COMM_WORLD
  int local_rank, local_size; // within the (emulated) node
  int node, num_nodes;        // (emulated) node index and count
  int host_rank, host_size;   // within the physical host (shared memory)
  int thread_level;           // MPI_THREAD_* granted
  int owns_mpi;               // loom_init called MPI_Init_thread
  char hostname[256];
  struct loom_params params;
  struct loom_topo topo;
  int bind_first, bind_count; // cores this rank is bound to
  int blas_threads;
  int gpu;  // -1 none
  int role; // loom_role_t bits
  struct loom_group groups[LOOM_GROUP_COUNT];
  char last_error[LOOM_ERROR_MAX];
};

#endif
