/* linear_cpu.c — CPU linear-layer kernels: loom's AVX2 GEMM or cblas_sgemm, with the edge cases
 * BLAS leaves open (empty sizes, K == 0, bias rows), and the bias gradient as sums in double. */
#include "config.h"
#include "linear_cpu.h"
#include "simd.h"

#include <cblas.h>
#include <string.h>

#include "blas_check.h"
#include "gemm_avx2.h"
#include "log.h"
#include "params.h"

// ---------------------------------------------------------------------------------------------
// GEMM.

// c = beta * c for an (M, N) matrix with row stride ldc; beta == 0 writes zeros without reading.
static void scale_rows(int64_t M, int64_t N, float beta, float *c, int64_t ldc) {
  if (beta == 1.0f) {
    return;
  }
  for (int64_t i = 0; i < M; i++) {
    float *restrict row = c + i * ldc;
    if (beta == 0.0f) {
      for (int64_t j = 0; j < N; j++) {
        row[j] = 0.0f;
      }
    } else {
      for (int64_t j = 0; j < N; j++) {
        row[j] *= beta;
      }
    }
  }
}

// c (M x N, row stride ldc) += the bias row, every row.
LOOM_CPU_CLONES
static void add_bias_rows(int64_t M, int64_t N, const float *restrict bias, float *c, int64_t ldc) {
  for (int64_t i = 0; i < M; i++) {
    float *restrict row = c + i * ldc;
    for (int64_t j = 0; j < N; j++) {
      row[j] += bias[j];
    }
  }
}

// Does loom's own kernel (gemm_avx2.c) run this product? LOOM_GEMM=loom: every product with an
// untransposed a; blas: none. auto: where the kernel was measured faster than the BLAS, i.e.
// OpenBLAS on its AVX2 kernels (Haswell, Zen) and one thread (loom_init keeps auto only if that
// holds on every rank, else sets blas) and at least LOOM_GEMM_AUTO_MIN_ROWS rows: the kernel
// packs the whole op(b) for every product, and with fewer rows to share that copy it lost to
// OpenBLAS (tests/bench/gemm_perf --tokens 128..1024: loom / BLAS time 1.06 at 128 rows, 0.99
// at 512, 0.97 at 1024, 0.93 at 2048). So under auto a row's bits can depend on how many rows
// share its product, as with BLAS libraries that pick kernels by size; under loom or blas they
// never do. a^T products (weight gradients) and alpha == 0 (BLAS skips the product, so Inf or
// NaN in a or b do not reach c) stay on the BLAS.
int loom_cpu_gemm_uses_loom(int trans_a, int64_t M, float alpha) {
  static int cpu_ok = -1; // AVX2 and FMA: fixed for the process
  int ok = __atomic_load_n(&cpu_ok, __ATOMIC_RELAXED);
  if (ok < 0) {
    ok = loom_cpu_gemm_avx2_ok();
    __atomic_store_n(&cpu_ok, ok, __ATOMIC_RELAXED);
  }
  const int mode = loom_gemm_mode();
  if (trans_a || alpha == 0.0f || !ok || mode == LOOM_GEMM_MODE_BLAS) {
    return 0;
  }
  return mode == LOOM_GEMM_MODE_LOOM ||
         (M >= LOOM_GEMM_AUTO_MIN_ROWS && loom_gemm_auto_picks_loom(loom_blas_threads_now()));
}

