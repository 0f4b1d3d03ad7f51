/* checkpoint.c — loom_checkpoint_*: write one rank's named tensors atomically (temporary file,
 * fsync, rename, directory fsync) and read them back only after every byte has been validated. */
#include "config.h"

#include "loom_checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "file_regular.h"
#include "memory.h"

#define CKPT_MAGIC    "LOOMCKPT"
#define CKPT_END      "LOOMEND!"
#define CKPT_VERSION  1u
#define CKPT_HEADER   36 // magic 8, version 4, world 4, rank 4, step 8, count 4, crc 4
#define CKPT_ALIGN    8  // data of every entry starts at a multiple of this in the file
#define CKPT_MAX_FILE ((size_t)1 << 40)

// ---- CRC32C ---------------------------------------------------------------------------------

static uint32_t crc_table[8][256];

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) {
      c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1; // the Castagnoli polynomial, reflected
    }
    crc_table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++) { // slicing by 8: tables for the bytes further back
    for (int t = 1; t < 8; t++) {
      crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
    }
  }
}

uint32_t loom_crc32c(uint32_t crc, const void *bytes, size_t len) {
  if (!bytes) { // nothing to add (a NULL buffer with len > 0 is read as empty, never through)
    return crc;
  }
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, crc_init);
  const uint8_t *p = bytes;
  crc = ~crc;
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    w ^= crc;
    crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
          crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^
          crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) {
    crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
  }
  return ~crc;
}

// ---- writing --------------------------------------------------------------------------------

typedef struct writer {
  int fd;
  const char *path; // the temporary file, for messages
  uint64_t offset;
} writer_t;

static loom_status_t put(writer_t *w, const void *bytes, size_t len) {
  const uint8_t *p = bytes;
  while (len > 0) {
    ssize_t k = write(w->fd, p, len);
    if (k < 0 && errno == EINTR) {
      continue;
    }
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      return loom_error(NULL, e == ENOMEM ? LOOM_ERR_NOMEM : LOOM_ERR_SYSTEM,
                        "loom_checkpoint_save: writing %s at byte %llu failed: %s (a full disk? "
                        "free space or pick another directory)",
                        w->path, (unsigned long long)w->offset, strerror(e));
    }
    p += k;
    len -= (size_t)k;
    w->offset += (uint64_t)k;
  }
  return LOOM_OK;
}

static loom_status_t check_save_args(const char *path, const loom_ckpt_info_t *info,
                                     const loom_tensor_t *const *tensors, int n) {
  static const char op[] = "loom_checkpoint_save";
  if (!path || !path[0] || !info || n < 0 || (n > 0 && !tensors)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: path, info and tensors must be given (path %s, info %s, n %d)", op,
                      path ? (path[0] ? "set" : "empty") : "NULL", info ? "set" : "NULL", n);
  }
  if (info->world_size < 1 || info->rank < 0 || info->rank >= info->world_size || info->step < 0) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: info has world_size %d, rank %d, step %lld: expected world_size >= 1, "
                      "0 <= rank < world_size and step >= 0",
                      op, info->world_size, info->rank, (long long)info->step);
  }
  for (int i = 0; i < n; i++) {
    const loom_tensor_t *t = tensors[i];
    if (t && !memchr(t->name, '\0', LOOM_NAME_MAX)) { // a struct filled by hand
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensors[%d] has a name of %d characters or more without its NUL: "
                        "names have at most %d characters",
                        op, i, LOOM_NAME_MAX, LOOM_NAME_MAX - 1);
    }
    if (!t || !t->name[0] || loom_dtype_size(t->dtype) == 0 || t->ndim < 0 ||
        t->ndim > LOOM_MAX_DIMS || (loom_tensor_numel(t) > 0 && !t->data)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensors[%d] is NULL, unnamed, of an invalid dtype or shape, or has no "
                        "data: every tensor needs a unique name (its identity in the file)",
                        op, i);
    }
    // Every extent >= 0 and the byte count within int64: the loader rejects anything else as
    // corrupt, so such a tensor must not be written.
    const double elem = (double)loom_dtype_size(t->dtype);
    double bytes = elem;
    for (int d = 0; d < t->ndim; d++) {
      if (t->shape[d] < 0) {
        return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: tensors[%d] '%s' has extent %lld in dimension %d: extents must be "
                          ">= 0",
                          op, i, t->name, (long long)t->shape[d], d);
      }
      bytes *= (double)t->shape[d];
    }
    if (bytes > 9.0e18) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensors[%d] '%s' would take %.3g bytes: its shape overflows", op, i,
                        t->name, bytes);
    }
    for (int j = 0; j < i; j++) {
      if (strcmp(tensors[j]->name, t->name) == 0) {
        return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: tensors[%d] and tensors[%d] are both called '%s': names must be "
                          "unique",
                          op, j, i, t->name);
      }
    }
  }
  return LOOM_OK;
}

