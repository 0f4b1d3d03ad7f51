/* ctx.h — the runtime context behind loom_ctx_t: ranks, resolved tunables, topology and
 * placement, groups, and the last error. Internal: only runtime/ reads the fields directly. */
#ifndef LOOM_CTX_H
#define LOOM_CTX_H

#include <mpi.h>
#include <stdint.h>

#include "loom_core.h"
#include "params.h"
#include "topology.h"

#define LOOM_ERROR_MAX 1024

// What one rank shows its group about its progress, in the group's watchdog window (LOOM_TIMEOUT):
// when an operation times out, the waiting rank reads every member's slot to name the ranks that
// did not arrive (comm/watchdog.c).
#define LOOM_WATCH_OP_MAX   24
#define LOOM_WATCH_NAME_MAX 48
struct loom_watch_slot {
  uint64_t seq;                   // operations this rank entered on the group
  uint64_t claim;                 // group rank 0's slot: set by the rank that reports a timeout
  char op[LOOM_WATCH_OP_MAX];     // the last one entered: operation
  char name[LOOM_WATCH_NAME_MAX]; // and tensor name (truncated)
  // The last collective call this rank refused before entering it (its own arguments, or
  // memory): the number it would have had (0: none), its status, operation and tensor name.
  uint64_t refused_seq;
  int32_t refused_status;
  int32_t refused_pad;
  char refused_op[LOOM_WATCH_OP_MAX];
  char refused_name[LOOM_WATCH_NAME_MAX];
};

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
  int64_t pipe_bytes;     // LOOM_PIPE_BYTES: bytes per peer per ordered-reduction chunk
  int hier_allreduce;     // LOOM_HIER_ALLREDUCE: 0 auto, 1 off
  int timeout;            // LOOM_TIMEOUT: seconds an operation may wait (0: forever)
  int stall_warn;         // LOOM_STALL_WARN: seconds before a stall warning (0: none)
  int check_consistency;  // LOOM_CHECK_CONSISTENCY
  MPI_Win watch_win;      // exposes every member's slot to the group (MPI_WIN_NULL: none)
  struct loom_watch_slot *watch_slot; // this rank's slot: in watch_win, or malloc'd; NULL: off
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
  int bind_first, bind_count; // cores this rank is bound to: the lowest, how many
  char bind_cores[64];        // and which, as text ("0-3", "1,3")
  int blas_threads;
  int gpu;  // -1 none
  int role; // loom_role_t bits
  struct loom_group groups[LOOM_GROUP_COUNT];
  char last_error[LOOM_ERROR_MAX];
  struct loom_ctx *next_live; // init.c's list of the process's live contexts
};

// The scheduler's spin window in microseconds as it applies on this rank: LOOM_SCHED_SPIN_US,
// except 0 when it was left at its default on a host with more ranks than cores (a rank that
// spins would take the core from the rank it shares it with). 1 in *forced when that applied.
int loom_sched_spin_us_effective(const loom_ctx_t *ctx, int *forced);

// Requests of this process not yet freed (comm/request.c counts them, atomically): loom_finalize
// of the only live context refuses while any is in flight, since it would free their
// communicators and MPI under them.
extern int loom_live_requests;

#endif
