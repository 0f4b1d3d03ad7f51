/* compress_coll.c — compressed allreduce: the indivisible, divisible and hierarchical schemes
 * over loom's collectives, sums in rank order so that every replica ends with the same bits. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "compress_internal.h"
#include "ctx.h"
#include "error.h"
#include "groups.h"
#include "memory.h"

// Every payload travels in a fixed-size block (so that one allgather or alltoall carries them):
// an 8-byte length, then the payload, then padding up to the block size.
#define LEN_BYTES 8

static size_t block_bytes(const loom_compressor_t *c, int64_t n) {
  size_t b = LEN_BYTES + loom_codec_max_bytes(c, n);
  return (b + 7) & ~(size_t)7;
}

// Seed of shard i: every rank derives the same one.
static uint64_t shard_seed(uint64_t seed, int i) {
  return loom_mix64(seed ^ ((uint64_t)(i + 1) << 32));
}

// Decode the payload in a block (its length checked against the block) into acc.
static loom_status_t decode_block(const loom_compressor_t *c, const uint8_t *block, size_t bsize,
                                  int64_t n, uint64_t seed, float *acc) {
  uint64_t len;
  memcpy(&len, block, LEN_BYTES);
  if (len > bsize - LEN_BYTES) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "%s: a block claims a %llu-byte payload in %zu bytes: the payload was "
                      "damaged, or ranks disagree on the compressor or the tensor size",
                      c->name, (unsigned long long)len, bsize - LEN_BYTES);
  }
  return loom_codec_decode_add(c, block + LEN_BYTES, (size_t)len, n, seed, acc);
}

// Encode x[lo, lo + n) of a tensor into a block, with error feedback on the same range of the
// residual of name (y = x + r; r = y - decode) when res is non-NULL.
static loom_status_t encode_block(const loom_compressor_t *c, float *res, float *y, const float *x,
                                  int64_t n, uint64_t seed, uint8_t *block, size_t bsize) {
  size_t len = 0;
  loom_status_t status =
      loom_ef_encode(c, res, y, x, n, seed, block + LEN_BYTES, bsize - LEN_BYTES, &len);
  if (status == LOOM_OK) {
    uint64_t len64 = len;
    memcpy(block, &len64, LEN_BYTES);
    memset(block + LEN_BYTES + len, 0, bsize - LEN_BYTES - len);
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Per-group state, kept in the group (freed with it): payload buffers reused from call to call
// (fresh 64 MiB buffers cost more in page faults than the copies they hold) and, for the
// hierarchical scheme, the node and node-leader sub-groups. Calls on one group are serialised
// anyway (MPI collectives on one communicator must be issued in one order).

enum { BUF_SEND, BUF_RECV, BUF_MINE, BUF_FLOATS, NBUF };

typedef struct comm_state {
  void *buf[NBUF];
  size_t cap[NBUF];
  int have_hier;
  struct loom_group node, leaders;
} comm_state_t;

static void free_group(struct loom_group *g);

static void state_destroy(void *p) {
  comm_state_t *st = p;
  for (int i = 0; i < NBUF; i++) {
    loom_host_free(st->buf[i]);
  }
  if (st->have_hier) {
    free_group(&st->node);
    free_group(&st->leaders);
  }
  free(st);
}

static void free_group(struct loom_group *g) {
  if (g->hier && g->hier_destroy) {
    g->hier_destroy(g->hier);
  }
  if (g->comm != MPI_COMM_NULL) {
    MPI_Comm_free(&g->comm);
  }
  free(g->world_ranks);
}

static comm_state_t *get_state(const loom_group_t *cg) {
  struct loom_group *g = (struct loom_group *)cg; // the cache lives in the group
  if (!g->hier) {
    g->hier = calloc(1, sizeof(comm_state_t));
    g->hier_destroy = state_destroy;
  }
  if (!g->hier) {
    loom_error(NULL, LOOM_ERR_NOMEM, "compressed allreduce: out of memory");
  }
  return g->hier;
}

// Buffer i of the group's state with at least bytes bytes (contents undefined); NULL on NOMEM.
static void *scratch(comm_state_t *st, int i, size_t bytes) {
  if (st->cap[i] < bytes) {
    loom_host_free(st->buf[i]);
    st->buf[i] = loom_host_alloc(bytes);
    st->cap[i] = st->buf[i] ? bytes : 0;
  }
  return st->buf[i];
}

// ---------------------------------------------------------------------------------------------
// The flat schemes as a staged request (comm_internal.h): the encode runs when the call starts,
// then each stage's MPI requests complete and the step hook does the codec work between them
// and posts the next stage. The hooks run on whichever thread advances the request (the caller
// of loom_wait/loom_test, or the scheduler's progress thread).
//
// Indivisible: allgather of whole payloads, then every rank decodes and sums in rank order.
// Divisible: shard i goes to rank i (alltoall), rank i decodes and sums its shard in rank order
// and re-encodes the sum, and an allgather brings every summed shard to every rank.

typedef struct flat {
  const loom_group_t *g;
  const loom_compressor_t *c;
  float *x; // (n) the tensor, written at the end
  int64_t n;
  uint64_t seed;
  int divisible, avg;
  size_t bsize;     // one block: the length word, a payload, padding
  int64_t *off;     // (np + 1) shard offsets (divisible)
  uint8_t *send;    // (np blocks) encoded shards, or one block (indivisible)
  uint8_t *recv;    // (np blocks)
  uint8_t *mine;    // (1 block) the re-encoded summed shard (divisible)
  float *acc, *out; // (widest) the summed shard, (n) the result before it is copied to x
  MPI_Comm p2p;     // the group's point-to-point communicator
  int tag;          // tag (first stage) and tag + 1 (second), reserved when the call starts
} flat_t;

// Exchange blocks of bsize bytes with every other rank by point-to-point messages on the tags
// reserved at the start (collectives posted from a step hook could be posted in a different
// order on different ranks, and MPI would match them wrongly). all_to_all: block i of send goes
// to rank i; else the one block of send goes to everyone. Block j of recv comes from rank j.
static loom_status_t flat_exchange(loom_request_t *r, const flat_t *f, const uint8_t *send,
                                   int all_to_all, int tag) {
  const int np = loom_group_size(f->g), me = loom_group_rank(f->g);
  loom_status_t status = LOOM_OK;
  const int64_t b = (int64_t)f->bsize;
  memcpy(f->recv + (size_t)me * f->bsize, all_to_all ? send + (size_t)me * f->bsize : send,
         f->bsize);
  for (int k = 1; k < np && status == LOOM_OK; k++) {
    int to = (me + k) % np, from = (me - k + np) % np;
    status =
        loom_mpi_post_p2p(r, 0, f->recv + (size_t)from * f->bsize, b, LOOM_U8, from, tag, f->p2p);
    if (status == LOOM_OK) {
      status = loom_mpi_post_p2p(r, 1, all_to_all ? send + (size_t)to * f->bsize : send, b, LOOM_U8,
                                 to, tag, f->p2p);
    }
  }
  return status;
}

static void flat_release(loom_request_t *r) {
  flat_t *f = r->state;
  if (f) {
    free(f->off);
    free(f);
  }
  r->state = NULL;
}

// Decode every block of recv (np payloads of the same n values, or the np shards) into out, then
// copy to x: a corrupt block leaves x as it was.
static loom_status_t flat_finish(loom_request_t *r) {
  flat_t *f = r->state;
  const int np = loom_group_size(f->g);
  loom_status_t status = LOOM_OK;
  memset(f->out, 0, (size_t)f->n * sizeof(float));
  for (int i = 0; i < np && status == LOOM_OK; i++) {
    if (f->divisible) {
      status = decode_block(f->c, f->recv + (size_t)i * f->bsize, f->bsize,
                            f->off[i + 1] - f->off[i], shard_seed(f->seed, i), f->out + f->off[i]);
    } else {
      status = decode_block(f->c, f->recv + (size_t)i * f->bsize, f->bsize, f->n, f->seed, f->out);
    }
  }
  if (status == LOOM_OK && f->n > 0) {
    for (int64_t i = 0; i < f->n; i++) {
      f->x[i] = f->avg ? f->out[i] / (float)np : f->out[i];
    }
  }
  return status;
}

// Divisible, after the alltoall: sum this rank's shard in rank order, re-encode it, allgather.
static loom_status_t flat_middle(loom_request_t *r) {
  flat_t *f = r->state;
  const int np = loom_group_size(f->g), me = loom_group_rank(f->g);
  const int64_t my_n = f->off[me + 1] - f->off[me];
  loom_status_t status = LOOM_OK;
  memset(f->acc, 0, (size_t)my_n * sizeof(float));
  for (int i = 0; i < np && status == LOOM_OK; i++) {
    status = decode_block(f->c, f->recv + (size_t)i * f->bsize, f->bsize, my_n,
                          shard_seed(f->seed, me), f->acc);
  }
  if (status == LOOM_OK) {
    status =
        encode_block(f->c, NULL, NULL, f->acc, my_n, shard_seed(f->seed, me), f->mine, f->bsize);
  }
  if (status == LOOM_OK) {
    status = flat_exchange(r, f, f->mine, 0, f->tag + 1);
    r->step = flat_finish;
  }
  return status;
}

// Buffers of a flat scheme for n values on np ranks: from the group's state (blocking calls) or
// owned by the request (non-blocking ones: several may be in flight on one group).
static loom_status_t flat_buffers(loom_request_t *r, flat_t *f, int own) {
  const int np = loom_group_size(f->g);
  const int64_t widest = f->divisible ? f->n / np + (f->n % np > 0) : 0;
  const size_t all = f->bsize * (size_t)np, sb = f->divisible ? all : f->bsize;
  const size_t fb = (size_t)(f->n + widest + 1) * sizeof(float);
  void *p[4] = {NULL, NULL, NULL, NULL};
  if (own) {
    for (int i = 0; i < 4; i++) {
      size_t want = i == 0 ? sb : i == 1 ? all : i == 2 ? f->bsize : fb;
      loom_status_t status = loom_request_tmp(r, want, &p[i]);
      if (status != LOOM_OK) {
        return status;
      }
    }
  } else {
    comm_state_t *st = get_state(f->g);
    if (!st) {
      return LOOM_ERR_NOMEM;
    }
    p[0] = scratch(st, BUF_SEND, sb);
    p[1] = scratch(st, BUF_RECV, all);
    p[2] = scratch(st, BUF_MINE, f->bsize);
    p[3] = scratch(st, BUF_FLOATS, fb);
    if (!p[0] || !p[1] || !p[2] || !p[3]) {
      return loom_error(NULL, LOOM_ERR_NOMEM,
                        "compressed allreduce (%s): cannot allocate %zu bytes of payload buffers",
                        f->c->name, sb + all + f->bsize + fb);
    }
  }
  f->send = p[0];
  f->recv = p[1];
  f->mine = p[2];
  f->out = p[3];
  f->acc = f->out + f->n;
  return LOOM_OK;
}

// Encode this rank's tensor (with error feedback on res when non-NULL) and post the first
// exchange on r. *sent grows by the bytes this rank will send.
static loom_status_t flat_start(loom_request_t *r, const loom_group_t *g,
                                const loom_compressor_t *c, float *res, float *x, int64_t n,
                                uint64_t seed, int divisible, int avg, int own, size_t *sent) {
  const int np = loom_group_size(g);
  flat_t *f = calloc(1, sizeof *f);
  if (!f) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "compressed allreduce: out of memory");
  }
  *f = (flat_t){.g = g, .c = c, .x = x, .n = n, .seed = seed, .divisible = divisible, .avg = avg};
  r->state = f;
  r->release = flat_release;
  loom_status_t status = LOOM_OK;
  float *y = NULL; // error-feedback scratch: the widest shard, or the tensor
  if (divisible) {
    const int64_t base = n / np, extra = n % np;
    f->bsize = block_bytes(c, base + (extra > 0));
    f->off = malloc(sizeof(int64_t) * (size_t)(np + 1));
    if (!f->off) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "compressed allreduce: out of memory");
    }
    f->off[0] = 0;
    for (int i = 0; i < np; i++) {
      f->off[i + 1] = f->off[i] + base + (i < extra);
    }
  } else {
    f->bsize = block_bytes(c, n);
  }
  LOOM_CHECK(loom_mpi_collective_tags(g, &f->p2p, &f->tag));
  LOOM_CHECK(flat_buffers(r, f, own));
  y = f->out; // free until the end: holds x + residual while encoding
  if (divisible) {
    for (int i = 0; i < np; i++) {
      LOOM_CHECK(encode_block(c, res ? res + f->off[i] : NULL, y, x + f->off[i],
                              f->off[i + 1] - f->off[i], shard_seed(seed, i),
                              f->send + (size_t)i * f->bsize, f->bsize));
    }
    LOOM_CHECK(flat_exchange(r, f, f->send, 1, f->tag));
    r->step = flat_middle;
    *sent += 2 * f->bsize * (size_t)(np - 1);
  } else {
    LOOM_CHECK(encode_block(c, res, y, x, n, seed, f->send, f->bsize));
    LOOM_CHECK(flat_exchange(r, f, f->send, 0, f->tag));
    r->step = flat_finish;
    *sent += f->bsize * (size_t)(np - 1);
  }
fail:
  return status;
}

// Blocking flat scheme with the group's buffers.
static loom_status_t flat(const loom_group_t *g, const loom_compressor_t *c, float *res, float *x,
                          int64_t n, uint64_t seed, int divisible, int avg, size_t *sent) {
  loom_request_t *r = loom_request_new("loom_compressed_allreduce");
  if (!r) {
    return LOOM_ERR_NOMEM;
  }
  loom_status_t status = flat_start(r, g, c, res, x, n, seed, divisible, avg, 0, sent);
  if (status != LOOM_OK) {
    loom_request_free(r);
    return status;
  }
  loom_request_started(r);
  return loom_wait(&r);
}

// ---------------------------------------------------------------------------------------------
// Hierarchical: the node and node-leader sub-groups of g, created on first use.

static loom_status_t get_hier(const loom_group_t *cg, comm_state_t **out) {
  const struct loom_group *g = cg;
  loom_status_t status = LOOM_OK;
  comm_state_t *st = get_state(g);
  MPI_Comm node = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  if (!st) {
    return LOOM_ERR_NOMEM;
  }
  if (st->have_hier) {
    *out = st;
    return LOOM_OK;
  }
  st->node.comm = st->leaders.comm = MPI_COMM_NULL;
  LOOM_CHECK_MPI(NULL, MPI_Comm_split(g->comm, g->node, g->rank, &node));
  LOOM_CHECK(loom_group_from_comm(NULL, &st->node, g->kind, node, g->node));
  node = MPI_COMM_NULL;
  LOOM_CHECK_MPI(
      NULL, MPI_Comm_split(g->comm, st->node.rank == 0 ? 0 : MPI_UNDEFINED, g->rank, &leaders));
  LOOM_CHECK(loom_group_from_comm(NULL, &st->leaders, g->kind, leaders, g->node));
  st->have_hier = 1;
  *out = st;
  return LOOM_OK;
fail:
  if (node != MPI_COMM_NULL) {
    MPI_Comm_free(&node);
  }
  free_group(&st->node);
  st->node = (struct loom_group){.comm = MPI_COMM_NULL};
  return status;
}

static loom_status_t hierarchical(const loom_group_t *g, const loom_compressor_t *c, float *res,
                                  loom_tensor_t *t, int64_t n, uint64_t seed, size_t *sent) {
  loom_status_t status = LOOM_OK;
  comm_state_t *h = NULL;
  LOOM_CHECK(get_hier(g, &h));
  if (h->node.size > 1) {
    LOOM_CHECK(loom_allreduce(&h->node, t, t, LOOM_SUM));
    *sent += (size_t)n * sizeof(float) * 2 * (size_t)(h->node.size - 1) / (size_t)h->node.size;
  }
  if (h->node.rank == 0) {
    LOOM_CHECK(flat(&h->leaders, c, res, t->data, n, seed, 0, 0, sent));
  }
  if (h->node.size > 1) {
    LOOM_CHECK(loom_broadcast(&h->node, t, 0));
  }
fail:
  return status;
}

// ---------------------------------------------------------------------------------------------

// Checks shared by the blocking and non-blocking entry points; *res is the residual of t (or
// NULL without error feedback).
static loom_status_t prepare(const char *name, const loom_group_t *g, const loom_compressor_t *c,
                             loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
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
  if (t->dtype != LOOM_F32 || t->device != LOOM_DEVICE_HOST) {
    return loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                      "%s: tensor '%s' is %s on device %d: compressed collectives take f32 host "
                      "tensors (allreduce others with loom_allreduce)",
                      name, t->name, loom_dtype_name(t->dtype), t->device);
  }
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

// The schemes that run to completion inside the call: hierarchical and PowerSGD.
static loom_status_t run_blocking(const loom_group_t *g, const loom_compressor_t *c,
                                  loom_scheme_t scheme, loom_ef_t *ef, float *res, loom_tensor_t *t,
                                  loom_redop_t op, uint64_t seed, size_t *sent) {
  loom_status_t status = LOOM_OK;
  const int64_t n = loom_tensor_numel(t);
  if (c->kind == LOOM_CODEC_POWERSGD) {
    LOOM_CHECK(loom_powersgd_allreduce(g, c, ef, t, sent));
  } else if (scheme == LOOM_SCHEME_HIERARCHICAL) {
    LOOM_CHECK(hierarchical(g, c, res, t, n, seed, sent));
  } else {
    LOOM_CHECK(flat(g, c, res, t->data, n, seed, scheme == LOOM_SCHEME_DIVISIBLE, 0, sent));
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

loom_status_t loom_compressed_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                        loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                        loom_redop_t op, uint64_t seed, size_t *bytes_sent) {
  static const char name[] = "loom_compressed_allreduce";
  size_t sent = 0;
  float *res = NULL;
  loom_status_t status = prepare(name, g, c, scheme, ef, t, op, &res);
  if (status == LOOM_OK) {
    status = run_blocking(g, c, scheme, ef, res, t, op, seed, &sent);
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
    return loom_error(NULL, LOOM_ERR_INVALID_ARG, "%s: req is NULL", name);
  }
  *req = NULL;
  loom_status_t status = prepare(name, g, c, scheme, ef, t, op, &res);
  if (status == LOOM_OK && (c->kind == LOOM_CODEC_POWERSGD || scheme == LOOM_SCHEME_HIERARCHICAL)) {
    status = run_blocking(g, c, scheme, ef, res, t, op, seed, &sent);
  } else if (status == LOOM_OK) {
    r = loom_request_new(name);
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
