/* comm_internal.h — what the comm/ files share: the request behind loom_request_t (MPI requests,
 * stage hooks, owned temporaries), the MPI dtype/op mapping, and the MPI and NCCL back ends. */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <limits.h>
#include <mpi.h>
#include <stdint.h>

#include "loom_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

// Elements per MPI message or MPI reduction call. MPI-3 counts are int, and some MPI internals
// keep byte counts in int too: longer transfers are split into pieces of at most this many
// elements (at most 1 GiB), and gathers and all-to-alls whose totals exceed it go point to point
// in such pieces. loom_mpi_chunk() is the limit in force: LOOM_MPI_CHUNK unless a test lowered it.
#define LOOM_MPI_CHUNK ((int64_t)1 << 27)
int64_t loom_mpi_chunk(void);
// Test hook: split MPI transfers into pieces of at most n elements (n <= 0 or above
// LOOM_MPI_CHUNK: back to LOOM_MPI_CHUNK), so that small tensors exercise the splitting. Call it
// with the same n on every rank before any transfer: whether a gather or an all-to-all fits one
// MPI call must be decided alike everywhere.
void loom_mpi_set_chunk(int64_t n);

// ---- watchdog and consistency checks (watchdog.c) ---------------------------------------------

// What the watchdog and LOOM_CHECK_CONSISTENCY call an operation.
enum loom_op_kind {
  LOOM_OPK_NONE = 0,
  LOOM_OPK_ALLREDUCE,
  LOOM_OPK_REDUCE_SCATTER,
  LOOM_OPK_ALLGATHER,
  LOOM_OPK_ALLGATHERV,
  LOOM_OPK_BROADCAST,
  LOOM_OPK_ALLTOALL,
  LOOM_OPK_ALLTOALLV,
  LOOM_OPK_COMPRESSED_ALLREDUCE,
  LOOM_OPK_SEND,
  LOOM_OPK_RECV,
  LOOM_OPK_MOE_FORWARD,
  LOOM_OPK_MOE_BACKWARD,
  LOOM_OPK_ATTN_SHIP,
  LOOM_OPK_ATTN_COMPUTE,
  LOOM_OPK_ATTN_FINISH,
  LOOM_OPK_ATTN_BACKWARD,
  LOOM_OPK_BARRIER,
  LOOM_OPK_COUNT
};

#define LOOM_OP_NAME_MAX 48 // characters of a tensor name kept for messages (with the NUL)

// One operation as the ranks of a group must agree on it. Fixed size and plain data: the
// consistency check gathers every member's descriptor in one allgather of bytes.
struct loom_op_desc {
  int32_t kind;                // enum loom_op_kind
  int32_t dtype;               // loom_dtype_t; -1: none
  int64_t count;               // elements every rank must agree on; -1: not compared
  int32_t redop;               // loom_redop_t; -1: none
  int32_t root;                // broadcast root, send/recv peer; -1: none
  int32_t group_kind;          // loom_group_kind_t of the group
  int32_t group_size;          //
  uint64_t name_hash;          // of the whole tensor name
  uint64_t extra;              // hash of what else must agree (counts arrays, compressor, seed)
  char name[LOOM_OP_NAME_MAX]; // the tensor name's first characters
  int32_t refused;             // a loom_status_t: this rank refused its call; 0: it makes it
  int32_t reserved;            // (zero)
};

// Fill d (the group fields are set by loom_watch_enter).
void loom_op_desc_set(struct loom_op_desc *d, enum loom_op_kind kind, const char *name, int dtype,
                      int64_t count, int redop, int root, uint64_t extra);
// FNV-1a over bytes, chained from h (start with 0).
uint64_t loom_watch_hash(uint64_t h, const void *p, size_t n);

