/* moe_internal.h — what the MoE files share: the layer behind loom_moe_t, its row layouts, and the
 * expert-side exchange-and-compute of each overlap mode (moe_expert.c). */
#ifndef LOOM_MOE_INTERNAL_H
#define LOOM_MOE_INTERNAL_H

#include <mpi.h>
#include <stdint.h>

#include "comm_internal.h"
#include "loom_moe.h"

// Row layouts. A source's rows for one destination rank are ordered (chunk c, local expert e,
// row r): the rows of (source s, expert e) are cut into `chunks` nearly equal chunks, so chunk c
// of a block, and the whole block, are contiguous. The expert side keeps the rows it received in
// the same order, sources one after the other. The outputs of the second GEMM (and dx in the
// backward) are stored by column slice: the block of rank s holds, for each slice j in order,
// its N_s rows of that slice's Hj columns, so one slice of one rank is contiguous, and so is the
// whole block of a rank (what the combine sends it). The source keeps what comes back in the same
// layout.

typedef struct moe_buf {
  float *p;
  size_t cap; // floats
} moe_buf_t;

struct loom_moe {
  loom_moe_config_t cfg;
  MPI_Comm comm;          // private duplicate of the ep group's communicator (MPI_COMM_NULL: alone)
  const loom_group_t *ep; // the ep group (NULL: alone)
  struct loom_watch watch; // the forward or backward in progress, for the watchdog
  int np, me;              // ep size and rank (1, 0 when alone)
  int el;                  // experts per rank
  int chunks, slices;
  int poll_tiles; // MPI tests after every this many tiles (0: never; see loom_moe_config_t)
  int device;     // where param, grad and the call's tensors live (LOOM_DEVICE_HOST or CUDA)
  loom_tensor_t param[LOOM_MOE_PARAM_COUNT], grad[LOOM_MOE_PARAM_COUNT];
  struct moe_dev *dev; // the device path's buffers (moe_nccl.c); NULL on the host

  // ---- the last forward (source side; on a device only weight, idx, pos and the counts are
  // kept here, on the host, and the rows live in dev) ----
  int64_t t;                // tokens
  int fwd_pending;          // 1 from a forward's success until its backward starts
  moe_buf_t x, logits;      // (T, H) copy of the input, (T, E)
  moe_buf_t probs, weight;  // (T, E), (T, K)
  moe_buf_t dprobs_aux;     // (T, E) gradient of the aux loss on probs
  int32_t *idx;             // (T, K)
  int64_t *pos;             // (T, K) row of the assignment in the send order, -1 when dropped
  size_t idx_cap;           // entries of idx and pos
  int64_t *cnt_send;        // (np, El) rows to (rank d, its local expert e)
  int64_t *cnt_recv;        // (np, El) rows from rank s for local expert e
  int64_t *off_send;        // (np + 1) first row of each destination's block
  int64_t *off_recv;        // (np + 1) first row of each source's block
  int64_t n_send, n_recv;   // rows sent, rows received
  moe_buf_t send_x, recv_x; // (n_send, H), (n_recv, H)
  moe_buf_t pre, h;         // (n_recv, F) before and after the GELU
  moe_buf_t out_exp, comb;  // (n_recv * H), (n_send * H): by slice, see above
  // ---- backward ----
  moe_buf_t dw;              // (T, K)
  moe_buf_t d_send, d_recv;  // (n_send, H), (n_recv, H): output gradients, in the row order
  moe_buf_t dpre;            // (n_recv, F)
  moe_buf_t dx_exp, dx_comb; // by slice, as out_exp and comb
  moe_buf_t dlogits;         // (T, E)
  // ---- stats ----
  int64_t *sent;     // (E)
  int64_t *received; // (El)
  int64_t dropped;
  float aux;
  double comm_ms, compute_ms, wall_ms;
};

// First index of part i when n things are cut into k nearly equal parts (the first n % k parts
// one longer).
static inline int64_t moe_part_lo(int64_t n, int k, int i) {
  return i * (n / k) + (i < n % k ? i : n % k);
}

// Rows of chunk c of the (rank, expert e) block with counts cnt (El per rank).
static inline int64_t moe_chunk_rows(const struct loom_moe *m, const int64_t *cnt, int e, int c) {
  return moe_part_lo(cnt[e], m->chunks, c + 1) - moe_part_lo(cnt[e], m->chunks, c);
}

// Where slice j of row in_r of rank r's block sits in a by-slice buffer (out_exp, comb, dx_exp,
// dx_comb) whose blocks start at off[r] rows; the slice holds its Hj columns contiguously.
float *loom_moe_sliced(const struct loom_moe *m, float *buf, const int64_t *off, int r, int j,
                       int64_t in_r);

// Row offset, inside a rank's block with counts cnt (El per rank), of chunk c of expert e.
int64_t loom_moe_tile_offset(const struct loom_moe *m, const int64_t *cnt, int c, int e);

// The expert side of a forward: recv_x from send_x by the dispatch, the expert FFN on every tile,
// comb from out_exp by the combine, overlapped as the mode says. Collective over the ep group.
loom_status_t loom_moe_expert_forward(struct loom_moe *m);
// The backward: d_recv from d_send, dh and dpre per tile, dx slices back into dx_comb, the
// weight gradients summed in a fixed order. Collective over the ep group.
loom_status_t loom_moe_expert_backward(struct loom_moe *m);

// The routing on the host, from idx and weight (T, K): apply the capacity, count the rows per
// (rank, local expert), exchange the counts over MPI, and set pos, the offsets, n_send, n_recv and
// the stats. Collective over the ep group. The host and the device paths share it, so both send
// the same rows in the same order.
loom_status_t loom_moe_route(struct loom_moe *m, int64_t T);

#ifdef LOOM_HAVE_NCCL
// ---- the device path (moe_nccl.c, compiled with NCCL) ------------------------------------------
// Arguments checked by moe.c (f32 rows of H on m->device, T rows); the watchdog entered. One
// chunk, one column slice: the by-slice layouts are plain row-major blocks.
loom_status_t loom_moe_dev_forward(struct loom_moe *m, const loom_tensor_t *x, loom_tensor_t *y,
                                   int64_t T);
loom_status_t loom_moe_dev_backward(struct loom_moe *m, const loom_tensor_t *dy, loom_tensor_t *dx,
                                    int64_t T);
// 1 when p (bytes > 0) is memory of CUDA device `device`.
int loom_moe_dev_pointer_ok(const void *p, int device);
void loom_moe_dev_free(struct loom_moe *m);
#endif

// Grow b to at least n floats (contents kept only when keep); LOOM_ERR_NOMEM names what.
loom_status_t loom_moe_reserve(moe_buf_t *b, size_t n, const char *what);

// Check the counts received in the count exchange (np sources x el local experts, the layout of
// cnt_recv) before anything is sized from them: every count >= 0, and the total small enough that
// its rows of width floats can be addressed. LOOM_OK with *n_recv the total, or LOOM_ERR_CORRUPT
// naming the source and the expert. Needs no MPI (tests/fuzz/fuzz_moe_msg.c calls it).
loom_status_t loom_moe_check_counts(const int64_t *cnt, int np, int el, int64_t width,
                                    int64_t *n_recv);

#endif
