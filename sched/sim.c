/* sim.c — loom_sim's model: compute scaled by oversubscription and the attention straggler
 * (or balanced by the attention servers), MoE all-to-all under each overlap mode, and the
 * gradient synchronisation through the compression planner's step simulator. */
#include "config.h"
#include "loom_sim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "loom_attn_plan.h"
#include "loom_moe.h"

#define SIM_TRIALS            8  // steps drawn to estimate the attention imbalance
#define SIM_BALANCE_MAX_RANKS 64 // the balancer runs on at most this many ranks (see below)
// Documents a step may draw. The balancer keeps ~120 bytes per document (its tasks, the plan):
// 1.7M one-token documents on 64 ranks took 198 MB and 4.9 s for the eight trials here. The
// straggler estimate only counts them: 512 ranks x 26K documents, eight trials, took 0.31 s.
#define SIM_MAX_BALANCED_DOCS ((int64_t)1 << 21)
#define SIM_MAX_DRAWN_DOCS    ((int64_t)1 << 24)
#define SIM_COARSE_CHUNKS     4 // the coarse MoE overlap's pipeline depth (loom_moe.h default)

static uint64_t mix(uint64_t *s) { // splitmix64
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Bytes per microsecond of a link for one rank when `sharers` ranks use it at once.
static double rate(const loom_link_t *l, int shared, int sharers) {
  return l->gbps * 125.0 / (shared && sharers > 1 ? sharers : 1);
}

// One rank's documents of one step: one of the profiled batches, drawn whole (the documents of a
// batch are correlated: a skewed batch is all short or holds a long one); without batches,
// documents drawn one by one, each cut at ctx, packed into tokens rows (the last one cut to
// fit). Appends to docs; returns their cost: causal pairs plus the profile's row cost per row.
static double draw_rank(const loom_sim_profile_t *p, uint64_t *s, int owner, loom_attn_doc_t *docs,
                        int *nd, int cap) {
  int64_t left = p->tokens;
  double pairs = 0.0;
  if (p->nbatches > 0) {
    const int k = (int)(mix(s) % (uint64_t)p->nbatches);
    for (int i = k ? p->batch_end[k - 1] : 0; i < p->batch_end[k]; i++) {
      const int64_t len = p->docs[i];
      pairs += 0.5 * (double)len * (double)(len + 1) + p->attn_row_cost * (double)len;
      if (docs && *nd < cap) {
        docs[*nd] = (loom_attn_doc_t){.len = len, .owner = owner};
        (*nd)++;
      }
    }
    return pairs;
  }
  while (left > 0) {
    int64_t len = p->docs[mix(s) % (uint64_t)p->ndocs];
    len = len < p->ctx ? len : p->ctx;
    len = len < left ? len : left;
    left -= len;
    pairs += 0.5 * (double)len * (double)(len + 1) + p->attn_row_cost * (double)len;
    if (docs && *nd < cap) {
      docs[*nd] = (loom_attn_doc_t){.len = len, .owner = owner};
      (*nd)++;
    }
  }
  return pairs;
}

// At most how many documents draw_rank gives one rank: the largest batch; without batches
// tokens / m + 1, m the shortest a document can be before the rank's last one is cut to fit
// (the shortest sampled document, or ctx).
static int64_t docs_per_rank(const loom_sim_profile_t *p) {
  int64_t most = 0;
  if (p->nbatches > 0) {
    for (int k = 0; k < p->nbatches; k++) {
      const int64_t nk = p->batch_end[k] - (k ? p->batch_end[k - 1] : 0);
      most = nk > most ? nk : most;
    }
    return most;
  }
  int64_t m = p->ctx;
  for (int i = 0; i < p->ndocs; i++) {
    m = p->docs[i] < m ? p->docs[i] : m;
  }
  return p->tokens / (m > 0 ? m : 1) + 1;
}

// LOOM_ERR_INVALID_ARG when ranks of the profile's steps hold more than `limit` documents; else
// *per_rank is docs_per_rank.
static loom_status_t check_docs(const loom_sim_profile_t *p, int ranks, int64_t limit,
                                const char *what, int64_t *per_rank_out) {
  const int64_t per_rank = docs_per_rank(p);
  *per_rank_out = per_rank;
  if (per_rank > limit / ranks) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim: up to %lld documents per rank x %d ranks is too many to %s (at "
                      "most %lld; the profile's %lld tokens per rank, cut at ctx %lld or at its "
                      "shortest document): record the profile with whole batches (train_gpt "
                      "--profile) or simulate fewer ranks",
                      (long long)per_rank, ranks, what, (long long)limit, (long long)p->tokens,
                      (long long)p->ctx);
  }
  return LOOM_OK;
}

