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

static loom_status_t exchange(const loom_group_t *g, int gather, uint8_t *send, size_t send_bytes,
                              uint8_t *recv, size_t recv_bytes) {
  loom_status_t status = LOOM_OK;
  loom_tensor_t s, r;
  int64_t ns = (int64_t)send_bytes, nr = (int64_t)recv_bytes;
  LOOM_CHECK(loom_tensor_wrap(&s, send, LOOM_U8, LOOM_DEVICE_HOST, 1, &ns, "compressed payloads"));
  LOOM_CHECK(loom_tensor_wrap(&r, recv, LOOM_U8, LOOM_DEVICE_HOST, 1, &nr, "compressed payloads"));
  LOOM_CHECK(gather ? loom_allgather(g, &s, &r) : loom_alltoall(g, &s, &r));
fail:
  return status;
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
  loom_status_t status;
  const float *src = x;
  if (res) {
    for (int64_t i = 0; i < n; i++) {
      y[i] = x[i] + res[i];
    }
    src = y;
  }
  status = loom_codec_encode(c, src, n, seed, block + LEN_BYTES, bsize - LEN_BYTES, &len);
  if (status != LOOM_OK) {
    return status;
  }
  uint64_t len64 = len;
  memcpy(block, &len64, LEN_BYTES);
  memset(block + LEN_BYTES + len, 0, bsize - LEN_BYTES - len);
  if (res) {
    memset(res, 0, (size_t)n * sizeof(float));
    status = loom_codec_decode_add(c, block + LEN_BYTES, len, n, seed, res);
    for (int64_t i = 0; i < n && status == LOOM_OK; i++) {
      float r = y[i] - res[i];
      res[i] = isfinite(r) ? r : 0.0f; // non-finite: drop it, do not carry it forward
    }
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
// Indivisible: allgather of whole payloads, decode and sum in rank order.

static loom_status_t indivisible(const loom_group_t *g, const loom_compressor_t *c, float *res,
                                 float *x, int64_t n, uint64_t seed, size_t *sent) {
  loom_status_t status = LOOM_OK;
  const int np = loom_group_size(g);
  const size_t bsize = block_bytes(c, n);
  comm_state_t *st = get_state(g);
  if (!st) {
    return LOOM_ERR_NOMEM;
  }
  uint8_t *send = scratch(st, BUF_SEND, bsize), *recv = scratch(st, BUF_RECV, bsize * (size_t)np);
  float *tmp = scratch(st, BUF_FLOATS, (size_t)(n > 0 ? n : 1) * sizeof(float) * 2);
  if (!send || !recv || !tmp) {
    status = loom_error(NULL, LOOM_ERR_NOMEM,
                        "compressed allreduce (%s): cannot allocate %zu bytes of payload buffers",
                        c->name, bsize * (size_t)(np + 1));
    goto fail;
  }
  float *acc = tmp, *y = tmp + (n > 0 ? n : 1);
  LOOM_CHECK(encode_block(c, res, y, x, n, seed, send, bsize));
  LOOM_CHECK(exchange(g, 1, send, bsize, recv, bsize * (size_t)np));
  memset(acc, 0, (size_t)n * sizeof(float));
  for (int r = 0; r < np; r++) {
    LOOM_CHECK(decode_block(c, recv + (size_t)r * bsize, bsize, n, seed, acc));
  }
  if (n > 0) {
    memcpy(x, acc, (size_t)n * sizeof(float));
  }
  *sent += bsize * (size_t)(np - 1);
fail:
  return status;
}

// ---------------------------------------------------------------------------------------------
// Divisible: shard i goes to rank i (alltoall), rank i decodes and sums its shard in rank order
// and re-encodes the sum, and an allgather brings every summed shard to every rank.

static loom_status_t divisible(const loom_group_t *g, const loom_compressor_t *c, float *res,
                               float *x, int64_t n, uint64_t seed, size_t *sent) {
  loom_status_t status = LOOM_OK;
  const int np = loom_group_size(g), me = loom_group_rank(g);
  const int64_t base = n / np, extra = n % np, widest = base + (extra > 0);
  const size_t bsize = block_bytes(c, widest), all = bsize * (size_t)np;
  comm_state_t *st = get_state(g);
  if (!st) {
    return LOOM_ERR_NOMEM;
  }
  uint8_t *send = scratch(st, BUF_SEND, all), *recv = scratch(st, BUF_RECV, all),
          *mine = scratch(st, BUF_MINE, bsize);
  // acc: this rank's summed shard, y: error-feedback scratch, out: the result, written to x
  // only once every block decoded cleanly.
  float *tmp = scratch(st, BUF_FLOATS, (size_t)(2 * widest + n + 1) * sizeof(float));
  int64_t *off = malloc(sizeof(int64_t) * (size_t)(np + 1));
  if (!send || !recv || !mine || !tmp || !off) {
    status = loom_error(NULL, LOOM_ERR_NOMEM,
                        "compressed allreduce (%s): cannot allocate %zu bytes of payload buffers",
                        c->name, 2 * all + bsize);
    goto fail;
  }
  float *acc = tmp, *y = tmp + widest, *out = tmp + 2 * widest;
  off[0] = 0;
  for (int i = 0; i < np; i++) {
    off[i + 1] = off[i] + base + (i < extra);
  }
  for (int i = 0; i < np; i++) {
    LOOM_CHECK(encode_block(c, res ? res + off[i] : NULL, y, x + off[i], off[i + 1] - off[i],
                            shard_seed(seed, i), send + (size_t)i * bsize, bsize));
  }
  LOOM_CHECK(exchange(g, 0, send, all, recv, all));
  const int64_t my_n = off[me + 1] - off[me];
  memset(acc, 0, (size_t)my_n * sizeof(float));
  for (int r = 0; r < np; r++) {
    LOOM_CHECK(decode_block(c, recv + (size_t)r * bsize, bsize, my_n, shard_seed(seed, me), acc));
  }
  LOOM_CHECK(encode_block(c, NULL, NULL, acc, my_n, shard_seed(seed, me), mine, bsize));
  LOOM_CHECK(exchange(g, 1, mine, bsize, recv, all));
  memset(out, 0, (size_t)n * sizeof(float));
  for (int i = 0; i < np; i++) {
    LOOM_CHECK(decode_block(c, recv + (size_t)i * bsize, bsize, off[i + 1] - off[i],
                            shard_seed(seed, i), out + off[i]));
  }
  if (n > 0) {
    memcpy(x, out, (size_t)n * sizeof(float));
  }
  *sent += 2 * bsize * (size_t)(np - 1);
fail:
  free(off);
  return status;
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
    LOOM_CHECK(indivisible(&h->leaders, c, res, t->data, n, seed, sent));
  }
  if (h->node.size > 1) {
    LOOM_CHECK(loom_broadcast(&h->node, t, 0));
  }
fail:
  return status;
}

// ---------------------------------------------------------------------------------------------

loom_status_t loom_compressed_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                        loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                        loom_redop_t op, uint64_t seed, size_t *bytes_sent) {
  static const char name[] = "loom_compressed_allreduce";
  loom_status_t status = LOOM_OK;
  size_t sent = 0;
  float *res = NULL;
  if (bytes_sent) {
    *bytes_sent = 0;
  }
  LOOM_CHECK(loom_comm_check_group(name, g));
  if (!c || !t || (int)scheme < 0 || scheme >= LOOM_SCHEME_COUNT ||
      (op != LOOM_SUM && op != LOOM_AVG)) {
    status =
        loom_error(NULL, LOOM_ERR_INVALID_ARG,
                   "%s: compressor %s, tensor %s, scheme %d, op %s: pass a compressor, a "
                   "tensor, a loom_scheme_t and LOOM_SUM or LOOM_AVG",
                   name, c ? "set" : "NULL", t ? "set" : "NULL", (int)scheme, loom_redop_name(op));
    goto fail;
  }
  if (t->dtype != LOOM_F32 || t->device != LOOM_DEVICE_HOST) {
    status = loom_error(NULL, LOOM_ERR_UNSUPPORTED,
                        "%s: tensor '%s' is %s on device %d: compressed collectives take f32 host "
                        "tensors (allreduce others with loom_allreduce)",
                        name, t->name, loom_dtype_name(t->dtype), t->device);
    goto fail;
  }
  const int64_t n = loom_tensor_numel(t);
  if (ef && (!t->name[0])) {
    status = loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "%s: error feedback is keyed by tensor name: set the tensor's name", name);
    goto fail;
  }
  if (c->kind == LOOM_CODEC_POWERSGD) {
    LOOM_CHECK(loom_powersgd_allreduce(g, c, ef, t, &sent));
  } else if (ef) {
    LOOM_CHECK(loom_ef_residual(ef, t->name, n, &res));
  }
  if (c->kind == LOOM_CODEC_POWERSGD) {
    // done above
  } else if (scheme == LOOM_SCHEME_INDIVISIBLE) {
    LOOM_CHECK(indivisible(g, c, res, t->data, n, seed, &sent));
  } else if (scheme == LOOM_SCHEME_DIVISIBLE) {
    LOOM_CHECK(divisible(g, c, res, t->data, n, seed, &sent));
  } else {
    LOOM_CHECK(hierarchical(g, c, res, t, n, seed, &sent));
  }
  if (op == LOOM_AVG) {
    float *x = t->data;
    const float np = (float)loom_group_size(g);
    for (int64_t i = 0; i < n; i++) {
      x[i] /= np;
    }
  }
  if (bytes_sent) {
    *bytes_sent = sent;
  }
fail:
  return status;
}
