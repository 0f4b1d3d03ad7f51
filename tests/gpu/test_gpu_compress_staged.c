/* test_gpu_compress_staged.c — the compressed allreduce of CUDA tensors through host stages (the
 * CPU lane) against the host path on the same values, under mpirun: the same bits everywhere. */
#include "config.h"
#include "loom.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_ctx.h"
#endif

#include "../check_mpi.h"
#include "gpu_test.h"

// What is checked, at the np of the run (MPI moves the payloads: no NCCL needed):
// - for fp16, int8, int8:sr, topk:0.01, randomk:0.01, efsign and powersgd:2, the three schemes,
//   sizes 1, 1000 and 100003 (LOOM_COMPRESS_CHUNK is 40000 bytes unless set: several chunks),
//   three steps with error feedback (one LOOM_AVG): the device tensor written by a kernel on a
//   non-blocking stream just before the call (no wait: the copy to the host must wait for it),
//   staged through a CUDA stage, has after the request the bits of the host path on a host copy,
//   and the host residuals (and PowerSGD's Q) and the bytes sent agree; blocking and non-blocking;
// - two staged requests in flight with a host compressed allreduce between them;
// - errors: a host tensor on a CUDA stage, a tensor larger than the stage.

static const char kTest[] = "test_gpu_compress_staged";

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

#ifdef LOOM_HAVE_CUDA

static int g_rank, g_gpu;

static void input(float *x, int64_t n, int step, int salt) {
  test_rng_t rng =
      test_rng(500u + 41u * (uint64_t)g_rank + 1009u * (uint64_t)step + 7u * (uint64_t)salt);
  test_fill_uniform(&rng, x, n, -2.0, 2.0);
}

// A device tensor's bits equal a host buffer's.
static int same_device(const loom_tensor_t *d, const float *h) {
  const int64_t n = loom_tensor_numel(d);
  float *back = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  loom_tensor_t b;
  int same = back &&
             loom_tensor_wrap(&b, back, LOOM_F32, LOOM_DEVICE_HOST, d->ndim, d->shape, "back") ==
                 LOOM_OK &&
             loom_tensor_copy(&b, d) == LOOM_OK &&
             (n == 0 || memcmp(back, h, (size_t)n * sizeof(float)) == 0);
  free(back);
  return same;
}

// Every residual and codec-state entry of a and b bitwise equal (same names, same order).
static int same_state(const loom_ef_t *a, const loom_ef_t *b) {
  for (int table = 0; table < 2; table++) {
    const int n = table ? loom_ef_state_count(a) : loom_ef_count(a);
    if (n != (table ? loom_ef_state_count(b) : loom_ef_count(b))) {
      return 0;
    }
    for (int i = 0; i < n; i++) {
      const char *ka = NULL, *kb = NULL;
      const float *da = NULL, *db = NULL;
      int64_t la = 0, lb = 0;
      loom_status_t sa =
          table ? loom_ef_state_entry(a, i, &ka, &da, &la) : loom_ef_entry(a, i, &ka, &da, &la);
      loom_status_t sb =
          table ? loom_ef_state_entry(b, i, &kb, &db, &lb) : loom_ef_entry(b, i, &kb, &db, &lb);
      if (sa != LOOM_OK || sb != LOOM_OK || strcmp(ka, kb) || la != lb ||
          (la > 0 && memcmp(da, db, (size_t)la * sizeof(float)))) {
        return 0;
      }
    }
  }
  return 1;
}

