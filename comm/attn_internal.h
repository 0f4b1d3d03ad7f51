/* attn_internal.h — what attn_exec.c exposes inside the library: the check of a received
 * attention-server message, which needs no MPI (tests/fuzz/fuzz_attn_msg.c calls it). */
#ifndef LOOM_ATTN_INTERNAL_H
#define LOOM_ATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "loom_core.h"

// Every message opens with a header of four uint64 (host byte order): magic "LOOMATTN", phase,
// task count, float count; the payload of floats follows.
#define LOOM_ATTN_MSG_MAGIC  0x4e5454414d4f4f4cull // "LOOMATTN"
#define LOOM_ATTN_MSG_HEADER ((size_t)32)

// Check msg (bytes bytes, received from rank peer) against what the plan says it holds: exactly
// the header and nfloats floats, and a header announcing phase, ntasks and nfloats. LOOM_OK with
// *payload at the floats, or LOOM_ERR_CORRUPT (*payload NULL); nothing past bytes is read.
loom_status_t loom_attn_msg_check(const uint8_t *msg, size_t bytes, int peer, int phase, int ntasks,
                                  int64_t nfloats, const float **payload);

#endif
