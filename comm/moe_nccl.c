/* moe_nccl.c — the MoE layer on a CUDA device: router, permutation and expert FFN as CUDA kernels
 * and cuBLAS; dispatch and combine as grouped ncclSend/ncclRecv over the ep group's communicator.
 */
#include "config.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "cuda/cuda_ctx.h"
#include "cuda/cuda_kernels.h"
#include "error.h"
#include "moe_internal.h"

// The host layer's computation (moe.c, moe_expert.c) with one chunk and one column slice, in the
// order of the calling thread's current stream (loom_cuda_stream). A forward:
//
//   x copy, router GEMM, softmax and top-k, aux loss (the stream is waited for: aux to the host)
//   idx, weight to the host -> capacity, counts over MPI, pos (moe.c's loom_moe_route, the same
//   code as the host layer: the same rows in the same order) -> pos to the device
//   permute -> dispatch -> expert GEMMs tile by tile (source, then expert) -> combine -> unpermute
//
// The all-to-alls are loom_nccl_ialltoallv on the ep group (its NCCL communicator and stream,
// created on first use; the group's stream starts after the current stream). The host waits for
// each one with loom_wait: its completion event is polled 20 us apart and LOOM_TIMEOUT (the
// watchdog entry of this forward or backward) is checked between polls, so a rank that never
// joins ends the job with the watchdog's message instead of a hang. The backward queues the
// weight gradients (summed in ring order from this rank, as the host) while its combine is in
// flight. The buffers grow with the step's sizes and are kept (cudaMalloc only when a step needs
// more than any before, with 50% headroom); loom_moe_destroy frees them.

typedef struct dbuf {
  void *p;
  size_t cap; // bytes
} dbuf_t;

struct moe_dev {
  int device;
  // ---- the last forward ----
  dbuf_t x;               // (T, H) copy of the input
  dbuf_t logits, probs;   // (T, E)
  dbuf_t dprobs_aux;      // (T, E) gradient of the aux loss on probs
  dbuf_t weight;          // (T, K) f32
  dbuf_t idx;             // (T, K) i32
  dbuf_t pos;             // (T, K) i64, as m->pos
  dbuf_t send_x, comb;    // (n_send, H): dispatched rows, combined expert outputs
  dbuf_t recv_x, out_exp; // (n_recv, H)
  dbuf_t pre, h;          // (n_recv, F) before and after the GELU
  // ---- backward ----
  dbuf_t dw;              // (T, K)
  dbuf_t dlogits;         // (T, E)
  dbuf_t d_send, dx_comb; // (n_send, H)
  dbuf_t d_recv, dx_exp;  // (n_recv, H)
  dbuf_t dpre;            // (n_recv, F)
};

#define FP(b) ((float *)(b).p)

// ---- buffers ------------------------------------------------------------------------------------

void loom_moe_dev_free(struct loom_moe *m) {
  struct moe_dev *d = m->dev;
  if (!d) {
    return;
  }
  dbuf_t *bufs[] = {&d->x,       &d->logits,  &d->probs,  &d->dprobs_aux, &d->weight,
                    &d->idx,     &d->pos,     &d->send_x, &d->comb,       &d->recv_x,
                    &d->out_exp, &d->pre,     &d->h,      &d->dw,         &d->dlogits,
                    &d->d_send,  &d->dx_comb, &d->d_recv, &d->dx_exp,     &d->dpre};
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(d->device);
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    if (bufs[i]->p) {
      cudaFree(bufs[i]->p); // waits for the device: every kernel and transfer that used it is done
    }
  }
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
  (void)cudaGetLastError(); // at exit the context may be gone: nothing to report
  free(d);
  m->dev = NULL;
}

int loom_moe_dev_pointer_ok(const void *p, int device) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess ||
      (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) || a.device != device) {
    (void)cudaGetLastError();
    return 0;
  }
  return 1;
}

