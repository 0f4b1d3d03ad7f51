/* fuzz_codec_decode.c — libFuzzer target for every compressed-payload decoder
 * (loom_codec_decode_add): no crash or out-of-bounds access, and acc untouched on an error. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress_internal.h"
#include "log.h"

// Input: byte 0 picks the codec, byte 1 the ratio of topk/randomk ((b + 1) / 256), bytes 2-3
// (little endian, modulo MAX_N + 1) the element count n, byte 4 the seed, byte 5 bit 0 puts the
// payload at an odd address; the payload is the rest.
enum { PREFIX = 6, MAX_N = 4096 };

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  loom_log_configure(LOOM_LOG_WARN, LOOM_SUB_ALL, "/dev/null"); // each rejection logs a WARN
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const kinds[] = {"none", "fp16", "bf16", "int8", "topk", "randomk", "efsign"};
  enum { NKINDS = sizeof kinds / sizeof kinds[0] };
  if (size < PREFIX) {
    return 0;
  }
  const int kind = data[0] % NKINDS;
  char spec[64];
  if (kind == 4 || kind == 5) {
    snprintf(spec, sizeof spec, "%s:%.17g", kinds[kind], (data[1] + 1) / 256.0);
  } else {
    snprintf(spec, sizeof spec, "%s", kinds[kind]);
  }
  loom_compressor_t *c = NULL;
  if (loom_compressor_create(spec, &c) != LOOM_OK) {
    abort(); // every spec above is valid
  }
  const int64_t n = (int64_t)((data[2] | (unsigned)data[3] << 8) % (MAX_N + 1));
  const uint64_t seed = data[4];
  const size_t odd = data[5] & 1u, bytes = size - PREFIX;
  // Exact sizes: ASan reports any read past the payload or write past acc.
  uint8_t *buf = malloc(odd + bytes);
  float *acc = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
  if (!buf || !acc || !ref) {
    abort();
  }
  uint8_t *payload = buf + odd;
  memcpy(payload, data + PREFIX, bytes);
  for (int64_t i = 0; i < n; i++) {
    acc[i] = ref[i] = 0.25f * (float)(i % 97) - 3.0f;
  }
  loom_status_t st = loom_codec_decode_add(c, payload, bytes, n, seed, acc);
  if (st != LOOM_OK && memcmp(acc, ref, sizeof(float) * (size_t)n) != 0) {
    fprintf(stderr, "%s: decode failed (%d) but wrote acc\n", spec, (int)st);
    abort();
  }
  if (st == LOOM_OK && bytes != loom_codec_max_bytes(c, n) && bytes != LOOM_PAYLOAD_HEADER) {
    fprintf(stderr, "%s: accepted %zu bytes for n = %lld\n", spec, bytes, (long long)n);
    abort();
  }
  free(buf);
  free(acc);
  free(ref);
  loom_compressor_destroy(c);
  return 0;
}
