/* loom_compute.h — training ops on tensors: the device of the tensors picks the backend (CPU
 * now; CUDA in a later release). Include loom.h rather than this file. */
#ifndef LOOM_COMPUTE_H
#define LOOM_COMPUTE_H

#include <stdint.h>

#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Conventions for every op below:
// - Tensors are contiguous, row-major, f32 unless stated (index tensors are i32). Shapes are in
//   the comments: (N, C) means ndim 2 with shape[0] = N, shape[1] = C. A leading batch may be
//   flattened: an (B, T, C) tensor is accepted wherever (N, C) is, with N = B*T.
// - All tensors of one call live on the same device; that device picks the backend. A CUDA
//   tensor returns LOOM_ERR_UNSUPPORTED until the CUDA backend lands.
// - Forward outputs and gradients of inputs ("din") are overwritten; gradients of parameters
//   ("dweight", "dbias", "dtable") are accumulated (+=) so that micro-batches can add up.
// - Bad arguments return LOOM_ERR_INVALID_ARG and loom_last_error(NULL) names the argument, its
//   shape and what was expected; nothing is written in that case.
// - CPU kernels run on this rank's BLAS threads (set by loom_init); nothing spawns its own pool.

// ---- linear algebra ---------------------------------------------------------------------------

// c = alpha * op(a) @ op(b) + beta * c (+ bias on every row). op(x) is x or x^T.
// a: (M, K), or (K, M) with trans_a; b: (K, N), or (N, K) with trans_b; c: (M, N);
// bias: (N) or NULL.
LOOM_API loom_status_t loom_gemm(loom_tensor_t *c, const loom_tensor_t *a, int trans_a,
                                 const loom_tensor_t *b, int trans_b, const loom_tensor_t *bias,
                                 float alpha, float beta);
// On the host, loom_gemm runs a product with an untransposed a (and alpha != 0) on loom's own
// AVX2 kernel where that was measured faster than the BLAS (OpenBLAS on its AVX2 kernels, one
// thread on every rank, 512 rows or more; LOOM_GEMM in the README's tunables table), and on the
// BLAS otherwise. The bits of a product depend on which one ran, never on the run.

// c = op(a) @ op(b) + residual (+ bias on every row): the residual add of a transformer block
// (x + proj(y)) in one call. The bits are those of copying residual into c and then loom_gemm
// with alpha 1 and beta 1; where loom's kernel runs the product (above) the residual is read in
// its epilogue, one pass over c instead of a copy and a pass. residual: (M, N), c's shape; it
// may be c itself (then this is loom_gemm with alpha 1, beta 1) or overlap a or b, but not
// overlap c in part. Shapes and the rest as loom_gemm.
LOOM_API loom_status_t loom_gemm_residual(loom_tensor_t *c, const loom_tensor_t *a, int trans_a,
                                          const loom_tensor_t *b, int trans_b,
                                          const loom_tensor_t *bias, const loom_tensor_t *residual);

// This rank's f32 GEMM rate on device, in FLOP/s: n^3 products (n = 1024 on the host, 4096 on
// CUDA with TF32 off), the best of reps (1..1000; 10 is steady to ~1% on a quiet host) after one
// untimed warm-up. On the host both kernels are timed, alternately, and `best` is the faster: the
// denominator of MFU in the example trainers. At reps 10 it takes about a second on one core;
// runs on this rank's BLAS threads.
typedef struct loom_gemm_rate {
  double best; // max(blas, loom)
  double blas; // the BLAS's sgemm (host) or cuBLAS (CUDA)
  double loom; // loom's own kernel where loom_gemm would use it for this shape, else 0
} loom_gemm_rate_t;
LOOM_API loom_status_t loom_gemm_rate(int device, int reps, loom_gemm_rate_t *rate);

// dbias (N) += column sums of dout (M, N): the bias gradient of a linear layer.
LOOM_API loom_status_t loom_bias_backward(loom_tensor_t *dbias, const loom_tensor_t *dout);

// ---- activations and normalisation --------------------------------------------------------------

// GELU, tanh approximation (as in GPT-2). out, in: any shape, same numel.
LOOM_API loom_status_t loom_gelu_forward(loom_tensor_t *out, const loom_tensor_t *in);
// din = dout * gelu'(in).
LOOM_API loom_status_t loom_gelu_backward(loom_tensor_t *din, const loom_tensor_t *in,
                                          const loom_tensor_t *dout);
