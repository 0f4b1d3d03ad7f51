/* moe.c — the MoE layer's source side: creation and the config check across the expert-parallel
 * group, parameters, routing with capacity, permute by destination, unpermute, router gradients. */
#include "config.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "compress_internal.h" // loom_mix64
#include "cpu/linear_cpu.h"
#include "ctx.h"
#include "error.h"
#include "log.h"
#include "loom_compute.h"
#include "memory.h"
#include "moe_internal.h"

#define DEFAULT_CHUNKS 4
#define DEFAULT_SLICES 4
#define MAX_SPLIT      64

static const char *const overlap_names[] = {"none", "coarse", "fine"};

const char *loom_moe_overlap_name(int overlap) {
  return overlap >= 0 && overlap < LOOM_MOE_OVERLAP_COUNT ? overlap_names[overlap] : "invalid";
}

loom_status_t loom_moe_overlap_parse(const char *name, int *out) {
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_moe_overlap_parse: out is NULL: pass where to store the mode");
  }
  for (int i = 0; name && i < LOOM_MOE_OVERLAP_COUNT; i++) {
    if (strcmp(name, overlap_names[i]) == 0) {
      *out = i;
      return LOOM_OK;
    }
  }
  return loom_error_unlogged(LOOM_ERR_INVALID_ARG, "MoE overlap '%s': use none, coarse or fine",
                             name ? name : "(null)");
}

void loom_moe_config_init(loom_moe_config_t *cfg) {
  if (cfg) {
    *cfg = (loom_moe_config_t){.aux_coef = 0.01f,
                               .overlap = LOOM_MOE_OVERLAP_DEFAULT,
                               .seed = 1,
                               .device = LOOM_DEVICE_HOST};
  }
}

loom_status_t loom_moe_reserve(moe_buf_t *b, size_t n, const char *what) {
  if (b->p && b->cap >= n) { // never NULL, even for 0 floats (memset/memcpy of 0 bytes need it)
    return LOOM_OK;
  }
  loom_host_free(b->p);
  b->p = loom_host_alloc(sizeof(float) * (n ? n : 1));
  b->cap = b->p ? n : 0;
  return b->p ? LOOM_OK
              : loom_error(NULL, LOOM_ERR_NOMEM, "MoE: cannot allocate %zu floats for %s", n, what);
}

// ---- creation -----------------------------------------------------------------------------------

// The config checks one rank can make alone; a message in err when one fails.
static int config_ok(const loom_moe_config_t *c, int np, char *err, size_t len) {
  if (c->num_experts < 1 || c->num_experts % np != 0) {
    snprintf(err, len, "num_experts %d: use a positive multiple of the expert-parallel size %d",
             c->num_experts, np);
  } else if (c->top_k < 1 || c->top_k > c->num_experts) {
    snprintf(err, len, "top_k %d: use 1..num_experts (%d)", c->top_k, c->num_experts);
  } else if (c->hidden < 1 || c->ffn < 1 || c->hidden > (1 << 24) || c->ffn > (1 << 24)) {
    snprintf(err, len, "hidden %lld, ffn %lld: use 1..16777216 each", (long long)c->hidden,
             (long long)c->ffn);
  } else if (!(c->capacity_factor >= 0.0) || c->capacity_factor > 1e6) {
    snprintf(err, len, "capacity_factor %g: use 0 (dropless) or a positive factor",
             c->capacity_factor);
  } else if (c->drop != LOOM_MOE_DROP_LATE && c->drop != LOOM_MOE_DROP_LOW_WEIGHT) {
    snprintf(err, len, "drop %d: use LOOM_MOE_DROP_LATE or LOOM_MOE_DROP_LOW_WEIGHT", (int)c->drop);
  } else if (c->overlap < 0 || c->overlap >= LOOM_MOE_OVERLAP_COUNT) {
    snprintf(err, len, "overlap %d: use a loom_moe_overlap_t", c->overlap);
  } else if (c->chunks < 0 || c->chunks > MAX_SPLIT || c->col_slices < 0 ||
             c->col_slices > MAX_SPLIT) {
    snprintf(err, len, "chunks %d, col_slices %d: use 0 (tuned) or 1..%d", c->chunks, c->col_slices,
             MAX_SPLIT);
  } else if (c->poll_tiles < -1 || c->poll_tiles > 1000000) {
    snprintf(err, len, "poll_tiles %d: use -1 (never), 0 (every tile) or a tile count",
             c->poll_tiles);
  } else if (!isfinite(c->aux_coef) || c->aux_coef < 0) {
    snprintf(err, len, "aux_coef %g: use 0 or a positive weight", (double)c->aux_coef);
  } else if (c->device < LOOM_DEVICE_HOST) {
    snprintf(err, len, "device %d: use LOOM_DEVICE_HOST (-1) or a CUDA device index", c->device);
  } else {
    return 1;
  }
  return 0;
}

