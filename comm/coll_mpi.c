/* coll_mpi.c — the host back end: non-blocking MPI collectives and point-to-point messages, and
 * loom's ordered reduction, which makes float sums bitwise identical on every rank. */
#include "config.h"
#include "comm_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "error.h"
#include "log.h"

// Why an ordered reduction: MPI_Allreduce may add the contributions in different orders on
// different ranks (Open MPI picks the algorithm by size and rank count), so float sums can differ
// in the last bit from rank to rank, and replicas of a model drift apart. loom therefore sums
// floats itself, as a direct reduce-scatter followed by an allgather:
//   1. block j of the input (an even split; the first count % n blocks one element longer) is
//      sent to rank j, which receives block j from every rank;
//   2. rank j adds its n contributions in rank order 0, 1, ..., n-1 (f16/bf16 travel and add as
//      f32 and round once; AVG divides the sum by n) and sends the result to every rank.
// Each element is reduced once, by one rank, in a fixed order, so every rank holds the same
// bits, and they are the same from run to run. Traffic per rank is 2 (n-1)/n of the tensor each
// way, as for a ring, in point-to-point messages (tagged per call on a private duplicate of the
// group's communicator, so that no ordering between calls is needed).
// Both steps move in chunks of at most LOOM_PIPE_BYTES per peer (the tunable, kept with the
// group; split among the peers beyond two ranks), one stage per chunk: when the
// reduce-scatter of chunk c has landed, rank j reduces it and posts its allgather together with
// the reduce-scatter of chunk c + 1. The peers' contributions land in a scratch buffer of one
// chunk per peer, reused from a pool kept with the group, so what is added and what is sent next
// is still in cache, and a large reduction allocates nothing. Chunking changes no sum: each
// element is still added in rank order by its block's owner.
// Integer sums are exact in any order and MAX/MIN do not depend on it: those use MPI_Iallreduce.
// reduce_scatter uses step 1 for every dtype and op.

#define LOOM_PIPE_SPARE 4 // full-size scratch buffers a group keeps for reuse
// Scratch needs from this many bytes up take a full-size buffer from the pool; smaller ones (many
// may be in flight at once: fusion of small tensors) allocate their own.
#define LOOM_PIPE_POOLED ((size_t)32 << 10)

// ---- per-group private communicator and tags ----------------------------------------------------

// Attached to the group's communicator as an MPI attribute (the group itself is const).
struct comm_state {
  MPI_Comm p2p;                 // duplicate of the group's communicator for loom's own messages
  unsigned seq;                 // collectives started on the group: the same on every member
  int tag_pairs;                // (MPI_TAG_UB + 1) / 2: two tags per collective
  pthread_mutex_t lock;         // guards spare[] (requests finish on any thread)
  void *spare[LOOM_PIPE_SPARE]; // full-size pipeline scratch buffers not in use
  int nspare;
};

static int state_keyval = MPI_KEYVAL_INVALID;
static int state_keyval_rc = MPI_SUCCESS;
static pthread_once_t state_keyval_once = PTHREAD_ONCE_INIT;

// Runs when the group's communicator is freed.
static int delete_state(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)comm, (void)keyval, (void)extra;
  struct comm_state *s = value;
  if (s->p2p != MPI_COMM_NULL) {
    MPI_Comm_free(&s->p2p);
  }
  for (int i = 0; i < s->nspare; i++) {
    loom_host_free(s->spare[i]);
  }
  pthread_mutex_destroy(&s->lock);
  free(s);
  return MPI_SUCCESS;
}

static void create_state_keyval(void) {
  state_keyval_rc =
      MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_state, &state_keyval, NULL);
}

// The group's private communicator and the first of two tags for a new collective. Every member
// calls it once per collective, in the same order; the first call duplicates the communicator
// (itself collective over the group: waited for under the watchdog as w, the caller's operation,
// so that a rank skipping the group's first collective is reported like any other).
static loom_status_t group_state(const loom_group_t *g, MPI_Comm *comm, int *tag,
                                 struct comm_state **out, struct loom_watch *w) {
  loom_status_t status = LOOM_OK;
  struct comm_state *s = NULL;
  pthread_once(&state_keyval_once, create_state_keyval);
  LOOM_CHECK_MPI(NULL, state_keyval_rc);
  int found = 0;
  LOOM_CHECK_MPI(NULL, MPI_Comm_get_attr(g->comm, state_keyval, &s, &found));
  if (!found) {
    s = calloc(1, sizeof *s);
    if (!s) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "cannot allocate the communicator state");
    }
    s->p2p = MPI_COMM_NULL;
    pthread_mutex_init(&s->lock, NULL);
    int *ub = NULL, has_ub = 0;
    LOOM_CHECK_MPI(NULL, MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has_ub));
    s->tag_pairs = has_ub && ub && *ub >= 32767 ? (int)(((unsigned)*ub + 1u) / 2u) : 16384;
    MPI_Request dup = MPI_REQUEST_NULL;
    LOOM_CHECK_MPI(NULL, MPI_Comm_idup(g->comm, &s->p2p, &dup));
    LOOM_CHECK_MPI(NULL, loom_watch_waitall(w, 1, &dup));
    LOOM_CHECK_MPI(NULL, MPI_Comm_set_attr(g->comm, state_keyval, s));
    LOOM_TRACE(LOOM_SUB_COLL, "group %s: private communicator for ordered reductions",
               loom_group_kind_name(g->kind));
  }
  *comm = s->p2p;
  *tag = (int)(s->seq % (unsigned)s->tag_pairs) * 2;
  s->seq++;
  if (out) {
    *out = s;
  }
  return LOOM_OK;
