/* attn_exec.c — attention servers' transport and serving loop: ship query shards and key/value
 * prefixes to the planned server, run its tasks as one varlen batch, return outputs and grads. */
#include "config.h"

#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "attn_internal.h"
#include "comm_internal.h"
#include "error.h"
#include "loom_attn.h"
#include "loom_compute.h"

// Every message opens with this header; the payload is floats. The receiver computes from the
// plan what it must hold and rejects anything else (LOOM_ERR_CORRUPT).
#define MSG_MAGIC LOOM_ATTN_MSG_MAGIC
typedef struct msg_header {
  uint64_t magic, phase, ntasks, nfloats;
} msg_header_t;
_Static_assert(sizeof(msg_header_t) == LOOM_ATTN_MSG_HEADER, "attention message header");

enum { PH_SHIP = 1, PH_RETURN, PH_BSHIP, PH_BRETURN };
// x->notified[peer]: this phase's message to peer as its owner (shipment) or server (results) left.
enum { NOTIFIED_SERVER = 1, NOTIFIED_OWNER = 2 };

// The layout of the messages between one owner and one server: the tasks (plan order) and the
// documents whose key/value prefixes travel (first appearance), with their offsets.
typedef struct pair {
  int n, nkv;
  int *task;        // (n) task indices
  int64_t *q_off;   // (n) float offset of each task's query rows (forward ship; out in return)
  int *kv_doc;      // (nkv) documents
  int64_t *kv_rows; // (nkv) prefix rows shipped (the longest any task of the pair reads)
  int64_t *kv_off;  // (nkv) float offset of the k rows (v follows)
  int64_t q_floats, kv_floats;
} pair_t;

struct loom_attn_exec {
  MPI_Comm comm;
  const loom_group_t *g;       // the group of the plan
  struct loom_watch watch;     // the phase in progress, for the watchdog (LOOM_TIMEOUT)
  char name[LOOM_OP_NAME_MAX]; // the q tensor's name at the last ship (for compute)
  int np, me, H, Hkv, D, causal;
  int phase; // the forward's steps in order: 0 idle (finished), 1 shipped, 2 computed
  float scale;
  int ndocs, ntasks;
  loom_attn_doc_t *docs;
  loom_attn_task_t *tasks;
  int64_t *doc_row; // (ndocs) first row of each document in its owner's rows
  int64_t rows;     // this rank's rows
  pair_t *to;       // (np) this rank as owner, server s
  pair_t *from;     // (np) owner r, this rank as server
  // the server's batch (kept for the backward)
  int nserve;
  int *serve;             // (nserve) task indices, plan order
  int64_t *task_q;        // (ntasks) batch row of each task this rank serves
  int64_t *task_k;        // (ntasks) batch key row of each task this rank serves
  int *task_at, *task_kv; // (ntasks) a task's index and its document's key/value slot in its
                          // pair (the tasks of this rank's pairs: as owner or as server)
  int *doc_slot;          // (ndocs) scratch of make_pair: a document's slot in the pair, or -1
  int64_t bq, bk;         // batch rows
  int64_t cap_bq, cap_bk; // the rows the forward buffers hold
  int64_t cap_gq, cap_gk; // the rows the backward buffers hold
  int batch_ready;        // the batch holds the forward of the current plan (for the backward)
  float *Qb, *Kb, *Vb, *Ob, *Lb, *dOb, *dQb, *dKb, *dVb;
  int32_t *cu_q, *cu_k;
  // this rank's own q, k, v between ship and compute: the tasks it serves for itself are
  // read from them directly (no message to itself)
  const float *q_in, *k_in, *v_in;
  // messages: buffers kept between phases and steps, grown when a plan needs more
  uint8_t **sbuf; // (np) outgoing per peer
  size_t *scap;
  MPI_Request *sreq;
  uint8_t **rbuf; // (np) incoming per peer: forward shipments (posted at the ship), backward
  size_t *rcap;
  MPI_Request *rreq;
  MPI_Status *rst;
  uint8_t **fbuf; // (np) the forward results from each server (posted at the ship)
  size_t *fcap;
  MPI_Request *freq;
  MPI_Status *fst;
  loom_attn_exec_stats_t st;
  // A phase that failed after posting receives or sending: the exchanges of this plan are out of
  // step with the peers', and every call but destroy is LOOM_ERR_STATE.
  loom_status_t broken;
  unsigned char *notified; // (np) NOTIFIED_* bits: what peers got this phase (or a notice)
  // Every ship and finish request not yet released, newest first: destroy detaches them all, so
  // that a wait for one afterwards is an error, not a read of the freed executor.
  struct live_req *live;
};

static int64_t kv_len(const loom_attn_exec_t *x, const loom_attn_task_t *t) {
  return x->causal ? t->q_hi : x->docs[t->doc].len;
}

static double now_ms(void) {
  return 1e3 * MPI_Wtime();
}

// LOOM_ERR_STATE when an earlier phase failed (the peers are out of step: only destroy helps).
static loom_status_t check_broken(const loom_attn_exec_t *x, const char *op) {
  if (x->broken == LOOM_OK) {
    return LOOM_OK;
  }
  return loom_error(NULL, LOOM_ERR_STATE,
                    "%s: an earlier phase of this executor failed (%s): its exchanges are out of "
                    "step with the other ranks'; destroy it and make a new one",
                    op, loom_strerror(x->broken));
}

// ---- creation -----------------------------------------------------------------------------------

// A task's rows, for the overlap check: sorted by document, then first row.
typedef struct span {
  int doc, task;
  int64_t q_lo, q_hi;
} span_t;

static int cmp_span(const void *pa, const void *pb) {
  const span_t *a = pa, *b = pb;
  if (a->doc != b->doc) {
    return a->doc < b->doc ? -1 : 1;
  }
  if (a->q_lo != b->q_lo) {
    return a->q_lo < b->q_lo ? -1 : 1;
  }
  return a->task < b->task ? -1 : a->task > b->task;
}

static loom_status_t check_plan(const loom_attn_doc_t *docs, int ndocs,
                                const loom_attn_task_t *tasks, int ntasks, int np) {
  int64_t *covered = calloc((size_t)ndocs + 1, sizeof(int64_t));
  loom_status_t status = LOOM_OK;
  if (!covered) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_create: out of memory");
  }
  int64_t *rows = calloc((size_t)np, sizeof(int64_t)); // each owner's rows
  if (!rows) {
    free(covered);
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_create: out of memory");
  }
  for (int i = 0; i < ndocs && status == LOOM_OK; i++) {
    if (docs[i].owner < 0 || docs[i].owner >= np || docs[i].len < 0 ||
        docs[i].len > INT32_MAX - rows[docs[i].owner]) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "loom_attn_exec_create: document %d has owner %d and length %lld: use "
                          "an owner in 0..%d and a length >= 0, at most 2^31 - 1 rows per owner "
                          "(the attention kernels count rows in i32)",
                          i, docs[i].owner, (long long)docs[i].len, np - 1);
    } else {
      rows[docs[i].owner] += docs[i].len;
    }
  }
  free(rows);
  for (int i = 0; i < ntasks && status == LOOM_OK; i++) {
    const loom_attn_task_t *t = &tasks[i];
    if (t->doc < 0 || t->doc >= ndocs || t->server < 0 || t->server >= np ||
        t->owner != docs[t->doc].owner || t->q_lo < 0 || t->q_lo >= t->q_hi ||
        t->q_hi > docs[t->doc].len) {
      status =
          loom_error(NULL, LOOM_ERR_INVALID_ARG,
                     "loom_attn_exec_create: task %d (document %d, rows %lld..%lld, owner "
                     "%d, server %d) does not fit the documents or the %d ranks",
                     i, t->doc, (long long)t->q_lo, (long long)t->q_hi, t->owner, t->server, np);
    } else {
      covered[t->doc] += t->q_hi - t->q_lo;
    }
  }
  for (int i = 0; i < ndocs && status == LOOM_OK; i++) {
    if (covered[i] != docs[i].len) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "loom_attn_exec_create: the tasks cover %lld query rows of document %d "
                          "of length %lld: every row must be in exactly one task",
                          (long long)covered[i], i, (long long)docs[i].len);
    }
  }
  // Rows counted once each is not enough: two overlapping tasks and a gap would also add up.
  // Sorted by (document, first row), two tasks overlap only if two neighbours do: O(n log n),
  // since replan runs every step (was: every pair of tasks, 0.5 s for 10,000 documents).
  span_t *sp = status == LOOM_OK ? malloc(sizeof *sp * ((size_t)ntasks + 1)) : NULL;
  if (status == LOOM_OK && !sp) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_create: out of memory");
  }
  for (int i = 0; i < ntasks && status == LOOM_OK; i++) {
    sp[i] = (span_t){tasks[i].doc, i, tasks[i].q_lo, tasks[i].q_hi};
  }
  if (status == LOOM_OK) {
    qsort(sp, (size_t)ntasks, sizeof *sp, cmp_span);
  }
  for (int i = 1; i < ntasks && status == LOOM_OK; i++) {
    const span_t *a = &sp[i - 1], *b = &sp[i];
    if (a->doc == b->doc && b->q_lo < a->q_hi) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "loom_attn_exec_create: tasks %d and %d overlap in document %d",
                          a->task < b->task ? a->task : b->task,
                          a->task < b->task ? b->task : a->task, a->doc);
    }
  }
  free(sp);
  free(covered);
  return status;
}