// The attention imbalance without servers, averaged over SIM_TRIALS drawn steps: the busiest
// core's attention over per_core ranks' share of the mean. Ranks bound to one core (rank i of a
// node on core i % cores) take turns, so a core's load is the sum of its ranks': with one rank
// per core this is max / mean over the ranks, with more the draws of a core average out.
// LOOM_ERR_NOMEM, or LOOM_ERR_INVALID_ARG when a step would draw more than SIM_MAX_DRAWN_DOCS
// documents.
static loom_status_t imbalance(const loom_sim_profile_t *p, const loom_sim_cluster_t *c, int ranks,
                               int per_core, uint64_t seed, double *ratio) {
  int64_t per_rank;
  loom_status_t st = check_docs(p, ranks, SIM_MAX_DRAWN_DOCS, "draw", &per_rank);
  if (st != LOOM_OK) {
    return st;
  }
  const int rpn = c->ranks_per_node, cores = c->cores_per_node < rpn ? c->cores_per_node : rpn;
  double *load = malloc((size_t)ranks * sizeof *load);
  if (!load) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_sim: out of memory for %d ranks", ranks);
  }
  double sum = 0.0;
  for (int t = 0; t < SIM_TRIALS; t++) {
    uint64_t s = seed ^ (0x5157ull * (uint64_t)(t + 1));
    double max = 0.0, total = 0.0;
    memset(load, 0, (size_t)ranks * sizeof *load);
    for (int r = 0; r < ranks; r++) {
      const double pr = draw_rank(p, &s, r, NULL, NULL, 0);
      const int core = (r / rpn) * cores + (r % rpn) % cores; // < ranks
      load[core] += pr;
      total += pr;
    }
    for (int k = 0; k < ranks; k++) {
      max = load[k] > max ? load[k] : max;
    }
    // (>= 1 when every core holds per_core ranks; a core with fewer is no busier)
    const double r = total > 0.0 ? max / (per_core * total / ranks) : 1.0;
    sum += r > 1.0 ? r : 1.0;
  }
  free(load);
  *ratio = sum / SIM_TRIALS;
  return LOOM_OK;
}

// With attention servers in place: the balancer's max / mean and the bytes a rank ships per
// step, averaged over drawn steps. The balancer runs on min(ranks, SIM_BALANCE_MAX_RANKS) ranks:
// it moves work until max / mean is within its tolerance whatever the rank count, and the bytes
// per rank depend on the documents per rank, not on how many ranks there are.
static loom_status_t balanced(const loom_sim_profile_t *p, int ranks, uint64_t seed, double *ratio,
                              double *bytes_per_rank) {
  const int R = ranks < SIM_BALANCE_MAX_RANKS ? ranks : SIM_BALANCE_MAX_RANKS;
  int64_t per_rank;
  loom_status_t st = check_docs(p, R, SIM_MAX_BALANCED_DOCS, "balance", &per_rank);
  if (st != LOOM_OK) {
    return st;
  }
  const int cap = (int)(per_rank * R);
  loom_attn_doc_t *docs = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *docs);
  if (!docs) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_sim: out of memory for %d documents", cap);
  }
  loom_attn_balance_opts_t o;
  loom_attn_balance_opts_init(&o);
  o.bytes_per_q_row = p->attn_q_bytes > 0 ? p->attn_q_bytes : o.bytes_per_q_row;
  o.bytes_per_kv_row = p->attn_kv_bytes > 0 ? p->attn_kv_bytes : o.bytes_per_kv_row;
  o.row_cost = p->attn_row_cost;
  // train_gpt's shard floor: min(64, ctx / 4) rows
  o.min_shard = p->ctx / 4 < 64 ? (p->ctx / 4 > 0 ? p->ctx / 4 : 1) : 64;
  double rsum = 0.0, bsum = 0.0;
  for (int t = 0; t < SIM_TRIALS && st == LOOM_OK; t++) {
    uint64_t s = seed ^ (0x5157ull * (uint64_t)(t + 1));
    int nd = 0;
    for (int r = 0; r < R; r++) {
      draw_rank(p, &s, r, docs, &nd, cap);
    }
    loom_attn_plan_t plan;
    st = loom_attn_balance(docs, nd, R, &o, &plan);
    if (st == LOOM_OK) {
      rsum += plan.max_over_mean;
      bsum += plan.bytes_moved / R;
      loom_attn_plan_free(&plan);
    }
  }
  free(docs);
  *ratio = rsum / SIM_TRIALS;
  *bytes_per_rank = bsum / SIM_TRIALS;
  return st;
}

