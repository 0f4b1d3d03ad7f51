/* compress_internal.h — what the compression files share: the compressor behind
 * loom_compressor_t, the payload header, and the codec entry points of compress_codecs.c. */
#ifndef LOOM_COMPRESS_INTERNAL_H
#define LOOM_COMPRESS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "loom_compress.h"

#ifdef __cplusplus
extern "C" { // the CUDA codecs (comm/cuda/codecs_cuda.cu) call the host helpers below
#endif

typedef enum loom_codec_kind {
  LOOM_CODEC_NONE = 1,
  LOOM_CODEC_FP16,
  LOOM_CODEC_BF16,
  LOOM_CODEC_INT8,
  LOOM_CODEC_TOPK,
  LOOM_CODEC_RANDOMK,
  LOOM_CODEC_EFSIGN,
  LOOM_CODEC_POWERSGD,
} loom_codec_kind_t;

struct loom_compressor {
  loom_codec_kind_t kind;
  double ratio;   // topk, randomk: fraction of values kept, in (0, 1]
  int rank;       // powersgd: rank of the approximation, >= 1
  int stochastic; // int8: stochastic rounding
  char name[32];  // canonical spec
};

// Every payload opens with this header (host byte order: the ranks of a job share one ABI).
// flags bit 0: the input held a NaN or an infinity; the payload is the header alone and decodes
// to NaN everywhere (for codecs with a scale or a selection, which cannot carry them).
#define LOOM_PAYLOAD_MAGIC     0x4c4du // "ML"
#define LOOM_PAYLOAD_VERSION   1u
#define LOOM_PAYLOAD_NONFINITE 1u
typedef struct loom_payload_header {
  uint16_t magic;
  uint8_t kind;    // loom_codec_kind_t
  uint8_t version; // LOOM_PAYLOAD_VERSION
  uint32_t flags;
  uint64_t n; // element count of the encoded vector
} loom_payload_header_t;
#define LOOM_PAYLOAD_HEADER ((size_t)sizeof(loom_payload_header_t)) // 16

// Values kept by topk and randomk for n values: ceil(ratio * n), at least 1 when n > 0.
int64_t loom_codec_keep(const loom_compressor_t *c, int64_t n);
size_t loom_codec_max_bytes(const loom_compressor_t *c, int64_t n);
// The codecs; arguments already checked by the public wrappers (c is not powersgd, x/acc hold
// n values, payload holds cap or bytes bytes).
loom_status_t loom_codec_encode(const loom_compressor_t *c, const float *x, int64_t n,
                                uint64_t seed, uint8_t *payload, size_t cap, size_t *bytes);
loom_status_t loom_codec_decode_add(const loom_compressor_t *c, const uint8_t *payload,
                                    size_t bytes, int64_t n, uint64_t seed, float *acc);

// Encode with error feedback on res (n floats; NULL: plain encode): y = x + res (y is n floats
// of scratch, apart from x and res); payload = encode(y); res = y - decode(payload), non-finite
// entries dropped. On an error (the encode's, or the decode's: randomk out of memory) res is
// unchanged.
loom_status_t loom_ef_encode(const loom_compressor_t *c, float *res, float *y, const float *x,
                             int64_t n, uint64_t seed, uint8_t *payload, size_t cap, size_t *bytes);

// The checks of a received payload of bytes bytes for n values, shared by the CPU and CUDA
// decoders: the header (its first 16 bytes at p: magic, version, compressor, count, flags) and
// the total size; then, for int8 and efsign, the f32 scale at body (finite, >= 0; int8: 127 times
// it finite too). Each failure is LOOM_ERR_CORRUPT naming what is wrong. *flags receives the
// header's flags.
loom_status_t loom_codec_check_header(const loom_compressor_t *c, const uint8_t *p, size_t bytes,
                                      int64_t n, uint32_t *flags);
loom_status_t loom_codec_check_scale(const loom_compressor_t *c, const uint8_t *body, float *scale);

// The k indices randomk keeps of n values for seed, ascending (Floyd's sampling; the CUDA codec
// calls it too, so that both pick the same values). LOOM_ERR_NOMEM when the bitmap fails.
loom_status_t loom_codec_random_indices(int64_t n, int64_t k, uint64_t seed, uint32_t *out);

// A 64-bit mix (splitmix64's finaliser): random streams and per-shard seeds.
uint64_t loom_mix64(uint64_t x);

// PowerSGD (compress_powersgd.c): t = the sum over ranks of the rank-r approximations, in place
// on g. The warm-started Q is kept per tensor name in ef's side table, the residual in ef as for
// the other compressors; ef is required (PowerSGD without error feedback does not converge).
// *sent grows by the bytes this rank sent.
loom_status_t loom_powersgd_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                      loom_ef_t *ef, loom_tensor_t *t, size_t *sent);
// Side state of a named tensor kept by the error-feedback table (PowerSGD's Q): n floats,
// zero when new; a different n reallocates (and zeroes).
loom_status_t loom_ef_side(loom_ef_t *ef, const char *name, int64_t n, float **out, int *fresh);

