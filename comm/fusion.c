/* fusion.c — allreduce many small tensors as few large ones: plan buckets of at most the fusion
 * threshold in the given order (kept while the tensors stay the same), then move each bucket in
 * cache-sized pieces: pack a piece, start it, unpack the piece started a window earlier. */
#include "config.h"
#include "loom_comm.h"

#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "comm_internal.h"
#include "ctx.h"
#include "error.h"
#include "log.h"
#include "memory.h"

// Pieces: a bucket travels in pieces of at most LOOM_FUSION_PIECE bytes, each an allreduce of
// its own (every element is still summed in rank order, so the bits do not depend on the split).
// At most LOOM_FUSION_SLOTS pieces are in flight; piece k is packed into staging slot
// k % LOOM_FUSION_SLOTS, so the staging stays in cache: what is packed is sent at once, and
// what lands is unpacked at once.
#ifndef LOOM_FUSION_PIECE
#define LOOM_FUSION_PIECE ((size_t)512 << 10)
#endif
#define LOOM_FUSION_SLOTS 4

// A reusable staging buffer (host or one CUDA device).
struct bucket_buf {
  void *data;
  size_t bytes;
  int device;
};

// A planned bucket: tensors [first, last) of the call (empty ones among them carry nothing).
struct bucket {
  int first, last;
  size_t bytes;
  int direct; // one non-empty tensor: reduced in place, without copying
};

// One allreduce of the call: bytes [lo, hi) of bucket k; a direct bucket is one piece, in place.
struct piece {
  int bucket;
  int first; // the first tensor of the bucket that overlaps the piece
  size_t lo, hi;
};

// What the plan depends on, per tensor: a call with the same tensors reuses the plan.
struct tensor_sig {
  void *data;
  size_t bytes;
  loom_dtype_t dtype;
  int device, ndim;
  int64_t shape[LOOM_MAX_DIMS];
};

#define LOGGED_PLANS 16

struct loom_fusion {
  loom_ctx_t *ctx;
  const loom_group_t *g;
  size_t threshold; // bytes per bucket; 0: every tensor travels alone
  int buckets;      // buckets of the last call
  struct bucket_buf bufs[LOOM_FUSION_SLOTS];
  // The plan of the last call, for n tensors (nplan < 0: none).
  int nplan, cap;
  struct tensor_sig *sig; // (cap)
  size_t *offset;         // (cap) byte offset of each tensor in its bucket
  struct bucket *b;       // (cap) buckets [0, nb)
  int nb;
  struct piece *p; // (np) pieces in order
  int np, cap_pieces;
  loom_request_t **reqs;                  // (cap_pieces) one per piece
  loom_tensor_t views[LOOM_FUSION_SLOTS]; // the staged pieces in flight, by slot
  uint64_t logged[LOGGED_PLANS];          // plans already logged (hashes), round robin
  int nlogged;
};

// ---- create and destroy -------------------------------------------------------------------------

loom_status_t loom_fusion_create(loom_ctx_t *ctx, const loom_group_t *g, size_t threshold,
                                 loom_fusion_t **fusion) {
  static const char op[] = "loom_fusion_create";
  if (!fusion) {
    return loom_error(ctx, LOOM_ERR_INVALID_ARG, "%s: fusion is NULL: pass where to store it", op);
  }
  *fusion = NULL;
  if (!ctx || !g) {
    return loom_error(ctx, LOOM_ERR_INVALID_ARG, "%s: %s is NULL: pass the context and a group", op,
                      !ctx ? "ctx" : "g");
  }
  loom_fusion_t *f = calloc(1, sizeof *f);
  if (!f) {
    return loom_error(ctx, LOOM_ERR_NOMEM, "%s: cannot allocate the fusion state", op);
  }
  f->ctx = ctx;
  f->g = g;
  f->threshold = threshold ? threshold : (size_t)ctx->params.fusion_threshold;
  f->nplan = -1;
  for (int i = 0; i < LOOM_FUSION_SLOTS; i++) {
    f->bufs[i].device = LOOM_DEVICE_HOST;
  }
  *fusion = f;
  return LOOM_OK;
}

