/* loom_plan.h — the ByteComp compression planner as pure functions: a step-timeline simulator
 * (compute, comm and worker lanes) and the greedy per-tensor choice, plus brute force. */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom_compress.h"
#include "loom_moe.h"
#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// What the planner knows, all times in microseconds. Nothing here calls MPI: profiles and
// models are measured elsewhere (or made up by a test) and passed in.

// A link class: a message of b bytes takes alpha_us + b / (gbps * 125) microseconds
// (gbps in Gbit/s; 125 bytes per microsecond per Gbit/s).
typedef struct loom_link {
  double alpha_us;
  double gbps;
} loom_link_t;

// Cost of one compressor on one lane: encoding n values takes enc_us + enc_ns * n / 1000
// microseconds, decoding (and adding) one payload of n values dec_us + dec_ns * n / 1000;
// a payload of n values is bytes_per_value * n + fixed_bytes bytes.
typedef struct loom_codec_cost {
  const char *compressor; // a spec for loom_compressor_create ("fp16", "topk:0.01")
  double enc_us, enc_ns, dec_us, dec_ns;
  double bytes_per_value, fixed_bytes;
} loom_codec_cost_t;

// One gradient tensor as profiled without compression: n f32 values, ready ready_us after the
// start of the step (the backward pass produces them in this order).
typedef struct loom_plan_tensor {
  const char *name;
  int64_t n;
  double ready_us;
} loom_plan_tensor_t;

typedef struct loom_plan_problem {
  int ntensors;
  const loom_plan_tensor_t *tensors; // (ntensors), in ready order
  double compute_us;                 // the step's compute time (the backward ends before it)
  int ranks, nodes;                  // the data-parallel group: ranks over nodes (>= 1 each)
  loom_link_t intra, inter;          // inside a node, between nodes
  int ncodecs;
  const loom_codec_cost_t *codecs; // (ncodecs): the compressors to consider, besides none
  int workers;                     // worker-lane threads for offloaded encoding (0: none)
  // GPU builds (ByteComp's GPU and CPU encoding lanes). gpu_codecs non-NULL says the gradients
  // live on a GPU, and gpu_codecs[c] is what codecs[c] costs there (the CUDA codecs; the same
  // payload sizes). A compressed tensor then encodes, and decodes, either on
  // LOOM_PLAN_LANE_GPU: the device codec, no copy, on the GPU's compute stream (so, like the
  // compute lane, it delays the compute after it); indivisible and divisible schemes of payload
  // codecs only (the device path's schemes); or, when host_lanes is set, on LOOM_LANE_WORKER:
  // the CPU beside the GPU, with the host codec (codecs[c]) after a device-to-host copy of the
  // tensor over pcie and before a host-to-device copy of the sum (any scheme the host has; one
  // queue, workers is not used). LOOM_LANE_COMPUTE is no lane of a GPU problem. Left zero: the
  // host problem above, simulated and planned exactly as without these fields.
  const loom_codec_cost_t *gpu_codecs; // (ncodecs) or NULL
  int host_lanes;                      // with gpu_codecs: the CPU lane may be chosen
  loom_link_t pcie;                    // with host_lanes: one host <-> device copy
  // How an uncompressed allreduce crosses the nodes. 0: loom's hierarchical scheme (nodes of
  // equal sizes, LOOM_HIER_ALLREDUCE=auto): each node link carries a ring's bytes. L > 0: the
  // flat scheme (nodes of unequal sizes, or the tunable off), L the ranks on the fullest node:
  // every rank's blocks for other nodes cross its node's link, L 2 (ranks - L) / ranks of the
  // tensor each way on the fullest one.
  int flat_node_ranks;
} loom_plan_problem_t;

// The lane of a choice that encodes on the GPU (a GPU problem: gpu_codecs set).
#define LOOM_PLAN_LANE_GPU 3

// The strategy for one tensor: codec -1 is no compression (an ordered allreduce; scheme and
// lane ignored), else an index into problem.codecs with a scheme and the lane that encodes and
// decodes (LOOM_LANE_COMPUTE delays the compute after it; LOOM_LANE_WORKER runs beside it; on a
// GPU problem LOOM_PLAN_LANE_GPU or LOOM_LANE_WORKER, the CPU).
typedef struct loom_plan_choice {
  int codec;
  loom_scheme_t scheme;
  int lane; // 0: compute, 2: worker (the loom_lane_t values), 3: LOOM_PLAN_LANE_GPU
} loom_plan_choice_t;

// The simulated step under a strategy (choice[i] for tensor i).
typedef struct loom_plan_result {
  double step_us;        // the simulated step: compute (delayed by encodes on it) and comm end
  double exposed_us;     // step_us - compute_us
  double comm_us;        // comm lane busy time
  double bytes_per_rank; // sent by a rank per step
} loom_plan_result_t;

// Simulate one step. LOOM_ERR_INVALID_ARG names a bad problem or choice.
LOOM_API loom_status_t loom_plan_simulate(const loom_plan_problem_t *p,
                                          const loom_plan_choice_t *choice,
                                          loom_plan_result_t *out);

// ByteComp's greedy selection: tensors by size, largest first; for each, every option (none, and
// each codec x scheme that applies, encoded on the compute lane; on a GPU problem on the GPU lane
// and, with host_lanes, the CPU lane) is simulated with the choices made so far, and an option is
// kept only where it shortens the predicted step (so a tensor whose communication hides in the
// compute keeps none); the search stops once no communication is exposed.
// Then encodings are moved to the worker lane (on a GPU problem with host_lanes: the CPU),
// farthest from the output first, while that shortens the step. choice receives ntensors
// entries.
LOOM_API loom_status_t loom_plan_greedy(const loom_plan_problem_t *p, loom_plan_choice_t *choice,
                                        loom_plan_result_t *out);

