/* gpt_model.c — the byte-level GPT of train_gpt: parameters in flat per-unit buffers (MoE layers
 * apart), forward over packed sequences, backward one unit at a time (overlap), AdamW. */
#include "gpt_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "example_util.h"
#include "gpt_data.h"

// Monotonic seconds (the profile's attention timer).
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TRY(call)                                                                                  \
  do {                                                                                             \
    loom_status_t try_st_ = (call);                                                                \
    if (try_st_ != LOOM_OK) {                                                                      \
      return try_st_;                                                                              \
    }                                                                                              \
  } while (0)

static void poll(loom_sched_t *s) {
  if (s) {
    loom_sched_poll(s);
  }
}

// ---- parameters ---------------------------------------------------------------------------------

// Tensor index of parameter p of block l, and of the head's tensors.
static int block_param(int l, int p) {
  return 2 + l * GPT_BLOCK_PARAMS + p;
}
static int head_param(const gpt_config_t *c, int i) { // 0 lnf.w, 1 lnf.b, 2 lm_head
  return 2 + c->layers * GPT_BLOCK_PARAMS + i;
}

int gpt_block_is_moe(const gpt_config_t *cfg, int l) {
  return cfg->moe_experts > 0 && cfg->moe_every > 0 && (l + 1) % cfg->moe_every == 0;
}

// Shape of tensor i: rows (0 for a vector) and columns. The dense MLP of a MoE block has none.
static void param_shape(const gpt_config_t *c, int i, int64_t *rows, int64_t *cols) {
  const int64_t C = c->width;
  if (i < 2) {
    *rows = i == 0 ? c->vocab : c->ctx;
    *cols = C;
    return;
  }
  if (i >= head_param(c, 0)) {
    int h = i - head_param(c, 0);
    *rows = h == 2 ? c->vocab : 0;
    *cols = C;
    return;
  }
  static const int rows_of[GPT_BLOCK_PARAMS] = {0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 4, 0, 1, 0};
  static const int cols_of[GPT_BLOCK_PARAMS] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 1};
  int p = (i - 2) % GPT_BLOCK_PARAMS;
  *rows = rows_of[p] * C;
  *cols = cols_of[p] * C;
  if (p >= GPT_FC1_W && gpt_block_is_moe(c, (i - 2) / GPT_BLOCK_PARAMS)) {
    *rows = *cols = 0;
  }
}

static const char *block_param_name(int p) {
  static const char *const names[GPT_BLOCK_PARAMS] = {
      "ln1.w", "ln1.b", "wq",    "bq",    "wk",    "bk",    "wv",    "bv",
      "wo",    "bo",    "ln2.w", "ln2.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b"};
  return names[p];
}

static void param_name(const gpt_config_t *c, int i, char *out, size_t cap) {
  if (i < 2) {
    snprintf(out, cap, "%s", i == 0 ? "wte" : "wpe");
  } else if (i >= head_param(c, 0)) {
    static const char *const names[3] = {"lnf.w", "lnf.b", "lm_head"};
    snprintf(out, cap, "%s", names[i - head_param(c, 0)]);
  } else {
    snprintf(out, cap, "h%d.%s", (i - 2) / GPT_BLOCK_PARAMS,
             block_param_name((i - 2) % GPT_BLOCK_PARAMS));
  }
}

// The first and last tensor of each block part (enum gpt_block_part), and its name.
static const int part_range[GPT_MAX_PARTS][2] = {{GPT_FC2_W, GPT_FC2_B},
                                                 {GPT_LN2_W, GPT_FC1_B},
                                                 {GPT_WO, GPT_BO},
                                                 {GPT_WQ, GPT_BV},
                                                 {GPT_LN1_W, GPT_LN1_B}};
static const char *const part_names[GPT_MAX_PARTS] = {"fc2", "mlp", "wo", "qkv", "ln1"};

int gpt_unit_parts(const gpt_model_t *m, int u) {
  if (u <= 0 || u >= m->nunits - 1) {
    return 1;
  }
  return gpt_block_is_moe(&m->cfg, u - 1) ? GPT_MAX_PARTS - 1 : GPT_MAX_PARTS; // no fc2 in MoE
}

int gpt_part_kind(const gpt_model_t *m, int u, int p) {
  if (gpt_unit_parts(m, u) == 1 || p < 0 || p >= gpt_unit_parts(m, u)) {
    return -1;
  }
  return gpt_block_is_moe(&m->cfg, u - 1) ? p + 1 : p;
}

const char *gpt_part_name(const gpt_model_t *m, int u, int p) {
  const int kind = gpt_part_kind(m, u, p);
  return kind < 0 ? NULL : part_names[kind];
}

