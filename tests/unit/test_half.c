/* test_half.c — f16 and bf16 conversions: exhaustive decode and round trips over all 65536
 * patterns, every tie point, random floats against a reference computed in double, bulk forms. */
#include "config.h"
#include "loom.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define MAX_PRINTED 50 // failures printed in full; the rest are only counted

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
  if (failures < MAX_PRINTED) {
    va_list ap;
    va_start(ap, fmt);
    fputs("FAIL: ", stdout);
    vprintf(fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
  }
  failures++;
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static float from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng32(void) { // xorshift64*
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static int f16_is_nan(uint16_t h) {
  return (h & 0x7FFFu) > 0x7C00u;
}

static int bf16_is_nan(uint16_t h) {
  return (h & 0x7FFFu) > 0x7F80u;
}

// ---------------------------------------------------------------------------------------------
// Independent references, computed in double with ldexp (exact for these ranges).

// The value of a non-NaN f16 pattern.
static double f16_value(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0x1F ? INFINITY : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

// The value of a non-NaN bf16 pattern.
static double bf16_value(uint16_t h) {
  int s = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
  double v = e == 0xFF ? INFINITY : e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
  return s ? -v : v;
}

// x (finite, any sign) rounded to nearest even in a format with `mant` stored mantissa bits,
// minimum normal exponent emin and largest finite value maxv; +-Inf on overflow.
static double round_ref(double x, int mant, int emin, double maxv) {
  double a = fabs(x);
  if (a == 0) {
    return x;
  }
  int e;
  frexp(a, &e); // a = f * 2^e, 0.5 <= f < 1, so the leading bit is 2^(e-1)
  int lead = e - 1 < emin ? emin : e - 1;
  double ulp = ldexp(1.0, lead - mant);
  double q = a / ulp; // exact: scaling by a power of two
  double n = floor(q);
  double r = q - n;
  if (r > 0.5 || (r == 0.5 && fmod(n, 2.0) != 0)) {
    n += 1;
  }
  double v = n * ulp;
  if (v > maxv) {
    v = INFINITY;
  }
  return x < 0 ? -v : v;
}

static double f16_ref(float x) {
  return round_ref(x, 10, -14, 65504.0);
}

static double bf16_ref(float x) {
  return round_ref(x, 7, -126, ldexp(255.0, 120)); // (2 - 2^-7) * 2^127
}

// ---------------------------------------------------------------------------------------------
// f16

static void check_f16_value(float x, uint16_t want, const char *what) {
  uint16_t got = loom_f32_to_f16(x);
  if (got != want) {
    fail("f16 %s: f32 %.9g (0x%08X) -> 0x%04X, want 0x%04X", what, x, bits(x), got, want);
  }
}

static void test_f16_exhaustive(void) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float f = loom_f16_to_f32(h);
    uint16_t back = loom_f32_to_f16(f);
    if (f16_is_nan(h)) {
      if (!isnan(f) || !(bits(f) & 0x00400000u) || (bits(f) >> 31) != (uint32_t)(h >> 15)) {
        fail("f16 0x%04X (NaN) -> f32 0x%08X: want a quiet NaN of the same sign", h, bits(f));
      }
      if (!f16_is_nan(back) || (back >> 15) != (h >> 15) || !(back & 0x0200u)) {
        fail("f16 0x%04X (NaN) -> f32 -> 0x%04X: want a quiet NaN of the same sign", h, back);
      }
      if ((h & 0x0200u) && back != h) {
        fail("f16 quiet NaN 0x%04X -> f32 -> 0x%04X: want it unchanged", h, back);
      }
      continue;
    }
    double want = f16_value(h);
    if ((double)f != want || (bits(f) >> 31) != (uint32_t)(h >> 15)) {
      fail("f16 0x%04X -> f32 %.9g (0x%08X), want %.9g", h, f, bits(f), want);
    }
    if (back != h) {
      fail("f16 0x%04X -> f32 %.9g -> f16 0x%04X: round trip changed it", h, f, back);
    }
  }
}

// Every midpoint between adjacent finite f16 values (exact in f32), and its f32 neighbours.
static void test_f16_ties(void) {
  for (uint32_t h = 0; h < 0x7C00u; h++) {
    double lo = f16_value((uint16_t)h);
    double hi = h + 1 == 0x7C00u ? 65536.0 : f16_value((uint16_t)(h + 1));
    float mid = (float)((lo + hi) / 2);
    if ((double)mid != (lo + hi) / 2) {
      fail("f16 tie 0x%04X: midpoint not exact in f32 (test bug)", h);
      continue;
    }
    uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
    for (int s = 0; s < 2; s++) {
      uint16_t sign = s ? 0x8000u : 0;
      float m = s ? -mid : mid;
      check_f16_value(m, (uint16_t)(sign | even), "tie to even");
      check_f16_value(from_bits(bits(m) - 1), (uint16_t)(sign | h), "just below a tie");
      check_f16_value(from_bits(bits(m) + 1), (uint16_t)(sign | (h + 1)), "just above a tie");
    }
  }
}

static void test_f16_specials(void) {
  check_f16_value(65504.0f, 0x7BFF, "max");
  check_f16_value(65519.99f, 0x7BFF, "just below the overflow threshold");
  check_f16_value(65520.0f, 0x7C00, "overflow threshold (tie, rounds to Inf)");
  check_f16_value(-65520.0f, 0xFC00, "negative overflow threshold");
  check_f16_value(1e10f, 0x7C00, "large");
  check_f16_value(FLT_MAX, 0x7C00, "FLT_MAX");
  check_f16_value(INFINITY, 0x7C00, "+Inf");
  check_f16_value(-INFINITY, 0xFC00, "-Inf");
  check_f16_value(0.0f, 0x0000, "+0");
  check_f16_value(-0.0f, 0x8000, "-0");
  check_f16_value(1.0f, 0x3C00, "1");
  check_f16_value(-2.0f, 0xC000, "-2");
  check_f16_value(1.0f + 0x1p-11f, 0x3C00, "1 + 2^-11 (tie to even, down)");
  check_f16_value(1.0f + 3 * 0x1p-11f, 0x3C02, "1 + 3*2^-11 (tie to even, up)");
  check_f16_value(0x1p-14f, 0x0400, "smallest normal");
  check_f16_value(0x1p-14f - 0x1p-25f, 0x0400, "tie between largest subnormal and min normal");
  check_f16_value(0x3FFp-24f, 0x03FF, "largest subnormal");
  check_f16_value(0x1p-24f, 0x0001, "smallest subnormal 2^-24");
  check_f16_value(0x1p-25f, 0x0000, "2^-25 (tie to even, to 0)");
  check_f16_value(-0x1p-25f, 0x8000, "-2^-25 (tie to even, to -0)");
  check_f16_value(0.75f * 0x1p-24f, 0x0001, "0.75 * 2^-24 (rounds up)");
  check_f16_value(1.5f * 0x1p-24f, 0x0002, "1.5 * 2^-24 (tie to even, up)");
  check_f16_value(2.5f * 0x1p-24f, 0x0002, "2.5 * 2^-24 (tie to even, down)");
  check_f16_value(0x1p-26f, 0x0000, "2^-26");
  check_f16_value(FLT_MIN, 0x0000, "FLT_MIN");
  check_f16_value(from_bits(1), 0x0000, "smallest f32 subnormal");

  const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                           0x7FFFFFFFu, 0x7F802000u, 0x7FA00000u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t h = loom_f32_to_f16(from_bits(nans[i]));
    if (!f16_is_nan(h) || !(h & 0x0200u) || (h >> 15) != (nans[i] >> 31)) {
      fail("f16 NaN: f32 0x%08X -> 0x%04X: want a quiet NaN of the same sign", nans[i], h);
    }
  }
}