// What the host and device forms of PowerSGD share (compress_powersgd.c), so that both take the
// same matrix view, rank, warm start, orthonormalisation and byte count.
typedef struct loom_powersgd_dims {
  int64_t n;          // values of the tensor
  int64_t rows, cols; // its matrix view M (rows x cols >= n, row-major, the tail zero-padded)
  int r;              // rank of the approximation: min(c->rank, rows, cols); 0 when n == 0
} loom_powersgd_dims_t;
// The checks (ef is required, and the view's sides fit the BLAS's int: LOOM_ERR_INVALID_ARG
// otherwise) and the matrix view of t.
loom_status_t loom_powersgd_setup(const loom_compressor_t *c, const loom_ef_t *ef,
                                  const loom_tensor_t *t, loom_powersgd_dims_t *d);
// Modified Gram-Schmidt in double on the r columns of p (rows x r, row-major, host memory); a
// column that vanishes becomes zero. Deterministic: every rank gets the same bits.
void loom_powersgd_orthonormalise(float *p, int64_t rows, int r);
// The warm start of name: *q is its Q in ef's side table (cols x r, host memory; a fixed random
// start on every rank when new, else the last step's summed Q), orthonormalised in place. A Q
// with a non-finite value, and a column that vanished, start again from the fixed start.
loom_status_t loom_powersgd_warm_q(loom_ef_t *ef, const char *name, const loom_powersgd_dims_t *d,
                                   float **q);
// Bytes one rank sends for the two allreduces (P and Q) on np ranks.
size_t loom_powersgd_sent(const loom_powersgd_dims_t *d, int np);

// ---- what the flat schemes share with their device form (compress_coll.c, compress_coll_nccl.c)
//
// A payload travels in a fixed-size block: an 8-byte length, the payload, zero padding up to the
// block size; a length of all ones marks a part its sender could not encode.
#define LOOM_BLOCK_LEN_BYTES 8
#define LOOM_BLOCK_FAILED    UINT64_MAX
// Bytes of one block for payloads of up to n values (a multiple of 8).
size_t loom_compress_block_bytes(const loom_compressor_t *c, int64_t n);
// Values per pipelined chunk of an n-value tensor on g (LOOM_COMPRESS_CHUNK; top-k never cut).
int64_t loom_compress_chunk_values(const loom_group_t *g, const loom_compressor_t *c, int64_t n);
// Seed of shard i of a chunk encoded with seed (every rank derives the same one).
uint64_t loom_compress_shard_seed(uint64_t seed, int i);
// The seed that the encode by group rank rank of a chunk or shard of seed passes to the encoder
// (sum 0: its own values; 1: the owner's re-encode of its summed shard, divisible). int8:sr's
// random stream is salted by both, so that the ranks' rounding errors cancel and the re-encode
// rounds independently of the first encode: the summed result is unbiased. Every other codec
// gets seed as is (randomk: every rank must pick the same indices). Decoders take the unsalted
// seed (int8's ignores it), so every rank decodes every payload alike.
uint64_t loom_compress_encode_seed(const loom_compressor_t *c, uint64_t seed, int rank, int sum);
// Shard i of len values cut into np nearly equal parts: [*lo, *lo + *cnt).
void loom_compress_shard_range(int64_t len, int np, int i, int64_t *lo, int64_t *cnt);
// The hierarchical scheme's sub-groups of g (created on first use, collective over g, kept in
// g): *node, this rank's node; *leaders, the node leaders (node rank 0), usable on those only.
// The end of a hierarchical compressed allreduce, on every rank of the node: the leader's status
// (its part between the nodes) broadcast first, then, when it succeeded, the result in t (host
// or device). Every rank of the node returns the leader's status.
loom_status_t loom_compress_hier_finish(const loom_group_t *node, loom_status_t leader,
                                        loom_tensor_t *t);

