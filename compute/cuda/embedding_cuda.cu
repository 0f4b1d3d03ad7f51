/* embedding_cuda.cu — CUDA embedding gather, its scatter-add backward (rows of one id added in
 * ascending i, as the CPU kernel: same bits), the residual add and accumulate, the id check. */
#include "config.h"

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

// loom_core.h includes mpi.h; its C++ bindings would need libmpi_cxx, so leave them out.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include "cuda_ctx.h"
#include "cuda_kernels.h"
#include "error.h"
#include "loom_core.h"

namespace {

const unsigned kThreads = 256; // threads per block of the elementwise kernels

// The backward: kColThreads columns per block (grid.x), and grid.y groups of ids; thread
// (j, g) owns column j of the table rows whose id % groups == g. It scans the ids in ascending
// i and adds dout[i, j] to dtable[ids[i], j] for the ids it owns: every table element receives
// its additions in the order of i whatever the grid (so the bits are the CPU kernel's), no two
// threads write one element, and the groups spread the work over the device.
const unsigned kColThreads = 128;
const int64_t kTargetThreads = 65536; // column threads times groups to aim for
const int64_t kMaxGroups = 1024;

__global__ void embedding_forward_kernel(int64_t n, int64_t c, float *out, // (n, c)
                                         const int32_t *ids,               // (n)
                                         const float *table) {             // (V, c)
  const int64_t total = n * c, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t i = k / c, j = k - i * c;
    out[k] = table[(int64_t)ids[i] * c + j];
  }
}

__global__ void embedding_backward_kernel(int64_t n, int64_t c, float *dtable, // (V, c)
                                          const int32_t *ids,                  // (n)
                                          const float *dout) {                 // (n, c)
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int32_t groups = (int32_t)gridDim.y, g = (int32_t)blockIdx.y;
  if (j >= c) {
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    const int32_t id = ids[i]; // the same address across the warp: one broadcast load
    if (id % groups == g) {    // ids are in 0..V-1: id % groups >= 0
      dtable[(int64_t)id * c + j] += dout[i * c + j];
    }
  }
}

__global__ void residual_forward_kernel(int64_t n, float *out, // (n), may be a or b
                                        const float *a,        // (n)
                                        const float *b) {      // (n)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = a[i] + b[i];
  }
}

__global__ void accumulate_kernel(int64_t n, float *acc, // (n)
                                  const float *x) {      // (n), may be acc
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    acc[i] += x[i];
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_embedding_forward(int64_t n, int64_t c, float *out,
                                                     const int32_t *ids, const float *table) {
  if (n <= 0 || c <= 0) {
    return LOOM_OK;
  }
  embedding_forward_kernel<<<loom_cuda_blocks(n * c, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, c, out, ids, table);
  return loom_cuda_launch_check("embedding_forward_kernel");
}

extern "C" loom_status_t loom_cuda_embedding_backward(int64_t n, int64_t c, float *dtable,
                                                      const int32_t *ids, const float *dout) {
  if (n <= 0 || c <= 0) {
    return LOOM_OK;
  }
  const int64_t col_blocks = (c + kColThreads - 1) / kColThreads;
  int64_t groups = (kTargetThreads + col_blocks * kColThreads - 1) / (col_blocks * kColThreads);
  groups = groups < 1 ? 1 : (groups > kMaxGroups ? kMaxGroups : groups);
  embedding_backward_kernel<<<dim3((unsigned)col_blocks, (unsigned)groups), kColThreads, 0,
                              loom_cuda_stream()>>>(n, c, dtable, ids, dout);
  return loom_cuda_launch_check("embedding_backward_kernel");
}

extern "C" loom_status_t loom_cuda_residual_forward(int64_t n, float *out, const float *a,
                                                    const float *b) {
  if (n <= 0) {
    return LOOM_OK;
  }
  residual_forward_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, out, a, b);
  return loom_cuda_launch_check("residual_forward_kernel");
}

extern "C" loom_status_t loom_cuda_accumulate(int64_t n, float *acc, const float *x) {
  if (n <= 0) {
    return LOOM_OK;
  }
  accumulate_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, acc, x);
  return loom_cuda_launch_check("accumulate_kernel");
}
