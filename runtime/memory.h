/* memory.h — internal memory helpers behind tensors: device index checks, CUDA device
 * allocation, and copies between any two of host memory and CUDA devices. */
#ifndef LOOM_MEMORY_H
#define LOOM_MEMORY_H

#include <stddef.h>

#include "loom_tensor.h"

// LOOM_OK when device is LOOM_DEVICE_HOST or a CUDA device this process sees. Otherwise
// LOOM_ERR_UNSUPPORTED (built without CUDA) or LOOM_ERR_INVALID_ARG (index out of range), with a
// message naming the device count.
loom_status_t loom_device_check(int device);

// Allocate bytes of zeroed memory on CUDA device `device` (0..). bytes == 0 checks the device and
// sets *p to NULL. Without the CUDA backend: LOOM_ERR_UNSUPPORTED with the reconfigure hint.
loom_status_t loom_device_alloc(int device, size_t bytes, void **p);
// Release memory from loom_device_alloc (NULL is ignored); failures are logged, not returned.
void loom_device_free(int device, void *p);

// Copy bytes between host memory (LOOM_DEVICE_HOST) and CUDA devices, in any direction. Returns
// after the copy is complete.
loom_status_t loom_memcpy_any(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes);

#endif