// Earlier ready first; ties by size, then name, so that the order does not depend on qsort.
static int by_ready(const void *a, const void *b) {
  const loom_plan_tensor_t *x = a, *y = b;
  if (x->ready_us != y->ready_us) {
    return x->ready_us < y->ready_us ? -1 : 1;
  }
  if (x->n != y->n) {
    return x->n < y->n ? -1 : 1;
  }
  return strcmp(x->name ? x->name : "", y->name ? y->name : "");
}

static loom_status_t check(const loom_sim_profile_t *p, const loom_sim_cluster_t *c, int ranks,
                           const loom_sim_strategy_t *s, const loom_sim_result_t *out) {
  if (!p || !c || !s || !out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: profile, cluster, strategy and out must not be NULL");
  }
  if (c->nodes < 1 || c->ranks_per_node < 1 || c->cores_per_node < 1 || c->intra.gbps <= 0 ||
      c->inter.gbps <= 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: cluster '%s' needs nodes, ranks_per_node, "
                      "cores_per_node >= 1 and links with gbps > 0",
                      c->name);
  }
  if (ranks < 1 || (int64_t)ranks > (int64_t)c->nodes * c->ranks_per_node) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: %d ranks on cluster '%s' of %d x %d: pass 1 .. %lld",
                      ranks, c->name, c->nodes, c->ranks_per_node,
                      (long long)c->nodes * c->ranks_per_node);
  }
  if (s->grad < LOOM_SIM_GRAD_NONE || s->grad >= p->ncodecs) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: gradient strategy %d: pass NONE, PLAN or a codec index "
                      "below %d (the profile's codecs)",
                      s->grad, p->ncodecs);
  }
  if (s->moe_overlap < LOOM_MOE_OVERLAP_NONE || s->moe_overlap > LOOM_MOE_OVERLAP_FINE ||
      s->attn_servers < 0 || s->attn_servers > 1) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: moe_overlap %d (0..2) or attn_servers %d (0 or 1)",
                      s->moe_overlap, s->attn_servers);
  }
  if (p->np < 1 || p->tokens < 1 || p->ctx < 1 || p->compute_ms < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: the profile has no run (np, tokens, ctx, compute)");
  }
  if (p->tokens > (int64_t)1 << 24 || (p->ndocs > 0 && !p->docs) ||
      (p->nbatches > 0 && (!p->batch_end || p->batch_end[p->nbatches - 1] > p->ndocs))) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_sim_predict: the profile's %lld tokens per rank (at most 2^24) or its "
                      "documents (%d in %d batches) are inconsistent",
                      (long long)p->tokens, p->ndocs, p->nbatches);
  }
  // (the loader checks these; a profile built by hand may not: documents of length 0 are drawn
  // forever, a batch end out of order indexes outside docs)
  for (int i = 0; i < p->ndocs; i++) {
    if (p->docs[i] < 1) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "loom_sim_predict: the profile's document %d has length %lld: document "
                        "lengths are >= 1 (leave empty documents out)",
                        i, (long long)p->docs[i]);
    }
  }
  for (int k = 0; k < p->nbatches; k++) {
    if (p->batch_end[k] < (k ? p->batch_end[k - 1] : 0)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "loom_sim_predict: the profile's batch %d ends at document %d, before "
                        "the batch ahead of it: batch_end must not decrease",
                        k, p->batch_end[k]);
    }
  }
  return LOOM_OK;
}

// The expert-parallel group's size: the strategy's, capped at the ranks and the experts.
static int sim_ep(const loom_sim_profile_t *p, const loom_sim_strategy_t *s, int ranks) {
  int ep = s->ep_size > 0 ? s->ep_size : ranks;
  ep = ep < ranks ? ep : ranks;
  return ep < p->moe_experts ? ep : (p->moe_experts > 0 ? p->moe_experts : 1);
}

