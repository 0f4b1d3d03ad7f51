/* test_attn.c — attention servers under mpirun: core attention shipped to other ranks by a plan
 * equals local variable-length attention, forward and backward, for several plans. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../check_mpi.h"
#include "../testutil.h"

// What is checked, at the np of the spec, every rank against loom_attention_forward/backward on
// its own documents (within 1e-5 of the largest magnitude):
// - plans: every document on its owner; documents cut into three shards served round robin;
//   everything served by rank 0 (a dedicated server); shards of one length-300 document on
//   every rank; the attention balancer's plan (shards of >= 8 rows); causal and not; the default
//   scale (1/sqrt(D)) and a given one (0.25), which the executor must pass to both kernels (was
//   unchecked: a server that used the default passed);
// - out, lse, dq, dk, dv inside sentinels, their own elements set to NaN: every element written
//   (dk and dv zeroed before the servers' sums are added: a sum onto what the caller's buffer
//   held passed while the test's buffers started at zero), nothing before or past them;
// - documents of length 1, long documents, a rank with no documents (the last, at np > 1);
// - grouped-query heads (H 4, Hkv 2);
// - a plan that disagrees between ranks is LOOM_ERR_CORRUPT on the ranks that see it, without a
//   hang; a plan that leaves a row out is LOOM_ERR_INVALID_ARG; outputs that share memory
//   (dk and dv, lse and out) are LOOM_ERR_INVALID_ARG before any message; the ship or finish
//   request of an executor destroyed before it completed is LOOM_ERR_STATE, not a read of freed
//   memory; overlapping tasks are named, and neither the plan check nor a pair of 100,000 tasks
//   costs time quadratic in the tasks.

#define OK(call)                                                                                   \
  do {                                                                                             \
    loom_status_t ok_status_ = (call);                                                             \
    CHECK(ok_status_ == LOOM_OK, "%s: %s", loom_strerror(ok_status_), loom_last_error(NULL));      \
  } while (0)

enum { H = 4, HKV = 2, D = 8 };
static int world_rank, world_size;

typedef struct docset {
  int n;
  loom_attn_doc_t d[64];
} docset_t;

static docset_t make_docs(int variant) {
  docset_t s = {0};
  static const int64_t lens[] = {1, 7, 150, 33, 2, 64, 90, 1};
  test_rng_t rng = test_rng(4000u + (uint64_t)variant);
  const int owners = world_size > 1 ? world_size - 1 : 1; // the last rank owns nothing
  const int n = variant == 1 ? 1 : 3 * world_size + 2;
  for (int i = 0; i < n && i < 64; i++) {
    s.d[s.n++] = (loom_attn_doc_t){(int)test_int(&rng, 0, owners - 1),
                                   variant == 1 ? 300 : lens[test_int(&rng, 0, 7)]};
  }
  return s;
}

// Plans: 0 each document on its owner; 1 three shards each, servers round robin; 2 everything on
// rank 0; 3 shards of ~40 rows spread over every rank; 4 the attention balancer's (CAD) plan,
// shards of at least 8 rows (causal as the case), every rank serving.
static int make_plan(const docset_t *s, int kind, int causal, loom_attn_task_t *t) {
  int n = 0;
  if (kind == 4) {
    loom_attn_balance_opts_t o;
    loom_attn_balance_opts_init(&o);
    o.tolerance = 0.05;
    o.min_shard = 8;
    o.causal = causal;
    loom_attn_plan_t p = {0};
    OK(loom_attn_balance(s->d, s->n, world_size, &o, &p));
    for (int i = 0; i < p.ntasks && i < 4096; i++) {
      t[n++] = p.tasks[i];
    }
    // (so that the case keeps covering documents cut across servers: at np > 1 the last rank
    // owns nothing, and the balancer must cut something to give it a share)
    CHECK(world_size == 1 || n > s->n, "plan 4: the balancer cut no document (%d tasks, %d docs)",
          n, s->n);
    loom_attn_plan_free(&p);
    return n;
  }
  for (int i = 0; i < s->n; i++) {
    const int64_t L = s->d[i].len;
    const int owner = s->d[i].owner;
    if (kind == 0 || kind == 2 || L < 3) {
      t[n++] = (loom_attn_task_t){i, 0, L, owner, kind == 2 ? 0 : owner};
    } else if (kind == 1) {
      const int64_t cut[4] = {0, L / 3, 2 * L / 3, L};
      for (int k = 0; k < 3; k++) {
        t[n++] = (loom_attn_task_t){i, cut[k], cut[k + 1], owner, (owner + k + i) % world_size};
      }
    } else {
      for (int64_t lo = 0, k = 0; lo < L; lo += 40, k++) {
        t[n++] = (loom_attn_task_t){i, lo, lo + 40 < L ? lo + 40 : L, owner,
                                    (int)((owner + k) % world_size)};
      }
    }
  }
  return n;
}

static loom_attn_exec_t *kept[2][2]; // an executor per causal and scale, replanned by later cases

static double rel_err(const float *a, const float *b, int64_t n) {
  double big = 1e-3, worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(b[i]) && a[i] == b[i]) {
      continue;
    }
    const double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) { // fmax would drop it: a NaN (or inf against a finite value) is never close
      return INFINITY;
    }
    big = fmax(big, fabs((double)b[i]));
    worst = fmax(worst, d);
  }
  return worst / big;
}

static void run_case(const loom_group_t *g, int variant, int kind, int causal, int si) {
  const float scale = si ? 0.25f : 0.0f;
  docset_t s = make_docs(variant);
  loom_attn_task_t tasks[4096];
  const int nt = make_plan(&s, kind, causal, tasks);
  int64_t rows = 0, nmine = 0;
  int32_t cu[65] = {0};
  for (int i = 0; i < s.n; i++) {
    if (s.d[i].owner == world_rank) {
      rows += s.d[i].len;
      cu[++nmine] = (int32_t)rows;
    }
  }
  int64_t sq[3] = {rows, H, D}, sk[3] = {rows, HKV, D}, sl[2] = {H, rows}, sc[1] = {nmine + 1};
  loom_tensor_t q = test_tensor_f32(3, sq, "q"), k = test_tensor_f32(3, sk, "k");
  loom_tensor_t v = test_tensor_f32(3, sk, "v"), ro = test_tensor_f32(3, sq, "ro");
  loom_tensor_t rl = test_tensor_f32(2, sl, "rl"), dout = test_tensor_f32(3, sq, "dout");
  test_guarded_t go = test_guarded_f32(3, sq, "o"), gl = test_guarded_f32(2, sl, "l");
  test_guarded_t gdq = test_guarded_f32(3, sq, "dq"), gdk = test_guarded_f32(3, sk, "dk");
  test_guarded_t gdv = test_guarded_f32(3, sk, "dv");
  loom_tensor_t o = go.t, l = gl.t, dq = gdq.t, dk = gdk.t, dv = gdv.t;
  // Inside the sentinels, NaN (the sentinel itself is a float so small that a sum onto it, or
  // onto zeros, passes for a sum onto nothing).
  test_fill_value(test_floats(&o), rows * H * D, NAN);
  test_fill_value(test_floats(&l), H * rows, NAN);
  test_fill_value(test_floats(&dq), rows * H * D, NAN);
  test_fill_value(test_floats(&dk), rows * HKV * D, NAN);
  test_fill_value(test_floats(&dv), rows * HKV * D, NAN);
  loom_tensor_t rdq = test_tensor_f32(3, sq, "rdq");
  loom_tensor_t rdk = test_tensor_f32(3, sk, "rdk"), rdv = test_tensor_f32(3, sk, "rdv");
  loom_tensor_t cut;
  OK(loom_tensor_wrap(&cut, cu, LOOM_I32, LOOM_DEVICE_HOST, 1, sc, "cu"));
  test_rng_t rng = test_rng(77u + 13u * (uint64_t)world_rank);
  test_fill_uniform(&rng, test_floats(&q), rows * H * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&k), rows * HKV * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&v), rows * HKV * D, -1, 1);
  test_fill_uniform(&rng, test_floats(&dout), rows * H * D, -1, 1);
  OK(loom_attention_forward(&ro, &rl, &q, &k, &v, &cut, &cut, causal, scale));
  OK(loom_attention_backward(&rdq, &rdk, &rdv, &dout, &q, &k, &v, &ro, &rl, &cut, &cut, causal,
                             scale));
  loom_attn_exec_t *x = NULL;
  // Every other case replans the executor the previous cases used (kept per causal), so that
  // replanning is checked over plans whose batches grow and shrink.
  const int replan = (variant + kind) % 2 == 1 && kept[causal][si];
  if (replan) {
    x = kept[causal][si];
    kept[causal][si] = NULL;
    OK(loom_attn_exec_replan(x, s.d, s.n, tasks, nt));
  } else {
    OK(loom_attn_exec_create(g, s.d, s.n, tasks, nt, H, HKV, D, causal, scale, &x));
  }
  if (x) {
    OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
    OK(loom_attn_exec_backward(x, &dout, &dq, &dk, &dv));
    const char *what[5] = {"out", "lse", "dq", "dk", "dv"};
    const loom_tensor_t *got[5] = {&o, &l, &dq, &dk, &dv}, *want[5] = {&ro, &rl, &rdq, &rdk, &rdv};
    for (int i = 0; i < 5; i++) {
      double e = rel_err(test_floats(got[i]), test_floats(want[i]), loom_tensor_numel(got[i]));
      CHECK(e <= 1e-5, "variant %d plan %d causal %d scale %g: %s off by %g", variant, kind, causal,
            (double)scale, what[i], e);
    }
    const test_guarded_t *gg[5] = {&go, &gl, &gdq, &gdk, &gdv};
    for (int i = 0; i < 5; i++) {
      CHECK(test_guards_intact(gg[i]), "variant %d plan %d causal %d: a write before or past %s",
            variant, kind, causal, what[i]);
    }
    loom_attn_exec_stats_t st;
    loom_attn_exec_stats(x, &st);
    double served = st.tasks_served, total = 0;
    MPI_Allreduce(&served, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    CHECK(total == nt, "%g tasks served, the plan has %d", total, nt);
    // The calls' time holds their kernels and waits (the same clock, nested).
    CHECK(st.busy_ms > 0 && st.busy_ms >= st.compute_ms + st.wait_ms - 1e-3,
          "busy %.4f ms < kernels %.4f + waits %.4f", st.busy_ms, st.compute_ms, st.wait_ms);
    CHECK(kind != 2 || world_rank == 0 || st.tasks_served == 0, "plan 2: rank %d served %d",
          world_rank, st.tasks_served);
    // The balancer's plan gives the last rank (which owns nothing) work to serve.
    CHECK(kind != 4 || world_size == 1 || world_rank != world_size - 1 || st.tasks_served > 0,
          "plan 4 (balanced): the last rank, owning nothing, serves nothing");
  }
  loom_attn_exec_destroy(kept[causal][si]);
  kept[causal][si] = x;
  TEST_FREE(&q, &k, &v, &ro, &rl, &dout, &rdq, &rdk, &rdv);
  test_guarded_t *all[5] = {&go, &gl, &gdq, &gdk, &gdv};
  for (int i = 0; i < 5; i++) {
    test_guarded_free(all[i]);
  }
}

// Rows of the documents of s that this rank owns and that pass keep (index parity), packed.
static int64_t own_rows(const docset_t *s, int parity, int32_t *cu, int *ncu) {
  int64_t rows = 0;
  *ncu = 0;
  cu[0] = 0;
  for (int i = 0; i < s->n; i++) {
    if (s->d[i].owner == world_rank && i % 2 == parity) {
      rows += s->d[i].len;
      cu[++*ncu] = (int32_t)rows;
    }
  }
  return rows;
}

// Ping-pong through the step scheduler: the documents alternately in nano-batches A and B, each
// with its own plan and executor, the forward of both as the six tasks of
// loom_sched_add_attn_pingpong, run for two steps (the second replans nothing: a replay), equal
// to local attention on each nano-batch; the timeline has the six tasks on their lanes.
static void run_pingpong(const loom_group_t *g, loom_ctx_t *ctx, int kind, int causal,
                         const char *prefix) {
  char timeline[256] = "";
  if (prefix) {
    snprintf(timeline, sizeof timeline, "%s%%r.json", prefix);
  }
  docset_t s = make_docs(0), half[2] = {{0}, {0}};
  for (int i = 0; i < s.n; i++) {
    half[i % 2].d[half[i % 2].n++] = s.d[i];
  }
  loom_attn_task_t tasks[2][4096];
  loom_attn_nano_t nano[2];
  loom_tensor_t t[2][7]; // q k v out lse ref_out ref_lse
  loom_sched_opts_t so = {.timeline = timeline};
  loom_sched_t *sc = NULL;
  OK(loom_sched_create(ctx, &so, &sc));
  test_rng_t rng = test_rng(500u + 7u * (uint64_t)world_rank);
  for (int h = 0; h < 2; h++) {
    docset_t *d = &half[h];
    const int nt = make_plan(d, kind, causal, tasks[h]);
    int32_t cu[65];
    int ncu = 0;
    const int64_t rows = own_rows(&s, h, cu, &ncu); // the same rows as d's, in the same order
    int64_t sq[3] = {rows, H, D}, sk[3] = {rows, HKV, D}, sl[2] = {H, rows}, sc1[1] = {ncu + 1};
    t[h][0] = test_tensor_f32(3, sq, "q");
    t[h][1] = test_tensor_f32(3, sk, "k");
    t[h][2] = test_tensor_f32(3, sk, "v");
    t[h][3] = test_tensor_f32(3, sq, "out");
    t[h][4] = test_tensor_f32(2, sl, "lse");
    t[h][5] = test_tensor_f32(3, sq, "ref_out");
    t[h][6] = test_tensor_f32(2, sl, "ref_lse");
    test_fill_uniform(&rng, test_floats(&t[h][0]), rows * H * D, -1, 1);
    test_fill_uniform(&rng, test_floats(&t[h][1]), rows * HKV * D, -1, 1);
    test_fill_uniform(&rng, test_floats(&t[h][2]), rows * HKV * D, -1, 1);
    loom_tensor_t cut;
    OK(loom_tensor_wrap(&cut, cu, LOOM_I32, LOOM_DEVICE_HOST, 1, sc1, "cu"));
    OK(loom_attention_forward(&t[h][5], &t[h][6], &t[h][0], &t[h][1], &t[h][2], &cut, &cut, causal,
                              0.0f));
    nano[h] = (loom_attn_nano_t){NULL, &t[h][0], &t[h][1], &t[h][2], &t[h][3], &t[h][4]};
    OK(loom_attn_exec_create(g, d->d, d->n, tasks[h], nt, H, HKV, D, causal, 0.0f, &nano[h].x));
  }
  int ids[6];
  OK(loom_sched_add_attn_pingpong(sc, nano, -1, 0, "attn", ids));
  for (int step = 0; step < 2 && nano[0].x && nano[1].x; step++) {
    for (int h = 0; h < 2; h++) {
      if (loom_tensor_bytes(&t[h][3]) > 0) { // (a rank without rows has no buffer)
        memset(t[h][3].data, 0, loom_tensor_bytes(&t[h][3]));
      }
    }
    OK(loom_sched_run(sc));
    for (int h = 0; h < 2; h++) {
      double eo =
          rel_err(test_floats(&t[h][3]), test_floats(&t[h][5]), loom_tensor_numel(&t[h][3]));
      double el =
          rel_err(test_floats(&t[h][4]), test_floats(&t[h][6]), loom_tensor_numel(&t[h][4]));
      CHECK(eo <= 1e-5 && el <= 1e-5,
            "ping-pong plan %d causal %d step %d nano %c: out off by %g, "
            "lse by %g",
            kind, causal, step, 'A' + h, eo, el);
    }
  }
  OK(loom_sched_destroy(sc));
  for (int h = 0; h < 2; h++) {
    loom_attn_exec_destroy(nano[h].x);
    for (int i = 0; i < 7; i++) {
      loom_tensor_t *one = &t[h][i];
      test_free_tensors(&one, 1);
    }
  }
  if (prefix) { // every task of the ping-pong is on the timeline, on its lane
    char path[256];
    snprintf(path, sizeof path, "%s%d.json", prefix, world_rank);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "no timeline at %s", path);
    static char buf[1 << 20];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f) {
      fclose(f);
    }
    const char *names[6] = {"attn.ship.A",    "attn.ship.B",   "attn.compute.A",
                            "attn.compute.B", "attn.finish.A", "attn.finish.B"};
    for (int i = 0; i < 6; i++) {
      char want[64];
      snprintf(want, sizeof want, "\"name\":\"%s\",\"cat\":\"%s\"", names[i],
               i / 2 == 1 ? "compute" : "comm");
      CHECK(strstr(buf, want) != NULL, "the timeline %s lacks %s", path, want);
    }
    remove(path);
  }
}

// The plan check: overlapping tasks whose rows add up to the document (with a gap) are refused,
// naming both; and it takes O(n log n), not a comparison of every pair of tasks: 200,000 tasks
// (one row each, one document) are created and replanned in well under a second (was: 2 10^10
// comparisons, minutes).
static void test_plan_check(const loom_group_t *g) {
  loom_attn_doc_t d1[1] = {{0, 10}};
  loom_attn_task_t ov[3] = {{0, 4, 10, 0, 0}, {0, 0, 2, 0, 0}, {0, 3, 5, 0, 0}}; // 6 + 2 + 2
  loom_attn_exec_t *x = NULL;
  loom_status_t st = loom_attn_exec_create(g, d1, 1, ov, 3, H, HKV, D, 1, 0.0f, &x);
  CHECK(st == LOOM_ERR_INVALID_ARG && !x &&
            strstr(loom_last_error(NULL), "tasks 0 and 2 overlap in document 0"),
        "overlapping tasks gave %s (%s)", loom_strerror(st), loom_last_error(NULL));
  enum { N = 200000 };
  loom_attn_doc_t big[1] = {{0, N}};
  loom_attn_task_t *t = malloc(sizeof *t * N);
  CHECK(t != NULL, "out of memory");
  if (!t) {
    return;
  }
  for (int i = 0; i < N; i++) { // reversed: the sort has work to do
    t[i] = (loom_attn_task_t){0, N - 1 - i, N - i, 0, 0};
  }
  const double t0 = MPI_Wtime();
  OK(loom_attn_exec_create(g, big, 1, t, N, 1, 1, 1, 1, 0.0f, &x));
  if (x) {
    OK(loom_attn_exec_replan(x, big, 1, t, N));
  }
  const double s = MPI_Wtime() - t0;
  CHECK(s < 10.0, "create and replan of %d tasks took %.1f s", N, s);
  loom_attn_exec_destroy(x);
  x = NULL;
  // 100,000 documents of one row, rank 0's, all served by the last rank: one (owner, server) pair
  // of 100,000 tasks and key/value prefixes. Its layout and the server's batch look each task up
  // in O(1) (was: a search of the pair per task, minutes). A one-row document's output is its v.
  enum { M = 100000 };
  loom_attn_doc_t *md = malloc(sizeof *md * M);
  CHECK(md != NULL, "out of memory");
  for (int i = 0; md && i < M; i++) {
    md[i] = (loom_attn_doc_t){0, 1};
    t[i] = (loom_attn_task_t){i, 0, 1, 0, world_size - 1};
  }
  const int64_t rows = world_rank == 0 ? M : 0;
  int64_t sq[3] = {rows, 1, 1}, sl[2] = {1, rows};
  loom_tensor_t q = test_tensor_f32(3, sq, "q"), k = test_tensor_f32(3, sq, "k");
  loom_tensor_t v = test_tensor_f32(3, sq, "v"), o = test_tensor_f32(3, sq, "o");
  loom_tensor_t l = test_tensor_f32(2, sl, "l"), dq = test_tensor_f32(3, sq, "dq");
  loom_tensor_t dk = test_tensor_f32(3, sq, "dk"), dv = test_tensor_f32(3, sq, "dv");
  test_rng_t rng = test_rng(17u);
  test_fill_uniform(&rng, test_floats(&q), rows, -1, 1);
  test_fill_uniform(&rng, test_floats(&k), rows, -1, 1);
  test_fill_uniform(&rng, test_floats(&v), rows, -1, 1);
  const double t1 = MPI_Wtime();
  if (md) {
    OK(loom_attn_exec_create(g, md, M, t, M, 1, 1, 1, 1, 0.0f, &x));
  }
  if (x) {
    OK(loom_attn_exec_forward(x, &q, &k, &v, &o, &l));
    OK(loom_attn_exec_backward(x, &o, &dq, &dk, &dv));
  }
  const double s2 = MPI_Wtime() - t1;
  CHECK(s2 < 10.0, "%d one-row documents on one server took %.1f s", M, s2);
  CHECK(test_same_bits(test_floats(&o), test_floats(&v), rows),
        "a one-row document's output is not its v");
  loom_attn_exec_destroy(x);
  TEST_FREE(&q, &k, &v, &o, &l, &dq, &dk, &dv);
  free(md);
  free(t);
}

static void test_errors(const loom_group_t *g) {
  // A plan whose message between two ranks would pass MPI's int count: refused on every rank at
  // create, before any traffic (nothing of its size is allocated).
  if (world_size > 1) {
    loom_attn_doc_t big[1] = {{0, (int64_t)20 << 20}};
    loom_attn_task_t bt[1] = {{0, 0, (int64_t)20 << 20, 0, 1}};
    loom_attn_exec_t *bx = NULL;
    loom_status_t st = loom_attn_exec_create(g, big, 1, bt, 1, H, HKV, D, 1, 0.0f, &bx);
    CHECK(st == LOOM_ERR_UNSUPPORTED && !bx && strstr(loom_last_error(NULL), "2^31 - 1"),
          "rank %d: a plan with a message over 2 GiB gave %s (%s)", world_rank, loom_strerror(st),
          loom_last_error(NULL));
  }
  // Outputs that share memory (dk and dv one tensor, lse inside out): refused before anything
  // travels, as loom_attention_backward does (was: silently dk + dv in both). Every rank owns a
  // document and passes the same tensors, so every rank refuses (a rank whose own call is
  // fine would wait for its peers' messages). Each document's second half is served by the
  // next rank.
  {
    loom_attn_doc_t ad[64];
    loom_attn_task_t at[128];
    for (int r = 0; r < world_size && r < 64; r++) {
      ad[r] = (loom_attn_doc_t){r, 10};
      at[2 * r] = (loom_attn_task_t){r, 0, 5, r, r};
      at[2 * r + 1] = (loom_attn_task_t){r, 5, 10, r, (r + 1) % world_size};
    }
    int64_t rq[3] = {10, H, D}, rk[3] = {10, HKV, D}, rl[2] = {H, 10};
    loom_tensor_t q = test_tensor_f32(3, rq, "q"), k = test_tensor_f32(3, rk, "k");
    loom_tensor_t v = test_tensor_f32(3, rk, "v"), o = test_tensor_f32(3, rq, "o");
    loom_tensor_t l = test_tensor_f32(2, rl, "l"), dq = test_tensor_f32(3, rq, "dq");
    loom_tensor_t dk = test_tensor_f32(3, rk, "dk"), dv = test_tensor_f32(3, rk, "dv");
    test_rng_t rng = test_rng(91u);
    test_fill_uniform(&rng, test_floats(&q), 10 * H * D, -1, 1);
    test_fill_uniform(&rng, test_floats(&k), 10 * HKV * D, -1, 1);
    test_fill_uniform(&rng, test_floats(&v), 10 * HKV * D, -1, 1);
    loom_attn_exec_t *ax = NULL;
    OK(loom_attn_exec_create(g, ad, world_size, at, 2 * world_size, H, HKV, D, 1, 0.0f, &ax));
    if (ax) {
      loom_tensor_t lo = o; // lse's H x 10 floats at the start of out's
      lo.ndim = 2;
      lo.shape[0] = H;
      lo.shape[1] = 10;
      loom_status_t st = loom_attn_exec_forward(ax, &q, &k, &v, &o, &lo);
      CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "lse"),
            "lse inside out gave %s (%s)", loom_strerror(st), loom_last_error(NULL));
      OK(loom_attn_exec_forward(ax, &q, &k, &v, &o, &l));
      st = loom_attn_exec_backward(ax, &o, &dq, &dk, &dk);
      CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "dv"),
            "dv = dk gave %s (%s)", loom_strerror(st), loom_last_error(NULL));
      // The executor still works: the refusals came before any message.
      OK(loom_attn_exec_backward(ax, &o, &dq, &dk, &dv));
    }
    loom_attn_exec_destroy(ax);
    TEST_FREE(&q, &k, &v, &o, &l, &dq, &dk, &dv);
  }
  // An executor destroyed while its ship or finish request is in flight: waiting for the request
  // afterwards is LOOM_ERR_STATE naming the order to use (was: a read of the freed executor).
  // Every document on its owner: no rank waits for another's messages.
  {
    loom_attn_doc_t all[64];
    loom_attn_task_t allt[64];
    for (int r = 0; r < world_size && r < 64; r++) {
      all[r] = (loom_attn_doc_t){r, 6};
      allt[r] = (loom_attn_task_t){r, 0, 6, r, r};
    }
    int64_t rq[3] = {6, H, D}, rk[3] = {6, HKV, D}, rl[2] = {H, 6};
    loom_tensor_t q = test_tensor_f32(3, rq, "q"), k = test_tensor_f32(3, rk, "k");
    loom_tensor_t v = test_tensor_f32(3, rk, "v"), o = test_tensor_f32(3, rq, "o");
    loom_tensor_t l = test_tensor_f32(2, rl, "l");
    for (int which = 0; which < 2; which++) { // 0: the ship's request, 1: the finish's
      loom_attn_exec_t *ax = NULL;
      loom_request_t *req = NULL;
      OK(loom_attn_exec_create(g, all, world_size, allt, world_size, H, HKV, D, 1, 0.0f, &ax));
      if (!ax) {
        continue;
      }
      if (which == 0) {
        OK(loom_attn_exec_ship_start(ax, &q, &k, &v, &req));
      } else {
        OK(loom_attn_exec_ship(ax, &q, &k, &v));
        OK(loom_attn_exec_compute(ax));
        OK(loom_attn_exec_finish_start(ax, &o, &l, &req));
      }
      loom_attn_exec_destroy(ax);
      loom_status_t st = loom_wait(&req);
      CHECK(st == LOOM_ERR_STATE && strstr(loom_last_error(NULL), "destroy") && !req,
            "waiting for the %s of a destroyed executor gave %s (%s)", which ? "finish" : "ship",
            loom_strerror(st), loom_last_error(NULL));
    }
    // Ship requests of earlier forwards never waited for: a later shipment retires them (a wait
    // returns OK at once), and destroy detaches every one, not only the newest (was: the older
    // one kept the freed executor, and a wait for it read freed memory).
    loom_attn_exec_t *ax = NULL;
    OK(loom_attn_exec_create(g, all, world_size, allt, world_size, H, HKV, D, 1, 0.0f, &ax));
    if (ax) {
      loom_request_t *ship[3] = {NULL, NULL, NULL};
      for (int f = 0; f < 3; f++) {
        OK(loom_attn_exec_ship_start(ax, &q, &k, &v, &ship[f]));
        OK(loom_attn_exec_compute(ax));
        OK(loom_attn_exec_finish(ax, &o, &l));
      }
      OK(loom_wait(&ship[1])); // retired by the third shipment
      CHECK(!ship[1], "a retired ship request was not released by its wait");
      loom_attn_exec_destroy(ax);
      for (int f = 0; f < 3; f += 2) {
        loom_status_t st = loom_wait(&ship[f]);
        CHECK(st == LOOM_ERR_STATE && strstr(loom_last_error(NULL), "destroy") && !ship[f],
              "waiting for forward %d's ship request after destroy gave %s (%s)", f,
              loom_strerror(st), loom_last_error(NULL));
      }
    }
    TEST_FREE(&q, &k, &v, &o, &l);
  }
  // The row cost measurement: a small shape measures (>= 0), one too wide for its nine batches
  // is refused before any allocation (was: 150 GB asked for, and the OOM killer).
  {
    double cost = -1.0;
    OK(loom_attn_measure_row_cost(2, 1, 8, 1, &cost));
    CHECK(cost >= 0.0, "row cost of a small shape is %g", cost);
    loom_status_t st = loom_attn_measure_row_cost(4096, 4096, 4096, 1, &cost);
    CHECK(st == LOOM_ERR_INVALID_ARG &&
              strstr(loom_last_error(NULL), "divided by the same factor") && cost == 0.0,
          "4096 heads of 4096 gave %s (%s), cost %g", loom_strerror(st), loom_last_error(NULL),
          cost);
  }
  // A row left out.
  loom_attn_doc_t d[2] = {{0, 10}, {world_size - 1, 10}};
  loom_attn_task_t t[3] = {{0, 0, 10, 0, 0}, {1, 0, 9, world_size - 1, 0}};
  loom_attn_exec_t *x = NULL;
  CHECK(loom_attn_exec_create(g, d, 2, t, 2, H, HKV, D, 1, 0.0f, &x) == LOOM_ERR_INVALID_ARG && !x,
        "a plan missing a row was accepted");
  if (world_size != 2) { // the mismatch below is written for two ranks
    return;
  }
  // Ranks disagree: rank 1 believes its document is cut in two, rank 0 that it is one task
  // served by rank 0; rank 0 sees a message of the wrong size, and rank 1 the failure notice.
  loom_attn_doc_t dd[2] = {{0, 10}, {1, 10}};
  loom_attn_task_t mine[2] = {{0, 0, 10, 0, 0}, {1, 0, 10, 1, 0}};
  loom_attn_task_t other[3] = {{0, 0, 10, 0, 0}, {1, 0, 5, 1, 0}, {1, 5, 10, 1, 1}};
  int64_t r10[3] = {10, H, D}, k10[3] = {10, HKV, D}, l10[2] = {H, 10};
  loom_tensor_t q = test_tensor_f32(3, r10, "q"), k = test_tensor_f32(3, k10, "k");
  loom_tensor_t v = test_tensor_f32(3, k10, "v"), o = test_tensor_f32(3, r10, "o");
  loom_tensor_t l = test_tensor_f32(2, l10, "l");
  OK(loom_attn_exec_create(g, dd, 2, world_rank == 0 ? mine : other, world_rank == 0 ? 2 : 3, H,
                           HKV, D, 1, 0.0f, &x));
  loom_status_t st = x ? loom_attn_exec_forward(x, &q, &k, &v, &o, &l) : LOOM_ERR_INVALID_ARG;
  CHECK(st == LOOM_ERR_CORRUPT, "rank %d: a plan that disagrees gave %s (%s)", world_rank,
        loom_strerror(st), loom_last_error(NULL));
  // The executor is broken now: every phase says so (no read of a batch never computed).
  st = x ? loom_attn_exec_finish(x, &o, &l) : LOOM_ERR_STATE;
  CHECK(st == LOOM_ERR_STATE, "rank %d: finish after a failed phase gave %s", world_rank,
        loom_strerror(st));
  st = x ? loom_attn_exec_ship(x, &q, &k, &v) : LOOM_ERR_STATE;
  CHECK(st == LOOM_ERR_STATE && strstr(loom_last_error(NULL), "destroy it"),
        "rank %d: a ship after a failed phase gave %s (%s)", world_rank, loom_strerror(st),
        loom_last_error(NULL));
  loom_attn_exec_destroy(x);
  // The same disagreement with the phases called one by one: rank 0 fails in compute, and its
  // finish must not read the batch it never computed.
  x = NULL;
  OK(loom_attn_exec_create(g, dd, 2, world_rank == 0 ? mine : other, world_rank == 0 ? 2 : 3, H,
                           HKV, D, 1, 0.0f, &x));
  if (x) {
    loom_status_t s1 = loom_attn_exec_ship(x, &q, &k, &v);
    loom_status_t s2 = s1 == LOOM_OK ? loom_attn_exec_compute(x) : s1;
    loom_status_t s3 = loom_attn_exec_finish(x, &o, &l);
    CHECK(s1 == LOOM_OK && (s2 == LOOM_ERR_CORRUPT || s3 == LOOM_ERR_CORRUPT) && s3 != LOOM_OK,
          "rank %d: phases by hand on a disagreeing plan gave %s, %s, %s", world_rank,
          loom_strerror(s1), loom_strerror(s2), loom_strerror(s3));
  }
  loom_attn_exec_destroy(x);
  TEST_FREE(&q, &k, &v, &o, &l);
}

int main(int argc, char **argv) {
  loom_ctx_t *ctx = NULL;
  if (loom_init(&argc, &argv, NULL, &ctx) != LOOM_OK) {
    fprintf(stderr, "loom_init failed: %s\n", loom_last_error(NULL));
    return 1;
  }
  world_rank = loom_rank(ctx);
  world_size = loom_size(ctx);
  const loom_group_t *g = loom_group(ctx, LOOM_GROUP_WORLD);
  for (int si = 0; si < 2; si++) { // the default scale, then 0.25
    for (int causal = 1; causal >= 0; causal--) {
      for (int kind = 0; kind < 5; kind++) {
        run_case(g, 0, kind, causal, si);
      }
      run_case(g, 1, 3, causal, si); // one long document cut over every rank
      run_case(g, 1, 4, causal, si); // the same, cut by the balancer
    }
  }
  for (int kind = 0; kind < 4; kind++) {
    char tl[128];
    snprintf(tl, sizeof tl, "/tmp/loom_test_attn_pp_%d_", (int)getppid());
    run_pingpong(g, ctx, kind, kind % 2, kind == 1 ? tl : NULL); // the timeline of one case
  }
  for (int i = 0; i < 4; i++) {
    loom_attn_exec_destroy(kept[i / 2][i % 2]);
  }
  test_errors(g);
  test_plan_check(g);
  int rc = check_exit_all("test_attn");
  loom_finalize(ctx);
  return rc;
}
