/* compress.c — the compressor registry (spec strings in, loom_compressor_t out), the public
 * encode/decode wrappers, and the per-name error-feedback table (residuals and side state). */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "error.h"
#include "loom_tensor.h"

// ---------------------------------------------------------------------------------------------
// Registry.

#define SPECS "none, fp16, bf16, int8, int8:sr, topk:RATIO, randomk:RATIO, efsign, powersgd:RANK"

// A bad spec's message: the spec, why, and the valid ones.
#define BAD_SPEC                                                                                   \
  "compressor '%s': %s; valid compressors: " SPECS " (RATIO in (0, 1], RANK >= 1), e.g. topk:0.01"

// RATIO after "name:" in (0, 1].
static int parse_ratio(const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double r = strtod(s, &end);
  if (errno || end == s || *end || !(r > 0.0) || r > 1.0) {
    return 0;
  }
  *out = r;
  return 1;
}

// c->name for topk:RATIO and randomk:RATIO: the shortest decimal that parses back to the same
// double ("%g" alone would round it, and another rank parsing the rounded name would keep a
// different number of values).
static void name_ratio(loom_compressor_t *c) {
  char num[32] = "";
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(num, sizeof num, "%.*g", digits, c->ratio);
    if (strtod(num, NULL) == c->ratio) {
      break;
    }
  }
  snprintf(c->name, sizeof c->name, "%s:%s", c->kind == LOOM_CODEC_TOPK ? "topk" : "randomk", num);
}

// Parse spec into *c (zeroed by the caller). Returns NULL, or why spec is not a compressor.
static const char *parse_spec(const char *spec, loom_compressor_t *c) {
  if (!spec || !*spec) {
    return "empty";
  }
  const char *colon = strchr(spec, ':');
  size_t base = colon ? (size_t)(colon - spec) : strlen(spec);
  const char *arg = colon ? colon + 1 : NULL;
#define IS(word) (base == strlen(word) && strncmp(spec, word, base) == 0)
  if (IS("none") && !arg) {
    c->kind = LOOM_CODEC_NONE;
    snprintf(c->name, sizeof c->name, "none");
  } else if (IS("fp16") && !arg) {
    c->kind = LOOM_CODEC_FP16;
    snprintf(c->name, sizeof c->name, "fp16");
  } else if (IS("bf16") && !arg) {
    c->kind = LOOM_CODEC_BF16;
    snprintf(c->name, sizeof c->name, "bf16");
  } else if (IS("int8")) {
    if (arg && strcmp(arg, "sr") != 0) {
      return "int8 takes no option or ':sr' (stochastic rounding)";
    }
    c->kind = LOOM_CODEC_INT8;
    c->stochastic = arg != NULL;
    snprintf(c->name, sizeof c->name, "%s", arg ? "int8:sr" : "int8");
  } else if (IS("topk") || IS("randomk")) {
    c->kind = IS("topk") ? LOOM_CODEC_TOPK : LOOM_CODEC_RANDOMK;
    if (!arg || !parse_ratio(arg, &c->ratio)) {
      return "topk and randomk need a ratio in (0, 1] after ':'";
    }
    name_ratio(c);
  } else if (IS("efsign") && !arg) {
    c->kind = LOOM_CODEC_EFSIGN;
    snprintf(c->name, sizeof c->name, "efsign");
  } else if (IS("powersgd")) {
    char *end = NULL;
    long r = arg ? strtol(arg, &end, 10) : 0;
    if (!arg || end == arg || *end || r < 1 || r > 1024) {
      return "powersgd needs a rank in 1..1024 after ':'";
    }
    c->kind = LOOM_CODEC_POWERSGD;
    c->rank = (int)r;
    snprintf(c->name, sizeof c->name, "powersgd:%d", c->rank);
  } else {
    return arg ? "unknown name or an option it does not take" : "unknown name";
  }
#undef IS
  return NULL;
}

loom_status_t loom_compressor_create(const char *spec, loom_compressor_t **out) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_compressor_create: out is NULL");
  }
  *out = NULL;
  loom_compressor_t c = {0};
  const char *why = parse_spec(spec, &c);
  if (why) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, BAD_SPEC, spec ? spec : "(null)", why);
  }
  loom_compressor_t *p = malloc(sizeof *p);
  if (!p) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_compressor_create: out of memory");
  }
  *p = c;
  *out = p;
  return LOOM_OK;
}

