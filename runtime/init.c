/* init.c — loom_init and loom_finalize: MPI (owned or adopted), tunables, logging, topology,
 * binding, groups; every failure is agreed on by all ranks so none is left hanging. */
#include "config.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abort_hooks.h"
#include "blas_check.h"
#include "ctx.h"
#include "error.h"
#include "groups.h"
#include "layout.h"
#include "log.h"
#include "params.h"
#include "topology.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

// ---- collective agreement on failure ------------------------------------------------------------

// Every rank calls this with its local status. If any rank failed, all return the status of the
// lowest failing rank and carry its message, so that every rank reports the same cause.
static loom_status_t agree(loom_ctx_t *ctx, loom_status_t local) {
  int mine = local != LOOM_OK ? ctx->rank : INT_MAX, first = INT_MAX;
  if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS) {
    return local != LOOM_OK ? local : LOOM_ERR_MPI;
  }
  if (first == INT_MAX) {
    return LOOM_OK;
  }
  struct {
    int status;
    char msg[LOOM_ERROR_MAX];
  } report;
  report.status = (int)local;
  snprintf(report.msg, sizeof report.msg, "%s", loom_last_error(NULL));
  MPI_Bcast(&report, (int)sizeof report, MPI_BYTE, first, MPI_COMM_WORLD);
  report.msg[sizeof report.msg - 1] = '\0';
  if (ctx->rank == first) { // the checks record quietly: one line for the job, not one a rank
    LOOM_WARN(LOOM_SUB_INIT, "%s: %s", loom_strerror((loom_status_t)report.status), report.msg);
  } else {
    char msg[LOOM_ERROR_MAX];
    snprintf(msg, sizeof msg, "rank %d: %.990s", first, report.msg);
    snprintf(ctx->last_error, sizeof ctx->last_error, "%s", msg);
    // Record it for loom_last_error(NULL) without logging it again on every rank.
    loom_error_clear();
    loom_error_set_quiet(msg);
  }
  return (loom_status_t)report.status;
}

// Tunables every rank must share: they shape the groups (NODE_SIZE, EP_SIZE, ATTN_SERVERS),
// the sequence and sizes of messages (FUSION_THRESHOLD, COMPRESS and the planner's link figures,
// COMPRESS_CHUNK, PIPE_BYTES, MOE_OVERLAP, PLAN_LANE, CHECK_CONSISTENCY's extra allgather,
// TIMEOUT's window, HIER_ALLREDUCE's scheme), what a non-finite step does on every rank
// (NONFINITE), or the bits of every product (GEMM: a product must round the same on whichever rank
// computes it). A rank with another value would post other messages than its peers: MPI collectives
// with mismatched counts are undefined (memory corruption) and mismatched calls hang, so the values
// are compared here. STALL_WARN too: the lowest rank that arrived speaks for all, with its own
// setting. Logging, binding, BLAS threads, the GPU index, the timeline path and the scheduler's
// polling may differ per rank.
static const int uniform_ids[] = {
    LOOM_P_NODE_SIZE,     LOOM_P_EP_SIZE,      LOOM_P_ATTN_SERVERS,      LOOM_P_FUSION_THRESHOLD,
    LOOM_P_COMPRESS,      LOOM_P_NET_ALPHA_US, LOOM_P_NET_GBPS,          LOOM_P_COMPRESS_CHUNK,
    LOOM_P_MOE_OVERLAP,   LOOM_P_TIMEOUT,      LOOM_P_CHECK_CONSISTENCY, LOOM_P_NONFINITE,
    LOOM_P_PLAN_LANE,     LOOM_P_GEMM,         LOOM_P_PIPE_BYTES,        LOOM_P_STALL_WARN,
    LOOM_P_HIER_ALLREDUCE};
#define LOOM_UNIFORM_COUNT ((int)(sizeof uniform_ids / sizeof uniform_ids[0]))

// FNV-1a of a tunable's text (kept in one spelling by loom_params_resolve, so equal values hash
// alike: "INPLACE" and "inplace", "1e2" and "100").
static uint64_t text_hash(const char *t) {
  uint64_t h = 1469598103934665603ULL;
  for (; *t; t++) {
    h = (h ^ (uint64_t)(unsigned char)*t) * 1099511628211ULL;
  }
  return h;
}

