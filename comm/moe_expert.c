/* moe_expert.c — the expert side of an MoE layer: dispatch, the expert FFN tile by tile, combine,
 * forward and backward, in the three overlap modes (none, coarse chunks, COMET's fine split). */
#include "config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/activation_cpu.h"
#include "cpu/linear_cpu.h"
#include "error.h"
#include "moe_internal.h"

// Tags on the layer's private communicator: dispatch, and the combine by column slice.
#define TAG_DISPATCH 1
#define TAG_COMBINE  100

// ---- requests ---------------------------------------------------------------------------------

typedef struct reqs {
  MPI_Request *r;
  int n, cap;
  double *comm_ms;      // time spent waiting, added to the layer's
  int every, since;     // test after every `every` tiles (0: never); tiles since the last test
  struct loom_watch *w; // the layer call, for the watchdog (LOOM_TIMEOUT)
} reqs_t;

static loom_status_t post(reqs_t *q, MPI_Comm comm, int is_send, float *buf, int64_t count,
                          int peer, int tag) {
  if (count > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "MoE: a message of %lld floats to or from rank %d exceeds MPI's int count: "
                      "use more experts per rank (LOOM_EP_SIZE) or fewer tokens per step",
                      (long long)count, peer);
  }
  if (q->n == q->cap) {
    int cap = q->cap ? 2 * q->cap : 64;
    MPI_Request *r = realloc(q->r, sizeof *r * (size_t)cap);
    if (!r) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "MoE: out of memory for MPI requests");
    }
    q->r = r;
    q->cap = cap;
  }
  MPI_Request *slot = &q->r[q->n++];
  int rc = is_send ? MPI_Isend(buf, (int)count, MPI_FLOAT, peer, tag, comm, slot)
                   : MPI_Irecv(buf, (int)count, MPI_FLOAT, peer, tag, comm, slot);
  if (rc != MPI_SUCCESS) {
    q->n--;
    return loom_error(NULL, LOOM_ERR_MPI, "MoE: posting a %s of %lld floats with rank %d failed",
                      is_send ? "send" : "receive", (long long)count, peer);
  }
  return LOOM_OK;
}

// Let MPI move what is in flight (one test of every request) after every q->every tiles: Open MPI
// moves a large message only while some thread is inside MPI (DESIGN.md, Scheduler).
static void poll(reqs_t *q) {
  int flag = 0;
  if (q->every > 0 && ++q->since >= q->every && q->n > 0) {
    q->since = 0;
    MPI_Testall(q->n, q->r, &flag, MPI_STATUSES_IGNORE);
  }
}

static loom_status_t wait_range(reqs_t *q, int lo, int hi) {
  double t0 = MPI_Wtime();
  int rc = hi > lo ? loom_watch_waitall(q->w, hi - lo, q->r + lo) : MPI_SUCCESS;
  *q->comm_ms += 1e3 * (MPI_Wtime() - t0);
  return rc == MPI_SUCCESS
             ? LOOM_OK
             : loom_error(NULL, LOOM_ERR_MPI, "MoE: waiting for the all-to-all failed");
}

// The next completed request of [lo, hi) (its index), or -1 when all completed earlier.
static int wait_any(reqs_t *q, int lo, int hi) {
  int which = MPI_UNDEFINED;
  double t0 = MPI_Wtime();
  if (hi > lo) {
    loom_watch_waitany(q->w, hi - lo, q->r + lo, &which);
  }
  *q->comm_ms += 1e3 * (MPI_Wtime() - t0);
  return which == MPI_UNDEFINED ? -1 : lo + which;
}

// ---- layout -----------------------------------------------------------------------------------

int64_t loom_moe_tile_offset(const struct loom_moe *m, const int64_t *cnt, int c, int e) {
  int64_t off = 0;
  for (int cc = 0; cc < c; cc++) {
    for (int ee = 0; ee < m->el; ee++) {
      off += moe_chunk_rows(m, cnt, ee, cc);
    }
  }
  for (int ee = 0; ee < e; ee++) {
    off += moe_chunk_rows(m, cnt, ee, c);
  }
  return off;
}

static int64_t slice_lo(const struct loom_moe *m, int j) {
  return moe_part_lo(m->cfg.hidden, m->slices, j);
}

