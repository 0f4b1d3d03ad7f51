/* exp_cpu.h — exp(x) in a form that GCC vectorises (no libm call): a degree-6 polynomial and 2^n
 * in the exponent bits, for the elementwise kernels (GELU, cross-entropy). */
#ifndef LOOM_EXP_CPU_H
#define LOOM_EXP_CPU_H

#include <stdint.h>
#include <string.h>

// exp(x) for x in [-87, 88]: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 Taylor
// polynomial (relative error < 2e-7 on that interval) and 2^n put in the exponent bits. Rounding
// to nearest uses the 1.5 * 2^23 trick so that no libm call remains in the loop.
static inline float exp_bounded(float x) {
  const float log2e = 1.44269504088896341f, round_magic = 12582912.0f; // 1.5 * 2^23
  const float ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723e-6f;
  float n = (x * log2e + round_magic) - round_magic;
  float r = (x - n * ln2_hi) - n * ln2_lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n in -126..127: a normal power of two. A NaN x (a NaN input) has no integer n: take 0, the
  // result is NaN through p anyway; the shift is unsigned (a negative int shifted left is UB).
  const float n_int = n == n ? n : 0.0f;
  uint32_t bits = (uint32_t)((int32_t)n_int + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// exp(x) for x <= 0 (a logit minus its row's maximum): 0 below -87, where expf is subnormal or
// 0 (a relative change below 1e-37 of a row sum that is >= 1); -inf gives 0, NaN stays NaN.
static inline float exp_nonpositive(float x) {
  return x < -87.0f ? 0.0f : exp_bounded(x);
}

#endif
