/* test_coll.c — every collective of loom_comm.h at the run's np, on every group this rank is in:
 * all dtypes and ops against references computed locally, odd counts, identity across ranks. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../check_mpi.h"
#include "../chunk_arg.h"
#include "../testutil.h"

// What is checked (each against values computed here from the rank formula below):
// - allreduce: 7 dtypes x SUM/AVG/MAX/MIN x counts 0, 1, 7, 1000 (+ 1000003 on world), in place
//   and not, blocking and not; f16/bf16 sums equal the f32 sum rounded once; f32/f16/bf16 sums
//   of order-sensitive values (1e8, 1, -1e8...) are bitwise identical on every rank (checksums
//   gathered over MPI) and equal the sum in rank order.
// - reduce_scatter: even split (NULL counts, counts not divisible by n) and explicit uneven
//   counts with zeros; every dtype and op.
// - allgather, allgatherv (random counts with zeros from a shared seed), broadcast from every
//   root, alltoall (blocks of 0..2 and 7), alltoallv (random per-pair counts from a shared
//   seed), send/recv ring.
// - non-blocking: several requests polled together with loom_test; two staged requests waited
//   for in opposite orders on odd and even ranks (must not deadlock); loom_wait_all with NULLs.
// - pipelined ordered reductions (chunks of at most LOOM_PIPE_BYTES, 1 MiB by default, per
//   peer; coll_pipe_np3.mpi sets 256 bytes): counts of several chunks
//   at np 2..4 whose blocks end one element into a chunk on some ranks only, explicit uneven
//   counts with zeros, in place and not, f32/f16/bf16; more large requests in flight at once
//   than the scratch pool keeps, polled in turn, then waited for in opposite orders.
// - groups: world (with the large counts), node, dp, ep, expert_dp where this rank is a member;
//   on a group it is not in (attn without servers, dp on a server) every call is INVALID_ARG.
// - bad arguments: each LOOM_ERR_INVALID_ARG with a message naming the call and the argument.
// With --chunk N every MPI transfer goes in pieces of at most N elements (loom_mpi_set_chunk, the
// library's test hook; normally 2^27): with N = 3 the counts above split into many pieces with a
// short last one, and gathers and equal all-to-alls of more than N elements go point to point.
// Below N = 1000 the large counts are left out (a million elements would be 300000 messages).

static const loom_dtype_t all_dtypes[] = {LOOM_F32, LOOM_F16, LOOM_BF16, LOOM_I8,
                                          LOOM_U8,  LOOM_I32, LOOM_I64};
#define NDTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))
static const char *const op_names[] = {"sum", "avg", "max", "min"};

static int world_rank;
static int test_device = LOOM_DEVICE_HOST; // where the tested tensors live (a CUDA index: NCCL)

// ---- values ---------------------------------------------------------------------------------

// Element i of rank r's input (salt tells calls apart). Every value and every sum of up to four
// of them is exact in every dtype, so references do not depend on the order of a sum.
static double value(loom_dtype_t dt, int r, int64_t i, int salt) {
  int64_t base = ((int64_t)r * 7 + i * 3 + salt) % 17; // 0..16
  switch (dt) {
  case LOOM_U8:
    return (double)base;
  case LOOM_I8:
    return (double)(base - 8);
  case LOOM_I32:
    return (double)(base - 8 + (int64_t)r * 100000 - (i % 1000) * 3);
  case LOOM_I64:
    return (double)(base - 8 + ((int64_t)(r + 1) << 33) - i);
  default:
    return (double)(base - 8) + 0.25 * (double)((i + r) % 4);
  }
}

// The reduction over n ranks of element i.
static double reduced(loom_dtype_t dt, loom_redop_t op, int n, int64_t i, int salt) {
  double acc = value(dt, 0, i, salt);
  for (int r = 1; r < n; r++) {
    double v = value(dt, r, i, salt);
    acc = op == LOOM_MAX ? (v > acc ? v : acc) : op == LOOM_MIN ? (v < acc ? v : acc) : acc + v;
  }
  if (op == LOOM_AVG) {
    return (double)((float)acc / (float)n);
  }
  return acc;
}

static loom_tensor_t mk(loom_dtype_t dt, int64_t count, const char *name) {
  return test_tensor(dt, 1, &count, name);
}

static void fill(loom_tensor_t *t, int r, int salt) {
  for (int64_t i = 0; i < loom_tensor_numel(t); i++) {
    test_put(t->dtype, t->data, i, value(t->dtype, r, i, salt));
  }
}

// Outputs start as 0xA5 bytes, not the zeros of loom_tensor_alloc, so that an element a call
// never writes cannot pass for a result: no value() nor reduction of them has these bits (u8 165,
// i8 -91, i32 -1515870811, i64 -6.5e18, f32 and bf16 -2.9e-16, f16 -0.0222, while the floats
// are multiples of 0.25, the i32 values lie in -3008..400008 and the i64 ones in 0..2^37).
static void poison(loom_tensor_t *t) {
  if (loom_tensor_bytes(t) > 0) {
    memset(t->data, 0xA5, loom_tensor_bytes(t));
  }
}

// A copy of t's bytes (to check later that a call left an input unchanged).
static void *snapshot(const loom_tensor_t *t) {
  void *p = malloc(loom_tensor_bytes(t) + 1);
  if (loom_tensor_bytes(t) > 0) {
    memcpy(p, t->data, loom_tensor_bytes(t));
  }
  return p;
}

// Bytes of got equal want; names the first differing element.
static void same(const char *what, const loom_tensor_t *got, const void *want) {
  size_t es = loom_dtype_size(got->dtype);
  int64_t n = loom_tensor_numel(got);
  if (n == 0 || memcmp(got->data, want, (size_t)n * es) == 0) {
    return;
  }
  int64_t i = 0;
  while (memcmp((const char *)got->data + i * es, (const char *)want + i * es, es) == 0) {
    i++;
  }
  CHECK(0, "world rank %d: %s (%s, %lld elements): first difference at element %lld", world_rank,
        what, loom_dtype_name(got->dtype), (long long)n, (long long)i);
}

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

// A call that must fail with want (or also) and a message naming op and containing needle. (The
// program links the shared library, so it cannot clear the last error; every failure sets it.)
static void expect_fail(loom_status_t got, loom_status_t want, loom_status_t also, const char *op,
                        const char *needle, const char *where) {
  const char *msg = loom_last_error(NULL);
  CHECK(got == want || got == also, "%s: got %s, want %s (last error: %s)", where,
        loom_strerror(got), loom_strerror(want), msg);
  CHECK(got != LOOM_OK && strstr(msg, op) != NULL && strstr(msg, needle) != NULL,
        "%s: message '%s' should name %s and contain '%s'", where, msg, op, needle);
}
#define EXPECT_BAD(call, op, needle)                                                               \
  expect_fail((call), LOOM_ERR_INVALID_ARG, LOOM_ERR_INVALID_ARG, op, needle, TEST_HERE)
#define EXPECT_BAD_DEVICE(call, op, needle)                                                        \
  expect_fail((call), LOOM_ERR_UNSUPPORTED, LOOM_ERR_INVALID_ARG, op, needle, TEST_HERE)

// t itself in a host run; in a device run, a copy of t on test_device (in *tmp).
static loom_tensor_t *dev_in(loom_tensor_t *t, loom_tensor_t *tmp) {
  if (test_device == LOOM_DEVICE_HOST) {
    return t;
  }
  OK(loom_tensor_alloc(tmp, t->dtype, test_device, t->ndim, t->shape, t->name));
  OK(loom_tensor_copy(tmp, t));
  return tmp;
}

// After a device run: the result back into host t (copy), and the device copy freed.
static void dev_out(loom_tensor_t *t, loom_tensor_t *d, int copy) {
  if (d != t) {
    if (copy) {
      OK(loom_tensor_copy(t, d));
    }
    loom_tensor_free(d);
  }
}

// Wait for or poll (loom_test) a request.
static loom_status_t complete(loom_request_t **req, int poll) {
  if (!poll) {
    return loom_wait(req);
  }
  int done = 0;
  loom_status_t status = LOOM_OK;
  while (!done && status == LOOM_OK) {
    status = loom_test(req, &done);
  }
  CHECK(*req == NULL, "request not released after completion");
  return status;
}

// ---- reductions ---------------------------------------------------------------------------------

// mode: 0 blocking, 1 non-blocking + loom_wait, 2 non-blocking + loom_test polling.
static void t_allreduce(const loom_group_t *g, loom_dtype_t dt, loom_redop_t op, int64_t count,
                        int inplace, int mode) {
  int n = loom_group_size(g), me = loom_group_rank(g), salt = (int)(count % 13) + op;
  loom_tensor_t send = mk(dt, count, "send"), recv = inplace ? send : mk(dt, count, "recv");
  fill(&send, me, salt);
  if (!inplace) {
    poison(&recv);
  }
  void *send0 = snapshot(&send);
  void *want = malloc(loom_tensor_bytes(&send) + 1);
  for (int64_t i = 0; i < count; i++) {
    test_put(dt, want, i, reduced(dt, op, n, i, salt));
  }
  loom_tensor_t ds, dr, *S = dev_in(&send, &ds), *R = inplace ? S : dev_in(&recv, &dr);
  if (mode == 0) {
    OK(loom_allreduce(g, S, R, op));
  } else {
    loom_request_t *req = NULL;
    OK(loom_iallreduce(g, S, R, op, &req));
    OK(complete(&req, mode == 2));
  }
  dev_out(&send, S, 1); // in place the result (recv is send), else send as it must stay
  if (!inplace) {
    dev_out(&recv, R, 1);
  }
  char what[96];
  snprintf(what, sizeof what, "allreduce %s count %lld%s mode %d", op_names[op], (long long)count,
           inplace ? " in place" : "", mode);
  same(what, &recv, want);
  if (!inplace) {
    snprintf(what, sizeof what, "allreduce %s count %lld mode %d: send changed", op_names[op],
             (long long)count, mode);
    same(what, &send, send0);
  }
  free(send0);
  free(want);
  loom_tensor_free(&send);
  if (!inplace) {
    loom_tensor_free(&recv);
  }
}

// counts NULL: the even split.
static void t_reduce_scatter(const loom_group_t *g, loom_dtype_t dt, loom_redop_t op, int64_t total,
                             const int64_t *counts, int mode) {
  int n = loom_group_size(g), me = loom_group_rank(g), salt = (int)(total % 11) + 2 * op;
  int64_t mine = counts ? counts[me] : total / n + (me < total % n), displ = 0;
  for (int r = 0; r < me; r++) {
    displ += counts ? counts[r] : total / n + (r < total % n);
  }
  loom_tensor_t send = mk(dt, total, "send"), recv = mk(dt, mine, "recv");
  fill(&send, me, salt);
  poison(&recv);
  void *send0 = snapshot(&send);
  void *want = malloc(loom_tensor_bytes(&recv) + 1);
  for (int64_t i = 0; i < mine; i++) {
    test_put(dt, want, i, reduced(dt, op, n, displ + i, salt));
  }
  loom_tensor_t ds, dr, *S = dev_in(&send, &ds), *R = dev_in(&recv, &dr);
  if (mode == 0) {
    OK(loom_reduce_scatter(g, S, R, counts, op));
  } else {
    loom_request_t *req = NULL;
    OK(loom_ireduce_scatter(g, S, R, counts, op, &req));
    OK(complete(&req, mode == 2));
  }
  dev_out(&send, S, 1);
  dev_out(&recv, R, 1);
  char what[96];
  snprintf(what, sizeof what, "reduce_scatter %s total %lld %s counts", op_names[op],
           (long long)total, counts ? "explicit" : "even");
  same(what, &recv, want);
  snprintf(what, sizeof what, "reduce_scatter %s total %lld: send changed", op_names[op],
           (long long)total);
  same(what, &send, send0);
  free(send0);
  free(want);
  TEST_FREE(&send, &recv);
}

// f16/bf16 sums of values whose running f16 sums would round differently: the result must be the
// f32 sum rounded once. Values are multiples of 2^-10 (f16) or 2^-7 (bf16) below 4 in magnitude,
// so the f32 sum is exact in any order.
static void t_round_once(const loom_group_t *g, loom_dtype_t dt) {
  int n = loom_group_size(g), me = loom_group_rank(g);
  int64_t count = 4099;
  double q = dt == LOOM_F16 ? 1.0 / 1024 : 1.0 / 128;
  float (*to32)(uint16_t) = dt == LOOM_F16 ? loom_f16_to_f32 : loom_bf16_to_f32;
  uint16_t (*from32)(float) = dt == LOOM_F16 ? loom_f32_to_f16 : loom_f32_to_bf16;
  loom_tensor_t t = mk(dt, count, "t");
  uint16_t *want = malloc(sizeof(uint16_t) * (size_t)count);
  int64_t differs = 0;
  for (int64_t i = 0; i < count; i++) {
    float sum = 0.0f;
    uint16_t naive = 0;
    for (int r = 0; r < n; r++) {
      test_rng_t rng = test_rng((uint64_t)(i * 131 + r * 7 + 5));
      uint16_t v = from32((float)((double)test_int(&rng, -(int64_t)(4 / q), (int64_t)(4 / q)) * q));
      if (r == me) {
        ((uint16_t *)t.data)[i] = v;
      }
      sum += to32(v);
      naive = r == 0 ? v : from32(to32(naive) + to32(v));
    }
    want[i] = from32(sum);
    differs += naive != want[i];
  }
  OK(loom_allreduce(g, &t, &t, LOOM_SUM));
  same(dt == LOOM_F16 ? "f16 sum rounded once" : "bf16 sum rounded once", &t, want);
  if (n >= 3) {
    CHECK(differs > 0, "%s: the test values do not tell one rounding from several",
          loom_dtype_name(dt));
  }
  free(want);
  loom_tensor_free(&t);
}

static const char *hier_mode = "auto"; // LOOM_HIER_ALLREDUCE as loom_init took it
static int my_node;                    // loom_node: this rank's (emulated) node

// The order in which loom adds the members' contributions to element i of an f32 SUM/AVG
// allreduce on g (order[0..n), group ranks), and the rank after which the partial sum starts
// again at zero (the node boundaries of the hierarchical scheme; see coll_mpi.c): *hier = 0, rank
// order; 1, grouped by node. node[r] is group rank r's node.
static void sum_order(const int *node, int n, int64_t count, int64_t i, int *order, int *hier) {
  int distinct = 0, size = -1, same_size = 1;
  for (int r = 0; r < n; r++) {
    int seen = 0, c = 0;
    for (int q = 0; q < n; q++) {
      seen |= q < r && node[q] == node[r];
      c += node[q] == node[r];
    }
    distinct += !seen;
    size = size < 0 ? c : size;
    same_size &= c == size;
  }
  *hier = strcmp(hier_mode, "off") != 0 && n >= 4 && distinct >= 2 && same_size && size >= 2;
  if (!*hier) {
    for (int r = 0; r < n; r++) {
      order[r] = r;
    }
    return;
  }
  // Block b of an even split in `size` (the node's reduce-scatter): the nodes in the order of
  // their b-th members' group ranks (the rail), each node's members in group rank order.
  int64_t b = 0, lo = 0;
  while (lo + count / size + (b < count % size ? 1 : 0) <= i) {
    lo += count / size + (b < count % size ? 1 : 0);
    b++;
  }
  int k = 0;
  for (int r = 0; r < n; r++) { // r: a b-th member, in group rank order, opens its node
    int idx = 0;
    for (int q = 0; q < r; q++) {
      idx += node[q] == node[r];
    }
    if (idx != b) {
      continue;
    }
    for (int q = 0; q < n; q++) {
      if (node[q] == node[r]) {
        order[k++] = q;
      }
    }
  }
}

// Order-sensitive float sums: every rank must hold the same bits (gathered checksums), and they
// are the sum in loom's documented order on the host path: rank order, or for f32 on a group
// over nodes of equal sizes the node sums (rank order) added in node order (sum_order).
static void t_identity(const loom_group_t *g, loom_dtype_t dt, loom_redop_t op, int64_t count) {
  static const double pool[] = {1e8, 1.0, -1e8, 3.14159, -2.5e-3, 7e7, -1.0, 1e-3};
  int n = loom_group_size(g), me = loom_group_rank(g);
  float (*to32)(uint16_t) = dt == LOOM_F16 ? loom_f16_to_f32 : loom_bf16_to_f32;
  uint16_t (*from32)(float) = dt == LOOM_F16 ? loom_f32_to_f16 : loom_f32_to_bf16;
  loom_tensor_t t = mk(dt, count, "t");
  void *want = malloc(loom_tensor_bytes(&t) + 1);
  int *node = malloc(sizeof(int) * (size_t)n), *order = malloc(sizeof(int) * (size_t)n);
  float *v = malloc(sizeof(float) * (size_t)n);
  MPI_Allgather(&my_node, 1, MPI_INT, node, 1, MPI_INT, loom_group_comm(g));
  int hier = 0;
  int64_t differs = 0; // elements whose sum by node is not their sum in rank order
  for (int64_t i = 0; i < count; i++) {
    for (int r = 0; r < n; r++) {
      test_rng_t rng = test_rng((uint64_t)(i * 7919 + r * 104729 + 1));
      v[r] = (float)(pool[(i * 5 + r * 3) % 8] * test_uniform(&rng, 0.5, 1.5));
      if (dt == LOOM_F16) { // keep f16 in range
        v[r] = (float)(v[r] / 1e4);
      }
      if (dt != LOOM_F32) {
        v[r] = to32(from32(v[r]));
      }
      if (r == me) {
        test_put(dt, t.data, i, v[r]);
      }
    }
    sum_order(node, n, count, i, order, &hier);
    hier &= dt == LOOM_F32;
    float acc = 0.0f, part = 0.0f;
    int first = 1;
    for (int k = 0; k < n; k++) {
      int r = hier ? order[k] : k;
      part = k == 0 || (hier && node[r] != node[order[k - 1]]) ? v[r] : part + v[r];
      if (k + 1 == n || (hier && node[order[k + 1]] != node[r])) { // a node's sum is complete
        acc = first ? part : acc + part;
        first = 0;
      }
    }
    float flat = v[0];
    for (int r = 1; r < n; r++) {
      flat += v[r];
    }
    differs += hier && memcmp(&flat, &acc, sizeof acc) != 0;
    if (op == LOOM_AVG) {
      acc /= (float)n;
    }
    test_put(dt, want, i, acc);
  }
  OK(loom_allreduce(g, &t, &t, op));
  same(hier ? "order-sensitive sum by node (hierarchical)" : "order-sensitive sum in rank order",
       &t, want);
  if (hier && count >= 100 && op == LOOM_SUM) {
    CHECK(differs > 0, "the test values do not tell the sum by node from the sum in rank order");
  }
  free(node);
  free(order);
  free(v);
  uint64_t sum = 0;
  OK(loom_checksum(&t, &sum));
  uint64_t *all = malloc(sizeof(uint64_t) * (size_t)n);
  MPI_Allgather(&sum, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, loom_group_comm(g));
  for (int r = 0; r < n; r++) {
    CHECK(all[r] == all[0],
          "%s %s: group rank %d's result differs from rank 0's (checksums %llx, %llx)",
          loom_dtype_name(dt), op_names[op], r, (unsigned long long)all[r],
          (unsigned long long)all[0]);
  }
  free(all);
  free(want);
  loom_tensor_free(&t);
}

// Every path gives loom_reduce_into's bits, whatever MPI's own ops would do: int8/uint8 sums
// wrap at any length (Open MPI's AVX op saturates long buffers), in allreduce and reduce-scatter
// alike, and an f32 NaN survives MAX and MIN whichever rank holds it.
static void t_edge_values(const loom_group_t *g) {
  const int n = loom_group_size(g), me = loom_group_rank(g);
  const int64_t counts[] = {2, 64, 1000};
  for (int c = 0; c < 3; c++) {
    const int64_t count = counts[c];
    for (int u = 0; u < 2; u++) {
      loom_dtype_t dt = u ? LOOM_U8 : LOOM_I8;
      loom_tensor_t t = mk(dt, count, "wrap"), rs = mk(dt, count, "wrap.rs");
      const uint8_t x = u ? 200 : 100; // the same on every rank: the sum wraps at n >= 2
      memset(t.data, x, (size_t)count);
      memset(rs.data, x, (size_t)count);
      const uint8_t want = (uint8_t)(x * n);
      OK(loom_allreduce(g, &t, &t, LOOM_SUM));
      int64_t bad = 0;
      for (int64_t i = 0; i < count; i++) {
        bad += ((uint8_t *)t.data)[i] != want;
      }
      CHECK(bad == 0, "%s sum allreduce of %lld: %lld elements not %u (wrapped)",
            u ? "uint8" : "int8", (long long)count, (long long)bad, want);
      const int64_t mine = count / n + (me < count % n ? 1 : 0); // reduce-scatter: its block
      loom_tensor_t out = mk(dt, mine, "wrap.out");
      OK(loom_reduce_scatter(g, &rs, &out, NULL, LOOM_SUM));
      bad = 0;
      for (int64_t i = 0; i < mine; i++) {
        bad += ((uint8_t *)out.data)[i] != want;
      }
      CHECK(bad == 0, "%s sum reduce-scatter of %lld: %lld elements not %u", u ? "uint8" : "int8",
            (long long)count, (long long)bad, want);
      loom_tensor_free(&t);
      loom_tensor_free(&rs);
      loom_tensor_free(&out);
    }
    for (int op = LOOM_MAX; op <= LOOM_MIN; op++) {
      for (int holder = 0; holder < n; holder++) {
        loom_tensor_t t = mk(LOOM_F32, count, "nan");
        float *v = t.data;
        for (int64_t i = 0; i < count; i++) {
          v[i] = me == holder && i % 2 == 0 ? NAN : (float)(me + 1);
        }
        OK(loom_allreduce(g, &t, &t, (loom_redop_t)op));
        int64_t bad = 0;
        for (int64_t i = 0; i < count; i++) {
          bad += i % 2 == 0 ? !isnan(v[i]) : v[i] != (float)(op == LOOM_MAX ? n : 1);
        }
        CHECK(bad == 0, "f32 %s allreduce of %lld, NaN on rank %d: %lld elements wrong",
              op_names[op], (long long)count, holder, (long long)bad);
        loom_tensor_free(&t);
      }
    }
  }
}

// ---- gathers, broadcast, all-to-all -------------------------------------------------------------

// counts NULL: allgather of count elements per rank.
static void t_allgather(const loom_group_t *g, loom_dtype_t dt, int64_t count,
                        const int64_t *counts, int mode) {
  int n = loom_group_size(g), me = loom_group_rank(g), salt = 3;
  int64_t total = 0;
  for (int r = 0; r < n; r++) {
    total += counts ? counts[r] : count;
  }
  loom_tensor_t send = mk(dt, counts ? counts[me] : count, "send"), recv = mk(dt, total, "recv");
  fill(&send, me, salt);
  poison(&recv);
  void *send0 = snapshot(&send);
  void *want = malloc(loom_tensor_bytes(&recv) + 1);
  int64_t o = 0;
  for (int r = 0; r < n; r++) {
    for (int64_t k = 0; k < (counts ? counts[r] : count); k++) {
      test_put(dt, want, o++, value(dt, r, k, salt));
    }
  }
  loom_request_t *req = NULL;
  loom_tensor_t ds, dr, *S = dev_in(&send, &ds), *R = dev_in(&recv, &dr);
  if (counts) {
    if (mode == 0) {
      OK(loom_allgatherv(g, S, R, counts));
    } else {
      OK(loom_iallgatherv(g, S, R, counts, &req));
    }
  } else if (mode == 0) {
    OK(loom_allgather(g, S, R));
  } else {
    OK(loom_iallgather(g, S, R, &req));
  }
  if (mode) {
    OK(complete(&req, mode == 2));
  }
  dev_out(&send, S, 1);
  dev_out(&recv, R, 1);
  same(counts ? "allgatherv" : "allgather", &recv, want);
  same(counts ? "allgatherv: send changed" : "allgather: send changed", &send, send0);
  free(send0);
  free(want);
  TEST_FREE(&send, &recv);
}

static void t_broadcast(const loom_group_t *g, loom_dtype_t dt, int64_t count, int root, int mode) {
  int me = loom_group_rank(g), salt = 5 + root;
  loom_tensor_t buf = mk(dt, count, "buf");
  if (me == root) {
    fill(&buf, root, salt);
  } else {
    poison(&buf); // (another rank's values could equal the root's: u8 ones repeat every 17 ranks)
  }
  void *want = malloc(loom_tensor_bytes(&buf) + 1);
  for (int64_t i = 0; i < count; i++) {
    test_put(dt, want, i, value(dt, root, i, salt));
  }
  loom_tensor_t db, *B = dev_in(&buf, &db);
  if (mode == 0) {
    OK(loom_broadcast(g, B, root));
  } else {
    loom_request_t *req = NULL;
    OK(loom_ibroadcast(g, B, root, &req));
    OK(complete(&req, mode == 2));
  }
  dev_out(&buf, B, 1);
  char what[64];
  snprintf(what, sizeof what, "broadcast from root %d count %lld", root, (long long)count);
  same(what, &buf, want);
  free(want);
  loom_tensor_free(&buf);
}

// Elements rank i sends rank j in the alltoallv test (zeros included), known on every rank.
static int64_t pair_count(int i, int j, int seed) {
  if ((i + 2 * j + seed) % 4 == 0) {
    return 0;
  }
  test_rng_t rng = test_rng((uint64_t)(seed * 1000003 + i * 1009 + j));
  return test_int(&rng, 0, 40);
}

// block > 0 or variable: equal blocks of block elements, or pair_count(src, dst, seed).
static void t_alltoall(const loom_group_t *g, loom_dtype_t dt, int64_t block, int variable,
                       int seed, int mode) {
  int n = loom_group_size(g), me = loom_group_rank(g), salt = 7;
  int64_t *sc = malloc(sizeof(int64_t) * (size_t)n), *rc = malloc(sizeof(int64_t) * (size_t)n);
  int64_t stotal = 0, rtotal = 0;
  for (int j = 0; j < n; j++) {
    sc[j] = variable ? pair_count(me, j, seed) : block;
    rc[j] = variable ? pair_count(j, me, seed) : block;
    stotal += sc[j];
    rtotal += rc[j];
  }
  loom_tensor_t send = mk(dt, stotal, "send"), recv = mk(dt, rtotal, "recv");
  fill(&send, me, salt);
  poison(&recv);
  void *send0 = snapshot(&send);
  void *want = malloc(loom_tensor_bytes(&recv) + 1);
  int64_t o = 0;
  for (int j = 0; j < n; j++) { // block from j: j's elements sent to me, at j's send offset
    int64_t off = 0;
    for (int t = 0; t < me; t++) {
      off += variable ? pair_count(j, t, seed) : block;
    }
    for (int64_t k = 0; k < rc[j]; k++) {
      test_put(dt, want, o++, value(dt, j, off + k, salt));
    }
  }
  loom_request_t *req = NULL;
  loom_tensor_t ds, dr, *S = dev_in(&send, &ds), *R = dev_in(&recv, &dr);
  if (variable) {
    if (mode == 0) {
      OK(loom_alltoallv(g, S, sc, R, rc));
    } else {
      OK(loom_ialltoallv(g, S, sc, R, rc, &req));
    }
  } else if (mode == 0) {
    OK(loom_alltoall(g, S, R));
  } else {
    OK(loom_ialltoall(g, S, R, &req));
  }
  if (mode) {
    OK(complete(&req, mode == 2));
  }
  dev_out(&send, S, 1);
  dev_out(&recv, R, 1);
  same(variable ? "alltoallv" : "alltoall", &recv, want);
  same(variable ? "alltoallv: send changed" : "alltoall: send changed", &send, send0);
  free(send0);
  free(want);
  free(sc);
  free(rc);
  TEST_FREE(&send, &recv);
}

// ---- point to point -----------------------------------------------------------------------------

// Ring: send to rank + 1, receive from rank - 1; blocking (rank 0 sends first) or not.
static void t_ring(const loom_group_t *g, loom_dtype_t dt, int64_t count, int blocking) {
  int n = loom_group_size(g), me = loom_group_rank(g), salt = 9, tag = 42;
  int next = (me + 1) % n, prev = (me - 1 + n) % n;
  loom_tensor_t send = mk(dt, count, "send"), recv = mk(dt, count, "recv");
  fill(&send, me, salt);
  poison(&recv);
  void *send0 = snapshot(&send);
  void *want = malloc(loom_tensor_bytes(&recv) + 1);
  for (int64_t i = 0; i < count; i++) {
    test_put(dt, want, i, value(dt, prev, i, salt));
  }
  loom_tensor_t ds, dr, *S = dev_in(&send, &ds), *R = dev_in(&recv, &dr);
  if (blocking && n > 1) {
    if (me == 0) {
      OK(loom_send(g, S, next, tag));
      OK(loom_recv(g, R, prev, tag));
    } else {
      OK(loom_recv(g, R, prev, tag));
      OK(loom_send(g, S, next, tag));
    }
  } else {
    loom_request_t *reqs[3] = {NULL, NULL, NULL};
    OK(loom_irecv(g, R, prev, tag, &reqs[0]));
    OK(loom_isend(g, S, next, tag, &reqs[2]));
    OK(loom_wait_all(reqs, 3)); // reqs[1] is NULL: skipped
    CHECK(!reqs[0] && !reqs[2], "loom_wait_all left requests behind");
  }
  dev_out(&send, S, 1);
  dev_out(&recv, R, 1);
  same(blocking ? "send/recv ring" : "isend/irecv ring", &recv, want);
  same(blocking ? "send/recv ring: send changed" : "isend/irecv ring: send changed", &send, send0);
  free(send0);
  free(want);
  TEST_FREE(&send, &recv);
}

// ---- non-blocking together ----------------------------------------------------------------------

// Several operations in flight at once, completed by loom_test polling in turn; then two staged
// reductions waited for in opposite orders on even and odd ranks.
static void t_inflight(const loom_group_t *g) {
  int n = loom_group_size(g), me = loom_group_rank(g);
  int64_t count = 1000 * n + 3;
  loom_tensor_t a = mk(LOOM_F32, count, "a"), b = mk(LOOM_F16, count, "b");
  loom_tensor_t c = mk(LOOM_I32, 17, "c"), cg = mk(LOOM_I32, 17 * n, "cg");
  loom_tensor_t d = mk(LOOM_BF16, count, "d"), ds = mk(LOOM_BF16, count / n + 1, "ds");
  ds.shape[0] = count / n + (me < count % n);
  fill(&a, me, 1);
  fill(&b, me, 2);
  fill(&c, me, 3);
  fill(&d, me, 4);
  loom_request_t *reqs[4] = {NULL, NULL, NULL, NULL};
  OK(loom_iallreduce(g, &a, &a, LOOM_SUM, &reqs[0]));
  OK(loom_iallreduce(g, &b, &b, LOOM_AVG, &reqs[1]));
  OK(loom_iallgather(g, &c, &cg, &reqs[2]));
  OK(loom_ireduce_scatter(g, &d, &ds, NULL, LOOM_MAX, &reqs[3]));
  int left = 4, rounds = 0;
  while (left > 0 && rounds < 100000000) {
    for (int k = 0; k < 4; k++) {
      int done = 0;
      if (reqs[k]) {
        OK(loom_test(&reqs[k], &done));
        left -= done;
      }
    }
    rounds++;
  }
  CHECK(left == 0, "%d requests did not complete", left);
  int bad = 0;
  for (int64_t i = 0; i < count; i++) {
    float fa = ((float *)a.data)[i];
    bad += fa != (float)reduced(LOOM_F32, LOOM_SUM, n, i, 1);
    bad += ((uint16_t *)b.data)[i] != loom_f32_to_f16((float)reduced(LOOM_F16, LOOM_AVG, n, i, 2));
  }
  int64_t displ = 0;
  for (int r = 0; r < me; r++) {
    displ += count / n + (r < count % n);
  }
  for (int64_t i = 0; i < ds.shape[0]; i++) {
    bad += ((uint16_t *)ds.data)[i] !=
           loom_f32_to_bf16((float)reduced(LOOM_BF16, LOOM_MAX, n, displ + i, 4));
  }
  for (int r = 0; r < n; r++) {
    for (int64_t k = 0; k < 17; k++) {
      bad += ((int32_t *)cg.data)[r * 17 + k] != (int32_t)value(LOOM_I32, r, k, 3);
    }
  }
  CHECK(bad == 0, "in-flight operations: %d wrong elements", bad);

  // Opposite wait orders: each rank's first wait needs the other request's second stage.
  fill(&a, me, 5);
  fill(&b, me, 6);
  loom_request_t *x = NULL, *y = NULL;
  OK(loom_iallreduce(g, &a, &a, LOOM_SUM, &x));
  OK(loom_iallreduce(g, &b, &b, LOOM_SUM, &y));
  if (me % 2 == 0) {
    OK(loom_wait(&x));
    OK(loom_wait(&y));
  } else {
    OK(loom_wait(&y));
    OK(loom_wait(&x));
  }
  bad = 0;
  for (int64_t i = 0; i < count; i++) {
    bad += ((float *)a.data)[i] != (float)reduced(LOOM_F32, LOOM_SUM, n, i, 5);
    bad += ((uint16_t *)b.data)[i] != loom_f32_to_f16((float)reduced(LOOM_F16, LOOM_SUM, n, i, 6));
  }
  CHECK(bad == 0, "opposite wait orders: %d wrong elements", bad);
  OK(loom_wait(&x)); // a released request: nothing to do
  int done = 0;
  OK(loom_test(&x, &done));
  CHECK(done == 1, "loom_test on a released request");
  ds.shape[0] = count / n + 1;
  TEST_FREE(&a, &b, &c, &cg, &d, &ds);
}

// Many pipelined reductions in flight at once (more than the group keeps scratch for), polled
// in turn from the last one; then two waited for in opposite orders on even and odd ranks.
static void t_pipelines(const loom_group_t *g, int64_t count) {
  enum { NREQ = 6 };
  int n = loom_group_size(g), me = loom_group_rank(g);
  loom_tensor_t t[NREQ];
  loom_request_t *reqs[NREQ];
  for (int k = 0; k < NREQ; k++) {
    t[k] = mk(k % 2 ? LOOM_F16 : LOOM_F32, count + k, "t");
    fill(&t[k], me, 20 + k);
    OK(loom_iallreduce(g, &t[k], &t[k], k % 3 == 2 ? LOOM_AVG : LOOM_SUM, &reqs[k]));
  }
  int left = NREQ;
  for (long round = 0; left > 0 && round < 100000000; round++) {
    for (int k = NREQ - 1; k >= 0; k--) {
      int done = 0;
      if (reqs[k]) {
        OK(loom_test(&reqs[k], &done));
        left -= done;
      }
    }
  }
  CHECK(left == 0, "%d pipelined requests did not complete", left);
  long long bad = 0;
  for (int k = 0; k < NREQ; k++) {
    loom_redop_t op = k % 3 == 2 ? LOOM_AVG : LOOM_SUM;
    for (int64_t i = 0; i < count + k; i++) {
      double want = reduced(t[k].dtype, op, n, i, 20 + k);
      bad += k % 2 ? ((uint16_t *)t[k].data)[i] != loom_f32_to_f16((float)want)
                   : ((float *)t[k].data)[i] != (float)want;
    }
  }
  CHECK(bad == 0, "pipelined requests in flight together: %lld wrong elements", bad);
  loom_request_t *x = NULL, *y = NULL;
  fill(&t[0], me, 40);
  fill(&t[1], me, 41);
  OK(loom_iallreduce(g, &t[0], &t[0], LOOM_SUM, &x));
  OK(loom_iallreduce(g, &t[1], &t[1], LOOM_SUM, &y));
  OK(loom_wait(me % 2 ? &y : &x));
  OK(loom_wait(me % 2 ? &x : &y));
  bad = 0;
  for (int64_t i = 0; i < count; i++) {
    bad += ((float *)t[0].data)[i] != (float)reduced(LOOM_F32, LOOM_SUM, n, i, 40);
    bad +=
        ((uint16_t *)t[1].data)[i] != loom_f32_to_f16((float)reduced(LOOM_F16, LOOM_SUM, n, i, 41));
  }
  CHECK(bad == 0, "pipelined requests in opposite wait orders: %lld wrong elements", bad);
  for (int k = 0; k < NREQ; k++) {
    loom_tensor_free(&t[k]);
  }
}

// Ordered reductions of several pipeline chunks (see the top comment).
static void t_pipelined(const loom_group_t *g) {
  int n = loom_group_size(g);
  // 2 (2 * 131072 + 1) + 1 elements: at np 2 the blocks are 262146 and 262145, so with chunks
  // of 131072 or 262144 elements the last chunk is 2 elements on rank 0 and 1 on rank 1.
  int64_t count = 524291;
  t_allreduce(g, LOOM_F32, LOOM_SUM, count, 1, 2);
  t_allreduce(g, LOOM_F32, LOOM_AVG, count + 1, 0, 0);
  t_allreduce(g, LOOM_F16, LOOM_SUM, count + 2, 1, 1);
  t_allreduce(g, LOOM_BF16, LOOM_AVG, count, 0, 2);
  t_reduce_scatter(g, LOOM_F32, LOOM_SUM, count, NULL, 1);
  int64_t *rc = malloc(sizeof(int64_t) * (size_t)n), total = 0;
  for (int r = 0; r < n; r++) { // zeros, and blocks one element past a chunk boundary
    rc[r] = r % 2 == 1 || n == 1 ? 262145 + r : 0;
    total += rc[r];
  }
  t_reduce_scatter(g, LOOM_F32, LOOM_SUM, total, rc, 2);
  t_reduce_scatter(g, LOOM_BF16, LOOM_SUM, total, rc, 0);
  free(rc);
  // Pooled scratch passed between dtypes of 1, 8 and 4 bytes (chunks of different lengths).
  t_reduce_scatter(g, LOOM_I8, LOOM_SUM, 3 * count + 1, NULL, 1);
  t_reduce_scatter(g, LOOM_I64, LOOM_MAX, count, NULL, 2);
  t_reduce_scatter(g, LOOM_F32, LOOM_SUM, count + 3, NULL, 0);
  t_identity(g, LOOM_F32, LOOM_SUM, count);
  t_pipelines(g, count);
}

// ---- suites -------------------------------------------------------------------------------------

// Barriers. Non-blocking: the last rank enters only after every other rank has started its
// ibarrier, found it not complete, and told it so (a point-to-point message), so a barrier that
// completed before every member arrived fails; then all complete. Blocking: the last rank
// enters 50 ms late, and no member may leave before it entered (one host, one clock).
static void t_barrier(const loom_group_t *g) {
  const int n = loom_group_size(g), me = loom_group_rank(g), last = n - 1;
  int64_t one = 1;
  loom_tensor_t note = test_tensor(LOOM_I32, 1, &one, "barrier.note");
  loom_request_t *req = NULL;
  int done = 0;
  if (me != last) {
    OK(loom_ibarrier(g, &req));
    OK(loom_test(&req, &done));
    CHECK(!done && req != NULL,
          "world rank %d (group rank %d): ibarrier complete before group "
          "rank %d entered",
          world_rank, me, last);
    ((int32_t *)note.data)[0] = me;
    OK(loom_send(g, &note, last, 77));
  } else {
    for (int r = 0; r < last; r++) {
      OK(loom_recv(g, &note, r, 77));
      CHECK(((int32_t *)note.data)[0] == r, "note from rank %d reads %d", r,
            ((int32_t *)note.data)[0]);
    }
    OK(loom_ibarrier(g, &req));
  }
  while (req) { // loom_test releases the request when done
    OK(loom_test(&req, &done));
  }
  CHECK(done == 1, "ibarrier never completed");

  loom_tensor_t t = test_tensor(LOOM_I64, 1, &one, "barrier.t");
  struct timespec ts;
  if (me == last) {
    struct timespec nap = {0, 50000000};
    nanosleep(&nap, NULL);
  }
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t entered = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  OK(loom_barrier(g));
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t left = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  ((int64_t *)t.data)[0] = entered;
  OK(loom_broadcast(g, &t, last)); // when the last rank entered
  CHECK(left >= ((int64_t *)t.data)[0],
        "world rank %d (group rank %d) left the barrier %.3f ms before group rank %d entered it",
        world_rank, me, (double)(((int64_t *)t.data)[0] - left) / 1e6, last);
  TEST_FREE(&note, &t);
}

static void suite(const loom_group_t *g, int big) {
  int n = loom_group_size(g);
  const int64_t counts[] = {0, 1, 7, 1000};
  for (int d = 0; d < NDTYPES; d++) {
    loom_dtype_t dt = all_dtypes[d];
    for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
      if (op == LOOM_AVG && !(dt == LOOM_F32 || dt == LOOM_F16 || dt == LOOM_BF16)) {
        continue;
      }
      for (int c = 0; c < 4; c++) {
        t_allreduce(g, dt, (loom_redop_t)op, counts[c], c == 2, c % 3);
        t_reduce_scatter(g, dt, (loom_redop_t)op, counts[c] + n / 2, NULL, c % 3);
      }
      // explicit uneven counts with zeros
      int64_t *rc = malloc(sizeof(int64_t) * (size_t)n), total = 0;
      for (int r = 0; r < n; r++) {
        rc[r] = r % 2 == 0 && n > 1 ? 0 : 3 + r * 5 + op;
        total += rc[r];
      }
      t_reduce_scatter(g, dt, (loom_redop_t)op, total, rc, op % 3);
      free(rc);
    }
    for (int c = 0; c < 4; c++) {
      t_allgather(g, dt, counts[c], NULL, c % 3);
    }
    int64_t *gc = malloc(sizeof(int64_t) * (size_t)n);
    for (int r = 0; r < n; r++) {
      gc[r] = pair_count(r, r + 1, d + 11);
    }
    t_allgather(g, dt, 0, gc, d % 3);
    free(gc);
    for (int root = 0; root < n; root++) {
      t_broadcast(g, dt, root == 0 ? 0 : 7 + root, root, root % 3);
    }
    t_alltoall(g, dt, d % 3, 0, 0, d % 3);
    t_alltoall(g, dt, 7, 0, 0, (d + 2) % 3); // with --chunk 3: point to point, in 3 + 3 + 1
    t_alltoall(g, dt, 0, 1, d + 1, (d + 1) % 3);
    t_ring(g, dt, d == 0 ? 0 : 7 * d, d % 2);
  }
  t_round_once(g, LOOM_F16);
  t_round_once(g, LOOM_BF16);
  t_identity(g, LOOM_F32, LOOM_SUM, 1001);
  t_identity(g, LOOM_F32, LOOM_AVG, 333);
  t_identity(g, LOOM_F16, LOOM_SUM, 1001);
  t_identity(g, LOOM_BF16, LOOM_SUM, 257);
  t_inflight(g);
  t_barrier(g);
  if (big) { // large counts on each path
    int64_t big_count = 1000003;
    t_allreduce(g, LOOM_F32, LOOM_SUM, big_count, 0, 1);
    t_allreduce(g, LOOM_F16, LOOM_AVG, big_count, 1, 2);
    t_allreduce(g, LOOM_I64, LOOM_SUM, big_count, 0, 0);
    t_allreduce(g, LOOM_BF16, LOOM_MAX, big_count, 1, 0);
    t_reduce_scatter(g, LOOM_F32, LOOM_SUM, big_count, NULL, 1);
    t_allgather(g, LOOM_F32, big_count / n, NULL, 0);
    t_broadcast(g, LOOM_I32, big_count, n - 1, 2);
    t_alltoall(g, LOOM_F32, big_count / n, 0, 0, 1);
    t_ring(g, LOOM_F32, big_count, 0);
    t_identity(g, LOOM_F32, LOOM_SUM, big_count);
    t_pipelined(g);
  }
}

// CUDA tensors over NCCL when every rank has a GPU of its own (a GPU machine; skipped here). The
// values are small integers, so NCCL's f16/bf16 arithmetic is exact too; AVG is left out (NCCL
// multiplies by 1/n before summing, which may differ from sum / n in the last bit).
static void device_suite(const loom_ctx_t *ctx) {
  int ok = loom_gpu(ctx) >= 0 && loom_cuda_device_count() >= loom_local_size(ctx), all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) {
    if (world_rank == 0) {
      printf("test_coll: device collectives skipped (no CUDA device for every rank)\n");
    }
    return;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  int n = loom_group_size(g);
  test_device = loom_gpu(ctx);
  const loom_dtype_t dts[] = {LOOM_F32, LOOM_F16, LOOM_BF16, LOOM_I32};
  for (int d = 0; d < 4; d++) {
    for (int op = 0; op < LOOM_REDOP_COUNT; op++) {
      if (op != LOOM_AVG) {
        t_allreduce(g, dts[d], (loom_redop_t)op, 1000 + d, d % 2, op % 3);
        t_reduce_scatter(g, dts[d], (loom_redop_t)op, 1000 * n + 1, NULL, op % 3);
      }
    }
    t_allreduce(g, dts[d], LOOM_SUM, 0, 0, 0);
    t_allgather(g, dts[d], 77, NULL, d % 3);
    int64_t *gc = malloc(sizeof(int64_t) * (size_t)n);
    for (int r = 0; r < n; r++) {
      gc[r] = pair_count(r, r + 1, d + 11);
    }
    t_allgather(g, dts[d], 0, gc, (d + 1) % 3);
    free(gc);
    t_broadcast(g, dts[d], 1001, n - 1, d % 3);
    t_alltoall(g, dts[d], 5, 0, 0, d % 3);
    t_alltoall(g, dts[d], 0, 1, d + 1, (d + 1) % 3);
    t_ring(g, dts[d], 1003, d % 2);
  }
  t_allreduce(g, LOOM_F32, LOOM_SUM, 1000003, 0, 1);
  test_device = LOOM_DEVICE_HOST;
  if (world_rank == 0) {
    printf("test_coll: device collectives on CUDA checked\n");
  }
}

// ---- bad arguments ------------------------------------------------------------------------------

// Calls on a group this rank is not in.
static void t_not_member(const loom_group_t *g) {
  int64_t one = 1;
  loom_tensor_t t = test_tensor(LOOM_F32, 1, &one, "t");
  loom_request_t *req = NULL;
  EXPECT_BAD(loom_allreduce(g, &t, &t, LOOM_SUM), "loom_allreduce", "not a member");
  EXPECT_BAD(loom_iallreduce(g, &t, &t, LOOM_SUM, &req), "loom_iallreduce", "not a member");
  CHECK(req == NULL, "a failed call returned a request");
  EXPECT_BAD(loom_broadcast(g, &t, 0), "loom_broadcast", "not a member");
  EXPECT_BAD(loom_barrier(g), "loom_barrier", "not a member");
  EXPECT_BAD(loom_ibarrier(g, &req), "loom_ibarrier", "not a member");
  CHECK(req == NULL, "a failed ibarrier returned a request");
  EXPECT_BAD(loom_send(g, &t, 0, 0), "loom_send", "not a member");
  loom_tensor_free(&t);
}

static void t_bad_args(const loom_ctx_t *ctx) {
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  int n = loom_group_size(g), me = loom_group_rank(g);
  int64_t four = 4 * n, seven = 7;
  loom_tensor_t a = test_tensor(LOOM_F32, 1, &four, "a"), b = test_tensor(LOOM_F32, 1, &four, "b");
  loom_tensor_t h = test_tensor(LOOM_F16, 1, &four, "h"), s = test_tensor(LOOM_F32, 1, &seven, "s");
  loom_tensor_t i32 = test_tensor(LOOM_I32, 1, &four, "i32");
  loom_request_t *req = NULL;

  EXPECT_BAD(loom_allreduce(NULL, &a, &b, LOOM_SUM), "loom_allreduce", "g is NULL");
  EXPECT_BAD(loom_allreduce(g, NULL, &b, LOOM_SUM), "loom_allreduce", "send is NULL");
  EXPECT_BAD(loom_allreduce(g, &a, &h, LOOM_SUM), "loom_allreduce", "expected dtype f32");
  EXPECT_BAD(loom_allreduce(g, &a, &s, LOOM_SUM), "loom_allreduce", "recv");
  EXPECT_BAD(loom_allreduce(g, &i32, &i32, LOOM_AVG), "loom_allreduce", "LOOM_AVG");
  EXPECT_BAD(loom_allreduce(g, &a, &b, (loom_redop_t)9), "loom_allreduce", "op is 9");
  EXPECT_BAD(loom_iallreduce(g, &a, &b, LOOM_SUM, NULL), "loom_iallreduce", "req is NULL");
  loom_tensor_t part = a; // overlaps a, shifted by one element
  part.data = (float *)a.data + 1;
  part.shape[0] = four - 1;
  loom_tensor_t a_short = a;
  a_short.shape[0] = four - 1;
  EXPECT_BAD(loom_allreduce(g, &a_short, &part, LOOM_SUM), "loom_allreduce", "overlaps");
  loom_tensor_t dev = b; // same dtype, on a CUDA device
  dev.device = 0;
  EXPECT_BAD(loom_allreduce(g, &a, &dev, LOOM_SUM), "loom_allreduce", "one device");
  if (loom_cuda_device_count() == 0) {
    EXPECT_BAD_DEVICE(loom_allreduce(g, &dev, &dev, LOOM_SUM), "loom_allreduce", "");
  }

  int64_t *counts = calloc((size_t)n, sizeof(int64_t));
  counts[0] = 4 * n + 1; // does not sum to send's count
  EXPECT_BAD(loom_reduce_scatter(g, &a, &s, counts, LOOM_SUM), "loom_reduce_scatter", "sums to");
  counts[0] = -1;
  EXPECT_BAD(loom_reduce_scatter(g, &a, &s, counts, LOOM_SUM), "loom_reduce_scatter",
             "counts[0] = -1");
  EXPECT_BAD(loom_reduce_scatter(g, &a, &s, NULL, LOOM_SUM), "loom_reduce_scatter", "recv");
  EXPECT_BAD(loom_reduce_scatter(g, &a, &a, NULL, LOOM_SUM), "loom_reduce_scatter", "");
  EXPECT_BAD(loom_allgather(g, &a, &s), "loom_allgather", "group size x");
  EXPECT_BAD(loom_allgatherv(g, &a, &b, NULL), "loom_allgatherv", "counts is NULL");
  for (int r = 0; r < n; r++) {
    counts[r] = 4;
  }
  EXPECT_BAD(loom_allgatherv(g, &s, &a, counts), "loom_allgatherv", "send");
  EXPECT_BAD(loom_broadcast(g, &a, n), "loom_broadcast", "root = ");
  EXPECT_BAD(loom_broadcast(g, &a, -1), "loom_broadcast", "root = -1");
  if (n > 1) {
    EXPECT_BAD(loom_alltoall(g, &s, &s), "loom_alltoall", "multiple of the group size");
  }
  counts[me] = 3;
  EXPECT_BAD(loom_alltoallv(g, &a, counts, &b, counts), "loom_alltoallv", "send_counts sums to");
  EXPECT_BAD(loom_send(g, &a, n, 0), "loom_send", "peer = ");
  EXPECT_BAD(loom_recv(g, &a, 0, -3), "loom_recv", "tag = -3");
  EXPECT_BAD(loom_isend(g, &a, 0, 0, NULL), "loom_isend", "req is NULL");
  EXPECT_BAD(loom_barrier(NULL), "loom_barrier", "g is NULL");
  EXPECT_BAD(loom_ibarrier(g, NULL), "loom_ibarrier", "req is NULL");
  EXPECT_BAD(loom_wait(NULL), "loom_wait", "req is NULL");
  free(counts);

  // Nothing was sent by any of these: a correct call right after must work.
  fill(&a, me, 1);
  OK(loom_allreduce(g, &a, &b, LOOM_SUM));
  int bad = 0;
  for (int64_t i = 0; i < four; i++) {
    bad += ((float *)b.data)[i] != (float)reduced(LOOM_F32, LOOM_SUM, n, i, 1);
  }
  CHECK(bad == 0, "allreduce after bad calls: %d wrong", bad);
  (void)req;
  TEST_FREE(&a, &b, &h, &s, &i32);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  world_rank = loom_rank(ctx);
  my_node = loom_node(ctx);
  hier_mode = loom_tunable(ctx, "LOOM_HIER_ALLREDUCE");
  int64_t chunk = 0; // --chunk N: MPI transfers in pieces of at most N elements
  if (test_chunk_option("test_coll", argc, argv, world_rank, &chunk) != 0) {
    loom_finalize(ctx);
    return 2;
  }
  const int big = chunk == 0 || chunk >= 1000; // the large counts (see the top comment)
  const loom_group_kind_t kinds[] = {LOOM_GROUP_WORLD, LOOM_GROUP_NODE,      LOOM_GROUP_DP,
                                     LOOM_GROUP_EP,    LOOM_GROUP_EXPERT_DP, LOOM_GROUP_ATTN};
  for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++) {
    const loom_group_t *g = loom_group(ctx, kinds[k]);
    if (loom_group_rank(g) < 0) {
      t_not_member(g);
    } else {
      suite(g, big && kinds[k] == LOOM_GROUP_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD); // one group kind at a time, for readable failures
  }
  t_edge_values(loom_group(ctx, LOOM_GROUP_WORLD));
  t_bad_args(ctx);
  device_suite(ctx);

  int rc = check_exit_all("test_coll");
  loom_finalize(ctx);
  return rc;
}
