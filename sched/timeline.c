/* timeline.c — writes a rank's scheduler events as Chrome trace JSON: events are buffered and
 * appended before a closing "]}" that every flush rewrites, so the file is valid after a flush. */
#include "config.h"

#include "timeline.h"

#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "abort_hooks.h"
#include "error.h"
#include "log.h"

#define TL_BUFFER_EVENTS 65536 // events kept in memory before they are written out
#define TL_MAX_TRACKS    4096  // tracks named in the metadata (more are left unnamed)
#define TL_PATH_MAX      4096

struct tl_event {
  const char *name, *cat;
  int tid;
  int64_t t0, t1; // ns
  size_t bytes;
  int64_t step;
};

struct loom_timeline {
  // Guards the buffer and the file: loom_sched_timeline_flush may come from a worker task while
  // the compute lane records events.
  pthread_mutex_t mu;
  loom_ctx_t *ctx;
  FILE *f;
  char path[TL_PATH_MAX];
  int rank;
  int64_t origin_ns;
  struct tl_event *ev; // (TL_BUFFER_EVENTS)
  int nev;
  long trailer_pos; // where the closing "]}" starts: the next write goes there
  int broken;       // a write failed: record nothing more
  int named[TL_MAX_TRACKS];
  int nnamed;
  dev_t dev; // the file's identity, for the list of open timelines
  ino_t ino;
  struct loom_timeline *next_open;
};

// The timelines open in this process: two schedulers writing one file would each rewrite it at
// their own offsets (invalid JSON, events lost), so a second one is given another file.
static pthread_mutex_t open_mu = PTHREAD_MUTEX_INITIALIZER;
static struct loom_timeline *open_list;

// 1 when path names a file an open timeline of this process writes (call under open_mu).
static int path_is_open(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    return 0;
  }
  for (const struct loom_timeline *o = open_list; o; o = o->next_open) {
    if (o->dev == sb.st_dev && o->ino == sb.st_ino) {
      return 1;
    }
  }
  return 0;
}

// ---- JSON text -------------------------------------------------------------------------------

// Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes there are not one.
static int utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  int n;
  unsigned min;
  if (c < 0x80) {
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, min = 0x80, c &= 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, min = 0x800, c &= 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, min = 0x10000, c &= 0x07;
  } else {
    return 0;
  }
  for (int i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) { // also stops at the terminating NUL
      return 0;
    }
    c = (c << 6) | (s[i] & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
    return 0;
  }
  return n;
}

void loom_json_escape(FILE *out, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned c = *p;
    if (c == '"' || c == '\\') {
      fputc('\\', out);
      fputc((int)c, out);
      p++;
    } else if (c == '\n') {
      fputs("\\n", out), p++;
    } else if (c == '\t') {
      fputs("\\t", out), p++;
    } else if (c == '\r') {
      fputs("\\r", out), p++;
    } else if (c < 0x20 || c == 0x7F) {
      fprintf(out, "\\u%04x", c), p++;
    } else {
      int n = utf8_len(p);
      if (n == 0) {
        fputs("\\ufffd", out), p++;
      } else {
        fwrite(p, 1, (size_t)n, out), p += n;
      }
    }
  }
}

// ---- the file --------------------------------------------------------------------------------

int loom_timeline_path(const char *pattern, int rank, char *out, size_t len) {
  size_t o = 0;
  for (const char *p = pattern; *p; p++) {
    char piece[32];
    const char *add = piece;
    if (p[0] == '%' && p[1] == 'r') {
      snprintf(piece, sizeof piece, "%d", rank);
      p++;
    } else {
      piece[0] = *p, piece[1] = '\0';
    }
    size_t n = strlen(add);
    if (o + n + 1 > len) {
      return -1;
    }
    memcpy(out + o, add, n);
    o += n;
  }
  if (len == 0) {
    return -1;
  }
  out[o] = '\0';
  return 0;
}

