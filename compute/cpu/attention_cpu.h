/* attention_cpu.h — CPU kernels of padding-free variable-length core attention on raw pointers:
 * FlashAttention-2 tiled online softmax, forward and backward, over packed sequences (cu_seqlens).
 */
#ifndef LOOM_ATTENTION_CPU_H
#define LOOM_ATTENTION_CPU_H

#include <stdint.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// Two paths, chosen per sequence: sequences of up to loom_cpu_attn_short_limit() keys (768, or
// 2048 with AVX-512) with D a multiple of 16 (the packed documents of a training batch) take the
// short path of attention_short_cpu.h (strips of 6 query rows on FMA micro-kernels, 1.3-1.9x
// faster there); the others the tiles below.
//
// Tile sizes. For each (sequence, head, query tile of LOOM_ATTN_BR rows) the kernels loop over key
// tiles of LOOM_ATTN_BC columns; the workspace is a few BR x BC and BC x D tiles, never Lq x Lk.
// 64 x 64 keeps the score tiles (16 KiB each) and a K/V tile (16 KiB at D = 64) in L1/L2 and
// wastes less on the masked half of the causal diagonal tiles than 64 x 128: on packed
// documents of ~128 tokens (D = 64, 4 heads) forward + backward took 12.6 ms against 14.1 ms
// with 64 x 128 (16 documents, 2048 tokens, one core). BC must be a multiple of 8 (the elementwise
// loops take 8 columns a step).
// Both can be overridden at build time (CPPFLAGS=-DLOOM_ATTN_BR=128).
#ifndef LOOM_ATTN_BR
#define LOOM_ATTN_BR 64
#endif
#ifndef LOOM_ATTN_BC
#define LOOM_ATTN_BC 64
#endif

// The arguments are trusted (the public functions in compute/attention.c validate them; a
// server that received cu_seqlens from another rank checks them with loom_cpu_varlen_check
// first). Shapes: B sequences; sequence b has Lq = cu_q[b+1] - cu_q[b] query rows and
// Lk = cu_k[b+1] - cu_k[b] key rows; total_q = cu_q[B]. H % H_kv == 0; query head h reads
// key/value head h / (H / H_kv). causal: query i of b sees keys j <= i + Lk - Lq (bottom-right).
// scale <= 0 means 1/sqrt(D). Rows that see no key get a zero output, lse = -inf and zero
// gradients. Matrix products run on cblas_sgemm (the caller's BLAS threads). Both return LOOM_OK,
// or LOOM_ERR_NOMEM (with nothing written) when the workspace cannot be allocated.

// out and lse are overwritten.
loom_status_t loom_cpu_attention_fwd(float *out,          // (total_q, H, D)
                                     float *lse,          // (H, total_q)
                                     const float *q,      // (total_q, H, D)
                                     const float *k,      // (total_k, H_kv, D)
                                     const float *v,      // (total_k, H_kv, D)
                                     const int32_t *cu_q, // (B + 1)
                                     const int32_t *cu_k, // (B + 1)
                                     int B, int H, int H_kv, int D, int causal, float scale);

// dq, dk, dv are overwritten (dk, dv sum over the query heads of a group in a fixed order, so
// the result is deterministic). Workspace: a few tiles plus (H, total_q) floats.
loom_status_t loom_cpu_attention_bwd(float *dq,           // (total_q, H, D)
                                     float *dk,           // (total_k, H_kv, D)
                                     float *dv,           // (total_k, H_kv, D)
                                     const float *dout,   // (total_q, H, D)
                                     const float *q,      // (total_q, H, D)
                                     const float *k,      // (total_k, H_kv, D)
                                     const float *v,      // (total_k, H_kv, D)
                                     const float *out,    // (total_q, H, D)
                                     const float *lse,    // (H, total_q)
                                     const int32_t *cu_q, // (B + 1)
                                     const int32_t *cu_k, // (B + 1)
                                     int B, int H, int H_kv, int D, int causal, float scale);

// Check that cu (B + 1 offsets) is a valid cu_seqlens: cu[0] == 0, non-decreasing, every length
// cu[b+1] - cu[b] <= max_len when max_len >= 0, and cu[B] == total (the row count of the tensor
// named rows_of) when total >= 0. On failure
// returns LOOM_ERR_INVALID_ARG with a message that starts with op and names `name` and the
// offending entries, e.g. "cu_seqlens_q[3]=10 < cu_seqlens_q[2]=12: offsets must be
// non-decreasing".
loom_status_t loom_cpu_varlen_check(const char *op, const char *name,
                                    const int32_t *cu, // (B + 1)
                                    int64_t B, int64_t total, const char *rows_of, int64_t max_len);

#ifdef __cplusplus
}
#endif
#endif