loom_status_t loom_compressor_check(const char *spec) {
  loom_compressor_t c = {0};
  const char *why = parse_spec(spec, &c);
  return why ? loom_error_unlogged(LOOM_ERR_INVALID_ARG, BAD_SPEC, spec ? spec : "(null)", why)
             : LOOM_OK;
}

void loom_compressor_destroy(loom_compressor_t *c) {
  free(c);
}

const char *loom_compressor_name(const loom_compressor_t *c) {
  return c ? c->name : "(null)";
}

int loom_compressor_summable(const loom_compressor_t *c) {
  return c &&
         (c->kind == LOOM_CODEC_NONE || c->kind == LOOM_CODEC_FP16 || c->kind == LOOM_CODEC_BF16);
}

int loom_compressor_lowrank(const loom_compressor_t *c) {
  return c && c->kind == LOOM_CODEC_POWERSGD;
}

size_t loom_compressor_max_bytes(const loom_compressor_t *c, int64_t n) {
  if (!c || n < 0) {
    return 0;
  }
  // At most 8 bytes a value (top-k: index and value) and the header: past this, size_t wraps.
  if (c->kind != LOOM_CODEC_POWERSGD && (uint64_t)n > (SIZE_MAX - LOOM_PAYLOAD_HEADER) / 8 - 1) {
    return SIZE_MAX;
  }
  return loom_codec_max_bytes(c, n);
}

static loom_status_t check_codec_args(const char *op, const loom_compressor_t *c, const void *p,
                                      const float *x, int64_t n) {
  if (!c || !p || n < 0 || (n > 0 && !x)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: compressor %s, payload %s, values %s, n = %lld: pass a compressor, "
                      "buffers and n >= 0",
                      op, c ? "set" : "NULL", p ? "set" : "NULL", x ? "set" : "NULL", (long long)n);
  }
  if (c->kind == LOOM_CODEC_POWERSGD) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is a low-rank scheme, not a payload codec: use "
                      "loom_compressed_allreduce",
                      op, c->name);
  }
  if (loom_compressor_max_bytes(c, n) == SIZE_MAX) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: n = %lld values: the %s payload would not fit in memory; split the "
                      "tensor",
                      op, (long long)n, c->name);
  }
  return LOOM_OK;
}

loom_status_t loom_compressor_encode(const loom_compressor_t *c, const float *x, int64_t n,
                                     uint64_t seed, void *payload, size_t cap, size_t *bytes) {
  size_t ignored;
  loom_status_t status = check_codec_args("loom_compressor_encode", c, payload, x, n);
  return status != LOOM_OK
             ? status
             : loom_codec_encode(c, x, n, seed, payload, cap, bytes ? bytes : &ignored);
}

loom_status_t loom_compressor_decode_add(const loom_compressor_t *c, const void *payload,
                                         size_t bytes, int64_t n, uint64_t seed, float *acc) {
  loom_status_t status = check_codec_args("loom_compressor_decode_add", c, payload, acc, n);
  return status != LOOM_OK ? status : loom_codec_decode_add(c, payload, bytes, n, seed, acc);
}

// ---------------------------------------------------------------------------------------------
// Error feedback: a table of named float vectors (residuals) plus a side table (PowerSGD's Q),
// searched linearly (a model has at most a few hundred gradient tensors and lookups are once per
// tensor and step).

typedef struct ef_entry {
  char *name;
  float *data; // (n)
  int64_t n;
} ef_entry_t;

typedef struct ef_table {
  ef_entry_t *e;
  int count, cap;
} ef_table_t;

struct loom_ef {
  ef_table_t residual, side;
  float *scratch; // (scratch_n) y = x + residual during an encode
  int64_t scratch_n;
  // The residuals of CUDA tensors: the device code's table (compress_internal.h), NULL until a
  // device tensor uses error feedback, and its operations.
  void *dev;
  const loom_ef_device_ops_t *dev_ops;
};

