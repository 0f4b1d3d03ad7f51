/* test_blas_check.c — when loom advises OPENBLAS_CORETYPE: AVX2 cores on AVX-512 CPUs only, never
 * when the user chose a core, and the core name this process reports. */
#include "config.h"

#include <string.h>

#include "../check.h"
#include "blas_check.h"

int main(void) {
  CHECK(loom_blas_core_is_avx2("Zen") && loom_blas_core_is_avx2("haswell") &&
            loom_blas_core_is_avx2("HASWELL"),
        "Zen and Haswell are AVX2 cores, in any case");
  CHECK(!loom_blas_core_is_avx2("SkylakeX") && !loom_blas_core_is_avx2("Cooperlake") &&
            !loom_blas_core_is_avx2("Zen2") && !loom_blas_core_is_avx2("") &&
            !loom_blas_core_is_avx2(NULL),
        "other cores and no name are not");
  CHECK(loom_blas_advise_coretype("Zen", 1, NULL), "Zen on an AVX-512 CPU, no choice made: advise");
  CHECK(loom_blas_advise_coretype("Haswell", 1, ""), "an empty OPENBLAS_CORETYPE is no choice");
  CHECK(!loom_blas_advise_coretype("Zen", 1, "Zen"), "the user kept Zen: quiet");
  CHECK(!loom_blas_advise_coretype("Zen", 1, "SkylakeX"), "the user chose a core: quiet");
  CHECK(!loom_blas_advise_coretype("Zen", 0, NULL),
        "no AVX-512: the AVX2 kernels are the right ones");
  CHECK(!loom_blas_advise_coretype("SkylakeX", 1, NULL), "already AVX-512 kernels: quiet");
  CHECK(!loom_blas_advise_coretype("unknown", 1, NULL), "a BLAS that does not say: quiet");
  // With OpenBLAS (configure found openblas_get_corename) the name is a real core.
  const char *core = loom_blas_core();
  CHECK(core && core[0], "the core name is never empty");
#ifdef HAVE_OPENBLAS_GET_CORENAME
  CHECK(strcmp(core, "unknown") != 0, "OpenBLAS names its core, got %s", core);
#endif
  return check_exit("test_blas_check");
}
