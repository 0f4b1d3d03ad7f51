/* loom_moe.h — a mixture-of-experts FFN layer with expert parallelism: top-k router, dispatch and
 * combine all-to-all over the expert-parallel group, overlapped with the expert GEMMs (COMET). */
#ifndef LOOM_MOE_H
#define LOOM_MOE_H

#include <stdint.h>

#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// How the all-to-alls overlap the expert compute. Every mode computes the same GEMM tiles and
// sums the weight gradients in the same order, so the modes give the same bits.
//   none    blocking all-to-all (dispatch), every tile, blocking all-to-all (combine)
//   coarse  each (source, expert) block cut into `chunks` row chunks, pipelined as in Tutel:
//           chunk c + 1 travels while chunk c is computed, chunk c returns while c + 1 computes
//   fine    COMET: dispatch and the first GEMM split by token source (this rank's own tokens
//           first, each other source's rows as soon as they land); the second GEMM and the
//           combine split by columns (each column slice is sent as soon as it is computed);
//           the same in the backward (the weight gradients are summed after the dx slices left)
// A layer on a CUDA device (config field device) runs as `none` whatever the mode (an INFO line
// says so once): its dispatch and combine are grouped NCCL sends and receives, and its weight
// gradients are computed while the backward's combine is in flight.
typedef enum loom_moe_overlap {
  LOOM_MOE_OVERLAP_DEFAULT = -1, // the LOOM_MOE_OVERLAP tunable
  LOOM_MOE_OVERLAP_NONE = 0,
  LOOM_MOE_OVERLAP_COARSE,
  LOOM_MOE_OVERLAP_FINE,
  LOOM_MOE_OVERLAP_COUNT
} loom_moe_overlap_t;

// Which assignments a full expert drops (capacity_factor > 0): later tokens first, or the
// lowest router weights first (ties: later tokens).
typedef enum loom_moe_drop { LOOM_MOE_DROP_LATE = 0, LOOM_MOE_DROP_LOW_WEIGHT } loom_moe_drop_t;

typedef struct loom_moe_config {
  int num_experts;        // E over the whole expert-parallel group (a multiple of its size)
  int top_k;              // K experts per token, 1..E
  int64_t hidden;         // H: the model width (tokens are rows of H floats)
  int64_t ffn;            // F: each expert's inner width (gemm H x F, gelu, gemm F x H)
  double capacity_factor; // 0: dropless; else a source keeps at most ceil(cf * T * K / E)
                          // assignments per expert (T its tokens) and drops the rest
  loom_moe_drop_t drop;   // which ones it drops
  float aux_coef;         // weight of the load-balancing loss (0.01 is usual; 0 turns it off)
  int overlap;            // a loom_moe_overlap_t
  int chunks;             // row chunks per (source, expert) block (0: tuned, else 1..64)
  int col_slices;         // column slices of the second GEMM and of dx (0: tuned, else 1..64)
  int poll_tiles;         // test the messages in flight after every this many expert tiles, so
                          // that MPI moves them during the GEMMs (0: every tile; -1: never,
                          // to measure what polling buys)
  uint64_t seed;          // parameter initialisation (expert e's weights depend on e, not on
                          // which rank holds it)
  int device;             // where the parameters, gradients and the tensors of every call live:
                          // LOOM_DEVICE_HOST (loom_moe_config_init's default) or a CUDA device
                          // index (one per rank; loom_gpu(ctx) is this rank's). On a device the
                          // router, the permutation and the expert FFN run as CUDA kernels and
                          // cuBLAS, the all-to-alls over the ep group's NCCL communicator, in one
                          // chunk and one column slice (chunks, col_slices, poll_tiles unused);
                          // the token counts still travel over MPI. Needs loom built with CUDA
                          // and NCCL (else LOOM_ERR_UNSUPPORTED). Every rank of ep must agree on
                          // host or device.
} loom_moe_config_t;

typedef struct loom_moe loom_moe_t;

