/* sim_io.c — loom_sim's files: the profile a run records (save, and a loader that treats the
 * bytes as untrusted) and the cluster description. */
#include "config.h"
#include "loom_sim.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "sched_internal.h"

// Limits on what a profile may hold (a damaged count must not become a huge allocation).
#define SIM_MAX_TENSORS 100000
#define SIM_MAX_CODECS  64
#define SIM_MAX_DOCS    1000000
#define SIM_LINE_MAX    65536               // a batch of documents is one line
#define SIM_PROFILE_MAX ((uint64_t)1 << 28) // bytes: far above the counts' limits as text
#define SIM_CLUSTER_MAX ((uint64_t)1 << 20) // bytes: a cluster is a few lines

// The format, one record per line (numbers in C locale, names without spaces):
//   loom-profile 1
//   run NP TOKENS CTX COMPUTE_MS STEP_MS OVERHEAD_MS
//   attn ATTN_MS PAIRS Q_ROW_BYTES KV_ROW_BYTES [ROW_COST [EXCHANGE_MS]]   (0 when left out)
//   moe LAYERS EXPERTS TOPK HIDDEN MOE_MS FINE_HIDDEN
//   moe_load COUNT ... (one per profiled step: assignments per expert, every MoE layer summed)
//   tensor NAME FLOATS READY_US                     (one per gradient, in ready order)
//   codec SPEC ENC_US ENC_NS DEC_US DEC_NS BYTES_PER_VALUE FIXED_BYTES
//   docs LEN LEN ...            (a sample of document lengths, drawn one by one; any lines), or
//   batch LEN LEN ...           (the documents of one rank's batch, drawn whole; one per line;
//                                without lengths, no batch)
//   end
// A name the loader reads back as one field: 1 .. LOOM_NAME_MAX - 1 characters, no white space.
static int field_ok(const char *s) {
  return s && *s && strlen(s) < LOOM_NAME_MAX && !strpbrk(s, " \t\r\n\v\f");
}

loom_status_t loom_sim_profile_save(const char *path, const loom_sim_profile_t *p) {
  if (!path || !p) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_sim_profile_save: path or profile is NULL");
  }
  for (int i = 0; i < p->ntensors + p->ncodecs; i++) { // (before the file is touched)
    const int t = i < p->ntensors;
    const char *name = t ? p->tensors[i].name : p->codecs[i - p->ntensors].compressor;
    if ((name || !t) && !field_ok(name)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "loom_sim_profile_save: %s %d is '%.96s': a profile holds names of 1 to "
                        "%d characters without spaces (the loader reads a line's fields apart "
                        "at spaces); rename it",
                        t ? "tensor" : "codec", t ? i : i - p->ntensors, name ? name : "(null)",
                        LOOM_NAME_MAX - 1);
    }
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    return loom_error(NULL, LOOM_ERR_SYSTEM, "cannot write the profile %s: %s (check the folder)",
                      path, strerror(errno));
  }
  fprintf(f, "loom-profile 1\n");
  fprintf(f, "run %d %lld %lld %.6f %.6f %.6f\n", p->np, (long long)p->tokens, (long long)p->ctx,
          p->compute_ms, p->step_ms, p->overhead_ms);
  fprintf(f, "attn %.6f %.1f %.1f %.1f %.3f %.6f\n", p->attn_ms, p->attn_pairs, p->attn_q_bytes,
          p->attn_kv_bytes, p->attn_row_cost, p->attn_exchange_ms);
  fprintf(f, "moe %d %d %d %d %.6f %.4f\n", p->moe_layers, p->moe_experts, p->moe_topk,
          p->moe_hidden, p->moe_ms, p->moe_fine_hidden);
  for (int k = 0; k < p->moe_steps; k++) {
    fprintf(f, "moe_load");
    for (int e = 0; e < p->moe_experts; e++) {
      fprintf(f, " %.0f", p->moe_load[(size_t)k * p->moe_experts + e]);
    }
    fprintf(f, "\n");
  }
  for (int i = 0; i < p->ntensors; i++) {
    fprintf(f, "tensor %s %lld %.3f\n", p->tensors[i].name ? p->tensors[i].name : "grad",
            (long long)p->tensors[i].n, p->tensors[i].ready_us);
  }
  for (int i = 0; i < p->ncodecs; i++) {
    const loom_codec_cost_t *c = &p->codecs[i];
    fprintf(f, "codec %s %.4f %.4f %.4f %.4f %.6f %.1f\n", c->compressor, c->enc_us, c->enc_ns,
            c->dec_us, c->dec_ns, c->bytes_per_value, c->fixed_bytes);
  }
  for (int k = 0; k < p->nbatches; k++) { // whole batches: one line each
    fprintf(f, "batch");
    for (int i = k ? p->batch_end[k - 1] : 0; i < p->batch_end[k]; i++) {
      fprintf(f, " %lld", (long long)p->docs[i]);
    }
    fprintf(f, "\n");
  }
  for (int i = 0; p->nbatches == 0 && i < p->ndocs; i++) { // a plain sample, 32 a line
    fprintf(f, "%s%lld%s", i % 32 == 0 ? "docs " : " ", (long long)p->docs[i],
            i % 32 == 31 || i == p->ndocs - 1 ? "\n" : "");
  }
  fprintf(f, "end\n");
  int bad = ferror(f);
  bad |= fclose(f) != 0;
  return bad ? loom_error(NULL, LOOM_ERR_SYSTEM, "writing the profile %s failed (disk full?)", path)
             : LOOM_OK;
}