// b holds at least bytes (contents not kept).
static loom_status_t reserve(const struct moe_dev *d, dbuf_t *b, size_t bytes, const char *what) {
  if (b->p && b->cap >= bytes) {
    return LOOM_OK;
  }
  size_t cap = bytes + bytes / 2;
  cap = cap < 256 ? 256 : cap;
  if (b->p) {
    cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
  }
  if (cudaMalloc(&b->p, cap) != cudaSuccess) {
    (void)cudaGetLastError();
    b->p = NULL;
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "MoE on CUDA device %d: cannot allocate %zu bytes for %s", d->device, cap,
                      what);
  }
  b->cap = cap;
  return LOOM_OK;
}

// The layer's device state, made current (created on the first call).
static loom_status_t dev_of(struct loom_moe *m, struct moe_dev **out) {
  loom_status_t status = loom_cuda_use_device(m->device);
  if (status != LOOM_OK) {
    return status;
  }
  if (!m->dev) {
    m->dev = calloc(1, sizeof *m->dev);
    if (!m->dev) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "MoE: out of memory for the device state");
    }
    m->dev->device = m->device;
  }
  *out = m->dev;
  return LOOM_OK;
}

// ---- all-to-all ---------------------------------------------------------------------------------

// Start the exchange of rows of H floats: block j of send (rows [soff[j], soff[j + 1])) goes to
// rank j of the group, block j of recv (rows [roff[j], roff[j + 1])) comes from rank j. *req: the
// NCCL request to wait for, or NULL when the layer is alone (a copy on the current stream).
static loom_status_t exchange_start(struct loom_moe *m, const char *op, const float *send,
                                    const int64_t *soff, float *recv, const int64_t *roff,
                                    loom_request_t **req) {
  const int64_t H = m->cfg.hidden;
  loom_status_t status = LOOM_OK;
  int64_t *sc = NULL, *rc = NULL;
  loom_request_t *r = NULL;
  *req = NULL;
  if (!m->ep || m->np == 1) {
    return loom_cuda_copy(recv, send, sizeof(float) * (size_t)(soff[1] * H));
  }
  sc = malloc(sizeof(int64_t) * 2 * (size_t)m->np);
  r = loom_request_new(op);
  if (!sc || !r) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory for the all-to-all", op);
    goto fail;
  }
  rc = sc + m->np;
  for (int j = 0; j < m->np; j++) {
    sc[j] = (soff[j + 1] - soff[j]) * H;
    rc[j] = (roff[j + 1] - roff[j]) * H;
  }
  r->watch = m->watch; // loom_wait checks this call's LOOM_TIMEOUT between polls
  LOOM_CHECK(loom_nccl_ialltoallv(m->ep, send, recv, 0, sc, rc, LOOM_F32, m->device, r));
  *req = r;
  r = NULL;
fail:
  loom_request_free(r);
  free(sc);
  return status;
}

static loom_status_t exchange_wait(struct loom_moe *m, loom_request_t **req) {
  const double t0 = MPI_Wtime();
  loom_status_t status = loom_wait(req);
  m->comm_ms += 1e3 * (MPI_Wtime() - t0);
  return status;
}

static loom_status_t exchange(struct loom_moe *m, const char *op, const float *send,
                              const int64_t *soff, float *recv, const int64_t *roff) {
  loom_request_t *r = NULL;
  loom_status_t status = exchange_start(m, op, send, soff, recv, roff, &r);
  return status == LOOM_OK ? exchange_wait(m, &r) : status;
}

// ---- the expert tiles ---------------------------------------------------------------------------

// The rows of (source s, local expert e) in the expert-side buffers: the first and how many.
static void tile(const struct loom_moe *m, int s, int e, int64_t *row, int64_t *rows) {
  const int64_t *cnt = m->cnt_recv + (size_t)s * (size_t)m->el;
  *row = m->off_recv[s] + loom_moe_tile_offset(m, cnt, 0, e);
  *rows = cnt[e];
}

static float *param(struct loom_moe *m, loom_moe_param_t p) {
  return m->param[p].data;
}

static float *grad(struct loom_moe *m, loom_moe_param_t p) {
  return m->grad[p].data;
}

