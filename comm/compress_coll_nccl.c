/* compress_coll_nccl.c — compressed allreduce of CUDA tensors (flat and hierarchical schemes): the
 * CUDA codecs encode and decode on the device, the payloads travel over NCCL; device residuals. */
#include "config.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"
#include "compress_internal.h"
#include "cuda/codecs_cuda.h"
#include "cuda/cuda_ctx.h"
#include "error.h"
#include "log.h"

// The flat schemes of compress_coll.c, chunk for chunk and block for block (the same chunks,
// seeds, shard seeds, block layout and rank order of the sums), so that a device tensor ends with
// the bits a host tensor with the same values would. Everything runs in the order of the calling
// thread's current stream (loom_cuda_stream: the legacy default stream, or a scheduler lane's):
//
//   encode kernels (current stream) -> event -> NCCL exchange (the group's stream) -> event ->
//   block lengths to the host (waits for the current stream) -> decode kernels (current stream)
//
// The host waits for the current stream where the codecs need values on the host (a block's
// length, a payload header, int8's scale), so one call has a few synchronisations per chunk; the
// chunks run one after the other (no pipelining). The result is written to t in stream order: a
// kernel queued on the current stream after the call sees it. The non-blocking entry point runs
// the same code and returns no request.
//
// As on the host, a rank that meets an error (a corrupt block, a failed encode) keeps taking part
// in every exchange, sends failed blocks, skips the codec work and reports the first error at the
// end with t untouched. An NCCL failure ends the call at once.

#define LEN_BYTES LOOM_BLOCK_LEN_BYTES

// ---- device residuals ---------------------------------------------------------------------------
//
// A table of named residuals in device memory (cudaMalloc: allocated once per name, not on the step
// path), hung on the loom_ef_t (compress_internal.h). A residual starts from the host table's
// value of the same name and length when there is one (a checkpoint restored with loom_ef_set),
// else from zeros; loom_ef_count/loom_ef_entry copy the residuals written since their last copy
// back into the host table (mirror); loom_ef_set drops the device residual of its name (forget).

typedef struct loom_dev_res {
  char *name;
  float *data; // (n) on device
  int64_t n;
  int device;
  int dirty;           // written on the device since the host table last copied it
  cudaEvent_t written; // recorded on the current stream after the last write
} dev_res_t;

typedef struct dev_table {
  dev_res_t *e;
  int count, cap;
  void *workspace; // a codec's (loom_cuda_ef_workspace: PowerSGD's), or NULL
  void (*workspace_destroy)(void *);
} dev_table_t;

static void dev_res_free(dev_res_t *e) {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(e->device);
  if (e->written) {
    cudaEventDestroy(e->written);
  }
  if (e->data) {
    cudaFree(e->data); // waits for the device: every kernel that used it is done
  }
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
  (void)cudaGetLastError(); // at exit the context may be gone: nothing to report
  free(e->name);
}

static void dev_table_destroy(void *p) {
  dev_table_t *t = p;
  for (int i = 0; i < t->count; i++) {
    dev_res_free(&t->e[i]);
  }
  if (t->workspace && t->workspace_destroy) {
    t->workspace_destroy(t->workspace);
  }
  free(t->e);
  free(t);
}

