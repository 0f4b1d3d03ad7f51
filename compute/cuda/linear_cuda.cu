/* linear_cuda.cu — CUDA linear-layer kernels: row-major GEMM (+bias) on cuBLAS in f32 (no TF32)
 * or bf16 (f32 accumulation), and the bias gradient as deterministic column sums in double. */
#include "config.h"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

// loom_core.h includes mpi.h; its C++ bindings would need libmpi_cxx, so leave them out.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include "blas_cuda.h"
#include "cuda_ctx.h"
#include "cuda_kernels.h"
#include "error.h"

namespace {

const unsigned kThreads = 256; // threads per block

// ---------------------------------------------------------------------------------------------
// Element access for the two GEMM dtypes: f32 as is, bf16 through f32 with round to nearest even.

__device__ inline float load_elem(const float *p) {
  return *p;
}
__device__ inline float load_elem(const __nv_bfloat16 *p) {
  return __bfloat162float(*p);
}
__device__ inline void store_elem(float *p, float v) {
  *p = v;
}
__device__ inline void store_elem(__nv_bfloat16 *p, float v) {
  *p = __float2bfloat16_rn(v);
}

// c = beta * c on an (M, N) matrix with row stride ldc, as the CPU's scale_rows: beta == 0
// writes zeros without reading c (NaN in c does not survive), beta == 1 is not launched.
template <typename T>
__global__ void scale_rows_kernel(int64_t M, int64_t N, float beta, T *c, int64_t ldc) {
  const int64_t total = M * N, stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    T *p = c + (t / N) * ldc + t % N; // c: (M, N), row stride ldc
    store_elem(p, beta == 0.0f ? 0.0f : __fmul_rn(load_elem(p), beta));
  }
}

// c[i, j] += bias[j] on every row, after the product (not scaled by alpha). For bf16 c the sum
// is taken in f32 and rounded once more to bf16.
template <typename T>
__global__ void add_bias_kernel(int64_t M, int64_t N, const float *bias, T *c, int64_t ldc) {
  const int64_t total = M * N, stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t j = t % N;
    T *p = c + (t / N) * ldc + j; // c: (M, N), row stride ldc; bias: (N)
    store_elem(p, __fadd_rn(load_elem(p), bias[j]));
  }
}

template <typename T>
loom_status_t launch_scale_rows(int64_t M, int64_t N, float beta, void *c, int64_t ldc) {
  scale_rows_kernel<T><<<loom_cuda_blocks(M * N, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      M, N, beta, static_cast<T *>(c), ldc);
  return loom_cuda_launch_check("scale_rows_kernel");
}

template <typename T>
loom_status_t launch_add_bias(int64_t M, int64_t N, const float *bias, void *c, int64_t ldc) {
  add_bias_kernel<T><<<loom_cuda_blocks(M * N, kThreads), kThreads, 0, loom_cuda_stream()>>>(
      M, N, bias, static_cast<T *>(c), ldc);
  return loom_cuda_launch_check("add_bias_kernel");
}

// ---------------------------------------------------------------------------------------------
// Bias gradient: column j's rows are cut into `chunks` runs of `rows` consecutive rows (a
// function of M and N only); stage 1 sums each run in row order into a double, stage 2 adds the
// runs in order, so the result does not depend on scheduling. With one chunk stage 1 finishes.

// partial[k, j] = sum of dout[i, j] over the rows of chunk k; or, when final (one chunk),
// dbias[j] = (float)((double)dbias[j] + that sum), as the CPU kernel rounds.
__global__ void bias_sum_kernel(int64_t M, int64_t N, int64_t rows, const float *dout,
                                double *partial, float *dbias, int final) {
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t k = blockIdx.y;
  if (j >= N) {
    return;
  }
  const int64_t i1 = (k + 1) * rows < M ? (k + 1) * rows : M;
  double s = 0.0;
  for (int64_t i = k * rows; i < i1; i++) {
    s += (double)dout[i * N + j]; // dout: (M, N)
  }
  if (final) {
    dbias[j] = (float)((double)dbias[j] + s); // dbias: (N)
  } else {
    partial[k * N + j] = s; // partial: (chunks, N)
  }
}