// Every rank of the group must pass the same config: compare the fields across the group (two
// allreduces every rank reaches, so a mismatch is an error everywhere, never a hang).
static loom_status_t config_agree(MPI_Comm comm, const loom_moe_config_t *c, int ok) {
  static const char *const names[] = {"valid config",
                                      "num_experts",
                                      "top_k",
                                      "hidden",
                                      "ffn",
                                      "capacity_factor (x 1e6)",
                                      "drop",
                                      "overlap",
                                      "chunks",
                                      "col_slices",
                                      "aux_coef (x 1e6)",
                                      "device (0: host, 1: CUDA)",
                                      "seed (its high 32 bits)",
                                      "seed (its low 32 bits)"};
  enum { NF = sizeof names / sizeof names[0] };
  long long v[NF] = {ok,
                     c->num_experts,
                     c->top_k,
                     c->hidden,
                     c->ffn,
                     llround(c->capacity_factor * 1e6),
                     c->drop,
                     c->overlap,
                     c->chunks,
                     c->col_slices,
                     llround((double)c->aux_coef * 1e6),
                     c->device != LOOM_DEVICE_HOST,
                     (long long)(c->seed >> 32), // the replicated router is made from it
                     (long long)(c->seed & 0xFFFFFFFFu)};
  long long lo[NF], hi[NF];
  if (MPI_Allreduce(v, lo, NF, MPI_LONG_LONG, MPI_MIN, comm) != MPI_SUCCESS ||
      MPI_Allreduce(v, hi, NF, MPI_LONG_LONG, MPI_MAX, comm) != MPI_SUCCESS) {
    return loom_error(NULL, LOOM_ERR_MPI, "loom_moe_create: comparing the configs failed");
  }
  if (lo[0] == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_moe_create: another rank of the expert-parallel group was given an "
                      "invalid config (its own error says which field)");
  }
  for (int i = 1; i < NF; i++) {
    if (lo[i] != hi[i]) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "loom_moe_create: the ranks of the expert-parallel group disagree on %s "
                        "(%lld on one rank, %lld on another): pass the same config everywhere",
                        names[i], lo[i], hi[i]);
    }
  }
  return LOOM_OK;
}

// Uniform in [-a, a) from (seed, what, index): the same on every rank for the same expert.
static float init_value(uint64_t seed, uint64_t what, uint64_t i, float a) {
  uint64_t r = loom_mix64(seed ^ loom_mix64(what * 0x9E3779B97F4A7C15ull + i));
  return a * (2.0f * (float)((double)(r >> 11) * 0x1.0p-53) - 1.0f);
}

static loom_status_t make_params(loom_moe_t *m) {
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, E = m->cfg.num_experts, El = m->el;
  const int64_t shapes[LOOM_MOE_PARAM_COUNT][3] = {
      {H, E, 0}, {El, H, F}, {El, F, 0}, {El, F, H}, {El, H, 0}};
  const int ndim[LOOM_MOE_PARAM_COUNT] = {2, 3, 2, 3, 2};
  static const char *const names[LOOM_MOE_PARAM_COUNT][2] = {{"moe.router", "moe.router.grad"},
                                                             {"moe.w1", "moe.w1.grad"},
                                                             {"moe.b1", "moe.b1.grad"},
                                                             {"moe.w2", "moe.w2.grad"},
                                                             {"moe.b2", "moe.b2.grad"}};
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    loom_status_t status = loom_tensor_alloc(&m->param[p], LOOM_F32, LOOM_DEVICE_HOST, ndim[p],
                                             shapes[p], names[p][0]);
    if (status == LOOM_OK) {
      status = loom_tensor_alloc(&m->grad[p], LOOM_F32, LOOM_DEVICE_HOST, ndim[p], shapes[p],
                                 names[p][1]);
    }
    if (status != LOOM_OK) {
      return status;
    }
    loom_tensor_fill(&m->grad[p], 0.0);
    loom_tensor_fill(&m->param[p], 0.0);
  }
  const uint64_t seed = m->cfg.seed;
  const int first = m->me * m->el;
  float *router = m->param[LOOM_MOE_ROUTER].data;
  for (int64_t i = 0; i < H * E; i++) {
    router[i] = init_value(seed, 1, (uint64_t)i, 1.0f / sqrtf((float)H));
  }
  float *w1 = m->param[LOOM_MOE_W1].data, *w2 = m->param[LOOM_MOE_W2].data;
  for (int e = 0; e < m->el; e++) { // expert first + e: its values whichever rank holds it
    const uint64_t g = (uint64_t)(first + e);
    for (int64_t i = 0; i < H * F; i++) {
      w1[e * H * F + i] = init_value(seed, 2 + 4 * g, (uint64_t)i, 1.0f / sqrtf((float)H));
      w2[e * F * H + i] = init_value(seed, 3 + 4 * g, (uint64_t)i, 1.0f / sqrtf((float)F));
    }
  }
  // A layer on a device: the same values, copied there; the gradients start at zero there.
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT && m->device != LOOM_DEVICE_HOST; p++) {
    loom_tensor_t host = m->param[p], dp, dg;
    memset(&dp, 0, sizeof dp);
    memset(&dg, 0, sizeof dg);
    loom_status_t status =
        loom_tensor_alloc(&dp, LOOM_F32, m->device, ndim[p], shapes[p], names[p][0]);
    if (status == LOOM_OK) {
      status = loom_tensor_copy(&dp, &host);
    }
    if (status == LOOM_OK) {
      status = loom_tensor_alloc(&dg, LOOM_F32, m->device, ndim[p], shapes[p], names[p][1]);
    }
    if (status != LOOM_OK) {
      loom_tensor_free(&dp);
      loom_tensor_free(&dg);
      return status;
    }
    loom_tensor_free(&m->param[p]);
    loom_tensor_free(&m->grad[p]);
    m->param[p] = dp;
    m->grad[p] = dg;
  }
  return LOOM_OK;
}