loom_status_t gpt_model_alloc(gpt_model_t *m, const gpt_config_t *cfg) {
  memset(m, 0, sizeof *m);
  if (cfg->layers < 1 || cfg->width < 1 || cfg->heads < 1 || cfg->width % cfg->heads ||
      cfg->ctx < 1 || cfg->vocab < 1 || cfg->moe_experts < 0 ||
      (cfg->moe_experts > 0 && cfg->moe_every < 1)) {
    return LOOM_ERR_INVALID_ARG;
  }
  m->cfg = *cfg;
  m->moe_finish = 1;
  m->loss_scale = 1.0f;
  m->device = cfg->cuda ? cfg->cuda_device : LOOM_DEVICE_HOST;
  m->nparams = 2 + cfg->layers * GPT_BLOCK_PARAMS + 3;
  m->nunits = cfg->layers + 2;
  const int64_t C = cfg->width;
  m->matmul_params = 12 * (int64_t)cfg->layers * C * C + (int64_t)cfg->vocab * C;
  for (int l = 0; l < cfg->layers; l++) {
    m->matmul_params -= gpt_block_is_moe(cfg, l) ? 8 * C * C : 0;
  }
  m->param = calloc((size_t)m->nparams, sizeof *m->param);
  m->grad = calloc((size_t)m->nparams, sizeof *m->grad);
  m->m = calloc((size_t)m->nparams, sizeof *m->m);
  m->v = calloc((size_t)m->nparams, sizeof *m->v);
  m->timers = calloc(1, sizeof *m->timers);
  m->unit_grad = calloc((size_t)m->nunits, sizeof *m->unit_grad);
  m->unit_first = calloc((size_t)m->nunits + 1, sizeof *m->unit_first);
  m->part_grad = calloc(GPT_MAX_PARTS * (size_t)m->nunits, sizeof *m->part_grad);
  m->moe = calloc((size_t)cfg->layers, sizeof *m->moe);
  m->moe_m = calloc((size_t)cfg->layers * LOOM_MOE_PARAM_COUNT, sizeof *m->moe_m);
  m->moe_v = calloc((size_t)cfg->layers * LOOM_MOE_PARAM_COUNT, sizeof *m->moe_v);
  if (!m->param || !m->grad || !m->m || !m->v || !m->timers || !m->unit_grad || !m->unit_first ||
      !m->part_grad || !m->moe || !m->moe_m || !m->moe_v) {
    gpt_model_free(m);
    return LOOM_ERR_NOMEM;
  }
  m->unit_first[0] = 0; // embeddings: wte, wpe
  for (int u = 1; u <= cfg->layers + 1; u++) {
    m->unit_first[u] = block_param(u - 1, 0); // block u-1; u = L+1 is where the head starts
  }
  m->unit_first[m->nunits] = m->nparams;
  for (int i = 0; i < m->nparams; i++) {
    int64_t r, c;
    param_shape(cfg, i, &r, &c);
    m->total += r ? r * c : c;
  }
  static const char *const flat_name[4] = {"params", "grads", "adam_m", "adam_v"};
  for (int k = 0; k < 4; k++) { // zeroed by loom_tensor_alloc, on the host or the device
    loom_status_t st =
        loom_tensor_alloc(&m->flat_t[k], LOOM_F32, m->device, 1, &m->total, flat_name[k]);
    if (st != LOOM_OK) {
      gpt_model_free(m);
      return st;
    }
    m->flat[k] = m->flat_t[k].data;
  }
  static const char *const prefix[4] = {"", "grad.", "adam_m.", "adam_v."};
  loom_tensor_t *sets[4] = {m->param, m->grad, m->m, m->v};
  int64_t off = 0;
  for (int i = 0; i < m->nparams; i++) {
    int64_t r, c, shape[2];
    param_shape(cfg, i, &r, &c);
    shape[0] = r ? r : c;
    shape[1] = c;
    char base[64], name[LOOM_NAME_MAX];
    param_name(cfg, i, base, sizeof base);
    for (int k = 0; k < 4; k++) {
      snprintf(name, sizeof name, "%s%s", prefix[k], base);
      loom_tensor_wrap(&sets[k][i], m->flat[k] + off, LOOM_F32, m->device, r ? 2 : 1, shape, name);
    }
    off += r ? r * c : c;
  }
  for (int u = 0; u < m->nunits; u++) {
    const loom_tensor_t *first = &m->grad[m->unit_first[u]];
    const loom_tensor_t *last = &m->grad[m->unit_first[u + 1] - 1];
    int64_t n = (int64_t)((float *)last->data - (float *)first->data) + loom_tensor_numel(last);
    char name[64];
    if (u == 0) {
      snprintf(name, sizeof name, "grad.embed");
    } else if (u <= cfg->layers) {
      snprintf(name, sizeof name, "grad.h%d", u - 1);
    } else {
      snprintf(name, sizeof name, "grad.head");
    }
    loom_tensor_wrap(&m->unit_grad[u], first->data, LOOM_F32, m->device, 1, &n, name);
    if (gpt_unit_parts(m, u) == 1) {
      m->part_grad[GPT_MAX_PARTS * u] = m->unit_grad[u];
      continue;
    }
    for (int p = 0; p < gpt_unit_parts(m, u); p++) { // a block: each part's range of tensors
      const int kind = gpt_part_kind(m, u, p);
      const loom_tensor_t *lo = &m->grad[block_param(u - 1, part_range[kind][0])];
      const loom_tensor_t *hi = &m->grad[block_param(u - 1, part_range[kind][1])];
      int64_t pn = (int64_t)((float *)hi->data - (float *)lo->data) + loom_tensor_numel(hi);
      snprintf(name, sizeof name, "grad.h%d.%s", u - 1, gpt_part_name(m, u, p));
      loom_tensor_wrap(&m->part_grad[GPT_MAX_PARTS * u + p], lo->data, LOOM_F32, m->device, 1, &pn,
                       name);
    }
  }
  return LOOM_OK;
}

void gpt_model_free(gpt_model_t *m) {
  for (int k = 0; k < 4; k++) {
    loom_tensor_free(&m->flat_t[k]);
  }
  for (int l = 0; m->moe && l < m->cfg.layers; l++) {
    loom_moe_destroy(m->moe[l]);
    for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
      loom_tensor_free(&m->moe_m[l * LOOM_MOE_PARAM_COUNT + p]);
      loom_tensor_free(&m->moe_v[l * LOOM_MOE_PARAM_COUNT + p]);
    }
  }
  free(m->moe);
  free(m->moe_m);
  free(m->moe_v);
  free(m->timers);
  free(m->param);
  free(m->grad);
  free(m->m);
  free(m->v);
  free(m->unit_grad);
  free(m->unit_first);
  free(m->part_grad);
  memset(m, 0, sizeof *m);
}

