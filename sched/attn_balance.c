/* attn_balance.c — the core attention balancer (DistCA's CAD): documents' attention cut into
 * query-shard tasks and moved from the most to the least loaded rank until the load is even. */
#include "config.h"
#include "loom_attn_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

// ---------------------------------------------------------------------------------------------
// Cost model.

void loom_attn_balance_opts_init(loom_attn_balance_opts_t *o) {
  if (!o) {
    return;
  }
  memset(o, 0, sizeof *o);
  o->tolerance = 0.1;
  o->causal = 1;
  o->min_shard = 64;
  o->servers_first = 0;
  o->bytes_per_q_row = 3.0 * 4.0 * 64.0;
  o->bytes_per_kv_row = 2.0 * 4.0 * 64.0;
  o->row_cost = 0.0;
}

double loom_attn_task_cost(int64_t q_lo, int64_t q_hi, int64_t doc_len, int causal) {
  if (q_lo < 0 || q_hi <= q_lo || q_hi > doc_len) {
    return 0.0;
  }
  double q = (double)(q_hi - q_lo);
  if (!causal) {
    return q * (double)doc_len;
  }
  return q * (double)q_hi - q * (q - 1.0) / 2.0;
}

void loom_attn_plan_free(loom_attn_plan_t *p) {
  if (!p) {
    return;
  }
  free(p->tasks);
  free(p->load);
  memset(p, 0, sizeof *p);
}

// ---------------------------------------------------------------------------------------------
// The working state: tasks in one array (indices stable; a split appends), each on a doubly
// linked list of its rank and a singly linked list of its document.

typedef struct task {
  int doc, server;
  int64_t lo, hi;
  double cost;
  int prev, next; // the rank's list (-1: end)
  int dnext;      // the document's list (-1: end)
} task_t;

typedef struct bal {
  const loom_attn_doc_t *docs;
  int causal;
  double row_cost; // pairs one query row costs on top of its pairs
  int64_t min_shard;
  double bq, bkv;
  task_t *t;
  int nt, cap;
  int *rhead;   // (nranks) first task on each rank, -1: none
  int *dhead;   // (ndocs) first task of each document, -1: none
  double *load; // (nranks) cost on each rank
} bal_t;

// The largest row_cost taken: far above any kernel's per-row work (a few thousand pairs), low
// enough that costs and the squares solved for split points stay finite.
#define ROW_COST_MAX 1e12

// The cost of query rows [lo, hi) of document doc: its pairs plus row_cost per row.
static double cost_of(int64_t lo, int64_t hi, int64_t len, int causal, double row_cost) {
  double pairs = loom_attn_task_cost(lo, hi, len, causal);
  return pairs > 0 ? pairs + row_cost * (double)(hi - lo) : 0.0;
}

static double bal_cost(const bal_t *b, int doc, int64_t lo, int64_t hi) {
  return cost_of(lo, hi, b->docs[doc].len, b->causal, b->row_cost);
}

static int push_task(bal_t *b, int doc, int64_t lo, int64_t hi, int server) {
  if (b->nt == b->cap) {
    int cap = b->cap ? 2 * b->cap : 64;
    task_t *t = realloc(b->t, sizeof *t * (size_t)cap);
    if (!t) {
      return -1;
    }
    b->t = t;
    b->cap = cap;
  }
  int i = b->nt++;
  task_t *t = &b->t[i];
  t->doc = doc;
  t->lo = lo;
  t->hi = hi;
  t->server = server;
  t->cost = bal_cost(b, doc, lo, hi);
  t->prev = -1;
  t->next = b->rhead[server];
  if (t->next >= 0) {
    b->t[t->next].prev = i;
  }
  b->rhead[server] = i;
  t->dnext = b->dhead[doc];
  b->dhead[doc] = i;
  b->load[server] += t->cost;
  return i;
}

static void unlink_task(bal_t *b, int i) {
  task_t *t = &b->t[i];
  if (t->prev >= 0) {
    b->t[t->prev].next = t->next;
  } else {
    b->rhead[t->server] = t->next;
  }
  if (t->next >= 0) {
    b->t[t->next].prev = t->prev;
  }
  t->prev = t->next = -1;
}

static void link_task(bal_t *b, int i, int server) {
  task_t *t = &b->t[i];
  t->server = server;
  t->prev = -1;
  t->next = b->rhead[server];
  if (t->next >= 0) {
    b->t[t->next].prev = i;
  }
  b->rhead[server] = i;
}

