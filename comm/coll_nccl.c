/* coll_nccl.c — the device back end: collectives and point-to-point on CUDA tensors with NCCL,
 * on a per-group communicator and stream created on first use; requests complete on an event. */
#include "config.h"
#include "comm_internal.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctx.h"
#include "cuda/cuda_ctx.h"
#include "error.h"
#include "log.h"

// Ordering with compute: every operation first makes the group's stream wait for an event
// recorded on the calling thread's current stream (loom_cuda_stream: the legacy default stream
// unless a scheduler lane set its own), so it sees everything the kernels queued there wrote;
// the request completes when an event recorded after the operation on the
// group's stream has passed (loom_test polls it with cudaEventQuery).
//
// Reductions follow NCCL's arithmetic: f16/bf16 sums accumulate in the dtype (NCCL does not
// widen), unlike the host path, which sums in f32 and rounds once. Every NCCL algorithm gives
// each element one reducing rank (ring) or one root (tree), so all ranks still end identical.

// ---- the group's communicator -------------------------------------------------------------------

struct nccl_group {
  ncclComm_t comm;
  cudaStream_t stream; // the group's communication stream (non-blocking)
  cudaEvent_t ready;   // recorded on the current stream before each operation
  int device;          // CUDA device the communicator lives on
  int aborted;         // after an asynchronous NCCL error (atomic): comm is gone
  ncclResult_t why;    // that error
};

// After an asynchronous error (a peer or the network failed) NCCL's kernels of this
// communicator may never finish: abort it, so that they end and the device is usable for the
// rest of the process, instead of destroying it later (ncclCommDestroy waits for those kernels).
// Every later operation on the group is refused. The first caller aborts; others return.
static void abort_nccl_group(struct nccl_group *ng, ncclResult_t why) {
  if (__atomic_exchange_n(&ng->aborted, 1, __ATOMIC_ACQ_REL)) {
    return;
  }
  ng->why = why;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(ng->device);
  ncclCommAbort(ng->comm);
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
  LOOM_WARN(LOOM_SUB_COLL,
            "NCCL communicator on CUDA device %d failed (%s) and was aborted: every later device "
            "operation of its group fails",
            ng->device, ncclGetErrorString(why));
}

static void nccl_group_destroy(void *p) {
  struct nccl_group *ng = p;
  if (!ng) {
    return;
  }
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(ng->device);
  if (ng->comm && !__atomic_load_n(&ng->aborted, __ATOMIC_ACQUIRE)) {
    ncclCommDestroy(ng->comm); // an aborted one was freed by ncclCommAbort
  }
  if (ng->ready) {
    cudaEventDestroy(ng->ready);
  }
  if (ng->stream) {
    cudaStreamDestroy(ng->stream);
  }
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
  free(ng);
}

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

