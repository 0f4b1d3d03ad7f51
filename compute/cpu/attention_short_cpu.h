/* attention_short_cpu.h — the short-sequence path of CPU core attention: strips of 6 query rows
 * against all the keys they see, on FMA micro-kernels (attention_cpu.c dispatches to it). */
#ifndef LOOM_ATTENTION_SHORT_CPU_H
#define LOOM_ATTENTION_SHORT_CPU_H

#include <stddef.h>
#include <stdint.h>

// Query rows per strip: the micro-kernels hold a 6 x 16 (AVX-512: 6 x 32) block of the result
// in registers.
#define LOOM_ATTN_STRIP 6

// Sequences with at most this many keys (and D a multiple of 16) take the short path; longer
// ones take the FlashAttention-2 tiles, whose workspace and cache footprint do not grow with the
// sequence. The short path's workspace is 2 D Lk + 12 Lk + 18 D floats, and every strip streams
// the whole K^T, V (and in the backward dK, dV) of its head, which leave L2 as Lk grows.
// - 8-wide kernels, LOOM_ATTN_SHORT_MAX: on a Zen 4 core (1 MiB L2; D = 64, 4 heads, 2048 tokens
//   of equal sequences), forward + backward ms, short against tiles: 12.5 / 15.8 at Lk = 256,
//   26.4 / 28.1 at 512, 33.7 / 37.6 at 768, 57.5 / 52.8 at 1024, 123 / 100 at 2048.
// - 16-wide kernels (AVX-512), LOOM_ATTN_SHORT_MAX_WIDE: on a Zen 5 core (1 MiB L2, same
//   workload) the short path won at every length measured, 1.74x at 768, 1.45x at 1024 and 1.30x
//   at 2048; longer sequences were not measured and keep the tiles.
// (tests/bench/attn_kernel_perf). Override at build time (CPPFLAGS=-DLOOM_ATTN_SHORT_MAX=-1
// -DLOOM_ATTN_SHORT_MAX_WIDE=-1 turns the short path off).
#ifndef LOOM_ATTN_SHORT_MAX
#define LOOM_ATTN_SHORT_MAX 768
#endif
#ifndef LOOM_ATTN_SHORT_MAX_WIDE
#define LOOM_ATTN_SHORT_MAX_WIDE 2048
#endif

// A limit set by a benchmark or test to compare the two paths on the same input (-1: never take
// the short path); 0, the default, means the build's limit for the kernels' width. The library
// never writes it.
extern int loom_attn_short_max;

// The limit in force: loom_attn_short_max, or when it is 0 LOOM_ATTN_SHORT_MAX_WIDE with the
// 16-wide kernels and LOOM_ATTN_SHORT_MAX with the 8-wide ones.
int loom_cpu_attn_short_limit(void);

// 1 when rows [r0, r1) of D floats (row stride ld) are all finite (both attention paths check
// the rows that meet masked entries with it).
int loom_cpu_rows_finite(const float *x, int64_t ld, int64_t r0, int64_t r1, int D);

// The micro-kernels' vector width: 16 floats where the CPU has AVX-512, else 8. A test or
// benchmark sets loom_attn_vector_width = 8 to run the 8-wide kernels on an AVX-512 CPU (0, the
// default: the widest the CPU has); the library never writes it. Both widths give the same bits.
extern int loom_attn_vector_width;
int loom_cpu_attn_vector_width(void);

// Query rows of a sequence before the first one that sees any key (bottom-right causal with
// lq > lk, or no keys at all): both paths give them a zero output, lse = -inf, zero dq.
static inline int loom_cpu_attn_first_live_row(int causal, int lq, int lk) {
  if (lk == 0) {
    return lq;
  }
  return causal && lq > lk ? lq - lk : 0;
}

// Whether a sequence with lk keys and head size D takes the short path.
int loom_cpu_attn_short_ok(int D, int lk);

// Floats of workspace for sequences of up to lk_max keys (forward or backward).
size_t loom_cpu_attn_short_ws(int D, int lk_max);

// One sequence, every head: the arguments are those of loom_cpu_attention_fwd with the pointers
// moved to the sequence's first row (lse to its first entry of head 0; head h's entries are
// lse_stride apart) and s2 = scale * log2(e). out and lse are overwritten.
void loom_cpu_attn_short_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                             int64_t ldq, int64_t ldk, int64_t lse_stride, int lq, int lk, int H,
                             int H_kv, int D, int causal, float s2, float *ws);

// One sequence, every head, as loom_cpu_attention_bwd; di = rowsum(dO * O), laid out as lse.
// dq is overwritten; dk and dv are added to (the caller zeroes the sequence's rows first).
void loom_cpu_attn_short_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *lse, const float *di,
                             int64_t ldq, int64_t ldk, int64_t lse_stride, int lq, int lk, int H,
                             int H_kv, int D, int causal, float scale, float s2, float *ws);

#endif
