/* memory.c — aligned host memory, CUDA device discovery and allocation, and copies between host
 * and devices; without the CUDA backend every device request fails with a reconfigure hint. */
#include "config.h"
#include "memory.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#ifdef LOOM_HAVE_CUDA
#include "cuda/cuda_ctx.h"
#endif

#define LOOM_HOST_ALIGN 64 // bytes: a cache line, and enough for any vector load

// ---------------------------------------------------------------------------------------------
// Host memory.

void *loom_host_alloc(size_t bytes) {
  void *p = NULL;
  if (bytes == 0) {
    return NULL;
  }
  if (bytes > (size_t)PTRDIFF_MAX) { // no object can be that large: fail without asking
    LOOM_INFO(LOOM_SUB_MEM, "host alloc of %zu bytes refused (more than PTRDIFF_MAX)", bytes);
    return NULL;
  }
  int rc = posix_memalign(&p, LOOM_HOST_ALIGN, bytes);
  if (rc != 0) {
    LOOM_INFO(LOOM_SUB_MEM, "posix_memalign(%d, %zu) failed: %s", LOOM_HOST_ALIGN, bytes,
              strerror(rc));
    return NULL;
  }
  LOOM_TRACE(LOOM_SUB_MEM, "host alloc %zu bytes at %p", bytes, p);
  return p;
}

void loom_host_free(void *p) {
  if (p != NULL) {
    LOOM_TRACE(LOOM_SUB_MEM, "host free %p", p);
  }
  free(p);
}

// ---------------------------------------------------------------------------------------------
// CUDA devices.

#ifdef LOOM_HAVE_CUDA

// The count cannot change during a process's life (CUDA_VISIBLE_DEVICES is read at CUDA's
// initialisation), so it is queried once. Concurrent first calls may both query: harmless.
static atomic_int cuda_device_count = -1;

int loom_cuda_device_count(void) {
  int count = atomic_load(&cuda_device_count);
  if (count >= 0) {
    return count;
  }
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    LOOM_INFO(LOOM_SUB_MEM, "no CUDA device usable: cudaGetDeviceCount failed: %s (%s)",
              cudaGetErrorString(rc), cudaGetErrorName(rc));
    (void)cudaGetLastError(); // do not leave the error for the next check to find
    count = 0;
  } else {
    LOOM_INFO(LOOM_SUB_MEM, "%d CUDA device(s) visible", count);
  }
  atomic_store(&cuda_device_count, count);
  return count;
}

loom_status_t loom_device_check(int device) {
  if (device == LOOM_DEVICE_HOST) {
    return LOOM_OK;
  }
  int count = loom_cuda_device_count();
  if (count == 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "CUDA device %d requested but this process sees no CUDA device (no driver, "
                      "no GPU, or CUDA_VISIBLE_DEVICES hides them; set LOOM_DEBUG=INFO for the "
                      "reason): use LOOM_DEVICE_HOST (-1)",
                      device);
  }
  if (device < 0 || device >= count) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "CUDA device %d requested but this process sees %d CUDA device(s): use "
                      "LOOM_DEVICE_HOST (-1) or 0..%d (check CUDA_VISIBLE_DEVICES; set "
                      "LOOM_DEBUG=INFO for details)",
                      device, count, count - 1);
  }
  return LOOM_OK;
}

loom_status_t loom_device_alloc(int device, size_t bytes, void **p) {
  loom_status_t status = LOOM_OK;
  int prev = -1;
  void *mem = NULL;
  *p = NULL;
  LOOM_CHECK(loom_device_check(device));
  if (device < 0) {
    status = loom_error(NULL, LOOM_ERR_INTERNAL, "loom_device_alloc called for host memory");
    goto fail;
  }
  if (bytes == 0) {
    return LOOM_OK;
  }
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&prev));
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  LOOM_CHECK_CUDA(NULL, cudaMalloc(&mem, bytes));
  LOOM_CHECK_CUDA(NULL, cudaMemset(mem, 0, bytes));
  LOOM_CHECK_CUDA(NULL, cudaDeviceSynchronize()); // zeroed before any stream uses it
  LOOM_TRACE(LOOM_SUB_MEM, "device %d alloc %zu bytes at %p", device, bytes, mem);
  if (prev != device) {
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(prev));
  }
  *p = mem;
  return LOOM_OK;

fail:
  if (mem != NULL) {
    cudaFree(mem);
  }
  if (prev >= 0 && prev != device) {
    cudaSetDevice(prev);
  }
  return status;
}

