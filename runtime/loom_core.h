/* loom_core.h — runtime API: status codes, configuration, init/finalize under mpirun, ranks,
 * topology and binding, process groups. Include loom.h rather than this file. */
#ifndef LOOM_CORE_H
#define LOOM_CORE_H

#include <mpi.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_API __attribute__((visibility("default")))

// ---------------------------------------------------------------------------------------------
// Status codes. Every fallible loom function returns one; loom_last_error() says what happened.

typedef enum loom_status {
  LOOM_OK = 0,
  LOOM_ERR_INVALID_ARG, // a bad argument, tunable or config value
  LOOM_ERR_MPI,         // an MPI call failed
  LOOM_ERR_CUDA,        // a CUDA runtime call failed
  LOOM_ERR_NCCL,        // a NCCL call failed
  LOOM_ERR_SYSTEM,      // an OS call failed (errno)
  LOOM_ERR_NOMEM,       // host or device allocation failed
  LOOM_ERR_TIMEOUT,     // an operation did not finish in time
  LOOM_ERR_REMOTE,      // another rank failed
  LOOM_ERR_CORRUPT,     // malformed data (payload, message or file)
  LOOM_ERR_UNSUPPORTED, // not available in this build or on this device
  LOOM_ERR_STATE,       // called in the wrong state (before init, twice, ...)
  LOOM_ERR_INTERNAL,    // a bug in loom: please report it
  LOOM_STATUS_COUNT
} loom_status_t;

typedef struct loom_ctx loom_ctx_t;

// Short description of a status code ("invalid argument").
LOOM_API const char *loom_strerror(loom_status_t status);
// The last error message recorded on this thread (every failing call records its message
// there, collectives included); when there is none, the last one recorded on ctx (ctx may be
// NULL, as after a failed loom_init). It names what failed and what to do. Empty string when
// there is none.
LOOM_API const char *loom_last_error(const loom_ctx_t *ctx);
// The library's version string; compare with LOOM_VERSION_STRING.
LOOM_API const char *loom_version(void);

// ---------------------------------------------------------------------------------------------
// Configuration. Each field mirrors one LOOM_* environment variable (see loom_info or README).
// Unset fields (NULL strings, LOOM_UNSET integers) take the default; an environment variable
// that is set overrides the field, so operators can retune a program at launch.

#define LOOM_UNSET (-1)

typedef struct loom_config {
  const char *debug;        // LOOM_DEBUG: WARN | INFO | TRACE
  const char *debug_subsys; // LOOM_DEBUG_SUBSYS: comma list, ALL, or ^LIST to exclude
  const char *debug_file;   // LOOM_DEBUG_FILE: path, %h host, %p pid
  const char *bind;         // LOOM_BIND: core | numa | none
  int blas_threads;         // LOOM_BLAS_THREADS: 0 = this rank's share of cores
  const char *gpu;          // LOOM_GPU: auto | none | device index
  int node_size;            // LOOM_NODE_SIZE: emulate nodes of K ranks (0 = real nodes)
  int ep_size;              // LOOM_EP_SIZE: expert-parallel group size
  const char *attn_servers; // LOOM_ATTN_SERVERS: 0 | inplace | N (last N ranks serve)
  int fusion_threshold;     // LOOM_FUSION_THRESHOLD: bytes per fusion bucket (0 = no fusion)
  const char *timeline;     // LOOM_TIMELINE: Chrome trace path per rank, %r = rank
  int sched_spin_us;        // LOOM_SCHED_SPIN_US: scheduler polls without sleeping this long
  int sched_progress_us;    // LOOM_SCHED_PROGRESS_US: progress thread interval, 0 = no thread
  const char *compress;     // LOOM_COMPRESS: none | auto | a compressor spec (loom_compress.h)
  const char *net_alpha_us; // LOOM_NET_ALPHA_US: link latency for the planner, "0" = measure
  const char *net_gbps;     // LOOM_NET_GBPS: link bandwidth for the planner, "0" = measure
  int compress_chunk;       // LOOM_COMPRESS_CHUNK: f32 bytes per pipelined chunk (0 = whole)
  const char *moe_overlap;  // LOOM_MOE_OVERLAP: none | coarse | fine
  int timeout;              // LOOM_TIMEOUT: seconds a collective may wait before the job aborts
  int check_consistency;    // LOOM_CHECK_CONSISTENCY: 1 = ranks compare collectives' arguments
  const char *nonfinite;    // LOOM_NONFINITE: abort | skip a step whose averaged gradient is not
                            // finite (read by training loops through loom_tunable)
  const char *plan_lane;    // LOOM_PLAN_LANE: auto | gpu | cpu: the lane that encodes compressed
                            // gradients on a GPU (read by the example trainers)
  const char *gemm;         // LOOM_GEMM: auto | blas | loom: the kernel of host GEMMs (see README)
  int pipe_bytes;           // LOOM_PIPE_BYTES: bytes per peer per pipelined chunk of an ordered
                            // (bitwise identical) float reduction
  int stall_warn;           // LOOM_STALL_WARN: seconds an operation waits before the lowest rank
                            // that arrived warns, naming those that did not (0 = never)
  const char *hier_allreduce; // LOOM_HIER_ALLREDUCE: auto | off: float allreduces over nodes of
                              // equal size go node, rail, node (see README)
} loom_config_t;