// pre = x W1_e + b1_e, h = gelu(pre), out = h W2_e + b2_e for every tile.
static loom_status_t tiles_forward(struct loom_moe *m, struct moe_dev *d) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn;
  loom_status_t status = LOOM_OK;
  const double t0 = MPI_Wtime();
  for (int s = 0; s < m->np; s++) {
    for (int e = 0; e < m->el; e++) {
      int64_t r0 = 0, n = 0;
      tile(m, s, e, &r0, &n);
      if (n == 0) {
        continue;
      }
      float *pre = FP(d->pre) + r0 * F, *h = FP(d->h) + r0 * F;
      LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 0, 0, n, F, H, 1.0f, FP(d->recv_x) + r0 * H, H,
                                param(m, LOOM_MOE_W1) + (size_t)e * (size_t)(H * F), F,
                                param(m, LOOM_MOE_B1) + (size_t)e * (size_t)F, 0.0f, pre, F));
      LOOM_CHECK(loom_cuda_gelu_forward(n * F, pre, h));
      LOOM_CHECK(loom_cuda_gemm(
          LOOM_F32, 0, 0, n, H, F, 1.0f, h, F, param(m, LOOM_MOE_W2) + (size_t)e * (size_t)(F * H),
          H, param(m, LOOM_MOE_B2) + (size_t)e * (size_t)H, 0.0f, FP(d->out_exp) + r0 * H, H));
    }
  }
fail:
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
  return status;
}

// dpre = (dout W2_e^T) * gelu'(pre), dx = dpre W1_e^T for every tile.
static loom_status_t tiles_backward(struct loom_moe *m, struct moe_dev *d) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn;
  loom_status_t status = LOOM_OK;
  const double t0 = MPI_Wtime();
  for (int s = 0; s < m->np; s++) {
    for (int e = 0; e < m->el; e++) {
      int64_t r0 = 0, n = 0;
      tile(m, s, e, &r0, &n);
      if (n == 0) {
        continue;
      }
      float *dpre = FP(d->dpre) + r0 * F;
      LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 0, 1, n, F, H, 1.0f, FP(d->d_recv) + r0 * H, H,
                                param(m, LOOM_MOE_W2) + (size_t)e * (size_t)(F * H), H, NULL, 0.0f,
                                dpre, F));
      LOOM_CHECK(loom_cuda_gelu_backward(n * F, FP(d->pre) + r0 * F, dpre, dpre));
      LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 0, 1, n, H, F, 1.0f, dpre, F,
                                param(m, LOOM_MOE_W1) + (size_t)e * (size_t)(H * F), F, NULL, 0.0f,
                                FP(d->dx_exp) + r0 * H, H));
    }
  }
fail:
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
  return status;
}

// dW2_e += h^T dout, db2_e += sum dout, dW1_e += x^T dpre, db1_e += sum dpre: the sources in ring
// order from this rank, then the experts, as the host layer sums them.
static loom_status_t tiles_weights(struct loom_moe *m, struct moe_dev *d) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn;
  loom_status_t status = LOOM_OK;
  const double t0 = MPI_Wtime();
  for (int k = 0; k < m->np; k++) {
    const int s = (m->me + k) % m->np;
    for (int e = 0; e < m->el; e++) {
      int64_t r0 = 0, n = 0;
      tile(m, s, e, &r0, &n);
      if (n == 0) {
        continue;
      }
      const size_t es = (size_t)e;
      const float *dout = FP(d->d_recv) + r0 * H, *dpre = FP(d->dpre) + r0 * F;
      LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 1, 0, F, H, n, 1.0f, FP(d->h) + r0 * F, F, dout, H, NULL,
                                1.0f, grad(m, LOOM_MOE_W2) + es * (size_t)(F * H), H));
      LOOM_CHECK(loom_cuda_bias_backward(n, H, dout, grad(m, LOOM_MOE_B2) + es * (size_t)H));
      LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 1, 0, H, F, n, 1.0f, FP(d->recv_x) + r0 * H, H, dpre, F,
                                NULL, 1.0f, grad(m, LOOM_MOE_W1) + es * (size_t)(H * F), F));
      LOOM_CHECK(loom_cuda_bias_backward(n, F, dpre, grad(m, LOOM_MOE_B1) + es * (size_t)F));
    }
  }
