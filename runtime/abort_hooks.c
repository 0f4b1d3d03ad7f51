/* abort_hooks.c — the functions run just before loom aborts the job (loom_abort, the watchdog):
 * a fixed table filled by upper layers, run once per process. */
#include "config.h"
#include "abort_hooks.h"

#include <pthread.h>
#include <stddef.h>

static pthread_mutex_t hooks_mu = PTHREAD_MUTEX_INITIALIZER;
static void (*hooks[LOOM_ABORT_HOOKS_MAX])(void);
static int nhooks;
static int ran; // set once, atomically, by the first loom_abort_hooks_run

void loom_abort_hook_add(void (*fn)(void)) {
  if (!fn) {
    return;
  }
  pthread_mutex_lock(&hooks_mu);
  int known = 0;
  for (int i = 0; i < nhooks; i++) {
    known |= hooks[i] == fn;
  }
  if (!known && nhooks < LOOM_ABORT_HOOKS_MAX) {
    hooks[nhooks] = fn;
    __atomic_store_n(&nhooks, nhooks + 1, __ATOMIC_RELEASE); // (the entry first)
  }
  pthread_mutex_unlock(&hooks_mu);
}

void loom_abort_hooks_run(void) {
  if (__atomic_exchange_n(&ran, 1, __ATOMIC_ACQ_REL)) {
    return;
  }
  // The table is read without the lock: a thread aborting must not wait for one registering
  // (registration only appends, and a hook added while this runs may be missed).
  const int n = __atomic_load_n(&nhooks, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n && i < LOOM_ABORT_HOOKS_MAX; i++) {
    if (hooks[i]) {
      hooks[i]();
    }
  }
}
