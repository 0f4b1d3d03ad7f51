/* loss_cuda.cu — CUDA cross-entropy: one block per row (maximum, then sum of exponentials in
 * double), the loss sum and the valid count by deterministic fixed-tree sums copied to the host. */
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

// ---------------------------------------------------------------------------------------------
// Terms of the fixed-tree sums (reduce_cuda.cuh).

// The loss of row i as the CPU adds it, (double) of the float loss; ignored rows hold 0.
struct loss_term {
  const float *losses; // (n)
  __device__ double operator()(int64_t i) const {
    return (double)losses[i];
  }
};

// ---------------------------------------------------------------------------------------------
// One row: its maximum and sum(exp(x - max)), reduced over the block (every thread gets both).
// Every thread reads only its columns threadIdx.x + k * blockDim.x, and both reductions end in a
// barrier, so a row may be overwritten after this returns (in-place backward).

struct row_stats {
  float mx;
  double sum;
};

__device__ row_stats block_row_stats(int64_t v, const float *x, float *shared_max,
                                     double *shared_sum) {
  row_stats st;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    m = max_keep(m, x[j]);
  }
  st.mx = block_max(m, shared_max);
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    s += (double)expf(x[j] - st.mx);
  }
  st.sum = block_sum(s, shared_sum);
  return st;
}

__global__ void cross_entropy_forward_kernel(int64_t n, int64_t v, const float *logits, // (n, v)
                                             const int32_t *targets,                    // (n)
                                             int32_t ignore_index, float *losses) {     // (n)
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int32_t t = targets[i];
    if (t == ignore_index) { // the same in every thread: the block skips the row
      if (threadIdx.x == 0) {
        losses[i] = 0.0f;
      }
      continue;
    }
    const float *x = logits + i * v;
    row_stats st = block_row_stats(v, x, shared_max, shared_sum);
    if (threadIdx.x == 0) {
      // loss = log(sum exp(x - mx)) - (x[t] - mx); sum >= 1.
      losses[i] = (float)(log(st.sum) - (double)(x[t] - st.mx));
    }
  }
}

__global__ void cross_entropy_backward_kernel(int64_t n, int64_t v, float *dlogits, // (n, v)
                                              const float *logits,    // (n, v), may be dlogits
                                              const int32_t *targets, // (n)
                                              int32_t ignore_index, float scale) {
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    float *d = dlogits + i * v;
    const int32_t t = targets[i];
    if (t == ignore_index) {
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        d[j] = 0.0f;
      }
      continue;
    }
    const float *x = logits + i * v;
    row_stats st = block_row_stats(v, x, shared_max, shared_sum);
    const float k = (float)((double)scale / st.sum);
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
      float g = mul_rn(k, expf(x[j] - st.mx));
      d[j] = j == t ? sub_rn(g, scale) : g; // the CPU's d[t] -= scale after the row
    }
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_cross_entropy_forward(int64_t n, int64_t v, const float *logits,
                                                         const int32_t *targets,
                                                         int32_t ignore_index, float *losses,
                                                         double *sum_host) {
  loom_status_t status = LOOM_OK;
  loss_term term = {losses};
  if (n <= 0) {
    *sum_host = 0.0;
    return LOOM_OK;
  }
  cross_entropy_forward_kernel<<<row_blocks(n), row_threads(v), 0, loom_cuda_stream()>>>(
      n, v, logits, targets, ignore_index, losses);
  LOOM_CHECK(loom_cuda_launch_check("cross_entropy_forward_kernel"));
  LOOM_CHECK(device_sum(n, term, "cross_entropy_forward (loss sum)", sum_host));
fail:
  return status;
}

extern "C" loom_status_t loom_cuda_cross_entropy_backward(int64_t n, int64_t v, float *dlogits,
                                                          const float *logits,
                                                          const int32_t *targets,
                                                          int32_t ignore_index, float scale) {
  if (n <= 0 || v <= 0) {
    return LOOM_OK; // no classes: nothing to write (every row is then ignored)
  }
  cross_entropy_backward_kernel<<<row_blocks(n), row_threads(v), 0, loom_cuda_stream()>>>(
      n, v, dlogits, logits, targets, ignore_index, scale);
  return loom_cuda_launch_check("cross_entropy_backward_kernel");
}
