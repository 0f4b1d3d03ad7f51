/* test_sim.c — loom_sim: the profile file round-trips and its loader rejects damaged bytes, the
 * cluster parser, the model's invariants (one rank, links, overlap, servers), and --ranks. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../check.h"
#include "loom_moe.h"
#include "loom_sim.h"
#include "../quiet.h"

static char dir[64];

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL, "cannot write %s", path);
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static char *read_all(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  char *buf = NULL;
  if (f && fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
    buf = malloc((size_t)*len + 1);
    if (buf && fread(buf, 1, (size_t)*len, f) != (size_t)*len) {
      free(buf);
      buf = NULL;
    }
  }
  if (f) {
    fclose(f);
  }
  return buf;
}

// A profile like train_gpt's: 4 gradients, two codecs, documents of skewed lengths, MoE.
static void make_profile(loom_sim_profile_t *p, loom_plan_tensor_t *t, loom_codec_cost_t *c,
                         int64_t *docs, int moe) {
  static const char *const names[4] = {"grad.head", "grad.h1", "grad.h0", "grad.embed"};
  memset(p, 0, sizeof *p);
  p->np = 1;
  p->tokens = 1024;
  p->ctx = 256;
  p->compute_ms = 40.0;
  p->step_ms = 41.0;
  p->overhead_ms = 0.5;
  p->attn_ms = 8.0;
  p->attn_pairs = 1e5;
  p->attn_q_bytes = 4128;
  p->attn_kv_bytes = 4096;
  for (int i = 0; i < 4; i++) {
    t[i] = (loom_plan_tensor_t){.name = names[i], .n = 250000, .ready_us = 15000.0 + 8000.0 * i};
  }
  p->ntensors = 4;
  p->tensors = t;
  c[0] = (loom_codec_cost_t){
      .compressor = "fp16", .enc_ns = 0.2, .dec_ns = 0.3, .bytes_per_value = 2, .fixed_bytes = 16};
  c[1] = (loom_codec_cost_t){
      .compressor = "int8", .enc_ns = 0.3, .dec_ns = 0.5, .bytes_per_value = 1, .fixed_bytes = 20};
  p->ncodecs = 2;
  p->codecs = c;
  uint64_t s = 7;
  for (int i = 0; i < 200; i++) { // a heavy tail: mostly short, a few long
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    docs[i] = (s >> 60) == 0 ? 256 : 8 + (int64_t)((s >> 33) % 60);
  }
  p->ndocs = 200;
  p->docs = docs;
  if (moe) {
    p->moe_layers = 2;
    p->moe_experts = 8;
    p->moe_topk = 2;
    p->moe_hidden = 128;
    p->moe_ms = 10.0;
    p->moe_fine_hidden = 0.85;
  }
}

static loom_sim_cluster_t cluster(int nodes, int rpn, int cores, double gbps, int shared) {
  loom_sim_cluster_t c = {.nodes = nodes, .ranks_per_node = rpn, .cores_per_node = cores};
  snprintf(c.name, sizeof c.name, "test");
  c.intra = (loom_link_t){.alpha_us = 2, .gbps = gbps};
  c.inter = (loom_link_t){.alpha_us = 5, .gbps = gbps / 4};
  c.intra_shared = shared;
  c.inter_shared = 1;
  return c;
}

static void test_roundtrip_and_damage(void) {
  loom_sim_profile_t p, q;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t c[2];
  int64_t docs[200];
  make_profile(&p, t, c, docs, 1);
  p.attn_row_cost = 12.5;
  p.attn_exchange_ms = 1.75;
  // Two routed steps of 8 experts, distinct loads (a load written from the wrong step or
  // expert reads back different).
  double load[16];
  for (int i = 0; i < 16; i++) {
    load[i] = 3.0 * i + 1.0;
  }
  p.moe_steps = 2;
  p.moe_load = load;
  c[0].enc_us = 1.5; // (every codec cost distinct: a field parsed into another reads back wrong)
  c[0].dec_us = 2.25;
  c[1].enc_us = 3.5;
  c[1].dec_us = 4.75;
  char path[128], bad[128];
  path_of(path, sizeof path, "p.txt");
  path_of(bad, sizeof bad, "bad.txt");
  CHECK(loom_sim_profile_save(path, &p) == LOOM_OK, "save: %s", loom_last_error(NULL));
  CHECK(loom_sim_profile_load(path, &q) == LOOM_OK, "load: %s", loom_last_error(NULL));
  CHECK(q.np == 1 && q.tokens == 1024 && q.ctx == 256 && fabs(q.compute_ms - 40.0) < 1e-6 &&
            fabs(q.overhead_ms - 0.5) < 1e-6 && q.ntensors == 4 && q.ncodecs == 2 &&
            q.ndocs == 200 && q.moe_layers == 2 && q.moe_topk == 2,
        "the loaded profile differs from the saved one");
  CHECK(fabs(q.attn_row_cost - 12.5) < 1e-9 && fabs(q.attn_exchange_ms - 1.75) < 1e-9,
        "attn row cost %g (want 12.5), exchange %g ms (want 1.75)", q.attn_row_cost,
        q.attn_exchange_ms);
  // Every other field round-trips too (the text keeps these values exactly).
  CHECK(q.step_ms == p.step_ms && q.attn_ms == p.attn_ms && q.attn_pairs == p.attn_pairs &&
            q.attn_q_bytes == p.attn_q_bytes && q.attn_kv_bytes == p.attn_kv_bytes &&
            q.moe_experts == p.moe_experts && q.moe_hidden == p.moe_hidden &&
            q.moe_ms == p.moe_ms && q.moe_fine_hidden == p.moe_fine_hidden,
        "run, attn or moe fields differ: step %g attn %g pairs %g q %g kv %g experts %d hidden %d "
        "moe %g fine %g",
        q.step_ms, q.attn_ms, q.attn_pairs, q.attn_q_bytes, q.attn_kv_bytes, q.moe_experts,
        q.moe_hidden, q.moe_ms, q.moe_fine_hidden);
  CHECK(q.moe_steps == 2, "%d routed steps, want 2", q.moe_steps);
  for (int i = 0; i < 16 && q.moe_steps == 2; i++) {
    CHECK(q.moe_load[i] == load[i], "moe load %d: %g, want %g", i, q.moe_load[i], load[i]);
  }
  for (int i = 0; i < 2 && q.ncodecs == 2; i++) {
    const loom_codec_cost_t *a = &q.codecs[i], *b = &c[i];
    CHECK(!strcmp(a->compressor, b->compressor) && a->enc_us == b->enc_us &&
              fabs(a->enc_ns - b->enc_ns) < 1e-9 && a->dec_us == b->dec_us &&
              fabs(a->dec_ns - b->dec_ns) < 1e-9 && a->bytes_per_value == b->bytes_per_value &&
              a->fixed_bytes == b->fixed_bytes,
          "codec %d differs", i);
  }
  for (int i = 0; i < 4 && q.ntensors == 4; i++) {
    CHECK(!strcmp(q.tensors[i].name, t[i].name) && q.tensors[i].n == t[i].n &&
              fabs(q.tensors[i].ready_us - t[i].ready_us) < 1e-3,
          "tensor %d differs", i);
  }
  for (int i = 0; i < 200 && q.ndocs == 200; i++) {
    CHECK(q.docs[i] == docs[i], "doc %d: %lld vs %lld", i, (long long)q.docs[i],
          (long long)docs[i]);
  }
  CHECK(q.ncodecs == 2 && !strcmp(q.codecs[1].compressor, "int8") &&
            q.codecs[1].bytes_per_value == 1.0,
        "codec 1 differs");
  loom_sim_profile_free(&q);
  loom_sim_profile_free(&q); // twice is fine
  // Whole batches round-trip as batches (the simulator then draws a batch per rank).
  int ends[4] = {50, 100, 150, 200};
  p.nbatches = 4;
  p.batch_end = ends;
  CHECK(loom_sim_profile_save(path, &p) == LOOM_OK, "save batches: %s", loom_last_error(NULL));
  CHECK(loom_sim_profile_load(path, &q) == LOOM_OK, "load batches: %s", loom_last_error(NULL));
  CHECK(q.nbatches == 4 && q.ndocs == 200 && q.batch_end[1] == 100 && q.batch_end[3] == 200 &&
            q.docs[120] == docs[120],
        "batches: %d batches, %d docs", q.nbatches, q.ndocs);
  loom_sim_profile_free(&q);
  p.nbatches = 0;
  p.batch_end = NULL;
  // Every truncation is rejected (the 'end' line is required), and so is every single damaged
  // byte that breaks a number or a keyword, as corrupt, never a crash.
  long len = 0;
  char *text = read_all(path, &len);
  CHECK(text != NULL, "cannot read %s back", path);
  int rejected = 0, tried = 0;
  quiet_begin(); // every rejected file logs a warning (TEST_VERBOSE=1 shows them and failures)
  for (long cut = 0; text && cut < len - 4; cut += 7) {
    FILE *f = fopen(bad, "wb");
    fwrite(text, 1, (size_t)cut, f);
    fclose(f);
    loom_status_t st = loom_sim_profile_load(bad, &q);
    CHECK(st == LOOM_ERR_CORRUPT, "a profile cut at %ld of %ld bytes: status %d", cut, len, st);
    CHECK(q.ntensors == 0 && q.tensors == NULL, "a failed load left tensors");
    tried++;
  }
  for (long at = 0; text && at < len; at += 5) {
    char saved = text[at];
    text[at] = saved == '\n' ? 'x' : (saved >= '0' && saved <= '9') ? 'q' : '\x01';
    FILE *f = fopen(bad, "wb");
    fwrite(text, 1, (size_t)len, f);
    fclose(f);
    loom_status_t st = loom_sim_profile_load(bad, &q);
    rejected += st == LOOM_ERR_CORRUPT;
    CHECK(st == LOOM_OK || st == LOOM_ERR_CORRUPT, "byte %ld damaged: status %d", at, st);
    loom_sim_profile_free(&q);
    text[at] = saved;
  }
  quiet_end();
  CHECK(rejected > 0, "no damaged byte was rejected");
  quiet_begin();
  printf("test_sim: %d truncations rejected, %d damaged bytes rejected\n", tried, rejected);
  free(text);
  write_text(bad, "loom-profile 1\nrun 1 -5 128 10 10 0\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT, "negative tokens accepted");
  CHECK(strstr(loom_last_error(NULL), "tokens") != NULL, "the message does not name tokens: %s",
        loom_last_error(NULL));
  // An attn line of four fields (older profiles) means no row cost and no exchange time; an
  // exchange longer than the attention it is part of is corrupt, and says so.
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\nattn 2 100 16 16\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_OK && q.attn_row_cost == 0.0 &&
            q.attn_exchange_ms == 0.0,
        "a 4-field attn line: %s", loom_last_error(NULL));
  loom_sim_profile_free(&q);
  write_text(bad, "loom-profile 1\nrun 2 5 128 10 10 0\nattn 2 100 16 16 0 3\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT, "exchange 3 ms of 2 ms accepted");
  CHECK(strstr(loom_last_error(NULL), "exchange_ms") != NULL, "the message does not name it: %s",
        loom_last_error(NULL));
  // A batch line without lengths holds no batch, first or not: the sample that follows is a
  // sample (an empty first batch once made it a profile of one empty batch, the sample unused).
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\nbatch\ndocs 5 6 7\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_OK && q.ndocs == 3 && q.nbatches == 0,
        "an empty batch line, then docs: %d docs in %d batches (%s)", q.ndocs, q.nbatches,
        loom_last_error(NULL));
  loom_sim_profile_free(&q);
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\nbatch\nbatch 5 6\nbatch\nbatch 7\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_OK && q.ndocs == 3 && q.nbatches == 2 &&
            q.batch_end[0] == 2 && q.batch_end[1] == 3,
        "empty batch lines among batches: %d docs in %d batches", q.ndocs, q.nbatches);
  loom_sim_profile_free(&q);
  // Two records on one line (a line break turned into a space): the second was dropped as
  // trailing text; now the line is corrupt, naming what follows the first record's fields.
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\ntensor a 100 5 tensor b 200 6\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT &&
            strstr(loom_last_error(NULL), "line 3: 'tensor' after the fields of 'tensor'"),
        "two tensors on one line: %d tensors (%s)", q.ntensors, loom_last_error(NULL));
  loom_sim_profile_free(&q);
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\nattn 2 100 16 16 0 1 9\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT, "an attn line of 7 fields accepted");
  loom_sim_profile_free(&q);
  // A name with a space would save a profile its loader refuses: save refuses it, naming it.
  static const char *const spaced = "grad h0";
  loom_plan_tensor_t keep = t[1];
  t[1].name = spaced;
  CHECK(loom_sim_profile_save(bad, &p) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "tensor 1 is 'grad h0'"),
        "saved a tensor named 'grad h0': %s", loom_last_error(NULL));
  t[1] = keep;
  write_text(bad, "loom-profile 2\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT, "version 2 accepted");
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\nmoe 2 0 0 0 1 0.5\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT, "MoE layers without experts accepted");
  write_text(bad, "loom-profile 1\nrun 1 5 128 10 10 0\nmoe 2 4 8 64 1 0.5\nend\n");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_CORRUPT, "top-8 of 4 experts accepted");
  loom_sim_profile_free(&q);
  path_of(bad, sizeof bad, "missing.txt");
  CHECK(loom_sim_profile_load(bad, &q) == LOOM_ERR_SYSTEM, "a missing file is not SYSTEM");
  CHECK(loom_sim_profile_load(NULL, &q) == LOOM_ERR_INVALID_ARG, "NULL path accepted");
  quiet_end();
}

static void test_cluster_file(void) {
  char path[128];
  path_of(path, sizeof path, "c.cluster");
  loom_sim_cluster_t c;
  write_text(path, "# comment\nname x\nnodes 4\nranks_per_node 8\ncores_per_node 8\n"
                   "intra 1 100\ninter 5 25 shared\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_OK, "cluster: %s", loom_last_error(NULL));
  CHECK(c.nodes == 4 && c.ranks_per_node == 8 && c.inter.gbps == 25 && c.inter_shared &&
            !c.intra_shared && !strcmp(c.name, "x") && c.timeshare == 0.0,
        "cluster fields");
  write_text(path, "nodes 1\nranks_per_node 4\ncores_per_node 2\nintra 2 47\ntimeshare 0.048\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_OK && fabs(c.timeshare - 0.048) < 1e-12,
        "timeshare: %s", loom_last_error(NULL));
  // README's example, comments after the values included (they once stopped it: "'#' after
  // the link: only 'shared'").
  write_text(path, "name example-64x8-100g\nnodes 64\nranks_per_node 8\ncores_per_node 8\n"
                   "intra 1 100          # alpha_us Gbit/s inside a node\n"
                   "inter 5 100 shared   # between nodes; shared: the node's ranks split the NIC\n"
                   "timeshare 0          # optional: what sharing a core costs\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_OK && c.nodes == 64 && c.inter.gbps == 100 &&
            c.inter_shared && !c.intra_shared && !strcmp(c.name, "example-64x8-100g"),
        "README's cluster: %s", loom_last_error(NULL));
  quiet_begin();
  write_text(path, "nodes 1\nranks_per_node 4\ncores_per_node 2\nintra 2 47\ntimeshare -1\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_ERR_INVALID_ARG, "timeshare -1 accepted");
  write_text(path, "nodes 4\nranks_per_node 8\ncores_per_node 8\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_ERR_INVALID_ARG, "no intra link accepted");
  write_text(path, "nodes 4\nranks_per_node 8\ncores_per_node 8\nintra 1 0\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_ERR_INVALID_ARG, "0 Gbit/s accepted");
  write_text(path, "nodes 4\nranks_per_node 8\ncores_per_node 8\nintra 1 10 fast\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_ERR_INVALID_ARG, "'fast' accepted");
  write_text(path, "nodes 4 ranks_per_node 8\nranks_per_node 8\ncores_per_node 8\nintra 1 1\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "line 1: 'ranks_per_node' after the fields of 'nodes'"),
        "two keys on one line: %s", loom_last_error(NULL));
  write_text(path, "nodez 4\n");
  CHECK(loom_sim_cluster_load(path, &c) == LOOM_ERR_INVALID_ARG, "unknown key accepted");
  quiet_end();
  CHECK(strstr(loom_last_error(NULL), "nodez") != NULL, "the message does not name the key");
  // A line longer than the reader's buffer is refused, naming the line: its rest was once read
  // as a line of its own, so a long comment ending in "nodes 1000" set the node count.
  char *text = malloc(8192);
  int n = snprintf(text, 8192, "nodes 2\nranks_per_node 4\ncores_per_node 4\nintra 1 10\n# ");
  memset(text + n, 'x', 4093);
  snprintf(text + n + 4093, 8192 - (size_t)n - 4093, "nodes 1000\n");
  write_text(path, text);
  free(text);
  quiet_begin();
  loom_status_t lst = loom_sim_cluster_load(path, &c);
  quiet_end();
  CHECK(lst == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "line 5: longer than"),
        "a long comment line: status %d, %d nodes (%s)", (int)lst, c.nodes, loom_last_error(NULL));
  // Not a regular file (/dev/zero: an endless run of NUL lines, which the reader once looped
  // over forever): refused at once, naming the file and the fix, for the profile too.
  char zero[128];
  path_of(zero, sizeof zero, "zero.cluster");
  CHECK(symlink("/dev/zero", zero) == 0, "symlink %s -> /dev/zero failed", zero);
  quiet_begin();
  alarm(60); // (a reader that never ends fails the test instead of hanging it)
  loom_status_t st = loom_sim_cluster_load(zero, &c);
  alarm(0);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), zero) &&
            strstr(loom_last_error(NULL), "not a regular file") &&
            strstr(loom_last_error(NULL), "loom_sim --help"),
        "/dev/zero as the cluster: %s", loom_last_error(NULL));
  loom_sim_profile_t p;
  quiet_begin();
  alarm(60);
  st = loom_sim_profile_load(zero, &p);
  alarm(0);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), zero) &&
            strstr(loom_last_error(NULL), "not a regular file") &&
            strstr(loom_last_error(NULL), "train_gpt --profile"),
        "/dev/zero as the profile: %s", loom_last_error(NULL));
  unlink(zero);
  // A FIFO: refused before it is opened (opening it would wait for a writer).
  char fifo[128];
  path_of(fifo, sizeof fifo, "fifo.cluster");
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s failed", fifo);
  quiet_begin();
  alarm(60);
  st = loom_sim_cluster_load(fifo, &c);
  loom_status_t st2 = loom_sim_profile_load(fifo, &p);
  alarm(0);
  quiet_end();
  CHECK(st == LOOM_ERR_INVALID_ARG && st2 == LOOM_ERR_INVALID_ARG &&
            strstr(loom_last_error(NULL), "not a regular file"),
        "a FIFO as the cluster and the profile: %s", loom_last_error(NULL));
  unlink(fifo);
}

static double step(const loom_sim_profile_t *p, const loom_sim_cluster_t *c, int ranks, int grad,
                   int moe, int attn, loom_sim_result_t *r) {
  loom_sim_strategy_t s = {.grad = grad, .moe_overlap = moe, .attn_servers = attn, .ep_size = 0};
  loom_status_t st = loom_sim_predict(p, c, ranks, &s, 1, r);
  CHECK(st == LOOM_OK, "predict %d ranks: %s", ranks, loom_last_error(NULL));
  return st == LOOM_OK ? r->step_ms : NAN;
}

static void test_model(void) {
  loom_sim_profile_t p;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t cd[2];
  int64_t docs[200];
  make_profile(&p, t, cd, docs, 0);
  loom_sim_cluster_t c = cluster(64, 8, 8, 100, 0);
  loom_sim_result_t r, r2;
  // One rank: nothing to communicate, compute and overhead as profiled.
  double one = step(&p, &c, 1, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  CHECK(fabs(one - 40.5) < 1e-6 && r.grad_exposed_ms == 0.0 && r.attn_imbalance == 1.0,
        "one rank: step %.4f (want 40.5), exposed %.4f", one, r.grad_exposed_ms);
  // More ranks never run faster per step; a faster link never slows it.
  double prev = one;
  for (int ranks = 2; ranks <= 512; ranks *= 2) {
    double s = step(&p, &c, ranks, LOOM_SIM_GRAD_NONE, 0, 0, &r);
    // (the attention straggler is a Monte Carlo estimate: 2% of slack)
    CHECK(s >= 0.98 * prev, "%d ranks: %.4f ms < %.4f at half the ranks", ranks, s, prev);
    CHECK(r.attn_imbalance >= 1.0, "imbalance %.3f < 1", r.attn_imbalance);
    prev = s;
  }
  loom_sim_cluster_t slow = cluster(64, 8, 8, 1, 0);
  CHECK(step(&p, &slow, 64, LOOM_SIM_GRAD_NONE, 0, 0, &r) >
            step(&p, &c, 64, LOOM_SIM_GRAD_NONE, 0, 0, &r2),
        "a 1 Gbit/s cluster is not slower than a 100 Gbit/s one");
  // Nodes of 8: 12 ranks leave them unequal (8 and 4), and loom's float allreduce runs its flat
  // scheme across them, 8 x 2 x 4/12 = 5.33 tensors on the fuller node's link against the
  // hierarchical scheme's 2 x 15/16 = 1.88 at 16 ranks: more exposed communication with fewer
  // ranks.
  step(&p, &slow, 12, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  step(&p, &slow, 16, LOOM_SIM_GRAD_NONE, 0, 0, &r2);
  CHECK(r.grad_exposed_ms > 2.0 * r2.grad_exposed_ms && r2.grad_exposed_ms > 0.0,
        "12 ranks over nodes of 8 and 4 (flat): exposed %.3f ms, 16 ranks (hierarchical): %.3f",
        r.grad_exposed_ms, r2.grad_exposed_ms);
  // On the slow link compression pays: int8 and the plan beat none, the plan is no worse than
  // any uniform codec.
  double none = step(&p, &slow, 64, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  double plan = step(&p, &slow, 64, LOOM_SIM_GRAD_PLAN, 0, 0, &r);
  double i8 = step(&p, &slow, 64, 1, 0, 0, &r2);
  CHECK(i8 < none && plan <= none, "1 Gbit/s: none %.2f, plan %.2f, int8 %.2f", none, plan, i8);
  CHECK(r2.grad_bytes < 0.3 * 4.0 * 1e6 * 2, "int8 bytes %.0f", r2.grad_bytes);
  // A shared link is slower than the same link per rank.
  loom_sim_cluster_t shared = cluster(1, 8, 8, 1, 1), own = cluster(1, 8, 8, 1, 0);
  CHECK(step(&p, &shared, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r) >
            step(&p, &own, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r2),
        "a shared link is not slower");
  // Oversubscription: without documents (no attention straggler) 8 ranks on 2 cores compute
  // 4x as long, and sharing a core costs the cluster's timeshare on top.
  loom_sim_cluster_t small = cluster(1, 8, 2, 100, 0);
  loom_sim_profile_t flatp = p;
  flatp.ndocs = 0;
  step(&flatp, &small, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  step(&flatp, &c, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r2);
  CHECK(fabs(r.compute_ms - 4.0 * r2.compute_ms) < 1e-6, "oversubscribed compute %.3f vs %.3f",
        r.compute_ms, r2.compute_ms);
  small.timeshare = 0.05;
  step(&flatp, &small, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  CHECK(fabs(r.compute_ms - 4.0 * 1.05 * r2.compute_ms) < 1e-6,
        "timeshare 0.05: oversubscribed compute %.3f vs %.3f", r.compute_ms, r2.compute_ms);
  small.timeshare = 0.0;
  // With documents the straggler is the busiest core: the four ranks a core takes turns on
  // average their draws out, so the imbalance is smaller than over 8 cores, never below 1.
  step(&p, &small, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  step(&p, &c, 8, LOOM_SIM_GRAD_NONE, 0, 0, &r2);
  CHECK(r.attn_imbalance >= 1.0 && r.attn_imbalance < r2.attn_imbalance &&
            r.compute_ms < 4.0 * r2.compute_ms,
        "8 ranks on 2 cores: imbalance %.3f (8 cores: %.3f), compute %.3f (8 cores: %.3f)",
        r.attn_imbalance, r2.attn_imbalance, r.compute_ms, r2.compute_ms);
  // Attention servers bring the imbalance within the balancer's tolerance (0.1, plus rounding).
  step(&p, &c, 256, LOOM_SIM_GRAD_NONE, 0, 0, &r);
  step(&p, &c, 256, LOOM_SIM_GRAD_NONE, 0, 1, &r2);
  CHECK(r.attn_imbalance > 1.2 && r2.attn_imbalance <= 1.15 && r2.attn_ship_ms > 0,
        "256 ranks: imbalance %.3f without servers, %.3f with (ship %.3f ms)", r.attn_imbalance,
        r2.attn_imbalance, r2.attn_ship_ms);
  // A profile from 2 ranks with servers carries their exchange time: it stays while there are
  // exchanges (servers on, 2 or more ranks) and goes on one rank or without servers.
  loom_sim_cluster_t flat = cluster(1, 8, 8, 100, 0);
  double with[3], without[3];
  for (int k = 0; k < 3; k++) {
    const int ranks = k == 0 ? 1 : 2, servers = k < 2;
    p.attn_exchange_ms = 3.0;
    with[k] = step(&p, &flat, ranks, LOOM_SIM_GRAD_NONE, 0, servers, &r);
    p.attn_exchange_ms = 0.0;
    without[k] = step(&p, &flat, ranks, LOOM_SIM_GRAD_NONE, 0, servers, &r2);
  }
  CHECK(fabs(without[0] - with[0] - 3.0) < 1e-6, "one rank: %.4f with the exchange, %.4f without",
        with[0], without[0]);
  CHECK(fabs(with[1] - without[1]) < 1e-9,
        "2 ranks with servers: %.4f with the exchange, %.4f without (it is part of attn_ms)",
        with[1], without[1]);
  CHECK(with[2] < without[2] - 2.9, "2 ranks without servers: %.4f with the exchange, %.4f without",
        with[2], without[2]);
  // MoE: the all-to-all is exposed least under fine overlap, most under none.
  make_profile(&p, t, cd, docs, 1);
  double e[3];
  for (int m = 0; m < 3; m++) {
    step(&p, &slow, 64, LOOM_SIM_GRAD_NONE, m, 0, &r);
    e[m] = r.moe_exposed_ms;
    CHECK(r.moe_a2a_ms > 0, "no all-to-all at 64 ranks");
  }
  CHECK(e[0] > e[1] && e[1] > e[2] && e[2] > 0, "MoE exposed none %.3f coarse %.3f fine %.3f", e[0],
        e[1], e[2]);
  // Routing: one step sends everything to expert 0, one spreads it evenly: at 2 ranks (experts
  // 0-3 and 4-7) the busiest rank does 2x then 1x the mean, 1.5x on average.
  double load[16] = {800, 0, 0, 0, 0, 0, 0, 0, 100, 100, 100, 100, 100, 100, 100, 100};
  p.moe_steps = 2;
  p.moe_load = load;
  step(&p, &c, 2, LOOM_SIM_GRAD_NONE, 2, 0, &r);
  CHECK(fabs(r.moe_imbalance - 1.5) < 1e-9, "MoE imbalance %.4f, want 1.5", r.moe_imbalance);
  step(&p, &c, 1, LOOM_SIM_GRAD_NONE, 2, 0, &r);
  CHECK(r.moe_imbalance == 1.0, "MoE imbalance at one rank %.4f", r.moe_imbalance);
  p.moe_steps = 0;
  p.moe_load = NULL;
  // Bad arguments.
  quiet_begin();
  loom_sim_strategy_t s = {.grad = LOOM_SIM_GRAD_NONE};
  CHECK(loom_sim_predict(&p, &c, 0, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "0 ranks accepted");
  CHECK(loom_sim_predict(&p, &c, 513, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "513 of 512 accepted");
  s.grad = 2;
  CHECK(loom_sim_predict(&p, &c, 8, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "codec 2 of 2 accepted");
  s.grad = LOOM_SIM_GRAD_NONE;
  s.moe_overlap = 3;
  CHECK(loom_sim_predict(&p, &c, 8, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "overlap 3 accepted");
  CHECK(loom_sim_predict(NULL, &c, 8, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "NULL profile");
  quiet_end();
}

// Profiles whose steps hold too many documents get a clear error instead of gigabytes: a fuzzed
// profile (ctx 2, 5.1M tokens a rank) had the balancer allocate 2.2 GB. The sample's shortest
// document is 8 tokens, so a rank holds at most tokens / 8 + 1 documents.
static void test_doc_limits(void) {
  loom_sim_profile_t p;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t cd[2];
  int64_t docs[200];
  make_profile(&p, t, cd, docs, 0);
  loom_sim_cluster_t c = cluster(64, 8, 8, 100, 0);
  loom_sim_result_t r;
  // The balancer takes at most 2^21 documents: 64 ranks x 32768.
  p.tokens = 8 * 32767;
  step(&p, &c, 64, LOOM_SIM_GRAD_NONE, 0, 1, &r);
  CHECK(r.attn_imbalance >= 1.0 && r.attn_imbalance <= 1.15, "64 ranks at the limit: %.3f",
        r.attn_imbalance);
  loom_sim_strategy_t s = {.grad = LOOM_SIM_GRAD_NONE, .attn_servers = 1};
  quiet_begin();
  p.tokens = 8 * 32768;
  loom_status_t st = loom_sim_predict(&p, &c, 64, &s, 1, &r);
  const char *msg = loom_last_error(NULL);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(msg, "32769 documents per rank x 64 ranks") &&
            strstr(msg, "whole batches"),
        "one document a rank past the limit: %d (%s)", (int)st, msg);
  // Beyond 64 ranks the balancer still runs on 64: the same limit.
  CHECK(loom_sim_predict(&p, &c, 512, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "512 ranks balanced");
  // Without servers only the counts are drawn: 2^24 documents, 512 ranks x 32768.
  s.attn_servers = 0;
  p.tokens = 8 * 32767;
  CHECK(loom_sim_predict(&p, &c, 512, &s, 1, &r) == LOOM_OK, "512 ranks drawn: %s",
        loom_last_error(NULL));
  p.tokens = 8 * 32768;
  CHECK(loom_sim_predict(&p, &c, 512, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "past the draw limit");
  // The fuzzed profile: documents cut at ctx 2.
  p.ctx = 2;
  p.tokens = 5120526;
  s.attn_servers = 1;
  CHECK(loom_sim_predict(&p, &c, 8, &s, 1, &r) == LOOM_ERR_INVALID_ARG, "ctx 2 balanced");
  // A profile built by hand (not loaded) with documents of length 0 or below, or batch ends
  // out of order: refused, naming the document (documents all of length 0 were drawn forever).
  p.ctx = 256;
  p.tokens = 1024;
  s.attn_servers = 0;
  int64_t empty[3] = {0, 0, 0};
  p.docs = empty;
  p.ndocs = 3;
  alarm(60); // (a draw that never ends fails the test instead of hanging it)
  st = loom_sim_predict(&p, &c, 8, &s, 1, &r);
  alarm(0);
  CHECK(st == LOOM_ERR_INVALID_ARG && strstr(loom_last_error(NULL), "document 0"),
        "documents of length 0: %d (%s)", (int)st, loom_last_error(NULL));
  p.docs = docs;
  p.ndocs = 200;
  docs[17] = -3;
  s.attn_servers = 1;
  CHECK(loom_sim_predict(&p, &c, 8, &s, 1, &r) == LOOM_ERR_INVALID_ARG,
        "a document of length -3 accepted");
  docs[17] = 8;
  int ends[3] = {100, 50, 200};
  p.nbatches = 3;
  p.batch_end = ends;
  CHECK(loom_sim_predict(&p, &c, 8, &s, 1, &r) == LOOM_ERR_INVALID_ARG,
        "batch ends 100, 50, 200 accepted");
  quiet_end();
}

// The loom_sim binary in LOOM_BUILDDIR (or .) into tool; 0, with a failed check, when it is not
// built.
static int sim_tool(char *tool, size_t size) {
  const char *bdir = getenv("LOOM_BUILDDIR");
  snprintf(tool, size, "%s/loom_sim", bdir ? bdir : ".");
  if (access(tool, X_OK) != 0) {
    CHECK(0, "%s is not built (set LOOM_BUILDDIR)", tool);
    return 0;
  }
  return 1;
}

// The loom_sim program's --ranks: a count it cannot use is one line naming the list's form, and
// counts beyond the cluster are refused before anything is printed, naming the cluster's size
// (100000 once printed the summary and the table header, then failed with a library log line).
// A rank count or a --grad strategy named twice is refused (it printed the same rows twice), and
// so is --moe on a profile without MoE layers (one unnamed copy of every row per mode).
static void test_ranks_flag(void) {
  char tool[1024], prof[128], clus[128], out[128], err[128], cmd[2048];
  if (!sim_tool(tool, sizeof tool)) {
    return;
  }
  path_of(prof, sizeof prof, "ranks.profile");
  path_of(clus, sizeof clus, "ranks.cluster");
  path_of(out, sizeof out, "ranks.out");
  path_of(err, sizeof err, "ranks.err");
  loom_sim_profile_t p;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t cd[2];
  int64_t docs[200];
  make_profile(&p, t, cd, docs, 0);
  CHECK(loom_sim_profile_save(prof, &p) == LOOM_OK, "save: %s", loom_last_error(NULL));
  write_text(clus, "name four\nnodes 2\nranks_per_node 2\ncores_per_node 2\nintra 2 47\n");
  static const struct {
    const char *ranks;
    int status;
    const char *a, *b; // in the one line on stderr
  } cases[] = {
      {"1,2,4", 0, NULL, NULL},
      {"0", 2, "'0' is not a rank count", "at most 64 rank counts, each in 1..16777216"},
      {"2,100000", 2, "100000 is more than the 4 ranks of cluster four", "1..4"},
      {"5", 2, "5 is more than the 4 ranks", "ranks_per_node in the cluster file"},
      {"2,4,2", 2, "--ranks: 2 is repeated", "give each rank count once"},
      {"2 --grad none,int8,none", 2, "--grad: 'none' is repeated", "name each strategy once"},
      {"2 --moe none,fine", 2, "--moe: the profile", "has no MoE layers"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(cmd, sizeof cmd,
             "'%s' --profile '%s' --cluster '%s' --grad none --ranks %s >'%s' 2>'%s'", tool, prof,
             clus, cases[i].ranks, out, err);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    long olen = 0, elen = 0;
    char *o = read_all(out, &olen), *e = read_all(err, &elen);
    if (o) {
      o[olen] = 0;
    }
    if (e) {
      e[elen] = 0;
    }
    CHECK(rc == cases[i].status, "--ranks %s: exit %d, wanted %d (%s)", cases[i].ranks, rc,
          cases[i].status, e ? e : "");
    if (cases[i].status == 0) {
      CHECK(o && strstr(o, "grad=none") && e && elen == 0, "--ranks %s: a table, no error: %s",
            cases[i].ranks, e ? e : "");
    } else {
      const char *nl = e ? strchr(e, '\n') : NULL;
      CHECK(e && strstr(e, cases[i].a) && strstr(e, cases[i].b) && nl && !nl[1],
            "--ranks %s: one line naming '%s' and '%s', got: %s", cases[i].ranks, cases[i].a,
            cases[i].b, e ? e : "");
      CHECK(o && olen == 0, "--ranks %s: printed before the refusal: %s", cases[i].ranks,
            o ? o : "");
    }
    free(o);
    free(e);
  }
}

// The loom_sim program's --png: the labels hold the profile's codec specs (untrusted text) and
// go into gnuplot quoted; a quote in a spec once ended the string and the rest of it ran as
// gnuplot commands, system() included.
static void test_png_labels(void) {
  char tool[1024], prof[128], clus[128], csv[128], png[128], mark[128], cmd[2048];
  if (!sim_tool(tool, sizeof tool)) {
    return;
  }
  path_of(prof, sizeof prof, "png.profile");
  path_of(clus, sizeof clus, "png.cluster");
  path_of(csv, sizeof csv, "png.csv");
  path_of(png, sizeof png, "png.png");
  path_of(mark, sizeof mark, "png.ran");
  loom_sim_profile_t p;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t cd[2];
  int64_t docs[200];
  char spec[256];
  make_profile(&p, t, cd, docs, 0);
  snprintf(spec, sizeof spec, "fp16';system('touch${IFS}%s');#", mark);
  cd[0].compressor = spec;
  CHECK(loom_sim_profile_save(prof, &p) == LOOM_OK, "save: %s", loom_last_error(NULL));
  write_text(clus, "nodes 1\nranks_per_node 2\ncores_per_node 2\nintra 2 47\n");
  snprintf(cmd, sizeof cmd,
           "'%s' --profile '%s' --cluster '%s' --ranks 1,2 --attn off --csv '%s' "
           "--png '%s' >/dev/null 2>&1",
           tool, prof, clus, csv, png);
  int rc = system(cmd);
  CHECK(access(mark, F_OK) != 0, "a codec spec of the profile ran a command through gnuplot");
  if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "loom_sim --png with a quote in a label: exit %d",
          WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
  }
  unlink(mark);
  // A comma in the cluster's name or a codec spec stays inside its CSV field (quoted): every row
  // has the header's 16 fields.
  write_text(clus, "name a,b\nnodes 1\nranks_per_node 2\ncores_per_node 2\nintra 2 47\n");
  cd[0].compressor = "x,y";
  CHECK(loom_sim_profile_save(prof, &p) == LOOM_OK, "save: %s", loom_last_error(NULL));
  snprintf(cmd, sizeof cmd,
           "'%s' --profile '%s' --cluster '%s' --ranks 1,2 --attn off --csv '%s' >/dev/null 2>&1",
           tool, prof, clus, csv);
  rc = system(cmd);
  long len = 0;
  char *text = read_all(csv, &len);
  int rows = 0, bad_rows = 0;
  for (long i = 0, fields = 1, quoted = 0; text && i < len; i++) {
    if (text[i] == '"') {
      quoted = !quoted;
    } else if (text[i] == ',' && !quoted) {
      fields++;
    } else if (text[i] == '\n' && !quoted) {
      rows++;
      bad_rows += fields != 16;
      fields = 1;
    }
  }
  CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && rows > 1 && bad_rows == 0,
        "CSV with commas in names: exit %d, %d of %d rows without 16 fields",
        WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, bad_rows, rows);
  free(text);
}

// loom_sim's default strategies are none, plan and every codec of the profile: all 20 of a
// profile of 20 codecs (the program once kept the first 14, silently).
static void test_every_codec(void) {
  char tool[1024], prof[128], clus[128], out[128], cmd[2048];
  if (!sim_tool(tool, sizeof tool)) {
    return;
  }
  path_of(prof, sizeof prof, "codecs.profile");
  path_of(clus, sizeof clus, "codecs.cluster");
  path_of(out, sizeof out, "codecs.out");
  loom_sim_profile_t p;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t cd[2], many[20];
  char names[20][16];
  int64_t docs[200];
  make_profile(&p, t, cd, docs, 0);
  for (int k = 0; k < 20; k++) {
    snprintf(names[k], sizeof names[k], "topk:0.%02d", k + 1);
    many[k] = cd[1];
    many[k].compressor = names[k];
  }
  p.codecs = many;
  p.ncodecs = 20;
  CHECK(loom_sim_profile_save(prof, &p) == LOOM_OK, "save: %s", loom_last_error(NULL));
  write_text(clus, "nodes 1\nranks_per_node 2\ncores_per_node 2\nintra 2 47\n");
  snprintf(cmd, sizeof cmd, "'%s' --profile '%s' --cluster '%s' --ranks 2 --attn off >'%s' 2>&1",
           tool, prof, clus, out);
  int rc = system(cmd);
  long len = 0;
  char *o = read_all(out, &len);
  int rows = 0;
  if (o) {
    o[len] = 0;
    for (const char *at = o; (at = strstr(at, "\ngrad=")) != NULL; at++) {
      rows++;
    }
  }
  CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && rows == 22 && o && strstr(o, "grad=topk:0.20 "),
        "20 codecs: exit %d, %d strategies (want none, plan and the 20)",
        WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, rows);
  free(o);
  // A --grad or --ranks list longer than the program reads is refused: cut short, its last
  // name or count was another, or dropped (2000 none then int8 ran without int8).
  char *list = malloc(12100);
  int at = 0;
  for (int k = 0; k < 2000; k++) {
    at += snprintf(list + at, 12100 - (size_t)at, "none,");
  }
  snprintf(list + at, 12100 - (size_t)at, "int8");
  snprintf(cmd, sizeof cmd, "'%s' --profile '%s' --cluster '%s' --ranks 2 --attn off --grad ", tool,
           prof, clus);
  char *full = malloc(strlen(cmd) + strlen(list) + 256);
  sprintf(full, "%s%s >'%s' 2>&1", cmd, list, out);
  rc = system(full);
  o = read_all(out, &len);
  if (o) {
    o[len] = 0;
  }
  CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && o && strstr(o, "--grad: the list is longer"),
        "a --grad list of 10004 characters: exit %d: %s", WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
        o ? o : "");
  free(o);
  free(full);
  free(list);
}

// ---- exact values --------------------------------------------------------------------------

static int near(double a, double b) {
  return fabs(a - b) <= 1e-9 * fmax(1.0, fmax(fabs(a), fabs(b)));
}

// Hand-computed predictions of sim.c's model (no documents: no attention draws), so that a
// wrong term anywhere in the formulas shows as a wrong number.
static void test_exact(void) {
  // MoE profile: compute 40 ms = attention 8 + experts 10 + other 22; overhead 0.5 ms; 2 MoE
  // layers, 4 experts, top-2, hidden 100, 1000 tokens; one routed step loads experts 1,1,1,5.
  double load[4] = {1, 1, 1, 5};
  loom_sim_profile_t p;
  memset(&p, 0, sizeof p);
  p.np = 1;
  p.tokens = 1000;
  p.ctx = 100;
  p.compute_ms = 40.0;
  p.overhead_ms = 0.5;
  p.attn_ms = 8.0;
  p.moe_layers = 2;
  p.moe_experts = 4;
  p.moe_topk = 2;
  p.moe_hidden = 100;
  p.moe_ms = 10.0;
  p.moe_fine_hidden = 0.8;
  p.moe_steps = 1;
  p.moe_load = load;
  // 2 nodes of 4 ranks on 2 cores; intra 10 us + 1000 B/us (8 Gbit/s), inter 20 us + 500 B/us;
  // nothing shared; timeshare 0.1.
  loom_sim_cluster_t c = {.nodes = 2, .ranks_per_node = 4, .cores_per_node = 2};
  snprintf(c.name, sizeof c.name, "exact");
  c.intra = (loom_link_t){.alpha_us = 10, .gbps = 8};
  c.inter = (loom_link_t){.alpha_us = 20, .gbps = 4};
  c.timeshare = 0.1;
  loom_sim_strategy_t st = {.grad = LOOM_SIM_GRAD_NONE,
                            .moe_overlap = LOOM_MOE_OVERLAP_COARSE,
                            .attn_servers = 0,
                            .ep_size = 4};
  loom_sim_result_t r;
  CHECK(loom_sim_predict(&p, &c, 4, &st, 1, &r) == LOOM_OK, "exact MoE: %s", loom_last_error(NULL));
  // 4 ranks on one node of 2 cores: 2 a core, oversubscription 2 x 1.1 = 2.2.
  // Imbalance over ep 4 (one expert each): max 5 / mean 2 = 2.5. Experts E = 10 x 2.2 x 2.5 = 55.
  // All-to-all inside the node (ep 4 <= 4 ranks a node): bytes 1000 x 2 x 100 x 4 x 3/4 =
  // 600000, one exchange 3 x 10 + 600000 / 1000 = 630 us, 2 layers x 4 exchanges = 5.04 ms;
  // coarse hides min(5.04, 55) x (1 - 1/4) = 3.78: exposed 1.26.
  // compute (22 + 8) x 2.2 + 55 = 121; step 121 + 1.26 + overhead 0.5 x 2.2 = 123.36 ms.
  CHECK(r.nodes == 1 && r.ranks == 4, "exact MoE: %d ranks on %d nodes", r.ranks, r.nodes);
  CHECK(near(r.moe_imbalance, 2.5), "exact MoE: imbalance %.9f, want 2.5", r.moe_imbalance);
  CHECK(near(r.moe_a2a_ms, 5.04), "exact MoE: all-to-all %.9f ms, want 5.04", r.moe_a2a_ms);
  CHECK(near(r.moe_exposed_ms, 1.26), "exact MoE: exposed %.9f ms, want 1.26 (coarse)",
        r.moe_exposed_ms);
  CHECK(near(r.compute_ms, 121.0), "exact MoE: compute %.9f ms, want 121", r.compute_ms);
  CHECK(near(r.step_ms, 123.36), "exact MoE: step %.9f ms, want 123.36", r.step_ms);
  CHECK(near(r.tokens_per_s, 4.0 * 1000 * 1000 / 123.36), "exact MoE: %.3f tokens/s, want %.3f",
        r.tokens_per_s, 4.0 * 1000 * 1000 / 123.36);
  CHECK(r.grad_exposed_ms == 0.0 && r.attn_imbalance == 1.0, "exact MoE: grad %.9f, attn %.9f",
        r.grad_exposed_ms, r.attn_imbalance);
  // 6 ranks span 2 nodes (4 + 2); the busiest node still holds 4 ranks on 2 cores.
  CHECK(loom_sim_predict(&p, &c, 6, &st, 1, &r) == LOOM_OK && r.nodes == 2,
        "exact MoE, 6 ranks: %d nodes, want 2", r.nodes);

  // Gradients: no MoE, no attention, compute 10 ms, 2 ranks on one node of 2 cores (no
  // oversubscription, stretch 1). Listed in trainer order: embed (250000 floats, ready 12 ms:
  // after the compute, so clamped to 10 ms) and h0 (500000 floats, ready 4 ms). In ready order:
  // h0's allreduce 20 + 2e6 / 1000 = 2020 us over 4000 .. 6020; embed's 20 + 1000 = 1020 us over
  // 10000 .. 11020. Step 11.02 ms, 1.02 exposed, 2 x 1/2 x 4 x 750000 = 3e6 bytes.
  loom_plan_tensor_t t[2] = {{"grad.embed", 250000, 12000.0}, {"grad.h0", 500000, 4000.0}};
  memset(&p, 0, sizeof p);
  p.np = 1;
  p.tokens = 1000;
  p.ctx = 100;
  p.compute_ms = 10.0;
  p.ntensors = 2;
  p.tensors = t;
  loom_sim_cluster_t c2 = {.nodes = 1, .ranks_per_node = 2, .cores_per_node = 2};
  snprintf(c2.name, sizeof c2.name, "exact2");
  c2.intra = (loom_link_t){.alpha_us = 10, .gbps = 8};
  c2.inter = c2.intra;
  loom_sim_strategy_t none = {.grad = LOOM_SIM_GRAD_NONE};
  CHECK(loom_sim_predict(&p, &c2, 2, &none, 1, &r) == LOOM_OK, "exact grad: %s",
        loom_last_error(NULL));
  CHECK(near(r.step_ms, 11.02) && near(r.grad_exposed_ms, 1.02) && near(r.grad_bytes, 3e6),
        "exact grad: step %.9f ms, exposed %.9f ms, %.1f bytes; want 11.02, 1.02, 3e6 (tensors "
        "taken in ready order, ready times clamped to the compute)",
        r.step_ms, r.grad_exposed_ms, r.grad_bytes);
}

// Hand-computed attention terms: the causal pairs a drawn step costs (the straggler without
// servers) and the balancer's plan, imbalance and ship time with them. Documents are drawn at
// random (splitmix64 from the seed); each seed below was picked so that in all 8 trials the two
// ranks draw different documents, so every trial gives the same numbers and their mean is exact.
// (A change to the draw changes these numbers: pick the seeds again.)
static void test_exact_attn(void) {
  // Two batches: {8} (8 x 9 / 2 = 36 pairs) and {3, 3} (6 + 6 = 12). compute 10 ms = attention
  // 4 + other 6, overhead 0.5; no gradients, no MoE. 2 ranks on one node of 2 cores (no
  // oversubscription); intra 10 us + 8 Gbit/s = 1000 B/us, shared by the node's 2 ranks: 500.
  int64_t docs[3] = {8, 3, 3};
  int ends[2] = {1, 3};
  loom_sim_profile_t p;
  memset(&p, 0, sizeof p);
  p.np = 1;
  p.tokens = 8;
  p.ctx = 8; // the balancer's min_shard: min(64, ctx / 4) = 2
  p.compute_ms = 10.0;
  p.overhead_ms = 0.5;
  p.attn_ms = 4.0;
  p.attn_q_bytes = 1000;
  p.attn_kv_bytes = 600;
  p.ndocs = 3;
  p.docs = docs;
  p.nbatches = 2;
  p.batch_end = ends;
  loom_sim_cluster_t c = {.nodes = 1, .ranks_per_node = 2, .cores_per_node = 2};
  snprintf(c.name, sizeof c.name, "exact attn");
  c.intra = (loom_link_t){.alpha_us = 10, .gbps = 8};
  c.inter = (loom_link_t){.alpha_us = 20, .gbps = 4};
  c.intra_shared = 1;
  loom_sim_strategy_t st = {.grad = LOOM_SIM_GRAD_NONE};
  loom_sim_result_t r;
  const uint64_t seed = 31; // in every trial one rank draws {8}, the other {3, 3}

  // Without servers: max / mean = 36 / 24 = 1.5; compute 6 + 4 x 1.5 = 12, step 12.5.
  CHECK(loom_sim_predict(&p, &c, 2, &st, seed, &r) == LOOM_OK, "exact attn: %s",
        loom_last_error(NULL));
  CHECK(near(r.attn_imbalance, 1.5) && r.attn_ship_ms == 0.0 && near(r.compute_ms, 12.0) &&
            near(r.step_ms, 12.5),
        "exact attn, no servers: imbalance %.9f (want 36 / 24 = 1.5: causal pairs L (L + 1) / 2), "
        "ship %.9f (want 0), compute %.9f (want 12), step %.9f (want 12.5)",
        r.attn_imbalance, r.attn_ship_ms, r.compute_ms, r.step_ms);

  // With a row cost of 2 pairs: 36 + 2 x 8 = 52 against 12 + 2 x 6 = 24, max / mean 52 / 38 =
  // 26 / 19; compute 6 + 4 x 26 / 19 = 218 / 19.
  p.attn_row_cost = 2.0;
  CHECK(loom_sim_predict(&p, &c, 2, &st, seed, &r) == LOOM_OK, "exact attn, row cost: %s",
        loom_last_error(NULL));
  CHECK(near(r.attn_imbalance, 26.0 / 19.0) && near(r.compute_ms, 218.0 / 19.0),
        "exact attn, row cost 2: imbalance %.9f (want 26 / 19), compute %.9f (want 218 / 19)",
        r.attn_imbalance, r.compute_ms);
  p.attn_row_cost = 0.0;

  // Servers in place: the balancer on the 2 ranks, loads 36 and 12, mean 24, goal 26.4.
  //  1. need 12, gap 24: of [0, 8) the head [0, 4) (10 pairs) ships 4 x 1000 + 4 x 600 = 6400
  //     bytes, 640 a pair; the tail [6, 8) (15 pairs) 2 x 1000 + 8 x 600 = 6800, 453 a pair. The
  //     tail goes: loads 21 and 27.
  //  2. need 3, gap 6: the {3} documents (6 pairs each, too short to cut at min_shard 2) and
  //     [6, 8) (15) all reach the gap: stop.
  // max / mean 27 / 24 = 1.125; 6800 bytes over 2 ranks, 3400 a rank; ship 4 x 10 us + 3400 /
  // 500 B/us = 46.8 us. compute 6 + 4 x 1.125 = 10.5, step 10.5 + 0.0468 + 0.5 = 11.0468.
  st.attn_servers = 1;
  CHECK(loom_sim_predict(&p, &c, 2, &st, seed, &r) == LOOM_OK, "exact attn, servers: %s",
        loom_last_error(NULL));
  CHECK(near(r.attn_imbalance, 1.125) && near(r.attn_ship_ms, 0.0468) && near(r.compute_ms, 10.5) &&
            near(r.step_ms, 11.0468),
        "exact attn, servers: imbalance %.9f (want 1.125), ship %.9f ms (want 0.0468: 4 alpha + "
        "3400 B a rank at 500 B/us), compute %.9f (want 10.5), step %.9f (want 11.0468)",
        r.attn_imbalance, r.attn_ship_ms, r.compute_ms, r.step_ms);
  // Not shared, the link gives each rank 1000 B/us: 40 + 3.4 = 43.4 us.
  c.intra_shared = 0;
  CHECK(loom_sim_predict(&p, &c, 2, &st, seed, &r) == LOOM_OK && near(r.attn_ship_ms, 0.0434),
        "exact attn, servers, own link: ship %.9f ms, want 0.0434", r.attn_ship_ms);

  // Without batches: documents drawn from the sample {3, 9}, cut at ctx 5, packed into 5
  // tokens a rank (the last cut to fit). With seed 201 in every trial one rank draws a 9 (cut
  // to 5: 15 pairs), the other a 3 then a 3 or 9 cut to the 2 rows left (6 + 3 = 9 pairs):
  // max / mean 15 / 12 = 1.25, compute 6 + 4 x 1.25 = 11.
  int64_t sample[2] = {3, 9};
  p.docs = sample;
  p.ndocs = 2;
  p.nbatches = 0;
  p.batch_end = NULL;
  p.tokens = 5;
  p.ctx = 5;
  st.attn_servers = 0;
  CHECK(loom_sim_predict(&p, &c, 2, &st, 201, &r) == LOOM_OK, "exact attn, sample: %s",
        loom_last_error(NULL));
  CHECK(near(r.attn_imbalance, 1.25) && near(r.compute_ms, 11.0),
        "exact attn, sampled documents: imbalance %.9f (want 15 / 12 = 1.25), compute %.9f "
        "(want 11)",
        r.attn_imbalance, r.compute_ms);
}

// The exposed gradient time is the simulated step less the compute it overlaps: never below
// zero, not even by rounding (a step with nothing exposed printed "-0.00" in loom_sim's table
// and "-0.0000" in its CSV at some rank counts).
static void test_exposed_not_negative(void) {
  loom_sim_profile_t p;
  loom_plan_tensor_t t[4];
  loom_codec_cost_t cd[2];
  int64_t docs[200];
  make_profile(&p, t, cd, docs, 0);
  loom_sim_cluster_t c = cluster(64, 8, 8, 100, 0);
  int negative = 0, first = 0;
  double worst = 0.0;
  for (int k = 0; k < 200; k++) {
    p.compute_ms = 20.0 + 0.0731 * k; // compute times whose products by 1000 round
    for (int ranks = 1; ranks <= 8; ranks++) {
      for (int attn = 0; attn <= 1; attn++) {
        loom_sim_result_t r;
        step(&p, &c, ranks, LOOM_SIM_GRAD_NONE, 0, attn, &r);
        if (signbit(r.grad_exposed_ms) || signbit(r.moe_exposed_ms)) {
          if (negative++ == 0) {
            first = ranks;
            worst = r.grad_exposed_ms;
          }
        }
      }
    }
  }
  CHECK(negative == 0, "%d predictions with a negative exposed time (first at %d ranks: %g ms)",
        negative, first, worst);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/test_sim.XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 99;
  }
  test_roundtrip_and_damage();
  test_cluster_file();
  test_model();
  test_exact();
  test_exact_attn();
  test_doc_limits();
  test_ranks_flag();
  test_png_labels();
  test_every_codec();
  test_exposed_not_negative();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "test_sim: could not remove %s\n", dir);
  }
  return check_exit("test_sim");
}
