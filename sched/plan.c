/* plan.c — the ByteComp compression planner: a one-step timeline simulator over the compute,
 * comm and worker lanes with alpha-beta links and per-codec costs, greedy choice, brute force. */
#include "config.h"
#include "loom_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

// ---------------------------------------------------------------------------------------------
// Cost models.

enum { LANE_COMPUTE = 0, LANE_WORKER = 2, LANE_GPU = LOOM_PLAN_LANE_GPU };

static double link_us(const loom_link_t *l, double bytes) {
  return l->alpha_us + bytes / (l->gbps * 125.0);
}

static int is_lowrank(const loom_codec_cost_t *c) {
  return strncmp(c->compressor, "powersgd", 8) == 0;
}

static double payload(const loom_codec_cost_t *c, double n) {
  return c->bytes_per_value * n + c->fixed_bytes;
}

static double enc_us(const loom_codec_cost_t *c, double n) {
  return c->enc_us + c->enc_ns * n / 1000.0;
}

static double dec_us(const loom_codec_cost_t *c, double n) {
  return c->dec_us + c->dec_ns * n / 1000.0;
}

// The link every message of the group crosses at its slowest: between nodes when there are
// several.
static const loom_link_t *slow_link(const loom_plan_problem_t *p) {
  return p->nodes > 1 ? &p->inter : &p->intra;
}

// Uncompressed ordered allreduce: the cheaper of a ring (reduce-scatter + allgather: 2 (np - 1)
// messages of b / np) and recursive halving and doubling (2 ceil(log2 np) latencies, the same
// bytes), which MPI libraries switch to when the latencies dominate (many ranks, small tensors).
static double allreduce_us(double bytes, int np, const loom_link_t *l) {
  if (np <= 1) {
    return 0.0;
  }
  const double ring = 2.0 * (np - 1) * link_us(l, bytes / np);
  const double halving =
      2.0 * ceil(log2((double)np)) * l->alpha_us + 2.0 * (np - 1) / np * bytes / (l->gbps * 125.0);
  return ring < halving ? ring : halving;
}

// Uncompressed between nodes (loom_plan_problem_t.flat_node_ranks): the hierarchical scheme as a
// ring over the node links; the flat scheme as its latencies and what the fullest node's link
// carries, L 2 (n - L) / n of the tensor each way.
static double plain_us(const loom_plan_problem_t *p, double bytes) {
  const int L = p->flat_node_ranks, n = p->ranks;
  if (p->nodes > 1 && L > 0 && L < n) {
    return 2.0 * (n - 1) * p->inter.alpha_us +
           2.0 * L * (double)(n - L) / n * bytes / (p->inter.gbps * 125.0);
  }
  return allreduce_us(bytes, n, slow_link(p));
}

// How a compressed tensor moves: the encode before, the comm phases and the codec work between
// them (on the tensor's lane), the decode after.
typedef struct stages {
  double enc, comm1, mid, comm2, dec, bytes;
} stages_t;

static stages_t compressed(const loom_plan_problem_t *p, const loom_codec_cost_t *c,
                           loom_scheme_t scheme, double n) {
  const int np = p->ranks;
  const loom_link_t *l = slow_link(p);
  stages_t s = {0};
  if (is_lowrank(c)) { // two allreduces of the factors; payload() gives their size
    s.enc = enc_us(c, n);
    s.comm1 = 2.0 * allreduce_us(payload(c, n) / 2.0, np, l);
    s.dec = dec_us(c, n);
    s.bytes = 2.0 * (np - 1) / np * payload(c, n);
    return s;
  }
  if (scheme == LOOM_SCHEME_DIVISIBLE) {
    double shard = n / np, ps = payload(c, shard);
    s.enc = np * c->enc_us + c->enc_ns * n / 1000.0;
    s.comm1 = (np - 1) * link_us(l, ps);
    s.mid = np * dec_us(c, shard) + enc_us(c, shard);
    s.comm2 = (np - 1) * link_us(l, ps);
    s.dec = np * dec_us(c, shard);
    s.bytes = 2.0 * (np - 1) * ps;
  } else if (scheme == LOOM_SCHEME_HIERARCHICAL && p->nodes > 1) {
    int per = p->ranks / p->nodes;
    double bytes = 4.0 * n, pl = payload(c, n);
    s.comm1 = allreduce_us(bytes, per, &p->intra);
    s.enc = enc_us(c, n);
    s.mid = 0.0;
    s.comm2 = (p->nodes - 1) * link_us(&p->inter, pl) + (per > 1 ? link_us(&p->intra, bytes) : 0);
    s.dec = p->nodes * dec_us(c, n);
    s.bytes = (per > 1 ? 2.0 * (per - 1) / per * bytes : 0) + (p->nodes - 1) * pl;
  } else { // indivisible (and hierarchical on one node: the same messages)
    double pl = payload(c, n);
    s.enc = enc_us(c, n);
    s.comm1 = (np - 1) * link_us(l, pl);
    s.dec = np * dec_us(c, n);
    s.bytes = (np - 1) * pl;
  }
  return s;
}

