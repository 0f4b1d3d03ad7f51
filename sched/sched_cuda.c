/* sched_cuda.c — CUDA lanes of the step scheduler: the compute lane queues on its own stream,
 * each worker thread on another, dependencies become events, and GPU time goes to the timeline. */
#include "config.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_ctx.h"
#include "error.h"
#include "log.h"
#include "sched_internal.h"
#include "timeline.h"

// How it works. A compute or worker task of a CUDA scheduler runs on the host as before, but
// the kernels it queues go to its lane's stream (loom_cuda_stream() inside the task). Before the
// task runs, its stream waits for the "end" event of every GPU predecessor (a no-op when the
// predecessor used the same stream); after it returns, the lane records the task's end event.
// Comm tasks start on the run thread with the compute stream current, after that stream waited
// for their GPU predecessors: the NCCL backend orders its collective after the current stream,
// so a bucket's allreduce starts on the GPU when the gradients in it are written, while the
// host has long gone on queueing backward kernels. The host learns a comm task finished when its
// request completes (NCCL: an event on the group's stream), so work queued afterwards is ordered
// after it without an event. At the end of the step every lane stream is synchronised, and each
// task's GPU span (start/end events) is written to the timeline on the "gpu" tracks.

#define MAX_WORKER_STREAMS 64

struct loom_sched_gpu {
  int device;
  int ntasks;
  cudaStream_t compute;   // the compute lane's stream
  cudaStream_t saved;     // the run thread's current stream before the step
  cudaEvent_t step_begin; // recorded on the compute stream when the step starts
  int64_t step_begin_ns;  // host time of that record
  cudaEvent_t *start;     // (ntasks) per task, timing enabled
  cudaEvent_t *end;       // (ntasks)
  int *stream_index;      // (ntasks) -1: not run on a GPU lane this step; 0 compute; 1 + k worker k
  pthread_mutex_t lock;   // guards the worker streams
  cudaStream_t worker[MAX_WORKER_STREAMS];
  int nworker_streams;
};

// The worker stream of the calling worker thread for g, created at its first GPU task.
static _Thread_local struct loom_sched_gpu *thread_owner;
static _Thread_local int thread_worker = -1;

loom_status_t loom_sched_gpu_create(loom_ctx_t *ctx, int ntasks, struct loom_sched_gpu **out) {
  loom_status_t status = LOOM_OK;
  struct loom_sched_gpu *g = calloc(1, sizeof *g);
  *out = NULL;
  LOOM_CHECK_SYS(ctx, g != NULL, "calloc(scheduler CUDA lanes)");
  pthread_mutex_init(&g->lock, NULL);
  g->ntasks = ntasks;
  g->start = calloc((size_t)(ntasks > 0 ? ntasks : 1), sizeof *g->start);
  g->end = calloc((size_t)(ntasks > 0 ? ntasks : 1), sizeof *g->end);
  g->stream_index = calloc((size_t)(ntasks > 0 ? ntasks : 1), sizeof *g->stream_index);
  LOOM_CHECK_SYS(ctx, g->start && g->end && g->stream_index, "calloc(scheduler CUDA events)");
  LOOM_CHECK_CUDA(ctx, cudaGetDevice(&g->device));
  LOOM_CHECK(loom_cuda_use_device(g->device));
  LOOM_CHECK_CUDA(ctx, cudaStreamCreateWithFlags(&g->compute, cudaStreamNonBlocking));
  LOOM_CHECK_CUDA(ctx, cudaEventCreate(&g->step_begin));
  for (int i = 0; i < ntasks; i++) {
    LOOM_CHECK_CUDA(ctx, cudaEventCreate(&g->start[i]));
    LOOM_CHECK_CUDA(ctx, cudaEventCreate(&g->end[i]));
  }
  LOOM_INFO(LOOM_SUB_SCHED, "CUDA lanes on device %d: compute stream and %d task events", g->device,
            ntasks);
  *out = g;
  return LOOM_OK;
fail:
  loom_sched_gpu_destroy(g);
  return status;
}

void loom_sched_gpu_destroy(struct loom_sched_gpu *g) {
  if (!g) {
    return;
  }
  int prev = -1; // the caller's device, set again at the end
  if (cudaGetDevice(&prev) != cudaSuccess) {
    prev = -1;
  }
  cudaSetDevice(g->device);
  for (int i = 0; i < g->ntasks; i++) {
    if (g->start && g->start[i]) {
      cudaEventDestroy(g->start[i]);
    }
    if (g->end && g->end[i]) {
      cudaEventDestroy(g->end[i]);
    }
  }
  if (g->step_begin) {
    cudaEventDestroy(g->step_begin);
  }
  for (int k = 0; k < g->nworker_streams; k++) {
    cudaStreamDestroy(g->worker[k]);
  }
  if (g->compute) {
    cudaStreamDestroy(g->compute);
  }
  pthread_mutex_destroy(&g->lock);
  free(g->start);
  free(g->end);
  free(g->stream_index);
  free(g);
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
}