static void check_f16_random(float x) {
  if (isnan(x)) {
    return;
  }
  uint16_t h = loom_f32_to_f16(x);
  double want = f16_ref(x);
  if (f16_is_nan(h) || f16_value(h) != want || (h >> 15) != (bits(x) >> 31)) {
    fail("f16 random: f32 %.9g (0x%08X) -> 0x%04X (%.9g), want %.9g", x, bits(x), h,
         f16_is_nan(h) ? NAN : f16_value(h), want);
  }
}

static void test_f16_random(void) {
  for (int i = 0; i < 2000000; i++) {
    check_f16_random(from_bits(rng32())); // every exponent
    // Exponents where f16 is interesting: 2^-26 .. 2^17 (f32 biased 101..144).
    uint32_t e = 101 + rng32() % 44;
    check_f16_random(from_bits((rng32() & 0x807FFFFFu) | (e << 23)));
  }
}

// ---------------------------------------------------------------------------------------------
// bf16

static void check_bf16_value(float x, uint16_t want, const char *what) {
  uint16_t got = loom_f32_to_bf16(x);
  if (got != want) {
    fail("bf16 %s: f32 %.9g (0x%08X) -> 0x%04X, want 0x%04X", what, x, bits(x), got, want);
  }
}

static void test_bf16_exhaustive(void) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float f = loom_bf16_to_f32(h);
    uint16_t back = loom_f32_to_bf16(f);
    if (bf16_is_nan(h)) {
      if (!isnan(f) || !(bits(f) & 0x00400000u) || (bits(f) >> 31) != (uint32_t)(h >> 15)) {
        fail("bf16 0x%04X (NaN) -> f32 0x%08X: want a quiet NaN of the same sign", h, bits(f));
      }
      if (!bf16_is_nan(back) || (back >> 15) != (h >> 15) || !(back & 0x0040u)) {
        fail("bf16 0x%04X (NaN) -> f32 -> 0x%04X: want a quiet NaN of the same sign", h, back);
      }
      if ((h & 0x0040u) && back != h) {
        fail("bf16 quiet NaN 0x%04X -> f32 -> 0x%04X: want it unchanged", h, back);
      }
      continue;
    }
    if (bits(f) != (uint32_t)h << 16 || (double)f != bf16_value(h)) {
      fail("bf16 0x%04X -> f32 %.9g (0x%08X), want 0x%08X", h, f, bits(f), (uint32_t)h << 16);
    }
    if (back != h) {
      fail("bf16 0x%04X -> f32 %.9g -> bf16 0x%04X: round trip changed it", h, f, back);
    }
  }
}

