/* cuda_ctx.c — the CUDA backend's per-thread current stream, device selection, the stream-ordered
 * scratch pool (CUDA's memory pool kept warm: no cudaMalloc on the step path), launch checks. */
#include "config.h"

#include "cuda_ctx.h"

#include <pthread.h>
#include <stdint.h>

#include "error.h"
#include "log.h"

// The pool. Scratch comes from cudaMallocAsync on the device's default memory pool, whose release
// threshold is raised to "never" the first time a device is used: a freed block stays in the pool
// and the next request of a size the pool holds is served without the driver, in stream order
// (CUDA inserts the event waits when a block freed on one stream is reused on another). This is
// the same policy as a hand-written caching allocator (PyTorch's), with the cross-stream reuse
// rules enforced by the driver rather than by loom.
#define LOOM_CUDA_MAX_DEVICES 64

static _Thread_local cudaStream_t current_stream; // 0: the legacy default stream
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static int pool_ready[LOOM_CUDA_MAX_DEVICES];
static int device_sms[LOOM_CUDA_MAX_DEVICES];

cudaStream_t loom_cuda_stream(void) {
  return current_stream;
}

void loom_cuda_set_stream(cudaStream_t stream) {
  current_stream = stream;
}

// One-time setup of device: keep its default pool's memory (release threshold UINT64_MAX) and
// note its SM count. Called with pool_lock held.
static loom_status_t prepare_device_locked(int device) {
  loom_status_t status = LOOM_OK;
  cudaMemPool_t pool;
  uint64_t keep = UINT64_MAX;
  int sms = 0;
  LOOM_CHECK_CUDA(NULL, cudaDeviceGetDefaultMemPool(&pool, device));
  LOOM_CHECK_CUDA(NULL, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  LOOM_CHECK_CUDA(NULL, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  device_sms[device] = sms > 0 ? sms : 1;
  pool_ready[device] = 1;
  LOOM_INFO(LOOM_SUB_CUDA, "device %d: %d SMs; scratch pool keeps freed memory", device, sms);
fail:
  return status;
}

loom_status_t loom_cuda_use_device(int device) {
  loom_status_t status = LOOM_OK;
  int current = -1;
  if (device < 0 || device >= LOOM_CUDA_MAX_DEVICES || device >= loom_cuda_device_count()) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "CUDA device %d is not visible to this process (%d device(s)): use "
                      "LOOM_DEVICE_HOST (-1) or 0..%d; check CUDA_VISIBLE_DEVICES",
                      device, loom_cuda_device_count(), loom_cuda_device_count() - 1);
  }
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&current));
  if (current != device) {
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  }
  pthread_mutex_lock(&pool_lock);
  if (!pool_ready[device]) {
    status = prepare_device_locked(device);
  }
  pthread_mutex_unlock(&pool_lock);
fail:
  return status;
}

// The current device, prepared; -1 (and an error recorded) when none can be had.
static int current_device(loom_status_t *status) {
  int device = -1;
  cudaError_t rc = cudaGetDevice(&device);
  if (rc != cudaSuccess) {
    *status = loom_error(NULL, LOOM_ERR_CUDA, "cudaGetDevice failed: %s (%s)",
                         cudaGetErrorString(rc), cudaGetErrorName(rc));
    return -1;
  }
  *status = loom_cuda_use_device(device);
  return *status == LOOM_OK ? device : -1;
}

loom_status_t loom_cuda_scratch(size_t bytes, void **out) {
  loom_status_t status = LOOM_OK;
  *out = NULL;
  if (bytes == 0) {
    return LOOM_OK;
  }
  int device = current_device(&status);
  if (device < 0) {
    return status;
  }
  void *p = NULL;
  cudaError_t rc = cudaMallocAsync(&p, bytes, current_stream);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    uint64_t used = 0, reserved = 0;
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    }
    return loom_error(NULL, rc == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_CUDA,
                      "scratch of %zu bytes on CUDA device %d: cudaMallocAsync failed: %s (%s); "
                      "the pool holds %llu bytes, %llu in use: use smaller batches or free "
                      "device tensors",
                      bytes, device, cudaGetErrorString(rc), cudaGetErrorName(rc),
                      (unsigned long long)reserved, (unsigned long long)used);
  }
  *out = p;
  return LOOM_OK;
}

void loom_cuda_scratch_free(void *p) {
  if (!p) {
    return;
  }
  cudaError_t rc = cudaFreeAsync(p, current_stream);
  if (rc != cudaSuccess) {
    LOOM_WARN(LOOM_SUB_CUDA, "cudaFreeAsync(%p) failed: %s (%s)", p, cudaGetErrorString(rc),
              cudaGetErrorName(rc));
    (void)cudaGetLastError();
  }
}

loom_status_t loom_cuda_launch_check(const char *kernel) {
  cudaError_t rc = cudaGetLastError();
  if (rc == cudaSuccess) {
    return LOOM_OK;
  }
  return loom_error(NULL, rc == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_CUDA,
                    "CUDA kernel %s failed to launch: %s (%s); set CUDA_LAUNCH_BLOCKING=1 and "
                    "LOOM_DEBUG=INFO to locate it",
                    kernel, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

loom_status_t loom_cuda_to_host(void *host, const void *device_ptr, size_t bytes) {
  loom_status_t status = LOOM_OK;
  if (bytes == 0) {
    return LOOM_OK;
  }
  LOOM_CHECK_CUDA(NULL,
                  cudaMemcpyAsync(host, device_ptr, bytes, cudaMemcpyDeviceToHost, current_stream));
  LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(current_stream));
fail:
  return status;
}

loom_status_t loom_cuda_copy(void *dst, const void *src, size_t bytes) {
  loom_status_t status = LOOM_OK;
  if (bytes > 0) {
    LOOM_CHECK_CUDA(NULL,
                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current_stream));
  }
fail:
  return status;
}

loom_status_t loom_cuda_zero(void *dst, size_t bytes) {
  loom_status_t status = LOOM_OK;
  if (bytes > 0) {
    LOOM_CHECK_CUDA(NULL, cudaMemsetAsync(dst, 0, bytes, current_stream));
  }
fail:
  return status;
}

unsigned loom_cuda_blocks(int64_t n, unsigned threads) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= LOOM_CUDA_MAX_DEVICES) {
    device = 0;
  }
  int64_t cap = (int64_t)(device_sms[device] > 0 ? device_sms[device] : 80) * 8;
  int64_t blocks = threads ? (n + threads - 1) / threads : 1;
  if (blocks > cap) {
    blocks = cap;
  }
  return blocks < 1 ? 1u : (unsigned)blocks;
}
