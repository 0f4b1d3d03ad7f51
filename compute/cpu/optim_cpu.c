/* optim_cpu.c — CPU optimizer updates written to give what torch.optim.AdamW and
 * torch.optim.SGD give, operation for operation in float, and the clip_grad_norm factor. */
#include "config.h"
#include "optim_cpu.h"
#include "simd.h"

#include <math.h>

// ---------------------------------------------------------------------------------------------
// AdamW

// The order is PyTorch's _single_tensor_adamw (amsgrad off), not the textbook one-liner
// p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p):
//   p *= 1 - lr * wd                         (decoupled decay first, on the old p)
//   m  = b1 * m + (1 - b1) * g               (PyTorch: m.lerp_(g, 1 - b1); same value)
//   v  = b2 * v + (1 - b2) * g * g
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc1 = 1 - b1^t, bc2 = 1 - b2^t
// As in PyTorch the scalar factors are computed in double and rounded to float once; every
// per-element operation is in float.
LOOM_CPU_CLONES
static void adamw_update_kernel(int64_t n, float *restrict param, const float *restrict grad,
                                float *restrict m, float *restrict v, const loom_adamw_t *hp) {
  const double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2;
  const float decay = (float)(1.0 - lr * (double)hp->weight_decay);
  const float beta1 = hp->beta1, one_minus_b1 = (float)(1.0 - b1);
  const float beta2 = hp->beta2, one_minus_b2 = (float)(1.0 - b2);
  const float step_size = (float)(lr / (1.0 - pow(b1, hp->step)));
  const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, hp->step));
  const float eps = hp->eps;
  for (int64_t i = 0; i < n; i++) {
    float g = grad[i];
    float p = param[i] * decay;
    float mi = beta1 * m[i] + one_minus_b1 * g;
    float vi = beta2 * v[i] + one_minus_b2 * g * g;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    m[i] = mi;
    v[i] = vi;
    param[i] = p - step_size * (mi / denom);
  }
}

void loom_cpu_adamw_update(int64_t n, float *restrict param, const float *restrict grad,
                           float *restrict m, float *restrict v, const loom_adamw_t *hp) {
  adamw_update_kernel(n, param, grad, m, v, hp);
}

// ---------------------------------------------------------------------------------------------
// SGD

// PyTorch's _single_tensor_sgd with dampening 0:
//   g = g + wd * p                      (L2 weight decay, when wd != 0)
//   buf = momentum * buf + g            (PyTorch clones g into buf on the first step; buf
//                                        starts at zero here, and momentum * 0 + g == g)
//   g = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// With momentum 0 the buffer is not used (PyTorch keeps none) and p = p - lr * g.
LOOM_CPU_CLONES
static void sgd_update_kernel(int64_t n, float *restrict param, const float *restrict grad,
                              float *restrict buf, const loom_sgd_t *hp) {
  const float lr = hp->lr, mu = hp->momentum, wd = hp->weight_decay;
  if (mu == 0.0f || !buf) {
    for (int64_t i = 0; i < n; i++) {
      float g = grad[i] + wd * param[i];
      param[i] = param[i] - lr * g;
    }
  } else if (hp->nesterov) {
    for (int64_t i = 0; i < n; i++) {
      float g = grad[i] + wd * param[i];
      float b = mu * buf[i] + g;
      buf[i] = b;
      param[i] = param[i] - lr * (g + mu * b);
    }
  } else {
    for (int64_t i = 0; i < n; i++) {
      float g = grad[i] + wd * param[i];
      float b = mu * buf[i] + g;
      buf[i] = b;
      param[i] = param[i] - lr * b;
    }
  }
}

void loom_cpu_sgd_update(int64_t n, float *restrict param, const float *restrict grad,
                         float *restrict buf, const loom_sgd_t *hp) {
  sgd_update_kernel(n, param, grad, buf, hp);
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping (torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), <= 1)

double loom_cpu_clip_coef(double norm, double max_norm) {
  if (!(max_norm > 0.0) || !isfinite(norm)) {
    return 1.0;
  }
  double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}