static loom_status_t check_uniform(loom_ctx_t *ctx) {
  uint64_t h[LOOM_UNIFORM_COUNT], lo[LOOM_UNIFORM_COUNT], hi[LOOM_UNIFORM_COUNT];
  for (int i = 0; i < LOOM_UNIFORM_COUNT; i++) {
    h[i] = text_hash(ctx->params.text[uniform_ids[i]]);
  }
  MPI_Allreduce(h, lo, LOOM_UNIFORM_COUNT, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(h, hi, LOOM_UNIFORM_COUNT, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  int i = 0;
  while (i < LOOM_UNIFORM_COUNT && lo[i] == hi[i]) {
    i++;
  }
  if (i == LOOM_UNIFORM_COUNT) {
    return LOOM_OK;
  }
  // The first that differs (every rank found the same one): rank 0's text, the lowest rank
  // whose text differs from it, and that rank's text. No allocation: every rank reaches every
  // collective here.
  const int id = uniform_ids[i];
  char text0[LOOM_PARAM_TEXT_MAX], other_text[LOOM_PARAM_TEXT_MAX];
  memcpy(text0, ctx->params.text[id], sizeof text0);
  MPI_Bcast(text0, (int)sizeof text0, MPI_CHAR, 0, MPI_COMM_WORLD);
  text0[sizeof text0 - 1] = '\0';
  int mine = strcmp(text0, ctx->params.text[id]) ? ctx->rank : ctx->size, other = ctx->size;
  MPI_Allreduce(&mine, &other, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  other = other < ctx->size ? other : ctx->size - 1; // (always found: the hashes differ)
  memcpy(other_text, ctx->params.text[id], sizeof other_text);
  MPI_Bcast(other_text, (int)sizeof other_text, MPI_CHAR, other, MPI_COMM_WORLD);
  other_text[sizeof other_text - 1] = '\0';
  return loom_error(
      ctx, LOOM_ERR_INVALID_ARG,
      "%s differs between ranks (rank 0 has '%.64s', rank %d has '%.64s'): set it identically "
      "on every rank, e.g. mpirun -x %s",
      loom_param_table[id].env, text0, other, other_text, loom_param_table[id].env);
}

// ---- placement ----------------------------------------------------------------------------------

static loom_status_t place(loom_ctx_t *ctx) {
  loom_status_t status = LOOM_OK;
  struct loom_params *p = &ctx->params;
  LOOM_CHECK(loom_topo_bind(ctx, &ctx->topo, p->bind, ctx->host_rank, ctx->host_size,
                            &ctx->bind_first, &ctx->bind_count, ctx->bind_cores,
                            sizeof ctx->bind_cores));
  int share = ctx->bind_count;
  if (p->bind != LOOM_BIND_CORE) { // ranks sharing the NUMA node or host split it
    int sharers = p->bind == LOOM_BIND_NUMA
                      ? (ctx->host_size + ctx->topo.pub.numa_nodes - 1) / ctx->topo.pub.numa_nodes
                      : ctx->host_size;
    share = ctx->bind_count / (sharers > 0 ? sharers : 1);
  }
  ctx->blas_threads = loom_set_blas_threads(p->blas_threads > 0 ? p->blas_threads
                                            : share > 0         ? share
                                                                : 1);
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  if (p->blas_threads > 0 && ctx->host_rank == 0 &&
      (ctx->blas_threads != p->blas_threads || (share > 0 && p->blas_threads > share))) {
    // Threads beyond the rank's cores take turns on them (each GEMM then runs slower than on
    // fewer threads); a count the BLAS does not grant is what it runs with. Once per host.
    char cores[64] = "";
    if (share > 0) {
      snprintf(cores, sizeof cores, " on the %d core(s) each rank is bound to", share);
    }
    LOOM_WARN(LOOM_SUB_INIT, "LOOM_BLAS_THREADS=%d: the BLAS runs %d thread(s)%s%s",
              p->blas_threads, ctx->blas_threads, cores,
              share > 0 && ctx->blas_threads > share
                  ? "; more threads than cores slow every GEMM: use at most the rank's cores "
                    "(0 picks them)"
                  : "");
  }
#endif
  int gpus = ctx->topo.pub.gpus;
  ctx->gpu = -1;
  if (p->gpu >= 0) {
    if (gpus == 0) { // no index to offer
#ifdef LOOM_HAVE_CUDA
      const char *why = "no driver, no GPU, or CUDA_VISIBLE_DEVICES hides them";
#else
      const char *why = "loom was built without CUDA; reconfigure with --with-cuda for GPUs";
#endif
      status = loom_error(ctx, LOOM_ERR_INVALID_ARG,
                          "LOOM_GPU=%d but this process sees no CUDA device (%s): use auto or none",
                          p->gpu, why);
      goto fail;
    }
    if (p->gpu >= gpus) {
      status = loom_error(ctx, LOOM_ERR_INVALID_ARG,
                          "LOOM_GPU=%d but this process sees %d CUDA device(s): use auto, none or "
                          "an index below %d",
                          p->gpu, gpus, gpus);
      goto fail;
    }
    ctx->gpu = p->gpu;
  } else if (p->gpu == LOOM_GPU_AUTO && gpus > 0) {
    ctx->gpu = ctx->host_rank % gpus;
  }
#ifdef LOOM_HAVE_CUDA
  if (ctx->gpu >= 0) {
    LOOM_CHECK_CUDA(ctx, cudaSetDevice(ctx->gpu));
  }
#endif
fail:
  return status;
}

// ---- init and finalize --------------------------------------------------------------------------

static void log_settings(const struct loom_params *p) {
  for (int i = 0; i < LOOM_P_COUNT; i++) {
    if (p->source[i] != LOOM_SRC_DEFAULT) {
      LOOM_INFO(LOOM_SUB_ENV, "%s set by %s to %s", loom_param_table[i].env,
                p->source[i] == LOOM_SRC_ENV ? "environment" : "config", p->text[i]);
    }
  }
}

int loom_live_requests;
// Contexts of this process not yet finalized, and whether the one that initialised MPI was
// finalized while others were live (then the last one finalizes MPI).
static int live_contexts, mpi_finalize_owed;
// The same contexts, linked through next_live: loom_finalize refuses a pointer that is not one
// of them (finalized already) without reading it.
static loom_ctx_t *live_list;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

loom_status_t loom_init(int *argc, char ***argv, const loom_config_t *cfg, loom_ctx_t **out) {
  loom_status_t status = LOOM_OK;
  loom_ctx_t *ctx = NULL;
  loom_error_clear();
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_init: ctx must not be NULL");
  }
  *out = NULL;
  ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_init: cannot allocate the context");
  }
  for (int k = 0; k < LOOM_GROUP_COUNT; k++) {
    ctx->groups[k].comm = MPI_COMM_NULL;
  }
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) {
    free(ctx);
    return loom_error(NULL, LOOM_ERR_STATE,
                      "loom_init called after MPI_Finalize (the caller's, or loom_finalize's of "
                      "the last live context), and MPI cannot be initialised twice in a process: "
                      "keep a context live while loom is in use, or call MPI_Init_thread first "
                      "(loom_init adopts it, loom_finalize leaves it) and MPI_Finalize at exit");
  }
  if (initialized) {
    LOOM_CHECK_MPI(ctx, MPI_Query_thread(&ctx->thread_level));
  } else {
    LOOM_CHECK_MPI(ctx, MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &ctx->thread_level));
    ctx->owns_mpi = 1;
  }
  LOOM_CHECK_MPI(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank));
  LOOM_CHECK_MPI(ctx, MPI_Comm_size(MPI_COMM_WORLD, &ctx->size));
  loom_log_set_rank(ctx->rank);
  loom_error_quiet(1); // until the end: agree() logs a failure once, on the lowest failing rank
  if (gethostname(ctx->hostname, sizeof ctx->hostname) != 0) {
    snprintf(ctx->hostname, sizeof ctx->hostname, "unknown");
  }
  ctx->hostname[sizeof ctx->hostname - 1] = '\0';

  // Tunables and logging: a bad value on any rank fails every rank with the same message.
  status = loom_params_resolve(cfg, &ctx->params);
  if (status == LOOM_OK && loom_log_configure(ctx->params.debug_level, ctx->params.debug_mask,
                                              ctx->params.debug_file) != 0) {
    status = loom_error(ctx, LOOM_ERR_SYSTEM,
                        "LOOM_DEBUG_FILE=%s cannot be opened for writing (%s): use a writable path",
                        ctx->params.debug_file, strerror(errno));
  }
  LOOM_CHECK(agree(ctx, status));
  LOOM_CHECK(agree(ctx, check_uniform(ctx)));
  if (ctx->rank == 0) { // (rank 0's environment: one report, not one per rank)
    loom_params_warn_unknown_env();
    const struct loom_params *p = &ctx->params;
    if (p->source[LOOM_P_STALL_WARN] != LOOM_SRC_DEFAULT && p->stall_warn > 0 &&
        (p->timeout == 0 || p->stall_warn >= p->timeout)) {
      LOOM_WARN(LOOM_SUB_INIT,
                "LOOM_STALL_WARN=%d has no effect: %s; set LOOM_STALL_WARN below LOOM_TIMEOUT",
                p->stall_warn,
                p->timeout == 0 ? "LOOM_TIMEOUT=0 turns the watchdog off, warnings included"
                                : "LOOM_TIMEOUT aborts the job first");
    }
  }
  log_settings(&ctx->params);
  if (ctx->thread_level < MPI_THREAD_MULTIPLE) {
    LOOM_INFO(LOOM_SUB_INIT, "MPI granted thread level %d (MPI_THREAD_MULTIPLE is %d)",
              ctx->thread_level, MPI_THREAD_MULTIPLE);
  }

  // Layout: which rank is in which group.
  char why[512];
  struct loom_layout_in in = {ctx->size, ctx->params.ep_size, ctx->params.attn_servers};
  status = loom_layout_check(&in, why, sizeof why);
  if (status != LOOM_OK) {
    loom_error(ctx, status, "%s", why);
  }
  LOOM_CHECK(agree(ctx, status));

  // Topology, nodes, placement, groups.
  status = loom_topo_discover(ctx, &ctx->topo);
  if (status == LOOM_OK) {
    status = loom_groups_find_nodes(ctx);
  }
  if (status == LOOM_OK) {
    status = place(ctx);
  }
  LOOM_CHECK(agree(ctx, status));
  LOOM_CHECK(agree(ctx, loom_groups_build(ctx)));
  loom_gemm_resolve(ctx);
  loom_blas_check(ctx);

  char where[256];
  loom_describe_placement(ctx, where, sizeof where);
  LOOM_INFO(LOOM_SUB_INIT, "loom %s rank %d/%d: %s", loom_version(), ctx->rank, ctx->size, where);
  loom_error_clear();
  ctx->last_error[0] = '\0';
  loom_error_quiet(0);
  pthread_mutex_lock(&live_lock);
  ctx->next_live = live_list;
  live_list = ctx;
  pthread_mutex_unlock(&live_lock);
  __atomic_add_fetch(&live_contexts, 1, __ATOMIC_ACQ_REL);
  *out = ctx;
  return LOOM_OK;
