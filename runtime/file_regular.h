/* file_regular.h — open a file for reading only when it is a regular file of bounded size (the
 * loaders of checkpoints, caches, the simulator's files and the timeline merge's inputs). */
#ifndef LOOM_FILE_REGULAR_H
#define LOOM_FILE_REGULAR_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

// Files read as text or whole: 0 when f is open on a regular file of at most max_bytes (*size,
// when not NULL, gets its size), else -1. A device such as /dev/zero (an endless run of NUL
// "lines") or a FIFO never ends a read loop. Readers open with loom_fopen_regular (below).
static inline int loom_file_regular(FILE *f, uint64_t max_bytes, uint64_t *size) {
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0 ||
      (uint64_t)sb.st_size > max_bytes) {
    return -1;
  }
  if (size) {
    *size = (uint64_t)sb.st_size;
  }
  return 0;
}

// fopen(path, mode) for a regular file of at most max_bytes (*size, when not NULL, gets its
// size): checked with stat before the open, since opening a FIFO would wait for a writer, and
// with fstat after. NULL with *not_regular = 1 when path is not such a file, or with
// *not_regular = 0 and errno set when it cannot be opened.
static inline FILE *loom_fopen_regular(const char *path, const char *mode, uint64_t max_bytes,
                                       uint64_t *size, int *not_regular) {
  struct stat sb;
  *not_regular = 0;
  if (stat(path, &sb) != 0) {
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    *not_regular = 1;
    return NULL;
  }
  FILE *f = fopen(path, mode);
  if (f && loom_file_regular(f, max_bytes, size) != 0) {
    fclose(f);
    *not_regular = 1;
    return NULL;
  }
  return f;
}

#endif
