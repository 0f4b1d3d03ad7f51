/* fmnist_data.c — Fashion-MNIST loader (IDX files through zlib, every header field and byte count
 * checked before use), pixel normalisation, seeded shuffling and rank sharding of global batches.
 */
#define _POSIX_C_SOURCE 200809L // open(2) for a clear errno on a missing file, fstat(2)

#include "fmnist_data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 2051 // 0x00000803: unsigned bytes, 3 dimensions
#define IDX_MAGIC_LABELS 2049 // 0x00000801: unsigned bytes, 1 dimension

// ---- errors --------------------------------------------------------------------------------

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

// ---- reading IDX files -----------------------------------------------------------------------

// Open path for reading through zlib (gzip or plain bytes). A missing file says how to get it:
// the package for the default folder, the folder's expected contents for another one.
// O_NONBLOCK: a FIFO opens at once (then is refused) instead of waiting for a writer.
static loom_status_t idx_open(const char *path, gzFile *out, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    const size_t nd = strlen(FMNIST_DEFAULT_DIR);
    if (!strncmp(path, FMNIST_DEFAULT_DIR, nd) && path[nd] == '/') {
      set_err(err, errlen,
              "fmnist: cannot open %s: %s; install it with `apt-get install "
              "dataset-fashion-mnist` or pass --data DIR",
              path, strerror(e));
    } else {
      set_err(err, errlen,
              "fmnist: cannot open %s: %s; --data DIR must be a folder holding the four IDX "
              "files of dataset-fashion-mnist (train-images-idx3-ubyte.gz, "
              "train-labels-idx1-ubyte.gz and the t10k- pair; the package installs them "
              "in " FMNIST_DEFAULT_DIR ")",
              path, strerror(e));
    }
    return LOOM_ERR_SYSTEM;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    set_err(err, errlen,
            "fmnist: %s is not a regular file: --data DIR must hold the IDX .gz files of "
            "dataset-fashion-mnist",
            path);
    return LOOM_ERR_SYSTEM;
  }
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    close(fd);
    set_err(err, errlen, "fmnist: %s: out of memory opening the gzip stream", path);
    return LOOM_ERR_NOMEM;
  }
  gzbuffer(f, 1 << 17);
  *out = f;
  return LOOM_OK;
}

// Read up to len bytes; *got receives how many arrived. A zlib error (corrupt stream, bad CRC)
// is LOOM_ERR_CORRUPT with zlib's message.
static loom_status_t idx_read(gzFile f, const char *path, void *buf, size_t len, size_t *got,
                              char *err, size_t errlen) {
  unsigned char *p = buf;
  size_t done = 0;
  while (done < len) {
    size_t want = len - done;
    if (want > (1u << 30)) {
      want = 1u << 30;
    }
    int r = gzread(f, p + done, (unsigned)want);
    if (r < 0) {
      int zerr = 0;
      const char *msg = gzerror(f, &zerr);
      if (!strncmp(msg, "<fd:", 4) &&
          strstr(msg, ": ")) { // zlib names the descriptor, not the file
        msg = strstr(msg, ": ") + 2;
      }
      set_err(err, errlen,
              "fmnist: %s: read error after %zu bytes: %s (a damaged file: apt-get install "
              "--reinstall dataset-fashion-mnist, or fetch it again)",
              path, done, zerr == Z_ERRNO ? strerror(errno) : msg);
      return LOOM_ERR_CORRUPT;
    }
    if (r == 0) {
      break;
    }
    done += (size_t)r;
  }
  *got = done;
  return LOOM_OK;
}

