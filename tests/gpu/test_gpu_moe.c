/* test_gpu_moe.c — the MoE layer on CUDA tensors (router and permutation kernels, cuBLAS experts,
 * NCCL dispatch and combine) against the host layer on the same inputs, under mpirun. */
#include "config.h"
#include "loom.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "cuda/cuda_ctx.h"
#endif

#include "../check_mpi.h"
#include "gpu_test.h"

// What is checked, at the np of the run over the world group as the expert-parallel group (one
// GPU per rank: NCCL refuses two ranks on one GPU; tests/gpu/run_all.sh runs np 2, or np 1 on a
// one-GPU machine):
// - a host layer and a layer with cfg.device = this rank's GPU, built from the same config (so the
//   same parameters), run two forward + backward steps on the same inputs (each rank its own
//   tokens, a different count per rank and per step, one rank with none in one case): y, aux,
//   dx and the five parameter gradients (accumulated over the two steps) agree within
//   |device - host| <= RTOL |host| + ATOL max|host| (RTOL 1e-4, ATOL 2e-5: f32 everywhere, TF32
//   off; cuBLAS and OpenBLAS sum the GEMMs in different orders), and the routing is the same:
//   the per-expert counts sent and the drops of loom_moe_stats are equal;
// - configs: top-2 dropless with the aux loss (host overlap fine); top-1 with capacity 1.0
//   dropping the lowest weights (host coarse); top-3 dropless without aux, overlap none, odd
//   sizes;
// - one step with the calling thread's current stream a non-blocking stream (x comes from a
//   kernel on it just before the call; y, dx are read after synchronising that stream only);
// - a host tensor passed to the device layer and host memory labelled as device memory are
//   LOOM_ERR_INVALID_ARG.
// Exits 77 (SKIP) without NCCL, without a visible GPU, or with two ranks of a node on one GPU.

static const char *kTest = "test_gpu_moe";

#define RTOL 1e-4
#define ATOL 2e-5

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

#ifdef LOOM_HAVE_NCCL

static int g_rank, g_gpu;

typedef struct moe_case {
  const char *name;
  int experts_per_rank, top_k;
  int64_t hidden, ffn;
  double capacity;
  loom_moe_drop_t drop;
  float aux;
  int overlap;       // of the host layer (the device layer runs none)
  int64_t tokens[2]; // per step, on rank 0 (rank r has tokens + 3 r, or 0 when empty_rank == r)
  int empty_rank;    // a rank without tokens in step 1, or -1
} moe_case_t;

static loom_tensor_t dev_tensor(int64_t rows, int64_t cols, const char *name) {
  loom_tensor_t d;
  const int64_t shape[2] = {rows, cols};
  loom_status_t st = loom_tensor_alloc(&d, LOOM_F32, g_gpu, 2, shape, name);
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: device allocation of %s: %s\n", name, loom_last_error(NULL));
    exit(1);
  }
  return d;
}

// Host tensor h to device tensor d (same shape), and wait.
static void put(loom_tensor_t *d, const loom_tensor_t *h) {
  OK(loom_tensor_copy(d, h));
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
}

static double max_abs(const loom_tensor_t *h) {
  const float *p = h->data;
  double m = 0.0;
  for (int64_t i = 0; i < loom_tensor_numel(h); i++) {
    m = fabs(p[i]) > m ? fabs(p[i]) : m;
  }
  return m;
}

// Device tensor d against host tensor h (the tolerance of the file's comment).
static void compare(const char *what, const loom_tensor_t *d, const loom_tensor_t *h) {
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
  char label[192];
  snprintf(label, sizeof label, "rank %d: %s", g_rank, what);
  gpu_compare(label, d, h, RTOL, ATOL * max_abs(h) + 1e-30);
}

// The same routing on both layers: counts sent per expert and drops.
static void same_routing(const char *what, const loom_moe_t *host, const loom_moe_t *dev) {
  loom_moe_stats_t a, b;
  loom_moe_stats(host, &a);
  loom_moe_stats(dev, &b);
  int same = a.num_experts == b.num_experts && a.dropped == b.dropped;
  for (int e = 0; same && e < a.num_experts; e++) {
    same = a.sent[e] == b.sent[e];
  }
  for (int e = 0; same && e < a.local_experts; e++) {
    same = a.received[e] == b.received[e];
  }
  CHECK(same, "rank %d: %s: the device layer routed differently (dropped %lld vs %lld)", g_rank,
        what, (long long)b.dropped, (long long)a.dropped);
}

