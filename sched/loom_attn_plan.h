/* loom_attn_plan.h — the core attention balancer (DistCA's CAD) as a pure function: documents'
 * causal attention cut into query-shard tasks and placed on attention servers to even the load. */
#ifndef LOOM_ATTN_PLAN_H
#define LOOM_ATTN_PLAN_H

#include <stdint.h>

#include "loom_core.h"
#include "loom_attn.h" // loom_attn_doc_t, loom_attn_task_t
#include "loom_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

// Nothing here calls MPI: every rank passes the same documents and gets the same plan.
//
// Cost model. Core attention of query rows [q_lo, q_hi) of a document of length L reads the
// key/value prefix [0, q_hi) (causal, bottom-right aligned) and costs its (query, key) pairs:
// q * kv - q (q - 1) / 2 with q = q_hi - q_lo, kv = q_hi (row i sees i + 1 keys, so the pairs of
// pieces add up to the pairs of the whole). Without causality it reads the whole document:
// q * L pairs, kv = L. A task's cost is its pairs plus row_cost per query row (the options;
// 0 by default), which keeps costs additive over pieces too. Shipping a task to a rank other
// than its owner costs q * bytes_per_q_row plus kv * bytes_per_kv_row, a key/value prefix
// counted once per (document, server): several tasks of one document on one server share the
// longest prefix any of them reads.

// The plan: every query row of every document in exactly one task; tasks of one document never
// overlap; a document of length 0 has no task.
typedef struct loom_attn_plan {
  int ntasks;
  loom_attn_task_t *tasks;     // (ntasks) sorted by (doc, q_lo); owned by the plan
  double *load;                // (nranks) the cost each rank computes under the plan: causal
                               // pairs, plus row_cost per query row
  double max_over_mean;        // max load / mean load over the serving ranks (1 when nothing to do)
  double max_over_mean_before; // the same with every document on its owner, over the ranks that
                               // own documents (the imbalance without disaggregation)
  double bytes_moved;          // bytes shipped for the plan's tasks (see the cost model)
} loom_attn_plan_t;

typedef struct loom_attn_balance_opts {
  double tolerance;  // stop when max / mean <= 1 + tolerance (>= 0; default 0.1)
  int causal;        // 1: causal pairs (default); 0: full attention, q * L pairs
  int64_t min_shard; // never cut a piece shorter than this many query rows (>= 1; default 64):
                     // a document shorter than 2 * min_shard stays whole
  int servers_first; // ranks [servers_first, nranks) are dedicated attention servers: they own
                     // no documents, every task runs on them and the ranks below compute none;
                     // 0 or nranks (default 0): in-place, every rank trains and serves
  // Bytes of shipping one query row (Q out, O and its log-sum-exp back) and one key/value row
  // (K and V out). Defaults: one 64-wide f32 head, 3 x 4 x 64 = 768 and 2 x 4 x 64 = 512. Only
  // their ratio steers the plan; their scale is bytes_moved's. For the forward and backward
  // of loom_attn_exec (heads H, kv_heads Hkv, head_dim D, f32) set 4 (4 H D + H) and 4 (4 Hkv D).
  double bytes_per_q_row, bytes_per_kv_row;
  // What one query row costs besides its pairs, in pairs (0 to 1e12; default 0: pairs only). A task
  // of q rows then costs pairs + row_cost * q: the kernel's per-row work (softmax, output, LSE,
  // loading Q) and its per-document tiles, which dominate short documents. Measure it for a
  // head layout with loom_attn_measure_row_cost.
  double row_cost;
} loom_attn_balance_opts_t;

// The defaults above.
LOOM_API void loom_attn_balance_opts_init(loom_attn_balance_opts_t *o);

// Plan core attention of ndocs documents over nranks ranks (opts NULL: the defaults). Start
// from every document whole on its owner (in-place) or spread whole over the servers, largest
// first onto the least loaded (dedicated). Then, while the most loaded serving rank is above
// (1 + tolerance) x mean: take it and the least loaded one; the amount to move is the smaller
// of its excess over the mean and the other's shortfall. Candidates are its tasks whole and,
// for a task above that amount, its head [q_lo, a) or its tail [b, q_hi) cut where the piece's
// cost equals the amount (the root of a quadratic, to the nearest row, both parts at least
// min_shard rows). Of the pieces that do not overshoot, move the one that adds the fewest
// bytes per pair moved (ties: more pairs, then the lower task index, head before tail); when
// none fits, the smallest one that still lowers the pair's maximum. Stop when no move does
// (or after 16 (tasks + ranks) + 1024 moves, a guard against a long tail of tiny ones).
// Adjacent pieces of a document that end on one rank are merged. Deterministic: the same input
// gives the same plan. out is filled (free it with loom_attn_plan_free); on error it is empty
// and LOOM_ERR_INVALID_ARG names the bad argument (or LOOM_ERR_NOMEM).
LOOM_API loom_status_t loom_attn_balance(const loom_attn_doc_t *docs, int ndocs, int nranks,
                                         const loom_attn_balance_opts_t *opts,
                                         loom_attn_plan_t *out);

// Free a plan's arrays and zero it (NULL and an empty plan are fine).
LOOM_API void loom_attn_plan_free(loom_attn_plan_t *p);

// The (query, key) pairs of query rows [q_lo, q_hi) of a document of doc_len rows (see the cost
// model); 0 for an empty or out-of-range shard.
LOOM_API double loom_attn_task_cost(int64_t q_lo, int64_t q_hi, int64_t doc_len, int causal);

// ---- ping-pong of two nano-batches through the step scheduler ---------------------------------
//
// One nano-batch of an attention-server forward: its executor (one per nano-batch: each has its
// own plan and messages) and this rank's tensors (as for loom_attn_exec_forward).
typedef struct loom_attn_nano {
  loom_attn_exec_t *x;
  const loom_tensor_t *q, *k, *v;
  loom_tensor_t *out, *lse;
} loom_attn_nano_t;

// Add the forward of two nano-batches A and B to a step graph as six tasks, ids[] in this order:
// NAME.ship.A, NAME.ship.B (comm lane: pack and post the shipments and the receives),
// NAME.compute.A, NAME.compute.B (compute lane, A first: each runs once its shipments arrived),
// NAME.finish.A, NAME.finish.B (comm lane: complete when the results are in out and lse). So
// B's shipments travel while A's kernel runs (the scheduler's progress thread moves them) and
// A's results travel while B's runs; the timeline shows the six on their lanes. ship A depends
// on task `after` (-1: none); priority is the compute tasks' (A gets priority + 1, so at most
// INT_MAX - 1). The graph keeps pointers to nano[0] and nano[1] and the tensors they name: they
// must outlive it (the executors may be replanned and the tensors' contents change between steps).
// NAME: "attn" when NULL. Every rank adds the same tasks in the same order (the comm lane's order
// is collective).
LOOM_API loom_status_t loom_sched_add_attn_pingpong(loom_sched_t *s, loom_attn_nano_t nano[2],
                                                    int after, int priority, const char *name,
                                                    int ids[6]);

#ifdef __cplusplus
}
#endif
#endif