// ---- the host schemes on a host copy of a device tensor (compress_coll.c, compress_staged.c) -
//
// The staged form takes what every rank must do in the order of its calls at the call (checks,
// the watchdog's record and consistency check, the tags, the buffers) and the codec work once the
// copy of the tensor has landed on the host. t is the host tensor (the stage's host memory, with
// the device tensor's name and shape).
struct loom_watch; // comm_internal.h
// The checks of the host path, and this rank's entry into the operation (w); *res is t's residual
// in ef's host table (NULL without error feedback, and for powersgd).
loom_status_t loom_compress_host_enter(const char *name, const loom_group_t *g,
                                       const loom_compressor_t *c, loom_scheme_t scheme,
                                       loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
                                       uint64_t seed, float **res, struct loom_watch *w);
// 1 when c and scheme run as a staged request on the host (the flat schemes of payload codecs);
// 0 when they run to completion inside the call (hierarchical, powersgd).
int loom_compress_host_flat(const loom_compressor_t *c, loom_scheme_t scheme);
// The scheme to completion on t (op applied), as loom_compressed_allreduce on a host tensor.
loom_status_t loom_compress_host_run(const loom_group_t *g, const loom_compressor_t *c,
                                     loom_scheme_t scheme, loom_ef_t *ef, float *res,
                                     loom_tensor_t *t, loom_redop_t op, uint64_t seed, size_t *sent,
                                     const struct loom_watch *w);
// A flat scheme on r (its watch set): state, tags and buffers now (*sent grows by the bytes this
// rank will send), and r->step set to the hook that encodes t's first chunks and posts the first
// exchange; the caller gates that step (r->ready) until t holds the tensor, then lists r.
loom_status_t loom_compress_flat_deferred(loom_request_t *r, const loom_group_t *g,
                                          const loom_compressor_t *c, loom_scheme_t scheme,
                                          float *res, loom_tensor_t *t, loom_redop_t op,
                                          uint64_t seed, size_t *sent);
// Mark r, a request from loom_compress_flat_deferred, failed with status (not LOOM_OK) before its
// first step: the tensor was never copied to the host. It still runs every exchange, sending
// failed blocks in place of this rank's payloads (its peers fail with LOOM_ERR_CORRUPT instead of
// waiting for them), touches neither t nor the residual, and completes with status.
void loom_compress_flat_poison(loom_request_t *r, loom_status_t status);
// Test hook: the next n copies into the stage s fail as a failed CUDA copy would (LOOM_ERR_CUDA),
// on a host stage too.
void loom_host_stage_fail_copies(loom_host_stage_t *s, int n);