fail:
  if (s && !found) {
    if (s->p2p != MPI_COMM_NULL) {
      MPI_Comm_free(&s->p2p);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
  }
  return status;
}

static loom_status_t collective_tags(const loom_group_t *g, MPI_Comm *comm, int *tag,
                                     struct loom_watch *w) {
  return group_state(g, comm, tag, NULL, w);
}

loom_status_t loom_mpi_collective_tags(const loom_group_t *g, MPI_Comm *comm, int *tag,
                                       struct loom_watch *w) {
  return collective_tags(g, comm, tag, w);
}

// A full-size pipeline scratch buffer of the group (bytes: the same for every call on the
// group): a spare one, or a new one; NULL when out of memory.
static void *scratch_take(struct comm_state *cs, size_t bytes) {
  void *p = NULL;
  pthread_mutex_lock(&cs->lock);
  if (cs->nspare > 0) {
    p = cs->spare[--cs->nspare];
  }
  pthread_mutex_unlock(&cs->lock);
  return p ? p : loom_host_alloc(bytes);
}

// Keep p for the next call (up to LOOM_PIPE_SPARE of them) or free it.
static void scratch_give(struct comm_state *cs, void *p) {
  pthread_mutex_lock(&cs->lock);
  if (p && cs->nspare < LOOM_PIPE_SPARE) {
    cs->spare[cs->nspare++] = p;
    p = NULL;
  }
  pthread_mutex_unlock(&cs->lock);
  loom_host_free(p);
}

// ---- message helpers ----------------------------------------------------------------------------

// The limit of elements per MPI message or call (see comm_internal.h). Relaxed atomics: the test
// hook sets it before any transfer, and calls on any thread read it.
static int64_t mpi_chunk = LOOM_MPI_CHUNK;

int64_t loom_mpi_chunk(void) {
  return __atomic_load_n(&mpi_chunk, __ATOMIC_RELAXED);
}

void loom_mpi_set_chunk(int64_t n) {
  __atomic_store_n(&mpi_chunk, n > 0 && n < LOOM_MPI_CHUNK ? n : LOOM_MPI_CHUNK, __ATOMIC_RELAXED);
}

// Post a send (is_send) or a receive of count elements in messages of at most loom_mpi_chunk().
loom_status_t loom_mpi_post_p2p(loom_request_t *r, int is_send, const void *buf, int64_t count,
                                loom_dtype_t dtype, int peer, int tag, MPI_Comm comm) {
  loom_status_t status = LOOM_OK;
  size_t es = loom_dtype_size(dtype);
  MPI_Datatype type = loom_mpi_datatype(dtype);
  const int64_t chunk = loom_mpi_chunk();
  for (int64_t off = 0; off < count; off += chunk) {
    int m = (int)(count - off < chunk ? count - off : chunk);
    MPI_Request *slot = loom_request_slot(r);
    if (!slot) {
      return LOOM_ERR_NOMEM;
    }
    char *p = (char *)buf + (size_t)off * es;
    if (is_send) {
      LOOM_CHECK_MPI(NULL, MPI_Isend(p, m, type, peer, tag, comm, slot));
    } else {
      LOOM_CHECK_MPI(NULL, MPI_Irecv(p, m, type, peer, tag, comm, slot));
    }
  }
fail:
  return status;
}

// Element i of a buffer of es-byte elements; NULL stays NULL (an empty tensor has no data).
static char *elem(const void *p, int64_t i, size_t es) {
  return p ? (char *)p + (size_t)i * es : NULL;
}

// displs[i] = counts[0] + ... + counts[i-1].
static void prefix(const int64_t *counts, int64_t *displs, int n) {
  int64_t d = 0;
  for (int i = 0; i < n; i++) {
    displs[i] = d;
    d += counts[i];
  }
}