// The pair that saves gelu' in the forward, for a backward without the exp and the division:
// out = gelu(in) and deriv = gelu'(in), bit for bit those of loom_gelu_forward and of the
// derivative in loom_gelu_backward; deriv may be in itself (in-place: the pre-activation is
// replaced by the derivative, no extra memory). Any shape, same numel; out overlaps neither.
LOOM_API loom_status_t loom_gelu_forward_deriv(loom_tensor_t *out, loom_tensor_t *deriv,
                                               const loom_tensor_t *in);
// din = dout * deriv; with dbias (not NULL), dbias (N) += the column sums of din viewed as
// (M, N), N its last extent: loom_bias_backward fused in, with its bits on the CPU. din may be
// deriv or dout.
LOOM_API loom_status_t loom_gelu_backward_deriv(loom_tensor_t *din, loom_tensor_t *dbias,
                                                const loom_tensor_t *deriv,
                                                const loom_tensor_t *dout);

// out = (in - mean) * rstd * weight + bias over the last dimension.
// in, out: (N, C); weight, bias: (C); mean, rstd: (N) saved for the backward.
LOOM_API loom_status_t loom_layernorm_forward(loom_tensor_t *out, loom_tensor_t *mean,
                                              loom_tensor_t *rstd, const loom_tensor_t *in,
                                              const loom_tensor_t *weight,
                                              const loom_tensor_t *bias, float eps);
// din (N, C) overwritten; dweight, dbias (C) accumulated.
LOOM_API loom_status_t loom_layernorm_backward(loom_tensor_t *din, loom_tensor_t *dweight,
                                               loom_tensor_t *dbias, const loom_tensor_t *dout,
                                               const loom_tensor_t *in, const loom_tensor_t *weight,
                                               const loom_tensor_t *mean,
                                               const loom_tensor_t *rstd);

// Row softmax over the last dimension. in, out: (N, C). A row of -inf gives zeros; a NaN in a row
// gives NaN everywhere in it. out may be in itself.
LOOM_API loom_status_t loom_softmax_forward(loom_tensor_t *out, const loom_tensor_t *in);
// din = out * (dout - sum(dout * out)) per row.
LOOM_API loom_status_t loom_softmax_backward(loom_tensor_t *din, const loom_tensor_t *out,
                                             const loom_tensor_t *dout);

// ---- loss, embedding, residual ------------------------------------------------------------------

// losses (N) = -log softmax(logits (N, V))[target]; rows whose target (N, i32) equals
// ignore_index get loss 0. *mean_loss (may be NULL) is the mean over the other rows (0 if none).
// A target outside 0..V-1 that is not ignore_index is LOOM_ERR_INVALID_ARG.
LOOM_API loom_status_t loom_cross_entropy_forward(loom_tensor_t *losses, float *mean_loss,
                                                  const loom_tensor_t *logits,
                                                  const loom_tensor_t *targets,
                                                  int32_t ignore_index);
// dlogits (N, V) = dloss * (softmax(logits) - onehot(target)) / n_valid for the gradient of the
// mean loss; ignored rows get 0. dlogits may be logits itself (computed in place), but not
// overlap it in part.
LOOM_API loom_status_t loom_cross_entropy_backward(loom_tensor_t *dlogits,
                                                   const loom_tensor_t *logits,
                                                   const loom_tensor_t *targets,
                                                   int32_t ignore_index, float dloss);

// out (N, C) = table (V, C)[ids (N, i32)]. An id outside 0..V-1 is LOOM_ERR_INVALID_ARG.
LOOM_API loom_status_t loom_embedding_forward(loom_tensor_t *out, const loom_tensor_t *ids,
                                              const loom_tensor_t *table);
// dtable (V, C) += scatter of dout (N, C) by ids, in row order (deterministic). The output of
// either op overlaps none of its inputs.
LOOM_API loom_status_t loom_embedding_backward(loom_tensor_t *dtable, const loom_tensor_t *ids,
                                               const loom_tensor_t *dout);

// out = a + b (same shape; out may be a or b itself, but not overlap either in part).
LOOM_API loom_status_t loom_residual_forward(loom_tensor_t *out, const loom_tensor_t *a,
                                             const loom_tensor_t *b);
