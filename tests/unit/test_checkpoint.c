/* test_checkpoint.c — checkpoints: a save/load round trip of every dtype and empty tensors, every
 * truncation and every single-byte flip of a file rejected as corrupt, and mismatches named. */
#include "config.h"
#include "loom.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"
#include "../quiet.h"
#include "../testutil.h"

static char dir[] = "/tmp/loom_ckpt_test_XXXXXX";

static void path_of(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

static unsigned char *read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)n + 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return b;
}

// Two threads saving one path over and over, each reading it back after every save: every
// read must be a whole file of one of the two (they shared the temporary PATH.tmp.PID, so one
// truncated or overwrote what the other was writing).
#define RACE_SAVES 40
#define RACE_N     (1 << 16)
struct race {
  const char *path;
  float value;
  int bad;
  char why[512];
};

static void *race_saves(void *arg) {
  struct race *r = arg;
  int64_t n = RACE_N;
  loom_tensor_t t = test_tensor(LOOM_F32, 1, &n, "x"), back = test_tensor(LOOM_F32, 1, &n, "x");
  for (int64_t k = 0; k < n; k++) {
    test_floats(&t)[k] = r->value;
  }
  const loom_tensor_t *in[1] = {&t};
  loom_tensor_t *out[1] = {&back};
  loom_ckpt_info_t info = {.world_size = 1, .rank = 0, .step = 1};
  for (int i = 0; i < RACE_SAVES && !r->bad; i++) {
    int64_t step = 0;
    if (loom_checkpoint_save(r->path, &info, in, 1) != LOOM_OK ||
        loom_checkpoint_load(r->path, &info, out, 1, &step) != LOOM_OK) {
      snprintf(r->why, sizeof r->why, "%s", loom_last_error(NULL));
      r->bad = 1;
      break;
    }
    const float v = test_floats(&back)[0];
    for (int64_t k = 0; k < n && !r->bad; k++) {
      r->bad = test_floats(&back)[k] != v || (v != 1.0f && v != 2.0f);
    }
    if (r->bad) {
      snprintf(r->why, sizeof r->why, "a read-back mixed the two files");
    }
  }
  loom_tensor_free(&t);
  loom_tensor_free(&back);
  return NULL;
}