static loom_status_t make_pair(loom_attn_exec_t *x, int owner, int server, pair_t *p) {
  const int64_t hd = (int64_t)x->H * x->D, kvd = (int64_t)x->Hkv * x->D;
  memset(p, 0, sizeof *p);
  for (int i = 0; i < x->ntasks; i++) {
    p->n += x->tasks[i].owner == owner && x->tasks[i].server == server;
  }
  p->task = calloc((size_t)p->n + 1, sizeof(int));
  p->q_off = calloc((size_t)p->n + 1, sizeof(int64_t));
  p->kv_doc = calloc((size_t)p->n + 1, sizeof(int));
  p->kv_rows = calloc((size_t)p->n + 1, sizeof(int64_t));
  p->kv_off = calloc((size_t)p->n + 1, sizeof(int64_t));
  if (!p->task || !p->q_off || !p->kv_doc || !p->kv_rows || !p->kv_off) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_create: out of memory");
  }
  int k = 0;
  for (int i = 0; i < x->ntasks; i++) {
    const loom_attn_task_t *t = &x->tasks[i];
    if (t->owner != owner || t->server != server) {
      continue;
    }
    x->task_at[i] = k;
    p->task[k] = i;
    p->q_off[k++] = p->q_floats;
    p->q_floats += (t->q_hi - t->q_lo) * hd;
    if (x->doc_slot[t->doc] < 0) { // (a map, not a search: a pair may hold 10^5 documents)
      x->doc_slot[t->doc] = p->nkv;
      p->kv_doc[p->nkv++] = t->doc;
    }
    const int d = x->task_kv[i] = x->doc_slot[t->doc];
    p->kv_rows[d] = kv_len(x, t) > p->kv_rows[d] ? kv_len(x, t) : p->kv_rows[d];
  }
  for (int d = 0; d < p->nkv; d++) { // the scratch back to -1 for the next pair
    x->doc_slot[p->kv_doc[d]] = -1;
  }
  for (int d = 0; d < p->nkv; d++) {
    p->kv_off[d] = p->q_floats + p->kv_floats;
    p->kv_floats += 2 * p->kv_rows[d] * kvd;
  }
  return LOOM_OK;
}

static void free_pair(pair_t *p) {
  free(p->task);
  free(p->q_off);
  free(p->kv_doc);
  free(p->kv_rows);
  free(p->kv_off);
  memset(p, 0, sizeof *p);
}

// The message sizes of a plan, per (owner, server) pair: sorted by pair, then document.
typedef struct pair_row {
  int owner, server, doc;
  int64_t q, kv; // query rows, key/value prefix rows read
} pair_row_t;

static int cmp_pair_row(const void *pa, const void *pb) {
  const pair_row_t *a = pa, *b = pb;
  if (a->owner != b->owner) {
    return a->owner < b->owner ? -1 : 1;
  }
  if (a->server != b->server) {
    return a->server < b->server ? -1 : 1;
  }
  return a->doc < b->doc ? -1 : a->doc > b->doc;
}

// Every message of the plan fits MPI's int count. Checked over all pairs, not only this rank's,
// so that every rank fails here, before any traffic, and none waits for a message a peer could
// not send.
static loom_status_t check_sizes(const loom_attn_exec_t *x) {
  const int64_t hd = (int64_t)x->H * x->D, kvd = (int64_t)x->Hkv * x->D;
  pair_row_t *rows = malloc(sizeof *rows * ((size_t)x->ntasks + 1));
  if (!rows) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "attention servers: out of memory for the plan");
  }
  int n = 0;
  for (int i = 0; i < x->ntasks; i++) {
    const loom_attn_task_t *t = &x->tasks[i];
    if (t->owner != t->server) { // a rank's own tasks never travel
      rows[n++] = (pair_row_t){t->owner, t->server, t->doc, t->q_hi - t->q_lo, kv_len(x, t)};
    }
  }
  qsort(rows, (size_t)n, sizeof *rows, cmp_pair_row);
  loom_status_t status = LOOM_OK;
  for (int i = 0; i < n && status == LOOM_OK;) {
    double q = 0.0, kv = 0.0; // floats, in double: no overflow before the comparison
    int j = i;
    while (j < n && rows[j].owner == rows[i].owner && rows[j].server == rows[i].server) {
      int64_t longest = 0;
      const int doc = rows[j].doc;
      for (; j < n && rows[j].owner == rows[i].owner && rows[j].server == rows[i].server &&
             rows[j].doc == doc;
           j++) {
        q += (double)rows[j].q;
        longest = rows[j].kv > longest ? rows[j].kv : longest;
      }
      kv += (double)longest;
    }
    const double ship = q * (double)hd + 2.0 * kv * (double)kvd, back = q * (double)(hd + x->H);
    const double bytes = (double)sizeof(msg_header_t) + 4.0 * (ship > back ? ship : back);
    if (bytes > 2147483647.0) {
      status = loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                          "attention servers: the plan's messages between owner %d and server %d "
                          "would be %.0f bytes, over MPI's 2^31 - 1: cut the documents into "
                          "smaller tasks, or spread them over more ranks",
                          rows[i].owner, rows[i].server, bytes);
    }
    i = j;
  }
  free(rows);
  return status;
}

// Take a plan (checked): the documents' rows, the message layout of every (owner, server)
// pair and the tasks this rank serves. Replaces what an earlier plan left.
static loom_status_t set_plan(loom_attn_exec_t *x, const loom_attn_doc_t *docs, int ndocs,
                              const loom_attn_task_t *tasks, int ntasks) {
  loom_status_t status = LOOM_OK;
  for (int s = 0; s < x->np; s++) {
    free_pair(&x->to[s]);
    free_pair(&x->from[s]);
  }
  free(x->docs);
  free(x->tasks);
  free(x->doc_row);
  free(x->serve);
  free(x->task_q);
  free(x->task_k);
  free(x->task_at);
  free(x->task_kv);
  free(x->doc_slot);
  x->ndocs = ndocs;
  x->ntasks = ntasks;
  x->rows = 0;
  x->nserve = 0;
  x->bq = x->bk = 0;
  x->batch_ready = 0;
  x->docs = malloc(sizeof *docs * ((size_t)ndocs + 1));
  x->tasks = malloc(sizeof *tasks * ((size_t)ntasks + 1));
  x->doc_row = calloc((size_t)ndocs + 1, sizeof(int64_t));
  x->serve = calloc((size_t)ntasks + 1, sizeof(int));
  x->task_q = calloc((size_t)ntasks + 1, sizeof(int64_t));
  x->task_k = calloc((size_t)ntasks + 1, sizeof(int64_t));
  x->task_at = calloc((size_t)ntasks + 1, sizeof(int));
  x->task_kv = calloc((size_t)ntasks + 1, sizeof(int));
  x->doc_slot = malloc(sizeof(int) * ((size_t)ndocs + 1));
  if (!x->docs || !x->tasks || !x->doc_row || !x->serve || !x->task_q || !x->task_k ||
      !x->task_at || !x->task_kv || !x->doc_slot) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "attention servers: out of memory for the plan");
  }
  memcpy(x->docs, docs, sizeof *docs * (size_t)ndocs);
  for (int i = 0; i < ndocs; i++) {
    x->doc_slot[i] = -1;
  }
  memcpy(x->tasks, tasks, sizeof *tasks * (size_t)ntasks);
  for (int i = 0; i < ndocs; i++) {
    if (docs[i].owner == x->me) {
      x->doc_row[i] = x->rows;
      x->rows += docs[i].len;
    }
  }
  LOOM_CHECK(check_sizes(x));
  for (int s = 0; s < x->np; s++) {
    LOOM_CHECK(make_pair(x, x->me, s, &x->to[s]));
    LOOM_CHECK(make_pair(x, s, x->me, &x->from[s]));
  }
  for (int i = 0; i < ntasks; i++) {
    if (tasks[i].server == x->me) {
      x->task_q[i] = x->bq;
      x->task_k[i] = x->bk;
      x->serve[x->nserve++] = i;
      x->bq += tasks[i].q_hi - tasks[i].q_lo;
      x->bk += kv_len(x, &tasks[i]);
    }
  }