static void free_buf(struct bucket_buf *b) {
  if (b->device == LOOM_DEVICE_HOST) {
    loom_host_free(b->data);
  } else {
    loom_device_free(b->device, b->data);
  }
  b->data = NULL;
  b->bytes = 0;
}

void loom_fusion_destroy(loom_fusion_t *fusion) {
  if (!fusion) {
    return;
  }
  for (int i = 0; i < LOOM_FUSION_SLOTS; i++) {
    free_buf(&fusion->bufs[i]);
  }
  free(fusion->sig);
  free(fusion->offset);
  free(fusion->b);
  free(fusion->p);
  free(fusion->reqs);
  free(fusion);
}

int loom_fusion_buckets(const loom_fusion_t *fusion) {
  return fusion ? fusion->buckets : 0;
}

// ---- checks -------------------------------------------------------------------------------------

struct span {
  uintptr_t addr;
  size_t bytes;
  int index;
};

static int by_addr(const void *a, const void *b) {
  const struct span *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

// tensors[i] present, of tensors[0]'s dtype and device. The name for messages is formatted only
// on a failure (this runs for every tensor of every call whose plan changed).
static loom_status_t check_one(const char *op, loom_tensor_t *const *t, int i) {
  char name[32], s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  if (t[i] && loom_dtype_size(t[0]->dtype) != 0 && t[i]->dtype == t[0]->dtype &&
      loom_arg_tensor(op, "tensors[i]", t[i], t[0]->dtype, t[0]->device) == LOOM_OK) {
    return LOOM_OK;
  }
  snprintf(name, sizeof name, "tensors[%d]", i);
  if (!t[i]) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
  }
  if (loom_dtype_size(t[0]->dtype) == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: tensors[0] has dtype %d, expected one of f32, f16, bf16, i8, u8, i32, "
                      "i64",
                      op, (int)t[0]->dtype);
  }
  if (t[i]->dtype != t[0]->dtype) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is %s but tensors[0] is %s: expected dtype %s for every tensor of "
                      "one call",
                      op, name, loom_shape_str(t[i], s1), loom_shape_str(t[0], s2),
                      loom_dtype_name(t[0]->dtype));
  }
  return loom_arg_tensor(op, name, t[i], t[0]->dtype, t[0]->device); // names tensors[i] now
}

// Every tensor present, of tensors[0]'s dtype and device, and no two sharing memory.
static loom_status_t check_tensors(const char *op, loom_tensor_t *const *t, int n) {
  loom_status_t status = LOOM_OK;
  struct span *spans = NULL;
  char s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  for (int i = 0; i < n; i++) {
    status = check_one(op, t, i);
    if (status != LOOM_OK) {
      return status;
    }
  }
  spans = malloc(sizeof *spans * (size_t)(n > 0 ? n : 1));
  if (!spans) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d spans", op, n);
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    size_t bytes = loom_tensor_bytes(t[i]);
    if (bytes > 0) {
      spans[m++] = (struct span){(uintptr_t)t[i]->data, bytes, i};
    }
  }
  qsort(spans, (size_t)m, sizeof *spans, by_addr);
  for (int i = 1; i < m; i++) {
    if (spans[i - 1].addr + spans[i - 1].bytes > spans[i].addr) {
      int a = spans[i - 1].index, b = spans[i].index;
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: tensors[%d] %s and tensors[%d] %s share memory: pass each tensor "
                          "once, in separate buffers",
                          op, a < b ? a : b, loom_shape_str(t[a < b ? a : b], s1), a < b ? b : a,
                          loom_shape_str(t[a < b ? b : a], s2));
      break;
    }
  }
  free(spans);
  return status;
}

// ---- plan ---------------------------------------------------------------------------------------

// Buckets in the given order: pack tensors until the next would pass the threshold; a tensor
// larger than the threshold travels alone; empty tensors travel in no bucket. Returns the count.
static int plan(loom_tensor_t *const *t, int n, size_t threshold, struct bucket *b) {
  int nb = 0, open = 0, members = 0;
  for (int i = 0; i < n; i++) {
    size_t bytes = loom_tensor_bytes(t[i]);
    if (bytes == 0) {
      continue;
    }
    if (open && (bytes > threshold || b[nb - 1].bytes + bytes > threshold)) {
      open = 0;
    }
    if (!open) {
      b[nb++] = (struct bucket){i, i + 1, 0, 0};
      open = bytes <= threshold; // an oversized tensor closes its bucket at once
      members = 0;
    }
    b[nb - 1].last = i + 1;
    b[nb - 1].bytes += bytes;
    members++;
    b[nb - 1].direct = members == 1;
  }
  return nb;
}

