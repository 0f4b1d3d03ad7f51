/* groups.h — internal: find hosts and (emulated) nodes, build and free loom's communicators.
 * Used by init.c; the public accessors are in loom_core.h. */
#ifndef LOOM_GROUPS_H
#define LOOM_GROUPS_H

#include "ctx.h"
#include "loom_core.h"

loom_status_t loom_groups_find_nodes(loom_ctx_t *ctx); // sets host/local/node fields
loom_status_t loom_groups_build(loom_ctx_t *ctx);      // needs params, node, rank, size
void loom_groups_free(loom_ctx_t *ctx);
// Fill g around comm (taken over; MPI_COMM_NULL: this rank is not a member): rank, size and the
// world-rank map. comm/ builds sub-groups of a group with it (hierarchical schemes).
loom_status_t loom_group_from_comm(loom_ctx_t *ctx, struct loom_group *g, loom_group_kind_t kind,
                                   MPI_Comm comm, int node);

#endif
