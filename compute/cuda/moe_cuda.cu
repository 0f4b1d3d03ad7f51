/* moe_cuda.cu — CUDA MoE router (softmax, top-K with ties to the lower index and NaN last, the
 * Switch load-balancing loss in double, the backward) and the MoE layer's permute and unpermute. */
#include "config.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

// loom_core.h includes mpi.h; its C++ bindings would need libmpi_cxx, so leave them out.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include "cuda_ctx.h"
#include "cuda_kernels.h"
#include "error.h"
#include "loom_core.h"
#include "reduce_cuda.cuh"

namespace {

const unsigned kThreads = 256;    // threads per block of the elementwise and per-row kernels
const unsigned kAuxThreads = 256; // threads per block of the per-expert sums

// ---------------------------------------------------------------------------------------------
// Forward: softmax (loom_cuda_softmax_forward), then one thread per row runs the CPU kernel's
// top-K selection (moe_cpu.c's topk_row) unchanged: O(K * E) compares, no workspace, and the
// same idx and weight for the same probabilities.

// The rank of a probability: itself, or -1 for NaN, so that every row is totally ordered by
// (key descending, index ascending).
__device__ __forceinline__ float rank_key(float p) {
  return p == p ? p : -1.0f;
}

__global__ void topk_kernel(int64_t T, int64_t E, int64_t K, const float *probs, // (T, E)
                            int32_t *idx,                                        // (T, K)
                            float *weight) {                                     // (T, K)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += stride) {
    const float *p = probs + t * E;
    int32_t *ix = idx + t * K;
    float *w = weight + t * K;
    float prev = INFINITY; // above every key: nothing ranks before the first pick
    int64_t prev_j = -1;
    double sum = 0.0;
    for (int64_t k = 0; k < K; k++) {
      int64_t best = -1;
      float best_key = 0.0f;
      for (int64_t j = 0; j < E; j++) {
        float key = rank_key(p[j]);
        bool after_prev = key < prev || (key == prev && j > prev_j);
        if (after_prev && (best < 0 || key > best_key)) { // strict: ties keep the lower index
          best = j;
          best_key = key;
        }
      }
      ix[k] = (int32_t)best;
      prev = best_key;
      prev_j = best;
      sum += (double)p[best];
    }
    for (int64_t k = 0; k < K; k++) {
      // A zero sum is a row of -inf logits (probabilities all 0): no weight. NaN propagates.
      w[k] = sum == 0.0 ? 0.0f : (float)((double)p[ix[k]] / sum);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The load-balancing loss.

// One block per expert e: count[e] = the entries of idx equal to e (an integer: exact in double),
// colsum[e] = sum over t of probs[t, e] in double by a fixed tree.
__global__ void aux_columns_kernel(int64_t T, int64_t E, int64_t K, const float *probs, // (T, E)
                                   const int32_t *idx,                                  // (T, K)
                                   double *count,                                       // (E)
                                   double *colsum) {                                    // (E)
  __shared__ double shared[kWarpSize];
  for (int64_t e = blockIdx.x; e < E; e += gridDim.x) {
    double c = 0.0, s = 0.0;
    for (int64_t i = threadIdx.x; i < T * K; i += blockDim.x) {
      c += idx[i] == e ? 1.0 : 0.0;
    }
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
      s += (double)probs[t * E + e];
    }
    c = block_sum(c, shared);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
      count[e] = c;
      colsum[e] = s;
    }
  }
}

// One thread: aux = (float)(scale * sum_e count_e colsum_e / (assignments * T)) with the dot in
// expert order, and the column gradient grad[e] = (float)(scale * count_e / assignments / T).
__global__ void aux_finish_kernel(int64_t T, int64_t E, double scale, double assignments,
                                  const double *count,  // (E)
                                  const double *colsum, // (E)
                                  float *grad,          // (E)
                                  float *aux) {         // (1)
  if (blockIdx.x != 0 || threadIdx.x != 0) {
    return;
  }
  double dot = 0.0;
  for (int64_t e = 0; e < E; e++) {
    dot = __dadd_rn(dot, __dmul_rn(count[e], colsum[e])); // no FMA, as the CPU
  }
  aux[0] = (float)(scale * dot / (assignments * (double)T));
  for (int64_t e = 0; e < E; e++) {
    grad[e] = (float)(scale * count[e] / assignments / (double)T);
  }
}

// dprobs[t, e] += grad[e].
__global__ void aux_grad_kernel(int64_t T, int64_t E, const float *grad, // (E)
                                float *dprobs) {                         // (T, E)
  const int64_t n = T * E, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dprobs[i] += grad[i % E];
  }
}

// ---------------------------------------------------------------------------------------------
// Backward: one thread per row runs the CPU kernel's row (moe_cpu.c), the softmax backward with
// its eight double partial sums included, so the order of every sum is the CPU's.

