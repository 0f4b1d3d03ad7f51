/* compress_powersgd_nccl.c — PowerSGD on CUDA tensors: compress_powersgd.c's step with M, P and Q
 * on the device (cuBLAS), the allreduces over NCCL, the orthonormalisations on a host copy. */
#include "config.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdlib.h>

#include "comm_internal.h"
#include "compress_internal.h"
#include "cuda/codecs_cuda.h"
#include "cuda/cuda_ctx.h"
#include "cuda/cuda_kernels.h"
#include "error.h"
#include "log.h"

// The host form's step (compress_powersgd.c), operation for operation:
//
//   Q  = the side table's Q, orthonormalised on the host      (loom_powersgd_warm_q, shared)
//   M  = x + residual, zero-padded to rows x cols              device, current stream
//   P  = M Q; P = sum over ranks (loom_allreduce, NCCL)        cuBLAS; the host waits for the sum
//   P  = orthonormalise(P) on a host copy, uploaded again      (loom_powersgd_orthonormalise)
//   Ql = M^T P; Q = sum over ranks of Ql (loom_allreduce)      cuBLAS; the host waits for the sum
//   the side table's Q = Q (downloaded)                        the next warm start, checkpoints
//   residual = finite(M - P Ql^T); x = P Q^T (/ np: LOOM_AVG)  cuBLAS and kernels, not waited for
//
// Bits: every rank computes the same P and Q (the sums come from NCCL, which gives every rank
// the same bits, and the orthonormalisation is the host's code on the same input), so every rank
// ends with the same x. The device result is not the host result's bits: cuBLAS and the CPU BLAS
// sum the products of a GEMM in different orders (tests/gpu/test_gpu_compress_coll.c states the
// tolerance).
//
// Where the host waits: the two loom_allreduce calls are blocking (each polls its completion
// under the watchdog, LOOM_TIMEOUT), so the call returns once Q's sum has arrived; the residual
// and result GEMMs that follow are queued on the current stream (loom_cuda_stream) and complete in
// its order, as the flat schemes' decodes do. Orthonormalising on the host costs, per call, two
// downloads (P: rows x r floats; Q: cols x r) and two uploads of the same sizes, and O((rows +
// cols) r^2) double flops on the host: for a 4096 x 4096 gradient at rank 4, 128 KiB each way
// and about 0.3 MFLOP, against four GEMMs that each read the 64 MiB M.
// The Q in the side table (host memory) is authoritative, as on the host: loom_ef_state_entry
// and loom_ef_state_set (checkpoints: "efq:NAME") work unchanged, and a restored Q is the next
// call's warm start. The residual is a device residual (compress_coll_nccl.c's table: mirrored
// to the host table by loom_ef_count/loom_ef_entry, dropped by loom_ef_set).
//
// Memory: one workspace per ef (M, P, Ql, Q on the device; P's host copy), allocated with
// cudaMalloc when a call needs more than the last and kept until loom_ef_destroy, so a step
// allocates nothing once the largest tensor has been seen. It is kept rather than taken from the
// stream-ordered pool because NCCL writes P and Q on the group's stream: a buffer that is never
// handed back cannot be reused while an allreduce that failed part-way still runs. Each call's
// stream waits for the event recorded after the previous call's last use of the workspace, so
// calls from several streams (scheduler lanes) take turns; calls on one ef come from one thread
// at a time, as for its host tables.

typedef struct psgd_ws {
  int device;         // CUDA device of dev and idle
  float *dev;         // (dev_floats) on device: M, P, Ql, Q, laid out by the call below
  size_t dev_floats;  // capacity of dev
  float *host;        // (host_floats) P's host copy for its orthonormalisation
  size_t host_floats; // capacity of host
  cudaEvent_t idle;   // recorded on the current stream after a call's last use of dev
} psgd_ws_t;

// Floats of a part rounded up to 64 (256 bytes: every part aligned as cuBLAS prefers).
static size_t part_floats(int64_t n) {
  return ((size_t)n + 63) & ~(size_t)63;
}

static void ws_destroy(void *p) {
  psgd_ws_t *ws = p;
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(ws->device);
  if (ws->idle) {
    cudaEventSynchronize(ws->idle); // the last call's kernels are done with dev
    cudaEventDestroy(ws->idle);
  }
  if (ws->dev) {
    cudaFree(ws->dev);
  }
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
  (void)cudaGetLastError(); // at exit the context may be gone: nothing to report
  free(ws->host);
  free(ws);
}

