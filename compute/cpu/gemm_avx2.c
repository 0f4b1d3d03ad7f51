/* gemm_avx2.c — loom's own f32 GEMM for AVX2 + FMA cores (Haswell, Zen): BLIS-style loops around a
 * 6 x 16 register micro-kernel; a is read where it lies, op(b) is packed 256 x 1024 at a time. */
#include "config.h"
#include "gemm_avx2.h"

#include "blas_check.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOOM_GEMM_AVX2 1
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#endif

#ifdef LOOM_GEMM_AVX2

// Why a is not packed: in train_gpt's products a is the activations, (tokens, features), read
// once per 16 columns of c, while b is a weight; OpenBLAS copies both, and at width 256 its
// copies took 6.5% of a step. Reading a in place, six rows at a time, the kernel ran the
// forward and input-gradient shapes 5-10% faster than OpenBLAS's Haswell sgemm on a Zen 5 core,
// and 1024^3 at the same rate (README, "loom's own GEMM"). a^T products (weight gradients) stay
// with the BLAS: a column of a is not contiguous, and reading it in place ran at 0.61-0.93 of
// OpenBLAS (packed into 6-row panels, 0.80-0.91).
//
// Blocking: a micro-tile is MR x NR of c in 12 ymm accumulators; a panel of packed b (KC x NR,
// 16 KiB) stays in L1 while MC rows of a (96 KiB) pass over it from L2; KC x NC of b is packed
// at a time (1 MiB, per thread). MC is a multiple of MR.
enum { MR = 6, NR = 16, KC = 256, MC = 96, NC = 1024 };

#define LOOM_AVX2_FMA __attribute__((target("avx2,fma")))

// How a micro-tile's sums land in c: c = alpha * sum + beta * cin (+ bias), where beta == 0 does
// not read cin. The first KC block of a product applies beta and the bias, with cin the caller's
// (c itself, or a residual to add); later ones add to c (cin = c, beta = 1).
typedef struct {
  float alpha, beta;
  const float *bias; // bias of the tile's first column, or NULL
  const float *cin;  // the tile's first element of cin, read when beta != 0
  int64_t ldcin;     // cin's row stride
} epilogue_t;

// One row of a full tile: c[0..16) from its two accumulators and cin[0..16).
LOOM_AVX2_FMA static inline __attribute__((always_inline)) void
store_row(float *c, const float *cin, __m256 lo, __m256 hi, const epilogue_t *e) {
  if (e->alpha != 1.0f) {
    const __m256 alpha = _mm256_set1_ps(e->alpha);
    lo = _mm256_mul_ps(lo, alpha);
    hi = _mm256_mul_ps(hi, alpha);
  }
  if (e->beta != 0.0f) {
    const __m256 beta = _mm256_set1_ps(e->beta);
    lo = _mm256_fmadd_ps(beta, _mm256_loadu_ps(cin), lo);
    hi = _mm256_fmadd_ps(beta, _mm256_loadu_ps(cin + 8), hi);
  }
  if (e->bias) {
    lo = _mm256_add_ps(lo, _mm256_loadu_ps(e->bias));
    hi = _mm256_add_ps(hi, _mm256_loadu_ps(e->bias + 8));
  }
  _mm256_storeu_ps(c, lo);
  _mm256_storeu_ps(c + 8, hi);
}

// c (6 x 16, row stride ldc) <- the epilogue of a (6 x kc, row stride lda) @ bp (kc x 16,
// packed): twelve 8-wide accumulators, two loads of b and six broadcasts of a per k. Written
// out row by row: with the accumulators in arrays and loops over the rows, GCC 12 kept them on
// the stack.
LOOM_AVX2_FMA static void kernel_rows(int64_t kc, const float *a, int64_t lda,
                                      const float *restrict bp, float *c, int64_t ldc,
                                      const epilogue_t *e) {
  for (int r = 0; r < MR; r++) { // c's rows arrive while the sums run (16 floats: 1 or 2 lines)
    _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + r * ldc + NR - 1), _MM_HINT_T0);
  }
  if (e->beta != 0.0f && e->cin != c) { // and a residual's
    for (int r = 0; r < MR; r++) {
      _mm_prefetch((const char *)(e->cin + r * e->ldcin), _MM_HINT_T0);
      _mm_prefetch((const char *)(e->cin + r * e->ldcin + NR - 1), _MM_HINT_T0);
    }
  }
  const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda;
  const float *a5 = a + 5 * lda;
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  // Unrolled 8 times: 4-10% faster than not unrolled on train_gpt's shapes (Zen 5, GCC 12).
#pragma GCC unroll 8
  for (int64_t k = 0; k < kc; k++) {
    const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
    bp += NR;
    __m256 x = _mm256_broadcast_ss(a0 + k);
    c00 = _mm256_fmadd_ps(x, b0, c00);
    c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a1 + k);
    c10 = _mm256_fmadd_ps(x, b0, c10);
    c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a2 + k);
    c20 = _mm256_fmadd_ps(x, b0, c20);
    c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a3 + k);
    c30 = _mm256_fmadd_ps(x, b0, c30);
    c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a4 + k);
    c40 = _mm256_fmadd_ps(x, b0, c40);
    c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a5 + k);
    c50 = _mm256_fmadd_ps(x, b0, c50);
    c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  const float *cin = e->cin;
  const int64_t ldi = e->ldcin;
  store_row(c, cin, c00, c01, e);
  store_row(c + ldc, cin + ldi, c10, c11, e);
  store_row(c + 2 * ldc, cin + 2 * ldi, c20, c21, e);
  store_row(c + 3 * ldc, cin + 3 * ldi, c30, c31, e);
  store_row(c + 4 * ldc, cin + 4 * ldi, c40, c41, e);
  store_row(c + 5 * ldc, cin + 5 * ldi, c50, c51, e);
}

