/* moe_tune.c — MoE tile sizes from measurement: time a layer of the real shape over a grid of
 * (row chunks, column slices), cache the fastest per host and build, and look it up later. */
#include "config.h"
#include "loom_plan.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "error.h"
#include "sched_internal.h"

static const int grid[] = {1, 2, 4, 8};
#define MOE_TUNE_MAX 8 // the largest tile count of the grid: a cache line beyond it is ignored
#define NGRID        ((int)(sizeof grid / sizeof grid[0]))

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int resolve_overlap(const loom_ctx_t *ctx, int overlap) {
  return overlap == LOOM_MOE_OVERLAP_DEFAULT
             ? (ctx ? ctx->params.moe_overlap : LOOM_MOE_OVERLAP_FINE)
             : overlap;
}

// Median over iters of the slowest rank's forward + backward, in ms.
static loom_status_t time_split(loom_ctx_t *ctx, const loom_group_t *ep, loom_moe_config_t *cfg,
                                const loom_tensor_t *x, const loom_tensor_t *dy, loom_tensor_t *y,
                                loom_tensor_t *dx, int iters, double *ms) {
  loom_moe_t *m = NULL;
  loom_status_t status = loom_moe_create(ctx, ep, cfg, &m);
  double *t = calloc((size_t)iters, sizeof(double));
  MPI_Comm comm = ep ? loom_group_comm(ep) : MPI_COMM_SELF;
  if (status == LOOM_OK && !t) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "loom_moe_tune: out of memory");
  }
  for (int it = -1; it < iters && status == LOOM_OK; it++) {
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    status = loom_moe_forward(m, x, y, NULL);
    if (status == LOOM_OK) {
      status = loom_moe_backward(m, dy, dx);
    }
    double w = 1e3 * (MPI_Wtime() - t0);
    MPI_Allreduce(MPI_IN_PLACE, &w, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (it >= 0) {
      t[it] = w;
    }
  }
  if (status == LOOM_OK) {
    qsort(t, (size_t)iters, sizeof *t, by_value);
    *ms = t[iters / 2];
  }
  free(t);
  loom_moe_destroy(m);
  return status;
}