// Fill cfg with the defaults (dropless, aux 0.01, LOOM_MOE_OVERLAP, tuned chunks and slices, on
// the host); the caller then sets num_experts, top_k, hidden and ffn.
LOOM_API void loom_moe_config_init(loom_moe_config_t *cfg);

// Create the layer on every member of ep (collective over ep; NULL: this rank alone holds every
// expert, the single-rank reference). Rank i of ep holds experts [i E/P, (i+1) E/P). A config
// that differs between the ranks of ep is LOOM_ERR_INVALID_ARG on every rank, naming the field
// and two values, never a hang. ctx gives the tunables (and the tuned chunk sizes).
LOOM_API loom_status_t loom_moe_create(loom_ctx_t *ctx, const loom_group_t *ep,
                                       const loom_moe_config_t *cfg, loom_moe_t **out);
LOOM_API void loom_moe_destroy(loom_moe_t *moe);

// The parameters and their gradients (f32 on cfg.device; the gradients accumulate over backward
// calls until the caller zeroes them). router (H, E) is replicated on every rank (synchronise it
// over the data-parallel group); w1 (El, H, F), b1 (El, F), w2 (El, F, H), b2 (El, H) are this
// rank's El = E / P experts (synchronise them over the expert-data-parallel group).
typedef enum loom_moe_param {
  LOOM_MOE_ROUTER = 0,
  LOOM_MOE_W1,
  LOOM_MOE_B1,
  LOOM_MOE_W2,
  LOOM_MOE_B2,
  LOOM_MOE_PARAM_COUNT
} loom_moe_param_t;
LOOM_API loom_tensor_t *loom_moe_param(loom_moe_t *moe, loom_moe_param_t which);
LOOM_API loom_tensor_t *loom_moe_grad(loom_moe_t *moe, loom_moe_param_t which);
LOOM_API const char *loom_moe_overlap_name(int overlap); // "none", "coarse", "fine"
// Parse "none", "coarse" or "fine". Another name is LOOM_ERR_INVALID_ARG with the valid ones in
// loom_last_error(NULL), not logged: the caller, which knows where the name came from, reports it.
LOOM_API loom_status_t loom_moe_overlap_parse(const char *name, int *out);

// Forward for this rank's T tokens, x (T, H) -> y (T, H); T may differ between ranks and be 0.
// x and y are f32 on the layer's device (on a CUDA device, y is written in the order of the
// calling thread's current stream; the call waits for that stream to read the routing and aux
// on the host). Collective over ep. *aux (may be NULL) receives this rank's load-balancing loss
// (already times aux_coef; add it to the loss). The layer keeps what the backward needs (one
// forward in flight: forward, backward, forward, ...).
LOOM_API loom_status_t loom_moe_forward(loom_moe_t *moe, const loom_tensor_t *x, loom_tensor_t *y,
                                        float *aux);
// Backward of the last forward: dy (T, H) -> dx (T, H) (overwritten, on the layer's device as
// in the forward); the parameter gradients accumulate, the aux loss's gradient (with weight 1)
// included. Collective over ep. Once per forward: a second backward of the same forward, or
// one with no successful forward before it, is LOOM_ERR_STATE (it would add the gradients twice).
LOOM_API loom_status_t loom_moe_backward(loom_moe_t *moe, const loom_tensor_t *dy,
                                         loom_tensor_t *dx);

// What the last forward did, on this rank; the three times are those of the last call, forward
// or backward.
typedef struct loom_moe_stats {
  int num_experts, local_experts, first_expert;
  const int64_t *sent;     // (E) assignments this rank's tokens sent to each expert (kept)
  const int64_t *received; // (El) rows each local expert computed
  int64_t dropped;         // assignments this rank dropped (capacity)
  float aux;               // its aux loss
  double comm_ms, compute_ms, wall_ms; // time in MPI waits, in the expert GEMMs, in the call
                                       // (on a device: in the NCCL waits, which include kernels
                                       // queued before them, and queueing the expert kernels)
} loom_moe_stats_t;
LOOM_API void loom_moe_stats(const loom_moe_t *moe, loom_moe_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif
