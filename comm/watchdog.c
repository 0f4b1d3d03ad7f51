/* watchdog.c — LOOM_TIMEOUT: an operation that waits too long aborts the job with one message
 * naming the ranks that did not arrive (LOOM_STALL_WARN warns before); LOOM_CHECK_CONSISTENCY:
 * ranks compare each collective. */
#include "config.h"
#include "comm_internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "abort_hooks.h"
#include "ctx.h"
#include "error.h"
#include "log.h"

// How it works. Every member of a group counts the collectives it enters on the group and
// writes that count, with the operation and tensor name, into its slot of the group's watchdog
// window (an MPI window made with the group, runtime/groups.c). A wait loop that passes its
// deadline reads every member's slot with passive-target MPI_Rget: a member whose count is below
// this operation's number has not arrived. The first member to time out claims the report
// (an atomic swap on group rank 0's slot) and prints it; the others wait quietly for the abort.
// Reading a slot needs no action from its owner (shared memory or RDMA), so a rank stuck in a
// computation, or waiting somewhere else, is still named. LOOM_STALL_WARN reads the same slots
// earlier, every so many seconds, and the lowest member that arrived warns without aborting.

#define CLAIM_WAIT_NS   ((int64_t)2000000000)  // at most this long for the claim and the reads
#define REPORT_GRACE_NS ((int64_t)30000000000) // a member that lost the claim waits this long
#define STALL_READ_NS   ((int64_t)1000000000)  // a stall warning's reads wait at most this long

static const char *const op_names[LOOM_OPK_COUNT] = {
    [LOOM_OPK_NONE] = "operation",
    [LOOM_OPK_ALLREDUCE] = "allreduce",
    [LOOM_OPK_REDUCE_SCATTER] = "reduce_scatter",
    [LOOM_OPK_ALLGATHER] = "allgather",
    [LOOM_OPK_ALLGATHERV] = "allgatherv",
    [LOOM_OPK_BROADCAST] = "broadcast",
    [LOOM_OPK_ALLTOALL] = "alltoall",
    [LOOM_OPK_ALLTOALLV] = "alltoallv",
    [LOOM_OPK_COMPRESSED_ALLREDUCE] = "compressed_allreduce",
    [LOOM_OPK_SEND] = "send",
    [LOOM_OPK_RECV] = "recv",
    [LOOM_OPK_MOE_FORWARD] = "moe_forward",
    [LOOM_OPK_MOE_BACKWARD] = "moe_backward",
    [LOOM_OPK_ATTN_SHIP] = "attn_ship",
    [LOOM_OPK_ATTN_COMPUTE] = "attn_compute",
    [LOOM_OPK_ATTN_FINISH] = "attn_finish",
    [LOOM_OPK_ATTN_BACKWARD] = "attn_backward",
    [LOOM_OPK_BARRIER] = "barrier",
};

static const char *op_name(int kind) {
  return kind >= 0 && kind < LOOM_OPK_COUNT ? op_names[kind] : "operation";
}

// ---- descriptors --------------------------------------------------------------------------------

