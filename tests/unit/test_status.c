/* test_status.c — status strings, the per-thread last error, and the error/check macros
 * (MPI-free: the errno path and loom_error). */
#include "config.h"

#include <string.h>

#include "../check.h"
#include "error.h"
#include "loom.h"

static loom_status_t open_missing(void) {
  loom_status_t status = LOOM_OK;
  FILE *f = fopen("/nonexistent/loom/file", "r");
  LOOM_CHECK_SYS(NULL, f != NULL, "fopen(/nonexistent/loom/file)");
  fclose(f);
fail:
  return status;
}

static loom_status_t chained(void) {
  loom_status_t status = LOOM_OK;
  LOOM_CHECK(open_missing());
  return LOOM_ERR_INTERNAL; // not reached
fail:
  return status;
}

int main(void) {
  for (int s = 0; s < LOOM_STATUS_COUNT; s++) {
    const char *t = loom_strerror((loom_status_t)s);
    CHECK(t && t[0] && strcmp(t, "unknown status code") != 0, "status %d has no text", s);
  }
  CHECK(!strcmp(loom_strerror(LOOM_OK), "success"), "OK text");
  CHECK(!strcmp(loom_strerror((loom_status_t)999), "unknown status code"), "out of range");
  CHECK(!strcmp(loom_strerror((loom_status_t)-1), "unknown status code"), "negative");

  loom_error_clear();
  CHECK(loom_last_error(NULL)[0] == '\0', "cleared");
  loom_status_t st = loom_error(NULL, LOOM_ERR_CORRUPT, "payload %d is %s", 7, "short");
  CHECK(st == LOOM_ERR_CORRUPT, "loom_error returns its status");
  CHECK(!strcmp(loom_last_error(NULL), "payload 7 is short"), "got '%s'", loom_last_error(NULL));

  st = chained();
  CHECK(st == LOOM_ERR_SYSTEM, "errno path gives LOOM_ERR_SYSTEM, got %d", st);
  CHECK(strstr(loom_last_error(NULL), "fopen(/nonexistent/loom/file) failed") != NULL,
        "message names the call: '%s'", loom_last_error(NULL));
  CHECK(strstr(loom_last_error(NULL), "No such file") != NULL, "message has strerror: '%s'",
        loom_last_error(NULL));
  CHECK(!strcmp(loom_version(), LOOM_VERSION_STRING), "version %s vs header %s", loom_version(),
        LOOM_VERSION_STRING);
  return check_exit("test_status");
}