fail:
  return status;
}

// What is wrong with the plan's arrays (why filled in, 1), or 0.
static int bad_plan_arrays(const loom_attn_doc_t *docs, int ndocs, const loom_attn_task_t *tasks,
                           int ntasks, char *why, size_t len) {
  if (ndocs < 0 || (ndocs && !docs)) {
    snprintf(why, len, "docs is %s with ndocs = %d: pass an array of ndocs >= 0 documents",
             docs ? "set" : "NULL", ndocs);
  } else if (ntasks < 0 || (ntasks && !tasks)) {
    snprintf(why, len, "tasks is %s with ntasks = %d: pass an array of ntasks >= 0 tasks",
             tasks ? "set" : "NULL", ntasks);
  }
  return why[0] != '\0';
}

loom_status_t loom_attn_exec_create(const loom_group_t *g, const loom_attn_doc_t *docs, int ndocs,
                                    const loom_attn_task_t *tasks, int ntasks, int heads,
                                    int kv_heads, int head_dim, int causal, float scale,
                                    loom_attn_exec_t **out) {
  loom_status_t status = LOOM_OK;
  char why[160] = "";
  if (!g) {
    snprintf(why, sizeof why, "g is NULL: pass a group from loom_group(ctx, kind)");
  } else if (!out) {
    snprintf(why, sizeof why, "out is NULL: pass where to store the exchanges");
  } else if (bad_plan_arrays(docs, ndocs, tasks, ntasks, why, sizeof why)) {
  } else if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0) {
    snprintf(why, sizeof why,
             "heads = %d, kv_heads = %d: need both >= 1 and heads a multiple of kv_heads", heads,
             kv_heads);
  } else if (head_dim < 1) {
    snprintf(why, sizeof why, "head_dim = %d: need head_dim >= 1", head_dim);
  } else if (!isfinite(scale)) { // else every rank's first forward would fail mid-exchange
    snprintf(why, sizeof why, "scale is %g: pass a finite value (<= 0 means 1/sqrt(D))",
             (double)scale);
  }
  if (why[0]) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_attn_exec_create: %s", why);
  }
  *out = NULL;
  if (loom_group_rank(g) < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_attn_exec_create: this rank is not a member of the group: call it "
                      "only on ranks where loom_group_rank(g) >= 0");
  }
  const int np = loom_group_size(g);
  if ((status = check_plan(docs, ndocs, tasks, ntasks, np)) != LOOM_OK) {
    return status;
  }
  loom_attn_exec_t *x = calloc(1, sizeof *x);
  if (!x) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_create: out of memory");
  }
  *x = (loom_attn_exec_t){.comm = MPI_COMM_NULL,
                          .g = g,
                          .np = np,
                          .me = loom_group_rank(g),
                          .H = heads,
                          .Hkv = kv_heads,
                          .D = head_dim,
                          .causal = causal,
                          .scale = scale};
  x->to = calloc((size_t)np, sizeof(pair_t));
  x->from = calloc((size_t)np, sizeof(pair_t));
  x->sbuf = calloc((size_t)np, sizeof(uint8_t *));
  x->rbuf = calloc((size_t)np, sizeof(uint8_t *));
  x->fbuf = calloc((size_t)np, sizeof(uint8_t *));
  x->scap = calloc((size_t)np, sizeof(size_t));
  x->rcap = calloc((size_t)np, sizeof(size_t));
  x->fcap = calloc((size_t)np, sizeof(size_t));
  x->sreq = calloc((size_t)np, sizeof(MPI_Request));
  x->rreq = calloc((size_t)np, sizeof(MPI_Request));
  x->freq = calloc((size_t)np, sizeof(MPI_Request));
  x->rst = calloc((size_t)np, sizeof(MPI_Status));
  x->fst = calloc((size_t)np, sizeof(MPI_Status));
  x->notified = calloc((size_t)np, 1);
  if (!x->notified || !x->to || !x->from || !x->sbuf || !x->rbuf || !x->fbuf || !x->scap ||
      !x->rcap || !x->fcap || !x->sreq || !x->rreq || !x->freq || !x->rst || !x->fst) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_create: out of memory");
    goto fail;
  }
  for (int s = 0; s < np; s++) {
    x->sreq[s] = x->rreq[s] = x->freq[s] = MPI_REQUEST_NULL;
  }
  LOOM_CHECK(set_plan(x, docs, ndocs, tasks, ntasks));
  if (MPI_Comm_dup(loom_group_comm(g), &x->comm) != MPI_SUCCESS) {
    status = loom_error(NULL, LOOM_ERR_MPI, "loom_attn_exec_create: MPI_Comm_dup failed");
    goto fail;
  }
  *out = x;
  return LOOM_OK;
fail:
  loom_attn_exec_destroy(x);
  return status;
}

loom_status_t loom_attn_exec_replan(loom_attn_exec_t *x, const loom_attn_doc_t *docs, int ndocs,
                                    const loom_attn_task_t *tasks, int ntasks) {
  static const char op[] = "loom_attn_exec_replan";
  char why[160] = "";
  if (!x) {
    snprintf(why, sizeof why, "x is NULL: pass an executor from loom_attn_exec_create");
  } else if (bad_plan_arrays(docs, ndocs, tasks, ntasks, why, sizeof why)) {
  } else if (x->phase != 0) {
    snprintf(why, sizeof why,
             "a forward is in progress (shipped, not finished): finish it on every rank first");
  }
  if (why[0]) {
    return loom_error(NULL, x && x->phase != 0 ? LOOM_ERR_STATE : LOOM_ERR_INVALID_ARG, "%s: %s",
                      op, why);
  }
  loom_status_t status = check_broken(x, op);
  if (status == LOOM_OK) {
    status = check_plan(docs, ndocs, tasks, ntasks, x->np);
  }
  if (status != LOOM_OK) {
    return status;
  }
  status = set_plan(x, docs, ndocs, tasks, ntasks);
  if (status != LOOM_OK) { // the old plan is gone and the new one incomplete (on every rank)
    x->broken = status;
  }
  return status;
}

static void free_batch(loom_attn_exec_t *x) {
  float **b[] = {&x->Qb, &x->Kb, &x->Vb, &x->Ob, &x->Lb, &x->dOb, &x->dQb, &x->dKb, &x->dVb};
  for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) {
    loom_host_free(*b[i]);
    *b[i] = NULL;
  }
  free(x->cu_q);
  free(x->cu_k);
  x->cu_q = x->cu_k = NULL;
  x->cap_bq = x->cap_bk = x->cap_gq = x->cap_gk = 0;
}

// Complete or cancel a request a failed peer will never match.
static void drop_request(MPI_Request *r) {
  if (*r != MPI_REQUEST_NULL) {
    int done = 0;
    MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (!done) {
      MPI_Cancel(r);
      MPI_Wait(r, MPI_STATUS_IGNORE);
    }
  }
}

static void detach_requests(loom_attn_exec_t *x);
static void retire_ship_requests(loom_attn_exec_t *x);

void loom_attn_exec_destroy(loom_attn_exec_t *x) {
  if (!x) {
    return;
  }
  detach_requests(x);
  for (int s = 0; s < x->np; s++) {
    MPI_Request *reqs[] = {x->sreq, x->rreq, x->freq};
    uint8_t **bufs[] = {x->sbuf, x->rbuf, x->fbuf};
    for (int k = 0; k < 3; k++) {
      if (reqs[k] && k == 0 && reqs[k][s] != MPI_REQUEST_NULL) {
        // A send a failed peer never takes: Open MPI cannot cancel a large one (MPI_Wait after
        // MPI_Cancel would hang), so it is let go, and its buffer with it.
        int done = 0;
        MPI_Test(&reqs[k][s], &done, MPI_STATUS_IGNORE);
        if (!done) {
          MPI_Request_free(&reqs[k][s]);
          bufs[k][s] = NULL;
        }
      } else if (reqs[k]) {
        drop_request(&reqs[k][s]); // a receive: cancelled
      }
      if (bufs[k]) {
        free(bufs[k][s]);
      }
    }
    if (x->to) {
      free_pair(&x->to[s]);
    }
    if (x->from) {
      free_pair(&x->from[s]);
    }
  }
  free_batch(x);
  void *owned[] = {x->docs,   x->tasks,  x->doc_row, x->to,      x->from,     x->serve,
                   x->task_q, x->task_k, x->task_at, x->task_kv, x->doc_slot, x->sbuf,
                   x->rbuf,   x->fbuf,   x->scap,    x->rcap,    x->fcap,     x->sreq,
                   x->rreq,   x->freq,   x->rst,     x->fst,     x->notified};
  for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
    free(owned[i]);
  }
  if (x->comm != MPI_COMM_NULL) {
    MPI_Comm_free(&x->comm);
  }
  free(x);
}