loom_status_t gpt_model_set_moe(gpt_model_t *m, int l, loom_moe_t *moe) {
  if (l < 0 || l >= m->cfg.layers || !gpt_block_is_moe(&m->cfg, l) || !moe || m->moe[l] ||
      loom_moe_param(moe, LOOM_MOE_ROUTER)->shape[0] != m->cfg.width ||
      loom_moe_param(moe, LOOM_MOE_ROUTER)->device != m->device) {
    return LOOM_ERR_INVALID_ARG;
  }
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    const loom_tensor_t *w = loom_moe_param(moe, (loom_moe_param_t)p);
    loom_tensor_t *mv[2] = {&m->moe_m[l * LOOM_MOE_PARAM_COUNT + p],
                            &m->moe_v[l * LOOM_MOE_PARAM_COUNT + p]};
    for (int k = 0; k < 2; k++) {
      TRY(loom_tensor_alloc(mv[k], LOOM_F32, m->device, w->ndim, w->shape,
                            k ? "adam_v.moe" : "adam_m.moe"));
      TRY(loom_tensor_fill(mv[k], 0.0));
    }
  }
  m->moe[l] = moe;
  return LOOM_OK;
}

// The initial values of parameter i (n floats) into p.
static void init_param(const gpt_model_t *m, int i, float *p, uint64_t seed) {
  const gpt_config_t *c = &m->cfg;
  const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->layers);
  int64_t n = loom_tensor_numel(&m->param[i]);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
  int block = i >= 2 && i < head_param(c, 0) ? (i - 2) % GPT_BLOCK_PARAMS : -1;
  int is_ln_w = block == GPT_LN1_W || block == GPT_LN2_W || i == head_param(c, 0);
  if (m->param[i].ndim == 1) { // biases 0, LayerNorm weights 1
    for (int64_t k = 0; k < n; k++) {
      p[k] = is_ln_w ? 1.0f : 0.0f;
    }
    return;
  }
  float s = block == GPT_WO || block == GPT_FC2_W ? proj_std : std;
  for (int64_t k = 0; k < n; k++) {
    p[k] = s * ex_normal(&state);
  }
}

loom_status_t gpt_model_init(gpt_model_t *m, uint64_t seed) {
  if (m->device == LOOM_DEVICE_HOST) {
    for (int i = 0; i < m->nparams; i++) {
      init_param(m, i, m->param[i].data, seed);
    }
    return LOOM_OK;
  }
  // On a device: the same numbers made on the host, then copied over in one piece.
  loom_tensor_t host;
  TRY(loom_tensor_alloc(&host, LOOM_F32, LOOM_DEVICE_HOST, 1, &m->total, "params.init"));
  float *p = host.data;
  for (int i = 0; i < m->nparams; i++) {
    init_param(m, i, p, seed);
    p += loom_tensor_numel(&m->param[i]);
  }
  loom_status_t st = loom_tensor_copy(&m->flat_t[0], &host);
  loom_tensor_free(&host);
  return st;
}

// ---- activations --------------------------------------------------------------------------------

static loom_status_t alloc2(const gpt_acts_t *a, loom_tensor_t *t, int64_t rows, int64_t cols,
                            const char *name) {
  int64_t shape[2] = {rows, cols};
  return loom_tensor_alloc(t, LOOM_F32, a->device, cols ? 2 : 1, shape, name);
}

loom_status_t gpt_acts_alloc(gpt_acts_t *a, const gpt_config_t *cfg, int64_t cap) {
  memset(a, 0, sizeof *a);
  a->cap = cap;
  a->device = cfg->cuda ? cfg->cuda_device : LOOM_DEVICE_HOST;
  if (cfg->cuda) {
    const int64_t batch = 4 * cap + 1, row = cfg->vocab;
    TRY(loom_tensor_alloc(&a->dev_batch, LOOM_I32, a->device, 1, &batch, "batch"));
    TRY(loom_tensor_alloc(&a->logits_row, LOOM_F32, LOOM_DEVICE_HOST, 1, &row, "logits.row"));
  }
  const int64_t C = cfg->width, F = 4 * C;
  a->x = calloc((size_t)cfg->layers + 1, sizeof *a->x);
  a->layer = calloc((size_t)cfg->layers, sizeof *a->layer);
  if (!a->x || !a->layer) {
    free(a->x);
    free(a->layer);
    return LOOM_ERR_NOMEM;
  }
  for (int l = 0; l <= cfg->layers; l++) {
    TRY(alloc2(a, &a->x[l], cap, C, "x"));
  }
  for (int l = 0; l < cfg->layers; l++) {
    gpt_layer_acts_t *y = &a->layer[l];
    TRY(alloc2(a, &y->ln1, cap, C, "ln1"));
    TRY(alloc2(a, &y->ln1_mean, cap, 0, "ln1.mean"));
    TRY(alloc2(a, &y->ln1_rstd, cap, 0, "ln1.rstd"));
    TRY(alloc2(a, &y->q, cap, C, "q"));
    TRY(alloc2(a, &y->k, cap, C, "k"));
    TRY(alloc2(a, &y->v, cap, C, "v"));
    TRY(alloc2(a, &y->att, cap, C, "att"));
    TRY(alloc2(a, &y->lse, cfg->heads, cap, "lse"));
    TRY(alloc2(a, &y->xmid, cap, C, "xmid"));
    TRY(alloc2(a, &y->ln2, cap, C, "ln2"));
    TRY(alloc2(a, &y->ln2_mean, cap, 0, "ln2.mean"));
    TRY(alloc2(a, &y->ln2_rstd, cap, 0, "ln2.rstd"));
    if (!gpt_block_is_moe(cfg, l)) { // a MoE layer keeps its own activations
      TRY(alloc2(a, &y->fc, cap, F, "fc"));
      TRY(alloc2(a, &y->h, cap, F, "gelu"));
    }
  }
  TRY(alloc2(a, &a->lnf, cap, C, "lnf"));
  TRY(alloc2(a, &a->lnf_mean, cap, 0, "lnf.mean"));
  TRY(alloc2(a, &a->lnf_rstd, cap, 0, "lnf.rstd"));
  TRY(alloc2(a, &a->logits, cap, cfg->vocab, "logits"));
  TRY(alloc2(a, &a->losses, cap, 0, "losses"));
  TRY(alloc2(a, &a->dres, cap, C, "dres"));
  TRY(alloc2(a, &a->dtmp, cap, C, "dtmp"));
  TRY(alloc2(a, &a->dy, cap, C, "dy"));
  TRY(alloc2(a, &a->dq, cap, C, "dq"));
  TRY(alloc2(a, &a->dk, cap, C, "dk"));
  TRY(alloc2(a, &a->dv, cap, C, "dv"));
  TRY(alloc2(a, &a->dfc, cap, F, "dfc"));
  return LOOM_OK;
}

