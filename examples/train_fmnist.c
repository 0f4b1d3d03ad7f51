/* train_fmnist.c — data-parallel MLP classifier on Fashion-MNIST: every rank holds the model,
 * trains on its slice of each global batch, and averages gradients over the DP group with loom. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_auto.h"
#include "example_ckpt.h"
#include "example_util.h"
#include "fmnist_data.h"
#include "loom.h"

// ---- options ---------------------------------------------------------------------------------

typedef struct opts {
  int epochs;           // epochs to train
  long steps;           // stop after this many optimizer steps in total (0: no limit)
  int batch;            // samples per rank per step; the global batch is batch * ranks
  int accum;            // micro-batches a step: --batch samples in accum pieces of batch / accum
  double lr;            // peak learning rate
  double momentum;      // SGD momentum
  double wd;            // L2 weight decay
  int cosine;           // 1: cosine decay to 0 over the run; 0: constant
  long warmup;          // linear warmup steps
  int hidden;           // width of both hidden layers
  double clip;          // clip the global gradient norm to this (0: off)
  long seed;            // weight init and shuffle
  const char *data;     // directory of the .gz files
  long log_every;       // progress line every N steps (0: per epoch only)
  const char *json;     // final numbers as JSON (rank 0)
  const char *dump;     // raw f32 parameters at the end (%r: every rank, else rank 0)
  const char *cmp[2];   // --compare A B
  double rtol;          // --compare tolerance
  int no_overlap;       // 1: the old path, one fused allreduce after the whole backward
  const char *compress; // --compress: a compressor spec, or NULL
  loom_scheme_t scheme; // --compress-scheme
  int cuda;             // --device cuda: model, momentum and activations on this rank's GPU
  ex_ckpt_opts_t ck;    // --ckpt, --save-every, --resume, --die-at
  long inject_nan;      // --inject-nan S (testing): a NaN in rank 0's gradient at step S; -1 off
  int help;
} opts_t;

static void usage(FILE *out) {
  fprintf(
      out,
      "usage: mpirun -np N train_fmnist [flags]\n"
      "Data-parallel MLP (784 -> H -> H -> 10, GELU) on Fashion-MNIST, SGD with momentum.\n"
      "The global batch is --batch * N, drawn from one seeded shuffle shared by all ranks,\n"
      "so N ranks with --batch B train exactly like 1 rank with --batch N*B.\n"
      "\n"
      "  --epochs N          epochs to train (default 3)\n"
      "  --steps N           stop after N optimizer steps in total, 0 = no limit (default 0)\n"
      "  --batch N           samples per rank per step (default 128)\n"
      "  --accum K           gradient accumulation: each rank's --batch samples run as K\n"
      "                      micro-batches of --batch/K (forward and backward each, the\n"
      "                      gradients summed; one allreduce and one update a step): the same\n"
      "                      step in 1/K of the activation memory (default 1)\n"
      "  --lr X              peak learning rate (default 0.05)\n"
      "  --momentum X        SGD momentum, 0 = plain SGD (default 0.9)\n"
      "  --weight-decay X    L2 weight decay (default 0)\n"
      "  --schedule S        learning-rate schedule: cosine (decay to 0 over the run) or\n"
      "                      const (default cosine)\n"
      "  --warmup N          linear warmup over the first N steps (default 0)\n"
      "  --hidden N          width of the two hidden layers (default 1024)\n"
      "  --clip X            clip the global gradient norm to X, 0 = off (default 0)\n"
      "  --seed N            seed of the weight init and the shuffle (default 42)\n"
      "  --data DIR          directory of the IDX .gz files (default %s)\n"
      "  --log-every N       a progress line every N steps, 0 = only per epoch (default 0)\n"
      "  --json FILE         write the final numbers as JSON (rank 0; a loss that is not\n"
      "                      finite is null; default none)\n"
      "  --dump-params FILE  write every parameter as raw little-endian f32 at the end, in\n"
      "                      the order w1 b1 w2 b2 w3 b3; rank 0 only, or every rank when FILE\n"
      "                      contains %%r (replaced by the rank) (default none)\n"
      "  --compare A B       compare two parameter dumps without MPI: exit 0 when every\n"
      "                      element agrees within --rtol, 1 otherwise\n"
      "  --rtol X            --compare tolerance: |a-b| <= X * max(|a|, |b|, rms) where rms\n"
      "                      is the root mean square of A (default 1e-5)\n"
      "  --no-overlap        average the gradients with one fused allreduce after the whole\n"
      "                      backward pass, without the scheduler (for comparison); by default\n"
      "                      a task graph starts each layer's allreduce as soon as its backward\n"
      "                      is done (layer 3 first) and updates each layer once its own\n"
      "                      average has arrived\n"
      "  --compress SPEC     compress each layer's gradient with SPEC (none, fp16, bf16, int8,\n"
      "                      int8:sr, topk:RATIO, randomk:RATIO, efsign, powersgd:RANK) and\n"
      "                      error feedback, or auto: profile the first steps, then a plan per\n"
      "                      layer; not with --no-overlap (default: LOOM_COMPRESS, auto).\n"
      "                      On --device cuda, LOOM_PLAN_LANE picks what encodes: gpu (the CUDA\n"
      "                      codecs), cpu (the host codecs on a pinned host copy: ByteComp's CPU\n"
      "                      lane) or auto (the plan's lane per layer; with SPEC the GPU)\n"
      "  --compress-scheme S indivisible, divisible or hierarchical (default divisible)\n"
      "  --device D          host or cuda: cuda keeps the model, momentum and activations on\n"
      "                      this rank's GPU (LOOM_GPU picks it; NCCL averages the gradients,\n"
      "                      compressed ones too with the CUDA codecs or PowerSGD on the\n"
      "                      device; with or without --no-overlap) (default host)\n" EX_CKPT_HELP
      "  --inject-nan S      testing: rank 0 puts a NaN in its gradient at step S (before the\n"
      "                      allreduce); LOOM_NONFINITE=abort|skip decides what follows\n"
      "  --help              this text\n"
      "Flags take their value as the next argument or after '='. Bad flags exit 2.\n",
      FMNIST_DEFAULT_DIR);
}

// Fill o from argv. Returns 0, or -1 with a message in err naming the flag.
static int parse_args(int argc, char **argv, opts_t *o, char *err, size_t errlen) {
  *o = (opts_t){.epochs = 3,
                .batch = 128,
                .accum = 1,
                .lr = 0.05,
                .momentum = 0.9,
                .cosine = 1,
                .hidden = 1024,
                .seed = 42,
                .data = FMNIST_DEFAULT_DIR,
                .rtol = 1e-5,
                .ck = EX_CKPT_OPTS_DEFAULT,
                .inject_nan = -1,
                .scheme = LOOM_SCHEME_DIVISIBLE};
  static const char *const switches[] = {"--help", "--no-overlap", "--compare", "--resume", NULL};
  for (int i = 1; i < argc; i++) {
    char flag[64];
    const char *v = NULL;
    if (ex_next_flag(argc, argv, &i, switches, flag, sizeof flag, &v, err, errlen)) {
      return -1;
    }
    if (!strcmp(flag, "--help")) {
      o->help = 1;
      continue;
    }
    if (!strcmp(flag, "--no-overlap")) {
      o->no_overlap = 1;
      continue;
    }
    if (!strcmp(flag, "--compare")) {
      if (i + 2 >= argc) {
        snprintf(err, errlen, "--compare wants two files: --compare A B");
        return -1;
      }
      o->cmp[0] = argv[++i];
      o->cmp[1] = argv[++i];
      continue;
    }
    long l = 0;
    int rc = 0;
    if (!strcmp(flag, "--epochs")) {
      rc = ex_parse_long(flag, v, 1, 1000, &l, err, errlen);
      o->epochs = (int)l;
    } else if (!strcmp(flag, "--steps")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->steps, err, errlen);
    } else if (!strcmp(flag, "--batch")) {
      rc = ex_parse_long(flag, v, 1, 65536, &l, err, errlen);
      o->batch = (int)l;
    } else if (!strcmp(flag, "--accum")) {
      rc = ex_parse_long(flag, v, 1, 65536, &l, err, errlen);
      o->accum = (int)l;
    } else if (!strcmp(flag, "--lr")) {
      rc = ex_parse_double(flag, v, 0.0, 100.0, &o->lr, err, errlen);
    } else if (!strcmp(flag, "--momentum")) {
      rc = ex_parse_double(flag, v, 0.0, 0.999999, &o->momentum, err, errlen);
    } else if (!strcmp(flag, "--weight-decay")) {
      rc = ex_parse_double(flag, v, 0.0, 1.0, &o->wd, err, errlen);
    } else if (!strcmp(flag, "--schedule")) {
      if (!strcmp(v, "cosine") || !strcmp(v, "const")) {
        o->cosine = !strcmp(v, "cosine");
      } else {
        snprintf(err, errlen, "--schedule wants cosine or const, got '%s'", v);
        rc = -1;
      }
    } else if (!strcmp(flag, "--warmup")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->warmup, err, errlen);
    } else if (!strcmp(flag, "--hidden")) {
      rc = ex_parse_long(flag, v, 1, 65536, &l, err, errlen);
      o->hidden = (int)l;
    } else if (!strcmp(flag, "--clip")) {
      rc = ex_parse_double(flag, v, 0.0, 1e30, &o->clip, err, errlen);
    } else if (!strcmp(flag, "--seed")) {
      rc = ex_parse_long(flag, v, 0, 0x7fffffffL, &o->seed, err, errlen);
    } else if (!strcmp(flag, "--data")) {
      o->data = v;
    } else if (!strcmp(flag, "--log-every")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->log_every, err, errlen);
    } else if (!strcmp(flag, "--json")) {
      o->json = v;
    } else if (!strcmp(flag, "--dump-params")) {
      o->dump = v;
    } else if ((rc = ex_parse_ckpt(flag, v, &o->ck, err, errlen)) != 0) {
      rc = rc < 0 ? -1 : 0;
    } else if (!strcmp(flag, "--device")) {
      rc = ex_parse_device(v, &o->cuda, err, errlen);
    } else if (!strcmp(flag, "--inject-nan")) {
      rc = ex_parse_long(flag, v, 0, 1L << 40, &o->inject_nan, err, errlen);
    } else if (!strcmp(flag, "--rtol")) {
      rc = ex_parse_double(flag, v, 0.0, 1.0, &o->rtol, err, errlen);
    } else if ((rc = ex_parse_compress(flag, v, &o->compress, &o->scheme, err, errlen)) != 0) {
      rc = rc < 0 ? -1 : 0;
    } else {
      snprintf(err, errlen, "unknown flag '%s' (see --help)", flag);
      rc = -1;
    }
    if (rc) {
      return -1;
    }
  }
  if (o->compress && strcmp(o->compress, "none") != 0 && o->no_overlap) {
    snprintf(err, errlen, "--compress works with the overlapped step: drop --no-overlap");
    return -1;
  }
  if (ex_check_accum(o->batch, o->accum, err, errlen) != 0) {
    return -1;
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
  return 0;
}

// ---- model -----------------------------------------------------------------------------------

enum { W1, B1, W2, B2, W3, B3, NPARAM };
static const char *const param_names[NPARAM] = {"w1", "b1", "w2", "b2", "w3", "b3"};

typedef struct mlp {
  int device;                     // LOOM_DEVICE_HOST or this rank's CUDA device
  int hidden;                     // H
  loom_tensor_t param[NPARAM];    // w1 (H, 784), b1 (H), w2 (H, H), b2 (H), w3 (10, H), b3 (10)
  loom_tensor_t grad[NPARAM];     // same shapes as param: averaged over the DP group each step
  loom_tensor_t gbuf[NPARAM / 2]; // per layer: its weight then bias gradient, one allocation
  loom_tensor_t mom[NPARAM];      // same shapes as param: SGD momentum buffers
} mlp_t;

typedef struct acts {
  int device;            // where the tensors below live
  int cap;               // B: rows allocated; a call may use fewer (views of the first rows)
  loom_tensor_t x_host;  // (B, 784) the batch as gathered on the host (x itself on the host)
  loom_tensor_t y_host;  // (B) i32
  loom_tensor_t lg_host; // (B, 10) logits read back for the accuracy (logits on the host)
  loom_tensor_t x;       // (B, 784) input pixels
  loom_tensor_t y;       // (B) i32 labels
  loom_tensor_t a1;      // (B, H) x @ w1^T + b1
  loom_tensor_t h1;      // (B, H) gelu(a1)
  loom_tensor_t a2;      // (B, H) h1 @ w2^T + b2
  loom_tensor_t h2;      // (B, H) gelu(a2)
  loom_tensor_t logits;  // (B, 10) h2 @ w3^T + b3
  loom_tensor_t losses;  // (B) per-row cross-entropy
  loom_tensor_t dlogits; // (B, 10) d loss / d logits
  loom_tensor_t dh;      // (B, H) d loss / d h2, then d loss / d h1
  loom_tensor_t da;      // (B, H) d loss / d a2, then d loss / d a1
} acts_t;

static void alloc2(loom_tensor_t *t, int device, int64_t rows, int64_t cols, loom_dtype_t dt,
                   const char *name) {
  int64_t shape[2] = {rows, cols};
  EX_CHECK(loom_tensor_alloc(t, dt, device, cols > 0 ? 2 : 1, shape, name));
}

static void mlp_alloc(mlp_t *m, int hidden, int device) {
  const int64_t rows[NPARAM] = {hidden, hidden, hidden, hidden, FMNIST_CLASSES, FMNIST_CLASSES};
  const int64_t cols[NPARAM] = {FMNIST_PIXELS, 0, hidden, 0, hidden, 0};
  m->hidden = hidden;
  m->device = device;
  // A layer's weight and bias gradients are views of one buffer, so that one allreduce covers
  // the layer.
  for (int l = 0; l < NPARAM / 2; l++) {
    char name[64];
    snprintf(name, sizeof name, "grad.layer%d", l + 1);
    alloc2(&m->gbuf[l], device, rows[2 * l] * cols[2 * l] + rows[2 * l + 1], 0, LOOM_F32, name);
  }
  for (int i = 0; i < NPARAM; i++) {
    char name[64];
    alloc2(&m->param[i], device, rows[i], cols[i], LOOM_F32, param_names[i]);
    snprintf(name, sizeof name, "grad.%s", param_names[i]);
    int64_t shape[2] = {rows[i], cols[i]};
    float *g = (float *)m->gbuf[i / 2].data + (i % 2 ? rows[i - 1] * cols[i - 1] : 0);
    EX_CHECK(loom_tensor_wrap(&m->grad[i], g, LOOM_F32, device, cols[i] > 0 ? 2 : 1, shape, name));
    snprintf(name, sizeof name, "momentum.%s", param_names[i]);
    alloc2(&m->mom[i], device, rows[i], cols[i], LOOM_F32, name);
  }
}

static void mlp_free(mlp_t *m) {
  for (int i = 0; i < NPARAM; i++) {
    loom_tensor_free(&m->param[i]);
    loom_tensor_free(&m->grad[i]);
    loom_tensor_free(&m->mom[i]);
  }
  for (int l = 0; l < NPARAM / 2; l++) {
    loom_tensor_free(&m->gbuf[l]);
  }
}

// PyTorch's nn.Linear default: weight and bias uniform in +-1/sqrt(fan_in). One stream per
// parameter from the seed, so every rank draws the same numbers (made on the host, copied to
// the device on a CUDA model).
static void mlp_init(mlp_t *m, uint64_t seed) {
  for (int i = 0; i < NPARAM; i++) {
    int64_t fan_in = (i == W1 || i == B1) ? FMNIST_PIXELS : m->hidden;
    float bound = 1.0f / sqrtf((float)fan_in);
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + (uint64_t)i + 1;
    loom_tensor_t host = m->param[i];
    if (m->device != LOOM_DEVICE_HOST) {
      EX_CHECK(loom_tensor_alloc(&host, LOOM_F32, LOOM_DEVICE_HOST, m->param[i].ndim,
                                 m->param[i].shape, "init"));
    }
    float *p = host.data;
    for (int64_t k = 0; k < loom_tensor_numel(&m->param[i]); k++) {
      float u = ex_uniform(&state); // [0, 1)
      p[k] = (2.0f * u - 1.0f) * bound;
    }
    if (m->device != LOOM_DEVICE_HOST) {
      EX_CHECK(loom_tensor_copy(&m->param[i], &host));
      loom_tensor_free(&host);
    }
  }
}

static void acts_alloc(acts_t *a, int cap, int hidden, int device) {
  a->cap = cap;
  a->device = device;
  alloc2(&a->x, device, cap, FMNIST_PIXELS, LOOM_F32, "x");
  alloc2(&a->y, device, cap, 0, LOOM_I32, "y");
  alloc2(&a->a1, device, cap, hidden, LOOM_F32, "a1");
  alloc2(&a->h1, device, cap, hidden, LOOM_F32, "h1");
  alloc2(&a->a2, device, cap, hidden, LOOM_F32, "a2");
  alloc2(&a->h2, device, cap, hidden, LOOM_F32, "h2");
  alloc2(&a->logits, device, cap, FMNIST_CLASSES, LOOM_F32, "logits");
  alloc2(&a->losses, device, cap, 0, LOOM_F32, "losses");
  alloc2(&a->dlogits, device, cap, FMNIST_CLASSES, LOOM_F32, "dlogits");
  alloc2(&a->dh, device, cap, hidden, LOOM_F32, "dh");
  alloc2(&a->da, device, cap, hidden, LOOM_F32, "da");
  if (device == LOOM_DEVICE_HOST) { // the staging tensors are the tensors themselves
    a->x_host = a->x, a->y_host = a->y, a->lg_host = a->logits;
    a->x_host.owns_data = a->y_host.owns_data = a->lg_host.owns_data = 0;
  } else {
    alloc2(&a->x_host, LOOM_DEVICE_HOST, cap, FMNIST_PIXELS, LOOM_F32, "x.host");
    alloc2(&a->y_host, LOOM_DEVICE_HOST, cap, 0, LOOM_I32, "y.host");
    alloc2(&a->lg_host, LOOM_DEVICE_HOST, cap, FMNIST_CLASSES, LOOM_F32, "logits.host");
  }
}

static void acts_free(acts_t *a) {
  loom_tensor_t *all[] = {&a->x,  &a->y,      &a->a1,     &a->h1,      &a->a2,
                          &a->h2, &a->logits, &a->losses, &a->dlogits, &a->dh,
                          &a->da, &a->x_host, &a->y_host, &a->lg_host};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    loom_tensor_free(all[i]);
  }
}

// A view of the first n rows of t (no copy).
static loom_tensor_t rows(const loom_tensor_t *t, int64_t n) {
  loom_tensor_t v;
  int64_t shape[LOOM_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[0] = n;
  EX_CHECK(loom_tensor_wrap(&v, t->data, t->dtype, t->device, t->ndim, shape, t->name));
  return v;
}

// Rows idx[start .. start + n) of split (idx NULL: rows start..) into a->x and a->y: gathered on
// the host, then copied to the device on a CUDA model.
static void load_batch(acts_t *a, const fmnist_split_t *split, const int32_t *idx, int64_t start,
                       int64_t n) {
  fmnist_gather(split, idx, start, n, a->x_host.data, a->y_host.data);
  if (a->device != LOOM_DEVICE_HOST) {
    loom_tensor_t x = rows(&a->x, n), y = rows(&a->y, n);
    loom_tensor_t xh = rows(&a->x_host, n), yh = rows(&a->y_host, n);
    EX_CHECK(loom_tensor_copy(&x, &xh));
    EX_CHECK(loom_tensor_copy(&y, &yh));
  }
}

// ---- forward and backward --------------------------------------------------------------------

// Forward over the first n rows of a; returns the mean loss over them.
static float forward(const mlp_t *m, acts_t *a, int64_t n) {
  loom_tensor_t x = rows(&a->x, n), y = rows(&a->y, n), a1 = rows(&a->a1, n), h1 = rows(&a->h1, n),
                a2 = rows(&a->a2, n), h2 = rows(&a->h2, n), logits = rows(&a->logits, n),
                losses = rows(&a->losses, n);
  const loom_tensor_t *p = m->param;
  EX_CHECK(loom_gemm(&a1, &x, 0, &p[W1], 1, &p[B1], 1.0f, 0.0f)); // (n, H)
  EX_CHECK(loom_gelu_forward(&h1, &a1));
  EX_CHECK(loom_gemm(&a2, &h1, 0, &p[W2], 1, &p[B2], 1.0f, 0.0f)); // (n, H)
  EX_CHECK(loom_gelu_forward(&h2, &a2));
  EX_CHECK(loom_gemm(&logits, &h2, 0, &p[W3], 1, &p[B3], 1.0f, 0.0f)); // (n, 10)
  float loss = 0.0f;
  EX_CHECK(loom_cross_entropy_forward(&losses, &loss, &logits, &y, -1));
  return loss;
}

#define TRY(call)                                                                                  \
  do {                                                                                             \
    loom_status_t try_st_ = (call);                                                                \
    if (try_st_ != LOOM_OK) {                                                                      \
      return try_st_;                                                                              \
    }                                                                                              \
  } while (0)

// Backward through layer `layer` (3, 2, then 1) of the last forward over all a->cap rows: its
// weight and bias gradients into m->grad and, above layer 1, the gradient of its input in a->dh.
// A linear layer out = in @ w^T + b has dw = dout^T @ in, db = column sums of dout, din =
// dout @ w. Layer L reads param L only here, so its update may follow at once. s (may be NULL)
// is polled between the big products so that earlier layers' allreduces progress.
// Gradient accumulation (--accum K): add 0 overwrites the gradients (the first micro-batch of a
// step), add 1 adds to them (the later ones); dloss weighs the loss gradient (1/K: the step's
// loss is the mean of its micro-batches' means). add 0 and dloss 1 are the one-batch step.
static loom_status_t backward_layer(mlp_t *m, acts_t *a, int layer, loom_sched_t *s, int add,
                                    float dloss) {
  loom_tensor_t *p = m->param, *g = m->grad;
  int w = 2 * (layer - 1), b = w + 1;
  const float beta = add ? 1.0f : 0.0f; // the weight products: overwrite or add
  if (!add) {
    TRY(loom_tensor_fill(&g[b], 0.0)); // loom_bias_backward adds: start from 0
  }
  if (layer == 3) {
    TRY(loom_cross_entropy_backward(&a->dlogits, &a->logits, &a->y, -1, dloss));
    TRY(loom_gemm(&g[W3], &a->dlogits, 1, &a->h2, 0, NULL, 1.0f, beta)); // (10, H)
    TRY(loom_bias_backward(&g[B3], &a->dlogits));
    TRY(loom_gemm(&a->dh, &a->dlogits, 0, &p[W3], 0, NULL, 1.0f, 0.0f)); // dh2 (B, H)
    return LOOM_OK;
  }
  const loom_tensor_t *in = layer == 2 ? &a->h1 : &a->x, *pre = layer == 2 ? &a->a2 : &a->a1;
  TRY(loom_gelu_backward(&a->da, pre, &a->dh));              // da2 / da1
  TRY(loom_gemm(&g[w], &a->da, 1, in, 0, NULL, 1.0f, beta)); // (H, H) / (H, 784)
  if (s) {
    loom_sched_poll(s);
  }
  TRY(loom_bias_backward(&g[b], &a->da));
  if (layer == 2) {
    TRY(loom_gemm(&a->dh, &a->da, 0, &p[W2], 0, NULL, 1.0f, 0.0f)); // dh1 (B, H)
  }
  return LOOM_OK;
}

// --inject-nan: a NaN in the first element of the last layer's weight gradient, before averaging.
static loom_status_t poison_grad(mlp_t *m) {
  loom_tensor_t first;
  int64_t one = 1;
  const loom_tensor_t *g = &m->grad[W3];
  TRY(loom_tensor_wrap(&first, g->data, LOOM_F32, g->device, 1, &one, "nan"));
  return loom_tensor_fill(&first, NAN);
}

// All three layers, last first (the --no-overlap path, and the micro-batches before a step's
// last); add and dloss as backward_layer.
static loom_status_t backward(mlp_t *m, acts_t *a, int add, float dloss) {
  for (int layer = 3; layer >= 1; layer--) {
    TRY(backward_layer(m, a, layer, NULL, add, dloss));
  }
  return LOOM_OK;
}

// ---- evaluation ------------------------------------------------------------------------------

// Accuracy and mean loss over the test set: each rank takes a contiguous slice, the correct
// counts and loss sums are summed over the DP group.
static void evaluate(const mlp_t *m, acts_t *a, const fmnist_split_t *test, const loom_group_t *dp,
                     float *acc, float *loss) {
  int64_t begin, end;
  fmnist_eval_range(test->n, loom_group_rank(dp), loom_group_size(dp), &begin, &end);
  float sums[2] = {0.0f, 0.0f}; // correct, loss sum
  for (int64_t i = begin; i < end; i += a->cap) {
    int64_t n = end - i < a->cap ? end - i : a->cap;
    load_batch(a, test, NULL, i, n);
    sums[1] += forward(m, a, n) * (float)n;
    if (a->device != LOOM_DEVICE_HOST) {
      loom_tensor_t lg_dev = rows(&a->logits, n), lg_host = rows(&a->lg_host, n);
      EX_CHECK(loom_tensor_copy(&lg_host, &lg_dev));
    }
    const float *lg = a->lg_host.data;
    const int32_t *y = a->y_host.data;
    for (int64_t r = 0; r < n; r++) {
      int best = 0;
      for (int c = 1; c < FMNIST_CLASSES; c++) {
        best = lg[r * FMNIST_CLASSES + c] > lg[r * FMNIST_CLASSES + best] ? c : best;
      }
      sums[0] += best == y[r];
    }
  }
  loom_tensor_t t;
  int64_t two = 2;
  EX_CHECK(loom_tensor_wrap(&t, sums, LOOM_F32, LOOM_DEVICE_HOST, 1, &two, "eval"));
  EX_CHECK(loom_allreduce(dp, &t, &t, LOOM_SUM));
  *acc = sums[0] / (float)test->n;
  *loss = sums[1] / (float)test->n;
}

// ---- parameter dumps -------------------------------------------------------------------------

// Write every parameter as raw f32 (w1 b1 w2 b2 w3 b3) to path, with %r replaced by rank.
static int dump_params(const mlp_t *m, const char *path, int rank) {
  const loom_tensor_t *all[NPARAM];
  loom_tensor_t host[NPARAM] = {{0}}; // host copies of device parameters
  for (int i = 0; i < NPARAM; i++) {
    all[i] = &m->param[i];
    if (m->device != LOOM_DEVICE_HOST) {
      EX_CHECK(loom_tensor_alloc(&host[i], LOOM_F32, LOOM_DEVICE_HOST, m->param[i].ndim,
                                 m->param[i].shape, m->param[i].name));
      EX_CHECK(loom_tensor_copy(&host[i], &m->param[i]));
      all[i] = &host[i];
    }
  }
  int rc = ex_dump_params(path, rank, all, NPARAM);
  for (int i = 0; i < NPARAM; i++) {
    loom_tensor_free(&host[i]);
  }
  return rc;
}

// ---- checkpoints -----------------------------------------------------------------------------

// What a checkpoint of this rank holds: the parameters, the momentum buffers, the error-feedback
// residuals and, once --compress auto has planned, the plan. The data order (the per-epoch
// shuffle) and the learning rate follow from the step number.
static void ckpt_collect(ex_ckpt_set_t *cs, const mlp_t *m, const loom_ef_t *ef,
                         const ex_auto_t *plan, const ex_ckpt_flag_t *flags, int nflags) {
  ex_ckpt_set_init(cs, 2 * NPARAM + nflags, ef, 3);
  char name[LOOM_NAME_MAX];
  for (int i = 0; i < NPARAM; i++) {
    ex_ckpt_set_add(cs, &m->param[i], param_names[i]);
    snprintf(name, sizeof name, "momentum.%s", param_names[i]);
    ex_ckpt_set_add(cs, &m->mom[i], name);
  }
  ex_ckpt_set_add_ef(cs, ef);
  if (plan) {
    ex_ckpt_set_add_plan(cs, plan->codec, plan->scheme,
                         plan->device != LOOM_DEVICE_HOST ? plan->lane : NULL, 3);
  }
  ex_ckpt_set_add_flags(cs, flags, nflags);
}

// ---- training --------------------------------------------------------------------------------

static float lr_at(const opts_t *o, long step, long total) {
  if (o->warmup > 0 && step < o->warmup) {
    return (float)(o->lr * (double)(step + 1) / (double)o->warmup);
  }
  if (!o->cosine) {
    return (float)o->lr;
  }
  long span = total - o->warmup > 1 ? total - o->warmup : 1;
  double progress = (double)(step - o->warmup) / (double)span;
  return (float)(o->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
}

// ---- the step as a task graph ----------------------------------------------------------------

// What the tasks of one step read and write. main sets idx and hp before each loom_sched_run.
typedef struct step {
  mlp_t *m;
  acts_t *a;
  const loom_group_t *dp;
  loom_sched_t *s;
  const fmnist_split_t *train;
  const int32_t *idx;   // this rank's samples of the step (--batch of them)
  int accum;            // --accum K: the step's batch samples as K micro-batches
  int micro;            // batch / accum: the samples of one forward
  int grad_add;         // the backward that follows adds to the gradients (not the first micro)
  float dloss;          // 1 / accum: the weight of each micro-batch's loss gradient
  double loss_sum;      // the micro-batches' mean losses so far
  float loss;           // this rank's mean loss, then (allreduce) the mean over ranks
  loom_tensor_t loss_t; // wraps loss
  float clip;           // --clip
  float norm;           // of the averaged gradient (measured even when clip is 0)
  loom_sgd_t hp;
  int momentum;
  loom_compressor_t *codec;          // --compress SPEC (every layer), or NULL
  loom_compressor_t *layer_codec[3]; // per layer (auto decides), NULL: plain allreduce
  loom_scheme_t layer_scheme[3];
  loom_host_stage_t *layer_stage[3]; // on a device: the stage of a layer the CPU encodes
                                     // (ByteComp's CPU lane), NULL for the GPU's codecs
  double ready[3]; // ms after the step start when each layer's allreduce began (auto's profile)
  double t_step;   // MPI_Wtime at the step start
  loom_ef_t *ef;   // its error feedback, keyed by gradient name
  loom_scheme_t scheme;
  uint64_t seed;      // the step number: ex_compress_seed(seed, layer) per compressed allreduce
  int die;            // --die-at: this step ends the process (SIGKILL) after the forward
  int inject_nan;     // --inject-nan: rank 0 poisons its last layer's gradient in this step
  int skip;           // the averaged gradient is not finite: no update (LOOM_NONFINITE)
  int nonfinite_skip; // LOOM_NONFINITE=skip: the updates wait for the norm
  size_t sent;        // bytes the step's compressed allreduces sent from this rank
} step_t;

typedef struct layer_arg {
  step_t *st;
  int layer; // 1..3
} layer_arg_t;

// The forward of micro-batch k (0..accum-1) of the step: samples idx[k * micro ..]. Sets up the
// gradient accumulation of the backward that follows (the first micro-batch overwrites the
// gradients, later ones add; each loss gradient weighs 1/accum). The last one leaves the step's
// loss, the mean of the micro-batches' means, in st->loss (with one micro-batch: its mean).
static void micro_forward(step_t *st, int k) {
  load_batch(st->a, st->train, st->idx + (int64_t)k * st->micro, 0, st->micro);
  const float loss = forward(st->m, st->a, st->micro);
  st->loss_sum = k == 0 ? loss : st->loss_sum + loss;
  st->loss = st->accum == 1 ? loss : (float)(st->loss_sum / st->accum);
  st->grad_add = k > 0;
  st->dloss = 1.0f / (float)st->accum;
}

// The micro-batches before the last (--accum K > 1): forward and the whole backward, adding to
// the gradients; no allreduce (the last micro-batch's backward starts them).
typedef struct micro_arg {
  step_t *st;
  int k; // 0..accum-2
} micro_arg_t;

static loom_status_t task_micro_forward(void *arg) {
  const micro_arg_t *ma = arg;
  micro_forward(ma->st, ma->k);
  return LOOM_OK;
}

static loom_status_t task_micro_backward(void *arg) {
  const micro_arg_t *ma = arg;
  return backward(ma->st->m, ma->st->a, ma->st->grad_add, ma->st->dloss);
}

// The forward of the step's last micro-batch (the only one without --accum).
static loom_status_t task_forward(void *arg) {
  step_t *st = arg;
  micro_forward(st, st->accum - 1);
  if (st->die) { // --die-at: as a crash would, in the middle of the step
    fflush(stdout);
    raise(SIGKILL);
  }
  return LOOM_OK;
}

static loom_status_t task_loss_allreduce(void *arg, loom_request_t **req) {
  step_t *st = arg;
  return loom_iallreduce(st->dp, &st->loss_t, &st->loss_t, LOOM_AVG, req);
}

static loom_status_t task_backward(void *arg) {
  const layer_arg_t *la = arg;
  TRY(backward_layer(la->st->m, la->st->a, la->layer, la->st->s, la->st->grad_add, la->st->dloss));
  if (la->layer == 3 && la->st->inject_nan && loom_group_rank(la->st->dp) == 0) {
    return poison_grad(la->st->m);
  }
  return LOOM_OK;
}

static loom_status_t task_grad_allreduce(void *arg, loom_request_t **req) {
  const layer_arg_t *la = arg;
  step_t *st = la->st;
  const int l = la->layer - 1;
  loom_tensor_t *g = &st->m->gbuf[l]; // weight and bias gradients of the layer
  st->ready[l] = 1e3 * (MPI_Wtime() - st->t_step);
  if (st->layer_codec[l] && st->layer_stage[l]) { // the CPU lane: see set_cpu_lane
    size_t sent = 0;
    loom_status_t status = loom_icompressed_allreduce_staged(
        st->dp, st->layer_codec[l], st->layer_scheme[l], st->ef, g, st->layer_stage[l], LOOM_AVG,
        ex_compress_seed(st->seed, l), &sent, req);
    st->sent += sent;
    return status;
  }
  if (st->layer_codec[l]) { // encoded now; the rest moves as the request is advanced
    size_t sent = 0;
    loom_status_t status =
        loom_icompressed_allreduce(st->dp, st->layer_codec[l], st->layer_scheme[l], st->ef, g,
                                   LOOM_AVG, ex_compress_seed(st->seed, l), &sent, req);
    st->sent += sent;
    return status;
  }
  return loom_iallreduce(la->st->dp, g, g, LOOM_AVG, req);
}

// The CPU lane of a device gradient (LOOM_PLAN_LANE=cpu, or the auto plan's choice): the stage
// of layer l, made once when the lane is decided (pinned host memory, a copy stream). The
// layer's allreduce task starts on the compute stream after its backward: the copy to the host
// waits there for the kernels that wrote the gradient, the host codecs run as the request is
// advanced, and the request completes once the sum is back on the device, so that the clip and
// the update, queued after it, read the sum. Residuals stay in ef's host table.
static void set_cpu_lane(step_t *st, int l, int cpu) {
  EX_CHECK(ex_cpu_lane_stage(&st->layer_stage[l], &st->m->gbuf[l], cpu));
}

// --compress auto's plan on the three layers.
static void apply_plan(step_t *st, const ex_auto_t *a) {
  for (int l = 0; l < 3; l++) {
    const int c = a->codec[l];
    st->layer_codec[l] = c >= 0 ? a->cand[c] : NULL;
    st->layer_scheme[l] = a->scheme[l];
    set_cpu_lane(st, l, ex_auto_cpu(a, l));
  }
}

static loom_status_t task_clip(void *arg) {
  step_t *st = arg;
  loom_tensor_t *grads[NPARAM];
  for (int i = 0; i < NPARAM; i++) {
    grads[i] = &st->m->grad[i];
  }
  loom_status_t status = loom_clip_grad_norm(grads, NPARAM, st->clip, &st->norm);
  st->skip = status == LOOM_OK && !isfinite(st->norm); // the same on every rank
  return status;
}

static loom_status_t task_update(void *arg) {
  const layer_arg_t *la = arg;
  mlp_t *m = la->st->m;
  if (la->st->skip) {
    return LOOM_OK;
  }
  for (int i = 2 * (la->layer - 1); i < 2 * la->layer; i++) {
    TRY(loom_sgd_update(&m->param[i], &m->grad[i], la->st->momentum ? &m->mom[i] : NULL,
                        &la->st->hp));
  }
  return LOOM_OK;
}

// Build the step graph once: forward; backward layer 3, 2, 1; each layer's gradient allreduce as
// soon as its backward is done and the loss allreduce after the forward; the clip (or, with
// --clip 0, only the norm) over all averaged gradients; each layer's update after its own
// allreduce (and after the clip when clipping, since it rescales every gradient). Backward
// outranks the updates, so the compute lane finishes the backward pass while the allreduces fly.
// With --accum K the micro-batches before the last come first, each a forward and a whole
// backward in a chain (mb: K - 1 arguments).
static void build_step(loom_sched_t *s, step_t *st, layer_arg_t la[3], micro_arg_t *mb) {
  enum { PRIO_FORWARD = 30, PRIO_BACKWARD = 20, PRIO_CLIP = 10, PRIO_UPDATE = 0 };
  int fwd, loss, bwd[4], ar[4], clip, upd, prev = -1;
  loom_task_desc_t d;
  char name[64]; // (loom_sched_add copies it)
  for (int k = 0; k + 1 < st->accum; k++) {
    mb[k] = (micro_arg_t){.st = st, .k = k};
    int id;
    snprintf(name, sizeof name, "forward.micro%d", k);
    d = (loom_task_desc_t){.name = name,
                           .lane = LOOM_LANE_COMPUTE,
                           .priority = PRIO_FORWARD,
                           .run = task_micro_forward,
                           .arg = &mb[k]};
    EX_CHECK(loom_sched_add(s, &d, &id));
    if (prev >= 0) {
      EX_CHECK(loom_sched_depend(s, id, prev));
    }
    snprintf(name, sizeof name, "backward.micro%d", k);
    d = (loom_task_desc_t){.name = name,
                           .lane = LOOM_LANE_COMPUTE,
                           .priority = PRIO_FORWARD,
                           .run = task_micro_backward,
                           .arg = &mb[k]};
    EX_CHECK(loom_sched_add(s, &d, &prev));
    EX_CHECK(loom_sched_depend(s, prev, id));
  }
  d = (loom_task_desc_t){.name = "forward",
                         .lane = LOOM_LANE_COMPUTE,
                         .priority = PRIO_FORWARD,
                         .run = task_forward,
                         .arg = st};
  EX_CHECK(loom_sched_add(s, &d, &fwd));
  if (prev >= 0) {
    EX_CHECK(loom_sched_depend(s, fwd, prev));
  }
  d = (loom_task_desc_t){.name = "allreduce.loss",
                         .lane = LOOM_LANE_COMM,
                         .start = task_loss_allreduce,
                         .arg = st,
                         .bytes = sizeof(float)};
  EX_CHECK(loom_sched_add(s, &d, &loss));
  EX_CHECK(loom_sched_depend(s, loss, fwd));
  static const char *const bwd_names[4] = {"", "backward.layer1", "backward.layer2",
                                           "backward.layer3"};
  static const char *const ar_names[4] = {"", "allreduce.layer1", "allreduce.layer2",
                                          "allreduce.layer3"};
  static const char *const upd_names[4] = {"", "sgd.layer1", "sgd.layer2", "sgd.layer3"};
  for (int l = 3; l >= 1; l--) {
    la[l - 1] = (layer_arg_t){.st = st, .layer = l};
    d = (loom_task_desc_t){.name = bwd_names[l],
                           .lane = LOOM_LANE_COMPUTE,
                           .priority = PRIO_BACKWARD,
                           .run = task_backward,
                           .arg = &la[l - 1]};
    EX_CHECK(loom_sched_add(s, &d, &bwd[l]));
    EX_CHECK(loom_sched_depend(s, bwd[l], l == 3 ? fwd : bwd[l + 1]));
    d = (loom_task_desc_t){.name = ar_names[l],
                           .lane = LOOM_LANE_COMM,
                           .start = task_grad_allreduce,
                           .arg = &la[l - 1],
                           .bytes = loom_tensor_bytes(&st->m->gbuf[l - 1])};
    EX_CHECK(loom_sched_add(s, &d, &ar[l]));
    EX_CHECK(loom_sched_depend(s, ar[l], bwd[l]));
  }
  d = (loom_task_desc_t){.name = st->clip > 0 ? "clip_grad_norm" : "grad_norm",
                         .lane = LOOM_LANE_COMPUTE,
                         .priority = PRIO_CLIP,
                         .run = task_clip,
                         .arg = st};
  EX_CHECK(loom_sched_add(s, &d, &clip));
  for (int l = 3; l >= 1; l--) {
    EX_CHECK(loom_sched_depend(s, clip, ar[l]));
  }
  for (int l = 3; l >= 1; l--) {
    d = (loom_task_desc_t){.name = upd_names[l],
                           .lane = LOOM_LANE_COMPUTE,
                           .priority = PRIO_UPDATE,
                           .run = task_update,
                           .arg = &la[l - 1]};
    EX_CHECK(loom_sched_add(s, &d, &upd));
    EX_CHECK(loom_sched_depend(s, upd, ar[l]));
    // The clip rescales every gradient, and a non-finite norm (LOOM_NONFINITE=skip) drops the
    // update: wait for it.
    if (st->clip > 0 || st->nonfinite_skip) {
      EX_CHECK(loom_sched_depend(s, upd, clip));
    }
  }
}

// Load both splits on every rank; agree on failure so that no rank waits for another, and let
// the lowest failing rank say why.
static int load_data(const opts_t *o, const loom_group_t *dp, fmnist_split_t *train,
                     fmnist_split_t *test) {
  char err[4400] = "";
  loom_status_t st = fmnist_load(o->data, "train", train, err, sizeof err);
  if (st == LOOM_OK) {
    st = fmnist_load(o->data, "t10k", test, err, sizeof err);
  }
  int32_t first_bad = st == LOOM_OK ? loom_group_size(dp) : loom_group_rank(dp);
  loom_tensor_t t;
  int64_t one = 1;
  EX_CHECK(loom_tensor_wrap(&t, &first_bad, LOOM_I32, LOOM_DEVICE_HOST, 1, &one, "load"));
  EX_CHECK(loom_allreduce(dp, &t, &t, LOOM_MIN));
  if (first_bad == loom_group_size(dp)) {
    return 0;
  }
  if (first_bad == loom_group_rank(dp)) {
    fprintf(stderr, "train_fmnist: %s\n", err);
  }
  fmnist_free(train);
  fmnist_free(test);
  return -1;
}

int main(int argc, char **argv) {
  ex_prog = "train_fmnist";
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
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    ex_report_init_failure("train_fmnist");
    return 1;
  }
  const loom_group_t *dp = loom_group(ctx, LOOM_GROUP_DP);
  int rank = loom_group_rank(dp), np = loom_group_size(dp);
  if (!bad_args && ex_check_compress_env(o.compress, ctx, err, sizeof err) != 0) {
    bad_args = 1; // before any data is read
  }
  if (ex_agree_start("train_fmnist", bad_args, err, argc, argv) != 0) { // every rank, or none
    loom_finalize(ctx);
    return 2;
  }
  if (rank < 0) { // a dedicated attention server (LOOM_ATTN_SERVERS): nothing to train here
    return loom_finalize(ctx) == LOOM_OK ? 0 : 1;
  }

  // ---- data
  fmnist_split_t train = {0}, test = {0}; // (a failed load frees both)
  if (load_data(&o, dp, &train, &test) != 0) {
    loom_finalize(ctx);
    return 1;
  }
  float mean, std;
  fmnist_stats(&train, &mean, &std); // same bytes, same code: the same numbers on every rank
  fmnist_normalize(&train, mean, std);
  fmnist_normalize(&test, mean, std);
  int32_t *perm = malloc((size_t)train.n * sizeof(int32_t));
  if (!perm) {
    fprintf(stderr, "train_fmnist: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  long per_epoch = (long)fmnist_steps_per_epoch(train.n, o.batch, np);
  if (per_epoch < 1) {
    if (rank == 0) {
      fprintf(stderr, "train_fmnist: --batch %d on %d ranks exceeds the %lld training samples\n",
              o.batch, np, (long long)train.n);
    }
    free(perm);
    fmnist_free(&train);
    fmnist_free(&test);
    loom_finalize(ctx);
    return 2;
  }
  long total = per_epoch * o.epochs;
  if (o.steps > 0 && o.steps < total) {
    total = o.steps;
  }
  // Compression: --compress, else LOOM_COMPRESS; auto profiles the first steps and plans. Every
  // rank reads the same flags and tunables, so every rank stops here alike (was: MPI_Abort).
  const char *spec =
      ex_compress_spec("train_fmnist", o.compress, ctx, loom_group_size(dp), !o.no_overlap, rank);
  if (spec && strcmp(spec, "none") != 0 && o.no_overlap) {
    if (rank == 0) {
      fprintf(stderr,
              "train_fmnist: compression (%s) needs the overlapped step: drop --no-overlap\n",
              spec);
    }
    free(perm);
    fmnist_free(&train);
    fmnist_free(&test);
    loom_finalize(ctx);
    return 2;
  }

  // ---- model: the same seeded init everywhere, then rank 0's copy to make sure
  mlp_t m;
  acts_t a;
  const int device = ex_device("train_fmnist", ctx, o.cuda, rank);
  if (device == -2) {
    free(perm);
    fmnist_free(&train);
    fmnist_free(&test);
    loom_finalize(ctx);
    return 2;
  }
  mlp_alloc(&m, o.hidden, device);
  // Activations for the samples one forward takes: --batch/--accum (the evaluation goes in
  // pieces of that size too).
  const int micro = o.batch / o.accum;
  acts_alloc(&a, micro, o.hidden, device);
  mlp_init(&m, (uint64_t)o.seed);
  for (int i = 0; i < NPARAM; i++) {
    EX_CHECK(loom_broadcast(dp, &m.param[i], 0));
  }
  loom_fusion_t *fusion = NULL;
  EX_CHECK(loom_fusion_create(ctx, dp, 0, &fusion));
  float step_loss = 0.0f;
  loom_tensor_t loss_t; // (1) this step's mean loss, averaged over ranks with the gradients
  int64_t one = 1;
  EX_CHECK(loom_tensor_wrap(&loss_t, &step_loss, LOOM_F32, LOOM_DEVICE_HOST, 1, &one, "loss"));
  loom_tensor_t *reduce[NPARAM + 1];
  for (int i = 0; i < NPARAM; i++) {
    reduce[i] = &m.grad[i];
  }
  reduce[NPARAM] = &loss_t;
  // The overlapped step: a task graph built once and replayed every step.
  step_t st = {.m = &m,
               .a = &a,
               .dp = dp,
               .train = &train,
               .accum = o.accum,
               .micro = micro,
               .dloss = 1.0f,
               .clip = (float)o.clip,
               .momentum = o.momentum > 0};
  EX_CHECK(loom_tensor_wrap(&st.loss_t, &st.loss, LOOM_F32, LOOM_DEVICE_HOST, 1, &one, "loss"));
  const int use_auto = spec && !strcmp(spec, "auto");
  const loom_tensor_t *layer_t[3] = {&m.gbuf[0], &m.gbuf[1], &m.gbuf[2]};
  ex_auto_t plan_auto;
  if (use_auto) {
    if (ex_auto_init(&plan_auto, 3, layer_t) != 0) {
      fprintf(stderr, "train_fmnist: --compress auto: %s\n", loom_last_error(NULL));
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    plan_auto.device = device; // a CUDA device: the plan's lanes are the GPU's
    EX_CHECK(loom_ef_create(&st.ef));
  } else if (spec && strcmp(spec, "none") != 0) {
    EX_CHECK(loom_compressor_create(spec, &st.codec));
    EX_CHECK(loom_ef_create(&st.ef));
    for (int l = 0; l < 3; l++) {
      st.layer_codec[l] = st.codec;
      st.layer_scheme[l] = o.scheme;
      set_cpu_lane(&st, l, o.cuda && ex_lane_mode(ctx) == EX_LANE_CPU); // LOOM_PLAN_LANE=cpu
    }
  }
  double plan_time = 0.0, planned_wall = 0.0; // s planning; ms of the steps after planning
  long planned_steps = 0;
  double sent_sum = 0.0; // bytes the compressed allreduces sent from this rank, all steps
  layer_arg_t layer_args[3];
  micro_arg_t *micro_args = calloc((size_t)o.accum, sizeof *micro_args); // before the last
  if (!micro_args) {
    fprintf(stderr, "train_fmnist: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  loom_sched_t *sched = NULL;
  if (!o.no_overlap) {
    loom_sched_opts_t sopts = {.cuda = o.cuda}; // CUDA: lanes on streams, deps on events
    EX_CHECK(loom_sched_create(ctx, &sopts, &sched));
    st.s = sched;
    st.nonfinite_skip = ex_nonfinite_skip(ctx);
    build_step(sched, &st, layer_args, micro_args);
  }
  loom_step_stats_t sum_stats = {0};

  if (rank == 0) {
    char accum_text[64] = "";
    if (o.accum > 1) {
      snprintf(accum_text, sizeof accum_text, " as %d micro-batches of %d", o.accum, micro);
    }
    printf("train_fmnist: %d rank(s), batch %d per rank%s (global %d), MLP 784-%d-%d-10, "
           "lr %g %s, momentum %g, %ld steps/epoch, %ld steps\n",
           np, o.batch, accum_text, o.batch * np, o.hidden, o.hidden, o.lr,
           o.cosine ? "cosine" : "const", o.momentum, per_epoch, total);
    printf("gradient sync: %s\n", o.no_overlap
                                      ? "one fused allreduce after the backward (--no-overlap)"
                                      : "per-layer allreduce overlapped with the backward");
    if (st.codec) {
      printf("compression: %s, %s scheme, error feedback per gradient%s\n",
             loom_compressor_name(st.codec), loom_scheme_name(o.scheme),
             st.layer_stage[0] ? "; encoded by the CPU on pinned host copies (LOOM_PLAN_LANE=cpu)"
                               : "");
    } else if (use_auto) {
      printf("compression: auto: %d uncompressed steps profiled, then a plan per layer "
             "(candidates fp16, int8)\n",
             EX_AUTO_PROFILE_STEPS);
    }
    printf("data: %s: %lld train, %lld test, pixel mean %.4f std %.4f\n", o.data,
           (long long)train.n, (long long)test.n, mean, std);
    fflush(stdout);
  }

  // ---- resume: parameters, momentum, residuals and plan; the data order follows from the step
  // and the seed (each epoch's shuffle): a resume with another --seed is refused, as it would not
  // continue the run it resumes.
  const ex_ckpt_flag_t ck_flags[] = {{"--seed", o.seed}};
  const int nck_flags = (int)(sizeof ck_flags / sizeof ck_flags[0]);
  long step = 0;
  int planned = 0;
  if (o.ck.resume) {
    long latest = ex_ckpt_latest(o.ck.dir, dp);
    if (latest == -2) {
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (latest >= 0) {
      ex_ckpt_set_t fixed;
      ckpt_collect(&fixed, &m, NULL, NULL, NULL, 0);
      if (ex_ckpt_load("train_fmnist", o.ck.dir, dp, latest, &fixed, st.ef,
                       use_auto ? plan_auto.codec : NULL, use_auto ? plan_auto.scheme : NULL,
                       use_auto ? plan_auto.lane : NULL, 3, use_auto ? plan_auto.ncand : 0,
                       &planned, ck_flags, nck_flags) != 0) {
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      ex_ckpt_set_free(&fixed);
      if (planned) {
        apply_plan(&st, &plan_auto);
      }
      step = latest;
    }
    if (rank == 0) {
      if (latest >= total) {
        printf("resume: step %ld from %s is at or past the last step (%ld): nothing left to "
               "train (raise --epochs or --steps to go on)\n",
               latest, o.ck.dir, total);
      } else if (latest >= 0) {
        printf("resume: step %ld from %s\n", latest, o.ck.dir);
      } else {
        printf("resume: no checkpoint in %s yet: a fresh start\n", o.ck.dir);
      }
    }
  }
  const long first_step = step;
  if (sched) { // its stats, timeline and failure messages count the steps as this loop does
    EX_CHECK(loom_sched_set_step(sched, step));
  }
  // --compress auto profiles the steps from auto_from, then plans: from step 0, or, resumed past
  // those steps from a checkpoint without a plan (saved under another --compress), from the
  // resumed step (else it would never plan, and train uncompressed).
  const long auto_from = planned || step < EX_AUTO_PROFILE_STEPS ? 0 : step;

  // ---- train
  int epoch = (int)(step / per_epoch);
  double train_time = 0.0;
  long nonfinite_steps = 0; // skipped under LOOM_NONFINITE=skip
  float epoch_loss = 0.0f, acc = 0.0f, test_loss = 0.0f;
  while (step < total) {
    fmnist_permutation(perm, train.n, (uint64_t)o.seed, epoch);
    double t0 = MPI_Wtime(), tlog = t0, loss_sum = 0.0, log_sum = 0.0;
    long s = step - (long)epoch * per_epoch, s0 = s, log_from = step; // s0 > 0 after a resume
    for (; s < per_epoch && step < total; s++, step++) {
      const int32_t *idx = fmnist_shard(perm, s, o.batch, rank, np);
      loom_sgd_t hp = {
          .lr = lr_at(&o, step, total), .momentum = (float)o.momentum, .weight_decay = (float)o.wd};
      float norm = 0.0f; // of the averaged gradient; --clip 0 only measures it
      if (sched) {
        st.idx = idx;
        st.hp = hp;
        st.seed = (uint64_t)step;
        st.die = step == o.ck.die_at;
        st.inject_nan = step == o.inject_nan;
        st.sent = 0;
        st.t_step = MPI_Wtime();
        EX_CHECK(loom_sched_run(sched));
        sent_sum += (double)st.sent;
        loom_step_stats_t ss;
        EX_CHECK(loom_sched_step_stats(sched, &ss));
        if (use_auto && !planned && step - auto_from < EX_AUTO_PROFILE_STEPS) {
          ex_auto_record(&plan_auto, step - auto_from, st.ready, ss.compute_ms);
          if (step - auto_from == EX_AUTO_PROFILE_STEPS - 1) {
            double p0 = MPI_Wtime();
            EX_CHECK(ex_auto_plan(&plan_auto, ctx, dp));
            apply_plan(&st, &plan_auto);   // (stages made here: set-up too)
            plan_time += MPI_Wtime() - p0; // set-up, not training
            planned = 1;
          }
        } else if (use_auto) {
          planned_wall += ss.wall_ms;
          planned_steps++;
        }
        sum_stats.wall_ms += ss.wall_ms;
        sum_stats.compute_ms += ss.compute_ms;
        sum_stats.comm_ms += ss.comm_ms;
        sum_stats.exposed_comm_ms += ss.exposed_comm_ms;
        sum_stats.idle_ms += ss.idle_ms;
        step_loss = st.loss;
        norm = st.norm;
        if (st.skip) { // every rank saw the same averaged norm
          ex_nonfinite_step("train_fmnist", ctx, step, total, (double)norm, rank, &nonfinite_steps);
        }
      } else {
        st.idx = idx;
        for (int k = 0; k < o.accum; k++) { // (one pass without --accum)
          micro_forward(&st, k);
          EX_CHECK(backward(&m, &a, st.grad_add, st.dloss));
        }
        step_loss = st.loss;
        if (step == o.inject_nan && rank == 0) {
          EX_CHECK(poison_grad(&m));
        }
        // The loss is a host scalar: on a GPU it travels alone (the buckets are device memory).
        EX_CHECK(
            loom_fusion_allreduce(fusion, reduce, NPARAM + (device == LOOM_DEVICE_HOST), LOOM_AVG));
        if (device != LOOM_DEVICE_HOST) {
          EX_CHECK(loom_allreduce(dp, &loss_t, &loss_t, LOOM_AVG));
        }
        EX_CHECK(loom_clip_grad_norm(reduce, NPARAM, (float)o.clip, &norm)); // gradients, not loss
        if (!isfinite(norm)) {
          ex_nonfinite_step("train_fmnist", ctx, step, total, (double)norm, rank, &nonfinite_steps);
        }
        for (int i = 0; isfinite(norm) && i < NPARAM; i++) {
          EX_CHECK(
              loom_sgd_update(&m.param[i], &m.grad[i], o.momentum > 0 ? &m.mom[i] : NULL, &hp));
        }
      }
      loss_sum += step_loss;
      log_sum += step_loss;
      if (o.ck.save_every > 0 && (step + 1) % o.ck.save_every == 0) {
        double c0 = MPI_Wtime();
        ex_ckpt_set_t cs;
        ckpt_collect(&cs, &m, st.ef, planned ? &plan_auto : NULL, ck_flags, nck_flags);
        long drop = step + 1 - 2 * o.ck.save_every; // keep the two newest
        if (ex_ckpt_save(o.ck.dir, dp, step + 1, drop > 0 ? drop : -1, cs.p, cs.n) != 0) {
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        ex_ckpt_set_free(&cs);
        if (rank == 0) {
          printf("  step %ld/%ld  checkpoint %s/step-%08ld (%.2f s)\n", step + 1, total, o.ck.dir,
                 step + 1, MPI_Wtime() - c0);
          fflush(stdout);
        }
        plan_time += MPI_Wtime() - c0; // not training time
      }
      if (o.log_every > 0 && (step + 1) % o.log_every == 0 && rank == 0) {
        double now = MPI_Wtime();
        printf("  step %ld/%ld  epoch %d  loss %.4f  grad_norm %.3f  lr %.4f  samples/s %.0f\n",
               step + 1, total, epoch + 1, log_sum / (double)(step + 1 - log_from), norm, hp.lr,
               (double)(step + 1 - log_from) * o.batch * np / (now - tlog));
        fflush(stdout);
        tlog = now;
        log_sum = 0.0;
        log_from = step + 1;
      }
    }
    double dt = MPI_Wtime() - t0 - plan_time;
    plan_time = 0.0;
    train_time += dt;
    epoch_loss = (float)(loss_sum / (double)(s > s0 ? s - s0 : 1));
    evaluate(&m, &a, &test, dp, &acc, &test_loss);
    epoch++;
    if (rank == 0) {
      printf("epoch %d  train_loss %.4f  test_loss %.4f  test_acc %.4f  samples/s %.0f  "
             "(%.1f s)\n",
             epoch, epoch_loss, test_loss, acc, (double)(s - s0) * o.batch * np / dt, dt);
      fflush(stdout);
    }
  }
  // A resume at or past the last step trains nothing: no rate or losses (-1 in the JSON).
  const int trained = step > first_step;
  double samples_per_s = trained ? (double)(step - first_step) * o.batch * np / train_time : -1.0;
  if (!trained) {
    epoch_loss = test_loss = acc = -1.0f;
    if (rank == 0) {
      printf("done: nothing trained (the checkpoint is at step %ld, the run ends at %ld)\n", step,
             total);
    }
  }
  if (use_auto && rank == 0 && planned_steps > 0) {
    ex_auto_report(&plan_auto, planned_wall, planned_steps, 2);
  }
  const long run_steps = step - first_step; // this process's steps (after a resume, fewer)
  if ((st.codec || use_auto) && rank == 0 && run_steps > 0) {
    double full = 0.0;
    for (int l = 0; l < NPARAM / 2; l++) {
      full += (double)loom_tensor_bytes(&m.gbuf[l]);
    }
    printf("compression: %s (%s): %.0f bytes sent per rank per step by the compressed "
           "allreduces (uncompressed ring allreduce of every layer: %.0f)\n",
           st.codec ? loom_compressor_name(st.codec) : "auto",
           st.codec ? loom_scheme_name(o.scheme) : "per layer", sent_sum / (double)run_steps,
           np > 1 ? 2.0 * (np - 1) / np * full : 0.0);
  }
  char sched_json[256] = "null";
  if (sched && run_steps > 0) {
    double n = (double)run_steps;
    if (rank == 0) {
      printf("sched: mean per step over %ld steps: wall %.3f ms  compute %.3f ms  comm in flight "
             "%.3f ms  exposed comm %.3f ms  idle %.3f ms\n",
             run_steps, sum_stats.wall_ms / n, sum_stats.compute_ms / n, sum_stats.comm_ms / n,
             sum_stats.exposed_comm_ms / n, sum_stats.idle_ms / n);
      fflush(stdout);
    }
    snprintf(sched_json, sizeof sched_json,
             "{\"wall_ms\": %.4f, \"compute_ms\": %.4f, \"comm_ms\": %.4f, "
             "\"exposed_comm_ms\": %.4f, \"idle_ms\": %.4f}",
             sum_stats.wall_ms / n, sum_stats.compute_ms / n, sum_stats.comm_ms / n,
             sum_stats.exposed_comm_ms / n, sum_stats.idle_ms / n);
  }

  // ---- results
  int rc = 0;
  if (o.dump && (rank == 0 || strstr(o.dump, "%r"))) {
    rc |= dump_params(&m, o.dump, rank) != 0;
  }
  if (o.json && rank == 0) {
    FILE *f = fopen(o.json, "w");
    char train_loss[32], test_loss_s[32]; // null where not finite (a diverged run)
    if (!f ||
        fprintf(f,
                "{\"epochs\": %d, \"steps\": %ld, \"train_loss\": %s, \"test_loss\": "
                "%s, \"test_acc\": %.6f, \"samples_per_s\": %.1f, \"train_time_s\": "
                "%.3f, \"np\": %d, \"batch\": %d, \"accum\": %d, \"global_batch\": %d, "
                "\"hidden\": %d, \"lr\": %g, \"seed\": %ld, \"overlap\": %s, \"compress\": \"%s\", "
                "\"bytes_sent_per_step\": %.0f, \"sched_step_mean\": %s}\n",
                epoch, step, ex_json_num(train_loss, sizeof train_loss, epoch_loss, 6),
                ex_json_num(test_loss_s, sizeof test_loss_s, test_loss, 6), acc, samples_per_s,
                train_time, np, o.batch, o.accum, o.batch * np, o.hidden, o.lr, o.seed,
                o.no_overlap ? "false" : "true",
                st.codec ? loom_compressor_name(st.codec) : (use_auto ? "auto" : "none"),
                run_steps > 0 ? sent_sum / (double)run_steps : -1.0, sched_json) < 0) {
      fprintf(stderr, "train_fmnist: --json: writing %s failed: %s\n", o.json, strerror(errno));
      rc = 1;
    }
    if (f && fclose(f) != 0) {
      fprintf(stderr, "train_fmnist: --json: writing %s failed: %s\n", o.json, strerror(errno));
      rc = 1;
    }
  }
  if (loom_sched_destroy(sched) != LOOM_OK) { // writes the rest of the timeline
    fprintf(stderr, "train_fmnist: timeline: %s\n", loom_last_error(NULL));
    rc = 1;
  }
  loom_fusion_destroy(fusion);
  loom_compressor_destroy(st.codec);
  if (use_auto) {
    ex_auto_free(&plan_auto);
  }
  loom_ef_destroy(st.ef);
  for (int l = 0; l < 3; l++) { // (the scheduler is gone: no copy in flight)
    loom_host_stage_destroy(st.layer_stage[l]);
  }
  free(micro_args);
  acts_free(&a);
  mlp_free(&m);
  free(perm);
  fmnist_free(&train);
  fmnist_free(&test);
  if (loom_finalize(ctx) != LOOM_OK) {
    fprintf(stderr, "train_fmnist: loom_finalize: %s\n", loom_last_error(NULL));
    rc = 1;
  }
  return rc;
}
