/* train_gpt.c — data-parallel byte-level GPT on a text corpus (Debian fortunes by default):
 * documents packed without padding into cu_seqlens batches, gradients overlapped with backward. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_auto.h"
#include "example_ckpt.h"
#include "example_util.h"
#include "gpt_data.h"
#include "gpt_model.h"
#include "gpt_profile.h"
#include "mfu_meter.h"
#include "loom.h"

#define MAX_DATA 64

#define TRY(call)                                                                                  \
  do {                                                                                             \
    loom_status_t try_st_ = (call);                                                                \
    if (try_st_ != LOOM_OK) {                                                                      \
      return try_st_;                                                                              \
    }                                                                                              \
  } while (0)

// ---- options ------------------------------------------------------------------------------------

typedef enum sync_mode { SYNC_OVERLAP, SYNC_FUSED, SYNC_NONE, SYNC_COMM_ONLY } sync_mode_t;
static const char *const sync_names[] = {"overlap", "fused", "none", "comm-only"};

typedef struct opts {
  gpt_config_t cfg;
  int batch;  // rows of ctx tokens per rank per step
  long steps; // optimizer steps
  int accum;  // micro-batches a step: --batch rows in accum pieces of batch / accum rows
  double lr, min_lr_frac, wd, beta1, beta2, adam_eps, clip;
  long warmup;
  long seed;
  const char *data[MAX_DATA];
  int ndata;
  double val_frac;
  long val_every;
  int val_rows;
  long log_every;
  int sample;         // bytes generated at the end (0: none)
  int sgemm_reps;     // products timed per kernel for MFU's rate (0: not measured, no MFU)
  long sgemm_every;   // steps between samples of the rate during the run (0: start and end only)
  double temperature; // of the sample
  const char *json, *dump;
  const char *profile; // --profile FILE: a loom_sim profile of this run (rank 0)
  const char *cmp[2];
  double rtol;
  sync_mode_t sync;
  const char *compress; // a compressor spec, or NULL: plain allreduce
  loom_scheme_t scheme; // of the compressed allreduce
  // mixture of experts (o.cfg.moe_experts, o.cfg.moe_every: which blocks)
  int moe_topk, moe_ffn; // moe_ffn 0: 4 x width
  double moe_capacity, moe_aux;
  int moe_overlap;        // a loom_moe_overlap_t, or LOOM_MOE_OVERLAP_DEFAULT (LOOM_MOE_OVERLAP)
  int attn_servers;       // -1: LOOM_ATTN_SERVERS decides; 0 off; 1 inplace; 2 dedicated
  char attn_spec[16];     // --attn-servers as given (passed to loom_init: "inplace" or N)
  double attn_row_cost;   // --attn-row-cost: pairs per query row for the balancer (< 0: measure)
  char attn_spec_eff[16]; // LOOM_ATTN_SERVERS as loom_init took it
  int doc_skew;           // --doc-lengths skewed: synthetic heavy-tailed document boundaries
  int cuda;               // --device cuda: model, optimizer and activations on this rank's GPU
  ex_ckpt_opts_t ck;      // --ckpt, --save-every, --resume, --die-at
  long inject_nan;        // --inject-nan S (testing): a NaN in rank 0's gradient at step S; -1 off
  int help;
} opts_t;

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: mpirun -np N train_gpt [flags]\n"
      "Data-parallel byte-level GPT (pre-LayerNorm, learned positions, GELU MLP, untied head),\n"
      "AdamW with warmup and cosine decay. Documents are packed without padding: each step\n"
      "every rank takes --batch rows of --ctx tokens, a row holds several documents and the\n"
      "attention of each stays inside its own document (variable-length attention over\n"
      "cu_seqlens). The rows of step s are the same whatever N is, so N ranks with --batch B\n"
      "train exactly like 1 rank with --batch N*B.\n"
      "\n"
      "model\n"
      "  --layers N          transformer blocks (default 4)\n"
      "  --width N           model width C (default 256)\n"
      "  --heads N           attention heads, must divide the width (default 4)\n"
      "  --ctx N             row length in tokens, the longest sequence (default 256)\n"
      "training\n"
      "  --batch N           rows per rank per step (default 8)\n"
      "  --accum K           gradient accumulation: each rank's --batch rows as K micro-batches\n"
      "                      of --batch/K rows (forward and backward each, the gradients\n"
      "                      summed; one allreduce and one update a step): the same step in\n"
      "                      1/K of the activation memory (default 1)\n"
      "  --steps N           optimizer steps (default 300)\n"
      "  --lr X              peak learning rate (default 0.001)\n"
      "  --min-lr-frac X     cosine decay ends at X * lr (default 0.1)\n"
      "  --warmup N          linear warmup steps (default 30)\n"
      "  --weight-decay X    AdamW decoupled weight decay on 2-d weights (default 0.1)\n"
      "  --beta1 X, --beta2 X  AdamW moment decay (default 0.9, 0.95)\n"
      "  --adam-eps X        AdamW denominator guard (default 1e-8)\n"
      "  --clip X            clip the global gradient norm to X, 0 = off (default 1)\n"
      "  --seed N            weight init, document shuffle and sampling (default 42)\n"
      "  --device D          host or cuda: cuda keeps the parameters, optimizer state and\n"
      "                      activations on this rank's GPU (LOOM_GPU picks it; NCCL averages\n"
      "                      the gradients, compressed ones too (CUDA codecs, PowerSGD); MoE\n"
      "                      layers dispatch over NCCL; local attention; every --sync mode)\n"
      "                      (default host)\n"
      "data\n"
      "  --data PATH         a text file or a directory of them; repeat for more (default\n"
      "                      %s, Debian package fortunes).\n"
      "                      Documents are separated by lines that hold only %%; a file\n"
      "                      without such lines is one document. Text only: a NUL byte\n"
      "                      (byte 0 starts documents) is an error\n"
      "  --val-frac X        fraction of the documents held out for validation (default 0.05)\n"
      "  --val-every N       validation loss every N steps, 0 = only at the end (default 100)\n"
      "  --val-rows N        validation rows of --ctx tokens (default 32)\n"
      "output\n"
      "  --log-every N       a progress line every N steps (default 10)\n"
      "  --sample N          bytes of text generated at the end by rank 0, 0 = none (default 200)\n"
      "  --temperature X     sampling temperature (default 0.8)\n"
      "  --sgemm-reps N      1024^3 products timed per GEMM kernel for MFU's sgemm rate, at the\n"
      "                      start and the end (the best of N after a warm-up; at 10 about a\n"
      "                      second a rank on one core); 0 = no rate and no MFU (default 10)\n"
      "  --sgemm-every N     sample the rate again every N steps (the best of min(3, reps),\n"
      "                      ~0.2 s, not training time) for the MFU against the rates sampled\n"
      "                      through the run; 0 = the start and the end only (default 20)\n"
      "  --json FILE         final numbers as JSON (rank 0; -1 where a number was not measured,\n"
      "                      null where a loss is not finite)\n"
      "  --profile FILE      write a profile for loom_sim (rank 0): per-step compute, gradient\n"
      "                      sizes and ready times, attention and MoE time, document lengths\n"
      "                      and codec costs; medians (timers: means) after the first steps\n"
      "                      (default none)\n"
      "  --dump-params FILE  every parameter as raw f32 at the end (rank 0, or every rank\n"
      "                      when FILE contains %%r)\n"
      "  --compare A B       compare two dumps without MPI: exit 0 when every element agrees\n"
      "                      within --rtol (default 1e-5), 1 otherwise\n"
      "gradient synchronisation\n"
      "  --sync MODE         overlap: each unit's allreduce starts when its backward is done and\n"
      "                      its AdamW waits only on it (default); fused: one fused allreduce\n"
      "                      after the backward; none: no averaging (timing the compute alone;\n"
      "                      replicas diverge); comm-only: only the allreduces, no compute\n"
      "                      (timing the communication alone)\n"
      "  --no-overlap        the same as --sync fused\n"
      "  --compress SPEC     compress every gradient with SPEC (none, fp16, bf16, int8,\n"
      "                      int8:sr, topk:RATIO, randomk:RATIO, efsign, powersgd:RANK) and\n"
      "                      error feedback, or auto: profile the first steps, then a plan per\n"
      "                      gradient; with --sync overlap or comm-only (default: LOOM_COMPRESS,\n"
      "                      auto).\n"
      "                      On --device cuda, LOOM_PLAN_LANE picks what encodes: gpu (the CUDA\n"
      "                      codecs), cpu (the host codecs on a pinned host copy: ByteComp's CPU\n"
      "                      lane) or auto (the plan's lane per gradient; with SPEC the GPU)\n"
      "  --compress-scheme S indivisible, divisible or hierarchical (default divisible)\n"
      "mixture of experts\n"
      "  --moe-experts E     experts per MoE layer, 0 = dense MLP everywhere (default 0); a\n"
      "                      multiple of LOOM_EP_SIZE: each rank of an expert-parallel group\n"
      "                      holds E / LOOM_EP_SIZE of them\n"
      "  --moe-every N       the MLP of every N-th block is a MoE layer: blocks l with\n"
      "                      (l + 1) %% N == 0 (default 2; 1 = every block)\n"
      "  --moe-topk K        experts per token, 1..E (default 2)\n"
      "  --moe-ffn F         inner width of each expert (default 4 x width, the dense MLP's)\n"
      "  --moe-capacity CF   capacity factor: each rank keeps at most ceil(CF T K / E)\n"
      "                      assignments per expert and drops the rest, 0 = dropless (default 0)\n"
      "  --moe-aux X         weight of the load-balancing loss added to the loss of every MoE\n"
      "                      layer, 0 = off (default 0.01)\n"
      "  --moe-overlap M     none, coarse or fine: how the all-to-alls overlap the expert GEMMs\n"
      "                      (default: LOOM_MOE_OVERLAP)\n"
      "                      The router is averaged over the data-parallel group with the dense\n"
      "                      gradients, the experts over the expert-data-parallel group; MoE\n"
      "                      gradients are never compressed (--compress applies to the rest)\n"
      "attention servers\n"
      "  --attn-servers M    off, inplace or N (default: LOOM_ATTN_SERVERS, 0 = off; the\n"
      "                      environment wins over the flag). inplace: every step the ranks\n"
      "                      share their sequence lengths, the balancer (tolerance 0.1) cuts\n"
      "                      the causal attention of long sequences into query shards and\n"
      "                      moves some to less loaded ranks, and every block's core attention\n"
      "                      runs through the attention servers (same result up to the order\n"
      "                      of the dK/dV sums). N: the last N ranks only serve attention (no\n"
      "                      model, no data) and the others train on what they give back;\n"
      "                      needs --sync overlap, fused or none\n"
      "  --attn-row-cost C   0 (default), auto or a number: what the balancer counts for one\n"
      "                      query row besides its (query, key) pairs, in pairs. 0: pairs only\n"
      "                      (DistCA's cost); auto: rank 0 times the attention kernels at the\n"
      "                      first step (loom_attn_measure_row_cost): closer to the kernels'\n"
      "                      time, but a timing, so two runs may plan (and round) differently\n"
      "  --doc-lengths D     corpus: the documents as the corpus gives them (default); skewed:\n"
      "                      the same tokens cut into synthetic sequences of heavy-tailed\n"
      "                      (lognormal) lengths, seeded per step and rank, so that the ranks'\n"
      "                      attention loads differ\n" EX_CKPT_HELP
      "  --inject-nan S      testing: rank 0 puts a NaN in its gradient at step S (before the\n"
      "                      allreduce); LOOM_NONFINITE=abort|skip decides what follows\n"
      "  --help              this text\n"
      "Flags take their value as the next argument or after '='. Bad flags exit 2.\n"
      "Tokens/s counts training tokens of all ranks, validation excluded. MFU = achieved\n"
      "FLOP/s per rank / the sgemm rate of one rank measured at start (same BLAS threads; the\n"
      "faster of the BLAS's sgemm and loom's own GEMM kernel where loom uses it), with\n"
      "6 FLOPs per token per matmul parameter (12 L C^2 + 256 C; a MoE block counts its\n"
      "router and K experts, 4 C^2 + C E + 2 K C F, instead of the dense MLP's 8 C^2); mfu_attn\n"
      "adds the causal attention pairs actually computed. The rate is measured again at the\n"
      "end (printed, and sgemm_end_gflops in the JSON, -1 if it could not be) to show how far\n"
      "the host drifted. The sampled MFU (mfu_sampled) weighs each stretch of training between\n"
      "two samples by the mean of their rates: on a host whose speed drifts during the run it\n"
      "compares the steps with what the sgemm did at the same time.\n",
      GPT_DEFAULT_DATA);
}

static int parse_args(int argc, char **argv, opts_t *o, char *err, size_t errlen) {
  *o = (opts_t){.cfg = {.layers = 4, .width = 256, .heads = 4, .ctx = 256, .vocab = 256},
                .batch = 8,
                .accum = 1,
                .steps = 300,
                .lr = 1e-3,
                .min_lr_frac = 0.1,
                .wd = 0.1,
                .beta1 = 0.9,
                .beta2 = 0.95,
                .adam_eps = 1e-8,
                .clip = 1.0,
                .warmup = 30,
                .seed = 42,
                .val_frac = 0.05,
                .sgemm_reps = 10,
                .sgemm_every = 20,
                .val_every = 100,
                .val_rows = 32,
                .log_every = 10,
                .sample = 200,
                .temperature = 0.8,
                .rtol = 1e-5,
                .scheme = LOOM_SCHEME_DIVISIBLE,
                .moe_topk = 2,
                .moe_aux = 0.01,
                .moe_overlap = LOOM_MOE_OVERLAP_DEFAULT,
                .attn_servers = -1,
                .attn_row_cost = 0.0,
                .ck = EX_CKPT_OPTS_DEFAULT,
                .inject_nan = -1};
  o->cfg.moe_every = 2;
  static const char *const switches[] = {"--help", "--no-overlap", "--compare", "--resume", NULL};
  for (int i = 1; i < argc; i++) {
    char flag[64];
    const char *v = NULL;
    if (ex_next_flag(argc, argv, &i, switches, flag, sizeof flag, &v, err, errlen)) {
      return -1;
    }
    int rc = 0;
    if (!strcmp(flag, "--help")) {
      o->help = 1;
    } else if (!strcmp(flag, "--no-overlap")) {
      o->sync = SYNC_FUSED;
    } else if (!strcmp(flag, "--compare")) {
      if (i + 2 >= argc) {
        snprintf(err, errlen, "--compare wants two files: --compare A B");
        return -1;
      }
      o->cmp[0] = argv[++i];
      o->cmp[1] = argv[++i];
    } else if (!strcmp(flag, "--layers")) {
      rc = ex_parse_int(flag, v, 1, 64, &o->cfg.layers, err, errlen);
    } else if (!strcmp(flag, "--width")) {
      rc = ex_parse_int(flag, v, 1, 8192, &o->cfg.width, err, errlen);
    } else if (!strcmp(flag, "--heads")) {
      rc = ex_parse_int(flag, v, 1, 256, &o->cfg.heads, err, errlen);
    } else if (!strcmp(flag, "--ctx")) {
      rc = ex_parse_int(flag, v, 2, 65536, &o->cfg.ctx, err, errlen);
    } else if (!strcmp(flag, "--batch")) {
      rc = ex_parse_int(flag, v, 1, 65536, &o->batch, err, errlen);
    } else if (!strcmp(flag, "--accum")) {
      rc = ex_parse_int(flag, v, 1, 65536, &o->accum, err, errlen);
    } else if (!strcmp(flag, "--steps")) {
      rc = ex_parse_long(flag, v, 1, 1L << 40, &o->steps, err, errlen);
    } else if (!strcmp(flag, "--lr")) {
      rc = ex_parse_double(flag, v, 0.0, 10.0, &o->lr, err, errlen);
    } else if (!strcmp(flag, "--min-lr-frac")) {
      rc = ex_parse_double(flag, v, 0.0, 1.0, &o->min_lr_frac, err, errlen);
    } else if (!strcmp(flag, "--warmup")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->warmup, err, errlen);
    } else if (!strcmp(flag, "--weight-decay")) {
      rc = ex_parse_double(flag, v, 0.0, 10.0, &o->wd, err, errlen);
    } else if (!strcmp(flag, "--beta1")) {
      rc = ex_parse_double(flag, v, 0.0, 0.999999, &o->beta1, err, errlen);
    } else if (!strcmp(flag, "--beta2")) {
      rc = ex_parse_double(flag, v, 0.0, 0.999999, &o->beta2, err, errlen);
    } else if (!strcmp(flag, "--adam-eps")) {
      rc = ex_parse_double(flag, v, 0.0, 1.0, &o->adam_eps, err, errlen);
    } else if (!strcmp(flag, "--clip")) {
      rc = ex_parse_double(flag, v, 0.0, 1e30, &o->clip, err, errlen);
    } else if (!strcmp(flag, "--seed")) {
      rc = ex_parse_long(flag, v, 0, 0x7fffffffL, &o->seed, err, errlen);
    } else if (!strcmp(flag, "--data")) {
      if (o->ndata == MAX_DATA) {
        snprintf(err, errlen, "--data: at most %d paths (give directories instead)", MAX_DATA);
        return -1;
      }
      o->data[o->ndata++] = v;
    } else if (!strcmp(flag, "--val-frac")) {
      rc = ex_parse_double(flag, v, 1e-6, 0.5, &o->val_frac, err, errlen);
    } else if (!strcmp(flag, "--val-every")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->val_every, err, errlen);
    } else if (!strcmp(flag, "--val-rows")) {
      rc = ex_parse_int(flag, v, 1, 1 << 20, &o->val_rows, err, errlen);
    } else if (!strcmp(flag, "--sgemm-reps")) {
      rc = ex_parse_int(flag, v, 0, 1000, &o->sgemm_reps, err, errlen);
    } else if (!strcmp(flag, "--sgemm-every")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->sgemm_every, err, errlen);
    } else if (!strcmp(flag, "--log-every")) {
      rc = ex_parse_long(flag, v, 1, 1L << 40, &o->log_every, err, errlen);
    } else if (!strcmp(flag, "--sample")) {
      rc = ex_parse_int(flag, v, 0, 1 << 20, &o->sample, err, errlen);
    } else if (!strcmp(flag, "--temperature")) {
      rc = ex_parse_double(flag, v, 0.01, 100.0, &o->temperature, err, errlen);
    } else if (!strcmp(flag, "--json")) {
      o->json = v;
    } else if (!strcmp(flag, "--profile")) {
      o->profile = v;
    } else if (!strcmp(flag, "--dump-params")) {
      o->dump = v;
    } else if (!strcmp(flag, "--rtol")) {
      rc = ex_parse_double(flag, v, 0.0, 1.0, &o->rtol, err, errlen);
    } else if ((rc = ex_parse_compress(flag, v, &o->compress, &o->scheme, err, errlen)) != 0) {
      rc = rc < 0 ? -1 : 0;
    } else if (!strcmp(flag, "--moe-experts")) {
      rc = ex_parse_int(flag, v, 0, 4096, &o->cfg.moe_experts, err, errlen);
    } else if (!strcmp(flag, "--moe-every")) {
      rc = ex_parse_int(flag, v, 1, 64, &o->cfg.moe_every, err, errlen);
    } else if (!strcmp(flag, "--moe-topk")) {
      rc = ex_parse_int(flag, v, 1, 4096, &o->moe_topk, err, errlen);
    } else if (!strcmp(flag, "--moe-ffn")) {
      rc = ex_parse_int(flag, v, 1, 1 << 24, &o->moe_ffn, err, errlen);
    } else if (!strcmp(flag, "--moe-capacity")) {
      rc = ex_parse_double(flag, v, 0.0, 1e6, &o->moe_capacity, err, errlen);
    } else if (!strcmp(flag, "--moe-aux")) {
      rc = ex_parse_double(flag, v, 0.0, 1e3, &o->moe_aux, err, errlen);
    } else if (!strcmp(flag, "--moe-overlap")) {
      if (loom_moe_overlap_parse(v, &o->moe_overlap) != LOOM_OK) {
        snprintf(err, errlen, "--moe-overlap wants none, coarse or fine, got '%s'", v);
        rc = -1;
      }
    } else if (!strcmp(flag, "--attn-servers")) {
      char *end = NULL;
      long n = strtol(v, &end, 10);
      if (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "inplace")) {
        o->attn_servers = !strcmp(v, "inplace");
      } else if (end && end != v && *end == '\0' && n >= 1 && n <= 4096) {
        o->attn_servers = 2;
      } else {
        snprintf(err, errlen,
                 "--attn-servers wants off, inplace or a number N >= 1 of dedicated servers (the "
                 "last N ranks), got '%s'",
                 v);
        rc = -1;
      }
      snprintf(o->attn_spec, sizeof o->attn_spec, "%s", o->attn_servers ? v : "0");
    } else if (!strcmp(flag, "--attn-row-cost")) {
      char *end = NULL;
      double c = strtod(v, &end);
      if (!strcmp(v, "auto")) {
        o->attn_row_cost = -1.0;
      } else if (end && end != v && *end == '\0' && c >= 0.0 && c <= 1e9) {
        o->attn_row_cost = c;
      } else {
        snprintf(err, errlen, "--attn-row-cost wants auto or a number of pairs in 0..1e9, got '%s'",
                 v);
        rc = -1;
      }
    } else if (!strcmp(flag, "--doc-lengths")) {
      if (!strcmp(v, "corpus") || !strcmp(v, "skewed")) {
        o->doc_skew = !strcmp(v, "skewed");
      } else {
        snprintf(err, errlen, "--doc-lengths wants corpus or skewed, got '%s'", v);
        rc = -1;
      }
    } else if (!strcmp(flag, "--inject-nan")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->inject_nan, err, errlen);
    } else if ((rc = ex_parse_ckpt(flag, v, &o->ck, err, errlen)) != 0) {
      rc = rc < 0 ? -1 : 0;
    } else if (!strcmp(flag, "--device")) {
      rc = ex_parse_device(v, &o->cuda, err, errlen);
    } else if (!strcmp(flag, "--sync")) {
      int k = 0;
      while (k < 4 && strcmp(v, sync_names[k])) {
        k++;
      }
      if (k == 4) {
        snprintf(err, errlen, "--sync wants overlap, fused, none or comm-only, got '%s'", v);
        rc = -1;
      }
      o->sync = (sync_mode_t)k;
    } else {
      snprintf(err, errlen, "unknown flag '%s' (see --help)", flag);
      rc = -1;
    }
    if (rc) {
      return -1;
    }
  }
  if (o->compress && strcmp(o->compress, "none") != 0) {
    if (o->sync != SYNC_OVERLAP && o->sync != SYNC_COMM_ONLY) {
      snprintf(err, errlen, "--compress works with --sync overlap (the default) or comm-only");
      return -1;
    }
  }
  if (ex_check_ckpt(&o->ck, err, errlen) != 0) {
    return -1;
  }
  if (ex_check_output("--json", o->json, err, errlen) != 0) {
    return -1;
  }
  if (ex_check_output("--dump-params", o->dump, err, errlen) != 0) {
    return -1;
  }
  if (ex_check_output("--profile", o->profile, err, errlen) != 0) {
    return -1;
  }
  if (o->attn_servers == 2 && o->sync == SYNC_COMM_ONLY) {
    snprintf(err, errlen,
             "--attn-servers N with --sync comm-only: the step runs no attention for the servers "
             "to serve; use inplace, or another --sync");
    return -1;
  }
  if (o->profile && (o->sync == SYNC_FUSED || o->sync == SYNC_COMM_ONLY)) {
    snprintf(err, errlen, "--profile times the scheduled step: use --sync overlap (or none)");
    return -1;
  }
  if (o->cuda && o->attn_servers > 0) {
    snprintf(err, errlen,
             "--device cuda does not support --attn-servers yet (the attention servers run on "
             "host tensors): drop it or use --device host");
    return -1;
  }
  if (ex_check_accum(o->batch, o->accum, err, errlen) != 0) {
    return -1;
  }
  if (o->profile && o->accum > 1) {
    snprintf(err, errlen,
             "--profile with --accum %d: loom_sim models one batch a step; profile without "
             "--accum (the same rows and gradients)",
             o->accum);
    return -1;
  }
  if (o->cfg.width % o->cfg.heads) {
    snprintf(err, errlen, "--width %d does not divide by --heads %d: pick heads that divide it",
             o->cfg.width, o->cfg.heads);
    return -1;
  }
  if (o->cfg.moe_experts > 0 && o->moe_topk > o->cfg.moe_experts) {
    snprintf(err, errlen, "--moe-topk %d is more than --moe-experts %d: use 1..%d", o->moe_topk,
             o->cfg.moe_experts, o->cfg.moe_experts);
    return -1;
  }
  if (o->cfg.moe_experts > 0 && o->cfg.moe_every > o->cfg.layers) {
    snprintf(err, errlen, "--moe-every %d with --layers %d makes no block a MoE block: use 1..%d",
             o->cfg.moe_every, o->cfg.layers, o->cfg.layers);
    return -1;
  }
  if ((int64_t)o->batch * o->cfg.ctx > (1 << 30)) {
    snprintf(err, errlen, "--batch * --ctx is over 2^30 tokens per rank: make one smaller");
    return -1;
  }
  if (o->ndata == 0) {
    o->data[o->ndata++] = GPT_DEFAULT_DATA;
  }
  return 0;
}

// ---- the step as a task graph -------------------------------------------------------------------

typedef struct step {
  const opts_t *o;
  gpt_model_t *m;
  gpt_acts_t *a;
  gpt_batch_t *b;
  const gpt_corpus_t *corpus;
  const loom_group_t *dp;
  loom_sched_t *s;
  int64_t first_row;  // this rank's first row of the step
  float loss[2];      // this rank's mean loss and MoE aux loss (summed over the layers), then
                      // (allreduce) their means over the ranks
  double loss_sum[2]; // the micro-batches' loss and aux loss so far (--accum)
  int64_t pairs;      // causal attention pairs of the step's micro-batches
  loom_tensor_t loss_t;
  const loom_group_t *ep, *edp; // expert-parallel and expert-data-parallel groups (MoE)
  int nmoe;                     // MoE blocks
  loom_tensor_t **grads;        // (nunits) every unit's gradient, for the norm
  float norm;                   // of the averaged gradient (measured when clip is 0 too)
  loom_adamw_t hp;
  loom_compressor_t *codec;       // --compress SPEC (every part), or NULL
  loom_compressor_t **part_codec; // (P nunits) [P u + p], P = GPT_MAX_PARTS: the compressor of
                                  // part p of unit u, or NULL for a plain allreduce (--compress
                                  // auto decides per part)
  loom_scheme_t *part_scheme;     // (P nunits)
  loom_host_stage_t **part_stage; // (P nunits) on a device: the stage of a part the CPU encodes
                                  // (ByteComp's CPU lane), NULL for the GPU's codecs
  double *ready;                  // (P nunits) ms after the step start when the allreduce began
  double t_step;                  // MPI_Wtime at the step start
  loom_ef_t *ef;                  // error feedback, keyed by gradient name
  int die;                        // --die-at: this step ends the process (SIGKILL) mid-step
  int inject_nan;                 // --inject-nan: rank 0 poisons a gradient before the allreduce
  int nonfinite_skip;             // LOOM_NONFINITE=skip: the updates wait for the norm
  int skip;                       // the averaged gradient is not finite: no update this step
  uint64_t seed;                  // the step: ex_compress_seed(seed, part) per compressed allreduce
  size_t sent;                    // bytes the step's compressed allreduces sent from this rank
  // attention servers (--attn-servers): the world group, the ranks that train (the rest are
  // dedicated servers), one executor per block (made at the first step, replanned every step),
  // and the plan's max / mean attention load before and after balancing
  const loom_group_t *world;
  int trainers;
  loom_attn_exec_t **attn; // (L) or NULL when off
  double attn_ratio[2];
  double attn_row_cost; // the balancer's row cost (< 0 until measured at the first plan)
} step_t;

typedef struct unit_arg {
  step_t *st;
  int u, p; // unit, and part of the unit (gpt_backward_part)
} unit_arg_t;

typedef struct moe_arg {
  step_t *st;
  int l, p; // block, and which parameter of its MoE layer (a loom_moe_param_t)
} moe_arg_t;

// The balancer's row cost: given (>= 0), or measured at the first plan by world rank 0 and
// broadcast, since every rank must plan with the same value. Collective over the world.
static loom_status_t attn_row_cost(const loom_group_t *world, int H, int D, double *row_cost) {
  if (*row_cost >= 0.0) {
    return LOOM_OK;
  }
  double rc = 0.0;
  if (loom_group_rank(world) == 0) {
    if (loom_attn_measure_row_cost(H, H, D, 1, &rc) != LOOM_OK) {
      fprintf(stderr, "train_gpt: measuring the attention row cost: %s\n", loom_last_error(NULL));
      rc = NAN;
    } else {
      printf("attn-servers: a query row costs %.1f (query, key) pairs besides its pairs "
             "(measured on rank 0; --attn-row-cost sets it)\n",
             rc);
      fflush(stdout);
    }
  }
  if (MPI_Bcast(&rc, 1, MPI_DOUBLE, 0, loom_group_comm(world)) != MPI_SUCCESS) {
    return LOOM_ERR_MPI;
  }
  if (!(rc >= 0.0)) {
    fprintf(stderr, "train_gpt: attention servers: rank 0 could not measure the row cost (see "
                    "its error): set it with --attn-row-cost\n");
    return LOOM_ERR_STATE;
  }
  *row_cost = rc;
  return LOOM_OK;
}

// Attention servers for one step: every rank's sequence lengths (the cu_seqlens of its batch;
// a dedicated server has none) gathered over the world in rank order (rank 0's sequences, then
// rank 1's, ...: each rank's rows are its documents packed in that order), balanced over the
// serving ranks (every rank in place; with `trainers` < world size only the ranks from
// `trainers` on), and given to the executor of every block: made at the first step, replanned
// after (the communicator and buffers stay). Collective over the world, in the forward, in the
// same order on every rank. mine < 0 (the trainers after their last step) sets *stop on every
// rank instead: the dedicated servers' loop ends.
static loom_status_t attn_plan(const loom_group_t *world, int trainers, const int32_t *cu, int mine,
                               const gpt_config_t *c, loom_attn_exec_t **x, double ratio[2],
                               double *row_cost, int *stop) {
  const int np = loom_group_size(world), H = c->heads, D = c->width / c->heads;
  MPI_Comm comm = loom_group_comm(world);
  int *counts = malloc(sizeof(int) * (size_t)np), *displs = malloc(sizeof(int) * (size_t)np);
  int64_t *lens = malloc(sizeof(int64_t) * ((size_t)(mine > 0 ? mine : 0) + 1)), *all = NULL;
  loom_attn_doc_t *docs = NULL;
  loom_attn_plan_t plan = {0};
  loom_status_t status = LOOM_OK;
  *stop = 0;
  if (!counts || !displs || !lens) {
    status = LOOM_ERR_NOMEM;
    goto done;
  }
  for (int i = 0; i < mine; i++) {
    lens[i] = cu[i + 1] - cu[i];
  }
  if (MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT, comm) != MPI_SUCCESS) {
    status = LOOM_ERR_MPI;
    goto done;
  }
  int total = 0;
  for (int r = 0; r < np; r++) {
    *stop |= counts[r] < 0;
    displs[r] = total;
    total += counts[r] > 0 ? counts[r] : 0;
  }
  if (*stop) {
    goto done;
  }
  if ((status = attn_row_cost(world, H, D, row_cost)) != LOOM_OK) {
    goto done;
  }
  all = malloc(sizeof(int64_t) * ((size_t)total + 1));
  docs = malloc(sizeof *docs * ((size_t)total + 1));
  if (!all || !docs) {
    status = LOOM_ERR_NOMEM; // (a trainer aborts in EX_CHECK, a server in attn_serve)
    goto done;
  }
  if (MPI_Allgatherv(lens, mine, MPI_INT64_T, all, counts, displs, MPI_INT64_T, comm) !=
      MPI_SUCCESS) {
    status = LOOM_ERR_MPI;
    goto done;
  }
  for (int r = 0; r < np; r++) {
    for (int i = displs[r]; i < displs[r] + counts[r]; i++) {
      docs[i] = (loom_attn_doc_t){.owner = r, .len = all[i]};
    }
  }
  loom_attn_balance_opts_t bo;
  loom_attn_balance_opts_init(&bo);
  bo.tolerance = 0.1;
  bo.causal = 1;
  bo.min_shard = c->ctx / 4 < 64 ? (c->ctx / 4 > 0 ? c->ctx / 4 : 1) : 64;
  bo.servers_first = trainers < np ? trainers : 0;
  bo.bytes_per_q_row = 4.0 * (4.0 * H * D + H);
  bo.bytes_per_kv_row = 4.0 * (4.0 * H * D);
  bo.row_cost = *row_cost;
  if ((status = loom_attn_balance(docs, total, np, &bo, &plan)) != LOOM_OK) {
    goto done;
  }
  ratio[0] = plan.max_over_mean_before;
  ratio[1] = plan.max_over_mean;
  for (int l = 0; l < c->layers && status == LOOM_OK; l++) {
    status = x[l] ? loom_attn_exec_replan(x[l], docs, total, plan.tasks, plan.ntasks)
                  : loom_attn_exec_create(world, docs, total, plan.tasks, plan.ntasks, H, H, D, 1,
                                          0.0f, &x[l]);
  }
done:
  loom_attn_plan_free(&plan);
  free(counts);
  free(displs);
  free(lens);
  free(all);
  free(docs);
  return status;
}

// This step's plan for the trainer's batch, and its executors on the activations.
static loom_status_t attn_setup(step_t *st) {
  int stop = 0;
  loom_status_t status =
      attn_plan(st->world, st->trainers, st->b->cu.data, st->b->nseq, &st->m->cfg, st->attn,
                st->attn_ratio, &st->attn_row_cost, &stop);
  if (status == LOOM_OK && stop) { // only trainers send the stop: one of them has ended
    fprintf(stderr, "train_gpt: attention servers: another trainer ended the training mid-step\n");
    status = LOOM_ERR_STATE;
  }
  st->a->attn = status == LOOM_OK ? st->attn : NULL;
  return status;
}

// The step is over: the activations forget the executors (kept for the next step's plan).
static void attn_release(step_t *st) {
  st->a->attn = NULL;
}

// A dedicated attention server (LOOM_ATTN_SERVERS=N, the last N ranks): no model, no data. Every
// training step it takes part in the plan, serves the forward of every block in order and the
// backward in reverse order, with no rows of its own, until the trainers say they are done.
static int attn_serve(const loom_group_t *world, int trainers, const gpt_config_t *c,
                      double row_cost) {
  const int L = c->layers, H = c->heads, D = c->width / c->heads;
  loom_attn_exec_t **x = calloc((size_t)L, sizeof *x);
  loom_status_t status = x ? LOOM_OK : LOOM_ERR_NOMEM;
  loom_tensor_t q, lse;
  const int64_t sq[3] = {0, H, D}, sl[2] = {H, 0};
  if (status == LOOM_OK) {
    status = loom_tensor_wrap(&q, NULL, LOOM_F32, LOOM_DEVICE_HOST, 3, sq, "attn.none");
  }
  if (status == LOOM_OK) {
    status = loom_tensor_wrap(&lse, NULL, LOOM_F32, LOOM_DEVICE_HOST, 2, sl, "attn.lse");
  }
  long steps = 0;
  double ratio[2];
  int stop = 0;
  while (status == LOOM_OK) {
    status = attn_plan(world, trainers, NULL, 0, c, x, ratio, &row_cost, &stop);
    if (status != LOOM_OK || stop) {
      break;
    }
    for (int l = 0; l < L && status == LOOM_OK; l++) {
      status = loom_attn_exec_forward(x[l], &q, &q, &q, &q, &lse);
    }
    for (int l = L - 1; l >= 0 && status == LOOM_OK; l--) {
      status = loom_attn_exec_backward(x[l], &q, &q, &q, &q);
    }
    steps++;
  }
  if (status != LOOM_OK) { // the trainers wait in an exchange with this server: end the job
    fprintf(stderr, "train_gpt: attention server (world rank %d): %s\n", loom_group_rank(world),
            loom_last_error(NULL));
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int l = 0; x && l < L; l++) {
    loom_attn_exec_destroy(x[l]);
  }
  free(x);
  return status == LOOM_OK ? 0 : 1;
}

// The forward of micro-batch k (0..accum-1) of the step: rows first_row + k * batch / accum on.
// Sets up the model's gradient accumulation for the backward that follows (the first
// micro-batch overwrites the gradients, later ones add; each loss gradient weighs 1/accum). The
// last one leaves the step's mean loss and summed aux loss in st->loss (the MoE layers' aux_coef
// is divided by accum: the aux loss of a step is the mean over its micro-batches too).
static loom_status_t micro_forward(step_t *st, int k) {
  const int K = st->o->accum, rows = st->o->batch / K;
  const int64_t first = st->first_row + (int64_t)k * rows;
  gpt_batch_fill(st->b, &st->corpus->train, first, rows);
  if (st->o->doc_skew) { // seeded by the micro-batch's first row: per step, rank and piece
    uint64_t mix = (uint64_t)st->o->seed * 0x9e3779b97f4a7c15ull + (uint64_t)first;
    gpt_batch_skew(st->b, ex_splitmix64(&mix));
  }
  if (st->attn) {
    TRY(attn_setup(st));
  }
  float loss = 0.0f;
  TRY(gpt_forward(st->m, st->a, &st->b->tokens, &st->b->pos, &st->b->target, &st->b->cu, &loss,
                  st->s));
  if (k == 0) {
    st->loss_sum[0] = st->loss_sum[1] = 0.0;
    st->pairs = 0;
  }
  st->loss_sum[0] += loss;
  st->loss_sum[1] += st->a->aux;
  st->pairs += st->b->attn_pairs;
  st->loss[0] = K == 1 ? loss : (float)(st->loss_sum[0] / K);
  st->loss[1] = (float)st->loss_sum[1];
  st->m->grad_add = k > 0;
  st->m->moe_finish = k == K - 1;
  st->m->loss_scale = 1.0f / (float)K;
  return LOOM_OK;
}

// The micro-batches before the last (--accum K > 1): forward and the whole backward, adding to
// the gradients; no allreduce (the last micro-batch's backward starts them).
static loom_status_t micro_backward(step_t *st) {
  for (int u = st->m->nunits - 1; u >= 0; u--) {
    TRY(gpt_backward_unit(st->m, st->a, u, st->s));
  }
  attn_release(st);
  return LOOM_OK;
}

typedef struct micro_arg {
  step_t *st;
  int k;
} micro_arg_t;

static loom_status_t task_micro_forward(void *arg) {
  const micro_arg_t *ma = arg;
  return micro_forward(ma->st, ma->k);
}

static loom_status_t task_micro_backward(void *arg) {
  const micro_arg_t *ma = arg;
  return micro_backward(ma->st);
}

// The forward of the step's last micro-batch (the only one without --accum).
static loom_status_t task_forward(void *arg) {
  step_t *st = arg;
  loom_status_t status = micro_forward(st, st->o->accum - 1);
  if (st->die) { // --die-at: as a crash would, in the middle of the step (after the forward)
    fflush(stdout);
    raise(SIGKILL);
  }
  return status;
}

static loom_status_t task_loss_allreduce(void *arg, loom_request_t **req) {
  step_t *st = arg;
  return loom_iallreduce(st->dp, &st->loss_t, &st->loss_t, LOOM_AVG, req);
}

static loom_status_t task_backward(void *arg) {
  const unit_arg_t *ua = arg;
  loom_status_t status = gpt_backward_part(ua->st->m, ua->st->a, ua->u, ua->p, ua->st->s);
  if (status == LOOM_OK && ua->st->inject_nan && ua->u == 0 && loom_group_rank(ua->st->dp) == 0) {
    loom_tensor_t first; // --inject-nan: one NaN in rank 0's embedding gradient, before averaging
    int64_t one = 1;
    loom_tensor_t *g = &ua->st->m->unit_grad[0];
    TRY(loom_tensor_wrap(&first, g->data, LOOM_F32, g->device, 1, &one, "nan"));
    status = loom_tensor_fill(&first, NAN);
  }
  return status;
}

static loom_status_t task_grad_allreduce(void *arg, loom_request_t **req) {
  const unit_arg_t *ua = arg;
  step_t *st = ua->st;
  const int i = GPT_MAX_PARTS * ua->u + ua->p;
  loom_tensor_t *g = &st->m->part_grad[i];
  if (st->ready) { // the profile of --compress auto: when this gradient was ready
    st->ready[i] = 1e3 * (MPI_Wtime() - st->t_step);
  }
  if (st->part_codec && st->part_codec[i] && st->part_stage[i]) { // the CPU lane: see below
    size_t sent = 0;
    loom_status_t status = loom_icompressed_allreduce_staged(
        st->dp, st->part_codec[i], st->part_scheme[i], st->ef, g, st->part_stage[i], LOOM_AVG,
        ex_compress_seed(st->seed, i), &sent, req);
    st->sent += sent;
    return status;
  }
  if (st->part_codec && st->part_codec[i]) { // encoded now; the rest moves as it is advanced
    size_t sent = 0;
    loom_status_t status =
        loom_icompressed_allreduce(st->dp, st->part_codec[i], st->part_scheme[i], st->ef, g,
                                   LOOM_AVG, ex_compress_seed(st->seed, i), &sent, req);
    st->sent += sent;
    return status;
  }
  return loom_iallreduce(ua->st->dp, g, g, LOOM_AVG, req);
}

// The CPU lane of a device gradient (LOOM_PLAN_LANE=cpu, or the auto plan's choice): the stage
// of part i, made once when the lane is decided (pinned host memory, a copy stream). Its
// allreduce task (task_grad_allreduce) starts on the compute stream after the part's backward:
// the copy to the host waits there for the kernels that wrote the gradient, the host codecs run
// as the request is advanced, and the request completes once the sum is back on the device, so
// that the clip and AdamW, queued after it, read the sum. Residuals stay in ef's host table.
static void set_cpu_lane(step_t *st, int i, int cpu) {
  EX_CHECK(ex_cpu_lane_stage(&st->part_stage[i], &st->m->part_grad[i], cpu));
}

// --compress auto's plan on the parts (plan entry k is part slot[k]).
static void apply_plan(step_t *st, const ex_auto_t *a, const int *slot, int nslots) {
  for (int k = 0; k < nslots; k++) {
    const int c = a->codec[k];
    st->part_codec[slot[k]] = c >= 0 ? a->cand[c] : NULL;
    st->part_scheme[slot[k]] = a->scheme[k];
    set_cpu_lane(st, slot[k], ex_auto_cpu(a, k));
  }
}

// A MoE gradient (uncompressed): the router over the data-parallel group, an expert tensor over
// the ranks that hold the same experts.
static loom_status_t task_moe_allreduce(void *arg, loom_request_t **req) {
  const moe_arg_t *ma = arg;
  loom_tensor_t *g = loom_moe_grad(ma->st->m->moe[ma->l], (loom_moe_param_t)ma->p);
  const loom_group_t *grp = ma->p == LOOM_MOE_ROUTER ? ma->st->dp : ma->st->edp;
  return loom_iallreduce(grp, g, g, LOOM_AVG, req);
}

// The global gradient norm with MoE layers: the dense gradients and the routers are the same on
// every rank, the experts are spread over the expert-parallel group (their squares are gathered
// and summed in rank order, so every rank gets the same bits). Clips as loom_clip_grad_norm.
static loom_status_t clip_moe(step_t *st) {
  gpt_model_t *m = st->m;
  double dense = 0.0, norm = 0.0;
  float mine = 0.0f;
  for (int u = 0; u < m->nunits; u++) {
    TRY(loom_norm2(&m->unit_grad[u], &norm));
    dense += norm * norm;
  }
  for (int l = 0; l < m->cfg.layers; l++) {
    for (int p = 0; m->moe[l] && p < LOOM_MOE_PARAM_COUNT; p++) {
      TRY(loom_norm2(loom_moe_grad(m->moe[l], (loom_moe_param_t)p), &norm));
      if (p == LOOM_MOE_ROUTER) {
        dense += norm * norm;
      } else {
        mine += (float)(norm * norm);
      }
    }
  }
  const int P = loom_group_size(st->ep);
  float *all = malloc(sizeof(float) * (size_t)P);
  if (!all) {
    return LOOM_ERR_NOMEM;
  }
  loom_tensor_t tm, ta;
  int64_t one = 1, np = P;
  loom_status_t status = loom_tensor_wrap(&tm, &mine, LOOM_F32, LOOM_DEVICE_HOST, 1, &one, "sq");
  if (status == LOOM_OK) {
    status = loom_tensor_wrap(&ta, all, LOOM_F32, LOOM_DEVICE_HOST, 1, &np, "sq.all");
  }
  if (status == LOOM_OK) {
    status = loom_allgather(st->ep, &tm, &ta);
  }
  for (int r = 0; r < P && status == LOOM_OK; r++) {
    dense += (double)all[r];
  }
  free(all);
  TRY(status);
  norm = sqrt(dense);
  st->norm = (float)norm;
  const double max_norm = st->o->clip, coef = max_norm / (norm + 1e-6);
  if (max_norm <= 0.0 || !isfinite(norm) || coef >= 1.0) {
    return LOOM_OK;
  }
  for (int u = 0; u < m->nunits; u++) {
    TRY(loom_scale(&m->unit_grad[u], (float)coef));
  }
  for (int l = 0; l < m->cfg.layers; l++) {
    for (int p = 0; m->moe[l] && p < LOOM_MOE_PARAM_COUNT; p++) {
      TRY(loom_scale(loom_moe_grad(m->moe[l], (loom_moe_param_t)p), (float)coef));
    }
  }
  return LOOM_OK;
}

// The global norm of the averaged gradient (clipped to --clip): the same on every rank, so a
// non-finite one makes every rank skip the update alike (LOOM_NONFINITE decides what follows).
static loom_status_t task_clip(void *arg) {
  step_t *st = arg;
  loom_status_t status =
      st->nmoe > 0 ? clip_moe(st)
                   : loom_clip_grad_norm(st->grads, st->m->nunits, (float)st->o->clip, &st->norm);
  st->skip = status == LOOM_OK && !isfinite(st->norm);
  return status;
}

static loom_status_t task_update(void *arg) {
  const unit_arg_t *ua = arg;
  if (ua->st->skip) {
    return LOOM_OK;
  }
  return gpt_update_unit(ua->st->m, ua->u, &ua->st->hp);
}

static void add_task(loom_sched_t *s, const char *name, loom_lane_t lane, int prio,
                     loom_status_t (*run)(void *),
                     loom_status_t (*start)(void *, loom_request_t **), void *arg, size_t bytes,
                     int *id) {
  loom_task_desc_t d = {.name = name,
                        .lane = lane,
                        .priority = prio,
                        .run = run,
                        .start = start,
                        .arg = arg,
                        .bytes = bytes};
  EX_CHECK(loom_sched_add(s, &d, id));
}

// "what.embed", "what.head", "what.h3" for a unit; with part >= 0 and a block, "what.h3.fc2",
// "what.h3.mlp" and so on (gpt_part_name).
static void unit_name(const gpt_model_t *m, const char *what, int u, int part, char *out,
                      size_t cap) {
  if (u == 0) {
    snprintf(out, cap, "%s.embed", what);
  } else if (u == m->nunits - 1) {
    snprintf(out, cap, "%s.head", what);
  } else if (part < 0) {
    snprintf(out, cap, "%s.h%d", what, u - 1);
  } else {
    snprintf(out, cap, "%s.h%d.%s", what, u - 1, gpt_part_name(m, u, part));
  }
}

// The step: forward; backward of the head, the blocks last to first (each in five parts: fc2, the
// rest of the MLP half, wo, q/k/v, ln1; gpt_backward_part), then the embeddings; each part's
// gradient allreduce as soon as its backward is done (sync overlap), so that a block's gradients
// travel while the rest of its backward runs and little is left to send when the backward ends; the
// gradient norm (and clip) over every averaged gradient; each unit's AdamW after its parts'
// allreduces (and after the clip when clipping). Backward outranks the updates, so the compute lane
// finishes the backward while the allreduces fly. A MoE block's MLP half (loom_moe_backward,
// collective over the expert-parallel group: the compute lane runs in the same order on every rank)
// is followed by one allreduce per MoE gradient: the router over the data-parallel group, w1, b1,
// w2, b2 over the expert-data-parallel group; the block's AdamW waits for them too. --sync none
// leaves the allreduces out; --sync comm-only keeps only them. With --accum K the micro-batches
// before the last come first, each a forward and a whole backward (mb: K - 1 arguments).
static void build_step(loom_sched_t *s, step_t *st, unit_arg_t *ua, moe_arg_t *ma,
                       micro_arg_t *mb) {
  enum { PRIO_FORWARD = 30, PRIO_BACKWARD = 20, PRIO_CLIP = 10, PRIO_UPDATE = 0 };
  const gpt_model_t *m = st->m;
  const int U = m->nunits;
  const sync_mode_t mode = st->o->sync;
  int fwd = -1, loss, prev = -1, clip = -1, id;
  int *ar = malloc(GPT_MAX_PARTS * (size_t)U * sizeof *ar); // [P u + p]: part p's allreduce, or -1
  // [l * LOOM_MOE_PARAM_COUNT + p]: the allreduce of MoE gradient p of block l, or -1
  int *mar = malloc((size_t)m->cfg.layers * LOOM_MOE_PARAM_COUNT * sizeof *mar);
  if (!ar || !mar) {
    fprintf(stderr, "%s: out of memory\n", ex_prog);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int k = 0; k < m->cfg.layers * LOOM_MOE_PARAM_COUNT; k++) {
    mar[k] = -1;
  }
  char name[64];
  for (int k = 0; k + 1 < st->o->accum && mode != SYNC_COMM_ONLY; k++) { // --accum: see above
    mb[k] = (micro_arg_t){.st = st, .k = k};
    snprintf(name, sizeof name, "forward.micro%d", k);
    add_task(s, name, LOOM_LANE_COMPUTE, PRIO_FORWARD, task_micro_forward, NULL, &mb[k], 0, &id);
    if (prev >= 0) {
      EX_CHECK(loom_sched_depend(s, id, prev));
    }
    snprintf(name, sizeof name, "backward.micro%d", k);
    add_task(s, name, LOOM_LANE_COMPUTE, PRIO_FORWARD, task_micro_backward, NULL, &mb[k], 0, &prev);
    EX_CHECK(loom_sched_depend(s, prev, id));
  }
  if (mode != SYNC_COMM_ONLY) {
    add_task(s, "forward", LOOM_LANE_COMPUTE, PRIO_FORWARD, task_forward, NULL, st, 0, &fwd);
    if (prev >= 0) {
      EX_CHECK(loom_sched_depend(s, fwd, prev));
    }
    add_task(s, "allreduce.loss", LOOM_LANE_COMM, 0, NULL, task_loss_allreduce, st, sizeof(float),
             &loss);
    EX_CHECK(loom_sched_depend(s, loss, fwd));
    prev = fwd;
  }
  for (int u = U - 1; u >= 0; u--) {
    for (int p = 0; p < GPT_MAX_PARTS; p++) {
      ua[GPT_MAX_PARTS * u + p] = (unit_arg_t){.st = st, .u = u, .p = p};
      ar[GPT_MAX_PARTS * u + p] = -1;
    }
    for (int p = 0; p < gpt_unit_parts(m, u); p++) {
      unit_arg_t *arg = &ua[GPT_MAX_PARTS * u + p];
      int part = gpt_unit_parts(m, u) > 1 ? p : -1, bwd = -1;
      if (mode != SYNC_COMM_ONLY) {
        unit_name(m, "backward", u, part, name, sizeof name);
        add_task(s, name, LOOM_LANE_COMPUTE, PRIO_BACKWARD, task_backward, NULL, arg, 0, &bwd);
        EX_CHECK(loom_sched_depend(s, bwd, prev));
        prev = bwd;
      }
      if (mode != SYNC_NONE) {
        unit_name(m, "allreduce", u, part, name, sizeof name);
        add_task(s, name, LOOM_LANE_COMM, 0, NULL, task_grad_allreduce, arg,
                 loom_tensor_bytes(&m->part_grad[GPT_MAX_PARTS * u + p]),
                 &ar[GPT_MAX_PARTS * u + p]);
        if (bwd >= 0) {
          EX_CHECK(loom_sched_depend(s, ar[GPT_MAX_PARTS * u + p], bwd));
        }
      }
      const int l = u - 1; // the block, when u is one
      for (int q = 0; gpt_part_kind(m, u, p) == GPT_PART_MLP && m->moe[l] && mode != SYNC_NONE &&
                      q < LOOM_MOE_PARAM_COUNT;
           q++) {
        static const char *const moe_names[] = {"router", "w1", "b1", "w2", "b2"};
        const int k = l * LOOM_MOE_PARAM_COUNT + q;
        ma[k] = (moe_arg_t){.st = st, .l = l, .p = q};
        snprintf(name, sizeof name, "allreduce.h%d.moe.%s", l, moe_names[q]);
        add_task(s, name, LOOM_LANE_COMM, 0, NULL, task_moe_allreduce, &ma[k],
                 loom_tensor_bytes(loom_moe_grad(m->moe[l], (loom_moe_param_t)q)), &mar[k]);
        if (bwd >= 0) {
          EX_CHECK(loom_sched_depend(s, mar[k], bwd));
        }
      }
    }
  }
  if (mode != SYNC_COMM_ONLY) {
    add_task(s, st->o->clip > 0 ? "clip_grad_norm" : "grad_norm", LOOM_LANE_COMPUTE, PRIO_CLIP,
             task_clip, NULL, st, 0, &clip);
    if (mode == SYNC_NONE) {
      EX_CHECK(loom_sched_depend(s, clip, prev));
    }
    for (int i = 0; i < GPT_MAX_PARTS * U && mode != SYNC_NONE; i++) {
      if (ar[i] >= 0) {
        EX_CHECK(loom_sched_depend(s, clip, ar[i]));
      }
    }
    for (int k = 0; k < m->cfg.layers * LOOM_MOE_PARAM_COUNT; k++) {
      if (mar[k] >= 0) {
        EX_CHECK(loom_sched_depend(s, clip, mar[k]));
      }
    }
    for (int u = U - 1; u >= 0; u--) {
      unit_name(m, "adamw", u, -1, name, sizeof name);
      add_task(s, name, LOOM_LANE_COMPUTE, PRIO_UPDATE, task_update, NULL, &ua[GPT_MAX_PARTS * u],
               0, &id);
      if (mode == SYNC_NONE) {
        EX_CHECK(loom_sched_depend(s, id, prev));
      }
      for (int p = 0; p < gpt_unit_parts(m, u) && mode != SYNC_NONE; p++) {
        EX_CHECK(loom_sched_depend(s, id, ar[GPT_MAX_PARTS * u + p]));
      }
      for (int q = 0; q < LOOM_MOE_PARAM_COUNT && u > 0 && u < U - 1; q++) {
        if (mar[(u - 1) * LOOM_MOE_PARAM_COUNT + q] >= 0) {
          EX_CHECK(loom_sched_depend(s, id, mar[(u - 1) * LOOM_MOE_PARAM_COUNT + q]));
        }
      }
      if (st->o->clip > 0 || st->nonfinite_skip) { // rescaled, or dropped when not finite
        EX_CHECK(loom_sched_depend(s, id, clip));
      }
    }
  }
  free(ar);
  free(mar);
}

// What the attention executors of the step just run spent waiting for messages and in the
// attention kernels, and all their calls took, summed over the layers (ms; zeros without servers).
static void attn_step_stats(const step_t *st, int layers, double *wait_ms, double *kernel_ms,
                            double *busy_ms) {
  *wait_ms = *kernel_ms = *busy_ms = 0.0;
  for (int l = 0; st->attn && l < layers; l++) {
    loom_attn_exec_stats_t xs = {0};
    loom_attn_exec_stats(st->attn[l], &xs);
    *wait_ms += xs.wait_ms;
    *kernel_ms += xs.compute_ms;
    *busy_ms += xs.busy_ms;
  }
}

// The same step without the scheduler: (--accum: the micro-batches before the last,) forward,
// whole backward, one fused allreduce of every
// gradient and the loss, clip, AdamW. On a GPU (kernels on this thread's stream, the legacy
// default one) the fusion's buckets are device memory and NCCL moves them after the backward's
// kernels; the loss is a host scalar, so it travels alone (the same mean: one value per rank).
static void fused_step(step_t *st, loom_fusion_t *fusion, loom_tensor_t **reduce) {
  gpt_model_t *m = st->m;
  const int on_host = m->device == LOOM_DEVICE_HOST;
  for (int k = 0; k + 1 < st->o->accum; k++) {
    EX_CHECK(micro_forward(st, k));
    EX_CHECK(micro_backward(st));
  }
  EX_CHECK(task_forward(st));
  for (int u = m->nunits - 1; u >= 0; u--) {
    EX_CHECK(gpt_backward_unit(m, st->a, u, NULL));
  }
  EX_CHECK(loom_fusion_allreduce(fusion, reduce, m->nunits + on_host, LOOM_AVG));
  if (!on_host) {
    EX_CHECK(loom_allreduce(st->dp, &st->loss_t, &st->loss_t, LOOM_AVG));
  }
  for (int l = 0; l < m->cfg.layers; l++) { // MoE gradients: not fused
    for (int p = 0; m->moe[l] && p < LOOM_MOE_PARAM_COUNT; p++) {
      loom_tensor_t *g = loom_moe_grad(m->moe[l], (loom_moe_param_t)p);
      EX_CHECK(loom_allreduce(p == LOOM_MOE_ROUTER ? st->dp : st->edp, g, g, LOOM_AVG));
    }
  }
  EX_CHECK(task_clip(st));
  for (int u = m->nunits - 1; u >= 0 && !st->skip; u--) {
    EX_CHECK(gpt_update_unit(m, u, &st->hp));
  }
}

// ---- evaluation, rates --------------------------------------------------------------------------

// Mean loss over the first val_rows rows of the validation stream: rank r takes rows r, r + N,
// ...; loss sums and token counts are summed over the DP group.
static float validate(const opts_t *o, const gpt_model_t *m, gpt_acts_t *a, gpt_batch_t *vb,
                      const gpt_stream_t *val, const loom_group_t *dp) {
  const int np = loom_group_size(dp), rank = loom_group_rank(dp);
  int64_t rows = gpt_rows(val, o->cfg.ctx);
  rows = rows < o->val_rows ? rows : o->val_rows;
  double sums[2] = {0.0, 0.0}; // loss * tokens, tokens
  // With MoE layers the forward is collective over the expert-parallel group: every rank runs
  // the same number of them (one without a row of its own repeats the last row, not counted).
  for (int64_t r0 = 0; r0 < rows; r0 += np) {
    const int64_t r = r0 + rank;
    if (r >= rows && !m->moe_ep) {
      break;
    }
    float loss = 0.0f;
    gpt_batch_fill(vb, val, r < rows ? r : rows - 1, 1);
    EX_CHECK(gpt_forward(m, a, &vb->tokens, &vb->pos, &vb->target, &vb->cu, &loss, NULL));
    if (r < rows) {
      sums[0] += (double)loss * (double)vb->total;
      sums[1] += (double)vb->total;
    }
  }
  float f[2] = {(float)sums[0], (float)sums[1]};
  loom_tensor_t t;
  int64_t two = 2;
  EX_CHECK(loom_tensor_wrap(&t, f, LOOM_F32, LOOM_DEVICE_HOST, 1, &two, "val"));
  EX_CHECK(loom_allreduce(dp, &t, &t, LOOM_SUM));
  return f[1] > 0 ? f[0] / f[1] : NAN;
}

// The denominator of MFU: loom_gemm_rate's best (this rank's f32 GEMM rate, FLOP/s: on the host
// the faster of the BLAS's sgemm and loom's own kernel at 1024^3, best of reps after a warm-up;
// on CUDA cuBLAS at 4096^3 without TF32) averaged over dp; kernels[0], [1] get the means of the
// BLAS's and loom's kernel's rates (0: not used here). 0 on every rank when a rank could not
// measure it (that rank prints why). reps 0 (--sgemm-reps 0): not measured, -1 everywhere.
static double measure_sgemm(const loom_group_t *dp, int device, int reps, double kernels[2]) {
  if (reps == 0) {
    kernels[0] = kernels[1] = -1.0;
    return -1.0;
  }
  loom_gemm_rate_t rate;
  if (loom_gemm_rate(device, reps, &rate) != LOOM_OK) {
    fprintf(stderr, "train_gpt: rank %d: cannot measure the sgemm rate: %s\n", loom_group_rank(dp),
            loom_last_error(NULL));
    rate.best = rate.blas = rate.loom = 0.0;
  }
  // The rates, and the ranks that failed.
  float sum[4] = {(float)rate.best, (float)rate.blas, (float)rate.loom,
                  rate.best > 0 ? 0.0f : 1.0f};
  loom_tensor_t t;
  int64_t four = 4;
  EX_CHECK(loom_tensor_wrap(&t, sum, LOOM_F32, LOOM_DEVICE_HOST, 1, &four, "sgemm"));
  EX_CHECK(loom_allreduce(dp, &t, &t, LOOM_SUM));
  const int np = loom_group_size(dp);
  kernels[0] = (double)sum[1] / np;
  kernels[1] = (double)sum[2] / np;
  return sum[3] > 0.0f ? 0.0 : (double)sum[0] / np;
}

static float lr_at(const opts_t *o, long step) {
  if (o->warmup > 0 && step < o->warmup) {
    return (float)(o->lr * (double)(step + 1) / (double)o->warmup);
  }
  long span = o->steps - o->warmup > 1 ? o->steps - o->warmup : 1;
  double progress = (double)(step - o->warmup) / (double)span;
  double min_lr = o->lr * o->min_lr_frac;
  return (float)(min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
}

// Load the corpus on every rank; agree on failure so that no rank waits for another, and let the
// lowest failing rank say why.
static int load_corpus(const opts_t *o, const loom_group_t *dp, gpt_corpus_t *c) {
  char err[4400] = "";
  int bad = gpt_corpus_load(o->data, o->ndata, o->val_frac, (uint64_t)o->seed, c, err, sizeof err);
  if (!bad && (gpt_rows(&c->train, o->cfg.ctx) < 1 || gpt_rows(&c->val, o->cfg.ctx) < 1)) {
    snprintf(err, sizeof err,
             "the corpus is too small for --ctx %d: %lld training and %lld validation tokens; "
             "give more text with --data, or a smaller --ctx or a larger --val-frac",
             o->cfg.ctx, (long long)c->train.len, (long long)c->val.len);
    gpt_corpus_free(c);
    bad = 1;
  }
  int32_t first_bad = bad ? loom_group_rank(dp) : loom_group_size(dp);
  loom_tensor_t t;
  int64_t one = 1;
  EX_CHECK(loom_tensor_wrap(&t, &first_bad, LOOM_I32, LOOM_DEVICE_HOST, 1, &one, "load"));
  EX_CHECK(loom_allreduce(dp, &t, &t, LOOM_MIN));
  if (first_bad == loom_group_size(dp)) {
    return 0;
  }
  if (first_bad == loom_group_rank(dp)) {
    fprintf(stderr, "%s: %s\n", ex_prog, err);
  }
  if (!bad) {
    gpt_corpus_free(c);
  }
  return -1;
}

// Generate (on every rank of the MoE group when it spans several: gpt_generate); print when
// print is set.
static void print_sample(const gpt_model_t *m, gpt_acts_t *a, const opts_t *o, int print) {
  int cap = o->sample + 1, len = 1;
  uint8_t *text = malloc((size_t)cap);
  if (!text) {
    return;
  }
  text[0] = GPT_DOC_START;
  EX_CHECK(
      gpt_generate(m, a, text, &len, cap, o->sample, (float)o->temperature, (uint64_t)o->seed));
  if (!print) {
    free(text);
    return;
  }
  printf("sample (%d bytes, temperature %g):\n", len - 1, o->temperature);
  fwrite(text + 1, 1, (size_t)(len - 1), stdout);
  printf("\n-- end of sample\n");
  free(text);
}

// --dump-params: every parameter as raw f32: the flat buffers, then per MoE block its router and
// w1, b1, w2, b2 of all its experts (gathered over the expert-parallel group: collective, every
// rank calls it), so that a dump does not depend on LOOM_EP_SIZE. Rank 0 writes, or every rank
// when the path holds %r.
static int dump_params(const opts_t *o, const gpt_model_t *m, const loom_group_t *ep, int rank) {
  const int P = loom_group_size(ep), L = m->cfg.layers;
  const int n = 1 + L * LOOM_MOE_PARAM_COUNT;
  const loom_tensor_t **all = calloc((size_t)n, sizeof *all);
  loom_tensor_t *tens = calloc((size_t)n, sizeof *tens);
  int k = 0, rc = 0;
  if (!all || !tens) {
    fprintf(stderr, "%s: out of memory\n", ex_prog);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int64_t total = m->total;
  if (m->device == LOOM_DEVICE_HOST) {
    EX_CHECK(
        loom_tensor_wrap(&tens[0], m->flat[0], LOOM_F32, LOOM_DEVICE_HOST, 1, &total, "params"));
  } else { // a host copy of the device parameters
    EX_CHECK(loom_tensor_alloc(&tens[0], LOOM_F32, LOOM_DEVICE_HOST, 1, &total, "params"));
    EX_CHECK(loom_tensor_copy(&tens[0], &m->flat_t[0]));
  }
  all[k++] = &tens[0];
  loom_tensor_t local; // a device MoE tensor's host copy
  for (int l = 0; l < L; l++) {
    for (int p = 0; m->moe[l] && p < LOOM_MOE_PARAM_COUNT; p++) {
      loom_tensor_t *w = loom_moe_param(m->moe[l], (loom_moe_param_t)p);
      const int gather = p != LOOM_MOE_ROUTER && P > 1;
      if (!gather && w->device == LOOM_DEVICE_HOST) {
        all[k++] = w;
        continue;
      }
      const loom_tensor_t *src = w;
      if (w->device != LOOM_DEVICE_HOST) { // gathered (and written) from the host
        EX_CHECK(loom_tensor_alloc(&local, LOOM_F32, LOOM_DEVICE_HOST, w->ndim, w->shape, "moe"));
        EX_CHECK(loom_tensor_copy(&local, w));
        src = &local;
      }
      if (gather) {
        int64_t count = P * loom_tensor_numel(w);
        EX_CHECK(loom_tensor_alloc(&tens[k], LOOM_F32, LOOM_DEVICE_HOST, 1, &count, "experts"));
        EX_CHECK(loom_allgather(ep, src, &tens[k]));
        if (src == &local) {
          loom_tensor_free(&local);
        }
      } else {
        tens[k] = local; // (owned by tens: freed below)
      }
      all[k] = &tens[k];
      k++;
    }
  }
  if (rank == 0 || strstr(o->dump, "%r")) {
    rc = ex_dump_params(o->dump, rank, all, k);
  }
  for (int i = m->device == LOOM_DEVICE_HOST ? 1 : 0; i < n; i++) {
    loom_tensor_free(&tens[i]);
  }
  free(all);
  free(tens);
  return rc;
}

// ---- checkpoints --------------------------------------------------------------------------------

// What a checkpoint of this rank holds: the flat parameters and AdamW moments ("params",
// "adam_m", "adam_v"), each MoE layer's parameters and moments ("moeL.P", "moeL.P.m", "moeL.P.v"),
// the error-feedback residuals ("ef:NAME"), once --compress auto has planned, the plan, and the
// flags the parameters depend on beyond their shapes (a save's "flag:--heads").
// Nothing else is needed: the data rows, the learning rate, Adam's step count and the
// compression seeds all follow from the step number.
static void ckpt_collect(ex_ckpt_set_t *cs, const gpt_model_t *m, const loom_ef_t *ef,
                         const ex_auto_t *plan, int nslots, const ex_ckpt_flag_t *flags,
                         int nflags) {
  const int L = m->cfg.layers;
  ex_ckpt_set_init(cs, 3 + 3 * L * LOOM_MOE_PARAM_COUNT + nflags, ef, nslots);
  ex_ckpt_set_add(cs, &m->flat_t[0], "params");
  ex_ckpt_set_add(cs, &m->flat_t[2], "adam_m");
  ex_ckpt_set_add(cs, &m->flat_t[3], "adam_v");
  char name[LOOM_NAME_MAX];
  for (int l = 0; l < L; l++) {
    for (int p = 0; m->moe[l] && p < LOOM_MOE_PARAM_COUNT; p++) {
      snprintf(name, sizeof name, "moe%d.%d", l, p);
      ex_ckpt_set_add(cs, loom_moe_param(m->moe[l], (loom_moe_param_t)p), name);
      snprintf(name, sizeof name, "moe%d.%d.m", l, p);
      ex_ckpt_set_add(cs, &m->moe_m[l * LOOM_MOE_PARAM_COUNT + p], name);
      snprintf(name, sizeof name, "moe%d.%d.v", l, p);
      ex_ckpt_set_add(cs, &m->moe_v[l * LOOM_MOE_PARAM_COUNT + p], name);
    }
  }
  ex_ckpt_set_add_ef(cs, ef);
  if (plan) { // planned: the candidate index (-1 none), scheme and (device) lane of every part
    ex_ckpt_set_add_plan(cs, plan->codec, plan->scheme,
                         plan->device != LOOM_DEVICE_HOST ? plan->lane : NULL, nslots);
  }
  ex_ckpt_set_add_flags(cs, flags, nflags);
}

// The trainers tell dedicated attention servers that the training is over (or never started):
// the count every server waits for in attn_plan, negative. Once, on every trainer, before
// loom_finalize on every path that returns (MPI_Abort ends the servers anyway).
static const loom_group_t *servers_world; // set while dedicated servers wait for the trainers

static void servers_release(void) {
  if (servers_world) {
    int mine = -1, *counts = calloc((size_t)loom_group_size(servers_world), sizeof(int));
    if (!counts || MPI_Allgather(&mine, 1, MPI_INT, counts, 1, MPI_INT,
                                 loom_group_comm(servers_world)) != MPI_SUCCESS) {
      MPI_Abort(MPI_COMM_WORLD, 1); // the servers would wait forever
    }
    free(counts);
    servers_world = NULL;
  }
}

// ---- main ---------------------------------------------------------------------------------------

int main(int argc, char **argv) {
  ex_prog = "train_gpt";
  opts_t o;
  char err[512] = "";
  int bad_args = parse_args(argc, argv, &o, err, sizeof err);
  if (!bad_args && o.help) {
    usage(stdout);
    return 0;
  }
  if (!bad_args && o.cmp[0]) {
    return ex_compare_dumps(o.cmp[0], o.cmp[1], o.rtol);
  }
  loom_ctx_t *ctx = NULL;
  loom_config_t lc;
  loom_config_init(&lc);
  if (o.attn_servers > 0) { // the layout of the groups depends on it (set even with another bad
    // flag on this rank: ex_agree_start names that one; a difference here would hide it)
    lc.attn_servers = o.attn_spec;
  }
  if (loom_init(&argc, &argv, &lc, &ctx) != LOOM_OK) {
    ex_report_init_failure("train_gpt");
    return 1;
  }
  const loom_group_t *dp = loom_group(ctx, LOOM_GROUP_DP);
  int rank = loom_group_rank(dp), np = loom_group_size(dp);
  if (!bad_args && ex_check_compress_env(o.compress, ctx, err, sizeof err) != 0) {
    bad_args = 1; // before any data is read
  }
  if (ex_agree_start("train_gpt", bad_args, err, argc, argv) != 0) { // every rank, or none
    loom_finalize(ctx);
    return 2;
  }
  { // attention servers: LOOM_ATTN_SERVERS as loom_init took it ("0", "inplace" or N dedicated:
    // the flag, unless the environment set it)
    const char *tv = loom_tunable(ctx, "LOOM_ATTN_SERVERS");
    o.attn_servers = !tv || !strcmp(tv, "0") ? 0 : !strcmp(tv, "inplace") ? 1 : 2;
    snprintf(o.attn_spec_eff, sizeof o.attn_spec_eff, "%s", tv ? tv : "0");
    if (o.attn_spec[0] && loom_rank(ctx) == 0) { // the flag was given: say when it lost
      char flag[24];
      snprintf(flag, sizeof flag, "%ld", strtol(o.attn_spec, NULL, 10)); // N, canonical
      const char *given = !strcmp(o.attn_spec, "0")         ? "0"
                          : !strcmp(o.attn_spec, "inplace") ? "inplace"
                                                            : flag;
      if (strcmp(given, o.attn_spec_eff) != 0) {
        fprintf(stderr,
                "train_gpt: LOOM_ATTN_SERVERS=%s in the environment wins over --attn-servers %s "
                "(as for every LOOM_ tunable): unset it to use the flag\n",
                o.attn_spec_eff, o.attn_spec);
      }
    }
    if (o.attn_servers == 2 && o.sync == SYNC_COMM_ONLY) {
      if (loom_rank(ctx) == 0) {
        fprintf(stderr,
                "train_gpt: LOOM_ATTN_SERVERS=%s (dedicated servers) with --sync "
                "comm-only: the step runs no attention to serve; use another --sync\n",
                tv);
      }
      loom_finalize(ctx);
      return 2;
    }
  }
  if (o.attn_servers == 2 && rank >= 0) {
    servers_world = loom_group(ctx, LOOM_GROUP_WORLD);
  }
  if (rank < 0) { // a dedicated attention server: serves until the trainers are done
    int src = attn_serve(loom_group(ctx, LOOM_GROUP_WORLD),
                         loom_size(ctx) - loom_group_size(loom_group(ctx, LOOM_GROUP_ATTN)), &o.cfg,
                         o.attn_row_cost);
    return loom_finalize(ctx) == LOOM_OK ? src : 1;
  }
  const loom_group_t *ep = loom_group(ctx, LOOM_GROUP_EP);
  const loom_group_t *edp = loom_group(ctx, LOOM_GROUP_EXPERT_DP);
  if (o.cfg.moe_experts > 0 && o.cfg.moe_experts % loom_group_size(ep) != 0) { // before the data
    if (rank == 0) {
      fprintf(stderr,
              "train_gpt: --moe-experts %d is not a multiple of the expert-parallel size %d "
              "(LOOM_EP_SIZE): use a multiple of it\n",
              o.cfg.moe_experts, loom_group_size(ep));
    }
    servers_release();
    loom_finalize(ctx);
    return 2;
  }
  gpt_corpus_t corpus;
  if (load_corpus(&o, dp, &corpus) != 0) {
    servers_release();
    loom_finalize(ctx);
    return 1;
  }

  // ---- model: the same seeded init everywhere, then rank 0's copy to make sure
  gpt_model_t m;
  gpt_acts_t a;
  gpt_batch_t batch, vbatch;
  const int device = ex_device("train_gpt", ctx, o.cuda, rank);
  if (device == -2) {
    servers_release();
    loom_finalize(ctx);
    return 2;
  }
  o.cfg.cuda = o.cuda;
  o.cfg.cuda_device = o.cuda ? device : 0;
  EX_CHECK(gpt_model_alloc(&m, &o.cfg));
  const int micro_rows = o.batch / o.accum; // rows a forward takes (--accum)
  EX_CHECK(gpt_acts_alloc(&a, &o.cfg, (int64_t)micro_rows * o.cfg.ctx));
  EX_CHECK(gpt_batch_alloc(&batch, micro_rows, o.cfg.ctx));
  EX_CHECK(gpt_batch_alloc(&vbatch, 1, o.cfg.ctx));
  EX_CHECK(gpt_model_init(&m, (uint64_t)o.seed));
  // MoE blocks: one layer each over the expert-parallel group, seeded from --seed and the block
  const int moe_ffn = o.moe_ffn > 0 ? o.moe_ffn : 4 * o.cfg.width;
  int nmoe = 0, first_moe = -1;
  for (int l = 0; l < o.cfg.layers; l++) {
    if (!gpt_block_is_moe(&o.cfg, l)) {
      continue;
    }
    loom_moe_config_t mc;
    loom_moe_config_init(&mc);
    mc.num_experts = o.cfg.moe_experts;
    mc.top_k = o.moe_topk;
    mc.hidden = o.cfg.width;
    mc.ffn = moe_ffn;
    mc.capacity_factor = o.moe_capacity;
    mc.aux_coef = (float)(o.moe_aux / o.accum); // per micro-batch: the step's is their mean
    mc.overlap = o.moe_overlap;
    mc.device = o.cuda ? device : LOOM_DEVICE_HOST; // on the GPU: NCCL all-to-alls over ep
    // Tile sizes from rank 0's tuning cache (tests/bench/moe_perf --tune), the same on every
    // trainer (dp: dedicated attention servers are in their own loop by now).
    loom_moe_tuned(ctx, dp, &mc, loom_group_size(ep), (int64_t)micro_rows * o.cfg.ctx);
    uint64_t mix = (uint64_t)o.seed * 0x9e3779b97f4a7c15ull + 0x4d6f45ull * (uint64_t)(l + 1);
    mc.seed = ex_splitmix64(&mix);
    loom_moe_t *moe = NULL;
    loom_status_t status = loom_moe_create(ctx, ep, &mc, &moe); // fails on every rank alike
    if (status != LOOM_OK) {
      if (rank == 0) {
        fprintf(stderr, "train_gpt: --moe-experts %d (LOOM_EP_SIZE %d): %s\n", o.cfg.moe_experts,
                loom_group_size(ep), loom_last_error(NULL));
      }
      gpt_model_free(&m);
      servers_release();
      loom_finalize(ctx);
      return status == LOOM_ERR_INVALID_ARG ? 2 : 1;
    }
    EX_CHECK(gpt_model_set_moe(&m, l, moe));
    first_moe = nmoe++ ? first_moe : l;
  }
  m.moe_ep = nmoe > 0 ? ep : NULL;
  for (int i = 0; i < m.nparams; i++) {
    if (loom_tensor_numel(&m.param[i]) > 0) { // (the dense MLP of a MoE block has none)
      EX_CHECK(loom_broadcast(dp, &m.param[i], 0));
    }
  }
  for (int l = 0; l < o.cfg.layers; l++) { // the routers are replicated: rank 0's too
    if (m.moe[l]) {
      EX_CHECK(loom_broadcast(dp, loom_moe_param(m.moe[l], LOOM_MOE_ROUTER), 0));
    }
  }
  const int64_t C = o.cfg.width, E = o.cfg.moe_experts;
  // Per MoE block: the router and the top-k experts' two matrices multiply each token.
  const int64_t moe_active = nmoe * (C * E + 2 * (int64_t)o.moe_topk * C * moe_ffn);
  const int64_t moe_params = nmoe * (C * E + E * (2 * C * moe_ffn + moe_ffn + C));
  double sgemm_kernels[2];
  double sgemm = measure_sgemm(dp, m.device, o.sgemm_reps, sgemm_kernels);
  const int have_mfu = sgemm > 0.0; // --sgemm-reps 0: no rate, so no MFU
  if (sgemm == 0.0) {               // the rank that failed said why
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const double tokens_per_step = (double)o.batch * o.cfg.ctx * np;
  const double flops_per_token = 6.0 * (double)(m.matmul_params + moe_active);
  ex_mfu_meter_t *meter = calloc(1, sizeof *meter); // the rate sampled through the run
  if (!meter) {
    fprintf(stderr, "train_gpt: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ex_mfu_meter_start(meter, sgemm);

  step_t st = {.o = &o,
               .m = &m,
               .a = &a,
               .b = &batch,
               .corpus = &corpus,
               .dp = dp,
               .ep = ep,
               .edp = edp,
               .nmoe = nmoe,
               .world = loom_group(ctx, LOOM_GROUP_WORLD),
               .attn_ratio = {-1.0, -1.0}};
  int64_t two = 2;
  EX_CHECK(loom_tensor_wrap(&st.loss_t, st.loss, LOOM_F32, LOOM_DEVICE_HOST, 1, &two, "loss"));
  unit_arg_t *ua = calloc(GPT_MAX_PARTS * (size_t)m.nunits, sizeof *ua); // [P u + p]
  moe_arg_t *ma = calloc((size_t)o.cfg.layers * LOOM_MOE_PARAM_COUNT, sizeof *ma);
  micro_arg_t *mb = calloc((size_t)o.accum, sizeof *mb); // the micro-batches before the last
  loom_tensor_t **reduce = calloc((size_t)m.nunits + 1, sizeof *reduce);
  int64_t *moe_count = calloc((size_t)E + 1, sizeof *moe_count); // sent per expert, dropped
  st.trainers = np;
  st.attn_row_cost = o.attn_row_cost;
  if (o.attn_servers > 0) {
    st.attn = calloc((size_t)o.cfg.layers, sizeof *st.attn);
  }
  if (!ua || !ma || !mb || !reduce || !moe_count || (o.attn_servers > 0 && !st.attn)) {
    fprintf(stderr, "train_gpt: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int u = 0; u < m.nunits; u++) {
    reduce[u] = &m.unit_grad[u];
  }
  reduce[m.nunits] = &st.loss_t;
  st.grads = reduce;
  // Compression: --compress, else LOOM_COMPRESS; auto profiles the first steps and plans.
  const char *spec = ex_compress_spec("train_gpt", o.compress, ctx, loom_group_size(dp),
                                      o.sync == SYNC_OVERLAP || o.sync == SYNC_COMM_ONLY, rank);
  const int use_auto = spec && !strcmp(spec, "auto");
  ex_auto_t plan_auto;
  const size_t nparts = GPT_MAX_PARTS * (size_t)m.nunits;
  int nslots = 0, *slot = calloc(nparts, sizeof(int)); // the parts that exist
  const loom_tensor_t **slot_t = calloc(nparts, sizeof *slot_t);
  double *slot_ready = calloc(nparts, sizeof(double));
  st.part_codec = calloc(nparts, sizeof *st.part_codec);
  st.part_scheme = calloc(nparts, sizeof *st.part_scheme);
  st.part_stage = calloc(nparts, sizeof *st.part_stage);
  if (!slot || !slot_t || !slot_ready || !st.part_codec || !st.part_scheme || !st.part_stage) {
    fprintf(stderr, "train_gpt: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int u = 0; u < m.nunits; u++) {
    for (int p = 0; p < gpt_unit_parts(&m, u); p++) {
      slot[nslots] = GPT_MAX_PARTS * u + p;
      slot_t[nslots++] = &m.part_grad[GPT_MAX_PARTS * u + p];
    }
  }
  if (spec && strcmp(spec, "none") != 0 && o.sync != SYNC_OVERLAP && o.sync != SYNC_COMM_ONLY) {
    if (rank == 0) {
      fprintf(stderr, "train_gpt: compression (%s) works with --sync overlap or comm-only\n", spec);
    }
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (use_auto || o.profile) { // when each gradient is ready: auto's profile, --profile
    st.ready = calloc(nparts, sizeof(double));
    if (!st.ready) {
      fprintf(stderr, "train_gpt: out of memory\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if (use_auto) {
    if (ex_auto_init(&plan_auto, nslots, slot_t) != 0) {
      fprintf(stderr, "train_gpt: --compress auto: %s\n", loom_last_error(NULL));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    plan_auto.device = device; // a CUDA device: the plan's lanes are the GPU's
    EX_CHECK(loom_ef_create(&st.ef));
  } else if (spec && strcmp(spec, "none") != 0) {
    EX_CHECK(loom_compressor_create(spec, &st.codec));
    EX_CHECK(loom_ef_create(&st.ef));
    for (size_t i = 0; i < nparts; i++) {
      st.part_codec[i] = st.codec;
      st.part_scheme[i] = o.scheme;
    }
    for (int k = 0; o.cuda && ex_lane_mode(ctx) == EX_LANE_CPU && k < nslots; k++) {
      set_cpu_lane(&st, slot[k], 1); // LOOM_PLAN_LANE=cpu: every gradient
    }
  }
  double plan_time = 0.0;    // s spent measuring and planning in this step (auto)
  double planned_wall = 0.0; // ms of the steps after the plan was applied
  long planned_steps = 0;
  double sent_sum = 0.0; // bytes the compressed allreduces sent from this rank, all steps
  loom_fusion_t *fusion = NULL;
  loom_sched_t *sched = NULL;
  if (o.sync == SYNC_FUSED) {
    EX_CHECK(loom_fusion_create(ctx, dp, 0, &fusion));
  } else {
    // On a GPU the lanes get CUDA streams: comm tasks start after the kernels they wait for.
    loom_sched_opts_t sopts = {.cuda = o.cuda};
    EX_CHECK(loom_sched_create(ctx, &sopts, &sched));
    st.s = sched;
    st.nonfinite_skip = ex_nonfinite_skip(ctx);
    build_step(sched, &st, ua, ma, mb);
  }

  if (rank == 0) {
    printf("train_gpt: %d rank(s)%s, GPT %d layers, width %d, %d heads, ctx %d: %.2fM parameters "
           "(%.2fM in matmuls)\n",
           np, o.cuda ? " on CUDA" : "", o.cfg.layers, o.cfg.width, o.cfg.heads, o.cfg.ctx,
           (double)(m.total + moe_params) / 1e6, (double)(m.matmul_params + moe_active) / 1e6);
    if (nmoe > 0) {
      char blocks[256] = "", capacity[64] = "dropless";
      for (int l = 0, len = 0; l < o.cfg.layers && len < (int)sizeof blocks - 8; l++) {
        if (m.moe[l]) {
          len += snprintf(blocks + len, sizeof blocks - (size_t)len, "%sh%d", len ? " " : "", l);
        }
      }
      if (o.moe_capacity > 0) {
        snprintf(capacity, sizeof capacity, "capacity factor %g", o.moe_capacity);
      }
      printf("moe: %d MoE block(s) (%s), %lld experts of inner width %d, top-%d, %s, aux %g, "
             "overlap %s; %d expert-parallel rank(s) with %lld %s each; %.2fM MoE "
             "parameters, %.2fM of them multiply each token\n",
             nmoe, blocks, (long long)E, moe_ffn, o.moe_topk, capacity, o.moe_aux,
             o.moe_overlap == LOOM_MOE_OVERLAP_DEFAULT ? loom_tunable(ctx, "LOOM_MOE_OVERLAP")
                                                       : loom_moe_overlap_name(o.moe_overlap),
             loom_group_size(ep), (long long)E / loom_group_size(ep),
             E / loom_group_size(ep) == 1 ? "expert" : "experts", (double)moe_params / 1e6,
             (double)moe_active / 1e6);
    }
    printf("data: %d file(s), %lld train documents (%lld tokens, %lld rows), %lld validation "
           "documents (%lld tokens); unigram entropy %.4f nats/byte\n",
           corpus.files, (long long)corpus.train.docs, (long long)corpus.train.len,
           (long long)gpt_rows(&corpus.train, o.cfg.ctx), (long long)corpus.val.docs,
           (long long)corpus.val.len, corpus.unigram_entropy);
    char accum_text[64] = "";
    if (o.accum > 1) {
      snprintf(accum_text, sizeof accum_text, " as %d micro-batches of %d", o.accum, micro_rows);
    }
    printf("batch: %d rows%s x %d tokens per rank (%.0f tokens per step), %ld steps, AdamW lr %g "
           "warmup %ld cosine to %g, wd %g, clip %g; gradient sync: %s\n",
           o.batch, accum_text, o.cfg.ctx, tokens_per_step, o.steps, o.lr, o.warmup,
           o.lr * o.min_lr_frac, o.wd, o.clip, sync_names[o.sync]);
    if (st.codec) {
      printf("compression: %s, %s scheme, error feedback per gradient%s\n",
             loom_compressor_name(st.codec), loom_scheme_name(o.scheme),
             st.part_stage[slot[0]] ? "; encoded by the CPU on pinned host copies "
                                      "(LOOM_PLAN_LANE=cpu)"
                                    : "");
    } else if (use_auto) {
      printf("compression: auto: %d uncompressed steps profiled, then a plan per gradient "
             "(candidates fp16, int8)\n",
             EX_AUTO_PROFILE_STEPS);
    }
    if (!have_mfu) {
      printf("sgemm: not measured (--sgemm-reps 0): no MFU\n");
    } else if (sgemm_kernels[1] > 0.0) {
      // (Means over the ranks: the rate is each rank's faster kernel, so with several ranks it
      // can lie above both kernels' means.)
      printf("sgemm (1024^3, %d BLAS thread(s) per rank): %.1f GFLOP/s per rank, the faster of "
             "the BLAS's sgemm (%.1f) and loom's kernel (%.1f)%s\n",
             loom_blas_threads(ctx), sgemm / 1e9, sgemm_kernels[0] / 1e9, sgemm_kernels[1] / 1e9,
             np > 1 ? " on each rank, means over the ranks" : "");
    } else {
      printf("sgemm (1024^3, %d BLAS thread(s) per rank): %.1f GFLOP/s per rank\n",
             loom_blas_threads(ctx), sgemm / 1e9);
    }
    if (o.doc_skew) {
      printf("doc-lengths: skewed: synthetic lognormal sequence lengths per step and rank (the "
             "corpus tokens, new boundaries)\n");
    }
    if (st.attn && o.attn_servers == 1) {
      printf("attn-servers: inplace, balancer tolerance 0.1\n");
    } else if (st.attn && loom_size(ctx) - np == 1) {
      printf("attn-servers: 1 dedicated (world rank %d serves the attention of the %d %s), "
             "balancer tolerance 0.1\n",
             np, np, np == 1 ? "trainer" : "trainers");
    } else if (st.attn) {
      printf("attn-servers: %d dedicated (world ranks %d..%d serve the attention of the %d "
             "%s), balancer tolerance 0.1\n",
             loom_size(ctx) - np, np, loom_size(ctx) - 1, np, np == 1 ? "trainer" : "trainers");
    }
    fflush(stdout);
  }
  if (o.sync == SYNC_NONE && rank == 0) {
    printf(
        "warning: --sync none: gradients are not averaged, the replicas diverge (timing only)\n");
  }

  // ---- resume
  // The heads split the same parameters otherwise: a resume with other --heads is refused.
  // The seed picks the held-out documents: a resume with another --seed would train on them.
  const ex_ckpt_flag_t ck_flags[] = {{"--heads", o.cfg.heads}, {"--seed", o.seed}};
  const int nck_flags = (int)(sizeof ck_flags / sizeof ck_flags[0]);
  long start = 0;
  int planned = 0; // --compress auto has its plan (made after profiling, or from a checkpoint)
  if (o.ck.resume) {
    long latest = ex_ckpt_latest(o.ck.dir, dp);
    if (latest == -2) {
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (latest >= 0) {
      ex_ckpt_set_t fixed;
      ckpt_collect(&fixed, &m, NULL, NULL, nslots, NULL, 0);
      int bad = ex_ckpt_load("train_gpt", o.ck.dir, dp, latest, &fixed, st.ef,
                             use_auto ? plan_auto.codec : NULL, use_auto ? plan_auto.scheme : NULL,
                             use_auto ? plan_auto.lane : NULL, nslots,
                             use_auto ? plan_auto.ncand : 0, &planned, ck_flags, nck_flags);
      ex_ckpt_set_free(&fixed);
      if (bad) {
        if (rank == 0) {
          fprintf(stderr, "train_gpt: --resume from %s (step %ld) failed: nothing was trained\n",
                  o.ck.dir, latest);
        }
        servers_release();
        loom_finalize(ctx);
        return 1;
      }
      if (planned) {
        apply_plan(&st, &plan_auto, slot, nslots);
      }
      start = latest;
    }
    if (rank == 0) {
      if (latest >= o.steps) {
        printf("resume: step %ld from %s is at or past the last step (%ld): nothing left to "
               "train (raise --steps to go on)\n",
               latest, o.ck.dir, o.steps);
      } else if (latest >= 0) {
        printf("resume: step %ld from %s\n", latest, o.ck.dir);
      } else {
        printf("resume: no checkpoint in %s yet: a fresh start\n", o.ck.dir);
      }
      fflush(stdout);
    }
  }
  if (sched) { // its stats, timeline and failure messages count the steps as this loop does
    EX_CHECK(loom_sched_set_step(sched, start));
  }
  // --compress auto profiles the steps from auto_from, then plans: from step 0, or, resumed past
  // those steps from a checkpoint without a plan (saved under another --compress), from the
  // resumed step (else it would never plan, and train uncompressed).
  const long auto_from = planned || start < EX_AUTO_PROFILE_STEPS ? 0 : start;

  // ---- train
  long nonfinite_steps = 0;
  gpt_profile_t prof; // --profile: the steps after a short warm-up
  const long prof_warm = (o.steps - start) / 4 < 5 ? (o.steps - start) / 4 : 5;
  if (o.profile && gpt_profile_init(&prof, start + prof_warm, nslots) != 0) {
    fprintf(stderr, "train_gpt: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  double last_rss = -1.0; // MiB, the largest over the ranks at the last progress line
  // Each step's time (up to 2^20 of them) for the median: the steady state, without the slower
  // first steps that a mean over a short run includes.
  const long step_times_cap = o.steps - start < (1L << 20) ? o.steps - start : (1L << 20);
  double *step_times = calloc((size_t)(step_times_cap > 0 ? step_times_cap : 1), sizeof(double));
  // With attention servers: each step's exchange waits and kernel time over the layers (ms).
  double *attn_waits = calloc((size_t)(step_times_cap > 0 ? step_times_cap : 1), sizeof(double));
  double *attn_kernels = calloc((size_t)(step_times_cap > 0 ? step_times_cap : 1), sizeof(double));
  double *attn_busy = calloc((size_t)(step_times_cap > 0 ? step_times_cap : 1), sizeof(double));
  long nstep_times = 0;
  if (!step_times || !attn_waits || !attn_kernels || !attn_busy) {
    fprintf(stderr, "train_gpt: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  double train_time = 0.0, wall0 = MPI_Wtime(), tlog = MPI_Wtime(), log_loss = 0.0, pairs_sum = 0.0,
         last_train_loss = 0.0, log_aux = 0.0, last_aux = 0.0;
  long log_from = start;
  float val_loss = NAN;
  loom_step_stats_t sum_stats = {0};
  for (long step = start; step < o.steps; step++) {
    st.die = step == o.ck.die_at;
    st.inject_nan = step == o.inject_nan;
    st.first_row = (step * np + rank) * (int64_t)o.batch;
    st.seed = (uint64_t)step;
    st.sent = 0;
    st.hp = (loom_adamw_t){.lr = lr_at(&o, step),
                           .beta1 = (float)o.beta1,
                           .beta2 = (float)o.beta2,
                           .eps = (float)o.adam_eps,
                           .weight_decay = (float)o.wd,
                           .step = (int)step + 1};
    double t0 = MPI_Wtime();
    st.t_step = t0;
    if (sched) {
      EX_CHECK(loom_sched_run(sched));
      loom_step_stats_t ss;
      EX_CHECK(loom_sched_step_stats(sched, &ss));
      if (use_auto && !planned && step - auto_from < EX_AUTO_PROFILE_STEPS) {
        for (int k = 0; k < nslots; k++) {
          slot_ready[k] = st.ready[slot[k]];
        }
        ex_auto_record(&plan_auto, step - auto_from, slot_ready, ss.compute_ms);
        if (step - auto_from == EX_AUTO_PROFILE_STEPS - 1) {
          double p0 = MPI_Wtime();
          EX_CHECK(ex_auto_plan(&plan_auto, ctx, dp));
          apply_plan(&st, &plan_auto, slot, nslots); // (stages made here: set-up too)
          plan_time = MPI_Wtime() - p0; // measuring and planning is set-up, not training
          planned = 1;
        }
      } else if (use_auto) {
        planned_wall += ss.wall_ms;
        planned_steps++;
      }
      if (o.profile) {
        for (int k = 0; k < nslots; k++) {
          slot_ready[k] = st.ready[slot[k]];
        }
        double wait_ms, kernel_ms, busy_ms; // the attention servers' exchanges (0 without)
        attn_step_stats(&st, o.cfg.layers, &wait_ms, &kernel_ms, &busy_ms);
        gpt_profile_step(&prof, step, &ss, slot_ready, &batch, &m, busy_ms - kernel_ms);
      }
      sum_stats.wall_ms += ss.wall_ms;
      sum_stats.compute_ms += ss.compute_ms;
      sum_stats.comm_ms += ss.comm_ms;
      sum_stats.exposed_comm_ms += ss.exposed_comm_ms;
      sum_stats.idle_ms += ss.idle_ms;
    } else {
      fused_step(&st, fusion, reduce);
    }
    attn_release(&st);
    if (st.skip && o.sync != SYNC_COMM_ONLY) { // every rank saw the same averaged norm
      ex_nonfinite_step("train_gpt", ctx, step, o.steps, (double)st.norm, rank, &nonfinite_steps);
    }
    double t1 = MPI_Wtime();
    if (nstep_times < step_times_cap) {
      attn_step_stats(&st, o.cfg.layers, &attn_waits[nstep_times], &attn_kernels[nstep_times],
                      &attn_busy[nstep_times]);
      step_times[nstep_times++] = t1 - t0 - plan_time;
    }
    train_time += t1 - t0 - plan_time;
    ex_mfu_meter_train(meter, t1 - t0 - plan_time);
    plan_time = 0.0;
    sent_sum += (double)st.sent;
    pairs_sum += (double)st.pairs;
    log_loss += st.loss[0];
    log_aux += st.loss[1];
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) {
      long n = step + 1 - log_from;
      double dt = t1 - tlog, tps = (double)n * tokens_per_step / dt;
      last_train_loss = log_loss / (double)n;
      last_aux = log_aux / (double)n;
      char moe_text[1024] = "", attn_text[64] = "";
      if (st.attn && o.sync != SYNC_COMM_ONLY) { // the last step's plan (the same on every rank)
        snprintf(attn_text, sizeof attn_text, "  attn max/mean %.2f -> %.2f", st.attn_ratio[0],
                 st.attn_ratio[1]);
      }
      if (nmoe > 0 && o.sync != SYNC_COMM_ONLY) { // the last step's routing, over every rank
        loom_moe_stats_t ms;
        loom_moe_stats(m.moe[first_moe], &ms);
        memcpy(moe_count, ms.sent, sizeof(int64_t) * (size_t)E);
        moe_count[E] = 0;
        for (int l = 0; l < o.cfg.layers; l++) {
          if (m.moe[l]) {
            loom_moe_stats(m.moe[l], &ms);
            moe_count[E] += ms.dropped;
          }
        }
        loom_tensor_t ct;
        int64_t ne = E + 1;
        EX_CHECK(loom_tensor_wrap(&ct, moe_count, LOOM_I64, LOOM_DEVICE_HOST, 1, &ne, "counts"));
        EX_CHECK(loom_allreduce(dp, &ct, &ct, LOOM_SUM));
        size_t len = (size_t)snprintf(moe_text, sizeof moe_text, "  aux %.4f experts [", last_aux);
        for (int64_t e = 0; e < E && len < sizeof moe_text - 32; e++) {
          if (e == 32) { // a long list is cut
            len += (size_t)snprintf(moe_text + len, sizeof moe_text - len, " ...");
            break;
          }
          len += (size_t)snprintf(moe_text + len, sizeof moe_text - len, e ? " %lld" : "%lld",
                                  (long long)moe_count[e]);
        }
        len += (size_t)snprintf(moe_text + len, sizeof moe_text - len, "]");
        if (o.moe_capacity > 0 && len < sizeof moe_text) {
          snprintf(moe_text + len, sizeof moe_text - len, " dropped %lld", (long long)moe_count[E]);
        }
      }
      float rss = (float)ex_rss_mib(); // the largest resident set over the ranks
      loom_tensor_t rss_t;
      int64_t one = 1;
      EX_CHECK(loom_tensor_wrap(&rss_t, &rss, LOOM_F32, LOOM_DEVICE_HOST, 1, &one, "rss"));
      EX_CHECK(loom_allreduce(dp, &rss_t, &rss_t, LOOM_MAX));
      last_rss = rss;
      if (rank == 0 && o.sync == SYNC_COMM_ONLY) { // no compute: no loss, norm or MFU
        printf("step %5ld/%ld  %.0f tokens/s  %.1f ms/step  rss %.1f MiB  (communication only)\n",
               step + 1, o.steps, tps, 1e3 * dt / (double)n, (double)rss);
        fflush(stdout);
      } else if (rank == 0) {
        char mfu_text[32] = "";
        if (have_mfu) {
          snprintf(mfu_text, sizeof mfu_text, "  mfu %.3f", tps / np * flops_per_token / sgemm);
        }
        printf("step %5ld/%ld  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tokens/s  %.1f ms/step%s  "
               "rss %.1f MiB%s%s\n",
               step + 1, o.steps, last_train_loss, st.hp.lr, st.norm, tps, 1e3 * dt / (double)n,
               mfu_text, (double)rss, moe_text, attn_text);
        fflush(stdout);
      }
      log_loss = log_aux = 0.0;
      log_from = step + 1;
      tlog = MPI_Wtime();
    }
    int last = step + 1 == o.steps;
    if (o.sync != SYNC_COMM_ONLY && (last || (o.val_every > 0 && (step + 1) % o.val_every == 0))) {
      val_loss = validate(&o, &m, &a, &vbatch, &corpus.val, dp);
      if (rank == 0) {
        printf("step %5ld/%ld  val_loss %.4f  (unigram entropy %.4f)\n", step + 1, o.steps,
               val_loss, corpus.unigram_entropy);
        fflush(stdout);
      }
      tlog = MPI_Wtime(); // validation is not training time
    }
    if (o.ck.save_every > 0 && (step + 1) % o.ck.save_every == 0) { // (not training time either)
      double c0 = MPI_Wtime();
      ex_ckpt_set_t cs;
      ckpt_collect(&cs, &m, st.ef, planned ? &plan_auto : NULL, nslots, ck_flags, nck_flags);
      long drop = step + 1 - 2 * o.ck.save_every; // keep the two newest
      if (ex_ckpt_save(o.ck.dir, dp, step + 1, drop > 0 ? drop : -1, cs.p, cs.n) != 0) {
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      ex_ckpt_set_free(&cs);
      if (rank == 0) {
        printf("step %5ld/%ld  checkpoint %s/step-%08ld (%.2f s)\n", step + 1, o.steps, o.ck.dir,
               step + 1, MPI_Wtime() - c0);
        fflush(stdout);
      }
      tlog += MPI_Wtime() - c0;
    }
    if (have_mfu && o.sync != SYNC_COMM_ONLY && o.sgemm_every > 0 && !last &&
        (step + 1) % o.sgemm_every == 0) { // a sample of the rate (not training time)
      double s0 = MPI_Wtime(), unused[2];
      ex_mfu_meter_sample(meter,
                          measure_sgemm(dp, m.device, o.sgemm_reps < 3 ? o.sgemm_reps : 3, unused));
      tlog += MPI_Wtime() - s0;
    }
  }
  servers_release(); // the dedicated servers' loop ends with the training
  // The rate again: on a shared host it drifts, and MFU (against the start's rate) with it. A
  // diagnostic: when it cannot be measured (a device filled by the run) the report goes on.
  // A resume at or past the last step trains nothing: no rates (-1 in the JSON), no means.
  const int trained = o.steps > start;
  double end_kernels[2];
  const double sgemm_end = o.sync == SYNC_COMM_ONLY || !have_mfu || !trained
                               ? sgemm
                               : measure_sgemm(dp, m.device, o.sgemm_reps, end_kernels);
  const double run_steps = trained ? (double)(o.steps - start) : 1.0; // this process's
  double tokens_per_s = run_steps * tokens_per_step / (train_time > 0 ? train_time : 1e-9);
  double mfu = tokens_per_s / np * flops_per_token / sgemm;
  // Attention FLOPs actually computed: 4 C per causal pair forward, twice that backward.
  double attn_flops = 12.0 * o.cfg.width * o.cfg.layers * pairs_sum / run_steps;
  double mfu_attn =
      (tokens_per_s / np * flops_per_token + attn_flops * tokens_per_s / tokens_per_step) / sgemm;
  // Against the rates sampled through the run (the end's closes the last stretch).
  ex_mfu_meter_sample(meter, sgemm_end);
  const double ref_flops = ex_mfu_meter_ref_flops(meter);
  double mfu_sampled = run_steps * tokens_per_step / np * flops_per_token / ref_flops;
  double mfu_attn_sampled =
      run_steps * (tokens_per_step / np * flops_per_token + attn_flops) / ref_flops;
  const double sgemm_median = ex_mfu_meter_median(meter);
  if (o.sync == SYNC_COMM_ONLY || !have_mfu || !trained) { // nothing computed, or no rate: -1
    mfu = mfu_attn = mfu_sampled = mfu_attn_sampled = -1.0;
  }
  if (!trained) {
    tokens_per_s = last_train_loss = -1.0;
  }
  double n_steps = run_steps;
  char sched_json[320] = "null";
  if (sched && trained) {
    snprintf(sched_json, sizeof sched_json,
             "{\"wall_ms\": %.4f, \"compute_ms\": %.4f, \"comm_ms\": %.4f, "
             "\"exposed_comm_ms\": %.4f, \"idle_ms\": %.4f}",
             sum_stats.wall_ms / n_steps, sum_stats.compute_ms / n_steps,
             sum_stats.comm_ms / n_steps, sum_stats.exposed_comm_ms / n_steps,
             sum_stats.idle_ms / n_steps);
  }
  if (rank == 0 && !trained) {
    printf("done: nothing trained (the checkpoint is at step %ld, --steps is %ld)\n", start,
           o.steps);
  } else if (rank == 0 && o.sync == SYNC_COMM_ONLY) {
    printf("done: %ld steps in %.1f s: %.0f tokens/s, %.1f ms/step (communication only: no loss "
           "or MFU)\n",
           o.steps, train_time, tokens_per_s, 1e3 * train_time / n_steps);
  } else if (rank == 0 && !have_mfu) {
    printf("done: %ld steps in %.1f s of training: %.0f tokens/s, %.1f ms/step, mfu not measured "
           "(--sgemm-reps 0), val_loss %.4f\n",
           o.steps, train_time, tokens_per_s, 1e3 * train_time / n_steps, val_loss);
  } else if (rank == 0) {
    printf("done: %ld steps in %.1f s of training: %.0f tokens/s, %.1f ms/step, mfu %.3f "
           "(with attention %.3f), val_loss %.4f\n",
           o.steps, train_time, tokens_per_s, 1e3 * train_time / n_steps, mfu, mfu_attn, val_loss);
  }
  if (rank == 0 && o.sync != SYNC_COMM_ONLY && have_mfu && trained) { // (--sgemm-reps 0: above)
    if (sgemm_end > 0.0) {
      printf("sgemm at the end: %.1f GFLOP/s per rank (%+.1f%% against the start; MFU uses the "
             "start's rate)\n",
             sgemm_end / 1e9, 100.0 * (sgemm_end - sgemm) / sgemm);
    } else {
      printf("sgemm at the end: not measured (a rank could not, see its message)\n");
    }
    char when[48] = "start and end";
    if (o.sgemm_every > 0) {
      snprintf(when, sizeof when, "start, every %ld steps, end", o.sgemm_every);
    }
    printf("sgemm sampled %d times (%s): median %.1f GFLOP/s per rank, %.1f to %.1f; against "
           "them mfu %.3f (with attention %.3f)\n",
           meter->samples, when, sgemm_median / 1e9, meter->min / 1e9, meter->max / 1e9,
           mfu_sampled, mfu_attn_sampled);
  }
  if (rank == 0 && (st.codec || use_auto) && trained) {
    printf("compression: %s (%s): %.0f bytes sent per rank per step by the compressed "
           "allreduces (uncompressed ring allreduce of everything: %.0f)\n",
           st.codec ? loom_compressor_name(st.codec) : "auto",
           st.codec ? loom_scheme_name(o.scheme) : "per gradient", sent_sum / n_steps,
           np > 1 ? 2.0 * (np - 1) / np * 4.0 * (double)m.total : 0.0);
  }
  if (rank == 0 && use_auto && planned_steps > 0) {
    ex_auto_report(&plan_auto, planned_wall, planned_steps, 1);
  }
  if (rank == 0) {
    if (sched && trained) {
      printf("sched: mean per step: wall %.2f ms  compute %.2f ms  comm in flight %.2f ms  exposed "
             "comm %.2f ms  idle %.2f ms\n",
             sum_stats.wall_ms / n_steps, sum_stats.compute_ms / n_steps,
             sum_stats.comm_ms / n_steps, sum_stats.exposed_comm_ms / n_steps,
             sum_stats.idle_ms / n_steps);
    }
    fflush(stdout);
  }
  // The sample: rank 0, and with MoE layers over several ranks every rank (generation runs their
  // collective forward; rank 0 prints).
  if (o.sample > 0 && o.sync != SYNC_COMM_ONLY &&
      (rank == 0 || (m.moe_ep && loom_group_size(ep) > 1))) {
    print_sample(&m, &a, &o, rank == 0);
    fflush(stdout);
  }

  // ---- results
  int rc = 0;
  if (o.dump) { // the flat parameters, then each MoE layer's router and every expert
    rc |= dump_params(&o, &m, ep, rank) != 0;
  }
  if (o.json && rank == 0) {
    char text[3072], train_loss[32], aux[32]; // null where not finite (a diverged run)
    snprintf(
        text, sizeof text,
        "{\"steps\": %ld, \"np\": %d, \"batch\": %d, \"accum\": %d, \"ctx\": %d, \"layers\": %d, "
        "\"width\": %d, \"heads\": %d, \"params\": %lld, \"matmul_params\": %lld, "
        "\"tokens_per_s\": %.1f, \"step_ms\": %.3f, \"train_loss\": %s, \"val_loss\": "
        "%.6f, \"unigram_entropy\": %.6f, \"mfu\": %.4f, \"mfu_attn\": %.4f, "
        "\"mfu_sampled\": %.4f, \"mfu_attn_sampled\": %.4f, \"sgemm_samples\": %d, "
        "\"sgemm_median_gflops\": %.2f, "
        "\"sgemm_gflops\": %.2f, \"sgemm_blas_gflops\": %.2f, \"sgemm_loom_gflops\": %.2f, "
        "\"sgemm_end_gflops\": %.2f, \"blas_threads\": %d, "
        "\"train_time_s\": %.3f, "
        "\"wall_s\": %.3f, \"sync\": \"%s\", \"lr\": %g, \"seed\": %ld, "
        "\"compress\": \"%s\", \"bytes_sent_per_step\": %.0f, \"sched_step_mean\": %s, "
        "\"moe_experts\": %d, \"moe_every\": %d, \"moe_topk\": %d, \"moe_ffn\": %d, "
        "\"moe_params\": %lld, \"moe_aux\": %s, \"attn_servers\": \"%s\", "
        "\"doc_lengths\": \"%s\", \"attn_max_over_mean_before\": %.4f, "
        "\"attn_max_over_mean\": %.4f, \"device\": \"%s\", \"nonfinite_steps\": %ld, "
        "\"rss_mib\": %.1f, \"step_ms_median\": %.3f, \"attn_wait_ms_median\": %.3f, "
        "\"attn_kernel_ms_median\": %.3f, \"attn_busy_ms_median\": %.3f}\n",
        o.steps, np, o.batch, o.accum, o.cfg.ctx, o.cfg.layers, o.cfg.width, o.cfg.heads,
        (long long)(m.total + moe_params), (long long)(m.matmul_params + moe_active), tokens_per_s,
        trained ? 1e3 * train_time / n_steps : -1.0,
        ex_json_num(train_loss, sizeof train_loss, last_train_loss, 6),
        isfinite(val_loss) ? val_loss : -1.0, corpus.unigram_entropy, mfu, mfu_attn, mfu_sampled,
        mfu_attn_sampled, have_mfu ? meter->samples : 0, have_mfu ? sgemm_median / 1e9 : -1.0,
        have_mfu ? sgemm / 1e9 : -1.0, have_mfu ? sgemm_kernels[0] / 1e9 : -1.0,
        have_mfu ? sgemm_kernels[1] / 1e9 : -1.0,
        have_mfu && sgemm_end > 0 ? sgemm_end / 1e9 : -1.0, loom_blas_threads(ctx), train_time,
        MPI_Wtime() - wall0, sync_names[o.sync], o.lr, o.seed,
        st.codec ? loom_compressor_name(st.codec) : (use_auto ? "auto" : "none"),
        trained ? sent_sum / n_steps : -1.0, sched_json, nmoe ? o.cfg.moe_experts : 0,
        nmoe ? o.cfg.moe_every : 0, nmoe ? o.moe_topk : 0, nmoe ? moe_ffn : 0,
        (long long)moe_params, ex_json_num(aux, sizeof aux, nmoe ? last_aux : 0.0, 6),
        o.attn_servers == 1   ? "inplace"
        : o.attn_servers == 2 ? o.attn_spec_eff
                              : "off",
        o.doc_skew ? "skewed" : "corpus", st.attn_ratio[0], st.attn_ratio[1],
        o.cuda ? "cuda" : "host", nonfinite_steps, last_rss,
        trained ? 1e3 * ex_median(step_times, nstep_times) : -1.0,
        trained ? ex_median(attn_waits, nstep_times) : -1.0,
        trained ? ex_median(attn_kernels, nstep_times) : -1.0,
        trained ? ex_median(attn_busy, nstep_times) : -1.0);
    rc |= ex_write_text(o.json, text) != 0;
  }
  free(meter);
  free(step_times);
  free(attn_waits);
  free(attn_kernels);
  free(attn_busy);
  if (loom_sched_destroy(sched) != LOOM_OK) { // writes the rest of the timeline
    fprintf(stderr, "train_gpt: timeline: %s\n", loom_last_error(NULL));
    rc = 1;
  }
  loom_fusion_destroy(fusion);
  loom_compressor_destroy(st.codec);
  loom_ef_destroy(st.ef);
  if (use_auto) {
    ex_auto_free(&plan_auto);
  }
  free(st.ready);
  free(st.part_codec);
  free(st.part_scheme);
  for (size_t i = 0; i < nparts; i++) { // (the scheduler is gone: no copy in flight)
    loom_host_stage_destroy(st.part_stage[i]);
  }
  free(st.part_stage);
  if (o.profile && rank == 0) {
    rc |= gpt_profile_write(&prof, o.profile, &m, slot_t, np, (int64_t)o.batch * o.cfg.ctx,
                            o.moe_topk, st.attn_row_cost) != 0;
  }
  if (o.profile) {
    gpt_profile_free(&prof);
  }
  free(slot);
  free(slot_t);
  free(slot_ready);
  free(ua);
  free(ma);
  free(mb);
  free(moe_count);
  free(reduce);
  for (int l = 0; st.attn && l < o.cfg.layers; l++) {
    loom_attn_exec_destroy(st.attn[l]);
  }
  free(st.attn);
  gpt_batch_free(&batch);
  gpt_batch_free(&vbatch);
  gpt_acts_free(&a, &o.cfg);
  gpt_model_free(&m);
  gpt_corpus_free(&corpus);
  if (loom_finalize(ctx) != LOOM_OK) {
    fprintf(stderr, "train_gpt: loom_finalize: %s\n", loom_last_error(NULL));
    rc = 1;
  }
  return rc;
}