// An operation being waited for on one rank.
struct loom_watch {
  const loom_group_t *g; // NULL: not watched
  struct loom_op_desc d; //
  uint64_t seq;          // its number among the operations this rank entered on g; 0: not counted
  int64_t start_ns;      // when this rank entered it (CLOCK_MONOTONIC_COARSE)
  int64_t deadline_ns;   // start + LOOM_TIMEOUT; 0: no timeout
  int64_t warn_ns;       // the next LOOM_STALL_WARN warning; 0: none
  int64_t next_ns;       // the earlier of the two: when loom_watch_check looks closer
  int64_t last_test_ns;  // loom_test: when it last looked (0: never)
  int extended;          // loom_test: the deadline was extended once after a long gap
  unsigned polls;        // waits look at the clock every few polls
};

// This rank enters operation d on g: w records it and its deadline. counted: a collective that
// every member enters in the same order (it is numbered on g and shown to the other members
// through g's watchdog window); send/recv are not.
void loom_watch_enter(struct loom_watch *w, const loom_group_t *g, const struct loom_op_desc *d,
                      int counted);
int64_t loom_watch_now_ns(void);
// The deadline passed: print one message naming the operation, the group, the ranks that arrived
// and those that did not, and the time waited, then MPI_Abort the job. Does not return.
void loom_watch_expired(struct loom_watch *w) __attribute__((noreturn));
// A stall warning or the deadline is due: abort when the deadline passed (loom_watch_expired),
// else warn (the lowest member that arrived names those that did not) and set the next warning.
void loom_watch_due(struct loom_watch *w);
// In wait loops: warn when LOOM_STALL_WARN is due, abort when w's deadline passed (reads the
// clock every 16th call).
static inline void loom_watch_check(struct loom_watch *w) {
  if (w && w->deadline_ns != 0 && (w->polls++ & 15u) == 0 && loom_watch_now_ns() >= w->next_ns) {
    loom_watch_due(w);
  }
}
// loom_test's check: as loom_watch_check, except that a deadline found passed after a long time
// without a test (a long computation between two tests, while MPI could not move the
// operation) is extended once, by min(LOOM_TIMEOUT, 10 s), to let the operation move first, and
// a stall warning waits for a test that follows the previous one within a second.
void loom_watch_test(struct loom_watch *w);
// MPI_Waitall, MPI_Waitany, MPI_Probe under the watchdog: exactly those calls when w is NULL or
// has no deadline; else the same polls (MPI_Testall, MPI_Testany, MPI_Iprobe) with
// loom_watch_check between them. Return the MPI code.
int loom_watch_waitall(struct loom_watch *w, int n, MPI_Request *reqs);
int loom_watch_waitany(struct loom_watch *w, int n, MPI_Request *reqs, int *index);
int loom_watch_probe(struct loom_watch *w, int source, int tag, MPI_Comm comm, MPI_Status *st);
// LOOM_CHECK_CONSISTENCY on w->g: every member gathers every member's descriptor (an allgather
// on the group's communicator, waited for under the watchdog, advancing the staged requests
// meanwhile, before the operation posts anything) and compares them; a difference is
// LOOM_ERR_INVALID_ARG on every rank, with a message naming both sides. LOOM_OK at once when the
// check is off.
loom_status_t loom_check_consistency(struct loom_watch *w);
// Under LOOM_CHECK_CONSISTENCY, a collective call that this rank refused (its arguments, or
// memory: status `why`) before it entered it still takes part in the members' check, as operation
// `kind` on tensor t (NULL: unnamed) marked refused, so that they return LOOM_ERR_INVALID_ARG
// naming this rank instead of waiting for it until LOOM_TIMEOUT. Leaves this thread's last error
// as it was, and returns why. Nothing more when the check is off, g is NULL, not usable or has
// one member.
loom_status_t loom_consistency_refuse(const loom_group_t *g, enum loom_op_kind kind,
                                      const loom_tensor_t *t, loom_status_t why);
// For alltoallv under LOOM_CHECK_CONSISTENCY: what each rank sends each peer must be what that
// peer expects to receive from it.
loom_status_t loom_check_alltoallv_counts(struct loom_watch *w, const int64_t *send_counts,
                                          const int64_t *recv_counts);

