/* compress_staged.c — compressed allreduce of a CUDA tensor by the CPU (ByteComp's CPU lane): a
 * copy to pinned host memory in stream order, the host scheme there, the sum copied back. */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "comm_internal.h"
#include "compress_internal.h"
#include "ctx.h"
#include "error.h"
#include "log.h"
#include "memory.h"

#ifdef LOOM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_ctx.h"
#endif

// How it runs. At the call (on the caller's thread, in the order of its collectives): the host
// path's checks and entry (watchdog, consistency check), an event on the caller's current stream
// that the stage's stream waits for, the copy of t into the stage's host memory on that stream,
// an event after it ("landed"), and for the flat schemes the tags and buffers of the host request
// (compress_coll.c), whose first step (encode, post the first exchange) is gated on "landed": it
// runs at the first advance after the copy, from whichever thread advances the request. When the
// host scheme has finished, the request's poll hook queues the copy back on the stage's stream,
// records "returned", and reports completion once that event has passed. The stage's stream
// orders its copies, so a call that follows a completed one on the same stage never overwrites
// the host memory before the copy back has read it.

struct loom_host_stage {
  int device;  // LOOM_DEVICE_HOST or the CUDA device of the tensors it stages
  int64_t cap; // f32 values the host memory holds
  float *host; // (cap) page-locked on a CUDA stage; loom_host_alloc memory on a host one
  // The operation in flight (one at a time).
  void *data;      // the tensor's memory, on device
  size_t bytes;    // its size
  int back;        // the copy back was queued
  int fail_copies; // test hook (loom_host_stage_fail_copies): copies still to fail
#ifdef LOOM_HAVE_CUDA
  cudaStream_t stream;  // the copies (non-blocking: ordered by the events below only)
  cudaEvent_t produced; // on the caller's current stream at the call: t is written
  cudaEvent_t landed;   // on stream after the copy to the host
  cudaEvent_t returned; // on stream after the copy back
#endif
};

// ---- CUDA helpers (the calling thread's device is restored) -------------------------------------

#ifdef LOOM_HAVE_CUDA
// Make s's device current; *prev receives the one to restore (-1: none).
static loom_status_t use_device(const loom_host_stage_t *s, int *prev) {
  loom_status_t status = LOOM_OK;
  *prev = -1;
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(prev));
  if (*prev != s->device) {
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(s->device));
  }
fail:
  return status;
}

static void restore_device(const loom_host_stage_t *s, int prev) {
  if (prev >= 0 && prev != s->device) {
    cudaSetDevice(prev);
  }
}

// Bind the calling thread to s's device, for good (the scheduler's progress thread, advancing a
// staged request, would otherwise get a context on device 0 from its first CUDA call).
static loom_status_t bind_device(const loom_host_stage_t *s) {
  loom_status_t status = LOOM_OK;
  int current = -1;
  LOOM_CHECK_CUDA(NULL, cudaGetDevice(&current));
  if (current != s->device) {
    LOOM_CHECK_CUDA(NULL, cudaSetDevice(s->device));
  }
fail:
  return status;
}

// *passed = 1 when ev has passed; block: wait for it (a copy needs no peer: it always ends).
// Events may be queried from any device.
static loom_status_t event_passed(cudaEvent_t ev, int block, int *passed) {
  loom_status_t status = LOOM_OK;
  *passed = 0;
  cudaError_t rc = block ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
  if (rc != cudaErrorNotReady) {
    LOOM_CHECK_CUDA(NULL, rc);
    *passed = 1;
  }
fail:
  return status;
}
#endif

// ---- the stage ----------------------------------------------------------------------------------

loom_status_t loom_host_stage_create(int device, int64_t n, loom_host_stage_t **out) {
  static const char name[] = "loom_host_stage_create";
  loom_status_t status = LOOM_OK;
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: out is NULL: pass where to store the stage",
                      name);
  }
  *out = NULL;
  if (n < 0 || n > (int64_t)(SIZE_MAX / 8)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: n = %lld values: pass the element count of the largest tensor (>= 0)",
                      name, (long long)n);
  }
