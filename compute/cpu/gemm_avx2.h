/* gemm_avx2.h — loom's own f32 GEMM for x86-64 with AVX2 and FMA: a 6 x 16 register micro-kernel
 * that reads a (the activations) in place and packs only op(b), with the bias fused. */
#ifndef LOOM_GEMM_AVX2_H
#define LOOM_GEMM_AVX2_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 1 when this build has the kernel and the CPU runs it (AVX2 and FMA); 0 otherwise.
int loom_cpu_gemm_avx2_ok(void);

// c = alpha * a @ op(b) + beta * c, then c[i, j] += bias[j] (bias may be NULL; not scaled by
// alpha): the contract of loom_cpu_gemm_strided for trans_a == 0, row-major with row strides. a is
// read where it lies; op(b) (K, N) is packed into panels of 16 columns, 256 rows of K at a time, in
// a per-thread buffer of 1 MiB. beta == 0 overwrites c without reading it. Preconditions:
// loom_cpu_gemm_avx2_ok(); M, N, K >= 1; lda >= K, ldb >= K (trans_b) or N, ldc >= N; c overlaps
// none of a, b, bias. Single-threaded and deterministic: the same operands give the same bits on
// every call. Returns 0, or -1 when the packing buffer cannot be allocated (c is then untouched).
int loom_cpu_gemm_avx2(int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *a,
                       int64_t lda,                        // (M, K), row stride lda
                       const float *b, int64_t ldb,        // (K, N), or (N, K) with trans_b
                       const float *bias,                  // (N) or NULL
                       float beta, float *c, int64_t ldc); // (M, N), row stride ldc

// As loom_cpu_gemm_avx2, with beta scaling cin (row stride ldcin) instead of c: c = alpha * a @
// op(b) + beta * cin (+ bias), in one pass over c (a residual add fused into the product). cin
// may be c itself (ldcin == ldc: loom_cpu_gemm_avx2), else it must not overlap c; read only when
// beta != 0. The bits are those of copying cin into c and then loom_cpu_gemm_avx2.
int loom_cpu_gemm_avx2_into(int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const float *a, int64_t lda, // (M, K), row stride lda
                            const float *b, int64_t ldb, // (K, N), or (N, K) with trans_b
                            const float *bias,           // (N) or NULL
                            float beta, const float *cin, int64_t ldcin, // (M, N)
                            float *c, int64_t ldc);                      // (M, N)

#ifdef __cplusplus
}
#endif
#endif
