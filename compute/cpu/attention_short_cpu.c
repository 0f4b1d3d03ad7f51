/* attention_short_cpu.c — core attention of short packed sequences on the CPU: strips of six query
 * rows against the whole key range, with register-blocked FMA micro-kernels instead of BLAS. */
#include "config.h"
#include "attention_short_cpu.h"

#include <math.h>
#include <string.h>

#include "simd.h"
#include "vec8.h"

// Why: the documents of a packed batch are short (~100 tokens in train_gpt's default corpus).
// Tiled FlashAttention-2 on BLAS spends most of its time on small-call overheads (packing every
// 64 x 64 tile again), on the masked half of the diagonal tiles, and on the elementwise passes
// between the calls: it ran at ~0.4 of the sgemm rate. Here a strip of 6 query rows meets all the
// keys it sees at once (K and V of the sequence are packed once per head, transposed where the
// micro-kernel wants it), so the causal waste is a 6 x 16 corner per strip, the softmax is exact
// in one pass (no running maximum), and nothing leaves L1/L2 between the products.
//
// The micro-kernels keep a 6 x 16 block of C in twelve 8-wide accumulators. They are compiled
// with contraction on (multiply-add fused where the clone has FMA, like the BLAS they replace):
// the x86-64-v3 and v4 clones give the same bits, the baseline clone (no FMA) differs in the
// last bits, as BLAS kernels do between machines. Everything else here is lane-wise IEEE.
#if defined(__GNUC__) && !defined(__clang__)
#define LOOM_CONTRACT __attribute__((optimize("fp-contract=fast")))
#else
#define LOOM_CONTRACT
#endif

#define STRIP LOOM_ATTN_STRIP // the micro-kernels below are written for 6

static int round16(int n) {
  return (n + 15) & ~15;
}

int loom_attn_short_max = LOOM_ATTN_SHORT_MAX;

int loom_cpu_attn_short_ok(int D, int lk) {
  return D > 0 && D % 16 == 0 && lk <= loom_attn_short_max;
}

size_t loom_cpu_attn_short_ws(int D, int lk_max) {
  const size_t lkp = (size_t)round16(lk_max > 0 ? lk_max : 1);
  return 2 * (size_t)D * lkp + 2 * STRIP * lkp + 3 * (size_t)STRIP * D; // the backward's needs
}

// ---------------------------------------------------------------------------------------------
// Micro-kernels.