// ---- requests -------------------------------------------------------------------------------

#define LOOM_REQ_INLINE 8 // MPI requests held without a separate allocation
#define LOOM_REQ_TMP    4 // owned host temporaries

// One non-blocking operation. It runs in stages: the MPI requests in mpi[0..nmpi) are the stage
// in flight; when all have completed, step() runs (it may post the next stage's requests, or
// finish the result: unpack, scale). A NCCL operation has no MPI requests and sets poll().
//
// A request with a pending step is on a list that every loom_test/loom_wait advances, so the
// ranks may wait for their requests in different orders without a deadlock: a stage that a peer
// needs is posted while this rank waits for something else.
struct loom_request {
  const char *op; // the public function that started it, for messages
  MPI_Request *mpi;
  MPI_Status *sts; // the stage's statuses (cap_mpi): a failed one names its peer and error
  int nmpi, cap_mpi;
  int stage_coll; // the stage holds nonblocking collectives: MPI forbids cancelling them
  MPI_Request mpi_inline[LOOM_REQ_INLINE];
  MPI_Status sts_inline[LOOM_REQ_INLINE];
  // After every request of the stage completed: post the next stage (nmpi > 0 on return, and
  // step set again if there is a stage after it) or finish the result. NULL: nothing to do.
  loom_status_t (*step)(struct loom_request *r);
  // Non-MPI completion (a CUDA event): *done = 1 when complete; block: wait for it.
  loom_status_t (*poll)(struct loom_request *r, int block, int *done);
  // A non-MPI condition before the pending step (a copy to the host landing): when set, step
  // runs only once ready() sets *ok = 1, asked at every advance from any thread (with the list
  // lock held: it must not block); then ready is cleared. An error fails the request.
  loom_status_t (*ready)(struct loom_request *r, int *ok);
  void *aux; // what ready and poll read beside state (not freed with the request)
  void (*release)(struct loom_request *r);    // frees state (NULL: nothing beyond tmp[])
  void *state;                                // owned by the back end that set the hooks
  void *tmp[LOOM_REQ_TMP];                    // host buffers from loom_host_alloc, freed at the end
  loom_status_t error;                        // a failure met while another call advanced it
  char errmsg[256];                           // its message (the advancing thread's last error)
  struct loom_request *list_prev, *list_next; // the list of requests with a pending step
  int listed;
  struct loom_watch watch; // the operation, for the watchdog (watch.g NULL: not watched)
};

// A new empty request (no stage): NULL and a NOMEM error on allocation failure.
loom_request_t *loom_request_new(const char *op);
// Release everything the request owns (does not wait: only for completed or never-posted work).
void loom_request_free(loom_request_t *r);
// After the back end posted the first stage: put r on the list of requests with a pending step.
void loom_request_started(loom_request_t *r);
// A slot for one more MPI request of the current stage (grows the array); NULL on NOMEM.
MPI_Request *loom_request_slot(loom_request_t *r);
// The same for a nonblocking collective (on failure its stage is waited for, never cancelled).
MPI_Request *loom_request_coll_slot(loom_request_t *r);
// loom_host_alloc(bytes) owned by r (freed with it). bytes == 0 gives NULL and LOOM_OK.
loom_status_t loom_request_tmp(loom_request_t *r, size_t bytes, void **out);
// One round of progress from any thread (the scheduler's progress thread): advance every request
// with a pending stage and let Open MPI's progress engine run, so that messages in flight move
// while the caller's other threads compute. Needs MPI_THREAD_MULTIPLE; never blocks.
void loom_comm_progress(void);

// ---- sub-groups and buffers kept in a group (subgroups.c) ------------------------------------