// The value of a tunable as resolved at loom_init (environment, config or default), by its
// environment name ("LOOM_COMPRESS"); NULL for an unknown name or a NULL ctx.
LOOM_API const char *loom_tunable(const loom_ctx_t *ctx, const char *env_name);

// Set every field to unset. Call before filling in the fields you want.
LOOM_API void loom_config_init(loom_config_t *cfg);

// ---------------------------------------------------------------------------------------------
// Init and finalize. loom_init initialises MPI (MPI_THREAD_MULTIPLE requested) unless the caller
// already did, reads the tunables, discovers the topology, binds this rank, and builds groups.
// On failure *ctx is NULL, every rank returns the same status, and loom_last_error(NULL) says
// why. cfg may be NULL. argc/argv may be NULL.

LOOM_API loom_status_t loom_init(int *argc, char ***argv, const loom_config_t *cfg,
                                 loom_ctx_t **ctx);
// Frees ctx and finalizes MPI if loom_init initialised it. Every rank must call it: MPI's
// finalize waits for the others, so a rank that stops alone after an error hangs the job there.
// With several contexts live (a later loom_init adopts the running MPI), MPI is finalized with
// the last of them. LOOM_ERR_STATE, freeing nothing, while a request is in flight: loom_wait
// it first (checked when ctx is the process's only live context: requests are counted per
// process, and another context's would count too).
// A caller that initialised MPI calls it before MPI_Finalize: after it, loom_finalize can only
// release ctx's host memory and returns LOOM_ERR_STATE saying so. ctx is invalid afterwards:
// finalizing it again is LOOM_ERR_STATE.
LOOM_API loom_status_t loom_finalize(loom_ctx_t *ctx);
// Ends every process of the job with exit code `code` (1..255; anything else is 1), after
// logging why (NULL: loom_last_error) with this rank: for an error one rank meets while its
// peers may be waiting for it in a collective. Does not return. ctx may be NULL.
LOOM_API void loom_abort(const loom_ctx_t *ctx, int code, const char *why)
    __attribute__((noreturn));

LOOM_API int loom_rank(const loom_ctx_t *ctx);             // rank in MPI_COMM_WORLD
LOOM_API int loom_size(const loom_ctx_t *ctx);             // ranks in MPI_COMM_WORLD
LOOM_API int loom_local_rank(const loom_ctx_t *ctx);       // rank within this (emulated) node
LOOM_API int loom_local_size(const loom_ctx_t *ctx);       // ranks on this (emulated) node
LOOM_API int loom_node(const loom_ctx_t *ctx);             // index of this (emulated) node
LOOM_API int loom_num_nodes(const loom_ctx_t *ctx);        // number of (emulated) nodes
LOOM_API int loom_mpi_thread_level(const loom_ctx_t *ctx); // MPI_THREAD_* granted
LOOM_API int loom_owns_mpi(const loom_ctx_t *ctx);         // 1 if loom_init called MPI_Init

