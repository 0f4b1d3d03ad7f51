/* optim.c — loom_clip_grad_norm, loom_adamw_update and loom_sgd_update: check tensors and every
 * hyperparameter (naming the field and its valid range) before anything is written. */
#include "config.h"
#include "loom_compute.h"

#include <math.h>
#include <stdio.h>

#include "args.h"
#include "cpu/optim_cpu.h"
#include "cpu/util_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Shared checks

// t (an optimizer state or gradient) must be f32 with param's shape, on param's device.
static loom_status_t check_like_param(const char *op, const char *name, const loom_tensor_t *t,
                                      const loom_tensor_t *param) {
  return loom_arg_shape(op, name, t, LOOM_F32, param->device, param->ndim, param->shape);
}

// The n tensors must use separate memory: the kernels update them through restrict pointers.
static loom_status_t check_disjoint(const char *op, int n, const loom_tensor_t *const *t,
                                    const char *const *names) {
  for (int i = 0; i < n; i++) {
    for (int j = i + 1; j < n; j++) {
      if (t[i] && t[j] && loom_tensors_overlap(t[i], t[j])) {
        return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: %s and %s share memory: pass separate buffers", op, names[i],
                          names[j]);
      }
    }
  }
  return LOOM_OK;
}

// param, the op's first tensor (f32, on a backend that is built), and grad (f32, param's shape
// and device).
static loom_status_t check_param_grad(const char *op, const loom_tensor_t *param,
                                      const loom_tensor_t *grad) {
  loom_status_t status = loom_arg_backend(op, "param", param);
  if (status == LOOM_OK) {
    status = loom_arg_tensor(op, "param", param, LOOM_F32, param->device);
  }
  if (status == LOOM_OK) {
    status = check_like_param(op, "grad", grad, param);
  }
  return status;
}

// A hyperparameter field in [lo, hi) (hi_open) or [lo, hi]; NaN and infinities are rejected.
static loom_status_t check_range(const char *op, const char *field, float x, double lo, double hi,
                                 int hi_open, const char *range) {
  double d = (double)x;
  if (!isfinite(d) || d < lo || d > hi || (hi_open && d == hi)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: hp->%s = %g, expected %s", op, field, d,
                      range);
  }
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping

loom_status_t loom_clip_grad_norm(loom_tensor_t *const *grads, int n, float max_norm,
                                  float *global_norm) {
  static const char op[] = "loom_clip_grad_norm";
  char name[32];
  if (n < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: n = %d, expected n >= 0 gradients", op, n);
  }
  if (n > 0 && !grads) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: grads is NULL with n = %d", op, n);
  }
  if (isnan(max_norm)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: max_norm is NaN, expected a number (<= 0 only measures)", op);
  }
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "grads[%d]", i);
    loom_status_t status = i == 0 ? loom_arg_backend(op, name, grads[0]) : LOOM_OK;
    if (status == LOOM_OK) {
      status = loom_arg_tensor(op, name, grads[i], LOOM_F32, grads[0]->device);
    }
    if (status != LOOM_OK) {
      return status;
    }
  }
  const int on_device = n > 0 && grads[0]->device != LOOM_DEVICE_HOST; // n = 0: grads may be NULL
  (void)on_device; // read only by the CUDA branches
  double sumsq = 0.0;
  for (int i = 0; i < n; i++) {
    double part = 0.0;
#ifdef LOOM_HAVE_CUDA
    if (on_device) {
      loom_status_t status = loom_cuda_sumsq(loom_tensor_numel(grads[i]), grads[i]->data, &part);
      if (status != LOOM_OK) {
        return status;
      }
    } else
#endif
    {
      part = loom_cpu_sumsq(loom_tensor_numel(grads[i]), grads[i]->data);
    }
    sumsq += part;
  }
  double norm = sqrt(sumsq);
  if (isfinite(norm) && !isfinite((float)norm)) { // past float's range: reported as Inf, so it
    norm = INFINITY;                              // scales nothing (NaN stays NaN)
  }
  double coef = loom_cpu_clip_coef(norm, (double)max_norm);
  if (coef < 1.0) {
    for (int i = 0; i < n; i++) {
#ifdef LOOM_HAVE_CUDA
      if (on_device) {
        loom_status_t status =
            loom_cuda_scale(loom_tensor_numel(grads[i]), (float)coef, grads[i]->data);
        if (status != LOOM_OK) {
          return status;
        }
        continue;
      }
#endif
      loom_cpu_scale(loom_tensor_numel(grads[i]), (float)coef, grads[i]->data);
    }
  }
  if (global_norm) {
    *global_norm = (float)norm;
  }
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// AdamW