// Reusable host buffers of a group (contents undefined between calls), by use.
enum { LOOM_GROUP_BUF_COMPRESS_BLOCKS, LOOM_GROUP_BUF_COMPRESS_FLOATS, LOOM_GROUP_BUFS };
// Buffer i of g with at least bytes bytes (grown as needed, freed with the group); NULL on NOMEM.
void *loom_group_buffer(const loom_group_t *g, int i, size_t bytes);
// g's node sub-group (the members on this rank's (emulated) node) and node-leader sub-group (rank
// 0 of every node; leaders->comm is MPI_COMM_NULL on the other ranks), made at the first call
// (collective over g) and kept with g.
loom_status_t loom_group_nodes(const loom_group_t *g, const loom_group_t **node,
                               const loom_group_t **leaders);
// The rails of g for the hierarchical allreduce: when g spans two nodes or more with the same
// number (two or more) of its members on each, *node is this rank's node sub-group and *rail the
// members with this rank's index within their nodes, one per node in node order; else both
// NULL. Decided at the first call (an allgather of the members' nodes waited for under w, then
// the splits: collective over g) and kept with g.
loom_status_t loom_group_rails(const loom_group_t *g, struct loom_watch *w,
                               const loom_group_t **node, const loom_group_t **rail);

// ---- MPI dtypes and reduction ops (redop.c) ---------------------------------------------------

// The MPI datatype carrying dtype (f16 and bf16 travel as MPI_UINT16_T).
MPI_Datatype loom_mpi_datatype(loom_dtype_t dtype);
// The MPI_Op for op on dtype: the predefined ops for f32 and integers, user-defined ops (created
// once, freed at MPI_Finalize) comparing f16/bf16 through f32 for MAX and MIN. SUM on f16/bf16
// and AVG have no MPI op: they go through the ordered reduction of coll_mpi.c.
loom_status_t loom_mpi_op(loom_dtype_t dtype, loom_redop_t op, MPI_Op *out);
// 1 for f32, f16, bf16.
int loom_dtype_is_float(loom_dtype_t dtype);
const char *loom_redop_name(loom_redop_t op); // "sum", "avg", "max", "min" or "invalid"
// acc[i] = acc[i] op x[i] for n elements of dtype. SUM and AVG add (integers wrap); f16/bf16
// compute in f32 and round each call, so sums that must round once are accumulated as f32.
// MAX and MIN propagate NaN.
void loom_reduce_into(loom_dtype_t dtype, loom_redop_t op, void *acc, const void *x, int64_t n);

// ---- argument checks shared with fusion.c (coll.c) -------------------------------------------

// g non-NULL and this rank a member.
loom_status_t loom_comm_check_group(const char *op, const loom_group_t *g);
// redop in range; AVG only on floating dtypes.
loom_status_t loom_comm_check_redop(const char *op, loom_redop_t redop, loom_dtype_t dtype);
// The back end for t's device exists (host always; CUDA with NCCL, on a visible device).
loom_status_t loom_comm_check_backend(const char *op, const char *name, const loom_tensor_t *t);

// ---- host back end (coll_mpi.c): arguments already validated, counts in elements -------------

loom_status_t loom_mpi_iallreduce(const loom_group_t *g, const void *send, void *recv,
                                  int64_t count, loom_dtype_t dtype, loom_redop_t op,
                                  loom_request_t *r);
// counts (group size) are the block sizes; recv receives counts[rank].
loom_status_t loom_mpi_ireduce_scatter(const loom_group_t *g, const void *send, void *recv,
                                       const int64_t *counts, loom_dtype_t dtype, loom_redop_t op,
                                       loom_request_t *r);
// counts NULL: every rank contributes count elements (allgather); else counts[i] from rank i.
loom_status_t loom_mpi_iallgatherv(const loom_group_t *g, const void *send, void *recv,
                                   int64_t count, const int64_t *counts, loom_dtype_t dtype,
                                   loom_request_t *r);
// A barrier over g's communicator (host synchronisation, whatever the group's device).
loom_status_t loom_mpi_ibarrier(const loom_group_t *g, loom_request_t *r);
loom_status_t loom_mpi_ibroadcast(const loom_group_t *g, void *buf, int64_t count,
                                  loom_dtype_t dtype, int root, loom_request_t *r);