// Rows of chunk c of rank r's block (all experts) and where they start in the block.
static int64_t chunk_rows(const struct loom_moe *m, const int64_t *cnt, int c) {
  return loom_moe_tile_offset(m, cnt, c + 1, 0) - loom_moe_tile_offset(m, cnt, c, 0);
}

// A tile: rows of (rank s's block, chunk c, local expert e).
typedef struct tile {
  int s, c, e;
  int64_t row;  // first row in the expert-side buffers (recv_x, pre, h, d_recv, dpre)
  int64_t rows; // its rows
  int64_t in_s; // first row inside s's block
} tile_t;

static tile_t tile_at(const struct loom_moe *m, int s, int c, int e) {
  const int64_t *cnt = m->cnt_recv + (size_t)s * (size_t)m->el;
  tile_t t = {.s = s, .c = c, .e = e};
  t.in_s = loom_moe_tile_offset(m, cnt, c, e);
  t.row = m->off_recv[s] + t.in_s;
  t.rows = moe_chunk_rows(m, cnt, e, c);
  return t;
}

float *loom_moe_sliced(const struct loom_moe *m, float *buf, const int64_t *off, int r, int j,
                       int64_t in_r) {
  const int64_t n_r = off[r + 1] - off[r], j0 = slice_lo(m, j), hj = slice_lo(m, j + 1) - j0;
  return buf + off[r] * m->cfg.hidden + n_r * j0 + in_r * hj;
}

// ---- the tiles --------------------------------------------------------------------------------

static const float *pw(const struct loom_moe *m, loom_moe_param_t p) {
  return m->param[p].data;
}

static float *gw(struct loom_moe *m, loom_moe_param_t p) {
  return m->grad[p].data;
}

// pre = x W1_e + b1_e; h = gelu(pre).
static void tile_gemm0(struct loom_moe *m, const tile_t *t) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn;
  if (t->rows == 0) {
    return;
  }
  double t0 = MPI_Wtime();
  float *pre = m->pre.p + t->row * F;
  loom_cpu_gemm(0, 0, t->rows, F, H, 1.0f, m->recv_x.p + t->row * H,
                pw(m, LOOM_MOE_W1) + (size_t)t->e * (size_t)(H * F),
                pw(m, LOOM_MOE_B1) + (size_t)t->e * (size_t)F, 0.0f, pre);
  loom_cpu_gelu_forward(t->rows * F, pre, m->h.p + t->row * F);
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
}

// Slice j of out = h W2_e + b2_e, into out_exp.
static void tile_gemm1(struct loom_moe *m, const tile_t *t, int j) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, j0 = slice_lo(m, j);
  const int64_t hj = slice_lo(m, j + 1) - j0;
  if (t->rows == 0 || hj == 0) {
    return;
  }
  double t0 = MPI_Wtime();
  loom_cpu_gemm_strided(0, 0, t->rows, hj, F, 1.0f, m->h.p + t->row * F, F,
                        pw(m, LOOM_MOE_W2) + (size_t)t->e * (size_t)(F * H) + j0, H,
                        pw(m, LOOM_MOE_B2) + (size_t)t->e * (size_t)H + j0, 0.0f,
                        loom_moe_sliced(m, m->out_exp.p, m->off_recv, t->s, j, t->in_s), hj);
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
}

// dpre = (dout W2_e^T) * gelu'(pre).
static void tile_dpre(struct loom_moe *m, const tile_t *t) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn;
  if (t->rows == 0) {
    return;
  }
  double t0 = MPI_Wtime();
  float *dpre = m->dpre.p + t->row * F;
  loom_cpu_gemm(0, 1, t->rows, F, H, 1.0f, m->d_recv.p + t->row * H,
                pw(m, LOOM_MOE_W2) + (size_t)t->e * (size_t)(F * H), NULL, 0.0f, dpre);
  loom_cpu_gelu_backward(t->rows * F, m->pre.p + t->row * F, dpre, dpre);
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
}

// Slice j of dx = dpre W1_e^T, into dx_exp.
static void tile_dx(struct loom_moe *m, const tile_t *t, int j) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, j0 = slice_lo(m, j);
  const int64_t hj = slice_lo(m, j + 1) - j0;
  if (t->rows == 0 || hj == 0) {
    return;
  }
  double t0 = MPI_Wtime();
  loom_cpu_gemm_strided(0, 1, t->rows, hj, F, 1.0f, m->dpre.p + t->row * F, F,
                        pw(m, LOOM_MOE_W1) + (size_t)t->e * (size_t)(H * F) + j0 * F, F, NULL, 0.0f,
                        loom_moe_sliced(m, m->dx_exp.p, m->off_recv, t->s, j, t->in_s), hj);
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
}