// Copy residual e into the host table (waits for its last write).
static loom_status_t mirror_one(loom_ef_t *ef, dev_res_t *e) {
  loom_status_t status = LOOM_OK;
  float *host = NULL;
  LOOM_CHECK(loom_ef_host_slot(ef, e->name, e->n, &host));
  LOOM_CHECK_CUDA(NULL, cudaSetDevice(e->device));
  LOOM_CHECK_CUDA(NULL, cudaEventSynchronize(e->written));
  if (e->n > 0) {
    LOOM_CHECK_CUDA(
        NULL, cudaMemcpy(host, e->data, (size_t)e->n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  e->dirty = 0;
fail:
  return status;
}

static void dev_table_mirror(loom_ef_t *ef, void *p) {
  dev_table_t *t = p;
  int prev = -1;
  cudaGetDevice(&prev);
  for (int i = 0; i < t->count; i++) {
    loom_status_t status = t->e[i].dirty ? mirror_one(ef, &t->e[i]) : LOOM_OK;
    if (status != LOOM_OK) {
      LOOM_WARN(LOOM_SUB_COMPRESS,
                "error feedback: the device residual of '%s' could not be copied to the host "
                "table (%s): loom_ef_entry shows an older value",
                t->e[i].name, loom_strerror(status));
    }
  }
  if (prev >= 0) {
    cudaSetDevice(prev);
  }
}

static void dev_table_forget(void *p, const char *name) {
  dev_table_t *t = p;
  for (int i = 0; i < t->count; i++) {
    if (strcmp(t->e[i].name, name) == 0) {
      dev_res_free(&t->e[i]);
      t->e[i] = t->e[--t->count];
      return;
    }
  }
}

static const loom_ef_device_ops_t dev_ops = {dev_table_destroy, dev_table_mirror, dev_table_forget};

// ef's device table, created on first use.
static loom_status_t device_table(loom_ef_t *ef, dev_table_t **out) {
  dev_table_t **slot = (dev_table_t **)loom_ef_device_slot(ef, &dev_ops);
  if (!*slot && !(*slot = calloc(1, sizeof **slot))) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "error feedback: cannot allocate the device table");
  }
  *out = *slot;
  return LOOM_OK;
}

// The device residual of name: n floats on device (the current device), found or created.
static loom_status_t device_residual(loom_ef_t *ef, const char *name, int64_t n, int device,
                                     dev_res_t **out) {
  loom_status_t status = LOOM_OK;
  dev_table_t *t = NULL;
  if ((status = device_table(ef, &t)) != LOOM_OK) {
    return status;
  }
  for (int i = 0; i < t->count; i++) {
    dev_res_t *e = &t->e[i];
    if (strcmp(e->name, name) != 0) {
      continue;
    }
    if (e->n != n || e->device != device) {
      return loom_error(NULL, LOOM_ERR_INVALID_ARG,
                        "error feedback: tensor '%s' has %lld elements on CUDA device %d now and "
                        "%lld on device %d before: names must identify one tensor (rename it, or "
                        "loom_ef_set a new residual)",
                        name, (long long)n, device, (long long)e->n, e->device);
    }
    *out = e;
    return LOOM_OK;
  }
  if (t->count == t->cap) {
    const int cap = t->cap ? 2 * t->cap : 16;
    dev_res_t *grown = realloc(t->e, sizeof *grown * (size_t)cap);
    if (!grown) {
      return loom_error(NULL, LOOM_ERR_NOMEM, "error feedback: cannot grow the device table");
    }
    t->e = grown;
    t->cap = cap;
  }
  dev_res_t e = {.name = strdup(name), .n = n, .device = device};
  const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
  const float *host = loom_ef_host_residual(ef, name, n);
  const cudaStream_t stream = loom_cuda_stream();
  if (!e.name) {
    status = loom_error(NULL, LOOM_ERR_NOMEM, "error feedback: out of memory");
    goto fail;
  }
  LOOM_CHECK_CUDA(NULL, cudaMalloc((void **)&e.data, bytes));
  LOOM_CHECK_CUDA(NULL, cudaEventCreateWithFlags(&e.written, cudaEventDisableTiming));
  if (host && n > 0) { // a restored (or host-side) residual: wait, the host table may change
    LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(e.data, host, (size_t)n * sizeof(float),
                                          cudaMemcpyHostToDevice, stream));
    LOOM_CHECK_CUDA(NULL, cudaStreamSynchronize(stream));
  } else {
    LOOM_CHECK_CUDA(NULL, cudaMemsetAsync(e.data, 0, bytes, stream));
  }
  // Written already: the host table gets a copy at its next mirror even if no encode writes it (a
  // rank that is no node leader in the hierarchical scheme keeps a zero residual, as on the host).
  LOOM_CHECK_CUDA(NULL, cudaEventRecord(e.written, stream));
  e.dirty = 1;
  LOOM_INFO(LOOM_SUB_COMPRESS,
            "error feedback: device residual of '%s' (%lld floats on device %d)%s", name,
            (long long)n, device, host ? ", from the host table" : "");
  t->e[t->count] = e;
  *out = &t->e[t->count++];
  return LOOM_OK;
fail:
  dev_res_free(&e);
  return status;
}