// The group's NCCL communicator on device. The first device operation of the group creates it
// (NCCL id from group rank 0, broadcast over the group's MPI communicator, ncclCommInitRank):
// that is collective, so with create = 0 (point-to-point, where only two ranks take part) a
// missing communicator is LOOM_ERR_STATE rather than a hang.
static loom_status_t get_nccl_group(const char *op, const loom_group_t *g, int device, int create,
                                    struct nccl_group **out) {
  loom_status_t status = LOOM_OK;
  struct nccl_group *ng = NULL;
  pthread_mutex_lock(&create_lock);
  if (g->nccl) {
    ng = g->nccl;
    if (__atomic_load_n(&ng->aborted, __ATOMIC_ACQUIRE)) {
      status = loom_error(NULL, LOOM_ERR_NCCL,
                          "%s: group %s's NCCL communicator was aborted after an asynchronous "
                          "error (%s): its device operations cannot run any more; stop the job "
                          "(NCCL_DEBUG=INFO tells what failed)",
                          op, loom_group_kind_name(g->kind), ncclGetErrorString(ng->why));
    } else if (ng->device != device) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: group %s communicates on CUDA device %d, but the tensors are on "
                          "device %d: use one device per rank",
                          op, loom_group_kind_name(g->kind), ng->device, device);
    }
    *out = ng;
    pthread_mutex_unlock(&create_lock);
    return status;
  }
  if (!create) {
    pthread_mutex_unlock(&create_lock);
    return loom_error(NULL, LOOM_ERR_STATE,
                      "%s: group %s has no NCCL communicator yet; creating one is collective: "
                      "run a device collective (e.g. loom_allreduce) on the group first",
                      op, loom_group_kind_name(g->kind));
  }
  struct {
    int rc; // ncclResult_t of ncclGetUniqueId on group rank 0
    ncclUniqueId id;
  } root = {0};
  if (g->rank == 0) {
    root.rc = (int)ncclGetUniqueId(&root.id);
  }
  LOOM_CHECK_MPI(NULL, MPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, g->comm));
  LOOM_CHECK_NCCL(NULL, (ncclResult_t)root.rc);
  ng = calloc(1, sizeof *ng);
  if (!ng) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate the NCCL state", op);
    goto fail;
  }
  ng->device = device;
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  LOOM_CHECK_NCCL(NULL, ncclCommInitRank(&ng->comm, g->size, root.id, g->rank));
  LOOM_CHECK_CUDA(NULL, cudaStreamCreateWithFlags(&ng->stream, cudaStreamNonBlocking));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&ng->ready, cudaEventDisableTiming));
  // The group is const to its users; its NCCL communicator is a cache the group owns (freed by
  // nccl_destroy when the groups are freed), so filling it in here casts the const away.
  struct loom_group *mutable_group = (struct loom_group *)g;
  mutable_group->nccl = ng;
  mutable_group->nccl_destroy = nccl_group_destroy;
  LOOM_INFO(LOOM_SUB_COLL, "group %s: NCCL communicator of %d ranks on CUDA device %d",
            loom_group_kind_name(g->kind), g->size, device);
  *out = ng;
  pthread_mutex_unlock(&create_lock);
  return LOOM_OK;
fail:
  nccl_group_destroy(ng);
  pthread_mutex_unlock(&create_lock);
  return status;
}

// ---- dtypes and ops -----------------------------------------------------------------------------

static ncclDataType_t nccl_dtype(loom_dtype_t dtype) {
  switch (dtype) {
  case LOOM_F16:
    return ncclFloat16;
  case LOOM_BF16:
    return ncclBfloat16;
  case LOOM_I8:
    return ncclInt8;
  case LOOM_U8:
    return ncclUint8;
  case LOOM_I32:
    return ncclInt32;
  case LOOM_I64:
    return ncclInt64;
  case LOOM_F32:
  default:
    return ncclFloat32;
  }
}

static ncclRedOp_t nccl_op(loom_redop_t op) {
  switch (op) {
  case LOOM_AVG:
    return ncclAvg;
  case LOOM_MAX:
    return ncclMax;
  case LOOM_MIN:
    return ncclMin;
  case LOOM_SUM:
  default:
    return ncclSum;
  }
}

// ---- requests -----------------------------------------------------------------------------------

struct nccl_req {
  cudaEvent_t done;      // recorded on the group's stream after the operation
  struct nccl_group *ng; // for asynchronous NCCL errors (it outlives its requests)
};

static void release_req(loom_request_t *r) {
  struct nccl_req *s = r->state;
  if (s) {
    if (s->done) {
      cudaEventDestroy(s->done);
    }
    free(s);
  }
  r->state = NULL;
}

static loom_status_t poll_req(loom_request_t *r, int block, int *done) {
  loom_status_t status = LOOM_OK;
  struct nccl_req *s = r->state;
  *done = 0;
  // Never cudaEventSynchronize: a rank that skipped the collective would block this one inside
  // the CUDA runtime for ever. A blocking wait polls instead (20 us apart), and loom_wait checks
  // the watchdog (LOOM_TIMEOUT) between polls.
  cudaError_t rc = cudaEventQuery(s->done);
  if (rc == cudaErrorNotReady && block) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  if (rc == cudaErrorNotReady) {
    ncclResult_t async = ncclSuccess;
    if (__atomic_load_n(&s->ng->aborted, __ATOMIC_ACQUIRE)) { // by another request's poll
      async = s->ng->why;
    } else {
      LOOM_CHECK_NCCL(NULL, ncclCommGetAsyncError(s->ng->comm, &async));
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      abort_nccl_group(s->ng, async);
      return loom_error(NULL, LOOM_ERR_NCCL,
                        "%s: NCCL failed asynchronously (%s): a peer or the network failed; the "
                        "group's communicator was aborted, so this and every later device "
                        "operation on the group fail; stop the job (NCCL_DEBUG=INFO tells more)",
                        r->op, ncclGetErrorString(async));
    }
    return LOOM_OK;
  }
  LOOM_CHECK_CUDA(NULL, rc);
  *done = 1;
fail:
  return status;
}