// Exhaustive search over every option of every tensor (options^ntensors simulations): for
// tests and small cases; LOOM_ERR_INVALID_ARG beyond 2e6 combinations.
LOOM_API loom_status_t loom_plan_brute_force(const loom_plan_problem_t *p,
                                             loom_plan_choice_t *choice, loom_plan_result_t *out);

// Print the plan as a table (tensor, bytes, ready, scheme, compressor, lane, predicted comm
// end) and the predicted step to out.
LOOM_API void loom_plan_print(const loom_plan_problem_t *p, const loom_plan_choice_t *choice,
                              const loom_plan_result_t *r, FILE *out);

// ---- measurements for the planner (plan_measure.c) -------------------------------------------

// The links of group g by class, as an allreduce loads them: alpha from 8-byte and the
// bandwidth from 4 MiB exchanges both ways (well under a second even at 1 Gbit/s) between group
// rank 0 and the first other rank on its node (intra) and the first rank on another node
// (inter), given to every rank with the number of nodes g spans. A class without a pair takes
// the other's figures. LOOM_NET_ALPHA_US and LOOM_NET_GBPS, when above 0, replace the network's
// measured value: the inter-node link, or on one node its only link. Collective over g (a
// single rank gets the tunables, or an unlimited link).
typedef struct loom_plan_links {
  loom_link_t intra, inter;
  int nodes;
  int flat_node_ranks; // as loom_plan_problem_t's: 0, or the fullest node's ranks when the
                       // group's float allreduce runs the flat scheme across nodes
} loom_plan_links_t;
LOOM_API loom_status_t loom_plan_measure_links(const loom_ctx_t *ctx, const loom_group_t *g,
                                               loom_plan_links_t *out);
// spec's encode and decode cost on this core and its payload size, from runs at 2^14 and 2^20
// values (a fraction of a second). out->compressor points at spec. powersgd is
// LOOM_ERR_UNSUPPORTED (no payload codec to time). The figures are cached in a file per host
// and build, codec-costs-HOST-BUILD.txt under $LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else
// ~/.cache/loom; a damaged line is ignored and measured again; LOOM_CODEC_REMEASURE=1 skips
// the cache.
LOOM_API loom_status_t loom_plan_measure_codec(const char *spec, loom_codec_cost_t *out);
// The same on CUDA device `device` with the CUDA codecs (the gpu_codecs of a GPU problem): x,
// payload and sum in device memory, each call timed on the host up to the end of its kernels
// (so the waits for the stream that a device encode makes are included); 2^14 and 2^20 values,
// not cached (a few milliseconds). LOOM_ERR_UNSUPPORTED in a build without CUDA or for
// powersgd; LOOM_ERR_CUDA when the device cannot be used.
LOOM_API loom_status_t loom_plan_measure_codec_device(const char *spec, int device,
                                                      loom_codec_cost_t *out);
// The host <-> device copy link of CUDA device `device` (a GPU problem's pcie, for its CPU lane):
// copies between pinned host memory and the device on a stream of their own, timed on the host
// to their end, each sample the mean of one copy each way; alpha and the bandwidth from the line
// through the medians at 64 KiB and 16 MiB (the codecs' fit; a few tens of milliseconds, not
// cached). LOOM_ERR_UNSUPPORTED in a build without CUDA; LOOM_ERR_CUDA when the device cannot be
// used.
LOOM_API loom_status_t loom_plan_measure_pcie(int device, loom_link_t *out);

// ---- MoE tuning (moe_tune.c) ------------------------------------------------------------------

// The tile sizes of an MoE layer: row chunks per (source, expert) block and column slices of the
// second GEMM (see loom_moe.h). Small tiles let MPI move messages between them and start the
// combine early; large ones run the GEMMs faster. The best split depends on the shape, the rank
// count and the link, so it is measured.
typedef struct loom_moe_tuning {
  int chunks, slices;
  double ms; // forward + backward, median of the slowest rank
} loom_moe_tuning_t;

// Time forward + backward of a layer of cfg's shape and overlap mode (its chunks and col_slices
// ignored) on tokens tokens per rank for every chunks x slices in {1, 2, 4, 8} x {1, 2, 4, 8},
// iters times each after one warm-up, keep the fastest, print the table on rank 0 to out (NULL:
// quiet) and append the result to the cache file moe-tune-HOST-BUILD.txt (in $LOOM_CACHE_DIR,
// else $XDG_CACHE_HOME/loom, else ~/.cache/loom). Collective over ep (NULL: this rank alone).
LOOM_API loom_status_t loom_moe_tune(loom_ctx_t *ctx, const loom_group_t *ep,
                                     const loom_moe_config_t *cfg, int64_t tokens, int iters,
                                     FILE *out, loom_moe_tuning_t *best);
// Fill cfg->chunks and cfg->col_slices where they are 0 from the cached tuning of the same shape
// (experts, top-k, hidden, ffn, ep size np, overlap mode; cfg->overlap DEFAULT means the
// LOOM_MOE_OVERLAP tunable of ctx) nearest in tokens. Returns 1 when an entry was used, 0 when
// there is none (cfg unchanged: the layer then takes 4 chunks and 4 slices). Collective over
// agree, the ranks that must take the same split (at least the layer's group): its rank 0's
// cache decides (NULL: this rank alone). The cache is untrusted: lines that do not parse into
// sane values are ignored.
LOOM_API int loom_moe_tuned(const loom_ctx_t *ctx, const loom_group_t *agree,
                            loom_moe_config_t *cfg, int np, int64_t tokens);

#ifdef __cplusplus
}
#endif
#endif
