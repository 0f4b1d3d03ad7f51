/* attention_cpu.c — padding-free varlen core attention on the CPU: short sequences go to the strip
 * kernels, the rest to FlashAttention-2 tiles (online softmax in base 2, cblas_sgemm per tile). */
#include "config.h"
#include "attention_cpu.h"
#include "attention_short_cpu.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "error.h"
#include "loom_tensor.h"
#include "simd.h"
#include "sum8.h"
#include "vec8.h"

#define BR LOOM_ATTN_BR
#define BC LOOM_ATTN_BC

// ---------------------------------------------------------------------------------------------
// Tile helpers. A score tile is `rows` x `pad` floats with row stride BC, pad = cols rounded up
// to 8. Row r of a tile whose first query is query i0 of its sequence sees the tile's columns
// [0, min(cols, end0 + r)) when causal (end0 = i0 + Lk - Lq + 1 - j0), [0, cols) otherwise.

// Set the masked and padding columns of each row to -inf (only diagonal and last tiles have any).
static void mask_tile(float *s, int rows, int cols, int causal, int64_t end0) {
  const int pad = round8(cols);
  for (int r = 0; r < rows; r++) {
    int64_t e = causal && end0 + r < cols ? end0 + r : cols;
    for (int64_t c = e < 0 ? 0 : e; c < pad; c++) {
      s[(int64_t)r * BC + c] = -INFINITY;
    }
  }
}

// The causal corner. A dense product over a diagonal tile takes its masked entries (P = 0,
// dS = 0) as 0 * x, which is NaN where x is a masked key's or value's NaN or Inf (or a query's or
// dO's, for the keys after it): a non-finite value at key j reached the rows i < j that must not
// see it. The tiles keep their dense BLAS products (the bits stay those of BLAS) and check the
// few values that meet the masked entries; only when one is not finite does the tile take the
// products row by row over the keys each row sees (rare: a NaN is an error upstream).

// 1 when every masked entry of the tile (row r's columns [end0 + r, cols), see mask_tile) of s is
// finite.
LOOM_CPU_CLONES
static int masked_finite(const float *s, int rows, int cols, int64_t end0) {
  finite_acc_t acc = {{0}};
  for (int r = 0; r < rows && end0 + r < cols; r++) {
    const int64_t c = end0 + r < 0 ? 0 : end0 + r;
    finite_add(&acc, s + (int64_t)r * BC + c, cols - c);
  }
  return finite_all(&acc);
}

// The masked entries of the tile s set to 0.
static void zero_masked(float *s, int rows, int cols, int64_t end0) {
  for (int r = 0; r < rows && end0 + r < cols; r++) {
    for (int64_t c = end0 + r < 0 ? 0 : end0 + r; c < cols; c++) {
      s[(int64_t)r * BC + c] = 0.0f;
    }
  }
}

// Keys of the tile that row r sees: [0, row_cols).
static int row_cols(int r, int cols, int causal, int64_t end0) {
  if (!causal || end0 + r >= cols) {
    return cols;
  }
  return end0 + r < 0 ? 0 : (int)(end0 + r);
}

// Rows of one head of a packed tensor: row i of head h is at base + i * ld.
static void zero_rows(float *base, int64_t ld, int rows, int D) {
  for (int r = 0; r < rows; r++) {
    memset(base + r * ld, 0, (size_t)D * sizeof(float));
  }
}

static void scale_row(float *x, int D, float a) {
  for (int d = 0; d < D; d++) {
    x[d] *= a;
  }
}

// Workspace of the short path: enough for the longest sequence that takes it (0 if none).
static size_t short_ws(const int32_t *cu_k, int B, int D) {
  int lk_max = -1;
  for (int b = 0; b < B; b++) {
    const int lk = cu_k[b + 1] - cu_k[b];
    if (loom_cpu_attn_short_ok(D, lk) && lk > lk_max) {
      lk_max = lk;
    }
  }
  return lk_max < 0 ? 0 : loom_cpu_attn_short_ws(D, lk_max);
}

// ---------------------------------------------------------------------------------------------
// Forward. Scores are kept in base 2: S2 = (scale * log2 e) q.k, so p = 2^(S2 - m) and
// lse = (m + log2 l) * ln 2. The output rows themselves accumulate P V (sgemm with ldc = H * D),
// rescaled by 2^(m_old - m_new) when a row's maximum grows.

