/* coll.c — the public collectives: check every argument (nothing is sent on a bad call), then
 * start the operation on MPI (host tensors) or NCCL (CUDA tensors); blocking = start + wait. */
#include "config.h"
#include "loom_comm.h"

#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "comm_internal.h"
#include "ctx.h"
#include "error.h"
#include "memory.h"

// ---- argument checks ----------------------------------------------------------------------------

loom_status_t loom_comm_check_group(const char *op, const loom_group_t *g) {
  if (!g) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: g is NULL: pass a group from loom_group(ctx, kind)", op);
  }
  if (g->rank < 0 || g->size <= 0 || g->comm == MPI_COMM_NULL) {
    int world = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: world rank %d is not a member of group %s: call it only on ranks where "
                      "loom_group_rank(g) >= 0",
                      op, world, loom_group_kind_name(g->kind));
  }
  return LOOM_OK;
}

// t present and well formed; with first, of first's dtype and on first's device.
static loom_status_t check_tensor(const char *op, const char *name, const loom_tensor_t *t,
                                  const loom_tensor_t *first) {
  if (!t) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL: pass a tensor", op, name);
  }
  if (!first && loom_dtype_size(t->dtype) == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s has dtype %d, expected one of f32, f16, bf16, i8, u8, i32, i64", op,
                      name, (int)t->dtype);
  }
  if (!first && t->device < LOOM_DEVICE_HOST) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s has device %d, expected LOOM_DEVICE_HOST (-1) or a CUDA index", op,
                      name, t->device);
  }
  return loom_arg_tensor(op, name, t, first ? first->dtype : t->dtype,
                         first ? first->device : t->device);
}

static loom_status_t check_numel(const char *op, const char *name, const loom_tensor_t *t,
                                 int64_t want, const char *why) {
  if (loom_tensor_numel(t) == want) {
    return LOOM_OK;
  }
  char s[LOOM_SHAPE_STR_MAX];
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: %s is %s with %lld elements, expected %lld (%s)", op, name,
                    loom_shape_str(t, s), (long long)loom_tensor_numel(t), (long long)want, why);
}

// counts: n non-negative entries summing to want (the element count of what).
static loom_status_t check_counts(const char *op, const char *name, const int64_t *counts, int n,
                                  int64_t want, const char *what) {
  if (!counts) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is NULL: pass %d counts (one per group rank)", op, name, n);
  }
  int64_t sum = 0;
  for (int i = 0; i < n; i++) {
    if (counts[i] < 0) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s[%d] = %lld, expected a count >= 0", op,
                        name, i, (long long)counts[i]);
    }
    if (__builtin_add_overflow(sum, counts[i], &sum)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s overflows when summed", op, name);
    }
  }
  if (sum != want) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s sums to %lld, expected %lld (the element count of %s)", op, name,
                      (long long)sum, (long long)want, what);
  }
  return LOOM_OK;
}

loom_status_t loom_comm_check_redop(const char *op, loom_redop_t redop, loom_dtype_t dtype) {
  if ((int)redop < 0 || redop >= LOOM_REDOP_COUNT) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: op is %d, expected LOOM_SUM, LOOM_AVG, LOOM_MAX or LOOM_MIN", op,
                      (int)redop);
  }
  if (redop == LOOM_AVG && !loom_dtype_is_float(dtype)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: op LOOM_AVG needs a floating dtype (f32, f16, bf16), got %s: use "
                      "LOOM_SUM and divide",
                      op, loom_dtype_name(dtype));
  }
  return LOOM_OK;
}

static loom_status_t check_rank(const char *op, const char *name, int value,
                                const loom_group_t *g) {
  if (value >= 0 && value < g->size) {
    return LOOM_OK;
  }
  return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s = %d, expected a rank of group %s in 0..%d",
                    op, name, value, loom_group_kind_name(g->kind), g->size - 1);
}

static loom_status_t check_req(const char *op, loom_request_t **req) {
  if (!req) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: req is NULL: pass where to store the request", op);
  }
  *req = NULL;
  return LOOM_OK;
}