// Key/value rows a piece [lo, hi) of doc reads.
static double kv_rows(const bal_t *b, int doc, int64_t hi) {
  return b->causal ? (double)hi : (double)b->docs[doc].len;
}

// The longest key/value prefix of doc that rank r holds, not counting task skip.
static double kv_held(const bal_t *b, int doc, int r, int skip) {
  double m = 0.0;
  for (int j = b->dhead[doc]; j >= 0; j = b->t[j].dnext) {
    if (j != skip && b->t[j].server == r) {
      double kv = kv_rows(b, doc, b->t[j].hi);
      m = kv > m ? kv : m;
    }
  }
  return m;
}

// How bytes_moved changes when rows [a, c) of task i (its whole, head or tail) go to rank dst:
// shipping them to dst unless dst owns the document, less what they cost where they are.
static double move_bytes(const bal_t *b, int i, int64_t a, int64_t c, int dst) {
  const task_t *t = &b->t[i];
  int owner = b->docs[t->doc].owner;
  double q = (double)(c - a), kv = kv_rows(b, t->doc, c), delta = 0.0;
  if (dst != owner) {
    double have = kv_held(b, t->doc, dst, -1);
    delta += q * b->bq + (kv > have ? kv - have : 0.0) * b->bkv;
  }
  if (t->server != owner) {
    double other = kv_held(b, t->doc, t->server, i), mine = kv_rows(b, t->doc, t->hi);
    double before = other > mine ? other : mine;
    double rest = 0.0; // what stays of task i reads this prefix
    if (a > t->lo) {
      rest = kv_rows(b, t->doc, a);
    } else if (c < t->hi) {
      rest = mine;
    }
    double after = other > rest ? other : rest;
    delta -= q * b->bq + (before - after) * b->bkv;
  }
  return delta;
}

// ---------------------------------------------------------------------------------------------
// Choosing a move.

typedef struct cand {
  int task;
  int kind;     // 0: the whole task, 1: its head [lo, cut), 2: its tail [cut, hi)
  int64_t a, c; // the rows moved
  double w;     // their pairs
  double score; // bytes added per pair moved
  int fits;     // 1: aims at the amount wanted (a whole task within it, or a piece cut for it)
} cand_t;

// Is x a better move than y (see loom_attn_balance)?
static int better(const cand_t *x, const cand_t *y) {
  if (y->task < 0) {
    return 1;
  }
  if (x->fits != y->fits) {
    return x->fits;
  }
  if (x->fits) {
    if (x->score != y->score) {
      return x->score < y->score;
    }
    if (x->w != y->w) {
      return x->w > y->w;
    }
  } else {
    if (x->w != y->w) {
      return x->w < y->w;
    }
    if (x->score != y->score) {
      return x->score < y->score;
    }
  }
  if (x->task != y->task) {
    return x->task < y->task;
  }
  return x->kind < y->kind;
}

static double piece_cost(const bal_t *b, const task_t *t, int head, int64_t q) {
  return head ? bal_cost(b, t->doc, t->lo, t->lo + q) : bal_cost(b, t->doc, t->hi - q, t->hi);
}

// Rows of the head (or tail) piece of task t whose cost is nearest need: with r the row cost,
// the root of q^2 / 2 + q (lo + 1/2 + r) = need (head) or q (hi + 1/2 + r) - q^2 / 2 = need
// (tail), in the form that does not cancel, then the nearest of the rows around it. Kept within
// [min_shard, rows - min_shard]; *clamped says that moved it.
static int64_t piece_rows(const bal_t *b, const task_t *t, int head, double need, int *clamped) {
  int64_t n = t->hi - t->lo;
  double x;
  if (!b->causal) {
    x = need / ((double)b->docs[t->doc].len + b->row_cost);
  } else if (head) {
    double s = (double)t->lo + 0.5 + b->row_cost;
    x = 2.0 * need / (s + sqrt(s * s + 2.0 * need));
  } else {
    double s = (double)t->hi + 0.5 + b->row_cost, d = s * s - 2.0 * need;
    x = d > 0 ? 2.0 * need / (s + sqrt(d)) : (double)n;
  }
  int64_t q = x < (double)n ? (int64_t)x : n, best = q;
  double err = INFINITY;
  for (int64_t k = q - 1; k <= q + 1; k++) {
    if (k >= 0 && k <= n) {
      double e = fabs(piece_cost(b, t, head, k) - need);
      if (e < err) {
        err = e;
        best = k;
      }
    }
  }
  q = best < b->min_shard ? b->min_shard : best;
  q = q > n - b->min_shard ? n - b->min_shard : q;
  *clamped = q != best;
  return q;
}