loom_status_t loom_moe_tune(loom_ctx_t *ctx, const loom_group_t *ep, const loom_moe_config_t *cfg,
                            int64_t tokens, int iters, FILE *out, loom_moe_tuning_t *best) {
  loom_status_t status = LOOM_OK;
  if (!cfg || !best) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_moe_tune: %s is NULL: pass it",
                      !cfg ? "cfg" : "best");
  }
  if (tokens < 0 || iters < 1 || cfg->hidden < 1 || tokens > ((int64_t)1 << 40) / cfg->hidden) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_moe_tune: tokens = %lld, iters = %d, cfg->hidden = %lld: pass "
                      "tokens >= 0, iters >= 1 and hidden >= 1 with tokens x hidden <= 2^40",
                      (long long)tokens, iters, (long long)cfg->hidden);
  }
  const int np = ep ? loom_group_size(ep) : 1, me = ep ? loom_group_rank(ep) : 0;
  loom_moe_config_t c = *cfg;
  c.overlap = resolve_overlap(ctx, c.overlap);
  c.device = LOOM_DEVICE_HOST; // chunks and slices are host settings (a device layer has one)
  const int64_t shape[2] = {tokens, c.hidden};
  loom_tensor_t x, y, dy, dx;
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  memset(&dy, 0, sizeof dy);
  memset(&dx, 0, sizeof dx);
  status = loom_tensor_alloc(&x, LOOM_F32, LOOM_DEVICE_HOST, 2, shape, "x");
  if (status == LOOM_OK) {
    status = loom_tensor_alloc(&y, LOOM_F32, LOOM_DEVICE_HOST, 2, shape, "y");
  }
  if (status == LOOM_OK) {
    status = loom_tensor_alloc(&dy, LOOM_F32, LOOM_DEVICE_HOST, 2, shape, "dy");
  }
  if (status == LOOM_OK) {
    status = loom_tensor_alloc(&dx, LOOM_F32, LOOM_DEVICE_HOST, 2, shape, "dx");
  }
  // Every rank times the same layers together: one that could not allocate stops them all
  // (alone it would leave the others waiting in loom_moe_create until LOOM_TIMEOUT).
  int failed = status != LOOM_OK;
  if (np > 1) {
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, loom_group_comm(ep));
  }
  if (failed) {
    if (status == LOOM_OK) {
      status = loom_error(NULL, LOOM_ERR_NOMEM,
                          "loom_moe_tune: another rank could not allocate its %lld x %lld "
                          "buffers: see its message (fewer tokens need less)",
                          (long long)tokens, (long long)c.hidden);
    }
    goto fail;
  }
  float *xp = x.data, *dyp = dy.data;
  uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(me + 1);
  for (int64_t i = 0; i < tokens * c.hidden; i++) { // tokens that route like real ones
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    xp[i] = (float)((double)(r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    dyp[i] = 1e-3f * xp[i];
  }
  *best = (loom_moe_tuning_t){0, 0, INFINITY};
  if (out && me == 0) {
    fprintf(out, "# loom_moe_tune: %s, np %d, tokens %lld, E %d, top-%d, hidden %lld, ffn %lld\n",
            loom_moe_overlap_name(c.overlap), np, (long long)tokens, c.num_experts, c.top_k,
            (long long)c.hidden, (long long)c.ffn);
    fprintf(out, "# chunks  slices  fwd+bwd ms\n");
  }
  for (int a = 0; a < NGRID && status == LOOM_OK; a++) {
    for (int b = 0; b < NGRID && status == LOOM_OK; b++) {
      double ms = 0.0;
      c.chunks = grid[a];
      c.col_slices = grid[b];
      status = time_split(ctx, ep, &c, &x, &dy, &y, &dx, iters, &ms);
      if (status == LOOM_OK && out && me == 0) {
        fprintf(out, "  %6d  %6d  %10.2f\n", grid[a], grid[b], ms);
      }
      if (status == LOOM_OK && ms < best->ms) {
        *best = (loom_moe_tuning_t){grid[a], grid[b], ms};
      }
    }
  }
  if (status == LOOM_OK && me == 0) {
    char line[256];
    snprintf(line, sizeof line, "%d %d %lld %lld %d %d %lld %d %d %.3f\n", c.num_experts, c.top_k,
             (long long)c.hidden, (long long)c.ffn, np, c.overlap, (long long)tokens, best->chunks,
             best->slices, best->ms);
    loom_cache_append("moe-tune", line);
    if (out) {
      fprintf(out, "# best: chunks %d, slices %d (%.2f ms); cached\n", best->chunks, best->slices,
              best->ms);
    }
  }
fail:
  loom_tensor_free(&x);
  loom_tensor_free(&y);
  loom_tensor_free(&dy);
  loom_tensor_free(&dx);
  return status;
}

// This rank's cache entry for cfg's shape nearest in tokens (see loom_moe_tuned).
static int cache_lookup(const loom_ctx_t *ctx, loom_moe_config_t *cfg, int np, int64_t tokens) {
  char line[256];
  if (!cfg || (cfg->chunks > 0 && cfg->col_slices > 0)) {
    return 0;
  }
  FILE *f = loom_cache_open("moe-tune"); // (not a regular file of at most 1 MiB: absent)
  if (!f) {
    return 0;
  }
  const int overlap = resolve_overlap(ctx, cfg->overlap);
  double best_dist = INFINITY;
  long long chunks = 0, slices = 0;                    // (1 .. MOE_TUNE_MAX once found)
  while (loom_cache_line(f, line, (int)sizeof line)) { // (whole lines: not a long one's tail)
    long long e, k, n, ov, ch, sl, h, ff, t; // (%d wraps a number past an int: 2^32 + 1 read 1)
    double ms;
    if (sscanf(line, "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lf", &e, &k, &h, &ff, &n, &ov,
               &t, &ch, &sl, &ms) != 10 ||
        e != cfg->num_experts || k != cfg->top_k || h != cfg->hidden || ff != cfg->ffn || n != np ||
        ov != overlap || t < 0 || ch < 1 || ch > MOE_TUNE_MAX || sl < 1 || sl > MOE_TUNE_MAX) {
      // (tiles beyond the tuner's grid: a hand-edited or damaged line, up to 65x slower steps)
      continue;
    }
    double dist = fabs(log((double)t + 1.0) - log((double)tokens + 1.0));
    if (dist <= best_dist) { // ties: the later line (the newer measurement)
      best_dist = dist;
      chunks = ch;
      slices = sl;
    }
  }
  fclose(f);
  if (chunks == 0) {
    return 0;
  }
  cfg->chunks = cfg->chunks > 0 ? cfg->chunks : (int)chunks;
  cfg->col_slices = cfg->col_slices > 0 ? cfg->col_slices : (int)slices;
  return 1;
}

int loom_moe_tuned(const loom_ctx_t *ctx, const loom_group_t *agree, loom_moe_config_t *cfg, int np,
                   int64_t tokens) {
  if (!cfg) {
    return 0;
  }
  // Rank 0 of agree reads its cache and everyone takes its answer: caches are per host, and the
  // layer refuses a config that differs between the ranks of its group.
  int split[3] = {0, cfg->chunks, cfg->col_slices};
  if (!agree || loom_group_rank(agree) == 0) {
    split[0] = cache_lookup(ctx, cfg, np, tokens);
    split[1] = cfg->chunks;
    split[2] = cfg->col_slices;
  }
  if (agree && loom_group_size(agree) > 1) {
    MPI_Bcast(split, 3, MPI_INT, 0, loom_group_comm(agree));
  }
  cfg->chunks = split[1];
  cfg->col_slices = split[2];
  return split[0];
}
