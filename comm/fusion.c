/* fusion.c — allreduce many small tensors as few large ones: plan buckets of at most the fusion
 * threshold in the given order, pack, start every bucket at once, unpack each as it lands. */
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

// A reusable bucket buffer (host or one CUDA device).
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

#define LOGGED_PLANS 16

struct loom_fusion {
  loom_ctx_t *ctx;
  const loom_group_t *g;
  size_t threshold;        // bytes per bucket; 0: every tensor travels alone
  int buckets;             // buckets of the last call
  struct bucket_buf *bufs; // (nbufs)
  int nbufs;
  uint64_t logged[LOGGED_PLANS]; // plans already logged (hashes), round robin
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
  for (int i = 0; i < fusion->nbufs; i++) {
    free_buf(&fusion->bufs[i]);
  }
  free(fusion->bufs);
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

// Every tensor present, of tensors[0]'s dtype and device, and no two sharing memory.
static loom_status_t check_tensors(const char *op, loom_tensor_t *const *t, int n) {
  loom_status_t status = LOOM_OK;
  struct span *spans = NULL;
  char name[32], s1[LOOM_SHAPE_STR_MAX], s2[LOOM_SHAPE_STR_MAX];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "tensors[%d]", i);
    if (!t[i]) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s is NULL", op, name);
    }
    if (i == 0 && loom_dtype_size(t[0]->dtype) == 0) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: %s has dtype %d, expected one of f32, f16, bf16, i8, u8, i32, i64", op,
                        name, (int)t[0]->dtype);
    }
    if (t[i]->dtype != t[0]->dtype) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: %s is %s but tensors[0] is %s: expected dtype %s for every tensor of "
                        "one call",
                        op, name, loom_shape_str(t[i], s1), loom_shape_str(t[0], s2),
                        loom_dtype_name(t[0]->dtype));
    }
    status = loom_arg_tensor(op, name, t[i], t[0]->dtype, t[0]->device);
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

// ---- allreduce ----------------------------------------------------------------------------------

// Bucket buffer k with at least bytes on device.
static loom_status_t bucket_buffer(loom_fusion_t *f, int k, size_t bytes, int device, void **out) {
  if (k >= f->nbufs) {
    struct bucket_buf *bufs = realloc(f->bufs, sizeof *bufs * (size_t)(k + 1));
    if (!bufs) {
      return loom_error(f->ctx, LOOM_ERR_NOMEM, "loom_fusion_allreduce: cannot grow the buckets");
    }
    for (int i = f->nbufs; i <= k; i++) {
      bufs[i] = (struct bucket_buf){NULL, 0, LOOM_DEVICE_HOST};
    }
    f->bufs = bufs;
    f->nbufs = k + 1;
  }
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

// Copy the bucket's tensors into buf (pack) or back out of it.
static loom_status_t copy_bucket(loom_tensor_t *const *t, const struct bucket *b, char *buf,
                                 int pack) {
  loom_status_t status = LOOM_OK;
  size_t off = 0;
  for (int i = b->first; i < b->last && status == LOOM_OK; i++) {
    size_t bytes = loom_tensor_bytes(t[i]);
    if (bytes == 0) {
      continue;
    }
    int dev = t[i]->device;
    if (dev == LOOM_DEVICE_HOST) {
      memcpy(pack ? buf + off : t[i]->data, pack ? t[i]->data : buf + off, bytes);
    } else if (pack) {
      status = loom_memcpy_any(buf + off, dev, t[i]->data, dev, bytes);
    } else {
      status = loom_memcpy_any(t[i]->data, dev, buf + off, dev, bytes);
    }
    off += bytes;
  }
  return status;
}

loom_status_t loom_fusion_allreduce(loom_fusion_t *fusion, loom_tensor_t *const *tensors, int n,
                                    loom_redop_t op) {
  static const char name[] = "loom_fusion_allreduce";
  loom_status_t status = LOOM_OK;
  struct bucket *b = NULL;
  loom_request_t **reqs = NULL;
  loom_tensor_t *views = NULL;
  int started = 0;
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
  LOOM_CHECK(check_tensors(name, tensors, n));
  if (n == 0) {
    fusion->buckets = 0;
    return LOOM_OK;
  }
  LOOM_CHECK(loom_comm_check_redop(name, op, tensors[0]->dtype));
  LOOM_CHECK(loom_comm_check_backend(name, "tensors[0]", tensors[0]));

  b = malloc(sizeof *b * (size_t)n);
  reqs = calloc((size_t)n, sizeof *reqs);
  views = calloc((size_t)n, sizeof *views);
  if (!b || !reqs || !views) {
    status = loom_error(ctx, LOOM_ERR_NOMEM, "%s: cannot allocate the plan of %d tensors", name, n);
    goto fail;
  }
  int nb = plan(tensors, n, fusion->threshold, b);
  fusion->buckets = nb;
  log_plan(fusion, tensors, n, b, nb);

  // Pack and start every bucket, then wait for them in order and unpack.
  loom_dtype_t dtype = tensors[0]->dtype;
  int device = tensors[0]->device;
  size_t es = loom_dtype_size(dtype);
  for (int k = 0; k < nb; k++, started++) {
    loom_tensor_t *target = NULL;
    if (b[k].direct) {
      for (int i = b[k].first; i < b[k].last && !target; i++) {
        target = loom_tensor_bytes(tensors[i]) ? tensors[i] : NULL;
      }
    } else {
      void *buf = NULL;
      LOOM_CHECK(bucket_buffer(fusion, k, b[k].bytes, device, &buf));
      LOOM_CHECK(copy_bucket(tensors, &b[k], buf, 1));
      int64_t count = (int64_t)(b[k].bytes / es);
      LOOM_CHECK(loom_tensor_wrap(&views[k], buf, dtype, device, 1, &count, "fusion bucket"));
      target = &views[k];
    }
    LOOM_CHECK(loom_iallreduce(fusion->g, target, target, op, &reqs[k]));
  }
  for (int k = 0; k < nb; k++) {
    LOOM_CHECK(loom_wait(&reqs[k]));
    if (!b[k].direct) {
      LOOM_CHECK(copy_bucket(tensors, &b[k], fusion->bufs[k].data, 0));
    }
  }
fail:
  if (reqs) {
    loom_wait_all(reqs, started); // leave nothing in flight on failure
  }
  free(views);
  free(reqs);
  free(b);
  if (status != LOOM_OK) {
    loom_error_to_ctx(ctx);
  }
  return status;
}