static void run_case(const loom_group_t *ep, const moe_case_t *c, int on_stream) {
  const int np = loom_group_size(ep), me = loom_group_rank(ep);
  char what[192];
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = c->experts_per_rank * np;
  cfg.top_k = c->top_k;
  cfg.hidden = c->hidden;
  cfg.ffn = c->ffn;
  cfg.capacity_factor = c->capacity;
  cfg.drop = c->drop;
  cfg.aux_coef = c->aux;
  cfg.overlap = c->overlap;
  cfg.seed = 7;
  loom_moe_t *mh = NULL, *md = NULL;
  OK(loom_moe_create(NULL, ep, &cfg, &mh));
  cfg.device = g_gpu;
  OK(loom_moe_create(NULL, ep, &cfg, &md));
  if (!mh || !md) {
    loom_moe_destroy(mh);
    loom_moe_destroy(md);
    return;
  }
  // The same parameters on both sides.
  for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
    snprintf(what, sizeof what, "%s: parameter %d at creation", c->name, p);
    compare(what, loom_moe_param(md, (loom_moe_param_t)p), loom_moe_param(mh, (loom_moe_param_t)p));
  }
  cudaStream_t s = NULL;
  if (on_stream) {
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  }
  for (int step = 0; step < 2; step++) {
    const int64_t T = step == 1 && me == c->empty_rank ? 0 : c->tokens[step] + 3 * (int64_t)me;
    const int64_t shape[2] = {T, c->hidden};
    loom_tensor_t xh = test_tensor_f32(2, shape, "x"), yh = test_tensor_f32(2, shape, "y");
    loom_tensor_t dyh = test_tensor_f32(2, shape, "dy"), dxh = test_tensor_f32(2, shape, "dx");
    test_rng_t rng = test_rng(900u + 97u * (uint64_t)me + 13u * (uint64_t)step);
    test_fill_uniform(&rng, test_floats(&xh), T * c->hidden, -1.0, 1.0);
    test_fill_uniform(&rng, test_floats(&dyh), T * c->hidden, -1.0, 1.0);
    loom_tensor_t xd = dev_tensor(T, c->hidden, "x"), yd = dev_tensor(T, c->hidden, "y");
    loom_tensor_t dyd = dev_tensor(T, c->hidden, "dy"), dxd = dev_tensor(T, c->hidden, "dx");
    loom_tensor_t zd = dev_tensor(T, c->hidden, "z");
    put(&dyd, &dyh);
    float aux_h = -1.0f, aux_d = -2.0f;
    OK(loom_moe_forward(mh, &xh, &yh, &aux_h));
    OK(loom_moe_backward(mh, &dyh, &dxh));
    if (on_stream) { // x = x + 0 by a kernel on s, right before the layer reads it on s
      loom_tensor_t xs = dev_tensor(T, c->hidden, "xs");
      put(&xs, &xh);
      OK(loom_tensor_fill(&zd, 0.0));
      CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
      loom_cuda_set_stream(s);
      OK(loom_residual_forward(&xd, &xs, &zd));
      OK(loom_moe_forward(md, &xd, &yd, &aux_d));
      OK(loom_moe_backward(md, &dyd, &dxd));
      CHECK(cudaStreamSynchronize(s) == cudaSuccess, "cudaStreamSynchronize");
      loom_cuda_set_stream(0);
      loom_tensor_free(&xs);
    } else {
      put(&xd, &xh);
      OK(loom_moe_forward(md, &xd, &yd, &aux_d));
      OK(loom_moe_backward(md, &dyd, &dxd));
    }
    snprintf(what, sizeof what, "%s%s step %d (T %lld)", c->name, on_stream ? " on a stream" : "",
             step, (long long)T);
    same_routing(what, mh, md);
    char item[256];
    snprintf(item, sizeof item, "%s: y", what);
    compare(item, &yd, &yh);
    snprintf(item, sizeof item, "%s: dx", what);
    compare(item, &dxd, &dxh);
    CHECK(fabsf(aux_d - aux_h) <= 1e-5f * fabsf(aux_h) + 1e-7f,
          "rank %d: %s: aux %.9g on the device, %.9g on the host", g_rank, what, (double)aux_d,
          (double)aux_h);
    for (int p = 0; p < LOOM_MOE_PARAM_COUNT; p++) {
      snprintf(item, sizeof item, "%s: gradient %d", what, p);
      compare(item, loom_moe_grad(md, (loom_moe_param_t)p), loom_moe_grad(mh, (loom_moe_param_t)p));
    }
    loom_tensor_free(&xd);
    loom_tensor_free(&yd);
    loom_tensor_free(&dyd);
    loom_tensor_free(&dxd);
    loom_tensor_free(&zd);
    TEST_FREE(&xh, &yh, &dyh, &dxh);
  }
  if (s) {
    cudaStreamDestroy(s);
  }
  loom_moe_destroy(mh);
  loom_moe_destroy(md);
}

