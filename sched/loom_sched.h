/* loom_sched.h — the per-rank step scheduler: a task graph on lanes (compute, comm, worker) with
 * dependencies and priorities, built once and replayed every step, with stats and a timeline. */
#ifndef LOOM_SCHED_H
#define LOOM_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "loom_core.h"
#include "loom_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

// How a step runs:
// - The thread that calls loom_sched_run is the compute lane: it runs compute tasks one at a
//   time, highest priority first among the ready ones (ties: lower task id first).
// - Comm tasks start a non-blocking operation (a loom_request_t) as soon as their dependencies
//   are done; the compute lane tests outstanding requests between compute tasks (and whenever a
//   compute task calls loom_sched_poll), which is what lets MPI move large messages while
//   compute runs. Comm tasks start in one fixed order, the same on every rank and every step,
//   as collectives require: the order a replay with instantaneous comm and worker tasks gives
//   (ready tasks by priority, then id). A comm task that is ready before its turn waits.
// - While requests are in flight, a progress thread (started at the first run when the graph has
//   comm tasks and MPI granted MPI_THREAD_MULTIPLE) advances them every LOOM_SCHED_PROGRESS_US
//   (1 ms by default; 0: no thread), sleeping in between, so that messages keep moving during
//   long compute tasks that do not call loom_sched_poll. It sleeps on a condition variable when
//   nothing is in flight.
// - Worker tasks run on a small pthread pool (loom_sched_opts_t.workers) and must not call MPI.
//   The compute lane treats them like requests: it notices completion when it polls.
// - When no compute task is ready, the compute lane waits for comm or workers. With only
//   requests out it polls back to back, calling sched_yield between polls, for up to
//   LOOM_SCHED_SPIN_US (20 ms by default): the core has nothing else of this rank to do, and
//   Open MPI moves a large shared-memory message a fragment per poll. After that, and whenever
//   worker tasks are out, it sleeps between polls with exponential backoff (2 us doubling to
//   200 us). That wait is the exposed communication of the step.
// - A failing task ends the step: no new task starts, what is in flight (requests, worker
//   tasks) is completed, and loom_sched_run returns the first failure. The next run starts a
//   fresh step on the same graph. Only this rank stopped: the other ranks post the step's
//   remaining collectives, which this rank never joins, so running on would pair one step's
//   collectives with the next one's (wrong sums, or a LOOM_TIMEOUT abort). After a failed run,
//   run again only when every rank failed alike (agree on it, e.g. an allreduce of a flag);
//   otherwise stop the job (MPI_Abort), as the example trainers do.

typedef enum loom_lane {
  LOOM_LANE_COMPUTE = 0, // runs on the thread calling loom_sched_run
  LOOM_LANE_COMM,        // starts a non-blocking operation; completed by loom_test
  LOOM_LANE_WORKER,      // runs on a worker thread (offloaded compression and the like)
  LOOM_LANE_COUNT
} loom_lane_t;

typedef struct loom_task_desc {
  const char *name; // shown in errors and the timeline (copied); NULL gives "task<id>"
  loom_lane_t lane;
  int priority; // higher first among ready tasks of the lane (ties: lower id first)
  // Compute and worker lanes: runs the task to completion.
  loom_status_t (*run)(void *arg);
  // Comm lane: starts the operation and sets *req (loom_iallreduce and friends). A NULL *req
  // on success means the operation already completed. On failure leave *req NULL, as loom's
  // own i* calls do: a request left set is waited for before the failure ends the step.
  loom_status_t (*start)(void *arg, loom_request_t **req);
  void *arg;
  size_t bytes; // payload size shown in the timeline (0 if meaningless)
} loom_task_desc_t;

typedef struct loom_sched_opts {
  int workers; // worker threads (0: 1; at most one per worker task); started at the first run,
               // only if a worker task exists
  // Chrome trace path (%r = rank); "" = off; NULL = LOOM_TIMELINE from ctx. LOOM_TIMELINE set
  // in the environment overrides this field, as it overrides loom_config_t. One file per live
  // scheduler: this field naming another one's file is LOOM_ERR_INVALID_ARG at create, and
  // LOOM_TIMELINE's path gives the second scheduler NAME.s1.EXT (then .s2, ...), with a warning.
  const char *timeline;
  int rank; // timeline pid and %r when ctx is NULL (ignored otherwise)
  // Non-zero: compute and worker tasks queue CUDA work on the current device. The compute lane
  // gets its own stream (current inside its tasks: loom_cuda ops go there), each worker thread
  // another; dependencies become CUDA events, comm tasks on device tensors start after the GPU
  // work they depend on, and each step ends when every lane stream is done. The timeline gains
  // "gpu" tracks with each task's GPU time. LOOM_ERR_UNSUPPORTED in a build without CUDA.
  int cuda;
} loom_sched_opts_t;

