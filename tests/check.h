/* check.h — the few assertion helpers loom's test programs share: CHECK records a failure with
 * file:line and keeps going; check_exit() turns the count into the exit status. */
#ifndef LOOM_TESTS_CHECK_H
#define LOOM_TESTS_CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      check_failures++;                                                                            \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                              \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
    }                                                                                              \
  } while (0)

static inline int check_exit(const char *name) {
  if (check_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

#endif
