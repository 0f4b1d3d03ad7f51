/* loom_attn.h — attention servers: core attention of packed documents cut into query shards,
 * shipped to the rank a plan picked, computed there in one padding-free batch and returned. */
#ifndef LOOM_ATTN_H
#define LOOM_ATTN_H

#include <stdint.h>

#include "loom_comm.h"
#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// A document: the rank that holds its tokens, and its length. Rank r's rows (its q, k, v, out)
// are its documents packed in the order they appear in the docs array.
typedef struct loom_attn_doc {
  int owner;
  int64_t len;
} loom_attn_doc_t;

// A task: query rows [q_lo, q_hi) of document doc, computed by server for owner. With causal
// attention it reads the key/value prefix [0, q_hi) (bottom-right aligned); without, the whole
// document. The balancer (loom_attn_plan.h) makes them; any plan whose tasks cover every row of
// every document exactly once is valid.
typedef struct loom_attn_task {
  int doc;
  int64_t q_lo, q_hi;
  int owner, server;
} loom_attn_task_t;

typedef struct loom_attn_exec loom_attn_exec_t;

// Prepare the exchanges of a plan on group g (collective over g: every rank passes the same
// docs and tasks, heads H, key/value heads Hkv, head size D, causal, scale <= 0 for 1/sqrt(D)).
// The plan is checked (every row of every document in exactly one task, ranks in range, at most
// 2^31 - 1 rows per owner): LOOM_ERR_INVALID_ARG names what is wrong.
LOOM_API loom_status_t loom_attn_exec_create(const loom_group_t *g, const loom_attn_doc_t *docs,
                                             int ndocs, const loom_attn_task_t *tasks, int ntasks,
                                             int heads, int kv_heads, int head_dim, int causal,
                                             float scale, loom_attn_exec_t **out);
// Wait for its ship and finish requests first: one still in flight fails (LOOM_ERR_STATE).
LOOM_API void loom_attn_exec_destroy(loom_attn_exec_t *x);
// Take a new plan on the same group and shapes (every rank passes the same docs and tasks,
// checked as at create): keeps the communicator and the message and batch buffers, so that a
// training loop whose documents change every step makes its executors once. Not collective.
// LOOM_ERR_STATE between a ship and its finish; the next backward needs a forward of the new plan.
LOOM_API loom_status_t loom_attn_exec_replan(loom_attn_exec_t *x, const loom_attn_doc_t *docs,
                                             int ndocs, const loom_attn_task_t *tasks, int ntasks);

// Forward: this rank's q (T, H, D), k and v (T, Hkv, D) -> out (T, H, D) and lse (H, T), equal
// (within rounding) to loom_attention_forward on its own documents. In three phases so that
// two nano-batches can ping-pong (ship one while the other computes): ship posts the query
// shards and key/value prefixes (each prefix once per destination rank); compute receives what
// this rank serves (sizes checked: a message that does not match the plan is LOOM_ERR_CORRUPT),
// runs every task it serves in one varlen batch and posts the results; finish receives the
// results of this rank's documents. loom_attn_exec_forward runs the three. The server keeps
// its batch for the backward (memory: its tasks' q, k, v, out and lse). compute before a ship,
// finish before a compute, or a ship before the last finish is LOOM_ERR_STATE (it would wait for
// messages nobody sends). The ship posts the receives of the phase too, so messages land while
// the rank computes; the tasks a rank serves for itself never travel: compute reads them from
// the q, k, v given to the ship, which must stay unchanged until compute returns, and finish
// reads their results from the batch.
LOOM_API loom_status_t loom_attn_exec_ship(loom_attn_exec_t *x, const loom_tensor_t *q,
                                           const loom_tensor_t *k, const loom_tensor_t *v);
LOOM_API loom_status_t loom_attn_exec_compute(loom_attn_exec_t *x);
LOOM_API loom_status_t loom_attn_exec_finish(loom_attn_exec_t *x, loom_tensor_t *out,
                                             loom_tensor_t *lse);
// The ship and the finish as requests, for a step scheduler's comm lane (loom_sched.h; wait or
// test them like any loom_request_t): the ship's completes when the shipments this rank serves
// have arrived and its own have left, so that compute does not wait; the finish's completes
// when the results are in out and lse (out and lse must stay valid until then). Errors as for
// loom_attn_exec_ship and loom_attn_exec_finish.
LOOM_API loom_status_t loom_attn_exec_ship_start(loom_attn_exec_t *x, const loom_tensor_t *q,
                                                 const loom_tensor_t *k, const loom_tensor_t *v,
                                                 loom_request_t **req);
LOOM_API loom_status_t loom_attn_exec_finish_start(loom_attn_exec_t *x, loom_tensor_t *out,
                                                   loom_tensor_t *lse, loom_request_t **req);
LOOM_API loom_status_t loom_attn_exec_forward(loom_attn_exec_t *x, const loom_tensor_t *q,
                                              const loom_tensor_t *k, const loom_tensor_t *v,
                                              loom_tensor_t *out, loom_tensor_t *lse);
// Backward of the last forward: dout (T, H, D) -> dq (T, H, D), dk and dv (T, Hkv, D)
// (overwritten; three tensors apart, else LOOM_ERR_INVALID_ARG, as are out and lse of a forward;
// dq may be dout itself). A key/value prefix read by several tasks gets their gradients summed
// on the server (task order) and once more on the owner (server order): the same bits every time.
LOOM_API loom_status_t loom_attn_exec_backward(loom_attn_exec_t *x, const loom_tensor_t *dout,
                                               loom_tensor_t *dq, loom_tensor_t *dk,
                                               loom_tensor_t *dv);

// What the exchanges of the last forward and backward did on this rank.
typedef struct loom_attn_exec_stats {
  int tasks_served;    // tasks this rank computed
  double pairs_served; // their causal (query, key) pairs
  double bytes_sent;   // bytes this rank sent (forward and backward)
  double compute_ms;   // time in the attention kernels (forward + backward)
  double wait_ms;      // time waiting for messages
  double busy_ms;      // time inside the executor's calls (ship, compute, finish, backward):
                       // the kernels, the waits, packing, copying and MPI
} loom_attn_exec_stats_t;
LOOM_API void loom_attn_exec_stats(const loom_attn_exec_t *x, loom_attn_exec_stats_t *out);

// What one query row costs on this core besides its (query, key) pairs, in pairs: the attention
// balancer's row_cost (loom_attn_balance_opts_t) for heads query heads, kv_heads key/value
// heads of head_dim, causal or not. It times the CPU kernels' forward + backward (the fastest of
// 5 runs) on 256 rows as one document and as 64 documents of 4 rows, and solves
// time = per_pair * pairs + per_row * rows for per_row / per_pair (0 when the timer cannot tell
// them apart). heads x head_dim is at most 65536 (the ratio is per head: measure wider models
// with fewer heads). About 10-100 ms. The value depends on the core and its load: measure on
// one rank and broadcast, since every rank must plan with the same one.
LOOM_API loom_status_t loom_attn_measure_row_cost(int heads, int kv_heads, int head_dim, int causal,
                                                  double *row_cost);

#ifdef __cplusplus
}
#endif
#endif
