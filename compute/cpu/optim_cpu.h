/* optim_cpu.h — raw-pointer CPU kernels of the optimizer updates (AdamW and SGD with momentum,
 * both as torch.optim computes them) and of the gradient-norm clipping scale. */
#ifndef LOOM_CPU_OPTIM_H
#define LOOM_CPU_OPTIM_H

#include <stdint.h>

#include "loom_compute.h"

#ifdef __cplusplus
extern "C" {
#endif

// One torch.optim.AdamW step (amsgrad off) on n elements; hp is already validated. param, grad,
// m and v must not overlap.
void loom_cpu_adamw_update(int64_t n,
                           float *param,      // (n)
                           const float *grad, // (n)
                           float *m,          // (n)
                           float *v,          // (n)
                           const loom_adamw_t *hp);

// One torch.optim.SGD step (dampening 0) on n elements; buf may be NULL when hp->momentum is 0.
// param, grad and buf must not overlap.
void loom_cpu_sgd_update(int64_t n,
                         float *param,      // (n)
                         const float *grad, // (n)
                         float *buf,        // (n) or NULL
                         const loom_sgd_t *hp);

// The factor clip_grad_norm scales by: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0
// (measure only) or when norm is not finite (nothing sensible to scale to; the caller sees it).
double loom_cpu_clip_coef(double norm, double max_norm);

#ifdef __cplusplus
}
#endif
#endif