void loom_sim_profile_free(loom_sim_profile_t *p) {
  if (!p) {
    return;
  }
  for (int i = 0; p->tensors && i < p->ntensors; i++) {
    free((char *)p->tensors[i].name);
  }
  for (int i = 0; p->codecs && i < p->ncodecs; i++) {
    free((char *)p->codecs[i].compressor);
  }
  free(p->tensors);
  free(p->codecs);
  free(p->docs);
  free(p->batch_end);
  free(p->moe_load);
  memset(p, 0, sizeof *p);
}

// ---- the untrusted reader ---------------------------------------------------------------------

typedef struct reader {
  const char *path;
  int line;
  char *save;         // strtok_r state
  loom_status_t code; // what a malformed line is: CORRUPT (profile) or INVALID_ARG (cluster)
  loom_status_t err;  // the first error
} reader_t;

// The next token of the line as a finite double in [lo, hi]; 0 or -1 (error set).
static int num(reader_t *r, const char *what, double lo, double hi, double *out) {
  const char *tok = strtok_r(NULL, " \t\r\n", &r->save);
  char *end = NULL;
  double v = tok ? strtod(tok, &end) : NAN;
  if (!tok || *end || !isfinite(v) || v < lo || v > hi) {
    r->err = loom_error(NULL, r->code, "%s line %d: %s is %s%s%s, expected a number in [%g, %g]",
                        r->path, r->line, what, tok ? "'" : "missing", tok ? tok : "",
                        tok ? "'" : "", lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

static int inum(reader_t *r, const char *what, double lo, double hi, int64_t *out) {
  double v;
  if (num(r, what, lo, hi, &v) != 0) {
    return -1;
  }
  if (v != floor(v)) {
    r->err = loom_error(NULL, r->code, "%s line %d: %s is %g, expected an integer", r->path,
                        r->line, what, v);
    return -1;
  }
  *out = (int64_t)v;
  return 0;
}

static char *word(reader_t *r, const char *what) {
  const char *tok = strtok_r(NULL, " \t\r\n", &r->save);
  if (!tok || strlen(tok) >= LOOM_NAME_MAX) {
    r->err = loom_error(NULL, r->code, "%s line %d: %s is %s (at most %d characters)", r->path,
                        r->line, what, tok ? "too long" : "missing", LOOM_NAME_MAX - 1);
    return NULL;
  }
  char *s = strdup(tok);
  if (!s) {
    r->err = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", r->path);
  }
  return s;
}

// Nothing may follow a record's fields: 0, or -1 (error set). (A line break turned into a space
// joined two records into one line, and the second was dropped as trailing text.)
static int line_end(reader_t *r, const char *key) {
  const char *tok = strtok_r(NULL, " \t\r\n", &r->save);
  if (tok) {
    r->err = loom_error(NULL, r->code,
                        "%s line %d: '%.32s' after the fields of '%s' (one record a line: a line "
                        "break lost?)",
                        r->path, r->line, tok, key);
    return -1;
  }
  return 0;
}

// Grow *arr (elements of size) to hold n + 1 entries, up to max. 0 or -1 (error set).
static int grow(reader_t *r, void **arr, int n, int *cap, size_t size, int max, const char *what) {
  if (n >= max) {
    r->err = loom_error(NULL, r->code, "%s line %d: more than %d %s", r->path, r->line, max, what);
    return -1;
  }
  if (n < *cap) {
    return 0;
  }
  int ncap = *cap ? 2 * *cap : 64;
  void *a = realloc(*arr, (size_t)ncap * size);
  if (!a) {
    r->err = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", r->path);
    return -1;
  }
  *arr = a;
  *cap = ncap;
  return 0;
}

static int read_record(reader_t *r, const char *key, loom_sim_profile_t *p, int caps[5],
                       int *seen) {
  int64_t i64[5];
  double d[6];
  if (!strcmp(key, "run")) {
    if (inum(r, "np", 1, 1 << 20, &i64[0]) || inum(r, "tokens", 1, 1e12, &i64[1]) ||
        inum(r, "ctx", 1, 1e9, &i64[2]) || num(r, "compute_ms", 0, 1e9, &d[0]) ||
        num(r, "step_ms", 0, 1e9, &d[1]) || num(r, "overhead_ms", 0, 1e9, &d[2])) {
      return -1;
    }
    p->np = (int)i64[0];
    p->tokens = i64[1];
    p->ctx = i64[2];
    p->compute_ms = d[0];
    p->step_ms = d[1];
    p->overhead_ms = d[2];
    seen[0] = 1;
  } else if (!strcmp(key, "attn")) {
    if (num(r, "attn_ms", 0, 1e9, &p->attn_ms) || num(r, "pairs", 0, 1e18, &p->attn_pairs) ||
        num(r, "q_row_bytes", 0, 1e12, &p->attn_q_bytes) ||
        num(r, "kv_row_bytes", 0, 1e12, &p->attn_kv_bytes)) {
      return -1;
    }
    p->attn_row_cost = p->attn_exchange_ms = 0.0;
    const char *more = r->save;
    more += more ? strspn(more, " \t\r\n") : 0;
    if (more && *more && num(r, "row_cost", 0, 1e9, &p->attn_row_cost)) {
      return -1;
    }
    more = r->save;
    more += more ? strspn(more, " \t\r\n") : 0;
    if (more && *more && num(r, "exchange_ms", 0, 1e9, &p->attn_exchange_ms)) {
      return -1;
    }
    if (p->attn_exchange_ms > p->attn_ms) {
      r->err = loom_error(NULL, r->code,
                          "%s line %d: exchange_ms %g is more than attn_ms %g (the exchanges are "
                          "part of the attention time): record the profile again with train_gpt "
                          "--profile",
                          r->path, r->line, p->attn_exchange_ms, p->attn_ms);
      return -1;
    }
  } else if (!strcmp(key, "moe")) {
    if (inum(r, "layers", 0, 1e6, &i64[0]) || inum(r, "experts", 0, 1e6, &i64[1]) ||
        inum(r, "topk", 0, 1e6, &i64[2]) || inum(r, "hidden", 0, 1e9, &i64[3]) ||
        num(r, "moe_ms", 0, 1e9, &p->moe_ms) || num(r, "fine_hidden", 0, 1, &p->moe_fine_hidden)) {
      return -1;
    }
    if (p->moe_steps > 0) {
      r->err = loom_error(NULL, r->code, "profile %s line %d: a moe line after moe_load lines",
                          r->path, r->line);
      return -1;
    }
    p->moe_layers = (int)i64[0];
    p->moe_experts = (int)i64[1];
    p->moe_topk = (int)i64[2];
    p->moe_hidden = (int)i64[3];
  } else if (!strcmp(key, "moe_load")) {
    if (p->moe_experts < 1 || p->moe_experts > 4096) {
      r->err = loom_error(NULL, r->code,
                          "profile %s line %d: moe_load before a moe line with 1..4096 experts",
                          r->path, r->line);
      return -1;
    }
    const int E = p->moe_experts;
    const int64_t need = (int64_t)(p->moe_steps + 1) * E;
    if (need > SIM_MAX_DOCS) {
      r->err = loom_error(NULL, r->code, "%s line %d: more than %d expert loads", r->path, r->line,
                          SIM_MAX_DOCS);
      return -1;
    }
    if (need > caps[4]) {
      const int64_t ncap = need > 2 * (int64_t)caps[4] ? need : 2 * (int64_t)caps[4];
      void *a = realloc(p->moe_load, (size_t)ncap * sizeof *p->moe_load);
      if (!a) {
        r->err = loom_error(NULL, LOOM_ERR_NOMEM, "%s: out of memory", r->path);
        return -1;
      }
      p->moe_load = a;
      caps[4] = (int)ncap;
    }
    for (int e = 0; e < E; e++) {
      if (num(r, "an expert's assignments", 0, 1e15, &p->moe_load[(size_t)p->moe_steps * E + e])) {
        return -1;
      }
    }
    p->moe_steps++;
  } else if (!strcmp(key, "tensor")) {
    if (grow(r, (void **)&p->tensors, p->ntensors, &caps[0], sizeof *p->tensors, SIM_MAX_TENSORS,
             "tensors")) {
      return -1;
    }
    loom_plan_tensor_t *t = &p->tensors[p->ntensors];
    memset(t, 0, sizeof *t);
    if (!(t->name = word(r, "the tensor name"))) {
      return -1;
    }
    p->ntensors++; // owns the name from here
    if (inum(r, "floats", 0, 1e13, &t->n) || num(r, "ready_us", 0, 1e12, &t->ready_us)) {
      return -1;
    }
  } else if (!strcmp(key, "codec")) {
    if (grow(r, (void **)&p->codecs, p->ncodecs, &caps[1], sizeof *p->codecs, SIM_MAX_CODECS,
             "codecs")) {
      return -1;
    }
    loom_codec_cost_t *c = &p->codecs[p->ncodecs];
    memset(c, 0, sizeof *c);
    if (!(c->compressor = word(r, "the codec spec"))) {
      return -1;
    }
    p->ncodecs++;
    if (num(r, "enc_us", 0, 1e9, &c->enc_us) || num(r, "enc_ns", 0, 1e9, &c->enc_ns) ||
        num(r, "dec_us", 0, 1e9, &c->dec_us) || num(r, "dec_ns", 0, 1e9, &c->dec_ns) ||
        num(r, "bytes_per_value", 0, 64, &c->bytes_per_value) ||
        num(r, "fixed_bytes", 0, 1e9, &c->fixed_bytes)) {
      return -1;
    }
  } else if (!strcmp(key, "docs") || !strcmp(key, "batch")) {
    const int batch = key[0] == 'b';
    if (p->ndocs > 0 && batch != (p->nbatches > 0)) {
      r->err = loom_error(NULL, r->code,
                          "profile %s line %d: 'docs' and 'batch' lines mixed (a profile holds "
                          "a plain sample or whole batches)",
                          r->path, r->line);
      return -1;
    }
    const int before = p->ndocs;
    int64_t len;
    while (r->save && *r->save && strspn(r->save, " \t\r\n") < strlen(r->save)) {
      if (grow(r, (void **)&p->docs, p->ndocs, &caps[2], sizeof *p->docs, SIM_MAX_DOCS, "docs") ||
          inum(r, "a document length", 1, 1e9, &len)) {
        return -1;
      }
      p->docs[p->ndocs++] = len;
    }
    if (batch && p->ndocs > before) { // (a batch line without lengths holds no batch)
      if (grow(r, (void **)&p->batch_end, p->nbatches, &caps[3], sizeof *p->batch_end, SIM_MAX_DOCS,
               "batches")) {
        return -1;
      }
      p->batch_end[p->nbatches++] = p->ndocs;
    }
  } else if (!strcmp(key, "end")) {
    seen[1] = 1;
  } else {
    r->err =
        loom_error(NULL, r->code, "profile %s line %d: unknown record '%s'", r->path, r->line, key);
    return -1;
  }
  return line_end(r, key);
}

loom_status_t loom_sim_profile_load(const char *path, loom_sim_profile_t *p) {
  if (!path || !p) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_sim_profile_load: path or profile is NULL");
  }
  memset(p, 0, sizeof *p);
  int not_regular = 0;
  FILE *f = loom_fopen_regular(path, "r", SIM_PROFILE_MAX, NULL, &not_regular);
  if (!f && !not_regular) {
    return loom_error(NULL, LOOM_ERR_SYSTEM,
                      "cannot read the profile %s: %s (record one with train_gpt --profile FILE)",
                      path, strerror(errno));
  }
  if (!f) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "the profile %s is not a regular file of at most 256 MiB: pass the file "
                      "that train_gpt --profile FILE wrote",
                      path);
  }
  char *line = malloc(SIM_LINE_MAX);
  if (!line) {
    fclose(f);
    return loom_error(NULL, LOOM_ERR_NOMEM, "profile %s: out of memory", path);
  }
  reader_t r = {.path = path, .code = LOOM_ERR_CORRUPT};
  int caps[5] = {0, 0, 0, 0, 0}, seen[2] = {0, 0}, bad = 0;
  while (!bad && !seen[1] && fgets(line, SIM_LINE_MAX, f)) {
    r.line++;
    if (!strchr(line, '\n') && !feof(f)) {
      r.err = loom_error(NULL, LOOM_ERR_CORRUPT, "profile %s line %d: longer than %d bytes", path,
                         r.line, SIM_LINE_MAX - 1);
      bad = 1;
      break;
    }
    char *key = strtok_r(line, " \t\r\n", &r.save);
    if (r.line == 1) {
      const char *v = strtok_r(NULL, " \t\r\n", &r.save);
      if (!key || strcmp(key, "loom-profile") != 0 || !v || strcmp(v, "1") != 0) {
        r.err = loom_error(NULL, LOOM_ERR_CORRUPT,
                           "%s is not a loom profile of version 1 (its first line should be "
                           "'loom-profile 1')",
                           path);
        bad = 1;
      }
      continue;
    }
    if (!key || key[0] == '#') {
      continue;
    }
    bad = read_record(&r, key, p, caps, seen) != 0;
  }
  fclose(f);
  free(line);
  if (!bad && (!seen[0] || !seen[1])) {
    r.err = loom_error(NULL, LOOM_ERR_CORRUPT, "profile %s is truncated: no '%s' line", path,
                       seen[0] ? "end" : "run");
    bad = 1;
  }
  if (!bad && p->moe_layers > 0 &&
      (p->moe_experts < 1 || p->moe_topk < 1 || p->moe_topk > p->moe_experts ||
       p->moe_hidden < 1)) {
    r.err = loom_error(NULL, LOOM_ERR_CORRUPT,
                       "profile %s: %d MoE layers but experts %d, top-k %d, hidden %d (all must be "
                       ">= 1, top-k at most the experts, as a layer takes them)",
                       path, p->moe_layers, p->moe_experts, p->moe_topk, p->moe_hidden);
    bad = 1;
  }
  if (bad) {
    loom_sim_profile_free(p);
    return r.err;
  }
  return LOOM_OK;
}

