/* compress_auto.h — --compress auto for the example trainers: profile the first steps, measure
 * the link and the compressors, plan per tensor with loom_plan_greedy on rank 0, broadcast. */
#ifndef LOOM_EXAMPLES_COMPRESS_AUTO_H
#define LOOM_EXAMPLES_COMPRESS_AUTO_H

#include "loom.h"

#define EX_AUTO_PROFILE_STEPS 6 // uncompressed steps profiled (the first is a warm-up)

typedef struct ex_auto {
  int nt; // gradient tensors (allreduce tasks), in the order the trainer numbers them
  const loom_tensor_t **t;    // (nt) the gradients (names and sizes)
  double *ready_sum;          // (nt) ms after the step start when each allreduce started, summed
  double compute_sum;         // ms of compute per step, summed
  int samples;                // profiled steps summed (after the warm-up)
  loom_compressor_t *cand[4]; // the candidates auto considers
  int ncand;
  int *codec;                   // (nt) after planning: an index into cand, or -1 for none
  loom_scheme_t *scheme;        // (nt)
  double predicted_ms, none_ms; // the plan's simulated step, and the all-none one
  int device; // where the gradients live: LOOM_DEVICE_HOST (ex_auto_init's), or a CUDA device:
              // then the plan is a GPU problem (ByteComp's GPU lane: the CUDA codecs' costs,
              // measured there; the trainers encode device gradients on the GPU only, so the
              // CPU lane is not offered)
} ex_auto_t;

// Allocates the profile for nt tensors; the candidates are fp16 and int8 (low error: top-k and
// sign compressors change the loss too much to be chosen on speed alone).
int ex_auto_init(ex_auto_t *a, int nt, const loom_tensor_t **t);
void ex_auto_free(ex_auto_t *a);
// Record one profiled step: ready[i] is when tensor i's allreduce started (ms after the step
// began), compute_ms the step's compute. Step 0 is ignored (warm-up).
void ex_auto_record(ex_auto_t *a, long step, const double *ready, double compute_ms);
// Measure (collective over dp), plan on rank 0, broadcast; rank 0 prints the plan.
loom_status_t ex_auto_plan(ex_auto_t *a, const loom_ctx_t *ctx, const loom_group_t *dp);

#endif