__device__ void softmax_backward_row(int64_t C, const float *y, float *d) { // d: dout and din
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= C; j += 8) {
    for (int l = 0; l < 8; l++) {
      s[l] += (double)y[j + l] * (double)d[j + l]; // the product is exact: no FMA question
    }
  }
  double tail = 0.0;
  for (; j < C; j++) {
    tail += (double)y[j] * (double)d[j];
  }
  float dot = (float)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail);
  for (j = 0; j < C; j++) {
    d[j] = mul_rn(y[j], sub_rn(d[j], dot));
  }
}

__global__ void router_backward_kernel(int64_t T, int64_t E, int64_t K, float *dlogits, // (T, E)
                                       const float *dweight,                            // (T, K)
                                       const float *probs,                              // (T, E)
                                       const int32_t *idx,                              // (T, K)
                                       const float *weight,                             // (T, K)
                                       const float *dprobs_extra) { // (T, E) or NULL
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < T; t += stride) {
    const float *p = probs + t * E, *dw = dweight + t * K, *w = weight + t * K;
    const int32_t *ix = idx + t * K;
    float *d = dlogits + t * E;
    if (dprobs_extra) { // element by element: d may be dprobs_extra itself
      const float *x = dprobs_extra + t * E;
      for (int64_t j = 0; j < E; j++) {
        d[j] = x[j];
      }
    } else {
      for (int64_t j = 0; j < E; j++) {
        d[j] = 0.0f;
      }
    }
    // S as the forward sums it (kept order, double); s = sum_k dweight_k weight_k.
    double S = 0.0, s = 0.0;
    for (int64_t k = 0; k < K; k++) {
      S += (double)p[ix[k]];
      s += (double)dw[k] * (double)w[k];
    }
    if (S != 0.0) { // S = 0: a row of zero probabilities, whose softmax gradient is 0 anyway
      for (int64_t k = 0; k < K; k++) {
        d[ix[k]] += (float)(((double)dw[k] - s) / S);
      }
    }
    softmax_backward_row(E, p, d); // in place: the dot is taken before any write
  }
}

// ---------------------------------------------------------------------------------------------
// Permutation for the MoE layer's device path (comm/moe_nccl.c): the host's loops of comm/moe.c
// with the same arithmetic (f32 products and sums, no FMA; dots in double).

// rows[pos[i]] = x[i / K] for every kept assignment i (one thread per element of a row).
__global__ void permute_kernel(int64_t n, int64_t K, int64_t H, const float *x, // (T, H)
                               const int64_t *pos,                              // (T * K)
                               float *rows) {                                   // (n_send, H)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += stride) {
    const int64_t i = g / H, c = g % H, p = pos[i];
    if (p >= 0) {
      rows[p * H + c] = x[(i / K) * H + c];
    }
  }
}

// out[t, c] = sum over k in order of w[t, k] * rows[pos[t, k], c] (w NULL: 1).
__global__ void unpermute_kernel(int64_t n, int64_t K, int64_t H, const float *rows, // (rows, H)
                                 const int64_t *pos,                                 // (T * K)
                                 const float *w,                                     // (T * K)
                                 float *out) {                                       // (T, H)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < n; g += stride) {
    const int64_t t = g / H, c = g % H;
    float acc = 0.0f;
    for (int64_t k = 0; k < K; k++) {
      const int64_t p = pos[t * K + k];
      if (p >= 0) {
        acc = add_rn(acc, mul_rn(w ? w[t * K + k] : 1.0f, rows[p * H + c]));
      }
    }
    out[g] = acc;
  }
}