// ---- the cluster ------------------------------------------------------------------------------

static int cluster_link(reader_t *r, loom_link_t *l, int *shared) {
  if (num(r, "alpha_us", 0, 1e7, &l->alpha_us) || num(r, "gbps", 1e-6, 1e6, &l->gbps)) {
    return -1;
  }
  const char *opt = strtok_r(NULL, " \t\r\n", &r->save);
  *shared = opt && !strcmp(opt, "shared");
  if (opt && !*shared) {
    r->err = loom_error(NULL, r->code, "%s line %d: '%s' after the link: only 'shared'", r->path,
                        r->line, opt);
    return -1;
  }
  return 0;
}

loom_status_t loom_sim_cluster_load(const char *path, loom_sim_cluster_t *c) {
  if (!path || !c) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_sim_cluster_load: path or cluster is NULL");
  }
  memset(c, 0, sizeof *c);
  int not_regular = 0;
  FILE *f = loom_fopen_regular(path, "r", SIM_CLUSTER_MAX, NULL, &not_regular);
  if (!f && !not_regular) {
    return loom_error(NULL, LOOM_ERR_SYSTEM, "cannot read the cluster file %s: %s", path,
                      strerror(errno));
  }
  if (!f) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "the cluster file %s is not a regular file of at most 1 MiB: pass a text "
                      "file of a few lines (see loom_sim --help for the format)",
                      path);
  }
  char line[4096];
  reader_t r = {.path = path, .code = LOOM_ERR_INVALID_ARG};
  int bad = 0, have_intra = 0, have_inter = 0;
  int64_t v;
  while (!bad && fgets(line, sizeof line, f)) {
    r.line++;
    if (!strchr(line, '\n') && !feof(f)) { // (its rest would be read as a line of its own)
      r.err = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                         "cluster %s line %d: longer than %d bytes: a cluster line is a key and "
                         "a few values (see loom_sim --help for the format)",
                         path, r.line, (int)sizeof line - 1);
      bad = 1;
      break;
    }
    char *hash = strchr(line, '#'); // a comment runs to the end of its line
    if (hash) {
      *hash = 0;
    }
    char *key = strtok_r(line, " \t\r\n", &r.save);
    if (!key) {
      continue;
    }
    if (!strcmp(key, "name")) {
      const char *n = strtok_r(NULL, " \t\r\n", &r.save);
      snprintf(c->name, sizeof c->name, "%s", n ? n : "");
    } else if (!strcmp(key, "nodes") || !strcmp(key, "ranks_per_node") ||
               !strcmp(key, "cores_per_node")) {
      bad = inum(&r, key, 1, 1 << 24, &v) != 0;
      int *dst = key[0] == 'n'   ? &c->nodes
                 : key[0] == 'r' ? &c->ranks_per_node
                                 : &c->cores_per_node;
      *dst = bad ? 0 : (int)v; // (v is not set when the value is refused)
    } else if (!strcmp(key, "intra")) {
      bad = cluster_link(&r, &c->intra, &c->intra_shared) != 0;
      have_intra = 1;
    } else if (!strcmp(key, "inter")) {
      bad = cluster_link(&r, &c->inter, &c->inter_shared) != 0;
      have_inter = 1;
    } else if (!strcmp(key, "timeshare")) {
      bad = num(&r, "timeshare", 0, 10, &c->timeshare) != 0;
    } else {
      r.err = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                         "cluster %s line %d: unknown key '%s' (name, nodes, ranks_per_node, "
                         "cores_per_node, intra, inter, timeshare)",
                         path, r.line, key);
      bad = 1;
    }
    bad = bad || line_end(&r, key) != 0;
  }
  fclose(f);
  if (bad) {
    return r.err;
  }
  if (!c->nodes || !c->ranks_per_node || !c->cores_per_node || !have_intra) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "cluster %s: nodes, ranks_per_node, cores_per_node and intra are required "
                      "(see loom_sim --help for the format)",
                      path);
  }
  if (!have_inter) { // one node, or the same link everywhere
    c->inter = c->intra;
    c->inter_shared = c->intra_shared;
  }
  if (!c->name[0]) {
    snprintf(c->name, sizeof c->name, "%dx%d", c->nodes, c->ranks_per_node);
  }
  return LOOM_OK;
}