#ifndef LOOM_HAVE_CUDA
  if (device != LOOM_DEVICE_HOST) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: CUDA device %d: loom was built without CUDA; stage host tensors with "
                      "LOOM_DEVICE_HOST (-1), or reconfigure with --with-cuda",
                      name, device);
  }
#endif
  if ((status = loom_device_check(device)) != LOOM_OK) { // names the devices this process sees
    return status;
  }
  loom_host_stage_t *s = calloc(1, sizeof *s);
  if (!s) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate the stage", name);
  }
  s->device = device;
  s->cap = n;
  const size_t bytes = (size_t)n * sizeof(float);
  if (device == LOOM_DEVICE_HOST) {
    s->host = loom_host_alloc(bytes); // NULL for n == 0
    if (n > 0 && !s->host) {
      free(s);
      return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %zu bytes", name, bytes);
    }
    *out = s;
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  int prev = -1;
  LOOM_CHECK(use_device(s, &prev));
  if (bytes > 0) {
    LOOM_CHECK_CUDA(NULL, cudaHostAlloc((void **)&s->host, bytes, cudaHostAllocPortable));
  }
  LOOM_CHECK_CUDA(NULL, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&s->produced, cudaEventDisableTiming));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&s->landed, cudaEventDisableTiming));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&s->returned, cudaEventDisableTiming));
  restore_device(s, prev);
  LOOM_INFO(LOOM_SUB_COMPRESS, "host stage of %lld values (%zu pinned bytes) for CUDA device %d",
            (long long)n, bytes, device);
  *out = s;
  return LOOM_OK;
fail:
  restore_device(s, prev);
  loom_host_stage_destroy(s);
  return status;
#else
  free(s); // (unreachable: a CUDA device was refused above)
  return loom_error(NULL, LOOM_ERR_INTERNAL, "%s: CUDA device %d without CUDA", name, device);
#endif
}

void loom_host_stage_destroy(loom_host_stage_t *s) {
  if (!s) {
    return;
  }
  if (s->device == LOOM_DEVICE_HOST) {
    loom_host_free(s->host);
    free(s);
    return;
  }
#ifdef LOOM_HAVE_CUDA
  int prev = -1;
  if (use_device(s, &prev) != LOOM_OK) {
    LOOM_WARN(LOOM_SUB_COMPRESS, "host stage: cannot select CUDA device %d to free it: %s",
              s->device, loom_last_error(NULL));
  }
  if (s->stream && cudaStreamSynchronize(s->stream) != cudaSuccess) { // copies still in flight
    LOOM_WARN(LOOM_SUB_COMPRESS, "host stage: its copies failed: %s",
              cudaGetErrorString(cudaGetLastError()));
  }
  cudaEvent_t ev[3] = {s->produced, s->landed, s->returned};
  for (int i = 0; i < 3; i++) {
    if (ev[i]) {
      cudaEventDestroy(ev[i]);
    }
  }
  if (s->stream) {
    cudaStreamDestroy(s->stream);
  }
  if (s->host) {
    cudaFreeHost(s->host);
  }
  restore_device(s, prev);
#endif
  free(s);
}

void loom_host_stage_fail_copies(loom_host_stage_t *s, int n) {
  if (s) {
    s->fail_copies = n > 0 ? n : 0;
  }
}

// ---- the copies ---------------------------------------------------------------------------------