void gpt_acts_free(gpt_acts_t *a, const gpt_config_t *cfg) {
  if (a->x) {
    for (int l = 0; l <= cfg->layers; l++) {
      loom_tensor_free(&a->x[l]);
    }
  }
  if (a->layer) {
    for (int l = 0; l < cfg->layers; l++) {
      gpt_layer_acts_t *y = &a->layer[l];
      loom_tensor_t *all[] = {&y->ln1,      &y->ln1_mean, &y->ln1_rstd, &y->q,    &y->k,
                              &y->v,        &y->att,      &y->lse,      &y->xmid, &y->ln2,
                              &y->ln2_mean, &y->ln2_rstd, &y->fc,       &y->h};
      for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        loom_tensor_free(all[i]);
      }
    }
  }
  loom_tensor_t *rest[] = {&a->lnf,  &a->lnf_mean, &a->lnf_rstd, &a->logits, &a->losses, &a->dres,
                           &a->dtmp, &a->dy,       &a->dq,       &a->dk,     &a->dv,     &a->dfc};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) {
    loom_tensor_free(rest[i]);
  }
  loom_tensor_free(&a->dev_batch);
  loom_tensor_free(&a->logits_row);
  free(a->x);
  free(a->layer);
  memset(a, 0, sizeof *a);
}

// The first n rows of t (no copy). With heads > 0, viewed as (n, heads, cols / heads).
static loom_tensor_t rows(const loom_tensor_t *t, int64_t n, int heads) {
  loom_tensor_t v;
  int64_t shape[3] = {n, t->ndim > 1 ? t->shape[1] : 0, 0};
  int ndim = t->ndim;
  if (heads > 0) {
    shape[2] = shape[1] / heads;
    shape[1] = heads;
    ndim = 3;
  }
  loom_tensor_wrap(&v, t->data, t->dtype, t->device, ndim, shape, t->name);
  return v;
}

// lse (H, n): the first H * n floats of the (H, cap) buffer, read as (H, n).
static loom_tensor_t lse_view(const loom_tensor_t *t, int64_t n) {
  loom_tensor_t v;
  int64_t shape[2] = {t->shape[0], n};
  loom_tensor_wrap(&v, t->data, LOOM_F32, t->device, 2, shape, t->name);
  return v;
}

// ---- forward ------------------------------------------------------------------------------------

static loom_status_t block_forward(const gpt_model_t *m, gpt_acts_t *a, int l) {
  const int64_t n = a->n;
  const int H = m->cfg.heads;
  const loom_tensor_t *p = &m->param[block_param(l, 0)];
  gpt_layer_acts_t *y = &a->layer[l];
  loom_tensor_t x = rows(&a->x[l], n, 0), out = rows(&a->x[l + 1], n, 0);
  loom_tensor_t ln1 = rows(&y->ln1, n, 0), mean1 = rows(&y->ln1_mean, n, 0),
                rstd1 = rows(&y->ln1_rstd, n, 0), xmid = rows(&y->xmid, n, 0),
                ln2 = rows(&y->ln2, n, 0), mean2 = rows(&y->ln2_mean, n, 0),
                rstd2 = rows(&y->ln2_rstd, n, 0);
  loom_tensor_t q = rows(&y->q, n, 0), k = rows(&y->k, n, 0), v = rows(&y->v, n, 0),
                att = rows(&y->att, n, 0), lse = lse_view(&y->lse, n);
  loom_tensor_t q3 = rows(&y->q, n, H), k3 = rows(&y->k, n, H), v3 = rows(&y->v, n, H),
                att3 = rows(&y->att, n, H);
  // attention: xmid = x + proj(attention(ln1(x)))
  TRY(loom_layernorm_forward(&ln1, &mean1, &rstd1, &x, &p[GPT_LN1_W], &p[GPT_LN1_B], 1e-5f));
  TRY(loom_gemm(&q, &ln1, 0, &p[GPT_WQ], 1, &p[GPT_BQ], 1.0f, 0.0f)); // (n, C)
  TRY(loom_gemm(&k, &ln1, 0, &p[GPT_WK], 1, &p[GPT_BK], 1.0f, 0.0f));
  TRY(loom_gemm(&v, &ln1, 0, &p[GPT_WV], 1, &p[GPT_BV], 1.0f, 0.0f));
  if (a->attn && a->attn[l]) { // q, k, v, att: (n, H, D) contiguous; lse (H, n)
    double t0 = now_s();       // with the servers' exchanges: what attention costs this rank
    TRY(loom_attn_exec_forward(a->attn[l], &q3, &k3, &v3, &att3, &lse));
    m->timers->attn_s += now_s() - t0;
  } else {
    double t0 = now_s();
    TRY(loom_attention_forward(&att3, &lse, &q3, &k3, &v3, &a->cu, &a->cu, 1, 0.0f));
    m->timers->attn_s += now_s() - t0;
  }
  TRY(loom_gemm_residual(&xmid, &att, 0, &p[GPT_WO], 1, &p[GPT_BO], &x)); // x + proj(att)
  // MLP: out = xmid + fc2(gelu(fc1(ln2(xmid)))), or out = xmid + moe(ln2(xmid))
  TRY(loom_layernorm_forward(&ln2, &mean2, &rstd2, &xmid, &p[GPT_LN2_W], &p[GPT_LN2_B], 1e-5f));
  if (m->moe[l]) {
    loom_tensor_t tmp = rows(&a->dtmp, n, 0);
    float aux = 0.0f;
    TRY(loom_moe_forward(m->moe[l], &ln2, &tmp, &aux));
    loom_moe_stats_t ms;
    loom_moe_stats(m->moe[l], &ms);
    m->timers->moe_compute_s += 1e-3 * ms.compute_ms;
    a->aux += aux;
    return loom_residual_forward(&out, &xmid, &tmp); // xmid + moe(ln2): one pass
  }
  if (gpt_block_is_moe(&m->cfg, l)) {
    return LOOM_ERR_INVALID_ARG; // no layer attached (gpt_model_set_moe)
  }
  loom_tensor_t fc = rows(&y->fc, n, 0), h = rows(&y->h, n, 0);
  TRY(loom_gemm(&fc, &ln2, 0, &p[GPT_FC1_W], 1, &p[GPT_FC1_B], 1.0f, 0.0f)); // (n, 4C)
  TRY(loom_gelu_forward_deriv(&h, &fc, &fc)); // fc now holds gelu'(fc1) for the backward
  TRY(loom_gemm_residual(&out, &h, 0, &p[GPT_FC2_W], 1, &p[GPT_FC2_B], &xmid)); // xmid + fc2(h)
  return LOOM_OK;
}

