/* layernorm_cuda.cu — CUDA layer normalisation: one block per row (two-pass statistics in double
 * as the CPU kernel), and a backward whose dweight/dbias sum row chunks in a fixed order. */
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

// The parameter gradients: kColThreads columns per block, chunk_rows rows per chunk (kChunkRows,
// more when N needs more than kMaxChunks chunks). A thread sums its column over its chunk's rows
// in order; a second kernel adds the chunk partials in chunk order. The order of the additions
// depends on N only, so the result is deterministic.
const unsigned kColThreads = 128;
const int64_t kChunkRows = 64;
const int64_t kMaxChunks = 65535; // gridDim.y limit

// ---------------------------------------------------------------------------------------------
// Forward: one block per row; every thread takes the columns threadIdx.x + k * blockDim.x.

__global__ void layernorm_forward_kernel(int64_t N, int64_t C, float eps, const float *in, // (N, C)
                                         const float *weight,                              // (C)
                                         const float *bias,                                // (C)
                                         float *out,    // (N, C), may be in
                                         float *mean,   // (N)
                                         float *rstd) { // (N)
  __shared__ double shared[kWarpSize];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float *x = in + r * C;
    float *y = out + r * C;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      s += (double)x[j];
    }
    const double mu = block_sum(s, shared) / (double)C;
    // Second pass around the mean: no cancellation between E[x^2] and E[x]^2.
    s = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      double d = (double)x[j] - mu;
      s += d * d;
    }
    const double var = block_sum(s, shared) / (double)C;
    const double rs = 1.0 / sqrt(var + (double)eps);
    // Each thread writes only the columns it read: out may be in.
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      y[j] = add_rn(mul_rn((float)(((double)x[j] - mu) * rs), weight[j]), bias[j]);
    }
    if (threadIdx.x == 0) {
      mean[r] = (float)mu;
      rstd[r] = (float)rs;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

// The saved mean m is a float, off from the forward's double mean by up to half an ulp of a
// large offset (rows of 1e4 + 1e-2 noise: 5% of the spread). x - m is exact in float near m, so
// delta = sum(x - m) / C in double recovers the forward's mean as m + delta, and
// xhat = ((x - m) - delta) * rstd (delta rounded once to float), as in the CPU backward.

// delta[r] = (float)(sum(x - m) / C) per row, for the parameter gradients' kernel.
__global__ void layernorm_delta_kernel(int64_t N, int64_t C, const float *in, // (N, C)
                                       const float *mean,                     // (N)
                                       float *delta) {                        // (N)
  __shared__ double shared[kWarpSize];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float *x = in + r * C;
    const float m = mean[r];
    double sx = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      sx += (double)sub_rn(x[j], m);
    }
    const double d = block_sum(sx, shared) / (double)C;
    if (threadIdx.x == 0) {
      delta[r] = (float)d;
    }
  }
}

// din per row: din = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight, with
// mean(g * xhat) = rstd * (mean(g * (x - m)) - delta * mean(g)).
__global__ void layernorm_din_kernel(int64_t N, int64_t C, const float *dout, // (N, C)
                                     const float *in,                         // (N, C)
                                     const float *weight,                     // (C)
                                     const float *mean,                       // (N)
                                     const float *rstd,                       // (N)
                                     float *din) { // (N, C), may be dout or in
  __shared__ double shared[kWarpSize];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float *x = in + r * C, *dy = dout + r * C;
    float *dx = din + r * C;
    const float m = mean[r], rs = rstd[r];
    double sx = 0.0, sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      float g = mul_rn(dy[j], weight[j]);
      float xm = sub_rn(x[j], m);
      sx += (double)xm;
      sg += (double)g;
      sgx += (double)g * (double)xm;
    }
    const double delta = block_sum(sx, shared) / (double)C;
    const double gm = block_sum(sg, shared) / (double)C;
    const double gxm = block_sum(sgx, shared) / (double)C;
    const float g_mean = (float)gm;
    const float gn_mean = (float)((double)rs * (gxm - delta * gm));
    const float d = (float)delta;
    // Each thread writes only the columns it read: din may be dout or in.
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      float nrm = mul_rn(sub_rn(sub_rn(x[j], m), d), rs);
      dx[j] = mul_rn(rs, sub_rn(sub_rn(mul_rn(dy[j], weight[j]), g_mean), mul_rn(nrm, gn_mean)));
    }
  }
}