// ef's workspace on device (the current device) with room for the parts of d, grown when needed.
static loom_status_t workspace(loom_ef_t *ef, int device, const loom_powersgd_dims_t *d,
                               psgd_ws_t **out) {
  loom_status_t status = LOOM_OK;
  void **slot = NULL;
  LOOM_CHECK(loom_cuda_ef_workspace(ef, ws_destroy, &slot));
  psgd_ws_t *ws = *slot;
  if (ws && ws->device != device) { // one device per rank is the rule; still, follow the tensor
    ws_destroy(ws);
    *slot = ws = NULL;
  }
  if (!ws) {
    if (!(ws = calloc(1, sizeof *ws))) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "powersgd: cannot allocate the device workspace");
    }
    ws->device = device;
    const cudaError_t rc = cudaEventCreateWithFlags(&ws->idle, cudaEventDisableTiming);
    if (rc != cudaSuccess) {
      free(ws);
      return loom_error(NULL, LOOM_ERR_CUDA, "powersgd: cudaEventCreateWithFlags failed: %s (%s)",
                        cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
    *slot = ws; // owned by the table from here on (freed by loom_ef_destroy)
  }
  const size_t need_dev = part_floats(d->rows * d->cols) + part_floats(d->rows * d->r) +
                          2 * part_floats(d->cols * d->r);
  const size_t need_host = (size_t)(d->rows * d->r);
  if (ws->dev_floats < need_dev) {
    LOOM_CHECK_CUDA(NULL, cudaEventSynchronize(ws->idle)); // the old block's last use is done
    if (ws->dev) {
      LOOM_CHECK_CUDA(NULL, cudaFree(ws->dev));
    }
    ws->dev = NULL;
    ws->dev_floats = 0;
    LOOM_CHECK_CUDA(NULL, cudaMalloc((void **)&ws->dev, need_dev * sizeof(float)));
    ws->dev_floats = need_dev;
    LOOM_INFO(LOOM_SUB_COMPRESS, "powersgd: device workspace of %zu floats on device %d", need_dev,
              device);
  }
  if (ws->host_floats < need_host) {
    float *h = malloc(need_host * sizeof(float));
    if (!h) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "powersgd: cannot allocate %zu host floats for P",
                        need_host);
    }
    free(ws->host);
    ws->host = h;
    ws->host_floats = need_host;
  }
  *out = ws;
fail:
  return status;
}

// x[0..n) on device summed over g in place (an NCCL allreduce; returns when it is done).
static loom_status_t sum_dev(const loom_group_t *g, float *x, int64_t n, int device,
                             const char *what) {
  loom_tensor_t v;
  loom_status_t status = loom_tensor_wrap(&v, x, LOOM_F32, device, 1, &n, what);
  return status != LOOM_OK ? status : loom_allreduce(g, &v, &v, LOOM_SUM);
}