// A tile at the bottom or right edge: mr <= 6 rows of a (row stride lda), nr <= 16 columns of c
// (the panel is zero beyond them). Missing rows read the last real one; the full tile goes to a
// local buffer, and the valid part gets the epilogue with store_row's operations.
LOOM_AVX2_FMA static void kernel_edge(int64_t kc, const float *a, int64_t lda, int64_t mr,
                                      const float *bp, int64_t nr, float *c, int64_t ldc,
                                      const epilogue_t *e) {
  float tile[MR * NR];
  const epilogue_t plain = {1.0f, 0.0f, NULL, NULL, 0};
  // Six rows from mr: a tile of rows [r0, r0 + 6) where every row past mr - 1 repeats it.
  if (mr == MR) {
    kernel_rows(kc, a, lda, bp, tile, NR, &plain);
  } else {
    float rows[MR * KC];
    for (int64_t r = 0; r < MR; r++) {
      const float *src = a + (r < mr ? r : mr - 1) * lda;
      for (int64_t k = 0; k < kc; k++) {
        rows[r * KC + k] = src[k];
      }
    }
    kernel_rows(kc, rows, KC, bp, tile, NR, &plain);
  }
  for (int64_t r = 0; r < mr; r++) {
    float *crow = c + r * ldc;
    const float *cinrow = e->cin + r * e->ldcin;
    for (int64_t j = 0; j < nr; j++) {
      float x = e->alpha != 1.0f ? tile[r * NR + j] * e->alpha : tile[r * NR + j];
      x = e->beta != 0.0f ? fmaf(e->beta, cinrow[j], x) : x;
      crow[j] = e->bias ? x + e->bias[j] : x;
    }
  }
}