// An operation in progress: the device made current (and restored by end()), the group's
// communicator, its stream ordered after the default stream.
struct launch {
  int prev_device;
  struct nccl_group *ng;
};

static loom_status_t begin(loom_request_t *r, const loom_group_t *g, int device, int create,
                           struct launch *l) {
  loom_status_t status = LOOM_OK;
  l->prev_device = -1;
  l->ng = NULL;
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&l->prev_device));
  LOOM_CHECK(get_nccl_group(r->op, g, device, create, &l->ng));
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(l->ng->ready, loom_cuda_stream()));
  LOOM_CHECK_CUDA(NULL, cudaStreamWaitEvent(l->ng->stream, l->ng->ready, 0));
fail:
  return status;
}

// After the NCCL calls (status: how they went): the completion event and the poll hook.
static loom_status_t end(loom_request_t *r, struct launch *l, loom_status_t status) {
  struct nccl_req *s = NULL;
  if (status != LOOM_OK) {
    goto fail;
  }
  s = calloc(1, sizeof *s);
  if (!s) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate the request state", r->op);
    goto fail;
  }
  s->ng = l->ng;
  r->state = s;
  r->release = release_req;
  r->poll = poll_req;
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(s->done, l->ng->stream));
fail:
  if (l->prev_device >= 0) {
    cudaSetDevice(l->prev_device);
  }
  return status;
}

#define ELEM(p, i, es) ((char *)(p) + (size_t)(i) * (es))

// LOOM_ERR_NCCL for one call of a grouped sequence: what failed (call, block or peer i), why.
static loom_status_t grouped_error(const char *op, const char *what, int i, ncclResult_t rc) {
  return loom_error(NULL, LOOM_ERR_NCCL, "%s: %s %d failed: %s; set NCCL_DEBUG=INFO for details",
                    op, what, i, ncclGetErrorString(rc));
}

// ---- reductions ---------------------------------------------------------------------------------

loom_status_t loom_nccl_iallreduce(const loom_group_t *g, const void *send, void *recv,
                                   int64_t count, loom_dtype_t dtype, loom_redop_t op, int device,
                                   loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  struct launch l;
  LOOM_CHECK(begin(r, g, device, 1, &l));
  if (count > 0) {
    LOOM_CHECK_NCCL(NULL, ncclAllReduce(send, recv, (size_t)count, nccl_dtype(dtype), nccl_op(op),
                                        l.ng->comm, l.ng->stream));
  }
fail:
  return end(r, &l, status);
}

// Equal blocks: ncclReduceScatter. Variable blocks: one ncclReduce per block to its rank,
// grouped (the non-root ranks pass no receive buffer).
loom_status_t loom_nccl_ireduce_scatter(const loom_group_t *g, const void *send, void *recv,
                                        const int64_t *counts, loom_dtype_t dtype, loom_redop_t op,
                                        int device, loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  struct launch l;
  int n = g->size, equal = 1;
  size_t es = loom_dtype_size(dtype);
  for (int i = 1; i < n; i++) {
    equal = equal && counts[i] == counts[0];
  }
  LOOM_CHECK(begin(r, g, device, 1, &l));
  if (equal && counts[0] > 0) {
    LOOM_CHECK_NCCL(NULL, ncclReduceScatter(send, recv, (size_t)counts[0], nccl_dtype(dtype),
                                            nccl_op(op), l.ng->comm, l.ng->stream));
  } else if (!equal) {
    LOOM_CHECK_NCCL(NULL, ncclGroupStart());
    int64_t displ = 0;
    ncclResult_t nrc = ncclSuccess;
    for (int i = 0; i < n && status == LOOM_OK; i++) {
      if (counts[i] > 0 && (nrc = ncclReduce(ELEM(send, displ, es), i == g->rank ? recv : NULL,
                                             (size_t)counts[i], nccl_dtype(dtype), nccl_op(op), i,
                                             l.ng->comm, l.ng->stream)) != ncclSuccess) {
        status = grouped_error(r->op, "ncclReduce of block", i, nrc);
      }
      displ += counts[i];
    }
    LOOM_CHECK_NCCL(NULL, ncclGroupEnd());
  }
fail:
  return end(r, &l, status);
}

