/* quiet.h — silence stderr around calls that are expected to fail (each logs a WARN line), so
 * that a test's output shows only its own findings; TEST_VERBOSE=1 keeps everything. */
#ifndef LOOM_TESTS_QUIET_H
#define LOOM_TESTS_QUIET_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int quiet_saved_fd = -1;

static inline void quiet_begin(void) {
  if (getenv("TEST_VERBOSE") != NULL || quiet_saved_fd >= 0) {
    return;
  }
  fflush(stderr);
  int devnull = open("/dev/null", O_WRONLY);
  if (devnull < 0) {
    return;
  }
  quiet_saved_fd = dup(STDERR_FILENO);
  if (quiet_saved_fd >= 0) {
    dup2(devnull, STDERR_FILENO);
  }
  close(devnull);
}

static inline void quiet_end(void) {
  if (quiet_saved_fd >= 0) {
    fflush(stderr);
    dup2(quiet_saved_fd, STDERR_FILENO);
    close(quiet_saved_fd);
    quiet_saved_fd = -1;
  }
}

#endif
