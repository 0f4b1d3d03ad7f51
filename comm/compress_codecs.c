/* compress_codecs.c — the payload codecs: none, fp16, bf16, int8 (optionally stochastic), top-k,
 * random-k and error-feedback sign. Encoders write a header and a body; decoders check all. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "error.h"
#include "cpu/simd.h"
#include "loom_tensor.h"

// ---------------------------------------------------------------------------------------------
// Helpers.

uint64_t loom_mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) from a 64-bit draw (multiply-high: no modulo bias worth the name).
static uint64_t below(uint64_t draw, uint64_t bound) {
  return (uint64_t)(((unsigned __int128)draw * bound) >> 64);
}

int64_t loom_codec_keep(const loom_compressor_t *c, int64_t n) {
  if (n <= 0) {
    return 0;
  }
  // ceil(ratio n), forgiving the rounding of the decimal ratio: 0.07 * 100 is 7.000000000000001
  // in double, and must keep 7 values, not 8.
  double k = ceil(c->ratio * (double)n * (1.0 - 1e-12));
  if (k < 1.0) {
    k = 1.0;
  }
  return k > (double)n ? n : (int64_t)k;
}

static size_t body_bytes(const loom_compressor_t *c, int64_t n) {
  size_t un = (size_t)n;
  switch (c->kind) {
  case LOOM_CODEC_NONE:
    return 4 * un;
  case LOOM_CODEC_FP16:
  case LOOM_CODEC_BF16:
    return 2 * un;
  case LOOM_CODEC_INT8:
    return 4 + un;
  case LOOM_CODEC_TOPK:
    return 8 * (size_t)loom_codec_keep(c, n); // u32 index + f32 value
  case LOOM_CODEC_RANDOMK:
    return 4 * (size_t)loom_codec_keep(c, n);
  case LOOM_CODEC_EFSIGN:
    return 4 + (un + 7) / 8;
  case LOOM_CODEC_POWERSGD:
    return 0;
  }
  return 0;
}

size_t loom_codec_max_bytes(const loom_compressor_t *c, int64_t n) {
  return c->kind == LOOM_CODEC_POWERSGD ? 0 : LOOM_PAYLOAD_HEADER + body_bytes(c, n);
}

static void put_header(uint8_t *p, const loom_compressor_t *c, int64_t n, uint32_t flags) {
  loom_payload_header_t h = {LOOM_PAYLOAD_MAGIC, (uint8_t)c->kind, LOOM_PAYLOAD_VERSION, flags,
                             (uint64_t)n};
  memcpy(p, &h, sizeof h);
}

static int all_finite(const float *x, int64_t n) {
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    ok &= isfinite(x[i]) != 0;
  }
  return ok;
}

static loom_status_t corrupt(const loom_compressor_t *c, const char *what) {
  return loom_error(NULL, LOOM_ERR_CORRUPT,
                    "%s payload: %s: the payload was damaged or comes from another compressor or "
                    "tensor (every rank must use the same compressor and sizes)",
                    c->name, what);
}

// ---------------------------------------------------------------------------------------------
// Selection for top-k: the k largest magnitudes, ties to the lower index, in index order. A
// sorting-free three-pass method: a threshold from a strided sample (with a margin) keeps a few
// more than k candidates in one pass; the k-th largest candidate magnitude T is found by
// quickselect; a last pass over the candidates keeps every magnitude above T and the first ones
// equal to T. The result is exact; the sample only decides how much work the middle pass does.

// The k-th largest (1-based) of v[0..n), reordering v.
static float kth_largest(float *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1, want = k - 1;
  uint64_t draw = 0x5eedull;
  while (lo < hi) {
    draw = loom_mix64(draw);
    float pivot = v[lo + (int64_t)below(draw, (uint64_t)(hi - lo + 1))];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (v[i] > pivot) {
        i++;
      }
      while (v[j] < pivot) {
        j--;
      }
      if (i <= j) {
        float t = v[i];
        v[i++] = v[j];
        v[j--] = t;
      }
    }
    if (want <= j) {
      hi = j;
    } else if (want >= i) {
      lo = i;
    } else {
      return v[want];
    }
  }
  return v[want];
}

// idx[0..k) = the top-k indices of x in increasing order. scratch holds n floats + n indices
// worth of room (the candidates).
static void select_top(const float *x, int64_t n, int64_t k, uint32_t *idx, float *mag,
                       uint32_t *cand) {
  enum { SAMPLE = 65536 };
  float thr = 0.0f;
  if (n > 4 * (int64_t)SAMPLE) { // a strided sample of SAMPLE magnitudes
    const int64_t stride = n / SAMPLE;
    for (int64_t s = 0; s < SAMPLE; s++) {
      mag[s] = fabsf(x[s * stride]);
    }
    int64_t want = (int64_t)((double)k / (double)n * SAMPLE * 1.25) + 64;
    thr = want < SAMPLE ? kth_largest(mag, SAMPLE, want) : 0.0f;
  }
  if (thr == 0.0f) { // sparse input (a summed top-k shard): maybe no more than k non-zeros
    int64_t nz = 0;
    for (int64_t i = 0; i < n; i++) {
      nz += x[i] != 0.0f;
    }
    if (nz <= k) { // all of them, and the first zeros (ties go to the lower index)
      int64_t zeros = k - nz, out = 0;
      for (int64_t i = 0; i < n && out < k; i++) {
        if (x[i] != 0.0f || zeros-- > 0) {
          idx[out++] = (uint32_t)i;
        }
      }
      return;
    }
  }
  for (;;) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
      if (fabsf(x[i]) >= thr) {
        cand[m++] = (uint32_t)i;
      }
    }
    if (m < k) { // the sample overestimated the threshold: take everything
      thr = 0.0f;
      continue;
    }
    for (int64_t j = 0; j < m; j++) {
      mag[j] = fabsf(x[cand[j]]);
    }
    float t = kth_largest(mag, m, k);
    int64_t above = 0;
    for (int64_t j = 0; j < m; j++) {
      above += fabsf(x[cand[j]]) > t;
    }
    int64_t ties = k - above, out = 0;
    for (int64_t j = 0; j < m && out < k; j++) {
      float a = fabsf(x[cand[j]]);
      if (a > t || (a == t && ties-- > 0)) {
        idx[out++] = cand[j];
      }
    }
    return;
  }
}

// The k randomk indices for (n, seed), sorted: Floyd's sampling over a bitmap of n bits.
loom_status_t loom_codec_random_indices(int64_t n, int64_t k, uint64_t seed, uint32_t *out) {
  uint64_t *bits = calloc(((size_t)n + 63) / 64, sizeof(uint64_t));
  if (!bits) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "randomk: cannot allocate a bitmap of %lld bits",
                      (long long)n);
  }
  uint64_t state = loom_mix64(seed ^ 0x72616e646f6d6bull); // "randomk"
  for (int64_t j = n - k; j < n; j++) {
    state = loom_mix64(state);
    uint64_t t = below(state, (uint64_t)j + 1);
    if (bits[t / 64] >> (t % 64) & 1u) {
      t = (uint64_t)j; // Floyd: j itself is new
    }
    bits[t / 64] |= 1ull << (t % 64);
  }
  int64_t m = 0;
  for (int64_t w = 0; w < (n + 63) / 64; w++) {
    for (uint64_t b = bits[w]; b; b &= b - 1) {
      out[m++] = (uint32_t)(w * 64 + __builtin_ctzll(b));
    }
  }
  free(bits);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------
// Bulk kernels, branch-free so that they vectorise (with AVX2/AVX-512 copies, LOOM_CPU_CLONES):
// the scalar conversions of runtime/half.c cost ~4 ns a value, several times the 1 Gbit/s
// transfer time they are meant to save.

static inline uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

static inline float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

// f32 -> f16, round to nearest even, the same bits as loom_f32_to_f16. Normal results rebias the
// exponent and round the 13 dropped bits with an integer add; subnormal results come from adding
// 0.5f, which aligns the value so that the FPU's own rounding drops the right bits.
LOOM_CPU_CLONES
static void to_f16(const float *restrict x, uint16_t *restrict out, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = bits_of(x[i]), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
    uint32_t normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
    normal = normal > 0x7C00u ? 0x7C00u : normal;
    uint32_t sub = bits_of(float_of(a) + 0.5f) - bits_of(0.5f);
    uint32_t r = a > 0x7F800000u ? nan : (a >= 0x38800000u ? normal : sub);
    out[i] = (uint16_t)(sign | r);
  }
}

// acc += f16 -> f32. Normal and zero/subnormal inputs: shift the bits into place and rescale by
// 2^112 (exact: the product is representable); Inf/NaN: exponent forced to 255.
LOOM_CPU_CLONES
static void add_f16(const uint16_t *restrict h, float *restrict acc, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t v = h[i], sign = (v & 0x8000u) << 16, em = (v & 0x7FFFu) << 13;
    float finite = float_of(em) * 0x1p112f;
    uint32_t special = 0x7F800000u | em | ((em & 0x007FFFFFu) ? 0x00400000u : 0u);
    uint32_t r = (v & 0x7C00u) == 0x7C00u ? special : bits_of(finite);
    acc[i] += float_of(sign | r);
  }
}

LOOM_CPU_CLONES
static void to_bf16(const float *restrict x, uint16_t *restrict out, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = bits_of(x[i]);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x0040u;
    out[i] = (uint16_t)((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet : rounded);
  }
}

LOOM_CPU_CLONES
static void add_bf16(const uint16_t *restrict h, float *restrict acc, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)h[i] << 16;
    u |= (u & 0x7FFFFFFFu) > 0x7F800000u ? 0x00400000u : 0u;
    acc[i] += float_of(u);
  }
}

// The largest magnitude's bits (sign cleared): an unsigned max over the bit patterns, which
// orders finite floats by magnitude, puts Inf above them and NaN above Inf, and vectorises
// (a float max with NaN in play does not). >= 0x7F800000 means a NaN or an infinity.
LOOM_CPU_CLONES
static uint32_t max_abs_bits(const float *restrict x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t a = bits_of(x[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}

// Round to nearest even without a libm call: |v| <= 127.5 here, far below 2^22.
static inline float round_even(float v) {
  return (v + 12582912.0f) - 12582912.0f; // 1.5 * 2^23
}

LOOM_CPU_CLONES
static void quantise(const float *restrict x, int8_t *restrict q, int64_t n, float inv) {
  for (int64_t i = 0; i < n; i++) {
    float r = round_even(x[i] * inv);
    r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
    q[i] = (int8_t)r;
  }
}

LOOM_CPU_CLONES
static void add_int8(const int8_t *restrict q, float *restrict acc, int64_t n, float scale) {
  for (int64_t i = 0; i < n; i++) {
    acc[i] += (float)q[i] * scale;
  }
}

// Mean magnitude, in double with eight partial sums (a fixed order: the same on every rank).
LOOM_CPU_CLONES
static double sum_abs(const float *restrict x, int64_t n) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0}, tail = 0.0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; l++) {
      part[l] += fabs((double)x[i + l]);
    }
  }
  for (; i < n; i++) {
    tail += fabs((double)x[i]);
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) +
         tail;
}

// Sign bits, 8 a byte (bit b of byte j: value 8 j + b is negative), without branches.
LOOM_CPU_CLONES
static void pack_signs(const float *restrict x, uint8_t *restrict bits, int64_t n) {
  for (int64_t j = 0; j < n / 8; j++) {
    uint32_t byte = 0;
    for (int b = 0; b < 8; b++) {
      byte |= (bits_of(x[8 * j + b]) >> 31) << b;
    }
    bits[j] = (uint8_t)byte;
  }
  if (n % 8) {
    uint32_t byte = 0;
    for (int64_t i = n - n % 8; i < n; i++) {
      byte |= (bits_of(x[i]) >> 31) << (i % 8);
    }
    bits[n / 8] = (uint8_t)byte;
  }
}

// acc[i] += +-scale by sign bit i, the sign put straight into the float's sign bit.
LOOM_CPU_CLONES
static void add_signs(const uint8_t *restrict bits, float *restrict acc, int64_t n, float scale) {
  const uint32_t s = bits_of(scale);
  for (int64_t i = 0; i < n; i++) {
    uint32_t neg = (uint32_t)(bits[i / 8] >> (i % 8)) & 1u;
    acc[i] += float_of(s | (neg << 31));
  }
}

// ---------------------------------------------------------------------------------------------
// Encoders.

// max_bits: max_abs_bits(x, n), finite (the caller checked it).
static void encode_int8(const loom_compressor_t *c, const float *x, int64_t n, uint64_t seed,
                        uint8_t *body, uint32_t max_bits) {
  float mx = float_of(max_bits);
  float scale = mx / 127.0f;
  if (isinf(127.0f * scale)) { // near FLT_MAX: 127 * scale must not decode to Inf
    scale = nextafterf(scale, 0.0f);
  }
  memcpy(body, &scale, 4);
  int8_t *q = (int8_t *)(body + 4);
  // 127 / mx overflows below mx ~ 3.7e-37: then divide by the (subnormal) scale instead.
  const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  const int divide = isinf(inv);
  if (!c->stochastic && !divide) {
    quantise(x, q, n, inv);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    float v = scale > 0.0f ? (divide ? x[i] / scale : x[i] * inv) : 0.0f, r;
    if (c->stochastic) { // floor(v + u), u uniform in [0, 1): unbiased
      float u = (float)(loom_mix64(seed ^ (uint64_t)i) >> 40) * 0x1p-24f;
      r = floorf(v + u);
    } else {
      r = round_even(v);
    }
    r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
    q[i] = (int8_t)r;
  }
}

static loom_status_t encode_topk(const loom_compressor_t *c, const float *x, int64_t n,
                                 uint8_t *body) {
  int64_t k = loom_codec_keep(c, n);
  if (k == 0) {
    return LOOM_OK;
  }
  // mag: n floats of magnitudes; cand: n candidate indices; idx: the k chosen.
  float *mag = malloc(sizeof(float) * (size_t)n);
  uint32_t *cand = malloc(sizeof(uint32_t) * (size_t)n),
           *idx = malloc(sizeof(uint32_t) * (size_t)k);
  if (!mag || !cand || !idx) {
    free(mag);
    free(cand);
    free(idx);
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate selection space for %lld values",
                      c->name, (long long)n);
  }
  select_top(x, n, k, idx, mag, cand);
  for (int64_t j = 0; j < k; j++) {
    memcpy(body + 4 * j, &idx[j], 4);
    memcpy(body + 4 * k + 4 * j, &x[idx[j]], 4);
  }
  free(mag);
  free(cand);
  free(idx);
  return LOOM_OK;
}

static loom_status_t encode_randomk(const loom_compressor_t *c, const float *x, int64_t n,
                                    uint64_t seed, uint8_t *body) {
  int64_t k = loom_codec_keep(c, n);
  if (k == 0) {
    return LOOM_OK;
  }
  uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)k);
  if (!idx) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %lld indices", c->name,
                      (long long)k);
  }
  loom_status_t status = loom_codec_random_indices(n, k, seed, idx);
  for (int64_t j = 0; j < k && status == LOOM_OK; j++) {
    memcpy(body + 4 * j, &x[idx[j]], 4);
  }
  free(idx);
  return status;
}

static void encode_efsign(const float *x, int64_t n, uint8_t *body) {
  float scale = n > 0 ? (float)(sum_abs(x, n) / (double)n) : 0.0f;
  memcpy(body, &scale, 4);
  pack_signs(x, body + 4, n);
}

// top-k and random-k index values with u32: n must fit (encode and decode alike).
static loom_status_t check_index_limit(const loom_compressor_t *c, int64_t n) {
  if ((c->kind == LOOM_CODEC_TOPK || c->kind == LOOM_CODEC_RANDOMK) && n > (int64_t)UINT32_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %lld values: index-based compressors take at most 2^32 - 1 per tensor; "
                      "split the tensor",
                      c->name, (long long)n);
  }
  return LOOM_OK;
}

loom_status_t loom_codec_encode(const loom_compressor_t *c, const float *x, int64_t n,
                                uint64_t seed, uint8_t *payload, size_t cap, size_t *bytes) {
  *bytes = 0;
  loom_status_t limit = check_index_limit(c, n);
  if (limit != LOOM_OK) {
    return limit;
  }
  size_t need = loom_codec_max_bytes(c, n);
  int scaled =
      c->kind == LOOM_CODEC_INT8 || c->kind == LOOM_CODEC_EFSIGN || c->kind == LOOM_CODEC_TOPK;
  // NaN/Inf cannot be scaled or ranked: flag and send nothing. int8 learns it from the same
  // max pass it needs for its scale (one pass over the values instead of two).
  const uint32_t max_bits = c->kind == LOOM_CODEC_INT8 ? max_abs_bits(x, n) : 0;
  const int nonfinite =
      c->kind == LOOM_CODEC_INT8 ? max_bits >= 0x7F800000u : scaled && !all_finite(x, n);
  if (nonfinite) {
    if (cap < LOOM_PAYLOAD_HEADER) {
      goto small;
    }
    put_header(payload, c, n, LOOM_PAYLOAD_NONFINITE);
    *bytes = LOOM_PAYLOAD_HEADER;
    return LOOM_OK;
  }
  if (cap < need) {
    goto small;
  }
  put_header(payload, c, n, 0);
  uint8_t *body = payload + LOOM_PAYLOAD_HEADER;
  loom_status_t status = LOOM_OK;
  switch (c->kind) {
  case LOOM_CODEC_NONE:
    if (n > 0) {
      memcpy(body, x, 4 * (size_t)n);
    }
    break;
  case LOOM_CODEC_FP16:
  case LOOM_CODEC_BF16:
    if ((uintptr_t)body % 2) { // a payload at an odd address: convert through an aligned copy
      uint16_t tmp[1024];
      for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        int64_t m = n - i0 < 1024 ? n - i0 : 1024;
        if (c->kind == LOOM_CODEC_FP16) {
          to_f16(x + i0, tmp, m);
        } else {
          to_bf16(x + i0, tmp, m);
        }
        memcpy(body + 2 * i0, tmp, (size_t)m * 2);
      }
    } else {
      (c->kind == LOOM_CODEC_FP16 ? to_f16 : to_bf16)(x, (uint16_t *)(void *)body, n);
    }
    break;
  case LOOM_CODEC_INT8:
    encode_int8(c, x, n, seed, body, max_bits);
    break;
  case LOOM_CODEC_TOPK:
    status = encode_topk(c, x, n, body);
    break;
  case LOOM_CODEC_RANDOMK:
    status = encode_randomk(c, x, n, seed, body);
    break;
  case LOOM_CODEC_EFSIGN:
    encode_efsign(x, n, body);
    break;
  case LOOM_CODEC_POWERSGD:
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "powersgd has no payload codec");
  }
  if (status == LOOM_OK) {
    *bytes = need;
  }
  return status;
small:
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "%s: payload buffer of %zu bytes, %zu needed for %lld values: size it with "
                    "loom_compressor_max_bytes",
                    c->name, cap, need, (long long)n);
}

// ---------------------------------------------------------------------------------------------
// Decoders: check the header and the whole body first, then accumulate.

loom_status_t loom_codec_check_header(const loom_compressor_t *c, const uint8_t *p, size_t bytes,
                                      int64_t n, uint32_t *flags) {
  if (bytes < LOOM_PAYLOAD_HEADER) {
    return corrupt(c, "shorter than its 16-byte header");
  }
  loom_payload_header_t h;
  memcpy(&h, p, sizeof h);
  if (h.magic != LOOM_PAYLOAD_MAGIC || h.version != LOOM_PAYLOAD_VERSION) {
    return corrupt(c, "bad magic or version");
  }
  if (h.kind != (uint8_t)c->kind) {
    return corrupt(c, "the header names another compressor");
  }
  if (h.n != (uint64_t)n) {
    return corrupt(c, "the header's element count differs from the tensor's");
  }
  if (h.flags & ~(uint32_t)LOOM_PAYLOAD_NONFINITE) {
    return corrupt(c, "unknown flags");
  }
  *flags = h.flags;
  size_t want =
      (h.flags & LOOM_PAYLOAD_NONFINITE) ? LOOM_PAYLOAD_HEADER : loom_codec_max_bytes(c, n);
  if (bytes != want) {
    return corrupt(c, bytes < want ? "truncated" : "longer than its contents");
  }
  return LOOM_OK;
}

loom_status_t loom_codec_check_scale(const loom_compressor_t *c, const uint8_t *body,
                                     float *scale) {
  memcpy(scale, body, 4);
  if (!isfinite(*scale) || *scale < 0.0f) {
    return corrupt(c, "the scale is negative or not finite");
  }
  if (c->kind == LOOM_CODEC_INT8 && isinf(127.0f * *scale)) { // the encoder keeps it finite
    return corrupt(c, "the scale is so large that 127 * scale overflows to infinity");
  }
  return LOOM_OK;
}

loom_status_t loom_codec_decode_add(const loom_compressor_t *c, const uint8_t *payload,
                                    size_t bytes, int64_t n, uint64_t seed, float *acc) {
  uint32_t flags = 0;
  loom_status_t status = check_index_limit(c, n);
  if (status == LOOM_OK) {
    status = loom_codec_check_header(c, payload, bytes, n, &flags);
  }
  if (status != LOOM_OK) {
    return status;
  }
  if (flags & LOOM_PAYLOAD_NONFINITE) {
    for (int64_t i = 0; i < n; i++) {
      acc[i] += NAN;
    }
    return LOOM_OK;
  }
  const uint8_t *body = payload + LOOM_PAYLOAD_HEADER;
  float scale = 0.0f;
  int64_t k = loom_codec_keep(c, n);
  switch (c->kind) {
  case LOOM_CODEC_NONE:
    for (int64_t i = 0; i < n; i++) {
      float v;
      memcpy(&v, body + 4 * i, 4);
      acc[i] += v;
    }
    break;
  case LOOM_CODEC_FP16:
  case LOOM_CODEC_BF16:
    if ((uintptr_t)body % 2) { // a payload at an odd address: decode through an aligned copy
      uint16_t tmp[1024];
      for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        int64_t m = n - i0 < 1024 ? n - i0 : 1024;
        memcpy(tmp, body + 2 * i0, (size_t)m * 2);
        (c->kind == LOOM_CODEC_FP16 ? add_f16 : add_bf16)(tmp, acc + i0, m);
      }
    } else {
      (c->kind == LOOM_CODEC_FP16 ? add_f16 : add_bf16)((const uint16_t *)(const void *)body, acc,
                                                        n);
    }
    break;
  case LOOM_CODEC_INT8: {
    if ((status = loom_codec_check_scale(c, body, &scale)) != LOOM_OK) {
      return status;
    }
    const int8_t *q = (const int8_t *)(body + 4);
    for (int64_t i = 0; i < n; i++) {
      if (q[i] == -128) {
        return corrupt(c, "a quantised value of -128 (the encoder emits -127..127)");
      }
    }
    add_int8(q, acc, n, scale);
    break;
  }
  case LOOM_CODEC_TOPK: {
    const uint8_t *vals = body + 4 * k;
    uint32_t prev = 0;
    for (int64_t j = 0; j < k; j++) {
      uint32_t idx;
      memcpy(&idx, body + 4 * j, 4);
      if ((int64_t)idx >= n || (j > 0 && idx <= prev)) {
        return corrupt(c, "an index out of range or not increasing");
      }
      prev = idx;
    }
    for (int64_t j = 0; j < k; j++) {
      uint32_t idx;
      float v;
      memcpy(&idx, body + 4 * j, 4);
      memcpy(&v, vals + 4 * j, 4);
      acc[idx] += v;
    }
    break;
  }
  case LOOM_CODEC_RANDOMK: {
    if (k == 0) {
      break;
    }
    uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)k);
    if (!idx) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %lld indices", c->name,
                        (long long)k);
    }
    status = loom_codec_random_indices(n, k, seed, idx);
    for (int64_t j = 0; j < k && status == LOOM_OK; j++) {
      float v;
      memcpy(&v, body + 4 * j, 4);
      acc[idx[j]] += v;
    }
    free(idx);
    return status;
  }
  case LOOM_CODEC_EFSIGN: {
    if ((status = loom_codec_check_scale(c, body, &scale)) != LOOM_OK) {
      return status;
    }
    const uint8_t *bits = body + 4;
    if (n % 8 && bits[n / 8] >> (n % 8)) {
      return corrupt(c, "padding bits after the last sign are set");
    }
    add_signs(bits, acc, n, scale);
    break;
  }
  case LOOM_CODEC_POWERSGD:
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "powersgd has no payload codec");
  }
  return LOOM_OK;
}