// ---------------------------------------------------------------------------------------------
// Topology and placement.

typedef struct loom_topology {
  int sockets;    // packages on this host
  int numa_nodes; // NUMA nodes on this host
  int cores;      // physical cores this process may use (cgroup/affinity limits applied)
  int pus;        // hardware threads this process may use
  int gpus;       // CUDA devices visible (0 without the CUDA backend)
} loom_topology_t;

LOOM_API const loom_topology_t *loom_topology(const loom_ctx_t *ctx);
// Cores (by hwloc logical index) this rank is bound to: the lowest (first) and how many (count);
// they are [first, first + count) unless the job started within a non-contiguous set of cores
// (taskset -c 0,2: see README, Binding), and loom_describe_placement lists them. With
// LOOM_BIND=numa or none they are the NUMA node's or the whole host's. A NULL output is skipped;
// a NULL ctx gives 0 and 0.
LOOM_API void loom_bound_cores(const loom_ctx_t *ctx, int *first, int *count);
LOOM_API int loom_blas_threads(const loom_ctx_t *ctx); // BLAS threads set for this rank
LOOM_API int loom_gpu(const loom_ctx_t *ctx);          // CUDA device of this rank, -1 if none
// One line describing this rank's placement: host, node, cores, BLAS threads and core, GPU.
LOOM_API loom_status_t loom_describe_placement(const loom_ctx_t *ctx, char *buf, size_t len);

// ---------------------------------------------------------------------------------------------
// Process groups. Every rank holds a handle for every kind; a rank outside a group sees
// loom_group_rank() == -1 and size 0 (for example a dedicated attention server's DP group).

typedef enum loom_group_kind {
  LOOM_GROUP_WORLD = 0, // all ranks
  LOOM_GROUP_NODE,      // ranks on the same (emulated) node
  LOOM_GROUP_DP,        // data-parallel: all training ranks (dense gradients)
  LOOM_GROUP_EP,        // expert-parallel: LOOM_EP_SIZE consecutive training ranks
  LOOM_GROUP_EXPERT_DP, // ranks holding the same experts: same index in their EP group
  LOOM_GROUP_ATTN,      // attention servers (none, every trainer, or the last N ranks)
  LOOM_GROUP_COUNT
} loom_group_kind_t;

typedef enum loom_role {
  LOOM_ROLE_TRAINER = 1,     // runs the model
  LOOM_ROLE_ATTN_SERVER = 2, // serves core attention (both bits in inplace mode)
} loom_role_t;

typedef struct loom_group loom_group_t;

LOOM_API const loom_group_t *loom_group(const loom_ctx_t *ctx, loom_group_kind_t kind);
LOOM_API const char *loom_group_kind_name(loom_group_kind_t kind); // "world", "dp", ...
LOOM_API int loom_group_rank(const loom_group_t *g); // -1 when this rank is not a member
LOOM_API int loom_group_size(const loom_group_t *g); // 0 when this rank is not a member
// World rank of group rank i, or -1 when i is out of range.
LOOM_API int loom_group_world_rank(const loom_group_t *g, int i);
// The MPI communicator (MPI_COMM_NULL when not a member). Owned by loom: do not free it.
LOOM_API MPI_Comm loom_group_comm(const loom_group_t *g);
LOOM_API int loom_role(const loom_ctx_t *ctx); // bitwise OR of loom_role_t

// ---------------------------------------------------------------------------------------------
// Introspection (what the loom_info program prints).

// Print version, build features, topology, and every tunable with value, default and help
// (nothing when out is NULL).
LOOM_API void loom_print_info(const loom_ctx_t *ctx, FILE *out);
// Print the Markdown table of which rank is in which group for np = 1..max_np (1..64) under the
// LOOM_NODE_SIZE, LOOM_EP_SIZE and LOOM_ATTN_SERVERS of the environment. Needs no MPI.
LOOM_API loom_status_t loom_print_layout(FILE *out, int max_np);
// Print the tunables as the Markdown table that README.md carries (nothing when out is NULL).
LOOM_API void loom_print_tunables_markdown(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