loom_status_t loom_sched_gpu_step_begin(struct loom_sched_gpu *g) {
  loom_status_t status = LOOM_OK;
  LOOM_CHECK(loom_cuda_use_device(g->device));
  for (int i = 0; i < g->ntasks; i++) {
    g->stream_index[i] = -1;
  }
  g->saved = loom_cuda_stream();
  loom_cuda_set_stream(g->compute);
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(g->step_begin, g->compute));
  g->step_begin_ns = loom_sched_now_ns();
fail:
  return status;
}

// The calling thread's lane stream: the compute stream on the run thread, a worker stream
// (created on first use) on a worker thread. *index: 0 compute, 1 + k worker k.
static loom_status_t lane_stream(struct loom_sched_gpu *g, int on_worker, cudaStream_t *stream,
                                 int *index) {
  loom_status_t status = LOOM_OK;
  if (!on_worker) {
    *stream = g->compute;
    *index = 0;
    return LOOM_OK;
  }
  if (thread_owner != g) {
    LOOM_CHECK(loom_cuda_use_device(g->device));
    pthread_mutex_lock(&g->lock);
    if (g->nworker_streams == MAX_WORKER_STREAMS) {
      pthread_mutex_unlock(&g->lock);
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "scheduler: more than %d worker threads queue CUDA work; use fewer "
                        "workers",
                        MAX_WORKER_STREAMS);
    }
    cudaError_t rc =
        cudaStreamCreateWithFlags(&g->worker[g->nworker_streams], cudaStreamNonBlocking);
    if (rc == cudaSuccess) {
      thread_worker = g->nworker_streams++;
      thread_owner = g;
    }
    pthread_mutex_unlock(&g->lock);
    LOOM_CHECK_CUDA(NULL, rc);
  }
  *stream = g->worker[thread_worker];
  *index = 1 + thread_worker;
fail:
  return status;
}

// Make stream wait for the end events of gt's predecessors that ran on a GPU lane this step.
static loom_status_t wait_preds(const struct loom_gpu_task *gt, cudaStream_t stream, int index) {
  loom_status_t status = LOOM_OK;
  for (int i = 0; i < gt->npred; i++) {
    int p = gt->pred[i];
    int where = gt->g->stream_index[p];
    if (where >= 0 && where != index) {
      LOOM_CHECK_CUDA(NULL, cudaStreamWaitEvent(stream, gt->g->end[p], 0));
    }
  }
fail:
  return status;
}

loom_status_t loom_sched_gpu_run(struct loom_gpu_task *gt, int on_worker) {
  loom_status_t status = LOOM_OK;
  struct loom_sched_gpu *g = gt->g;
  cudaStream_t stream = 0, before = loom_cuda_stream();
  int index = 0;
  LOOM_CHECK(lane_stream(g, on_worker, &stream, &index));
  LOOM_CHECK(wait_preds(gt, stream, index));
  loom_cuda_set_stream(stream);
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(g->start[gt->id], stream));
  status = gt->run(gt->arg);
  // The end event is recorded even after a failure, so that successors never wait on an event
  // from an earlier step.
  cudaError_t rc = cudaEventRecord(g->end[gt->id], stream);
  g->stream_index[gt->id] = index;
  if (status == LOOM_OK && rc != cudaSuccess) {
    LOOM_CHECK_CUDA(NULL, rc);
  }
fail:
  loom_cuda_set_stream(before);
  return status;
}

loom_status_t loom_sched_gpu_worker_trampoline(void *arg) {
  return loom_sched_gpu_run(arg, 1);
}

loom_status_t loom_sched_gpu_order(const struct loom_gpu_task *gt) {
  return wait_preds(gt, gt->g->compute, 0);
}

loom_status_t loom_sched_gpu_step_end(struct loom_sched_gpu *g, struct loom_timeline *tl,
                                      const char *const *names, int64_t step, double *gpu_ms) {
  loom_status_t status = LOOM_OK;
  double busy = 0.0;
  *gpu_ms = 0.0;
  LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(g->compute));
  for (int k = 0; k < g->nworker_streams; k++) {
    LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(g->worker[k]));
  }
  for (int i = 0; i < g->ntasks; i++) {
    float a = 0.0f, b = 0.0f;
    if (g->stream_index[i] < 0) {
      continue;
    }
    LOOM_CHECK_CUDA(NULL, cudaEventElapsedTime(&a, g->step_begin, g->start[i]));
    LOOM_CHECK_CUDA(NULL, cudaEventElapsedTime(&b, g->step_begin, g->end[i]));
    if (g->stream_index[i] == 0) {
      busy += (double)(b - a);
    }
    if (tl) {
      int64_t t0 = g->step_begin_ns + (int64_t)((double)a * 1e6);
      int64_t t1 = g->step_begin_ns + (int64_t)((double)b * 1e6);
      loom_timeline_event(tl, names[i], g->stream_index[i] == 0 ? "compute" : "worker",
                          LOOM_TL_TID_GPU + g->stream_index[i], t0, t1, 0, step);
    }
  }
  *gpu_ms = busy;
fail:
  loom_cuda_set_stream(g->saved);
  return status;
}
