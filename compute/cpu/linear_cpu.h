/* linear_cpu.h — CPU kernels of the linear layer on raw pointers: GEMM (+bias) through CBLAS or
 * loom's AVX2 kernel, and the bias gradient; the public ops, attention tiles and MoE call these. */
#ifndef LOOM_LINEAR_CPU_H
#define LOOM_LINEAR_CPU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// c = alpha * op(a) @ op(b) + beta * c, then c[i, j] += bias[j] on every row (bias may be NULL;
// it is not scaled by alpha). op(x) is x, or x^T when trans_x is non-zero. Row-major, contiguous:
// a is (M, K), or (K, M) with trans_a; b is (K, N), or (N, K) with trans_b.
// beta == 0 overwrites c without reading it (NaN in c does not propagate); K == 0 still applies
// beta; M == 0 or N == 0 does nothing. Runs on the BLAS threads set by the runtime, or on
// loom's own single-threaded AVX2 kernel (loom_cpu_gemm_uses_loom says when).
// Preconditions (checked by loom_gemm, not here): M, N, K in 0..INT_MAX; c overlaps none of a, b,
// bias.
void loom_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *a,    // (M, K), or (K, M) with trans_a
                   const float *b,    // (K, N), or (N, K) with trans_b
                   const float *bias, // (N) or NULL
                   float beta,
                   float *c); // (M, N)

// c = op(a) @ op(b) + residual (+ bias): loom_cpu_gemm with alpha 1 and beta 1 after copying
// residual (M, N) into c, with those bits, in one pass over c where loom's kernel runs the
// product. residual may be c; otherwise it must not overlap c (it may overlap a or b).
void loom_cpu_gemm_residual(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K,
                            const float *a,        // (M, K), or (K, M) with trans_a
                            const float *b,        // (K, N), or (N, K) with trans_b
                            const float *bias,     // (N) or NULL
                            const float *residual, // (M, N)
                            float *c);             // (M, N)

// As loom_cpu_gemm on strided row-major matrices: row r of a starts at a + r * lda (a row of the
// matrix as stored, i.e. of the (K, M) matrix when trans_a), likewise b with ldb and c with ldc.
// For tiles of a packed tensor, e.g. one head of a (T, H, D) tensor: ld = H * D. Each ld must be
// at least the stored row length and at most INT_MAX.
void loom_cpu_gemm_strided(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const float *a, int64_t lda,        // (M, K) or (K, M), row stride lda
                           const float *b, int64_t ldb,        // (K, N) or (N, K), row stride ldb
                           const float *bias,                  // (N) or NULL
                           float beta, float *c, int64_t ldc); // (M, N), row stride ldc

// LOOM_GEMM=auto gives loom's kernel products of at least this many rows (linear_cpu.c says why).
#define LOOM_GEMM_AUTO_MIN_ROWS 512

// 1 when loom_cpu_gemm(_strided) runs a product with this trans_a, M (rows of c) and alpha on
// loom's own AVX2 kernel (gemm_avx2.h) rather than the BLAS, under the LOOM_GEMM mode resolved
// at init (auto's per-call rule before it).
int loom_cpu_gemm_uses_loom(int trans_a, int64_t M, float alpha);

// dbias[j] += sum_i dout[i, j], summed in double (deterministic: a fixed order per column).
// dbias must not overlap dout.
void loom_cpu_bias_backward(int64_t M, int64_t N,
                            const float *dout, // (M, N)
                            float *dbias);     // (N)

#ifdef __cplusplus
}
#endif
#endif