loom_status_t gpt_forward(const gpt_model_t *m, gpt_acts_t *a, const loom_tensor_t *tokens,
                          const loom_tensor_t *pos, const loom_tensor_t *targets,
                          const loom_tensor_t *cu, float *loss, loom_sched_t *s) {
  const gpt_config_t *c = &m->cfg;
  const int64_t n = loom_tensor_numel(tokens);
  if (n < 1 || n > a->cap) {
    return LOOM_ERR_INVALID_ARG;
  }
  a->n = n;
  a->aux = 0.0f;
  a->tokens = *tokens;
  a->pos = *pos;
  a->cu = *cu;
  if (targets) {
    a->target = *targets;
  }
  if (a->device != LOOM_DEVICE_HOST) { // the batch comes from the host: copy it over
    int32_t *base = a->dev_batch.data;
    int64_t ncu = loom_tensor_numel(cu);
    if (ncu > a->cap + 1) { // room: tokens, pos (cap each), cu, targets (cap)
      return LOOM_ERR_INVALID_ARG;
    }
    loom_tensor_t *dst[4] = {&a->tokens, &a->pos, &a->cu, &a->target};
    const loom_tensor_t *src[4] = {tokens, pos, cu, targets};
    const int64_t at[4] = {0, a->cap, 2 * a->cap, 2 * a->cap + ncu};
    for (int i = 0; i < 4 && src[i]; i++) {
      int64_t len = loom_tensor_numel(src[i]);
      loom_tensor_wrap(dst[i], base + at[i], LOOM_I32, a->device, 1, &len, src[i]->name);
      TRY(loom_tensor_copy(dst[i], src[i]));
    }
    tokens = &a->tokens;
    pos = &a->pos;
    targets = targets ? &a->target : NULL;
  }
  loom_tensor_t x0 = rows(&a->x[0], n, 0), tmp = rows(&a->dtmp, n, 0);
  TRY(loom_embedding_forward(&x0, tokens, &m->param[0]));
  TRY(loom_embedding_forward(&tmp, pos, &m->param[1]));
  TRY(loom_residual_forward(&x0, &x0, &tmp));
  for (int l = 0; l < c->layers; l++) {
    TRY(block_forward(m, a, l));
    poll(s);
  }
  const loom_tensor_t *hp = &m->param[head_param(c, 0)];
  loom_tensor_t xl = rows(&a->x[c->layers], n, 0), lnf = rows(&a->lnf, n, 0),
                mean = rows(&a->lnf_mean, n, 0), rstd = rows(&a->lnf_rstd, n, 0),
                logits = rows(&a->logits, n, 0), losses = rows(&a->losses, n, 0);
  TRY(loom_layernorm_forward(&lnf, &mean, &rstd, &xl, &hp[0], &hp[1], 1e-5f));
  TRY(loom_gemm(&logits, &lnf, 0, &hp[2], 1, NULL, 1.0f, 0.0f)); // (n, V)
  if (targets) {
    TRY(loom_cross_entropy_forward(&losses, loss, &logits, targets, -1));
  }
  return LOOM_OK;
}

// ---- backward -----------------------------------------------------------------------------------