// da += dout; db += dout (the residual stream accumulates gradients). da or db may be NULL;
// neither may share memory with dout.
LOOM_API loom_status_t loom_residual_backward(loom_tensor_t *da, loom_tensor_t *db,
                                              const loom_tensor_t *dout);

// ---- mixture of experts: the router ------------------------------------------------------------

// Router forward for T tokens over E experts, keeping K per token. logits (T, E) f32 in;
// probs (T, E) f32 = softmax(logits) per row; idx (T, K) LOOM_I32 = the K experts of largest
// probability per row, in descending order of probability (ties: the lower expert index first);
// weight (T, K) f32 = probs at idx renormalised to sum to 1 per row. 1 <= K <= E. T may be 0.
// No output may overlap logits or another output.
LOOM_API loom_status_t loom_moe_router_forward(loom_tensor_t *probs, loom_tensor_t *idx,
                                               loom_tensor_t *weight, const loom_tensor_t *logits);
// The load-balancing loss of Switch Transformer: *aux = coef * E * sum_e f_e * P_e, where f_e is
// the fraction of the T*K assignments in idx that go to expert e and P_e the mean over the T rows
// of probs[:, e] (0 when T is 0). dprobs (T, E), when non-NULL, += the gradient of *aux with
// respect to probs with f held constant (coef * E * f_e / T in column e). Every idx in 0..E-1;
// coef finite; sums in double.
LOOM_API loom_status_t loom_moe_aux_loss(float *aux, loom_tensor_t *dprobs,
                                         const loom_tensor_t *probs, const loom_tensor_t *idx,
                                         float coef);
// Router backward. dweight (T, K): the loss gradient with respect to weight; dprobs_extra (T, E)
// or NULL: a further gradient on probs (the aux loss's, from loom_moe_aux_loss). dlogits (T, E)
// is overwritten with the gradient through the renormalisation (weight_k = p_k / S, S the sum of
// the K kept probabilities: dp_j = (dweight_j - sum_k dweight_k weight_k) / S for the kept j, 0
// for the others), plus dprobs_extra, then through the softmax (dlogits = p * (dp - sum(dp * p))).
// dlogits may be dprobs_extra itself (in place) but must not overlap any other input.
LOOM_API loom_status_t loom_moe_router_backward(
    loom_tensor_t *dlogits, const loom_tensor_t *dweight, const loom_tensor_t *probs,
    const loom_tensor_t *idx, const loom_tensor_t *weight, const loom_tensor_t *dprobs_extra);

// ---- utilities ----------------------------------------------------------------------------------

// x *= alpha.
LOOM_API loom_status_t loom_scale(loom_tensor_t *x, float alpha);
// y += alpha * x (same numel; x and y must not overlap).
LOOM_API loom_status_t loom_axpy(loom_tensor_t *y, float alpha, const loom_tensor_t *x);
// *out = sqrt(sum x^2), accumulated in double.
LOOM_API loom_status_t loom_norm2(const loom_tensor_t *x, double *out);
// A 64-bit checksum of the tensor's bytes (FNV-1a): equal bits give equal sums, on any rank.
LOOM_API loom_status_t loom_checksum(const loom_tensor_t *x, uint64_t *out);

// ---- optimizers ---------------------------------------------------------------------------------

// Scale every gradient by min(1, max_norm / (global_norm + 1e-6)) where global_norm is the L2
// norm over all n tensors; *global_norm (may be NULL) receives the norm before clipping.
// max_norm <= 0 only measures. A non-finite norm is reported and nothing is scaled.
LOOM_API loom_status_t loom_clip_grad_norm(loom_tensor_t *const *grads, int n, float max_norm,
                                           float *global_norm);

typedef struct loom_adamw {
  float lr;           // learning rate
  float beta1, beta2; // moment decay (0.9, 0.999 typical)
  float eps;          // denominator guard (1e-8 typical)
  float weight_decay; // decoupled: param -= lr * weight_decay * param
  int step;           // 1 for the first update: bias correction uses it
} loom_adamw_t;

// One AdamW update of param from grad; m and v (same shape, zero at the start) are the moments.
// The formula and its order are PyTorch's torch.optim.AdamW. No two buffers may overlap.
LOOM_API loom_status_t loom_adamw_update(loom_tensor_t *param, const loom_tensor_t *grad,
                                         loom_tensor_t *m, loom_tensor_t *v,
                                         const loom_adamw_t *hp);

