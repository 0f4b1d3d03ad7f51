/* moe_cpu.c — CPU kernels of the MoE router: row softmax and a deterministic top-K selection, the
 * Switch Transformer load-balancing loss (sums in double), and the router's backward. */
#include "config.h"
#include "moe_cpu.h"

#include <math.h>
#include <string.h>

#include "activation_cpu.h"
#include "error.h"
#include "loom_tensor.h"

// ---------------------------------------------------------------------------------------------
// Forward: softmax, then top-K by selection.

// The rank of a probability: itself, or -1 for NaN, so that every row is totally ordered by
// (key descending, index ascending) and the selection always finds K distinct valid experts.
static inline float rank_key(float p) {
  return p == p ? p : -1.0f;
}

// idx[0..K) = the K experts of the row in that order; weight = p[idx] / sum(p[idx]). Pass k picks
// the first of the experts that rank after pass k-1's pick: O(K * E) compares and no workspace.
static void topk_row(int64_t E, int64_t K, const float *p, int32_t *idx, float *weight) {
  float prev = INFINITY; // above every key: nothing ranks before the first pick
  int64_t prev_j = -1;
  double sum = 0.0;
  for (int64_t k = 0; k < K; k++) {
    int64_t best = -1;
    float best_key = 0.0f;
    for (int64_t j = 0; j < E; j++) {
      float key = rank_key(p[j]);
      int after_prev = key < prev || (key == prev && j > prev_j);
      if (after_prev && (best < 0 || key > best_key)) { // strict: ties keep the lower index
        best = j;
        best_key = key;
      }
    }
    idx[k] = (int32_t)best;
    prev = best_key;
    prev_j = best;
    sum += (double)p[best];
  }
  for (int64_t k = 0; k < K; k++) {
    // A zero sum is a row of -inf logits (probabilities all 0): no weight. NaN propagates.
    weight[k] = sum == 0.0 ? 0.0f : (float)((double)p[idx[k]] / sum);
  }
}

void loom_cpu_moe_router_forward(int64_t T, int64_t E, int64_t K, const float *logits, float *probs,
                                 int32_t *idx, float *weight) {
  loom_cpu_softmax_forward(T, E, logits, probs);
  for (int64_t t = 0; t < T; t++) {
    topk_row(E, K, probs + t * E, idx + t * K, weight + t * K);
  }
}

// ---------------------------------------------------------------------------------------------
// The load-balancing loss.

loom_status_t loom_cpu_moe_aux_loss(int64_t T, int64_t E, int64_t K, const float *probs,
                                    const int32_t *idx, float coef, float *aux, float *dprobs) {
  if (T <= 0) {
    *aux = 0.0f;
    return LOOM_OK;
  }
  // count[e]: assignments to e (exact in double up to 2^53); colsum[e]: sum over rows of probs.
  double *ws = loom_host_alloc(sizeof(double) * 2 * (size_t)E);
  if (!ws) {
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "moe aux loss: cannot allocate the workspace of %lld experts", (long long)E);
  }
  double *count = ws, *colsum = ws + E;
  memset(ws, 0, sizeof(double) * 2 * (size_t)E);
  for (int64_t i = 0; i < T * K; i++) {
    count[idx[i]] += 1.0;
  }
  for (int64_t t = 0; t < T; t++) {
    const float *p = probs + t * E;
    for (int64_t e = 0; e < E; e++) { // independent columns: vectorises
      colsum[e] += (double)p[e];
    }
  }
  // E * sum_e (count_e / (T K)) (colsum_e / T), one division at the end.
  double dot = 0.0;
  for (int64_t e = 0; e < E; e++) {
    dot += count[e] * colsum[e];
  }
  const double assignments = (double)T * (double)K, scale = (double)coef * (double)E;
  *aux = (float)(scale * dot / (assignments * (double)T));
  if (dprobs) {
    double *grad = colsum; // colsum is spent: its memory holds the column gradient
    for (int64_t e = 0; e < E; e++) {
      grad[e] = scale * count[e] / assignments / (double)T;
    }
    for (int64_t t = 0; t < T; t++) {
      float *d = dprobs + t * E;
      for (int64_t e = 0; e < E; e++) {
        d[e] += (float)grad[e];
      }
    }
  }
  loom_host_free(ws);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Backward: through the renormalisation, then the softmax.

void loom_cpu_moe_router_backward(int64_t T, int64_t E, int64_t K, float *dlogits,
                                  const float *dweight, const float *probs, const int32_t *idx,
                                  const float *weight, const float *dprobs_extra) {
  for (int64_t t = 0; t < T; t++) {
    const float *p = probs + t * E, *dw = dweight + t * K, *w = weight + t * K;
    const int32_t *ix = idx + t * K;
    float *d = dlogits + t * E;
    if (dprobs_extra) { // element by element: d may be dprobs_extra itself
      const float *x = dprobs_extra + t * E;
      for (int64_t j = 0; j < E; j++) {
        d[j] = x[j];
      }
    } else {
      for (int64_t j = 0; j < E; j++) {
        d[j] = 0.0f;
      }
    }
    // S as the forward sums it (kept order, double); s = sum_k dweight_k weight_k.
    double S = 0.0, s = 0.0;
    for (int64_t k = 0; k < K; k++) {
      S += (double)p[ix[k]];
      s += (double)dw[k] * (double)w[k];
    }
    if (S != 0.0) { // S = 0: a row of zero probabilities, whose softmax gradient is 0 anyway
      for (int64_t k = 0; k < K; k++) {
        d[ix[k]] += (float)(((double)dw[k] - s) / S);
      }
    }
    loom_cpu_softmax_backward(1, E, p, d, d); // in place: the dot is taken before any write
  }
}
