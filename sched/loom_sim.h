/* loom_sim.h — the step-time simulator: a profile recorded by a real run (train_gpt --profile)
 * and a cluster description in, the predicted step and its breakdown at any rank count out. */
#ifndef LOOM_SIM_H
#define LOOM_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "loom_core.h"
#include "loom_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

// What one rank of a real run did per step (means after the warm-up steps), all times in ms.
// Written by train_gpt --profile (loom_sim_profile_save), read by loom_sim. The file is text,
// one record per line (see loom_sim_profile_save); the loader treats it as untrusted.
typedef struct loom_sim_profile {
  int np;               // ranks of the profiled run
  int64_t tokens;       // tokens per rank per step
  int64_t ctx;          // the longest document a row holds
  double compute_ms;    // busy time of the compute lane per step (attention and MoE included)
  double step_ms;       // the measured step
  double overhead_ms;   // wall - compute - exposed communication: launch, polling, idle
  double attn_ms;       // core attention (forward + backward, through the servers when on)
  double attn_pairs;    // causal (query, key) pairs per rank per step, summed over the layers
  double attn_q_bytes;  // bytes an attention server ships per query row, every layer, both
  double attn_kv_bytes; // passes (Q out, O and LSE back, dO, dQ...), and per key/value row
  int moe_layers;       // MoE layers (0: dense)
  int moe_experts, moe_topk, moe_hidden;
  double moe_ms;          // expert GEMMs (forward + backward, every MoE layer) per step
  double moe_fine_hidden; // fraction of the all-to-all fine overlap hides (moe_perf measures it)
  int moe_steps;          // steps with recorded routing
  double *moe_load;       // (moe_steps x moe_experts) assignments per expert in each step
  int ntensors;
  loom_plan_tensor_t *tensors; // (ntensors) gradients in ready order: name, floats, ready (us)
  int ncodecs;
  loom_codec_cost_t *codecs; // (ncodecs) measured compressor costs
  int ndocs;
  int64_t *docs;  // (ndocs) document lengths of the batches the run trained on, batch by batch
  int nbatches;   // batches in docs (0: docs are a plain sample, drawn one by one)
  int *batch_end; // (nbatches) batch k is docs[batch_end[k - 1] .. batch_end[k])
  double attn_row_cost;    // pairs one query row costs besides its pairs (the balancer's row_cost;
                           // 0: pairs only, as in profiles that predate it)
  double attn_exchange_ms; // the part of attn_ms the attention servers spent outside their
                           // kernels (packing, copying, MPI, waiting for peers) in a run of np >= 2
                           // ranks; 0 in a run of one rank, which exchanges nothing. An np 1
                           // profile cannot see what the exchanges cost: record the attention
                           // servers' profile at np >= 2.
} loom_sim_profile_t;

// Write p to path (text; see the format in sim.c). LOOM_ERR_SYSTEM names the path on failure.
LOOM_API loom_status_t loom_sim_profile_save(const char *path, const loom_sim_profile_t *p);
// Read a profile. Every number is range-checked; a malformed or truncated file is
// LOOM_ERR_CORRUPT naming the line and what is wrong, a missing file LOOM_ERR_SYSTEM. On error
// *p is empty. Free with loom_sim_profile_free.
LOOM_API loom_status_t loom_sim_profile_load(const char *path, loom_sim_profile_t *p);
LOOM_API void loom_sim_profile_free(loom_sim_profile_t *p);

// A cluster: nodes of ranks_per_node ranks on cores_per_node cores, links inside a node and
// between nodes. A shared link's bandwidth is split among the node's ranks that use it at once
// (a node's NIC; on one machine, a rate-limited loopback); otherwise every rank has it whole.
typedef struct loom_sim_cluster {
  char name[64];
  int nodes, ranks_per_node, cores_per_node;
  loom_link_t intra, inter;
  int intra_shared, inter_shared;
  double timeshare; // a core holding K > 1 ranks runs their step K (1 + timeshare) times as
                    // long (context switches, caches refilled; tests/bench/timeshare_perf)
} loom_sim_cluster_t;

// Parse a cluster description (lines "key value...", '#' starts a comment to the end of a line):
//   name NAME / nodes N / ranks_per_node R / cores_per_node C
//   intra ALPHA_US GBPS [shared] / inter ALPHA_US GBPS [shared] / timeshare F (default 0)
// A missing key or a bad value is LOOM_ERR_INVALID_ARG naming the line and the fix.
LOOM_API loom_status_t loom_sim_cluster_load(const char *path, loom_sim_cluster_t *c);

// A strategy to predict.
typedef enum loom_sim_grad {
  LOOM_SIM_GRAD_NONE = -2, // uncompressed ordered allreduces
  LOOM_SIM_GRAD_PLAN = -1, // the compression planner's plan (loom_plan_greedy)
  // >= 0: profile codec k on every tensor (divisible scheme, encoded on the compute lane)
} loom_sim_grad_t;

typedef struct loom_sim_strategy {
  int grad;         // loom_sim_grad_t or a codec index
  int moe_overlap;  // loom_moe_overlap_t NONE, COARSE or FINE (ignored without MoE layers)
  int attn_servers; // 0: off; 1: in place (every rank trains and serves)
  int ep_size;      // expert-parallel group size (LOOM_EP_SIZE; capped at the ranks and the
                    // experts); 0: all the ranks, up to one expert each
} loom_sim_strategy_t;

// The predicted step of one rank count, in ms.
typedef struct loom_sim_result {
  int ranks, nodes;
  double step_ms;            // everything below, overlapped as modelled
  double compute_ms;         // the slowest rank's compute (oversubscription, attention straggler)
  double attn_imbalance;     // max / mean attention load over the ranks (1 without documents)
  double attn_ship_ms;       // attention servers: shipping Q/K/V and outputs (exposed)
  double moe_a2a_ms;         // MoE all-to-all time per step
  double moe_exposed_ms;     // the part of it the overlap mode does not hide
  double moe_imbalance;      // max / mean expert work over the expert-parallel ranks
  double grad_exposed_ms;    // gradient synchronisation not hidden behind the compute
  double grad_bytes;         // bytes a rank sends per step for the gradients
  double tokens_per_s;       // ranks * tokens / step
  const char *grad_strategy; // "none", "plan" or the codec's spec
} loom_sim_result_t;

// Predict one step at ranks ranks (1 .. nodes * ranks_per_node) of cluster c under s. The
// attention imbalance is estimated by packing documents drawn from the profile's sample (seeded)
// into every rank's rows. LOOM_ERR_INVALID_ARG names a bad argument.
LOOM_API loom_status_t loom_sim_predict(const loom_sim_profile_t *p, const loom_sim_cluster_t *c,
                                        int ranks, const loom_sim_strategy_t *s, uint64_t seed,
                                        loom_sim_result_t *out);

#ifdef __cplusplus
}
#endif
#endif
