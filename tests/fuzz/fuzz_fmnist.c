/* fuzz_fmnist.c — libFuzzer target for train_fmnist's IDX loader (examples/fmnist_data.c): the
 * input is split into an images file and a labels file (gzip or plain), then loaded as a split. */
#define _POSIX_C_SOURCE 200809L // mkdtemp

#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../examples/fmnist_data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], images[128], labels[128];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(dir, sizeof dir, "/tmp/fuzz_fmnist.XXXXXX");
  if (!mkdtemp(dir)) {
    abort(); // the harness needs its folder
  }
  snprintf(images, sizeof images, "%s/t-images-idx3-ubyte.gz", dir);
  snprintf(labels, sizeof labels, "%s/t-labels-idx1-ubyte.gz", dir);
  return 0;
}

static void put(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
    abort();
  }
}

// Input: the images file's length (u32 little-endian), the images file, the labels file.
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) {
    return 0;
  }
  size_t n_img = 0;
  for (int i = 3; i >= 0; i--) {
    n_img = n_img << 8 | data[i];
  }
  n_img = n_img < size - 4 ? n_img : size - 4;
  put(images, data + 4, n_img);
  put(labels, data + 4 + n_img, size - 4 - n_img);
  fmnist_split_t s;
  memset(&s, 0x5A, sizeof s);
  char err[512];
  memset(err, 0x5A, sizeof err);
  loom_status_t st = fmnist_load(dir, "t", &s, err, sizeof err);
  if (st != LOOM_OK) {
    if (s.n || s.images || s.labels || !memchr(err, 0, sizeof err) || !err[0]) {
      abort(); // a failure leaves the split empty and says why
    }
    return 0;
  }
  if (s.n < 1 || s.n > FMNIST_MAX_SAMPLES) {
    abort();
  }
  for (int64_t i = 0; i < s.n; i++) { // every label a class, every pixel in [0, 1]
    if (s.labels[i] < 0 || s.labels[i] >= FMNIST_CLASSES) {
      abort();
    }
  }
  for (int64_t i = 0; i < s.n * FMNIST_PIXELS; i++) {
    if (!(s.images[i] >= 0.0f && s.images[i] <= 1.0f)) {
      abort();
    }
  }
  fmnist_free(&s);
  return 0;
}