fail:
  m->compute_ms += 1e3 * (MPI_Wtime() - t0);
  return status;
}

// ---- forward and backward -----------------------------------------------------------------------

loom_status_t loom_moe_dev_forward(struct loom_moe *m, const loom_tensor_t *x, loom_tensor_t *y,
                                   int64_t T) {
  static const char op[] = "loom_moe_forward";
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, E = m->cfg.num_experts, K = m->cfg.top_k;
  const size_t f = sizeof(float);
  loom_status_t status = LOOM_OK;
  struct moe_dev *d = NULL;
  LOOM_CHECK(dev_of(m, &d));
  const cudaStream_t stream = loom_cuda_stream();
  LOOM_CHECK(reserve(d, &d->x, f * (size_t)(T * H), "the input"));
  LOOM_CHECK(reserve(d, &d->logits, f * (size_t)(T * E), "the router logits"));
  LOOM_CHECK(reserve(d, &d->probs, f * (size_t)(T * E), "the router probabilities"));
  LOOM_CHECK(reserve(d, &d->dprobs_aux, f * (size_t)(T * E), "the aux gradient"));
  LOOM_CHECK(reserve(d, &d->weight, f * (size_t)(T * K), "the routing weights"));
  LOOM_CHECK(reserve(d, &d->idx, sizeof(int32_t) * (size_t)(T * K), "the routing"));
  LOOM_CHECK(reserve(d, &d->pos, sizeof(int64_t) * (size_t)(T * K), "the routing"));
  // Router: logits = x Wr, softmax, top-k, renormalised weights, aux loss.
  LOOM_CHECK(loom_cuda_copy(d->x.p, x->data, f * (size_t)(T * H)));
  LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 0, 0, T, E, H, 1.0f, d->x.p, H, param(m, LOOM_MOE_ROUTER), E,
                            NULL, 0.0f, d->logits.p, E));
  LOOM_CHECK(loom_cuda_moe_router_forward(T, E, K, d->logits.p, d->probs.p, d->idx.p, d->weight.p));
  LOOM_CHECK(loom_cuda_zero(d->dprobs_aux.p, f * (size_t)(T * E)));
  m->aux = 0.0f;
  if (m->cfg.aux_coef > 0.0f) {
    LOOM_CHECK(loom_cuda_moe_aux_loss(T, E, K, d->probs.p, d->idx.p, m->cfg.aux_coef, &m->aux,
                                      d->dprobs_aux.p));
  }
  // The routing on the host (the host layer's code), then pos back on the device.
  if (T > 0) {
    LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(m->idx, d->idx.p, sizeof(int32_t) * (size_t)(T * K),
                                          cudaMemcpyDeviceToHost, stream));
    LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(m->weight.p, d->weight.p, f * (size_t)(T * K),
                                          cudaMemcpyDeviceToHost, stream));
    LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(stream)); // local kernels only: no peer involved
  }
  LOOM_CHECK(loom_moe_route(m, T));
  if (T > 0) { // from pageable memory: staged before the call returns, m->pos may change after
    LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(d->pos.p, m->pos, sizeof(int64_t) * (size_t)(T * K),
                                          cudaMemcpyHostToDevice, stream));
  }
  LOOM_CHECK(reserve(d, &d->send_x, f * (size_t)(m->n_send * H), "the dispatched rows"));
  LOOM_CHECK(reserve(d, &d->comb, f * (size_t)(m->n_send * H), "the combined rows"));
  LOOM_CHECK(reserve(d, &d->recv_x, f * (size_t)(m->n_recv * H), "the received rows"));
  LOOM_CHECK(reserve(d, &d->out_exp, f * (size_t)(m->n_recv * H), "the expert outputs"));
  LOOM_CHECK(reserve(d, &d->pre, f * (size_t)(m->n_recv * F), "the expert activations"));
  LOOM_CHECK(reserve(d, &d->h, f * (size_t)(m->n_recv * F), "the expert activations"));
  // Permute, dispatch, the experts, combine, unpermute: y[t] = sum over k in order of
  // weight[t, k] * expert output.
  LOOM_CHECK(loom_cuda_moe_permute(T, K, H, d->x.p, d->pos.p, d->send_x.p));
  LOOM_CHECK(exchange(m, op, d->send_x.p, m->off_send, d->recv_x.p, m->off_recv));
  LOOM_CHECK(tiles_forward(m, d));
  LOOM_CHECK(exchange(m, op, d->out_exp.p, m->off_recv, d->comb.p, m->off_send));
  LOOM_CHECK(loom_cuda_moe_unpermute(T, K, H, d->comb.p, d->pos.p, d->weight.p, y->data));
