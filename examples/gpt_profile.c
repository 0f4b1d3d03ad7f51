/* gpt_profile.c — train_gpt --profile: accumulates the profiled steps and writes them as a
 * loom_sim profile (loom_sim_profile_save) with the measured codec costs. */
#include "gpt_profile.h"

#include "example_util.h"

#include <stdlib.h>
#include <string.h>

#include "loom_plan.h"
#include "loom_sim.h"

int gpt_profile_init(gpt_profile_t *pf, long from, int nslots) {
  memset(pf, 0, sizeof *pf);
  pf->from = from;
  pf->nslots = nslots;
  pf->ready_ms = calloc((size_t)(nslots > 0 ? nslots : 1), sizeof(double));
  pf->docs = calloc(GPT_PROFILE_MAX_DOCS, sizeof(int64_t));
  pf->batch_end = calloc(GPT_PROFILE_MAX_DOCS, sizeof(int));
  pf->step_compute = calloc(GPT_PROFILE_MAX_STEPS, sizeof(double));
  pf->step_wall = calloc(GPT_PROFILE_MAX_STEPS, sizeof(double));
  pf->step_idle = calloc(GPT_PROFILE_MAX_STEPS, sizeof(double));
  pf->step_exchange = calloc(GPT_PROFILE_MAX_STEPS, sizeof(double));
  return pf->ready_ms && pf->docs && pf->batch_end && pf->step_compute && pf->step_wall &&
                 pf->step_idle && pf->step_exchange
             ? 0
             : -1;
}

void gpt_profile_free(gpt_profile_t *pf) {
  free(pf->ready_ms);
  free(pf->docs);
  free(pf->batch_end);
  free(pf->step_compute);
  free(pf->step_wall);
  free(pf->step_idle);
  free(pf->step_exchange);
  free(pf->moe_load);
  memset(pf, 0, sizeof *pf);
}

void gpt_profile_step(gpt_profile_t *pf, long step, const loom_step_stats_t *ss,
                      const double *ready, const gpt_batch_t *b, const gpt_model_t *m,
                      double attn_exchange_ms) {
  if (step < pf->from) {
    pf->attn_s0 = m->timers->attn_s; // the timers as the first profiled step begins
    pf->moe_s0 = m->timers->moe_compute_s;
    return;
  }
  if (pf->steps < GPT_PROFILE_MAX_STEPS) {
    pf->step_compute[pf->steps] = ss->compute_ms;
    pf->step_wall[pf->steps] = ss->wall_ms;
    pf->step_idle[pf->steps] =
        ss->wall_ms - ss->compute_ms - ss->exposed_comm_ms - ss->exposed_worker_ms;
    pf->step_exchange[pf->steps] = attn_exchange_ms;
  }
  pf->steps++;
  pf->compute_ms += ss->compute_ms;
  pf->wall_ms += ss->wall_ms;
  pf->exposed_ms += ss->exposed_comm_ms + ss->exposed_worker_ms;
  for (int k = 0; k < pf->nslots; k++) {
    pf->ready_ms[k] += ready[k];
  }
  pf->pairs += (double)b->attn_pairs;
  const int32_t *cu = b->cu.data;
  // The step's routing: assignments per expert, summed over the MoE layers (the first
  // GPT_PROFILE_MOE_STEPS steps).
  for (int l = 0; l < m->cfg.layers && pf->moe_steps < GPT_PROFILE_MOE_STEPS; l++) {
    if (!m->moe[l]) {
      continue;
    }
    loom_moe_stats_t ms;
    loom_moe_stats(m->moe[l], &ms);
    if (!pf->moe_load) {
      pf->moe_experts = ms.num_experts;
      pf->moe_load = calloc(GPT_PROFILE_MOE_STEPS * (size_t)ms.num_experts, sizeof(double));
      if (!pf->moe_load) {
        break;
      }
    }
    for (int e = 0; e < pf->moe_experts && ms.sent; e++) {
      pf->moe_load[(size_t)pf->moe_steps * pf->moe_experts + e] += (double)ms.sent[e];
    }
  }
  if (pf->moe_load && pf->moe_steps < GPT_PROFILE_MOE_STEPS) {
    pf->moe_steps++;
  }
  if (b->nseq > 0 && pf->ndocs + b->nseq <= GPT_PROFILE_MAX_DOCS) { // whole batches only
    for (int i = 0; i < b->nseq; i++) {
      pf->docs[pf->ndocs++] = cu[i + 1] - cu[i];
    }
    pf->batch_end[pf->nbatches++] = pf->ndocs;
  }
}