static void track_name(int tid, char *buf, size_t len) {
  if (tid >= LOOM_TL_TID_GPU) {
    if (tid == LOOM_TL_TID_GPU) {
      snprintf(buf, len, "gpu compute stream");
    } else {
      snprintf(buf, len, "gpu worker stream %d", tid - LOOM_TL_TID_GPU);
    }
    return;
  }
  const char *lane = tid >= LOOM_TL_TID_WORKER ? "worker"
                     : tid >= LOOM_TL_TID_COMM ? "comm"
                                               : "compute";
  int k = tid >= LOOM_TL_TID_WORKER ? tid - LOOM_TL_TID_WORKER
          : tid >= LOOM_TL_TID_COMM ? tid - LOOM_TL_TID_COMM
                                    : 0;
  if (k > 0) {
    snprintf(buf, len, "%s %d", lane, k + 1);
  } else {
    snprintf(buf, len, "%s", lane);
  }
}

// Write the thread_name and thread_sort_index metadata the first time a track appears.
static void name_track(struct loom_timeline *tl, int tid) {
  for (int i = 0; i < tl->nnamed; i++) {
    if (tl->named[i] == tid) {
      return;
    }
  }
  if (tl->nnamed == TL_MAX_TRACKS) {
    return;
  }
  tl->named[tl->nnamed++] = tid;
  char name[32];
  track_name(tid, name, sizeof name);
  fprintf(
      tl->f,
      ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
      tl->rank, tid, name);
  fprintf(tl->f,
          ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
          "\"args\":{\"sort_index\":%d}}",
          tl->rank, tid, tid);
}

// Write the trailer at the current position, remember where it starts, and push it all out.
static loom_status_t write_trailer(struct loom_timeline *tl) {
  loom_status_t status = LOOM_OK;
  tl->trailer_pos = ftell(tl->f);
  fputs("\n]}\n", tl->f);
  LOOM_CHECK_SYS(tl->ctx, tl->trailer_pos >= 0 && !ferror(tl->f) && fflush(tl->f) == 0, tl->path);
  return LOOM_OK;
fail:
  tl->broken = 1;
  return status;
}

// Take tl off the list of open timelines (a no-op when it is not on it).
static void forget_open(struct loom_timeline *tl) {
  pthread_mutex_lock(&open_mu);
  for (struct loom_timeline **o = &open_list; *o; o = &(*o)->next_open) {
    if (*o == tl) {
      *o = tl->next_open;
      break;
    }
  }
  pthread_mutex_unlock(&open_mu);
}

static loom_status_t flush_locked(struct loom_timeline *tl);