static void test_concurrent_saves(void) {
  char path[256];
  path_of(path, sizeof path, "race.ckpt");
  struct race r[2] = {{path, 1.0f, 0, ""}, {path, 2.0f, 0, ""}};
  pthread_t th[2];
  quiet_begin();
  for (int i = 0; i < 2; i++) {
    CHECK(pthread_create(&th[i], NULL, race_saves, &r[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
  }
  quiet_end();
  CHECK(!r[0].bad && !r[1].bad, "two threads saving one path: %s%s", r[0].why, r[1].why);
  unlink(path);
}

// 1 when path is a symbolic link.
static int is_link(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

// A save through a symbolic link writes the file it points to and leaves the link (was: the
// rename replaced the link with a file); a replaced file keeps its mode (was: 0644 less the
// umask); a FIFO or a directory at the path is refused.
static void test_save_targets(const loom_tensor_t *const *all, int n,
                              const loom_ckpt_info_t *info) {
  char file[300], link[300], dangling[300], target[300], fifo[300];
  path_of(file, sizeof file, "private.ckpt");
  path_of(link, sizeof link, "link.ckpt");
  path_of(dangling, sizeof dangling, "dangling.ckpt");
  path_of(target, sizeof target, "later.ckpt");
  path_of(fifo, sizeof fifo, "save.fifo");
  struct stat st;
  CHECK(loom_checkpoint_save(file, info, all, n) == LOOM_OK, "save: %s", loom_last_error(NULL));
  CHECK(chmod(file, 0600) == 0, "chmod");
  CHECK(loom_checkpoint_save(file, info, all, n) == LOOM_OK, "save: %s", loom_last_error(NULL));
  CHECK(stat(file, &st) == 0 && (st.st_mode & 07777) == 0600,
        "a replaced file's mode 0600 became %o", (unsigned)(st.st_mode & 07777));
  CHECK(symlink("private.ckpt", link) == 0, "symlink");
  CHECK(loom_checkpoint_save(link, info, all, n) == LOOM_OK, "save via a link: %s",
        loom_last_error(NULL));
  CHECK(is_link(link), "a save through a symbolic link replaced the link with a file");
  CHECK(stat(file, &st) == 0 && (st.st_mode & 07777) == 0600, "the link's target lost its mode: %o",
        (unsigned)(st.st_mode & 07777));
  loom_checkpoint_t *ck = NULL;
  CHECK(loom_checkpoint_open(link, &ck) == LOOM_OK, "open via the link: %s", loom_last_error(NULL));
  loom_checkpoint_close(ck);
  // A link to a file not made yet (relative, as above): the file is made where it points.
  CHECK(symlink("later.ckpt", dangling) == 0, "symlink");
  CHECK(loom_checkpoint_save(dangling, info, all, n) == LOOM_OK, "save via a dangling link: %s",
        loom_last_error(NULL));
  CHECK(is_link(dangling) && stat(target, &st) == 0 && S_ISREG(st.st_mode),
        "a save through a dangling link did not write its target");
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
  test_expect_fail(loom_checkpoint_save(fifo, info, all, n), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_save", "not a regular file",
                   "a FIFO at the path");
  CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "the FIFO was replaced");
  test_expect_fail(loom_checkpoint_save(dir, info, all, n), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_save", "directory", "a directory");
  const char *made[] = {file, link, dangling, target, fifo};
  for (int i = 0; i < 5; i++) {
    unlink(made[i]);
  }
}

int main(void) {
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[256];
  path_of(path, sizeof path, "rank0.ckpt");

  // Tensors of several dtypes and shapes, one of them empty.
  const int64_t s_w[2] = {3, 5}, s_b[1] = {7}, s_e[2] = {0, 4}, s_i[1] = {3};
  loom_tensor_t w = test_tensor(LOOM_F32, 2, s_w, "w"), b = test_tensor(LOOM_BF16, 1, s_b, "b"),
                e = test_tensor(LOOM_F32, 2, s_e, "empty"),
                i = test_tensor(LOOM_I64, 1, s_i, "cur");
  test_rng_t rng = test_rng(3);
  test_fill_uniform(&rng, test_floats(&w), 15, -1.0, 1.0);
  for (int k = 0; k < 7; k++) {
    ((uint16_t *)b.data)[k] = (uint16_t)(0x3f80 + k);
  }
  int64_t cursor[3] = {42, -1, 1ll << 40};
  memcpy(i.data, cursor, sizeof cursor);
  const loom_tensor_t *all[4] = {&w, &b, &e, &i};
  loom_ckpt_info_t info = {.world_size = 2, .rank = 0, .step = 17};
  loom_status_t st = loom_checkpoint_save(path, &info, all, 4);
  CHECK(st == LOOM_OK, "save: %s", loom_last_error(NULL));

  // Round trip into fresh tensors.
  loom_tensor_t w2 = test_tensor(LOOM_F32, 2, s_w, "w"), b2 = test_tensor(LOOM_BF16, 1, s_b, "b"),
                e2 = test_tensor(LOOM_F32, 2, s_e, "empty"),
                i2 = test_tensor(LOOM_I64, 1, s_i, "cur");
  loom_tensor_t *dst[4] = {&w2, &b2, &e2, &i2};
  int64_t step = -1;
  st = loom_checkpoint_load(path, &info, dst, 4, &step);
  CHECK(st == LOOM_OK, "load: %s", loom_last_error(NULL));
  CHECK(step == 17, "step %lld", (long long)step);
  CHECK(memcmp(w.data, w2.data, loom_tensor_bytes(&w)) == 0, "w differs after the round trip");
  CHECK(memcmp(b.data, b2.data, loom_tensor_bytes(&b)) == 0, "b differs after the round trip");
  CHECK(memcmp(i.data, i2.data, loom_tensor_bytes(&i)) == 0, "cursor differs");

  // Open, enumerate and find.
  loom_checkpoint_t *ck = NULL;
  CHECK(loom_checkpoint_open(path, &ck) == LOOM_OK, "open: %s", loom_last_error(NULL));
  CHECK(loom_checkpoint_count(ck) == 4, "count %d", loom_checkpoint_count(ck));
  loom_tensor_t view;
  CHECK(loom_checkpoint_find(ck, "cur", &view) == LOOM_OK && view.dtype == LOOM_I64 &&
            ((int64_t *)view.data)[2] == (1ll << 40),
        "find cur");
  CHECK(((uintptr_t)view.data % 8) == 0, "entry data not 8-byte aligned");
  test_expect_fail(loom_checkpoint_find(ck, "nope", &view), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_find", "nope", "missing tensor");
  loom_checkpoint_close(ck);

  // Mismatches are named and write nothing.
  test_fill_value(test_floats(&w2), 15, 9.0f);
  loom_ckpt_info_t other = {.world_size = 4, .rank = 0};
  test_expect_fail(loom_checkpoint_load(path, &other, dst, 4, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_load", "of 2 ranks", "world size");
  const int64_t s_w_bad[2] = {5, 3};
  loom_tensor_t wbad = test_tensor(LOOM_F32, 2, s_w_bad, "w");
  loom_tensor_t *dst_bad[2] = {&w2, &wbad};
  dst_bad[0] = &i2;
  dst_bad[1] = &wbad;
  test_expect_fail(loom_checkpoint_load(path, &info, dst_bad, 2, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_load", "(3, 5) f32", "shape");
  CHECK(test_all_equal(test_floats(&w2), 15, 9.0f), "a failed load wrote w2");
  loom_tensor_t missing = test_tensor(LOOM_F32, 1, s_b, "not_saved");
  loom_tensor_t *dst_miss[2] = {&w2, &missing};
  test_expect_fail(loom_checkpoint_load(path, &info, dst_miss, 2, NULL), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_load", "not_saved", "missing");
  CHECK(test_all_equal(test_floats(&w2), 15, 9.0f), "a failed load wrote w2 (missing)");

  // An empty tensor whose other extent is huge ((2^45, 0): 0 bytes) is saved, so it loads back
  // (the reader once bounded the extents before the 0 and called the file corrupt).
  {
    char zpath[256];
    path_of(zpath, sizeof zpath, "empty_wide.ckpt");
    const int64_t s_z[3] = {(int64_t)1 << 45, 0, 3};
    loom_tensor_t z;
    CHECK(loom_tensor_wrap(&z, NULL, LOOM_F32, LOOM_DEVICE_HOST, 3, s_z, "z") == LOOM_OK,
          "wrap (2^45, 0, 3): %s", loom_last_error(NULL));
    const loom_tensor_t *zs[1] = {&z};
    CHECK(loom_checkpoint_save(zpath, &info, zs, 1) == LOOM_OK, "save (2^45, 0, 3): %s",
          loom_last_error(NULL));
    loom_tensor_t *zd[1] = {&z};
    st = loom_checkpoint_load(zpath, &info, zd, 1, NULL);
    CHECK(st == LOOM_OK, "load (2^45, 0, 3): %s", loom_last_error(NULL));
    unlink(zpath);
  }

  // A destination the copy would refuse (no data; a device this process lacks) is refused
  // before any tensor is written (w2 came first and was once loaded before the refusal).
  {
    loom_tensor_t nodata = b2;
    nodata.data = NULL;
    loom_tensor_t *dst_nodata[2] = {&w2, &nodata};
    test_expect_fail(loom_checkpoint_load(path, &info, dst_nodata, 2, NULL), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, "loom_checkpoint_load", "data is NULL",
                     "destination without data");
    CHECK(test_all_equal(test_floats(&w2), 15, 9.0f), "a failed load wrote w2 (no data)");
    if (loom_cuda_device_count() == 0) {
      loom_tensor_t ondev = b2;
      ondev.device = 0;
      loom_tensor_t *dst_dev[2] = {&w2, &ondev};
      test_expect_fail(loom_checkpoint_load(path, &info, dst_dev, 2, NULL), LOOM_ERR_INVALID_ARG,
                       LOOM_ERR_UNSUPPORTED, "loom_checkpoint_load", "'b'",
                       "destination on a missing device");
      CHECK(test_all_equal(test_floats(&w2), 15, 9.0f), "a failed load wrote w2 (device)");
    }
    loom_error_clear();
  }

  // Every truncation and every single-byte change of the file is LOOM_ERR_CORRUPT.
  size_t size = 0;
  unsigned char *good = read_all(path, &size);
  CHECK(good != NULL && size > 100, "read back %zu bytes", size);
  int bad_trunc = 0, bad_flip = 0;
  quiet_begin(); // every call below logs its (expected) error
  for (size_t n = 0; good && n < size; n++) {
    loom_checkpoint_t *c = NULL;
    if (loom_checkpoint_open_memory(good, n, &c) != LOOM_ERR_CORRUPT) {
      bad_trunc++;
    }
    loom_checkpoint_close(c);
  }
  for (size_t k = 0; good && k < size; k++) {
    good[k] ^= 0x5a;
    loom_checkpoint_t *c = NULL;
    if (loom_checkpoint_open_memory(good, size, &c) != LOOM_ERR_CORRUPT) {
      bad_flip++;
    }
    loom_checkpoint_close(c);
    good[k] ^= 0x5a;
  }
  quiet_end();
  CHECK(bad_trunc == 0, "%d truncations were accepted", bad_trunc);
  CHECK(bad_flip == 0, "%d single-byte changes were accepted", bad_flip);
  loom_error_clear();
  // One byte more is corrupt too.
  unsigned char *longer = good ? malloc(size + 1) : NULL;
  if (longer) {
    memcpy(longer, good, size);
    longer[size] = 0;
    loom_checkpoint_t *c = NULL;
    CHECK(loom_checkpoint_open_memory(longer, size + 1, &c) == LOOM_ERR_CORRUPT, "trailing byte");
    CHECK(strstr(loom_last_error(NULL), "follow the trailer") != NULL, "message: %s",
          loom_last_error(NULL));
    loom_checkpoint_close(c);
    free(longer);
  }
  free(good);

  // A failed save leaves the old file; bad arguments are named.
  const loom_tensor_t *dup[2] = {&w, &w};
  test_expect_fail(loom_checkpoint_save(path, &info, dup, 2), LOOM_ERR_INVALID_ARG,
                   LOOM_ERR_INVALID_ARG, "loom_checkpoint_save", "unique", "duplicate names");
  // A name that fills LOOM_NAME_MAX without its NUL (a struct filled by hand) is refused: the
  // writer once read past it and wrote a file the reader calls corrupt, returning LOOM_OK.
  {
    loom_tensor_t unterminated = w;
    memset(unterminated.name, 'n', sizeof unterminated.name);
    const loom_tensor_t *one[1] = {&unterminated};
    char upath[300];
    path_of(upath, sizeof upath, "unterminated.ckpt");
    test_expect_fail(loom_checkpoint_save(upath, &info, one, 1), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, "loom_checkpoint_save", "without its NUL",
                     "unterminated name");
    CHECK(access(upath, F_OK) != 0, "no file for a refused save");
    loom_tensor_t *one_dst[1] = {&unterminated};
    test_expect_fail(loom_checkpoint_load(path, &info, one_dst, 1, NULL), LOOM_ERR_INVALID_ARG,
                     LOOM_ERR_INVALID_ARG, "loom_checkpoint_load", "without its NUL",
                     "unterminated name (load)");
  }
  char nodir[300];
  snprintf(nodir, sizeof nodir, "%s/missing/x.ckpt", dir);
  test_expect_fail(loom_checkpoint_save(nodir, &info, all, 4), LOOM_ERR_SYSTEM, LOOM_ERR_SYSTEM,
                   "loom_checkpoint_save", "cannot create", "missing directory");
  st = loom_checkpoint_load(path, &info, dst, 4, NULL);
  CHECK(st == LOOM_OK, "the file survives failed saves: %s", loom_last_error(NULL));
  test_expect_fail(loom_checkpoint_open("/nonexistent/x", &ck), LOOM_ERR_SYSTEM, LOOM_ERR_SYSTEM,
                   "loom_checkpoint_open", "cannot open", "no file");

  // A FIFO (or a directory) is refused at once, never opened: opening a FIFO waits for a writer,
  // which once hung loom_checkpoint_open. The test runs under a timeout in a child.
  char fifo[300];
  path_of(fifo, sizeof fifo, "fifo.ckpt");
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo %s", fifo);
  pid_t child = fork();
  if (child == 0) {
    alarm(30);
    loom_checkpoint_t *c = NULL;
    loom_status_t fst = loom_checkpoint_open(fifo, &c);
    _exit(fst == LOOM_ERR_CORRUPT && strstr(loom_last_error(NULL), "not a regular file") ? 0 : 1);
  }
  int wst = 0;
  CHECK(child > 0 && waitpid(child, &wst, 0) == child && WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
        "loom_checkpoint_open on a FIFO: refused as not a regular file, at once (status 0x%x)",
        wst);
  unlink(fifo);
  test_expect_fail(loom_checkpoint_open(dir, &ck), LOOM_ERR_CORRUPT, LOOM_ERR_CORRUPT,
                   "loom_checkpoint_open", "not a regular file", "a directory");

  test_save_targets(all, 4, &info);

  // CRC32C check value (RFC 3720): "123456789" -> 0xE3069283.
  CHECK(loom_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c %08x",
        loom_crc32c(0, "123456789", 9));

  test_concurrent_saves();

  unlink(path);
  rmdir(dir);
  loom_tensor_t *frees[] = {&w, &b, &e, &i, &w2, &b2, &e2, &i2, &wbad, &missing};
  test_free_tensors(frees, sizeof frees / sizeof frees[0]);
  return check_exit("test_checkpoint");
}