// Whether this rank can hold the layer on cfg->device: LOOM_OK, or the status with its message in
// err (a device without NCCL in this build: LOOM_ERR_UNSUPPORTED, naming the fix).
static loom_status_t device_ok(const loom_moe_config_t *c, char *err, size_t len) {
  if (c->device == LOOM_DEVICE_HOST) {
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_NCCL
  loom_status_t status = loom_device_check(c->device);
  if (status != LOOM_OK) {
    snprintf(err, len, "device %d: %s", c->device, loom_last_error(NULL));
  }
  return status;
#else
  snprintf(err, len,
           "device %d: an MoE layer on a CUDA device needs loom built with CUDA and NCCL, and "
           "this build has no NCCL: reconfigure with --with-cuda --with-nccl (configure's summary "
           "says NCCL: yes), or keep the layer on the host (LOOM_DEVICE_HOST)",
           c->device);
  return LOOM_ERR_UNSUPPORTED;
#endif
}

loom_status_t loom_moe_create(loom_ctx_t *ctx, const loom_group_t *ep, const loom_moe_config_t *cfg,
                              loom_moe_t **out) {
  loom_status_t status = LOOM_OK;
  loom_moe_t *m = NULL;
  char err[256] = "";
  if (!cfg || !out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_moe_create: cfg and out must be set");
  }
  *out = NULL;
  if (ep && loom_group_rank(ep) < 0) {
    return loom_error(
        NULL, LOOM_ERR_INVALID_ARG,
        "loom_moe_create: this rank is not a member of the expert-parallel group: "
        "call it only on ranks where loom_group_rank(ep) >= 0 (ep = NULL: every expert "
        "on this rank)");
  }
  m = calloc(1, sizeof *m);
  if (!m) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_moe_create: out of memory");
  }
  m->cfg = *cfg;
  m->comm = MPI_COMM_NULL;
  m->np = ep ? loom_group_size(ep) : 1;
  m->me = ep ? loom_group_rank(ep) : 0;
  m->ep = ep;
  if (m->cfg.overlap == LOOM_MOE_OVERLAP_DEFAULT) {
    m->cfg.overlap = ctx ? ctx->params.moe_overlap : LOOM_MOE_OVERLAP_FINE;
  }
  int ok = config_ok(&m->cfg, m->np, err, sizeof err);
  loom_status_t bad = LOOM_ERR_INVALID_ARG; // the status of this rank's own problem
  if (ok) {
    bad = device_ok(&m->cfg, err, sizeof err);
    ok = bad == LOOM_OK;
  }
  if (ep) {
    LOOM_CHECK_MPI(NULL, MPI_Comm_dup(loom_group_comm(ep), &m->comm));
    if (!ok) { // this rank's own problem first; the others learn that a peer failed
      MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, m->comm);
      status = loom_error(NULL, bad, "loom_moe_create: %s", err);
      goto fail;
    }
    int all = ok;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, m->comm);
    LOOM_CHECK(config_agree(m->comm, &m->cfg, all));
  } else if (!ok) {
    status = loom_error(NULL, bad, "loom_moe_create: %s", err);
    goto fail;
  }
  m->device = m->cfg.device;
  m->el = m->cfg.num_experts / m->np;
  m->chunks = m->cfg.chunks > 0 ? m->cfg.chunks : DEFAULT_CHUNKS;
  m->slices = m->cfg.col_slices > 0 ? m->cfg.col_slices : DEFAULT_SLICES;
  m->poll_tiles = m->cfg.poll_tiles > 0 ? m->cfg.poll_tiles : m->cfg.poll_tiles < 0 ? 0 : 1;
  if (m->slices > m->cfg.hidden) {
    m->slices = (int)m->cfg.hidden;
  }
  if (m->device != LOOM_DEVICE_HOST) { // one chunk and one slice: plain row-major blocks
    static atomic_int said;
    m->chunks = m->slices = 1;
    if (m->cfg.overlap != LOOM_MOE_OVERLAP_NONE && !atomic_exchange(&said, 1)) {
      LOOM_INFO(LOOM_SUB_MOE,
                "MoE on CUDA device %d: overlap '%s' runs as 'none' on a device (NCCL dispatch "
                "and combine; the weight gradients overlap the backward's combine)",
                m->device, loom_moe_overlap_name(m->cfg.overlap));
    }
  }
  m->cnt_send = calloc((size_t)m->np * (size_t)m->el, sizeof(int64_t));
  m->cnt_recv = calloc((size_t)m->np * (size_t)m->el, sizeof(int64_t));
  m->off_send = calloc((size_t)m->np + 1, sizeof(int64_t));
  m->off_recv = calloc((size_t)m->np + 1, sizeof(int64_t));
  m->sent = calloc((size_t)m->cfg.num_experts, sizeof(int64_t));
  m->received = calloc((size_t)m->el, sizeof(int64_t));
  if (!m->cnt_send || !m->cnt_recv || !m->off_send || !m->off_recv || !m->sent || !m->received) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_moe_create: out of memory");
    goto fail;
  }
  LOOM_CHECK(make_params(m));
  *out = m;
  return LOOM_OK;
