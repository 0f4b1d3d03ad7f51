/* cache.c — loom's measurement cache files (codec costs, MoE tunings): one file per kind, host
 * and build under $LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "loom_version.h"
#include "sched_internal.h"

#define BUILD_ID LOOM_VERSION_STRING "-" __DATE__ "-" __TIME__

int loom_cache_file(char *path, size_t cap, const char *kind) {
  const char *dir = getenv("LOOM_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
             *home = getenv("HOME");
  char base[512], host[128] = "host";
  const char *from = dir && *dir ? "LOOM_CACHE_DIR" : xdg && *xdg ? "XDG_CACHE_HOME" : "HOME";
  size_t n0;
  if (dir && *dir) {
    n0 = (size_t)snprintf(base, sizeof base, "%s", dir);
  } else if (xdg && *xdg) {
    n0 = (size_t)snprintf(base, sizeof base, "%s/loom", xdg);
  } else if (home && *home) {
    n0 = (size_t)snprintf(base, sizeof base, "%s/.cache/loom", home);
  } else {
    return -1;
  }
  if (n0 >= sizeof base - 16) { // cut short, it would name another folder
    static int warned = 0;
    if (!warned++) {
      LOOM_WARN(LOOM_SUB_COMPRESS,
                "the cache folder from %s is longer than %zu characters: measurements are not "
                "cached (each run measures again); set LOOM_CACHE_DIR to a shorter path",
                from, sizeof base - 17);
    }
    return -1;
  }
  gethostname(host, sizeof host - 1);
  for (char *c = host; *c; c++) { // a host name is a file name component here
    *c = (*c == '/' || *c == ' ') ? '_' : *c;
  }
  int n = snprintf(path, cap, "%s/%s-%s-%s.txt", base, kind, host, BUILD_ID);
  if (n <= 0 || (size_t)n >= cap) {
    return -1;
  }
  for (char *c = path + strlen(base) + 1; *c; c++) { // __DATE__ and __TIME__ hold ' ' and ':'
    *c = (*c == ' ' || *c == ':') ? '_' : *c;
  }
  return 0;
}

void loom_cache_append(const char *kind, const char *line) {
  char path[1024];
  if (loom_cache_file(path, sizeof path, kind) != 0) {
    return;
  }
  char *slash = strrchr(path, '/');
  *slash = 0; // create the directory (and its parent ~/.cache) if missing; failures are harmless
  char *up = strrchr(path, '/');
  if (up) {
    *up = 0;
    mkdir(path, 0755);
    *up = '/';
  }
  mkdir(path, 0755);
  *slash = '/';
  FILE *f = fopen(path, "a");
  int ok = f && fputs(line, f) >= 0;
  ok = (f ? fclose(f) == 0 : 0) && ok;
  static int warned = 0; // once per process: the next runs measure again, nothing else is lost
  if (!ok && !warned++) {
    LOOM_WARN(LOOM_SUB_COMPRESS,
              "cannot write the measurement cache %s (%s): the next runs measure again; set "
              "LOOM_CACHE_DIR to a writable folder to keep the measurements",
              path, strerror(errno));
  }
}

FILE *loom_cache_open(const char *kind) {
  char path[1024];
  if (loom_cache_file(path, sizeof path, kind) != 0) {
    return NULL;
  }
  int not_regular = 0;
  FILE *f = loom_fopen_regular(path, "r", LOOM_CACHE_MAX_BYTES, NULL, &not_regular);
  if (f || !not_regular) {
    return f; // (a cache that cannot be opened is absent, as before the first measurement)
  }
  static int warned = 0; // once per process: the runs measure again, nothing else is lost
  if (!warned++) {
    LOOM_WARN(LOOM_SUB_COMPRESS,
              "the measurement cache %s is not a regular file of at most %llu bytes: it is "
              "ignored (each run measures again); remove it, or set LOOM_CACHE_DIR to another "
              "folder",
              path, (unsigned long long)LOOM_CACHE_MAX_BYTES);
  }
  return NULL;
}

int loom_cache_line(FILE *f, char *line, int cap) {
  int skip = 0; // in the rest of a line longer than cap - 1 bytes
  while (fgets(line, cap, f)) {
    const int whole = strchr(line, '\n') != NULL;
    if (whole && !skip) {
      return 1;
    }
    skip = !whole;
  }
  return 0;
}