// 1 when every count and displacement fits one MPI collective call.
static int fits(const int64_t *counts, int n) {
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    total += counts[i];
  }
  return total <= loom_mpi_chunk();
}

// ---- ordered reduction --------------------------------------------------------------------------

struct ordered {
  loom_dtype_t dtype; // of the result
  loom_dtype_t wire;  // what travels and adds: f32 for f16/bf16 SUM/AVG, else dtype
  loom_redop_t op;
  int n, me, tag;
  int divisor; // AVG divides the sum by it: n, or the whole group's size in a hierarchical phase
  size_t pipe; // LOOM_PIPE_BYTES of the group: bytes per peer per chunk
  MPI_Comm comm;
  struct comm_state *cs; // the group's state: the pool scratch comes from and goes back to
  const char *src;       // (total) wire elements: the input, or its f32 copy
  char *scratch;         // (n - 1, stride) wire elements: the current chunk of my block, by peer
  int64_t stride;        // elements per peer in scratch: min(chunk, counts[me])
  int pooled;            // scratch is a full-size buffer of cs's pool (else owned by r->tmp)
  char *out;             // (counts[me]) my block of the result, in dtype
  char *gather;          // allreduce: the whole result, completed by the allgather; else NULL
  int64_t *counts;       // (n) block sizes
  int64_t *displs;       // (n) block offsets
  int64_t chunk;         // elements per message of one stage (per peer)
  int64_t nchunks;       // stages: chunks of the largest block
  int64_t next;          // the chunk whose reduce-scatter is in flight
};

static void ordered_free(struct ordered *s) {
  if (s) {
    if (s->pooled) {
      scratch_give(s->cs, s->scratch);
    }
    free(s->counts);
    free(s);
  }
}

static void release_ordered(loom_request_t *r) {
  ordered_free(r->state);
  r->state = NULL;
}

// Elements of chunk c of block b (0 past the block's end).
static int64_t chunk_len(const struct ordered *s, int b, int64_t c) {
  int64_t left = s->counts[b] - c * s->chunk;
  return left <= 0 ? 0 : left < s->chunk ? left : s->chunk;
}

// Rank j's contribution to chunk c of my block.
static const char *contribution(const struct ordered *s, int j, int64_t c) {
  size_t ws = loom_dtype_size(s->wire);
  if (j == s->me) {
    return elem(s->src, s->displs[s->me] + c * s->chunk, ws);
  }
  int slot = j < s->me ? j : j - 1;
  return elem(s->scratch, (int64_t)slot * s->stride, ws);
}

// The reduce-scatter of chunk c: my chunk from every peer, each peer's chunk to it.
static loom_status_t post_scatter(loom_request_t *r, const struct ordered *s, int64_t c) {
  loom_status_t status = LOOM_OK;
  size_t ws = loom_dtype_size(s->wire);
  for (int k = 1; k < s->n && status == LOOM_OK; k++) {
    int to = (s->me + k) % s->n, from = (s->me - k + s->n) % s->n;
    status = loom_mpi_post_p2p(r, 0, contribution(s, from, c), chunk_len(s, s->me, c), s->wire,
                               from, s->tag, s->comm);
    if (status == LOOM_OK) {
      status = loom_mpi_post_p2p(r, 1, elem(s->src, s->displs[to] + c * s->chunk, ws),
                                 chunk_len(s, to, c), s->wire, to, s->tag, s->comm);
    }
  }
  return status;
}

// The allgather of chunk c: my reduced chunk to every peer, each peer's reduced chunk from it.
static loom_status_t post_gather(loom_request_t *r, const struct ordered *s, int64_t c) {
  loom_status_t status = LOOM_OK;
  size_t es = loom_dtype_size(s->dtype);
  for (int k = 1; k < s->n && status == LOOM_OK; k++) {
    int to = (s->me + k) % s->n, from = (s->me - k + s->n) % s->n;
    status = loom_mpi_post_p2p(r, 1, elem(s->out, c * s->chunk, es), chunk_len(s, s->me, c),
                               s->dtype, to, s->tag + 1, s->comm);
    if (status == LOOM_OK) {
      status = loom_mpi_post_p2p(r, 0, elem(s->gather, s->displs[from] + c * s->chunk, es),
                                 chunk_len(s, from, c), s->dtype, from, s->tag + 1, s->comm);
    }
  }
  return status;
}

#define TILE 2048 // elements reduced per pass (fits L1 with a few contributions)