// dst[k * NR + x] = src[x * lds + k] for x, k < 8: an 8 x 8 transpose in registers.
LOOM_AVX2_FMA static inline __attribute__((always_inline)) void
transpose_8x8(const float *src, int64_t lds, float *dst) {
  __m256 r[8], t[8];
  for (int x = 0; x < 8; x++) {
    r[x] = _mm256_loadu_ps(src + x * lds);
  }
  for (int x = 0; x < 8; x += 2) { // rows x, x+1 interleaved: (x,0) (x+1,0) (x,1) (x+1,1) | 4, 5
    t[x] = _mm256_unpacklo_ps(r[x], r[x + 1]);
    t[x + 1] = _mm256_unpackhi_ps(r[x], r[x + 1]);
  }
  for (int x = 0; x < 8; x += 4) { // r[x + j]: element j (low half) and j + 4 of rows x..x+3
    r[x] = _mm256_shuffle_ps(t[x], t[x + 2], 0x44);
    r[x + 1] = _mm256_shuffle_ps(t[x], t[x + 2], 0xee);
    r[x + 2] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0x44);
    r[x + 3] = _mm256_shuffle_ps(t[x + 1], t[x + 3], 0xee);
  }
  for (int j = 0; j < 4; j++) { // element j, then j + 4, of all eight rows
    _mm256_storeu_ps(dst + j * NR, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
    _mm256_storeu_ps(dst + (j + 4) * NR, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
  }
}

// Pack op(b)[k0 .. k0+kc, n0 .. n0+nc) into panels of NR columns, kc x NR each, panel p (column
// p * NR of the block) at bp + p * NR * kc; columns past nc are zero. With trans_b, b is (N, K)
// and op(b)[k, n] = b[n, k]: full panels are transposed 8 x 8 at a time.
LOOM_AVX2_FMA static void pack_b(int trans_b, const float *b, int64_t ldb, int64_t k0, int64_t kc,
                                 int64_t n0, int64_t nc, float *restrict bp) {
  for (int64_t p = 0; p < nc; p += NR) {
    const int64_t w = nc - p < NR ? nc - p : NR;
    float *restrict dst = bp + p * kc;
    int64_t k = 0;
    if (w == NR && trans_b) {
      const float *src = b + (n0 + p) * ldb + k0;
      for (; k + 8 <= kc; k += 8) {
        transpose_8x8(src + k, ldb, dst + k * NR);
        transpose_8x8(src + 8 * ldb + k, ldb, dst + k * NR + 8);
      }
    } else if (w == NR) { // 16 contiguous floats of row k0 + k
      for (; k < kc; k++) {
        const float *src = b + (k0 + k) * ldb + n0 + p;
        _mm256_store_ps(dst + k * NR, _mm256_loadu_ps(src));
        _mm256_store_ps(dst + k * NR + 8, _mm256_loadu_ps(src + 8));
      }
    }
    for (; k < kc; k++) { // a partial panel, or the last kc % 8 rows of a transposed one
      for (int64_t x = 0; x < NR; x++) {
        dst[k * NR + x] = x >= w    ? 0.0f
                          : trans_b ? b[(n0 + p + x) * ldb + k0 + k]
                                    : b[(k0 + k) * ldb + n0 + p + x];
      }
    }
  }
}

// The packing buffer: KC x NC floats per thread, allocated on a thread's first product and
// freed when the thread exits.
static pthread_key_t pack_key;
static pthread_once_t pack_once = PTHREAD_ONCE_INIT;
static int pack_key_made;

static void make_pack_key(void) {
  pack_key_made = pthread_key_create(&pack_key, free) == 0;
}

static float *pack_buffer(void) {
  if (pthread_once(&pack_once, make_pack_key) != 0 || !pack_key_made) {
    return NULL;
  }
  float *buf = pthread_getspecific(pack_key);
  if (!buf) {
    buf = aligned_alloc(64, (size_t)KC * NC * sizeof(float));
    if (buf && pthread_setspecific(pack_key, buf) != 0) {
      free(buf);
      buf = NULL;
    }
  }
  return buf;
}

int loom_cpu_gemm_avx2_ok(void) {
  return loom_cpu_has_avx2_fma();
}

LOOM_AVX2_FMA int loom_cpu_gemm_avx2_into(int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                                          const float *a, int64_t lda, const float *b, int64_t ldb,
                                          const float *bias, float beta, const float *cin,
                                          int64_t ldcin, float *c, int64_t ldc) {
  float *bp = pack_buffer();
  if (!bp) {
    return -1;
  }
  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = N - jc < NC ? N - jc : NC;
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = K - pc < KC ? K - pc : KC;
      pack_b(trans_b, b, ldb, pc, kc, jc, nc, bp);
      for (int64_t ic = 0; ic < M; ic += MC) {
        const int64_t mc = M - ic < MC ? M - ic : MC;
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int64_t nr = nc - jr < NR ? nc - jr : NR;
          const float *panel = bp + jr * kc;
          epilogue_t e = {alpha, pc == 0 ? beta : 1.0f, pc == 0 && bias ? bias + jc + jr : NULL,
                          NULL, pc == 0 ? ldcin : ldc};
          for (int64_t ir = ic; ir < ic + mc; ir += MR) {
            const int64_t mr = ic + mc - ir < MR ? ic + mc - ir : MR;
            const float *atile = a + ir * lda + pc;
            float *ctile = c + ir * ldc + jc + jr;
            e.cin = pc == 0 ? cin + ir * ldcin + jc + jr : ctile;
            if (mr == MR && nr == NR) {
              kernel_rows(kc, atile, lda, panel, ctile, ldc, &e);
            } else {
              kernel_edge(kc, atile, lda, mr, panel, nr, ctile, ldc, &e);
            }
          }
        }
      }
    }
  }
  return 0;
}

#else // not x86-64 with GCC or Clang: the BLAS runs every product

int loom_cpu_gemm_avx2_ok(void) {
  return 0;
}

int loom_cpu_gemm_avx2_into(int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                            const float *a, int64_t lda, const float *b, int64_t ldb,
                            const float *bias, float beta, const float *cin, int64_t ldcin,
                            float *c, int64_t ldc) {
  (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb;
  (void)bias, (void)beta, (void)cin, (void)ldcin, (void)c, (void)ldc;
  return -1;
}

#endif

int loom_cpu_gemm_avx2(int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, const float *bias, float beta,
                       float *c, int64_t ldc) {
  return loom_cpu_gemm_avx2_into(trans_b, M, N, K, alpha, a, lda, b, ldb, bias, beta, c, ldc, c,
                                 ldc);
}