void loom_device_free(int device, void *p) {
  int prev = -1;
  cudaError_t rc;
  if (p == NULL) {
    return;
  }
  LOOM_TRACE(LOOM_SUB_MEM, "device %d free %p", device, p);
  if (cudaGetDevice(&prev) == cudaSuccess && prev != device) {
    cudaSetDevice(device);
  }
  rc = cudaFree(p);
  if (rc != cudaSuccess) {
    LOOM_WARN(LOOM_SUB_MEM, "cudaFree(%p) on device %d failed: %s (%s)", p, device,
              cudaGetErrorString(rc), cudaGetErrorName(rc));
  }
  if (prev >= 0 && prev != device) {
    cudaSetDevice(prev);
  }
}

#else // !LOOM_HAVE_CUDA

int loom_cuda_device_count(void) {
  return 0;
}

loom_status_t loom_device_check(int device) {
  if (device == LOOM_DEVICE_HOST) {
    return LOOM_OK;
  }
  if (device < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "device %d is invalid: use LOOM_DEVICE_HOST (-1); this build has no CUDA "
                      "devices",
                      device);
  }
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "tensor on CUDA device %d requested but loom was built without CUDA: "
                    "reconfigure with --with-cuda",
                    device);
}

loom_status_t loom_device_alloc(int device, size_t bytes, void **p) {
  loom_status_t status = LOOM_OK;
  (void)bytes;
  *p = NULL;
  LOOM_CHECK(loom_device_check(device)); // fails for every CUDA index in this build
  return loom_error(NULL, LOOM_ERR_INTERNAL, "loom_device_alloc called for host memory");

fail:
  return status;
}

void loom_device_free(int device, void *p) {
  (void)device;
  (void)p; // nothing can have been allocated
}

#endif // LOOM_HAVE_CUDA

// ---------------------------------------------------------------------------------------------
// Copies.

loom_status_t loom_memcpy_any(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes) {
  loom_status_t status = LOOM_OK;
  LOOM_CHECK(loom_device_check(dst_dev));
  LOOM_CHECK(loom_device_check(src_dev));
  if (bytes == 0 || dst == src) {
    return LOOM_OK;
  }
  if (dst == NULL || src == NULL) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "copy of %zu bytes with a NULL %s pointer", bytes,
                      dst == NULL ? "destination" : "source");
  }
  if (dst_dev == LOOM_DEVICE_HOST && src_dev == LOOM_DEVICE_HOST) {
    memmove(dst, src, bytes); // views of one buffer may overlap: defined, as fast as memcpy
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  {
    // Unified addressing lets cudaMemcpyDefault infer the direction; run it on a device the
    // copy involves so that its context is the one used. The copy goes on the calling thread's
    // current stream (loom's ops' stream: a scheduler lane's inside a task), so it reads src
    // after the kernels queued there before it; the legacy stream would not wait for them (the
    // scheduler's lanes are cudaStreamNonBlocking), and a device-to-device copy of an activation
    // in train_gpt's forward read it before it was written (seen on an H200). On another device
    // than the current one, that device's legacy stream. A copy that involves the host is
    // waited for, so the host may read dst or reuse src on return.
    int dev = dst_dev != LOOM_DEVICE_HOST ? dst_dev : src_dev;
    int prev = -1;
    LOOM_CHECK_CUDA(NULL, cudaGetDevice(&prev));
    if (prev != dev) {
      LOOM_CHECK_CUDA(NULL, cudaSetDevice(dev));
    }
    cudaStream_t stream = prev == dev ? loom_cuda_stream() : cudaStreamLegacy;
    cudaError_t rc = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
    if (rc == cudaSuccess && (src_dev == LOOM_DEVICE_HOST || dst_dev == LOOM_DEVICE_HOST)) {
      rc = cudaStreamSynchronize(stream);
    }
    if (prev != dev) {
      cudaSetDevice(prev);
    }
    if (rc != cudaSuccess) {
      return loom_error(NULL, rc == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_CUDA,
                        "cudaMemcpyAsync of %zu bytes from device %d to device %d failed: %s (%s)",
                        bytes, src_dev, dst_dev, cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
    return LOOM_OK;
  }
#else
  // Unreachable: without CUDA, loom_device_check rejected every device index.
  return loom_error(NULL, LOOM_ERR_INTERNAL, "copy between devices %d and %d in a host-only build",
                    src_dev, dst_dev);
#endif

fail:
  return status;
}
