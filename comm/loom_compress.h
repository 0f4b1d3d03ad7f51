/* loom_compress.h — gradient compressors (fp16, bf16, int8, top-k, random-k, sign, PowerSGD),
 * per-tensor error feedback, and compressed allreduce schemes. Include loom.h instead. */
#ifndef LOOM_COMPRESS_H
#define LOOM_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "loom_comm.h"
#include "loom_core.h"
#include "loom_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- compressors --------------------------------------------------------------------------------
//
// A compressor is named by a spec string with its parameters in the name:
//   none            f32 as is (the reference: a payload is the raw values)
//   fp16, bf16      round to nearest even, 2 bytes a value; as a cast does, fp16 turns a value
//                   beyond +-65504 (and so a sum of the ranks' values beyond it) into +-Inf,
//                   which the trainers' non-finite guard (LOOM_NONFINITE) then catches: use
//                   bf16 (the f32 range) for gradients that large
//   int8[:sr]       one f32 scale (max |x| / 127) and one signed byte a value; ":sr" rounds
//                   stochastically (unbiased; the random stream comes from the seed, which
//                   decoding ignores). loom_compressed_allreduce salts the seed of each encode
//                   by the group rank and by the stage (a rank's own values, or the divisible
//                   scheme owner's re-encode of a summed shard), so that the ranks' rounding
//                   errors cancel and the summed result is unbiased too
//   topk:RATIO      the k = ceil(RATIO * n) values of largest magnitude, with their indices
//                   (ties go to the lower index), RATIO in (0, 1]
//   randomk:RATIO   k = ceil(RATIO * n) values at indices drawn from the seed: every rank that
//                   passes the same seed picks the same indices, so only the values travel
//                   (topk and randomk index with 32 bits: encode and decode_add refuse more
//                   than 2^32 - 1 values with LOOM_ERR_INVALID_ARG)
//   efsign          one sign bit a value and one f32 scale (the mean magnitude): decodes to
//                   +-scale; meant to run with error feedback
//   powersgd:RANK   rank-RANK approximation M ~ P Q^T of the tensor viewed as a matrix, with a
//                   warm-started Q; not a payload codec: it runs as its own scheme (two
//                   allreduces, of P and of Q) inside loom_compressed_allreduce
//
// Payloads are self-describing (a 16-byte header names the compressor and the element count)
// and decoders treat them as untrusted: a truncated or oversized payload, a header for another
// compressor or another count, an out-of-range or repeated index, or a non-finite scale (int8:
// or one that decodes 127 to infinity) returns LOOM_ERR_CORRUPT before anything is written to
// the output.
typedef struct loom_compressor loom_compressor_t;

// Parse spec; LOOM_ERR_INVALID_ARG names the valid specs when it is not one (logged at WARN).
LOOM_API loom_status_t loom_compressor_create(const char *spec, loom_compressor_t **out);
// Check spec as loom_compressor_create does, creating nothing: LOOM_OK, or LOOM_ERR_INVALID_ARG
// with the same message in loom_last_error(NULL) but not logged, for a program that checks a
// spec its user gave (a flag, a setting) and reports a bad one itself.
LOOM_API loom_status_t loom_compressor_check(const char *spec);
LOOM_API void loom_compressor_destroy(loom_compressor_t *c);
// The canonical spec ("topk:0.01", "int8:sr"), for logs and plans.
LOOM_API const char *loom_compressor_name(const loom_compressor_t *c);
// 1 when payloads of different ranks can be summed without decoding (none, fp16, bf16).
LOOM_API int loom_compressor_summable(const loom_compressor_t *c);
// 1 for powersgd (no payload codec: loom_compressor_encode/decode_add refuse it).
LOOM_API int loom_compressor_lowrank(const loom_compressor_t *c);
// Largest payload, in bytes, for n values (0 for powersgd or n < 0; SIZE_MAX when it would not
// fit in a size_t, which encode and decode_add refuse).
LOOM_API size_t loom_compressor_max_bytes(const loom_compressor_t *c, int64_t n);