loom_status_t loom_cuda_ef_residual(loom_ef_t *ef, const char *name, int64_t n, int device,
                                    loom_dev_res_t **r, float **data) {
  loom_status_t status = device_residual(ef, name, n, device, r);
  *data = status == LOOM_OK ? (*r)->data : NULL;
  return status;
}

loom_status_t loom_cuda_ef_written(loom_dev_res_t *r) {
  r->dirty = 1;
  const cudaError_t rc = cudaEventRecord(r->written, loom_cuda_stream());
  return rc == cudaSuccess
             ? LOOM_OK
             : loom_error(NULL, LOOM_ERR_CUDA,
                          "cudaEventRecord after the residual of '%s' failed: %s (%s)", r->name,
                          cudaGetErrorString(rc), cudaGetErrorName(rc));
}

loom_status_t loom_cuda_ef_workspace(loom_ef_t *ef, void (*destroy)(void *), void ***slot) {
  dev_table_t *t = NULL;
  loom_status_t status = device_table(ef, &t);
  if (status == LOOM_OK) {
    t->workspace_destroy = destroy;
    *slot = &t->workspace;
  }
  return status;
}

// ---- one call -----------------------------------------------------------------------------------

typedef struct dflat {
  const loom_group_t *g;
  const loom_compressor_t *c;
  int np, me, device, divisible;
  float *x;         // (n) device: the tensor, written at the end
  float *res;       // (n) device: its residual, or NULL
  int64_t n, chunk; // values; values per chunk (the last one may be shorter)
  int nchunks;
  uint64_t seed;
  size_t bsize;             // one block: the length word, a payload, padding
  void *scratch;            // the device buffers below, one allocation from the stream-ordered pool
  uint8_t *send;            // np blocks (divisible: shard i for rank i) or one block
  uint8_t *recv;            // np blocks: block j from rank j
  uint8_t *mine;            // divisible: one block, this rank's summed shard re-encoded
  uint8_t *gath;            // divisible: np blocks, every rank's summed shard
  float *out;               // (n) the result before it is written to x
  float *y;                 // (chunk) x + residual while encoding
  float *acc;               // (widest shard) divisible: this rank's shard summed
  uint64_t *lens;           // (np) host: the length words of np received blocks
  struct loom_watch *watch; // the operation's LOOM_TIMEOUT, checked while the host waits
  loom_status_t status;
  char errmsg[256];
} dflat_t;

// Keep the first error and its message.
static void dflat_fail(dflat_t *f, loom_status_t status) {
  if (status != LOOM_OK && f->status == LOOM_OK) {
    f->status = status;
    snprintf(f->errmsg, sizeof f->errmsg, "%s", loom_last_error(NULL));
  }
}

// Encode x[0, n) into block (with error feedback on res when non-NULL: y = x + res; res = y -
// decode): the length word, the payload, zero padding. On failure the block is marked failed.
static loom_status_t encode_block(const dflat_t *f, float *res, const float *x, int64_t n,
                                  uint64_t seed, uint8_t *block) {
  size_t len = 0;
  loom_status_t status = loom_cuda_ef_encode(f->c, res, f->y, x, n, seed, block + LEN_BYTES,
                                             f->bsize - LEN_BYTES, &len);
  const uint64_t len64 = status == LOOM_OK ? (uint64_t)len : LOOM_BLOCK_FAILED;
  loom_status_t put = loom_cuda_put_bytes(block, &len64, LEN_BYTES);
  if (status == LOOM_OK && put == LOOM_OK) {
    put = loom_cuda_zero(block + LEN_BYTES + len, f->bsize - LEN_BYTES - len);
  }
  return status != LOOM_OK ? status : put;
}

