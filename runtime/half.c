/* half.c — IEEE binary16 (f16) and bfloat16 conversions to and from f32 by bit manipulation:
 * round to nearest even, quiet NaNs with their sign, Inf, overflow to Inf, exact subnormals. */
#include "config.h"
#include "loom_tensor.h"

#include <string.h>

// ---------------------------------------------------------------------------------------------
// Bit access without aliasing problems.

static uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// ---------------------------------------------------------------------------------------------
// f16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. f32: 1, 8 (bias 127), 23.

uint16_t loom_f32_to_f16(float x) {
  uint32_t u = f32_bits(x);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu; // magnitude bits

  if (a > 0x7F800000u) {
    // NaN: keep the top 10 payload bits and force the quiet bit so the result cannot be Inf.
    return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
  }
  if (a >= 0x38800000u) {
    // |x| >= 2^-14, the smallest normal f16: rebias the exponent (127 - 15 = 112) and round the
    // 13 dropped mantissa bits to nearest even. A carry out of the mantissa bumps the exponent,
    // which is exactly right, and anything reaching exponent 31 (>= 65520, or Inf) is Inf.
    uint32_t m = a - (112u << 23);
    uint32_t r = (m + 0x0FFFu + ((m >> 13) & 1u)) >> 13;
    if (r >= 0x7C00u) {
      r = 0x7C00u;
    }
    return (uint16_t)(sign | r);
  }
  // |x| < 2^-14: an f16 subnormal (a multiple of 2^-24) or zero.
  uint32_t e = a >> 23; // biased f32 exponent, <= 112 here
  if (e < 102) {
    // |x| < 2^-25 (f32 subnormals included): below half the smallest subnormal, rounds to 0.
    return sign;
  }
  uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u; // 24 significant bits
  uint32_t shift = 126 - e;                        // 14..24: x = mant >> shift units of 2^-24
  uint32_t q = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) {
    q++; // may carry into 0x0400, the smallest normal: still the right encoding
  }
  return (uint16_t)(sign | q);
}

float loom_f16_to_f32(uint16_t h) {
  uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
  uint32_t e = ((uint32_t)h >> 10) & 0x1Fu;
  uint32_t m = (uint32_t)h & 0x03FFu;

  if (e == 0x1Fu) {
    if (m == 0) {
      return f32_from_bits(sign | 0x7F800000u); // Inf
    }
    return f32_from_bits(sign | 0x7FC00000u | (m << 13)); // quiet NaN, payload kept
  }
  if (e == 0) {
    if (m == 0) {
      return f32_from_bits(sign); // +-0
    }
    // Subnormal m * 2^-24: shift the leading 1 up to the implicit-bit position.
    int exp = 1;
    while (!(m & 0x0400u)) {
      m <<= 1;
      exp--;
    }
    m &= 0x03FFu;
    return f32_from_bits(sign | ((uint32_t)(exp + 112) << 23) | (m << 13));
  }
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// ---------------------------------------------------------------------------------------------
// bfloat16: the top 16 bits of an f32 (same exponent range, 7 mantissa bits).

uint16_t loom_f32_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: truncate and force the quiet bit; rounding could carry a NaN into Inf.
    return (uint16_t)((u >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 dropped bits. FLT_MAX and everything from the midpoint
  // above the largest bf16 carry into the exponent and give Inf; no carry leaves bit 31.
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float loom_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    u |= 0x00400000u; // NaN comes out quiet
  }
  return f32_from_bits(u);
}

// ---------------------------------------------------------------------------------------------
// Bulk variants.

void loom_f32_to_f16_n(const float *src, uint16_t *dst, size_t n) {
  if (!src || !dst) {
    return;
  }
  for (size_t i = 0; i < n; i++) {
    dst[i] = loom_f32_to_f16(src[i]);
  }
}

void loom_f16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
  if (!src || !dst) {
    return;
  }
  for (size_t i = 0; i < n; i++) {
    dst[i] = loom_f16_to_f32(src[i]);
  }
}

void loom_f32_to_bf16_n(const float *src, uint16_t *dst, size_t n) {
  if (!src || !dst) {
    return;
  }
  for (size_t i = 0; i < n; i++) {
    dst[i] = loom_f32_to_bf16(src[i]);
  }
}

void loom_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n) {
  if (!src || !dst) {
    return;
  }
  for (size_t i = 0; i < n; i++) {
    dst[i] = loom_bf16_to_f32(src[i]);
  }
}
