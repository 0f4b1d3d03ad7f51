/* compress_codecs.c — the payload codecs: none, fp16, bf16, int8 (optionally stochastic), top-k,
 * random-k and error-feedback sign. Encoders write a header and a body; decoders check all. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "error.h"
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
  double k = ceil(c->ratio * (double)n);
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
// Selection for top-k: the k largest magnitudes, ties to the lower index, returned as sorted
// indices. Quickselect on (magnitude desc, index asc) keys.

typedef struct mag_idx {
  float mag;
  uint32_t idx;
} mag_idx_t;

static int before(mag_idx_t a, mag_idx_t b) { // a ranks ahead of b
  return a.mag > b.mag || (a.mag == b.mag && a.idx < b.idx);
}

static void select_top(mag_idx_t *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  uint64_t draw = 0x1234567ull;
  while (lo < hi) {
    draw = loom_mix64(draw);
    mag_idx_t pivot = v[lo + (int64_t)below(draw, (uint64_t)(hi - lo + 1))];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (before(v[i], pivot)) {
        i++;
      }
      while (before(pivot, v[j])) {
        j--;
      }
      if (i <= j) {
        mag_idx_t t = v[i];
        v[i++] = v[j];
        v[j--] = t;
      }
    }
    if (k - 1 <= j) {
      hi = j;
    } else if (k - 1 >= i) {
      lo = i;
    } else {
      return;
    }
  }
}

static int by_index(const void *a, const void *b) {
  uint32_t x = ((const mag_idx_t *)a)->idx, y = ((const mag_idx_t *)b)->idx;
  return x < y ? -1 : x > y;
}

// The k randomk indices for (n, seed), sorted: Floyd's sampling over a bitmap of n bits.
static loom_status_t random_indices(int64_t n, int64_t k, uint64_t seed, uint32_t *out) {
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
// Encoders.

static void encode_int8(const loom_compressor_t *c, const float *x, int64_t n, uint64_t seed,
                        uint8_t *body) {
  float mx = 0.0f;
  for (int64_t i = 0; i < n; i++) {
    float a = fabsf(x[i]);
    mx = a > mx ? a : mx;
  }
  float scale = mx / 127.0f, inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  memcpy(body, &scale, 4);
  int8_t *q = (int8_t *)(body + 4);
  for (int64_t i = 0; i < n; i++) {
    float v = x[i] * inv, r;
    if (c->stochastic) { // floor(v + u), u uniform in [0, 1): unbiased
      float u = (float)(loom_mix64(seed ^ (uint64_t)i) >> 40) * 0x1p-24f;
      r = floorf(v + u);
    } else {
      r = nearbyintf(v);
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
  mag_idx_t *v = malloc(sizeof(mag_idx_t) * (size_t)n);
  if (!v) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %lld selection keys", c->name,
                      (long long)n);
  }
  for (int64_t i = 0; i < n; i++) {
    v[i] = (mag_idx_t){fabsf(x[i]), (uint32_t)i};
  }
  select_top(v, n, k);
  qsort(v, (size_t)k, sizeof *v, by_index);
  for (int64_t j = 0; j < k; j++) {
    float val = x[v[j].idx];
    memcpy(body + 4 * j, &v[j].idx, 4);
    memcpy(body + 4 * k + 4 * j, &val, 4);
  }
  free(v);
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
  loom_status_t status = random_indices(n, k, seed, idx);
  for (int64_t j = 0; j < k && status == LOOM_OK; j++) {
    memcpy(body + 4 * j, &x[idx[j]], 4);
  }
  free(idx);
  return status;
}

static void encode_efsign(const float *x, int64_t n, uint8_t *body) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; i++) {
    sum += fabs((double)x[i]);
  }
  float scale = n > 0 ? (float)(sum / (double)n) : 0.0f;
  memcpy(body, &scale, 4);
  uint8_t *bits = body + 4;
  memset(bits, 0, ((size_t)n + 7) / 8);
  for (int64_t i = 0; i < n; i++) {
    if (signbit(x[i])) { // bit set: negative
      bits[i / 8] |= (uint8_t)(1u << (i % 8));
    }
  }
}

loom_status_t loom_codec_encode(const loom_compressor_t *c, const float *x, int64_t n,
                                uint64_t seed, uint8_t *payload, size_t cap, size_t *bytes) {
  *bytes = 0;
  if ((c->kind == LOOM_CODEC_TOPK || c->kind == LOOM_CODEC_RANDOMK) && n > (int64_t)UINT32_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %lld values: index-based compressors take at most 2^32 - 1 per tensor; "
                      "split the tensor",
                      c->name, (long long)n);
  }
  size_t need = loom_codec_max_bytes(c, n);
  int scaled =
      c->kind == LOOM_CODEC_INT8 || c->kind == LOOM_CODEC_EFSIGN || c->kind == LOOM_CODEC_TOPK;
  if (scaled && !all_finite(x, n)) { // NaN/Inf cannot be scaled or ranked: flag and send nothing
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
    for (int64_t i = 0; i < n; i++) {
      uint16_t h = loom_f32_to_f16(x[i]);
      memcpy(body + 2 * i, &h, 2);
    }
    break;
  case LOOM_CODEC_BF16:
    for (int64_t i = 0; i < n; i++) {
      uint16_t h = loom_f32_to_bf16(x[i]);
      memcpy(body + 2 * i, &h, 2);
    }
    break;
  case LOOM_CODEC_INT8:
    encode_int8(c, x, n, seed, body);
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

static loom_status_t check_header(const loom_compressor_t *c, const uint8_t *p, size_t bytes,
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

static loom_status_t check_scale(const loom_compressor_t *c, const uint8_t *body, float *scale) {
  memcpy(scale, body, 4);
  if (!isfinite(*scale) || *scale < 0.0f) {
    return corrupt(c, "the scale is negative or not finite");
  }
  return LOOM_OK;
}

loom_status_t loom_codec_decode_add(const loom_compressor_t *c, const uint8_t *payload,
                                    size_t bytes, int64_t n, uint64_t seed, float *acc) {
  uint32_t flags = 0;
  loom_status_t status = check_header(c, payload, bytes, n, &flags);
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
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, body + 2 * i, 2);
      acc[i] += c->kind == LOOM_CODEC_FP16 ? loom_f16_to_f32(h) : loom_bf16_to_f32(h);
    }
    break;
  case LOOM_CODEC_INT8: {
    if ((status = check_scale(c, body, &scale)) != LOOM_OK) {
      return status;
    }
    const int8_t *q = (const int8_t *)(body + 4);
    for (int64_t i = 0; i < n; i++) {
      if (q[i] == -128) {
        return corrupt(c, "a quantised value of -128 (the encoder emits -127..127)");
      }
    }
    for (int64_t i = 0; i < n; i++) {
      acc[i] += (float)q[i] * scale;
    }
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
    status = random_indices(n, k, seed, idx);
    for (int64_t j = 0; j < k && status == LOOM_OK; j++) {
      float v;
      memcpy(&v, body + 4 * j, 4);
      acc[idx[j]] += v;
    }
    free(idx);
    return status;
  }
  case LOOM_CODEC_EFSIGN: {
    if ((status = check_scale(c, body, &scale)) != LOOM_OK) {
      return status;
    }
    const uint8_t *bits = body + 4;
    if (n % 8 && bits[n / 8] >> (n % 8)) {
      return corrupt(c, "padding bits after the last sign are set");
    }
    for (int64_t i = 0; i < n; i++) {
      acc[i] += (bits[i / 8] >> (i % 8) & 1u) ? -scale : scale;
    }
    break;
  }
  case LOOM_CODEC_POWERSGD:
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "powersgd has no payload codec");
  }
  return LOOM_OK;
}
