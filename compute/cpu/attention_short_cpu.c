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
// The micro-kernels keep a 6 x 16 block of C in twelve 8-wide accumulators (6 x 32 in twelve
// 16-wide ones with AVX-512). They are compiled with contraction on (multiply-add fused where the
// target has FMA, like the BLAS they replace): the AVX-512 kernels and the x86-64-v3 and v4
// clones give the same bits, the baseline clone (no FMA) differs in the last bits, as BLAS
// kernels do between machines. Everything else here is lane-wise IEEE.
#define STRIP LOOM_ATTN_STRIP // the micro-kernels below are written for 6

static int round16(int n) {
  return (n + 15) & ~15;
}

int loom_attn_short_max = 0;

int loom_cpu_attn_short_ok(int D, int lk) {
  return D > 0 && D % 16 == 0 && lk <= loom_cpu_attn_short_limit();
}

size_t loom_cpu_attn_short_ws(int D, int lk_max) {
  const size_t lkp = (size_t)round16(lk_max > 0 ? lk_max : 1);
  return 2 * (size_t)D * lkp + 2 * STRIP * lkp + 3 * (size_t)STRIP * D; // the backward's needs
}

// ---------------------------------------------------------------------------------------------
// Micro-kernels (strip_kernels.h): 8-wide in target clones (AVX2 with FMA, or the baseline), and
// 16-wide for CPUs with AVX-512, whose cores with 512-bit FMA units (Intel server cores, AMD Zen
// 5) do twice the multiply-adds per cycle of the 8-wide ones. The two widths give the same bits.

#define SK_VEC    vf
#define SK_W      8
#define SK_SUFFIX w8
#define SK_ATTR   LOOM_CPU_CLONES
#define SK_HELPER_ATTR
#include "strip_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__has_attribute)
#if __has_attribute(target)
#define HAVE_KERNELS_W16 1
typedef float vf16 __attribute__((vector_size(64)));
#define SK_VEC         vf16
#define SK_W           16
#define SK_SUFFIX      w16
#define SK_ATTR        __attribute__((target("avx512f")))
#define SK_HELPER_ATTR __attribute__((target("avx512f")))
#include "strip_kernels.h"
#endif
#endif

int loom_attn_vector_width = 0;

typedef void (*strip_matmul_fn)(int n, int k, const float *a, int64_t lda, const float *b,
                                int64_t ldb, float *c, int64_t ldc);
typedef void (*strip_rank_update_fn)(int m, int n, const float *a, int64_t lda, const float *b,
                                     int64_t ldb, float *c, int64_t ldc);
typedef struct kernels {
  strip_matmul_fn matmul;
  strip_rank_update_fn rank_update;
} kernels_t;

int loom_cpu_attn_vector_width(void) {
#ifdef HAVE_KERNELS_W16
  __builtin_cpu_init();
  const int avx512 = __builtin_cpu_supports("avx512f");
#else
  const int avx512 = 0;
#endif
  return loom_attn_vector_width == 8 || !avx512 ? 8 : 16;
}

int loom_cpu_attn_short_limit(void) {
  if (loom_attn_short_max != 0) {
    return loom_attn_short_max;
  }
  return loom_cpu_attn_vector_width() == 16 ? LOOM_ATTN_SHORT_MAX_WIDE : LOOM_ATTN_SHORT_MAX;
}