static void log_plan(loom_fusion_t *f, loom_tensor_t *const *t, int n, const struct bucket *b,
                     int nb) {
  uint64_t h = 1469598103934665603ull; // FNV-1a over the sizes and the threshold
  size_t total = 0;
  int alone = 0;
  for (int i = 0; i < n; i++) {
    size_t bytes = loom_tensor_bytes(t[i]);
    total += bytes;
    h = (h ^ (uint64_t)bytes) * 1099511628211ull;
  }
  h = (h ^ (uint64_t)f->threshold) * 1099511628211ull;
  for (int i = 0; i < LOGGED_PLANS && i < f->nlogged; i++) {
    if (f->logged[i] == h) {
      return;
    }
  }
  f->logged[f->nlogged++ % LOGGED_PLANS] = h;
  for (int k = 0; k < nb; k++) {
    alone += b[k].direct;
  }
  LOOM_INFO(LOOM_SUB_COLL,
            "fusion plan on group %s: %d tensors, %zu bytes of %s in %d buckets of at most %zu "
            "bytes (%d reduced in place without copying)",
            loom_group_kind_name(f->g->kind), n, total, n ? loom_dtype_name(t[0]->dtype) : "-", nb,
            f->threshold, alone);
  for (int k = 0; k < nb; k++) {
    LOOM_TRACE(LOOM_SUB_COLL, "fusion bucket %d: tensors %d..%d, %zu bytes%s", k, b[k].first,
               b[k].last - 1, b[k].bytes, b[k].direct ? " (in place)" : "");
  }
}

// ---- plan cache -------------------------------------------------------------------------------

static struct tensor_sig signature(const loom_tensor_t *t) {
  struct tensor_sig sig = {t->data, loom_tensor_bytes(t), t->dtype, t->device, t->ndim, {0}};
  for (int d = 0; d < t->ndim && d < LOOM_MAX_DIMS; d++) {
    sig.shape[d] = t->shape[d];
  }
  return sig;
}

static int same_tensor(const struct tensor_sig *sig, const loom_tensor_t *t) {
  if (!t || sig->data != t->data || sig->dtype != t->dtype || sig->device != t->device ||
      sig->ndim != t->ndim || t->ndim < 0 || t->ndim > LOOM_MAX_DIMS) {
    return 0;
  }
  for (int d = 0; d < t->ndim; d++) {
    if (sig->shape[d] != t->shape[d]) {
      return 0;
    }
  }
  return 1;
}

// 1 when the call passes the tensors of the last planned call (then they were checked already).
static int plan_cached(const loom_fusion_t *f, loom_tensor_t *const *t, int n) {
  if (f->nplan != n) {
    return 0;
  }
  for (int i = 0; i < n; i++) {
    if (!same_tensor(&f->sig[i], t[i])) {
      return 0;
    }
  }
  return 1;
}

static loom_status_t plan_nomem(loom_fusion_t *f, int n, const char *what) {
  return loom_error(f->ctx, LOOM_ERR_NOMEM,
                    "loom_fusion_allreduce: cannot allocate the plan of %d %s", n, what);
}

// Room for a plan of n tensors and np pieces (arrays kept as they were on failure).
static loom_status_t plan_room(loom_fusion_t *f, int n, int np) {
  if (n > f->cap) {
    struct tensor_sig *sig = realloc(f->sig, sizeof *sig * (size_t)n);
    if (!sig) {
      return plan_nomem(f, n, "tensors");
    }
    f->sig = sig;
    size_t *offset = realloc(f->offset, sizeof *offset * (size_t)n);
    if (!offset) {
      return plan_nomem(f, n, "tensors");
    }
    f->offset = offset;
    struct bucket *b = realloc(f->b, sizeof *b * (size_t)n);
    if (!b) {
      return plan_nomem(f, n, "tensors");
    }
    f->b = b;
    f->cap = n;
  }
  if (np > f->cap_pieces) {
    struct piece *p = realloc(f->p, sizeof *p * (size_t)np);
    if (!p) {
      return plan_nomem(f, np, "pieces");
    }
    f->p = p;
    loom_request_t **reqs = realloc(f->reqs, sizeof *reqs * (size_t)np);
    if (!reqs) {
      return plan_nomem(f, np, "pieces");
    }
    f->reqs = reqs;
    f->cap_pieces = np;
  }
  return LOOM_OK;
}