// A GPU problem (gpu_codecs set): the GPU lane takes the device codec's costs; the CPU lane (the
// worker lane) the host codec's, with the copy of the tensor to the host before the encode and
// of the sum back after the decode.
static int is_gpu(const loom_plan_problem_t *p) {
  return p->gpu_codecs != NULL;
}

static stages_t lane_stages(const loom_plan_problem_t *p, const loom_plan_choice_t *c, double n) {
  if (!is_gpu(p)) {
    return compressed(p, &p->codecs[c->codec], c->scheme, n);
  }
  if (c->lane == LANE_GPU) {
    return compressed(p, &p->gpu_codecs[c->codec], c->scheme, n);
  }
  stages_t s = compressed(p, &p->codecs[c->codec], c->scheme, n);
  s.enc += link_us(&p->pcie, 4.0 * n);
  s.dec += link_us(&p->pcie, 4.0 * n);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Simulation. Tensors are taken in ready order. The compute lane runs the step's compute, and
// every encode, decode or codec step placed on it pushes the rest of the compute later (while
// compute remains) or queues after it. The comm lane moves one tensor at a time, in order. The
// worker lane is one queue (the pool's first thread; more threads are not modelled).

// A time or a cost: finite and >= 0 (NaN is neither: it made every comparison false).
static int cost_ok(double x) {
  return x >= 0 && isfinite(x);
}

static loom_status_t check_problem(const loom_plan_problem_t *p, const void *choice,
                                   const void *out) {
  if (!p || !out || (p->ntensors > 0 && (!p->tensors || !choice)) || p->ntensors < 0 ||
      p->ranks < 1 || p->nodes < 1 || p->nodes > p->ranks || p->ncodecs < 0 ||
      (p->ncodecs > 0 && !p->codecs) || p->workers < 0 || !(p->intra.gbps > 0) ||
      (p->nodes > 1 && !(p->inter.gbps > 0)) || !cost_ok(p->compute_us) ||
      !cost_ok(p->intra.alpha_us) || !cost_ok(p->inter.alpha_us)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "compression planner: bad problem: need ntensors >= 0 with tensors and a "
                      "choice array, 1 <= nodes <= ranks, ncodecs >= 0 with codecs, workers >= 0, "
                      "links with gbps > 0 and a finite alpha >= 0, a finite compute_us >= 0, and "
                      "an output");
  }
  for (int i = 0; i < p->ntensors; i++) {
    if (p->tensors[i].n < 0 || !(p->tensors[i].ready_us >= 0)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "compression planner: tensor %d ('%s') has n = %lld, ready %g us: need "
                        "n >= 0 and ready >= 0",
                        i, p->tensors[i].name ? p->tensors[i].name : "", (long long)p->tensors[i].n,
                        p->tensors[i].ready_us);
    }
  }
  for (int c = 0; c < p->ncodecs * (is_gpu(p) ? 2 : 1); c++) {
    const loom_codec_cost_t *k = c < p->ncodecs ? &p->codecs[c] : &p->gpu_codecs[c - p->ncodecs];
    if (!k->compressor || !cost_ok(k->bytes_per_value) || !cost_ok(k->enc_ns) ||
        !cost_ok(k->dec_ns) || !cost_ok(k->enc_us) || !cost_ok(k->dec_us) ||
        !cost_ok(k->fixed_bytes)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "compression planner: %s codec %d has a missing name or a cost that is "
                        "negative, NaN or infinite",
                        c < p->ncodecs ? "host" : "GPU", c % (p->ncodecs > 0 ? p->ncodecs : 1));
    }
  }
  if (is_gpu(p) && p->host_lanes && (!(p->pcie.gbps > 0) || !(p->pcie.alpha_us >= 0))) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "compression planner: a GPU problem with host_lanes needs the host <-> "
                      "device copy link (pcie) with gbps > 0 and alpha >= 0");
  }
  return LOOM_OK;
}