// c (6 x n, row stride ldc) = a (6 x k, row stride lda) . b (k x n, row stride ldb); n % 16 == 0.
LOOM_CPU_CLONES LOOM_CONTRACT static void strip_matmul(int n, int k, const float *a, int64_t lda,
                                                       const float *b, int64_t ldb, float *c,
                                                       int64_t ldc) {
  const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda, *a4 = a + 4 * lda,
              *a5 = a + 5 * lda;
  for (int j = 0; j < n; j += 16) {
    vf c00 = vf_splat(0.0f), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
       c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *bp = b + j;
    for (int t = 0; t < k; t++, bp += ldb) {
      const vf b0 = vf_load(bp), b1 = vf_load(bp + 8);
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
    vf_store(cp, c00);
    vf_store(cp + 8, c01);
    vf_store(cp + ldc, c10);
    vf_store(cp + ldc + 8, c11);
    vf_store(cp + 2 * ldc, c20);
    vf_store(cp + 2 * ldc + 8, c21);
    vf_store(cp + 3 * ldc, c30);
    vf_store(cp + 3 * ldc + 8, c31);
    vf_store(cp + 4 * ldc, c40);
    vf_store(cp + 4 * ldc + 8, c41);
    vf_store(cp + 5 * ldc, c50);
    vf_store(cp + 5 * ldc + 8, c51);
  }
}

// c (m x n, row stride ldc) += a^T b: a (6 x m, row stride lda), b (6 x n, row stride ldb);
// n % 16 == 0. The six 16-column pieces of b stay in registers while c streams past.
LOOM_CPU_CLONES LOOM_CONTRACT static void strip_rank_update(int m, int n, const float *a,
                                                            int64_t lda, const float *b,
                                                            int64_t ldb, float *c, int64_t ldc) {
  for (int j = 0; j < n; j += 16) {
    const vf b00 = vf_load(b + j), b01 = vf_load(b + j + 8), b10 = vf_load(b + ldb + j),
             b11 = vf_load(b + ldb + j + 8), b20 = vf_load(b + 2 * ldb + j),
             b21 = vf_load(b + 2 * ldb + j + 8), b30 = vf_load(b + 3 * ldb + j),
             b31 = vf_load(b + 3 * ldb + j + 8), b40 = vf_load(b + 4 * ldb + j),
             b41 = vf_load(b + 4 * ldb + j + 8), b50 = vf_load(b + 5 * ldb + j),
             b51 = vf_load(b + 5 * ldb + j + 8);
    for (int i = 0; i < m; i++) {
      float *cp = c + (int64_t)i * ldc + j;
      vf c0 = vf_load(cp), c1 = vf_load(cp + 8);
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
      vf_store(cp, c0);
      vf_store(cp + 8, c1);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

// The 8 x 8 block at rows r[0..7] (8 floats each) transposed into out[0..7] with shuffles
// (unpack pairs, then pairs of pairs, then halves): no scalar gathers. __builtin_shufflevector
// is in GCC >= 12 and clang.
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define HAVE_SHUFFLEVECTOR 1
static inline void transpose8(const vf r[8], vf out[8]) {
  vf t[8], u[8];
  for (int i = 0; i < 8; i += 2) { // pairs of rows interleaved: columns 0 1 4 5, then 2 3 6 7
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) { // u[i + c] holds columns c and c + 4 of 4 rows
    u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int c = 0; c < 4; c++) {
    out[c] = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    out[c + 4] = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}
#endif

// kt (D x lkp) = the lk rows of one head of a packed tensor (row stride ld), transposed; the
// columns lk..lkp-1 are zero. Blocks of 8 rows x 8 columns go through registers (D % 16 == 0).
LOOM_CPU_CLONES
static void pack_transposed(float *kt, int lkp, const float *k, int64_t ld, int lk, int D) {
  int j = 0;
#ifdef HAVE_SHUFFLEVECTOR // else every column goes the scalar way below
  for (; j + 8 <= lk; j += 8) {
    const float *r0 = k + j * ld;
    for (int d = 0; d < D; d += 8) {
      vf r[8], c[8];
      for (int i = 0; i < 8; i++) {
        r[i] = vf_load(r0 + i * ld + d);
      }
      transpose8(r, c);
      for (int i = 0; i < 8; i++) {
        vf_store(kt + (int64_t)(d + i) * lkp + j, c[i]);
      }
    }
  }
#endif
  for (int d = 0; d < D; d++) {
    float *row = kt + (int64_t)d * lkp;
    for (int jj = j; jj < lkp; jj++) {
      row[jj] = jj < lk ? k[(int64_t)jj * ld + d] : 0.0f;
    }
  }
}

// dst (STRIP x D, contiguous) = `rows` rows of src (row stride ld), then zero rows.
static void load_strip(float *dst, const float *src, int64_t ld, int rows, int D) {
  for (int r = 0; r < STRIP; r++) {
    if (r < rows) {
      memcpy(dst + (int64_t)r * D, src + r * ld, (size_t)D * sizeof(float));
    } else {
      memset(dst + (int64_t)r * D, 0, (size_t)D * sizeof(float));
    }
  }
}

// The geometry of a strip: its first row i0, `rows` rows, and the keys [0, kend) its last row
// sees; row r sees [0, row_end(r)). Causal is bottom-right aligned (see attention_cpu.h).
typedef struct strip {
  int i0, rows, kend, causal, shift; // shift = lk - lq
} strip_t;

static int row_end(const strip_t *st, int r) {
  int e = st->i0 + r + st->shift + 1;
  return st->causal && e < st->kend ? e : st->kend;
}

static strip_t make_strip(int i0, int lq, int lk, int causal) {
  strip_t st = {i0, lq - i0 < STRIP ? lq - i0 : STRIP, lk, causal, lk - lq};
  if (causal && i0 + st.rows + st.shift < lk) {
    st.kend = i0 + st.rows + st.shift;
  }
  return st;
}

// Rows of the strip past its last real row: zero over the keys, so that they add nothing.
static void zero_pad_rows(float *s, int lds, const strip_t *st) {
  for (int r = st->rows; r < STRIP; r++) {
    memset(s + (int64_t)r * lds, 0, (size_t)st->kend * sizeof(float));
  }
}

// -inf from the row's end up to the next multiple of 8 past kend: the vector loops' range.
static void mask_row(float *sr, int e, int kend) {
  for (int c = e; c < round8(kend); c++) {
    sr[c] = -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward: S = Q K^T for the strip (K packed transposed per key head), an exact softmax per row
// in base 2, O = P V / l with V read in place.

LOOM_CPU_CLONES
static void softmax_rows(float *s, int lds, const strip_t *st, float s2, float *m, float *l) {
  const int pad = round8(st->kend);
  for (int r = 0; r < st->rows; r++) {
    float *sr = s + (int64_t)r * lds;
    mask_row(sr, row_end(st, r), st->kend);
    const vf sc = vf_splat(s2);
    vf m0 = vf_load(sr) * sc;
    for (int c = 8; c < pad; c += 8) {
      m0 = vf_max(m0, vf_load(sr + c) * sc);
    }
    const float mx = vf_hmax(m0); // finite: every live row sees key 0
    const vf mv = vf_splat(mx);
    vf acc = vf_splat(0.0f);
    for (int c = 0; c < pad; c += 8) {
      vf p = vf_exp2(vf_load(sr + c) * sc - mv);
      acc += p;
      vf_store(sr + c, p);
    }
    m[r] = mx;
    l[r] = vf_hsum(acc); // >= 1: the maximum contributes 2^0
  }
  zero_pad_rows(s, lds, st);
}

void loom_cpu_attn_short_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                             int64_t ldq, int64_t ldk, int64_t lse_stride, int lq, int lk, int H,
                             int H_kv, int D, int causal, float s2, float *ws) {
  const int lkp = round16(lk > 0 ? lk : 1), group = H / H_kv;
  float *kt = ws, *s = kt + (int64_t)D * lkp, *qs = s + (int64_t)STRIP * lkp, *os = qs + STRIP * D;
  const int i_first = loom_cpu_attn_first_live_row(causal, lq, lk);
  for (int h = 0; h < H; h++) {
    const int64_t g = h / group;
    if (h % group == 0 && lk > 0) {
      pack_transposed(kt, lkp, k + g * D, ldk, lk, D);
    }
    float *oh = out + (int64_t)h * D, *lh = lse + h * lse_stride;
    const float *qh = q + (int64_t)h * D, *vh = v + g * D;
    for (int i = 0; i < i_first; i++) {
      memset(oh + i * ldq, 0, (size_t)D * sizeof(float));
      lh[i] = -INFINITY;
    }
    for (int i0 = i_first; i0 < lq; i0 += STRIP) {
      const strip_t st = make_strip(i0, lq, lk, causal);
      float m[STRIP], l[STRIP];
      load_strip(qs, qh + i0 * ldq, ldq, st.rows, D);
      strip_matmul(round16(st.kend), D, qs, D, kt, lkp, s, lkp);
      softmax_rows(s, lkp, &st, s2, m, l);
      strip_matmul(D, st.kend, s, lkp, vh, ldk, os, D);
      for (int r = 0; r < st.rows; r++) {
        const float inv = 1.0f / l[r];
        float *orow = oh + (i0 + r) * ldq;
        for (int d = 0; d < D; d++) {
          orow[d] = os[r * D + d] * inv;
        }
        lh[i0 + r] = (m[r] + log2f(l[r])) * LN2;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward: per key head, K^T and V^T packed once; per query head of the group and strip,
// P = 2^(S2 - lse2), dP = dO V^T, dS = scale P (dP - Di), then dV += P^T dO, dQ = dS K,
// dK += dS^T Q, with dK and dV accumulated in place (the caller zeroes them).

LOOM_CPU_CLONES
static void grad_scores(float *s, float *dp, int lds, const strip_t *st, const float *lse,
                        const float *di, float s2, float scale) {
  const int pad = round8(st->kend);
  for (int r = 0; r < st->rows; r++) {
    float *sr = s + (int64_t)r * lds, *dr = dp + (int64_t)r * lds;
    mask_row(sr, row_end(st, r), st->kend);
    const float l2 = lse[st->i0 + r] * LOG2E;
    const vf lv = vf_splat(l2 == -INFINITY ? INFINITY : l2), sc = vf_splat(s2);
    const vf dv = vf_splat(di[st->i0 + r]), scv = vf_splat(scale);
    for (int c = 0; c < pad; c += 8) {
      vf p = vf_exp2(vf_load(sr + c) * sc - lv);
      vf_store(sr + c, p);
      vf_store(dr + c, p * (vf_load(dr + c) - dv) * scv);
    }
  }
  zero_pad_rows(s, lds, st);
  zero_pad_rows(dp, lds, st);
}

void loom_cpu_attn_short_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *lse, const float *di,
                             int64_t ldq, int64_t ldk, int64_t lse_stride, int lq, int lk, int H,
                             int H_kv, int D, int causal, float scale, float s2, float *ws) {
  const int lkp = round16(lk > 0 ? lk : 1), group = H / H_kv;
  float *kt = ws, *vt = kt + (int64_t)D * lkp, *s = vt + (int64_t)D * lkp;
  float *dp = s + (int64_t)STRIP * lkp, *qs = dp + (int64_t)STRIP * lkp, *dos = qs + STRIP * D;
  float *dqs = dos + STRIP * D;
  const int i_first = loom_cpu_attn_first_live_row(causal, lq, lk);
  for (int g = 0; g < H_kv; g++) {
    if (lk > 0) {
      pack_transposed(kt, lkp, k + (int64_t)g * D, ldk, lk, D);
      pack_transposed(vt, lkp, v + (int64_t)g * D, ldk, lk, D);
    }
    const float *kg = k + (int64_t)g * D;
    float *dkg = dk + (int64_t)g * D, *dvg = dv + (int64_t)g * D;
    for (int h = g * group; h < (g + 1) * group; h++) { // a fixed order: deterministic sums
      const float *qh = q + (int64_t)h * D, *doh = dout + (int64_t)h * D;
      const float *lh = lse + h * lse_stride, *dih = di + h * lse_stride;
      float *dqh = dq + (int64_t)h * D;
      for (int i = 0; i < i_first; i++) {
        memset(dqh + i * ldq, 0, (size_t)D * sizeof(float));
      }
      for (int i0 = i_first; i0 < lq; i0 += STRIP) {
        const strip_t st = make_strip(i0, lq, lk, causal);
        const int ncols = round16(st.kend);
        load_strip(qs, qh + i0 * ldq, ldq, st.rows, D);
        load_strip(dos, doh + i0 * ldq, ldq, st.rows, D);
        strip_matmul(ncols, D, qs, D, kt, lkp, s, lkp);
        strip_matmul(ncols, D, dos, D, vt, lkp, dp, lkp);
        grad_scores(s, dp, lkp, &st, lh, dih, s2, scale);
        strip_rank_update(st.kend, D, s, lkp, dos, D, dvg, ldk);
        strip_matmul(D, st.kend, dp, lkp, kg, ldk, dqs, D);
        strip_rank_update(st.kend, D, dp, lkp, qs, D, dkg, ldk);
        for (int r = 0; r < st.rows; r++) {
          memcpy(dqh + (i0 + r) * ldq, dqs + r * D, (size_t)D * sizeof(float));
        }
      }
    }
  }
}