LOOM_CPU_CLONES
static void fwd_head(float *o,       // (Lq, ...) row stride ldq: head h of the output
                     float *lse,     // (Lq) this head's lse entries of the sequence
                     const float *q, // (Lq, ...) row stride ldq
                     const float *k, // (Lk, ...) row stride ldk
                     const float *v, // (Lk, ...) row stride ldk
                     int64_t ldq, int64_t ldk, int lq, int lk, int D, int causal, float s2,
                     float *s,          // (BR, BC) workspace
                     float *m, float *l // (BR) workspace
) {
  const int i_first = loom_cpu_attn_first_live_row(causal, lq, lk);
  zero_rows(o, ldq, i_first, D);
  for (int i = 0; i < i_first; i++) {
    lse[i] = -INFINITY;
  }
  for (int i0 = i_first; i0 < lq; i0 += BR) {
    const int rows = lq - i0 < BR ? lq - i0 : BR;
    // Keys seen by the tile's last row: every later key tile is fully masked and skipped.
    const int kend = causal && i0 + rows + lk - lq < lk ? i0 + rows + lk - lq : lk;
    float *ot = o + i0 * ldq;
    for (int j0 = 0; j0 < kend; j0 += BC) {
      const int cols = kend - j0 < BC ? kend - j0 : BC;
      const int pad = round8(cols);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, s2, q + i0 * ldq,
                  (int)ldq, k + j0 * ldk, (int)ldk, 0.0f, s, BC);
      mask_tile(s, rows, cols, causal, (int64_t)i0 + lk - lq + 1 - j0);
      for (int r = 0; r < rows; r++) {
        float *sr = s + (int64_t)r * BC;
        vf m0 = vf_load(sr);
        for (int c = 8; c < pad; c += 8) {
          m0 = vf_max(m0, vf_load(sr + c));
        }
        float mx = vf_hmax(m0);
        // Every live row sees key 0, so the first tile gives each row a finite maximum.
        float m_new = j0 == 0 || mx > m[r] ? mx : m[r];
        vf mn = vf_splat(m_new), acc0 = vf_splat(0.0f);
        for (int c = 0; c < pad; c += 8) {
          vf p0 = vf_exp2(vf_load(sr + c) - mn);
          acc0 += p0;
          vf_store(sr + c, p0);
        }
        float sum = vf_hsum(acc0);
        if (j0 == 0) {
          l[r] = sum;
        } else {
          float alpha = exp2_lane(m[r] - m_new);
          l[r] = l[r] * alpha + sum;
          if (alpha != 1.0f) {
            scale_row(ot + r * ldq, D, alpha);
          }
        }
        m[r] = m_new;
      }
      const int64_t end0 = (int64_t)i0 + lk - lq + 1 - j0;
      if (causal && end0 < cols &&
          !loom_cpu_rows_finite(v + j0 * ldk, ldk, end0 < 0 ? 0 : end0, cols, D)) {
        for (int r = 0; r < rows; r++) { // a masked value is not finite: only the keys seen
          const int e = row_cols(r, cols, causal, end0);
          if (e > 0) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, D, e, 1.0f,
                        s + (int64_t)r * BC, BC, v + j0 * ldk, (int)ldk, j0 == 0 ? 0.0f : 1.0f,
                        ot + r * ldq, (int)ldq);
          } else if (j0 == 0) {
            memset(ot + r * ldq, 0, (size_t)D * sizeof(float));
          }
        }
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, 1.0f, s, BC,
                    v + j0 * ldk, (int)ldk, j0 == 0 ? 0.0f : 1.0f, ot, (int)ldq);
      }
    }
    for (int r = 0; r < rows; r++) {
      scale_row(ot + r * ldq, D, 1.0f / l[r]); // l >= 1: the row's maximum contributes 2^0
      lse[i0 + r] = (m[r] + log2f(l[r])) * LN2;
    }
  }
}

