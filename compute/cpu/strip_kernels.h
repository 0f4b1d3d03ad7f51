/* strip_kernels.h — the short attention path's two micro-kernels, written once for a vector type
 * of SK_W floats; attention_short_cpu.c includes it per width (8: AVX2, 16: AVX-512). */

// The includer defines SK_VEC (vector type), SK_W (its floats), SK_SUFFIX (name suffix), SK_ATTR
// (the kernels' attributes: target clones or a target) and SK_HELPER_ATTR (the helpers'), and
// LOOM_CONTRACT. The kernels hold a 6 x 2 SK_W block of C in twelve accumulators and finish an
// n that is a multiple of SK_W but not of 2 SK_W with a 6 x SK_W block. Every element of C is one
// chain of multiply-adds in the order of k (rank updates: in the order of the six rows) whatever
// the width, so both widths give the same bits. No include guard: included once per width.
#define SK_CAT_(a, b) a##_##b
#define SK_CAT(a, b)  SK_CAT_(a, b)
#define SK_FN(name)   SK_CAT(name, SK_SUFFIX)

SK_HELPER_ATTR static inline SK_VEC SK_FN(sk_load)(const float *p) {
  SK_VEC x;
  memcpy(&x, p, sizeof x);
  return x;
}

SK_HELPER_ATTR static inline void SK_FN(sk_store)(float *p, SK_VEC x) {
  memcpy(p, &x, sizeof x);
}

// c (6 x n, row stride ldc) = a (6 x k, row stride lda) . b (k x n, row stride ldb); n % SK_W == 0.
SK_ATTR LOOM_CONTRACT static void SK_FN(strip_matmul)(int n, int k, const float *a, int64_t lda,
                                                      const float *b, int64_t ldb, float *c,
                                                      int64_t ldc) {
  const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda,
              *a5 = a + 5 * lda;
  const SK_VEC zero = {0};
  int j = 0;
  for (; j + 2 * SK_W <= n; j += 2 * SK_W) {
    SK_VEC c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero,
           c31 = zero, c40 = zero, c41 = zero, c50 = zero, c51 = zero;
    const float *bp = b + j;
    for (int t = 0; t < k; t++, bp += ldb) {
      const SK_VEC b0 = SK_FN(sk_load)(bp), b1 = SK_FN(sk_load)(bp + SK_W);
      c00 += a0[t] * b0; // scalar * vector: one broadcast (an initializer list is
      c01 += a0[t] * b1; // built lane by lane by GCC 12)
      c10 += a1[t] * b0;
      c11 += a1[t] * b1;
      c20 += a2[t] * b0;
      c21 += a2[t] * b1;
      c30 += a3[t] * b0;
      c31 += a3[t] * b1;
      c40 += a4[t] * b0;
      c41 += a4[t] * b1;
      c50 += a5[t] * b0;
      c51 += a5[t] * b1;
    }
    float *cp = c + j;
    SK_FN(sk_store)(cp, c00);
    SK_FN(sk_store)(cp + SK_W, c01);
    SK_FN(sk_store)(cp + ldc, c10);
    SK_FN(sk_store)(cp + ldc + SK_W, c11);
    SK_FN(sk_store)(cp + 2 * ldc, c20);
    SK_FN(sk_store)(cp + 2 * ldc + SK_W, c21);
    SK_FN(sk_store)(cp + 3 * ldc, c30);
    SK_FN(sk_store)(cp + 3 * ldc + SK_W, c31);
    SK_FN(sk_store)(cp + 4 * ldc, c40);
    SK_FN(sk_store)(cp + 4 * ldc + SK_W, c41);
    SK_FN(sk_store)(cp + 5 * ldc, c50);
    SK_FN(sk_store)(cp + 5 * ldc + SK_W, c51);
  }
  for (; j < n; j += SK_W) { // the last SK_W columns when n is an odd multiple of SK_W
    SK_VEC c0 = zero, c1 = zero, c2 = zero, c3 = zero, c4 = zero, c5 = zero;
    const float *bp = b + j;
    for (int t = 0; t < k; t++, bp += ldb) {
      const SK_VEC b0 = SK_FN(sk_load)(bp);
      c0 += a0[t] * b0;
      c1 += a1[t] * b0;
      c2 += a2[t] * b0;
      c3 += a3[t] * b0;
      c4 += a4[t] * b0;
      c5 += a5[t] * b0;
    }
    float *cp = c + j;
    SK_FN(sk_store)(cp, c0);
    SK_FN(sk_store)(cp + ldc, c1);
    SK_FN(sk_store)(cp + 2 * ldc, c2);
    SK_FN(sk_store)(cp + 3 * ldc, c3);
    SK_FN(sk_store)(cp + 4 * ldc, c4);
    SK_FN(sk_store)(cp + 5 * ldc, c5);
  }
}