uint64_t loom_watch_hash(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  if (h == 0) {
    h = 1469598103934665603ull;
  }
  for (size_t i = 0; i < n; i++) {
    h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

void loom_op_desc_set(struct loom_op_desc *d, enum loom_op_kind kind, const char *name, int dtype,
                      int64_t count, int redop, int root, uint64_t extra) {
  memset(d, 0, sizeof *d);
  d->kind = kind;
  d->dtype = dtype;
  d->count = count;
  d->redop = redop;
  d->root = root;
  d->group_kind = -1;
  d->extra = extra;
  name = name ? name : "";
  size_t n = strnlen(name, LOOM_NAME_MAX); // (a tensor name: the field's size at most)
  d->name_hash = loom_watch_hash(0, name, n);
  memcpy(d->name, name, n < sizeof d->name ? n : sizeof d->name - 1); // zero-padded by memset
}

// "allreduce('grad.h0', 1024 f32, sum)".
static void format_desc(const struct loom_op_desc *d, char *out, size_t len) {
  char count[48] = "", extra[48] = "";
  if (d->count >= 0 && d->dtype >= 0) {
    snprintf(count, sizeof count, ", %lld %s", (long long)d->count,
             loom_dtype_name((loom_dtype_t)d->dtype));
  } else if (d->dtype >= 0) {
    snprintf(count, sizeof count, ", %s", loom_dtype_name((loom_dtype_t)d->dtype));
  }
  if (d->redop >= 0) {
    snprintf(extra, sizeof extra, ", %s", loom_redop_name((loom_redop_t)d->redop));
  } else if (d->root >= 0 && (d->kind == LOOM_OPK_SEND || d->kind == LOOM_OPK_RECV)) {
    snprintf(extra, sizeof extra, ", %s rank %d", d->kind == LOOM_OPK_SEND ? "to" : "from",
             d->root);
  } else if (d->root >= 0) {
    snprintf(extra, sizeof extra, ", root %d", d->root);
  }
  if (d->kind == LOOM_OPK_BARRIER) { // no tensor: "barrier()"
    snprintf(out, len, "%s()", op_name(d->kind));
    return;
  }
  snprintf(out, len, "%s('%s'%s%s)", op_name(d->kind), d->name, count, extra);
}

// "group dp (4 ranks)".
static void format_group(const loom_group_t *g, char *out, size_t len) {
  snprintf(out, len, "group %s (%d rank%s)", loom_group_kind_name(g->kind), g->size,
           g->size == 1 ? "" : "s");
}

// ---- entering and waiting -----------------------------------------------------------------------

int64_t loom_watch_now_ns(void) {
  // The coarse clock (a few ms of resolution, read without a system call or a TSC read) is
  // plenty for timeouts of seconds, and costs less on every call.
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// When loom_watch_check looks closer: the next stall warning or the deadline.
static int64_t next_due(const struct loom_watch *w) {
  return w->warn_ns != 0 && w->warn_ns < w->deadline_ns ? w->warn_ns : w->deadline_ns;
}

static int stall_warn(struct loom_watch *w, int64_t now);

void loom_watch_enter(struct loom_watch *w, const loom_group_t *g, const struct loom_op_desc *d,
                      int counted) {
  memset(w, 0, sizeof *w);
  w->g = g;
  w->d = *d;
  w->d.group_kind = g->kind;
  w->d.group_size = g->size;
  w->start_ns = loom_watch_now_ns();
  if (g->timeout > 0) {
    w->deadline_ns = w->start_ns + (int64_t)g->timeout * 1000000000;
    if (g->stall_warn > 0 && g->stall_warn < g->timeout) {
      w->warn_ns = w->start_ns + (int64_t)g->stall_warn * 1000000000;
    }
  }
  w->next_ns = next_due(w);
  struct loom_watch_slot *slot = g->watch_slot;
  if (counted && slot) {
    // The name first, then the count: a reader may see the new name with the old count, never
    // a count whose operation it cannot name. (Fixed-size copies: this runs on every call.)
    _Static_assert(sizeof slot->name == sizeof d->name, "slot and descriptor names");
    strncpy(slot->op, op_name(d->kind), sizeof slot->op - 1);
    memcpy(slot->name, d->name, sizeof slot->name);
    w->seq = __atomic_add_fetch(&slot->seq, 1, __ATOMIC_RELEASE);
  }
}

void loom_watch_due(struct loom_watch *w) {
  const int64_t now = loom_watch_now_ns();
  if (now >= w->deadline_ns) {
    loom_watch_expired(w);
  }
  if (w->warn_ns != 0 && now >= w->warn_ns && stall_warn(w, now)) {
    const int64_t every = (int64_t)w->g->stall_warn * 1000000000;
    while (w->warn_ns <= now) {
      w->warn_ns += every;
    }
  }
  w->next_ns = next_due(w);
}

void loom_watch_test(struct loom_watch *w) {
  if (w->deadline_ns == 0) {
    return;
  }
  const int64_t now = loom_watch_now_ns();
  const int64_t gap = now - (w->last_test_ns ? w->last_test_ns : w->start_ns);
  w->last_test_ns = now;
  if (now < w->next_ns) {
    return;
  }
  if (gap > 1000000000) {
    // The first test after a long computation: MPI may not have moved the operation meanwhile.
    // The deadline is extended once; a stall warning waits for a test that follows another.
    if (now >= w->deadline_ns && !w->extended) {
      const int64_t grace = (int64_t)(w->g->timeout < 10 ? w->g->timeout : 10) * 1000000000;
      w->extended = 1;
      w->deadline_ns = now + grace;
      w->next_ns = next_due(w);
      return;
    }
    if (now < w->deadline_ns) {
      return;
    }
  }
  loom_watch_due(w);
}

int loom_watch_waitall(struct loom_watch *w, int n, MPI_Request *reqs) {
  if (!w || w->deadline_ns == 0) {
    return MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
  }
  for (;;) {
    int flag = 0;
    int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || flag) {
      return rc;
    }
    loom_watch_check(w);
  }
}

int loom_watch_waitany(struct loom_watch *w, int n, MPI_Request *reqs, int *index) {
  if (!w || w->deadline_ns == 0) {
    return MPI_Waitany(n, reqs, index, MPI_STATUS_IGNORE);
  }
  for (;;) {
    int flag = 0;
    int rc = MPI_Testany(n, reqs, index, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) {
      return rc;
    }
    loom_watch_check(w);
  }
}

int loom_watch_probe(struct loom_watch *w, int source, int tag, MPI_Comm comm, MPI_Status *st) {
  if (!w || w->deadline_ns == 0) {
    return MPI_Probe(source, tag, comm, st);
  }
  for (;;) {
    int flag = 0;
    int rc = MPI_Iprobe(source, tag, comm, &flag, st);
    if (rc != MPI_SUCCESS || flag) {
      return rc;
    }
    loom_watch_check(w);
  }
}

// ---- the report ---------------------------------------------------------------------------------

// Poll req until it completes or the clock passes until; 1 when it completed.
static int wait_until(MPI_Request *req, int n, int64_t until) {
  for (;;) {
    int flag = 0;
    if (MPI_Testall(n, req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
      return 0;
    }
    if (flag) {
      return 1;
    }
    if (loom_watch_now_ns() >= until) {
      return 0;
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

// In a passive epoch on win: read every member's slot into slots (got[r] = 1 for those read),
// waiting for each until the clock passes until. Returns how many reads are still in flight
// (they may land in slots later).
static int read_slots(MPI_Win win, int np, struct loom_watch_slot *slots, int *got, int64_t until) {
  MPI_Request *reqs = calloc((size_t)np, sizeof *reqs);
  if (!reqs) {
    return 0;
  }
  for (int r = 0; r < np; r++) {
    reqs[r] = MPI_REQUEST_NULL;
    if (MPI_Rget(&slots[r], (int)sizeof slots[r], MPI_BYTE, r, 0, (int)sizeof slots[r], MPI_BYTE,
                 win, &reqs[r]) != MPI_SUCCESS) {
      reqs[r] = MPI_REQUEST_NULL;
    } else {
      got[r] = 1;
    }
  }
  int pending = 0;
  for (int r = 0; r < np; r++) { // one at a time: a member that does not answer is unknown
    if (got[r] && !wait_until(&reqs[r], 1, until)) {
      got[r] = 0;
      pending++;
    }
  }
  free(reqs);
  return pending;
}

// Claim the report on g (1: this rank reports; also when the claim cannot be made), then read
// every member's slot into slots (got[r] = 1 for those read). The passive epoch stays open: the
// job is about to abort.
static int claim_and_read(const loom_group_t *g, struct loom_watch_slot *slots, int *got) {
  MPI_Win win = g->watch_win;
  if (win == MPI_WIN_NULL || MPI_Win_lock_all(MPI_MODE_NOCHECK, win) != MPI_SUCCESS) {
    return 1;
  }
  const int64_t until = loom_watch_now_ns() + CLAIM_WAIT_NS;
  uint64_t one = 1, before = 0;
  MPI_Request req = MPI_REQUEST_NULL;
  int mine = 1;
  if (MPI_Rget_accumulate(&one, 1, MPI_UINT64_T, &before, 1, MPI_UINT64_T, 0,
                          (MPI_Aint)offsetof(struct loom_watch_slot, claim), 1, MPI_UINT64_T,
                          MPI_REPLACE, win, &req) == MPI_SUCCESS &&
      wait_until(&req, 1, until)) {
    mine = before == 0;
  }
  if (mine) {
    read_slots(win, g->size, slots, got, until);
  }
  return mine;
}

// printf to the end of out (len bytes in all); silently truncated.
static void append(char *out, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t len, const char *fmt, ...) {
  size_t used = strlen(out);
  if (used + 1 >= len) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + used, len - used, fmt, ap);
  va_end(ap);
}

// "op('name')", or "op()" for a call without a tensor (a barrier).
static void append_call(char *out, size_t len, const char *op, const char *name) {
  if (name[0]) {
    append(out, len, "%s('%s')", op, name);
  } else {
    append(out, len, "%s()", op);
  }
}

// Group rank r to a list ("0, 2" or, outside world, "0 (world 4), 1 (world 5)").
static void append_rank(char *out, size_t len, const loom_group_t *g, int r, int first) {
  append(out, len, "%s%d", first ? "" : ", ", r);
  if (g->kind != LOOM_GROUP_WORLD && g->world_ranks) {
    append(out, len, " (world %d)", g->world_ranks[r]);
  }
}

// What the members' slots say about w's operation.
struct arrivals {
  int n_in, n_out, n_unknown, n_other; // arrived, not arrived, not read, arrived in another call
  int n_refused;                       // not arrived, having refused a call since its last one
  int lowest_in;                       // the lowest group rank that arrived
};

// Append to msg "; arrived: ranks ...; not arrived: rank ... (last entered ...)", then the members
// whose slot was not read (got[r] == 0) and those that arrived in another call as the same
// operation. This rank counts as arrived (its slot is set so).
static struct arrivals describe_arrivals(const struct loom_watch *w, struct loom_watch_slot *slots,
                                         int *got, char *msg, size_t len) {
  const loom_group_t *g = w->g;
  const int np = g->size, me = g->rank;
  slots[me].seq = w->seq > slots[me].seq ? w->seq : slots[me].seq; // this rank is here
  got[me] = 1;
  struct arrivals a = {0, 0, 0, 0, 0, me};
  char in[1024] = "", out[2048] = "", unknown[512] = "", other[2048] = "";
  // Collectives name the same tensor on every rank; MoE and attention phases need not
  // (trainers and dedicated servers pass their own names): there only the operation counts.
  const int named = w->d.kind >= LOOM_OPK_ALLREDUCE && w->d.kind <= LOOM_OPK_COMPRESSED_ALLREDUCE;
  for (int r = 0; r < np; r++) {
    slots[r].op[sizeof slots[r].op - 1] = '\0'; // (read from the peers: terminated here)
    slots[r].name[sizeof slots[r].name - 1] = '\0';
    if (!got[r]) {
      append_rank(unknown, sizeof unknown, g, r, a.n_unknown++ == 0);
    } else if (slots[r].seq >= w->seq) {
      if (a.n_in == 0) {
        a.lowest_in = r;
      }
      append_rank(in, sizeof in, g, r, a.n_in++ == 0);
      // The same operation number, another call: the ranks took different paths.
      if (slots[r].seq == w->seq &&
          (strcmp(slots[r].op, op_name(w->d.kind)) != 0 ||
           (named && strncmp(slots[r].name, w->d.name, sizeof slots[r].name - 1) != 0))) {
        append_rank(other, sizeof other, g, r, a.n_other++ == 0);
        append(other, sizeof other, " in ");
        append_call(other, sizeof other, slots[r].op, slots[r].name);
      }
    } else {
      append_rank(out, sizeof out, g, r, a.n_out++ == 0);
      slots[r].refused_op[sizeof slots[r].refused_op - 1] = '\0';
      slots[r].refused_name[sizeof slots[r].refused_name - 1] = '\0';
      if (slots[r].refused_seq > slots[r].seq) {
        // It refused a call after its last one: most likely this one, with bad arguments.
        a.n_refused++;
        append(out, sizeof out, " (refused its call #%llu, ",
               (unsigned long long)slots[r].refused_seq);
        append_call(out, sizeof out, slots[r].refused_op, slots[r].refused_name);
        append(out, sizeof out, ": %s; its own error says why)",
               loom_strerror((loom_status_t)slots[r].refused_status));
      } else if (slots[r].seq == 0) {
        append(out, sizeof out, " (entered no operation on this group yet)");
      } else {
        append(out, sizeof out, " (last entered #%llu, ", (unsigned long long)slots[r].seq);
        append_call(out, sizeof out, slots[r].op, slots[r].name);
        append(out, sizeof out, ")");
      }
    }
  }
  append(msg, len, "; arrived: rank%s %s; not arrived: %s%s%s", a.n_in == 1 ? "" : "s", in,
         a.n_out == 0 ? "none" : "rank",
         a.n_out > 1    ? "s "
         : a.n_out == 1 ? " "
                        : "",
         out);
  if (a.n_unknown > 0) {
    append(msg, len, "; not readable: rank%s %s", a.n_unknown == 1 ? "" : "s", unknown);
  }
  if (a.n_other > 0) {
    append(msg, len, "; as their operation #%llu, rank%s %s", (unsigned long long)w->seq,
           a.n_other == 1 ? "" : "s", other);
  }
  return a;
}

// ---- the stall warning --------------------------------------------------------------------------

// One stall warning at a time in this process (two threads may wait on one group, and a passive
// epoch cannot be opened twice on a window). A read that never completed leaves its epoch open:
// then warnings stop (stall_stuck keeps the buffer the read may still land in).
static pthread_mutex_t stall_lock = PTHREAD_MUTEX_INITIALIZER;
static int stall_broken;
static struct loom_watch_slot *stall_stuck;

// LOOM_STALL_WARN: w has waited g->stall_warn seconds (or a multiple). Read the members' slots;
// the lowest member that arrived warns, naming those that did not (without a window: group rank
// 0; an operation that is not counted, send or recv: this rank). Returns 0 when another thread is
// warning (try again), 1 otherwise.
static int stall_warn(struct loom_watch *w, int64_t now) {
  if (pthread_mutex_trylock(&stall_lock) != 0) {
    return 0;
  }
  const loom_group_t *g = w->g;
  char what[160], group[64], msg[2048];
  format_desc(&w->d, what, sizeof what);
  format_group(g, group, sizeof group);
  snprintf(msg, sizeof msg, "LOOM_STALL_WARN: %s on %s has waited %.0f s", what, group,
           (double)(now - w->start_ns) / 1e9);
  int speak = g->rank == 0;
  struct loom_watch_slot *slots = NULL;
  int *got = NULL;
  if (w->seq == 0) {
    speak = 1; // only this rank knows
  } else if (g->watch_win == MPI_WIN_NULL || stall_broken) {
    append(msg, sizeof msg, "; the ranks that arrived are unknown (%s)",
           stall_broken ? "an earlier read did not complete" : "no watchdog window");
  } else if ((slots = calloc((size_t)g->size, sizeof *slots)) != NULL &&
             (got = calloc((size_t)g->size, sizeof *got)) != NULL &&
             MPI_Win_lock_all(MPI_MODE_NOCHECK, g->watch_win) == MPI_SUCCESS) {
    const int pending = read_slots(g->watch_win, g->size, slots, got, now + STALL_READ_NS);
    const struct arrivals a = describe_arrivals(w, slots, got, msg, sizeof msg);
    speak = a.lowest_in == g->rank;
    if (pending == 0) {
      MPI_Win_unlock_all(g->watch_win);
    } else {
      stall_broken = 1;
      stall_stuck = slots;
      slots = NULL;
    }
  }
  if (speak) {
    LOOM_WARN(LOOM_SUB_COLL,
              "%s. Still waiting: LOOM_TIMEOUT aborts the job after %d s (LOOM_STALL_WARN=%d: "
              "0 turns these warnings off)",
              msg, g->timeout, g->stall_warn);
  }
  free(slots);
  free(got);
  pthread_mutex_unlock(&stall_lock);
  return 1;
}

void loom_watch_expired(struct loom_watch *w) {
  const loom_group_t *g = w->g;
  const double waited = (double)(loom_watch_now_ns() - w->start_ns) / 1e9;
  loom_abort_hooks_run(); // every member that times out writes out its timelines first
  const int np = g->size, me = g->rank;
  int world = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  struct loom_watch_slot *slots = calloc((size_t)np, sizeof *slots);
  int *got = calloc((size_t)np, sizeof *got);
  int report = 1;
  if (slots && got) {
    report = claim_and_read(g, slots, got);
  }
  if (report && g->watch_win == MPI_WIN_NULL && me > 0) {
    // No window, no claim: the members that time out together report in rank order (the first
    // report aborts the job, usually before the next one is printed).
    const long ms = 500L * (me < 8 ? me : 8);
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (!report) {
    // Another member claimed the report: it prints it and aborts the job. Wait for that, then
    // abort anyway (with a short line) should it never come.
    const int64_t until = loom_watch_now_ns() + REPORT_GRACE_NS;
    while (loom_watch_now_ns() < until) {
      struct timespec ts = {0, 100000000};
      nanosleep(&ts, NULL);
    }
    fprintf(stderr, "loom: LOOM_TIMEOUT: world rank %d also timed out in operation #%llu on %s\n",
            world, (unsigned long long)w->seq, loom_group_kind_name(g->kind));
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    _exit(1);
  }
  char what[160], group[64], host[64] = "?";
  format_desc(&w->d, what, sizeof what);
  format_group(g, group, sizeof group);
  gethostname(host, sizeof host);
  host[sizeof host - 1] = '\0';
  // Line 1: what, where, how long, who is missing. Line 2: context and what to do.
  char msg[4096];
  snprintf(msg, sizeof msg, "loom: LOOM_TIMEOUT: %s on %s did not complete after %.1f s", what,
           group, waited);
  const char *advice = "";
  if (w->seq > 0 && slots && got && g->watch_win != MPI_WIN_NULL) {
    const struct arrivals a = describe_arrivals(w, slots, got, msg, sizeof msg);
    advice = a.n_refused > 0
                 ? " A missing rank refused its call (its arguments or memory, there only: its "
                   "own error message says which) and went on without it; every rank must make "
                   "the same calls (LOOM_CHECK_CONSISTENCY=1 turns a refusal into an error on "
                   "every rank instead of a wait)."
             : a.n_other > 0 && a.n_out == 0 && a.n_unknown == 0
                 ? " The ranks made different calls at the same point: one took another branch "
                   "(a different step count, save interval or flag; an error one rank handled "
                   "alone); every rank must make the same collective calls in the same order."
             : a.n_out == 0 && a.n_unknown == 0
                 ? " Every rank arrived: they called it with different arguments, a peer failed, "
                   "or messages stopped moving (LOOM_CHECK_CONSISTENCY=1 compares the calls)."
                 : " Find why the missing ranks skip this call or have not reached it (a branch, "
                   "an error they swallowed, a longer computation).";
  } else if (w->seq > 0) {
    append(msg, sizeof msg, "; the ranks that arrived are unknown (no watchdog window)");
  }
  append(msg, sizeof msg, "\n  ");
  if (w->seq > 0) {
    append(msg, sizeof msg, "It is operation #%llu of this rank on the group. ",
           (unsigned long long)w->seq);
  }
  append(msg, sizeof msg,
         "Reported by rank %d (world rank %d, host %s).%s Aborting the job; raise LOOM_TIMEOUT "
         "(now %d s) if the wait is legitimate, 0 disables the watchdog.",
         me, world, host, advice, g->timeout);
  fprintf(stderr, "%s\n", msg);
  fflush(stderr);
  LOOM_INFO(LOOM_SUB_COLL, "%s", msg); // into LOOM_DEBUG_FILE too, when it is set
  MPI_Abort(MPI_COMM_WORLD, 1);
  _exit(1);
}

// ---- consistency ----------------------------------------------------------------------------

// Wait for the check's own exchange under w, advancing every staged request meanwhile: a peer
// may need one of this rank's earlier operations to move before it reaches this call (ranks may
// wait for their requests in different orders).
static int wait_progressing(struct loom_watch *w, MPI_Request *req) {
  for (;;) {
    int flag = 0;
    int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || flag) {
      return rc;
    }
    loom_comm_progress();
    loom_watch_check(w);
  }
}

static int same(const struct loom_op_desc *a, const struct loom_op_desc *b) {
  return a->kind == b->kind && a->dtype == b->dtype && a->redop == b->redop && a->root == b->root &&
         a->group_kind == b->group_kind && a->group_size == b->group_size &&
         a->name_hash == b->name_hash && a->extra == b->extra &&
         (a->count < 0 || b->count < 0 || a->count == b->count);
}

// Why two descriptors that print alike differ.
static const char *hidden_difference(const struct loom_op_desc *a, const struct loom_op_desc *b) {
  if (a->group_kind != b->group_kind || a->group_size != b->group_size) {
    return " (on different groups)";
  }
  if (a->name_hash != b->name_hash) {
    return " (the tensor names differ after their first characters)";
  }
  if (a->extra != b->extra) {
    return a->kind == LOOM_OPK_COMPRESSED_ALLREDUCE
               ? " (with a different compressor, scheme or seed)"
               : " (with different per-rank counts)";
  }
  return "";
}

// Every member's descriptor of w's operation into all (w->g->size of them): an MPI code.
static int gather_descs(struct loom_watch *w, struct loom_op_desc *all) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Iallgather(&w->d, (int)sizeof w->d, MPI_BYTE, all, (int)sizeof w->d, MPI_BYTE,
                          w->g->comm, &req);
  if (rc == MPI_SUCCESS) {
    rc = wait_progressing(w, &req);
  }
  return rc;
}

loom_status_t loom_consistency_refuse(const loom_group_t *g, enum loom_op_kind kind,
                                      const loom_tensor_t *t, loom_status_t why) {
  struct loom_watch_slot *slot = g && g->rank >= 0 && why != LOOM_OK ? g->watch_slot : NULL;
  if (slot) {
    // Shown to the members through the window: a stall warning or a timeout names the refusal
    // instead of "last entered". Written before the number (a reader may see an old number with
    // new names, never a number whose call it cannot name). Under the check below the call is
    // entered as that number; without it, the number stays free.
    const char *op = op_name(kind), *name = t ? t->name : "";
    const size_t nop = strnlen(op, sizeof slot->refused_op - 1);
    const size_t nname = strnlen(name, sizeof slot->refused_name - 1); // (truncated names)
    memcpy(slot->refused_op, op, nop);
    slot->refused_op[nop] = '\0';
    memcpy(slot->refused_name, name, nname);
    slot->refused_name[nname] = '\0';
    slot->refused_status = (int32_t)why;
    __atomic_store_n(&slot->refused_seq, __atomic_load_n(&slot->seq, __ATOMIC_ACQUIRE) + 1,
                     __ATOMIC_RELEASE);
  }
  if (!g || !g->check_consistency || g->size <= 1 || g->rank < 0 || g->comm == MPI_COMM_NULL ||
      why == LOOM_OK) {
    return why;
  }
  char mine[LOOM_ERROR_MAX];
  snprintf(mine, sizeof mine, "%s", loom_last_error(NULL));
  struct loom_op_desc d;
  loom_op_desc_set(&d, kind, t ? t->name : NULL, -1, -1, -1, -1, 0);
  d.refused = (int32_t)why;
  struct loom_watch w;
  loom_watch_enter(&w, g, &d, 1); // (numbered like the members' call: the next ones line up)
  struct loom_op_desc *all = malloc(sizeof *all * (size_t)g->size);
  if (all) { // (without memory the members wait, as they would have before: the watchdog ends it)
    (void)gather_descs(&w, all);
    free(all);
  }
  loom_error_set_quiet(mine); // (progress meanwhile may have recorded another request's error)
  return why;
}

loom_status_t loom_check_consistency(struct loom_watch *w) {
  const loom_group_t *g = w->g;
  if (!g->check_consistency || g->size <= 1) {
    return LOOM_OK;
  }
  const int np = g->size;
  struct loom_op_desc *all = malloc(sizeof *all * (size_t)np);
  if (!all) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "LOOM_CHECK_CONSISTENCY: out of memory");
  }
  if (gather_descs(w, all) != MPI_SUCCESS) {
    free(all);
    return loom_error(NULL, LOOM_ERR_MPI, "LOOM_CHECK_CONSISTENCY: the allgather of %s failed",
                      op_name(w->d.kind));
  }
  loom_status_t status = LOOM_OK;
  for (int r = 0; r < np && status == LOOM_OK; r++) { // a rank that refused its call
    if (all[r].refused != LOOM_OK) {
      char b[160], group[64];
      all[r].name[LOOM_OP_NAME_MAX - 1] = '\0';
      format_desc(&all[r], b, sizeof b);
      format_group(g, group, sizeof group);
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "LOOM_CHECK_CONSISTENCY: rank %d refused its call of %s on %s (%s; its "
                          "own message says why), so no rank starts this one: fix that rank's "
                          "call",
                          r, b, group, loom_strerror((loom_status_t)all[r].refused));
    }
  }
  for (int r = 1; r < np && status == LOOM_OK; r++) {
    if (!same(&all[0], &all[r])) {
      char a[160], b[160], group[64];
      all[0].name[LOOM_OP_NAME_MAX - 1] = all[r].name[LOOM_OP_NAME_MAX - 1] = '\0';
      format_desc(&all[0], a, sizeof a);
      format_desc(&all[r], b, sizeof b);
      format_group(g, group, sizeof group);
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "LOOM_CHECK_CONSISTENCY: rank 0 calls %s but rank %d calls %s%s on "
                          "%s: every rank must make the same collective calls in the same order",
                          a, r, b, strcmp(a, b) ? "" : hidden_difference(&all[0], &all[r]), group);
      break;
    }
  }
  free(all);
  return status;
}