void loom_cpu_gemm_strided(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *a, int64_t lda, const float *b, int64_t ldb,
                           const float *bias, float beta, float *c, int64_t ldc) {
  if (M <= 0 || N <= 0) {
    return;
  }
  if (K > 0 && loom_cpu_gemm_uses_loom(trans_a, M, alpha)) {
    if (loom_cpu_gemm_avx2(trans_b, M, N, K, alpha, a, lda, b, ldb, bias, beta, c, ldc) == 0) {
      return; // the bias is added in the kernel's epilogue
    }
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
      LOOM_WARN(LOOM_SUB_COMPUTE, "loom's GEMM kernel could not allocate its 1 MiB packing buffer: "
                                  "this product (and any later one that fails alike) runs on the "
                                  "BLAS, whose results differ in the last bits; free memory or "
                                  "set LOOM_GEMM=blas");
    }
  }
  if (bias && beta == 0.0f && K > 0) {
    // c = bias rows, then BLAS adds the product (beta = 1): one pass over c instead of BLAS
    // zeroing it (beta = 0) and a second pass adding the bias; 1% of a train_gpt step. The sum
    // adds the same terms with the bias first: equal bits when K fits in one BLAS block.
    for (int64_t i = 0; i < M; i++) {
      memcpy(c + i * ldc, bias, (size_t)N * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, a, (int)lda, b,
                (int)ldb, 1.0f, c, (int)ldc);
    return;
  }
  if (K <= 0) {
    scale_rows(M, N, beta, c, ldc); // op(a) @ op(b) is the zero matrix
  } else {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, a, (int)lda, b,
                (int)ldb, beta, c, (int)ldc);
  }
  if (bias) {
    add_bias_rows(M, N, bias, c, ldc);
  }
}

void loom_cpu_gemm_residual(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                            const float *a, const float *b, const float *bias,
                            const float *residual, float *c) {
  if (M <= 0 || N <= 0) {
    return;
  }
  const int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  if (residual != c && K > 0 && loom_cpu_gemm_uses_loom(trans_a, M, 1.0f) &&
      loom_cpu_gemm_avx2_into(trans_b, M, N, K, 1.0f, a, lda, b, ldb, bias, 1.0f, residual, N, c,
                              N) == 0) {
    return; // one pass over c: the residual is read in the kernel's epilogue
  }
  // The BLAS (or a failed packing buffer, which leaves c untouched): the copy, then the product
  // added to it; loom_cpu_gemm_avx2_into gives these bits.
  if (residual != c) {
    memcpy(c, residual, (size_t)M * (size_t)N * sizeof(float));
  }
  loom_cpu_gemm(trans_a, trans_b, M, N, K, 1.0f, a, b, bias, 1.0f, c);
}

void loom_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *a, const float *b, const float *bias, float beta, float *c) {
  int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  // BLAS wants ld >= 1 even when the matrix is empty; those calls never reach BLAS anyway.
  loom_cpu_gemm_strided(trans_a, trans_b, M, N, K, alpha, a, lda > 0 ? lda : 1, b,
                        ldb > 0 ? ldb : 1, bias, beta, c, N > 0 ? N : 1);
}

// ---------------------------------------------------------------------------------------------
// Bias gradient.

// Columns per block: the double accumulators of one block stay on the stack (and in L1).
#define BIAS_TILE 256

LOOM_CPU_CLONES
static void bias_backward_kernel(int64_t M, int64_t N, const float *restrict dout,
                                 float *restrict dbias) {
  double acc[BIAS_TILE];
  for (int64_t j0 = 0; j0 < N; j0 += BIAS_TILE) {
    int64_t nj = N - j0 < BIAS_TILE ? N - j0 : BIAS_TILE;
    for (int64_t j = 0; j < nj; j++) {
      acc[j] = 0.0;
    }
    for (int64_t i = 0; i < M; i++) {
      const float *restrict row = dout + i * N + j0;
      for (int64_t j = 0; j < nj; j++) {
        acc[j] += (double)row[j];
      }
    }
    for (int64_t j = 0; j < nj; j++) {
      dbias[j0 + j] = (float)((double)dbias[j0 + j] + acc[j]);
    }
  }
}

void loom_cpu_bias_backward(int64_t M, int64_t N, const float *restrict dout,
                            float *restrict dbias) {
  bias_backward_kernel(M, N, dout, dbias);
}
