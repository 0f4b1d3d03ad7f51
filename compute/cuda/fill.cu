/* fill.cu — CUDA side of loom_tensor_fill: a grid-stride kernel, one instantiation per element
 * width, that writes a bit pattern to every element of device memory. */
#include "config.h"

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

// loom_core.h includes mpi.h; its C++ bindings would need libmpi_cxx, so leave them out.
#define OMPI_SKIP_MPICXX  1
#define MPICH_SKIP_MPICXX 1
#include "cuda_ctx.h"
#include "error.h"
#include "fill.h"
#include "loom_core.h"

namespace {

const int kThreads = 256;   // threads per block
const int kBlocksPerSm = 8; // enough resident blocks to saturate memory bandwidth

template <typename T> __global__ void fill_kernel(T *data, size_t n, T value) {
  size_t stride = (size_t)blockDim.x * gridDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    data[i] = value; // data: (n,)
  }
}

template <typename T>
void launch_fill(void *data, size_t n, uint64_t pattern, int blocks, cudaStream_t stream) {
  fill_kernel<T>
      <<<blocks, kThreads, 0, stream>>>(static_cast<T *>(data), n, static_cast<T>(pattern));
}

} // namespace

extern "C" loom_status_t loom_cuda_fill_pattern(int device, void *data, size_t n, size_t elem_size,
                                                uint64_t pattern) {
  loom_status_t status = LOOM_OK;
  int prev = -1;
  int sms = 0;
  size_t blocks = 0;
  cudaError_t rc = cudaSuccess;
  cudaStream_t stream = 0;

  if (n == 0) {
    return LOOM_OK;
  }
  if (elem_size != 1 && elem_size != 2 && elem_size != 4 && elem_size != 8) {
    return loom_error(NULL, LOOM_ERR_INTERNAL,
                      "loom_cuda_fill_pattern: element size %zu is not 1, 2, 4 or 8", elem_size);
  }
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&prev));
  if (prev != device) {
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(device));
  }
  LOOM_CHECK_CUDA(NULL, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));

  blocks = (n + kThreads - 1) / kThreads;
  if (blocks > (size_t)sms * kBlocksPerSm) {
    blocks = (size_t)sms * kBlocksPerSm; // the grid-stride loop covers the rest
  }
  if (blocks == 0) {
    blocks = 1;
  }
  // The current stream's order when device is the current device (see loom_tensor_fill); on
  // another device, its legacy stream, waited for.
  stream = prev == device ? loom_cuda_stream() : cudaStreamLegacy;
  switch (elem_size) {
  case 1:
    launch_fill<uint8_t>(data, n, pattern, (int)blocks, stream);
    break;
  case 2:
    launch_fill<uint16_t>(data, n, pattern, (int)blocks, stream);
    break;
  case 4:
    launch_fill<uint32_t>(data, n, pattern, (int)blocks, stream);
    break;
  default:
    launch_fill<unsigned long long>(data, n, pattern, (int)blocks, stream);
    break;
  }
  rc = cudaGetLastError();
  if (rc != cudaSuccess) {
    status = loom_error(NULL, LOOM_ERR_CUDA,
                        "launching the fill kernel (%zu elements of %zu bytes, %zu blocks) on "
                        "device %d failed: %s (%s)",
                        n, elem_size, blocks, device, cudaGetErrorString(rc), cudaGetErrorName(rc));
    goto fail;
  }
  rc = prev == device ? cudaSuccess : cudaStreamSynchronize(stream);
  if (rc != cudaSuccess) {
    status = loom_error(NULL, LOOM_ERR_CUDA,
                        "the fill kernel (%zu elements of %zu bytes at %p) on device %d failed: "
                        "%s (%s)",
                        n, elem_size, data, device, cudaGetErrorString(rc), cudaGetErrorName(rc));
    goto fail;
  }
  if (prev != device) {
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(prev));
  }
  return LOOM_OK;

fail:
  if (prev >= 0 && prev != device) {
    cudaSetDevice(prev);
  }
  return status;
}