// The back end for tensors on device: host (MPI) always; CUDA with NCCL.
loom_status_t loom_comm_check_backend(const char *op, const char *name, const loom_tensor_t *t) {
  if (t->device == LOOM_DEVICE_HOST) {
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_NCCL
  loom_status_t status = loom_device_check(t->device);
  if (status != LOOM_OK) { // say which call and tensor
    char why[LOOM_ERROR_MAX];
    snprintf(why, sizeof why, "%s", loom_last_error(NULL));
    status = loom_error(NULL, status, "%s: %s: %s", op, name, why);
  }
  return status;
#else
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "%s: %s is on CUDA device %d, but loom was built without NCCL: pass host "
                    "tensors, or reconfigure with --with-nccl",
                    op, name, t->device);
#endif
}

// Shorthand: return on the first failing check.
#define TRY(call)                                                                                  \
  do {                                                                                             \
    loom_status_t try_status_ = (call);                                                            \
    if (try_status_ != LOOM_OK) {                                                                  \
      return try_status_;                                                                          \
    }                                                                                              \
  } while (0)

// Starting a validated operation: a request, the back end's first stage, then *req.
#ifdef LOOM_HAVE_NCCL
#define DISPATCH(r, device, mpi_call, nccl_call)                                                   \
  ((device) == LOOM_DEVICE_HOST ? (mpi_call) : (nccl_call))
#else
#define DISPATCH(r, device, mpi_call, nccl_call) (mpi_call)
#endif

static loom_status_t started(loom_status_t status, loom_request_t *r, loom_request_t **req) {
  if (status != LOOM_OK) {
    loom_request_free(r);
    return status;
  }
  loom_request_started(r);
  *req = r;
  return LOOM_OK;
}

// Whether this thread's current collective call got as far as enter() (see refuse()).
static _Thread_local int entered_call;

// A collective call returns status: one that failed before entering (its arguments, or memory)
// still takes part in LOOM_CHECK_CONSISTENCY's check of the members, marked refused, so that
// they return an error naming this rank instead of waiting for it (loom_consistency_refuse).
// outer: entered_call as the caller's call had it (a call started by progress made while an
// outer call waits must not clear the outer call's mark), restored here.
static loom_status_t refuse(const loom_group_t *g, enum loom_op_kind kind, const loom_tensor_t *t,
                            loom_status_t status, int outer) {
  if (status != LOOM_OK && !entered_call) {
    loom_consistency_refuse(g, kind, t, status);
  }
  entered_call = outer;
  return status;
}

// This rank enters the operation d on g: the watchdog (LOOM_TIMEOUT) watches r from now on, and
// under LOOM_CHECK_CONSISTENCY the members compare their calls before anything is posted.
// counted: a collective (every member enters it, in the same order); send/recv are not.
static loom_status_t enter(loom_request_t *r, const loom_group_t *g, enum loom_op_kind kind,
                           const loom_tensor_t *t, int64_t count, int redop, int root,
                           uint64_t extra, int counted) {
  entered_call = 1;
  struct loom_op_desc d;
  loom_op_desc_set(&d, kind, t->name, (int)t->dtype, count, redop, root, extra);
  loom_watch_enter(&r->watch, g, &d, counted);
  return counted ? loom_check_consistency(&r->watch) : LOOM_OK;
}

static loom_status_t finish(loom_status_t status, loom_request_t **req) {
  return status == LOOM_OK ? loom_wait(req) : status;
}

// Counts of an even split of count over n ranks (the first count % n get one more).
static int64_t *even_counts(const char *op, int64_t count, int n) {
  int64_t *c = malloc(sizeof(int64_t) * (size_t)n);
  if (!c) {
    loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d counts", op, n);
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    c[i] = count / n + (i < count % n ? 1 : 0);
  }
  return c;
}

// ---- reductions ---------------------------------------------------------------------------------

static loom_status_t iallreduce_checked(const char *op, const loom_group_t *g,
                                        const loom_tensor_t *send, loom_tensor_t *recv,
                                        loom_redop_t redop, loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  TRY(check_tensor(op, "send", send, NULL));
  TRY(check_tensor(op, "recv", recv, send));
  int64_t count = loom_tensor_numel(send);
  TRY(check_numel(op, "recv", recv, count, "the count of send"));
  TRY(loom_arg_disjoint(op, "recv", recv, "send", send, 1));
  TRY(loom_comm_check_redop(op, redop, send->dtype));
  TRY(loom_comm_check_backend(op, "send", send));
  loom_request_t *r = loom_request_new(op);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  loom_status_t status = enter(r, g, LOOM_OPK_ALLREDUCE, send, count, redop, -1, 0, 1);
  if (status == LOOM_OK) {
    status = DISPATCH(r, send->device,
                      loom_mpi_iallreduce(g, send->data, recv->data, count, send->dtype, redop, r),
                      loom_nccl_iallreduce(g, send->data, recv->data, count, send->dtype, redop,
                                           send->device, r));
  }
  return started(status, r, req);
}