// The slowest rank's share of the expert work over ep ranks (max / mean), averaged over the
// profiled steps' routing: rank r holds the contiguous experts [r E / ep, (r + 1) E / ep).
static double moe_imbalance(const loom_sim_profile_t *p, int ep) {
  const int E = p->moe_experts;
  if (p->moe_steps < 1 || ep < 2 || E < ep) {
    return 1.0;
  }
  double sum = 0.0;
  for (int k = 0; k < p->moe_steps; k++) {
    const double *load = p->moe_load + (size_t)k * E;
    double max = 0.0, total = 0.0;
    for (int r = 0; r < ep; r++) {
      double block = 0.0;
      for (int e = (int)((int64_t)r * E / ep); e < (int)((int64_t)(r + 1) * E / ep); e++) {
        block += load[e];
      }
      max = block > max ? block : max;
      total += block;
    }
    sum += total > 0.0 ? max / (total / ep) : 1.0;
  }
  return sum / p->moe_steps;
}

// The MoE layers' all-to-all per step and what the overlap mode leaves exposed, given the
// expert compute E (ms), over an expert-parallel group of ep ranks; each of the four
// exchanges per layer (dispatch and combine, forward and backward) sends the rows routed off
// the rank: tokens x top-k x hidden f32 x (ep - 1) / ep.
static void moe_cost(const loom_sim_profile_t *p, const loom_sim_cluster_t *c, int ep, int on_node,
                     int overlap, double E, double *a2a, double *exposed) {
  *a2a = *exposed = 0.0;
  if (p->moe_layers < 1 || ep < 2) {
    return;
  }
  const int inside = ep <= c->ranks_per_node;
  const loom_link_t *l = inside ? &c->intra : &c->inter;
  const int shared = inside ? c->intra_shared : c->inter_shared;
  const double bytes = (double)p->tokens * p->moe_topk * p->moe_hidden * 4.0 * (ep - 1) / ep;
  const double one_us = (ep - 1) * l->alpha_us + bytes / rate(l, shared, on_node);
  const double A = p->moe_layers * 4.0 * one_us / 1000.0;
  const double lo = A < E ? A : E;
  double hidden = 0.0;
  if (overlap == LOOM_MOE_OVERLAP_COARSE) {
    hidden = lo * (1.0 - 1.0 / SIM_COARSE_CHUNKS);
  } else if (overlap == LOOM_MOE_OVERLAP_FINE) {
    hidden = lo * (p->moe_fine_hidden > 0 ? p->moe_fine_hidden : 0.75);
  }
  *a2a = A;
  *exposed = A - hidden;
}

