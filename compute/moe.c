/* moe.c — loom_moe_router_forward/backward and loom_moe_aux_loss: check shapes, dtypes, K, every
 * expert index and overlaps before anything is written, then run the CPU kernels. */
#include "config.h"
#include "loom_compute.h"

#include <math.h>

#include "args.h"
#include "cpu/moe_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Argument checks shared by the three ops.

// idx (T, K) i32 with as many rows as ref (T, E) and 1 <= K <= E. *k receives K.
static loom_status_t check_idx(const char *op, int device, const loom_tensor_t *idx,
                               const char *ref_name, const loom_tensor_t *ref, int64_t T, int64_t E,
                               int64_t *k) {
  int64_t rows = 0;
  loom_status_t status = loom_arg_matrix(op, "idx", idx, LOOM_I32, device, &rows, k);
  if (status != LOOM_OK ||
      (status = loom_arg_like(op, "idx", idx, ref_name, ref, T, *k)) != LOOM_OK) {
    return status;
  }
  if (*k < 1 || *k > E) {
    char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: idx %s keeps K = %lld experts per row, but %s %s has E = %lld: expected "
                      "1 <= K <= E",
                      op, loom_shape_str(idx, s1), (long long)*k, ref_name, loom_shape_str(ref, s2),
                      (long long)E);
  }
  return LOOM_OK;
}

// An f32 tensor t of the matrix shape (rows, cols) of ref.
static loom_status_t check_like(const char *op, int device, const char *name,
                                const loom_tensor_t *t, const char *ref_name,
                                const loom_tensor_t *ref, int64_t rows, int64_t cols) {
  int64_t r = 0, c = 0;
  loom_status_t status = loom_arg_matrix(op, name, t, LOOM_F32, device, &r, &c);
  if (status != LOOM_OK) {
    return status;
  }
  return loom_arg_like(op, name, t, ref_name, ref, rows, cols);
}

// Every index of idx (T, K) in 0..E-1; the message names the first bad row.
static loom_status_t check_idx_range(const char *op, const loom_tensor_t *idx, int64_t T, int64_t K,
                                     int64_t E) {
  const int32_t *ix = NULL;
  int32_t *owned = NULL; // the host copy of a device idx
  loom_status_t status = loom_arg_i32_view(op, "idx", idx, &ix, &owned);
  for (int64_t t = 0; t < T && status == LOOM_OK; t++) {
    for (int64_t k = 0; k < K; k++) {
      int32_t e = ix[t * K + k];
      if (e < 0 || (int64_t)e >= E) {
        char s[LOOM_SHAPE_STR_MAX];
        status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                            "%s: idx %s row %lld holds expert %d at column %lld, outside 0..%lld "
                            "(E = %lld experts)",
                            op, loom_shape_str(idx, s), (long long)t, (int)e, (long long)k,
                            (long long)E - 1, (long long)E);
        break;
      }
    }
  }
  loom_host_free(owned);
  return status;
}

// ---------------------------------------------------------------------------------------------

loom_status_t loom_moe_router_forward(loom_tensor_t *probs, loom_tensor_t *idx,
                                      loom_tensor_t *weight, const loom_tensor_t *logits) {
  static const char op[] = "loom_moe_router_forward";
  int64_t T = 0, E = 0, K = 0;
  loom_status_t status = loom_arg_backend(op, "probs", probs);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = probs->device;
  if ((status = loom_arg_matrix(op, "logits", logits, LOOM_F32, dev, &T, &E)) != LOOM_OK ||
      (status = check_like(op, dev, "probs", probs, "logits", logits, T, E)) != LOOM_OK ||
      (status = check_idx(op, dev, idx, "logits", logits, T, E, &K)) != LOOM_OK ||
      (status = check_like(op, dev, "weight", weight, "idx", idx, T, K)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "probs", probs, "logits", logits, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "idx", idx, "logits", logits, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "weight", weight, "logits", logits, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "probs", probs, "idx", idx, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "probs", probs, "weight", weight, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "idx", idx, "weight", weight, 0)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_moe_router_forward(T, E, K, logits->data, probs->data, idx->data,
                                        weight->data);
  }
#endif
  loom_cpu_moe_router_forward(T, E, K, logits->data, probs->data, idx->data, weight->data);
  return LOOM_OK;
}