// One entry: its description, CRC, padding and data (device data through a host copy).
static loom_status_t put_entry(writer_t *w, const loom_tensor_t *t) {
  loom_status_t status = LOOM_OK;
  loom_tensor_t host = {0};
  const void *data = t->data;
  uint64_t nbytes = loom_tensor_bytes(t);
  if (t->device != LOOM_DEVICE_HOST && nbytes > 0) {
    LOOM_CHECK(loom_tensor_alloc(&host, t->dtype, LOOM_DEVICE_HOST, t->ndim, t->shape, t->name));
    LOOM_CHECK(loom_tensor_copy(&host, t));
    data = host.data;
  }
  // The description (name, dtype, shape, size) and the data share one CRC: any damaged byte of
  // an entry is caught, not only one in its data.
  uint8_t meta[2 + LOOM_NAME_MAX + 2 + 8 * LOOM_MAX_DIMS + 8];
  size_t m = 0;
  uint16_t name_len = (uint16_t)strlen(t->name);
  uint8_t dtype = (uint8_t)t->dtype, ndim = (uint8_t)t->ndim;
  memcpy(meta + m, &name_len, 2), m += 2;
  memcpy(meta + m, t->name, name_len), m += name_len;
  meta[m++] = dtype;
  meta[m++] = ndim;
  memcpy(meta + m, t->shape, 8 * (size_t)ndim), m += 8 * (size_t)ndim;
  memcpy(meta + m, &nbytes, 8), m += 8;
  uint32_t crc = loom_crc32c(loom_crc32c(0, meta, m), data, (size_t)nbytes);
  static const uint8_t zeros[CKPT_ALIGN] = {0};
  LOOM_CHECK(put(w, meta, m));
  LOOM_CHECK(put(w, &crc, sizeof crc));
  LOOM_CHECK(put(w, zeros, (CKPT_ALIGN - w->offset % CKPT_ALIGN) % CKPT_ALIGN));
  LOOM_CHECK(put(w, data, (size_t)nbytes));
fail:
  loom_tensor_free(&host);
  return status;
}

// fsync the directory that holds path, so that the rename is durable.
static loom_status_t sync_dir(const char *path) {
  char dir[PATH_MAX];
  const char *slash = strrchr(path, '/');
  if (!slash) {
    snprintf(dir, sizeof dir, ".");
  } else if (slash == path) {
    snprintf(dir, sizeof dir, "/");
  } else {
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int e = errno;
    if (fd >= 0) {
      close(fd);
    }
    return loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_save: fsync of directory %s: %s", dir,
                      strerror(e));
  }
  close(fd);
  return LOOM_OK;
}