// acc = a op b for m wire elements: the first addition of a tile, without copying a first.
static void reduce_pair(const struct ordered *s, void *acc, const void *a, const void *b,
                        int64_t m) {
  if (s->wire == LOOM_F32 && (s->op == LOOM_SUM || s->op == LOOM_AVG)) {
    float *x = acc;
    const float *p = a, *q = b;
    for (int64_t i = 0; i < m; i++) {
      x[i] = p[i] + q[i];
    }
    return;
  }
  memcpy(acc, a, (size_t)m * loom_dtype_size(s->wire));
  loom_reduce_into(s->wire, s->op, acc, b, m);
}

// Sum chunk c of my block in rank order, tile by tile, into out (which may be my own input, in
// place: a tile is read completely before it is written).
static void reduce_chunk(const struct ordered *s, int64_t c) {
  size_t ws = loom_dtype_size(s->wire), es = loom_dtype_size(s->dtype);
  int64_t len = chunk_len(s, s->me, c);
  if (s->n == 1 && s->wire == s->dtype && (s->op != LOOM_AVG || s->divisor == 1)) {
    // one rank: the result is the input (x / 1 is x)
    const char *src = contribution(s, 0, c);
    char *dst = s->out + (size_t)(c * s->chunk) * es;
    if (src != dst) {
      memcpy(dst, src, (size_t)len * es);
    }
    return; // in place: nothing to move (it was two copies of every gradient per step)
  }
  union { // TILE wire elements (f32 when the result is f16/bf16)
    float f32[TILE];
    int64_t i64[TILE];
  } acc;
  for (int64_t off = 0; off < len; off += TILE) {
    int64_t m = len - off < TILE ? len - off : TILE;
    size_t at = (size_t)off * ws;
    if (s->n == 1) {
      memcpy(&acc, contribution(s, 0, c) + at, (size_t)m * ws);
    } else {
      reduce_pair(s, &acc, contribution(s, 0, c) + at, contribution(s, 1, c) + at, m);
    }
    for (int j = 2; j < s->n; j++) {
      loom_reduce_into(s->wire, s->op, &acc, contribution(s, j, c) + at, m);
    }
    if (s->op == LOOM_AVG) { // floats only: the wire is f32
      for (int64_t i = 0; i < m; i++) {
        acc.f32[i] /= (float)s->divisor;
      }
    }
    char *dst = s->out + (size_t)(c * s->chunk + off) * es;
    if (s->wire == s->dtype) {
      memcpy(dst, &acc, (size_t)m * es);
    } else if (s->dtype == LOOM_F16) {
      loom_f32_to_f16_n(acc.f32, (uint16_t *)dst, (size_t)m);
    } else {
      loom_f32_to_bf16_n(acc.f32, (uint16_t *)dst, (size_t)m);
    }
  }
}

// One stage done (the reduce-scatter of chunk next, and the allgather of the chunk before it):
// reduce the chunk, post its allgather and the reduce-scatter of the chunk after it.
// *more = 1 when a reduce-scatter was posted (another stage follows), else 0 (the last
// allgather, if any, is in flight).
static loom_status_t ordered_advance(loom_request_t *r, struct ordered *s, int *more) {
  int64_t c = s->next++;
  reduce_chunk(s, c);
  loom_status_t status = s->gather ? post_gather(r, s, c) : LOOM_OK;
  *more = 0;
  if (status == LOOM_OK && s->next < s->nchunks) {
    status = post_scatter(r, s, s->next);
    *more = 1;
  }
  return status;
}

static loom_status_t ordered_step(loom_request_t *r) {
  int more = 0;
  loom_status_t status = ordered_advance(r, r->state, &more);
  if (more) {
    r->step = ordered_step;
  }
  return status;
}

// The chunk size (elements per peer per stage) and the scratch it needs. Scratch of at least
// LOOM_PIPE_POOLED bytes is a full-size buffer of the group's pool, (n - 1) * per_peer bytes
// whatever the dtype (a chunk of any dtype fits), so that large reductions allocate nothing.
static loom_status_t ordered_scratch(loom_request_t *r, struct ordered *s) {
  size_t ws = loom_dtype_size(s->wire);
  size_t per_peer = s->n > 2 ? s->pipe / (size_t)(s->n - 1) : s->pipe;
  per_peer = per_peer < sizeof(int64_t) ? sizeof(int64_t) : per_peer; // one element of any dtype
  s->chunk = (int64_t)(per_peer / ws);
  int64_t largest = 0;
  for (int i = 0; i < s->n; i++) {
    largest = s->counts[i] > largest ? s->counts[i] : largest;
  }
  s->nchunks = (largest + s->chunk - 1) / s->chunk;
  if (s->n == 1) {
    return LOOM_OK;
  }
  s->stride = s->counts[s->me] < s->chunk ? s->counts[s->me] : s->chunk;
  size_t need = (size_t)(s->n - 1) * (size_t)s->stride * ws;
  if (need < LOOM_PIPE_POOLED) { // a small block: scratch of its size only
    void *p = NULL;
    loom_status_t status = loom_request_tmp(r, need, &p);
    s->scratch = p;
    return status;
  }
  size_t full = (size_t)(s->n - 1) * per_peer;
  s->scratch = scratch_take(s->cs, full);
  if (!s->scratch) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %zu bytes of scratch", r->op,
                      full);
  }
  s->pooled = 1;
  return LOOM_OK;
}