// ---- error feedback of CUDA tensors (compress_coll_nccl.c) ------------------------------------
//
// Residuals of device tensors live in device memory, in a table of their own that the device code
// hangs on the loom_ef_t (the host table hands out host pointers through loom_ef_entry). The
// host table calls back into it: destroy from loom_ef_destroy; mirror from loom_ef_count and
// loom_ef_entry (copy every device residual written since its last copy into the host table, so
// that a checkpoint sees it); forget from loom_ef_set (drop the device residual of that name:
// its next device use starts from the host value just set).
typedef struct loom_ef_device_ops {
  void (*destroy)(void *dev);
  void (*mirror)(loom_ef_t *ef, void *dev);
  void (*forget)(void *dev, const char *name);
} loom_ef_device_ops_t;
// The slot holding ef's device table (NULL until the first device use); ops are kept with it.
void **loom_ef_device_slot(loom_ef_t *ef, const loom_ef_device_ops_t *ops);
// The host residual of name when it has n values (the device residual's first value), or NULL.
const float *loom_ef_host_residual(const loom_ef_t *ef, const char *name, int64_t n);
// The host residual of name with n values, created or resized (zeroed) when needed, for the
// mirror to copy into; unlike loom_ef_set it keeps the device residual.
loom_status_t loom_ef_host_slot(loom_ef_t *ef, const char *name, int64_t n, float **data);

#ifdef LOOM_HAVE_NCCL
struct loom_watch; // comm_internal.h

// The device table's parts that PowerSGD's device form (compress_powersgd_nccl.c) uses, kept by
// compress_coll_nccl.c. loom_cuda_ef_residual: the device residual of name (n floats on device,
// made current by the caller), found or created as the flat schemes' are (from the host table's
// value of that name and length, else zeros); *data is its memory. After writing it on the
// current stream, loom_cuda_ef_written records that (the next loom_ef_count/loom_ef_entry copies
// it to the host table). r stays valid until the next loom_cuda_ef_residual or loom_ef_set.
typedef struct loom_dev_res loom_dev_res_t;
loom_status_t loom_cuda_ef_residual(loom_ef_t *ef, const char *name, int64_t n, int device,
                                    loom_dev_res_t **r, float **data);
loom_status_t loom_cuda_ef_written(loom_dev_res_t *r);
// One codec workspace per ef, hung on its device table: *slot is NULL until the codec stores
// something there; destroy (non-NULL) frees it from loom_ef_destroy.
loom_status_t loom_cuda_ef_workspace(loom_ef_t *ef, void (*destroy)(void *), void ***slot);

// PowerSGD on an f32 tensor t on a visible CUDA device (compress_powersgd_nccl.c), checked by the
// caller: loom_powersgd_allreduce's algorithm, errors and byte count, with M, P and Q on the
// device (cuBLAS), the two allreduces on g's NCCL communicator, the orthonormalisations on a host
// copy; op LOOM_AVG divides by g's size at the end. Ordered on the current stream (see the file).
loom_status_t loom_powersgd_allreduce_cuda(const loom_group_t *g, const loom_compressor_t *c,
                                           loom_ef_t *ef, loom_tensor_t *t, loom_redop_t op,
                                           size_t *sent);

// The schemes on an f32 tensor t on a visible CUDA device, checked by the caller (compress_coll.c's
// prepare and enter): for a payload codec, encode, exchange and decode on the device, the
// exchanges on g's NCCL communicator (hierarchical: an NCCL allreduce and broadcast on the node
// group, the indivisible scheme among the node leaders); powersgd ignores the scheme, as on the
// host (loom_powersgd_allreduce_cuda). *sent grows by the bytes this rank sends. Completes in the
// calling thread's current stream's order (see the .c files). w is the operation's watchdog
// (LOOM_TIMEOUT), checked while the host waits for an exchange.
loom_status_t loom_compressed_allreduce_cuda(const loom_group_t *g, const loom_compressor_t *c,
                                             loom_scheme_t scheme, loom_ef_t *ef, loom_tensor_t *t,
                                             loom_redop_t op, uint64_t seed, size_t *sent,
                                             struct loom_watch *w);
#endif

#ifdef __cplusplus
}
#endif

#endif
