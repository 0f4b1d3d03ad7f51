/* vec8.h — 8-wide float vectors (GCC/Clang vector extensions) for the attention kernels: loads,
 * stores, select, max, horizontal max and sum, and 2^x with a relative error below 2.5e-7 (also
 * one float at a time, with the same bits). */
#ifndef LOOM_VEC8_H
#define LOOM_VEC8_H

#include <stdint.h>
#include <string.h>

#define LOG2E 1.4426950408889634f
#define LN2   0.6931471805599453f

// 8-wide float vectors (GCC/Clang vector extensions): one AVX2 register in the x86-64-v3 clone
// of the tile functions (LOOM_CPU_CLONES), two SSE2 registers in the baseline one, NEON pairs
// on arm64; no target flags needed, and both clones compute the same bits (lane-wise IEEE
// operations, no contraction). Loops take 8 columns a step; every row of a score tile is padded
// to a multiple of 8 columns. Loads and stores go through memcpy (no alignment assumptions).
// The helpers are inlined into the clones, so their vector arguments never cross an ABI
// boundary: GCC's note that a 32-byte vector return changes the ABI without AVX is moot.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));

// n rounded up to a multiple of 8: the vector loops' range over a row.
static inline int round8(int n) {
  return (n + 7) & ~7;
}

static inline vf vf_load(const float *p) {
  vf x;
  memcpy(&x, p, sizeof x);
  return x;
}

static inline void vf_store(float *p, vf x) {
  memcpy(p, &x, sizeof x);
}

static inline vf vf_splat(float a) {
  vf x = {a, a, a, a, a, a, a, a};
  return x;
}

static inline vf vf_select(vi mask, vf a, vf b) { // mask ? a : b, lane by lane
  return (vf)(((vi)a & mask) | ((vi)b & ~mask));
}

static inline vf vf_max(vf a, vf b) {
  return vf_select(a > b, a, b);
}

static inline float vf_hmax(vf x) {
  float m = x[0];
  for (int i = 1; i < 8; i++) {
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

static inline float vf_hsum(vf x) {
  return ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
}

// The Cephes exp2f minimax polynomial for 2^f, f in [-0.5, 0.5]: C0 + C1 f + ... + C6 f^6.
#define EXP2_C6 1.535336188319500e-4f
#define EXP2_C5 1.339887440266574e-3f
#define EXP2_C4 9.618437357674640e-3f
#define EXP2_C3 5.550332471162809e-2f
#define EXP2_C2 2.402264791363012e-1f
#define EXP2_C1 6.931472028550421e-1f
#define EXP2_C0 1.0f

// 2^x as vf_exp2 below computes it, for one float: the same operations, so the same bits. Loops
// written over plain floats with it vectorise at the width of each clone (16 floats a register
// with AVX-512). Always inlined, so that the clones run their own code for it.
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))
#endif
static inline float
exp2_lane(float x) {
  const int live = x >= -126.0f;
  float xc = live ? x : -126.0f;
  xc = xc <= 126.0f ? xc : 126.0f;
  const int32_t n = (int32_t)(xc + 128.5f) - 128; // floor(xc + 0.5): the sum is > 0
  const float f = xc - (float)n;
  float p = EXP2_C6;
  p = p * f + EXP2_C5;
  p = p * f + EXP2_C4;
  p = p * f + EXP2_C3;
  p = p * f + EXP2_C2;
  p = p * f + EXP2_C1;
  p = p * f + EXP2_C0;
  const uint32_t bits = (uint32_t)(n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return live ? p * scale : (x == x ? 0.0f : x); // NaN stays NaN
}

// 2^x with a relative error below 2.5e-7 for x in [-126, 126]; 0 for x < -126 (and -inf); NaN for
// NaN (a NaN score must not drop out of a softmax as a zero weight); x > 126 is clamped.
// Round-to-nearest split x = n + f, f in [-0.5, 0.5]; 2^f from the Cephes exp2f minimax
// polynomial; 2^n built in the exponent bits.
static inline vf vf_exp2(vf x) {
  const vi live = x >= vf_splat(-126.0f);
  vf xc = vf_select(live, x, vf_splat(-126.0f));
  xc = vf_select(xc <= vf_splat(126.0f), xc, vf_splat(126.0f));
  vi n = __builtin_convertvector(xc + 128.5f, vi) - 128; // floor(xc + 0.5): the sum is > 0
  vf f = xc - __builtin_convertvector(n, vf);
  vf p = vf_splat(EXP2_C6);
  p = p * f + EXP2_C5;
  p = p * f + EXP2_C4;
  p = p * f + EXP2_C3;
  p = p * f + EXP2_C2;
  p = p * f + EXP2_C1;
  p = p * f + EXP2_C0;
  vf scale2 = (vf)((n + 127) << 23);
  return (vf)(((vi)(p * scale2) & live) | ((vi)x & (x != x)));
}

// Non-finite floats as bit 31: (bits & exponent) + one exponent ulp has it set exactly for an
// all-ones exponent (Inf, NaN). OR-ed over 16 lanes (integer OR: any order and width give the
// same answer, so every clone vectorises it), one reduction at the end: the checks of the
// attention kernels' masked entries cost a few cycles per 16 floats.
typedef struct finite_acc {
  uint32_t lane[16];
} finite_acc_t;

static inline void finite_add(finite_acc_t *a, const float *x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t u[16];
    memcpy(u, x + i, sizeof u);
    for (int l = 0; l < 16; l++) {
      a->lane[l] |= (u[l] & 0x7f800000u) + 0x00800000u;
    }
  }
  for (; i < n; i++) {
    uint32_t u;
    memcpy(&u, x + i, sizeof u);
    a->lane[0] |= (u & 0x7f800000u) + 0x00800000u;
  }
}

static inline int finite_all(const finite_acc_t *a) {
  uint32_t acc = 0;
  for (int l = 0; l < 16; l++) {
    acc |= a->lane[l];
  }
  return (acc & 0x80000000u) == 0;
}

#endif
