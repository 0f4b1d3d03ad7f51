/* gpt_data.c — load a byte-level text corpus as documents, split train/validation, and cut
 * packed varlen batches (rows of ctx tokens, sequences split at document starts). */
#define _POSIX_C_SOURCE 200809L // strdup, fileno, directory listing
#include "gpt_data.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "example_util.h"

// ---- reading files ----------------------------------------------------------------------------

// A growing list of documents as (offset, length) into one byte buffer.
typedef struct docs {
  uint8_t *bytes;
  int64_t len, cap;
  int64_t *off, *n; // (count)
  int64_t count, cap_docs;
} docs_t;

static int docs_add(docs_t *d, const uint8_t *p, int64_t n) {
  if (n <= 0) {
    return 0;
  }
  if (d->len + n > d->cap) {
    int64_t cap = d->cap ? d->cap : 1 << 20;
    while (cap < d->len + n) {
      cap *= 2;
    }
    uint8_t *b = realloc(d->bytes, (size_t)cap);
    if (!b) {
      return -1;
    }
    d->bytes = b;
    d->cap = cap;
  }
  if (d->count == d->cap_docs) {
    int64_t cap = d->cap_docs ? 2 * d->cap_docs : 1024;
    int64_t *o = realloc(d->off, (size_t)cap * sizeof *o);
    if (!o) {
      return -1;
    }
    d->off = o;
    int64_t *m = realloc(d->n, (size_t)cap * sizeof *m);
    if (!m) {
      return -1;
    }
    d->n = m;
    d->cap_docs = cap;
  }
  memcpy(d->bytes + d->len, p, (size_t)n);
  d->off[d->count] = d->len;
  d->n[d->count] = n;
  d->count++;
  d->len += n;
  return 0;
}

static void docs_free(docs_t *d) {
  free(d->bytes);
  free(d->off);
  free(d->n);
  memset(d, 0, sizeof *d);
}

// Split buf at lines holding only "%" (with or without a trailing '\r').
static int split_documents(docs_t *d, const uint8_t *buf, int64_t n) {
  int64_t doc = 0, line = 0;
  while (line < n) {
    const uint8_t *nl = memchr(buf + line, '\n', (size_t)(n - line));
    int64_t end = nl ? (int64_t)(nl - buf) + 1 : n; // one past the line's newline
    int64_t body = end - line - (nl ? 1 : 0);
    if (body > 0 && buf[line + body - 1] == '\r') {
      body--;
    }
    if (body == 1 && buf[line] == '%') {
      if (docs_add(d, buf + doc, line - doc)) {
        return -1;
      }
      doc = end;
    }
    line = end;
  }
  return docs_add(d, buf + doc, n - doc);
}

// ---- listing files ----------------------------------------------------------------------------

// Every file to read, listed (and checked) before any is read: a file reached twice and a corpus
// too large are refused before gigabytes are read.
struct listed_file {
  dev_t dev;
  ino_t ino;
  int64_t size;
  size_t order; // position in the list: files are read in this order
  char *path;
};

typedef struct file_list {
  struct listed_file *f; // (n)
  size_t n, cap;
  int64_t total; // bytes
} file_list_t;

static void file_list_free(file_list_t *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->f[i].path);
  }
  free(l->f);
  memset(l, 0, sizeof *l);
}

static int list_file(file_list_t *l, const char *path, char *err, size_t errlen) {
  struct stat st; // stat, never open: opening a FIFO would wait for a writer
  if (stat(path, &st) != 0) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen,
             "%s is not a regular file (a FIFO, device or socket): give text files "
             "or directories of them",
             path);
    return -1;
  }
  if (st.st_size > GPT_MAX_FILE) {
    snprintf(err, errlen,
             "%s holds %lld bytes, over the limit of %ld a file: split it into "
             "smaller files (a directory of them is read whole)",
             path, (long long)st.st_size, GPT_MAX_FILE);
    return -1;
  }
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    struct listed_file *more = realloc(l->f, cap * sizeof *more);
    if (!more) {
      snprintf(err, errlen, "out of memory listing %s", path);
      return -1;
    }
    l->f = more;
    l->cap = cap;
  }
  struct listed_file *f = &l->f[l->n];
  if (!(f->path = strdup(path))) {
    snprintf(err, errlen, "out of memory listing %s", path);
    return -1;
  }
  f->dev = st.st_dev;
  f->ino = st.st_ino;
  f->size = st.st_size;
  f->order = l->n++;
  l->total += st.st_size;
  return 0;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