static void consider(const bal_t *b, cand_t *best, int i, int kind, int64_t a, int64_t c, int fits,
                     double gap, int dst) {
  cand_t x = {.task = i, .kind = kind, .a = a, .c = c, .fits = fits};
  x.w = bal_cost(b, b->t[i].doc, a, c);
  if (!(x.w > 0) || !(x.w < gap)) { // it must lower the larger of the two ranks' loads
    return;
  }
  x.score = move_bytes(b, i, a, c, dst) / x.w;
  if (better(&x, best)) {
    *best = x;
  }
}

// The best move of work from rank src to rank dst; task -1 when none lowers the maximum.
static cand_t choose(const bal_t *b, int src, int dst, double need, double gap) {
  cand_t best = {.task = -1};
  for (int i = b->rhead[src]; i >= 0; i = b->t[i].next) {
    const task_t *t = &b->t[i];
    consider(b, &best, i, 0, t->lo, t->hi, t->cost <= need, gap, dst);
    if (t->cost > need && (t->hi - t->lo) / 2 >= b->min_shard) { // (2 x min_shard overflows)
      int clamped;
      int64_t q = piece_rows(b, t, 1, need, &clamped);
      consider(b, &best, i, 1, t->lo, t->lo + q, !clamped, gap, dst);
      q = piece_rows(b, t, 0, need, &clamped);
      consider(b, &best, i, 2, t->hi - q, t->hi, !clamped, gap, dst);
    }
  }
  return best;
}

static loom_status_t apply(bal_t *b, const cand_t *m, int src, int dst) {
  if (m->kind == 0) {
    unlink_task(b, m->task);
    link_task(b, m->task, dst);
    b->load[src] -= m->w;
    b->load[dst] += m->w;
    return LOOM_OK;
  }
  task_t *t = &b->t[m->task];
  int doc = t->doc;
  if (m->kind == 1) {
    t->lo = m->c;
  } else {
    t->hi = m->a;
  }
  double was = t->cost;
  t->cost = bal_cost(b, doc, t->lo, t->hi);
  b->load[src] -= was - t->cost;
  if (push_task(b, doc, m->a, m->c, dst) < 0) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "attention balancer: out of memory");
  }
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Placement.

// A min-heap of ranks by (load, index) for spreading documents over dedicated servers.
static int heap_less(const double *load, int x, int y) {
  if (load[x] != load[y]) {
    return load[x] < load[y];
  }
  return x < y;
}

static void heap_down(int *h, int n, const double *load, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && heap_less(load, h[l], h[m])) {
      m = l;
    }
    if (r < n && heap_less(load, h[r], h[m])) {
      m = r;
    }
    if (m == i) {
      return;
    }
    int tmp = h[i];
    h[i] = h[m];
    h[m] = tmp;
    i = m;
  }
}

typedef struct by_len {
  int64_t len;
  int doc;
} by_len_t;

static int by_len_desc(const void *pa, const void *pb) {
  const by_len_t *a = pa, *b = pb;
  if (a->len != b->len) { // a longer document has more pairs, causal or not
    return a->len > b->len ? -1 : 1;
  }
  return (a->doc > b->doc) - (a->doc < b->doc);
}

static int by_doc_row(const void *pa, const void *pb) {
  const loom_attn_task_t *a = pa, *b = pb;
  if (a->doc != b->doc) {
    return a->doc < b->doc ? -1 : 1;
  }
  return (a->q_lo > b->q_lo) - (a->q_lo < b->q_lo);
}

static loom_status_t check_args(const loom_attn_doc_t *docs, int ndocs, int nranks,
                                const loom_attn_balance_opts_t *o, const loom_attn_plan_t *out) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "attention balancer: out is NULL: pass a plan");
  }
  if (nranks < 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: nranks = %d: need at least 1 rank", nranks);
  }
  if (ndocs < 0 || (ndocs > 0 && !docs)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: ndocs = %d with docs %s: need ndocs >= 0 and a docs "
                      "array when ndocs > 0",
                      ndocs, docs ? "set" : "NULL");
  }
  if (!(o->tolerance >= 0)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: tolerance = %g: need tolerance >= 0 (0.1: within 10%% "
                      "of the mean)",
                      o->tolerance);
  }
  if (o->causal != 0 && o->causal != 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: causal = %d: need 1 (causal) or 0 (full attention)",
                      o->causal);
  }
  if (o->min_shard < 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: min_shard = %lld: need at least 1 query row",
                      (long long)o->min_shard);
  }
  if (o->servers_first < 0 || o->servers_first > nranks) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: servers_first = %d with nranks = %d: need 0 <= "
                      "servers_first <= nranks (0 or nranks: in-place)",
                      o->servers_first, nranks);
  }
  if (!(o->row_cost >= 0) || !(o->row_cost <= ROW_COST_MAX)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: row_cost = %g: need 0 <= row_cost <= %g pairs per "
                      "row (0: pairs only; loom_attn_measure_row_cost measures it)",
                      o->row_cost, ROW_COST_MAX);
  }
  if (!(o->bytes_per_q_row >= 0) || !(o->bytes_per_kv_row >= 0) || isinf(o->bytes_per_q_row) ||
      isinf(o->bytes_per_kv_row)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "attention balancer: bytes_per_q_row = %g, bytes_per_kv_row = %g: need "
                      "finite values >= 0 (loom_attn_balance_opts_init sets them)",
                      o->bytes_per_q_row, o->bytes_per_kv_row);
  }
  int ntrain = o->servers_first > 0 ? o->servers_first : nranks;
  for (int d = 0; d < ndocs; d++) {
    if (docs[d].len < 0 || docs[d].owner < 0 || docs[d].owner >= ntrain) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "attention balancer: document %d has owner %d and length %lld: need "
                        "length >= 0 and 0 <= owner < %d (%s)",
                        d, docs[d].owner, (long long)docs[d].len, ntrain,
                        ntrain < nranks ? "the training ranks below servers_first" : "nranks");
    }
  }
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// The balancer.