// The ordered reduction of send (sum of counts elements) with the given blocks over g, made
// for request r but not posted (*out_s owns what it allocated; r owns its temporaries). My
// block's result goes to out; gather (the whole result buffer) adds the allgather. AVG divides
// the sums by divisor.
static loom_status_t ordered_new(const loom_group_t *g, const void *send, void *out, void *gather,
                                 const int64_t *counts, loom_dtype_t dtype, loom_redop_t op,
                                 int divisor, loom_request_t *r, struct ordered **out_s) {
  loom_status_t status = LOOM_OK;
  int n = g->size, me = g->rank;
  struct ordered *s = calloc(1, sizeof *s);
  if (!s || !(s->counts = malloc(sizeof(int64_t) * 2 * (size_t)n))) {
    free(s);
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate the reduction state", r->op);
  }
  *out_s = s;
  s->divisor = divisor;
  s->displs = s->counts + n;
  memcpy(s->counts, counts, sizeof(int64_t) * (size_t)n);
  prefix(s->counts, s->displs, n);
  int64_t total = s->displs[n - 1] + s->counts[n - 1];
  int half = dtype == LOOM_F16 || dtype == LOOM_BF16;
  s->dtype = dtype;
  s->wire = half && (op == LOOM_SUM || op == LOOM_AVG) ? LOOM_F32 : dtype;
  s->op = op;
  s->n = n;
  s->me = me;
  s->pipe = g->pipe_bytes > 0 ? (size_t)g->pipe_bytes : (size_t)LOOM_PIPE_BYTES_DEFAULT;
  s->out = out;
  s->gather = gather;
  LOOM_CHECK(group_state(g, &s->comm, &s->tag, &s->cs, &r->watch));
  size_t ws = loom_dtype_size(s->wire);
  s->src = send;
  if (s->wire != dtype) {
    void *wide = NULL;
    LOOM_CHECK(loom_request_tmp(r, (size_t)total * ws, &wide));
    if (dtype == LOOM_F16) {
      loom_f16_to_f32_n(send, wide, (size_t)total);
    } else {
      loom_bf16_to_f32_n(send, wide, (size_t)total);
    }
    s->src = wide;
  }
  LOOM_CHECK(ordered_scratch(r, s));
fail:
  return status;
}

// Start the ordered reduction over g (ordered_new): post the reduce-scatter of the first chunk.
static loom_status_t ordered_start(const loom_group_t *g, const void *send, void *out, void *gather,
                                   const int64_t *counts, loom_dtype_t dtype, loom_redop_t op,
                                   loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  struct ordered *s = NULL;
  status = ordered_new(g, send, out, gather, counts, dtype, op, g->size, r, &s);
  r->state = s; // freed with the request, on failure too
  r->release = release_ordered;
  LOOM_CHECK(status);
  if (s->nchunks > 0) {
    LOOM_CHECK(post_scatter(r, s, 0));
    r->step = ordered_step;
  }
fail:
  return status;
}

// ---- hierarchical allreduce ---------------------------------------------------------------------

// On a group that spans N nodes with L of its ranks on each (L, N >= 2; LOOM_HIER_ALLREDUCE=auto),
// a float SUM/AVG allreduce runs in three phases instead of the flat reduce-scatter + allgather
// among all n = N L ranks:
//   1. an ordered reduce-scatter in the node: local rank i gets block i (an even split in L) of
//      the node's sum, added in local rank order;
//   2. an ordered allreduce of that block among the N ranks with local index i (the rail, one
//      per node, in node order): block i of the whole sum, the node sums added in node order
//      (AVG divides by n once, here);
//   3. an allgather of the L blocks in the node.
// Every element is still reduced by one rank in one fixed order, so all ranks hold the same
// bits, run after run (not the flat scheme's bits: the sum is grouped by node). What leaves a
// node is 2 (N-1)/N of the tensor each way per node, spread over its L ranks; the flat scheme
// sends about 2 (n-L)/n of it from every rank of the node across the link, L times as much.
struct hier {
  struct ordered *phase[2]; // 1: node reduce-scatter (SUM); 2: rail allreduce (op, divisor n)
  int at;                   // the phase whose stages are in flight: 0, 1, 2 (allgather posted)
  char *recv;               // the result (count elements)
  int64_t *counts;          // (2 l) node blocks, then their offsets
  int l, me;                // node size, local rank
  loom_dtype_t dtype;
};

