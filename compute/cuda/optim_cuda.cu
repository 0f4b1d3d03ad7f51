/* optim_cuda.cu — CUDA AdamW and SGD-momentum updates: compute/cpu/optim_cpu.c's float
 * operations in its order, IEEE-rounded one by one (no FMA), so both backends give the same bits.
 */
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

const unsigned kThreads = 256; // threads per block

// The scalar factors of one AdamW step, computed on the host in double and rounded to float once
// exactly as the CPU kernel does (see optim_cpu.c for the formula and PyTorch's order), passed to
// the kernel by value.
struct adamw_factors {
  float decay; // 1 - lr * weight_decay
  float beta1, one_minus_b1;
  float beta2, one_minus_b2;
  float step_size; // lr / (1 - beta1^step)
  float bc2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
};

adamw_factors adamw_factors_of(const loom_adamw_t *hp) {
  const double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2;
  adamw_factors f;
  f.decay = (float)(1.0 - lr * (double)hp->weight_decay);
  f.beta1 = hp->beta1;
  f.one_minus_b1 = (float)(1.0 - b1);
  f.beta2 = hp->beta2;
  f.one_minus_b2 = (float)(1.0 - b2);
  f.step_size = (float)(lr / (1.0 - pow(b1, (double)hp->step)));
  f.bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)hp->step));
  f.eps = hp->eps;
  return f;
}

__global__ void adamw_update_kernel(int64_t n, float *param, // (n)
                                    const float *grad,       // (n)
                                    float *m,                // (n)
                                    float *v,                // (n)
                                    adamw_factors f) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = grad[i];
    float p = mul_rn(param[i], f.decay);
    float mi = add_rn(mul_rn(f.beta1, m[i]), mul_rn(f.one_minus_b1, g));
    float vi = add_rn(mul_rn(f.beta2, v[i]), mul_rn(mul_rn(f.one_minus_b2, g), g));
    float denom = add_rn(div_rn(sqrt_rn(vi), f.bc2_sqrt), f.eps);
    m[i] = mi;
    v[i] = vi;
    param[i] = sub_rn(p, mul_rn(f.step_size, div_rn(mi, denom)));
  }
}

// momentum 0 (or no buffer): p = p - lr * (g + wd * p).
__global__ void sgd_plain_kernel(int64_t n, float *param, // (n)
                                 const float *grad,       // (n)
                                 loom_sgd_t hp) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = add_rn(grad[i], mul_rn(hp.weight_decay, param[i]));
    param[i] = sub_rn(param[i], mul_rn(hp.lr, g));
  }
}

// With momentum: buf = momentum * buf + g, then p -= lr * (nesterov ? g + momentum * buf : buf).
__global__ void sgd_momentum_kernel(int64_t n, float *param, // (n)
                                    const float *grad,       // (n)
                                    float *buf,              // (n)
                                    loom_sgd_t hp) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const float lr = hp.lr, mu = hp.momentum, wd = hp.weight_decay;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float g = add_rn(grad[i], mul_rn(wd, param[i]));
    float b = add_rn(mul_rn(mu, buf[i]), g);
    buf[i] = b;
    float step = hp.nesterov ? add_rn(g, mul_rn(mu, b)) : b;
    param[i] = sub_rn(param[i], mul_rn(lr, step));
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Entry points

extern "C" loom_status_t loom_cuda_adamw_update(int64_t n, float *param, const float *grad,
                                                float *m, float *v, const loom_adamw_t *hp) {
  if (n <= 0) {
    return LOOM_OK;
  }
  adamw_update_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, param, grad, m, v, adamw_factors_of(hp));
  return loom_cuda_launch_check("adamw_update_kernel");
}

extern "C" loom_status_t loom_cuda_sgd_update(int64_t n, float *param, const float *grad,
                                              float *buf, const loom_sgd_t *hp) {
  if (n <= 0) {
    return LOOM_OK;
  }
  if (hp->momentum == 0.0f || !buf) {
    sgd_plain_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(n, param,
                                                                                         grad, *hp);
    return loom_cuda_launch_check("sgd_plain_kernel");
  }
  sgd_momentum_kernel<<<loom_cuda_blocks(n, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      n, param, grad, buf, *hp);
  return loom_cuda_launch_check("sgd_momentum_kernel");
}