// Encode x[0..n) into payload (cap bytes available); *bytes is the size written. seed selects
// the random stream of int8:sr and the indices of randomk (randomk: pass the same seed on every
// rank; int8:sr: encodes with one seed round alike, so pass each encode its own to sum them).
LOOM_API loom_status_t loom_compressor_encode(const loom_compressor_t *c, const float *x, int64_t n,
                                              uint64_t seed, void *payload, size_t cap,
                                              size_t *bytes);
// acc[0..n) += decode(payload). n and seed must be those of the encode. Untrusted payload: see
// above; on an error acc is unchanged.
LOOM_API loom_status_t loom_compressor_decode_add(const loom_compressor_t *c, const void *payload,
                                                  size_t bytes, int64_t n, uint64_t seed,
                                                  float *acc);

// ---- error feedback -----------------------------------------------------------------------------
//
// A residual per tensor name: what compression dropped from the last gradient, added back to
// the next one before it is compressed. Keyed by name, not by bucket, so it survives a change
// of buckets or plan. A checkpoint saves every entry (loom_ef_entry, loom_ef_state_entry) and
// restores it (loom_ef_set, loom_ef_state_set).
// CUDA tensors keep their residuals in device memory, in a table of their own freed by
// loom_ef_destroy: a device residual starts from the host entry of the same name and length when
// there is one (else zeros); loom_ef_count and loom_ef_entry first copy every device residual
// written since its last copy into the host table (waiting for the device), so a checkpoint sees
// them; loom_ef_set drops the device residual of its name (its next use starts from the value
// set). loom_ef_residual returns the host entry only. Use a name on one side, host or device.
typedef struct loom_ef loom_ef_t;

LOOM_API loom_status_t loom_ef_create(loom_ef_t **out);
LOOM_API void loom_ef_destroy(loom_ef_t *ef);
// The residual of name (n floats, zero when new). A name seen before with another n is
// LOOM_ERR_INVALID_ARG.
LOOM_API loom_status_t loom_ef_residual(loom_ef_t *ef, const char *name, int64_t n, float **res);
LOOM_API int loom_ef_count(const loom_ef_t *ef);
// Entry i (0 <= i < count) in creation order: its name, residual and length.
LOOM_API loom_status_t loom_ef_entry(const loom_ef_t *ef, int i, const char **name,
                                     const float **data, int64_t *n);
// Create or overwrite the residual of name with data[0..n). Residuals are always finite (error
// feedback drops a non-finite difference): a NaN or an infinity in data is LOOM_ERR_INVALID_ARG,
// the entry unchanged.
LOOM_API loom_status_t loom_ef_set(loom_ef_t *ef, const char *name, const float *data, int64_t n);
// Codec state kept beside the residuals, per tensor name: PowerSGD's warm-started Q. A bit-exact
// resume saves and restores it like the residuals (same rules, its own table; non-finite values
// are taken: such a Q starts again from PowerSGD's fixed start).
LOOM_API int loom_ef_state_count(const loom_ef_t *ef);
LOOM_API loom_status_t loom_ef_state_entry(const loom_ef_t *ef, int i, const char **name,
                                           const float **data, int64_t *n);
LOOM_API loom_status_t loom_ef_state_set(loom_ef_t *ef, const char *name, const float *data,
                                         int64_t n);
// Encode with error feedback: y = x + residual(name); payload = encode(y);
// residual(name) = y - decode(payload). With ef NULL it is loom_compressor_encode. On an error
// (of the encode, or of the decode that computes the residual: randomk out of memory) the
// residual is unchanged.
LOOM_API loom_status_t loom_compressor_encode_ef(const loom_compressor_t *c, loom_ef_t *ef,
                                                 const char *name, const float *x, int64_t n,
                                                 uint64_t seed, void *payload, size_t cap,
                                                 size_t *bytes);

