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
// Set g's LOOM_TIMEOUT, LOOM_STALL_WARN and LOOM_CHECK_CONSISTENCY and, when the timeout is on,
// create the window through which the watchdog reads the members' progress (collective over g's
// members; done by loom_group_from_comm with a ctx; comm/ calls it for its sub-groups with the
// parent's values).
loom_status_t loom_group_watch_setup(struct loom_group *g, int timeout, int stall_warn,
                                     int check_consistency);
// Free the window (collective over g's members) or the local slot.
void loom_group_watch_free(struct loom_group *g);

#endif