static loom_status_t iallreduce(const char *op, const loom_group_t *g, const loom_tensor_t *send,
                                loom_tensor_t *recv, loom_redop_t redop, loom_request_t **req) {
  const int outer = entered_call;
  entered_call = 0;
  return refuse(g, LOOM_OPK_ALLREDUCE, send, iallreduce_checked(op, g, send, recv, redop, req),
                outer);
}

loom_status_t loom_iallreduce(const loom_group_t *g, const loom_tensor_t *send, loom_tensor_t *recv,
                              loom_redop_t op, loom_request_t **req) {
  return iallreduce("loom_iallreduce", g, send, recv, op, req);
}

loom_status_t loom_allreduce(const loom_group_t *g, const loom_tensor_t *send, loom_tensor_t *recv,
                             loom_redop_t op) {
  loom_request_t *r = NULL;
  return finish(iallreduce("loom_allreduce", g, send, recv, op, &r), &r);
}

static loom_status_t ireduce_scatter_checked(const char *op, const loom_group_t *g,
                                             const loom_tensor_t *send, loom_tensor_t *recv,
                                             const int64_t *counts, loom_redop_t redop,
                                             loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  TRY(check_tensor(op, "send", send, NULL));
  TRY(check_tensor(op, "recv", recv, send));
  int64_t count = loom_tensor_numel(send);
  if (counts) {
    TRY(check_counts(op, "counts", counts, g->size, count, "send"));
  }
  int64_t *blocks = counts ? NULL : even_counts(op, count, g->size);
  if (!counts && !blocks) {
    return LOOM_ERR_NOMEM;
  }
  const int64_t *c = counts ? counts : blocks;
  loom_status_t status = check_numel(op, "recv", recv, c[g->rank],
                                     counts ? "counts[rank]" : "this rank's block of send");
  if (status == LOOM_OK) {
    status = loom_arg_disjoint(op, "recv", recv, "send", send, 0);
  }
  if (status == LOOM_OK) {
    status = loom_comm_check_redop(op, redop, send->dtype);
  }
  if (status == LOOM_OK) {
    status = loom_comm_check_backend(op, "send", send);
  }
  loom_request_t *r = status == LOOM_OK ? loom_request_new(op) : NULL;
  if (status == LOOM_OK && !r) {
    status = LOOM_ERR_NOMEM;
  }
  if (status == LOOM_OK) {
    status = enter(r, g, LOOM_OPK_REDUCE_SCATTER, send, count, redop, -1,
                   loom_watch_hash(0, c, sizeof(int64_t) * (size_t)g->size), 1);
  }
  if (status == LOOM_OK) {
    status = DISPATCH(r, send->device,
                      loom_mpi_ireduce_scatter(g, send->data, recv->data, c, send->dtype, redop, r),
                      loom_nccl_ireduce_scatter(g, send->data, recv->data, c, send->dtype, redop,
                                                send->device, r));
  }
  if (r) {
    status = started(status, r, req);
  }
  free(blocks);
  return status;
}

static loom_status_t ireduce_scatter(const char *op, const loom_group_t *g,
                                     const loom_tensor_t *send, loom_tensor_t *recv,
                                     const int64_t *counts, loom_redop_t redop,
                                     loom_request_t **req) {
  const int outer = entered_call;
  entered_call = 0;
  return refuse(g, LOOM_OPK_REDUCE_SCATTER, send,
                ireduce_scatter_checked(op, g, send, recv, counts, redop, req), outer);
}

loom_status_t loom_ireduce_scatter(const loom_group_t *g, const loom_tensor_t *send,
                                   loom_tensor_t *recv, const int64_t *counts, loom_redop_t op,
                                   loom_request_t **req) {
  return ireduce_scatter("loom_ireduce_scatter", g, send, recv, counts, op, req);
}

loom_status_t loom_reduce_scatter(const loom_group_t *g, const loom_tensor_t *send,
                                  loom_tensor_t *recv, const int64_t *counts, loom_redop_t op) {
  loom_request_t *r = NULL;
  return finish(ireduce_scatter("loom_reduce_scatter", g, send, recv, counts, op, &r), &r);
}

// ---- gathers ------------------------------------------------------------------------------------