// Pieces of bucket k appended at f->p[f->np]: a direct bucket whole, else LOOM_FUSION_PIECE
// bytes at a time, each knowing the first tensor it overlaps.
static void add_pieces(loom_fusion_t *f, int k) {
  const struct bucket *b = &f->b[k];
  int i = b->first;
  for (size_t lo = 0; lo < b->bytes; lo += LOOM_FUSION_PIECE) {
    while (f->offset[i] + f->sig[i].bytes <= lo) { // skip tensors that end before the piece
      i++;
    }
    size_t hi = b->bytes - lo < LOOM_FUSION_PIECE ? b->bytes : lo + LOOM_FUSION_PIECE;
    if (b->direct) {
      hi = b->bytes;
    }
    f->p[f->np++] = (struct piece){k, i, lo, hi};
    if (b->direct) {
      break;
    }
  }
}

// Plan the call anew: check the tensors, buckets, offsets, pieces; remember the tensors.
static loom_status_t make_plan(loom_fusion_t *f, loom_tensor_t *const *t, int n) {
  loom_status_t status = LOOM_OK;
  f->nplan = -1;
  LOOM_CHECK(check_tensors("loom_fusion_allreduce", t, n));
  LOOM_CHECK(plan_room(f, n, 0));
  f->nb = plan(t, n, f->threshold, f->b);
  int np = 0;
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    f->sig[i] = signature(t[i]);
  }
  for (int k = 0; k < f->nb; k++) {
    size_t off = 0;
    for (int i = f->b[k].first; i < f->b[k].last; i++) {
      f->offset[i] = off;
      off += f->sig[i].bytes;
    }
    np += f->b[k].direct ? 1 : (int)((f->b[k].bytes + LOOM_FUSION_PIECE - 1) / LOOM_FUSION_PIECE);
    total += f->b[k].bytes;
  }
  LOOM_CHECK(plan_room(f, n, np));
  f->np = 0;
  for (int k = 0; k < f->nb; k++) {
    add_pieces(f, k);
  }
  f->nplan = n;
  log_plan(f, t, n, f->b, f->nb);
  LOOM_TRACE(LOOM_SUB_COLL, "fusion: %zu bytes in %d pieces", total, f->np);
fail:
  return status;
}

// ---- allreduce ----------------------------------------------------------------------------------

// Staging slot k with at least bytes on device.
static loom_status_t bucket_buffer(loom_fusion_t *f, int k, size_t bytes, int device, void **out) {
  struct bucket_buf *b = &f->bufs[k];
  if (b->bytes < bytes || b->device != device) {
    free_buf(b);
    b->device = device;
    if (device == LOOM_DEVICE_HOST) {
      b->data = loom_host_alloc(bytes);
      if (!b->data) {
        return loom_error(f->ctx, LOOM_ERR_NOMEM,
                          "loom_fusion_allreduce: cannot allocate a bucket of %zu bytes", bytes);
      }
    } else {
      loom_status_t status = loom_device_alloc(device, bytes, &b->data);
      if (status != LOOM_OK) {
        return status;
      }
    }
    b->bytes = bytes;
  }
  *out = b->data;
  return LOOM_OK;
}

// Copy the piece's part of each tensor into buf (pack) or back out of it.
static loom_status_t copy_piece(const loom_fusion_t *f, loom_tensor_t *const *t,
                                const struct piece *p, char *buf, int pack) {
  loom_status_t status = LOOM_OK;
  const struct bucket *b = &f->b[p->bucket];
  for (int i = p->first; i < b->last && f->offset[i] < p->hi && status == LOOM_OK; i++) {
    size_t at = f->offset[i], end = at + f->sig[i].bytes;
    size_t lo = at > p->lo ? at : p->lo, hi = end < p->hi ? end : p->hi;
    if (hi <= lo) {
      continue;
    }
    char *data = (char *)t[i]->data + (lo - at), *staged = buf + (lo - p->lo);
    int dev = t[i]->device;
    if (dev == LOOM_DEVICE_HOST) {
      memcpy(pack ? staged : data, pack ? data : staged, hi - lo);
    } else if (pack) {
      status = loom_memcpy_any(staged, dev, data, dev, hi - lo);
    } else {
      status = loom_memcpy_any(data, dev, staged, dev, hi - lo);
    }
  }
  return status;
}