fail:
  loom_error_quiet(0);
  loom_groups_free(ctx);
  loom_topo_destroy(&ctx->topo);
  if (__atomic_load_n(&live_contexts, __ATOMIC_ACQUIRE) == 0) { // (else the live ones log there)
    loom_log_set_rank(-1);
    loom_log_close(); // a LOOM_DEBUG_FILE opened above, with the failure's message in it
  }
  if (ctx->owns_mpi) {
    MPI_Finalize();
  }
  free(ctx);
  return status;
}

loom_status_t loom_finalize(loom_ctx_t *ctx) {
  if (!ctx) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_finalize: ctx is NULL");
  }
  pthread_mutex_lock(&live_lock);
  loom_ctx_t **link = &live_list;
  while (*link && *link != ctx) {
    link = &(*link)->next_live;
  }
  if (!*link) {
    pthread_mutex_unlock(&live_lock);
    return loom_error(NULL, LOOM_ERR_STATE,
                      "loom_finalize: ctx %p is not a live context: it was finalized already (or "
                      "did not come from loom_init). Finalize each context once, and use none "
                      "after",
                      (void *)ctx);
  }
  // Requests are counted per process: with other contexts live, theirs would count too, and a
  // correct program must never be refused, so the check holds for the only live context.
  const int in_flight = __atomic_load_n(&loom_live_requests, __ATOMIC_RELAXED);
  if (in_flight > 0 && __atomic_load_n(&live_contexts, __ATOMIC_ACQUIRE) == 1) {
    pthread_mutex_unlock(&live_lock);
    return loom_error(ctx, LOOM_ERR_STATE,
                      "loom_finalize: %d request(s) of this process are still in flight: "
                      "loom_wait each one (or loom_test it until done) first; nothing was freed",
                      in_flight);
  }
  *link = ctx->next_live;
  pthread_mutex_unlock(&live_lock);
  int mpi_down = 0;
  MPI_Finalized(&mpi_down);
  if (mpi_down) {
    // The caller finalized MPI first: loom's communicators and windows went with it, and
    // freeing one now aborts the process (Open MPI). Release what needs no MPI, then say so.
    loom_status_t status =
        loom_error(NULL, LOOM_ERR_STATE,
                   "loom_finalize called after MPI_Finalize: loom's communicators could not be "
                   "freed. Call loom_finalize before MPI_Finalize (for every context)");
    for (int k = 0; k < LOOM_GROUP_COUNT; k++) {
      struct loom_group *g = &ctx->groups[k];
      if (g->watch_win == MPI_WIN_NULL) { // else the window's memory, gone with MPI
        free(g->watch_slot);
      }
      free(g->world_ranks);
    }
    loom_topo_destroy(&ctx->topo);
    free(ctx);
    if (__atomic_sub_fetch(&live_contexts, 1, __ATOMIC_ACQ_REL) == 0) {
      loom_log_set_rank(-1);
      loom_log_close();
    }
    return status;
  }
  int owns = ctx->owns_mpi;
  loom_groups_free(ctx);
  loom_topo_destroy(&ctx->topo);
  free(ctx);
  const int others = __atomic_sub_fetch(&live_contexts, 1, __ATOMIC_ACQ_REL);
  if (others > 0) { // MPI stays for the contexts still live; the last one finalizes it
    if (owns) {
      __atomic_store_n(&mpi_finalize_owed, 1, __ATOMIC_RELEASE);
    }
    return LOOM_OK;
  }
  owns |= __atomic_exchange_n(&mpi_finalize_owed, 0, __ATOMIC_ACQ_REL);
  loom_log_set_rank(-1);
  loom_log_close();
  if (owns) {
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) {
      return loom_error(NULL, LOOM_ERR_MPI, "MPI_Finalize failed (code %d)", rc);
    }
  }
  return LOOM_OK;
}