loom_status_t loom_moe_aux_loss(float *aux, loom_tensor_t *dprobs, const loom_tensor_t *probs,
                                const loom_tensor_t *idx, float coef) {
  static const char op[] = "loom_moe_aux_loss";
  int64_t T = 0, E = 0, K = 0;
  if (!aux) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: aux is NULL: pass the address of a float to receive the loss", op);
  }
  loom_status_t status = loom_arg_backend(op, "probs", probs);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = probs->device;
  if ((status = loom_arg_matrix(op, "probs", probs, LOOM_F32, dev, &T, &E)) != LOOM_OK ||
      (status = check_idx(op, dev, idx, "probs", probs, T, E, &K)) != LOOM_OK ||
      (dprobs &&
       (status = check_like(op, dev, "dprobs", dprobs, "probs", probs, T, E)) != LOOM_OK) ||
      (status = loom_arg_disjoint(op, "dprobs", dprobs, "probs", probs, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dprobs", dprobs, "idx", idx, 0)) != LOOM_OK) {
    return status;
  }
  if (!isfinite(coef)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: coef = %g, expected a finite value (0.01 is Switch Transformer's)", op,
                      (double)coef);
  }
  if ((status = check_idx_range(op, idx, T, K, E)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_moe_aux_loss(T, E, K, probs->data, idx->data, coef, aux,
                                  dprobs ? (float *)dprobs->data : NULL);
  }
#endif
  return loom_cpu_moe_aux_loss(T, E, K, probs->data, idx->data, coef, aux,
                               dprobs ? (float *)dprobs->data : NULL);
}

loom_status_t loom_moe_router_backward(loom_tensor_t *dlogits, const loom_tensor_t *dweight,
                                       const loom_tensor_t *probs, const loom_tensor_t *idx,
                                       const loom_tensor_t *weight,
                                       const loom_tensor_t *dprobs_extra) {
  static const char op[] = "loom_moe_router_backward";
  int64_t T = 0, E = 0, K = 0;
  loom_status_t status = loom_arg_backend(op, "dlogits", dlogits);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = dlogits->device;
  if ((status = loom_arg_matrix(op, "probs", probs, LOOM_F32, dev, &T, &E)) != LOOM_OK ||
      (status = check_like(op, dev, "dlogits", dlogits, "probs", probs, T, E)) != LOOM_OK ||
      (status = check_idx(op, dev, idx, "probs", probs, T, E, &K)) != LOOM_OK ||
      (status = check_like(op, dev, "dweight", dweight, "idx", idx, T, K)) != LOOM_OK ||
      (status = check_like(op, dev, "weight", weight, "idx", idx, T, K)) != LOOM_OK ||
      (dprobs_extra && (status = check_like(op, dev, "dprobs_extra", dprobs_extra, "probs", probs,
                                            T, E)) != LOOM_OK) ||
      (status = loom_arg_disjoint(op, "dlogits", dlogits, "dweight", dweight, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dlogits", dlogits, "probs", probs, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dlogits", dlogits, "idx", idx, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dlogits", dlogits, "weight", weight, 0)) != LOOM_OK ||
      (status = loom_arg_disjoint(op, "dlogits", dlogits, "dprobs_extra", dprobs_extra, 1)) !=
          LOOM_OK ||
      (status = check_idx_range(op, idx, T, K, E)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_moe_router_backward(T, E, K, dlogits->data, dweight->data, probs->data,
                                         idx->data, weight->data,
                                         dprobs_extra ? (const float *)dprobs_extra->data : NULL);
  }
#endif
  loom_cpu_moe_router_backward(T, E, K, dlogits->data, dweight->data, probs->data, idx->data,
                               weight->data,
                               dprobs_extra ? (const float *)dprobs_extra->data : NULL);
  return LOOM_OK;
}