void loom_attn_exec_stats(const loom_attn_exec_t *x, loom_attn_exec_stats_t *out) {
  if (x && out) {
    *out = x->st;
  }
}

// ---- messages -----------------------------------------------------------------------------------

// This rank enters a phase on the group: the watchdog watches its waits from now on.
static void enter(loom_attn_exec_t *x, enum loom_op_kind kind, const char *name) {
  struct loom_op_desc d;
  loom_op_desc_set(&d, kind, name, LOOM_F32, -1, -1, -1, 0);
  loom_watch_enter(&x->watch, x->g, &d, 1);
}

// As enter, for the phases that start an exchange (ship, backward): under
// LOOM_CHECK_CONSISTENCY the members compare the phase and the tensor's name first.
static loom_status_t enter_checked(loom_attn_exec_t *x, enum loom_op_kind kind, const char *name) {
  enter(x, kind, name);
  return loom_check_consistency(&x->watch);
}

// Make *buf hold at least bytes (kept between calls and steps: a fresh buffer per message costs
// a page fault per 4 KiB on every use). 0 when out of memory (*buf unchanged).
static int reserve(uint8_t **buf, size_t *cap, size_t bytes) {
  if (*cap >= bytes && *buf) {
    return 1;
  }
  uint8_t *p = malloc(bytes);
  if (!p) {
    return 0;
  }
  free(*buf);
  *buf = p;
  *cap = bytes;
  return 1;
}

// Complete the send in flight to peer, yielding the core between polls (it may be the one the
// receiver needs to get to its receive).
static void wait_send(loom_attn_exec_t *x, int peer) {
  if (x->sreq[peer] == MPI_REQUEST_NULL) {
    return;
  }
  double t0 = now_ms();
  for (;;) {
    int flag = 0;
    if (MPI_Test(&x->sreq[peer], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
      break;
    }
    loom_watch_check(&x->watch);
    sched_yield();
  }
  x->sreq[peer] = MPI_REQUEST_NULL;
  x->st.wait_ms += now_ms() - t0;
}

// The outgoing message to peer (x->sbuf[peer]) for nfloats floats, header filled in. The send
// of the previous message to peer completes first: its buffer is the one reused.
static float *msg_new(loom_attn_exec_t *x, int peer, int phase, int ntasks, int64_t nfloats) {
  wait_send(x, peer);
  if (!reserve(&x->sbuf[peer], &x->scap[peer],
               sizeof(msg_header_t) + sizeof(float) * (size_t)(nfloats > 0 ? nfloats : 1))) {
    return NULL;
  }
  msg_header_t h = {MSG_MAGIC, (uint64_t)phase, (uint64_t)ntasks, (uint64_t)nfloats};
  memcpy(x->sbuf[peer], &h, sizeof h);
  void *payload = x->sbuf[peer] + sizeof h; // malloc'd: aligned for floats past the header
  return payload;
}

// Post the message in sbuf[peer] (or keep it: to itself it is read in place).
static loom_status_t msg_send(loom_attn_exec_t *x, int peer, int phase, int64_t nfloats) {
  if (peer == x->me) {
    return LOOM_OK;
  }
  const int64_t bytes = (int64_t)sizeof(msg_header_t) + 4 * nfloats;
  if (bytes > 2147483647) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "attention servers: a %lld-byte message to rank %d exceeds MPI's int count",
                      (long long)bytes, peer);
  }
  x->st.bytes_sent += (double)bytes;
  return MPI_Isend(x->sbuf[peer], (int)bytes, MPI_BYTE, peer, phase, x->comm, &x->sreq[peer]) ==
                 MPI_SUCCESS
             ? LOOM_OK
             : loom_error(NULL, LOOM_ERR_MPI, "attention servers: sending to rank %d failed", peer);
}

loom_status_t loom_attn_msg_check(const uint8_t *msg, size_t bytes, int peer, int phase, int ntasks,
                                  int64_t nfloats, const float **payload) {
  *payload = NULL;
  const size_t want = nfloats >= 0 && (uint64_t)nfloats <= (SIZE_MAX - sizeof(msg_header_t)) / 4
                          ? sizeof(msg_header_t) + 4 * (size_t)nfloats
                          : 0;
  if (!msg || want == 0 || bytes != want) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "attention servers: rank %d sent %zu bytes where the plan says %zu: the "
                      "ranks disagree on the plan, or the message was damaged",
                      peer, bytes, want);
  }
  msg_header_t h;
  memcpy(&h, msg, sizeof h);
  if (h.magic != MSG_MAGIC || h.phase != (uint64_t)phase || h.ntasks != (uint64_t)ntasks ||
      h.nfloats != (uint64_t)nfloats) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "attention servers: the message from rank %d announces phase %llu, %llu "
                      "tasks, %llu floats where the plan says %d, %d, %lld",
                      peer, (unsigned long long)h.phase, (unsigned long long)h.ntasks,
                      (unsigned long long)h.nfloats, phase, ntasks, (long long)nfloats);
  }
  const void *p = msg + sizeof h;
  *payload = p;
  return LOOM_OK;
}

// Post the receive of the message of phase from peer (nfloats floats as the plan says) into
// *buf, so that it can land while this rank computes. A longer message fails the receive
// (truncated: reported as corrupt); a shorter one fails the check.
static loom_status_t post_recv(loom_attn_exec_t *x, int peer, int phase, int64_t nfloats,
                               uint8_t **buf, size_t *cap, MPI_Request *req) {
  const size_t bytes = sizeof(msg_header_t) + 4 * (size_t)nfloats;
  if (bytes > 2147483647) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "attention servers: a %zu-byte message from rank %d exceeds MPI's int count",
                      bytes, peer);
  }
  if (!reserve(buf, cap, bytes)) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "attention servers: out of memory");
  }
  return MPI_Irecv(*buf, (int)bytes, MPI_BYTE, peer, phase, x->comm, req) == MPI_SUCCESS
             ? LOOM_OK
             : loom_error(NULL, LOOM_ERR_MPI, "attention servers: receiving from rank %d failed",
                          peer);
}

// 1 when every posted receive in reqs (np) completed; the statuses land in sts. A receive that
// failed (a message longer than the plan says) completes with its error in sts[i].MPI_ERROR.
static int test_posted(loom_attn_exec_t *x, MPI_Request *reqs, MPI_Status *sts) {
  int all = 1;
  for (int r = 0; r < x->np; r++) {
    if (reqs[r] == MPI_REQUEST_NULL) {
      continue;
    }
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&reqs[r], &flag, &st);
    if (rc != MPI_SUCCESS) { // MPI_ERRORS_RETURN on the group's communicators
      st.MPI_ERROR = rc;
      flag = 1;
      reqs[r] = MPI_REQUEST_NULL;
    } else if (flag) {
      st.MPI_ERROR = MPI_SUCCESS;
    }
    if (flag) {
      sts[r] = st;
    } else {
      all = 0;
    }
  }
  return all;
}

// Wait for the posted receives in reqs, yielding the core between polls (it may be the one a
// rank that shares it needs to compute what this rank waits for).
static void wait_posted(loom_attn_exec_t *x, MPI_Request *reqs, MPI_Status *sts) {
  double t0 = now_ms();
  while (!test_posted(x, reqs, sts)) {
    loom_watch_check(&x->watch);
    sched_yield();
  }
  x->st.wait_ms += now_ms() - t0;
}

// The payload of a posted receive from peer that completed with status st, checked.
static loom_status_t posted_payload(int peer, const MPI_Status *st, const uint8_t *buf, int phase,
                                    int ntasks, int64_t nfloats, const float **payload) {
  *payload = NULL;
  if (st->MPI_ERROR != MPI_SUCCESS) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "attention servers: the message from rank %d does not fit the %lld floats "
                      "the plan says (MPI error %d): the ranks disagree on the plan",
                      peer, (long long)nfloats, st->MPI_ERROR);
  }
  int bytes = 0;
  MPI_Get_count(st, MPI_BYTE, &bytes);
  return loom_attn_msg_check(buf, bytes > 0 ? (size_t)bytes : 0, peer, phase, ntasks, nfloats,
                             payload);
}

// Complete every send in flight. Open MPI moves a large message only while its sender is inside
// MPI: before a long kernel, a rank finishes what it ships, or its servers wait for the kernel.
static void wait_sends(loom_attn_exec_t *x) {
  for (int s = 0; s < x->np; s++) {
    wait_send(x, s);
  }
}

