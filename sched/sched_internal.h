/* sched_internal.h — what the scheduler's files share: the clock, the measurement caches, a
 * regular-file check for readers, the ready heap and the worker pool (sched/worker.c). Internal. */
#ifndef LOOM_SCHED_INTERNAL_H
#define LOOM_SCHED_INTERNAL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// Monotonic time in nanoseconds.
static inline int64_t loom_sched_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// Measurement caches (cache.c): the file of a kind ("codec-costs", "moe-tune") for this host and
// build, in $LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom (0, or -1 when there
// is no such directory to name); append a line to it (directories created; failures ignored:
// a cache that cannot be written is measured again next time). Readers treat the file as
// untrusted.
#include <stddef.h>
int loom_cache_file(char *path, size_t cap, const char *kind);
void loom_cache_append(const char *kind, const char *line);
// The cache file of a kind opened for reading, or NULL when there is none; also NULL when it is
// not a regular file of at most LOOM_CACHE_MAX_BYTES (one warning per process: the cache is
// treated as absent, each run measures again).
#define LOOM_CACHE_MAX_BYTES ((uint64_t)1 << 20)
FILE *loom_cache_open(const char *kind);
// The next whole line of a cache file into line (cap bytes, the newline kept): 1, or 0 at the
// end. A line longer than cap - 1 bytes is skipped whole (its last piece would read as a line
// of its own), and so is a last line cut short (no newline: an interrupted append).
int loom_cache_line(FILE *f, char *line, int cap);

#include "file_regular.h" // loom_fopen_regular, loom_file_regular (runtime/)

// ---------------------------------------------------------------------------------------------
// Ready heap: a binary heap with a fixed capacity; the top is the highest priority, then the
// lowest id, so that the order never depends on timing.

struct loom_heap_item {
  int priority;
  int id;
  void *ptr;
};

struct loom_heap {
  struct loom_heap_item *v; // (cap)
  int n, cap;
};

static inline int loom_heap_before(const struct loom_heap_item *a, const struct loom_heap_item *b) {
  return a->priority > b->priority || (a->priority == b->priority && a->id < b->id);
}

// The caller guarantees n < cap (capacities are the number of tasks of the graph).
static inline void loom_heap_push(struct loom_heap *h, struct loom_heap_item item) {
  int i = h->n++;
  while (i > 0) {
    int parent = (i - 1) / 2;
    if (!loom_heap_before(&item, &h->v[parent])) {
      break;
    }
    h->v[i] = h->v[parent];
    i = parent;
  }
  h->v[i] = item;
}

// The caller guarantees n > 0.
static inline struct loom_heap_item loom_heap_pop(struct loom_heap *h) {
  struct loom_heap_item top = h->v[0], last = h->v[--h->n];
  int i = 0;
  for (;;) {
    int c = 2 * i + 1;
    if (c >= h->n) {
      break;
    }
    if (c + 1 < h->n && loom_heap_before(&h->v[c + 1], &h->v[c])) {
      c++;
    }
    if (!loom_heap_before(&h->v[c], &last)) {
      break;
    }
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n > 0) {
    h->v[i] = last;
  }
  return top;
}

// ---------------------------------------------------------------------------------------------
// Worker pool: threads take jobs from a heap (priority desc, id asc), run them, and put them on
// a completed list that the compute lane collects without blocking.

#define LOOM_SCHED_ERR_MAX 512

struct loom_worker_job {
  loom_status_t (*fn)(void *arg);
  void *arg;
  int priority, id;
  // Written by the worker thread, read after collection:
  loom_status_t status;
  int64_t t_start, t_end;       // loom_sched_now_ns
  int worker;                   // index of the thread that ran it
  char err[LOOM_SCHED_ERR_MAX]; // the thread's last error when status != LOOM_OK
};

struct loom_worker_pool;

// Start nthreads threads for at most capacity queued jobs. ctx (may be NULL) receives errors.
loom_status_t loom_worker_pool_create(loom_ctx_t *ctx, int nthreads, int capacity,
                                      struct loom_worker_pool **pool);
// Queue a job (at most capacity outstanding jobs).
void loom_worker_pool_submit(struct loom_worker_pool *pool, struct loom_worker_job *job);
// Move up to max completed jobs into out; returns how many. Never blocks on a running job.
int loom_worker_pool_collect(struct loom_worker_pool *pool, struct loom_worker_job **out, int max);
// Run the queued jobs, then stop and join the threads. NULL is fine.
void loom_worker_pool_destroy(struct loom_worker_pool *pool);

// ---------------------------------------------------------------------------------------------
// Progress thread (sched/progress.c): while activated, calls loom_comm_progress every interval
// (sleeping in between); otherwise it waits on a condition variable and costs nothing.

struct loom_progress;

loom_status_t loom_progress_create(loom_ctx_t *ctx, long interval_us, struct loom_progress **out);
// on: requests are in flight (wakes the thread); off: stop polling after the current round.
void loom_progress_activate(struct loom_progress *p, int on);
// loom_comm_progress calls so far. NULL gives 0.
int64_t loom_progress_polls(const struct loom_progress *p);
// Stop and join the thread. NULL is fine.
void loom_progress_destroy(struct loom_progress *p);

// ---------------------------------------------------------------------------------------------
// CUDA lanes (sched/sched_cuda.c, built with the CUDA backend): streams per lane, an event per
// task, GPU spans on the timeline. See the comment atop sched_cuda.c.

struct loom_sched_gpu;
struct loom_timeline;

// One task as the CUDA lanes see it (filled when the graph freezes).
struct loom_gpu_task {
  struct loom_sched_gpu *g;
  int id;
  const int *pred; // (npred) the task's predecessors
  int npred;
  loom_status_t (*run)(void *arg);
  void *arg;
};

// Streams and events for ntasks tasks on the current CUDA device.
loom_status_t loom_sched_gpu_create(loom_ctx_t *ctx, int ntasks, struct loom_sched_gpu **out);
void loom_sched_gpu_destroy(struct loom_sched_gpu *g); // NULL is fine
// On the run thread at the start of a step: the compute stream becomes the current stream.
loom_status_t loom_sched_gpu_step_begin(struct loom_sched_gpu *g);
// Run a compute (on_worker 0, run thread) or worker task on its lane's stream, after the end
// events of its GPU predecessors; records its own.
loom_status_t loom_sched_gpu_run(struct loom_gpu_task *gt, int on_worker);
// The worker-pool job function of a CUDA worker task (arg: its struct loom_gpu_task).
loom_status_t loom_sched_gpu_worker_trampoline(void *arg);
// Before a comm task starts: the compute stream waits for its GPU predecessors.
loom_status_t loom_sched_gpu_order(const struct loom_gpu_task *gt);
// At the end of a step: wait for every lane stream, write the GPU spans to tl (may be NULL;
// names[i] is task i's name), *gpu_ms = GPU time of the compute stream's tasks; restores the
// run thread's current stream.
loom_status_t loom_sched_gpu_step_end(struct loom_sched_gpu *g, struct loom_timeline *tl,
                                      const char *const *names, int64_t step, double *gpu_ms);

#ifdef __cplusplus
}
#endif
#endif