// Chunk partials of the parameter gradients: grid (column blocks, chunks). Thread (j, chunk)
// sums dout[r, j] and norm[r, j] * dout[r, j] over the chunk's rows r in ascending order.
__global__ void layernorm_dparams_partial_kernel(int64_t N, int64_t C, int64_t chunk_rows,
                                                 const float *dout,  // (N, C)
                                                 const float *in,    // (N, C)
                                                 const float *mean,  // (N)
                                                 const float *rstd,  // (N)
                                                 const float *delta, // (N)
                                                 float *part_w,      // (chunks, C)
                                                 float *part_b) {    // (chunks, C)
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (j >= C) {
    return;
  }
  const int64_t r0 = chunk * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < N ? r0 + chunk_rows : N;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; r++) {
    float dy = dout[r * C + j];
    float nrm = mul_rn(sub_rn(sub_rn(in[r * C + j], mean[r]), delta[r]), rstd[r]);
    sb = add_rn(sb, dy);
    sw = add_rn(sw, mul_rn(nrm, dy));
  }
  part_w[chunk * C + j] = sw;
  part_b[chunk * C + j] = sb;
}

// dweight[j] += the chunk partials of column j in chunk order; dbias likewise.
__global__ void layernorm_dparams_finish_kernel(int64_t C, int64_t chunks,
                                                const float *part_w, // (chunks, C)
                                                const float *part_b, // (chunks, C)
                                                float *dweight,      // (C)
                                                float *dbias) {      // (C)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < C; j += stride) {
    float sw = 0.0f, sb = 0.0f;
    for (int64_t k = 0; k < chunks; k++) {
      sw = add_rn(sw, part_w[k * C + j]);
      sb = add_rn(sb, part_b[k * C + j]);
    }
    dweight[j] = add_rn(dweight[j], sw);
    dbias[j] = add_rn(dbias[j], sb);
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_layernorm_forward(int64_t N, int64_t C, float eps,
                                                     const float *in, const float *weight,
                                                     const float *bias, float *out, float *mean,
                                                     float *rstd) {
  if (N <= 0 || C <= 0) {
    return LOOM_OK;
  }
  layernorm_forward_kernel<<<row_blocks(N), row_threads(C), 0, loom_cuda_stream()>>>(
      N, C, eps, in, weight, bias, out, mean, rstd);
  return loom_cuda_launch_check("layernorm_forward_kernel");
}

extern "C" loom_status_t loom_cuda_layernorm_backward(int64_t N, int64_t C, const float *dout,
                                                      const float *in, const float *weight,
                                                      const float *mean, const float *rstd,
                                                      float *din, float *dweight, float *dbias) {
  loom_status_t status = LOOM_OK;
  cudaStream_t stream = loom_cuda_stream();
  const int64_t chunk_rows =
      N <= kChunkRows * kMaxChunks ? kChunkRows : (N + kMaxChunks - 1) / kMaxChunks;
  const int64_t chunks = (N + chunk_rows - 1) / chunk_rows;
  const unsigned col_blocks = (unsigned)((C + kColThreads - 1) / kColThreads);
  float *ws = NULL; // (2 chunks C + N): the dweight partials, the dbias partials, each row's delta
  float *delta = NULL;

  if (N <= 0 || C <= 0) {
    return LOOM_OK;
  }
  LOOM_CHECK(loom_cuda_scratch(sizeof(float) * (2 * (size_t)chunks * (size_t)C + (size_t)N),
                               (void **)&ws));
  delta = ws + 2 * chunks * C;
  layernorm_delta_kernel<<<row_blocks(N), row_threads(C), 0, stream>>>(N, C, in, mean, delta);
  LOOM_CHECK(loom_cuda_launch_check("layernorm_delta_kernel"));
  // The parameter gradients first, while dout and in are intact (din may alias either).
  layernorm_dparams_partial_kernel<<<dim3(col_blocks, (unsigned)chunks), kColThreads, 0, stream>>>(
      N, C, chunk_rows, dout, in, mean, rstd, delta, ws, ws + chunks * C);
  LOOM_CHECK(loom_cuda_launch_check("layernorm_dparams_partial_kernel"));
  layernorm_dparams_finish_kernel<<<loom_cuda_blocks(C, kColThreads), kColThreads, 0, stream>>>(
      C, chunks, ws, ws + chunks * C, dweight, dbias);
  LOOM_CHECK(loom_cuda_launch_check("layernorm_dparams_finish_kernel"));
  layernorm_din_kernel<<<row_blocks(N), row_threads(C), 0, stream>>>(N, C, dout, in, weight, mean,
                                                                     rstd, din);
  LOOM_CHECK(loom_cuda_launch_check("layernorm_din_kernel"));

fail:
  if (ws) {
    loom_cuda_scratch_free(ws); // stream-ordered: reused only by work queued after this
  }
  return status;
}