// ---- gathers, broadcast, all-to-all -------------------------------------------------------------

// counts NULL: ncclAllGather. Else one ncclBroadcast per rank's block, grouped.
loom_status_t loom_nccl_iallgatherv(const loom_group_t *g, const void *send, void *recv,
                                    int64_t count, const int64_t *counts, loom_dtype_t dtype,
                                    int device, loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  struct launch l;
  size_t es = loom_dtype_size(dtype);
  LOOM_CHECK(begin(r, g, device, 1, &l));
  if (!counts) {
    if (count > 0) {
      LOOM_CHECK_NCCL(NULL, ncclAllGather(send, recv, (size_t)count, nccl_dtype(dtype), l.ng->comm,
                                          l.ng->stream));
    }
  } else {
    LOOM_CHECK_NCCL(NULL, ncclGroupStart());
    int64_t displ = 0;
    ncclResult_t nrc = ncclSuccess;
    for (int i = 0; i < g->size && status == LOOM_OK; i++) {
      if (counts[i] > 0 &&
          (nrc = ncclBroadcast(send, ELEM(recv, displ, es), (size_t)counts[i], nccl_dtype(dtype), i,
                               l.ng->comm, l.ng->stream)) != ncclSuccess) {
        status = grouped_error(r->op, "ncclBroadcast of block", i, nrc);
      }
      displ += counts[i];
    }
    LOOM_CHECK_NCCL(NULL, ncclGroupEnd());
  }
fail:
  return end(r, &l, status);
}

loom_status_t loom_nccl_ibroadcast(const loom_group_t *g, void *buf, int64_t count,
                                   loom_dtype_t dtype, int root, int device, loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  struct launch l;
  LOOM_CHECK(begin(r, g, device, 1, &l));
  if (count > 0) {
    LOOM_CHECK_NCCL(NULL, ncclBroadcast(buf, buf, (size_t)count, nccl_dtype(dtype), root,
                                        l.ng->comm, l.ng->stream));
  }
fail:
  return end(r, &l, status);
}

// Grouped ncclSend/ncclRecv with every rank (itself included); empty blocks are skipped on both
// sides, which agree on them.
loom_status_t loom_nccl_ialltoallv(const loom_group_t *g, const void *send, void *recv,
                                   int64_t block, const int64_t *send_counts,
                                   const int64_t *recv_counts, loom_dtype_t dtype, int device,
                                   loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  struct launch l;
  size_t es = loom_dtype_size(dtype);
  ncclDataType_t dt = nccl_dtype(dtype);
  LOOM_CHECK(begin(r, g, device, 1, &l));
  LOOM_CHECK_NCCL(NULL, ncclGroupStart());
  int64_t sd = 0, rd = 0;
  ncclResult_t nrc = ncclSuccess;
  for (int j = 0; j < g->size && status == LOOM_OK; j++) {
    int64_t sc = send_counts ? send_counts[j] : block, rc = recv_counts ? recv_counts[j] : block;
    if (sc > 0 && (nrc = ncclSend(ELEM(send, sd, es), (size_t)sc, dt, j, l.ng->comm,
                                  l.ng->stream)) != ncclSuccess) {
      status = grouped_error(r->op, "ncclSend to rank", j, nrc);
    }
    if (rc > 0 && status == LOOM_OK &&
        (nrc = ncclRecv(ELEM(recv, rd, es), (size_t)rc, dt, j, l.ng->comm, l.ng->stream)) !=
            ncclSuccess) {
      status = grouped_error(r->op, "ncclRecv from rank", j, nrc);
    }
    sd += sc;
    rd += rc;
  }
  LOOM_CHECK_NCCL(NULL, ncclGroupEnd());
fail:
  return end(r, &l, status);
}

// ---- point to point ----------------------------------------------------------------------------