// Where a save of path lands (out, size bytes): path, or the file its chain of symbolic links
// names, so that a link stays a link and the data lands where it points. *mode is the mode of
// the regular file replaced (its permissions carry over), 0 for a new file.
static loom_status_t save_target(const char *path, char *out, size_t size, mode_t *mode) {
  static const char op[] = "loom_checkpoint_save";
  *mode = 0;
  if (snprintf(out, size, "%s", path) >= (int)size) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: path '%s' is too long", op, path);
  }
  for (int hops = 0;; hops++) {
    struct stat st;
    if (lstat(out, &st) != 0) {
      int e = errno;
      if (e == ENOENT) { // a new file (or the missing target of a link); a missing directory
        return LOOM_OK;  // fails at the create, with its own message
      }
      return loom_error(NULL, LOOM_ERR_SYSTEM, "%s: cannot look at %s: %s", op, out, strerror(e));
    }
    if (S_ISREG(st.st_mode)) {
      *mode = st.st_mode & 07777;
      return LOOM_OK;
    }
    if (!S_ISLNK(st.st_mode)) { // a rename would replace a FIFO or device, or fail on a directory
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: %s is not a regular file (a %s): give the path of a file to write", op,
                        out, S_ISDIR(st.st_mode) ? "directory" : "FIFO, socket or device");
    }
    char link[PATH_MAX];
    ssize_t len = hops < 40 ? readlink(out, link, sizeof link - 1) : -1;
    if (len < 0) {
      int e = hops < 40 ? errno : ELOOP;
      return loom_error(NULL, LOOM_ERR_SYSTEM, "%s: following the link %s: %s", op, out,
                        strerror(e));
    }
    link[len] = '\0';
    const char *slash = strrchr(out, '/');
    char next[PATH_MAX];
    int w = link[0] == '/' || !slash
                ? snprintf(next, sizeof next, "%s", link)
                : snprintf(next, sizeof next, "%.*s/%s", (int)(slash - out), out, link);
    if (w < 0 || w >= (int)sizeof next || w >= (int)size) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: the link %s names a path too long", op,
                        out);
    }
    memcpy(out, next, (size_t)w + 1);
  }
}

loom_status_t loom_checkpoint_save(const char *path, const loom_ckpt_info_t *info,
                                   const loom_tensor_t *const *tensors, int n) {
  loom_status_t status = check_save_args(path, info, tensors, n);
  if (status != LOOM_OK) {
    return status;
  }
  char target[PATH_MAX], tmp[PATH_MAX];
  mode_t mode = 0;
  if ((status = save_target(path, target, sizeof target, &mode)) != LOOM_OK) {
    return status;
  }
  // Unique per save of this process (threads may save one path at once; the last rename wins).
  static unsigned long saves;
  const unsigned long nth = __atomic_add_fetch(&saves, 1, __ATOMIC_RELAXED);
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%lu", target, (long)getpid(), nth) >= (int)sizeof tmp) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_checkpoint_save: path '%s' is too long",
                      target);
  }
  writer_t w = {.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), .path = tmp};
  if (w.fd < 0) {
    int e = errno;
    return loom_error(NULL, LOOM_ERR_SYSTEM,
                      "loom_checkpoint_save: cannot create %s: %s (does the directory exist and "
                      "is it writable?)",
                      tmp, strerror(e));
  }
  if (mode != 0 && fchmod(w.fd, mode) != 0) { // the replaced file's permissions, not the umask's
    int e = errno;
    status = loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_save: fchmod %s to %o: %s", tmp,
                        (unsigned)mode, strerror(e));
    goto fail;
  }
  uint8_t header[CKPT_HEADER];
  uint32_t version = CKPT_VERSION, count = (uint32_t)n;
  int32_t world = info->world_size, rank = info->rank;
  int64_t step = info->step;
  memcpy(header, CKPT_MAGIC, 8);
  memcpy(header + 8, &version, 4);
  memcpy(header + 12, &world, 4);
  memcpy(header + 16, &rank, 4);
  memcpy(header + 20, &step, 8);
  memcpy(header + 28, &count, 4);
  uint32_t crc = loom_crc32c(0, header, 32);
  memcpy(header + 32, &crc, 4);
  LOOM_CHECK(put(&w, header, sizeof header));
  for (int i = 0; i < n; i++) {
    LOOM_CHECK(put_entry(&w, tensors[i]));
  }
  LOOM_CHECK(put(&w, CKPT_END, 8));
  LOOM_CHECK(put(&w, &count, 4));
  if (fsync(w.fd) != 0) {
    int e = errno;
    status = loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_save: fsync of %s: %s", tmp,
                        strerror(e));
    goto fail;
  }
  if (close(w.fd) != 0) {
    int e = errno;
    w.fd = -1;
    status =
        loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_save: closing %s: %s", tmp, strerror(e));
    goto fail;
  }
  w.fd = -1;
  if (rename(tmp, target) != 0) {
    int e = errno;
    status = loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_save: rename %s -> %s: %s", tmp,
                        target, strerror(e));
    goto fail;
  }
  LOOM_CHECK(sync_dir(target));
  LOOM_INFO(LOOM_SUB_MEM, "checkpoint %s: %d tensors, %llu bytes, step %lld", path, n,
            (unsigned long long)w.offset, (long long)step);
  return LOOM_OK;