// After this rank failed in a phase: every peer still waiting for its message of that phase
// (owners for results, servers for shipments; peers in x->notified already have it) gets a
// header-only message, which it rejects as corrupt, instead of waiting forever. The executor is
// broken from then on.
static void send_failed(loom_attn_exec_t *x, int phase, loom_status_t why) {
  const int to_servers = phase == PH_SHIP || phase == PH_BSHIP;
  const unsigned char bit = to_servers ? NOTIFIED_SERVER : NOTIFIED_OWNER;
  for (int r = 0; r < x->np; r++) {
    const pair_t *p = to_servers ? &x->to[r] : &x->from[r];
    if (r != x->me && p->n > 0 && !(x->notified[r] & bit)) {
      if (msg_new(x, r, phase, 0, 0)) {
        msg_send(x, r, phase, 0);
      }
      x->notified[r] |= bit;
    }
  }
  x->broken = why;
}

static loom_status_t check_rows(const char *op, const char *name, const loom_tensor_t *t,
                                int64_t rows, int64_t width) {
  if (!t || t->dtype != LOOM_F32 || t->device != LOOM_DEVICE_HOST ||
      loom_tensor_numel(t) != rows * width || (!t->data && rows * width > 0)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s must be an f32 host tensor of %lld x %lld values (this rank's rows "
                      "of the plan)",
                      op, name, (long long)rows, (long long)width);
  }
  // Negative or overflowing extents (which loom_tensor_numel counts as empty).
  return loom_arg_tensor(op, name, t, LOOM_F32, LOOM_DEVICE_HOST);
}

// out and lse of a finish: this rank's rows, in memory apart (each is written whole).
static loom_status_t check_results(const char *op, const loom_tensor_t *out,
                                   const loom_tensor_t *lse, int64_t rows, int64_t hd, int H) {
  loom_status_t status = check_rows(op, "out", out, rows, hd);
  if (status == LOOM_OK) {
    status = check_rows(op, "lse", lse, H, rows);
  }
  return status == LOOM_OK ? loom_arg_disjoint(op, "lse", lse, "out", out, 0) : status;
}

// ---- forward ------------------------------------------------------------------------------------

loom_status_t loom_attn_exec_ship(loom_attn_exec_t *x, const loom_tensor_t *q,
                                  const loom_tensor_t *k, const loom_tensor_t *v) {
  static const char op[] = "loom_attn_exec_ship";
  loom_status_t status = LOOM_OK;
  if (!x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: x is NULL", op);
  }
  const double t_busy = now_ms();
  const int64_t hd = (int64_t)x->H * x->D, kvd = (int64_t)x->Hkv * x->D;
  status = check_rows(op, "q", q, x->rows, hd);
  if (status == LOOM_OK) {
    status = check_rows(op, "k", k, x->rows, kvd);
  }
  if (status == LOOM_OK) {
    status = check_rows(op, "v", v, x->rows, kvd);
  }
  if (status == LOOM_OK) {
    status = check_broken(x, op);
  }
  if (status == LOOM_OK && x->phase != 0) { // a second shipment would be taken for the results
    status = loom_error(NULL, LOOM_ERR_STATE,
                        "%s: the last forward is not finished: call loom_attn_exec_compute and "
                        "loom_attn_exec_finish first (every rank ships, computes and finishes, "
                        "in that order)",
                        op);
  }
  if (status != LOOM_OK) {
    return loom_consistency_refuse(x->g, LOOM_OPK_ATTN_SHIP, q, status); // (the peers learn it)
  }
  retire_ship_requests(x);
  x->batch_ready = 0;
  snprintf(x->name, sizeof x->name, "%.*s", (int)sizeof x->name - 1, q->name);
  LOOM_CHECK(enter_checked(x, LOOM_OPK_ATTN_SHIP, x->name)); // (a mismatch: nothing posted)
  x->phase = 1;
  memset(&x->st, 0, sizeof x->st);
  x->q_in = q->data;
  x->k_in = k->data;
  x->v_in = v->data;
  memset(x->notified, 0, (size_t)x->np);
  // The receives first, so that what comes in lands while this rank computes: the shipments of
  // the tasks it serves, and the results of its own documents.
  for (int r = 0; r < x->np; r++) {
    const pair_t *in = &x->from[r], *out = &x->to[r];
    if (r != x->me && in->n > 0) {
      LOOM_CHECK(post_recv(x, r, PH_SHIP, in->q_floats + in->kv_floats, &x->rbuf[r], &x->rcap[r],
                           &x->rreq[r]));
    }
    if (r != x->me && out->n > 0) {
      LOOM_CHECK(post_recv(x, r, PH_RETURN, out->q_floats + out->q_floats / hd * x->H, &x->fbuf[r],
                           &x->fcap[r], &x->freq[r]));
    }
  }
  for (int s = 0; s < x->np; s++) {
    const pair_t *p = &x->to[s];
    if (p->n == 0 || s == x->me) { // what it serves itself is read from q, k, v at compute
      continue;
    }
    float *f = msg_new(x, s, PH_SHIP, p->n, p->q_floats + p->kv_floats);
    if (!f) {
      status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", op);
      goto fail;
    }
    for (int i = 0; i < p->n; i++) {
      const loom_attn_task_t *t = &x->tasks[p->task[i]];
      memcpy(f + p->q_off[i], (const float *)q->data + (x->doc_row[t->doc] + t->q_lo) * hd,
             sizeof(float) * (size_t)((t->q_hi - t->q_lo) * hd));
    }
    for (int d = 0; d < p->nkv; d++) {
      const int64_t row = x->doc_row[p->kv_doc[d]], n = p->kv_rows[d] * kvd;
      memcpy(f + p->kv_off[d], (const float *)k->data + row * kvd, sizeof(float) * (size_t)n);
      memcpy(f + p->kv_off[d] + n, (const float *)v->data + row * kvd, sizeof(float) * (size_t)n);
    }
    LOOM_CHECK(msg_send(x, s, PH_SHIP, p->q_floats + p->kv_floats));
    x->notified[s] |= NOTIFIED_SERVER;
  }
fail:
  if (status != LOOM_OK && x->phase == 1) { // the servers still waiting get a failure notice
    send_failed(x, PH_SHIP, status);
  }
  x->st.busy_ms += now_ms() - t_busy;
  return status;
}

// Make *b hold n floats (rows * width, + 1 so that an empty batch still has a buffer), keeping
// what it has when that is enough.
static int grow(float **b, int64_t n, int64_t have) {
  if (*b && n <= have) {
    return 1;
  }
  loom_host_free(*b);
  *b = loom_host_alloc(sizeof(float) * (size_t)(n + 1));
  return *b != NULL;
}

// The batch buffers for bq query and bk key rows: kept between steps (a fresh one per step would
// page-fault on every use), grown when a plan needs more. Forward (q, k, v, out, lse and the
// cu_seqlens) or, with grads, the backward's four.
static loom_status_t alloc_batch(loom_attn_exec_t *x, int grads) {
  const int64_t hd = (int64_t)x->H * x->D, kvd = (int64_t)x->Hkv * x->D;
  int64_t *cq = grads ? &x->cap_gq : &x->cap_bq, *ck = grads ? &x->cap_gk : &x->cap_bk;
  int ok;
  if (grads) {
    ok = grow(&x->dOb, x->bq * hd, *cq * hd) && grow(&x->dQb, x->bq * hd, *cq * hd) &&
         grow(&x->dKb, x->bk * kvd, *ck * kvd) && grow(&x->dVb, x->bk * kvd, *ck * kvd);
  } else {
    ok = grow(&x->Qb, x->bq * hd, *cq * hd) && grow(&x->Ob, x->bq * hd, *cq * hd) &&
         grow(&x->Lb, x->bq * x->H, *cq * x->H) && grow(&x->Kb, x->bk * kvd, *ck * kvd) &&
         grow(&x->Vb, x->bk * kvd, *ck * kvd);
    free(x->cu_q);
    free(x->cu_k);
    x->cu_q = calloc((size_t)x->nserve + 1, sizeof(int32_t));
    x->cu_k = calloc((size_t)x->nserve + 1, sizeof(int32_t));
    ok = ok && x->cu_q && x->cu_k;
  }
  if (!ok) { // (a buffer that was grown holds more than the capacity: fine)
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "attention servers: cannot allocate the batch of %lld query and %lld key "
                      "rows",
                      (long long)x->bq, (long long)x->bk);
  }
  *cq = x->bq > *cq ? x->bq : *cq;
  *ck = x->bk > *ck ? x->bk : *ck;
  return LOOM_OK;
}

