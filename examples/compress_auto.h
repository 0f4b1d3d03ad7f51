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
  int *lane;                    // (nt) the lane that encodes (loom_plan_choice_t.lane; 0 before
                                // planning): on a device LOOM_PLAN_LANE_GPU, or LOOM_LANE_WORKER
                                // for the CPU (ex_auto_cpu: staged through pinned host memory)
  double predicted_ms, none_ms; // the plan's simulated step, and the all-none one
  int device; // where the gradients live: LOOM_DEVICE_HOST (ex_auto_init's), or a CUDA device:
              // then the plan is a GPU problem: ByteComp's GPU lane (the CUDA codecs' costs,
              // measured there) and, unless LOOM_PLAN_LANE=gpu, its CPU lane (the host codecs
              // after a copy over the measured PCIe link); LOOM_PLAN_LANE=cpu moves every
              // compressed tensor to the CPU
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
// The line that closes a run with a plan: predicted against measured ms a step over the steps
// after planning, or, for a plan that came with a checkpoint, the measured time only. digits:
// decimals of the times.
void ex_auto_report(const ex_auto_t *a, double planned_wall_ms, long planned_steps, int digits);
// 1 when the plan encodes tensor i on the CPU of a device run (compressed, LOOM_LANE_WORKER).
int ex_auto_cpu(const ex_auto_t *a, int i);
// LOOM_PLAN_LANE as set (auto, gpu or cpu; case-insensitive): EX_LANE_AUTO, _GPU or _CPU.
enum { EX_LANE_AUTO = 0, EX_LANE_GPU, EX_LANE_CPU };
int ex_lane_mode(const loom_ctx_t *ctx);

#endif
