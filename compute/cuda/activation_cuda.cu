/* activation_cuda.cu — CUDA GELU (the CPU kernel's exp polynomial, operation for operation),
 * fused bias + GELU, and row softmax forward and backward with one block per row. */
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

const unsigned kThreads = 256; // threads per block of the elementwise kernels

// ---------------------------------------------------------------------------------------------
// GELU: compute/cpu/activation_cpu.c's formulation (see there), with the same float operations
// in the same order and no FMA contraction, so that both backends give the same bits.

#define GELU_K     0.7978845608028654f // sqrt(2 / pi)
#define GELU_C     0.044715f
#define GELU_CLAMP 10.0f

// exp(x) for x in [-87, 88]: x = n ln2 + r, a degree-6 polynomial in r, 2^n in the exponent.
__device__ __forceinline__ float exp_bounded(float x) {
  const float log2e = 1.44269504088896341f, round_magic = 12582912.0f; // 1.5 * 2^23
  const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723e-6f;
  float n = sub_rn(add_rn(mul_rn(x, log2e), round_magic), round_magic);
  float r = sub_rn(sub_rn(x, mul_rn(n, ln2_hi)), mul_rn(n, ln2_lo));
  float p = 1.0f / 720.0f;
  p = add_rn(mul_rn(p, r), 1.0f / 120.0f);
  p = add_rn(mul_rn(p, r), 1.0f / 24.0f);
  p = add_rn(mul_rn(p, r), 1.0f / 6.0f);
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  int32_t bits = ((int32_t)n + 127) << 23; // n in -126..127: a normal power of two
  return mul_rn(p, __int_as_float(bits));
}

// s = sigmoid(2 u(x)) of the clamped x, u = k (x + c x^3).
__device__ __forceinline__ float gelu_sigmoid(float xc) {
  float u = mul_rn(GELU_K, add_rn(xc, mul_rn(mul_rn(mul_rn(GELU_C, xc), xc), xc)));
  return div_rn(1.0f, add_rn(1.0f, exp_bounded(mul_rn(-2.0f, u))));
}

__device__ __forceinline__ float clamp_gelu(float x) {
  return x < -GELU_CLAMP ? -GELU_CLAMP : (x > GELU_CLAMP ? GELU_CLAMP : x);
}

__device__ __forceinline__ float gelu(float x) {
  float s = gelu_sigmoid(clamp_gelu(x));
  return mul_rn(x, x < -GELU_CLAMP ? 0.0f : s); // exactly (-)0 far left
}

// gelu'(x) from x, its clamped value and s = gelu_sigmoid(xc); saturated: exactly 0 or 1.
__device__ __forceinline__ float gelu_deriv(float x, float xc, float s) {
  float du = mul_rn(GELU_K, add_rn(1.0f, mul_rn(mul_rn(3.0f * GELU_C, xc), xc)));
  float d = add_rn(s, mul_rn(mul_rn(mul_rn(mul_rn(2.0f, xc), s), sub_rn(1.0f, s)), du));
  return x < -GELU_CLAMP ? 0.0f : (x > GELU_CLAMP ? 1.0f : d);
}

__global__ void gelu_forward_kernel(int64_t n, const float *in, // (n)
                                    float *out) {               // (n), may be in
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = gelu(in[i]);
  }
}

__global__ void gelu_backward_kernel(int64_t n, const float *in, // (n)
                                     const float *dout,          // (n)
                                     float *din) {               // (n), may be in or dout
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = in[i], xc = clamp_gelu(x);
    din[i] = mul_rn(dout[i], gelu_deriv(x, xc, gelu_sigmoid(xc)));
  }
}

// gelu(x) and gelu'(x) in one pass, the bits of gelu_forward_kernel and gelu_backward_kernel.
__global__ void gelu_forward_deriv_kernel(int64_t n, const float *in, // (n)
                                          float *out,                 // (n)
                                          float *deriv) {             // (n), may be in
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float x = in[i], xc = clamp_gelu(x);
    float s = gelu_sigmoid(xc);
    out[i] = mul_rn(x, x < -GELU_CLAMP ? 0.0f : s);
    deriv[i] = gelu_deriv(x, xc, s);
  }
}

__global__ void mul_kernel(int64_t n, const float *a, // (n)
                           const float *b,            // (n)
                           float *c) {                // (n), may be a or b
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    c[i] = mul_rn(a[i], b[i]);
  }
}

__global__ void bias_gelu_forward_kernel(int64_t M, int64_t N, const float *x, // (M, N)
                                         const float *bias,                    // (N)
                                         float *pre,                           // (M, N), may be x
                                         float *out) {                         // (M, N)
  const int64_t n = M * N, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = add_rn(x[i], bias[i % N]);
    pre[i] = p;
    out[i] = gelu(p);
  }
}