// The tensors of the batch: q/out (bq, H, D), k/v (bk, Hkv, D), lse (H, bq), cu (nserve + 1).
static loom_status_t wrap_batch(loom_attn_exec_t *x, float *q, float *k, float *v, float *o,
                                float *l, loom_tensor_t t[7]) {
  const int64_t sq[3] = {x->bq, x->H, x->D}, sk[3] = {x->bk, x->Hkv, x->D};
  const int64_t sl[2] = {x->H, x->bq}, sc[1] = {x->nserve + 1};
  loom_status_t status = LOOM_OK;
  LOOM_CHECK(loom_tensor_wrap(&t[0], q, LOOM_F32, LOOM_DEVICE_HOST, 3, sq, "q"));
  LOOM_CHECK(loom_tensor_wrap(&t[1], k, LOOM_F32, LOOM_DEVICE_HOST, 3, sk, "k"));
  LOOM_CHECK(loom_tensor_wrap(&t[2], v, LOOM_F32, LOOM_DEVICE_HOST, 3, sk, "v"));
  LOOM_CHECK(loom_tensor_wrap(&t[3], o, LOOM_F32, LOOM_DEVICE_HOST, 3, sq, "out"));
  LOOM_CHECK(loom_tensor_wrap(&t[4], l, LOOM_F32, LOOM_DEVICE_HOST, 2, sl, "lse"));
  LOOM_CHECK(loom_tensor_wrap(&t[5], x->cu_q, LOOM_I32, LOOM_DEVICE_HOST, 1, sc, "cu_q"));
  LOOM_CHECK(loom_tensor_wrap(&t[6], x->cu_k, LOOM_I32, LOOM_DEVICE_HOST, 1, sc, "cu_k"));
fail:
  return status;
}

loom_status_t loom_attn_exec_compute(loom_attn_exec_t *x) {
  loom_status_t status = LOOM_OK;
  if (!x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_attn_exec_compute: x is NULL");
  }
  if ((status = check_broken(x, "loom_attn_exec_compute")) != LOOM_OK) {
    return status;
  }
  if (x->phase != 1) { // nothing shipped: it would wait for messages no rank sends
    return loom_error(NULL, LOOM_ERR_STATE,
                      "loom_attn_exec_compute: call loom_attn_exec_ship first (every rank ships, "
                      "computes and finishes, in that order)");
  }
  x->phase = 2;
  const double t_busy = now_ms();
  const int64_t hd = (int64_t)x->H * x->D, kvd = (int64_t)x->Hkv * x->D;
  enter(x, LOOM_OPK_ATTN_COMPUTE, x->name);
  wait_posted(x, x->rreq, x->rst);
  const float **in = calloc((size_t)x->np, sizeof(float *));
  if (!in) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_compute: out of memory");
    goto fail;
  }
  for (int r = 0; r < x->np; r++) { // every message checked, even after a corrupt one
    const pair_t *p = &x->from[r];
    if (p->n > 0 && r != x->me) {
      loom_status_t st = posted_payload(r, &x->rst[r], x->rbuf[r], PH_SHIP, p->n,
                                        p->q_floats + p->kv_floats, &in[r]);
      status = status == LOOM_OK ? st : status;
    }
  }
  if (status != LOOM_OK) {
    goto fail;
  }
  wait_sends(x); // this rank's shards reach their servers before its kernel runs
  LOOM_CHECK(alloc_batch(x, 0));
  // The batch: every served task's query rows and its key/value prefix, plan order; this
  // rank's own tasks straight from its q, k, v.
  int64_t oq = 0, ok = 0;
  for (int i = 0; i < x->nserve; i++) {
    const loom_attn_task_t *t = &x->tasks[x->serve[i]];
    const int64_t nq = t->q_hi - t->q_lo, nk = kv_len(x, t);
    const float *sq, *sk, *sv;
    if (t->owner == x->me) {
      const int64_t row = x->doc_row[t->doc];
      sq = x->q_in + (row + t->q_lo) * hd;
      sk = x->k_in + row * kvd;
      sv = x->v_in + row * kvd;
    } else {
      const pair_t *p = &x->from[t->owner];
      const int at = x->task_at[x->serve[i]], d = x->task_kv[x->serve[i]];
      sq = in[t->owner] + p->q_off[at];
      sk = in[t->owner] + p->kv_off[d];
      sv = sk + p->kv_rows[d] * kvd;
    }
    memcpy(x->Qb + oq * hd, sq, sizeof(float) * (size_t)(nq * hd));
    memcpy(x->Kb + ok * kvd, sk, sizeof(float) * (size_t)(nk * kvd));
    memcpy(x->Vb + ok * kvd, sv, sizeof(float) * (size_t)(nk * kvd));
    oq += nq;
    ok += nk;
    x->cu_q[i + 1] = (int32_t)oq;
    x->cu_k[i + 1] = (int32_t)ok;
    x->st.pairs_served +=
        x->causal ? (double)nq * nk - 0.5 * (double)nq * (nq - 1) : (double)nq * nk;
  }
  x->q_in = x->k_in = x->v_in = NULL;
  x->st.tasks_served = x->nserve;
  loom_tensor_t t[7];
  LOOM_CHECK(wrap_batch(x, x->Qb, x->Kb, x->Vb, x->Ob, x->Lb, t));
  double t0 = now_ms();
  LOOM_CHECK(
      loom_attention_forward(&t[3], &t[4], &t[0], &t[1], &t[2], &t[5], &t[6], x->causal, x->scale));
  x->st.compute_ms += now_ms() - t0;
  x->batch_ready = 1;
  // Return out and lse to each owner: per task its rows of out, then its lse (H x q). This
  // rank's own results stay in the batch (finish reads them there).
  for (int r = 0; r < x->np && status == LOOM_OK; r++) {
    const pair_t *p = &x->from[r];
    if (p->n == 0 || r == x->me) {
      continue;
    }
    const int64_t nrows = p->q_floats / hd;
    float *f = msg_new(x, r, PH_RETURN, p->n, p->q_floats + nrows * x->H);
    if (!f) {
      status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_attn_exec_compute: out of memory");
      break;
    }
    int64_t lo = p->q_floats;
    for (int i = 0; i < p->n; i++) {
      const loom_attn_task_t *tk = &x->tasks[p->task[i]];
      const int64_t nq = tk->q_hi - tk->q_lo, b = x->task_q[p->task[i]];
      memcpy(f + p->q_off[i], x->Ob + b * hd, sizeof(float) * (size_t)(nq * hd));
      for (int h = 0; h < x->H; h++) {
        memcpy(f + lo + h * nq, x->Lb + h * x->bq + b, sizeof(float) * (size_t)nq);
      }
      lo += x->H * nq;
    }
    status = msg_send(x, r, PH_RETURN, p->q_floats + nrows * x->H);
    x->notified[r] |= status == LOOM_OK ? NOTIFIED_OWNER : 0;
  }
fail:
  if (status != LOOM_OK) { // the owners still waiting for results get a failure notice
    send_failed(x, PH_RETURN, status);
  }
  free(in);
  x->st.busy_ms += now_ms() - t_busy;
  return status;
}

// The rows of out and lse of the tasks in pair p, from the results f (out rows at q_off, then
// each task's lse, H x q) or, for the pair with itself, from the batch.
static void unpack_results(loom_attn_exec_t *x, const pair_t *p, const float *f, float *out,
                           float *lse) {
  const int64_t hd = (int64_t)x->H * x->D;
  int64_t lo = p->q_floats;
  for (int i = 0; i < p->n; i++) {
    const loom_attn_task_t *t = &x->tasks[p->task[i]];
    const int64_t nq = t->q_hi - t->q_lo, row = x->doc_row[t->doc] + t->q_lo;
    const int64_t b = x->task_q[p->task[i]];
    memcpy(out + row * hd, f ? f + p->q_off[i] : x->Ob + b * hd, sizeof(float) * (size_t)(nq * hd));
    for (int h = 0; h < x->H; h++) {
      memcpy(lse + h * x->rows + row, f ? f + lo + h * nq : x->Lb + h * x->bq + b,
             sizeof(float) * (size_t)nq);
    }
    lo += x->H * nq;
  }
}

