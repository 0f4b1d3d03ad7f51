/* blas_check.h — the BLAS as loom finds it: its core and threads, whether its kernels are narrower
 * than the CPU allows (OpenBLAS 0.3.21 on Zen 4/5), and the LOOM_GEMM mode set at init. */
#ifndef LOOM_BLAS_CHECK_H
#define LOOM_BLAS_CHECK_H

#include "ctx.h"

// 1 when OpenBLAS's core `core` uses AVX2 kernels only ("Haswell", "Zen", any case).
int loom_blas_core_is_avx2(const char *core);

// 1 when loom should advise OPENBLAS_CORETYPE=SkylakeX: the CPU has AVX-512 (F, BW, DQ, VL),
// OpenBLAS chose an AVX2 core, and the user did not pick one (env: OPENBLAS_CORETYPE or NULL).
int loom_blas_advise_coretype(const char *core, int cpu_avx512, const char *env);

// This process's BLAS core name ("unknown" when the BLAS does not say) and whether the CPU has
// the AVX-512 subset that OpenBLAS's SkylakeX kernels need.
const char *loom_blas_core(void);
int loom_cpu_has_avx512(void);
// 1 when the CPU has AVX2 and FMA (loom's own GEMM kernel needs both).
int loom_cpu_has_avx2_fma(void);

// The LOOM_GEMM mode of this process (enum loom_gemm_mode): set by loom_init, AUTO before it.
// The compute layer reads it for every host GEMM (linear_cpu.c).
void loom_gemm_mode_set(int mode);
int loom_gemm_mode(void);

// The number of threads the BLAS runs a product on now (1 when it cannot say).
int loom_blas_threads_now(void);

// LOOM_GEMM=auto's rule: 1 when loom's kernel was measured faster than this BLAS, i.e. the CPU
// has AVX2 and FMA and OpenBLAS runs its AVX2 kernels (Haswell, Zen) on blas_threads == 1.
int loom_gemm_auto_picks_loom(int blas_threads);

// At init, after the BLAS threads are set: resolve LOOM_GEMM=auto once for the whole job (it
// stays auto, loom's kernel for products of 512 rows or more, only when every rank's rule picks
// it, else becomes blas: a product's bits must not depend on which rank computes it) and set
// the mode. Collective over MPI_COMM_WORLD.
void loom_gemm_resolve(const loom_ctx_t *ctx);

// At init, on the first rank of each host: the warning with the fix when loom_blas_advise_coretype
// says so, and when LOOM_GEMM=loom asks for a kernel this CPU cannot run.
void loom_blas_check(const loom_ctx_t *ctx);

#endif
