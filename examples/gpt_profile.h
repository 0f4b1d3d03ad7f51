/* gpt_profile.h — train_gpt --profile: per-step means after the warm-up (compute, gradient ready
 * times, attention and MoE time, document lengths) written as a loom_sim profile. */
#ifndef LOOM_EXAMPLES_GPT_PROFILE_H
#define LOOM_EXAMPLES_GPT_PROFILE_H

#include "gpt_data.h"
#include "gpt_model.h"
#include "loom.h"
#include "loom_sched.h"

#define GPT_PROFILE_MAX_DOCS  20000  // document lengths kept for the simulator's draws
#define GPT_PROFILE_MOE_STEPS 1000   // steps whose MoE routing the profile keeps
#define GPT_PROFILE_MAX_STEPS 100000 // steps whose times are kept for the medians

typedef struct gpt_profile {
  long from;                  // the first profiled step (the ones before are warm-up)
  long steps;                 // profiled steps so far
  double compute_ms, wall_ms; // summed per-step statistics of the scheduler
  double exposed_ms;
  double *step_compute, *step_wall, *step_idle; // (steps, up to GPT_PROFILE_MAX_STEPS) per step
  double *step_exchange; // (steps) the attention servers' time outside their kernels (ms)

  int nslots;
  double *ready_ms;       // (nslots) summed ready times of the gradient allreduces
  double attn_s0, moe_s0; // the model's attention and MoE timers at the first profiled step
  double pairs;           // summed causal pairs per layer
  int64_t *docs;          // (ndocs) document lengths of the profiled batches
  int ndocs;
  int *batch_end; // (nbatches) where each batch's documents end in docs
  int nbatches;
  double *moe_load; // (moe_steps x experts) assignments per expert, every MoE layer summed
  int moe_steps, moe_experts;
} gpt_profile_t;

// Profile the steps from `from` on, nslots gradient allreduces. Returns 0 or -1 (out of memory).
int gpt_profile_init(gpt_profile_t *pf, long from, int nslots);
void gpt_profile_free(gpt_profile_t *pf);
// Record step `step` (ignored before pf->from): its statistics, ready[k] the ms after the step
// start when slot k's allreduce started, the batch it trained on, the model's timers and the
// attention servers' time outside their kernels in the step (ms, 0 without servers).
void gpt_profile_step(gpt_profile_t *pf, long step, const loom_step_stats_t *ss,
                      const double *ready, const gpt_batch_t *b, const gpt_model_t *m,
                      double attn_exchange_ms);
// Write the profile (rank 0): the means, the gradients (slot_t names and sizes), the costs of
// the fp16 and int8 codecs on this core, the attention row cost (attn_row_cost, or measured on
// this core when it is < 0) and, when np >= 2, the median exchange time. Returns 0 or -1
// (printed).
int gpt_profile_write(const gpt_profile_t *pf, const char *path, const gpt_model_t *m,
                      const loom_tensor_t *const *slot_t, int np, int64_t tokens, int moe_topk,
                      double attn_row_cost);

#endif