// One warp per assignment i: dw[i] = dy[t] . rows[pos[i]] in double (lane partial sums, then a
// fixed shuffle tree; 0 when dropped), drows[pos[i]] = w[i] * dy[t].
__global__ void unpermute_backward_kernel(int64_t n, int64_t K, int64_t H,
                                          const float *dy,    // (T, H)
                                          const float *rows,  // (rows, H)
                                          const int64_t *pos, // (T * K)
                                          const float *w,     // (T * K)
                                          float *dw,          // (T * K)
                                          float *drows) {     // (rows, H)
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / kWarpSize);
  for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kWarpSize; i < n;
       i += warps) {
    const int64_t p = pos[i];
    if (p < 0) {
      if (lane == 0) {
        dw[i] = 0.0f;
      }
      continue;
    }
    const float *g = dy + (i / K) * H, *r = rows + p * H;
    float *d = drows + p * H;
    const float wi = w[i];
    double s = 0.0;
    for (int64_t c = lane; c < H; c += kWarpSize) {
      s += (double)g[c] * (double)r[c];
      d[c] = mul_rn(wi, g[c]);
    }
    s = warp_sum(s);
    if (lane == 0) {
      dw[i] = (float)s;
    }
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_moe_router_forward(int64_t T, int64_t E, int64_t K,
                                                      const float *logits, float *probs,
                                                      int32_t *idx, float *weight) {
  loom_status_t status = LOOM_OK;
  if (T <= 0) {
    return LOOM_OK;
  }
  LOOM_CHECK(loom_cuda_softmax_forward(T, E, logits, probs));
  topk_kernel<<<loom_cuda_blocks(T, kThreads), kThreads, 0, loom_cuda_stream()>>>(T, E, K, probs,
                                                                                  idx, weight);
  LOOM_CHECK(loom_cuda_launch_check("moe topk_kernel"));
fail:
  return status;
}

extern "C" loom_status_t loom_cuda_moe_aux_loss(int64_t T, int64_t E, int64_t K, const float *probs,
                                                const int32_t *idx, float coef, float *aux_host,
                                                float *dprobs) {
  loom_status_t status = LOOM_OK;
  cudaStream_t stream = loom_cuda_stream();
  const double assignments = (double)T * (double)K, scale = (double)coef * (double)E;
  const int64_t max_blocks = 1 << 16;
  const unsigned blocks = (unsigned)(E < max_blocks ? E : max_blocks);
  void *ws = NULL; // count (E doubles), colsum (E doubles), grad (E floats), aux (1 float)
  double *count = NULL, *colsum = NULL;
  float *grad = NULL, *aux = NULL;

  if (T <= 0 || E <= 0) {
    *aux_host = 0.0f;
    return LOOM_OK;
  }
  LOOM_CHECK(
      loom_cuda_scratch(sizeof(double) * 2 * (size_t)E + sizeof(float) * ((size_t)E + 1), &ws));
  count = (double *)ws;
  colsum = count + E;
  grad = (float *)(colsum + E);
  aux = grad + E;
  aux_columns_kernel<<<blocks, kAuxThreads, 0, stream>>>(T, E, K, probs, idx, count, colsum);
  LOOM_CHECK(loom_cuda_launch_check("moe aux_columns_kernel"));
  aux_finish_kernel<<<1, 1, 0, stream>>>(T, E, scale, assignments, count, colsum, grad, aux);
  LOOM_CHECK(loom_cuda_launch_check("moe aux_finish_kernel"));
  if (dprobs) {
    aux_grad_kernel<<<loom_cuda_blocks(T * E, kThreads), kThreads, 0, stream>>>(T, E, grad, dprobs);
    LOOM_CHECK(loom_cuda_launch_check("moe aux_grad_kernel"));
  }
  LOOM_CHECK(loom_cuda_to_host(aux_host, aux, sizeof(float)));

fail:
  if (ws) {
    loom_cuda_scratch_free(ws);
  }
  return status;
}

extern "C" loom_status_t loom_cuda_moe_router_backward(int64_t T, int64_t E, int64_t K,
                                                       float *dlogits, const float *dweight,
                                                       const float *probs, const int32_t *idx,
                                                       const float *weight,
                                                       const float *dprobs_extra) {
  if (T <= 0 || E <= 0) {
    return LOOM_OK;
  }
  router_backward_kernel<<<loom_cuda_blocks(T, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      T, E, K, dlogits, dweight, probs, idx, weight, dprobs_extra);
  return loom_cuda_launch_check("moe router_backward_kernel");
}

extern "C" loom_status_t loom_cuda_moe_permute(int64_t T, int64_t K, int64_t H, const float *x,
                                               const int64_t *pos, float *rows) {
  const int64_t n = T * K * H;
  if (n <= 0) {
    return LOOM_OK;
  }
  permute_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, K, H, x,
                                                                                     pos, rows);
  return loom_cuda_launch_check("moe permute_kernel");
}

extern "C" loom_status_t loom_cuda_moe_unpermute(int64_t T, int64_t K, int64_t H, const float *rows,
                                                 const int64_t *pos, const float *w, float *out) {
  const int64_t n = T * H;
  if (n <= 0) {
    return LOOM_OK;
  }
  unpermute_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, K, H, rows, pos, w, out);
  return loom_cuda_launch_check("moe unpermute_kernel");
}

extern "C" loom_status_t loom_cuda_moe_unpermute_backward(int64_t T, int64_t K, int64_t H,
                                                          const float *dy, const float *rows,
                                                          const int64_t *pos, const float *w,
                                                          float *dw, float *drows) {
  const int64_t n = T * K;
  if (n <= 0) {
    return LOOM_OK;
  }
  const int64_t threads = n * kWarpSize; // one warp per assignment
  unpermute_backward_kernel<<<loom_cuda_blocks(threads, kThreads), kThreads, 0,
                              loom_cuda_stream()>>>(n, K, H, dy, rows, pos, w, dw, drows);
  return loom_cuda_launch_check("moe unpermute_backward_kernel");
}