// Mark block failed (its receivers fail with CORRUPT).
static void fail_block(uint8_t *block) {
  const uint64_t failed = LOOM_BLOCK_FAILED;
  (void)loom_cuda_put_bytes(block, &failed, LEN_BYTES); // best effort: this rank failed already
}

// The length words of the np blocks at blocks into f->lens (waits for the current stream, hence
// for the exchange that filled them).
// Wait for stream like cudaStreamSynchronize, but polling (20 us apart) so that the watchdog can
// end a wait for a peer that never joins the exchange.
static loom_status_t wait_stream(cudaStream_t stream, struct loom_watch *w) {
  for (;;) {
    cudaError_t rc = cudaStreamQuery(stream);
    if (rc != cudaErrorNotReady) {
      return rc == cudaSuccess ? LOOM_OK
                               : loom_error(NULL, LOOM_ERR_CUDA, "waiting for an exchange: %s",
                                            cudaGetErrorString(rc));
    }
    loom_watch_check(w);
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
  }
}

static loom_status_t read_lengths(dflat_t *f, const uint8_t *blocks) {
  loom_status_t status = LOOM_OK;
  const cudaStream_t stream = loom_cuda_stream();
  // A copy to pageable host memory (f->lens) returns only once it has completed, that is after
  // the exchange queued before it: waited for inside CUDA, a peer that never comes would hang
  // this rank past LOOM_TIMEOUT. Poll for the exchange first, under the watchdog.
  LOOM_CHECK(wait_stream(stream, f->watch));
  if (f->bsize <= (size_t)INT32_MAX) { // one strided copy (a pitch is at most 2^31 - 1)
    LOOM_CHECK_CUDA(NULL, cudaMemcpy2DAsync(f->lens, LEN_BYTES, blocks, f->bsize, LEN_BYTES,
                                            (size_t)f->np, cudaMemcpyDeviceToHost, stream));
  } else {
    for (int i = 0; i < f->np; i++) {
      LOOM_CHECK_CUDA(NULL, cudaMemcpyAsync(&f->lens[i], blocks + (size_t)i * f->bsize, LEN_BYTES,
                                            cudaMemcpyDeviceToHost, stream));
    }
  }
  LOOM_CHECK(wait_stream(stream, f->watch)); // the copies (the stream is idle: at once)
fail:
  return status;
}

// acc[0, n) += decode(block), len its length word (checked against the block, as on the host).
static loom_status_t decode_block(const dflat_t *f, const uint8_t *block, uint64_t len, int64_t n,
                                  uint64_t seed, float *acc) {
  if (len == LOOM_BLOCK_FAILED) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "%s: a peer could not encode its part of this allreduce (its own error "
                      "message says why)",
                      f->c->name);
  }
  if (len > f->bsize - LEN_BYTES) {
    return loom_error(NULL, LOOM_ERR_CORRUPT,
                      "%s: a block claims a %llu-byte payload in %zu bytes: the payload was "
                      "damaged, or ranks disagree on the compressor or the tensor size",
                      f->c->name, (unsigned long long)len, f->bsize - LEN_BYTES);
  }
  return loom_cuda_codec_decode_add(f->c, block + LEN_BYTES, (size_t)len, n, seed, acc);
}

static void chunk_range(const dflat_t *f, int k, int64_t *lo, int64_t *len) {
  *lo = (int64_t)k * f->chunk;
  *len = f->n - *lo < f->chunk ? f->n - *lo : f->chunk;
}

