/* worker.c — the scheduler's worker pool: pthreads taking jobs from a priority heap under one
 * mutex/condition, and a completed list the compute lane collects without waiting. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "sched_internal.h"

struct worker_thread {
  struct loom_worker_pool *pool;
  int index;
  pthread_t thread;
};

struct loom_worker_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct loom_heap queue;        // jobs not started yet
  struct loom_worker_job **done; // (capacity) completed, not collected yet
  int ndone, capacity;
  int stop;
  int nthreads;                  // threads started
  struct worker_thread *threads; // (nthreads requested)
};

// ---- the thread ------------------------------------------------------------------------------

static void *worker_main(void *arg) {
  struct worker_thread *w = arg;
  struct loom_worker_pool *p = w->pool;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->stop && p->queue.n == 0) {
      pthread_cond_wait(&p->cv, &p->mu);
    }
    if (p->queue.n == 0) { // stopping and nothing left to run
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    struct loom_worker_job *job = loom_heap_pop(&p->queue).ptr;
    pthread_mutex_unlock(&p->mu);

    loom_error_clear();
    job->worker = w->index;
    job->err[0] = '\0';
    job->t_start = loom_sched_now_ns();
    job->status = job->fn(job->arg);
    job->t_end = loom_sched_now_ns();
    if (job->status != LOOM_OK) {
      snprintf(job->err, sizeof job->err, "%s", loom_last_error(NULL));
    }

    pthread_mutex_lock(&p->mu);
    p->done[p->ndone++] = job;
    pthread_mutex_unlock(&p->mu);
  }
}

// ---- the pool --------------------------------------------------------------------------------

loom_status_t loom_worker_pool_create(loom_ctx_t *ctx, int nthreads, int capacity,
                                      struct loom_worker_pool **pool) {
  loom_status_t status = LOOM_OK;
  struct loom_worker_pool *p = NULL;
  *pool = NULL;
  if (nthreads < 1 || capacity < 1) {
    return loom_error(ctx, LOOM_ERR_INVALID_ARG,
                      "worker pool: %d threads for %d jobs (both must be >= 1)", nthreads,
                      capacity);
  }
  p = calloc(1, sizeof *p);
  LOOM_CHECK_SYS(ctx, p != NULL, "calloc(worker pool)");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->capacity = capacity;
  p->queue.cap = capacity;
  p->queue.v = calloc((size_t)capacity, sizeof *p->queue.v);
  p->done = calloc((size_t)capacity, sizeof *p->done);
  p->threads = calloc((size_t)nthreads, sizeof *p->threads);
  LOOM_CHECK_SYS(ctx, p->queue.v && p->done && p->threads, "calloc(worker pool queues)");
  for (int i = 0; i < nthreads; i++) {
    p->threads[i].pool = p;
    p->threads[i].index = i;
    int rc = pthread_create(&p->threads[i].thread, NULL, worker_main, &p->threads[i]);
    if (rc != 0) {
      status = loom_error(ctx, LOOM_ERR_SYSTEM, "pthread_create(worker %d of %d) failed: %s", i,
                          nthreads, strerror(rc));
      goto fail;
    }
    p->nthreads++;
  }
  *pool = p;
  return LOOM_OK;
fail:
  loom_worker_pool_destroy(p);
  return status;
}

void loom_worker_pool_submit(struct loom_worker_pool *p, struct loom_worker_job *job) {
  pthread_mutex_lock(&p->mu);
  loom_heap_push(&p->queue, (struct loom_heap_item){job->priority, job->id, job});
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

int loom_worker_pool_collect(struct loom_worker_pool *p, struct loom_worker_job **out, int max) {
  pthread_mutex_lock(&p->mu);
  int n = p->ndone < max ? p->ndone : max;
  memcpy(out, p->done, (size_t)n * sizeof *out);
  memmove(p->done, p->done + n, (size_t)(p->ndone - n) * sizeof *p->done);
  p->ndone -= n;
  pthread_mutex_unlock(&p->mu);
  return n;
}

void loom_worker_pool_destroy(struct loom_worker_pool *p) {
  if (!p) {
    return;
  }
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) {
    pthread_join(p->threads[i].thread, NULL);
  }
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p->queue.v);
  free(p->done);
  free(p->threads);
  free(p);
}