typedef struct loom_sgd {
  float lr;
  float momentum;     // 0 disables the buffer
  float weight_decay; // L2: grad += weight_decay * param
  int nesterov;       // 1 for Nesterov momentum
} loom_sgd_t;

// One SGD update as torch.optim.SGD (dampening 0); buf (same shape, zero at the start) is the
// momentum buffer (NULL if momentum 0). No two buffers may overlap.
LOOM_API loom_status_t loom_sgd_update(loom_tensor_t *param, const loom_tensor_t *grad,
                                       loom_tensor_t *buf, const loom_sgd_t *hp);

// ---- variable-length attention ------------------------------------------------------------------

// Core attention over packed sequences, padding-free (ByteTransformer / FlashAttention varlen):
// q: (total_q, H, D); k, v: (total_k, H_kv, D) with H % H_kv == 0 (grouped-query attention:
// query head h reads key/value head h / (H / H_kv)); cu_seqlens_q, cu_seqlens_k: (B + 1) i32
// non-decreasing offsets starting at 0 and ending at total_q / total_k. Sequence b has
// Lq = cu_q[b+1] - cu_q[b] queries and Lk keys. causal: query i of b sees keys j <= i + Lk - Lq
// (bottom-right aligned: a query shard attending to its key prefix). scale <= 0 means 1/sqrt(D).
// out: (total_q, H, D); lse: (H, total_q) f32 log-sum-exp of the scaled scores of each row
// (-inf and a zero output for a row that sees no key). out and lse overlap neither the inputs
// nor each other (LOOM_ERR_INVALID_ARG: no in-place attention).
LOOM_API loom_status_t loom_attention_forward(loom_tensor_t *out, loom_tensor_t *lse,
                                              const loom_tensor_t *q, const loom_tensor_t *k,
                                              const loom_tensor_t *v,
                                              const loom_tensor_t *cu_seqlens_q,
                                              const loom_tensor_t *cu_seqlens_k, int causal,
                                              float scale);
// dq (total_q, H, D), dk and dv (total_k, H_kv, D) overwritten, from dout, and the forward's
// out and lse. The outputs must overlap neither the inputs (cu_seqlens included) nor each other
// (LOOM_ERR_INVALID_ARG; on a device, dq's storage holds intermediate sums until its rows are
// written).
LOOM_API loom_status_t loom_attention_backward(
    loom_tensor_t *dq, loom_tensor_t *dk, loom_tensor_t *dv, const loom_tensor_t *dout,
    const loom_tensor_t *q, const loom_tensor_t *k, const loom_tensor_t *v,
    const loom_tensor_t *out, const loom_tensor_t *lse, const loom_tensor_t *cu_seqlens_q,
    const loom_tensor_t *cu_seqlens_k, int causal, float scale);

// ---- padded <-> packed (varlen)
// ------------------------------------------------------------------

// cu_seqlens (B + 1, i32) = prefix sum of lengths (B, i32); each length must be in 0..max_len
// (max_len <= 0: no upper bound). *total (may be NULL) receives cu_seqlens[B].
LOOM_API loom_status_t loom_varlen_offsets(loom_tensor_t *cu_seqlens, const loom_tensor_t *lengths,
                                           int max_len, int32_t *total);
// packed (total, ...) = the first lengths[b] rows of each padded[b] (padded: (B, T, ...), any
// dtype, same trailing shape). packed and padded do not overlap (no packing in place).
LOOM_API loom_status_t loom_varlen_pack(loom_tensor_t *packed, const loom_tensor_t *padded,
                                        const loom_tensor_t *cu_seqlens);
// padded (B, T, ...) = packed rows back in place; padding rows are set to zero. padded and packed
// do not overlap.
LOOM_API loom_status_t loom_varlen_unpack(loom_tensor_t *padded, const loom_tensor_t *packed,
                                          const loom_tensor_t *cu_seqlens);
// row_map (total, i32): packed row i came from padded row b * T + t.
LOOM_API loom_status_t loom_varlen_row_map(loom_tensor_t *row_map, const loom_tensor_t *cu_seqlens,
                                           int T);

#ifdef __cplusplus
}
#endif
#endif