// dbias[j] = (float)((double)dbias[j] + sum over k in order of partial[k, j]).
__global__ void bias_finish_kernel(int64_t N, int64_t chunks, const double *partial, float *dbias) {
  const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= N) {
    return;
  }
  double s = 0.0;
  for (int64_t k = 0; k < chunks; k++) {
    s += partial[k * N + j]; // partial: (chunks, N)
  }
  dbias[j] = (float)((double)dbias[j] + s); // dbias: (N)
}

const int64_t kBiasMinRows = 64;         // rows a thread sums at least
const int64_t kBiasThreads = 256 * 1024; // threads wanted in stage 1 (columns x chunks)
const int64_t kBiasMaxChunks = 65535;    // gridDim.y

} // namespace

// ---------------------------------------------------------------------------------------------
// GEMM. Row-major C (M, N) with row stride ldc is column-major C^T (N, M) with leading dimension
// ldc, and likewise for a and b, so C^T = op(B)^T op(A)^T is one column-major cuBLAS call with
// the operands swapped: (m, n, k) = (N, M, K), first operand b, second a.

extern "C" loom_status_t loom_cuda_gemm(loom_dtype_t dtype, int trans_a, int trans_b, int64_t M,
                                        int64_t N, int64_t K, float alpha, const void *a,
                                        int64_t lda, const void *b, int64_t ldb, const float *bias,
                                        float beta, void *c, int64_t ldc) {
  loom_status_t status = LOOM_OK;
  void *workspace_raw = NULL;
  cublasHandle_t h = NULL;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  const int bf16 = dtype == LOOM_BF16;

  if (dtype != LOOM_F32 && dtype != LOOM_BF16) {
    return loom_error(NULL, LOOM_ERR_INTERNAL, "loom_cuda_gemm: dtype %d is not f32 or bf16",
                      (int)dtype);
  }
  if (M <= 0 || N <= 0) {
    return LOOM_OK; // an empty c: nothing to write
  }
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
      ldc > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_INTERNAL,
                      "loom_cuda_gemm: M %lld, N %lld, K %lld, lda %lld, ldb %lld, ldc %lld: "
                      "each must be at most INT_MAX for cuBLAS (loom_gemm checks this)",
                      (long long)M, (long long)N, (long long)K, (long long)lda, (long long)ldb,
                      (long long)ldc);
  }

  if (K <= 0) {
    // op(a) @ op(b) is the zero matrix: c = beta * c, as the CPU kernel (no cuBLAS call, whose
    // leading-dimension rules reject lda or ldb of 0).
    if (beta != 1.0f) {
      LOOM_CHECK(bf16 ? launch_scale_rows<__nv_bfloat16>(M, N, beta, c, ldc)
                      : launch_scale_rows<float>(M, N, beta, c, ldc));
    }
  } else {
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int m = (int)N, n = (int)M, k = (int)K;
    // Workspace from the stream-ordered pool, 256-byte aligned as cuBLAS requires: each call
    // has its own, so GEMMs on concurrent streams never share one.
    const size_t ws_bytes = loom_cuda_blas_workspace_bytes();
    void *workspace = NULL;
    LOOM_CHECK(loom_cuda_scratch(ws_bytes + 256, &workspace_raw));
    if (workspace_raw) {
      workspace = (void *)(((uintptr_t)workspace_raw + 255) & ~(uintptr_t)255);
    }
    LOOM_CHECK(loom_cuda_blas_begin(&h, workspace, workspace ? ws_bytes : 0));
    if (bf16) {
      st = cublasGemmEx(h, op_b, op_a, m, n, k, &alpha, b, CUDA_R_16BF, (int)ldb, a, CUDA_R_16BF,
                        (int)lda, &beta, c, CUDA_R_16BF, (int)ldc, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
    } else {
      st = cublasSgemm(h, op_b, op_a, m, n, k, &alpha, static_cast<const float *>(b), (int)ldb,
                       static_cast<const float *>(a), (int)lda, &beta, static_cast<float *>(c),
                       (int)ldc);
    }
    loom_cuda_blas_end(h);
    if (st != CUBLAS_STATUS_SUCCESS) {
      char what[200];
      snprintf(what, sizeof what,
               "%s (row-major %s M %lld, N %lld, K %lld, trans_a %d, trans_b %d, lda %lld, ldb "
               "%lld, ldc %lld)",
               bf16 ? "cublasGemmEx" : "cublasSgemm", bf16 ? "bf16" : "f32", (long long)M,
               (long long)N, (long long)K, trans_a, trans_b, (long long)lda, (long long)ldb,
               (long long)ldc);
      status = loom_cuda_blas_error(st, what);
      goto fail;
    }
  }
  if (bias) {
    LOOM_CHECK(bf16 ? launch_add_bias<__nv_bfloat16>(M, N, bias, c, ldc)
                    : launch_add_bias<float>(M, N, bias, c, ldc));
  }
  if (workspace_raw) {
    loom_cuda_scratch_free(workspace_raw); // stream-ordered: reused only after the GEMM
  }
  return LOOM_OK;

fail:
  if (workspace_raw) {
    loom_cuda_scratch_free(workspace_raw);
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Bias gradient.

extern "C" loom_status_t loom_cuda_bias_backward(int64_t M, int64_t N, const float *dout,
                                                 float *dbias) {
  loom_status_t status = LOOM_OK;
  double *partial = NULL;
  if (N <= 0) {
    return LOOM_OK;
  }
  if (M <= 0) { // dbias[j] = (float)((double)dbias[j] + 0.0), as the CPU kernel (-0 becomes +0)
    bias_finish_kernel<<<(unsigned)((N + kThreads - 1) / kThreads), kThreads, 0,
                         loom_cuda_stream()>>>(N, 0, NULL, dbias);
    return loom_cuda_launch_check("bias_finish_kernel");
  }
  // Chunks: enough (columns x chunks) threads to fill the device, each summing >= 64 rows.
  int64_t chunks = (kBiasThreads + N - 1) / N;
  const int64_t max_by_rows = (M + kBiasMinRows - 1) / kBiasMinRows;
  chunks = chunks < max_by_rows ? chunks : max_by_rows;
  chunks = chunks < kBiasMaxChunks ? chunks : kBiasMaxChunks;
  chunks = chunks > 0 ? chunks : 1;
  const int64_t rows = (M + chunks - 1) / chunks;
  chunks = (M + rows - 1) / rows; // no empty chunk
  const dim3 grid((unsigned)((N + kThreads - 1) / kThreads), (unsigned)chunks);

  if (chunks == 1) {
    bias_sum_kernel<<<grid, kThreads, 0, loom_cuda_stream()>>>(M, N, rows, dout, NULL, dbias, 1);
    return loom_cuda_launch_check("bias_sum_kernel");
  }
  LOOM_CHECK(loom_cuda_scratch(sizeof(double) * (size_t)chunks * (size_t)N, (void **)&partial));
  bias_sum_kernel<<<grid, kThreads, 0, loom_cuda_stream()>>>(M, N, rows, dout, partial, dbias, 0);
  LOOM_CHECK(loom_cuda_launch_check("bias_sum_kernel"));
  bias_finish_kernel<<<(unsigned)((N + kThreads - 1) / kThreads), kThreads, 0,
                       loom_cuda_stream()>>>(N, chunks, partial, dbias);
  LOOM_CHECK(loom_cuda_launch_check("bias_finish_kernel"));
  loom_cuda_scratch_free(partial);
  return LOOM_OK;

fail:
  if (partial) {
    loom_cuda_scratch_free(partial);
  }
  return status;
}
