/* attn_perf.c — core attention of skewed packed documents without and with attention servers:
 * per-rank work and time as max/mean, bytes moved, the attention phase, and ping-pong overlap. */
#include "config.h"

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../testutil.h"
#include "loom.h"

// Usage: mpirun -np N attn_perf [--workload lognormal|onelong] [--docs 16] [--mean-len 384]
//          [--long 6144] [--heads 4] [--head-dim 32] [--iters 5] [--tolerance 0.1]
//          [--servers K] [--row-cost 0|auto|C] [--json FILE]
// Workloads (the same documents for every mode, seeded): lognormal: --docs documents per rank,
// lengths lognormal with the given mean (sigma 1.2, clipped to 16..8 mean); onelong: rank 0
// holds one --long document, every rank --docs documents of --mean-len / 4.
// Modes: off (every document on its owner, no transfer), inplace (the balancer moves work among
// all ranks), and with --servers K > 0 dedicated (the last K ranks own no documents and serve
// every task; the documents are those of the other ranks). Per mode, the medians over --iters
// of: per-rank work (causal pairs) and kernel time as max/mean over the ranks that compute, the
// bytes moved, the attention phase (forward + backward, slowest rank). Ping-pong: the documents
// split into two nano-batches whose forwards run ship A, ship B, compute A, compute B, finish
// A, finish B (by hand, and as the six tasks of loom_sched_add_attn_pingpong in a step
// scheduler, whose timeline LOOM_TIMELINE writes), against A then B one after the other;
// hidden = 1 - wait(ping-pong)/wait(serial) (scheduled: its exposed communication).
// --row-cost: the balancer's cost of a query row besides its pairs (0: pairs only, the default;
// auto: rank 0 measures it with loom_attn_measure_row_cost); work is then that cost.

#define MAX_DOCS 4096 // documents of the whole workload (the arrays below)

typedef struct opts {
  int lognormal, docs, heads, head_dim, iters, servers;
  int64_t mean_len, long_len;
  double tolerance;
  double row_cost; // < 0: measure (auto)
  const char *json;
} opts_t;

typedef struct result {
  const char *mode;
  double work_ratio, time_ratio, bytes, phase_ms, kernel_ms;
} result_t;

static int np, me;

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The workload over `owners` ranks (0..owners-1), the same on every rank.
static int make_docs(const opts_t *o, int owners, loom_attn_doc_t *d, int cap) {
  test_rng_t rng = test_rng(2026u);
  int n = 0;
  if (!o->lognormal && n < cap) {
    d[n++] = (loom_attn_doc_t){0, o->long_len};
  }
  for (int r = 0; r < owners; r++) {
    for (int i = 0; i < o->docs && n < cap; i++) {
      int64_t len = o->mean_len / 4;
      if (o->lognormal) { // lognormal, sigma 1.2, mean mean_len
        double u1 = test_uniform(&rng, 1e-12, 1.0), u2 = test_uniform(&rng, 0.0, 1.0);
        double z = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        double x = exp(log((double)o->mean_len) - 0.72 + 1.2 * z);
        len = (int64_t)fmin(fmax(x, 16.0), 8.0 * (double)o->mean_len);
      }
      d[n++] = (loom_attn_doc_t){r, len};
    }
  }
  return n;
}

typedef struct rows {
  int64_t t;
  loom_tensor_t q, k, v, o, l, dout, dq, dk, dv;
} rows_t;

static void rows_alloc(rows_t *r, const opts_t *o, const loom_attn_doc_t *d, int nd) {
  memset(r, 0, sizeof *r);
  for (int i = 0; i < nd; i++) {
    r->t += d[i].owner == me ? d[i].len : 0;
  }
  int64_t sq[3] = {r->t, o->heads, o->head_dim}, sl[2] = {o->heads, r->t};
  r->q = test_tensor_f32(3, sq, "q");
  r->k = test_tensor_f32(3, sq, "k");
  r->v = test_tensor_f32(3, sq, "v");
  r->o = test_tensor_f32(3, sq, "o");
  r->l = test_tensor_f32(2, sl, "l");
  r->dout = test_tensor_f32(3, sq, "dout");
  r->dq = test_tensor_f32(3, sq, "dq");
  r->dk = test_tensor_f32(3, sq, "dk");
  r->dv = test_tensor_f32(3, sq, "dv");
  test_rng_t rng = test_rng(31u + (uint64_t)me);
  const int64_t n = r->t * o->heads * o->head_dim;
  test_fill_uniform(&rng, test_floats(&r->q), n, -1, 1);
  test_fill_uniform(&rng, test_floats(&r->k), n, -1, 1);
  test_fill_uniform(&rng, test_floats(&r->v), n, -1, 1);
  test_fill_uniform(&rng, test_floats(&r->dout), n, -1, 1);
}

