/* loss.c — loom_cross_entropy_forward/backward: check the logits, targets and outputs (shapes,
 * dtypes, every target's range) before anything is written, then run the CPU kernels. */
#include "config.h"
#include "loom_compute.h"

#include <math.h>

#include "args.h"
#include "cpu/loss_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Argument checks shared by the forward and the backward.

// logits viewed as (N, V) and targets (i32, N elements, any shape), each target in 0..V-1 or
// ignore_index. *n and *v receive N and V, *valid the number of targets that are not
// ignore_index (the divisor of the mean loss). Targets on a device are read through a host copy.
static loom_status_t check_logits_targets(const char *op, int device, const loom_tensor_t *logits,
                                          const loom_tensor_t *targets, int32_t ignore_index,
                                          int64_t *n, int64_t *v, int64_t *valid) {
  char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  loom_status_t status = loom_arg_matrix(op, "logits", logits, LOOM_F32, device, n, v);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "targets", targets, LOOM_I32, device);
  if (status != LOOM_OK) {
    return status;
  }
  if (loom_tensor_numel(targets) != *n) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: targets %s has %lld elements, but logits %s has %lld rows: one target "
                      "per row",
                      op, loom_shape_str(targets, s1), (long long)loom_tensor_numel(targets),
                      loom_shape_str(logits, s2), (long long)*n);
  }
  const int32_t *t = NULL;
  int32_t *owned = NULL;
  if ((status = loom_arg_i32_view(op, "targets", targets, &t, &owned)) != LOOM_OK) {
    return status;
  }
  for (int64_t i = 0; i < *n; i++) {
    if (t[i] != ignore_index && (t[i] < 0 || (int64_t)t[i] >= *v)) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: targets[%lld] = %d is outside 0..%lld (V = %lld, logits %s) and "
                          "is not ignore_index %d",
                          op, (long long)i, (int)t[i], (long long)*v - 1, (long long)*v,
                          loom_shape_str(logits, s2), (int)ignore_index);
      break;
    }
  }
  if (status == LOOM_OK) {
    *valid = *n > 0 ? loom_cpu_cross_entropy_count(*n, t, ignore_index) : 0;
  }
  loom_host_free(owned);
  return status;
}

// ---------------------------------------------------------------------------------------------

loom_status_t loom_cross_entropy_forward(loom_tensor_t *losses, float *mean_loss,
                                         const loom_tensor_t *logits, const loom_tensor_t *targets,
                                         int32_t ignore_index) {
  static const char op[] = "loom_cross_entropy_forward";
  char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  int64_t n = 0, v = 0, valid = 0;
  loom_status_t status = loom_arg_backend(op, "losses", losses);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_tensor(op, "losses", losses, LOOM_F32, losses->device);
  if (status != LOOM_OK) {
    return status;
  }
  status = check_logits_targets(op, losses->device, logits, targets, ignore_index, &n, &v, &valid);
  if (status != LOOM_OK) {
    return status;
  }
  if (loom_tensor_numel(losses) != n) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: losses %s has %lld elements, but logits %s has %lld rows: one loss per "
                      "row",
                      op, loom_shape_str(losses, s1), (long long)loom_tensor_numel(losses),
                      loom_shape_str(logits, s2), (long long)n);
  }
  if ((status = loom_arg_disjoint(op, "losses", losses, "logits", logits, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "losses", losses, "targets", targets, 0)) != LOOM_OK) {
    return status;
  }
  double total = 0.0;
#ifdef LOOM_HAVE_CUDA
  if (losses->device != LOOM_DEVICE_HOST) {
    status = loom_cuda_cross_entropy_forward(n, v, logits->data, targets->data, ignore_index,
                                             losses->data, &total);
    if (status != LOOM_OK) {
      return status;
    }
  } else
#endif
  {
    total = loom_cpu_cross_entropy_forward(n, v, logits->data, targets->data, ignore_index,
                                           losses->data);
  }
  if (mean_loss) {
    *mean_loss = valid > 0 ? (float)(total / (double)valid) : 0.0f;
  }
  return LOOM_OK;
}

loom_status_t loom_cross_entropy_backward(loom_tensor_t *dlogits, const loom_tensor_t *logits,
                                          const loom_tensor_t *targets, int32_t ignore_index,
                                          float dloss) {
  static const char op[] = "loom_cross_entropy_backward";
  int64_t n = 0, v = 0, valid = 0;
  loom_status_t status = loom_arg_backend(op, "dlogits", dlogits);
  if (status != LOOM_OK) {
    return status;
  }
  status = check_logits_targets(op, dlogits->device, logits, targets, ignore_index, &n, &v, &valid);
  if (status != LOOM_OK) {
    return status;
  }
  status = loom_arg_shape(op, "dlogits", dlogits, LOOM_F32, dlogits->device, logits->ndim,
                          logits->shape);
  if (status != LOOM_OK) {
    return status;
  }
  // In place is logits itself: a row further on would be overwritten before it is read.
  if ((status = loom_arg_disjoint(op, "dlogits", dlogits, "logits", logits, 1)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dlogits", dlogits, "targets", targets, 0)) != LOOM_OK) {
    return status;
  }
  if (!isfinite(dloss)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: dloss = %g, expected a finite value (1 for the gradient of the mean "
                      "loss)",
                      op, (double)dloss);
  }
  float scale = valid > 0 ? (float)((double)dloss / (double)valid) : 0.0f;
#ifdef LOOM_HAVE_CUDA
  if (dlogits->device != LOOM_DEVICE_HOST) {
    return loom_cuda_cross_entropy_backward(n, v, dlogits->data, logits->data, targets->data,
                                            ignore_index, scale);
  }
#endif
  loom_cpu_cross_entropy_backward(n, v, dlogits->data, logits->data, targets->data, ignore_index,
                                  scale);
  return LOOM_OK;
}