// NCCL runs a group's operations in order on one stream, so a receive launched alone blocks that
// stream until its peer's send runs: a ring of irecv + isend would deadlock if each were launched
// as it is called. Device sends and receives are therefore queued and launched together, in one
// ncclGroupStart/ncclGroupEnd, when any of them is first tested or waited for (as MPI only moves
// data once a rank calls into it).

struct p2p_op {
  loom_request_t *r;
  struct nccl_group *ng;
  void *buf;
  int64_t count;
  loom_dtype_t dtype;
  int peer, is_send;
  struct p2p_op *next;
};

static pthread_mutex_t p2p_lock = PTHREAD_MUTEX_INITIALIZER;
static struct p2p_op *p2p_head; // queued, in call order

struct p2p_req {
  struct nccl_req base; // base.done: recorded on the caller's stream when queued (the send or
                        // receive waits for it at launch), recorded again after the launch
  struct p2p_op *op;    // while queued; NULL once launched
  loom_status_t launch; // how the launch went
};

// Remove op from the queue (p2p_lock held).
static void unqueue_locked(struct p2p_op *op) {
  for (struct p2p_op **p = &p2p_head; *p; p = &(*p)->next) {
    if (*p == op) {
      *p = op->next;
      return;
    }
  }
}

static void release_p2p(loom_request_t *r) {
  struct p2p_req *s = r->state;
  if (s) {
    pthread_mutex_lock(&p2p_lock);
    if (s->op) { // never launched (a failed call)
      unqueue_locked(s->op);
      free(s->op);
    }
    pthread_mutex_unlock(&p2p_lock);
    if (s->base.done) {
      cudaEventDestroy(s->base.done);
    }
    free(s);
  }
  r->state = NULL;
}

// Launch every queued operation in one NCCL group (p2p_lock held); each request records its
// completion event on its group's stream.
static loom_status_t launch_queued_locked(void) {
  loom_status_t status = LOOM_OK;
  struct p2p_op *ops = p2p_head;
  int prev_device = -1, grouped = 0;
  p2p_head = NULL;
  if (!ops) {
    return LOOM_OK;
  }
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&prev_device));
  LOOM_CHECK_NCCL(NULL, ncclGroupStart());
  grouped = 1;
  for (struct p2p_op *op = ops; op; op = op->next) {
    struct nccl_group *ng = op->ng;
    struct p2p_req *s = op->r->state;
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(ng->device));
    // After the work queued on the stream that was current where loom_isend/loom_irecv was
    // called (not the stream of the thread that tests first: another thread, or a lane's).
    LOOM_CHECK_CUDA(NULL, cudaStreamWaitEvent(ng->stream, s->base.done, 0));
    if (op->count > 0 && op->is_send) {
      LOOM_CHECK_NCCL(NULL, ncclSend(op->buf, (size_t)op->count, nccl_dtype(op->dtype), op->peer,
                                     ng->comm, ng->stream));
    } else if (op->count > 0) {
      LOOM_CHECK_NCCL(NULL, ncclRecv(op->buf, (size_t)op->count, nccl_dtype(op->dtype), op->peer,
                                     ng->comm, ng->stream));
    }
  }
  grouped = 0;
  LOOM_CHECK_NCCL(NULL, ncclGroupEnd());
  for (struct p2p_op *op = ops; op; op = op->next) {
    struct p2p_req *s = op->r->state;
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(op->ng->device));
    LOOM_CHECK_CUDA(NULL, cudaEventRecord(s->base.done, op->ng->stream));
  }
fail:
  if (grouped) {
    ncclGroupEnd();
  }
  while (ops) { // every request of the batch learns how the launch went
    struct p2p_op *next = ops->next;
    struct p2p_req *s = ops->r->state;
    s->op = NULL;
    s->launch = status;
    free(ops);
    ops = next;
  }
  if (prev_device >= 0) {
    cudaSetDevice(prev_device);
  }
  return status;
}

static loom_status_t poll_p2p(loom_request_t *r, int block, int *done) {
  struct p2p_req *s = r->state;
  *done = 0;
  pthread_mutex_lock(&p2p_lock);
  if (s->op) {
    launch_queued_locked();
  }
  pthread_mutex_unlock(&p2p_lock);
  if (s->launch != LOOM_OK) {
    return s->launch;
  }
  return poll_req(r, block, done);
}