// Start piece k: a direct bucket in place, else packed into staging slot k % LOOM_FUSION_SLOTS.
static loom_status_t start_piece(loom_fusion_t *f, loom_tensor_t *const *t, int k,
                                 loom_redop_t op) {
  loom_status_t status = LOOM_OK;
  const struct piece *p = &f->p[k];
  f->reqs[k] = NULL;
  if (f->b[p->bucket].direct) {
    return loom_iallreduce(f->g, t[p->first], t[p->first], op, &f->reqs[k]);
  }
  int slot = k % LOOM_FUSION_SLOTS, device = t[p->first]->device;
  loom_dtype_t dtype = t[p->first]->dtype;
  void *buf = NULL;
  LOOM_CHECK(bucket_buffer(f, slot, p->hi - p->lo, device, &buf));
  LOOM_CHECK(copy_piece(f, t, p, buf, 1));
  int64_t count = (int64_t)((p->hi - p->lo) / loom_dtype_size(dtype));
  loom_tensor_t *view = &f->views[slot];
  LOOM_CHECK(loom_tensor_wrap(view, buf, dtype, device, 1, &count, "fusion piece"));
  LOOM_CHECK(loom_iallreduce(f->g, view, view, op, &f->reqs[k]));
fail:
  return status;
}

// Wait for piece k and unpack it.
static loom_status_t finish_piece(loom_fusion_t *f, loom_tensor_t *const *t, int k) {
  const struct piece *p = &f->p[k];
  loom_status_t status = loom_wait(&f->reqs[k]);
  if (status == LOOM_OK && !f->b[p->bucket].direct) {
    status = copy_piece(f, t, p, f->bufs[k % LOOM_FUSION_SLOTS].data, 0);
  }
  return status;
}

loom_status_t loom_fusion_allreduce(loom_fusion_t *fusion, loom_tensor_t *const *tensors, int n,
                                    loom_redop_t op) {
  static const char name[] = "loom_fusion_allreduce";
  loom_status_t status = LOOM_OK;
  int started = 0, finished = 0;
  if (!fusion) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: fusion is NULL: create it with loom_fusion_create", name);
  }
  loom_ctx_t *ctx = fusion->ctx;
  if (n < 0 || (n > 0 && !tensors)) {
    return loom_error(ctx, LOOM_ERR_INVALID_ARG,
                      "%s: tensors is %s with n = %d: pass an array of n >= 0 tensors", name,
                      tensors ? "set" : "NULL", n);
  }
  LOOM_CHECK(loom_comm_check_group(name, fusion->g));
  if (!plan_cached(fusion, tensors, n)) {
    LOOM_CHECK(make_plan(fusion, tensors, n));
  }
  fusion->buckets = fusion->nb;
  if (n == 0) {
    return LOOM_OK;
  }
  LOOM_CHECK(loom_comm_check_redop(name, op, tensors[0]->dtype));
  LOOM_CHECK(loom_comm_check_backend(name, "tensors[0]", tensors[0]));

  // Keep up to LOOM_FUSION_SLOTS pieces in flight: start piece k once piece k - SLOTS (whose
  // staging slot it takes) has landed and been unpacked.
  for (; started < fusion->np; started++) {
    if (started - finished == LOOM_FUSION_SLOTS) {
      LOOM_CHECK(finish_piece(fusion, tensors, finished++));
    }
    LOOM_CHECK(start_piece(fusion, tensors, started, op));
  }
  while (finished < started) {
    LOOM_CHECK(finish_piece(fusion, tensors, finished++));
  }
fail:
  if (finished < started) {
    loom_wait_all(fusion->reqs + finished, started - finished); // leave nothing in flight
  }
  if (status != LOOM_OK) {
    loom_error_to_ctx(ctx);
  }
  return status;
}
