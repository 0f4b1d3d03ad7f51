/* fill.h — internal interface of loom_tensor_fill: the CUDA kernel launcher that writes one
 * element bit pattern to every element of device memory (compute/cuda/fill.cu). */
#ifndef LOOM_FILL_H
#define LOOM_FILL_H

#include <stddef.h>
#include <stdint.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// Write the low elem_size bytes of pattern (1, 2, 4 or 8; host byte order) to each of the n
// elements at data on CUDA device `device`, and wait for it. Defined only with LOOM_HAVE_CUDA.
loom_status_t loom_cuda_fill_pattern(int device, void *data, size_t n, size_t elem_size,
                                     uint64_t pattern);

#ifdef __cplusplus
}
#endif
#endif