// variable = 0: allgather (counts NULL); else allgatherv with counts.
static loom_status_t iallgatherv_checked(const char *op, const loom_group_t *g,
                                         const loom_tensor_t *send, loom_tensor_t *recv,
                                         const int64_t *counts, int variable,
                                         loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  TRY(check_tensor(op, "send", send, NULL));
  TRY(check_tensor(op, "recv", recv, send));
  int64_t count = loom_tensor_numel(send), total = 0;
  if (variable) {
    TRY(check_counts(op, "counts", counts, g->size, loom_tensor_numel(recv), "recv"));
    TRY(check_numel(op, "send", send, counts[g->rank], "counts[rank]"));
    total = loom_tensor_numel(recv);
  } else if (__builtin_mul_overflow(count, (int64_t)g->size, &total)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: group size x send count overflows", op);
  }
  TRY(check_numel(op, "recv", recv, total,
                  variable ? "the sum of counts" : "group size x the count of send"));
  TRY(loom_arg_disjoint(op, "recv", recv, "send", send, 0));
  TRY(loom_comm_check_backend(op, "send", send));
  loom_request_t *r = loom_request_new(op);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  loom_status_t status =
      variable ? enter(r, g, LOOM_OPK_ALLGATHERV, send, total, -1, -1,
                       loom_watch_hash(0, counts, sizeof(int64_t) * (size_t)g->size), 1)
               : enter(r, g, LOOM_OPK_ALLGATHER, send, count, -1, -1, 0, 1);
  if (status == LOOM_OK) {
    status =
        DISPATCH(r, send->device,
                 loom_mpi_iallgatherv(g, send->data, recv->data, count, counts, send->dtype, r),
                 loom_nccl_iallgatherv(g, send->data, recv->data, count, counts, send->dtype,
                                       send->device, r));
  }
  return started(status, r, req);
}

static loom_status_t iallgatherv(const char *op, const loom_group_t *g, const loom_tensor_t *send,
                                 loom_tensor_t *recv, const int64_t *counts, int variable,
                                 loom_request_t **req) {
  const int outer = entered_call;
  entered_call = 0;
  return refuse(g, variable ? LOOM_OPK_ALLGATHERV : LOOM_OPK_ALLGATHER, send,
                iallgatherv_checked(op, g, send, recv, counts, variable, req), outer);
}

loom_status_t loom_iallgather(const loom_group_t *g, const loom_tensor_t *send, loom_tensor_t *recv,
                              loom_request_t **req) {
  return iallgatherv("loom_iallgather", g, send, recv, NULL, 0, req);
}

loom_status_t loom_allgather(const loom_group_t *g, const loom_tensor_t *send,
                             loom_tensor_t *recv) {
  loom_request_t *r = NULL;
  return finish(iallgatherv("loom_allgather", g, send, recv, NULL, 0, &r), &r);
}

loom_status_t loom_iallgatherv(const loom_group_t *g, const loom_tensor_t *send,
                               loom_tensor_t *recv, const int64_t *counts, loom_request_t **req) {
  return iallgatherv("loom_iallgatherv", g, send, recv, counts, 1, req);
}

loom_status_t loom_allgatherv(const loom_group_t *g, const loom_tensor_t *send, loom_tensor_t *recv,
                              const int64_t *counts) {
  loom_request_t *r = NULL;
  return finish(iallgatherv("loom_allgatherv", g, send, recv, counts, 1, &r), &r);
}

// ---- barrier ------------------------------------------------------------------------------------

static loom_status_t ibarrier_checked(const char *op, const loom_group_t *g, loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  loom_request_t *r = loom_request_new(op);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  entered_call = 1;
  struct loom_op_desc d;
  loom_op_desc_set(&d, LOOM_OPK_BARRIER, NULL, -1, -1, -1, -1, 0);
  loom_watch_enter(&r->watch, g, &d, 1);
  loom_status_t status = loom_check_consistency(&r->watch);
  if (status == LOOM_OK) {
    status = loom_mpi_ibarrier(g, r);
  }
  return started(status, r, req);
}

static loom_status_t ibarrier(const char *op, const loom_group_t *g, loom_request_t **req) {
  const int outer = entered_call;
  entered_call = 0;
  return refuse(g, LOOM_OPK_BARRIER, NULL, ibarrier_checked(op, g, req), outer);
}

