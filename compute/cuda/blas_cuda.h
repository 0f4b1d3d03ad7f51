/* blas_cuda.h — the cuBLAS handle of each device (created on first use, kept for the process) and
 * the rules for using it from several threads and streams; cuBLAS status codes as loom errors. */
#ifndef LOOM_BLAS_CUDA_H
#define LOOM_BLAS_CUDA_H

#include <stddef.h>

#include <cublas_v2.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// The current device's cuBLAS handle, created on first use (under a mutex, so two threads that
// race create one handle) with CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_
// REDUCTION: no TF32, and split-K reductions in the compute type (f32), never in bf16. The
// handle lives until the process ends. Using it needs loom_cuda_blas_begin/end (below).
loom_status_t loom_cuda_blas(cublasHandle_t *out);

// Begin a cuBLAS call sequence on the current device: take the device's handle mutex, bind the
// handle to loom_cuda_stream() (cublasSetStream) and give it workspace (bytes of device memory
// that stay valid on that stream until the work enqueued before loom_cuda_blas_end has run;
// NULL and 0 for none). On success *out is the handle and the mutex is held until
// loom_cuda_blas_end(*out); on failure nothing is held.
//
// Threads: a handle is shared by every thread that uses its device; two threads that call cuBLAS
// at once serialise on the mutex while each sets its stream and enqueues its calls (a few
// microseconds: the GEMMs themselves run concurrently on their streams). Each call brings its
// own workspace (stream-ordered scratch), so concurrent streams never share one.
loom_status_t loom_cuda_blas_begin(cublasHandle_t *out, void *workspace, size_t bytes);
void loom_cuda_blas_end(cublasHandle_t handle);

// Workspace bytes to give a call on the current device: 32 MiB on Hopper and later, 4 MiB before
// (cuBLAS's own recommendation); the pointer passed to begin must be 256-byte aligned.
size_t loom_cuda_blas_workspace_bytes(void);

// LOOM_ERR_CUDA (LOOM_ERR_NOMEM for CUBLAS_STATUS_ALLOC_FAILED) with a message naming what
// failed and the status (cublasGetStatusName and cublasGetStatusString); LOOM_OK for success.
loom_status_t loom_cuda_blas_error(cublasStatus_t st, const char *what);

#ifdef __cplusplus
}
#endif
#endif
