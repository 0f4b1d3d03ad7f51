/* gpt_model.h — the byte-level GPT of train_gpt on loom's ops: pre-LayerNorm blocks with
 * padding-free causal attention over packed sequences (optionally MoE MLPs), backward per unit. */
#ifndef LOOM_EXAMPLES_GPT_MODEL_H
#define LOOM_EXAMPLES_GPT_MODEL_H

#include <stdint.h>

#include "loom.h"

typedef struct gpt_config {
  int layers;      // L
  int width;       // C (model width)
  int heads;       // H; head size D = C / H
  int ctx;         // T: longest sequence, rows of the position table
  int vocab;       // V: 256 for bytes
  int moe_experts; // 0: every block has the dense MLP; else some blocks have a MoE layer (below)
  int moe_every;   // block l is a MoE block when moe_experts > 0 and (l + 1) % moe_every == 0
  int cuda;        // 1: parameters, optimizer state and activations on CUDA device cuda_device
  int cuda_device; // (local attention only; MoE layers made on the same device); 0: host memory
} gpt_config_t;

// 1 when block l's MLP is a mixture of experts (its fc1/fc2 tensors then hold no elements).
int gpt_block_is_moe(const gpt_config_t *cfg, int l);

// Parameters of one block, in memory order (weights are (out, in) as in torch.nn.Linear).
enum gpt_block_param {
  GPT_LN1_W,
  GPT_LN1_B, // (C) (C)
  GPT_WQ,
  GPT_BQ, // (C, C) (C)
  GPT_WK,
  GPT_BK, // (C, C) (C)
  GPT_WV,
  GPT_BV, // (C, C) (C)
  GPT_WO,
  GPT_BO, // (C, C) (C) attention output projection
  GPT_LN2_W,
  GPT_LN2_B, // (C) (C)
  GPT_FC1_W,
  GPT_FC1_B, // (4C, C) (4C)
  GPT_FC2_W,
  GPT_FC2_B, // (C, 4C) (C)
  GPT_BLOCK_PARAMS
};

// A unit is what one backward task computes and one allreduce averages: unit 0 the embeddings
// (wte (V, C), wpe (T, C)), units 1..L the blocks, unit L+1 the head (final LayerNorm (C) (C),
// lm_head (V, C), not tied to wte). The gradients of a unit are one contiguous buffer.
// Seconds since creation in core attention (forward and backward; through the attention servers
// when they are on, their exchanges included) and in the MoE layers' expert GEMMs: train_gpt
// --profile reads them.
typedef struct gpt_timers {
  double attn_s, moe_compute_s;
} gpt_timers_t;

typedef struct gpt_model {
  gpt_config_t cfg;
  int nparams;                 // tensors: 2 + 16 L + 3
  int nunits;                  // L + 2
  loom_tensor_t *param, *grad; // (nparams) views of flat buffers, in unit order
  loom_tensor_t *m, *v;        // (nparams) AdamW moments
  loom_tensor_t *unit_grad;    // (nunits) the gradients of a unit as one 1-d view
  loom_tensor_t *part_grad;    // (GPT_MAX_PARTS nunits) part p of unit u at [GPT_MAX_PARTS u + p]
  int *unit_first;             // (nunits + 1) tensor index range of each unit
  float *flat[4];              // param, grad, m, v: total floats each (device memory with cuda)
  loom_tensor_t flat_t[4];     // the owning tensors of flat
  int device;                  // LOOM_DEVICE_HOST or the CUDA device of every tensor
  int64_t total;               // parameters in the flat buffers (the MoE layers' not included)
  int64_t matmul_params;       // flat parameters that multiply activations: 12 L C^2 + V C, less
                               // 8 C^2 per MoE block
  // MoE blocks: block l's layer, attached with gpt_model_set_moe (NULL for a dense block), and
  // the AdamW moments of its parameters at [l * LOOM_MOE_PARAM_COUNT + p].
  loom_moe_t **moe;             // (L)
  loom_tensor_t *moe_m, *moe_v; // (L * LOOM_MOE_PARAM_COUNT)
  const loom_group_t *moe_ep;   // the group the MoE layers span (gpt_generate agrees on every
                                // byte over it), or NULL
  gpt_timers_t *timers;         // written by the forward and backward (which take the model const)
  // Gradient accumulation over the micro-batches of a step (train_gpt --accum K): the backward
  // of the first micro-batch overwrites the gradients (grad_add 0), later ones add to them
  // (grad_add 1); each scales the loss's gradient by loss_scale (1/K: the step's loss is the
  // mean of the micro-batches' means); moe_finish 1 marks the last one, after which the MoE
  // expert gradients are divided by the group size once. gpt_model_alloc sets 0, 1, 1: one
  // micro-batch a step.
  int grad_add, moe_finish;
  float loss_scale;
} gpt_model_t;