// One codec, scheme and size over three steps: td = x + 0 by a kernel on stream s, then the
// staged allreduce of td (the caller's current stream: s), against the host path on a copy of x.
static void compare_case(const loom_group_t *g, const char *spec, loom_scheme_t scheme, int64_t n,
                         int blocking) {
  char what[128];
  snprintf(what, sizeof what, "%s %s n=%lld %s", spec, loom_scheme_name(scheme), (long long)n,
           blocking ? "blocking" : "non-blocking");
  loom_compressor_t *c = NULL;
  loom_ef_t *ef_d = NULL, *ef_h = NULL;
  loom_host_stage_t *stage = NULL;
  loom_tensor_t td, tx, tz, th;
  cudaStream_t s = NULL;
  OK(loom_compressor_create(spec, &c));
  OK(loom_ef_create(&ef_d));
  OK(loom_ef_create(&ef_h));
  OK(loom_host_stage_create(g_gpu, n, &stage));
  OK(loom_tensor_alloc(&td, LOOM_F32, g_gpu, 1, &n, "grad.x"));
  OK(loom_tensor_alloc(&tx, LOOM_F32, g_gpu, 1, &n, "x"));
  OK(loom_tensor_alloc(&tz, LOOM_F32, g_gpu, 1, &n, "zero"));
  OK(loom_tensor_alloc(&th, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "grad.x"));
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  for (int step = 0; step < 3 && c && stage && s; step++) {
    const loom_redop_t op = step == 1 ? LOOM_AVG : LOOM_SUM;
    size_t sent_h = 0, sent_d = 0;
    input(th.data, n, step, (int)n + (int)scheme);
    OK(loom_tensor_copy(&tx, &th));
    // (a pageable copy may still be in DMA when cudaMemcpy returns: s must not outrun it)
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
    OK(loom_compressed_allreduce(g, c, scheme, ef_h, &th, op, 11u + (uint64_t)step, &sent_h));
    loom_cuda_set_stream(s);
    OK(loom_tensor_fill(&td, 1e30));          // (queued on s)
    OK(loom_residual_forward(&td, &tx, &tz)); // td = x + 0, queued on s: the copy waits for it
    if (blocking) {
      OK(loom_compressed_allreduce_staged(g, c, scheme, ef_d, &td, stage, op, 11u + (uint64_t)step,
                                          &sent_d));
    } else {
      loom_request_t *r = NULL;
      OK(loom_icompressed_allreduce_staged(g, c, scheme, ef_d, &td, stage, op, 11u + (uint64_t)step,
                                           &sent_d, &r));
      OK(loom_wait(&r));
    }
    loom_cuda_set_stream(0);
    CHECK(same_device(&td, th.data), "%s: device result != host result (step %d)", what, step);
    CHECK(sent_d == sent_h, "%s: %zu bytes sent staged, %zu on the host", what, sent_d, sent_h);
    CHECK(same_state(ef_d, ef_h), "%s: residuals differ (step %d)", what, step);
  }
  loom_cuda_set_stream(0);
  if (s) {
    cudaStreamDestroy(s);
  }
  loom_tensor_free(&td);
  loom_tensor_free(&tx);
  loom_tensor_free(&tz);
  loom_tensor_free(&th);
  loom_host_stage_destroy(stage);
  loom_ef_destroy(ef_d);
  loom_ef_destroy(ef_h);
  loom_compressor_destroy(c);
}

// Two staged requests in flight with a host compressed allreduce between them, completed in
// reverse order: each equals its blocking host reference.
static void in_flight_case(const loom_group_t *g) {
  enum { N = 5000 };
  loom_compressor_t *c = NULL;
  loom_ef_t *ef = NULL, *ref = NULL;
  loom_host_stage_t *s1 = NULL, *s2 = NULL;
  OK(loom_compressor_create("int8", &c));
  OK(loom_ef_create(&ef));
  OK(loom_ef_create(&ref));
  OK(loom_host_stage_create(g_gpu, N, &s1));
  OK(loom_host_stage_create(g_gpu, N, &s2));
  int64_t n = N;
  loom_tensor_t d1, d2, h1, h2, mid, mid_ref;
  OK(loom_tensor_alloc(&d1, LOOM_F32, g_gpu, 1, &n, "a"));
  OK(loom_tensor_alloc(&d2, LOOM_F32, g_gpu, 1, &n, "b"));
  OK(loom_tensor_alloc(&h1, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "a"));
  OK(loom_tensor_alloc(&h2, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "b"));
  OK(loom_tensor_alloc(&mid, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "m"));
  OK(loom_tensor_alloc(&mid_ref, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "m"));
  input(h1.data, N, 7, 1);
  input(h2.data, N, 7, 2);
  input(mid.data, N, 7, 3);
  memcpy(mid_ref.data, mid.data, sizeof(float) * N);
  OK(loom_tensor_copy(&d1, &h1));
  OK(loom_tensor_copy(&d2, &h2));
  CHECK(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");
  loom_request_t *r[3] = {NULL, NULL, NULL};
  if (c && s1 && s2) {
    OK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, ef, &d1, s1, LOOM_AVG, 3,
                                         NULL, &r[0]));
    OK(loom_icompressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &mid, LOOM_SUM, 3, NULL,
                                  &r[1]));
    OK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_INDIVISIBLE, ef, &d2, s2, LOOM_SUM, 3,
                                         NULL, &r[2]));
    for (int i = 2; i >= 0; i--) {
      OK(loom_wait(&r[i]));
    }
    OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_DIVISIBLE, ref, &h1, LOOM_AVG, 3, NULL));
    OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ref, &mid_ref, LOOM_SUM, 3, NULL));
    OK(loom_compressed_allreduce(g, c, LOOM_SCHEME_INDIVISIBLE, ref, &h2, LOOM_SUM, 3, NULL));
    CHECK(same_device(&d1, h1.data), "in flight: the first staged tensor differs");
    CHECK(same_device(&d2, h2.data), "in flight: the second staged tensor differs");
    CHECK(!memcmp(mid.data, mid_ref.data, sizeof(float) * N), "in flight: the host one differs");
  }
  loom_tensor_free(&d1);
  loom_tensor_free(&d2);
  loom_tensor_free(&h1);
  loom_tensor_free(&h2);
  loom_tensor_free(&mid);
  loom_tensor_free(&mid_ref);
  loom_host_stage_destroy(s1);
  loom_host_stage_destroy(s2);
  loom_ef_destroy(ef);
  loom_ef_destroy(ref);
  loom_compressor_destroy(c);
}

