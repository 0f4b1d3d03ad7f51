/* compress_auto.c — --compress auto: profile, measure, plan (ByteComp greedy) and broadcast
 * the per-tensor choice; the trainer applies it to its gradient allreduce tasks. */
#include "compress_auto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const candidates[] = {"fp16", "int8"};

int ex_auto_init(ex_auto_t *a, int nt, const loom_tensor_t **t) {
  memset(a, 0, sizeof *a);
  a->nt = nt;
  a->t = t;
  a->device = LOOM_DEVICE_HOST;
  a->ready_sum = calloc((size_t)nt + 1, sizeof(double));
  a->codec = malloc(sizeof(int) * ((size_t)nt + 1));
  a->scheme = malloc(sizeof(loom_scheme_t) * ((size_t)nt + 1));
  a->lane = calloc((size_t)nt + 1, sizeof(int));
  if (!a->ready_sum || !a->codec || !a->scheme || !a->lane) {
    return -1;
  }
  for (int i = 0; i < nt; i++) {
    a->codec[i] = -1;
    a->scheme[i] = LOOM_SCHEME_DIVISIBLE;
  }
  for (size_t k = 0; k < sizeof candidates / sizeof candidates[0]; k++) {
    if (loom_compressor_create(candidates[k], &a->cand[a->ncand]) != LOOM_OK) {
      return -1;
    }
    a->ncand++;
  }
  return 0;
}

void ex_auto_free(ex_auto_t *a) {
  free(a->ready_sum);
  free(a->codec);
  free(a->scheme);
  free(a->lane);
  for (int k = 0; k < a->ncand; k++) {
    loom_compressor_destroy(a->cand[k]);
  }
  memset(a, 0, sizeof *a);
}

void ex_auto_record(ex_auto_t *a, long step, const double *ready, double compute_ms) {
  if (step == 0) {
    return;
  }
  for (int i = 0; i < a->nt; i++) {
    a->ready_sum[i] += ready[i];
  }
  a->compute_sum += compute_ms;
  a->samples++;
}