// Copy the device residuals written since their last copy into the host table (a no-op without
// device residuals). The table is const to the readers of entries; the copy is a cache refresh.
static void mirror_device(const loom_ef_t *ef) {
  if (ef && ef->dev && ef->dev_ops) {
    ef->dev_ops->mirror((loom_ef_t *)ef, ef->dev);
  }
}

static ef_entry_t *find(ef_table_t *t, const char *name) {
  for (int i = 0; i < t->count; i++) {
    if (strcmp(t->e[i].name, name) == 0) {
      return &t->e[i];
    }
  }
  return NULL;
}

static loom_status_t add(ef_table_t *t, const char *name, int64_t n, ef_entry_t **out) {
  if (t->count == t->cap) {
    int cap = t->cap ? 2 * t->cap : 16;
    ef_entry_t *e = realloc(t->e, sizeof *e * (size_t)cap);
    if (!e) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "error feedback: cannot grow the table");
    }
    t->e = e;
    t->cap = cap;
  }
  ef_entry_t x = {strdup(name), calloc((size_t)(n > 0 ? n : 1), sizeof(float)), n};
  if (!x.name || !x.data) {
    free(x.name);
    free(x.data);
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "error feedback: cannot allocate the residual of '%s' (%lld floats)", name,
                      (long long)n);
  }
  t->e[t->count] = x;
  *out = &t->e[t->count++];
  return LOOM_OK;
}

// The entry of name with n floats: found, created (zeroed), or reallocated and zeroed when it
// had another length; *fresh = 1 in the last two cases.
static loom_status_t entry_sized(ef_table_t *t, const char *name, int64_t n, ef_entry_t **out,
                                 int *fresh) {
  ef_entry_t *e = find(t, name);
  *fresh = !e || e->n != n;
  if (e && e->n != n) {
    float *d = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!d) {
      return loom_error(NULL, LOOM_ERR_NOMEM,
                        "error feedback: cannot allocate %lld floats for '%s'", (long long)n, name);
    }
    free(e->data);
    e->data = d;
    e->n = n;
  }
  if (!e) {
    loom_status_t status = add(t, name, n, &e);
    if (status != LOOM_OK) {
      return status;
    }
  }
  *out = e;
  return LOOM_OK;
}

static void free_table(ef_table_t *t) {
  for (int i = 0; i < t->count; i++) {
    free(t->e[i].name);
    free(t->e[i].data);
  }
  free(t->e);
}

loom_status_t loom_ef_create(loom_ef_t **out) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_ef_create: out is NULL");
  }
  *out = calloc(1, sizeof **out);
  return *out ? LOOM_OK : loom_error(NULL, LOOM_ERR_NOMEM, "loom_ef_create: out of memory");
}

void loom_ef_destroy(loom_ef_t *ef) {
  if (ef) {
    if (ef->dev && ef->dev_ops) {
      ef->dev_ops->destroy(ef->dev);
    }
    free_table(&ef->residual);
    free_table(&ef->side);
    free(ef->scratch);
    free(ef);
  }
}

static loom_status_t check_name(const char *op, const loom_ef_t *ef, const char *name, int64_t n) {
  if (!ef || !name || !*name || n < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: ef %s, name '%s', n = %lld: error feedback needs a table, a tensor "
                      "name (set loom_tensor_t.name) and n >= 0",
                      op, ef ? "set" : "NULL", name ? name : "(null)", (long long)n);
  }
  return LOOM_OK;
}

loom_status_t loom_ef_residual(loom_ef_t *ef, const char *name, int64_t n, float **res) {
  loom_status_t status = check_name("loom_ef_residual", ef, name, n);
  if (status != LOOM_OK) {
    return status;
  }
  if (!res) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_ef_residual: res is NULL: pass where to store the residual of '%s'",
                      name);
  }
  ef_entry_t *e = find(&ef->residual, name);
  if (e && e->n != n) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "error feedback: tensor '%s' has %lld elements now and %lld before: names "
                      "must identify one tensor (rename it, or loom_ef_set a new residual)",
                      name, (long long)n, (long long)e->n);
  }
  if (!e && (status = add(&ef->residual, name, n, &e)) != LOOM_OK) {
    return status;
  }
  *res = e->data;
  return LOOM_OK;
}

