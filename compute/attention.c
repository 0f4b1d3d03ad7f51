/* attention.c — loom_attention_forward/backward: validate every tensor and both cu_seqlens before
 * anything is written, then run the padding-free tiled kernels of compute/cpu/attention_cpu.c. */
#include "config.h"
#include "loom_compute.h"

#include <limits.h>
#include <math.h>

#include "args.h"
#include "cpu/attention_cpu.h"
#include "error.h"

// ---------------------------------------------------------------------------------------------
// Validation shared by forward and backward.

typedef struct attn_dims {
  int64_t total_q, total_k, B;
  int H, H_kv, D;
} attn_dims_t;

// q (total_q, H, D), k and v (total_k, H_kv, D), cu_seqlens_q/k (B + 1) i32 with valid values,
// and a usable scale. The device is host (the caller checked the backend on its first tensor).
static loom_status_t check_inputs(const char *op, const loom_tensor_t *q, const loom_tensor_t *k,
                                  const loom_tensor_t *v, const loom_tensor_t *cu_q,
                                  const loom_tensor_t *cu_k, float scale, attn_dims_t *dims) {
  char s[LOOM_SHAPE_STR_MAX];
  const int dev = LOOM_DEVICE_HOST;
  loom_status_t status = loom_arg_tensor(op, "q", q, LOOM_F32, dev);
  if (status != LOOM_OK) {
    return status;
  }
  if (q->ndim != 3 || q->shape[1] < 1 || q->shape[2] < 1 || q->shape[1] > INT_MAX ||
      q->shape[2] > INT_MAX || q->shape[1] * q->shape[2] > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: q is %s, expected (total_q, H, D) with H >= 1 and D >= 1", op,
                      loom_shape_str(q, s));
  }
  if ((status = loom_arg_tensor(op, "k", k, LOOM_F32, dev)) != LOOM_OK) {
    return status;
  }
  if (k->ndim != 3 || k->shape[1] < 1 || k->shape[2] != q->shape[2]) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: k is %s, expected (total_k, H_kv, %lld) with H_kv >= 1 (D from q)", op,
                      loom_shape_str(k, s), (long long)q->shape[2]);
  }
  if (q->shape[1] % k->shape[1] != 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: q has H=%lld heads and k has H_kv=%lld: H must be a multiple of H_kv "
                      "(grouped-query attention)",
                      op, (long long)q->shape[1], (long long)k->shape[1]);
  }
  if ((status = loom_arg_shape(op, "v", v, LOOM_F32, dev, 3, k->shape)) != LOOM_OK) {
    return status;
  }
  if ((status = loom_arg_tensor(op, "cu_seqlens_q", cu_q, LOOM_I32, dev)) != LOOM_OK) {
    return status;
  }
  if (cu_q->ndim != 1 || cu_q->shape[0] < 1 || cu_q->shape[0] - 1 > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: cu_seqlens_q is %s, expected (B + 1)", op,
                      loom_shape_str(cu_q, s));
  }
  if ((status = loom_arg_shape(op, "cu_seqlens_k", cu_k, LOOM_I32, dev, 1, cu_q->shape)) !=
      LOOM_OK) {
    return status;
  }
  const int64_t B = cu_q->shape[0] - 1;
  if ((status = loom_cpu_varlen_check(op, "cu_seqlens_q", cu_q->data, B, q->shape[0], "q", -1)) !=
          LOOM_OK ||
      (status = loom_cpu_varlen_check(op, "cu_seqlens_k", cu_k->data, B, k->shape[0], "k", -1)) !=
          LOOM_OK) {
    return status;
  }
  if (!isfinite(scale)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: scale is %g: pass a finite value (<= 0 means 1/sqrt(D))", op,
                      (double)scale);
  }
  dims->total_q = q->shape[0];
  dims->total_k = k->shape[0];
  dims->B = B;
  dims->H = (int)q->shape[1];
  dims->H_kv = (int)k->shape[1];
  dims->D = (int)q->shape[2];
  return LOOM_OK;
}

// lse: (H, total_q) f32.
static loom_status_t check_lse(const char *op, const loom_tensor_t *lse, const attn_dims_t *d) {
  const int64_t shape[2] = {d->H, d->total_q};
  return loom_arg_shape(op, "lse", lse, LOOM_F32, LOOM_DEVICE_HOST, 2, shape);
}

// ---------------------------------------------------------------------------------------------
// Public ops.

loom_status_t loom_attention_forward(loom_tensor_t *out, loom_tensor_t *lse, const loom_tensor_t *q,
                                     const loom_tensor_t *k, const loom_tensor_t *v,
                                     const loom_tensor_t *cu_seqlens_q,
                                     const loom_tensor_t *cu_seqlens_k, int causal, float scale) {
  static const char op[] = "loom_attention_forward";
  attn_dims_t d;
  loom_status_t status = loom_arg_backend(op, "out", out);
  if (status != LOOM_OK) {
    return status;
  }
  if ((status = check_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, scale, &d)) != LOOM_OK ||
      (status = loom_arg_shape(op, "out", out, LOOM_F32, LOOM_DEVICE_HOST, 3, q->shape)) !=
          LOOM_OK ||
      (status = check_lse(op, lse, &d)) != LOOM_OK) {
    return status;
  }
  return loom_cpu_attention_fwd(out->data, lse->data, q->data, k->data, v->data, cu_seqlens_q->data,
                                cu_seqlens_k->data, (int)d.B, d.H, d.H_kv, d.D, causal != 0, scale);
}

loom_status_t loom_attention_backward(loom_tensor_t *dq, loom_tensor_t *dk, loom_tensor_t *dv,
                                      const loom_tensor_t *dout, const loom_tensor_t *q,
                                      const loom_tensor_t *k, const loom_tensor_t *v,
                                      const loom_tensor_t *out, const loom_tensor_t *lse,
                                      const loom_tensor_t *cu_seqlens_q,
                                      const loom_tensor_t *cu_seqlens_k, int causal, float scale) {
  static const char op[] = "loom_attention_backward";
  const int dev = LOOM_DEVICE_HOST;
  attn_dims_t d;
  loom_status_t status = loom_arg_backend(op, "dq", dq);
  if (status != LOOM_OK) {
    return status;
  }
  if ((status = check_inputs(op, q, k, v, cu_seqlens_q, cu_seqlens_k, scale, &d)) != LOOM_OK ||
      (status = loom_arg_shape(op, "out", out, LOOM_F32, dev, 3, q->shape)) != LOOM_OK ||
      (status = check_lse(op, lse, &d)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dout", dout, LOOM_F32, dev, 3, q->shape)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dq", dq, LOOM_F32, dev, 3, q->shape)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dk", dk, LOOM_F32, dev, 3, k->shape)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dv", dv, LOOM_F32, dev, 3, k->shape)) != LOOM_OK) {
    return status;
  }
  return loom_cpu_attention_bwd(dq->data, dk->data, dv->data, dout->data, q->data, k->data, v->data,
                                out->data, lse->data, cu_seqlens_q->data, cu_seqlens_k->data,
                                (int)d.B, d.H, d.H_kv, d.D, causal != 0, scale);
}
