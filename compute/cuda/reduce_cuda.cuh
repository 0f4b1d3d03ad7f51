/* reduce_cuda.cuh — device helpers the CUDA compute kernels share: float arithmetic without FMA
 * contraction, deterministic warp and block reductions, and a fixed-tree sum of n doubles. */
#ifndef LOOM_REDUCE_CUDA_CUH
#define LOOM_REDUCE_CUDA_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda_ctx.h"
#include "error.h"
#include "loom_core.h"

// Everything here has internal linkage (each .cu file gets its own copy): the kernels are
// templates or inline functions, so a file that does not use one pays nothing for it.
namespace {

// ---- float arithmetic as the CPU kernels do it -----------------------------------------------
// nvcc contracts a * b + c into one FMA by default; the CPU build turns contraction off. Where a
// kernel mirrors a CPU kernel operation for operation (and should give its bits), it spells the
// operations with these, which are never contracted.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ float sqrt_rn(float a) {
  return __fsqrt_rn(a);
}

// ---- warp and block reductions ---------------------------------------------------------------
// Butterfly (xor) shuffles: a fixed tree, and because IEEE addition is commutative every lane
// ends with the same bits. Block reductions need blockDim.x a multiple of 32 (at most 1024) and
// every thread of the block to call them; every thread gets the result.

const int kWarpSize = 32;

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// The maximum as the CPU loops take it (m = x > m ? x : m): NaN never wins a comparison, so
// inputs that start at -inf and only take larger values never hold NaN.
__device__ __forceinline__ float max_keep(float m, float x) {
  return x > m ? x : m;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = max_keep(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// shared: 32 elements of __shared__ memory, reusable right after the call returns.
template <typename T> __device__ T block_sum(T v, T *shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads(); // a previous call may still be reading shared
  if (lane == 0) {
    shared[warp] = v;
  }
  __syncthreads();
  return warp_sum(lane < warps ? shared[lane] : T(0));
}

__device__ inline float block_max(float v, float *shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) {
    shared[warp] = v;
  }
  __syncthreads();
  // Lane 0's result for every thread: max_keep of +0 and -0 keeps its first argument, so lanes
  // could otherwise differ in the sign of a zero maximum.
  return __shfl_sync(0xffffffffu, warp_max(lane < warps ? shared[lane] : -INFINITY), 0);
}

// Threads per block for the kernels that give one block to each row of C elements: one warp for
// short rows (MoE routers, small heads), eight for long ones. A function of C only, so a row's
// reduction tree, and its bits, do not depend on the device.
inline unsigned row_threads(int64_t C) {
  return C <= 256 ? 32u : 256u;
}

// Blocks for a kernel that loops over N rows with one block per row (grid-stride over rows).
inline unsigned row_blocks(int64_t N) {
  const int64_t max_blocks = 1 << 20;
  return (unsigned)(N < max_blocks ? N : max_blocks);
}

// ---- fixed-tree sum of n doubles -------------------------------------------------------------
// sum over i < n of term(i), term a functor with `__device__ double operator()(int64_t i) const`.
// Thread t of block b adds the terms i = b * kSumThreads + t + k * stride in order of k, each
// block reduces its threads by block_sum, and one block reduces the block partials the same way.
// The grid depends only on n, so the result does not depend on the device or on scheduling.

const int kSumThreads = 256;
const int kSumBlocks = 512; // at most; also the block size of the final pass

template <typename Term>
__global__ void sum_partials_kernel(int64_t n, Term term, double *partials) { // partials: (grid)
  __shared__ double shared[kWarpSize];
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  double s = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    s += term(i);
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = s;
  }
}

// One block of kThreads threads: out[0] = the sum of partials[0..count), count <= kThreads.
template <int kThreads>
__global__ void sum_finish_kernel(int count, const double *partials, double *out) {
  __shared__ double shared[kWarpSize];
  double s = (int)threadIdx.x < count ? partials[threadIdx.x] : 0.0;
  s = block_sum(s, shared);
  if (threadIdx.x == 0) {
    out[0] = s;
  }
}

// *sum_host = the sum of term(i) for i < n (0 when n <= 0), waiting for the stream. what names
// the calling op in a launch error.
template <typename Term>
loom_status_t device_sum(int64_t n, Term term, const char *what, double *sum_host) {
  loom_status_t status = LOOM_OK;
  cudaStream_t stream = loom_cuda_stream();
  double *ws = NULL; // (blocks + 1): the block partials, then the sum
  int64_t want = (n + kSumThreads - 1) / kSumThreads;
  int blocks = (int)(want < kSumBlocks ? want : kSumBlocks);

  if (n <= 0) {
    *sum_host = 0.0;
    return LOOM_OK;
  }
  LOOM_CHECK(loom_cuda_scratch(sizeof(double) * (size_t)(blocks + 1), (void **)&ws));
  sum_partials_kernel<Term><<<blocks, kSumThreads, 0, stream>>>(n, term, ws);
  LOOM_CHECK(loom_cuda_launch_check(what));
  sum_finish_kernel<kSumBlocks><<<1, kSumBlocks, 0, stream>>>(blocks, ws, ws + blocks);
  LOOM_CHECK(loom_cuda_launch_check(what));
  LOOM_CHECK(loom_cuda_to_host(sum_host, ws + blocks, sizeof(double)));

fail:
  if (ws) {
    loom_cuda_scratch_free(ws);
  }
  return status;
}

} // namespace

#endif
