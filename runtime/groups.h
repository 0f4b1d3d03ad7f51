/* groups.h — internal: find hosts and (emulated) nodes, build and free loom's communicators.
 * Used by init.c; the public accessors are in loom_core.h. */
#ifndef LOOM_GROUPS_H
#define LOOM_GROUPS_H

#include "loom_core.h"

loom_status_t loom_groups_find_nodes(loom_ctx_t *ctx); // sets host/local/node fields
loom_status_t loom_groups_build(loom_ctx_t *ctx);      // needs params, node, rank, size
void loom_groups_free(loom_ctx_t *ctx);

#endif