// Per-step statistics, in milliseconds of wall-clock time on this rank.
typedef struct loom_step_stats {
  int64_t step;             // index of the step (0 for the first run, or loom_sched_set_step's)
  loom_status_t status;     // what loom_sched_run returned
  int tasks_run;            // tasks that ran (all of them unless the step failed)
  double wall_ms;           // loom_sched_run from entry to return
  double compute_ms;        // compute tasks (busy time of the compute lane)
  double comm_ms;           // time with at least one comm request in flight
  double worker_ms;         // worker tasks, summed over the worker threads
  double exposed_comm_ms;   // compute lane waiting, no compute task ready, comm in flight
  double exposed_worker_ms; // compute lane waiting on worker tasks only
  double idle_ms;           // wall - compute - exposed comm - exposed worker (launch, polling)
  int64_t polls;            // loom_test calls plus checks of the worker pool
  int64_t sleeps;           // backoff sleeps while waiting (after the spin window)
  int64_t progress_polls;   // rounds of the progress thread (0 without one)
  double gpu_ms;            // CUDA schedulers: GPU time of the compute stream's tasks (else 0)
} loom_step_stats_t;

typedef struct loom_sched loom_sched_t;

// Create an empty graph. ctx may be NULL (tests, tools): errors then go to the thread's last
// error only, and the timeline uses opts->rank. opts may be NULL (defaults). When a timeline
// path is set, its file is created here (LOOM_ERR_SYSTEM naming the path if it cannot be;
// LOOM_ERR_INVALID_ARG for a FIFO or socket, or for the file of another live scheduler).
LOOM_API loom_status_t loom_sched_create(loom_ctx_t *ctx, const loom_sched_opts_t *opts,
                                         loom_sched_t **s);
// Add a task; *id receives its id (0, 1, ... in the order of addition). LOOM_ERR_STATE once the
// graph has run; LOOM_ERR_INVALID_ARG for a bad lane or a missing run/start function.
LOOM_API loom_status_t loom_sched_add(loom_sched_t *s, const loom_task_desc_t *d, int *id);
// Task `task` runs only after task `after` completed. LOOM_ERR_INVALID_ARG for unknown ids or
// task == after; cycles are reported by the first loom_sched_run, naming the tasks on one.
LOOM_API loom_status_t loom_sched_depend(loom_sched_t *s, int task, int after);
// Run one step: every task once, respecting dependencies. The first run freezes the graph
// (checks it for cycles and fixes the comm order). Returns the first task failure (its message
// prefixed with the task's name), after completing what was in flight.
LOOM_API loom_status_t loom_sched_run(loom_sched_t *s);
// Called from inside a long compute task: test outstanding requests and start comm tasks whose
// turn has come, so communication progresses during the task. Only on the thread running
// loom_sched_run; elsewhere, outside a run, or from inside a comm task's start function (which
// would start later comm tasks out of their order) it does nothing.
LOOM_API void loom_sched_poll(loom_sched_t *s);
// Number the next run `step` (the following ones count up from it, up to INT64_MAX, where the
// count stays): a loop that resumed at step
// k calls it with k before its first run, so that the stats, the timeline and failure messages
// carry the loop's step numbers. LOOM_ERR_INVALID_ARG for a negative step; LOOM_ERR_STATE from
// inside a run.
LOOM_API loom_status_t loom_sched_set_step(loom_sched_t *s, int64_t step);
// Statistics of the last step (zeros before the first run).
LOOM_API loom_status_t loom_sched_step_stats(const loom_sched_t *s, loom_step_stats_t *out);
// Write the events recorded so far to the timeline file, which is then valid JSON (a no-op when
// the timeline is off). Events are also written every 64k events and at destroy. May be called
// from any task, a worker task's thread included: the events are written under a lock.
LOOM_API loom_status_t loom_sched_timeline_flush(loom_sched_t *s);
// Write the rest of the timeline, stop the worker threads and free everything. Returns the
// status of the timeline write; everything is freed either way. NULL is fine.
LOOM_API loom_status_t loom_sched_destroy(loom_sched_t *s);

#ifdef __cplusplus
}
#endif
#endif