loom_status_t loom_cpu_attention_fwd(float *out, float *lse, const float *q, const float *k,
                                     const float *v, const int32_t *cu_q, const int32_t *cu_k,
                                     int B, int H, int H_kv, int D, int causal, float scale) {
  if (B <= 0 || cu_q[B] == 0) {
    return LOOM_OK;
  }
  const size_t n_ws = ((size_t)BR * BC + 2 * BR) + short_ws(cu_k, B, D);
  float *ws = loom_host_alloc(n_ws * sizeof(float));
  if (!ws) {
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "attention forward: cannot allocate %zu floats of workspace", n_ws);
  }
  if (scale <= 0.0f) {
    scale = 1.0f / sqrtf((float)D);
  }
  const float s2 = scale * LOG2E;
  const int64_t total_q = cu_q[B], ldq = (int64_t)H * D, ldk = (int64_t)H_kv * D;
  const int group = H / H_kv;
  for (int b = 0; b < B; b++) {
    const int64_t q0 = cu_q[b], k0 = cu_k[b];
    const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (loom_cpu_attn_short_ok(D, lk)) {
      loom_cpu_attn_short_fwd(out + q0 * ldq, lse + q0, q + q0 * ldq, k + k0 * ldk, v + k0 * ldk,
                              ldq, ldk, total_q, lq, lk, H, H_kv, D, causal, s2,
                              ws + BR * BC + 2 * BR);
      continue;
    }
    for (int h = 0; h < H; h++) {
      const int64_t g = h / group;
      fwd_head(out + q0 * ldq + (int64_t)h * D, lse + h * total_q + q0,
               q + q0 * ldq + (int64_t)h * D, k + k0 * ldk + g * D, v + k0 * ldk + g * D, ldq, ldk,
               lq, lk, D, causal, s2, ws, ws + BR * BC, ws + BR * BC + BR);
    }
  }
  loom_host_free(ws);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Backward (FlashAttention-2): for each sequence, key/value head and key tile, loop over the
// group's query heads and the query tiles that see the key tile; recompute P = 2^(S2 - lse2),
// then dV += P^T dO, dP = dO V^T, dS = P (dP - Di), dQ += scale dS K (straight into dq),
// dK += scale dS^T Q. dK and dV of the tile accumulate in workspace and are stored once.

typedef struct bwd_ws {
  float *s;       // (BR, BC) scores, then P, then dS
  float *dp;      // (BR, BC)
  float *dk, *dv; // (BC, D) accumulators
  float *lse2;    // (BR) lse in base 2 for the tile's rows
} bwd_ws_t;

