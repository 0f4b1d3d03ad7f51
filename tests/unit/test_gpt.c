/* test_gpt.c — train_gpt's building blocks without MPI: corpus loading (documents, hold-out,
 * directories, errors), packed batches (cu_seqlens, positions, targets), and the model's
 * backward against finite differences of its loss. */
#define _POSIX_C_SOURCE 200809L // mkdtemp
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../examples/example_util.h"
#include "../../examples/gpt_data.h"
#include "../../examples/gpt_model.h"
#include "../../examples/mfu_meter.h"
#include "../check.h"
#include "loom.h"

static char tmpdir[256];

static void write_file(const char *name, const char *text, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f && fwrite(text, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

static const char kDocs[] = "a\n%\nbb\n%\n%\nccc\r\n%\r\ndddd"; // 4 documents, one empty dropped

// ---- corpus -------------------------------------------------------------------------------------

static void test_load_file(void) {
  char path[512], err[512] = "";
  snprintf(path, sizeof path, "%s/docs", tmpdir);
  write_file("docs", kDocs, sizeof kDocs - 1);
  const char *paths[1] = {path};
  gpt_corpus_t c;
  CHECK(gpt_corpus_load(paths, 1, 0.25, 7, &c, err, sizeof err) == 0, "%s", err);
  CHECK(c.files == 1, "files %d", c.files);
  CHECK(c.train.docs == 3 && c.val.docs == 1, "train %lld val %lld docs", (long long)c.train.docs,
        (long long)c.val.docs);
  // bytes: a\n (2) bb\n (3) ccc\r\n (5) dddd (4); each document + 1 start, each stream + 1 end
  CHECK(c.train.len + c.val.len == 14 + 4 + 2, "stream lengths %lld + %lld", (long long)c.train.len,
        (long long)c.val.len);
  const gpt_stream_t *streams[2] = {&c.train, &c.val};
  for (int k = 0; k < 2; k++) {
    const gpt_stream_t *s = streams[k];
    CHECK(s->tokens[s->len - 1] == GPT_DOC_START, "stream %d does not end with a start", k);
    for (int64_t d = 0; d < s->docs; d++) {
      CHECK(s->tokens[s->doc_starts[d]] == GPT_DOC_START, "doc %lld does not open with 0",
            (long long)d);
      CHECK(d == 0 || s->doc_starts[d] > s->doc_starts[d - 1], "doc starts not increasing");
    }
  }
  CHECK(c.unigram_entropy > 0.5 && c.unigram_entropy < log(256.0), "unigram entropy %g",
        c.unigram_entropy);
  // The same seed gives the same split; the split depends on the seed only through the order.
  gpt_corpus_t c2;
  CHECK(gpt_corpus_load(paths, 1, 0.25, 7, &c2, err, sizeof err) == 0, "%s", err);
  CHECK(c2.train.len == c.train.len && !memcmp(c2.train.tokens, c.train.tokens, c.train.len),
        "the same seed gave another training stream");
  gpt_corpus_free(&c2);
  gpt_corpus_free(&c);
}

static void test_load_dir_and_errors(void) {
  char dir[512], err[512] = "";
  snprintf(dir, sizeof dir, "%s/dir", tmpdir);
  CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
  write_file("dir/b", "second\n%\nthird\n", 15);
  write_file("dir/a", "first", 5);
  write_file("dir/a.dat", "\x01\x02\x03", 3); // a strfile index: skipped
  write_file("dir/.hidden", "never", 5);
  const char *paths[1] = {dir};
  gpt_corpus_t c;
  CHECK(gpt_corpus_load(paths, 1, 0.01, 1, &c, err, sizeof err) == 0, "%s", err);
  CHECK(c.files == 2, "read %d files, want 2 (a, b)", c.files);
  CHECK(c.train.docs + c.val.docs == 3, "%lld documents, want 3",
        (long long)(c.train.docs + c.val.docs));
  CHECK(c.val.docs == 1, "val_frac 0.01 of 3 documents must still hold one out");
  int seen_never = 0;
  for (int64_t i = 0; i + 5 <= c.train.len; i++) {
    seen_never |= !memcmp(c.train.tokens + i, "never", 5);
  }
  CHECK(!seen_never, "a hidden file was read");
  gpt_corpus_free(&c);

  char missing[512];
  snprintf(missing, sizeof missing, "%s/nope", tmpdir);
  const char *bad[1] = {missing};
  CHECK(gpt_corpus_load(bad, 1, 0.1, 1, &c, err, sizeof err) != 0, "a missing path loaded");
  CHECK(strstr(err, missing) != NULL, "the error does not name the path: %s", err);
  write_file("one", "only one document", 17);
  char one[512];
  snprintf(one, sizeof one, "%s/one", tmpdir);
  const char *single[1] = {one};
  CHECK(gpt_corpus_load(single, 1, 0.1, 1, &c, err, sizeof err) != 0, "one document loaded");
  CHECK(strstr(err, "at least 2") != NULL, "unclear error: %s", err);
  // A binary file (byte 0 is the document start token): refused, naming the offset.
  write_file("bin", "text\n%\nmore\0text", 16);
  char bin[512];
  snprintf(bin, sizeof bin, "%s/bin", tmpdir);
  const char *binary[1] = {bin};
  CHECK(gpt_corpus_load(binary, 1, 0.1, 1, &c, err, sizeof err) != 0, "a NUL byte loaded");
  CHECK(strstr(err, bin) && strstr(err, "NUL byte at offset 11"), "unclear error: %s", err);
  // A FIFO: refused at once (opening it would wait for a writer forever).
  char fifo[512];
  snprintf(fifo, sizeof fifo, "%s/fifo", tmpdir);
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
  const char *pipe_path[1] = {fifo};
  CHECK(gpt_corpus_load(pipe_path, 1, 0.1, 1, &c, err, sizeof err) != 0, "a FIFO loaded");
  CHECK(strstr(err, "not a regular file"), "unclear error: %s", err);

  // One file reached twice (repeated, through a link, or inside a directory also given): refused,
  // naming both paths, since its documents would count twice.
  char a[600], link_a[600];
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(link_a, sizeof link_a, "%s/link_a", tmpdir);
  CHECK(symlink(a, link_a) == 0, "symlink %s", link_a);
  const char *twice[][2] = {{one, one}, {dir, a}, {a, link_a}};
  for (int i = 0; i < 3; i++) {
    CHECK(gpt_corpus_load(twice[i], 2, 0.1, 1, &c, err, sizeof err) != 0, "case %d loaded", i);
    CHECK(strstr(err, twice[i][1]) && strstr(err, "count twice") && strstr(err, "once"),
          "case %d: unclear error: %s", i, err);
  }
  // A corpus over GPT_MAX_CORPUS (sparse files of 1 GiB each, under the per-file limit): refused
  // before any file is read (reading them would find NUL bytes first).
  char big[3][512];
  const char *bigs[3];
  for (int i = 0; i < 3; i++) {
    snprintf(big[i], sizeof big[i], "%s/big%d", tmpdir, i);
    FILE *f = fopen(big[i], "wb");
    CHECK(f && ftruncate(fileno(f), GPT_MAX_FILE) == 0 && fclose(f) == 0, "sparse %s", big[i]);
    bigs[i] = big[i];
  }
  const char *with_one[4] = {one, bigs[0], bigs[1], bigs[2]};
  CHECK(gpt_corpus_load(with_one, 4, 0.1, 1, &c, err, sizeof err) != 0, "a huge corpus loaded");
  CHECK(strstr(err, "over the limit") && strstr(err, "in 4 files") && strstr(err, "every rank"),
        "unclear error: %s", err);
  for (int i = 0; i < 3; i++) {
    unlink(big[i]);
  }
}

// ---- batches ------------------------------------------------------------------------------------

// Every row of every batch: sequences start at the row start or at a document start, positions
// count from 0 in each, targets are the next stream token, and the pair count matches.
static void check_batch(const gpt_batch_t *b, const gpt_stream_t *s, int64_t first_row, int nrows) {
  const int ctx = b->ctx;
  const int32_t *tok = b->tokens.data, *tgt = b->target.data, *pos = b->pos.data, *cu = b->cu.data;
  CHECK(b->total == (int64_t)nrows * ctx, "total %lld", (long long)b->total);
  CHECK(cu[0] == 0 && cu[b->nseq] == b->total, "cu ends %d %d", cu[0], cu[b->nseq]);
  int64_t pairs = 0, rows = gpt_rows(s, ctx);
  for (int q = 0; q < b->nseq; q++) {
    int32_t len = cu[q + 1] - cu[q];
    CHECK(len >= 1 && len <= ctx, "sequence %d has length %d", q, len);
    CHECK(cu[q] / ctx == (cu[q + 1] - 1) / ctx, "sequence %d crosses a row", q);
    CHECK(cu[q] % ctx == 0 || tok[cu[q]] == GPT_DOC_START, "sequence %d starts mid-document", q);
    pairs += (int64_t)len * (len + 1) / 2;
    for (int32_t t = 0; t < len; t++) {
      CHECK(pos[cu[q] + t] == t, "position %d of sequence %d is %d", t, q, pos[cu[q] + t]);
      CHECK(t == 0 || tok[cu[q] + t] != GPT_DOC_START, "a document start inside sequence %d", q);
    }
  }
  CHECK(pairs == b->attn_pairs, "pairs %lld, want %lld", (long long)b->attn_pairs,
        (long long)pairs);
  for (int r = 0; r < nrows; r++) {
    int64_t base = ((first_row + r) % rows) * ctx;
    for (int t = 0; t < ctx; t++) {
      int64_t i = (int64_t)r * ctx + t;
      CHECK(tok[i] == s->tokens[base + t] && tgt[i] == s->tokens[base + t + 1],
            "row %d token %d: %d -> %d, want %d -> %d", r, t, tok[i], tgt[i], s->tokens[base + t],
            s->tokens[base + t + 1]);
    }
  }
}

static void test_batches(void) {
  char path[512], err[512] = "";
  snprintf(path, sizeof path, "%s/docs", tmpdir);
  const char *paths[1] = {path};
  gpt_corpus_t c;
  CHECK(gpt_corpus_load(paths, 1, 0.25, 7, &c, err, sizeof err) == 0, "%s", err);
  for (int ctx = 2; ctx <= 6; ctx++) {
    gpt_batch_t b;
    CHECK(gpt_batch_alloc(&b, 3, ctx) == LOOM_OK, "alloc");
    int64_t rows = gpt_rows(&c.train, ctx);
    CHECK(rows == (c.train.len - 1) / ctx && rows >= 1, "ctx %d: %lld rows", ctx, (long long)rows);
    for (int64_t first = 0; first < rows + 2; first++) { // wraps past the end
      gpt_batch_fill(&b, &c.train, first, 3);
      check_batch(&b, &c.train, first, 3);
    }
    gpt_batch_free(&b);
  }
  gpt_corpus_free(&c);
}

// ---- the model's gradients ----------------------------------------------------------------------

static float loss_of(gpt_model_t *m, gpt_acts_t *a, const gpt_batch_t *b) {
  float loss = 0.0f;
  CHECK(gpt_forward(m, a, &b->tokens, &b->pos, &b->target, &b->cu, &loss, NULL) == LOOM_OK, "%s",
        loom_last_error(NULL));
  return loss;
}

static void test_gradients(void) {
  char path[512], err[512] = "";
  snprintf(path, sizeof path, "%s/docs", tmpdir);
  const char *paths[1] = {path};
  gpt_corpus_t c;
  CHECK(gpt_corpus_load(paths, 1, 0.25, 7, &c, err, sizeof err) == 0, "%s", err);
  gpt_config_t cfg = {.layers = 2, .width = 8, .heads = 2, .ctx = 5, .vocab = 256};
  gpt_model_t m;
  gpt_acts_t a;
  gpt_batch_t b;
  CHECK(gpt_model_alloc(&m, &cfg) == LOOM_OK, "model");
  CHECK(gpt_acts_alloc(&a, &cfg, 2 * cfg.ctx) == LOOM_OK, "acts");
  CHECK(gpt_batch_alloc(&b, 2, cfg.ctx) == LOOM_OK, "batch");
  CHECK(m.nunits == 4 && m.nparams == 2 + 2 * GPT_BLOCK_PARAMS + 3, "units %d params %d", m.nunits,
        m.nparams);
  // Large random weights so that every gradient is well above float noise.
  uint64_t state = 11;
  for (int64_t i = 0; i < m.total; i++) {
    m.flat[0][i] = 0.6f * (2.0f * ex_uniform(&state) - 1.0f);
  }
  // The batch of two rows that holds the most sequences: a row with a document start inside.
  int64_t best = 0, most = 0;
  for (int64_t r = 0; r < gpt_rows(&c.train, cfg.ctx); r++) {
    gpt_batch_fill(&b, &c.train, r, 2);
    if (b.nseq > most) {
      most = b.nseq;
      best = r;
    }
  }
  gpt_batch_fill(&b, &c.train, best, 2);
  CHECK(b.nseq >= 3, "the batch should hold several sequences, has %d", b.nseq);
  loss_of(&m, &a, &b);
  for (int u = m.nunits - 1; u >= 0; u--) {
    CHECK(gpt_backward_unit(&m, &a, u, NULL) == LOOM_OK, "backward unit %d: %s", u,
          loom_last_error(NULL));
  }
  float *grad = malloc((size_t)m.total * sizeof(float));
  memcpy(grad, m.flat[1], (size_t)m.total * sizeof(float));
  int checked = 0, bad = 0;
  for (int i = 0; i < m.nparams; i++) {
    int64_t n = loom_tensor_numel(&m.param[i]);
    float *p = m.param[i].data;
    int64_t off = p - m.flat[0];
    for (int k = 0; k < 5; k++) {
      int64_t j = (int64_t)(ex_splitmix64(&state) % (uint64_t)n);
      if (i == 0) { // wte: only rows of tokens in the batch get a gradient; pick one
        j = (int64_t)((const int32_t *)b.tokens.data)[k] * cfg.width + k % cfg.width;
      } else if (i == 1) { // wpe: rows 0..ctx-1 all occur
        j = (int64_t)(k % cfg.ctx) * cfg.width + k % cfg.width;
      }
      const float h = 1e-2f, saved = p[j];
      p[j] = saved + h;
      double up = loss_of(&m, &a, &b);
      p[j] = saved - h;
      double down = loss_of(&m, &a, &b);
      p[j] = saved;
      double fd = (up - down) / (2.0 * h), g = grad[off + j];
      checked++;
      if (!(fabs(fd - g) <= 2e-3 + 3e-2 * fabs(fd))) {
        bad++;
        fprintf(stderr, "FAIL gradient of %s[%lld]: backward %.6g, finite difference %.6g\n",
                m.param[i].name, (long long)j, g, fd);
      }
    }
  }
  CHECK(bad == 0, "%d of %d gradients disagree with finite differences", bad, checked);
  // The backward overwrites: running it twice gives the same gradients.
  loss_of(&m, &a, &b);
  for (int u = m.nunits - 1; u >= 0; u--) {
    gpt_backward_unit(&m, &a, u, NULL);
  }
  CHECK(!memcmp(grad, m.flat[1], (size_t)m.total * sizeof(float)),
        "a second backward gave different gradients (accumulated?)");
  // AdamW with zero gradients moves only the decayed 2-d weights.
  memset(m.flat[1], 0, (size_t)m.total * sizeof(float));
  memcpy(grad, m.flat[0], (size_t)m.total * sizeof(float)); // the parameters before
  loom_adamw_t hp = {
      .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f, .step = 1};
  for (int u = 0; u < m.nunits; u++) {
    CHECK(gpt_update_unit(&m, u, &hp) == LOOM_OK, "update %d", u);
  }
  for (int i = 0; i < m.nparams; i++) {
    int64_t off = (float *)m.param[i].data - m.flat[0];
    int moved =
        memcmp(grad + off, m.param[i].data, (size_t)loom_tensor_numel(&m.param[i]) * 4) != 0;
    CHECK(moved == (m.param[i].ndim == 2), "%s: weight decay %s", m.param[i].name,
          moved ? "applied to a vector" : "missing on a matrix");
  }
  // Sampling: deterministic per seed, within the cap.
  uint8_t t1[16] = {GPT_DOC_START}, t2[16] = {GPT_DOC_START};
  int n1 = 1, n2 = 1;
  CHECK(gpt_generate(&m, &a, t1, &n1, 12, 40, 1.0f, 5) == LOOM_OK, "generate");
  CHECK(gpt_generate(&m, &a, t2, &n2, 12, 40, 1.0f, 5) == LOOM_OK, "generate");
  CHECK(n1 >= 1 && n1 <= 12 && n1 == n2 && !memcmp(t1, t2, (size_t)n1), "sampling: %d vs %d", n1,
        n2);
  free(grad);
  gpt_batch_free(&b);
  gpt_acts_free(&a, &cfg);
  gpt_model_free(&m);
  gpt_corpus_free(&c);
}

// The parts of every unit tile its gradient buffer: each part's range ends where the next one
// to run begins (the backward runs from the end of a block's buffer to its start), and their
// names say what they hold.
static void check_parts(const gpt_model_t *m) {
  for (int u = 0; u < m->nunits; u++) {
    const float *lo = m->unit_grad[u].data, *end = lo + loom_tensor_numel(&m->unit_grad[u]);
    const int P = gpt_unit_parts(m, u);
    CHECK(P == 1 || P == GPT_MAX_PARTS ||
              (P == GPT_MAX_PARTS - 1 && gpt_block_is_moe(&m->cfg, u - 1)),
          "unit %d: %d parts", u, P);
    for (int p = 0; p < P; p++) {
      const loom_tensor_t *g = &m->part_grad[GPT_MAX_PARTS * u + p];
      const float *at = g->data;
      CHECK(at + loom_tensor_numel(g) == end,
            "unit %d part %d (%s) does not end where part %d begins", u, p, g->name, p - 1);
      end = at;
      if (P > 1) {
        char want[64];
        snprintf(want, sizeof want, "grad.h%d.%s", u - 1, gpt_part_name(m, u, p));
        CHECK(!strcmp(g->name, want), "unit %d part %d named %s, not %s", u, p, g->name, want);
      }
    }
    CHECK(end == lo, "unit %d: its parts leave %lld floats uncovered", u, (long long)(end - lo));
    CHECK(gpt_part_kind(m, u, P) == -1 && gpt_part_name(m, u, -1) == NULL,
          "unit %d: parts past the end", u);
  }
}

// The MoE layout without MPI: which blocks are MoE, their dense MLP tensors hold nothing, the
// counts shrink by that MLP, and a forward without the layer attached is refused.
static void test_moe_layout(void) {
  gpt_config_t cfg = {.layers = 4,
                      .width = 8,
                      .heads = 2,
                      .ctx = 5,
                      .vocab = 256,
                      .moe_experts = 4,
                      .moe_every = 2};
  CHECK(!gpt_block_is_moe(&cfg, 0) && gpt_block_is_moe(&cfg, 1) && !gpt_block_is_moe(&cfg, 2) &&
            gpt_block_is_moe(&cfg, 3),
        "MoE blocks of --moe-every 2 are h1 and h3");
  gpt_config_t dense = cfg;
  dense.moe_experts = 0;
  CHECK(!gpt_block_is_moe(&dense, 1), "no MoE block without experts");
  gpt_model_t m, d;
  gpt_acts_t a;
  CHECK(gpt_model_alloc(&m, &cfg) == LOOM_OK && gpt_model_alloc(&d, &dense) == LOOM_OK, "models");
  const int64_t C = cfg.width, mlp = 8 * C * C + 5 * C;
  CHECK(d.total - m.total == 2 * mlp, "MoE model %lld params, dense %lld", (long long)m.total,
        (long long)d.total);
  CHECK(d.matmul_params - m.matmul_params == 2 * 8 * C * C, "matmul params %lld vs %lld",
        (long long)m.matmul_params, (long long)d.matmul_params);
  const int fc1 = 2 + 1 * GPT_BLOCK_PARAMS + GPT_FC1_W;
  CHECK(loom_tensor_numel(&m.param[fc1]) == 0 && loom_tensor_numel(&m.param[fc1 + 3]) == 0,
        "h1 fc tensors are empty");
  CHECK(gpt_unit_parts(&m, 2) == GPT_MAX_PARTS - 1 && gpt_part_kind(&m, 2, 0) == GPT_PART_MLP,
        "h1 (MoE) has no fc2 part: %d parts, the first a kind %d", gpt_unit_parts(&m, 2),
        gpt_part_kind(&m, 2, 0));
  CHECK(m.part_grad[GPT_MAX_PARTS * 2].shape[0] == 2 * C, "h1 MLP part holds ln2 only: %lld",
        (long long)m.part_grad[GPT_MAX_PARTS * 2].shape[0]);
  check_parts(&m);
  check_parts(&d);
  CHECK(m.moe && m.moe[1] == NULL, "no layer attached yet");
  CHECK(gpt_model_set_moe(&m, 0, NULL) == LOOM_ERR_INVALID_ARG, "h0 is dense");
  CHECK(gpt_acts_alloc(&a, &cfg, cfg.ctx) == LOOM_OK, "acts");
  int32_t tok[3] = {0, 65, 66}, pos[3] = {0, 1, 2}, cu[2] = {0, 3};
  int64_t three = 3, two = 2;
  loom_tensor_t tt, pt, ct;
  loom_tensor_wrap(&tt, tok, LOOM_I32, LOOM_DEVICE_HOST, 1, &three, "tokens");
  loom_tensor_wrap(&pt, pos, LOOM_I32, LOOM_DEVICE_HOST, 1, &three, "positions");
  loom_tensor_wrap(&ct, cu, LOOM_I32, LOOM_DEVICE_HOST, 1, &two, "cu");
  CHECK(gpt_forward(&m, &a, &tt, &pt, NULL, &ct, NULL, NULL) == LOOM_ERR_INVALID_ARG,
        "forward without the MoE layers attached");
  gpt_acts_free(&a, &cfg);
  gpt_model_free(&m);
  gpt_model_free(&d);
}

// ---- MFU against sampled rates ------------------------------------------------------------------

static void test_mfu_meter(void) {
  static ex_mfu_meter_t m; // (32 KiB of kept rates)
  ex_mfu_meter_start(&m, 100.0);
  ex_mfu_meter_train(&m, 1.0);
  ex_mfu_meter_train(&m, 1.0);
  CHECK(fabs(ex_mfu_meter_ref_flops(&m) - 200.0) < 1e-9, "open stretch at the start's rate: %g",
        ex_mfu_meter_ref_flops(&m));
  ex_mfu_meter_sample(&m, 50.0); // 2 s at the mean of 100 and 50
  CHECK(fabs(ex_mfu_meter_ref_flops(&m) - 150.0) < 1e-9, "closed stretch: %g",
        ex_mfu_meter_ref_flops(&m));
  ex_mfu_meter_train(&m, 4.0);
  ex_mfu_meter_sample(&m, 0.0); // a failed sample: closed at 50, not counted
  CHECK(fabs(ex_mfu_meter_ref_flops(&m) - 350.0) < 1e-9, "failed sample: %g",
        ex_mfu_meter_ref_flops(&m));
  CHECK(m.samples == 2 && m.min == 50.0 && m.max == 100.0, "samples %d min %g max %g", m.samples,
        m.min, m.max);
  ex_mfu_meter_sample(&m, 70.0); // nothing trained since: the sums stay
  CHECK(fabs(ex_mfu_meter_ref_flops(&m) - 350.0) < 1e-9, "empty stretch: %g",
        ex_mfu_meter_ref_flops(&m));
  CHECK(ex_mfu_meter_median(&m) == 70.0, "median of 100, 50, 70: %g", ex_mfu_meter_median(&m));
  // More samples than are kept: the sums and the extremes take all of them.
  ex_mfu_meter_start(&m, 1.0);
  for (int i = 0; i < EX_MFU_MAX_SAMPLES + 10; i++) {
    ex_mfu_meter_train(&m, 1.0);
    ex_mfu_meter_sample(&m, i == EX_MFU_MAX_SAMPLES + 5 ? 9.0 : 1.0);
  }
  CHECK(m.samples == EX_MFU_MAX_SAMPLES + 11 && m.max == 9.0, "samples %d max %g", m.samples,
        m.max);
  CHECK(fabs(ex_mfu_meter_ref_flops(&m) - (EX_MFU_MAX_SAMPLES + 10 + 8.0)) < 1e-6, "sum %g",
        ex_mfu_meter_ref_flops(&m));
  CHECK(ex_mfu_meter_median(&m) == 1.0, "median %g", ex_mfu_meter_median(&m));
}

// The compressed allreduces' seeds: one per (step, tensor), the same for the same pair.
static void test_compress_seeds(void) {
  enum { STEPS = 64, TENSORS = 64 };
  static uint64_t seen[STEPS * TENSORS];
  int n = 0, dup = 0;
  for (int step = 0; step < STEPS; step++) {
    for (int t = 0; t < TENSORS; t++) {
      const uint64_t x = ex_compress_seed((uint64_t)step, t);
      for (int i = 0; i < n && !dup; i++) {
        dup = seen[i] == x;
      }
      seen[n++] = x;
    }
  }
  CHECK(!dup, "two (step, tensor) pairs share a compression seed");
  CHECK(ex_compress_seed(7, 3) == seen[7 * TENSORS + 3],
        "the seed of (7, 3) changed between calls");
}

// --compare: equal dumps pass, all-zero ones included (0 vs 0 is no relative difference); a
// changed element or a NaN fails.
static void test_compare(void) {
  const float zeros[4] = {0}, one[4] = {0, 0, 1e-3f, 0}, nan[4] = {0, NAN, 0, 0};
  char pz[600], p1[600], pn[600];
  write_file("z.bin", (const char *)zeros, sizeof zeros);
  write_file("one.bin", (const char *)one, sizeof one);
  write_file("nan.bin", (const char *)nan, sizeof nan);
  snprintf(pz, sizeof pz, "%s/z.bin", tmpdir);
  snprintf(p1, sizeof p1, "%s/one.bin", tmpdir);
  snprintf(pn, sizeof pn, "%s/nan.bin", tmpdir);
  CHECK(ex_compare_dumps(pz, pz, 1e-5) == 0, "two all-zero dumps differ");
  CHECK(ex_compare_dumps(pz, p1, 1e-5) == 1, "a changed element passed");
  CHECK(ex_compare_dumps(pn, pn, 1e-5) == 1, "a NaN passed");
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test_gpt.XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  test_load_file();
  test_load_dir_and_errors();
  test_batches();
  test_gradients();
  test_moe_layout();
  test_mfu_meter();
  test_compress_seeds();
  test_compare();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) {
    fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  return check_exit("test_gpt");
}
