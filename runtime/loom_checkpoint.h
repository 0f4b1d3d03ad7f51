/* loom_checkpoint.h — checkpoints: one rank's named tensors at one step in a versioned file
 * with a CRC32C per tensor, written atomically and validated completely before anything loads. */
#ifndef LOOM_CHECKPOINT_H
#define LOOM_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// File layout (version 1; integers little-endian as on every supported host):
//   header  "LOOMCKPT" | u32 version | i32 world_size | i32 rank | i64 step | u32 count |
//           u32 crc32c of the header bytes before it
//   count entries, each: u16 name length | name bytes | u8 dtype | u8 ndim | i64 shape[ndim] |
//           u64 data bytes | u32 crc32c of the entry (the fields before it, then the data) |
//           zero bytes up to a multiple of 8 | data
//   trailer "LOOMEND!" | u32 count again
// Anything else (a short file, bytes after the trailer, a bad CRC, an entry whose data size
// does not match its dtype and shape) is LOOM_ERR_CORRUPT with the offset and what was expected.
typedef struct loom_ckpt_info {
  int world_size; // ranks of the job that wrote it
  int rank;       // the writer's rank
  int64_t step;   // the step it was taken after (the caller's meaning)
} loom_ckpt_info_t;

// Write tensors (host or device; names must be unique and non-empty) to path atomically: a
// temporary file in the same directory, fsync, rename over path, fsync of the directory. A
// failure leaves any previous file at path untouched and removes the temporary. A symbolic link
// at path stays: the file it points to is written (through the same steps, in its directory).
// A file replaced keeps its permissions; a new one gets 0644 less the umask. A directory, FIFO
// or device at path is refused.
LOOM_API loom_status_t loom_checkpoint_save(const char *path, const loom_ckpt_info_t *info,
                                            const loom_tensor_t *const *tensors, int n);

// An opened checkpoint: the whole file read and validated (header, every entry's CRC, the
// trailer), held in memory until loom_checkpoint_close.
typedef struct loom_checkpoint loom_checkpoint_t;
LOOM_API loom_status_t loom_checkpoint_open(const char *path, loom_checkpoint_t **out);
// The same from size bytes already in memory (copied: bytes may be freed after the call).
LOOM_API loom_status_t loom_checkpoint_open_memory(const void *bytes, size_t size,
                                                   loom_checkpoint_t **out);
LOOM_API void loom_checkpoint_close(loom_checkpoint_t *ck);
LOOM_API void loom_checkpoint_info(const loom_checkpoint_t *ck, loom_ckpt_info_t *out);
LOOM_API int loom_checkpoint_count(const loom_checkpoint_t *ck);
// Entry i (0 <= i < count) as a read-only host tensor view of the checkpoint's memory.
LOOM_API loom_status_t loom_checkpoint_entry(const loom_checkpoint_t *ck, int i,
                                             loom_tensor_t *view);
// The entry called name: LOOM_OK and *view, or LOOM_ERR_INVALID_ARG naming the missing tensor.
LOOM_API loom_status_t loom_checkpoint_find(const loom_checkpoint_t *ck, const char *name,
                                            loom_tensor_t *view);

// Load tensors (host or device) by name from path, after checking that the file was written by
// rank expect->rank of a job of expect->world_size ranks and that every tensor is in it with the
// same dtype and shape. All of it is checked before the first byte is copied: on any error no
// tensor is written. *step (may be NULL) receives the file's step.
LOOM_API loom_status_t loom_checkpoint_load(const char *path, const loom_ckpt_info_t *expect,
                                            loom_tensor_t *const *tensors, int n, int64_t *step);

// CRC32C (Castagnoli) of bytes, continuing from crc (start with 0). NULL bytes add nothing.
LOOM_API uint32_t loom_crc32c(uint32_t crc, const void *bytes, size_t len);

#ifdef __cplusplus
}
#endif
#endif
