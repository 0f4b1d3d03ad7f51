/* layout.h — which rank belongs to which group: a pure function of world size, (emulated) node
 * sizes, LOOM_EP_SIZE and LOOM_ATTN_SERVERS, shared by loom_init, loom_info and the tests. */
#ifndef LOOM_LAYOUT_H
#define LOOM_LAYOUT_H

#include <stddef.h>
#include <stdio.h>

#include "loom_core.h"

struct loom_layout_in {
  int world_size;   // ranks in MPI_COMM_WORLD
  int ep_size;      // LOOM_EP_SIZE (>= 1)
  int attn_servers; // 0, LOOM_ATTN_INPLACE (-1) or N dedicated servers (the last N ranks)
};

// Colors for MPI_Comm_split: ranks with equal color share a group; -1 means not a member.
// The node color is not computed here (it comes from the node discovery).
struct loom_layout_rank {
  int color[LOOM_GROUP_COUNT];
  int role; // bitwise OR of loom_role_t
};

// Check the inputs against the world size; on error write an actionable message into err.
loom_status_t loom_layout_check(const struct loom_layout_in *in, char *err, size_t errlen);
// Colors and role of one rank (inputs must have passed loom_layout_check).
void loom_layout_rank(const struct loom_layout_in *in, int rank, struct loom_layout_rank *out);
// Number of training ranks (world minus dedicated attention servers).
int loom_layout_trainers(const struct loom_layout_in *in);

// Print the Markdown table of group membership for np = 1..max_np under the given settings
// (node_size 0 = one real node). Used by `loom_info --layout` and the README.
void loom_layout_print_table(FILE *out, int max_np, int node_size, int ep_size, int attn_servers);

#endif