fail:
  return status;
}

loom_status_t loom_moe_dev_backward(struct loom_moe *m, const loom_tensor_t *dy, loom_tensor_t *dx,
                                    int64_t T) {
  static const char op[] = "loom_moe_backward";
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, E = m->cfg.num_experts, K = m->cfg.top_k;
  const size_t f = sizeof(float);
  loom_status_t status = LOOM_OK, weights = LOOM_OK;
  loom_request_t *combine = NULL; // between its start and its wait nothing leaves for fail:
  struct moe_dev *d = NULL;
  LOOM_CHECK(dev_of(m, &d));
  // (before any forward T is 0: the routing buffers may still be empty, and nothing reads them)
  LOOM_CHECK(reserve(d, &d->dw, f * (size_t)(T * K), "the weight gradients"));
  LOOM_CHECK(reserve(d, &d->dlogits, f * (size_t)(T * E), "the logit gradients"));
  LOOM_CHECK(reserve(d, &d->d_send, f * (size_t)(m->n_send * H), "the output gradients"));
  LOOM_CHECK(reserve(d, &d->dx_comb, f * (size_t)(m->n_send * H), "the input gradients"));
  LOOM_CHECK(reserve(d, &d->d_recv, f * (size_t)(m->n_recv * H), "the output gradients"));
  LOOM_CHECK(reserve(d, &d->dx_exp, f * (size_t)(m->n_recv * H), "the input gradients"));
  LOOM_CHECK(reserve(d, &d->dpre, f * (size_t)(m->n_recv * F), "the activation gradients"));
  // d out[t, k] = weight[t, k] dy[t]; d weight[t, k] = dy[t] . out[t, k].
  LOOM_CHECK(loom_cuda_moe_unpermute_backward(T, K, H, dy->data, d->comb.p, d->pos.p, d->weight.p,
                                              d->dw.p, d->d_send.p));
  LOOM_CHECK(exchange(m, op, d->d_send.p, m->off_send, d->d_recv.p, m->off_recv));
  LOOM_CHECK(tiles_backward(m, d));
  // The dx rows go back while the weight gradients are computed.
  LOOM_CHECK(exchange_start(m, op, d->dx_exp.p, m->off_recv, d->dx_comb.p, m->off_send, &combine));
  weights = tiles_weights(m, d);
  LOOM_CHECK(exchange_wait(m, &combine)); // also after a failed weight kernel: no NCCL in flight
  LOOM_CHECK(weights);
  LOOM_CHECK(loom_cuda_moe_unpermute(T, K, H, d->dx_comb.p, d->pos.p, NULL, dx->data));
  // Router: through the weights and the aux loss to the logits, then to Wr and x.
  LOOM_CHECK(loom_cuda_moe_router_backward(T, E, K, d->dlogits.p, d->dw.p, d->probs.p, d->idx.p,
                                           d->weight.p, d->dprobs_aux.p));
  LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 1, 0, H, E, T, 1.0f, d->x.p, H, d->dlogits.p, E, NULL, 1.0f,
                            grad(m, LOOM_MOE_ROUTER), E));
  LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 0, 1, T, H, E, 1.0f, d->dlogits.p, E,
                            param(m, LOOM_MOE_ROUTER), E, NULL, 1.0f, dx->data, H));
fail:
  return status;
}