fail:
  if (w.fd >= 0) {
    close(w.fd);
  }
  unlink(tmp); // (a no-op after a successful rename)
  return status;
}

// ---- reading --------------------------------------------------------------------------------

typedef struct entry {
  char name[LOOM_NAME_MAX];
  loom_dtype_t dtype;
  int ndim;
  int64_t shape[LOOM_MAX_DIMS];
  const uint8_t *data;
  uint64_t nbytes;
} entry_t;

struct loom_checkpoint {
  uint8_t *buf; // the whole file
  size_t size;
  loom_ckpt_info_t info;
  entry_t *e; // (count)
  int count;
};

// The parser's cursor over the file's bytes; every read is bounds-checked.
typedef struct reader {
  const uint8_t *buf;
  size_t size, off;
  const char *path;
} reader_t;

static loom_status_t corrupt(const reader_t *r, const char *what) {
  return loom_error(NULL, LOOM_ERR_CORRUPT,
                    "loom_checkpoint_open: %s is not a valid checkpoint: %s at byte %zu of %zu (a "
                    "truncated or damaged file: use an older checkpoint)",
                    r->path, what, r->off, r->size);
}

static int take(reader_t *r, void *dst, size_t n) {
  if (n > r->size - r->off) {
    return -1;
  }
  memcpy(dst, r->buf + r->off, n);
  r->off += n;
  return 0;
}

static loom_status_t parse_entry(reader_t *r, entry_t *e) {
  const size_t meta_at = r->off;
  uint16_t name_len = 0;
  uint8_t dtype = 0, ndim = 0;
  uint32_t crc = 0;
  if (take(r, &name_len, 2) != 0) {
    return corrupt(r, "the file ends inside an entry's name length");
  }
  if (name_len == 0 || name_len >= LOOM_NAME_MAX) {
    return corrupt(r, "an entry name is empty or longer than LOOM_NAME_MAX");
  }
  if (take(r, e->name, name_len) != 0) {
    return corrupt(r, "the file ends inside an entry's name");
  }
  e->name[name_len] = '\0';
  if (memchr(e->name, '\0', name_len)) {
    return corrupt(r, "an entry name holds a NUL byte");
  }
  if (take(r, &dtype, 1) != 0 || take(r, &ndim, 1) != 0) {
    return corrupt(r, "the file ends inside an entry's dtype");
  }
  e->dtype = (loom_dtype_t)dtype;
  e->ndim = ndim;
  size_t esize = loom_dtype_size(e->dtype);
  if (esize == 0 || ndim > LOOM_MAX_DIMS) {
    return corrupt(r, "an entry has an unknown dtype or more than LOOM_MAX_DIMS dimensions");
  }
  // A zero extent anywhere makes the entry empty whatever the other extents are (the writer
  // takes (1 << 45, 0) as 0 bytes), so the size bound applies only to shapes without one.
  uint64_t numel = 1;
  int empty = 0;
  for (int d = 0; d < ndim; d++) {
    if (take(r, &e->shape[d], 8) != 0) {
      return corrupt(r, "the file ends inside an entry's shape");
    }
    if (e->shape[d] < 0) {
      return corrupt(r, "an entry has a negative extent");
    }
    empty |= e->shape[d] == 0;
  }
  for (int d = 0; d < ndim && !empty; d++) {
    if (numel > CKPT_MAX_FILE / (uint64_t)e->shape[d]) {
      return corrupt(r, "an entry has an impossibly large extent");
    }
    numel *= (uint64_t)e->shape[d];
  }
  if (empty) {
    numel = 0;
  }
  if (take(r, &e->nbytes, 8) != 0) {
    return corrupt(r, "the file ends inside an entry's size");
  }
  const size_t meta_len = r->off - meta_at;
  if (take(r, &crc, 4) != 0) {
    return corrupt(r, "the file ends inside an entry's CRC");
  }
  if (numel > CKPT_MAX_FILE / esize || e->nbytes != numel * esize) {
    return corrupt(r, "an entry's byte count does not match its dtype and shape");
  }
  size_t pad = (CKPT_ALIGN - r->off % CKPT_ALIGN) % CKPT_ALIGN;
  for (size_t i = 0; i < pad; i++) {
    uint8_t z = 1;
    if (take(r, &z, 1) != 0 || z != 0) {
      return corrupt(r, "an entry's padding is missing or not zero");
    }
  }
  if (e->nbytes > r->size - r->off) {
    return corrupt(r, "the file ends inside an entry's data");
  }
  e->data = r->buf + r->off;
  if (loom_crc32c(loom_crc32c(0, r->buf + meta_at, meta_len), e->data, (size_t)e->nbytes) != crc) {
    char what[LOOM_NAME_MAX + 64];
    snprintf(what, sizeof what, "the CRC32C of tensor '%s' does not match its data", e->name);
    return corrupt(r, what);
  }
  r->off += (size_t)e->nbytes;
  return LOOM_OK;
}