// d x[L] from the loss: cross-entropy, lm_head, final LayerNorm.
static loom_status_t head_backward(gpt_model_t *m, gpt_acts_t *a, loom_sched_t *s) {
  const gpt_config_t *c = &m->cfg;
  const int64_t n = a->n;
  const loom_tensor_t *hp = &m->param[head_param(c, 0)];
  loom_tensor_t *hg = &m->grad[head_param(c, 0)];
  loom_tensor_t xl = rows(&a->x[c->layers], n, 0), lnf = rows(&a->lnf, n, 0),
                mean = rows(&a->lnf_mean, n, 0), rstd = rows(&a->lnf_rstd, n, 0),
                logits = rows(&a->logits, n, 0), dtmp = rows(&a->dtmp, n, 0),
                dres = rows(&a->dres, n, 0);
  TRY(loom_cross_entropy_backward(&logits, &logits, &a->target, -1, m->loss_scale)); // in place
  TRY(loom_gemm(&hg[2], &logits, 1, &lnf, 0, NULL, 1.0f, 1.0f));                     // (V, C)
  TRY(loom_gemm(&dtmp, &logits, 0, &hp[2], 0, NULL, 1.0f, 0.0f));                    // d lnf (n, C)
  poll(s);
  TRY(loom_layernorm_backward(&dres, &hg[0], &hg[1], &dtmp, &xl, &hp[0], &mean, &rstd));
  return LOOM_OK;
}

// fc2's gradients from d out (a->dres): the first products of a dense block's backward.
static loom_status_t block_backward_fc2(gpt_model_t *m, gpt_acts_t *a, int l) {
  const int64_t n = a->n;
  loom_tensor_t *g = &m->grad[block_param(l, 0)];
  loom_tensor_t h = rows(&a->layer[l].h, n, 0), dres = rows(&a->dres, n, 0);
  TRY(loom_gemm(&g[GPT_FC2_W], &dres, 1, &h, 0, NULL, 1.0f, 1.0f)); // (C, 4C)
  return loom_bias_backward(&g[GPT_FC2_B], &dres);
}

// The rest of the dense MLP's backward: fc1's gradients and d ln2 (a->dtmp) from d out (a->dres).
static loom_status_t mlp_backward(gpt_model_t *m, gpt_acts_t *a, int l, loom_sched_t *s) {
  const int64_t n = a->n;
  const loom_tensor_t *p = &m->param[block_param(l, 0)];
  loom_tensor_t *g = &m->grad[block_param(l, 0)];
  gpt_layer_acts_t *y = &a->layer[l];
  loom_tensor_t ln2 = rows(&y->ln2, n, 0), fc = rows(&y->fc, n, 0);
  loom_tensor_t dres = rows(&a->dres, n, 0), dtmp = rows(&a->dtmp, n, 0), dfc = rows(&a->dfc, n, 0);
  TRY(loom_gemm(&dfc, &dres, 0, &p[GPT_FC2_W], 0, NULL, 1.0f, 0.0f)); // d h (n, 4C)
  poll(s);
  TRY(loom_gelu_backward_deriv(&dfc, &g[GPT_FC1_B], &fc, &dfc));        // and fc1's bias gradient
  TRY(loom_gemm(&g[GPT_FC1_W], &dfc, 1, &ln2, 0, NULL, 1.0f, 1.0f));    // (4C, C)
  return loom_gemm(&dtmp, &dfc, 0, &p[GPT_FC1_W], 0, NULL, 1.0f, 0.0f); // d ln2 (n, C)
}

// A MoE layer's backward: dx (d ln2) from dy, its gradients zeroed first (unless m->grad_add);
// on the last micro-batch of a step the expert gradients (which sum the contributions of every
// rank of the expert-parallel group) divided by its size.
static loom_status_t moe_backward(const gpt_model_t *m, loom_moe_t *moe, const loom_tensor_t *dy,
                                  loom_tensor_t *dx) {
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT && !m->grad_add; p++) {
    TRY(loom_tensor_fill(loom_moe_grad(moe, (loom_moe_param_t)p), 0.0));
  }
  TRY(loom_moe_backward(moe, dy, dx));
  loom_moe_stats_t st;
  loom_moe_stats(moe, &st);
  if (m->moe_finish && st.local_experts != st.num_experts) {
    const float scale = (float)st.local_experts / (float)st.num_experts;
    for (int p = LOOM_MOE_W1; p < LOOM_MOE_PARAM_COUNT; p++) {
      TRY(loom_scale(loom_moe_grad(moe, (loom_moe_param_t)p), scale));
    }
  }
  return LOOM_OK;
}

// The end of either half of block l's backward: d ln (a->dtmp) back through the layer norm of
// in (its gradients into gw, gb), added to d out (a->dres, updated in place) for the residual.
static loom_status_t ln_backward_residual(gpt_acts_t *a, const loom_tensor_t *in_buf,
                                          const loom_tensor_t *mean_buf,
                                          const loom_tensor_t *rstd_buf, const loom_tensor_t *w,
                                          loom_tensor_t *gw, loom_tensor_t *gb) {
  const int64_t n = a->n;
  loom_tensor_t in = rows(in_buf, n, 0), mean = rows(mean_buf, n, 0), rstd = rows(rstd_buf, n, 0);
  loom_tensor_t dres = rows(&a->dres, n, 0), dtmp = rows(&a->dtmp, n, 0), dy = rows(&a->dy, n, 0);
  TRY(loom_layernorm_backward(&dy, gw, gb, &dtmp, &in, w, &mean, &rstd));
  return loom_axpy(&dres, 1.0f, &dy);
}

// The MLP half of block l's backward after fc2's gradients: d xmid from d x[l+1] (a->dres,
// updated in place).
static loom_status_t block_backward_mlp(gpt_model_t *m, gpt_acts_t *a, int l, loom_sched_t *s) {
  const loom_tensor_t *p = &m->param[block_param(l, 0)];
  loom_tensor_t *g = &m->grad[block_param(l, 0)];
  gpt_layer_acts_t *y = &a->layer[l];
  // dres is d out = d xmid (residual) + the MLP branch's contribution
  if (m->moe[l]) {
    loom_tensor_t dres = rows(&a->dres, a->n, 0), dtmp = rows(&a->dtmp, a->n, 0);
    TRY(moe_backward(m, m->moe[l], &dres, &dtmp)); // d ln2
    loom_moe_stats_t ms;
    loom_moe_stats(m->moe[l], &ms);
    m->timers->moe_compute_s += 1e-3 * ms.compute_ms;
  } else {
    TRY(mlp_backward(m, a, l, s)); // d ln2 in dtmp
  }
  poll(s);
  return ln_backward_residual(a, &y->xmid, &y->ln2_mean, &y->ln2_rstd, &p[GPT_LN2_W], &g[GPT_LN2_W],
                              &g[GPT_LN2_B]); // d xmid
}