static void release_hier(loom_request_t *r) {
  struct hier *h = r->state;
  if (h) {
    ordered_free(h->phase[0]);
    ordered_free(h->phase[1]);
    free(h->counts);
    free(h);
  }
  r->state = NULL;
}

// Phase 3: my block of the result to every rank of the node, theirs from them, on the node's
// communicator with the second tag of phase 1's pair (phase 1 used only the first).
static loom_status_t post_node_gather(loom_request_t *r, struct hier *h) {
  loom_status_t status = LOOM_OK;
  const struct ordered *s = h->phase[0];
  const int64_t *displs = h->counts + h->l;
  size_t es = loom_dtype_size(h->dtype);
  for (int k = 1; k < h->l && status == LOOM_OK; k++) {
    int to = (h->me + k) % h->l, from = (h->me - k + h->l) % h->l;
    status = loom_mpi_post_p2p(r, 1, elem(h->recv, displs[h->me], es), h->counts[h->me], h->dtype,
                               to, s->tag + 1, s->comm);
    if (status == LOOM_OK) {
      status = loom_mpi_post_p2p(r, 0, elem(h->recv, displs[from], es), h->counts[from], h->dtype,
                                 from, s->tag + 1, s->comm);
    }
  }
  return status;
}

static loom_status_t hier_step(loom_request_t *r) {
  struct hier *h = r->state;
  loom_status_t status = LOOM_OK;
  int more = 0;
  if (h->at < 2) {
    LOOM_CHECK(ordered_advance(r, h->phase[h->at], &more));
    if (more) {
      r->step = hier_step;
      return LOOM_OK;
    }
    if (h->at == 1) { // the rail's last allgather is in flight: phase 3 once it has landed
      h->at = 2;
      r->step = hier_step;
      return LOOM_OK;
    }
    h->at = 1; // the node's reduce-scatter is done (nothing in flight): the rail's turn
    if (h->phase[1]->nchunks > 0) {
      LOOM_CHECK(post_scatter(r, h->phase[1], 0));
      r->step = hier_step;
      return LOOM_OK;
    }
    h->at = 2; // an empty block (count < L): nothing to reduce on this rail
  }
  h->at = 3;
  LOOM_CHECK(post_node_gather(r, h));
fail:
  return status;
}

static void split_even(int64_t count, int n, int64_t *counts) {
  for (int i = 0; i < n; i++) {
    counts[i] = count / n + (i < count % n ? 1 : 0);
  }
}

static loom_status_t hier_start(const loom_group_t *g, const loom_group_t *node,
                                const loom_group_t *rail, const void *send, void *recv,
                                int64_t count, loom_dtype_t dtype, loom_redop_t op,
                                loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  size_t es = loom_dtype_size(dtype);
  struct hier *h = calloc(1, sizeof *h);
  if (!h) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate the reduction state", r->op);
  }
  r->state = h;
  r->release = release_hier;
  h->recv = recv;
  h->l = node->size;
  h->me = node->rank;
  h->dtype = dtype;
  h->counts = malloc(sizeof(int64_t) * 2 * (size_t)h->l);
  int64_t *rail_counts = malloc(sizeof(int64_t) * (size_t)rail->size);
  if (!h->counts || !rail_counts) {
    free(rail_counts);
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d counts", r->op,
                      2 * h->l + rail->size);
  }
  int64_t *displs = h->counts + h->l;
  split_even(count, h->l, h->counts);
  prefix(h->counts, displs, h->l);
  split_even(h->counts[h->me], rail->size, rail_counts);
  int64_t mine = 0;
  for (int i = 0; i < rail->rank; i++) {
    mine += rail_counts[i];
  }
  char *block = elem(recv, displs[h->me], es);
  LOOM_CHECK(ordered_new(node, send, block, NULL, h->counts, dtype, LOOM_SUM, 1, r, &h->phase[0]));
  LOOM_CHECK(ordered_new(rail, block, elem(block, mine, es), block, rail_counts, dtype, op, g->size,
                         r, &h->phase[1]));
  if (h->phase[0]->nchunks > 0) { // else count is 0: nothing to do
    LOOM_CHECK(post_scatter(r, h->phase[0], 0));
    r->step = hier_step;
  }
fail:
  free(rail_counts);
  return status;
}

// ---- reductions ---------------------------------------------------------------------------------