fail:
  loom_moe_destroy(m);
  return status;
}

static void buf_free(moe_buf_t *b) {
  loom_host_free(b->p);
  b->p = NULL;
  b->cap = 0;
}

void loom_moe_destroy(loom_moe_t *m) {
  if (!m) {
    return;
  }
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    loom_tensor_free(&m->param[p]);
    loom_tensor_free(&m->grad[p]);
  }
#ifdef LOOM_HAVE_NCCL
  loom_moe_dev_free(m);
#endif
  moe_buf_t *bufs[] = {&m->x,      &m->logits, &m->probs, &m->weight,  &m->dprobs_aux, &m->send_x,
                       &m->recv_x, &m->pre,    &m->h,     &m->out_exp, &m->comb,       &m->dw,
                       &m->d_send, &m->d_recv, &m->dpre,  &m->dx_exp,  &m->dx_comb,    &m->dlogits};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
    buf_free(bufs[i]);
  }
  free(m->idx);
  free(m->pos);
  free(m->cnt_send);
  free(m->cnt_recv);
  free(m->off_send);
  free(m->off_recv);
  free(m->sent);
  free(m->received);
  if (m->comm != MPI_COMM_NULL) {
    MPI_Comm_free(&m->comm);
  }
  free(m);
}

loom_tensor_t *loom_moe_param(loom_moe_t *m, loom_moe_param_t which) {
  return m && (int)which >= 0 && which < LOOM_MOE_PARAM_COUNT ? &m->param[which] : NULL;
}

loom_tensor_t *loom_moe_grad(loom_moe_t *m, loom_moe_param_t which) {
  return m && (int)which >= 0 && which < LOOM_MOE_PARAM_COUNT ? &m->grad[which] : NULL;
}

void loom_moe_stats(const loom_moe_t *m, loom_moe_stats_t *out) {
  if (!m || !out) {
    return;
  }
  *out = (loom_moe_stats_t){.num_experts = m->cfg.num_experts,
                            .local_experts = m->el,
                            .first_expert = m->me * m->el,
                            .sent = m->sent,
                            .received = m->received,
                            .dropped = m->dropped,
                            .aux = m->aux,
                            .comm_ms = m->comm_ms,
                            .compute_ms = m->compute_ms,
                            .wall_ms = m->wall_ms};
}

// ---- routing ------------------------------------------------------------------------------------

// t: f32 rows of H values on the layer's device.
static loom_status_t check_rows(const loom_moe_t *m, const char *op, const char *name,
                                const loom_tensor_t *t, int64_t H, int64_t *rows) {
  const char *where = m->device == LOOM_DEVICE_HOST ? "host" : "device";
  if (!t || t->dtype != LOOM_F32 || t->ndim < 1 || t->ndim > LOOM_MAX_DIMS ||
      t->shape[t->ndim - 1] != H || (!t->data && loom_tensor_numel(t) > 0)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s must be an f32 %s tensor of rows of hidden = %lld values", op, name,
                      where, (long long)H);
  }
#ifndef LOOM_HAVE_NCCL
  if (t->device != LOOM_DEVICE_HOST) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: %s is on CUDA device %d, but this loom was built without NCCL, which "
                      "the MoE layer needs on a device: pass host tensors, or reconfigure with "
                      "--with-cuda --with-nccl and create the layer with cfg.device set",
                      op, name, t->device);
  }
#endif
  if (t->device != m->device) {
    char have[32] = "the host", want[32] = "the host";
    if (t->device != LOOM_DEVICE_HOST) {
      snprintf(have, sizeof have, "CUDA device %d", t->device);
    }
    if (m->device != LOOM_DEVICE_HOST) {
      snprintf(want, sizeof want, "CUDA device %d", m->device);
    }
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is on %s, but the layer was created on %s: pass tensors on the "
                      "layer's device, or create the layer with loom_moe_config_t.device = %d",
                      op, name, have, want, t->device);
  }
  // Negative or overflowing extents (which loom_tensor_numel counts as empty).
  loom_status_t status = loom_arg_tensor(op, name, t, LOOM_F32, m->device);
  if (status != LOOM_OK) {
    return status;
  }
#ifdef LOOM_HAVE_NCCL
  if (m->device != LOOM_DEVICE_HOST && loom_tensor_numel(t) > 0 &&
      !loom_moe_dev_pointer_ok(t->data, m->device)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s says CUDA device %d, but its data %p is not memory of that device: "
                      "allocate it with loom_tensor_alloc on the device",
                      op, name, m->device, t->data);
  }