// Queue the copy of t into the host memory after the current stream's work (the same thread's
// memcpy on a host stage).
static loom_status_t copy_in(loom_host_stage_t *s, const loom_tensor_t *t) {
  s->data = t->data;
  s->bytes = loom_tensor_bytes(t);
  s->back = 0;
  if (s->fail_copies > 0) {
    s->fail_copies--;
    return loom_error(NULL, LOOM_ERR_CUDA,
                      "the copy of '%s' to the host failed (injected by "
                      "loom_host_stage_fail_copies)",
                      t->name);
  }
  if (s->device == LOOM_DEVICE_HOST) {
    if (s->bytes > 0 && s->host != t->data) {
      memcpy(s->host, t->data, s->bytes);
    }
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  loom_status_t status = LOOM_OK;
  int prev = -1;
  LOOM_CHECK(use_device(s, &prev));
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(s->produced, loom_cuda_stream()));
  LOOM_CHECK_CUDA(NULL, cudaStreamWaitEvent(s->stream, s->produced, 0));
  if (s->bytes > 0) {
    LOOM_CHECK_CUDA(NULL,
                    cudaMemcpyAsync(s->host, t->data, s->bytes, cudaMemcpyDeviceToHost, s->stream));
  }
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(s->landed, s->stream));
fail:
  restore_device(s, prev);
  return status;
#else
  return loom_error(NULL, LOOM_ERR_INTERNAL, "host stage for CUDA device %d without CUDA",
                    s->device);
#endif
}

// *ok = 1 once the copy to the host has landed; block: wait for it. any_thread: the caller may
// be a thread without a device of its own (it is bound to the stage's).
static loom_status_t landed(loom_host_stage_t *s, int block, int any_thread, int *ok) {
  *ok = 1;
#ifdef LOOM_HAVE_CUDA
  if (s->device != LOOM_DEVICE_HOST) {
    loom_status_t status = any_thread ? bind_device(s) : LOOM_OK;
    return status == LOOM_OK ? event_passed(s->landed, block, ok) : status;
  }
#else
  (void)s;
#endif
  (void)block;
  (void)any_thread;
  return LOOM_OK;
}

// The request's gate before the host scheme's first step (any thread, list lock held). A copy
// that failed on the stream still takes part in the exchanges, with failed blocks: the request
// completes with the error, and no peer waits for this rank.
static loom_status_t ready_hook(loom_request_t *r, int *ok) {
  loom_status_t status = landed(r->aux, 0, 1, ok);
  if (status != LOOM_OK) {
    loom_compress_flat_poison(r, status);
    *ok = 1;
  }
  return LOOM_OK;
}

