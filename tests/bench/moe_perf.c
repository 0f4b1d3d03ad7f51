/* moe_perf.c — one MoE layer, forward + backward, timed in each overlap mode side by side: the
 * compute and communication times, the hidden fraction of communication, the speedup over none. */
#include "config.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../testutil.h"
#include "loom.h"

// Usage: mpirun -np N moe_perf [--tokens 512] [--hidden 512] [--ffn 1792] [--experts 8]
//          [--topk 2] [--iters 10] [--warmup 2] [--chunks C] [--slices S] [--no-poll]
//          [--modes none,coarse,fine] [--json FILE] [--tune]
// --tune measures every (chunks, slices) of each mode with loom_moe_tune and caches the fastest;
// later runs (and train_gpt) take the cached split where --chunks / --slices are not given.
// The world is the expert-parallel group. Every iteration of every mode gets the same tokens.
// Per iteration the slowest rank's wall time counts; the table gives medians over iterations.
//   T_seq  = none's wall time (blocking all-to-alls, then compute)
//   T_comp = none's largest per-rank time outside MPI waits (routing, GEMMs, permutes: the layer
//            with its data pre-staged)
//   T_comm = T_seq - T_comp (the blocking all-to-alls beyond the slowest rank's compute)
//   hidden = 1 - (T_ovl - T_comp) / T_comm for each overlapping mode, speedup = T_seq / T_ovl.

typedef struct opts {
  int64_t tokens, hidden, ffn;
  int experts, topk, iters, warmup, chunks, slices, no_poll, tune;
  int modes[LOOM_MOE_OVERLAP_COUNT], nmodes;
  const char *json;
} opts_t;

typedef struct result {
  int mode;
  double wall, comm, compute; // medians over iterations, ms: wall, waiting in MPI, the rest
  int chunks, slices, tuned;  // the split used, and whether it came from the tuning cache
} result_t;

static int rank0;

static void usage(void) {
  printf("usage: mpirun -np N moe_perf [--tokens T] [--hidden H] [--ffn F] [--experts E]\n"
         "         [--topk K] [--iters N] [--warmup W] [--chunks C] [--slices S] [--no-poll]\n"
         "         [--modes none,coarse,fine] [--json FILE] [--tune]\n"
         "One MoE layer (forward + backward) over the world as the expert-parallel group.\n"
         "Defaults: --tokens 512 per rank, --hidden 512, --ffn 1792, --experts 8, --topk 2\n"
         "(Mixtral's E=8, top-2 and FFN/hidden ratio 3.5, scaled down), --iters 10, --warmup 2,\n"
         "chunks and slices as the layer picks them (0), every mode. --no-poll: no MPI test\n"
         "between tiles (what polling buys). --tune: time every chunks x slices in\n"
         "{1,2,4,8}^2 per mode and cache the fastest for this shape (used when --chunks and\n"
         "--slices are not given).\n");
}

static int parse_modes(const char *s, opts_t *o) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", s);
  o->nmodes = 0;
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int m = 0;
    if (loom_moe_overlap_parse(tok, &m) != LOOM_OK || o->nmodes == LOOM_MOE_OVERLAP_COUNT) {
      return -1;
    }
    o->modes[o->nmodes++] = m;
  }
  return o->nmodes > 0 ? 0 : -1;
}

static int parse(int argc, char **argv, opts_t *o) {
  *o = (opts_t){.tokens = 512,
                .hidden = 512,
                .ffn = 1792,
                .experts = 8,
                .topk = 2,
                .iters = 10,
                .warmup = 2,
                .nmodes = 3,
                .modes = {0, 1, 2}};
  static const struct option longopts[] = {{"tokens", required_argument, NULL, 't'},
                                           {"hidden", required_argument, NULL, 'H'},
                                           {"ffn", required_argument, NULL, 'F'},
                                           {"experts", required_argument, NULL, 'E'},
                                           {"topk", required_argument, NULL, 'K'},
                                           {"iters", required_argument, NULL, 'n'},
                                           {"warmup", required_argument, NULL, 'w'},
                                           {"chunks", required_argument, NULL, 'c'},
                                           {"slices", required_argument, NULL, 's'},
                                           {"no-poll", no_argument, NULL, 'P'},
                                           {"modes", required_argument, NULL, 'm'},
                                           {"json", required_argument, NULL, 'J'},
                                           {"tune", no_argument, NULL, 'T'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 't':
      if (test_int64_arg("moe_perf", "--tokens", optarg, &o->tokens) != 0) {
        return 2;
      }
      break;
    case 'H':
      if (test_int64_arg("moe_perf", "--hidden", optarg, &o->hidden) != 0) {
        return 2;
      }
      break;
    case 'F':
      if (test_int64_arg("moe_perf", "--ffn", optarg, &o->ffn) != 0) {
        return 2;
      }
      break;
    case 'E':
      if (test_int_arg("moe_perf", "--experts", optarg, &o->experts) != 0) {
        return 2;
      }
      break;
    case 'K':
      if (test_int_arg("moe_perf", "--topk", optarg, &o->topk) != 0) {
        return 2;
      }
      break;
    case 'n':
      if (test_int_arg("moe_perf", "--iters", optarg, &o->iters) != 0) {
        return 2;
      }
      break;
    case 'w':
      if (test_int_arg("moe_perf", "--warmup", optarg, &o->warmup) != 0) {
        return 2;
      }
      break;
    case 'c':
      if (test_int_arg("moe_perf", "--chunks", optarg, &o->chunks) != 0) {
        return 2;
      }
      break;
    case 's':
      if (test_int_arg("moe_perf", "--slices", optarg, &o->slices) != 0) {
        return 2;
      }
      break;
    case 'P':
      o->no_poll = 1;
      break;
    case 'm':
      if (parse_modes(optarg, o) != 0) {
        fprintf(stderr, "moe_perf: --modes wants a comma list of none, coarse, fine\n");
        return 2;
      }
      break;
    case 'J':
      o->json = optarg;
      break;
    case 'T':
      o->tune = 1;
      break;
    case 'h':
      usage();
      return 1;
    default:
      usage();
      return 2;
    }
  }
  if (test_output_writable("moe_perf", "--json", o->json) != 0) { // now, not after the runs
    return 2;
  }
  if (o->tokens < 0 || o->hidden < 1 || o->ffn < 1 || o->iters < 1 || o->warmup < 0) {
    fprintf(stderr, "moe_perf: --tokens >= 0, --hidden, --ffn, --iters >= 1, --warmup >= 0\n");
    return 2;
  }
  return 0;
}

