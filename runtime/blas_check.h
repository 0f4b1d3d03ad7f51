/* blas_check.h — does the BLAS run kernels narrower than the CPU allows? OpenBLAS 0.3.21 takes
 * its AVX2 (Zen, Haswell) kernels on AMD Zen 4/5, whose AVX-512 kernels run sgemm much faster. */
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

// At init, on the first rank of each host: the warning with the fix when loom_blas_advise_coretype
// says so.
void loom_blas_check(const loom_ctx_t *ctx);

#endif
