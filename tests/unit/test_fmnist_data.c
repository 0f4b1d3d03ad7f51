/* test_fmnist_data.c — the Fashion-MNIST loader of the example trainers on files written here: a
 * good split (gzip and plain), and every kind of damaged or wrong file refused with its reason. */
#define _POSIX_C_SOURCE 200809L // mkdtemp, mkfifo

#include "config.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../../examples/fmnist_data.h"
#include "../check.h"

static char dir[64];

// Big-endian IDX header: magic, then the dimensions.
static size_t header(unsigned char *out, uint32_t magic, int ndim, const uint32_t *dims) {
  uint32_t v[4] = {magic, ndim > 0 ? dims[0] : 0, ndim > 1 ? dims[1] : 0, ndim > 2 ? dims[2] : 0};
  for (int i = 0; i <= ndim; i++) {
    out[4 * i] = (unsigned char)(v[i] >> 24);
    out[4 * i + 1] = (unsigned char)(v[i] >> 16);
    out[4 * i + 2] = (unsigned char)(v[i] >> 8);
    out[4 * i + 3] = (unsigned char)v[i];
  }
  return 4 + 4 * (size_t)ndim;
}

// dir/train-{images-idx3,labels-idx1}-ubyte.gz = hdr + body, gzip-compressed or plain.
static void write_file(const char *kind, const unsigned char *hdr, size_t hlen,
                       const unsigned char *body, size_t blen, int gz) {
  char path[128];
  snprintf(path, sizeof path, "%s/train-%s-ubyte.gz", dir, kind);
  remove(path);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    CHECK(f && gzwrite(f, hdr, (unsigned)hlen) == (int)hlen &&
              (blen == 0 || gzwrite(f, body, (unsigned)blen) == (int)blen) && gzclose(f) == Z_OK,
          "writing %s", path);
  } else {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(hdr, 1, hlen, f) == hlen && fwrite(body, 1, blen, f) == blen &&
              fclose(f) == 0,
          "writing %s", path);
  }
}

enum { N = 3 };
static unsigned char pixels[(N + 1) * FMNIST_PIXELS];
static unsigned char labels[N + 1] = {0, 9, 5, 4};

// A split of n images (dims from the arguments) and m labels, all gzip.
static void write_split(uint32_t magic_i, uint32_t n, uint32_t rows, uint32_t cols,
                        size_t pixel_bytes, uint32_t magic_l, uint32_t m, size_t label_bytes) {
  unsigned char hdr[16];
  uint32_t di[3] = {n, rows, cols}, dl[1] = {m};
  size_t h = header(hdr, magic_i, 3, di);
  write_file("images-idx3", hdr, h, pixels, pixel_bytes, 1);
  h = header(hdr, magic_l, 1, dl);
  write_file("labels-idx1", hdr, h, labels, label_bytes, 1);
}

static void good_split(void) {
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N);
}

// Loading must fail with status `want` and a message holding `needle`, leaving the split empty.
static void refused(loom_status_t want, const char *needle, const char *what) {
  fmnist_split_t s;
  memset(&s, 0x5A, sizeof s);
  char err[512] = "";
  loom_status_t st = fmnist_load(dir, "train", &s, err, sizeof err);
  CHECK(st == want, "%s: status %s, want %s (%s)", what, loom_strerror(st), loom_strerror(want),
        err);
  CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
  CHECK(s.n == 0 && !s.images && !s.labels, "%s: a failed load must leave the split empty", what);
}

static void loads(const char *what) {
  fmnist_split_t s;
  char err[512] = "";
  loom_status_t st = fmnist_load(dir, "train", &s, err, sizeof err);
  CHECK(st == LOOM_OK, "%s: %s", what, err);
  if (st != LOOM_OK) {
    return;
  }
  CHECK(s.n == N, "%s: %lld samples, want %d", what, (long long)s.n, N);
  for (int i = 0; i < N * FMNIST_PIXELS; i++) {
    if (s.images[i] != (float)pixels[i] / 255.0f) {
      CHECK(0, "%s: pixel %d is %g, want %g", what, i, (double)s.images[i],
            (double)pixels[i] / 255.0);
      break;
    }
  }
  for (int i = 0; i < N; i++) {
    CHECK(s.labels[i] == labels[i], "%s: label %d is %d, want %d", what, i, s.labels[i], labels[i]);
  }
  fmnist_free(&s);
}

