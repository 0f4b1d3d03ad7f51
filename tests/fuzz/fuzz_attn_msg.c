/* fuzz_attn_msg.c — libFuzzer target for the check of a received attention-server message
 * (loom_attn_msg_check, the function loom_attn_exec's receive path calls): any bytes, any plan. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_internal.h"
#include "log.h"

// Input: byte 0 the phase the plan expects, byte 1 its task count, bytes 2-9 (little endian) its
// float count (any int64: negative and huge ones must be refused); the message is the rest.
enum { PREFIX = 10 };

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
  const int phase = data[0], ntasks = data[1];
  uint64_t u = 0;
  for (int i = 7; i >= 0; i--) {
    u = u << 8 | data[2 + i];
  }
  int64_t nfloats;
  memcpy(&nfloats, &u, sizeof nfloats);
  const size_t bytes = size - PREFIX;
  uint8_t *msg = malloc(bytes); // exact: ASan sees any read past the message
  if (!msg) {
    abort();
  }
  memcpy(msg, data + PREFIX, bytes);
  const float *payload = NULL;
  if (loom_attn_msg_check(msg, bytes, 1, phase, ntasks, nfloats, &payload) == LOOM_OK) {
    // What the receive path then does: read nfloats floats from the payload.
    if (payload != (const float *)(const void *)(msg + LOOM_ATTN_MSG_HEADER) ||
        bytes != LOOM_ATTN_MSG_HEADER + 4 * (size_t)nfloats) {
      abort();
    }
    volatile float sum = 0.0f;
    for (int64_t i = 0; i < nfloats; i++) {
      float v;
      memcpy(&v, payload + i, sizeof v);
      sum += v;
    }
    (void)sum;
  } else if (payload != NULL) {
    abort();
  }
  free(msg);
  return 0;
}