loom_status_t ex_auto_plan(ex_auto_t *a, const loom_ctx_t *ctx, const loom_group_t *dp) {
  loom_status_t status = LOOM_OK;
  const int rank = loom_group_rank(dp), np = loom_group_size(dp);
  loom_plan_links_t link;
  status = loom_plan_measure_links(ctx, dp, &link);
  if (status != LOOM_OK) {
    return status;
  }
  // Plan on rank 0 (its profile and its core's codec costs), then everyone applies the same.
  int *msg = calloc(3 * (size_t)a->nt + 2, sizeof(int)); // codec, scheme, lane; status
  loom_plan_tensor_t *pt = calloc((size_t)a->nt + 1, sizeof *pt);
  loom_plan_choice_t *ch = calloc((size_t)a->nt + 1, sizeof *ch);
  int *order = calloc((size_t)a->nt + 1, sizeof(int));
  double pred[2] = {0.0, 0.0};
  if (!msg || !pt || !ch || !order) {
    status = LOOM_ERR_NOMEM;
    goto done;
  }
  if (rank == 0) {
    loom_codec_cost_t cost[4], gpu_cost[4];
    for (int k = 0; k < a->ncand && status == LOOM_OK; k++) {
      status = loom_plan_measure_codec(loom_compressor_name(a->cand[k]), &cost[k]);
    }
    for (int k = 0; a->device != LOOM_DEVICE_HOST && k < a->ncand && status == LOOM_OK; k++) {
      status =
          loom_plan_measure_codec_device(loom_compressor_name(a->cand[k]), a->device, &gpu_cost[k]);
    }
    // On a device, the CPU lane (unless LOOM_PLAN_LANE=gpu) costs a copy each way over PCIe.
    const int mode = ex_lane_mode(ctx),
              cpu_lane = a->device != LOOM_DEVICE_HOST && mode != EX_LANE_GPU;
    loom_link_t pcie = {0.0, 0.0};
    const loom_status_t pcie_status = cpu_lane ? loom_plan_measure_pcie(a->device, &pcie) : LOOM_OK;
    const double s = a->samples > 0 ? (double)a->samples : 1.0;
    // The planner takes the tensors in ready order: order[j] is the j-th ready tensor
    // (insertion sort: a trainer has tens of gradient tensors).
    for (int i = 0; i < a->nt; i++) {
      int j = i;
      while (j > 0 && a->ready_sum[order[j - 1]] > a->ready_sum[i]) {
        order[j] = order[j - 1];
        j--;
      }
      order[j] = i;
    }
    for (int j = 0; j < a->nt; j++) {
      const loom_tensor_t *t = a->t[order[j]];
      pt[j] = (loom_plan_tensor_t){t->name, loom_tensor_numel(t), 1e3 * a->ready_sum[order[j]] / s};
    }
    loom_plan_problem_t p = {.ntensors = a->nt,
                             .tensors = pt,
                             .compute_us = 1e3 * a->compute_sum / s,
                             .ranks = np,
                             .nodes = link.nodes >= 1 && link.nodes <= np ? link.nodes : 1,
                             .intra = link.intra,
                             .inter = link.inter,
                             .ncodecs = status == LOOM_OK ? a->ncand : 0,
                             .codecs = cost,
                             .workers = 0,
                             .gpu_codecs = a->device != LOOM_DEVICE_HOST ? gpu_cost : NULL,
                             .host_lanes = cpu_lane && pcie_status == LOOM_OK,
                             .pcie = pcie,
                             .flat_node_ranks = link.flat_node_ranks};
    loom_plan_result_t r, rn;
    status = loom_plan_greedy(&p, ch, &r);
    if (status == LOOM_OK && pcie_status != LOOM_OK) { // the device cannot be used: say so
      status = pcie_status;
    }
    if (status == LOOM_OK && cpu_lane && mode == EX_LANE_CPU) { // every compressed one on the CPU
      for (int j = 0; j < a->nt; j++) {
        ch[j].lane = ch[j].codec >= 0 ? LOOM_LANE_WORKER : ch[j].lane;
      }
      status = loom_plan_simulate(&p, ch, &r);
    }
    if (status == LOOM_OK) {
      loom_plan_choice_t *none = calloc((size_t)a->nt + 1, sizeof *none);
      for (int i = 0; none && i < a->nt; i++) {
        none[i].codec = -1;
      }
      if (none && loom_plan_simulate(&p, none, &rn) == LOOM_OK) {
        pred[1] = rn.step_us / 1e3;
      }
      free(none);
      pred[0] = r.step_us / 1e3;
      if (link.nodes > 1) {
        printf("compression plan (auto): %d nodes; links inside a node %.1f us + %.2f Gbit/s, "
               "between nodes %.1f us + %.2f Gbit/s; uncompressed allreduces %s; %d profiled "
               "steps\n",
               link.nodes, link.intra.alpha_us, link.intra.gbps, link.inter.alpha_us,
               link.inter.gbps,
               link.flat_node_ranks > 0 ? "flat across the nodes (unequal nodes, or "
                                          "LOOM_HIER_ALLREDUCE=off)"
                                        : "hierarchical",
               a->samples);
      } else {
        printf("compression plan (auto): link %.1f us + %.2f Gbit/s between ranks 0 and 1 "
               "(one node); %d profiled steps\n",
               link.intra.alpha_us, link.intra.gbps, a->samples);
      }
      if (cpu_lane) {
        printf("compression plan (auto): PCIe %.1f us + %.2f Gbit/s between the GPU and the host "
               "(the CPU lane: host codecs on a pinned copy%s)\n",
               pcie.alpha_us, pcie.gbps,
               mode == EX_LANE_CPU ? ", every one: LOOM_PLAN_LANE=cpu" : "");
      }
      loom_plan_print(&p, ch, &r, stdout);
      fflush(stdout);
      for (int i = 0; i < a->nt; i++) {
        msg[3 * order[i]] = ch[i].codec;
        msg[3 * order[i] + 1] = (int)ch[i].scheme;
        msg[3 * order[i] + 2] = ch[i].lane;
      }
    }
    msg[3 * a->nt] = (int)status;
  }
  MPI_Bcast(msg, 3 * a->nt + 1, MPI_INT, 0, loom_group_comm(dp));
  MPI_Bcast(pred, 2, MPI_DOUBLE, 0, loom_group_comm(dp));
  status = (loom_status_t)msg[3 * a->nt];
  for (int i = 0; i < a->nt && status == LOOM_OK; i++) {
    a->codec[i] = msg[3 * i];
    a->scheme[i] = (loom_scheme_t)msg[3 * i + 1];
    a->lane[i] = msg[3 * i + 2];
  }
  a->predicted_ms = pred[0];
  a->none_ms = pred[1];
done:
  free(msg);
  free(pt);
  free(ch);
  free(order);
  return status;
}

int ex_auto_cpu(const ex_auto_t *a, int i) {
  return a->device != LOOM_DEVICE_HOST && a->codec[i] >= 0 && a->lane[i] == LOOM_LANE_WORKER;
}

int ex_lane_mode(const loom_ctx_t *ctx) {
  const char *v = loom_tunable(ctx, "LOOM_PLAN_LANE"); // checked by loom_init: auto, gpu or cpu
  return v && !strcasecmp(v, "cpu")   ? EX_LANE_CPU
         : v && !strcasecmp(v, "gpu") ? EX_LANE_GPU
                                      : EX_LANE_AUTO;
}

void ex_auto_report(const ex_auto_t *a, double planned_wall_ms, long planned_steps, int digits) {
  const double measured = planned_wall_ms / (double)planned_steps;
  if (a->predicted_ms > 0) {
    printf("compression plan: predicted %.*f ms/step (uncompressed %.*f), measured %.*f ms/step "
           "over the %ld steps after planning (%+.1f%%)\n",
           digits, a->predicted_ms, digits, a->none_ms, digits, measured, planned_steps,
           100.0 * (measured - a->predicted_ms) / a->predicted_ms);
  } else { // the plan came with the checkpoint: nothing was predicted in this run
    printf("compression plan: from the checkpoint, measured %.*f ms/step over %ld steps\n", digits,
           measured, planned_steps);
  }
}
