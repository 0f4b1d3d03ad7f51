/* groups.c — find hosts and (emulated) nodes, then split MPI_COMM_WORLD into loom's groups
 * (world, node, dp, ep, expert_dp, attn) with the colors from layout.c; group accessors. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "error.h"
#include "groups.h"
#include "topology.h"
#include "layout.h"
#include "log.h"

static const char *const group_names[LOOM_GROUP_COUNT] = {"world", "node",      "dp",
                                                          "ep",    "expert_dp", "attn"};

const char *loom_group_kind_name(loom_group_kind_t kind) {
  return (int)kind >= 0 && kind < LOOM_GROUP_COUNT ? group_names[kind] : "invalid";
}

// ---- hosts and nodes ----------------------------------------------------------------------------

loom_status_t loom_groups_find_nodes(loom_ctx_t *ctx) {
  loom_status_t status = LOOM_OK;
  MPI_Comm host = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  LOOM_CHECK_MPI(ctx, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx->rank,
                                          MPI_INFO_NULL, &host));
  LOOM_CHECK_MPI(ctx, MPI_Comm_rank(host, &ctx->host_rank));
  LOOM_CHECK_MPI(ctx, MPI_Comm_size(host, &ctx->host_size));
  LOOM_CHECK(loom_topo_launch_cores(ctx, &ctx->topo, host));
  int k = ctx->params.node_size;
  if (k > 0) { // emulated nodes of k consecutive world ranks
    ctx->node = ctx->rank / k;
    ctx->num_nodes = (ctx->size + k - 1) / k;
    ctx->local_rank = ctx->rank % k;
    ctx->local_size = ctx->node == ctx->num_nodes - 1 ? ctx->size - ctx->node * k : k;
  } else { // real hosts, numbered by their lowest world rank
    int is_leader = ctx->host_rank == 0;
    LOOM_CHECK_MPI(
        ctx, MPI_Comm_split(MPI_COMM_WORLD, is_leader ? 0 : MPI_UNDEFINED, ctx->rank, &leaders));
    int ids[2] = {0, 0}; // node index, node count
    if (is_leader) {
      LOOM_CHECK_MPI(ctx, MPI_Comm_rank(leaders, &ids[0]));
      LOOM_CHECK_MPI(ctx, MPI_Comm_size(leaders, &ids[1]));
    }
    LOOM_CHECK_MPI(ctx, MPI_Bcast(ids, 2, MPI_INT, 0, host));
    ctx->node = ids[0];
    ctx->num_nodes = ids[1];
    ctx->local_rank = ctx->host_rank;
    ctx->local_size = ctx->host_size;
  }
fail:
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_free(&leaders);
  }
  if (host != MPI_COMM_NULL) {
    MPI_Comm_free(&host);
  }
  return status;
}

// ---- communicators ------------------------------------------------------------------------------

loom_status_t loom_group_from_comm(loom_ctx_t *ctx, struct loom_group *g, loom_group_kind_t kind,
                                   MPI_Comm comm, int node) {
  loom_status_t status = LOOM_OK;
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  int *seq = NULL;
  g->kind = kind;
  g->comm = comm;
  g->rank = -1;
  g->size = 0;
  g->world_ranks = NULL;
  g->nccl = NULL;
  g->nccl_destroy = NULL;
  g->node = node;
  g->hier = NULL;
  g->hier_destroy = NULL;
  // Sub-groups made by comm/ (ctx NULL) take their parent's value afterwards.
  g->compress_chunk = ctx ? ctx->params.compress_chunk : 0;
  g->pipe_bytes = ctx ? ctx->params.pipe_bytes : 0;
  g->hier_allreduce = ctx ? ctx->params.hier_allreduce : 0;
  g->timeout = 0;
  g->stall_warn = 0;
  g->check_consistency = 0;
  g->watch_win = MPI_WIN_NULL;
  g->watch_slot = NULL;
  if (g->comm == MPI_COMM_NULL) {
    return LOOM_OK;
  }
  // Errors come back to loom, which names them (a receive shorter than its message is a
  // LOOM_ERR_MPI that says so, not an abort of the job); communicators made from this one
  // (sub-groups, the private ones of collectives, MoE and attention) inherit the handler.
  LOOM_CHECK_MPI(ctx, MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN));
  LOOM_CHECK_MPI(ctx, MPI_Comm_rank(g->comm, &g->rank));
  LOOM_CHECK_MPI(ctx, MPI_Comm_size(g->comm, &g->size));
  g->world_ranks = malloc(sizeof(int) * (size_t)g->size);
  seq = malloc(sizeof(int) * (size_t)g->size);
  if (!g->world_ranks || !seq) {
    status = loom_error(ctx, LOOM_ERR_NOMEM, "cannot allocate the rank map of group %s",
                        group_names[kind]);
    goto fail;
  }
  for (int i = 0; i < g->size; i++) {
    seq[i] = i;
  }
  LOOM_CHECK_MPI(ctx, MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  LOOM_CHECK_MPI(ctx, MPI_Comm_group(g->comm, &group));
  LOOM_CHECK_MPI(ctx, MPI_Group_translate_ranks(group, g->size, seq, world_group, g->world_ranks));
  if (ctx) {
    LOOM_CHECK(loom_group_watch_setup(g, ctx->params.timeout, ctx->params.stall_warn,
                                      ctx->params.check_consistency));
  }
fail:
  free(seq);
  if (group != MPI_GROUP_NULL) {
    MPI_Group_free(&group);
  }
  if (world_group != MPI_GROUP_NULL) {
    MPI_Group_free(&world_group);
  }
  return status;
}

static loom_status_t build_group(loom_ctx_t *ctx, struct loom_group *g, loom_group_kind_t kind,
                                 int color) {
  loom_status_t status = LOOM_OK;
  MPI_Comm comm = MPI_COMM_NULL;
  if (kind == LOOM_GROUP_WORLD) {
    LOOM_CHECK_MPI(ctx, MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  } else {
    LOOM_CHECK_MPI(
        ctx, MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, ctx->rank, &comm));
  }
  return loom_group_from_comm(ctx, g, kind, comm, ctx->node);
fail:
  g->comm = MPI_COMM_NULL;
  g->world_ranks = NULL;
  g->nccl = NULL;
  g->hier = NULL;
  g->watch_win = MPI_WIN_NULL;
  g->watch_slot = NULL;
  return status;
}

// ---- the watchdog's window ---------------------------------------------------------------------

loom_status_t loom_group_watch_setup(struct loom_group *g, int timeout, int stall_warn,
                                     int check_consistency) {
  g->timeout = timeout;
  g->stall_warn = stall_warn;
  g->check_consistency = check_consistency;
  if (g->comm == MPI_COMM_NULL || timeout <= 0 || g->watch_slot) {
    return LOOM_OK;
  }
  // A failure to create the window (an MPI without one-sided support for this communicator)
  // costs only the names of the missing ranks in a timeout message: the errors are returned.
  MPI_Errhandler saved = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(g->comm, &saved);
  MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "same_size", "true");
  MPI_Info_set(info, "accumulate_ordering", "none");
  void *base = NULL;
  MPI_Win win = MPI_WIN_NULL;
  int ok = MPI_Win_allocate((MPI_Aint)sizeof(struct loom_watch_slot), 1, info, g->comm, &base,
                            &win) == MPI_SUCCESS &&
           base != NULL;
  MPI_Info_free(&info);
  if (ok) {
    memset(base, 0, sizeof(struct loom_watch_slot));
    MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN);
  }
  int all = 0;
  int rc = MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, g->comm);
  MPI_Comm_set_errhandler(g->comm, saved);
  if (saved != MPI_ERRHANDLER_NULL) {
    MPI_Errhandler_free(&saved);
  }
  if (rc == MPI_SUCCESS && all) {
    g->watch_win = win;
    g->watch_slot = base;
    return LOOM_OK;
  }
  // Not on every member: keep what was made (freeing a window is collective over all of them),
  // count locally, and say so once (Open MPI 4 has no one-sided component for
  // MPI_THREAD_MULTIPLE between hosts without an RDMA network).
  static int warned;
  if (!warned && g->rank == 0) {
    LOOM_WARN(LOOM_SUB_COLL,
              "group %s: no MPI window for the watchdog (MPI one-sided communication is not "
              "available here): a LOOM_TIMEOUT message will name the operation but not the ranks "
              "that did not arrive",
              loom_group_kind_name(g->kind));
  }
  warned = 1;
  g->watch_slot = calloc(1, sizeof *g->watch_slot);
  if (!g->watch_slot) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "cannot allocate the watchdog slot of group %s",
                      loom_group_kind_name(g->kind));
  }
  return LOOM_OK;
}

void loom_group_watch_free(struct loom_group *g) {
  if (!g->watch_slot) { // never set up (or a zeroed group)
    return;
  }
  if (g->watch_win != MPI_WIN_NULL) {
    MPI_Win_free(&g->watch_win); // frees watch_slot with it
  } else {
    free(g->watch_slot);
  }
  g->watch_win = MPI_WIN_NULL;
  g->watch_slot = NULL;
}

loom_status_t loom_groups_build(loom_ctx_t *ctx) {
  loom_status_t status = LOOM_OK;
  struct loom_layout_in in = {ctx->size, ctx->params.ep_size, ctx->params.attn_servers};
  struct loom_layout_rank me;
  loom_layout_rank(&in, ctx->rank, &me);
  me.color[LOOM_GROUP_NODE] = ctx->node;
  ctx->role = me.role;
  for (int k = 0; k < LOOM_GROUP_COUNT; k++) {
    LOOM_CHECK(build_group(ctx, &ctx->groups[k], (loom_group_kind_t)k, me.color[k]));
    LOOM_TRACE(LOOM_SUB_INIT, "group %s: rank %d of %d", group_names[k], ctx->groups[k].rank,
               ctx->groups[k].size);
  }
fail:
  return status;
}

void loom_groups_free(loom_ctx_t *ctx) {
  for (int k = 0; k < LOOM_GROUP_COUNT; k++) {
    struct loom_group *g = &ctx->groups[k];
    if (g->hier && g->hier_destroy) { // sub-communicators of g: freed before g's own
      g->hier_destroy(g->hier);
    }
    g->hier = NULL;
    loom_group_watch_free(g);
    if (g->comm != MPI_COMM_NULL && g->comm != 0) {
      MPI_Comm_free(&g->comm);
    }
    if (g->nccl && g->nccl_destroy) {
      g->nccl_destroy(g->nccl);
    }
    g->nccl = NULL;
    free(g->world_ranks);
    g->world_ranks = NULL;
  }
}

// ---- accessors ----------------------------------------------------------------------------------

const loom_group_t *loom_group(const loom_ctx_t *ctx, loom_group_kind_t kind) {
  if (!ctx || (int)kind < 0 || kind >= LOOM_GROUP_COUNT) {
    return NULL;
  }
  return &ctx->groups[kind];
}

int loom_group_rank(const loom_group_t *g) {
  return g ? g->rank : -1;
}

int loom_group_size(const loom_group_t *g) {
  return g ? g->size : 0;
}

int loom_group_world_rank(const loom_group_t *g, int i) {
  return g && i >= 0 && i < g->size ? g->world_ranks[i] : -1;
}

MPI_Comm loom_group_comm(const loom_group_t *g) {
  return g ? g->comm : MPI_COMM_NULL;
}