static void rows_free(rows_t *r) {
  TEST_FREE(&r->q, &r->k, &r->v, &r->o, &r->l, &r->dout, &r->dq, &r->dk, &r->dv);
}

// Plan for a mode: 0 off, 1 inplace, 2 dedicated (servers_first = np - servers). Here and below,
// a loom call that fails on this rank ends the job (test_job_check): the others may be waiting.
static void plan_for(const opts_t *o, int mode, const loom_attn_doc_t *d, int nd,
                     loom_attn_plan_t *p) {
  loom_attn_balance_opts_t bo;
  loom_attn_balance_opts_init(&bo);
  bo.tolerance = mode == 0 ? 1e9 : o->tolerance;
  bo.bytes_per_q_row = 4.0 * (4.0 * o->heads * o->head_dim + o->heads);
  bo.bytes_per_kv_row = 4.0 * 4.0 * o->heads * o->head_dim;
  bo.servers_first = mode == 2 ? np - o->servers : 0;
  bo.row_cost = o->row_cost;
  test_job_check(loom_attn_balance(d, nd, np, &bo, p), "attn_perf", "loom_attn_balance");
}

static void run_mode(const opts_t *o, const loom_group_t *g, int mode, result_t *res) {
  static const char *const names[] = {"off", "inplace", "dedicated"};
  loom_attn_doc_t d[MAX_DOCS];
  const int owners = mode == 2 ? np - o->servers : np;
  const int nd = make_docs(o, owners, d, MAX_DOCS);
  loom_attn_plan_t p;
  memset(&p, 0, sizeof p);
  plan_for(o, mode, d, nd, &p);
  rows_t r;
  rows_alloc(&r, o, d, nd);
  loom_attn_exec_t *x = NULL;
  test_job_check(loom_attn_exec_create(g, d, nd, p.tasks, p.ntasks, o->heads, o->heads, o->head_dim,
                                       1, 0.0f, &x),
                 "attn_perf", "loom_attn_exec_create");
  double *phase = calloc((size_t)o->iters, sizeof(double));
  double *tratio = calloc((size_t)o->iters, sizeof(double));
  double *kmax = calloc((size_t)o->iters, sizeof(double));
  double bytes = 0.0;
  for (int it = -1; it < o->iters; it++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    test_job_check(loom_attn_exec_forward(x, &r.q, &r.k, &r.v, &r.o, &r.l), "attn_perf",
                   "loom_attn_exec_forward");
    test_job_check(loom_attn_exec_backward(x, &r.dout, &r.dq, &r.dk, &r.dv), "attn_perf",
                   "loom_attn_exec_backward");
    double w = 1e3 * (MPI_Wtime() - t0);
    loom_attn_exec_stats_t st;
    loom_attn_exec_stats(x, &st);
    // kernel time: max and mean over the ranks that serve anything
    double v[3] = {w, st.tasks_served > 0 ? st.compute_ms : 0.0, st.bytes_sent}, mx[3], sum[3];
    double cnt = st.tasks_served > 0, ncnt = 0;
    MPI_Allreduce(v, mx, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(v, sum, 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&cnt, &ncnt, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (it >= 0) {
      phase[it] = mx[0];
      tratio[it] = sum[1] > 0 ? mx[1] / (sum[1] / ncnt) : 1.0;
      kmax[it] = mx[1];
      bytes = sum[2];
    }
  }
  double mxl = 0.0, suml = 0.0;
  int nl = 0;
  for (int i = 0; i < np; i++) {
    if (mode == 2 && i < np - o->servers) {
      continue;
    }
    mxl = fmax(mxl, p.load[i]);
    suml += p.load[i];
    nl++;
  }
  *res = (result_t){names[mode],
                    suml > 0 ? mxl / (suml / nl) : 1.0,
                    median(tratio, o->iters),
                    bytes,
                    median(phase, o->iters),
                    median(kmax, o->iters)};
  free(phase);
  free(tratio);
  free(kmax);
  loom_attn_exec_destroy(x);
  loom_attn_plan_free(&p);
  rows_free(&r);
}

// The ping-pong of two nano-batches by hand: ship A, ship B, compute A, compute B, finish A,
// finish B.
static void pingpong_by_hand(loom_attn_exec_t *const x[2], rows_t r[2]) {
  for (int h = 0; h < 2; h++) {
    test_job_check(loom_attn_exec_ship(x[h], &r[h].q, &r[h].k, &r[h].v), "attn_perf",
                   "loom_attn_exec_ship");
  }
  for (int h = 0; h < 2; h++) {
    test_job_check(loom_attn_exec_compute(x[h]), "attn_perf", "loom_attn_exec_compute");
  }
  for (int h = 0; h < 2; h++) {
    test_job_check(loom_attn_exec_finish(x[h], &r[h].o, &r[h].l), "attn_perf",
                   "loom_attn_exec_finish");
  }
}

// Ping-pong of two nano-batches (documents alternately in A and B) under the inplace plan.
static void run_pingpong(const opts_t *o, loom_ctx_t *ctx, const loom_group_t *g, double out[6]) {
  loom_attn_doc_t d[MAX_DOCS], half[2][MAX_DOCS];
  const int nd = make_docs(o, np, d, MAX_DOCS);
  int nh[2] = {0, 0};
  for (int i = 0; i < nd; i++) {
    half[i % 2][nh[i % 2]++] = d[i];
  }
  loom_attn_plan_t p[2];
  loom_attn_exec_t *x[2] = {NULL, NULL};
  rows_t r[2];
  memset(p, 0, sizeof p);
  for (int h = 0; h < 2; h++) {
    plan_for(o, 1, half[h], nh[h], &p[h]);
    rows_alloc(&r[h], o, half[h], nh[h]);
    test_job_check(loom_attn_exec_create(g, half[h], nh[h], p[h].tasks, p[h].ntasks, o->heads,
                                         o->heads, o->head_dim, 1, 0.0f, &x[h]),
                   "attn_perf", "loom_attn_exec_create");
  }
  // The scheduler's version: the six tasks of loom_sched_add_attn_pingpong (LOOM_TIMELINE
  // writes its timeline).
  loom_attn_nano_t nano[2];
  for (int h = 0; h < 2; h++) {
    nano[h] = (loom_attn_nano_t){x[h], &r[h].q, &r[h].k, &r[h].v, &r[h].o, &r[h].l};
  }
  loom_sched_t *sc = NULL;
  int ids[6];
  test_job_check(loom_sched_create(ctx, NULL, &sc), "attn_perf", "loom_sched_create");
  test_job_check(loom_sched_add_attn_pingpong(sc, nano, -1, 0, "attn", ids), "attn_perf",
                 "loom_sched_add_attn_pingpong");
  double *t[6];
  for (int i = 0; i < 6; i++) {
    t[i] = calloc((size_t)o->iters, sizeof(double));
  }
  for (int it = -1; it < o->iters; it++) {
    for (int pp = 0; pp < 3; pp++) { // 0: A then B; 1: ping-pong by hand; 2: scheduled
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      if (pp == 0) {
        for (int h = 0; h < 2; h++) {
          test_job_check(loom_attn_exec_forward(x[h], &r[h].q, &r[h].k, &r[h].v, &r[h].o, &r[h].l),
                         "attn_perf", "loom_attn_exec_forward");
        }
      } else if (pp == 2) {
        test_job_check(loom_sched_run(sc), "attn_perf", "loom_sched_run");
      } else {
        pingpong_by_hand(x, r);
      }
      loom_attn_exec_stats_t s0, s1;
      loom_attn_exec_stats(x[0], &s0);
      loom_attn_exec_stats(x[1], &s1);
      double v[2] = {1e3 * (MPI_Wtime() - t0), s0.wait_ms + s1.wait_ms};
      if (pp == 2) { // the scheduler waits for the requests: its exposed communication
        loom_step_stats_t ss;
        loom_sched_step_stats(sc, &ss);
        v[1] += ss.exposed_comm_ms;
      }
      MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= 0) {
        t[2 * pp][it] = v[0];
        t[2 * pp + 1][it] = v[1];
      }
    }
  }
  for (int i = 0; i < 6; i++) {
    out[i] = median(t[i], o->iters);
    free(t[i]);
  }
  loom_sched_destroy(sc);
  for (int h = 0; h < 2; h++) {
    loom_attn_exec_destroy(x[h]);
    loom_attn_plan_free(&p[h]);
    rows_free(&r[h]);
  }
}

// v with the given decimals, or null where it is not finite (JSON has no nan: the ping-pong of
// an np 1 run is never measured).
static const char *json_num(char *buf, size_t cap, double v, int decimals) {
  if (!isfinite(v)) {
    return "null";
  }
  snprintf(buf, cap, "%.*f", decimals, v);
  return buf;
}

static int parse(int argc, char **argv, opts_t *o) {
  *o = (opts_t){.lognormal = 1,
                .docs = 16,
                .heads = 4,
                .head_dim = 32,
                .iters = 5,
                .mean_len = 384,
                .long_len = 6144,
                .tolerance = 0.1};
  static const struct option lo[] = {{"workload", required_argument, NULL, 'w'},
                                     {"docs", required_argument, NULL, 'n'},
                                     {"mean-len", required_argument, NULL, 'm'},
                                     {"long", required_argument, NULL, 'L'},
                                     {"heads", required_argument, NULL, 'H'},
                                     {"head-dim", required_argument, NULL, 'D'},
                                     {"iters", required_argument, NULL, 'i'},
                                     {"tolerance", required_argument, NULL, 't'},
                                     {"servers", required_argument, NULL, 's'},
                                     {"json", required_argument, NULL, 'J'},
                                     {"row-cost", required_argument, NULL, 'r'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
    case 'w':
      o->lognormal = strcmp(optarg, "onelong") != 0;
      if (o->lognormal && strcmp(optarg, "lognormal") != 0) {
        fprintf(stderr, "attn_perf: --workload lognormal|onelong, got '%s'\n", optarg);
        return 2;
      }
      break;
    case 'n':
      if (test_int_arg("attn_perf", "--docs", optarg, &o->docs) != 0) {
        return 2;
      }
      break;
    case 'm':
      if (test_int64_arg("attn_perf", "--mean-len", optarg, &o->mean_len) != 0) {
        return 2;
      }
      break;
    case 'L':
      if (test_int64_arg("attn_perf", "--long", optarg, &o->long_len) != 0) {
        return 2;
      }
      break;
    case 'H':
      if (test_int_arg("attn_perf", "--heads", optarg, &o->heads) != 0) {
        return 2;
      }
      break;
    case 'D':
      if (test_int_arg("attn_perf", "--head-dim", optarg, &o->head_dim) != 0) {
        return 2;
      }
      break;
    case 'i':
      if (test_int_arg("attn_perf", "--iters", optarg, &o->iters) != 0) {
        return 2;
      }
      break;
    case 't':
      if (test_real_arg("attn_perf", "--tolerance", optarg, &o->tolerance) != 0) {
        return 2;
      }
      break;
    case 's':
      if (test_int_arg("attn_perf", "--servers", optarg, &o->servers) != 0) {
        return 2;
      }
      break;
    case 'J':
      o->json = optarg;
      break;
    case 'r':
      o->row_cost = -1.0; // auto
      if (strcmp(optarg, "auto") &&
          test_real_arg("attn_perf", "--row-cost", optarg, &o->row_cost) != 0) {
        return 2;
      }
      if (strcmp(optarg, "auto") && o->row_cost < 0) {
        fprintf(stderr, "attn_perf: --row-cost auto or a number >= 0, got '%s'\n", optarg);
        return 2;
      }
      break;
    default:
      printf("usage: mpirun -np N attn_perf [--workload lognormal|onelong] [--docs 16]\n"
             "  [--mean-len 384] [--long 6144] [--heads 4] [--head-dim 32] [--iters 5]\n"
             "  [--tolerance 0.1] [--servers K] [--row-cost 0|auto|C] [--json FILE]\n");
      return c == 'h' ? 1 : 2;
    }
  }
  const int64_t max_len = (int64_t)1 << 22; // 4M tokens: far past a benchmark, short of overflow
  if (o->docs < 1 || o->mean_len < 16 || o->mean_len > max_len || o->long_len < 1 ||
      o->long_len > max_len || o->heads < 1 || o->head_dim < 1 || o->iters < 1 || o->servers < 0 ||
      o->servers >= np || o->tolerance < 0) {
    fprintf(stderr, "attn_perf: --docs >= 1, --mean-len in 16..4194304, --long in 1..4194304, "
                    "--heads, --head-dim, --iters >= 1, --servers in 0..np-1, --tolerance >= 0\n");
    return 2;
  }
  if ((int64_t)o->docs * np + 1 > MAX_DOCS) { // (make_docs stopped there: ranks lost documents)
    fprintf(stderr, "attn_perf: --docs %d at np %d: at most %d documents per rank\n", o->docs, np,
            (MAX_DOCS - 1) / np);
    return 2;
  }
  if (test_output_writable("attn_perf", "--json", o->json) != 0) { // now, not after the runs
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "attn_perf: %s\n", loom_last_error(NULL));
    return 1;
  }
  np = loom_size(ctx);
  me = loom_rank(ctx);
  opts_t o;
  int rc = parse(argc, argv, &o);
  // Every rank or none goes on: a rank that refused its arguments alone (another command line on
  // an MPMD line) would leave the others waiting for it in the first collective.
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rc == 0) { // and every rank took the same arguments (2 after naming the first that differs)
    rc = test_bench_agree_args("attn_perf", argc, argv);
  }
  if (rc) {
    loom_finalize(ctx);
    return rc == 1 ? 0 : 2;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  if (o.row_cost < 0) { // auto: rank 0's measurement, the same plan everywhere
    if (me == 0 &&
        loom_attn_measure_row_cost(o.heads, o.heads, o.head_dim, 1, &o.row_cost) != LOOM_OK) {
      fprintf(stderr, "attn_perf: %s\n", loom_last_error(NULL));
      o.row_cost = NAN;
    }
    MPI_Bcast(&o.row_cost, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (!(o.row_cost >= 0)) {
      loom_finalize(ctx);
      return 1;
    }
  }
  result_t res[3];
  int nres = 0;
  for (int mode = 0; mode < 3; mode++) {
    if (mode == 2 && o.servers == 0) {
      continue;
    }
    run_mode(&o, g, mode, &res[nres++]);
  }
  double pp[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
  if (np > 1) {
    run_pingpong(&o, ctx, g, pp);
  }
  if (me == 0) {
    printf("# attn_perf: np %d, %s, %d docs per rank (mean %lld%s), heads %d x %d, "
           "tolerance %.2f, row cost %.1f, %d iterations (median)\n",
           np, o.lognormal ? "lognormal" : "onelong", o.docs, (long long)o.mean_len,
           o.lognormal ? "" : ", plus one long document on rank 0", o.heads, o.head_dim,
           o.tolerance, o.row_cost, o.iters);
    printf("%-10s %13s %13s %9s %14s %14s %8s\n", "mode", "work max/mean", "time max/mean",
           "MB moved", "kernel max ms", "phase ms (f+b)", "speedup");
    for (int i = 0; i < nres; i++) {
      printf("%-10s %13.3f %13.3f %9.2f %14.2f %14.2f %8.3f\n", res[i].mode, res[i].work_ratio,
             res[i].time_ratio, res[i].bytes / 1e6, res[i].kernel_ms, res[i].phase_ms,
             res[0].phase_ms / res[i].phase_ms);
    }
    if (np > 1) {
      printf("ping-pong (inplace, forward of two nano-batches): serial %.2f ms (waits %.2f), "
             "by hand %.2f ms (waits %.2f): hidden %.3f; scheduled %.2f ms (waits %.2f): "
             "hidden %.3f\n",
             pp[0], pp[1], pp[2], pp[3], pp[1] > 0 ? 1.0 - pp[3] / pp[1] : 0.0, pp[4], pp[5],
             pp[1] > 0 ? 1.0 - pp[5] / pp[1] : 0.0);
    }
    if (o.json) {
      FILE *f = test_output_open("attn_perf", "--json", o.json, "w");
      if (f) {
        fprintf(f, "{\"np\": %d, \"workload\": \"%s\", \"row_cost\": %.3f, \"modes\": [", np,
                o.lognormal ? "lognormal" : "onelong", o.row_cost);
        for (int i = 0; i < nres; i++) {
          fprintf(f,
                  "%s{\"mode\": \"%s\", \"work_max_over_mean\": %.4f, \"time_max_over_mean\": "
                  "%.4f, \"bytes\": %.0f, \"phase_ms\": %.3f}",
                  i ? ", " : "", res[i].mode, res[i].work_ratio, res[i].time_ratio, res[i].bytes,
                  res[i].phase_ms);
        }
        char num[6][32];
        fprintf(
            f,
            "], \"pingpong\": {\"serial_ms\": %s, \"serial_wait_ms\": %s, "
            "\"pingpong_ms\": %s, \"pingpong_wait_ms\": %s, \"sched_ms\": %s, "
            "\"sched_wait_ms\": %s}}\n",
            json_num(num[0], sizeof num[0], pp[0], 3), json_num(num[1], sizeof num[1], pp[1], 3),
            json_num(num[2], sizeof num[2], pp[2], 3), json_num(num[3], sizeof num[3], pp[3], 3),
            json_num(num[4], sizeof num[4], pp[4], 3), json_num(num[5], sizeof num[5], pp[5], 3));
        rc = test_output_close("attn_perf", "--json", o.json, f) != 0;
      } else {
        rc = 1;
      }
    }
  }
  loom_finalize(ctx);
  return rc;
}