// dW2_e += h^T dout, db2_e += sum dout, dW1_e += x^T dpre, db1_e += sum dpre.
static void tile_weights(struct loom_moe *m, const tile_t *t) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn;
  if (t->rows == 0) {
    return;
  }
  double t0 = MPI_Wtime();
  const size_t e = (size_t)t->e;
  const float *dout = m->d_recv.p + t->row * H, *dpre = m->dpre.p + t->row * F;
  loom_cpu_gemm(1, 0, F, H, t->rows, 1.0f, m->h.p + t->row * F, dout, NULL, 1.0f,
                gw(m, LOOM_MOE_W2) + e * (size_t)(F * H));
  loom_cpu_bias_backward(t->rows, H, dout, gw(m, LOOM_MOE_B2) + e * (size_t)H);
  loom_cpu_gemm(1, 0, H, F, t->rows, 1.0f, m->recv_x.p + t->row * H, dpre, NULL, 1.0f,
                gw(m, LOOM_MOE_W1) + e * (size_t)(H * F));
  loom_cpu_bias_backward(t->rows, F, dpre, gw(m, LOOM_MOE_B1) + e * (size_t)F);
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
}

// ---- one pass (forward or backward) -------------------------------------------------------------

// What differs between the forward and the backward: the buffers the exchanges carry and the
// tile functions. The weight gradients (backward only) are summed in ring order from this rank
// (source, then chunk, then expert) whatever the mode: see weights_of.
typedef struct pass {
  float *send, *recv;     // dispatch: (n_send, H) -> (n_recv, H)
  float *back_exp, *back; // combine: by slice (n_recv * H) -> by slice (n_send * H)
  void (*rows)(struct loom_moe *m, const tile_t *t);         // per tile, every column
  void (*slice)(struct loom_moe *m, const tile_t *t, int j); // per tile and column slice
  int weights;                                               // sum the weight gradients at the end
} pass_t;

static void rows_of(struct loom_moe *m, const pass_t *p, int s, int c_lo, int c_hi, reqs_t *q) {
  for (int c = c_lo; c < c_hi; c++) {
    for (int e = 0; e < m->el; e++) {
      tile_t t = tile_at(m, s, c, e);
      p->rows(m, &t);
      poll(q);
    }
  }
}

static void slice_of(struct loom_moe *m, const pass_t *p, int s, int c_lo, int c_hi, int j,
                     reqs_t *q) {
  for (int c = c_lo; c < c_hi; c++) {
    for (int e = 0; e < m->el; e++) {
      tile_t t = tile_at(m, s, c, e);
      p->slice(m, &t, j);
      poll(q);
    }
  }
}

// Send (or copy, to itself) rows [r0, r0 + nr) of slice j of the block of rank s.
static loom_status_t send_slice(struct loom_moe *m, const pass_t *p, reqs_t *q, int s, int j,
                                int64_t r0, int64_t nr) {
  const int64_t hj = slice_lo(m, j + 1) - slice_lo(m, j);
  float *src = loom_moe_sliced(m, p->back_exp, m->off_recv, s, j, r0);
  if (nr == 0 || hj == 0) {
    return LOOM_OK;
  }
  if (s == m->me) { // the same rows in the source layout (own block: same counts)
    memcpy(loom_moe_sliced(m, p->back, m->off_send, s, j, r0), src,
           sizeof(float) * (size_t)(nr * hj));
    return LOOM_OK;
  }
  return post(q, m->comm, 1, src, nr * hj, s, TAG_COMBINE + j);
}

// Receive rows [r0, r0 + nr) of slice j of what rank d returns.
static loom_status_t recv_slice(struct loom_moe *m, const pass_t *p, reqs_t *q, int d, int j,
                                int64_t r0, int64_t nr) {
  const int64_t hj = slice_lo(m, j + 1) - slice_lo(m, j);
  if (d == m->me || nr == 0 || hj == 0) {
    return LOOM_OK;
  }
  return post(q, m->comm, 0, loom_moe_sliced(m, p->back, m->off_send, d, j, r0), nr * hj, d,
              TAG_COMBINE + j);
}