loom_status_t loom_attn_balance(const loom_attn_doc_t *docs, int ndocs, int nranks,
                                const loom_attn_balance_opts_t *opts, loom_attn_plan_t *out) {
  loom_attn_balance_opts_t o;
  if (opts) {
    o = *opts;
  } else {
    loom_attn_balance_opts_init(&o);
  }
  if (out) {
    memset(out, 0, sizeof *out);
  }
  loom_status_t status = check_args(docs, ndocs, nranks, &o, out);
  if (status != LOOM_OK) {
    return status;
  }
  const int dedicated = o.servers_first > 0 && o.servers_first < nranks;
  const int s0 = dedicated ? o.servers_first : 0; // serving ranks [s0, nranks)
  const int ntrain = dedicated ? o.servers_first : nranks, ns = nranks - s0;
  bal_t b = {.docs = docs,
             .causal = o.causal,
             .row_cost = o.row_cost,
             .min_shard = o.min_shard,
             .bq = o.bytes_per_q_row,
             .bkv = o.bytes_per_kv_row};
  by_len_t *order = NULL;
  int *heap = NULL;
  b.rhead = malloc(sizeof(int) * (size_t)nranks);
  b.dhead = malloc(sizeof(int) * (size_t)(ndocs > 0 ? ndocs : 1));
  b.load = calloc((size_t)nranks, sizeof(double));
  out->load = calloc((size_t)nranks, sizeof(double));
  if (!b.rhead || !b.dhead || !b.load || !out->load) {
    goto nomem;
  }
  for (int r = 0; r < nranks; r++) {
    b.rhead[r] = -1;
  }
  for (int d = 0; d < ndocs; d++) {
    b.dhead[d] = -1;
  }

  // Before: every document on its owner.
  double total = 0.0, max_before = 0.0;
  for (int d = 0; d < ndocs; d++) {
    double c = cost_of(0, docs[d].len, docs[d].len, o.causal, o.row_cost);
    total += c;
    b.load[docs[d].owner] += c;
  }
  for (int r = 0; r < ntrain; r++) {
    max_before = b.load[r] > max_before ? b.load[r] : max_before;
  }
  out->max_over_mean_before = total > 0 ? max_before / (total / ntrain) : 1.0;
  memset(b.load, 0, sizeof(double) * (size_t)nranks);

  // Start: in-place, every document whole on its owner; dedicated, longest first onto the
  // least loaded server.
  if (!dedicated) {
    for (int d = 0; d < ndocs; d++) {
      if (docs[d].len > 0 && push_task(&b, d, 0, docs[d].len, docs[d].owner) < 0) {
        goto nomem;
      }
    }
  } else {
    order = malloc(sizeof *order * (size_t)(ndocs > 0 ? ndocs : 1));
    heap = malloc(sizeof(int) * (size_t)ns);
    if (!order || !heap) {
      goto nomem;
    }
    for (int d = 0; d < ndocs; d++) {
      order[d] = (by_len_t){.len = docs[d].len, .doc = d};
    }
    qsort(order, (size_t)ndocs, sizeof *order, by_len_desc);
    for (int k = 0; k < ns; k++) {
      heap[k] = s0 + k; // equal loads, ascending index: already a heap
    }
    for (int k = 0; k < ndocs && order[k].len > 0; k++) {
      if (push_task(&b, order[k].doc, 0, order[k].len, heap[0]) < 0) {
        goto nomem;
      }
      heap_down(heap, ns, b.load, 0);
    }
  }

  // Move work from the most to the least loaded serving rank. Each move lowers the sum of
  // squared loads; the cap only guards against a long tail of tiny moves.
  const double mean = total / ns, goal = (1.0 + o.tolerance) * mean;
  const long max_moves = 16L * (b.nt + ns) + 1024;
  for (long move = 0; move < max_moves && total > 0; move++) {
    int src = s0, dst = s0;
    for (int r = s0 + 1; r < nranks; r++) {
      src = b.load[r] > b.load[src] ? r : src;
      dst = b.load[r] < b.load[dst] ? r : dst;
    }
    if (b.load[src] <= goal) {
      break;
    }
    double gap = b.load[src] - b.load[dst];
    double need = b.load[src] - mean < mean - b.load[dst] ? b.load[src] - mean : mean - b.load[dst];
    if (!(need > 0)) {
      break;
    }
    cand_t m = choose(&b, src, dst, need, gap);
    if (m.task < 0) {
      break;
    }
    if ((status = apply(&b, &m, src, dst)) != LOOM_OK) {
      goto fail;
    }
  }

  // The plan: tasks by (document, first row), adjacent pieces on one rank merged.
  out->tasks = calloc((size_t)(b.nt > 0 ? b.nt : 1), sizeof(loom_attn_task_t)); // zero padding
  if (!out->tasks) {
    goto nomem;
  }
  for (int i = 0; i < b.nt; i++) {
    const task_t *t = &b.t[i];
    loom_attn_task_t *pt = &out->tasks[i];
    pt->doc = t->doc;
    pt->q_lo = t->lo;
    pt->q_hi = t->hi;
    pt->owner = docs[t->doc].owner;
    pt->server = t->server;
  }
  qsort(out->tasks, (size_t)b.nt, sizeof(loom_attn_task_t), by_doc_row);
  int n = 0;
  for (int i = 0; i < b.nt; i++) {
    loom_attn_task_t *p = n > 0 ? &out->tasks[n - 1] : NULL;
    const loom_attn_task_t *t = &out->tasks[i];
    if (p && p->doc == t->doc && p->server == t->server && p->q_hi == t->q_lo) {
      p->q_hi = t->q_hi;
    } else {
      out->tasks[n++] = *t;
    }
  }
  out->ntasks = n;

  // Loads, balance and bytes of the plan as it stands.
  double max_after = 0.0, bytes = 0.0;
  for (int i = 0; i < n; i++) {
    const loom_attn_task_t *t = &out->tasks[i];
    int64_t len = docs[t->doc].len;
    out->load[t->server] += cost_of(t->q_lo, t->q_hi, len, o.causal, o.row_cost);
    if (t->server == t->owner) {
      continue;
    }
    bytes += (double)(t->q_hi - t->q_lo) * o.bytes_per_q_row;
    int first = 1; // the first task of its document on this server pays the longest prefix
    double kv = 0.0;
    for (int j = i; j >= 0 && out->tasks[j].doc == t->doc; j--) {
      first &= j == i || out->tasks[j].server != t->server;
    }
    for (int j = i; first && j < n && out->tasks[j].doc == t->doc; j++) {
      if (out->tasks[j].server == t->server) {
        double r = o.causal ? (double)out->tasks[j].q_hi : (double)len;
        kv = r > kv ? r : kv;
      }
    }
    bytes += kv * o.bytes_per_kv_row;
  }
  for (int r = s0; r < nranks; r++) {
    max_after = out->load[r] > max_after ? out->load[r] : max_after;
  }
  out->max_over_mean = total > 0 ? max_after / mean : 1.0;
  out->bytes_moved = bytes;
  status = LOOM_OK;
  goto done;

nomem:
  status = loom_error(NULL, LOOM_ERR_NOMEM, "attention balancer: out of memory");
fail:
  loom_attn_plan_free(out);
done:
  free(b.t);
  free(b.rhead);
  free(b.dhead);
  free(b.load);
  free(order);
  free(heap);
  return status;
}