// send_counts NULL: equal blocks of block elements; else the per-rank counts.
loom_status_t loom_mpi_ialltoallv(const loom_group_t *g, const void *send, void *recv,
                                  int64_t block, const int64_t *send_counts,
                                  const int64_t *recv_counts, loom_dtype_t dtype,
                                  loom_request_t *r);
// The group's private point-to-point communicator and the first of two tags reserved for one
// operation: every member calls it once per operation, in the same order, so that stages posted
// later (from a step hook, in whatever order requests are advanced) still match by tag. The
// first call on a group creates the communicator, waiting under the watchdog as w.
loom_status_t loom_mpi_collective_tags(const loom_group_t *g, MPI_Comm *comm, int *tag,
                                       struct loom_watch *w);
// Post a send (is_send) or a receive of count elements to or from peer on (comm, tag), in
// messages of at most loom_mpi_chunk() elements, as stages of r.
loom_status_t loom_mpi_post_p2p(loom_request_t *r, int is_send, const void *buf, int64_t count,
                                loom_dtype_t dtype, int peer, int tag, MPI_Comm comm);
loom_status_t loom_mpi_isend(const loom_group_t *g, const void *buf, int64_t count,
                             loom_dtype_t dtype, int peer, int tag, loom_request_t *r);
loom_status_t loom_mpi_irecv(const loom_group_t *g, void *buf, int64_t count, loom_dtype_t dtype,
                             int peer, int tag, loom_request_t *r);

// ---- device back end (coll_nccl.c, compiled with NCCL) ------------------------------------------

#ifdef LOOM_HAVE_NCCL
// Same contracts as the MPI functions; device is the CUDA device of every tensor of the call.
loom_status_t loom_nccl_iallreduce(const loom_group_t *g, const void *send, void *recv,
                                   int64_t count, loom_dtype_t dtype, loom_redop_t op, int device,
                                   loom_request_t *r);
loom_status_t loom_nccl_ireduce_scatter(const loom_group_t *g, const void *send, void *recv,
                                        const int64_t *counts, loom_dtype_t dtype, loom_redop_t op,
                                        int device, loom_request_t *r);
loom_status_t loom_nccl_iallgatherv(const loom_group_t *g, const void *send, void *recv,
                                    int64_t count, const int64_t *counts, loom_dtype_t dtype,
                                    int device, loom_request_t *r);
loom_status_t loom_nccl_ibroadcast(const loom_group_t *g, void *buf, int64_t count,
                                   loom_dtype_t dtype, int root, int device, loom_request_t *r);
loom_status_t loom_nccl_ialltoallv(const loom_group_t *g, const void *send, void *recv,
                                   int64_t block, const int64_t *send_counts,
                                   const int64_t *recv_counts, loom_dtype_t dtype, int device,
                                   loom_request_t *r);
// NCCL has no tags: messages between two ranks match in the order they were posted.
loom_status_t loom_nccl_isend(const loom_group_t *g, const void *buf, int64_t count,
                              loom_dtype_t dtype, int peer, int device, loom_request_t *r);
loom_status_t loom_nccl_irecv(const loom_group_t *g, void *buf, int64_t count, loom_dtype_t dtype,
                              int peer, int device, loom_request_t *r);
// The exchanges of the compressed allreduce of device tensors, in the calling thread's current
// stream's order (no request, no host wait): the group's stream waits for the current stream,
// runs the exchange, and the current stream waits for the group's stream (also after a failure,
// so that buffers freed on the current stream outlive the exchange). Blocks of bytes bytes;
// all_to_all: block j of send goes to rank j (grouped ncclSend/ncclRecv); else send's one block
// goes to every rank (ncclAllGather). Block j of recv comes from rank j.
loom_status_t loom_nccl_exchange_blocks(const char *op, const loom_group_t *g, int device,
                                        const void *send, void *recv, size_t bytes, int all_to_all);
#endif

#ifdef __cplusplus
}
#endif
#endif