#endif
  *rows = loom_tensor_numel(t) / H;
  return LOOM_OK;
}

// Which assignments a full expert keeps: mark pos[i] = -2 for the dropped ones of expert g.
typedef struct cand {
  float w;
  int64_t i; // t * K + k
} cand_t;

static int by_weight(const void *a, const void *b) {
  const cand_t *x = a, *y = b;
  if (x->w != y->w) {
    return x->w > y->w ? -1 : 1;
  }
  return x->i < y->i ? -1 : x->i > y->i;
}

static loom_status_t apply_capacity(loom_moe_t *m, int64_t T) {
  const int K = m->cfg.top_k, E = m->cfg.num_experts;
  const int64_t n = T * K;
  m->dropped = 0;
  if (m->cfg.capacity_factor <= 0.0 || n == 0) {
    return LOOM_OK;
  }
  const int64_t cap = (int64_t)ceil(m->cfg.capacity_factor * (double)n / (double)E);
  cand_t *c = malloc(sizeof *c * (size_t)n);
  if (!c) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "MoE: out of memory for the capacity");
  }
  for (int g = 0; g < E; g++) {
    int64_t nc = 0;
    for (int64_t i = 0; i < n; i++) {
      if (m->idx[i] == g) {
        c[nc++] = (cand_t){m->weight.p[i], i};
      }
    }
    if (nc <= cap) {
      continue;
    }
    if (m->cfg.drop == LOOM_MOE_DROP_LOW_WEIGHT) {
      qsort(c, (size_t)nc, sizeof *c, by_weight);
    }
    for (int64_t r = cap; r < nc; r++) { // DROP_LATE: c is in token order already
      m->pos[c[r].i] = -2;
      m->dropped++;
    }
  }
  free(c);
  return LOOM_OK;
}

loom_status_t loom_moe_check_counts(const int64_t *cnt, int np, int el, int64_t width,
                                    int64_t *n_recv) {
  const int64_t max_rows =
      (int64_t)(PTRDIFF_MAX / (ptrdiff_t)sizeof(float)) / (width > 0 ? width : 1);
  int64_t total = 0;
  *n_recv = 0;
  for (int s = 0; s < np; s++) {
    for (int e = 0; e < el; e++) {
      const int64_t c = cnt[(size_t)s * (size_t)el + (size_t)e];
      if (c < 0 || c > max_rows - total) {
        return loom_error(NULL, LOOM_ERR_CORRUPT,
                          "MoE: rank %d announced %lld rows for local expert %d (after %lld "
                          "rows): counts must be >= 0 and at most %lld rows in all; the ranks "
                          "disagree on the layer, or the count exchange was damaged",
                          s, (long long)c, e, (long long)total, (long long)max_rows);
      }
      total += c;
    }
  }
  *n_recv = total;
  return LOOM_OK;
}

// Counts, offsets and the send position of every kept assignment; exchange the counts.
static loom_status_t permute_plan(loom_moe_t *m, int64_t T) {
  const int K = m->cfg.top_k, El = m->el, np = m->np;
  int64_t *seen = calloc((size_t)m->cfg.num_experts, sizeof(int64_t));
  if (!seen) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "MoE: out of memory");
  }
  memset(m->cnt_send, 0, sizeof(int64_t) * (size_t)np * (size_t)El);
  for (int64_t i = 0; i < T * K; i++) {
    if (m->pos[i] != -2) {
      m->cnt_send[m->idx[i]]++; // expert g = d * El + e is entry (d, e)
    }
  }
  for (int g = 0; g < m->cfg.num_experts; g++) {
    m->sent[g] = m->cnt_send[g];
  }
  m->off_send[0] = 0;
  for (int d = 0; d < np; d++) {
    m->off_send[d + 1] = m->off_send[d];
    for (int e = 0; e < El; e++) {
      m->off_send[d + 1] += m->cnt_send[d * El + e];
    }
  }
  m->n_send = m->off_send[np];
  for (int64_t i = 0; i < T * K; i++) {
    if (m->pos[i] == -2) {
      m->pos[i] = -1;
      continue;
    }
    const int g = m->idx[i], d = g / El, e = g % El;
    const int64_t *cnt = m->cnt_send + (size_t)d * (size_t)El, r = seen[g]++;
    int c = 0;
    while (moe_part_lo(cnt[e], m->chunks, c + 1) <= r) {
      c++;
    }
    m->pos[i] = m->off_send[d] + loom_moe_tile_offset(m, cnt, c, e) +
                (r - moe_part_lo(cnt[e], m->chunks, c));
  }
  free(seen);
  if (np > 1) {
    const double t0 = MPI_Wtime();
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Ialltoall(m->cnt_send, El, MPI_INT64_T, m->cnt_recv, El, MPI_INT64_T, m->comm, &req) !=
            MPI_SUCCESS ||
        loom_watch_waitall(&m->watch, 1, &req) != MPI_SUCCESS) {
      return loom_error(NULL, LOOM_ERR_MPI, "MoE: exchanging the token counts failed");
    }
    m->comm_ms += 1e3 * (MPI_Wtime() - t0);
  } else {
    memcpy(m->cnt_recv, m->cnt_send, sizeof(int64_t) * (size_t)El);
  }
  const int64_t width = m->cfg.hidden > m->cfg.ffn ? m->cfg.hidden : m->cfg.ffn;
  int64_t n_recv = 0;
  loom_status_t status = loom_moe_check_counts(m->cnt_recv, np, El, width, &n_recv);
  if (status != LOOM_OK) {
    return status;
  }
  m->off_recv[0] = 0;
  memset(m->received, 0, sizeof(int64_t) * (size_t)El);
  for (int s = 0; s < np; s++) {
    m->off_recv[s + 1] = m->off_recv[s];
    for (int e = 0; e < El; e++) {
      m->off_recv[s + 1] += m->cnt_recv[s * El + e];
      m->received[e] += m->cnt_recv[s * El + e];
    }
  }
  m->n_recv = m->off_recv[np];
  return LOOM_OK;
}