// The request's completion: the host scheme is done; queue the copy back (once), then report
// whether it has landed. A blocking wait polls 20 us apart, like the NCCL requests.
static loom_status_t poll_hook(loom_request_t *r, int block, int *done) {
  loom_host_stage_t *s = r->aux;
  *done = 0;
  if (s->device == LOOM_DEVICE_HOST) {
    if (s->bytes > 0 && s->host != s->data) {
      memcpy(s->data, s->host, s->bytes);
    }
    s->back = 1;
    *done = 1;
    return LOOM_OK;
  }
#ifdef LOOM_HAVE_CUDA
  loom_status_t status = LOOM_OK;
  if (!s->back) {
    int prev = -1;
    status = use_device(s, &prev);
    if (status == LOOM_OK && s->bytes > 0) {
      cudaError_t rc =
          cudaMemcpyAsync(s->data, s->host, s->bytes, cudaMemcpyHostToDevice, s->stream);
      status = rc == cudaSuccess
                   ? LOOM_OK
                   : loom_error(NULL, LOOM_ERR_CUDA,
                                "%s: the copy back to CUDA device %d failed: %s (%s)", r->op,
                                s->device, cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
    if (status == LOOM_OK) {
      cudaError_t rc = cudaEventRecord(s->returned, s->stream);
      status = rc == cudaSuccess ? LOOM_OK
                                 : loom_error(NULL, LOOM_ERR_CUDA, "%s: cudaEventRecord: %s (%s)",
                                              r->op, cudaGetErrorString(rc), cudaGetErrorName(rc));
    }
    restore_device(s, prev);
    if (status != LOOM_OK) {
      return status;
    }
    s->back = 1;
  }
  int passed = 0;
  status = event_passed(s->returned, 0, &passed);
  if (status == LOOM_OK && !passed && block) {
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
  *done = passed;
  return status;
#else
  (void)block;
  return loom_error(NULL, LOOM_ERR_INTERNAL, "host stage for CUDA device %d without CUDA",
                    s->device);
#endif
}

// ---- the allreduce ------------------------------------------------------------------------------

// Before a scheme that runs to completion in the call (hierarchical, powersgd): every rank of g
// learns whether every copy to the host landed (an allreduce of one int, under the watchdog), so
// that a failed copy ends the call on every rank at once, before any exchange, with no tensor or
// residual changed. copied is this rank's copy status: returned as it is when it failed; a peer's
// failure is LOOM_ERR_CORRUPT naming the highest failing rank. The cost: one small allreduce a
// call.
static loom_status_t agree_copied(const char *name, const loom_group_t *g, struct loom_watch *w,
                                  const loom_tensor_t *t, loom_status_t copied) {
  int failed = copied == LOOM_OK ? 0 : g->rank + 1;
  MPI_Request rq = MPI_REQUEST_NULL;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, g->comm, &rq);
  if (rc == MPI_SUCCESS) {
    rc = loom_watch_waitall(w, 1, &rq);
  }
  if (copied != LOOM_OK) {
    return copied; // copy_in or landed set the message
  }
  if (rc != MPI_SUCCESS) {
    return loom_error(NULL, LOOM_ERR_MPI,
                      "%s: the check that every rank's copy of '%s' reached the host failed "
                      "(MPI error %d)",
                      name, t->name, rc);
  }
  if (failed > 0) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "%s: a peer could not encode its part of '%s': the copy to the host of "
                      "world rank %d failed (its own error message says why); no rank's tensor "
                      "or residual changed",
                      name, t->name, g->world_ranks[failed - 1]);
  }
  return LOOM_OK;
}

// The tensor and the stage: present, f32, on the stage's device, no larger than the stage.
static loom_status_t check_staged(const char *name, const loom_tensor_t *t,
                                  const loom_host_stage_t *s) {
  loom_status_t status = LOOM_OK;
  char shape[LOOM_SHAPE_STR_MAX];
  if (!t || !s) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: %s is NULL: pass the tensor and a stage from loom_host_stage_create",
                      name, !t ? "t" : "stage");
  }
  if (t->dtype != LOOM_F32) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: tensor '%s' is %s: compressed collectives take f32 tensors (allreduce "
                      "others with loom_allreduce)",
                      name, t->name, loom_dtype_name(t->dtype));
  }
  if (t->device != s->device) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: tensor '%s' is on device %d but the stage is for device %d: make the "
                      "stage for the tensor's device",
                      name, t->name, t->device, s->device);
  }
  LOOM_CHECK(loom_arg_tensor(name, "t", t, LOOM_F32, t->device));
  if (loom_tensor_numel(t) > s->cap) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: tensor '%s' %s has %lld values but the stage holds %lld: create the "
                      "stage for the largest tensor it serves",
                      name, t->name, loom_shape_str(t, shape), (long long)loom_tensor_numel(t),
                      (long long)s->cap);
  }
fail:
  return status;
}