static kernels_t pick_kernels(void) {
#ifdef HAVE_KERNELS_W16
  if (loom_cpu_attn_vector_width() == 16) {
    return (kernels_t){strip_matmul_w16, strip_rank_update_w16};
  }
#endif
  return (kernels_t){strip_matmul_w8, strip_rank_update_w8};
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

// Ask for rows [r0, r1) of src (row stride ld, D floats each) ahead of their use: the next block
// of K or V rows to transpose and the next strip's rows of q and dO. The backward reads them from
// memory (cold since the forward). `perf` on a train_gpt step: pack_transposed 1.08% without,
// 0.71% with; libc's copies (after the residual fusion, mostly these strips) 0.55% and 0.35%.
static inline void prefetch_rows(const float *src, int64_t ld, int r0, int r1, int D) {
  for (int r = r0; r < r1; r++) {
    for (int d = 0; d < D; d += 16) {
      __builtin_prefetch(src + r * ld + d);
    }
  }
}

// kt (D x lkp) = the lk rows of one head of a packed tensor (row stride ld), transposed; the
// columns lk..lkp-1 are zero. Blocks of 8 rows x 8 columns go through registers (D % 16 == 0);
// the last block of fewer than 8 rows is completed with zero rows.
LOOM_CPU_CLONES
static void pack_transposed(float *kt, int lkp, const float *k, int64_t ld, int lk, int D) {
  int j = 0;
#ifdef HAVE_SHUFFLEVECTOR // else every column goes the scalar way below
  for (; j < lk; j += 8) {
    const float *r0 = k + j * ld;
    const int rows = lk - j < 8 ? lk - j : 8;
    prefetch_rows(k, ld, j + 8, j + 16 < lk ? j + 16 : lk, D); // the next block's rows
    for (int d = 0; d < D; d += 8) {
      vf r[8], c[8];
      for (int i = 0; i < 8; i++) {
        r[i] = i < rows ? vf_load(r0 + i * ld + d) : vf_splat(0.0f);
      }
      transpose8(r, c);
      for (int i = 0; i < 8; i++) {
        vf_store(kt + (int64_t)(d + i) * lkp + j, c[i]);
      }
    }
  }
  for (; j < lkp; j += 8) { // lkp = round16(lk): at most 8 more zero columns
    for (int d = 0; d < D; d++) {
      vf_store(kt + (int64_t)d * lkp + j, vf_splat(0.0f));
    }
  }
#endif
  for (int d = 0; d < D; d++) { // j is lkp here, or 0 without the shuffles
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

// The softmax loops below are plain C over LANES floats at a time, which each clone vectorises
// at its own width (one AVX-512 register, two AVX2 ones): 16-wide where the CPU has it, with the
// same bits in every clone (lane-wise operations, the row sum in LANES partial sums added in a
// fixed order).
#define LANES 16

// -inf from the row's end e up to pad (kend rounded up to LANES): the loops' range.
static void mask_row(float *sr, int e, int pad) {
  for (int c = e; c < pad; c++) {
    sr[c] = -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// The causal corner. Row r of a strip sees keys [0, row_end(r)); every row sees [0, e0), e0 =
// row_end(0), and the up to STRIP - 1 keys [e0, kend) only some rows see. The dense products
// over kend keys take the masked entries as 0 * x, which is NaN where x is a masked key's or
// value's NaN or Inf (or a query's or dO's, for the keys after it): a non-finite value at key j
// reached the rows i < j that must not see it. The strips keep their dense products and check
// the few values that meet the masked entries (the forward: the corner's rows of v, 5 x D floats;
// the backward: the corner's entries of S and dP, and the rows' lse and Di, folded into
// grad_scores). Only when one is not finite (rare: a NaN is an error upstream) do the products
// run densely over [0, e0) and add the corner pair by pair, only the pairs a row sees, in the
// micro-kernels' order (of k, then of the six rows). Measured: the corner computed this way in
// every strip instead cost 5-9% of the backward (perf: 5.6% of fwd + bwd in the corner loops).

// One definition for both paths (attention_short_cpu.h), and without clones: a static clone in
// each file gave clang two global resolvers of one name, and clang 14 names a cloned function's
// ifunc NAME.ifunc, which callers in another file do not find. It reads at most a strip's 6 rows
// of D floats against the strip's 6 x Lk x D products (an estimate, not measured: well under 1%
// of attention in its baseline build).
int loom_cpu_rows_finite(const float *x, int64_t ld, int64_t r0, int64_t r1, int D) {
  finite_acc_t acc = {{0}};
  for (int64_t r = r0; r < r1; r++) {
    finite_add(&acc, x + r * ld, D);
  }
  return finite_all(&acc);
}

// c (STRIP x D, row stride ldc) += a[r][j] * b[j] for the corner keys j in [e0, row_end(r)) of
// each real row r, in the order of j: the rest of a (STRIP x kend) . b (kend x D) after the
// micro-kernel's (STRIP x e0) . (e0 x D). LANES columns of c at a time stay in registers.
LOOM_CPU_CLONES LOOM_CONTRACT static void corner_matmul(float *restrict c, int64_t ldc,
                                                        const float *restrict a, int64_t lda,
                                                        const float *restrict b, int64_t ldb,
                                                        const strip_t *st, int e0, int D) {
  for (int r = 0; r < st->rows; r++) {
    const int e = row_end(st, r);
    float *cr = c + r * ldc;
    const float *ar = a + r * lda;
    for (int d = 0; d < D && e > e0; d += LANES) { // D % 16 == 0 on this path
      float acc[LANES];
      memcpy(acc, cr + d, sizeof acc);
      for (int j = e0; j < e; j++) {
        const float x = ar[j], *bj = b + j * ldb + d;
        for (int i = 0; i < LANES; i++) {
          acc[i] += x * bj[i];
        }
      }
      memcpy(cr + d, acc, sizeof acc);
    }
  }
}

// c[j] (D floats, row stride ldc) += a[r][j] * b[r] over the rows r that see key j, in the order
// of r, for the corner keys j in [e0, kend): the rest of a^T (kend x STRIP) . b (STRIP x D)
// after the micro-kernel's rank update over [0, e0). Row r sees j when j < row_end(r), which
// grows with r: the rows that see j are [r0, rows).
LOOM_CPU_CLONES LOOM_CONTRACT static void corner_rank_update(float *restrict c, int64_t ldc,
                                                             const float *restrict a, int64_t lda,
                                                             const float *restrict b, int64_t ldb,
                                                             const strip_t *st, int e0, int D) {
  int r0 = 0;
  for (int j = e0; j < st->kend; j++) {
    while (r0 < st->rows && row_end(st, r0) <= j) {
      r0++;
    }
    float *cj = c + j * ldc;
    for (int d = 0; d < D; d += LANES) {
      float acc[LANES];
      memcpy(acc, cj + d, sizeof acc);
      for (int r = r0; r < st->rows; r++) {
        const float x = a[r * lda + j], *br = b + r * ldb + d;
        for (int i = 0; i < LANES; i++) {
          acc[i] += x * br[i];
        }
      }
      memcpy(cj + d, acc, sizeof acc);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward: S = Q K^T for the strip (K packed transposed per key head), an exact softmax per row
// in base 2, O = P V / l with V read in place.

LOOM_CPU_CLONES
static void softmax_rows(float *s, int lds, const strip_t *st, float s2, float *m, float *l) {
  const int pad = round16(st->kend); // <= lds: rows are round16(lk) long
  for (int r = 0; r < st->rows; r++) {
    float *sr = s + (int64_t)r * lds;
    mask_row(sr, row_end(st, r), pad);
    float mx16[LANES], acc[LANES];
    for (int i = 0; i < LANES; i++) {
      mx16[i] = sr[i] * s2;
      acc[i] = 0.0f;
    }
    for (int c = LANES; c < pad; c += LANES) {
      for (int i = 0; i < LANES; i++) {
        const float t = sr[c + i] * s2;
        mx16[i] = t > mx16[i] ? t : mx16[i];
      }
    }
    float mx = mx16[0]; // finite: every live row sees key 0
    for (int i = 1; i < LANES; i++) {
      mx = mx16[i] > mx ? mx16[i] : mx;
    }
    for (int c = 0; c < pad; c += LANES) {
      for (int i = 0; i < LANES; i++) {
        const float p = exp2_lane(sr[c + i] * s2 - mx);
        sr[c + i] = p;
        acc[i] += p;
      }
    }
    for (int w = LANES / 2; w > 0; w /= 2) { // a fixed tree: lanes i and i + w
      for (int i = 0; i < w; i++) {
        acc[i] += acc[i + w];
      }
    }
    m[r] = mx;
    l[r] = acc[0]; // >= 1: the maximum contributes 2^0
  }
  zero_pad_rows(s, lds, st);
}

void loom_cpu_attn_short_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                             int64_t ldq, int64_t ldk, int64_t lse_stride, int lq, int lk, int H,
                             int H_kv, int D, int causal, float s2, float *ws) {
  const int lkp = round16(lk > 0 ? lk : 1), group = H / H_kv;
  float *kt = ws, *s = kt + (int64_t)D * lkp, *qs = s + (int64_t)STRIP * lkp, *os = qs + STRIP * D;
  const int i_first = loom_cpu_attn_first_live_row(causal, lq, lk);
  const kernels_t kn = pick_kernels();
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
      prefetch_rows(qh, ldq, i0 + STRIP, i0 + 2 * STRIP < lq ? i0 + 2 * STRIP : lq, D);
      kn.matmul(round16(st.kend), D, qs, D, kt, lkp, s, lkp);
      softmax_rows(s, lkp, &st, s2, m, l);
      const int e0 = row_end(&st, 0); // keys every row of the strip sees; then the corner
      if (e0 < st.kend && !loom_cpu_rows_finite(vh, ldk, e0, st.kend, D)) {
        kn.matmul(D, e0, s, lkp, vh, ldk, os, D);
        corner_matmul(os, D, s, lkp, vh, ldk, &st, e0, D);
      } else {
        kn.matmul(D, st.kend, s, lkp, vh, ldk, os, D);
      }
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

// Returns 1 when the masked entries of S and dP and the rows' lse and Di are finite (the dense
// products are then exact); else 0, with P and dS set to exactly 0 at the masked entries (where
// 0 * (dP - Di) was NaN, or a NaN lse made P NaN) for the corner products.
LOOM_CPU_CLONES
static int grad_scores(float *s, float *dp, int lds, const strip_t *st, const float *lse,
                       const float *di, float s2, float scale) {
  const int pad = round16(st->kend);
  float chk = 0.0f;
  for (int r = 0; r < st->rows; r++) {
    float *sr = s + (int64_t)r * lds, *dr = dp + (int64_t)r * lds;
    const int e = row_end(st, r);
    for (int c = e; c < st->kend; c++) { // the masked entries, before the mask overwrites S
      chk += sr[c] * 0.0f + dr[c] * 0.0f;
    }
    mask_row(sr, e, pad);
    const float l2 = lse[st->i0 + r] * LOG2E;
    const float lv = l2 == -INFINITY ? INFINITY : l2, dv = di[st->i0 + r];
    chk += e < st->kend ? l2 * 0.0f + dv * 0.0f : 0.0f;
    for (int c = 0; c < pad; c += LANES) {
      for (int i = 0; i < LANES; i++) {
        const float p = exp2_lane(sr[c + i] * s2 - lv);
        sr[c + i] = p;
        dr[c + i] = p * (dr[c + i] - dv) * scale;
      }
    }
  }
  zero_pad_rows(s, lds, st);
  zero_pad_rows(dp, lds, st);
  if (chk == 0.0f) {
    return 1;
  }
  for (int r = 0; r < st->rows; r++) {
    for (int c = row_end(st, r); c < st->kend; c++) {
      s[(int64_t)r * lds + c] = 0.0f;
      dp[(int64_t)r * lds + c] = 0.0f;
    }
  }
  return 0;
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
  const kernels_t kn = pick_kernels();
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
        const int next_end = i0 + 2 * STRIP < lq ? i0 + 2 * STRIP : lq; // the next strip
        prefetch_rows(qh, ldq, i0 + STRIP, next_end, D);
        prefetch_rows(doh, ldq, i0 + STRIP, next_end, D);
        kn.matmul(ncols, D, qs, D, kt, lkp, s, lkp);
        kn.matmul(ncols, D, dos, D, vt, lkp, dp, lkp);
        if (grad_scores(s, dp, lkp, &st, lh, dih, s2, scale)) {
          kn.rank_update(st.kend, D, s, lkp, dos, D, dvg, ldk);
          kn.matmul(D, st.kend, dp, lkp, kg, ldk, dqs, D);
          kn.rank_update(st.kend, D, dp, lkp, qs, D, dkg, ldk);
        } else { // a masked entry met a non-finite value: only the pairs each row sees
          const int e0 = row_end(&st, 0);
          kn.rank_update(e0, D, s, lkp, dos, D, dvg, ldk);
          corner_rank_update(dvg, ldk, s, lkp, dos, D, &st, e0, D);
          kn.matmul(D, e0, dp, lkp, kg, ldk, dqs, D);
          corner_matmul(dqs, D, dp, lkp, kg, ldk, &st, e0, D);
          kn.rank_update(e0, D, dp, lkp, qs, D, dkg, ldk);
          corner_rank_update(dkg, ldk, dp, lkp, qs, D, &st, e0, D);
        }
        for (int r = 0; r < st.rows; r++) {
          memcpy(dqh + (i0 + r) * ldq, dqs + r * D, (size_t)D * sizeof(float));
        }
      }
    }
  }
}
