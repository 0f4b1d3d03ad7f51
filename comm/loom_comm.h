/* loom_comm.h — collectives on a loom group: blocking and non-blocking, MPI for host tensors and
 * NCCL for CUDA tensors, and fusion of many small tensors into buckets. Include loom.h instead. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Conventions for every collective below:
// - Every member of the group calls it, in the same order, with matching dtypes and counts. A
//   rank that is not a member of g gets LOOM_ERR_INVALID_ARG.
// - Tensors are contiguous; only their element count and dtype matter (any shape). Host tensors
//   travel over MPI; CUDA tensors over NCCL when loom was built with it (else
//   LOOM_ERR_UNSUPPORTED). All tensors of one call live on one device.
// - dtypes: f32, f16, bf16, i8, u8, i32, i64. On the host, reductions of f16 and bf16 accumulate
//   in f32 and round once. Sums are taken in the same order on every rank, so every rank ends
//   bitwise identical.
// - send may be the same tensor as recv only for allreduce ("in place").
// - CUDA tensors (NCCL): f16/bf16 sums accumulate in the dtype and LOOM_AVG is ncclAvg (NCCL's
//   rules, not the f32-then-round-once of the host path); send/recv need one device collective
//   on the group first (it creates the NCCL communicator), ignore tags, and are launched together
//   at the first loom_test/loom_wait.
// - Zero-length tensors are fine; counts need not divide by the group size where a counts
//   argument exists.

typedef enum loom_redop {
  LOOM_SUM = 0,
  LOOM_AVG, // sum / group size (floating dtypes only)
  LOOM_MAX,
  LOOM_MIN,
  LOOM_REDOP_COUNT
} loom_redop_t;

typedef struct loom_request loom_request_t;

// Wait for a non-blocking operation and release the request (*req becomes NULL).
LOOM_API loom_status_t loom_wait(loom_request_t **req);
// *done = 1 and the request is released (*req = NULL) when complete; otherwise *done = 0.
// Calling it between compute steps is what moves large messages along (MPI progress).
LOOM_API loom_status_t loom_test(loom_request_t **req, int *done);
// Wait for n requests (NULL entries are skipped); the first failure is returned.
LOOM_API loom_status_t loom_wait_all(loom_request_t **reqs, int n);

// ---- reductions -----------------------------------------------------------------------------

// recv = op over ranks of send (same count; in place allowed).
LOOM_API loom_status_t loom_allreduce(const loom_group_t *g, const loom_tensor_t *send,
                                      loom_tensor_t *recv, loom_redop_t op);
LOOM_API loom_status_t loom_iallreduce(const loom_group_t *g, const loom_tensor_t *send,
                                       loom_tensor_t *recv, loom_redop_t op, loom_request_t **req);

// Rank i receives block i of the reduction of send. counts (group size entries) gives each
// block's element count and must sum to send's count; NULL splits send as evenly as possible
// (the first count % n ranks get one more element).
LOOM_API loom_status_t loom_reduce_scatter(const loom_group_t *g, const loom_tensor_t *send,
                                           loom_tensor_t *recv, const int64_t *counts,
                                           loom_redop_t op);
LOOM_API loom_status_t loom_ireduce_scatter(const loom_group_t *g, const loom_tensor_t *send,
                                            loom_tensor_t *recv, const int64_t *counts,
                                            loom_redop_t op, loom_request_t **req);

// ---- gathers, broadcast, all-to-all -------------------------------------------------------------

// recv = concatenation of every rank's send in rank order (recv count = n * send count).
LOOM_API loom_status_t loom_allgather(const loom_group_t *g, const loom_tensor_t *send,
                                      loom_tensor_t *recv);
LOOM_API loom_status_t loom_iallgather(const loom_group_t *g, const loom_tensor_t *send,
                                       loom_tensor_t *recv, loom_request_t **req);
// As allgather with counts[i] elements from rank i (send count = counts[my rank]).
LOOM_API loom_status_t loom_allgatherv(const loom_group_t *g, const loom_tensor_t *send,
                                       loom_tensor_t *recv, const int64_t *counts);
LOOM_API loom_status_t loom_iallgatherv(const loom_group_t *g, const loom_tensor_t *send,
                                        loom_tensor_t *recv, const int64_t *counts,
                                        loom_request_t **req);
// Returns once every member of g has called it (MPI_Ibarrier on the group's communicator: a host
// synchronisation; device work already queued is not waited for). Watched by LOOM_TIMEOUT and
// LOOM_STALL_WARN, compared by LOOM_CHECK_CONSISTENCY like the other collectives.
LOOM_API loom_status_t loom_barrier(const loom_group_t *g);
LOOM_API loom_status_t loom_ibarrier(const loom_group_t *g, loom_request_t **req);
// buf on every rank = buf on group rank root.
LOOM_API loom_status_t loom_broadcast(const loom_group_t *g, loom_tensor_t *buf, int root);
LOOM_API loom_status_t loom_ibroadcast(const loom_group_t *g, loom_tensor_t *buf, int root,
                                       loom_request_t **req);
// Block i of send goes to rank i; block j of recv comes from rank j (equal blocks: the count
// must divide by the group size).
LOOM_API loom_status_t loom_alltoall(const loom_group_t *g, const loom_tensor_t *send,
                                     loom_tensor_t *recv);
LOOM_API loom_status_t loom_ialltoall(const loom_group_t *g, const loom_tensor_t *send,
                                      loom_tensor_t *recv, loom_request_t **req);
// Variable blocks: send_counts[i] elements to rank i, recv_counts[j] from rank j, packed in
// rank order; the counts must sum to the tensors' counts.
LOOM_API loom_status_t loom_alltoallv(const loom_group_t *g, const loom_tensor_t *send,
                                      const int64_t *send_counts, loom_tensor_t *recv,
                                      const int64_t *recv_counts);
LOOM_API loom_status_t loom_ialltoallv(const loom_group_t *g, const loom_tensor_t *send,
                                       const int64_t *send_counts, loom_tensor_t *recv,
                                       const int64_t *recv_counts, loom_request_t **req);

// ---- point to point -----------------------------------------------------------------------------

// peer is a group rank; tag >= 0.
LOOM_API loom_status_t loom_send(const loom_group_t *g, const loom_tensor_t *t, int peer, int tag);
LOOM_API loom_status_t loom_recv(const loom_group_t *g, loom_tensor_t *t, int peer, int tag);
LOOM_API loom_status_t loom_isend(const loom_group_t *g, const loom_tensor_t *t, int peer, int tag,
                                  loom_request_t **req);
LOOM_API loom_status_t loom_irecv(const loom_group_t *g, loom_tensor_t *t, int peer, int tag,
                                  loom_request_t **req);

// ---- fusion -------------------------------------------------------------------------------------

// A fusion buffer allreduces many tensors (typically gradients) by packing them, in the order
// given, into buckets of at most threshold bytes (0: LOOM_FUSION_THRESHOLD); a tensor larger
// than the threshold travels alone. The plan is kept while a call passes the same tensors (same
// data, dtype, device and shape, in the same order), and the staging buffers are reused.
typedef struct loom_fusion loom_fusion_t;

LOOM_API loom_status_t loom_fusion_create(loom_ctx_t *ctx, const loom_group_t *g, size_t threshold,
                                          loom_fusion_t **fusion);
// Allreduce every tensor in place (all of one dtype and device). Buckets move in pieces of
// 512 KiB, a few in flight at once, each packed just before it is sent and unpacked as it
// lands; the results are bitwise those of one allreduce per tensor.
LOOM_API loom_status_t loom_fusion_allreduce(loom_fusion_t *fusion, loom_tensor_t *const *tensors,
                                             int n, loom_redop_t op);
// Number of buckets the last call used (for logs and tests).
LOOM_API int loom_fusion_buckets(const loom_fusion_t *fusion);
LOOM_API void loom_fusion_destroy(loom_fusion_t *fusion);

#ifdef __cplusplus
}
#endif
#endif
