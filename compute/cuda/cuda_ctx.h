/* cuda_ctx.h — what every CUDA kernel file shares: the calling thread's current stream (a
 * scheduler lane's stream), the stream-ordered scratch pool, launch checks and small copies. */
#ifndef LOOM_CUDA_CTX_H
#define LOOM_CUDA_CTX_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Every CUDA op runs on the current device (cudaGetDevice) and on the calling thread's current
// stream: the legacy default stream unless a scheduler lane set its own. The NCCL backend orders
// its collectives after the current stream, so a gradient produced by a kernel is complete before
// the collective reads it.
cudaStream_t loom_cuda_stream(void);
// Set the calling thread's current stream (0 restores the legacy default stream).
void loom_cuda_set_stream(cudaStream_t stream);

// Make device the current device of the calling thread (a no-op when it already is). Fails with
// a clear message for a device this process cannot see.
loom_status_t loom_cuda_use_device(int device);

// Scratch memory from the per-device pool, ordered on the current stream: a block freed with
// loom_cuda_scratch_free is reused only by work queued after the free on the same stream, or
// after an event shows the stream passed the free. No cudaMalloc on the step path once the pool
// holds blocks of the sizes a step asks for. bytes == 0 gives NULL and LOOM_OK.
loom_status_t loom_cuda_scratch(size_t bytes, void **out);
void loom_cuda_scratch_free(void *p);

// LOOM_OK, or LOOM_ERR_CUDA naming kernel when the last launch on this thread failed
// (cudaGetLastError after <<<...>>>).
loom_status_t loom_cuda_launch_check(const char *kernel);

// Copy bytes from device memory to host memory on the current stream and wait for it (results
// such as a loss sum that the API returns to the host).
loom_status_t loom_cuda_to_host(void *host, const void *device_ptr, size_t bytes);

// Device-to-device copy of bytes, and zeroing of bytes, on the current stream (no wait).
loom_status_t loom_cuda_copy(void *dst, const void *src, size_t bytes);
loom_status_t loom_cuda_zero(void *dst, size_t bytes);

// Blocks for a grid-stride kernel over n items with threads per block, capped at 8 blocks per
// SM of the current device (at least 1).
unsigned loom_cuda_blocks(int64_t n, unsigned threads);

#ifdef __cplusplus
}
#endif
#endif