// Every midpoint between adjacent finite bf16 values is an f32: check it and its neighbours.
static void test_bf16_ties(void) {
  for (uint32_t h = 0; h < 0x7F80u; h++) {
    uint32_t mid = (h << 16) | 0x8000u;
    uint16_t even = (h & 1u) ? (uint16_t)(h + 1) : (uint16_t)h;
    for (uint32_t s = 0; s < 2; s++) {
      uint32_t sign = s << 31;
      uint16_t hs = (uint16_t)(s << 15);
      check_bf16_value(from_bits(sign | mid), (uint16_t)(hs | even), "tie to even");
      check_bf16_value(from_bits(sign | (mid - 1)), (uint16_t)(hs | h), "just below a tie");
      check_bf16_value(from_bits(sign | (mid + 1)), (uint16_t)(hs | (h + 1)), "just above a tie");
    }
  }
}

static void test_bf16_specials(void) {
  check_bf16_value(1.0f, 0x3F80, "1");
  check_bf16_value(1.0f + 0x1p-8f, 0x3F80, "1 + 2^-8 (tie to even, down)");
  check_bf16_value(1.0f + 3 * 0x1p-8f, 0x3F82, "1 + 3*2^-8 (tie to even, up)");
  check_bf16_value(FLT_MAX, 0x7F80, "FLT_MAX (0x7F7FFFFF rounds to Inf)");
  check_bf16_value(-FLT_MAX, 0xFF80, "-FLT_MAX");
  check_bf16_value(from_bits(0x7F7F7FFFu), 0x7F7F, "just below the overflow threshold");
  check_bf16_value(from_bits(0x7F7F8000u), 0x7F80, "overflow threshold (tie, rounds to Inf)");
  check_bf16_value(INFINITY, 0x7F80, "+Inf");
  check_bf16_value(-INFINITY, 0xFF80, "-Inf");
  check_bf16_value(0.0f, 0x0000, "+0");
  check_bf16_value(-0.0f, 0x8000, "-0");
  check_bf16_value(from_bits(0x00000001u), 0x0000, "smallest f32 subnormal");
  check_bf16_value(from_bits(0x00008000u), 0x0000, "subnormal tie to even, to 0");
  check_bf16_value(from_bits(0x00008001u), 0x0001, "just above a subnormal tie");
  check_bf16_value(from_bits(0x00018000u), 0x0002, "subnormal tie to even, up");
  check_bf16_value(from_bits(0x007FFFFFu), 0x0080, "largest f32 subnormal rounds to FLT_MIN");
  check_bf16_value(from_bits(0x80008000u), 0x8000, "negative subnormal tie to -0");

  const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                           0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F80FFFFu, 0x7FBFFFFFu};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    uint16_t h = loom_f32_to_bf16(from_bits(nans[i]));
    if (!bf16_is_nan(h) || !(h & 0x0040u) || (h >> 15) != (nans[i] >> 31)) {
      fail("bf16 NaN: f32 0x%08X -> 0x%04X: want a quiet NaN of the same sign", nans[i], h);
    }
  }
}