loom_status_t loom_ibarrier(const loom_group_t *g, loom_request_t **req) {
  return ibarrier("loom_ibarrier", g, req);
}

loom_status_t loom_barrier(const loom_group_t *g) {
  loom_request_t *r = NULL;
  return finish(ibarrier("loom_barrier", g, &r), &r);
}

// ---- broadcast ----------------------------------------------------------------------------------

static loom_status_t ibroadcast_checked(const char *op, const loom_group_t *g, loom_tensor_t *buf,
                                        int root, loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  TRY(check_tensor(op, "buf", buf, NULL));
  TRY(check_rank(op, "root", root, g));
  TRY(loom_comm_check_backend(op, "buf", buf));
  loom_request_t *r = loom_request_new(op);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  int64_t count = loom_tensor_numel(buf);
  loom_status_t status = enter(r, g, LOOM_OPK_BROADCAST, buf, count, -1, root, 0, 1);
  if (status == LOOM_OK) {
    status = DISPATCH(r, buf->device, loom_mpi_ibroadcast(g, buf->data, count, buf->dtype, root, r),
                      loom_nccl_ibroadcast(g, buf->data, count, buf->dtype, root, buf->device, r));
  }
  return started(status, r, req);
}

static loom_status_t ibroadcast(const char *op, const loom_group_t *g, loom_tensor_t *buf, int root,
                                loom_request_t **req) {
  const int outer = entered_call;
  entered_call = 0;
  return refuse(g, LOOM_OPK_BROADCAST, buf, ibroadcast_checked(op, g, buf, root, req), outer);
}

loom_status_t loom_ibroadcast(const loom_group_t *g, loom_tensor_t *buf, int root,
                              loom_request_t **req) {
  return ibroadcast("loom_ibroadcast", g, buf, root, req);
}

loom_status_t loom_broadcast(const loom_group_t *g, loom_tensor_t *buf, int root) {
  loom_request_t *r = NULL;
  return finish(ibroadcast("loom_broadcast", g, buf, root, &r), &r);
}

// ---- all-to-all ---------------------------------------------------------------------------------

// send_counts NULL: equal blocks (then recv_counts is NULL too).
static loom_status_t ialltoallv_checked(const char *op, const loom_group_t *g,
                                        const loom_tensor_t *send, const int64_t *send_counts,
                                        loom_tensor_t *recv, const int64_t *recv_counts,
                                        int variable, loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  TRY(check_tensor(op, "send", send, NULL));
  TRY(check_tensor(op, "recv", recv, send));
  int64_t count = loom_tensor_numel(send), block = 0;
  if (variable) {
    TRY(check_counts(op, "send_counts", send_counts, g->size, count, "send"));
    TRY(check_counts(op, "recv_counts", recv_counts, g->size, loom_tensor_numel(recv), "recv"));
    if (send_counts[g->rank] != recv_counts[g->rank]) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: send_counts[%d] = %lld but recv_counts[%d] = %lld: what a rank sends "
                        "itself must equal what it receives from itself",
                        op, g->rank, (long long)send_counts[g->rank], g->rank,
                        (long long)recv_counts[g->rank]);
    }
  } else {
    if (count % g->size != 0) {
      char s[LOOM_SHAPE_STR_MAX];
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: send is %s with %lld elements, expected a multiple of the group size "
                        "%d (equal blocks; use loom_alltoallv for variable ones)",
                        op, loom_shape_str(send, s), (long long)count, g->size);
    }
    block = count / g->size;
    TRY(check_numel(op, "recv", recv, count, "the count of send"));
  }
  TRY(loom_arg_disjoint(op, "recv", recv, "send", send, 0));
  TRY(loom_comm_check_backend(op, "send", send));
  loom_request_t *r = loom_request_new(op);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  loom_status_t status = variable ? enter(r, g, LOOM_OPK_ALLTOALLV, send, -1, -1, -1, 0, 1)
                                  : enter(r, g, LOOM_OPK_ALLTOALL, send, count, -1, -1, 0, 1);
  if (status == LOOM_OK && variable) {
    status = loom_check_alltoallv_counts(&r->watch, send_counts, recv_counts);
  }
  if (status == LOOM_OK) {
    status = DISPATCH(r, send->device,
                      loom_mpi_ialltoallv(g, send->data, recv->data, block, send_counts,
                                          recv_counts, send->dtype, r),
                      loom_nccl_ialltoallv(g, send->data, recv->data, block, send_counts,
                                           recv_counts, send->dtype, send->device, r));
  }
  return started(status, r, req);
}