// Saved activations of the last forward, with room for cap tokens.
typedef struct gpt_layer_acts {
  loom_tensor_t ln1, ln1_mean, ln1_rstd; // (N, C) (N) (N)
  loom_tensor_t q, k, v, att;            // (N, C) each, read as (N, H, D)
  loom_tensor_t lse;                     // (H, N)
  loom_tensor_t xmid;                    // (N, C) x + attention
  loom_tensor_t ln2, ln2_mean, ln2_rstd; // (N, C) (N) (N)
  loom_tensor_t fc, h;                   // (N, 4C) gelu' of fc1's output (the forward writes it
                                         // over that output), and gelu(fc1)
} gpt_layer_acts_t;

typedef struct gpt_acts {
  int64_t cap, n;                        // rows allocated; rows of the last forward
  loom_tensor_t *x;                      // (L + 1) x (N, C): the input of block l; x[L] the last
  gpt_layer_acts_t *layer;               // (L)
  loom_tensor_t lnf, lnf_mean, lnf_rstd; // (N, C) (N) (N)
  loom_tensor_t logits, losses;          // (N, V) (N); logits become dlogits in the backward
  loom_tensor_t dres, dtmp, dy;          // (N, C) backward scratch; dres is d x[l]
  loom_tensor_t dq, dk, dv;              // (N, C)
  loom_tensor_t dfc;                     // (N, 4C)
  loom_tensor_t tokens, pos, target, cu; // the batch of the last forward (device copies on CUDA)
  loom_tensor_t dev_batch;               // CUDA: room for tokens, pos, targets, cu (4 cap + 1 i32)
  loom_tensor_t logits_row;              // CUDA: host copy of one row of logits (generation)
  int device;                            // where the activations live
  float aux;                             // the MoE aux losses of the last forward, summed
  // Attention servers: block l's core attention runs through attn[l] (loom_attn_exec: shipped
  // by a plan over this forward's documents, collective over its group) instead of the local
  // kernel, forward and backward. NULL (the default), or a NULL entry: local attention. The
  // caller owns the executors and sets this for one forward and its backward (not generation).
  loom_attn_exec_t **attn; // (L) or NULL
} gpt_acts_t;

// Allocate the model and its zeroed gradients and moments. LOOM_ERR_INVALID_ARG when the width
// does not divide by the heads.
loom_status_t gpt_model_alloc(gpt_model_t *m, const gpt_config_t *cfg);
void gpt_model_free(gpt_model_t *m); // destroys the attached MoE layers (collective over ep)
// Attach the MoE layer of block l (gpt_block_is_moe; hidden = width): the model owns it from
// now on, and allocates its AdamW moments (on the model's device: a CUDA model takes layers made
// with loom_moe_config_t.device = cfg.cuda_device). Every MoE block needs one before the first
// forward.
loom_status_t gpt_model_set_moe(gpt_model_t *m, int l, loom_moe_t *moe);
// GPT-2 initialisation from seed (the same numbers on every rank): weights N(0, 0.02), the two
// residual projections N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1.
// On a CUDA model the values are made on the host and copied over (the same numbers).
loom_status_t gpt_model_init(gpt_model_t *m, uint64_t seed);
// Activations on the model's device (cfg->cuda); with cuda, tokens, positions, targets and
// cu_seqlens given to gpt_forward on the host are copied to the device each forward.
loom_status_t gpt_acts_alloc(gpt_acts_t *a, const gpt_config_t *cfg, int64_t cap);
void gpt_acts_free(gpt_acts_t *a, const gpt_config_t *cfg);