// Dispatch rows [r0, r0 + nr) of each peer's block (chunk-relative offsets from in_send/in_recv).
static loom_status_t dispatch_post(struct loom_moe *m, const pass_t *p, reqs_t *q, int c) {
  const int64_t H = m->cfg.hidden;
  loom_status_t status = LOOM_OK;
  for (int k = 1; k < m->np && status == LOOM_OK; k++) {
    const int from = (m->me - k + m->np) % m->np, to = (m->me + k) % m->np;
    const int64_t *cr = m->cnt_recv + (size_t)from * (size_t)m->el;
    const int64_t *cs = m->cnt_send + (size_t)to * (size_t)m->el;
    int64_t r0 = c < 0 ? 0 : loom_moe_tile_offset(m, cr, c, 0);
    int64_t nr = c < 0 ? m->off_recv[from + 1] - m->off_recv[from] : chunk_rows(m, cr, c);
    if (nr > 0) {
      status =
          post(q, m->comm, 0, p->recv + (m->off_recv[from] + r0) * H, nr * H, from, TAG_DISPATCH);
    }
    r0 = c < 0 ? 0 : loom_moe_tile_offset(m, cs, c, 0);
    nr = c < 0 ? m->off_send[to + 1] - m->off_send[to] : chunk_rows(m, cs, c);
    if (nr > 0 && status == LOOM_OK) {
      status = post(q, m->comm, 1, p->send + (m->off_send[to] + r0) * H, nr * H, to, TAG_DISPATCH);
    }
  }
  return status;
}

// This rank's own rows: the dispatch is a copy.
static void dispatch_self(struct loom_moe *m, const pass_t *p) {
  const int64_t H = m->cfg.hidden, n = m->off_send[m->me + 1] - m->off_send[m->me];
  memcpy(p->recv + m->off_recv[m->me] * H, p->send + m->off_send[m->me] * H,
         sizeof(float) * (size_t)(n * H));
}

// The weight gradients of every tile of source s (chunk, then expert). The sources are summed
// in ring order from this rank (this rank's own rows first) in every mode: the same bits, and
// fine mode can sum its own rows' share while the other sources' rows are still on the wire.
static void weights_of(struct loom_moe *m, int s, reqs_t *q) {
  for (int c = 0; c < m->chunks; c++) {
    for (int e = 0; e < m->el; e++) {
      tile_t t = tile_at(m, s, c, e);
      tile_weights(m, &t);
      poll(q);
    }
  }
}

static loom_status_t run_none(struct loom_moe *m, const pass_t *p, reqs_t *q) {
  loom_status_t status = LOOM_OK;
  dispatch_self(m, p);
  LOOM_CHECK(dispatch_post(m, p, q, -1));
  LOOM_CHECK(wait_range(q, 0, q->n));
  q->n = 0;
  for (int s = 0; s < m->np; s++) {
    rows_of(m, p, s, 0, m->chunks, q);
  }
  for (int s = 0; s < m->np; s++) {
    for (int j = 0; j < m->slices; j++) {
      slice_of(m, p, s, 0, m->chunks, j, q);
    }
  }
  for (int k = 0; k < m->np; k++) {
    const int d = (m->me - k + m->np) % m->np, s = (m->me + k) % m->np;
    for (int j = 0; j < m->slices; j++) {
      LOOM_CHECK(recv_slice(m, p, q, d, j, 0, m->off_send[d + 1] - m->off_send[d]));
      LOOM_CHECK(send_slice(m, p, q, s, j, 0, m->off_recv[s + 1] - m->off_recv[s]));
    }
  }
  LOOM_CHECK(wait_range(q, 0, q->n));
fail:
  return status;
}

static loom_status_t run_coarse(struct loom_moe *m, const pass_t *p, reqs_t *q) {
  loom_status_t status = LOOM_OK;
  const int C = m->chunks;
  int *lo = calloc((size_t)C + 1, sizeof(int)), *hi = calloc((size_t)C + 1, sizeof(int));
  if (!lo || !hi) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "MoE: out of memory");
    goto fail;
  }
  // Every return slice, chunk by chunk (they arrive in this order from each peer).
  for (int d = 0; d < m->np; d++) {
    const int64_t *cs = m->cnt_send + (size_t)d * (size_t)m->el;
    for (int c = 0; c < C; c++) {
      for (int j = 0; j < m->slices; j++) {
        LOOM_CHECK(
            recv_slice(m, p, q, d, j, loom_moe_tile_offset(m, cs, c, 0), chunk_rows(m, cs, c)));
      }
    }
  }
  dispatch_self(m, p);
  lo[0] = q->n;
  LOOM_CHECK(dispatch_post(m, p, q, 0));
  hi[0] = q->n;
  for (int c = 0; c < C; c++) {
    if (c + 1 < C) { // the next chunk travels while this one computes
      lo[c + 1] = q->n;
      LOOM_CHECK(dispatch_post(m, p, q, c + 1));
      hi[c + 1] = q->n;
    }
    LOOM_CHECK(wait_range(q, lo[c], hi[c]));
    for (int s = 0; s < m->np; s++) {
      rows_of(m, p, s, c, c + 1, q);
    }
    for (int s = 0; s < m->np; s++) {
      const int64_t *cr = m->cnt_recv + (size_t)s * (size_t)m->el;
      for (int j = 0; j < m->slices; j++) {
        slice_of(m, p, s, c, c + 1, j, q);
        LOOM_CHECK(
            send_slice(m, p, q, s, j, loom_moe_tile_offset(m, cr, c, 0), chunk_rows(m, cr, c)));
      }
    }
  }
  if (p->weights) { // every source, in ring order from this rank
    for (int k = 0; k < m->np; k++) {
      weights_of(m, (m->me + k) % m->np, q);
    }
  }
  LOOM_CHECK(wait_range(q, 0, q->n));
fail:
  free(lo);
  free(hi);
  return status;
}

// One landed chunk of source s in fine mode: the first GEMM (or dpre) on its rows, then the second
// (or dx) slice by slice, each slice sent back as soon as it is computed.
static loom_status_t fine_chunk(struct loom_moe *m, const pass_t *p, reqs_t *q, int s, int c) {
  const int64_t *cr = m->cnt_recv + (size_t)s * (size_t)m->el;
  const int64_t r0 = loom_moe_tile_offset(m, cr, c, 0), nr = chunk_rows(m, cr, c);
  loom_status_t status = LOOM_OK;
  rows_of(m, p, s, c, c + 1, q);
  for (int j = 0; j < m->slices && status == LOOM_OK; j++) {
    slice_of(m, p, s, c, c + 1, j, q);
    status = send_slice(m, p, q, s, j, r0, nr);
  }
  return status;
}