static loom_status_t ialltoallv(const char *op, const loom_group_t *g, const loom_tensor_t *send,
                                const int64_t *send_counts, loom_tensor_t *recv,
                                const int64_t *recv_counts, int variable, loom_request_t **req) {
  const int outer = entered_call;
  entered_call = 0;
  return refuse(g, variable ? LOOM_OPK_ALLTOALLV : LOOM_OPK_ALLTOALL, send,
                ialltoallv_checked(op, g, send, send_counts, recv, recv_counts, variable, req),
                outer);
}

loom_status_t loom_ialltoall(const loom_group_t *g, const loom_tensor_t *send, loom_tensor_t *recv,
                             loom_request_t **req) {
  return ialltoallv("loom_ialltoall", g, send, NULL, recv, NULL, 0, req);
}

loom_status_t loom_alltoall(const loom_group_t *g, const loom_tensor_t *send, loom_tensor_t *recv) {
  loom_request_t *r = NULL;
  return finish(ialltoallv("loom_alltoall", g, send, NULL, recv, NULL, 0, &r), &r);
}

loom_status_t loom_ialltoallv(const loom_group_t *g, const loom_tensor_t *send,
                              const int64_t *send_counts, loom_tensor_t *recv,
                              const int64_t *recv_counts, loom_request_t **req) {
  return ialltoallv("loom_ialltoallv", g, send, send_counts, recv, recv_counts, 1, req);
}

loom_status_t loom_alltoallv(const loom_group_t *g, const loom_tensor_t *send,
                             const int64_t *send_counts, loom_tensor_t *recv,
                             const int64_t *recv_counts) {
  loom_request_t *r = NULL;
  return finish(ialltoallv("loom_alltoallv", g, send, send_counts, recv, recv_counts, 1, &r), &r);
}

// ---- point to point -----------------------------------------------------------------------------

static loom_status_t check_tag(const char *op, int tag) {
  int *ub = NULL, found = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
  int max = found && ub ? *ub : 32767;
  if (tag >= 0 && tag <= max) {
    return LOOM_OK;
  }
  return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: tag = %d, expected 0..%d (MPI_TAG_UB)", op,
                    tag, max);
}

static loom_status_t ip2p(const char *op, int is_send, const loom_group_t *g,
                          const loom_tensor_t *t, int peer, int tag, loom_request_t **req) {
  TRY(check_req(op, req));
  TRY(loom_comm_check_group(op, g));
  TRY(check_tensor(op, is_send ? "t (send)" : "t (recv)", t, NULL));
  TRY(check_rank(op, "peer", peer, g));
  TRY(check_tag(op, tag));
  TRY(loom_comm_check_backend(op, "t", t));
  loom_request_t *r = loom_request_new(op);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  int64_t count = loom_tensor_numel(t);
  (void)enter(r, g, is_send ? LOOM_OPK_SEND : LOOM_OPK_RECV, t, count, -1, peer, 0, 0); // uncounted
  loom_status_t status =
      is_send ? DISPATCH(r, t->device, loom_mpi_isend(g, t->data, count, t->dtype, peer, tag, r),
                         loom_nccl_isend(g, t->data, count, t->dtype, peer, t->device, r))
              : DISPATCH(r, t->device, loom_mpi_irecv(g, t->data, count, t->dtype, peer, tag, r),
                         loom_nccl_irecv(g, t->data, count, t->dtype, peer, t->device, r));
  return started(status, r, req);
}

loom_status_t loom_isend(const loom_group_t *g, const loom_tensor_t *t, int peer, int tag,
                         loom_request_t **req) {
  return ip2p("loom_isend", 1, g, t, peer, tag, req);
}

loom_status_t loom_irecv(const loom_group_t *g, loom_tensor_t *t, int peer, int tag,
                         loom_request_t **req) {
  return ip2p("loom_irecv", 0, g, t, peer, tag, req);
}

loom_status_t loom_send(const loom_group_t *g, const loom_tensor_t *t, int peer, int tag) {
  loom_request_t *r = NULL;
  return finish(ip2p("loom_send", 1, g, t, peer, tag, &r), &r);
}

loom_status_t loom_recv(const loom_group_t *g, loom_tensor_t *t, int peer, int tag) {
  loom_request_t *r = NULL;
  return finish(ip2p("loom_recv", 0, g, t, peer, tag, &r), &r);
}