// ---------------------------------------------------------------------------------------------
// Softmax: one block per row, each thread taking the columns threadIdx.x + k * blockDim.x.
// A thread reads and writes only its own columns after the block reductions, so out may be in
// (and din may be out or dout): every read of another thread's column happens before the
// reduction's barrier, every write after it.

__global__ void softmax_forward_kernel(int64_t N, int64_t C, const float *in, // (N, C)
                                       float *out) {                          // (N, C)
  __shared__ float shared_max[kWarpSize];
  __shared__ double shared_sum[kWarpSize];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float *x = in + r * C;
    float *y = out + r * C;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      m = max_keep(m, x[j]);
    }
    m = block_max(m, shared_max);
    if (m == -INFINITY) { // every entry is -inf or NaN: no mass anywhere, zeros; but a NaN
      // (which never wins max_keep) makes the row NaN, as it does beside a finite entry (the CPU's
      // rule). m is the same in every thread: the whole block takes this branch.
      float nan_seen = -INFINITY;
      for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        nan_seen = x[j] != x[j] ? INFINITY : nan_seen;
      }
      const float fill =
          block_max(nan_seen, shared_max) == INFINITY ? __int_as_float(0x7fc00000) : 0.0f;
      for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        y[j] = fill; // after block_max's barrier: every thread has read its columns
      }
      continue;
    }
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      float e = expf(x[j] - m); // <= 1: cannot overflow
      y[j] = e;
      sum += (double)e;
    }
    sum = block_sum(sum, shared_sum);
    float inv = (float)(1.0 / sum); // sum >= 1: the max contributes exp(0)
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      y[j] = mul_rn(y[j], inv);
    }
  }
}

__global__ void softmax_backward_kernel(int64_t N, int64_t C, const float *out, // (N, C)
                                        const float *dout,                      // (N, C)
                                        float *din) {                           // (N, C)
  __shared__ double shared_sum[kWarpSize];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float *y = out + r * C, *dy = dout + r * C;
    float *dx = din + r * C;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      s += (double)y[j] * (double)dy[j];
    }
    float dot = (float)block_sum(s, shared_sum);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      dx[j] = mul_rn(y[j], sub_rn(dy[j], dot));
    }
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_gelu_forward(int64_t n, const float *in, float *out) {
  if (n <= 0) {
    return LOOM_OK;
  }
  gelu_forward_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, in,
                                                                                          out);
  return loom_cuda_launch_check("gelu_forward_kernel");
}

extern "C" loom_status_t loom_cuda_gelu_backward(int64_t n, const float *in, const float *dout,
                                                 float *din) {
  if (n <= 0) {
    return LOOM_OK;
  }
  gelu_backward_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, in, dout, din);
  return loom_cuda_launch_check("gelu_backward_kernel");
}

extern "C" loom_status_t loom_cuda_gelu_forward_deriv(int64_t n, const float *in, float *out,
                                                      float *deriv) {
  if (n <= 0) {
    return LOOM_OK;
  }
  gelu_forward_deriv_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, in, out, deriv);
  return loom_cuda_launch_check("gelu_forward_deriv_kernel");
}

extern "C" loom_status_t loom_cuda_gelu_backward_deriv(int64_t M, int64_t N, const float *deriv,
                                                       const float *dout, float *din,
                                                       float *dbias) {
  const int64_t n = M * N;
  if (n > 0) {
    mul_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, dout, deriv,
                                                                                   din);
    loom_status_t status = loom_cuda_launch_check("mul_kernel");
    if (status != LOOM_OK) {
      return status;
    }
  }
  // The column sums as loom_bias_backward takes them, from din on the same stream.
  return dbias ? loom_cuda_bias_backward(M, N, din, dbias) : LOOM_OK;
}

extern "C" loom_status_t loom_cuda_bias_gelu_forward(int64_t M, int64_t N, const float *x,
                                                     const float *bias, float *pre, float *out) {
  if (M <= 0 || N <= 0) {
    return LOOM_OK;
  }
  bias_gelu_forward_kernel<<<loom_cuda_blocks(M * N, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      M, N, x, bias, pre, out);
  return loom_cuda_launch_check("bias_gelu_forward_kernel");
}

extern "C" loom_status_t loom_cuda_softmax_forward(int64_t N, int64_t C, const float *in,
                                                   float *out) {
  if (N <= 0 || C <= 0) {
    return LOOM_OK;
  }
  softmax_forward_kernel<<<row_blocks(N), row_threads(C), 0, loom_cuda_stream()>>>(N, C, in, out);
  return loom_cuda_launch_check("softmax_forward_kernel");
}

extern "C" loom_status_t loom_cuda_softmax_backward(int64_t N, int64_t C, const float *out,
                                                    const float *dout, float *din) {
  if (N <= 0 || C <= 0) {
    return LOOM_OK;
  }
  softmax_backward_kernel<<<row_blocks(N), row_threads(C), 0, loom_cuda_stream()>>>(N, C, out, dout,
                                                                                    din);
  return loom_cuda_launch_check("softmax_backward_kernel");
}