// Whether lane can run codec c with scheme s: the host lanes as always (the worker lane with
// workers); on a GPU problem the GPU lane (flat schemes, payload codecs) and the CPU lane (the
// worker lane) with host_lanes.
static int lane_ok(const loom_plan_problem_t *p, int c, loom_scheme_t s, int lane) {
  if (!is_gpu(p)) {
    return lane == LANE_COMPUTE || (lane == LANE_WORKER && p->workers >= 1);
  }
  if (lane == LANE_GPU) {
    return s != LOOM_SCHEME_HIERARCHICAL && !is_lowrank(&p->codecs[c]);
  }
  return lane == LANE_WORKER && p->host_lanes;
}

static loom_status_t check_choice(const loom_plan_problem_t *p, const loom_plan_choice_t *ch) {
  for (int i = 0; i < p->ntensors; i++) {
    const loom_plan_choice_t *c = &ch[i];
    if (c->codec < -1 || c->codec >= p->ncodecs ||
        (c->codec >= 0 && ((int)c->scheme < 0 || c->scheme >= LOOM_SCHEME_COUNT ||
                           !lane_ok(p, c->codec, c->scheme, c->lane)))) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "compression planner: choice %d: codec %d (of %d), scheme %d, lane %d: "
                        "need -1 <= codec < ncodecs, a loom_scheme_t, %s",
                        i, c->codec, p->ncodecs, (int)c->scheme, c->lane,
                        is_gpu(p) ? "lane 3 (GPU: indivisible or divisible, no powersgd) or 2 "
                                    "(CPU, only with host_lanes)"
                                  : "lane 0 or 2 (2 only with workers)");
    }
  }
  return LOOM_OK;
}

// The simulation proper (arguments checked). end_us, when non-NULL, receives each tensor's
// completion time.
static loom_plan_result_t simulate(const loom_plan_problem_t *p, const loom_plan_choice_t *ch,
                                   double *end_us) {
  double shift = 0.0; // compute pushed later by work placed on the compute lane
  double after = 0.0; // compute-lane work queued after the compute ends
  double comm_free = 0.0, worker_free = 0.0, comm_busy = 0.0, bytes = 0.0, last = 0.0;
  for (int i = 0; i < p->ntensors; i++) {
    const double n = (double)p->tensors[i].n, ready = p->tensors[i].ready_us + shift;
    const loom_plan_choice_t *c = &ch[i];
    double done;
    if (c->codec < 0) {
      double t = plain_us(p, 4.0 * n);
      double start = ready > comm_free ? ready : comm_free;
      comm_free = start + t;
      comm_busy += t;
      bytes += p->ranks > 1 ? 2.0 * (p->ranks - 1) / p->ranks * 4.0 * n : 0.0;
      done = comm_free;
    } else {
      stages_t s = lane_stages(p, c, n);
      // Lane work: on the compute lane (or the GPU's) it delays the compute (or waits behind it
      // once the compute is over); on the worker lane (or the CPU) it queues there.
      double t = ready;
      double *lane_free = c->lane == LANE_WORKER ? &worker_free : NULL;
#define ON_LANE(at, dur)                                                                           \
  do {                                                                                             \
    double at_ = (at), d_ = (dur);                                                                 \
    if (lane_free) {                                                                               \
      t = (at_ > *lane_free ? at_ : *lane_free) + d_;                                              \
      *lane_free = t;                                                                              \
    } else if (at_ < p->compute_us + shift) {                                                      \
      shift += d_;                                                                                 \
      t = at_ + d_;                                                                                \
    } else {                                                                                       \
      double q_ = p->compute_us + shift + after;                                                   \
      t = (at_ > q_ ? at_ : q_) + d_;                                                              \
      after = t - (p->compute_us + shift);                                                         \
    }                                                                                              \
  } while (0)
      ON_LANE(t, s.enc);
      double start = t > comm_free ? t : comm_free;
      comm_free = start + s.comm1;
      comm_busy += s.comm1;
      if (s.mid > 0.0 || s.comm2 > 0.0) {
        ON_LANE(comm_free, s.mid);
        start = t > comm_free ? t : comm_free;
        comm_free = start + s.comm2;
        comm_busy += s.comm2;
      }
      ON_LANE(comm_free, s.dec);
#undef ON_LANE
      bytes += s.bytes;
      done = t;
    }
    if (end_us) {
      end_us[i] = done;
    }
    last = done > last ? done : last;
  }
  double compute_end = p->compute_us + shift + after;
  loom_plan_result_t r;
  r.step_us = compute_end > last ? compute_end : last;
  r.exposed_us = r.step_us - p->compute_us;
  r.comm_us = comm_busy;
  r.bytes_per_rank = bytes;
  return r;
}

loom_status_t loom_plan_simulate(const loom_plan_problem_t *p, const loom_plan_choice_t *choice,
                                 loom_plan_result_t *out) {
  loom_status_t status = check_problem(p, choice, out);
  if (status == LOOM_OK) {
    status = check_choice(p, choice);
  }
  if (status == LOOM_OK) {
    *out = simulate(p, choice, NULL);
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Options: none, then every codec x scheme (hierarchical only with several nodes; low-rank
// codecs have one scheme) on the compute lane (a GPU problem: the GPU lane), and the same on the
// worker lane (the CPU) when there is one; lane_ok drops what a lane cannot run.

static int first_lane(const loom_plan_problem_t *p) {
  return is_gpu(p) ? LANE_GPU : LANE_COMPUTE;
}

static int options(const loom_plan_problem_t *p, int with_worker, loom_plan_choice_t *opt) {
  int k = 0;
  opt[k++] = (loom_plan_choice_t){-1, LOOM_SCHEME_INDIVISIBLE, LANE_COMPUTE};
  for (int lane = 0; lane < (with_worker ? 2 : 1); lane++) {
    const int ln = lane ? LANE_WORKER : first_lane(p);
    for (int c = 0; c < p->ncodecs; c++) {
      for (int s = 0; s < LOOM_SCHEME_COUNT; s++) {
        if ((s == LOOM_SCHEME_HIERARCHICAL && p->nodes < 2) ||
            (is_lowrank(&p->codecs[c]) && s != LOOM_SCHEME_INDIVISIBLE) ||
            !lane_ok(p, c, (loom_scheme_t)s, ln)) {
          continue;
        }
        opt[k++] = (loom_plan_choice_t){c, (loom_scheme_t)s, ln};
      }
    }
  }
  return k;
}

static int max_options(const loom_plan_problem_t *p) {
  return 1 + 2 * p->ncodecs * LOOM_SCHEME_COUNT;
}

static int by_size_desc(const void *a, const void *b, void *ctx) {
  const loom_plan_tensor_t *t = ctx;
  int i = *(const int *)a, j = *(const int *)b;
  if (t[i].n != t[j].n) {
    return t[i].n > t[j].n ? -1 : 1;
  }
  return i - j;
}

// qsort_r is a GNU extension; an insertion sort keeps this portable (ntensors is a few hundred).
static void sort_by_size(int *idx, int n, const loom_plan_tensor_t *t) {
  for (int i = 1; i < n; i++) {
    int v = idx[i], j = i - 1;
    while (j >= 0 && by_size_desc(&idx[j], &v, (void *)t) > 0) {
      idx[j + 1] = idx[j];
      j--;
    }
    idx[j + 1] = v;
  }
}

loom_status_t loom_plan_greedy(const loom_plan_problem_t *p, loom_plan_choice_t *choice,
                               loom_plan_result_t *out) {
  loom_status_t status = check_problem(p, choice, out);
  if (status != LOOM_OK) {
    return status;
  }
  const int nt = p->ntensors;
  int *order = malloc(sizeof(int) * (size_t)(nt + 1));
  loom_plan_choice_t *opt = malloc(sizeof *opt * (size_t)max_options(p));
  if (!order || !opt) {
    free(order);
    free(opt);
    return loom_error(NULL, LOOM_ERR_NOMEM, "compression planner: out of memory");
  }
  for (int i = 0; i < nt; i++) {
    choice[i] = (loom_plan_choice_t){-1, LOOM_SCHEME_INDIVISIBLE, LANE_COMPUTE};
    order[i] = i;
  }
  loom_plan_result_t best = simulate(p, choice, NULL);
  // Pass 1: compressor and scheme, encoding on the compute lane, largest tensors first. A GPU
  // problem weighs both its lanes here (ByteComp's GPU and CPU options: a slow device codec may
  // be worth nothing on the GPU and a lot on the CPU), then offloads more in pass 2.
  const int nopt = options(p, is_gpu(p), opt);
  sort_by_size(order, nt, p->tensors);
  for (int k = 0; k < nt && best.exposed_us > 0.0; k++) { // nothing exposed: nothing to gain
    const int i = order[k];
    loom_plan_choice_t keep = choice[i];
    for (int o = 0; o < nopt; o++) {
      choice[i] = opt[o];
      loom_plan_result_t r = simulate(p, choice, NULL);
      if (r.step_us < best.step_us * (1.0 - 1e-9)) {
        best = r;
        keep = opt[o];
      }
    }
    choice[i] = keep;
  }
  // Pass 2: offload encodings to the worker lane (a GPU problem: the CPU), farthest from the
  // output first (the gradients the backward produces last), while that shortens the step.
  const int offload = is_gpu(p) ? p->host_lanes : p->workers > 0;
  for (int i = nt - 1; i >= 0 && offload; i--) {
    if (choice[i].codec < 0) {
      continue;
    }
    const int was = choice[i].lane;
    choice[i].lane = LANE_WORKER;
    loom_plan_result_t r = simulate(p, choice, NULL);
    if (r.step_us < best.step_us * (1.0 - 1e-9)) {
      best = r;
    } else {
      choice[i].lane = was;
    }
  }
  *out = best;
  free(order);
  free(opt);
  return LOOM_OK;
}

loom_status_t loom_plan_brute_force(const loom_plan_problem_t *p, loom_plan_choice_t *choice,
                                    loom_plan_result_t *out) {
  loom_status_t status = check_problem(p, choice, out);
  if (status != LOOM_OK) {
    return status;
  }
  const int nt = p->ntensors;
  loom_plan_choice_t *opt = malloc(sizeof *opt * (size_t)max_options(p));
  if (!opt) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "compression planner: out of memory");
  }
  const int nopt = options(p, 1, opt);
  double combos = pow((double)nopt, (double)nt);
  if (combos > 2e6) {
    free(opt);
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "compression planner: brute force over %d tensors x %d options is %.3g "
                      "combinations (at most 2e6): use loom_plan_greedy",
                      nt, nopt, combos);
  }
  int *digit = calloc((size_t)nt + 1, sizeof(int));
  loom_plan_choice_t *cur = malloc(sizeof *cur * (size_t)(nt + 1));
  if (!digit || !cur) {
    free(opt);
    free(digit);
    free(cur);
    return loom_error(NULL, LOOM_ERR_NOMEM, "compression planner: out of memory");
  }
  loom_plan_result_t best = {INFINITY, INFINITY, 0, 0};
  for (;;) {
    for (int i = 0; i < nt; i++) {
      cur[i] = opt[digit[i]];
    }
    loom_plan_result_t r = simulate(p, cur, NULL);
    if (r.step_us < best.step_us) {
      best = r;
      memcpy(choice, cur, sizeof *cur * (size_t)nt);
    }
    int i = 0;
    while (i < nt && ++digit[i] == nopt) {
      digit[i++] = 0;
    }
    if (i == nt) {
      break;
    }
  }
  if (nt == 0) {
    best = simulate(p, cur, NULL);
  }
  *out = best;
  free(opt);
  free(digit);
  free(cur);
  return LOOM_OK;
}

// ---------------------------------------------------------------------------------------------

void loom_plan_print(const loom_plan_problem_t *p, const loom_plan_choice_t *choice,
                     const loom_plan_result_t *r, FILE *out) {
  if (!p || !choice || !r || !out || check_problem(p, choice, r) != LOOM_OK ||
      check_choice(p, choice) != LOOM_OK) {
    return;
  }
  double *end = malloc(sizeof(double) * (size_t)(p->ntensors + 1));
  if (!end) {
    return;
  }
  simulate(p, choice, end);
  fprintf(out, "%-32s %12s %10s %-12s %-16s %-8s %12s\n", "tensor", "bytes", "ready_us", "scheme",
          "compressor", "lane", "done_us");
  for (int i = 0; i < p->ntensors; i++) {
    const loom_plan_choice_t *c = &choice[i];
    fprintf(out, "%-32s %12lld %10.1f %-12s %-16s %-8s %12.1f\n",
            p->tensors[i].name ? p->tensors[i].name : "?", (long long)p->tensors[i].n * 4,
            p->tensors[i].ready_us, c->codec < 0 ? "allreduce" : loom_scheme_name(c->scheme),
            c->codec < 0 ? "none" : p->codecs[c->codec].compressor,
            c->codec < 0             ? "-"
            : c->lane == LANE_GPU    ? "gpu"
            : c->lane == LANE_WORKER ? (is_gpu(p) ? "cpu" : "worker")
                                     : "compute",
            end[i]);
  }
  fprintf(out,
          "predicted step %.1f us: compute %.1f us, exposed %.1f us, comm busy %.1f us, %.0f "
          "bytes sent per rank\n",
          r->step_us, p->compute_us, r->exposed_us, r->comm_us, r->bytes_per_rank);
  free(end);
}