// Every regular file of dir in name order (not hidden, not .dat/.u8).
static int list_dir(file_list_t *l, const char *dir, char *err, size_t errlen) {
  DIR *dh = opendir(dir);
  if (!dh) {
    snprintf(err, errlen, "cannot open directory %s: %s", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (struct dirent *e; (e = readdir(dh)) != NULL;) {
    if (e->d_name[0] == '.' || ends_with(e->d_name, ".dat") || ends_with(e->d_name, ".u8")) {
      continue;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **more = realloc(names, cap * sizeof *names);
      if (!more) {
        rc = -1;
        break;
      }
      names = more;
    }
    if (!(names[n] = strdup(e->d_name))) {
      rc = -1;
      break;
    }
    n++;
  }
  closedir(dh);
  if (rc) {
    snprintf(err, errlen, "out of memory listing %s", dir);
  } else if (n) {
    qsort(names, n, sizeof *names, cmp_names);
  }
  for (size_t i = 0; i < n && !rc; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
      continue; // subdirectories (fortunes' "off") and dangling links
    }
    rc = list_file(l, path, err, errlen);
  }
  for (size_t i = 0; i < n; i++) {
    free(names[i]);
  }
  free(names);
  return rc;
}

static int cmp_identity(const void *pa, const void *pb) {
  const struct listed_file *a = pa, *b = pb;
  if (a->dev != b->dev) {
    return a->dev < b->dev ? -1 : 1;
  }
  if (a->ino != b->ino) {
    return a->ino < b->ino ? -1 : 1;
  }
  return a->order < b->order ? -1 : (a->order > b->order);
}

static int cmp_order(const void *pa, const void *pb) {
  const struct listed_file *a = pa, *b = pb;
  return a->order < b->order ? -1 : (a->order > b->order);
}

// -1 with err naming both paths when one file is listed twice (a path repeated, a link to it, or
// a file inside a directory also given), or when the files sum to over GPT_MAX_CORPUS bytes.
static int refuse_list(file_list_t *l, char *err, size_t errlen) {
  int rc = 0;
  qsort(l->f, l->n, sizeof *l->f, cmp_identity);
  for (size_t i = 1; i < l->n && !rc; i++) {
    if (l->f[i].dev == l->f[i - 1].dev && l->f[i].ino == l->f[i - 1].ino) {
      const char *a = l->f[i - 1].path, *b = l->f[i].path;
      if (!strcmp(a, b)) {
        snprintf(err, errlen,
                 "%s would be read twice, so its documents would count twice: give each file "
                 "or directory once with --data",
                 a);
      } else {
        snprintf(err, errlen,
                 "%s is the file %s again (a link or another name for it, in a directory or "
                 "on the command line), so its documents would count twice: remove the extra "
                 "link, or give each file or directory once with --data",
                 b, a);
      }
      rc = -1;
    }
  }
  qsort(l->f, l->n, sizeof *l->f, cmp_order);
  if (!rc && l->total > GPT_MAX_CORPUS) {
    snprintf(err, errlen,
             "the corpus holds %lld bytes in %zu files, over the limit of %ld: every rank "
             "holds all of it; give fewer or smaller files with --data",
             (long long)l->total, l->n, GPT_MAX_CORPUS);
    rc = -1;
  }
  return rc;
}

// ---- reading files ----------------------------------------------------------------------------

static int read_file(docs_t *d, const struct listed_file *lf, char *err, size_t errlen) {
  const char *path = lf->path;
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  // The size listed; a file that grew since is read to that size, one that shrank fails.
  uint8_t *buf = malloc((size_t)lf->size + 1);
  size_t got = buf ? fread(buf, 1, (size_t)lf->size, f) : 0;
  int failed = buf && ferror(f), saved = errno;
  fclose(f);
  if (!buf || failed || got != (size_t)lf->size) {
    snprintf(err, errlen, "reading %s failed: %s", path,
             !buf     ? "out of memory"
             : failed ? strerror(saved)
                      : "it is shorter than when it was listed (it changed while loading)");
    free(buf);
    return -1;
  }
  const uint8_t *nul = memchr(buf, 0, got); // byte 0 is the model's document start
  if (nul) {
    snprintf(err, errlen,
             "%s holds a NUL byte at offset %lld: it looks like a binary file, and "
             "byte 0 marks where documents start; give text files",
             path, (long long)(nul - buf));
    free(buf);
    return -1;
  }
  int rc = split_documents(d, buf, (int64_t)got);
  free(buf);
  if (rc) {
    snprintf(err, errlen, "out of memory reading %s", path);
  }
  return rc;
}

// ---- streams ----------------------------------------------------------------------------------

static int build_stream(gpt_stream_t *s, const docs_t *d, const int64_t *order, int64_t first,
                        int64_t last) {
  int64_t len = 1;
  for (int64_t i = first; i < last; i++) {
    len += 1 + d->n[order[i]];
  }
  s->tokens = malloc((size_t)len);
  s->doc_starts = malloc((size_t)(last - first) * sizeof(int64_t) + 1);
  if (!s->tokens || !s->doc_starts) {
    return -1;
  }
  int64_t o = 0;
  for (int64_t i = first; i < last; i++) {
    s->doc_starts[i - first] = o;
    s->tokens[o++] = GPT_DOC_START;
    memcpy(s->tokens + o, d->bytes + d->off[order[i]], (size_t)d->n[order[i]]);
    o += d->n[order[i]];
  }
  s->tokens[o++] = GPT_DOC_START;
  s->len = o;
  s->docs = last - first;
  return 0;
}

static void stream_free(gpt_stream_t *s) {
  free(s->tokens);
  free(s->doc_starts);
  memset(s, 0, sizeof *s);
}

static double unigram_entropy(const gpt_stream_t *s) {
  int64_t count[256] = {0};
  for (int64_t i = 1; i < s->len; i++) { // the targets: every token but the first
    count[s->tokens[i]]++;
  }
  double h = 0.0, n = (double)(s->len - 1);
  for (int b = 0; b < 256; b++) {
    if (count[b]) {
      double p = (double)count[b] / n;
      h -= p * log(p);
    }
  }
  return h;
}

int gpt_corpus_load(const char *const *paths, int npaths, double val_frac, uint64_t seed,
                    gpt_corpus_t *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  docs_t d = {0};
  int rc = 0;
  file_list_t files = {0};
  for (int i = 0; i < npaths && !rc; i++) {
    struct stat st;
    if (stat(paths[i], &st) != 0) {
      if (!strcmp(paths[i], GPT_DEFAULT_DATA)) {
        snprintf(err, errlen,
                 "the default corpus %s is missing: install the Debian package 'fortunes' "
                 "(apt-get install fortunes) or give text files with --data",
                 GPT_DEFAULT_DATA);
      } else {
        snprintf(err, errlen, "--data %s: %s", paths[i], strerror(errno));
      }
      rc = -1;
    } else if (S_ISDIR(st.st_mode)) {
      rc = list_dir(&files, paths[i], err, errlen);
    } else {
      rc = list_file(&files, paths[i], err, errlen);
    }
  }
  if (!rc) {
    rc = refuse_list(&files, err, errlen);
  }
  for (size_t i = 0; i < files.n && !rc; i++) {
    rc = read_file(&d, &files.f[i], err, errlen);
    c->files += !rc;
  }
  file_list_free(&files);
  if (!rc && d.count < 2) {
    snprintf(err, errlen,
             "the corpus has %lld non-empty document(s); at least 2 are needed (one to train, one "
             "to validate): give more text with --data",
             (long long)d.count);
    rc = -1;
  }
  int64_t *order = rc ? NULL : malloc((size_t)d.count * sizeof *order);
  if (!rc && !order) {
    snprintf(err, errlen, "out of memory");
    rc = -1;
  }
  if (!rc) {
    for (int64_t i = 0; i < d.count; i++) {
      order[i] = i;
    }
    uint64_t state = seed ^ 0x5eed0fda7aull;
    for (int64_t i = d.count - 1; i > 0; i--) { // Fisher-Yates
      int64_t j = (int64_t)(ex_splitmix64(&state) % (uint64_t)(i + 1));
      int64_t t = order[i];
      order[i] = order[j];
      order[j] = t;
    }
    int64_t nval = (int64_t)ceil(val_frac * (double)d.count);
    nval = nval < 1 ? 1 : (nval > d.count - 1 ? d.count - 1 : nval);
    if (build_stream(&c->train, &d, order, 0, d.count - nval) ||
        build_stream(&c->val, &d, order, d.count - nval, d.count)) {
      snprintf(err, errlen, "out of memory");
      rc = -1;
    }
  }
  free(order);
  docs_free(&d);
  if (rc) {
    gpt_corpus_free(c);
    return -1;
  }
  c->unigram_entropy = unigram_entropy(&c->train);
  return 0;
}

void gpt_corpus_free(gpt_corpus_t *c) {
  stream_free(&c->train);
  stream_free(&c->val);
}

int64_t gpt_rows(const gpt_stream_t *s, int ctx) {
  return ctx > 0 ? (s->len - 1) / ctx : 0;
}

// ---- batches ----------------------------------------------------------------------------------

loom_status_t gpt_batch_alloc(gpt_batch_t *b, int cap_rows, int ctx) {
  memset(b, 0, sizeof *b);
  b->cap_rows = cap_rows;
  b->ctx = ctx;
  size_t n = (size_t)cap_rows * (size_t)ctx + 1;
  b->buf = loom_host_alloc(4 * n * sizeof(int32_t));
  return b->buf ? LOOM_OK : LOOM_ERR_NOMEM;
}

void gpt_batch_free(gpt_batch_t *b) {
  loom_host_free(b->buf);
  memset(b, 0, sizeof *b);
}

// First index i with starts[i] >= x (starts increasing).
static int64_t lower_bound(const int64_t *starts, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (starts[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

void gpt_batch_fill(gpt_batch_t *b, const gpt_stream_t *s, int64_t first_row, int nrows) {
  const int ctx = b->ctx;
  const int64_t rows = gpt_rows(s, ctx);
  const size_t n = (size_t)b->cap_rows * (size_t)ctx + 1;
  int32_t *tok = b->buf, *tgt = tok + n, *pos = tgt + n, *cu = pos + n;
  int nseq = 0;
  int64_t pairs = 0;
  cu[0] = 0;
  for (int r = 0; r < nrows; r++) {
    int64_t row = (first_row + r) % rows, base = row * ctx, o = (int64_t)r * ctx;
    int64_t next = lower_bound(s->doc_starts, s->docs, base + 1); // doc starts inside the row
    int64_t seq_begin = 0;
    for (int64_t t = 0; t < ctx; t++) {
      if (t > 0 && next < s->docs && s->doc_starts[next] == base + t) {
        int64_t len = t - seq_begin;
        pairs += len * (len + 1) / 2;
        cu[++nseq] = (int32_t)(o + t);
        seq_begin = t;
        next++;
      }
      tok[o + t] = s->tokens[base + t];
      tgt[o + t] = s->tokens[base + t + 1];
      pos[o + t] = (int32_t)(t - seq_begin);
    }
    int64_t len = ctx - seq_begin;
    pairs += len * (len + 1) / 2;
    cu[++nseq] = (int32_t)(o + ctx);
  }
  b->total = (int64_t)nrows * ctx;
  b->nseq = nseq;
  b->attn_pairs = pairs;
  int64_t shape = nseq + 1;
  loom_tensor_wrap(&b->cu, cu, LOOM_I32, LOOM_DEVICE_HOST, 1, &shape, "cu_seqlens");
  shape = b->total;
  loom_tensor_wrap(&b->tokens, tok, LOOM_I32, LOOM_DEVICE_HOST, 1, &shape, "tokens");
  loom_tensor_wrap(&b->target, tgt, LOOM_I32, LOOM_DEVICE_HOST, 1, &shape, "targets");
  loom_tensor_wrap(&b->pos, pos, LOOM_I32, LOOM_DEVICE_HOST, 1, &shape, "positions");
}

void gpt_batch_skew(gpt_batch_t *b, uint64_t seed) {
  const int ctx = b->ctx;
  const int nrows = (int)(b->total / ctx);
  const size_t n = (size_t)b->cap_rows * (size_t)ctx + 1;
  int32_t *pos = b->buf + 2 * n, *cu = pos + n;
  uint64_t state = seed ^ 0x736b657765646c6eull;
  const double mu = log((double)ctx) - 2.0 + 1.5 * (double)ex_normal(&state);
  int nseq = 0;
  int64_t pairs = 0, left = 0; // rows of the current piece not yet placed
  cu[0] = 0;
  for (int r = 0; r < nrows; r++) {
    const int64_t o = (int64_t)r * ctx;
    for (int64_t t = 0; t < ctx;) {
      if (left == 0) {
        const double x = fmin(mu + (double)ex_normal(&state), 30.0);
        left = (int64_t)ceil(exp(x));
        left = left < 1 ? 1 : left;
      }
      const int64_t len = left < ctx - t ? left : ctx - t;
      for (int64_t i = 0; i < len; i++) {
        pos[o + t + i] = (int32_t)i;
      }
      pairs += len * (len + 1) / 2;
      t += len;
      left -= len;
      cu[++nseq] = (int32_t)(o + t);
    }
  }
  b->nseq = nseq;
  b->attn_pairs = pairs;
  int64_t shape = nseq + 1;
  loom_tensor_wrap(&b->cu, cu, LOOM_I32, LOOM_DEVICE_HOST, 1, &shape, "cu_seqlens");
}