loom_status_t loom_mpi_iallreduce(const loom_group_t *g, const void *send, void *recv,
                                  int64_t count, loom_dtype_t dtype, loom_redop_t op,
                                  loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  int64_t *counts = NULL;
  int n = g->size;
  if (dtype == LOOM_F32 && (op == LOOM_SUM || op == LOOM_AVG) && g->hier_allreduce == 0 && n >= 4) {
    const loom_group_t *node = NULL, *rail = NULL; // NULL: not nodes of equal sizes
    LOOM_CHECK(loom_group_rails(g, &r->watch, &node, &rail));
    if (rail) {
      return hier_start(g, node, rail, send, recv, count, dtype, op, r);
    }
  }
  if (loom_dtype_is_float(dtype) && (op == LOOM_SUM || op == LOOM_AVG)) {
    counts = malloc(sizeof(int64_t) * (size_t)n);
    if (!counts) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d counts", r->op, n);
    }
    for (int i = 0; i < n; i++) {
      counts[i] = count / n + (i < count % n ? 1 : 0);
    }
    int64_t mine = 0;
    for (int i = 0; i < g->rank; i++) {
      mine += counts[i];
    }
    status = ordered_start(g, send, elem(recv, mine, loom_dtype_size(dtype)), recv, counts, dtype,
                           op, r);
    free(counts);
    return status;
  }
  MPI_Comm unused;
  int tag;
  LOOM_CHECK(collective_tags(g, &unused, &tag, &r->watch));
  MPI_Op mop;
  LOOM_CHECK(loom_mpi_op(dtype, op, &mop));
  MPI_Datatype type = loom_mpi_datatype(dtype);
  size_t es = loom_dtype_size(dtype);
  const int64_t chunk = loom_mpi_chunk();
  for (int64_t off = 0; off < count; off += chunk) {
    int m = (int)(count - off < chunk ? count - off : chunk);
    MPI_Request *slot = loom_request_coll_slot(r);
    if (!slot) {
      return LOOM_ERR_NOMEM;
    }
    const void *in = send == recv ? MPI_IN_PLACE : (const char *)send + (size_t)off * es;
    LOOM_CHECK_MPI(
        NULL, MPI_Iallreduce(in, (char *)recv + (size_t)off * es, m, type, mop, g->comm, slot));
  }
fail:
  return status;
}

loom_status_t loom_mpi_ireduce_scatter(const loom_group_t *g, const void *send, void *recv,
                                       const int64_t *counts, loom_dtype_t dtype, loom_redop_t op,
                                       loom_request_t *r) {
  return ordered_start(g, send, recv, NULL, counts, dtype, op, r);
}

// ---- gathers, broadcast, all-to-all -------------------------------------------------------------

// Owned int arrays that MPI reads until a v-collective completes.
static loom_status_t int_arrays(loom_request_t *r, int n, int **counts, int **displs) {
  void *p = NULL;
  loom_status_t status = loom_request_tmp(r, sizeof(int) * 2 * (size_t)n, &p);
  *counts = p;
  *displs = p ? (int *)p + n : NULL;
  return status;
}

loom_status_t loom_mpi_iallgatherv(const loom_group_t *g, const void *send, void *recv,
                                   int64_t count, const int64_t *counts, loom_dtype_t dtype,
                                   loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  int n = g->size, me = g->rank;
  MPI_Datatype type = loom_mpi_datatype(dtype);
  size_t es = loom_dtype_size(dtype);
  int64_t *c64 = calloc(2 * (size_t)n, sizeof(int64_t));
  if (!c64) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d counts", r->op, n);
  }
  int64_t *d64 = c64 + n;
  for (int i = 0; i < n; i++) {
    c64[i] = counts ? counts[i] : count;
  }
  prefix(c64, d64, n);
  MPI_Comm p2p;
  int tag;
  LOOM_CHECK(collective_tags(g, &p2p, &tag, &r->watch));
  if (fits(c64, n)) { // one MPI collective
    MPI_Request *slot = loom_request_coll_slot(r);
    if (!slot) {
      status = LOOM_ERR_NOMEM;
      goto fail;
    }
    if (!counts) {
      LOOM_CHECK_MPI(NULL,
                     MPI_Iallgather(send, (int)count, type, recv, (int)count, type, g->comm, slot));
    } else {
      int *ic = NULL, *id = NULL;
      LOOM_CHECK(int_arrays(r, n, &ic, &id));
      for (int i = 0; i < n; i++) {
        ic[i] = (int)c64[i];
        id[i] = (int)d64[i];
      }
      LOOM_CHECK_MPI(NULL, MPI_Iallgatherv(send, ic[me], type, recv, ic, id, type, g->comm, slot));
    }
  } else { // beyond int counts: point-to-point messages in pieces
    if (c64[me] > 0) {
      memcpy(elem(recv, d64[me], es), send, (size_t)c64[me] * es);
    }
    for (int k = 1; k < n; k++) {
      int to = (me + k) % n, from = (me - k + n) % n;
      LOOM_CHECK(
          loom_mpi_post_p2p(r, 0, elem(recv, d64[from], es), c64[from], dtype, from, tag, p2p));
      LOOM_CHECK(loom_mpi_post_p2p(r, 1, send, c64[me], dtype, to, tag, p2p));
    }
  }