// Validate the file's bytes (buf, size) and fill ck's entries. path names it in messages.
static loom_status_t parse(loom_checkpoint_t *ck, const char *path) {
  reader_t r = {.buf = ck->buf, .size = ck->size, .off = 0, .path = path};
  uint8_t header[CKPT_HEADER];
  uint32_t version, count, crc;
  int32_t world, rank;
  int64_t step;
  if (take(&r, header, sizeof header) != 0) {
    return corrupt(&r, "the file is shorter than the header");
  }
  if (memcmp(header, CKPT_MAGIC, 8) != 0) {
    r.off = 0;
    return corrupt(&r, "the magic bytes are not LOOMCKPT (not a loom checkpoint)");
  }
  memcpy(&version, header + 8, 4);
  memcpy(&world, header + 12, 4);
  memcpy(&rank, header + 16, 4);
  memcpy(&step, header + 20, 8);
  memcpy(&count, header + 28, 4);
  memcpy(&crc, header + 32, 4);
  if (version != CKPT_VERSION) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "loom_checkpoint_open: %s has format version %u; this loom reads version "
                      "%u: load it with the loom that wrote it",
                      path, version, CKPT_VERSION);
  }
  if (loom_crc32c(0, header, 32) != crc) {
    return corrupt(&r, "the header CRC32C does not match");
  }
  if (world < 1 || rank < 0 || rank >= world || step < 0) {
    return corrupt(&r, "the header's world size, rank or step is out of range");
  }
  // Each entry takes at least 24 bytes: a count beyond that is a lie.
  if (count > (ck->size - CKPT_HEADER) / 24 || count > INT_MAX) {
    return corrupt(&r, "the header's tensor count is larger than the file can hold");
  }
  ck->info = (loom_ckpt_info_t){.world_size = world, .rank = rank, .step = step};
  ck->e = calloc((size_t)count + 1, sizeof *ck->e);
  if (!ck->e) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "loom_checkpoint_open: no memory for %u entries",
                      count);
  }
  for (uint32_t i = 0; i < count; i++) {
    loom_status_t status = parse_entry(&r, &ck->e[i]);
    if (status != LOOM_OK) {
      return status;
    }
    for (uint32_t j = 0; j < i; j++) {
      if (strcmp(ck->e[j].name, ck->e[i].name) == 0) {
        return corrupt(&r, "two entries have the same name");
      }
    }
    ck->count = (int)i + 1;
  }
  uint8_t end[8];
  uint32_t count2 = 0;
  if (take(&r, end, 8) != 0 || memcmp(end, CKPT_END, 8) != 0 || take(&r, &count2, 4) != 0 ||
      count2 != count) {
    return corrupt(&r, "the trailer is missing or does not repeat the tensor count");
  }
  if (r.off != r.size) {
    return corrupt(&r, "bytes follow the trailer");
  }
  return LOOM_OK;
}

