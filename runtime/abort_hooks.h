/* abort_hooks.h — what runs just before loom aborts the job: upper layers register a function
 * (the scheduler writes out its timelines), loom_abort and the watchdog run them. */
#ifndef LOOM_ABORT_HOOKS_H
#define LOOM_ABORT_HOOKS_H

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_ABORT_HOOKS_MAX 4

// Register fn (once: adding it again does nothing; beyond LOOM_ABORT_HOOKS_MAX it is dropped).
// Thread-safe. A hook must not block for long and must not call MPI: the job is about to end.
void loom_abort_hook_add(void (*fn)(void));
// Run the registered hooks, once per process (a second call, from any thread, returns at once).
void loom_abort_hooks_run(void);

#ifdef __cplusplus
}
#endif
#endif