loom_status_t loom_moe_route(loom_moe_t *m, int64_t T) {
  for (int64_t i = 0; i < T * m->cfg.top_k; i++) {
    m->pos[i] = 0;
  }
  loom_status_t status = apply_capacity(m, T);
  return status == LOOM_OK ? permute_plan(m, T) : status;
}

// The routing arrays of T tokens on the host: weight (T, K), idx and pos (T, K).
static loom_status_t reserve_routing(loom_moe_t *m, const char *op, int64_t T) {
  const int K = m->cfg.top_k;
  loom_status_t status = loom_moe_reserve(&m->weight, (size_t)(T * K), "the routing weights");
  if (status == LOOM_OK && (m->idx_cap < (size_t)(T * K) || !m->idx)) {
    free(m->idx);
    free(m->pos);
    m->idx = malloc(sizeof(int32_t) * (size_t)(T * K + 1));
    m->pos = malloc(sizeof(int64_t) * (size_t)(T * K + 1));
    m->idx_cap = m->idx && m->pos ? (size_t)(T * K) : 0;
    if (!m->idx || !m->pos) {
      status = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory for the routing", op);
    }
  }
  return status;
}

// Row p of the send order (expert g), read back from a by-slice buffer (comb or dx_comb):
// acc += w * row.
static void add_back(const loom_moe_t *m, float *buf, int g, int64_t p, float w, float *acc) {
  const int d = g / m->el;
  for (int j = 0; j < m->slices; j++) {
    const int64_t j0 = moe_part_lo(m->cfg.hidden, m->slices, j);
    const int64_t hj = moe_part_lo(m->cfg.hidden, m->slices, j + 1) - j0;
    const float *row = loom_moe_sliced(m, buf, m->off_send, d, j, p - m->off_send[d]);
    for (int64_t c = 0; c < hj; c++) {
      acc[j0 + c] += w * row[c];
    }
  }
}

// dot(dy, row p) of a by-slice buffer.
static float dot_back(const loom_moe_t *m, float *buf, int g, int64_t p, const float *dy) {
  const int d = g / m->el;
  double s = 0.0;
  for (int j = 0; j < m->slices; j++) {
    const int64_t j0 = moe_part_lo(m->cfg.hidden, m->slices, j);
    const int64_t hj = moe_part_lo(m->cfg.hidden, m->slices, j + 1) - j0;
    const float *row = loom_moe_sliced(m, buf, m->off_send, d, j, p - m->off_send[d]);
    for (int64_t c = 0; c < hj; c++) {
      s += (double)dy[j0 + c] * row[c];
    }
  }
  return (float)s;
}

static loom_status_t wrap(loom_tensor_t *t, void *p, loom_dtype_t dt, int64_t a, int64_t b) {
  const int64_t shape[2] = {a, b};
  return loom_tensor_wrap(t, p, dt, LOOM_DEVICE_HOST, 2, shape, "");
}

// This rank enters a forward or backward of the layer on the ep group: the watchdog
// (LOOM_TIMEOUT) watches its exchanges from now on, and under LOOM_CHECK_CONSISTENCY the members
// compare their calls (the operation and the tensor's name; the rows may differ) first.
static loom_status_t enter(loom_moe_t *m, enum loom_op_kind kind, const loom_tensor_t *t) {
  memset(&m->watch, 0, sizeof m->watch);
  if (!m->ep) {
    return LOOM_OK;
  }
  struct loom_op_desc d;
  loom_op_desc_set(&d, kind, t->name, LOOM_F32, -1, -1, -1, 0);
  loom_watch_enter(&m->watch, m->ep, &d, 1);
  return loom_check_consistency(&m->watch);
}