// Forward over n packed tokens (tokens, pos, targets: (n) i32; cu (nseq + 1) i32 offsets).
// targets may be NULL (generation: logits only). *loss receives the mean cross-entropy, a->aux
// the MoE aux losses (their gradients are part of the backward). With MoE blocks the forward is
// collective over their group: every rank of it calls it the same number of times.
// s (may be NULL) is polled between blocks so that communication progresses.
loom_status_t gpt_forward(const gpt_model_t *m, gpt_acts_t *a, const loom_tensor_t *tokens,
                          const loom_tensor_t *pos, const loom_tensor_t *targets,
                          const loom_tensor_t *cu, float *loss, loom_sched_t *s);
// The backward of unit u of the last forward (with targets): u = L+1 first, then L .. 1, then 0.
// Overwrites the unit's gradients (the mean over the forward's tokens, times m->loss_scale), or
// adds to them when m->grad_add is set, and leaves d x in a->dres for the next unit. s (may be
// NULL) is polled between the big products. The MLP half of a MoE block calls loom_moe_backward
// (collective over its group): its gradients are zeroed and then hold this rank's tokens' share
// (added to them with m->grad_add), the expert gradients divided by the group size when
// m->moe_finish is set (so that the average over the expert-data-parallel group is the mean over
// every rank's tokens).
loom_status_t gpt_backward_unit(gpt_model_t *m, gpt_acts_t *a, int u, loom_sched_t *s);
// A unit's backward in parts, so that a part's gradients can be averaged while the next parts
// are computed. The head and the embeddings have one part. A block has five, run in this order,
// each a contiguous range of the block's buffer ready as soon as its products are done:
//   GPT_PART_FC2  fc2.w, fc2.b  (the first product of the backward; absent in a MoE block)
//   GPT_PART_MLP  ln2, fc1 (a MoE block: ln2, after loom_moe_backward)
//   GPT_PART_WO   wo, bo
//   GPT_PART_QKV  wq, bq, wk, bk, wv, bv (before the products that carry d ln1 back)
//   GPT_PART_LN1  ln1 (the block's last gradients, with d x)
// Finer parts shorten the tail of the step: what is left to average once the backward ends is
// the first block's q, k, v and ln1 and the embeddings, not its whole attention half.
// Run parts 0, 1, ... in order; together they are gpt_backward_unit. Each overwrites (or with
// m->grad_add, adds to) the gradients in m->part_grad[GPT_MAX_PARTS u + p].
enum gpt_block_part { GPT_PART_FC2, GPT_PART_MLP, GPT_PART_WO, GPT_PART_QKV, GPT_PART_LN1 };
#define GPT_MAX_PARTS 5
int gpt_unit_parts(const gpt_model_t *m, int u);
// What part p of unit u is: a gpt_block_part for a block, -1 for the head and the embeddings.
int gpt_part_kind(const gpt_model_t *m, int u, int p);
// "fc2", "mlp", "wo", "qkv" or "ln1" for a block's part, NULL for the head and the embeddings.
const char *gpt_part_name(const gpt_model_t *m, int u, int p);
loom_status_t gpt_backward_part(gpt_model_t *m, gpt_acts_t *a, int u, int p, loom_sched_t *s);
// AdamW on the tensors of unit u (weight decay on the 2-d weights only; in a MoE block on the
// router, w1 and w2, not on the biases b1 and b2).
loom_status_t gpt_update_unit(gpt_model_t *m, int u, const loom_adamw_t *hp);

// Append up to count sampled bytes to text (which holds *len bytes, room for cap) with the
// model's next-byte distribution at temperature temp, seeded. Stops early at a document start.
// With m->moe_ep set (MoE blocks over more than one rank), every rank of that group must call it
// alike: each byte is the pick of the group's rank 0, so all ranks generate the same text.
loom_status_t gpt_generate(const gpt_model_t *m, gpt_acts_t *a, uint8_t *text, int *len, int cap,
                           int count, float temp, uint64_t seed);

#endif