loom_status_t loom_sim_predict(const loom_sim_profile_t *p, const loom_sim_cluster_t *c, int ranks,
                               const loom_sim_strategy_t *s, uint64_t seed,
                               loom_sim_result_t *out) {
  loom_status_t st = check(p, c, ranks, s, out);
  if (st != LOOM_OK) {
    return st;
  }
  memset(out, 0, sizeof *out);
  const int rpn = c->ranks_per_node;
  const int nodes = (ranks + rpn - 1) / rpn, on_node = ranks < rpn ? ranks : rpn;
  // More ranks than cores: loom binds rank i to core i % cores (LOOM_BIND=core), so the busiest
  // core holds ceil(ranks / cores) of them, and every step waits for its ranks; sharing a core
  // costs the cluster's timeshare on top of the shares.
  const int per_core = (on_node + c->cores_per_node - 1) / c->cores_per_node;
  const double oversub = per_core > 1 ? per_core * (1.0 + c->timeshare) : 1.0;
  out->ranks = ranks;
  out->nodes = nodes;

  // Compute: attention with its straggler (or balanced by the servers), the rest as profiled.
  const double attn0 = p->attn_ms < p->compute_ms ? p->attn_ms : p->compute_ms;
  const double moe = p->moe_ms < p->compute_ms - attn0 ? p->moe_ms : p->compute_ms - attn0;
  const double other = p->compute_ms - attn0 - moe;
  // Without servers, or on one rank, nothing is exchanged: what the profiled run's servers spent
  // on their exchanges goes (its compute lane did it: `other` keeps the rest).
  const double exch = p->attn_exchange_ms < attn0 ? p->attn_exchange_ms : attn0;
  const double attn = ranks == 1 || !s->attn_servers ? attn0 - exch : attn0;
  double ratio = 1.0, ship_bytes = 0.0;
  if (p->ndocs > 0 && attn > 0.0 && ranks > 1) {
    if (s->attn_servers) {
      st = balanced(p, ranks, seed, &ratio, &ship_bytes);
      if (st != LOOM_OK) {
        return st;
      }
    } else if ((st = imbalance(p, c, ranks, per_core, seed, &ratio)) != LOOM_OK) {
      return st;
    }
  }
  out->attn_imbalance = ratio;
  if (ship_bytes > 0.0) { // Q/K/V out and back, both passes: among the node's ranks or across
    const int inside = ranks <= rpn;
    const loom_link_t *l = inside ? &c->intra : &c->inter;
    const int shared = inside ? c->intra_shared : c->inter_shared;
    out->attn_ship_ms = (4.0 * l->alpha_us + ship_bytes / rate(l, shared, on_node)) / 1000.0;
  }
  // The experts' GEMMs on the rank that holds the busiest experts: every all-to-all waits for it.
  const int ep = sim_ep(p, s, ranks);
  out->moe_imbalance = p->moe_layers > 0 ? moe_imbalance(p, ep) : 1.0;
  const double E = moe * oversub * out->moe_imbalance;
  moe_cost(p, c, ep, on_node, s->moe_overlap, E, &out->moe_a2a_ms, &out->moe_exposed_ms);
  out->compute_ms = (other + attn * ratio) * oversub + E;

  // Gradients: the planner's simulator over the profiled tensors, their ready times stretched
  // with the compute; the MoE and attention exposure delay the backward like compute.
  const double busy = out->compute_ms + out->moe_exposed_ms + out->attn_ship_ms;
  const double stretch = p->compute_ms > 0 ? busy / p->compute_ms : 1.0;
  loom_plan_tensor_t *t = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof *t);
  loom_plan_choice_t *ch = calloc((size_t)(p->ntensors ? p->ntensors : 1), sizeof *ch);
  if (!t || !ch) {
    free(t);
    free(ch);
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_sim: out of memory for %d tensors", p->ntensors);
  }
  for (int i = 0; i < p->ntensors; i++) {
    t[i] = p->tensors[i];
    t[i].ready_us *= stretch;
    if (t[i].ready_us > 1000.0 * busy) {
      t[i].ready_us = 1000.0 * busy;
    }
  }
  // The planner's simulator takes the tensors in the order they become ready (a profile lists
  // them in the trainer's order: train_gpt's embeddings first, ready last).
  qsort(t, (size_t)p->ntensors, sizeof *t, by_ready);
  // A ring allreduce on one node runs every rank's flow at once (a shared link splits); across
  // nodes one flow per node crosses its NIC.
  loom_plan_problem_t prob = {.ntensors = p->ntensors,
                              .tensors = t,
                              .compute_us = 1000.0 * busy,
                              .ranks = ranks,
                              .nodes = nodes,
                              .intra = c->intra,
                              .inter = c->inter,
                              .ncodecs = p->ncodecs,
                              .codecs = p->codecs,
                              .workers = 1};
  prob.intra.gbps = rate(&c->intra, c->intra_shared, on_node) / 125.0;
  // Ranks fill the nodes in turn: a last node with fewer of them leaves the nodes unequal, and
  // loom's float allreduce then runs its flat scheme across them.
  prob.flat_node_ranks = nodes > 1 && ranks % rpn != 0 ? rpn : 0;
  loom_plan_result_t r = {.step_us = 1000.0 * busy};
  if (p->ntensors > 0 && s->grad == LOOM_SIM_GRAD_PLAN) {
    st = loom_plan_greedy(&prob, ch, &r);
  } else if (p->ntensors > 0) {
    for (int i = 0; i < p->ntensors; i++) {
      ch[i] = (loom_plan_choice_t){.codec = s->grad >= 0 ? s->grad : -1,
                                   .scheme = LOOM_SCHEME_DIVISIBLE,
                                   .lane = 0}; // the compute lane
    }
    st = loom_plan_simulate(&prob, ch, &r);
  }
  free(t);
  free(ch);
  if (st != LOOM_OK) {
    return st;
  }
  // The step ends no earlier than the compute: a difference below zero is rounding (the
  // simulator works in us), which would print as -0.00.
  const double exposed = r.step_us / 1000.0 - busy;
  out->grad_exposed_ms = exposed > 0.0 ? exposed : 0.0;
  out->grad_bytes = r.bytes_per_rank;
  out->step_ms = r.step_us / 1000.0 + p->overhead_ms * oversub;
  out->tokens_per_s = out->step_ms > 0 ? 1000.0 * ranks * (double)p->tokens / out->step_ms : 0.0;
  out->grad_strategy = s->grad == LOOM_SIM_GRAD_NONE   ? "none"
                       : s->grad == LOOM_SIM_GRAD_PLAN ? "plan"
                                                       : p->codecs[s->grad].compressor;
  return LOOM_OK;
}