static void check_bf16_random(float x) {
  if (isnan(x)) {
    return;
  }
  uint16_t h = loom_f32_to_bf16(x);
  double want = bf16_ref(x);
  if (bf16_is_nan(h) || bf16_value(h) != want || (h >> 15) != (bits(x) >> 31)) {
    fail("bf16 random: f32 %.9g (0x%08X) -> 0x%04X (%.9g), want %.9g", x, bits(x), h,
         bf16_is_nan(h) ? NAN : bf16_value(h), want);
  }
}

static void test_bf16_random(void) {
  for (int i = 0; i < 2000000; i++) {
    check_bf16_random(from_bits(rng32()));
    check_bf16_random(from_bits(rng32() & 0x80FFFFFFu)); // subnormals and the smallest normals
  }
}

// ---------------------------------------------------------------------------------------------
// Bulk variants equal the scalar ones bit for bit.

enum { BULK_N = 65536 + 4096 };

static uint16_t bulk_h[BULK_N]; // (BULK_N,) every 16-bit pattern, then random ones
static float bulk_f[BULK_N];    // (BULK_N,) every f16-exact float and random bit patterns
static uint16_t bulk_out_h[BULK_N];
static float bulk_out_f[BULK_N];

static void test_bulk(void) {
  for (uint32_t i = 0; i < BULK_N; i++) {
    bulk_h[i] = (uint16_t)(i < 65536 ? i : rng32());
    bulk_f[i] = i < 65536 ? loom_f16_to_f32((uint16_t)i) : from_bits(rng32());
  }
  loom_f32_to_f16_n(bulk_f, bulk_out_h, BULK_N);
  for (size_t i = 0; i < BULK_N; i++) {
    if (bulk_out_h[i] != loom_f32_to_f16(bulk_f[i])) {
      fail("loom_f32_to_f16_n[%zu]: f32 0x%08X -> 0x%04X, scalar gives 0x%04X", i, bits(bulk_f[i]),
           bulk_out_h[i], loom_f32_to_f16(bulk_f[i]));
    }
  }
  loom_f32_to_bf16_n(bulk_f, bulk_out_h, BULK_N);
  for (size_t i = 0; i < BULK_N; i++) {
    if (bulk_out_h[i] != loom_f32_to_bf16(bulk_f[i])) {
      fail("loom_f32_to_bf16_n[%zu]: f32 0x%08X -> 0x%04X, scalar gives 0x%04X", i, bits(bulk_f[i]),
           bulk_out_h[i], loom_f32_to_bf16(bulk_f[i]));
    }
  }
  loom_f16_to_f32_n(bulk_h, bulk_out_f, BULK_N);
  for (size_t i = 0; i < BULK_N; i++) {
    if (bits(bulk_out_f[i]) != bits(loom_f16_to_f32(bulk_h[i]))) {
      fail("loom_f16_to_f32_n[%zu]: f16 0x%04X -> 0x%08X, scalar gives 0x%08X", i, bulk_h[i],
           bits(bulk_out_f[i]), bits(loom_f16_to_f32(bulk_h[i])));
    }
  }
  loom_bf16_to_f32_n(bulk_h, bulk_out_f, BULK_N);
  for (size_t i = 0; i < BULK_N; i++) {
    if (bits(bulk_out_f[i]) != bits(loom_bf16_to_f32(bulk_h[i]))) {
      fail("loom_bf16_to_f32_n[%zu]: bf16 0x%04X -> 0x%08X, scalar gives 0x%08X", i, bulk_h[i],
           bits(bulk_out_f[i]), bits(loom_bf16_to_f32(bulk_h[i])));
    }
  }
  loom_f32_to_f16_n(bulk_f, bulk_out_h, 0); // n == 0 touches nothing
}

int main(void) {
  test_f16_exhaustive();
  test_f16_ties();
  test_f16_specials();
  test_f16_random();
  test_bf16_exhaustive();
  test_bf16_ties();
  test_bf16_specials();
  test_bf16_random();
  test_bulk();
  if (failures > 0) {
    printf("test_half: %d failure(s)%s\n", failures,
           failures > MAX_PRINTED ? " (first ones printed)" : "");
    return 1;
  }
  printf("test_half: all checks passed\n");
  return 0;
}
