/* compress_coll.c — compressed allreduce: the indivisible, divisible and hierarchical schemes
 * over loom's collectives, sums in rank order so that every replica ends with the same bits. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>
#endif

#include "args.h"
#include "comm_internal.h"
#include "compress_internal.h"
#include "ctx.h"
#include "error.h"
#include "groups.h"
#include "memory.h"

// Every payload travels in a fixed-size block (so that one allgather or alltoall carries them):
// an 8-byte length, then the payload, then padding up to the block size. A block whose length
// is all ones marks a chunk its sender could not encode: its receivers fail with CORRUPT.
#define LEN_BYTES  LOOM_BLOCK_LEN_BYTES
#define LEN_FAILED LOOM_BLOCK_FAILED

static size_t block_bytes(const loom_compressor_t *c, int64_t n) {
  size_t b = LEN_BYTES + loom_codec_max_bytes(c, n);
  return (b + 7) & ~(size_t)7;
}

// Seed of shard i: every rank derives the same one.
static uint64_t shard_seed(uint64_t seed, int i) {
  return loom_mix64(seed ^ ((uint64_t)(i + 1) << 32));
}

// The seed rank's encode at stage (ENC_FIRST: its own values; ENC_SUM: the owner's re-encode of
// a summed shard) passes to the encoder: int8:sr's random stream is salted by both, so that no
// two encodes of one value share their rounding (with one stream, the ranks' rounding errors did
// not cancel, and the owner's re-encode rounded in step with the first: the sum was biased).
// Only int8:sr's encoder reads it (its decoder ignores the seed), so the decoders keep the
// unsalted seed; randomk's seed is returned as is (every rank must pick the same indices).
enum { ENC_FIRST = 0, ENC_SUM = 1 };
static uint64_t encode_seed(const loom_compressor_t *c, uint64_t seed, int rank, int stage) {
  if (c->kind != LOOM_CODEC_INT8 || !c->stochastic) {
    return seed;
  }
  const uint64_t salt = ((uint64_t)(uint32_t)rank << 1 | (uint64_t)stage) + 0x73722d73616c74ull;
  return loom_mix64(seed ^ loom_mix64(salt)); // "sr-salt"
}

// Shard i of len values cut into np nearly equal parts: [*lo, *lo + *cnt).
static void shard_range(int64_t len, int np, int i, int64_t *lo, int64_t *cnt) {
  const int64_t base = len / np, extra = len % np;
  *lo = i * base + (i < extra ? i : extra);
  *cnt = base + (i < extra);
}

// Decode the payload in a block (its length checked against the block) into acc.
static loom_status_t decode_block(const loom_compressor_t *c, const uint8_t *block, size_t bsize,
                                  int64_t n, uint64_t seed, float *acc) {
  uint64_t len;
  memcpy(&len, block, LEN_BYTES);
  if (len == LEN_FAILED) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "%s: a peer could not encode its part of this allreduce (its own error "
                      "message says why)",
                      c->name);
  }
  if (len > bsize - LEN_BYTES) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "%s: a block claims a %llu-byte payload in %zu bytes: the payload was "
                      "damaged, or ranks disagree on the compressor or the tensor size",
                      c->name, (unsigned long long)len, bsize - LEN_BYTES);
  }
  return loom_codec_decode_add(c, block + LEN_BYTES, (size_t)len, n, seed, acc);
}

// Encode x[0, n) into a block, with error feedback on the same range of the residual (y = x + r;
// r = y - decode) when res is non-NULL. On failure the block is marked failed.
static loom_status_t encode_block(const loom_compressor_t *c, float *res, float *y, const float *x,
                                  int64_t n, uint64_t seed, uint8_t *block, size_t bsize) {
  size_t len = 0;
  loom_status_t status =
      loom_ef_encode(c, res, y, x, n, seed, block + LEN_BYTES, bsize - LEN_BYTES, &len);
  uint64_t len64 = status == LOOM_OK ? len : LEN_FAILED;
  memcpy(block, &len64, LEN_BYTES);
  if (status == LOOM_OK) {
    memset(block + LEN_BYTES + len, 0, bsize - LEN_BYTES - len);
  }
  return status;
}

// Payload buffers reused from call to call (fresh 64 MiB buffers cost more in page faults than
// the copies they hold) are kept in the group (loom_group_buffer). Calls on one group are
// serialised anyway (MPI collectives on one communicator must be issued in one order).

enum { BUF_BLOCKS = LOOM_GROUP_BUF_COMPRESS_BLOCKS, BUF_FLOATS = LOOM_GROUP_BUF_COMPRESS_FLOATS };

// ---------------------------------------------------------------------------------------------
// The flat schemes as a staged request (comm_internal.h). The tensor is cut into chunks of
// LOOM_COMPRESS_CHUNK bytes (chunk k encoded with seed + k, each chunk its own scheme), and the
// chunks pipeline: while chunk k + 1 is on the wire, this rank decodes chunk k and encodes
// chunk k + 2. The step hook runs each time a stage's MPI requests completed, on whichever thread
// advances the request (the caller of loom_wait/loom_test, or the scheduler's progress thread).
//
// Indivisible: exchange A sends the chunk's payload to every rank; every rank decodes and sums
// the np payloads in rank order. Divisible: exchange A sends shard i of the chunk to rank i; rank
// i decodes and sums its shard in rank order and re-encodes the sum; exchange B brings every
// summed shard to every rank. Stage k (k = 0 .. nchunks) is: A(k) and, divisible, B(k - 1).
//
// A rank that meets an error (a corrupt payload, a failed encode) keeps running the exchanges,
// so that its peers never wait for a message that will not come, skips the codec work, sends
// failed blocks, and reports the first error at the end with x untouched.

typedef struct flat {
  const loom_group_t *g;
  const loom_compressor_t *c;
  float *x;         // (n) the tensor, written at the end
  float *res;       // (n) its error-feedback residual, or NULL
  int64_t n, chunk; // values; values per chunk (the last one may be shorter)
  int nchunks, k;   // chunks; the chunk whose exchange A completed when the step runs
  uint64_t seed;
  int divisible, avg;
  size_t bsize;               // one block: the length word, a payload, padding
  uint8_t *send[2], *recv[2]; // exchange A, by chunk parity: np blocks (one to send when
                              // indivisible)
  uint8_t *mine[2], *gath[2]; // exchange B (divisible): one block, np blocks
  float *acc, *out;           // (widest shard) summed shard, (n) the result before x
  MPI_Comm p2p;               // the group's point-to-point communicator
  int tag;                    // A on tag, B on tag + 1, reserved when the call starts
  loom_status_t status;       // the first error
  int poisoned;               // x never held the tensor: every block this rank sends is failed
  char errmsg[256];
} flat_t;

static void chunk_range(const flat_t *f, int k, int64_t *lo, int64_t *len) {
  *lo = (int64_t)k * f->chunk;
  *len = f->n - *lo < f->chunk ? f->n - *lo : f->chunk;
}

// Keep the first error and its message.
static void flat_fail(flat_t *f, loom_status_t status) {
  if (status != LOOM_OK && f->status == LOOM_OK) {
    f->status = status;
    snprintf(f->errmsg, sizeof f->errmsg, "%s", loom_last_error(NULL));
  }
}

// Exchange blocks of bsize bytes with every other rank by point-to-point messages on a reserved
// tag (collectives posted from a step hook could be posted in a different order on different
// ranks, and MPI would match them wrongly; messages of one pair and tag match in order, so every
// chunk uses the same tag). all_to_all: block i of send goes to rank i; else the one block of
// send goes to everyone. Block j of recv comes from rank j.
static loom_status_t flat_exchange(loom_request_t *r, const flat_t *f, const uint8_t *send,
                                   uint8_t *recv, int all_to_all, int tag) {
  const int np = loom_group_size(f->g), me = loom_group_rank(f->g);
  loom_status_t status = LOOM_OK;
  const int64_t b = (int64_t)f->bsize;
  memcpy(recv + (size_t)me * f->bsize, all_to_all ? send + (size_t)me * f->bsize : send, f->bsize);
  for (int k = 1; k < np && status == LOOM_OK; k++) {
    int to = (me + k) % np, from = (me - k + np) % np;
    status = loom_mpi_post_p2p(r, 0, recv + (size_t)from * f->bsize, b, LOOM_U8, from, tag, f->p2p);
    if (status == LOOM_OK) {
      status = loom_mpi_post_p2p(r, 1, all_to_all ? send + (size_t)to * f->bsize : send, b, LOOM_U8,
                                 to, tag, f->p2p);
    }
  }
  return status;
}

static void flat_release(loom_request_t *r) {
  free(r->state);
  r->state = NULL;
}

// Encode chunk k of x into dst (np shard blocks, or one block).
static void encode_chunk(flat_t *f, int k, uint8_t *dst) {
  const int np = loom_group_size(f->g), me = loom_group_rank(f->g);
  int64_t lo, len;
  chunk_range(f, k, &lo, &len);
  const uint64_t seed = f->seed + (uint64_t)k;
  float *y = f->out + lo; // free until chunk k is decoded: holds x + residual while encoding
  if (f->poisoned) {      // nothing to encode: failed blocks, the residual untouched
    const uint64_t failed = LEN_FAILED;
    for (int i = 0; i < (f->divisible ? np : 1); i++) {
      memcpy(dst + (size_t)i * f->bsize, &failed, LEN_BYTES);
    }
    return;
  }
  if (!f->divisible) {
    flat_fail(f, encode_block(f->c, f->res ? f->res + lo : NULL, y, f->x + lo, len,
                              encode_seed(f->c, seed, me, ENC_FIRST), dst, f->bsize));
    return;
  }
  for (int i = 0; i < np; i++) {
    int64_t slo, cnt;
    shard_range(len, np, i, &slo, &cnt);
    flat_fail(f, encode_block(f->c, f->res ? f->res + lo + slo : NULL, y, f->x + lo + slo, cnt,
                              encode_seed(f->c, shard_seed(seed, i), me, ENC_FIRST),
                              dst + (size_t)i * f->bsize, f->bsize));
  }
}

// Decode the np blocks of chunk k (whole payloads, or the np summed shards) into out.
static void decode_chunk(flat_t *f, int k, const uint8_t *blocks) {
  const int np = loom_group_size(f->g);
  int64_t lo, len;
  chunk_range(f, k, &lo, &len);
  const uint64_t seed = f->seed + (uint64_t)k;
  memset(f->out + lo, 0, (size_t)len * sizeof(float));
  for (int i = 0; i < np && f->status == LOOM_OK; i++) {
    const uint8_t *b = blocks + (size_t)i * f->bsize;
    if (f->divisible) {
      int64_t slo, cnt;
      shard_range(len, np, i, &slo, &cnt);
      flat_fail(f, decode_block(f->c, b, f->bsize, cnt, shard_seed(seed, i), f->out + lo + slo));
    } else {
      flat_fail(f, decode_block(f->c, b, f->bsize, len, seed, f->out + lo));
    }
  }
}

// Divisible, after A(k): sum this rank's shard of chunk k in rank order and re-encode it.
static void sum_shard(flat_t *f, int k) {
  const int np = loom_group_size(f->g), me = loom_group_rank(f->g);
  int64_t lo, len, slo, cnt;
  chunk_range(f, k, &lo, &len);
  shard_range(len, np, me, &slo, &cnt);
  const uint64_t seed = shard_seed(f->seed + (uint64_t)k, me);
  uint8_t *mine = f->mine[k & 1];
  memset(f->acc, 0, (size_t)cnt * sizeof(float));
  for (int i = 0; i < np && f->status == LOOM_OK; i++) {
    flat_fail(
        f, decode_block(f->c, f->recv[k & 1] + (size_t)i * f->bsize, f->bsize, cnt, seed, f->acc));
  }
  if (f->status == LOOM_OK) {
    flat_fail(f, encode_block(f->c, NULL, NULL, f->acc, cnt, encode_seed(f->c, seed, me, ENC_SUM),
                              mine, f->bsize));
  } else {
    const uint64_t failed = LEN_FAILED;
    memcpy(mine, &failed, LEN_BYTES);
  }
}

// The result (or the first error) once every chunk is decoded.
static loom_status_t flat_result(flat_t *f) {
  if (f->status != LOOM_OK) {
    return loom_error(NULL, f->status, "%s", f->errmsg);
  }
  const float np = (float)loom_group_size(f->g);
  for (int64_t i = 0; i < f->n; i++) {
    f->x[i] = f->avg ? f->out[i] / np : f->out[i];
  }
  return LOOM_OK;
}

// Stage k completed: A(k) and, divisible, B(k - 1). Post A(k + 1), then B(k) (divisible) or
// decode chunk k; decode chunk k - 1 (divisible); encode chunk k + 2 into the freed send buffer.
static loom_status_t flat_step(loom_request_t *r) {
  flat_t *f = r->state;
  const int k = f->k, last = f->nchunks - 1;
  loom_status_t status = LOOM_OK;
  if (k + 1 <= last) {
    LOOM_CHECK(
        flat_exchange(r, f, f->send[(k + 1) & 1], f->recv[(k + 1) & 1], f->divisible, f->tag));
  }
  if (k <= last && f->divisible) {
    if (f->status == LOOM_OK) {
      sum_shard(f, k);
    }
    LOOM_CHECK(flat_exchange(r, f, f->mine[k & 1], f->gath[k & 1], 0, f->tag + 1));
  } else if (k <= last) {
    decode_chunk(f, k, f->recv[k & 1]);
  }
  if (f->divisible && k >= 1) {
    decode_chunk(f, k - 1, f->gath[(k - 1) & 1]);
  }
  if (k + 2 <= last) {
    encode_chunk(f, k + 2, f->send[k & 1]);
  }
  f->k = k + 1;
  if (f->k <= last || (f->divisible && f->k == last + 1)) {
    r->step = flat_step;
    return LOOM_OK;
  }
  status = flat_result(f);
fail:
  return status;
}

// Buffers of a flat scheme: from the group's state (blocking calls) or owned by the request
// (non-blocking ones: several may be in flight on one group).
static loom_status_t flat_buffers(loom_request_t *r, flat_t *f, int own) {
  const int np = loom_group_size(f->g);
  const int64_t widest = f->divisible ? f->chunk / np + (f->chunk % np > 0) : 0;
  const size_t all = f->bsize * (size_t)np, sb = f->divisible ? all : f->bsize;
  const size_t per = sb + all + (f->divisible ? f->bsize + all : 0); // one parity's blocks
  const size_t fb = (size_t)(f->n + widest + 1) * sizeof(float);
  void *blocks = NULL, *floats = NULL;
  if (own) {
    loom_status_t status = loom_request_tmp(r, 2 * per, &blocks);
    if (status == LOOM_OK) {
      status = loom_request_tmp(r, fb, &floats);
    }
    if (status != LOOM_OK) {
      return status;
    }
  } else {
    blocks = loom_group_buffer(f->g, BUF_BLOCKS, 2 * per);
    floats = loom_group_buffer(f->g, BUF_FLOATS, fb);
  }
  if (!blocks || !floats) {
    return loom_error(NULL, LOOM_ERR_NOMEM,
                      "compressed allreduce (%s): cannot allocate %zu bytes of payload buffers",
                      f->c->name, 2 * per + fb);
  }
  for (int p = 0; p < 2; p++) {
    uint8_t *b = (uint8_t *)blocks + (size_t)p * per;
    f->send[p] = b;
    f->recv[p] = b + sb;
    f->mine[p] = f->divisible ? b + sb + all : NULL;
    f->gath[p] = f->divisible ? b + sb + all + f->bsize : NULL;
  }
  f->out = floats;
  f->acc = f->out + f->n;
  return LOOM_OK;
}

// Values per chunk: LOOM_COMPRESS_CHUNK bytes of f32 (the group's copy), or the whole tensor
// when 0 and for top-k, whose selection is over the whole tensor (cut into chunks it would keep
// the largest of each chunk; and at 1% it sends too little for a pipeline to pay).
static int64_t chunk_values(const loom_group_t *g, const loom_compressor_t *c, int64_t n) {
  int64_t v = n;
  if (g->compress_chunk > 0 && c->kind != LOOM_CODEC_TOPK) {
    v = g->compress_chunk / (int64_t)sizeof(float);
  }
  return v < n ? v : (n > 0 ? n : 1);
}

// The flat scheme's state on r, its tags (reserved now: every rank reserves them in the order of
// its calls) and its buffers. *sent grows by the bytes this rank will send.
static loom_status_t flat_reserve(loom_request_t *r, const loom_group_t *g,
                                  const loom_compressor_t *c, float *res, float *x, int64_t n,
                                  uint64_t seed, int divisible, int avg, int own, size_t *sent) {
  const int np = loom_group_size(g);
  flat_t *f = calloc(1, sizeof *f);
  if (!f) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "compressed allreduce: out of memory");
  }
  *f = (flat_t){.g = g,
                .c = c,
                .x = x,
                .res = res,
                .n = n,
                .seed = seed,
                .divisible = divisible,
                .avg = avg,
                .chunk = chunk_values(g, c, n)};
  r->state = f;
  r->release = flat_release;
  loom_status_t status = LOOM_OK;
  f->nchunks = n > 0 ? (int)((n + f->chunk - 1) / f->chunk) : 1;
  f->bsize = block_bytes(c, divisible ? f->chunk / np + (f->chunk % np > 0) : f->chunk);
  LOOM_CHECK(loom_mpi_collective_tags(g, &f->p2p, &f->tag, &r->watch));
  LOOM_CHECK(flat_buffers(r, f, own));
  const size_t per_chunk = f->bsize * (size_t)(np - 1) * (divisible ? 2 : 1);
  *sent += per_chunk * (size_t)f->nchunks;
fail:
  return status;
}

// Encode the first chunks of this rank's tensor (with error feedback on res when non-NULL) and
// post the first exchange on r (reserved by flat_reserve); the steps follow.
static loom_status_t flat_begin(loom_request_t *r) {
  flat_t *f = r->state;
  loom_status_t status = LOOM_OK;
  encode_chunk(f, 0, f->send[0]);
  LOOM_CHECK(flat_exchange(r, f, f->send[0], f->recv[0], f->divisible, f->tag));
  if (f->nchunks > 1) {
    encode_chunk(f, 1, f->send[1]);
  }
  r->step = flat_step;
fail:
  return status;
}

// flat_reserve and flat_begin at once: the tensor is there.
static loom_status_t flat_start(loom_request_t *r, const loom_group_t *g,
                                const loom_compressor_t *c, float *res, float *x, int64_t n,
                                uint64_t seed, int divisible, int avg, int own, size_t *sent) {
  loom_status_t status = flat_reserve(r, g, c, res, x, n, seed, divisible, avg, own, sent);
  return status == LOOM_OK ? flat_begin(r) : status;
}

// Blocking flat scheme with the group's buffers, watched as w (entered on g).
static loom_status_t flat(const loom_group_t *g, const loom_compressor_t *c, float *res, float *x,
                          int64_t n, uint64_t seed, int divisible, int avg, size_t *sent,
                          const struct loom_watch *w) {
  loom_request_t *r = loom_request_new("loom_compressed_allreduce");
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  r->watch = *w;
  loom_status_t status = flat_start(r, g, c, res, x, n, seed, divisible, avg, 0, sent);
  if (status != LOOM_OK) {
    loom_request_free(r);
    return status;
  }
  loom_request_started(r);
  return loom_wait(&r);
}

// ---------------------------------------------------------------------------------------------
// Hierarchical: the node and node-leader sub-groups of g (loom_group_nodes).

static loom_status_t hierarchical(const loom_group_t *g, const loom_compressor_t *c, float *res,
                                  loom_tensor_t *t, int64_t n, uint64_t seed, size_t *sent,
                                  const struct loom_watch *w) {
  loom_status_t status = LOOM_OK;
  const loom_group_t *node = NULL, *leaders = NULL;
  LOOM_CHECK(loom_group_nodes(g, &node, &leaders));
  if (node->size > 1) {
    LOOM_CHECK(loom_allreduce(node, t, t, LOOM_SUM));
    *sent += (size_t)n * sizeof(float) * 2 * (size_t)(node->size - 1) / (size_t)node->size;
  }
  loom_status_t leader = LOOM_OK;
  if (node->rank == 0) {
    struct loom_watch lw; // the leaders' part, watched on their sub-group
    loom_watch_enter(&lw, leaders, &w->d, 1);
    leader = flat(leaders, c, res, t->data, n, seed, 0, 0, sent, &lw);
  }
  LOOM_CHECK(loom_compress_hier_finish(node, leader, t));
fail:
  return status;
}

loom_status_t loom_compress_hier_finish(const loom_group_t *node, loom_status_t leader,
                                        loom_tensor_t *t) {
  loom_status_t status = LOOM_OK;
  if (node->size > 1) {
    // The leader's outcome first: after a failure there is no result to broadcast, and the
    // node's other ranks must not wait for one (they return the same status).
    int code = (int)leader;
    LOOM_CHECK_MPI(NULL, MPI_Bcast(&code, 1, MPI_INT, 0, node->comm));
    if (code != LOOM_OK && node->rank != 0) {
      return loom_error(NULL, (loom_status_t)code,
                        "compressed allreduce (hierarchical): this node's leader failed in the "
                        "exchange between nodes (its rank printed why); t holds the node's sum, "
                        "not the result");
    }
    if (code == LOOM_OK) {
      LOOM_CHECK(loom_broadcast(node, t, 0));
    }
  }
  status = leader;
fail:
  return status;
}

// ---------------------------------------------------------------------------------------------

// The checks of a CUDA tensor: the device path exists (NCCL, a visible device), t is well formed
// and its data is memory of its device (every compressor and scheme has a device form). Its
// residual lives on the device (compress_coll_nccl.c), not in *res.
static loom_status_t prepare_device(const char *name, const loom_compressor_t *c,
                                    const loom_ef_t *ef, const loom_tensor_t *t) {
#ifdef LOOM_HAVE_NCCL
  loom_status_t status = LOOM_OK;
  LOOM_CHECK(loom_comm_check_backend(name, "t", t));
  LOOM_CHECK(loom_arg_tensor(name, "t", t, LOOM_F32, t->device));
  if (loom_tensor_numel(t) > 0) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, t->data) != cudaSuccess ||
        (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) ||
        a.device != t->device) {
      (void)cudaGetLastError();
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: tensor '%s' says CUDA device %d, but its data %p is not memory of "
                        "that device: allocate it with loom_tensor_alloc on the device",
                        name, t->name, t->device, t->data);
    }
  }
  if (ef && !t->name[0]) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: error feedback is keyed by tensor name: set the tensor's name", name);
  }
  (void)c; // every compressor has a device form (powersgd: compress_powersgd_nccl.c)
fail:
  return status;
#else
  (void)c;
  (void)ef;
  return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                    "%s: tensor '%s' is on CUDA device %d, but loom was built without NCCL: "
                    "compressed collectives on device tensors need it (reconfigure with "
                    "--with-nccl), or pass f32 host tensors",
                    name, t->name, t->device);
#endif
}

// Checks shared by the blocking and non-blocking entry points; *res is the residual of t (or
// NULL without error feedback).
static loom_status_t prepare_checked(const char *name, const loom_group_t *g,
                                     const loom_compressor_t *c, loom_scheme_t scheme,
                                     loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
                                     float **res) {
  loom_status_t status = LOOM_OK;
  *res = NULL;
  LOOM_CHECK(loom_comm_check_group(name, g));
  if (!c || !t || (int)scheme < 0 || scheme >= LOOM_SCHEME_COUNT ||
      (op != LOOM_SUM && op != LOOM_AVG)) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: compressor %s, tensor %s, scheme %d, op %s: pass a compressor, a "
                      "tensor, a loom_scheme_t and LOOM_SUM or LOOM_AVG",
                      name, c ? "set" : "NULL", t ? "set" : "NULL", (int)scheme,
                      loom_redop_name(op));
  }
  if (t->dtype != LOOM_F32) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: tensor '%s' is %s on device %d: compressed collectives take f32 host "
                      "or CUDA tensors (allreduce others with loom_allreduce)",
                      name, t->name, loom_dtype_name(t->dtype), t->device);
  }
  if (t->device != LOOM_DEVICE_HOST) {
    return prepare_device(name, c, ef, t);
  }
  LOOM_CHECK(loom_arg_tensor(name, "t", t, LOOM_F32, LOOM_DEVICE_HOST)); // extents and data
  if (ef && !t->name[0]) {
    return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                      "%s: error feedback is keyed by tensor name: set the tensor's name", name);
  }
  if (ef && c->kind != LOOM_CODEC_POWERSGD) {
    LOOM_CHECK(loom_ef_residual(ef, t->name, loom_tensor_numel(t), res));
  }
fail:
  return status;
}

// prepare_checked; a call it refuses still takes part in LOOM_CHECK_CONSISTENCY's check of the
// members, marked refused, so that they return an error instead of waiting for this rank.
static loom_status_t prepare(const char *name, const loom_group_t *g, const loom_compressor_t *c,
                             loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
                             float **res) {
  loom_status_t status = prepare_checked(name, g, c, scheme, ef, t, op, res);
  if (status != LOOM_OK) {
    loom_consistency_refuse(g, LOOM_OPK_COMPRESSED_ALLREDUCE, t, status);
  }
  return status;
}

// This rank enters the compressed allreduce of t on g (the watchdog's record of it, w), and under
// LOOM_CHECK_CONSISTENCY the members compare their calls, compressor, scheme and seed included.
static loom_status_t enter(const loom_group_t *g, const loom_compressor_t *c, loom_scheme_t scheme,
                           const loom_tensor_t *t, loom_redop_t op, uint64_t seed,
                           struct loom_watch *w) {
  const int32_t s = (int32_t)scheme;
  uint64_t extra = loom_watch_hash(0, c->name, strlen(c->name));
  extra = loom_watch_hash(extra, &s, sizeof s);
  extra = loom_watch_hash(extra, &seed, sizeof seed);
  struct loom_op_desc d;
  loom_op_desc_set(&d, LOOM_OPK_COMPRESSED_ALLREDUCE, t->name, LOOM_F32, loom_tensor_numel(t),
                   (int)op, -1, extra);
  loom_watch_enter(w, g, &d, 1);
  return loom_check_consistency(w);
}

// The schemes that run to completion inside the call: hierarchical and PowerSGD.
static loom_status_t run_blocking(const loom_group_t *g, const loom_compressor_t *c,
                                  loom_scheme_t scheme, loom_ef_t *ef, float *res, loom_tensor_t *t,
                                  loom_redop_t op, uint64_t seed, size_t *sent,
                                  const struct loom_watch *w) {
  loom_status_t status = LOOM_OK;
  const int64_t n = loom_tensor_numel(t);
  if (c->kind == LOOM_CODEC_POWERSGD) {
    LOOM_CHECK(loom_powersgd_allreduce(g, c, ef, t, sent));
  } else if (scheme == LOOM_SCHEME_HIERARCHICAL) {
    LOOM_CHECK(hierarchical(g, c, res, t, n, seed, sent, w));
  } else {
    LOOM_CHECK(flat(g, c, res, t->data, n, seed, scheme == LOOM_SCHEME_DIVISIBLE, 0, sent, w));
  }
  if (op == LOOM_AVG) {
    float *x = t->data;
    const float np = (float)loom_group_size(g);
    for (int64_t i = 0; i < n; i++) {
      x[i] /= np;
    }
  }
fail:
  return status;
}

// A CUDA tensor (checked by prepare_device): the device form of the scheme.
static loom_status_t run_device(const loom_group_t *g, const loom_compressor_t *c,
                                loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                loom_redop_t op, uint64_t seed, size_t *sent,
                                struct loom_watch *w) {
#ifdef LOOM_HAVE_NCCL
  return loom_compressed_allreduce_cuda(g, c, scheme, ef, t, op, seed, sent, w);
#else
  (void)w;
  (void)g;
  (void)c;
  (void)scheme;
  (void)ef;
  (void)op;
  (void)seed;
  (void)sent;
  return loom_error(NULL, LOOM_ERR_INTERNAL,
                    "compressed allreduce of CUDA tensor '%s' without NCCL", t->name);
#endif
}

loom_status_t loom_compressed_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                        loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                        loom_redop_t op, uint64_t seed, size_t *bytes_sent) {
  static const char name[] = "loom_compressed_allreduce";
  size_t sent = 0;
  float *res = NULL;
  struct loom_watch w;
  loom_status_t status = prepare(name, g, c, scheme, ef, t, op, &res);
  if (status == LOOM_OK) {
    status = enter(g, c, scheme, t, op, seed, &w);
  }
  if (status == LOOM_OK && t->device != LOOM_DEVICE_HOST) {
    status = run_device(g, c, scheme, ef, t, op, seed, &sent, &w);
  } else if (status == LOOM_OK) {
    status = run_blocking(g, c, scheme, ef, res, t, op, seed, &sent, &w);
  }
  if (bytes_sent) {
    *bytes_sent = status == LOOM_OK ? sent : 0;
  }
  return status;
}

loom_status_t loom_icompressed_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                         loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                         loom_redop_t op, uint64_t seed, size_t *bytes_sent,
                                         loom_request_t **req) {
  static const char name[] = "loom_icompressed_allreduce";
  size_t sent = 0;
  float *res = NULL;
  loom_request_t *r = NULL;
  if (!req) {
    return loom_consistency_refuse(g, LOOM_OPK_COMPRESSED_ALLREDUCE, t,
                                   loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: req is NULL", name));
  }
  *req = NULL;
  struct loom_watch w;
  loom_status_t status = prepare(name, g, c, scheme, ef, t, op, &res);
  if (status == LOOM_OK) {
    status = enter(g, c, scheme, t, op, seed, &w);
  }
  if (status == LOOM_OK && t->device != LOOM_DEVICE_HOST) {
    status =
        run_device(g, c, scheme, ef, t, op, seed, &sent, &w); // done in stream order: no request
  } else if (status == LOOM_OK &&
             (c->kind == LOOM_CODEC_POWERSGD || scheme == LOOM_SCHEME_HIERARCHICAL)) {
    status = run_blocking(g, c, scheme, ef, res, t, op, seed, &sent, &w);
  } else if (status == LOOM_OK) {
    r = loom_request_new(name);
    if (r) {
      r->watch = w;
    }
    status = r ? flat_start(r, g, c, res, t->data, loom_tensor_numel(t), seed,
                            scheme == LOOM_SCHEME_DIVISIBLE, op == LOOM_AVG, 1, &sent)
               : LOOM_ERR_NOMEM;
    if (status == LOOM_OK) {
      loom_request_started(r);
      *req = r;
    } else {
      loom_request_free(r);
    }
  }
  if (bytes_sent) {
    *bytes_sent = status == LOOM_OK ? sent : 0;
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Shared with the device form of the schemes (compress_coll_nccl.c): the same blocks, chunks,
// shard seeds and hierarchical sub-groups, so that a device tensor gets the bits a host tensor
// would.

size_t loom_compress_block_bytes(const loom_compressor_t *c, int64_t n) {
  return block_bytes(c, n);
}

int64_t loom_compress_chunk_values(const loom_group_t *g, const loom_compressor_t *c, int64_t n) {
  return chunk_values(g, c, n);
}

uint64_t loom_compress_shard_seed(uint64_t seed, int i) {
  return shard_seed(seed, i);
}

uint64_t loom_compress_encode_seed(const loom_compressor_t *c, uint64_t seed, int rank, int sum) {
  return encode_seed(c, seed, rank, sum ? ENC_SUM : ENC_FIRST);
}

void loom_compress_shard_range(int64_t len, int np, int i, int64_t *lo, int64_t *cnt) {
  shard_range(len, np, i, lo, cnt);
}

// ---------------------------------------------------------------------------------------------
// Shared with the staged form (compress_staged.c): the host schemes on a host copy of a device
// tensor, entered at the call and, for the flat schemes, begun once the copy has landed.

loom_status_t loom_compress_host_enter(const char *name, const loom_group_t *g,
                                       const loom_compressor_t *c, loom_scheme_t scheme,
                                       loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
                                       uint64_t seed, float **res, struct loom_watch *w) {
  loom_status_t status = prepare(name, g, c, scheme, ef, t, op, res);
  return status == LOOM_OK ? enter(g, c, scheme, t, op, seed, w) : status;
}

int loom_compress_host_flat(const loom_compressor_t *c, loom_scheme_t scheme) {
  return c->kind != LOOM_CODEC_POWERSGD && scheme != LOOM_SCHEME_HIERARCHICAL;
}

loom_status_t loom_compress_host_run(const loom_group_t *g, const loom_compressor_t *c,
                                     loom_scheme_t scheme, loom_ef_t *ef, float *res,
                                     loom_tensor_t *t, loom_redop_t op, uint64_t seed, size_t *sent,
                                     const struct loom_watch *w) {
  return run_blocking(g, c, scheme, ef, res, t, op, seed, sent, w);
}

void loom_compress_flat_poison(loom_request_t *r, loom_status_t status) {
  flat_t *f = r->state;
  f->poisoned = 1;
  flat_fail(f, status != LOOM_OK ? status : LOOM_ERR_INTERNAL);
}

loom_status_t loom_compress_flat_deferred(loom_request_t *r, const loom_group_t *g,
                                          const loom_compressor_t *c, loom_scheme_t scheme,
                                          float *res, loom_tensor_t *t, loom_redop_t op,
                                          uint64_t seed, size_t *sent) {
  loom_status_t status = flat_reserve(r, g, c, res, t->data, loom_tensor_numel(t), seed,
                                      scheme == LOOM_SCHEME_DIVISIBLE, op == LOOM_AVG, 1, sent);
  if (status == LOOM_OK) {
    r->step = flat_begin;
  }
  return status;
}