loom_status_t loom_attn_exec_finish(loom_attn_exec_t *x, loom_tensor_t *out, loom_tensor_t *lse) {
  static const char op[] = "loom_attn_exec_finish";
  loom_status_t status = LOOM_OK;
  if (!x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: x is NULL", op);
  }
  LOOM_CHECK(check_broken(x, op));
  if (x->phase != 2) { // no results computed: it would wait for messages no rank sends
    return loom_error(NULL, LOOM_ERR_STATE,
                      "%s: call loom_attn_exec_compute first (every rank ships, computes and "
                      "finishes, in that order)",
                      op);
  }
  const int64_t hd = (int64_t)x->H * x->D;
  LOOM_CHECK(check_results(op, out, lse, x->rows, hd, x->H));
  x->phase = 0;
  const double t_busy = now_ms();
  enter(x, LOOM_OPK_ATTN_FINISH, out->name);
  wait_posted(x, x->freq, x->fst);
  for (int s = 0; s < x->np; s++) {
    const pair_t *p = &x->to[s];
    if (p->n == 0) {
      continue;
    }
    const float *f = NULL;
    if (s != x->me) {
      loom_status_t st = posted_payload(s, &x->fst[s], x->fbuf[s], PH_RETURN, p->n,
                                        p->q_floats + p->q_floats / hd * x->H, &f);
      status = status == LOOM_OK ? st : status;
      if (st != LOOM_OK) {
        continue;
      }
    }
    unpack_results(x, p, f, out->data, lse->data);
  }
  // The results this rank sent as a server: Open MPI moves a large message only while its sender
  // is inside MPI, so returning now would leave a peer waiting until this rank's next MPI call.
  wait_sends(x);
  if (status != LOOM_OK) {
    x->broken = status;
  }
  x->st.busy_ms += now_ms() - t_busy;
fail:
  return status;
}

// ---- the phases as requests, for a step scheduler's comm lane --------------------------------

// A ship or finish request's state, linked into its executor's list until it is released.
typedef struct live_req {
  loom_attn_exec_t *x; // NULL once the executor was destroyed
  int finish;          // 0: a ship request, 1: a finish request (out and lse are its results)
  int retired;         // a ship request whose forward went on to a later shipment: it completed
  loom_tensor_t out, lse;
  struct live_req *next;
} live_req_t;

static void detach_requests(loom_attn_exec_t *x) {
  for (live_req_t *s = x->live; s; s = s->next) {
    s->x = NULL;
  }
  x->live = NULL;
}

// A new shipment: the ship requests of earlier forwards completed (every forward is finished
// before the next ships), so a late wait for one returns at once instead of reading this phase.
static void retire_ship_requests(loom_attn_exec_t *x) {
  for (live_req_t *s = x->live; s; s = s->next) {
    s->retired |= !s->finish;
  }
}

static loom_status_t destroyed(const loom_request_t *r) {
  return loom_error(NULL, LOOM_ERR_STATE,
                    "%s: the executor was destroyed while this request was in flight: wait for "
                    "the request before loom_attn_exec_destroy",
                    r->op);
}

// 1 when every send this rank has in flight completed.
static int sends_done(loom_attn_exec_t *x) {
  int flag = 0;
  return MPI_Testall(x->np, x->sreq, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS || flag;
}

static loom_status_t poll_ship(loom_request_t *r, int block, int *done) {
  (void)block;
  live_req_t *s = r->state;
  if (!s->x) {
    *done = 1;
    return destroyed(r);
  }
  *done = s->retired || (test_posted(s->x, s->x->rreq, s->x->rst) && sends_done(s->x));
  return LOOM_OK;
}

static loom_status_t poll_finish(loom_request_t *r, int block, int *done) {
  (void)block;
  live_req_t *f = r->state;
  *done = 0;
  if (!f->x) {
    *done = 1;
    return destroyed(r);
  }
  if (!test_posted(f->x, f->x->freq, f->x->fst) || !sends_done(f->x)) {
    return LOOM_OK;
  }
  *done = 1; // everything arrived: the finish copies the results out and returns
  return loom_attn_exec_finish(f->x, &f->out, &f->lse);
}

static void release_live(loom_request_t *r) {
  live_req_t *s = r->state;
  if (s && s->x) {
    live_req_t **p = &s->x->live;
    while (*p && *p != s) {
      p = &(*p)->next;
    }
    if (*p) {
      *p = s->next;
    }
  }
  free(s);
  r->state = NULL;
}

// A request for x's phase (op names it), linked into x's list; NULL when out of memory.
static loom_request_t *live_request(loom_attn_exec_t *x, const char *op, int finish) {
  live_req_t *s = calloc(1, sizeof *s);
  loom_request_t *r = s ? loom_request_new(op) : NULL;
  if (!r) {
    free(s);
    return NULL;
  }
  s->x = x;
  s->finish = finish;
  s->next = x->live;
  x->live = s;
  r->state = s;
  r->poll = finish ? poll_finish : poll_ship;
  r->release = release_live;
  r->watch = x->watch;
  return r;
}

loom_status_t loom_attn_exec_ship_start(loom_attn_exec_t *x, const loom_tensor_t *q,
                                        const loom_tensor_t *k, const loom_tensor_t *v,
                                        loom_request_t **req) {
  loom_status_t status = LOOM_OK;
  if (!req || !x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_attn_exec_ship_start: %s is NULL",
                      !req ? "req" : "x");
  }
  *req = NULL;
  LOOM_CHECK(loom_attn_exec_ship(x, q, k, v));
  loom_request_t *r = live_request(x, "loom_attn_exec_ship_start", 0);
  if (!r) { // shipped: the phase goes on by hand (compute, finish), or the executor is destroyed
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "loom_attn_exec_ship_start: out of memory for the request (the shipment "
                      "left: call loom_attn_exec_compute and _finish, or destroy the executor)");
  }
  *req = r;
fail:
  return status;
}

loom_status_t loom_attn_exec_finish_start(loom_attn_exec_t *x, loom_tensor_t *out,
                                          loom_tensor_t *lse, loom_request_t **req) {
  static const char op[] = "loom_attn_exec_finish_start";
  loom_status_t status = LOOM_OK;
  if (!req) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: req is NULL", op);
  }
  *req = NULL;
  if (!x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: x is NULL", op);
  }
  LOOM_CHECK(check_broken(x, op));
  if (x->phase != 2) {
    return loom_error(NULL, LOOM_ERR_STATE,
                      "%s: call loom_attn_exec_compute first (every rank ships, computes and "
                      "finishes, in that order)",
                      op);
  }
  LOOM_CHECK(check_results(op, out, lse, x->rows, (int64_t)x->H * x->D, x->H));
  loom_request_t *r = live_request(x, op, 1);
  if (!r) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", op);
  }
  live_req_t *f = r->state;
  f->out = *out;
  f->lse = *lse;
  *req = r;
fail:
  return status;
}

loom_status_t loom_attn_exec_forward(loom_attn_exec_t *x, const loom_tensor_t *q,
                                     const loom_tensor_t *k, const loom_tensor_t *v,
                                     loom_tensor_t *out, loom_tensor_t *lse) {
  loom_status_t status = LOOM_OK;
  static const char op[] = "loom_attn_exec_forward";
  if (!x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: x is NULL", op);
  }
  // out and lse too before anything is sent: a bad one found at the finish would leave the
  // results the servers sent unreceived.
  status = check_results(op, out, lse, x->rows, (int64_t)x->H * x->D, x->H);
  if (status != LOOM_OK) {
    return loom_consistency_refuse(x->g, LOOM_OPK_ATTN_SHIP, q, status);
  }
  LOOM_CHECK(loom_attn_exec_ship(x, q, k, v));
  LOOM_CHECK(loom_attn_exec_compute(x));
  LOOM_CHECK(loom_attn_exec_finish(x, out, lse));
fail:
  return status;
}

// ---- backward -----------------------------------------------------------------------------------