// Take mu within about 200 ms (an abort must not wait for a thread that holds it for good): 1
// when taken.
static int lock_briefly(pthread_mutex_t *mu) {
  for (int i = 0; i < 200; i++) {
    if (pthread_mutex_trylock(mu) == 0) {
      return 1;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

// The abort hook (loom_abort, LOOM_TIMEOUT): write out every open timeline of this process, so
// that the trace of a job that hung or failed holds its events up to the end, not only those of
// its last full buffer. A timeline whose lock another thread keeps is left as it was.
static void flush_open_timelines(void) {
  if (!lock_briefly(&open_mu)) {
    return;
  }
  for (struct loom_timeline *tl = open_list; tl; tl = tl->next_open) {
    if (lock_briefly(&tl->mu)) {
      (void)flush_locked(tl);
      pthread_mutex_unlock(&tl->mu);
    }
  }
  pthread_mutex_unlock(&open_mu);
}

loom_status_t loom_timeline_open(loom_ctx_t *ctx, const char *pattern, int rank, int64_t origin_ns,
                                 int per_rank_default, struct loom_timeline **out) {
  loom_status_t status = LOOM_OK;
  struct loom_timeline *tl = NULL;
  int locked = 0; // open_mu held
  *out = NULL;
  tl = calloc(1, sizeof *tl);
  LOOM_CHECK_SYS(ctx, tl != NULL, "calloc(timeline)");
  pthread_mutex_init(&tl->mu, NULL);
  tl->ctx = ctx;
  tl->rank = rank;
  tl->origin_ns = origin_ns;
  // Ranks must not share one file (the last to close would keep only its events, as invalid
  // JSON): without %r, with more than one process, each writes NAME.RANK.EXT.
  int np = 1, mpi_up = 0;
  MPI_Initialized(&mpi_up);
  if (mpi_up) {
    MPI_Comm_size(MPI_COMM_WORLD, &np);
  }
  char per_rank[1100];
  if (per_rank_default && np > 1 && !strstr(pattern, "%r")) {
    if (strlen(pattern) >= 1000) {
      status = loom_error(ctx, LOOM_ERR_INVALID_ARG, "LOOM_TIMELINE path '%.200s...' is too long",
                          pattern);
      goto fail;
    }
    const char *slash = strrchr(pattern, '/'), *dot = strrchr(pattern, '.');
    int at = dot && dot > (slash ? slash : pattern) ? (int)(dot - pattern) : (int)strlen(pattern);
    snprintf(per_rank, sizeof per_rank, "%.*s.%%r%s", at, pattern, pattern + at);
    if (rank == 0) {
      LOOM_WARN(LOOM_SUB_SCHED,
                "LOOM_TIMELINE=%s has no %%r: with %d ranks each writes its own file, %s with "
                "%%r the rank (merge them with loom_timeline_merge)",
                pattern, np, per_rank);
    }
    pattern = per_rank;
  }
  if (loom_timeline_path(pattern, rank, tl->path, sizeof tl->path) != 0) {
    status = loom_error(ctx, LOOM_ERR_INVALID_ARG, "LOOM_TIMELINE path '%.200s...' is too long",
                        pattern);
    goto fail;
  }
  tl->ev = malloc(TL_BUFFER_EVENTS * sizeof *tl->ev);
  LOOM_CHECK_SYS(ctx, tl->ev != NULL, "malloc(timeline buffer)");
  pthread_mutex_lock(&open_mu);
  locked = 1;
  if (path_is_open(tl->path)) {
    // Another scheduler of this process writes that file. A program's own path is its choice
    // to correct; LOOM_TIMELINE (which overrides every scheduler's path) gets NAME.sK.EXT.
    if (!per_rank_default) {
      status = loom_error(ctx, LOOM_ERR_INVALID_ARG,
                          "the timeline file '%s' is written by another loom_sched of this "
                          "process: give each scheduler its own loom_sched_opts_t.timeline (or "
                          "destroy the first one before creating the next)",
                          tl->path);
      goto fail;
    }
    char first[TL_PATH_MAX];
    snprintf(first, sizeof first, "%s", tl->path);
    const char *slash = strrchr(first, '/'), *dot = strrchr(first, '.');
    int at = dot && dot > (slash ? slash : first) ? (int)(dot - first) : (int)strlen(first);
    for (int k = 1; path_is_open(tl->path); k++) {
      if (snprintf(tl->path, sizeof tl->path, "%.*s.s%d%s", at, first, k, first + at) >=
          (int)sizeof tl->path) {
        status = loom_error(ctx, LOOM_ERR_INVALID_ARG, "LOOM_TIMELINE path '%.200s...' is too long",
                            first);
        goto fail;
      }
    }
    LOOM_WARN(LOOM_SUB_SCHED,
              "LOOM_TIMELINE: %s is written by another scheduler of this process; this one "
              "writes %s",
              first, tl->path);
  }
  struct stat sb;
  if (stat(tl->path, &sb) == 0 && (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode))) {
    // Opening a FIFO for writing waits for a reader, and the file is rewritten in place.
    status = loom_error(ctx, LOOM_ERR_INVALID_ARG,
                        "the timeline path '%s' (LOOM_TIMELINE) is a FIFO or socket: give the "
                        "path of a regular file (loom rewrites its end at every flush)",
                        tl->path);
    goto fail;
  }
  tl->f = fopen(tl->path, "w");
  if (!tl->f) {
    int e = errno;
    status = loom_error(ctx, LOOM_ERR_SYSTEM,
                        "cannot create the timeline file '%s' (LOOM_TIMELINE): %s; give a path in "
                        "an existing, writable directory",
                        tl->path, strerror(e));
    goto fail;
  }
  if (fstat(fileno(tl->f), &sb) == 0 && S_ISREG(sb.st_mode)) { // (/dev/null can be shared)
    tl->dev = sb.st_dev, tl->ino = sb.st_ino;
    tl->next_open = open_list;
    open_list = tl;
    loom_abort_hook_add(flush_open_timelines); // a job that aborts keeps what was recorded
  }
  pthread_mutex_unlock(&open_mu);
  locked = 0;
  fprintf(tl->f,
          "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"name\":\"rank %d\"}}",
          rank, rank);
  fprintf(tl->f,
          ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"sort_index\":%d}}",
          rank, rank);
  LOOM_CHECK(write_trailer(tl));
  LOOM_INFO(LOOM_SUB_SCHED, "timeline: writing %s", tl->path);
  *out = tl;
  return LOOM_OK;
fail:
  if (locked) {
    pthread_mutex_unlock(&open_mu);
  }
  if (tl && tl->f) {
    forget_open(tl);
    fclose(tl->f);
  }
  if (tl) {
    free(tl->ev);
    pthread_mutex_destroy(&tl->mu);
  }
  free(tl);
  return status;
}

// loom_timeline_flush with tl->mu held.
static loom_status_t flush_locked(struct loom_timeline *tl) {
  loom_status_t status = LOOM_OK;
  if (tl->broken) {
    return loom_error(tl->ctx, LOOM_ERR_SYSTEM, "timeline %s: an earlier write failed", tl->path);
  }
  if (tl->nev == 0) {
    return LOOM_OK;
  }
  LOOM_CHECK_SYS(tl->ctx, fseek(tl->f, tl->trailer_pos, SEEK_SET) == 0, tl->path);
  for (int i = 0; i < tl->nev; i++) {
    const struct tl_event *e = &tl->ev[i];
    name_track(tl, e->tid);
    fputs(",\n{\"name\":\"", tl->f);
    loom_json_escape(tl->f, e->name);
    fprintf(tl->f,
            "\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"bytes\":%zu,\"step\":%lld}}",
            e->cat, (double)(e->t0 - tl->origin_ns) / 1e3, (double)(e->t1 - e->t0) / 1e3, tl->rank,
            e->tid, e->bytes, (long long)e->step);
  }
  tl->nev = 0;
  return write_trailer(tl);
fail:
  tl->broken = 1;
  return status;
}

loom_status_t loom_timeline_flush(struct loom_timeline *tl) {
  if (!tl) {
    return LOOM_OK;
  }
  pthread_mutex_lock(&tl->mu);
  loom_status_t status = flush_locked(tl);
  pthread_mutex_unlock(&tl->mu);
  return status;
}

void loom_timeline_event(struct loom_timeline *tl, const char *name, const char *cat, int tid,
                         int64_t t0_ns, int64_t t1_ns, size_t bytes, int64_t step) {
  if (!tl) {
    return;
  }
  pthread_mutex_lock(&tl->mu);
  if (tl->broken) {
    pthread_mutex_unlock(&tl->mu);
    return;
  }
  if (tl->nev == TL_BUFFER_EVENTS && flush_locked(tl) != LOOM_OK) {
    LOOM_WARN(LOOM_SUB_SCHED, "timeline %s: writing failed (%s); recording stops", tl->path,
              tl->ctx ? loom_last_error(tl->ctx) : loom_last_error(NULL));
    pthread_mutex_unlock(&tl->mu);
    return;
  }
  tl->ev[tl->nev++] = (struct tl_event){name, cat, tid, t0_ns, t1_ns, bytes, step};
  pthread_mutex_unlock(&tl->mu);
}

loom_status_t loom_timeline_close(struct loom_timeline *tl) {
  if (!tl) {
    return LOOM_OK;
  }
  loom_status_t status = loom_timeline_flush(tl);
  forget_open(tl);
  if (fclose(tl->f) != 0 && status == LOOM_OK) {
    int e = errno;
    status = loom_error(tl->ctx, LOOM_ERR_SYSTEM, "closing the timeline %s failed: %s", tl->path,
                        strerror(e));
  }
  if (status == LOOM_OK) {
    LOOM_INFO(LOOM_SUB_SCHED, "timeline: wrote %s", tl->path);
  }
  free(tl->ev);
  pthread_mutex_destroy(&tl->mu);
  free(tl);
  return status;
}

const char *loom_timeline_file(const struct loom_timeline *tl) {
  return tl->path;
}