static void error_cases(const loom_group_t *g) {
  loom_compressor_t *c = NULL;
  loom_host_stage_t *stage = NULL;
  loom_request_t *r = NULL;
  int64_t n = 64, big = 65;
  loom_tensor_t h, d;
  OK(loom_compressor_create("fp16", &c));
  OK(loom_host_stage_create(g_gpu, n, &stage));
  OK(loom_tensor_alloc(&h, LOOM_F32, LOOM_DEVICE_HOST, 1, &n, "h"));
  OK(loom_tensor_alloc(&d, LOOM_F32, g_gpu, 1, &big, "d"));
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &h, stage, LOOM_SUM, 0,
                                          NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a host tensor on a CUDA stage is refused");
  CHECK(loom_icompressed_allreduce_staged(g, c, LOOM_SCHEME_DIVISIBLE, NULL, &d, stage, LOOM_SUM, 0,
                                          NULL, &r) == LOOM_ERR_INVALID_ARG,
        "a tensor larger than the stage is refused");
  loom_tensor_free(&h);
  loom_tensor_free(&d);
  loom_host_stage_destroy(stage);
  loom_compressor_destroy(c);
}

#endif // LOOM_HAVE_CUDA

int main(int argc, char **argv) {
  setenv("LOOM_COMPRESS_CHUNK", "40000", 0); // several chunks at 100003 values (unless set)
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "%s: loom_init failed: %s\n", kTest, loom_last_error(NULL));
    return 1;
  }
#ifndef LOOM_HAVE_CUDA
  if (loom_rank(ctx) == 0) {
    printf("%s: SKIP: loom was built without CUDA\n", kTest);
  }
  loom_finalize(ctx);
  return GPU_SKIP;
#else
  g_rank = loom_rank(ctx);
  if (gpu_mpi_skipped(ctx, kTest, &g_gpu)) {
    return GPU_SKIP;
  }
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  static const char *const specs[] = {"fp16",         "int8",   "int8:sr",   "topk:0.01",
                                      "randomk:0.01", "efsign", "powersgd:2"};
  const int64_t sizes[] = {1, 1000, 100003};
  for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
    for (int sc = 0; sc < LOOM_SCHEME_COUNT; sc++) {
      for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        compare_case(g, specs[k], (loom_scheme_t)sc, sizes[i], (int)(i + k) % 2);
      }
    }
  }
  in_flight_case(g);
  error_cases(g);
  if (g_rank == 0 && check_failures == 0) {
    printf("%s: %d rank(s), GPU %d on rank 0: staged allreduces equal the host path\n", kTest,
           loom_group_size(g), g_gpu);
  }
  int rc = check_exit_all(kTest);
  loom_finalize(ctx);
  return rc;
#endif
}
