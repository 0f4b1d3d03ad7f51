/* util_cuda.cu — CUDA vector utilities: scale, axpy (no FMA: the CPU kernel's bits), the sum of
 * squares in double by a fixed reduction tree, and f32 <-> bf16 as runtime/half.c converts. */
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
#include "reduce_cuda.cuh"

namespace {

const unsigned kThreads = 256; // threads per block of the elementwise kernels

__global__ void scale_kernel(int64_t n, float alpha, float *x) { // x: (n)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    x[i] = mul_rn(x[i], alpha);
  }
}

__global__ void axpy_kernel(int64_t n, float alpha, const float *x, // (n)
                            float *y) {                             // (n)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = add_rn(y[i], mul_rn(alpha, x[i]));
  }
}

// x[i]^2 in double (exact: a float squared fits in a double's mantissa).
struct square_term {
  const float *x; // (n)
  __device__ double operator()(int64_t i) const {
    double xi = (double)x[i];
    return xi * xi;
  }
};

// runtime/half.c's loom_f32_to_bf16 and loom_bf16_to_f32, bit for bit.
__device__ __forceinline__ uint16_t f32_to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: truncate and force the quiet bit; rounding could carry a NaN into Inf.
    return (uint16_t)((u >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 dropped bits; past the largest bf16 carries into Inf.
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    u |= 0x00400000u; // NaN comes out quiet
  }
  return __uint_as_float(u);
}

__global__ void f32_to_bf16_kernel(int64_t n, const float *src, // (n)
                                   uint16_t *dst) {             // (n)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = f32_to_bf16(src[i]);
  }
}

__global__ void bf16_to_f32_kernel(int64_t n, const uint16_t *src, // (n)
                                   float *dst) {                   // (n)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = bf16_to_f32(src[i]);
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_scale(int64_t n, float alpha, float *x) {
  if (n <= 0) {
    return LOOM_OK;
  }
  scale_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, alpha, x);
  return loom_cuda_launch_check("scale_kernel");
}

extern "C" loom_status_t loom_cuda_axpy(int64_t n, float alpha, const float *x, float *y) {
  if (n <= 0) {
    return LOOM_OK;
  }
  axpy_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, alpha, x, y);
  return loom_cuda_launch_check("axpy_kernel");
}

extern "C" loom_status_t loom_cuda_sumsq(int64_t n, const float *x, double *sum_host) {
  square_term term = {x};
  return device_sum(n, term, "sumsq", sum_host);
}

extern "C" loom_status_t loom_cuda_f32_to_bf16(int64_t n, const float *src, uint16_t *dst) {
  if (n <= 0) {
    return LOOM_OK;
  }
  f32_to_bf16_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, src,
                                                                                         dst);
  return loom_cuda_launch_check("f32_to_bf16_kernel");
}

extern "C" loom_status_t loom_cuda_bf16_to_f32(int64_t n, const uint16_t *src, float *dst) {
  if (n <= 0) {
    return LOOM_OK;
  }
  bf16_to_f32_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, src,
                                                                                         dst);
  return loom_cuda_launch_check("bf16_to_f32_kernel");
}