loom_status_t loom_checkpoint_open(const char *path, loom_checkpoint_t **out) {
  loom_status_t status = LOOM_OK;
  loom_checkpoint_t *ck = NULL;
  FILE *f = NULL;
  if (!out) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_checkpoint_open: out is NULL");
  }
  *out = NULL;
  if (!path || !path[0]) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "loom_checkpoint_open: path is NULL or empty");
  }
  uint64_t size = 0;
  int not_regular = 0;
  f = loom_fopen_regular(path, "rb", CKPT_MAX_FILE, &size, &not_regular);
  if (!f) {
    int e = errno;
    return not_regular
               ? loom_error(NULL, LOOM_ERR_CORRUPT,
                            "loom_checkpoint_open: %s is not a regular file of at most 1 TiB", path)
               : loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_open: cannot open %s: %s", path,
                            strerror(e));
  }
  ck = calloc(1, sizeof *ck);
  LOOM_CHECK_SYS(NULL, ck != NULL, "calloc(loom_checkpoint)");
  ck->size = (size_t)size;
  ck->buf = malloc(ck->size ? ck->size : 1);
  LOOM_CHECK_SYS(NULL, ck->buf != NULL, "malloc(checkpoint file)");
  if (ck->size && fread(ck->buf, 1, ck->size, f) != ck->size) {
    status = loom_error(NULL, LOOM_ERR_SYSTEM, "loom_checkpoint_open: reading %s failed", path);
    goto fail;
  }
  LOOM_CHECK(parse(ck, path));
  fclose(f);
  *out = ck;
  return LOOM_OK;
fail:
  if (f) {
    fclose(f);
  }
  loom_checkpoint_close(ck);
  return status;
}

loom_status_t loom_checkpoint_open_memory(const void *bytes, size_t size, loom_checkpoint_t **out) {
  loom_status_t status = LOOM_OK;
  loom_checkpoint_t *ck = NULL;
  if (!out || (size > 0 && !bytes)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_checkpoint_open_memory: out and bytes must not be NULL");
  }
  *out = NULL;
  ck = calloc(1, sizeof *ck);
  LOOM_CHECK_SYS(NULL, ck != NULL, "calloc(loom_checkpoint)");
  ck->size = size;
  ck->buf = malloc(size ? size : 1);
  LOOM_CHECK_SYS(NULL, ck->buf != NULL, "malloc(checkpoint bytes)");
  if (size) {
    memcpy(ck->buf, bytes, size);
  }
  LOOM_CHECK(parse(ck, "(memory)"));
  *out = ck;
  return LOOM_OK;
fail:
  loom_checkpoint_close(ck);
  return status;
}

void loom_checkpoint_close(loom_checkpoint_t *ck) {
  if (ck) {
    free(ck->buf);
    free(ck->e);
    free(ck);
  }
}

void loom_checkpoint_info(const loom_checkpoint_t *ck, loom_ckpt_info_t *out) {
  if (ck && out) {
    *out = ck->info;
  }
}

int loom_checkpoint_count(const loom_checkpoint_t *ck) {
  return ck ? ck->count : 0;
}

static void view_of(const entry_t *e, loom_tensor_t *view) {
  loom_tensor_wrap(view, (void *)e->data, e->dtype, LOOM_DEVICE_HOST, e->ndim, e->shape, e->name);
}

loom_status_t loom_checkpoint_entry(const loom_checkpoint_t *ck, int i, loom_tensor_t *view) {
  if (!ck || !view || i < 0 || i >= ck->count) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_checkpoint_entry: entry %d of %d (checkpoint %s, view %s)", i,
                      ck ? ck->count : 0, ck ? "set" : "NULL", view ? "set" : "NULL");
  }
  view_of(&ck->e[i], view);
  return LOOM_OK;
}

