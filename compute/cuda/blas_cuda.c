/* blas_cuda.c — one cuBLAS handle per device, created on first use under a mutex and kept for the
 * process; a per-device mutex serialises binding a handle to a stream and enqueueing on it. */
#include "config.h"

#include <pthread.h>
#include <stddef.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "blas_cuda.h"
#include "cuda_ctx.h"
#include "error.h"

// ---------------------------------------------------------------------------------------------
// The handle table: slot d belongs to device d. A slot is filled once (handle, use mutex,
// workspace size) under create_lock and never emptied; every read of a slot's handle also takes
// create_lock (uncontended: tens of nanoseconds), so no thread sees a half-made slot.

#define BLAS_MAX_DEVICES 64

typedef struct blas_slot {
  cublasHandle_t handle;  // NULL until the first use on the device
  pthread_mutex_t use;    // held from loom_cuda_blas_begin to loom_cuda_blas_end
  size_t workspace_bytes; // per call, see loom_cuda_blas_workspace_bytes
} blas_slot_t;

static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
static blas_slot_t slots[BLAS_MAX_DEVICES];

loom_status_t loom_cuda_blas_error(cublasStatus_t st, const char *what) {
  if (st == CUBLAS_STATUS_SUCCESS) {
    return LOOM_OK;
  }
  return loom_error(NULL, st == CUBLAS_STATUS_ALLOC_FAILED ? LOOM_ERR_NOMEM : LOOM_ERR_CUDA,
                    "%s failed: %s (%s)", what, cublasGetStatusName(st), cublasGetStatusString(st));
}

static loom_status_t current_device(int *device) {
  loom_status_t status = LOOM_OK;
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(device));
  if (*device < 0 || *device >= BLAS_MAX_DEVICES) {
    return loom_error(NULL, LOOM_ERR_INTERNAL,
                      "cuBLAS: device %d is beyond the %d devices loom keeps handles for", *device,
                      BLAS_MAX_DEVICES);
  }
  return LOOM_OK;
fail:
  return status;
}

// Fill slot device (create_lock held).
static loom_status_t create_slot(int device) {
  loom_status_t status = LOOM_OK;
  cublasHandle_t h = NULL;
  int major = 0;
  LOOM_CHECK_CUDA(NULL, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if ((status = loom_cuda_blas_error(cublasCreate(&h), "cublasCreate")) != LOOM_OK) {
    goto fail;
  }
  // No TF32 for f32 GEMMs (results compare with the CPU's at f32 accuracy), and reductions of
  // split-K partial sums in f32 rather than in the output type (bf16).
  status = loom_cuda_blas_error(
      cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
      "cublasSetMathMode");
  if (status != LOOM_OK) {
    goto fail;
  }
  if (pthread_mutex_init(&slots[device].use, NULL) != 0) {
    status = loom_error(NULL, LOOM_ERR_SYSTEM,
                        "cuBLAS: cannot create the handle mutex of device %d", device);
    goto fail;
  }
  slots[device].workspace_bytes = major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
  slots[device].handle = h;
  return LOOM_OK;
fail:
  if (h) {
    cublasDestroy(h);
  }
  return status;
}

// The slot of the current device, created on first use.
static loom_status_t get_slot(blas_slot_t **out) {
  int device = -1;
  loom_status_t status = current_device(&device);
  if (status != LOOM_OK) {
    return status;
  }
  pthread_mutex_lock(&create_lock);
  if (!slots[device].handle) {
    status = create_slot(device);
  }
  pthread_mutex_unlock(&create_lock);
  *out = &slots[device];
  return status;
}

// ---------------------------------------------------------------------------------------------
// Public (internal) entry points.

loom_status_t loom_cuda_blas(cublasHandle_t *out) {
  blas_slot_t *slot = NULL;
  loom_status_t status = get_slot(&slot);
  *out = status == LOOM_OK ? slot->handle : NULL;
  return status;
}

loom_status_t loom_cuda_blas_begin(cublasHandle_t *out, void *workspace, size_t bytes) {
  blas_slot_t *slot = NULL;
  loom_status_t status = get_slot(&slot);
  *out = NULL;
  if (status != LOOM_OK) {
    return status;
  }
  pthread_mutex_lock(&slot->use);
  // cublasSetStream resets the workspace to cuBLAS's default pool: set the workspace after it.
  status =
      loom_cuda_blas_error(cublasSetStream(slot->handle, loom_cuda_stream()), "cublasSetStream");
  if (status == LOOM_OK && workspace) {
    status = loom_cuda_blas_error(cublasSetWorkspace(slot->handle, workspace, bytes),
                                  "cublasSetWorkspace");
  }
  if (status != LOOM_OK) {
    pthread_mutex_unlock(&slot->use);
    return status;
  }
  *out = slot->handle;
  return LOOM_OK;
}

void loom_cuda_blas_end(cublasHandle_t handle) {
  blas_slot_t *slot = NULL;
  pthread_mutex_lock(&create_lock);
  for (int d = 0; d < BLAS_MAX_DEVICES && !slot; d++) {
    if (handle && slots[d].handle == handle) {
      slot = &slots[d];
    }
  }
  pthread_mutex_unlock(&create_lock);
  if (slot) {
    pthread_mutex_unlock(&slot->use);
  }
}

size_t loom_cuda_blas_workspace_bytes(void) {
  blas_slot_t *slot = NULL;
  if (get_slot(&slot) != LOOM_OK) {
    return 0;
  }
  pthread_mutex_lock(&create_lock);
  size_t bytes = slot->workspace_bytes;
  pthread_mutex_unlock(&create_lock);
  return bytes;
}