int gpt_profile_write(const gpt_profile_t *pf, const char *path, const gpt_model_t *m,
                      const loom_tensor_t *const *slot_t, int np, int64_t tokens, int moe_topk,
                      double attn_row_cost) {
  if (pf->steps < 1) {
    fprintf(stderr,
            "train_gpt: --profile: no step after the warm-up (%ld) was profiled: raise "
            "--steps\n",
            pf->from);
    return -1;
  }
  const double n = (double)pf->steps;
  const int C = m->cfg.width, H = m->cfg.heads, L = m->cfg.layers;
  // Medians of the per-step times (a few slow steps move a mean, not the steady state); the
  // attention and MoE timers, kept as sums, scaled by the same median / mean of the compute.
  const long kept = pf->steps < GPT_PROFILE_MAX_STEPS ? pf->steps : GPT_PROFILE_MAX_STEPS;
  const double compute_med = ex_median(pf->step_compute, kept);
  const double scale = pf->compute_ms > 0 ? compute_med / (pf->compute_ms / n) : 1.0;
  loom_sim_profile_t p = {.np = np,
                          .tokens = tokens,
                          .ctx = m->cfg.ctx,
                          .compute_ms = compute_med,
                          .step_ms = ex_median(pf->step_wall, kept),
                          .attn_ms = scale * 1e3 * (m->timers->attn_s - pf->attn_s0) / n,
                          .attn_pairs = L * pf->pairs / n,
                          // Per layer, forward and backward, f32 (loom_attn_balance_opts_t):
                          // 4 (4 H D + H) per query row and 4 (4 H D) per key/value row.
                          .attn_q_bytes = L * 4.0 * (4.0 * C + H),
                          .attn_kv_bytes = L * 4.0 * 4.0 * C,
                          .moe_ms = scale * 1e3 * (m->timers->moe_compute_s - pf->moe_s0) / n,
                          .ndocs = pf->ndocs,
                          .docs = pf->docs,
                          .nbatches = pf->nbatches,
                          .batch_end = pf->batch_end};
  p.attn_row_cost = attn_row_cost;
  if (p.attn_row_cost < 0 &&
      loom_attn_measure_row_cost(H, H, C / H, 1, &p.attn_row_cost) != LOOM_OK) {
    fprintf(stderr, "train_gpt: --profile: measuring the attention row cost: %s\n",
            loom_last_error(NULL));
    return -1;
  }
  // What the attention servers' exchanges cost: there are none to time on one rank.
  p.attn_exchange_ms = np > 1 ? ex_median(pf->step_exchange, kept) : 0.0;
  p.attn_exchange_ms = p.attn_exchange_ms < p.attn_ms ? p.attn_exchange_ms : p.attn_ms;
  p.overhead_ms = ex_median(pf->step_idle, kept);
  p.overhead_ms = p.overhead_ms > 0 ? p.overhead_ms : 0.0;
  for (int l = 0; l < L; l++) {
    if (m->moe[l]) {
      loom_moe_stats_t ms;
      loom_moe_stats(m->moe[l], &ms);
      p.moe_layers++;
      p.moe_experts = ms.num_experts;
    }
  }
  p.moe_topk = p.moe_layers ? moe_topk : 0;
  p.moe_steps = p.moe_layers && pf->moe_experts == p.moe_experts ? pf->moe_steps : 0;
  p.moe_load = pf->moe_load;
  p.moe_hidden = p.moe_layers ? C : 0;
  // The dense gradients, then each MoE layer's (router and experts, allreduced over their own
  // data-parallel group), ready with the MLP half of their block.
  const int nmoe_t = p.moe_layers * LOOM_MOE_PARAM_COUNT;
  loom_plan_tensor_t *t = calloc((size_t)(pf->nslots + nmoe_t + 1), sizeof *t);
  char(*moe_names)[LOOM_NAME_MAX] = calloc((size_t)nmoe_t + 1, LOOM_NAME_MAX);
  loom_codec_cost_t codecs[2];
  static const char *const specs[2] = {"fp16", "int8"};
  int rc = t && moe_names ? 0 : -1, nt = 0;
  for (int k = 0; rc == 0 && k < pf->nslots; k++) {
    t[nt++] = (loom_plan_tensor_t){.name = slot_t[k]->name,
                                   .n = loom_tensor_numel(slot_t[k]),
                                   .ready_us = 1e3 * pf->ready_ms[k] / n};
  }
  for (int l = 0, j = 0; rc == 0 && l < L; l++) {
    char mlp[LOOM_NAME_MAX];
    snprintf(mlp, sizeof mlp, "grad.h%d.mlp", l);
    double ready = p.compute_ms * 1e3; // the block's MLP half, or the end of the step
    for (int k = 0; k < pf->nslots; k++) {
      ready = strcmp(slot_t[k]->name, mlp) == 0 ? 1e3 * pf->ready_ms[k] / n : ready;
    }
    for (int q = 0; m->moe[l] && q < LOOM_MOE_PARAM_COUNT; q++, j++) {
      snprintf(moe_names[j], LOOM_NAME_MAX, "moe.h%d.%d", l, q);
      t[nt++] = (loom_plan_tensor_t){.name = moe_names[j],
                                     .n = loom_tensor_numel(loom_moe_grad(m->moe[l], q)),
                                     .ready_us = ready};
    }
  }
  for (int k = 0; rc == 0 && k < 2; k++) {
    if (loom_plan_measure_codec(specs[k], &codecs[k]) != LOOM_OK) {
      fprintf(stderr, "train_gpt: --profile: %s\n", loom_last_error(NULL));
      rc = -1;
    }
  }
  if (rc == 0) {
    p.ntensors = nt;
    p.tensors = t;
    p.ncodecs = 2;
    p.codecs = codecs;
    if (loom_sim_profile_save(path, &p) != LOOM_OK) {
      fprintf(stderr, "train_gpt: --profile: %s\n", loom_last_error(NULL));
      rc = -1;
    } else {
      printf("profile: %s: %ld steps after %ld of warm-up: compute %.2f ms (attention %.2f, MoE "
             "experts %.2f), step %.2f ms, %d gradients, %d document lengths (loom_sim "
             "--profile %s --cluster FILE)\n",
             path, pf->steps, pf->from, p.compute_ms, p.attn_ms, p.moe_ms, p.step_ms, pf->nslots,
             pf->ndocs, path);
    }
  } else if (!t) {
    fprintf(stderr, "train_gpt: --profile: out of memory\n");
  }
  free(t);
  free(moe_names);
  return rc;
}