// v with the given decimals, or null where it is not finite (JSON has no nan or inf: without
// `none` among the modes there is no T_seq, and at np 1 T_comm can be 0).
static const char *json_num(char *buf, size_t cap, double v, int decimals) {
  if (!isfinite(v)) {
    return "null";
  }
  snprintf(buf, cap, "%.*f", decimals, v);
  return buf;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Time one mode: the slowest rank's wall, comm and compute per iteration, medians. A loom call
// that fails on this rank ends the job (test_job_check): the other ranks may be waiting for it.
static void time_mode(loom_ctx_t *ctx, const opts_t *o, int mode, const loom_tensor_t *x,
                      const loom_tensor_t *dy, loom_tensor_t *y, loom_tensor_t *dx, result_t *r) {
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = o->experts;
  cfg.top_k = o->topk;
  cfg.hidden = o->hidden;
  cfg.ffn = o->ffn;
  cfg.overlap = mode;
  cfg.chunks = o->chunks;
  cfg.col_slices = o->slices;
  cfg.poll_tiles = o->no_poll ? -1 : 0;
  if (o->tune) {
    loom_moe_tuning_t best;
    test_job_check(loom_moe_tune(ctx, loom_group(ctx, LOOM_GROUP_WORLD), &cfg, o->tokens, o->iters,
                                 rank0 ? stdout : NULL, &best),
                   "moe_perf", "loom_moe_tune");
  }
  r->tuned =
      loom_moe_tuned(ctx, loom_group(ctx, LOOM_GROUP_WORLD), &cfg, loom_size(ctx), o->tokens);
  r->chunks = cfg.chunks > 0 ? cfg.chunks : 4;
  r->slices = cfg.col_slices > 0 ? cfg.col_slices : 4;
  loom_moe_t *m = NULL;
  test_job_check(loom_moe_create(ctx, loom_group(ctx, LOOM_GROUP_WORLD), &cfg, &m), "moe_perf",
                 "loom_moe_create");
  double *wall = calloc((size_t)o->iters, sizeof(double));
  double *comm = calloc((size_t)o->iters, sizeof(double));
  double *comp = calloc((size_t)o->iters, sizeof(double));
  for (int it = -o->warmup; it < o->iters; it++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    loom_moe_stats_t sf, sb;
    test_job_check(loom_moe_forward(m, x, y, NULL), "moe_perf", "loom_moe_forward");
    loom_moe_stats(m, &sf);
    test_job_check(loom_moe_backward(m, dy, dx), "moe_perf", "loom_moe_backward");
    loom_moe_stats(m, &sb);
    // The slowest rank's wall time; compute = wall minus the time in MPI waits, per rank, the
    // largest over ranks (waiting for a slower peer counts as communication in `none`).
    const double w = 1e3 * (MPI_Wtime() - t0), c = sf.comm_ms + sb.comm_ms;
    double v[2] = {w, w - c};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it >= 0) {
      wall[it] = v[0];
      comp[it] = v[1];
      comm[it] = v[0] - v[1];
    }
  }
  r->mode = mode;
  r->wall = median(wall, o->iters);
  r->comm = median(comm, o->iters);
  r->compute = median(comp, o->iters);
  free(wall);
  free(comm);
  free(comp);
  loom_moe_destroy(m);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  opts_t o;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "moe_perf: loom_init: %s\n", loom_last_error(NULL));
    return 1;
  }
  rank0 = loom_rank(ctx) == 0;
  int rc = parse(argc, argv, &o);
  // Every rank or none goes on: a rank that refused its arguments alone (another command line on
  // an MPMD line) would leave the others waiting for it in the first all-to-all.
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rc == 0) { // and every rank took the same arguments (2 after naming the first that differs)
    rc = test_bench_agree_args("moe_perf", argc, argv);
  }
  if (rc != 0) {
    loom_finalize(ctx);
    return rc == 1 ? 0 : 2;
  }
  const int np = loom_size(ctx);
  int64_t shape[2] = {o.tokens, o.hidden};
  loom_tensor_t x = test_tensor_f32(2, shape, "x"), y = test_tensor_f32(2, shape, "y");
  loom_tensor_t dy = test_tensor_f32(2, shape, "dy"), dx = test_tensor_f32(2, shape, "dx");
  test_rng_t rng = test_rng(99u + (uint64_t)loom_rank(ctx));
  test_fill_uniform(&rng, test_floats(&x), o.tokens * o.hidden, -1.0, 1.0);
  test_fill_uniform(&rng, test_floats(&dy), o.tokens * o.hidden, -1e-3, 1e-3);
  result_t res[LOOM_MOE_OVERLAP_COUNT];
  memset(res, 0, sizeof res);
  for (int i = 0; i < o.nmodes; i++) {
    time_mode(ctx, &o, o.modes[i], &x, &dy, &y, &dx, &res[i]);
  }
  const result_t *none = NULL;
  for (int i = 0; i < o.nmodes; i++) {
    none = res[i].mode == LOOM_MOE_OVERLAP_NONE ? &res[i] : none;
  }
  const double t_seq = none ? none->wall : NAN, t_comp = none ? none->compute : NAN;
  const double t_comm = t_seq - t_comp;
  const double flops = 3.0 * 4.0 * (double)o.tokens * o.topk * (double)o.hidden * (double)o.ffn;
  if (rank0) {
    printf("# moe_perf: np %d, tokens %lld per rank, hidden %lld, ffn %lld, experts %d, top-%d, "
           "%d iterations (median, slowest rank)%s\n",
           np, (long long)o.tokens, (long long)o.hidden, (long long)o.ffn, o.experts, o.topk,
           o.iters, o.no_poll ? ", no MPI test between tiles" : "");
    printf("# expert GEMM work per rank and iteration: %.2f GFLOP\n", flops / 1e9);
    printf("%-8s %10s %10s %10s %8s %8s  %s\n", "mode", "wall_ms", "wait_ms", "busy_ms", "hidden",
           "speedup", "chunks x slices");
    for (int i = 0; i < o.nmodes; i++) {
      const result_t *r = &res[i];
      double hidden = 1.0 - (r->wall - t_comp) / t_comm, speed = t_seq / r->wall;
      printf("%-8s %10.2f %10.2f %10.2f %8.3f %8.3f  %d x %d%s\n", loom_moe_overlap_name(r->mode),
             r->wall, r->comm, r->compute, r->mode == LOOM_MOE_OVERLAP_NONE ? 0.0 : hidden, speed,
             r->chunks, r->slices,
             r->tuned                 ? " (tuned)"
             : (o.chunks || o.slices) ? ""
                                      : " (default)");
    }
    printf("T_comp %.2f ms  T_comm %.2f ms  T_seq %.2f ms\n", t_comp, t_comm, t_seq);
    if (o.json) {
      FILE *f = test_output_open("moe_perf", "--json", o.json, "w");
      if (!f) {
        rc = 1;
      } else {
        char n1[32], n2[32], n3[32];
        fprintf(f,
                "{\"np\": %d, \"tokens\": %lld, \"hidden\": %lld, \"ffn\": %lld, \"experts\": %d, "
                "\"topk\": %d, \"iters\": %d, \"poll\": %s, \"t_comp_ms\": %s, "
                "\"t_comm_ms\": %s, \"t_seq_ms\": %s, \"modes\": [",
                np, (long long)o.tokens, (long long)o.hidden, (long long)o.ffn, o.experts, o.topk,
                o.iters, o.no_poll ? "false" : "true", json_num(n1, sizeof n1, t_comp, 3),
                json_num(n2, sizeof n2, t_comm, 3), json_num(n3, sizeof n3, t_seq, 3));
        for (int i = 0; i < o.nmodes; i++) {
          const result_t *r = &res[i];
          fprintf(f,
                  "%s{\"mode\": \"%s\", \"wall_ms\": %.3f, \"wait_ms\": %.3f, \"busy_ms\": %.3f, "
                  "\"hidden\": %s, \"speedup\": %s, \"chunks\": %d, \"slices\": %d}",
                  i ? ", " : "", loom_moe_overlap_name(r->mode), r->wall, r->comm, r->compute,
                  json_num(n1, sizeof n1, 1.0 - (r->wall - t_comp) / t_comm, 4),
                  json_num(n2, sizeof n2, t_seq / r->wall, 4), r->chunks, r->slices);
        }
        fprintf(f, "]}\n");
        if (test_output_close("moe_perf", "--json", o.json, f) != 0) {
          rc = 1;
        }
      }
    }
  }
  TEST_FREE(&x, &y, &dy, &dx);
  loom_finalize(ctx);
  return rc;
}