loom_status_t loom_checkpoint_find(const loom_checkpoint_t *ck, const char *name,
                                   loom_tensor_t *view) {
  if (!ck || !name || !view) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "loom_checkpoint_find: checkpoint, name and view must not be NULL");
  }
  for (int i = 0; i < ck->count; i++) {
    if (strcmp(ck->e[i].name, name) == 0) {
      view_of(&ck->e[i], view);
      return LOOM_OK;
    }
  }
  return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                    "loom_checkpoint_find: the checkpoint has no tensor '%s' (it holds %d "
                    "tensors): was it written by another program or model configuration?",
                    name, ck->count);
}

// "(4, 3) f32" for messages.
static void describe(loom_dtype_t dtype, int ndim, const int64_t *shape, char *buf, size_t cap) {
  size_t o = (size_t)snprintf(buf, cap, "(");
  for (int d = 0; d < ndim && o < cap; d++) {
    o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
  }
  if (o < cap) {
    snprintf(buf + o, cap - o, ") %s", loom_dtype_name(dtype));
  }
}

loom_status_t loom_checkpoint_load(const char *path, const loom_ckpt_info_t *expect,
                                   loom_tensor_t *const *tensors, int n, int64_t *step) {
  static const char op[] = "loom_checkpoint_load";
  loom_checkpoint_t *ck = NULL;
  loom_status_t status = LOOM_OK;
  if (!expect || n < 0 || (n > 0 && !tensors)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: expect and tensors must be given", op);
  }
  for (int i = 0; i < n; i++) {
    if (!tensors[i] || !tensors[i]->name[0] || !memchr(tensors[i]->name, '\0', LOOM_NAME_MAX)) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensors[%d] is NULL, unnamed, or has a name without its NUL within "
                        "LOOM_NAME_MAX (%d) characters",
                        op, i, LOOM_NAME_MAX);
    }
    // A destination the copy would refuse is refused here, before any tensor is written.
    if (loom_tensor_numel(tensors[i]) > 0 && !tensors[i]->data) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensors[%d] '%s' has %lld elements but data is NULL: allocate it "
                        "(loom_tensor_alloc) before loading into it",
                        op, i, tensors[i]->name, (long long)loom_tensor_numel(tensors[i]));
    }
    if ((status = loom_device_check(tensors[i]->device)) != LOOM_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", loom_last_error(NULL));
      return loom_error(NULL, status, "%s: tensors[%d] '%s': %s", op, i, tensors[i]->name, why);
    }
  }
  LOOM_CHECK(loom_checkpoint_open(path, &ck));
  if (ck->info.world_size != expect->world_size || ck->info.rank != expect->rank) {
    status =
        loom_error(NULL, LOOM_ERR_INVALID_ARG,
                   "%s: %s was written by rank %d of %d ranks, but this is rank %d of %d: "
                   "resume with the world size it was saved with",
                   op, path, ck->info.rank, ck->info.world_size, expect->rank, expect->world_size);
    goto fail;
  }
  loom_tensor_t *views = calloc((size_t)n + 1, sizeof *views);
  LOOM_CHECK_SYS(NULL, views != NULL, "calloc(checkpoint views)");
  for (int i = 0; i < n && status == LOOM_OK; i++) { // every check before the first copy
    const loom_tensor_t *t = tensors[i];
    if ((status = loom_checkpoint_find(ck, t->name, &views[i])) != LOOM_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", loom_last_error(NULL));
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: %s: %s", op, path, why);
      break;
    }
    int same = views[i].dtype == t->dtype && views[i].ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++) {
      same = views[i].shape[d] == t->shape[d];
    }
    if (!same) {
      char want[128], got[128];
      describe(t->dtype, t->ndim, t->shape, want, sizeof want);
      describe(views[i].dtype, views[i].ndim, views[i].shape, got, sizeof got);
      status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                          "%s: tensor '%s' is %s in %s but %s here: the model configuration "
                          "differs from the one that was saved",
                          op, t->name, got, path, want);
    }
  }
  for (int i = 0; i < n && status == LOOM_OK; i++) {
    status = loom_tensor_copy(tensors[i], &views[i]);
  }
  free(views);
  if (status == LOOM_OK && step) {
    *step = ck->info.step;
  }
fail:
  loom_checkpoint_close(ck);
  return status;
}
