/* log.c — subsystem logging to stderr or LOOM_DEBUG_FILE (%h host, %p pid), one line per
 * message prefixed "host:pid:tid [rank] LOOM LEVEL SUBSYS"; WARN lines carry file:line. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"

const char *const loom_log_subsys_names[LOOM_LOG_NSUBSYS] = {
    "INIT", "TOPO", "ENV", "MEM", "COLL", "COMPRESS", "MOE", "ATTN", "SCHED", "COMPUTE", "CUDA"};

int loom_log_level = LOOM_LOG_WARN;
unsigned loom_log_mask = LOOM_SUB_ALL;

static FILE *log_file; // NULL: stderr
static int log_rank = -1;
static char log_host[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *level_name(int level) {
  return level == LOOM_LOG_WARN ? "WARN" : level == LOOM_LOG_INFO ? "INFO" : "TRACE";
}

static const char *subsys_name(unsigned subsys) {
  for (int i = 0; i < LOOM_LOG_NSUBSYS; i++) {
    if (subsys == (1u << i)) {
      return loom_log_subsys_names[i];
    }
  }
  return "ALL";
}

// Expand %h (host) and %p (pid) in pattern; %% is a literal percent.
static void expand_pattern(const char *pattern, char *out, size_t len) {
  size_t o = 0;
  for (const char *p = pattern; *p && o + 1 < len; p++) {
    if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p' || p[1] == '%')) {
      char piece[64];
      if (p[1] == 'h') {
        snprintf(piece, sizeof piece, "%s", log_host);
      } else if (p[1] == 'p') {
        snprintf(piece, sizeof piece, "%ld", (long)getpid());
      } else {
        snprintf(piece, sizeof piece, "%%");
      }
      int n = snprintf(out + o, len - o, "%s", piece);
      o = (n > 0 && (size_t)n < len - o) ? o + (size_t)n : len - 1;
      p++;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = '\0';
}

int loom_log_configure(int level, unsigned mask, const char *file_pattern) {
  if (gethostname(log_host, sizeof log_host) != 0) {
    snprintf(log_host, sizeof log_host, "unknown");
  }
  log_host[sizeof log_host - 1] = '\0';
  pthread_mutex_lock(&log_lock);
  if (log_file) {
    fclose(log_file);
    log_file = NULL;
  }
  int rc = 0;
  if (file_pattern && file_pattern[0]) {
    char path[4096];
    expand_pattern(file_pattern, path, sizeof path);
    log_file = fopen(path, "a");
    if (!log_file) {
      rc = -1;
    } else {
      setvbuf(log_file, NULL, _IOLBF, 0);
    }
  }
  loom_log_level = level;
  loom_log_mask = mask;
  pthread_mutex_unlock(&log_lock);
  return rc;
}

void loom_log_set_rank(int rank) {
  log_rank = rank;
}

void loom_log_close(void) {
  pthread_mutex_lock(&log_lock);
  if (log_file) {
    fclose(log_file);
    log_file = NULL;
  }
  pthread_mutex_unlock(&log_lock);
}

void loom_log_write(int level, unsigned subsys, const char *file, int line, const char *fmt, ...) {
  // Warnings always print; the subsystem mask filters INFO and TRACE.
  if (level > loom_log_level || (level > LOOM_LOG_WARN && !(loom_log_mask & subsys))) {
    return;
  }
  if (!log_host[0] && gethostname(log_host, sizeof log_host) != 0) {
    snprintf(log_host, sizeof log_host, "unknown");
  }
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char where[160] = "";
  if (level == LOOM_LOG_WARN && file) {
    const char *base = strrchr(file, '/');
    snprintf(where, sizeof where, " %s:%d", base ? base + 1 : file, line);
  }
  char rank[16] = "?";
  if (log_rank >= 0) {
    snprintf(rank, sizeof rank, "%d", log_rank);
  }
  pthread_mutex_lock(&log_lock);
  FILE *out = log_file ? log_file : stderr;
  fprintf(out, "%s:%ld:%ld [%s] LOOM %s %s%s %s\n", log_host, (long)getpid(),
          (long)syscall(SYS_gettid), rank, level_name(level), subsys_name(subsys), where, msg);
  fflush(out);
  pthread_mutex_unlock(&log_lock);
}