// Decode the np blocks of chunk k (whole payloads, or the np summed shards) into out.
static void decode_chunk(dflat_t *f, int k, const uint8_t *blocks) {
  int64_t lo, len;
  chunk_range(f, k, &lo, &len);
  const uint64_t seed = f->seed + (uint64_t)k;
  if (f->status != LOOM_OK) {
    return;
  }
  dflat_fail(f, read_lengths(f, blocks));
  dflat_fail(f, loom_cuda_zero(f->out + lo, (size_t)len * sizeof(float)));
  for (int i = 0; i < f->np && f->status == LOOM_OK; i++) {
    const uint8_t *b = blocks + (size_t)i * f->bsize;
    if (f->divisible) {
      int64_t slo, cnt;
      loom_compress_shard_range(len, f->np, i, &slo, &cnt);
      dflat_fail(f, decode_block(f, b, f->lens[i], cnt, loom_compress_shard_seed(seed, i),
                                 f->out + lo + slo));
    } else {
      dflat_fail(f, decode_block(f, b, f->lens[i], len, seed, f->out + lo));
    }
  }
}

// Chunk k: encode, exchange A, (divisible: sum this rank's shard, re-encode, exchange B), decode.
// Returns an exchange's failure; codec failures are kept in f and the exchanges go on.
static loom_status_t run_chunk(dflat_t *f, int k) {
  loom_status_t status = LOOM_OK;
  int64_t lo, len;
  chunk_range(f, k, &lo, &len);
  const uint64_t seed = f->seed + (uint64_t)k;
  if (!f->divisible) {
    dflat_fail(f, encode_block(f, f->res ? f->res + lo : NULL, f->x + lo, len,
                               loom_compress_encode_seed(f->c, seed, f->me, 0), f->send));
    LOOM_CHECK(loom_nccl_exchange_blocks("loom_compressed_allreduce", f->g, f->device, f->send,
                                         f->recv, f->bsize, 0));
    decode_chunk(f, k, f->recv);
    return LOOM_OK;
  }
  for (int i = 0; i < f->np; i++) {
    int64_t slo, cnt;
    loom_compress_shard_range(len, f->np, i, &slo, &cnt);
    dflat_fail(f, encode_block(
                      f, f->res ? f->res + lo + slo : NULL, f->x + lo + slo, cnt,
                      loom_compress_encode_seed(f->c, loom_compress_shard_seed(seed, i), f->me, 0),
                      f->send + (size_t)i * f->bsize));
  }
  LOOM_CHECK(loom_nccl_exchange_blocks("loom_compressed_allreduce", f->g, f->device, f->send,
                                       f->recv, f->bsize, 1));
  {
    int64_t mlo, mcnt;
    loom_compress_shard_range(len, f->np, f->me, &mlo, &mcnt);
    const uint64_t mseed = loom_compress_shard_seed(seed, f->me);
    if (f->status == LOOM_OK) {
      dflat_fail(f, read_lengths(f, f->recv));
      dflat_fail(f, loom_cuda_zero(f->acc, (size_t)mcnt * sizeof(float)));
    }
    for (int i = 0; i < f->np && f->status == LOOM_OK; i++) {
      dflat_fail(f,
                 decode_block(f, f->recv + (size_t)i * f->bsize, f->lens[i], mcnt, mseed, f->acc));
    }
    if (f->status == LOOM_OK) {
      dflat_fail(f, encode_block(f, NULL, f->acc, mcnt,
                                 loom_compress_encode_seed(f->c, mseed, f->me, 1), f->mine));
    } else {
      fail_block(f->mine);
    }
  }
  LOOM_CHECK(loom_nccl_exchange_blocks("loom_compressed_allreduce", f->g, f->device, f->mine,
                                       f->gath, f->bsize, 0));
  decode_chunk(f, k, f->gath);
fail:
  return status;
}