loom_status_t loom_moe_forward(loom_moe_t *m, const loom_tensor_t *x, loom_tensor_t *y,
                               float *aux) {
  static const char op[] = "loom_moe_forward";
  loom_status_t status = LOOM_OK;
  int64_t T = 0, Ty = 0;
  if (!m) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: moe is NULL", op);
  }
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, E = m->cfg.num_experts;
  const int K = m->cfg.top_k;
  status = check_rows(m, op, "x", x, H, &T);
  if (status == LOOM_OK) {
    status = check_rows(m, op, "y", y, H, &Ty);
  }
  if (status == LOOM_OK && Ty != T) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: y holds %lld rows, x %lld", op,
                        (long long)Ty, (long long)T);
  }
  if (status != LOOM_OK) {
    return loom_consistency_refuse(m->ep, LOOM_OPK_MOE_FORWARD, x, status); // (peers learn it)
  }
  m->fwd_pending = 0; // until this forward succeeds
  LOOM_CHECK(enter(m, LOOM_OPK_MOE_FORWARD, x));
  const double t0 = MPI_Wtime();
  m->comm_ms = m->compute_ms = 0.0;
  m->t = T;
  LOOM_CHECK(reserve_routing(m, op, T));
  if (m->device != LOOM_DEVICE_HOST) { // (only with NCCL: loom_moe_create refuses it else)
#ifdef LOOM_HAVE_NCCL
    LOOM_CHECK(loom_moe_dev_forward(m, x, y, T));
#endif
    if (aux) {
      *aux = m->aux;
    }
    m->wall_ms = 1e3 * (MPI_Wtime() - t0);
    m->fwd_pending = 1;
    return LOOM_OK;
  }
  LOOM_CHECK(loom_moe_reserve(&m->x, (size_t)(T * H), "the input"));
  LOOM_CHECK(loom_moe_reserve(&m->logits, (size_t)(T * E), "the router logits"));
  LOOM_CHECK(loom_moe_reserve(&m->probs, (size_t)(T * E), "the router probabilities"));
  LOOM_CHECK(loom_moe_reserve(&m->dprobs_aux, (size_t)(T * E), "the aux gradient"));
  if (T > 0) {
    memcpy(m->x.p, x->data, sizeof(float) * (size_t)(T * H));
  }
  // Router: logits = x Wr, softmax, top-k, renormalised weights, aux loss.
  loom_cpu_gemm(0, 0, T, E, H, 1.0f, m->x.p, m->param[LOOM_MOE_ROUTER].data, NULL, 0.0f,
                m->logits.p);
  loom_tensor_t tl, tp, ti, tw, td;
  LOOM_CHECK(wrap(&tl, m->logits.p, LOOM_F32, T, E));
  LOOM_CHECK(wrap(&tp, m->probs.p, LOOM_F32, T, E));
  LOOM_CHECK(wrap(&ti, m->idx, LOOM_I32, T, K));
  LOOM_CHECK(wrap(&tw, m->weight.p, LOOM_F32, T, K));
  LOOM_CHECK(wrap(&td, m->dprobs_aux.p, LOOM_F32, T, E));
  LOOM_CHECK(loom_moe_router_forward(&tp, &ti, &tw, &tl));
  memset(m->dprobs_aux.p, 0, sizeof(float) * (size_t)(T * E));
  m->aux = 0.0f;
  if (m->cfg.aux_coef > 0.0f) {
    LOOM_CHECK(loom_moe_aux_loss(&m->aux, &td, &tp, &ti, m->cfg.aux_coef));
  }
  // Capacity, counts, the send order; the counts travel to the experts' ranks.
  LOOM_CHECK(loom_moe_route(m, T));
  LOOM_CHECK(loom_moe_reserve(&m->send_x, (size_t)(m->n_send * H), "the dispatched rows"));
  LOOM_CHECK(loom_moe_reserve(&m->comb, (size_t)(m->n_send * H), "the combined rows"));
  LOOM_CHECK(loom_moe_reserve(&m->recv_x, (size_t)(m->n_recv * H), "the received rows"));
  LOOM_CHECK(loom_moe_reserve(&m->out_exp, (size_t)(m->n_recv * H), "the expert outputs"));
  LOOM_CHECK(loom_moe_reserve(&m->pre, (size_t)(m->n_recv * F), "the expert activations"));
  LOOM_CHECK(loom_moe_reserve(&m->h, (size_t)(m->n_recv * F), "the expert activations"));
  for (int64_t i = 0; i < T * K; i++) {
    if (m->pos[i] >= 0) {
      memcpy(m->send_x.p + m->pos[i] * H, m->x.p + (i / K) * H, sizeof(float) * (size_t)H);
    }
  }
  LOOM_CHECK(loom_moe_expert_forward(m));
  // Unpermute: y[t] = sum over k (in order) of weight[t, k] * expert output.
  float *yp = y->data;
  for (int64_t t = 0; t < T; t++) {
    float *row = yp + t * H;
    memset(row, 0, sizeof(float) * (size_t)H);
    for (int k = 0; k < K; k++) {
      const int64_t i = t * K + k;
      if (m->pos[i] >= 0) {
        add_back(m, m->comb.p, m->idx[i], m->pos[i], m->weight.p[i], row);
      }
    }
  }
  if (aux) {
    *aux = m->aux;
  }
  m->wall_ms = 1e3 * (MPI_Wtime() - t0);
  m->fwd_pending = 1;
fail:
  return status;
}

