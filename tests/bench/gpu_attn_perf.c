/* gpu_attn_perf.c — CUDA varlen attention benchmark (not a test): bf16 forward + backward TFLOP/s
 * at D = 128, H = 16 on causal documents, against the bf16 GEMM rate and a padded batch. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../testutil.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#endif

// Usage: gpu_attn_perf [-n ITERS] [-w WARMUP] [--json FILE]
// Workloads: total T in {4096, 16384} tokens of DOCS causal documents whose lengths are evenly
// spread over [0.2 L, L], so that mean / max = 0.6 (L = T / (0.6 DOCS)); q, k, v, dout bf16
// (T, 16, 128), H_kv = H. Each op: WARMUP untimed calls, then ITERS timed ones between two
// cudaDeviceSynchronize calls (the public op, host-side checks included); medians reported.
// FLOPs as FlashAttention counts them: forward 4 * pairs * D per head, backward 2.5 times that,
// pairs = the (query, key) pairs the causal mask leaves. The same documents padded to L (DOCS
// sequences of L tokens, as a padded kernel computes them) give the padded time; the GEMM rate is
// loom_gemm on bf16 (8192, 8192) device tensors (loom_cuda_gemm when loom_gemm refuses bf16).
// Exit 77 without a CUDA device, 1 when an op fails or an lse is not finite.

#define HEADS    16
#define HEAD_DIM 128
#define DOCS     8
#define GEMM_N   8192

typedef struct opts {
  int iters, warmup;
  const char *json;
} opts_t;

typedef struct attn_row {
  int64_t total, padded_total;
  int docs, max_len;
  double pairs;          // unmasked (query, key) pairs over all heads
  double fwd_ms, bwd_ms; // medians, padding-free
  double fwd_tflops, bwd_tflops, tflops;
  double padded_ms;     // forward + backward of the padded batch
  double ratio_to_gemm; // tflops / gemm tflops
} attn_row_t;

#ifdef LOOM_HAVE_CUDA

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
  fprintf(stderr, "gpu_attn_perf: %s: %s\n", what, loom_last_error(NULL));
  exit(1);
}

static void sync_device(void) {
  cudaError_t rc = cudaDeviceSynchronize();
  if (rc != cudaSuccess) {
    fprintf(stderr, "gpu_attn_perf: cudaDeviceSynchronize: %s\n", cudaGetErrorString(rc));
    exit(1);
  }
}

// A device tensor (device 0) of dtype dt; bf16 ones hold values uniform in [-1, 1) from seed.
static loom_tensor_t device_tensor(loom_dtype_t dt, int ndim, const int64_t *shape, uint64_t seed,
                                   const char *name) {
  loom_tensor_t h, d;
  if (loom_tensor_alloc(&d, dt, 0, ndim, shape, name) != LOOM_OK) {
    die(name);
  }
  if (dt != LOOM_BF16) {
    return d; // an output: zeros
  }
  if (loom_tensor_alloc(&h, LOOM_BF16, LOOM_DEVICE_HOST, ndim, shape, name) != LOOM_OK) {
    die(name);
  }
  uint16_t *x = h.data;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < loom_tensor_numel(&h); i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = loom_f32_to_bf16((float)((double)(s >> 11) * (2.0 / 9007199254740992.0) - 1.0));
  }
  if (loom_tensor_copy(&d, &h) != LOOM_OK) {
    die(name);
  }
  loom_tensor_free(&h);
  return d;
}

// The batch of nd documents of lengths len (queries and keys alike) on device 0.
typedef struct batch {
  int64_t total;
  loom_tensor_t cu, q, k, v, dout, out, lse, dq, dk, dv;
} batch_t;

static void batch_init(batch_t *t, const int *len, int nd) {
  memset(t, 0, sizeof *t);
  const int64_t cu_shape[1] = {nd + 1};
  loom_tensor_t hc;
  if (loom_tensor_alloc(&hc, LOOM_I32, LOOM_DEVICE_HOST, 1, cu_shape, "cu_seqlens") != LOOM_OK) {
    die("cu_seqlens");
  }
  int32_t *cu = hc.data;
  cu[0] = 0;
  for (int b = 0; b < nd; b++) {
    cu[b + 1] = cu[b] + len[b];
  }
  t->total = cu[nd];
  if (loom_tensor_alloc(&t->cu, LOOM_I32, 0, 1, cu_shape, "cu_seqlens") != LOOM_OK ||
      loom_tensor_copy(&t->cu, &hc) != LOOM_OK) {
    die("cu_seqlens");
  }
  loom_tensor_free(&hc);
  const int64_t s[3] = {t->total, HEADS, HEAD_DIM}, sl[2] = {HEADS, t->total};
  t->q = device_tensor(LOOM_BF16, 3, s, 1, "q");
  t->k = device_tensor(LOOM_BF16, 3, s, 2, "k");
  t->v = device_tensor(LOOM_BF16, 3, s, 3, "v");
  t->dout = device_tensor(LOOM_BF16, 3, s, 4, "dout");
  t->out = device_tensor(LOOM_BF16, 3, s, 0, "out");
  t->dq = device_tensor(LOOM_BF16, 3, s, 5, "dq"); // filled, then overwritten
  t->dk = device_tensor(LOOM_BF16, 3, s, 6, "dk");
  t->dv = device_tensor(LOOM_BF16, 3, s, 7, "dv");
  t->lse = device_tensor(LOOM_F32, 2, sl, 0, "lse");
}

static void batch_free(batch_t *t) {
  loom_tensor_t *all[] = {&t->cu,  &t->q,   &t->k,  &t->v,  &t->dout,
                          &t->out, &t->lse, &t->dq, &t->dk, &t->dv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    loom_tensor_free(all[i]);
  }
}

static void forward(batch_t *t) {
  if (loom_attention_forward(&t->out, &t->lse, &t->q, &t->k, &t->v, &t->cu, &t->cu, 1, 0.0f) !=
      LOOM_OK) {
    die("loom_attention_forward");
  }
}

static void backward(batch_t *t) {
  if (loom_attention_backward(&t->dq, &t->dk, &t->dv, &t->dout, &t->q, &t->k, &t->v, &t->out,
                              &t->lse, &t->cu, &t->cu, 1, 0.0f) != LOOM_OK) {
    die("loom_attention_backward");
  }
}

// Median milliseconds of forward (which = 0) or backward (which = 1) over o->iters timed calls.
static double time_op(batch_t *t, int which, const opts_t *o) {
  double *ms = malloc(sizeof(double) * (size_t)o->iters);
  for (int i = 0; i < o->warmup + o->iters; i++) {
    sync_device();
    const double t0 = now_s();
    if (which) {
      backward(t);
    } else {
      forward(t);
    }
    sync_device();
    if (i >= o->warmup) {
      ms[i - o->warmup] = 1e3 * (now_s() - t0);
    }
  }
  const double m = median(ms, o->iters);
  free(ms);
  return m;
}

// Every lse of a causal batch with Lq = Lk is finite (each row sees its own key).
static int lse_finite(const batch_t *t) {
  loom_tensor_t h;
  if (loom_tensor_alloc(&h, LOOM_F32, LOOM_DEVICE_HOST, 2, t->lse.shape, "lse") != LOOM_OK ||
      loom_tensor_copy(&h, &t->lse) != LOOM_OK) {
    die("lse download");
  }
  int ok = 1;
  const float *x = h.data;
  for (int64_t i = 0; i < loom_tensor_numel(&h); i++) {
    ok = ok && isfinite(x[i]);
  }
  loom_tensor_free(&h);
  return ok;
}

// Forward + backward of the packed documents and of the padded batch.
static int attention_row(int64_t T, const opts_t *o, double gemm_tflops, attn_row_t *r) {
  int len[DOCS], padded[DOCS];
  const int L = (int)lround((double)T / (0.6 * DOCS));
  memset(r, 0, sizeof *r);
  r->docs = DOCS;
  r->max_len = L;
  for (int b = 0; b < DOCS; b++) {
    len[b] = (int)lround(L * (0.2 + 0.8 * b / (DOCS - 1.0)));
    padded[b] = L;
    r->pairs += (double)HEADS * 0.5 * len[b] * (len[b] + 1.0);
  }
  batch_t t;
  batch_init(&t, len, DOCS);
  r->total = t.total;
  r->fwd_ms = time_op(&t, 0, o);
  r->bwd_ms = time_op(&t, 1, o);
  const int ok = lse_finite(&t);
  batch_free(&t);

  batch_init(&t, padded, DOCS);
  r->padded_total = t.total;
  r->padded_ms = time_op(&t, 0, o) + time_op(&t, 1, o);
  batch_free(&t);

  const double fwd_flops = 4.0 * r->pairs * HEAD_DIM, bwd_flops = 2.5 * fwd_flops;
  r->fwd_tflops = fwd_flops / (r->fwd_ms * 1e9);
  r->bwd_tflops = bwd_flops / (r->bwd_ms * 1e9);
  r->tflops = (fwd_flops + bwd_flops) / ((r->fwd_ms + r->bwd_ms) * 1e9);
  r->ratio_to_gemm = gemm_tflops > 0 ? r->tflops / gemm_tflops : 0.0;
  if (!ok) {
    fprintf(stderr, "gpu_attn_perf: T=%lld: an lse is not finite\n", (long long)T);
  }
  return ok;
}

// bf16 C = A B at GEMM_N^3: median milliseconds; loom_cuda_gemm when loom_gemm refuses bf16.
static double gemm_ms(const opts_t *o, const char **how) {
  const int64_t s[2] = {GEMM_N, GEMM_N};
  loom_tensor_t a = device_tensor(LOOM_BF16, 2, s, 11, "a");
  loom_tensor_t b = device_tensor(LOOM_BF16, 2, s, 12, "b");
  loom_tensor_t c = device_tensor(LOOM_BF16, 2, s, 13, "c");
  int direct = loom_gemm(&c, &a, 0, &b, 0, NULL, 1.0f, 0.0f) != LOOM_OK;
  *how = direct ? "loom_cuda_gemm" : "loom_gemm";
  double *ms = malloc(sizeof(double) * (size_t)o->iters);
  for (int i = 0; i < o->warmup + o->iters; i++) {
    sync_device();
    const double t0 = now_s();
    loom_status_t st = direct
                           ? loom_cuda_gemm(LOOM_BF16, 0, 0, GEMM_N, GEMM_N, GEMM_N, 1.0f, a.data,
                                            GEMM_N, b.data, GEMM_N, NULL, 0.0f, c.data, GEMM_N)
                           : loom_gemm(&c, &a, 0, &b, 0, NULL, 1.0f, 0.0f);
    if (st != LOOM_OK) {
      die(*how);
    }
    sync_device();
    if (i >= o->warmup) {
      ms[i - o->warmup] = 1e3 * (now_s() - t0);
    }
  }
  const double m = median(ms, o->iters);
  free(ms);
  loom_tensor_free(&a);
  loom_tensor_free(&b);
  loom_tensor_free(&c);
  return m;
}

// 0, or -1 when the file could not be written whole (said).
static int write_json(const opts_t *o, const char *device, const char *gemm_how, double gemm_t,
                      double gemm_tflops, const attn_row_t *rows, int n) {
  FILE *f = test_output_open("gpu_attn_perf", "--json", o->json, "w");
  if (!f) {
    return -1;
  }
  fprintf(f, "{\n  \"device\": \"%s\",\n  \"iters\": %d,\n  \"warmup\": %d,\n", device, o->iters,
          o->warmup);
  fprintf(f,
          "  \"gemm\": {\"op\": \"%s\", \"dtype\": \"bf16\", \"n\": %d, \"ms\": %.4f, "
          "\"tflops\": %.2f},\n",
          gemm_how, GEMM_N, gemm_t, gemm_tflops);
  fprintf(f, "  \"attention\": [\n");
  for (int i = 0; i < n; i++) {
    const attn_row_t *r = &rows[i];
    fprintf(f,
            "    {\"dtype\": \"bf16\", \"heads\": %d, \"head_dim\": %d, \"causal\": true, "
            "\"total\": %lld, \"docs\": %d, \"max_len\": %d, \"mean_over_max\": %.4f, "
            "\"pairs\": %.0f, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, \"fwd_tflops\": %.2f, "
            "\"bwd_tflops\": %.2f, \"tflops\": %.2f, \"ratio_to_gemm\": %.4f, "
            "\"padded_total\": %lld, \"padded_ms\": %.4f, \"padded_over_packed\": %.4f}%s\n",
            HEADS, HEAD_DIM, (long long)r->total, r->docs, r->max_len,
            (double)r->total / ((double)r->docs * r->max_len), r->pairs, r->fwd_ms, r->bwd_ms,
            r->fwd_tflops, r->bwd_tflops, r->tflops, r->ratio_to_gemm, (long long)r->padded_total,
            r->padded_ms, r->padded_ms / (r->fwd_ms + r->bwd_ms), i + 1 < n ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  return test_output_close("gpu_attn_perf", "--json", o->json, f);
}

static int run(const opts_t *o) {
  struct cudaDeviceProp prop;
  char device[256] = "unknown";
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    snprintf(device, sizeof device, "%s", prop.name);
  }
  const char *gemm_how = "";
  const double gemm_t = gemm_ms(o, &gemm_how);
  const double gemm_tflops = 2.0 * GEMM_N * (double)GEMM_N * GEMM_N / (gemm_t * 1e9);
  printf("# gpu_attn_perf on %s: bf16, H=%d, D=%d, causal, %d documents (mean/max 0.6); "
         "median of %d after %d warmup\n",
         device, HEADS, HEAD_DIM, DOCS, o->iters, o->warmup);
  printf("# GEMM bf16 %d^3 (%s): %.3f ms, %.1f TFLOP/s\n", GEMM_N, gemm_how, gemm_t, gemm_tflops);
  printf("# %7s %6s %9s %9s %8s %8s %8s %7s %9s %7s\n", "total", "maxlen", "fwd(ms)", "bwd(ms)",
         "fwdTF/s", "bwdTF/s", "TF/s", "/gemm", "padded", "pad/pf");
  static const int64_t totals[2] = {4096, 16384};
  attn_row_t rows[2];
  int ok = 1;
  for (int i = 0; i < 2; i++) {
    ok = attention_row(totals[i], o, gemm_tflops, &rows[i]) && ok;
    const attn_row_t *r = &rows[i];
    printf("  %7lld %6d %9.3f %9.3f %8.1f %8.1f %8.1f %7.3f %9.3f %7.2f\n", (long long)r->total,
           r->max_len, r->fwd_ms, r->bwd_ms, r->fwd_tflops, r->bwd_tflops, r->tflops,
           r->ratio_to_gemm, r->padded_ms, r->padded_ms / (r->fwd_ms + r->bwd_ms));
  }
  printf("# TF/s: forward + backward (FlashAttention FLOP count); /gemm: against the bf16 GEMM; "
         "padded: forward + backward ms with every document padded to maxlen; pad/pf: padded over "
         "padding-free time\n");
  if (o->json && write_json(o, device, gemm_how, gemm_t, gemm_tflops, rows, 2) != 0) {
    ok = 0;
  }
  return ok ? 0 : 1;
}

#endif // LOOM_HAVE_CUDA

int main(int argc, char **argv) {
  opts_t o = {10, 3, NULL};
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-n") && i + 1 < argc) {
      if (test_int_arg("gpu_attn_perf", "-n", argv[++i], &o.iters) != 0) {
        return 2;
      }
      if (o.iters < 1) {
        fprintf(stderr, "gpu_attn_perf: -n wants a whole number >= 1\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "-w") && i + 1 < argc) {
      if (test_int_arg("gpu_attn_perf", "-w", argv[++i], &o.warmup) != 0) {
        return 2;
      }
      if (o.warmup < 0) {
        fprintf(stderr, "gpu_attn_perf: -w wants a whole number >= 0\n");
        return 2;
      }
    } else if (!strcmp(argv[i], "--json") && i + 1 < argc) {
      o.json = argv[++i];
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      printf("usage: gpu_attn_perf [-n ITERS] [-w WARMUP] [--json FILE]\n"
             "  -n ITERS      timed calls per measurement (median), default 10\n"
             "  -w WARMUP     untimed calls first, default 3\n"
             "  --json FILE   also write the numbers as JSON\n");
      return 0;
    } else if (!strcmp(argv[i], "-n") || !strcmp(argv[i], "-w") || !strcmp(argv[i], "--json")) {
      fprintf(stderr, "gpu_attn_perf: %s needs a value; see --help\n", argv[i]);
      return 2;
    } else {
      fprintf(stderr, "gpu_attn_perf: unknown flag '%s'; see --help\n", argv[i]);
      return 2;
    }
  }
  if (o.iters < 1 || o.warmup < 0) {
    fprintf(stderr, "gpu_attn_perf: -n must be >= 1 and -w >= 0\n");
    return 2;
  }
  if (test_output_writable("gpu_attn_perf", "--json", o.json) != 0) { // now, not after the run
    return 2;
  }
  if (loom_cuda_device_count() <= 0) {
    printf("gpu_attn_perf: SKIP: no CUDA device visible (loom built %s CUDA)\n",
#ifdef LOOM_HAVE_CUDA
           "with"
#else
           "without"
#endif
    );
    return 77;
  }
#ifdef LOOM_HAVE_CUDA
  return run(&o);
#else
  return 77;
#endif
}