loom_status_t loom_powersgd_allreduce_cuda(const loom_group_t *g, const loom_compressor_t *c,
                                           loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
                                           size_t *sent) {
  loom_status_t status = LOOM_OK;
  loom_powersgd_dims_t d;
  psgd_ws_t *ws = NULL;
  loom_dev_res_t *dr = NULL;
  float *res = NULL, *qh = NULL;
  const cudaStream_t stream = loom_cuda_stream();
  if ((status = loom_powersgd_setup(c, ef, t, &d)) != LOOM_OK || d.n == 0 || d.r == 0) {
    return status;
  }
  const int64_t n = d.n, rows = d.rows, cols = d.cols;
  const int r = d.r;
  if (rows > INT_MAX || cols > INT_MAX) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s on CUDA tensor '%s': its matrix view is %lld x %lld, and cuBLAS takes "
                      "at most %d rows and columns: give the tensor a first dimension (the rows) "
                      "that splits it more evenly",
                      c->name, t->name, (long long)rows, (long long)cols, INT_MAX);
  }
  LOOM_CHECK(loom_cuda_use_device(t->device));
  LOOM_CHECK(loom_cuda_ef_residual(ef, t->name, n, t->device, &dr, &res));
  LOOM_CHECK(workspace(ef, t->device, &d, &ws));
  float *const x = t->data;                      // (n) the tensor, then the result
  float *const m = ws->dev;                      // (rows, cols) x + residual, padded
  float *const p = m + part_floats(rows * cols); // (rows, r)
  float *const ql = p + part_floats(rows * r);   // (cols, r) this rank's M^T P
  float *const q = ql + part_floats(cols * r);   // (cols, r) Q, then the summed Q
  // This call's work on the workspace comes after the previous call's, whatever its stream.
  LOOM_CHECK_CUDA(NULL, cudaStreamWaitEvent(stream, ws->idle, 0));
  // The warm start, orthonormalised on the host (the side table), uploaded. The copy is from
  // pageable memory: it returns once the bytes are staged, so the table may change after it.
  LOOM_CHECK(loom_powersgd_warm_q(ef, t->name, &d, &qh));
  LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(q, qh, (size_t)(cols * r) * sizeof(float),
                                        cudaMemcpyHostToDevice, stream));
  // M = x + residual, zero-padded to rows x cols.
  LOOM_CHECK(loom_cuda_residual_forward(n, m, x, res));
  LOOM_CHECK(loom_cuda_zero(m + n, (size_t)(rows * cols - n) * sizeof(float)));
  // P = M Q, summed over ranks, orthonormalised on the host.
  LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 0, 0, rows, r, cols, 1.0f, m, cols, q, r, NULL, 0.0f, p, r));
  LOOM_CHECK(sum_dev(g, p, rows * r, t->device, "powersgd P"));
  LOOM_CHECK(loom_cuda_to_host(ws->host, p, (size_t)(rows * r) * sizeof(float)));
  loom_powersgd_orthonormalise(ws->host, rows, r);
  LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(p, ws->host, (size_t)(rows * r) * sizeof(float),
                                        cudaMemcpyHostToDevice, stream));
  // Q = M^T P: this rank's (for the residual) and the sum (the result and the next warm start,
  // kept in the side table).
  LOOM_CHECK(loom_cuda_gemm(LOOM_F32, 1, 0, cols, r, rows, 1.0f, m, cols, p, r, NULL, 0.0f, ql, r));
  LOOM_CHECK(loom_cuda_copy(q, ql, (size_t)(cols * r) * sizeof(float)));
  LOOM_CHECK(sum_dev(g, q, cols * r, t->device, "powersgd Q"));
  LOOM_CHECK(loom_cuda_to_host(qh, q, (size_t)(cols * r) * sizeof(float)));
  // residual = M - P Ql^T (what this rank's approximation missed); x = P Q^T (the sum).
  LOOM_CHECK(
      loom_cuda_gemm(LOOM_F32, 0, 1, rows, cols, r, -1.0f, p, r, ql, r, NULL, 1.0f, m, cols));
  LOOM_CHECK(loom_cuda_keep_finite(res, m, n));
  LOOM_CHECK(loom_cuda_ef_written(dr));
  if (rows * cols == n) { // no padding: straight into x
    LOOM_CHECK(
        loom_cuda_gemm(LOOM_F32, 0, 1, rows, cols, r, 1.0f, p, r, q, r, NULL, 0.0f, x, cols));
  } else {
    LOOM_CHECK(
        loom_cuda_gemm(LOOM_F32, 0, 1, rows, cols, r, 1.0f, p, r, q, r, NULL, 0.0f, m, cols));
    LOOM_CHECK(loom_cuda_copy(x, m, (size_t)n * sizeof(float)));
  }
  if (op == LOOM_AVG) { // the host's x[i] / np
    LOOM_CHECK(loom_cuda_div(x, x, n, (float)loom_group_size(g)));
  }
  *sent += loom_powersgd_sent(&d, loom_group_size(g));
fail:
  if (ws) { // the next call's work on the workspace waits for what this one queued
    const cudaError_t rc = cudaEventRecord(ws->idle, stream);
    if (rc != cudaSuccess && status == LOOM_OK) {
      status = loom_error(NULL, LOOM_ERR_CUDA,
                          "powersgd: cudaEventRecord after the work on '%s' failed: %s (%s)",
                          t->name, cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
  }
  return status;
}
