/* error.h — internal error recording and the check macros that convert MPI, CUDA, NCCL and
 * errno failures into loom_status_t at the boundary. Functions using them end in a fail: label. */
#ifndef LOOM_ERROR_H
#define LOOM_ERROR_H

#include <errno.h>
#include <string.h>

#include "loom_core.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef LOOM_HAVE_NCCL
#include <nccl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Record status and a formatted message on ctx (may be NULL) and on this thread; log it at WARN
// with file:line. Returns status so callers can `return loom_error(...)`.
loom_status_t loom_error_at(loom_ctx_t *ctx, loom_status_t status, const char *file, int line,
                            const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define loom_error(ctx, status, ...) loom_error_at((ctx), (status), __FILE__, __LINE__, __VA_ARGS__)

// Record status and a formatted message on this thread, as loom_error does, without logging it:
// for the parsers of names a program takes from its user, whose caller reports a bad one.
loom_status_t loom_error_unlogged(loom_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Clear the thread's last error (loom_init does this on entry).
void loom_error_clear(void);
// While on (1), errors are recorded on this thread and ctx but not logged: loom_init's checks,
// whose failure every rank agrees on and the lowest failing rank alone logs.
void loom_error_quiet(int on);
// Record msg as this thread's last error without logging it (a message relayed from a peer).
void loom_error_set_quiet(const char *msg);
// Copy the thread's last error into ctx (after init, errors belong to the context).
void loom_error_to_ctx(loom_ctx_t *ctx);

#ifdef __cplusplus
}
#endif

// The check macros expect `loom_status_t status` and a `fail:` label in the enclosing function.
#define LOOM_CHECK(call)                                                                           \
  do {                                                                                             \
    status = (call);                                                                               \
    if (status != LOOM_OK) {                                                                       \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#define LOOM_CHECK_MPI(ctx, call)                                                                  \
  do {                                                                                             \
    int loom_mpi_rc_ = (call);                                                                     \
    if (loom_mpi_rc_ != MPI_SUCCESS) {                                                             \
      char loom_mpi_msg_[MPI_MAX_ERROR_STRING];                                                    \
      int loom_mpi_len_ = 0;                                                                       \
      MPI_Error_string(loom_mpi_rc_, loom_mpi_msg_, &loom_mpi_len_);                               \
      status = loom_error((ctx), LOOM_ERR_MPI, "%s failed: %s", #call, loom_mpi_msg_);             \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

// cond is what must hold; on failure errno is reported with what was attempted.
#define LOOM_CHECK_SYS(ctx, cond, what)                                                            \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      int loom_errno_ = errno;                                                                     \
      status = loom_error((ctx), loom_errno_ == ENOMEM ? LOOM_ERR_NOMEM : LOOM_ERR_SYSTEM,         \
                          "%s failed: %s (errno %d)", (what), strerror(loom_errno_), loom_errno_); \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

#ifdef LOOM_HAVE_CUDA
#define LOOM_CHECK_CUDA(ctx, call)                                                                 \
  do {                                                                                             \
    cudaError_t loom_cuda_rc_ = (call);                                                            \
    if (loom_cuda_rc_ != cudaSuccess) {                                                            \
      status = loom_error(                                                                         \
          (ctx), loom_cuda_rc_ == cudaErrorMemoryAllocation ? LOOM_ERR_NOMEM : LOOM_ERR_CUDA,      \
          "%s failed: %s (%s)", #call, cudaGetErrorString(loom_cuda_rc_),                          \
          cudaGetErrorName(loom_cuda_rc_));                                                        \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)
#endif

#ifdef LOOM_HAVE_NCCL
#define LOOM_CHECK_NCCL(ctx, call)                                                                 \
  do {                                                                                             \
    ncclResult_t loom_nccl_rc_ = (call);                                                           \
    if (loom_nccl_rc_ != ncclSuccess && loom_nccl_rc_ != ncclInProgress) {                         \
      status = loom_error((ctx), LOOM_ERR_NCCL,                                                    \
                          "%s failed: %s; set NCCL_DEBUG=INFO for "                                \
                          "details",                                                               \
                          #call, ncclGetErrorString(loom_nccl_rc_));                               \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)
#endif

#endif