static loom_status_t run_fine(struct loom_moe *m, const pass_t *p, reqs_t *q) {
  loom_status_t status = LOOM_OK;
  const int C = m->chunks;
  const size_t nreq = (size_t)m->np * (size_t)C + 1;
  int *next = calloc((size_t)m->np, sizeof(int)), *ready = calloc(nreq, sizeof(int));
  int *src = calloc(nreq, sizeof(int)), *chunk = calloc(nreq, sizeof(int));
  const int64_t H = m->cfg.hidden;
  if (!next || !ready || !src || !chunk) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "MoE: out of memory");
    goto fail;
  }
  // Every return slice, chunk by chunk, as each peer sends them.
  for (int d = 0; d < m->np; d++) {
    const int64_t *cs = m->cnt_send + (size_t)d * (size_t)m->el;
    for (int c = 0; c < C; c++) {
      for (int j = 0; j < m->slices; j++) {
        LOOM_CHECK(
            recv_slice(m, p, q, d, j, loom_moe_tile_offset(m, cs, c, 0), chunk_rows(m, cs, c)));
      }
    }
  }
  // Dispatch receives, one per (source, chunk) with rows, remembering whose each is (a chunk
  // without rows is ready at once); then the sends, chunk by chunk (messages of one pair and
  // tag match in the order they were posted).
  const int rlo = q->n;
  for (int k = 1; k < m->np; k++) {
    const int from = (m->me - k + m->np) % m->np;
    const int64_t *cr = m->cnt_recv + (size_t)from * (size_t)m->el;
    for (int c = 0; c < C; c++) {
      const int64_t r0 = loom_moe_tile_offset(m, cr, c, 0), nr = chunk_rows(m, cr, c);
      ready[from * C + c] = nr == 0;
      if (nr > 0) {
        src[q->n - rlo] = from;
        chunk[q->n - rlo] = c;
        LOOM_CHECK(post(q, m->comm, 0, p->recv + (m->off_recv[from] + r0) * H, nr * H, from,
                        TAG_DISPATCH));
      }
    }
  }
  const int rhi = q->n;
  for (int k = 1; k < m->np; k++) {
    const int to = (m->me + k) % m->np;
    const int64_t *cs = m->cnt_send + (size_t)to * (size_t)m->el;
    for (int c = 0; c < C; c++) {
      const int64_t r0 = loom_moe_tile_offset(m, cs, c, 0), nr = chunk_rows(m, cs, c);
      if (nr > 0) {
        LOOM_CHECK(
            post(q, m->comm, 1, p->send + (m->off_send[to] + r0) * H, nr * H, to, TAG_DISPATCH));
      }
    }
  }
  // Own tokens first; then each source's chunks as they land, in chunk order per source (so
  // that the slices of one source leave in the order its receives were posted).
  dispatch_self(m, p);
  for (int c = 0; c < C; c++) {
    LOOM_CHECK(fine_chunk(m, p, q, m->me, c));
  }
  if (p->weights) { // this rank's own rows come first in the sum: their weight gradients fill
    weights_of(m, m->me, q); // the wait for the other sources' rows
  }
  for (int got = rlo; got <= rhi; got++) {
    for (int k = 1; k < m->np; k++) {
      const int s = (m->me - k + m->np) % m->np;
      while (next[s] < C && ready[s * C + next[s]]) {
        LOOM_CHECK(fine_chunk(m, p, q, s, next[s]++));
      }
    }
    if (got == rhi) {
      break;
    }
    // A poll that found every request complete released them all (MPI_Testall): wait_any then
    // has nothing left, and every chunk not yet marked has landed; mark the first.
    int i = wait_any(q, rlo, rhi);
    if (i < 0) {
      for (i = rlo; src[i - rlo] < 0; i++) {
      }
    }
    ready[src[i - rlo] * C + chunk[i - rlo]] = 1;
    src[i - rlo] = -1;
  }
  if (p->weights) { // the other sources, in ring order after this rank's (done above)
    for (int k = 1; k < m->np; k++) {
      weights_of(m, (m->me + k) % m->np, q);
    }
  }
  LOOM_CHECK(wait_range(q, 0, q->n));
fail:
  free(next);
  free(ready);
  free(src);
  free(chunk);
  return status;
}

static loom_status_t run(struct loom_moe *m, const pass_t *p) {
  reqs_t q = {.comm_ms = &m->comm_ms, .every = m->poll_tiles, .w = &m->watch};
  loom_status_t status = LOOM_OK;
  switch (m->cfg.overlap) {
  case LOOM_MOE_OVERLAP_NONE:
    status = run_none(m, p, &q);
    for (int k = 0; k < m->np && status == LOOM_OK && p->weights; k++) {
      weights_of(m, (m->me + k) % m->np, &q);
    }
    break;
  case LOOM_MOE_OVERLAP_COARSE:
    status = run_coarse(m, p, &q);
    break;
  default:
    status = run_fine(m, p, &q);
    break;
  }
  if (status != LOOM_OK && q.n > 0) { // do not leave requests on freed buffers
    for (int i = 0; i < q.n; i++) {
      if (q.r[i] != MPI_REQUEST_NULL) {
        MPI_Cancel(&q.r[i]);
        MPI_Request_free(&q.r[i]);
      }
    }
  }
  free(q.r);
  return status;
}

loom_status_t loom_moe_expert_forward(struct loom_moe *m) {
  pass_t p = {.send = m->send_x.p,
              .recv = m->recv_x.p,
              .back_exp = m->out_exp.p,
              .back = m->comb.p,
              .rows = tile_gemm0,
              .slice = tile_gemm1,
              .weights = 0};
  return run(m, &p);
}

loom_status_t loom_moe_expert_backward(struct loom_moe *m) {
  pass_t p = {.send = m->d_send.p,
              .recv = m->d_recv.p,
              .back_exp = m->dx_exp.p,
              .back = m->dx_comb.p,
              .rows = tile_dpre,
              .slice = tile_dx,
              .weights = 1};
  return run(m, &p);
}