// ---- compressed allreduce -----------------------------------------------------------------------
//
// The communication schemes of ByteComp's decision tree:
//   indivisible   every rank encodes its whole tensor; allgather of the payloads; every rank
//                 decodes them and sums in rank order
//   divisible     the tensor is cut into one shard per rank; alltoall of the encoded shards;
//                 the owner decodes and sums its shard in rank order and re-encodes the sum;
//                 allgather of the re-encoded shards; every rank decodes them
//   hierarchical  uncompressed (ordered) allreduce inside each node, then the node leaders run
//                 the indivisible scheme among themselves, then a broadcast inside each node
// powersgd ignores the scheme (it always runs its two allreduces) and needs ef (its warm-started
// Q is kept there too). The divisible scheme re-encodes each summed shard without error
// feedback (the owner's re-encoding error is not carried). Every rank ends with the same bits.
// f32 tensors, host or CUDA; op is LOOM_SUM or LOOM_AVG. Calls on one group are serialised by the
// caller (as for every collective); payload buffers are kept with the group and reused.
// CUDA tensors (with NCCL): the indivisible and divisible schemes encode and decode on the device
// with the CUDA codecs and exchange the payloads on the group's NCCL communicator, chunk by chunk
// with the host path's chunks, seeds and sums, so the result has the host path's bits; the work
// is ordered on the calling thread's current stream (the result is there for kernels queued after
// the call), the host waits for the stream a few times per chunk (payload lengths, headers), and
// the chunks do not pipeline. The hierarchical scheme runs on CUDA tensors too (NCCL inside each
// node). powersgd on CUDA tensors keeps M, P and Q on the device (cuBLAS) and sums P and Q over
// NCCL; the host orthonormalises copies of P and Q (the same code as the host path, so every rank
// has the same bits) and waits for the two sums; the result is close to, not bitwise, the host
// result (the BLAS sum in other orders); Q stays in ef's state table (loom_ef_state_entry).
// Pipelining: the flat schemes (and the leaders' part of hierarchical) cut a tensor into chunks
// of LOOM_COMPRESS_CHUNK / 4 values (default 4 MiB of f32; 0 = whole tensors), so that the
// encoding, the transfer and the decoding of successive chunks overlap. Chunk k is compressed on
// its own with seed + k (a scale per chunk), exactly as if it were a tensor of its own. top-k is
// never cut: its selection is over the whole tensor.
typedef enum loom_scheme {
  LOOM_SCHEME_INDIVISIBLE = 0,
  LOOM_SCHEME_DIVISIBLE,
  LOOM_SCHEME_HIERARCHICAL,
  LOOM_SCHEME_COUNT
} loom_scheme_t;

LOOM_API const char *loom_scheme_name(loom_scheme_t s); // "indivisible", ... or "invalid"
// Parse "indivisible", "divisible" or "hierarchical". Another name is LOOM_ERR_INVALID_ARG with
// the valid ones in loom_last_error(NULL), not logged: the caller, which knows where the name
// came from (a flag, a setting), reports it.
LOOM_API loom_status_t loom_scheme_parse(const char *name, loom_scheme_t *out);

// Allreduce t in place through compressor c. With ef non-NULL the encoding of this rank's
// tensor uses error feedback keyed by t's name (the name must be set). seed must be equal on
// every rank (advance it every step: randomk draws its indices from it; int8:sr its random
// streams, salted by rank and stage). When bytes_sent is non-NULL it receives the bytes this rank
// sent.
LOOM_API loom_status_t loom_compressed_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                                 loom_scheme_t scheme, loom_ef_t *ef,
                                                 loom_tensor_t *t, loom_redop_t op, uint64_t seed,
                                                 size_t *bytes_sent);

// Non-blocking form: encodes this rank's first chunks now (error feedback included), posts the
// first exchange and returns; the codec work between the exchanges and the final decode run as the
// request is advanced (loom_test, loom_wait, or the scheduler's progress thread). t must stay
// untouched until the request completes. Several may be in flight on one group, started in the
// same order on every rank. The hierarchical scheme, powersgd and CUDA tensors complete inside
// the call (*req = NULL), as the blocking form (CUDA: in the current stream's order).
LOOM_API loom_status_t loom_icompressed_allreduce(const loom_group_t *g, const loom_compressor_t *c,
                                                  loom_scheme_t scheme, loom_ef_t *ef,
                                                  loom_tensor_t *t, loom_redop_t op, uint64_t seed,
                                                  size_t *bytes_sent, loom_request_t **req);