int loom_ef_count(const loom_ef_t *ef) {
  mirror_device(ef);
  return ef ? ef->residual.count : 0;
}

int loom_ef_state_count(const loom_ef_t *ef) {
  return ef ? ef->side.count : 0;
}

// Entry i of table t (the residuals or the codec state) for loom_ef_entry / loom_ef_state_entry.
static loom_status_t table_entry(const char *op, const ef_table_t *t, int i, const char **name,
                                 const float **data, int64_t *n) {
  const int count = t ? t->count : 0;
  if (!t || i < 0 || i >= count) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: entry %d of %d: pass 0 <= i < the count", op,
                      i, count);
  }
  const ef_entry_t *e = &t->e[i];
  if (name) {
    *name = e->name;
  }
  if (data) {
    *data = e->data;
  }
  if (n) {
    *n = e->n;
  }
  return LOOM_OK;
}

loom_status_t loom_ef_entry(const loom_ef_t *ef, int i, const char **name, const float **data,
                            int64_t *n) {
  mirror_device(ef);
  return table_entry("loom_ef_entry", ef ? &ef->residual : NULL, i, name, data, n);
}

loom_status_t loom_ef_state_entry(const loom_ef_t *ef, int i, const char **name, const float **data,
                                  int64_t *n) {
  return table_entry("loom_ef_state_entry", ef ? &ef->side : NULL, i, name, data, n);
}

// Create or overwrite name in table t with data[0..n) (loom_ef_set / loom_ef_state_set);
// finite: refuse a NaN or an infinity (residuals are always finite), the entry unchanged.
static loom_status_t table_set(const char *op, loom_ef_t *ef, ef_table_t *t, const char *name,
                               const float *data, int64_t n, int finite) {
  loom_status_t status = check_name(op, ef, name, n);
  if (status == LOOM_OK && n > 0 && !data) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: data is NULL for %lld values", op,
                        (long long)n);
  }
  for (int64_t i = 0; status == LOOM_OK && finite && i < n; i++) {
    if (!isfinite(data[i])) {
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: '%s' value %lld of %lld is %g: loom keeps residuals finite, so "
                          "these values are damaged (a checkpoint?): restore them from another "
                          "checkpoint, or leave this residual to start from zero",
                          op, name, (long long)i, (long long)n, (double)data[i]);
    }
  }
  if (status != LOOM_OK) {
    return status;
  }
  if (!t) { // (check_name refused a NULL ef already)
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: ef is NULL", op);
  }
  // data may be the entry's own buffer (from loom_ef_entry): a new length fills the new buffer
  // before the old one is freed, and the same length moves the values in place.
  ef_entry_t *e = find(t, name);
  if (e && e->n != n) {
    float *d = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!d) {
      return loom_error(NULL, LOOM_ERR_NOMEM,
                        "%s: cannot allocate %lld floats for '%s': the entry is unchanged", op,
                        (long long)n, name);
    }
    if (n > 0) {
      memcpy(d, data, (size_t)n * sizeof(float));
    }
    free(e->data);
    e->data = d;
    e->n = n;
    return LOOM_OK;
  }
  if (!e && (status = add(t, name, n, &e)) != LOOM_OK) {
    return status;
  }
  if (n > 0) {
    memmove(e->data, data, (size_t)n * sizeof(float));
  }
  return LOOM_OK;
}

loom_status_t loom_ef_set(loom_ef_t *ef, const char *name, const float *data, int64_t n) {
  loom_status_t status = table_set("loom_ef_set", ef, ef ? &ef->residual : NULL, name, data, n, 1);
  if (status == LOOM_OK && ef->dev && ef->dev_ops) {
    ef->dev_ops->forget(ef->dev, name); // its next device use starts from data
  }
  return status;
}

loom_status_t loom_ef_state_set(loom_ef_t *ef, const char *name, const float *data, int64_t n) {
  return table_set("loom_ef_state_set", ef, ef ? &ef->side : NULL, name, data, n, 0);
}

void **loom_ef_device_slot(loom_ef_t *ef, const loom_ef_device_ops_t *ops) {
  ef->dev_ops = ops;
  return &ef->dev;
}

