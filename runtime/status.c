/* status.c — status codes, the per-thread and per-context last error, and loom_version.
 * loom_error_at records what failed and logs it at WARN with the file and line. */
#include "config.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctx.h"
#include "error.h"
#include "log.h"
#include "loom_version.h"

static _Thread_local char thread_last_error[LOOM_ERROR_MAX];
static _Thread_local int errors_quiet; // loom_error_quiet: record errors without logging them

static const char *const status_text[LOOM_STATUS_COUNT] = {
    [LOOM_OK] = "success",
    [LOOM_ERR_INVALID_ARG] = "invalid argument",
    [LOOM_ERR_MPI] = "MPI error",
    [LOOM_ERR_CUDA] = "CUDA error",
    [LOOM_ERR_NCCL] = "NCCL error",
    [LOOM_ERR_SYSTEM] = "system error",
    [LOOM_ERR_NOMEM] = "out of memory",
    [LOOM_ERR_TIMEOUT] = "timed out",
    [LOOM_ERR_REMOTE] = "error on another rank",
    [LOOM_ERR_CORRUPT] = "corrupt data",
    [LOOM_ERR_UNSUPPORTED] = "unsupported in this build or on this device",
    [LOOM_ERR_STATE] = "called in the wrong state",
    [LOOM_ERR_INTERNAL] = "internal error (a bug in loom: please report it)",
};

const char *loom_strerror(loom_status_t status) {
  if ((int)status < 0 || status >= LOOM_STATUS_COUNT) {
    return "unknown status code";
  }
  return status_text[status];
}

const char *loom_last_error(const loom_ctx_t *ctx) {
  return thread_last_error[0] || !ctx ? thread_last_error : ctx->last_error;
}

const char *loom_version(void) {
  return LOOM_VERSION_STRING;
}

// ctx->last_error is written by whichever thread fails (the compute lane, a worker task, a
// progress callback): one writer at a time, so a message is never two messages interleaved.
static pthread_mutex_t ctx_error_lock = PTHREAD_MUTEX_INITIALIZER;

static void set_ctx_error(loom_ctx_t *ctx, const char *msg) {
  pthread_mutex_lock(&ctx_error_lock);
  snprintf(ctx->last_error, sizeof ctx->last_error, "%s", msg);
  pthread_mutex_unlock(&ctx_error_lock);
}

loom_status_t loom_error_at(loom_ctx_t *ctx, loom_status_t status, const char *file, int line,
                            const char *fmt, ...) {
  char msg[LOOM_ERROR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(thread_last_error, sizeof thread_last_error, "%s", msg);
  if (ctx) {
    set_ctx_error(ctx, msg);
  }
  if (!errors_quiet) {
    loom_log_write(LOOM_LOG_WARN, LOOM_SUB_ALL, file, line, "%s: %s", loom_strerror(status), msg);
  }
  return status;
}

loom_status_t loom_error_unlogged(loom_status_t status, const char *fmt, ...) {
  char msg[LOOM_ERROR_MAX]; // (not formatted in place: an argument may be the last error)
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  loom_error_set_quiet(msg);
  return status;
}

void loom_error_quiet(int on) {
  errors_quiet = on;
}

void loom_error_clear(void) {
  thread_last_error[0] = '\0';
}

void loom_error_to_ctx(loom_ctx_t *ctx) {
  if (ctx) {
    set_ctx_error(ctx, thread_last_error);
  }
}

void loom_error_set_quiet(const char *msg) {
  snprintf(thread_last_error, sizeof thread_last_error, "%s", msg);
}