static void error_cases(const loom_group_t *ep) {
  const int np = loom_group_size(ep);
  loom_moe_config_t cfg;
  loom_moe_config_init(&cfg);
  cfg.num_experts = 2 * np;
  cfg.top_k = 1;
  cfg.hidden = 8;
  cfg.ffn = 8;
  cfg.device = g_gpu;
  loom_moe_t *m = NULL;
  OK(loom_moe_create(NULL, ep, &cfg, &m));
  if (!m) {
    return;
  }
  const int64_t shape[2] = {4, 8};
  loom_tensor_t xh = test_tensor_f32(2, shape, "x"), yd = dev_tensor(4, 8, "y");
  loom_status_t st = loom_moe_forward(m, &xh, &yd, NULL); // local checks: no rank goes on
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "layer was created on"),
        "a host x on a device layer: %s: %s", loom_strerror(st), loom_last_error(NULL));
  loom_tensor_t fake = xh; // host memory that claims to be on the GPU
  fake.device = g_gpu;
  fake.owns_data = 0;
  st = loom_moe_forward(m, &fake, &yd, NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "not memory of"),
        "host memory as a device tensor: %s: %s", loom_strerror(st), loom_last_error(NULL));
  loom_tensor_free(&yd);
  TEST_FREE(&xh);
  loom_moe_destroy(m);
}

#endif // LOOM_HAVE_NCCL

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "%s: loom_init failed: %s\n", kTest, loom_last_error(NULL));
    return 1;
  }
#ifndef LOOM_HAVE_NCCL
  if (loom_rank(ctx) == 0) {
    printf("%s: SKIP: loom was built without NCCL (the MoE layer on a device needs it)\n", kTest);
  }
  loom_finalize(ctx);
  return GPU_SKIP;
#else
  g_rank = loom_rank(ctx);
  if (gpu_mpi_skipped(ctx, kTest, &g_gpu)) {
    return GPU_SKIP;
  }
  const loom_group_t *ep = loom_group(ctx, LOOM_GROUP_WORLD);
  if (g_rank == 0) {
    printf("%s: %d ranks, GPU %d on rank 0; tolerance RTOL %g, ATOL %g x max|host|\n", kTest,
           loom_group_size(ep), g_gpu, RTOL, ATOL);
  }
  const moe_case_t cases[] = {
      {"top-2 dropless aux",
       4,
       2,
       64,
       96,
       0.0,
       LOOM_MOE_DROP_LATE,
       0.01f,
       LOOM_MOE_OVERLAP_FINE,
       {200, 131},
       -1},
      {"top-1 capacity 1.0 low-weight",
       2,
       1,
       48,
       80,
       1.0,
       LOOM_MOE_DROP_LOW_WEIGHT,
       0.01f,
       LOOM_MOE_OVERLAP_COARSE,
       {160, 97},
       1},
      {"top-3 no aux odd sizes",
       3,
       3,
       37,
       53,
       0.0,
       LOOM_MOE_DROP_LATE,
       0.0f,
       LOOM_MOE_OVERLAP_NONE,
       {61, 1},
       0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    run_case(ep, &cases[i], 0);
  }
  run_case(ep, &cases[0], 1);
  error_cases(ep);
  int rc = check_exit_all(kTest);
  if (g_rank == 0 && rc == 0) {
    printf("%s: PASS\n", kTest);
  }
  loom_finalize(ctx);
  return rc;
#endif
}