// c (m x n, row stride ldc) += a^T b: a (6 x m, row stride lda), b (6 x n, row stride ldb);
// n % SK_W == 0. The six pieces of b stay in registers while c streams past.
SK_ATTR LOOM_CONTRACT static void SK_FN(strip_rank_update)(int m, int n, const float *a,
                                                           int64_t lda, const float *b, int64_t ldb,
                                                           float *c, int64_t ldc) {
  int j = 0;
  for (; j + 2 * SK_W <= n; j += 2 * SK_W) {
    const SK_VEC b00 = SK_FN(sk_load)(b + j), b01 = SK_FN(sk_load)(b + j + SK_W),
                 b10 = SK_FN(sk_load)(b + ldb + j), b11 = SK_FN(sk_load)(b + ldb + j + SK_W),
                 b20 = SK_FN(sk_load)(b + 2 * ldb + j),
                 b21 = SK_FN(sk_load)(b + 2 * ldb + j + SK_W),
                 b30 = SK_FN(sk_load)(b + 3 * ldb + j),
                 b31 = SK_FN(sk_load)(b + 3 * ldb + j + SK_W),
                 b40 = SK_FN(sk_load)(b + 4 * ldb + j),
                 b41 = SK_FN(sk_load)(b + 4 * ldb + j + SK_W),
                 b50 = SK_FN(sk_load)(b + 5 * ldb + j),
                 b51 = SK_FN(sk_load)(b + 5 * ldb + j + SK_W);
    for (int i = 0; i < m; i++) {
      float *cp = c + (int64_t)i * ldc + j;
      SK_VEC c0 = SK_FN(sk_load)(cp), c1 = SK_FN(sk_load)(cp + SK_W);
      c0 += a[i] * b00;
      c1 += a[i] * b01;
      c0 += a[lda + i] * b10;
      c1 += a[lda + i] * b11;
      c0 += a[2 * lda + i] * b20;
      c1 += a[2 * lda + i] * b21;
      c0 += a[3 * lda + i] * b30;
      c1 += a[3 * lda + i] * b31;
      c0 += a[4 * lda + i] * b40;
      c1 += a[4 * lda + i] * b41;
      c0 += a[5 * lda + i] * b50;
      c1 += a[5 * lda + i] * b51;
      SK_FN(sk_store)(cp, c0);
      SK_FN(sk_store)(cp + SK_W, c1);
    }
  }
  for (; j < n; j += SK_W) {
    const SK_VEC b0 = SK_FN(sk_load)(b + j), b1 = SK_FN(sk_load)(b + ldb + j),
                 b2 = SK_FN(sk_load)(b + 2 * ldb + j), b3 = SK_FN(sk_load)(b + 3 * ldb + j),
                 b4 = SK_FN(sk_load)(b + 4 * ldb + j), b5 = SK_FN(sk_load)(b + 5 * ldb + j);
    for (int i = 0; i < m; i++) {
      float *cp = c + (int64_t)i * ldc + j;
      SK_VEC c0 = SK_FN(sk_load)(cp);
      c0 += a[i] * b0;
      c0 += a[lda + i] * b1;
      c0 += a[2 * lda + i] * b2;
      c0 += a[3 * lda + i] * b3;
      c0 += a[4 * lda + i] * b4;
      c0 += a[5 * lda + i] * b5;
      SK_FN(sk_store)(cp, c0);
    }
  }
}

#undef SK_FN
#undef SK_CAT
#undef SK_CAT_
#undef SK_VEC
#undef SK_W
#undef SK_SUFFIX
#undef SK_ATTR
#undef SK_HELPER_ATTR