LOOM_CPU_CLONES
static void bwd_key_tile(const float *q,    // (Lq, ...) row stride ldq, head h
                         const float *dout, // (Lq, ...) row stride ldq
                         const float *lse,  // (Lq) head h
                         const float *di,   // (Lq) head h: rowsum(dO * O)
                         float *dq,         // (Lq, ...) row stride ldq
                         const float *k,    // (cols, ...) row stride ldk: the key tile
                         const float *v,    // (cols, ...) row stride ldk
                         int64_t ldq, int64_t ldk, int lq, int lk, int j0, int cols, int D,
                         int causal, float scale, float s2, const bwd_ws_t *w) {
  const int pad = round8(cols);
  int i_start = loom_cpu_attn_first_live_row(causal, lq, lk);
  if (causal && j0 + lq - lk > i_start) {
    i_start = j0 + lq - lk; // earlier queries see none of this tile's keys
  }
  for (int i0 = i_start; i0 < lq; i0 += BR) {
    const int rows = lq - i0 < BR ? lq - i0 : BR;
    const int64_t end0 = (int64_t)i0 + lk - lq + 1 - j0;
    const int corner = causal && end0 < cols; // the tile has masked entries
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, s2, q + i0 * ldq, (int)ldq,
                k, (int)ldk, 0.0f, w->s, BC);
    int exact = corner && !masked_finite(w->s, rows, cols, end0); // a masked q.k is not finite
    mask_tile(w->s, rows, cols, causal, end0);
    for (int r = 0; r < rows; r++) {
      float l2 = lse[i0 + r] * LOG2E;
      w->lse2[r] = l2 == -INFINITY ? INFINITY : l2; // a row without keys gets P = 0
    }
    for (int r = 0; r < rows; r++) {
      float *sr = w->s + (int64_t)r * BC;
      vf l2 = vf_splat(w->lse2[r]);
      for (int c = 0; c < pad; c += 8) {
        vf_store(sr + c, vf_exp2(vf_load(sr + c) - l2));
      }
    }
    const float *dot = dout + i0 * ldq;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, 1.0f, dot, (int)ldq, v,
                (int)ldk, 0.0f, w->dp, BC);
    if (corner && !exact) { // a masked dO.v, or the lse or Di of a row with masked entries
      exact = !masked_finite(w->dp, rows, cols, end0);
      for (int r = 0; r < rows && end0 + r < cols && !exact; r++) {
        exact = !isfinite(lse[i0 + r]) || !isfinite(di[i0 + r]);
      }
    }
    if (exact) {
      zero_masked(w->s, rows, cols, end0); // P
      for (int r = 0; r < rows; r++) {
        const int e = row_cols(r, cols, causal, end0);
        if (e > 0) {
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, e, D, 1, 1.0f,
                      w->s + (int64_t)r * BC, BC, dot + r * ldq, (int)ldq, 1.0f, w->dv, D);
        }
      }
    } else {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, 1.0f, w->s, BC, dot,
                  (int)ldq, 1.0f, w->dv, D);
    }
    for (int r = 0; r < rows && cols < pad; r++) { // padding columns: P = 0, dP = 0, so dS = 0
      memset(w->dp + (int64_t)r * BC + cols, 0, (size_t)(pad - cols) * sizeof(float));
    }
    for (int r = 0; r < rows; r++) {
      float *sr = w->s + (int64_t)r * BC;
      const float *dpr = w->dp + (int64_t)r * BC;
      vf d = vf_splat(di[i0 + r]);
      for (int c = 0; c < pad; c += 8) {
        vf_store(sr + c, vf_load(sr + c) * (vf_load(dpr + c) - d));
      }
    }
    if (exact) {
      zero_masked(w->s, rows, cols, end0); // dS
      for (int r = 0; r < rows; r++) {
        const int e = row_cols(r, cols, causal, end0);
        if (e > 0) {
          const float *sr = w->s + (int64_t)r * BC, *qr = q + (i0 + r) * ldq;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, D, e, scale, sr, BC, k,
                      (int)ldk, 1.0f, dq + (i0 + r) * ldq, (int)ldq);
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, e, D, 1, scale, sr, BC, qr, (int)ldq,
                      1.0f, w->dk, D);
        }
      }
      continue;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, scale, w->s, BC, k,
                (int)ldk, 1.0f, dq + i0 * ldq, (int)ldq);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, scale, w->s, BC,
                q + i0 * ldq, (int)ldq, 1.0f, w->dk, D);
  }
}

// di[h * total_q + i] = rowsum(dO * O) for every (query row i, head h), products and sums in
// double, eight partial sums per row (sum8.h): the same bits in every clone.
LOOM_CPU_CLONES
static void rowsum_dout_out(float *di, const float *dout, const float *out, int64_t total_q, int H,
                            int D, int64_t ldq) {
  for (int64_t i = 0; i < total_q; i++) {
    for (int h = 0; h < H; h++) {
      const float *a = dout + i * ldq + (int64_t)h * D, *o = out + i * ldq + (int64_t)h * D;
      double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0;
      int d = 0;
      for (; d + 8 <= D; d += 8) {
        for (int l = 0; l < 8; l++) {
          s[l] += (double)a[d + l] * (double)o[d + l];
        }
      }
      for (; d < D; d++) {
        tail += (double)a[d] * (double)o[d];
      }
      di[h * total_q + i] = (float)sum8_finish(s, tail);
    }
  }
}