static loom_status_t queue_p2p(const loom_group_t *g, void *buf, int64_t count, loom_dtype_t dtype,
                               int peer, int is_send, int device, loom_request_t *r) {
  struct nccl_group *ng = NULL;
  int prev_device = -1;
  loom_status_t status = get_nccl_group(r->op, g, device, 0, &ng);
  if (status != LOOM_OK) {
    return status;
  }
  struct p2p_req *s = calloc(1, sizeof *s);
  struct p2p_op *op = calloc(1, sizeof *op);
  if (!s || !op) {
    free(s);
    free(op);
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate the request state", r->op);
  }
  *op = (struct p2p_op){r, ng, buf, count, dtype, peer, is_send, NULL};
  s->base.ng = ng;
  // The launch waits for this point of the caller's current stream (the kernels that wrote buf).
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&prev_device));
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&s->base.done, cudaEventDisableTiming));
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(s->base.done, loom_cuda_stream()));
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(prev_device));
  s->op = op;
  r->state = s;
  r->release = release_p2p;
  r->poll = poll_p2p;
  pthread_mutex_lock(&p2p_lock);
  struct p2p_op **tail = &p2p_head;
  while (*tail) {
    tail = &(*tail)->next;
  }
  *tail = op;
  pthread_mutex_unlock(&p2p_lock);
  return LOOM_OK;
fail:
  if (s->base.done) {
    cudaEventDestroy(s->base.done);
  }
  if (prev_device >= 0) {
    cudaSetDevice(prev_device);
  }
  free(s);
  free(op);
  return status;
}

loom_status_t loom_nccl_isend(const loom_group_t *g, const void *buf, int64_t count,
                              loom_dtype_t dtype, int peer, int device, loom_request_t *r) {
  return queue_p2p(g, (void *)buf, count, dtype, peer, 1, device, r);
}

loom_status_t loom_nccl_irecv(const loom_group_t *g, void *buf, int64_t count, loom_dtype_t dtype,
                              int peer, int device, loom_request_t *r) {
  return queue_p2p(g, buf, count, dtype, peer, 0, device, r);
}

// ---- the compressed allreduce's exchanges (compress_coll_nccl.c) --------------------------------

loom_status_t loom_nccl_exchange_blocks(const char *op, const loom_group_t *g, int device,
                                        const void *send, void *recv, size_t bytes,
                                        int all_to_all) {
  loom_status_t status = LOOM_OK;
  struct nccl_group *ng = NULL;
  cudaEvent_t done = NULL;
  const cudaStream_t current = loom_cuda_stream();
  int prev_device = -1, grouped = 0;
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&prev_device));
  LOOM_CHECK(get_nccl_group(op, g, device, 1, &ng));
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  // The group's stream starts after everything queued on the current stream (the encodes).
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(ng->ready, current));
  LOOM_CHECK_CUDA(NULL, cudaStreamWaitEvent(ng->stream, ng->ready, 0));
  if (bytes > 0 && !all_to_all) {
    LOOM_CHECK_NCCL(NULL, ncclAllGather(send, recv, bytes, ncclUint8, ng->comm, ng->stream));
  } else if (bytes > 0) {
    LOOM_CHECK_NCCL(NULL, ncclGroupStart());
    grouped = 1;
    for (int j = 0; j < g->size; j++) {
      LOOM_CHECK_NCCL(NULL,
                      ncclSend(ELEM(send, j, bytes), bytes, ncclUint8, j, ng->comm, ng->stream));
      LOOM_CHECK_NCCL(NULL,
                      ncclRecv(ELEM(recv, j, bytes), bytes, ncclUint8, j, ng->comm, ng->stream));
    }
    grouped = 0;
    LOOM_CHECK_NCCL(NULL, ncclGroupEnd());
  }
fail:
  if (grouped) {
    ncclGroupEnd();
  }
  // The current stream (the decodes, the frees of the blocks) waits for whatever was queued on
  // the group's stream, success or not.
  if (done) {
    if (cudaEventRecord(done, ng->stream) == cudaSuccess) {
      cudaStreamWaitEvent(current, done, 0);
    }
    cudaEventDestroy(done);
  }
  if (prev_device >= 0) {
    cudaSetDevice(prev_device);
  }
  return status;
}
