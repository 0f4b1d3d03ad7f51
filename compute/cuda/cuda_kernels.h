/* cuda_kernels.h — the CUDA backend's raw-pointer kernels, one per CPU kernel of compute/cpu/
 * with the same semantics, run on the current device and stream (cuda_ctx.h). */
#ifndef LOOM_CUDA_KERNELS_H
#define LOOM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "loom_compute.h"

#ifdef __cplusplus
extern "C" {
#endif

// Conventions. Every pointer is device memory of the current device unless its name ends in
// _host. Arguments are trusted: the public ops in compute/*.c check them as for the CPU backend.
// Every function returns LOOM_OK, LOOM_ERR_CUDA (a launch failed: the message names the kernel),
// LOOM_ERR_NOMEM (scratch could not be allocated; nothing written) or LOOM_ERR_INTERNAL. The
// semantics, shapes and aliasing rules are those of the loom_cpu_* kernel of the same name in
// compute/cpu/*.h. "Deterministic" means the result does not depend on scheduling: no float
// atomics where the CPU kernel sums in a fixed order.

// ---- linear (linear_cuda.cu): cuBLAS; f32 (TF32 off: the CPU comparison is in f32) or bf16
// inputs with f32 accumulation. dtype is LOOM_F32 or LOOM_BF16 and applies to a, b and c;
// bias is f32 (or NULL) and added after the product, not scaled by alpha. Row-major with row
// strides lda, ldb, ldc (elements) as loom_cpu_gemm_strided. beta == 0 overwrites c.
loom_status_t loom_cuda_gemm(loom_dtype_t dtype, int trans_a, int trans_b, int64_t M, int64_t N,
                             int64_t K, float alpha, const void *a, int64_t lda, const void *b,
                             int64_t ldb, const float *bias, float beta, void *c, int64_t ldc);
// dbias[j] += sum_i dout[i, j], deterministic.
loom_status_t loom_cuda_bias_backward(int64_t M, int64_t N, const float *dout, float *dbias);

// ---- activations (activation_cuda.cu)
loom_status_t loom_cuda_gelu_forward(int64_t n, const float *in, float *out);
loom_status_t loom_cuda_gelu_backward(int64_t n, const float *in, const float *dout, float *din);
// out = gelu(in), deriv = gelu'(in) (deriv may be in); din = dout * deriv (din may be either),
// then dbias (N, or NULL) += column sums of din (M, N) by loom_cuda_bias_backward.
loom_status_t loom_cuda_gelu_forward_deriv(int64_t n, const float *in, float *out, float *deriv);
loom_status_t loom_cuda_gelu_backward_deriv(int64_t M, int64_t N, const float *deriv,
                                            const float *dout, float *din, float *dbias);
// Fused bias + GELU (the FFN's first GEMM epilogue): pre[i, j] = x[i, j] + bias[j] is kept for
// the backward (pre may be x) and out = gelu(pre). x, pre, out: (M, N); bias: (N).
loom_status_t loom_cuda_bias_gelu_forward(int64_t M, int64_t N, const float *x, const float *bias,
                                          float *pre, float *out);
loom_status_t loom_cuda_softmax_forward(int64_t N, int64_t C, const float *in, float *out);
loom_status_t loom_cuda_softmax_backward(int64_t N, int64_t C, const float *out, const float *dout,
                                         float *din);

// ---- layer norm (layernorm_cuda.cu); dweight, dbias accumulate, deterministic.
loom_status_t loom_cuda_layernorm_forward(int64_t N, int64_t C, float eps, const float *in,
                                          const float *weight, const float *bias, float *out,
                                          float *mean, float *rstd);
loom_status_t loom_cuda_layernorm_backward(int64_t N, int64_t C, const float *dout, const float *in,
                                           const float *weight, const float *mean,
                                           const float *rstd, float *din, float *dweight,
                                           float *dbias);

// ---- loss (loss_cuda.cu). *sum_host is written on the host (the call waits for the stream).
loom_status_t loom_cuda_cross_entropy_forward(int64_t n, int64_t v, const float *logits,
                                              const int32_t *targets, int32_t ignore_index,
                                              float *losses, double *sum_host);
loom_status_t loom_cuda_cross_entropy_backward(int64_t n, int64_t v, float *dlogits,
                                               const float *logits, const int32_t *targets,
                                               int32_t ignore_index, float scale);

// ---- embedding and residual (embedding_cuda.cu). The embedding backward adds the rows of
// each id in ascending i, as the CPU kernel does, so both give the same bits.
loom_status_t loom_cuda_embedding_forward(int64_t n, int64_t c, float *out, const int32_t *ids,
                                          const float *table);
loom_status_t loom_cuda_embedding_backward(int64_t n, int64_t c, float *dtable, const int32_t *ids,
                                           const float *dout);
loom_status_t loom_cuda_residual_forward(int64_t n, float *out, const float *a, const float *b);
loom_status_t loom_cuda_accumulate(int64_t n, float *acc, const float *x);

// ---- vector utilities (util_cuda.cu). sumsq is deterministic (fixed reduction tree, doubles).
loom_status_t loom_cuda_scale(int64_t n, float alpha, float *x);
loom_status_t loom_cuda_axpy(int64_t n, float alpha, const float *x, float *y);
loom_status_t loom_cuda_sumsq(int64_t n, const float *x, double *sum_host);
// dst[i] = (float)src[i] and back, bf16 round-to-nearest-even as loom_f32_to_bf16.
loom_status_t loom_cuda_f32_to_bf16(int64_t n, const float *src, uint16_t *dst);
loom_status_t loom_cuda_bf16_to_f32(int64_t n, const uint16_t *src, float *dst);

// ---- optimizers (optim_cuda.cu): the same float arithmetic as the CPU kernels.
loom_status_t loom_cuda_adamw_update(int64_t n, float *param, const float *grad, float *m, float *v,
                                     const loom_adamw_t *hp);
loom_status_t loom_cuda_sgd_update(int64_t n, float *param, const float *grad, float *buf,
                                   const loom_sgd_t *hp);

// ---- MoE router (moe_cuda.cu). *aux_host is written on the host.
loom_status_t loom_cuda_moe_router_forward(int64_t T, int64_t E, int64_t K, const float *logits,
                                           float *probs, int32_t *idx, float *weight);
loom_status_t loom_cuda_moe_aux_loss(int64_t T, int64_t E, int64_t K, const float *probs,
                                     const int32_t *idx, float coef, float *aux_host,
                                     float *dprobs);
loom_status_t loom_cuda_moe_router_backward(int64_t T, int64_t E, int64_t K, float *dlogits,
                                            const float *dweight, const float *probs,
                                            const int32_t *idx, const float *weight,
                                            const float *dprobs_extra);

// ---- MoE permutation (moe_cuda.cu), for the MoE layer on a device (comm/moe_nccl.c). pos (T * K)
// holds the row of assignment i = t * K + k in rows, or a negative value when it was dropped.
// Permute: rows[pos[i]] = x[i / K] (rows of H floats; rows not named by pos are left alone).
loom_status_t loom_cuda_moe_permute(int64_t T, int64_t K, int64_t H, const float *x,
                                    const int64_t *pos, float *rows);
// Unpermute: out[t] = sum over k = 0..K-1 in order (kept ones) of w[t, k] * rows[pos[t, k]] (w
// NULL: weight 1), each product and sum rounded in f32 without FMA, as comm/moe.c on the host.
loom_status_t loom_cuda_moe_unpermute(int64_t T, int64_t K, int64_t H, const float *rows,
                                      const int64_t *pos, const float *w, float *out);
// Its backward: dw[i] = dy[i / K] . rows[pos[i]] (summed in double, deterministic; 0 when
// dropped) and drows[pos[i]] = w[i] * dy[i / K].
loom_status_t loom_cuda_moe_unpermute_backward(int64_t T, int64_t K, int64_t H, const float *dy,
                                               const float *rows, const int64_t *pos,
                                               const float *w, float *dw, float *drows);

// ---- variable-length attention (attention_cuda.cu): FlashAttention-2 style tiled kernels,
// online softmax, no padding, bottom-right causal, LSE out. dtype LOOM_F32 or LOOM_BF16 for q,
// k, v, out, dout, dq, dk, dv (softmax and accumulation in f32); lse is always f32 (H,
// total_q). cu_q, cu_k are device copies of offsets already validated on the host; max_q and
// max_k are the longest sequences (grid sizing). Head sizes up to 256 (tensor-core kernels for
// bf16 at D = 32, 64, 128; tiled FMA kernels otherwise); D > 256 is LOOM_ERR_UNSUPPORTED. The
// backward is deterministic (no atomics: dK, dV per key tile, dQ per query tile) and sums the query
// heads of a group in a fixed order; its bf16 tensor-core path keeps Di = rowsum(dO * O) in dq's
// storage until dq is written, so dq must not overlap an input.
loom_status_t loom_cuda_attention_fwd(loom_dtype_t dtype, void *out, float *lse, const void *q,
                                      const void *k, const void *v, const int32_t *cu_q,
                                      const int32_t *cu_k, int B, int max_q, int max_k, int H,
                                      int H_kv, int D, int causal, float scale);
loom_status_t loom_cuda_attention_bwd(loom_dtype_t dtype, void *dq, void *dk, void *dv,
                                      const void *dout, const void *q, const void *k, const void *v,
                                      const void *out, const float *lse, const int32_t *cu_q,
                                      const int32_t *cu_k, int B, int max_q, int max_k, int H,
                                      int H_kv, int D, int causal, float scale);

#ifdef __cplusplus
}
#endif
#endif
