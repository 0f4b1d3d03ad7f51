/* test_attn_balance.c — the core attention balancer of loom_attn_plan.h without MPI: every row
 * placed once, causal shards, loads, bytes and balance on skewed inputs, bad arguments, speed. */
#include "config.h"
#include "loom.h"
#include "../quiet.h"
#include "loom_attn_plan.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../check.h"

// ---- helpers ---------------------------------------------------------------------------------

// splitmix64: a small seeded generator of our own, so that every run draws the same instances.
static uint64_t rng_state = 0x636164626c616e63ull;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double rng_unit(void) { // [0, 1)
  return (double)(rng_next() >> 11) * 0x1.0p-53;
}

static int rng_int(int lo, int hi) { // [lo, hi]
  return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

static double rng_normal(void) { // Box-Muller
  double u = rng_unit(), v = rng_unit();
  return sqrt(-2.0 * log(1.0 - u)) * cos(2.0 * M_PI * v);
}

// A lognormal length around median rows (sigma in log space), within [1, max].
static int64_t rng_len(double median, double sigma, int64_t max) {
  double x = median * exp(sigma * rng_normal());
  int64_t l = (int64_t)x;
  return l < 1 ? 1 : (l > max ? max : l);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int close_to(double a, double b, double rel) {
  double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
  return fabs(a - b) <= rel * (m > 1 ? m : 1);
}

// Calls expected to fail log a WARN line each: stderr goes to /dev/null around them.
static loom_status_t quiet_balance(const loom_attn_doc_t *docs, int ndocs, int nranks,
                                   const loom_attn_balance_opts_t *o, loom_attn_plan_t *out) {
  quiet_begin();
  loom_status_t st = loom_attn_balance(docs, ndocs, nranks, o, out);
  quiet_end();
  return st;
}

#define MAXR 64

// A piece's cost under the options: its pairs plus row_cost per query row.
static double cost(const loom_attn_balance_opts_t *o, int64_t lo, int64_t hi, int64_t len) {
  double pairs = loom_attn_task_cost(lo, hi, len, o->causal);
  return pairs > 0 ? pairs + o->row_cost * (double)(hi - lo) : 0.0;
}

// ---- the invariants every plan keeps ---------------------------------------------------------

typedef struct found {
  double max_doc;   // the most pairs of one document
  double max_after; // most loaded serving rank
  double max_before;
  double mean;
} found_t;

// Check p against its input: every row of every document in exactly one task (tasks sorted by
// (doc, q_lo), adjacent, from 0 to len; two adjacent tasks of a document on different servers:
// the plan merges the others), causal shards, cuts of at least min_shard rows, owners
// and servers, load[] the sum of task costs, the ratios and the bytes recomputed here. Returns
// what a caller may want to assert on.
static found_t check_plan(const loom_attn_doc_t *docs, int ndocs, int nranks,
                          const loom_attn_balance_opts_t *o, const loom_attn_plan_t *p,
                          const char *what) {
  found_t f = {0};
  int dedicated = o->servers_first > 0 && o->servers_first < nranks;
  int s0 = dedicated ? o->servers_first : 0, ntrain = dedicated ? o->servers_first : nranks;
  double load[MAXR] = {0}, before[MAXR] = {0}, total = 0.0, bytes = 0.0;
  int bad = 0;
  int k = 0; // the next task
  for (int d = 0; d < ndocs && !bad; d++) {
    int64_t len = docs[d].len, row = 0;
    double c = cost(o, 0, len, len);
    total += c;
    before[docs[d].owner] += c;
    f.max_doc = c > f.max_doc ? c : f.max_doc;
    int first = k;
    for (; k < p->ntasks && p->tasks[k].doc == d; k++) {
      const loom_attn_task_t *t = &p->tasks[k];
      int whole = t->q_lo == 0 && t->q_hi == len;
      if (t->q_lo != row || !(t->q_lo < t->q_hi) || t->q_hi > len || t->owner != docs[d].owner ||
          t->server < s0 || t->server >= nranks || (!whole && t->q_hi - t->q_lo < o->min_shard)) {
        CHECK(0,
              "%s: task %d (doc %d, rows [%lld, %lld) of %lld, owner %d, server %d): expected "
              "rows from %lld, owner %d, a server in [%d, %d), at least %lld rows when cut",
              what, k, d, (long long)t->q_lo, (long long)t->q_hi, (long long)len, t->owner,
              t->server, (long long)row, docs[d].owner, s0, nranks, (long long)o->min_shard);
        bad = 1;
        break;
      }
      // (the arguments are read only when it fails: then k > first)
      CHECK(k == first || p->tasks[k - 1].server != t->server,
            "%s: tasks %d and %d (doc %d, rows [%lld, %lld) and [%lld, %lld)) are adjacent on "
            "server %d: the plan merges them",
            what, k - 1, k, d, (long long)p->tasks[k - 1].q_lo, (long long)p->tasks[k - 1].q_hi,
            (long long)t->q_lo, (long long)t->q_hi, t->server);
      row = t->q_hi;
      load[t->server] += cost(o, t->q_lo, t->q_hi, len);
      if (t->server != t->owner) {
        bytes += (double)(t->q_hi - t->q_lo) * o->bytes_per_q_row;
        int seen = 0;
        double kv = 0.0;
        for (int j = first; j < k; j++) {
          seen |= p->tasks[j].server == t->server;
        }
        for (int j = k; !seen && j < p->ntasks && p->tasks[j].doc == d; j++) {
          double r = o->causal ? (double)p->tasks[j].q_hi : (double)len;
          kv = p->tasks[j].server == t->server && r > kv ? r : kv;
        }
        bytes += kv * o->bytes_per_kv_row;
      }
    }
    if (!bad && row != len) {
      CHECK(0, "%s: doc %d of %lld rows: the tasks cover [0, %lld)", what, d, (long long)len,
            (long long)row);
      bad = 1;
    }
  }
  if (!bad) {
    CHECK(k == p->ntasks, "%s: %d tasks, %d of them in document order", what, p->ntasks, k);
  }
  for (int r = 0; r < nranks; r++) {
    CHECK(close_to(p->load[r], load[r], 1e-12), "%s: load[%d] = %.17g, tasks sum to %.17g", what, r,
          p->load[r], load[r]);
    if (r < s0) {
      CHECK(p->load[r] == 0.0, "%s: training rank %d computes %g pairs with dedicated servers",
            what, r, p->load[r]);
    } else {
      f.max_after = load[r] > f.max_after ? load[r] : f.max_after;
    }
  }
  for (int r = 0; r < ntrain; r++) {
    f.max_before = before[r] > f.max_before ? before[r] : f.max_before;
  }
  f.mean = total / (nranks - s0);
  double mom = total > 0 ? f.max_after / f.mean : 1.0;
  double mom0 = total > 0 ? f.max_before / (total / ntrain) : 1.0;
  CHECK(close_to(p->max_over_mean, mom, 1e-12), "%s: max_over_mean %.17g, recomputed %.17g", what,
        p->max_over_mean, mom);
  CHECK(close_to(p->max_over_mean_before, mom0, 1e-12),
        "%s: max_over_mean_before %.17g, recomputed %.17g", what, p->max_over_mean_before, mom0);
  CHECK(close_to(p->bytes_moved, bytes, 1e-12), "%s: bytes_moved %.17g, recomputed %.17g", what,
        p->bytes_moved, bytes);
  // What must hold whatever the input: in-place, moves only lower the maximum; dedicated, the
  // whole documents spread longest first leave at most one document above the mean.
  if (!dedicated) {
    CHECK(f.max_after <= f.max_before * (1 + 1e-12), "%s: max load %.6g above the start's %.6g",
          what, f.max_after, f.max_before);
  } else {
    CHECK(f.max_after <= (f.mean + f.max_doc) * (1 + 1e-12),
          "%s: max load %.6g above mean %.6g + the largest document %.6g", what, f.max_after,
          f.mean, f.max_doc);
  }
  return f;
}

// Balance, check, and check a second call gives the same plan. Returns max_over_mean (-1 on
// failure); *plan_out, when given, receives the plan (else it is freed).
static double run(const loom_attn_doc_t *docs, int ndocs, int nranks,
                  const loom_attn_balance_opts_t *o, const char *what, loom_attn_plan_t *plan_out) {
  loom_attn_plan_t p, q;
  loom_status_t st = loom_attn_balance(docs, ndocs, nranks, o, &p);
  CHECK(st == LOOM_OK, "%s: balance returned %s: %s", what, loom_strerror(st),
        loom_last_error(NULL));
  if (st != LOOM_OK) {
    return -1;
  }
  check_plan(docs, ndocs, nranks, o, &p, what);
  st = loom_attn_balance(docs, ndocs, nranks, o, &q);
  int same = st == LOOM_OK && q.ntasks == p.ntasks;
  for (int i = 0; same && i < p.ntasks; i++) {
    const loom_attn_task_t *a = &p.tasks[i], *c = &q.tasks[i];
    same = a->doc == c->doc && a->q_lo == c->q_lo && a->q_hi == c->q_hi && a->owner == c->owner &&
           a->server == c->server;
  }
  CHECK(same && memcmp(q.load, p.load, sizeof *p.load * (size_t)nranks) == 0 &&
            q.bytes_moved == p.bytes_moved && q.max_over_mean == p.max_over_mean,
        "%s: a second call gave a different plan", what);
  loom_attn_plan_free(&q);
  double m = p.max_over_mean;
  if (plan_out) {
    *plan_out = p;
  } else {
    loom_attn_plan_free(&p);
  }
  return m;
}

// ---- 1. the cost model -----------------------------------------------------------------------

static void test_cost(void) {
  CHECK(loom_attn_task_cost(0, 4, 4, 1) == 10.0, "causal 4 rows: %g pairs, want 10",
        loom_attn_task_cost(0, 4, 4, 1));
  CHECK(loom_attn_task_cost(2, 4, 4, 1) == 7.0, "rows [2, 4) of 4: %g, want 3 + 4",
        loom_attn_task_cost(2, 4, 4, 1));
  CHECK(loom_attn_task_cost(1, 3, 5, 0) == 10.0, "full attention, 2 rows of 5: %g, want 10",
        loom_attn_task_cost(1, 3, 5, 0));
  CHECK(loom_attn_task_cost(0, 1, 1, 1) == 1.0, "one row: %g", loom_attn_task_cost(0, 1, 1, 1));
  CHECK(loom_attn_task_cost(3, 3, 5, 1) == 0.0 && loom_attn_task_cost(0, 6, 5, 1) == 0.0 &&
            loom_attn_task_cost(-1, 2, 5, 1) == 0.0,
        "an empty or out-of-range shard costs nothing");
  // Pieces add up to the whole, and a row's pairs are its position + 1.
  int64_t L = 100003;
  double whole = loom_attn_task_cost(0, L, L, 1);
  CHECK(whole == (double)L * (double)(L + 1) / 2, "causal %lld rows: %.17g", (long long)L, whole);
  CHECK(loom_attn_task_cost(0, 777, L, 1) + loom_attn_task_cost(777, 50000, L, 1) +
                loom_attn_task_cost(50000, L, L, 1) ==
            whole,
        "causal pieces do not add up");
  CHECK(loom_attn_task_cost(L - 1, L, L, 1) == (double)L, "the last row sees every key");
  loom_attn_balance_opts_t o;
  loom_attn_balance_opts_init(&o);
  CHECK(o.tolerance == 0.1 && o.causal == 1 && o.min_shard == 64 && o.servers_first == 0 &&
            o.bytes_per_q_row == 768 && o.bytes_per_kv_row == 512,
        "defaults: tolerance %g causal %d min_shard %lld servers_first %d bytes %g %g", o.tolerance,
        o.causal, (long long)o.min_shard, o.servers_first, o.bytes_per_q_row, o.bytes_per_kv_row);
}

// ---- 2. small cases worked by hand -----------------------------------------------------------

static void test_small(void) {
  loom_attn_balance_opts_t o;
  loom_attn_balance_opts_init(&o);
  loom_attn_plan_t p;
  double bq = o.bytes_per_q_row, bkv = o.bytes_per_kv_row;

  // Nothing to do.
  run(NULL, 0, 4, &o, "no documents", &p);
  CHECK(p.ntasks == 0 && p.max_over_mean == 1.0 && p.max_over_mean_before == 1.0 &&
            p.bytes_moved == 0.0,
        "no documents: %d tasks, max/mean %g before %g, %g bytes", p.ntasks, p.max_over_mean,
        p.max_over_mean_before, p.bytes_moved);
  loom_attn_plan_free(&p);
  loom_attn_plan_free(&p); // twice is fine
  loom_attn_plan_free(NULL);

  // Length 0: no task; length 1: one task.
  loom_attn_doc_t d01[] = {{0, 0}, {1, 1}, {0, 0}};
  run(d01, 3, 2, &o, "lengths 0 and 1", &p);
  CHECK(p.ntasks == 1 && p.tasks[0].doc == 1 && p.tasks[0].q_lo == 0 && p.tasks[0].q_hi == 1,
        "lengths 0 and 1: %d tasks", p.ntasks);
  loom_attn_plan_free(&p);

  // One rank: everything stays.
  loom_attn_doc_t one[] = {{0, 5000}, {0, 10}, {0, 300}};
  run(one, 3, 1, &o, "one rank", &p);
  CHECK(p.ntasks == 3 && p.bytes_moved == 0.0 && p.max_over_mean == 1.0,
        "one rank: %d tasks, %g bytes, max/mean %g", p.ntasks, p.bytes_moved, p.max_over_mean);
  loom_attn_plan_free(&p);

  // Two equal documents on rank 0 of 2: one moves whole, nothing is cut.
  loom_attn_doc_t two[] = {{0, 4096}, {0, 4096}};
  run(two, 2, 2, &o, "two equal documents", &p);
  CHECK(p.ntasks == 2 && p.max_over_mean == 1.0 && p.bytes_moved == 4096 * (bq + bkv),
        "two equal documents: %d tasks, max/mean %g, %g bytes (want %g)", p.ntasks, p.max_over_mean,
        p.bytes_moved, 4096 * (bq + bkv));
  loom_attn_plan_free(&p);

  // Dedicated: 8 equal documents on 2 training ranks, 4 servers: two whole documents each.
  loom_attn_doc_t eight[8];
  for (int i = 0; i < 8; i++) {
    eight[i] = (loom_attn_doc_t){.owner = i % 2, .len = 1000};
  }
  o.servers_first = 2;
  run(eight, 8, 6, &o, "dedicated, 8 equal documents", &p);
  CHECK(p.ntasks == 8 && p.max_over_mean == 1.0 && p.bytes_moved == 8 * 1000 * (bq + bkv),
        "dedicated, 8 equal documents: %d tasks, max/mean %g, %g bytes", p.ntasks, p.max_over_mean,
        p.bytes_moved);
  loom_attn_plan_free(&p);
  // servers_first = nranks is in-place.
  o.servers_first = 6;
  run(eight, 8, 6, &o, "servers_first = nranks", &p);
  CHECK(p.load[0] > 0 && p.load[5] > 0, "servers_first = nranks: rank 0 %g, rank 5 %g pairs",
        p.load[0], p.load[5]);
  loom_attn_plan_free(&p);
  o.servers_first = 0;

  // A document shorter than 2 min_shard is never cut, however unbalanced.
  loom_attn_doc_t shortd[] = {{0, 100}};
  run(shortd, 1, 2, &o, "short document", &p);
  CHECK(p.ntasks == 1 && p.max_over_mean == 2.0, "short document: %d tasks, max/mean %g", p.ntasks,
        p.max_over_mean);
  loom_attn_plan_free(&p);

  // One long document on rank 0 of 2: one cut, half the pairs each (to a row), and the piece
  // shipped is the cheaper of head and tail.
  loom_attn_doc_t longd[] = {{0, 1 << 16}};
  run(longd, 1, 2, &o, "one long document, 2 ranks", &p);
  CHECK(p.ntasks == 2 && p.max_over_mean < 1.0 + 1e-4, "one long document: %d tasks, max/mean %g",
        p.ntasks, p.max_over_mean);
  if (p.ntasks == 2) {
    int moved = p.tasks[0].server == 1 ? 0 : 1;
    const loom_attn_task_t *t = &p.tasks[moved];
    double head = (double)p.tasks[0].q_hi * (bq + bkv); // the head piece, shipped
    double tail = (double)(p.tasks[1].q_hi - p.tasks[1].q_lo) * bq + 65536.0 * bkv;
    CHECK(p.tasks[moved].server == 1 && p.bytes_moved == (moved == 0 ? head : tail),
          "one long document: moved rows [%lld, %lld), %g bytes", (long long)t->q_lo,
          (long long)t->q_hi, p.bytes_moved);
  }
  loom_attn_plan_free(&p);
}

// ---- 2b. the merge of adjacent pieces, worked by hand -----------------------------------------

// p must be exactly want[0 .. n) (doc, rows, owner, server), with these loads, ratios and bytes.
static void expect_plan(const loom_attn_plan_t *p, const loom_attn_task_t *want, int n,
                        const double *load, int nranks, double mom, double mom0, double bytes,
                        const char *what) {
  CHECK(p->ntasks == n, "%s: %d tasks, want %d", what, p->ntasks, n);
  for (int k = 0; k < n && k < p->ntasks; k++) {
    const loom_attn_task_t *t = &p->tasks[k], *w = &want[k];
    CHECK(t->doc == w->doc && t->q_lo == w->q_lo && t->q_hi == w->q_hi && t->owner == w->owner &&
              t->server == w->server,
          "%s: task %d is doc %d rows [%lld, %lld) owner %d on %d; want doc %d rows [%lld, %lld) "
          "owner %d on %d",
          what, k, t->doc, (long long)t->q_lo, (long long)t->q_hi, t->owner, t->server, w->doc,
          (long long)w->q_lo, (long long)w->q_hi, w->owner, w->server);
  }
  for (int r = 0; r < nranks; r++) {
    CHECK(p->load[r] == load[r], "%s: load[%d] = %g, want %g", what, r, p->load[r], load[r]);
  }
  CHECK(close_to(p->max_over_mean, mom, 1e-15) && close_to(p->max_over_mean_before, mom0, 1e-15) &&
            p->bytes_moved == bytes,
        "%s: max/mean %.17g before %.17g, %g bytes; want %.17g, %.17g, %g", what, p->max_over_mean,
        p->max_over_mean_before, p->bytes_moved, mom, mom0, bytes);
}

// Two inputs whose moves leave two adjacent pieces of a document on one rank, which the plan
// merges into one task. Default bytes (768 per query row, 512 per key/value row), min_shard 1.
// A cut's rows are the nearest to the amount wanted ("need"); of the pieces that fit, the
// fewest bytes per pair moves; when none fits, the smallest that lowers the pair's maximum.
static void test_merge(void) {
  loom_attn_balance_opts_t o;
  loom_attn_balance_opts_init(&o);
  o.min_shard = 1;
  loom_attn_plan_t p;

  // (a) One document of 12 rows (78 pairs) on rank 0 of 3, tolerance 0: mean 26.
  //  1. loads 78 0 0, rank 0 -> 1, need min(52, 26) = 26, gap 78. Head [0, 7): 28 pairs,
  //     7 x 768 + 7 x 512 = 8960 bytes, 320 a pair; tail [10, 12): 23 pairs, 2 x 768 + 12 x 512
  //     = 7680 bytes, 333.9 a pair. The head goes: loads 50 28 0.
  //  2. rank 0 -> 2, need min(24, 26) = 24, gap 50, task [7, 12). Head [7, 10): 27 pairs,
  //     3 x 768 + 10 x 512 = 7424, 275 a pair; tail [10, 12): 23 pairs, 7680, 333.9. The head
  //     goes: loads 23 28 27.
  //  3. rank 1 -> 0 (the owner: shipping back saves 768 a row), need min(2, 3) = 2, gap 5, task
  //     [0, 7). Head [0, 1): 1 pair (error 1; [0, 2), 3 pairs, ties and loses); the tail [6, 7),
  //     7 pairs, is above the gap. [0, 1) goes back: loads 24 27 27.
  //  4. rank 1 (the first of the two at 27) -> 0, need min(1, 2) = 1, gap 3, task [1, 7). The
  //     nearest head is 0 rows: held at min_shard, [1, 2), 2 pairs, does not fit but lowers the
  //     maximum; the tail [6, 7) is above the gap. [1, 2) goes back: loads 26 25 27.
  //  5. rank 2 -> 1, need 1, gap 2: rank 2's [7, 10) (27 pairs) and its one-row pieces [7, 8)
  //     (8) and [9, 10) (10) all reach the gap: stop.
  // Rank 0 then holds [0, 1), [1, 2) and [10, 12): the first two merge into [0, 2); [10, 12) is
  // not adjacent to them and stays apart. Loads 1 + 2 + 23 = 26, 3 + .. + 7 = 25, 8 + 9 + 10 = 27;
  // max/mean 27 / 26, before 78 / 26 = 3. Bytes: [2, 7) on rank 1, 5 x 768 + 7 x 512 = 7424, and
  // [7, 10) on rank 2, 3 x 768 + 10 x 512 = 7424: 14848.
  {
    loom_attn_doc_t docs[] = {{.owner = 0, .len = 12}};
    loom_attn_task_t want[] = {
        {0, 0, 2, 0, 0}, {0, 2, 7, 0, 1}, {0, 7, 10, 0, 2}, {0, 10, 12, 0, 0}};
    double load[] = {26, 25, 27};
    o.tolerance = 0.0;
    if (run(docs, 1, 3, &o, "merge, one document", &p) >= 0) {
      expect_plan(&p, want, 4, load, 3, 27.0 / 26.0, 3.0, 14848.0, "merge, one document");
      loom_attn_plan_free(&p);
    }
  }

  // (b) Documents of 2 rows on rank 0 (3 pairs) and 8 rows on rank 1 (36 pairs), 3 ranks,
  // tolerance 0.1: mean 13, goal 14.3. The merge is on rank 0, which does not own the document.
  //  1. loads 3 36 0, rank 1 -> 2, need min(23, 13) = 13, gap 36, task [0, 8). Head [0, 5): 15
  //     pairs, 5 x 1280 = 6400 bytes, 426.7 a pair; tail [6, 8): 15 pairs, 2 x 768 + 8 x 512 =
  //     5632 bytes, 375.5 a pair. The tail goes: loads 3 21 15.
  //  2. rank 1 -> 0, need min(8, 10) = 8, gap 18, task [0, 6). Head [0, 3): 6 pairs, 3 x 1280 =
  //     3840 bytes; tail [5, 6): 6 pairs, 768 + 6 x 512 = 3840 bytes: the same bytes a pair and
  //     pairs, so the head goes (head before tail): loads 9 15 15.
  //  3. rank 1 (the first at 15) -> 0, need min(2, 4) = 2, gap 6, task [3, 6). The nearest head
  //     is 0 rows: held at min_shard, [3, 4), 4 pairs, lowers the maximum; it ships 768 bytes of
  //     Q and one key/value row past the prefix [0, 3) rank 0 holds, 512. The tail [5, 6), 6
  //     pairs, reaches the gap. [3, 4) goes: loads 13 11 15.
  //  4. rank 2 -> 1, need 2, gap 4: [6, 8) (15 pairs) and its rows [6, 7) (7) and [7, 8) (8) all
  //     reach the gap: stop.
  // Rank 0 holds [0, 3) and [3, 4) of document 1: merged into [0, 4). Loads 3 + 10 = 13, 5 + 6 =
  // 11, 7 + 8 = 15; max/mean 15 / 13, before 36 / 13. Bytes: [0, 4) on rank 0, 4 x 768 + 4 x 512
  // = 5120, and [6, 8) on rank 2, 2 x 768 + 8 x 512 = 5632: 10752.
  {
    loom_attn_doc_t docs[] = {{.owner = 0, .len = 2}, {.owner = 1, .len = 8}};
    loom_attn_task_t want[] = {{0, 0, 2, 0, 0}, {1, 0, 4, 1, 0}, {1, 4, 6, 1, 1}, {1, 6, 8, 1, 2}};
    double load[] = {13, 11, 15};
    o.tolerance = 0.1;
    if (run(docs, 2, 3, &o, "merge on a server", &p) >= 0) {
      expect_plan(&p, want, 4, load, 3, 15.0 / 13.0, 36.0 / 13.0, 10752.0, "merge on a server");
      loom_attn_plan_free(&p);
    }
  }
}

// ---- 3. skewed random inputs -----------------------------------------------------------------

static const int nps[] = {2, 3, 4, 5, 7, 8, 13, 16, 31, 32, 64};
#define NNP ((int)(sizeof nps / sizeof nps[0]))

// Lognormal lengths, owners skewed: rank r draws documents with weight (r + 1)^-1.5 and the
// longest ones go to rank 0. Many documents per rank: the tolerance must be met.
static void test_lognormal(void) {
  static loom_attn_doc_t docs[64 * 64];
  loom_attn_balance_opts_t o;
  char what[128];
  double worst = 0.0, worst_before = 0.0;
  int cases = 0;
  for (int ni = 0; ni < NNP; ni++) {
    // in-place causal, in-place full, dedicated causal, in-place causal with a row cost
    for (int mode = 0; mode < 4; mode++) {
      int np = nps[ni];
      loom_attn_balance_opts_init(&o);
      o.causal = mode != 1;
      o.row_cost = mode == 3 ? 300.0 : 0.0;
      int ntrain = np;
      if (mode == 2) {
        if (np < 3) {
          continue;
        }
        o.servers_first = np - np / 3;
        ntrain = o.servers_first;
      }
      int ndocs = 48 * np;
      double wsum = 0.0;
      for (int r = 0; r < ntrain; r++) {
        wsum += pow(r + 1, -1.5);
      }
      for (int d = 0; d < ndocs; d++) {
        double u = rng_unit() * wsum, acc = 0.0;
        int owner = ntrain - 1;
        for (int r = 0; r < ntrain; r++) {
          acc += pow(r + 1, -1.5);
          if (u < acc) {
            owner = r;
            break;
          }
        }
        int64_t len = rng_len(1024, 1.2, 1 << 17);
        docs[d] = (loom_attn_doc_t){.owner = len > 16384 ? 0 : owner, .len = len};
      }
      snprintf(what, sizeof what, "lognormal np %d %s", np,
               mode == 0   ? "in-place causal"
               : mode == 1 ? "in-place full"
               : mode == 2 ? "dedicated"
                           : "in-place causal, row cost 300");
      loom_attn_plan_t p;
      double m = run(docs, ndocs, np, &o, what, &p);
      if (m < 0) {
        continue;
      }
      CHECK(m <= 1 + o.tolerance, "%s: max/mean %.4f above 1 + %g (before %.3f)", what, m,
            o.tolerance, p.max_over_mean_before);
      worst = m > worst ? m : worst;
      worst_before = p.max_over_mean_before > worst_before ? p.max_over_mean_before : worst_before;
      cases++;
      loom_attn_plan_free(&p);
    }
  }
  printf("lognormal (48 docs per rank, np 2..64, 4 modes): %d cases, worst max/mean %.4f after, "
         "%.2f before\n",
         cases, worst, worst_before);
}

// One long document on one rank and a few short ones elsewhere: only cuts can balance it.
static void test_one_long(void) {
  static loom_attn_doc_t docs[256];
  loom_attn_balance_opts_t o;
  char what[128];
  double worst = 0.0;
  for (int ni = 0; ni < NNP; ni++) {
    for (int mode = 0; mode < 3; mode++) {
      int np = nps[ni];
      loom_attn_balance_opts_init(&o);
      o.causal = mode != 1;
      int ntrain = np;
      if (mode == 2) {
        if (np < 2) {
          continue;
        }
        o.servers_first = np / 2;
        ntrain = o.servers_first;
      }
      int64_t L = (int64_t)1 << 17;
      int ndocs = 0, holder = rng_int(0, ntrain - 1);
      docs[ndocs++] = (loom_attn_doc_t){.owner = holder, .len = L};
      for (int i = 0; i < 2 * np; i++) {
        docs[ndocs++] = (loom_attn_doc_t){.owner = rng_int(0, ntrain - 1), .len = rng_int(1, 512)};
      }
      snprintf(what, sizeof what, "one long document np %d %s", np,
               mode == 0   ? "in-place causal"
               : mode == 1 ? "in-place full"
                           : "dedicated");
      loom_attn_plan_t p;
      double m = run(docs, ndocs, np, &o, what, &p);
      if (m < 0) {
        continue;
      }
      CHECK(m <= 1 + o.tolerance, "%s: max/mean %.4f above 1 + %g (before %.3f)", what, m,
            o.tolerance, p.max_over_mean_before);
      worst = m > worst ? m : worst;
      loom_attn_plan_free(&p);
    }
  }
  printf("one long document (2^17 rows, np 2..64, 3 modes): worst max/mean %.4f\n", worst);
}

// Hard inputs (few documents, large min_shard, tolerance 0): only the invariants and the bounds
// of check_plan must hold.
static void test_hard(void) {
  static loom_attn_doc_t docs[64];
  loom_attn_balance_opts_t o;
  char what[128];
  int met = 0, n = 0;
  for (int i = 0; i < 400; i++) {
    int np = rng_int(1, 64);
    loom_attn_balance_opts_init(&o);
    o.causal = rng_int(0, 3) != 0;
    o.min_shard = rng_int(1, 4) == 1 ? 1 : rng_int(16, 2048);
    o.tolerance = rng_int(0, 3) == 0 ? 0.0 : rng_unit() * 0.3;
    o.servers_first = np > 1 && rng_int(0, 2) == 0 ? rng_int(1, np - 1) : 0;
    o.bytes_per_q_row = rng_int(0, 4) * 256.0;
    o.bytes_per_kv_row = rng_int(0, 4) * 256.0;
    int ntrain = o.servers_first ? o.servers_first : np;
    int ndocs = rng_int(0, 12);
    for (int d = 0; d < ndocs; d++) {
      docs[d] =
          (loom_attn_doc_t){.owner = rng_int(0, ntrain - 1),
                            .len = rng_int(0, 5) == 0 ? rng_int(0, 3) : rng_len(2000, 2, 1 << 18)};
    }
    snprintf(what, sizeof what, "hard case %d (np %d, %d docs, min_shard %lld, servers from %d)", i,
             np, ndocs, (long long)o.min_shard, o.servers_first);
    loom_attn_plan_t p;
    double m = run(docs, ndocs, np, &o, what, &p);
    if (m < 0) {
      continue;
    }
    met += m <= 1 + o.tolerance;
    n++;
    if (m > 1 + o.tolerance) {
      // The balancer stops short only when nothing on the most loaded rank can go to the least
      // loaded one without overshooting: no task costs less than the gap, and no task that
      // could be cut has a head of min_shard rows below half of it.
      int s0 = o.servers_first, src = s0, dst = s0;
      for (int r = s0; r < np; r++) {
        src = p.load[r] > p.load[src] ? r : src;
        dst = p.load[r] < p.load[dst] ? r : dst;
      }
      double gap = p.load[src] - p.load[dst];
      for (int k = 0; k < p.ntasks; k++) {
        const loom_attn_task_t *t = &p.tasks[k];
        int64_t len = docs[t->doc].len;
        double c = cost(&o, t->q_lo, t->q_hi, len);
        double head = t->q_hi - t->q_lo >= 2 * o.min_shard
                          ? cost(&o, t->q_lo, t->q_lo + o.min_shard, len)
                          : INFINITY;
        CHECK(t->server != src || (c >= gap && head >= gap / 2),
              "%s: stopped at max/mean %.4f with task %d (rows [%lld, %lld), %g pairs, head %g) "
              "on rank %d that could go to rank %d (gap %g)",
              what, m, k, (long long)t->q_lo, (long long)t->q_hi, c, head, src, dst, gap);
      }
    }
    loom_attn_plan_free(&p);
  }
  printf("hard cases: %d, tolerance met on %d (not asserted: a single shard may dominate)\n", n,
         met);
}

// min_shard as large as it goes (INT64_MAX: "never cut") keeps every document whole; twice it
// once overflowed (UBSan stops there).
static void test_huge_min_shard(void) {
  loom_attn_doc_t docs[3] = {
      {.owner = 0, .len = 4096}, {.owner = 0, .len = 1000}, {.owner = 1, .len = 7}};
  loom_attn_balance_opts_t o;
  loom_attn_balance_opts_init(&o);
  for (int k = 0; k < 2; k++) {
    o.min_shard = k ? INT64_MAX / 2 + 1 : INT64_MAX;
    loom_attn_plan_t p;
    double m = run(docs, 3, 2, &o, k ? "min_shard 2^62" : "min_shard INT64_MAX", &p);
    if (m < 0) {
      continue;
    }
    CHECK(p.ntasks == 3, "min_shard %lld: %d tasks, want the 3 documents whole",
          (long long)o.min_shard, p.ntasks);
    loom_attn_plan_free(&p);
  }
}

// ---- 4. bad arguments ------------------------------------------------------------------------

static void test_invalid(void) {
  loom_attn_doc_t docs[] = {{0, 100}, {1, 200}};
  loom_attn_balance_opts_t o;
  loom_attn_plan_t p;
  struct {
    const char *what;
    int nranks, ndocs, owner;
    int64_t len;
    double tol;
    int64_t min_shard;
    int servers_first, causal, null_docs, null_out;
    double bq, row_cost;
  } cases[] = {
      {"nranks 0", 0, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, 0},
      {"nranks -3", -3, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, 0},
      {"owner out of range", 2, 2, 2, 200, 0.1, 64, 0, 1, 0, 0, 768, 0},
      {"owner -1", 2, 2, -1, 200, 0.1, 64, 0, 1, 0, 0, 768, 0},
      {"owner is a dedicated server", 3, 2, 2, 200, 0.1, 64, 2, 1, 0, 0, 768, 0},
      {"negative length", 2, 2, 1, -1, 0.1, 64, 0, 1, 0, 0, 768, 0},
      {"NULL out", 2, 2, 1, 200, 0.1, 64, 0, 1, 0, 1, 768, 0},
      {"NULL docs", 2, 2, 1, 200, 0.1, 64, 0, 1, 1, 0, 768, 0},
      {"ndocs -1", 2, -1, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, 0},
      {"tolerance < 0", 2, 2, 1, 200, -0.01, 64, 0, 1, 0, 0, 768, 0},
      {"tolerance NaN", 2, 2, 1, 200, NAN, 64, 0, 1, 0, 0, 768, 0},
      {"min_shard 0", 2, 2, 1, 200, 0.1, 0, 0, 1, 0, 0, 768, 0},
      {"servers_first > nranks", 2, 2, 1, 200, 0.1, 64, 3, 1, 0, 0, 768, 0},
      {"servers_first < 0", 2, 2, 1, 200, 0.1, 64, -1, 1, 0, 0, 768, 0},
      {"causal 2", 2, 2, 1, 200, 0.1, 64, 0, 2, 0, 0, 768, 0},
      {"bytes_per_q_row < 0", 2, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, -1, 0},
      {"row_cost < 0", 2, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, -1},
      {"row_cost infinite", 2, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, INFINITY},
      {"row_cost NaN", 2, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, NAN},
      {"row_cost 1e300 (sums overflow)", 2, 2, 1, 200, 0.1, 64, 0, 1, 0, 0, 768, 1e300},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    loom_attn_balance_opts_init(&o);
    o.tolerance = cases[i].tol;
    o.min_shard = cases[i].min_shard;
    o.servers_first = cases[i].servers_first;
    o.causal = cases[i].causal;
    o.bytes_per_q_row = cases[i].bq;
    o.row_cost = cases[i].row_cost;
    docs[1].owner = cases[i].owner;
    docs[1].len = cases[i].len;
    memset(&p, 0xff, sizeof p);
    loom_status_t st = quiet_balance(cases[i].null_docs ? NULL : docs, cases[i].ndocs,
                                     cases[i].nranks, &o, cases[i].null_out ? NULL : &p);
    CHECK(st == LOOM_ERR_INVALID_ARG, "%s: returned %s", cases[i].what, loom_strerror(st));
    CHECK(strstr(loom_last_error(NULL), "attention balancer") != NULL,
          "%s: the message does not name the balancer: %s", cases[i].what, loom_last_error(NULL));
    if (!cases[i].null_out) {
      CHECK(p.ntasks == 0 && p.tasks == NULL && p.load == NULL, "%s: the plan is not empty",
            cases[i].what);
      loom_attn_plan_free(&p);
    }
  }
  // NULL opts: the defaults.
  docs[1] = (loom_attn_doc_t){.owner = 1, .len = 200};
  CHECK(loom_attn_balance(docs, 2, 2, NULL, &p) == LOOM_OK, "NULL opts: %s", loom_last_error(NULL));
  loom_attn_plan_free(&p);
}

// ---- 4b. the row cost ------------------------------------------------------------------------

// Rank 0 holds 64 documents of one row (64 pairs), rank 1 one of 11 rows (66 pairs). By pairs
// they are balanced and nothing moves; at 10 pairs a row rank 0 costs 704 against 176, and
// documents must move to rank 1 until the costs are within the tolerance.
static void test_row_cost(void) {
  loom_attn_doc_t docs[65];
  for (int d = 0; d < 64; d++) {
    docs[d] = (loom_attn_doc_t){.owner = 0, .len = 1};
  }
  docs[64] = (loom_attn_doc_t){.owner = 1, .len = 11};
  loom_attn_balance_opts_t o;
  loom_attn_balance_opts_init(&o);
  o.min_shard = 4;
  loom_attn_plan_t p;
  double m = run(docs, 65, 2, &o, "row cost 0", &p);
  int moved = 0;
  for (int k = 0; k < p.ntasks; k++) {
    moved += p.tasks[k].server != p.tasks[k].owner;
  }
  CHECK(m >= 0 && moved == 0 && p.load[0] == 64.0 && p.load[1] == 66.0,
        "row cost 0: %d tasks moved, loads %g and %g (want 0, 64 and 66)", moved,
        m >= 0 ? p.load[0] : -1.0, m >= 0 ? p.load[1] : -1.0);
  loom_attn_plan_free(&p);
  o.row_cost = 10.0;
  m = run(docs, 65, 2, &o, "row cost 10", &p);
  moved = 0;
  for (int k = 0; m >= 0 && k < p.ntasks; k++) {
    moved += p.tasks[k].server != p.tasks[k].owner;
  }
  CHECK(m >= 0 && close_to(p.max_over_mean_before, 704.0 / 440.0, 1e-12) && m <= 1 + o.tolerance &&
            moved > 0 && p.load[0] + p.load[1] == 880.0,
        "row cost 10: before %.4f (want 1.6), after %.4f, %d tasks moved, loads %g + %g (want "
        "880)",
        m >= 0 ? p.max_over_mean_before : -1.0, m, moved, m >= 0 ? p.load[0] : -1.0,
        m >= 0 ? p.load[1] : -1.0);
  loom_attn_plan_free(&p);
  // A cut piece of a long document costs its pairs and its rows: the head and tail of 256 rows
  // cut at the amount wanted still add up to the whole.
  docs[0] = (loom_attn_doc_t){.owner = 0, .len = 256};
  o.row_cost = 50.0;
  o.min_shard = 16;
  m = run(docs, 1, 2, &o, "row cost 50, one long document", &p);
  CHECK(m >= 0 && m <= 1 + o.tolerance && p.ntasks >= 2 &&
            close_to(p.load[0] + p.load[1], 256.0 * 257.0 / 2.0 + 50.0 * 256.0, 1e-12),
        "row cost 50, one document of 256: %d tasks, max/mean %.4f, loads %g + %g", p.ntasks, m,
        m >= 0 ? p.load[0] : -1.0, m >= 0 ? p.load[1] : -1.0);
  loom_attn_plan_free(&p);
}

// ---- 5. speed --------------------------------------------------------------------------------

static void test_speed(void) {
  enum { NDOCS = 10000, NP = 64 };
  static loom_attn_doc_t docs[NDOCS];
  for (int d = 0; d < NDOCS; d++) {
    // A skewed batch: lognormal lengths, the long documents crowded on the first ranks.
    int64_t len = rng_len(2048, 1.5, 1 << 18);
    int owner = len > 32768 ? rng_int(0, 3) : rng_int(0, NP - 17); // 48.. may serve
    docs[d] = (loom_attn_doc_t){.owner = owner, .len = len};
  }
  loom_attn_balance_opts_t o;
  for (int mode = 0; mode < 2; mode++) {
    loom_attn_balance_opts_init(&o);
    o.servers_first = mode ? NP - 16 : 0;
    double best = INFINITY;
    loom_attn_plan_t p = {0};
    for (int run_ = 0; run_ < 5; run_++) {
      loom_attn_plan_free(&p);
      double t0 = now_us();
      loom_status_t st = loom_attn_balance(docs, NDOCS, NP, &o, &p);
      double us = now_us() - t0;
      CHECK(st == LOOM_OK, "10000 docs: %s", loom_last_error(NULL));
      best = us < best ? us : best;
    }
    found_t f = check_plan(docs, NDOCS, NP, &o, &p, "10000 docs");
    CHECK(p.max_over_mean <= 1 + o.tolerance, "10000 docs: max/mean %.4f", p.max_over_mean);
    double total_bytes = 0.0;
    for (int d = 0; d < NDOCS; d++) {
      total_bytes += (double)docs[d].len * (o.bytes_per_q_row + o.bytes_per_kv_row);
    }
    printf("10000 docs over %d ranks (%s): best of 5 %.2f ms; %d tasks, max/mean %.3f -> %.4f, "
           "%.1f MB moved (%.1f%% of all rows' Q+KV), max %.4g pairs\n",
           NP, mode ? "48 train, 16 dedicated servers" : "in-place", best / 1e3, p.ntasks,
           p.max_over_mean_before, p.max_over_mean, p.bytes_moved / 1e6,
           100.0 * p.bytes_moved / total_bytes, f.max_after);
    loom_attn_plan_free(&p);
    // The 100 ms goal is printed, not asserted (a loaded machine or a sanitizer build must
    // not fail the suite); only a complexity blow-up fails.
    CHECK(best < 10e6, "10000 docs: %.1f ms, far beyond the 100 ms goal", best / 1e3);
  }
}

int main(void) {
  test_cost();
  test_small();
  test_merge();
  test_lognormal();
  test_one_long();
  test_hard();
  test_huge_min_shard();
  test_invalid();
  test_row_cost();
  test_speed();
  return check_exit("test_attn_balance");
}