// The call: checks, entry, the copy in, and the host scheme (begun, or for hierarchical and
// powersgd run to completion after agree_copied); *req completes with the copy back. *sent grows by
// the bytes this rank sends.
static loom_status_t start(const char *name, const loom_group_t *g, const loom_compressor_t *c,
                           loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                           loom_host_stage_t *s, loom_redop_t op, uint64_t seed, size_t *sent,
                           loom_request_t **req) {
  loom_status_t status = LOOM_OK;
  loom_request_t *r = NULL;
  *req = NULL;
  status = check_staged(name, t, s);
  if (status != LOOM_OK) { // (under LOOM_CHECK_CONSISTENCY the members learn it at once)
    return loom_consistency_refuse(g, LOOM_OPK_COMPRESSED_ALLREDUCE, t, status);
  }
  // The host copy: the stage's memory under t's name and shape (error feedback, checks, messages).
  loom_tensor_t h;
  LOOM_CHECK(loom_tensor_wrap(&h, s->host, LOOM_F32, LOOM_DEVICE_HOST, t->ndim, t->shape, t->name));
  float *res = NULL;
  struct loom_watch w;
  LOOM_CHECK(loom_compress_host_enter(name, g, c, scheme, ef, &h, op, seed, &res, &w));
  r = loom_request_new(name);
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  r->watch = w;
  r->aux = s;
  r->poll = poll_hook;
  if (loom_compress_host_flat(c, scheme)) {
    // Tags and buffers before the copy: a copy that fails still takes part in the exchanges
    // (failed blocks), so that its peers fail too instead of waiting for this rank; the wait
    // reports the copy's error, and neither t nor the residual is touched.
    LOOM_CHECK(loom_compress_flat_deferred(r, g, c, scheme, res, &h, op, seed, sent));
    loom_status_t copied = copy_in(s, t);
    if (copied == LOOM_OK) {
      r->ready = ready_hook;
    } else {
      loom_compress_flat_poison(r, copied);
    }
    loom_request_started(r); // listed: any thread's progress begins it once the copy landed
  } else { // runs to completion here, on the landed copy, once every rank's copy landed
    loom_status_t copied = copy_in(s, t);
    int ok = 0;
    if (copied == LOOM_OK) {
      copied = landed(s, 1, 0, &ok);
    }
    LOOM_CHECK(agree_copied(name, g, &w, t, copied));
    LOOM_CHECK(loom_compress_host_run(g, c, scheme, ef, res, &h, op, seed, sent, &w));
  }
  *req = r;
  return LOOM_OK;
fail:
  // What is queued on the stage's stream finishes there: the stage outlives it (destroy waits).
  loom_request_free(r);
  return status;
}

loom_status_t loom_icompressed_allreduce_staged(const loom_group_t *g, const loom_compressor_t *c,
                                                loom_scheme_t scheme, loom_ef_t *ef,
                                                loom_tensor_t *t, loom_host_stage_t *stage,
                                                loom_redop_t op, uint64_t seed, size_t *bytes_sent,
                                                loom_request_t **req) {
  static const char name[] = "loom_icompressed_allreduce_staged";
  size_t sent = 0;
  loom_status_t status = LOOM_OK;
  if (!req) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: req is NULL: pass &request", name);
  } else {
    status = start(name, g, c, scheme, ef, t, stage, op, seed, &sent, req);
  }
  if (bytes_sent) {
    *bytes_sent = status == LOOM_OK ? sent : 0;
  }
  return status;
}

loom_status_t loom_compressed_allreduce_staged(const loom_group_t *g, const loom_compressor_t *c,
                                               loom_scheme_t scheme, loom_ef_t *ef,
                                               loom_tensor_t *t, loom_host_stage_t *stage,
                                               loom_redop_t op, uint64_t seed, size_t *bytes_sent) {
  static const char name[] = "loom_compressed_allreduce_staged";
  size_t sent = 0;
  loom_request_t *r = NULL;
  loom_status_t status = start(name, g, c, scheme, ef, t, stage, op, seed, &sent, &r);
  // A flat scheme waits for the copy to the host here, rather than spinning in loom_wait.
  if (status == LOOM_OK && loom_compress_host_flat(c, scheme)) {
    int ok = 0;
    status = landed(stage, 1, 0, &ok);
  }
  if (r) {
    loom_status_t waited = loom_wait(&r);
    status = status == LOOM_OK ? waited : status;
  }
  if (bytes_sent) {
    *bytes_sent = status == LOOM_OK ? sent : 0;
  }
  return status;
}