// ---- through the host: the CPU encoding lane of device tensors ---------------------------------
//
// ByteComp's CPU lane: a tensor on a CUDA device is compressed, exchanged and summed by the host
// codecs over MPI instead of the CUDA codecs, so that the GPU keeps computing while the CPU
// encodes. A host stage holds what that takes for one tensor at a time: pinned host memory for
// its values and, on a CUDA device, a stream for the copies and their events, all made once (no
// allocation on the step path). The result has exactly the bits (and the error-feedback residual
// and byte count) of the host path on a host tensor holding the same values.
typedef struct loom_host_stage loom_host_stage_t;

// A stage for f32 tensors of up to n values on device: a CUDA device (page-locked host memory,
// a non-blocking copy stream), or LOOM_DEVICE_HOST (plain host memory and memcpy: host tensors
// take the same path, for tests and code that treats both alike). LOOM_ERR_UNSUPPORTED for a
// CUDA device in a build without CUDA; LOOM_ERR_INVALID_ARG for a device this process does not
// see; LOOM_ERR_CUDA (or NOMEM) when pinning fails.
LOOM_API loom_status_t loom_host_stage_create(int device, int64_t n, loom_host_stage_t **out);
// Waits for the stage's copies, then frees it. NULL is fine.
LOOM_API void loom_host_stage_destroy(loom_host_stage_t *s);

// loom_icompressed_allreduce of t (f32, on the stage's device, at most its n values) through the
// stage: after the kernels queued on the current stream before the call, t is copied into the
// stage's host memory on the stage's stream; once that copy has landed (the request is advanced:
// loom_test, loom_wait, the scheduler's progress thread), the host form of the scheme runs on it,
// error feedback keyed by t's name in ef's host table (keep a name on one side, host or device);
// then the sum is copied back into t, and the request completes once that copy has landed, so
// that work queued after its completion, on any stream, reads the result. The checks, the
// watchdog's record, the consistency check, the tags and bytes_sent are taken at the call, so
// several may be in flight on one group beside other collectives, started in the same order on
// every rank. The hierarchical scheme and powersgd wait for the copy to the host inside the call
// and run there (as on host tensors); the request then completes with the copy back. t must stay
// untouched, and the stage serve no other call, until the request completes. A failed copy to
// the host (a CUDA error, usually sticky) under a flat scheme still takes part in every exchange,
// with blocks marked failed: the wait returns the copy's error on this rank and LOOM_ERR_CORRUPT
// ("a peer could not encode its part") on its peers; no rank's t changes, nor this rank's
// residual (the peers' residuals move, as in any flat allreduce a peer's error ends). Under
// the hierarchical scheme and powersgd the ranks first agree (one small allreduce) that every
// copy landed: a failed copy ends the call on every rank before any exchange, with the copy's
// error on this rank and LOOM_ERR_CORRUPT on its peers, and no rank's t or residual changes.
LOOM_API loom_status_t loom_icompressed_allreduce_staged(const loom_group_t *g,
                                                         const loom_compressor_t *c,
                                                         loom_scheme_t scheme, loom_ef_t *ef,
                                                         loom_tensor_t *t, loom_host_stage_t *stage,
                                                         loom_redop_t op, uint64_t seed,
                                                         size_t *bytes_sent, loom_request_t **req);
// The blocking form: returns when t holds the result.
LOOM_API loom_status_t loom_compressed_allreduce_staged(
    const loom_group_t *g, const loom_compressor_t *c, loom_scheme_t scheme, loom_ef_t *ef,
    loom_tensor_t *t, loom_host_stage_t *stage, loom_redop_t op, uint64_t seed, size_t *bytes_sent);

#ifdef __cplusplus
}
#endif
#endif