loom_status_t loom_moe_backward(loom_moe_t *m, const loom_tensor_t *dy, loom_tensor_t *dx) {
  static const char op[] = "loom_moe_backward";
  loom_status_t status = LOOM_OK;
  int64_t T = 0, Tx = 0;
  if (!m) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: moe is NULL", op);
  }
  const int64_t H = m->cfg.hidden, F = m->cfg.ffn, E = m->cfg.num_experts;
  const int K = m->cfg.top_k;
  status = check_rows(m, op, "dy", dy, H, &T);
  if (status == LOOM_OK) {
    status = check_rows(m, op, "dx", dx, H, &Tx);
  }
  if (status == LOOM_OK && !m->fwd_pending) { // its gradients would be added twice, or to nothing
    status = loom_error(NULL, LOOM_ERR_STATE,
                        "%s: no forward to take back (none ran, the last one failed, or its "
                        "backward already ran): call loom_moe_forward before each backward",
                        op);
  }
  if (status == LOOM_OK && (T != m->t || Tx != m->t)) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: dy holds %lld rows and dx %lld, the last forward %lld: call the "
                        "backward of the last forward",
                        op, (long long)T, (long long)Tx, (long long)m->t);
  }
  if (status != LOOM_OK) {
    return loom_consistency_refuse(m->ep, LOOM_OPK_MOE_BACKWARD, dy, status);
  }
  m->fwd_pending = 0;
  LOOM_CHECK(enter(m, LOOM_OPK_MOE_BACKWARD, dy));
  const double t0 = MPI_Wtime();
  m->comm_ms = m->compute_ms = 0.0;
  if (m->device != LOOM_DEVICE_HOST) { // (only with NCCL: loom_moe_create refuses it else)
#ifdef LOOM_HAVE_NCCL
    LOOM_CHECK(loom_moe_dev_backward(m, dy, dx, T));
#endif
    m->wall_ms = 1e3 * (MPI_Wtime() - t0);
    return LOOM_OK;
  }
  LOOM_CHECK(loom_moe_reserve(&m->dw, (size_t)(T * K), "the weight gradients"));
  LOOM_CHECK(loom_moe_reserve(&m->dlogits, (size_t)(T * E), "the logit gradients"));
  LOOM_CHECK(loom_moe_reserve(&m->d_send, (size_t)(m->n_send * H), "the output gradients"));
  LOOM_CHECK(loom_moe_reserve(&m->dx_comb, (size_t)(m->n_send * H), "the input gradients"));
  LOOM_CHECK(loom_moe_reserve(&m->d_recv, (size_t)(m->n_recv * H), "the output gradients"));
  LOOM_CHECK(loom_moe_reserve(&m->dx_exp, (size_t)(m->n_recv * H), "the input gradients"));
  LOOM_CHECK(loom_moe_reserve(&m->dpre, (size_t)(m->n_recv * F), "the activation gradients"));
  // d out[t, k] = weight[t, k] dy[t]; d weight[t, k] = dy[t] . out[t, k].
  const float *dyp = dy->data;
  for (int64_t i = 0; i < T * K; i++) {
    const float *g = dyp + (i / K) * H;
    m->dw.p[i] = 0.0f;
    if (m->pos[i] >= 0) {
      m->dw.p[i] = dot_back(m, m->comb.p, m->idx[i], m->pos[i], g);
      float *row = m->d_send.p + m->pos[i] * H;
      for (int64_t c = 0; c < H; c++) {
        row[c] = m->weight.p[i] * g[c];
      }
    }
  }
  LOOM_CHECK(loom_moe_expert_backward(m));
  float *dxp = dx->data;
  for (int64_t t = 0; t < T; t++) {
    float *row = dxp + t * H;
    memset(row, 0, sizeof(float) * (size_t)H);
    for (int k = 0; k < K; k++) {
      const int64_t i = t * K + k;
      if (m->pos[i] >= 0) {
        add_back(m, m->dx_comb.p, m->idx[i], m->pos[i], 1.0f, row);
      }
    }
  }
  // Router: through the weights and the aux loss to the logits, then to Wr and x.
  loom_tensor_t tg, tdw, tp, ti, tw, td;
  LOOM_CHECK(wrap(&tg, m->dlogits.p, LOOM_F32, T, E));
  LOOM_CHECK(wrap(&tdw, m->dw.p, LOOM_F32, T, K));
  LOOM_CHECK(wrap(&tp, m->probs.p, LOOM_F32, T, E));
  LOOM_CHECK(wrap(&ti, m->idx, LOOM_I32, T, K));
  LOOM_CHECK(wrap(&tw, m->weight.p, LOOM_F32, T, K));
  LOOM_CHECK(wrap(&td, m->dprobs_aux.p, LOOM_F32, T, E));
  LOOM_CHECK(loom_moe_router_backward(&tg, &tdw, &tp, &ti, &tw, &td));
  loom_cpu_gemm(1, 0, H, E, T, 1.0f, m->x.p, m->dlogits.p, NULL, 1.0f,
                m->grad[LOOM_MOE_ROUTER].data);
  loom_cpu_gemm(0, 1, T, H, E, 1.0f, m->dlogits.p, m->param[LOOM_MOE_ROUTER].data, NULL, 1.0f, dxp);
  m->wall_ms = 1e3 * (MPI_Wtime() - t0);
fail:
  return status;
}