fail:
  free(c64);
  return status;
}

loom_status_t loom_mpi_ibarrier(const loom_group_t *g, loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  MPI_Comm unused;
  int tag;
  LOOM_CHECK(collective_tags(g, &unused, &tag, &r->watch));
  MPI_Request *slot = loom_request_coll_slot(r);
  if (!slot) {
    return LOOM_ERR_NOMEM;
  }
  LOOM_CHECK_MPI(NULL, MPI_Ibarrier(g->comm, slot));
fail:
  return status;
}

loom_status_t loom_mpi_ibroadcast(const loom_group_t *g, void *buf, int64_t count,
                                  loom_dtype_t dtype, int root, loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  MPI_Comm unused;
  int tag;
  LOOM_CHECK(collective_tags(g, &unused, &tag, &r->watch));
  MPI_Datatype type = loom_mpi_datatype(dtype);
  size_t es = loom_dtype_size(dtype);
  const int64_t chunk = loom_mpi_chunk();
  for (int64_t off = 0; off < count; off += chunk) {
    int m = (int)(count - off < chunk ? count - off : chunk);
    MPI_Request *slot = loom_request_coll_slot(r);
    if (!slot) {
      return LOOM_ERR_NOMEM;
    }
    LOOM_CHECK_MPI(NULL, MPI_Ibcast((char *)buf + (size_t)off * es, m, type, root, g->comm, slot));
  }
fail:
  return status;
}

loom_status_t loom_mpi_ialltoallv(const loom_group_t *g, const void *send, void *recv,
                                  int64_t block, const int64_t *send_counts,
                                  const int64_t *recv_counts, loom_dtype_t dtype,
                                  loom_request_t *r) {
  loom_status_t status = LOOM_OK;
  int n = g->size, me = g->rank;
  MPI_Datatype type = loom_mpi_datatype(dtype);
  size_t es = loom_dtype_size(dtype);
  int64_t *c = calloc(4 * (size_t)n, sizeof(int64_t));
  if (!c) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d counts", r->op, n);
  }
  int64_t *sc = c, *rc = c + n, *sd = c + 2 * n, *rd = c + 3 * n;
  for (int i = 0; i < n; i++) {
    sc[i] = send_counts ? send_counts[i] : block;
    rc[i] = recv_counts ? recv_counts[i] : block;
  }
  prefix(sc, sd, n);
  prefix(rc, rd, n);
  MPI_Comm p2p;
  int tag;
  LOOM_CHECK(collective_tags(g, &p2p, &tag, &r->watch));
  // Equal blocks take MPI_Ialltoall when they fit its int counts (the same on every rank).
  // Variable counts differ per rank, so whether they would fit is not known everywhere: they
  // always go point to point (as MPI's own linear alltoallv does).
  if (!send_counts && fits(sc, n)) {
    MPI_Request *slot = loom_request_coll_slot(r);
    if (!slot) {
      status = LOOM_ERR_NOMEM;
      goto fail;
    }
    LOOM_CHECK_MPI(NULL,
                   MPI_Ialltoall(send, (int)block, type, recv, (int)block, type, g->comm, slot));
  } else {
    if (sc[me] > 0) {
      memcpy(elem(recv, rd[me], es), elem(send, sd[me], es), (size_t)sc[me] * es);
    }
    for (int k = 1; k < n; k++) {
      int to = (me + k) % n, from = (me - k + n) % n;
      LOOM_CHECK(
          loom_mpi_post_p2p(r, 0, elem(recv, rd[from], es), rc[from], dtype, from, tag, p2p));
      LOOM_CHECK(loom_mpi_post_p2p(r, 1, elem(send, sd[to], es), sc[to], dtype, to, tag, p2p));
    }
  }
fail:
  free(c);
  return status;
}

// ---- point to point -----------------------------------------------------------------------------

loom_status_t loom_mpi_isend(const loom_group_t *g, const void *buf, int64_t count,
                             loom_dtype_t dtype, int peer, int tag, loom_request_t *r) {
  return loom_mpi_post_p2p(r, 1, buf, count, dtype, peer, tag, g->comm);
}

loom_status_t loom_mpi_irecv(const loom_group_t *g, void *buf, int64_t count, loom_dtype_t dtype,
                             int peer, int tag, loom_request_t *r) {
  return loom_mpi_post_p2p(r, 0, buf, count, dtype, peer, tag, g->comm);
}
