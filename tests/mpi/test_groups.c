/* test_groups.c — every group's size, membership and world-rank map, checked against the
 * rules (trainers, LOOM_EP_SIZE blocks, LOOM_NODE_SIZE nodes, attention servers) recomputed
 * here from the environment, and a collective on each communicator. */
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "loom.h"

static int env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v ? atoi(v) : def;
}

// Is world rank r in the same group of `kind` as world rank me? (-1: me not a member)
static int same_group(int kind, int me, int r, int size, int ep, int node_size, int servers,
                      int inplace) {
  int trainers = size - servers;
  int me_tr = me < trainers, r_tr = r < trainers;
  switch (kind) {
  case LOOM_GROUP_WORLD:
    return 1;
  case LOOM_GROUP_NODE:
    return node_size > 0 ? me / node_size == r / node_size : 1; // tests run on one host
  case LOOM_GROUP_DP:
    return me_tr ? r_tr : -1;
  case LOOM_GROUP_EP:
    return me_tr ? r_tr && me / ep == r / ep : -1;
  case LOOM_GROUP_EXPERT_DP:
    return me_tr ? r_tr && me % ep == r % ep : -1;
  case LOOM_GROUP_ATTN:
    if (inplace) {
      return 1;
    }
    return servers == 0 || me_tr ? -1 : !r_tr;
  }
  return -1;
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  int rank = loom_rank(ctx), size = loom_size(ctx);
  int ep = env_int("LOOM_EP_SIZE", 1), node_size = env_int("LOOM_NODE_SIZE", 0);
  const char *attn = getenv("LOOM_ATTN_SERVERS");
  int inplace = attn && !strcmp(attn, "inplace");
  int servers = attn && !inplace ? atoi(attn) : 0;

  if (node_size > 0) {
    CHECK(loom_node(ctx) == rank / node_size, "emulated node %d", loom_node(ctx));
    CHECK(loom_local_rank(ctx) == rank % node_size, "emulated local rank");
    CHECK(loom_num_nodes(ctx) == (size + node_size - 1) / node_size, "node count");
  }
  int role = loom_role(ctx);
  CHECK(((role & LOOM_ROLE_TRAINER) != 0) == (rank < size - servers), "trainer role");
  CHECK(((role & LOOM_ROLE_ATTN_SERVER) != 0) == (inplace || rank >= size - servers), "serve");

  for (int k = 0; k < LOOM_GROUP_COUNT; k++) {
    const loom_group_t *g = loom_group(ctx, (loom_group_kind_t)k);
    const char *name = loom_group_kind_name((loom_group_kind_t)k);
    int member = same_group(k, rank, rank, size, ep, node_size, servers, inplace);
    int want_size = 0, want_rank = -1;
    if (member > 0) {
      for (int r = 0; r < size; r++) {
        if (same_group(k, rank, r, size, ep, node_size, servers, inplace) == 1) {
          if (r == rank) {
            want_rank = want_size;
          }
          want_size++;
        }
      }
    }
    CHECK(loom_group_size(g) == want_size, "rank %d group %s size %d want %d", rank, name,
          loom_group_size(g), want_size);
    CHECK(loom_group_rank(g) == want_rank, "rank %d group %s rank %d want %d", rank, name,
          loom_group_rank(g), want_rank);
    CHECK((loom_group_comm(g) == MPI_COMM_NULL) == (member <= 0), "%s comm presence", name);
    if (member > 0) {
      int i = 0;
      for (int r = 0; r < size; r++) {
        if (same_group(k, rank, r, size, ep, node_size, servers, inplace) == 1) {
          CHECK(loom_group_world_rank(g, i) == r, "%s map[%d]=%d want %d", name, i,
                loom_group_world_rank(g, i), r);
          i++;
        }
      }
      CHECK(loom_group_world_rank(g, want_size) == -1, "%s map out of range", name);
      // The communicator works: the sum of members' world ranks.
      int sum = 0, want_sum = 0;
      MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, loom_group_comm(g));
      for (int j = 0; j < want_size; j++) {
        want_sum += loom_group_world_rank(g, j);
      }
      CHECK(sum == want_sum, "%s allreduce %d want %d", name, sum, want_sum);
    }
  }
  CHECK(loom_group(ctx, LOOM_GROUP_COUNT) == NULL, "out of range kind");
  CHECK(!strcmp(loom_group_kind_name(LOOM_GROUP_EXPERT_DP), "expert_dp"), "kind names");
  int rc = check_exit_all("test_groups");
  loom_finalize(ctx);
  return rc;
}