static void alarm_handler(int sig) {
  (void)sig;
  static const char msg[] = "test_fmnist_data: the loader blocked on a FIFO\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  _exit(1);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/test_fmnist_data.XXXXXX");
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  for (size_t i = 0; i < sizeof pixels; i++) {
    pixels[i] = (unsigned char)(i * 7 + i / 13);
  }
  unsigned char hdr[16] = {0};
  char path[128];

  good_split();
  loads("gzip files");
  { // zlib reads plain (not compressed) IDX files too
    uint32_t di[3] = {N, 28, 28}, dl[1] = {N};
    write_file("images-idx3", hdr, header(hdr, 2051, 3, di), pixels, (size_t)N * FMNIST_PIXELS, 0);
    write_file("labels-idx1", hdr, header(hdr, 2049, 1, dl), labels, N, 0);
    loads("plain files");
  }

  // Headers.
  write_split(2049, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "bad magic number 2049", "images with the labels' magic");
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2051, N, N);
  refused(LOOM_ERR_CORRUPT, "bad magic number 2051", "labels with the images' magic");
  write_split(2051, N, 28, 27, (size_t)N * FMNIST_PIXELS, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "images are 28x27", "27 columns");
  write_split(2051, 0, 28, 28, 0, 2049, 0, 0);
  refused(LOOM_ERR_CORRUPT, "claims 0 samples", "no samples");
  write_split(2051, FMNIST_MAX_SAMPLES + 1, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "claims 1000001 samples", "over the sample limit");
  { // the images' header cut after 6 of its 16 bytes
    uint32_t di[3] = {N, 28, 28};
    header(hdr, 2051, 3, di);
    write_file("images-idx3", hdr, 6, NULL, 0, 1);
  }
  refused(LOOM_ERR_CORRUPT, "truncated header (6 of 16 bytes)", "a cut header");

  // Payloads. A header claiming a million images over three images' pixels is "truncated" (the
  // memory grows with the pixels that arrive).
  write_split(2051, FMNIST_MAX_SAMPLES, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "truncated: 2352 of 784000000 pixel bytes", "a million claimed");
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS - 1, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "truncated: 2351 of 2352 pixel bytes", "one pixel short");
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS + 1, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "trailing data after the 3 images", "one pixel too many");
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N - 1, N - 1);
  refused(LOOM_ERR_CORRUPT, "has 2 labels but", "fewer labels than images");
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N - 1);
  refused(LOOM_ERR_CORRUPT, "truncated: 2 of 3 labels", "a label short");
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N + 1);
  refused(LOOM_ERR_CORRUPT, "trailing data after the 3 labels", "a label too many");
  labels[1] = 10;
  write_split(2051, N, 28, 28, (size_t)N * FMNIST_PIXELS, 2049, N, N);
  refused(LOOM_ERR_CORRUPT, "label 10 of sample 1 is outside 0..9", "label 10");
  labels[1] = 9;

  // A damaged gzip stream: a byte of the compressed data flipped (zlib's check fails).
  good_split();
  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
  FILE *damage = fopen(path, "r+b");
  CHECK(damage != NULL, "open %s", path);
  if (damage) {
    int c = fseek(damage, 40, SEEK_SET) == 0 ? fgetc(damage) : EOF;
    CHECK(c != EOF && fseek(damage, 40, SEEK_SET) == 0 && fputc(c ^ 0x55, damage) != EOF,
          "damage %s", path);
    CHECK(fclose(damage) == 0, "close %s", path);
  }
  refused(LOOM_ERR_CORRUPT, "a damaged file", "a flipped compressed byte");

  // Files that are missing or not regular files.
  good_split();
  snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", dir);
  remove(path);
  // (another folder than the package's: what it must hold; the package's: how to install it)
  refused(LOOM_ERR_SYSTEM, "--data DIR must be a folder holding the four IDX files",
          "missing labels");
  {
    fmnist_split_t s;
    char err[512] = "";
    CHECK(fmnist_load(FMNIST_DEFAULT_DIR "/no-such-folder", "train", &s, err, sizeof err) ==
                  LOOM_ERR_SYSTEM &&
              strstr(err, "apt-get install dataset-fashion-mnist") != NULL,
          "a file missing in the package's folder names the package: %s", err);
  }
  CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
  refused(LOOM_ERR_SYSTEM, "is not a regular file", "a directory as the labels");
  rmdir(path);
  CHECK(mkfifo(path, 0600) == 0, "mkfifo %s", path);
  signal(SIGALRM, alarm_handler);
  alarm(20); // opening a FIFO for reading waits for a writer: the loader must not open it so
  refused(LOOM_ERR_SYSTEM, "is not a regular file", "a FIFO as the labels");
  alarm(0);
  remove(path);

  snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", dir);
  remove(path);
  rmdir(dir);
  return check_exit("test_fmnist_data");
}
