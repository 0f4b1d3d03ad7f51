/* gpu_test.h — what the GPU tests share: SKIP (exit 77) without a visible device, host <-> device
 * tensor copies, and a comparison of a device result with the CPU backend's result. */
#ifndef LOOM_TESTS_GPU_TEST_H
#define LOOM_TESTS_GPU_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "loom.h"
#include "../testutil.h"

#define GPU_SKIP 77

// Exit 77 (SKIP), saying why, unless this process sees a CUDA device and loom has the backend.
static inline void gpu_require_device(const char *test) {
  int n = loom_cuda_device_count();
  if (n <= 0) {
    printf("%s: SKIP: no CUDA device visible (loom built %s CUDA); run tests/gpu/run_all.sh on a "
           "machine with a GPU\n",
           test,
#ifdef LOOM_HAVE_CUDA
           "with"
#else
           "without"
#endif
    );
    exit(GPU_SKIP);
  }
}

// Under mpirun: why this run cannot test anything (the same on every rank), or NULL. *gpu gets
// this rank's GPU (loom_gpu). NCCL needs one GPU per rank, so two ranks of a node on one GPU
// cannot run.
static inline const char *gpu_mpi_skip_reason(loom_ctx_t *ctx, int *gpu) {
  MPI_Comm node;
  int local = 0, nlocal = 1, code = 0, any = 0;
  const int devices = loom_cuda_device_count();
  *gpu = loom_gpu(ctx);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_size(node, &nlocal);
  int *gpus = calloc((size_t)nlocal, sizeof(int));
  MPI_Allgather(gpu, 1, MPI_INT, gpus, 1, MPI_INT, node);
  code = devices <= 0 ? 1 : *gpu < 0 ? 2 : 0;
  for (int i = 0; i < nlocal && code == 0; i++) {
    if (i != local && gpus[i] == *gpu) {
      code = 3;
    }
  }
  free(gpus);
  MPI_Comm_free(&node);
  MPI_Allreduce(&code, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  switch (any) {
  case 1:
    return "no CUDA device visible; run tests/gpu/run_all.sh on a machine with a GPU";
  case 2:
    return "this rank has no GPU (LOOM_GPU=none?)";
  case 3:
    return "two ranks of a node share a GPU, and NCCL needs one GPU per rank: run at np <= the "
           "GPU count (run_all.sh does)";
  default:
    return NULL;
  }
}

// Under mpirun: 1 (after printing the reason on rank 0 and loom_finalize) when this run cannot
// test anything; the caller then returns GPU_SKIP. *gpu gets this rank's GPU.
static inline int gpu_mpi_skipped(loom_ctx_t *ctx, const char *test, int *gpu) {
  const char *skip = gpu_mpi_skip_reason(ctx, gpu);
  if (!skip) {
    return 0;
  }
  if (loom_rank(ctx) == 0) {
    printf("%s: SKIP: %s\n", test, skip);
  }
  loom_finalize(ctx);
  return 1;
}

// A device copy (device 0) of host tensor h, same dtype, shape and name. Aborts the test on
// failure: nothing useful can follow.
static inline loom_tensor_t gpu_upload(const loom_tensor_t *h) {
  loom_tensor_t d;
  loom_status_t st = loom_tensor_alloc(&d, h->dtype, 0, h->ndim, h->shape, h->name);
  if (st == LOOM_OK) {
    st = loom_tensor_copy(&d, h);
  }
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: upload of %s: %s: %s\n", h->name, loom_strerror(st),
            loom_last_error(NULL));
    exit(1);
  }
  return d;
}

// A host copy of device tensor d.
static inline loom_tensor_t gpu_download(const loom_tensor_t *d) {
  loom_tensor_t h;
  loom_status_t st = loom_tensor_alloc(&h, d->dtype, LOOM_DEVICE_HOST, d->ndim, d->shape, d->name);
  if (st == LOOM_OK) {
    st = loom_tensor_copy(&h, d);
  }
  if (st != LOOM_OK) {
    fprintf(stderr, "FAIL: download of %s: %s: %s\n", d->name, loom_strerror(st),
            loom_last_error(NULL));
    exit(1);
  }
  return h;
}

// Compare device f32 tensor d with host f32 tensor want element by element:
// |got - want| <= atol + rtol * |want| (NaN must match NaN). Counts one CHECK failure and prints
// the worst element when any differs; returns the largest relative error seen.
static inline double gpu_compare(const char *what, const loom_tensor_t *d,
                                 const loom_tensor_t *want, double rtol, double atol) {
  loom_tensor_t h = gpu_download(d);
  const float *g = (const float *)h.data, *w = (const float *)want->data;
  int64_t n = loom_tensor_numel(&h), worst = -1, bad = 0;
  double worst_err = 0.0, max_rel = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double gi = g[i], wi = w[i];
    if (isnan(wi) || isnan(gi)) {
      if (!(isnan(wi) && isnan(gi))) {
        bad++, worst = i, worst_err = INFINITY;
      }
      continue;
    }
    double err = fabs(gi - wi);
    double rel = err / (fabs(wi) > 1e-30 ? fabs(wi) : 1e-30);
    if (err > atol + rtol * fabs(wi)) {
      bad++;
      if (err > worst_err || worst < 0) {
        worst = i, worst_err = err;
      }
    }
    if (err > atol && rel > max_rel) {
      max_rel = rel;
    }
  }
  CHECK(bad == 0,
        "%s: %lld of %lld elements differ beyond rtol %g atol %g; worst [%lld] got %.9g "
        "want %.9g",
        what, (long long)bad, (long long)n, rtol, atol, (long long)worst,
        worst >= 0 ? (double)g[worst] : 0.0, worst >= 0 ? (double)w[worst] : 0.0);
  loom_tensor_free(&h);
  return max_rel;
}

// 1 when device tensor d holds the same bytes as host tensor want.
static inline int gpu_same_bytes(const loom_tensor_t *d, const loom_tensor_t *want) {
  loom_tensor_t h = gpu_download(d);
  int same = loom_tensor_bytes(&h) == loom_tensor_bytes(want) &&
             memcmp(h.data, want->data, loom_tensor_bytes(&h)) == 0;
  loom_tensor_free(&h);
  return same;
}

#endif