static uint32_t be32(const unsigned char *b) {
  return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

// Read the IDX header: the magic and ndim dimensions. Checks the magic and the sample count.
static loom_status_t idx_header(gzFile f, const char *path, uint32_t magic, int ndim,
                                uint32_t *dims, char *err, size_t errlen) {
  unsigned char hdr[16];
  size_t len = 4 + 4 * (size_t)ndim, got = 0;
  loom_status_t st = idx_read(f, path, hdr, len, &got, err, errlen);
  if (st != LOOM_OK) {
    return st;
  }
  if (got < len) {
    set_err(err, errlen, "fmnist: %s: truncated header (%zu of %zu bytes)", path, got, len);
    return LOOM_ERR_CORRUPT;
  }
  uint32_t m = be32(hdr);
  if (m != magic) {
    set_err(err, errlen, "fmnist: %s: bad magic number %u (0x%08x), want %u (an IDX%d %s file)",
            path, m, m, magic, ndim, ndim == 3 ? "image" : "label");
    return LOOM_ERR_CORRUPT;
  }
  for (int i = 0; i < ndim; i++) {
    dims[i] = be32(hdr + 4 + 4 * i);
  }
  if (dims[0] == 0 || dims[0] > FMNIST_MAX_SAMPLES) {
    set_err(err, errlen, "fmnist: %s: header claims %u samples, want 1..%d", path, dims[0],
            FMNIST_MAX_SAMPLES);
    return LOOM_ERR_CORRUPT;
  }
  return LOOM_OK;
}

// After the declared payload the stream must end.
static loom_status_t idx_expect_end(gzFile f, const char *path, uint32_t n, const char *what,
                                    char *err, size_t errlen) {
  unsigned char extra;
  size_t got = 0;
  loom_status_t st = idx_read(f, path, &extra, 1, &got, err, errlen);
  if (st != LOOM_OK) {
    return st;
  }
  if (got != 0) {
    set_err(err, errlen, "fmnist: %s: trailing data after the %u %s the header declares", path, n,
            what);
    return LOOM_ERR_CORRUPT;
  }
  return LOOM_OK;
}

static loom_status_t load_images(const char *path, fmnist_split_t *s, char *err, size_t errlen) {
  gzFile f = NULL;
  unsigned char *chunk = NULL;
  loom_status_t st = idx_open(path, &f, err, errlen);
  if (st != LOOM_OK) {
    return st;
  }
  uint32_t dims[3];
  st = idx_header(f, path, IDX_MAGIC_IMAGES, 3, dims, err, errlen);
  if (st != LOOM_OK) {
    goto fail;
  }
  if (dims[1] != FMNIST_ROWS || dims[2] != FMNIST_COLS) {
    set_err(err, errlen, "fmnist: %s: images are %ux%u, want %dx%d", path, dims[1], dims[2],
            FMNIST_ROWS, FMNIST_COLS);
    st = LOOM_ERR_CORRUPT;
    goto fail;
  }
  s->n = dims[0];
  // The header's count is a claim: memory grows with the pixels that arrive (from the size of
  // the real training split), so a short file claiming a million images is "truncated", not a
  // 3 GB allocation.
  size_t total = (size_t)s->n * FMNIST_PIXELS, cap = (size_t)70000 * FMNIST_PIXELS;
  cap = cap < total ? cap : total;
  s->images = malloc((cap ? cap : 1) * sizeof(float));
  chunk = malloc(1 << 16);
  if (!s->images || !chunk) {
    set_err(err, errlen, "fmnist: %s: out of memory for %u images", path, dims[0]);
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  // Convert chunk by chunk: pixel / 255 as float, never a second full-size byte buffer.
  for (size_t done = 0; done < total;) {
    size_t want = total - done < (1 << 16) ? total - done : (1 << 16), got = 0;
    st = idx_read(f, path, chunk, want, &got, err, errlen);
    if (st != LOOM_OK) {
      goto fail;
    }
    if (done + got > cap) { // double, up to the declared total
      size_t grown = 2 * cap > total ? total : 2 * cap;
      float *more = realloc(s->images, grown * sizeof(float));
      if (!more) {
        set_err(err, errlen, "fmnist: %s: out of memory at %zu of %u images", path,
                done / FMNIST_PIXELS, dims[0]);
        st = LOOM_ERR_NOMEM;
        goto fail;
      }
      s->images = more;
      cap = grown;
    }
    for (size_t i = 0; i < got; i++) {
      s->images[done + i] = (float)chunk[i] / 255.0f;
    }
    done += got;
    if (got < want) {
      set_err(err, errlen, "fmnist: %s: truncated: %zu of %zu pixel bytes (%u images declared)",
              path, done, total, dims[0]);
      st = LOOM_ERR_CORRUPT;
      goto fail;
    }
  }
  st = idx_expect_end(f, path, dims[0], "images", err, errlen);
  if (st != LOOM_OK) {
    goto fail;
  }
  free(chunk);
  gzclose(f);
  return LOOM_OK;
fail:
  free(chunk);
  free(s->images);
  s->images = NULL;
  gzclose(f);
  return st;
}

static loom_status_t load_labels(const char *path, fmnist_split_t *s, const char *image_path,
                                 char *err, size_t errlen) {
  gzFile f = NULL;
  unsigned char *bytes = NULL;
  loom_status_t st = idx_open(path, &f, err, errlen);
  if (st != LOOM_OK) {
    return st;
  }
  uint32_t n = 0;
  st = idx_header(f, path, IDX_MAGIC_LABELS, 1, &n, err, errlen);
  if (st != LOOM_OK) {
    goto fail;
  }
  if ((int64_t)n != s->n) {
    set_err(err, errlen, "fmnist: %s has %u labels but %s has %lld images", path, n, image_path,
            (long long)s->n);
    st = LOOM_ERR_CORRUPT;
    goto fail;
  }
  bytes = malloc(n);
  s->labels = malloc((size_t)n * sizeof(int32_t));
  if (!bytes || !s->labels) {
    set_err(err, errlen, "fmnist: %s: out of memory for %u labels", path, n);
    st = LOOM_ERR_NOMEM;
    goto fail;
  }
  size_t got = 0;
  st = idx_read(f, path, bytes, n, &got, err, errlen);
  if (st != LOOM_OK) {
    goto fail;
  }
  if (got < n) {
    set_err(err, errlen, "fmnist: %s: truncated: %zu of %u labels", path, got, n);
    st = LOOM_ERR_CORRUPT;
    goto fail;
  }
  for (uint32_t i = 0; i < n; i++) {
    if (bytes[i] >= FMNIST_CLASSES) {
      set_err(err, errlen, "fmnist: %s: label %u of sample %u is outside 0..%d", path,
              (unsigned)bytes[i], i, FMNIST_CLASSES - 1);
      st = LOOM_ERR_CORRUPT;
      goto fail;
    }
    s->labels[i] = bytes[i];
  }
  st = idx_expect_end(f, path, n, "labels", err, errlen);
  if (st != LOOM_OK) {
    goto fail;
  }
  free(bytes);
  gzclose(f);
  return LOOM_OK;
fail:
  free(bytes);
  free(s->labels);
  s->labels = NULL;
  gzclose(f);
  return st;
}

loom_status_t fmnist_load(const char *dir, const char *split, fmnist_split_t *out, char *err,
                          size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!dir || !split) {
    set_err(err, errlen, "fmnist: no data directory or split given");
    return LOOM_ERR_INVALID_ARG;
  }
  char images[4096], labels[4096];
  int a = snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", dir, split);
  int b = snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", dir, split);
  if (a < 0 || b < 0 || (size_t)a >= sizeof images || (size_t)b >= sizeof labels) {
    set_err(err, errlen, "fmnist: data directory path too long: %.64s...", dir);
    return LOOM_ERR_INVALID_ARG;
  }
  loom_status_t st = load_images(images, out, err, errlen);
  if (st == LOOM_OK) {
    st = load_labels(labels, out, images, err, errlen);
  }
  if (st != LOOM_OK) {
    fmnist_free(out);
  }
  return st;
}

void fmnist_free(fmnist_split_t *s) {
  if (!s) {
    return;
  }
  free(s->images);
  free(s->labels);
  memset(s, 0, sizeof *s);
}

// ---- normalisation ---------------------------------------------------------------------------

void fmnist_stats(const fmnist_split_t *s, float *mean, float *std) {
  size_t total = (size_t)s->n * FMNIST_PIXELS;
  double sum = 0.0, sq = 0.0;
  for (size_t i = 0; i < total; i++) {
    double v = s->images[i];
    sum += v;
    sq += v * v;
  }
  double m = total ? sum / (double)total : 0.0;
  double var = total ? sq / (double)total - m * m : 0.0;
  *mean = (float)m;
  *std = var > 1e-12 ? (float)sqrt(var) : 1.0f;
}

void fmnist_normalize(fmnist_split_t *s, float mean, float std) {
  size_t total = (size_t)s->n * FMNIST_PIXELS;
  float inv = 1.0f / std;
  for (size_t i = 0; i < total; i++) {
    s->images[i] = (s->images[i] - mean) * inv;
  }
}

// ---- shuffling and sharding ------------------------------------------------------------------

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fmnist_permutation(int32_t *perm, int64_t n, uint64_t seed, int epoch) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull + (uint64_t)epoch * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    perm[i] = (int32_t)i;
  }
  for (int64_t i = n - 1; i > 0; i--) { // Fisher-Yates
    int64_t j = (int64_t)(splitmix64(&state) % (uint64_t)(i + 1));
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

int64_t fmnist_steps_per_epoch(int64_t n, int batch, int nranks) {
  int64_t global = (int64_t)batch * nranks;
  return global > 0 ? n / global : 0;
}

const int32_t *fmnist_shard(const int32_t *perm, int64_t step, int batch, int rank, int nranks) {
  return perm + step * (int64_t)batch * nranks + (int64_t)rank * batch;
}

void fmnist_eval_range(int64_t n, int rank, int nranks, int64_t *begin, int64_t *end) {
  *begin = n * rank / nranks;
  *end = n * (rank + 1) / nranks;
}

void fmnist_gather(const fmnist_split_t *s, const int32_t *idx, int64_t first, int64_t count,
                   float *x, int32_t *y) {
  for (int64_t i = 0; i < count; i++) {
    int64_t k = idx ? idx[i] : first + i;
    memcpy(x + i * FMNIST_PIXELS, s->images + k * FMNIST_PIXELS, FMNIST_PIXELS * sizeof(float));
    y[i] = s->labels[k];
  }
}
