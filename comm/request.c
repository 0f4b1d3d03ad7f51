/* request.c — loom_wait, loom_test, loom_wait_all: drive a request's stages with MPI_Testall and
 * its step hook, advance every other staged request meanwhile (under the watchdog), release it. */
#include "config.h"
#include "comm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "error.h"
#include "log.h"

// ---- request objects ----------------------------------------------------------------------------

loom_request_t *loom_request_new(const char *op) {
  loom_request_t *r = calloc(1, sizeof *r);
  if (!r) {
    loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate a request", op);
    return NULL;
  }
  r->op = op;
  __atomic_add_fetch(&loom_live_requests, 1, __ATOMIC_RELAXED);
  r->mpi = r->mpi_inline;
  r->sts = r->sts_inline;
  r->cap_mpi = LOOM_REQ_INLINE;
  return r;
}

MPI_Request *loom_request_slot(loom_request_t *r) {
  if (r->nmpi == r->cap_mpi) {
    int cap = r->cap_mpi * 2;
    MPI_Request *m = malloc(sizeof(MPI_Request) * (size_t)cap);
    MPI_Status *st = malloc(sizeof(MPI_Status) * (size_t)cap);
    if (!m || !st) {
      free(m);
      free(st);
      loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %d MPI requests", r->op, cap);
      return NULL;
    }
    memcpy(m, r->mpi, sizeof(MPI_Request) * (size_t)r->nmpi);
    if (r->mpi != r->mpi_inline) {
      free(r->mpi);
      free(r->sts);
    }
    r->mpi = m;
    r->sts = st;
    r->cap_mpi = cap;
  }
  r->mpi[r->nmpi] = MPI_REQUEST_NULL;
  return &r->mpi[r->nmpi++];
}

MPI_Request *loom_request_coll_slot(loom_request_t *r) {
  r->stage_coll = 1;
  return loom_request_slot(r);
}

loom_status_t loom_request_tmp(loom_request_t *r, size_t bytes, void **out) {
  *out = NULL;
  if (bytes == 0) {
    return LOOM_OK;
  }
  for (int i = 0; i < LOOM_REQ_TMP; i++) {
    if (!r->tmp[i]) {
      r->tmp[i] = loom_host_alloc(bytes);
      if (!r->tmp[i]) {
        return loom_error(NULL, LOOM_ERR_NOMEM, "%s: cannot allocate %zu bytes of scratch", r->op,
                          bytes);
      }
      *out = r->tmp[i];
      return LOOM_OK;
    }
  }
  return loom_error(NULL, LOOM_ERR_INTERNAL, "%s: more than %d scratch buffers", r->op,
                    LOOM_REQ_TMP);
}

// ---- the list of requests with a pending step ---------------------------------------------------

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_request_t *list_head;

static void unlink_locked(loom_request_t *r) {
  if (!r->listed) {
    return;
  }
  if (r->list_prev) {
    r->list_prev->list_next = r->list_next;
  } else {
    list_head = r->list_next;
  }
  if (r->list_next) {
    r->list_next->list_prev = r->list_prev;
  }
  r->list_prev = r->list_next = NULL;
  r->listed = 0;
}

void loom_request_started(loom_request_t *r) {
  if (!r->step) {
    return;
  }
  pthread_mutex_lock(&list_lock);
  r->list_prev = NULL;
  r->list_next = list_head;
  if (list_head) {
    list_head->list_prev = r;
  }
  list_head = r;
  r->listed = 1;
  pthread_mutex_unlock(&list_lock);
}

void loom_request_free(loom_request_t *r) {
  if (!r) {
    return;
  }
  pthread_mutex_lock(&list_lock);
  unlink_locked(r);
  pthread_mutex_unlock(&list_lock);
  if (r->release) {
    r->release(r);
  }
  for (int i = 0; i < LOOM_REQ_TMP; i++) {
    loom_host_free(r->tmp[i]);
  }
  if (r->mpi != r->mpi_inline) {
    free(r->mpi);
    free(r->sts);
  }
  free(r);
  __atomic_sub_fetch(&loom_live_requests, 1, __ATOMIC_RELAXED);
}

// ---- progress -----------------------------------------------------------------------------------

// The error of a stage whose MPI_Testall returned rc (the group communicators return errors):
// the first failed request's status says which. The stage's other requests end before the
// request does, so that nothing lands in the caller's buffers after it failed: receives and
// sends are cancelled, collectives (which MPI forbids cancelling, and which every rank posted)
// are waited for. That wait holds the list lock, but it does not block with Open MPI: its
// MPI_Testall reports an error only once every request of the stage has completed (checked with a
// stage of a truncated receive and a barrier the peer never entered: it waited as a whole, and
// LOOM_TIMEOUT reported it).
static loom_status_t stage_failed(loom_request_t *r, int rc) {
  int err = rc, peer = -1, cls = MPI_ERR_OTHER;
  MPI_Error_class(rc, &cls);
  for (int i = 0; cls == MPI_ERR_IN_STATUS && i < r->nmpi; i++) {
    if (r->sts[i].MPI_ERROR != MPI_SUCCESS && r->sts[i].MPI_ERROR != MPI_ERR_PENDING) {
      err = r->sts[i].MPI_ERROR;
      peer = r->sts[i].MPI_SOURCE;
      break;
    }
  }
  if (r->stage_coll) {
    MPI_Waitall(r->nmpi, r->mpi, MPI_STATUSES_IGNORE);
  }
  for (int i = 0; i < r->nmpi; i++) {
    if (r->mpi[i] != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Cancel(&r->mpi[i]);
      MPI_Test(&r->mpi[i], &done, MPI_STATUS_IGNORE);
      if (!done && r->mpi[i] != MPI_REQUEST_NULL) {
        MPI_Request_free(&r->mpi[i]);
      }
    }
  }
  r->nmpi = 0;
  r->stage_coll = 0;
  char from[48] = "";
  if (peer >= 0) {
    snprintf(from, sizeof from, " from rank %d", peer);
  }
  MPI_Error_class(err, &cls);
  if (cls == MPI_ERR_TRUNCATE) {
    return loom_error(NULL, LOOM_ERR_MPI,
                      "%s: a message%s is longer than the receive posted for it "
                      "(MPI_ERR_TRUNCATE): the ranks disagree on a count; give the receive the "
                      "sender's count (a collective needs the same counts on every rank)",
                      r->op, from);
  }
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, msg, &len);
  return loom_error(NULL, LOOM_ERR_MPI, "%s: an MPI request%s failed: %s", r->op, from, msg);
}

