/* subgroups.c — what comm/ keeps in a group beside MPI's own state (g->hier): the node,
 * node-leader and rail sub-groups of the hierarchical schemes, made on first use, and buffers. */
#include "config.h"
#include "comm_internal.h"

#include <stdlib.h>

#include "ctx.h"
#include "error.h"
#include "groups.h"
#include "log.h"
#include "memory.h"

// Freed with the group (loom_groups_free calls hier_destroy before freeing g's communicator).
struct loom_group_extra {
  void *buf[LOOM_GROUP_BUFS];
  size_t cap[LOOM_GROUP_BUFS];
  int have_nodes; // node and leaders made
  struct loom_group node, leaders;
  int rails; // 0: not decided yet; 1: no rails (one node, or nodes of unequal sizes); 2: made
  struct loom_group rail;
};

static void free_group(struct loom_group *g) {
  if (g->hier && g->hier_destroy) {
    g->hier_destroy(g->hier);
  }
  g->hier = NULL;
  loom_group_watch_free(g);
  if (g->comm != MPI_COMM_NULL) {
    MPI_Comm_free(&g->comm);
  }
  if (g->nccl && g->nccl_destroy) { // the device form of the hierarchical scheme made one
    g->nccl_destroy(g->nccl);
  }
  g->nccl = NULL;
  free(g->world_ranks);
  g->world_ranks = NULL;
}

static void extra_destroy(void *p) {
  struct loom_group_extra *x = p;
  for (int i = 0; i < LOOM_GROUP_BUFS; i++) {
    loom_host_free(x->buf[i]);
  }
  if (x->have_nodes) {
    free_group(&x->node);
    free_group(&x->leaders);
  }
  if (x->rails == 2) {
    free_group(&x->rail);
  }
  free(x);
}

static struct loom_group_extra *get_extra(const loom_group_t *cg) {
  struct loom_group *g = (struct loom_group *)cg; // the cache lives in the group
  if (!g->hier) {
    g->hier = calloc(1, sizeof(struct loom_group_extra));
    g->hier_destroy = extra_destroy;
  }
  if (!g->hier) {
    loom_error(NULL, LOOM_ERR_NOMEM, "group %s: out of memory for its sub-groups",
               loom_group_kind_name(g->kind));
  }
  return g->hier;
}

void *loom_group_buffer(const loom_group_t *g, int i, size_t bytes) {
  struct loom_group_extra *x = get_extra(g);
  if (!x) {
    return NULL;
  }
  if (x->cap[i] < bytes) {
    loom_host_free(x->buf[i]);
    x->buf[i] = loom_host_alloc(bytes);
    x->cap[i] = x->buf[i] ? bytes : 0;
  }
  return x->buf[i];
}

// A sub-group of g over the members that pass color (MPI_UNDEFINED: not a member), ranked as in
// g, with g's tunables. Collective over g.
static loom_status_t split(const loom_group_t *g, int color, struct loom_group *out) {
  loom_status_t status = LOOM_OK;
  MPI_Comm c = MPI_COMM_NULL;
  *out = (struct loom_group){.comm = MPI_COMM_NULL};
  LOOM_CHECK_MPI(NULL, MPI_Comm_split(g->comm, color, g->rank, &c));
  LOOM_CHECK(loom_group_from_comm(NULL, out, g->kind, c, g->node));
  c = MPI_COMM_NULL;
  out->compress_chunk = g->compress_chunk;
  out->pipe_bytes = g->pipe_bytes;
  out->hier_allreduce = g->hier_allreduce;
  LOOM_CHECK(loom_group_watch_setup(out, g->timeout, g->stall_warn, g->check_consistency));
  return LOOM_OK;
fail:
  if (c != MPI_COMM_NULL) {
    MPI_Comm_free(&c);
  }
  free_group(out);
  *out = (struct loom_group){.comm = MPI_COMM_NULL};
  return status;
}

loom_status_t loom_group_nodes(const loom_group_t *g, const loom_group_t **node,
                               const loom_group_t **leaders) {
  loom_status_t status = LOOM_OK;
  struct loom_group_extra *x = get_extra(g);
  if (!x) {
    return LOOM_ERR_NOMEM;
  }
  if (!x->have_nodes) {
    LOOM_CHECK(split(g, g->node, &x->node));
    status = split(g, x->node.rank == 0 ? 0 : MPI_UNDEFINED, &x->leaders);
    if (status != LOOM_OK) {
      free_group(&x->node);
      goto fail;
    }
    x->have_nodes = 1;
  }
  *node = &x->node;
  *leaders = &x->leaders;
fail:
  return status;
}

loom_status_t loom_group_rails(const loom_group_t *g, struct loom_watch *w,
                               const loom_group_t **node, const loom_group_t **rail) {
  loom_status_t status = LOOM_OK;
  const loom_group_t *leaders = NULL;
  int *nodes = NULL;
  *node = *rail = NULL;
  struct loom_group_extra *x = get_extra(g);
  if (!x) {
    return LOOM_ERR_NOMEM;
  }
  if (x->rails == 0) {
    // Every member's node, in g's rank order (waited for under the caller's watchdog entry).
    nodes = malloc(sizeof(int) * (size_t)g->size);
    if (!nodes) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "hierarchical allreduce: out of memory");
    }
    MPI_Request req = MPI_REQUEST_NULL;
    LOOM_CHECK_MPI(NULL, MPI_Iallgather(&g->node, 1, MPI_INT, nodes, 1, MPI_INT, g->comm, &req));
    LOOM_CHECK_MPI(NULL, loom_watch_waitall(w, 1, &req));
    // Rails need two nodes or more, and the same number (two or more) of members on each.
    int distinct = 0, mine = 0, same = 1, first_count = -1;
    for (int i = 0; i < g->size; i++) {
      int seen = 0, count = 0;
      for (int j = 0; j < g->size; j++) {
        seen |= j < i && nodes[j] == nodes[i];
        count += nodes[j] == nodes[i];
      }
      distinct += !seen;
      first_count = first_count < 0 ? count : first_count;
      same &= count == first_count;
      mine += i < g->rank && nodes[i] == g->node; // my index within my node
    }
    x->rails = distinct >= 2 && same && first_count >= 2 ? 2 : 1;
    if (x->rails == 2) {
      LOOM_CHECK(loom_group_nodes(g, node, &leaders));
      status = split(g, mine, &x->rail);
      if (status != LOOM_OK) {
        x->rails = 0;
        goto fail;
      }
      LOOM_INFO(LOOM_SUB_COLL,
                "group %s: hierarchical allreduce over %d nodes of %d ranks (rail %d)",
                loom_group_kind_name(g->kind), distinct, first_count, mine);
    }
  }
  if (x->rails == 2) {
    LOOM_CHECK(loom_group_nodes(g, node, &leaders));
    *rail = &x->rail;
  }
fail:
  free(nodes);
  return status;
}