// The device buffers of f, sized as compress_coll.c's (blocks of bsize bytes; out, y, acc).
static loom_status_t dflat_buffers(dflat_t *f) {
  loom_status_t status = LOOM_OK;
  const size_t np = (size_t)f->np, bs = f->bsize;
  const int64_t widest = f->divisible ? f->chunk / f->np + (f->chunk % f->np > 0) : 0;
  const size_t nsend = f->divisible ? np : 1, nblocks = nsend + np + (f->divisible ? 1 + np : 0);
  // Every part starts on a 256-byte boundary (blocks are multiples of 8 bytes; floats need 4).
  const size_t a_blocks = (nblocks * bs + 255) & ~(size_t)255;
  const size_t a_out = ((size_t)(f->n > 0 ? f->n : 1) * sizeof(float) + 255) & ~(size_t)255;
  const size_t a_y = ((size_t)f->chunk * sizeof(float) + 255) & ~(size_t)255;
  const size_t a_acc = (size_t)(widest > 0 ? widest : 1) * sizeof(float);
  uint8_t *base = NULL;
  f->lens = calloc(np, sizeof(uint64_t));
  if (!f->lens) {
    return loom_error(NULL, LOOM_ERR_NOMEM, "compressed allreduce: out of memory");
  }
  LOOM_CHECK(loom_cuda_scratch(a_blocks + a_out + a_y + a_acc, &f->scratch));
  base = f->scratch;
  f->send = base;
  f->recv = f->send + nsend * bs;
  f->mine = f->divisible ? f->recv + np * bs : NULL;
  f->gath = f->divisible ? f->mine + bs : NULL;
  f->out = (void *)(base + a_blocks); // device memory: typed through void *
  f->y = (void *)(base + a_blocks + a_out);
  f->acc = (void *)(base + a_blocks + a_out + a_y);
fail:
  return status;
}

// A flat scheme (indivisible or divisible) of t on g.
static loom_status_t flat_cuda(const loom_group_t *g, const loom_compressor_t *c,
                               loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                               loom_redop_t op, uint64_t seed, size_t *sent, struct loom_watch *w) {
  loom_status_t status = LOOM_OK;
  dev_res_t *r = NULL;
  const int np = loom_group_size(g);
  dflat_t f = {.g = g,
               .c = c,
               .np = np,
               .me = loom_group_rank(g),
               .device = t->device,
               .watch = w,
               .divisible = scheme == LOOM_SCHEME_DIVISIBLE,
               .x = t->data,
               .n = loom_tensor_numel(t),
               .seed = seed};
  LOOM_CHECK(loom_cuda_use_device(t->device)); // the kernels and the pool run on t's device
  if (ef) {
    LOOM_CHECK(device_residual(ef, t->name, f.n, t->device, &r));
    f.res = r->data;
  }
  f.chunk = loom_compress_chunk_values(g, c, f.n);
  f.nchunks = f.n > 0 ? (int)((f.n + f.chunk - 1) / f.chunk) : 1;
  f.bsize = loom_compress_block_bytes(c, f.divisible ? f.chunk / np + (f.chunk % np > 0) : f.chunk);
  LOOM_CHECK(dflat_buffers(&f));
  for (int k = 0; k < f.nchunks && status == LOOM_OK; k++) {
    status = run_chunk(&f, k);
  }
  if (r) { // the encodes wrote it, even when a later stage failed (as on the host)
    r->dirty = 1;
    if (cudaEventRecord(r->written, loom_cuda_stream()) != cudaSuccess && status == LOOM_OK) {
      status = loom_error(NULL, LOOM_ERR_CUDA, "cudaEventRecord after the residual of '%s' failed",
                          t->name);
    }
  }
  if (status != LOOM_OK) {
    goto fail;
  }
  if (f.status != LOOM_OK) {
    status = loom_error(NULL, f.status, "%s", f.errmsg);
    goto fail;
  }
  if (op == LOOM_AVG) {
    LOOM_CHECK(loom_cuda_div(f.x, f.out, f.n, (float)np));
  } else {
    LOOM_CHECK(loom_cuda_copy(f.x, f.out, (size_t)f.n * sizeof(float)));
  }
  *sent += f.bsize * (size_t)(np - 1) * (f.divisible ? 2 : 1) * (size_t)f.nchunks;
fail:
  // Freed in the current stream's order: after the decodes and the final copy, which come after
  // the exchanges (loom_nccl_exchange_blocks made the current stream wait for them).
  loom_cuda_scratch_free(f.scratch);
  free(f.lens);
  return status;
}