loom_status_t loom_cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout,
                                     const float *q, const float *k, const float *v,
                                     const float *out, const float *lse, const int32_t *cu_q,
                                     const int32_t *cu_k, int B, int H, int H_kv, int D, int causal,
                                     float scale) {
  const int64_t total_q = B > 0 ? cu_q[B] : 0, total_k = B > 0 ? cu_k[B] : 0;
  const int64_t ldq = (int64_t)H * D, ldk = (int64_t)H_kv * D;
  if (total_q == 0 && total_k == 0) {
    return LOOM_OK;
  }
  const size_t tile = (size_t)BR * BC, acc = (size_t)BC * D, fa2_ws = 2 * tile + 2 * acc + BR;
  const size_t n_ws = fa2_ws + short_ws(cu_k, B, D);
  float *ws = loom_host_alloc(n_ws * sizeof(float));
  float *di = loom_host_alloc(((size_t)total_q * H + 1) * sizeof(float));
  if (!ws || !di) {
    loom_host_free(ws);
    loom_host_free(di);
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "attention backward: cannot allocate %zu floats of workspace",
                      n_ws + (size_t)total_q * H);
  }
  bwd_ws_t w = {ws, ws + tile, ws + 2 * tile, ws + 2 * tile + acc, ws + 2 * tile + 2 * acc};
  if (scale <= 0.0f) {
    scale = 1.0f / sqrtf((float)D);
  }
  const float s2 = scale * LOG2E;
  const int group = H / H_kv;

  rowsum_dout_out(di, dout, out, total_q, H, D, ldq);

  for (int b = 0; b < B; b++) {
    const int64_t q0 = cu_q[b], k0 = cu_k[b];
    const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    if (loom_cpu_attn_short_ok(D, lk)) { // dk, dv accumulate over the sequence's query rows
      if (lk > 0) {
        memset(dk + k0 * ldk, 0, (size_t)lk * ldk * sizeof(float));
        memset(dv + k0 * ldk, 0, (size_t)lk * ldk * sizeof(float));
      }
      loom_cpu_attn_short_bwd(dq + q0 * ldq, dk + k0 * ldk, dv + k0 * ldk, dout + q0 * ldq,
                              q + q0 * ldq, k + k0 * ldk, v + k0 * ldk, lse + q0, di + q0, ldq, ldk,
                              total_q, lq, lk, H, H_kv, D, causal, scale, s2, ws + fa2_ws);
      continue;
    }
    if (lq > 0) { // the key tiles add to dq
      memset(dq + q0 * ldq, 0, (size_t)lq * ldq * sizeof(float));
    }
    for (int g = 0; g < H_kv; g++) {
      for (int j0 = 0; j0 < lk; j0 += BC) {
        const int cols = lk - j0 < BC ? lk - j0 : BC;
        const float *kt = k + (k0 + j0) * ldk + (int64_t)g * D;
        const float *vt = v + (k0 + j0) * ldk + (int64_t)g * D;
        memset(w.dk, 0, 2 * acc * sizeof(float)); // dk and dv accumulators
        for (int h = g * group; h < (g + 1) * group; h++) {
          const int64_t hq = q0 * ldq + (int64_t)h * D;
          bwd_key_tile(q + hq, dout + hq, lse + h * total_q + q0, di + h * total_q + q0, dq + hq,
                       kt, vt, ldq, ldk, lq, lk, j0, cols, D, causal, scale, s2, &w);
        }
        float *dkt = dk + (k0 + j0) * ldk + (int64_t)g * D;
        float *dvt = dv + (k0 + j0) * ldk + (int64_t)g * D;
        for (int c = 0; c < cols; c++) {
          memcpy(dkt + c * ldk, w.dk + (size_t)c * D, (size_t)D * sizeof(float));
          memcpy(dvt + c * ldk, w.dv + (size_t)c * D, (size_t)D * sizeof(float));
        }
      }
    }
  }
  loom_host_free(di);
  loom_host_free(ws);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// cu_seqlens checks, shared by the public ops and by servers that receive offsets from a peer.

loom_status_t loom_cpu_varlen_check(const char *op, const char *name, const int32_t *cu, int64_t B,
                                    int64_t total, const char *rows_of, int64_t max_len) {
  if (cu[0] != 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s[0]=%d: offsets must start at 0", op, name,
                      (int)cu[0]);
  }
  for (int64_t b = 0; b < B; b++) {
    if (cu[b + 1] < cu[b]) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: %s[%lld]=%d < %s[%lld]=%d: offsets must be non-decreasing", op, name,
                        (long long)(b + 1), (int)cu[b + 1], name, (long long)b, (int)cu[b]);
    }
    if (max_len >= 0 && (int64_t)cu[b + 1] - cu[b] > max_len) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: %s[%lld] - %s[%lld] = %lld: sequence %lld is longer than the padded "
                        "length %lld",
                        op, name, (long long)(b + 1), name, (long long)b,
                        (long long)((int64_t)cu[b + 1] - cu[b]), (long long)b, (long long)max_len);
    }
  }
  if (total >= 0 && cu[B] != total) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s[%lld]=%d, but %s has %lld rows: the last offset must equal the "
                      "row count",
                      op, name, (long long)B, (int)cu[B], rows_of, (long long)total);
  }
  return LOOM_OK;
}