const float *loom_ef_host_residual(const loom_ef_t *ef, const char *name, int64_t n) {
  for (int i = 0; i < ef->residual.count; i++) {
    const ef_entry_t *e = &ef->residual.e[i];
    if (strcmp(e->name, name) == 0) {
      return e->n == n ? e->data : NULL;
    }
  }
  return NULL;
}

loom_status_t loom_ef_host_slot(loom_ef_t *ef, const char *name, int64_t n, float **data) {
  ef_entry_t *e = NULL;
  int fresh = 0;
  loom_status_t status = entry_sized(&ef->residual, name, n, &e, &fresh);
  if (status == LOOM_OK) {
    *data = e->data;
  }
  return status;
}

loom_status_t loom_ef_side(loom_ef_t *ef, const char *name, int64_t n, float **out, int *fresh) {
  ef_entry_t *e = NULL;
  loom_status_t status = entry_sized(&ef->side, name, n, &e, fresh);
  if (status == LOOM_OK) {
    *out = e->data;
  }
  return status;
}

loom_status_t loom_compressor_encode_ef(const loom_compressor_t *c, loom_ef_t *ef, const char *name,
                                        const float *x, int64_t n, uint64_t seed, void *payload,
                                        size_t cap, size_t *bytes) {
  if (!ef) {
    return loom_compressor_encode(c, x, n, seed, payload, cap, bytes);
  }
  loom_status_t status = check_codec_args("loom_compressor_encode_ef", c, payload, x, n);
  float *res = NULL;
  if (status == LOOM_OK) {
    status = loom_ef_residual(ef, name, n, &res);
  }
  if (status != LOOM_OK) {
    return status;
  }
  if (ef->scratch_n < n) {
    float *s = malloc((size_t)n * sizeof(float));
    if (!s) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "error feedback: cannot allocate %lld floats",
                        (long long)n);
    }
    free(ef->scratch);
    ef->scratch = s;
    ef->scratch_n = n;
  }
  size_t ignored;
  return loom_ef_encode(c, res, ef->scratch, x, n, seed, payload, cap, bytes ? bytes : &ignored);
}

loom_status_t loom_ef_encode(const loom_compressor_t *c, float *res, float *y, const float *x,
                             int64_t n, uint64_t seed, uint8_t *payload, size_t cap,
                             size_t *bytes) {
  if (!res) {
    return loom_codec_encode(c, x, n, seed, payload, cap, bytes);
  }
  for (int64_t i = 0; i < n; i++) {
    y[i] = x[i] + res[i];
  }
  loom_status_t status = loom_codec_encode(c, y, n, seed, payload, cap, bytes);
  if (status != LOOM_OK) {
    return status; // the residual is unchanged
  }
  // residual = y - decode(payload): decode into y (scratch), so that a failed decode (randomk
  // out of memory for its indices) leaves the residual as it was; then y again as x + residual
  // (the same sum as above, so the same bits as subtracting from y itself).
  if (n > 0) {
    memset(y, 0, (size_t)n * sizeof(float));
  }
  status = loom_codec_decode_add(c, payload, *bytes, n, seed, y);
  for (int64_t i = 0; i < n && status == LOOM_OK; i++) {
    float r = (x[i] + res[i]) - y[i];
    res[i] = isfinite(r) ? r : 0.0f; // a non-finite gradient must not poison every later step
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Scheme names.

static const char *const scheme_names[LOOM_SCHEME_COUNT] = {"indivisible", "divisible",
                                                            "hierarchical"};

const char *loom_scheme_name(loom_scheme_t s) {
  return (int)s >= 0 && s < LOOM_SCHEME_COUNT ? scheme_names[s] : "invalid";
}

loom_status_t loom_scheme_parse(const char *name, loom_scheme_t *out) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_scheme_parse: out is NULL: pass where to store the scheme");
  }
  for (int s = 0; s < LOOM_SCHEME_COUNT && name; s++) {
    if (strcmp(name, scheme_names[s]) == 0) {
      *out = (loom_scheme_t)s;
      return LOOM_OK;
    }
  }
  return loom_error_unlogged(LOOM_ERR_INVALID_ARG,
                             "scheme '%s': valid schemes are indivisible, divisible and "
                             "hierarchical",
                             name ? name : "(null)");
}