void loom_abort(const loom_ctx_t *ctx, int code, const char *why) {
  int up = 0, down = 0, rank = ctx ? ctx->rank : -1;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  up = up && !down; // after MPI_Finalize there is no job to abort: this process exits
  if (up && rank < 0) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  const char *msg = why ? why : loom_last_error(NULL);
  fprintf(stderr, "loom: rank %d aborts the job: %s\n", rank, msg && msg[0] ? msg : "(no reason)");
  loom_abort_hooks_run(); // (this rank's timelines written out)
  fflush(NULL);
  code = code >= 1 && code <= 255 ? code : 1;
  if (up) {
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  exit(code);
}

// ---- accessors ----------------------------------------------------------------------------------

int loom_rank(const loom_ctx_t *ctx) {
  return ctx ? ctx->rank : -1;
}
int loom_size(const loom_ctx_t *ctx) {
  return ctx ? ctx->size : 0;
}
int loom_local_rank(const loom_ctx_t *ctx) {
  return ctx ? ctx->local_rank : -1;
}
int loom_local_size(const loom_ctx_t *ctx) {
  return ctx ? ctx->local_size : 0;
}
int loom_node(const loom_ctx_t *ctx) {
  return ctx ? ctx->node : -1;
}
int loom_num_nodes(const loom_ctx_t *ctx) {
  return ctx ? ctx->num_nodes : 0;
}
int loom_mpi_thread_level(const loom_ctx_t *ctx) {
  return ctx ? ctx->thread_level : -1;
}
int loom_owns_mpi(const loom_ctx_t *ctx) {
  return ctx ? ctx->owns_mpi : 0;
}
int loom_role(const loom_ctx_t *ctx) {
  return ctx ? ctx->role : 0;
}
const char *loom_tunable(const loom_ctx_t *ctx, const char *env_name) {
  for (int i = 0; ctx && env_name && i < LOOM_P_COUNT; i++) {
    if (strcmp(loom_param_table[i].env, env_name) == 0) {
      return ctx->params.text[i];
    }
  }
  return NULL;
}

int loom_blas_threads(const loom_ctx_t *ctx) {
  return ctx ? ctx->blas_threads : 0;
}
int loom_gpu(const loom_ctx_t *ctx) {
  return ctx ? ctx->gpu : -1;
}

const loom_topology_t *loom_topology(const loom_ctx_t *ctx) {
  return ctx ? &ctx->topo.pub : NULL;
}

void loom_bound_cores(const loom_ctx_t *ctx, int *first, int *count) {
  if (first) {
    *first = ctx ? ctx->bind_first : 0;
  }
  if (count) {
    *count = ctx ? ctx->bind_count : 0;
  }
}

loom_status_t loom_describe_placement(const loom_ctx_t *ctx, char *buf, size_t len) {
  if (!ctx || !buf || len == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_describe_placement: %s: pass the context and a buffer of len > 0 bytes",
                      !ctx   ? "ctx is NULL"
                      : !buf ? "buf is NULL"
                             : "len is 0");
  }
  static const char *const modes[] = {"core", "numa", "none"};
  char gpu[16] = "none";
  if (ctx->gpu >= 0) {
    snprintf(gpu, sizeof gpu, "%d", ctx->gpu);
  }
  snprintf(buf, len,
           "host %s node %d/%d local %d/%d bind=%s cores %s blas_threads %d blas_core %s gpu %s",
           ctx->hostname, ctx->node, ctx->num_nodes, ctx->local_rank, ctx->local_size,
           modes[ctx->params.bind], ctx->bind_cores, ctx->blas_threads, loom_blas_core(), gpu);
  return LOOM_OK;
}