// The output projection's gradients from d xmid (a->dres).
static loom_status_t block_backward_wo(gpt_model_t *m, gpt_acts_t *a, int l) {
  const int64_t n = a->n;
  loom_tensor_t *g = &m->grad[block_param(l, 0)];
  loom_tensor_t att = rows(&a->layer[l].att, n, 0), dres = rows(&a->dres, n, 0);
  TRY(loom_gemm(&g[GPT_WO], &dres, 1, &att, 0, NULL, 1.0f, 1.0f)); // (C, C)
  return loom_bias_backward(&g[GPT_BO], &dres);
}

// d att, attention's backward into d q, d k, d v (a->dq, dk, dv), and the q, k, v projections'
// gradients; d ln1 is left to block_backward_ln1, so that these travel while it is computed.
static loom_status_t block_backward_qkv(gpt_model_t *m, gpt_acts_t *a, int l, loom_sched_t *s) {
  const int64_t n = a->n;
  const int H = m->cfg.heads;
  const loom_tensor_t *p = &m->param[block_param(l, 0)];
  loom_tensor_t *g = &m->grad[block_param(l, 0)];
  gpt_layer_acts_t *y = &a->layer[l];
  loom_tensor_t ln1 = rows(&y->ln1, n, 0), lse = lse_view(&y->lse, n);
  loom_tensor_t dres = rows(&a->dres, n, 0), dy = rows(&a->dy, n, 0), dq = rows(&a->dq, n, 0),
                dk = rows(&a->dk, n, 0), dv = rows(&a->dv, n, 0);
  TRY(loom_gemm(&dy, &dres, 0, &p[GPT_WO], 0, NULL, 1.0f, 0.0f)); // d att (n, C)
  loom_tensor_t dq3 = rows(&a->dq, n, H), dk3 = rows(&a->dk, n, H), dv3 = rows(&a->dv, n, H),
                dy3 = rows(&a->dy, n, H), q3 = rows(&y->q, n, H), k3 = rows(&y->k, n, H),
                v3 = rows(&y->v, n, H), att3 = rows(&y->att, n, H);
  if (a->attn && a->attn[l]) { // the executor kept this block's forward batch
    double t0 = now_s();
    TRY(loom_attn_exec_backward(a->attn[l], &dy3, &dq3, &dk3, &dv3));
    m->timers->attn_s += now_s() - t0;
  } else {
    double t0 = now_s();
    TRY(loom_attention_backward(&dq3, &dk3, &dv3, &dy3, &q3, &k3, &v3, &att3, &lse, &a->cu, &a->cu,
                                1, 0.0f));
    m->timers->attn_s += now_s() - t0;
  }
  poll(s);
  const loom_tensor_t *dqkv[3] = {&dq, &dk, &dv};
  for (int j = 0; j < 3; j++) {
    TRY(loom_gemm(&g[GPT_WQ + 2 * j], dqkv[j], 1, &ln1, 0, NULL, 1.0f, 1.0f)); // (C, C)
    TRY(loom_bias_backward(&g[GPT_WQ + 2 * j + 1], dqkv[j]));
  }
  return LOOM_OK;
}

// The attention half's end: d ln1 from d q, d k, d v, ln1's gradients, and d x[l] from d xmid
// (a->dres, updated in place).
static loom_status_t block_backward_ln1(gpt_model_t *m, gpt_acts_t *a, int l, loom_sched_t *s) {
  const int64_t n = a->n;
  const loom_tensor_t *p = &m->param[block_param(l, 0)];
  loom_tensor_t *g = &m->grad[block_param(l, 0)];
  gpt_layer_acts_t *y = &a->layer[l];
  loom_tensor_t dtmp = rows(&a->dtmp, n, 0), dq = rows(&a->dq, n, 0), dk = rows(&a->dk, n, 0),
                dv = rows(&a->dv, n, 0);
  const loom_tensor_t *dqkv[3] = {&dq, &dk, &dv};
  for (int j = 0; j < 3; j++) { // d ln1 (n, C)
    TRY(loom_gemm(&dtmp, dqkv[j], 0, &p[GPT_WQ + 2 * j], 0, NULL, 1.0f, j ? 1.0f : 0.0f));
  }
  poll(s);
  return ln_backward_residual(a, &a->x[l], &y->ln1_mean, &y->ln1_rstd, &p[GPT_LN1_W], &g[GPT_LN1_W],
                              &g[GPT_LN1_B]); // d x
}

static loom_status_t embed_backward(gpt_model_t *m, gpt_acts_t *a) {
  loom_tensor_t dres = rows(&a->dres, a->n, 0);
  TRY(loom_embedding_backward(&m->grad[0], &a->tokens, &dres));
  TRY(loom_embedding_backward(&m->grad[1], &a->pos, &dres));
  return LOOM_OK;
}