// ---- the hierarchical scheme --------------------------------------------------------------------
//
// compress_coll.c's hierarchical(), step for step and on the same sub-groups: an NCCL allreduce
// (sum, uncompressed) of t on the node group; the indivisible scheme above among the node leaders
// (node rank 0), with their residuals, watched on the leaders' group; an NCCL broadcast from the
// leader on the node group; LOOM_AVG divides by g's size at the end, as the host does. The node
// steps are loom_allreduce and loom_broadcast, whose waits poll and check the watchdog
// (LOOM_TIMEOUT). Every rank keeps a residual of t's name (zero where it is no leader), as the
// host table does.
//
// Bits: nodes of one or two ranks give the host's bits (a + b is b + a: no order to differ in).
// In a node of three or more, NCCL (ring or tree) adds the node's values in an order of its own,
// MPI's reduction in another, so the node sum may differ from the host's by its rounding (a few
// ulp of the largest partial sum); the leaders then compress what they got, which a codec with
// thresholds (int8's scale, top-k's choice, efsign) can turn into larger differences, still the
// same on every rank of the group (each node takes its leader's result).
static loom_status_t hierarchical(const loom_group_t *g, const loom_compressor_t *c, loom_ef_t *ef,
                                  loom_tensor_t *t, loom_redop_t op, uint64_t seed, size_t *sent,
                                  struct loom_watch *w) {
  loom_status_t status = LOOM_OK;
  const loom_group_t *node = NULL, *leaders = NULL;
  const int64_t n = loom_tensor_numel(t);
  dev_res_t *r = NULL;
  LOOM_CHECK(loom_group_nodes(g, &node, &leaders));
  LOOM_CHECK(loom_cuda_use_device(t->device));
  const int ns = loom_group_size(node), leader = loom_group_rank(node) == 0;
  if (ef && !leader) {
    LOOM_CHECK(device_residual(ef, t->name, n, t->device, &r));
  }
  if (ns > 1) {
    LOOM_CHECK(loom_allreduce(node, t, t, LOOM_SUM));
    *sent += (size_t)n * sizeof(float) * 2 * (size_t)(ns - 1) / (size_t)ns;
  }
  loom_status_t led = LOOM_OK;
  if (leader) {
    struct loom_watch lw; // the leaders' part, watched on their sub-group
    loom_watch_enter(&lw, leaders, &w->d, 1);
    led = flat_cuda(leaders, c, LOOM_SCHEME_INDIVISIBLE, ef, t, LOOM_SUM, seed, sent, &lw);
  }
  LOOM_CHECK(loom_compress_hier_finish(node, led, t));
  if (op == LOOM_AVG) {
    LOOM_CHECK(loom_cuda_div(t->data, t->data, n, (float)loom_group_size(g)));
  }
fail:
  return status;
}

loom_status_t loom_compressed_allreduce_cuda(const loom_group_t *g, const loom_compressor_t *c,
                                             loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                             loom_redop_t op, uint64_t seed, size_t *sent,
                                             struct loom_watch *w) {
  if (c->kind == LOOM_CODEC_POWERSGD) { // its own scheme (compress_powersgd_nccl.c), as on the host
    (void)w; // its two allreduces (loom_allreduce) wait under their own watchdog records
    return loom_powersgd_allreduce_cuda(g, c, ef, t, op, sent);
  }
  if (scheme == LOOM_SCHEME_HIERARCHICAL) {
    return hierarchical(g, c, ef, t, op, seed, sent, w);
  }
  return flat_cuda(g, c, scheme, ef, t, op, seed, sent, w);
}
