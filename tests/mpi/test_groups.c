/* test_groups.c — every group's size, membership and world-rank map, checked against the
 * rules (trainers, LOOM_EP_SIZE blocks, LOOM_NODE_SIZE nodes, attention servers) recomputed
 * here from the environment, and collectives (MPI's and loom's) on each communicator. */
#include <stdlib.h>
#include <string.h>

#include "../check_mpi.h"
#include "../chunk_arg.h"
#include "../testutil.h"
#include "loom.h"

// With --chunk N every MPI transfer of loom goes in pieces of at most N elements
// (loom_mpi_set_chunk, the library's test hook): with N = 3 every message of loom's collectives
// on the sub-groups below (float allreduce, allgatherv, all-to-all(v), broadcast) splits into
// pieces with a short last one, and gathers and equal all-to-alls go point to point.

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

// Element k of what group rank i contributes: exact in f32, different for every rank and
// element, and naming the receiver j where it matters (all-to-all blocks).
static float gval(const loom_group_t *g, int i, int j, int64_t k) {
  return (float)(loom_group_world_rank(g, i) * 10000 + j * 100 + k);
}

// Elements group rank i sends group rank j in the alltoallv (zeros included, 0..7).
static int64_t pair_count(int i, int j) {
  return (3 * i + 2 * j + 1) % 8;
}

// Elements of dst[0..n) that are not want(k); NaN-filled outputs count as wrong.
#define COUNT_BAD(bad, dst, n, want)                                                               \
  for (int64_t k = 0; k < (n); k++) {                                                              \
    (bad) += (dst)[k] != (want);                                                                   \
  }

// loom's collectives on group g (this rank a member), each result checked against the values
// computed here from the group's world-rank map.
static void loom_collectives(const loom_group_t *g, const char *name) {
  const int n = loom_group_size(g), me = loom_group_rank(g);
  int64_t count = 7 * (int64_t)n + 5; // ordered reduction blocks of 8 to 10 elements (>= 10)
  loom_tensor_t a = test_tensor_f32(1, &count, "a"), b = test_tensor_f32(1, &count, "b");
  float *x = test_floats(&a), *y = test_floats(&b);
  int bad = 0;
  for (int64_t k = 0; k < count; k++) {
    x[k] = gval(g, me, 0, k);
  }
  test_fill_value(y, count, NAN);
  CHECK(loom_allreduce(g, &a, &b, LOOM_SUM) == LOOM_OK, "%s allreduce: %s", name,
        loom_last_error(NULL));
  for (int64_t k = 0; k < count; k++) {
    double want = 0;
    for (int i = 0; i < n; i++) {
      want += gval(g, i, 0, k);
    }
    bad += y[k] != (float)want;
  }
  CHECK(bad == 0, "%s allreduce sum: %d of %lld wrong", name, bad, (long long)count);

  // allgatherv: group rank i contributes 2 + 3 i elements.
  int64_t *counts = malloc(sizeof(int64_t) * 2 * (size_t)n), *recv_counts = counts + n;
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    counts[i] = 2 + 3 * (int64_t)i;
    total += counts[i];
  }
  loom_tensor_t s = test_tensor_f32(1, &counts[me], "s"), r = test_tensor_f32(1, &total, "r");
  for (int64_t k = 0; k < counts[me]; k++) {
    test_floats(&s)[k] = gval(g, me, 0, k);
  }
  test_fill_value(test_floats(&r), total, NAN);
  CHECK(loom_allgatherv(g, &s, &r, counts) == LOOM_OK, "%s allgatherv: %s", name,
        loom_last_error(NULL));
  bad = 0;
  for (int i = 0, at = 0; i < n; at += (int)counts[i], i++) {
    COUNT_BAD(bad, test_floats(&r) + at, counts[i], gval(g, i, 0, k));
  }
  CHECK(bad == 0, "%s allgatherv: %d of %lld wrong", name, bad, (long long)total);
  TEST_FREE(&s, &r);

  // alltoallv: pair_count(me, j) elements to j, pair_count(i, me) from i.
  int64_t nsend = 0, nrecv = 0;
  for (int j = 0; j < n; j++) {
    counts[j] = pair_count(me, j);
    recv_counts[j] = pair_count(j, me);
    nsend += counts[j];
    nrecv += recv_counts[j];
  }
  s = test_tensor_f32(1, &nsend, "s");
  r = test_tensor_f32(1, &nrecv, "r");
  for (int j = 0, at = 0; j < n; at += (int)counts[j], j++) {
    for (int64_t k = 0; k < counts[j]; k++) {
      test_floats(&s)[at + k] = gval(g, me, j, k);
    }
  }
  test_fill_value(test_floats(&r), nrecv, NAN);
  CHECK(loom_alltoallv(g, &s, counts, &r, recv_counts) == LOOM_OK, "%s alltoallv: %s", name,
        loom_last_error(NULL));
  bad = 0;
  for (int i = 0, at = 0; i < n; at += (int)recv_counts[i], i++) {
    COUNT_BAD(bad, test_floats(&r) + at, recv_counts[i], gval(g, i, me, k));
  }
  CHECK(bad == 0, "%s alltoallv: %d of %lld wrong", name, bad, (long long)nrecv);
  TEST_FREE(&s, &r);

  // alltoall of equal blocks of 5, and a broadcast of 10 from the last group rank.
  int64_t all = 5 * (int64_t)n;
  s = test_tensor_f32(1, &all, "s");
  r = test_tensor_f32(1, &all, "r");
  for (int j = 0; j < n; j++) {
    for (int64_t k = 0; k < 5; k++) {
      test_floats(&s)[5 * j + k] = gval(g, me, j, k);
    }
  }
  test_fill_value(test_floats(&r), all, NAN);
  CHECK(loom_alltoall(g, &s, &r) == LOOM_OK, "%s alltoall: %s", name, loom_last_error(NULL));
  bad = 0;
  for (int i = 0; i < n; i++) {
    COUNT_BAD(bad, test_floats(&r) + 5 * i, 5, gval(g, i, me, k));
  }
  CHECK(bad == 0, "%s alltoall: %d of %lld wrong", name, bad, (long long)all);
  for (int64_t k = 0; k < 10; k++) {
    x[k] = me == n - 1 ? gval(g, me, 0, k) : NAN;
  }
  a.shape[0] = 10;
  CHECK(loom_broadcast(g, &a, n - 1) == LOOM_OK, "%s broadcast: %s", name, loom_last_error(NULL));
  a.shape[0] = count;
  bad = 0;
  COUNT_BAD(bad, x, 10, gval(g, n - 1, 0, k));
  CHECK(bad == 0, "%s broadcast: %d of 10 wrong", name, bad);
  TEST_FREE(&a, &b, &s, &r);
  free(counts);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  int rank = loom_rank(ctx), size = loom_size(ctx);
  int64_t chunk = 0; // --chunk N: loom's MPI transfers in pieces of at most N elements
  if (test_chunk_option("test_groups", argc, argv, rank, &chunk) != 0) {
    loom_finalize(ctx);
    return 2;
  }
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
      loom_collectives(g, name);
    }
  }
  CHECK(loom_group(ctx, LOOM_GROUP_COUNT) == NULL, "out of range kind");
  CHECK(!strcmp(loom_group_kind_name(LOOM_GROUP_EXPERT_DP), "expert_dp"), "kind names");
  int rc = check_exit_all("test_groups");
  loom_finalize(ctx);
  return rc;
}
