/* fuzz_checkpoint.c — libFuzzer target for the checkpoint loader: any bytes given to
 * loom_checkpoint_open_memory are either rejected with an error or give entries that read safely.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "loom.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, "/dev/null"); // each rejection logs a WARN
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  loom_checkpoint_t *ck = NULL;
  loom_status_t st = loom_checkpoint_open_memory(data, size, &ck);
  if (st != LOOM_OK) {
    if (ck != NULL || (st != LOOM_ERR_CORRUPT && st != LOOM_ERR_NOMEM)) {
      abort(); // a rejected file must leave nothing open and say it is corrupt
    }
    return 0;
  }
  // Accepted: every entry's bytes lie inside the copy (ASan checks the reads) and match its
  // dtype and shape; find returns the same entry.
  for (int i = 0; i < loom_checkpoint_count(ck); i++) {
    loom_tensor_t v, w;
    if (loom_checkpoint_entry(ck, i, &v) != LOOM_OK ||
        loom_checkpoint_find(ck, v.name, &w) != LOOM_OK || w.data != v.data) {
      abort();
    }
    size_t bytes = loom_tensor_bytes(&v);
    uint32_t crc = loom_crc32c(0, v.data, bytes);
    (void)crc;
  }
  loom_checkpoint_close(ck);
  return 0;
}