loom_status_t loom_attn_exec_backward(loom_attn_exec_t *x, const loom_tensor_t *dout,
                                      loom_tensor_t *dq, loom_tensor_t *dk, loom_tensor_t *dv) {
  static const char op[] = "loom_attn_exec_backward";
  loom_status_t status = LOOM_OK;
  if (!x) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: x is NULL", op);
  }
  const double t_busy = now_ms();
  const int64_t hd = (int64_t)x->H * x->D, kvd = (int64_t)x->Hkv * x->D;
  const float **in = calloc((size_t)x->np, sizeof(float *));
  const int64_t *task_q = x->task_q, *task_k = x->task_k;
  int posted = 0;  // from here on a failure leaves peers waiting: they get a notice
  int entered = 0; // before: a refused call (LOOM_CHECK_CONSISTENCY tells the members)
  if (!in) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", op);
    goto fail;
  }
  LOOM_CHECK(check_rows(op, "dout", dout, x->rows, hd));
  LOOM_CHECK(check_rows(op, "dq", dq, x->rows, hd));
  LOOM_CHECK(check_rows(op, "dk", dk, x->rows, kvd));
  LOOM_CHECK(check_rows(op, "dv", dv, x->rows, kvd));
  // Each is written whole (dk and dv summed in place): one that shares memory with another would
  // hold their sum. dout is read before any is written, so it may be dq.
  LOOM_CHECK(loom_arg_disjoint(op, "dk", dk, "dq", dq, 0));
  LOOM_CHECK(loom_arg_disjoint(op, "dv", dv, "dq", dq, 0));
  LOOM_CHECK(loom_arg_disjoint(op, "dv", dv, "dk", dk, 0));
  LOOM_CHECK(check_broken(x, op));
  if (!x->batch_ready || x->phase != 0) {
    status = loom_error(NULL, LOOM_ERR_STATE,
                        "%s: run the forward first (ship, compute, finish with this plan)", op);
    goto fail;
  }
  entered = 1;
  LOOM_CHECK(enter_checked(x, LOOM_OPK_ATTN_BACKWARD, dout->name)); // (a mismatch: nothing posted)
  memset(x->notified, 0, (size_t)x->np);
  posted = 1;
  // The receives first: the output gradients of the tasks this rank serves, and the gradients
  // of its own documents from their servers.
  for (int r = 0; r < x->np; r++) {
    const pair_t *in_ = &x->from[r], *out_ = &x->to[r];
    if (r != x->me && in_->n > 0) {
      LOOM_CHECK(post_recv(x, r, PH_BSHIP, in_->q_floats, &x->rbuf[r], &x->rcap[r], &x->rreq[r]));
    }
    if (r != x->me && out_->n > 0) {
      LOOM_CHECK(post_recv(x, r, PH_BRETURN, out_->q_floats + out_->kv_floats, &x->fbuf[r],
                           &x->fcap[r], &x->freq[r]));
    }
  }
  // Ship dout rows of each task to its server (its own tasks' are read from dout).
  for (int s = 0; s < x->np; s++) {
    const pair_t *p = &x->to[s];
    if (p->n == 0 || s == x->me) {
      continue;
    }
    float *f = msg_new(x, s, PH_BSHIP, p->n, p->q_floats);
    if (!f) {
      status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", op);
      goto fail;
    }
    for (int i = 0; i < p->n; i++) {
      const loom_attn_task_t *t = &x->tasks[p->task[i]];
      memcpy(f + p->q_off[i], (const float *)dout->data + (x->doc_row[t->doc] + t->q_lo) * hd,
             sizeof(float) * (size_t)((t->q_hi - t->q_lo) * hd));
    }
    LOOM_CHECK(msg_send(x, s, PH_BSHIP, p->q_floats));
    x->notified[s] |= NOTIFIED_SERVER;
  }
  // Serve: the batch's dout, one backward, then per owner dq rows and the summed dk/dv prefixes.
  LOOM_CHECK(alloc_batch(x, 1));
  wait_posted(x, x->rreq, x->rst);
  for (int r = 0; r < x->np && status == LOOM_OK; r++) { // every message checked first
    if (x->from[r].n > 0 && r != x->me) {
      status = posted_payload(r, &x->rst[r], x->rbuf[r], PH_BSHIP, x->from[r].n,
                              x->from[r].q_floats, &in[r]);
    }
  }
  if (status != LOOM_OK) {
    goto fail;
  }
  for (int r = 0; r < x->np; r++) {
    const pair_t *p = &x->from[r];
    if (p->n == 0) {
      continue;
    }
    for (int i = 0; i < p->n; i++) {
      const loom_attn_task_t *t = &x->tasks[p->task[i]];
      const float *src = r == x->me
                             ? (const float *)dout->data + (x->doc_row[t->doc] + t->q_lo) * hd
                             : in[r] + p->q_off[i];
      memcpy(x->dOb + task_q[p->task[i]] * hd, src,
             sizeof(float) * (size_t)((t->q_hi - t->q_lo) * hd));
    }
  }
  wait_sends(x); // the output gradients reach their servers before this rank's kernel runs
  loom_tensor_t bt[7], dt[4];
  const int64_t sq[3] = {x->bq, x->H, x->D}, sk[3] = {x->bk, x->Hkv, x->D};
  LOOM_CHECK(wrap_batch(x, x->Qb, x->Kb, x->Vb, x->Ob, x->Lb, bt));
  LOOM_CHECK(loom_tensor_wrap(&dt[0], x->dOb, LOOM_F32, LOOM_DEVICE_HOST, 3, sq, "dout"));
  LOOM_CHECK(loom_tensor_wrap(&dt[1], x->dQb, LOOM_F32, LOOM_DEVICE_HOST, 3, sq, "dq"));
  LOOM_CHECK(loom_tensor_wrap(&dt[2], x->dKb, LOOM_F32, LOOM_DEVICE_HOST, 3, sk, "dk"));
  LOOM_CHECK(loom_tensor_wrap(&dt[3], x->dVb, LOOM_F32, LOOM_DEVICE_HOST, 3, sk, "dv"));
  double t0 = now_ms();
  LOOM_CHECK(loom_attention_backward(&dt[1], &dt[2], &dt[3], &dt[0], &bt[0], &bt[1], &bt[2], &bt[3],
                                     &bt[4], &bt[5], &bt[6], x->causal, x->scale));
  x->st.compute_ms += now_ms() - t0;
  for (int r = 0; r < x->np; r++) {
    const pair_t *p = &x->from[r];
    if (p->n == 0) {
      continue;
    }
    float *f = msg_new(x, r, PH_BRETURN, p->n, p->q_floats + p->kv_floats);
    if (!f) {
      status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", op);
      goto fail;
    }
    memset(f + p->q_floats, 0, sizeof(float) * (size_t)p->kv_floats);
    for (int i = 0; i < p->n; i++) { // plan order: the same sum every time
      const loom_attn_task_t *t = &x->tasks[p->task[i]];
      const int64_t nq = t->q_hi - t->q_lo, nk = kv_len(x, t);
      memcpy(f + p->q_off[i], x->dQb + task_q[p->task[i]] * hd, sizeof(float) * (size_t)(nq * hd));
      const int d = x->task_kv[p->task[i]];
      float *gk = f + p->kv_off[d], *gv = gk + p->kv_rows[d] * kvd;
      const float *sk_ = x->dKb + task_k[p->task[i]] * kvd, *sv = x->dVb + task_k[p->task[i]] * kvd;
      for (int64_t j = 0; j < nk * kvd; j++) {
        gk[j] += sk_[j];
        gv[j] += sv[j];
      }
    }
    LOOM_CHECK(msg_send(x, r, PH_BRETURN, p->q_floats + p->kv_floats));
    x->notified[r] |= NOTIFIED_OWNER;
  }
  // Owner: dq rows in place; dk, dv summed over the servers in rank order.
  if (x->rows > 0) {
    memset(dk->data, 0, sizeof(float) * (size_t)(x->rows * kvd));
    memset(dv->data, 0, sizeof(float) * (size_t)(x->rows * kvd));
  }
  wait_posted(x, x->freq, x->fst);
  for (int s = 0; s < x->np; s++) {
    const pair_t *p = &x->to[s];
    if (p->n == 0) {
      continue;
    }
    const float *f = NULL;
    const int64_t nf = p->q_floats + p->kv_floats;
    if (s == x->me) { // built in place by the serving half above
      LOOM_CHECK(loom_attn_msg_check(x->sbuf[s], sizeof(msg_header_t) + 4 * (size_t)nf, s,
                                     PH_BRETURN, p->n, nf, &f));
    } else {
      LOOM_CHECK(posted_payload(s, &x->fst[s], x->fbuf[s], PH_BRETURN, p->n, nf, &f));
    }
    for (int i = 0; i < p->n; i++) {
      const loom_attn_task_t *t = &x->tasks[p->task[i]];
      memcpy((float *)dq->data + (x->doc_row[t->doc] + t->q_lo) * hd, f + p->q_off[i],
             sizeof(float) * (size_t)((t->q_hi - t->q_lo) * hd));
    }
    for (int d = 0; d < p->nkv; d++) {
      const int64_t row = x->doc_row[p->kv_doc[d]], n = p->kv_rows[d] * kvd;
      float *gk = (float *)dk->data + row * kvd, *gv = (float *)dv->data + row * kvd;
      const float *sk_ = f + p->kv_off[d], *sv = sk_ + n;
      for (int64_t j = 0; j < n; j++) {
        gk[j] += sk_[j];
        gv[j] += sv[j];
      }
    }
  }
  wait_sends(x); // every send done before the buffers are reused or freed
fail:
  if (status != LOOM_OK && !entered) {
    loom_consistency_refuse(x->g, LOOM_OPK_ATTN_BACKWARD, dout, status);
  }
  if (status != LOOM_OK && posted) { // peers still waiting for this rank get a failure notice
    send_failed(x, PH_BSHIP, status);
    send_failed(x, PH_BRETURN, status);
  }
  free(in);
  x->st.busy_ms += now_ms() - t_busy;
  return status;
}
