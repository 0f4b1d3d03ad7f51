/* blas_check.c — the BLAS as loom finds it: warn at init when OpenBLAS runs its AVX2 kernels on a
 * CPU with AVX-512 (and say how to get the AVX-512 ones); hold the LOOM_GEMM mode. */
#include "config.h"
#include "blas_check.h"

#include <cblas.h>
#include <stdlib.h>
#include <strings.h>

#include "log.h"
#include "params.h"

static int gemm_mode = LOOM_GEMM_MODE_AUTO;

void loom_gemm_mode_set(int mode) {
  __atomic_store_n(&gemm_mode, mode, __ATOMIC_RELAXED);
}

int loom_gemm_mode(void) {
  return __atomic_load_n(&gemm_mode, __ATOMIC_RELAXED);
}

int loom_blas_threads_now(void) {
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

int loom_blas_core_is_avx2(const char *core) {
  return core && (strcasecmp(core, "Haswell") == 0 || strcasecmp(core, "Zen") == 0);
}

int loom_blas_advise_coretype(const char *core, int cpu_avx512, const char *env) {
  return cpu_avx512 && (!env || !env[0]) && loom_blas_core_is_avx2(core);
}

const char *loom_blas_core(void) {
#ifdef HAVE_OPENBLAS_GET_CORENAME
  const char *core = openblas_get_corename();
  return core ? core : "unknown";
#else
  return "unknown";
#endif
}

int loom_cpu_has_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return 0;
#endif
}

int loom_gemm_auto_picks_loom(int blas_threads) {
  static int core_avx2 = -1; // the core OpenBLAS picked when it loaded: fixed for the process
  int avx2 = __atomic_load_n(&core_avx2, __ATOMIC_RELAXED);
  if (avx2 < 0) {
    avx2 = loom_cpu_has_avx2_fma() && loom_blas_core_is_avx2(loom_blas_core());
    __atomic_store_n(&core_avx2, avx2, __ATOMIC_RELAXED);
  }
  return avx2 && blas_threads == 1;
}

void loom_gemm_resolve(const loom_ctx_t *ctx) {
  static const char *const names[] = {"auto", "blas", "loom"};
  int mode = ctx->params.gemm;
  if (mode == LOOM_GEMM_MODE_AUTO) {
    int mine = loom_gemm_auto_picks_loom(ctx->blas_threads), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    mode = all ? LOOM_GEMM_MODE_AUTO : LOOM_GEMM_MODE_BLAS; // auto: by rows from here on
  }
  loom_gemm_mode_set(mode);
  const int cpu = loom_cpu_has_avx2_fma();
  LOOM_INFO(LOOM_SUB_INIT,
            "GEMM kernel for untransposed products: %s (LOOM_GEMM=%s, BLAS core %s, %d BLAS "
            "thread(s))",
            mode == LOOM_GEMM_MODE_BLAS || !cpu ? "the BLAS"
            : mode == LOOM_GEMM_MODE_LOOM       ? "loom's AVX2 kernel"
                                          : "loom's AVX2 kernel from 512 rows, the BLAS below",
            names[ctx->params.gemm], loom_blas_core(), ctx->blas_threads);
}

int loom_cpu_has_avx2_fma(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return 0;
#endif
}

void loom_blas_check(const loom_ctx_t *ctx) {
  if (ctx->host_rank != 0) {
    return;
  }
  if (ctx->params.gemm == LOOM_GEMM_MODE_LOOM && !loom_cpu_has_avx2_fma()) {
    LOOM_WARN(LOOM_SUB_INIT,
              "LOOM_GEMM=loom on %s, whose CPU lacks AVX2 or FMA: the BLAS runs every product. "
              "Set LOOM_GEMM=auto or blas to silence this",
              ctx->hostname);
  }
  const char *core = loom_blas_core();
  if (!loom_blas_advise_coretype(core, loom_cpu_has_avx512(), getenv("OPENBLAS_CORETYPE"))) {
    return;
  }
  // OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads: too early for loom to set it.
  LOOM_WARN(LOOM_SUB_INIT,
            "OpenBLAS picked its %s kernels (AVX2) on %s, whose CPU has AVX-512. Its AVX-512 "
            "kernels ran sgemm 1.9x faster on an AMD Zen 5 core (README, 'BLAS kernels'): set "
            "OPENBLAS_CORETYPE=SkylakeX before the launch (mpirun -x OPENBLAS_CORETYPE=SkylakeX "
            "...), or OPENBLAS_CORETYPE=%s to keep these kernels without this warning",
            core, ctx->hostname, core);
}
