/* attention.c — loom_attention_forward/backward: validate every tensor and both cu_seqlens before
 * anything is written, then run the padding-free tiled kernels of compute/cpu/attention_cpu.c. */
#include "config.h"
#include "loom_compute.h"

#include <limits.h>
#include <math.h>

#include "args.h"
#include "cpu/attention_cpu.h"
#include "error.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

// ---------------------------------------------------------------------------------------------
// Validation shared by forward and backward.

typedef struct attn_dims {
  int64_t total_q, total_k, B;
  int H, H_kv, D;
  int max_q, max_k; // longest query and key sequence (grid sizes of the CUDA kernels)
} attn_dims_t;

// The longest of the B sequences of the offsets cu (already validated).
static int max_length(const int32_t *cu, int64_t B) {
  int32_t longest = 0;
  for (int64_t b = 0; b < B; b++) {
    longest = cu[b + 1] - cu[b] > longest ? cu[b + 1] - cu[b] : longest;
  }
  return longest;
}

// q (total_q, H, D), k and v (total_k, H_kv, D) of dtype dt on device dev, cu_seqlens_q/k
// (B + 1) i32 with valid values (read through a host copy when they live on a device), and a
// usable scale. The caller checked the backend on its first tensor.
static loom_status_t check_inputs(const char *op, int dev, loom_dtype_t dt, const loom_tensor_t *q,
                                  const loom_tensor_t *k, const loom_tensor_t *v,
                                  const loom_tensor_t *cu_q, const loom_tensor_t *cu_k, float scale,
                                  attn_dims_t *dims) {
  char s[LOOM_SHAPE_STR_MAX];
  loom_status_t status = loom_arg_tensor(op, "q", q, dt, dev);
  if (status != LOOM_OK) {
    return status;
  }
  if (q->ndim != 3 || q->shape[1] < 1 || q->shape[2] < 1 || q->shape[1] > INT_MAX ||
      q->shape[2] > INT_MAX || q->shape[1] * q->shape[2] > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: q is %s, expected (total_q, H, D) with H >= 1 and D >= 1", op,
                      loom_shape_str(q, s));
  }
  if ((status = loom_arg_tensor(op, "k", k, dt, dev)) != LOOM_OK) {
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
  if ((status = loom_arg_shape(op, "v", v, dt, dev, 3, k->shape)) != LOOM_OK) {
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
  const int32_t *cq = NULL, *ck = NULL;
  int32_t *owned_q = NULL, *owned_k = NULL; // host copies of device offsets
  if ((status = loom_arg_i32_view(op, "cu_seqlens_q", cu_q, &cq, &owned_q)) == LOOM_OK &&
      (status = loom_arg_i32_view(op, "cu_seqlens_k", cu_k, &ck, &owned_k)) == LOOM_OK &&
      (status = loom_cpu_varlen_check(op, "cu_seqlens_q", cq, B, q->shape[0], "q", -1)) ==
          LOOM_OK &&
      (status = loom_cpu_varlen_check(op, "cu_seqlens_k", ck, B, k->shape[0], "k", -1)) ==
          LOOM_OK) {
    dims->max_q = max_length(cq, B);
    dims->max_k = max_length(ck, B);
  }
  loom_host_free(owned_q);
  loom_host_free(owned_k);
  if (status != LOOM_OK) {
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
static loom_status_t check_lse(const char *op, int dev, const loom_tensor_t *lse,
                               const attn_dims_t *d) {
  const int64_t shape[2] = {d->H, d->total_q};
  return loom_arg_shape(op, "lse", lse, LOOM_F32, dev, 2, shape);
}

// The dtype of the attention tensors, from the output t: f32, or bf16 on a CUDA device (f32
// softmax and accumulation, f32 lse). Anything else is checked (and refused) as f32.
static loom_dtype_t attn_dtype(const loom_tensor_t *t) {
  return t->device != LOOM_DEVICE_HOST && t->dtype == LOOM_BF16 ? LOOM_BF16 : LOOM_F32;
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
  const int dev = out->device;
  const loom_dtype_t dt = attn_dtype(out);
  if ((status = check_inputs(op, dev, dt, q, k, v, cu_seqlens_q, cu_seqlens_k, scale, &d)) !=
          LOOM_OK ||
      (status = loom_arg_shape(op, "out", out, dt, dev, 3, q->shape)) != LOOM_OK ||
      (status = check_lse(op, dev, lse, &d)) != LOOM_OK) {
    return status;
  }
  // The tiles write rows of out while later tiles still read q, k and v (out = q would give wrong
  // sums): the outputs overlap neither the inputs nor each other.
  const loom_tensor_t *ins[5] = {q, k, v, cu_seqlens_q, cu_seqlens_k};
  const char *in_names[5] = {"q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"};
  for (int j = 0; j < 5; j++) {
    if ((status = loom_arg_disjoint(op, "out", out, in_names[j], ins[j], 0)) != LOOM_OK ||
        (status = loom_arg_disjoint(op, "lse", lse, in_names[j], ins[j], 0)) != LOOM_OK) {
      return status;
    }
  }
  if ((status = loom_arg_disjoint(op, "out", out, "lse", lse, 0)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_attention_fwd(dt, out->data, lse->data, q->data, k->data, v->data,
                                   cu_seqlens_q->data, cu_seqlens_k->data, (int)d.B, d.max_q,
                                   d.max_k, d.H, d.H_kv, d.D, causal != 0, scale);
  }
#endif
  return loom_cpu_attention_fwd(out->data, lse->data, q->data, k->data, v->data, cu_seqlens_q->data,
                                cu_seqlens_k->data, (int)d.B, d.H, d.H_kv, d.D, causal != 0, scale);
}

// The backward's outputs overlap neither its inputs (the forward's out and lse and both
// cu_seqlens included: the kernels zero and write dq, dk and dv sequence by sequence while they
// still read the offsets) nor each other (the CUDA tensor-core path also keeps intermediate sums
// in dq's storage until it writes dq).
static loom_status_t check_grads_disjoint(const char *op, const loom_tensor_t *dq,
                                          const loom_tensor_t *dk, const loom_tensor_t *dv,
                                          const loom_tensor_t *dout, const loom_tensor_t *q,
                                          const loom_tensor_t *k, const loom_tensor_t *v,
                                          const loom_tensor_t *out, const loom_tensor_t *lse,
                                          const loom_tensor_t *cu_q, const loom_tensor_t *cu_k) {
  const loom_tensor_t *outs[3] = {dq, dk, dv}, *ins[8] = {dout, q, k, v, out, lse, cu_q, cu_k};
  const char *out_names[3] = {"dq", "dk", "dv"};
  const char *in_names[8] = {"dout", "q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k"};
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j < 8; j++) {
      loom_status_t status = loom_arg_disjoint(op, out_names[i], outs[i], in_names[j], ins[j], 0);
      if (status != LOOM_OK) {
        return status;
      }
    }
    for (int j = i + 1; j < 3; j++) {
      loom_status_t status = loom_arg_disjoint(op, out_names[i], outs[i], out_names[j], outs[j], 0);
      if (status != LOOM_OK) {
        return status;
      }
    }
  }
  return LOOM_OK;
}

loom_status_t loom_attention_backward(loom_tensor_t *dq, loom_tensor_t *dk, loom_tensor_t *dv,
                                      const loom_tensor_t *dout, const loom_tensor_t *q,
                                      const loom_tensor_t *k, const loom_tensor_t *v,
                                      const loom_tensor_t *out, const loom_tensor_t *lse,
                                      const loom_tensor_t *cu_seqlens_q,
                                      const loom_tensor_t *cu_seqlens_k, int causal, float scale) {
  static const char op[] = "loom_attention_backward";
  attn_dims_t d;
  loom_status_t status = loom_arg_backend(op, "dq", dq);
  if (status != LOOM_OK) {
    return status;
  }
  const int dev = dq->device;
  const loom_dtype_t dt = attn_dtype(dq);
  if ((status = check_inputs(op, dev, dt, q, k, v, cu_seqlens_q, cu_seqlens_k, scale, &d)) !=
          LOOM_OK ||
      (status = loom_arg_shape(op, "out", out, dt, dev, 3, q->shape)) != LOOM_OK ||
      (status = check_lse(op, dev, lse, &d)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dout", dout, dt, dev, 3, q->shape)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dq", dq, dt, dev, 3, q->shape)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dk", dk, dt, dev, 3, k->shape)) != LOOM_OK ||
      (status = loom_arg_shape(op, "dv", dv, dt, dev, 3, k->shape)) != LOOM_OK ||
      (status = check_grads_disjoint(op, dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens_q,
                                     cu_seqlens_k)) != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_CUDA
  if (dev != LOOM_DEVICE_HOST) {
    return loom_cuda_attention_bwd(dt, dq->data, dk->data, dv->data, dout->data, q->data, k->data,
                                   v->data, out->data, lse->data, cu_seqlens_q->data,
                                   cu_seqlens_k->data, (int)d.B, d.max_q, d.max_k, d.H, d.H_kv, d.D,
                                   causal != 0, scale);
  }
#endif
  return loom_cpu_attention_bwd(dq->data, dk->data, dv->data, dout->data, q->data, k->data, v->data,
                                out->data, lse->data, cu_seqlens_q->data, cu_seqlens_k->data,
                                (int)d.B, d.H, d.H_kv, d.D, causal != 0, scale);
}
