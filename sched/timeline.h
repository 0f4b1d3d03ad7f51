/* timeline.h — a rank's step timeline as Chrome trace JSON (Perfetto, chrome://tracing):
 * complete ("X") events buffered in memory and written to the file, which stays valid JSON. */
#ifndef LOOM_TIMELINE_H
#define LOOM_TIMELINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "loom_core.h"

#ifdef __cplusplus
extern "C" {
#endif

// Track (Chrome "tid") numbering: one track per lane, more where events of a lane overlap.
#define LOOM_TL_TID_COMPUTE 1    // the compute lane
#define LOOM_TL_TID_COMM    1001 // comm lane: 1001 + slot (requests in flight together)
#define LOOM_TL_TID_WORKER  2001 // worker lane: 2001 + worker thread index
#define LOOM_TL_TID_GPU     3001 // GPU time of CUDA lanes: 3001 compute stream, 3002 + k worker k

struct loom_timeline;

// Expand %r in pattern with rank into out (len bytes). Returns -1 when it does not fit.
int loom_timeline_path(const char *pattern, int rank, char *out, size_t len);

// Create the file for pattern (%r = rank) and write the process name. Times passed later are
// monotonic nanoseconds; origin_ns becomes ts 0. ctx (may be NULL) receives errors. per_rank:
// the pattern is LOOM_TIMELINE's, and without %r in a job of several processes the rank goes
// before its extension (a program's own path is taken as it is).
loom_status_t loom_timeline_open(loom_ctx_t *ctx, const char *pattern, int rank, int64_t origin_ns,
                                 int per_rank, struct loom_timeline **tl);
// Record one complete event. name must stay valid until the next flush (the scheduler's task
// names live as long as the timeline). cat is "compute", "comm" or "worker". Writes the buffer
// out when it is full; a write failure is logged once and turns the timeline off.
void loom_timeline_event(struct loom_timeline *tl, const char *name, const char *cat, int tid,
                         int64_t t0_ns, int64_t t1_ns, size_t bytes, int64_t step);
// Write the buffered events; the file is then complete JSON. Event and flush may come from
// different threads (a lock per timeline guards the buffer and the file).
loom_status_t loom_timeline_flush(struct loom_timeline *tl);
// Flush, close and free (NULL is fine). Returns the flush status.
loom_status_t loom_timeline_close(struct loom_timeline *tl);
// The file's path (after %r expansion).
const char *loom_timeline_file(const struct loom_timeline *tl);

// Write s as the body of a JSON string (without the quotes): quote, backslash and control
// characters escaped, invalid UTF-8 replaced by U+FFFD.
void loom_json_escape(FILE *out, const char *s);

#ifdef __cplusplus
}
#endif
#endif
