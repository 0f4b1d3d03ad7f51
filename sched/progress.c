/* progress.c — the scheduler's communication progress thread: while requests are in flight it
 * calls loom_comm_progress every LOOM_SCHED_PROGRESS_US, so messages move while compute runs. */
#include "config.h"
#include "sched_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "comm_internal.h"
#include "error.h"

struct loom_progress {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  long interval_ns;
  int stop;           // under lock
  atomic_int active;  // requests in flight: poll (set under lock when it turns on)
  atomic_llong polls; // loom_comm_progress calls, all time
};

static void *progress_main(void *arg) {
  struct loom_progress *p = arg;
  pthread_mutex_lock(&p->lock);
  while (!p->stop) {
    if (!atomic_load_explicit(&p->active, memory_order_acquire)) {
      pthread_cond_wait(&p->wake, &p->lock);
      continue;
    }
    pthread_mutex_unlock(&p->lock);
    // Poll until the scheduler says nothing is in flight; sleep between polls so that the
    // thread takes a few microseconds of a core per interval, not the core.
    while (atomic_load_explicit(&p->active, memory_order_acquire)) {
      loom_comm_progress();
      atomic_fetch_add_explicit(&p->polls, 1, memory_order_relaxed);
      // tv_nsec must stay below 1 s (LOOM_SCHED_PROGRESS_US goes up to 1000000): else
      // nanosleep fails with EINVAL at once and the thread polls back to back.
      struct timespec ts = {p->interval_ns / 1000000000L, p->interval_ns % 1000000000L};
      nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&p->lock);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

loom_status_t loom_progress_create(loom_ctx_t *ctx, long interval_us, struct loom_progress **out) {
  *out = NULL;
  struct loom_progress *p = calloc(1, sizeof *p);
  if (!p) {
    return loom_error(ctx, LOOM_ERR_NOMEM, "cannot allocate the progress thread's state");
  }
  p->interval_ns = interval_us * 1000;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  int rc = pthread_create(&p->thread, NULL, progress_main, p);
  if (rc != 0) {
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return loom_error(ctx, LOOM_ERR_SYSTEM,
                      "pthread_create(progress thread) failed (error %d): set "
                      "LOOM_SCHED_PROGRESS_US=0 to run without it",
                      rc);
  }
  *out = p;
  return LOOM_OK;
}

void loom_progress_activate(struct loom_progress *p, int on) {
  if (!p) {
    return;
  }
  if (!on) {
    atomic_store_explicit(&p->active, 0, memory_order_release);
    return;
  }
  pthread_mutex_lock(&p->lock); // so the wake-up cannot fall between its check and its wait
  atomic_store_explicit(&p->active, 1, memory_order_release);
  pthread_cond_signal(&p->wake);
  pthread_mutex_unlock(&p->lock);
}

int64_t loom_progress_polls(const struct loom_progress *p) {
  return p ? (int64_t)atomic_load_explicit(&p->polls, memory_order_relaxed) : 0;
}

void loom_progress_destroy(struct loom_progress *p) {
  if (!p) {
    return;
  }
  atomic_store_explicit(&p->active, 0, memory_order_release);
  pthread_mutex_lock(&p->lock);
  p->stop = 1;
  pthread_cond_signal(&p->wake);
  pthread_mutex_unlock(&p->lock);
  pthread_join(p->thread, NULL);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