// Advance r without blocking (list_lock held): finish its stage if the MPI requests completed and
// run the step hook (once its ready condition holds), as far as possible. A failure is kept in
// r->error for its owner.
static void advance_locked(loom_request_t *r) {
  while (r->error == LOOM_OK) {
    if (r->nmpi > 0) {
      int flag = 0;
      int rc = MPI_Testall(r->nmpi, r->mpi, &flag, r->sts);
      if (rc != MPI_SUCCESS) {
        r->error = stage_failed(r, rc);
        snprintf(r->errmsg, sizeof r->errmsg, "%s", loom_last_error(NULL));
        break;
      }
      if (!flag) {
        return;
      }
      r->nmpi = 0;
      r->stage_coll = 0;
    }
    if (!r->step) {
      break;
    }
    if (r->ready) { // the step waits for a non-MPI condition; r stays listed until it holds
      int ok = 0;
      r->error = r->ready(r, &ok);
      if (r->error != LOOM_OK) {
        snprintf(r->errmsg, sizeof r->errmsg, "%s", loom_last_error(NULL));
        break;
      }
      if (!ok) {
        return;
      }
      r->ready = NULL;
    }
    loom_status_t (*step)(loom_request_t *) = r->step;
    r->step = NULL;
    r->error = step(r);
    if (r->error != LOOM_OK) { // kept with r: the thread advancing it may not be its owner's
      snprintf(r->errmsg, sizeof r->errmsg, "%s", loom_last_error(NULL));
    }
  }
  unlink_locked(r); // nothing more to post
}

static void advance_all_locked(void) {
  loom_request_t *r = list_head;
  while (r) {
    loom_request_t *next = r->list_next; // r may leave the list
    advance_locked(r);
    r = next;
  }
}

void loom_comm_progress(void) {
  pthread_mutex_lock(&list_lock);
  advance_all_locked();
  pthread_mutex_unlock(&list_lock);
  // Requests without a pending step (one MPI call) are not listed: a probe that matches nothing
  // runs Open MPI's progress engine for them.
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
}

// One round of progress for r (and every staged request). *done = 1 when r completed or failed;
// block lets a NCCL request wait for its event when no MPI stage needs this thread. r's state is
// read under the lock: a progress thread may advance r at the same time.
static loom_status_t progress(loom_request_t *r, int block, int *done) {
  pthread_mutex_lock(&list_lock);
  advance_all_locked();
  advance_locked(r);
  int idle = list_head == NULL;
  loom_status_t error = r->error;
  int pending = r->nmpi > 0 || r->step;
  pthread_mutex_unlock(&list_lock);
  *done = 0;
  if (error != LOOM_OK) {
    *done = 1;
    loom_error_set_quiet(r->errmsg); // the message, in the owner's thread (logged when met)
    return error;
  }
  if (pending) {
    return LOOM_OK;
  }
  if (r->poll) {
    return r->poll(r, block && idle, done);
  }
  *done = 1;
  return LOOM_OK;
}

// ---- public -------------------------------------------------------------------------------------

loom_status_t loom_test(loom_request_t **req, int *done) {
  if (!req || !done) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_test: %s is NULL: pass &request, &done",
                      !req ? "req" : "done");
  }
  *done = 0;
  if (!*req) { // already released: nothing to wait for
    *done = 1;
    return LOOM_OK;
  }
  loom_status_t status = progress(*req, 0, done);
  if (*done || status != LOOM_OK) {
    loom_request_free(*req);
    *req = NULL;
    *done = 1;
  } else { // LOOM_TIMEOUT since the operation started: every test looks at the clock
    loom_watch_test(&(*req)->watch);
  }
  return status;
}

loom_status_t loom_wait(loom_request_t **req) {
  if (!req) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_wait: req is NULL: pass &request");
  }
  loom_status_t status = LOOM_OK;
  int done = 0;
  while (*req && !done && status == LOOM_OK) {
    status = progress(*req, 1, &done);
    if (!done && status == LOOM_OK) {
      loom_watch_check(&(*req)->watch);
    }
  }
  if (*req) {
    loom_request_free(*req);
    *req = NULL;
  }
  return status;
}

loom_status_t loom_wait_all(loom_request_t **reqs, int n) {
  if (n < 0 || (n > 0 && !reqs)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_wait_all: reqs is %s with n = %d: pass an array of n >= 0 requests",
                      reqs ? "set" : "NULL", n);
  }
  loom_status_t first = LOOM_OK;
  for (int i = 0; i < n; i++) {
    loom_status_t status = loom_wait(&reqs[i]);
    if (first == LOOM_OK) {
      first = status;
    }
  }
  return first;
}