loom_status_t loom_check_alltoallv_counts(struct loom_watch *w, const int64_t *send_counts,
                                          const int64_t *recv_counts) {
  const loom_group_t *g = w->g;
  if (!g->check_consistency || g->size <= 1) {
    return LOOM_OK;
  }
  const int np = g->size;
  int64_t *sent_to_me = malloc(sizeof(int64_t) * (size_t)np);
  int64_t *bad = malloc(sizeof(int64_t) * 3 * (size_t)np);
  if (!sent_to_me || !bad) {
    free(sent_to_me);
    free(bad);
    return loom_error(NULL, LOOM_ERR_NOMEM, "LOOM_CHECK_CONSISTENCY: out of memory");
  }
  // Each rank learns what every peer will send it, and reports its first disagreement.
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ialltoall(send_counts, 1, MPI_INT64_T, sent_to_me, 1, MPI_INT64_T, g->comm, &req);
  if (rc == MPI_SUCCESS) {
    rc = wait_progressing(w, &req);
  }
  int64_t mine[3] = {-1, 0, 0}; // source, what it sends, what this rank expects
  for (int s = 0; rc == MPI_SUCCESS && s < np; s++) {
    if (sent_to_me[s] != recv_counts[s]) {
      mine[0] = s;
      mine[1] = sent_to_me[s];
      mine[2] = recv_counts[s];
      break;
    }
  }
  if (rc == MPI_SUCCESS) {
    rc = MPI_Iallgather(mine, 3, MPI_INT64_T, bad, 3, MPI_INT64_T, g->comm, &req);
  }
  if (rc == MPI_SUCCESS) {
    rc = wait_progressing(w, &req);
  }
  loom_status_t status = LOOM_OK;
  if (rc != MPI_SUCCESS) {
    status = loom_error(NULL, LOOM_ERR_MPI,
                        "LOOM_CHECK_CONSISTENCY: exchanging the alltoallv counts failed");
  }
  for (int r = 0; status == LOOM_OK && r < np; r++) {
    if (bad[3 * r] >= 0) {
      char what[160], group[64];
      format_desc(&w->d, what, sizeof what);
      format_group(g, group, sizeof group);
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "LOOM_CHECK_CONSISTENCY: in %s on %s, rank %lld sends %lld elements to "
                          "rank %d, which expects %lld from it (recv_counts[%lld] = %lld on rank "
                          "%d): send_counts[j] on rank i must equal recv_counts[i] on rank j",
                          what, group, (long long)bad[3 * r], (long long)bad[3 * r + 1], r,
                          (long long)bad[3 * r + 2], (long long)bad[3 * r],
                          (long long)bad[3 * r + 2], r);
    }
  }
  free(sent_to_me);
  free(bad);
  return status;
}