loom_status_t loom_adamw_update(loom_tensor_t *param, const loom_tensor_t *grad, loom_tensor_t *m,
                                loom_tensor_t *v, const loom_adamw_t *hp) {
  static const char op[] = "loom_adamw_update";
  loom_status_t status = check_param_grad(op, param, grad);
  if (status == LOOM_OK) {
    status = check_like_param(op, "m", m, param);
  }
  if (status == LOOM_OK) {
    status = check_like_param(op, "v", v, param);
  }
  if (status != LOOM_OK) {
    return status;
  }
  const loom_tensor_t *all[4] = {param, grad, m, v};
  static const char *const names[4] = {"param", "grad", "m", "v"};
  status = check_disjoint(op, 4, all, names);
  if (status != LOOM_OK) {
    return status;
  }
  if (!hp) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: hp is NULL: pass the hyperparameters", op);
  }
  status = check_range(op, "lr", hp->lr, 0.0, INFINITY, 0, "a finite value >= 0");
  if (status == LOOM_OK) {
    status = check_range(op, "beta1", hp->beta1, 0.0, 1.0, 1, "0 <= beta1 < 1 (0.9 typical)");
  }
  if (status == LOOM_OK) {
    status = check_range(op, "beta2", hp->beta2, 0.0, 1.0, 1, "0 <= beta2 < 1 (0.999 typical)");
  }
  if (status == LOOM_OK && !(hp->eps > 0.0f && isfinite(hp->eps))) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: hp->eps = %g, expected a finite value > 0 (1e-8 typical)", op,
                        (double)hp->eps);
  }
  if (status == LOOM_OK) {
    status =
        check_range(op, "weight_decay", hp->weight_decay, 0.0, INFINITY, 0, "a finite value >= 0");
  }
  if (status == LOOM_OK && hp->step < 1) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: hp->step = %d, expected >= 1 (1 for the first update)", op, hp->step);
  }
  if (status != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (param->device != LOOM_DEVICE_HOST) {
    return loom_cuda_adamw_update(loom_tensor_numel(param), param->data, grad->data, m->data,
                                  v->data, hp);
  }
#endif
  loom_cpu_adamw_update(loom_tensor_numel(param), param->data, grad->data, m->data, v->data, hp);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// SGD

loom_status_t loom_sgd_update(loom_tensor_t *param, const loom_tensor_t *grad, loom_tensor_t *buf,
                              const loom_sgd_t *hp) {
  static const char op[] = "loom_sgd_update";
  loom_status_t status = check_param_grad(op, param, grad);
  if (status != LOOM_OK) {
    return status;
  }
  if (!hp) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: hp is NULL: pass the hyperparameters", op);
  }
  status = check_range(op, "lr", hp->lr, 0.0, INFINITY, 0, "a finite value >= 0");
  if (status == LOOM_OK) {
    status = check_range(op, "momentum", hp->momentum, 0.0, INFINITY, 0,
                         "a finite value >= 0 (0 disables the buffer)");
  }
  if (status == LOOM_OK) {
    status =
        check_range(op, "weight_decay", hp->weight_decay, 0.0, INFINITY, 0, "a finite value >= 0");
  }
  if (status == LOOM_OK && hp->nesterov != 0 && hp->nesterov != 1) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: hp->nesterov = %d, expected 0 or 1", op,
                        hp->nesterov);
  }
  if (status == LOOM_OK && hp->nesterov && hp->momentum == 0.0f) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: hp->nesterov = 1 needs hp->momentum > 0 (as in torch.optim.SGD)", op);
  }
  if (status != LOOM_OK) {
    return status;
  }
  // With momentum 0 there is no buffer: buf may be NULL and is left alone if given.
  if (hp->momentum > 0.0f) {
    if (!buf) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: buf is NULL but hp->momentum = %g: pass a zeroed momentum buffer of "
                        "param's shape",
                        op, (double)hp->momentum);
    }
    status = check_like_param(op, "buf", buf, param);
    if (status != LOOM_OK) {
      return status;
    }
  } else {
    buf = NULL;
  }
  const loom_tensor_t *all[3] = {param, grad, buf};
  static const char *const names[3] = {"param", "grad", "buf"};
  status = check_disjoint(op, 3, all, names);
  if (status != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (param->device != LOOM_DEVICE_HOST) {
    return loom_cuda_sgd_update(loom_tensor_numel(param), param->data, grad->data,
                                buf ? buf->data : NULL, hp);
  }
#endif
  loom_cpu_sgd_update(loom_tensor_numel(param), param->data, grad->data, buf ? buf->data : NULL,
                      hp);
  return LOOM_OK;
}