loom_status_t gpt_backward_part(gpt_model_t *m, gpt_acts_t *a, int u, int p, loom_sched_t *s) {
  if (u < 0 || u >= m->nunits || p < 0 || p >= gpt_unit_parts(m, u) || a->n < 1) {
    return LOOM_ERR_INVALID_ARG;
  }
  if (!m->grad_add) { // every product below adds to the gradients
    TRY(loom_tensor_fill(&m->part_grad[GPT_MAX_PARTS * u + p], 0.0));
  }
  if (u == m->nunits - 1) {
    return head_backward(m, a, s);
  }
  if (u == 0) {
    return embed_backward(m, a);
  }
  switch (gpt_part_kind(m, u, p)) {
  case GPT_PART_FC2:
    return block_backward_fc2(m, a, u - 1);
  case GPT_PART_MLP:
    return block_backward_mlp(m, a, u - 1, s);
  case GPT_PART_WO:
    return block_backward_wo(m, a, u - 1);
  case GPT_PART_QKV:
    return block_backward_qkv(m, a, u - 1, s);
  default:
    return block_backward_ln1(m, a, u - 1, s);
  }
}

loom_status_t gpt_backward_unit(gpt_model_t *m, gpt_acts_t *a, int u, loom_sched_t *s) {
  if (u < 0 || u >= m->nunits) {
    return LOOM_ERR_INVALID_ARG;
  }
  for (int p = 0; p < gpt_unit_parts(m, u); p++) {
    TRY(gpt_backward_part(m, a, u, p, s));
  }
  return LOOM_OK;
}

loom_status_t gpt_update_unit(gpt_model_t *m, int u, const loom_adamw_t *hp) {
  for (int i = m->unit_first[u]; i < m->unit_first[u + 1]; i++) {
    if (loom_tensor_numel(&m->param[i]) == 0) { // the dense MLP of a MoE block
      continue;
    }
    loom_adamw_t h = *hp;
    h.weight_decay = m->param[i].ndim == 2 ? hp->weight_decay : 0.0f;
    TRY(loom_adamw_update(&m->param[i], &m->grad[i], &m->m[i], &m->v[i], &h));
  }
  const int l = u - 1;
  if (u < 1 || l >= m->cfg.layers || !m->moe[l]) {
    return LOOM_OK;
  }
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    loom_adamw_t h = *hp;
    h.weight_decay = p == LOOM_MOE_B1 || p == LOOM_MOE_B2 ? 0.0f : hp->weight_decay;
    TRY(loom_adamw_update(loom_moe_param(m->moe[l], (loom_moe_param_t)p),
                          loom_moe_grad(m->moe[l], (loom_moe_param_t)p),
                          &m->moe_m[l * LOOM_MOE_PARAM_COUNT + p],
                          &m->moe_v[l * LOOM_MOE_PARAM_COUNT + p], &h));
  }
  return LOOM_OK;
}

// ---- sampling -----------------------------------------------------------------------------------

loom_status_t gpt_generate(const gpt_model_t *m, gpt_acts_t *a, uint8_t *text, int *len, int cap,
                           int count, float temp, uint64_t seed) {
  const int T = m->cfg.ctx, V = m->cfg.vocab;
  uint64_t state = seed ^ 0x6e6e7261746f72ull;
  int32_t *buf = malloc(3 * (size_t)T * sizeof(int32_t));
  if (!buf) {
    return LOOM_ERR_NOMEM;
  }
  int32_t *tok = buf, *pos = buf + T, cu[2] = {0, 0};
  loom_status_t st = LOOM_OK;
  for (int step = 0; step < count && *len < cap && st == LOOM_OK; step++) {
    int n = *len < T ? *len : T, from = *len - n; // the last ctx bytes
    for (int t = 0; t < n; t++) {
      tok[t] = text[from + t];
      pos[t] = t;
    }
    cu[1] = n;
    loom_tensor_t tt, pt, ct;
    int64_t nn = n, two = 2;
    loom_tensor_wrap(&tt, tok, LOOM_I32, LOOM_DEVICE_HOST, 1, &nn, "tokens");
    loom_tensor_wrap(&pt, pos, LOOM_I32, LOOM_DEVICE_HOST, 1, &nn, "positions");
    loom_tensor_wrap(&ct, cu, LOOM_I32, LOOM_DEVICE_HOST, 1, &two, "cu_seqlens");
    st = gpt_forward(m, a, &tt, &pt, NULL, &ct, NULL, NULL);
    if (st != LOOM_OK) {
      break;
    }
    const float *lg = (const float *)a->logits.data + (int64_t)(n - 1) * V;
    if (a->device != LOOM_DEVICE_HOST) { // the last row, copied to the host
      loom_tensor_t row;
      int64_t vv = V;
      loom_tensor_wrap(&row, (void *)lg, LOOM_F32, a->device, 1, &vv, "logits.last");
      if ((st = loom_tensor_copy(&a->logits_row, &row)) != LOOM_OK) {
        break;
      }
      lg = a->logits_row.data;
    }
    float mx = lg[0];
    for (int j = 1; j < V; j++) {
      mx = lg[j] > mx ? lg[j] : mx;
    }
    double sum = 0.0;
    for (int j = 0; j < V; j++) {
      sum += exp((double)(lg[j] - mx) / temp);
    }
    double r = (double)ex_uniform(&state) * sum, acc = 0.0;
    int pick = V - 1;
    for (int j = 0; j < V; j++) {
      acc += exp((double)(lg[j] - mx) / temp);
      if (r < acc) {
        pick = j;
        break;
      }
    }
    if (m->moe_ep && loom_group_size(m->moe_ep) > 1) { // every rank of the MoE group alike
      int32_t p32 = pick;
      int64_t one = 1;
      loom_tensor_t pt32;
      loom_tensor_wrap(&pt32, &p32, LOOM_I32, LOOM_DEVICE_HOST, 1, &one, "pick");
      st = loom_broadcast(m->moe_ep, &pt32, 0);
      if (st != LOOM_OK) {
        break;
      }
      pick = p32;
    }
    if (pick == GPT_DOC_START) {
      break; // the model ended the document
    }
    text[(*len)++] = (uint8_t)pick;
  }
  free(buf);
  return st;
}
