/* moe_cpu.h — raw-pointer CPU kernels of the MoE router: softmax and top-K selection, the
 * Switch Transformer load-balancing loss, and the backward through renormalisation and softmax. */
#ifndef LOOM_MOE_CPU_H
#define LOOM_MOE_CPU_H

#include <stdint.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// The arguments are trusted (compute/moe.c checks them): T >= 0 rows, 1 <= K <= E, every index
// in 0..E-1, no overlap between outputs and inputs unless stated.

// probs = softmax(logits) per row (loom_cpu_softmax_forward's numerics); idx = the K experts of
// largest probability, descending, ties to the lower index (a NaN probability ranks below every
// number, so idx is always a valid index); weight = probs at idx / their sum (0 where the kept
// probabilities sum to 0, a row of -inf logits).
void loom_cpu_moe_router_forward(int64_t T, int64_t E, int64_t K,
                                 const float *logits, // (T, E)
                                 float *probs,        // (T, E)
                                 int32_t *idx,        // (T, K)
                                 float *weight);      // (T, K)

// *aux = coef * E * sum_e f_e * P_e (f_e = share of the T*K entries of idx equal to e, P_e = mean
// of probs[:, e]; 0 when T is 0), sums in double; dprobs (may be NULL) += coef * E * f_e / T in
// column e. Returns LOOM_OK, or LOOM_ERR_NOMEM with nothing written when the 2 * E doubles of
// workspace cannot be allocated.
loom_status_t loom_cpu_moe_aux_loss(int64_t T, int64_t E, int64_t K,
                                    const float *probs, // (T, E)
                                    const int32_t *idx, // (T, K)
                                    float coef, float *aux,
                                    float *dprobs); // (T, E) or NULL

// dlogits = softmax backward (probs) of dp, dp = the renormalisation gradient of dweight
// scattered to the columns idx (repeated indices add up) + dprobs_extra (may be NULL). dlogits may
// be dprobs_extra (the same pointer).
void loom_cpu_moe_router_backward(int64_t T, int64_t E, int64_t K,
                                  float *dlogits,             // (T, E)
                                  const float *dweight,       // (T, K)
                                  const float *probs,         // (T, E)
                                  const int32_t *idx,         // (T, K)
                                  const float *weight,        // (T, K)
                                  const float *dprobs_extra); // (T, E) or NULL

#ifdef __cplusplus
}
#endif
#endif
