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

// The time interval_ns from now on the condition variable's clock (CLOCK_MONOTONIC).
static struct timespec deadline(long interval_ns) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += interval_ns / 1000000000L;
  t.tv_nsec += interval_ns % 1000000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

static void *progress_main(void *arg) {
  struct loom_progress *p = arg;
  pthread_mutex_lock(&p->lock);
  while (!p->stop) {
    if (!atomic_load_explicit(&p->active, memory_order_acquire)) {
      pthread_cond_wait(&p->wake, &p->lock);
      continue;
    }
    // One poll, under the lock: loom_progress_activate(p, 0) returns between polls, so no poll
    // runs after the scheduler switched the thread off (into a caller's MPI_Finalize, say).
    loom_comm_progress();
    atomic_fetch_add_explicit(&p->polls, 1, memory_order_relaxed);
    // Then sleep the interval, so that the thread takes a few microseconds of a core per
    // interval, not the core; on the condition variable, so that loom_progress_destroy wakes it
    // at once (was nanosleep: destroy waited out up to a whole LOOM_SCHED_PROGRESS_US, 1 s).
    const struct timespec until = deadline(p->interval_ns);
    while (!p->stop && atomic_load_explicit(&p->active, memory_order_acquire) &&
           pthread_cond_timedwait(&p->wake, &p->lock, &until) == 0) {
    }
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
  pthread_condattr_t attr; // timed waits on the monotonic clock: a clock step cannot stretch one
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&p->wake, &attr);
  pthread_condattr_destroy(&attr);
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
  // Under the lock: switching on, the wake-up cannot fall between the thread's check and its
  // wait; switching off, this returns between two polls (none runs after).
  pthread_mutex_lock(&p->lock);
  atomic_store_explicit(&p->active, on ? 1 : 0, memory_order_release);
  if (on) {
    pthread_cond_signal(&p->wake);
  }
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
