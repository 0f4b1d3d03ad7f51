/* fuzz_moe_msg.c — libFuzzer target for the check of the MoE count exchange (loom_moe_check_counts,
 * called by the layer on the counts it received) and the row offsets computed from accepted counts.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "moe_internal.h"

// Input: byte 0 the ep size np (1..8), byte 1 the local experts el (1..8), byte 2 the chunks
// (1..8), bytes 3-5 the row width (1..2^24, as H or F); then np * el counts, int64 little endian
// (missing bytes are zeros).
enum { PREFIX = 6, MAXP = 8 };

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, "/dev/null"); // each rejection logs a WARN
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < PREFIX) {
    return 0;
  }
  const int np = data[0] % MAXP + 1, el = data[1] % MAXP + 1, chunks = data[2] % MAXP + 1;
  const int64_t width =
      (int64_t)((data[3] | (uint32_t)data[4] << 8 | (uint32_t)data[5] << 16) % (1u << 24)) + 1;
  const size_t ncnt = (size_t)np * (size_t)el;
  int64_t *cnt = calloc(ncnt, sizeof *cnt); // exact: ASan sees any read past the counts
  if (!cnt) {
    abort();
  }
  for (size_t i = 0; i < ncnt; i++) {
    uint64_t u = 0;
    for (int b = 7; b >= 0; b--) {
      size_t at = PREFIX + 8 * i + (size_t)b;
      u = u << 8 | (at < size ? data[at] : 0u);
    }
    memcpy(&cnt[i], &u, sizeof u);
  }
  int64_t n_recv = -1;
  if (loom_moe_check_counts(cnt, np, el, width, &n_recv) == LOOM_OK) {
    // What the layer computes from accepted counts (UBSan reports any signed overflow): the
    // source offsets, every tile's offset and rows, and the float offsets of the buffers.
    struct loom_moe m;
    memset(&m, 0, sizeof m);
    m.np = np;
    m.el = el;
    m.chunks = chunks;
    m.cnt_recv = cnt;
    int64_t off = 0;
    for (int s = 0; s < np; s++) {
      const int64_t *c = cnt + (size_t)s * (size_t)el;
      int64_t rows = 0;
      for (int ch = 0; ch < chunks; ch++) {
        for (int e = 0; e < el; e++) {
          const int64_t in_s = loom_moe_tile_offset(&m, c, ch, e),
                        nr = moe_chunk_rows(&m, c, e, ch);
          if (nr < 0 || in_s != rows) {
            abort();
          }
          rows += nr;
          volatile int64_t at = (off + in_s + nr) * width; // the end of the tile, in floats
          (void)at;
        }
      }
      for (int e = 0; e < el; e++) {
        rows -= c[e];
      }
      if (rows != 0) {
        abort(); // the tiles of a source cover its rows exactly
      }
      for (int e = 0; e < el; e++) {
        off += c[e];
      }
    }
    if (off != n_recv || (size_t)n_recv * (size_t)width > (size_t)PTRDIFF_MAX / sizeof(float)) {
      abort();
    }
  }
  free(cnt);
  return 0;
}
